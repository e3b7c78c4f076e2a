/* Optimizers: gradients on the worker, update kernels on the ps.
 *
 * Each trainable variable gets one "Apply" node (an update node colocated
 * with it) whose input is its gradient; the session batches all of them,
 * per ps, into one Update RPC.  Hyperparameters that change per step
 * (Adam's beta powers) are inputs of the node, read at the start of the
 * step; the rest are constants of the node.
 *
 * ps_sync_replicas_optimizer wraps another optimizer the way TensorFlow's
 * SyncReplicasOptimizer does, with the aggregation on the ps: the apply
 * nodes carry replicas_to_aggregate and, as their local step, the value of
 * global_step read at the start of the same run, and the ps aggregates
 * each variable's gradients per step (proto/ps.proto).  The once-per-step
 * updates TensorFlow's chief runs after taking the aggregates (global_step
 * += 1, Adam's beta powers *= beta) are synchronous updates too, so they
 * happen once per step however many workers send them; reads and updates
 * still take one RPC per ps per step. */
#include "paramserver/optimizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"

struct ps_optimizer {
  int op; /* PS_APPLY_* */
  double lr, momentum, init_accum, beta1, beta2, epsilon;
  bool nesterov;
  bool bf16_gradient; /* ps_optimizer_set_gradient_dtype(PS_DT_BFLOAT16) */
  /* SyncReplicasOptimizer: wraps @inner (owned) */
  bool sync;
  ps_optimizer *inner;
  int replicas, total;
};

static ps_optimizer *opt_new(int op) {
  ps_optimizer *o = calloc(1, sizeof *o);
  if (o) o->op = op;
  return o;
}

ps_optimizer *ps_gradient_descent_optimizer(double lr) {
  ps_optimizer *o = opt_new(PS_APPLY_GRADIENT_DESCENT);
  if (o) o->lr = lr;
  return o;
}

ps_optimizer *ps_momentum_optimizer(double lr, double momentum, bool nesterov) {
  ps_optimizer *o = opt_new(PS_APPLY_MOMENTUM);
  if (o) {
    o->lr = lr;
    o->momentum = momentum;
    o->nesterov = nesterov;
  }
  return o;
}

ps_optimizer *ps_adagrad_optimizer(double lr, double init_accum) {
  ps_optimizer *o = opt_new(PS_APPLY_ADAGRAD);
  if (o) {
    o->lr = lr;
    o->init_accum = init_accum;
  }
  return o;
}

ps_optimizer *ps_adam_optimizer(double lr, double beta1, double beta2, double epsilon) {
  ps_optimizer *o = opt_new(PS_APPLY_ADAM);
  if (o) {
    o->lr = lr;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->epsilon = epsilon;
  }
  return o;
}

ps_optimizer *ps_sync_replicas_optimizer(ps_optimizer *inner, int replicas_to_aggregate,
                                         int total_num_replicas) {
  ps_optimizer *o = calloc(1, sizeof *o);
  if (o == NULL) {
    ps_optimizer_destroy(inner);
    return NULL;
  }
  o->sync = true;
  o->inner = inner;
  o->replicas = replicas_to_aggregate;
  o->total = total_num_replicas;
  return o;
}

void ps_optimizer_destroy(ps_optimizer *o) {
  if (o == NULL) return;
  if (o->sync) ps_optimizer_destroy(o->inner);
  free(o);
}

int ps_optimizer_set_gradient_dtype(ps_optimizer *o, ps_dtype dtype, ps_status *st) {
  if (o == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "set_gradient_dtype: no optimizer");
  if (dtype != PS_DT_FLOAT && dtype != PS_DT_BFLOAT16)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "set_gradient_dtype: gradients go to the ps as float or "
                         "bfloat16, not %s",
                         ps_dtype_name(dtype));
  /* a SyncReplicasOptimizer's apply nodes are its inner optimizer's */
  if (o->sync && o->inner) o = o->inner;
  o->bf16_gradient = dtype == PS_DT_BFLOAT16;
  return 0;
}

/* The wrapped optimizer of a SyncReplicasOptimizer with its settings
 * checked (NULL with @st set when they are wrong). */
static ps_optimizer *sync_unwrap(const ps_optimizer *o, ps_variable *global_step,
                                 int *replicas, int *total, ps_status *st) {
  if (o->inner == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "SyncReplicasOptimizer: no optimizer to wrap");
    return NULL;
  }
  if (o->inner->sync) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "SyncReplicasOptimizer cannot wrap another SyncReplicasOptimizer");
    return NULL;
  }
  if (o->replicas < 1) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "SyncReplicasOptimizer: replicas_to_aggregate must be at least 1, "
                  "got %d",
                  o->replicas);
    return NULL;
  }
  if (o->total < 0) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "SyncReplicasOptimizer: total_num_replicas must be positive (or 0: "
                  "replicas_to_aggregate), got %d",
                  o->total);
    return NULL;
  }
  int t = o->total ? o->total : o->replicas;
  if (o->replicas > t) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "SyncReplicasOptimizer: replicas_to_aggregate (%d) is larger than "
                  "total_num_replicas (%d): each worker waits until its step is "
                  "applied, so a step could never gather %d gradients",
                  o->replicas, t, o->replicas);
    return NULL;
  }
  if (global_step == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "SyncReplicasOptimizer: Global step is required to check staleness");
    return NULL;
  }
  if ((global_step->dtype != PS_DT_INT64 && global_step->dtype != PS_DT_INT32) ||
      global_step->shape.rank != 0) {
    char b[64];
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "SyncReplicasOptimizer: global_step %s must be an integer scalar "
                  "variable, got %s %s",
                  global_step->name, ps_dtype_name(global_step->dtype),
                  ps_shape_format(&global_step->shape, b, sizeof b));
    return NULL;
  }
  *replicas = o->replicas;
  *total = t;
  return o->inner;
}

ps_variable *ps_create_global_step(ps_graph *g, ps_status *st) {
  ps_shape s = {0};
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  const char *colls[] = {PS_GLOBAL_VARIABLES, PS_GLOBAL_STEP};
  ps_var_options o = {.not_trainable = true, .collections = colls, .ncollections = 2};
  size_t n;
  ps_collection_variables(g, PS_GLOBAL_STEP, &n);
  if (n > 0) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "\"global_step\" already exists.");
    return NULL;
  }
  /* at the root of the variable scopes */
  ps_scope_mark mark = ps_graph_scopes_clear_(g);
  ps_variable *v = ps_get_variable(g, "global_step", PS_DT_INT64, &s, &z, &o, st);
  ps_graph_scopes_restore_(g, mark);
  return v;
}

static const ps_op_def op_apply = {"Apply", PS_OPK_VAR_UPDATE, NULL, NULL};

/* A synchronous once-per-step update of @v (assign or assign_add of
 * @value), with @local_step as its second input. */
static ps_node *sync_update(ps_graph *g, ps_variable *v, int op, ps_node *value,
                            ps_node *local_step, int replicas, int total,
                            const char *hint) {
  ps_apply_extra *e = calloc(1, sizeof *e);
  if (e == NULL) return ps_graph_fail(g, PS_RESOURCE_EXHAUSTED, "out of memory");
  e->sync_replicas_to_aggregate = replicas;
  e->sync_total_num_replicas = total;
  ps_node *in[2] = {value, local_step};
  ps_node *ap = ps_node_new(g, &op_apply, hint, in, 2);
  if (ap == NULL) {
    free(e);
    return NULL;
  }
  snprintf(ap->device, sizeof ap->device, "%s", v->device);
  ap->var = v;
  ap->update_op = op;
  ap->extra = e;
  return ap;
}

/* Sums the rows of duplicate indices (TensorFlow's
 * _deduplicate_indexed_slices); two nodes over the same mapping. */
static int dedup_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out, ps_status *st,
                         bool want_rows) {
  const ps_tensor *idx = want_rows ? in[1] : in[0];
  int64_t m = ps_tensor_num_elements(idx);
  int64_t *uniq = malloc((size_t)(m + 1) * sizeof *uniq);
  int64_t *slot = malloc((size_t)(m + 1) * sizeof *slot);
  int64_t k = 0;
  for (int64_t i = 0; i < m; i++) {
    int64_t id = idx->dtype == PS_DT_INT32 ? ((const int32_t *)ps_tensor_data(idx))[i]
                                           : ((const int64_t *)ps_tensor_data(idx))[i];
    int64_t j = 0;
    /* first-occurrence order; m is the batch's id count, small */
    for (j = 0; j < k && uniq[j] != id; j++) {
    }
    if (j == k) uniq[k++] = id;
    slot[i] = j;
  }
  if (!want_rows) {
    ps_shape s = {.rank = 1, .dim = {k}};
    *out = ps_tensor_create(PS_DT_INT64, &s, false);
    memcpy(ps_tensor_data(*out), uniq, (size_t)k * sizeof *uniq);
  } else {
    const ps_tensor *rows = in[0];
    ps_shape s = rows->shape;
    s.dim[0] = k;
    *out = ps_tensor_create(rows->dtype, &s, true);
    int64_t re = m ? ps_tensor_num_elements(rows) / m : 0;
    for (int64_t i = 0; i < m; i++)
      ps_elem_apply(rows->dtype, '+',
                    (uint8_t *)ps_tensor_data(*out) +
                        (size_t)(slot[i] * re) * ps_dtype_size(rows->dtype),
                    (const uint8_t *)ps_tensor_data(rows) +
                        (size_t)(i * re) * ps_dtype_size(rows->dtype),
                    re);
  }
  free(uniq);
  free(slot);
  (void)n;
  (void)st;
  return 0;
}

static int dedup_idx_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                             ps_status *st) {
  return dedup_compute(n, in, out, st, false);
}
static int dedup_rows_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                              ps_status *st) {
  return dedup_compute(n, in, out, st, true);
}
static const ps_op_def op_dedup_idx = {"UniqueIndices", PS_OPK_LOCAL, dedup_idx_compute,
                                       NULL};
static const ps_op_def op_dedup_rows = {"SumDuplicateRows", PS_OPK_LOCAL,
                                        dedup_rows_compute, NULL};

static ps_node *dedup(ps_graph *g, ps_node *sparse) {
  ps_node *idx_in[1] = {sparse->sparse_indices};
  ps_node *ui = ps_node_new(g, &op_dedup_idx, "UniqueIndices", idx_in, 1);
  ps_node *rin[2] = {sparse, sparse->sparse_indices};
  ps_node *rows = ps_node_new(g, &op_dedup_rows, "SumDuplicateRows", rin, 2);
  if (!ui || !rows) return NULL;
  ui->dtype = PS_DT_INT64;
  ui->shape = (ps_shape){.rank = 1, .dim = {-1}};
  rows->dtype = sparse->dtype;
  rows->shape = sparse->shape;
  rows->shape.dim[0] = -1;
  rows->sparse_indices = ui;
  rows->sparse_dense_shape = sparse->sparse_dense_shape;
  return rows;
}

/* The slots and hyperparameters of @o's update of @v into @e; returns the
 * number of inputs the update node takes before the local step (1, or 3
 * with Adam's beta powers), or -1 with @st set. */
static int fill_apply_extra(const ps_optimizer *o, ps_variable *v, ps_apply_extra *e,
                            ps_status *st) {
  switch (o->op) {
  case PS_APPLY_GRADIENT_DESCENT:
    e->hparams[e->nhparams++] = o->lr;
    return 1;
  case PS_APPLY_MOMENTUM:
  case PS_APPLY_ADAGRAD: {
    bool mom = o->op == PS_APPLY_MOMENTUM;
    char sn[1100];
    snprintf(sn, sizeof sn, "%s/%s", v->name, mom ? "Momentum" : "Adagrad");
    ps_variable *acc = ps_slot_create_(v, sn, mom ? 0.0 : o->init_accum, &v->shape, st);
    if (acc == NULL) return -1;
    e->slots[e->nslots++] = acc->name;
    e->hparams[e->nhparams++] = o->lr;
    if (mom) e->hparams[e->nhparams++] = o->momentum;
    return 1;
  }
  default: { /* PS_APPLY_ADAM */
    char mn[1100], vn[1100];
    snprintf(mn, sizeof mn, "%s/Adam", v->name);
    snprintf(vn, sizeof vn, "%s/Adam_1", v->name);
    ps_variable *m = ps_slot_create_(v, mn, 0.0, &v->shape, st);
    ps_variable *vv = ps_slot_create_(v, vn, 0.0, &v->shape, st);
    if (!m || !vv) return -1;
    e->slots[e->nslots++] = m->name;
    e->slots[e->nslots++] = vv->name;
    e->hparams[e->nhparams++] = o->lr;
    e->hparams[e->nhparams++] = o->beta1;
    e->hparams[e->nhparams++] = o->beta2;
    e->hparams[e->nhparams++] = o->epsilon;
    e->ndynamic = 2; /* beta1_power, beta2_power from inputs 1, 2 */
    return 3;
  }
  }
}

/* What every update of one minimize() shares. */
typedef struct minimize_ctx {
  const ps_optimizer *o;
  ps_graph *g;
  ps_variable *global_step;
  ps_variable *b1p, *b2p; /* Adam's beta powers, else NULL */
  ps_node *b1r, *b2r;     /* their reads */
  ps_node *local_step;    /* synchronous updates: global_step as read */
  int replicas, total;    /* synchronous when replicas > 0 */
} minimize_ctx;

/* The update node of @v with gradient @grad; NULL with @st or the graph
 * failed. */
static ps_node *apply_update(const minimize_ctx *c, ps_variable *v, ps_node *grad,
                             ps_status *st) {
  const ps_optimizer *o = c->o;
  if (grad->sparse_indices && o->op != PS_APPLY_GRADIENT_DESCENT)
    grad = dedup(c->g, grad);
  ps_apply_extra *e = calloc(1, sizeof *e);
  if (e == NULL) return ps_graph_oom_(c->g);
  e->use_nesterov = o->nesterov;
  e->bf16_gradient = o->bf16_gradient;
  e->sync_replicas_to_aggregate = c->replicas;
  e->sync_total_num_replicas = c->total;
  ps_node *in[4] = {grad, c->b1r, c->b2r, NULL};
  int nin = fill_apply_extra(o, v, e, st);
  if (nin < 0) {
    free(e);
    return NULL;
  }
  if (c->replicas) in[nin++] = c->local_step;
  char hint[1100];
  snprintf(hint, sizeof hint, "update_%s", v->name);
  ps_node *ap = ps_node_new(c->g, &op_apply, hint, in, nin);
  if (ap == NULL) {
    free(e);
    return NULL;
  }
  snprintf(ap->device, sizeof ap->device, "%s", v->device);
  ap->var = v;
  ap->update_op = o->op;
  ap->extra = e;
  return ap;
}

static const char *optimizer_base_name(const ps_optimizer *o);

/* The update of the table lookup @look reads, with @grad the gradient of
 * its rows, by @c's optimizer's sparse rule for tables. */
static ps_node *table_update(const minimize_ctx *c, ps_node *look, ps_node *grad,
                             ps_status *st) {
  const ps_optimizer *o = c->o;
  ps_embedding_table *t = ps_table_of_lookup_(look);
  const ps_table_spec *sp = ps_embedding_table_spec(t);
  ps_node *step = c->global_step ? ps_variable_value(c->global_step) : NULL;
  ps_node *keys = look->in[0];
  double hp[4];
  switch (o->op) {
  case PS_APPLY_GRADIENT_DESCENT:
    hp[0] = o->lr;
    return ps_table_update_node_(t, PS_TABLE_OP_SGD, keys, grad, hp, 1, NULL, 0, step);
  case PS_APPLY_ADAGRAD:
    if (sp->optimizer != PS_TABLE_ADAGRAD) break;
    hp[0] = o->lr;
    return ps_table_update_node_(t, PS_TABLE_OP_ADAGRAD, keys, grad, hp, 1, NULL, 0,
                                 step);
  case PS_APPLY_ADAM: {
    if (sp->optimizer != PS_TABLE_ADAM) break;
    if (c->b1r == NULL) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "minimize: Adam keeps its beta powers beside a variable; table %s "
                    "needs one trainable variable with a gradient too",
                    sp->name);
      return NULL;
    }
    hp[0] = o->lr, hp[1] = o->beta1, hp[2] = o->beta2, hp[3] = o->epsilon;
    ps_node *dyn[2] = {c->b1r, c->b2r};
    return ps_table_update_node_(t, PS_TABLE_OP_ADAM, keys, grad, hp, 4, dyn, 2, step);
  }
  default:
    break;
  }
  static const char *const names[] = {"sgd", "adagrad", "adam", "ftrl"};
  ps_status_set(st, PS_INVALID_ARGUMENT,
                "minimize: table %s keeps slots for %s, which %s cannot update (make it "
                "with the optimizer's: PS_TABLE_ADAGRAD, PS_TABLE_ADAM; any table takes "
                "GradientDescent)",
                sp->name, names[sp->optimizer & 3], optimizer_base_name(o));
  return NULL;
}

/* Adam's beta powers, slots of the first variable (by name) that has a
 * gradient; 0, or -1 with @st set. */
static int adam_powers(minimize_ctx *c, ps_variable *const *vars, ps_node *const *dxs,
                       size_t n, ps_status *st) {
  ps_variable *first = NULL;
  for (size_t i = 0; i < n; i++)
    if (dxs[i] && (first == NULL || strcmp(vars[i]->name, first->name) < 0))
      first = vars[i];
  if (first == NULL) return 0;
  ps_shape s0 = {0};
  c->b1p = ps_slot_create_(first, "beta1_power", c->o->beta1, &s0, st);
  c->b2p = ps_slot_create_(first, "beta2_power", c->o->beta2, &s0, st);
  if (!c->b1p || !c->b2p) return -1;
  c->b1r = ps_variable_value(c->b1p);
  c->b2r = ps_variable_value(c->b2p);
  return 0;
}

/* The once-per-step updates (beta powers, global_step) appended to
 * @updates. */
static void step_updates(const minimize_ctx *c, ps_node **updates, size_t *nup) {
  const ps_optimizer *o = c->o;
  ps_graph *g = c->g;
  if (c->b1p && c->replicas) {
    updates[(*nup)++] = sync_update(
        g, c->b1p, PS_ASSIGN, ps_mul(c->b1r, ps_scalar(g, c->b1p->dtype, o->beta1)),
        c->local_step, c->replicas, c->total, "update_beta1_power");
    updates[(*nup)++] = sync_update(
        g, c->b2p, PS_ASSIGN, ps_mul(c->b2r, ps_scalar(g, c->b2p->dtype, o->beta2)),
        c->local_step, c->replicas, c->total, "update_beta2_power");
  } else if (c->b1p) {
    updates[(*nup)++] =
        ps_assign(c->b1p, ps_mul(c->b1r, ps_scalar(g, c->b1p->dtype, o->beta1)));
    updates[(*nup)++] =
        ps_assign(c->b2p, ps_mul(c->b2r, ps_scalar(g, c->b2p->dtype, o->beta2)));
  }
  if (c->global_step && c->replicas) {
    ps_node *one = ps_scalar(g, c->global_step->dtype, 1);
    updates[(*nup)++] = sync_update(g, c->global_step, PS_ASSIGN_ADD, one, c->local_step,
                                    c->replicas, c->total, "update_global_step");
  } else if (c->global_step) {
    ps_node *one = ps_scalar(g, c->global_step->dtype, 1);
    updates[(*nup)++] = ps_assign_add(c->global_step, one);
  }
}

static const char *optimizer_base_name(const ps_optimizer *o) {
  return o->op == PS_APPLY_GRADIENT_DESCENT ? "GradientDescent"
         : o->op == PS_APPLY_MOMENTUM       ? "Momentum"
         : o->op == PS_APPLY_ADAGRAD        ? "Adagrad"
                                            : "Adam";
}

ps_node *ps_optimizer_minimize(ps_optimizer *o, ps_graph *g, ps_node *loss,
                               ps_variable *global_step, ps_variable *const *var_list,
                               size_t n, ps_status *st) {
  if (o == NULL || loss == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "minimize: no optimizer or loss");
    return NULL;
  }
  minimize_ctx c = {.g = g, .global_step = global_step};
  ps_graph_mark m = ps_graph_mark_(g);
  if (o->sync && (o = sync_unwrap(o, global_step, &c.replicas, &c.total, st)) == NULL)
    return NULL;
  c.o = o;
  if (var_list == NULL) var_list = ps_collection_variables(g, PS_TRAINABLE_VARIABLES, &n);
  ps_variable **vars = malloc((n + 1) * sizeof *vars);
  ps_node **xs = malloc((n + 1) * sizeof *xs);
  ps_node **dxs = calloc(n + 1, sizeof *dxs);
  ps_node **updates = calloc(n + 4, sizeof *updates);
  size_t nup = 0;
  ps_node *train = NULL;
  if (!vars || !xs || !dxs || !updates) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  if (n) memcpy(vars, var_list, n * sizeof *vars);
  for (size_t i = 0; i < n; i++)
    xs[i] = ps_variable_value(vars[i]);
  /* the embedding tables' lookups too, in the same backward pass */
  size_t nl = 0, nn = ps_graph_num_nodes(g);
  for (size_t i = 0; i < nn; i++)
    nl += ps_table_of_lookup_(ps_graph_node(g, i)) != NULL;
  if (nl > 0) {
    ps_node **x2 = realloc(xs, (n + nl + 1) * sizeof *xs);
    ps_node **d2 = x2 ? realloc(dxs, (n + nl + 1) * sizeof *dxs) : NULL;
    ps_node **u2 = d2 ? realloc(updates, (n + nl + 4) * sizeof *updates) : NULL;
    if (x2) xs = x2;
    if (d2) dxs = d2;
    if (u2) updates = u2;
    if (!x2 || !d2 || !u2) {
      ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    for (size_t i = 0, k = n; i < nn; i++)
      if (ps_table_of_lookup_(ps_graph_node(g, i))) xs[k++] = ps_graph_node(g, i);
    memset(dxs + n, 0, nl * sizeof *dxs);
  }
  if (ps_gradients(g, loss, xs, n + nl, dxs, st) != 0) goto out;
  if (o->op == PS_APPLY_ADAM && adam_powers(&c, vars, dxs, n, st) != 0) goto out;
  c.local_step = c.replicas ? ps_variable_value(global_step) : NULL;
  if (ps_name_scope_push(g, optimizer_base_name(o), st) != 0) goto out;
  for (size_t i = 0; i < n; i++) {
    if (dxs[i] == NULL) continue;
    if ((updates[nup++] = apply_update(&c, vars[i], dxs[i], st)) == NULL) goto out_scope;
  }
  for (size_t i = n; i < n + nl; i++) {
    if (dxs[i] == NULL) continue;
    if ((updates[nup++] = table_update(&c, xs[i], dxs[i], st)) == NULL) goto out_scope;
  }
  step_updates(&c, updates, &nup);
  train = ps_group(g, updates, nup, "train");
  if (train) ps_collection_add_node(g, PS_TRAIN_OP, train);
out_scope:
  ps_name_scope_pop(g);
out:
  if (train && ps_graph_failed_since_(g, m)) train = NULL;
  if (train == NULL && st->code == PS_OK) {
    const ps_status *gs = ps_graph_status(g);
    ps_status_set(st, gs->code ? gs->code : PS_INTERNAL, "%s",
                  gs->code ? gs->msg : "minimize failed");
  }
  if (train == NULL) ps_graph_rollback_(g, m); /* adds nothing */
  free(vars);
  free(xs);
  free(dxs);
  free(updates);
  return train;
}

/* Every op of this file, for MetaGraph import (saver.c). */
const ps_op_def *const ps_opdefs_optimizer_[] = {&op_apply, &op_dedup_idx, &op_dedup_rows,
                                                 NULL};
