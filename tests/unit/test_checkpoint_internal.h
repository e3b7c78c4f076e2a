/* What the test_checkpoint*.c files share: file helpers, and the function
 * each adds its tests with. */
#ifndef PS_TEST_CHECKPOINT_INTERNAL_H
#define PS_TEST_CHECKPOINT_INTERNAL_H

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bundle.h"
#include "paramserver/checkpoint.h"
#include "testdir.h"
#include "tests/support/assert.h"

void write_text(const char *path, const char *text);
void assert_file_text(const char *path, const char *want);
void assert_dir_has(const char *dir, const char *want);
char *inspect(const char *prefix, bool values, ps_status *st);
void assert_inspect(const char *prefix, bool values, const char *want);
void checkpoint_retention_tests(TCase *tc);
void checkpoint_inspect_tests(TCase *tc);

#endif
