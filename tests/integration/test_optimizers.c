/* Integration tests of the optimizer update ops (PS_APPLY_*): real
 * ps-server processes, the libpsworker client.
 *
 * Every kernel runs three steps, dense and sparse (with a duplicated
 * index), in float and double, and each element of the variable and its
 * slots is compared with a double-precision reference written here from
 * TensorFlow's formulas.  The reference casts the hyperparameters to the
 * variable's dtype first, as TensorFlow casts its scalar inputs; without
 * that, 1 - beta2 for beta2 = 0.999 alone differs by 1e-5 between float
 * and double.  Every validation error is checked by its text, and the
 * variable and its slots are read back unchanged afterwards. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "ps.pb-c.h"
#include "tests/support/assert.h"

static ps_harness H;
static ps_client *C;

static void setup(void) {
  C = harness_start_client(&H, 1, NULL);
  ck_assert_ptr_nonnull(C);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

/* ---- helpers ---- */

static ps_shape shape_of(int rank, const int64_t *dims) {
  ps_shape s = {.rank = rank};
  for (int i = 0; i < rank; i++)
    s.dim[i] = dims[i];
  return s;
}

static ps_tensor *tensor(ps_dtype dt, ps_shape s, const double *vals) {
  ps_tensor *t = ps_tensor_create(dt, &s, true);
  ck_assert_ptr_nonnull(t);
  int64_t n = ps_shape_num_elements(&s);
  for (int64_t i = 0; vals && i < n; i++)
    ps_elem_set(dt, ps_tensor_data(t), i, vals[i]);
  return t;
}

static ps_tensor *indices(ps_dtype dt, int64_t n, const int64_t *vals) {
  ps_shape s = {.rank = 1, .dim = {n}};
  ps_tensor *t = ps_tensor_create(dt, &s, true);
  for (int64_t i = 0; i < n; i++) {
    if (dt == PS_DT_INT32)
      ((int32_t *)ps_tensor_data(t))[i] = (int32_t)vals[i];
    else
      ((int64_t *)ps_tensor_data(t))[i] = vals[i];
  }
  return t;
}

static void create(const char *name, ps_dtype dt, ps_shape s) {
  ps_status st;
  ps_var_spec v = {.name = name, .dtype = dt, .shape = s};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &v, 1, &st), st);
}

static void assign(const char *name, ps_dtype dt, ps_shape s, const double *vals) {
  ps_tensor *t = tensor(dt, s, vals);
  ps_status st;
  ps_update u = {.name = name, .op = PS_ASSIGN, .value = t};
  ck_assert_msg(ps_client_update(C, 0, &u, 1, &st) == 0, "assign %s: %s", name, st.msg);
  ps_tensor_destroy(t);
}

/* Creates @name and assigns @vals. */
static void make(const char *name, ps_dtype dt, ps_shape s, const double *vals) {
  create(name, dt, s);
  assign(name, dt, s, vals);
}

static void fill(const char *name, ps_dtype dt, ps_shape s, double v) {
  int64_t n = ps_shape_num_elements(&s);
  double *vals = malloc((size_t)(n + 1) * sizeof *vals);
  for (int64_t i = 0; i < n; i++)
    vals[i] = v;
  make(name, dt, s, vals);
  free(vals);
}

/* Reads @name into a malloc'd array of doubles; checks dtype and shape. */
static double *read_var(const char *name, ps_dtype dt, ps_shape s) {
  ps_status st;
  ps_read r = {.name = name};
  ck_assert_msg(ps_client_read(C, 0, &r, 1, &st) == 0, "read %s: %s", name, st.msg);
  ck_assert_int_eq(r.out->dtype, dt);
  ck_assert_msg(ps_shape_equal(&r.out->shape, &s), "%s: shape changed", name);
  int64_t n = ps_shape_num_elements(&s);
  double *out = malloc((size_t)(n + 1) * sizeof *out);
  for (int64_t i = 0; i < n; i++)
    out[i] = ps_elem_get(dt, ps_tensor_data(r.out), i);
  ps_tensor_destroy(r.out);
  return out;
}

/* Every element of @name against @want: relative 1e-6 for float, 1e-12
 * for double. */
static void expect(const char *name, ps_dtype dt, ps_shape s, const double *want,
                   const char *what) {
  double *got = read_var(name, dt, s);
  double tol = dt == PS_DT_FLOAT ? 1e-6 : 1e-12;
  int64_t n = ps_shape_num_elements(&s);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(fabs(got[i] - want[i]) <= tol * fabs(want[i]) + 1e-30,
                  "%s: %s[%lld] = %.9g, want %.9g", what, name, (long long)i, got[i],
                  want[i]);
  free(got);
}

/* ---- the reference: TensorFlow's formulas in double ---- */

typedef struct ref {
  int64_t rows, cols; /* var as rows x cols */
  double *var, *s0, *s1;
} ref;

/* @hp already cast to the variable's dtype. */
static void ref_step(ref *r, ps_update_op op, bool nesterov, const double *g,
                     const int64_t *idx, int64_t nidx, const double *hp) {
  int64_t n = r->rows * r->cols, c = r->cols;
  double *var = r->var, *a = r->s0, *m = r->s0, *v = r->s1;
  switch (op) {
  case PS_APPLY_GRADIENT_DESCENT:
    if (idx == NULL)
      for (int64_t i = 0; i < n; i++)
        var[i] -= hp[0] * g[i];
    else
      for (int64_t k = 0; k < nidx; k++)
        for (int64_t j = 0; j < c; j++)
          var[idx[k] * c + j] -= hp[0] * g[k * c + j];
    break;
  case PS_APPLY_MOMENTUM:
  case PS_APPLY_ADAGRAD:
    for (int64_t k = 0; k < (idx ? nidx : n); k++)
      for (int64_t j = 0; j < (idx ? c : 1); j++) {
        int64_t e = idx ? idx[k] * c + j : k; /* element of var */
        double gg = idx ? g[k * c + j] : g[k];
        if (op == PS_APPLY_ADAGRAD) {
          a[e] += gg * gg;
          var[e] -= hp[0] * gg / sqrt(a[e]);
        } else {
          a[e] = a[e] * hp[1] + gg;
          var[e] -= nesterov ? gg * hp[0] + a[e] * hp[1] * hp[0] : hp[0] * a[e];
        }
      }
    break;
  case PS_APPLY_ADAM: {
    double lr = hp[0], b1 = hp[1], b2 = hp[2], eps = hp[3];
    double alpha = lr * sqrt(1 - hp[5]) / (1 - hp[4]);
    if (idx == NULL) {
      for (int64_t i = 0; i < n; i++) {
        m[i] += (g[i] - m[i]) * (1 - b1);
        v[i] += (g[i] * g[i] - v[i]) * (1 - b2);
        double num = nesterov ? g[i] * (1 - b1) + b1 * m[i] : m[i];
        var[i] -= num * alpha / (sqrt(v[i]) + eps);
      }
      break;
    }
    for (int64_t i = 0; i < n; i++)
      m[i] *= b1;
    for (int64_t k = 0; k < nidx; k++)
      for (int64_t j = 0; j < c; j++)
        m[idx[k] * c + j] += g[k * c + j] * (1 - b1);
    for (int64_t i = 0; i < n; i++)
      v[i] *= b2;
    for (int64_t k = 0; k < nidx; k++)
      for (int64_t j = 0; j < c; j++) {
        double gg = g[k * c + j];
        v[idx[k] * c + j] += gg * gg * (1 - b2);
      }
    for (int64_t i = 0; i < n; i++)
      var[i] -= alpha * m[i] / (sqrt(v[i]) + eps);
    break;
  }
  default:
    ck_abort_msg("not an optimizer op");
  }
}

/* ---- three steps of each kernel against the reference ---- */

typedef struct opt_case {
  ps_update_op op;
  bool nesterov;
  bool sparse;
} opt_case;

static const opt_case cases[] = {
    {PS_APPLY_GRADIENT_DESCENT, false, false},
    {PS_APPLY_GRADIENT_DESCENT, false, true},
    {PS_APPLY_MOMENTUM, false, false},
    {PS_APPLY_MOMENTUM, false, true},
    {PS_APPLY_MOMENTUM, true, false},
    {PS_APPLY_MOMENTUM, true, true},
    {PS_APPLY_ADAGRAD, false, false},
    {PS_APPLY_ADAGRAD, false, true},
    {PS_APPLY_ADAM, false, false},
    {PS_APPLY_ADAM, false, true},
    {PS_APPLY_ADAM, true, false},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* Slot names and initial values as TensorFlow's optimizers make them. */
static size_t slots_of(ps_update_op op, const char *var, char names[2][64],
                       double init[2]) {
  switch (op) {
  case PS_APPLY_MOMENTUM:
    snprintf(names[0], 64, "%s/Momentum", var);
    init[0] = 0;
    return 1;
  case PS_APPLY_ADAGRAD:
    snprintf(names[0], 64, "%s/Adagrad", var);
    init[0] = 0.1; /* initial_accumulator_value */
    return 1;
  case PS_APPLY_ADAM:
    snprintf(names[0], 64, "%s/Adam", var);
    snprintf(names[1], 64, "%s/Adam_1", var);
    init[0] = init[1] = 0;
    return 2;
  default:
    return 0;
  }
}

/* Hyperparameters of step @t (from 1); Adam's beta powers are beta^t. */
static size_t hparams_of(ps_update_op op, int t, double hp[6]) {
  switch (op) {
  case PS_APPLY_GRADIENT_DESCENT:
    hp[0] = 0.1;
    return 1;
  case PS_APPLY_MOMENTUM:
    hp[0] = 0.05;
    hp[1] = 0.9;
    return 2;
  case PS_APPLY_ADAGRAD:
    hp[0] = 0.3;
    return 1;
  default:
    hp[0] = 0.01;
    hp[1] = 0.9;
    hp[2] = 0.999;
    hp[3] = 1e-8;
    hp[4] = pow(0.9, t);
    hp[5] = pow(0.999, t);
    return 6;
  }
}

/* A value of @dt, as a double. */
static double as_dtype(ps_dtype dt, double v) {
  return dt == PS_DT_FLOAT ? (double)(float)v : v;
}

/* Runs case @c on a variable of shape @s in dtype @dt for 3 steps and
 * compares after each.  Sparse gradients use rows {2, 0, 2} (duplicate). */
static void run_case(const opt_case *c, ps_dtype dt, const char *name, ps_shape s,
                     ps_dtype index_dt) {
  int64_t rows = s.rank ? s.dim[0] : 1;
  int64_t n = ps_shape_num_elements(&s), cols = n / rows;
  ref r = {rows, cols, calloc((size_t)n, 8), calloc((size_t)n, 8), calloc((size_t)n, 8)};
  for (int64_t i = 0; i < n; i++)
    r.var[i] = as_dtype(dt, 1.0 + 0.37 * (double)i);
  make(name, dt, s, r.var);
  char snames[2][64];
  double sinit[2];
  size_t ns = slots_of(c->op, name, snames, sinit);
  const char *slots[2] = {snames[0], snames[1]};
  double *sv[2] = {r.s0, r.s1};
  for (size_t k = 0; k < ns; k++) {
    for (int64_t i = 0; i < n; i++)
      sv[k][i] = sinit[k];
    fill(snames[k], dt, s, sinit[k]);
  }
  const int64_t idx[3] = {2, 0, 2};
  int64_t nidx = c->sparse ? 3 : 0, grows = c->sparse ? nidx : rows;
  ps_shape gs = s;
  if (c->sparse) gs.dim[0] = nidx;
  double *g = calloc((size_t)(grows * cols), 8);
  ps_tensor *ti = c->sparse ? indices(index_dt, nidx, idx) : NULL;
  for (int t = 1; t <= 3; t++) {
    /* |g| >= 0.2 and each element keeps its sign across steps, so no
     * slot cancels towards zero (where a relative check would measure
     * float's cancellation, not the kernel); signs vary across elements. */
    for (int64_t i = 0; i < grows * cols; i++)
      g[i] =
          as_dtype(dt, (i % 3 == 0 ? -1 : 1) * (0.2 + 0.13 * (double)((i * 7 + t) % 5)));
    double hp[6], hpt[6];
    size_t nh = hparams_of(c->op, t, hp);
    for (size_t k = 0; k < nh; k++)
      hpt[k] = as_dtype(dt, hp[k]);
    ps_tensor *tg = tensor(dt, gs, g);
    ps_update u = {.name = name,
                   .op = c->op,
                   .value = tg,
                   .indices = ti,
                   .slots = ns ? slots : NULL,
                   .nslots = ns,
                   .hparams = hp,
                   .nhparams = nh,
                   .use_nesterov = c->nesterov};
    ps_status st;
    ck_assert_msg(ps_client_update(C, 0, &u, 1, &st) == 0, "step %d: %s", t, st.msg);
    ps_tensor_destroy(tg);
    ref_step(&r, c->op, c->nesterov, g, c->sparse ? idx : NULL, nidx, hpt);
    char what[128];
    snprintf(what, sizeof what, "op %d%s%s %s step %d", (int)c->op,
             c->nesterov ? " nesterov" : "", c->sparse ? " sparse" : " dense",
             ps_dtype_name(dt), t);
    expect(name, dt, s, r.var, what);
    for (size_t k = 0; k < ns; k++)
      expect(snames[k], dt, s, sv[k], what);
  }
  ps_tensor_destroy(ti);
  free(g);
  free(r.var);
  free(r.s0);
  free(r.s1);
}

START_TEST(kernels_match_tensorflow_formulas) {
  const opt_case *c = &cases[_i];
  const int64_t dims[2] = {4, 3};
  ps_shape s = shape_of(2, dims);
  run_case(c, PS_DT_FLOAT, "wf", s, PS_DT_INT64);
  run_case(c, PS_DT_DOUBLE, "wd", s, PS_DT_INT32);
  /* A 1-D variable (one element per row: SparseApplyAdagrad's own path). */
  const int64_t d1[1] = {5};
  run_case(c, PS_DT_FLOAT, "vf", shape_of(1, d1), PS_DT_INT32);
}
END_TEST

START_TEST(dense_update_of_a_scalar) {
  opt_case c = {PS_APPLY_ADAM, false, false};
  run_case(&c, PS_DT_FLOAT, "scalar", shape_of(0, NULL), PS_DT_INT64);
}
END_TEST

/* Above 64 KiB the gradient and its indices stream in chunks. */
START_TEST(large_sparse_gradient_streams_in_chunks) {
  const int64_t dims[2] = {1000, 64};
  ps_shape s = shape_of(2, dims);
  double *init = calloc(64000, 8);
  for (int i = 0; i < 64000; i++)
    init[i] = 1.0 + (double)(i % 17) / 16;
  make("emb", PS_DT_FLOAT, s, init);
  fill("emb/Momentum", PS_DT_FLOAT, s, 0);
  int64_t idx[300];
  for (int k = 0; k < 300; k++)
    idx[k] = (k * 7919) % 1000;
  idx[299] = idx[0]; /* a duplicate */
  ps_shape gs = s;
  gs.dim[0] = 300;
  double *g = calloc(300 * 64, 8);
  for (int i = 0; i < 300 * 64; i++)
    g[i] = (double)((i % 9) - 4) / 8;
  ps_tensor *tg = tensor(PS_DT_FLOAT, gs, g), *ti = indices(PS_DT_INT64, 300, idx);
  const char *slots[1] = {"emb/Momentum"};
  double hp[2] = {0.5, 0.75};
  ps_update u = {.name = "emb",
                 .op = PS_APPLY_MOMENTUM,
                 .value = tg,
                 .indices = ti,
                 .slots = slots,
                 .nslots = 1,
                 .hparams = hp,
                 .nhparams = 2};
  ps_status st;
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  double *acc = calloc(64000, 8);
  ref r = {1000, 64, init, acc, NULL};
  ref_step(&r, PS_APPLY_MOMENTUM, false, g, idx, 300, hp);
  ref_step(&r, PS_APPLY_MOMENTUM, false, g, idx, 300, hp);
  expect("emb", PS_DT_FLOAT, s, init, "large sparse momentum");
  expect("emb/Momentum", PS_DT_FLOAT, s, acc, "large sparse momentum");
  ps_tensor_destroy(tg);
  ps_tensor_destroy(ti);
  free(g);
  free(acc);
  free(init);
}
END_TEST

/* Concurrent updates of one variable and its slot serialize: with
 * momentum 1 and gradient 1, N steps in any order leave accum = N and
 * var = -N(N+1)/2 only if no step interleaves with another. */
enum { NTHREADS = 4, NSTEPS = 50 };

static void *momentum_worker(void *arg) {
  const ps_tensor *g = arg;
  const char *slots[1] = {"c/Momentum"};
  double hp[2] = {1, 1};
  ps_update u = {.name = "c",
                 .op = PS_APPLY_MOMENTUM,
                 .value = g,
                 .slots = slots,
                 .nslots = 1,
                 .hparams = hp,
                 .nhparams = 2};
  for (int i = 0; i < NSTEPS; i++) {
    ps_status st;
    if (ps_client_update(C, 0, &u, 1, &st) != 0) return strdup(st.msg);
  }
  return NULL;
}

START_TEST(concurrent_updates_lock_variable_and_slots) {
  const int64_t dims[1] = {8};
  ps_shape s = shape_of(1, dims);
  fill("c", PS_DT_DOUBLE, s, 0);
  fill("c/Momentum", PS_DT_DOUBLE, s, 0);
  double ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  ps_tensor *g = tensor(PS_DT_DOUBLE, s, ones);
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, momentum_worker, g), 0);
  for (int i = 0; i < NTHREADS; i++) {
    void *err;
    pthread_join(th[i], &err);
    ck_assert_msg(err == NULL, "%s", (char *)err);
  }
  const double N = NTHREADS * NSTEPS;
  double want_acc[8], want_var[8];
  for (int i = 0; i < 8; i++) {
    want_acc[i] = N;
    want_var[i] = -N * (N + 1) / 2;
  }
  expect("c", PS_DT_DOUBLE, s, want_var, "concurrent momentum");
  expect("c/Momentum", PS_DT_DOUBLE, s, want_acc, "concurrent momentum");
  ps_tensor_destroy(g);
}
END_TEST

/* A slot assigned earlier in the same request is initialized for the
 * optimizer update that follows it. */
START_TEST(batch_assigns_slot_then_applies) {
  const int64_t dims[2] = {2, 3};
  ps_shape s = shape_of(2, dims);
  double w0[6] = {1, 2, 3, 4, 5, 6}, a0[6] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
  double g0[6] = {1, -1, 2, -2, 0.5, -0.5};
  make("w", PS_DT_FLOAT, s, w0);
  create("w/Momentum", PS_DT_FLOAT, s);
  ps_tensor *ta = tensor(PS_DT_FLOAT, s, a0), *tg = tensor(PS_DT_FLOAT, s, g0);
  const char *slots[1] = {"w/Momentum"};
  double hp[2] = {0.25, 0.5};
  ps_update u[2] = {{.name = "w/Momentum", .op = PS_ASSIGN, .value = ta},
                    {.name = "w",
                     .op = PS_APPLY_MOMENTUM,
                     .value = tg,
                     .slots = slots,
                     .nslots = 1,
                     .hparams = hp,
                     .nhparams = 2}};
  ps_status st;
  PS_ASSERT_OK(ps_client_update(C, 0, u, 2, &st), st);
  ref r = {2, 3, w0, a0, NULL};
  ref_step(&r, PS_APPLY_MOMENTUM, false, g0, NULL, 0, hp);
  expect("w", PS_DT_FLOAT, s, w0, "assign then apply");
  expect("w/Momentum", PS_DT_FLOAT, s, a0, "assign then apply");
  ps_tensor_destroy(ta);
  ps_tensor_destroy(tg);
}
END_TEST

/* ---- validation errors: nothing changes ---- */

static const double W0[6] = {0, 1, 2, 3, 4, 5};
static ps_shape S23, S3;

static void errors_setup(void) {
  setup();
  const int64_t d23[2] = {2, 3}, d3[1] = {3};
  S23 = shape_of(2, d23);
  S3 = shape_of(1, d3);
  double m0[6] = {10, 11, 12, 13, 14, 15};
  make("w", PS_DT_FLOAT, S23, W0);
  make("w/Momentum", PS_DT_FLOAT, S23, m0);
  fill("w/Adam", PS_DT_FLOAT, S23, 0.25);
  fill("w/Adam_1", PS_DT_FLOAT, S23, 0.5);
  fill("w/Md", PS_DT_DOUBLE, S23, 1); /* wrong dtype */
  fill("w/Ms", PS_DT_FLOAT, S3, 1);   /* wrong shape */
  create("w/Mu", PS_DT_FLOAT, S23);   /* uninitialized */
  create("u", PS_DT_FLOAT, S23);      /* uninitialized variable */
  fill("u/Momentum", PS_DT_FLOAT, S23, 1);
  fill("h", PS_DT_HALF, S23, 1);
  fill("h/Momentum", PS_DT_HALF, S23, 0);
  fill("s", PS_DT_FLOAT, shape_of(0, NULL), 7);
}

static void assert_unchanged(void) {
  double *w = read_var("w", PS_DT_FLOAT, S23),
         *m = read_var("w/Momentum", PS_DT_FLOAT, S23);
  double *a = read_var("w/Adam", PS_DT_FLOAT, S23),
         *a1 = read_var("w/Adam_1", PS_DT_FLOAT, S23);
  double *um = read_var("u/Momentum", PS_DT_FLOAT, S23);
  for (int i = 0; i < 6; i++) {
    ck_assert_msg(w[i] == W0[i], "w[%d] changed to %g", i, w[i]);
    ck_assert_msg(m[i] == 10 + i, "w/Momentum[%d] changed to %g", i, m[i]);
    ck_assert(a[i] == 0.25 && a1[i] == 0.5);
    ck_assert(um[i] == 1);
  }
  free(w);
  free(m);
  free(a);
  free(a1);
  free(um);
  ps_status st;
  bool init[2];
  const char *names[2] = {"u", "w/Mu"};
  PS_ASSERT_OK(ps_client_is_initialized(C, 0, names, 2, init, &st), st);
  ck_assert(!init[0] && !init[1]);
}

/* Runs @u (one update), expects @code and @text in the message. */
static void expect_error(const ps_update *u, size_t n, int code, const char *text) {
  ps_status st;
  int rc = ps_client_update(C, 0, u, n, &st);
  ck_assert_msg(rc == code, "want code %d, got %d: %s", code, rc, st.msg);
  ck_assert_msg(strstr(st.msg, text) != NULL, "want \"%s\" in \"%s\"", text, st.msg);
  assert_unchanged();
}

static const char *const MOM[1] = {"w/Momentum"};
static const char *const ADAM[2] = {"w/Adam", "w/Adam_1"};
static const double HP_MOM[2] = {0.1, 0.9};
static const double HP_ADAM[6] = {0.01, 0.9, 0.999, 1e-8, 0.9, 0.999};
static const double HP_LR[1] = {0.1};

static ps_tensor *grad23(ps_dtype dt) {
  double g[6] = {1, 1, 1, 1, 1, 1};
  return tensor(dt, S23, g);
}

START_TEST(error_wrong_number_of_slots) {
  ps_tensor *g = grad23(PS_DT_FLOAT);
  ps_update u = {
      .name = "w", .op = PS_APPLY_MOMENTUM, .value = g, .hparams = HP_MOM, .nhparams = 2};
  expect_error(&u, 1, PS_INVALID_ARGUMENT,
               "ApplyMomentum w: takes 1 slot variable (accum), got 0");
  ps_update a = {.name = "w",
                 .op = PS_APPLY_ADAM,
                 .value = g,
                 .slots = ADAM,
                 .nslots = 1,
                 .hparams = HP_ADAM,
                 .nhparams = 6};
  expect_error(&a, 1, PS_INVALID_ARGUMENT,
               "ApplyAdam w: takes 2 slot variables (m, v), got 1");
  ps_update d = {.name = "w",
                 .op = PS_APPLY_GRADIENT_DESCENT,
                 .value = g,
                 .slots = MOM,
                 .nslots = 1,
                 .hparams = HP_LR,
                 .nhparams = 1};
  expect_error(&d, 1, PS_INVALID_ARGUMENT,
               "ApplyGradientDescent w: takes no slot variables, got 1");
  ps_tensor_destroy(g);
}
END_TEST

START_TEST(error_wrong_number_of_hparams) {
  ps_tensor *g = grad23(PS_DT_FLOAT);
  ps_update a = {.name = "w",
                 .op = PS_APPLY_ADAM,
                 .value = g,
                 .slots = ADAM,
                 .nslots = 2,
                 .hparams = HP_ADAM,
                 .nhparams = 5};
  expect_error(&a, 1, PS_INVALID_ARGUMENT,
               "ApplyAdam w: takes 6 hparams (lr, beta1, beta2, epsilon, "
               "beta1_power, beta2_power), got 5");
  ps_update m = {.name = "w",
                 .op = PS_APPLY_MOMENTUM,
                 .value = g,
                 .slots = MOM,
                 .nslots = 1,
                 .hparams = HP_MOM,
                 .nhparams = 1};
  expect_error(&m, 1, PS_INVALID_ARGUMENT,
               "ApplyMomentum w: takes 2 hparams (lr, momentum), got 1");
  ps_update d = {.name = "w", .op = PS_APPLY_GRADIENT_DESCENT, .value = g};
  expect_error(&d, 1, PS_INVALID_ARGUMENT,
               "ApplyGradientDescent w: takes 1 hparam (lr), got 0");
  /* Non-optimizer ops take none of these. */
  ps_update s = {
      .name = "w", .op = PS_ASSIGN_ADD, .value = g, .hparams = HP_LR, .nhparams = 1};
  expect_error(&s, 1, PS_INVALID_ARGUMENT,
               "AssignAdd w: only optimizer updates take slots, hparams or "
               "use_nesterov");
  ps_tensor_destroy(g);
}
END_TEST

START_TEST(error_slot_missing_or_mismatched) {
  ps_tensor *g = grad23(PS_DT_FLOAT);
  const char *nope[1] = {"w/Nope"}, *md[1] = {"w/Md"}, *ms[1] = {"w/Ms"};
  const char *self[1] = {"w"}, *twice[2] = {"w/Adam", "w/Adam"};
  ps_update u = {.name = "w",
                 .op = PS_APPLY_MOMENTUM,
                 .value = g,
                 .slots = nope,
                 .nslots = 1,
                 .hparams = HP_MOM,
                 .nhparams = 2};
  expect_error(&u, 1, PS_NOT_FOUND,
               "ApplyMomentum w: slot variable w/Nope does not exist on ps/0");
  u.slots = md;
  expect_error(&u, 1, PS_INVALID_ARGUMENT,
               "ApplyMomentum w: slot variable w/Md has dtype double, the variable "
               "has dtype float");
  u.slots = ms;
  expect_error(&u, 1, PS_INVALID_ARGUMENT,
               "ApplyMomentum w: slot variable w/Ms has shape [3], the variable has "
               "shape [2,3]");
  u.slots = self;
  expect_error(&u, 1, PS_INVALID_ARGUMENT,
               "ApplyMomentum w: slot variable w is the variable itself");
  ps_update a = {.name = "w",
                 .op = PS_APPLY_ADAM,
                 .value = g,
                 .slots = twice,
                 .nslots = 2,
                 .hparams = HP_ADAM,
                 .nhparams = 6};
  expect_error(&a, 1, PS_INVALID_ARGUMENT,
               "ApplyAdam w: slot variable w/Adam is given twice");
  ps_tensor_destroy(g);
}
END_TEST

START_TEST(error_uninitialized_variable_or_slot) {
  ps_tensor *g = grad23(PS_DT_FLOAT);
  const char *um[1] = {"u/Momentum"}, *mu[1] = {"w/Mu"};
  ps_update u = {.name = "u",
                 .op = PS_APPLY_MOMENTUM,
                 .value = g,
                 .slots = um,
                 .nslots = 1,
                 .hparams = HP_MOM,
                 .nhparams = 2};
  expect_error(&u, 1, PS_FAILED_PRECONDITION, "Attempting to use uninitialized value u");
  ps_update w = {.name = "w",
                 .op = PS_APPLY_MOMENTUM,
                 .value = g,
                 .slots = mu,
                 .nslots = 1,
                 .hparams = HP_MOM,
                 .nhparams = 2};
  expect_error(&w, 1, PS_FAILED_PRECONDITION,
               "Attempting to use uninitialized value w/Mu");
  ps_tensor_destroy(g);
}
END_TEST

START_TEST(error_gradient_shape_and_dtype) {
  const int64_t d32[2] = {3, 2};
  double g6[6] = {1, 1, 1, 1, 1, 1};
  ps_tensor *g32 = tensor(PS_DT_FLOAT, shape_of(2, d32), g6);
  ps_update u = {.name = "w",
                 .op = PS_APPLY_MOMENTUM,
                 .value = g32,
                 .slots = MOM,
                 .nslots = 1,
                 .hparams = HP_MOM,
                 .nhparams = 2};
  expect_error(&u, 1, PS_INVALID_ARGUMENT,
               "ApplyMomentum w: var and grad do not have the same shape: var "
               "[2,3], grad [3,2]");
  ps_tensor *gd = grad23(PS_DT_DOUBLE);
  ps_update d = {.name = "w",
                 .op = PS_APPLY_GRADIENT_DESCENT,
                 .value = gd,
                 .hparams = HP_LR,
                 .nhparams = 1};
  expect_error(&d, 1, PS_INVALID_ARGUMENT,
               "ApplyGradientDescent w: gradient has dtype double that does not "
               "match dtype float of the variable");
  /* Sparse: grad rows must match the indices. */
  int64_t i1[1] = {0};
  ps_tensor *ti = indices(PS_DT_INT64, 1, i1), *g23 = grad23(PS_DT_FLOAT);
  ps_update sp = {.name = "w",
                  .op = PS_APPLY_ADAGRAD,
                  .value = g23,
                  .indices = ti,
                  .slots = MOM,
                  .nslots = 1,
                  .hparams = HP_LR,
                  .nhparams = 1};
  expect_error(&sp, 1, PS_INVALID_ARGUMENT,
               "SparseApplyAdagrad w: Must have grad.shape = indices.shape + "
               "var.shape[1:], got grad.shape [2,3], indices.shape [1], var.shape "
               "[2,3]");
  /* half and bfloat16 have no kernels here. */
  ps_tensor *gh = grad23(PS_DT_HALF);
  const char *hm[1] = {"h/Momentum"};
  ps_update h = {.name = "h",
                 .op = PS_APPLY_MOMENTUM,
                 .value = gh,
                 .slots = hm,
                 .nslots = 1,
                 .hparams = HP_MOM,
                 .nhparams = 2};
  expect_error(&h, 1, PS_INVALID_ARGUMENT,
               "ApplyMomentum h: dtype half is not supported; the optimizer kernels "
               "run on float and double");
  /* A sparse gradient needs rows. */
  double g1[1] = {1};
  ps_tensor *gs = tensor(PS_DT_FLOAT, shape_of(1, (int64_t[]){1}), g1);
  ps_update sc = {.name = "s",
                  .op = PS_APPLY_GRADIENT_DESCENT,
                  .value = gs,
                  .indices = ti,
                  .hparams = HP_LR,
                  .nhparams = 1};
  expect_error(&sc, 1, PS_INVALID_ARGUMENT,
               "SparseApplyGradientDescent s: var must be at least 1 dimensional");
  ps_tensor *objs[] = {g32, gd, ti, g23, gh, gs};
  for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++)
    ps_tensor_destroy(objs[i]);
}
END_TEST

START_TEST(error_sparse_index_out_of_range) {
  int64_t bad[3] = {0, 2, 1}, neg[1] = {-1};
  double g9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  const int64_t d33[2] = {3, 3}, d13[2] = {1, 3};
  ps_tensor *ti = indices(PS_DT_INT32, 3, bad), *tn = indices(PS_DT_INT64, 1, neg);
  ps_tensor *g = tensor(PS_DT_FLOAT, shape_of(2, d33), g9);
  ps_tensor *g1 = tensor(PS_DT_FLOAT, shape_of(2, d13), g9);
  ps_update u = {.name = "w",
                 .op = PS_APPLY_MOMENTUM,
                 .value = g,
                 .indices = ti,
                 .slots = MOM,
                 .nslots = 1,
                 .hparams = HP_MOM,
                 .nhparams = 2};
  expect_error(&u, 1, PS_INVALID_ARGUMENT,
               "indices[1] = 2 is not in [0, 2)\n\t [[{{node w/SparseApplyMomentum}}]]");
  /* Sparse Adam updates every row; a bad index must still change none. */
  ps_update a = {.name = "w",
                 .op = PS_APPLY_ADAM,
                 .value = g1,
                 .indices = tn,
                 .slots = ADAM,
                 .nslots = 2,
                 .hparams = HP_ADAM,
                 .nhparams = 6};
  expect_error(&a, 1, PS_INVALID_ARGUMENT, "indices[0] = -1 is not in [0, 2)");
  ps_tensor_destroy(ti);
  ps_tensor_destroy(tn);
  ps_tensor_destroy(g);
  ps_tensor_destroy(g1);
}
END_TEST

START_TEST(error_use_nesterov_where_unsupported) {
  ps_tensor *g = grad23(PS_DT_FLOAT);
  ps_update d = {.name = "w",
                 .op = PS_APPLY_GRADIENT_DESCENT,
                 .value = g,
                 .hparams = HP_LR,
                 .nhparams = 1,
                 .use_nesterov = true};
  expect_error(&d, 1, PS_INVALID_ARGUMENT,
               "ApplyGradientDescent w: use_nesterov applies only to Momentum and "
               "Adam");
  int64_t i2[2] = {1, 0};
  ps_tensor *ti = indices(PS_DT_INT64, 2, i2);
  ps_update a = {.name = "w",
                 .op = PS_APPLY_ADAM,
                 .value = g,
                 .indices = ti,
                 .slots = ADAM,
                 .nslots = 2,
                 .hparams = HP_ADAM,
                 .nhparams = 6,
                 .use_nesterov = true};
  expect_error(&a, 1, PS_INVALID_ARGUMENT,
               "SparseApplyAdam w: use_nesterov is not supported with a sparse "
               "gradient");
  ps_tensor_destroy(ti);
  ps_tensor_destroy(g);
}
END_TEST

/* A failing update makes the whole request fail: the valid ones before it
 * change nothing, nor does an earlier assign of a slot in the request. */
START_TEST(error_batch_is_atomic) {
  ps_tensor *g = grad23(PS_DT_FLOAT), *g3 = tensor(PS_DT_FLOAT, S3, W0);
  const char *mu[1] = {"w/Mu"};
  ps_update u[3] = {{.name = "w",
                     .op = PS_APPLY_GRADIENT_DESCENT,
                     .value = g,
                     .hparams = HP_LR,
                     .nhparams = 1},
                    {.name = "w",
                     .op = PS_APPLY_ADAM,
                     .value = g,
                     .slots = ADAM,
                     .nslots = 2,
                     .hparams = HP_ADAM,
                     .nhparams = 6},
                    {.name = "w",
                     .op = PS_APPLY_MOMENTUM,
                     .value = g,
                     .slots = mu,
                     .nslots = 1,
                     .hparams = HP_MOM,
                     .nhparams = 2}};
  expect_error(u, 3, PS_FAILED_PRECONDITION,
               "Attempting to use uninitialized value w/Mu");
  /* The slot takes another shape earlier in the request: the update sees it. */
  ps_update v[2] = {
      {.name = "w/Momentum", .op = PS_ASSIGN, .value = g3, .no_validate_shape = true},
      {.name = "w",
       .op = PS_APPLY_MOMENTUM,
       .value = g,
       .slots = MOM,
       .nslots = 1,
       .hparams = HP_MOM,
       .nhparams = 2}};
  expect_error(v, 2, PS_INVALID_ARGUMENT,
               "ApplyMomentum w: slot variable w/Momentum has shape [3], the "
               "variable has shape [2,3]");
  ps_tensor_destroy(g);
  ps_tensor_destroy(g3);
}
END_TEST

/* Requests the client would not build: sent as protobuf messages. */
static void raw_update(Paramserver__Update *up, const void *data, size_t len, int code,
                       const char *text) {
  Paramserver__Update *ups[1] = {up};
  Paramserver__UpdateRequest req = PARAMSERVER__UPDATE_REQUEST__INIT;
  req.updates = ups;
  req.n_updates = 1;
  req.inline_data.data = (uint8_t *)data;
  req.inline_data.len = len;
  ps_rpc_channel *ch = ps_rpc_channel_create(ps_client_address(C, 0));
  ps_rpc_req r = {.ch = ch,
                  .method = "/paramserver.Ps/Update",
                  .request = &req.base,
                  .unary_response = true,
                  .timeout_ms = 10000};
  ps_rpc_run(&r, 1);
  ck_assert_msg(r.st.code == code, "want code %d, got %d: %s", code, r.st.code, r.st.msg);
  ck_assert_msg(strstr(r.st.msg, text) != NULL, "want \"%s\" in \"%s\"", text, r.st.msg);
  ps_rpc_channel_destroy(ch);
  assert_unchanged();
}

START_TEST(error_malformed_optimizer_requests) {
  float g[6] = {1, 1, 1, 1, 1, 1};
  int64_t shape[2] = {2, 3};
  double hp[1] = {0.1};
  Paramserver__Update up = PARAMSERVER__UPDATE__INIT;
  up.name = "w";
  up.op = PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT;
  up.dtype = PS_DT_FLOAT;
  up.shape = shape;
  up.n_shape = 2;
  up.hparams = hp;
  up.n_hparams = 1;
  up.num_indices = 2; /* but no index_dtype */
  raw_update(&up, g, sizeof g, PS_INVALID_ARGUMENT,
             "ApplyGradientDescent w: num_indices is 2 but index_dtype is unset");
  up.num_indices = 0;
  up.op = (Paramserver__UpdateOp)10;
  raw_update(&up, g, sizeof g, PS_INVALID_ARGUMENT, "update of w: unknown op 10");
  up.op = PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT;
  up.index_dtype = PS_DT_FLOAT;
  up.num_indices = 1;
  raw_update(&up, g, sizeof g, PS_INVALID_ARGUMENT,
             "SparseApplyGradientDescent w: indices must be int32 or int64, got float");
}
END_TEST

int main(void) {
  Suite *s = suite_create("optimizers");
  TCase *tc = tcase_create("kernels");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, kernels_match_tensorflow_formulas, 0, NCASES);
  tcase_add_test(tc, dense_update_of_a_scalar);
  tcase_add_test(tc, large_sparse_gradient_streams_in_chunks);
  tcase_add_test(tc, concurrent_updates_lock_variable_and_slots);
  tcase_add_test(tc, batch_assigns_slot_then_applies);
  suite_add_tcase(s, tc);
  TCase *te = tcase_create("errors");
  tcase_add_checked_fixture(te, errors_setup, teardown);
  tcase_set_timeout(te, 120);
  tcase_add_test(te, error_wrong_number_of_slots);
  tcase_add_test(te, error_wrong_number_of_hparams);
  tcase_add_test(te, error_slot_missing_or_mismatched);
  tcase_add_test(te, error_uninitialized_variable_or_slot);
  tcase_add_test(te, error_gradient_shape_and_dtype);
  tcase_add_test(te, error_sparse_index_out_of_range);
  tcase_add_test(te, error_use_nesterov_where_unsupported);
  tcase_add_test(te, error_batch_is_atomic);
  tcase_add_test(te, error_malformed_optimizer_requests);
  suite_add_tcase(s, te);
  return ps_test_run(s);
}
