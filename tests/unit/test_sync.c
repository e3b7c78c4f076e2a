/* Unit tests for the conditional accumulators (ps/sync.c) without a ps:
 * dense means over N replicas, sparse rows averaged per index, stale
 * updates, a step moving up, mismatches refused with their texts, the
 * waiters of finish and fail.  The caller's side (locks, the variable) is
 * played by the test as ps/service.c plays it. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ps/sync.h"
#include "tests/support/assert.h"

static ps_sync_update dense_add(const float *v, int64_t n, int replicas, int64_t step) {
  ps_sync_update u = {0};
  u.kind = PS_SYNC_ADD;
  u.dtype = PS_DT_FLOAT;
  u.shape.rank = 1;
  u.shape.dim[0] = n;
  u.value = v;
  u.replicas = replicas;
  u.local_step = step;
  return u;
}

/* check + add, as the service does; returns the check's code. */
static int join(ps_accum *a, const ps_sync_update *u, int64_t epoch, int64_t rows,
                ps_sync_waiter *w, bool *stale, bool *completes, ps_status *st) {
  int rc = ps_accum_check(a, u, epoch, rows, "w", stale, completes, st);
  if (rc != 0 || *stale) return rc;
  return ps_accum_add(a, u, epoch, w, st);
}

START_TEST(dense_mean_of_three_replicas) {
  ps_accum *a = ps_accum_create();
  ck_assert_ptr_nonnull(a);
  float g[3][2] = {{1, 2}, {3, 4}, {5, 9}};
  ps_sync_waiter w[3];
  memset(w, 0, sizeof w);
  ps_status st;
  bool stale, completes;
  for (int i = 0; i < 3; i++) {
    ps_sync_update u = dense_add(g[i], 2, 3, 7);
    PS_ASSERT_OK(join(a, &u, 0, 2, &w[i], &stale, &completes, &st), st);
    ck_assert(!stale);
    ck_assert(completes == (i == 2));
    ck_assert(ps_accum_full(a) == (i == 2));
  }
  ps_sync_take t;
  PS_ASSERT_OK(ps_accum_take(a, &t, &st), st);
  ck_assert_int_eq(t.kind, PS_SYNC_ADD);
  ck_assert_int_eq(t.step, 7);
  ck_assert(!t.sparse);
  const float *mean = t.value;
  ck_assert(fabsf(mean[0] - 3.0f) < 1e-6f && fabsf(mean[1] - 5.0f) < 1e-6f);
  ps_sync_waiter *list = ps_accum_finish(a, 42, 0);
  int n = 0;
  for (ps_sync_waiter *x = list; x; x = x->next, n++) {
    ck_assert_int_eq(x->step, 8);
    ck_assert_int_eq(x->version, 42);
    PS_ASSERT_OK(x->st.code, x->st);
  }
  ck_assert_int_eq(n, 3);
  ck_assert_int_eq(ps_accum_step(a), 8);
  ps_accum_destroy(a);
}
END_TEST

/* 256 replicas of an int8 variable: the sum wraps as int8 arithmetic does
 * and is divided by 256 itself (it was divided by (int8_t)256 == 0: the ps
 * died of SIGFPE). */
START_TEST(an_int8_mean_over_256_replicas_divides_by_256) {
  ps_accum *a = ps_accum_create();
  ck_assert_ptr_nonnull(a);
  static ps_sync_waiter w[256];
  memset(w, 0, sizeof w);
  int8_t one[2] = {1, -1};
  ps_status st;
  bool stale, completes;
  for (int i = 0; i < 256; i++) {
    ps_sync_update u = dense_add(NULL, 2, 256, 3);
    u.dtype = PS_DT_INT8;
    u.value = one;
    PS_ASSERT_OK(join(a, &u, 0, 2, &w[i], &stale, &completes, &st), st);
  }
  ck_assert(ps_accum_full(a));
  ps_sync_take t;
  PS_ASSERT_OK(ps_accum_take(a, &t, &st), st);
  const int8_t *mean = t.value;
  /* 256 * 1 wraps to 0 in int8; 0 / 256 = 0 */
  ck_assert_int_eq(mean[0], 0);
  ck_assert_int_eq(mean[1], 0);
  ps_accum_finish(a, 1, 0);
  ps_accum_destroy(a);
}
END_TEST

START_TEST(stale_updates_are_dropped_and_the_step_moves_up) {
  ps_accum *a = ps_accum_create();
  float g[2] = {1, 1};
  ps_sync_waiter w[4];
  memset(w, 0, sizeof w);
  ps_status st;
  bool stale, completes;
  ps_sync_update u = dense_add(g, 2, 2, 5);
  PS_ASSERT_OK(join(a, &u, 0, 2, &w[0], &stale, &completes, &st), st);
  /* behind the step being aggregated: dropped, nothing changes */
  ps_sync_update old = dense_add(g, 2, 2, 4);
  PS_ASSERT_OK(ps_accum_check(a, &old, 0, 2, "w", &stale, &completes, &st), st);
  ck_assert(stale);
  ck_assert(!ps_accum_full(a));
  ck_assert_int_eq(ps_accum_step(a), 5);
  PS_ASSERT_OK(join(a, &u, 0, 2, &w[1], &stale, &completes, &st), st);
  ck_assert(completes);
  ps_sync_take t;
  PS_ASSERT_OK(ps_accum_take(a, &t, &st), st);
  ps_accum_finish(a, 1, 0);
  ck_assert_int_eq(ps_accum_step(a), 6);
  /* an empty accumulator moves up to a later local step */
  ps_sync_update later = dense_add(g, 2, 2, 9);
  PS_ASSERT_OK(join(a, &later, 0, 2, &w[2], &stale, &completes, &st), st);
  ck_assert(!stale);
  ck_assert_int_eq(ps_accum_step(a), 9);
  /* and once the variable's value was replaced (new epoch), even down */
  ps_accum_fail(a, PS_UNAVAILABLE, "x");
  ps_sync_update down = dense_add(g, 2, 2, 3);
  PS_ASSERT_OK(join(a, &down, 1, 2, &w[3], &stale, &completes, &st), st);
  ck_assert(!stale);
  ck_assert_int_eq(ps_accum_step(a), 3);
  ps_accum_destroy(a);
}
END_TEST

START_TEST(sparse_rows_are_averaged_per_index) {
  ps_accum *a = ps_accum_create();
  /* two replicas, rows of 2; index 1 in both, 0 in one, 3 in the other */
  float r0[4] = {1, 1, 2, 2}, r1[4] = {4, 4, 6, 6};
  int64_t i0[2] = {1, 0}, i1[2] = {3, 1};
  ps_sync_waiter w[2];
  memset(w, 0, sizeof w);
  ps_status st;
  bool stale, completes;
  const float *rows[2] = {r0, r1};
  const int64_t *idx[2] = {i0, i1};
  for (int i = 0; i < 2; i++) {
    ps_sync_update u = {0};
    u.kind = PS_SYNC_APPLY;
    u.opt = 0; /* gradient descent */
    u.dtype = PS_DT_FLOAT;
    u.shape.rank = 2;
    u.shape.dim[0] = 2;
    u.shape.dim[1] = 2;
    u.value = rows[i];
    u.sparse = true;
    u.indices = idx[i];
    u.isize = 8;
    u.nindices = 2;
    u.replicas = 2;
    u.local_step = 0;
    PS_ASSERT_OK(join(a, &u, 0, 4, &w[i], &stale, &completes, &st), st);
  }
  ps_sync_take t;
  PS_ASSERT_OK(ps_accum_take(a, &t, &st), st);
  ck_assert(t.sparse);
  ck_assert_int_eq(t.nindices, 3);
  const float *v = t.value;
  /* ascending unique indices 0, 1, 3; each row divided by its count */
  ck_assert_int_eq(t.indices[0], 0);
  ck_assert_int_eq(t.indices[1], 1);
  ck_assert_int_eq(t.indices[2], 3);
  ck_assert(fabsf(v[0] - 2.0f) < 1e-6f && fabsf(v[1] - 2.0f) < 1e-6f); /* 2 / 1 */
  ck_assert(fabsf(v[2] - 3.5f) < 1e-6f && fabsf(v[3] - 3.5f) < 1e-6f); /* (1 + 6) / 2 */
  ck_assert(fabsf(v[4] - 4.0f) < 1e-6f && fabsf(v[5] - 4.0f) < 1e-6f); /* 4 / 1 */
  ps_accum_finish(a, 1, 0);
  ps_accum_destroy(a);
}
END_TEST

START_TEST(mismatches_are_refused_with_their_texts) {
  ps_accum *a = ps_accum_create();
  float g[2] = {1, 1}, g3[3] = {1, 1, 1};
  ps_sync_waiter w;
  memset(&w, 0, sizeof w);
  ps_status st;
  bool stale, completes;
  ps_sync_update u = dense_add(g, 2, 3, 2);
  PS_ASSERT_OK(join(a, &u, 0, 2, &w, &stale, &completes, &st), st);
  ps_sync_update sub = u;
  sub.kind = PS_SYNC_SUB;
  PS_ASSERT_CODE(ps_accum_check(a, &sub, 0, 2, "w", &stale, &completes, &st), st,
                 PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg, "synchronous update of w: AssignSub does not match AssignAdd "
                           "of step 2 being aggregated");
  ps_sync_update rep = u;
  rep.replicas = 4;
  PS_ASSERT_CODE(ps_accum_check(a, &rep, 0, 2, "w", &stale, &completes, &st), st,
                 PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg,
                   "synchronous update of w: replicas_to_aggregate is 4 but step 2 "
                   "is aggregating 3");
  ps_sync_update dt = u;
  dt.dtype = PS_DT_DOUBLE;
  PS_ASSERT_CODE(ps_accum_check(a, &dt, 0, 2, "w", &stale, &completes, &st), st,
                 PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg,
                   "synchronous update of w: dtype double does not match float of "
                   "step 2");
  ps_sync_update sh = dense_add(g3, 3, 3, 2);
  PS_ASSERT_CODE(ps_accum_check(a, &sh, 0, 2, "w", &stale, &completes, &st), st,
                 PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg,
                   "synchronous update of w: Shape mismatch: value shape [3], step "
                   "2 aggregates shape [2]");
  /* nothing of that changed the step */
  ck_assert(!ps_accum_full(a));
  ck_assert_int_eq(ps_accum_step(a), 2);
  /* fail: the waiters get the code and the text, the step stays */
  ps_sync_waiter *list = ps_accum_fail(a, PS_UNAVAILABLE, "ps/0 is shutting down");
  ck_assert_ptr_eq(list, &w);
  PS_ASSERT_CODE(w.st.code, w.st, PS_UNAVAILABLE);
  ck_assert_str_eq(w.st.msg, "ps/0 is shutting down");
  ck_assert_int_eq(ps_accum_step(a), 2);
  ps_accum_destroy(a);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sync");
  TCase *tc = tcase_create("sync");
  tcase_add_test(tc, dense_mean_of_three_replicas);
  tcase_add_test(tc, an_int8_mean_over_256_replicas_divides_by_256);
  tcase_add_test(tc, stale_updates_are_dropped_and_the_step_moves_up);
  tcase_add_test(tc, sparse_rows_are_averaged_per_index);
  tcase_add_test(tc, mismatches_are_refused_with_their_texts);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
