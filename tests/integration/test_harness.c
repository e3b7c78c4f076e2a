/* The harness leaves nothing behind, however a test ends.
 *
 * This binary is both sides.  Run with "--victim MODE REPORT" it is a Check
 * suite (fork mode, a checked teardown calling harness_stop, as the real
 * tests have) whose one test starts two ps-server, writes their pids and
 * the scratch directory to REPORT, and then ends badly: MODE "assert" is a
 * failed ck_assert (Check's fork mode then calls _exit(1): no teardown, no
 * atexit), "kill" is a SIGKILL of the test process (a crash), "timeout" is
 * a test that hangs until Check's timeout kills its process group; "pass"
 * ends well; "bare-kill" is the same start and SIGKILL without Check
 * (whose runner kills the test's process group after each test, so only
 * PR_SET_PDEATHSIG and the guardian can clean up after a program that is
 * not a Check test, or a test run with CK_FORK=no).
 *
 * Run without arguments, each test below runs the victim as a child, checks
 * how it ended, and then requires, within a bounded deadline, that no
 * process of that run is alive (none names its scratch directory on its
 * command line, the two pids are gone) and that the scratch directory is
 * gone.  With the harness of before (no PR_SET_PDEATHSIG, no guardian)
 * "assert", "kill" and "timeout" fail on the directory left behind, and
 * "bare-kill" times out: the two ps left running hold its output pipe. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "tests/support/assert.h"

/* ---- the victim ---- */

static ps_harness H;
static const char *victim_mode, *victim_report;

static void victim_teardown(void) {
  harness_stop(&H);
}

START_TEST(victim) {
  ck_assert_int_eq(harness_start(&H, 2, NULL), 0);
  FILE *f = fopen(victim_report, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "%d %d %s\n", (int)H.pids[0], (int)H.pids[1], H.dir);
  ck_assert_int_eq(fclose(f), 0);
  if (!strcmp(victim_mode, "assert"))
    ck_assert_msg(0, "deliberate failure with 2 ps running");
  if (!strcmp(victim_mode, "kill")) raise(SIGKILL);
  if (!strcmp(victim_mode, "timeout"))
    for (;;)
      pause(); /* until Check's timeout kills the process group */
}
END_TEST

static int run_victim(const char *mode, const char *report) {
  victim_mode = mode;
  victim_report = report;
  if (!strcmp(mode, "bare-kill")) {
    /* Without Check, which kills the test's process group after the test:
     * only PR_SET_PDEATHSIG and the guardian clean up. */
    if (harness_start(&H, 2, NULL) != 0) return 2;
    FILE *f = fopen(report, "w");
    if (f == NULL) return 2;
    fprintf(f, "%d %d %s\n", (int)H.pids[0], (int)H.pids[1], H.dir);
    if (fclose(f) != 0) return 2;
    raise(SIGKILL);
  }
  Suite *s = suite_create("victim");
  TCase *tc = tcase_create("victim");
  tcase_add_checked_fixture(tc, NULL, victim_teardown);
  tcase_set_timeout(tc, !strcmp(mode, "timeout") ? 3 : 120);
  tcase_add_test(tc, victim);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}

/* ---- the checks ---- */

static char self[4096];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A live (not zombie) process with @pid. */
static int alive(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *q = strrchr(buf, ')');
  return q && q[1] == ' ' && q[2] != 'Z' && q[2] != 'X';
}

/* Number of processes whose command line contains @needle; the first one's
 * pid in @first. */
static int count_naming(const char *needle, pid_t *first) {
  DIR *d = opendir("/proc");
  if (d == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0 || pid == getpid()) continue;
    char path[64], buf[8192];
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < len; i++)
      if (buf[i] == '\0') buf[i] = ' ';
    buf[len] = '\0';
    if (strstr(buf, needle) && alive((pid_t)pid)) {
      if (n == 0 && first) *first = (pid_t)pid;
      n++;
    }
  }
  closedir(d);
  return n;
}

/* Runs the victim in @mode; checks its exit status and that it leaves
 * nothing behind within 30 s. */
static void check_mode(const char *mode, int want_fail, const char *want_text) {
  char report[] = "/tmp/ps-harness-report-XXXXXX";
  int fd = mkstemp(report);
  ck_assert_int_ge(fd, 0);
  close(fd);
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "'%s' --victim %s '%s'", self, mode, report);
  char *out = NULL;
  int rc = harness_run(cmd, &out);
  FILE *f = fopen(report, "r");
  int p0 = 0, p1 = 0;
  char dir[256] = "";
  int got = f ? fscanf(f, "%d %d %255s", &p0, &p1, dir) : 0;
  if (f) fclose(f);
  unlink(report);
  ck_assert_msg(got == 3, "%s: the victim did not report its ps (rc %d):\n%s", mode, rc,
                out);
  ck_assert_msg(strncmp(dir, "/tmp/ps-test-", 13) == 0, "%s: scratch dir '%s'", mode,
                dir);
  if (want_fail)
    ck_assert_msg(rc != 0, "%s: the victim passed:\n%s", mode, out);
  else
    ck_assert_msg(rc == 0, "%s: the victim failed (rc %d):\n%s", mode, rc, out);
  if (want_text)
    ck_assert_msg(strstr(out, want_text) != NULL, "%s: no '%s' in:\n%s", mode, want_text,
                  out);
  free(out);
  /* Poll for the cleanup (the guardian runs after the test process is
   * gone); a bounded deadline, then say what is left. */
  double deadline = now_s() + 30;
  int left = 0, dir_left = 0, p0_alive = 0, p1_alive = 0;
  pid_t first = 0;
  for (;;) {
    struct stat sb;
    left = count_naming(dir, &first);
    dir_left = stat(dir, &sb) == 0;
    p0_alive = alive(p0);
    p1_alive = alive(p1);
    if (left == 0 && !dir_left && !p0_alive && !p1_alive) break;
    if (now_s() > deadline) break;
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
  if (left > 0 || p0_alive || p1_alive) {
    /* do not leave them behind for the next test either */
    if (p0_alive) kill(p0, SIGKILL);
    if (p1_alive) kill(p1, SIGKILL);
  }
  if (dir_left) {
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  }
  ck_assert_msg(!p0_alive && !p1_alive, "%s: ps-server %d %s, %d %s after 30 s", mode, p0,
                p0_alive ? "alive" : "gone", p1, p1_alive ? "alive" : "gone");
  ck_assert_msg(left == 0, "%s: %d processes still name %s (pid %d) after 30 s", mode,
                left, dir, (int)first);
  ck_assert_msg(!dir_left, "%s: %s still exists after 30 s", mode, dir);
}

START_TEST(failed_assert_leaves_nothing) {
  check_mode("assert", 1, "deliberate failure with 2 ps running");
}
END_TEST

START_TEST(killed_test_leaves_nothing) {
  check_mode("kill", 1, NULL);
}
END_TEST

START_TEST(timed_out_test_leaves_nothing) {
  check_mode("timeout", 1, "Test timeout expired");
}
END_TEST

START_TEST(killed_program_leaves_nothing) {
  check_mode("bare-kill", 1, NULL);
}
END_TEST

START_TEST(passing_test_leaves_nothing) {
  check_mode("pass", 0, "100%");
}
END_TEST

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "--victim")) return run_victim(argv[2], argv[3]);
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    perror("readlink /proc/self/exe");
    return 2;
  }
  self[n] = '\0';
  Suite *s = suite_create("harness");
  TCase *tc = tcase_create("cleanup");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, failed_assert_leaves_nothing);
  tcase_add_test(tc, killed_test_leaves_nothing);
  tcase_add_test(tc, timed_out_test_leaves_nothing);
  tcase_add_test(tc, killed_program_leaves_nothing);
  tcase_add_test(tc, passing_test_leaves_nothing);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
