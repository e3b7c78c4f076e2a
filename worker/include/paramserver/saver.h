/* Saver and MetaGraph for worker graphs (TensorFlow's tf.train.Saver,
 * export_meta_graph and import_meta_graph).
 *
 * A save is consistent across the ps (ps_client_save, as of one moment) and
 * holds exactly the Saver's var_list (default: the graph's global
 * variables), each under its key, as Saver({"my_v2": v2}) does; a restore
 * reads the same keys.  Variables held by the session itself (no ps
 * device) are saved and restored through a staging variable on ps 0 that
 * lives for the call.
 *
 * Checkpoint paths are relative to the ps tasks' --checkpoint-dir.  The
 * MetaGraph goes with every save by default (TensorFlow's
 * write_meta_graph=True): the ps that merges the checkpoint writes
 * <prefix>.meta next to it, and the ps delete it with the checkpoint when
 * max_to_keep evicts it.  Give ps_saver_save() a @meta_dir (this worker's
 * path to that directory) to write it from the worker instead.
 *
 *   ps_saver *sv = ps_saver_create(g, NULL, &st);
 *   ps_saver_save(sv, sess, "model.ckpt", step, NULL, &path, &st);
 *   ...
 *   // a fresh worker, no model code:
 *   ps_saver *sv2;
 *   ps_graph *g2 = ps_import_meta_graph("/shared/ckpt/model.ckpt-100.meta", &sv2, &st);
 *   ps_session *s2 = ps_session_create(g2, client, &st);
 *   ps_saver_restore(sv2, s2, "model.ckpt-100", &st);
 *   ps_node *loss = ps_graph_find_node(g2, "loss");   // or collections */
#ifndef PARAMSERVER_SAVER_H
#define PARAMSERVER_SAVER_H

#include <stdint.h>

#include "paramserver/api.h"
#include "paramserver/graph.h"
#include "paramserver/session.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_saver ps_saver;

typedef struct ps_saver_options {
  /* Variables a restore reads; NULL: every global variable of the graph
   * (partitioned variables by part, each finding its slice). */
  ps_variable *const *var_list;
  size_t nvars;
  /* NULL, or the checkpoint key of each var_list entry (a name map). */
  const char *const *keys;
  int max_to_keep;                      /* 0: 5 (TensorFlow's); -1: keep all */
  double keep_checkpoint_every_n_hours; /* 0: never */
  /* Retention, as TensorFlow's Saver does it by default (false): over the
   * checkpoints this Saver wrote, so max_to_keep never deletes a checkpoint
   * another Saver or program wrote, and the state file lists only this
   * Saver's.  true: over the whole directory's list, as
   * tf.train.CheckpointManager does; for a program that owns its checkpoint
   * directory and must keep retention going across restarts (ps-worker). */
  bool directory_retention;
  /* TensorFlow's write_meta_graph=False.  By default (false) every save
   * writes the graph as <checkpoint>.meta next to the checkpoint on the ps
   * (carried by the save, written by the ps that merges it, deleted with
   * the checkpoint); over 16 MiB it is left out with a warning (give
   * ps_saver_save a meta_dir then). */
  bool no_meta_graph;
} ps_saver_options;

PS_API ps_saver *ps_saver_create(ps_graph *g, const ps_saver_options *o, ps_status *st);
PS_API void ps_saver_destroy(ps_saver *s); /* NULL is a no-op */

/* Saves the cluster as @prefix, or "@prefix-@global_step" when
 * @global_step >= 0 (model.ckpt-1000); max_to_keep and
 * keep_checkpoint_every_n_hours apply.  The graph goes to <written
 * prefix>.meta on the ps (unless no_meta_graph); @meta_dir (may be NULL):
 * this worker writes it to <meta_dir>/<written prefix>.meta instead.  @path (may be
 * NULL) receives the written prefix (malloc'd), as the state file has it. */
PS_API int ps_saver_save(ps_saver *s, ps_session *sess, const char *prefix,
                         int64_t global_step, const char *meta_dir, char **path,
                         ps_status *st);
/* ps_saver_save with the global-step variable instead of its value, as
 * TensorFlow's saver.save(sess, prefix, global_step=global_step_tensor),
 * but consistent: a variable on a ps is read inside the save's snapshot,
 * so "@prefix-<step>" holds exactly that step even while other workers
 * train (TensorFlow reads it first, and a step in between makes the name
 * and the contents differ).  Its error (e.g. uninitialized) is returned
 * as it is.  @saved_step (may be NULL) receives the step. */
PS_API int ps_saver_save_at_step(ps_saver *s, ps_session *sess, const char *prefix,
                                 ps_variable *global_step, const char *meta_dir,
                                 char **path, int64_t *saved_step, ps_status *st);

/* Creates the saver's variables on their ps if needed, then restores them
 * from @prefix (NULL or "": the latest checkpoint).  Restored variables
 * count as initialized; nothing else is touched.  Errors name the key
 * ("Key w not found in checkpoint ...") or both shapes/dtypes. */
PS_API int ps_saver_restore(ps_saver *s, ps_session *sess, const char *prefix,
                            ps_status *st);

/* Writes @g (nodes, variables, partitioned variables, collections) and
 * @saver's settings (may be NULL) to @path in proto/meta.proto's format,
 * atomically (temp file, fsync, rename). */
PS_API int ps_export_meta_graph(ps_graph *g, const ps_saver *saver, const char *path,
                                ps_status *st);

/* Reads a MetaGraph into a new graph.  Nodes keep their names, devices and
 * collections, so they are found with ps_graph_find_node() and
 * ps_collection_nodes(); more nodes can be added.  @saver (may be NULL)
 * receives the saved Saver (or a default one when the file has none).  A
 * truncated or corrupt file is an error naming the file and the fault. */
PS_API ps_graph *ps_import_meta_graph(const char *path, ps_saver **saver, ps_status *st);

/* In-memory forms of the above (the bytes of a .meta file). */
PS_API uint8_t *ps_meta_graph_serialize(ps_graph *g, const ps_saver *saver, size_t *len,
                                        ps_status *st);
PS_API ps_graph *ps_meta_graph_parse(const uint8_t *p, size_t n, const char *what,
                                     ps_saver **saver, ps_status *st);

#ifdef __cplusplus
}
#endif

#endif
