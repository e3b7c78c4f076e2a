/* The senders of replication (ps/repl_internal.h): one thread per backup
 * task, draining its FIFO in order, in batches of at most
 * PS_REPL_BATCH_ENTRIES entries or PS_REPL_BATCH_BYTES bytes, one
 * /paramserver.Ps/Replicate call per batch (bulk bytes as Chunks,
 * referencing the variables' buffers: zero copy).  When the backup
 * answered, the waits of the batch's groups count down; the last answer a
 * group needed calls its function (the request is answered).  A failed
 * call stops the sender (nothing more is sent; the waits are held) and
 * tells membership (callbacks.backup_failed), which removes the backup
 * from the view; ps_repl_set_view then releases the waits.
 *
 * State copy to a SYNCING backup: new entries of the shard already go to
 * its FIFO (set_view registered it); the sender walks the shard's
 * variables, for each under its read lock a CREATE and a VALUE entry, then
 * the dedup records, then DONE; when the backup acknowledged DONE,
 * callbacks.synced. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "ps.pb-c.h"
#include "repl_internal.h"

#define RETRY_BEHIND_MS 20
#define RETRY_BEHIND_MAX 250 /* 5 s for the backup's view to catch up */

static void *sender_main(void *arg);

ps_repl_sender *ps_repl_sender_get(ps_repl *r, int task) {
  for (ps_repl_sender *s = r->senders; s; s = s->next)
    if (s->task == task && !s->retired) return s;
  if (r->stopping) return NULL;
  ps_repl_sender *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  s->r = r;
  s->task = task;
  s->link_fd = -1;
  if ((s->caught_up = calloc((size_t)r->ntasks + 1, sizeof *s->caught_up)) == NULL) {
    free(s);
    return NULL;
  }
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->th, NULL, sender_main, s) != 0) {
    pthread_cond_destroy(&s->cv);
    free(s->caught_up);
    free(s);
    return NULL;
  }
  s->next = r->senders;
  r->senders = s;
  return s;
}

void ps_repl_sender_push(ps_repl_sender *snd, ps_repl_entry *e) {
  e->next = NULL;
  if (snd->tail)
    snd->tail->next = e;
  else
    snd->head = e;
  snd->tail = e;
  snd->lag_entries++;
  snd->lag_bytes += e->bytes;
  pthread_cond_signal(&snd->cv);
}

static void add_done(ps_repl_wait *w, ps_repl_wait ***done, size_t *n, size_t *cap) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    ps_repl_wait **d = realloc(*done, nc * sizeof *d);
    if (d == NULL) {
      PS_ERROR("replication: out of memory releasing an update");
      return;
    }
    *done = d;
    *cap = nc;
  }
  (*done)[(*n)++] = w;
}

/* @keep NULL: every wait is failed (each wait once: it is cut from every
 * entry that points at it, in every sender, by the caller's loop). */
void ps_repl_sender_drop(ps_repl_sender *snd, int (*keep)(ps_repl *, int, int),
                         ps_repl_wait ***done, size_t *ndone, size_t *cap) {
  ps_repl *r = snd->r;
  ps_repl_entry *lists[2] = {snd->inflight, snd->head};
  /* a group (one request's entries for this backup, its wait on the last)
   * may span shards: one this ps lost fails the whole request, even when
   * the wait's own entry is of a shard it keeps (a group never spans the
   * two lists: a batch ends at a group's end) */
  int glost = -1;
  for (int l = 0; l < 2; l++)
    for (ps_repl_entry *e = lists[l]; e; e = e->next) {
      int k = keep ? keep(r, e->shard, snd->task) : PS_REPL_DROP_ACK;
      if (k == PS_REPL_DROP_LOST) glost = e->shard;
      if (e->wait && glost >= 0) e->wait->lost = glost;
      if (e->group_end) glost = -1;
      if (k == PS_REPL_KEEP) continue;
      if (l == 0 && keep) e->dropped = true; /* (send_batch never reads it) */
      ps_repl_wait *w = e->wait;
      e->wait = NULL;
      if (w == NULL) continue;
      if (k == PS_REPL_DROP_LOST) w->lost = e->shard;
      if (keep == NULL) { /* failing all: each wait once */
        if (w->held) {    /* its request's thread answers it */
          w->failed = true;
          continue;
        }
        if (w->pending > 0) {
          w->pending = 0;
          add_done(w, done, ndone, cap);
        }
      } else if (--w->pending == 0) {
        add_done(w, done, ndone, cap);
      }
    }
  if (keep == NULL) return;
  /* queued entries of a shard it no longer backs are not sent */
  ps_repl_entry **pp = &snd->head, *prev = NULL;
  while (*pp) {
    ps_repl_entry *e = *pp;
    if (keep(r, e->shard, snd->task) != PS_REPL_KEEP) {
      *pp = e->next;
      snd->lag_entries--;
      snd->lag_bytes -= e->bytes;
      ps_repl_entry_free(e);
    } else {
      prev = e;
      pp = &e->next;
    }
  }
  snd->tail = prev;
}

void ps_repl_sender_copy(ps_repl_sender *snd, int s) {
  if (snd->ncopy == snd->capcopy) {
    size_t nc = snd->capcopy ? snd->capcopy * 2 : 4;
    int *c = realloc(snd->copy_shards, nc * sizeof *c);
    if (c == NULL) {
      PS_ERROR("replication: out of memory starting the copy of shard %d", s);
      return;
    }
    snd->copy_shards = c;
    snd->capcopy = nc;
  }
  snd->copy_shards[snd->ncopy++] = s;
  snd->caught_up[s] = false; /* a copy (again): waited for after its DONE */
  pthread_cond_signal(&snd->cv);
}

/* ---- one Replicate call ---- */

static int on_response(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                       ps_status *st) {
  (void)sink;
  Paramserver__ReplicateResponse *resp =
      paramserver__replicate_response__unpack(NULL, n, p);
  if (resp == NULL)
    return ps_status_set(st, PS_INTERNAL,
                         "Replicate: the backup's answer does not parse");
  *(int64_t *)user = resp->applied;
  paramserver__replicate_response__free_unpacked(resp, NULL);
  return 0;
}

static int send_batch(ps_repl_sender *snd, ps_repl_entry *batch, int64_t epoch,
                      ps_status *st) {
  ps_repl *r = snd->r;
  size_t n = 0;
  for (ps_repl_entry *e = batch; e; e = e->next)
    n++;
  Paramserver__ReplicateEntry *ents = calloc(n + 1, sizeof *ents);
  Paramserver__ReplicateEntry **ptrs = calloc(n + 1, sizeof *ptrs);
  Paramserver__VariableSpec **specs = calloc(n + 1, sizeof *specs);
  ps_rpc_segs segs = {0};
  int rc = 0;
  bool staged = false;
  if (ents == NULL || ptrs == NULL || specs == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Replicate: out of memory");
    goto out;
  }
  if (snd->ch == NULL &&
      (snd->ch = ps_rpc_channel_create_secure(r->addrs[snd->task], &r->sec)) == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Replicate: cannot open a channel");
    goto out;
  }
  /* the replication link when there is one (repl_link.c) */
  if (snd->link_fd < 0 && r->link_asked && ps_repl_now_ms() >= snd->link_retry_ms) {
    ps_status ls;
    int lrc = ps_repl_link_open(snd, epoch, &ls);
    if (lrc == PS_UNIMPLEMENTED) {
      /* a backup without a link (--no-repl-link), or one out of reach (a
       * firewall): asked again after 30 s, then less and less often */
      int64_t b = snd->link_backoff_ms ? snd->link_backoff_ms * 2 : 30000;
      snd->link_backoff_ms = b > 600000 ? 600000 : b;
      snd->link_retry_ms = ps_repl_now_ms() + snd->link_backoff_ms;
    } else if (lrc != 0) { /* it did not answer: in a second */
      snd->link_retry_ms = ps_repl_now_ms() + 1000;
    } else {
      snd->link_backoff_ms = 0;
    }
    if (lrc != 0)
      PS_DEBUG("replication to ps/%d without a link for now: %s", snd->task, ls.msg);
  }
  size_t i = 0;
  for (ps_repl_entry *e = batch; e; e = e->next, i++) {
    Paramserver__ReplicateEntry *m = &ents[i];
    paramserver__replicate_entry__init(m);
    m->kind = (Paramserver__ReplicateEntry__Kind)e->kind;
    m->shard = e->shard;
    m->name = e->name ? e->name : "";
    m->dtype = e->dtype;
    m->shape = e->shape.dim;
    m->n_shape = (size_t)e->shape.rank;
    m->version = e->version;
    m->base_version = e->base_version;
    m->var_epoch = e->var_epoch;
    m->initialized = e->initialized;
    m->index_dtype = e->index_dtype;
    m->num_indices = e->num_indices;
    m->client_id = e->client_id;
    m->seq = e->seq;
    if (e->spec && (specs[i] = paramserver__variable_spec__unpack(NULL, e->spec_len,
                                                                  e->spec)) == NULL) {
      rc = ps_status_set(st, PS_INTERNAL, "Replicate: a CREATE entry does not parse");
      goto out;
    }
    m->spec = specs[i];
    if (e->idx) {
      m->index_bytes = (int64_t)e->idx->size;
      if (ps_rpc_segs_add(&segs, e->idx->data, e->idx->size, e->idx) != 0) goto oom;
    }
    if (e->val) {
      m->value_bytes = (int64_t)e->val->size;
      /* cut-through: its bytes went before in STAGE frames */
      if (snd->link_fd >= 0 && (m->staged = ps_repl_stage_use(snd, e)) != 0)
        staged = true;
      if (!m->staged && ps_rpc_segs_add(&segs, e->val->data, e->val->size, e->val) != 0)
        goto oom;
    }
    ptrs[i] = m;
  }
  Paramserver__ReplicateRequest req = PARAMSERVER__REPLICATE_REQUEST__INIT;
  req.epoch = epoch;
  req.from_task = r->self;
  req.entries = ptrs;
  req.n_entries = n;
  if (staged && snd->link_fd < 0) { /* it broke while the rest was written */
    rc = ps_status_set(st, PS_UNAVAILABLE,
                       "Replicate to ps/%d: the replication link broke", snd->task);
    goto out;
  }
  if (snd->link_fd >= 0) {
    int64_t applied = 0;
    rc = ps_repl_link_send(snd, &req, &segs, &applied, st);
    goto out;
  }
  /* small batches travel in the header: one message */
  uint8_t *inl = NULL;
  if (segs.total > 0 && segs.total <= PS_RPC_INLINE_MAX &&
      (inl = malloc(segs.total)) != NULL) {
    size_t off = 0;
    for (size_t k = 0; k < segs.n; k++) {
      memcpy(inl + off, segs.v[k].ptr, segs.v[k].len);
      off += segs.v[k].len;
    }
    req.inline_data.data = inl;
    req.inline_data.len = off;
  }
  int64_t applied = 0;
  ps_rpc_req call = {
      .ch = snd->ch,
      .method = "/paramserver.Ps/Replicate",
      .request = &req.base,
      .send = inl ? NULL : &segs,
      .unary_response = true,
      .timeout_ms = 120000,
      .stall_timeout_ms = 3000,
      .probe_method = "/grpc.health.v1.Health/Check",
      .on_header = on_response,
      .user = &applied,
  };
  ps_rpc_run(&call, 1);
  free(inl);
  if (call.st.code != PS_OK) {
    *st = call.st;
    rc = st->code;
  }
  goto out;
oom:
  rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Replicate: out of memory");
out:
  ps_rpc_segs_fini(&segs);
  for (size_t k = 0; specs && k < n; k++)
    if (specs[k]) paramserver__variable_spec__free_unpacked(specs[k], NULL);
  free(specs);
  free(ptrs);
  free(ents);
  return rc;
}

/* ---- the state copy ---- */

/* Under nothing; takes var locks, then r->mu. */
static void copy_shard(ps_repl_sender *snd, int s) {
  ps_repl *r = snd->r;
  size_t n = 0;
  ps_var **vars = ps_store_list(r->store, &n);
  int64_t bytes = 0;
  size_t nv = 0;
  bool ok = vars != NULL;
  for (size_t i = 0; ok && i < n; i++) {
    ps_var *v = vars[i];
    if (v->shard != s) continue;
    ps_repl_group g = {0};
    pthread_rwlock_rdlock(&v->lock);
    if (!v->deleted) {
      ps_repl_add_create(&g, v);
      ps_repl_add_value(&g, v);
    }
    /* enqueued before the read lock is let go: an update of the variable
     * (which needs its write lock) is enqueued after this copy of it, never
     * before (r->mu is taken after variable locks) */
    pthread_mutex_lock(&r->mu);
    ok = !g.oom && !snd->retired && !r->stopping;
    for (size_t k = 0; ok && k < g.n; k++) {
      ps_repl_entry *c = ps_repl_entry_clone(&g.e[k]);
      if (c == NULL) {
        ok = false;
        break;
      }
      c->group_end = k + 1 == g.n; /* one variable: one group */
      bytes += c->bytes;
      ps_repl_sender_push(snd, c);
    }
    pthread_mutex_unlock(&r->mu);
    pthread_rwlock_unlock(&v->lock);
    nv++;
    ps_repl_group_fini(&g);
  }
  free(vars);
  uint64_t *cids = NULL, *seqs = NULL;
  size_t nd = ok ? ps_repl_dedup_dump(r, s, &cids, &seqs) : 0;
  ps_repl_group g = {0};
  for (size_t k = 0; k < nd; k++)
    ps_repl_add_dedup(&g, s, cids[k], seqs[k]);
  free(cids);
  free(seqs);
  ps_repl_entry done = {.kind = PS_REPL_DONE, .shard = s};
  pthread_mutex_lock(&r->mu);
  ok = ok && !g.oom;
  for (size_t k = 0; ok && k <= g.n; k++) {
    ps_repl_entry *c = ps_repl_entry_clone(k < g.n ? &g.e[k] : &done);
    if (c == NULL) {
      ok = false;
      break;
    }
    c->group_end = true;
    ps_repl_sender_push(snd, c);
  }
  if (!ok && !snd->retired && !r->stopping) snd->failed = true;
  pthread_mutex_unlock(&r->mu);
  ps_repl_group_fini(&g);
  if (ok)
    PS_INFO("replication: copying shard %d to ps/%d: %zu variable(s), %lld bytes queued",
            s, snd->task, nv, (long long)bytes);
  else
    PS_ERROR("replication: the copy of shard %d to ps/%d failed (out of memory)", s,
             snd->task);
}

/* ---- a request's batch sent on its own thread ---- */

/* Groups up to this many bulk bytes go inline: a larger one would hold
 * the request thread (and the other requests behind it) for long. */
#define INLINE_MAX_BYTES ((int64_t)256 << 10)

bool ps_repl_sender_inline_ok(const ps_repl_sender *snd) {
  if (snd->link_fd < 0 || snd->inflight || snd->head == NULL || snd->failed ||
      snd->stale || snd->retired || snd->inline_busy || snd->stage_io || snd->ncopy > 0)
    return false;
  int64_t bytes = 0;
  for (const ps_repl_entry *e = snd->head; e; e = e->next)
    bytes += e->bytes;
  return bytes <= INLINE_MAX_BYTES;
}

int ps_repl_send_inline(ps_repl *r, ps_repl_sender *const *snds, size_t n,
                        ps_repl_wait *w, ps_status *st) {
  int64_t epoch = r->view.epoch;
  for (size_t i = 0; i < n; i++) {
    ps_repl_sender *snd = snds[i];
    snd->inflight = snd->head;
    snd->head = snd->tail = NULL;
    snd->inline_busy = true;
  }
  w->held = true;
  w->pending++; /* this thread's: a view meanwhile cannot bring it to 0 */
  pthread_mutex_unlock(&r->mu);
  int rc[4];
  ps_status bst[4];
  for (size_t i = 0; i < n; i++) {
    ps_status_clear(&bst[i]);
    rc[i] = send_batch(snds[i], snds[i]->inflight, epoch, &bst[i]);
  }
  pthread_mutex_lock(&r->mu);
  ps_repl_entry *freed = NULL;
  for (size_t i = 0; i < n; i++) {
    ps_repl_sender *snd = snds[i];
    snd->inline_busy = false;
    if (rc[i] == 0) {
      /* acknowledged: as sender_main does, but the wait is counted here */
      ps_repl_entry *b = snd->inflight, *last = NULL;
      snd->inflight = NULL;
      for (ps_repl_entry *e = b; e; e = e->next) {
        snd->lag_entries--;
        snd->lag_bytes -= e->bytes;
        r->sent_bytes += e->bytes;
        /* (a view may have cut it meanwhile: e->wait NULL) */
        if (e->wait == w) w->pending--;
        last = e;
      }
      if (last) {
        last->next = freed;
        freed = b;
      }
    }
    /* else the batch stays in flight, and the sender thread handles the
     * error as if it had sent it (a view behind: again; stale: a pause;
     * else the backup reported failed) */
    if (rc[i] != 0) {
      snd->inline_rc = rc[i];
      snd->inline_st = bst[i];
    }
    pthread_cond_signal(&snd->cv);
  }
  w->held = false;
  w->pending--;
  int out = PS_RPC_PENDING;
  if (w->failed || r->fenced || r->stopping)
    out = ps_status_set(st, PS_UNAVAILABLE, "ps/%d is %s%s%s", r->self,
                        r->fenced ? "fenced" : "shutting down", r->fenced ? ": " : "",
                        r->fenced ? r->fence_reason : "");
  else if (w->lost >= 0 && w->pending == 0)
    out = ps_status_set(st, PS_UNAVAILABLE,
                        "ps/%d is no longer the primary of shard %d (view epoch %lld): "
                        "the update may not be on the new primary",
                        r->self, w->lost, (long long)r->view.epoch);
  else if (w->pending == 0)
    out = 0;
  /* (still under r->mu: the caller unlocks; on an error it cuts @w from
   * the entries still in flight) */
  while (freed) {
    ps_repl_entry *next = freed->next;
    ps_repl_entry_free(freed);
    freed = next;
  }
  return out;
}

/* ---- the thread ---- */

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void *sender_main(void *arg) {
  ps_repl_sender *snd = arg;
  ps_repl *r = snd->r;
  int behind = 0;
  /* test hook: tiny batches (tests/unit/test_repl.c: a group is never
   * split however small the limit) */
  size_t batch_entries = PS_REPL_BATCH_ENTRIES;
  const char *tb = getenv("PS_TEST_REPL_BATCH_ENTRIES");
  if (tb && atoi(tb) > 0) batch_entries = (size_t)atoi(tb);
  /* a backup refuses a batch over --max-tensor-bytes (as one request): no
   * more than that in one, unless one group is (it fits the limit: a
   * variable does) */
  int64_t batch_bytes = PS_REPL_BATCH_BYTES;
  if (r->max_batch_bytes > 0 && r->max_batch_bytes < batch_bytes)
    batch_bytes = r->max_batch_bytes;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    if (snd->inline_busy) { /* a request's thread has the link: wait for it */
      pthread_cond_wait(&snd->cv, &r->mu);
      continue;
    }
    if (r->stopping || snd->retired) break;
    if (ps_repl_stage_work(snd)) continue; /* forwarding comes first */
    if (snd->ncopy > 0 && !snd->failed) {
      int s = snd->copy_shards[0];
      memmove(snd->copy_shards, snd->copy_shards + 1, --snd->ncopy * sizeof(int));
      pthread_mutex_unlock(&r->mu);
      copy_shard(snd, s);
      pthread_mutex_lock(&r->mu);
      continue;
    }
    if (snd->failed || snd->stale || (snd->head == NULL && snd->inflight == NULL)) {
      pthread_cond_wait(&snd->cv, &r->mu);
      continue;
    }
    if (snd->inflight == NULL) { /* take the next batch */
      ps_repl_entry *last = NULL;
      size_t n = 0;
      int64_t bytes = 0;
      /* whole groups (a backup never holds half a request), weighed whole
       * before one joins (a state copy's group is a CREATE of no bytes,
       * then the VALUE), so no batch but a lone group passes the limits */
      for (ps_repl_entry *e = snd->head; e; e = last->next) {
        size_t gn = 0;
        int64_t gb = 0;
        ps_repl_entry *g = e;
        for (;; g = g->next) {
          gn++;
          gb += g->bytes;
          if (g->group_end || g->next == NULL) break;
        }
        if (n > 0 && (n + gn > batch_entries || bytes + gb > batch_bytes)) break;
        n += gn;
        bytes += gb;
        last = g;
      }
      snd->inflight = snd->head;
      snd->head = last->next;
      last->next = NULL;
      if (snd->head == NULL) snd->tail = NULL;
    }
    /* a batch re-sent after a view took some of its shards from this ps
     * (or the backup from them) leaves their entries out: sent under the
     * new epoch they would be refused and the backup reported failed */
    for (ps_repl_entry **pp = &snd->inflight; *pp;) {
      ps_repl_entry *e = *pp;
      if (!e->dropped) {
        pp = &e->next;
        continue;
      }
      *pp = e->next;
      snd->lag_entries--;
      snd->lag_bytes -= e->bytes;
      ps_repl_entry_free(e);
    }
    if (snd->inflight == NULL) {
      snd->inline_rc = 0;
      continue;
    }
    int64_t epoch = r->view.epoch;
    ps_status st;
    ps_status_clear(&st);
    int rc;
    if (snd->inline_rc != 0) {
      /* sent on a request's thread, which failed: handled as if sent here,
       * never sent again blindly (it may yet be applied on the backup) */
      rc = snd->inline_rc;
      st = snd->inline_st;
      snd->inline_rc = 0;
    } else {
      pthread_mutex_unlock(&r->mu);
      rc = send_batch(snd, snd->inflight, epoch, &st);
      pthread_mutex_lock(&r->mu);
    }
    if (rc == PS_ABORTED && behind++ < RETRY_BEHIND_MAX) { /* its view is behind */
      pthread_mutex_unlock(&r->mu);
      sleep_ms(RETRY_BEHIND_MS);
      pthread_mutex_lock(&r->mu);
      continue;
    }
    behind = 0;
    if (rc != 0) {
      bool tell = !snd->retired && !r->stopping;
      /* refused as stale (not the primary in the backup's newer view):
       * this ps is the one behind, not the backup; nothing is reported
       * and the sender waits for the next view (ps_repl_set_view clears
       * `stale`), which fails or releases what it holds */
      bool stale = rc == PS_FAILED_PRECONDITION && strstr(st.msg, "stale epoch");
      if (stale)
        snd->stale = true;
      else
        snd->failed = true;
      /* every shard it backs from here: a failed sender sends nothing
       * more, so each of them must drop it (not only the batch's first) */
      int *shards = calloc((size_t)r->ntasks + 1, sizeof *shards), ns = 0;
      for (int s = 0; shards && s < r->ntasks && r->view.shard; s++) {
        const ps_view_shard *vs = &r->view.shard[s];
        bool mine = vs->n > 0 && vs->task[0] == r->self, theirs = false;
        for (int k = 1; k < vs->n; k++)
          theirs |= vs->task[k] == snd->task;
        if (mine && theirs) shards[ns++] = s;
      }
      pthread_mutex_unlock(&r->mu);
      if (tell && stale) {
        PS_WARN("replication to ps/%d paused: it refused a batch as stale (%s): this "
                "ps's view is behind; waiting for the next view",
                snd->task, st.msg);
      } else if (tell) {
        PS_WARN("replication to ps/%d failed: %s", snd->task, st.msg);
        for (int i = 0; i < ns && r->cb.backup_failed; i++)
          r->cb.backup_failed(r->cb.arg, shards[i], snd->task, st.msg);
        if (shards == NULL && r->cb.backup_failed) /* out of memory: the first */
          r->cb.backup_failed(r->cb.arg, snd->inflight->shard, snd->task, st.msg);
      }
      free(shards);
      pthread_mutex_lock(&r->mu);
      continue;
    }
    /* acknowledged: count down the waits, note finished copies */
    ps_repl_wait **done = NULL;
    size_t ndone = 0, cap = 0;
    int *synced = NULL, nsynced = 0, capsynced = 0;
    ps_repl_entry *b = snd->inflight;
    snd->inflight = NULL;
    for (ps_repl_entry *e = b; e; e = e->next) {
      snd->lag_entries--;
      snd->lag_bytes -= e->bytes;
      r->sent_bytes += e->bytes;
      if (e->wait && --e->wait->pending == 0) {
        if (ndone == cap) {
          size_t nc = cap ? cap * 2 : 16;
          ps_repl_wait **d = realloc(done, nc * sizeof *d);
          if (d == NULL) continue; /* cannot happen often; the wait stays */
          done = d;
          cap = nc;
        }
        done[ndone++] = e->wait;
      }
      if (e->kind == PS_REPL_DONE && !snd->retired) {
        /* from now on its acknowledgements are waited for, before
         * membership marks it IN_SYNC: nothing acknowledged after its
         * copy can be missing on it once it is promotable */
        snd->caught_up[e->shard] = true;
        if (nsynced == capsynced) {
          int nc = capsynced ? capsynced * 2 : 4;
          int *p = realloc(synced, (size_t)nc * sizeof *p);
          if (p == NULL) {
            PS_ERROR("replication: out of memory noting the copy of shard %d done",
                     e->shard);
            continue;
          }
          synced = p;
          capsynced = nc;
        }
        synced[nsynced++] = e->shard;
      }
    }
    pthread_mutex_unlock(&r->mu);
    while (b) {
      ps_repl_entry *next = b->next;
      ps_repl_entry_free(b);
      b = next;
    }
    for (size_t i = 0; i < ndone; i++) {
      done[i]->fn(done[i]->arg, 0, NULL);
      free(done[i]);
    }
    free(done);
    for (int i = 0; i < nsynced; i++) {
      PS_INFO("replication: ps/%d holds shard %d (copy done)", snd->task, synced[i]);
      if (r->cb.synced) r->cb.synced(r->cb.arg, synced[i], snd->task);
    }
    free(synced);
    pthread_mutex_lock(&r->mu);
  }
  /* retired or stopping: what it still holds is never sent (its waits
   * were released by set_view, or failed by fence or destroy) */
  ps_repl_entry *lists[2] = {snd->inflight, snd->head};
  snd->inflight = snd->head = snd->tail = NULL;
  snd->lag_entries = snd->lag_bytes = 0;
  ps_repl_stage_release_all(snd);
  snd->exited = true; /* ps_repl_senders_reap may join it now */
  pthread_mutex_unlock(&r->mu);
  for (int l = 0; l < 2; l++)
    while (lists[l]) {
      ps_repl_entry *n = lists[l]->next;
      ps_repl_entry_free(lists[l]);
      lists[l] = n;
    }
  return NULL;
}

static void sender_free(ps_repl_sender *s) {
  pthread_join(s->th, NULL);
  ps_repl_entry *lists[2] = {s->inflight, s->head};
  for (int l = 0; l < 2; l++)
    while (lists[l]) {
      ps_repl_entry *n = lists[l]->next;
      ps_repl_entry_free(lists[l]);
      lists[l] = n;
    }
  ps_repl_link_close(s);
  if (s->ch) ps_rpc_channel_destroy(s->ch);
  pthread_cond_destroy(&s->cv);
  free(s->copy_shards);
  free(s->caught_up);
  free(s);
}

void ps_repl_senders_reap(ps_repl *r) {
  ps_repl_sender *gone = NULL;
  pthread_mutex_lock(&r->mu);
  for (ps_repl_sender **pp = &r->senders; *pp;) {
    ps_repl_sender *s = *pp;
    if (s->exited) {
      *pp = s->next;
      s->next = gone;
      gone = s;
    } else {
      pp = &s->next;
    }
  }
  pthread_mutex_unlock(&r->mu);
  while (gone) {
    ps_repl_sender *next = gone->next;
    sender_free(gone);
    gone = next;
  }
}

void ps_repl_senders_join(ps_repl *r) {
  pthread_mutex_lock(&r->mu);
  for (ps_repl_sender *s = r->senders; s; s = s->next)
    pthread_cond_signal(&s->cv);
  ps_repl_sender *all = r->senders;
  r->senders = NULL;
  pthread_mutex_unlock(&r->mu);
  while (all) {
    ps_repl_sender *next = all->next;
    sender_free(all);
    all = next;
  }
}
