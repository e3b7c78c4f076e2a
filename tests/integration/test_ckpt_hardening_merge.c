/* Leftovers, merges, retention and sweeps through a real ps-server (part
 * of the integration_ckpt_hardening test): stale temporary directories, a
 * failed or oversized merge, retention and the sweep with a directory
 * swapped for a link, a variable reshaped during a restore. */
#include "test_ckpt_hardening_internal.h"

/* ---- leftovers ---- */

static void make_temp(const char *name, bool old) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", ck, name);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/%s/part-00000-of-00002.data-00000-of-00001", ck, name);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fputs("bytes", f);
  fclose(f);
  if (!old) return;
  struct timespec ts[2];
  clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_sec -= 3600;
  ts[1] = ts[0];
  ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
  snprintf(p, sizeof p, "%s/%s", ck, name);
  ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
}

START_TEST(stale_temp_directories_are_swept_live_ones_kept) {
  ps_status st;
  make_temp("old_temp", true);
  make_temp("fresh_temp", false); /* a part that waits for its merge */
  make_temp("locked_temp", true); /* a save that writes right now */
  char p[600];
  snprintf(p, sizeof p, "%s/locked_temp", ck);
  int fd = open(p, O_RDONLY | O_DIRECTORY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(flock(fd, LOCK_SH), 0);
  ps_up(NULL, "5");
  put_vars(1, 4, 1.0f);
  PS_ASSERT_OK(ps_client_save(client, "x", NULL, NULL, NULL, &st), st);
  ck_assert(!exists("%s/old_temp%s", ck, ""));
  ck_assert(exists("%s/fresh_temp%s", ck, ""));
  ck_assert(exists("%s/locked_temp%s", ck, ""));
  char *log = server_log();
  char named[400];
  snprintf(named, sizeof named, "removed the leftover temp directory %s/old_temp", ck);
  ck_assert_msg(strstr(log, named) && !strstr(log, "/proc/self/fd"), "%s", log);
  free(log);
  close(fd);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

START_TEST(a_failed_merge_removes_what_it_wrote) {
  ps_status st;
  ps_up(NULL, "5");
  put_vars(2, 4, 1.0f);
  /* the state file cannot be replaced: it is a directory */
  char p[600];
  snprintf(p, sizeof p, "%s/checkpoint", ck);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  ck_assert_int_ne(ps_client_save(client, "m", NULL, NULL, NULL, &st), 0);
  PS_ASSERT_CODE(st.code, st, PS_UNKNOWN); /* EISDIR */
  ck_assert_msg(strstr(st.msg, "checkpoint state ") && strstr(st.msg, p) &&
                    strstr(st.msg, "Is a directory"),
                "%s", st.msg);
  ck_assert(!exists("%s/m%s", ck, ".index"));
  ck_assert(!exists("%s/m%s", ck, ".data-00000-of-00001"));
  ck_assert(get_var("v00") == 1.0f);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

START_TEST(retention_never_deletes_outside_the_directory) {
  ps_status st;
  char p[700];
  /* a state file (anyone can edit it) listing a path outside */
  snprintf(p, sizeof p, "%s/victim.index", out);
  FILE *f = fopen(p, "w");
  fputs("precious", f);
  fclose(f);
  ps_up(NULL, "5");
  put_vars(1, 4, 1.0f);
  PS_ASSERT_OK(ps_client_save(client, "a", NULL, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "%s/checkpoint", ck);
  f = fopen(p, "w");
  fprintf(f,
          "model_checkpoint_path: \"a\"\nall_model_checkpoint_paths: \"%s/victim\"\n"
          "all_model_checkpoint_paths: \"a\"\n",
          out);
  fclose(f);
  ps_save_options o = {.max_to_keep = 1};
  PS_ASSERT_OK(ps_client_save(client, "b", &o, NULL, NULL, &st), st);
  ck_assert(exists("%s/victim%s", out, ".index"));
  ck_assert(!exists("%s/a%s", ck, ".index")); /* inside: deleted as usual */
  ck_assert(exists("%s/b%s", ck, ".index"));
  /* the state file a link (inside): not followed, the merge fails and
   * removes what it wrote; the link's target is as it was */
  char q[700];
  snprintf(p, sizeof p, "%s/checkpoint", ck);
  snprintf(q, sizeof q, "%s/state_copy", ck);
  ck_assert_int_eq(rename(p, q), 0);
  ck_assert_int_eq(symlink(q, p), 0);
  size_t n0 = 0;
  char *state0 = slurp(q, &n0);
  ck_assert_ptr_nonnull(state0);
  PS_ASSERT_CODE(ps_client_save(client, "c", &o, NULL, NULL, &st), st,
                 PS_PERMISSION_DENIED);
  char named[800];
  snprintf(named, sizeof named, "checkpoint state %s: ", p);
  ck_assert_msg(
      strstr(st.msg, named) &&
          strstr(st.msg, "links under the checkpoint directory are not followed"),
      "%s", st.msg);
  ck_assert(!exists("%s/c%s", ck, ".index"));
  ck_assert(exists("%s/b%s", ck, ".index"));
  size_t n1 = 0;
  char *state1 = slurp(q, &n1);
  ck_assert_ptr_nonnull(state1);
  ck_assert(n0 == n1 && !memcmp(state0, state1, n0));
  free(state0);
  free(state1);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

START_TEST(a_merge_of_many_shards_is_refused_before_it_sizes_anything) {
  char p[600];
  ps_status st;
  ps_up(NULL, "5");
  /* MergeRequest{prefix: "big", num_shards: 99999}: no temp directory */
  static const uint8_t m1[] = {0x0a, 3, 'b', 'i', 'g', 0x10, 0x9f, 0x8d, 0x06};
  PS_ASSERT_CODE(raw("/paramserver.Ps/Merge", m1, sizeof m1, &st), st, PS_NOT_FOUND);
  ck_assert_msg(strstr(st.msg, "checkpoint ") && strstr(st.msg, "big: no parts to merge"),
                "%s", st.msg);
  /* its temp directory with part 0 of 99999, but not the last part */
  snprintf(p, sizeof p, "%s/big_temp", ck);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/big_temp/part-00000-of-99999.index", ck);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  PS_ASSERT_CODE(raw("/paramserver.Ps/Merge", m1, sizeof m1, &st), st, PS_NOT_FOUND);
  ck_assert_msg(strstr(st.msg, "merge of 99999 parts, but part 99998 is not there") &&
                    strstr(st.msg, "part-99998-of-99999.index"),
                "%s", st.msg);
  /* nothing was sized to 99999 parts (4 KiB each were 416 MB before) */
  long long peak = 0;
  harness_rss(H.pids[0], &peak);
  ck_assert_msg(peak > 0 && peak < (64ll << 20), "peak RSS %lld bytes", peak);
  /* MergeRequest{prefix: "big", num_shards: 100000} */
  static const uint8_t m2[] = {0x0a, 3, 'b', 'i', 'g', 0x10, 0xa0, 0x8d, 0x06};
  PS_ASSERT_STATUS(raw("/paramserver.Ps/Merge", m2, sizeof m2, &st), st,
                   PS_INVALID_ARGUMENT, "Merge: num_shards 100000 is outside [1, 99999]");
  /* a Saver's own list of 10001 checkpoints: refused by its limit */
  size_t n3 = 0;
  uint8_t *m3 = malloc(16 + 10001 * 3);
  ck_assert_ptr_nonnull(m3);
  static const uint8_t head[] = {0x0a, 3, 'b', 'i', 'g', 0x10, 1, 0x28, 1};
  memcpy(m3, head, sizeof head);
  n3 = sizeof head;
  for (int i = 0; i < 10001; i++) {
    m3[n3++] = 0x32; /* own_paths */
    m3[n3++] = 1;
    m3[n3++] = 'x';
  }
  PS_ASSERT_CODE(raw("/paramserver.Ps/Merge", m3, n3, &st), st, PS_INVALID_ARGUMENT);
  free(m3);
  ck_assert_msg(strstr(st.msg, "Merge: 10001 own_paths, more than the 10000 allowed"),
                "%s", st.msg);
  ck_assert(exists("%s/big_temp/part-00000-of-99999%s", ck, ".index"));
  ck_assert(!exists("%s/big%s", ck, ".index"));
  /* the first and the last part there, part 0's data a dangling link: the
   * merge sizes its 99999 part names, then refuses the link; each refusal
   * frees every name (before, ~7.7 MiB a request stayed allocated: RSS
   * 16 -> 259 MB over 30 requests; under ASan the leak check at exit) */
  snprintf(p, sizeof p, "%s/big_temp/part-99998-of-99999.index", ck);
  f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  char q[600];
  snprintf(p, sizeof p, "%s/big_temp/part-00000-of-99999.data-00000-of-00001", ck);
  snprintf(q, sizeof q, "%s/nowhere", out);
  ck_assert_int_eq(symlink(q, p), 0);
  for (int i = 0; i < 30; i++) {
    PS_ASSERT_STATUS(raw("/paramserver.Ps/Merge", m1, sizeof m1, &st), st,
                     PS_PERMISSION_DENIED, "part-00000-of-99999.data-00000-of-00001");
  }
#if !defined(__SANITIZE_ADDRESS__)
  long long rss = harness_rss(H.pids[0], NULL);
  ck_assert_msg(rss > 0 && rss < (64ll << 20), "RSS %lld bytes after 30 failed merges",
                rss);
#endif
  ck_assert(!exists("%s/big%s", ck, ".index"));
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

static void *saver_sub_m2(void *arg) {
  saver_arg *a = arg;
  ps_save_options o = {.max_to_keep = 1};
  a->rc = ps_client_save(client, "sub/m2", &o, NULL, NULL, &a->st);
  return NULL;
}

static void write_file(const char *d, const char *name, const char *text) {
  char p[700];
  snprintf(p, sizeof p, "%s/%s", d, name);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* A directory swapped for a link while its merge waits (issue 21): the
 * merge, its state file and its max_to_keep deletion all work in the
 * directory it opened.  Outside, a state file listing m1 and m1's files
 * are planted: before, the state file was rewritten through the link and
 * max_to_keep deleted outside/m1.*. */
START_TEST(a_directory_swapped_for_a_link_during_a_merge_keeps_retention_inside) {
  ps_status st;
  char p[700], q[700];
  snprintf(p, sizeof p, "%s/sub", ck);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  const char *planted_state =
      "model_checkpoint_path: \"m1\"\nall_model_checkpoint_paths: \"m1\"\n";
  const char *victims[] = {"m1.index", "m1.data-00000-of-00001", "m1.meta"};
  write_file(out, "checkpoint", planted_state);
  for (int i = 0; i < 3; i++)
    write_file(out, victims[i], "victim");
  ps_up("PS_SLOW_AT=merge:2000", "5");
  put_vars(2, 4, 1.5f);
  ps_save_options o = {.max_to_keep = 1};
  PS_ASSERT_OK(ps_client_save(client, "sub/m1", &o, NULL, NULL, &st), st);
  ck_assert(exists("%s/sub/m1%s", ck, ".index"));
  pthread_t t;
  saver_arg a = {0};
  ck_assert_int_eq(pthread_create(&t, NULL, saver_sub_m2, &a), 0);
  char merging[400];
  snprintf(merging, sizeof merging, "merging 1 parts into %s/sub/m2", ck);
  ck_assert_msg(log_has(merging, 30), "the merge of sub/m2 never started");
  /* the merge waits 2 s before its first step: swap now */
  snprintf(p, sizeof p, "%s/sub", ck);
  snprintf(q, sizeof q, "%s/sub_moved", ck);
  ck_assert_int_eq(rename(p, q), 0);
  ck_assert_int_eq(symlink(out, p), 0);
  pthread_join(t, NULL);
  ck_assert_msg(a.rc == 0, "%d %s", a.rc, a.st.msg);
  /* outside: as planted */
  snprintf(p, sizeof p, "%s/checkpoint", out);
  char *b = slurp(p, NULL);
  ck_assert_ptr_nonnull(b);
  ck_assert_msg(!strcmp(b, planted_state), "the state file outside was rewritten: %s", b);
  free(b);
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", out, victims[i]);
    b = slurp(p, NULL);
    ck_assert_msg(b != NULL, "%s outside the checkpoint directory was deleted", p);
    ck_assert_str_eq(b, "victim");
    free(b);
  }
  char *o2 = NULL;
  snprintf(p, sizeof p, "ls -A '%s'", out);
  ck_assert_int_eq(harness_run(p, &o2), 0);
  ck_assert_msg(!strstr(o2, "m2") && !strstr(o2, ".tmp"), "written outside: %s", o2);
  free(o2);
  /* inside, in the directory the merge held: m2 listed, m1 deleted */
  snprintf(p, sizeof p, "%s/sub_moved/checkpoint", ck);
  b = slurp(p, NULL);
  ck_assert_ptr_nonnull(b);
  ck_assert_msg(strstr(b, "model_checkpoint_path: \"m2\"") && !strstr(b, "m1"), "%s", b);
  free(b);
  ck_assert(exists("%s/sub_moved/m2%s", ck, ".index"));
  ck_assert(!exists("%s/sub_moved/m1%s", ck, ".index"));
  ck_assert(!exists("%s/sub_moved/m1%s", ck, ".data-00000-of-00001"));
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

/* Swaps dir/sub for a link to outside once the ps log says @marker. */
typedef struct swap_arg {
  const char *marker;
  int rc; /* 0, or an errno (ETIMEDOUT: never seen) */
} swap_arg;

static void *swapper(void *arg) {
  swap_arg *a = arg;
  char log[400], p[700], q[700];
  snprintf(log, sizeof log, "%s/ps.log", dir);
  a->rc = ETIMEDOUT;
  double t0 = now_s();
  while (now_s() - t0 < 60) {
    char *s = slurp(log, NULL);
    bool seen = s && strstr(s, a->marker);
    free(s);
    if (seen) {
      snprintf(p, sizeof p, "%s/sub", ck);
      snprintf(q, sizeof q, "%s/sub_moved", ck);
      a->rc = rename(p, q) != 0 || symlink(out, p) != 0 ? errno : 0;
      break;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

/* A directory swapped for a link while the start-up sweep walks it (issue
 * 21): the sweep goes on in the directory it opened.  The stale temp
 * directory planted outside under the same name keeps its file (before,
 * the sweep emptied and removed outside/old_temp through the link). */
START_TEST(a_directory_swapped_for_a_link_during_the_sweep_leads_nowhere) {
  char p[700];
  snprintf(p, sizeof p, "%s/sub", ck);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  make_temp("sub/old_temp", true);
  /* the same outside, as old */
  snprintf(p, sizeof p, "%s/old_temp", out);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  write_file(p, "part-00000-of-00002.index", "victim");
  struct timespec ts[2];
  clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_sec -= 3600;
  ts[1] = ts[0];
  snprintf(p, sizeof p, "%s/old_temp/part-00000-of-00002.index", out);
  ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
  snprintf(p, sizeof p, "%s/old_temp", out);
  ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
  /* the sweep waits 2 s before each temp directory it found */
  pthread_t t;
  swap_arg a = {.marker = "PS_SLOW_AT=sweep: waiting"};
  ck_assert_int_eq(pthread_create(&t, NULL, swapper, &a), 0);
  ps_up("PS_SLOW_AT=sweep:2000", "5");
  pthread_join(t, NULL);
  ck_assert_msg(a.rc == 0, "swap: %s", strerror(a.rc));
  snprintf(p, sizeof p, "%s/old_temp/part-00000-of-00002.index", out);
  char *b = slurp(p, NULL);
  ck_assert_msg(b != NULL, "%s outside the checkpoint directory was deleted", p);
  ck_assert_str_eq(b, "victim");
  free(b);
  /* the directory the sweep held was swept */
  ck_assert(!exists("%s/sub_moved/old_temp%s", ck, ""));
  char *log = server_log();
  char named[400];
  snprintf(named, sizeof named, "removed the leftover temp directory %s/sub/old_temp",
           ck);
  ck_assert_msg(strstr(log, named), "%s", log);
  free(log);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

/* RestoreRequest{prefix: @prefix} */
static size_t restore_req(uint8_t *b, const char *prefix) {
  size_t n = strlen(prefix);
  b[0] = 0x0a;
  b[1] = (uint8_t)n;
  memcpy(b + 2, prefix, n);
  return n + 2;
}

typedef struct raw_arg {
  const uint8_t *req;
  size_t n;
  int rc;
  ps_status st;
} raw_arg;

static void *raw_restorer(void *arg) {
  raw_arg *a = arg;
  a->rc = raw("/paramserver.Ps/Restore", a->req, a->n, &a->st);
  return NULL;
}

/* A variable given another shape (assign with validate_shape off) after a
 * restore read it and before the restore installs it: the restore fails
 * with ABORTED naming it, and nothing it read is installed (the restore
 * waits 3 s before each tensor; the reshape follows the first read of the
 * data file, seen with inotify). */
START_TEST(a_variable_reshaped_during_a_restore_aborts_it) {
  ps_status st;
  ps_up("PS_SLOW_AT=restore_tensor:3000", "5");
  put_vars(2, 4, 1.5f);
  PS_ASSERT_OK(ps_client_save(client, "first", NULL, NULL, NULL, &st), st);
  put_vars(2, 4, 9.0f);
  char data[600];
  snprintf(data, sizeof data, "%s/first.data-00000-of-00001", ck);
  int in = inotify_init1(IN_CLOEXEC);
  ck_assert_int_ge(in, 0);
  ck_assert_int_ge(inotify_add_watch(in, data, IN_ACCESS), 0);
  uint8_t req[64];
  raw_arg a = {.req = req, .n = restore_req(req, "first")};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, raw_restorer, &a), 0);
  struct pollfd pfd = {in, POLLIN, 0};
  ck_assert_msg(poll(&pfd, 1, 60000) == 1, "the restore never read %s", data);
  close(in);
  /* v00 is read (v01 is 3 s away): v00 becomes [8] */
  ps_tensor *t8 = ps_tensor_new(PS_DT_FLOAT, 1, (int64_t[]){8});
  float *d = ps_tensor_data(t8);
  for (int i = 0; i < 8; i++)
    d[i] = 7.0f;
  ps_update u = {.name = "v00", .op = PS_ASSIGN, .value = t8, .no_validate_shape = true};
  PS_ASSERT_OK(ps_client_update(client, 0, &u, 1, &st), st);
  ps_tensor_destroy(t8);
  pthread_join(t, NULL);
  ck_assert_msg(a.rc == PS_ABORTED &&
                    strstr(a.st.msg, "restoring v00: the variable changed "
                                     "shape during the restore"),
                "%d %s", a.rc, a.st.msg);
  /* nothing the restore read is installed */
  ck_assert(all_are("v00", 8, 7.0f));
  ck_assert(all_are("v01", 4, 9.0f));
  char *log = server_log();
  ck_assert_msg(strstr(log, "changed shape during the restore"), "%s", log);
  free(log);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

/* Adds this file's tests to the suite. */
void ckpt_hardening_merge_tests(Suite *s) {
  ADD(s, stale_temp_directories_are_swept_live_ones_kept);
  ADD(s, a_failed_merge_removes_what_it_wrote);
  ADD(s, a_merge_of_many_shards_is_refused_before_it_sizes_anything);
  ADD(s, retention_never_deletes_outside_the_directory);
  ADD(s, a_directory_swapped_for_a_link_during_a_merge_keeps_retention_inside);
  ADD(s, a_directory_swapped_for_a_link_during_the_sweep_leads_nowhere);
  ADD(s, a_variable_reshaped_during_a_restore_aborts_it);
}
