/* Embedding tables in graphs (paramserver/embedding.h): the table object a
 * graph keeps, the lookup op (its rows from the ps through the session's
 * client), the combiner over a ragged batch with its gradient, and the
 * table update op an optimizer's minimize() adds (worker/train/optimizer.c).
 *
 * The table ops are local ops whose kernels call the client the session
 * runs them with (ps_kernel_client_): a table is not a variable of the
 * graph, has no shape and no initializer op; the first lookup or update
 * of a session makes it on every ps (TableCreate is idempotent), and one
 * that finds it gone (a restarted ps) makes it again and retries once. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_priv.h"
#include "node.h"
#include "paramserver/embedding.h"

_Thread_local ps_client *ps_kernel_client_;

struct ps_embedding_table {
  ps_graph *g;
  ps_table_spec spec;           /* name and init values owned */
  _Atomic(ps_client *) made_by; /* the client that made it on every ps */
};

static void tables_free(ps_graph *g) {
  for (size_t i = 0; i < g->ntables; i++) {
    free((char *)g->tables[i]->spec.name);
    free((double *)g->tables[i]->spec.init.values);
    free(g->tables[i]);
  }
  free(g->tables);
}

ps_embedding_table *ps_get_embedding_table(ps_graph *g, const ps_table_spec *spec,
                                           ps_status *st) {
  if (g == NULL || spec == NULL || spec->name == NULL || spec->name[0] == '\0') {
    ps_status_set(st, PS_INVALID_ARGUMENT, "get_embedding_table: no graph or no name");
    return NULL;
  }
  for (size_t i = 0; i < g->ntables; i++) {
    ps_embedding_table *t = g->tables[i];
    if (strcmp(t->spec.name, spec->name) != 0) continue;
    if (t->spec.dim != spec->dim || t->spec.optimizer != spec->optimizer) {
      ps_status_set(st, PS_ALREADY_EXISTS,
                    "get_embedding_table %s: the graph has it with dim %lld and another "
                    "optimizer or dim than asked (%lld)",
                    spec->name, (long long)t->spec.dim, (long long)spec->dim);
      return NULL;
    }
    return t;
  }
  if (spec->dim < 1 || spec->dim > 65536) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "get_embedding_table %s: dim %lld is out of range (1 to 65536)",
                  spec->name, (long long)spec->dim);
    return NULL;
  }
  ps_embedding_table *t = calloc(1, sizeof *t);
  ps_embedding_table **v = realloc(g->tables, (g->ntables + 1) * sizeof *v);
  char *name = strdup(spec->name);
  double *vals = spec->init.nvalues ? malloc(spec->init.nvalues * sizeof *vals) : NULL;
  if (v) {
    g->tables = v;
    g->tables_free = tables_free;
  }
  if (!t || !v || !name || (spec->init.nvalues && !vals)) {
    free(t);
    free(name);
    free(vals);
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  if (vals) memcpy(vals, spec->init.values, spec->init.nvalues * sizeof *vals);
  t->g = g;
  t->spec = *spec;
  t->spec.name = name;
  t->spec.init.values = vals;
  g->tables[g->ntables++] = t;
  return t;
}

ps_embedding_table *const *ps_graph_tables_(const ps_graph *g, size_t *n) {
  *n = g->ntables;
  return g->tables;
}

const ps_table_spec *ps_embedding_table_spec(const ps_embedding_table *t) {
  return &t->spec;
}

/* The session's client, or FAILED_PRECONDITION: tables live on a ps. */
static ps_client *kernel_client(const ps_embedding_table *t, ps_status *st) {
  if (ps_kernel_client_ == NULL)
    ps_status_set(
        st, PS_FAILED_PRECONDITION,
        "table %s: embedding tables live on ps tasks; run the graph in a session "
        "with a client",
        t->spec.name);
  return ps_kernel_client_;
}

/* Makes the table on every ps once per client (and again after NOT_FOUND). */
static int ensure_made(ps_embedding_table *t, ps_client *c, ps_status *st) {
  if (atomic_load(&t->made_by) == c) return 0;
  int rc = ps_client_table_create(c, &t->spec, st);
  if (rc == 0) atomic_store(&t->made_by, c);
  return rc;
}

static int64_t step_of(ps_tensor *const *in, int nin, int at) {
  if (nin <= at || in[at] == NULL) return 0;
  const ps_tensor *s = in[at];
  if (ps_tensor_num_elements(s) < 1) return 0;
  return s->dtype == PS_DT_INT32 ? ((const int32_t *)ps_tensor_data(s))[0]
                                 : ((const int64_t *)ps_tensor_data(s))[0];
}

/* ---- lookup: in[0] keys, in[1] (optional) the global step ---- */

static int lookup_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  ps_embedding_table *t = n->extra_table;
  ps_client *c = kernel_client(t, st);
  if (c == NULL || ensure_made(t, c, st) != 0) return st->code;
  int64_t step = step_of(in, n->nin, 1);
  int rc = ps_client_table_lookup(c, t->spec.name, in[0], true, step, out, NULL, st);
  if (rc == PS_NOT_FOUND) { /* a ps came back without it */
    atomic_store(&t->made_by, NULL);
    if (ensure_made(t, c, st) != 0) return st->code;
    rc = ps_client_table_lookup(c, t->spec.name, in[0], true, step, out, NULL, st);
  }
  return rc;
}

static const ps_op_def op_lookup = {"TableLookup", PS_OPK_LOCAL, lookup_compute, NULL};

ps_node *ps_embedding_table_lookup(ps_embedding_table *t, ps_node *keys, ps_node *step) {
  if (t == NULL || keys == NULL) return NULL;
  ps_graph *g = t->g;
  if (keys->dtype != PS_DT_INT64)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "table %s: keys must be int64, got %s",
                         t->spec.name, ps_dtype_name(keys->dtype));
  if (keys->shape.rank >= PS_MAX_RANK)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "table %s: keys of rank %d",
                         t->spec.name, keys->shape.rank);
  if (step && ((step->dtype != PS_DT_INT32 && step->dtype != PS_DT_INT64) ||
               step->shape.rank > 0))
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "table %s: the step must be an int32 or int64 scalar, got %s",
                         t->spec.name, ps_dtype_name(step->dtype));
  ps_node *in[2] = {keys, step};
  ps_node *n = ps_node_new(g, &op_lookup, "TableLookup", in, step ? 2 : 1);
  if (n == NULL) return NULL;
  n->dtype = PS_DT_FLOAT;
  n->shape = keys->shape;
  if (n->shape.rank >= 0) n->shape.dim[n->shape.rank++] = t->spec.dim;
  n->extra_table = t;
  return n;
}

/* ---- update: in[0] keys, in[1] gradients, in[2..] hparams, then the step ---- */

typedef struct table_update_extra {
  ps_table_op op;
  double hparams[6];
  size_t nhparams;
  size_t ndynamic; /* hparams from inputs 2.. (Adam's beta powers) */
  bool has_step;
} table_update_extra;

static int update_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  ps_embedding_table *t = n->extra_table;
  const table_update_extra *e = n->extra;
  ps_client *c = kernel_client(t, st);
  if (c == NULL || ensure_made(t, c, st) != 0) return st->code;
  double hp[6];
  memcpy(hp, e->hparams, sizeof hp);
  for (size_t k = 0; k < e->ndynamic; k++) {
    const ps_tensor *x = in[2 + k];
    hp[e->nhparams + k] = x->dtype == PS_DT_DOUBLE
                              ? ((const double *)ps_tensor_data(x))[0]
                              : ((const float *)ps_tensor_data(x))[0];
  }
  int64_t step = e->has_step ? step_of(in, n->nin, n->nin - 1) : 0;
  int rc = ps_client_table_update(c, t->spec.name, e->op, in[0], in[1], hp,
                                  e->nhparams + e->ndynamic, step, NULL, st);
  if (rc != 0) return rc;
  *out = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){0}, true);
  return *out ? 0 : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
}

static const ps_op_def op_update = {"TableUpdate", PS_OPK_LOCAL, update_compute, NULL};

ps_node *ps_table_update_node_(ps_embedding_table *t, ps_table_op op, ps_node *keys,
                               ps_node *grads, const double *hparams, size_t nhparams,
                               ps_node *const *dynamic, size_t ndynamic, ps_node *step) {
  ps_graph *g = t->g;
  table_update_extra *e = calloc(1, sizeof *e);
  if (e == NULL || nhparams + ndynamic > 6) {
    free(e);
    return ps_graph_oom_(g);
  }
  e->op = op;
  if (nhparams) memcpy(e->hparams, hparams, nhparams * sizeof *hparams);
  e->nhparams = nhparams;
  e->ndynamic = ndynamic;
  e->has_step = step != NULL;
  ps_node *in[10] = {keys, grads};
  int nin = 2;
  for (size_t k = 0; k < ndynamic; k++)
    in[nin++] = dynamic[k];
  if (step) in[nin++] = step;
  char hint[300];
  snprintf(hint, sizeof hint, "update_%s", t->spec.name);
  ps_node *n = ps_node_new(g, &op_update, hint, in, nin);
  if (n == NULL) {
    free(e);
    return NULL;
  }
  n->extra = e;
  n->extra_table = t;
  n->dtype = PS_DT_FLOAT;
  n->shape = (ps_shape){0};
  return n;
}

ps_embedding_table *ps_table_of_lookup_(const ps_node *n) {
  return n->def == &op_lookup ? n->extra_table : NULL;
}

/* ---- the combiner over a ragged batch ---- */

/* in[0] rows [nnz, dim], in[1] row_splits [B + 1] int64; ia[0] the
 * combiner.  Row b of the output combines rows splits[b]..splits[b+1]. */
static int splits_ok(const ps_tensor *rows, const ps_tensor *sp, int64_t nnz,
                     ps_status *st) {
  if (sp->dtype != PS_DT_INT64 || sp->shape.rank != 1 || sp->shape.dim[0] < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "row_splits must be a 1-D int64 tensor of batch + 1 elements");
  const int64_t *s = ps_tensor_data(sp);
  int64_t nb = sp->shape.dim[0] - 1;
  if (s[0] != 0 || s[nb] != nnz)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "row_splits must start at 0 and end at the %lld keys, got %lld "
                         "and %lld",
                         (long long)nnz, (long long)s[0], (long long)s[nb]);
  for (int64_t b = 0; b < nb; b++)
    if (s[b + 1] < s[b])
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "row_splits must not decrease (at %lld)", (long long)b);
  (void)rows;
  return 0;
}

static float weight_of(int combiner, int64_t count) {
  if (count == 0) return 0;
  return combiner == PS_COMBINER_SUM    ? 1.0f
         : combiner == PS_COMBINER_MEAN ? 1.0f / (float)count
                                        : 1.0f / sqrtf((float)count);
}

static int combine_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                           ps_status *st) {
  const ps_tensor *rows = in[0], *sp = in[1];
  if (rows->dtype != PS_DT_FLOAT || rows->shape.rank != 2)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "rows must be float [keys, dim]");
  int64_t nnz = rows->shape.dim[0], dim = rows->shape.dim[1];
  if (splits_ok(rows, sp, nnz, st) != 0) return st->code;
  int64_t nb = sp->shape.dim[0] - 1;
  *out = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {nb, dim}}, true);
  if (*out == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  const int64_t *s = ps_tensor_data(sp);
  const float *r = ps_tensor_data(rows);
  float *o = ps_tensor_data(*out);
  for (int64_t b = 0; b < nb; b++) {
    float w = weight_of((int)n->ia[0], s[b + 1] - s[b]);
    for (int64_t k = s[b]; k < s[b + 1]; k++)
      for (int64_t j = 0; j < dim; j++)
        o[b * dim + j] += w * r[k * dim + j];
  }
  return 0;
}

/* The gradient: in[0] dy [B, dim], in[1] row_splits → [nnz, dim]. */
static int combine_grad_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                                ps_status *st) {
  const ps_tensor *dy = in[0], *sp = in[1];
  const int64_t *s = ps_tensor_data(sp);
  int64_t nb = sp->shape.dim[0] - 1, dim = dy->shape.dim[1], nnz = s[nb];
  *out = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {nnz, dim}}, false);
  if (*out == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  const float *d = ps_tensor_data(dy);
  float *o = ps_tensor_data(*out);
  for (int64_t b = 0; b < nb; b++) {
    float w = weight_of((int)n->ia[0], s[b + 1] - s[b]);
    for (int64_t k = s[b]; k < s[b + 1]; k++)
      for (int64_t j = 0; j < dim; j++)
        o[k * dim + j] = w * d[b * dim + j];
  }
  return 0;
}

static const ps_op_def op_combine_grad = {"SegmentCombineGrad", PS_OPK_LOCAL,
                                          combine_grad_compute, NULL};

static int combine_grad(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                        ps_status *st) {
  ps_node *in[2] = {dy, n->in[1]};
  ps_node *gn = ps_node_new(g, &op_combine_grad, "SegmentCombineGrad", in, 2);
  if (gn == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  gn->ia[0] = n->ia[0];
  gn->dtype = PS_DT_FLOAT;
  gn->shape = n->in[0]->shape;
  dx[0] = gn;
  dx[1] = NULL;
  return 0;
}

static const ps_op_def op_combine = {"SegmentCombine", PS_OPK_LOCAL, combine_compute,
                                     combine_grad};

ps_node *ps_embedding_table_lookup_sparse(ps_embedding_table *t, ps_node *keys,
                                          ps_node *row_splits, ps_combiner combiner,
                                          ps_node *step) {
  if (t == NULL || keys == NULL || row_splits == NULL) return NULL;
  ps_graph *g = t->g;
  if ((unsigned)combiner > PS_COMBINER_SQRTN)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "table %s: unknown combiner %d",
                         t->spec.name, (int)combiner);
  if (keys->shape.rank != 1 || row_splits->dtype != PS_DT_INT64)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "table %s: a ragged lookup takes 1-D keys and int64 row_splits",
                         t->spec.name);
  ps_graph_mark m = ps_graph_mark_(g);
  ps_node *rows = ps_embedding_table_lookup(t, keys, step);
  ps_node *in[2] = {rows, row_splits};
  ps_node *n = rows ? ps_node_new(g, &op_combine, "SegmentCombine", in, 2) : NULL;
  if (n == NULL) {
    ps_graph_rollback_(g, m);
    return NULL;
  }
  n->ia[0] = combiner;
  n->dtype = PS_DT_FLOAT;
  n->shape = (ps_shape){2, {-1, t->spec.dim}};
  return n;
}

/* Every op of this file, for MetaGraph import (a graph with tables does
 * not import: its tables are not in the MetaGraph). */
const ps_op_def *const ps_opdefs_tables_[] = {&op_lookup, &op_update, &op_combine,
                                              &op_combine_grad, NULL};
