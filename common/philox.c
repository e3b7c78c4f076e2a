/* Philox4x32-10 and TensorFlow's sample conversions.
 *
 * Initial values of variables must come out the same as TensorFlow's random
 * kernels would produce and, more importantly, the same on every ps however
 * a variable is split.  Philox is counter based: any output is a pure
 * function of (key, counter), so a ps can jump straight to the counter of
 * the first element it owns.  The round function, key schedule and the
 * float conversions below follow TensorFlow's philox_random.h and
 * random_distributions.h operation for operation (including which steps run
 * in float and which in double), because a different rounding order would
 * give different last bits. */
#include "philox.h"

#include <math.h>
#include <string.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* golden ratio */
#define PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

/* M_PI is not part of C11; this is its value to double precision. */
static const double ps_pi = 3.14159265358979323846;

void ps_philox_init(ps_philox *p, uint64_t seed, uint64_t seed2) {
  p->key[0] = (uint32_t)seed;
  p->key[1] = (uint32_t)(seed >> 32);
  p->ctr[0] = 0;
  p->ctr[1] = 0;
  p->ctr[2] = (uint32_t)seed2;
  p->ctr[3] = (uint32_t)(seed2 >> 32);
}

static void philox_round(uint32_t x[4], const uint32_t k[2]) {
  uint64_t p0 = (uint64_t)PHILOX_M0 * x[0];
  uint64_t p1 = (uint64_t)PHILOX_M1 * x[2];
  uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
  uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
  uint32_t y0 = hi1 ^ x[1] ^ k[0];
  uint32_t y2 = hi0 ^ x[3] ^ k[1];
  x[0] = y0;
  x[1] = lo1;
  x[2] = y2;
  x[3] = lo0;
}

void ps_philox_next(ps_philox *p, uint32_t out[4]) {
  uint32_t x[4], k[2] = {p->key[0], p->key[1]};
  memcpy(x, p->ctr, sizeof x);
  for (int r = 0; r < 10; r++) {
    philox_round(x, k);
    /* the key is bumped between rounds only: 9 bumps for 10 rounds */
    if (r < 9) {
      k[0] += PHILOX_W0;
      k[1] += PHILOX_W1;
    }
  }
  memcpy(out, x, sizeof x);
  if (++p->ctr[0] == 0 && ++p->ctr[1] == 0 && ++p->ctr[2] == 0) ++p->ctr[3];
}

void ps_philox_skip(ps_philox *p, uint64_t n) {
  /* A true 128-bit add.  TensorFlow's Skip() drops the carry only when
   * n >= 2^64 - 2^32 and the low word wraps, which no caller reaches. */
  uint64_t lo = ((uint64_t)p->ctr[1] << 32 | p->ctr[0]) + n;
  int carry = lo < n;
  p->ctr[0] = (uint32_t)lo;
  p->ctr[1] = (uint32_t)(lo >> 32);
  if (carry && ++p->ctr[2] == 0) ++p->ctr[3];
}

float ps_uint32_to_float(uint32_t x) {
  uint32_t bits = 0x3F800000u | (x & 0x7FFFFFu);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f - 1.0f;
}

double ps_uint64_to_double(uint32_t x0, uint32_t x1) {
  uint64_t bits = (uint64_t)1023 << 52 | (uint64_t)(x0 & 0xFFFFFu) << 32 | x1;
  double d;
  memcpy(&d, &bits, sizeof d);
  return d - 1.0;
}

void ps_box_muller(uint32_t x0, uint32_t x1, float *f0, float *f1) {
  float u1 = ps_uint32_to_float(x0);
  if (u1 < 1.0e-7f) u1 = 1.0e-7f;
  /* TensorFlow writes 2.0f * M_PI * u: the product is taken in double and
   * rounded to float once, which is what this does. */
  const float v1 = (float)(2.0 * ps_pi * (double)ps_uint32_to_float(x1));
  const float u2 = sqrtf(-2.0f * logf(u1));
  *f0 = sinf(v1) * u2;
  *f1 = cosf(v1) * u2;
}

void ps_box_muller_double(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3, double *d0,
                          double *d1) {
  double u1 = ps_uint64_to_double(x0, x1);
  if (u1 < 1.0e-7) u1 = 1.0e-7;
  const double v1 = 2.0 * ps_pi * ps_uint64_to_double(x2, x3);
  const double u2 = sqrt(-2.0 * log(u1));
  *d0 = sin(v1) * u2;
  *d1 = cos(v1) * u2;
}
