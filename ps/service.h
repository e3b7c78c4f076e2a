/* RPC handlers of the paramserver.Ps service over a ps_store. */
#ifndef PS_SERVICE_H
#define PS_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rpc.h"
#include "store.h"

typedef struct ps_service ps_service;

/* Limits on what one request may make the ps hold or do (flags of
 * ps-server; ps/SERVER.md "Limits").  Exceeding one is RESOURCE_EXHAUSTED naming
 * the limit and its flag, checked before anything is allocated. */
typedef struct ps_service_limits {
  /* one variable, value, index list or gather response; also the bytes
   * one Update stages or one Read gathers together, and the bytes of the
   * updates parked at a closed snapshot gate together (--max-tensor-bytes) */
  int64_t max_tensor_bytes;
  int64_t max_read_names;  /* items of one Read (--max-read-names) */
  int64_t max_gather_rows; /* rows of one gather response (--max-gather-rows) */
  /* longest a snapshot holds updates: a longer hold_ms is clamped to it,
   * with a warning (--max-hold-ms) */
  int64_t max_hold_ms;
  /* bytes the checkpoint directory may hold: a Save whose shard would take
   * it over is refused, RESOURCE_EXHAUSTED (--max-checkpoint-bytes;
   * 0: no quota) */
  int64_t max_checkpoint_bytes;
} ps_service_limits;

/* The defaults: physical memory, 100000 names, 1048576 rows, 60000 ms. */
void ps_service_limits_default(ps_service_limits *l);

ps_service *ps_service_create(ps_store *store, const char *task);
void ps_service_destroy(ps_service *svc);
/* Address reported by Status (set once bound). */
void ps_service_set_address(ps_service *svc, const char *addr);
ps_store *ps_service_store(ps_service *svc);
/* The embedding tables of this ps (ps/embed.h). */
struct ps_embed_store;
struct ps_embed_store *ps_service_tables(ps_service *svc);
/* Replaces the limits (call before the server starts); passes the gate's
 * to the store (ps_store_set_gate_limits). */
void ps_service_set_limits(ps_service *svc, const ps_service_limits *l);
const ps_service_limits *ps_service_limits_of(const ps_service *svc);
/* Root of every checkpoint path (NULL: saving and restoring are refused). */
void ps_service_set_checkpoint_dir(ps_service *svc, const char *dir);
const char *ps_service_checkpoint_dir(ps_service *svc);
/* How a save updates the `checkpoint` state file of its directory:
 * TensorFlow's retention (max_to_keep: 0 lists only the latest, -1 keeps
 * all; keep_every_n_hours: 0 never), over the directory's list, or with
 * @own_list over a Saver's own list @own[0..nown) only (MergeRequest). */
typedef struct ps_state_update {
  int max_to_keep;
  double keep_every_n_hours;
  bool own_list;
  const char *const *own;
  size_t nown;
} ps_state_update;

/* Records @prefix in its directory's state file as @u says, through
 * @dirfd, that directory held open (see common/checkpoint_at.h).  *@listed
 * (malloc'd strings in one malloc'd array, freed by the caller; may be
 * NULL) gets the list the state file names afterwards, oldest first. */
int ps_service_update_state(ps_service *svc, int dirfd, const char *prefix,
                            const ps_state_update *u, char ***listed, size_t *nlisted,
                            ps_status *st);
/* The latest checkpoint of the checkpoint directory (malloc'd). */
int ps_service_latest(ps_service *svc, char **prefix, ps_status *st);

/* Call when the server stops accepting calls (SIGTERM): Update calls
 * waiting for a synchronous step fail at once with UNAVAILABLE, and from
 * now on synchronous updates are refused, so the server's calls can all
 * finish.  Any thread. */
void ps_service_shutdown(ps_service *svc);
/* What a Shutdown call runs (after its answer is queued): the daemon's own
 * stop, as on SIGTERM.  Must be safe from any thread (e.g. uv_async_send).
 * Without a hook, Shutdown is UNIMPLEMENTED. */
void ps_service_set_shutdown_hook(ps_service *svc, void (*fn)(void *), void *arg);
/* A shard was saved: when it ended (wall clock, seconds since the epoch),
 * how long it took and its bytes; and the last one, for metrics. */
void ps_service_saved(ps_service *svc, double end, double secs, long long bytes);
void ps_service_last_save(ps_service *svc, double *end, double *secs, long long *bytes,
                          long long *count);

/* Replication (ps/repl.h): @r serves this service's shards replicated
 * (NULL: unreplicated, R = 1).  Set before the server starts; the service
 * does not own @r (destroy it after the server stopped, before the
 * service). */
struct ps_repl;
void ps_service_set_repl(ps_service *svc, struct ps_repl *r);
struct ps_repl *ps_service_repl(ps_service *svc);

/* The handler table for ps_rpc_server_create(); user pointer = the service. */
const ps_rpc_handler *ps_service_handlers(size_t *n);

#endif
