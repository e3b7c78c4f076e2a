/* Math ops on the worker: op definitions, constructors with static shape
 * inference, and CPU kernels.
 *
 * Constructors check dtypes and whatever shapes they can know (rank -1 and
 * dims of -1 are unknown, as the batch dimension of a placeholder) and fail
 * through ps_graph_fail() with TensorFlow's wording, prefixed with the op
 * type.  Kernels check again at run time, since a feed may give an unknown
 * dim any size.  Kernels run in the native type for float and double (and
 * for integers where TensorFlow does); half and bfloat16 go through double.
 * Matrix products are OpenBLAS gemm calls.
 *
 * Elementwise binary ops broadcast as numpy does.  The broadcast is planned
 * once per call (dims of size 1 dropped, dims contiguous in both inputs
 * merged), so the usual cases (same shapes, a row of biases, a scalar)
 * run as one or two flat loops.  Ops that only change the shape (Reshape,
 * ExpandDims, Identity, a Cast to the same type) share their input's
 * buffer: a computed tensor is never modified.
 *
 * The helper ops at the end (SumToShape, BroadcastTo, ConcatOffsetSlice,
 * UnsortedSegmentSum...) exist for gradients; see ops_internal.h. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "ops_internal.h"

/* ---- shapes, dtypes and messages ---- */

#define SHAPE_STR 400

/* "[2,?]", "<unknown>" for an unknown rank (TensorFlow's static shapes) */
static const char *shape_str(const ps_shape *s, char *buf) {
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

static bool fully_known(const ps_shape *s) {
  if (s->rank < 0) return false;
  for (int i = 0; i < s->rank; i++)
    if (s->dim[i] < 0) return false;
  return true;
}

/* Elements of a shape known statically, else -1. */
static int64_t known_elements(const ps_shape *s) {
  return fully_known(s) ? ps_shape_num_elements(s) : -1;
}

#define M(dt) (1u << (dt))
#define T_FLOATS_FD (M(PS_DT_FLOAT) | M(PS_DT_DOUBLE))
#define T_FLOATS (T_FLOATS_FD | M(PS_DT_HALF) | M(PS_DT_BFLOAT16))
#define T_INTS                                                                           \
  (M(PS_DT_INT8) | M(PS_DT_INT16) | M(PS_DT_INT32) | M(PS_DT_INT64) | M(PS_DT_UINT8) |   \
   M(PS_DT_UINT16) | M(PS_DT_UINT32) | M(PS_DT_UINT64))
#define T_INDEX (M(PS_DT_INT32) | M(PS_DT_INT64))
#define T_NUMERIC (T_FLOATS | T_INTS)
#define T_ALL (T_NUMERIC | M(PS_DT_BOOL))

static bool in_mask(ps_dtype dt, uint32_t mask) {
  return (int)dt > 0 && (int)dt < 32 && ((mask >> dt) & 1);
}

static bool is_int(ps_dtype dt) {
  return in_mask(dt, T_INTS);
}

/* TensorFlow's "Value for attr 'T' of int32 is not in the list of allowed
 * values: float, double". */
static bool type_ok(ps_graph *g, const char *op, const char *attr, ps_dtype dt,
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

static bool same_type(ps_graph *g, const char *op, const ps_node *a, const ps_node *b,
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
static ps_graph *check_inputs(const char *op, ps_node *const *in, int n) {
  ps_graph *g = NULL;
  int first = -1;
  for (int i = 0; i < n && g == NULL; i++)
    if (in[i]) {
      g = in[i]->g;
      first = i;
    }
  if (g == NULL) return NULL;
  for (int i = 0; i < n; i++) {
    if (in[i] == NULL) {
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

static ps_node *make(ps_graph *g, const ps_op_def *def, const char *hint,
                     ps_node *const *in, int nin, ps_dtype dtype, const ps_shape *shape) {
  ps_node *n = ps_node_new(g, def, hint, in, nin);
  if (n == NULL) return NULL;
  n->dtype = dtype;
  n->shape = *shape;
  return n;
}

/* Numpy broadcasting of static shapes (unknown dims stay unknown unless
 * the other side says more).  False if they can never broadcast. */
static bool broadcast_static(const ps_shape *a, const ps_shape *b, ps_shape *out) {
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

static ps_tensor *new_tensor(ps_dtype dt, const ps_shape *s, bool zero, ps_status *st) {
  ps_tensor *t = ps_tensor_create(dt, s, zero);
  if (t == NULL) {
    char b[SHAPE_STR];
    ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                  "OOM when allocating tensor with shape%s and type %s", shape_str(s, b),
                  ps_dtype_name(dt));
  }
  return t;
}

/* A tensor with @t's bytes and shape @s (no copy). */
static ps_tensor *share_as(const ps_tensor *t, const ps_shape *s, ps_status *st) {
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

static int64_t geti(ps_dtype dt, const void *p, int64_t i) {
  switch (dt) {
  case PS_DT_INT8:
    return ((const int8_t *)p)[i];
  case PS_DT_INT16:
    return ((const int16_t *)p)[i];
  case PS_DT_INT32:
    return ((const int32_t *)p)[i];
  case PS_DT_INT64:
    return ((const int64_t *)p)[i];
  case PS_DT_UINT8:
    return ((const uint8_t *)p)[i];
  case PS_DT_UINT16:
    return ((const uint16_t *)p)[i];
  case PS_DT_UINT32:
    return ((const uint32_t *)p)[i];
  case PS_DT_UINT64:
    return (int64_t)((const uint64_t *)p)[i];
  case PS_DT_BOOL:
    return ((const uint8_t *)p)[i] != 0;
  default:
    return 0;
  }
}

/* Stores @v wrapped to the type's width, as a C cast does. */
static void seti(ps_dtype dt, void *p, int64_t i, int64_t v) {
  switch (dt) {
  case PS_DT_INT8:
    ((int8_t *)p)[i] = (int8_t)v;
    break;
  case PS_DT_INT16:
    ((int16_t *)p)[i] = (int16_t)v;
    break;
  case PS_DT_INT32:
    ((int32_t *)p)[i] = (int32_t)v;
    break;
  case PS_DT_INT64:
    ((int64_t *)p)[i] = v;
    break;
  case PS_DT_UINT8:
    ((uint8_t *)p)[i] = (uint8_t)v;
    break;
  case PS_DT_UINT16:
    ((uint16_t *)p)[i] = (uint16_t)v;
    break;
  case PS_DT_UINT32:
    ((uint32_t *)p)[i] = (uint32_t)v;
    break;
  case PS_DT_UINT64:
    ((uint64_t *)p)[i] = (uint64_t)v;
    break;
  case PS_DT_BOOL:
    ((uint8_t *)p)[i] = v != 0;
    break;
  default:
    break;
  }
}

static int unsupported(const ps_tensor *t, ps_status *st) {
  return ps_status_set(st, PS_UNIMPLEMENTED, "no kernel for dtype %s",
                       ps_dtype_name(t->dtype));
}

/* Product of dims [from, to). */
static int64_t dims_product(const ps_shape *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++)
    p *= s->dim[i];
  return p;
}

/* ---- broadcasting ---- */

typedef struct bc {
  int rank; /* >= 1 after simplification */
  int64_t dim[PS_MAX_RANK];
  int64_t sa[PS_MAX_RANK], sb[PS_MAX_RANK]; /* element strides, 0 = broadcast */
  int64_t n;                                /* output elements */
  ps_shape out;                             /* output shape as numpy gives it */
} bc;

static int bc_plan(bc *b, const ps_shape *x, const ps_shape *y, ps_status *st) {
  int r = x->rank > y->rank ? x->rank : y->rank;
  int64_t d[PS_MAX_RANK], sx[PS_MAX_RANK], sy[PS_MAX_RANK];
  b->out.rank = r;
  for (int i = 0; i < r; i++) {
    int xi = i - (r - x->rank), yi = i - (r - y->rank);
    int64_t dx = xi >= 0 ? x->dim[xi] : 1, dy = yi >= 0 ? y->dim[yi] : 1;
    if (dx != dy && dx != 1 && dy != 1) {
      char a[SHAPE_STR], c[SHAPE_STR];
      return ps_status_set(st, PS_INVALID_ARGUMENT, "Incompatible shapes: %s vs. %s",
                           shape_str(x, a), shape_str(y, c));
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
    const bc *b_ = (plan);                                                               \
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

typedef enum binop {
  B_ADD,
  B_SUB,
  B_MUL,
  B_DIV,
  B_RELU_GRAD,    /* (dy, y) */
  B_SIGMOID_GRAD, /* (y, dy) */
  B_TANH_GRAD,    /* (y, dy) */
} binop;

static double bin_d(binop op, double x, double y) {
  switch (op) {
  case B_ADD:
    return x + y;
  case B_SUB:
    return x - y;
  case B_MUL:
    return x * y;
  case B_DIV:
    return x / y;
  case B_RELU_GRAD:
    return y > 0 ? x : 0;
  case B_SIGMOID_GRAD:
    return y * x * (1 - x);
  case B_TANH_GRAD:
    return y * (1 - x * x);
  }
  return 0;
}

#define BIN_FLOAT(T)                                                                     \
  do {                                                                                   \
    const T *x = xa, *y = ya;                                                            \
    T *o = oa;                                                                           \
    switch (op) {                                                                        \
    case B_ADD:                                                                          \
      BC_LOOP(b, o[k] = x[ia] + y[ib]);                                                  \
      break;                                                                             \
    case B_SUB:                                                                          \
      BC_LOOP(b, o[k] = x[ia] - y[ib]);                                                  \
      break;                                                                             \
    case B_MUL:                                                                          \
      BC_LOOP(b, o[k] = x[ia] * y[ib]);                                                  \
      break;                                                                             \
    case B_DIV:                                                                          \
      BC_LOOP(b, o[k] = x[ia] / y[ib]);                                                  \
      break;                                                                             \
    case B_RELU_GRAD:                                                                    \
      BC_LOOP(b, o[k] = y[ib] > 0 ? x[ia] : 0);                                          \
      break;                                                                             \
    case B_SIGMOID_GRAD:                                                                 \
      BC_LOOP(b, o[k] = y[ib] * x[ia] * (1 - x[ia]));                                    \
      break;                                                                             \
    case B_TANH_GRAD:                                                                    \
      BC_LOOP(b, o[k] = y[ib] * (1 - x[ia] * x[ia]));                                    \
      break;                                                                             \
    }                                                                                    \
  } while (0)

/* Integers wrap as in TensorFlow; the arithmetic is done unsigned (U) so
 * that an overflow is defined. */
#define BIN_INT(T, U)                                                                    \
  do {                                                                                   \
    const T *x = xa, *y = ya;                                                            \
    T *o = oa;                                                                           \
    switch (op) {                                                                        \
    case B_ADD:                                                                          \
      BC_LOOP(b, o[k] = (T)((U)x[ia] + (U)y[ib]));                                       \
      break;                                                                             \
    case B_SUB:                                                                          \
      BC_LOOP(b, o[k] = (T)((U)x[ia] - (U)y[ib]));                                       \
      break;                                                                             \
    case B_MUL:                                                                          \
      BC_LOOP(b, o[k] = (T)((U)x[ia] * (U)y[ib]));                                       \
      break;                                                                             \
    default:                                                                             \
      BC_LOOP(b, o[k] = (T)bin_d(op, (double)x[ia], (double)y[ib]));                     \
      break;                                                                             \
    }                                                                                    \
  } while (0)

static void run_binop(binop op, ps_dtype dt, const bc *b, const void *xa, const void *ya,
                      void *oa) {
  switch (dt) {
  case PS_DT_FLOAT:
    BIN_FLOAT(float);
    break;
  case PS_DT_DOUBLE:
    BIN_FLOAT(double);
    break;
  case PS_DT_INT8:
    BIN_INT(int8_t, uint32_t);
    break;
  case PS_DT_INT16:
    BIN_INT(int16_t, uint32_t);
    break;
  case PS_DT_INT32:
    BIN_INT(int32_t, uint32_t);
    break;
  case PS_DT_INT64:
    BIN_INT(int64_t, uint64_t);
    break;
  case PS_DT_UINT8:
    BIN_INT(uint8_t, uint32_t);
    break;
  case PS_DT_UINT16:
    BIN_INT(uint16_t, uint32_t);
    break;
  case PS_DT_UINT32:
    BIN_INT(uint32_t, uint32_t);
    break;
  case PS_DT_UINT64:
    BIN_INT(uint64_t, uint64_t);
    break;
  default:
    BC_LOOP(b, ps_elem_set(dt, oa, k,
                           bin_d(op, ps_elem_get(dt, xa, ia), ps_elem_get(dt, ya, ib))));
    break;
  }
}

/* ---- elementwise binary ops ---- */

static int binary_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  bc b;
  if (bc_plan(&b, &in[0]->shape, &in[1]->shape, st)) return st->code;
  ps_tensor *o = new_tensor(n->dtype, &b.out, false, st);
  if (o == NULL) return st->code;
  run_binop((binop)n->ia[0], n->dtype, &b, ps_tensor_data(in[0]), ps_tensor_data(in[1]),
            ps_tensor_data(o));
  *out = o;
  return 0;
}

static int equal_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                         ps_status *st) {
  bc b;
  if (bc_plan(&b, &in[0]->shape, &in[1]->shape, st)) return st->code;
  ps_tensor *t = new_tensor(PS_DT_BOOL, &b.out, false, st);
  if (t == NULL) return st->code;
  ps_dtype dt = in[0]->dtype;
  const void *xa = ps_tensor_data(in[0]), *ya = ps_tensor_data(in[1]);
  uint8_t *o = ps_tensor_data(t);
#define EQ(T)                                                                            \
  do {                                                                                   \
    const T *x = xa, *y = ya;                                                            \
    BC_LOOP(&b, o[k] = x[ia] == y[ib]);                                                  \
  } while (0)
  if (dt == PS_DT_FLOAT)
    EQ(float);
  else if (dt == PS_DT_DOUBLE)
    EQ(double);
  else if (dt == PS_DT_HALF || dt == PS_DT_BFLOAT16)
    BC_LOOP(&b, o[k] = ps_elem_get(dt, xa, ia) == ps_elem_get(dt, ya, ib));
  else if (dt == PS_DT_BOOL)
    BC_LOOP(&b,
            o[k] = (((const uint8_t *)xa)[ia] != 0) == (((const uint8_t *)ya)[ib] != 0));
  else /* integers: equal bits */
    switch (ps_dtype_size(dt)) {
    case 1:
      EQ(uint8_t);
      break;
    case 2:
      EQ(uint16_t);
      break;
    case 4:
      EQ(uint32_t);
      break;
    case 8:
      EQ(uint64_t);
      break;
    default:
      ps_tensor_destroy(t);
      return unsupported(in[0], st);
    }
#undef EQ
  *out = t;
  return 0;
}

static const ps_op_def op_add = {"Add", PS_OPK_LOCAL, binary_compute, ps_grad_add_};
static const ps_op_def op_sub = {"Sub", PS_OPK_LOCAL, binary_compute, ps_grad_sub_};
static const ps_op_def op_mul = {"Mul", PS_OPK_LOCAL, binary_compute, ps_grad_mul_};
static const ps_op_def op_div = {"RealDiv", PS_OPK_LOCAL, binary_compute, ps_grad_div_};
static const ps_op_def op_equal = {"Equal", PS_OPK_LOCAL, equal_compute, NULL};
static const ps_op_def op_relu_grad = {"ReluGrad", PS_OPK_LOCAL, binary_compute, NULL};
static const ps_op_def op_sigmoid_grad = {"SigmoidGrad", PS_OPK_LOCAL, binary_compute,
                                          NULL};
static const ps_op_def op_tanh_grad = {"TanhGrad", PS_OPK_LOCAL, binary_compute, NULL};

static ps_node *binary(const ps_op_def *def, binop op, uint32_t types, ps_node *a,
                       ps_node *b) {
  ps_node *in[2] = {a, b};
  ps_graph *g = check_inputs(def->type, in, 2);
  if (g == NULL) return NULL;
  if (!same_type(g, def->type, a, b, "x", "y") ||
      !type_ok(g, def->type, "T", a->dtype, types))
    return NULL;
  ps_shape s;
  if (!broadcast_static(&a->shape, &b->shape, &s)) {
    char x[SHAPE_STR], y[SHAPE_STR];
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "%s: Incompatible shapes: %s vs. %s",
                         def->type, shape_str(&a->shape, x), shape_str(&b->shape, y));
  }
  ps_node *n =
      make(g, def, def->type, in, 2, def == &op_equal ? PS_DT_BOOL : a->dtype, &s);
  if (n) n->ia[0] = op;
  return n;
}

ps_node *ps_add(ps_node *a, ps_node *b) {
  return binary(&op_add, B_ADD, T_NUMERIC, a, b);
}
ps_node *ps_sub(ps_node *a, ps_node *b) {
  return binary(&op_sub, B_SUB, T_NUMERIC, a, b);
}
ps_node *ps_mul(ps_node *a, ps_node *b) {
  return binary(&op_mul, B_MUL, T_NUMERIC, a, b);
}
ps_node *ps_div(ps_node *a, ps_node *b) {
  return binary(&op_div, B_DIV, T_FLOATS, a, b);
}
ps_node *ps_equal(ps_node *a, ps_node *b) {
  return binary(&op_equal, 0, T_ALL, a, b);
}
ps_node *ps_relu_grad_(ps_node *dy, ps_node *y) {
  return binary(&op_relu_grad, B_RELU_GRAD, T_FLOATS, dy, y);
}
ps_node *ps_sigmoid_grad_(ps_node *y, ps_node *dy) {
  return binary(&op_sigmoid_grad, B_SIGMOID_GRAD, T_FLOATS, y, dy);
}
ps_node *ps_tanh_grad_(ps_node *y, ps_node *dy) {
  return binary(&op_tanh_grad, B_TANH_GRAD, T_FLOATS, y, dy);
}

/* ---- elementwise unary ops ---- */

typedef enum unop { U_NEG, U_SQUARE, U_RELU, U_SIGMOID, U_TANH, U_EXP } unop;

static double un_d(unop op, double x) {
  switch (op) {
  case U_NEG:
    return -x;
  case U_SQUARE:
    return x * x;
  case U_RELU:
    return x > 0 ? x : 0;
  case U_SIGMOID:
    return 1 / (1 + exp(-x));
  case U_TANH:
    return tanh(x);
  case U_EXP:
    return exp(x);
  }
  return 0;
}

#define UN_FLOAT(T, EXP, TANH)                                                           \
  do {                                                                                   \
    const T *x = xa;                                                                     \
    T *o = oa;                                                                           \
    switch (op) {                                                                        \
    case U_NEG:                                                                          \
      for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = -x[i];                                                                    \
      break;                                                                             \
    case U_SQUARE:                                                                       \
      for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = x[i] * x[i];                                                              \
      break;                                                                             \
    case U_RELU:                                                                         \
      for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = x[i] > 0 ? x[i] : 0;                                                      \
      break;                                                                             \
    case U_SIGMOID:                                                                      \
      for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = 1 / (1 + EXP(-x[i]));                                                     \
      break;                                                                             \
    case U_TANH:                                                                         \
      for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = TANH(x[i]);                                                               \
      break;                                                                             \
    case U_EXP:                                                                          \
      for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = EXP(x[i]);                                                                \
      break;                                                                             \
    }                                                                                    \
  } while (0)

static int unary_compute(ps_node *nd, ps_tensor *const *in, ps_tensor **out,
                         ps_status *st) {
  const ps_tensor *t = in[0];
  ps_tensor *ot = new_tensor(nd->dtype, &t->shape, false, st);
  if (ot == NULL) return st->code;
  unop op = (unop)nd->ia[0];
  int64_t n = ps_tensor_num_elements(t);
  const void *xa = ps_tensor_data(t);
  void *oa = ps_tensor_data(ot);
  ps_dtype dt = t->dtype;
  if (dt == PS_DT_FLOAT) {
    UN_FLOAT(float, expf, tanhf);
  } else if (dt == PS_DT_DOUBLE) {
    UN_FLOAT(double, exp, tanh);
  } else if (is_int(dt)) { /* Neg and Square, wrapping */
    for (int64_t i = 0; i < n; i++) {
      uint64_t v = (uint64_t)geti(dt, xa, i);
      seti(dt, oa, i, (int64_t)(op == U_NEG ? 0 - v : v * v));
    }
  } else {
    for (int64_t i = 0; i < n; i++)
      ps_elem_set(dt, oa, i, un_d(op, ps_elem_get(dt, xa, i)));
  }
  *out = ot;
  return 0;
}

static const ps_op_def op_neg = {"Neg", PS_OPK_LOCAL, unary_compute, ps_grad_neg_};
static const ps_op_def op_square = {"Square", PS_OPK_LOCAL, unary_compute,
                                    ps_grad_square_};
static const ps_op_def op_relu = {"Relu", PS_OPK_LOCAL, unary_compute, ps_grad_relu_};
static const ps_op_def op_sigmoid = {"Sigmoid", PS_OPK_LOCAL, unary_compute,
                                     ps_grad_sigmoid_};
static const ps_op_def op_tanh = {"Tanh", PS_OPK_LOCAL, unary_compute, ps_grad_tanh_};
static const ps_op_def op_exp = {"Exp", PS_OPK_LOCAL, unary_compute, ps_grad_exp_};

static ps_node *unary(const ps_op_def *def, unop op, uint32_t types, ps_node *x) {
  ps_graph *g = check_inputs(def->type, &x, 1);
  if (g == NULL || !type_ok(g, def->type, "T", x->dtype, types)) return NULL;
  ps_node *n = make(g, def, def->type, &x, 1, x->dtype, &x->shape);
  if (n) n->ia[0] = op;
  return n;
}

ps_node *ps_neg(ps_node *x) {
  return unary(&op_neg, U_NEG, T_NUMERIC, x);
}
ps_node *ps_square(ps_node *x) {
  return unary(&op_square, U_SQUARE, T_NUMERIC, x);
}
ps_node *ps_relu(ps_node *x) {
  return unary(&op_relu, U_RELU, T_FLOATS, x);
}
ps_node *ps_sigmoid(ps_node *x) {
  return unary(&op_sigmoid, U_SIGMOID, T_FLOATS, x);
}
ps_node *ps_tanh(ps_node *x) {
  return unary(&op_tanh, U_TANH, T_FLOATS, x);
}
ps_node *ps_exp_(ps_node *x) {
  return unary(&op_exp, U_EXP, T_FLOATS, x);
}

/* ---- MatMul ---- */

static int matmul_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  const ps_tensor *a = in[0], *b = in[1];
  char s1[SHAPE_STR], s2[SHAPE_STR];
  for (int i = 0; i < 2; i++)
    if (in[i]->shape.rank != 2)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "In[%d] is not a matrix. Instead it has shape %s", i,
                           shape_str(&in[i]->shape, s1));
  bool ta = n->ia[0], tb = n->ia[1];
  int64_t m = a->shape.dim[ta ? 1 : 0], ka = a->shape.dim[ta ? 0 : 1];
  int64_t kb = b->shape.dim[tb ? 1 : 0], nn = b->shape.dim[tb ? 0 : 1];
  if (ka != kb)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Matrix size-incompatible: In[0]: %s, In[1]: %s",
                         shape_str(&a->shape, s1), shape_str(&b->shape, s2));
  if (a->shape.dim[0] > INT_MAX || a->shape.dim[1] > INT_MAX ||
      b->shape.dim[0] > INT_MAX || b->shape.dim[1] > INT_MAX)
    return ps_status_set(st, PS_UNIMPLEMENTED, "MatMul: dimension too large for BLAS");
  ps_shape os = {.rank = 2, .dim = {m, nn}};
  ps_tensor *o = new_tensor(n->dtype, &os, ka == 0, st);
  if (o == NULL) return st->code;
  if (m > 0 && nn > 0 && ka > 0) {
    int lda = (int)a->shape.dim[1], ldb = (int)b->shape.dim[1];
    enum CBLAS_TRANSPOSE tra = ta ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE trb = tb ? CblasTrans : CblasNoTrans;
    if (n->dtype == PS_DT_FLOAT)
      cblas_sgemm(CblasRowMajor, tra, trb, (int)m, (int)nn, (int)ka, 1.0f,
                  ps_tensor_data(a), lda, ps_tensor_data(b), ldb, 0.0f, ps_tensor_data(o),
                  (int)nn);
    else
      cblas_dgemm(CblasRowMajor, tra, trb, (int)m, (int)nn, (int)ka, 1.0,
                  ps_tensor_data(a), lda, ps_tensor_data(b), ldb, 0.0, ps_tensor_data(o),
                  (int)nn);
  }
  *out = o;
  return 0;
}

static const ps_op_def op_matmul = {"MatMul", PS_OPK_LOCAL, matmul_compute,
                                    ps_grad_matmul_};

ps_node *ps_matmul(ps_node *a, ps_node *b, bool transpose_a, bool transpose_b) {
  ps_node *in[2] = {a, b};
  ps_graph *g = check_inputs("MatMul", in, 2);
  if (g == NULL) return NULL;
  if (!same_type(g, "MatMul", a, b, "a", "b") ||
      !type_ok(g, "MatMul", "T", a->dtype, T_FLOATS_FD))
    return NULL;
  char s1[SHAPE_STR], s2[SHAPE_STR];
  for (int i = 0; i < 2; i++)
    if (in[i]->shape.rank >= 0 && in[i]->shape.rank != 2)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "MatMul: Shape must be rank 2 but is rank %d (input shapes: "
                           "%s, %s)",
                           in[i]->shape.rank, shape_str(&a->shape, s1),
                           shape_str(&b->shape, s2));
  ps_shape s = {.rank = 2, .dim = {-1, -1}};
  if (a->shape.rank == 2) s.dim[0] = a->shape.dim[transpose_a ? 1 : 0];
  if (b->shape.rank == 2) s.dim[1] = b->shape.dim[transpose_b ? 0 : 1];
  if (a->shape.rank == 2 && b->shape.rank == 2) {
    int64_t ka = a->shape.dim[transpose_a ? 0 : 1],
            kb = b->shape.dim[transpose_b ? 1 : 0];
    if (ka >= 0 && kb >= 0 && ka != kb)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "MatMul: Matrix size-incompatible: In[0]: %s, In[1]: %s",
                           shape_str(&a->shape, s1), shape_str(&b->shape, s2));
  }
  ps_node *n = make(g, &op_matmul, "MatMul", in, 2, a->dtype, &s);
  if (n) {
    n->ia[0] = transpose_a;
    n->ia[1] = transpose_b;
  }
  return n;
}

/* ---- BiasAdd ---- */

static int bias_shapes_ok(const ps_shape *x, const ps_shape *bias, ps_status *st) {
  char s1[SHAPE_STR], s2[SHAPE_STR];
  if (x->rank < 2)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Input tensor must be at least 2D: %s",
                         shape_str(x, s1));
  if (bias->rank != 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Biases must be 1D: %s",
                         shape_str(bias, s1));
  if (bias->dim[0] != x->dim[x->rank - 1])
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Must provide as many biases as the last dimension of the input "
                         "tensor: %s vs. %s",
                         shape_str(bias, s1), shape_str(x, s2));
  return 0;
}

static int bias_add_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                            ps_status *st) {
  if (bias_shapes_ok(&in[0]->shape, &in[1]->shape, st)) return st->code;
  return binary_compute(n, in, out, st);
}

static const ps_op_def op_bias_add = {"BiasAdd", PS_OPK_LOCAL, bias_add_compute,
                                      ps_grad_bias_add_};

ps_node *ps_bias_add(ps_node *x, ps_node *bias) {
  ps_node *in[2] = {x, bias};
  ps_graph *g = check_inputs("BiasAdd", in, 2);
  if (g == NULL) return NULL;
  if (!same_type(g, "BiasAdd", x, bias, "value", "bias") ||
      !type_ok(g, "BiasAdd", "T", x->dtype, T_NUMERIC))
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
  ps_node *n = make(g, &op_bias_add, "BiasAdd", in, 2, x->dtype, &x->shape);
  if (n) n->ia[0] = B_ADD;
  return n;
}

/* out = x summed down to shape @to (which broadcasts to x's shape). */
static int sum_to(const ps_tensor *x, const ps_shape *to, ps_tensor **out,
                  ps_status *st) {
  if (ps_shape_equal(&x->shape, to)) {
    *out = share_as(x, to, st);
    return *out ? 0 : st->code;
  }
  bc b;
  if (bc_plan(&b, &x->shape, to, st)) return st->code;
  if (!ps_shape_equal(&b.out, &x->shape)) {
    char s1[SHAPE_STR], s2[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT, "cannot sum shape %s down to %s",
                         shape_str(&x->shape, s1), shape_str(to, s2));
  }
  ps_tensor *o = new_tensor(x->dtype, to, true, st);
  if (o == NULL) return st->code;
  const void *xa = ps_tensor_data(x);
  void *oa = ps_tensor_data(o);
  ps_dtype dt = x->dtype;
  if (dt == PS_DT_FLOAT) {
    const float *xp = xa;
    float *op = oa;
    BC_LOOP(&b, op[ib] += xp[ia]);
  } else if (dt == PS_DT_DOUBLE) {
    const double *xp = xa;
    double *op = oa;
    BC_LOOP(&b, op[ib] += xp[ia]);
  } else if (is_int(dt)) {
    BC_LOOP(&b, seti(dt, oa, ib,
                     (int64_t)((uint64_t)geti(dt, oa, ib) + (uint64_t)geti(dt, xa, ia))));
  } else {
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
                         shape_str(s, b));
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
static const ps_op_def op_sum_to_shape = {"SumToShape", PS_OPK_LOCAL,
                                          sum_to_shape_compute, ps_grad_sum_to_shape_};

ps_node *ps_bias_add_grad_(ps_node *dy) {
  ps_graph *g = check_inputs("BiasAddGrad", &dy, 1);
  if (g == NULL) return NULL;
  ps_shape s = {.rank = 1, .dim = {-1}};
  if (dy->shape.rank > 0) s.dim[0] = dy->shape.dim[dy->shape.rank - 1];
  return make(g, &op_bias_add_grad, "BiasAddGrad", &dy, 1, dy->dtype, &s);
}

ps_node *ps_sum_to_shape_(ps_node *x, ps_node *ref) {
  ps_node *in[2] = {x, ref};
  ps_graph *g = check_inputs("SumToShape", in, 2);
  if (g == NULL) return NULL;
  return make(g, &op_sum_to_shape, "SumToShape", in, 2, x->dtype, &ref->shape);
}

/* ---- softmax and cross entropy ---- */

#define SOFTMAX_ROWS(T, EXP, LOG)                                                        \
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
        orow[j] = EXP(xr[j] - mx);                                                       \
        sum += orow[j];                                                                  \
      }                                                                                  \
      if (log_out) {                                                                     \
        T ls = (T)LOG(sum);                                                              \
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
                         shape_str(&x->shape, b));
  }
  int64_t c = x->shape.dim[x->shape.rank - 1];
  int64_t rows = c > 0 ? ps_tensor_num_elements(x) / c : 0;
  bool log_out = n->ia[0];
  ps_tensor *o = new_tensor(x->dtype, &x->shape, false, st);
  if (o == NULL) return st->code;
  if (x->dtype == PS_DT_FLOAT)
    SOFTMAX_ROWS(float, expf, log);
  else
    SOFTMAX_ROWS(double, exp, log);
  *out = o;
  return 0;
}

static const ps_op_def op_softmax = {"Softmax", PS_OPK_LOCAL, softmax_compute,
                                     ps_grad_softmax_};
static const ps_op_def op_log_softmax = {"LogSoftmax", PS_OPK_LOCAL, softmax_compute,
                                         ps_grad_log_softmax_};

static ps_node *softmax(const ps_op_def *def, ps_node *x) {
  ps_graph *g = check_inputs(def->type, &x, 1);
  if (g == NULL || !type_ok(g, def->type, "T", x->dtype, T_FLOATS_FD)) return NULL;
  if (x->shape.rank == 0) {
    char b[SHAPE_STR];
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: logits must have >= 1 dimension, got %s", def->type,
                         shape_str(&x->shape, b));
  }
  ps_node *n = make(g, def, def->type, &x, 1, x->dtype, &x->shape);
  if (n) n->ia[0] = def == &op_log_softmax;
  return n;
}

ps_node *ps_softmax(ps_node *logits) {
  return softmax(&op_softmax, logits);
}
ps_node *ps_log_softmax(ps_node *logits) {
  return softmax(&op_log_softmax, logits);
}

/* Shapes of logits [N, C] and labels [N]; all labels in [0, C). */
static int xent_check(const ps_tensor *logits, const ps_tensor *labels, ps_status *st) {
  char s1[SHAPE_STR], s2[SHAPE_STR];
  if (logits->shape.rank != 2)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "logits must be 2-D, but got shape %s",
                         shape_str(&logits->shape, s1));
  if (labels->shape.rank != 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "labels must be 1-D, but got shape %s",
                         shape_str(&labels->shape, s1));
  if (logits->shape.dim[0] != labels->shape.dim[0])
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "logits and labels must have the same first dimension, got "
                         "logits shape %s and labels shape %s",
                         shape_str(&logits->shape, s1), shape_str(&labels->shape, s2));
  int64_t n = labels->shape.dim[0], c = logits->shape.dim[1];
  const void *lp = ps_tensor_data(labels);
  for (int64_t i = 0; i < n; i++) {
    int64_t l = geti(labels->dtype, lp, i);
    if (l < 0 || l >= c) {
      char vals[512];
      size_t off = 0;
      vals[0] = '\0';
      for (int64_t j = 0; j < n && off < sizeof vals; j++)
        off += (size_t)snprintf(vals + off, sizeof vals - off, "%s%lld", j ? " " : "",
                                (long long)geti(labels->dtype, lp, j));
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
#define XENT_ROWS(T, EXP)                                                                \
  do {                                                                                   \
    const T *xp = ps_tensor_data(logits);                                                \
    T *op = ps_tensor_data(o);                                                           \
    const T *dyp = dy ? ps_tensor_data(dy) : NULL;                                       \
    for (int64_t r = 0; r < rows; r++) {                                                 \
      const T *xr = xp + r * c;                                                          \
      int64_t l = geti(labels->dtype, ps_tensor_data(labels), r);                        \
      T mx = xr[0];                                                                      \
      for (int64_t j = 1; j < c; j++)                                                    \
        if (xr[j] > mx) mx = xr[j];                                                      \
      double sum = 0;                                                                    \
      for (int64_t j = 0; j < c; j++)                                                    \
        sum += EXP(xr[j] - mx);                                                          \
      if (dyp == NULL) {                                                                 \
        op[r] = (T)(log(sum) - (double)(xr[l] - mx));                                    \
      } else {                                                                           \
        T *orow = op + r * c;                                                            \
        for (int64_t j = 0; j < c; j++)                                                  \
          orow[j] = (T)((EXP(xr[j] - mx) / sum - (j == l)) * dyp[r]);                    \
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
                         shape_str(&dy->shape, s1), (long long)rows);
  }
  ps_shape os = {.rank = 1, .dim = {rows}};
  ps_tensor *o = new_tensor(logits->dtype, dy ? &logits->shape : &os, false, st);
  if (o == NULL) return st->code;
  if (logits->dtype == PS_DT_FLOAT)
    XENT_ROWS(float, expf);
  else
    XENT_ROWS(double, exp);
  *out = o;
  return 0;
}

static const ps_op_def op_xent = {"SparseSoftmaxCrossEntropyWithLogits", PS_OPK_LOCAL,
                                  xent_compute, ps_grad_xent_};
static const ps_op_def op_xent_grad = {"SparseSoftmaxCrossEntropyWithLogitsGrad",
                                       PS_OPK_LOCAL, xent_compute, NULL};

static ps_node *xent(const ps_op_def *def, ps_node *labels, ps_node *logits,
                     ps_node *dy) {
  const char *op = "SparseSoftmaxCrossEntropyWithLogits";
  ps_node *in[3] = {logits, labels, dy};
  int nin = dy ? 3 : 2;
  ps_graph *g = check_inputs(op, in, nin);
  if (g == NULL) return NULL;
  if (!type_ok(g, op, "T", logits->dtype, T_FLOATS_FD) ||
      !type_ok(g, op, "Tlabels", labels->dtype, T_INDEX))
    return NULL;
  char s1[SHAPE_STR], s2[SHAPE_STR];
  const ps_shape *ls = &logits->shape, *bs = &labels->shape;
  if (ls->rank >= 0 && ls->rank != 2)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: logits must be 2-D, but got shape %s", op,
                         shape_str(ls, s1));
  if (bs->rank >= 0 && bs->rank != 1)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: labels must be 1-D, but got shape %s", op,
                         shape_str(bs, s1));
  int64_t n0 = ls->rank == 2 ? ls->dim[0] : -1, n1 = bs->rank == 1 ? bs->dim[0] : -1;
  if (n0 >= 0 && n1 >= 0 && n0 != n1)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: logits and labels must have the same first dimension, got "
                         "logits shape %s and labels shape %s",
                         op, shape_str(ls, s1), shape_str(bs, s2));
  ps_shape s = {.rank = 1, .dim = {n0 >= 0 ? n0 : n1}};
  if (dy) {
    if (!same_type(g, def->type, logits, dy, "logits", "dy")) return NULL;
    s = *ls;
    if (s.rank < 0) s = (ps_shape){.rank = 2, .dim = {n1, -1}};
  }
  return make(g, def, dy ? def->type : op, in, nin, logits->dtype, &s);
}

ps_node *ps_sparse_softmax_cross_entropy_with_logits(ps_node *labels, ps_node *logits) {
  return xent(&op_xent, labels, logits, NULL);
}

ps_node *ps_xent_grad_(ps_node *logits, ps_node *labels, ps_node *dy) {
  return xent(&op_xent_grad, labels, logits, dy);
}

ps_node *ps_mean_squared_error(ps_node *labels, ps_node *predictions) {
  ps_node *in[2] = {labels, predictions};
  ps_graph *g = check_inputs("mean_squared_error", in, 2);
  if (g == NULL) return NULL;
  if (!type_ok(g, "mean_squared_error", "T", predictions->dtype, T_FLOATS)) return NULL;
  const ps_shape *a = &predictions->shape, *b = &labels->shape;
  bool ok = a->rank < 0 || b->rank < 0 || a->rank == b->rank;
  for (int i = 0; ok && a->rank >= 0 && a->rank == b->rank && i < a->rank; i++)
    ok = a->dim[i] < 0 || b->dim[i] < 0 || a->dim[i] == b->dim[i];
  if (!ok) {
    char s1[SHAPE_STR], s2[SHAPE_STR];
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "mean_squared_error: Shapes %s and %s are incompatible",
                         shape_str(a, s1), shape_str(b, s2));
  }
  ps_name_scope_push(g, "mean_squared_error");
  if (labels->dtype != predictions->dtype) labels = ps_cast(labels, predictions->dtype);
  ps_node *loss =
      ps_reduce_mean(ps_square(ps_sub(predictions, labels)), PS_ALL_AXES, false);
  ps_name_scope_pop(g);
  return loss;
}

/* ---- reductions ---- */

/* Axis of rank @r (negative counts from the end); -1 if out of range. */
static int norm_axis(int64_t axis, int r) {
  if (axis < -r || axis >= r) return -1;
  return (int)(axis < 0 ? axis + r : axis);
}

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
  ps_tensor *o = new_tensor(x->dtype, &os, false, st);
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
          a[i] += (uint64_t)geti(dt, xa, base + k * inner + i);
      for (int64_t i = 0; i < inner; i++) {
        int64_t v = (int64_t)a[i];
        if (mean) v = len > 0 ? v / len : 0;
        seti(dt, oa, ou * inner + i, v);
      }
    } else {
      double *a = acc;
      if (dt == PS_DT_FLOAT && inner == 1) {
        /* a contiguous run: independent partial sums vectorize */
        const float *xp = (const float *)xa + base;
        double part[8] = {0};
        int64_t k = 0;
        for (; k + 8 <= len; k += 8)
          for (int j = 0; j < 8; j++)
            part[j] += xp[k + j];
        for (; k < len; k++)
          part[0] += xp[k];
        for (int j = 0; j < 8; j++)
          a[0] += part[j];
      } else if (dt == PS_DT_DOUBLE && inner == 1) {
        const double *xp = (const double *)xa + base;
        double part[8] = {0};
        int64_t k = 0;
        for (; k + 8 <= len; k += 8)
          for (int j = 0; j < 8; j++)
            part[j] += xp[k + j];
        for (; k < len; k++)
          part[0] += xp[k];
        for (int j = 0; j < 8; j++)
          a[0] += part[j];
      } else if (dt == PS_DT_FLOAT) {
        const float *xp = (const float *)xa + base;
        for (int64_t k = 0; k < len; k++)
          for (int64_t i = 0; i < inner; i++)
            a[i] += xp[k * inner + i];
      } else if (dt == PS_DT_DOUBLE) {
        const double *xp = (const double *)xa + base;
        for (int64_t k = 0; k < len; k++)
          for (int64_t i = 0; i < inner; i++)
            a[i] += xp[k * inner + i];
      } else {
        for (int64_t k = 0; k < len; k++)
          for (int64_t i = 0; i < inner; i++)
            a[i] += ps_elem_get(dt, xa, base + k * inner + i);
      }
      for (int64_t i = 0; i < inner; i++)
        ps_elem_set(dt, oa, ou * inner + i,
                    mean ? (len > 0 ? a[i] / (double)len : NAN) : a[i]);
    }
  }
  free(acc);
  *out = o;
  return 0;
}

static const ps_op_def op_sum = {"Sum", PS_OPK_LOCAL, reduce_compute, ps_grad_sum_};
static const ps_op_def op_mean = {"Mean", PS_OPK_LOCAL, reduce_compute, ps_grad_mean_};

static ps_node *reduce(const ps_op_def *def, ps_node *x, int axis, bool keep) {
  ps_graph *g = check_inputs(def->type, &x, 1);
  if (g == NULL || !type_ok(g, def->type, "T", x->dtype, T_NUMERIC)) return NULL;
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
  ps_node *n = make(g, def, def->type, &x, 1, x->dtype, &s);
  if (n) {
    n->ia[0] = stored;
    n->ia[1] = keep;
    n->ia[2] = def == &op_mean;
  }
  return n;
}

ps_node *ps_reduce_sum(ps_node *x, int axis, bool keep_dims) {
  return reduce(&op_sum, x, axis, keep_dims);
}
ps_node *ps_reduce_mean(ps_node *x, int axis, bool keep_dims) {
  return reduce(&op_mean, x, axis, keep_dims);
}

/* ---- ArgMax ---- */

static bool elem_gt(ps_dtype dt, const void *p, int64_t i, int64_t j) {
  switch (dt) {
  case PS_DT_FLOAT:
    return ((const float *)p)[i] > ((const float *)p)[j];
  case PS_DT_DOUBLE:
    return ((const double *)p)[i] > ((const double *)p)[j];
  case PS_DT_UINT64:
    return ((const uint64_t *)p)[i] > ((const uint64_t *)p)[j];
  case PS_DT_HALF:
  case PS_DT_BFLOAT16:
    return ps_elem_get(dt, p, i) > ps_elem_get(dt, p, j);
  default:
    return geti(dt, p, i) > geti(dt, p, j);
  }
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
                         "Reduction axis %d is empty in shape %s", axis, shape_str(s, b));
  }
  ps_tensor *o = new_tensor(PS_DT_INT64, &os, false, st);
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
  ps_graph *g = check_inputs("ArgMax", &x, 1);
  if (g == NULL || !type_ok(g, "ArgMax", "T", x->dtype, T_NUMERIC)) return NULL;
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
  ps_node *n = make(g, &op_argmax, "ArgMax", &x, 1, PS_DT_INT64, &s);
  if (n) n->ia[0] = stored;
  return n;
}

/* ---- Cast ---- */

/* A float to integer type @dt: NaN gives 0, out of range saturates to the
 * int64 range, then wraps to the type's width (as a C cast would). */
static void set_from_double(ps_dtype dt, void *p, int64_t i, double v) {
  if (dt == PS_DT_BOOL) {
    ((uint8_t *)p)[i] = v != 0;
    return;
  }
  if (isnan(v)) v = 0;
  if (dt == PS_DT_UINT64 && v >= 9223372036854775808.0) {
    ((uint64_t *)p)[i] = v >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)v;
    return;
  }
  int64_t iv = v >= 9223372036854775807.0    ? INT64_MAX
               : v <= -9223372036854775808.0 ? INT64_MIN
                                             : (int64_t)v;
  seti(dt, p, i, iv);
}

static int cast_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                        ps_status *st) {
  const ps_tensor *x = in[0];
  ps_dtype src = x->dtype, dst = n->dtype;
  if (src == dst) {
    *out = share_as(x, &x->shape, st);
    return *out ? 0 : st->code;
  }
  ps_tensor *o = new_tensor(dst, &x->shape, false, st);
  if (o == NULL) return st->code;
  int64_t ne = ps_tensor_num_elements(x);
  const void *xa = ps_tensor_data(x);
  void *oa = ps_tensor_data(o);
  bool fsrc = ps_dtype_is_floating(src), fdst = ps_dtype_is_floating(dst);
  if (src == PS_DT_FLOAT && dst == PS_DT_DOUBLE) {
    for (int64_t i = 0; i < ne; i++)
      ((double *)oa)[i] = ((const float *)xa)[i];
  } else if (src == PS_DT_DOUBLE && dst == PS_DT_FLOAT) {
    for (int64_t i = 0; i < ne; i++)
      ((float *)oa)[i] = (float)((const double *)xa)[i];
  } else if (!fsrc && !fdst) {
    for (int64_t i = 0; i < ne; i++)
      seti(dst, oa, i, geti(src, xa, i));
  } else if (!fsrc) {
    for (int64_t i = 0; i < ne; i++) {
      double v = src == PS_DT_UINT64 ? (double)((const uint64_t *)xa)[i]
                                     : (double)geti(src, xa, i);
      ps_elem_set(dst, oa, i, v);
    }
  } else if (fdst) {
    for (int64_t i = 0; i < ne; i++)
      ps_elem_set(dst, oa, i, ps_elem_get(src, xa, i));
  } else {
    for (int64_t i = 0; i < ne; i++)
      set_from_double(dst, oa, i, ps_elem_get(src, xa, i));
  }
  *out = o;
  return 0;
}

static const ps_op_def op_cast = {"Cast", PS_OPK_LOCAL, cast_compute, ps_grad_cast_};

ps_node *ps_cast(ps_node *x, ps_dtype dtype) {
  ps_graph *g = check_inputs("Cast", &x, 1);
  if (g == NULL) return NULL;
  if (!in_mask(x->dtype, T_ALL) || !in_mask(dtype, T_ALL))
    return ps_graph_fail(g, PS_UNIMPLEMENTED, "Cast: Cast %s to %s is not supported",
                         ps_dtype_name(x->dtype), ps_dtype_name(dtype));
  return make(g, &op_cast, "Cast", &x, 1, dtype, &x->shape);
}

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
                           (long long)ne, shape_str(req, b));
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
  *out = share_as(in[0], &s, st);
  return *out ? 0 : st->code;
}

static const ps_op_def op_reshape = {"Reshape", PS_OPK_LOCAL, reshape_compute,
                                     ps_grad_reshape_};

ps_node *ps_reshape(ps_node *x, const ps_shape *shape) {
  ps_graph *g = check_inputs("Reshape", &x, 1);
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
            (long long)ne, shape_str(shape, b1), (long long)want);
      return ps_graph_fail(g, st.code, "Reshape: %s (input shape %s, requested %s)",
                           st.msg, shape_str(&x->shape, b1),
                           ps_shape_format(shape, b2, sizeof b2));
    }
  }
  ps_shape *keep = malloc(sizeof *keep);
  if (keep == NULL) return ps_graph_fail(g, PS_RESOURCE_EXHAUSTED, "out of memory");
  *keep = *shape;
  ps_node *n = make(g, &op_reshape, "Reshape", &x, 1, x->dtype, &s);
  if (n == NULL) {
    free(keep);
    return NULL;
  }
  n->extra = keep;
  return n;
}

ps_node *ps_reshape_like_(ps_node *x, ps_node *ref) {
  ps_node *in[2] = {x, ref};
  ps_graph *g = check_inputs("Reshape", in, 2);
  if (g == NULL) return NULL;
  return make(g, &op_reshape, "Reshape", in, 2, x->dtype, &ref->shape);
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
  *out = share_as(in[0], &o, st);
  return *out ? 0 : st->code;
}

static const ps_op_def op_expand_dims = {"ExpandDims", PS_OPK_LOCAL, expand_dims_compute,
                                         ps_grad_reshape_};

ps_node *ps_expand_dims_(ps_node *x, int axis) {
  ps_graph *g = check_inputs("ExpandDims", &x, 1);
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
  ps_node *n = make(g, &op_expand_dims, "ExpandDims", &x, 1, x->dtype, &s);
  if (n) n->ia[0] = axis;
  return n;
}

static int identity_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                            ps_status *st) {
  *out = share_as(in[0], &in[0]->shape, st);
  return *out ? 0 : st->code;
}

static const ps_op_def op_identity = {"Identity", PS_OPK_LOCAL, identity_compute,
                                      ps_grad_identity_};

ps_node *ps_identity_(ps_node *x) {
  ps_graph *g = check_inputs("Identity", &x, 1);
  if (g == NULL) return NULL;
  return make(g, &op_identity, "Identity", &x, 1, x->dtype, &x->shape);
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
          shape_str(&in[0]->shape, s1), i, shape_str(s, s2));
    for (int d = 0; d < r; d++)
      if (d != axis && s->dim[d] != os.dim[d])
        return ps_status_set(
            st, PS_INVALID_ARGUMENT,
            "ConcatOp : Dimensions of inputs should match: shape[0] = %s "
            "vs. shape[%d] = %s",
            shape_str(&in[0]->shape, s1), i, shape_str(s, s2));
    os.dim[axis] += s->dim[axis];
  }
  ps_tensor *o = new_tensor(n->dtype, &os, false, st);
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

static const ps_op_def op_concat = {"ConcatV2", PS_OPK_LOCAL, concat_compute,
                                    ps_grad_concat_};

ps_node *ps_concat(ps_node *const *xs, size_t n, int axis) {
  if (xs == NULL || n == 0 || n > INT_MAX) return NULL; /* no graph to tell */
  int nx = (int)n;
  ps_graph *g = check_inputs("ConcatV2", xs, nx);
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
            first, shape_str(&xs[first]->shape, s1), i, shape_str(xi, s2));
      for (int d = 0; d < r; d++) {
        if (d == a) {
          s.dim[a] = s.dim[a] < 0 || xi->dim[a] < 0 ? -1 : s.dim[a] + xi->dim[a];
        } else if (xi->dim[d] >= 0) {
          if (s.dim[d] >= 0 && s.dim[d] != xi->dim[d])
            return ps_graph_fail(
                g, PS_INVALID_ARGUMENT,
                "ConcatV2: ConcatOp : Dimensions of inputs should match: "
                "shape[%d] = %s vs. shape[%d] = %s",
                first, shape_str(&xs[first]->shape, s1), i, shape_str(xi, s2));
          s.dim[d] = xi->dim[d];
        }
      }
    }
  }
  ps_node *nd = make(g, &op_concat, "concat", xs, nx, xs[0]->dtype, &s);
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
                         shape_str(&dy->shape, s1), part,
                         shape_str(&xs[part]->shape, s2));
  }
  ps_shape os = dy->shape;
  os.dim[axis] = len;
  ps_tensor *o = new_tensor(dy->dtype, &os, false, st);
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
  ps_graph *g = check_inputs("ConcatOffsetSlice", in, n + 1);
  if (g) nd = make(g, &op_concat_slice, "Slice", in, n + 1, dy->dtype, &xs[i]->shape);
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
    int64_t v = geti(indices->dtype, ip, i);
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
  ps_tensor *o = new_tensor(params->dtype, &os, false, st);
  if (o == NULL) return st->code;
  const char *src = ps_tensor_data(params);
  char *dst = ps_tensor_data(o);
  for (int64_t i = 0; i < k; i++)
    memcpy(dst + (size_t)i * row, src + (size_t)geti(indices->dtype, ip, i) * row, row);
  *out = o;
  return 0;
}

static const ps_op_def op_gather = {"GatherV2", PS_OPK_LOCAL, gather_compute,
                                    ps_grad_gather_};

ps_node *ps_gather(ps_node *params, ps_node *indices) {
  ps_node *in[2] = {params, indices};
  ps_graph *g = check_inputs("GatherV2", in, 2);
  if (g == NULL) return NULL;
  if (!type_ok(g, "GatherV2", "Tindices", indices->dtype, T_INDEX)) return NULL;
  if (ps_dtype_size(params->dtype) == 0)
    return ps_graph_fail(g, PS_UNIMPLEMENTED, "GatherV2: no kernel for dtype %s",
                         ps_dtype_name(params->dtype));
  const ps_shape *ps = &params->shape, *is = &indices->shape;
  char s1[SHAPE_STR];
  if (ps->rank == 0)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "GatherV2: Shape must be at least rank 1 but is rank 0 (params "
                         "shape %s)",
                         shape_str(ps, s1));
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
  return make(g, &op_gather, "GatherV2", in, 2, params->dtype, &s);
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
                         shape_str(rs, s1), shape_str(is, s2));
  int64_t num = n->ia[0];
  if (num < 0) {
    const ps_shape *ref = &in[2]->shape;
    if (ref->rank < 1)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "dense shape %s has no rows",
                           shape_str(ref, s1));
    num = ref->dim[0];
  }
  ps_shape os = {.rank = 1 + rs->rank - is->rank, .dim = {num}};
  for (int d = is->rank; d < rs->rank; d++)
    os.dim[1 + d - is->rank] = rs->dim[d];
  ps_tensor *o = new_tensor(rows->dtype, &os, true, st);
  if (o == NULL) return st->code;
  int64_t k = ps_tensor_num_elements(ids), row = dims_product(rs, is->rank, rs->rank);
  const void *ip = ps_tensor_data(ids), *ra = ps_tensor_data(rows);
  void *oa = ps_tensor_data(o);
  ps_dtype dt = rows->dtype;
  for (int64_t i = 0; i < k; i++) {
    int64_t id = geti(ids->dtype, ip, i);
    if (id < 0) continue; /* dropped, as TensorFlow does */
    if (id >= num) {
      ps_tensor_destroy(o);
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "segment_ids[%s] = %lld is out of range [0, %lld)",
                           index_str(is, i, s1), (long long)id, (long long)num);
    }
    if (dt == PS_DT_FLOAT) {
      float *d = (float *)oa + id * row;
      const float *s = (const float *)ra + i * row;
      for (int64_t j = 0; j < row; j++)
        d[j] += s[j];
    } else if (dt == PS_DT_DOUBLE) {
      double *d = (double *)oa + id * row;
      const double *s = (const double *)ra + i * row;
      for (int64_t j = 0; j < row; j++)
        d[j] += s[j];
    } else {
      for (int64_t j = 0; j < row; j++)
        ps_elem_set(dt, oa, id * row + j,
                    ps_elem_get(dt, oa, id * row + j) + ps_elem_get(dt, ra, i * row + j));
    }
  }
  *out = o;
  return 0;
}

static const ps_op_def op_segment_sum = {"UnsortedSegmentSum", PS_OPK_LOCAL,
                                         segment_sum_compute, ps_grad_segment_sum_};

ps_node *ps_unsorted_segment_sum_(ps_node *rows, ps_node *ids, int64_t num_segments,
                                  ps_node *ref) {
  ps_node *in[3] = {rows, ids, ref};
  int nin = num_segments < 0 ? 3 : 2;
  ps_graph *g = check_inputs("UnsortedSegmentSum", in, nin);
  if (g == NULL) return NULL;
  if (!type_ok(g, "UnsortedSegmentSum", "Tindices", ids->dtype, T_INDEX) ||
      !type_ok(g, "UnsortedSegmentSum", "T", rows->dtype, T_NUMERIC))
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
  ps_node *n = make(g, &op_segment_sum, "UnsortedSegmentSum", in, nin, rows->dtype, &s);
  if (n) n->ia[0] = num_segments;
  return n;
}

/* ---- small helpers for gradients ---- */

static int add_n_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                         ps_status *st) {
  for (int i = 1; i < n->nin; i++)
    if (!ps_shape_equal(&in[i]->shape, &in[0]->shape)) {
      char s1[SHAPE_STR], s2[SHAPE_STR];
      return ps_status_set(
          st, PS_INVALID_ARGUMENT,
          "Inputs to operation AddN of type AddN must have the same size "
          "and shape.  Input 0: %s != input %d: %s",
          shape_str(&in[0]->shape, s1), i, shape_str(&in[i]->shape, s2));
    }
  ps_tensor *o = new_tensor(n->dtype, &in[0]->shape, false, st);
  if (o == NULL) return st->code;
  memcpy(ps_tensor_data(o), ps_tensor_data(in[0]), ps_tensor_nbytes(in[0]));
  for (int i = 1; i < n->nin; i++)
    if (ps_elem_apply(n->dtype, '+', ps_tensor_data(o), ps_tensor_data(in[i]),
                      ps_tensor_num_elements(o)) != 0) {
      ps_tensor_destroy(o);
      return unsupported(in[0], st);
    }
  *out = o;
  return 0;
}

static const ps_op_def op_add_n = {"AddN", PS_OPK_LOCAL, add_n_compute, ps_grad_add_n_};

ps_node *ps_add_n_(ps_node *const *xs, int n) {
  if (xs == NULL || n <= 0) return NULL;
  ps_graph *g = check_inputs("AddN", xs, n);
  if (g == NULL) return NULL;
  if (n == 1) return xs[0];
  ps_shape s = xs[0]->shape;
  for (int i = 1; i < n; i++) {
    if (!same_type(g, "AddN", xs[0], xs[i], "inputs", "inputs")) return NULL;
    const ps_shape *si = &xs[i]->shape;
    if (s.rank < 0) {
      s = *si;
    } else if (si->rank >= 0) {
      if (si->rank != s.rank) {
        char s1[SHAPE_STR], s2[SHAPE_STR];
        return ps_graph_fail(
            g, PS_INVALID_ARGUMENT,
            "AddN: Shapes must be equal rank, but are %d and %d (%s vs. %s)", s.rank,
            si->rank, shape_str(&s, s1), shape_str(si, s2));
      }
      for (int d = 0; d < s.rank; d++)
        if (s.dim[d] < 0) s.dim[d] = si->dim[d];
    }
  }
  return make(g, &op_add_n, "AddN", xs, n, xs[0]->dtype, &s);
}

static int ones_like_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                             ps_status *st) {
  ps_tensor *o = new_tensor(n->dtype, &in[0]->shape, false, st);
  if (o == NULL) return st->code;
  int64_t ne = ps_tensor_num_elements(o);
  for (int64_t i = 0; i < ne; i++)
    ps_elem_set(n->dtype, ps_tensor_data(o), i, 1);
  *out = o;
  return 0;
}

static const ps_op_def op_ones_like = {"OnesLike", PS_OPK_LOCAL, ones_like_compute, NULL};

ps_node *ps_ones_like_(ps_node *x) {
  ps_graph *g = check_inputs("OnesLike", &x, 1);
  if (g == NULL || !type_ok(g, "OnesLike", "T", x->dtype, T_ALL)) return NULL;
  return make(g, &op_ones_like, "OnesLike", &x, 1, x->dtype, &x->shape);
}

static int broadcast_to_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                                ps_status *st) {
  const ps_tensor *x = in[0];
  const ps_shape *to = &in[1]->shape;
  bc b;
  if (bc_plan(&b, &x->shape, to, st) || !ps_shape_equal(&b.out, to)) {
    char s1[SHAPE_STR], s2[SHAPE_STR];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Unable to broadcast tensor of shape %s to tensor of shape %s",
                         shape_str(&x->shape, s1), shape_str(to, s2));
  }
  ps_tensor *o = new_tensor(x->dtype, to, false, st);
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
    return unsupported(x, st);
  }
#undef COPY
  *out = o;
  return 0;
}

static const ps_op_def op_broadcast_to = {"BroadcastTo", PS_OPK_LOCAL,
                                          broadcast_to_compute, ps_grad_broadcast_to_};

ps_node *ps_broadcast_to_(ps_node *x, ps_node *ref) {
  ps_node *in[2] = {x, ref};
  ps_graph *g = check_inputs("BroadcastTo", in, 2);
  if (g == NULL) return NULL;
  return make(g, &op_broadcast_to, "BroadcastTo", in, 2, x->dtype, &ref->shape);
}

static int size_ratio_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                              ps_status *st) {
  ps_shape s0 = {.rank = 0};
  ps_tensor *o = new_tensor(n->dtype, &s0, false, st);
  if (o == NULL) return st->code;
  int64_t a = ps_tensor_num_elements(in[0]), b = ps_tensor_num_elements(in[1]);
  ps_elem_set(n->dtype, ps_tensor_data(o), 0, b > 0 ? (double)a / (double)b : 1.0);
  *out = o;
  return 0;
}

static const ps_op_def op_size_ratio = {"SizeRatio", PS_OPK_LOCAL, size_ratio_compute,
                                        NULL};

ps_node *ps_size_ratio_(ps_node *x, ps_node *y) {
  ps_node *in[2] = {x, y};
  ps_graph *g = check_inputs("SizeRatio", in, 2);
  if (g == NULL) return NULL;
  ps_shape s0 = {.rank = 0};
  return make(g, &op_size_ratio, "SizeRatio", in, 2, x->dtype, &s0);
}

/* Every op of this file, for MetaGraph import (saver.c). */
const ps_op_def *const ps_opdefs_ops_[] = {
    &op_add, &op_sub, &op_mul, &op_div, &op_equal, &op_relu_grad, &op_sigmoid_grad,
    &op_tanh_grad, &op_neg, &op_square, &op_relu, &op_sigmoid, &op_tanh, &op_exp,
    &op_matmul, &op_bias_add, &op_bias_add_grad, &op_sum_to_shape, &op_softmax,
    &op_log_softmax, &op_xent, &op_xent_grad, &op_sum, &op_mean, &op_argmax, &op_cast,
    &op_reshape, &op_expand_dims, &op_identity, &op_concat, &op_concat_slice, &op_gather,
    &op_segment_sum, &op_add_n, &op_ones_like, &op_broadcast_to, &op_size_ratio, NULL};
