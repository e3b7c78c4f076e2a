/* Checkpoint RPCs of the ps: Snapshot, Release, Save, Merge, Restore. */
#ifndef PS_CKPT_H
#define PS_CKPT_H

#include "common/rpc.h"

/* Shutdown: _abort() asks every running save, merge and restore to stop at
 * its next safe point (a save cut short leaves the previous checkpoint as
 * it was); _wait() returns once none runs any more, and then removes the
 * parts this ps wrote as a save's merging (last) shard that no merge took:
 * stopped, it will merge none (with the whole temp directory when no one
 * else works in it).  Call _wait() before the store or service is
 * destroyed.  Any thread. */
void ps_ckpt_abort_all(void);
void ps_ckpt_wait_all(void);

/* A leftover "P_temp" directory of a crashed save is removed only when no
 * save or merge holds its lock and nothing in it changed for this long
 * (the checkpoint directory is shared: another ps may be saving now). */
#define PS_CKPT_TEMP_STALE_SECS 600

/* At startup: removes the stale "*_temp" directories under @dir (the
 * --checkpoint-dir, 8 levels deep, links not followed), as each save does
 * in its own directory.  0, or an error naming @dir if it cannot be
 * resolved; failures to remove are logged.  Any thread. */
int ps_ckpt_sweep(const char *dir, ps_status *st);

extern const ps_rpc_handler ps_ckpt_handlers[5];

#endif
