/* Membership of a replicated ps (member.h; DESIGN.md "Replication"):
 * the lease, the task key, the view in etcd and its transitions, the
 * slow failure path (a task key deleted when its lease expired), the
 * data plane's backup_failed and synced, and fencing.  Every etcd change
 * runs on one thread (view_main); the rest posts work to it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "member_internal.h"

#define CAS_TRIES 64

static bool listed(const ps_view *v, int task) {
  for (int s = 0; s < v->ntasks; s++)
    for (int i = 0; i < v->shard[s].n; i++)
      if (v->shard[s].task[i] == task) return true;
  return false;
}

static void wake(ps_member *m) {
  pthread_cond_signal(&m->cv);
}

void ps_member_post_remove(ps_member *m, int t, int64_t seen_ns, const char *why) {
  if (t < 0 || t >= m->ntasks || t == m->self) return;
  pthread_mutex_lock(&m->mu);
  if (m->remove_ns[t] == 0) {
    m->remove_ns[t] = seen_ns ? seen_ns : 1;
    snprintf(m->remove_why[t], sizeof m->remove_why[t], "%s", why);
  }
  wake(m);
  pthread_mutex_unlock(&m->mu);
}

/* ---- callbacks (other threads) ---- */

static void on_backup_failed(void *arg, int s, int task, const char *reason) {
  ps_member *m = arg;
  char why[160];
  snprintf(why, sizeof why, "replication of shard %d failed: %s", s, reason);
  ps_member_post_remove(m, task, ps_member_now_ns(), why);
}

static void on_synced(void *arg, int s, int task) {
  ps_member *m = arg;
  pthread_mutex_lock(&m->mu);
  if (m->ninsync == m->cap_insync) {
    size_t c = m->cap_insync ? m->cap_insync * 2 : 16;
    ps_member_insync *p = realloc(m->insync, c * sizeof *p);
    if (p == NULL) {
      pthread_mutex_unlock(&m->mu);
      PS_ERROR("%s: out of memory: ps/%d stays SYNCING in shard %d", m->name, task, s);
      return;
    }
    m->insync = p;
    m->cap_insync = c;
  }
  m->insync[m->ninsync++] = (ps_member_insync){s, task};
  wake(m);
  pthread_mutex_unlock(&m->mu);
}

ps_repl_callbacks ps_member_repl_callbacks(ps_member *m) {
  return (ps_repl_callbacks){
      .backup_failed = on_backup_failed, .synced = on_synced, .arg = m};
}

static void on_lease_lost(void *arg, const char *reason) {
  ps_member *m = arg;
  pthread_mutex_lock(&m->mu);
  m->lease_gone = true;
  if (!m->lease_lost) {
    m->lease_lost = true;
    snprintf(m->lost_reason, sizeof m->lost_reason, "its etcd lease is lost (%s)",
             reason);
  }
  wake(m);
  pthread_mutex_unlock(&m->mu);
}

static void on_view_event(void *arg, const char *key, const char *val, size_t len,
                          int64_t mod_rev, bool deleted) {
  (void)key, (void)val, (void)len, (void)mod_rev, (void)deleted;
  ps_member *m = arg;
  pthread_mutex_lock(&m->mu);
  m->view_dirty = true;
  wake(m);
  pthread_mutex_unlock(&m->mu);
}

static void on_task_event(void *arg, const char *key, const char *val, size_t len,
                          int64_t mod_rev, bool deleted) {
  (void)val, (void)len, (void)mod_rev;
  ps_member *m = arg;
  if (key == NULL) { /* compacted: re-read the view */
    on_view_event(arg, NULL, NULL, 0, 0, false);
    return;
  }
  size_t pl = strlen(m->prefix_tasks);
  if (strncmp(key, m->prefix_tasks, pl) != 0) return;
  char *end;
  errno = 0;
  long t = strtol(key + pl, &end, 10);
  if (errno || *end || end == key + pl || t < 0 || t >= m->ntasks) return;
  if ((int)t == m->self) {
    if (deleted) {
      pthread_mutex_lock(&m->mu);
      bool leaving = m->leaving;
      pthread_mutex_unlock(&m->mu);
      if (!leaving) on_lease_lost(m, "its task key was deleted");
    }
    return;
  }
  if (deleted) {
    char why[160];
    snprintf(why, sizeof why, "its task key %s was deleted (lease expired or revoked)",
             key);
    ps_member_post_remove(m, (int)t, ps_member_now_ns(), why);
  } else {
    /* it (re)started: a failure seen before belongs to its old process */
    pthread_mutex_lock(&m->mu);
    m->remove_ns[t] = 0;
    pthread_mutex_unlock(&m->mu);
  }
}

/* ---- the view thread ---- */

static void fence(ps_member *m, const char *reason) {
  if (m->fenced) return;
  m->fenced = true;
  pthread_mutex_lock(&m->mu);
  bool leaving = m->leaving;
  pthread_mutex_unlock(&m->mu);
  ps_repl_fence(m->repl, reason);
  if (leaving) {
    PS_INFO("%s left the view (shutting down)", m->name);
    return;
  }
  /* (ps_repl_fence logs "ps/N fenced: REASON") */
  if (m->on_fenced) m->on_fenced(m->arg, reason);
}

/* The tasks that held shard @s before it was lost, as "ps/1, ps/2". */
static void lost_tasks(ps_member *m, int s, char *buf, size_t n) {
  int tasks[PS_VIEW_MAX_REPLICAS], k = 0;
  if (m->have_view && m->view.shard[s].n > 0) {
    k = m->view.shard[s].n;
    memcpy(tasks, m->view.shard[s].task, (size_t)k * sizeof *tasks);
  } else {
    k = ps_view_placement(m->ntasks, m->conf.replicas, (const char *const *)m->hosts, s,
                          tasks);
  }
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < k && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%sps/%d", i ? ", " : "", tasks[i]);
}

/* Takes @nv (moved in); gives it to the data plane when it is newer. */
static void apply_view(ps_member *m, ps_view *nv, int64_t mod) {
  if (m->have_view && nv->epoch <= m->view.epoch) {
    if (nv->epoch == m->view.epoch) m->view_mod = mod;
    ps_view_free(nv);
    return;
  }
  for (int s = 0; s < nv->ntasks; s++) {
    const ps_view_shard *sh = &nv->shard[s];
    if (sh->n == 0 && !m->lost_logged[s]) {
      char who[96];
      lost_tasks(m, s, who, sizeof who);
      PS_ERROR("shard %d is lost (its replicas %s are gone): restore from the latest "
               "checkpoint",
               s, who);
      m->lost_logged[s] = true;
    }
    if (sh->n == 1 && nv->replicas >= 2 && sh->task[0] == m->self) {
      if (!m->degraded_logged[s])
        PS_WARN("shard %d runs on one replica (ps/%d) of %d: a failure of ps/%d loses it",
                s, m->self, nv->replicas, m->self);
      m->degraded_logged[s] = true;
    } else if (sh->n > 1) {
      m->degraded_logged[s] = false;
    }
  }
  bool now = listed(nv, m->self);
  char reason[160] = "";
  if (m->served && !now && nv->joined[m->self])
    snprintf(reason, sizeof reason, "removed from the view at epoch %lld",
             (long long)nv->epoch);
  m->served |= now;
  /* (the data plane logs the view: "replication view epoch ...") */
  ps_repl_set_view(m->repl, nv);
  /* the health checker's peers: joined tasks sharing a shard with this one */
  pthread_mutex_lock(&m->mu);
  for (int t = 0; t < m->ntasks; t++) {
    bool p = false;
    for (int s = 0; !p && t != m->self && nv->joined[t] && s < nv->ntasks; s++) {
      bool a = false, b = false;
      for (int i = 0; i < nv->shard[s].n; i++) {
        a |= nv->shard[s].task[i] == m->self;
        b |= nv->shard[s].task[i] == t;
      }
      p = a && b;
    }
    if (p && !m->peer[t]) m->peer_gen[t]++;
    m->peer[t] = p;
  }
  pthread_mutex_unlock(&m->mu);
  if (m->have_view) ps_view_free(&m->view);
  m->view = *nv;
  m->have_view = true;
  m->view_mod = mod;
  if (reason[0]) fence(m, reason);
}

/* Reads the view; 0 (nothing there: *@have false), or -1 logged. */
static int read_view(ps_member *m, ps_view *out, int64_t *mod, bool *have,
                     ps_status *st) {
  char *val = NULL;
  size_t len = 0;
  int64_t rev;
  *have = false;
  if (ps_etcd_get(m->e, m->key_view, &val, &len, mod, &rev, st) != 0) return -1;
  if (val == NULL) return 0;
  ps_status ds;
  ps_status_clear(&ds);
  int rc = ps_view_decode(val, len, m->ntasks, out, &ds);
  free(val);
  if (rc != 0) {
    ps_status_set(st, ds.code, "replication view at %s in etcd: %s", m->key_view, ds.msg);
    return -1;
  }
  *have = true;
  return 0;
}

/* Compare-and-swaps @nv in; 1 done (applied), 0 lost the race, -1
 * error (@st). */
static int cas_view(ps_member *m, ps_view *nv, int64_t expect, ps_status *st) {
  char *json = ps_view_encode(nv);
  if (json == NULL) {
    ps_view_free(nv);
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "view: out of memory");
    return -1;
  }
  bool ok = false;
  int64_t nm = 0;
  int rc = ps_etcd_cas(m->e, m->key_view, json, strlen(json), expect, 0, &ok, &nm, st);
  free(json);
  if (rc != 0 || !ok) {
    ps_view_free(nv);
    return rc != 0 ? -1 : 0;
  }
  apply_view(m, nv, nm);
  return 1;
}

/* Brings the view up to date from etcd. */
static int refresh(ps_member *m, ps_status *st) {
  ps_view v;
  int64_t mod;
  bool have;
  if (read_view(m, &v, &mod, &have, st) != 0) return -1;
  if (have) apply_view(m, &v, mod);
  return 0;
}

/* One pending removal; true when it needs another try. */
static bool do_remove(ps_member *m, int t, int64_t seen_ns, const char *why) {
  ps_status st;
  ps_status_clear(&st);
  if (!m->have_view || !listed(&m->view, t)) return false;
  ps_view nv;
  bool changed = false;
  int lost = 0;
  if (ps_view_remove_task(&m->view, t, &nv, &changed, &lost, &st) != 0) {
    PS_ERROR("%s: cannot remove ps/%d from the view: %s", m->name, t, st.msg);
    return false;
  }
  if (!changed) {
    ps_view_free(&nv);
    return false;
  }
  int rc = cas_view(m, &nv, m->view_mod, &st);
  if (rc < 0) {
    PS_WARN("%s: removing ps/%d (%s): %s; trying again", m->name, t, why, st.msg);
    return true;
  }
  if (rc == 0) return true; /* lost the race: re-read, recompute */
  double ms = (double)(ps_member_now_ns() - seen_ns) / 1e6;
  PS_INFO("ps/%d removed (%s): view epoch %lld committed %.1f ms after detection", t, why,
          (long long)m->view.epoch, ms);
  return false;
}

static bool do_insync(ps_member *m, int s, int t) {
  ps_status st;
  ps_status_clear(&st);
  if (!m->have_view) return true;
  ps_view nv;
  bool changed = false;
  if (ps_view_in_sync(&m->view, s, t, &nv, &changed, &st) != 0) {
    PS_ERROR("%s: cannot mark ps/%d in sync in shard %d: %s", m->name, t, s, st.msg);
    return false;
  }
  if (!changed) {
    ps_view_free(&nv);
    return false;
  }
  int rc = cas_view(m, &nv, m->view_mod, &st);
  if (rc < 0) PS_WARN("%s: marking ps/%d in sync in shard %d: %s", m->name, t, s, st.msg);
  if (rc == 1) PS_INFO("ps/%d is in sync in shard %d", t, s);
  return rc != 1;
}

static void *view_main(void *arg) {
  ps_member *m = arg;
  bool retry = false;
  int64_t *rm = calloc((size_t)m->ntasks, sizeof *rm);
  char(*why)[160] = calloc((size_t)m->ntasks, sizeof *why);
  if (rm == NULL || why == NULL) {
    PS_ERROR("%s: membership: out of memory", m->name);
    free(rm);
    free(why);
    return NULL;
  }
  for (;;) {
    pthread_mutex_lock(&m->mu);
    while (!m->stop && !m->view_dirty && !m->lease_lost && !retry && m->ninsync == 0) {
      bool any = false;
      for (int t = 0; t < m->ntasks && !any; t++)
        any = m->remove_ns[t] != 0;
      if (any) break;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 1;
      pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    if (m->stop) {
      pthread_mutex_unlock(&m->mu);
      break;
    }
    if (retry) {
      pthread_mutex_unlock(&m->mu);
      struct timespec ts = {0, 20 * 1000000};
      nanosleep(&ts, NULL);
      pthread_mutex_lock(&m->mu);
    }
    bool lost = m->lease_lost;
    char reason[256];
    snprintf(reason, sizeof reason, "%s", m->lost_reason);
    m->view_dirty = false;
    memcpy(rm, m->remove_ns, (size_t)m->ntasks * sizeof *rm);
    memcpy(why, m->remove_why, (size_t)m->ntasks * sizeof *why);
    size_t ni = m->ninsync;
    ps_member_insync *ins = NULL;
    if (ni > 0 && (ins = malloc(ni * sizeof *ins)) != NULL) {
      memcpy(ins, m->insync, ni * sizeof *ins);
      m->ninsync = 0;
    }
    pthread_mutex_unlock(&m->mu);
    retry = false;
    if (lost) {
      fence(m, reason);
      free(ins);
      pthread_mutex_lock(&m->mu);
      m->lease_lost = false; /* once */
      pthread_mutex_unlock(&m->mu);
      continue;
    }
    if (m->fenced) { /* a fenced ps changes nothing any more */
      free(ins);
      pthread_mutex_lock(&m->mu);
      memset(m->remove_ns, 0, (size_t)m->ntasks * sizeof *m->remove_ns);
      pthread_mutex_unlock(&m->mu);
      continue;
    }
    ps_status st;
    ps_status_clear(&st);
    if (refresh(m, &st) != 0) {
      PS_WARN("%s: reading the view: %s; trying again", m->name, st.msg);
      retry = true;
    }
    for (int t = 0; !retry && t < m->ntasks; t++) {
      if (rm[t] == 0) continue;
      bool again = do_remove(m, t, rm[t], why[t]);
      if (again) {
        retry = true;
        continue;
      }
      pthread_mutex_lock(&m->mu);
      if (m->remove_ns[t] == rm[t]) m->remove_ns[t] = 0;
      pthread_mutex_unlock(&m->mu);
    }
    for (size_t i = 0; i < ni && ins; i++) {
      if (retry || do_insync(m, ins[i].s, ins[i].task)) {
        retry = true;
        on_synced(m, ins[i].s, ins[i].task); /* again later */
      }
    }
    if (ni > 0 && ins == NULL) retry = true;
    free(ins);
  }
  free(rm);
  free(why);
  return NULL;
}

/* ---- start, leave, destroy ---- */

static char **copy_strings(const char *const *v, int n) {
  char **c = calloc((size_t)n, sizeof *c);
  for (int i = 0; c && i < n; i++)
    if ((c[i] = strdup(v[i] ? v[i] : "")) == NULL) {
      for (int j = 0; j < i; j++)
        free(c[j]);
      free(c);
      return NULL;
    }
  return c;
}

static void free_strings(char **v, int n) {
  for (int i = 0; v && i < n; i++)
    free(v[i]);
  free(v);
}

ps_member *ps_member_create(const ps_member_options *o, ps_status *st) {
  if (o->conf->replicas < 2 || o->ntasks < 1 || o->self < 0 || o->self >= o->ntasks) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "membership: --replicas %d with %d ps tasks",
                  o->conf->replicas, o->ntasks);
    return NULL;
  }
  ps_member *m = calloc(1, sizeof *m);
  if (m == NULL) goto oom;
  m->self = o->self;
  m->ntasks = o->ntasks;
  m->conf = *o->conf;
  m->sec = o->sec;
  m->on_fenced = o->on_fenced;
  m->arg = o->arg;
  snprintf(m->name, sizeof m->name, "ps/%d", o->self);
  snprintf(m->key_view, sizeof m->key_view, "/paramserver/%s/view", m->conf.job);
  snprintf(m->prefix_tasks, sizeof m->prefix_tasks, "/paramserver/%s/tasks/ps/",
           m->conf.job);
  snprintf(m->key_task, sizeof m->key_task, "%s%d", m->prefix_tasks, m->self);
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  size_t n = (size_t)o->ntasks;
  m->remove_ns = calloc(n, sizeof *m->remove_ns);
  m->remove_why = calloc(n, sizeof *m->remove_why);
  m->peer = calloc(n, sizeof *m->peer);
  m->peer_gen = calloc(n, sizeof *m->peer_gen);
  m->lost_logged = calloc(n, sizeof *m->lost_logged);
  m->degraded_logged = calloc(n, sizeof *m->degraded_logged);
  m->addrs = copy_strings(o->addrs, o->ntasks);
  if (o->hosts && (m->hosts = copy_strings(o->hosts, o->ntasks)) == NULL) goto oom_m;
  if (!m->remove_ns || !m->remove_why || !m->peer || !m->peer_gen || !m->lost_logged ||
      !m->degraded_logged || !m->addrs)
    goto oom_m;
  if ((m->e = ps_etcd_connect(m->conf.etcd, 2000, st)) == NULL) {
    ps_member_destroy(m);
    return NULL;
  }
  return m;
oom_m:
  ps_member_destroy(m);
oom:
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "membership: out of memory");
  return NULL;
}

/* Joins the view: creates it when absent; on a restart (this task joined
 * before) first removes it, then joins (two CASes: a primary never
 * finishes a copy to a process that missed its start). */
static int join_view(ps_member *m, ps_status *st) {
  bool removed = false;
  for (int tries = 0; tries < CAS_TRIES; tries++) {
    ps_view v, nv;
    int64_t mod = 0;
    bool have = false, changed = false;
    if (read_view(m, &v, &mod, &have, st) != 0) return -1;
    if (!have) {
      if (ps_view_initial(m->ntasks, m->conf.replicas, (const char *const *)m->hosts, &nv,
                          st) != 0)
        return -1;
      if (cas_view(m, &nv, 0, st) < 0) return -1;
      continue;
    }
    if (v.replicas != m->conf.replicas) {
      ps_status_set(
          st, PS_FAILED_PRECONDITION,
          "the replication view at %s in etcd has %d replicas per shard, this ps "
          "was started with --replicas %d",
          m->key_view, v.replicas, m->conf.replicas);
      ps_view_free(&v);
      return -1;
    }
    int rc;
    if (v.joined[m->self] && !removed && listed(&v, m->self)) {
      int lost = 0;
      if (ps_view_remove_task(&v, m->self, &nv, &changed, &lost, st) != 0) {
        ps_view_free(&v);
        return -1;
      }
      ps_view_free(&v);
      if (!changed) {
        ps_view_free(&nv);
        removed = true;
        continue;
      }
      if ((rc = cas_view(m, &nv, mod, st)) < 0) return -1;
      if (rc == 1) {
        removed = true;
        PS_INFO("%s restarted: left the view first (its copies are gone)", m->name);
      }
      continue;
    }
    rc = ps_view_join(&v, m->self, (const char *const *)m->hosts, &nv, &changed, st);
    if (rc != 0) {
      ps_view_free(&v);
      return -1;
    }
    if (!changed) {
      ps_view_free(&nv);
      apply_view(m, &v, mod);
      return 0;
    }
    ps_view_free(&v);
    rc = cas_view(m, &nv, mod, st);
    if (rc < 0) return -1;
    if (rc == 1) return 0;
  }
  ps_status_set(st, PS_ABORTED,
                "could not join the replication view at %s: %d tries lost a race",
                m->key_view, CAS_TRIES);
  return -1;
}

int ps_member_start(ps_member *m, ps_repl *repl, ps_status *st) {
  m->repl = repl;
  if (ps_etcd_lease_grant(m->e, m->conf.lease_ttl_s, &m->lease, &m->ttl, st) != 0)
    return -1;
  if ((m->keeper = ps_etcd_keeper_start(m->e, m->lease, m->ttl, on_lease_lost, m, st)) ==
      NULL)
    return -1;
  const char *addr = m->addrs[m->self];
  if (ps_etcd_put(m->e, m->key_task, addr, strlen(addr), m->lease, st) != 0) return -1;
  ps_etcd_kv *kvs = NULL;
  size_t nkv = 0;
  int64_t rev = 0;
  if (ps_etcd_get_prefix(m->e, m->prefix_tasks, &kvs, &nkv, &rev, st) != 0) return -1;
  ps_etcd_kvs_free(kvs, nkv);
  if (join_view(m, st) != 0) return -1;
  PS_INFO("%s joined the replication view (etcd %s, job %s, lease TTL %lld s, %d "
          "replicas per shard)",
          m->name, m->conf.etcd, m->conf.job, (long long)m->ttl, m->conf.replicas);
  m->view_dirty = true; /* whatever changed since the read above */
  if ((m->wview = ps_etcd_watch_start(m->e, m->key_view, false, rev + 1, on_view_event, m,
                                      st)) == NULL ||
      (m->wtasks = ps_etcd_watch_start(m->e, m->prefix_tasks, true, rev + 1,
                                       on_task_event, m, st)) == NULL)
    return -1;
  if (pthread_create(&m->thr, NULL, view_main, m) != 0) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "membership: cannot start a thread");
    return -1;
  }
  m->thr_started = true;
  if (pthread_create(&m->hthr, NULL, ps_member_health_main, m) == 0)
    m->hthr_started = true;
  else
    PS_WARN("%s: no health checker thread: failures are seen by the lease only", m->name);
  return 0;
}

void ps_member_leave(ps_member *m) {
  if (m == NULL) return;
  pthread_mutex_lock(&m->mu);
  m->leaving = true;
  bool gone = m->lease_gone;
  pthread_mutex_unlock(&m->mu);
  if (m->keeper) ps_etcd_keeper_stop(m->keeper);
  m->keeper = NULL;
  if (m->lease && !gone) {
    ps_status st;
    ps_status_clear(&st);
    if (ps_etcd_lease_revoke(m->e, m->lease, &st) != 0)
      PS_WARN("%s: revoking its lease: %s (the peers see it gone when it expires)",
              m->name, st.msg);
    else
      PS_INFO("%s revoked its lease: its backups take over now", m->name);
    m->lease = 0;
  }
}

void ps_member_destroy(ps_member *m) {
  if (m == NULL) return;
  pthread_mutex_lock(&m->mu);
  m->stop = true;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  if (m->thr_started) pthread_join(m->thr, NULL);
  if (m->hthr_started) pthread_join(m->hthr, NULL);
  if (m->wview) ps_etcd_watch_stop(m->wview);
  if (m->wtasks) ps_etcd_watch_stop(m->wtasks);
  if (m->keeper) ps_etcd_keeper_stop(m->keeper);
  if (m->e) ps_etcd_close(m->e);
  if (m->have_view) ps_view_free(&m->view);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free_strings(m->addrs, m->ntasks);
  free_strings(m->hosts, m->ntasks);
  free(m->remove_ns);
  free(m->remove_why);
  free(m->insync);
  free(m->peer);
  free(m->peer_gen);
  free(m->lost_logged);
  free(m->degraded_logged);
  free(m);
}
