/* Random ops (TensorFlow's random_normal, truncated_normal, random_uniform)
 * with TensorFlow 1.x's seed rules (random_seed.get_seed):
 *   graph seed set, op seed not: op seed = the graph's last node id;
 *   op seed set, graph seed not: graph seed = 87654321 (DEFAULT_GRAPH_SEED);
 *   neither: new values from the system's entropy at every run;
 *   both seeds truncated to [0, 2^31 - 1); (0, 0) becomes (0, 2^31 - 1).
 * With seeds, the values are a pure function of (seed, seed2, run, element):
 * every process building the same graph gets the same values, and each run
 * of the node in a session gives the next ones, a new session starting
 * again at the first (TensorFlow's kernel, one per session, keeps its
 * Philox state the same way).  The generator is our own (a counter-based
 * splitmix64 hash), so the values are not TensorFlow's bit for bit. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/random.h>

#include "ops_internal.h"

#define DEFAULT_GRAPH_SEED 87654321
#define MAXINT32 2147483647LL

enum { R_NORMAL, R_TRUNCATED, R_UNIFORM };

static int random_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st);

static const ps_op_def op_normal = {"RandomStandardNormal", PS_OPK_LOCAL, random_compute,
                                    NULL};
static const ps_op_def op_truncated = {"TruncatedNormal", PS_OPK_LOCAL, random_compute,
                                       NULL};
static const ps_op_def op_uniform = {"RandomUniform", PS_OPK_LOCAL, random_compute, NULL};
static const ps_op_def op_uniform_int = {"RandomUniformInt", PS_OPK_LOCAL, random_compute,
                                         NULL};

static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* A uniform double in [0, 1) for draw @k of element @i. */
static double uniform01(uint64_t key, uint64_t i, uint64_t k) {
  uint64_t h = mix(key ^ mix(i * 0x100000001b3ULL + k));
  return (double)(h >> 11) * 0x1.0p-53;
}

/* A standard normal (Box-Muller) for draw @k of element @i. */
static double normal01(uint64_t key, uint64_t i, uint64_t k) {
  double u1 = uniform01(key, i, 2 * k), u2 = uniform01(key, i, 2 * k + 1);
  if (u1 <= 0) u1 = 0x1.0p-53;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static int random_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  (void)in;
  ps_tensor *t = ps_new_tensor_(n->dtype, &n->shape, false, st);
  if (t == NULL) return st->code;
  uint64_t seed = (uint64_t)n->ia[0], seed2 = (uint64_t)n->ia[1], key;
  if (seed == 0 && seed2 == 0) { /* no seed: new values every run */
    if (getrandom(&key, sizeof key, 0) != sizeof key) key = mix((uint64_t)(uintptr_t)t);
  } else {
    uint64_t run = ps_kernel_runs_
                       ? (*ps_kernel_runs_)++
                       : (uint64_t)__atomic_fetch_add(&n->ia[3], 1, __ATOMIC_RELAXED);
    key = mix(mix(seed) ^ (seed2 << 1)) ^ mix(run + 0x5851f42d4c957f2dULL);
  }
  int64_t ne = ps_tensor_num_elements(t);
  void *p = ps_tensor_data(t);
  double a = n->fa[0], b = n->fa[1];
  for (int64_t i = 0; i < ne; i++) {
    double x;
    if (n->def == &op_normal) {
      x = a + b * normal01(key, (uint64_t)i, 0);
    } else if (n->def == &op_truncated) {
      double z = normal01(key, (uint64_t)i, 0);
      for (uint64_t k = 1; fabs(z) > 2.0; k++) /* redrawn, as TensorFlow */
        z = normal01(key, (uint64_t)i, k);
      x = a + b * z;
    } else if (n->def == &op_uniform) {
      x = a + (b - a) * uniform01(key, (uint64_t)i, 0);
      if (x >= b) x = a; /* rounding at the top of a narrow float range */
    } else {
      x = a + floor((b - a) * uniform01(key, (uint64_t)i, 0));
    }
    ps_elem_set(n->dtype, p, i, x);
  }
  *out = t;
  return 0;
}

/* get_seed (the rules above) into n->ia[0..1]. */
static void set_seeds(ps_graph *g, ps_node *n, const int64_t *op_seed) {
  int64_t gs, os;
  bool has_g = ps_graph_random_seed_(g, &gs);
  if (has_g) {
    os = op_seed ? *op_seed : (int64_t)ps_graph_num_nodes(g) - 1;
  } else if (op_seed) {
    gs = DEFAULT_GRAPH_SEED;
    os = *op_seed;
  } else {
    n->ia[0] = n->ia[1] = 0;
    return;
  }
  gs %= MAXINT32;
  os %= MAXINT32;
  if (gs < 0) gs += MAXINT32;
  if (os < 0) os += MAXINT32;
  if (gs == 0 && os == 0) os = MAXINT32;
  n->ia[0] = gs;
  n->ia[1] = os;
}

static ps_node *random_op(ps_graph *g, const ps_op_def *def, const char *dflt,
                          const ps_shape *shape, ps_dtype dtype, double a, double b,
                          const int64_t *seed, const char *name) {
  if (g == NULL) return NULL;
  char buf[SHAPE_STR];
  if (shape == NULL || !fully_known(shape) || ps_shape_num_elements(shape) < 0)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                         "%s: the shape must be fully defined and not too large, got %s",
                         def->type, shape ? ps_shape_str_(shape, buf) : "none");
  uint32_t types = def == &op_uniform_int ? T_INDEX : T_FLOATS;
  if (!ps_type_ok_(g, def->type, "dtype", dtype, types)) return NULL;
  if (def == &op_uniform_int && !(a < b))
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "%s: Need minval < maxval: %g >= %g",
                         def->type, a, b);
  if (!isfinite(a) || !isfinite(b))
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "%s: parameters must be finite",
                         def->type);
  ps_node *n = ps_make_(g, def, name ? name : dflt, NULL, 0, dtype, shape);
  if (n == NULL) return NULL;
  n->fa[0] = a;
  n->fa[1] = b;
  set_seeds(g, n, seed);
  return n;
}

ps_node *ps_random_normal(ps_graph *g, const ps_shape *shape, ps_dtype dtype, double mean,
                          double stddev, const int64_t *seed, const char *name) {
  return random_op(g, &op_normal, "random_normal", shape, dtype, mean, stddev, seed,
                   name);
}

ps_node *ps_truncated_normal(ps_graph *g, const ps_shape *shape, ps_dtype dtype,
                             double mean, double stddev, const int64_t *seed,
                             const char *name) {
  return random_op(g, &op_truncated, "truncated_normal", shape, dtype, mean, stddev, seed,
                   name);
}

ps_node *ps_random_uniform(ps_graph *g, const ps_shape *shape, ps_dtype dtype,
                           double minval, double maxval, const int64_t *seed,
                           const char *name) {
  bool ints = dtype == PS_DT_INT32 || dtype == PS_DT_INT64;
  return random_op(g, ints ? &op_uniform_int : &op_uniform, "random_uniform", shape,
                   dtype, minval, maxval, seed, name);
}

/* Every op of this file, for MetaGraph import (saver.c). */
const ps_op_def *const ps_opdefs_random_[] = {&op_normal, &op_truncated, &op_uniform,
                                              &op_uniform_int, NULL};
