/* libpsworker: the status every call reports errors in.
 *
 * Codes are gRPC's status codes, so a status travels over the wire and back
 * unchanged.  The message is a fixed buffer: no allocation, nothing to free,
 * safe to copy by value.  A function that fails returns the code and, when
 * given a ps_status, fills its message with what failed and its name. */
#ifndef PARAMSERVER_STATUS_H
#define PARAMSERVER_STATUS_H

#include <stddef.h>

#include "paramserver/api.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* Sets the code to PS_OK and the message to "" (NULL is a no-op). */
PS_API void ps_status_clear(ps_status *st);
static inline int ps_status_ok(const ps_status *st) {
  return st->code == PS_OK;
}
/* "INVALID_ARGUMENT" etc.; "UNKNOWN_CODE(n)" is never returned: unknown
 * codes map to "UNKNOWN". */
PS_API const char *ps_status_code_name(int code);

#ifdef __cplusplus
}
#endif

#endif
