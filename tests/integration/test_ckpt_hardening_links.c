/* Checkpoint confinement through a real ps-server (part of the
 * integration_ckpt_hardening test): symbolic links never lead out of the
 * checkpoint directory, not even swapped in during a save; bad prefixes are
 * refused; a restore reads only regular files and follows no link. */
#include "test_ckpt_hardening_internal.h"

/* ---- confinement ---- */

START_TEST(symbolic_links_cannot_lead_out_of_the_checkpoint_directory) {
  ps_status st;
  char p[700], q[700];
  ps_up(NULL, "5");
  put_vars(2, 4, 3.0f);
  /* a good checkpoint, copied outside */
  PS_ASSERT_OK(ps_client_save(client, "good", NULL, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "cp %s/good.index %s/good.data-00000-of-00001 %s/", ck, ck, out);
  ck_assert_int_eq(system(p), 0);
  /* a directory link */
  snprintf(p, sizeof p, "%s/link", ck);
  ck_assert_int_eq(symlink(out, p), 0);
  ck_assert_int_ne(ps_client_save(client, "link/m", NULL, NULL, NULL, &st), 0);
  PS_ASSERT_CODE(st.code, st, PS_PERMISSION_DENIED);
  ck_assert_msg(strstr(st.msg, "link/m") && strstr(st.msg, "outside the checkpoint"),
                "%s", st.msg);
  ck_assert(!exists("%s/m_temp%s", out, ""));
  ck_assert(!exists("%s/m%s", out, ".index"));
  ck_assert_int_ne(ps_client_restore(client, "link/good", NULL, &st), 0);
  PS_ASSERT_STATUS(st.code, st, PS_PERMISSION_DENIED, "link/good");
  /* a file link: evil.index -> outside/good.index */
  snprintf(p, sizeof p, "%s/evil.index", ck);
  snprintf(q, sizeof q, "%s/good.index", out);
  ck_assert_int_eq(symlink(q, p), 0);
  ck_assert_int_ne(ps_client_restore(client, "evil", NULL, &st), 0);
  PS_ASSERT_STATUS(st.code, st, PS_PERMISSION_DENIED, "evil.index");
  /* a data file link: mixed.index inside, its data outside */
  snprintf(p, sizeof p, "cp %s/good.index %s/mixed.index", ck, ck);
  ck_assert_int_eq(system(p), 0);
  snprintf(p, sizeof p, "%s/mixed.data-00000-of-00001", ck);
  snprintf(q, sizeof q, "%s/good.data-00000-of-00001", out);
  ck_assert_int_eq(symlink(q, p), 0);
  ck_assert_int_ne(ps_client_restore(client, "mixed", NULL, &st), 0);
  PS_ASSERT_STATUS(st.code, st, PS_PERMISSION_DENIED, "mixed.data-00000-of-00001");
  /* a temp directory link, and a dangling link where a file will go */
  snprintf(p, sizeof p, "%s/t_temp", ck);
  ck_assert_int_eq(symlink(out, p), 0);
  ck_assert_int_ne(ps_client_save(client, "t", NULL, NULL, NULL, &st), 0);
  PS_ASSERT_CODE(st.code, st, PS_PERMISSION_DENIED);
  ck_assert(!exists("%s/part-00000-of-00001.index%s", out, ""));
  snprintf(p, sizeof p, "%s/d_temp", ck);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/d_temp/part-00000-of-00001.index", ck);
  snprintf(q, sizeof q, "%s/planted.index", out);
  ck_assert_int_eq(symlink(q, p), 0);
  ck_assert_int_ne(ps_client_save(client, "d", NULL, NULL, NULL, &st), 0);
  PS_ASSERT_STATUS(st.code, st, PS_PERMISSION_DENIED, "does not resolve");
  ck_assert(!exists("%s/planted.index%s", out, ""));
  /* a link that stays inside: the paths check passes, but a save or a
   * restore opens its directories without following links (issue 21) */
  snprintf(p, sizeof p, "%s/real", ck);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(q, sizeof q, "%s/alias", ck);
  ck_assert_int_eq(symlink(p, q), 0);
  PS_ASSERT_CODE(ps_client_save(client, "alias/m", NULL, NULL, NULL, &st), st,
                 PS_PERMISSION_DENIED);
  ck_assert_msg(
      strstr(st.msg, "alias") &&
          strstr(st.msg, "links under the checkpoint directory are not followed"),
      "%s", st.msg);
  ck_assert(!exists("%s/real/m_temp%s", ck, ""));
  PS_ASSERT_STATUS(ps_client_restore(client, "alias/good", NULL, &st), st,
                   PS_PERMISSION_DENIED,
                   "links under the checkpoint directory are not followed");
  /* the temp directory a link that stays inside: the save cannot hold it */
  snprintf(p, sizeof p, "%s/in_temp", ck);
  snprintf(q, sizeof q, "%s/real", ck);
  ck_assert_int_eq(symlink(q, p), 0);
  PS_ASSERT_CODE(ps_client_save(client, "in", NULL, NULL, NULL, &st), st,
                 PS_PERMISSION_DENIED);
  char held[400];
  snprintf(held, sizeof held, "cannot hold %s/in_temp: ", ck);
  ck_assert_msg(strstr(st.msg, held) && strstr(st.msg, "not followed"), "%s", st.msg);
  ck_assert(!exists("%s/real/part-00000-of-00001.index%s", ck, ""));
  ck_assert(!exists("%s/in%s", ck, ".index"));
  /* the variables are as they were, and a good save still works */
  ck_assert(get_var("v00") == 3.0f);
  PS_ASSERT_OK(ps_client_save(client, "again", NULL, NULL, NULL, &st), st);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

static void *saver_sub(void *arg) {
  saver_arg *a = arg;
  a->rc = ps_client_save(client, "sub/m", NULL, NULL, NULL, &a->st);
  return NULL;
}

/* A directory swapped for a link while a save runs (issue 21): the save
 * works in the directories it opened, so neither its writes nor its
 * clean-up deletes reach outside.  Files planted outside under the part's
 * names survive (before, the failed save's clean-up deleted them through
 * the link), and nothing new appears there. */
START_TEST(a_directory_swapped_for_a_link_during_a_save_leads_nowhere) {
  char p[700], q[700];
  snprintf(p, sizeof p, "%s/sub", ck);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/m_temp", out);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  const char *victims[] = {"part-00000-of-00001.index",
                           "part-00000-of-00001.data-00000-of-00001"};
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/m_temp/%s", out, victims[i]);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs("victim", f);
    fclose(f);
  }
  ps_up("PS_SLOW_AT=save_tensor:500", "5");
  put_vars(4, 1000, 1.5f);
  pthread_t t;
  saver_arg a = {0};
  ck_assert_int_eq(pthread_create(&t, NULL, saver_sub, &a), 0);
  double t0 = now_s();
  while (!exists("%s/sub/m_temp%s", ck, "") && now_s() - t0 < 30) {
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  ck_assert_msg(exists("%s/sub/m_temp%s", ck, ""), "the save never started");
  /* the save's first tensor waits 500 ms: swap now */
  snprintf(p, sizeof p, "%s/sub", ck);
  snprintf(q, sizeof q, "%s/sub_moved", ck);
  ck_assert_int_eq(rename(p, q), 0);
  ck_assert_int_eq(symlink(out, p), 0);
  pthread_join(t, NULL);
  ck_assert_int_ne(a.rc, 0);
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/m_temp/%s", out, victims[i]);
    size_t n = 0;
    char *b = slurp(p, &n);
    ck_assert_msg(b != NULL, "%s outside the checkpoint directory was deleted", p);
    ck_assert_str_eq(b, "victim");
    free(b);
  }
  /* the merge finds the link: outside the directory */
  ck_assert_msg(a.rc == PS_PERMISSION_DENIED &&
                    strstr(a.st.msg, "outside the checkpoint"),
                "%d %s", a.rc, a.st.msg);
  char *o = NULL;
  snprintf(p, sizeof p, "ls -A '%s' '%s/m_temp'", out, out);
  ck_assert_int_eq(harness_run(p, &o), 0);
  ck_assert_msg(!strstr(o, "m.index") && !strstr(o, ".tmp") && !strstr(o, "tempstate"),
                "written outside: %s", o);
  free(o);
  ck_assert_int_eq(ps_term(30), 0);
  /* and after the ps's shutdown clean-up, which once deleted them through
   * the link */
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/m_temp/%s", out, victims[i]);
    char *b = slurp(p, NULL);
    ck_assert_msg(b != NULL,
                  "%s outside the checkpoint directory was deleted at shutdown", p);
    ck_assert_str_eq(b, "victim");
    free(b);
  }
  snprintf(p, sizeof p, "ls -A '%s' '%s/m_temp'", out, out);
  ck_assert_int_eq(harness_run(p, &o), 0);
  ck_assert_msg(!strstr(o, "m.index") && !strstr(o, ".tmp") && !strstr(o, "tempstate"),
                "written outside at shutdown: %s", o);
  free(o);
}
END_TEST

START_TEST(bad_prefixes_are_invalid_argument) {
  ps_status st;
  uint8_t b[9000];
  ps_up(NULL, "5");
  put_vars(1, 4, 1.0f);
  /* 4000 characters */
  char *longp = malloc(4001);
  for (int i = 0; i < 4000; i++)
    longp[i] = (i % 100 == 99) ? '/' : 'a';
  longp[4000] = '\0';
  size_t n = save_req(b, longp, 4000);
  PS_ASSERT_CODE(raw("/paramserver.Ps/Save", b, n, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "too long") && strstr(st.msg, "limit is"), "%s", st.msg);
  /* one component longer than a file name may be */
  memset(longp, 'b', 300);
  n = save_req(b, longp, 300);
  PS_ASSERT_CODE(raw("/paramserver.Ps/Save", b, n, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "component of 300 bytes") && strstr(st.msg, "NAME_MAX"),
                "%s", st.msg);
  free(longp);
  /* a newline, and a NUL */
  n = save_req(b, "a\nb", 3);
  PS_ASSERT_STATUS(raw("/paramserver.Ps/Save", b, n, &st), st, PS_INVALID_ARGUMENT,
                   "control character (byte 0x0a at offset 1)");
  n = save_req(b, "w\0evil", 6);
  PS_ASSERT_STATUS(raw("/paramserver.Ps/Save", b, n, &st), st, PS_INVALID_ARGUMENT,
                   "Save: the checkpoint prefix has a NUL byte");
  /* RestoreRequest{prefix: "w\0evil"}, MergeRequest{prefix: "a\x01", num_shards: 1} */
  static const uint8_t rr[] = {0x0a, 6, 'w', 0, 'e', 'v', 'i', 'l'};
  PS_ASSERT_STATUS(raw("/paramserver.Ps/Restore", rr, sizeof rr, &st), st,
                   PS_INVALID_ARGUMENT, "Restore: the checkpoint prefix has a NUL byte");
  static const uint8_t mr[] = {0x0a, 2, 'a', 1, 0x10, 1};
  PS_ASSERT_STATUS(raw("/paramserver.Ps/Merge", mr, sizeof mr, &st), st,
                   PS_INVALID_ARGUMENT, "control character (byte 0x01");
  /* nothing was written */
  char cmd[400];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", ck);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert(get_var("v00") == 1.0f);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

/* ---- a restore reads only regular files, links at them not followed ---- */

typedef struct restore_arg {
  const char *prefix;
  int rc;
  ps_status st;
  volatile int done;
} restore_arg;

static void *restore_bg(void *arg) {
  restore_arg *a = arg;
  a->rc = ps_client_restore(client, a->prefix, NULL, &a->st);
  a->done = 1;
  return NULL;
}

/* A restore in a thread, waited for at most @limit seconds (a restore
 * that blocks for ever fails the test instead of hanging it). */
static void restore_within(restore_arg *a, double limit) {
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, restore_bg, a), 0);
  double t0 = now_s();
  while (!a->done && now_s() - t0 < limit) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  ck_assert_msg(a->done, "the restore of %s blocked for %.0f s", a->prefix, limit);
  pthread_join(t, NULL);
}

/* A FIFO planted as a data file or as the index (issue 21 review): the
 * restore fails at once naming the file, nothing changes, and the ps
 * still shuts down promptly.  Before, the open of the FIFO blocked the
 * restore thread for ever, and shutdown waited for it. */
START_TEST(a_fifo_as_a_checkpoint_file_fails_the_restore_at_once) {
  ps_status st;
  char p[700];
  ps_up(NULL, "5");
  put_vars(2, 16, 1.5f);
  PS_ASSERT_OK(ps_client_save(client, "f", NULL, NULL, NULL, &st), st);
  PS_ASSERT_OK(ps_client_save(client, "g", NULL, NULL, NULL, &st), st);
  put_vars(2, 16, 9.0f);
  snprintf(p, sizeof p, "%s/f.data-00000-of-00001", ck);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(mkfifo(p, 0644), 0);
  restore_arg a = {.prefix = "f"};
  restore_within(&a, 15);
  PS_ASSERT_CODE(a.rc, a.st, PS_FAILED_PRECONDITION);
  ck_assert_msg(strstr(a.st.msg, "f.data-00000-of-00001") &&
                    strstr(a.st.msg, "is a FIFO, not a regular file") &&
                    !strstr(a.st.msg, "/proc/"),
                "%s", a.st.msg);
  ck_assert(get_var("v00") == 9.0f && get_var("v01") == 9.0f);
  snprintf(p, sizeof p, "%s/g.index", ck);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(mkfifo(p, 0644), 0);
  restore_arg b = {.prefix = "g"};
  restore_within(&b, 15);
  PS_ASSERT_CODE(b.rc, b.st, PS_FAILED_PRECONDITION);
  ck_assert_msg(strstr(b.st.msg, "g.index") && strstr(b.st.msg, "is a FIFO"), "%s",
                b.st.msg);
  ck_assert(get_var("v00") == 9.0f);
  /* and as the state file, for a restore of the latest checkpoint */
  snprintf(p, sizeof p, "%s/checkpoint", ck);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(mkfifo(p, 0644), 0);
  restore_arg c = {.prefix = NULL};
  restore_within(&c, 15);
  PS_ASSERT_CODE(c.rc, c.st, PS_FAILED_PRECONDITION);
  ck_assert_msg(strstr(c.st.msg, p) && strstr(c.st.msg, "is a FIFO, not a regular file"),
                "%s", c.st.msg);
  ck_assert(get_var("v00") == 9.0f);
  double t0 = now_s();
  ck_assert_int_eq(ps_term(30), 0);
  ck_assert_msg(now_s() - t0 < 10, "shutdown took %.1f s", now_s() - t0);
}
END_TEST

/* A data file swapped for a link after the restore confined its files,
 * before it opened them (they are opened lazily): the restore does not
 * follow the link (issue 21 review); before, it restored the values the
 * link led to, outside the checkpoint directory. */
START_TEST(a_data_file_swapped_for_a_link_during_a_restore_is_not_followed) {
  ps_status st;
  char p[700], q[700];
  ps_up("PS_SLOW_AT=restore_tensor:2000", "5");
  put_vars(2, 16, 1.5f);
  PS_ASSERT_OK(ps_client_save(client, "s", NULL, NULL, NULL, &st), st);
  put_vars(2, 16, -4.0f);
  PS_ASSERT_OK(ps_client_save(client, "evil", NULL, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "mv %s/evil.data-00000-of-00001 %s/evil.data", ck, out);
  ck_assert_int_eq(system(p), 0);
  put_vars(2, 16, 9.0f);
  pthread_t t;
  restore_arg a = {.prefix = "s"};
  ck_assert_int_eq(pthread_create(&t, NULL, restore_bg, &a), 0);
  ck_assert_msg(log_has("PS_SLOW_AT=restore_tensor: waiting", 30), "no restore began");
  snprintf(p, sizeof p, "%s/s.data-00000-of-00001", ck);
  snprintf(q, sizeof q, "%s/evil.data", out);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(symlink(q, p), 0);
  pthread_join(t, NULL);
  ck_assert_msg(a.rc == PS_PERMISSION_DENIED &&
                    strstr(a.st.msg, "s.data-00000-of-00001") &&
                    strstr(a.st.msg, "not followed"),
                "%d %s", a.rc, a.st.msg);
  ck_assert_msg(get_var("v00") == 9.0f && get_var("v01") == 9.0f,
                "restored through the link: v00 %g", (double)get_var("v00"));
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

/* Adds this file's tests to the suite. */
void ckpt_hardening_links_tests(Suite *s) {
  ADD(s, a_directory_swapped_for_a_link_during_a_save_leads_nowhere);
  ADD(s, symbolic_links_cannot_lead_out_of_the_checkpoint_directory);
  ADD(s, bad_prefixes_are_invalid_argument);
  ADD(s, a_fifo_as_a_checkpoint_file_fails_the_restore_at_once);
  ADD(s, a_data_file_swapped_for_a_link_during_a_restore_is_not_followed);
}
