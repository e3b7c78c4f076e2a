/* Status internals: building and prefixing the messages of a ps_status.
 *
 * The type, the codes (gRPC's) and the public accessors are in
 * paramserver/status.h; this header adds what only the project's own code
 * calls. */
#ifndef PS_STATUS_H
#define PS_STATUS_H

#include <stddef.h>

#include "paramserver/status.h"

/* Sets @st (may be NULL) and returns @code, so callers can write
 * `return ps_status_set(st, PS_NOT_FOUND, "...", name);`. */
int ps_status_set(ps_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " to the message, keeping the code. Returns the code. */
int ps_status_prefix(ps_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The one errno -> status code mapping (TensorFlow's ErrnoToCode, with
 * ENOTDIR as NOT_FOUND): NOT_FOUND, PERMISSION_DENIED, RESOURCE_EXHAUSTED,
 * ALREADY_EXISTS, OUT_OF_RANGE, INVALID_ARGUMENT, UNAVAILABLE, else
 * UNKNOWN. */
int ps_status_code_from_errno(int e);

#endif
