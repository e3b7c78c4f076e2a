/* TensorFlow 1.x variable semantics both sides enforce with the same texts:
 * the ps for the variables it owns (ps/service*.c), a session for the
 * variables it holds itself (worker/train/session_local.c).  Scatter and optimizer
 * specifics stay with their callers. */
#ifndef PS_VARIABLE_H
#define PS_VARIABLE_H

#include <stdbool.h>

#include "status.h"
#include "tensor.h"

/* The kinds of whole-value updates. */
typedef enum ps_var_update_kind {
  PS_VAR_ASSIGN,
  PS_VAR_ASSIGN_ADD,
  PS_VAR_ASSIGN_SUB,
} ps_var_update_kind;

/* "Assign", "AssignAdd", "AssignSub". */
const char *ps_var_update_name(ps_var_update_kind k);

/* FAILED_PRECONDITION "Attempting to use uninitialized value NAME". */
int ps_var_uninitialized(const char *name, ps_status *st);

/* INVALID_ARGUMENT "OP NAME: value has dtype X that does not match dtype Y
 * of the variable" unless @value_dtype is @var_dtype.  @what is "value"
 * or "gradient". */
int ps_var_check_dtype(const char *op, const char *name, const char *what,
                       ps_dtype value_dtype, ps_dtype var_dtype, ps_status *st);

/* An update @k of variable @name (dtype @dtype, current shape @shape,
 * @initialized or not) by a value of @value_dtype and @value_shape, as
 * TensorFlow's Assign / AssignAdd / AssignSub kernels check it: the dtype;
 * for Assign with @validate_shape the shapes ("Assign requires shapes of
 * both tensors to match. lhs shape= [..] rhs shape= [..]"); for the others
 * that the variable holds a value, that its dtype has arithmetic, and the
 * shapes ("Cannot update variable with shape [..] using a Tensor with
 * shape [..], shapes must be equal.").  Errors end with TensorFlow's
 * "\n\t [[{{node NAME/OP}}]]".  0 if the update may go ahead. */
int ps_var_check_update(ps_var_update_kind k, const char *name, ps_dtype dtype,
                        const ps_shape *shape, bool initialized, ps_dtype value_dtype,
                        const ps_shape *value_shape, bool validate_shape, ps_status *st);

#endif
