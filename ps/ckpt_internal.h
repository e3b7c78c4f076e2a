/* Shared by the files of the checkpoint RPCs (ckpt.c describes them):
 *   ckpt_fs.c       paths confined under --checkpoint-dir, directories
 *                   held open;
 *   ckpt_jobs.c     the save, merge and restore threads, the quota, the
 *                   parts no merge took, fault injection;
 *   ckpt_sweep.c    the sweep of leftover temp directories;
 *   ckpt_table.c    embedding tables read back from a checkpoint;
 *   ckpt_save.c, ckpt_merge.c, ckpt_restore.c  those RPCs;
 *   ckpt.c          Snapshot, Release and the handler table.
 * Each file calls only files listed above it (no circles).  Private to
 * ps/. */
#ifndef PS_CKPT_INTERNAL_H
#define PS_CKPT_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "common/rpc.h"
#include "common/status.h"
#include "common/tensor.h"
#include "paramserver/checkpoint.h"
#include "ps.pb-c.h"
#include "service.h"
#include "store.h"

/* ckpt_fs.c */
/* A directory of the checkpoint tree opened once: every file a save or a
 * merge then creates, renames or deletes in it goes through @fd (openat,
 * renameat, unlinkat, or the /proc/self/fd/N magic link, which names the
 * opened directory itself, for code that takes paths), so a component of
 * its path swapped for a symbolic link after the open changes nothing. */
typedef struct held_dir {
  int fd;
  char path[PATH_MAX]; /* as the user sees it, for messages */
  char proc[64];       /* "/proc/self/fd/N" */
} held_dir;

int ps_ckpt_path_(const char *root, const char *prefix, char *out, size_t n,
                  ps_status *st);
int ps_ckpt_check_raw_prefix_(const uint8_t *p, size_t n, uint32_t field, const char *m,
                              ps_status *st);
void ps_ckpt_held_close_(held_dir *h);
int ps_ckpt_held_open_(const char *root, const char *dir, bool create, held_dir *h,
                       ps_status *st);
int ps_ckpt_held_sub_(const held_dir *parent, const char *name, bool create, int how,
                      held_dir *h);
void ps_ckpt_held_msg_(ps_status *st, const held_dir *h);
const char *ps_ckpt_split_base_(const char *path, char *dir, size_t n);
void ps_ckpt_empty_dir_(int fd);
int ps_ckpt_confine_bundle_(const char *root, const char *prefix, int nshards,
                            ps_status *st);

/* ckpt_jobs.c */
/* What a save needs of a variable besides its snapshot entry, copied when
 * the snapshot is taken: the save thread never looks at the store. */
typedef struct part_info {
  char *full_name; /* NULL: not a part of a partitioned variable */
  ps_shape full_shape;
  int64_t offset;
} part_info;

/* A Saver's own list of checkpoints in a Merge (MergeRequest.own_paths):
 * far beyond any max_to_keep. */
#define MAX_OWN_PATHS 10000

typedef struct job {
  ps_rpc_call *c;
  ps_service *svc;
  ps_snapshot *snap;
  part_info *pi; /* [snap->n] */
  char task[64];
  char prefix[PATH_MAX]; /* checkpoint prefix (absolute) */
  char part[PATH_MAX + 64];
  int shard, nshards;
  /* merge */
  ps_state_update su;
  Paramserver__MergeRequest *mrq; /* owns su.own */
  /* restore */
  Paramserver__RestoreRequest *rq;
  size_t *item_of; /* per variable restored: its item of rq */
  ps_status st;
  int64_t reserved; /* --max-checkpoint-bytes: bytes this save holds back */
} job;

/* --max-checkpoint-bytes: serializes the quota checks (and a merge's
 * moves out of the temp directory). */
extern pthread_mutex_t ps_ckpt_quota_mu_;

void ps_ckpt_unmerged_add_(const char *root, const char *part, const char *idx);
void ps_ckpt_job_done_(void);
bool ps_ckpt_aborting_(void *arg);
void ps_ckpt_crash_point_(const char *point);
void ps_ckpt_slow_point_(const char *point);
int ps_ckpt_bad_request_(ps_status *st, const char *m);
void ps_ckpt_job_free_(ps_rpc_call *c);
job *ps_ckpt_job_new_(ps_rpc_call *c);
int ps_ckpt_job_check_(job *j, const char *what);
int ps_ckpt_spawn_(void *(*fn)(void *), job *j, ps_status *st);
int ps_ckpt_check_quota_(job *j, const char *op, const char *what, int64_t adds,
                         bool hold, ps_status *st);

/* ckpt_sweep.c */
int ps_ckpt_sweep_dir_(int dfd, const char *shown, int depth);

/* ckpt_table.c */
struct ps_bundle_reader;
struct ps_embed_table;
/* A table a restore puts back: from the checkpoint's table @key. */
typedef struct ps_ckpt_table {
  struct ps_embed_table *t;        /* referenced */
  const char *key;                 /* borrowed */
  struct ps_embed_table *prepared; /* its new rows, until committed */
  int64_t rows;
} ps_ckpt_table;
/* Reads every shard of the table into this ps's rows (task @task of
 * @ntasks) and, unless @check_only, prepares them (ps_embed_replace_prepare).
 * NOT_FOUND (no such table), INVALID_ARGUMENT (dtype, shape, dim),
 * DATA_LOSS (a shard missing or corrupt), RESOURCE_EXHAUSTED. */
int ps_ckpt_table_stage_(struct ps_bundle_reader *r, ps_ckpt_table *tj, int task,
                         int ntasks, bool check_only, ps_status *st);

/* ckpt_save.c, ckpt_merge.c, ckpt_restore.c: the handlers */
void ps_ckpt_remove_bundle_(const char *prefix, int nshards);
int ps_ckpt_save_header_(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st);
int ps_ckpt_save_data_(ps_rpc_call *c, ps_status *st);
int ps_ckpt_merge_header_(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st);
int ps_ckpt_merge_data_(ps_rpc_call *c, ps_status *st);
int ps_ckpt_restore_header_(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st);
int ps_ckpt_restore_data_(ps_rpc_call *c, ps_status *st);

#endif
