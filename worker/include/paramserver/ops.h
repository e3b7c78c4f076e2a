/* Math ops and gradients for worker graphs (CPU; matrix products through
 * OpenBLAS).  Elementwise binary ops broadcast as numpy does.  Every
 * constructor returns NULL (and records the error in the graph) on a
 * dtype or shape mismatch, naming the op and both shapes. */
#ifndef PARAMSERVER_OPS_H
#define PARAMSERVER_OPS_H

#include "paramserver/api.h"
#include "paramserver/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

PS_API ps_node *ps_add(ps_node *a, ps_node *b);
PS_API ps_node *ps_sub(ps_node *a, ps_node *b);
PS_API ps_node *ps_mul(ps_node *a, ps_node *b);
PS_API ps_node *ps_div(ps_node *a, ps_node *b);
PS_API ps_node *ps_matmul(ps_node *a, ps_node *b, bool transpose_a, bool transpose_b);
PS_API ps_node *ps_bias_add(ps_node *x, ps_node *bias);
PS_API ps_node *ps_relu(ps_node *x);
PS_API ps_node *ps_sigmoid(ps_node *x);
PS_API ps_node *ps_tanh(ps_node *x);
PS_API ps_node *ps_softmax(ps_node *logits);     /* last axis */
PS_API ps_node *ps_log_softmax(ps_node *logits); /* last axis */
/* labels int32/int64 [N], logits [N, C] -> per-example loss [N] */
PS_API ps_node *ps_sparse_softmax_cross_entropy_with_logits(ps_node *labels,
                                                            ps_node *logits);
/* mean over all elements of (labels - predictions)^2 -> scalar */
PS_API ps_node *ps_mean_squared_error(ps_node *labels, ps_node *predictions);
#define PS_ALL_AXES (-1000)
PS_API ps_node *ps_reduce_sum(ps_node *x, int axis, bool keep_dims);
PS_API ps_node *ps_reduce_mean(ps_node *x, int axis, bool keep_dims);
/* @shape may hold one -1 */
PS_API ps_node *ps_reshape(ps_node *x, const ps_shape *shape);
PS_API ps_node *ps_concat(ps_node *const *xs, size_t n, int axis);
/* rows of @params (axis 0); when params is a variable's value the session
 * reads only those rows from the ps, and the gradient is sparse */
PS_API ps_node *ps_gather(ps_node *params, ps_node *indices);
PS_API ps_node *ps_argmax(ps_node *x, int axis);  /* int64 */
PS_API ps_node *ps_equal(ps_node *a, ps_node *b); /* bool */
PS_API ps_node *ps_cast(ps_node *x, ps_dtype dtype);
PS_API ps_node *ps_neg(ps_node *x);
PS_API ps_node *ps_square(ps_node *x);

/* tf.nn.conv2d: @input [N,H,W,C] (NHWC), @filter [KH,KW,C,O] (fully
 * known), @strides {1, sh, sw, 1}, @padding "SAME" or "VALID" (TensorFlow's
 * output sizes and padding); float or double; differentiable in both
 * inputs. */
PS_API ps_node *ps_conv2d(ps_node *input, ps_node *filter, const int strides[4],
                          const char *padding, const char *name);

/* Random tensors of a fully known @shape (TensorFlow's random_normal,
 * truncated_normal: redrawn beyond 2 stddev, random_uniform: [minval,
 * maxval); int32/int64 need minval < maxval).  @seed: the op-level seed or
 * NULL; with ps_graph_set_random_seed the rules of TensorFlow 1.x's
 * get_seed apply (see worker/ops/random.c), so graphs built alike give
 * the same values in every process, and each run the next ones; with no
 * seed at all, new values every run.  Not TensorFlow's values bit for
 * bit.  Not differentiable. */
PS_API ps_node *ps_random_normal(ps_graph *g, const ps_shape *shape, ps_dtype dtype,
                                 double mean, double stddev, const int64_t *seed,
                                 const char *name);
PS_API ps_node *ps_truncated_normal(ps_graph *g, const ps_shape *shape, ps_dtype dtype,
                                    double mean, double stddev, const int64_t *seed,
                                    const char *name);
PS_API ps_node *ps_random_uniform(ps_graph *g, const ps_shape *shape, ps_dtype dtype,
                                  double minval, double maxval, const int64_t *seed,
                                  const char *name);

/* Reverse-mode gradients of the scalar @y with respect to @xs (dy = 1).
 * dxs[i] is NULL when y does not depend on xs[i].  A gradient reaching a
 * variable's value only through gathers is sparse: its node has
 * sparse_indices set (see worker/graph/node.h).  Gradients of several paths
 * are summed (sparse + sparse stays sparse by concatenation). */
PS_API int ps_gradients(ps_graph *g, ps_node *y, ps_node *const *xs, size_t n,
                        ps_node **dxs, ps_status *st);

#ifdef __cplusplus
}
#endif

#endif
