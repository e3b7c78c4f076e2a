/* 2-D convolution (TensorFlow's Conv2D, NHWC input, HWIO filter) and its
 * gradients (Conv2DBackpropInput, Conv2DBackpropFilter).  Direct loops:
 * enough for the models of the guides, not tuned for large images.
 * Attributes: ia[0], ia[1] the row and column strides, ia[2] 1 for SAME
 * padding, 0 for VALID. */
#include <stdio.h>
#include <string.h>

#include "ops_internal.h"

static int conv_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out, ps_status *st);

static int grad_conv(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st);

static const ps_op_def op_conv = {"Conv2D", PS_OPK_LOCAL, conv_compute, grad_conv};
static const ps_op_def op_conv_bin = {"Conv2DBackpropInput", PS_OPK_LOCAL, conv_compute,
                                      NULL};
static const ps_op_def op_conv_bfl = {"Conv2DBackpropFilter", PS_OPK_LOCAL, conv_compute,
                                      NULL};

/* TensorFlow's output size and leading padding of one spatial dimension. */
static int64_t out_size(int64_t in, int64_t k, int64_t s, bool same, int64_t *pad) {
  int64_t o = same ? (in + s - 1) / s : (in - k + s) / s;
  if (o < 0) o = 0;
  int64_t total = same ? (o - 1) * s + k - in : 0;
  *pad = total > 0 ? total / 2 : 0;
  return o;
}

/* One loop nest for the three ops: x [N,H,W,C], f [KH,KW,C,O], y [N,OH,OW,O].
 * mode 0: y = conv(x, f); 1: dx from (f, dy); 2: df from (x, dy). */
#define CONV_LOOP(T)                                                                     \
  do {                                                                                   \
    T *X = x, *F = f, *Y = y;                                                            \
    for (int64_t b = 0; b < N; b++)                                                      \
      for (int64_t oh = 0; oh < OH; oh++)                                                \
        for (int64_t ow = 0; ow < OW; ow++)                                              \
          for (int64_t kh = 0; kh < KH; kh++) {                                          \
            int64_t ih = oh * sh + kh - ph;                                              \
            if (ih < 0 || ih >= H) continue;                                             \
            for (int64_t kw = 0; kw < KW; kw++) {                                        \
              int64_t iw = ow * sw + kw - pw;                                            \
              if (iw < 0 || iw >= W) continue;                                           \
              T *xr = X + ((b * H + ih) * W + iw) * C;                                   \
              T *yr = Y + ((b * OH + oh) * OW + ow) * O;                                 \
              T *fr = F + (kh * KW + kw) * C * O;                                        \
              for (int64_t c = 0; c < C; c++)                                            \
                for (int64_t o = 0; o < O; o++) {                                        \
                  if (mode == 0)                                                         \
                    yr[o] += xr[c] * fr[c * O + o];                                      \
                  else if (mode == 1)                                                    \
                    xr[c] += yr[o] * fr[c * O + o];                                      \
                  else                                                                   \
                    fr[c * O + o] += xr[c] * yr[o];                                      \
                }                                                                        \
            }                                                                            \
          }                                                                              \
  } while (0)

static int conv_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                        ps_status *st) {
  const ps_tensor *xt = in[0], *ft = in[1];
  const ps_tensor *yt = n->def == &op_conv ? NULL : in[2];
  if (xt->shape.rank != 4 || ft->shape.rank != 4 || xt->shape.dim[3] != ft->shape.dim[2])
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "input depth must be evenly divisible by filter depth: %lld vs "
                         "%lld",
                         (long long)(xt->shape.rank == 4 ? xt->shape.dim[3] : -1),
                         (long long)(ft->shape.rank == 4 ? ft->shape.dim[2] : -1));
  int64_t N = xt->shape.dim[0], H = xt->shape.dim[1], W = xt->shape.dim[2],
          C = xt->shape.dim[3];
  int64_t KH = ft->shape.dim[0], KW = ft->shape.dim[1], O = ft->shape.dim[3];
  int64_t sh = n->ia[0], sw = n->ia[1], ph, pw;
  bool same = n->ia[2] == 1;
  int64_t OH = out_size(H, KH, sh, same, &ph), OW = out_size(W, KW, sw, same, &pw);
  ps_shape ys = {4, {N, OH, OW, O}};
  if (yt && !ps_shape_equal(&yt->shape, &ys))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: out_backprop has the wrong shape",
                         n->def->type);
  int mode = n->def == &op_conv ? 0 : n->def == &op_conv_bin ? 1 : 2;
  const ps_shape *res = mode == 0 ? &ys : mode == 1 ? &xt->shape : &ft->shape;
  ps_tensor *r = ps_new_tensor_(xt->dtype, res, true, st);
  if (r == NULL) return st->code;
  void *x = mode == 1 ? ps_tensor_data(r) : ps_tensor_data(xt);
  void *f = mode == 2 ? ps_tensor_data(r) : ps_tensor_data(ft);
  void *y = mode == 0 ? ps_tensor_data(r) : ps_tensor_data(yt);
  if (xt->dtype == PS_DT_DOUBLE)
    CONV_LOOP(double);
  else
    CONV_LOOP(float);
  *out = r;
  return 0;
}

static int grad_conv(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  ps_node *in[3] = {n->in[0], n->in[1], dy};
  ps_node *a = ps_make_(g, &op_conv_bin, "Conv2DBackpropInput", in, 3, n->in[0]->dtype,
                        &n->in[0]->shape);
  ps_node *b = ps_make_(g, &op_conv_bfl, "Conv2DBackpropFilter", in, 3, n->in[1]->dtype,
                        &n->in[1]->shape);
  if (a == NULL || b == NULL)
    return ps_status_set(st, ps_graph_status(g)->code, "%s", ps_graph_status(g)->msg);
  for (int i = 0; i < 3; i++) {
    a->ia[i] = n->ia[i];
    b->ia[i] = n->ia[i];
  }
  dx[0] = a;
  dx[1] = b;
  return 0;
}

ps_node *ps_conv2d(ps_node *input, ps_node *filter, const int strides[4],
                   const char *padding, const char *name) {
  ps_node *in[2] = {input, filter};
  ps_graph *g = ps_check_inputs_("Conv2D", in, 2);
  if (g == NULL) return NULL;
  if (!ps_same_type_(g, "Conv2D", input, filter, "input", "filter") ||
      !ps_type_ok_(g, "Conv2D", "T", input->dtype, T_FLOATS_FD))
    return NULL;
  bool same = padding && !strcmp(padding, "SAME");
  if (!same && !(padding && !strcmp(padding, "VALID")))
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "Conv2D: padding must be \"SAME\" or \"VALID\", got \"%s\"",
                         padding ? padding : "(null)");
  if (strides == NULL || strides[0] != 1 || strides[3] != 1)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "Conv2D: Current implementation does not yet support strides in "
                         "the batch and depth dimensions.");
  if (strides[1] < 1 || strides[2] < 1)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "Conv2D: strides must be positive");
  const ps_shape *xs = &input->shape, *fs = &filter->shape;
  char b1[SHAPE_STR], b2[SHAPE_STR];
  if (xs->rank != 4 || fs->rank != 4 || !fully_known(fs) ||
      (xs->dim[3] >= 0 && xs->dim[3] != fs->dim[2]))
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "Conv2D: input %s (NHWC) and filter %s (HWIO, known) do not fit",
                         ps_shape_str_(xs, b1), ps_shape_str_(fs, b2));
  ps_shape ys = {4, {xs->dim[0], -1, -1, fs->dim[3]}};
  int64_t pad;
  if (xs->dim[1] >= 0)
    ys.dim[1] = out_size(xs->dim[1], fs->dim[0], strides[1], same, &pad);
  if (xs->dim[2] >= 0)
    ys.dim[2] = out_size(xs->dim[2], fs->dim[1], strides[2], same, &pad);
  ps_node *n = ps_make_(g, &op_conv, name ? name : "Conv2D", in, 2, input->dtype, &ys);
  if (n == NULL) return NULL;
  n->ia[0] = strides[1];
  n->ia[1] = strides[2];
  n->ia[2] = same;
  return n;
}

/* Every op of this file, for MetaGraph import (saver.c). */
const ps_op_def *const ps_opdefs_conv_[] = {&op_conv, &op_conv_bin, &op_conv_bfl, NULL};
