/* The fast failure detector of membership: grpc.health.v1.Health/Check
 * every PS_MEMBER_CHECK_MS to each peer that shares a shard with this ps.
 * A kill -9 closes the peer's port, so its Check fails UNAVAILABLE at
 * once; one more Check on a fresh channel (deadline
 * PS_MEMBER_CONFIRM_MS) confirms it, and the task is posted as gone.  A
 * peer that only stops answering (SIGSTOP, a partition) ends its Checks
 * DEADLINE_EXCEEDED: that is left to its lease (the slow path), so a
 * loaded machine never removes a live peer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "health.pb-c.h"
#include "member_internal.h"

int64_t ps_member_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int on_health(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                     ps_status *st) {
  (void)sink;
  (void)st;
  int *status = user;
  Grpc__Health__V1__HealthCheckResponse *r =
      grpc__health__v1__health_check_response__unpack(NULL, n, p);
  *status = r ? (int)r->status : -1;
  if (r) grpc__health__v1__health_check_response__free_unpacked(r, NULL);
  return 0;
}

typedef struct peer_state {
  ps_rpc_channel *ch;
  uint64_t gen;
  bool reported;
  int64_t first_fail_ns;
} peer_state;

static void fill_check(ps_rpc_req *q, ps_rpc_channel *ch,
                       Grpc__Health__V1__HealthCheckRequest *req, int *status,
                       int64_t timeout_ms) {
  *status = -1;
  memset(q, 0, sizeof *q);
  q->ch = ch;
  q->method = "/grpc.health.v1.Health/Check";
  q->request = &req->base;
  q->unary_response = true;
  q->timeout_ms = timeout_ms;
  q->on_header = on_health;
  q->user = status;
}

/* A Check that says the peer is gone (not merely slow). */
static bool gone(const ps_rpc_req *q, int status) {
  if (q->st.code == PS_OK)
    return status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
  return q->st.code == PS_UNAVAILABLE;
}

static bool stopping(ps_member *m) {
  pthread_mutex_lock(&m->mu);
  bool s = m->stop;
  pthread_mutex_unlock(&m->mu);
  return s;
}

void *ps_member_health_main(void *arg) {
  ps_member *m = arg;
  int n = m->ntasks;
  peer_state *ps = calloc((size_t)n, sizeof *ps);
  ps_rpc_req *q = calloc((size_t)n, sizeof *q);
  int *idx = calloc((size_t)n, sizeof *idx), *status = calloc((size_t)n, sizeof *status);
  bool *want = calloc((size_t)n, sizeof *want);
  uint64_t *gen = calloc((size_t)n, sizeof *gen);
  if (!ps || !q || !idx || !status || !want || !gen) {
    PS_ERROR("%s: health checker: out of memory (failures are seen by the lease only)",
             m->name);
    goto out;
  }
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  while (!stopping(m)) {
    int64_t t0 = ps_member_now_ns();
    pthread_mutex_lock(&m->mu);
    memcpy(want, m->peer, (size_t)n * sizeof *want);
    memcpy(gen, m->peer_gen, (size_t)n * sizeof *gen);
    pthread_mutex_unlock(&m->mu);
    int k = 0;
    for (int t = 0; t < n; t++) {
      if (!want[t]) continue;
      if (ps[t].gen != gen[t] || ps[t].ch == NULL) {
        /* a peer (re)entering: a fresh channel (no backoff left over) */
        ps_rpc_channel_destroy(ps[t].ch);
        ps[t] = (peer_state){.gen = gen[t]};
        ps[t].ch = ps_rpc_channel_create_secure(m->addrs[t], m->sec);
        if (ps[t].ch == NULL) continue;
      }
      if (ps[t].reported) continue;
      fill_check(&q[k], ps[t].ch, &req, &status[k], PS_MEMBER_CONFIRM_MS);
      idx[k++] = t;
    }
    if (k > 0) ps_rpc_run(q, (size_t)k);
    for (int j = 0; j < k; j++) {
      int t = idx[j];
      if (!gone(&q[j], status[j])) continue;
      int64_t seen = ps_member_now_ns();
      /* confirm on a fresh channel */
      ps_rpc_channel_destroy(ps[t].ch);
      ps[t].ch = ps_rpc_channel_create_secure(m->addrs[t], m->sec);
      if (ps[t].ch == NULL) continue;
      ps_rpc_req c;
      int cs;
      fill_check(&c, ps[t].ch, &req, &cs, PS_MEMBER_CONFIRM_MS);
      ps_rpc_run(&c, 1);
      if (!gone(&c, cs)) continue;
      char why[160];
      snprintf(why, sizeof why, "health check of ps/%d at %s: %s", t, m->addrs[t],
               c.st.code == PS_OK ? "NOT_SERVING" : c.st.msg);
      ps[t].reported = true;
      ps_member_post_remove(m, t, seen, why);
    }
    int64_t left = PS_MEMBER_CHECK_MS * 1000000LL - (ps_member_now_ns() - t0);
    if (left > 0) {
      struct timespec ts = {left / 1000000000, left % 1000000000};
      nanosleep(&ts, NULL);
    }
  }
out:
  for (int t = 0; ps && t < n; t++)
    ps_rpc_channel_destroy(ps[t].ch);
  free(ps);
  free(q);
  free(idx);
  free(status);
  free(want);
  free(gen);
  return NULL;
}
