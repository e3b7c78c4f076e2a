/* Gather ids deduplicated with an open-addressing hash table; see dedup.h. */
#include "dedup.h"

#include "common/tensor.h"

#include <stdlib.h>
#include <string.h>

/* Fewer ids than this are sent as they are: the table costs more than it
 * saves.  Dedup pays when at least a tenth of the rows repeat. */
#define DEDUP_MIN_IDS 64

static uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int64_t id_at(const ps_tensor *ix, int64_t i) {
  return ix->dtype == PS_DT_INT32 ? ((const int32_t *)ps_tensor_data(ix))[i]
                                  : ((const int64_t *)ps_tensor_data(ix))[i];
}

int ps_gather_dedup_init(ps_gather_dedup *d, const ps_tensor *ix) {
  memset(d, 0, sizeof *d);
  int64_t n = ix->shape.dim[0];
  if (n < DEDUP_MIN_IDS || n > INT32_MAX / 2) return 0;
  size_t cap = 1;
  while (cap < (size_t)n * 2)
    cap <<= 1;
  /* one scratch block: the table's keys and slots, the distinct ids */
  int64_t *keys =
      malloc(cap * sizeof *keys + (size_t)n * sizeof(int64_t) + cap * sizeof(int32_t));
  int64_t *uniq = keys ? keys + cap : NULL;
  int32_t *slot = keys ? (int32_t *)(uniq + n) : NULL; /* -1: empty, else a row of uix */
  int32_t *from = malloc((size_t)n * sizeof *from);
  int rc = -1;
  if (!keys || !from) goto out;
  memset(slot, 0xff, cap * sizeof *slot);
  int64_t nu = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = id_at(ix, i);
    size_t h = (size_t)mix((uint64_t)id) & (cap - 1);
    while (slot[h] >= 0 && keys[h] != id)
      h = (h + 1) & (cap - 1);
    if (slot[h] < 0) {
      keys[h] = id;
      slot[h] = (int32_t)nu;
      uniq[nu++] = id;
    }
    from[i] = slot[h];
  }
  rc = 0;
  if (nu * 10 > n * 9) goto out; /* fewer than a tenth repeat */
  d->uix = ps_tensor_new(ix->dtype, 1, &nu);
  if (d->uix == NULL) {
    rc = -1;
    goto out;
  }
  if (ix->dtype == PS_DT_INT32) {
    int32_t *u = ps_tensor_data(d->uix);
    for (int64_t i = 0; i < nu; i++)
      u[i] = (int32_t)uniq[i];
  } else {
    memcpy(ps_tensor_data(d->uix), uniq, (size_t)nu * sizeof *uniq);
  }
  d->from = from;
  from = NULL;
  d->n = n;
  d->nu = nu;
  rc = 1;
out:
  free(keys);
  free(from);
  return rc;
}

void ps_gather_dedup_expand(const ps_gather_dedup *d, const void *rows, size_t row_bytes,
                            void *out) {
  const char *src = rows;
  char *dst = out;
  for (int64_t i = 0; i < d->n; i++)
    memcpy(dst + (size_t)i * row_bytes, src + (size_t)d->from[i] * row_bytes, row_bytes);
}

void ps_gather_dedup_fini(ps_gather_dedup *d) {
  ps_tensor_destroy(d->uix);
  free(d->from);
  memset(d, 0, sizeof *d);
}

/* @dst := a copy of @src (an empty one stays empty).  -1: out of memory. */
static int dedup_copy(ps_gather_dedup *dst, const ps_gather_dedup *src) {
  memset(dst, 0, sizeof *dst);
  if (src->uix == NULL) return 0;
  int64_t nu = src->nu;
  dst->uix = ps_tensor_new(src->uix->dtype, 1, &nu);
  dst->from = malloc((size_t)src->n * sizeof *dst->from);
  if (dst->uix == NULL || dst->from == NULL) {
    ps_gather_dedup_fini(dst);
    return -1;
  }
  memcpy(ps_tensor_data(dst->uix), ps_tensor_data(src->uix), ps_tensor_nbytes(src->uix));
  memcpy(dst->from, src->from, (size_t)src->n * sizeof *dst->from);
  dst->n = src->n;
  dst->nu = nu;
  return 1;
}

void ps_dedup_memo_init(ps_dedup_memo *m) {
  memset(m, 0, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
}

void ps_dedup_memo_fini(ps_dedup_memo *m) {
  for (int i = 0; i < PS_DEDUP_MEMO_SLOTS; i++) {
    free(m->slot[i].ids);
    ps_gather_dedup_fini(&m->slot[i].d);
  }
  pthread_mutex_destroy(&m->mu);
}

int ps_gather_dedup_init_memo(ps_dedup_memo *m, ps_gather_dedup *d, const ps_tensor *ix) {
  int64_t n = ix->shape.dim[0];
  if (m == NULL || n < DEDUP_MIN_IDS || n > PS_DEDUP_MEMO_MAX_IDS)
    return ps_gather_dedup_init(d, ix);
  size_t bytes = ps_tensor_nbytes(ix);
  int rc = -2; /* not found */
  pthread_mutex_lock(&m->mu);
  for (int i = 0; i < PS_DEDUP_MEMO_SLOTS && rc == -2; i++)
    if (m->slot[i].valid && m->slot[i].dtype == ix->dtype && m->slot[i].n == n &&
        memcmp(m->slot[i].ids, ps_tensor_data(ix), bytes) == 0)
      rc = dedup_copy(d, &m->slot[i].d);
  pthread_mutex_unlock(&m->mu);
  if (rc != -2) return rc;
  if ((rc = ps_gather_dedup_init(d, ix)) < 0) return rc;
  /* remembered in the oldest slot; out of memory, the memo stays as it was */
  ps_gather_dedup keep;
  if (dedup_copy(&keep, d) < 0) return rc;
  pthread_mutex_lock(&m->mu);
  unsigned k = m->next++ % PS_DEDUP_MEMO_SLOTS;
  if (m->slot[k].cap < bytes) {
    void *ids = realloc(m->slot[k].ids, bytes);
    if (ids != NULL) {
      m->slot[k].ids = ids;
      m->slot[k].cap = bytes;
    }
  }
  ps_gather_dedup_fini(&m->slot[k].d);
  m->slot[k].valid = m->slot[k].cap >= bytes;
  if (m->slot[k].valid) {
    memcpy(m->slot[k].ids, ps_tensor_data(ix), bytes);
    m->slot[k].dtype = ix->dtype;
    m->slot[k].n = n;
    m->slot[k].d = keep;
  } else {
    ps_gather_dedup_fini(&keep);
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}

#define SUM_ROWS(T)                                                                      \
  do {                                                                                   \
    const T *src = ps_tensor_data(val);                                                  \
    T *dst = ps_tensor_data(out);                                                        \
    int64_t seen = 0;                                                                    \
    for (int64_t i = 0; i < d->n; i++) {                                                 \
      T *o = dst + (int64_t)d->from[i] * row;                                            \
      const T *g = src + i * row;                                                        \
      if (d->from[i] == seen) { /* first occurrence: the row as it is */                 \
        memcpy(o, g, (size_t)row * sizeof(T));                                           \
        seen++;                                                                          \
      } else {                                                                           \
        for (int64_t k = 0; k < row; k++)                                                \
          o[k] += g[k];                                                                  \
      }                                                                                  \
    }                                                                                    \
  } while (0)

/* float, the common case, built for wider vectors too and picked at load
 * time (an ifunc): each element is one add either way, so the bits are
 * the same on every machine. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
sum_rows_float(const ps_gather_dedup *d, const ps_tensor *val, ps_tensor *out,
               int64_t row) {
  SUM_ROWS(float);
}

/* o[k] += g[k] widened, @n elements: a bfloat16 is the top half of its
 * float, so the loop vectorizes (picked at load time, as sum_rows_float). */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
add_bf16_row(float *o, const uint16_t *g, int64_t n) {
  for (int64_t k = 0; k < n; k++) {
    uint32_t bits = (uint32_t)g[k] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    o[k] += f;
  }
}

/* bfloat16 rows (gradients sent narrow): each id's rows summed in float32
 * in the order they come, each sum rounded to bfloat16 once. */
static int sum_rows_bf16(const ps_gather_dedup *d, const ps_tensor *val, ps_tensor *out,
                         int64_t row) {
  size_t n = (size_t)d->nu * (size_t)row;
  float *acc = malloc((n + 1) * sizeof *acc);
  if (acc == NULL) return -1;
  const uint16_t *src = ps_tensor_data(val);
  int64_t seen = 0;
  for (int64_t i = 0; i < d->n; i++) {
    float *o = acc + (int64_t)d->from[i] * row;
    const uint16_t *g = src + i * row;
    if (d->from[i] == seen) {
      ps_bf16_widen(o, g, (size_t)row);
      seen++;
    } else {
      add_bf16_row(o, g, row);
    }
  }
  ps_bf16_narrow(ps_tensor_data(out), acc, n);
  free(acc);
  return 0;
}

ps_tensor *ps_dedup_sum_rows(const ps_gather_dedup *d, const ps_tensor *val) {
  if (d->uix == NULL || val->shape.rank < 1 || val->shape.dim[0] != d->n) return NULL;
  if (val->dtype != PS_DT_FLOAT && val->dtype != PS_DT_DOUBLE &&
      val->dtype != PS_DT_INT32 && val->dtype != PS_DT_INT64 &&
      val->dtype != PS_DT_BFLOAT16)
    return NULL;
  int64_t row = 1;
  for (int r = 1; r < val->shape.rank; r++)
    row *= val->shape.dim[r];
  ps_shape s = val->shape;
  s.dim[0] = d->nu;
  ps_tensor *out = ps_tensor_create(val->dtype, &s, false);
  if (out == NULL) return NULL;
  switch (val->dtype) {
  case PS_DT_FLOAT:
    sum_rows_float(d, val, out, row);
    break;
  case PS_DT_BFLOAT16:
    if (sum_rows_bf16(d, val, out, row) != 0) {
      ps_tensor_destroy(out);
      return NULL;
    }
    break;
  case PS_DT_DOUBLE:
    SUM_ROWS(double);
    break;
  case PS_DT_INT32:
    SUM_ROWS(int32_t);
    break;
  default:
    SUM_ROWS(int64_t);
    break;
  }
  return out;
}
