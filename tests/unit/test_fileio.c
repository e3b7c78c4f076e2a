/* common/fileio.c's ps_read_file: the whole of a file, held to a limit,
 * with its errors: a missing file, a file over the limit (known by its
 * size, or seen only while reading a pipe), a FIFO or a directory where a
 * regular file is wanted, a link not followed. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "testdir.h"
#include "tests/support/assert.h"

static void write_bytes(const char *path, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  for (size_t i = 0; i < n; i++)
    fputc('a' + (int)(i % 26), f);
  ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_missing_file) {
  char *out = (char *)1;
  size_t n = 7;
  const char *op = NULL;
  unsigned type = 1;
  int e = ps_read_file(AT_FDCWD, tmp("none"), PS_READ_REGULAR, 100, &out, &n, &type, &op);
  ck_assert_int_eq(e, ENOENT);
  ck_assert_str_eq(op, "opening");
  ck_assert_ptr_null(out);
  ck_assert_uint_eq(n, 0);
  ck_assert_uint_eq(type, 0);
}
END_TEST

START_TEST(test_at_and_over_the_limit) {
  TMP(path, "ten");
  write_bytes(path, 10);
  char *out;
  size_t n;
  const char *op;
  /* exactly the limit: read, NUL-terminated */
  ck_assert_int_eq(ps_read_file(AT_FDCWD, path, 0, 10, &out, &n, NULL, &op), 0);
  ck_assert_uint_eq(n, 10);
  ck_assert_str_eq(out, "abcdefghij");
  free(out);
  /* one byte over: EFBIG with the size, nothing returned */
  ck_assert_int_eq(ps_read_file(AT_FDCWD, path, PS_READ_REGULAR, 9, &out, &n, NULL, &op),
                   EFBIG);
  ck_assert_ptr_null(out);
  ck_assert_uint_eq(n, 10);
  ck_assert_str_eq(op, "reading");
  /* a limit of nothing: only an empty file fits */
  ck_assert_int_eq(ps_read_file(AT_FDCWD, path, 0, 0, &out, &n, NULL, NULL), EFBIG);
  TMP(empty, "empty");
  write_bytes(empty, 0);
  ck_assert_int_eq(
      ps_read_file(AT_FDCWD, empty, PS_READ_REGULAR, 0, &out, &n, NULL, NULL), 0);
  ck_assert_uint_eq(n, 0);
  ck_assert_str_eq(out, "");
  free(out);
}
END_TEST

/* A pipe has no size: the limit holds while reading, across the buffer's
 * growth. */
START_TEST(test_pipe_over_the_limit) {
  for (int round = 0; round < 2; round++) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    char chunk[10000];
    memset(chunk, 'x', sizeof chunk);
    ck_assert_int_eq(write(fds[1], chunk, sizeof chunk), (ssize_t)sizeof chunk);
    close(fds[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    char *out;
    size_t n;
    const char *op;
    size_t max = round == 0 ? 9999 : 10000;
    int e = ps_read_file(AT_FDCWD, path, 0, max, &out, &n, NULL, &op);
    close(fds[0]);
    if (round == 0) {
      ck_assert_int_eq(e, EFBIG);
      ck_assert_ptr_null(out);
      ck_assert_uint_gt(n, 9999);
      ck_assert_str_eq(op, "reading");
    } else {
      ck_assert_int_eq(e, 0);
      ck_assert_uint_eq(n, 10000);
      ck_assert_int_eq(memcmp(out, chunk, n), 0);
      ck_assert_int_eq(out[n], '\0');
      free(out);
    }
  }
}
END_TEST

START_TEST(test_not_regular) {
  TMP(fifo, "fifo");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  char *out;
  size_t n;
  unsigned type;
  /* refused without blocking, though no one writes to it */
  ck_assert_int_eq(
      ps_read_file(AT_FDCWD, fifo, PS_READ_REGULAR, 100, &out, &n, &type, NULL), EINVAL);
  ck_assert_uint_eq(type, S_IFIFO);
  ck_assert_ptr_null(out);
  ck_assert_int_eq(
      ps_read_file(AT_FDCWD, tmpdir, PS_READ_REGULAR, 100, &out, &n, &type, NULL),
      EISDIR);
  ck_assert_ptr_null(out);
}
END_TEST

START_TEST(test_link_not_followed) {
  TMP(file, "file");
  TMP(link, "link");
  write_bytes(file, 3);
  ck_assert_int_eq(symlink(file, link), 0);
  char *out;
  size_t n;
  ck_assert_int_eq(ps_read_file(AT_FDCWD, link, PS_READ_REGULAR | PS_READ_NOFOLLOW, 100,
                                &out, &n, NULL, NULL),
                   ELOOP);
  ck_assert_ptr_null(out);
  ck_assert_int_eq(
      ps_read_file(AT_FDCWD, link, PS_READ_REGULAR, 100, &out, &n, NULL, NULL), 0);
  ck_assert_str_eq(out, "abc");
  free(out);
  /* relative to a directory */
  int dirfd = open(tmpdir, O_RDONLY | O_DIRECTORY);
  ck_assert_int_ge(dirfd, 0);
  ck_assert_int_eq(
      ps_read_file(dirfd, "file", PS_READ_NOFOLLOW, 100, &out, &n, NULL, NULL), 0);
  ck_assert_str_eq(out, "abc");
  free(out);
  close(dirfd);
}
END_TEST

int main(void) {
  Suite *s = suite_create("fileio");
  TCase *tc = tcase_create("read_file");
  tcase_add_unchecked_fixture(tc, setup_basedir, teardown_basedir);
  tcase_add_checked_fixture(tc, setup_tmpdir, teardown_tmpdir);
  tcase_add_test(tc, test_missing_file);
  tcase_add_test(tc, test_at_and_over_the_limit);
  tcase_add_test(tc, test_pipe_over_the_limit);
  tcase_add_test(tc, test_not_regular);
  tcase_add_test(tc, test_link_not_followed);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
