/* Membership of one replicated ps (ps/member.h; DESIGN.md "Replication").
 *
 * Threads: the worker (every etcd write: the view's compare-and-swaps,
 * one at a time, from a queue the others fill), the prober (the fast
 * failure detector: a Health/Check to every ps sharing a shard, every
 * PROBE_MS), the two etcd watches (the view key, the tasks/ prefix) and
 * the lease keeper.  Every value read from etcd goes through
 * ps_view_decode (outside input). */
#include "member.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/etcd.h"
#include "common/log.h"
#include "common/rpc.h"
#include "member_internal.h"

#define ETCD_TIMEOUT_MS 2000
#define PROBE_MS 200
#define CHECK_DEADLINE_MS 300
#define WARN_EVERY_S 10 /* a peer it cannot check: one WARN so often */
#define REJOIN_MS 2000
#define REJOIN_MAX_MS 8000
#define REJOIN_RESET_MS 30000 /* a rejoin this long after the last: that one held */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* One Health/Check of @addr on a fresh channel (a restarted peer must not
 * meet the old channel's reconnect backoff): 1 SERVING, 0 answered but
 * not serving, -1 refused (the connection itself: nothing listens there),
 * -2 no answer in time or another failure that proves nothing (a peer
 * shutting down, a reset), -3 a TLS handshake or a token refused (a
 * misconfiguration on one side, no proof that the peer is gone; @why, if
 * not NULL, gets the error). */
static int health_answer(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                         ps_status *st) {
  (void)sink;
  (void)st;
  int *status = user;
  /* HealthCheckResponse { ServingStatus status = 1; } */
  *status = n >= 2 && p[0] == 0x08 ? p[1] : 0;
  return 0;
}

int ps_member_check(const char *addr, const ps_rpc_channel_security *sec, int deadline_ms,
                    char *why, size_t why_n) {
  ps_rpc_channel *ch =
      sec ? ps_rpc_channel_create_secure(addr, sec) : ps_rpc_channel_create(addr);
  if (ch == NULL) return -1;
  int status = 0;
  ps_rpc_req call = {.ch = ch,
                     .method = "/grpc.health.v1.Health/Check",
                     .raw_request = "",
                     .unary_response = true,
                     .timeout_ms = deadline_ms,
                     .on_header = health_answer,
                     .user = &status};
  ps_rpc_run(&call, 1);
  ps_rpc_channel_destroy(ch);
  if (call.st.code == PS_OK) return status == 1 ? 1 : 0;
  if (call.st.code == PS_DEADLINE_EXCEEDED) return -2;
  if (call.st.code == PS_UNAVAILABLE && strstr(call.st.msg, "Connection refused"))
    return -1;
  bool misconf = call.st.code == PS_UNAUTHENTICATED ||
                 call.st.code == PS_PERMISSION_DENIED ||
                 strstr(call.st.msg, "andshake") || strstr(call.st.msg, "certificate") ||
                 strstr(call.st.msg, "SSL") || strstr(call.st.msg, "ssl");
  if (!misconf) return -2; /* shutting down, a reset...: no proof either way */
  if (why && why_n)
    snprintf(why, why_n, "%s: %s", ps_status_code_name(call.st.code), call.st.msg);
  return -3;
}

/* ---- the queue ---- */

/* Both the worker and the prober wait on m->cv: a signal could wake the
 * prober alone and leave the worker asleep until its 1 s timeout (a view
 * change, a copy done or a dead peer handled a second late) */
static void wake(ps_member *m) {
  pthread_cond_broadcast(&m->cv);
}

void ps_member_mark_dead(ps_member *m, int task, const char *why) {
  if (task < 0 || task >= m->ntasks || task == m->self) return;
  pthread_mutex_lock(&m->mu);
  if (!m->dead[task]) {
    m->dead[task] = true;
    if (m->detect_ns == 0) {
      m->detect_ns = ps_member_now_ns();
      m->detect_task = task;
    }
    PS_INFO("ps/%d looks dead (%s): removing it from the view", task, why);
  }
  wake(m);
  pthread_mutex_unlock(&m->mu);
}

static void on_backup_failed(void *arg, int s, int task, const char *reason) {
  ps_member *m = arg;
  PS_WARN("backup ps/%d of shard %d failed: %s: dropping it from shard %d", task, s,
          reason ? reason : "", s);
  /* Drop it from this shard only: a failed Replicate is no proof that the
   * backup is dead (a link between two ps may be down while both serve);
   * the prober and the lease decide that. */
  pthread_mutex_lock(&m->mu);
  bool have = false;
  for (int k = 0; k < m->ndrp && !have; k++)
    have = m->drp_s[k] == s && m->drp_t[k] == task;
  if (!have && m->ndrp < m->capsyn) {
    m->drp_s[m->ndrp] = s;
    m->drp_t[m->ndrp] = task;
    m->ndrp++;
  }
  wake(m);
  pthread_mutex_unlock(&m->mu);
}

static void on_synced(void *arg, int s, int task) {
  ps_member *m = arg;
  pthread_mutex_lock(&m->mu);
  if (m->nsyn < m->capsyn) {
    m->syn_s[m->nsyn] = s;
    m->syn_t[m->nsyn] = task;
    m->nsyn++;
  }
  wake(m);
  pthread_mutex_unlock(&m->mu);
}

void ps_member_callbacks(ps_member *m, ps_repl_callbacks *cb) {
  cb->backup_failed = on_backup_failed;
  cb->synced = on_synced;
  cb->arg = m;
}

static void on_lease_lost(void *arg, const char *reason) {
  ps_member *m = arg;
  char why[300];
  snprintf(why, sizeof why, "its etcd lease is lost (%s)", reason ? reason : "");
  ps_member_fence(m, why);
}

/* ---- watches ---- */

static void on_view_event(void *arg, const char *key, const char *val, size_t len,
                          int64_t mod_rev, bool deleted) {
  (void)key;
  (void)val;
  (void)len;
  (void)mod_rev;
  (void)deleted;
  ps_member *m = arg;
  pthread_mutex_lock(&m->mu);
  m->view_dirty = true;
  wake(m);
  pthread_mutex_unlock(&m->mu);
}

static void on_task_event(void *arg, const char *key, const char *val, size_t len,
                          int64_t mod_rev, bool deleted) {
  (void)val;
  (void)len;
  (void)mod_rev;
  ps_member *m = arg;
  if (key == NULL) { /* compacted: read the view again */
    on_view_event(arg, NULL, NULL, 0, 0, false);
    return;
  }
  if (!deleted || strncmp(key, m->prefix_tasks, strlen(m->prefix_tasks)) != 0) return;
  const char *p = key + strlen(m->prefix_tasks);
  char *end;
  long t = strtol(p, &end, 10);
  if (end == p || *end || t < 0 || t >= m->ntasks) return;
  if (t == m->self) {
    pthread_mutex_lock(&m->mu);
    bool leaving = m->leaving;
    pthread_mutex_unlock(&m->mu);
    if (!leaving) ps_member_fence(m, "its task key in etcd was deleted (lease expired)");
    return;
  }
  /* (a clean stop revokes its lease too: it left the view first) */
  ps_member_mark_dead(m, (int)t, "its etcd lease ended: it stopped, or expired");
}

/* ---- lifecycle ---- */

ps_member *ps_member_create(const ps_repl_conf *conf, int self, int ntasks,
                            const char *const *hosts, const char *addr,
                            void (*on_fenced)(void *arg), void *arg, ps_status *st) {
  ps_member *m = calloc(1, sizeof *m);
  if (m == NULL) goto oom;
  m->conf = *conf;
  m->self = self;
  m->ntasks = ntasks;
  m->on_fenced = on_fenced;
  m->arg = arg;
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  m->capsyn = ntasks * PS_VIEW_MAX_REPLICAS + 16;
  m->dead = calloc((size_t)ntasks, sizeof *m->dead);
  m->detect_task = -1;
  m->hosts = calloc((size_t)ntasks, sizeof *m->hosts);
  m->addrs = calloc((size_t)ntasks, sizeof *m->addrs);
  m->fails = calloc((size_t)ntasks, sizeof *m->fails);
  m->warned_ns = calloc((size_t)ntasks, sizeof *m->warned_ns);
  m->lone = calloc((size_t)ntasks, sizeof *m->lone);
  m->syn_s = calloc((size_t)m->capsyn, sizeof *m->syn_s);
  m->syn_t = calloc((size_t)m->capsyn, sizeof *m->syn_t);
  m->drp_s = calloc((size_t)m->capsyn, sizeof *m->drp_s);
  m->drp_t = calloc((size_t)m->capsyn, sizeof *m->drp_t);
  m->addr = strdup(addr);
  if (!m->dead || !m->hosts || !m->addrs || !m->fails || !m->warned_ns || !m->lone ||
      !m->syn_s || !m->syn_t || !m->drp_s || !m->drp_t || !m->addr)
    goto oom;
  for (int i = 0; i < ntasks; i++)
    if (hosts && hosts[i] && (m->hosts[i] = strdup(hosts[i])) == NULL) goto oom;
  snprintf(m->key_view, sizeof m->key_view, "/paramserver/%s/view", conf->job);
  snprintf(m->prefix_tasks, sizeof m->prefix_tasks, "/paramserver/%s/tasks/ps/",
           conf->job);
  snprintf(m->key_task, sizeof m->key_task, "%s%d", m->prefix_tasks, self);
  return m;
oom:
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "membership: out of memory");
  ps_member_destroy(m);
  return NULL;
}

int ps_member_start(ps_member *m, ps_repl *repl, const char *const *addrs,
                    const ps_rpc_channel_security *sec, ps_status *st) {
  m->repl = repl;
  m->sec = sec;
  for (int i = 0; i < m->ntasks; i++)
    if (addrs[i] && (m->addrs[i] = strdup(addrs[i])) == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "membership: out of memory");
  if ((m->etcd = ps_etcd_connect(m->conf.etcd, ETCD_TIMEOUT_MS, st)) == NULL) return -1;
  int64_t ttl = 0;
  if (ps_etcd_lease_grant(m->etcd, m->conf.lease_ttl_s, &m->lease, &ttl, st) != 0)
    return -1;
  if (ps_etcd_put(m->etcd, m->key_task, m->addr, strlen(m->addr), m->lease, st) != 0)
    return -1;
  if ((m->keeper = ps_etcd_keeper_start(m->etcd, m->lease, ttl, on_lease_lost, m, st)) ==
      NULL)
    return -1;
  int64_t rev = 0;
  if (ps_member_join(m, &rev, st) != 0) return -1;
  if ((m->wview = ps_etcd_watch_start(m->etcd, m->key_view, false, rev + 1, on_view_event,
                                      m, st)) == NULL ||
      (m->wtasks = ps_etcd_watch_start(m->etcd, m->prefix_tasks, true, rev + 1,
                                       on_task_event, m, st)) == NULL)
    return -1;
  /* a task whose key is already gone (it died before this start) */
  ps_etcd_kv *kv = NULL;
  size_t n = 0;
  if (ps_etcd_get_prefix(m->etcd, m->prefix_tasks, &kv, &n, NULL, st) != 0) return -1;
  bool *live = calloc((size_t)m->ntasks, sizeof *live);
  if (live == NULL) {
    ps_etcd_kvs_free(kv, n);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "membership: out of memory");
  }
  for (size_t k = 0; k < n; k++) {
    char *end;
    long t = strtol(kv[k].key + strlen(m->prefix_tasks), &end, 10);
    if (*end == '\0' && t >= 0 && t < m->ntasks) live[t] = true;
  }
  ps_etcd_kvs_free(kv, n);
  pthread_mutex_lock(&m->mu);
  for (int s = 0; s < m->ntasks; s++)
    for (int k = 0; k < m->cur.shard[s].n; k++) {
      int t = m->cur.shard[s].task[k];
      /* only a task that joined once and has no key died; one that
       * never joined is still starting */
      if (!live[t] && t != m->self && m->cur.joined && m->cur.joined[t])
        m->dead[t] = true;
    }
  pthread_mutex_unlock(&m->mu);
  free(live);
  if (pthread_create(&m->worker, NULL, ps_member_worker, m) != 0)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "membership: cannot start a thread");
  m->worker_on = true;
  if (pthread_create(&m->prober, NULL, ps_member_prober, m) != 0)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "membership: cannot start a thread");
  m->prober_on = true;
  return 0;
}

static void stop_threads(ps_member *m) {
  pthread_mutex_lock(&m->mu);
  m->stop = true;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  if (m->worker_on) pthread_join(m->worker, NULL);
  if (m->prober_on) pthread_join(m->prober, NULL);
  m->worker_on = m->prober_on = false;
  if (m->wview) ps_etcd_watch_stop(m->wview);
  if (m->wtasks) ps_etcd_watch_stop(m->wtasks);
  m->wview = m->wtasks = NULL;
  if (m->keeper) ps_etcd_keeper_stop(m->keeper);
  m->keeper = NULL;
}

void ps_member_leave(ps_member *m) {
  if (m == NULL || m->etcd == NULL) return;
  pthread_mutex_lock(&m->mu);
  bool was = m->leaving, fenced = m->fenced;
  m->leaving = true;
  pthread_mutex_unlock(&m->mu);
  if (was) return;
  stop_threads(m);
  ps_status st;
  ps_status_clear(&st);
  /* hand over: the backups become primaries in one new view now */
  if (!fenced && ps_member_transition(m, PS_MEMBER_LEAVE, m->self, -1) == 0)
    PS_INFO("left the view: its shards are handed over");
  if (m->lease && ps_etcd_lease_revoke(m->etcd, m->lease, &st) != 0)
    PS_WARN("could not revoke its etcd lease (peers see it gone after the TTL): %s",
            st.msg);
  m->lease = 0;
}

void ps_member_stop(ps_member *m) {
  if (m != NULL) stop_threads(m);
}

void ps_member_destroy(ps_member *m) {
  if (m == NULL) return;
  stop_threads(m);
  if (m->etcd) ps_etcd_close(m->etcd);
  for (int i = 0; m->hosts && i < m->ntasks; i++)
    free(m->hosts[i]);
  for (int i = 0; m->addrs && i < m->ntasks; i++)
    free(m->addrs[i]);
  free(m->hosts);
  free(m->addrs);
  free(m->dead);
  free(m->fails);
  free(m->warned_ns);
  free(m->lone);
  free(m->syn_s);
  free(m->drp_s);
  free(m->drp_t);
  free(m->syn_t);
  free(m->addr);
  ps_view_free(&m->cur);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m);
}

/* ---- the prober: the fast path ---- */

void *ps_member_prober(void *arg) {
  ps_member *m = arg;
  bool *peer = calloc((size_t)m->ntasks, sizeof *peer);
  if (peer == NULL) return NULL;
  pthread_mutex_lock(&m->mu);
  while (!m->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += PROBE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    if (m->stop || m->fenced) break;
    /* the tasks sharing a shard with this one */
    memset(peer, 0, (size_t)m->ntasks * sizeof *peer);
    for (int s = 0; m->cur.shard && s < m->ntasks; s++) {
      const ps_view_shard *sh = &m->cur.shard[s];
      bool mine = false;
      for (int k = 0; k < sh->n; k++)
        mine |= sh->task[k] == m->self;
      for (int k = 0; mine && k < sh->n; k++)
        /* a task that has not joined yet is starting, not dead: a
         * refused Check then proves nothing */
        if (sh->task[k] != m->self && !m->dead[sh->task[k]] && m->cur.joined &&
            m->cur.joined[sh->task[k]])
          peer[sh->task[k]] = true;
    }
    pthread_mutex_unlock(&m->mu);
    for (int t = 0; t < m->ntasks; t++) {
      if (!peer[t] || m->addrs[t] == NULL) {
        m->fails[t] = 0;
        continue;
      }
      char why[512] = "";
      int r = ps_member_check(m->addrs[t], m->sec, CHECK_DEADLINE_MS, why, sizeof why);
      /* refused twice in a row: the process is gone (kill -9, crash).  A
       * peer that does not answer in time (stopped, overloaded) is left
       * to its lease (the slow path): no false removal under load. */
      if (r == -3 &&
          ps_member_now_ns() - m->warned_ns[t] > (int64_t)WARN_EVERY_S * 1000000000) {
        m->warned_ns[t] = ps_member_now_ns();
        PS_WARN("cannot check ps/%d at %s: %s (TLS or token settings differ between the "
                "two? it is not taken for dead)",
                t, m->addrs[t], why);
      }
      m->fails[t] = r == -1 ? m->fails[t] + 1 : 0;
      if (m->fails[t] >= 2) {
        m->fails[t] = 0;
        ps_member_mark_dead(m, t, "its Health/Check is refused");
      }
    }
    pthread_mutex_lock(&m->mu);
  }
  pthread_mutex_unlock(&m->mu);
  free(peer);
  return NULL;
}

/* ---- the worker: every etcd write ---- */

void *ps_member_worker(void *arg) {
  ps_member *m = arg;
  bool *dead = calloc((size_t)m->ntasks, sizeof *dead);
  int *ss = calloc((size_t)m->capsyn, sizeof *ss),
      *tt = calloc((size_t)m->capsyn, sizeof *tt),
      *ds = calloc((size_t)m->capsyn, sizeof *ds),
      *dt = calloc((size_t)m->capsyn, sizeof *dt);
  if (!dead || !ss || !tt || !ds || !dt) {
    PS_ERROR("membership: out of memory: fencing");
    ps_member_fence(m, "membership ran out of memory");
    free(dead);
    free(ss);
    free(tt);
    free(ds);
    free(dt);
    return NULL;
  }
  pthread_mutex_lock(&m->mu);
  while (!m->stop) {
    bool any = m->view_dirty || m->nsyn > 0 || m->ndrp > 0;
    for (int t = 0; t < m->ntasks && !any; t++)
      any = m->dead[t];
    if (!any) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 1;
      pthread_cond_timedwait(&m->cv, &m->mu, &ts);
      if (m->stop || m->fenced) continue;
      pthread_mutex_unlock(&m->mu);
      bool rejoin = ps_member_wants_rejoin(m);
      pthread_mutex_lock(&m->mu);
      if (!rejoin) continue;
    }
    bool dirty = m->view_dirty;
    m->view_dirty = false;
    memcpy(dead, m->dead, (size_t)m->ntasks * sizeof *dead);
    memset(m->dead, 0, (size_t)m->ntasks * sizeof *m->dead);
    int nsyn = m->nsyn;
    memcpy(ss, m->syn_s, (size_t)nsyn * sizeof *ss);
    memcpy(tt, m->syn_t, (size_t)nsyn * sizeof *tt);
    m->nsyn = 0;
    int ndrp = m->ndrp;
    memcpy(ds, m->drp_s, (size_t)ndrp * sizeof *ds);
    memcpy(dt, m->drp_t, (size_t)ndrp * sizeof *dt);
    m->ndrp = 0;
    bool fenced = m->fenced;
    pthread_mutex_unlock(&m->mu);
    if (dirty) ps_member_refresh(m);
    for (int t = 0; t < m->ntasks && !fenced; t++) {
      if (!dead[t]) continue;
      /* confirmed by a Check of its own (a restarted task answers) */
      if (m->addrs[t] &&
          ps_member_check(m->addrs[t], m->sec, CHECK_DEADLINE_MS, NULL, 0) == 1) {
        PS_INFO("ps/%d answers its Health/Check: not removed", t);
        ps_member_end_detection(m);
        continue;
      }
      if (ps_member_transition(m, PS_MEMBER_REMOVE, t, -1) != 0) {
        pthread_mutex_lock(&m->mu);
        m->dead[t] = !m->stop; /* again on the next turn */
        pthread_mutex_unlock(&m->mu);
        sleep_ms(100);
      }
    }
    for (int k = 0; k < ndrp && !fenced; k++)
      if (ps_member_transition(m, PS_MEMBER_DROP, dt[k], ds[k]) != 0) {
        on_backup_failed(m, ds[k], dt[k], "again");
        sleep_ms(100);
      }
    /* dropped from a shard of its placement while alive: back as a
     * syncing backup, after REJOIN_MS.  A rejoin that is dropped again
     * soon (a link still down fails the copy; a variable name this ps
     * holds for another shard fails its CREATE) doubles the wait, up to
     * REJOIN_MAX_MS, so that a lasting fault does not churn the view. */
    int64_t now = ps_member_now_ns();
    if (m->rejoin_gap_ms == 0) m->rejoin_gap_ms = REJOIN_MS;
    if (!fenced && ps_member_wants_rejoin(m) &&
        now - m->rejoin_ns > m->rejoin_gap_ms * 1000000) {
      if (m->rejoin_ns == 0 || now - m->rejoin_ns > (int64_t)REJOIN_RESET_MS * 1000000)
        m->rejoin_gap_ms = REJOIN_MS; /* the last one held */
      else if (m->rejoin_gap_ms < REJOIN_MAX_MS) {
        m->rejoin_gap_ms =
            m->rejoin_gap_ms * 2 > REJOIN_MAX_MS ? REJOIN_MAX_MS : m->rejoin_gap_ms * 2;
        PS_WARN(
            "replication: out of a shard again %.0f s after the last rejoin: the next "
            "rejoin waits %lld s (the drop's WARN above says why)",
            (double)(now - m->rejoin_ns) / 1e9, (long long)(m->rejoin_gap_ms / 1000));
      }
      m->rejoin_ns = now;
      (void)ps_member_transition(m, PS_MEMBER_REJOIN, m->self, -1);
    }
    for (int k = 0; k < nsyn && !fenced; k++)
      if (ps_member_transition(m, PS_MEMBER_IN_SYNC, tt[k], ss[k]) != 0) {
        on_synced(m, ss[k], tt[k]);
        sleep_ms(100);
      }
    pthread_mutex_lock(&m->mu);
  }
  pthread_mutex_unlock(&m->mu);
  free(dead);
  free(ss);
  free(tt);
  free(ds);
  free(dt);
  return NULL;
}
