/* What bench_ps (d) and bench_wire share about a batch of ids that repeat
 * and its bfloat16 push: the client's per-id sum done the same way for the
 * baselines and the mirrors, and the user's float32 -> bfloat16 conversion
 * (bf16_batch.c). */
#ifndef PS_TESTS_BENCH_BF16_BATCH_H
#define PS_TESTS_BENCH_BF16_BATCH_H

#include <stddef.h>
#include <stdint.h>

/* The distinct ids of a batch in first-occurrence order and each
 * position's slot among them (stamp/slot: per-row scratch), and the
 * gradient rows summed per distinct id in the order they come (the first
 * copied, the others added), so every table gets the same arithmetic. */
typedef struct batch_scratch {
  int32_t *stamp, *slot; /* [rows] */
  int32_t gen;
  int64_t *uid; /* [batch] */
  int32_t *from;
  float *urows, *usum; /* [batch * dim]; urows may be NULL (bench_wire) */
} batch_scratch;

/* Fills w->uid and w->from for @ids; returns the number of distinct ids. */
int64_t batch_unique(batch_scratch *w, const int64_t *ids, int64_t n);

/* The user's conversion of float32 values to bfloat16: round to nearest
 * even, a NaN kept a NaN, bit for bit ps_float_to_bf16, written as a loop
 * the compiler vectorizes. */
void bf16_from_float(uint16_t *dst, const float *src, size_t n);

/* bf16_from_float against ps_float_to_bf16 on every bfloat16
 * neighbourhood: each high half with low halves 0, the tie 0x8000 and
 * either side of it, and 0xffff (gradients that convert exactly would not
 * show a wrong rounding).  1 when equal; else 0, said on stderr by @who. */
int bf16_conversion_ok(const char *who);

/* One step on a bfloat16 table's mirror @t (rows of @dim floats): what the
 * client and the ps do with the float32 batch @g of @ids pushed as
 * bfloat16 (each element converted by ps_float_to_bf16).  The client sums
 * the widened rows of each distinct id in float32 in the order they come
 * (worker/client/dedup.c) and rounds each sum to bfloat16 once; the ps
 * widens it and adds it to the row in float32.  Returns the number of
 * distinct ids. */
int64_t bf16_mirror_step(float *t, batch_scratch *w, const int64_t *ids, int64_t n,
                         int64_t dim, const float *g);

/* The first of @n floats where @a and @b differ bit for bit (@n if none). */
size_t first_difference(const float *a, const float *b, size_t n);

#endif
