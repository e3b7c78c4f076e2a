/* TensorFlow 1.x variable semantics shared by the ps and the session (see
 * variable.h). */
#include "variable.h"

const char *ps_var_update_name(ps_var_update_kind k) {
  switch (k) {
  case PS_VAR_ASSIGN:
    return "Assign";
  case PS_VAR_ASSIGN_ADD:
    return "AssignAdd";
  case PS_VAR_ASSIGN_SUB:
    return "AssignSub";
  }
  return "Unknown";
}

int ps_var_uninitialized(const char *name, ps_status *st) {
  return ps_status_set(st, PS_FAILED_PRECONDITION,
                       "Attempting to use uninitialized value %s", name);
}

int ps_var_check_dtype(const char *op, const char *name, const char *what,
                       ps_dtype value_dtype, ps_dtype var_dtype, ps_status *st) {
  if (value_dtype == var_dtype) return 0;
  return ps_status_set(
      st, PS_INVALID_ARGUMENT,
      "%s %s: %s has dtype %s that does not match dtype %s of the variable", op, name,
      what, ps_dtype_name(value_dtype), ps_dtype_name(var_dtype));
}

int ps_var_check_update(ps_var_update_kind k, const char *name, ps_dtype dtype,
                        const ps_shape *shape, bool initialized, ps_dtype value_dtype,
                        const ps_shape *value_shape, bool validate_shape, ps_status *st) {
  char a[256], b[256];
  const char *op = ps_var_update_name(k);
  int rc = ps_var_check_dtype(op, name, "value", value_dtype, dtype, st);
  if (rc != 0) return rc;
  if (k == PS_VAR_ASSIGN) {
    if (validate_shape && !ps_shape_equal(shape, value_shape))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Assign requires shapes of both tensors to match. "
                           "lhs shape= %s rhs shape= %s\n\t [[{{node %s/Assign}}]]",
                           ps_shape_format(shape, a, sizeof a),
                           ps_shape_format(value_shape, b, sizeof b), name);
    return 0;
  }
  if (!initialized) return ps_var_uninitialized(name, st);
  if (!ps_dtype_is_numeric(dtype))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: dtype %s has no arithmetic", op,
                         name, ps_dtype_name(dtype));
  if (!ps_shape_equal(shape, value_shape))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Cannot update variable with shape %s using a Tensor "
                         "with shape %s, shapes must be equal.\n\t "
                         "[[{{node %s/%s}}]]",
                         ps_shape_format(shape, a, sizeof a),
                         ps_shape_format(value_shape, b, sizeof b), name, op);
  return 0;
}
