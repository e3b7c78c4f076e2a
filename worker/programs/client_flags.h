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

/* Replicated ps shards (worker/LIBRARY.md "Replication"): --replicas R,
 * --etcd ENDPOINTS, --repl-job NAME of psctl and ps-worker, into
 * ps_client_options.replicas, etcd and repl_job.  (--job names the task's
 * job in the cluster spec already: the job's name in etcd is --repl-job.) */
#define PS_REPL_HELP                                                                     \
  "  --replicas R          replicated ps shards: R replicas each (1-3; default:\n"       \
  "                        the spec's \"replication\" section, else the view in etcd)\n" \
  "  --etcd ENDPOINTS      etcd HOST:PORT[,...] holding the replication view\n"          \
  "                        (default: the spec's section, else PS_ETCD)\n"                \
  "  --repl-job NAME       the job's name in etcd (default: the section's, else\n"       \
  "                        default)\n"

enum {
  PS_OPT_REPLICAS = 3100,
  PS_OPT_ETCD,
  PS_OPT_REPL_JOB
}; /* past the security flags */

#define PS_REPL_OPTIONS                                                                  \
  {"replicas", required_argument, NULL, PS_OPT_REPLICAS},                                \
      {"etcd", required_argument, NULL, PS_OPT_ETCD}, {                                  \
    "repl-job", required_argument, NULL, PS_OPT_REPL_JOB                                 \
  }

/* 1 when @c was a replication flag (stored in @o), 0 when it is not one,
 * 2 after saying on stderr why its value is wrong. */
static inline int ps_repl_option(const char *prog, int c, const char *arg,
                                 ps_client_options *o) {
  if (c == PS_OPT_REPLICAS) {
    char *end;
    long v = strtol(arg, &end, 10);
    if (*arg == '\0' || *end != '\0' || v < 1 || v > 3) {
      fprintf(stderr, "%s: --replicas must be 1, 2 or 3, got '%s'\n", prog, arg);
      return 2;
    }
    o->replicas = (int)v;
    return 1;
  }
  if (c == PS_OPT_ETCD || c == PS_OPT_REPL_JOB) {
    if (*arg == '\0') {
      fprintf(stderr, "%s: --%s must not be empty\n", prog,
              c == PS_OPT_ETCD ? "etcd" : "repl-job");
      return 2;
    }
    if (c == PS_OPT_ETCD)
      o->etcd = arg;
    else
      o->repl_job = arg;
    return 1;
  }
  return 0;
}

#endif
