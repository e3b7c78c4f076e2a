/* Conditional accumulators: TensorFlow's ConditionalAccumulator and
 * SparseConditionalAccumulator (reduction MEAN), kept beside each variable
 * on its ps.
 *
 * A dense step is a running sum in the variable's dtype, divided by the
 * number of updates when the step is taken, as TensorFlow divides its
 * accum_grad_ by counter_.  A sparse step keeps one row per distinct index
 * (an open-addressing table maps index -> row) with the number of updates
 * that contained the index; taking it divides each row by its count and
 * sorts the rows by index.  TensorFlow merges sorted index lists and counts
 * a duplicate index of one gradient twice; here duplicates inside one
 * update are summed and counted once, so the result does not depend on
 * the order a worker lists its rows in.
 *
 * All buffers stay allocated from step to step (a step usually has the
 * same size as the last), and everything a step needs is allocated before
 * anything changes, so a failed allocation leaves the accumulator as it
 * was. */
#include "sync.h"

#include <stdlib.h>
#include <string.h>

#include "common/kernels.h"

struct ps_accum {
  bool started; /* a step number has been set */
  int64_t step;
  int64_t epoch; /* the variable's value epoch when the step was set */
  int count;     /* updates in the current step */
  /* the current step, as its first update described it */
  ps_sync_kind kind;
  int opt;
  ps_dtype dtype;
  ps_shape shape;
  bool sparse;
  char **slots;
  size_t nslots;
  double *hparams;
  size_t nhparams;
  bool use_nesterov;
  int replicas;
  /* dense: the sum (ASSIGN: the first value) */
  uint8_t *sum;
  size_t sum_cap;
  /* sparse: distinct indices, their counts, rows */
  int64_t *idx;
  int32_t *cnt;
  int64_t *last; /* the update that last counted the index */
  uint8_t *rows;
  size_t n, cap, row_bytes;
  int64_t max_index;
  int64_t *ht; /* row + 1, 0 = empty; ht_cap is a power of two */
  size_t ht_cap;
  int64_t contrib;
  /* the sorted aggregate handed out by take */
  int64_t *out_idx;
  uint8_t *out_rows;
  size_t out_cap;
  ps_sync_waiter *waiters, **tail;
};

ps_accum *ps_accum_create(void) {
  ps_accum *a = calloc(1, sizeof *a);
  if (a) a->tail = &a->waiters;
  return a;
}

static void free_desc(ps_accum *a) {
  for (size_t i = 0; i < a->nslots; i++)
    free(a->slots[i]);
  free(a->slots);
  free(a->hparams);
  a->slots = NULL;
  a->hparams = NULL;
  a->nslots = a->nhparams = 0;
}

void ps_accum_destroy(ps_accum *a) {
  if (a == NULL) return;
  free_desc(a);
  free(a->sum);
  free(a->idx);
  free(a->cnt);
  free(a->last);
  free(a->rows);
  free(a->ht);
  free(a->out_idx);
  free(a->out_rows);
  free(a);
}

int64_t ps_accum_step(const ps_accum *a) {
  return a ? a->step : 0;
}

/* The step @local_step would join: a fresh accumulator starts at it, and
 * an empty one moves up to it, or anywhere once the variable's value was
 * replaced (TensorFlow's chief sets the accumulators' step at start-up). */
static bool adopts(const ps_accum *a, int64_t local_step, int64_t epoch) {
  if (a == NULL || !a->started) return true;
  return a->count == 0 && (local_step > a->step || epoch != a->epoch);
}

static int64_t index_at(const ps_sync_update *u, int64_t k) {
  if (u->isize == 4) return ((const int32_t *)u->indices)[k];
  return ((const int64_t *)u->indices)[k];
}

/* TensorFlow's name of the op an update stands for. */
static const char *op_name(ps_sync_kind k, int opt, bool sparse) {
  const ps_opt_info *oi = ps_opt_info_get(opt);
  switch (k) {
  case PS_SYNC_APPLY:
    return oi ? (sparse ? oi->sparse_op : oi->op) : "Apply";
  case PS_SYNC_ADD:
    return "AssignAdd";
  case PS_SYNC_SUB:
    return "AssignSub";
  case PS_SYNC_ASSIGN:
    return "Assign";
  }
  return "?";
}

static void fmt_shape(const ps_shape *s, char *buf, size_t n) {
  ps_shape_format(s, buf, n);
}

int ps_accum_check(const ps_accum *a, const ps_sync_update *u, int64_t epoch,
                   int64_t rows, const char *var, bool *stale, bool *completes,
                   ps_status *st) {
  *stale = *completes = false;
  bool fresh = adopts(a, u->local_step, epoch);
  if (!fresh && u->local_step < a->step) {
    *stale = true;
    return 0;
  }
  int count = fresh ? 0 : a->count;
  if (count > 0) {
    char x[128], y[128];
    if (u->kind != a->kind || u->opt != a->opt || u->sparse != a->sparse)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "synchronous update of %s: %s does not match %s of step %lld "
                           "being aggregated",
                           var, op_name(u->kind, u->opt, u->sparse),
                           op_name(a->kind, a->opt, a->sparse), (long long)a->step);
    if (u->replicas != a->replicas)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "synchronous update of %s: replicas_to_aggregate is %d but "
                           "step %lld is aggregating %d",
                           var, u->replicas, (long long)a->step, a->replicas);
    if (u->dtype != a->dtype)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "synchronous update of %s: dtype %s does not match %s of "
                           "step %lld",
                           var, ps_dtype_name(u->dtype), ps_dtype_name(a->dtype),
                           (long long)a->step);
    bool same = u->shape.rank == a->shape.rank;
    for (int d = u->sparse ? 1 : 0; same && d < u->shape.rank; d++)
      same = u->shape.dim[d] == a->shape.dim[d];
    if (!same) {
      fmt_shape(&u->shape, x, sizeof x);
      fmt_shape(&a->shape, y, sizeof y);
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "synchronous update of %s: Shape mismatch: value shape %s, "
                           "step %lld aggregates shape %s",
                           var, x, (long long)a->step, y);
    }
    bool slots_same = u->nslots == a->nslots && u->nhparams == a->nhparams &&
                      u->use_nesterov == a->use_nesterov;
    for (size_t k = 0; slots_same && k < u->nslots; k++)
      slots_same = strcmp(u->slots[k], a->slots[k]) == 0;
    if (!slots_same)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "synchronous update of %s: slots, hparams or use_nesterov "
                           "differ from those of step %lld being aggregated",
                           var, (long long)a->step);
  }
  *completes = count + 1 >= u->replicas;
  if (*completes && count > 0 && a->sparse && a->max_index >= rows)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "synchronous update of %s: the gradients of step %lld hold row "
                         "%lld but %s now has %lld rows",
                         var, (long long)a->step, (long long)a->max_index, var,
                         (long long)rows);
  return 0;
}

static int oom(ps_status *st, const char *what) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                       "out of memory aggregating a synchronous %s", what);
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 16, bytes;
  while (c < need)
    if (ps_size_mul(c, 2, &c) != 0) return false;
  if (ps_size_mul(c, elem, &bytes) != 0) return false;
  void *q = realloc(*p, bytes);
  if (q == NULL) return false;
  *p = q;
  *cap = c;
  return true;
}

static uint64_t hash64(int64_t k) {
  uint64_t x = (uint64_t)k * 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

static size_t ht_find(const ps_accum *a, int64_t key, bool *found) {
  size_t m = a->ht_cap - 1, h = (size_t)hash64(key) & m;
  for (;;) {
    int64_t e = a->ht[h];
    if (e == 0) {
      *found = false;
      return h;
    }
    if (a->idx[e - 1] == key) {
      *found = true;
      return h;
    }
    h = (h + 1) & m;
  }
}

/* Room for @extra more distinct rows; rebuilds the table when it grows. */
static int sparse_reserve(ps_accum *a, size_t extra, size_t row_bytes) {
  size_t need = a->n + extra;
  size_t cap = a->cap;
  if (need > cap) {
    size_t c = cap ? cap : 16, rows_bytes;
    while (c < need)
      if (ps_size_mul(c, 2, &c) != 0) return -1;
    if (ps_size_mul(c, row_bytes ? row_bytes : 1, &rows_bytes) != 0) return -1;
    int64_t *idx = realloc(a->idx, c * sizeof *idx);
    if (idx == NULL) return -1;
    a->idx = idx;
    int32_t *cnt = realloc(a->cnt, c * sizeof *cnt);
    if (cnt == NULL) return -1;
    a->cnt = cnt;
    int64_t *last = realloc(a->last, c * sizeof *last);
    if (last == NULL) return -1;
    a->last = last;
    uint8_t *rows = realloc(a->rows, rows_bytes);
    if (rows == NULL) return -1;
    a->rows = rows;
    a->cap = c;
  }
  if (a->ht_cap < 2 * need || a->ht == NULL) {
    size_t hc = a->ht_cap ? a->ht_cap : 32;
    while (hc < 2 * need)
      hc *= 2;
    int64_t *ht = calloc(hc, sizeof *ht);
    if (ht == NULL) return -1;
    free(a->ht);
    a->ht = ht;
    a->ht_cap = hc;
    for (size_t i = 0; i < a->n; i++) {
      bool f;
      a->ht[ht_find(a, a->idx[i], &f)] = (int64_t)i + 1;
    }
  }
  return 0;
}

static int set_desc(ps_accum *a, const ps_sync_update *u, ps_status *st) {
  char **slots = calloc(u->nslots + 1, sizeof *slots);
  double *hp = malloc((u->nhparams + 1) * sizeof *hp);
  bool ok = slots && hp;
  for (size_t k = 0; ok && k < u->nslots; k++)
    ok = (slots[k] = strdup(u->slots[k])) != NULL;
  if (!ok) {
    for (size_t k = 0; slots && k < u->nslots; k++)
      free(slots[k]);
    free(slots);
    free(hp);
    return oom(st, "update");
  }
  if (u->nhparams) memcpy(hp, u->hparams, u->nhparams * sizeof *hp);
  free_desc(a);
  a->slots = slots;
  a->nslots = u->nslots;
  a->hparams = hp;
  a->nhparams = u->nhparams;
  a->kind = u->kind;
  a->opt = u->opt;
  a->dtype = u->dtype;
  a->shape = u->shape;
  a->sparse = u->sparse;
  a->use_nesterov = u->use_nesterov;
  a->replicas = u->replicas;
  return 0;
}

/* Sizes of updates the service validated (ps_size_bytes passed for the
 * whole value), so a row of it fits too. */
static size_t row_bytes_of(const ps_sync_update *u) {
  ps_shape row = u->shape;
  size_t b = 0;
  if (row.rank > 0) row.dim[0] = 1;
  ps_size_bytes(u->dtype, &row, &b);
  return b;
}

static size_t value_bytes_of(const ps_sync_update *u) {
  size_t b = 0;
  ps_size_bytes(u->dtype, &u->shape, &b);
  return b;
}

int ps_accum_add(ps_accum *a, const ps_sync_update *u, int64_t epoch, ps_sync_waiter *w,
                 ps_status *st) {
  bool fresh = adopts(a, u->local_step, epoch);
  int count = fresh ? 0 : a->count;
  size_t es = ps_dtype_size(u->dtype);
  /* allocate first: a failure changes nothing */
  if (!u->sparse) {
    size_t bytes = value_bytes_of(u);
    if (!grow((void **)&a->sum, &a->sum_cap, bytes ? bytes : 1, 1))
      return oom(st, "value");
  } else {
    size_t rb = row_bytes_of(u);
    if (count == 0) {
      /* a new step may have another row size: start the table over */
      a->n = 0;
      if (a->row_bytes != rb) {
        free(a->rows);
        a->rows = NULL;
        free(a->idx);
        a->idx = NULL;
        free(a->cnt);
        a->cnt = NULL;
        free(a->last);
        a->last = NULL;
        a->cap = 0;
        a->row_bytes = rb;
      }
      if (a->ht) memset(a->ht, 0, a->ht_cap * sizeof *a->ht);
    }
    if (sparse_reserve(a, (size_t)u->nindices, rb) != 0) return oom(st, "gradient");
  }
  if (count == 0 && set_desc(a, u, st) != 0) return st->code;
  if (fresh) {
    a->started = true;
    a->step = u->local_step;
    a->epoch = epoch;
  }
  if (!u->sparse) {
    size_t bytes = value_bytes_of(u);
    if (count == 0)
      memcpy(a->sum, u->value, bytes);
    else if (u->kind != PS_SYNC_ASSIGN)
      ps_elem_apply(u->dtype, '+', a->sum, u->value, ps_shape_num_elements(&u->shape));
  } else {
    size_t rb = a->row_bytes;
    int64_t re = es ? (int64_t)(rb / es) : 0;
    if (count == 0) a->max_index = -1;
    a->contrib++;
    for (int64_t k = 0; k < u->nindices; k++) {
      int64_t key = index_at(u, k);
      const uint8_t *src = (const uint8_t *)u->value + (size_t)k * rb;
      bool found;
      size_t h = ht_find(a, key, &found);
      if (!found) {
        size_t r = a->n++;
        a->ht[h] = (int64_t)r + 1;
        a->idx[r] = key;
        a->cnt[r] = 1;
        a->last[r] = a->contrib;
        memcpy(a->rows + r * rb, src, rb);
        if (key > a->max_index) a->max_index = key;
        continue;
      }
      size_t r = (size_t)(a->ht[h] - 1);
      ps_elem_apply(u->dtype, '+', a->rows + r * rb, src, re);
      if (a->last[r] != a->contrib) {
        a->last[r] = a->contrib;
        a->cnt[r]++;
      }
    }
  }
  a->count = count + 1;
  w->next = NULL;
  ps_status_clear(&w->st);
  *a->tail = w;
  a->tail = &w->next;
  return 0;
}

bool ps_accum_full(const ps_accum *a) {
  return a->count > 0 && a->count >= a->replicas;
}

/* p[0..n) /= d in @dtype's arithmetic (integers truncate, as C and
 * TensorFlow's integer division of a tensor by a scalar do).  Integers are
 * divided by d itself, not by d converted to their type: 256 replicas of
 * an int8 variable would divide by zero. */
static void divide(ps_dtype dtype, void *p, int64_t n, int64_t d) {
  if (d == 1) return;
#define PS_CASE_FLOAT(T, U)                                                              \
  for (int64_t i = 0; i < n; i++)                                                        \
  ((T *)p)[i] = (T)(((T *)p)[i] / (T)d)
#define PS_CASE_INT(T, U)                                                                \
  for (int64_t i = 0; i < n; i++)                                                        \
  ((T *)p)[i] = (T)(((T *)p)[i] / d)
  PS_DTYPE_SWITCH_NATIVE(dtype, for (int64_t i = 0; i < n; i++) ps_elem_set(
                                    dtype, p, i, ps_elem_get(dtype, p, i) / (double)d))
#undef PS_CASE_FLOAT
#undef PS_CASE_INT
}

typedef struct keyed {
  int64_t key;
  size_t row;
} keyed;

static int cmp_keyed(const void *x, const void *y) {
  int64_t a = ((const keyed *)x)->key, b = ((const keyed *)y)->key;
  return (a > b) - (a < b);
}

int ps_accum_take(ps_accum *a, ps_sync_take *out, ps_status *st) {
  memset(out, 0, sizeof *out);
  size_t es = ps_dtype_size(a->dtype);
  if (a->sparse) {
    size_t rb = a->row_bytes, n = a->n;
    keyed *perm = malloc((n + 1) * sizeof *perm);
    size_t cap = a->out_cap;
    if (perm == NULL || !grow((void **)&a->out_idx, &cap, n + 1, sizeof *a->out_idx)) {
      free(perm);
      return oom(st, "gradient");
    }
    size_t ob;
    uint8_t *rows =
        ps_size_mul(cap, rb ? rb : 1, &ob) == 0 ? realloc(a->out_rows, ob) : NULL;
    if (rows == NULL) {
      free(perm);
      return oom(st, "gradient");
    }
    a->out_rows = rows;
    a->out_cap = cap;
    for (size_t i = 0; i < n; i++)
      perm[i] = (keyed){a->idx[i], i};
    qsort(perm, n, sizeof *perm, cmp_keyed);
    int64_t re = es ? (int64_t)(rb / es) : 0;
    for (size_t i = 0; i < n; i++) {
      size_t r = perm[i].row;
      a->out_idx[i] = a->idx[r];
      memcpy(a->out_rows + i * rb, a->rows + r * rb, rb);
      divide(a->dtype, a->out_rows + i * rb, re, a->cnt[r]);
    }
    free(perm);
    out->value = a->out_rows;
    out->indices = a->out_idx;
    out->nindices = (int64_t)n;
  } else {
    if (a->kind != PS_SYNC_ASSIGN)
      divide(a->dtype, a->sum, ps_shape_num_elements(&a->shape), a->count);
    out->value = a->sum;
  }
  out->kind = a->kind;
  out->opt = a->opt;
  out->dtype = a->dtype;
  out->sparse = a->sparse;
  out->slots = a->slots;
  out->nslots = a->nslots;
  out->hparams = a->hparams;
  out->nhparams = a->nhparams;
  out->use_nesterov = a->use_nesterov;
  out->step = a->step;
  return 0;
}

static ps_sync_waiter *detach(ps_accum *a) {
  ps_sync_waiter *w = a->waiters;
  a->waiters = NULL;
  a->tail = &a->waiters;
  a->count = 0;
  a->n = 0;
  return w;
}

ps_sync_waiter *ps_accum_finish(ps_accum *a, int64_t version, int64_t epoch) {
  a->step++;
  a->epoch = epoch;
  ps_sync_waiter *list = detach(a);
  for (ps_sync_waiter *w = list; w; w = w->next) {
    w->step = a->step;
    w->version = version;
  }
  return list;
}

ps_sync_waiter *ps_accum_fail(ps_accum *a, int code, const char *msg) {
  ps_sync_waiter *list = detach(a);
  for (ps_sync_waiter *w = list; w; w = w->next) {
    w->step = a->step;
    ps_status_set(&w->st, code, "%s", msg);
  }
  return list;
}
