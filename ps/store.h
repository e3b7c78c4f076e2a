/* The ps variable store: name -> variable, and the operations on values.
 *
 * Lock order: the table lock, then variable locks in ascending name order
 * (ps_store_lock_set sorts).  A ps_var pointer stays valid while the
 * store lives: a deleted variable (ps_store_remove) leaves the table at
 * once, but its struct is kept until ps_store_destroy(), marked @deleted
 * under its write lock and without a value.  So a handler that looked a
 * variable up before it was deleted finds @deleted set once it holds the
 * variable's lock, and answers NOT_FOUND (ps_var_gone). */
#ifndef PS_STORE_H
#define PS_STORE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/init.h"
#include "common/status.h"
#include "common/tensor.h"

typedef struct ps_var {
  char *name;
  ps_dtype dtype;
  ps_shape shape;
  ps_buf *buf; /* NULL until initialized */
  bool has_init;
  ps_init_spec init;
  double *init_values;  /* owned copy of init.values */
  char *init_full_name; /* partitioned parts: the full variable's name */
  ps_shape init_full_shape;
  int64_t init_offset;
  int64_t version;
  /* Bumped whenever the value is replaced whole (initialize, assign,
   * restore): a synchronous accumulator then takes the next local step. */
  int64_t epoch;
  /* Synchronous training's conditional accumulator (ps/sync.h), created by
   * the first synchronous update; under @lock like the value. */
  struct ps_accum *accum;
  pthread_rwlock_t lock;
  struct ps_var *next; /* hash chain; then the list of deleted variables */
  bool deleted;        /* removed from the table (under @lock) */
  /* Replication: the shard the variable belongs to (the task whose
   * placement it has; set at Create from its Route, else this ps's own
   * index), fixed for the variable's life. */
  int shard;
} ps_var;

typedef struct ps_store ps_store;

ps_store *ps_store_create(const char *task);
void ps_store_destroy(ps_store *s);

/* Idempotent for an identical spec; ALREADY_EXISTS naming the difference
 * otherwise.  Also refused, to keep the checkpoint key space consistent
 * (a variable's key is its full name for a part of a partitioned variable,
 * else its name): a variable whose key is the full name of parts that
 * exist (ALREADY_EXISTS), a part whose full name is the key of another
 * variable (ALREADY_EXISTS), and a part whose dtype or full shape differ
 * from its sibling parts' or whose elements overlap a sibling's
 * (INVALID_ARGUMENT).  @init may be NULL (the client sends the value).  @full_name,
 * @full_shape describe the full variable of a partitioned part (NULL: the
 * variable itself).  Copies everything it keeps. */
int ps_store_create_var(ps_store *s, const char *name, ps_dtype dtype,
                        const ps_shape *shape, const ps_init_spec *init,
                        const char *full_name, const ps_shape *full_shape, int64_t offset,
                        bool *created, ps_status *st);
/* ps_store_create_var for shard @shard (a new variable gets it; an
 * existing one keeps its own). */
int ps_store_create_var_in(ps_store *s, int shard, const char *name, ps_dtype dtype,
                           const ps_shape *shape, const ps_init_spec *init,
                           const char *full_name, const ps_shape *full_shape,
                           int64_t offset, bool *created, ps_status *st);
/* The shard of variables created without one: N of a task named "ps/N",
 * else 0. */
int ps_store_own_shard(const ps_store *s);
ps_var *ps_store_lookup(ps_store *s, const char *name);
/* NOT_FOUND "variable NAME does not exist on ps/0". */
ps_var *ps_store_find(ps_store *s, const char *name, ps_status *st);

/* NOT_FOUND "variable NAME does not exist on ps/0" if @v was deleted
 * (caller holds @v's lock), else 0. */
int ps_var_gone(ps_store *s, const ps_var *v, ps_status *st);

/* Flags of ps_store_remove(). */
#define PS_REMOVE_SLOTS 1      /* also NAME/SLOT variables (one more path part) */
#define PS_REMOVE_MISSING_OK 2 /* a name that matches nothing is not an error */
/* Takes the variables @names match out of the table, atomically: each
 * name matches the variable of that name and, if it is the full name of a
 * partitioned variable, its parts; with PS_REMOVE_SLOTS also every
 * variable named M/S where M is a matched variable and S has no '/'
 * (TensorFlow's slot names: w/Momentum, w/part_0/Adam_1).  A name that
 * matches nothing is NOT_FOUND (nothing is removed) unless
 * PS_REMOVE_MISSING_OK; then @missing (may be NULL; @n entries) tells which
 * names matched nothing.  *@out (malloc'd, sorted by name, caller frees the
 * array) receives the removed variables: the caller then marks each with
 * ps_var_mark_deleted() under its write lock.  A name removed can be
 * created again at once. */
int ps_store_remove(ps_store *s, char *const *names, size_t n, int flags, ps_var ***out,
                    size_t *nout, bool *missing, ps_status *st);
/* The same, matching only variables of @shard (its parts and slots too;
 * -1: any): a replicated ps holds other shards' variables beside the
 * ones a request names. */
int ps_store_remove_in(ps_store *s, int shard, char *const *names, size_t n, int flags,
                       ps_var ***out, size_t *nout, bool *missing, ps_status *st);
/* Marks removed @v deleted and frees its value (caller holds the write
 * lock).  Its accumulator's waiters must have been failed first. */
void ps_var_mark_deleted(ps_store *s, ps_var *v);

/* All variables sorted by name; caller frees the array (not the vars). */
ps_var **ps_store_list(ps_store *s, size_t *n);
void ps_store_totals(ps_store *s, int64_t *nvars, int64_t *bytes);
const char *ps_store_task(const ps_store *s);

/* Locks @vars (duplicates allowed) in name order; write or read mode.
 * Returns whether each variable appeared once.  Never fails: with no
 * memory to sort a large set it orders it by passes over @vars. */
bool ps_store_lock_set(ps_var **vars, size_t n, bool write);
void ps_store_unlock_set(ps_var **vars, size_t n);

/* Runs @v's initializer (caller holds @v's write lock).  FAILED_PRECONDITION
 * if @v has none. */
int ps_var_run_initializer(ps_store *s, ps_var *v, ps_status *st);

/* @v's initial value in a new buffer, without installing it (caller
 * holds @v's lock); NULL with @st set (FAILED_PRECONDITION without an
 * initializer, INVALID_ARGUMENT from the initializer, RESOURCE_EXHAUSTED).
 * Install it with ps_var_set_buf(). */
ps_buf *ps_var_init_buf(ps_store *s, ps_var *v, ps_status *st);

/* Replaces @v's value with @buf (takes a reference).  Caller holds the
 * write lock and has validated dtype and size.  No-op on a deleted
 * variable. */
void ps_var_set_buf(ps_store *s, ps_var *v, ps_buf *buf, const ps_shape *shape);
/* Makes @v's buffer private (copy on write) before an in-place update.
 * Returns 0 or RESOURCE_EXHAUSTED. */
int ps_var_make_private(ps_var *v, ps_status *st);

/* ---- consistent snapshots ----
 *
 * Updates pass a gate.  A snapshot closes the gate, waits for the updates
 * in flight, and takes a reference on every variable's buffer (writers
 * copy a referenced buffer before changing it, so the snapshot stays as it
 * was).  The coordinator closes the gate on every ps, then opens them all:
 * every variable of every ps is captured as of one moment, and training
 * stalls only for those two round trips, not for the file writes.  A gate
 * left closed (coordinator gone) reopens by itself after its hold time. */
typedef struct ps_snapshot_entry {
  char *name;
  ps_dtype dtype;
  ps_shape shape;
  ps_buf *buf;
  /* A part of a partitioned variable, as it was at the snapshot (the
   * variable may be deleted or created again since): its full name
   * (NULL for a plain variable), full shape and first element. */
  char *full_name;
  ps_shape full_shape;
  int64_t offset;
  /* Its checkpoint key when a Saver renames it (NULL: the name, or for a
   * part the full name). */
  char *key;
} ps_snapshot_entry;

struct ps_embed_snap;
typedef struct ps_snapshot {
  int64_t id;
  size_t n;
  ps_snapshot_entry *e; /* sorted by name */
  int64_t bytes;
  /* the embedding tables (ps/embed.h), in a cluster save of the whole ps */
  struct ps_embed_snap **tables;
  size_t ntables;
} ps_snapshot;

void ps_snapshot_free(ps_snapshot *snap);
/* The embedding tables a snapshot of every variable (no selection, no
 * shards) takes too; set once, before serving. */
struct ps_embed_store;
void ps_store_set_tables(ps_store *s, struct ps_embed_store *tables);

/* Enters the gate and returns true, or, while a snapshot holds it closed,
 * queues @fn(@arg) to run (entered) when it reopens and returns false: an
 * update never blocks an RPC thread.  Every entry ends with _leave(). */
typedef void (*ps_gate_fn)(void *arg);
/* Updates that waited at a closed gate so far (for metrics). */
unsigned long long ps_store_gate_waits(ps_store *s);
bool ps_store_update_enter(ps_store *s, ps_gate_fn fn, void *arg);
/* The same for an update holding @bytes (its staged values): while the
 * gate is closed, the parked updates together may hold at most the
 * store's park limit and be at most PS_STORE_MAX_PARKED calls; past it
 * the update is refused (RESOURCE_EXHAUSTED naming the limit, returned;
 * nothing queued).  Otherwise 0, with *@parked telling whether @fn was
 * queued (true) or the gate entered (false). */
#define PS_STORE_MAX_PARKED 4096
int ps_store_update_admit(ps_store *s, ps_gate_fn fn, void *arg, int64_t bytes,
                          bool *parked, ps_status *st);
/* Limits of the gate: the longest hold (a snapshot asking for more is
 * clamped to it, with a warning) and the bytes parked updates may hold
 * (the --max-tensor-bytes limit: parked updates together may hold no
 * more than one tensor may).  Call before serving. */
void ps_store_set_gate_limits(ps_store *s, int64_t max_hold_ms, int64_t max_parked_bytes);
void ps_store_update_leave(ps_store *s);
/* Reopens a gate held past its limit (call periodically). */
void ps_store_gate_tick(ps_store *s);
/* Reopens a closed gate now, running the parked updates (shutdown). */
void ps_store_gate_open(ps_store *s);
/* Closes the gate for at most @hold_ms (clamped to the store's maximum
 * hold) and captures the variables (all, or
 * the initialized ones if @skip_uninitialized; otherwise an uninitialized
 * one is FAILED_PRECONDITION naming it and the gate is reopened).  The
 * snapshot is kept under @id until ps_store_snapshot_take(). */
int ps_store_snapshot_begin(ps_store *s, int64_t id, int64_t hold_ms,
                            bool skip_uninitialized, ps_status *st);
/* A Saver's selection: only these variables, each saved under keys[i]
 * (NULL or "": its own name). */
typedef struct ps_snapshot_select {
  const char *const *names;
  const char *const *keys;
  size_t n;
} ps_snapshot_select;
/* ps_store_snapshot_begin of the variables of @sel only (NULL: all); a
 * selected name that does not exist is NOT_FOUND naming it. */
int ps_store_snapshot_begin_sel(ps_store *s, int64_t id, int64_t hold_ms,
                                bool skip_uninitialized, const ps_snapshot_select *sel,
                                ps_status *st);
/* ps_store_snapshot_begin_sel of the variables of the shards @shards[i]
 * says (@nshards of them; NULL: all): replication's "every shard this ps
 * is the primary of". */
int ps_store_snapshot_begin_in(ps_store *s, int64_t id, int64_t hold_ms,
                               bool skip_uninitialized, const ps_snapshot_select *sel,
                               const bool *shards, size_t nshards, ps_status *st);
void ps_store_snapshot_release(ps_store *s, int64_t id);
/* ps_store_snapshot_begin_sel of a Saver's selection that also takes
 * every embedding table (its graph has tables), all before the snapshot
 * is kept. */
int ps_store_snapshot_begin_tables(ps_store *s, int64_t id, int64_t hold_ms,
                                   bool skip_uninitialized, const ps_snapshot_select *sel,
                                   ps_status *st);
/* Size of the held snapshot @id (0, 0 if none). */
void ps_store_snapshot_stats(ps_store *s, int64_t id, int64_t *nvars, int64_t *bytes);
/* The snapshot with @id (caller owns it), or NULL. */
ps_snapshot *ps_store_snapshot_take(ps_store *s, int64_t id);

/* Accounting of bytes held (for status). */
void ps_store_account(ps_store *s, int64_t delta);

#endif
