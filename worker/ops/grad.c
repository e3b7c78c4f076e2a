/* Reverse-mode differentiation of worker graphs.
 *
 * ps_gradients() visits the nodes that lie between the xs and y in reverse
 * topological order (a node's id is larger than its inputs' ids: inputs
 * always exist before the node), sums the gradients that reached each
 * node's output, and asks the op's grad function for its inputs'
 * gradients.  The builders below only create ordinary nodes, under the
 * name scope "gradients/<node>_grad" as TensorFlow names them, so the
 * session runs the backward pass like any other computation and only the
 * parts a fetch needs.
 *
 * A gradient reaching a gather's params is sparse: the node's output holds
 * the gradient rows of the gathered indices, its sparse_indices the flat
 * indices and sparse_dense_shape the params' shape.  Two sparse gradients
 * of one tensor add up by concatenating rows and indices (a repeated index
 * is fine: a scatter-add sums the rows).  A sparse gradient becomes dense
 * (UnsortedSegmentSum) only when it meets a dense one or must flow through
 * an op's grad function, so the gradient of an embedding table read by
 * gathers never exists as a dense tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "ops_internal.h"

static int graph_code(ps_graph *g) {
  return ps_graph_status(g)->code;
}

/* The gradient @t of a broadcasting op's output @out, reduced to the shape
 * of its input @ref.  No node when the shapes are statically the same. */
static ps_node *unbroadcast(ps_node *t, ps_node *ref, ps_node *out) {
  if (t == NULL) return NULL;
  if (fully_known(&ref->shape) && ps_shape_equal(&ref->shape, &out->shape)) return t;
  return ps_sum_to_shape_(t, ref);
}

/* ---- gradients of each op ---- */

static int grad_add(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = unbroadcast(dy, n->in[0], n);
  dx[1] = unbroadcast(dy, n->in[1], n);
  return 0;
}

static int grad_sub(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = unbroadcast(dy, n->in[0], n);
  dx[1] = unbroadcast(ps_neg(dy), n->in[1], n);
  return 0;
}

static int grad_mul(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  ps_node *a = n->in[0], *b = n->in[1];
  dx[0] = unbroadcast(ps_mul(dy, b), a, n);
  dx[1] = unbroadcast(ps_mul(a, dy), b, n);
  return 0;
}

static int grad_div(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  ps_node *a = n->in[0], *b = n->in[1];
  dx[0] = unbroadcast(ps_div(dy, b), a, n);
  /* d(a/b)/db = -a / b^2 */
  dx[1] = unbroadcast(ps_mul(dy, ps_div(ps_div(ps_neg(a), b), b)), b, n);
  return 0;
}

static int grad_matmul(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                       ps_status *st) {
  ps_node *a = n->in[0], *b = n->in[1];
  bool ta = n->ia[0], tb = n->ia[1];
  if (!ta && !tb) { /* y = a b */
    dx[0] = ps_matmul(dy, b, false, true);
    dx[1] = ps_matmul(a, dy, true, false);
  } else if (!ta && tb) { /* y = a b' */
    dx[0] = ps_matmul(dy, b, false, false);
    dx[1] = ps_matmul(dy, a, true, false);
  } else if (ta && !tb) { /* y = a' b */
    dx[0] = ps_matmul(b, dy, false, true);
    dx[1] = ps_matmul(a, dy, false, false);
  } else { /* y = a' b' */
    dx[0] = ps_matmul(b, dy, true, true);
    dx[1] = ps_matmul(dy, a, true, true);
  }
  return 0;
}

static int grad_bias_add(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                         ps_status *st) {
  dx[0] = dy;
  dx[1] = ps_bias_add_grad_(dy);
  return 0;
}

static int grad_relu(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = ps_relu_grad_(dy, n);
  return 0;
}

static int grad_sigmoid(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                        ps_status *st) {
  dx[0] = ps_sigmoid_grad_(n, dy);
  return 0;
}

static int grad_tanh(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = ps_tanh_grad_(n, dy);
  return 0;
}

/* dx = (dy - sum(dy * y, -1)) * y */
static int grad_softmax(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                        ps_status *st) {
  ps_node *s = ps_reduce_sum(ps_mul(dy, n), -1, true);
  dx[0] = ps_mul(ps_sub(dy, s), n);
  return 0;
}

/* dx = dy - exp(y) * sum(dy, -1) */
static int grad_log_softmax(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                            ps_status *st) {
  dx[0] = ps_sub(dy, ps_mul(ps_exp_(n), ps_reduce_sum(dy, -1, true)));
  return 0;
}

/* inputs: logits, labels (no gradient) */
static int grad_xent(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = ps_xent_grad_(n->in[0], n->in[1], dy);
  dx[1] = NULL;
  return 0;
}

/* dy back to the reduced input's shape: the reduced axis reinserted, then
 * broadcast along it. */
static ps_node *unreduce(ps_node *n, ps_node *dy) {
  int64_t axis = n->ia[0];
  bool keep = n->ia[1];
  ps_node *t = dy;
  if (!keep && axis != PS_ALL_AXES) t = ps_expand_dims_(dy, (int)axis);
  return ps_broadcast_to_(t, n->in[0]);
}

static int grad_sum(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = unreduce(n, dy);
  return 0;
}

static int grad_mean(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = ps_div(unreduce(n, dy), ps_size_ratio_(n->in[0], dy));
  return 0;
}

/* Reshape (either form) and ExpandDims: back to the input's shape. */
static int grad_reshape(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                        ps_status *st) {
  dx[0] = ps_reshape_like_(dy, n->in[0]);
  if (n->nin > 1) dx[1] = NULL;
  return 0;
}

static int grad_concat(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                       ps_status *st) {
  for (int i = 0; i < n->nin; i++)
    dx[i] = ps_concat_slice_(dy, n->in, n->nin, (int)n->ia[0], i);
  return 0;
}

/* Sparse: the rows of dy for the gathered indices, flattened to
 * [num_indices] + params.shape[1:]. */
static int grad_gather(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                       ps_status *st) {
  ps_node *params = n->in[0], *indices = n->in[1], *rows, *idx;
  dx[1] = NULL;
  if (indices->shape.rank == 1) {
    rows = ps_identity_(dy);
    idx = indices;
  } else {
    /* rows: [-1] + params.shape[1:], from params' or dy's static shape */
    const ps_shape *ps = &params->shape, *ds = &dy->shape;
    int ir = indices->shape.rank;
    int pr =
        ps->rank >= 0 ? ps->rank : (ds->rank >= 0 && ir >= 0 ? ds->rank - ir + 1 : -1);
    ps_shape rs = {.rank = pr, .dim = {-1}};
    for (int d = 1; d < pr; d++) {
      int64_t v = ps->rank >= 0 ? ps->dim[d] : -1;
      if (v < 0 && ir >= 0 && ds->rank == ir + pr - 1) v = ds->dim[ir + d - 1];
      if (v < 0) pr = -1;
      rs.dim[d] = v;
    }
    if (pr < 1) {
      char b[64];
      return ps_status_set(
          st, PS_UNIMPLEMENTED,
          "%s: the gradient of a gather with indices of rank %d needs the "
          "static shape of params[1:] (params shape %s)",
          n->name, ir, ps_shape_format(ps, b, sizeof b));
    }
    ps_shape flat = {.rank = 1, .dim = {-1}};
    rows = ps_reshape(dy, &rs);
    idx = ps_reshape(indices, &flat);
  }
  if (rows == NULL || idx == NULL) return graph_code(g);
  rows->sparse_indices = idx;
  rows->sparse_dense_shape = params->shape;
  dx[0] = rows;
  return 0;
}

static int grad_cast(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  ps_dtype src = n->in[0]->dtype;
  dx[0] = ps_dtype_is_floating(src) && ps_dtype_is_floating(n->dtype) ? ps_cast(dy, src)
                                                                      : NULL;
  return 0;
}

static int grad_neg(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = ps_neg(dy);
  return 0;
}

static int grad_square(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                       ps_status *st) {
  dx[0] = ps_mul(dy, ps_mul(n->in[0], ps_scalar(g, n->dtype, 2.0)));
  return 0;
}

static int grad_exp(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  dx[0] = ps_mul(dy, n);
  return 0;
}

static int grad_identity(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                         ps_status *st) {
  dx[0] = dy;
  return 0;
}

static int grad_add_n(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st) {
  for (int i = 0; i < n->nin; i++)
    dx[i] = dy;
  return 0;
}

static int grad_broadcast_to(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                             ps_status *st) {
  dx[0] = ps_sum_to_shape_(dy, n->in[0]);
  dx[1] = NULL;
  return 0;
}

static int grad_sum_to_shape(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                             ps_status *st) {
  dx[0] = ps_broadcast_to_(dy, n->in[0]);
  dx[1] = NULL;
  return 0;
}

/* inputs: rows, segment ids (, ref) */
static int grad_segment_sum(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                            ps_status *st) {
  dx[0] = ps_gather(dy, n->in[1]);
  for (int i = 1; i < n->nin; i++)
    dx[i] = NULL;
  return 0;
}

/* ---- the builder of each op ---- */

/* The builders above by op, as TensorFlow's RegisterGradient: the op
 * tables of math.c, array.c, nn.c and reduce.c name no builder, so those
 * files do not use this one, which builds gradients out of their ops.  An
 * op whose definition names its builder (partition.c's) keeps it. */
static const struct {
  const ps_op_def *def;
  ps_grad_fn *fn;
} grad_table[] = {
    {&ps_op_reshape_, grad_reshape},
    {&ps_op_expand_dims_, grad_reshape},
    {&ps_op_identity_, grad_identity},
    {&ps_op_concat_, grad_concat},
    {&ps_op_gather_, grad_gather},
    {&ps_op_segment_sum_, grad_segment_sum},
    {&ps_op_broadcast_to_, grad_broadcast_to},
    {&ps_op_add_, grad_add},
    {&ps_op_sub_, grad_sub},
    {&ps_op_mul_, grad_mul},
    {&ps_op_div_, grad_div},
    {&ps_op_neg_, grad_neg},
    {&ps_op_square_, grad_square},
    {&ps_op_relu_, grad_relu},
    {&ps_op_sigmoid_, grad_sigmoid},
    {&ps_op_tanh_, grad_tanh},
    {&ps_op_exp_, grad_exp},
    {&ps_op_matmul_, grad_matmul},
    {&ps_op_cast_, grad_cast},
    {&ps_op_add_n_, grad_add_n},
    {&ps_op_bias_add_, grad_bias_add},
    {&ps_op_sum_to_shape_, grad_sum_to_shape},
    {&ps_op_softmax_, grad_softmax},
    {&ps_op_log_softmax_, grad_log_softmax},
    {&ps_op_xent_, grad_xent},
    {&ps_op_sum_, grad_sum},
    {&ps_op_mean_, grad_mean},
};

/* @def's gradient builder, or NULL: not differentiable. */
static ps_grad_fn *grad_of(const ps_op_def *def) {
  if (def->grad) return def->grad;
  for (size_t i = 0; i < sizeof grad_table / sizeof grad_table[0]; i++)
    if (grad_table[i].def == def) return grad_table[i].fn;
  return NULL;
}

/* ---- ps_gradients ---- */

typedef struct grads {
  ps_node **v;
  int n, cap;
} grads;

static int grads_push(grads *c, ps_node *x) {
  if (c->n == c->cap) {
    int cap = c->cap ? c->cap * 2 : 4;
    ps_node **v = realloc(c->v, (size_t)cap * sizeof *v);
    if (v == NULL) return -1;
    c->v = v;
    c->cap = cap;
  }
  c->v[c->n++] = x;
  return 0;
}

/* The dense form of the sparse gradient @sp of @target. */
static ps_node *densify(ps_node *sp, ps_node *target) {
  const ps_shape *ds = &sp->sparse_dense_shape;
  int64_t rows = ds->rank > 0 ? ds->dim[0] : -1;
  return ps_unsorted_segment_sum_(sp, sp->sparse_indices, rows, rows < 0 ? target : NULL);
}

/* The sum of the gradients @c of node @target: sparse if they all are. */
static ps_node *aggregate(ps_graph *g, ps_node *target, grads *c) {
  int nsparse = 0;
  for (int i = 0; i < c->n; i++)
    nsparse += c->v[i]->sparse_indices != NULL;
  if (c->n == 1) return c->v[0];
  ps_node **tmp = calloc((size_t)(unsigned)c->n * 2, sizeof *tmp);
  if (tmp == NULL) return ps_graph_fail(g, PS_RESOURCE_EXHAUSTED, "out of memory");
  ps_node *out = NULL;
  if (nsparse == c->n) {
    ps_node **rows = tmp, **idx = tmp + c->n;
    bool i64 = false;
    for (int i = 0; i < c->n; i++)
      i64 |= c->v[i]->sparse_indices->dtype == PS_DT_INT64;
    for (int i = 0; i < c->n; i++) {
      rows[i] = c->v[i];
      idx[i] = c->v[i]->sparse_indices;
      if (i64 && idx[i]->dtype != PS_DT_INT64) idx[i] = ps_cast(idx[i], PS_DT_INT64);
    }
    ps_node *r = ps_concat(rows, (size_t)c->n, 0);
    ps_node *ix = ps_concat(idx, (size_t)c->n, 0);
    if (r && ix) {
      r->sparse_indices = ix;
      r->sparse_dense_shape = c->v[0]->sparse_dense_shape;
      out = r;
    }
  } else {
    for (int i = 0; i < c->n; i++)
      tmp[i] = c->v[i]->sparse_indices ? densify(c->v[i], target) : c->v[i];
    out = ps_add_n_(tmp, c->n);
  }
  free(tmp);
  return out;
}

enum { REACHES_Y = 1, FROM_X = 2, IS_X = 4 };

/* The arguments of ps_gradients, checked. */
static int check_gradient_args(ps_graph *g, ps_node *y, ps_node *const *xs, size_t n,
                               ps_status *st) {
  if (y->g != g)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "gradients: %s is not in this graph",
                         y->name);
  if (!ps_dtype_is_floating(y->dtype))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "gradients: %s has dtype %s; only floating point tensors have "
                         "gradients",
                         y->name, ps_dtype_name(y->dtype));
  for (size_t i = 0; i < n; i++)
    if (xs[i] == NULL || xs[i]->g != g)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "gradients: xs[%zu] is %s", i,
                           xs[i] ? "not in this graph" : "NULL");
  return 0;
}

/* Marks in fl[0..nn) the nodes that reach @y and those that depend on an x
 * (nodes are in topological order: an input's id is below its user's). */
static void mark_paths(ps_graph *g, ps_node *y, ps_node *const *xs, size_t n,
                       unsigned char *fl, size_t nn) {
  for (size_t i = 0; i < n; i++)
    if ((size_t)xs[i]->id < nn) fl[xs[i]->id] |= IS_X | FROM_X;
  fl[y->id] |= REACHES_Y;
  for (size_t id = nn; id-- > 0;) {
    ps_node *nd = ps_graph_node(g, id);
    if (!(fl[id] & REACHES_Y)) continue;
    for (int i = 0; i < nd->nin; i++)
      fl[nd->in[i]->id] |= REACHES_Y;
  }
  for (size_t id = 0; id < nn; id++) {
    ps_node *nd = ps_graph_node(g, id);
    for (int i = 0; i < nd->nin && !(fl[id] & FROM_X); i++)
      if (fl[nd->in[i]->id] & FROM_X) fl[id] |= FROM_X;
  }
}

/* Runs @nd's gradient builder with its output's gradient @dy and adds what
 * it gives each input (that depends on an x) to that input's list. */
static int backprop_node(ps_graph *g, ps_node *nd, ps_node *dy, const unsigned char *fl,
                         grads *c, ps_graph_mark m, ps_status *st) {
  if (dy->sparse_indices) dy = densify(dy, nd);
  ps_node **dx = calloc((size_t)nd->nin, sizeof *dx);
  if (dx == NULL || dy == NULL) {
    free(dx);
    return dy ? ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory") : -1;
  }
  char scope[1100];
  snprintf(scope, sizeof scope, "%s_grad", nd->name);
  int rc = ps_name_scope_push(g, scope, st);
  if (rc == 0) {
    rc = grad_of(nd->def)(g, nd, dy, dx, st);
    ps_name_scope_pop(g);
  }
  for (int i = 0; rc == 0 && i < nd->nin; i++) {
    ps_node *in = nd->in[i];
    if (dx[i] == NULL || !(fl[in->id] & FROM_X) || !ps_dtype_is_floating(in->dtype))
      continue;
    if (dx[i]->dtype != in->dtype)
      rc = ps_status_set(
          st, PS_INTERNAL, "gradients: the gradient of %s input %d has dtype %s, not %s",
          nd->name, i, ps_dtype_name(dx[i]->dtype), ps_dtype_name(in->dtype));
    else if (grads_push(&c[in->id], dx[i]))
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  free(dx);
  if (rc == 0 && ps_graph_failed_since_(g, m)) rc = -1;
  return rc;
}

/* Back from @y: each node on a path from an x gets the sum of its
 * gradients, which its builder passes on to its inputs. */
static int backprop(ps_graph *g, ps_node *y, ps_node *const *xs, size_t n, ps_node **dxs,
                    const unsigned char *fl, grads *c, ps_graph_mark m, ps_status *st) {
  int rc = 0;
  if (fl[y->id] & FROM_X) {
    ps_node *seed = y->shape.rank == 0 ? ps_scalar(g, y->dtype, 1.0) : ps_ones_like_(y);
    if (seed == NULL || grads_push(&c[y->id], seed)) rc = -1;
  }
  for (size_t id = (size_t)y->id + 1; rc == 0 && id-- > 0;) {
    if ((fl[id] & (REACHES_Y | FROM_X)) != (REACHES_Y | FROM_X) || c[id].n == 0) continue;
    ps_node *nd = ps_graph_node(g, id);
    ps_node *dy = aggregate(g, nd, &c[id]);
    if (dy == NULL) return -1;
    if (fl[id] & IS_X)
      for (size_t k = 0; k < n; k++)
        if (xs[k] == nd) dxs[k] = dy;
    if (grad_of(nd->def) == NULL) continue; /* not differentiable: the gradient stops */
    bool wanted = false;
    for (int i = 0; i < nd->nin; i++)
      wanted |= (fl[nd->in[i]->id] & FROM_X) && ps_dtype_is_floating(nd->in[i]->dtype);
    if (wanted) rc = backprop_node(g, nd, dy, fl, c, m, st);
  }
  return rc;
}

int ps_gradients(ps_graph *g, ps_node *y, ps_node *const *xs, size_t n, ps_node **dxs,
                 ps_status *st) {
  ps_status local;
  if (st == NULL) st = &local;
  ps_status_clear(st);
  if (g == NULL || y == NULL || (n > 0 && (xs == NULL || dxs == NULL)))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "gradients: missing argument");
  for (size_t i = 0; i < n; i++)
    dxs[i] = NULL;
  int rc = check_gradient_args(g, y, xs, n, st);
  if (rc != 0) return rc;
  size_t nn = (size_t)y->id + 1; /* only nodes up to y matter */
  unsigned char *fl = calloc(nn, 1);
  grads *c = calloc(nn, sizeof *c);
  if (fl == NULL || c == NULL) {
    free(fl);
    free(c);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  mark_paths(g, y, xs, n, fl, nn);
  ps_graph_mark m = ps_graph_mark_(g);
  rc = ps_name_scope_push(g, "gradients", st);
  if (rc == 0) {
    rc = backprop(g, y, xs, n, dxs, fl, c, m, st);
    ps_name_scope_pop(g);
  }
  if (st->code == PS_OK && (rc != 0 || ps_graph_failed_since_(g, m))) {
    const ps_status *gs = ps_graph_status(g);
    rc = ps_status_set(st, gs->code != PS_OK ? gs->code : PS_INTERNAL, "gradients: %s",
                       gs->code != PS_OK ? gs->msg : "failed");
  }
  if (st->code != PS_OK) { /* adds nothing */
    rc = st->code;
    for (size_t i = 0; i < n; i++)
      dxs[i] = NULL;
    ps_graph_rollback_(g, m);
  }
  for (size_t i = 0; i < nn; i++)
    free(c[i].v);
  free(c);
  free(fl);
  return rc;
}
