/* Internals shared by ops.c (op definitions, constructors, kernels) and
 * grad.c (gradient builders, ps_gradients).
 *
 * The helper ops below exist only so that gradients can be built from
 * nodes: our graphs have no shape tensors, so where TensorFlow feeds
 * tf.shape(x) to an op, these take the node @ref itself and use the shape
 * of its value at run time. */
#ifndef PS_OPS_INTERNAL_H
#define PS_OPS_INTERNAL_H

#include "graph/node.h"

/* ---- helper ops (ops.c) ---- */
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

/* ---- gradient builders (grad.c), referenced by the op definitions ---- */
typedef int ps_grad_fn(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st);
ps_grad_fn ps_grad_add_, ps_grad_sub_, ps_grad_mul_, ps_grad_div_, ps_grad_matmul_,
    ps_grad_bias_add_, ps_grad_relu_, ps_grad_sigmoid_, ps_grad_tanh_, ps_grad_softmax_,
    ps_grad_log_softmax_, ps_grad_xent_, ps_grad_sum_, ps_grad_mean_, ps_grad_reshape_,
    ps_grad_concat_, ps_grad_gather_, ps_grad_cast_, ps_grad_neg_, ps_grad_square_,
    ps_grad_exp_, ps_grad_identity_, ps_grad_add_n_, ps_grad_broadcast_to_,
    ps_grad_sum_to_shape_, ps_grad_segment_sum_;

#endif
