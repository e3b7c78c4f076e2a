/* Synchronous training (SyncReplicasOptimizer) through real ps processes:
 * two workers (threads, each with its own client, graph and session) train
 * on 2 ps; every step applies the mean of their gradients once, with the
 * values checked against the formulas computed here in double; stale
 * gradients are dropped; R=1 lets workers run independently; Adam's slots
 * and beta powers advance once per step; sparse gradients average per row;
 * a ps stopped with a call waiting for its step exits 0 and fails it. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

static ps_harness H;
static ps_client *C;

static void setup(void) {
  C = harness_start_client(&H, 2, NULL);
  ck_assert_ptr_nonnull(C);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

static bool close_to(double got, double want) {
  return fabs(got - want) <= 1e-5 * (1 + fabs(want));
}

/* Reads a float (or int64) variable of any ps into doubles. */
static void read_values(const char *name, double *out, int64_t n) {
  ps_status st;
  for (int t = 0; t < ps_client_num_ps(C); t++) {
    ps_read r = {.name = name};
    if (ps_client_read(C, t, &r, 1, &st) != 0) continue;
    ck_assert_int_eq(ps_tensor_num_elements(r.out), n);
    for (int64_t i = 0; i < n; i++)
      out[i] = ps_elem_get(r.out->dtype, ps_tensor_data(r.out), i);
    ps_tensor_destroy(r.out);
    return;
  }
  ck_abort_msg("variable %s is on no ps", name);
}

static int64_t global_step(void) {
  double v;
  read_values("global_step", &v, 1);
  return (int64_t)v;
}

/* ---- a worker: its own client, graph and session ---- */

enum { OPT_GD, OPT_ADAM };
#define N 4 /* batch */

typedef struct worker {
  ps_client *c;
  ps_graph *g;
  ps_session *s;
  ps_variable *w, *b, *step;
  ps_node *x, *y, *train;
  ps_tensor *bx, *by;
  unsigned seed;
  int steps; /* runs of run_loop */
  int rc;
  ps_status st;
  int applied, stale; /* summed over runs */
} worker;

/* pred = x @ w + b, loss = mean((y - pred)^2); w [3,1] and b [1] land on
 * different ps, global_step with b. */
static void worker_init(worker *wk, int opt, int replicas, int total, unsigned seed) {
  memset(wk, 0, sizeof *wk);
  ps_status st;
  wk->c = ps_client_create(H.cluster, "ps", NULL, &st);
  ck_assert_msg(wk->c != NULL, "%s", st.msg);
  wk->g = ps_graph_create();
  ps_device_push_fn(wk->g, ps_replica_device_setter(H.cluster, NULL));
  wk->step = ps_create_global_step(wk->g, &st);
  ps_init_spec half, quarter;
  ps_init_spec_default(&half, PS_INIT_CONSTANT);
  half.value = 0.5;
  ps_init_spec_default(&quarter, PS_INIT_CONSTANT);
  quarter.value = -0.25;
  wk->x = ps_placeholder(wk->g, PS_DT_FLOAT, &(ps_shape){2, {-1, 3}}, "x");
  wk->y = ps_placeholder(wk->g, PS_DT_FLOAT, &(ps_shape){2, {-1, 1}}, "y");
  wk->w =
      ps_get_variable(wk->g, "w", PS_DT_FLOAT, &(ps_shape){2, {3, 1}}, &half, NULL, &st);
  wk->b =
      ps_get_variable(wk->g, "b", PS_DT_FLOAT, &(ps_shape){1, {1}}, &quarter, NULL, &st);
  ck_assert_int_ne(ps_variable_task(wk->w), ps_variable_task(wk->b));
  ps_node *pred = ps_bias_add(ps_matmul(wk->x, ps_variable_value(wk->w), false, false),
                              ps_variable_value(wk->b));
  ps_node *loss = ps_mean_squared_error(wk->y, pred);
  ps_optimizer *inner = opt == OPT_GD ? ps_gradient_descent_optimizer(0.1)
                                      : ps_adam_optimizer(0.05, 0.9, 0.999, 1e-8);
  ps_optimizer *o = ps_sync_replicas_optimizer(inner, replicas, total);
  wk->train = ps_optimizer_minimize(o, wk->g, loss, wk->step, NULL, 0, &st);
  ck_assert_msg(wk->train != NULL, "%s", st.msg);
  ps_optimizer_destroy(o);
  wk->s = ps_session_create(wk->g, wk->c, &st);
  ck_assert_ptr_nonnull(wk->s);
  wk->bx = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {N, 3}}, false);
  wk->by = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {N, 1}}, false);
  wk->seed = seed;
}

static void worker_fini(worker *wk) {
  ps_tensor_destroy(wk->bx);
  ps_tensor_destroy(wk->by);
  ps_session_destroy(wk->s);
  ps_graph_destroy(wk->g);
  ps_client_destroy(wk->c);
}

static void initialize(worker *wk) {
  ps_status st;
  ps_node *init = ps_global_variables_initializer(wk->g);
  PS_ASSERT_OK(ps_session_run(wk->s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
}

/* A new batch: each worker its own data. */
static void new_batch(worker *wk) {
  float *x = ps_tensor_data(wk->bx), *y = ps_tensor_data(wk->by);
  for (int i = 0; i < N * 3; i++)
    x[i] = (float)rand_r(&wk->seed) / (float)RAND_MAX * 2 - 1;
  for (int i = 0; i < N; i++)
    y[i] = (float)rand_r(&wk->seed) / (float)RAND_MAX * 4 - 2;
}

/* d loss / d (w0, w1, w2, b) at (w, b) for this worker's batch. */
static void gradient(const worker *wk, const double *w, double b, double *g) {
  const float *x = ps_tensor_data(wk->bx), *y = ps_tensor_data(wk->by);
  memset(g, 0, 4 * sizeof *g);
  for (int i = 0; i < N; i++) {
    double r = b - y[i];
    for (int j = 0; j < 3; j++)
      r += x[i * 3 + j] * w[j];
    for (int j = 0; j < 3; j++)
      g[j] += 2.0 / N * r * x[i * 3 + j];
    g[3] += 2.0 / N * r;
  }
}

static void run_once(worker *wk) {
  ps_feed f[2] = {{wk->x, wk->bx}, {wk->y, wk->by}};
  wk->rc = ps_session_run(wk->s, f, 2, NULL, 0, &wk->train, 1, NULL, &wk->st);
  int a = 0, s = 0;
  ps_session_last_sync(wk->s, &a, &s);
  wk->applied += a;
  wk->stale += s;
}

static void *run_thread(void *arg) {
  run_once(arg);
  return NULL;
}

static void *run_loop(void *arg) {
  worker *wk = arg;
  for (int i = 0; i < wk->steps; i++) {
    new_batch(wk);
    run_once(wk);
    if (wk->rc != 0) break;
  }
  return NULL;
}

/* Both workers run one step at once. */
static void run_both(worker *a, worker *b) {
  pthread_t t[2];
  pthread_create(&t[0], NULL, run_thread, a);
  pthread_create(&t[1], NULL, run_thread, b);
  pthread_join(t[0], NULL);
  pthread_join(t[1], NULL);
  ck_assert_msg(a->rc == 0, "worker 0: %s", a->st.msg);
  ck_assert_msg(b->rc == 0, "worker 1: %s", b->st.msg);
}

static void read_model(double *w, double *b) {
  read_values("w", w, 3);
  read_values("b", b, 1);
}

/* (1) R = 2: every step applies w -= lr * mean(g0, g1), once. */
START_TEST(two_workers_average_each_step) {
  worker wk[2];
  worker_init(&wk[0], OPT_GD, 2, 2, 11);
  worker_init(&wk[1], OPT_GD, 2, 2, 23);
  initialize(&wk[0]);
  for (int t = 0; t < 5; t++) {
    double w[3], b, g0[4], g1[4];
    read_model(w, &b);
    new_batch(&wk[0]);
    new_batch(&wk[1]);
    gradient(&wk[0], w, b, g0);
    gradient(&wk[1], w, b, g1);
    int64_t before = global_step();
    ck_assert_int_eq(before, t);
    run_both(&wk[0], &wk[1]);
    double nw[3], nb;
    read_model(nw, &nb);
    for (int j = 0; j < 3; j++) {
      double want = w[j] - 0.1 * (g0[j] + g1[j]) / 2;
      ck_assert_msg(close_to(nw[j], want), "step %d: w[%d] = %.9g, want %.9g", t, j,
                    nw[j], want);
    }
    double wantb = b - 0.1 * (g0[3] + g1[3]) / 2;
    ck_assert_msg(close_to(nb, wantb), "step %d: b = %.9g, want %.9g", t, nb, wantb);
    ck_assert_int_eq(global_step(), t + 1); /* once per step, not per worker */
    for (int k = 0; k < 2; k++) {
      int reads, updates, applied, stale;
      ps_session_last_rpcs(wk[k].s, &reads, &updates);
      ck_assert_int_eq(reads, 2);   /* one Read per ps, global_step included */
      ck_assert_int_eq(updates, 2); /* one Update per ps */
      ps_session_last_sync(wk[k].s, &applied, &stale);
      ck_assert_int_eq(applied, 3); /* w, b, global_step */
      ck_assert_int_eq(stale, 0);
    }
  }
  worker_fini(&wk[0]);
  worker_fini(&wk[1]);
}
END_TEST

/* (3) R = 1 with two workers: each run applies on its own. */
START_TEST(one_replica_each_worker_proceeds) {
  worker wk[2];
  worker_init(&wk[0], OPT_GD, 1, 2, 5);
  worker_init(&wk[1], OPT_GD, 1, 2, 6);
  initialize(&wk[0]);
  /* one after the other: every run is a step of its own gradient */
  for (int t = 0; t < 4; t++) {
    worker *k = &wk[t % 2];
    double w[3], b, g[4];
    read_model(w, &b);
    new_batch(k);
    gradient(k, w, b, g);
    k->applied = k->stale = 0;
    run_once(k);
    PS_ASSERT_OK(k->rc, k->st);
    ck_assert_int_eq(k->applied, 3);
    double nw[3], nb;
    read_model(nw, &nb);
    for (int j = 0; j < 3; j++)
      ck_assert(close_to(nw[j], w[j] - 0.1 * g[j]));
    ck_assert(close_to(nb, b - 0.1 * g[3]));
    ck_assert_int_eq(global_step(), t + 1);
  }
  /* at the same time: nobody waits for anybody; a run that lost the race
   * for a step has its gradients dropped as stale and goes on */
  pthread_t th[2];
  for (int k = 0; k < 2; k++) {
    wk[k].steps = 10;
    wk[k].applied = wk[k].stale = 0;
    pthread_create(&th[k], NULL, run_loop, &wk[k]);
  }
  for (int k = 0; k < 2; k++)
    pthread_join(th[k], NULL);
  for (int k = 0; k < 2; k++) {
    ck_assert_msg(wk[k].rc == 0, "worker %d: %s", k, wk[k].st.msg);
    ck_assert_int_eq(wk[k].applied + wk[k].stale, 3 * 10);
  }
  int64_t gs = global_step();
  ck_assert_int_ge(gs, 4 + 10); /* each worker's runs are steps of their own */
  ck_assert_int_le(gs, 4 + 20);
  worker_fini(&wk[0]);
  worker_fini(&wk[1]);
}
END_TEST

/* (4) Adam: the TensorFlow formula on the mean gradient; slots and beta
 * powers advance once per step. */
START_TEST(adam_on_mean_gradient) {
  worker wk[2];
  worker_init(&wk[0], OPT_ADAM, 2, 2, 7);
  worker_init(&wk[1], OPT_ADAM, 2, 2, 8);
  initialize(&wk[0]);
  const double lr = 0.05, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  double m[4] = {0}, v[4] = {0}, b1p = b1, b2p = b2;
  for (int t = 0; t < 4; t++) {
    double p[4], g0[4], g1[4];
    read_model(p, &p[3]);
    new_batch(&wk[0]);
    new_batch(&wk[1]);
    gradient(&wk[0], p, p[3], g0);
    gradient(&wk[1], p, p[3], g1);
    run_both(&wk[0], &wk[1]);
    double alpha = lr * sqrt(1 - b2p) / (1 - b1p);
    double got[4];
    read_model(got, &got[3]);
    for (int j = 0; j < 4; j++) {
      double g = (g0[j] + g1[j]) / 2;
      m[j] += (g - m[j]) * (1 - b1);
      v[j] += (g * g - v[j]) * (1 - b2);
      double want = p[j] - m[j] * alpha / (sqrt(v[j]) + eps);
      ck_assert_msg(close_to(got[j], want), "step %d: param %d = %.9g, want %.9g", t, j,
                    got[j], want);
    }
    double mm[3], vv[3], mb, vb;
    read_values("w/Adam", mm, 3);
    read_values("w/Adam_1", vv, 3);
    read_values("b/Adam", &mb, 1);
    read_values("b/Adam_1", &vb, 1);
    for (int j = 0; j < 3; j++)
      ck_assert(close_to(mm[j], m[j]) && close_to(vv[j], v[j]));
    ck_assert(close_to(mb, m[3]) && close_to(vb, v[3]));
    b1p *= b1;
    b2p *= b2;
    double pw1, pw2;
    read_values("beta1_power", &pw1, 1);
    read_values("beta2_power", &pw2, 1);
    ck_assert_msg(close_to(pw1, b1p), "beta1_power %.9g, want %.9g", pw1, b1p);
    ck_assert_msg(close_to(pw2, b2p), "beta2_power %.9g, want %.9g", pw2, b2p);
    ck_assert_int_eq(global_step(), t + 1);
  }
  worker_fini(&wk[0]);
  worker_fini(&wk[1]);
}
END_TEST

/* (6) Sparse gradients (an embedding gather): each row is the sum of its
 * rows over the step's gradients divided by how many gradients had it. */
typedef struct emb_worker {
  ps_client *c;
  ps_graph *g;
  ps_session *s;
  ps_node *ids, *wts, *train;
  ps_tensor *tid, *twt;
  int rc;
  ps_status st;
} emb_worker;

static void emb_init(emb_worker *e, const int64_t *ids, const float *wts, int n) {
  memset(e, 0, sizeof *e);
  ps_status st;
  e->c = ps_client_create(H.cluster, "ps", NULL, &st);
  ck_assert_ptr_nonnull(e->c);
  e->g = ps_graph_create();
  ps_device_push_fn(e->g, ps_replica_device_setter(H.cluster, NULL));
  ps_variable *step = ps_create_global_step(e->g, &st);
  ps_init_spec u;
  ps_init_spec_default(&u, PS_INIT_RANDOM_UNIFORM);
  u.minval = -1;
  u.maxval = 1;
  u.seed = 3;
  ps_variable *emb =
      ps_get_variable(e->g, "emb", PS_DT_FLOAT, &(ps_shape){2, {6, 2}}, &u, NULL, &st);
  ck_assert_ptr_nonnull(emb);
  e->ids = ps_placeholder(e->g, PS_DT_INT64, &(ps_shape){1, {-1}}, "ids");
  e->wts = ps_placeholder(e->g, PS_DT_FLOAT, &(ps_shape){2, {-1, 2}}, "wts");
  ps_node *loss = ps_reduce_sum(ps_mul(ps_gather(ps_variable_value(emb), e->ids), e->wts),
                                PS_ALL_AXES, false);
  ps_optimizer *o = ps_sync_replicas_optimizer(ps_gradient_descent_optimizer(0.5), 2, 2);
  e->train = ps_optimizer_minimize(o, e->g, loss, step, NULL, 0, &st);
  ck_assert_msg(e->train != NULL, "%s", st.msg);
  ps_optimizer_destroy(o);
  e->s = ps_session_create(e->g, e->c, &st);
  e->tid = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {n}}, false);
  e->twt = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {n, 2}}, false);
  memcpy(ps_tensor_data(e->tid), ids, (size_t)n * sizeof *ids);
  memcpy(ps_tensor_data(e->twt), wts, (size_t)n * 2 * sizeof *wts);
}

static void emb_fini(emb_worker *e) {
  ps_tensor_destroy(e->tid);
  ps_tensor_destroy(e->twt);
  ps_session_destroy(e->s);
  ps_graph_destroy(e->g);
  ps_client_destroy(e->c);
}

static void *emb_run(void *arg) {
  emb_worker *e = arg;
  ps_feed f[2] = {{e->ids, e->tid}, {e->wts, e->twt}};
  e->rc = ps_session_run(e->s, f, 2, NULL, 0, &e->train, 1, NULL, &e->st);
  return NULL;
}

START_TEST(sparse_rows_average_per_index) {
  /* worker 0 touches rows 0, 2, 2 (a duplicate: summed, counted once);
   * worker 1 rows 2 and 5 */
  const int64_t ids0[3] = {0, 2, 2}, ids1[2] = {2, 5};
  const float w0[6] = {1, 2, 3, 4, 5, 6}, w1[4] = {-1, 0.5f, 2, -3};
  emb_worker e[2];
  emb_init(&e[0], ids0, w0, 3);
  emb_init(&e[1], ids1, w1, 2);
  ps_status st;
  ps_node *init = ps_global_variables_initializer(e[0].g);
  PS_ASSERT_OK(ps_session_run(e[0].s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  for (int t = 0; t < 2; t++) {
    double before[12], after[12];
    read_values("emb", before, 12);
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
      pthread_create(&th[k], NULL, emb_run, &e[k]);
    for (int k = 0; k < 2; k++)
      pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++)
      PS_ASSERT_OK(e[k].rc, e[k].st);
    read_values("emb", after, 12);
    double mean[6][2] = {{0}};
    for (int j = 0; j < 2; j++) {
      mean[0][j] = w0[j];                               /* one gradient had row 0 */
      mean[2][j] = (w0[2 + j] + w0[4 + j] + w1[j]) / 2; /* two had row 2 */
      mean[5][j] = w1[2 + j];                           /* one had row 5 */
    }
    for (int r = 0; r < 6; r++)
      for (int j = 0; j < 2; j++) {
        double want = before[r * 2 + j] - 0.5 * mean[r][j];
        ck_assert_msg(close_to(after[r * 2 + j], want),
                      "step %d: emb[%d][%d] = %.9g, want %.9g", t, r, j, after[r * 2 + j],
                      want);
      }
    ck_assert_int_eq(global_step(), t + 1);
    int reads, updates;
    ps_session_last_rpcs(e[0].s, &reads, &updates);
    ck_assert_int_eq(reads, 2);
    ck_assert_int_eq(updates, 2);
  }
  emb_fini(&e[0]);
  emb_fini(&e[1]);
}
END_TEST

/* ---- the wire level ---- */

static void make_var(const char *name, float value) {
  ps_status st;
  ps_init_spec c;
  ps_init_spec_default(&c, PS_INIT_CONSTANT);
  c.value = value;
  ps_var_spec v = {.name = name, .dtype = PS_DT_FLOAT, .shape = {1, {2}}, .init = &c};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &v, 1, &st), st);
  const char *nm[1] = {name};
  PS_ASSERT_OK(ps_client_initialize(C, 0, nm, 1, false, NULL, &st), st);
}

typedef struct sync_call {
  const char *name;
  float g[2];
  int replicas;
  int64_t step;
  ps_update_result res;
  int rc;
  ps_status st;
  atomic_bool done;
} sync_call;

/* Gradient descent (lr 0.5) with gradient @c->g, synchronous. */
static void *sync_send(void *arg) {
  sync_call *c = arg;
  ps_tensor *g = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){1, {2}}, false);
  memcpy(ps_tensor_data(g), c->g, sizeof c->g);
  double lr = 0.5;
  ps_update u = {.name = c->name,
                 .op = PS_APPLY_GRADIENT_DESCENT,
                 .value = g,
                 .hparams = &lr,
                 .nhparams = 1,
                 .replicas_to_aggregate = c->replicas,
                 .sync_local_step = c->step,
                 .result = &c->res};
  c->rc = ps_client_update(C, 0, &u, 1, &c->st);
  ps_tensor_destroy(g);
  atomic_store(&c->done, true);
  return NULL;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int64_t ps0_rpcs(void) {
  ps_task_status ts;
  ps_status st;
  PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
  return ts.rpcs;
}

/* Starts @c in a thread and returns once ps/0 has received it (its RPC
 * count, which our own Status calls also raise, went up by one more). */
static pthread_t send_in_background(sync_call *c) {
  int64_t n0 = ps0_rpcs();
  pthread_t th;
  pthread_create(&th, NULL, sync_send, c);
  for (int k = 1; ps0_rpcs() < n0 + k + 1; k++) {
    ck_assert_msg(k < 1000, "the update never reached ps/0");
    sleep_ms(10);
  }
  sleep_ms(100); /* its (inline) data is processed with its header */
  return th;
}

/* (2) A gradient older than the accumulator's step is dropped. */
START_TEST(stale_gradient_is_dropped) {
  make_var("v", 1.0f);
  double v[2];
  sync_call c = {.name = "v", .g = {1, 2}, .replicas = 1, .step = 5};
  sync_send(&c); /* a new accumulator starts at the first local step */
  PS_ASSERT_OK(c.rc, c.st);
  ck_assert(!c.res.stale);
  ck_assert_int_eq(c.res.sync_step, 6);
  read_values("v", v, 2);
  ck_assert(close_to(v[0], 0.5) && close_to(v[1], 0.0));
  for (int64_t old = 5; old >= 4; old--) {
    sync_call s = {.name = "v", .g = {10, 10}, .replicas = 1, .step = old};
    sync_send(&s);
    PS_ASSERT_OK(s.rc, s.st);
    ck_assert(s.res.stale);
    ck_assert_int_eq(s.res.sync_step, 6);
    read_values("v", v, 2);
    ck_assert(close_to(v[0], 0.5) && close_to(v[1], 0.0)); /* unchanged */
  }
  sync_call n = {.name = "v", .g = {1, 1}, .replicas = 1, .step = 6};
  sync_send(&n);
  ck_assert(!n.res.stale);
  ck_assert_int_eq(n.res.sync_step, 7);
  read_values("v", v, 2);
  ck_assert(close_to(v[0], 0.0) && close_to(v[1], -0.5));
}
END_TEST

/* A call waits for its step; an asynchronous update of the same variable
 * applies at once meanwhile; updates that disagree with the step waiting
 * are refused by name. */
START_TEST(waiting_mixing_and_errors) {
  make_var("m", 0.0f);
  sync_call a = {.name = "m", .g = {2, 4}, .replicas = 2, .step = 0};
  pthread_t th = send_in_background(&a);
  ck_assert(!atomic_load(&a.done)); /* parked until a second gradient */
  /* asynchronous: applies now, the accumulator is not involved */
  sync_call async = {.name = "m", .g = {1, 1}, .replicas = 0};
  sync_send(&async);
  PS_ASSERT_OK(async.rc, async.st);
  double v[2];
  read_values("m", v, 2);
  ck_assert(close_to(v[0], -0.5) && close_to(v[1], -0.5));
  ck_assert(!atomic_load(&a.done));
  /* a different replicas_to_aggregate for the step being aggregated */
  sync_call bad = {.name = "m", .g = {0, 0}, .replicas = 3, .step = 0};
  sync_send(&bad);
  PS_ASSERT_STATUS(bad.rc, bad.st, PS_INVALID_ARGUMENT,
                   "replicas_to_aggregate is 3 but step 0 is aggregating 2");
  sync_call neg = {.name = "m", .g = {0, 0}, .replicas = -1};
  sync_send(&neg);
  PS_ASSERT_STATUS(neg.rc, neg.st, PS_INVALID_ARGUMENT,
                   "replicas_to_aggregate must be positive");
  /* a sparse gradient for the dense step being aggregated */
  {
    ps_status st;
    ps_tensor *row = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){1, {1}}, true);
    ps_tensor *ix = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {1}}, true);
    double lr = 0.5;
    ps_update sp = {.name = "m",
                    .op = PS_APPLY_GRADIENT_DESCENT,
                    .value = row,
                    .indices = ix,
                    .hparams = &lr,
                    .nhparams = 1,
                    .replicas_to_aggregate = 2};
    PS_ASSERT_STATUS(ps_client_update(C, 0, &sp, 1, &st), st, PS_INVALID_ARGUMENT,
                     "synchronous update of m: SparseApplyGradientDescent does "
                     "not match ApplyGradientDescent of step 0");
    ps_tensor_destroy(row);
    ps_tensor_destroy(ix);
  }
  /* the second gradient completes the step: mean (3, 5) * 0.5 */
  sync_call b = {.name = "m", .g = {4, 6}, .replicas = 2, .step = 0};
  sync_send(&b);
  pthread_join(th, NULL);
  ck_assert_msg(a.rc == 0 && b.rc == 0, "%s / %s", a.st.msg, b.st.msg);
  ck_assert(!a.res.stale && !b.res.stale);
  ck_assert_int_eq(a.res.sync_step, 1);
  ck_assert_int_eq(b.res.sync_step, 1);
  ck_assert_int_eq(a.res.version, b.res.version);
  read_values("m", v, 2);
  ck_assert(close_to(v[0], -0.5 - 1.5) && close_to(v[1], -0.5 - 2.5));
  /* scatter ops cannot be synchronous; two synchronous updates of one
   * variable in one request are refused */
  ps_status st;
  ps_tensor *rows = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){1, {1}}, true);
  ps_tensor *idx = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {1}}, true);
  ps_update sc = {.name = "m",
                  .op = PS_SCATTER_ADD,
                  .value = rows,
                  .indices = idx,
                  .replicas_to_aggregate = 1};
  PS_ASSERT_STATUS(ps_client_update(C, 0, &sc, 1, &st), st, PS_INVALID_ARGUMENT,
                   "scatter updates cannot be synchronous");
  ps_tensor *g = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){1, {2}}, true);
  double lr = 0.1;
  ps_update two[2] = {{.name = "m",
                       .op = PS_APPLY_GRADIENT_DESCENT,
                       .value = g,
                       .hparams = &lr,
                       .nhparams = 1,
                       .replicas_to_aggregate = 1,
                       .sync_local_step = 1},
                      {.name = "m",
                       .op = PS_APPLY_GRADIENT_DESCENT,
                       .value = g,
                       .hparams = &lr,
                       .nhparams = 1,
                       .replicas_to_aggregate = 1,
                       .sync_local_step = 1}};
  PS_ASSERT_STATUS(ps_client_update(C, 0, two, 2, &st), st, PS_INVALID_ARGUMENT,
                   "two synchronous updates of m");
  /* a variable without a value */
  ps_var_spec un = {.name = "uninit", .dtype = PS_DT_FLOAT, .shape = {1, {2}}};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &un, 1, &st), st);
  sync_call u = {.name = "uninit", .g = {1, 1}, .replicas = 1};
  sync_send(&u);
  PS_ASSERT_STATUS(u.rc, u.st, PS_FAILED_PRECONDITION,
                   "Attempting to use uninitialized value uninit");
  ps_tensor_destroy(rows);
  ps_tensor_destroy(idx);
  ps_tensor_destroy(g);
}
END_TEST

/* minimize() names what is wrong with the settings. */
START_TEST(settings_are_checked) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_variable *step = ps_create_global_step(g, &st);
  ps_variable *w =
      ps_get_variable(g, "w", PS_DT_FLOAT, &(ps_shape){1, {2}}, NULL, NULL, &st);
  ps_node *loss = ps_reduce_sum(ps_square(ps_variable_value(w)), PS_ALL_AXES, false);
  struct {
    int r, total;
    bool step;
    const char *msg;
  } cases[] = {
      {0, 2, true, "replicas_to_aggregate must be at least 1, got 0"},
      {3, 2, true, "replicas_to_aggregate (3) is larger than total_num_replicas (2)"},
      {2, -1, true, "total_num_replicas must be positive"},
      {2, 2, false, "Global step is required to check staleness"},
      {2, 2, true, "global_step w must be an integer scalar variable, got float [2]"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ps_optimizer *o = ps_sync_replicas_optimizer(ps_gradient_descent_optimizer(0.1),
                                                 cases[i].r, cases[i].total);
    ps_status_clear(&st);
    ps_variable *gs = !cases[i].step ? NULL : i == 4 ? w : step;
    ps_node *t = ps_optimizer_minimize(o, g, loss, gs, NULL, 0, &st);
    ck_assert_ptr_null(t);
    PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, cases[i].msg);
    ps_optimizer_destroy(o);
  }
  ps_graph_destroy(g);
}
END_TEST

/* (5) SIGTERM while a call waits for its step: the ps exits 0 at once and
 * the call fails instead of hanging. */
START_TEST(sigterm_fails_waiting_call) {
  make_var("p", 1.0f);
  sync_call a = {.name = "p", .g = {1, 1}, .replicas = 2, .step = 0};
  pthread_t th = send_in_background(&a);
  ck_assert(!atomic_load(&a.done));
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_int_eq(harness_stop(&H), 0); /* every ps exited 0 */
  pthread_join(th, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  ck_assert_msg(secs < 5, "stopping took %.1f s (the grace period is 10 s)", secs);
  PS_ASSERT_STATUS(a.rc, a.st, PS_UNAVAILABLE, "shutting down");
}
END_TEST

int main(void) {
  Suite *s = suite_create("sync");
  TCase *tc = tcase_create("sync");
  tcase_set_timeout(tc, 240);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, two_workers_average_each_step);
  tcase_add_test(tc, stale_gradient_is_dropped);
  tcase_add_test(tc, one_replica_each_worker_proceeds);
  tcase_add_test(tc, adam_on_mean_gradient);
  tcase_add_test(tc, sigterm_fails_waiting_call);
  tcase_add_test(tc, sparse_rows_average_per_index);
  tcase_add_test(tc, waiting_mixing_and_errors);
  tcase_add_test(tc, settings_are_checked);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
