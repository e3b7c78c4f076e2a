/* Checkpoint RPCs of the ps: Snapshot, Release, Save, Merge, Restore. */
#ifndef PS_CKPT_H
#define PS_CKPT_H

#include "common/rpc.h"

/* Shutdown: _abort() asks every running save, merge and restore to stop at
 * its next safe point (a save cut short leaves the previous checkpoint as
 * it was); _wait() returns once none runs any more.  Call _wait() before
 * the store or service is destroyed.  Any thread. */
void ps_ckpt_abort_all(void);
void ps_ckpt_wait_all(void);

extern const ps_rpc_handler ps_ckpt_handlers[5];

#endif
