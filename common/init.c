/* Variable initializers computed on the ps.
 *
 * TensorFlow runs an initializer as graph ops on the ps; here the ps fills
 * the buffer itself.  Random values come from Philox with key = the user's
 * seed (87654321, TF's DEFAULT_GRAPH_SEED, when none is given) and counter
 * words 2..3 = a hash of the variable's name, laid out exactly as
 * TensorFlow's CPU random kernels lay out their output
 * (random_op_cpu.h): fixed-count distributions take element i from Philox
 * call i/G, truncated normals give each group of G outputs its own stretch
 * of 256*G/4 calls.  Because the counter for element i is a function of i
 * alone, a ps that owns elements [offset, offset+count) of a partitioned
 * variable jumps straight there and produces the very values an
 * unpartitioned fill would have, whatever the number of ps.
 *
 * The affine step after the standard variate (u*(max-min)+min,
 * z*stddev+mean) runs in the element type for float and double, as TF's
 * graph ops do; half and bfloat16 are generated and transformed in float,
 * then rounded once. */
#include "init.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "philox.h"

#define DEFAULT_GRAPH_SEED 87654321
/* Philox calls reserved per output of a variable-count distribution. */
#define RESERVED_SAMPLES_PER_OUTPUT 256
/* scipy.stats.truncnorm.std(a=-2, b=2): undoes the truncation's shrinkage. */
#define TRUNC_STDDEV_CORRECTION 0.87962566103423978

static const char *const type_names[] = {
    [PS_INIT_ZEROS] = "zeros",
    [PS_INIT_ONES] = "ones",
    [PS_INIT_CONSTANT] = "constant",
    [PS_INIT_RANDOM_UNIFORM] = "random_uniform",
    [PS_INIT_RANDOM_NORMAL] = "random_normal",
    [PS_INIT_TRUNCATED_NORMAL] = "truncated_normal",
    [PS_INIT_GLOROT_UNIFORM] = "glorot_uniform",
    [PS_INIT_GLOROT_NORMAL] = "glorot_normal",
    [PS_INIT_VARIANCE_SCALING] = "variance_scaling",
};
#define NTYPES ((int)(sizeof type_names / sizeof type_names[0]))

void ps_init_spec_default(ps_init_spec *s, ps_init_type type) {
  memset(s, 0, sizeof *s);
  s->type = type;
  s->value = 0.0;
  s->values = NULL;
  s->nvalues = 0;
  s->minval = 0.0;
  s->maxval = 1.0;
  s->mean = 0.0;
  s->stddev = 1.0;
  s->scale = 1.0;
  s->mode = PS_FAN_IN;
  s->distribution = PS_DIST_TRUNCATED_NORMAL;
  s->seed = 0;
  if (type == PS_INIT_GLOROT_UNIFORM || type == PS_INIT_GLOROT_NORMAL) {
    s->mode = PS_FAN_AVG;
    s->distribution =
        type == PS_INIT_GLOROT_UNIFORM ? PS_DIST_UNIFORM : PS_DIST_TRUNCATED_NORMAL;
  }
}

const char *ps_init_type_name(ps_init_type t) {
  int i = (int)t;
  return i >= 0 && i < NTYPES ? type_names[i] : "unknown";
}

int ps_init_type_from_name(const char *s) {
  if (s == NULL) return -1;
  for (int i = 0; i < NTYPES; i++)
    if (strcmp(s, type_names[i]) == 0) return i;
  return -1;
}

int ps_fan_mode_from_name(const char *s) {
  if (s == NULL) return -1;
  if (strcmp(s, "fan_in") == 0) return PS_FAN_IN;
  if (strcmp(s, "fan_out") == 0) return PS_FAN_OUT;
  if (strcmp(s, "fan_avg") == 0) return PS_FAN_AVG;
  return -1;
}

int ps_distribution_from_name(const char *s) {
  if (s == NULL) return -1;
  if (strcmp(s, "truncated_normal") == 0 || strcmp(s, "normal") == 0)
    return PS_DIST_TRUNCATED_NORMAL;
  if (strcmp(s, "untruncated_normal") == 0) return PS_DIST_UNTRUNCATED_NORMAL;
  if (strcmp(s, "uniform") == 0) return PS_DIST_UNIFORM;
  return -1;
}

uint64_t ps_init_name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325u;
  if (name == NULL) return h;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3u;
  }
  return h;
}

/* ---- constants ---------------------------------------------------------- */

/* Whether @v can be stored in @dtype without an undefined conversion or a
 * silent change of value.  TF rejects such constants too (make_tensor_proto
 * raises TypeError for 0.5 into int32). */
static int const_fits(int dtype, double v) {
  /* integer ranges as [lo, hi): both ends are exact doubles */
  static const struct {
    int dtype;
    double lo, hi;
  } ranges[] = {
      {PS_DT_INT8, -0x1p7, 0x1p7},    {PS_DT_UINT8, 0, 0x1p8},
      {PS_DT_INT16, -0x1p15, 0x1p15}, {PS_DT_UINT16, 0, 0x1p16},
      {PS_DT_INT32, -0x1p31, 0x1p31}, {PS_DT_UINT32, 0, 0x1p32},
      {PS_DT_INT64, -0x1p63, 0x1p63}, {PS_DT_UINT64, 0, 0x1p64},
  };
  if (ps_dtype_is_floating(dtype) || dtype == PS_DT_COMPLEX64 ||
      dtype == PS_DT_COMPLEX128)
    return 1;
  if (dtype == PS_DT_BOOL) return v == 0.0 || v == 1.0;
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
    if (ranges[i].dtype == dtype)
      return isfinite(v) && v == floor(v) && v >= ranges[i].lo && v < ranges[i].hi;
  return 0;
}

/* Element @k of @out = @v; @v already passed const_fits(). */
static void const_store(int dtype, void *out, int64_t k, double v) {
  if (dtype == PS_DT_COMPLEX64) {
    float *c = (float *)out + 2 * k;
    c[0] = (float)v;
    c[1] = 0.0f;
  } else if (dtype == PS_DT_COMPLEX128) {
    double *c = (double *)out + 2 * k;
    c[0] = v;
    c[1] = 0.0;
  } else {
    ps_elem_set(dtype, out, k, v);
  }
}

/* Copies element 0 of @out over elements 1..n-1, doubling the copied span
 * each time so a large fill is a handful of memcpy calls. */
static void repeat_first(void *out, size_t esz, int64_t n) {
  char *p = out;
  size_t total = esz * (size_t)n, done = esz;
  while (done < total) {
    size_t c = done < total - done ? done : total - done;
    memcpy(p + done, p, c);
    done += c;
  }
}

static int fill_constant(const ps_init_spec *spec, const char *name, int dtype,
                         int64_t nelem, int64_t offset, int64_t count, void *out,
                         ps_status *st) {
  size_t esz = ps_dtype_size(dtype);
  if (spec->values == NULL) {
    if (!const_fits(dtype, spec->value))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: constant %.17g is not representable "
                           "as %s",
                           name, spec->value, ps_dtype_name(dtype));
    if (count == 0) return 0;
    const_store(dtype, out, 0, spec->value);
    repeat_first(out, esz, count);
    return 0;
  }
  if (spec->nvalues == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: constant initializer has an empty "
                         "value list",
                         name);
  if (spec->nvalues > (uint64_t)nelem)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: Too many elements provided. Needed at "
                         "most %lld, but received %llu",
                         name, (long long)nelem, (unsigned long long)spec->nvalues);
  /* Every value is checked, not just this range's, so that all parts of a
   * partitioned variable agree on whether the initializer is valid. */
  for (size_t i = 0; i < spec->nvalues; i++)
    if (!const_fits(dtype, spec->values[i]))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: constant value %.17g (index %zu) is "
                           "not representable as %s",
                           name, spec->values[i], i, ps_dtype_name(dtype));
  int64_t nv = (int64_t)spec->nvalues, k = 0;
  for (; k < count && offset + k < nv; k++)
    const_store(dtype, out, k, spec->values[offset + k]);
  if (k < count) {
    /* the rest is padding with the last value */
    const_store(dtype, (char *)out + (size_t)k * esz, 0, spec->values[nv - 1]);
    repeat_first((char *)out + (size_t)k * esz, esz, count - k);
  }
  return 0;
}

/* ---- random ------------------------------------------------------------- */

enum { DIST_UNIFORM, DIST_NORMAL, DIST_TRUNCATED };

/* What a random initializer reduces to: a standard variate of @dist, then
 * u*(hi-lo)+lo for uniform or z*stddev+mean for the normals. */
typedef struct rand_plan {
  int dist;
  double lo, hi;
  double mean, stddev;
} rand_plan;

/* TensorFlow's SingleSampleAdapter: a Philox stream read one word at a
 * time, for distributions that take a variable number of words. */
typedef struct single_sampler {
  ps_philox gen;
  uint32_t buf[4];
  int used;
} single_sampler;

static void sampler_init(single_sampler *s, const ps_philox *base, uint64_t skip) {
  s->gen = *base;
  ps_philox_skip(&s->gen, skip);
  s->used = 4;
}

static uint32_t sampler_next(single_sampler *s) {
  if (s->used == 4) {
    ps_philox_next(&s->gen, s->buf);
    s->used = 0;
  }
  return s->buf[s->used++];
}

/* Truncated standard normals of float output group @g (4 outputs), which
 * owns 4*256/4 Philox calls starting at call 256*g. */
static void trunc_group_float(const ps_philox *base, int64_t g, float z[4]) {
  single_sampler s;
  sampler_init(&s, base, (uint64_t)g * RESERVED_SAMPLES_PER_OUTPUT);
  int n = 0;
  for (;;) {
    uint32_t x0 = sampler_next(&s), x1 = sampler_next(&s);
    float f[2];
    ps_box_muller(x0, x1, &f[0], &f[1]);
    for (int j = 0; j < 2; j++) {
      if (fabsf(f[j]) < 2.0f) {
        z[n++] = f[j];
        if (n == 4) return;
      }
    }
  }
}

/* Double outputs come in groups of 2 (a double takes two words), so a
 * group owns 2*256/4 = 128 Philox calls. */
static void trunc_group_double(const ps_philox *base, int64_t g, double z[2]) {
  single_sampler s;
  sampler_init(&s, base, (uint64_t)g * (2 * RESERVED_SAMPLES_PER_OUTPUT / 4));
  int n = 0;
  for (;;) {
    uint32_t x0 = sampler_next(&s), x1 = sampler_next(&s);
    uint32_t x2 = sampler_next(&s), x3 = sampler_next(&s);
    double d[2];
    ps_box_muller_double(x0, x1, x2, x3, &d[0], &d[1]);
    for (int j = 0; j < 2; j++) {
      if (fabs(d[j]) < 2.0) {
        z[n++] = d[j];
        if (n == 2) return;
      }
    }
  }
}

static void store_float(int dtype, void *out, int64_t k, float v) {
  switch (dtype) {
  case PS_DT_FLOAT:
    ((float *)out)[k] = v;
    break;
  case PS_DT_HALF:
    ((uint16_t *)out)[k] = ps_float_to_half(v);
    break;
  case PS_DT_BFLOAT16:
    ((uint16_t *)out)[k] = ps_float_to_bf16(v);
    break;
  default:
    break;
  }
}

/* float, half and bfloat16: 4 outputs per Philox call / truncated group. */
static void fill_random_float(const rand_plan *pl, const ps_philox *base, int dtype,
                              int64_t offset, int64_t count, void *out) {
  float a, b;
  if (pl->dist == DIST_UNIFORM) {
    /* TF: rnd * (maxval - minval) + minval with float32 tensors */
    float lo = (float)pl->lo, hi = (float)pl->hi;
    a = hi - lo;
    b = lo;
  } else {
    a = (float)pl->stddev;
    b = (float)pl->mean;
  }
  const int64_t end = offset + count, glast = (end - 1) / 4;
  ps_philox gen = *base;
  ps_philox_skip(&gen, (uint64_t)(offset / 4));
  for (int64_t g = offset / 4; g <= glast; g++) {
    float z[4];
    if (pl->dist == DIST_TRUNCATED) {
      trunc_group_float(base, g, z);
    } else {
      uint32_t w[4];
      ps_philox_next(&gen, w);
      if (pl->dist == DIST_UNIFORM) {
        for (int j = 0; j < 4; j++)
          z[j] = ps_uint32_to_float(w[j]);
      } else {
        ps_box_muller(w[0], w[1], &z[0], &z[1]);
        ps_box_muller(w[2], w[3], &z[2], &z[3]);
      }
    }
    /* g*4 <= end-1, so neither sum below can overflow */
    const int64_t first = g * 4;
    for (int j = 0; j < 4 && j < end - first; j++)
      if (first + j >= offset) store_float(dtype, out, first + j - offset, z[j] * a + b);
  }
}

/* double: 2 outputs per Philox call / truncated group. */
static void fill_random_double(const rand_plan *pl, const ps_philox *base, int64_t offset,
                               int64_t count, double *out) {
  double a, b;
  if (pl->dist == DIST_UNIFORM) {
    a = pl->hi - pl->lo;
    b = pl->lo;
  } else {
    a = pl->stddev;
    b = pl->mean;
  }
  const int64_t end = offset + count, glast = (end - 1) / 2;
  ps_philox gen = *base;
  ps_philox_skip(&gen, (uint64_t)(offset / 2));
  for (int64_t g = offset / 2; g <= glast; g++) {
    double z[2];
    if (pl->dist == DIST_TRUNCATED) {
      trunc_group_double(base, g, z);
    } else {
      uint32_t w[4];
      ps_philox_next(&gen, w);
      if (pl->dist == DIST_UNIFORM) {
        z[0] = ps_uint64_to_double(w[0], w[1]);
        z[1] = ps_uint64_to_double(w[2], w[3]);
      } else {
        ps_box_muller_double(w[0], w[1], w[2], w[3], &z[0], &z[1]);
      }
    }
    const int64_t first = g * 2;
    for (int j = 0; j < 2 && j < end - first; j++)
      if (first + j >= offset) out[first + j - offset] = z[j] * a + b;
  }
}

/* TF's _compute_fans, on the full shape. */
static void compute_fans(const ps_shape *s, double *fan_in, double *fan_out) {
  if (s->rank == 0) {
    *fan_in = *fan_out = 1.0;
  } else if (s->rank == 1) {
    *fan_in = *fan_out = (double)s->dim[0];
  } else if (s->rank == 2) {
    *fan_in = (double)s->dim[0];
    *fan_out = (double)s->dim[1];
  } else {
    double rf = 1.0;
    for (int i = 0; i < s->rank - 2; i++)
      rf *= (double)s->dim[i];
    *fan_in = (double)s->dim[s->rank - 2] * rf;
    *fan_out = (double)s->dim[s->rank - 1] * rf;
  }
}

/* Turns @spec into a plan, checking its parameters. */
static int make_plan(const ps_init_spec *spec, const char *name, const ps_shape *full,
                     rand_plan *pl, ps_status *st) {
  const char *tn = ps_init_type_name(spec->type);
  memset(pl, 0, sizeof *pl);
  switch (spec->type) {
  case PS_INIT_RANDOM_UNIFORM:
    if (!isfinite(spec->minval) || !isfinite(spec->maxval))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: %s needs finite minval and maxval", name, tn);
    if (spec->minval > spec->maxval)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: %s needs minval <= maxval, got "
                           "minval=%g maxval=%g",
                           name, tn, spec->minval, spec->maxval);
    pl->dist = DIST_UNIFORM;
    pl->lo = spec->minval;
    pl->hi = spec->maxval;
    return 0;
  case PS_INIT_RANDOM_NORMAL:
  case PS_INIT_TRUNCATED_NORMAL:
    if (!isfinite(spec->mean) || !isfinite(spec->stddev))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: %s needs finite mean and stddev", name, tn);
    if (spec->stddev < 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: %s needs stddev >= 0, got %g", name, tn,
                           spec->stddev);
    pl->dist = spec->type == PS_INIT_RANDOM_NORMAL ? DIST_NORMAL : DIST_TRUNCATED;
    pl->mean = spec->mean;
    pl->stddev = spec->stddev;
    return 0;
  default:
    break;
  }

  /* variance scaling and its glorot special cases */
  double scale;
  int mode, dist;
  if (spec->type == PS_INIT_VARIANCE_SCALING) {
    scale = spec->scale;
    mode = (int)spec->mode;
    dist = (int)spec->distribution;
    if (!isfinite(scale) || !(scale > 0))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: %s needs scale > 0, got %g", name, tn, scale);
    if (mode != PS_FAN_IN && mode != PS_FAN_OUT && mode != PS_FAN_AVG)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: %s has an unknown mode %d", name, tn, mode);
    if (dist != PS_DIST_TRUNCATED_NORMAL && dist != PS_DIST_UNTRUNCATED_NORMAL &&
        dist != PS_DIST_UNIFORM)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: %s has an unknown distribution %d", name, tn,
                           dist);
  } else {
    scale = 1.0;
    mode = PS_FAN_AVG;
    dist =
        spec->type == PS_INIT_GLOROT_UNIFORM ? PS_DIST_UNIFORM : PS_DIST_TRUNCATED_NORMAL;
  }
  double fan_in, fan_out, fan;
  compute_fans(full, &fan_in, &fan_out);
  fan = mode == PS_FAN_IN    ? fan_in
        : mode == PS_FAN_OUT ? fan_out
                             : (fan_in + fan_out) / 2.0;
  scale /= fan > 1.0 ? fan : 1.0;
  if (dist == PS_DIST_UNIFORM) {
    double limit = sqrt(3.0 * scale);
    pl->dist = DIST_UNIFORM;
    pl->lo = -limit;
    pl->hi = limit;
  } else if (dist == PS_DIST_UNTRUNCATED_NORMAL) {
    pl->dist = DIST_NORMAL;
    pl->stddev = sqrt(scale);
  } else {
    pl->dist = DIST_TRUNCATED;
    pl->stddev = sqrt(scale) / TRUNC_STDDEV_CORRECTION;
  }
  return 0;
}

/* ---- entry point -------------------------------------------------------- */

/* INVALID_ARGUMENT: elements [offset, offset + count) are not in the shape. */
static int outside_error(const char *name, int64_t offset, int64_t count,
                         const ps_shape *full_shape, int64_t nelem, ps_status *st) {
  char sbuf[PS_MAX_RANK * 21 + 3];
  return ps_status_set(st, PS_INVALID_ARGUMENT,
                       "variable %s: elements [%lld, %lld + %lld) are outside "
                       "shape %s (%lld elements)",
                       name, (long long)offset, (long long)offset, (long long)count,
                       ps_shape_format(full_shape, sbuf, sizeof sbuf), (long long)nelem);
}

int ps_init_fill(const ps_init_spec *spec, const char *name, int dtype,
                 const ps_shape *full_shape, int64_t offset, int64_t count, void *out,
                 ps_status *st) {
  return ps_init_fill_draw(spec, name, dtype, full_shape, offset, count, NULL, 0, out,
                           st);
}

int ps_init_fill_draw(const ps_init_spec *spec, const char *name, int dtype,
                      const ps_shape *full_shape, int64_t offset, int64_t count,
                      const uint64_t *seed, uint64_t draw, void *out, ps_status *st) {
  if (name == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "initializer: variable name is missing");
  if (spec == NULL || full_shape == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: initializer or shape is missing", name);
  if (full_shape->rank < 0 || full_shape->rank > PS_MAX_RANK)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: rank %d is out of range [0, %d]", name,
                         full_shape->rank, PS_MAX_RANK);
  char sbuf[PS_MAX_RANK * 21 + 3];
  int64_t nelem = ps_shape_num_elements(full_shape);
  if (nelem < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "variable %s: invalid shape %s", name,
                         ps_shape_format(full_shape, sbuf, sizeof sbuf));
  if (offset < 0 || count < 0 || offset > nelem || count > nelem - offset)
    return outside_error(name, offset, count, full_shape, nelem, st);
  int t = (int)spec->type;
  if (t < 0 || t >= NTYPES)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: unknown initializer type %d", name, t);
  const char *tn = type_names[t];
  size_t esz = ps_dtype_size(dtype);
  if (esz == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: initializer %s does not support dtype "
                         "%s (%d)",
                         name, tn, ps_dtype_name(dtype), dtype);
  if ((uint64_t)count > SIZE_MAX / esz)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: %lld elements do not fit in memory", name,
                         (long long)count);
  if (out == NULL && count > 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "variable %s: no output buffer", name);

  switch (spec->type) {
  case PS_INIT_ZEROS:
    if (count > 0) memset(out, 0, (size_t)count * esz);
    return 0;
  case PS_INIT_ONES:
    if (count > 0) {
      const_store(dtype, out, 0, 1.0);
      repeat_first(out, esz, count);
    }
    return 0;
  case PS_INIT_CONSTANT:
    return fill_constant(spec, name, dtype, nelem, offset, count, out, st);
  default:
    break;
  }

  if (!ps_dtype_is_floating(dtype))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: initializer %s needs a floating dtype, "
                         "got %s",
                         name, tn, ps_dtype_name(dtype));
  rand_plan pl;
  int rc = make_plan(spec, name, full_shape, &pl, st);
  if (rc != 0) return rc;
  if (count == 0) return 0;

  ps_philox base;
  uint64_t key = spec->seed != 0 ? (uint64_t)spec->seed
                 : seed          ? *seed
                                 : DEFAULT_GRAPH_SEED;
  ps_philox_init(&base, key, ps_init_name_hash(name));
  /* draw d starts where TensorFlow's kernel would after d runs: each run
   * reserves 256 samples per output, 64 Philox calls per element */
  ps_philox_skip(&base, draw * 64u * (uint64_t)nelem);
  if (dtype == PS_DT_DOUBLE)
    fill_random_double(&pl, &base, offset, count, out);
  else
    fill_random_float(&pl, &base, dtype, offset, count, out);
  return 0;
}

int ps_init_check(const ps_init_spec *spec, const char *name, int dtype,
                  const ps_shape *full_shape, int64_t offset, int64_t count,
                  ps_status *st) {
  /* A fill of no elements runs every parameter check. */
  int rc = ps_init_fill(spec, name, dtype, full_shape, offset, 0, NULL, st);
  if (rc != 0) return rc;
  int64_t nelem = ps_shape_num_elements(full_shape);
  if (count < 0 || count > nelem - offset)
    return outside_error(name, offset, count, full_shape, nelem, st);
  return 0;
}
