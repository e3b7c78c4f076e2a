/* Scratch directories and test data paths shared by the unit tests.
 *
 * One base directory per test binary, created and removed by an unchecked
 * fixture (it runs in the parent, so it cleans up even when a test fails);
 * one subdirectory per test from a checked fixture:
 *   tcase_add_unchecked_fixture(tc, setup_basedir, teardown_basedir);
 *   tcase_add_checked_fixture(tc, setup_tmpdir, teardown_tmpdir); */
#ifndef PS_TEST_TESTDIR_H
#define PS_TEST_TESTDIR_H

#include <stdio.h>

extern char tmpdir[300]; /* this test's directory */

void setup_basedir(void);
void teardown_basedir(void);
void setup_tmpdir(void);
void teardown_tmpdir(void);
/* rm -r, also through directories made read-only by a test */
void remove_tree(const char *dir);
/* A path under tmpdir (rotating static buffers: copy to keep it). */
const char *tmp(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A path buffer that outlives tmp()'s rotation. */
#define TMP(var, ...)                                                                    \
  char var[1024];                                                                        \
  snprintf(var, sizeof var, "%s", tmp(__VA_ARGS__))
/* A path in TensorFlow's test checkpoints ($PS_TESTDATA/tf-checkpoints). */
const char *tfdata(const char *rel);

#endif
