/* Unit tests of worker/ops/grad.c: every differentiable op's gradient against
 * central finite differences (in double precision, inputs fed to
 * placeholders, run by a session), and the sparse gradients of gathers. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"
#include "worker/graph/node.h" /* sparse_indices, sparse_dense_shape */

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define V(...) ((const double[]){__VA_ARGS__})

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

/* uniform in [-1, 1), never within 0.1 of 0 (away from relu's kink) */
static double rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  double u = (double)(rng_state >> 11) / 9007199254740992.0; /* [0, 1) */
  double v = 0.1 + 0.9 * u;
  return (rng_state & 1) ? v : -v;
}

static ps_tensor *make_tensor(ps_dtype dt, const ps_shape *s, const double *v) {
  ps_tensor *t = ps_tensor_create(dt, s, true);
  ck_assert_ptr_nonnull(t);
  for (int64_t i = 0; v && i < ps_tensor_num_elements(t); i++)
    ps_elem_set(dt, ps_tensor_data(t), i, v[i]);
  return t;
}

static ps_shape shape_of(int rank, const int64_t *dims) {
  ps_shape s = {.rank = rank};
  for (int i = 0; i < rank; i++)
    s.dim[i] = dims[i];
  return s;
}

static ps_node *cst(ps_graph *g, ps_dtype dt, int rank, const int64_t *dims,
                    const double *v) {
  ps_shape s = shape_of(rank, dims);
  ps_tensor *t = make_tensor(dt, &s, v);
  ps_node *n = ps_constant(g, t, NULL);
  ps_tensor_destroy(t);
  ck_assert_ptr_nonnull(n);
  return n;
}

/* ---- the finite-difference harness ---- */

#define MAX_X 4

typedef struct fd_case {
  int nx;
  ps_shape shape[MAX_X]; /* of each double input (a placeholder) */
  unsigned positive;     /* inputs (bit i) drawn from [0.5, 1.5) */
  ps_node *(*build)(ps_graph *g, ps_node *const *x);
  ps_dtype wdtype; /* of the random weights (the op's output dtype) */
  double eps, tol;
} fd_case;

typedef struct fd_run {
  ps_graph *g;
  ps_session *s;
  ps_node *x[MAX_X], *y, *dx[MAX_X];
  ps_tensor *val[MAX_X];
  ps_feed feeds[MAX_X];
} fd_run;

static double run_y(fd_run *r) {
  ps_tensor *out = NULL;
  ps_status st;
  int rc = ps_session_run(r->s, r->feeds, MAX_X, &r->y, 1, NULL, 0, &out, &st);
  ck_assert_msg(rc == 0, "run: %s", st.msg);
  double v = ps_elem_get(out->dtype, ps_tensor_data(out), 0);
  ps_tensor_destroy(out);
  return v;
}

/* The gradient dx as a dense array of x's elements (sparse: summed rows). */
static double *fetch_dense(fd_run *r, int i) {
  ps_node *d = r->dx[i];
  int64_t ne = ps_tensor_num_elements(r->val[i]);
  double *dense = calloc((size_t)ne + 1, sizeof *dense);
  ps_node *f[2] = {d, d->sparse_indices};
  ps_tensor *out[2] = {NULL, NULL};
  ps_status st;
  int rc = ps_session_run(r->s, r->feeds, MAX_X, f, d->sparse_indices ? 2 : 1, NULL, 0,
                          out, &st);
  ck_assert_msg(rc == 0, "run: %s", st.msg);
  ck_assert_int_eq(out[0]->dtype, PS_DT_DOUBLE);
  if (d->sparse_indices == NULL) {
    ck_assert(ps_shape_equal(&out[0]->shape, &r->val[i]->shape));
    for (int64_t k = 0; k < ne; k++)
      dense[k] = ((double *)ps_tensor_data(out[0]))[k];
  } else {
    ck_assert(ps_shape_equal(&d->sparse_dense_shape, &r->val[i]->shape));
    int64_t nrows = out[1]->shape.dim[0];
    ck_assert_int_eq(out[0]->shape.dim[0], nrows);
    int64_t row = nrows ? ps_tensor_num_elements(out[0]) / nrows : 0;
    ck_assert_int_eq(row * r->val[i]->shape.dim[0], ne);
    for (int64_t k = 0; k < nrows; k++) {
      int64_t at = (int64_t)ps_elem_get(out[1]->dtype, ps_tensor_data(out[1]), k);
      for (int64_t j = 0; j < row; j++)
        dense[at * row + j] += ((double *)ps_tensor_data(out[0]))[k * row + j];
    }
    ps_tensor_destroy(out[1]);
  }
  ps_tensor_destroy(out[0]);
  return dense;
}

static void fd_check(const fd_case *c) {
  fd_run r = {0};
  ps_status st;
  r.g = ps_graph_create();
  for (int i = 0; i < MAX_X; i++) {
    /* unused slots get a dummy placeholder so that feeds stay valid */
    ps_shape s = i < c->nx ? c->shape[i] : (ps_shape){.rank = 0};
    char name[16];
    snprintf(name, sizeof name, "x%d", i);
    r.x[i] = ps_placeholder(r.g, PS_DT_DOUBLE, &s, name);
    int64_t ne = ps_shape_num_elements(&s);
    double *v = calloc((size_t)ne + 1, sizeof *v);
    for (int64_t k = 0; k < ne; k++)
      v[k] = (c->positive >> i) & 1 ? 1 + 0.5 * rnd() : rnd();
    r.val[i] = make_tensor(PS_DT_DOUBLE, &s, v);
    free(v);
    r.feeds[i] = (ps_feed){r.x[i], r.val[i]};
  }
  ps_node *out = c->build(r.g, r.x);
  ck_assert_msg(out != NULL, "build: %s", ps_graph_status(r.g)->msg);
  /* the op's output shape, from one forward run */
  r.s = ps_session_create(r.g, NULL, &st);
  ps_tensor *ov = NULL;
  ck_assert_msg(ps_session_run(r.s, r.feeds, MAX_X, &out, 1, NULL, 0, &ov, &st) == 0,
                "forward: %s", st.msg);
  int64_t no = ps_tensor_num_elements(ov);
  double *w = calloc((size_t)no + 1, sizeof *w);
  for (int64_t k = 0; k < no; k++)
    w[k] = rnd();
  ps_node *wn = cst(r.g, c->wdtype, ov->shape.rank, ov->shape.dim, w);
  free(w);
  ps_tensor_destroy(ov);
  /* y = sum(op(x) * w) */
  r.y = ps_reduce_sum(ps_mul(out, wn), PS_ALL_AXES, false);
  ck_assert_msg(r.y != NULL, "%s", ps_graph_status(r.g)->msg);
  ck_assert_msg(ps_gradients(r.g, r.y, r.x, (size_t)c->nx, r.dx, &st) == 0,
                "gradients: %s", st.msg);
  for (int i = 0; i < c->nx; i++) {
    ck_assert_msg(r.dx[i] != NULL, "no gradient for input %d", i);
    double *an = fetch_dense(&r, i);
    double *xv = ps_tensor_data(r.val[i]);
    int64_t ne = ps_tensor_num_elements(r.val[i]);
    for (int64_t k = 0; k < ne; k++) {
      double keep = xv[k];
      xv[k] = keep + c->eps;
      double yp = run_y(&r);
      xv[k] = keep - c->eps;
      double ym = run_y(&r);
      xv[k] = keep;
      double num = (yp - ym) / (2 * c->eps);
      double scale = fabs(num) > 1 ? fabs(num) : 1;
      ck_assert_msg(fabs(an[k] - num) <= c->tol * scale,
                    "input %d element %lld: analytic %.10g, numeric %.10g", i,
                    (long long)k, an[k], num);
    }
    free(an);
  }
  ps_session_destroy(r.s);
  for (int i = 0; i < MAX_X; i++)
    ps_tensor_destroy(r.val[i]);
  ps_graph_destroy(r.g);
}

#define S(...) shape_of((int)(sizeof(D(__VA_ARGS__)) / sizeof(int64_t)), D(__VA_ARGS__))
#define S0 ((ps_shape){.rank = 0})

static void check1(ps_node *(*build)(ps_graph *, ps_node *const *), ps_shape a) {
  fd_case c = {.nx = 1,
               .shape = {a},
               .build = build,
               .wdtype = PS_DT_DOUBLE,
               .eps = 1e-6,
               .tol = 1e-5};
  fd_check(&c);
}

static void check2(ps_node *(*build)(ps_graph *, ps_node *const *), ps_shape a,
                   ps_shape b, unsigned positive) {
  fd_case c = {.nx = 2,
               .shape = {a, b},
               .positive = positive,
               .build = build,
               .wdtype = PS_DT_DOUBLE,
               .eps = 1e-6,
               .tol = 1e-5};
  fd_check(&c);
}

/* ---- builders ---- */

static ps_node *b_add(ps_graph *g, ps_node *const *x) {
  return ps_add(x[0], x[1]);
}
static ps_node *b_sub(ps_graph *g, ps_node *const *x) {
  return ps_sub(x[0], x[1]);
}
static ps_node *b_mul(ps_graph *g, ps_node *const *x) {
  return ps_mul(x[0], x[1]);
}
static ps_node *b_div(ps_graph *g, ps_node *const *x) {
  return ps_div(x[0], x[1]);
}
static ps_node *b_mm(ps_graph *g, ps_node *const *x) {
  return ps_matmul(x[0], x[1], 0, 0);
}
static ps_node *b_mm_ta(ps_graph *g, ps_node *const *x) {
  return ps_matmul(x[0], x[1], 1, 0);
}
static ps_node *b_mm_tb(ps_graph *g, ps_node *const *x) {
  return ps_matmul(x[0], x[1], 0, 1);
}
static ps_node *b_mm_tt(ps_graph *g, ps_node *const *x) {
  return ps_matmul(x[0], x[1], 1, 1);
}
static ps_node *b_bias(ps_graph *g, ps_node *const *x) {
  return ps_bias_add(x[0], x[1]);
}
static ps_node *b_relu(ps_graph *g, ps_node *const *x) {
  return ps_relu(x[0]);
}
static ps_node *b_sigmoid(ps_graph *g, ps_node *const *x) {
  return ps_sigmoid(x[0]);
}
static ps_node *b_tanh(ps_graph *g, ps_node *const *x) {
  return ps_tanh(x[0]);
}
static ps_node *b_softmax(ps_graph *g, ps_node *const *x) {
  return ps_softmax(x[0]);
}
static ps_node *b_log_softmax(ps_graph *g, ps_node *const *x) {
  return ps_log_softmax(x[0]);
}
static ps_node *b_neg(ps_graph *g, ps_node *const *x) {
  return ps_neg(x[0]);
}
static ps_node *b_square(ps_graph *g, ps_node *const *x) {
  return ps_square(x[0]);
}

static ps_node *b_xent(ps_graph *g, ps_node *const *x) {
  ps_node *labels = cst(g, PS_DT_INT64, 1, D(4), V(2, 0, 1, 2));
  return ps_sparse_softmax_cross_entropy_with_logits(labels, x[0]);
}
static ps_node *b_xent32(ps_graph *g, ps_node *const *x) {
  ps_node *labels = cst(g, PS_DT_INT32, 1, D(4), V(0, 0, 1, 2));
  return ps_reduce_mean(ps_sparse_softmax_cross_entropy_with_logits(labels, x[0]),
                        PS_ALL_AXES, false);
}
static ps_node *b_mse(ps_graph *g, ps_node *const *x) {
  return ps_mean_squared_error(x[0], x[1]);
}

static int g_axis;
static bool g_keep;
static ps_node *b_sum(ps_graph *g, ps_node *const *x) {
  return ps_reduce_sum(x[0], g_axis, g_keep);
}
static ps_node *b_mean(ps_graph *g, ps_node *const *x) {
  return ps_reduce_mean(x[0], g_axis, g_keep);
}

static ps_node *b_reshape(ps_graph *g, ps_node *const *x) {
  ps_shape s = {.rank = 3, .dim = {3, -1, 2}};
  return ps_reshape(x[0], &s);
}
static ps_node *b_concat0(ps_graph *g, ps_node *const *x) {
  return ps_concat(x, 3, 0);
}
static ps_node *b_concat1(ps_graph *g, ps_node *const *x) {
  return ps_concat(x, 3, -1);
}

static ps_node *b_gather(ps_graph *g, ps_node *const *x) {
  return ps_gather(x[0], cst(g, PS_DT_INT64, 1, D(4), V(3, 0, 3, 4)));
}
static ps_node *b_gather2d(ps_graph *g, ps_node *const *x) {
  return ps_gather(x[0], cst(g, PS_DT_INT32, 2, D(2, 2), V(1, 1, 0, 2)));
}
static ps_node *b_cast(ps_graph *g, ps_node *const *x) {
  return ps_cast(x[0], PS_DT_FLOAT);
}
static ps_node *b_cast_roundtrip(ps_graph *g, ps_node *const *x) {
  /* the gradient crosses float and comes back as double */
  return ps_mul(ps_cast(ps_cast(x[0], PS_DT_FLOAT), PS_DT_DOUBLE), x[0]);
}

/* a two-layer classifier: relu(x w1 + b1) w2 -> mean sparse xent */
static ps_node *b_mlp(ps_graph *g, ps_node *const *x) {
  ps_node *in = cst(g, PS_DT_DOUBLE, 2, D(3, 4),
                    V(.1, -.2, .3, .4, .5, .6, -.7, .8, .9, .1, .2, -.3));
  ps_node *labels = cst(g, PS_DT_INT32, 1, D(3), V(0, 2, 1));
  ps_node *h = ps_tanh(ps_bias_add(ps_matmul(in, x[0], false, false), x[1]));
  ps_node *logits = ps_matmul(h, x[2], false, false);
  return ps_reduce_mean(ps_sparse_softmax_cross_entropy_with_logits(labels, logits),
                        PS_ALL_AXES, false);
}

/* ---- tests ---- */

START_TEST(grad_add_sub_mul_div) {
  ps_node *(*ops[4])(ps_graph *, ps_node *const *) = {b_add, b_sub, b_mul, b_div};
  for (int k = 0; k < 4; k++) {
    unsigned pos = k == 3 ? 2 : 0; /* keep divisors away from 0 */
    check2(ops[k], S(2, 3), S(2, 3), pos);
    check2(ops[k], S(2, 3), S(3), pos);    /* row broadcast */
    check2(ops[k], S(3), S(2, 3), pos);    /* on the other side */
    check2(ops[k], S(2, 1), S(1, 3), pos); /* both broadcast */
    check2(ops[k], S(2, 3), S0, pos);      /* scalar */
    check2(ops[k], S0, S(4), pos);
  }
}
END_TEST

static ps_node *b_conv_same(ps_graph *g, ps_node *const *x) {
  (void)g;
  const int st[4] = {1, 1, 1, 1};
  return ps_conv2d(x[0], x[1], st, "SAME", NULL);
}
static ps_node *b_conv_valid2(ps_graph *g, ps_node *const *x) {
  (void)g;
  const int st[4] = {1, 2, 2, 1};
  return ps_conv2d(x[0], x[1], st, "VALID", NULL);
}
static ps_node *b_conv_same2(ps_graph *g, ps_node *const *x) {
  (void)g;
  const int st[4] = {1, 2, 1, 1};
  return ps_conv2d(x[0], x[1], st, "SAME", NULL);
}

START_TEST(grad_conv2d) {
  check2(b_conv_same, S(2, 4, 5, 3), S(3, 3, 3, 2), 0);
  check2(b_conv_valid2, S(1, 5, 6, 2), S(2, 3, 2, 3), 0);
  check2(b_conv_same2, S(1, 5, 4, 1), S(2, 2, 1, 2), 0); /* uneven SAME padding */
}
END_TEST

START_TEST(grad_matmul) {
  check2(b_mm, S(2, 3), S(3, 4), 0);
  check2(b_mm_ta, S(3, 2), S(3, 4), 0);
  check2(b_mm_tb, S(2, 3), S(4, 3), 0);
  check2(b_mm_tt, S(3, 2), S(4, 3), 0);
}
END_TEST

START_TEST(grad_bias_add) {
  check2(b_bias, S(4, 3), S(3), 0);
  check2(b_bias, S(2, 2, 3), S(3), 0);
}
END_TEST

START_TEST(grad_activations) {
  check1(b_relu, S(3, 4));
  check1(b_sigmoid, S(3, 4));
  check1(b_tanh, S(3, 4));
  check1(b_neg, S(5));
  check1(b_square, S(2, 3));
}
END_TEST

START_TEST(grad_softmax) {
  check1(b_softmax, S(3, 4));
  check1(b_log_softmax, S(3, 4));
  check1(b_softmax, S(2, 2, 3));
  check1(b_log_softmax, S(5));
}
END_TEST

START_TEST(grad_losses) {
  check1(b_xent, S(4, 3));
  check1(b_xent32, S(4, 3));
  check2(b_mse, S(2, 3), S(2, 3), 0);
}
END_TEST

START_TEST(grad_reductions) {
  int axes[] = {0, 1, -1, PS_ALL_AXES};
  for (int k = 0; k < 4; k++)
    for (int keep = 0; keep < 2; keep++) {
      g_axis = axes[k];
      g_keep = keep;
      check1(b_sum, S(3, 4));
      check1(b_mean, S(3, 4));
    }
  g_axis = 1;
  g_keep = false;
  check1(b_sum, S(2, 3, 2));
  check1(b_mean, S(2, 3, 2));
}
END_TEST

START_TEST(grad_shapes) {
  check1(b_reshape, S(4, 3));
  fd_case c = {.nx = 3,
               .shape = {S(2, 3), S(1, 3), S(3, 3)},
               .build = b_concat0,
               .wdtype = PS_DT_DOUBLE,
               .eps = 1e-6,
               .tol = 1e-5};
  fd_check(&c);
  c = (fd_case){.nx = 3,
                .shape = {S(2, 1), S(2, 3), S(2, 2)},
                .build = b_concat1,
                .wdtype = PS_DT_DOUBLE,
                .eps = 1e-6,
                .tol = 1e-5};
  fd_check(&c);
}
END_TEST

START_TEST(grad_gather) {
  check1(b_gather, S(5, 3));
  check1(b_gather2d, S(3, 2));
}
END_TEST

START_TEST(grad_cast) {
  /* through float: y is linear in x, so a big step is exact up to float rounding */
  fd_case c = {.nx = 1,
               .shape = {S(2, 3)},
               .build = b_cast,
               .wdtype = PS_DT_FLOAT,
               .eps = 1e-2,
               .tol = 1e-4};
  fd_check(&c);
  c = (fd_case){.nx = 1,
                .shape = {S(4)},
                .build = b_cast_roundtrip,
                .wdtype = PS_DT_DOUBLE,
                .eps = 1e-3,
                .tol = 1e-5};
  fd_check(&c);
}
END_TEST

START_TEST(grad_two_layer_network) {
  fd_case c = {.nx = 3,
               .shape = {S(4, 5), S(5), S(5, 3)},
               .build = b_mlp,
               .wdtype = PS_DT_DOUBLE,
               .eps = 1e-6,
               .tol = 1e-5};
  fd_check(&c);
}
END_TEST

/* ---- sparse gradients ---- */

static ps_tensor *fetch(ps_session *s, ps_node *n) {
  ps_tensor *out = NULL;
  ps_status st;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, &n, 1, NULL, 0, &out, &st), st);
  return out;
}

static void expect_values(ps_tensor *t, const double *v, int64_t n) {
  ck_assert_int_eq(ps_tensor_num_elements(t), n);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(fabs(ps_elem_get(t->dtype, ps_tensor_data(t), i) - v[i]) < 1e-12,
                  "element %lld: %g != %g", (long long)i,
                  ps_elem_get(t->dtype, ps_tensor_data(t), i), v[i]);
  ps_tensor_destroy(t);
}

START_TEST(gather_gradient_is_sparse) {
  ps_graph *g = ps_graph_create();
  ps_node *params = cst(g, PS_DT_DOUBLE, 2, D(5, 2), NULL);
  ps_node *idx = cst(g, PS_DT_INT64, 1, D(3), V(4, 1, 4));
  ps_node *w = cst(g, PS_DT_DOUBLE, 2, D(3, 2), V(1, 2, 3, 4, 5, 6));
  ps_node *y = ps_reduce_sum(ps_mul(ps_gather(params, idx), w), PS_ALL_AXES, false);
  ps_node *dx = NULL;
  ps_status st;
  PS_ASSERT_OK(ps_gradients(g, y, &params, 1, &dx, &st), st);
  ck_assert_ptr_nonnull(dx);
  ck_assert_ptr_eq(dx->sparse_indices, idx);
  ck_assert_int_eq(dx->sparse_dense_shape.rank, 2);
  ck_assert_int_eq(dx->sparse_dense_shape.dim[0], 5);
  ck_assert_int_eq(dx->sparse_dense_shape.dim[1], 2);
  ck_assert_int_eq(ps_node_shape(dx)->rank, 2);
  ck_assert_int_eq(ps_node_shape(dx)->dim[0], 3);
  ck_assert_int_eq(ps_node_shape(dx)->dim[1], 2);
  ck_assert_ptr_nonnull(strstr(ps_node_name(dx), "gradients/"));
  ps_session *s = ps_session_create(g, NULL, &st);
  ps_tensor *rows = fetch(s, dx);
  ck_assert_int_eq(rows->shape.dim[0], 3);
  expect_values(rows, V(1, 2, 3, 4, 5, 6), 6);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(two_gathers_concatenate_rows) {
  ps_graph *g = ps_graph_create();
  ps_node *params = cst(g, PS_DT_DOUBLE, 2, D(4, 2), NULL);
  ps_node *i1 = cst(g, PS_DT_INT32, 1, D(2), V(0, 3));
  ps_node *i2 = cst(g, PS_DT_INT64, 1, D(1), V(3));
  ps_node *w1 = cst(g, PS_DT_DOUBLE, 2, D(2, 2), V(1, 2, 3, 4));
  ps_node *w2 = cst(g, PS_DT_DOUBLE, 2, D(1, 2), V(10, 20));
  ps_node *y =
      ps_add(ps_reduce_sum(ps_mul(ps_gather(params, i1), w1), PS_ALL_AXES, false),
             ps_reduce_sum(ps_mul(ps_gather(params, i2), w2), PS_ALL_AXES, false));
  ps_node *dx = NULL;
  ps_status st;
  PS_ASSERT_OK(ps_gradients(g, y, &params, 1, &dx, &st), st);
  ck_assert_ptr_nonnull(dx);
  ck_assert_ptr_nonnull(dx->sparse_indices);
  ck_assert_str_eq(ps_node_op(dx), "ConcatV2");
  ck_assert_str_eq(ps_node_op(dx->sparse_indices), "ConcatV2");
  /* int32 and int64 indices meet as int64 */
  ck_assert_int_eq(ps_node_dtype(dx->sparse_indices), PS_DT_INT64);
  ck_assert_int_eq(ps_node_shape(dx)->dim[0], 3);
  ck_assert_int_eq(dx->sparse_dense_shape.dim[0], 4);
  ps_session *s = ps_session_create(g, NULL, &st);
  /* rows and indices in one run */
  ps_node *f[2] = {dx, dx->sparse_indices};
  ps_tensor *out[2];
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, f, 2, NULL, 0, out, &st), st);
  /* rows may come in either order: compare the dense sum */
  ck_assert_int_eq(out[0]->shape.dim[0], 3);
  ck_assert_int_eq(out[1]->shape.dim[0], 3);
  double dense[8] = {0};
  for (int k = 0; k < 3; k++) {
    int64_t at = ((int64_t *)ps_tensor_data(out[1]))[k];
    ck_assert(at == 0 || at == 3);
    for (int j = 0; j < 2; j++)
      dense[at * 2 + j] += ((double *)ps_tensor_data(out[0]))[k * 2 + j];
  }
  const double *want = V(1, 2, 0, 0, 0, 0, 13, 24);
  for (int k = 0; k < 8; k++)
    ck_assert(dense[k] == want[k]);
  ps_tensor_destroy(out[0]);
  ps_tensor_destroy(out[1]);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(gather_plus_dense_use_is_dense) {
  ps_graph *g = ps_graph_create();
  ps_node *params = cst(g, PS_DT_DOUBLE, 2, D(3, 2), V(1, 2, 3, 4, 5, 6));
  ps_node *idx = cst(g, PS_DT_INT64, 1, D(3), V(2, 2, 0));
  ps_node *w = cst(g, PS_DT_DOUBLE, 2, D(3, 2), V(1, 1, 2, 2, 3, 3));
  ps_node *y =
      ps_add(ps_reduce_sum(ps_mul(ps_gather(params, idx), w), PS_ALL_AXES, false),
             ps_reduce_sum(ps_square(params), PS_ALL_AXES, false));
  ps_node *dx = NULL;
  ps_status st;
  PS_ASSERT_OK(ps_gradients(g, y, &params, 1, &dx, &st), st);
  ck_assert_ptr_nonnull(dx);
  ck_assert_ptr_null(dx->sparse_indices);
  ck_assert_int_eq(ps_node_shape(dx)->rank, 2);
  ck_assert_int_eq(ps_node_shape(dx)->dim[0], 3);
  ps_session *s = ps_session_create(g, NULL, &st);
  /* 2 * params + scatter of w rows: row 2 gets (1,1)+(2,2), row 0 gets (3,3) */
  expect_values(fetch(s, dx), V(2 + 3, 4 + 3, 6, 8, 10 + 3, 12 + 3), 6);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(sparse_gradient_through_dense_op) {
  /* params itself computed: its sparse gradient densifies before the Mul */
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_DOUBLE, 2, D(3, 2), V(1, 2, 3, 4, 5, 6));
  ps_node *params = ps_mul(x, ps_scalar(g, PS_DT_DOUBLE, 3));
  ps_node *idx = cst(g, PS_DT_INT32, 1, D(2), V(1, 1));
  ps_node *y = ps_reduce_sum(ps_gather(params, idx), PS_ALL_AXES, false);
  ps_node *dxs[2];
  ps_node *xs[2] = {x, params};
  ps_status st;
  PS_ASSERT_OK(ps_gradients(g, y, xs, 2, dxs, &st), st);
  ck_assert_ptr_null(dxs[0]->sparse_indices);
  ck_assert_ptr_nonnull(dxs[1]->sparse_indices);
  ps_session *s = ps_session_create(g, NULL, &st);
  expect_values(fetch(s, dxs[0]), V(0, 0, 6, 6, 0, 0), 6);
  expect_values(fetch(s, dxs[1]), V(1, 1, 1, 1), 4);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* ---- ps_gradients itself ---- */

START_TEST(gradients_edge_cases) {
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_DOUBLE, 1, D(3), V(1, 5, 2));
  ps_node *z = cst(g, PS_DT_DOUBLE, 1, D(3), V(1, 1, 1));
  ps_node *y = ps_reduce_sum(ps_square(x), PS_ALL_AXES, false);
  ps_node *dxs[3];
  ps_node *xs[3] = {x, z, y};
  ps_status st;
  PS_ASSERT_OK(ps_gradients(g, y, xs, 3, dxs, &st), st);
  ck_assert_ptr_nonnull(dxs[0]);
  ck_assert_ptr_null(dxs[1]);    /* y does not depend on z */
  ck_assert_ptr_nonnull(dxs[2]); /* dy/dy = 1 */
  ps_session *s = ps_session_create(g, NULL, &st);
  expect_values(fetch(s, dxs[0]), V(2, 10, 4), 3);
  expect_values(fetch(s, dxs[2]), V(1), 1);
  ps_session_destroy(s);

  /* ArgMax stops the gradient */
  ps_node *am = ps_cast(ps_argmax(x, 0), PS_DT_DOUBLE);
  ps_node *y2 = ps_add(am, ps_reduce_sum(z, PS_ALL_AXES, false));
  ps_node *d2[2];
  ps_node *xs2[2] = {x, z};
  PS_ASSERT_OK(ps_gradients(g, y2, xs2, 2, d2, &st), st);
  ck_assert_ptr_null(d2[0]);
  ck_assert_ptr_nonnull(d2[1]);

  /* x used twice: contributions add up */
  ps_node *y3 = ps_reduce_sum(ps_add(ps_mul(x, x), x), PS_ALL_AXES, false);
  ps_node *d3;
  PS_ASSERT_OK(ps_gradients(g, y3, &x, 1, &d3, &st), st);
  s = ps_session_create(g, NULL, &st);
  expect_values(fetch(s, d3), V(3, 11, 5), 3);
  ps_session_destroy(s);

  /* errors */
  ps_node *yi = ps_reduce_sum(ps_argmax(x, 0), PS_ALL_AXES, false);
  PS_ASSERT_STATUS(ps_gradients(g, yi, &x, 1, &d3, &st), st, PS_INVALID_ARGUMENT,
                   "only floating point tensors have gradients");
  ps_graph *other = ps_graph_create();
  ps_node *ox = cst(other, PS_DT_DOUBLE, 0, NULL, V(1));
  PS_ASSERT_CODE(ps_gradients(g, y, &ox, 1, &d3, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_ptr_null(d3);
  ps_graph_destroy(other);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(gradients_with_unknown_batch) {
  /* shapes known only at run time: the broadcast and mean gradients use
   * the fed shapes */
  ps_graph *g = ps_graph_create();
  ps_shape xs = {.rank = 2, .dim = {-1, 2}};
  ps_node *x = ps_placeholder(g, PS_DT_DOUBLE, &xs, "x");
  ps_node *b = cst(g, PS_DT_DOUBLE, 1, D(2), V(1, -1));
  ps_node *y = ps_reduce_mean(ps_square(ps_add(x, b)), PS_ALL_AXES, false);
  ps_node *dx[2];
  ps_node *xs2[2] = {x, b};
  ps_status st;
  PS_ASSERT_OK(ps_gradients(g, y, xs2, 2, dx, &st), st);
  ps_shape fs = {.rank = 2, .dim = {3, 2}};
  ps_tensor *xv = make_tensor(PS_DT_DOUBLE, &fs, V(0, 0, 1, 1, 2, 2));
  ps_feed f = {x, xv};
  ps_session *s = ps_session_create(g, NULL, &st);
  ps_tensor *out[2];
  PS_ASSERT_OK(ps_session_run(s, &f, 1, dx, 2, NULL, 0, out, &st), st);
  /* dy/dx = 2 (x + b) / 6 */
  expect_values(out[0], V(2. / 6, -2. / 6, 4. / 6, 0, 6. / 6, 2. / 6), 6);
  /* dy/db = sum over the batch */
  expect_values(out[1], V(12. / 6, 0), 2);
  ps_session_destroy(s);
  ps_tensor_destroy(xv);
  ps_graph_destroy(g);
}
END_TEST

/* The float kernels of the gradient ops agree with the double ones. */
static void mlp_grads(ps_dtype dt, double out[3][15]) {
  ps_graph *g = ps_graph_create();
  static const double wv[15] = {.1,  -.2, .3, .4, .5,  -.6, .7, .8,
                                -.9, .1,  .2, .3, -.4, .5,  .6};
  ps_node *x = cst(g, dt, 2, D(4, 3), V(1, 2, 3, -1, 0, 1, .5, .5, -2, 3, 1, 0));
  ps_node *w1 = cst(g, dt, 2, D(3, 5), wv);
  ps_node *b1 = cst(g, dt, 1, D(5), V(.1, .2, -.3, 0, .1));
  ps_node *w2 = cst(g, dt, 2, D(5, 3), wv);
  ps_node *labels = cst(g, PS_DT_INT64, 1, D(4), V(0, 1, 2, 1));
  ps_node *h = ps_relu(ps_bias_add(ps_matmul(x, w1, false, false), b1));
  ps_node *s =
      ps_sigmoid(ps_sub(ps_matmul(h, w2, false, false), ps_reduce_mean(h, 1, true)));
  ps_node *loss =
      ps_add(ps_reduce_mean(ps_sparse_softmax_cross_entropy_with_logits(labels, s),
                            PS_ALL_AXES, false),
             ps_reduce_sum(ps_log_softmax(ps_tanh(s)), PS_ALL_AXES, false));
  ps_node *xs[3] = {w1, b1, w2}, *dx[3];
  ps_status st;
  PS_ASSERT_OK(ps_gradients(g, loss, xs, 3, dx, &st), st);
  ps_session *sess = ps_session_create(g, NULL, &st);
  ps_tensor *t[3];
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, dx, 3, NULL, 0, t, &st), st);
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(t[i]->dtype, dt);
    for (int64_t k = 0; k < ps_tensor_num_elements(t[i]); k++)
      out[i][k] = ps_elem_get(dt, ps_tensor_data(t[i]), k);
    ps_tensor_destroy(t[i]);
  }
  ps_session_destroy(sess);
  ps_graph_destroy(g);
}

START_TEST(float_gradients_match_double) {
  double f[3][15], d[3][15];
  mlp_grads(PS_DT_FLOAT, f);
  mlp_grads(PS_DT_DOUBLE, d);
  int64_t n[3] = {15, 5, 15};
  for (int i = 0; i < 3; i++)
    for (int64_t k = 0; k < n[i]; k++)
      ck_assert_msg(fabs(f[i][k] - d[i][k]) <= 1e-5 * (1 + fabs(d[i][k])),
                    "grad %d element %lld: float %.9g, double %.9g", i, (long long)k,
                    f[i][k], d[i][k]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("grad");
  TCase *tc = tcase_create("finite_differences");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, grad_add_sub_mul_div);
  tcase_add_test(tc, grad_matmul);
  tcase_add_test(tc, grad_conv2d);
  tcase_add_test(tc, grad_bias_add);
  tcase_add_test(tc, grad_activations);
  tcase_add_test(tc, grad_softmax);
  tcase_add_test(tc, grad_losses);
  tcase_add_test(tc, grad_reductions);
  tcase_add_test(tc, grad_shapes);
  tcase_add_test(tc, grad_gather);
  tcase_add_test(tc, grad_cast);
  tcase_add_test(tc, grad_two_layer_network);
  suite_add_tcase(s, tc);
  TCase *sp = tcase_create("sparse");
  tcase_add_test(sp, gather_gradient_is_sparse);
  tcase_add_test(sp, two_gathers_concatenate_rows);
  tcase_add_test(sp, gather_plus_dense_use_is_dense);
  tcase_add_test(sp, sparse_gradient_through_dense_op);
  suite_add_tcase(s, sp);
  TCase *gr = tcase_create("gradients");
  tcase_add_test(gr, gradients_edge_cases);
  tcase_add_test(gr, gradients_with_unknown_batch);
  tcase_add_test(gr, float_gradients_match_double);
  suite_add_tcase(s, gr);
  return ps_test_run(s);
}
