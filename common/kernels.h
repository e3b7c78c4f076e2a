/* Optimizer update kernels: TensorFlow's training ops on raw buffers.
 *
 * Pure arithmetic over a variable, its slot variables and a gradient; no
 * locking, no validation.  The callers (ps/service_update.c; worker/train/session_local.c
 * for variables a session holds) holds the write locks of the variable and its slots, has
 * made their buffers private, and has checked dtypes, shapes, counts and index ranges.
 * Any thread may call. */
#ifndef PS_KERNELS_H
#define PS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

typedef enum ps_opt_kind {
  PS_OPT_GRADIENT_DESCENT = 0,
  PS_OPT_MOMENTUM = 1,
  PS_OPT_ADAGRAD = 2,
  PS_OPT_ADAM = 3,
} ps_opt_kind;

#define PS_OPT_COUNT 4
#define PS_OPT_MAX_SLOTS 2

/* What an optimizer takes, for validation and error messages. */
typedef struct ps_opt_info {
  const char *op;        /* TensorFlow op name: "ApplyMomentum" */
  const char *sparse_op; /* "SparseApplyMomentum" */
  size_t nslots;
  const char *slot_names; /* "accum" / "m, v" ("" when none) */
  size_t nhparams;
  const char *hparam_names; /* "lr, momentum" */
  bool nesterov;            /* accepts use_nesterov (dense) */
  bool sparse_nesterov;     /* accepts use_nesterov with a sparse gradient */
} ps_opt_info;

/* NULL for a number outside ps_opt_kind. */
const ps_opt_info *ps_opt_info_get(int opt);

/* True for the dtypes the kernels implement: float and double. */
bool ps_kernel_dtype_ok(int dtype);

typedef struct ps_kernel_args {
  ps_opt_kind opt;
  ps_dtype dtype;
  void *var;                     /* var_elems elements */
  void *slots[PS_OPT_MAX_SLOTS]; /* each var_elems elements */
  int64_t var_elems;
  int64_t row_elems;   /* sparse: elements per row of var */
  const void *grad;    /* dense: var_elems; sparse: nindices rows */
  bool sparse;         /* grad holds rows of indices[] */
  const void *indices; /* sparse: nindices in [0, rows of var) */
  size_t index_size;   /* 4 (int32) or 8 (int64) */
  int64_t nindices;
  const double *hparams; /* cast to dtype, as TensorFlow does */
  bool use_nesterov;
} ps_kernel_args;

/* Row access ahead of use.  Rows of a big table are scattered over memory
 * and every one is a cache miss: a loop over row ids asks for the row
 * PS_ROW_AHEAD ids on before it works on the current one, so the misses
 * overlap.  Rows over PS_ROW_PREFETCH_MAX bytes are left to the hardware
 * prefetcher.  always_inline: a function holding nothing but
 * __builtin_prefetch counts as "const" to GCC, which then deleted its calls
 * as dead code (the kernels had no prefetch left at all). */
#define PS_ROW_AHEAD 8
#define PS_ROW_PREFETCH_MAX 1024
__attribute__((always_inline)) static inline void
ps_prefetch_row(const void *row, size_t bytes, bool write) {
  if (bytes > PS_ROW_PREFETCH_MAX) return;
  const char *p = row;
  if (write)
    for (size_t o = 0; o < bytes; o += 64)
      __builtin_prefetch(p + o, 1);
  else
    for (size_t o = 0; o < bytes; o += 64)
      __builtin_prefetch(p + o, 0);
}

/* Applies one update in place.  Returns 0, or -1 (nothing changed) for a
 * dtype or optimizer the kernels do not implement. */
int ps_kernel_apply(const ps_kernel_args *a);

/* One row of an embedding table (ps/embed.c) and its slots beside it
 * (@w: dim floats of row, then each slot's dim), one step of @op with the
 * gradient row @g, in float as TensorFlow's sparse kernels: */
typedef enum ps_kernel_row_op {
  PS_KERNEL_ROW_SCATTER_ADD = 0, /* w += g */
  PS_KERNEL_ROW_SGD,             /* hp: lr */
  PS_KERNEL_ROW_ADAGRAD,         /* hp: lr; slot accum */
  PS_KERNEL_ROW_ADAM,            /* hp: lr, beta1, beta2, epsilon, beta1^t, beta2^t */
  PS_KERNEL_ROW_FTRL,            /* hp: lr, l1, l2, lr_power; slots accum, linear */
} ps_kernel_row_op;
void ps_kernel_table_row(int op, float *w, size_t dim, const float *g, const float *hp);

#endif
