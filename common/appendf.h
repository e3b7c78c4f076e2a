/* Bounded string building: the one way the tree appends formatted text to
 * a fixed buffer.  snprintf returns the length it would have written, so
 * `off += snprintf(buf + off, n - off, ...)` runs past the end once a
 * piece does not fit; ps_appendf never does.
 *
 *   char s[64]; size_t off = 0;
 *   for (...) ps_appendf(s, sizeof s, &off, "%s%d", i ? "," : "", v[i]);
 */
#ifndef PS_COMMON_APPENDF_H
#define PS_COMMON_APPENDF_H

#include <stddef.h>

/* Appends the formatted text at @buf + *@off (@buf holds @n bytes, a
 * terminated string of *@off bytes), truncating it to fit; *@off becomes
 * the new length (at most @n - 1).  Returns 0, or -1 when the text was
 * truncated (or @n is 0).  The buffer stays terminated. */
int ps_appendf(char *buf, size_t n, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
