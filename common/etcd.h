/* A small client of etcd's v3 API (Debian's etcd-server 3.4), for the
 * replication view (common/view.h): gRPC through the project's own gRPC
 * layer (common/rpc_etcd.c, protobuf-c messages of proto/etcd.proto), not
 * etcd's JSON gateway (DESIGN.md "Replication" says why).
 *
 * Endpoints are "HOST:PORT[,HOST:PORT...]"; a call that fails UNAVAILABLE
 * on one endpoint is tried on the next.  Every call has a deadline
 * (@timeout_ms of ps_etcd_connect).  Errors name the endpoint and the key:
 * UNAVAILABLE "etcd at HOST:PORT: ..." when no endpoint answers.
 *
 * Thread safety: every function may be called from any thread. */
#ifndef PS_ETCD_H
#define PS_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct ps_etcd ps_etcd;

/* Checks the endpoint list (at most 16, each HOST:PORT) and makes the
 * channels; does not wait for etcd to answer.  NULL with @st set
 * (INVALID_ARGUMENT naming the bad endpoint). */
ps_etcd *ps_etcd_connect(const char *endpoints, int64_t timeout_ms, ps_status *st);
/* Stop every keeper and watch of @e first. */
void ps_etcd_close(ps_etcd *e);
const char *ps_etcd_endpoints(const ps_etcd *e);
/* The endpoint ("HOST:PORT") that answered last: the next call starts
 * there. */
const char *ps_etcd_endpoint_in_use(ps_etcd *e);

/* A key's value (malloc'd, NUL-terminated after @len bytes; caller
 * frees), its mod_revision, and the store's revision at the read.  A
 * missing key is not an error: *@val = NULL, *@mod_rev = 0.  Values over
 * 16 MiB are refused (RESOURCE_EXHAUSTED). */
int ps_etcd_get(ps_etcd *e, const char *key, char **val, size_t *len, int64_t *mod_rev,
                int64_t *rev, ps_status *st);

/* One key of a prefix listing. */
typedef struct ps_etcd_kv {
  char *key, *val;
  size_t len;
  int64_t mod_rev, lease;
} ps_etcd_kv;
/* Every key starting with @prefix (at most 65536), sorted by key. */
int ps_etcd_get_prefix(ps_etcd *e, const char *prefix, ps_etcd_kv **out, size_t *n,
                       int64_t *rev, ps_status *st);
void ps_etcd_kvs_free(ps_etcd_kv *kv, size_t n);

/* Put @val at @key if its mod_revision is still @expect_mod_rev (0: the
 * key must not exist), in one transaction; @lease 0: none.  *@ok tells
 * whether it was written; *@new_mod_rev (may be NULL) is the key's
 * mod_revision afterwards when written. */
int ps_etcd_cas(ps_etcd *e, const char *key, const void *val, size_t len,
                int64_t expect_mod_rev, int64_t lease, bool *ok, int64_t *new_mod_rev,
                ps_status *st);
/* Unconditional put and delete (delete of a missing key is not an error). */
int ps_etcd_put(ps_etcd *e, const char *key, const void *val, size_t len, int64_t lease,
                ps_status *st);
int ps_etcd_delete(ps_etcd *e, const char *key, ps_status *st);

/* Leases.  ps_etcd_lease_grant takes a TTL in seconds (etcd may raise it
 * to its minimum: *@ttl_out gives the granted one; may be NULL). */
int ps_etcd_lease_grant(ps_etcd *e, int64_t ttl_s, int64_t *id, int64_t *ttl_out,
                        ps_status *st);
int ps_etcd_lease_revoke(ps_etcd *e, int64_t id, ps_status *st);

/* Keeps lease @id alive from a thread of its own (a LeaseKeepAlive stream,
 * a keepalive every TTL/3, another endpoint when one fails).  When the
 * lease is gone (etcd says TTL 0), or no keepalive succeeded for the
 * lease's TTL, @on_lost(@arg, reason) runs once on that thread and the
 * keeper stops: the holder must then act as if its keys were deleted.
 * ps_etcd_keeper_stop joins the thread (on_lost does not run then) and
 * does not revoke the lease; on_lost must not call it (it would join its
 * own thread). */
typedef struct ps_etcd_keeper ps_etcd_keeper;
ps_etcd_keeper *ps_etcd_keeper_start(ps_etcd *e, int64_t id, int64_t ttl_s,
                                     void (*on_lost)(void *arg, const char *reason),
                                     void *arg, ps_status *st);
void ps_etcd_keeper_stop(ps_etcd_keeper *k);
/* CLOCK_MONOTONIC ns of the last acknowledged keepalive (or the start). */
int64_t ps_etcd_keeper_last_ok_ns(const ps_etcd_keeper *k);

/* Watches a key (or every key under a prefix) from a thread of its own,
 * from revision @start_rev (0: from now).  @fn runs on that thread for
 * every change, in revision order: @deleted for a delete (then @val is
 * NULL).  The stream sends "hasleader: true", so a member that lost its
 * quorum ends it; the watcher then re-creates it on the next endpoint,
 * from the revision after the last event it delivered, so no event is
 * lost or repeated.  If that revision was compacted, @fn gets
 * @key = NULL once (the caller must re-read) and the watch goes on from
 * the compaction revision (the oldest etcd still has), so nothing after
 * the caller's re-read is missed. */
typedef void (*ps_etcd_watch_fn)(void *arg, const char *key, const char *val, size_t len,
                                 int64_t mod_rev, bool deleted);
typedef struct ps_etcd_watch ps_etcd_watch;
ps_etcd_watch *ps_etcd_watch_start(ps_etcd *e, const char *key, bool prefix,
                                   int64_t start_rev, ps_etcd_watch_fn fn, void *arg,
                                   ps_status *st);
/* Ends the stream and joins the thread; @fn does not run afterwards. */
void ps_etcd_watch_stop(ps_etcd_watch *w);

#endif
