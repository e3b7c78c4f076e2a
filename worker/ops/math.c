/* Elementwise math: binary ops with numpy broadcasting (Add, Sub, Mul,
 * RealDiv, Equal and the activation gradients), unary ops (Neg, Square,
 * Relu, Sigmoid, Tanh, Exp), MatMul (OpenBLAS gemm), Cast, and the
 * gradient helpers AddN, OnesLike and SizeRatio. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/node.h"
#include "ops_internal.h"

/* ---- the binary kernels ---- */

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

/* Integers wrap as in TensorFlow (PS_WRAP_*, common/tensor.h). */
#define BIN_INT(T, U)                                                                    \
  do {                                                                                   \
    const T *x = xa, *y = ya;                                                            \
    T *o = oa;                                                                           \
    switch (op) {                                                                        \
    case B_ADD:                                                                          \
      BC_LOOP(b, o[k] = PS_WRAP_ADD(T, U, x[ia], y[ib]));                                \
      break;                                                                             \
    case B_SUB:                                                                          \
      BC_LOOP(b, o[k] = PS_WRAP_SUB(T, U, x[ia], y[ib]));                                \
      break;                                                                             \
    case B_MUL:                                                                          \
      BC_LOOP(b, o[k] = PS_WRAP_MUL(T, U, x[ia], y[ib]));                                \
      break;                                                                             \
    default:                                                                             \
      BC_LOOP(b, o[k] = (T)bin_d(op, (double)x[ia], (double)y[ib]));                     \
      break;                                                                             \
    }                                                                                    \
  } while (0)

static void run_binop(binop op, ps_dtype dt, const ps_bc *b, const void *xa,
                      const void *ya, void *oa) {
#define PS_CASE_FLOAT(T, U) BIN_FLOAT(T)
#define PS_CASE_INT(T, U) BIN_INT(T, U)
  PS_DTYPE_SWITCH_NATIVE(dt, BC_LOOP(b, ps_elem_set(dt, oa, k,
                                                    bin_d(op, ps_elem_get(dt, xa, ia),
                                                          ps_elem_get(dt, ya, ib)))))
#undef PS_CASE_FLOAT
#undef PS_CASE_INT
}

/* ---- elementwise binary ops ---- */

int ps_binary_compute_(ps_node *n, ps_tensor *const *in, ps_tensor **out, ps_status *st) {
  ps_bc b;
  if (ps_bc_plan_(&b, &in[0]->shape, &in[1]->shape, st)) return st->code;
  ps_tensor *o = ps_new_tensor_(n->dtype, &b.out, false, st);
  if (o == NULL) return st->code;
  run_binop((binop)n->ia[0], n->dtype, &b, ps_tensor_data(in[0]), ps_tensor_data(in[1]),
            ps_tensor_data(o));
  *out = o;
  return 0;
}

static int equal_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                         ps_status *st) {
  ps_bc b;
  if (ps_bc_plan_(&b, &in[0]->shape, &in[1]->shape, st)) return st->code;
  ps_tensor *t = ps_new_tensor_(PS_DT_BOOL, &b.out, false, st);
  if (t == NULL) return st->code;
  ps_dtype dt = in[0]->dtype;
  const void *xa = ps_tensor_data(in[0]), *ya = ps_tensor_data(in[1]);
  uint8_t *o = ps_tensor_data(t);
#define EQ(T)                                                                            \
  do {                                                                                   \
    const T *x = xa, *y = ya;                                                            \
    BC_LOOP(&b, o[k] = x[ia] == y[ib]);                                                  \
  } while (0)
  bool native = true;
#define PS_CASE_FLOAT(T, U) EQ(T)
  PS_DTYPE_SWITCH_FLOAT(dt, native = false)
#undef PS_CASE_FLOAT
  if (native)
    ;
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
      return ps_unsupported_(in[0], st);
    }
#undef EQ
  *out = t;
  return 0;
}

const ps_op_def ps_op_add_ = {"Add", PS_OPK_LOCAL, ps_binary_compute_, NULL};
const ps_op_def ps_op_sub_ = {"Sub", PS_OPK_LOCAL, ps_binary_compute_, NULL};
const ps_op_def ps_op_mul_ = {"Mul", PS_OPK_LOCAL, ps_binary_compute_, NULL};
const ps_op_def ps_op_div_ = {"RealDiv", PS_OPK_LOCAL, ps_binary_compute_, NULL};
static const ps_op_def op_equal = {"Equal", PS_OPK_LOCAL, equal_compute, NULL};
static const ps_op_def op_relu_grad = {"ReluGrad", PS_OPK_LOCAL, ps_binary_compute_,
                                       NULL};
static const ps_op_def op_sigmoid_grad = {"SigmoidGrad", PS_OPK_LOCAL, ps_binary_compute_,
                                          NULL};
static const ps_op_def op_tanh_grad = {"TanhGrad", PS_OPK_LOCAL, ps_binary_compute_,
                                       NULL};

/* @name: the default name TensorFlow's Python gives the op ("add" for
 * a + b, whose type is Add). */
static ps_node *binary(const ps_op_def *def, const char *name, binop op, uint32_t types,
                       ps_node *a, ps_node *b) {
  ps_node *in[2] = {a, b};
  ps_graph *g = ps_check_inputs_(def->type, in, 2);
  if (g == NULL) return NULL;
  if (!ps_same_type_(g, def->type, a, b, "x", "y") ||
      !ps_type_ok_(g, def->type, "T", a->dtype, types))
    return NULL;
  ps_shape s;
  if (!ps_broadcast_static_(&a->shape, &b->shape, &s)) {
    char x[SHAPE_STR], y[SHAPE_STR];
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "%s: Incompatible shapes: %s vs. %s",
                         def->type, ps_shape_str_(&a->shape, x),
                         ps_shape_str_(&b->shape, y));
  }
  ps_node *n =
      ps_make_(g, def, name, in, 2, def == &op_equal ? PS_DT_BOOL : a->dtype, &s);
  if (n) n->ia[0] = op;
  return n;
}

ps_node *ps_add(ps_node *a, ps_node *b) {
  return binary(&ps_op_add_, "add", B_ADD, T_NUMERIC, a, b);
}
ps_node *ps_sub(ps_node *a, ps_node *b) {
  return binary(&ps_op_sub_, "sub", B_SUB, T_NUMERIC, a, b);
}
ps_node *ps_mul(ps_node *a, ps_node *b) {
  return binary(&ps_op_mul_, "mul", B_MUL, T_NUMERIC, a, b);
}
ps_node *ps_div(ps_node *a, ps_node *b) {
  return binary(&ps_op_div_, "truediv", B_DIV, T_FLOATS, a, b);
}
ps_node *ps_equal(ps_node *a, ps_node *b) {
  return binary(&op_equal, "Equal", 0, T_ALL, a, b);
}
ps_node *ps_relu_grad_(ps_node *dy, ps_node *y) {
  return binary(&op_relu_grad, "ReluGrad", B_RELU_GRAD, T_FLOATS, dy, y);
}
ps_node *ps_sigmoid_grad_(ps_node *y, ps_node *dy) {
  return binary(&op_sigmoid_grad, "SigmoidGrad", B_SIGMOID_GRAD, T_FLOATS, y, dy);
}
ps_node *ps_tanh_grad_(ps_node *y, ps_node *dy) {
  return binary(&op_tanh_grad, "TanhGrad", B_TANH_GRAD, T_FLOATS, y, dy);
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

#define UN_FLOAT(T)                                                                      \
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
        o[i] = 1 / (1 + PS_EXP_OF(T)(-x[i]));                                            \
      break;                                                                             \
    case U_TANH:                                                                         \
      for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = PS_TANH_OF(T)(x[i]);                                                      \
      break;                                                                             \
    case U_EXP:                                                                          \
      for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = PS_EXP_OF(T)(x[i]);                                                       \
      break;                                                                             \
    }                                                                                    \
  } while (0)

static int unary_compute(ps_node *nd, ps_tensor *const *in, ps_tensor **out,
                         ps_status *st) {
  const ps_tensor *t = in[0];
  ps_tensor *ot = ps_new_tensor_(nd->dtype, &t->shape, false, st);
  if (ot == NULL) return st->code;
  unop op = (unop)nd->ia[0];
  int64_t n = ps_tensor_num_elements(t);
  const void *xa = ps_tensor_data(t);
  void *oa = ps_tensor_data(ot);
  ps_dtype dt = t->dtype;
  /* integers: Neg and Square, wrapping */
#define UN_INT(T, U)                                                                     \
  do {                                                                                   \
    const T *x = xa;                                                                     \
    T *o = oa;                                                                           \
    for (int64_t i = 0; i < n; i++)                                                      \
      o[i] = op == U_NEG ? PS_WRAP_SUB(T, U, 0, x[i]) : PS_WRAP_MUL(T, U, x[i], x[i]);   \
  } while (0)
#define PS_CASE_FLOAT(T, U) UN_FLOAT(T)
#define PS_CASE_INT(T, U) UN_INT(T, U)
  PS_DTYPE_SWITCH_NATIVE(dt, for (int64_t i = 0; i < n; i++)
                                 ps_elem_set(dt, oa, i, un_d(op, ps_elem_get(dt, xa, i))))
#undef PS_CASE_FLOAT
#undef PS_CASE_INT
#undef UN_INT
  *out = ot;
  return 0;
}

const ps_op_def ps_op_neg_ = {"Neg", PS_OPK_LOCAL, unary_compute, NULL};
const ps_op_def ps_op_square_ = {"Square", PS_OPK_LOCAL, unary_compute, NULL};
const ps_op_def ps_op_relu_ = {"Relu", PS_OPK_LOCAL, unary_compute, NULL};
const ps_op_def ps_op_sigmoid_ = {"Sigmoid", PS_OPK_LOCAL, unary_compute, NULL};
const ps_op_def ps_op_tanh_ = {"Tanh", PS_OPK_LOCAL, unary_compute, NULL};
const ps_op_def ps_op_exp_ = {"Exp", PS_OPK_LOCAL, unary_compute, NULL};

static ps_node *unary(const ps_op_def *def, unop op, uint32_t types, ps_node *x) {
  ps_graph *g = ps_check_inputs_(def->type, &x, 1);
  if (g == NULL || !ps_type_ok_(g, def->type, "T", x->dtype, types)) return NULL;
  ps_node *n = ps_make_(g, def, def->type, &x, 1, x->dtype, &x->shape);
  if (n) n->ia[0] = op;
  return n;
}

ps_node *ps_neg(ps_node *x) {
  return unary(&ps_op_neg_, U_NEG, T_NUMERIC, x);
}
ps_node *ps_square(ps_node *x) {
  return unary(&ps_op_square_, U_SQUARE, T_NUMERIC, x);
}
ps_node *ps_relu(ps_node *x) {
  return unary(&ps_op_relu_, U_RELU, T_FLOATS, x);
}
ps_node *ps_sigmoid(ps_node *x) {
  return unary(&ps_op_sigmoid_, U_SIGMOID, T_FLOATS, x);
}
ps_node *ps_tanh(ps_node *x) {
  return unary(&ps_op_tanh_, U_TANH, T_FLOATS, x);
}
ps_node *ps_exp_(ps_node *x) {
  return unary(&ps_op_exp_, U_EXP, T_FLOATS, x);
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
                           ps_shape_str_(&in[i]->shape, s1));
  bool ta = n->ia[0], tb = n->ia[1];
  int64_t m = a->shape.dim[ta ? 1 : 0], ka = a->shape.dim[ta ? 0 : 1];
  int64_t kb = b->shape.dim[tb ? 1 : 0], nn = b->shape.dim[tb ? 0 : 1];
  if (ka != kb)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Matrix size-incompatible: In[0]: %s, In[1]: %s",
                         ps_shape_str_(&a->shape, s1), ps_shape_str_(&b->shape, s2));
  if (a->shape.dim[0] > INT_MAX || a->shape.dim[1] > INT_MAX ||
      b->shape.dim[0] > INT_MAX || b->shape.dim[1] > INT_MAX)
    return ps_status_set(st, PS_UNIMPLEMENTED, "MatMul: dimension too large for BLAS");
  ps_shape os = {.rank = 2, .dim = {m, nn}};
  ps_tensor *o = ps_new_tensor_(n->dtype, &os, ka == 0, st);
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

const ps_op_def ps_op_matmul_ = {"MatMul", PS_OPK_LOCAL, matmul_compute, NULL};

ps_node *ps_matmul(ps_node *a, ps_node *b, bool transpose_a, bool transpose_b) {
  ps_node *in[2] = {a, b};
  ps_graph *g = ps_check_inputs_("MatMul", in, 2);
  if (g == NULL) return NULL;
  if (!ps_same_type_(g, "MatMul", a, b, "a", "b") ||
      !ps_type_ok_(g, "MatMul", "T", a->dtype, T_FLOATS_FD))
    return NULL;
  char s1[SHAPE_STR], s2[SHAPE_STR];
  for (int i = 0; i < 2; i++)
    if (in[i]->shape.rank >= 0 && in[i]->shape.rank != 2)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "MatMul: Shape must be rank 2 but is rank %d (input shapes: "
                           "%s, %s)",
                           in[i]->shape.rank, ps_shape_str_(&a->shape, s1),
                           ps_shape_str_(&b->shape, s2));
  ps_shape s = {.rank = 2, .dim = {-1, -1}};
  if (a->shape.rank == 2) s.dim[0] = a->shape.dim[transpose_a ? 1 : 0];
  if (b->shape.rank == 2) s.dim[1] = b->shape.dim[transpose_b ? 0 : 1];
  if (a->shape.rank == 2 && b->shape.rank == 2) {
    int64_t ka = a->shape.dim[transpose_a ? 0 : 1],
            kb = b->shape.dim[transpose_b ? 1 : 0];
    if (ka >= 0 && kb >= 0 && ka != kb)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "MatMul: Matrix size-incompatible: In[0]: %s, In[1]: %s",
                           ps_shape_str_(&a->shape, s1), ps_shape_str_(&b->shape, s2));
  }
  ps_node *n = ps_make_(g, &ps_op_matmul_, "MatMul", in, 2, a->dtype, &s);
  if (n) {
    n->ia[0] = transpose_a;
    n->ia[1] = transpose_b;
  }
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
  ps_seti_(dt, p, i, iv);
}

static int cast_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                        ps_status *st) {
  const ps_tensor *x = in[0];
  ps_dtype src = x->dtype, dst = n->dtype;
  if (src == dst) {
    *out = ps_share_as_(x, &x->shape, st);
    return *out ? 0 : st->code;
  }
  ps_tensor *o = ps_new_tensor_(dst, &x->shape, false, st);
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
      ps_seti_(dst, oa, i, ps_geti_(src, xa, i));
  } else if (!fsrc) {
    for (int64_t i = 0; i < ne; i++) {
      double v = src == PS_DT_UINT64 ? (double)((const uint64_t *)xa)[i]
                                     : (double)ps_geti_(src, xa, i);
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

const ps_op_def ps_op_cast_ = {"Cast", PS_OPK_LOCAL, cast_compute, NULL};

ps_node *ps_cast(ps_node *x, ps_dtype dtype) {
  ps_graph *g = ps_check_inputs_("Cast", &x, 1);
  if (g == NULL) return NULL;
  if (!in_mask(x->dtype, T_ALL) || !in_mask(dtype, T_ALL))
    return ps_graph_fail(g, PS_UNIMPLEMENTED, "Cast: Cast %s to %s is not supported",
                         ps_dtype_name(x->dtype), ps_dtype_name(dtype));
  return ps_make_(g, &ps_op_cast_, "Cast", &x, 1, dtype, &x->shape);
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
          ps_shape_str_(&in[0]->shape, s1), i, ps_shape_str_(&in[i]->shape, s2));
    }
  ps_tensor *o = ps_new_tensor_(n->dtype, &in[0]->shape, false, st);
  if (o == NULL) return st->code;
  memcpy(ps_tensor_data(o), ps_tensor_data(in[0]), ps_tensor_nbytes(in[0]));
  for (int i = 1; i < n->nin; i++)
    if (ps_elem_apply(n->dtype, '+', ps_tensor_data(o), ps_tensor_data(in[i]),
                      ps_tensor_num_elements(o)) != 0) {
      ps_tensor_destroy(o);
      return ps_unsupported_(in[0], st);
    }
  *out = o;
  return 0;
}

const ps_op_def ps_op_add_n_ = {"AddN", PS_OPK_LOCAL, add_n_compute, NULL};

ps_node *ps_add_n_(ps_node *const *xs, int n) {
  if (xs == NULL || n <= 0) return NULL;
  ps_graph *g = ps_check_inputs_("AddN", xs, n);
  if (g == NULL) return NULL;
  if (n == 1) return xs[0];
  ps_shape s = xs[0]->shape;
  for (int i = 1; i < n; i++) {
    if (!ps_same_type_(g, "AddN", xs[0], xs[i], "inputs", "inputs")) return NULL;
    const ps_shape *si = &xs[i]->shape;
    if (s.rank < 0) {
      s = *si;
    } else if (si->rank >= 0) {
      if (si->rank != s.rank) {
        char s1[SHAPE_STR], s2[SHAPE_STR];
        return ps_graph_fail(
            g, PS_INVALID_ARGUMENT,
            "AddN: Shapes must be equal rank, but are %d and %d (%s vs. %s)", s.rank,
            si->rank, ps_shape_str_(&s, s1), ps_shape_str_(si, s2));
      }
      for (int d = 0; d < s.rank; d++)
        if (s.dim[d] < 0) s.dim[d] = si->dim[d];
    }
  }
  return ps_make_(g, &ps_op_add_n_, "AddN", xs, n, xs[0]->dtype, &s);
}

static int ones_like_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                             ps_status *st) {
  ps_tensor *o = ps_new_tensor_(n->dtype, &in[0]->shape, false, st);
  if (o == NULL) return st->code;
  int64_t ne = ps_tensor_num_elements(o);
  for (int64_t i = 0; i < ne; i++)
    ps_elem_set(n->dtype, ps_tensor_data(o), i, 1);
  *out = o;
  return 0;
}

static const ps_op_def op_ones_like = {"OnesLike", PS_OPK_LOCAL, ones_like_compute, NULL};

ps_node *ps_ones_like_(ps_node *x) {
  ps_graph *g = ps_check_inputs_("OnesLike", &x, 1);
  if (g == NULL || !ps_type_ok_(g, "OnesLike", "T", x->dtype, T_ALL)) return NULL;
  return ps_make_(g, &op_ones_like, "OnesLike", &x, 1, x->dtype, &x->shape);
}

static int size_ratio_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                              ps_status *st) {
  ps_shape s0 = {.rank = 0};
  ps_tensor *o = ps_new_tensor_(n->dtype, &s0, false, st);
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
  ps_graph *g = ps_check_inputs_("SizeRatio", in, 2);
  if (g == NULL) return NULL;
  ps_shape s0 = {.rank = 0};
  return ps_make_(g, &op_size_ratio, "SizeRatio", in, 2, x->dtype, &s0);
}

/* Every op of this file, for MetaGraph import (train/metagraph_import.c). */
const ps_op_def *const ps_opdefs_math_[] = {
    &ps_op_add_,   &ps_op_sub_,      &ps_op_mul_,   &ps_op_div_,    &op_equal,
    &op_relu_grad, &op_sigmoid_grad, &op_tanh_grad, &ps_op_neg_,    &ps_op_square_,
    &ps_op_relu_,  &ps_op_sigmoid_,  &ps_op_tanh_,  &ps_op_exp_,    &ps_op_matmul_,
    &ps_op_cast_,  &ps_op_add_n_,    &op_ones_like, &op_size_ratio, NULL};
