/* Checkpoint RPCs of the ps: Snapshot, Release, Save, Merge, Restore. */
#ifndef PS_CKPT_H
#define PS_CKPT_H

#include "common/rpc.h"

extern const ps_rpc_handler ps_ckpt_handlers[5];

#endif
