/* The decoders of etcd's answers (common/rpc_etcd_decode.c): the bytes of
 * one etcd v3 response message (proto/etcd.proto) in, plain C values out.
 * Everything etcd sends is outside input: each decoder checks the message
 * against what was asked (the key, the prefix, the lease) and against the
 * limits of common/etcd.h before anything is used, and refuses the rest
 * with INTERNAL "malformed ..." (RESOURCE_EXHAUSTED for a value or a
 * listing over its limit).  The messages name the key, not the endpoint:
 * the caller (rpc_etcd.c) prefixes "etcd at HOST:PORT: ".
 *
 * Kept apart from the gRPC code so that tests/fuzz/fuzz_etcd.c can reach
 * every decoder with bytes alone.  Thread-safe (no state). */
#ifndef PS_ETCD_DECODE_H
#define PS_ETCD_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "status.h"

/* Limits of common/etcd.h. */
#define PS_ETCD_MAX_VALUE (16u << 20)
#define PS_ETCD_MAX_KEYS 65536

/* RangeResponse of a one-key Range of @key: see ps_etcd_get. */
int ps_etcd_decode_get(const uint8_t *p, size_t n, const char *key, char **val,
                       size_t *len, int64_t *mod_rev, int64_t *rev, ps_status *st);
/* RangeResponse of a prefix Range (keys sorted ascending): see
 * ps_etcd_get_prefix.  Every key must start with @prefix, hold no NUL byte
 * and come after the one before it. */
int ps_etcd_decode_prefix(const uint8_t *p, size_t n, const char *prefix,
                          ps_etcd_kv **out, size_t *nout, int64_t *rev, ps_status *st);
/* TxnResponse of ps_etcd_cas (success: one Put); *@new_mod_rev is the
 * transaction's revision when it succeeded. */
int ps_etcd_decode_txn(const uint8_t *p, size_t n, const char *key, bool *ok,
                       int64_t *new_mod_rev, ps_status *st);
/* PutResponse, DeleteRangeResponse, LeaseRevokeResponse: a header and
 * nothing that contradicts the request.  @what names the call in errors. */
int ps_etcd_decode_put(const uint8_t *p, size_t n, const char *key, ps_status *st);
int ps_etcd_decode_delete(const uint8_t *p, size_t n, const char *key, ps_status *st);
int ps_etcd_decode_revoke(const uint8_t *p, size_t n, int64_t id, ps_status *st);
/* LeaseGrantResponse: a positive ID and TTL; etcd's "error" text is
 * FAILED_PRECONDITION. */
int ps_etcd_decode_grant(const uint8_t *p, size_t n, int64_t *id, int64_t *ttl,
                         ps_status *st);
/* LeaseKeepAliveResponse for lease @id: its TTL (<= 0: the lease is gone). */
int ps_etcd_decode_keepalive(const uint8_t *p, size_t n, int64_t id, int64_t *ttl,
                             ps_status *st);

/* One change a watch delivers. */
typedef struct ps_etcd_event {
  char *key, *val; /* NUL-terminated; val NULL for a delete */
  size_t len;      /* of val */
  int64_t mod_rev;
  bool deleted;
} ps_etcd_event;

/* One WatchResponse of a watch of @key (@prefix: every key under it). */
typedef struct ps_etcd_watch_msg {
  int64_t watch_id, rev, compact_rev;
  bool created, canceled;
  char reason[128]; /* cancel_reason, escaped, truncated */
  ps_etcd_event *ev;
  size_t nev; /* events in revision order (non-decreasing, checked) */
} ps_etcd_watch_msg;
int ps_etcd_decode_watch(const uint8_t *p, size_t n, const char *key, bool prefix,
                         ps_etcd_watch_msg *m, ps_status *st);
void ps_etcd_watch_msg_free(ps_etcd_watch_msg *m);

/* The range_end of every key starting with @prefix (etcd's "prefix + 1":
 * the last byte below 0xff incremented, the bytes after it dropped; "\0"
 * when there is none: every key).  Into @end (room for strlen(@prefix) + 1
 * bytes); returns its length. */
size_t ps_etcd_prefix_end(const char *prefix, char *end);

#endif
