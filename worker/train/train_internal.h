/* Internals shared by the files of worker/train/: the saver reaches the
 * values of the variables a session holds itself (no ps device). */
#ifndef PS_TRAIN_INTERNAL_H
#define PS_TRAIN_INTERNAL_H

#include "paramserver/session.h"

/* The value @s holds for @v (borrowed; NULL while uninitialized or out of
 * memory). */
const ps_tensor *ps_session_local_value_(ps_session *s, ps_variable *v);
/* Makes @value (taken over) @v's value in @s; frees it on error. */
int ps_session_set_local_value_(ps_session *s, ps_variable *v, ps_tensor *value,
                                ps_status *st);

#endif
