/* --max-message-bytes of psctl and ps-worker: the largest answer message
 * (header or data chunk) the client takes from a ps
 * (ps_client_options.max_message_bytes; README "Limits"). */
#ifndef PS_CLIENT_FLAGS_H
#define PS_CLIENT_FLAGS_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/rpc.h"
#include "paramserver/client.h"

#define PS_MAX_MESSAGE_HELP                                                              \
  "  --max-message-bytes N  the largest answer message (header or data chunk)\n"         \
  "                    taken from a ps, with an optional K, M or G suffix\n"             \
  "                    (default 32M, at least 16M+16); a larger one fails the\n"         \
  "                    call with RESOURCE_EXHAUSTED naming this flag\n"

/* Parses @s ("64M") into *@out; 0, or 2 after saying why on stderr. */
static inline int ps_max_message_bytes_option(const char *prog, const char *s,
                                              int64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = s && *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0;
  int shift = 0, ok = end != NULL && errno == 0;
  if (ok && *end) {
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
    default:
      ok = 0;
    }
    ok = ok && end[1] == '\0';
  }
  if (ok && v > ((unsigned long long)INT32_MAX >> shift)) ok = 0;
  if (ok) v <<= shift;
  if (!ok || (int64_t)v < PS_RPC_MIN_MESSAGE_BYTES) {
    fprintf(stderr,
            "%s: --max-message-bytes must be a size of at least %lld bytes (16M+16: "
            "one data chunk and its framing) and at most %d, got '%s'\n",
            prog, (long long)PS_RPC_MIN_MESSAGE_BYTES, INT32_MAX, s ? s : "");
    return 2;
  }
  *out = (int64_t)v;
  return 0;
}

#endif
