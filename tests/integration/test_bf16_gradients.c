/* Gradients sent to the ps as bfloat16 (ps_optimizer_set_gradient_dtype,
 * ps-worker --gradient-dtype): real ps-server processes, graphs run by a
 * session, the variables read back.
 *
 * The graph is loss = sum(w * x) + sum(gather(emb, ids) * rows), so the
 * gradients are exactly the fed x (dense) and rows (sparse, one row per
 * id, a duplicate id included).  With a learning rate of 0.5 the product
 * gradient * lr is exact, so the expected variables are computed here in
 * float, element by element in the ps kernel's order, from the gradient
 * rounded to bfloat16 by this file's own rounding (nearest even) or not
 * rounded, and compared for equality.  Every fed value is checked to be
 * one bfloat16 cannot hold, so a gradient sent unrounded fails the test.
 * Adagrad sums a duplicate id's rows in the graph first: its run is
 * compared with the same step fed the sums already rounded. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/partition.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

static ps_harness H;
static ps_client *C;

static void setup(void) {
  C = harness_start_client(&H, 1, NULL);
  ck_assert_ptr_nonnull(C);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

/* ---- the data and the reference ---- */

enum { NW = 4, VOCAB = 6, DIM = 3, NIDS = 5 };
static const float LR = 0.5f;
static const float W0[NW] = {1.f, 2.f, -3.f, 4.f};
static const float X[NW] = {0.1f, 1.f / 3.f, -2.7182817f, 0.007f};
static const int64_t IDS_DUP[NIDS] = {4, 1, 4, 0, 2};  /* id 4 twice */
static const int64_t IDS_UNIQ[NIDS] = {4, 1, 0, 2, 5}; /* each once */

static float emb0(int i) {
  return (float)i * 0.25f - 2.f;
}
static float row(int k, int j) {
  return (float)(k * DIM + j + 1) / 9.7f * (k % 2 ? -1.f : 1.f);
}

/* float to bfloat16 and back, rounded to nearest even (finite values). */
static float bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  x = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
  memcpy(&f, &x, sizeof f);
  return f;
}

/* The variables after one GradientDescent step: dense w -= lr * g, sparse
 * rows one after another as SparseApplyGradientDescent applies them. */
static void gd_expect(bool round, const int64_t *ids, float *w, float *emb) {
  for (int i = 0; i < NW; i++) {
    float g = round ? bf16(X[i]) : X[i];
    w[i] = W0[i] - g * LR;
  }
  for (int i = 0; i < VOCAB * DIM; i++)
    emb[i] = emb0(i);
  for (int k = 0; k < NIDS; k++)
    for (int j = 0; j < DIM; j++) {
      float g = round ? bf16(row(k, j)) : row(k, j);
      emb[ids[k] * DIM + j] -= g * LR;
    }
}

/* ---- the graph ---- */

typedef struct net {
  ps_graph *g;
  ps_variable *w, *emb, *step;
  ps_node *x, *ids, *rows, *train, *assign[2];
  ps_optimizer *opt;
  ps_session *s;
} net;

static ps_tensor *ftensor(ps_shape s, const float *v) {
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  ck_assert_ptr_nonnull(t);
  memcpy(ps_tensor_data(t), v, (size_t)ps_shape_num_elements(&s) * sizeof(float));
  return t;
}

/* Builds the graph under variable scope @scope with optimizer @opt (owned
 * by @n), on the harness's ps when @remote, else held by the session;
 * initializes w and emb to W0 and emb0. */
static void build(net *n, const char *scope, ps_optimizer *opt, bool remote,
                  bool global_step) {
  ps_status st;
  memset(n, 0, sizeof *n);
  n->g = ps_graph_create();
  n->opt = opt;
  ck_assert_ptr_nonnull(opt);
  ps_graph *g = n->g;
  if (remote) ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  if (global_step) {
    n->step = ps_create_global_step(g, &st);
    ck_assert_msg(n->step != NULL, "%s", st.msg);
  }
  PS_ASSERT_OK(ps_variable_scope_push(g, scope, PS_REUSE_NONE, &st), st);
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  n->w = ps_get_variable(g, "w", PS_DT_FLOAT, &(ps_shape){1, {NW}}, &z, NULL, &st);
  ck_assert_msg(n->w != NULL, "%s", st.msg);
  n->emb =
      ps_get_variable(g, "emb", PS_DT_FLOAT, &(ps_shape){2, {VOCAB, DIM}}, &z, NULL, &st);
  ck_assert_msg(n->emb != NULL, "%s", st.msg);
  ps_variable_scope_pop(g);
  n->x = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){1, {NW}}, "x");
  n->ids = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "ids");
  n->rows = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, DIM}}, "rows");
  ps_node *dense =
      ps_reduce_sum(ps_mul(ps_variable_value(n->w), n->x), PS_ALL_AXES, false);
  ps_node *sparse = ps_reduce_sum(
      ps_mul(ps_gather(ps_variable_value(n->emb), n->ids), n->rows), PS_ALL_AXES, false);
  ps_node *loss = ps_add(dense, sparse);
  n->train = ps_optimizer_minimize(opt, g, loss, n->step, NULL, 0, &st);
  ck_assert_msg(n->train != NULL, "minimize: %s", st.msg);
  float e0[VOCAB * DIM];
  for (int i = 0; i < VOCAB * DIM; i++)
    e0[i] = emb0(i);
  ps_tensor *tw = ftensor((ps_shape){1, {NW}}, W0);
  ps_tensor *te = ftensor((ps_shape){2, {VOCAB, DIM}}, e0);
  n->assign[0] = ps_assign(n->w, ps_constant(g, tw, "w0"));
  n->assign[1] = ps_assign(n->emb, ps_constant(g, te, "emb0"));
  ps_tensor_destroy(tw);
  ps_tensor_destroy(te);
  ck_assert_msg(ps_graph_status(g)->code == PS_OK, "%s", ps_graph_status(g)->msg);
  n->s = ps_session_create(g, remote ? C : NULL, &st);
  ck_assert_msg(n->s != NULL, "%s", st.msg);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(n->s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  PS_ASSERT_OK(ps_session_run(n->s, NULL, 0, NULL, 0, n->assign, 2, NULL, &st), st);
}

/* One train step fed x and the sparse gradient (@nids ids, @r rows). */
static void step(net *n, const int64_t *ids, size_t nids, const float *r) {
  ps_status st;
  ps_tensor *tx = ftensor((ps_shape){1, {NW}}, X);
  ps_tensor *tr = ftensor((ps_shape){2, {(int64_t)nids, DIM}}, r);
  ps_tensor *ti = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {(int64_t)nids}}, false);
  ck_assert_ptr_nonnull(ti);
  memcpy(ps_tensor_data(ti), ids, nids * sizeof *ids);
  ps_feed f[3] = {{n->x, tx}, {n->ids, ti}, {n->rows, tr}};
  PS_ASSERT_OK(ps_session_run(n->s, f, 3, NULL, 0, &n->train, 1, NULL, &st), st);
  ps_tensor_destroy(tx);
  ps_tensor_destroy(tr);
  ps_tensor_destroy(ti);
}

/* The fed rows of the step: row(k, j). */
static void fed_rows(float *r) {
  for (int k = 0; k < NIDS; k++)
    for (int j = 0; j < DIM; j++)
      r[k * DIM + j] = row(k, j);
}

/* Reads @v (float, @ne elements) into @out. */
static void read_back(net *n, ps_variable *v, float *out, int64_t ne) {
  ps_status st;
  ps_node *f = ps_variable_value(v);
  ps_tensor *t = NULL;
  PS_ASSERT_OK(ps_session_run(n->s, NULL, 0, &f, 1, NULL, 0, &t, &st), st);
  ck_assert_int_eq(t->dtype, PS_DT_FLOAT);
  ck_assert_int_eq(ps_tensor_num_elements(t), ne);
  memcpy(out, ps_tensor_data(t), (size_t)ne * sizeof *out);
  ps_tensor_destroy(t);
}

static void expect_equal(const char *what, const float *got, const float *want, int n) {
  for (int i = 0; i < n; i++)
    ck_assert_msg(got[i] == want[i], "%s[%d] = %.9g, want %.9g", what, i, got[i],
                  want[i]);
}

/* Checks the variables of @n against gd_expect(@round, @ids). */
static void expect_gd(net *n, bool round, const int64_t *ids) {
  float w[NW], emb[VOCAB * DIM], gw[NW], gemb[VOCAB * DIM];
  gd_expect(round, ids, w, emb);
  read_back(n, n->w, gw, NW);
  read_back(n, n->emb, gemb, VOCAB * DIM);
  expect_equal("w", gw, w, NW);
  expect_equal("emb", gemb, emb, VOCAB * DIM);
}

static void net_free(net *n) {
  ps_session_destroy(n->s);
  ps_optimizer_destroy(n->opt);
  ps_graph_destroy(n->g);
}

/* ---- the tests ---- */

/* Without rounding the test could not tell the two apart. */
START_TEST(fed_values_are_not_bfloat16) {
  for (int i = 0; i < NW; i++)
    ck_assert_msg(bf16(X[i]) != X[i], "x[%d] is a bfloat16", i);
  for (int k = 0; k < NIDS; k++)
    for (int j = 0; j < DIM; j++)
      ck_assert_msg(bf16(row(k, j)) != row(k, j), "row %d,%d is a bfloat16", k, j);
}
END_TEST

START_TEST(gradient_descent_step_with_bf16_gradients) {
  ps_status st;
  ps_optimizer *o = ps_gradient_descent_optimizer(LR);
  PS_ASSERT_OK(ps_optimizer_set_gradient_dtype(o, PS_DT_BFLOAT16, &st), st);
  /* a refused dtype leaves the setting as it was */
  PS_ASSERT_STATUS(ps_optimizer_set_gradient_dtype(o, PS_DT_INT32, &st), st,
                   PS_INVALID_ARGUMENT,
                   "set_gradient_dtype: gradients go to the ps as float or bfloat16, "
                   "not int32");
  net n;
  build(&n, "gd", o, true, true);
  float r[NIDS * DIM];
  fed_rows(r);
  step(&n, IDS_DUP, NIDS, r);
  expect_gd(&n, true, IDS_DUP);
  /* global_step is an int64 assign_add, untouched by the setting */
  ps_node *gs = ps_variable_value(n.step);
  ps_tensor *t = NULL;
  PS_ASSERT_OK(ps_session_run(n.s, NULL, 0, &gs, 1, NULL, 0, &t, &st), st);
  ck_assert_int_eq(t->dtype, PS_DT_INT64);
  ck_assert_int_eq(*(int64_t *)ps_tensor_data(t), 1);
  ps_tensor_destroy(t);
  net_free(&n);
}
END_TEST

START_TEST(float_gradients_unchanged) {
  ps_status st;
  /* the default */
  net n;
  build(&n, "default", ps_gradient_descent_optimizer(LR), true, true);
  float r[NIDS * DIM];
  fed_rows(r);
  step(&n, IDS_DUP, NIDS, r);
  expect_gd(&n, false, IDS_DUP);
  net_free(&n);
  /* set back to float */
  ps_optimizer *o = ps_gradient_descent_optimizer(LR);
  PS_ASSERT_OK(ps_optimizer_set_gradient_dtype(o, PS_DT_BFLOAT16, &st), st);
  PS_ASSERT_OK(ps_optimizer_set_gradient_dtype(o, PS_DT_FLOAT, &st), st);
  build(&n, "float", o, true, false);
  step(&n, IDS_DUP, NIDS, r);
  expect_gd(&n, false, IDS_DUP);
  net_free(&n);
}
END_TEST

/* Set on the SyncReplicasOptimizer: forwarded to the wrapped one; the ps
 * averages the widened gradients. */
START_TEST(sync_replicas_forwards_the_setting) {
  ps_status st;
  ps_optimizer *o = ps_sync_replicas_optimizer(ps_gradient_descent_optimizer(LR), 1, 1);
  PS_ASSERT_OK(ps_optimizer_set_gradient_dtype(o, PS_DT_BFLOAT16, &st), st);
  net n;
  build(&n, "sync", o, true, true);
  float r[NIDS * DIM];
  fed_rows(r);
  step(&n, IDS_UNIQ, NIDS, r);
  expect_gd(&n, true, IDS_UNIQ);
  net_free(&n);
}
END_TEST

/* Adagrad sums a duplicate id's rows in float32 in the graph, then the sum
 * is rounded once: the same as the option off fed those sums rounded. */
START_TEST(adagrad_rounds_each_distinct_row_once) {
  ps_status st;
  ps_optimizer *o = ps_adagrad_optimizer(LR, 0.1);
  PS_ASSERT_OK(ps_optimizer_set_gradient_dtype(o, PS_DT_BFLOAT16, &st), st);
  net a, b;
  build(&a, "a", o, true, false);
  build(&b, "b", ps_adagrad_optimizer(LR, 0.1), true, false);
  float r[NIDS * DIM];
  fed_rows(r);
  step(&a, IDS_DUP, NIDS, r);
  /* ids 4, 1, 4, 0, 2: distinct 4, 1, 0, 2 (first-occurrence order) */
  const int64_t uniq[4] = {4, 1, 0, 2};
  float sums[4 * DIM];
  for (int j = 0; j < DIM; j++) {
    sums[0 * DIM + j] = bf16(r[0 * DIM + j] + r[2 * DIM + j]);
    sums[1 * DIM + j] = bf16(r[1 * DIM + j]);
    sums[2 * DIM + j] = bf16(r[3 * DIM + j]);
    sums[3 * DIM + j] = bf16(r[4 * DIM + j]);
  }
  step(&b, uniq, 4, sums); /* (b's dense gradient is not rounded: emb only) */
  float ea[VOCAB * DIM], eb[VOCAB * DIM];
  read_back(&a, a.emb, ea, VOCAB * DIM);
  read_back(&b, b.emb, eb, VOCAB * DIM);
  expect_equal("emb", ea, eb, VOCAB * DIM);
  /* and it is not the unrounded step */
  net c;
  build(&c, "c", ps_adagrad_optimizer(LR, 0.1), true, false);
  step(&c, IDS_DUP, NIDS, r);
  float ec[VOCAB * DIM];
  read_back(&c, c.emb, ec, VOCAB * DIM);
  ck_assert_msg(memcmp(ea, ec, sizeof ea) != 0, "bfloat16 and float steps agree");
  net_free(&a);
  net_free(&b);
  net_free(&c);
}
END_TEST

/* Variables the session holds itself are updated in float32: nothing goes
 * on a wire. */
START_TEST(in_process_variables_ignore_the_setting) {
  ps_status st;
  ps_optimizer *o = ps_gradient_descent_optimizer(LR);
  PS_ASSERT_OK(ps_optimizer_set_gradient_dtype(o, PS_DT_BFLOAT16, &st), st);
  net n;
  build(&n, "local", o, false, false);
  float r[NIDS * DIM];
  fed_rows(r);
  step(&n, IDS_DUP, NIDS, r);
  expect_gd(&n, false, IDS_DUP);
  net_free(&n);
}
END_TEST

START_TEST(refused_dtypes) {
  ps_status st;
  ps_optimizer *o = ps_gradient_descent_optimizer(LR);
  PS_ASSERT_STATUS(ps_optimizer_set_gradient_dtype(o, PS_DT_HALF, &st), st,
                   PS_INVALID_ARGUMENT,
                   "set_gradient_dtype: gradients go to the ps as float or bfloat16, "
                   "not half");
  PS_ASSERT_STATUS(ps_optimizer_set_gradient_dtype(o, PS_DT_DOUBLE, &st), st,
                   PS_INVALID_ARGUMENT, "not double");
  PS_ASSERT_STATUS(ps_optimizer_set_gradient_dtype(NULL, PS_DT_BFLOAT16, &st), st,
                   PS_INVALID_ARGUMENT, "set_gradient_dtype: no optimizer");
  ps_optimizer_destroy(o);
}
END_TEST

/* ---- ps-worker --gradient-dtype ---- */

/* Runs ps-worker with @args: exit status @want_rc, and the output holds
 * @want_text and @also (when not NULL). */
static void expect_run(const char *args, int want_rc, const char *want_text,
                       const char *also) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' %s",
           harness_prog("PS_WORKER", "build/worker/ps-worker"), args);
  char *out = NULL;
  int rc = harness_run(cmd, &out);
  ck_assert_msg(rc == want_rc && strstr(out, want_text) != NULL &&
                    (also == NULL || strstr(out, also) != NULL),
                "%s: exit %d (want %d), output lacks \"%s\" or \"%s\":\n%s", cmd, rc,
                want_rc, want_text, also ? also : "", out);
  free(out);
}

START_TEST(ps_worker_flag) {
  expect_run("--help", 0, "--gradient-dtype T    float or bfloat16", NULL);
  expect_run("--gradient-dtype half", 2,
             "ps-worker: unknown --gradient-dtype 'half' (float, bfloat16)", NULL);
  expect_run("--import-meta /nonexistent.meta --gradient-dtype bfloat16", 2,
             "ps-worker: --gradient-dtype bfloat16 applies to the built-in models' "
             "optimizers, not to an --import-meta graph",
             NULL);
  char args[1024];
  snprintf(
      args, sizeof args,
      "--cluster '%s' --job worker --task 0 --model linreg --steps 30 --log-every 10 "
      "--gradient-dtype bfloat16 --keep-ps",
      H.spec);
  expect_run(args, 0, "gradients go to the ps as bfloat16 (--gradient-dtype)",
             "test mse");
}
END_TEST

int main(void) {
  Suite *s = suite_create("bf16_gradients");
  TCase *tc = tcase_create("bf16_gradients");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, fed_values_are_not_bfloat16);
  tcase_add_test(tc, gradient_descent_step_with_bf16_gradients);
  tcase_add_test(tc, float_gradients_unchanged);
  tcase_add_test(tc, sync_replicas_forwards_the_setting);
  tcase_add_test(tc, adagrad_rounds_each_distinct_row_once);
  tcase_add_test(tc, in_process_variables_ignore_the_setting);
  tcase_add_test(tc, refused_dtypes);
  tcase_add_test(tc, ps_worker_flag);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
