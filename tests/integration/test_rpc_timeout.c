/* ps_client_options.rpc_timeout_ms through the public C API (deploy/DEPLOY.md): its
 * default, PS_RPC_TIMEOUT and the option, and their errors; then a real ps stopped with
 * SIGSTOP: a call fails DEADLINE_EXCEEDED naming the task, its address and the call
 * within the timeout and a margin, ps_client_task_unanswered_secs shows the silence while
 * it lasts, and a stop shorter than the timeout only delays a call. A stopped ps is
 * continued before it is stopped for good, however the test ends (its PR_SET_PDEATHSIG is
 * SIGKILL, which also ends a stopped process). */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "paramserver/client.h"
#include "tests/support/assert.h"

static double now_secs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static ps_cluster *two_ps(void) {
  static const char spec[] = "{\"ps\": [\"127.0.0.1:1\", \"127.0.0.1:2\"]}";
  ps_status st;
  ps_cluster *cl = ps_cluster_parse(spec, sizeof spec - 1, "test", &st);
  ck_assert_msg(cl != NULL, "%s", st.msg);
  return cl;
}

/* The client's timeout with @opt_ms and PS_RPC_TIMEOUT=@env (NULL: unset):
 * its value, or -1 with @st set. */
static int64_t timeout_with(int64_t opt_ms, const char *env, ps_status *st) {
  if (env)
    setenv("PS_RPC_TIMEOUT", env, 1);
  else
    unsetenv("PS_RPC_TIMEOUT");
  ps_cluster *cl = two_ps();
  ps_client_options o;
  ps_client_options_default(&o);
  o.rpc_timeout_ms = opt_ms;
  ps_client *c = ps_client_create(cl, "ps", &o, st);
  int64_t v = c ? ps_client_rpc_timeout_ms(c) : -1;
  ps_client_destroy(c);
  ps_cluster_destroy(cl);
  unsetenv("PS_RPC_TIMEOUT");
  return v;
}

START_TEST(options_and_environment) {
  ps_library_init();
  ps_status st;
  ck_assert_int_eq(timeout_with(0, NULL, &st), PS_DEFAULT_RPC_TIMEOUT_SECS * 1000);
  ck_assert_int_eq(PS_DEFAULT_RPC_TIMEOUT_SECS, 60);
  ck_assert_int_eq(timeout_with(0, "2.5", &st), 2500);
  ck_assert_int_eq(timeout_with(0, "", &st), 60000);    /* empty counts as unset */
  ck_assert_int_eq(timeout_with(700, "2.5", &st), 700); /* the option wins */
  ck_assert_int_eq(timeout_with(-1, NULL, &st), -1);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "rpc_timeout_ms must be >= 0 (0: PS_RPC_TIMEOUT, else 60 s), got -1");
  static const char *const bad[] = {"0", "-3", "abc", "5s", "1e9", "nan"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(timeout_with(0, bad[i], &st), -1);
    PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
    char want[128];
    snprintf(
        want, sizeof want,
        "PS_RPC_TIMEOUT must be a number of seconds from 0.001 to 31536000, got '%s'",
        bad[i]);
    PS_ASSERT_MSG_HAS(st, want);
  }
  ps_status s = {.code = PS_DEADLINE_EXCEEDED};
  snprintf(s.msg, sizeof s.msg, "ps/1 at h:1: Read: no answer for 2 s (--rpc-timeout)");
  ck_assert(ps_client_stalled(&s));
  snprintf(s.msg, sizeof s.msg, "Deadline Exceeded");
  ck_assert(!ps_client_stalled(&s)); /* gRPC's own deadline is another error */
  ck_assert(!ps_client_stalled(NULL));
  ps_library_shutdown();
}
END_TEST

static ps_harness H;

/* While a call waits on the stopped ps/1: the silence as the metrics see
 * it, for ps/1 and ps/0, after @after seconds. */
typedef struct watcher {
  ps_client *c;
  double after, seen1, seen0;
} watcher;

static void *watch(void *arg) {
  watcher *w = arg;
  usleep((useconds_t)(w->after * 1e6));
  w->seen1 = ps_client_task_unanswered_secs(w->c, 1);
  w->seen0 = ps_client_task_unanswered_secs(w->c, 0);
  return NULL;
}

/* Whether every thread of @pid is stopped (a group stop reaches the
 * threads one by one: until then one may still serve a call). */
static bool all_stopped(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (d == NULL) return false;
  bool all = true;
  struct dirent *e;
  while (all && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char sp[128], buf[512];
    snprintf(sp, sizeof sp, "%s/%s/stat", path, e->d_name);
    FILE *f = fopen(sp, "r");
    if (f == NULL) continue; /* a thread that just ended */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ..." */
    all = p != NULL && p[1] == ' ' && p[2] == 'T';
  }
  closedir(d);
  return all;
}

/* SIGSTOP to @pid, and waits until it took (10 s at most). */
static void stop_ps(pid_t pid) {
  ck_assert_int_eq(kill(pid, SIGSTOP), 0);
  for (int i = 0; i < 2000 && !all_stopped(pid); i++)
    usleep(5000);
  ck_assert_msg(all_stopped(pid), "ps %d did not stop", (int)pid);
}

/* Continues the stopped process *@arg after 1.5 s. */
static void *continue_later(void *arg) {
  usleep(1500000);
  kill(*(pid_t *)arg, SIGCONT);
  return NULL;
}

START_TEST(stopped_ps) {
  ck_assert_int_eq(harness_start(&H, 2, NULL), 0);
  ps_library_init();
  ps_client_options o;
  ps_client_options_default(&o);
  o.rpc_timeout_ms = 3000;
  ps_status st;
  ps_client *c = ps_client_create(H.cluster, "ps", &o, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_client_probe(c, 1, &st), st);
  char want[160];

  /* a stop shorter than the timeout: the call waits and succeeds */
  stop_ps(H.pids[1]);
  pthread_t cont;
  ck_assert_int_eq(pthread_create(&cont, NULL, continue_later, &H.pids[1]), 0);
  double t0 = now_secs();
  int rc = ps_client_probe(c, 1, &st);
  double secs = now_secs() - t0;
  pthread_join(cont, NULL);
  ck_assert_msg(rc == 0, "a 1.5 s stop under a 3 s timeout: %s", st.msg);
  ck_assert_msg(secs >= 1.2, "the call waited for ps/1 (%.2f s)", secs);

  /* a stop for good: DEADLINE_EXCEEDED at the timeout, naming it all */
  stop_ps(H.pids[1]);
  watcher w = {.c = c, .after = 2.0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, watch, &w), 0);
  ps_read r = {.name = "anything"};
  t0 = now_secs();
  rc = ps_client_read(c, 1, &r, 1, &st);
  secs = now_secs() - t0;
  pthread_join(th, NULL);
  ck_assert_int_eq(rc, PS_DEADLINE_EXCEEDED);
  snprintf(want, sizeof want, "ps/1 at %s: Read: no answer for 3 s (--rpc-timeout)",
           H.addrs[1]);
  PS_ASSERT_MSG_HAS(st, want);
  ck_assert(ps_client_stalled(&st));
  ck_assert_ptr_null(r.out);
  ck_assert_msg(secs >= 2.9 && secs < 6.0, "failed after %.2f s, want about 3", secs);
  ck_assert_msg(w.seen1 >= 1.0 && w.seen1 < 3.0, "ps/1 unanswered %.2f s after 2 s",
                w.seen1);
  ck_assert_msg(w.seen0 == 0, "ps/0 unanswered %.2f s", w.seen0);
  ck_assert(ps_client_task_unanswered_secs(c, 1) == 0); /* no call waits now */
  /* an update too (not retried: the ps may have seen it) */
  ps_tensor *one = ps_tensor_new(PS_DT_FLOAT, 0, NULL);
  ck_assert_ptr_nonnull(one);
  ps_update u = {.name = "anything", .op = PS_ASSIGN_ADD, .value = one};
  snprintf(want, sizeof want, "ps/1 at %s: Update: no answer for 3 s (--rpc-timeout)",
           H.addrs[1]);
  PS_ASSERT_STATUS(ps_client_update(c, 1, &u, 1, &st), st, PS_DEADLINE_EXCEEDED, want);
  ps_tensor_destroy(one);
  /* ps/0 answers meanwhile */
  PS_ASSERT_OK(ps_client_probe(c, 0, &st), st);

  /* back: the same client goes on */
  ck_assert_int_eq(kill(H.pids[1], SIGCONT), 0);
  PS_ASSERT_OK(ps_client_probe(c, 1, &st), st);
  ps_client_destroy(c);
  ps_library_shutdown();
  ck_assert_int_eq(harness_stop(&H), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_timeout");
  TCase *tc = tcase_create("rpc_timeout");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, options_and_environment);
  tcase_add_test(tc, stopped_ps);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
