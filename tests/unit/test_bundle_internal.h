/* What the test_bundle*.c files share: file helpers, and the functions
 * that add the other files' tests. */
#ifndef PS_TEST_BUNDLE_INTERNAL_H
#define PS_TEST_BUNDLE_INTERNAL_H

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/crc32c.h"
#include "testdir.h"
#include "tests/support/assert.h"

uint8_t *read_file(const char *path, size_t *n);
void write_file(const char *path, const void *p, size_t n);
void copy_file(const char *from, const char *to);
bool exists(const char *path);
ps_shape shp(int rank, ...);
float read_float(ps_bundle_reader *r, const char *key);
float vval(int64_t i, int64_t j);
void add_v_slice(ps_bundle_writer *w, int64_t row0, int64_t rows);
uint64_t get_varint(const uint8_t **p);
void bundle_slices_tests(TCase *tc);
void bundle_corrupt_tests(TCase *tc);

#endif
