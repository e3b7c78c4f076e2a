/* The bundle writer's cancel hook (ps_bundle_writer_set_cancel): a big
 * tensor is cut between 4 MiB pieces, with CANCELLED, and the unfinished
 * bundle leaves no file behind. */
#include <check.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "common/bundle.h"
#include "testdir.h"
#include "tests/support/assert.h"

static int calls;

static bool cancel_after_2(void *arg) {
  (void)arg;
  return ++calls > 2;
}

static int files_in(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

START_TEST(a_big_tensor_is_cut_between_pieces) {
  ps_status st;
  TMP(prefix, "b/model");
  ps_bundle_writer *w = ps_bundle_writer_create(prefix, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ps_bundle_writer_set_cancel(w, cancel_after_2, NULL);
  size_t n = (size_t)32 << 20; /* 8 pieces */
  float *big = calloc(n / 4, 4);
  ck_assert_ptr_nonnull(big);
  ps_shape s = {1, {(int64_t)(n / 4)}};
  calls = 0;
  PS_ASSERT_CODE(ps_bundle_writer_add(w, "big", 1, &s, big, n, &st), st, PS_CANCELLED);
  ck_assert_msg(strstr(st.msg, "cancelled") && strstr(st.msg, prefix), "%s", st.msg);
  ck_assert_int_eq(calls, 3); /* stopped at the third piece, not the eighth */
  /* sticky: the writer does nothing more */
  PS_ASSERT_CODE(ps_bundle_writer_finish(w, &st), st, PS_CANCELLED);
  ps_bundle_writer_destroy(w);
  free(big);
  ck_assert_int_eq(files_in(tmp("b")), 0);
}
END_TEST

START_TEST(without_a_cancel_the_writer_finishes) {
  ps_status st;
  TMP(prefix, "c/model");
  ps_bundle_writer *w = ps_bundle_writer_create(prefix, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  float v[3] = {1, 2, 3};
  ps_shape s = {1, {3}};
  PS_ASSERT_OK(ps_bundle_writer_add(w, "v", 1, &s, v, sizeof v, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  ck_assert_int_eq(files_in(tmp("c")), 2);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("bundle_cancel");
  TCase *tc = tcase_create("bundle_cancel");
  tcase_add_unchecked_fixture(tc, setup_basedir, teardown_basedir);
  tcase_add_checked_fixture(tc, setup_tmpdir, teardown_tmpdir);
  tcase_add_test(tc, a_big_tensor_is_cut_between_pieces);
  tcase_add_test(tc, without_a_cancel_the_writer_finishes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
