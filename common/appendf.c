/* Bounded string building (appendf.h). */
#include "common/appendf.h"

#include <stdarg.h>
#include <stdio.h>

int ps_appendf(char *buf, size_t n, size_t *off, const char *fmt, ...) {
  if (n == 0) return -1;
  if (*off >= n) *off = n - 1;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf + *off, n - *off, fmt, ap);
  va_end(ap);
  if (k < 0) {
    buf[*off] = '\0';
    return -1;
  }
  if ((size_t)k >= n - *off) {
    *off = n - 1;
    return -1;
  }
  *off += (size_t)k;
  return 0;
}
