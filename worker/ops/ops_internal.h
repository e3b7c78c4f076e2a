/* Internals shared by the files of worker/ops/: the op families (math.c,
 * nn.c, reduce.c, array.c: op definitions, constructors, kernels), their
 * shared helpers (ops_common.c) and grad.c (gradient builders,
 * ps_gradients).
 *
 * The helper ops below exist only so that gradients can be built from
 * nodes: our graphs have no shape tensors, so where TensorFlow feeds
 * tf.shape(x) to an op, these take the node @ref itself and use the shape
 * of its value at run time. */
#ifndef PS_OPS_INTERNAL_H
#define PS_OPS_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/tensor.h"
#include "graph/node.h"

/* ---- shared by the op families (ops_common.c) ---- */

#define SHAPE_STR 400
#define M(dt) (1u << (dt))
#define T_FLOATS_FD (M(PS_DT_FLOAT) | M(PS_DT_DOUBLE))
#define T_FLOATS (T_FLOATS_FD | M(PS_DT_HALF) | M(PS_DT_BFLOAT16))
#define T_INTS                                                                           \
  (M(PS_DT_INT8) | M(PS_DT_INT16) | M(PS_DT_INT32) | M(PS_DT_INT64) | M(PS_DT_UINT8) |   \
   M(PS_DT_UINT16) | M(PS_DT_UINT32) | M(PS_DT_UINT64))
#define T_INDEX (M(PS_DT_INT32) | M(PS_DT_INT64))
#define T_NUMERIC (T_FLOATS | T_INTS)
#define T_ALL (T_NUMERIC | M(PS_DT_BOOL))

static inline bool fully_known(const ps_shape *s) {
  if (s->rank < 0) return false;
  for (int i = 0; i < s->rank; i++)
    if (s->dim[i] < 0) return false;
  return true;
}

/* Elements of a shape known statically, else -1. */
static inline int64_t known_elements(const ps_shape *s) {
  return fully_known(s) ? ps_shape_num_elements(s) : -1;
}

static inline bool in_mask(ps_dtype dt, uint32_t mask) {
  return (int)dt > 0 && (int)dt < 32 && ((mask >> dt) & 1);
}

static inline bool is_int(ps_dtype dt) {
  return in_mask(dt, T_INTS);
}

/* Product of dims [from, to). */
static inline int64_t dims_product(const ps_shape *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++)
    p *= s->dim[i];
  return p;
}

/* "[2,?]", "<unknown>" for an unknown rank (TensorFlow's static shapes) */
const char *ps_shape_str_(const ps_shape *s, char *buf);
/* TensorFlow's "Value for attr 'T' of int32 is not in the list of allowed
 * values: float, double". */
bool ps_type_ok_(ps_graph *g, const char *op, const char *attr, ps_dtype dt,
                 uint32_t mask);
bool ps_same_type_(ps_graph *g, const char *op, const ps_node *a, const ps_node *b,
                   const char *aname, const char *bname);
/* The graph of the inputs.  A missing input (a constructor that failed
 * before) fails the graph as ps_node_new() does; so do inputs from
 * another graph.  NULL then. */
ps_graph *ps_check_inputs_(const char *op, ps_node *const *in, int n);
ps_node *ps_make_(ps_graph *g, const ps_op_def *def, const char *hint, ps_node *const *in,
                  int nin, ps_dtype dtype, const ps_shape *shape);
/* Numpy broadcasting of static shapes (unknown dims stay unknown unless
 * the other side says more).  False if they can never broadcast. */
bool ps_broadcast_static_(const ps_shape *a, const ps_shape *b, ps_shape *out);
ps_tensor *ps_new_tensor_(ps_dtype dt, const ps_shape *s, bool zero, ps_status *st);
/* A tensor with @t's bytes and shape @s (no copy). */
ps_tensor *ps_share_as_(const ps_tensor *t, const ps_shape *s, ps_status *st);
int64_t ps_geti_(ps_dtype dt, const void *p, int64_t i);
/* Stores @v wrapped to the type's width, as a C cast does. */
void ps_seti_(ps_dtype dt, void *p, int64_t i, int64_t v);
int ps_unsupported_(const ps_tensor *t, ps_status *st);

/* Axis of rank @r (negative counts from the end); -1 if out of range. */
static inline int norm_axis(int64_t axis, int r) {
  if (axis < -r || axis >= r) return -1;
  return (int)(axis < 0 ? axis + r : axis);
}

/* The C math function of element type T (float: expf, double: exp), for
 * kernels written once for both floating types (PS_DTYPE_SWITCH_FLOAT). */
#define PS_EXP_OF(T) _Generic((T)0, float : expf, default : exp)
#define PS_TANH_OF(T) _Generic((T)0, float : tanhf, default : tanh)

/* The broadcast of two shapes, planned once per call (ops_common.c). */
typedef struct ps_bc {
  int rank; /* >= 1 after simplification */
  int64_t dim[PS_MAX_RANK];
  int64_t sa[PS_MAX_RANK], sb[PS_MAX_RANK]; /* element strides, 0 = broadcast */
  int64_t n;                                /* output elements */
  ps_shape out;                             /* output shape as numpy gives it */
} ps_bc;

/* The plan of x op y; INVALID_ARGUMENT "Incompatible shapes" if none. */
int ps_bc_plan_(ps_bc *b, const ps_shape *x, const ps_shape *y, ps_status *st);
/* Runs the statement(s) for every output element k, with ia / ib the
 * matching elements of the two inputs.  The innermost loop is specialized
 * for the usual strides (both contiguous, or one side constant) so that
 * the compiler can vectorize it. */
#define BC_INNER(SA, SB, ...)                                                            \
  for (int64_t j_ = 0; j_ < inner_; j_++, k++) {                                         \
    const int64_t ia = ia0_ + j_ * (SA), ib = ib0_ + j_ * (SB);                          \
    (void)ia;                                                                            \
    (void)ib;                                                                            \
    __VA_ARGS__;                                                                         \
  }
#define BC_LOOP(plan, ...)                                                               \
  do {                                                                                   \
    const ps_bc *b_ = (plan);                                                            \
    int64_t idx_[PS_MAX_RANK] = {0}, ia0_ = 0, ib0_ = 0, k = 0;                          \
    const int last_ = b_->rank - 1;                                                      \
    const int64_t inner_ = b_->dim[last_], sal_ = b_->sa[last_], sbl_ = b_->sb[last_];   \
    if (b_->n > 0)                                                                       \
      for (;;) {                                                                         \
        if (sal_ == 1 && sbl_ == 1) {                                                    \
          BC_INNER(1, 1, __VA_ARGS__)                                                    \
        } else if (sal_ == 1 && sbl_ == 0) {                                             \
          BC_INNER(1, 0, __VA_ARGS__)                                                    \
        } else if (sal_ == 0 && sbl_ == 1) {                                             \
          BC_INNER(0, 1, __VA_ARGS__)                                                    \
        } else {                                                                         \
          BC_INNER(sal_, sbl_, __VA_ARGS__)                                              \
        }                                                                                \
        int d_ = last_ - 1;                                                              \
        for (; d_ >= 0; d_--) {                                                          \
          ia0_ += b_->sa[d_];                                                            \
          ib0_ += b_->sb[d_];                                                            \
          if (++idx_[d_] < b_->dim[d_]) break;                                           \
          ia0_ -= b_->sa[d_] * b_->dim[d_];                                              \
          ib0_ -= b_->sb[d_] * b_->dim[d_];                                              \
          idx_[d_] = 0;                                                                  \
        }                                                                                \
        if (d_ < 0) break;                                                               \
      }                                                                                  \
  } while (0)

/* The elementwise binary ops (n->ia[0]) and their kernel (math.c); BiasAdd
 * runs it too. */
typedef enum binop {
  B_ADD,
  B_SUB,
  B_MUL,
  B_DIV,
  B_RELU_GRAD,    /* (dy, y) */
  B_SIGMOID_GRAD, /* (y, dy) */
  B_TANH_GRAD,    /* (y, dy) */
} binop;

int ps_binary_compute_(ps_node *n, ps_tensor *const *in, ps_tensor **out, ps_status *st);

/* ---- helper ops (math.c, nn.c, array.c) ---- */
ps_node *ps_identity_(ps_node *x);
ps_node *ps_exp_(ps_node *x);
ps_node *ps_ones_like_(ps_node *x);
/* sum(x_i), all of the same dtype and shape */
ps_node *ps_add_n_(ps_node *const *xs, int n);
/* @x reshaped to the run-time shape of @ref */
ps_node *ps_reshape_like_(ps_node *x, ps_node *ref);
/* a dimension of 1 inserted at @axis (TF's ExpandDims; -1 appends) */
ps_node *ps_expand_dims_(ps_node *x, int axis);
/* @x broadcast (numpy rules) to the run-time shape of @ref */
ps_node *ps_broadcast_to_(ps_node *x, ps_node *ref);
/* @x summed over the dimensions along which @ref's shape broadcasts to
 * x's shape: the gradient of a broadcast (BroadcastGradientArgs + Sum) */
ps_node *ps_sum_to_shape_(ps_node *x, ps_node *ref);
/* scalar of x's dtype: elements of @x / elements of @y (Mean's gradient) */
ps_node *ps_size_ratio_(ps_node *x, ps_node *y);
ps_node *ps_relu_grad_(ps_node *dy, ps_node *y);    /* dy * (y > 0) */
ps_node *ps_sigmoid_grad_(ps_node *y, ps_node *dy); /* dy * y * (1 - y) */
ps_node *ps_tanh_grad_(ps_node *y, ps_node *dy);    /* dy * (1 - y^2) */
ps_node *ps_bias_add_grad_(ps_node *dy);            /* sum over all but the last axis */
/* (softmax(logits) - onehot(labels)) * dy[:, None] */
ps_node *ps_xent_grad_(ps_node *logits, ps_node *labels, ps_node *dy);
/* the part of @dy that input @i of concat(xs, axis) contributed */
ps_node *ps_concat_slice_(ps_node *dy, ps_node *const *xs, int n, int axis, int i);
/* out[ids[k]] += rows[k]; out has @num_segments rows, or as many as @ref
 * has at run time when num_segments < 0 (@ref may be NULL otherwise) */
ps_node *ps_unsorted_segment_sum_(ps_node *rows, ps_node *ids, int64_t num_segments,
                                  ps_node *ref);

/* ---- the differentiable ops, whose gradient builders grad.c keeps ---- */
typedef int ps_grad_fn(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st);
extern const ps_op_def ps_op_reshape_, ps_op_expand_dims_, ps_op_identity_, ps_op_concat_,
    ps_op_gather_, ps_op_segment_sum_, ps_op_broadcast_to_; /* array.c */
extern const ps_op_def ps_op_add_, ps_op_sub_, ps_op_mul_, ps_op_div_, ps_op_neg_,
    ps_op_square_, ps_op_relu_, ps_op_sigmoid_, ps_op_tanh_, ps_op_exp_, ps_op_matmul_,
    ps_op_cast_, ps_op_add_n_; /* math.c */
extern const ps_op_def ps_op_bias_add_, ps_op_sum_to_shape_, ps_op_softmax_,
    ps_op_log_softmax_, ps_op_xent_;            /* nn.c */
extern const ps_op_def ps_op_sum_, ps_op_mean_; /* reduce.c */

#endif
