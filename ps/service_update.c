/* The Update RPC: assigns, scatters and optimizer updates applied
 * atomically per request, and synchronous updates through the conditional
 * accumulators (sync.c).  See service.c for the rules every handler keeps. */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kernels.h"
#include "common/log.h"
#include "common/variable.h"
#include "common/wire.h"
#include "ps.pb-c.h"
#include "repl.h"
#include "service_internal.h"
#include "store.h"
#include "sync.h"

/* ---- Update ---- */

struct upd_ctx;

typedef struct upd_item {
  Paramserver__Update *u;
  struct upd_ctx *x;
  ps_var *v;
  ps_shape shape;                  /* value shape */
  ps_buf *val;                     /* staged value */
  size_t val_off;                  /* where it starts in the bulk bytes */
  ps_buf *idx;                     /* staged indices (scatter, sparse gradient) */
  size_t isize;                    /* bytes per index */
  const ps_opt_info *opt;          /* optimizer ops, else NULL */
  ps_var *slots[PS_OPT_MAX_SLOTS]; /* its slot variables */
  bool sparse;                     /* optimizer op with a sparse gradient */
  bool widen;                      /* bfloat16 on the wire for a float variable */
  /* synchronous updates */
  bool sync;
  ps_sync_update su;
  bool stale;        /* dropped */
  bool waiting;      /* queued in the accumulator (w) */
  int64_t sync_step; /* reply: accumulator step */
  int64_t version;   /* reply: the variable's version */
  ps_sync_waiter w;
} upd_item;

typedef struct upd_ctx {
  Paramserver__UpdateRequest *req;
  upd_item *items;
  size_t n;
  ps_rpc_call *call;
  bool any_sync;
  int64_t bytes;            /* held once admitted: indices, values (widened) */
  ps_sync_waiter *held;     /* calls whose step this one applied: answered with it */
  atomic_int pending;       /* waiting updates + 1 while the handler runs */
  ps_status err;            /* a failure after validation (out of memory) */
  ps_repl_staging *staging; /* replication: values forwarded as they arrive */
  ps_var **locked;          /* answered early: the lock set update_after_reply releases */
  size_t nlocked;
} upd_ctx;

/* An APPLY_* op minus APPLY_GRADIENT_DESCENT is its ps_opt_kind. */
#define OPT_OF(op, kind)                                                                 \
  _Static_assert(PARAMSERVER__UPDATE_OP__##op -                                          \
                         PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT ==               \
                     (kind),                                                             \
                 #op " is " #kind)
OPT_OF(APPLY_GRADIENT_DESCENT, PS_OPT_GRADIENT_DESCENT);
OPT_OF(APPLY_MOMENTUM, PS_OPT_MOMENTUM);
OPT_OF(APPLY_ADAGRAD, PS_OPT_ADAGRAD);
OPT_OF(APPLY_ADAM, PS_OPT_ADAM);
_Static_assert(PARAMSERVER__UPDATE_OP__APPLY_ADAM -
                       PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT ==
                   PS_OPT_COUNT - 1,
               "every APPLY_* op has a kernel");
#undef OPT_OF

static const char *op_name(int op) {
  switch (op) {
  case PARAMSERVER__UPDATE_OP__ASSIGN:
    return "Assign";
  case PARAMSERVER__UPDATE_OP__ASSIGN_ADD:
    return "AssignAdd";
  case PARAMSERVER__UPDATE_OP__ASSIGN_SUB:
    return "AssignSub";
  case PARAMSERVER__UPDATE_OP__SCATTER_UPDATE:
    return "ScatterUpdate";
  case PARAMSERVER__UPDATE_OP__SCATTER_ADD:
    return "ScatterAdd";
  case PARAMSERVER__UPDATE_OP__SCATTER_SUB:
    return "ScatterSub";
  default: {
    const ps_opt_info *oi =
        ps_opt_info_get(op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT);
    return oi ? oi->op : "Unknown";
  }
  }
}

static bool is_scatter(int op) {
  return op >= PARAMSERVER__UPDATE_OP__SCATTER_UPDATE &&
         op <= PARAMSERVER__UPDATE_OP__SCATTER_SUB;
}

static bool is_optimizer(int op) {
  return op >= PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT &&
         op <= PARAMSERVER__UPDATE_OP__APPLY_ADAM;
}

/* Ops whose value is added to the variable (a delta or a gradient): the
 * ones that take bfloat16 values for a float variable (widened on arrival,
 * summed in float32). */
static bool adds_to_var(int op) {
  return op == PARAMSERVER__UPDATE_OP__ASSIGN_ADD ||
         op == PARAMSERVER__UPDATE_OP__ASSIGN_SUB ||
         op == PARAMSERVER__UPDATE_OP__SCATTER_ADD ||
         op == PARAMSERVER__UPDATE_OP__SCATTER_SUB || is_optimizer(op);
}

/* The kernel's name in errors: SparseApplyMomentum for a sparse gradient. */
static const char *item_op(const upd_item *it) {
  if (it->opt) return it->sparse ? it->opt->sparse_op : it->opt->op;
  return op_name(it->u->op);
}

static const char *plural(size_t n) {
  return n == 1 ? "" : "s";
}

/* Checks what only optimizer ops take (slots, hparams, use_nesterov) and
 * resolves the slot variables; counts are per kernel.  Nothing here depends
 * on the variables' state, which update_data checks under the locks. */
static int resolve_optimizer(ps_service *s, upd_item *it, ps_status *st) {
  Paramserver__Update *u = it->u;
  if (!is_optimizer(u->op)) {
    if (u->n_slots || u->n_hparams || u->use_nesterov)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: only optimizer updates take slots, hparams or "
                           "use_nesterov",
                           op_name(u->op), u->name);
    return 0;
  }
  const ps_opt_info *oi =
      ps_opt_info_get(u->op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT);
  it->opt = oi;
  it->sparse = u->index_dtype != 0;
  const char *op = item_op(it);
  if (!it->sparse && u->num_indices != 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: num_indices is %lld but index_dtype is unset; a "
                         "sparse gradient needs int32 or int64 indices",
                         op, u->name, (long long)u->num_indices);
  if (u->n_slots != oi->nslots) {
    if (oi->nslots == 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: takes no slot variables, got %zu", op, u->name,
                           u->n_slots);
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: takes %zu slot variable%s (%s), got %zu", op, u->name,
                         oi->nslots, plural(oi->nslots), oi->slot_names, u->n_slots);
  }
  if (u->n_hparams != oi->nhparams)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT, "%s %s: takes %zu hparam%s (%s), got %zu", op, u->name,
        oi->nhparams, plural(oi->nhparams), oi->hparam_names, u->n_hparams);
  if (u->use_nesterov && !oi->nesterov)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: use_nesterov applies only to Momentum and Adam", op,
                         u->name);
  if (u->use_nesterov && it->sparse && !oi->sparse_nesterov)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: use_nesterov is not supported with a sparse "
                         "gradient (TensorFlow's sparse Adam has no Nesterov "
                         "variant)",
                         op, u->name);
  for (size_t k = 0; k < u->n_slots; k++) {
    ps_var *sv = ps_store_lookup(s->store, u->slots[k]);
    if (sv == NULL)
      return ps_status_set(st, PS_NOT_FOUND,
                           "%s %s: slot variable %s does not exist on %s", op, u->name,
                           u->slots[k], ps_store_task(s->store));
    if (sv == it->v)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: slot variable %s is the variable itself", op, u->name,
                           u->slots[k]);
    for (size_t j = 0; j < k; j++)
      if (it->slots[j] == sv)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s %s: slot variable %s is given twice", op, u->name,
                             u->slots[k]);
    it->slots[k] = sv;
  }
  return 0;
}

/* Checks the synchronous fields of update @i (the rules are in
 * proto/ps.proto). */
static int resolve_sync(upd_ctx *x, size_t i, ps_status *st) {
  upd_item *it = &x->items[i];
  Paramserver__Update *u = it->u;
  const char *op = item_op(it);
  if (u->replicas_to_aggregate < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: replicas_to_aggregate must be positive for a "
                         "synchronous update (0: asynchronous), got %d",
                         op, u->name, u->replicas_to_aggregate);
  if (u->replicas_to_aggregate == 0) {
    if (u->sync_local_step != 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: sync_local_step is set but replicas_to_aggregate "
                           "is 0 (asynchronous)",
                           op, u->name);
    return 0;
  }
  if (is_scatter(u->op))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: scatter updates cannot be synchronous", op, u->name);
  if (u->op == PARAMSERVER__UPDATE_OP__ASSIGN && u->no_validate_shape)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Assign %s: a synchronous assign cannot change the shape "
                         "(no_validate_shape)",
                         u->name);
  /* the accumulator adopts a fresh local step and counts on from it */
  if (u->sync_local_step < 0 || u->sync_local_step == INT64_MAX)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: sync_local_step must be in [0, %lld), got %lld", op,
                         u->name, (long long)INT64_MAX, (long long)u->sync_local_step);
  it->sync = true;
  x->any_sync = true;
  return 0;
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return (x > y) - (x < y);
}

/* At most one synchronous update per variable and request: a worker sends
 * one gradient per step, and the accumulator counts requests' updates. */
static int check_sync_unique(upd_ctx *x, ps_status *st) {
  ps_var **v = malloc((x->n + 1) * sizeof *v);
  if (v == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  size_t k = 0;
  for (size_t i = 0; i < x->n; i++)
    if (x->items[i].sync) v[k++] = x->items[i].v;
  qsort(v, k, sizeof *v, cmp_ptr);
  int rc = 0;
  for (size_t i = 1; i < k && rc == 0; i++)
    if (v[i] == v[i - 1])
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Update: the request has two synchronous updates of %s",
                         v[i]->name);
  free(v);
  return rc;
}

static void update_free(ps_rpc_call *c) {
  upd_ctx *x = ps_rpc_call_ctx(c);
  if (x == NULL) return;
  ps_repl_stage_end(x->staging);
  for (size_t i = 0; i < x->n; i++) {
    ps_buf_unref(x->items[i].val);
    ps_buf_unref(x->items[i].idx);
  }
  free(x->items);
  if (x->req) paramserver__update_request__free_unpacked(x->req, NULL);
  free(x);
}

/* Replication: as the bytes of large assigns arrive, the backups get them
 * (ps_repl_stage_begin). */
static void update_progress(ps_rpc_call *c, size_t received) {
  upd_ctx *x = ps_rpc_call_ctx(c);
  ps_repl_stage_progress(x->staging, received);
}

static void stage(upd_ctx *x, int shard) {
  ps_buf *bufs[8];
  size_t offs[8], n = 0;
  for (size_t i = 0; i < x->n && n < 8; i++) {
    upd_item *it = &x->items[i];
    if (it->u->op == PARAMSERVER__UPDATE_OP__ASSIGN && !it->u->fill && !it->sync &&
        it->val->size >= PS_REPL_STAGE_MIN) {
      bufs[n] = it->val;
      offs[n++] = it->val_off;
    }
  }
  x->staging = ps_repl_stage_begin(ps_svc_of_(x->call)->repl, shard, bufs, offs, n);
  if (x->staging) ps_rpc_call_on_progress(x->call, update_progress);
}

static int update_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__update_request__descriptor, "Update");
  upd_ctx *x = calloc(1, sizeof *x);
  if (x == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  ps_rpc_call_set_ctx(c, x);
  x->call = c;
  atomic_init(&x->pending, 1);
  x->req = paramserver__update_request__unpack(NULL, n, p);
  if (x->req == NULL) return ps_svc_bad_request_(st, "Update");
  if (ps_svc_route_(s, x->req->route, "Update", st) != 0) return st->code;
  int shard = ps_svc_route_shard_(s, x->req->route);
  x->n = x->req->n_updates;
  x->items = calloc(x->n + 1, sizeof *x->items);
  if (x->items == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  ps_rpc_segs sink = {0};
  int rc = 0;
  size_t staged = 0, widened = 0; /* widened: what float32 adds to the wire bytes */
  for (size_t i = 0; i < x->n && rc == 0; i++) {
    upd_item *it = &x->items[i];
    Paramserver__Update *u = x->req->updates[i];
    it->u = u;
    it->x = x;
    if ((int)u->op < 0 || u->op > PARAMSERVER__UPDATE_OP__APPLY_ADAM) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "update of %s: unknown op %d", u->name,
                         (int)u->op);
      break;
    }
    if ((it->v = ps_svc_find_(s, shard, u->name, st)) == NULL) {
      rc = st->code;
      break;
    }
    if ((rc = resolve_optimizer(s, it, st)) != 0) break;
    if ((rc = resolve_sync(x, i, st)) != 0) break;
    const char *op = item_op(it);
    size_t es = ps_dtype_size(u->dtype);
    if (es == 0) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: unsupported value dtype %d", op,
                         u->name, u->dtype);
      break;
    }
    if ((rc = ps_svc_shape_from_(&it->shape, u->shape, u->n_shape, u->name, st)) != 0)
      break;
    if (u->dtype == PS_DT_BFLOAT16 && it->v->dtype == PS_DT_FLOAT) {
      if (!adds_to_var(u->op)) { /* fills: only on Assign (ps_svc_check_fill_) */
        rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: a bfloat16 value for a float variable is taken only "
                           "by the ops that add to it (AssignAdd, AssignSub, ScatterAdd, "
                           "ScatterSub, optimizer gradients)",
                           op, u->name);
        break;
      }
      it->widen = true;
    }
    if (is_scatter(u->op) || it->sparse) {
      if (u->index_dtype != PS_DT_INT32 && u->index_dtype != PS_DT_INT64) {
        rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: indices must be int32 or int64, got %s", op, u->name,
                           ps_dtype_name(u->index_dtype));
        break;
      }
      if (u->num_indices < 0) {
        rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: negative index count", op,
                           u->name);
        break;
      }
      it->isize = ps_dtype_size(u->index_dtype);
      size_t ib;
      if ((rc = ps_svc_elems_bytes_(s, u->index_dtype, u->num_indices, op, u->name, &ib,
                                    st)) != 0 ||
          (rc = ps_svc_add_staged_(s, &staged, ib, "Update", st)) != 0)
        break;
      if ((it->idx = ps_buf_create(ib, false)) == NULL) {
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "%s %s: cannot allocate %lld indices", op, u->name,
                           (long long)u->num_indices);
        break;
      }
      ps_rpc_segs_add(&sink, it->idx->data, it->idx->size, NULL);
    }
    if (u->fill &&
        (rc = ps_svc_check_fill_(u, &it->shape, it->sync, op_name(u->op), st)) != 0)
      break;
    size_t vb;
    if ((rc = ps_svc_tensor_bytes_(s, u->dtype, &it->shape, op, u->name, &vb, st)) != 0 ||
        (rc = ps_svc_add_staged_(s, &staged, vb, "Update", st)) != 0 ||
        (it->widen && (rc = ps_svc_add_staged_(s, &staged, 2 * vb, "Update", st)) != 0))
      break;
    if (it->widen) widened += vb;
    bool zero = u->fill && ps_init_type_from_name(u->fill->type) == PS_INIT_ZEROS;
    if ((it->val = ps_buf_create(vb, zero)) == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "%s %s: cannot allocate the value (%zu bytes)", op, u->name, vb);
      break;
    }
    if (u->fill) {
      if (!zero && (rc = ps_svc_run_fill_(u, &it->shape, it->val->data, st)) != 0) break;
    } else {
      it->val_off = sink.total;
      ps_rpc_segs_add(&sink, it->val->data, it->val->size, NULL);
    }
  }
  if (rc == 0 && x->any_sync) rc = check_sync_unique(x, st);
  /* what the update holds once admitted (update_data): its values widened */
  x->bytes = (int64_t)(sink.total + widened);
  if (rc == 0 && s->repl && sink.total > PS_RPC_INLINE_MAX) stage(x, shard);
  return ps_svc_expect_(c, rc, &x->req->inline_data, &sink, "Update", "updates", st);
}

static int64_t index_at(const upd_item *it, int64_t k) {
  if (it->isize == 4) return ((const int32_t *)it->idx->data)[k];
  return ((const int64_t *)it->idx->data)[k];
}

/* Simulated state of a variable while validating a batch in order. */
typedef struct sim {
  ps_var *v;
  bool init;
  ps_shape shape;
} sim;

static int validate_update(upd_item *it, sim *sm, ps_status *st) {
  Paramserver__Update *u = it->u;
  ps_var *v = it->v;
  char a[256], b[256], c2[256];
  const char *op = op_name(u->op);
  if (u->op == PARAMSERVER__UPDATE_OP__ASSIGN && u->no_validate_shape &&
      u->dtype == (int)v->dtype && v->init_full_name &&
      strcmp(v->init_full_name, v->name) && !ps_shape_equal(&sm->shape, &it->shape))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Assign %s: a part of partitioned variable %s cannot "
                         "change its shape (%s to %s, validate_shape off)",
                         v->name, v->init_full_name,
                         ps_svc_fmt_shape_(&sm->shape, a, sizeof a),
                         ps_svc_fmt_shape_(&it->shape, b, sizeof b));
  if (!is_scatter(u->op)) {
    ps_var_update_kind k = u->op == PARAMSERVER__UPDATE_OP__ASSIGN ? PS_VAR_ASSIGN
                           : u->op == PARAMSERVER__UPDATE_OP__ASSIGN_ADD
                               ? PS_VAR_ASSIGN_ADD
                               : PS_VAR_ASSIGN_SUB;
    int rc =
        ps_var_check_update(k, v->name, v->dtype, &sm->shape, sm->init,
                            (ps_dtype)u->dtype, &it->shape, !u->no_validate_shape, st);
    if (rc == 0 && k == PS_VAR_ASSIGN) {
      sm->init = true;
      sm->shape = it->shape;
    }
    return rc;
  }
  int rc = ps_var_check_dtype(op, v->name, "value", (ps_dtype)u->dtype, v->dtype, st);
  if (rc != 0) return rc;
  if (!sm->init) return ps_var_uninitialized(v->name, st);
  if (!ps_dtype_is_numeric(v->dtype) && u->op != PARAMSERVER__UPDATE_OP__SCATTER_UPDATE)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: dtype %s has no arithmetic", op,
                         v->name, ps_dtype_name(v->dtype));
  if (sm->shape.rank < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "params must be at least 1-D, got shape %s\n\t "
                         "[[{{node %s/%s}}]]",
                         ps_svc_fmt_shape_(&sm->shape, a, sizeof a), v->name, op);
  ps_shape want = sm->shape, ishape = {.rank = 1, .dim = {u->num_indices}};
  want.dim[0] = u->num_indices;
  if (!ps_shape_equal(&want, &it->shape))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Must have updates.shape = indices.shape + "
                         "params.shape[1:], got updates.shape %s, indices.shape "
                         "%s, params.shape %s\n\t [[{{node %s/%s}}]]",
                         ps_svc_fmt_shape_(&it->shape, a, sizeof a),
                         ps_svc_fmt_shape_(&ishape, b, sizeof b),
                         ps_svc_fmt_shape_(&sm->shape, c2, sizeof c2), v->name, op);
  return ps_svc_check_indices_(it->idx->data, it->isize, u->num_indices, sm->shape.dim[0],
                               v->name, op, st);
}

static sim *sim_of(sim *sims, size_t *nsim, ps_var *v) {
  for (size_t k = 0; k < *nsim; k++)
    if (sims[k].v == v) return &sims[k];
  sim *sm = &sims[(*nsim)++];
  sm->v = v;
  sm->init = v->buf != NULL;
  sm->shape = v->shape;
  return sm;
}

/* An optimizer update against the simulated state of its variable (@sm)
 * and slots (@ss).  It changes neither's shape nor initialization. */
static int validate_optimizer(upd_item *it, const sim *sm, sim *const *ss,
                              ps_status *st) {
  Paramserver__Update *u = it->u;
  ps_var *v = it->v;
  const char *op = item_op(it);
  char a[256], b[256], c2[256];
  if (ps_var_check_dtype(op, v->name, "gradient", (ps_dtype)u->dtype, v->dtype, st))
    return st->code;
  if (!ps_kernel_dtype_ok(v->dtype))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: dtype %s is not supported; the optimizer kernels "
                         "run on float and double",
                         op, v->name, ps_dtype_name(v->dtype));
  if (!sm->init) return ps_var_uninitialized(v->name, st);
  for (size_t k = 0; k < it->opt->nslots; k++) {
    ps_var *sv = it->slots[k];
    if (sv->dtype != v->dtype)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: slot variable %s has dtype %s, the variable has "
                           "dtype %s",
                           op, v->name, sv->name, ps_dtype_name(sv->dtype),
                           ps_dtype_name(v->dtype));
    if (!ss[k]->init) return ps_var_uninitialized(sv->name, st);
    if (!ps_shape_equal(&ss[k]->shape, &sm->shape))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: slot variable %s has shape %s, the variable has "
                           "shape %s",
                           op, v->name, sv->name,
                           ps_svc_fmt_shape_(&ss[k]->shape, a, sizeof a),
                           ps_svc_fmt_shape_(&sm->shape, b, sizeof b));
  }
  if (!it->sparse) {
    if (!ps_shape_equal(&sm->shape, &it->shape))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: var and grad do not have the same shape: var %s, "
                           "grad %s",
                           op, v->name, ps_svc_fmt_shape_(&sm->shape, a, sizeof a),
                           ps_svc_fmt_shape_(&it->shape, b, sizeof b));
    return 0;
  }
  if (sm->shape.rank < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: var must be at least 1 dimensional for a sparse "
                         "gradient, got shape %s",
                         op, v->name, ps_svc_fmt_shape_(&sm->shape, a, sizeof a));
  ps_shape want = sm->shape, ishape = {.rank = 1, .dim = {u->num_indices}};
  want.dim[0] = u->num_indices;
  if (!ps_shape_equal(&want, &it->shape))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: Must have grad.shape = indices.shape + "
                         "var.shape[1:], got grad.shape %s, indices.shape %s, "
                         "var.shape %s",
                         op, v->name, ps_svc_fmt_shape_(&it->shape, a, sizeof a),
                         ps_svc_fmt_shape_(&ishape, b, sizeof b),
                         ps_svc_fmt_shape_(&sm->shape, c2, sizeof c2));
  return ps_svc_check_indices_(it->idx->data, it->isize, u->num_indices, sm->shape.dim[0],
                               v->name, op, st);
}

/* Runs optimizer @opt's kernel on @v and its slots @slots (validated, all
 * write-locked): the gradient @grad is dense, or rows of @indices. */
static void run_kernel(ps_var *v, ps_var *const *slots, int opt, const char *opname,
                       const void *grad, bool sparse, const void *indices, size_t isize,
                       int64_t nindices, const double *hparams, bool use_nesterov) {
  const ps_opt_info *oi = ps_opt_info_get(opt);
  size_t ns = oi ? oi->nslots : 0;
  ps_status st;
  int rc = ps_var_make_private(v, &st);
  for (size_t k = 0; k < ns && rc == 0; k++)
    rc = ps_var_make_private(slots[k], &st);
  if (rc != 0) {
    PS_ERROR("%s %s: %s", opname, v->name, st.msg);
    return;
  }
  ps_kernel_args a = {
      .opt = (ps_opt_kind)opt,
      .dtype = v->dtype,
      .var = v->buf->data,
      .var_elems = ps_shape_num_elements(&v->shape),
      .row_elems = 1,
      .grad = grad,
      .sparse = sparse,
      .indices = indices,
      .index_size = isize,
      .nindices = nindices,
      .hparams = hparams,
      .use_nesterov = use_nesterov,
  };
  for (size_t k = 0; k < ns; k++)
    a.slots[k] = slots[k]->buf->data;
  for (int d = 1; d < v->shape.rank; d++)
    a.row_elems *= v->shape.dim[d];
  if (ps_kernel_apply(&a) != 0) {
    PS_ERROR("%s %s: the kernel refused a validated update", opname, v->name);
    return;
  }
  v->version++;
  for (size_t k = 0; k < ns; k++)
    slots[k]->version++;
}

static void apply_optimizer(upd_item *it) {
  run_kernel(it->v, it->slots,
             (int)(it->u->op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT),
             item_op(it), it->val->data, it->sparse, it->idx ? it->idx->data : NULL,
             it->isize, it->u->num_indices, it->u->hparams, it->u->use_nesterov);
}

static void apply_update(ps_store *store, upd_item *it) {
  Paramserver__Update *u = it->u;
  ps_var *v = it->v;
  ps_status st;
  if (it->opt) {
    apply_optimizer(it);
    return;
  }
  if (u->op == PARAMSERVER__UPDATE_OP__ASSIGN) {
    ps_var_set_buf(store, v, it->val, &it->shape);
    return;
  }
  if (ps_var_make_private(v, &st) != 0) {
    PS_ERROR("%s", st.msg);
    return;
  }
  int64_t ne = ps_shape_num_elements(&it->shape);
  switch (u->op) {
  case PARAMSERVER__UPDATE_OP__ASSIGN_ADD:
    ps_elem_apply(v->dtype, '+', v->buf->data, it->val->data, ne);
    break;
  case PARAMSERVER__UPDATE_OP__ASSIGN_SUB:
    ps_elem_apply(v->dtype, '-', v->buf->data, it->val->data, ne);
    break;
  default: {
    char opc = u->op == PARAMSERVER__UPDATE_OP__SCATTER_ADD   ? '+'
               : u->op == PARAMSERVER__UPDATE_OP__SCATTER_SUB ? '-'
                                                              : '=';
    int64_t row = v->shape.dim[0] ? ne / (u->num_indices ? u->num_indices : 1) : 0;
    size_t rb = (size_t)row * ps_dtype_size(v->dtype);
    uint8_t *base = v->buf->data;
    for (int64_t k = 0; k < u->num_indices; k++) {
      if (k + PS_ROW_AHEAD < u->num_indices)
        ps_prefetch_row(base + (size_t)index_at(it, k + PS_ROW_AHEAD) * rb, rb, true);
      ps_elem_apply(v->dtype, opc, base + (size_t)index_at(it, k) * rb,
                    (uint8_t *)it->val->data + (size_t)k * rb, row);
    }
    break;
  }
  }
  v->version++;
}

/* ---- synchronous updates ---- */

/* The accumulator's view of synchronous update @it. */
static void sync_describe(upd_item *it) {
  Paramserver__Update *u = it->u;
  ps_sync_update *su = &it->su;
  memset(su, 0, sizeof *su);
  switch (u->op) {
  case PARAMSERVER__UPDATE_OP__ASSIGN:
    su->kind = PS_SYNC_ASSIGN;
    break;
  case PARAMSERVER__UPDATE_OP__ASSIGN_ADD:
    su->kind = PS_SYNC_ADD;
    break;
  case PARAMSERVER__UPDATE_OP__ASSIGN_SUB:
    su->kind = PS_SYNC_SUB;
    break;
  default:
    su->kind = PS_SYNC_APPLY;
    su->opt = (int)(u->op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT);
    break;
  }
  su->dtype = (ps_dtype)u->dtype;
  su->shape = it->shape;
  su->value = it->val->data;
  su->sparse = it->sparse;
  su->indices = it->idx ? it->idx->data : NULL;
  su->isize = it->isize;
  su->nindices = it->sparse ? u->num_indices : 0;
  su->slots = u->slots;
  su->nslots = u->n_slots;
  su->hparams = u->hparams;
  su->nhparams = u->n_hparams;
  su->use_nesterov = u->use_nesterov;
  su->replicas = u->replicas_to_aggregate;
  su->local_step = u->sync_local_step;
}

/* Validation of synchronous update @it against its accumulator and the
 * simulated state @sm of its variable (after the checks every update gets;
 * the variable must hold a value before them, also for an assign). */
static int validate_sync(ps_service *s, upd_item *it, const sim *sm, ps_status *st) {
  if (atomic_load(&s->sync_closed))
    return ps_status_set(st, PS_UNAVAILABLE,
                         "%s is shutting down: synchronous update of %s refused", s->task,
                         it->v->name);
  sync_describe(it);
  bool stale, completes;
  int64_t rows = sm->shape.rank > 0 ? sm->shape.dim[0] : 0;
  return ps_accum_check(it->v->accum, &it->su, it->v->epoch, rows, it->v->name, &stale,
                        &completes, st);
}

/* Applies the full step of @it's accumulator with @it's (locked) variable
 * and slots, and prepends the step's waiters to *@done. */
static void sync_apply_step(ps_store *store, upd_item *it, ps_sync_waiter **done) {
  ps_var *v = it->v;
  ps_accum *a = v->accum;
  ps_sync_take t;
  ps_status st;
  if (ps_accum_take(a, &t, &st) != 0) {
    PS_ERROR("synchronous step of %s: %s", v->name, st.msg);
    ps_sync_waiter *w = ps_accum_fail(a, st.code, st.msg);
    while (w) {
      ps_sync_waiter *next = w->next;
      w->next = *done;
      *done = w;
      w = next;
    }
    return;
  }
  switch (t.kind) {
  case PS_SYNC_APPLY: {
    const ps_opt_info *oi = ps_opt_info_get(t.opt);
    run_kernel(v, it->slots, t.opt, t.sparse ? oi->sparse_op : oi->op, t.value, t.sparse,
               t.indices, sizeof(int64_t), t.nindices, t.hparams, t.use_nesterov);
    break;
  }
  case PS_SYNC_ASSIGN: {
    size_t bytes = 0;
    ps_size_bytes(v->dtype, &v->shape, &bytes); /* the variable's: checked */
    ps_buf *b = ps_buf_create(bytes, false);
    if (b == NULL) {
      PS_ERROR("Assign %s: out of memory applying a synchronous step", v->name);
      break;
    }
    memcpy(b->data, t.value, b->size);
    ps_var_set_buf(store, v, b, NULL);
    ps_buf_unref(b);
    break;
  }
  case PS_SYNC_ADD:
  case PS_SYNC_SUB:
    if (ps_var_make_private(v, &st) != 0) {
      PS_ERROR("%s", st.msg);
      break;
    }
    ps_elem_apply(v->dtype, t.kind == PS_SYNC_ADD ? '+' : '-', v->buf->data, t.value,
                  ps_shape_num_elements(&v->shape));
    v->version++;
    break;
  }
  PS_DEBUG("synchronous step %lld of %s applied", (long long)t.step, v->name);
  ps_sync_waiter *w = ps_accum_finish(a, v->version, v->epoch);
  while (w) {
    ps_sync_waiter *next = w->next;
    w->next = *done;
    *done = w;
    w = next;
  }
}

/* Synchronous update @it (validated): dropped when stale, else queued in
 * its accumulator; applies the step when @it fills it. */
static void sync_update(ps_service *s, upd_item *it, ps_sync_waiter **done) {
  ps_var *v = it->v;
  upd_ctx *x = it->x;
  ps_status st;
  if (v->accum == NULL && (v->accum = ps_accum_create()) == NULL) {
    ps_status_set(&x->err, PS_RESOURCE_EXHAUSTED,
                  "out of memory creating the accumulator of %s", v->name);
    return;
  }
  bool stale, completes;
  int64_t rows = v->shape.rank > 0 ? v->shape.dim[0] : 0;
  if (ps_accum_check(v->accum, &it->su, v->epoch, rows, v->name, &stale, &completes,
                     &st) != 0) {
    /* validated a moment ago under the same locks: cannot happen */
    x->err = st;
    return;
  }
  if (stale) {
    it->stale = true;
    it->sync_step = ps_accum_step(v->accum);
    it->version = v->version;
    PS_DEBUG("%s: stale update (local step %lld < %lld) dropped", v->name,
             (long long)it->su.local_step, (long long)it->sync_step);
    return;
  }
  if (ps_accum_add(v->accum, &it->su, v->epoch, &it->w, &st) != 0) {
    x->err = st;
    return;
  }
  it->waiting = true;
  atomic_fetch_add(&x->pending, 1);
  if (ps_accum_full(v->accum)) sync_apply_step(s->store, it, done);
}

/* The reply of a finished call (every synchronous update applied or
 * failed): 0, or the first failure. */
static int update_reply(upd_ctx *x, ps_status *st) {
  if (x->err.code != PS_OK) {
    *st = x->err;
    return st->code;
  }
  for (size_t i = 0; i < x->n; i++) {
    upd_item *it = &x->items[i];
    if (it->waiting && it->w.st.code != PS_OK) {
      *st = it->w.st;
      return st->code;
    }
  }
  Paramserver__UpdateResponse resp = PARAMSERVER__UPDATE_RESPONSE__INIT;
  int64_t *versions = calloc(x->n + 1, sizeof *versions);
  int64_t *steps = calloc(x->n + 1, sizeof *steps);
  protobuf_c_boolean *stale = calloc(x->n + 1, sizeof *stale);
  if (!versions || !steps || !stale) {
    free(versions);
    free(steps);
    free(stale);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < x->n; i++) {
    upd_item *it = &x->items[i];
    versions[i] = it->waiting ? it->w.version : it->version;
    steps[i] = it->waiting ? it->w.step : it->sync_step;
    stale[i] = it->stale;
  }
  resp.versions = versions;
  resp.n_versions = x->n;
  ps_service *s = ps_rpc_call_server_user(x->call);
  if (s->repl) resp.epoch = ps_repl_epoch(s->repl);
  if (x->any_sync) {
    resp.stale = stale;
    resp.n_stale = x->n;
    resp.sync_steps = steps;
    resp.n_sync_steps = x->n;
  }
  ps_rpc_call_reply(x->call, &resp.base);
  free(versions);
  free(steps);
  free(stale);
  return 0;
}

/* One waiting update of a call is done; the last one answers the call.
 * Runs without variable locks (the reply goes out from here). */
static void sync_release(upd_ctx *x) {
  if (atomic_fetch_sub(&x->pending, 1) != 1) return;
  ps_status st;
  ps_status_clear(&st);
  int rc = update_reply(x, &st);
  ps_rpc_call_resume(x->call, rc, &st);
}

void ps_svc_sync_release_all_(ps_sync_waiter *w) {
  while (w) {
    ps_sync_waiter *next = w->next;
    upd_item *it = (upd_item *)(void *)((char *)w - offsetof(upd_item, w));
    sync_release(it->x);
    w = next;
  }
}

void ps_service_shutdown(ps_service *s) {
  atomic_store(&s->sync_closed, true);
  size_t n = 0;
  ps_var **vars = ps_store_list(s->store, &n);
  size_t failed = 0;
  for (size_t i = 0; vars && i < n; i++) {
    ps_var *v = vars[i];
    pthread_rwlock_wrlock(&v->lock);
    ps_sync_waiter *w = NULL;
    if (v->accum) {
      char msg[PS_STATUS_MSG_MAX];
      snprintf(msg, sizeof msg,
               "%s is shutting down: synchronous step %lld of %s was not applied",
               s->task, (long long)ps_accum_step(v->accum), v->name);
      w = ps_accum_fail(v->accum, PS_UNAVAILABLE, msg);
    }
    pthread_rwlock_unlock(&v->lock);
    for (ps_sync_waiter *k = w; k; k = k->next)
      failed++;
    ps_svc_sync_release_all_(w);
  }
  free(vars);
  if (failed) PS_INFO("shutdown: failed %zu waiting synchronous update(s)", failed);
  /* updates parked at a closed snapshot gate are answered now (UNAVAILABLE,
   * see update_deferred) rather than when the gate's hold runs out */
  ps_store_gate_open(s->store);
}

/* ---- the Update handler ---- */

/* The backups acknowledged the effects of call @x (@rc 0), or never will
 * (@rc UNAVAILABLE: fenced): the calls whose step it applied, then @x. */
static void update_replicated(void *arg, int rc, const ps_status *st) {
  upd_ctx *x = arg;
  if (rc != 0 && x->err.code == PS_OK) x->err = *st;
  ps_sync_waiter *w = x->held;
  x->held = NULL;
  ps_svc_sync_release_all_(w);
  sync_release(x);
}

/* Locks every variable of the request, slots included (one write-lock set,
 * taken in name order), validates the whole batch in order against a
 * simulated state, and applies it only if all of it is valid.  Returns 0
 * (replied), an error, or PS_RPC_PENDING when synchronous updates wait for
 * their step. */
static int update_apply(ps_rpc_call *c, ps_status *st, bool early);

/* An update that found the snapshot gate closed runs here when it opens. */
static void update_deferred(void *arg) {
  ps_rpc_call *c = arg;
  ps_service *s = ps_rpc_call_server_user(c);
  ps_status st;
  ps_status_clear(&st);
  int rc;
  if (atomic_load(&s->sync_closed)) /* shutting down: answer, apply nothing */
    rc = ps_status_set(&st, PS_UNAVAILABLE,
                       "%s is shutting down: the update waited for a snapshot and was "
                       "not applied",
                       s->task);
  else if (ps_rpc_call_expired(c)) /* its client was told it failed: never apply it */
    rc = ps_status_set(&st, PS_DEADLINE_EXCEEDED,
                       "Update: the deadline passed while the update waited for a "
                       "snapshot on %s; not applied",
                       s->task);
  else
    rc = update_apply(c, &st, false);
  ps_store_update_leave(s->store);
  if (rc != PS_RPC_PENDING) ps_rpc_call_resume(c, rc, &st);
}

/* The bfloat16 values of float variables, now all here, become float32
 * values (exact: every bfloat16 is a float); from here on the update is
 * as if it had come as float32. */
static int widen_values(upd_ctx *x, ps_status *st) {
  for (size_t i = 0; i < x->n; i++) {
    upd_item *it = &x->items[i];
    if (!it->widen) continue;
    size_t ne = it->val->size / sizeof(uint16_t);
    ps_buf *f = ps_buf_create(ne * sizeof(float), false);
    if (f == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "%s %s: cannot allocate %zu bytes to widen its bfloat16 value",
                           item_op(it), it->u->name, ne * sizeof(float));
    ps_bf16_widen(f->data, it->val->data, ne);
    ps_buf_unref(it->val);
    it->val = f;
    it->u->dtype = PS_DT_FLOAT;
    it->widen = false;
  }
  return 0;
}

static int update_data(ps_rpc_call *c, ps_status *st) {
  ps_service *s = ps_rpc_call_server_user(c);
  upd_ctx *x = ps_rpc_call_ctx(c);
  if (widen_values(x, st) != 0) return st->code;
  bool parked;
  int rc0 = ps_store_update_admit(s->store, update_deferred, c, x->bytes, &parked, st);
  if (rc0 != 0) return rc0;
  if (parked) return PS_RPC_PENDING;
  int rc = update_apply(c, st, true);
  if (x->locked == NULL) /* else update_after_reply leaves, once applied */
    ps_store_update_leave(s->store);
  return rc;
}

/* Every buffer the update will write its own (a snapshot may share one),
 * before anything changes: an out-of-memory fails the call whole. */
static int make_private_all(upd_ctx *x, ps_status *st) {
  for (size_t i = 0; i < x->n; i++) {
    upd_item *it = &x->items[i];
    if (it->sync || (!it->opt && it->u->op == PARAMSERVER__UPDATE_OP__ASSIGN)) continue;
    if (ps_var_make_private(it->v, st) != 0) return st->code;
    for (size_t k = 0; it->opt && k < it->opt->nslots; k++)
      if (ps_var_make_private(it->slots[k], st) != 0) return st->code;
  }
  return 0;
}

/* An update answered before its apply (update_apply's early answer): its
 * validated effects, under the locks it still holds. */
static void update_after_reply(ps_rpc_call *c) {
  ps_service *s = ps_rpc_call_server_user(c);
  upd_ctx *x = ps_rpc_call_ctx(c);
  for (size_t i = 0; i < x->n; i++)
    apply_update(s->store, &x->items[i]);
  ps_store_unlock_set(x->locked, x->nlocked);
  free(x->locked);
  x->locked = NULL;
  ps_store_update_leave(s->store);
}

static int update_apply(ps_rpc_call *c, ps_status *st, bool early) {
  ps_service *s = ps_rpc_call_server_user(c);
  upd_ctx *x = ps_rpc_call_ctx(c);
  size_t nlock = 0;
  for (size_t i = 0; i < x->n; i++)
    nlock += 1 + (x->items[i].opt ? x->items[i].opt->nslots : 0);
  ps_var **vars = malloc((nlock + 1) * sizeof *vars);
  sim *sims = calloc(nlock + 1, sizeof *sims);
  int64_t *before = s->repl ? calloc(nlock + 1, sizeof *before) : NULL;
  ps_svc_rows *rows = s->repl ? calloc(nlock + 1, sizeof *rows) : NULL;
  if (vars == NULL || sims == NULL || (s->repl && (before == NULL || rows == NULL))) {
    free(vars);
    free(sims);
    free(before);
    free(rows);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  nlock = 0;
  for (size_t i = 0; i < x->n; i++) {
    upd_item *it = &x->items[i];
    vars[nlock++] = it->v;
    for (size_t k = 0; it->opt && k < it->opt->nslots; k++)
      vars[nlock++] = it->slots[k];
  }
  /* each variable (and slot) once: each item's version after the apply
   * is then its variable's + 1, which an early answer can tell */
  bool distinct = ps_store_lock_set(vars, nlock, true);
  int rc = 0;
  size_t nsim = 0;
  for (size_t i = 0; i < nlock && rc == 0; i++)
    rc = ps_var_gone(s->store, vars[i], st);
  bool dup = false; /* replication: this (client_id, seq) was applied already */
  uint64_t cid = x->req->client_id, seq = x->req->seq;
  /* a synchronous contribution keeps no dedup record: it only joins the
   * accumulator, which is not replicated, so its retry after a failover
   * must accumulate again; the accumulator's stale-step rule drops a
   * retry of a step already applied (DESIGN.md "Replication") */
  for (size_t i = 0; i < x->n && cid != 0; i++)
    if (x->items[i].sync) cid = 0;
  if (rc == 0 && s->repl)
    rc = ps_svc_update_check_(s, vars, nlock, cid, seq, &dup, before, st);
  for (size_t i = 0; i < x->n && rc == 0 && dup; i++)
    x->items[i].version = x->items[i].v->version; /* answered, not applied */
  for (size_t i = 0; i < x->n && rc == 0 && !dup; i++) {
    upd_item *it = &x->items[i];
    sim *sm = sim_of(sims, &nsim, it->v);
    if (it->sync && !sm->init) {
      rc = ps_var_uninitialized(it->v->name, st);
      break;
    }
    if (it->opt) {
      sim *ss[PS_OPT_MAX_SLOTS] = {NULL};
      for (size_t k = 0; k < it->opt->nslots; k++)
        ss[k] = sim_of(sims, &nsim, it->slots[k]);
      rc = validate_optimizer(it, sm, ss, st);
    } else {
      rc = validate_update(it, sm, st);
    }
    if (rc == 0 && it->sync) rc = validate_sync(s, it, sm, st);
  }
  if (rc == 0 && !dup) rc = make_private_all(x, st);
  /* Unreplicated and asynchronous, the call is answered before the
   * arithmetic runs (update_after_reply), the locks still held: the
   * client goes on while the ps applies, and a read or update of these
   * variables, by it or anyone, waits for the locks and sees the effects. */
  if (rc == 0 && early && !s->repl && !x->any_sync && distinct) {
    for (size_t i = 0; i < x->n; i++)
      x->items[i].version = x->items[i].v->version + 1;
    rc = update_reply(x, st);
    if (rc == 0) {
      x->locked = vars;
      x->nlocked = nlock;
      ps_rpc_call_after_reply(c, update_after_reply);
      free(sims);
      return 0;
    }
  }
  ps_sync_waiter *done = NULL;
  size_t nrows = 0;
  for (size_t i = 0; i < x->n && rc == 0 && !dup; i++) {
    upd_item *it = &x->items[i];
    if (it->sync) {
      sync_update(s, it, &done);
    } else {
      apply_update(s->store, it);
      it->version = it->v->version;
      /* rows for scatters and the row-local sparse kernels (Adam's sparse
       * update decays every row of its slots: whole values) */
      bool local =
          it->idx && (!it->opt || it->u->op != PARAMSERVER__UPDATE_OP__APPLY_ADAM);
      for (size_t k = 0; rows && local && k <= (it->opt ? it->opt->nslots : 0); k++)
        rows[nrows++] = (ps_svc_rows){k ? it->slots[k - 1] : it->v, it->idx,
                                      it->u->index_dtype, it->u->num_indices};
    }
  }
  if (rc == 0 && s->repl) { /* to the backups; answered once they have it */
    x->held = done;
    done = NULL;
    atomic_fetch_add(&x->pending, 1);
    ps_status rst;
    int rr = ps_svc_update_effects_(s, vars, nlock, before, rows, nrows, cid, seq,
                                    update_replicated, x, &rst);
    ps_repl_stage_end(x->staging); /* its entries name their stages now */
    x->staging = NULL;
    if (rr != PS_RPC_PENDING) { /* nothing to wait for (or fenced) */
      if (rr != 0) x->err = rst;
      done = x->held;
      x->held = NULL;
      atomic_fetch_sub(&x->pending, 1);
    }
  }
  ps_store_unlock_set(vars, nlock);
  free(vars);
  free(sims);
  free(before);
  free(rows);
  if (rc != 0) return rc;
  /* answer the calls whose last waiting update this one completed (this
   * call still holds its own count, so it is not among them) */
  ps_svc_sync_release_all_(done);
  if (atomic_fetch_sub(&x->pending, 1) != 1) return PS_RPC_PENDING;
  return update_reply(x, st);
}

const ps_rpc_handler ps_svc_update_handlers[1] = {
    {"/paramserver.Ps/Update", update_header, update_data, update_free, NULL,
     PS_RPC_ACCESS_WORKER},
};
