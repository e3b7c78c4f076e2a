/* Byte sizes with binary suffixes, for flags (--max-message-bytes,
 * --max-checkpoint-bytes, ...).  Written once so that every program
 * accepts the same spellings and refuses the same overflows. */
#include "common/units.h"

#include <errno.h>
#include <stdlib.h>

int ps_parse_size(const char *s, int64_t min, int64_t max, int64_t *out) {
  if (s == NULL || *s < '0' || *s > '9') return -1;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  int shift = 0;
  if (*end) {
    switch (*end) {
    case 'k':
    case 'K':
      shift = 10;
      break;
    case 'm':
    case 'M':
      shift = 20;
      break;
    case 'g':
    case 'G':
      shift = 30;
      break;
    case 't':
    case 'T':
      shift = 40;
      break;
    default:
      return -1;
    }
    end++;
    if (*end == 'i' && end[1] == 'B')
      end += 2;
    else if (*end == 'B')
      end++;
    if (*end) return -1;
  }
  if (v > (unsigned long long)INT64_MAX >> shift) return -1;
  int64_t r = (int64_t)(v << shift);
  if (r < min || r > max) return -1;
  *out = r;
  return 0;
}
