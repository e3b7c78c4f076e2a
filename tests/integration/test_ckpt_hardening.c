/* Checkpoint hardening through a real ps-server (issue 9): SIGTERM during a
 * long save, path confinement (symbolic links, long and control-character
 * prefixes), leftover temp directories, a merge that fails after writing,
 * and retention that never deletes outside the checkpoint directory.
 *
 * Each ps is started through the harness with its stderr in a file (the
 * tests read its log: harness_start_opts): it dies with the test
 * (PR_SET_PDEATHSIG, the harness's guardian) and is killed in every outcome
 * by the teardown.
 *
 * Confinement (links, prefixes, files that are not regular) is tested in
 * test_ckpt_hardening_links.c; leftovers, merges, retention and sweeps in
 * test_ckpt_hardening_merge.c (one program: integration_ckpt_hardening).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/cluster.h"
#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "test_ckpt_hardening_internal.h"
#include "tests/support/assert.h"

char dir[256]; /* scratch: spec, logs */
char ck[300];  /* --checkpoint-dir */
char out[300]; /* outside the checkpoint directory */
ps_harness H;  /* the running ps: H.pids[0], H.addrs[0], H.cluster */
ps_client *client;

/* Each test's directory lives in one base directory per test case,
 * removed by an unchecked fixture: that teardown runs in Check's parent
 * process, so a test that fails (its child exits without the checked
 * teardown) leaves nothing behind. */
static char base[200];
static void setup_base(void) {
  harness_scratch_base(base, sizeof base, "ckh");
}
static void teardown_base(void) {
  harness_scratch_remove(base);
}

static void setup(void) {
  ck_assert_int_eq(harness_scratch_dir(dir, sizeof dir, base), 0);
  snprintf(ck, sizeof ck, "%s/ck", dir);
  snprintf(out, sizeof out, "%s/outside", dir);
  ck_assert_int_eq(mkdir(ck, 0755), 0);
  ck_assert_int_eq(mkdir(out, 0755), 0);
  ps_rpc_global_init();
}

static void ps_down(void) {
  ps_client_destroy(client);
  client = NULL;
  harness_kill(&H, 0);
  harness_stop(&H);
}

static void teardown(void) {
  ps_down();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Starts one ps with --checkpoint-dir, its log in dir/ps.log; @env is
 * "NAME=VALUE" or NULL. */
void ps_up(const char *env, const char *grace) {
  char log[400];
  snprintf(log, sizeof log, "%s/ps.log", dir);
  const char *const extra[] = {"--checkpoint-dir", ck, "--grace-secs", grace, NULL};
  harness_opts o = {.stderr_path = log, .env = env};
  ck_assert_int_eq(harness_start_opts(&H, 1, extra, &o), 0);
  ps_status st;
  client = ps_client_create(H.cluster, "ps", NULL, &st);
  ck_assert_msg(client != NULL, "%s", st.msg);
}

/* SIGTERM, then the exit status within @limit seconds (-1: not exited). */
int ps_term(double limit) {
  if (H.pids[0] <= 0) return -1;
  kill(H.pids[0], SIGTERM);
  double t0 = now_s();
  int status = 0;
  while (now_s() - t0 < limit) {
    if (waitpid(H.pids[0], &status, WNOHANG) == H.pids[0]) {
      H.pids[0] = 0;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char *b = malloc(1 << 20);
  size_t k = fread(b, 1, (1 << 20) - 1, f);
  b[k] = '\0';
  fclose(f);
  if (n) *n = k;
  return b;
}

char *server_log(void) {
  char p[400];
  snprintf(p, sizeof p, "%s/ps.log", dir);
  char *s = slurp(p, NULL);
  ck_assert_ptr_nonnull(s);
  return s;
}

bool exists(const char *fmt, const char *a, const char *b) {
  char p[600];
  snprintf(p, sizeof p, fmt, a, b);
  struct stat sb;
  return lstat(p, &sb) == 0;
}

/* @n float variables v00.. of @elems elements, all set to @val. */
void put_vars(int n, int64_t elems, float val) {
  ps_status st;
  ps_tensor *t = ps_tensor_new(PS_DT_FLOAT, 1, (int64_t[]){elems});
  float *d = ps_tensor_data(t);
  for (int64_t i = 0; i < elems; i++)
    d[i] = val;
  for (int i = 0; i < n; i++) {
    char name[16];
    snprintf(name, sizeof name, "v%02d", i);
    ps_var_spec vs = {.name = name, .dtype = PS_DT_FLOAT, .shape = {1, {elems}}};
    ps_status cst;
    ps_client_create_vars(client, 0, &vs, 1, &cst); /* exists already: fine */
    ps_update u = {.name = name, .op = PS_ASSIGN, .value = t};
    PS_ASSERT_OK(ps_client_update(client, 0, &u, 1, &st), st);
  }
  ps_tensor_destroy(t);
}

float get_var(const char *name) {
  ps_status st;
  ps_read r = {.name = name};
  PS_ASSERT_OK(ps_client_read(client, 0, &r, 1, &st), st);
  float v = *(float *)ps_tensor_data(r.out);
  ps_tensor_destroy(r.out);
  return v;
}

/* A raw request to the ps; returns its status code, message in @msg. */
int raw(const char *method, const uint8_t *p, size_t n, ps_status *st) {
  ps_rpc_channel *ch = ps_rpc_channel_create(H.addrs[0]);
  ps_rpc_req r = {.ch = ch,
                  .method = method,
                  .raw_request = p,
                  .raw_len = n,
                  .unary_response = true,
                  .timeout_ms = 20000};
  ps_rpc_run(&r, 1);
  *st = r.st;
  ps_rpc_channel_destroy(ch);
  return r.st.code;
}

/* SaveRequest{prefix: @prefix (length @plen), shard 0, num_shards 1} */
size_t save_req(uint8_t *b, const char *prefix, size_t plen) {
  size_t k = 0;
  b[k++] = 0x12;
  size_t l = plen;
  while (l >= 0x80) {
    b[k++] = (uint8_t)(l | 0x80);
    l >>= 7;
  }
  b[k++] = (uint8_t)l;
  memcpy(b + k, prefix, plen);
  k += plen;
  b[k++] = 0x18;
  b[k++] = 0;
  b[k++] = 0x20;
  b[k++] = 1;
  return k;
}

/* ---- SIGTERM during a save longer than --grace-secs ---- */

static void *saver(void *arg) {
  saver_arg *a = arg;
  a->rc = ps_client_save(client, "second", NULL, NULL, NULL, &a->st);
  return NULL;
}

START_TEST(sigterm_during_a_long_save_keeps_the_previous_checkpoint) {
  ps_status st;
  /* a good checkpoint first */
  ps_up(NULL, "1");
  put_vars(20, 1000, 1.5f);
  PS_ASSERT_OK(ps_client_save(client, "first", NULL, NULL, NULL, &st), st);
  ck_assert_int_eq(ps_term(30), 0);
  ps_down();
  char state[400];
  snprintf(state, sizeof state, "%s/checkpoint", ck);
  size_t n0 = 0;
  char *state0 = slurp(state, &n0);
  ck_assert_ptr_nonnull(state0);

  /* each tensor of the save now takes 500 ms: 10 s in all, grace is 1 s */
  ps_up("PS_SLOW_AT=save_tensor:500", "1");
  put_vars(20, 1000, 2.5f);
  pthread_t t;
  saver_arg a = {0};
  ck_assert_int_eq(pthread_create(&t, NULL, saver, &a), 0);
  double t0 = now_s();
  while (!exists("%s/second_temp%s", ck, "") && now_s() - t0 < 30) {
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  ck_assert_msg(exists("%s/second_temp%s", ck, ""), "the save never started");
  double t1 = now_s();
  int rc = ps_term(30);
  double took = now_s() - t1;
  pthread_join(t, NULL);
  char *log = server_log();
  ck_assert_msg(rc == 0, "ps-server exited with %d; log:\n%s", rc, log);
  ck_assert_msg(took < 6, "stopping took %.1f s: the save was not cut short", took);
  ck_assert_msg(strstr(log, "stopped (") != NULL, "no stopped line:\n%s", log);
  ck_assert_msg(strstr(log, "is shutting down: save of ") != NULL &&
                    strstr(log, "/second cut short") != NULL,
                "no cut-short line:\n%s", log);
  ck_assert_int_ne(a.rc, 0);
  free(log);
  /* nothing of the cut save is left, the state file is as it was */
  ck_assert(!exists("%s/second_temp%s", ck, ""));
  ck_assert(!exists("%s/second%s", ck, ".index"));
  size_t n1 = 0;
  char *state1 = slurp(state, &n1);
  ck_assert_ptr_nonnull(state1);
  ck_assert_uint_eq(n0, n1);
  ck_assert_int_eq(memcmp(state0, state1, n0), 0);
  free(state0);
  free(state1);
  /* and the previous checkpoint restores */
  ps_down();
  ps_up(NULL, "1");
  put_vars(20, 1000, 9.0f);
  size_t nr = 0;
  PS_ASSERT_OK(ps_client_restore(client, NULL, &nr, &st), st);
  ck_assert_uint_eq(nr, 20);
  ck_assert(get_var("v00") == 1.5f);
  ck_assert(get_var("v19") == 1.5f);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

/* Polls the ps log for @what (bounded). */
bool log_has(const char *what, double limit) {
  double t0 = now_s();
  do {
    char *log = server_log();
    bool found = strstr(log, what) != NULL;
    free(log);
    if (found) return true;
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  } while (now_s() - t0 < limit);
  return false;
}

static void *restorer(void *arg) {
  saver_arg *a = arg;
  a->rc = ps_client_restore(client, "first", NULL, &a->st);
  return NULL;
}

static void *restorer_of(void *arg) {
  saver_arg *a = arg;
  a->rc = ps_client_restore(client, "big", NULL, &a->st);
  return NULL;
}

START_TEST(sigterm_during_a_long_restore_or_merge) {
  ps_status st;
  ps_up(NULL, "1");
  put_vars(20, 100, 1.5f);
  PS_ASSERT_OK(ps_client_save(client, "first", NULL, NULL, NULL, &st), st);
  ck_assert_int_eq(ps_term(30), 0);
  ps_down();
  char state[400];
  snprintf(state, sizeof state, "%s/checkpoint", ck);
  size_t n0 = 0;
  char *state0 = slurp(state, &n0);
  ck_assert_ptr_nonnull(state0);

  /* a restore of 20 tensors at 500 ms each */
  ps_up("PS_SLOW_AT=restore_tensor:500", "1");
  put_vars(20, 100, 2.5f);
  pthread_t t;
  saver_arg a = {0};
  ck_assert_int_eq(pthread_create(&t, NULL, restorer, &a), 0);
  ck_assert(log_has("restoring 20 variables from", 30));
  double t1 = now_s();
  int rc = ps_term(30);
  double took = now_s() - t1;
  pthread_join(t, NULL);
  char *log = server_log();
  ck_assert_msg(rc == 0 && took < 6, "exit %d after %.1f s; log:\n%s", rc, took, log);
  ck_assert_msg(strstr(log, "restore of ") && strstr(log, "/first cut short") &&
                    strstr(log, "stopped ("),
                "%s", log);
  free(log);
  ck_assert_int_ne(a.rc, 0);
  ps_down();

  /* a merge that waits 20 s */
  ps_up("PS_SLOW_AT=merge:20000", "1");
  put_vars(20, 100, 3.5f);
  saver_arg b = {0};
  ck_assert_int_eq(pthread_create(&t, NULL, saver, &b), 0);
  ck_assert(log_has("merging 1 parts into ", 30));
  t1 = now_s();
  rc = ps_term(30);
  took = now_s() - t1;
  pthread_join(t, NULL);
  log = server_log();
  ck_assert_msg(rc == 0 && took < 6, "exit %d after %.1f s; log:\n%s", rc, took, log);
  ck_assert_msg(strstr(log, "merge of ") && strstr(log, "/second cut short"), "%s", log);
  free(log);
  ck_assert_int_ne(b.rc, 0);
  ck_assert(!exists("%s/second_temp%s", ck, ""));
  ck_assert(!exists("%s/second%s", ck, ".index"));
  size_t n1 = 0;
  char *state1 = slurp(state, &n1);
  ck_assert_ptr_nonnull(state1);
  ck_assert_uint_eq(n0, n1);
  ck_assert_int_eq(memcmp(state0, state1, n0), 0);
  free(state0);
  free(state1);
}
END_TEST

/* A ps stopped after its part of a save is written and before the merge
 * (a Save call alone: shard 0 of 1, this ps would merge it) removes the
 * part on the way out; before, P_temp/ stayed until the sweep 10 minutes
 * later. */
START_TEST(sigterm_before_the_merge_removes_the_finished_part) {
  ps_up(NULL, "1");
  put_vars(4, 1000, 1.5f);
  uint8_t req[64];
  ps_status st;
  size_t n = save_req(req, "unmerged", strlen("unmerged"));
  PS_ASSERT_OK(raw("/paramserver.Ps/Save", req, n, &st), st);
  ck_assert(exists("%s/unmerged_temp/part-00000-of-00001%s", ck, ".index"));
  ck_assert_int_eq(ps_term(30), 0);
  char *log = server_log();
  ck_assert_msg(!exists("%s/unmerged_temp%s", ck, ""),
                "the finished part of a save never merged is left; log:\n%s", log);
  ck_assert_msg(strstr(log, "a save this ps would have merged, stopped before its merge"),
                "%s", log);
  free(log);
}
END_TEST

/* ---- a restore that fails changes nothing (issue 21) ---- */

/* Whether every element of the float variable @name is @val (@n elements). */
bool all_are(const char *name, int64_t n, float val) {
  ps_status st;
  ps_read r = {.name = name};
  PS_ASSERT_OK(ps_client_read(client, 0, &r, 1, &st), st);
  ck_assert_int_eq(ps_shape_num_elements(&r.out->shape), n);
  const float *d = ps_tensor_data(r.out);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++)
    bad += d[i] != val;
  ps_tensor_destroy(r.out);
  if (bad)
    fprintf(stderr, "%s: %lld of %lld elements are not %g\n", name, (long long)bad,
            (long long)n, (double)val);
  return bad == 0;
}

/* Overwrites the last element of @key's tensor in the checkpoint @prefix's
 * data file with @val (same size: only the checksum tells). */
static void corrupt_last(const char *prefix, const char *key, float val) {
  ps_status st;
  ps_bundle_reader *r = ps_bundle_reader_open(prefix, &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  const ps_bundle_entry *e = ps_bundle_reader_find(r, key);
  ck_assert_ptr_nonnull(e);
  char data[600];
  ck_assert(ps_bundle_data_filename(prefix, e->shard_id, ps_bundle_reader_num_shards(r),
                                    data, sizeof data));
  int fd = open(data, O_WRONLY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pwrite(fd, &val, sizeof val, (off_t)(e->offset + e->size - 4)), 4);
  close(fd);
  ps_bundle_reader_close(r);
}

#define BIG (1 << 22) /* elements of v00: 16 MiB */

/* The data file changes while a restore runs, after the restore read and
 * checked v00 and before it installs anything (PS_SLOW_AT makes it wait
 * 3 s before each tensor; the change comes 1 s after v00 is first read,
 * seen with inotify).  Whatever the call returns, no variable is left half
 * restored: it failed and every element is as before, or it succeeded and
 * every element is the checkpoint's.  (Before: DATA_LOSS with 4,194,303 of
 * 4,194,304 elements of v00 restored, "restoring v00 in place ... failed
 * after its check".)  Then a file corrupt before the restore: DATA_LOSS
 * naming the checksum, nothing changed. */
START_TEST(a_restore_that_fails_leaves_every_variable_as_it_was) {
  ps_status st;
  ps_up("PS_SLOW_AT=restore_tensor:3000", "1");
  put_vars(2, BIG, 1.5f);
  PS_ASSERT_OK(ps_client_save(client, "big", NULL, NULL, NULL, &st), st);
  put_vars(2, BIG, 9.0f);
  char prefix[400], data[600];
  snprintf(prefix, sizeof prefix, "%s/big", ck);
  ck_assert(ps_bundle_data_filename(prefix, 0, 1, data, sizeof data));
  int in = inotify_init1(IN_CLOEXEC);
  ck_assert_int_ge(in, 0);
  ck_assert_int_ge(inotify_add_watch(in, data, IN_ACCESS), 0);
  pthread_t t;
  saver_arg a = {0};
  ck_assert_int_eq(pthread_create(&t, NULL, restorer_of, &a), 0);
  struct pollfd pfd = {in, POLLIN, 0};
  ck_assert_msg(poll(&pfd, 1, 60000) == 1, "the restore never read %s", data);
  close(in);
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);
  corrupt_last(prefix, "v00", -1.0f);
  pthread_join(t, NULL);
  if (a.rc != 0) {
    ck_assert_msg(a.rc == PS_DATA_LOSS && strstr(a.st.msg, "checksum"), "%d %s", a.rc,
                  a.st.msg);
    ck_assert_msg(all_are("v00", BIG, 9.0f), "v00 changed by a restore that failed");
    ck_assert(all_are("v01", BIG, 9.0f));
  } else {
    ck_assert_msg(all_are("v00", BIG, 1.5f), "v00 is not the checkpoint's");
    ck_assert(all_are("v01", BIG, 1.5f));
  }
  ps_down();

  /* corrupt before: the restore fails, nothing changes */
  ps_up(NULL, "1");
  put_vars(2, BIG, 9.0f);
  PS_ASSERT_CODE(ps_client_restore(client, "big", NULL, &st), st, PS_DATA_LOSS);
  ck_assert_msg(strstr(st.msg, "checksum") && strstr(st.msg, "v00"), "%s", st.msg);
  ck_assert(all_are("v00", BIG, 9.0f));
  ck_assert(all_are("v01", BIG, 9.0f));
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

/* ---- --max-checkpoint-bytes counts every file (issue 21) ---- */

/* Bytes of the regular files under @d. */
static long long files_bytes(const char *d) {
  char cmd[400], *o = NULL;
  snprintf(cmd, sizeof cmd,
           "find '%s' -type f -printf '%%s\\n' | awk '{s+=$1} END {print s+0}'", d);
  ck_assert_int_eq(harness_run(cmd, &o), 0);
  long long n = atoll(o);
  free(o);
  return n;
}

/* 2,000 one-float variables with 4,000-byte names: 8 KB of tensors, but
 * about 8 MB of index per index file.  Under a 3 MiB quota the save is
 * refused before it writes (before: 7.8 MiB on disk, the indexes were not
 * counted). */
START_TEST(the_checkpoint_quota_counts_index_files) {
  ps_status st;
  ps_up("PS_MAX_CHECKPOINT_BYTES=3145728", "1");
  enum { N = 2000, BATCH = 100, NAME = 4000 };
  char(*names)[NAME + 1] = calloc(BATCH, sizeof *names);
  ck_assert_ptr_nonnull(names);
  ps_tensor *one = ps_tensor_new(PS_DT_FLOAT, 0, NULL);
  *(float *)ps_tensor_data(one) = 1.0f;
  for (int b = 0; b < N / BATCH; b++) {
    ps_var_spec vs[BATCH];
    ps_update up[BATCH];
    for (int i = 0; i < BATCH; i++) {
      memset(names[i], 'x', NAME);
      names[i][NAME] = '\0';
      char head[16];
      int hl = snprintf(head, sizeof head, "n%05d_", b * BATCH + i);
      memcpy(names[i], head, (size_t)hl);
      vs[i] = (ps_var_spec){.name = names[i], .dtype = PS_DT_FLOAT, .shape = {0, {0}}};
      up[i] = (ps_update){.name = names[i], .op = PS_ASSIGN, .value = one};
    }
    PS_ASSERT_OK(ps_client_create_vars(client, 0, vs, BATCH, &st), st);
    PS_ASSERT_OK(ps_client_update(client, 0, up, BATCH, &st), st);
  }
  ps_tensor_destroy(one);
  free(names);
  PS_ASSERT_CODE(ps_client_save(client, "names", NULL, NULL, NULL, &st), st,
                 PS_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(st.msg, "more than --max-checkpoint-bytes 3145728") &&
                    strstr(st.msg, "(tensors and index)"),
                "%s", st.msg);
  long long used = files_bytes(ck);
  ck_assert_msg(used <= 3145728, "%lld bytes on disk under a 3 MiB quota", used);
  ck_assert(!exists("%s/names%s", ck, ".index"));
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

/* One test case per test, named after it: CK_RUN_CASE=<name> runs one. */
void add(Suite *s, const char *name, const TTest *t) {
  TCase *tc = tcase_create(name);
  tcase_add_unchecked_fixture(tc, setup_base, teardown_base);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, t);
  suite_add_tcase(s, tc);
}

static Suite *suite(void) {
  Suite *s = suite_create("ckpt_hardening");
  ADD(s, sigterm_during_a_long_save_keeps_the_previous_checkpoint);
  ADD(s, sigterm_during_a_long_restore_or_merge);
  ADD(s, a_restore_that_fails_leaves_every_variable_as_it_was);
  ADD(s, the_checkpoint_quota_counts_index_files);
  ADD(s, sigterm_before_the_merge_removes_the_finished_part);
  ckpt_hardening_links_tests(s);
  ckpt_hardening_merge_tests(s);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
