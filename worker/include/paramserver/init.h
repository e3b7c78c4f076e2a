/* libpsworker: variable initializers (TensorFlow's init_ops.py).
 *
 * A ps_init_spec names an initializer and its parameters.  A graph's
 * initializer sends its spec, with the run's seed and draw, in an assign
 * the ps fills (ps_update.fill: each graph's initializer is its own and
 * runs on the variable's device, as in TensorFlow); a session-held
 * variable is filled by the session with the same code.  The ps keeps the
 * spec a variable was created with for the Initialize RPC.  Values are
 * deterministic by (seed, variable name, element index, draw) only: one
 * part of a partitioned variable gets exactly the values the same range of
 * an unpartitioned fill would have.  All functions are pure and
 * may be called from any thread. */
#ifndef PARAMSERVER_INIT_H
#define PARAMSERVER_INIT_H

#include <stddef.h>
#include <stdint.h>

#include "paramserver/api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ps_init_type {
  PS_INIT_ZEROS,
  PS_INIT_ONES,
  PS_INIT_CONSTANT,
  PS_INIT_RANDOM_UNIFORM,
  PS_INIT_RANDOM_NORMAL,
  PS_INIT_TRUNCATED_NORMAL,
  PS_INIT_GLOROT_UNIFORM,
  PS_INIT_GLOROT_NORMAL,
  PS_INIT_VARIANCE_SCALING,
} ps_init_type;

typedef enum ps_fan_mode { PS_FAN_IN, PS_FAN_OUT, PS_FAN_AVG } ps_fan_mode;

/* "normal" parses as truncated_normal, as in TF >= 1.12. */
typedef enum ps_distribution {
  PS_DIST_TRUNCATED_NORMAL,
  PS_DIST_UNTRUNCATED_NORMAL,
  PS_DIST_UNIFORM,
} ps_distribution;

/* Fill with ps_init_spec_default() first, then override. */
typedef struct ps_init_spec {
  ps_init_type type;
  /* constant: the scalar @value, or, when @values is not NULL, the list
   * @values[0..nvalues) (borrowed) padded with its last element, like TF's
   * constant_initializer.  Integer dtypes need integral values in range;
   * bool needs 0 or 1. */
  double value;
  const double *values;
  size_t nvalues;
  double minval, maxval;        /* random_uniform: 0, 1 */
  double mean, stddev;          /* random/truncated_normal: 0, 1 */
  double scale;                 /* variance_scaling: 1.0 */
  ps_fan_mode mode;             /* variance_scaling: fan_in */
  ps_distribution distribution; /* variance_scaling: truncated */
  /* 0 = not given: the graph seed (ps_graph_set_random_seed) if any, else
   * new values at every run of a graph's initializer (TensorFlow's
   * unseeded ops); the ps's Initialize RPC uses 87654321.  Each run of a
   * seeded initializer in a session gives the next draw. */
  int64_t seed;
} ps_init_spec;

/* TensorFlow's defaults for @type (glorot_* get fan_avg and their
 * distribution; their scale, mode and distribution are fixed anyway). */
PS_API void ps_init_spec_default(ps_init_spec *s, ps_init_type type);

/* "zeros", "ones", "constant", "random_uniform", "random_normal",
 * "truncated_normal", "glorot_uniform", "glorot_normal",
 * "variance_scaling"; "unknown" for anything else. */
PS_API const char *ps_init_type_name(ps_init_type t);
/* The inverse of the above; -1 if @s is unknown or NULL. */
PS_API int ps_init_type_from_name(const char *s);
/* "fan_in", "fan_out", "fan_avg"; -1 if unknown. */
PS_API int ps_fan_mode_from_name(const char *s);
/* "truncated_normal", "normal" (= truncated_normal), "untruncated_normal",
 * "uniform"; -1 if unknown. */
PS_API int ps_distribution_from_name(const char *s);

#ifdef __cplusplus
}
#endif

#endif
