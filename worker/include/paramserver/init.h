/* libpsworker: variable initializers (TensorFlow's init_ops.py).
 *
 * A ps_init_spec names an initializer and its parameters; the ps that holds
 * the variable runs it, so the values never cross the network.  Values are
 * deterministic by (seed, variable name, element index) only: a ps holding
 * one part of a partitioned variable fills exactly the values the same
 * range of an unpartitioned fill would have.  All functions are pure and
 * may be called from any thread. */
#ifndef PARAMSERVER_INIT_H
#define PARAMSERVER_INIT_H

#include <stddef.h>
#include <stdint.h>

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
  int64_t seed;                 /* 0 = not given: 87654321 */
} ps_init_spec;

/* TensorFlow's defaults for @type (glorot_* get fan_avg and their
 * distribution; their scale, mode and distribution are fixed anyway). */
void ps_init_spec_default(ps_init_spec *s, ps_init_type type);

/* "zeros", "ones", "constant", "random_uniform", "random_normal",
 * "truncated_normal", "glorot_uniform", "glorot_normal",
 * "variance_scaling"; "unknown" for anything else. */
const char *ps_init_type_name(ps_init_type t);
/* The inverse of the above; -1 if @s is unknown or NULL. */
int ps_init_type_from_name(const char *s);
/* "fan_in", "fan_out", "fan_avg"; -1 if unknown. */
int ps_fan_mode_from_name(const char *s);
/* "truncated_normal", "normal" (= truncated_normal), "untruncated_normal",
 * "uniform"; -1 if unknown. */
int ps_distribution_from_name(const char *s);

#endif
