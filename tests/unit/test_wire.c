/* Unit tests of the checks on outside sizes and bytes: the checked size
 * helpers and buffer rounding of common/tensor, wrapping integer
 * arithmetic, and the wire-level string checks of common/wire. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor.h"
#include "common/wire.h"
#include "ps.pb-c.h"
#include "tests/support/assert.h"

START_TEST(size_helpers_refuse_overflow) {
  size_t n = 0;
  ck_assert_int_eq(ps_size_mul(1ull << 31, 1ull << 31, &n), 0);
  ck_assert_uint_eq(n, 1ull << 62);
  ck_assert_int_eq(ps_size_mul(1ull << 32, 1ull << 32, &n), -1);
  ck_assert_int_eq(ps_size_mul(1ull << 62, 2, &n), -1); /* 2^63 > INT64_MAX */
  ck_assert_int_eq(ps_size_add(PS_SIZE_MAX, 1, &n), -1);
  ck_assert_int_eq(ps_size_add(PS_SIZE_MAX - 1, 1, &n), 0);
  ps_shape s = {.rank = 1, .dim = {4611686018427387903LL}};
  ck_assert_int_eq(ps_size_bytes(PS_DT_FLOAT, &s, &n), -1);
  ck_assert_int_eq(ps_size_bytes(PS_DT_INT8, &s, &n), 0);
  s = (ps_shape){.rank = 2, .dim = {1LL << 31, 1LL << 31}};
  ck_assert_int_eq(ps_size_bytes(PS_DT_FLOAT, &s, &n), -1);
  s = (ps_shape){.rank = 2, .dim = {0, -1}};
  ck_assert_int_eq(ps_size_bytes(PS_DT_FLOAT, &s, &n), -1);
  s = (ps_shape){.rank = 2, .dim = {3, 5}};
  ck_assert_int_eq(ps_size_bytes(PS_DT_DOUBLE, &s, &n), 0);
  ck_assert_uint_eq(n, 120);
  ck_assert_int_eq(ps_size_bytes(PS_DT_STRING, &s, &n), -1);
  ck_assert_int_eq(ps_size_elems(PS_DT_INT64, (1LL << 60) - 1, &n), 0);
  ck_assert_int_eq(ps_size_elems(PS_DT_INT64, 1LL << 60, &n), -1);
  ck_assert_int_eq(ps_size_elems(PS_DT_INT64, -1, &n), -1);
}
END_TEST

START_TEST(buffer_rounding_cannot_wrap) {
  ck_assert_ptr_null(ps_buf_create(SIZE_MAX - 10, false));
  ck_assert_ptr_null(ps_buf_create((size_t)-64, true));
  ps_buf *b = ps_buf_create(65, false);
  ck_assert_ptr_nonnull(b);
  ck_assert_uint_eq(b->alloc, 128);
  ps_buf_unref(b);
  ps_shape s = {.rank = 1, .dim = {4611686018427387903LL}};
  ck_assert_ptr_null(ps_tensor_create(PS_DT_FLOAT, &s, false));
}
END_TEST

START_TEST(integer_arithmetic_wraps) {
  int32_t a[3] = {INT32_MAX, INT32_MIN, 5}, b[3] = {1, 1, 7};
  ck_assert_int_eq(ps_elem_apply(PS_DT_INT32, '+', a, b, 3), 0);
  ck_assert_int_eq(a[0], INT32_MIN);
  ck_assert_int_eq(a[1], INT32_MIN + 1);
  ck_assert_int_eq(ps_elem_apply(PS_DT_INT32, '-', a, b, 3), 0);
  ck_assert_int_eq(a[0], INT32_MAX);
  int64_t c[2] = {INT64_MIN, INT64_MAX}, d[2] = {1, -1};
  ck_assert_int_eq(ps_elem_apply(PS_DT_INT64, '-', c, d, 2), 0);
  ck_assert(c[0] == INT64_MAX && c[1] == INT64_MIN);
  int8_t e[1] = {127}, f[1] = {1};
  ck_assert_int_eq(ps_elem_apply(PS_DT_INT8, '+', e, f, 1), 0);
  ck_assert_int_eq(e[0], -128);
  uint64_t g[1] = {0}, h[1] = {1};
  ck_assert_int_eq(ps_elem_apply(PS_DT_UINT64, '-', g, h, 1), 0);
  ck_assert(g[0] == UINT64_MAX);
}
END_TEST

static uint8_t *pack_create(const char *name, size_t *n) {
  Paramserver__Initializer in = PARAMSERVER__INITIALIZER__INIT;
  in.type = "zeros";
  in.full_name = "FULL";
  Paramserver__VariableSpec v = PARAMSERVER__VARIABLE_SPEC__INIT;
  v.name = (char *)name;
  v.dtype = 1;
  v.initializer = &in;
  Paramserver__VariableSpec *vp[1] = {&v};
  Paramserver__CreateRequest r = PARAMSERVER__CREATE_REQUEST__INIT;
  r.vars = vp;
  r.n_vars = 1;
  *n = protobuf_c_message_get_packed_size(&r.base);
  uint8_t *b = malloc(*n);
  protobuf_c_message_pack(&r.base, b);
  return b;
}

static void patch(uint8_t *b, size_t n, const char *from, char to) {
  for (size_t i = 0; i + strlen(from) <= n; i++)
    if (!memcmp(b + i, from, strlen(from))) {
      b[i + strlen(from) - 1] = (uint8_t)to;
      return;
    }
  ck_abort_msg("no %s", from);
}

START_TEST(wire_strings_are_checked) {
  ps_status st;
  size_t n;
  uint8_t *b = pack_create("good/name", &n);
  PS_ASSERT_OK(ps_wire_check_strings(&paramserver__create_request__descriptor, b, n,
                                     "Create", &st),
               st);
  patch(b, n, "good/", '\0');
  PS_ASSERT_CODE(ps_wire_check_strings(&paramserver__create_request__descriptor, b, n,
                                       "Create", &st),
                 st, PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg,
                   "Create: VariableSpec.name \"good\\x00name\" contains a control "
                   "character (NUL or 0x01-0x1f, 0x7f)");
  free(b);
  /* nested: Initializer.full_name */
  b = pack_create("w", &n);
  patch(b, n, "FU", '\n');
  PS_ASSERT_CODE(ps_wire_check_strings(&paramserver__create_request__descriptor, b, n,
                                       "Create", &st),
                 st, PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg,
                   "Create: Initializer.full_name \"F\\x0aLL\" contains a control "
                   "character (NUL or 0x01-0x1f, 0x7f)");
  free(b);
  char *longname = malloc(PS_WIRE_MAX_STRING + 2);
  memset(longname, 'x', PS_WIRE_MAX_STRING + 1);
  longname[PS_WIRE_MAX_STRING + 1] = '\0';
  b = pack_create(longname, &n);
  PS_ASSERT_CODE(ps_wire_check_strings(&paramserver__create_request__descriptor, b, n,
                                       "Create", &st),
                 st, PS_INVALID_ARGUMENT);
  ck_assert_str_eq(st.msg, "Create: VariableSpec.name is 4097 bytes; the limit is 4096");
  free(b);
  free(longname);
  /* malformed bytes are left to the unpacker; truncation at every length
   * never reads past the end */
  b = pack_create("w", &n);
  for (size_t k = 0; k < n; k++)
    ps_wire_check_strings(&paramserver__create_request__descriptor, b, k, "Create", &st);
  free(b);
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                 0xff, 0xff, 0xff, 0xff, 0x01};
  PS_ASSERT_OK(ps_wire_check_strings(&paramserver__create_request__descriptor, junk,
                                     sizeof junk, "Create", &st),
               st);
  /* UTF-8 is fine */
  b = pack_create("w\xc3\xa9", &n);
  PS_ASSERT_OK(ps_wire_check_strings(&paramserver__create_request__descriptor, b, n,
                                     "Create", &st),
               st);
  free(b);
}
END_TEST

START_TEST(escape_for_logs) {
  char out[32];
  ck_assert_str_eq(ps_wire_escape("a\nb\"\\", 5, out, sizeof out), "a\\x0ab\\x22\\x5c");
  char longs[100];
  memset(longs, 'y', sizeof longs);
  ps_wire_escape(longs, sizeof longs, out, sizeof out);
  ck_assert_uint_eq(strlen(out), 31);
  ck_assert_str_eq(out + 28, "...");
}
END_TEST

int main(void) {
  Suite *s = suite_create("wire");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, size_helpers_refuse_overflow);
  tcase_add_test(tc, buffer_rounding_cannot_wrap);
  tcase_add_test(tc, integer_arithmetic_wraps);
  tcase_add_test(tc, wire_strings_are_checked);
  tcase_add_test(tc, escape_for_logs);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
