/* The ids of a gather, deduplicated: a ps sends each distinct row once
 * and the client copies it to every position that asked for it
 * (embedding lookups repeat hot ids: 8192 Zipf(1.1) ids hold ~3200
 * distinct ones).  Internal to the client. */
#ifndef PS_CLIENT_DEDUP_H
#define PS_CLIENT_DEDUP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paramserver/tensor.h"

typedef struct ps_gather_dedup {
  ps_tensor *uix; /* the distinct ids in first-occurrence order, @ix's dtype */
  int32_t *from;  /* [n]: the row of uix each requested row is */
  int64_t n, nu;  /* requested and distinct */
} ps_gather_dedup;

/* 1 when @ix (1-D int32/int64) repeats enough ids to pay (fills @d), 0
 * when not (@d stays empty), -1 when out of memory. */
int ps_gather_dedup_init(ps_gather_dedup *d, const ps_tensor *ix);
/* Copies row from[i] of @rows (nu rows of @row_bytes) to row i of @out. */
void ps_gather_dedup_expand(const ps_gather_dedup *d, const void *rows, size_t row_bytes,
                            void *out);
void ps_gather_dedup_fini(ps_gather_dedup *d); /* an empty one is a no-op */

/* The rows of @val ([n, ...], float32/64 or int32/64) summed per distinct
 * id of @d, in the order they come: a new [nu, ...] tensor, or NULL when
 * @val is not such a tensor (the caller sends it as it is) or memory is
 * short.  A scatter-add of the sums adds every occurrence, as TensorFlow's
 * optimizers do (_deduplicate_indexed_slices), with one wire row per id. */
ps_tensor *ps_dedup_sum_rows(const ps_gather_dedup *d, const ps_tensor *val);

/* A client's last few deduplications.  An embedding step gathers rows by
 * a batch's ids and then scatters their gradients by the same ids: the
 * scatter finds the ids here (compared byte for byte) and takes a copy of
 * the gather's result instead of hashing them again (8192 Zipf ids: ~60 us
 * of a ~400 us push).  Thread-safe. */
#define PS_DEDUP_MEMO_SLOTS 4
/* Longer id lists are not remembered: a slot holds at most ~5 MiB. */
#define PS_DEDUP_MEMO_MAX_IDS ((int64_t)1 << 18)
typedef struct ps_dedup_memo {
  pthread_mutex_t mu;
  struct {
    ps_dtype dtype;
    int64_t n;
    void *ids; /* a copy of the ids, @cap bytes allocated */
    size_t cap;
    ps_gather_dedup d; /* their deduplication (d.uix NULL: not worth it) */
    bool valid;
  } slot[PS_DEDUP_MEMO_SLOTS];
  unsigned next; /* the slot the next new entry replaces */
} ps_dedup_memo;

void ps_dedup_memo_init(ps_dedup_memo *m);
void ps_dedup_memo_fini(ps_dedup_memo *m);
/* ps_gather_dedup_init through @m (NULL: none), with the same results. */
int ps_gather_dedup_init_memo(ps_dedup_memo *m, ps_gather_dedup *d, const ps_tensor *ix);

#endif
