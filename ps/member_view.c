/* The view's changes (ps/member_internal.h): read from etcd, decoded as
 * outside input, the next view computed by common/view.c's pure
 * transitions, written by compare-and-swap; applied to the data plane
 * (ps_repl_set_view) with a log line, fencing and the lost-shard error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "member_internal.h"

#define CAS_TRIES 50

int64_t ps_member_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ps_member_fence(ps_member *m, const char *reason) {
  pthread_mutex_lock(&m->mu);
  bool was = m->fenced;
  m->fenced = true;
  pthread_mutex_unlock(&m->mu);
  if (was) return;
  ps_repl_fence(m->repl, reason); /* logs "ps/N fenced: REASON" */
  if (m->on_fenced) m->on_fenced(m->arg);
}

/* Reads and decodes the view: 0 (*@have false when there is none), or -1
 * with @st set. */
static int read_view(ps_member *m, ps_view *v, bool *have, int64_t *mod_rev, int64_t *rev,
                     ps_status *st) {
  char *val = NULL;
  size_t len = 0;
  *have = false;
  if (ps_etcd_get(m->etcd, m->key_view, &val, &len, mod_rev, rev, st) != 0) return -1;
  if (val == NULL) return 0;
  int rc = ps_view_decode(val, len, m->ntasks, v, st);
  free(val);
  if (rc != 0) return -1;
  if (v->replicas != m->conf.replicas) {
    ps_view_free(v);
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "view %s has %d replicas per shard, but this ps runs with "
                         "--replicas %d",
                         m->key_view, v->replicas, m->conf.replicas);
  }
  *have = true;
  return 0;
}

static bool listed(const ps_view_shard *sh, int task) {
  for (int k = 0; k < sh->n; k++)
    if (sh->task[k] == task) return true;
  return false;
}

/* A view newer than the one applied: fencing, the data plane, the log. */
static void apply_view(ps_member *m, const ps_view *v) {
  char desc[4096], why[200] = "";
  pthread_mutex_lock(&m->mu);
  if (m->cur.epoch >= v->epoch) {
    pthread_mutex_unlock(&m->mu);
    return;
  }
  ps_view old = m->cur;
  ps_view copy = {0};
  ps_status st;
  ps_status_clear(&st);
  if (ps_view_copy(v, &copy, &st) != 0) {
    pthread_mutex_unlock(&m->mu);
    PS_ERROR("view epoch %lld: %s", (long long)v->epoch, st.msg);
    return;
  }
  m->cur = copy;
  int64_t detect = m->detect_ns;
  bool primary_moved = false, removed = false, gone = true;
  for (int s = 0; old.shard && s < m->ntasks; s++) {
    const ps_view_shard *o = &old.shard[s], *n = &v->shard[s];
    if (o->n > 0 && n->n > 0 && o->task[0] != n->task[0]) primary_moved = true;
    for (int k = 0; k < o->n; k++)
      removed |= !listed(n, o->task[k]);
    if (listed(n, m->detect_task)) gone = false;
    /* fenced when it lost a shard it was the primary of; a backup
     * dropped from a shard (its primary could not reach it) serves on and
     * rejoins that shard (ps_member_wants_rejoin) */
    bool was_primary = o->n > 0 && o->task[0] == m->self;
    bool is_primary = n->n > 0 && n->task[0] == m->self;
    if (why[0] == '\0' && was_primary && !is_primary && !m->leaving)
      snprintf(why, sizeof why, "view epoch %lld took shard %d from it",
               (long long)v->epoch, s);
  }
  /* The measurement ends with the view that takes the failed task out of
   * its last shard.  A view that only adds a replica (a join delivered
   * late), or drops the failed task from one shard as a backup its
   * primary could not reach (that view can come first: then the one that
   * moves its primaries is the failover), leaves it running. */
  bool ends = detect && (m->detect_task < 0 ? primary_moved || removed : gone);
  if (ends) {
    m->detect_ns = 0;
    m->detect_task = -1;
  }
  pthread_mutex_unlock(&m->mu);

  ps_view_describe(v, desc, sizeof desc);
  if (old.epoch && ends && primary_moved)
    PS_INFO("view %s (failover %.0f ms after the failure was detected)", desc,
            (double)(ps_member_now_ns() - detect) / 1e6);
  else
    PS_INFO("view %s", desc);
  if (why[0]) {
    ps_member_fence(m, why);
  } else {
    ps_repl_set_view(m->repl, v);
  }
  for (int s = 0; s < m->ntasks; s++) {
    const ps_view_shard *n = &v->shard[s];
    if (n->n == 0 && (old.shard == NULL || old.shard[s].n > 0)) {
      char who[256] = "";
      size_t off = 0;
      for (int k = 0; old.shard && k < old.shard[s].n && off < sizeof who; k++)
        off += (size_t)snprintf(who + off, sizeof who - off, "%sps/%d", k ? ", " : "",
                                old.shard[s].task[k]);
      /* every replica it had stopped cleanly (ps_view_leave): a job
       * shutting down, not a failure */
      bool stopped = old.shard != NULL && old.shard[s].n > 0;
      for (int k = 0; stopped && k < old.shard[s].n; k++)
        stopped = !v->joined[old.shard[s].task[k]];
      if (stopped)
        PS_INFO("shard %d ends: its last replica (%s) stopped cleanly; a job that goes "
                "on restores it from the latest checkpoint",
                s, who);
      else
        PS_ERROR("shard %d is lost (its replicas %s are gone): restore from the latest "
                 "checkpoint",
                 s, who[0] ? who : "?");
    }
    bool one = m->conf.replicas >= 2 && n->n == 1;
    if (one && !m->lone[s] && n->task[0] == m->self)
      PS_WARN("shard %d runs on one replica (ps/%d): one more failure loses it", s,
              m->self);
    m->lone[s] = one;
  }
  ps_view_free(&old);
}

void ps_member_end_detection(ps_member *m) {
  pthread_mutex_lock(&m->mu);
  m->detect_ns = 0;
  m->detect_task = -1;
  pthread_mutex_unlock(&m->mu);
}

void ps_member_refresh(ps_member *m) {
  ps_view v = {0};
  bool have;
  int64_t mod_rev, rev;
  ps_status st;
  ps_status_clear(&st);
  if (read_view(m, &v, &have, &mod_rev, &rev, &st) != 0) {
    PS_WARN("reading the view: %s", st.msg);
    pthread_mutex_lock(&m->mu);
    m->view_dirty = true; /* again */
    pthread_mutex_unlock(&m->mu);
    usleep(100000);
    return;
  }
  if (!have) {
    PS_ERROR("the view %s was deleted from etcd", m->key_view);
    return;
  }
  apply_view(m, &v);
  ps_view_free(&v);
}

int ps_member_transition(ps_member *m, int kind, int task, int shard) {
  const char *what = kind == PS_MEMBER_REMOVE   ? "remove"
                     : kind == PS_MEMBER_LEAVE  ? "leave"
                     : kind == PS_MEMBER_DROP   ? "drop"
                     : kind == PS_MEMBER_REJOIN ? "rejoin"
                                                : "in_sync";
  for (int i = 0; i < CAS_TRIES; i++) {
    ps_view v = {0}, out = {0};
    bool have, changed = false, ok = false;
    int64_t mod_rev, rev;
    int lost = 0;
    ps_status st;
    ps_status_clear(&st);
    if (read_view(m, &v, &have, &mod_rev, &rev, &st) != 0 || !have) {
      PS_WARN("view %s of ps/%d: %s", what, task, have ? st.msg : "no view in etcd");
      if (have) ps_view_free(&v);
      return -1;
    }
    int rc;
    const char *const *hosts = (const char *const *)m->hosts;
    if (kind == PS_MEMBER_REMOVE)
      rc = ps_view_remove_task(&v, task, &out, &changed, &lost, &st);
    else if (kind == PS_MEMBER_LEAVE)
      rc = ps_view_leave(&v, task, &out, &changed, &lost, &st);
    else if (kind == PS_MEMBER_DROP)
      rc = ps_view_drop_backup(&v, shard, task, &out, &changed, &st);
    else if (kind == PS_MEMBER_REJOIN)
      rc = ps_view_rejoin(&v, task, hosts, &out, &changed, &st);
    else if (shard >= 0 && shard < v.ntasks && v.shard[shard].n > 0 &&
             v.shard[shard].task[0] == m->self)
      rc = ps_view_in_sync(&v, shard, task, &out, &changed, &st);
    else /* the copy was made by a primary this ps no longer is: stale */
      rc = ps_view_copy(&v, &out, &st);
    if (rc != 0) {
      PS_ERROR("view %s of ps/%d: %s", what, task, st.msg);
      ps_view_free(&v);
      return -1;
    }
    if (!changed) { /* already in (another ps won) */
      /* a removal another ps made (or a leave): the detection is over */
      if (kind == PS_MEMBER_REMOVE) ps_member_end_detection(m);
      apply_view(m, &v);
      ps_view_free(&v);
      ps_view_free(&out);
      return 0;
    }
    char *enc = ps_view_encode(&out);
    rc = enc ? ps_etcd_cas(m->etcd, m->key_view, enc, strlen(enc), mod_rev, 0, &ok, NULL,
                           &st)
             : ps_status_set(&st, PS_RESOURCE_EXHAUSTED, "out of memory");
    free(enc);
    if (rc == 0 && ok) {
      if (kind == PS_MEMBER_REMOVE)
        PS_INFO("removed ps/%d from the view (epoch %lld -> %lld)", task,
                (long long)v.epoch, (long long)out.epoch);
      apply_view(m, &out);
    }
    ps_view_free(&v);
    ps_view_free(&out);
    if (rc != 0) {
      PS_WARN("view %s of ps/%d: %s", what, task, st.msg);
      return -1;
    }
    if (ok) return 0;
    /* lost the race: read again and recompute */
  }
  PS_WARN("view %s of ps/%d: lost %d compare-and-swaps in a row", what, task, CAS_TRIES);
  return -1;
}

int ps_member_join(ps_member *m, int64_t *rev, ps_status *st) {
  /* A restart of a task that is still listed: leave first, in a CAS of its
   * own, so that every primary sees a view without it before it comes back
   * SYNCING (a syncing backup that restarted would otherwise stay at the
   * same place, and its primary could finish a copy it missed the start of) */
  {
    ps_view v = {0};
    bool have = false, mine = false;
    int64_t mr, r;
    if (read_view(m, &v, &have, &mr, &r, st) != 0) return -1;
    for (int s = 0; have && s < v.ntasks; s++)
      mine |= listed(&v.shard[s], m->self);
    bool restart = have && v.joined[m->self] && mine;
    if (have) ps_view_free(&v);
    if (restart && ps_member_transition(m, PS_MEMBER_REMOVE, m->self, -1) != 0)
      return ps_status_set(
          st, PS_UNAVAILABLE,
          "ps/%d could not leave the view before rejoining it (etcd at %s)", m->self,
          m->conf.etcd);
  }
  for (int i = 0; i < CAS_TRIES; i++) {
    ps_view v = {0}, out = {0};
    bool have, changed = false, ok = false;
    int64_t mod_rev;
    if (read_view(m, &v, &have, &mod_rev, rev, st) != 0) return -1;
    if (!have) {
      if (ps_view_initial(m->ntasks, m->conf.replicas, (const char *const *)m->hosts, &v,
                          st) != 0)
        return -1;
      char *enc = ps_view_encode(&v);
      int rc =
          enc ? ps_etcd_cas(m->etcd, m->key_view, enc, strlen(enc), 0, 0, &ok, NULL, st)
              : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      free(enc);
      ps_view_free(&v);
      if (rc != 0) return -1;
      continue; /* read what is there now */
    }
    if (ps_view_join(&v, m->self, (const char *const *)m->hosts, &out, &changed, st) !=
        0) {
      ps_view_free(&v);
      return -1;
    }
    int rc = 0;
    if (changed) {
      char *enc = ps_view_encode(&out);
      rc = enc ? ps_etcd_cas(m->etcd, m->key_view, enc, strlen(enc), mod_rev, 0, &ok,
                             NULL, st)
               : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      free(enc);
    }
    if (rc == 0 && (ok || !changed)) {
      PS_INFO("joined the view of job %s in etcd at %s", m->conf.job, m->conf.etcd);
      apply_view(m, changed ? &out : &v);
    }
    ps_view_free(&v);
    ps_view_free(&out);
    if (rc != 0) return -1;
    if (ok || !changed) {
      if (ok) {
        /* the watch starts after this CAS: read the revision again */
        char *val = NULL;
        size_t len;
        int64_t mr;
        if (ps_etcd_get(m->etcd, m->key_view, &val, &len, &mr, rev, st) != 0) return -1;
        free(val);
        *rev = mr > *rev ? mr : *rev;
        /* a change after our CAS but before this read: the watch from
         * rev+1 misses it, so read once more from the worker */
        pthread_mutex_lock(&m->mu);
        m->view_dirty = true;
        pthread_mutex_unlock(&m->mu);
      }
      return 0;
    }
  }
  return ps_status_set(st, PS_UNAVAILABLE, "joining the view %s: lost %d races in a row",
                       m->key_view, CAS_TRIES);
}

bool ps_member_wants_rejoin(ps_member *m) {
  pthread_mutex_lock(&m->mu);
  bool want = false;
  if (!m->fenced && !m->leaving && m->cur.epoch > 0 && m->cur.shard) {
    for (int s = 0; s < m->ntasks && !want; s++) {
      int pl[PS_VIEW_MAX_REPLICAS];
      int k = ps_view_placement(m->ntasks, m->conf.replicas,
                                (const char *const *)m->hosts, s, pl);
      bool mine = false;
      for (int i = 0; i < k; i++)
        mine |= pl[i] == m->self;
      const ps_view_shard *sh = &m->cur.shard[s];
      want = mine && sh->n > 0 && sh->n < m->conf.replicas && !listed(sh, m->self);
    }
  }
  pthread_mutex_unlock(&m->mu);
  return want;
}
