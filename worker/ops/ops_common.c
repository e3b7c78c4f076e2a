/* What the op families (math.c, nn.c, reduce.c, array.c) share: static
 * shapes and TensorFlow's messages about them, dtype checks, node
 * construction, kernel helpers (tensors, integer element access) and the
 * broadcast plan of elementwise binary ops.
 *
 * Constructors check dtypes and whatever shapes they can know (rank -1 and
 * dims of -1 are unknown, as the batch dimension of a placeholder) and fail
 * through ps_graph_fail() with TensorFlow's wording, prefixed with the op
 * type.  Kernels check again at run time, since a feed may give an unknown
 * dim any size.  Kernels run in the native type for float and double (and
 * for integers where TensorFlow does; integers wrap, PS_WRAP_*); half and
 * bfloat16 go through double.  Per-dtype code comes from PS_DTYPE_LIST
 * through PS_DTYPE_SWITCH_FLOAT/NATIVE (common/tensor.h).
 *
 * Elementwise binary ops broadcast as numpy does.  The broadcast is planned
 * once per call (dims of size 1 dropped, dims contiguous in both inputs
 * merged), so the usual cases (same shapes, a row of biases, a scalar)
 * run as one or two flat loops (BC_LOOP, ops_internal.h).  Ops that only
 * change the shape (Reshape, ExpandDims, Identity, a Cast to the same
 * type) share their input's buffer: a computed tensor is never modified. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "ops_internal.h"

/* ---- shapes, dtypes and messages ---- */

/* "[2,?]", "<unknown>" for an unknown rank (TensorFlow's static shapes) */
const char *ps_shape_str_(const ps_shape *s, char *buf) {
  if (s->rank < 0) {
    snprintf(buf, SHAPE_STR, "<unknown>");
    return buf;
  }
  size_t off = (size_t)snprintf(buf, SHAPE_STR, "[");
  for (int i = 0; i < s->rank && off < SHAPE_STR; i++) {
    if (s->dim[i] < 0)
      off += (size_t)snprintf(buf + off, SHAPE_STR - off, "%s?", i ? "," : "");
    else
      off += (size_t)snprintf(buf + off, SHAPE_STR - off, "%s%lld", i ? "," : "",
                              (long long)s->dim[i]);
  }
  if (off < SHAPE_STR) snprintf(buf + off, SHAPE_STR - off, "]");
  return buf;
}

/* TensorFlow's "Value for attr 'T' of int32 is not in the list of allowed
 * values: float, double". */
bool ps_type_ok_(ps_graph *g, const char *op, const char *attr, ps_dtype dt,
                 uint32_t mask) {
  if (in_mask(dt, mask)) return true;
  static const ps_dtype order[] = {
      PS_DT_HALF,   PS_DT_BFLOAT16, PS_DT_FLOAT, PS_DT_DOUBLE, PS_DT_INT8,
      PS_DT_INT16,  PS_DT_INT32,    PS_DT_INT64, PS_DT_UINT8,  PS_DT_UINT16,
      PS_DT_UINT32, PS_DT_UINT64,   PS_DT_BOOL};
  char list[256];
  size_t off = 0;
  list[0] = '\0';
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
    if (in_mask(order[i], mask) && off < sizeof list)
      off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", off ? ", " : "",
                              ps_dtype_name(order[i]));
  ps_graph_fail(g, PS_INVALID_ARGUMENT,
                "%s: Value for attr '%s' of %s is not in the list of allowed values: %s",
                op, attr, ps_dtype_name(dt), list);
  return false;
}

bool ps_same_type_(ps_graph *g, const char *op, const ps_node *a, const ps_node *b,
                   const char *aname, const char *bname) {
  if (a->dtype == b->dtype) return true;
  ps_graph_fail(g, PS_INVALID_ARGUMENT,
                "Input '%s' of '%s' Op has type %s that does not match type %s of "
                "argument '%s'.",
                bname, op, ps_dtype_name(b->dtype), ps_dtype_name(a->dtype), aname);
  return false;
}

/* The graph of the inputs.  A missing input (a constructor that failed
 * before) fails the graph as ps_node_new() does; so do inputs from
 * another graph.  NULL then. */
ps_graph *ps_check_inputs_(const char *op, ps_node *const *in, int n) {
  ps_graph *g = NULL;
  int first = -1;
  for (int i = 0; i < n && g == NULL; i++)
    if (in[i]) {
      g = in[i]->g;
      first = i;
    }
  if (g == NULL) return NULL;
  for (int i = 0; i < n; i++) {
    if (in[i] == NULL) { /* keeps the error that made it NULL (graph.h) */
      if (ps_graph_status(g)->code == PS_OK)
        ps_graph_fail(g, PS_INVALID_ARGUMENT, "%s: input %d is missing", op, i);
      return NULL;
    }
    if (in[i]->g != g) {
      ps_graph_fail(g, PS_INVALID_ARGUMENT,
                    "%s: Tensor %s must be from the same graph as Tensor %s.", op,
                    in[i]->name, in[first]->name);
      return NULL;
    }
  }
  return g;
}

ps_node *ps_make_(ps_graph *g, const ps_op_def *def, const char *hint, ps_node *const *in,
                  int nin, ps_dtype dtype, const ps_shape *shape) {
  ps_node *n = ps_node_new(g, def, hint, in, nin);
  if (n == NULL) return NULL;
  n->dtype = dtype;
  n->shape = *shape;
  return n;
}

/* Numpy broadcasting of static shapes (unknown dims stay unknown unless
 * the other side says more).  False if they can never broadcast. */
bool ps_broadcast_static_(const ps_shape *a, const ps_shape *b, ps_shape *out) {
  if (a->rank < 0 || b->rank < 0) {
    out->rank = -1;
    return true;
  }
  int r = a->rank > b->rank ? a->rank : b->rank;
  out->rank = r;
  for (int i = 0; i < r; i++) {
    int ai = i - (r - a->rank), bi = i - (r - b->rank);
    int64_t da = ai >= 0 ? a->dim[ai] : 1, db = bi >= 0 ? b->dim[bi] : 1;
    if (da == 1)
      out->dim[i] = db;
    else if (db == 1)
      out->dim[i] = da;
    else if (da < 0)
      out->dim[i] = db; /* unknown vs d > 1: it must be d (or 1) */
    else if (db < 0)
      out->dim[i] = da;
    else if (da == db)
      out->dim[i] = da;
    else
      return false;
  }
  return true;
}

/* ---- kernel helpers ---- */

ps_tensor *ps_new_tensor_(ps_dtype dt, const ps_shape *s, bool zero, ps_status *st) {
  ps_tensor *t = ps_tensor_create(dt, s, zero);
  if (t == NULL) {
    char b[SHAPE_STR];
    ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                  "OOM when allocating tensor with shape%s and type %s",
                  ps_shape_str_(s, b), ps_dtype_name(dt));
  }
  return t;
}

/* A tensor with @t's bytes and shape @s (no copy). */
ps_tensor *ps_share_as_(const ps_tensor *t, const ps_shape *s, ps_status *st) {
  ps_tensor *o = calloc(1, sizeof *o);
  if (o == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  o->dtype = t->dtype;
  o->shape = *s;
  o->buf = ps_buf_ref(t->buf);
  return o;
}

int64_t ps_geti_(ps_dtype dt, const void *p, int64_t i) {
  if (dt == PS_DT_BOOL) return ((const uint8_t *)p)[i] != 0;
#define PS_CASE_FLOAT(T, U) return 0
#define PS_CASE_INT(T, U) return (int64_t)((const T *)p)[i]
  PS_DTYPE_SWITCH_NATIVE(dt, return 0)
#undef PS_CASE_FLOAT
#undef PS_CASE_INT
  return 0;
}

/* Stores @v wrapped to the type's width, as a C cast does. */
void ps_seti_(ps_dtype dt, void *p, int64_t i, int64_t v) {
  if (dt == PS_DT_BOOL) {
    ((uint8_t *)p)[i] = v != 0;
    return;
  }
#define PS_CASE_FLOAT(T, U) (void)0
#define PS_CASE_INT(T, U) ((T *)p)[i] = (T)(U)v
  PS_DTYPE_SWITCH_NATIVE(dt, (void)0)
#undef PS_CASE_FLOAT
#undef PS_CASE_INT
}

int ps_unsupported_(const ps_tensor *t, ps_status *st) {
  return ps_status_set(st, PS_UNIMPLEMENTED, "no kernel for dtype %s",
                       ps_dtype_name(t->dtype));
}

/* ---- broadcasting ---- */

int ps_bc_plan_(ps_bc *b, const ps_shape *x, const ps_shape *y, ps_status *st) {
  int r = x->rank > y->rank ? x->rank : y->rank;
  int64_t d[PS_MAX_RANK], sx[PS_MAX_RANK], sy[PS_MAX_RANK];
  b->out.rank = r;
  for (int i = 0; i < r; i++) {
    int xi = i - (r - x->rank), yi = i - (r - y->rank);
    int64_t dx = xi >= 0 ? x->dim[xi] : 1, dy = yi >= 0 ? y->dim[yi] : 1;
    if (dx != dy && dx != 1 && dy != 1) {
      char a[SHAPE_STR], c[SHAPE_STR];
      return ps_status_set(st, PS_INVALID_ARGUMENT, "Incompatible shapes: %s vs. %s",
                           ps_shape_str_(x, a), ps_shape_str_(y, c));
    }
    d[i] = dx == 1 ? dy : dx;
    b->out.dim[i] = d[i];
  }
  int64_t px = 1, py = 1;
  for (int i = r - 1; i >= 0; i--) {
    int xi = i - (r - x->rank), yi = i - (r - y->rank);
    int64_t dx = xi >= 0 ? x->dim[xi] : 1, dy = yi >= 0 ? y->dim[yi] : 1;
    sx[i] = dx == 1 ? 0 : px;
    sy[i] = dy == 1 ? 0 : py;
    px *= dx;
    py *= dy;
  }
  b->n = 1;
  b->rank = 0;
  for (int i = 0; i < r; i++) {
    b->n *= d[i];
    if (d[i] == 1) continue;
    int k = b->rank;
    if (k > 0 && b->sa[k - 1] == sx[i] * d[i] && b->sb[k - 1] == sy[i] * d[i]) {
      b->dim[k - 1] *= d[i];
      b->sa[k - 1] = sx[i];
      b->sb[k - 1] = sy[i];
      continue;
    }
    b->dim[k] = d[i];
    b->sa[k] = sx[i];
    b->sb[k] = sy[i];
    b->rank++;
  }
  if (b->rank == 0) {
    b->rank = 1;
    b->dim[0] = 1;
    b->sa[0] = b->sb[0] = 0;
  }
  return 0;
}
