/* The sparse workload's ids, shared by bench_ps (C) and the ps-lite side
 * (pslite_sparse.cc), so both draw exactly the same batches. */
#ifndef PS_BENCH_ZIPF_H
#define PS_BENCH_ZIPF_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Zipf(@s) over ranks 1..@n: ids for @nb batches of @b (malloc'd; NULL
 * when out of memory), each rank mapped to a row by a fixed permutation,
 * so that hot rows are spread over the table.  The same for the same
 * arguments, everywhere (a fixed xorshift64 seed). */
static inline int64_t *zipf_ids(int64_t n, double s, size_t nb, size_t b) {
  double *cdf = (double *)malloc((size_t)n * sizeof *cdf);
  int64_t *ids = (int64_t *)malloc(nb * b * sizeof *ids);
  if (cdf == NULL || ids == NULL) {
    free(cdf);
    free(ids);
    return NULL;
  }
  double sum = 0;
  for (int64_t k = 0; k < n; k++)
    cdf[k] = sum += pow((double)(k + 1), -s);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < nb * b; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
    double u = (double)(x >> 11) / 9007199254740992.0 * sum;
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (cdf[mid] < u)
        lo = mid + 1;
      else
        hi = mid;
    }
    ids[i] = (int64_t)(((uint64_t)lo * 2654435761ull) % (uint64_t)n);
  }
  free(cdf);
  return ids;
}

/* The gradient value of element @j of step @i's batch, in both benches. */
static inline float grad_value(int64_t i, int64_t j) {
  return (float)((j + i) % 7) * 0.125f;
}

/* Sparse Adagrad on one row, as the ps's float kernel (common/kernels.c,
 * TensorFlow's SparseApplyAdagrad) computes it, term for term. */
static inline void adagrad_row(float *var, float *acc, const float *g, int64_t n,
                               float lr) {
  for (int64_t j = 0; j < n; j++) {
    acc[j] += g[j] * g[j];
    var[j] -= lr * g[j] * (1.0f / sqrtf(acc[j]));
  }
}

#define ADAGRAD_LR 0.01f
#define ADAGRAD_INIT 0.1f /* TensorFlow's initial_accumulator_value */

#endif
