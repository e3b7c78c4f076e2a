/* Philox4x32-10: Random123 known answers, counter arithmetic, and
 * TensorFlow's word-to-float conversions. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/philox.h"
#include "tests/support/assert.h"

static void run_kat(const uint32_t key[2], const uint32_t ctr[4],
                    const uint32_t want[4]) {
  ps_philox p;
  memcpy(p.key, key, sizeof p.key);
  memcpy(p.ctr, ctr, sizeof p.ctr);
  uint32_t got[4];
  ps_philox_next(&p, got);
  for (int i = 0; i < 4; i++)
    ck_assert_msg(got[i] == want[i], "word %d: got %08x want %08x", i, got[i], want[i]);
}

START_TEST(test_kat_zero) {
  const uint32_t key[2] = {0, 0}, ctr[4] = {0, 0, 0, 0};
  const uint32_t want[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
  run_kat(key, ctr, want);
}
END_TEST

START_TEST(test_kat_ones) {
  const uint32_t key[2] = {0xffffffff, 0xffffffff};
  const uint32_t ctr[4] = {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff};
  const uint32_t want[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
  run_kat(key, ctr, want);
}
END_TEST

START_TEST(test_kat_pi) {
  const uint32_t key[2] = {0xa4093822, 0x299f31d0};
  const uint32_t ctr[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
  const uint32_t want[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
  run_kat(key, ctr, want);
}
END_TEST

START_TEST(test_init_layout) {
  ps_philox p;
  ps_philox_init(&p, 0x1122334455667788ull, 0x99aabbccddeeff00ull);
  ck_assert_uint_eq(p.key[0], 0x55667788u);
  ck_assert_uint_eq(p.key[1], 0x11223344u);
  ck_assert_uint_eq(p.ctr[0], 0);
  ck_assert_uint_eq(p.ctr[1], 0);
  ck_assert_uint_eq(p.ctr[2], 0xddeeff00u);
  ck_assert_uint_eq(p.ctr[3], 0x99aabbccu);

  /* init(0,0) is the all-zero KAT */
  uint32_t w[4];
  ps_philox_init(&p, 0, 0);
  ps_philox_next(&p, w);
  ck_assert_uint_eq(w[0], 0x6627e8d5u);
  ck_assert_uint_eq(p.ctr[0], 1);
}
END_TEST

START_TEST(test_next_increments_counter) {
  ps_philox p;
  ps_philox_init(&p, 5, 7);
  uint32_t a[4], b[4];
  ps_philox_next(&p, a);
  ps_philox_next(&p, b);
  ck_assert_uint_eq(p.ctr[0], 2);
  ck_assert_uint_eq(p.ctr[2], 7);
  ck_assert(memcmp(a, b, sizeof a) != 0);

  /* 128-bit increment carries through every word */
  p.ctr[0] = p.ctr[1] = p.ctr[2] = 0xffffffff;
  p.ctr[3] = 3;
  ps_philox_next(&p, a);
  ck_assert_uint_eq(p.ctr[0], 0);
  ck_assert_uint_eq(p.ctr[1], 0);
  ck_assert_uint_eq(p.ctr[2], 0);
  ck_assert_uint_eq(p.ctr[3], 4);

  p.ctr[0] = 0xffffffff;
  p.ctr[1] = 7;
  ps_philox_next(&p, a);
  ck_assert_uint_eq(p.ctr[0], 0);
  ck_assert_uint_eq(p.ctr[1], 8);
  ck_assert_uint_eq(p.ctr[2], 0);
}
END_TEST

START_TEST(test_skip_matches_next) {
  static const uint64_t ns[] = {0, 1, 2, 3, 7, 100, 1000, 4097};
  for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
    ps_philox seq, jump;
    ps_philox_init(&seq, 87654321, 0xdeadbeefcafef00dull);
    jump = seq;
    uint32_t w[4], want[4], got[4];
    for (uint64_t i = 0; i < ns[t]; i++)
      ps_philox_next(&seq, w);
    ps_philox_next(&seq, want); /* the (n+1)-th call */
    ps_philox_skip(&jump, ns[t]);
    ps_philox_next(&jump, got);
    ck_assert_msg(memcmp(want, got, sizeof want) == 0, "skip(%llu) differs",
                  (unsigned long long)ns[t]);
    ck_assert(memcmp(seq.ctr, jump.ctr, sizeof seq.ctr) == 0);
  }
}
END_TEST

START_TEST(test_skip_carry) {
  ps_philox p;
  ps_philox_init(&p, 0, 0);

  p.ctr[0] = 0xffffffff;
  ps_philox_skip(&p, 1);
  ck_assert_uint_eq(p.ctr[0], 0);
  ck_assert_uint_eq(p.ctr[1], 1);

  ps_philox_skip(&p, 0x100000000ull); /* adds to word 1 only */
  ck_assert_uint_eq(p.ctr[0], 0);
  ck_assert_uint_eq(p.ctr[1], 2);

  /* carry out of the low 64 bits into word 2 */
  p.ctr[0] = 0xfffffffe;
  p.ctr[1] = 0xffffffff;
  p.ctr[2] = 9;
  p.ctr[3] = 0;
  ps_philox_skip(&p, 5);
  ck_assert_uint_eq(p.ctr[0], 3);
  ck_assert_uint_eq(p.ctr[1], 0);
  ck_assert_uint_eq(p.ctr[2], 10);
  ck_assert_uint_eq(p.ctr[3], 0);

  /* ... and on into word 3 */
  p.ctr[0] = p.ctr[1] = p.ctr[2] = 0xffffffff;
  p.ctr[3] = 0;
  ps_philox_skip(&p, 1);
  ck_assert_uint_eq(p.ctr[0], 0);
  ck_assert_uint_eq(p.ctr[1], 0);
  ck_assert_uint_eq(p.ctr[2], 0);
  ck_assert_uint_eq(p.ctr[3], 1);

  /* the largest skip wraps the low 64 bits and carries once */
  p.ctr[0] = 1;
  p.ctr[1] = 0;
  p.ctr[2] = 0;
  ps_philox_skip(&p, UINT64_MAX);
  ck_assert_uint_eq(p.ctr[0], 0);
  ck_assert_uint_eq(p.ctr[1], 0);
  ck_assert_uint_eq(p.ctr[2], 1);
}
END_TEST

START_TEST(test_skip_additive) {
  ps_philox a, b;
  ps_philox_init(&a, 42, 43);
  a.ctr[0] = 0xfffffff0;
  a.ctr[1] = 0xfffffffe;
  b = a;
  ps_philox_skip(&a, 0x1234567890ull);
  ps_philox_skip(&a, 0xfedcba9876ull);
  ps_philox_skip(&b, 0x1234567890ull + 0xfedcba9876ull);
  ck_assert(memcmp(a.ctr, b.ctr, sizeof a.ctr) == 0);
  ck_assert(memcmp(a.key, b.key, sizeof a.key) == 0);
}
END_TEST

START_TEST(test_uint32_to_float) {
  ck_assert(ps_uint32_to_float(0) == 0.0f);
  ck_assert(ps_uint32_to_float(0x400000) == 0.5f);
  ck_assert(ps_uint32_to_float(0x7fffff) == 1.0f - 0x1p-23f);
  ck_assert(ps_uint32_to_float(0xffffffff) == 1.0f - 0x1p-23f);
  /* only the low 23 bits count */
  ck_assert(ps_uint32_to_float(0xff800000) == 0.0f);
  ck_assert(ps_uint32_to_float(0x00000001) == 0x1p-23f);
}
END_TEST

START_TEST(test_uint64_to_double) {
  ck_assert(ps_uint64_to_double(0, 0) == 0.0);
  ck_assert(ps_uint64_to_double(0x80000, 0) == 0.5);
  ck_assert(ps_uint64_to_double(0xfffff, 0xffffffff) == 1.0 - 0x1p-52);
  ck_assert(ps_uint64_to_double(0xfff00000, 0) == 0.0); /* high 12 bits ignored */
  ck_assert(ps_uint64_to_double(0, 1) == 0x1p-52);
  ck_assert(ps_uint64_to_double(1, 0) == 0x1p-20);
}
END_TEST

START_TEST(test_box_muller_fixed_points) {
  float f0, f1;
  /* u1 = 0 is clamped to 1e-7; angle 0 puts everything in f1 */
  ps_box_muller(0, 0, &f0, &f1);
  float r = sqrtf(-2.0f * logf(1.0e-7f));
  ck_assert(f0 == 0.0f);
  ck_assert(f1 == r);
  ck_assert(fabsf(r - 5.6777f) < 1e-3f);

  /* u1 = 0.5, angle pi: f0 ~ 0, f1 = -sqrt(2 ln 2) */
  ps_box_muller(0x400000, 0x400000, &f0, &f1);
  ck_assert(fabsf(f0) < 1e-6f);
  ck_assert(fabsf(f1 + sqrtf(2.0f * logf(2.0f))) < 1e-6f);

  /* angle pi/2 (u = 0.25): f0 = r, f1 ~ 0 */
  ps_box_muller(0x400000, 0x200000, &f0, &f1);
  ck_assert(fabsf(f0 - sqrtf(2.0f * logf(2.0f))) < 1e-6f);
  ck_assert(fabsf(f1) < 1e-6f);

  double d0, d1;
  ps_box_muller_double(0, 0, 0, 0, &d0, &d1);
  ck_assert(d0 == 0.0);
  ck_assert(fabs(d1 - sqrt(-2.0 * log(1.0e-7))) < 1e-12);
  ps_box_muller_double(0x80000, 0, 0x40000, 0, &d0, &d1); /* u1 .5, angle pi/2 */
  ck_assert(fabs(d0 - sqrt(2.0 * log(2.0))) < 1e-12);
  ck_assert(fabs(d1) < 1e-12);
}
END_TEST

START_TEST(test_uniform_statistics) {
  enum { N = 100000 };
  ps_philox p;
  ps_philox_init(&p, 1, 2);
  double sum = 0, sum2 = 0, dsum = 0;
  for (int i = 0; i < N / 4; i++) {
    uint32_t w[4];
    ps_philox_next(&p, w);
    for (int j = 0; j < 4; j++) {
      float u = ps_uint32_to_float(w[j]);
      ck_assert(u >= 0.0f && u < 1.0f);
      sum += u;
      sum2 += (double)u * u;
    }
    double d = ps_uint64_to_double(w[0], w[1]);
    ck_assert(d >= 0.0 && d < 1.0);
    dsum += d;
  }
  double mean = sum / N, var = sum2 / N - mean * mean;
  ck_assert_msg(fabs(mean - 0.5) < 0.005, "mean %f", mean);
  ck_assert_msg(fabs(var - 1.0 / 12) < 0.002, "var %f", var);
  ck_assert_msg(fabs(dsum / (N / 4) - 0.5) < 0.01, "double mean %f", dsum / (N / 4));
}
END_TEST

START_TEST(test_normal_statistics) {
  enum { N = 100000 };
  ps_philox p;
  ps_philox_init(&p, 3, 4);
  double sum = 0, sum2 = 0, dsum = 0, dsum2 = 0;
  int beyond2 = 0;
  for (int i = 0; i < N / 2; i++) {
    uint32_t w[4];
    ps_philox_next(&p, w);
    float f[2];
    ps_box_muller(w[0], w[1], &f[0], &f[1]);
    double d[2];
    ps_box_muller_double(w[0], w[1], w[2], w[3], &d[0], &d[1]);
    for (int j = 0; j < 2; j++) {
      ck_assert(isfinite(f[j]) && isfinite(d[j]));
      sum += f[j];
      sum2 += (double)f[j] * f[j];
      dsum += d[j];
      dsum2 += d[j] * d[j];
      if (fabsf(f[j]) >= 2.0f) beyond2++;
    }
  }
  double mean = sum / N, sd = sqrt(sum2 / N - mean * mean);
  ck_assert_msg(fabs(mean) < 0.015, "mean %f", mean);
  ck_assert_msg(fabs(sd - 1.0) < 0.015, "stddev %f", sd);
  double dmean = dsum / N, dsd = sqrt(dsum2 / N - dmean * dmean);
  ck_assert_msg(fabs(dmean) < 0.015, "double mean %f", dmean);
  ck_assert_msg(fabs(dsd - 1.0) < 0.015, "double stddev %f", dsd);
  /* P(|z| >= 2) = 4.55% */
  double tail = (double)beyond2 / N;
  ck_assert_msg(fabs(tail - 0.0455) < 0.004, "tail %f", tail);
}
END_TEST

static Suite *philox_suite(void) {
  Suite *s = suite_create("philox");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_kat_zero);
  tcase_add_test(tc, test_kat_ones);
  tcase_add_test(tc, test_kat_pi);
  tcase_add_test(tc, test_init_layout);
  tcase_add_test(tc, test_next_increments_counter);
  tcase_add_test(tc, test_skip_matches_next);
  tcase_add_test(tc, test_skip_carry);
  tcase_add_test(tc, test_skip_additive);
  tcase_add_test(tc, test_uint32_to_float);
  tcase_add_test(tc, test_uint64_to_double);
  tcase_add_test(tc, test_box_muller_fixed_points);
  tcase_add_test(tc, test_uniform_statistics);
  tcase_add_test(tc, test_normal_statistics);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(philox_suite());
}
