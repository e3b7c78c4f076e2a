/* Training through real ps processes: linear regression learns the known
 * weights on 2 ps; a Fashion-MNIST-shaped MLP's loss falls; a partitioned
 * embedding table trains with sparse updates; one RPC per ps per step. */
#include <check.h>
#include <math.h>
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
  C = harness_start_client(&H, 2, NULL);
  ck_assert_ptr_nonnull(C);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

static float frand(unsigned *s) {
  return (float)rand_r(s) / (float)RAND_MAX;
}

static float run_loss(ps_session *s, ps_feed *f, size_t nf, ps_node *loss,
                      ps_node *train) {
  ps_status st;
  ps_tensor *out = NULL;
  int rc =
      ps_session_run(s, f, nf, &loss, 1, train ? &train : NULL, train ? 1 : 0, &out, &st);
  PS_ASSERT_OK(rc, st);
  float v = *(float *)ps_tensor_data(out);
  ps_tensor_destroy(out);
  return v;
}

START_TEST(linear_regression_learns_known_weights) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_variable *step = ps_create_global_step(g, &st);
  ps_shape xs = {2, {-1, 3}}, ys = {2, {-1, 1}}, ws = {2, {3, 1}}, bs = {1, {1}};
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &xs, "x");
  ps_node *y = ps_placeholder(g, PS_DT_FLOAT, &ys, "y");
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_variable *w = ps_get_variable(g, "w", PS_DT_FLOAT, &ws, &z, NULL, &st);
  ps_variable *b = ps_get_variable(g, "b", PS_DT_FLOAT, &bs, &z, NULL, &st);
  ck_assert_int_ne(ps_variable_task(w), ps_variable_task(b)); /* spread over both ps */
  ps_node *loss = ps_mean_squared_error(
      y, ps_bias_add(ps_matmul(x, ps_variable_value(w), false, false),
                     ps_variable_value(b)));
  ps_optimizer *opt = ps_gradient_descent_optimizer(0.2);
  ps_node *train = ps_optimizer_minimize(opt, g, loss, step, NULL, 0, &st);
  ck_assert_msg(train != NULL, "%s", st.msg);
  ps_node *init = ps_global_variables_initializer(g);
  ps_session *s = ps_session_create(g, C, &st);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  const float tw[3] = {1.5f, -2.f, 0.25f}, tb = -0.5f;
  ps_tensor *bx = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {32, 3}}, false);
  ps_tensor *by = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {32, 1}}, false);
  unsigned seed = 3;
  float first = 0, last = 0;
  for (int it = 0; it < 300; it++) {
    for (int i = 0; i < 32; i++) {
      float acc = tb;
      for (int j = 0; j < 3; j++) {
        float v = frand(&seed) * 2 - 1;
        ((float *)ps_tensor_data(bx))[i * 3 + j] = v;
        acc += v * tw[j];
      }
      ((float *)ps_tensor_data(by))[i] = acc;
    }
    ps_feed f[2] = {{x, bx}, {y, by}};
    last = run_loss(s, f, 2, loss, train);
    if (it == 0) first = last;
    if (it == 0) {
      int reads, updates;
      ps_session_last_rpcs(s, &reads, &updates);
      ck_assert_int_eq(reads, 2);   /* one Read per ps */
      ck_assert_int_eq(updates, 2); /* one Update per ps */
    }
  }
  ck_assert(last < first * 1e-4f);
  ps_node *fetch[3] = {ps_variable_value(w), ps_variable_value(b),
                       ps_variable_value(step)};
  ps_tensor *out[3];
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, fetch, 3, NULL, 0, out, &st), st);
  for (int j = 0; j < 3; j++)
    ck_assert_msg(fabsf(((float *)ps_tensor_data(out[0]))[j] - tw[j]) < 1e-3f, "w[%d]",
                  j);
  ck_assert(fabsf(((float *)ps_tensor_data(out[1]))[0] - tb) < 1e-3f);
  ck_assert_int_eq(*(int64_t *)ps_tensor_data(out[2]), 300);
  for (int k = 0; k < 3; k++)
    ps_tensor_destroy(out[k]);
  ps_tensor_destroy(bx);
  ps_tensor_destroy(by);
  ps_session_destroy(s);
  ps_optimizer_destroy(opt);
  ps_graph_destroy(g);
}
END_TEST

/* 784-64-10 MLP on Fashion-MNIST-shaped synthetic data (each class has its
 * own mean image); Adam; the loss falls within a few steps. */
START_TEST(mlp_loss_falls) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_variable *step = ps_create_global_step(g, &st);
  ps_shape xs = {2, {-1, 784}}, ls = {1, {-1}};
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &xs, "images");
  ps_node *labels = ps_placeholder(g, PS_DT_INT64, &ls, "labels");
  PS_ASSERT_OK(ps_variable_scope_push(g, "hidden", PS_REUSE_NONE, &st), st);
  ps_variable *w1 = ps_get_variable(g, "weights", PS_DT_FLOAT, &(ps_shape){2, {784, 64}},
                                    NULL, NULL, &st);
  ps_variable *b1 =
      ps_get_variable(g, "biases", PS_DT_FLOAT, &(ps_shape){1, {64}}, NULL, NULL, &st);
  ps_variable_scope_pop(g);
  PS_ASSERT_OK(ps_variable_scope_push(g, "softmax", PS_REUSE_NONE, &st), st);
  ps_variable *w2 = ps_get_variable(g, "weights", PS_DT_FLOAT, &(ps_shape){2, {64, 10}},
                                    NULL, NULL, &st);
  ps_variable *b2 =
      ps_get_variable(g, "biases", PS_DT_FLOAT, &(ps_shape){1, {10}}, NULL, NULL, &st);
  ps_variable_scope_pop(g);
  ck_assert_ptr_nonnull(b2);
  ps_node *h = ps_relu(ps_bias_add(ps_matmul(x, ps_variable_value(w1), false, false),
                                   ps_variable_value(b1)));
  ps_node *logits = ps_bias_add(ps_matmul(h, ps_variable_value(w2), false, false),
                                ps_variable_value(b2));
  ps_node *loss = ps_reduce_mean(
      ps_sparse_softmax_cross_entropy_with_logits(labels, logits), PS_ALL_AXES, false);
  ps_optimizer *opt = ps_adam_optimizer(0.001, 0.9, 0.999, 1e-8);
  ps_node *train = ps_optimizer_minimize(opt, g, loss, step, NULL, 0, &st);
  ck_assert_msg(train != NULL, "%s", st.msg);
  /* slots are named and placed as TensorFlow does */
  ck_assert_ptr_nonnull(ps_graph_find_node(g, "hidden/weights/Adam"));
  ck_assert_ptr_nonnull(ps_graph_find_node(g, "hidden/weights/Adam_1"));
  ck_assert_ptr_nonnull(ps_graph_find_node(g, "beta1_power"));
  ck_assert_str_eq(ps_node_device(ps_graph_find_node(g, "hidden/weights/Adam")),
                   ps_variable_device(w1));
  ps_node *init = ps_global_variables_initializer(g);
  ps_session *s = ps_session_create(g, C, &st);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  enum { B = 64 };
  ps_tensor *bx = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {B, 784}}, false);
  ps_tensor *bl = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {B}}, false);
  float *means = malloc(10 * 784 * sizeof *means);
  unsigned seed = 11;
  for (int i = 0; i < 10 * 784; i++)
    means[i] = frand(&seed);
  float first = 0, last = 0;
  for (int it = 0; it < 40; it++) {
    for (int i = 0; i < B; i++) {
      int c = rand_r(&seed) % 10;
      ((int64_t *)ps_tensor_data(bl))[i] = c;
      for (int k = 0; k < 784; k++)
        ((float *)ps_tensor_data(bx))[i * 784 + k] =
            means[c * 784 + k] + 0.3f * (frand(&seed) - 0.5f);
    }
    ps_feed f[2] = {{x, bx}, {labels, bl}};
    last = run_loss(s, f, 2, loss, train);
    if (it == 0) first = last;
  }
  ck_assert_msg(last < first * 0.5f, "loss %f -> %f", first, last);
  free(means);
  ps_tensor_destroy(bx);
  ps_tensor_destroy(bl);
  ps_session_destroy(s);
  ps_optimizer_destroy(opt);
  ps_graph_destroy(g);
}
END_TEST

/* A [10,4] table in 3 parts (4,3,3 rows) over 2 ps, looked up with the div
 * strategy; values equal the full table's rows; Adagrad with sparse rows
 * lowers the loss and leaves untouched rows unchanged. */
START_TEST(partitioned_embedding_trains_with_sparse_updates) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_init_spec rn;
  ps_init_spec_default(&rn, PS_INIT_RANDOM_NORMAL);
  rn.seed = 5;
  ps_partitioner part = {.kind = PS_PART_FIXED, .num_shards = 3};
  ps_partitioned_variable *emb = ps_get_partitioned_variable(
      g, "emb", PS_DT_FLOAT, &(ps_shape){2, {10, 4}}, &rn, &part, NULL, &st);
  ck_assert_msg(emb != NULL, "%s", st.msg);
  ck_assert_int_eq(emb->n, 3);
  ck_assert_str_eq(ps_variable_name(emb->parts[0]), "emb/part_0");
  ck_assert_int_eq(ps_variable_shape(emb->parts[0])->dim[0], 4);
  ck_assert_int_eq(ps_variable_shape(emb->parts[2])->dim[0], 3);
  ck_assert_int_eq(ps_variable_task(emb->parts[0]), 0);
  ck_assert_int_eq(ps_variable_task(emb->parts[1]), 1);
  ck_assert_int_eq(ps_variable_task(emb->parts[2]), 0);
  /* min/max partitioner: 40 floats with 64-byte slices -> 3 parts, capped */
  ps_partitioner mm = {
      .kind = PS_PART_MIN_MAX, .max_partitions = 8, .min_slice_size = 64};
  ck_assert_int_eq(ps_partitioner_num_parts(&mm, PS_DT_FLOAT, &(ps_shape){2, {10, 4}}),
                   3);
  ps_node *ids = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "ids");
  ps_node *rows = ps_embedding_lookup(g, emb->parts, emb->n, ids, PS_PARTITION_DIV);
  ps_node *target = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 4}}, "target");
  ps_node *loss = ps_mean_squared_error(target, rows);
  ps_optimizer *opt = ps_adagrad_optimizer(0.5, 0.1);
  ps_node *train = ps_optimizer_minimize(opt, g, loss, NULL, NULL, 0, &st);
  ck_assert_msg(train != NULL, "%s", st.msg);
  ps_node *init = ps_global_variables_initializer(g);
  ps_session *s = ps_session_create(g, C, &st);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  /* full table before training */
  ps_node *parts[3] = {ps_variable_value(emb->parts[0]), ps_variable_value(emb->parts[1]),
                       ps_variable_value(emb->parts[2])};
  ps_tensor *before[3];
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, parts, 3, NULL, 0, before, &st), st);
  float full[40];
  memcpy(full, ps_tensor_data(before[0]), 16 * 4);
  memcpy(full + 16, ps_tensor_data(before[1]), 12 * 4);
  memcpy(full + 28, ps_tensor_data(before[2]), 12 * 4);
  int64_t idv[5] = {9, 0, 4, 9, 6};
  ps_tensor *tid = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {5}}, false);
  memcpy(ps_tensor_data(tid), idv, sizeof idv);
  ps_tensor *tt = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {5, 4}}, true);
  ps_feed f[2] = {{ids, tid}, {target, tt}};
  ps_tensor *got;
  PS_ASSERT_OK(ps_session_run(s, f, 1, &rows, 1, NULL, 0, &got, &st), st);
  for (int i = 0; i < 5; i++)
    for (int k = 0; k < 4; k++)
      ck_assert(((float *)ps_tensor_data(got))[i * 4 + k] == full[idv[i] * 4 + k]);
  ps_tensor_destroy(got);
  float first = run_loss(s, f, 2, loss, train), last = first;
  int reads, updates;
  ps_session_last_rpcs(s, &reads, &updates);
  ck_assert_int_eq(reads, 2);
  ck_assert_int_eq(updates, 2);
  for (int it = 0; it < 30; it++)
    last = run_loss(s, f, 2, loss, train);
  ck_assert_msg(last < first * 0.2f, "loss %f -> %f", first, last);
  ps_tensor *after[3];
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, parts, 3, NULL, 0, after, &st), st);
  /* row 1 (part 0) and row 8 (part 2) were never looked up */
  ck_assert(memcmp((float *)ps_tensor_data(after[0]) + 4, full + 4, 16) == 0);
  ck_assert(memcmp((float *)ps_tensor_data(after[2]) + 4, full + 32, 16) == 0);
  for (int k = 0; k < 3; k++) {
    ps_tensor_destroy(before[k]);
    ps_tensor_destroy(after[k]);
  }
  ps_tensor_destroy(tid);
  ps_tensor_destroy(tt);
  ps_session_destroy(s);
  ps_optimizer_destroy(opt);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(initialized_value_times_two_on_another_ps) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_init_spec k;
  ps_init_spec_default(&k, PS_INIT_RANDOM_UNIFORM);
  k.seed = 9;
  ps_variable *w =
      ps_get_variable(g, "w", PS_DT_FLOAT, &(ps_shape){1, {6}}, &k, NULL, &st);
  ps_node *twice = ps_mul(ps_initialized_value(w), ps_scalar(g, PS_DT_FLOAT, 2));
  ps_variable *w2 = ps_variable_create(g, twice, "w2", NULL);
  ck_assert_int_ne(ps_variable_task(w), ps_variable_task(w2));
  ps_node *init = ps_global_variables_initializer(g);
  ps_session *s = ps_session_create(g, C, &st);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_node *fetch[2] = {ps_variable_value(w), ps_variable_value(w2)};
  ps_tensor *out[2];
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, fetch, 2, NULL, 0, out, &st), st);
  for (int i = 0; i < 6; i++)
    ck_assert(((float *)ps_tensor_data(out[1]))[i] ==
              2 * ((float *)ps_tensor_data(out[0]))[i]);
  ps_tensor_destroy(out[0]);
  ps_tensor_destroy(out[1]);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* embedding_lookup with the mod strategy: id -> part id % n, row id / n;
 * and ps_ops: only the listed op types go to the ps. */
START_TEST(embedding_lookup_mod_strategy_and_ps_ops) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_init_spec rn;
  ps_init_spec_default(&rn, PS_INIT_RANDOM_UNIFORM);
  ps_partitioner part = {.kind = PS_PART_FIXED, .num_shards = 2};
  ps_partitioned_variable *emb = ps_get_partitioned_variable(
      g, "table", PS_DT_FLOAT, &(ps_shape){2, {5, 2}}, &rn, &part, NULL, &st);
  ck_assert_ptr_nonnull(emb);
  ps_node *ids = ps_placeholder(g, PS_DT_INT32, &(ps_shape){1, {-1}}, "ids");
  ps_node *rows = ps_embedding_lookup(g, emb->parts, emb->n, ids, PS_PARTITION_MOD);
  ps_node *init = ps_global_variables_initializer(g);
  ps_session *s = ps_session_create(g, C, &st);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_node *pv[2] = {ps_variable_value(emb->parts[0]), ps_variable_value(emb->parts[1])};
  ps_tensor *p[2];
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, pv, 2, NULL, 0, p, &st), st);
  int32_t idv[4] = {3, 4, 0, 1};
  ps_tensor *tid = ps_tensor_create(PS_DT_INT32, &(ps_shape){1, {4}}, false);
  memcpy(ps_tensor_data(tid), idv, sizeof idv);
  ps_feed f = {ids, tid};
  ps_tensor *got;
  PS_ASSERT_OK(ps_session_run(s, &f, 1, &rows, 1, NULL, 0, &got, &st), st);
  for (int i = 0; i < 4; i++) {
    const float *src = (const float *)ps_tensor_data(p[idv[i] % 2]) + (idv[i] / 2) * 2;
    ck_assert(memcmp((float *)ps_tensor_data(got) + i * 2, src, 8) == 0);
  }
  ps_tensor_destroy(got);
  /* out of range ids are reported with TF's text */
  idv[0] = 5;
  memcpy(ps_tensor_data(tid), idv, sizeof idv);
  PS_ASSERT_CODE(ps_session_run(s, &f, 1, &rows, 1, NULL, 0, &got, &st), st,
                 PS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(st.msg, "indices[0] = 5 is not in [0, 5)"));
  ps_tensor_destroy(p[0]);
  ps_tensor_destroy(p[1]);
  ps_tensor_destroy(tid);
  ps_session_destroy(s);
  ps_graph_destroy(g);
  /* ps_ops: with no VariableV2 in the list, variables stay on the worker */
  g = ps_graph_create();
  const char *ops[] = {"MutableHashTable"};
  ps_rds_options o = {.ps_ops = ops, .nps_ops = 1, .worker_device = "/job:worker/task:3"};
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, &o));
  ps_variable *v =
      ps_get_variable(g, "v", PS_DT_FLOAT, &(ps_shape){1, {2}}, NULL, NULL, &st);
  ck_assert_str_eq(ps_variable_device(v), "/job:worker/task:3");
  ck_assert_int_eq(ps_variable_task(v), -1);
  ps_graph_destroy(g);
}
END_TEST

/* The same model with its variables held by the session (no ps at all)
 * computes the very same weights: the ps and the session run the same
 * kernels. */
static void train_small(ps_client *client, const ps_cluster *cluster, float *w_out) {
  ps_graph *g = ps_graph_create();
  if (cluster) ps_device_push_fn(g, ps_replica_device_setter(cluster, NULL));
  ps_status st;
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 3}}, "x");
  ps_node *y = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 1}}, "y");
  ps_init_spec k;
  ps_init_spec_default(&k, PS_INIT_GLOROT_UNIFORM);
  k.seed = 4;
  ps_variable *w =
      ps_get_variable(g, "w", PS_DT_FLOAT, &(ps_shape){2, {3, 1}}, &k, NULL, &st);
  ps_node *loss =
      ps_mean_squared_error(y, ps_matmul(x, ps_variable_value(w), false, false));
  ps_optimizer *opt = ps_momentum_optimizer(0.1, 0.9, true);
  ps_node *train = ps_optimizer_minimize(opt, g, loss, NULL, NULL, 0, &st);
  ck_assert_msg(train != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_variable_task(w), cluster ? 0 : -1);
  ps_node *init = ps_global_variables_initializer(g);
  ps_session *s = ps_session_create(g, client, &st);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_tensor *bx = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {8, 3}}, false);
  ps_tensor *by = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {8, 1}}, false);
  unsigned seed = 21;
  for (int it = 0; it < 20; it++) {
    for (int i = 0; i < 24; i++)
      ((float *)ps_tensor_data(bx))[i] = frand(&seed);
    for (int i = 0; i < 8; i++)
      ((float *)ps_tensor_data(by))[i] = frand(&seed);
    ps_feed f[2] = {{x, bx}, {y, by}};
    run_loss(s, f, 2, loss, train);
  }
  ps_node *wv = ps_variable_value(w);
  ps_tensor *out;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, &wv, 1, NULL, 0, &out, &st), st);
  memcpy(w_out, ps_tensor_data(out), 3 * sizeof(float));
  ps_tensor_destroy(out);
  ps_tensor_destroy(bx);
  ps_tensor_destroy(by);
  ps_session_destroy(s);
  ps_optimizer_destroy(opt);
  ps_graph_destroy(g);
}

START_TEST(in_process_variables_match_the_ps) {
  float remote[3], local[3];
  train_small(C, H.cluster, remote);
  train_small(NULL, NULL, local);
  for (int i = 0; i < 3; i++)
    ck_assert_msg(remote[i] == local[i], "w[%d] %g vs %g", i, remote[i], local[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train");
  TCase *tc = tcase_create("train");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, linear_regression_learns_known_weights);
  tcase_add_test(tc, mlp_loss_falls);
  tcase_add_test(tc, partitioned_embedding_trains_with_sparse_updates);
  tcase_add_test(tc, initialized_value_times_two_on_another_ps);
  tcase_add_test(tc, in_process_variables_match_the_ps);
  tcase_add_test(tc, embedding_lookup_mod_strategy_and_ps_ops);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
