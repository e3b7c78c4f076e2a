/* Replication's data plane (ps/repl.h) in one process: 2 or 3 real ps
 * servers on loopback ports the kernel picks, each with the Ps handlers
 * and a ps_repl, their views set by hand.  Clients are raw RPC calls. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/rpc.h"
#include "common/security.h"
#include "common/view.h"
#include "health.pb-c.h"
#include "ps.pb-c.h"
#include "repl.h"
#include "service.h"
#include "store.h"
#include "tests/support/assert.h"

#define MAXN 3

typedef struct node {
  ps_store *store;
  ps_service *svc;
  ps_rpc_server *srv;
  ps_repl *repl;
  char addr[64];
  ps_rpc_channel *ch;
  atomic_int stopped;
  bool down;
} node;

static node nodes[MAXN];
static int nnodes;
static atomic_int nfailed, nsynced;
static atomic_int failed_task = -1, failed_shard = -1, synced_task = -1,
                  synced_shard = -1;
static char failed_reason[512];

static void on_failed(void *arg, int s, int task, const char *reason) {
  (void)arg;
  snprintf(failed_reason, sizeof failed_reason, "%s", reason);
  atomic_store(&failed_task, task);
  atomic_store(&failed_shard, s);
  atomic_fetch_add(&nfailed, 1);
}

static void on_synced(void *arg, int s, int task) {
  (void)arg;
  atomic_store(&synced_task, task);
  atomic_store(&synced_shard, s);
  atomic_fetch_add(&nsynced, 1);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Waits (up to 10 s) for *@a to reach @want. */
static void wait_for(atomic_int *a, int want) {
  for (int i = 0; i < 2000 && atomic_load(a) < want; i++)
    sleep_ms(5);
  ck_assert_int_ge(atomic_load(a), want);
}

static ps_auth *auth; /* tokens the servers check (NULL: none) */
static const char *peer_token;

static void start(int n) {
  ps_rpc_global_init();
  nnodes = n;
  const char *addrs[MAXN];
  for (int i = 0; i < n; i++) {
    node *d = &nodes[i];
    char task[16];
    snprintf(task, sizeof task, "ps/%d", i);
    d->store = ps_store_create(task);
    d->svc = ps_service_create(d->store, task);
    size_t nh;
    const ps_rpc_handler *h = ps_service_handlers(&nh);
    ps_status st;
    ps_rpc_server_options o;
    ps_rpc_server_options_default(&o);
    o.auth = auth;
    d->srv = ps_rpc_server_create("127.0.0.1:0", h, nh, &o, d->svc, &st);
    ck_assert_msg(d->srv != NULL, "%s", st.msg);
    ps_rpc_server_start(d->srv);
    snprintf(d->addr, sizeof d->addr, "127.0.0.1:%d", ps_rpc_server_port(d->srv));
    ps_rpc_channel_security cs = {.token = peer_token};
    d->ch = ps_rpc_channel_create_secure(d->addr, &cs);
    addrs[i] = d->addr;
  }
  ps_repl_callbacks cb = {on_failed, on_synced, NULL};
  ps_rpc_channel_security sec = {.token = peer_token};
  for (int i = 0; i < n; i++) {
    ps_status st;
    nodes[i].repl = ps_repl_create(nodes[i].svc, i, n, addrs, &sec, &cb, &st);
    ck_assert_msg(nodes[i].repl != NULL, "%s", st.msg);
    ps_service_set_repl(nodes[i].svc, nodes[i].repl);
  }
}

static void on_done(void *arg) {
  atomic_store((atomic_int *)arg, 1);
}

static void stop_node(int i) {
  node *d = &nodes[i];
  if (d->down) return;
  d->down = true;
  ps_rpc_server_shutdown(d->srv, on_done, &d->stopped);
  ps_service_shutdown(d->svc);
  ps_repl_destroy(d->repl); /* held calls fail: the server can finish */
  d->repl = NULL;
  ps_service_set_repl(d->svc, NULL);
  ps_rpc_server_cancel_all(d->srv);
  wait_for(&d->stopped, 1);
  ps_rpc_server_destroy(d->srv);
  ps_service_destroy(d->svc);
  ps_store_destroy(d->store);
}

static void stop_all(void) {
  for (int i = 0; i < nnodes; i++) {
    stop_node(i);
    ps_rpc_channel_destroy(nodes[i].ch);
  }
}

/* A view of @n tasks: shard s on @reps[s][0..] (-1 ends), all in sync
 * but the tasks @syncing[s] (or -1), since @since. */
static void set_view_on(int node_i, int64_t epoch, int n, int reps[][MAXN + 1],
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
  if (!nodes[node_i].down) ps_repl_set_view(nodes[node_i].repl, &v);
  free(v.shard);
  free(v.joined);
}

static void set_view(int64_t epoch, int n, int reps[][MAXN + 1], const int *syncing,
                     int64_t since) {
  for (int i = 0; i < n; i++)
    set_view_on(i, epoch, n, reps, syncing, since);
}

/* ---- calls ---- */

typedef struct resp {
  uint8_t *p;
  size_t n;
} resp;

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

static ps_status call(int i, const char *method, const ProtobufCMessage *m, resp *out) {
  resp r = {0};
  ps_rpc_req q = {.ch = nodes[i].ch,
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

static Paramserver__Route *route(int shard, int64_t epoch) {
  static Paramserver__Route r;
  paramserver__route__init(&r);
  r.shard = shard;
  r.epoch = epoch;
  return &r;
}

static void create(int i, int shard, const char *name, int64_t d0, int64_t d1) {
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
  q.route = route(shard, 1);
  ps_status st = call(i, "/paramserver.Ps/Create", &q.base, NULL);
  PS_ASSERT_OK(st.code, st);
  Paramserver__InitializeRequest iq = PARAMSERVER__INITIALIZE_REQUEST__INIT;
  char *names[1] = {(char *)name};
  iq.names = names;
  iq.n_names = 1;
  iq.route = route(shard, 1);
  st = call(i, "/paramserver.Ps/Initialize", &iq.base, NULL);
  PS_ASSERT_OK(st.code, st);
}

/* One update request of @n updates with inline bytes. */
static ps_status update(int i, Paramserver__Route *rt, uint64_t cid, uint64_t seq,
                        Paramserver__Update **u, size_t n, const void *data, size_t len) {
  Paramserver__UpdateRequest q = PARAMSERVER__UPDATE_REQUEST__INIT;
  q.updates = u;
  q.n_updates = n;
  q.inline_data.data = (uint8_t *)data;
  q.inline_data.len = len;
  q.route = rt;
  q.client_id = cid;
  q.seq = seq;
  return call(i, "/paramserver.Ps/Update", &q.base, NULL);
}

static void upd_init(Paramserver__Update *u, const char *name, int op, int64_t d0,
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
static char *digest(int i, int s) {
  Paramserver__DigestRequest q = PARAMSERVER__DIGEST_REQUEST__INIT;
  q.shard = s;
  resp r;
  ps_status st = call(i, "/paramserver.Ps/Digest", &q.base, &r);
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

static void assert_same(int a, int b, int s) {
  char *x = digest(a, s), *y = digest(b, s);
  ck_assert_msg(strcmp(x, y) == 0, "shard %d differs:\n ps/%d %s\n ps/%d %s", s, a, x, b,
                y);
  ck_assert_msg(x[0] != '\0', "shard %d is empty", s);
  free(x);
  free(y);
}

/* The first float of @name on node @i, read through Digest's neighbour:
 * a Read (primary only). */
static int health(int i) {
  Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  resp r;
  ps_status st = call(i, "/grpc.health.v1.Health/Check", &q.base, &r);
  PS_ASSERT_OK(st.code, st);
  Grpc__Health__V1__HealthCheckResponse *h =
      grpc__health__v1__health_check_response__unpack(NULL, r.n, r.p);
  int s = h->status;
  grpc__health__v1__health_check_response__free_unpacked(h, NULL);
  free(r.p);
  return s;
}

static int reps2[MAXN][MAXN + 1] = {{0, 1, -1}, {1, 0, -1}};

/* ---- tests ---- */

/* Every kind of update is answered only once the backup applied it: with
 * a backup that takes 150 ms per batch, the backup's digest equals the
 * primary's as soon as each answer arrives, bit for bit. */
START_TEST(every_update_kind_is_on_the_backup_when_answered) {
  setenv("PS_TEST_REPLICATE_DELAY_MS", "150", 1);
  start(2);
  set_view(1, 2, reps2, NULL, 1);
  create(0, 0, "w", 4, 3);
  create(0, 0, "w/m", 4, 3);
  create(0, 0, "w/v", 4, 3);
  create(0, 0, "c", 0, 0);
  assert_same(0, 1, 0);
  float dense[12], rows[6];
  for (int k = 0; k < 12; k++)
    dense[k] = 0.25f * (float)(k + 1);
  for (int k = 0; k < 6; k++)
    rows[k] = 0.5f + (float)k;
  int32_t idx[2] = {3, 1};
  Paramserver__Update u, *up = &u;
  int ops[] = {PARAMSERVER__UPDATE_OP__ASSIGN, PARAMSERVER__UPDATE_OP__ASSIGN_ADD,
               PARAMSERVER__UPDATE_OP__ASSIGN_SUB};
  for (size_t k = 0; k < 3; k++) {
    upd_init(&u, "w", ops[k], 4, 3);
    ps_status st = update(0, route(0, 1), 0, 0, &up, 1, dense, sizeof dense);
    PS_ASSERT_OK(st.code, st);
    assert_same(0, 1, 0);
  }
  int sops[] = {PARAMSERVER__UPDATE_OP__SCATTER_UPDATE,
                PARAMSERVER__UPDATE_OP__SCATTER_ADD, PARAMSERVER__UPDATE_OP__SCATTER_SUB};
  uint8_t buf[256];
  memcpy(buf, idx, sizeof idx);
  memcpy(buf + sizeof idx, rows, sizeof rows);
  for (size_t k = 0; k < 3; k++) {
    upd_init(&u, "w", sops[k], 2, 3);
    u.index_dtype = PS_DT_INT32;
    u.num_indices = 2;
    ps_status st = update(0, route(0, 1), 0, 0, &up, 1, buf, sizeof idx + sizeof rows);
    PS_ASSERT_OK(st.code, st);
    assert_same(0, 1, 0);
  }
  /* optimizers, dense and sparse */
  struct {
    int op, nslots, nh;
  } opt[] = {{PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT, 0, 1},
             {PARAMSERVER__UPDATE_OP__APPLY_MOMENTUM, 1, 2},
             {PARAMSERVER__UPDATE_OP__APPLY_ADAGRAD, 1, 1},
             {PARAMSERVER__UPDATE_OP__APPLY_ADAM, 2, 6}};
  char *slots[2] = {"w/m", "w/v"};
  double hp[6] = {0.9, 0.99, 0.1, 0.9, 0.999, 1e-7};
  for (size_t k = 0; k < 4; k++)
    for (int sparse = 0; sparse < 2; sparse++) {
      upd_init(&u, "w", opt[k].op, sparse ? 2 : 4, 3);
      u.slots = slots;
      u.n_slots = (size_t)opt[k].nslots;
      u.hparams = hp;
      u.n_hparams = (size_t)opt[k].nh;
      if (k == 1) hp[1] = 0.9; /* momentum */
      ps_status st;
      if (sparse) {
        u.index_dtype = PS_DT_INT32;
        u.num_indices = 2;
        st = update(0, route(0, 1), 0, 0, &up, 1, buf, sizeof idx + sizeof rows);
      } else {
        st = update(0, route(0, 1), 0, 0, &up, 1, dense, sizeof dense);
      }
      PS_ASSERT_OK(st.code, st);
      assert_same(0, 1, 0);
    }
  /* a synchronous step of one replica: applied, and on the backup */
  upd_init(&u, "w", PARAMSERVER__UPDATE_OP__ASSIGN_ADD, 4, 3);
  u.replicas_to_aggregate = 1;
  ps_status st = update(0, route(0, 1), 0, 0, &up, 1, dense, sizeof dense);
  PS_ASSERT_OK(st.code, st);
  assert_same(0, 1, 0);
  /* an assign filled on the ps */
  Paramserver__Initializer fill = PARAMSERVER__INITIALIZER__INIT;
  fill.type = "random_uniform";
  fill.maxval = 1;
  upd_init(&u, "w", PARAMSERVER__UPDATE_OP__ASSIGN, 4, 3);
  u.fill = &fill;
  st = update(0, route(0, 1), 0, 0, &up, 1, NULL, 0);
  PS_ASSERT_OK(st.code, st);
  assert_same(0, 1, 0);
  /* Delete reaches the backup too */
  Paramserver__DeleteRequest dq = PARAMSERVER__DELETE_REQUEST__INIT;
  char *dn[1] = {"c"};
  dq.names = dn;
  dq.n_names = 1;
  dq.route = route(0, 1);
  st = call(0, "/paramserver.Ps/Delete", &dq.base, NULL);
  PS_ASSERT_OK(st.code, st);
  char *d1 = digest(1, 0);
  ck_assert_ptr_null(strstr(d1, "c:"));
  free(d1);
  assert_same(0, 1, 0);
  stop_all();
}
END_TEST

typedef struct bg_update {
  int node;
  ps_status st;
  atomic_int done;
} bg_update;

static void *bg_assign_add(void *arg) {
  bg_update *b = arg;
  float one[12];
  for (int k = 0; k < 12; k++)
    one[k] = 1;
  Paramserver__Update u, *up = &u;
  upd_init(&u, "w", PARAMSERVER__UPDATE_OP__ASSIGN_ADD, 4, 3);
  b->st = update(b->node, route(0, 1), 0, 0, &up, 1, one, sizeof one);
  atomic_store(&b->done, 1);
  return NULL;
}

/* A backup that goes away mid-stream: membership is told, the update is
 * held (neither answered nor failed) until a view without the backup is
 * set, then answered OK. */
START_TEST(a_failed_backup_holds_updates_until_the_view_drops_it) {
  start(2);
  set_view(1, 2, reps2, NULL, 1);
  create(0, 0, "w", 4, 3);
  stop_node(1);
  bg_update b = {.node = 0};
  pthread_t th;
  pthread_create(&th, NULL, bg_assign_add, &b);
  wait_for(&nfailed, 1);
  ck_assert_int_eq(atomic_load(&failed_task), 1);
  ck_assert_int_eq(atomic_load(&failed_shard), 0);
  ck_assert_msg(strstr(failed_reason, "Replicate") || failed_reason[0], "%s",
                failed_reason);
  sleep_ms(300);
  ck_assert_msg(atomic_load(&b.done) == 0,
                "the update was answered (%s) while its backup had not applied it",
                b.st.msg);
  int solo[MAXN][MAXN + 1] = {{0, -1}, {0, -1}};
  set_view_on(0, 2, 2, solo, NULL, 2);
  wait_for(&b.done, 1);
  pthread_join(th, NULL);
  PS_ASSERT_OK(b.st.code, b.st);
  stop_all();
}
END_TEST

/* Held updates of a ps that is fenced fail UNAVAILABLE, new ones too, and
 * health says NOT_SERVING. */
START_TEST(a_fenced_ps_acknowledges_nothing) {
  start(2);
  set_view(1, 2, reps2, NULL, 1);
  create(0, 0, "w", 4, 3);
  ck_assert_int_eq(health(0),
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  stop_node(1);
  bg_update b = {.node = 0};
  pthread_t th;
  pthread_create(&th, NULL, bg_assign_add, &b);
  wait_for(&nfailed, 1);
  ps_repl_fence(nodes[0].repl, "lease lost");
  wait_for(&b.done, 1);
  pthread_join(th, NULL);
  PS_ASSERT_STATUS(b.st.code, b.st, PS_UNAVAILABLE, "ps/0 is fenced: lease lost");
  bg_update c = {.node = 0};
  bg_assign_add(&c);
  PS_ASSERT_STATUS(c.st.code, c.st, PS_UNAVAILABLE, "ps/0 is fenced: lease lost");
  ck_assert_int_eq(health(0),
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
  char why[64];
  ck_assert(ps_repl_fenced(nodes[0].repl, why, sizeof why));
  ck_assert_str_eq(why, "lease lost");
  stop_all();
}
END_TEST

/* A Replicate from a task that is not the shard's primary, or below the
 * shard's since, is refused; one from a newer view is ABORTED (retry). */
START_TEST(a_stale_replicate_is_refused) {
  start(2);
  set_view(3, 2, reps2, NULL, 3);
  Paramserver__ReplicateEntry e = PARAMSERVER__REPLICATE_ENTRY__INIT, *ep = &e;
  e.kind = PARAMSERVER__REPLICATE_ENTRY__KIND__DEDUP;
  e.shard = 0;
  e.client_id = 5;
  e.seq = 1;
  Paramserver__ReplicateRequest q = PARAMSERVER__REPLICATE_REQUEST__INIT;
  q.entries = &ep;
  q.n_entries = 1;
  q.from_task = 0;
  q.epoch = 2; /* below shard 0's since */
  ps_status st = call(1, "/paramserver.Ps/Replicate", &q.base, NULL);
  PS_ASSERT_STATUS(st.code, st, PS_FAILED_PRECONDITION,
                   "Replicate: stale epoch: ps/0 (epoch 2) is not the primary of shard 0 "
                   "in the view of ps/1 (epoch 3; primary ps/0 since epoch 3)");
  q.epoch = 3;
  q.from_task = 1; /* not shard 0's primary */
  st = call(0, "/paramserver.Ps/Replicate", &q.base, NULL);
  PS_ASSERT_STATUS(st.code, st, PS_FAILED_PRECONDITION,
                   "ps/1 (epoch 3) is not the primary of shard 0 in the view of ps/0");
  q.from_task = 0;
  q.epoch = 4;
  st = call(1, "/paramserver.Ps/Replicate", &q.base, NULL);
  PS_ASSERT_STATUS(st.code, st, PS_ABORTED, "behind the sender's (epoch 4)");
  q.epoch = 3;
  st = call(1, "/paramserver.Ps/Replicate", &q.base, NULL);
  PS_ASSERT_OK(st.code, st);
  /* a primary whose backup moved on to a newer view: its Replicate is
   * refused, membership is told, the update is held */
  create(0, 0, "w", 4, 3);
  int moved[MAXN][MAXN + 1] = {{1, 0, -1}, {1, 0, -1}};
  set_view_on(1, 5, 2, moved, NULL, 5);
  bg_update b = {.node = 0};
  pthread_t th;
  pthread_create(&th, NULL, bg_assign_add, &b);
  wait_for(&nfailed, 1);
  ck_assert_msg(strstr(failed_reason, "stale epoch"), "%s", failed_reason);
  sleep_ms(200);
  ck_assert_msg(atomic_load(&b.done) == 0,
                "the update was answered (%s) while its backup had not applied it",
                b.st.msg);
  stop_node(0); /* shutting down fails it */
  pthread_join(th, NULL);
  stop_all();
  PS_ASSERT_STATUS(b.st.code, b.st, PS_UNAVAILABLE, "ps/0 is shutting down");
}
END_TEST

/* The same (client_id, seq) twice applies once; the record reaches the
 * backup, so a retry after a failover is not applied again either. */
START_TEST(a_retried_update_applies_once) {
  start(2);
  set_view(1, 2, reps2, NULL, 1);
  create(0, 0, "w", 4, 3);
  float one[12];
  for (int k = 0; k < 12; k++)
    one[k] = 1;
  Paramserver__Update u, *up = &u;
  upd_init(&u, "w", PARAMSERVER__UPDATE_OP__ASSIGN_ADD, 4, 3);
  for (int k = 0; k < 2; k++) {
    ps_status st = update(0, route(0, 1), 0xabc, 7, &up, 1, one, sizeof one);
    PS_ASSERT_OK(st.code, st);
  }
  char *once = digest(0, 0);
  ck_assert_msg(strstr(once, "w:2:"), "%s", once); /* initialize + one add */
  assert_same(0, 1, 0);
  /* failover: ps/1 is shard 0's primary; the retry is not applied there */
  int moved[MAXN][MAXN + 1] = {{1, -1}, {1, -1}};
  set_view_on(1, 2, 2, moved, NULL, 2);
  ps_status st = update(1, route(0, 2), 0xabc, 7, &up, 1, one, sizeof one);
  PS_ASSERT_OK(st.code, st);
  char *after = digest(1, 0);
  ck_assert_str_eq(after, once);
  st = update(1, route(0, 2), 0xabc, 8, &up, 1, one, sizeof one);
  PS_ASSERT_OK(st.code, st);
  char *next = digest(1, 0);
  ck_assert_msg(strstr(next, "w:3:"), "%s", next);
  free(once);
  free(after);
  free(next);
  stop_all();
}
END_TEST

typedef struct bg_loop {
  atomic_int stop, count;
  ps_status st;
} bg_loop;

static void *bg_updates(void *arg) {
  bg_loop *b = arg;
  float one[12];
  for (int k = 0; k < 12; k++)
    one[k] = 1;
  Paramserver__Update u, *up = &u;
  upd_init(&u, "w", PARAMSERVER__UPDATE_OP__ASSIGN_ADD, 4, 3);
  while (!atomic_load(&b->stop)) {
    b->st = update(0, NULL, 0, 0, &up, 1, one, sizeof one);
    if (b->st.code != PS_OK) break;
    atomic_fetch_add(&b->count, 1);
  }
  return NULL;
}

/* A new SYNCING backup gets the whole shard while updates go on, then
 * callbacks.synced; its old copy of the shard is dropped first. */
START_TEST(a_syncing_backup_copies_the_shard_while_updates_go_on) {
  start(2);
  int solo[MAXN][MAXN + 1] = {{0, -1}, {1, -1}};
  set_view(1, 2, solo, NULL, 1);
  for (int k = 0; k < 20; k++) {
    char name[16];
    snprintf(name, sizeof name, "v%02d", k);
    create(0, 0, name, 64, 16);
  }
  create(0, 0, "w", 4, 3);
  /* ps/1 holds a stale copy of a shard-0 variable: it must go */
  bool created;
  ps_shape sh = {.rank = 1, .dim = {5}};
  ps_store_create_var_in(nodes[1].store, 0, "stale", PS_DT_FLOAT, &sh, NULL, NULL, NULL,
                         0, &created, NULL);
  bg_loop b = {0};
  pthread_t th;
  pthread_create(&th, NULL, bg_updates, &b);
  wait_for(&b.count, 20);
  int two[MAXN][MAXN + 1] = {{0, 1, -1}, {1, -1}};
  int syncing[MAXN] = {1, -1};
  set_view_on(1, 2, 2, two, syncing, 1); /* the backup first */
  set_view_on(0, 2, 2, two, syncing, 1);
  wait_for(&nsynced, 1);
  ck_assert_int_eq(atomic_load(&synced_task), 1);
  ck_assert_int_eq(atomic_load(&synced_shard), 0);
  int at = atomic_load(&b.count);
  wait_for(&b.count, at + 20); /* and after the copy */
  atomic_store(&b.stop, 1);
  pthread_join(th, NULL);
  PS_ASSERT_OK(b.st.code, b.st);
  /* in sync: updates are waited for */
  set_view(3, 2, two, NULL, 1);
  bg_update one = {.node = 0};
  bg_assign_add(&one);
  PS_ASSERT_OK(one.st.code, one.st);
  assert_same(0, 1, 0);
  char *d = digest(1, 0);
  ck_assert_ptr_null(strstr(d, "stale"));
  free(d);
  stop_all();
}
END_TEST

/* Route errors name the shard, the epoch and the primary; a Route limits
 * List and Read to its shard. */
START_TEST(route_errors_name_shard_epoch_and_primary) {
  start(2);
  set_view(4, 2, reps2, NULL, 1);
  create(0, 0, "a", 2, 0);
  create(1, 1, "b", 2, 0);
  float two[2] = {1, 2};
  Paramserver__Update u, *up = &u;
  upd_init(&u, "a", PARAMSERVER__UPDATE_OP__ASSIGN, 2, 0);
  ps_status st = update(1, route(0, 4), 0, 0, &up, 1, two, sizeof two);
  PS_ASSERT_STATUS(st.code, st, PS_FAILED_PRECONDITION,
                   "ps/1 is not the primary of shard 0 (view epoch 4; primary ps/0)");
  /* without a Route, a backup's copy is not updated either */
  st = update(1, NULL, 0, 0, &up, 1, two, sizeof two);
  PS_ASSERT_STATUS(st.code, st, PS_FAILED_PRECONDITION,
                   "variable a: ps/1 is not the primary of shard 0");
  upd_init(&u, "b", PARAMSERVER__UPDATE_OP__ASSIGN, 2, 0);
  st = update(0, route(0, 4), 0, 0, &up, 1, two, sizeof two);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND,
                   "variable b does not exist in shard 0 on ps/0");
  Paramserver__ListRequest lq = PARAMSERVER__LIST_REQUEST__INIT;
  lq.route = route(1, 4);
  resp r;
  st = call(1, "/paramserver.Ps/List", &lq.base, &r);
  PS_ASSERT_OK(st.code, st);
  Paramserver__ListResponse *l = paramserver__list_response__unpack(NULL, r.n, r.p);
  ck_assert_uint_eq(l->n_vars, 1); /* b only: a is a backup copy */
  ck_assert_str_eq(l->vars[0]->name, "b");
  ck_assert_int_eq(l->epoch, 4);
  paramserver__list_response__free_unpacked(l, NULL);
  free(r.p);
  lq.route = route(0, 4);
  st = call(1, "/paramserver.Ps/List", &lq.base, NULL);
  PS_ASSERT_STATUS(st.code, st, PS_FAILED_PRECONDITION,
                   "ps/1 is not the primary of shard 0 (view epoch 4; primary ps/0)");
  /* a lost shard */
  int lost[MAXN][MAXN + 1] = {{-1}, {1, -1}};
  set_view_on(1, 5, 2, lost, NULL, 5);
  lq.route = route(0, 5);
  st = call(1, "/paramserver.Ps/List", &lq.base, NULL);
  PS_ASSERT_STATUS(st.code, st, PS_UNAVAILABLE,
                   "shard 0 is lost (its replicas ps/0, ps/1 are gone): restore from the "
                   "latest checkpoint");
  /* checkpoint calls: shard -1, the epoch must be this ps's */
  Paramserver__SnapshotRequest sq = PARAMSERVER__SNAPSHOT_REQUEST__INIT;
  sq.id = 9;
  sq.route = route(-1, 4);
  st = call(1, "/paramserver.Ps/Snapshot", &sq.base, NULL);
  PS_ASSERT_STATUS(
      st.code, st, PS_FAILED_PRECONDITION,
      "Snapshot: stale view: the request was routed by view epoch 4, ps/1 is "
      "at epoch 5");
  /* Digest from a task that holds no replica */
  Paramserver__DigestRequest dq = PARAMSERVER__DIGEST_REQUEST__INIT;
  dq.shard = 0;
  st = call(1, "/paramserver.Ps/Digest", &dq.base, NULL);
  PS_ASSERT_STATUS(st.code, st, PS_FAILED_PRECONDITION,
                   "Digest: ps/1 holds no replica of shard 0 (view epoch 5)");
  stop_all();
}
END_TEST

/* Restore on a primary fills every replica: the restored values are on
 * the backup when Restore answers.  Save writes only the shards this ps
 * is the primary of. */
START_TEST(restore_fills_every_replica) {
  char dir[] = "/tmp/test_repl_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  start(2);
  for (int i = 0; i < 2; i++)
    ps_service_set_checkpoint_dir(nodes[i].svc, dir);
  set_view(2, 2, reps2, NULL, 1);
  create(0, 0, "w", 4, 3);
  create(1, 1, "b", 2, 0);
  Paramserver__SaveRequest sq = PARAMSERVER__SAVE_REQUEST__INIT;
  sq.prefix = "m/ckpt-1";
  sq.num_shards = 1;
  sq.route = route(-1, 2);
  ps_status st = call(0, "/paramserver.Ps/Save", &sq.base, NULL);
  PS_ASSERT_OK(st.code, st);
  Paramserver__MergeRequest mq = PARAMSERVER__MERGE_REQUEST__INIT;
  mq.prefix = "m/ckpt-1";
  mq.num_shards = 1;
  st = call(0, "/paramserver.Ps/Merge", &mq.base, NULL);
  PS_ASSERT_OK(st.code, st);
  char *saved = digest(0, 0);
  bg_update b = {.node = 0};
  bg_assign_add(&b);
  PS_ASSERT_OK(b.st.code, b.st);
  Paramserver__RestoreRequest rq = PARAMSERVER__RESTORE_REQUEST__INIT;
  rq.prefix = "m/ckpt-1";
  rq.route = route(-1, 2);
  resp r;
  st = call(0, "/paramserver.Ps/Restore", &rq.base, &r);
  PS_ASSERT_OK(st.code, st);
  Paramserver__RestoreResponse *res =
      paramserver__restore_response__unpack(NULL, r.n, r.p);
  ck_assert_uint_eq(res->n_restored, 1); /* w only: b is ps/1's */
  ck_assert_str_eq(res->restored[0], "w");
  paramserver__restore_response__free_unpacked(res, NULL);
  free(r.p);
  assert_same(0, 1, 0);
  char *now = digest(1, 0), *crc_saved = strchr(strchr(saved, ':') + 1, ':');
  ck_assert_msg(strstr(now, crc_saved), "restored %s, saved %s", now, saved);
  free(saved);
  free(now);
  stop_all();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Status reports the shards, roles and lag. */
START_TEST(status_reports_replication) {
  start(2);
  set_view(3, 2, reps2, NULL, 1);
  create(0, 0, "w", 4, 3);
  Paramserver__StatusRequest q = PARAMSERVER__STATUS_REQUEST__INIT;
  resp r;
  ps_status st = call(1, "/paramserver.Ps/Status", &q.base, &r);
  PS_ASSERT_OK(st.code, st);
  Paramserver__StatusResponse *s = paramserver__status_response__unpack(NULL, r.n, r.p);
  ck_assert_int_eq(s->view_epoch, 3);
  ck_assert_int_eq(s->replicas, 2);
  ck_assert_uint_eq(s->n_shards, 2);
  ck_assert_str_eq(s->shards[0]->role, "backup");
  ck_assert_int_eq(s->shards[0]->num_vars, 1);
  ck_assert_int_eq(s->shards[0]->bytes, 48);
  ck_assert_str_eq(s->shards[1]->role, "primary");
  ck_assert_uint_eq(s->shards[1]->n_lag_entries, 1);
  ck_assert_int_eq(s->shards[1]->lag_entries[0], 0);
  ck_assert(!s->fenced);
  paramserver__status_response__free_unpacked(s, NULL);
  free(r.p);
  stop_all();
}
END_TEST

#define WORKER_TOKEN "worker-token-0123456789abcdef"
#define ADMIN_TOKEN "admin-token-0123456789abcdef"
#define REPLICA_TOKEN "replica-token-0123456789abcdef"

/* With tokens, the ps tasks replicate with their `replica` token; a
 * worker token cannot call Replicate, a replica token nothing else. */
START_TEST(replicate_needs_the_replica_role) {
  char path[] = "/tmp/test_repl_tokens_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char text[] =
      "worker " WORKER_TOKEN "\nadmin " ADMIN_TOKEN "\nreplica " REPLICA_TOKEN "\n";
  ck_assert_int_eq(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
  close(fd);
  ps_status st;
  auth = ps_auth_load(path, &st);
  ck_assert_msg(auth != NULL, "%s", st.msg);
  unlink(path);
  peer_token = REPLICA_TOKEN;
  start(2);
  set_view(1, 2, reps2, NULL, 1);
  Paramserver__ListRequest lq = PARAMSERVER__LIST_REQUEST__INIT;
  st = call(0, "/paramserver.Ps/List", &lq.base, NULL);
  PS_ASSERT_STATUS(
      st.code, st, PS_PERMISSION_DENIED,
      "List needs a worker or admin token; this call's token has the replica "
      "role");
  for (int i = 0; i < 2; i++) { /* the test's own calls: admin */
    ps_rpc_channel_destroy(nodes[i].ch);
    ps_rpc_channel_security cs = {.token = ADMIN_TOKEN};
    nodes[i].ch = ps_rpc_channel_create_secure(nodes[i].addr, &cs);
  }
  create(0, 0, "w", 4, 3); /* replicated with the replica token */
  bg_update b = {.node = 0};
  bg_assign_add(&b);
  PS_ASSERT_OK(b.st.code, b.st);
  assert_same(0, 1, 0);
  ps_rpc_channel_destroy(nodes[1].ch);
  ps_rpc_channel_security ws = {.token = WORKER_TOKEN};
  nodes[1].ch = ps_rpc_channel_create_secure(nodes[1].addr, &ws);
  Paramserver__ReplicateRequest q = PARAMSERVER__REPLICATE_REQUEST__INIT;
  q.epoch = 1;
  st = call(1, "/paramserver.Ps/Replicate", &q.base, NULL);
  PS_ASSERT_STATUS(st.code, st, PS_PERMISSION_DENIED,
                   "Replicate needs a replica or admin token; this call's token has the "
                   "worker role");
  stop_all();
  ps_auth_destroy(auth);
  auth = NULL;
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("repl");
  TCase *t = tcase_create("data plane");
  tcase_set_timeout(t, 60);
  tcase_add_test(t, every_update_kind_is_on_the_backup_when_answered);
  tcase_add_test(t, a_failed_backup_holds_updates_until_the_view_drops_it);
  tcase_add_test(t, a_fenced_ps_acknowledges_nothing);
  tcase_add_test(t, a_stale_replicate_is_refused);
  tcase_add_test(t, a_retried_update_applies_once);
  tcase_add_test(t, a_syncing_backup_copies_the_shard_while_updates_go_on);
  tcase_add_test(t, route_errors_name_shard_epoch_and_primary);
  tcase_add_test(t, restore_fills_every_replica);
  tcase_add_test(t, status_reports_replication);
  tcase_add_test(t, replicate_needs_the_replica_role);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
