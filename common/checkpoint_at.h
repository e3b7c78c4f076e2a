/* The checkpoint directory's code through a directory held open (the ps:
 * ps/ckpt_fs.c), so that a component of the directory's path swapped for a
 * symbolic link after the directory was opened leads nowhere.  The
 * path-based API is worker/include/paramserver/checkpoint.h. */
#ifndef PS_COMMON_CHECKPOINT_AT_H
#define PS_COMMON_CHECKPOINT_AT_H

#include "paramserver/checkpoint.h"
#include "paramserver/status.h"

/* ps_ckpt_manager_create for the directory @dirfd (kept open by the caller
 * until ps_ckpt_manager_destroy; AT_FDCWD: by the path @dir, as
 * ps_ckpt_manager_create).  @dir is its path as the user sees it: entries
 * of the state file are joined with it and must lie below it to be
 * deleted; messages name it.  The state file is read, written (temporary
 * file, rename, fsync) and the evicted checkpoints are deleted through
 * @dirfd only, no symbolic link followed, none of its ".." taken. */
ps_ckpt_manager *ps_ckpt_manager_create_at(int dirfd, const char *dir,
                                           const ps_ckpt_manager_options *opt, double now,
                                           ps_status *st);

/* ps_ckpt_remove of the checkpoint @base in the directory @dirfd (@dir
 * names it in messages): its .index, .data-?????-of-????? and .meta are
 * unlinked there (a link itself, never what it names). */
int ps_ckpt_remove_at(int dirfd, const char *dir, const char *base, ps_status *st);

#endif
