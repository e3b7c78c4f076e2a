/* Replication of a ps's shards (ps-server --replicas R; DESIGN.md
 * "Replication"): the data plane.  ps/member.c owns membership (etcd,
 * the view, failure detection, promotion, fencing) and drives this
 * module through the functions below; ps/service*.c calls the hooks in
 * ps/repl_internal.h on every request.
 *
 * Without a ps_repl (R = 1) nothing here runs: the service's hooks are a
 * NULL check. */
#ifndef PS_REPL_H
#define PS_REPL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/rpc.h"
#include "common/status.h"
#include "common/view.h"

struct ps_service;
typedef struct ps_repl ps_repl;

/* What the data plane tells membership.  Each runs on a thread of the
 * replication module and must not block for long (post work to
 * membership's own thread). */
typedef struct ps_repl_callbacks {
  /* A backup @task failed to apply replication of shard @s (its Replicate
   * call failed: @reason).  The updates waiting on it are held, neither
   * acknowledged nor failed, until a view without @task in shard @s is set
   * (ps_repl_set_view: then they are acknowledged) or ps_repl_fence. */
  void (*backup_failed)(void *arg, int s, int task, const char *reason);
  /* Syncing backup @task of shard @s holds the whole shard (the state copy
   * and every update since were applied): membership marks it in sync. */
  void (*synced)(void *arg, int s, int task);
  void *arg;
} ps_repl_callbacks;

/* @self: this ps's task index; @addrs[i]: ps/i's address (copied);
 * @sec: how to call the other ps tasks (their role's token; may be NULL). */
ps_repl *ps_repl_create(struct ps_service *svc, int self, int ntasks,
                        const char *const *addrs, const ps_rpc_channel_security *sec,
                        const ps_repl_callbacks *cb, ps_status *st);
/* Stops the senders (held updates fail UNAVAILABLE "ps/N is shutting
 * down") and frees everything.  The service must no longer call hooks:
 * call it after ps_rpc_server_shutdown() (no new call) and before
 * waiting for its done callback (held calls end only here). */
void ps_repl_destroy(ps_repl *r);

/* A new view (copied).  The data plane then: serves as primary the shards
 * @v names it primary of (others are refused FAILED_PRECONDITION naming
 * the primary); forwards each shard's updates to its backups; starts the
 * state copy to a backup that is new and SYNCING; acknowledges updates
 * held for a backup the view no longer lists; on a shard where this ps
 * is newly SYNCING, drops what it held of the shard before the copy
 * arrives.  Views with an epoch not above the current one are ignored. */
void ps_repl_set_view(ps_repl *r, const ps_view *v);

/* The replication link (DESIGN.md "The replication link"): batches to and
 * from the other replicas over a plain TCP connection of their own, not
 * as Replicate calls.  Listens on @bind_host (NULL: every interface), on
 * @port (0: one the kernel picks), which a primary learns from a Replicate call
 * (the replica role's token, when tokens are required), with a key it
 * presents on connecting.  Not with TLS (the link is not encrypted): then
 * and without this call, batches go as Replicate calls. */
int ps_repl_link_start(ps_repl *r, const char *bind_host, int port, ps_status *st);
int64_t ps_repl_epoch(const ps_repl *r);

/* Cut-through (ps/repl_stage.c): an Update about to receive large assign
 * values @bufs[i] (filled from byte @offs[i] of its bulk bytes; each at
 * least PS_REPL_STAGE_MIN) for shard @shard, which this ps is primary of,
 * forwards them to the shard's backups while they arrive.  NULL: nothing
 * to forward to (no link, no backup, out of memory): the values go with
 * the update's entries as usual.  Progress: how many bulk bytes arrived
 * (ps_rpc_call_on_progress).  End: once the update's effects are
 * committed, or it failed (a stage no entry names is dropped). */
typedef struct ps_repl_staging ps_repl_staging;
#define PS_REPL_STAGE_MIN ((size_t)2 << 20)
ps_repl_staging *ps_repl_stage_begin(ps_repl *r, int shard, ps_buf *const *bufs,
                                     const size_t *offs, size_t n);
void ps_repl_stage_progress(ps_repl_staging *g, size_t received);
void ps_repl_stage_end(ps_repl_staging *g);

/* Cut off (its lease is gone, or a view names another primary of a shard
 * it served): from now on it acknowledges nothing; held and new updates
 * fail UNAVAILABLE "ps/N is fenced: REASON".  Health answers NOT_SERVING.
 * Final: a fenced ps-server exits (or is restarted) and rejoins fresh. */
void ps_repl_fence(ps_repl *r, const char *reason);
bool ps_repl_fenced(const ps_repl *r, char *reason, size_t n);

/* For metrics and Status: shards with fewer replicas than R, failovers
 * seen, replication bytes and entries not yet acknowledged. */
typedef struct ps_repl_stats {
  int64_t epoch;
  int replicas_missing; /* over the shards this ps is primary of */
  long long failovers;  /* promotions of this ps */
  long long lag_entries, lag_bytes;
  long long sent_bytes, applied_bytes;
  long long cut_through_bytes; /* forwarded while they arrived */
} ps_repl_stats;
void ps_repl_get_stats(ps_repl *r, ps_repl_stats *out);

#endif
