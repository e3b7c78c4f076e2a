/* The lease keeper (ps_etcd_keeper_*, common/etcd.h): a thread that sends
 * a keepalive for one lease every TTL/3 on a LeaseKeepAlive stream (with
 * "hasleader: true": a member without a leader ends the stream instead of
 * acknowledging keepalives it cannot commit).  A keepalive that fails, or
 * is not answered within the client's timeout, closes the stream and the
 * next one goes to the next endpoint, 100 ms later.
 *
 * What it guarantees: on_lost runs (once, on the keeper's thread) as soon
 * as etcd answers TTL <= 0 (the lease expired or was revoked), or when the
 * lease's TTL has passed since the last acknowledged keepalive was sent:
 * the earliest moment etcd could expire the lease (it counts from when it
 * got the keepalive, and deletes the keys TTL + up to 0.5 s after it, or
 * later after a leader change: ETCD_NOTES.md §7).  So, thread scheduling
 * aside, the holder hears of the loss no later than its keys can go. */
#include "rpc_etcd_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.pb-c.h"
#include "etcd_decode.h"
#include "log.h"

struct ps_etcd_keeper {
  ps_etcd *e;
  int64_t id, ttl_ms;
  void (*on_lost)(void *arg, const char *reason);
  void *arg;
  atomic_llong last_ok_ns;
  atomic_int stop;
  pthread_mutex_t mu; /* stop is set, and on_lost runs, under it */
  pthread_t th;
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One keepalive on @s: 1 acknowledged, 0 the lease is gone (@why set),
 * -1 failed (@st). */
static int keepalive(ps_etcd_keeper *k, ps_etcd_stream *s, int64_t deadline_ms, char *why,
                     size_t nwhy, ps_status *st) {
  Etcdserverpb__LeaseKeepAliveRequest req = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
  req.id = k->id;
  int64_t left = deadline_ms - ps_etcd_now_ms_();
  if (left < 1) left = 1;
  if (ps_etcd_stream_send_(s, &req.base, left, st) != 0) return -1;
  for (;;) {
    if (atomic_load(&k->stop)) return ps_status_set(st, PS_CANCELLED, "stopped"), -1;
    int64_t now = ps_etcd_now_ms_();
    if (now >= deadline_ms)
      return ps_status_set(st, PS_UNAVAILABLE,
                           "etcd at %s: keepalive not answered in time",
                           ps_etcd_stream_endpoint_(s)),
             -1;
    uint8_t *buf = NULL;
    size_t len = 0;
    int64_t step = deadline_ms - now < 100 ? deadline_ms - now : 100;
    int r = ps_etcd_stream_recv_(s, step, &buf, &len, st);
    if (r < 0) return -1;
    if (r == 0) continue;
    int64_t ttl = 0;
    int rc = ps_etcd_decode_keepalive(buf, len, k->id, &ttl, st);
    free(buf);
    if (rc != 0) {
      ps_status_prefix(st, "etcd at %s", ps_etcd_stream_endpoint_(s));
      return -1;
    }
    if (ttl <= 0) {
      snprintf(why, nwhy,
               "lease %lld is gone: etcd at %s answers its keepalive with TTL %lld "
               "(expired or revoked)",
               (long long)k->id, ps_etcd_stream_endpoint_(s), (long long)ttl);
      return 0;
    }
    return 1;
  }
}

static void *keeper_main(void *arg) {
  ps_etcd_keeper *k = arg;
  ps_etcd *e = k->e;
  ps_etcd_stream *s = NULL;
  int ep = atomic_load(&e->cur) % e->n;
  char why[PS_STATUS_MSG_MAX + 160] = "";
  ps_status last = {0};
  int64_t period = k->ttl_ms / 3 > 0 ? k->ttl_ms / 3 : 1;
  while (!atomic_load(&k->stop)) {
    int64_t lost_at = atomic_load(&k->last_ok_ns) / 1000000 + k->ttl_ms;
    int64_t now = ps_etcd_now_ms_();
    if (now >= lost_at) {
      snprintf(why, sizeof why,
               "no keepalive of lease %lld acknowledged for its TTL of %lld ms (last "
               "error: %s)",
               (long long)k->id, (long long)k->ttl_ms, last.msg[0] ? last.msg : "none");
      break;
    }
    ps_status st = {0};
    if (s == NULL && (s = ps_etcd_stream_open_(
                          e, ep, "/etcdserverpb.Lease/LeaseKeepAlive", &st)) == NULL) {
      last = st;
      ep = (ep + 1) % e->n;
      ps_etcd_sleep_ms_(100, &k->stop);
      continue;
    }
    int64_t dl = now + e->timeout_ms < lost_at ? now + e->timeout_ms : lost_at;
    /* an acknowledged keepalive counts from when it was sent: etcd counts
     * from when it got it, later, so the loss is never seen after etcd
     * could have expired the lease */
    int64_t sent = now_ns();
    int r = keepalive(k, s, dl, why, sizeof why, &st);
    if (r == 0) break;
    if (r < 0) {
      if (atomic_load(&k->stop)) break;
      if (strcmp(st.msg, last.msg) != 0)
        PS_WARN("etcd lease %lld: keepalive failed: %s; trying the next endpoint",
                (long long)k->id, st.msg);
      last = st;
      ps_etcd_stream_close_(s);
      s = NULL;
      ep = (ep + 1) % e->n;
      ps_etcd_sleep_ms_(100, &k->stop);
      continue;
    }
    if (last.msg[0])
      PS_INFO("etcd lease %lld: keepalive acknowledged by %s again", (long long)k->id,
              ps_etcd_stream_endpoint_(s));
    last.msg[0] = '\0';
    atomic_store(&k->last_ok_ns, sent);
    atomic_store(&e->cur, ep);
    ps_etcd_sleep_ms_(period, &k->stop);
  }
  ps_etcd_stream_close_(s);
  pthread_mutex_lock(&k->mu);
  if (!atomic_load(&k->stop) && why[0]) {
    PS_WARN("etcd lease %lld lost: %s", (long long)k->id, why);
    k->on_lost(k->arg, why);
  }
  pthread_mutex_unlock(&k->mu);
  return NULL;
}

ps_etcd_keeper *ps_etcd_keeper_start(ps_etcd *e, int64_t id, int64_t ttl_s,
                                     void (*on_lost)(void *arg, const char *reason),
                                     void *arg, ps_status *st) {
  if (id <= 0 || ttl_s < 1 || ttl_s > 9000000000LL || on_lost == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "keeper of lease %lld with TTL %lld s%s",
                  (long long)id, (long long)ttl_s, on_lost ? "" : " without on_lost");
    return NULL;
  }
  ps_etcd_keeper *k = calloc(1, sizeof *k);
  if (k == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "keeper of lease %lld: out of memory",
                  (long long)id);
    return NULL;
  }
  k->e = e;
  k->id = id;
  k->ttl_ms = ttl_s * 1000;
  k->on_lost = on_lost;
  k->arg = arg;
  atomic_init(&k->last_ok_ns, now_ns());
  atomic_init(&k->stop, 0);
  pthread_mutex_init(&k->mu, NULL);
  int rc = pthread_create(&k->th, NULL, keeper_main, k);
  if (rc != 0) {
    pthread_mutex_destroy(&k->mu);
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "keeper of lease %lld: no thread: %s",
                  (long long)id, strerror(rc));
    free(k);
    return NULL;
  }
  return k;
}

void ps_etcd_keeper_stop(ps_etcd_keeper *k) {
  if (k == NULL) return;
  pthread_mutex_lock(&k->mu); /* on_lost has run or never will */
  atomic_store(&k->stop, 1);
  pthread_mutex_unlock(&k->mu);
  pthread_join(k->th, NULL);
  pthread_mutex_destroy(&k->mu);
  free(k);
}

int64_t ps_etcd_keeper_last_ok_ns(const ps_etcd_keeper *k) {
  return atomic_load(&((ps_etcd_keeper *)k)->last_ok_ns);
}
