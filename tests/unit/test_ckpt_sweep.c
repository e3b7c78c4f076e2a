/* ps_ckpt_sweep(): the startup sweep of leftover "*_temp" directories of
 * crashed saves.  Only stale ones go: no holder of their flock and nothing
 * modified for PS_CKPT_TEMP_STALE_SECS; links are not followed. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "testdir.h"
#include "tests/support/assert.h"

static void touch_old(const char *p, int secs) {
  struct timespec ts[2];
  clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_sec -= secs;
  ts[1] = ts[0];
  ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW), 0);
}

/* @dir with one file, both @age seconds old (0: now). */
static void make_temp(const char *dir, int age) {
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  char f[1100];
  snprintf(f, sizeof f, "%s/part-00000-of-00002.data-00000-of-00001", dir);
  FILE *fp = fopen(f, "w");
  ck_assert_ptr_nonnull(fp);
  fputs("x", fp);
  fclose(fp);
  if (age) {
    touch_old(f, age);
    touch_old(dir, age);
  }
}

static int gone(const char *p) {
  struct stat sb;
  return lstat(p, &sb) != 0;
}

START_TEST(stale_temp_directories_go_live_ones_stay) {
  ps_status st;
  int stale = PS_CKPT_TEMP_STALE_SECS + 60;
  TMP(root, "ck");
  ck_assert_int_eq(mkdir(root, 0755), 0);
  TMP(old, "ck/model.ckpt-1_temp");
  TMP(fresh, "ck/model.ckpt-2_temp");
  TMP(locked, "ck/model.ckpt-3_temp");
  TMP(young, "ck/model.ckpt-4_temp");
  TMP(sub, "ck/sub");
  TMP(nested, "ck/sub/m_temp");
  TMP(outside, "outside_temp");
  TMP(link, "ck/link_temp");
  TMP(plain, "ck/notatemp");
  make_temp(old, stale);
  make_temp(fresh, 0);
  make_temp(locked, stale);
  make_temp(young, PS_CKPT_TEMP_STALE_SECS - 120); /* a part waiting to be merged */
  ck_assert_int_eq(mkdir(sub, 0755), 0);
  make_temp(nested, stale);
  make_temp(outside, stale);
  ck_assert_int_eq(symlink(outside, link), 0);
  make_temp(plain, stale);
  /* a save writing in `locked` right now holds it shared */
  int fd = open(locked, O_RDONLY | O_DIRECTORY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(flock(fd, LOCK_SH), 0);
  /* one file modified recently keeps an old directory */
  TMP(mixed, "ck/model.ckpt-5_temp");
  make_temp(mixed, stale);
  FILE *fp = fopen(tmp("ck/model.ckpt-5_temp/part-00001-of-00002.index"), "w");
  fclose(fp);

  PS_ASSERT_OK(ps_ckpt_sweep(root, &st), st);
  ck_assert(gone(old));
  ck_assert(gone(nested));
  ck_assert(!gone(fresh));
  ck_assert(!gone(locked));
  ck_assert(!gone(young));
  ck_assert(!gone(mixed));
  ck_assert(!gone(plain));
  ck_assert(!gone(link));    /* a link is not a temp directory */
  ck_assert(!gone(outside)); /* and is not followed */
  /* once its writer is gone, a stale one goes too */
  close(fd);
  PS_ASSERT_OK(ps_ckpt_sweep(root, &st), st);
  ck_assert(gone(locked));
  ck_assert(!gone(fresh));
}
END_TEST

START_TEST(a_missing_directory_is_an_error_naming_it) {
  ps_status st;
  TMP(none, "none");
  PS_ASSERT_STATUS(ps_ckpt_sweep(none, &st), st, PS_NOT_FOUND, none);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ckpt_sweep");
  TCase *tc = tcase_create("ckpt_sweep");
  tcase_add_unchecked_fixture(tc, setup_basedir, teardown_basedir);
  tcase_add_checked_fixture(tc, setup_tmpdir, teardown_tmpdir);
  tcase_add_test(tc, stale_temp_directories_go_live_ones_stay);
  tcase_add_test(tc, a_missing_directory_is_an_error_naming_it);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
