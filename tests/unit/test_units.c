/* ps_parse_size: the spellings every size flag accepts, and the ones it
 * refuses (overflow, bounds, junk). */
#include <check.h>
#include <stdint.h>

#include "common/units.h"
#include "tests/support/assert.h"

static int64_t parsed(const char *s, int64_t min, int64_t max) {
  int64_t v = -7;
  ck_assert_msg(ps_parse_size(s, min, max, &v) == 0, "'%s' refused", s);
  return v;
}

static void refused(const char *s, int64_t min, int64_t max) {
  int64_t v = -7;
  const char *shown = s ? s : "(null)";
  ck_assert_msg(ps_parse_size(s, min, max, &v) == -1, "'%s' accepted", shown);
  ck_assert_msg(v == -7, "'%s' refused but *out changed", shown);
}

START_TEST(test_spellings) {
  ck_assert_int_eq(parsed("0", 0, INT64_MAX), 0);
  ck_assert_int_eq(parsed("512", 0, INT64_MAX), 512);
  ck_assert_int_eq(parsed("4k", 0, INT64_MAX), 4096);
  ck_assert_int_eq(parsed("64M", 0, INT64_MAX), (int64_t)64 << 20);
  ck_assert_int_eq(parsed("2GiB", 0, INT64_MAX), (int64_t)2 << 30);
  ck_assert_int_eq(parsed("3TB", 0, INT64_MAX), (int64_t)3 << 40);
  ck_assert_int_eq(parsed("7g", 0, INT64_MAX), (int64_t)7 << 30);
}
END_TEST

START_TEST(test_refusals) {
  refused(NULL, 0, INT64_MAX);
  refused("", 0, INT64_MAX);
  refused("-1", INT64_MIN, INT64_MAX);
  refused(" 5", 0, INT64_MAX);
  refused("5X", 0, INT64_MAX);
  refused("5MB junk", 0, INT64_MAX);
  refused("5Mi", 0, INT64_MAX);
  refused("99999999999999999999", 0, INT64_MAX); /* strtoull overflows */
  refused("8388608T", 0, INT64_MAX);             /* 2^23 << 40 = 2^63 */
  refused("15", 16, INT64_MAX);
  refused("2G", 0, INT32_MAX);
  ck_assert_int_eq(parsed("8388607T", 0, INT64_MAX), (int64_t)8388607 << 40);
  ck_assert_int_eq(parsed("16", 16, 16), 16);
}
END_TEST

static Suite *units_suite(void) {
  Suite *s = suite_create("units");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_spellings);
  tcase_add_test(tc, test_refusals);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(units_suite());
}
