/* The backup's side of replication: the Replicate handler (fencing by
 * epoch and primary, then the batch applied whole, in order, versions
 * copied so the replicas are bit-identical) and Digest (psctl verify: a
 * CRC32C per variable of one shard, from any replica).  ps/repl_internal.h
 * has the locks; proto/ps.proto ReplicateEntry the entries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "common/wire.h"
#include "ps.pb-c.h"
#include "repl_internal.h"
#include "service_internal.h"

struct ps_repl_batch {
  Paramserver__ReplicateRequest *req;
  ps_buf **val, **idx; /* per entry */
};

void ps_repl_batch_free(ps_repl_batch *x) {
  if (x == NULL) return;
  for (size_t i = 0; x->req && i < x->req->n_entries; i++) {
    if (x->val) ps_buf_unref(x->val[i]);
    if (x->idx) ps_buf_unref(x->idx[i]);
  }
  free(x->val);
  free(x->idx);
  if (x->req) paramserver__replicate_request__free_unpacked(x->req, NULL);
  free(x);
}

static void rep_free(ps_rpc_call *c) {
  ps_repl_batch_free(ps_rpc_call_ctx(c));
}

const ProtobufCBinaryData *ps_repl_batch_inline(const ps_repl_batch *x) {
  return &x->req->inline_data;
}

/* Entry @e's bulk sizes against its kind, dtype and shape. */
static int check_entry(ps_service *s, const Paramserver__ReplicateEntry *e, size_t i,
                       ps_status *st) {
  ps_shape sh;
  size_t vb = 0, row = 0;
  if (e->index_bytes < 0 || e->value_bytes < 0 || e->num_indices < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Replicate: entry %zu: negative size",
                         i);
  if (e->kind == PARAMSERVER__REPLICATE_ENTRY__KIND__CREATE) {
    if (e->spec == NULL || e->spec->name[0] == '\0')
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Replicate: entry %zu: CREATE of %s without a spec", i,
                           e->name);
    /* the variable it makes must fit the limits as a Create's would */
    if (ps_svc_shape_from_(&sh, e->spec->shape, e->spec->n_shape, e->spec->name, st) !=
            0 ||
        ps_svc_tensor_bytes_(s, e->spec->dtype, &sh, "Replicate", e->spec->name, &vb,
                             st) != 0)
      return st->code;
  }
  if (e->kind != PARAMSERVER__REPLICATE_ENTRY__KIND__VALUE &&
      e->kind != PARAMSERVER__REPLICATE_ENTRY__KIND__ROWS) {
    if (e->index_bytes || e->value_bytes)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Replicate: entry %zu carries bytes its kind has none of", i);
    return 0;
  }
  int rc = ps_svc_shape_from_(&sh, e->shape, e->n_shape, e->name, st);
  if (rc == 0) rc = ps_svc_tensor_bytes_(s, e->dtype, &sh, "Replicate", e->name, &vb, st);
  if (rc != 0) return rc;
  if (e->kind == PARAMSERVER__REPLICATE_ENTRY__KIND__VALUE) {
    if ((size_t)e->value_bytes != (e->initialized ? vb : 0) || e->index_bytes)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Replicate: VALUE of %s has %lld bytes, its shape needs %zu",
                           e->name, (long long)e->value_bytes, e->initialized ? vb : 0);
    return 0;
  }
  size_t isz = ps_dtype_size(e->index_dtype), ib = 0, rb = 0;
  if (sh.rank < 1 || (e->index_dtype != PS_DT_INT32 && e->index_dtype != PS_DT_INT64))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Replicate: ROWS of %s: bad rows",
                         e->name);
  row = sh.dim[0] ? vb / (size_t)sh.dim[0] : 0;
  if (ps_size_mul((size_t)e->num_indices, isz, &ib) != 0 ||
      ps_size_mul((size_t)e->num_indices, row, &rb) != 0 ||
      (size_t)e->index_bytes != ib || (size_t)e->value_bytes != rb)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Replicate: ROWS of %s: %lld index and %lld value bytes do not "
                         "match %lld rows",
                         e->name, (long long)e->index_bytes, (long long)e->value_bytes,
                         (long long)e->num_indices);
  return 0;
}

int ps_repl_batch_decode(ps_service *s, const uint8_t *p, size_t n, ps_repl_batch **out,
                         ps_rpc_segs *sink, ps_status *st) {
  *out = NULL;
  int rc = ps_wire_check_strings(&paramserver__replicate_request__descriptor, p, n,
                                 "Replicate", st);
  if (rc != 0) return rc;
  ps_repl_batch *x = calloc(1, sizeof *x);
  if (x == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  *out = x;
  if ((x->req = paramserver__replicate_request__unpack(NULL, n, p)) == NULL)
    return ps_svc_bad_request_(st, "Replicate");
  size_t ne = x->req->n_entries;
  x->val = calloc(ne + 1, sizeof *x->val);
  x->idx = calloc(ne + 1, sizeof *x->idx);
  if (x->val == NULL || x->idx == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  size_t staged = 0;
  for (size_t i = 0; i < ne && rc == 0; i++) {
    Paramserver__ReplicateEntry *e = x->req->entries[i];
    if ((rc = check_entry(s, e, i, st)) != 0) break;
    if (e->index_bytes &&
        ((rc = ps_svc_add_staged_(s, &staged, (size_t)e->index_bytes, "Replicate", st)) !=
             0 ||
         (x->idx[i] = ps_buf_create((size_t)e->index_bytes, false)) == NULL ||
         ps_rpc_segs_add(sink, x->idx[i]->data, x->idx[i]->size, NULL) != 0))
      rc = rc ? rc : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Replicate: out of memory");
    if (rc == 0 && e->staged &&
        (e->kind != PARAMSERVER__REPLICATE_ENTRY__KIND__VALUE || e->value_bytes == 0))
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Replicate: entry %zu (%s) names stage %llu but is no value", i,
                         e->name, (unsigned long long)e->staged);
    if (rc == 0 && e->value_bytes && !e->staged &&
        ((rc = ps_svc_add_staged_(s, &staged, (size_t)e->value_bytes, "Replicate", st)) !=
             0 ||
         (x->val[i] = ps_buf_create((size_t)e->value_bytes, false)) == NULL ||
         ps_rpc_segs_add(sink, x->val[i]->data, x->val[i]->size, NULL) != 0))
      rc = rc ? rc : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Replicate: out of memory");
  }
  return rc;
}

int ps_repl_batch_take_staged(ps_repl_batch *x, ps_link_stages *t, ps_status *st) {
  for (size_t i = 0; i < x->req->n_entries; i++) {
    const Paramserver__ReplicateEntry *e = x->req->entries[i];
    if (e->staged == 0) continue;
    if (t == NULL)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Replicate: entry %zu (%s) names stage %llu: staged bytes "
                           "come only over the replication link",
                           i, e->name, (unsigned long long)e->staged);
    if ((x->val[i] = ps_link_stages_take(t, e->staged, (size_t)e->value_bytes)) == NULL)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "replication link: entry %zu (%s) names stage %llu, which did "
                           "not come whole with %lld bytes",
                           i, e->name, (unsigned long long)e->staged,
                           (long long)e->value_bytes);
  }
  return 0;
}

static int rep_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_repl_batch *x = NULL;
  ps_rpc_segs sink = {0};
  int rc = ps_repl_batch_decode(ps_svc_of_(c), p, n, &x, &sink, st);
  if (rc == 0) rc = ps_repl_batch_take_staged(x, NULL, st);
  ps_rpc_call_set_ctx(c, x);
  if (x == NULL || x->req == NULL) {
    ps_rpc_segs_fini(&sink);
    return rc;
  }
  return ps_svc_expect_(c, rc, &x->req->inline_data, &sink, "Replicate", "entries", st);
}

/* Fencing: every entry's shard has the sender as its primary in this ps's
 * view, at an epoch not below the shard's since, and this ps as a backup. */
static int rep_check(ps_repl *r, const Paramserver__ReplicateRequest *q, ps_status *st) {
  int rc = 0;
  pthread_mutex_lock(&r->mu);
  if (r->fenced)
    rc = ps_status_set(st, PS_UNAVAILABLE, "Replicate: ps/%d is fenced: %s", r->self,
                       r->fence_reason);
  else if (q->epoch > r->view.epoch)
    rc = ps_status_set(st, PS_ABORTED,
                       "Replicate: the view of ps/%d (epoch %lld) is behind the sender's "
                       "(epoch %lld): retry",
                       r->self, (long long)r->view.epoch, (long long)q->epoch);
  for (size_t i = 0; i < q->n_entries && rc == 0; i++) {
    int sh = q->entries[i]->shard;
    if (sh < 0 || sh >= r->ntasks) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "Replicate: shard %d does not exist",
                         sh);
      break;
    }
    const ps_view_shard *vs = &r->view.shard[sh];
    bool mine = false;
    for (int k = 1; k < vs->n; k++)
      mine |= vs->task[k] == r->self;
    if (vs->n == 0 || vs->task[0] != q->from_task || q->epoch < vs->since)
      rc = ps_status_set(
          st, PS_FAILED_PRECONDITION,
          "Replicate: stale epoch: ps/%d (epoch %lld) is not the primary of "
          "shard %d in the view of ps/%d (epoch %lld; primary ps/%d since "
          "epoch %lld)",
          q->from_task, (long long)q->epoch, sh, r->self, (long long)r->view.epoch,
          vs->n ? vs->task[0] : -1, (long long)vs->since);
    else if (!mine)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Replicate: ps/%d is not a backup of shard %d (view epoch %lld)",
                         r->self, sh, (long long)r->view.epoch);
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

/* The apply_* functions: 0, or an error in @st when the entry cannot be
 * applied (ignored on a SYNCING copy, a divergence on an in-sync one). */
/* @clash: the name is another shard's here, which no copy mends */
static int apply_create(ps_service *s, const Paramserver__ReplicateEntry *e, bool *clash,
                        ps_status *stp) {
  Paramserver__VariableSpec *v = e->spec;
  ps_status st;
  ps_shape shape, full;
  ps_init_spec init;
  const ps_init_spec *ip = NULL;
  const ps_shape *fs = NULL;
  const char *fn = NULL;
  int64_t off = 0;
  if (ps_svc_shape_from_(&shape, v->shape, v->n_shape, v->name, &st) != 0) goto bad;
  if (v->initializer) {
    if (ps_svc_init_from_proto_(v->initializer, v->name, v->dtype, &init, &st) != 0)
      goto bad;
    ip = &init;
    if (v->initializer->full_name[0]) fn = v->initializer->full_name;
    if (v->initializer->n_full_shape) {
      if (ps_svc_shape_from_(&full, v->initializer->full_shape,
                             v->initializer->n_full_shape, v->name, &st) != 0)
        goto bad;
      fs = &full;
    }
    off = v->initializer->offset;
  }
  ps_var *have = ps_store_lookup(s->store, v->name);
  if (have && have->shard != e->shard) { /* (a shard is fixed once made) */
    ps_status_set(
        &st, PS_ALREADY_EXISTS,
        "variable %s already exists in shard %d (on %s); with --replicas a "
        "variable name belongs to one shard: it cannot also be made in shard %d",
        v->name, have->shard, s->task, e->shard);
    *clash = true;
    goto bad;
  }
  bool created;
  if (ps_store_create_var_in(s->store, e->shard, v->name, (ps_dtype)v->dtype, &shape, ip,
                             fn, fs, off, &created, &st) == 0)
    return 0;
  /* (made for another shard since the look above: a clash too) */
  have = ps_store_lookup(s->store, v->name);
  if (have && have->shard != e->shard) *clash = true;
bad:
  *stp = st;
  return st.code ? st.code : PS_INTERNAL;
}

static void apply_delete(ps_service *s, const char *name, int shard) {
  char *names[1] = {(char *)name};
  ps_var **gone = NULL;
  size_t ngone = 0;
  ps_status st;
  /* (shard's own only: another shard's variable of that name is not this
   * delete's) */
  if (ps_store_remove_in(s->store, shard, names, 1, PS_REMOVE_MISSING_OK, &gone, &ngone,
                         NULL, &st) != 0) {
    PS_ERROR("Replicate: DELETE of %s: %s", name, st.msg);
    return;
  }
  for (size_t i = 0; i < ngone; i++) {
    pthread_rwlock_wrlock(&gone[i]->lock);
    ps_var_mark_deleted(s->store, gone[i]);
    pthread_rwlock_unlock(&gone[i]->lock);
  }
  free(gone);
}

static int apply_value(ps_service *s, const Paramserver__ReplicateEntry *e, ps_buf *val,
                       ps_buf *idx, bool *clash, ps_status *st) {
  ps_var *v = ps_store_lookup(s->store, e->name);
  if (v == NULL) /* on a copy: its CREATE comes with the state copy */
    return ps_status_set(st, PS_NOT_FOUND, "variable %s does not exist", e->name);
  ps_shape sh;
  int rc = 0;
  ps_svc_shape_from_(&sh, e->shape, e->n_shape, e->name, st); /* checked */
  /* the name is another shard's here: never this entry's to change (and
   * not waited for: that shard's own update may hold its lock while it
   * waits for this ps's acknowledgement).  A variable's shard is fixed. */
  if (v->shard != e->shard) {
    *clash = true;
    return ps_status_set(st, PS_ALREADY_EXISTS,
                         "variable %s is shard %d's on ps/%d, the entry is for shard %d",
                         e->name, v->shard, s->repl->self, e->shard);
  }
  pthread_rwlock_wrlock(&v->lock);
  if (v->deleted) {
    rc = ps_status_set(st, PS_NOT_FOUND, "variable %s was deleted", e->name);
    goto out;
  }

  if ((int)v->dtype != e->dtype) {
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "variable %s has dtype %d, the entry %d",
                       e->name, (int)v->dtype, e->dtype);
    goto out;
  }
  if (e->kind == PARAMSERVER__REPLICATE_ENTRY__KIND__VALUE) {
    if (e->initialized) ps_var_set_buf(s->store, v, val, &sh);
  } else {
    /* rows apply on the version they were taken after, only */
    if (v->buf == NULL || v->version != e->base_version ||
        !ps_shape_equal(&v->shape, &sh)) {
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "variable %s is at version %lld, the rows apply on version %lld",
                         e->name, (long long)v->version, (long long)e->base_version);
      goto out;
    }
    if ((rc = ps_var_make_private(v, st)) != 0) goto out;
    size_t rb = e->num_indices ? (size_t)e->value_bytes / (size_t)e->num_indices : 0;
    for (int64_t k = 0; k < e->num_indices; k++) {
      int64_t i = e->index_dtype == PS_DT_INT32 ? ((const int32_t *)idx->data)[k]
                                                : ((const int64_t *)idx->data)[k];
      if (i < 0 || i >= sh.dim[0]) continue;
      memcpy((uint8_t *)v->buf->data + (size_t)i * rb,
             (uint8_t *)val->data + (size_t)k * rb, rb);
    }
  }
  v->version = e->version;
  v->epoch = e->var_epoch;
out:
  pthread_rwlock_unlock(&v->lock);
  return rc;
}

/* Under apply_rw: is this ps IN_SYNC for shard @sh in its view? */
static bool in_sync_for(ps_repl *r, int sh) {
  pthread_mutex_lock(&r->mu);
  bool in = false;
  const ps_view_shard *vs = &r->view.shard[sh];
  for (int k = 1; k < vs->n; k++)
    if (vs->task[k] == r->self) in = vs->state[k] == PS_REPLICA_IN_SYNC;
  pthread_mutex_unlock(&r->mu);
  return in;
}

int ps_repl_batch_apply(ps_service *s, ps_repl_batch *x, int64_t *applied,
                        int64_t *epochp, ps_status *st) {
  ps_repl *r = s->repl;
  if (r == NULL) /* (the request was decoded and checked all the same) */
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Replicate: %s runs unreplicated (--replicas 1)", s->task);
  /* the view checked is the view the entries apply under (review r23 #4) */
  pthread_rwlock_rdlock(&r->apply_rw);
  int rc = rep_check(r, x->req, st);
  if (rc != 0) {
    pthread_rwlock_unlock(&r->apply_rw);
    return rc;
  }
  /* test hook: a slow backup (tests/unit/test_repl.c: an update is answered
   * only after its backup applied it) */
  const char *slow = getenv("PS_TEST_REPLICATE_DELAY_MS");
  if (slow && atoi(slow) > 0) usleep((useconds_t)atoi(slow) * 1000);
  int64_t bytes = 0;
  for (size_t i = 0; i < x->req->n_entries; i++) {
    Paramserver__ReplicateEntry *e = x->req->entries[i];
    bytes += e->value_bytes + e->index_bytes;
    int arc = 0;
    bool clash = false;
    ps_status est;
    ps_status_clear(&est);
    switch (e->kind) {
    case PARAMSERVER__REPLICATE_ENTRY__KIND__CREATE:
      arc = apply_create(s, e, &clash, &est);
      break;
    case PARAMSERVER__REPLICATE_ENTRY__KIND__DELETE:
      apply_delete(s, e->name, e->shard);
      break;
    case PARAMSERVER__REPLICATE_ENTRY__KIND__VALUE:
    case PARAMSERVER__REPLICATE_ENTRY__KIND__ROWS:
      arc = apply_value(s, e, x->val[i], x->idx[i], &clash, &est);
      break;
    case PARAMSERVER__REPLICATE_ENTRY__KIND__DEDUP:
      ps_repl_dedup_record(r, e->shard, e->client_id, e->seq);
      break;
    default:
      break;
    }
    /* a SYNCING copy ignores what it cannot apply yet (the copy brings
     * it); an in-sync replica that cannot has diverged: the primary
     * reports it failed and membership copies it afresh (review r23 #8).
     * A name clash (a CREATE, VALUE or ROWS entry of a name this ps holds
     * for another shard) fails a copy too: no copy would mend it. */
    const char *what = e->kind == PARAMSERVER__REPLICATE_ENTRY__KIND__CREATE && e->spec
                           ? e->spec->name
                           : e->name;
    if (arc != 0 && (clash || in_sync_for(r, e->shard))) {
      pthread_rwlock_unlock(&r->apply_rw);
      static const char *kinds[] = {"VALUE", "ROWS", "CREATE"};
      PS_ERROR("Replicate: %s of %s for shard %d: %s", kinds[e->kind], what, e->shard,
               est.msg);
      return ps_status_set(st, PS_DATA_LOSS,
                           "Replicate: ps/%d cannot apply the %s entry of %s for shard "
                           "%d, which it holds in sync: %s: the replica has diverged",
                           r->self, kinds[e->kind], what, e->shard, est.msg);
    }
    if (arc != 0 && e->kind == PARAMSERVER__REPLICATE_ENTRY__KIND__CREATE)
      PS_ERROR("Replicate: CREATE of %s: %s", what, est.msg);
  }
  pthread_rwlock_unlock(&r->apply_rw);
  pthread_mutex_lock(&r->mu);
  r->applied_bytes += bytes;
  for (size_t i = 0; i < x->req->n_entries; i++) {
    Paramserver__ReplicateEntry *e = x->req->entries[i];
    r->shard_applied[e->shard] += e->value_bytes + e->index_bytes; /* checked */
  }
  *epochp = r->view.epoch;
  pthread_mutex_unlock(&r->mu);
  *applied = (int64_t)x->req->n_entries;
  return 0;
}

static int rep_data(ps_rpc_call *c, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  Paramserver__ReplicateResponse resp = PARAMSERVER__REPLICATE_RESPONSE__INIT;
  int rc = ps_repl_batch_apply(s, ps_rpc_call_ctx(c), &resp.applied, &resp.epoch, st);
  if (rc != 0) return rc;
  /* the replication link's port and key, to a primary that asks
   * (repl_link.c listens; none with TLS or --no-repl-link) */
  ps_repl *r = s->repl;
  if (((ps_repl_batch *)ps_rpc_call_ctx(c))->req->open_link && r->link_fd >= 0) {
    resp.link_port = r->link_port;
    resp.link_key.data = r->link_key;
    resp.link_key.len = sizeof r->link_key;
  }
  ps_rpc_call_reply(c, &resp.base);
  return 0;
}

/* ---- Digest ---- */

static int digest_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  Paramserver__DigestRequest *req = paramserver__digest_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "Digest");
  int shard = req->shard;
  paramserver__digest_request__free_unpacked(req, NULL);
  const char *role = "primary";
  int64_t epoch = 0;
  if (s->repl) {
    ps_repl *r = s->repl;
    pthread_mutex_lock(&r->mu);
    epoch = r->view.epoch;
    int at = -1;
    if (shard >= 0 && shard < r->ntasks && r->view.shard)
      for (int k = 0; k < r->view.shard[shard].n; k++)
        if (r->view.shard[shard].task[k] == r->self) at = k;
    if (at > 0)
      role = r->view.shard[shard].state[at] == PS_REPLICA_SYNCING ? "syncing" : "backup";
    pthread_mutex_unlock(&r->mu);
    if (at < 0)
      return ps_status_set(st, PS_FAILED_PRECONDITION,
                           "Digest: ps/%d holds no replica of shard %d (view epoch %lld)",
                           r->self, shard, (long long)epoch);
  } else if (shard != ps_store_own_shard(s->store)) {
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Digest: %s holds shard %d only (it runs unreplicated), not %d",
                         s->task, ps_store_own_shard(s->store), shard);
  }
  size_t nv = 0, k = 0;
  ps_var **vars = ps_store_list(s->store, &nv);
  if (vars == NULL && nv)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < nv; i++)
    if (vars[i]->shard == shard) vars[k++] = vars[i];
  Paramserver__VarDigest *d = calloc(k + 1, sizeof *d);
  Paramserver__VarDigest **dp = calloc(k + 1, sizeof *dp);
  if (d == NULL || dp == NULL) {
    free(d);
    free(dp);
    free(vars);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  /* one moment: every variable of the shard read-locked at once */
  ps_store_lock_set(vars, k, false);
  size_t m = 0;
  for (size_t i = 0; i < k; i++) {
    ps_var *v = vars[i];
    if (v->deleted) continue;
    paramserver__var_digest__init(&d[m]);
    d[m].name = v->name;
    d[m].version = v->version;
    d[m].initialized = v->buf != NULL;
    if (v->buf) {
      d[m].crc32c = ps_crc32c(v->buf->data, v->buf->size);
      d[m].bytes = (int64_t)v->buf->size;
    }
    dp[m] = &d[m];
    m++;
  }
  Paramserver__DigestResponse resp = PARAMSERVER__DIGEST_RESPONSE__INIT;
  resp.epoch = epoch;
  resp.role = (char *)role;
  resp.vars = dp;
  resp.n_vars = m;
  ps_rpc_call_reply(c, &resp.base);
  ps_store_unlock_set(vars, k);
  free(d);
  free(dp);
  free(vars);
  return 0;
}

static int no_data(ps_rpc_call *c, ps_status *st) {
  (void)c;
  (void)st;
  return 0;
}

const ps_rpc_handler ps_repl_handlers[2] = {
    {"/paramserver.Ps/Replicate", rep_header, rep_data, rep_free, NULL,
     PS_RPC_ACCESS_REPLICA},
    {"/paramserver.Ps/Digest", digest_header, no_data, NULL, NULL, PS_RPC_ACCESS_WORKER},
};
