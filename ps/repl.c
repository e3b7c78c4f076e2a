/* Replication's data plane (ps/repl.h, DESIGN.md "Replication"): the view
 * as this ps knows it, the checks of a request's Route, the dedup records
 * of Update, and the hooks through which the service enqueues the effects
 * of every mutating request into the FIFOs of the shard's backups
 * (repl_send.c sends them, repl_apply.c applies them on the backup). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "ps.pb-c.h"
#include "repl_internal.h"
#include "service_internal.h"

#define lost_holders_max PS_VIEW_MAX_REPLICAS

/* Own copies of the view's plumbing: the data plane needs no more of
 * common/view.c than the struct. */
static void view_free(ps_view *v) {
  free(v->shard);
  free(v->joined);
  memset(v, 0, sizeof *v);
}

static int view_copy(const ps_view *v, ps_view *out) {
  *out = *v;
  out->shard = calloc((size_t)v->ntasks + 1, sizeof *out->shard);
  out->joined = calloc((size_t)v->ntasks + 1, sizeof *out->joined);
  if (out->shard == NULL || out->joined == NULL) {
    view_free(out);
    return -1;
  }
  if (v->shard) memcpy(out->shard, v->shard, (size_t)v->ntasks * sizeof *out->shard);
  if (v->joined) memcpy(out->joined, v->joined, (size_t)v->ntasks * sizeof *out->joined);
  return 0;
}

/* "epoch 4: 0=[1*,2] 1=[2*] 2=[0*,1~]", as ps_view_describe. */
static void view_line(const ps_view *v, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "epoch %lld:", (long long)v->epoch);
  for (int s = 0; s < v->ntasks && k < n; s++) {
    k += (size_t)snprintf(buf + k, n - k, " %d=[", s);
    for (int i = 0; i < v->shard[s].n && k < n; i++)
      k += (size_t)snprintf(buf + k, n - k, "%s%d%s", i ? "," : "", v->shard[s].task[i],
                            i == 0                 ? "*"
                            : v->shard[s].state[i] ? "~"
                                                   : "");
    if (k < n) k += (size_t)snprintf(buf + k, n - k, "]");
  }
}

static int role_in(const ps_view *v, int s, int task) {
  if (v->shard == NULL || s < 0 || s >= v->ntasks) return -1;
  const ps_view_shard *sh = &v->shard[s];
  for (int i = 0; i < sh->n; i++)
    if (sh->task[i] == task) return i;
  return -1;
}

ps_repl *ps_repl_create(struct ps_service *svc, int self, int ntasks,
                        const char *const *addrs, const ps_rpc_channel_security *sec,
                        const ps_repl_callbacks *cb, ps_status *st) {
  if (ntasks < 1 || ntasks > PS_VIEW_MAX_TASKS || self < 0 || self >= ntasks) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "replication: task %d of %d ps tasks", self,
                  ntasks);
    return NULL;
  }
  ps_repl *r = calloc(1, sizeof *r);
  if (r == NULL) goto oom;
  r->svc = svc;
  r->store = svc->store;
  r->max_batch_bytes = (int64_t)svc->limits.max_tensor_bytes;
  r->self = self;
  r->ntasks = ntasks;
  r->link_fd = -1;
  if (cb) r->cb = *cb;
  if ((r->addrs = calloc((size_t)ntasks, sizeof *r->addrs)) == NULL) goto oom;
  for (int i = 0; i < ntasks; i++)
    if ((r->addrs[i] = strdup(addrs && addrs[i] ? addrs[i] : "")) == NULL) goto oom;
  if (sec) {
    r->sec = *sec;
    const char **f[5] = {&r->sec.ca_pem, &r->sec.cert_pem, &r->sec.key_pem,
                         &r->sec.server_name, &r->sec.token};
    for (int i = 0; i < 5; i++)
      if (*f[i]) {
        if ((r->sec_strs[i] = strdup(*f[i])) == NULL) goto oom;
        *f[i] = r->sec_strs[i];
      }
  }
  if ((r->last_holders = calloc((size_t)ntasks * (size_t)lost_holders_max + 1,
                                sizeof *r->last_holders)) == NULL)
    goto oom;
  if ((r->shard_applied = calloc((size_t)ntasks + 1, sizeof *r->shard_applied)) == NULL)
    goto oom;
  for (int i = 0; i < ntasks * lost_holders_max; i++)
    r->last_holders[i] = -1;
  pthread_mutex_init(&r->mu, NULL);
  pthread_mutex_init(&r->meta, NULL);
  pthread_mutex_init(&r->dmu, NULL);
  /* a view waits for the batch being applied, not for every later one */
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&r->apply_rw, &ra);
  pthread_rwlockattr_destroy(&ra);
  return r;
oom:
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "replication: out of memory");
  if (r) {
    for (int i = 0; r->addrs && i < ntasks; i++)
      free(r->addrs[i]);
    free(r->addrs);
    for (int i = 0; i < 5; i++)
      free(r->sec_strs[i]);
    free(r->last_holders);
    free(r);
  }
  return NULL;
}

/* Every wait of every sender's entries, each once, cut from the entries;
 * their functions are then called with @rc (outside the lock). */
static void fail_all_waits(ps_repl *r, int rc, const char *msg) {
  ps_repl_wait **w = NULL;
  size_t n = 0, cap = 0;
  pthread_mutex_lock(&r->mu);
  for (ps_repl_sender *s = r->senders; s; s = s->next)
    ps_repl_sender_drop(s, NULL, &w, &n, &cap);
  pthread_mutex_unlock(&r->mu);
  ps_status st;
  ps_status_set(&st, rc, "%s", msg);
  for (size_t i = 0; i < n; i++) {
    w[i]->fn(w[i]->arg, rc, &st);
    free(w[i]);
  }
  free(w);
}

void ps_repl_destroy(ps_repl *r) {
  if (r == NULL) return;
  char msg[128];
  snprintf(msg, sizeof msg, "ps/%d is shutting down", r->self);
  pthread_mutex_lock(&r->mu);
  r->stopping = true;
  pthread_mutex_unlock(&r->mu);
  fail_all_waits(r, PS_UNAVAILABLE, msg);
  ps_repl_stage_orphan_all(r);
  ps_repl_link_stop(r);
  /* a request still in ps_repl_commit (sending on its own thread: it ends
   * within the link's stall timeout) or holding meta */
  while (atomic_load(&r->users) > 0)
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  ps_repl_senders_join(r);
  view_free(&r->view);
  for (int i = 0; i < r->ntasks; i++)
    free(r->addrs[i]);
  free(r->addrs);
  for (int i = 0; i < 5; i++)
    free(r->sec_strs[i]);
  free(r->last_holders);
  free(r->shard_applied);
  free(r->clients);
  pthread_mutex_destroy(&r->mu);
  pthread_mutex_destroy(&r->meta);
  pthread_mutex_destroy(&r->dmu);
  pthread_rwlock_destroy(&r->apply_rw);
  free(r);
}

int64_t ps_repl_epoch(const ps_repl *r) {
  ps_repl *m = (ps_repl *)r;
  pthread_mutex_lock(&m->mu);
  int64_t e = m->view.epoch;
  pthread_mutex_unlock(&m->mu);
  return e;
}

/* ---- the view ---- */

/* Under r->mu: does backup @task still get shard @s's entries from here? */
static bool still_backup(ps_repl *r, int s, int task) {
  return role_in(&r->view, s, r->self) == 0 && role_in(&r->view, s, task) > 0;
}

/* Under r->mu: what becomes of an entry of shard @s queued for @task. */
static int keep_entry(ps_repl *r, int s, int task) {
  if (role_in(&r->view, s, r->self) != 0) return PS_REPL_DROP_LOST;
  return role_in(&r->view, s, task) > 0 ? PS_REPL_KEEP : PS_REPL_DROP_ACK;
}

/* Drops every variable of shard @s (a copy this ps is about to receive
 * afresh, or one of a shard it no longer holds); @why for the log. */
static void drop_shard(ps_repl *r, int s, const char *why) {
  size_t n = 0, k = 0;
  ps_var **vars = ps_store_list(r->store, &n);
  char **names = calloc(n + 1, sizeof *names);
  if (vars == NULL || names == NULL) {
    PS_ERROR("replication: out of memory dropping the old copy of shard %d", s);
    free(vars);
    free(names);
    return;
  }
  for (size_t i = 0; i < n; i++)
    if (vars[i]->shard == s) names[k++] = vars[i]->name;
  ps_var **gone = NULL;
  size_t ngone = 0;
  ps_status st;
  if (k > 0 && ps_store_remove_in(r->store, s, names, k, PS_REMOVE_MISSING_OK, &gone,
                                  &ngone, NULL, &st) == 0) {
    for (size_t i = 0; i < ngone; i++) {
      pthread_rwlock_wrlock(&gone[i]->lock);
      ps_var_mark_deleted(r->store, gone[i]);
      pthread_rwlock_unlock(&gone[i]->lock);
    }
    PS_INFO("replication: dropped %zu variable(s) of shard %d (%s)", ngone, s, why);
    free(gone);
  }
  free(names);
  free(vars);
}

void ps_repl_set_view(ps_repl *r, const ps_view *v) {
  ps_view nv = {0};
  if (v == NULL || v->ntasks != r->ntasks) {
    PS_ERROR("replication: a view of %d tasks ignored (this job has %d)",
             v ? v->ntasks : -1, r->ntasks);
    return;
  }
  for (int s = 0; v->shard && s < v->ntasks; s++) {
    bool ok = v->shard[s].n >= 0 && v->shard[s].n <= PS_VIEW_MAX_REPLICAS;
    for (int i = 0; ok && i < v->shard[s].n; i++)
      ok = v->shard[s].task[i] >= 0 && v->shard[s].task[i] < r->ntasks;
    if (!ok) {
      PS_ERROR("replication: view epoch %lld ignored: shard %d lists a task outside "
               "ps/0..ps/%d",
               (long long)v->epoch, s, r->ntasks - 1);
      return;
    }
  }
  if (v->shard == NULL || view_copy(v, &nv) != 0) {
    PS_ERROR("replication: out of memory taking view epoch %lld", (long long)v->epoch);
    return;
  }
  /* no Replicate batch checked under the old view applies under this one */
  pthread_rwlock_wrlock(&r->apply_rw);
  pthread_mutex_lock(&r->mu);
  bool newer = nv.epoch > r->view.epoch;
  /* shards where this ps is newly SYNCING: its old copy goes first */
  unsigned char *drop = calloc((size_t)r->ntasks, sizeof *drop); /* 1 copy, 2 left */
  for (int s = 0; newer && drop && s < r->ntasks; s++) {
    int i = role_in(&nv, s, r->self), j = role_in(&r->view, s, r->self);
    if (i > 0 && nv.shard[s].state[i] == PS_REPLICA_SYNCING &&
        (j < 0 || r->view.shard[s].state[j] != PS_REPLICA_SYNCING)) {
      drop[s] = 1;
      r->shard_applied[s] = 0; /* a copy starts */
    } else if (j > 0 && i < 0 && nv.shard[s].n > 0) {
      /* a backup dropped from a shard others still hold: its copy here is
       * stale (a rejoin copies it afresh), and its names would clash with
       * a variable made later in another shard.  (A shard left with no
       * replica keeps it; a primary taken out is fenced and keeps its
       * own.) */
      drop[s] = 2;
      r->shard_applied[s] = 0;
    }
  }
  pthread_mutex_unlock(&r->mu);
  if (!newer) {
    pthread_rwlock_unlock(&r->apply_rw);
    view_free(&nv);
    free(drop);
    return;
  }
  for (int s = 0; drop && s < r->ntasks; s++)
    if (drop[s]) {
      drop_shard(r, s,
                 drop[s] == 1 ? "before its copy arrives" : "no longer a replica of it");
      ps_repl_dedup_forget(r, s); /* the copy brings the primary's */
    }
  free(drop);
  ps_repl_wait **done = NULL;
  size_t ndone = 0, cap = 0;
  pthread_mutex_lock(&r->mu);
  if (nv.epoch <= r->view.epoch) { /* a newer one came meanwhile */
    pthread_mutex_unlock(&r->mu);
    pthread_rwlock_unlock(&r->apply_rw);
    view_free(&nv);
    return;
  }
  ps_view old = r->view;
  r->view = nv;
  for (int s = 0; s < r->ntasks; s++) {
    if (nv.shard[s].n > 0)
      for (int i = 0; i < lost_holders_max; i++)
        r->last_holders[s * lost_holders_max + i] =
            i < nv.shard[s].n ? nv.shard[s].task[i] : -1;
    bool was = role_in(&old, s, r->self) == 0, is = role_in(&nv, s, r->self) == 0;
    if (is && !was && old.epoch > 0) {
      r->failovers++;
      PS_WARN("ps/%d is now the primary of shard %d (view epoch %lld)", r->self, s,
              (long long)nv.epoch);
    }
    if (!is) continue;
    for (int i = 1; i < nv.shard[s].n; i++) {
      int t = nv.shard[s].task[i];
      ps_repl_sender *snd = ps_repl_sender_get(r, t);
      if (snd == NULL) {
        PS_ERROR("replication: out of memory starting the sender to ps/%d", t);
        continue;
      }
      int j = role_in(&old, s, t);
      bool was_backup = was && j > 0;
      if (nv.shard[s].state[i] == PS_REPLICA_SYNCING &&
          (!was_backup || old.shard[s].state[j] != PS_REPLICA_SYNCING))
        ps_repl_sender_copy(snd, s);
    }
  }
  /* entries for a backup the view no longer lists: their waits are done */
  for (ps_repl_sender *snd = r->senders; snd; snd = snd->next) {
    if (snd->retired) continue;
    ps_repl_sender_drop(snd, keep_entry, &done, &ndone, &cap);
    snd->stale = false; /* (it paused for a newer view: this one) */
    /* and stages the dropped entries named may be let go */
    pthread_cond_signal(&snd->cv);
    bool any = false;
    for (int s = 0; s < r->ntasks; s++)
      if (still_backup(r, s, snd->task))
        any = true;
      else
        snd->caught_up[s] = false; /* it left the shard: a new copy first */
    if (!any) {
      snd->retired = true;
      pthread_cond_signal(&snd->cv);
    }
  }
  char desc[512];
  view_line(&nv, desc, sizeof desc);
  pthread_mutex_unlock(&r->mu);
  pthread_rwlock_unlock(&r->apply_rw);
  view_free(&old);
  PS_INFO("replication view %s", desc);
  ps_repl_senders_reap(r); /* those an earlier view retired */
  /* a backup left: acknowledged; this ps lost the shard: never (the new
   * primary may not have the update) */
  for (size_t i = 0; i < ndone; i++) {
    ps_status st;
    int rc = 0;
    if (done[i]->lost >= 0)
      rc = ps_status_set(&st, PS_UNAVAILABLE,
                         "ps/%d is no longer the primary of shard %d (view epoch %lld): "
                         "the update may not be on the new primary",
                         r->self, done[i]->lost, (long long)nv.epoch);
    done[i]->fn(done[i]->arg, rc, rc ? &st : NULL);
    free(done[i]);
  }
  free(done);
}

void ps_repl_fence(ps_repl *r, const char *reason) {
  pthread_mutex_lock(&r->mu);
  bool was = r->fenced;
  if (!was) {
    r->fenced = true;
    snprintf(r->fence_reason, sizeof r->fence_reason, "%s", reason ? reason : "");
  }
  pthread_mutex_unlock(&r->mu);
  if (was) return;
  PS_WARN("ps/%d fenced: %s", r->self, reason ? reason : "");
  char msg[400];
  snprintf(msg, sizeof msg, "ps/%d is fenced: %s", r->self, reason ? reason : "");
  fail_all_waits(r, PS_UNAVAILABLE, msg);
}

bool ps_repl_fenced(const ps_repl *r, char *reason, size_t n) {
  ps_repl *m = (ps_repl *)r;
  pthread_mutex_lock(&m->mu);
  bool f = m->fenced;
  if (f && reason && n) snprintf(reason, n, "%s", m->fence_reason);
  pthread_mutex_unlock(&m->mu);
  return f;
}

void ps_repl_get_stats(ps_repl *r, ps_repl_stats *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&r->mu);
  out->epoch = r->view.epoch;
  for (int s = 0; r->view.shard && s < r->ntasks; s++)
    if (role_in(&r->view, s, r->self) == 0 && r->view.shard[s].n < r->view.replicas)
      out->replicas_missing += r->view.replicas - r->view.shard[s].n;
  out->failovers = r->failovers;
  for (ps_repl_sender *s = r->senders; s; s = s->next) {
    out->lag_entries += s->lag_entries;
    out->lag_bytes += s->lag_bytes;
  }
  out->sent_bytes = r->sent_bytes;
  out->applied_bytes = r->applied_bytes;
  out->cut_through_bytes = r->cut_through_bytes;
  pthread_mutex_unlock(&r->mu);
}

/* ---- routing checks ---- */

/* Under r->mu. */
static int check_shard_locked(ps_repl *r, int s, const char *method, ps_status *st) {
  if (r->fenced)
    return ps_status_set(st, PS_UNAVAILABLE, "%s: ps/%d is fenced: %s", method, r->self,
                         r->fence_reason);
  if (r->view.epoch == 0)
    return ps_status_set(st, PS_UNAVAILABLE,
                         "%s: ps/%d has no replication view yet (it is starting)", method,
                         r->self);
  if (s < 0 || s >= r->ntasks)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: shard %d does not exist (the job has %d ps tasks)", method,
                         s, r->ntasks);
  const ps_view_shard *sh = &r->view.shard[s];
  if (sh->n == 0) {
    char who[128] = "";
    size_t k = 0;
    for (int i = 0; i < lost_holders_max; i++) {
      int t = r->last_holders[s * lost_holders_max + i];
      if (t >= 0 && k < sizeof who)
        k += (size_t)snprintf(who + k, sizeof who - k, "%sps/%d", k ? ", " : "", t);
    }
    return ps_status_set(st, PS_UNAVAILABLE,
                         "shard %d is lost (its replicas %s are gone): restore from the "
                         "latest checkpoint",
                         s, k ? who : "(unknown)");
  }
  if (sh->task[0] != r->self)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "ps/%d is not the primary of shard %d (view epoch %lld; primary "
                         "ps/%d)",
                         r->self, s, (long long)r->view.epoch, sh->task[0]);
  return 0;
}

int ps_repl_check_route(ps_repl *r, int shard, int64_t epoch, const char *method,
                        ps_status *st) {
  pthread_mutex_lock(&r->mu);
  int rc = 0;
  if (shard == -1) {
    if (r->fenced)
      rc = ps_status_set(st, PS_UNAVAILABLE, "%s: ps/%d is fenced: %s", method, r->self,
                         r->fence_reason);
    else if (epoch != r->view.epoch)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "%s: stale view: the request was routed by view epoch %lld, "
                         "ps/%d is at epoch %lld",
                         method, (long long)epoch, r->self, (long long)r->view.epoch);
  } else {
    rc = check_shard_locked(r, shard, method, st);
    if (rc == 0 && epoch == 0 && r->view.epoch != 1)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "%s: stale view: the request was routed by the placement (epoch "
                         "0), ps/%d is at view epoch %lld",
                         method, r->self, (long long)r->view.epoch);
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int ps_repl_check_vars(ps_repl *r, ps_var *const *vars, size_t n, const char *method,
                       ps_status *st) {
  int rc = 0;
  pthread_mutex_lock(&r->mu);
  int last = -2;
  for (size_t i = 0; i < n && rc == 0; i++)
    if (vars[i]->shard != last) {
      last = vars[i]->shard;
      rc = check_shard_locked(r, last, method, st);
      if (rc != 0 && rc != PS_UNAVAILABLE)
        ps_status_prefix(st, "variable %s", vars[i]->name);
    }
  if (rc == 0 && n == 0 && r->fenced)
    rc = ps_status_set(st, PS_UNAVAILABLE, "%s: ps/%d is fenced: %s", method, r->self,
                       r->fence_reason);
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int64_t ps_repl_primary_set(ps_repl *r, bool *is_primary, size_t n) {
  pthread_mutex_lock(&r->mu);
  for (size_t s = 0; s < n; s++)
    is_primary[s] = (int)s < r->ntasks && role_in(&r->view, (int)s, r->self) == 0;
  int64_t e = r->view.epoch;
  pthread_mutex_unlock(&r->mu);
  return e;
}

static int commit(ps_repl *r, ps_repl_group *g, ps_repl_done_fn fn, void *arg,
                  ps_status *st);

int ps_repl_commit(ps_repl *r, ps_repl_group *g, ps_repl_done_fn fn, void *arg,
                   ps_status *st) {
  atomic_fetch_add(&r->users, 1);
  int rc = commit(r, g, fn, arg, st);
  atomic_fetch_sub(&r->users, 1);
  return rc;
}

static int commit(ps_repl *r, ps_repl_group *g, ps_repl_done_fn fn, void *arg,
                  ps_status *st) {
  int rc = 0;
  if (g->oom) {
    ps_repl_group_fini(g);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "replication: out of memory enqueuing an update's effects");
  }
  if (g->n == 0) return 0;
  ps_repl_wait *w = calloc(1, sizeof *w);
  if (w == NULL) {
    ps_repl_group_fini(g);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "replication: out of memory");
  }
  w->fn = fn;
  w->arg = arg;
  w->lost = -1;
  pthread_mutex_lock(&r->mu);
  if (r->fenced || r->stopping) {
    rc = ps_status_set(st, PS_UNAVAILABLE, "ps/%d is %s%s%s", r->self,
                       r->fenced ? "fenced" : "shutting down", r->fenced ? ": " : "",
                       r->fenced ? r->fence_reason : "");
    goto out;
  }
  /* each backup task of any shard in the group, once */
  uint64_t seen[PS_VIEW_MAX_TASKS / 64] = {0}; /* backup tasks served */
  ps_repl_sender *quick[4]; /* idle senders with a link: sent on this thread */
  size_t nquick = 0;
  bool slow = false;
  for (size_t i = 0; i < g->n && rc == 0; i++) {
    int s = g->e[i].shard;
    if (role_in(&r->view, s, r->self) != 0) continue;
    for (int k = 1; k < r->view.shard[s].n; k++) {
      int t = r->view.shard[s].task[k];
      if (seen[t / 64] >> (t % 64) & 1) continue;
      seen[t / 64] |= (uint64_t)1 << (t % 64);
      ps_repl_sender *snd = ps_repl_sender_get(r, t);
      if (snd == NULL) {
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "replication: out of memory");
        break;
      }
      bool idle = snd->head == NULL && snd->inflight == NULL;
      ps_repl_entry *last = NULL;
      bool waited = false;
      for (size_t j = 0; j < g->n; j++) {
        int s2 = g->e[j].shard, ti = role_in(&r->view, s2, t);
        if (ti <= 0 || role_in(&r->view, s2, r->self) != 0) continue;
        waited |= r->view.shard[s2].state[ti] == PS_REPLICA_IN_SYNC || snd->caught_up[s2];
        /* a failed sender sends nothing more: a stub (no value, no
         * reference to a buffer) holds the group's wait until the view
         * drops the backup */
        if (snd->failed && last) continue;
        ps_repl_entry stub = {.kind = PS_REPL_DEDUP, .shard = s2};
        ps_repl_entry *c = ps_repl_entry_clone(snd->failed ? &stub : &g->e[j]);
        if (c == NULL) {
          rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "replication: out of memory");
          break;
        }
        ps_repl_sender_push(snd, c);
        if (!snd->failed) ps_repl_stage_claim(snd, c);
        last = c;
      }
      if (last) last->group_end = true;
#ifdef PS_REPL_TEST_ACK_EARLY
      /* test only: acknowledged before the backups applied it */
      (void)last;
      (void)waited;
#else
      if (last && waited) {
        last->wait = w;
        w->pending++;
      }
#endif
      if (last && idle && waited && nquick < 4 && ps_repl_sender_inline_ok(snd))
        quick[nquick++] = snd;
      else if (last)
        slow = true;
    }
  }
  /* every backup idle and linked: one round trip on this thread, without
   * the hand-over to the sender threads and back (DESIGN.md "The
   * replication link") */
  if (rc == 0 && !slow && nquick > 0 && w->pending > 0) {
    rc = ps_repl_send_inline(r, quick, nquick, w, st);
    if (rc == PS_RPC_PENDING) rc = 0; /* (set again below) */
  }
out:
  if (rc == 0 && w->pending > 0) rc = PS_RPC_PENDING;
  if (rc != 0 && rc != PS_RPC_PENDING && w->pending > 0) {
    /* failed after some backups' entries got the wait: cut it from them
     * before it is freed (review r23 #9) */
    for (ps_repl_sender *snd = r->senders; snd; snd = snd->next) {
      ps_repl_entry *lists[2] = {snd->inflight, snd->head};
      for (int l = 0; l < 2; l++)
        for (ps_repl_entry *e = lists[l]; e; e = e->next)
          if (e->wait == w) e->wait = NULL;
    }
    w->pending = 0;
  }
  pthread_mutex_unlock(&r->mu);
  if (rc != PS_RPC_PENDING) free(w);
  ps_repl_group_fini(g);
  return rc;
}

void ps_repl_meta_lock(ps_repl *r) {
  atomic_fetch_add(&r->users, 1);
  pthread_mutex_lock(&r->meta);
}

void ps_repl_meta_unlock(ps_repl *r) {
  pthread_mutex_unlock(&r->meta);
  atomic_fetch_sub(&r->users, 1);
}

/* ---- Status ---- */

void ps_repl_status(ps_repl *r, Paramserver__StatusResponse *resp) {
  pthread_mutex_lock(&r->mu);
  resp->replicas = r->view.replicas;
  resp->view_epoch = r->view.epoch;
  resp->fenced = r->fenced;
  resp->fenced_reason = r->fenced ? strdup(r->fence_reason) : NULL;
  size_t k = 0;
  resp->shards = calloc((size_t)r->ntasks + 1, sizeof *resp->shards);
  for (int s = 0; resp->shards && r->view.shard && s < r->ntasks; s++) {
    int i = role_in(&r->view, s, r->self);
    if (i < 0) continue;
    Paramserver__ShardStatus *ss = calloc(1, sizeof *ss);
    if (ss == NULL) break;
    paramserver__shard_status__init(ss);
    ss->shard = s;
    ss->role = i == 0                                            ? "primary"
               : r->view.shard[s].state[i] == PS_REPLICA_SYNCING ? "syncing"
                                                                 : "backup";
    int nb = i == 0 ? r->view.shard[s].n - 1 : 0;
    if (i > 0 && r->view.shard[s].state[i] == PS_REPLICA_SYNCING)
      ss->synced_bytes = r->shard_applied[s];
    ss->lag_entries = calloc((size_t)nb + 1, sizeof *ss->lag_entries);
    ss->lag_bytes = calloc((size_t)nb + 1, sizeof *ss->lag_bytes);
    if (ss->lag_entries && ss->lag_bytes) {
      for (int b = 0; b < nb; b++)
        for (ps_repl_sender *snd = r->senders; snd; snd = snd->next)
          if (snd->task == r->view.shard[s].task[b + 1] && !snd->retired) {
            ss->lag_entries[b] = snd->lag_entries;
            ss->lag_bytes[b] = snd->lag_bytes;
          }
      ss->n_lag_entries = ss->n_lag_bytes = (size_t)nb;
    }
    resp->shards[k++] = ss;
  }
  resp->n_shards = k;
  pthread_mutex_unlock(&r->mu);
  /* sizes of the shards' variables */
  size_t n = 0;
  ps_var **vars = ps_store_list(r->store, &n);
  for (size_t j = 0; vars && j < n; j++)
    for (size_t q = 0; q < k; q++)
      if (resp->shards[q]->shard == vars[j]->shard) {
        size_t b = 0;
        ps_size_bytes(vars[j]->dtype, &vars[j]->shape, &b);
        resp->shards[q]->num_vars++;
        resp->shards[q]->bytes += (int64_t)b;
      }
  free(vars);
}

void ps_repl_status_free(Paramserver__StatusResponse *resp) {
  for (size_t i = 0; i < resp->n_shards; i++) {
    free(resp->shards[i]->lag_entries);
    free(resp->shards[i]->lag_bytes);
    free(resp->shards[i]);
  }
  free(resp->shards);
  free(resp->fenced_reason);
}
