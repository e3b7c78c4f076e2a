/* --max-message-bytes of psctl and ps-worker: the largest answer message
 * (header or data chunk) the client takes from a ps
 * (ps_client_options.max_message_bytes; ps/SERVER.md "Limits"). */
#ifndef PS_CLIENT_FLAGS_H
#define PS_CLIENT_FLAGS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/rpc.h"
#include "common/units.h"
#include "paramserver/client.h"

#define PS_MAX_MESSAGE_HELP                                                              \
  "  --max-message-bytes N  the largest answer message (default 32M)\n"

/* Parses @s ("64M") into *@out; 0, or 2 after saying why on stderr. */
static inline int ps_max_message_bytes_option(const char *prog, const char *s,
                                              int64_t *out) {
  int64_t v = 0;
  if (ps_parse_size(s, PS_RPC_MIN_MESSAGE_BYTES, INT32_MAX, &v) != 0) {
    fprintf(stderr,
            "%s: --max-message-bytes must be a size of at least %lld bytes (16M+16: "
            "one data chunk and its framing) and at most %d, got '%s'\n",
            prog, (long long)PS_RPC_MIN_MESSAGE_BYTES, INT32_MAX, s ? s : "");
    return 2;
  }
  *out = v;
  return 0;
}

#endif
