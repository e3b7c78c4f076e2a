/* A 3 GiB variable: created, assigned and read back through a real ps,
 * in chunked streams (never limited by gRPC's 4 MiB default or protobuf's
 * 2 GiB limit), and the ps's resident memory stays close to what it holds.
 * Not run under the sanitizers (their shadow memory would triple the
 * footprint). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "tests/support/assert.h"

START_TEST(three_gib_variable_round_trip) {
  ps_harness h;
  ck_assert_int_eq(harness_start(&h, 1, NULL), 0);
  ps_rpc_global_init();
  ps_status st;
  ps_client *c = ps_client_create(h.cluster, "ps", NULL, &st);
  ck_assert_ptr_nonnull(c);
  const int64_t n = (int64_t)3 << 28; /* 3 GiB of float32 */
  ps_shape s = {.rank = 1, .dim = {n}};
  ps_var_spec spec = {.name = "huge", .dtype = PS_DT_FLOAT, .shape = s};
  PS_ASSERT_OK(ps_client_create_vars(c, 0, &spec, 1, &st), st);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  ck_assert_ptr_nonnull(t);
  float *p = ps_tensor_data(t);
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)(i & 0xfffff);
  ps_update u = {.name = "huge", .op = PS_ASSIGN, .value = t};
  PS_ASSERT_OK(ps_client_update(c, 0, &u, 1, &st), st);
  ps_read r = {.name = "huge"};
  PS_ASSERT_OK(ps_client_read(c, 0, &r, 1, &st), st);
  ck_assert_int_eq(r.out->shape.dim[0], n);
  ck_assert_int_eq(memcmp(ps_tensor_data(r.out), p, (size_t)n * 4), 0);
  long long peak = 0, rss = harness_rss(h.pids[0], &peak);
  double gib = 1024.0 * 1024 * 1024;
  fprintf(stderr, "ps resident %.2f GiB, peak %.2f GiB for 3 GiB held\n", rss / gib,
          peak / gib);
  ck_assert_msg(peak < 3.4 * gib, "ps peak resident %.2f GiB", peak / gib);
  ck_assert_msg(rss > 2.9 * gib, "ps resident %.2f GiB", rss / gib);
  ps_task_status ts;
  PS_ASSERT_OK(ps_client_status(c, 0, &ts, &st), st);
  ck_assert_int_eq(ts.bytes, n * 4);
  ps_tensor_destroy(r.out);
  ps_tensor_destroy(t);
  ps_client_destroy(c);
  ps_rpc_global_shutdown();
  ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("big");
  TCase *tc = tcase_create("big");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, three_gib_variable_round_trip);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
