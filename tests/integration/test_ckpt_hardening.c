/* Checkpoint hardening through a real ps-server (issue 9): SIGTERM during a
 * long save, path confinement (symbolic links, long and control-character
 * prefixes), leftover temp directories, a merge that fails after writing,
 * and retention that never deletes outside the checkpoint directory.
 *
 * Each ps is started through the harness with its stderr in a file (the
 * tests read its log: harness_start_opts): it dies with the test
 * (PR_SET_PDEATHSIG, the harness's guardian) and is killed in every outcome
 * by the teardown. */
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
#include "tests/support/assert.h"

static char dir[256]; /* scratch: spec, logs */
static char ck[300];  /* --checkpoint-dir */
static char out[300]; /* outside the checkpoint directory */
static ps_harness H;  /* the running ps: H.pids[0], H.addrs[0], H.cluster */
static ps_client *client;

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

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Starts one ps with --checkpoint-dir, its log in dir/ps.log; @env is
 * "NAME=VALUE" or NULL. */
static void ps_up(const char *env, const char *grace) {
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
static int ps_term(double limit) {
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

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char *b = malloc(1 << 20);
  size_t k = fread(b, 1, (1 << 20) - 1, f);
  b[k] = '\0';
  fclose(f);
  if (n) *n = k;
  return b;
}

static char *ps_log(void) {
  char p[400];
  snprintf(p, sizeof p, "%s/ps.log", dir);
  char *s = slurp(p, NULL);
  ck_assert_ptr_nonnull(s);
  return s;
}

static bool exists(const char *fmt, const char *a, const char *b) {
  char p[600];
  snprintf(p, sizeof p, fmt, a, b);
  struct stat sb;
  return lstat(p, &sb) == 0;
}

/* @n float variables v00.. of @elems elements, all set to @val. */
static void put_vars(int n, int64_t elems, float val) {
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

static float get_var(const char *name) {
  ps_status st;
  ps_read r = {.name = name};
  PS_ASSERT_OK(ps_client_read(client, 0, &r, 1, &st), st);
  float v = *(float *)ps_tensor_data(r.out);
  ps_tensor_destroy(r.out);
  return v;
}

/* A raw request to the ps; returns its status code, message in @msg. */
static int raw(const char *method, const uint8_t *p, size_t n, char *msg, size_t mn) {
  ps_rpc_channel *ch = ps_rpc_channel_create(H.addrs[0]);
  ps_rpc_req r = {.ch = ch,
                  .method = method,
                  .raw_request = p,
                  .raw_len = n,
                  .unary_response = true,
                  .timeout_ms = 20000};
  ps_rpc_run(&r, 1);
  snprintf(msg, mn, "%s", r.st.msg);
  ps_rpc_channel_destroy(ch);
  return r.st.code;
}

/* SaveRequest{prefix: @prefix (length @plen), shard 0, num_shards 1} */
static size_t save_req(uint8_t *b, const char *prefix, size_t plen) {
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

typedef struct saver_arg {
  int rc;
  ps_status st;
} saver_arg;

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
  char *log = ps_log();
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
static bool log_has(const char *what, double limit) {
  double t0 = now_s();
  do {
    char *log = ps_log();
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
  char *log = ps_log();
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
  log = ps_log();
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
  char msg[512];
  size_t n = save_req(req, "unmerged", strlen("unmerged"));
  ck_assert_msg(raw("/paramserver.Ps/Save", req, n, msg, sizeof msg) == 0, "%s", msg);
  ck_assert(exists("%s/unmerged_temp/part-00000-of-00001%s", ck, ".index"));
  ck_assert_int_eq(ps_term(30), 0);
  char *log = ps_log();
  ck_assert_msg(!exists("%s/unmerged_temp%s", ck, ""),
                "the finished part of a save never merged is left; log:\n%s", log);
  ck_assert_msg(strstr(log, "a save this ps would have merged, stopped before its merge"),
                "%s", log);
  free(log);
}
END_TEST

/* ---- a restore that fails changes nothing (issue 21) ---- */

/* Whether every element of the float variable @name is @val (@n elements). */
static bool all_are(const char *name, int64_t n, float val) {
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
  char msg[1024];
  uint8_t b[9000];
  ps_up(NULL, "5");
  put_vars(1, 4, 1.0f);
  /* 4000 characters */
  char *longp = malloc(4001);
  for (int i = 0; i < 4000; i++)
    longp[i] = (i % 100 == 99) ? '/' : 'a';
  longp[4000] = '\0';
  size_t n = save_req(b, longp, 4000);
  ck_assert_int_eq(raw("/paramserver.Ps/Save", b, n, msg, sizeof msg),
                   PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "too long") && strstr(msg, "limit is"), "%s", msg);
  /* one component longer than a file name may be */
  memset(longp, 'b', 300);
  n = save_req(b, longp, 300);
  ck_assert_int_eq(raw("/paramserver.Ps/Save", b, n, msg, sizeof msg),
                   PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "component of 300 bytes") && strstr(msg, "NAME_MAX"), "%s",
                msg);
  free(longp);
  /* a newline, and a NUL */
  n = save_req(b, "a\nb", 3);
  ck_assert_int_eq(raw("/paramserver.Ps/Save", b, n, msg, sizeof msg),
                   PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "control character (byte 0x0a at offset 1)"), "%s", msg);
  n = save_req(b, "w\0evil", 6);
  ck_assert_int_eq(raw("/paramserver.Ps/Save", b, n, msg, sizeof msg),
                   PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "Save: the checkpoint prefix has a NUL byte"), "%s", msg);
  /* RestoreRequest{prefix: "w\0evil"}, MergeRequest{prefix: "a\x01", num_shards: 1} */
  static const uint8_t rr[] = {0x0a, 6, 'w', 0, 'e', 'v', 'i', 'l'};
  ck_assert_int_eq(raw("/paramserver.Ps/Restore", rr, sizeof rr, msg, sizeof msg),
                   PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "Restore: the checkpoint prefix has a NUL byte"), "%s", msg);
  static const uint8_t mr[] = {0x0a, 2, 'a', 1, 0x10, 1};
  ck_assert_int_eq(raw("/paramserver.Ps/Merge", mr, sizeof mr, msg, sizeof msg),
                   PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "control character (byte 0x01"), "%s", msg);
  /* nothing was written */
  char cmd[400];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", ck);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert(get_var("v00") == 1.0f);
  ck_assert_int_eq(ps_term(30), 0);
}
END_TEST

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
  char *log = ps_log();
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
  char msg[512], p[600];
  ps_up(NULL, "5");
  /* MergeRequest{prefix: "big", num_shards: 99999}: no temp directory */
  static const uint8_t m1[] = {0x0a, 3, 'b', 'i', 'g', 0x10, 0x9f, 0x8d, 0x06};
  ck_assert_int_eq(raw("/paramserver.Ps/Merge", m1, sizeof m1, msg, sizeof msg),
                   PS_NOT_FOUND);
  ck_assert_msg(strstr(msg, "checkpoint ") && strstr(msg, "big: no parts to merge"), "%s",
                msg);
  /* its temp directory with part 0 of 99999, but not the last part */
  snprintf(p, sizeof p, "%s/big_temp", ck);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/big_temp/part-00000-of-99999.index", ck);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  ck_assert_int_eq(raw("/paramserver.Ps/Merge", m1, sizeof m1, msg, sizeof msg),
                   PS_NOT_FOUND);
  ck_assert_msg(strstr(msg, "merge of 99999 parts, but part 99998 is not there") &&
                    strstr(msg, "part-99998-of-99999.index"),
                "%s", msg);
  /* nothing was sized to 99999 parts (4 KiB each were 416 MB before) */
  long long peak = 0;
  harness_rss(H.pids[0], &peak);
  ck_assert_msg(peak > 0 && peak < (64ll << 20), "peak RSS %lld bytes", peak);
  /* MergeRequest{prefix: "big", num_shards: 100000} */
  static const uint8_t m2[] = {0x0a, 3, 'b', 'i', 'g', 0x10, 0xa0, 0x8d, 0x06};
  ck_assert_int_eq(raw("/paramserver.Ps/Merge", m2, sizeof m2, msg, sizeof msg),
                   PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "Merge: num_shards 100000 is outside [1, 99999]"), "%s", msg);
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
  ck_assert_int_eq(raw("/paramserver.Ps/Merge", m3, n3, msg, sizeof msg),
                   PS_INVALID_ARGUMENT);
  free(m3);
  ck_assert_msg(strstr(msg, "Merge: 10001 own_paths, more than the 10000 allowed"), "%s",
                msg);
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
    ck_assert_int_eq(raw("/paramserver.Ps/Merge", m1, sizeof m1, msg, sizeof msg),
                     PS_PERMISSION_DENIED);
    ck_assert_msg(strstr(msg, "part-00000-of-99999.data-00000-of-00001"), "%s", msg);
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
  char *log = ps_log();
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
  char msg[512];
} raw_arg;

static void *raw_restorer(void *arg) {
  raw_arg *a = arg;
  a->rc = raw("/paramserver.Ps/Restore", a->req, a->n, a->msg, sizeof a->msg);
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
  ck_assert_msg(a.rc == PS_ABORTED && strstr(a.msg, "restoring v00: the variable changed "
                                                    "shape during the restore"),
                "%d %s", a.rc, a.msg);
  /* nothing the restore read is installed */
  ck_assert(all_are("v00", 8, 7.0f));
  ck_assert(all_are("v01", 4, 9.0f));
  char *log = ps_log();
  ck_assert_msg(strstr(log, "changed shape during the restore"), "%s", log);
  free(log);
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
  ck_assert_int_eq(a.rc, PS_FAILED_PRECONDITION);
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
  ck_assert_int_eq(b.rc, PS_FAILED_PRECONDITION);
  ck_assert_msg(strstr(b.st.msg, "g.index") && strstr(b.st.msg, "is a FIFO"), "%s",
                b.st.msg);
  ck_assert(get_var("v00") == 9.0f);
  /* and as the state file, for a restore of the latest checkpoint */
  snprintf(p, sizeof p, "%s/checkpoint", ck);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_int_eq(mkfifo(p, 0644), 0);
  restore_arg c = {.prefix = NULL};
  restore_within(&c, 15);
  ck_assert_int_eq(c.rc, PS_FAILED_PRECONDITION);
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

/* One test case per test, named after it: CK_RUN_CASE=<name> runs one. */
static void add(Suite *s, const char *name, const TTest *t) {
  TCase *tc = tcase_create(name);
  tcase_add_unchecked_fixture(tc, setup_base, teardown_base);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, t);
  suite_add_tcase(s, tc);
}
#define ADD(s, t) add(s, #t, t)

static Suite *suite(void) {
  Suite *s = suite_create("ckpt_hardening");
  ADD(s, sigterm_during_a_long_save_keeps_the_previous_checkpoint);
  ADD(s, sigterm_during_a_long_restore_or_merge);
  ADD(s, a_restore_that_fails_leaves_every_variable_as_it_was);
  ADD(s, the_checkpoint_quota_counts_index_files);
  ADD(s, sigterm_before_the_merge_removes_the_finished_part);
  ADD(s, a_directory_swapped_for_a_link_during_a_save_leads_nowhere);
  ADD(s, symbolic_links_cannot_lead_out_of_the_checkpoint_directory);
  ADD(s, bad_prefixes_are_invalid_argument);
  ADD(s, stale_temp_directories_are_swept_live_ones_kept);
  ADD(s, a_failed_merge_removes_what_it_wrote);
  ADD(s, a_merge_of_many_shards_is_refused_before_it_sizes_anything);
  ADD(s, retention_never_deletes_outside_the_directory);
  ADD(s, a_directory_swapped_for_a_link_during_a_merge_keeps_retention_inside);
  ADD(s, a_directory_swapped_for_a_link_during_the_sweep_leads_nowhere);
  ADD(s, a_variable_reshaped_during_a_restore_aborts_it);
  ADD(s, a_fifo_as_a_checkpoint_file_fails_the_restore_at_once);
  ADD(s, a_data_file_swapped_for_a_link_during_a_restore_is_not_followed);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
