/* bfloat16 values for float variables, through a real ps-server and the
 * public client API: the ops that add to a variable (AssignAdd/Sub,
 * ScatterAdd/Sub, optimizer gradients) take them, widened to float32 on
 * the ps; the others refuse them, naming the variable, and change nothing. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "paramserver/client.h"
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

static ps_tensor *tensor(ps_dtype dt, int rank, int64_t a, int64_t b) {
  ps_shape s = {.rank = rank, .dim = {a, b}};
  ps_tensor *t = ps_tensor_create(dt, &s, true);
  ck_assert_ptr_nonnull(t);
  return t;
}

/* A float variable @name [rows, cols] holding i * 0.25 - 3 at element i. */
static void make_var(const char *name, ps_dtype dt, int64_t rows, int64_t cols) {
  ps_status st;
  ps_var_spec v = {.name = name, .dtype = dt, .shape = {.rank = 2, .dim = {rows, cols}}};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &v, 1, &st), st);
  ps_tensor *t = tensor(dt, 2, rows, cols);
  for (int64_t i = 0; i < rows * cols; i++)
    ps_elem_set(dt, ps_tensor_data(t), i, (double)i * 0.25 - 3);
  ps_update u = {.name = name, .op = PS_ASSIGN, .value = t};
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  ps_tensor_destroy(t);
}

static ps_tensor *read_var(const char *name) {
  ps_status st;
  ps_read r = {.name = name};
  PS_ASSERT_OK(ps_client_read(C, 0, &r, 1, &st), st);
  return r.out;
}

/* Gradient-like values that bfloat16 cannot hold exactly. */
static float grad_at(int64_t i) {
  return (float)((i * 7919) % 1000) / 997.0f - 0.4f;
}

static ps_tensor *bf16_rows(int64_t rows, int64_t cols, int64_t salt) {
  ps_tensor *t = tensor(PS_DT_BFLOAT16, 2, rows, cols);
  uint16_t *p = ps_tensor_data(t);
  for (int64_t i = 0; i < rows * cols; i++)
    p[i] = ps_float_to_bf16(grad_at(i + salt));
  return t;
}

/* Scatter-adds of bfloat16 rows: few ids (each row added as it comes) and
 * many repeated ids (the client sums each id's rows in float32 and rounds
 * the sum to bfloat16 once); the expectation is computed here alike. */
START_TEST(scatter_add_bf16_rows_into_float) {
  const int64_t R = 20, D = 6;
  make_var("e", PS_DT_FLOAT, R, D);
  ps_tensor *init = read_var("e");
  float *want = ps_tensor_data(init);
  ps_status st;
  /* 5 ids, one repeated: sent as they are (under the client's dedup size) */
  int64_t few[5] = {3, 0, 3, 19, 7};
  ps_tensor *ix = tensor(PS_DT_INT64, 1, 5, 0), *g = bf16_rows(5, D, 0);
  memcpy(ps_tensor_data(ix), few, sizeof few);
  ps_update u = {.name = "e", .op = PS_SCATTER_ADD, .value = g, .indices = ix};
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  for (int k = 0; k < 5; k++)
    for (int64_t d = 0; d < D; d++)
      want[few[k] * D + d] +=
          ps_bf16_to_float(((uint16_t *)ps_tensor_data(g))[k * D + d]);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(g);
  /* 300 ids over 20 rows, subtracted: summed per id by the client */
  const int64_t N = 300;
  ix = tensor(PS_DT_INT64, 1, N, 0);
  g = bf16_rows(N, D, 1000);
  int64_t *ids = ps_tensor_data(ix);
  const uint16_t *gv = ps_tensor_data(g);
  float sum[20][6];
  int64_t order[20], nu = 0;
  int first[20];
  for (int r = 0; r < 20; r++)
    first[r] = -1;
  for (int64_t k = 0; k < N; k++) {
    ids[k] = (k * k + 3 * k) % R;
    int64_t r = ids[k];
    if (first[r] < 0) {
      first[r] = (int)nu;
      order[nu++] = r;
      for (int64_t d = 0; d < D; d++)
        sum[r][d] = ps_bf16_to_float(gv[k * D + d]);
    } else {
      for (int64_t d = 0; d < D; d++)
        sum[r][d] += ps_bf16_to_float(gv[k * D + d]);
    }
  }
  for (int64_t q = 0; q < nu; q++)
    for (int64_t d = 0; d < D; d++)
      want[order[q] * D + d] -= ps_bf16_to_float(ps_float_to_bf16(sum[order[q]][d]));
  u = (ps_update){.name = "e", .op = PS_SCATTER_SUB, .value = g, .indices = ix};
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  ps_tensor *got = read_var("e");
  ck_assert_int_eq(got->dtype, PS_DT_FLOAT);
  for (int64_t i = 0; i < R * D; i++)
    ck_assert_msg(((float *)ps_tensor_data(got))[i] == want[i],
                  "e[%lld] = %.9g, want %.9g", (long long)i,
                  (double)((float *)ps_tensor_data(got))[i], (double)want[i]);
  ps_tensor_destroy(got);
  ps_tensor_destroy(init);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(g);
}
END_TEST

/* Dense AssignAdd / AssignSub, and a value large enough to come in many
 * chunks (2 MiB of bfloat16): the sums of the widened values. */
START_TEST(assign_add_sub_bf16_into_float) {
  const int64_t R = 4096, D = 256;
  make_var("big", PS_DT_FLOAT, R, D);
  ps_tensor *want = read_var("big");
  ps_tensor *g = bf16_rows(R, D, 5), *h = bf16_rows(R, D, 77);
  ps_update u[2] = {{.name = "big", .op = PS_ASSIGN_ADD, .value = g},
                    {.name = "big", .op = PS_ASSIGN_SUB, .value = h}};
  ps_status st;
  PS_ASSERT_OK(ps_client_update(C, 0, u, 2, &st), st);
  float *w = ps_tensor_data(want);
  const uint16_t *gv = ps_tensor_data(g), *hv = ps_tensor_data(h);
  for (int64_t i = 0; i < R * D; i++) {
    w[i] += ps_bf16_to_float(gv[i]);
    w[i] -= ps_bf16_to_float(hv[i]);
  }
  ps_tensor *got = read_var("big");
  ck_assert_int_eq(memcmp(ps_tensor_data(got), w, (size_t)(R * D) * sizeof(float)), 0);
  ps_tensor_destroy(got);
  ps_tensor_destroy(want);
  ps_tensor_destroy(g);
  ps_tensor_destroy(h);
}
END_TEST

/* An optimizer step with a bfloat16 gradient, dense and sparse, gives
 * exactly the step with that gradient widened and sent as float32 (on a
 * twin variable). */
START_TEST(optimizer_bf16_gradient_is_the_widened_one) {
  const int64_t R = 8, D = 4;
  make_var("a", PS_DT_FLOAT, R, D);
  make_var("b", PS_DT_FLOAT, R, D);
  ps_tensor *before = read_var("a");
  ps_tensor *g16 = bf16_rows(R, D, 11), *g32 = tensor(PS_DT_FLOAT, 2, R, D);
  for (int64_t i = 0; i < R * D; i++)
    ((float *)ps_tensor_data(g32))[i] =
        ps_bf16_to_float(((uint16_t *)ps_tensor_data(g16))[i]);
  static const double lr[1] = {0.5};
  ps_status st;
  ps_update dense[2] = {{.name = "a",
                         .op = PS_APPLY_GRADIENT_DESCENT,
                         .value = g16,
                         .hparams = lr,
                         .nhparams = 1},
                        {.name = "b",
                         .op = PS_APPLY_GRADIENT_DESCENT,
                         .value = g32,
                         .hparams = lr,
                         .nhparams = 1}};
  PS_ASSERT_OK(ps_client_update(C, 0, dense, 2, &st), st);
  int64_t rows[3] = {6, 1, 2};
  ps_tensor *ix = tensor(PS_DT_INT64, 1, 3, 0);
  memcpy(ps_tensor_data(ix), rows, sizeof rows);
  ps_tensor *s16 = bf16_rows(3, D, 99), *s32 = tensor(PS_DT_FLOAT, 2, 3, D);
  for (int64_t i = 0; i < 3 * D; i++)
    ((float *)ps_tensor_data(s32))[i] =
        ps_bf16_to_float(((uint16_t *)ps_tensor_data(s16))[i]);
  ps_update sparse[2] = {{.name = "a",
                          .op = PS_APPLY_GRADIENT_DESCENT,
                          .value = s16,
                          .indices = ix,
                          .hparams = lr,
                          .nhparams = 1},
                         {.name = "b",
                          .op = PS_APPLY_GRADIENT_DESCENT,
                          .value = s32,
                          .indices = ix,
                          .hparams = lr,
                          .nhparams = 1}};
  PS_ASSERT_OK(ps_client_update(C, 0, sparse, 2, &st), st);
  ps_tensor *a = read_var("a"), *b = read_var("b");
  ck_assert_int_eq(memcmp(ps_tensor_data(a), ps_tensor_data(b), (size_t)(R * D) * 4), 0);
  ck_assert_int_ne(memcmp(ps_tensor_data(a), ps_tensor_data(before), (size_t)(R * D) * 4),
                   0);
  ps_tensor *objs[] = {a, b, before, g16, g32, ix, s16, s32};
  for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
    ps_tensor_destroy(objs[i]);
}
END_TEST

/* A synchronous AssignAdd (one replica to aggregate: its step applies at
 * once) with a bfloat16 value: the accumulator sums the widened one. */
START_TEST(synchronous_bf16_update) {
  make_var("s", PS_DT_FLOAT, 3, 5);
  ps_tensor *want = read_var("s");
  ps_tensor *g = bf16_rows(3, 5, 42);
  ps_update_result res = {0};
  ps_update u = {.name = "s",
                 .op = PS_ASSIGN_ADD,
                 .value = g,
                 .replicas_to_aggregate = 1,
                 .sync_local_step = 0,
                 .result = &res};
  ps_status st;
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  ck_assert(!res.stale);
  for (int64_t i = 0; i < 15; i++)
    ((float *)ps_tensor_data(want))[i] +=
        ps_bf16_to_float(((uint16_t *)ps_tensor_data(g))[i]);
  ps_tensor *got = read_var("s");
  ck_assert_int_eq(memcmp(ps_tensor_data(got), ps_tensor_data(want), 15 * 4), 0);
  ps_tensor_destroy(got);
  ps_tensor_destroy(want);
  ps_tensor_destroy(g);
}
END_TEST

/* The ops that set a value refuse bfloat16 for a float variable (naming
 * the op and the variable), a bfloat16 scatter-add into a double variable
 * is the dtype mismatch it always was, and a batch holding either applies
 * nothing. */
START_TEST(bf16_refused_where_it_would_set_values) {
  make_var("w", PS_DT_FLOAT, 4, 2);
  make_var("d", PS_DT_DOUBLE, 4, 2);
  ps_tensor *before = read_var("w");
  ps_tensor *v = bf16_rows(4, 2, 3), *ix = tensor(PS_DT_INT64, 1, 4, 0);
  ps_tensor *ok = tensor(PS_DT_FLOAT, 2, 4, 2);
  for (int64_t k = 0; k < 4; k++)
    ((int64_t *)ps_tensor_data(ix))[k] = 3 - k;
  for (int64_t i = 0; i < 8; i++)
    ((float *)ps_tensor_data(ok))[i] = 1;
  ps_status st;
  ps_update as[2] = {{.name = "w", .op = PS_ASSIGN_ADD, .value = ok},
                     {.name = "w", .op = PS_ASSIGN, .value = v}};
  PS_ASSERT_STATUS(ps_client_update(C, 0, as, 2, &st), st, PS_INVALID_ARGUMENT,
                   "Assign w: a bfloat16 value for a float variable is taken only by the "
                   "ops that add to it");
  ps_update su[2] = {{.name = "w", .op = PS_ASSIGN_ADD, .value = ok},
                     {.name = "w", .op = PS_SCATTER_UPDATE, .value = v, .indices = ix}};
  PS_ASSERT_STATUS(ps_client_update(C, 0, su, 2, &st), st, PS_INVALID_ARGUMENT,
                   "ScatterUpdate w: a bfloat16 value for a float variable");
  ps_update sd[2] = {{.name = "w", .op = PS_ASSIGN_ADD, .value = ok},
                     {.name = "d", .op = PS_SCATTER_ADD, .value = v, .indices = ix}};
  PS_ASSERT_STATUS(ps_client_update(C, 0, sd, 2, &st), st, PS_INVALID_ARGUMENT,
                   "does not match dtype double");
  ck_assert_ptr_nonnull(strstr(st.msg, "d"));
  ps_tensor *after = read_var("w");
  ck_assert_int_eq(memcmp(ps_tensor_data(after), ps_tensor_data(before), 8 * 4), 0);
  ps_tensor *objs[] = {before, after, v, ix, ok};
  for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
    ps_tensor_destroy(objs[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("bf16");
  TCase *tc = tcase_create("bf16");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, scatter_add_bf16_rows_into_float);
  tcase_add_test(tc, assign_add_sub_bf16_into_float);
  tcase_add_test(tc, optimizer_bf16_gradient_is_the_widened_one);
  tcase_add_test(tc, synchronous_bf16_update);
  tcase_add_test(tc, bf16_refused_where_it_would_set_values);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
