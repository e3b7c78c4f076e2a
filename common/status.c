/* Status values: a gRPC code plus a message naming what failed. */
#include "status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ps_status_set(ps_status *st, int code, const char *fmt, ...) {
  if (st == NULL) return code;
  st->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->msg, sizeof st->msg, fmt, ap);
  va_end(ap);
  return code;
}

int ps_status_prefix(ps_status *st, const char *fmt, ...) {
  if (st == NULL) return PS_UNKNOWN;
  char pre[PS_STATUS_MSG_MAX], old[PS_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  memcpy(old, st->msg, sizeof old);
  snprintf(st->msg, sizeof st->msg, "%s: %s", pre, old);
  return st->code;
}

void ps_status_clear(ps_status *st) {
  if (st == NULL) return;
  st->code = PS_OK;
  st->msg[0] = '\0';
}

const char *ps_status_code_name(int code) {
  static const char *const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "UNKNOWN";
  return names[code];
}

int ps_status_code_from_errno(int e) {
  switch (e) {
  case ENOENT:
  case ENOTDIR:
    return PS_NOT_FOUND;
  case EACCES:
  case EPERM:
  case EROFS:
    return PS_PERMISSION_DENIED;
  case ENOSPC:
  case EDQUOT:
  case ENOMEM:
  case EMFILE:
  case ENFILE:
    return PS_RESOURCE_EXHAUSTED;
  case EEXIST:
    return PS_ALREADY_EXISTS;
  case EFBIG:
  case EOVERFLOW:
  case ERANGE:
    return PS_OUT_OF_RANGE;
  case ENAMETOOLONG:
  case EINVAL:
  case E2BIG:
  case ELOOP:
    return PS_INVALID_ARGUMENT;
  case EAGAIN:
  case EBUSY:
  case ETIMEDOUT:
  case ECONNREFUSED:
  case ECONNRESET:
    return PS_UNAVAILABLE;
  default:
    return PS_UNKNOWN;
  }
}
