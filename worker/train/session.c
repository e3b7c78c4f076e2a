/* Sessions: execute the part of a graph that fetches and targets need.
 *
 * Execution goes in waves.  Each wave first runs every ready local node
 * (their kernels on the worker), then issues the ready remote nodes
 * together: all variable reads (and row gathers) for one ps in one Read
 * RPC, all initializers and updates for one ps in one Update RPC, every ps
 * at once.  A typical training step is therefore one wave of reads, local
 * forward and backward computation, and one wave of updates.
 *
 * Variables with no ps device live in the session itself (local), which is
 * also the no-RPC baseline the benchmarks compare against.
 *
 * Synchronous updates (SyncReplicasOptimizer's apply nodes) take their
 * local step from an input, global_step as read in the run's first wave,
 * and ride in the same Update RPCs; that RPC returns when the ps has
 * applied the step, so the next run reads the new values. */
#include "paramserver/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/appendf.h"
#include "common/array.h"
#include "common/kernels.h"
#include "common/variable.h"
#include "graph/node.h"
#include "train_internal.h"

typedef struct local_var {
  ps_tensor *value; /* NULL until initialized */
} local_var;

struct ps_session {
  ps_graph *g;
  ps_client *client;
  bool *created; /* per graph variable index */
  size_t ncreated;
  uint64_t *draws; /* per graph variable index: its initializer's runs */
  size_t ndraws;
  uint64_t *kruns; /* per node id: its kernel's runs (ps_kernel_runs_) */
  size_t nkruns;
  local_var *locals;
  size_t nlocals;
  int last_reads, last_updates;
  int last_sync_applied, last_sync_stale;
  bool soft_placement;
  ps_device self;        /* this process's device (ps_session_options) */
  unsigned char *placed; /* per node: its device was checked */
  size_t nplaced;
};

ps_session *ps_session_create(ps_graph *g, ps_client *client, ps_status *st) {
  return ps_session_create_opts(g, client, NULL, st);
}

ps_session *ps_session_create_opts(ps_graph *g, ps_client *client,
                                   const ps_session_options *opt, ps_status *st) {
  /* a graph whose constructors failed is still whole (graph.h) */
  if (g == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "session: no graph");
    return NULL;
  }
  ps_device self;
  const char *dev = opt && opt->device ? opt->device : "/job:worker";
  if (ps_device_parse(dev, &self, st) != 0) {
    ps_status_prefix(st, "session device");
    return NULL;
  }
  if (!self.job[0]) snprintf(self.job, sizeof self.job, "worker");
  ps_session *s = calloc(1, sizeof *s);
  if (s == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  s->g = g;
  s->client = client;
  s->self = self;
  s->soft_placement = opt && opt->allow_soft_placement;
  return s;
}

void ps_session_destroy(ps_session *s) {
  if (s == NULL) return;
  for (size_t i = 0; i < s->nlocals; i++)
    ps_tensor_destroy(s->locals[i].value);
  free(s->locals);
  free(s->created);
  free(s->draws);
  free(s->kruns);
  free(s->placed);
  free(s);
}

void ps_session_last_rpcs(const ps_session *s, int *reads, int *updates) {
  *reads = s->last_reads;
  *updates = s->last_updates;
}

void ps_session_last_sync(const ps_session *s, int *applied, int *stale) {
  *applied = s->last_sync_applied;
  *stale = s->last_sync_stale;
}

static int oom(ps_status *st) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
}

/* @v's place among @g's variables (ps_variable.index, O(1)), or SIZE_MAX
 * when @v is not one of them. */
static size_t var_index(ps_graph *g, ps_variable *v) {
  if (v == NULL || v->g != g || v->index >= ps_graph_num_vars_(g) ||
      ps_graph_var_(g, v->index) != v)
    return SIZE_MAX;
  return v->index;
}

static int not_in_graph(ps_variable *v, ps_status *st) {
  return ps_status_set(st, PS_INVALID_ARGUMENT,
                       "variable %s is not a variable of the session's graph",
                       v ? v->name : "(null)");
}

/* Why local_of(@s, @v) gave NULL. */
static int local_err(ps_session *s, ps_variable *v, ps_status *st) {
  return var_index(s->g, v) == SIZE_MAX ? not_in_graph(v, st) : oom(st);
}

/* NULL when out of memory or when @v is not of the session's graph. */
static local_var *local_of(ps_session *s, ps_variable *v) {
  size_t i = var_index(s->g, v);
  if (i == SIZE_MAX) return NULL;
  if (i >= s->nlocals) {
    size_t n = ps_graph_num_vars_(s->g);
    if (ps_array_grow(&s->locals, NULL, n, sizeof *s->locals) != 0) return NULL;
    memset(s->locals + s->nlocals, 0, (n - s->nlocals) * sizeof *s->locals);
    s->nlocals = n;
  }
  return &s->locals[i];
}

const ps_tensor *ps_session_local_value_(ps_session *s, ps_variable *v) {
  local_var *lv = local_of(s, v);
  return lv ? lv->value : NULL;
}

int ps_session_set_local_value_(ps_session *s, ps_variable *v, ps_tensor *value,
                                ps_status *st) {
  local_var *lv = local_of(s, v);
  if (lv == NULL) {
    ps_tensor_destroy(value);
    return local_err(s, v, st);
  }
  ps_tensor_destroy(lv->value);
  lv->value = value;
  return 0;
}

/* A tensor sharing @t's bytes (no copy); NULL when out of memory. */
static ps_tensor *share(const ps_tensor *t) {
  ps_tensor *o = calloc(1, sizeof *o);
  if (o == NULL) return NULL;
  o->dtype = t->dtype;
  o->shape = t->shape;
  o->buf = ps_buf_ref(t->buf);
  return o;
}

static ps_tensor *empty_tensor(void) {
  ps_shape s = {0};
  return ps_tensor_create(PS_DT_FLOAT, &s, true);
}

/* ---- run state ---- */

typedef struct run run;
static int local_apply(run *r, ps_node *n, local_var *lv, int op, ps_tensor *in);

enum { N_UNNEEDED = 0, N_NEEDED, N_DONE };

struct run {
  ps_session *s;
  size_t n;
  char *state;     /* per node */
  ps_tensor **val; /* per node */
  bool *fed;
  bool *remote_gather; /* GatherV2 executed as a ps row read */
  bool *skip_read;     /* a read only gathers use: not read whole */
  bool *want_value;    /* fetched, or a data input of a needed node */
  ps_status *st;
};

/* The output of a variable update: the variable's value after it (as
 * TensorFlow's Assign, AssignAdd, Scatter* and Apply* give) when someone
 * uses it, else an empty tensor. */
static ps_tensor *update_output(run *r, ps_node *n, const ps_tensor *value) {
  return r->want_value && r->want_value[n->id] && value ? share(value) : empty_tensor();
}

static void mark_needed(run *r, ps_node *n) {
  if (r->state[n->id] != N_UNNEEDED) return;
  r->state[n->id] = N_NEEDED;
  if (r->fed[n->id]) return;
  for (int i = 0; i < n->nin; i++)
    mark_needed(r, n->in[i]);
  if (n->ia[0] == 1 && n->def->kind == PS_OPK_VAR_READ) return; /* soft deps */
  for (int i = 0; i < n->nctrl; i++)
    mark_needed(r, n->ctrl[i]);
  if (n->sparse_indices) mark_needed(r, n->sparse_indices);
}

static bool ready(run *r, ps_node *n) {
  if (r->state[n->id] != N_NEEDED) return false;
  if (r->fed[n->id]) return true;
  for (int i = 0; i < n->nin; i++)
    if (r->state[n->in[i]->id] != N_DONE) return false;
  for (int i = 0; i < n->nctrl; i++) {
    ps_node *c = n->ctrl[i];
    if (r->state[c->id] == N_NEEDED) return false; /* soft deps: only if needed */
  }
  if (n->sparse_indices && r->state[n->sparse_indices->id] != N_DONE) return false;
  return true;
}

/* The names of @report's uninitialized variables (free with
 * ps_client_free_names). */
static int report_names(ps_session *s, ps_node *report, char ***names, size_t *n,
                        ps_status *st) {
  *names = NULL;
  *n = 0;
  if (report == NULL || report->def->kind != PS_OPK_REPORT_UNINIT)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "not a report_uninitialized_variables node");
  struct {
    size_t n;
    ps_variable *vars[];
  } *e = report->extra;
  char **out = calloc(e->n + 1, sizeof *out);
  size_t k = 0;
  int rc = out ? 0 : oom(st);
  for (size_t i = 0; i < e->n && rc == 0; i++) {
    ps_variable *v = e->vars[i];
    bool init = false;
    if (v->task < 0) {
      local_var *lv = local_of(s, v);
      if (lv == NULL) {
        rc = local_err(s, v, st);
        break;
      }
      init = lv->value != NULL;
    } else {
      if (s->client == NULL) {
        rc = ps_status_set(st, PS_FAILED_PRECONDITION, "no client for %s", v->name);
        break;
      }
      const char *nm[1] = {v->name};
      rc = ps_client_is_initialized(s->client, v->task, nm, 1, &init, st);
      if (rc == PS_NOT_FOUND) { /* not created yet: uninitialized */
        rc = 0;
        ps_status_clear(st);
        init = false;
      }
    }
    if (!init && (out[k++] = strdup(v->name)) == NULL) rc = oom(st);
  }
  if (rc) {
    ps_client_free_names(out, k);
    return rc;
  }
  *names = out;
  *n = k;
  return 0;
}

int ps_session_run_report(ps_session *s, ps_node *report, char ***names, size_t *n,
                          ps_status *st) {
  return report_names(s, report, names, n, st);
}

/* A report fetched by an ordinary run: a 1-D string tensor of the names. */
static int run_report(run *r, ps_node *n) {
  char **names;
  size_t k;
  int rc = report_names(r->s, n, &names, &k, r->st);
  if (rc != 0) return rc;
  r->val[n->id] = ps_tensor_new_strings((const char *const *)names, k);
  ps_client_free_names(names, k);
  return r->val[n->id] ? 0 : oom(r->st);
}

static bool is_remote(const ps_node *n) {
  switch (n->def->kind) {
  case PS_OPK_VAR_READ:
  case PS_OPK_VAR_INIT:
  case PS_OPK_VAR_UPDATE:
  case PS_OPK_VAR_IS_INIT:
    return n->var == NULL || n->var->task >= 0;
  default:
    return false;
  }
}

/* A seed for an unseeded random initializer: new at every run. */
static uint64_t fresh_seed(void) {
  uint64_t k = 0;
  if (getrandom(&k, sizeof k, 0) != (ssize_t)sizeof k) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    k = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) * 0x9e3779b97f4a7c15u;
  }
  return k ? k : 1;
}

/* The key (*@seedp, used when the spec has no seed) and the draw of this
 * run of @v's initializer (TensorFlow 1.x's random kernels and seed
 * rules): with a seed in the
 * spec (an op seed), that seed; with none but a graph seed
 * (ps_graph_set_random_seed), the graph seed; each run of the initializer
 * in this session gives the next draw, and a new session starts again at
 * the first (TensorFlow keeps the Philox state in the session's kernel).
 * With neither, a new random seed at every run.  The ps's own copy of the
 * initializer (the one the variable was created with) is not used: this
 * graph's initializer is the one that runs. */
static int init_draw(ps_session *s, ps_variable *v, uint64_t *seedp, uint64_t *drawp,
                     ps_status *st) {
  size_t i = var_index(s->g, v), nvars = ps_graph_num_vars_(s->g);
  if (i == SIZE_MAX) return not_in_graph(v, st);
  if (i >= s->ndraws) {
    if (ps_array_grow(&s->draws, NULL, nvars, sizeof *s->draws) != 0) return oom(st);
    memset(s->draws + s->ndraws, 0, (nvars - s->ndraws) * sizeof *s->draws);
    s->ndraws = nvars;
  }
  int64_t gs;
  uint64_t seed = 0, draw = s->draws[i];
  bool has_seed = v->init.seed != 0;
  if (!has_seed && ps_graph_random_seed_(s->g, &gs)) {
    seed = (uint64_t)gs;
    has_seed = true;
  }
  if (!has_seed) {
    seed = fresh_seed();
    draw = 0;
  }
  s->draws[i]++;
  *seedp = seed;
  *drawp = draw;
  return 0;
}

/* The fill of @v's initializer spec for this run (init_draw), as the ps
 * makes it from an Update's fill (fill_of). */
static int init_fill(ps_session *s, ps_variable *v, ps_tensor **out, ps_status *st) {
  uint64_t seed = 0, draw = 0;
  if (init_draw(s, v, &seed, &draw, st) != 0) return st->code;
  ps_tensor *x = ps_tensor_create(v->dtype, &v->shape, false);
  if (x == NULL) return oom(st);
  int rc = ps_init_fill_draw(&v->init, v->full_name ? v->full_name : v->name, v->dtype,
                             v->full_name ? &v->full_shape : &v->shape, v->offset,
                             ps_shape_num_elements(&v->shape), &seed, draw,
                             ps_tensor_data(x), st);
  if (rc != 0) {
    ps_tensor_destroy(x);
    return rc;
  }
  *out = x;
  return 0;
}

/* An initialized_value() read of an uninitialized variable gives the
 * variable's initial value instead (TensorFlow 1.x: cond(is_initialized,
 * read, initial_value)); the variable stays uninitialized. */
static int initial_value_instead(run *r, ps_node *n) {
  ps_variable *v = n->var;
  if (n->nin > 0) { /* the initial-value expression, computed as an input */
    r->val[n->id] = share(r->val[n->in[0]->id]);
    return r->val[n->id] ? 0 : oom(r->st);
  }
  if (!v->has_init) return ps_var_uninitialized(v->name, r->st);
  return init_fill(r->s, v, &r->val[n->id], r->st);
}

static bool falls_back(const ps_node *n) {
  return n->def->kind == PS_OPK_VAR_READ && n->ia[1] == 1;
}

/* The wave's initialized_value() reads of ps variables: one read each
 * (they run once, at initialization), the initial value where the
 * variable is uninitialized. */
static int run_fallback_reads(run *r, ps_node **wave, size_t nw) {
  int rc = 0;
  for (size_t k = 0; k < nw && rc == 0; k++) {
    ps_node *n = wave[k];
    if (!falls_back(n)) continue;
    ps_read rd = {.name = n->var->name};
    ps_task_reads tr = {.task = n->var->task, .reads = &rd, .n = 1};
    rc = ps_client_read_many(r->s->client, &tr, 1, r->st);
    r->s->last_reads++;
    if (rc == 0) {
      r->val[n->id] = rd.out;
    } else if (rc == PS_FAILED_PRECONDITION && strstr(r->st->msg, "uninitialized")) {
      ps_status_clear(r->st);
      rc = initial_value_instead(r, n);
    }
  }
  return rc;
}

static int run_local(run *r, ps_node *n) {
  ps_status *st = r->st;
  if (r->fed[n->id]) return 0; /* value already set */
  switch (n->def->kind) {
  case PS_OPK_PLACEHOLDER:
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "You must feed a value for placeholder tensor '%s' with "
                         "dtype %s",
                         n->name, ps_dtype_name(n->dtype));
  case PS_OPK_CONST:
    r->val[n->id] = share(n->value);
    return 0;
  case PS_OPK_NOOP:
    r->val[n->id] = empty_tensor();
    return 0;
  case PS_OPK_REPORT_UNINIT:
    return run_report(r, n);
  case PS_OPK_LOCAL: {
    ps_tensor *in[16], **inp = in;
    if (n->nin > 16 && (inp = malloc((size_t)n->nin * sizeof *inp)) == NULL)
      return oom(st);
    for (int i = 0; i < n->nin; i++)
      inp[i] = r->val[n->in[i]->id];
    size_t id = (size_t)n->id, nn = ps_graph_num_nodes(r->s->g);
    if (id >= r->s->nkruns) {
      if (ps_array_grow(&r->s->kruns, NULL, nn, sizeof *r->s->kruns) != 0) {
        if (inp != in) free(inp);
        return oom(st);
      }
      memset(r->s->kruns + r->s->nkruns, 0, (nn - r->s->nkruns) * sizeof *r->s->kruns);
      r->s->nkruns = nn;
    }
    ps_kernel_runs_ = &r->s->kruns[id];
    int rc = n->def->compute(n, inp, &r->val[n->id], st);
    ps_kernel_runs_ = NULL;
    if (inp != in) free(inp);
    if (rc != 0) ps_status_prefix(st, "%s (%s)", n->name, n->def->type);
    return rc;
  }
  default:
    break;
  }
  /* variables held by the session */
  ps_variable *v = n->var;
  local_var *lv = local_of(r->s, v);
  if (lv == NULL) return local_err(r->s, v, st);
  switch (n->def->kind) {
  case PS_OPK_VAR_READ:
    if (lv->value == NULL && falls_back(n)) return initial_value_instead(r, n);
    if (lv->value == NULL) return ps_var_uninitialized(v->name, st);
    r->val[n->id] = share(lv->value);
    return 0;
  case PS_OPK_VAR_IS_INIT: {
    ps_shape s0 = {0};
    r->val[n->id] = ps_tensor_create(PS_DT_BOOL, &s0, true);
    if (r->val[n->id] == NULL) return oom(st);
    *(uint8_t *)ps_tensor_data(r->val[n->id]) = lv->value != NULL;
    return 0;
  }
  case PS_OPK_VAR_INIT:
  case PS_OPK_VAR_UPDATE: {
    ps_tensor *x = NULL;
    if (n->def->kind == PS_OPK_VAR_INIT && v->has_init) {
      int rc = init_fill(r->s, v, &x, st);
      if (rc != 0) return rc;
    } else {
      ps_tensor *in = r->val[n->in[0]->id];
      int op = n->def->kind == PS_OPK_VAR_INIT ? PS_ASSIGN : n->update_op;
      if (n->in[0]->sparse_indices || op >= PS_APPLY_GRADIENT_DESCENT)
        return local_apply(r, n, lv, op, in);
      if (op == PS_ASSIGN || op == PS_ASSIGN_ADD || op == PS_ASSIGN_SUB) {
        /* the same rules and texts as the ps (common/variable.c) */
        ps_var_update_kind k = op == PS_ASSIGN       ? PS_VAR_ASSIGN
                               : op == PS_ASSIGN_ADD ? PS_VAR_ASSIGN_ADD
                                                     : PS_VAR_ASSIGN_SUB;
        const ps_shape *cur = lv->value ? &lv->value->shape : &v->shape;
        int rc = ps_var_check_update(k, v->name, v->dtype, cur, lv->value != NULL,
                                     in->dtype, &in->shape, true, st);
        if (rc != 0) return rc;
      }
      if (op == PS_ASSIGN) {
        x = ps_tensor_create(v->dtype, &v->shape, false);
        if (x == NULL) return oom(st);
        memcpy(ps_tensor_data(x), ps_tensor_data(in), ps_tensor_nbytes(in));
      } else if (op == PS_ASSIGN_ADD || op == PS_ASSIGN_SUB) {
        x = ps_tensor_create(v->dtype, &v->shape, false);
        if (x == NULL) return oom(st);
        memcpy(ps_tensor_data(x), ps_tensor_data(lv->value), ps_tensor_nbytes(x));
        ps_elem_apply(v->dtype, op == PS_ASSIGN_ADD ? '+' : '-', ps_tensor_data(x),
                      ps_tensor_data(in), ps_tensor_num_elements(x));
      } else {
        return local_apply(r, n, lv, op, in);
      }
    }
    ps_tensor_destroy(lv->value);
    lv->value = x;
    r->val[n->id] = update_output(r, n, lv->value);
    return 0;
  }
  default:
    return ps_status_set(st, PS_INTERNAL, "%s: cannot run op kind %d", n->name,
                         n->def->kind);
  }
}

/* A private copy of a local variable's value before an in-place update
 * (fetched outputs may share its bytes). */
static int local_private(local_var *lv, ps_status *st) {
  if (lv->value && atomic_load(&lv->value->buf->refs) > 1) {
    ps_tensor *c = ps_tensor_create(lv->value->dtype, &lv->value->shape, false);
    if (c == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(ps_tensor_data(c), ps_tensor_data(lv->value), ps_tensor_nbytes(c));
    ps_tensor_destroy(lv->value);
    lv->value = c;
  }
  return 0;
}

static ps_variable *find_var_by_name(ps_graph *g, const char *name) {
  return ps_graph_find_var_(g, name);
}

/* Sparse assign_add/sub and optimizer updates of variables held by the
 * session: the same kernels the ps runs (common/kernels.c). */
static int local_apply(run *r, ps_node *n, local_var *lv, int op, ps_tensor *in) {
  ps_status *st = r->st;
  ps_variable *v = n->var;
  ps_node *x = n->in[0];
  const ps_tensor *idx = x->sparse_indices ? r->val[x->sparse_indices->id] : NULL;
  if (lv->value == NULL) return ps_var_uninitialized(v->name, st);
  int64_t rows = v->shape.rank ? v->shape.dim[0] : 1;
  int64_t row_elems = rows ? ps_shape_num_elements(&v->shape) / rows : 0;
  if (idx) {
    for (int64_t k = 0; k < ps_tensor_num_elements(idx); k++) {
      int64_t i = idx->dtype == PS_DT_INT32 ? ((int32_t *)ps_tensor_data(idx))[k]
                                            : ((int64_t *)ps_tensor_data(idx))[k];
      if (i < 0 || i >= rows)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "indices[%lld] = %lld is not in [0, %lld)", (long long)k,
                             (long long)i, (long long)rows);
    }
  }
  if (local_private(lv, st)) return st->code;
  if (op == PS_ASSIGN_ADD || op == PS_ASSIGN_SUB) { /* sparse rows */
    size_t rb = (size_t)row_elems * ps_dtype_size(v->dtype);
    for (int64_t k = 0; k < ps_tensor_num_elements(idx); k++) {
      int64_t i = idx->dtype == PS_DT_INT32 ? ((int32_t *)ps_tensor_data(idx))[k]
                                            : ((int64_t *)ps_tensor_data(idx))[k];
      ps_elem_apply(v->dtype, op == PS_ASSIGN_ADD ? '+' : '-',
                    (uint8_t *)ps_tensor_data(lv->value) + (size_t)i * rb,
                    (uint8_t *)ps_tensor_data(in) + (size_t)k * rb, row_elems);
    }
    r->val[n->id] = update_output(r, n, lv->value);
    return 0;
  }
  if (op < PS_APPLY_GRADIENT_DESCENT || n->extra == NULL)
    return ps_status_set(st, PS_UNIMPLEMENTED, "%s: update op %d on a local variable",
                         n->name, op);
  ps_apply_extra *e = n->extra;
  ps_kernel_args a = {0};
  _Static_assert(PS_APPLY_MOMENTUM - PS_APPLY_GRADIENT_DESCENT == PS_OPT_MOMENTUM &&
                     PS_APPLY_ADAGRAD - PS_APPLY_GRADIENT_DESCENT == PS_OPT_ADAGRAD &&
                     PS_APPLY_ADAM - PS_APPLY_GRADIENT_DESCENT == PS_OPT_ADAM,
                 "PS_APPLY_* minus PS_APPLY_GRADIENT_DESCENT is the ps_opt_kind");
  a.opt = (ps_opt_kind)(op - PS_APPLY_GRADIENT_DESCENT);
  a.dtype = v->dtype;
  a.var = ps_tensor_data(lv->value);
  for (size_t k = 0; k < e->nslots && k < PS_OPT_MAX_SLOTS; k++) {
    ps_variable *sv = find_var_by_name(r->s->g, e->slots[k]);
    local_var *sl = sv ? local_of(r->s, sv) : NULL;
    if (sv && sl == NULL) return local_err(r->s, sv, st);
    if (sl == NULL || sl->value == NULL) return ps_var_uninitialized(e->slots[k], st);
    if (local_private(sl, st)) return st->code;
    a.slots[k] = ps_tensor_data(sl->value);
  }
  double hp[16];
  memcpy(hp, e->hparams, e->nhparams * sizeof *hp);
  for (size_t d = 0; d < e->ndynamic; d++) {
    ps_tensor *t = r->val[n->in[1 + d]->id];
    hp[e->nhparams + d] = ps_elem_get(t->dtype, ps_tensor_data(t), 0);
  }
  a.var_elems = ps_shape_num_elements(&v->shape);
  a.row_elems = row_elems;
  a.grad = ps_tensor_data(in);
  a.sparse = idx != NULL;
  if (idx) {
    a.indices = ps_tensor_data(idx);
    a.index_size = ps_dtype_size(idx->dtype);
    a.nindices = ps_tensor_num_elements(idx);
  }
  a.hparams = hp;
  a.use_nesterov = e->use_nesterov;
  if (ps_kernel_apply(&a) != 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: %s has no %s kernel", n->name,
                         v->name, ps_dtype_name(v->dtype));
  r->val[n->id] = update_output(r, n, lv->value);
  return 0;
}

/* ---- remote waves ---- */

typedef struct task_work {
  ps_read *reads;
  ps_node **read_nodes;
  size_t nreads;
  ps_update *ups;
  ps_node **up_nodes;
  ps_update_result *up_results; /* synchronous updates report here */
  size_t nups;
  ps_update_fill *fills; /* the fills of the ups that are fills, in order */
  size_t nfills;
} task_work;

/* Room for element @n of @arr; false when out of memory. */
#define GROW(arr, n) (ps_array_grow(&(arr), NULL, (n) + 1, sizeof *(arr)) == 0)

static int ensure_created(run *r, ps_node **wave, size_t nw) {
  ps_session *s = r->s;
  ps_graph *g = s->g;
  size_t nvars = ps_graph_num_vars_(g);
  if (s->ncreated < nvars) {
    if (ps_array_grow(&s->created, NULL, nvars, sizeof *s->created) != 0)
      return oom(r->st);
    memset(s->created + s->ncreated, 0, (nvars - s->ncreated) * sizeof(bool));
    s->ncreated = nvars;
  }
  int nps = ps_client_num_ps(s->client);
  ps_var_spec **specs = calloc((size_t)nps, sizeof *specs);
  size_t *nspecs = calloc((size_t)nps, sizeof *nspecs);
  size_t *which = calloc(nvars + 1, sizeof *which), nwhich = 0;
  int rc = specs && nspecs && which ? 0 : oom(r->st);
  for (size_t k = 0; k < nw && rc == 0; k++) {
    ps_variable *v = wave[k]->var;
    if (v == NULL || v->task < 0) continue;
    size_t i = var_index(g, v);
    if (i == SIZE_MAX) {
      rc = not_in_graph(v, r->st);
      break;
    }
    if (s->created[i]) continue;
    if (v->task >= nps) {
      rc = ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "variable %s is placed on %s but the cluster has %d ps tasks",
                         v->name, v->device, nps);
      break;
    }
    if (!GROW(specs[v->task], nspecs[v->task])) {
      rc = oom(r->st);
      break;
    }
    s->created[i] = true;
    which[nwhich++] = i;
    ps_var_spec *sp = &specs[v->task][nspecs[v->task]++];
    memset(sp, 0, sizeof *sp);
    sp->name = v->name;
    sp->dtype = v->dtype;
    sp->shape = v->shape;
    sp->init = v->has_init ? &v->init : NULL;
    sp->full_name = v->full_name;
    sp->full_shape = v->full_name ? &v->full_shape : NULL;
    sp->offset = v->offset;
  }
  for (int t = 0; t < nps && rc == 0; t++)
    if (nspecs[t]) rc = ps_client_create_vars(s->client, t, specs[t], nspecs[t], r->st);
  /* not created after all: the next run tries again (and says why again) */
  if (rc != 0)
    for (size_t j = 0; j < nwhich; j++)
      s->created[which[j]] = false;
  for (int t = 0; t < nps && specs; t++)
    free(specs[t]);
  free(specs);
  free(nspecs);
  free(which);
  return rc;
}

/* One wave's remote work: per ps task, the reads, initializers and updates
 * that go out as one batched call each. */
typedef struct remote_batch {
  int nps;
  task_work *tw;
  ps_task_reads *tr;
  ps_task_updates *tu;
  double **hparams; /* the per-update hyperparameter arrays, owned */
  size_t nhparams;
} remote_batch;

static void batch_free(remote_batch *b, run *r, int rc) {
  for (int t = 0; b->tw && t < b->nps; t++) {
    task_work *w = &b->tw[t];
    if (rc != 0)
      for (size_t i = 0; i < w->nreads; i++)
        if (r->val[w->read_nodes[i]->id] != w->reads[i].out)
          ps_tensor_destroy(w->reads[i].out);
    free(w->reads);
    free(w->read_nodes);
    free(w->ups);
    free(w->up_nodes);
    free(w->up_results);
    free(w->fills);
  }
  for (size_t i = 0; i < b->nhparams; i++)
    free(b->hparams[i]);
  free(b->hparams);
  free(b->tw);
  free(b->tr);
  free(b->tu);
}

/* A read of @n's variable (rows @indices, or all of it when NULL). */
static int batch_add_read(run *r, task_work *w, ps_node *n, const ps_tensor *indices) {
  if (!GROW(w->reads, w->nreads) || !GROW(w->read_nodes, w->nreads)) return oom(r->st);
  w->reads[w->nreads] = (ps_read){.name = n->var->name, .indices = indices};
  w->read_nodes[w->nreads++] = n;
  return 0;
}

/* The update op that goes out for @n (an assign of its initial value, or its
 * update), the sparse form when the value is a sparse gradient; *idx gets
 * the row indices then. */
static int update_op_of(run *r, ps_node *n, const ps_tensor **idx, int *opp) {
  ps_node *x = n->in[0];
  int op = n->def->kind == PS_OPK_VAR_INIT ? PS_ASSIGN : n->update_op;
  *idx = NULL;
  if (x->sparse_indices) {
    *idx = r->val[x->sparse_indices->id];
    if (op >= PS_APPLY_GRADIENT_DESCENT) {
      /* optimizer kernels take sparse rows as they are */
    } else if (op == PS_ASSIGN_ADD)
      op = PS_SCATTER_ADD;
    else if (op == PS_ASSIGN_SUB)
      op = PS_SCATTER_SUB;
    else if (op == PS_ASSIGN)
      op = PS_SCATTER_UPDATE;
    if ((*idx)->dtype != PS_DT_INT64 && (*idx)->dtype != PS_DT_INT32)
      return ps_status_set(r->st, PS_INVALID_ARGUMENT, "%s: bad sparse indices", n->name);
  }
  *opp = op;
  return 0;
}

/* SyncReplicas: the local step of update @u, global_step as this run read
 * it (input 1 + ndynamic of @n). */
static int set_sync_step(run *r, ps_node *n, const ps_apply_extra *se, ps_update *u,
                         ps_update_result *res) {
  if ((int)(1 + se->ndynamic) >= n->nin)
    return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "%s: a synchronous update without its local step input",
                         n->name);
  const ps_tensor *ls = r->val[n->in[1 + se->ndynamic]->id];
  const void *lp = ps_tensor_data(ls);
  int64_t step = ls->dtype == PS_DT_INT64   ? *(const int64_t *)lp
                 : ls->dtype == PS_DT_INT32 ? *(const int32_t *)lp
                                            : (int64_t)ps_elem_get(ls->dtype, lp, 0);
  u->replicas_to_aggregate = se->sync_replicas_to_aggregate;
  u->sync_local_step = step;
  u->result = res;
  return 0;
}

/* An optimizer update's hyperparameters: the constant ones, then the
 * per-step ones (Adam's beta powers, read at the start of the step). */
static int set_hparams(run *r, remote_batch *b, ps_node *n, ps_update *u) {
  ps_apply_extra *e = n->extra;
  double *hp = calloc(e->nhparams + e->ndynamic + 1, sizeof *hp);
  if (hp == NULL || !GROW(b->hparams, b->nhparams)) {
    free(hp);
    return oom(r->st);
  }
  memcpy(hp, e->hparams, e->nhparams * sizeof *hp);
  for (size_t d = 0; d < e->ndynamic; d++) {
    ps_tensor *t = r->val[n->in[1 + d]->id];
    hp[e->nhparams + d] = ps_elem_get(t->dtype, ps_tensor_data(t), 0);
  }
  b->hparams[b->nhparams++] = hp; /* room made above */
  u->slots = e->slots;
  u->nslots = e->nslots;
  u->hparams = hp;
  u->nhparams = e->nhparams + e->ndynamic;
  u->use_nesterov = e->use_nesterov;
  return 0;
}

/* An update of @n's variable (or the assign of its computed initial value). */
static int batch_add_update(run *r, remote_batch *b, task_work *w, ps_node *n) {
  ps_variable *v = n->var;
  ps_tensor *val = r->val[n->in[0]->id];
  const ps_tensor *idx;
  int op = 0, rc = update_op_of(r, n, &idx, &op);
  if (rc) return rc;
  if (val->dtype != v->dtype)
    return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "%s: value has dtype %s but %s is %s", n->name,
                         ps_dtype_name(val->dtype), v->name, ps_dtype_name(v->dtype));
  if (!GROW(w->ups, w->nups) || !GROW(w->up_nodes, w->nups) ||
      !GROW(w->up_results, w->nups))
    return oom(r->st);
  ps_update *u = &w->ups[w->nups];
  *u = (ps_update){.name = v->name, .op = (ps_update_op)op, .value = val, .indices = idx};
  w->up_results[w->nups] = (ps_update_result){0};
  ps_apply_extra *se = n->def->kind == PS_OPK_VAR_UPDATE ? n->extra : NULL;
  if (se && se->sync_replicas_to_aggregate > 0 &&
      (rc = set_sync_step(r, n, se, u, &w->up_results[w->nups])) != 0)
    return rc;
  if (op >= PS_APPLY_GRADIENT_DESCENT && n->extra && (rc = set_hparams(r, b, n, u)) != 0)
    return rc;
  w->up_nodes[w->nups++] = n;
  return 0;
}

/* @n is the initializer of a variable with an initializer spec. */
static bool is_fill(const ps_node *n) {
  return n->def->kind == PS_OPK_VAR_INIT && n->var->has_init;
}

/* The initializer @n of a variable with an initializer spec: an assign
 * the ps fills with this run's draw (init_draw), as TensorFlow runs the
 * initializer op on the variable's device; the values never cross the
 * network nor sit in the worker's memory. */
static int batch_add_fill(run *r, task_work *w, ps_node *n) {
  ps_variable *v = n->var;
  if (!GROW(w->fills, w->nfills) || !GROW(w->ups, w->nups) ||
      !GROW(w->up_nodes, w->nups) || !GROW(w->up_results, w->nups))
    return oom(r->st);
  ps_update_fill *f = &w->fills[w->nfills];
  *f = (ps_update_fill){.init = &v->init, .dtype = v->dtype, .shape = v->shape};
  if (v->full_name) {
    f->full_name = v->full_name;
    f->full_shape = &v->full_shape;
    f->offset = v->offset;
  }
  int rc = init_draw(r->s, v, &f->seed, &f->draw, r->st);
  if (rc != 0) return rc;
  w->nfills++;
  w->ups[w->nups] = (ps_update){.name = v->name, .op = PS_ASSIGN};
  w->up_results[w->nups] = (ps_update_result){0};
  w->up_nodes[w->nups++] = n;
  return 0;
}

/* Sorts the wave's variable ops into per-task work. */
static int batch_collect(run *r, remote_batch *b, ps_node **wave, size_t nw) {
  int rc = 0;
  for (size_t k = 0; k < nw && rc == 0; k++) {
    ps_node *n = wave[k];
    if (n->def->kind == PS_OPK_REPORT_UNINIT) continue;
    ps_variable *v = n->var;
    task_work *w = &b->tw[v->task];
    switch (n->def->kind) {
    case PS_OPK_VAR_READ:
      if (!falls_back(n)) rc = batch_add_read(r, w, n, NULL);
      break;
    case PS_OPK_LOCAL: /* a gather served by the ps */
      rc = batch_add_read(r, w, n, r->val[n->in[1]->id]);
      break;
    case PS_OPK_VAR_INIT:
      if (is_fill(n)) {
        rc = batch_add_fill(r, w, n);
        break;
      }
      /* assign the computed initial value */
      __attribute__((fallthrough));
    case PS_OPK_VAR_UPDATE:
      rc = batch_add_update(r, b, w, n);
      break;
    default:
      break;
    }
  }
  return rc;
}

/* The reads, one call per task, all tasks at once. */
static int batch_read(run *r, remote_batch *b) {
  ps_session *s = r->s;
  size_t ntr = 0;
  for (int t = 0; t < b->nps; t++)
    if (b->tw[t].nreads)
      b->tr[ntr++] =
          (ps_task_reads){.task = t, .reads = b->tw[t].reads, .n = b->tw[t].nreads};
  if (ntr == 0) return 0;
  int rc = ps_client_read_many(s->client, b->tr, ntr, r->st);
  s->last_reads += (int)ntr;
  if (rc == 0)
    for (int t = 0; t < b->nps; t++)
      for (size_t i = 0; i < b->tw[t].nreads; i++)
        r->val[b->tw[t].read_nodes[i]->id] = b->tw[t].reads[i].out;
  return rc;
}

/* The updates, one call per task, all tasks at once. */
static int batch_update(run *r, remote_batch *b) {
  ps_session *s = r->s;
  size_t ntu = 0;
  for (int t = 0; t < b->nps; t++)
    if (b->tw[t].nups)
      b->tu[ntu++] =
          (ps_task_updates){.task = t, .updates = b->tw[t].ups, .n = b->tw[t].nups};
  if (ntu == 0) return 0;
  /* the results and fills arrays may have moved while growing: point again */
  for (int t = 0; t < b->nps; t++) {
    size_t k = 0;
    for (size_t i = 0; i < b->tw[t].nups; i++) {
      if (b->tw[t].ups[i].result) b->tw[t].ups[i].result = &b->tw[t].up_results[i];
      if (is_fill(b->tw[t].up_nodes[i])) b->tw[t].ups[i].fill = &b->tw[t].fills[k++];
    }
  }
  int rc = ps_client_update_many(s->client, b->tu, ntu, r->st);
  s->last_updates += (int)ntu;
  if (rc == 0)
    for (int t = 0; t < b->nps; t++)
      for (size_t i = 0; i < b->tw[t].nups; i++) {
        task_work *w = &b->tw[t];
        if ((r->val[w->up_nodes[i]->id] = empty_tensor()) == NULL) rc = oom(r->st);
        if (w->ups[i].result == NULL) continue;
        if (w->up_results[i].stale)
          s->last_sync_stale++;
        else
          s->last_sync_applied++;
      }
  return rc;
}

/* The update nodes of this wave whose value is used get it: their
 * variables are read after the wave's updates, one call per task. */
static int read_updated(run *r, remote_batch *b) {
  size_t nps = b->nps > 0 ? (size_t)b->nps : 0;
  ps_read **rd = calloc(nps + 1, sizeof *rd);
  ps_node ***who = calloc(nps + 1, sizeof *who);
  size_t *cnt = calloc(nps + 1, sizeof *cnt), ntr = 0;
  int rc = rd && who && cnt ? 0 : oom(r->st);
  for (int t = 0; t < b->nps && rc == 0; t++) {
    task_work *w = &b->tw[t];
    for (size_t i = 0; i < w->nups && rc == 0; i++) {
      ps_node *n = w->up_nodes[i];
      if (r->want_value == NULL || !r->want_value[n->id]) continue;
      if (!GROW(rd[t], cnt[t]) || !GROW(who[t], cnt[t])) {
        rc = oom(r->st);
        break;
      }
      rd[t][cnt[t]] = (ps_read){.name = n->var->name};
      who[t][cnt[t]++] = n;
    }
    if (cnt[t]) b->tr[ntr++] = (ps_task_reads){.task = t, .reads = rd[t], .n = cnt[t]};
  }
  if (rc == 0 && ntr) {
    rc = ps_client_read_many(r->s->client, b->tr, ntr, r->st);
    r->s->last_reads += (int)ntr;
    for (int t = 0; t < b->nps; t++)
      for (size_t i = 0; i < cnt[t]; i++) {
        if (rc == 0) {
          ps_tensor_destroy(r->val[who[t][i]->id]);
          r->val[who[t][i]->id] = rd[t][i].out;
        } else {
          ps_tensor_destroy(rd[t][i].out);
        }
      }
  }
  for (int t = 0; t < b->nps; t++) {
    if (rd) free(rd[t]);
    if (who) free(who[t]);
  }
  free(rd);
  free(who);
  free(cnt);
  return rc;
}

/* is_initialized and report: one call per node (rare, control plane). */
static int run_control_ops(run *r, ps_node **wave, size_t nw) {
  int rc = 0;
  for (size_t k = 0; k < nw && rc == 0; k++) {
    ps_node *n = wave[k];
    if (n->def->kind == PS_OPK_VAR_IS_INIT) {
      bool b = false;
      const char *nm[1] = {n->var->name};
      rc = ps_client_is_initialized(r->s->client, n->var->task, nm, 1, &b, r->st);
      ps_shape s0 = {0};
      if (rc == 0 && (r->val[n->id] = ps_tensor_create(PS_DT_BOOL, &s0, true)) == NULL)
        rc = oom(r->st);
      if (rc == 0) *(uint8_t *)ps_tensor_data(r->val[n->id]) = b;
    }
  }
  return rc;
}

/* The wave's remote ops: reads, then initializers, then updates, batched
 * per task; then the control-plane ops. */
static int run_remote(run *r, ps_node **wave, size_t nw) {
  ps_session *s = r->s;
  if (s->client == NULL)
    return ps_status_set(r->st, PS_FAILED_PRECONDITION,
                         "%s needs a ps, but the session has no client", wave[0]->name);
  int rc = ensure_created(r, wave, nw);
  if (rc) return rc;
  remote_batch b = {.nps = ps_client_num_ps(s->client)};
  b.tw = calloc((size_t)b.nps, sizeof *b.tw);
  b.tr = calloc((size_t)b.nps, sizeof *b.tr);
  b.tu = calloc((size_t)b.nps, sizeof *b.tu);
  if (!b.tw || !b.tr || !b.tu) rc = oom(r->st);
  if (rc == 0) rc = batch_collect(r, &b, wave, nw);
  if (rc == 0) rc = batch_read(r, &b);
  if (rc == 0) rc = run_fallback_reads(r, wave, nw);
  if (rc == 0) rc = batch_update(r, &b);
  if (rc == 0) rc = read_updated(r, &b);
  if (rc == 0) rc = run_control_ops(r, wave, nw);
  batch_free(&b, r, rc);
  return rc;
}

/* Reads whose every needed consumer is a gather of their rows are served
 * as row reads by the ps: the whole variable never crosses the network. */
static void plan_gathers(run *r, ps_node *const *fetches, size_t nfetches) {
  ps_graph *g = r->s->g;
  for (size_t i = 0; i < r->n; i++) {
    ps_node *n = ps_graph_node(g, i);
    if (n->def->kind != PS_OPK_VAR_READ || r->state[i] != N_NEEDED || r->fed[i]) continue;
    if (n->var->task < 0 || n->nctrl > 0) continue;
    bool only_gathers = true, any = false;
    for (size_t f = 0; f < nfetches; f++)
      if (fetches[f] == n) only_gathers = false;
    for (size_t k = 0; k < r->n && only_gathers; k++) {
      ps_node *c = ps_graph_node(g, k);
      if (r->state[k] != N_NEEDED) continue;
      for (int j = 0; j < c->nin; j++)
        if (c->in[j] == n) {
          if (strcmp(c->def->type, "GatherV2") != 0 || j != 0)
            only_gathers = false;
          else
            any = true;
        }
      for (int j = 0; j < c->nctrl; j++)
        if (c->ctrl[j] == n) only_gathers = false;
    }
    if (!only_gathers || !any) continue;
    r->skip_read[i] = true;
    for (size_t k = 0; k < r->n; k++) {
      ps_node *c = ps_graph_node(g, k);
      if (r->state[k] == N_NEEDED && c->nin >= 2 && c->in[0] == n &&
          !strcmp(c->def->type, "GatherV2"))
        r->remote_gather[k] = true;
    }
  }
}

/* Which values are used: the fetches and every data input of a needed
 * node (control inputs only order; their values are not used). */
static void mark_wanted(run *r, ps_node *const *fetches, size_t nfetches) {
  ps_graph *g = r->s->g;
  for (size_t f = 0; f < nfetches; f++)
    r->want_value[fetches[f]->id] = true;
  for (size_t i = 0; i < r->n; i++) {
    ps_node *n = ps_graph_node(g, i);
    if (r->state[i] != N_NEEDED) continue;
    for (int k = 0; k < n->nin; k++)
      if (n->in[k]) r->want_value[n->in[k]->id] = true;
  }
}

/* Feed @i (@f) checked against its node, as TensorFlow checks feeds. */
/* A fetch or target of another graph (its ids and variables index
 * nothing here): TensorFlow's "is not an element of this graph". */
static int check_in_graph(run *r, const ps_node *n) {
  if ((size_t)n->id < r->n && ps_graph_node(r->s->g, n->id) == n) return 0;
  return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                       "Fetch argument %s cannot be interpreted as a Tensor. (%s is "
                       "not an element of this graph.)",
                       n->name, n->name);
}

static int apply_feed(run *r, const ps_feed *f, size_t i) {
  ps_graph *g = r->s->g;
  ps_node *n = f->node;
  const ps_tensor *t = f->value;
  if (n == NULL || t == NULL || (size_t)n->id >= r->n || ps_graph_node(g, n->id) != n)
    return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "feed %zu is not a node of this graph", i);
  if (t->dtype != n->dtype)
    return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "Cannot feed value of dtype %s for Tensor '%s', which has "
                         "dtype %s",
                         ps_dtype_name(t->dtype), n->name, ps_dtype_name(n->dtype));
  if (n->shape.rank >= 0) {
    bool ok = t->shape.rank == n->shape.rank;
    for (int d = 0; ok && d < t->shape.rank; d++)
      ok = n->shape.dim[d] < 0 || n->shape.dim[d] == t->shape.dim[d];
    if (!ok) {
      char a[128], b[128];
      return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                           "Cannot feed value of shape %s for Tensor '%s', which has "
                           "shape %s",
                           ps_shape_format(&t->shape, a, sizeof a), n->name,
                           ps_shape_format(&n->shape, b, sizeof b));
    }
  }
  r->fed[n->id] = true;
  ps_tensor_destroy(r->val[n->id]);
  if ((r->val[n->id] = share(t)) == NULL) return oom(r->st);
  return 0;
}

/* Runs local nodes until none is ready. */
static int run_local_ready(run *r) {
  ps_graph *g = r->s->g;
  int rc = 0;
  bool progress = true;
  while (progress && rc == 0) {
    progress = false;
    for (size_t i = 0; i < r->n && rc == 0; i++) {
      ps_node *n = ps_graph_node(g, i);
      if (!ready(r, n) || r->remote_gather[i]) continue;
      if (!r->fed[i] && is_remote(n)) continue;
      rc = run_local(r, n);
      /* every op leaves a value (an empty one for updates) */
      if (rc == 0 && r->val[i] == NULL) rc = oom(r->st);
      r->state[i] = N_DONE;
      progress = true;
    }
  }
  return rc;
}

/* The next wave of remote ops into @wave; returns their number.  Reads go
 * first; updates and initializers wait until nothing else can run, so that
 * all of a step's updates to one ps share one RPC.  *any_left: some needed
 * node is not done. */
static size_t next_wave(run *r, ps_node **wave, bool *any_left) {
  ps_graph *g = r->s->g;
  size_t nw = 0;
  bool reads_ready = false;
  *any_left = false;
  for (size_t i = 0; i < r->n; i++) {
    ps_node *n = ps_graph_node(g, i);
    if (ready(r, n) && (r->remote_gather[i] || is_remote(n)) &&
        n->def->kind != PS_OPK_VAR_UPDATE && n->def->kind != PS_OPK_VAR_INIT)
      reads_ready = true;
  }
  for (size_t i = 0; i < r->n; i++) {
    ps_node *n = ps_graph_node(g, i);
    if (r->state[i] == N_NEEDED) *any_left = true;
    if (ready(r, n) && (r->remote_gather[i] || is_remote(n))) {
      bool is_write =
          n->def->kind == PS_OPK_VAR_UPDATE || n->def->kind == PS_OPK_VAR_INIT;
      if (is_write && reads_ready) continue;
      if (r->remote_gather[i] && n->var == NULL) n->var = n->in[0]->var;
      wave[nw++] = n;
    }
  }
  return nw;
}

/* Whether device @d exists for this session: a ps task's CPU, or this
 * process's (its job, "localhost" or none; its task or none; CPU:0). */
static bool device_exists(const ps_session *s, const ps_device *d) {
  if (d->type[0] && strcmp(d->type, "CPU") != 0) return false;
  if (d->index > 0) return false;
  if (!strcmp(d->job, "ps")) return true; /* its task is checked on creation */
  if (d->job[0] && strcmp(d->job, s->self.job) != 0 && strcmp(d->job, "localhost") != 0)
    return false;
  if (d->task >= 0 && strcmp(d->job, "localhost") != 0 && d->task != s->self.task)
    return false;
  return true;
}

/* The devices this session can place on, as TensorFlow lists them. */
static void list_devices(const ps_session *s, char *buf, size_t n) {
  size_t off = 0;
  int nps = s->client ? ps_client_num_ps(s->client) : 0;
  buf[0] = '\0';
  for (int t = 0; t < nps; t++)
    ps_appendf(buf, n, &off, "/job:ps/replica:0/task:%d/device:CPU:0, ", t);
  if (s->self.task >= 0)
    ps_appendf(buf, n, &off, "/job:%s/replica:0/task:%d/device:CPU:0", s->self.job,
               s->self.task);
  else
    ps_appendf(buf, n, &off, "/job:%s/replica:0/device:CPU:0", s->self.job);
}

/* TensorFlow's placement check of every needed node, once per node (a
 * variable's ops are named by the variable, their colocation group): an
 * unavailable device (a GPU, another worker task) is INVALID_ARGUMENT
 * unless the session allows soft placement (then: the ps task's CPU, or
 * this process). */
static int check_placement(run *r) {
  ps_session *s = r->s;
  if (s->nplaced < r->n) {
    if (ps_array_grow(&s->placed, NULL, r->n, 1) != 0) return oom(r->st);
    memset(s->placed + s->nplaced, 0, r->n - s->nplaced);
    s->nplaced = r->n;
  }
  for (size_t i = 0; i < r->n; i++) {
    if (r->state[i] == N_UNNEEDED || s->placed[i]) continue;
    ps_node *n = ps_graph_node(s->g, i);
    ps_device d;
    if (ps_device_parse(n->device, &d, NULL) == 0 && !device_exists(s, &d) &&
        !s->soft_placement) {
      char avail[1024];
      list_devices(s, avail, sizeof avail);
      return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                           "Cannot assign a device for operation %s: Operation was "
                           "explicitly assigned to %s but available devices are [ %s ]. "
                           "Make sure the device specification refers to a valid "
                           "device.",
                           n->var ? n->var->name : n->name, n->device, avail);
    }
    s->placed[i] = 1;
  }
  return 0;
}

/* Local nodes and remote waves in turn until every needed node is done. */
static int execute(run *r, ps_node **wave) {
  for (;;) {
    int rc = run_local_ready(r);
    if (rc) return rc;
    bool any_left;
    size_t nw = next_wave(r, wave, &any_left);
    if (nw == 0)
      return any_left ? ps_status_set(r->st, PS_INTERNAL, "graph has a dependency cycle")
                      : 0;
    rc = run_remote(r, wave, nw);
    for (size_t k = 0; k < nw; k++)
      r->state[wave[k]->id] = N_DONE;
    if (rc) return rc;
  }
}

/* The fetched values, shared into @outputs (all or none). */
static int share_outputs(run *r, ps_node *const *fetches, size_t nfetches,
                         ps_tensor **outputs) {
  for (size_t i = 0; i < nfetches; i++) {
    ps_tensor *v = r->val[fetches[i]->id];
    outputs[i] = v ? share(v) : NULL;
    if (v && outputs[i] == NULL) {
      for (size_t j = 0; j < i; j++) {
        ps_tensor_destroy(outputs[j]);
        outputs[j] = NULL;
      }
      return oom(r->st);
    }
  }
  return 0;
}

int ps_session_run(ps_session *s, const ps_feed *feeds, size_t nfeeds,
                   ps_node *const *fetches, size_t nfetches, ps_node *const *targets,
                   size_t ntargets, ps_tensor **outputs, ps_status *st) {
  ps_status local_st;
  if (st == NULL) st = &local_st;
  ps_status_clear(st);
  ps_graph *g = s->g;
  s->last_reads = s->last_updates = 0;
  s->last_sync_applied = s->last_sync_stale = 0;
  run r = {.s = s, .n = ps_graph_num_nodes(g), .st = st};
  r.state = calloc(r.n + 1, 1);
  r.val = calloc(r.n + 1, sizeof *r.val);
  r.fed = calloc(r.n + 1, sizeof *r.fed);
  r.remote_gather = calloc(r.n + 1, sizeof *r.remote_gather);
  r.skip_read = calloc(r.n + 1, sizeof *r.skip_read);
  r.want_value = calloc(r.n + 1, sizeof *r.want_value);
  ps_node **wave = calloc(r.n + 1, sizeof *wave);
  int rc = 0;
  if (!r.state || !r.val || !r.fed || !r.remote_gather || !r.skip_read || !r.want_value ||
      !wave)
    rc = oom(st);
  for (size_t i = 0; i < nfeeds && rc == 0; i++)
    rc = apply_feed(&r, &feeds[i], i);
  for (size_t i = 0; i < nfetches && rc == 0; i++) {
    if (fetches[i] == NULL)
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "fetch %zu is NULL", i);
    else if ((rc = check_in_graph(&r, fetches[i])) == 0)
      mark_needed(&r, fetches[i]);
  }
  for (size_t i = 0; i < ntargets && rc == 0; i++)
    if (targets[i]) rc = check_in_graph(&r, targets[i]);
  if (rc == 0) {
    for (size_t i = 0; i < ntargets; i++)
      if (targets[i]) mark_needed(&r, targets[i]);
    plan_gathers(&r, fetches, nfetches);
    mark_wanted(&r, fetches, nfetches);
    for (size_t i = 0; i < r.n; i++)
      if (r.skip_read[i]) r.state[i] = N_DONE;
    rc = check_placement(&r);
    if (rc == 0) rc = execute(&r, wave);
  }
  if (rc == 0) rc = share_outputs(&r, fetches, nfetches, outputs);
  for (size_t i = 0; r.val && i < r.n; i++)
    ps_tensor_destroy(r.val[i]);
  free(r.val);
  free(r.state);
  free(r.fed);
  free(r.remote_gather);
  free(r.skip_read);
  free(r.want_value);
  free(wave);
  return rc;
}

int ps_session_create_variables(ps_session *s, ps_status *st) {
  ps_graph *g = s->g;
  if (s->client == NULL) return 0;
  ps_node **reads = calloc(ps_graph_num_vars_(g) + 1, sizeof *reads);
  if (reads == NULL) return oom(st);
  size_t n = 0;
  for (size_t i = 0; i < ps_graph_num_vars_(g); i++)
    if (ps_graph_var_(g, i)->task >= 0) reads[n++] = ps_graph_var_(g, i)->read;
  run r = {.s = s, .n = ps_graph_num_nodes(g), .st = st};
  int rc = n ? ensure_created(&r, reads, n) : 0;
  free(reads);
  return rc;
}

ps_client *ps_session_client(const ps_session *s) {
  return s->client;
}
ps_graph *ps_session_graph(const ps_session *s) {
  return s->g;
}
