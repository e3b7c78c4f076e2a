/* Updates: ps_client_update_many() and ps_client_update(), with
 * asynchronous scatter-adds of repeated ids summed before they are sent. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/tensor.h"

typedef struct upd_build {
  answer ans;
  Paramserver__UpdateRequest req;
  Paramserver__Update *us;
  Paramserver__Update **up;
  ps_rpc_segs segs;
  uint8_t *inline_buf;
  /* asynchronous scatter-adds whose ids repeat go with one summed row
   * per distinct id (@combine): the ids, the sums */
  ps_gather_dedup *dd;
  ps_tensor **sums;
  Paramserver__Initializer *fills; /* per update with a fill */
  size_t n;
  bool combined;
  ps_dedup_memo *memo;
} upd_build;

/* Sums the rows of repeated ids of scatter-add/sub update @u into @b's
 * slot @i; the ids and rows to send then are those of b->dd[i], b->sums[i]. */
static int upd_combine(upd_build *b, size_t i, const ps_update *u, ps_status *st) {
  if ((u->op != PS_SCATTER_ADD && u->op != PS_SCATTER_SUB) || u->replicas_to_aggregate)
    return 0; /* a synchronous accumulator keeps every row as today */
  int r = ps_gather_dedup_init_memo(b->memo, &b->dd[i], u->indices);
  if (r < 0) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  if (r > 0 && (b->sums[i] = ps_dedup_sum_rows(&b->dd[i], u->value)) == NULL)
    ps_gather_dedup_fini(&b->dd[i]); /* not a shape to sum: sent as it is */
  b->combined |= b->sums[i] != NULL;
  return 0;
}

static int upd_build_init(upd_build *b, ps_dedup_memo *memo, const ps_update *u, size_t n,
                          bool combine, ps_status *st) {
  memset(b, 0, sizeof *b);
  b->memo = memo;
  paramserver__update_request__init(&b->req);
  b->us = calloc(n + 1, sizeof *b->us);
  b->up = calloc(n + 1, sizeof *b->up);
  b->dd = calloc(n + 1, sizeof *b->dd);
  b->sums = calloc(n + 1, sizeof *b->sums);
  b->fills = calloc(n + 1, sizeof *b->fills);
  b->n = n;
  if (!b->us || !b->up || !b->dd || !b->sums || !b->fills)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < n; i++) {
    Paramserver__Update *p = &b->us[i];
    paramserver__update__init(p);
    const ps_update_fill *f = u[i].fill;
    if ((u[i].value == NULL && f == NULL) || u[i].name == NULL)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "update %zu has no %s", i,
                           u[i].name ? "value" : "name");
    if (f && (u[i].value || u[i].op != PS_ASSIGN || f->init == NULL))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "update of %s: a fill is an assign of an initializer, "
                           "without a value",
                           u[i].name);
    p->name = (char *)u[i].name;
    p->op = (Paramserver__UpdateOp)u[i].op;
    p->dtype = f ? f->dtype : u[i].value->dtype;
    p->shape = (int64_t *)(f ? f->shape.dim : u[i].value->shape.dim);
    p->n_shape = (size_t)(f ? f->shape.rank : u[i].value->shape.rank);
    if (f) {
      ps_cl_init_to_proto_(f->init, &b->fills[i]);
      if (f->full_name) b->fills[i].full_name = (char *)f->full_name;
      if (f->full_shape) {
        b->fills[i].full_shape = (int64_t *)f->full_shape->dim;
        b->fills[i].n_full_shape = (size_t)f->full_shape->rank;
      }
      b->fills[i].offset = f->offset;
      p->fill = &b->fills[i];
      p->fill_seed = f->seed;
      p->fill_draw = f->draw;
    }
    p->no_validate_shape = u[i].no_validate_shape;
    if ((u[i].nslots && u[i].slots == NULL) || (u[i].nhparams && u[i].hparams == NULL))
      return ps_status_set(st, PS_INVALID_ARGUMENT, "update of %s: %s is NULL", u[i].name,
                           u[i].nslots && !u[i].slots ? "slots" : "hparams");
    for (size_t k = 0; k < u[i].nslots; k++)
      if (u[i].slots[k] == NULL)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "update of %s: slot %zu has no name", u[i].name, k);
    p->slots = (char **)u[i].slots;
    p->n_slots = u[i].nslots;
    p->hparams = (double *)u[i].hparams;
    p->n_hparams = u[i].nhparams;
    p->use_nesterov = u[i].use_nesterov;
    p->replicas_to_aggregate = u[i].replicas_to_aggregate;
    p->sync_local_step = u[i].sync_local_step;
    bool scatter = u[i].op >= PS_SCATTER_UPDATE && u[i].op <= PS_SCATTER_SUB;
    if (scatter || (u[i].op >= PS_APPLY_GRADIENT_DESCENT && u[i].indices)) {
      const ps_tensor *ix = u[i].indices;
      if (ix == NULL || ix->shape.rank != 1 ||
          (ix->dtype != PS_DT_INT32 && ix->dtype != PS_DT_INT64))
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s %s: indices must be a 1-D int32 or int64 tensor",
                             scatter ? "scatter on" : "sparse gradient of", u[i].name);
      p->index_dtype = ix->dtype;
      p->num_indices = ix->shape.dim[0];
      if (combine && upd_combine(b, i, &u[i], st) != 0) return st->code;
      if (b->sums[i]) {
        ix = b->dd[i].uix;
        p->num_indices = b->dd[i].nu;
        p->shape = (int64_t *)b->sums[i]->shape.dim;
      }
      ps_rpc_segs_add(&b->segs, ps_tensor_data(ix), ps_tensor_nbytes(ix), ix->buf);
    }
    const ps_tensor *val = b->sums[i] ? b->sums[i] : u[i].value;
    if (val)
      ps_rpc_segs_add(&b->segs, ps_tensor_data(val), ps_tensor_nbytes(val), val->buf);
    b->up[i] = p;
  }
  b->req.updates = b->up;
  b->req.n_updates = n;
  if (b->segs.total > 0 && b->segs.total <= PS_RPC_INLINE_MAX) {
    /* Small updates: the bytes ride in the header, one message per call. */
    b->inline_buf = malloc(b->segs.total);
    if (b->inline_buf == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    size_t off = 0;
    for (size_t i = 0; i < b->segs.n; i++) {
      memcpy(b->inline_buf + off, b->segs.v[i].ptr, b->segs.v[i].len);
      off += b->segs.v[i].len;
    }
    b->req.inline_data.data = b->inline_buf;
    b->req.inline_data.len = off;
    ps_rpc_segs_fini(&b->segs);
  }
  return 0;
}

static void upd_build_fini(upd_build *b) {
  for (size_t i = 0; i < b->n && b->dd && b->sums; i++) {
    ps_gather_dedup_fini(&b->dd[i]);
    ps_tensor_destroy(b->sums[i]);
  }
  free(b->dd);
  free(b->sums);
  free(b->fills);
  free(b->us);
  free(b->up);
  free(b->inline_buf);
  ps_rpc_segs_fini(&b->segs);
}

/* Fills the updates' results (synchronous ones: stale or applied). */
int ps_cl_parse_update_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  ps_task_updates *t = user;
  Paramserver__UpdateResponse *r = paramserver__update_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_UPDATE, "the answer does not parse");
  int rc = 0;
  if (r->n_versions != t->n || (r->n_stale != 0 && r->n_stale != t->n) ||
      (r->n_sync_steps != 0 && r->n_sync_steps != t->n))
    rc = ps_cl_bad_answer_(
        st, M_UPDATE,
        "%zu versions, %zu stale flags and %zu steps for %zu updates (%s%s)",
        r->n_versions, r->n_stale, r->n_sync_steps, t->n, t->n ? t->updates[0].name : "",
        t->n > 1 ? ", ..." : "");
  for (size_t i = 0; rc == 0 && i < t->n; i++) {
    ps_update_result *res = t->updates[i].result;
    if (res == NULL) continue;
    res->version = r->versions[i];
    res->stale = i < r->n_stale && r->stale[i];
    res->sync_step = i < r->n_sync_steps ? r->sync_steps[i] : 0;
  }
  paramserver__update_response__free_unpacked(r, NULL);
  return rc;
}

/* Builds task @t's Update request into @b and @r; @combine: repeated ids
 * of asynchronous scatters go summed (upd_combine). */
static int upd_request(ps_client *c, ps_task_updates *t, upd_build *b, ps_rpc_req *r,
                       bool combine, ps_status *st) {
  int rc = upd_build_init(b, &c->memo, t->updates, t->n, combine, st);
  if (rc != 0) return rc;
  ps_cl_req_init_(c, r, t->task, M_UPDATE, &b->req.base, true, true);
  r->send = &b->segs;
  if (c->view) { /* replicated: a retry after a failover re-sends this pair */
    b->req.client_id = c->client_id;
    b->req.seq = atomic_fetch_add_explicit(&c->seq, 1, memory_order_relaxed) + 1;
  }
  ps_cl_answer_init_(c, t->task, r, &b->ans, ps_cl_parse_update_, t,
                     t->n ? t->updates[0].name : NULL);
  return 0;
}

int ps_client_update_many(ps_client *c, ps_task_updates *t, size_t n, ps_status *st) {
  upd_build *bs = calloc(n + 1, sizeof *bs);
  ps_rpc_req *reqs = calloc(n + 1, sizeof *reqs);
  int *tasks = calloc(n + 1, sizeof *tasks);
  int rc = 0;
  if (!bs || !reqs || !tasks) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    ps_status_clear(&t[i].st);
    if ((rc = ps_cl_check_task_(c, t[i].task, st)) != 0) goto out;
    if ((rc = upd_request(c, &t[i], &bs[i], &reqs[i], true, st)) != 0) goto out;
    tasks[i] = t[i].task;
  }
  ps_cl_run_reqs_(c, reqs, tasks, n, false);
  /* A task that refused a summed request with INVALID_ARGUMENT applied
   * nothing (its updates are atomic): send it again as the caller gave it,
   * so that the error names the caller's positions and shapes. */
  for (size_t i = 0; i < n; i++) {
    if (reqs[i].st.code != PS_INVALID_ARGUMENT || !bs[i].combined) continue;
    upd_build_fini(&bs[i]);
    if ((rc = upd_request(c, &t[i], &bs[i], &reqs[i], false, st)) != 0) goto out;
    ps_cl_run_reqs_(c, &reqs[i], &tasks[i], 1, false);
  }
  for (size_t i = 0; i < n; i++) {
    t[i].st = reqs[i].st;
    if (rc == 0 && reqs[i].st.code != PS_OK) {
      rc = reqs[i].st.code;
      if (st) *st = reqs[i].st;
    }
  }
out:
  if (bs)
    for (size_t i = 0; i < n; i++)
      upd_build_fini(&bs[i]);
  free(bs);
  free(reqs);
  free(tasks);
  return rc;
}

int ps_client_update(ps_client *c, int task, const ps_update *u, size_t n,
                     ps_status *st) {
  ps_task_updates t = {.task = task, .updates = u, .n = n};
  return ps_client_update_many(c, &t, 1, st);
}
