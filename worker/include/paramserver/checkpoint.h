/* Checkpoint directories the way TensorFlow's tf.train.Saver keeps them.
 *
 * A checkpoint is a V2 bundle with prefix P (P.index, P.data-?????-of-?????,
 * optionally P.meta; see common/bundle.h).  A directory of checkpoints has a
 * `checkpoint` state file (text-format CheckpointState) naming the latest
 * one and the ones kept, oldest first:
 *
 *   model_checkpoint_path: "model.ckpt-1000"
 *   all_model_checkpoint_paths: "model.ckpt-900"
 *   all_model_checkpoint_paths: "model.ckpt-1000"
 *   all_model_checkpoint_timestamps: 1601612029.9504316
 *   all_model_checkpoint_timestamps: 1601613798.8340204
 *   last_preserved_timestamp: 1601611588.861176
 *
 * This module reads and writes that file byte for byte as TensorFlow does,
 * finds the latest checkpoint (tf.train.latest_checkpoint), applies the
 * Saver's retention policy (max_to_keep, keep_checkpoint_every_n_hours),
 * prints a checkpoint like inspect_checkpoint, and confines checkpoint
 * paths to a directory.
 *
 * Errors name the file and the fault ("checkpoint state /ckpt/checkpoint:
 * line 3: expected ':'"); codes: NOT_FOUND for a missing file or
 * checkpoint, DATA_LOSS for an unparsable state file, INVALID_ARGUMENT for
 * bad calls, PERMISSION_DENIED for a path outside its directory, and for
 * failed system calls the errno's code (ENOENT NOT_FOUND, EACCES/EPERM/EROFS
 * PERMISSION_DENIED, ENOSPC/EDQUOT RESOURCE_EXHAUSTED, EFBIG OUT_OF_RANGE,
 * others UNKNOWN) with strerror in the message.
 *
 * Threads: every function may be called from any thread; one
 * ps_ckpt_manager is used by one thread at a time, and two processes must
 * not manage the same directory at once. */
#ifndef PARAMSERVER_CHECKPOINT_H
#define PARAMSERVER_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "paramserver/api.h"
#include "paramserver/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TensorFlow's default latest_filename. */
#define PS_CKPT_STATE_FILENAME "checkpoint"

/* ---- The `checkpoint` state file ---------------------------------------- */

/* CheckpointState (tensorflow/python/training/checkpoint_state.proto).
 * Filled by the functions below, which own the strings and arrays (free
 * with ps_ckpt_state_free); a caller writing a state may point the fields
 * at its own memory. */
typedef struct ps_ckpt_state {
  char *model_checkpoint_path; /* NULL or "" if absent */
  size_t num_paths;
  char **all_model_checkpoint_paths;       /* oldest first */
  size_t num_timestamps;                   /* 0, or num_paths when valid */
  double *all_model_checkpoint_timestamps; /* unix seconds */
  double last_preserved_timestamp;         /* 0 = absent */
} ps_ckpt_state;

/* Decodes the protobuf text format of a CheckpointState from @p[0..n) as
 * Python's text_format.Merge does: fields in any order and repeated
 * (scalars: last wins), `field: [v1, v2]` lists, optional ',' or ';' after
 * a field, '#' comments, single- or double-quoted strings with C escapes
 * (\n \t \" \\ \ooo \xhh \uXXXX ...), adjacent strings concatenated, float
 * literals such as 1e+16, inf, nan, 2.5f.  Paths are returned as written
 * (not joined with a directory).  DATA_LOSS "line N: ..." on a syntax
 * error, an unknown field or a NUL byte in a path; @state is then empty. */
PS_API int ps_ckpt_state_parse(const uint8_t *p, size_t n, ps_ckpt_state *state,
                               ps_status *st);

/* Encodes @state exactly as TensorFlow's text_format.MessageToString does:
 * one "field: value\n" line per value, in field-number order; strings in
 * double quotes with Python's CEscape (\n \r \t \" \' \\, other bytes
 * below 0x20 or above 0x7e as three-digit octal); doubles as Python's
 * repr(); an empty model_checkpoint_path and a zero
 * last_preserved_timestamp are omitted (proto3 defaults).  Returns a
 * malloc'd NUL-terminated string (length in *@len if not NULL); NULL and
 * INVALID_ARGUMENT if num_timestamps is neither 0 nor num_paths. */
PS_API char *ps_ckpt_state_format(const ps_ckpt_state *state, size_t *len, ps_status *st);

/* Reads @dir/checkpoint (TensorFlow's get_checkpoint_state): NOT_FOUND if
 * there is none, DATA_LOSS if it does not parse or has no
 * model_checkpoint_path ("Invalid checkpoint state loaded from DIR").
 * Relative paths are joined with @dir as os.path.join does.  @state is
 * overwritten (not freed first); on error it is left empty. */
PS_API int ps_ckpt_state_read(const char *dir, ps_ckpt_state *state, ps_status *st);

/* Writes @dir/checkpoint atomically, exactly as ps_ckpt_state_format: a
 * temporary "checkpoint.tmp<32 hex>" in @dir is written, fsynced and
 * renamed over the state file, then @dir is fsynced, so a crash or a
 * failed write leaves the previous file whole (the temporary is removed on
 * error).  Paths are written as given.  INVALID_ARGUMENT for an empty
 * model_checkpoint_path, mismatched timestamps, or a model_checkpoint_path
 * that is the state file itself. */
PS_API int ps_ckpt_state_write(const char *dir, const ps_ckpt_state *state,
                               ps_status *st);

/* Frees what ps_ckpt_state_read/parse filled in and empties @state.  NULL
 * and an empty state are no-ops. */
PS_API void ps_ckpt_state_free(ps_ckpt_state *state);

/* ---- latest_checkpoint ------------------------------------------------- */

/* tf.train.latest_checkpoint: the state file's model_checkpoint_path
 * (joined with @dir if relative) if "<prefix>.index" exists.  On success
 * *@prefix_out is malloc'd (caller frees).  NOT_FOUND "no checkpoint in DIR
 * (no DIR/checkpoint)" or "Couldn't match files for checkpoint P"; the
 * state file's own errors as ps_ckpt_state_read. */
PS_API int ps_latest_checkpoint(const char *dir, char **prefix_out, ps_status *st);

/* ---- Retention --------------------------------------------------------- */

typedef struct ps_ckpt_manager_options {
  /* Checkpoints listed in the state file; older ones are deleted.  0 keeps
   * every checkpoint's files and lists only the latest (TF: None or 0). */
  int max_to_keep;
  /* An evicted checkpoint is kept anyway (and no longer listed) if its
   * timestamp is at least this many hours after the last preserved one;
   * <= 0 disables this. */
  double keep_checkpoint_every_n_hours;
} ps_ckpt_manager_options;

/* TensorFlow's defaults: max_to_keep 5, keep_checkpoint_every_n_hours
 * 10000. */
PS_API void ps_ckpt_manager_options_init(ps_ckpt_manager_options *opt);

typedef struct ps_ckpt_manager ps_ckpt_manager;

/* Manages the checkpoints of @dir with @opt (NULL = defaults), picking up
 * the state file if there is one: its paths and timestamps (or, for a
 * state file TensorFlow 1.x wrote without timestamps, the mtime of each
 * P.index) and last_preserved_timestamp, so a restarted process keeps the
 * policy.  Timestamps later than @now (seconds) are clamped to @now.  An
 * unparsable state file is logged and replaced at the next add (as
 * TensorFlow does); other read errors fail.  NULL on error. */
PS_API ps_ckpt_manager *ps_ckpt_manager_create(const char *dir,
                                               const ps_ckpt_manager_options *opt,
                                               double now, ps_status *st);
PS_API void ps_ckpt_manager_destroy(ps_ckpt_manager *m); /* NULL is a no-op */

/* Records the checkpoint @prefix just written (e.g. "DIR/model.ckpt-1000";
 * its directory must be the manager's, else INVALID_ARGUMENT) at time
 * @now: a path saved before moves to the end; if more than max_to_keep
 * remain, the oldest are evicted, and an evicted one whose timestamp is
 * keep_checkpoint_every_n_hours past the last preserved one is kept on
 * disk (and becomes the last preserved), the others are deleted
 * (ps_ckpt_remove).  The state file (paths relative to the directory,
 * timestamps, last_preserved_timestamp) is written atomically before any
 * file is deleted; if that write fails nothing changes, on disk or in @m.
 * Failures to delete are logged, not returned. */
PS_API int ps_ckpt_manager_add(ps_ckpt_manager *m, const char *prefix, double now,
                               ps_status *st);

/* The latest checkpoint (joined with the directory), NULL if none yet. */
PS_API const char *ps_ckpt_manager_latest(const ps_ckpt_manager *m);
/* Makes the list @paths[0..n) (oldest first; as the state file names them,
 * or as ps_ckpt_manager_path gave them): a path listed keeps its
 * timestamp, one of this directory that is not listed but whose index
 * exists comes back with its index's mtime (TensorFlow's
 * recover_last_checkpoints), others are skipped.  Checkpoints not in
 * @paths are dropped from the list; their files stay.  This is TensorFlow's
 * Saver, whose state file lists only the checkpoints it wrote, so its
 * retention never deletes another Saver's.  RESOURCE_EXHAUSTED when out of
 * memory (the list then holds the paths gathered so far). */
PS_API int ps_ckpt_manager_retain(ps_ckpt_manager *m, const char *const *paths, size_t n,
                                  ps_status *st);
/* The listed checkpoints, oldest first; pointers valid until the next
 * add or destroy. */
PS_API size_t ps_ckpt_manager_count(const ps_ckpt_manager *m);
PS_API const char *ps_ckpt_manager_path(const ps_ckpt_manager *m, size_t i);
PS_API double ps_ckpt_manager_timestamp(const ps_ckpt_manager *m, size_t i);

/* One-shot create + add + destroy, for a process that does not keep a
 * manager between saves. */
PS_API int ps_ckpt_record(const char *dir, const char *prefix,
                          const ps_ckpt_manager_options *opt, double now, ps_status *st);

/* Deletes P.index, P.data-NNNNN-of-NNNNN and P.meta (TensorFlow's
 * remove_checkpoint, index first so a half-deleted checkpoint is never
 * "latest").  Missing files are fine; the first other failure is returned,
 * after trying the rest. */
PS_API int ps_ckpt_remove(const char *prefix, ps_status *st);

/* ---- inspect_checkpoint ------------------------------------------------ */

/* Prints the checkpoint @prefix to @out, one line per tensor in name order:
 *   name (DT_FLOAT) [2,3]
 * (scalars "[]"; a partitioned tensor once, with its full shape; slice keys
 * hidden).  With @all_values, print_tensors_in_checkpoint_file's layout
 * instead: "tensor_name:  NAME" and on the next lines the value, nested
 * like numpy's str(): "[[1.0 2.0]\n [3.0 4.0]]", floats as Python's repr,
 * bools True/False, strings as Python bytes (b'abc'); more than 1000
 * elements are summarized with the first and last 3 per dimension and
 * "...".  A @prefix that is a directory means its latest checkpoint.
 * Errors are the bundle reader's (naming the file); a write error on @out
 * is UNKNOWN. */
PS_API int ps_ckpt_inspect(FILE *out, const char *prefix, bool all_values, ps_status *st);

/* ---- Path confinement -------------------------------------------------- */

/* Resolves the checkpoint prefix @prefix under the directory @root (for
 * the ps's --checkpoint-dir): a relative @prefix is joined with @root, an
 * absolute one must lie inside it; "." and ".." are resolved lexically and
 * the deepest existing component on the way (the file itself if it exists)
 * is resolved with realpath, so neither "../x" nor a symbolic link inside
 * @root (to a directory or to a file) can lead out of it; a link that does
 * not resolve is refused too (creating the file would follow it).  This is
 * the one confinement rule: the ps runs every file it opens, creates or
 * deletes for a checkpoint through it (ps/ckpt_*.c), and retention deletes
 * only what it accepts.  Writes the lexically normalized path (root-joined,
 * no "." or "..") to @resolved[0..n).  PERMISSION_DENIED naming both paths
 * if it escapes @root or through a dangling link; INVALID_ARGUMENT for an
 * empty @root or @prefix, a control character (bytes 0x01-0x1f, 0x7f) in
 * @prefix, a @prefix naming @root itself (its files would be beside @root),
 * or @n too small.  Checked, then used: a local user who can swap a
 * directory for a link between the two is not defended against here (files
 * are created under temporary names with O_EXCL and renamed, so a link at
 * a final name is replaced, never followed); the ps's save and merge also
 * hold their directories open and work through the descriptors. */
PS_API int ps_ckpt_path_confined(const char *root, const char *prefix, char *resolved,
                                 size_t n, ps_status *st);

#ifdef __cplusplus
}
#endif

#endif
