/* The nodes of a run that execute on the worker (session.c says how a run
 * goes): kernels, initializers of the variables the session holds and the
 * updates of those, the report of uninitialized variables, and the
 * initial values a read falls back to. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/array.h"
#include "common/kernels.h"
#include "common/variable.h"
#include "session_internal.h"

static int local_apply(run *r, ps_node *n, local_var *lv, int op, ps_tensor *in);

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
  int rc = out ? 0 : ps_session_oom_(st);
  for (size_t i = 0; i < e->n && rc == 0; i++) {
    ps_variable *v = e->vars[i];
    bool init = false;
    if (v->task < 0) {
      local_var *lv = ps_session_local_of_(s, v);
      if (lv == NULL) {
        rc = ps_session_local_err_(s, v, st);
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
    if (!init && (out[k++] = strdup(v->name)) == NULL) rc = ps_session_oom_(st);
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
  return r->val[n->id] ? 0 : ps_session_oom_(r->st);
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
int ps_session_init_draw_(ps_session *s, ps_variable *v, uint64_t *seedp, uint64_t *drawp,
                          ps_status *st) {
  size_t i = ps_session_var_index_(s->g, v), nvars = ps_graph_num_vars_(s->g);
  if (i == SIZE_MAX) return ps_session_not_in_graph_(v, st);
  if (i >= s->ndraws) {
    if (ps_array_grow(&s->draws, NULL, nvars, sizeof *s->draws) != 0)
      return ps_session_oom_(st);
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
  if (ps_session_init_draw_(s, v, &seed, &draw, st) != 0) return st->code;
  ps_tensor *x = ps_tensor_create(v->dtype, &v->shape, false);
  if (x == NULL) return ps_session_oom_(st);
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
    r->val[n->id] = ps_session_share_(r->val[n->in[0]->id]);
    return r->val[n->id] ? 0 : ps_session_oom_(r->st);
  }
  if (!v->has_init) return ps_var_uninitialized(v->name, r->st);
  return init_fill(r->s, v, &r->val[n->id], r->st);
}

bool ps_session_falls_back_(const ps_node *n) {
  return n->def->kind == PS_OPK_VAR_READ && n->ia[1] == 1;
}

/* The wave's initialized_value() reads of ps variables: one read each
 * (they run once, at initialization), the initial value where the
 * variable is uninitialized. */
int ps_session_run_fallback_reads_(run *r, ps_node **wave, size_t nw) {
  int rc = 0;
  for (size_t k = 0; k < nw && rc == 0; k++) {
    ps_node *n = wave[k];
    if (!ps_session_falls_back_(n)) continue;
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

int ps_session_run_local_(run *r, ps_node *n) {
  ps_status *st = r->st;
  if (r->fed[n->id]) return 0; /* value already set */
  switch (n->def->kind) {
  case PS_OPK_PLACEHOLDER:
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "You must feed a value for placeholder tensor '%s' with "
                         "dtype %s",
                         n->name, ps_dtype_name(n->dtype));
  case PS_OPK_CONST:
    r->val[n->id] = ps_session_share_(n->value);
    return 0;
  case PS_OPK_NOOP:
    r->val[n->id] = ps_session_empty_tensor_();
    return 0;
  case PS_OPK_REPORT_UNINIT:
    return run_report(r, n);
  case PS_OPK_LOCAL: {
    ps_tensor *in[16], **inp = in;
    if (n->nin > 16 && (inp = malloc((size_t)n->nin * sizeof *inp)) == NULL)
      return ps_session_oom_(st);
    for (int i = 0; i < n->nin; i++)
      inp[i] = r->val[n->in[i]->id];
    size_t id = (size_t)n->id, nn = ps_graph_num_nodes(r->s->g);
    if (id >= r->s->nkruns) {
      if (ps_array_grow(&r->s->kruns, NULL, nn, sizeof *r->s->kruns) != 0) {
        if (inp != in) free(inp);
        return ps_session_oom_(st);
      }
      memset(r->s->kruns + r->s->nkruns, 0, (nn - r->s->nkruns) * sizeof *r->s->kruns);
      r->s->nkruns = nn;
    }
    ps_kernel_runs_ = &r->s->kruns[id];
    ps_kernel_client_ = r->s->client;
    int rc = n->def->compute(n, inp, &r->val[n->id], st);
    ps_kernel_runs_ = NULL;
    ps_kernel_client_ = NULL;
    if (inp != in) free(inp);
    if (rc != 0) ps_status_prefix(st, "%s (%s)", n->name, n->def->type);
    return rc;
  }
  default:
    break;
  }
  /* variables held by the session */
  ps_variable *v = n->var;
  local_var *lv = ps_session_local_of_(r->s, v);
  if (lv == NULL) return ps_session_local_err_(r->s, v, st);
  switch (n->def->kind) {
  case PS_OPK_VAR_READ:
    if (lv->value == NULL && ps_session_falls_back_(n))
      return initial_value_instead(r, n);
    if (lv->value == NULL) return ps_var_uninitialized(v->name, st);
    r->val[n->id] = ps_session_share_(lv->value);
    return 0;
  case PS_OPK_VAR_IS_INIT: {
    ps_shape s0 = {0};
    r->val[n->id] = ps_tensor_create(PS_DT_BOOL, &s0, true);
    if (r->val[n->id] == NULL) return ps_session_oom_(st);
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
        if (x == NULL) return ps_session_oom_(st);
        memcpy(ps_tensor_data(x), ps_tensor_data(in), ps_tensor_nbytes(in));
      } else if (op == PS_ASSIGN_ADD || op == PS_ASSIGN_SUB) {
        x = ps_tensor_create(v->dtype, &v->shape, false);
        if (x == NULL) return ps_session_oom_(st);
        memcpy(ps_tensor_data(x), ps_tensor_data(lv->value), ps_tensor_nbytes(x));
        ps_elem_apply(v->dtype, op == PS_ASSIGN_ADD ? '+' : '-', ps_tensor_data(x),
                      ps_tensor_data(in), ps_tensor_num_elements(x));
      } else {
        return local_apply(r, n, lv, op, in);
      }
    }
    ps_tensor_destroy(lv->value);
    lv->value = x;
    r->val[n->id] = ps_session_update_output_(r, n, lv->value);
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
    r->val[n->id] = ps_session_update_output_(r, n, lv->value);
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
    local_var *sl = sv ? ps_session_local_of_(r->s, sv) : NULL;
    if (sv && sl == NULL) return ps_session_local_err_(r->s, sv, st);
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
  r->val[n->id] = ps_session_update_output_(r, n, lv->value);
  return 0;
}
