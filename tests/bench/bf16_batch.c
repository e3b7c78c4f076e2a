/* See bf16_batch.h. */
#include "bf16_batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paramserver/tensor.h"

int64_t batch_unique(batch_scratch *w, const int64_t *ids, int64_t n) {
  int64_t nu = 0;
  w->gen++;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = ids[i];
    if (w->stamp[id] != w->gen) {
      w->stamp[id] = w->gen;
      w->slot[id] = (int32_t)nu;
      w->uid[nu++] = id;
    }
    w->from[i] = w->slot[id];
  }
  return nu;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void
bf16_from_float(uint16_t *dst, const float *src, size_t n) {
  const uint32_t *s = (const uint32_t *)(const void *)src;
  for (size_t i = 0; i < n; i++) {
    uint32_t x = s[i], r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    dst[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : r);
  }
}

int bf16_conversion_ok(const char *who) {
  static const uint32_t lo[5] = {0, 0x7fff, 0x8000, 0x8001, 0xffff};
  enum { N = 65536 * 5 };
  float *f = malloc(N * sizeof *f);
  uint16_t *h = malloc(N * sizeof *h);
  int ok = f != NULL && h != NULL;
  if (ok) {
    for (uint32_t i = 0; i < N; i++) {
      uint32_t x = (i / 5) << 16 | lo[i % 5];
      memcpy(&f[i], &x, sizeof x);
    }
    bf16_from_float(h, f, N);
    for (uint32_t i = 0; i < N && ok; i++)
      ok = h[i] == ps_float_to_bf16(f[i]);
    if (!ok) fprintf(stderr, "%s: the bench's bfloat16 conversion differs\n", who);
  } else {
    fprintf(stderr, "%s: out of memory\n", who);
  }
  free(f);
  free(h);
  return ok;
}

int64_t bf16_mirror_step(float *t, batch_scratch *w, const int64_t *ids, int64_t n,
                         int64_t dim, const float *g) {
  int64_t nu = batch_unique(w, ids, n);
  int32_t seen = 0;
  for (int64_t i = 0; i < n; i++) {
    float *o = w->usum + (int64_t)w->from[i] * dim;
    const float *v = g + i * dim;
    int first = w->from[i] == seen;
    seen += first;
    for (int64_t k = 0; k < dim; k++) {
      float x = ps_bf16_to_float(ps_float_to_bf16(v[k]));
      o[k] = first ? x : o[k] + x;
    }
  }
  for (int64_t q = 0; q < nu; q++) {
    float *d = t + w->uid[q] * dim;
    const float *s = w->usum + q * dim;
    for (int64_t k = 0; k < dim; k++)
      d[k] += ps_bf16_to_float(ps_float_to_bf16(s[k]));
  }
  return nu;
}

size_t first_difference(const float *a, const float *b, size_t n) {
  size_t k = 0;
  while (k < n && memcmp(a + k, b + k, sizeof *a) == 0)
    k++;
  return k;
}
