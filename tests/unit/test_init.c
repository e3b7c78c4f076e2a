/* Initializers: TF defaults and names, constant fills on every dtype,
 * the Philox output layout, partition independence, distribution
 * statistics, fans, and every user-reachable error message. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/init.h"
#include "common/philox.h"
#include "tests/support/assert.h"

#define SHAPE(...)                                                                       \
  mkshape((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                     \
          (int64_t[]){__VA_ARGS__})
#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

static ps_shape mkshape(int rank, const int64_t *dims) {
  ps_shape s;
  memset(&s, 0, sizeof s);
  s.rank = rank;
  for (int i = 0; i < rank; i++)
    s.dim[i] = dims[i];
  return s;
}

static ps_init_spec spec_of(ps_init_type t) {
  ps_init_spec s;
  ps_init_spec_default(&s, t);
  return s;
}

/* Fills the whole tensor; fails the test on error.  Caller frees. */
static void *fill_all(const ps_init_spec *spec, const char *name, int dtype,
                      const ps_shape *shape) {
  int64_t n = ps_shape_num_elements(shape);
  size_t esz = ps_dtype_size(dtype);
  void *out = malloc((size_t)n * esz + 1);
  ck_assert_ptr_nonnull(out);
  ps_status st = {0};
  int rc = ps_init_fill(spec, name, dtype, shape, 0, n, out, &st);
  ck_assert_msg(rc == 0, "fill %s: %s", name, st.msg);
  return out;
}

/* Expects an INVALID_ARGUMENT whose message contains @want, and that
 * nothing was written. */
static void expect_error(const ps_init_spec *spec, const char *name, int dtype,
                         const ps_shape *shape, int64_t offset, int64_t count,
                         const char *want) {
  unsigned char buf[256];
  memset(buf, 0xAB, sizeof buf);
  ps_status st = {0};
  int rc = ps_init_fill(spec, name, dtype, shape, offset, count, buf, &st);
  PS_ASSERT_CODE(rc, st, PS_INVALID_ARGUMENT);
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, want);
  for (size_t i = 0; i < sizeof buf; i++)
    ck_assert_uint_eq(buf[i], 0xAB);
}

typedef struct stats {
  double mean, sd, min, max;
} stats;

static stats stats_of(int dtype, const void *p, int64_t n) {
  stats s = {0, 0, INFINITY, -INFINITY};
  double sum = 0, sum2 = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = ps_elem_get(dtype, p, i);
    sum += v;
    sum2 += v * v;
    if (v < s.min) s.min = v;
    if (v > s.max) s.max = v;
  }
  s.mean = sum / (double)n;
  s.sd = sqrt(sum2 / (double)n - s.mean * s.mean);
  return s;
}

/* ---- names and defaults ---------------------------------------------- */

START_TEST(test_names) {
  static const char *const names[] = {
      "zeros",          "ones",          "constant",
      "random_uniform", "random_normal", "truncated_normal",
      "glorot_uniform", "glorot_normal", "variance_scaling"};
  for (int i = 0; i < (int)NELEMS(names); i++) {
    ck_assert_str_eq(ps_init_type_name((ps_init_type)i), names[i]);
    ck_assert_int_eq(ps_init_type_from_name(names[i]), i);
  }
  ck_assert_str_eq(ps_init_type_name((ps_init_type)99), "unknown");
  ck_assert_int_eq(ps_init_type_from_name("xavier"), -1);
  ck_assert_int_eq(ps_init_type_from_name(""), -1);
  ck_assert_int_eq(ps_init_type_from_name(NULL), -1);

  ck_assert_int_eq(ps_fan_mode_from_name("fan_in"), PS_FAN_IN);
  ck_assert_int_eq(ps_fan_mode_from_name("fan_out"), PS_FAN_OUT);
  ck_assert_int_eq(ps_fan_mode_from_name("fan_avg"), PS_FAN_AVG);
  ck_assert_int_eq(ps_fan_mode_from_name("fan_sum"), -1);
  ck_assert_int_eq(ps_fan_mode_from_name(NULL), -1);

  ck_assert_int_eq(ps_distribution_from_name("truncated_normal"),
                   PS_DIST_TRUNCATED_NORMAL);
  ck_assert_int_eq(ps_distribution_from_name("normal"), PS_DIST_TRUNCATED_NORMAL);
  ck_assert_int_eq(ps_distribution_from_name("untruncated_normal"),
                   PS_DIST_UNTRUNCATED_NORMAL);
  ck_assert_int_eq(ps_distribution_from_name("uniform"), PS_DIST_UNIFORM);
  ck_assert_int_eq(ps_distribution_from_name("gaussian"), -1);
  ck_assert_int_eq(ps_distribution_from_name(NULL), -1);
}
END_TEST

START_TEST(test_spec_defaults) {
  ps_init_spec s = spec_of(PS_INIT_RANDOM_UNIFORM);
  ck_assert_int_eq(s.type, PS_INIT_RANDOM_UNIFORM);
  ck_assert(s.minval == 0.0 && s.maxval == 1.0);
  ck_assert(s.mean == 0.0 && s.stddev == 1.0);
  ck_assert(s.scale == 1.0);
  ck_assert_int_eq(s.mode, PS_FAN_IN);
  ck_assert_int_eq(s.distribution, PS_DIST_TRUNCATED_NORMAL);
  ck_assert(s.value == 0.0);
  ck_assert_ptr_null(s.values);
  ck_assert_uint_eq(s.nvalues, 0);
  ck_assert_int_eq(s.seed, 0);

  s = spec_of(PS_INIT_GLOROT_UNIFORM);
  ck_assert_int_eq(s.mode, PS_FAN_AVG);
  ck_assert_int_eq(s.distribution, PS_DIST_UNIFORM);
  s = spec_of(PS_INIT_GLOROT_NORMAL);
  ck_assert_int_eq(s.mode, PS_FAN_AVG);
  ck_assert_int_eq(s.distribution, PS_DIST_TRUNCATED_NORMAL);
}
END_TEST

START_TEST(test_name_hash) {
  /* FNV-1a 64 reference vectors */
  ck_assert_uint_eq(ps_init_name_hash(""), 0xcbf29ce484222325ull);
  ck_assert_uint_eq(ps_init_name_hash("a"), 0xaf63dc4c8601ec8cull);
  ck_assert_uint_eq(ps_init_name_hash("foobar"), 0x85944171f73967e8ull);
  ck_assert_uint_eq(ps_init_name_hash(NULL), ps_init_name_hash(""));
  ck_assert_uint_ne(ps_init_name_hash("dense/kernel"), ps_init_name_hash("dense/bias"));
}
END_TEST

/* ---- zeros, ones, constant ------------------------------------------- */

static const int all_dtypes[] = {
    PS_DT_FLOAT, PS_DT_DOUBLE, PS_DT_INT32,  PS_DT_UINT8,     PS_DT_INT16,
    PS_DT_INT8,  PS_DT_INT64,  PS_DT_BOOL,   PS_DT_BFLOAT16,  PS_DT_UINT16,
    PS_DT_HALF,  PS_DT_UINT32, PS_DT_UINT64, PS_DT_COMPLEX64, PS_DT_COMPLEX128,
};

static double real_at(int dtype, const void *p, int64_t i, double *imag) {
  *imag = 0;
  if (dtype == PS_DT_COMPLEX64) {
    *imag = ((const float *)p)[2 * i + 1];
    return ((const float *)p)[2 * i];
  }
  if (dtype == PS_DT_COMPLEX128) {
    *imag = ((const double *)p)[2 * i + 1];
    return ((const double *)p)[2 * i];
  }
  return ps_elem_get(dtype, p, i);
}

START_TEST(test_zeros_ones_constant_every_dtype) {
  ps_shape shape = SHAPE(3, 5); /* 15 elements; fill [4, 11) */
  const int64_t off = 4, cnt = 7;
  for (size_t d = 0; d < NELEMS(all_dtypes); d++) {
    int dt = all_dtypes[d];
    size_t esz = ps_dtype_size(dt);
    unsigned char buf[16 * 8];
    ck_assert_uint_le(esz * (size_t)(cnt + 1), sizeof buf);
    ps_status st = {0};
    const ps_init_type types[] = {PS_INIT_ZEROS, PS_INIT_ONES, PS_INIT_CONSTANT};
    const double want[] = {0.0, 1.0, dt == PS_DT_BOOL ? 1.0 : 5.0};
    for (int t = 0; t < 3; t++) {
      ps_init_spec s = spec_of(types[t]);
      s.value = want[t];
      memset(buf, 0xAB, sizeof buf);
      int rc = ps_init_fill(&s, "c", dt, &shape, off, cnt, buf, &st);
      ck_assert_msg(rc == 0, "%s on %s: %s", ps_init_type_name(types[t]),
                    ps_dtype_name(dt), st.msg);
      for (int64_t i = 0; i < cnt; i++) {
        double im, re = real_at(dt, buf, i, &im);
        ck_assert_msg(re == want[t] && im == 0.0, "%s on %s: element %lld = %g",
                      ps_init_type_name(types[t]), ps_dtype_name(dt), (long long)i, re);
      }
      /* nothing past the range is written */
      for (size_t b = esz * (size_t)cnt; b < sizeof buf; b++)
        ck_assert_uint_eq(buf[b], 0xAB);
    }
  }
}
END_TEST

START_TEST(test_half_bf16_one) {
  ps_shape shape = SHAPE(4);
  ps_init_spec s = spec_of(PS_INIT_ONES);
  uint16_t h[4], b[4];
  ck_assert_int_eq(ps_init_fill(&s, "h", PS_DT_HALF, &shape, 0, 4, h, NULL), 0);
  ck_assert_int_eq(ps_init_fill(&s, "b", PS_DT_BFLOAT16, &shape, 0, 4, b, NULL), 0);
  for (int i = 0; i < 4; i++) {
    ck_assert_uint_eq(h[i], 0x3C00); /* IEEE half 1.0 */
    ck_assert_uint_eq(b[i], 0x3F80); /* bfloat16 1.0 */
    ck_assert(ps_half_to_float(h[i]) == 1.0f);
    ck_assert(ps_bf16_to_float(b[i]) == 1.0f);
  }
}
END_TEST

START_TEST(test_constant_scalar_and_large) {
  ps_shape shape = SHAPE(1000, 3);
  ps_init_spec s = spec_of(PS_INIT_CONSTANT);
  s.value = -2.25;
  float *f = fill_all(&s, "big", PS_DT_FLOAT, &shape);
  for (int i = 0; i < 3000; i++)
    ck_assert(f[i] == -2.25f);
  free(f);
  s.value = -9223372036854775808.0; /* INT64_MIN fits */
  int64_t *q = fill_all(&s, "big", PS_DT_INT64, &shape);
  for (int i = 0; i < 3000; i++)
    ck_assert(q[i] == INT64_MIN);
  free(q);
  s.value = 18446744073709549568.0; /* largest double below 2^64 */
  uint64_t *u = fill_all(&s, "big", PS_DT_UINT64, &shape);
  ck_assert(u[2999] == 18446744073709549568ull);
  free(u);
}
END_TEST

START_TEST(test_constant_list_padding) {
  ps_shape shape = SHAPE(2, 3);
  const double vals[] = {1, 2, 3};
  ps_init_spec s = spec_of(PS_INIT_CONSTANT);
  s.values = vals;
  s.nvalues = 3;
  float *f = fill_all(&s, "p", PS_DT_FLOAT, &shape);
  const float want[] = {1, 2, 3, 3, 3, 3};
  for (int i = 0; i < 6; i++)
    ck_assert(f[i] == want[i]);
  free(f);

  /* a sub-range sees the same elements */
  int32_t part[4];
  ck_assert_int_eq(ps_init_fill(&s, "p", PS_DT_INT32, &shape, 1, 4, part, NULL), 0);
  ck_assert_int_eq(part[0], 2);
  ck_assert_int_eq(part[1], 3);
  ck_assert_int_eq(part[2], 3);
  ck_assert_int_eq(part[3], 3);
  ck_assert_int_eq(ps_init_fill(&s, "p", PS_DT_INT32, &shape, 4, 2, part, NULL), 0);
  ck_assert_int_eq(part[0], 3);
  ck_assert_int_eq(part[1], 3);

  /* exact length: no padding */
  const double six[] = {6, 5, 4, 3, 2, 1};
  s.values = six;
  s.nvalues = 6;
  double *d = fill_all(&s, "p", PS_DT_DOUBLE, &shape);
  for (int i = 0; i < 6; i++)
    ck_assert(d[i] == six[i]);
  free(d);

  /* one value: the whole tensor */
  const double one[] = {7};
  s.values = one;
  s.nvalues = 1;
  uint16_t *h = fill_all(&s, "p", PS_DT_HALF, &shape);
  for (int i = 0; i < 6; i++)
    ck_assert(ps_half_to_float(h[i]) == 7.0f);
  free(h);
}
END_TEST

START_TEST(test_constant_too_many) {
  ps_shape shape = SHAPE(2, 3);
  const double vals[] = {1, 2, 3, 4, 5, 6, 7};
  ps_init_spec s = spec_of(PS_INIT_CONSTANT);
  s.values = vals;
  s.nvalues = 7;
  expect_error(&s, "dense/kernel", PS_DT_FLOAT, &shape, 0, 6,
               "Too many elements provided. Needed at most 6, but received 7");
  expect_error(&s, "dense/kernel", PS_DT_FLOAT, &shape, 0, 6, "dense/kernel");
  /* judged against the full shape, also when filling a part */
  expect_error(&s, "dense/kernel", PS_DT_FLOAT, &shape, 2, 2, "Needed at most 6");
  ps_shape empty = SHAPE(0, 3);
  s.nvalues = 1;
  expect_error(&s, "e", PS_DT_FLOAT, &empty, 0, 0, "Needed at most 0, but received 1");
}
END_TEST

START_TEST(test_constant_bad_values) {
  ps_shape shape = SHAPE(4);
  ps_init_spec s = spec_of(PS_INIT_CONSTANT);
  s.value = 0.5;
  expect_error(&s, "v", PS_DT_INT32, &shape, 0, 4,
               "variable v: constant 0.5 is not representable as int32");
  s.value = 300;
  expect_error(&s, "v", PS_DT_UINT8, &shape, 0, 4, "not representable as uint8");
  s.value = -1;
  expect_error(&s, "v", PS_DT_UINT32, &shape, 0, 4, "not representable as uint32");
  s.value = 2;
  expect_error(&s, "v", PS_DT_BOOL, &shape, 0, 4, "not representable as bool");
  s.value = NAN;
  expect_error(&s, "v", PS_DT_INT64, &shape, 0, 4, "not representable as int64");
  s.value = 9223372036854775808.0;
  expect_error(&s, "v", PS_DT_INT64, &shape, 0, 4, "not representable as int64");
  s.value = 18446744073709551616.0;
  expect_error(&s, "v", PS_DT_UINT64, &shape, 0, 4, "not representable as uint64");
  s.value = 32768;
  expect_error(&s, "v", PS_DT_INT16, &shape, 0, 4, "not representable as int16");

  /* a bad value anywhere in the list fails every part alike */
  const double vals[] = {1, 2, 1e10};
  s.values = vals;
  s.nvalues = 3;
  expect_error(&s, "v", PS_DT_INT32, &shape, 0, 1, "(index 2)");

  const double none[] = {0};
  s.values = none;
  s.nvalues = 0;
  expect_error(&s, "v", PS_DT_FLOAT, &shape, 0, 4, "empty value list");

  /* floats take anything, including inf */
  s.values = NULL;
  s.value = INFINITY;
  float f[4];
  ck_assert_int_eq(ps_init_fill(&s, "v", PS_DT_FLOAT, &shape, 0, 4, f, NULL), 0);
  ck_assert(isinf(f[3]));
}
END_TEST

START_TEST(test_unsupported_dtypes) {
  ps_shape shape = SHAPE(4);
  ps_init_spec s = spec_of(PS_INIT_ZEROS);
  expect_error(&s, "str", PS_DT_STRING, &shape, 0, 4,
               "variable str: initializer zeros does not support dtype string");
  expect_error(&s, "str", 99, &shape, 0, 4, "does not support dtype unknown (99)");

  static const ps_init_type rnd[] = {PS_INIT_RANDOM_UNIFORM,   PS_INIT_RANDOM_NORMAL,
                                     PS_INIT_TRUNCATED_NORMAL, PS_INIT_GLOROT_UNIFORM,
                                     PS_INIT_GLOROT_NORMAL,    PS_INIT_VARIANCE_SCALING};
  static const int ints[] = {PS_DT_INT32, PS_DT_INT64, PS_DT_UINT8, PS_DT_BOOL,
                             PS_DT_COMPLEX64};
  for (size_t t = 0; t < NELEMS(rnd); t++) {
    for (size_t d = 0; d < NELEMS(ints); d++) {
      char want[128];
      snprintf(want, sizeof want,
               "variable W: initializer %s needs a floating dtype, got %s",
               ps_init_type_name(rnd[t]), ps_dtype_name(ints[d]));
      s = spec_of(rnd[t]);
      expect_error(&s, "W", ints[d], &shape, 0, 4, want);
    }
  }
  s = spec_of(PS_INIT_RANDOM_NORMAL);
  expect_error(&s, "W", PS_DT_INT32, &shape, 0, 4,
               "variable W: initializer random_normal needs a floating dtype, "
               "got int32");
}
END_TEST

/* ---- random layout: element i is a fixed function of Philox calls ---- */

static ps_philox base_gen(int64_t seed, const char *name) {
  ps_philox p;
  ps_philox_init(&p, seed ? (uint64_t)seed : 87654321u, ps_init_name_hash(name));
  return p;
}

START_TEST(test_layout_uniform_float) {
  ps_shape shape = SHAPE(10);
  ps_init_spec s = spec_of(PS_INIT_RANDOM_UNIFORM);
  s.minval = -1;
  s.maxval = 3;
  float *f = fill_all(&s, "layout/u", PS_DT_FLOAT, &shape);
  ps_philox p = base_gen(0, "layout/u");
  for (int c = 0; c < 3; c++) {
    uint32_t w[4];
    ps_philox_next(&p, w);
    for (int j = 0; j < 4 && 4 * c + j < 10; j++) {
      float want = ps_uint32_to_float(w[j]) * (3.0f - -1.0f) + -1.0f;
      ck_assert_msg(f[4 * c + j] == want, "element %d", 4 * c + j);
    }
  }
  free(f);
}
END_TEST

START_TEST(test_layout_normal_float) {
  ps_shape shape = SHAPE(9);
  ps_init_spec s = spec_of(PS_INIT_RANDOM_NORMAL);
  s.mean = 0.5;
  s.stddev = 2;
  s.seed = 1234;
  float *f = fill_all(&s, "layout/n", PS_DT_FLOAT, &shape);
  ps_philox p = base_gen(1234, "layout/n");
  for (int c = 0; c < 3; c++) {
    uint32_t w[4];
    float z[4];
    ps_philox_next(&p, w);
    ps_box_muller(w[0], w[1], &z[0], &z[1]);
    ps_box_muller(w[2], w[3], &z[2], &z[3]);
    for (int j = 0; j < 4 && 4 * c + j < 9; j++)
      ck_assert_msg(f[4 * c + j] == z[j] * 2.0f + 0.5f, "element %d", 4 * c + j);
  }
  free(f);
}
END_TEST

/* Reference truncated normal group, written the obvious way. */
static void ref_trunc_group(ps_philox p, int64_t g, float z[4]) {
  ps_philox_skip(&p, (uint64_t)g * 256);
  uint32_t words[64];
  int nw = 0, n = 0;
  while (nw + 4 <= 64) {
    ps_philox_next(&p, &words[nw]);
    nw += 4;
  }
  for (int k = 0; k + 1 < nw && n < 4; k += 2) {
    float f[2];
    ps_box_muller(words[k], words[k + 1], &f[0], &f[1]);
    for (int j = 0; j < 2 && n < 4; j++)
      if (fabsf(f[j]) < 2.0f) z[n++] = f[j];
  }
  ck_assert_int_eq(n, 4);
}

START_TEST(test_layout_truncated_float) {
  ps_shape shape = SHAPE(4096 + 3);
  ps_init_spec s = spec_of(PS_INIT_TRUNCATED_NORMAL);
  float *f = fill_all(&s, "layout/t", PS_DT_FLOAT, &shape);
  ps_philox p = base_gen(0, "layout/t");
  int64_t n = 4096 + 3;
  for (int64_t g = 0; g * 4 < n; g++) {
    float z[4];
    ref_trunc_group(p, g, z);
    for (int j = 0; j < 4 && g * 4 + j < n; j++)
      ck_assert_msg(f[g * 4 + j] == z[j], "element %lld", (long long)(g * 4 + j));
  }
  free(f);
}
END_TEST

START_TEST(test_layout_double) {
  ps_shape shape = SHAPE(5);
  ps_init_spec s = spec_of(PS_INIT_RANDOM_UNIFORM);
  double *u = fill_all(&s, "layout/d", PS_DT_DOUBLE, &shape);
  s = spec_of(PS_INIT_RANDOM_NORMAL);
  double *nrm = fill_all(&s, "layout/d", PS_DT_DOUBLE, &shape);
  ps_philox p = base_gen(0, "layout/d");
  for (int c = 0; c < 3; c++) {
    uint32_t w[4];
    double z[2];
    ps_philox_next(&p, w);
    ps_box_muller_double(w[0], w[1], w[2], w[3], &z[0], &z[1]);
    ck_assert(u[2 * c] == ps_uint64_to_double(w[0], w[1]));
    ck_assert(nrm[2 * c] == z[0]);
    if (2 * c + 1 < 5) {
      ck_assert(u[2 * c + 1] == ps_uint64_to_double(w[2], w[3]));
      ck_assert(nrm[2 * c + 1] == z[1]);
    }
  }
  free(u);
  free(nrm);

  /* truncated doubles: groups of 2 at a stride of 128 calls */
  s = spec_of(PS_INIT_TRUNCATED_NORMAL);
  double *t = fill_all(&s, "layout/d", PS_DT_DOUBLE, &shape);
  for (int g = 0; g < 3; g++) {
    ps_philox q = base_gen(0, "layout/d");
    ps_philox_skip(&q, (uint64_t)g * 128);
    double z[2];
    int n = 0;
    while (n < 2) {
      uint32_t w[4];
      double d[2];
      ps_philox_next(&q, w);
      ps_box_muller_double(w[0], w[1], w[2], w[3], &d[0], &d[1]);
      for (int j = 0; j < 2 && n < 2; j++)
        if (fabs(d[j]) < 2.0) z[n++] = d[j];
    }
    for (int j = 0; j < 2 && 2 * g + j < 5; j++)
      ck_assert(t[2 * g + j] == z[j]);
  }
  free(t);
}
END_TEST

/* ---- partition independence and determinism --------------------------- */

START_TEST(test_partition_independence) {
  static const ps_init_type types[] = {PS_INIT_RANDOM_UNIFORM,   PS_INIT_RANDOM_NORMAL,
                                       PS_INIT_TRUNCATED_NORMAL, PS_INIT_GLOROT_UNIFORM,
                                       PS_INIT_GLOROT_NORMAL,    PS_INIT_VARIANCE_SCALING,
                                       PS_INIT_CONSTANT};
  static const int dtypes[] = {PS_DT_FLOAT, PS_DT_DOUBLE, PS_DT_HALF, PS_DT_BFLOAT16};
  static const double vals[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  ps_shape shape = SHAPE(37, 29); /* 1073 elements */
  const int64_t n = 37 * 29;
  /* uneven cuts, none on a group boundary */
  const int64_t cuts[][2] = {{0, 7}, {7, 493}, {500, 573}};
  for (size_t t = 0; t < NELEMS(types); t++) {
    for (size_t d = 0; d < NELEMS(dtypes); d++) {
      ps_init_spec s = spec_of(types[t]);
      s.values = vals;
      s.nvalues = NELEMS(vals);
      s.distribution = PS_DIST_UNTRUNCATED_NORMAL;
      s.seed = 77;
      size_t esz = ps_dtype_size(dtypes[d]);
      unsigned char *whole = fill_all(&s, "part/v", dtypes[d], &shape);
      unsigned char *parts = malloc((size_t)n * esz);
      ck_assert_ptr_nonnull(parts);
      for (size_t c = 0; c < NELEMS(cuts); c++) {
        ps_status st = {0};
        int rc = ps_init_fill(&s, "part/v", dtypes[d], &shape, cuts[c][0], cuts[c][1],
                              parts + (size_t)cuts[c][0] * esz, &st);
        PS_ASSERT_OK(rc, st);
      }
      ck_assert_msg(memcmp(whole, parts, (size_t)n * esz) == 0,
                    "%s on %s differs when filled in parts", ps_init_type_name(types[t]),
                    ps_dtype_name(dtypes[d]));
      /* and element by element, from any starting point */
      for (int64_t i = 0; i < 64; i++) {
        unsigned char one[8];
        ck_assert_int_eq(ps_init_fill(&s, "part/v", dtypes[d], &shape, i, 1, one, NULL),
                         0);
        ck_assert(memcmp(one, whole + (size_t)i * esz, esz) == 0);
      }
      free(whole);
      free(parts);
    }
  }
}
END_TEST

START_TEST(test_determinism) {
  ps_shape shape = SHAPE(1000);
  ps_init_spec s = spec_of(PS_INIT_GLOROT_UNIFORM);
  float *a = fill_all(&s, "layer1/kernel", PS_DT_FLOAT, &shape);
  float *b = fill_all(&s, "layer1/kernel", PS_DT_FLOAT, &shape);
  float *c = fill_all(&s, "layer2/kernel", PS_DT_FLOAT, &shape);
  s.seed = 87654321; /* the default seed, given explicitly */
  float *d = fill_all(&s, "layer1/kernel", PS_DT_FLOAT, &shape);
  s.seed = 1;
  float *e = fill_all(&s, "layer1/kernel", PS_DT_FLOAT, &shape);
  ck_assert(memcmp(a, b, 1000 * sizeof(float)) == 0);
  ck_assert(memcmp(a, d, 1000 * sizeof(float)) == 0);
  int same_name = 0, same_seed = 0;
  for (int i = 0; i < 1000; i++) {
    same_name += a[i] == c[i];
    same_seed += a[i] == e[i];
  }
  ck_assert_int_lt(same_name, 5);
  ck_assert_int_lt(same_seed, 5);
  free(a);
  free(b);
  free(c);
  free(d);
  free(e);
}
END_TEST

/* ---- statistics on 100k samples -------------------------------------- */

START_TEST(test_stats_uniform) {
  ps_shape shape = SHAPE(100000);
  ps_init_spec s = spec_of(PS_INIT_RANDOM_UNIFORM);
  s.minval = -2;
  s.maxval = 3;
  const int dts[] = {PS_DT_FLOAT, PS_DT_DOUBLE};
  for (size_t d = 0; d < NELEMS(dts); d++) {
    void *v = fill_all(&s, "u", dts[d], &shape);
    stats st = stats_of(dts[d], v, 100000);
    ck_assert_msg(st.min >= -2 && st.max < 3, "[%g, %g]", st.min, st.max);
    ck_assert(st.min < -1.999 && st.max > 2.999);
    ck_assert_msg(fabs(st.mean - 0.5) < 0.02, "mean %g", st.mean);
    ck_assert_msg(fabs(st.sd - 5 / sqrt(12)) < 0.02, "sd %g", st.sd);
    free(v);
  }
  /* default [0, 1) */
  s = spec_of(PS_INIT_RANDOM_UNIFORM);
  float *f = fill_all(&s, "u01", PS_DT_FLOAT, &shape);
  stats st = stats_of(PS_DT_FLOAT, f, 100000);
  ck_assert(st.min >= 0 && st.max < 1);
  ck_assert(fabs(st.mean - 0.5) < 0.01);
  free(f);
}
END_TEST

START_TEST(test_stats_normal) {
  ps_shape shape = SHAPE(100000);
  ps_init_spec s = spec_of(PS_INIT_RANDOM_NORMAL);
  s.mean = 1;
  s.stddev = 2;
  const int dts[] = {PS_DT_FLOAT, PS_DT_DOUBLE};
  for (size_t d = 0; d < NELEMS(dts); d++) {
    void *v = fill_all(&s, "n", dts[d], &shape);
    stats st = stats_of(dts[d], v, 100000);
    ck_assert_msg(fabs(st.mean - 1) < 0.03, "mean %g", st.mean);
    ck_assert_msg(fabs(st.sd - 2) < 0.03, "sd %g", st.sd);
    ck_assert(st.max > 1 + 2 * 3.5 && st.min < 1 - 2 * 3.5); /* untruncated */
    free(v);
  }
}
END_TEST

START_TEST(test_stats_truncated) {
  ps_shape shape = SHAPE(100000);
  ps_init_spec s = spec_of(PS_INIT_TRUNCATED_NORMAL);
  s.mean = 1;
  s.stddev = 2;
  const int dts[] = {PS_DT_FLOAT, PS_DT_DOUBLE};
  for (size_t d = 0; d < NELEMS(dts); d++) {
    void *v = fill_all(&s, "t", dts[d], &shape);
    stats st = stats_of(dts[d], v, 100000);
    ck_assert_msg(st.min > 1 - 4 && st.max < 1 + 4, "[%g, %g]", st.min, st.max);
    ck_assert(st.min < 1 - 3.99 && st.max > 1 + 3.99);
    ck_assert_msg(fabs(st.mean - 1) < 0.03, "mean %g", st.mean);
    /* a normal truncated at 2 sd keeps 0.8796 of its sd */
    ck_assert_msg(fabs(st.sd - 2 * 0.87962566103423978) < 0.03, "sd %g", st.sd);
    free(v);
  }
}
END_TEST

START_TEST(test_glorot_uniform) {
  ps_shape shape = SHAPE(200, 500);
  ps_init_spec s = spec_of(PS_INIT_GLOROT_UNIFORM);
  s.scale = 100; /* ignored: glorot's scale, mode and distribution are fixed */
  s.mode = PS_FAN_IN;
  s.distribution = PS_DIST_UNTRUNCATED_NORMAL;
  float *f = fill_all(&s, "dense/kernel", PS_DT_FLOAT, &shape);
  double limit = sqrt(6.0 / (200 + 500));
  stats st = stats_of(PS_DT_FLOAT, f, 100000);
  ck_assert_msg(st.max <= limit && st.min >= -limit, "[%g, %g] limit %g", st.min, st.max,
                limit);
  ck_assert_msg(st.max > 0.999 * limit && st.min < -0.999 * limit, "[%g, %g] limit %g",
                st.min, st.max, limit);
  ck_assert(fabs(st.mean) < 0.01 * limit);
  ck_assert_msg(fabs(st.sd / (limit / sqrt(3)) - 1) < 0.02, "sd %g", st.sd);
  free(f);

  /* half and bfloat16 stay within the limit up to their rounding */
  uint16_t *h = fill_all(&s, "dense/kernel", PS_DT_HALF, &shape);
  st = stats_of(PS_DT_HALF, h, 100000);
  ck_assert(st.max <= limit * (1 + 0x1p-10) && st.min >= -limit * (1 + 0x1p-10));
  ck_assert(st.max > 0.99 * limit);
  ck_assert(fabs(st.mean) < 0.01 * limit);
  free(h);
  uint16_t *b = fill_all(&s, "dense/kernel", PS_DT_BFLOAT16, &shape);
  st = stats_of(PS_DT_BFLOAT16, b, 100000);
  ck_assert(st.max <= limit * (1 + 0x1p-7) && st.min >= -limit * (1 + 0x1p-7));
  ck_assert(st.max > 0.99 * limit);
  free(b);
}
END_TEST

START_TEST(test_glorot_normal) {
  ps_shape shape = SHAPE(200, 500);
  ps_init_spec s = spec_of(PS_INIT_GLOROT_NORMAL);
  float *f = fill_all(&s, "dense/kernel", PS_DT_FLOAT, &shape);
  double sd = sqrt(1.0 / 350); /* sqrt(2 / (fan_in + fan_out)) */
  float cut = 2.0f * (float)(sd / 0.87962566103423978);
  stats st = stats_of(PS_DT_FLOAT, f, 100000);
  ck_assert_msg(st.max <= cut && st.min >= -cut, "[%g, %g] cut %g", st.min, st.max,
                (double)cut);
  ck_assert(st.max > 0.99 * cut);
  ck_assert(fabs(st.mean) < 0.01 * sd);
  ck_assert_msg(fabs(st.sd / sd - 1) < 0.02, "sd %g want %g", st.sd, sd);
  free(f);
}
END_TEST

START_TEST(test_variance_scaling_fans) {
  /* conv kernel [3,3,64,128]: receptive field 9, fan_in 576, fan_out 1152 */
  ps_shape conv = SHAPE(3, 3, 64, 128);
  const int64_t n = 3 * 3 * 64 * 128;
  const struct {
    ps_fan_mode mode;
    double fan;
  } cases[] = {{PS_FAN_IN, 576}, {PS_FAN_OUT, 1152}, {PS_FAN_AVG, 864}};
  for (size_t c = 0; c < NELEMS(cases); c++) {
    ps_init_spec s = spec_of(PS_INIT_VARIANCE_SCALING);
    s.scale = 2;
    s.mode = cases[c].mode;
    s.distribution = PS_DIST_UNIFORM;
    float *f = fill_all(&s, "conv/kernel", PS_DT_FLOAT, &conv);
    double limit = sqrt(3 * 2 / cases[c].fan);
    stats st = stats_of(PS_DT_FLOAT, f, n);
    ck_assert_msg(st.max <= limit && st.max > 0.999 * limit, "max %g limit %g", st.max,
                  limit);
    ck_assert(st.min >= -limit && st.min < -0.999 * limit);
    free(f);
  }

  /* untruncated_normal: sd = sqrt(scale / fan_in), tails beyond 2 sd */
  ps_init_spec s = spec_of(PS_INIT_VARIANCE_SCALING);
  s.scale = 2;
  s.distribution = PS_DIST_UNTRUNCATED_NORMAL;
  double sd = sqrt(2.0 / 576);
  double *d = fill_all(&s, "conv/kernel", PS_DT_DOUBLE, &conv);
  stats st = stats_of(PS_DT_DOUBLE, d, n);
  ck_assert_msg(fabs(st.sd / sd - 1) < 0.02, "sd %g want %g", st.sd, sd);
  ck_assert(st.max > 3 * sd);
  free(d);

  /* default (truncated_normal): same sd, nothing beyond 2/0.8796 of it */
  s.distribution = PS_DIST_TRUNCATED_NORMAL;
  d = fill_all(&s, "conv/kernel", PS_DT_DOUBLE, &conv);
  st = stats_of(PS_DT_DOUBLE, d, n);
  ck_assert_msg(fabs(st.sd / sd - 1) < 0.02, "sd %g want %g", st.sd, sd);
  ck_assert(st.max < 2 * sd / 0.87962566103423978);
  ck_assert(st.min > -2 * sd / 0.87962566103423978);
  free(d);

  /* rank 1: fan_in = fan_out = s0 */
  ps_shape vec = SHAPE(3000);
  s = spec_of(PS_INIT_GLOROT_UNIFORM);
  float *f = fill_all(&s, "bias", PS_DT_FLOAT, &vec);
  st = stats_of(PS_DT_FLOAT, f, 3000);
  double limit = sqrt(6.0 / 6000);
  ck_assert(st.max <= limit && st.max > 0.99 * limit);
  free(f);

  /* rank 0: fans (1,1), so glorot's limit is sqrt(3) */
  ps_shape scalar = mkshape(0, NULL);
  float one;
  ps_philox p = base_gen(0, "scalar");
  uint32_t w[4];
  ps_philox_next(&p, w);
  ck_assert_int_eq(ps_init_fill(&s, "scalar", PS_DT_FLOAT, &scalar, 0, 1, &one, NULL), 0);
  float lim = (float)sqrt(3.0);
  ck_assert(one == ps_uint32_to_float(w[0]) * (lim - -lim) + -lim);

  /* a zero dim gives fan 0, and scale is divided by max(1, fan) */
  ps_shape zero = SHAPE(0, 5);
  ck_assert_int_eq(ps_init_fill(&s, "z", PS_DT_FLOAT, &zero, 0, 0, NULL, NULL), 0);
}
END_TEST

/* ---- argument checks -------------------------------------------------- */

START_TEST(test_range_errors) {
  ps_shape shape = SHAPE(2, 3);
  ps_init_spec s = spec_of(PS_INIT_RANDOM_UNIFORM);
  expect_error(&s, "r", PS_DT_FLOAT, &shape, -1, 2, "variable r: elements [-1");
  expect_error(&s, "r", PS_DT_FLOAT, &shape, 0, -1, "outside shape [2,3]");
  expect_error(&s, "r", PS_DT_FLOAT, &shape, 5, 2, "outside shape [2,3] (6 elements)");
  expect_error(&s, "r", PS_DT_FLOAT, &shape, 7, 0, "outside shape");
  expect_error(&s, "r", PS_DT_FLOAT, &shape, INT64_MAX, INT64_MAX, "outside shape");
  expect_error(&s, "r", PS_DT_FLOAT, &shape, 1, INT64_MAX, "outside shape");

  ps_shape bad = SHAPE(2, -3);
  expect_error(&s, "r", PS_DT_FLOAT, &bad, 0, 1, "variable r: invalid shape [2,-3]");
  ps_shape huge = SHAPE(INT64_MAX, 3);
  expect_error(&s, "r", PS_DT_FLOAT, &huge, 0, 1, "invalid shape");
  ps_shape deep = shape;
  deep.rank = PS_MAX_RANK + 1;
  expect_error(&s, "r", PS_DT_FLOAT, &deep, 0, 1, "rank 17 is out of range");
  deep.rank = -1;
  expect_error(&s, "r", PS_DT_FLOAT, &deep, 0, 1, "rank -1 is out of range");

  expect_error(&s, NULL, PS_DT_FLOAT, &shape, 0, 1, "variable name is missing");
  expect_error(NULL, "r", PS_DT_FLOAT, &shape, 0, 1, "variable r:");
  expect_error(&s, "r", PS_DT_FLOAT, NULL, 0, 1, "variable r:");
  ps_status st = {0};
  PS_ASSERT_STATUS(ps_init_fill(&s, "r", PS_DT_FLOAT, &shape, 0, 1, NULL, &st), st,
                   PS_INVALID_ARGUMENT, "no output buffer");

  /* empty ranges are fine anywhere inside, including the end */
  ck_assert_int_eq(ps_init_fill(&s, "r", PS_DT_FLOAT, &shape, 6, 0, NULL, NULL), 0);
  ck_assert_int_eq(ps_init_fill(&s, "r", PS_DT_FLOAT, &shape, 3, 0, NULL, NULL), 0);
}
END_TEST

START_TEST(test_parameter_errors) {
  ps_shape shape = SHAPE(4);
  ps_init_spec s = spec_of(PS_INIT_RANDOM_UNIFORM);
  s.minval = 2;
  s.maxval = 1;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4,
               "variable emb/w: random_uniform needs minval <= maxval, got "
               "minval=2 maxval=1");
  s.minval = -INFINITY;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4, "finite minval and maxval");
  s.minval = s.maxval = 1; /* a degenerate range is fine */
  float f[4];
  ck_assert_int_eq(ps_init_fill(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4, f, NULL), 0);
  ck_assert(f[0] == 1.0f && f[3] == 1.0f);

  s = spec_of(PS_INIT_RANDOM_NORMAL);
  s.stddev = -1;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4,
               "variable emb/w: random_normal needs stddev >= 0, got -1");
  s = spec_of(PS_INIT_TRUNCATED_NORMAL);
  s.stddev = -0.5;
  expect_error(&s, "emb/w", PS_DT_DOUBLE, &shape, 0, 4,
               "variable emb/w: truncated_normal needs stddev >= 0");
  s.stddev = NAN;
  expect_error(&s, "emb/w", PS_DT_DOUBLE, &shape, 0, 4, "finite mean and stddev");

  s = spec_of(PS_INIT_VARIANCE_SCALING);
  s.scale = 0;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4,
               "variable emb/w: variance_scaling needs scale > 0, got 0");
  s.scale = -2;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4, "needs scale > 0, got -2");
  s.scale = NAN;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4, "needs scale > 0");
  s.scale = 1;
  s.mode = (ps_fan_mode)7;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4, "unknown mode 7");
  s.mode = PS_FAN_IN;
  s.distribution = (ps_distribution)9;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4, "unknown distribution 9");

  s = spec_of(PS_INIT_ZEROS);
  s.type = (ps_init_type)42;
  expect_error(&s, "emb/w", PS_DT_FLOAT, &shape, 0, 4,
               "variable emb/w: unknown initializer type 42");
}
END_TEST

static Suite *init_suite(void) {
  Suite *s = suite_create("init");
  TCase *names = tcase_create("names");
  tcase_add_test(names, test_names);
  tcase_add_test(names, test_spec_defaults);
  tcase_add_test(names, test_name_hash);
  suite_add_tcase(s, names);

  TCase *cst = tcase_create("constant");
  tcase_add_test(cst, test_zeros_ones_constant_every_dtype);
  tcase_add_test(cst, test_half_bf16_one);
  tcase_add_test(cst, test_constant_scalar_and_large);
  tcase_add_test(cst, test_constant_list_padding);
  tcase_add_test(cst, test_constant_too_many);
  tcase_add_test(cst, test_constant_bad_values);
  tcase_add_test(cst, test_unsupported_dtypes);
  suite_add_tcase(s, cst);

  TCase *rnd = tcase_create("random");
  tcase_add_test(rnd, test_layout_uniform_float);
  tcase_add_test(rnd, test_layout_normal_float);
  tcase_add_test(rnd, test_layout_truncated_float);
  tcase_add_test(rnd, test_layout_double);
  tcase_add_test(rnd, test_partition_independence);
  tcase_add_test(rnd, test_determinism);
  tcase_add_test(rnd, test_stats_uniform);
  tcase_add_test(rnd, test_stats_normal);
  tcase_add_test(rnd, test_stats_truncated);
  tcase_add_test(rnd, test_glorot_uniform);
  tcase_add_test(rnd, test_glorot_normal);
  tcase_add_test(rnd, test_variance_scaling_fans);
  tcase_set_timeout(rnd, 120);
  suite_add_tcase(s, rnd);

  TCase *err = tcase_create("errors");
  tcase_add_test(err, test_range_errors);
  tcase_add_test(err, test_parameter_errors);
  suite_add_tcase(s, err);
  return s;
}

int main(void) {
  return ps_test_run(init_suite());
}
