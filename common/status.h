/* One status type for errors that cross a boundary (RPC, CLI, file).
 *
 * Codes are gRPC's status codes, so a status travels over the wire and back
 * unchanged.  The message is a fixed buffer: no allocation, nothing to free,
 * safe to copy by value. */
#ifndef PS_STATUS_H
#define PS_STATUS_H

#include <stddef.h>

enum {
  PS_OK = 0,
  PS_CANCELLED = 1,
  PS_UNKNOWN = 2,
  PS_INVALID_ARGUMENT = 3,
  PS_DEADLINE_EXCEEDED = 4,
  PS_NOT_FOUND = 5,
  PS_ALREADY_EXISTS = 6,
  PS_PERMISSION_DENIED = 7,
  PS_RESOURCE_EXHAUSTED = 8,
  PS_FAILED_PRECONDITION = 9,
  PS_ABORTED = 10,
  PS_OUT_OF_RANGE = 11,
  PS_UNIMPLEMENTED = 12,
  PS_INTERNAL = 13,
  PS_UNAVAILABLE = 14,
  PS_DATA_LOSS = 15,
  PS_UNAUTHENTICATED = 16,
};

#define PS_STATUS_MSG_MAX 1024

typedef struct ps_status {
  int code;
  char msg[PS_STATUS_MSG_MAX];
} ps_status;

/* Sets @st (may be NULL) and returns @code, so callers can write
 * `return ps_status_set(st, PS_NOT_FOUND, "...", name);`. */
int ps_status_set(ps_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " to the message, keeping the code. Returns the code. */
int ps_status_prefix(ps_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ps_status_clear(ps_status *st);
static inline int ps_status_ok(const ps_status *st) { return st->code == PS_OK; }
/* "INVALID_ARGUMENT" etc.; "UNKNOWN_CODE(n)" is never returned: unknown
 * codes map to "UNKNOWN". */
const char *ps_status_code_name(int code);

/* The one errno -> status code mapping (TensorFlow's ErrnoToCode, with
 * ENOTDIR as NOT_FOUND): NOT_FOUND, PERMISSION_DENIED, RESOURCE_EXHAUSTED,
 * ALREADY_EXISTS, OUT_OF_RANGE, INVALID_ARGUMENT, UNAVAILABLE, else
 * UNKNOWN. */
int ps_status_code_from_errno(int e);

#endif
