/* Unit tests for the optimizer kernels (common/kernels.c) without a ps:
 * every optimizer, dense and sparse, float and double, against values
 * computed here from TensorFlow's formulas (training_ops.cc and the Python
 * optimizers' sparse paths), and the cases ps_kernel_apply refuses. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/kernels.h"
#include "tests/support/assert.h"

#define NEAR(a, b, tol)                                                                  \
  ck_assert_msg(fabs((double)(a) - (double)(b)) <= (tol), "%s = %.9g, want %.9g", #a,    \
                (double)(a), (double)(b))

static ps_kernel_args dense(ps_opt_kind opt, ps_dtype dt, void *var, int64_t n,
                            const void *grad, const double *hp) {
  ps_kernel_args a = {0};
  a.opt = opt;
  a.dtype = dt;
  a.var = var;
  a.var_elems = n;
  a.row_elems = n;
  a.grad = grad;
  a.hparams = hp;
  return a;
}

START_TEST(gradient_descent_dense_and_sparse) {
  float var[2] = {1.0f, 2.0f}, g[2] = {0.5f, -1.0f};
  double lr[1] = {0.1};
  ps_kernel_args a = dense(PS_OPT_GRADIENT_DESCENT, PS_DT_FLOAT, var, 2, g, lr);
  ck_assert_int_eq(ps_kernel_apply(&a), 0);
  NEAR(var[0], 0.95, 1e-7);
  NEAR(var[1], 2.1, 1e-6);
  /* sparse: rows 2 and 0 of a 3x2 variable, int32 indices */
  double v3[6] = {1, 1, 2, 2, 3, 3}, rows[4] = {1, 2, 10, 20};
  int32_t idx[2] = {2, 0};
  ps_kernel_args s = dense(PS_OPT_GRADIENT_DESCENT, PS_DT_DOUBLE, v3, 6, rows, lr);
  s.row_elems = 2;
  s.sparse = true;
  s.indices = idx;
  s.index_size = 4;
  s.nindices = 2;
  ck_assert_int_eq(ps_kernel_apply(&s), 0);
  NEAR(v3[4], 3 - 0.1, 1e-15);
  NEAR(v3[5], 3 - 0.2, 1e-15);
  NEAR(v3[0], 1 - 1.0, 1e-15);
  NEAR(v3[1], 1 - 2.0, 1e-15);
  NEAR(v3[2], 2, 0); /* row 1 untouched */
  NEAR(v3[3], 2, 0);
}
END_TEST

START_TEST(momentum_plain_and_nesterov) {
  const double lr = 0.5, mom = 0.9;
  double hp[2] = {lr, mom};
  for (int nesterov = 0; nesterov < 2; nesterov++) {
    double var[1] = {1.0}, acc[1] = {0.0}, g[1] = {0.2};
    double want_var = 1.0, want_acc = 0.0;
    ps_kernel_args a = dense(PS_OPT_MOMENTUM, PS_DT_DOUBLE, var, 1, g, hp);
    a.slots[0] = acc;
    a.use_nesterov = nesterov;
    for (int step = 0; step < 3; step++) {
      ck_assert_int_eq(ps_kernel_apply(&a), 0);
      want_acc = want_acc * mom + g[0];
      want_var -= nesterov ? g[0] * lr + want_acc * mom * lr : want_acc * lr;
      NEAR(acc[0], want_acc, 1e-15);
      NEAR(var[0], want_var, 1e-15);
    }
  }
  /* sparse nesterov (SparseApplyMomentum accepts it), int64 indices */
  float var[4] = {1, 1, 1, 1}, acc[4] = {0}, g[2] = {0.2f, 0.4f};
  int64_t idx[2] = {3, 1};
  ps_kernel_args s = dense(PS_OPT_MOMENTUM, PS_DT_FLOAT, var, 4, g, hp);
  s.slots[0] = acc;
  s.row_elems = 1;
  s.sparse = true;
  s.indices = idx;
  s.index_size = 8;
  s.nindices = 2;
  s.use_nesterov = true;
  ck_assert_int_eq(ps_kernel_apply(&s), 0);
  NEAR(acc[3], 0.2, 1e-7);
  NEAR(var[3], 1 - (lr * 0.2 + lr * mom * 0.2), 1e-6);
  NEAR(acc[1], 0.4, 1e-7);
  NEAR(var[0], 1, 0);
  NEAR(acc[0], 0, 0);
}
END_TEST

START_TEST(adagrad_dense_and_both_sparse_paths) {
  double hp[1] = {0.1};
  double var[2] = {1, 2}, acc[2] = {0.1, 0.1}, g[2] = {0.3, -0.2};
  ps_kernel_args a = dense(PS_OPT_ADAGRAD, PS_DT_DOUBLE, var, 2, g, hp);
  a.slots[0] = acc;
  ck_assert_int_eq(ps_kernel_apply(&a), 0);
  NEAR(acc[0], 0.1 + 0.09, 1e-15);
  NEAR(var[0], 1 - 0.1 * 0.3 / sqrt(0.19), 1e-15);
  NEAR(var[1], 2 + 0.1 * 0.2 / sqrt(0.14), 1e-15);
  /* sparse, rows of one element (TensorFlow divides by sqrt there) */
  float v1[3] = {1, 1, 1}, a1[3] = {0.1f, 0.1f, 0.1f}, g1[1] = {0.5f};
  int32_t i1[1] = {2};
  ps_kernel_args s = dense(PS_OPT_ADAGRAD, PS_DT_FLOAT, v1, 3, g1, hp);
  s.slots[0] = a1;
  s.row_elems = 1;
  s.sparse = true;
  s.indices = i1;
  s.index_size = 4;
  s.nindices = 1;
  ck_assert_int_eq(ps_kernel_apply(&s), 0);
  NEAR(a1[2], 0.35, 1e-6);
  NEAR(v1[2], 1 - 0.1 * 0.5 / sqrt(0.35), 1e-6);
  NEAR(v1[0], 1, 0);
  /* sparse, rows of two */
  double v2[4] = {1, 1, 1, 1}, a2[4] = {1, 1, 1, 1}, g2[2] = {1, 2};
  ps_kernel_args s2 = dense(PS_OPT_ADAGRAD, PS_DT_DOUBLE, v2, 4, g2, hp);
  s2.slots[0] = a2;
  s2.row_elems = 2;
  s2.sparse = true;
  int32_t i2[1] = {1};
  s2.indices = i2;
  s2.index_size = 4;
  s2.nindices = 1;
  ck_assert_int_eq(ps_kernel_apply(&s2), 0);
  NEAR(a2[2], 2, 1e-15);
  NEAR(a2[3], 5, 1e-15);
  NEAR(v2[2], 1 - 0.1 * 1 / sqrt(2.0), 1e-15);
  NEAR(v2[3], 1 - 0.1 * 2 / sqrt(5.0), 1e-15);
  NEAR(v2[0], 1, 0);
}
END_TEST

/* The first step of Adam: beta powers b1, b2. */
START_TEST(adam_dense_nesterov_and_sparse) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  double hp[6] = {lr, b1, b2, eps, b1, b2};
  const double alpha = lr * sqrt(1 - b2) / (1 - b1);
  for (int nesterov = 0; nesterov < 2; nesterov++) {
    double var[2] = {1, -1}, m[2] = {0}, v[2] = {0}, g[2] = {0.5, -0.25};
    ps_kernel_args a = dense(PS_OPT_ADAM, PS_DT_DOUBLE, var, 2, g, hp);
    a.slots[0] = m;
    a.slots[1] = v;
    a.use_nesterov = nesterov;
    ck_assert_int_eq(ps_kernel_apply(&a), 0);
    for (int i = 0; i < 2; i++) {
      double wm = (1 - b1) * g[i], wv = (1 - b2) * g[i] * g[i];
      double num = nesterov ? (g[i] * (1 - b1) + b1 * wm) : wm;
      NEAR(m[i], wm, 1e-15);
      NEAR(v[i], wv, 1e-15);
      NEAR(var[i], (i ? -1 : 1) - num * alpha / (sqrt(wv) + eps), 1e-12);
    }
  }
  /* sparse: m and v decay everywhere, the indexed rows get the gradient,
   * every element of var moves by its m */
  float var[3] = {1, 1, 1}, m[3] = {0.1f, 0.1f, 0.1f}, v[3] = {0.01f, 0.01f, 0.01f};
  float g[1] = {0.5f};
  int64_t idx[1] = {1};
  ps_kernel_args s = dense(PS_OPT_ADAM, PS_DT_FLOAT, var, 3, g, hp);
  s.slots[0] = m;
  s.slots[1] = v;
  s.row_elems = 1;
  s.sparse = true;
  s.indices = idx;
  s.index_size = 8;
  s.nindices = 1;
  ck_assert_int_eq(ps_kernel_apply(&s), 0);
  NEAR(m[0], 0.1 * b1, 1e-7);
  NEAR(m[1], 0.1 * b1 + 0.5 * (1 - b1), 1e-7);
  NEAR(v[1], 0.01 * b2 + 0.25 * (1 - b2), 1e-7);
  NEAR(var[0], 1 - alpha * (0.1 * b1) / (sqrt(0.01 * b2) + eps), 1e-6);
  NEAR(var[1], 1 - alpha * m[1] / (sqrt(v[1]) + eps), 1e-6);
}
END_TEST

START_TEST(refused_and_nothing_changes) {
  double hp[6] = {0.1, 0.9, 0.999, 1e-8, 0.9, 0.999};
  int32_t ivar[2] = {5, 6}, ig[2] = {1, 1};
  ps_kernel_args a = dense(PS_OPT_GRADIENT_DESCENT, PS_DT_INT32, ivar, 2, ig, hp);
  ck_assert_int_eq(ps_kernel_apply(&a), -1); /* no integer kernels */
  ck_assert_int_eq(ivar[0], 5);
  double var[1] = {1}, acc[1] = {0}, m[1] = {0}, g[1] = {1};
  ps_kernel_args b = dense((ps_opt_kind)PS_OPT_COUNT, PS_DT_DOUBLE, var, 1, g, hp);
  ck_assert_int_eq(ps_kernel_apply(&b), -1); /* no such optimizer */
  ps_kernel_args c = dense(PS_OPT_ADAGRAD, PS_DT_DOUBLE, var, 1, g, hp);
  c.slots[0] = acc;
  c.use_nesterov = true; /* Adagrad has no Nesterov */
  ck_assert_int_eq(ps_kernel_apply(&c), -1);
  ps_kernel_args d = dense(PS_OPT_ADAM, PS_DT_DOUBLE, var, 1, g, hp);
  d.slots[0] = m;
  d.slots[1] = acc;
  d.use_nesterov = true;
  d.sparse = true; /* SparseApplyAdam has no Nesterov */
  int64_t idx[1] = {0};
  d.indices = idx;
  d.index_size = 8;
  d.nindices = 1;
  d.row_elems = 1;
  ck_assert_int_eq(ps_kernel_apply(&d), -1);
  ck_assert(var[0] == 1 && acc[0] == 0 && m[0] == 0);
  ck_assert(ps_kernel_dtype_ok(PS_DT_FLOAT) && ps_kernel_dtype_ok(PS_DT_DOUBLE));
  ck_assert(!ps_kernel_dtype_ok(PS_DT_INT64));
}
END_TEST

START_TEST(optimizer_table) {
  ck_assert_ptr_null(ps_opt_info_get(-1));
  ck_assert_ptr_null(ps_opt_info_get(PS_OPT_COUNT));
  const ps_opt_info *m = ps_opt_info_get(PS_OPT_MOMENTUM);
  ck_assert_str_eq(m->op, "ApplyMomentum");
  ck_assert_str_eq(m->sparse_op, "SparseApplyMomentum");
  ck_assert_uint_eq(m->nslots, 1);
  ck_assert_uint_eq(m->nhparams, 2);
  const ps_opt_info *a = ps_opt_info_get(PS_OPT_ADAM);
  ck_assert_uint_eq(a->nslots, 2);
  ck_assert_uint_eq(a->nhparams, 6);
  ck_assert(a->nesterov && !a->sparse_nesterov);
  ck_assert_uint_eq(ps_opt_info_get(PS_OPT_GRADIENT_DESCENT)->nslots, 0);
  ck_assert_str_eq(ps_opt_info_get(PS_OPT_ADAGRAD)->slot_names, "accum");
}
END_TEST

int main(void) {
  Suite *s = suite_create("kernels");
  TCase *tc = tcase_create("kernels");
  tcase_add_test(tc, gradient_descent_dense_and_sparse);
  tcase_add_test(tc, momentum_plain_and_nesterov);
  tcase_add_test(tc, adagrad_dense_and_both_sparse_paths);
  tcase_add_test(tc, adam_dense_nesterov_and_sparse);
  tcase_add_test(tc, refused_and_nothing_changes);
  tcase_add_test(tc, optimizer_table);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
