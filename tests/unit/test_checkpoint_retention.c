/* Unit tests of checkpoint retention (ps_ckpt_manager, part of the
 * unit_checkpoint test): max_to_keep and keep_checkpoint_every_n_hours on a
 * fake clock, a restart that picks up a TF1 state file, and its errors. */
#include "test_checkpoint_internal.h"

/* ---- Retention ------------------------------------------------------------ */

/* The files of a (fake) checkpoint: index, two data shards, meta. */
static void make_ckpt(const char *name) {
  write_text(tmp("%s.index", name), "i");
  write_text(tmp("%s.data-00000-of-00002", name), "d");
  write_text(tmp("%s.data-00001-of-00002", name), "d");
  write_text(tmp("%s.meta", name), "m");
}

static const char *ckpt_files(const char *name) {
  static char b[8][512];
  static int i;
  char *p = b[i++ & 7];
  snprintf(p, 512, "%s.data-00000-of-00002 %s.data-00001-of-00002 %s.index %s.meta", name,
           name, name, name);
  return p;
}

static void add_ok(ps_ckpt_manager *m, const char *name, double now) {
  make_ckpt(name);
  ps_status st = {0};
  ck_assert_msg(ps_ckpt_manager_add(m, tmp("%s", name), now, &st) == 0, "add %s: %s",
                name, st.msg);
}

START_TEST(retention_keeps_max_to_keep) {
  ps_ckpt_manager_options opt;
  ps_ckpt_manager_options_init(&opt);
  ck_assert_int_eq(opt.max_to_keep, 5);
  ck_assert(opt.keep_checkpoint_every_n_hours == 10000.0);
  opt.max_to_keep = 2;
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, 1e9, &st);
  ck_assert_ptr_nonnull(m);
  ck_assert_ptr_null(ps_ckpt_manager_latest(m));
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 0);
  /* files that only look alike must survive */
  write_text(tmp("model.ckpt-10.index"), "x");
  write_text(tmp("model.ckpt-1.data-00000-of-00001.tempstate123"), "x");
  write_text(tmp("model.ckpt-1.data-0000-of-00001"), "x");
  add_ok(m, "model.ckpt-1", 1e9 + 1);
  add_ok(m, "model.ckpt-2", 1e9 + 2);
  add_ok(m, "model.ckpt-3", 1e9 + 3.5);
  char want[4096];
  snprintf(want, sizeof want,
           "checkpoint model.ckpt-1.data-0000-of-00001 "
           "model.ckpt-1.data-00000-of-00001.tempstate123 model.ckpt-10.index %s %s",
           ckpt_files("model.ckpt-2"), ckpt_files("model.ckpt-3"));
  assert_dir_has(tmpdir, want);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-3\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-2\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-3\"\n"
                                      "all_model_checkpoint_timestamps: 1000000002.0\n"
                                      "all_model_checkpoint_timestamps: 1000000003.5\n"
                                      "last_preserved_timestamp: 1000000000.0\n");
  ck_assert_str_eq(ps_ckpt_manager_latest(m), tmp("model.ckpt-3"));
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 2);
  ck_assert_str_eq(ps_ckpt_manager_path(m, 0), tmp("model.ckpt-2"));
  ck_assert(ps_ckpt_manager_timestamp(m, 1) == 1e9 + 3.5);
  ck_assert_ptr_null(ps_ckpt_manager_path(m, 2));
  /* and TensorFlow's latest_checkpoint agrees */
  char *latest;
  PS_ASSERT_OK(ps_latest_checkpoint(tmpdir, &latest, &st), st);
  ck_assert_str_eq(latest, tmp("model.ckpt-3"));
  free(latest);
  ps_ckpt_manager_destroy(m);
  ps_ckpt_manager_destroy(NULL);
}
END_TEST

START_TEST(retention_max_to_keep_0_keeps_every_file) {
  ps_ckpt_manager_options opt = {.max_to_keep = 0, .keep_checkpoint_every_n_hours = 1};
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, 1e9, &st);
  ck_assert_ptr_nonnull(m);
  for (int i = 1; i <= 4; i++) {
    char name[32];
    snprintf(name, sizeof name, "model.ckpt-%d", i);
    add_ok(m, name, 1e9 + 10000 * i);
  }
  char want[4096];
  snprintf(want, sizeof want, "checkpoint %s %s %s %s", ckpt_files("model.ckpt-1"),
           ckpt_files("model.ckpt-2"), ckpt_files("model.ckpt-3"),
           ckpt_files("model.ckpt-4"));
  assert_dir_has(tmpdir, want);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-4\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-4\"\n"
                                      "all_model_checkpoint_timestamps: 1000040000.0\n"
                                      "last_preserved_timestamp: 1000000000.0\n");
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 1);
  ps_ckpt_manager_destroy(m);
}
END_TEST

/* Saving a path again moves it to the end: it is then the newest. */
START_TEST(retention_resaved_path_moves_to_the_end) {
  ps_ckpt_manager_options opt = {.max_to_keep = 2, .keep_checkpoint_every_n_hours = 0};
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, 1e9, &st);
  ck_assert_ptr_nonnull(m);
  add_ok(m, "a", 1e9 + 1);
  add_ok(m, "b", 1e9 + 2);
  /* the same checkpoint, spelled differently */
  PS_ASSERT_OK(ps_ckpt_manager_add(m, tmp("./a"), 1e9 + 3, &st), st);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"a\"\n"
                                      "all_model_checkpoint_paths: \"b\"\n"
                                      "all_model_checkpoint_paths: \"a\"\n"
                                      "all_model_checkpoint_timestamps: 1000000002.0\n"
                                      "all_model_checkpoint_timestamps: 1000000003.0\n"
                                      "last_preserved_timestamp: 1000000000.0\n");
  add_ok(m, "c", 1e9 + 4); /* evicts b, not a */
  char want[4096];
  /* "a.*" sorts before "c.*" which sorts before "checkpoint" */
  snprintf(want, sizeof want, "%s %s checkpoint", ckpt_files("a"), ckpt_files("c"));
  assert_dir_has(tmpdir, want);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 2);
  ck_assert_str_eq(ps_ckpt_manager_path(m, 0), tmp("a"));
  ck_assert_str_eq(ps_ckpt_manager_path(m, 1), tmp("c"));
  ps_ckpt_manager_destroy(m);
}
END_TEST

/* keep_checkpoint_every_n_hours = 1 with a checkpoint every 20 minutes and
 * max_to_keep 2; the policy survives a restart through the state file. */
START_TEST(retention_keep_every_n_hours_with_a_fake_clock) {
  const double T = 1e9;
  ps_ckpt_manager_options opt = {.max_to_keep = 2, .keep_checkpoint_every_n_hours = 1};
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, T, &st);
  ck_assert_ptr_nonnull(m);
  for (int k = 1; k <= 8; k++) {
    char name[32];
    snprintf(name, sizeof name, "model.ckpt-%d", k);
    add_ok(m, name, T + 1200 * k);
  }
  ps_ckpt_manager_destroy(m);
  /* 3 (T+1h) and 6 (T+2h) preserved; 7 and 8 listed */
  char want[4096];
  snprintf(want, sizeof want, "checkpoint %s %s %s %s", ckpt_files("model.ckpt-3"),
           ckpt_files("model.ckpt-6"), ckpt_files("model.ckpt-7"),
           ckpt_files("model.ckpt-8"));
  assert_dir_has(tmpdir, want);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-8\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-7\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-8\"\n"
                                      "all_model_checkpoint_timestamps: 1000008400.0\n"
                                      "all_model_checkpoint_timestamps: 1000009600.0\n"
                                      "last_preserved_timestamp: 1000007200.0\n");
  /* A restarted process (one-shot records, each reading the state file):
   * 9 is preserved only because last_preserved_timestamp was kept. */
  for (int k = 9; k <= 11; k++) {
    char name[32];
    snprintf(name, sizeof name, "model.ckpt-%d", k);
    make_ckpt(name);
    PS_ASSERT_OK(ps_ckpt_record(tmpdir, tmp("%s", name), &opt, T + 1200 * k, &st), st);
  }
  snprintf(want, sizeof want, "checkpoint %s %s %s %s %s", ckpt_files("model.ckpt-10"),
           ckpt_files("model.ckpt-11"), ckpt_files("model.ckpt-3"),
           ckpt_files("model.ckpt-6"), ckpt_files("model.ckpt-9"));
  assert_dir_has(tmpdir, want);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-11\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-10\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-11\"\n"
                                      "all_model_checkpoint_timestamps: 1000012000.0\n"
                                      "all_model_checkpoint_timestamps: 1000013200.0\n"
                                      "last_preserved_timestamp: 1000010800.0\n");
  /* The clock went back: timestamps in the future are clamped to now. */
  m = ps_ckpt_manager_create(tmpdir, &opt, T, &st);
  ck_assert_ptr_nonnull(m);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 2);
  ck_assert(ps_ckpt_manager_timestamp(m, 0) == T);
  ck_assert_str_eq(ps_ckpt_manager_latest(m), tmp("model.ckpt-11"));
  ps_ckpt_manager_destroy(m);
}
END_TEST

/* A state file from TensorFlow 1.x (absolute paths, no timestamps): the
 * index mtimes stand in for the timestamps, paths are kept as written. */
START_TEST(retention_picks_up_a_tf1_state_file) {
  const double T = 1e9;
  make_ckpt("model.ckpt-1");
  struct timespec times[2] = {{.tv_sec = (time_t)T - 100}, {.tv_sec = (time_t)T - 100}};
  ck_assert_int_eq(utimensat(AT_FDCWD, tmp("model.ckpt-1.index"), times, 0), 0);
  char text[4096];
  snprintf(text, sizeof text,
           "model_checkpoint_path: \"%s/model.ckpt-1\"\n"
           "all_model_checkpoint_paths: \"%s/model.ckpt-1\"\n",
           tmpdir, tmpdir);
  write_text(tmp("checkpoint"), text);
  ps_ckpt_manager_options opt = {.max_to_keep = 2,
                                 .keep_checkpoint_every_n_hours = 10000};
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, &opt, T, &st);
  ck_assert_ptr_nonnull(m);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 1);
  ck_assert(ps_ckpt_manager_timestamp(m, 0) == T - 100);
  ck_assert_str_eq(ps_ckpt_manager_latest(m), tmp("model.ckpt-1"));
  add_ok(m, "model.ckpt-2", T + 10);
  snprintf(text, sizeof text,
           "model_checkpoint_path: \"model.ckpt-2\"\n"
           "all_model_checkpoint_paths: \"%s/model.ckpt-1\"\n"
           "all_model_checkpoint_paths: \"model.ckpt-2\"\n"
           "all_model_checkpoint_timestamps: 999999900.0\n"
           "all_model_checkpoint_timestamps: 1000000010.0\n"
           "last_preserved_timestamp: 1000000000.0\n",
           tmpdir);
  assert_file_text(tmp("checkpoint"), text);
  /* re-saving the absolutely-listed checkpoint by its full name */
  PS_ASSERT_OK(ps_ckpt_manager_add(m, tmp("model.ckpt-1"), T + 20, &st), st);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 2);
  ck_assert_str_eq(ps_ckpt_manager_path(m, 0), tmp("model.ckpt-2"));
  add_ok(m, "model.ckpt-3", T + 30); /* evicts 2 */
  char want[4096];
  snprintf(want, sizeof want, "checkpoint %s %s", ckpt_files("model.ckpt-1"),
           ckpt_files("model.ckpt-3"));
  assert_dir_has(tmpdir, want);
  ps_ckpt_manager_destroy(m);
}
END_TEST

START_TEST(retention_errors) {
  ps_status st = {0};
  ps_ckpt_manager_options opt = {.max_to_keep = -1};
  ck_assert_ptr_null(ps_ckpt_manager_create(tmpdir, &opt, 1e9, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, "max_to_keep -1 must be >= 0");
  ck_assert_ptr_null(ps_ckpt_manager_create("", NULL, 1e9, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, NULL, 1e9, &st);
  ck_assert_ptr_nonnull(m);
  /* not in the managed directory */
  PS_ASSERT_STATUS(ps_ckpt_manager_add(m, "/elsewhere/model.ckpt-1", 1e9, &st), st,
                   PS_INVALID_ARGUMENT,
                   "checkpoint /elsewhere/model.ckpt-1 is not in the managed directory");
  PS_ASSERT_CODE(ps_ckpt_manager_add(m, tmp("sub/model.ckpt-1"), 1e9, &st), st,
                 PS_INVALID_ARGUMENT);
  PS_ASSERT_CODE(ps_ckpt_manager_add(m, "", 1e9, &st), st, PS_INVALID_ARGUMENT);
  /* the state file's own name */
  PS_ASSERT_STATUS(ps_ckpt_manager_add(m, tmp("checkpoint"), 1e9, &st), st,
                   PS_INVALID_ARGUMENT, "conflicts with path used for checkpoint state");
  assert_dir_has(tmpdir, "");
  /* a failed state write changes nothing */
  add_ok(m, "model.ckpt-1", 1e9 + 1);
  ck_assert_int_eq(mkdir(tmp("checkpoint.d"), 0755), 0);
  ck_assert_int_eq(rename(tmp("checkpoint"), tmp("checkpoint.d/checkpoint")), 0);
  ck_assert_int_eq(mkdir(tmp("checkpoint"), 0755), 0); /* in the way of the rename */
  write_text(tmp("checkpoint/x"), "x");
  make_ckpt("model.ckpt-2");
  ck_assert_int_ne(ps_ckpt_manager_add(m, tmp("model.ckpt-2"), 1e9 + 2, &st), 0);
  PS_ASSERT_MSG_HAS(st, "renaming");
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 1);
  ck_assert_str_eq(ps_ckpt_manager_latest(m), tmp("model.ckpt-1"));
  ps_ckpt_manager_destroy(m);
  /* a state file that is a directory cannot be read */
  ck_assert_ptr_null(ps_ckpt_manager_create(tmpdir, NULL, 1e9, &st));
  PS_ASSERT_MSG_HAS(st, tmp("checkpoint"));
}
END_TEST

/* An unparsable state file is replaced (TensorFlow ignores it too). */
START_TEST(retention_replaces_a_corrupt_state_file) {
  write_text(tmp("checkpoint"), "garbage garbage\n");
  ps_status st = {0};
  ps_ckpt_manager *m = ps_ckpt_manager_create(tmpdir, NULL, 1e9, &st);
  ck_assert_msg(m != NULL, "%s", st.msg);
  ck_assert_uint_eq(ps_ckpt_manager_count(m), 0);
  add_ok(m, "model.ckpt-1", 1e9 + 1);
  assert_file_text(tmp("checkpoint"), "model_checkpoint_path: \"model.ckpt-1\"\n"
                                      "all_model_checkpoint_paths: \"model.ckpt-1\"\n"
                                      "all_model_checkpoint_timestamps: 1000000001.0\n"
                                      "last_preserved_timestamp: 1000000000.0\n");
  ps_ckpt_manager_destroy(m);
}
END_TEST

START_TEST(remove_deletes_every_file_of_a_checkpoint) {
  make_ckpt("m-1");
  make_ckpt("m-10");
  ps_status st = {0};
  PS_ASSERT_OK(ps_ckpt_remove(tmp("m-1"), &st), st);
  assert_dir_has(tmpdir, ckpt_files("m-10"));
  PS_ASSERT_OK(ps_ckpt_remove(tmp("m-1"), &st), st); /* nothing left: fine */
  PS_ASSERT_OK(ps_ckpt_remove(tmp("nodir/m-1"), &st), st);
}
END_TEST

/* Adds this file's tests to the suite's test cases. */
void checkpoint_retention_tests(TCase *tc) {
  tcase_add_test(tc, retention_keeps_max_to_keep);
  tcase_add_test(tc, retention_max_to_keep_0_keeps_every_file);
  tcase_add_test(tc, retention_resaved_path_moves_to_the_end);
  tcase_add_test(tc, retention_keep_every_n_hours_with_a_fake_clock);
  tcase_add_test(tc, retention_picks_up_a_tf1_state_file);
  tcase_add_test(tc, retention_errors);
  tcase_add_test(tc, retention_replaces_a_corrupt_state_file);
  tcase_add_test(tc, remove_deletes_every_file_of_a_checkpoint);
}
