/* The service's side of replication (ps/repl.h): a request's Route
 * checked and its variables limited to its shard, and the answer of a
 * mutating request held until the shard's in-sync backups acknowledged
 * its effects.  Without a ps_repl (R = 1) every function here is one NULL
 * check, or is not called at all. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps.pb-c.h"
#include "repl_internal.h"
#include "service_internal.h"

void ps_service_set_repl(ps_service *svc, struct ps_repl *r) {
  svc->repl = r;
}

struct ps_repl *ps_service_repl(ps_service *svc) {
  return svc->repl;
}

int ps_svc_route_(ps_service *s, const Paramserver__Route *route, const char *method,
                  ps_status *st) {
  if (route == NULL) return 0;
  if (s->repl)
    return ps_repl_check_route(s->repl, route->shard, route->epoch, method, st);
  int own = ps_store_own_shard(s->store);
  if (route->shard != -1 && route->shard != own)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "%s: %s runs unreplicated and holds shard %d only, not shard %d",
                         method, s->task, own, route->shard);
  return 0;
}

int ps_svc_route_shard_(ps_service *s, const Paramserver__Route *route) {
  if (route == NULL || route->shard < 0) return -1;
  return s->repl ? route->shard : -1;
}

ps_var *ps_svc_find_(ps_service *s, int shard, const char *name, ps_status *st) {
  ps_var *v = ps_store_find(s->store, name, st);
  if (v && shard >= 0 && v->shard != shard) {
    ps_status_set(st, PS_NOT_FOUND, "variable %s does not exist in shard %d on %s", name,
                  shard, s->task);
    return NULL;
  }
  return v;
}

ps_var **ps_svc_list_(ps_service *s, int shard, size_t *n) {
  ps_var **vars = ps_store_list(s->store, n);
  if (vars == NULL || shard < 0) return vars;
  size_t k = 0;
  for (size_t i = 0; i < *n; i++)
    if (vars[i]->shard == shard) vars[k++] = vars[i];
  *n = k;
  return vars;
}

/* ---- holding an answer for the backups ---- */

typedef struct svc_wait {
  atomic_int pending; /* on_data + the acknowledgement */
  atomic_int refs;    /* the call + the acknowledgement */
  ps_rpc_call *call;
  int rc;
  ps_status st;
} svc_wait;

static void wait_unref(svc_wait *w) {
  if (atomic_fetch_sub(&w->refs, 1) == 1) free(w);
}

static void wait_done(void *arg, int rc, const ps_status *st) {
  svc_wait *w = arg;
  w->rc = rc;
  if (rc != 0) w->st = *st;
  if (atomic_fetch_sub(&w->pending, 1) == 1) ps_rpc_call_resume(w->call, w->rc, &w->st);
  wait_unref(w);
}

int ps_svc_commit_(ps_rpc_call *c, ps_repl_group *g, ps_status *st) {
  ps_service *s = ps_rpc_call_server_user(c);
  svc_wait *w = calloc(1, sizeof *w);
  if (w == NULL) {
    ps_repl_group_fini(g);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  atomic_init(&w->pending, 2);
  atomic_init(&w->refs, 2);
  w->call = c;
  ps_status_clear(&w->st);
  ps_rpc_call_set_ctx(c, w);
  int rc = ps_repl_commit(s->repl, g, wait_done, w, st);
  if (rc == PS_RPC_PENDING) return 0;
  ps_rpc_call_set_ctx(c, NULL);
  free(w);
  return rc;
}

int ps_svc_held_data_(ps_rpc_call *c, ps_status *st) {
  svc_wait *w = ps_rpc_call_ctx(c);
  if (w == NULL) return 0;
  if (atomic_fetch_sub(&w->pending, 1) != 1) return PS_RPC_PENDING;
  if (w->rc != 0) *st = w->st;
  return w->rc;
}

void ps_svc_held_free_(ps_rpc_call *c) {
  svc_wait *w = ps_rpc_call_ctx(c);
  if (w) wait_unref(w);
}

/* ---- Update ---- */

int ps_svc_update_check_(ps_service *s, ps_var *const *vars, size_t n, uint64_t cid,
                         uint64_t seq, bool *dup, int64_t *before, ps_status *st) {
  *dup = false;
  int rc = ps_repl_check_vars(s->repl, vars, n, "Update", st);
  if (rc == 0 && cid != 0)
    rc = ps_repl_dedup_check(s->repl, n ? vars[0]->shard : ps_store_own_shard(s->store),
                             cid, seq, dup, st);
  for (size_t i = 0; i < n; i++)
    before[i] = vars[i]->version;
  return rc;
}

typedef struct var_before {
  ps_var *v;
  int64_t before;
} var_before;

static int cmp_vb(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const var_before *)a)->v,
            y = (uintptr_t)((const var_before *)b)->v;
  return (x > y) - (x < y);
}

int ps_svc_update_effects_(ps_service *s, ps_var *const *vars, size_t n,
                           const int64_t *before, const ps_svc_rows *rows, size_t nrows,
                           uint64_t cid, uint64_t seq, ps_repl_done_fn fn, void *arg,
                           ps_status *st) {
  ps_repl_group g = {0};
  var_before *vb = malloc((n + 1) * sizeof *vb);
  if (vb == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < n; i++)
    vb[i] = (var_before){vars[i], before[i]};
  qsort(vb, n, sizeof *vb, cmp_vb);
  for (size_t i = 0; i < n; i++) {
    ps_var *v = vb[i].v;
    if ((i > 0 && vb[i - 1].v == v) || v->version == vb[i].before) continue;
    /* rows when exactly one scatter or sparse update changed it, once */
    const ps_svc_rows *only = NULL;
    int hits = 0;
    for (size_t k = 0; k < nrows; k++)
      if (rows[k].v == v) only = &rows[k], hits++;
    if (hits == 1 && v->buf && v->version == vb[i].before + 1)
      ps_repl_add_rows(&g, v, vb[i].before, only->idx, only->index_dtype, only->n);
    else
      ps_repl_add_value(&g, v);
  }
  free(vb);
  if (cid != 0) {
    int shard = n ? vars[0]->shard : ps_store_own_shard(s->store);
    ps_repl_dedup_record(s->repl, shard, cid, seq);
    ps_repl_add_dedup(&g, shard, cid, seq);
  }
  return ps_repl_commit(s->repl, &g, fn, arg, st);
}

bool *ps_svc_primary_shards_(ps_service *s, size_t *n) {
  *n = 0;
  if (s->repl == NULL) return NULL;
  size_t nt = (size_t)s->repl->ntasks;
  bool *p = calloc(nt + 1, sizeof *p);
  if (p == NULL) return NULL;
  ps_repl_primary_set(s->repl, p, nt);
  *n = nt;
  return p;
}

/* ---- waiting in a thread of its own (Restore) ---- */

static void blocking_done(void *arg, int rc, const ps_status *st) {
  ps_svc_blocking *b = arg;
  pthread_mutex_lock(&b->mu);
  b->rc = rc;
  if (rc != 0) b->st = *st;
  b->done = true;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

int ps_svc_blocking_commit_(ps_service *s, ps_repl_group *g, ps_svc_blocking *b,
                            ps_status *st) {
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  b->done = false;
  b->rc = 0;
  return ps_repl_commit(s->repl, g, blocking_done, b, st);
}

int ps_svc_blocking_wait_(ps_svc_blocking *b, int rc, ps_status *st) {
  if (rc == PS_RPC_PENDING) {
    pthread_mutex_lock(&b->mu);
    while (!b->done)
      pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    rc = b->rc;
    if (rc != 0) *st = b->st;
  }
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
  return rc;
}
