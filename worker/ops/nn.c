/* Neural-network ops: BiasAdd and its gradient (with SumToShape, the sum
 * of a broadcast's gradient back to an input's shape), Softmax,
 * LogSoftmax, sparse softmax cross entropy and its gradient, and
 * mean_squared_error. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "ops_internal.h"

/* ---- BiasAdd ---- */

static int bias_shapes_ok(const ps_shape *x, const ps_shape *bias, ps_status *st) {
  char s1[SHAPE_STR], s2[SHAPE_STR];
  if (x->rank < 2)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Input tensor must be at least 2D: %s",
                         ps_shape_str_(x, s1));
  if (bias->rank != 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Biases must be 1D: %s",
                         ps_shape_str_(bias, s1));
  if (bias->dim[0] != x->dim[x->rank - 1])
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Must provide as many biases as the last dimension of the input "
                         "tensor: %s vs. %s",
                         ps_shape_str_(bias, s1), ps_shape_str_(x, s2));
  return 0;
}

static int bias_add_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                            ps_status *st) {
  if (bias_shapes_ok(&in[0]->shape, &in[1]->shape, st)) return st->code;
  return ps_binary_compute_(n, in, out, st);
}

const ps_op_def ps_op_bias_add_ = {"BiasAdd", PS_OPK_LOCAL, bias_add_compute, NULL};

ps_node *ps_bias_add(ps_node *x, ps_node *bias) {
  ps_node *in[2] = {x, bias};
  ps_graph *g = ps_check_inputs_("BiasAdd", in, 2);
  if (g == NULL) return NULL;
  if (!ps_same_type_(g, "BiasAdd", x, bias, "value", "bias") ||
      !ps_type_ok_(g, "BiasAdd", "T", x->dtype, T_NUMERIC))
    return NULL;
  if (x->shape.rank >= 0 && bias->shape.rank >= 0) {
    ps_shape xs = x->shape, bs = bias->shape;
    /* unknown dims cannot fail the check */
    if (xs.rank >= 1 && bs.rank == 1 && (xs.dim[xs.rank - 1] < 0 || bs.dim[0] < 0))
      xs.dim[xs.rank - 1] = bs.dim[0] = 0;
    ps_status st;
    if (bias_shapes_ok(&xs, &bs, &st))
      return ps_graph_fail(g, st.code, "BiasAdd: %s", st.msg);
  }
  ps_node *n = ps_make_(g, &ps_op_bias_add_, "BiasAdd", in, 2, x->dtype, &x->shape);
  if (n) n->ia[0] = B_ADD;
  return n;
}

/* out = x summed down to shape @to (which broadcasts to x's shape). */
static int sum_to(const ps_tensor *x, const ps_shape *to, ps_tensor **out,
                  ps_status *st) {
  if (ps_shape_equal(&x->shape, to)) {
    *out = ps_share_as_(x, to, st);
    return *out ? 0 : st->code;
  }
  ps_bc b;
  if (ps_bc_plan_(&b, &x->shape, to, st)) return st->code;
  if (!ps_shape_equal(&b.out, &x->shape)) {
    char s1[SHAPE_STR], s2[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT, "cannot sum shape %s down to %s",
                         ps_shape_str_(&x->shape, s1), ps_shape_str_(to, s2));
  }
  ps_tensor *o = ps_new_tensor_(x->dtype, to, true, st);
  if (o == NULL) return st->code;
  const void *xa = ps_tensor_data(x);
  void *oa = ps_tensor_data(o);
  ps_dtype dt = x->dtype;
  bool native = true;
#define PS_CASE_FLOAT(T, U)                                                              \
  do {                                                                                   \
    const T *xp = xa;                                                                    \
    T *op = oa;                                                                          \
    BC_LOOP(&b, op[ib] += xp[ia]);                                                       \
  } while (0)
#define PS_CASE_INT(T, U)                                                                \
  do {                                                                                   \
    const T *xp = xa;                                                                    \
    T *op = oa;                                                                          \
    BC_LOOP(&b, op[ib] = PS_WRAP_ADD(T, U, op[ib], xp[ia]));                             \
  } while (0)
  PS_DTYPE_SWITCH_NATIVE(dt, native = false)
#undef PS_CASE_FLOAT
#undef PS_CASE_INT
  if (!native) {
    int64_t no = ps_shape_num_elements(to);
    double *acc = calloc((size_t)(no > 0 ? no : 1), sizeof *acc);
    if (acc == NULL) {
      ps_tensor_destroy(o);
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    BC_LOOP(&b, acc[ib] += ps_elem_get(dt, xa, ia));
    for (int64_t i = 0; i < no; i++)
      ps_elem_set(dt, oa, i, acc[i]);
    free(acc);
  }
  *out = o;
  return 0;
}

static int bias_add_grad_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                                 ps_status *st) {
  const ps_shape *s = &in[0]->shape;
  if (s->rank < 1) {
    char b[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Input tensor must be at least 2D: %s",
                         ps_shape_str_(s, b));
  }
  ps_shape to = {.rank = 1, .dim = {s->dim[s->rank - 1]}};
  return sum_to(in[0], &to, out, st);
}

static int sum_to_shape_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                                ps_status *st) {
  return sum_to(in[0], &in[1]->shape, out, st);
}

static const ps_op_def op_bias_add_grad = {"BiasAddGrad", PS_OPK_LOCAL,
                                           bias_add_grad_compute, NULL};
const ps_op_def ps_op_sum_to_shape_ = {"SumToShape", PS_OPK_LOCAL, sum_to_shape_compute,
                                       NULL};

ps_node *ps_bias_add_grad_(ps_node *dy) {
  ps_graph *g = ps_check_inputs_("BiasAddGrad", &dy, 1);
  if (g == NULL) return NULL;
  ps_shape s = {.rank = 1, .dim = {-1}};
  if (dy->shape.rank > 0) s.dim[0] = dy->shape.dim[dy->shape.rank - 1];
  return ps_make_(g, &op_bias_add_grad, "BiasAddGrad", &dy, 1, dy->dtype, &s);
}

ps_node *ps_sum_to_shape_(ps_node *x, ps_node *ref) {
  ps_node *in[2] = {x, ref};
  ps_graph *g = ps_check_inputs_("SumToShape", in, 2);
  if (g == NULL) return NULL;
  return ps_make_(g, &ps_op_sum_to_shape_, "SumToShape", in, 2, x->dtype, &ref->shape);
}

/* ---- softmax and cross entropy ---- */

#define SOFTMAX_ROWS(T)                                                                  \
  do {                                                                                   \
    const T *xp = ps_tensor_data(x);                                                     \
    T *op = ps_tensor_data(o);                                                           \
    for (int64_t r = 0; r < rows; r++) {                                                 \
      const T *xr = xp + r * c;                                                          \
      T *orow = op + r * c;                                                              \
      T mx = xr[0];                                                                      \
      for (int64_t j = 1; j < c; j++)                                                    \
        if (xr[j] > mx) mx = xr[j];                                                      \
      double sum = 0;                                                                    \
      for (int64_t j = 0; j < c; j++) {                                                  \
        orow[j] = PS_EXP_OF(T)(xr[j] - mx);                                              \
        sum += orow[j];                                                                  \
      }                                                                                  \
      if (log_out) {                                                                     \
        T ls = (T)log(sum);                                                              \
        for (int64_t j = 0; j < c; j++)                                                  \
          orow[j] = xr[j] - mx - ls;                                                     \
      } else {                                                                           \
        for (int64_t j = 0; j < c; j++)                                                  \
          orow[j] = (T)(orow[j] / sum);                                                  \
      }                                                                                  \
    }                                                                                    \
  } while (0)

static int softmax_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                           ps_status *st) {
  const ps_tensor *x = in[0];
  if (x->shape.rank < 1) {
    char b[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "logits must have >= 1 dimension, got %s",
                         ps_shape_str_(&x->shape, b));
  }
  int64_t c = x->shape.dim[x->shape.rank - 1];
  int64_t rows = c > 0 ? ps_tensor_num_elements(x) / c : 0;
  bool log_out = n->ia[0];
  ps_tensor *o = ps_new_tensor_(x->dtype, &x->shape, false, st);
  if (o == NULL) return st->code;
#define PS_CASE_FLOAT(T, U) SOFTMAX_ROWS(T)
  PS_DTYPE_SWITCH_FLOAT(x->dtype, ps_tensor_destroy(o); return ps_unsupported_(x, st))
#undef PS_CASE_FLOAT
  *out = o;
  return 0;
}

const ps_op_def ps_op_softmax_ = {"Softmax", PS_OPK_LOCAL, softmax_compute, NULL};
const ps_op_def ps_op_log_softmax_ = {"LogSoftmax", PS_OPK_LOCAL, softmax_compute, NULL};

static ps_node *softmax(const ps_op_def *def, ps_node *x) {
  ps_graph *g = ps_check_inputs_(def->type, &x, 1);
  if (g == NULL || !ps_type_ok_(g, def->type, "T", x->dtype, T_FLOATS_FD)) return NULL;
  if (x->shape.rank == 0) {
    char b[SHAPE_STR];
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: logits must have >= 1 dimension, got %s", def->type,
                         ps_shape_str_(&x->shape, b));
  }
  ps_node *n = ps_make_(g, def, def->type, &x, 1, x->dtype, &x->shape);
  if (n) n->ia[0] = def == &ps_op_log_softmax_;
  return n;
}

ps_node *ps_softmax(ps_node *logits) {
  return softmax(&ps_op_softmax_, logits);
}
ps_node *ps_log_softmax(ps_node *logits) {
  return softmax(&ps_op_log_softmax_, logits);
}

/* Shapes of logits [N, C] and labels [N]; all labels in [0, C). */
static int xent_check(const ps_tensor *logits, const ps_tensor *labels, ps_status *st) {
  char s1[SHAPE_STR], s2[SHAPE_STR];
  if (logits->shape.rank != 2)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "logits must be 2-D, but got shape %s",
                         ps_shape_str_(&logits->shape, s1));
  if (labels->shape.rank != 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "labels must be 1-D, but got shape %s",
                         ps_shape_str_(&labels->shape, s1));
  if (logits->shape.dim[0] != labels->shape.dim[0])
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "logits and labels must have the same first dimension, got "
                         "logits shape %s and labels shape %s",
                         ps_shape_str_(&logits->shape, s1),
                         ps_shape_str_(&labels->shape, s2));
  int64_t n = labels->shape.dim[0], c = logits->shape.dim[1];
  const void *lp = ps_tensor_data(labels);
  for (int64_t i = 0; i < n; i++) {
    int64_t l = ps_geti_(labels->dtype, lp, i);
    if (l < 0 || l >= c) {
      char vals[512];
      size_t off = 0;
      vals[0] = '\0';
      for (int64_t j = 0; j < n && off < sizeof vals; j++)
        off += (size_t)snprintf(vals + off, sizeof vals - off, "%s%lld", j ? " " : "",
                                (long long)ps_geti_(labels->dtype, lp, j));
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Received a label value of %lld which is outside the valid "
                           "range of [0, %lld).  Label values: %s",
                           (long long)l, (long long)c, vals);
    }
  }
  return 0;
}

/* loss[i] = logsumexp(x[i]) - x[i][label]; with @dy: the gradient
 * (softmax(x[i]) - onehot(label)) * dy[i] instead. */
#define XENT_ROWS(T)                                                                     \
  do {                                                                                   \
    const T *xp = ps_tensor_data(logits);                                                \
    T *op = ps_tensor_data(o);                                                           \
    const T *dyp = dy ? ps_tensor_data(dy) : NULL;                                       \
    for (int64_t r = 0; r < rows; r++) {                                                 \
      const T *xr = xp + r * c;                                                          \
      int64_t l = ps_geti_(labels->dtype, ps_tensor_data(labels), r);                    \
      T mx = xr[0];                                                                      \
      for (int64_t j = 1; j < c; j++)                                                    \
        if (xr[j] > mx) mx = xr[j];                                                      \
      double sum = 0;                                                                    \
      for (int64_t j = 0; j < c; j++)                                                    \
        sum += PS_EXP_OF(T)(xr[j] - mx);                                                 \
      if (dyp == NULL) {                                                                 \
        op[r] = (T)(log(sum) - (double)(xr[l] - mx));                                    \
      } else {                                                                           \
        T *orow = op + r * c;                                                            \
        for (int64_t j = 0; j < c; j++)                                                  \
          orow[j] = (T)((PS_EXP_OF(T)(xr[j] - mx) / sum - (j == l)) * dyp[r]);           \
      }                                                                                  \
    }                                                                                    \
  } while (0)

static int xent_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                        ps_status *st) {
  const ps_tensor *logits = in[0], *labels = in[1];
  const ps_tensor *dy = n->nin > 2 ? in[2] : NULL;
  if (xent_check(logits, labels, st)) return st->code;
  int64_t rows = logits->shape.dim[0], c = logits->shape.dim[1];
  if (dy && (dy->shape.rank != 1 || dy->shape.dim[0] != rows)) {
    char s1[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "gradient has shape %s, expected [%lld]",
                         ps_shape_str_(&dy->shape, s1), (long long)rows);
  }
  ps_shape os = {.rank = 1, .dim = {rows}};
  ps_tensor *o = ps_new_tensor_(logits->dtype, dy ? &logits->shape : &os, false, st);
  if (o == NULL) return st->code;
#define PS_CASE_FLOAT(T, U) XENT_ROWS(T)
  PS_DTYPE_SWITCH_FLOAT(logits->dtype, ps_tensor_destroy(o);
                        return ps_unsupported_(logits, st))
#undef PS_CASE_FLOAT
  *out = o;
  return 0;
}

const ps_op_def ps_op_xent_ = {"SparseSoftmaxCrossEntropyWithLogits", PS_OPK_LOCAL,
                               xent_compute, NULL};
static const ps_op_def op_xent_grad = {"SparseSoftmaxCrossEntropyWithLogitsGrad",
                                       PS_OPK_LOCAL, xent_compute, NULL};

static ps_node *xent(const ps_op_def *def, ps_node *labels, ps_node *logits,
                     ps_node *dy) {
  const char *op = "SparseSoftmaxCrossEntropyWithLogits";
  ps_node *in[3] = {logits, labels, dy};
  int nin = dy ? 3 : 2;
  ps_graph *g = ps_check_inputs_(op, in, nin);
  if (g == NULL) return NULL;
  if (!ps_type_ok_(g, op, "T", logits->dtype, T_FLOATS_FD) ||
      !ps_type_ok_(g, op, "Tlabels", labels->dtype, T_INDEX))
    return NULL;
  char s1[SHAPE_STR], s2[SHAPE_STR];
  const ps_shape *ls = &logits->shape, *bs = &labels->shape;
  if (ls->rank >= 0 && ls->rank != 2)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: logits must be 2-D, but got shape %s", op,
                         ps_shape_str_(ls, s1));
  if (bs->rank >= 0 && bs->rank != 1)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: labels must be 1-D, but got shape %s", op,
                         ps_shape_str_(bs, s1));
  int64_t n0 = ls->rank == 2 ? ls->dim[0] : -1, n1 = bs->rank == 1 ? bs->dim[0] : -1;
  if (n0 >= 0 && n1 >= 0 && n0 != n1)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: logits and labels must have the same first dimension, got "
                         "logits shape %s and labels shape %s",
                         op, ps_shape_str_(ls, s1), ps_shape_str_(bs, s2));
  ps_shape s = {.rank = 1, .dim = {n0 >= 0 ? n0 : n1}};
  if (dy) {
    if (!ps_same_type_(g, def->type, logits, dy, "logits", "dy")) return NULL;
    s = *ls;
    if (s.rank < 0) s = (ps_shape){.rank = 2, .dim = {n1, -1}};
  }
  return ps_make_(g, def, dy ? def->type : op, in, nin, logits->dtype, &s);
}

ps_node *ps_sparse_softmax_cross_entropy_with_logits(ps_node *labels, ps_node *logits) {
  return xent(&ps_op_xent_, labels, logits, NULL);
}

ps_node *ps_xent_grad_(ps_node *logits, ps_node *labels, ps_node *dy) {
  return xent(&op_xent_grad, labels, logits, dy);
}

ps_node *ps_mean_squared_error(ps_node *labels, ps_node *predictions) {
  ps_node *in[2] = {labels, predictions};
  ps_graph *g = ps_check_inputs_("mean_squared_error", in, 2);
  if (g == NULL) return NULL;
  if (!ps_type_ok_(g, "mean_squared_error", "T", predictions->dtype, T_FLOATS))
    return NULL;
  const ps_shape *a = &predictions->shape, *b = &labels->shape;
  bool ok = a->rank < 0 || b->rank < 0 || a->rank == b->rank;
  for (int i = 0; ok && a->rank >= 0 && a->rank == b->rank && i < a->rank; i++)
    ok = a->dim[i] < 0 || b->dim[i] < 0 || a->dim[i] == b->dim[i];
  if (!ok) {
    char s1[SHAPE_STR], s2[SHAPE_STR];
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "mean_squared_error: Shapes %s and %s are incompatible",
                         ps_shape_str_(a, s1), ps_shape_str_(b, s2));
  }
  ps_graph_mark m = ps_graph_mark_(g);
  if (ps_name_scope_push(g, "mean_squared_error", NULL) != 0) return NULL;
  if (labels->dtype != predictions->dtype) labels = ps_cast(labels, predictions->dtype);
  ps_node *loss =
      ps_reduce_mean(ps_square(ps_sub(predictions, labels)), PS_ALL_AXES, false);
  ps_name_scope_pop(g);
  if (loss == NULL) ps_graph_rollback_(g, m);
  return loss;
}

/* Every op of this file, for MetaGraph import (train/metagraph_import.c). */
const ps_op_def *const ps_opdefs_nn_[] = {
    &ps_op_bias_add_,    &op_bias_add_grad, &ps_op_sum_to_shape_, &ps_op_softmax_,
    &ps_op_log_softmax_, &ps_op_xent_,      &op_xent_grad,        NULL};
