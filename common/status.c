/* Status values: a gRPC code plus a message naming what failed. */
#include "status.h"

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
  static const char *const names[] = {
      "OK",        "CANCELLED",        "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",   "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",     "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "UNKNOWN";
  return names[code];
}
