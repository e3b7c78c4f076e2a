/* Array ops: Reshape, ExpandDims, Identity (all sharing their input's
 * buffer), ConcatV2 and the slice of its gradient, GatherV2 and
 * UnsortedSegmentSum (the densifier of its sparse gradient), and
 * BroadcastTo. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "ops_internal.h"

/* ---- shape ops: Reshape, ExpandDims, Identity ---- */

/* Resolves a requested shape (one dim may be -1) against @ne elements. */
static int resolve_shape(const ps_shape *req, int64_t ne, ps_shape *out, ps_status *st) {
  *out = *req;
  int unknown = -1;
  int64_t prod = 1;
  for (int i = 0; i < req->rank; i++) {
    if (req->dim[i] == -1) {
      unknown = i;
    } else {
      if (req->dim[i] != 0 && prod > INT64_MAX / req->dim[i]) prod = -1;
      if (prod >= 0) prod *= req->dim[i];
    }
  }
  char b[SHAPE_STR];
  if (unknown < 0) {
    if (prod != ne)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Input to reshape is a tensor with %lld values, but the "
                           "requested shape has %lld",
                           (long long)ne, (long long)prod);
    return 0;
  }
  if (prod == 0) {
    if (ne != 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Input to reshape is a tensor with %lld values, but the "
                           "requested shape %s has 0",
                           (long long)ne, ps_shape_str_(req, b));
    return ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "Reshape cannot infer the missing input size for an empty tensor "
        "unless all specified input sizes are non-zero");
  }
  if (prod < 0 || ne % prod != 0)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "Input to reshape is a tensor with %lld values, but the requested "
        "shape requires a multiple of %lld",
        (long long)ne, (long long)prod);
  out->dim[unknown] = ne / prod;
  return 0;
}

static int reshape_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                           ps_status *st) {
  ps_shape s;
  if (n->nin > 1) { /* the shape of input 1 */
    s = in[1]->shape;
    if (ps_shape_num_elements(&s) != ps_tensor_num_elements(in[0]))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Input to reshape is a tensor with %lld values, but the "
                           "requested shape has %lld",
                           (long long)ps_tensor_num_elements(in[0]),
                           (long long)ps_shape_num_elements(&s));
  } else if (resolve_shape(n->extra, ps_tensor_num_elements(in[0]), &s, st)) {
    return st->code;
  }
  *out = ps_share_as_(in[0], &s, st);
  return *out ? 0 : st->code;
}

const ps_op_def ps_op_reshape_ = {"Reshape", PS_OPK_LOCAL, reshape_compute, NULL};

ps_node *ps_reshape(ps_node *x, const ps_shape *shape) {
  ps_graph *g = ps_check_inputs_("Reshape", &x, 1);
  if (g == NULL) return NULL;
  char b1[SHAPE_STR], b2[SHAPE_STR];
  if (shape == NULL || shape->rank < 0 || shape->rank > PS_MAX_RANK)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "Reshape: bad shape (rank %d)",
                         shape ? shape->rank : -1);
  int unknown = -1;
  for (int i = 0; i < shape->rank; i++) {
    if (shape->dim[i] == -1) {
      if (unknown >= 0)
        return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                             "Reshape: Only one input size may be -1, not both %d and %d",
                             unknown, i);
      unknown = i;
    } else if (shape->dim[i] < 0) {
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "Reshape: Size %d must be non-negative, not %lld", i,
                           (long long)shape->dim[i]);
    }
  }
  ps_shape s = *shape;
  int64_t ne = known_elements(&x->shape);
  if (ne >= 0) {
    ps_status st;
    if (resolve_shape(shape, ne, &s, &st)) {
      int64_t want = ps_shape_num_elements(shape);
      if (unknown < 0)
        return ps_graph_fail(
            g, PS_INVALID_ARGUMENT,
            "Reshape: Cannot reshape a tensor with %lld elements to shape "
            "%s (%lld elements)",
            (long long)ne, ps_shape_str_(shape, b1), (long long)want);
      return ps_graph_fail(g, st.code, "Reshape: %s (input shape %s, requested %s)",
                           st.msg, ps_shape_str_(&x->shape, b1),
                           ps_shape_format(shape, b2, sizeof b2));
    }
  }
  ps_shape *keep = malloc(sizeof *keep);
  if (keep == NULL) return ps_graph_fail(g, PS_RESOURCE_EXHAUSTED, "out of memory");
  *keep = *shape;
  ps_node *n = ps_make_(g, &ps_op_reshape_, "Reshape", &x, 1, x->dtype, &s);
  if (n == NULL) {
    free(keep);
    return NULL;
  }
  n->extra = keep;
  return n;
}

ps_node *ps_reshape_like_(ps_node *x, ps_node *ref) {
  ps_node *in[2] = {x, ref};
  ps_graph *g = ps_check_inputs_("Reshape", in, 2);
  if (g == NULL) return NULL;
  return ps_make_(g, &ps_op_reshape_, "Reshape", in, 2, x->dtype, &ref->shape);
}

static int expand_dims_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                               ps_status *st) {
  const ps_shape *s = &in[0]->shape;
  int64_t a = n->ia[0] < 0 ? n->ia[0] + s->rank + 1 : n->ia[0];
  if (a < 0 || a > s->rank || s->rank >= PS_MAX_RANK)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Tried to expand dim index %lld for tensor with %d dimensions.",
                         (long long)n->ia[0], s->rank);
  ps_shape o = {.rank = s->rank + 1};
  for (int i = 0, j = 0; i < o.rank; i++)
    o.dim[i] = i == a ? 1 : s->dim[j++];
  *out = ps_share_as_(in[0], &o, st);
  return *out ? 0 : st->code;
}

const ps_op_def ps_op_expand_dims_ = {"ExpandDims", PS_OPK_LOCAL, expand_dims_compute,
                                      NULL};

ps_node *ps_expand_dims_(ps_node *x, int axis) {
  ps_graph *g = ps_check_inputs_("ExpandDims", &x, 1);
  if (g == NULL) return NULL;
  ps_shape s = {.rank = -1};
  if (x->shape.rank >= 0 && x->shape.rank < PS_MAX_RANK) {
    int a = axis < 0 ? axis + x->shape.rank + 1 : axis;
    if (a < 0 || a > x->shape.rank)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "ExpandDims: Tried to expand dim index %d for tensor with %d "
                           "dimensions.",
                           axis, x->shape.rank);
    s.rank = x->shape.rank + 1;
    for (int i = 0, j = 0; i < s.rank; i++)
      s.dim[i] = i == a ? 1 : x->shape.dim[j++];
  }
  ps_node *n = ps_make_(g, &ps_op_expand_dims_, "ExpandDims", &x, 1, x->dtype, &s);
  if (n) n->ia[0] = axis;
  return n;
}

static int identity_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                            ps_status *st) {
  *out = ps_share_as_(in[0], &in[0]->shape, st);
  return *out ? 0 : st->code;
}

const ps_op_def ps_op_identity_ = {"Identity", PS_OPK_LOCAL, identity_compute, NULL};

ps_node *ps_identity_(ps_node *x) {
  ps_graph *g = ps_check_inputs_("Identity", &x, 1);
  if (g == NULL) return NULL;
  return ps_make_(g, &ps_op_identity_, "Identity", &x, 1, x->dtype, &x->shape);
}

/* ---- ConcatV2 ---- */

static int concat_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  int r = in[0]->shape.rank;
  char s1[SHAPE_STR], s2[SHAPE_STR];
  if (r == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "ConcatOp : Can't concatenate scalars (use tf.stack instead)");
  int axis = norm_axis(n->ia[0], r);
  if (axis < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "ConcatOp : Expected concatenating dimensions in the range [%d, "
                         "%d), but got %lld",
                         -r, r, (long long)n->ia[0]);
  ps_shape os = in[0]->shape;
  os.dim[axis] = 0;
  for (int i = 0; i < n->nin; i++) {
    const ps_shape *s = &in[i]->shape;
    if (s->rank != r)
      return ps_status_set(
          st, PS_INVALID_ARGUMENT,
          "ConcatOp : Ranks of all input tensors should match: shape[0] = "
          "%s vs. shape[%d] = %s",
          ps_shape_str_(&in[0]->shape, s1), i, ps_shape_str_(s, s2));
    for (int d = 0; d < r; d++)
      if (d != axis && s->dim[d] != os.dim[d])
        return ps_status_set(
            st, PS_INVALID_ARGUMENT,
            "ConcatOp : Dimensions of inputs should match: shape[0] = %s "
            "vs. shape[%d] = %s",
            ps_shape_str_(&in[0]->shape, s1), i, ps_shape_str_(s, s2));
    os.dim[axis] += s->dim[axis];
  }
  ps_tensor *o = ps_new_tensor_(n->dtype, &os, false, st);
  if (o == NULL) return st->code;
  size_t es = ps_dtype_size(n->dtype);
  int64_t outer = dims_product(&os, 0, axis), inner = dims_product(&os, axis + 1, r);
  char *dst = ps_tensor_data(o);
  for (int64_t ou = 0; ou < outer; ou++)
    for (int i = 0; i < n->nin; i++) {
      size_t chunk = (size_t)(in[i]->shape.dim[axis] * inner) * es;
      memcpy(dst, (const char *)ps_tensor_data(in[i]) + (size_t)ou * chunk, chunk);
      dst += chunk;
    }
  *out = o;
  return 0;
}

const ps_op_def ps_op_concat_ = {"ConcatV2", PS_OPK_LOCAL, concat_compute, NULL};

ps_node *ps_concat(ps_node *const *xs, size_t n, int axis) {
  if (xs == NULL || n == 0 || n > INT_MAX) return NULL; /* no graph to tell */
  int nx = (int)n;
  ps_graph *g = ps_check_inputs_("ConcatV2", xs, nx);
  if (g == NULL) return NULL;
  for (int i = 1; i < nx; i++)
    if (xs[i]->dtype != xs[0]->dtype)
      return ps_graph_fail(
          g, PS_INVALID_ARGUMENT,
          "ConcatV2: Tensors in list passed to 'values' of 'ConcatV2' Op "
          "have types [%s, %s] that don't all match.",
          ps_dtype_name(xs[0]->dtype), ps_dtype_name(xs[i]->dtype));
  if (ps_dtype_size(xs[0]->dtype) == 0)
    return ps_graph_fail(g, PS_UNIMPLEMENTED, "ConcatV2: no kernel for dtype %s",
                         ps_dtype_name(xs[0]->dtype));
  int r = -1, first = -1;
  for (int i = 0; i < nx && r < 0; i++)
    if (xs[i]->shape.rank >= 0) {
      r = xs[i]->shape.rank;
      first = i;
    }
  char s1[SHAPE_STR], s2[SHAPE_STR];
  ps_shape s = {.rank = -1};
  int64_t stored = axis;
  if (r >= 0) {
    if (r == 0)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "ConcatV2: ConcatOp : Can't concatenate scalars (use tf.stack "
                           "instead)");
    int a = norm_axis(axis, r);
    if (a < 0)
      return ps_graph_fail(
          g, PS_INVALID_ARGUMENT,
          "ConcatV2: ConcatOp : Expected concatenating dimensions in the "
          "range [%d, %d), but got %d",
          -r, r, axis);
    stored = a;
    s.rank = r;
    for (int d = 0; d < r; d++)
      s.dim[d] = d == a ? 0 : -1;
    for (int i = 0; i < nx; i++) {
      const ps_shape *xi = &xs[i]->shape;
      if (xi->rank < 0) {
        s.dim[a] = -1;
        continue;
      }
      if (xi->rank != r)
        return ps_graph_fail(
            g, PS_INVALID_ARGUMENT,
            "ConcatV2: ConcatOp : Ranks of all input tensors should match: "
            "shape[%d] = %s vs. shape[%d] = %s",
            first, ps_shape_str_(&xs[first]->shape, s1), i, ps_shape_str_(xi, s2));
      for (int d = 0; d < r; d++) {
        if (d == a) {
          s.dim[a] = s.dim[a] < 0 || xi->dim[a] < 0 ? -1 : s.dim[a] + xi->dim[a];
        } else if (xi->dim[d] >= 0) {
          if (s.dim[d] >= 0 && s.dim[d] != xi->dim[d])
            return ps_graph_fail(
                g, PS_INVALID_ARGUMENT,
                "ConcatV2: ConcatOp : Dimensions of inputs should match: "
                "shape[%d] = %s vs. shape[%d] = %s",
                first, ps_shape_str_(&xs[first]->shape, s1), i, ps_shape_str_(xi, s2));
          s.dim[d] = xi->dim[d];
        }
      }
    }
  }
  ps_node *nd = ps_make_(g, &ps_op_concat_, "concat", xs, nx, xs[0]->dtype, &s);
  if (nd) nd->ia[0] = stored;
  return nd;
}

/* Input 0: the gradient of a concat; inputs 1..: the concat's inputs.
 * Output: the slice that input ia[1] contributed along axis ia[0]. */
static int concat_slice_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                                ps_status *st) {
  const ps_tensor *dy = in[0];
  ps_tensor *const *xs = in + 1;
  int r = dy->shape.rank, part = (int)n->ia[1];
  int axis = norm_axis(n->ia[0], r);
  if (axis < 0 || part >= n->nin - 1)
    return ps_status_set(st, PS_INTERNAL, "bad concat slice (axis %lld, part %d)",
                         (long long)n->ia[0], part);
  int64_t off = 0;
  for (int j = 0; j < part; j++)
    off += xs[j]->shape.rank == r ? xs[j]->shape.dim[axis] : 0;
  int64_t len = xs[part]->shape.rank == r ? xs[part]->shape.dim[axis] : -1;
  if (len < 0 || off + len > dy->shape.dim[axis]) {
    char s1[SHAPE_STR], s2[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "gradient of shape %s does not hold input %d of shape %s",
                         ps_shape_str_(&dy->shape, s1), part,
                         ps_shape_str_(&xs[part]->shape, s2));
  }
  ps_shape os = dy->shape;
  os.dim[axis] = len;
  ps_tensor *o = ps_new_tensor_(dy->dtype, &os, false, st);
  if (o == NULL) return st->code;
  size_t es = ps_dtype_size(dy->dtype);
  int64_t outer = dims_product(&os, 0, axis), inner = dims_product(&os, axis + 1, r);
  size_t chunk = (size_t)(len * inner) * es,
         stride = (size_t)(dy->shape.dim[axis] * inner) * es;
  const char *src = (const char *)ps_tensor_data(dy) + (size_t)(off * inner) * es;
  char *dst = ps_tensor_data(o);
  for (int64_t ou = 0; ou < outer; ou++)
    memcpy(dst + (size_t)ou * chunk, src + (size_t)ou * stride, chunk);
  *out = o;
  return 0;
}

static const ps_op_def op_concat_slice = {"ConcatOffsetSlice", PS_OPK_LOCAL,
                                          concat_slice_compute, NULL};

ps_node *ps_concat_slice_(ps_node *dy, ps_node *const *xs, int n, int axis, int i) {
  ps_node **in = malloc((size_t)(n + 1) * sizeof *in);
  if (in == NULL)
    return dy ? ps_graph_fail(dy->g, PS_RESOURCE_EXHAUSTED, "out of memory") : NULL;
  in[0] = dy;
  memcpy(in + 1, xs, (size_t)n * sizeof *in);
  ps_node *nd = NULL;
  ps_graph *g = ps_check_inputs_("ConcatOffsetSlice", in, n + 1);
  if (g) nd = ps_make_(g, &op_concat_slice, "Slice", in, n + 1, dy->dtype, &xs[i]->shape);
  free(in);
  if (nd) {
    nd->ia[0] = axis;
    nd->ia[1] = i;
  }
  return nd;
}

/* ---- GatherV2 and its sparse gradient's densifier ---- */

/* "1,0": the position of flat element @i in @s. */
static const char *index_str(const ps_shape *s, int64_t i, char *buf) {
  int64_t idx[PS_MAX_RANK];
  for (int d = s->rank - 1; d >= 0; d--) {
    idx[d] = s->dim[d] > 0 ? i % s->dim[d] : 0;
    i = s->dim[d] > 0 ? i / s->dim[d] : 0;
  }
  size_t off = 0;
  buf[0] = '\0';
  for (int d = 0; d < s->rank && off < SHAPE_STR; d++)
    off += (size_t)snprintf(buf + off, SHAPE_STR - off, "%s%lld", d ? "," : "",
                            (long long)idx[d]);
  return buf;
}

static int gather_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  const ps_tensor *params = in[0], *indices = in[1];
  const ps_shape *ps = &params->shape, *is = &indices->shape;
  if (ps->rank < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "params must be at least 1 dimensional");
  if (is->rank + ps->rank - 1 > PS_MAX_RANK)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "result would have rank %d > %d",
                         is->rank + ps->rank - 1, PS_MAX_RANK);
  ps_shape os = *is;
  for (int d = 1; d < ps->rank; d++)
    os.dim[os.rank++] = ps->dim[d];
  int64_t rows = ps->dim[0], k = ps_tensor_num_elements(indices);
  size_t row = (size_t)dims_product(ps, 1, ps->rank) * ps_dtype_size(params->dtype);
  const void *ip = ps_tensor_data(indices);
  for (int64_t i = 0; i < k; i++) {
    int64_t v = ps_geti_(indices->dtype, ip, i);
    if (v < 0 || v >= rows) {
      char b[SHAPE_STR];
      if (is->rank == 0)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "indices = %lld is not in [0, %lld)", (long long)v,
                             (long long)rows);
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "indices[%s] = %lld is not in [0, %lld)", index_str(is, i, b),
                           (long long)v, (long long)rows);
    }
  }
  ps_tensor *o = ps_new_tensor_(params->dtype, &os, false, st);
  if (o == NULL) return st->code;
  const char *src = ps_tensor_data(params);
  char *dst = ps_tensor_data(o);
  for (int64_t i = 0; i < k; i++)
    memcpy(dst + (size_t)i * row, src + (size_t)ps_geti_(indices->dtype, ip, i) * row,
           row);
  *out = o;
  return 0;
}

const ps_op_def ps_op_gather_ = {"GatherV2", PS_OPK_LOCAL, gather_compute, NULL};

ps_node *ps_gather(ps_node *params, ps_node *indices) {
  ps_node *in[2] = {params, indices};
  ps_graph *g = ps_check_inputs_("GatherV2", in, 2);
  if (g == NULL) return NULL;
  if (!ps_type_ok_(g, "GatherV2", "Tindices", indices->dtype, T_INDEX)) return NULL;
  if (ps_dtype_size(params->dtype) == 0)
    return ps_graph_fail(g, PS_UNIMPLEMENTED, "GatherV2: no kernel for dtype %s",
                         ps_dtype_name(params->dtype));
  const ps_shape *ps = &params->shape, *is = &indices->shape;
  char s1[SHAPE_STR];
  if (ps->rank == 0)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "GatherV2: Shape must be at least rank 1 but is rank 0 (params "
                         "shape %s)",
                         ps_shape_str_(ps, s1));
  ps_shape s = {.rank = -1};
  if (ps->rank > 0 && is->rank >= 0) {
    if (is->rank + ps->rank - 1 > PS_MAX_RANK)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "GatherV2: result would have rank %d > %d",
                           is->rank + ps->rank - 1, PS_MAX_RANK);
    s = *is;
    for (int d = 1; d < ps->rank; d++)
      s.dim[s.rank++] = ps->dim[d];
  }
  return ps_make_(g, &ps_op_gather_, "GatherV2", in, 2, params->dtype, &s);
}

static int segment_sum_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                               ps_status *st) {
  const ps_tensor *rows = in[0], *ids = in[1];
  const ps_shape *rs = &rows->shape, *is = &ids->shape;
  char s1[SHAPE_STR], s2[SHAPE_STR];
  bool prefix = is->rank <= rs->rank;
  for (int d = 0; prefix && d < is->rank; d++)
    prefix = is->dim[d] == rs->dim[d];
  if (!prefix)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "data.shape = %s does not start with segment_ids.shape = %s",
                         ps_shape_str_(rs, s1), ps_shape_str_(is, s2));
  int64_t num = n->ia[0];
  if (num < 0) {
    const ps_shape *ref = &in[2]->shape;
    if (ref->rank < 1)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "dense shape %s has no rows",
                           ps_shape_str_(ref, s1));
    num = ref->dim[0];
  }
  ps_shape os = {.rank = 1 + rs->rank - is->rank, .dim = {num}};
  for (int d = is->rank; d < rs->rank; d++)
    os.dim[1 + d - is->rank] = rs->dim[d];
  ps_tensor *o = ps_new_tensor_(rows->dtype, &os, true, st);
  if (o == NULL) return st->code;
  int64_t k = ps_tensor_num_elements(ids), row = dims_product(rs, is->rank, rs->rank);
  const void *ip = ps_tensor_data(ids), *ra = ps_tensor_data(rows);
  void *oa = ps_tensor_data(o);
  ps_dtype dt = rows->dtype;
  for (int64_t i = 0; i < k; i++) {
    int64_t id = ps_geti_(ids->dtype, ip, i);
    if (id < 0) continue; /* dropped, as TensorFlow does */
    if (id >= num) {
      ps_tensor_destroy(o);
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "segment_ids[%s] = %lld is out of range [0, %lld)",
                           index_str(is, i, s1), (long long)id, (long long)num);
    }
    bool native = true;
#define PS_CASE_FLOAT(T, U)                                                              \
  do {                                                                                   \
    T *d = (T *)oa + id * row;                                                           \
    const T *s = (const T *)ra + i * row;                                                \
    for (int64_t j = 0; j < row; j++)                                                    \
      d[j] += s[j];                                                                      \
  } while (0)
    PS_DTYPE_SWITCH_FLOAT(dt, native = false)
#undef PS_CASE_FLOAT
    if (!native) {
      for (int64_t j = 0; j < row; j++)
        ps_elem_set(dt, oa, id * row + j,
                    ps_elem_get(dt, oa, id * row + j) + ps_elem_get(dt, ra, i * row + j));
    }
  }
  *out = o;
  return 0;
}

const ps_op_def ps_op_segment_sum_ = {"UnsortedSegmentSum", PS_OPK_LOCAL,
                                      segment_sum_compute, NULL};

ps_node *ps_unsorted_segment_sum_(ps_node *rows, ps_node *ids, int64_t num_segments,
                                  ps_node *ref) {
  ps_node *in[3] = {rows, ids, ref};
  int nin = num_segments < 0 ? 3 : 2;
  ps_graph *g = ps_check_inputs_("UnsortedSegmentSum", in, nin);
  if (g == NULL) return NULL;
  if (!ps_type_ok_(g, "UnsortedSegmentSum", "Tindices", ids->dtype, T_INDEX) ||
      !ps_type_ok_(g, "UnsortedSegmentSum", "T", rows->dtype, T_NUMERIC))
    return NULL;
  ps_shape s = {.rank = -1};
  if (rows->shape.rank >= 0 && ids->shape.rank >= 0 &&
      rows->shape.rank >= ids->shape.rank) {
    s.rank = 1 + rows->shape.rank - ids->shape.rank;
    s.dim[0] = num_segments >= 0            ? num_segments
               : ref && ref->shape.rank > 0 ? ref->shape.dim[0]
                                            : -1;
    for (int d = ids->shape.rank; d < rows->shape.rank; d++)
      s.dim[1 + d - ids->shape.rank] = rows->shape.dim[d];
  }
  ps_node *n =
      ps_make_(g, &ps_op_segment_sum_, "UnsortedSegmentSum", in, nin, rows->dtype, &s);
  if (n) n->ia[0] = num_segments;
  return n;
}

/* ---- BroadcastTo ---- */

static int broadcast_to_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                                ps_status *st) {
  const ps_tensor *x = in[0];
  const ps_shape *to = &in[1]->shape;
  ps_bc b;
  if (ps_bc_plan_(&b, &x->shape, to, st) || !ps_shape_equal(&b.out, to)) {
    char s1[SHAPE_STR], s2[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Unable to broadcast tensor of shape %s to tensor of shape %s",
                         ps_shape_str_(&x->shape, s1), ps_shape_str_(to, s2));
  }
  ps_tensor *o = ps_new_tensor_(x->dtype, to, false, st);
  if (o == NULL) return st->code;
  const void *xa = ps_tensor_data(x);
  void *oa = ps_tensor_data(o);
#define COPY(T)                                                                          \
  do {                                                                                   \
    const T *xp = xa;                                                                    \
    T *op = oa;                                                                          \
    BC_LOOP(&b, op[k] = xp[ia]);                                                         \
  } while (0)
  switch (ps_dtype_size(x->dtype)) {
  case 1:
    COPY(uint8_t);
    break;
  case 2:
    COPY(uint16_t);
    break;
  case 4:
    COPY(uint32_t);
    break;
  case 8:
    COPY(uint64_t);
    break;
  default:
    ps_tensor_destroy(o);
    return ps_unsupported_(x, st);
  }
#undef COPY
  *out = o;
  return 0;
}

const ps_op_def ps_op_broadcast_to_ = {"BroadcastTo", PS_OPK_LOCAL, broadcast_to_compute,
                                       NULL};

ps_node *ps_broadcast_to_(ps_node *x, ps_node *ref) {
  ps_node *in[2] = {x, ref};
  ps_graph *g = ps_check_inputs_("BroadcastTo", in, 2);
  if (g == NULL) return NULL;
  return ps_make_(g, &ps_op_broadcast_to_, "BroadcastTo", in, 2, x->dtype, &ref->shape);
}

/* Every op of this file, for MetaGraph import (train/metagraph_import.c). */
const ps_op_def *const ps_opdefs_array_[] = {
    &ps_op_reshape_,     &ps_op_expand_dims_,  &ps_op_identity_,
    &ps_op_concat_,      &op_concat_slice,     &ps_op_gather_,
    &ps_op_segment_sum_, &ps_op_broadcast_to_, NULL};
