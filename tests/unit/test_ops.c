/* Unit tests of worker/ops/ops.c: forward values of every op against numbers
 * computed by hand, static shape inference, and the error texts. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define V(...) ((const double[]){__VA_ARGS__})
#define NV(...) (sizeof((const double[]){__VA_ARGS__}) / sizeof(double))

static ps_tensor *make_tensor(ps_dtype dt, int rank, const int64_t *dims,
                              const double *v) {
  ps_shape s = {.rank = rank};
  for (int i = 0; i < rank; i++)
    s.dim[i] = dims[i];
  ps_tensor *t = ps_tensor_create(dt, &s, true);
  ck_assert_ptr_nonnull(t);
  if (v)
    for (int64_t i = 0; i < ps_tensor_num_elements(t); i++)
      ps_elem_set(dt, ps_tensor_data(t), i, v[i]);
  return t;
}

static ps_node *cst(ps_graph *g, ps_dtype dt, int rank, const int64_t *dims,
                    const double *v) {
  ps_tensor *t = make_tensor(dt, rank, dims, v);
  ps_node *n = ps_constant(g, t, NULL);
  ps_tensor_destroy(t);
  ck_assert_ptr_nonnull(n);
  return n;
}

static ps_node *ph(ps_graph *g, ps_dtype dt, int rank, const int64_t *dims) {
  ps_shape s = {.rank = rank};
  for (int i = 0; i < rank; i++)
    s.dim[i] = dims[i];
  return ps_placeholder(g, dt, &s, NULL);
}

/* Runs @fetch; returns the value or NULL with @st set. */
static ps_tensor *run_feeds(ps_graph *g, ps_node *fetch, const ps_feed *feeds, size_t nf,
                            ps_status *st) {
  ps_session *s = ps_session_create(g, NULL, st);
  if (s == NULL) return NULL;
  ps_tensor *out = NULL;
  if (ps_session_run(s, feeds, nf, &fetch, 1, NULL, 0, &out, st) != 0) out = NULL;
  ps_session_destroy(s);
  return out;
}

static ps_tensor *run(ps_graph *g, ps_node *fetch) {
  ps_status st;
  ck_assert_msg(fetch != NULL, "graph error: %s", ps_graph_status(g)->msg);
  ps_tensor *t = run_feeds(g, fetch, NULL, 0, &st);
  ck_assert_msg(t != NULL, "run failed: %s", st.msg);
  return t;
}

/* Checks dtype, shape and values (within @tol), then destroys @t. */
static void expect(ps_tensor *t, ps_dtype dt, int rank, const int64_t *dims,
                   const double *v, double tol) {
  ck_assert_int_eq(t->dtype, dt);
  ck_assert_int_eq(t->shape.rank, rank);
  for (int i = 0; i < rank; i++)
    ck_assert_int_eq(t->shape.dim[i], dims[i]);
  for (int64_t i = 0; i < ps_tensor_num_elements(t); i++) {
    double got = ps_elem_get(dt, ps_tensor_data(t), i);
    ck_assert_msg(fabs(got - v[i]) <= tol, "element %lld: got %.9g, want %.9g",
                  (long long)i, got, v[i]);
  }
  ps_tensor_destroy(t);
}

static void expect_shape(ps_node *n, int rank, const int64_t *dims) {
  ck_assert_ptr_nonnull(n);
  const ps_shape *s = ps_node_shape(n);
  ck_assert_int_eq(s->rank, rank);
  for (int i = 0; i < rank; i++)
    ck_assert_int_eq(s->dim[i], dims[i]);
}

static void expect_graph_error(ps_graph *g, const char *text) {
  const ps_status *st = ps_graph_status(g);
  PS_ASSERT_STATUS(st->code, *st, PS_INVALID_ARGUMENT, text);
}

/* ---- conv2d ---- */

/* A 3x3 image, a 2x2 filter of ones: SAME pads one row and column at the
 * end (TensorFlow's split: the extra on the far side), VALID none. */
START_TEST(conv2d_values_and_shapes) {
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_FLOAT, 4, D(1, 3, 3, 1), V(1, 2, 3, 4, 5, 6, 7, 8, 9));
  ps_node *f = cst(g, PS_DT_FLOAT, 4, D(2, 2, 1, 1), V(1, 1, 1, 1));
  const int s1[4] = {1, 1, 1, 1}, s2[4] = {1, 2, 2, 1};
  expect(run(g, ps_conv2d(x, f, s1, "SAME", NULL)), PS_DT_FLOAT, 4, D(1, 3, 3, 1),
         V(12, 16, 9, 24, 28, 15, 15, 17, 9), 0);
  expect(run(g, ps_conv2d(x, f, s1, "VALID", NULL)), PS_DT_FLOAT, 4, D(1, 2, 2, 1),
         V(12, 16, 24, 28), 0);
  expect(run(g, ps_conv2d(x, f, s2, "SAME", NULL)), PS_DT_FLOAT, 4, D(1, 2, 2, 1),
         V(12, 9, 15, 9), 0);
  /* two output channels, two input channels */
  ps_node *x2 = cst(g, PS_DT_DOUBLE, 4, D(1, 1, 1, 2), V(1, 10));
  ps_node *f2 = cst(g, PS_DT_DOUBLE, 4, D(1, 1, 2, 2), V(1, 2, 3, 4));
  expect(run(g, ps_conv2d(x2, f2, s1, "VALID", NULL)), PS_DT_DOUBLE, 4, D(1, 1, 1, 2),
         V(31, 42), 0);
  expect_shape(ps_conv2d(ph(g, PS_DT_FLOAT, 4, D(-1, 28, 28, 1)),
                         cst(g, PS_DT_FLOAT, 4, D(5, 5, 1, 32), NULL), s2, "SAME", NULL),
               4, D(-1, 14, 14, 32));
  const int bad[4] = {2, 1, 1, 1};
  ck_assert_ptr_null(ps_conv2d(x, f, bad, "SAME", NULL));
  expect_graph_error(g, "Current implementation does not yet support strides in the "
                        "batch and depth dimensions.");
  ck_assert_ptr_null(ps_conv2d(x, f, s1, "FULL", NULL));
  expect_graph_error(g, "padding must be \"SAME\" or \"VALID\"");
  ck_assert_ptr_null(ps_conv2d(x, f2, s1, "SAME", NULL));
  ps_graph_destroy(g);
}
END_TEST

/* ---- random ops: TensorFlow 1.x's seed rules ---- */

static ps_tensor *normal_of(int64_t graph_seed, bool has_graph_seed, const int64_t *seed,
                            int extra_nodes) {
  ps_graph *g = ps_graph_create();
  if (has_graph_seed) ps_graph_set_random_seed(g, graph_seed);
  for (int i = 0; i < extra_nodes; i++)
    ps_scalar(g, PS_DT_FLOAT, i);
  ps_shape s = {1, {1000}};
  ps_tensor *t = run(g, ps_random_normal(g, &s, PS_DT_FLOAT, 0, 1, seed, NULL));
  ps_graph_destroy(g);
  return t;
}

static bool same_values(const ps_tensor *a, const ps_tensor *b) {
  return memcmp(ps_tensor_data(a), ps_tensor_data(b), ps_tensor_nbytes(a)) == 0;
}

START_TEST(random_ops_follow_the_seed_rules) {
  int64_t s5 = 5, s6 = 6;
  ps_tensor *a = normal_of(0, false, &s5, 0), *b = normal_of(0, false, &s5, 3);
  ck_assert(same_values(a, b)); /* op seed alone: graph seed 87654321, any graph */
  ps_tensor *c = normal_of(0, false, &s6, 0);
  ck_assert(!same_values(a, c));
  ps_tensor *d = normal_of(1, true, NULL, 2), *e = normal_of(1, true, NULL, 2);
  ck_assert(same_values(d, e)); /* graph seed alone: op seed from the node id */
  ps_tensor *f = normal_of(1, true, NULL, 3);
  ck_assert(!same_values(d, f));
  ps_tensor *h = normal_of(0, false, NULL, 0), *i = normal_of(0, false, NULL, 0);
  ck_assert(!same_values(h, i)); /* no seed: new values */
  ps_tensor *j = normal_of(87654321, true, &s5, 7);
  ck_assert(same_values(a, j)); /* the same pair of seeds */
  ps_tensor *all[] = {a, b, c, d, e, f, h, i, j};
  for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
    ps_tensor_destroy(all[k]);
  /* successive runs of one node give new values; truncated and uniform
   * stay in range; the mean and spread are the asked ones */
  ps_graph *g = ps_graph_create();
  ps_shape s = {1, {20000}};
  ps_node *tn = ps_truncated_normal(g, &s, PS_DT_DOUBLE, 3, 2, &s5, NULL);
  ps_node *un = ps_random_uniform(g, &s, PS_DT_FLOAT, -1, 4, &s5, NULL);
  ps_node *ui = ps_random_uniform(g, &s, PS_DT_INT64, 2, 5, &s5, NULL);
  ck_assert_str_eq(ps_node_name(tn), "truncated_normal");
  ck_assert_str_eq(ps_node_op(un), "RandomUniform");
  ps_status st;
  ps_session *sess = ps_session_create(g, NULL, &st);
  ps_node *fetch[3] = {tn, un, ui};
  ps_tensor *o1[3], *o2[3];
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, fetch, 3, NULL, 0, o1, &st), st);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, fetch, 3, NULL, 0, o2, &st), st);
  ck_assert(!same_values(o1[0], o2[0]));
  double sum = 0;
  bool seen[3] = {false, false, false};
  for (int64_t k = 0; k < 20000; k++) {
    double t = ((double *)ps_tensor_data(o1[0]))[k];
    ck_assert(t >= 3 - 4 && t <= 3 + 4);
    sum += t;
    float u = ((float *)ps_tensor_data(o1[1]))[k];
    ck_assert(u >= -1 && u < 4);
    int64_t q = ((int64_t *)ps_tensor_data(o1[2]))[k];
    ck_assert(q >= 2 && q < 5);
    seen[q - 2] = true;
  }
  ck_assert(fabs(sum / 20000 - 3) < 0.05);
  ck_assert(seen[0] && seen[1] && seen[2]);
  for (int k = 0; k < 3; k++) {
    ps_tensor_destroy(o1[k]);
    ps_tensor_destroy(o2[k]);
  }
  ps_session_destroy(sess);
  /* errors */
  ck_assert_ptr_null(ps_random_normal(g, &s, PS_DT_INT32, 0, 1, NULL, NULL));
  expect_graph_error(g, "RandomStandardNormal: Value for attr 'dtype' of int32 is not in "
                        "the list of allowed values: half, bfloat16, float, double");
  ps_shape unknown = {1, {-1}};
  ck_assert_ptr_null(ps_random_uniform(g, &unknown, PS_DT_FLOAT, 0, 1, NULL, NULL));
  expect_graph_error(g, "RandomUniform: the shape must be fully defined");
  ck_assert_ptr_null(ps_random_uniform(g, &s, PS_DT_INT32, 3, 3, NULL, NULL));
  expect_graph_error(g, "RandomUniformInt: Need minval < maxval: 3 >= 3");
  ps_graph_destroy(g);
}
END_TEST

/* ---- elementwise ---- */

START_TEST(add_sub_mul_div_same_shape) {
  ps_dtype types[2] = {PS_DT_FLOAT, PS_DT_DOUBLE};
  for (int k = 0; k < 2; k++) {
    ps_graph *g = ps_graph_create();
    ps_node *a = cst(g, types[k], 2, D(2, 2), V(1, 2, 3, 4));
    ps_node *b = cst(g, types[k], 2, D(2, 2), V(10, 20, 30, 40));
    ps_node *add = ps_add(a, b);
    ck_assert_str_eq(ps_node_op(add), "Add");
    ck_assert_int_eq(ps_node_dtype(add), types[k]);
    expect(run(g, add), types[k], 2, D(2, 2), V(11, 22, 33, 44), 0);
    expect(run(g, ps_sub(a, b)), types[k], 2, D(2, 2), V(-9, -18, -27, -36), 0);
    expect(run(g, ps_mul(a, b)), types[k], 2, D(2, 2), V(10, 40, 90, 160), 0);
    ps_node *dv = ps_div(a, b);
    ck_assert_str_eq(ps_node_op(dv), "RealDiv");
    expect(run(g, dv), types[k], 2, D(2, 2), V(.1, .1, .1, .1), 1e-7);
    expect(run(g, ps_neg(a)), types[k], 2, D(2, 2), V(-1, -2, -3, -4), 0);
    expect(run(g, ps_square(a)), types[k], 2, D(2, 2), V(1, 4, 9, 16), 0);
    ps_graph_destroy(g);
  }
}
END_TEST

START_TEST(broadcasting) {
  ps_graph *g = ps_graph_create();
  ps_node *m = cst(g, PS_DT_DOUBLE, 2, D(2, 3), V(1, 2, 3, 4, 5, 6));
  ps_node *row = cst(g, PS_DT_DOUBLE, 1, D(3), V(10, 20, 30));
  ps_node *col = cst(g, PS_DT_DOUBLE, 2, D(2, 1), V(100, 200));
  ps_node *sc = ps_scalar(g, PS_DT_DOUBLE, 2);
  ps_node *n = ps_add(m, row);
  expect_shape(n, 2, D(2, 3));
  expect(run(g, n), PS_DT_DOUBLE, 2, D(2, 3), V(11, 22, 33, 14, 25, 36), 0);
  expect(run(g, ps_sub(row, m)), PS_DT_DOUBLE, 2, D(2, 3), V(9, 18, 27, 6, 15, 24), 0);
  expect(run(g, ps_mul(m, col)), PS_DT_DOUBLE, 2, D(2, 3),
         V(100, 200, 300, 800, 1000, 1200), 0);
  /* [2,1] x [3] -> [2,3]: both sides broadcast */
  expect(run(g, ps_add(col, row)), PS_DT_DOUBLE, 2, D(2, 3),
         V(110, 120, 130, 210, 220, 230), 0);
  expect(run(g, ps_div(m, sc)), PS_DT_DOUBLE, 2, D(2, 3), V(.5, 1, 1.5, 2, 2.5, 3), 0);
  expect(run(g, ps_div(sc, m)), PS_DT_DOUBLE, 2, D(2, 3), V(2, 1, 2. / 3, .5, .4, 2. / 6),
         1e-15);
  /* rank 3 against a middle dimension of 1 */
  ps_node *t3 = cst(g, PS_DT_FLOAT, 3, D(2, 1, 2), V(1, 2, 3, 4));
  ps_node *t2 = cst(g, PS_DT_FLOAT, 2, D(3, 1), V(10, 20, 30));
  ps_node *s3 = ps_add(t3, t2);
  expect_shape(s3, 3, D(2, 3, 2));
  expect(run(g, s3), PS_DT_FLOAT, 3, D(2, 3, 2),
         V(11, 12, 21, 22, 31, 32, 13, 14, 23, 24, 33, 34), 0);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(integer_arithmetic) {
  ps_graph *g = ps_graph_create();
  ps_node *a = cst(g, PS_DT_INT32, 1, D(3), V(7, -3, 2147483647));
  ps_node *b = cst(g, PS_DT_INT32, 1, D(3), V(2, 5, 1));
  expect(run(g, ps_add(a, b)), PS_DT_INT32, 1, D(3), V(9, 2, -2147483648.0), 0);
  expect(run(g, ps_mul(a, b)), PS_DT_INT32, 1, D(3), V(14, -15, 2147483647), 0);
  ps_node *c = cst(g, PS_DT_INT64, 2, D(2, 2), V(1, 2, 3, 4));
  expect(run(g, ps_sub(c, cst(g, PS_DT_INT64, 1, D(2), V(1, 1)))), PS_DT_INT64, 2,
         D(2, 2), V(0, 1, 2, 3), 0);
  expect(run(g, ps_neg(c)), PS_DT_INT64, 2, D(2, 2), V(-1, -2, -3, -4), 0);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(activations) {
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_DOUBLE, 1, D(4), V(-2, -0.5, 0, 1.5));
  expect(run(g, ps_relu(x)), PS_DT_DOUBLE, 1, D(4), V(0, 0, 0, 1.5), 0);
  expect(run(g, ps_sigmoid(x)), PS_DT_DOUBLE, 1, D(4),
         V(1 / (1 + exp(2)), 1 / (1 + exp(0.5)), 0.5, 1 / (1 + exp(-1.5))), 1e-15);
  expect(run(g, ps_tanh(x)), PS_DT_DOUBLE, 1, D(4), V(tanh(-2), tanh(-.5), 0, tanh(1.5)),
         1e-15);
  ps_node *xf = cst(g, PS_DT_FLOAT, 1, D(3), V(-100, 0, 100));
  expect(run(g, ps_sigmoid(xf)), PS_DT_FLOAT, 1, D(3), V(0, 0.5, 1), 1e-7);
  ck_assert_str_eq(ps_node_op(ps_relu(xf)), "Relu");
  ps_graph_destroy(g);
}
END_TEST

/* ---- MatMul, BiasAdd ---- */

START_TEST(matmul_with_transposes) {
  ps_dtype types[2] = {PS_DT_FLOAT, PS_DT_DOUBLE};
  for (int k = 0; k < 2; k++) {
    ps_dtype dt = types[k];
    ps_graph *g = ps_graph_create();
    /* a = [[1,2,3],[4,5,6]], b = [[7,8],[9,10],[11,12]]; a b = [[58,64],[139,154]] */
    ps_node *a = cst(g, dt, 2, D(2, 3), V(1, 2, 3, 4, 5, 6));
    ps_node *at = cst(g, dt, 2, D(3, 2), V(1, 4, 2, 5, 3, 6));
    ps_node *b = cst(g, dt, 2, D(3, 2), V(7, 8, 9, 10, 11, 12));
    ps_node *bt = cst(g, dt, 2, D(2, 3), V(7, 9, 11, 8, 10, 12));
    const double *want = V(58, 64, 139, 154);
    ps_node *m = ps_matmul(a, b, false, false);
    ck_assert_str_eq(ps_node_op(m), "MatMul");
    expect_shape(m, 2, D(2, 2));
    expect(run(g, m), dt, 2, D(2, 2), want, 0);
    expect(run(g, ps_matmul(at, b, true, false)), dt, 2, D(2, 2), want, 0);
    expect(run(g, ps_matmul(a, bt, false, true)), dt, 2, D(2, 2), want, 0);
    expect(run(g, ps_matmul(at, bt, true, true)), dt, 2, D(2, 2), want, 0);
    /* b a = 3x3 */
    expect(run(g, ps_matmul(b, a, false, false)), dt, 2, D(3, 3),
           V(39, 54, 69, 49, 68, 87, 59, 82, 105), 0);
    ps_graph_destroy(g);
  }
}
END_TEST

START_TEST(matmul_unknown_batch_and_empty) {
  ps_graph *g = ps_graph_create();
  ps_node *x = ph(g, PS_DT_FLOAT, 2, D(-1, 3));
  ps_node *w = cst(g, PS_DT_FLOAT, 2, D(3, 2), V(1, 0, 0, 1, 1, 1));
  ps_node *y = ps_matmul(x, w, false, false);
  expect_shape(y, 2, D(-1, 2));
  ps_tensor *xv = make_tensor(PS_DT_FLOAT, 2, D(1, 3), V(1, 2, 3));
  ps_feed f = {x, xv};
  ps_status st;
  ps_tensor *out = run_feeds(g, y, &f, 1, &st);
  ck_assert_ptr_nonnull(out);
  expect(out, PS_DT_FLOAT, 2, D(1, 2), V(4, 5), 0);
  ps_tensor_destroy(xv);
  /* no rows at all */
  xv = make_tensor(PS_DT_FLOAT, 2, D(0, 3), NULL);
  f.value = xv;
  out = run_feeds(g, y, &f, 1, &st);
  ck_assert_ptr_nonnull(out);
  expect(out, PS_DT_FLOAT, 2, D(0, 2), NULL, 0);
  ps_tensor_destroy(xv);
  /* a fed size the static shape allowed but the kernel cannot take */
  ps_node *x2 = ph(g, PS_DT_FLOAT, 2, D(2, -1));
  ps_node *y2 = ps_matmul(x2, w, false, false);
  xv = make_tensor(PS_DT_FLOAT, 2, D(2, 4), NULL);
  f = (ps_feed){x2, xv};
  ck_assert_ptr_null(run_feeds(g, y2, &f, 1, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "Matrix size-incompatible: In[0]: [2,4], In[1]: [3,2]");
  ps_tensor_destroy(xv);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(bias_add) {
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_FLOAT, 2, D(2, 3), V(1, 2, 3, 4, 5, 6));
  ps_node *b = cst(g, PS_DT_FLOAT, 1, D(3), V(.5, -1, 10));
  ps_node *y = ps_bias_add(x, b);
  ck_assert_str_eq(ps_node_op(y), "BiasAdd");
  expect(run(g, y), PS_DT_FLOAT, 2, D(2, 3), V(1.5, 1, 13, 4.5, 4, 16), 0);
  ck_assert_ptr_null(ps_bias_add(x, cst(g, PS_DT_FLOAT, 1, D(2), V(1, 2))));
  expect_graph_error(g,
                     "BiasAdd: Must provide as many biases as the last dimension of the "
                     "input tensor: [2] vs. [2,3]");
  ps_graph_destroy(g);
}
END_TEST

/* ---- softmax and losses ---- */

START_TEST(softmax_and_log_softmax) {
  ps_graph *g = ps_graph_create();
  /* the second row would overflow exp() without subtracting the max */
  ps_node *x = cst(g, PS_DT_DOUBLE, 2, D(2, 3), V(1, 2, 3, 1000, 1001, 1002));
  double z = exp(1) + exp(2) + exp(3);
  const double *sm =
      V(exp(1) / z, exp(2) / z, exp(3) / z, exp(1) / z, exp(2) / z, exp(3) / z);
  expect(run(g, ps_softmax(x)), PS_DT_DOUBLE, 2, D(2, 3), sm, 1e-15);
  double lz = log(z);
  expect(run(g, ps_log_softmax(x)), PS_DT_DOUBLE, 2, D(2, 3),
         V(1 - lz, 2 - lz, 3 - lz, 1 - lz, 2 - lz, 3 - lz), 1e-12);
  ps_node *xf = cst(g, PS_DT_FLOAT, 1, D(2), V(-1000, 1000));
  expect(run(g, ps_softmax(xf)), PS_DT_FLOAT, 1, D(2), V(0, 1), 0);
  expect(run(g, ps_log_softmax(xf)), PS_DT_FLOAT, 1, D(2), V(-2000, 0), 0);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(sparse_xent) {
  ps_dtype ltypes[2] = {PS_DT_INT32, PS_DT_INT64};
  for (int k = 0; k < 2; k++) {
    ps_graph *g = ps_graph_create();
    ps_node *logits = cst(g, PS_DT_DOUBLE, 2, D(3, 3), V(1, 2, 3, 1, 1, 1, 500, 0, -500));
    ps_node *labels = cst(g, ltypes[k], 1, D(3), V(2, 0, 1));
    ps_node *loss = ps_sparse_softmax_cross_entropy_with_logits(labels, logits);
    ck_assert_str_eq(ps_node_op(loss), "SparseSoftmaxCrossEntropyWithLogits");
    expect_shape(loss, 1, D(3));
    double z = exp(1) + exp(2) + exp(3);
    expect(run(g, loss), PS_DT_DOUBLE, 1, D(3), V(log(z) - 3, log(3), 500), 1e-12);
    ps_graph_destroy(g);
  }
}
END_TEST

START_TEST(sparse_xent_label_out_of_range) {
  ps_graph *g = ps_graph_create();
  ps_node *logits = ph(g, PS_DT_FLOAT, 2, D(-1, 10));
  ps_node *labels = ph(g, PS_DT_INT32, 1, D(-1));
  ps_node *loss = ps_sparse_softmax_cross_entropy_with_logits(labels, logits);
  ps_tensor *lv = make_tensor(PS_DT_FLOAT, 2, D(2, 10), NULL);
  ps_tensor *yv = make_tensor(PS_DT_INT32, 1, D(2), V(3, 12));
  ps_feed f[2] = {{logits, lv}, {labels, yv}};
  ps_status st;
  ck_assert_ptr_null(run_feeds(g, loss, f, 2, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "Received a label value of 12 which is outside the valid "
                               "range of [0, 10).  Label values: 3 12") != NULL,
                "%s", st.msg);
  ps_elem_set(PS_DT_INT32, ps_tensor_data(yv), 1, -1);
  ck_assert_ptr_null(run_feeds(g, loss, f, 2, &st));
  ck_assert_ptr_nonnull(strstr(st.msg, "Received a label value of -1 which"));
  ps_tensor_destroy(lv);
  ps_tensor_destroy(yv);
  /* static checks */
  ps_node *bad = ps_sparse_softmax_cross_entropy_with_logits(
      cst(g, PS_DT_INT32, 1, D(4), V(0, 0, 0, 0)), cst(g, PS_DT_FLOAT, 2, D(2, 3), NULL));
  ck_assert_ptr_null(bad);
  expect_graph_error(g,
                     "logits and labels must have the same first dimension, got logits "
                     "shape [2,3] and labels shape [4]");
  ps_graph_destroy(g);
}
END_TEST

START_TEST(mean_squared_error) {
  ps_graph *g = ps_graph_create();
  ps_node *labels = cst(g, PS_DT_FLOAT, 2, D(2, 2), V(1, 2, 3, 4));
  ps_node *pred = cst(g, PS_DT_FLOAT, 2, D(2, 2), V(1, 3, 5, 4));
  ps_node *mse = ps_mean_squared_error(labels, pred);
  expect_shape(mse, 0, NULL);
  ck_assert_ptr_nonnull(strstr(ps_node_name(mse), "mean_squared_error/"));
  expect(run(g, mse), PS_DT_FLOAT, 0, NULL, V(1.25), 1e-7);
  ck_assert_ptr_null(ps_mean_squared_error(cst(g, PS_DT_FLOAT, 1, D(4), NULL), pred));
  expect_graph_error(g, "mean_squared_error: Shapes [2,2] and [4] are incompatible");
  ps_graph_destroy(g);
}
END_TEST

/* ---- reductions ---- */

START_TEST(reduce_sum_and_mean) {
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_DOUBLE, 2, D(2, 3), V(1, 2, 3, 4, 5, 6));
  ps_node *s0 = ps_reduce_sum(x, 0, false);
  ck_assert_str_eq(ps_node_op(s0), "Sum");
  expect_shape(s0, 1, D(3));
  expect(run(g, s0), PS_DT_DOUBLE, 1, D(3), V(5, 7, 9), 0);
  expect(run(g, ps_reduce_sum(x, 1, false)), PS_DT_DOUBLE, 1, D(2), V(6, 15), 0);
  expect(run(g, ps_reduce_sum(x, -1, true)), PS_DT_DOUBLE, 2, D(2, 1), V(6, 15), 0);
  expect(run(g, ps_reduce_sum(x, 0, true)), PS_DT_DOUBLE, 2, D(1, 3), V(5, 7, 9), 0);
  expect(run(g, ps_reduce_sum(x, PS_ALL_AXES, false)), PS_DT_DOUBLE, 0, NULL, V(21), 0);
  expect(run(g, ps_reduce_sum(x, PS_ALL_AXES, true)), PS_DT_DOUBLE, 2, D(1, 1), V(21), 0);
  ps_node *m = ps_reduce_mean(x, 1, false);
  ck_assert_str_eq(ps_node_op(m), "Mean");
  expect(run(g, m), PS_DT_DOUBLE, 1, D(2), V(2, 5), 0);
  expect(run(g, ps_reduce_mean(x, 0, true)), PS_DT_DOUBLE, 2, D(1, 3), V(2.5, 3.5, 4.5),
         0);
  expect(run(g, ps_reduce_mean(x, PS_ALL_AXES, false)), PS_DT_DOUBLE, 0, NULL, V(3.5), 0);
  /* rank 3, middle axis */
  ps_node *t = cst(g, PS_DT_FLOAT, 3, D(2, 2, 2), V(1, 2, 3, 4, 5, 6, 7, 8));
  expect(run(g, ps_reduce_sum(t, 1, false)), PS_DT_FLOAT, 2, D(2, 2), V(4, 6, 12, 14), 0);
  /* integers: mean truncates as in TensorFlow */
  ps_node *xi = cst(g, PS_DT_INT32, 1, D(3), V(1, 2, 2));
  expect(run(g, ps_reduce_sum(xi, 0, false)), PS_DT_INT32, 0, NULL, V(5), 0);
  expect(run(g, ps_reduce_mean(xi, 0, false)), PS_DT_INT32, 0, NULL, V(1), 0);
  ck_assert_ptr_null(ps_reduce_sum(x, 2, false));
  expect_graph_error(g,
                     "Sum: Invalid reduction dimension 2 for input with 2 dimensions.");
  ps_graph_destroy(g);
}
END_TEST

START_TEST(reduce_unknown_shapes) {
  ps_graph *g = ps_graph_create();
  ps_node *x = ph(g, PS_DT_FLOAT, 2, D(-1, 4));
  expect_shape(ps_reduce_sum(x, 0, false), 1, D(4));
  expect_shape(ps_reduce_mean(x, 1, true), 2, D(-1, 1));
  expect_shape(ps_reduce_mean(x, PS_ALL_AXES, false), 0, NULL);
  ps_node *u = ps_placeholder(g, PS_DT_FLOAT, NULL, "u");
  ck_assert_int_eq(ps_node_shape(ps_reduce_sum(u, 1, false))->rank, -1);
  ps_node *su = ps_reduce_sum(u, -1, false);
  ps_tensor *uv = make_tensor(PS_DT_FLOAT, 2, D(2, 2), V(1, 2, 3, 4));
  ps_feed f = {u, uv};
  ps_status st;
  ps_tensor *out = run_feeds(g, su, &f, 1, &st);
  ck_assert_msg(out != NULL, "%s", st.msg);
  expect(out, PS_DT_FLOAT, 1, D(2), V(3, 7), 0);
  ps_tensor_destroy(uv);
  ps_graph_destroy(g);
}
END_TEST

/* ---- shapes ---- */

START_TEST(reshape) {
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_FLOAT, 2, D(2, 3), V(1, 2, 3, 4, 5, 6));
  ps_shape s = {.rank = 2, .dim = {3, -1}};
  ps_node *r = ps_reshape(x, &s);
  ck_assert_str_eq(ps_node_op(r), "Reshape");
  expect_shape(r, 2, D(3, 2));
  expect(run(g, r), PS_DT_FLOAT, 2, D(3, 2), V(1, 2, 3, 4, 5, 6), 0);
  s = (ps_shape){.rank = 1, .dim = {-1}};
  expect(run(g, ps_reshape(x, &s)), PS_DT_FLOAT, 1, D(6), V(1, 2, 3, 4, 5, 6), 0);
  /* unknown batch: -1 stays unknown statically, resolved at run time */
  ps_node *p = ph(g, PS_DT_FLOAT, 2, D(-1, 4));
  s = (ps_shape){.rank = 3, .dim = {-1, 2, 2}};
  ps_node *rp = ps_reshape(p, &s);
  expect_shape(rp, 3, D(-1, 2, 2));
  ps_tensor *pv = make_tensor(PS_DT_FLOAT, 2, D(1, 4), V(1, 2, 3, 4));
  ps_feed f = {p, pv};
  ps_status st;
  ps_tensor *out = run_feeds(g, rp, &f, 1, &st);
  ck_assert_ptr_nonnull(out);
  expect(out, PS_DT_FLOAT, 3, D(1, 2, 2), V(1, 2, 3, 4), 0);
  ps_tensor_destroy(pv);
  /* run-time error when the fed size does not divide */
  ps_node *q = ph(g, PS_DT_FLOAT, 1, D(-1));
  s = (ps_shape){.rank = 2, .dim = {-1, 3}};
  ps_node *rq = ps_reshape(q, &s);
  pv = make_tensor(PS_DT_FLOAT, 1, D(7), NULL);
  f = (ps_feed){q, pv};
  ck_assert_ptr_null(run_feeds(g, rq, &f, 1, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "Input to reshape is a tensor with 7 values, but the "
                   "requested shape requires a multiple of 3");
  ps_tensor_destroy(pv);
  /* static error */
  s = (ps_shape){.rank = 1, .dim = {4}};
  ck_assert_ptr_null(ps_reshape(x, &s));
  expect_graph_error(g,
                     "Reshape: Cannot reshape a tensor with 6 elements to shape [4] (4 "
                     "elements)");
  ps_graph_destroy(g);

  g = ps_graph_create();
  x = cst(g, PS_DT_FLOAT, 1, D(6), NULL);
  s = (ps_shape){.rank = 2, .dim = {-1, -1}};
  ck_assert_ptr_null(ps_reshape(x, &s));
  expect_graph_error(g, "Only one input size may be -1, not both 0 and 1");
  ps_graph_destroy(g);
}
END_TEST

START_TEST(concat) {
  ps_graph *g = ps_graph_create();
  ps_node *a = cst(g, PS_DT_DOUBLE, 2, D(2, 2), V(1, 2, 3, 4));
  ps_node *b = cst(g, PS_DT_DOUBLE, 2, D(1, 2), V(5, 6));
  ps_node *c = cst(g, PS_DT_DOUBLE, 2, D(2, 1), V(7, 8));
  ps_node *ab[2] = {a, b};
  ps_node *c0 = ps_concat(ab, 2, 0);
  ck_assert_str_eq(ps_node_op(c0), "ConcatV2");
  expect_shape(c0, 2, D(3, 2));
  expect(run(g, c0), PS_DT_DOUBLE, 2, D(3, 2), V(1, 2, 3, 4, 5, 6), 0);
  ps_node *ac[3] = {a, c, a};
  ps_node *c1 = ps_concat(ac, 3, 1);
  expect_shape(c1, 2, D(2, 5));
  expect(run(g, c1), PS_DT_DOUBLE, 2, D(2, 5), V(1, 2, 7, 1, 2, 3, 4, 8, 3, 4), 0);
  expect(run(g, ps_concat(ac, 3, -1)), PS_DT_DOUBLE, 2, D(2, 5),
         V(1, 2, 7, 1, 2, 3, 4, 8, 3, 4), 0);
  /* int64, with an unknown batch */
  ps_node *p = ph(g, PS_DT_INT64, 1, D(-1));
  ps_node *q = cst(g, PS_DT_INT64, 1, D(2), V(9, 10));
  ps_node *pq[2] = {p, q};
  ps_node *c2 = ps_concat(pq, 2, 0);
  expect_shape(c2, 1, D(-1));
  ps_tensor *pv = make_tensor(PS_DT_INT64, 1, D(1), V(-4));
  ps_feed f = {p, pv};
  ps_status st;
  ps_tensor *out = run_feeds(g, c2, &f, 1, &st);
  ck_assert_ptr_nonnull(out);
  expect(out, PS_DT_INT64, 1, D(3), V(-4, 9, 10), 0);
  ps_tensor_destroy(pv);
  /* errors */
  ck_assert_ptr_null(ps_concat(ab, 2, 1));
  expect_graph_error(g,
                     "ConcatOp : Dimensions of inputs should match: shape[0] = [2,2] vs. "
                     "shape[1] = [1,2]");
  ps_graph_destroy(g);
  g = ps_graph_create();
  a = cst(g, PS_DT_DOUBLE, 2, D(2, 2), NULL);
  ps_node *aa[2] = {a, a};
  ck_assert_ptr_null(ps_concat(aa, 2, 2));
  expect_graph_error(g,
                     "Expected concatenating dimensions in the range [-2, 2), but got 2");
  ps_graph_destroy(g);
}
END_TEST

START_TEST(gather) {
  ps_graph *g = ps_graph_create();
  ps_node *params = cst(g, PS_DT_FLOAT, 2, D(3, 2), V(1, 2, 3, 4, 5, 6));
  ps_node *idx = cst(g, PS_DT_INT64, 1, D(4), V(2, 0, 2, 1));
  ps_node *y = ps_gather(params, idx);
  ck_assert_str_eq(ps_node_op(y), "GatherV2");
  expect_shape(y, 2, D(4, 2));
  expect(run(g, y), PS_DT_FLOAT, 2, D(4, 2), V(5, 6, 1, 2, 5, 6, 3, 4), 0);
  /* 2-D int32 indices into a vector */
  ps_node *vec = cst(g, PS_DT_DOUBLE, 1, D(3), V(10, 20, 30));
  ps_node *i2 = cst(g, PS_DT_INT32, 2, D(2, 2), V(0, 1, 2, 2));
  ps_node *y2 = ps_gather(vec, i2);
  expect_shape(y2, 2, D(2, 2));
  expect(run(g, y2), PS_DT_DOUBLE, 2, D(2, 2), V(10, 20, 30, 30), 0);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(gather_out_of_range) {
  ps_graph *g = ps_graph_create();
  ps_node *params = cst(g, PS_DT_FLOAT, 2, D(2, 3), NULL);
  ps_node *idx = ph(g, PS_DT_INT32, 1, D(-1));
  ps_node *y = ps_gather(params, idx);
  ps_tensor *iv = make_tensor(PS_DT_INT32, 1, D(3), V(0, 7, 1));
  ps_feed f = {idx, iv};
  ps_status st;
  ck_assert_ptr_null(run_feeds(g, y, &f, 1, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "indices[1] = 7 is not in [0, 2)") != NULL, "%s", st.msg);
  ps_tensor_destroy(iv);
  ps_node *i2 = ph(g, PS_DT_INT64, 2, D(2, 2));
  ps_node *y2 = ps_gather(params, i2);
  iv = make_tensor(PS_DT_INT64, 2, D(2, 2), V(0, 1, -1, 0));
  f = (ps_feed){i2, iv};
  ck_assert_ptr_null(run_feeds(g, y2, &f, 1, &st));
  ck_assert_msg(strstr(st.msg, "indices[1,0] = -1 is not in [0, 2)") != NULL, "%s",
                st.msg);
  ps_tensor_destroy(iv);
  ck_assert_ptr_null(ps_gather(params, cst(g, PS_DT_FLOAT, 1, D(1), NULL)));
  expect_graph_error(g,
                     "GatherV2: Value for attr 'Tindices' of float is not in the list of "
                     "allowed values: int32, int64");
  ps_graph_destroy(g);
}
END_TEST

START_TEST(argmax) {
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_FLOAT, 2, D(2, 3), V(1, 9, 3, 7, 5, 7));
  ps_node *a1 = ps_argmax(x, 1);
  ck_assert_str_eq(ps_node_op(a1), "ArgMax");
  ck_assert_int_eq(ps_node_dtype(a1), PS_DT_INT64);
  expect_shape(a1, 1, D(2));
  /* ties go to the first */
  expect(run(g, a1), PS_DT_INT64, 1, D(2), V(1, 0), 0);
  expect(run(g, ps_argmax(x, 0)), PS_DT_INT64, 1, D(3), V(1, 0, 1), 0);
  expect(run(g, ps_argmax(x, -1)), PS_DT_INT64, 1, D(2), V(1, 0), 0);
  ps_node *xi = cst(g, PS_DT_INT32, 1, D(4), V(-5, -2, -9, -2));
  expect(run(g, ps_argmax(xi, 0)), PS_DT_INT64, 0, NULL, V(1), 0);
  ck_assert_ptr_null(ps_argmax(x, 2));
  expect_graph_error(g, "ArgMax: Expected dimension in the range [-2, 2), but got 2");
  ps_graph_destroy(g);
}
END_TEST

START_TEST(equal) {
  ps_graph *g = ps_graph_create();
  ps_node *a = cst(g, PS_DT_INT64, 2, D(2, 2), V(1, 2, 3, 4));
  ps_node *b = cst(g, PS_DT_INT64, 1, D(2), V(1, 4));
  ps_node *e = ps_equal(a, b);
  ck_assert_str_eq(ps_node_op(e), "Equal");
  ck_assert_int_eq(ps_node_dtype(e), PS_DT_BOOL);
  expect(run(g, e), PS_DT_BOOL, 2, D(2, 2), V(1, 0, 0, 1), 0);
  ps_node *f = cst(g, PS_DT_FLOAT, 1, D(3), V(0.5, -0.0, 2));
  ps_node *f2 = cst(g, PS_DT_FLOAT, 1, D(3), V(0.5, 0.0, 3));
  expect(run(g, ps_equal(f, f2)), PS_DT_BOOL, 1, D(3), V(1, 1, 0), 0);
  /* accuracy: equal(argmax(logits), labels) */
  ps_node *logits = cst(g, PS_DT_FLOAT, 2, D(3, 2), V(1, 2, 3, 0, 0, 1));
  ps_node *labels = cst(g, PS_DT_INT64, 1, D(3), V(1, 1, 1));
  ps_node *acc = ps_reduce_mean(
      ps_cast(ps_equal(ps_argmax(logits, 1), labels), PS_DT_FLOAT), PS_ALL_AXES, false);
  expect(run(g, acc), PS_DT_FLOAT, 0, NULL, V(2.0 / 3), 1e-7);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(cast) {
  ps_graph *g = ps_graph_create();
  ps_node *x = cst(g, PS_DT_FLOAT, 1, D(5), V(-1.7, 2.9, 0, 1e20, 0.25));
  ps_node *c = ps_cast(x, PS_DT_INT32);
  ck_assert_str_eq(ps_node_op(c), "Cast");
  ck_assert_int_eq(ps_node_dtype(c), PS_DT_INT32);
  ps_tensor *t = run(g, c);
  ck_assert_int_eq(t->dtype, PS_DT_INT32);
  int32_t *iv = ps_tensor_data(t);
  ck_assert_int_eq(iv[0], -1);
  ck_assert_int_eq(iv[1], 2);
  ck_assert_int_eq(iv[2], 0);
  ck_assert_int_eq(iv[4], 0);
  ps_tensor_destroy(t);
  expect(run(g, ps_cast(x, PS_DT_BOOL)), PS_DT_BOOL, 1, D(5), V(1, 1, 0, 1, 1), 0);
  expect(run(g, ps_cast(x, PS_DT_DOUBLE)), PS_DT_DOUBLE, 1, D(5),
         V(-1.7f, 2.9f, 0, 1e20f, 0.25), 0);
  ps_node *i = cst(g, PS_DT_INT64, 1, D(3), V(-3, 300, 7));
  expect(run(g, ps_cast(i, PS_DT_FLOAT)), PS_DT_FLOAT, 1, D(3), V(-3, 300, 7), 0);
  expect(run(g, ps_cast(i, PS_DT_UINT8)), PS_DT_UINT8, 1, D(3), V(253, 44, 7), 0);
  expect(run(g, ps_cast(i, PS_DT_INT64)), PS_DT_INT64, 1, D(3), V(-3, 300, 7), 0);
  ps_node *bo = cst(g, PS_DT_BOOL, 1, D(2), V(1, 0));
  expect(run(g, ps_cast(bo, PS_DT_DOUBLE)), PS_DT_DOUBLE, 1, D(2), V(1, 0), 0);
  ps_node *h = ps_cast(cst(g, PS_DT_DOUBLE, 1, D(2), V(1.5, -2)), PS_DT_HALF);
  expect(run(g, ps_cast(h, PS_DT_FLOAT)), PS_DT_FLOAT, 1, D(2), V(1.5, -2), 0);
  ps_graph_destroy(g);
}
END_TEST

/* ---- static errors ---- */

START_TEST(shape_and_type_errors) {
  ps_graph *g = ps_graph_create();
  ps_node *a = cst(g, PS_DT_FLOAT, 2, D(2, 3), NULL);
  ps_node *b = cst(g, PS_DT_FLOAT, 1, D(4), NULL);
  ck_assert_ptr_null(ps_add(a, b));
  expect_graph_error(g, "Add: Incompatible shapes: [2,3] vs. [4]");
  /* later constructors given NULL inputs return NULL; the first error stays */
  ck_assert_ptr_null(ps_relu(ps_add(a, b)));
  expect_graph_error(g, "Add: Incompatible shapes: [2,3] vs. [4]");
  ps_graph_destroy(g);

  g = ps_graph_create();
  a = cst(g, PS_DT_FLOAT, 2, D(2, 3), NULL);
  ps_node *m = cst(g, PS_DT_FLOAT, 2, D(4, 5), NULL);
  ck_assert_ptr_null(ps_matmul(a, m, false, false));
  expect_graph_error(g, "MatMul: Matrix size-incompatible: In[0]: [2,3], In[1]: [4,5]");
  ps_graph_destroy(g);

  g = ps_graph_create();
  a = cst(g, PS_DT_FLOAT, 2, D(2, 3), NULL);
  ck_assert_ptr_null(ps_mul(a, cst(g, PS_DT_INT32, 0, NULL, V(2))));
  expect_graph_error(g, "Input 'y' of 'Mul' Op has type int32 that does not match type "
                        "float of argument 'x'.");
  ps_graph_destroy(g);

  g = ps_graph_create();
  ck_assert_ptr_null(ps_relu(cst(g, PS_DT_INT32, 1, D(2), NULL)));
  expect_graph_error(g, "Relu: Value for attr 'T' of int32 is not in the list of allowed "
                        "values: half, bfloat16, float, double");
  ps_graph_destroy(g);

  g = ps_graph_create();
  ck_assert_ptr_null(ps_matmul(cst(g, PS_DT_FLOAT, 1, D(3), NULL),
                               cst(g, PS_DT_FLOAT, 2, D(3, 1), NULL), false, false));
  expect_graph_error(g, "MatMul: Shape must be rank 2 but is rank 1");
  ps_graph_destroy(g);

  /* unknown dims pass statically; the run-time check names both shapes */
  g = ps_graph_create();
  ps_node *p = ph(g, PS_DT_FLOAT, 2, D(-1, 3));
  ps_node *q = ph(g, PS_DT_FLOAT, 2, D(-1, 3));
  ps_node *s = ps_add(p, q);
  expect_shape(s, 2, D(-1, 3));
  ps_tensor *pv = make_tensor(PS_DT_FLOAT, 2, D(2, 3), NULL);
  ps_tensor *qv = make_tensor(PS_DT_FLOAT, 2, D(4, 3), NULL);
  ps_feed f[2] = {{p, pv}, {q, qv}};
  ps_status st;
  ck_assert_ptr_null(run_feeds(g, s, f, 2, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "Incompatible shapes: [2,3] vs. [4,3]");
  ps_tensor_destroy(pv);
  ps_tensor_destroy(qv);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(static_shapes_with_unknown_batch) {
  ps_graph *g = ps_graph_create();
  ps_node *x = ph(g, PS_DT_FLOAT, 2, D(-1, 784));
  ps_node *w = cst(g, PS_DT_FLOAT, 2, D(784, 10), NULL);
  ps_node *b = cst(g, PS_DT_FLOAT, 1, D(10), NULL);
  ps_node *logits = ps_bias_add(ps_matmul(x, w, false, false), b);
  expect_shape(logits, 2, D(-1, 10));
  expect_shape(ps_softmax(logits), 2, D(-1, 10));
  expect_shape(ps_argmax(logits, 1), 1, D(-1));
  ps_node *labels = ph(g, PS_DT_INT64, 1, D(-1));
  ps_node *loss = ps_sparse_softmax_cross_entropy_with_logits(labels, logits);
  expect_shape(loss, 1, D(-1));
  expect_shape(ps_reduce_mean(loss, PS_ALL_AXES, false), 0, NULL);
  expect_shape(ps_add(logits, ps_scalar(g, PS_DT_FLOAT, 1)), 2, D(-1, 10));
  ps_node *emb = cst(g, PS_DT_FLOAT, 2, D(100, 8), NULL);
  expect_shape(ps_gather(emb, labels), 2, D(-1, 8));
  PS_ASSERT_OK(ps_graph_status(g)->code, *ps_graph_status(g));
  ps_graph_destroy(g);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, add_sub_mul_div_same_shape);
  tcase_add_test(tc, broadcasting);
  tcase_add_test(tc, integer_arithmetic);
  tcase_add_test(tc, activations);
  tcase_add_test(tc, matmul_with_transposes);
  tcase_add_test(tc, matmul_unknown_batch_and_empty);
  tcase_add_test(tc, bias_add);
  tcase_add_test(tc, softmax_and_log_softmax);
  tcase_add_test(tc, sparse_xent);
  tcase_add_test(tc, sparse_xent_label_out_of_range);
  tcase_add_test(tc, mean_squared_error);
  tcase_add_test(tc, reduce_sum_and_mean);
  tcase_add_test(tc, reduce_unknown_shapes);
  tcase_add_test(tc, reshape);
  tcase_add_test(tc, concat);
  tcase_add_test(tc, gather);
  tcase_add_test(tc, gather_out_of_range);
  tcase_add_test(tc, argmax);
  tcase_add_test(tc, equal);
  tcase_add_test(tc, cast);
  tcase_add_test(tc, shape_and_type_errors);
  tcase_add_test(tc, static_shapes_with_unknown_batch);
  tcase_add_test(tc, conv2d_values_and_shapes);
  tcase_add_test(tc, random_ops_follow_the_seed_rules);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
