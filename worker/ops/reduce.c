/* Reductions: Sum and Mean over one axis or all, with keep_dims, and
 * ArgMax. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "ops_internal.h"

/* ---- reductions ---- */

static ps_shape reduced_shape(const ps_shape *s, int axis, bool keep) {
  ps_shape o = {.rank = 0};
  for (int i = 0; i < s->rank; i++) {
    bool red = axis == PS_ALL_AXES || i == axis;
    if (red && !keep) continue;
    o.dim[o.rank++] = red ? 1 : s->dim[i];
  }
  return o;
}

static int reduce_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  const ps_tensor *x = in[0];
  const ps_shape *s = &x->shape;
  int axis = PS_ALL_AXES;
  int64_t outer = 1, len, inner = 1;
  if (n->ia[0] != PS_ALL_AXES) {
    axis = norm_axis(n->ia[0], s->rank);
    if (axis < 0)
      return ps_status_set(
          st, PS_INVALID_ARGUMENT,
          "Invalid reduction dimension %lld for input with %d dimensions.",
          (long long)n->ia[0], s->rank);
    outer = dims_product(s, 0, axis);
    len = s->dim[axis];
    inner = dims_product(s, axis + 1, s->rank);
  } else {
    len = ps_shape_num_elements(s);
  }
  bool mean = n->ia[2];
  ps_shape os = reduced_shape(s, axis, n->ia[1]);
  ps_tensor *o = ps_new_tensor_(x->dtype, &os, false, st);
  if (o == NULL) return st->code;
  ps_dtype dt = x->dtype;
  const void *xa = ps_tensor_data(x);
  void *oa = ps_tensor_data(o);
  bool ints = is_int(dt);
  /* accumulate a row of @inner outputs at a time: reads stay sequential */
  void *acc = calloc((size_t)(inner > 0 ? inner : 1), 8);
  if (acc == NULL) {
    ps_tensor_destroy(o);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (int64_t ou = 0; ou < outer; ou++) {
    memset(acc, 0, (size_t)(inner > 0 ? inner : 1) * 8);
    int64_t base = ou * len * inner;
    if (ints) {
      uint64_t *a = acc;
      for (int64_t k = 0; k < len; k++)
        for (int64_t i = 0; i < inner; i++)
          a[i] += (uint64_t)ps_geti_(dt, xa, base + k * inner + i);
      for (int64_t i = 0; i < inner; i++) {
        int64_t v = (int64_t)a[i];
        if (mean) v = len > 0 ? v / len : 0;
        ps_seti_(dt, oa, ou * inner + i, v);
      }
    } else {
      double *a = acc;
      /* a contiguous run (inner == 1): independent partial sums vectorize */
#define PS_CASE_FLOAT(T, U)                                                              \
  do {                                                                                   \
    const T *xp = (const T *)xa + base;                                                  \
    if (inner == 1) {                                                                    \
      double part[8] = {0};                                                              \
      int64_t k = 0;                                                                     \
      for (; k + 8 <= len; k += 8)                                                       \
        for (int j = 0; j < 8; j++)                                                      \
          part[j] += xp[k + j];                                                          \
      for (; k < len; k++)                                                               \
        part[0] += xp[k];                                                                \
      for (int j = 0; j < 8; j++)                                                        \
        a[0] += part[j];                                                                 \
    } else {                                                                             \
      for (int64_t k = 0; k < len; k++)                                                  \
        for (int64_t i = 0; i < inner; i++)                                              \
          a[i] += xp[k * inner + i];                                                     \
    }                                                                                    \
  } while (0)
      PS_DTYPE_SWITCH_FLOAT(dt, for (int64_t k = 0; k < len;
                                     k++) for (int64_t i = 0; i < inner; i++) a[i] +=
                                ps_elem_get(dt, xa, base + k * inner + i))
#undef PS_CASE_FLOAT
      for (int64_t i = 0; i < inner; i++)
        ps_elem_set(dt, oa, ou * inner + i,
                    mean ? (len > 0 ? a[i] / (double)len : NAN) : a[i]);
    }
  }
  free(acc);
  *out = o;
  return 0;
}

const ps_op_def ps_op_sum_ = {"Sum", PS_OPK_LOCAL, reduce_compute, NULL};
const ps_op_def ps_op_mean_ = {"Mean", PS_OPK_LOCAL, reduce_compute, NULL};

static ps_node *reduce(const ps_op_def *def, ps_node *x, int axis, bool keep) {
  ps_graph *g = ps_check_inputs_(def->type, &x, 1);
  if (g == NULL || !ps_type_ok_(g, def->type, "T", x->dtype, T_NUMERIC)) return NULL;
  ps_shape s;
  int64_t stored = axis;
  if (x->shape.rank < 0) {
    s.rank = axis == PS_ALL_AXES && !keep ? 0 : -1;
  } else if (axis == PS_ALL_AXES) {
    s = reduced_shape(&x->shape, PS_ALL_AXES, keep);
  } else {
    int a = norm_axis(axis, x->shape.rank);
    if (a < 0)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "%s: Invalid reduction dimension %d for input with %d "
                           "dimensions.",
                           def->type, axis, x->shape.rank);
    s = reduced_shape(&x->shape, a, keep);
    stored = a;
  }
  ps_node *n = ps_make_(g, def, def->type, &x, 1, x->dtype, &s);
  if (n) {
    n->ia[0] = stored;
    n->ia[1] = keep;
    n->ia[2] = def == &ps_op_mean_;
  }
  return n;
}

ps_node *ps_reduce_sum(ps_node *x, int axis, bool keep_dims) {
  return reduce(&ps_op_sum_, x, axis, keep_dims);
}
ps_node *ps_reduce_mean(ps_node *x, int axis, bool keep_dims) {
  return reduce(&ps_op_mean_, x, axis, keep_dims);
}

/* ---- ArgMax ---- */

static bool elem_gt(ps_dtype dt, const void *p, int64_t i, int64_t j) {
#define PS_CASE_FLOAT(T, U) return ((const T *)p)[i] > ((const T *)p)[j]
#define PS_CASE_INT(T, U) return ((const T *)p)[i] > ((const T *)p)[j]
  PS_DTYPE_SWITCH_NATIVE(dt, return ps_elem_get(dt, p, i) > ps_elem_get(dt, p, j))
#undef PS_CASE_FLOAT
#undef PS_CASE_INT
  return false;
}

static int argmax_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  const ps_tensor *x = in[0];
  const ps_shape *s = &x->shape;
  int axis = norm_axis(n->ia[0], s->rank);
  if (axis < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Expected dimension in the range [%d, %d), but got %lld",
                         -s->rank, s->rank, (long long)n->ia[0]);
  int64_t outer = dims_product(s, 0, axis), len = s->dim[axis];
  int64_t inner = dims_product(s, axis + 1, s->rank);
  ps_shape os = reduced_shape(s, axis, false);
  if (len == 0 && ps_shape_num_elements(&os) > 0) {
    char b[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Reduction axis %d is empty in shape %s", axis,
                         ps_shape_str_(s, b));
  }
  ps_tensor *o = ps_new_tensor_(PS_DT_INT64, &os, false, st);
  if (o == NULL) return st->code;
  int64_t *op = ps_tensor_data(o);
  const void *xa = ps_tensor_data(x);
  for (int64_t ou = 0; ou < outer; ou++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = ou * len * inner + i, best = 0;
      for (int64_t k = 1; k < len; k++)
        if (elem_gt(x->dtype, xa, base + k * inner, base + best * inner)) best = k;
      op[ou * inner + i] = best;
    }
  *out = o;
  return 0;
}

static const ps_op_def op_argmax = {"ArgMax", PS_OPK_LOCAL, argmax_compute, NULL};

ps_node *ps_argmax(ps_node *x, int axis) {
  ps_graph *g = ps_check_inputs_("ArgMax", &x, 1);
  if (g == NULL || !ps_type_ok_(g, "ArgMax", "T", x->dtype, T_NUMERIC)) return NULL;
  ps_shape s = {.rank = -1};
  int64_t stored = axis;
  if (x->shape.rank >= 0) {
    int a = norm_axis(axis, x->shape.rank);
    if (a < 0)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "ArgMax: Expected dimension in the range [%d, %d), but got %d",
                           -x->shape.rank, x->shape.rank, axis);
    s = reduced_shape(&x->shape, a, false);
    stored = a;
  }
  ps_node *n = ps_make_(g, &op_argmax, "ArgMax", &x, 1, PS_DT_INT64, &s);
  if (n) n->ia[0] = stored;
  return n;
}

/* Every op of this file, for MetaGraph import (train/metagraph_import.c). */
const ps_op_def *const ps_opdefs_reduce_[] = {&ps_op_sum_, &ps_op_mean_, &op_argmax,
                                              NULL};
