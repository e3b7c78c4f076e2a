/* Philox4x32-10 counter-based random numbers, bit-for-bit as TensorFlow's
 * PhiloxRandom (tensorflow/core/lib/random/philox_random.h) and Random123,
 * plus TensorFlow's conversions from raw words to floats and normals.
 *
 * A generator is a plain value: copy it to fork a stream, skip it to jump
 * to any counter.  Nothing here allocates or keeps global state, so every
 * function may be called from any thread on its own ps_philox. */
#ifndef PS_PHILOX_H
#define PS_PHILOX_H

#include <stdint.h>

typedef struct ps_philox {
  uint32_t key[2];
  uint32_t ctr[4]; /* 128-bit counter, least significant word first */
} ps_philox;

/* TensorFlow's PhiloxRandom(seed, seed2): key = {lo32(seed), hi32(seed)},
 * ctr = {0, 0, lo32(seed2), hi32(seed2)}. */
void ps_philox_init(ps_philox *p, uint64_t seed, uint64_t seed2);
/* Four words from the current counter (10 rounds), then counter += 1. */
void ps_philox_next(ps_philox *p, uint32_t out[4]);
/* Advances the 128-bit counter by @n, as @n calls to ps_philox_next would. */
void ps_philox_skip(ps_philox *p, uint64_t n);

/* [0,1) with 23 random mantissa bits: 1.x from the low 23 bits, minus 1. */
float ps_uint32_to_float(uint32_t x);
/* [0,1) with 52 random mantissa bits: low 20 bits of @x0 above @x1. */
double ps_uint64_to_double(uint32_t x0, uint32_t x1);
/* TensorFlow's BoxMullerFloat: two standard normals from two words, in
 * float arithmetic; u1 is clamped to >= 1e-7f so log() stays finite.
 * *f0 = sin(v1)*u2, *f1 = cos(v1)*u2. */
void ps_box_muller(uint32_t x0, uint32_t x1, float *f0, float *f1);
/* TensorFlow's BoxMullerDouble: (x0,x1) give u1, (x2,x3) give the angle. */
void ps_box_muller_double(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3, double *d0,
                          double *d1);

#endif
