/* The cluster of tests/unit/test_repl.c (test_repl_internal.h): real ps
 * servers on loopback ports the kernel picks, views set by hand. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/rpc.h"
#include "common/security.h"
#include "common/view.h"
#include "health.pb-c.h"
#include "ps.pb-c.h"
#include "repl.h"
#include "service.h"
#include "store.h"
#include "test_repl_internal.h"
#include "tests/support/assert.h"

node rpt_nodes[MAXN];
int rpt_nnodes;
atomic_int rpt_nfailed, rpt_nsynced;
atomic_int rpt_failed_task = -1, rpt_failed_shard = -1, rpt_synced_task = -1,
           rpt_synced_shard = -1;
char rpt_failed_reason[512];

static void on_failed(void *arg, int s, int task, const char *reason) {
  (void)arg;
  snprintf(rpt_failed_reason, sizeof rpt_failed_reason, "%s", reason);
  atomic_store(&rpt_failed_task, task);
  atomic_store(&rpt_failed_shard, s);
  atomic_fetch_add(&rpt_nfailed, 1);
}

static void on_synced(void *arg, int s, int task) {
  (void)arg;
  atomic_store(&rpt_synced_task, task);
  atomic_store(&rpt_synced_shard, s);
  atomic_fetch_add(&rpt_nsynced, 1);
}

void rpt_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Waits (up to 10 s) for *@a to reach @want. */
void rpt_wait_for(atomic_int *a, int want) {
  for (int i = 0; i < 2000 && atomic_load(a) < want; i++)
    rpt_sleep_ms(5);
  ck_assert_int_ge(atomic_load(a), want);
}

ps_auth *rpt_auth; /* tokens the servers check (NULL: none) */
const char *rpt_peer_token;

void rpt_start(int n) {
  ps_rpc_global_init();
  rpt_nnodes = n;
  const char *addrs[MAXN];
  for (int i = 0; i < n; i++) {
    node *d = &rpt_nodes[i];
    char task[16];
    snprintf(task, sizeof task, "ps/%d", i);
    d->store = ps_store_create(task);
    d->svc = ps_service_create(d->store, task);
    size_t nh;
    const ps_rpc_handler *h = ps_service_handlers(&nh);
    ps_status st;
    ps_rpc_server_options o;
    ps_rpc_server_options_default(&o);
    o.auth = rpt_auth;
    const char *nt = getenv("PS_TEST_RPC_THREADS"); /* as ps-server --threads */
    if (nt && atoi(nt) > 0) o.nthreads = atoi(nt);
    d->srv = ps_rpc_server_create("127.0.0.1:0", h, nh, &o, d->svc, &st);
    ck_assert_msg(d->srv != NULL, "%s", st.msg);
    ps_rpc_server_start(d->srv);
    snprintf(d->addr, sizeof d->addr, "127.0.0.1:%d", ps_rpc_server_port(d->srv));
    ps_rpc_channel_security cs = {.token = rpt_peer_token};
    d->ch = ps_rpc_channel_create_secure(d->addr, &cs);
    addrs[i] = d->addr;
  }
  ps_repl_callbacks cb = {on_failed, on_synced, NULL};
  ps_rpc_channel_security sec = {.token = rpt_peer_token};
  for (int i = 0; i < n; i++) {
    ps_status st;
    rpt_nodes[i].repl = ps_repl_create(rpt_nodes[i].svc, i, n, addrs, &sec, &cb, &st);
    ck_assert_msg(rpt_nodes[i].repl != NULL, "%s", st.msg);
    ps_service_set_repl(rpt_nodes[i].svc, rpt_nodes[i].repl);
  }
}

static void on_done(void *arg) {
  atomic_store((atomic_int *)arg, 1);
}

void rpt_stop_node(int i) {
  node *d = &rpt_nodes[i];
  if (d->down) return;
  d->down = true;
  ps_rpc_server_shutdown(d->srv, on_done, &d->stopped);
  ps_service_shutdown(d->svc);
  ps_repl_destroy(d->repl); /* held calls fail: the server can finish */
  d->repl = NULL;
  ps_service_set_repl(d->svc, NULL);
  ps_rpc_server_cancel_all(d->srv);
  rpt_wait_for(&d->stopped, 1);
  ps_rpc_server_destroy(d->srv);
  ps_service_destroy(d->svc);
  ps_store_destroy(d->store);
}

void rpt_stop_all(void) {
  for (int i = 0; i < rpt_nnodes; i++) {
    rpt_stop_node(i);
    ps_rpc_channel_destroy(rpt_nodes[i].ch);
  }
}

/* A view of @n tasks: shard s on @reps[s][0..] (-1 ends), all in sync
 * but the tasks @syncing[s] (or -1), since @since. */
void rpt_set_view_on(int node_i, int64_t epoch, int n, int reps[][MAXN + 1],
                     const int *syncing, int64_t since) {
  ps_view v = {0};
  v.epoch = epoch;
  v.replicas = 2;
  v.ntasks = n;
  v.shard = calloc((size_t)n, sizeof *v.shard);
  v.joined = calloc((size_t)n, sizeof *v.joined);
  for (int s = 0; s < n; s++) {
    for (int k = 0; reps[s][k] >= 0; k++) {
      v.shard[s].task[k] = reps[s][k];
      v.shard[s].state[k] =
          syncing && syncing[s] == reps[s][k] ? PS_REPLICA_SYNCING : PS_REPLICA_IN_SYNC;
      v.shard[s].n = k + 1;
    }
    v.shard[s].since = since;
    v.joined[s] = true;
  }
  if (!rpt_nodes[node_i].down) ps_repl_set_view(rpt_nodes[node_i].repl, &v);
  free(v.shard);
  free(v.joined);
}

void rpt_set_view(int64_t epoch, int n, int reps[][MAXN + 1], const int *syncing,
                  int64_t since) {
  for (int i = 0; i < n; i++)
    rpt_set_view_on(i, epoch, n, reps, syncing, since);
}

/* ---- calls ---- */

static int keep_header(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                       ps_status *st) {
  (void)sink;
  (void)st;
  resp *r = user;
  r->p = malloc(n + 1);
  memcpy(r->p, p, n);
  r->n = n;
  return 0;
}

ps_status rpt_call(int i, const char *method, const ProtobufCMessage *m, resp *out) {
  resp r = {0};
  ps_rpc_req q = {.ch = rpt_nodes[i].ch,
                  .method = method,
                  .request = m,
                  .unary_response = true,
                  .timeout_ms = 20000,
                  .on_header = keep_header,
                  .user = &r};
  ps_rpc_run(&q, 1);
  if (out)
    *out = r;
  else
    free(r.p);
  return q.st;
}

Paramserver__Route *rpt_route(int shard, int64_t epoch) {
  static Paramserver__Route r;
  paramserver__route__init(&r);
  r.shard = shard;
  r.epoch = epoch;
  return &r;
}

void rpt_create(int i, int shard, const char *name, int64_t d0, int64_t d1) {
  Paramserver__VariableSpec v = PARAMSERVER__VARIABLE_SPEC__INIT;
  Paramserver__Initializer in = PARAMSERVER__INITIALIZER__INIT;
  int64_t dims[2] = {d0, d1};
  v.name = (char *)name;
  v.dtype = PS_DT_FLOAT;
  v.shape = dims;
  v.n_shape = d1 > 0 ? 2 : d0 > 0 ? 1 : 0;
  in.type = "ones";
  v.initializer = &in;
  Paramserver__VariableSpec *vp = &v;
  Paramserver__CreateRequest q = PARAMSERVER__CREATE_REQUEST__INIT;
  q.vars = &vp;
  q.n_vars = 1;
  q.route = rpt_route(shard, 1);
  ps_status st = rpt_call(i, "/paramserver.Ps/Create", &q.base, NULL);
  PS_ASSERT_OK(st.code, st);
  Paramserver__InitializeRequest iq = PARAMSERVER__INITIALIZE_REQUEST__INIT;
  char *names[1] = {(char *)name};
  iq.names = names;
  iq.n_names = 1;
  iq.route = rpt_route(shard, 1);
  st = rpt_call(i, "/paramserver.Ps/Initialize", &iq.base, NULL);
  PS_ASSERT_OK(st.code, st);
}

/* One update request of @n updates with inline bytes. */
ps_status rpt_update(int i, Paramserver__Route *rt, uint64_t cid, uint64_t seq,
                     Paramserver__Update **u, size_t n, const void *data, size_t len) {
  Paramserver__UpdateRequest q = PARAMSERVER__UPDATE_REQUEST__INIT;
  q.updates = u;
  q.n_updates = n;
  q.inline_data.data = (uint8_t *)data;
  q.inline_data.len = len;
  q.route = rt;
  q.client_id = cid;
  q.seq = seq;
  return rpt_call(i, "/paramserver.Ps/Update", &q.base, NULL);
}

void rpt_upd_init(Paramserver__Update *u, const char *name, int op, int64_t d0,
                  int64_t d1) {
  static int64_t dims[64][2];
  static int k;
  paramserver__update__init(u);
  u->name = (char *)name;
  u->op = (Paramserver__UpdateOp)op;
  u->dtype = PS_DT_FLOAT;
  int64_t *d = dims[k++ % 64];
  d[0] = d0;
  d[1] = d1;
  u->shape = d;
  u->n_shape = d1 > 0 ? 2 : d0 > 0 ? 1 : 0;
}

/* "name:version:crc:bytes;..." of shard @s on node @i. */
char *rpt_digest(int i, int s) {
  Paramserver__DigestRequest q = PARAMSERVER__DIGEST_REQUEST__INIT;
  q.shard = s;
  resp r;
  ps_status st = rpt_call(i, "/paramserver.Ps/Digest", &q.base, &r);
  PS_ASSERT_OK(st.code, st);
  Paramserver__DigestResponse *d = paramserver__digest_response__unpack(NULL, r.n, r.p);
  ck_assert_ptr_nonnull(d);
  char *out = calloc(1, 65536);
  size_t k = 0;
  for (size_t j = 0; j < d->n_vars; j++)
    k += (size_t)snprintf(out + k, 65536 - k, "%s:%lld:%08x:%lld;", d->vars[j]->name,
                          (long long)d->vars[j]->version, d->vars[j]->crc32c,
                          (long long)d->vars[j]->bytes);
  paramserver__digest_response__free_unpacked(d, NULL);
  free(r.p);
  return out;
}

void rpt_assert_same(int a, int b, int s) {
  char *x = rpt_digest(a, s), *y = rpt_digest(b, s);
  ck_assert_msg(strcmp(x, y) == 0, "shard %d differs:\n ps/%d %s\n ps/%d %s", s, a, x, b,
                y);
  ck_assert_msg(x[0] != '\0', "shard %d is empty", s);
  free(x);
  free(y);
}

/* The first float of @name on node @i, read through Digest's neighbour:
 * a Read (primary only). */
int rpt_health(int i) {
  Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  resp r;
  ps_status st = rpt_call(i, "/grpc.health.v1.Health/Check", &q.base, &r);
  PS_ASSERT_OK(st.code, st);
  Grpc__Health__V1__HealthCheckResponse *h =
      grpc__health__v1__health_check_response__unpack(NULL, r.n, r.p);
  int s = h->status;
  grpc__health__v1__health_check_response__free_unpacked(h, NULL);
  free(r.p);
  return s;
}

int rpt_reps2[MAXN][MAXN + 1] = {{0, 1, -1}, {1, 0, -1}};

ps_status rpt_add_ones(int i, Paramserver__Route *rt, uint64_t cid, uint64_t seq,
                       int r2a) {
  float one[12];
  for (int k = 0; k < 12; k++)
    one[k] = 1;
  Paramserver__Update u, *up = &u;
  rpt_upd_init(&u, "w", PARAMSERVER__UPDATE_OP__ASSIGN_ADD, 4, 3);
  u.replicas_to_aggregate = r2a;
  u.sync_local_step = 0;
  return rpt_update(i, rt, cid, seq, &up, 1, one, sizeof one);
}

void *rpt_bg_assign_add(void *arg) {
  rpt_bg_update *b = arg;
  b->st = rpt_add_ones(b->node, rpt_route(0, 1), 0, 0, 0);
  atomic_store(&b->done, 1);
  return NULL;
}
