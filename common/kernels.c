/* Optimizer update kernels, after TensorFlow's training_ops.cc.
 *
 * Each kernel is written once as a macro and instantiated for float and
 * double, so a float variable is updated in float arithmetic with its
 * hyperparameters cast to float first, as TensorFlow casts its scalar
 * inputs to the variable's dtype.  The order of operations in each
 * expression follows TensorFlow's (Eigen evaluates left to right), so that
 * results match TensorFlow's to the last bit or close to it.
 *
 * Dense kernels are elementwise over the whole variable.  Sparse kernels
 * walk the indices in order, one row at a time, as TensorFlow's CPU
 * SparseApply* kernels do, so a duplicated index is applied twice; sparse
 * GradientDescent and Adam follow the Python optimizers instead (scatter_sub,
 * and Adam's non-lazy _apply_sparse_shared), which is what a TensorFlow
 * graph runs for them. */
#include "kernels.h"

#include <math.h>

static const ps_opt_info infos[PS_OPT_COUNT] = {
    [PS_OPT_GRADIENT_DESCENT] = {"ApplyGradientDescent", "SparseApplyGradientDescent", 0,
                                 "", 1, "lr", false, false},
    [PS_OPT_MOMENTUM] = {"ApplyMomentum", "SparseApplyMomentum", 1, "accum", 2,
                         "lr, momentum", true, true},
    [PS_OPT_ADAGRAD] = {"ApplyAdagrad", "SparseApplyAdagrad", 1, "accum", 1, "lr", false,
                        false},
    [PS_OPT_ADAM] = {"ApplyAdam", "SparseApplyAdam", 2, "m, v", 6,
                     "lr, beta1, beta2, epsilon, beta1_power, beta2_power", true, false},
};

const ps_opt_info *ps_opt_info_get(int opt) {
  return opt >= 0 && opt < PS_OPT_COUNT ? &infos[opt] : NULL;
}

bool ps_kernel_dtype_ok(int dtype) {
  return dtype == PS_DT_FLOAT || dtype == PS_DT_DOUBLE;
}

static int64_t index_at(const ps_kernel_args *a, int64_t k) {
  if (a->index_size == 4) return ((const int32_t *)a->indices)[k];
  return ((const int64_t *)a->indices)[k];
}

/* The rows of the index PS_ROW_AHEAD places on, of the variable and its
 * @nslots slots, asked for ahead (ps_prefetch_row). */
__attribute__((always_inline)) static inline void
prefetch_ahead(const ps_kernel_args *a, int64_t k, size_t row_bytes, int nslots) {
  if (k + PS_ROW_AHEAD >= a->nindices) return;
  size_t off = (size_t)index_at(a, k + PS_ROW_AHEAD) * row_bytes;
  ps_prefetch_row((const char *)a->var + off, row_bytes, true);
  for (int s = 0; s < nslots; s++)
    ps_prefetch_row((const char *)a->slots[s] + off, row_bytes, true);
}

/* The kernels for one element type T, with SQRT its square root. */
#define DEFINE_KERNELS(T, SFX, SQRT)                                                     \
  /* ApplyGradientDescent: var -= grad * lr.  Sparse: the Python optimizer's             \
   * scatter_sub(var, indices, values * lr). */                                          \
  static void gradient_descent_##SFX(const ps_kernel_args *a) {                          \
    T *var = a->var;                                                                     \
    const T *g = a->grad;                                                                \
    const T lr = (T)a->hparams[0];                                                       \
    if (!a->sparse) {                                                                    \
      for (int64_t i = 0; i < a->var_elems; i++)                                         \
        var[i] -= g[i] * lr;                                                             \
      return;                                                                            \
    }                                                                                    \
    const int64_t re = a->row_elems;                                                     \
    for (int64_t k = 0; k < a->nindices; k++) {                                          \
      prefetch_ahead(a, k, (size_t)re * sizeof(T), 0);                                   \
      T *vr = var + index_at(a, k) * re;                                                 \
      const T *gr = g + k * re;                                                          \
      for (int64_t j = 0; j < re; j++)                                                   \
        vr[j] -= gr[j] * lr;                                                             \
    }                                                                                    \
  }                                                                                      \
                                                                                         \
  /* ApplyMomentum / SparseApplyMomentum. */                                             \
  static void momentum_##SFX(const ps_kernel_args *a) {                                  \
    T *var = a->var, *acc = a->slots[0];                                                 \
    const T *g = a->grad;                                                                \
    const T lr = (T)a->hparams[0], mom = (T)a->hparams[1];                               \
    if (!a->sparse) {                                                                    \
      for (int64_t i = 0; i < a->var_elems; i++) {                                       \
        acc[i] = acc[i] * mom + g[i];                                                    \
        if (a->use_nesterov)                                                             \
          var[i] -= g[i] * lr + acc[i] * mom * lr;                                       \
        else                                                                             \
          var[i] -= acc[i] * lr;                                                         \
      }                                                                                  \
      return;                                                                            \
    }                                                                                    \
    const int64_t re = a->row_elems;                                                     \
    for (int64_t k = 0; k < a->nindices; k++) {                                          \
      prefetch_ahead(a, k, (size_t)re * sizeof(T), 1);                                   \
      int64_t r = index_at(a, k) * re;                                                   \
      T *vr = var + r, *ar = acc + r;                                                    \
      const T *gr = g + k * re;                                                          \
      for (int64_t j = 0; j < re; j++) {                                                 \
        ar[j] = ar[j] * mom + gr[j];                                                     \
        if (a->use_nesterov)                                                             \
          vr[j] -= lr * gr[j] + lr * mom * ar[j];                                        \
        else                                                                             \
          vr[j] -= lr * ar[j];                                                           \
      }                                                                                  \
    }                                                                                    \
  }                                                                                      \
                                                                                         \
  /* ApplyAdagrad / SparseApplyAdagrad (update_slots=true): rsqrt is                     \
   * 1/sqrt; the sparse kernel of a 1-D variable divides by sqrt instead. */             \
  static void adagrad_##SFX(const ps_kernel_args *a) {                                   \
    T *var = a->var, *acc = a->slots[0];                                                 \
    const T *g = a->grad;                                                                \
    const T lr = (T)a->hparams[0], one = 1;                                              \
    if (!a->sparse) {                                                                    \
      for (int64_t i = 0; i < a->var_elems; i++) {                                       \
        acc[i] += g[i] * g[i];                                                           \
        var[i] -= g[i] * lr * (one / SQRT(acc[i]));                                      \
      }                                                                                  \
      return;                                                                            \
    }                                                                                    \
    const int64_t re = a->row_elems;                                                     \
    for (int64_t k = 0; k < a->nindices; k++) {                                          \
      prefetch_ahead(a, k, (size_t)re * sizeof(T), 1);                                   \
      int64_t r = index_at(a, k) * re;                                                   \
      T *vr = var + r, *ar = acc + r;                                                    \
      const T *gr = g + k * re;                                                          \
      if (re == 1) {                                                                     \
        ar[0] += gr[0] * gr[0];                                                          \
        vr[0] -= lr * gr[0] / SQRT(ar[0]);                                               \
        continue;                                                                        \
      }                                                                                  \
      for (int64_t j = 0; j < re; j++) {                                                 \
        ar[j] += gr[j] * gr[j];                                                          \
        vr[j] -= lr * gr[j] * (one / SQRT(ar[j]));                                       \
      }                                                                                  \
    }                                                                                    \
  }                                                                                      \
                                                                                         \
  /* ApplyAdam; sparse: AdamOptimizer._apply_sparse_shared with scatter_add.             \
   */                                                                                    \
  static void adam_##SFX(const ps_kernel_args *a) {                                      \
    T *var = a->var, *m = a->slots[0], *v = a->slots[1];                                 \
    const T *g = a->grad;                                                                \
    const double *hp = a->hparams;                                                       \
    const T one = 1, lr = (T)hp[0], b1 = (T)hp[1], b2 = (T)hp[2];                        \
    const T eps = (T)hp[3], b1p = (T)hp[4], b2p = (T)hp[5];                              \
    const T alpha = lr * SQRT(one - b2p) / (one - b1p);                                  \
    const int64_t n = a->var_elems;                                                      \
    if (!a->sparse) {                                                                    \
      for (int64_t i = 0; i < n; i++) {                                                  \
        m[i] += (g[i] - m[i]) * (one - b1);                                              \
        v[i] += (g[i] * g[i] - v[i]) * (one - b2);                                       \
        if (a->use_nesterov)                                                             \
          var[i] -= ((g[i] * (one - b1) + b1 * m[i]) * alpha) / (SQRT(v[i]) + eps);      \
        else                                                                             \
          var[i] -= (m[i] * alpha) / (SQRT(v[i]) + eps);                                 \
      }                                                                                  \
      return;                                                                            \
    }                                                                                    \
    const int64_t re = a->row_elems;                                                     \
    for (int64_t i = 0; i < n; i++)                                                      \
      m[i] = m[i] * b1;                                                                  \
    for (int64_t k = 0; k < a->nindices; k++) {                                          \
      T *mr = m + index_at(a, k) * re;                                                   \
      const T *gr = g + k * re;                                                          \
      for (int64_t j = 0; j < re; j++)                                                   \
        mr[j] += gr[j] * (one - b1);                                                     \
    }                                                                                    \
    for (int64_t i = 0; i < n; i++)                                                      \
      v[i] = v[i] * b2;                                                                  \
    for (int64_t k = 0; k < a->nindices; k++) {                                          \
      T *vr = v + index_at(a, k) * re;                                                   \
      const T *gr = g + k * re;                                                          \
      for (int64_t j = 0; j < re; j++)                                                   \
        vr[j] += gr[j] * gr[j] * (one - b2);                                             \
    }                                                                                    \
    for (int64_t i = 0; i < n; i++)                                                      \
      var[i] -= alpha * m[i] / (SQRT(v[i]) + eps);                                       \
  }                                                                                      \
                                                                                         \
  static void apply_##SFX(const ps_kernel_args *a) {                                     \
    switch (a->opt) {                                                                    \
    case PS_OPT_GRADIENT_DESCENT:                                                        \
      gradient_descent_##SFX(a);                                                         \
      break;                                                                             \
    case PS_OPT_MOMENTUM:                                                                \
      momentum_##SFX(a);                                                                 \
      break;                                                                             \
    case PS_OPT_ADAGRAD:                                                                 \
      adagrad_##SFX(a);                                                                  \
      break;                                                                             \
    case PS_OPT_ADAM:                                                                    \
      adam_##SFX(a);                                                                     \
      break;                                                                             \
    }                                                                                    \
  }

DEFINE_KERNELS(float, float, sqrtf)
DEFINE_KERNELS(double, double, sqrt)

int ps_kernel_apply(const ps_kernel_args *a) {
  const ps_opt_info *info = ps_opt_info_get((int)a->opt);
  if (info == NULL) return -1;
  if (a->use_nesterov && !(a->sparse ? info->sparse_nesterov : info->nesterov)) return -1;
  switch (a->dtype) {
  case PS_DT_FLOAT:
    apply_float(a);
    return 0;
  case PS_DT_DOUBLE:
    apply_double(a);
    return 0;
  default:
    return -1;
  }
}

/* ---- a row of an embedding table (ps/embed.c) ---- */

/* Adagrad on 8 elements: a fixed count and unaliased pointers, so that
 * -O2's cheap vectorizer takes it (sqrtps, divps: the same bits as the
 * scalar forms); a loop over dim is not vectorized at -O2. */
static inline void adagrad8(float *restrict w, float *restrict a, const float *restrict g,
                            float lr) {
  for (int j = 0; j < 8; j++) {
    a[j] += g[j] * g[j];
    w[j] -= lr * g[j] / sqrtf(a[j]);
  }
}

void ps_kernel_table_row(int op, float *w, size_t dim, const float *g, const float *hp) {
  float *a = w + dim, *b = w + 2 * dim;
  switch (op) {
  case PS_KERNEL_ROW_SCATTER_ADD:
    for (size_t j = 0; j < dim; j++)
      w[j] += g[j];
    break;
  case PS_KERNEL_ROW_SGD:
    for (size_t j = 0; j < dim; j++)
      w[j] -= hp[0] * g[j];
    break;
  case PS_KERNEL_ROW_ADAGRAD: {
    size_t j = 0;
    for (; j + 8 <= dim; j += 8)
      adagrad8(w + j, a + j, g + j, hp[0]);
    for (; j < dim; j++) {
      a[j] += g[j] * g[j];
      w[j] -= hp[0] * g[j] / sqrtf(a[j]);
    }
    break;
  }
  case PS_KERNEL_ROW_ADAM: { /* hp: lr, b1, b2, eps, b1^t, b2^t */
    float alpha = hp[0] * sqrtf(1 - hp[5]) / (1 - hp[4]);
    for (size_t j = 0; j < dim; j++) {
      a[j] += (g[j] - a[j]) * (1 - hp[1]);
      b[j] += (g[j] * g[j] - b[j]) * (1 - hp[2]);
      w[j] -= a[j] * alpha / (sqrtf(b[j]) + hp[3]);
    }
    break;
  }
  case PS_KERNEL_ROW_FTRL: /* hp: lr, l1, l2, lr_power; slots: accum, linear */
    for (size_t j = 0; j < dim; j++) {
      float na = a[j] + g[j] * g[j];
      float pn, po;
      if (hp[3] == -0.5f) {
        pn = sqrtf(na);
        po = sqrtf(a[j]);
      } else {
        pn = powf(na, -hp[3]);
        po = powf(a[j], -hp[3]);
      }
      b[j] += g[j] - (pn - po) / hp[0] * w[j];
      float quad = pn / hp[0] + 2 * hp[2];
      w[j] = fabsf(b[j]) > hp[1] ? ((b[j] > 0 ? hp[1] : -hp[1]) - b[j]) / quad : 0.0f;
      a[j] = na;
    }
    break;
  default:
    break;
  }
}
