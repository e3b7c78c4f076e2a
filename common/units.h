/* Byte sizes and counts as flags and environment variables give them
 * ("64M", "1GiB", "512"): one parser for every program's size flags. */
#ifndef PS_UNITS_H
#define PS_UNITS_H

#include <stdint.h>

/* Parses @s, decimal digits with an optional K, M, G or T suffix (powers
 * of 1024, either case) followed by an optional "B" or "iB", into *@out.
 * 0, or -1 if @s is NULL, malformed, overflows, or lies outside
 * [@min, @max]; *@out is set only on success. */
int ps_parse_size(const char *s, int64_t min, int64_t max, int64_t *out);

#endif
