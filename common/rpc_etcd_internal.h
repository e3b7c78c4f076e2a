/* Shared by the etcd client's files (private to common/, included by
 * common/rpc_etcd*.c alone).  Layers, each calling only the files below:
 *   rpc_etcd_watch.c   watches (ps_etcd_watch_*), on a thread each
 *   rpc_etcd_lease.c   the lease keeper (ps_etcd_keeper_*), on a thread
 *   rpc_etcd_stream.c  bidi streams (Watch, LeaseKeepAlive)
 *   rpc_etcd.c         endpoints and channels, unary calls with failover,
 *                      the KV and lease calls
 *   rpc_etcd_decode.c  the decoders of etcd's answers (etcd_decode.h)
 * gRPC types appear here by their struct names only: the gRPC headers
 * themselves are included by the .c files (tests/check_layers.sh).
 * Names of functions shared between the files end in an underscore. */
#ifndef PS_RPC_ETCD_INTERNAL_H
#define PS_RPC_ETCD_INTERNAL_H

#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdint.h>

#include "etcd.h"

#define ETCD_MAX_ENDPOINTS 16

struct grpc_channel;

struct ps_etcd {
  int n;                        /* endpoints */
  char *ep[ETCD_MAX_ENDPOINTS]; /* "HOST:PORT" each */
  struct grpc_channel *ch[ETCD_MAX_ENDPOINTS];
  char *all;          /* the endpoints, comma-separated */
  int64_t timeout_ms; /* of every call (see rpc_etcd.c) */
  atomic_int cur;     /* the endpoint that answered last */
};

/* The monotonic clock in milliseconds. */
int64_t ps_etcd_now_ms_(void);

/* The current revision of the store (a count-only Range of @key). */
int ps_etcd_revision_(ps_etcd *e, const char *key, int64_t *rev, ps_status *st);

/* A bidi stream (Watch, LeaseKeepAlive) on one endpoint, with its own
 * completion queue, driven by one thread.  It sends "hasleader: true", so
 * a member without a leader ends it (ETCD_NOTES.md §3). */
typedef struct ps_etcd_stream ps_etcd_stream;
/* Opens @method on endpoint @ep (nothing is sent yet). */
ps_etcd_stream *ps_etcd_stream_open_(ps_etcd *e, int ep, const char *method,
                                     ps_status *st);
/* Sends @m, waiting at most @timeout_ms.  0, or an error naming the
 * endpoint (the stream is then of no more use). */
int ps_etcd_stream_send_(ps_etcd_stream *s, const ProtobufCMessage *m, int64_t timeout_ms,
                         ps_status *st);
/* Waits at most @timeout_ms for the next message: 1 with its bytes in
 * *@buf (malloc'd, caller frees) and *@len; 0 when none came in time
 * (call again); -1 when the stream ended (@st: its status, naming the
 * endpoint). */
int ps_etcd_stream_recv_(ps_etcd_stream *s, int64_t timeout_ms, uint8_t **buf,
                         size_t *len, ps_status *st);
/* The endpoint of the stream ("HOST:PORT"). */
const char *ps_etcd_stream_endpoint_(const ps_etcd_stream *s);
/* Cancels the call and frees everything (NULL: no-op). */
void ps_etcd_stream_close_(ps_etcd_stream *s);

/* Sleeps @ms in short slices, returning early once *@stop is set. */
void ps_etcd_sleep_ms_(int64_t ms, const atomic_int *stop);

#endif
