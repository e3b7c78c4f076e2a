/* Unit tests of common/tensor: dtypes, shapes, buffers, conversions. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensor.h"
#include "tests/support/assert.h"

START_TEST(dtype_numbers_match_tensorflow) {
  ck_assert_int_eq(PS_DT_FLOAT, 1);
  ck_assert_int_eq(PS_DT_INT64, 9);
  ck_assert_int_eq(PS_DT_HALF, 19);
  ck_assert_int_eq(PS_DT_BFLOAT16, 14);
  ck_assert_uint_eq(ps_dtype_size(PS_DT_DOUBLE), 8);
  ck_assert_uint_eq(ps_dtype_size(PS_DT_BOOL), 1);
  ck_assert_uint_eq(ps_dtype_size(PS_DT_HALF), 2);
  ck_assert_uint_eq(ps_dtype_size(999), 0);
  ck_assert_str_eq(ps_dtype_name(PS_DT_FLOAT), "float");
  ck_assert_str_eq(ps_dtype_enum_name(PS_DT_INT32), "DT_INT32");
  ck_assert_int_eq(ps_dtype_from_name("float32"), PS_DT_FLOAT);
  ck_assert_int_eq(ps_dtype_from_name("DT_BFLOAT16"), PS_DT_BFLOAT16);
  ck_assert_int_eq(ps_dtype_from_name("nope"), PS_DT_INVALID);
}
END_TEST

START_TEST(shape_format_and_count) {
  ps_shape s;
  int64_t d[] = {2, 3};
  ck_assert_int_eq(ps_shape_set(&s, d, 2, NULL), 0);
  char buf[64];
  ck_assert_str_eq(ps_shape_format(&s, buf, sizeof buf), "[2,3]");
  ck_assert_int_eq(ps_shape_num_elements(&s), 6);
  ps_shape scalar = {0};
  ck_assert_str_eq(ps_shape_format(&scalar, buf, sizeof buf), "[]");
  ck_assert_int_eq(ps_shape_num_elements(&scalar), 1);
  int64_t neg[] = {2, -1};
  ps_status st;
  PS_ASSERT_STATUS(ps_shape_set(&s, neg, 2, &st), st, PS_INVALID_ARGUMENT, "negative");
  int64_t huge[] = {INT64_MAX, 4};
  PS_ASSERT_CODE(ps_shape_set(&s, huge, 2, &st), st, PS_INVALID_ARGUMENT);
}
END_TEST

START_TEST(buffers_are_refcounted) {
  ps_buf *b = ps_buf_create(100, true);
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(((unsigned char *)b->data)[99], 0);
  ck_assert_int_eq((uintptr_t)b->data % 64, 0);
  ps_buf_ref(b);
  ck_assert_int_eq(atomic_load(&b->refs), 2);
  ps_buf_unref(b);
  ps_buf_unref(b);
  ps_buf_unref(NULL);
  ps_tensor_destroy(NULL);
}
END_TEST

/* The index of the first byte of @p that is not 0, or @n. */
static size_t first_nonzero(const unsigned char *p, size_t n) {
  size_t k = 0;
  while (k < n && p[k] == 0)
    k++;
  return k;
}

START_TEST(zeroed_buffers_are_aligned_and_zero) {
  /* Dirty memory of each size is freed first, so that the zeroed buffer
   * is likely to reuse it: calloc's big blocks were 16 bytes into a page
   * (the 64-byte promise broken), and the pages handed back must read as
   * zeros. */
  const size_t sizes[] = {100, 5000, (3u << 20) + 17, (9u << 20) + 4096 + 3};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    unsigned char *dirty = malloc(sizes[i]);
    ck_assert_ptr_nonnull(dirty);
    memset(dirty, 0xab, sizes[i]);
    free(dirty);
    ps_buf *b = ps_buf_create(sizes[i], true);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq((uintptr_t)b->data % 64, 0);
    ck_assert_uint_eq(first_nonzero(b->data, b->alloc), b->alloc);
    memset(b->data, 0xcd, b->alloc); /* back through the cache dirty */
    ps_buf_unref(b);
    b = ps_buf_create(sizes[i], true);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq((uintptr_t)b->data % 64, 0);
    ck_assert_uint_eq(first_nonzero(b->data, b->alloc), b->alloc);
    ps_buf_unref(b);
  }
}
END_TEST

START_TEST(half_and_bfloat16_round_trip) {
  float vals[] = {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.1f};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    float h = ps_half_to_float(ps_float_to_half(vals[i]));
    ck_assert_msg(fabsf(h - vals[i]) <= fabsf(vals[i]) * 1e-3f + 1e-8f, "half %g -> %g",
                  vals[i], h);
    float b = ps_bf16_to_float(ps_float_to_bf16(vals[i]));
    ck_assert_msg(fabsf(b - vals[i]) <= fabsf(vals[i]) * 1e-2f + 1e-30f, "bf16 %g -> %g",
                  vals[i], b);
  }
  ck_assert_uint_eq(ps_float_to_half(1.0f), 0x3c00);
  ck_assert_uint_eq(ps_float_to_bf16(1.0f), 0x3f80);
  ck_assert(isinf(ps_half_to_float(ps_float_to_half(1e6f))));
}
END_TEST

/* The bulk conversions are the one-at-a-time ones, bit for bit: every
 * bfloat16 widened, and floats narrowed at the rounding ties, around
 * them, at the ends of the range, infinities and NaNs (kept NaN). */
START_TEST(bfloat16_bulk_conversions_match_the_scalar_ones) {
  enum { NB = 65536 };
  uint16_t *h = malloc(NB * sizeof *h), *n = malloc(NB * sizeof *n);
  float *f = malloc(NB * sizeof *f);
  ck_assert(h && n && f);
  for (uint32_t i = 0; i < NB; i++)
    h[i] = (uint16_t)i;
  ps_bf16_widen(f, h, NB);
  for (uint32_t i = 0; i < NB; i++) {
    float want = ps_bf16_to_float(h[i]);
    ck_assert_int_eq(memcmp(&f[i], &want, 4), 0);
  }
  uint32_t lows[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t i = 0; i < NB; i++) { /* each bf16's neighbourhood */
    uint32_t bits = ((uint32_t)(i & 0xffff) << 16) | lows[i % 6];
    memcpy(&f[i], &bits, 4);
  }
  ps_bf16_narrow(n, f, NB);
  for (uint32_t i = 0; i < NB; i++) {
    ck_assert_uint_eq(n[i], ps_float_to_bf16(f[i]));
    if (f[i] != f[i]) ck_assert((n[i] & 0x7fff) > 0x7f80); /* a NaN stays one */
  }
  free(h);
  free(n);
  free(f);
}
END_TEST

START_TEST(elementwise_arithmetic) {
  float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40};
  ck_assert_int_eq(ps_elem_apply(PS_DT_FLOAT, '+', a, b, 4), 0);
  ck_assert(a[3] == 44.f);
  ck_assert_int_eq(ps_elem_apply(PS_DT_FLOAT, '-', a, b, 4), 0);
  ck_assert(a[0] == 1.f);
  uint16_t h[2] = {ps_float_to_half(1.5f), ps_float_to_half(2.f)};
  uint16_t g[2] = {ps_float_to_half(0.5f), ps_float_to_half(2.f)};
  ck_assert_int_eq(ps_elem_apply(PS_DT_HALF, '+', h, g, 2), 0);
  ck_assert(ps_half_to_float(h[0]) == 2.f && ps_half_to_float(h[1]) == 4.f);
  uint8_t x[1] = {1}, y[1] = {1};
  ck_assert_int_eq(ps_elem_apply(PS_DT_BOOL, '+', x, y, 1), -1);
  int64_t i64[1] = {5}, j64[1] = {7};
  ps_elem_apply(PS_DT_INT64, '-', i64, j64, 1);
  ck_assert_int_eq(i64[0], -2);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tensor");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, dtype_numbers_match_tensorflow);
  tcase_add_test(tc, shape_format_and_count);
  tcase_add_test(tc, buffers_are_refcounted);
  tcase_add_test(tc, zeroed_buffers_are_aligned_and_zero);
  tcase_add_test(tc, half_and_bfloat16_round_trip);
  tcase_add_test(tc, bfloat16_bulk_conversions_match_the_scalar_ones);
  tcase_add_test(tc, elementwise_arithmetic);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
