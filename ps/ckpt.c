/* Checkpoint RPCs of the ps.
 *
 * Snapshot/Release implement the cluster-wide consistent capture (see
 * proto/ps.proto); Save writes this ps's shard of a snapshot as a complete
 * TensorFlow bundle (prefix_temp/part-SSSSS-of-NNNNN) on a thread of its
 * own, so the RPC threads keep serving training while the bytes go to
 * disk; Merge (run by one ps) turns the parts into prefix.index +
 * prefix.data-SSSSS-of-NNNNN and then updates the `checkpoint` state file;
 * Restore reads tensors straight into new buffers and swaps them in under
 * the variables' locks.  Parts of partitioned variables are saved as
 * slices of the full tensor and restored by slice, so a checkpoint can be
 * restored into a cluster with another number of ps.
 *
 * Paths: every file this module opens, creates or deletes goes through
 * ps_ckpt_path_confined() (common/checkpoint_confine.c, the one confinement rule:
 * lexical, then realpath of every existing component, dangling links
 * refused) under --checkpoint-dir.  Files are created under temporary names
 * with O_EXCL and renamed into place, so a link planted at a final name is
 * replaced, never followed.  A save and a merge then hold their directories
 * open (held_dir: opened from --checkpoint-dir down without following a
 * link) and work only through them, so a directory swapped for a link
 * after the check leads nowhere: the merge's state file and max_to_keep
 * deletions too (ps_service_update_state gets the held directory), and
 * the sweeps walk directories by descriptor.
 *
 * Jobs: save, merge and restore threads are counted (jobs_mu/jobs_cv);
 * ps_ckpt_abort_all() makes them stop at their next safe point (between
 * tensors, between 4 MiB pieces of a tensor) and fail with UNAVAILABLE, and
 * ps_ckpt_wait_all() returns when none runs, so main.c can free the store
 * and the server only after them.  A save thread does not touch the store
 * after its snapshot is taken (what it needs is copied in save_header).
 *
 * Leftover `P_temp` directories (a save that crashed): the checkpoint
 * directory is shared by every ps of the cluster and another ps may be
 * writing its part of a save right now, so a temp directory is removed only
 * if (1) no writer holds its lock (every save and merge holds flock(LOCK_SH)
 * on the temp directory while it works in it; the sweeper needs
 * LOCK_EX|LOCK_NB) and (2) nothing in it was modified for
 * PS_CKPT_TEMP_STALE_SECS (finished parts wait unlocked for their merge;
 * the age also covers filesystems where flock is local).  Swept at startup
 * (ps_ckpt_sweep) and, in the prefix's directory, before each save.
 *
 * Files (ckpt_internal.h): ckpt_fs.c paths and held directories;
 * ckpt_jobs.c the jobs, the quota and the unmerged parts; ckpt_sweep.c
 * the sweep; ckpt_save.c, ckpt_merge.c, ckpt_restore.c the RPCs of those
 * names; this file Snapshot, Release and the handler table. */
#include "ckpt.h"

#include "ckpt_internal.h"

#include <errno.h>
#include <stdlib.h>

#include "common/wire.h"
#include "ps.pb-c.h"
#include "service.h"
#include "service_internal.h"
#include "store.h"

/* ---- Snapshot / Release ---- */

static int snapshot_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *svc = ps_rpc_call_server_user(c);
  if (ps_wire_check_strings(&paramserver__snapshot_request__descriptor, p, n, "Snapshot",
                            st))
    return st->code;
  Paramserver__SnapshotRequest *rq = paramserver__snapshot_request__unpack(NULL, n, p);
  if (rq == NULL) return ps_ckpt_bad_request_(st, "Snapshot");
  int64_t hold = rq->hold_ms > 0 ? rq->hold_ms : 10000;
  const char **names = NULL, **keys = NULL;
  ps_snapshot_select sel = {0};
  int rc = 0;
  if (rq->select) {
    names = calloc(rq->n_items + 1, sizeof *names);
    keys = calloc(rq->n_items + 1, sizeof *keys);
    if (names == NULL || keys == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; rc == 0 && i < rq->n_items; i++) {
      names[i] = rq->items[i]->name;
      keys[i] = rq->items[i]->key;
    }
    sel = (ps_snapshot_select){names, keys, rq->n_items};
  }
  /* replicated: the shards this ps is primary of, by the client's view */
  size_t nsh = 0;
  bool *sh = NULL;
  if (rc == 0) rc = ps_svc_route_(svc, rq->route, "Snapshot", st);
  if (rc == 0 && ps_service_repl(svc) && (sh = ps_svc_primary_shards_(svc, &nsh)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  if (rc == 0 && rq->select && rq->tables && sh == NULL)
    rc = ps_store_snapshot_begin_tables(ps_service_store(svc), rq->id, hold,
                                        rq->skip_uninitialized, &sel, st);
  else if (rc == 0)
    rc = ps_store_snapshot_begin_in(ps_service_store(svc), rq->id, hold,
                                    rq->skip_uninitialized, rq->select ? &sel : NULL, sh,
                                    nsh, st);
  free(sh);
  free(names);
  free(keys);
  if (rc == 0) {
    int64_t nv = 0, bytes = 0;
    ps_store_snapshot_stats(ps_service_store(svc), rq->id, &nv, &bytes);
    Paramserver__SnapshotResponse r = PARAMSERVER__SNAPSHOT_RESPONSE__INIT;
    r.num_vars = nv;
    r.bytes = bytes;
    ps_rpc_call_reply(c, &r.base);
  }
  paramserver__snapshot_request__free_unpacked(rq, NULL);
  return rc;
}

static int release_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *svc = ps_rpc_call_server_user(c);
  if (ps_wire_check_strings(&paramserver__release_request__descriptor, p, n, "Release",
                            st))
    return st->code;
  Paramserver__ReleaseRequest *rq = paramserver__release_request__unpack(NULL, n, p);
  if (rq == NULL) return ps_ckpt_bad_request_(st, "Release");
  ps_store_snapshot_release(ps_service_store(svc), rq->id);
  paramserver__release_request__free_unpacked(rq, NULL);
  Paramserver__ReleaseResponse r = PARAMSERVER__RELEASE_RESPONSE__INIT;
  ps_rpc_call_reply(c, &r.base);
  return 0;
}

static int no_data(ps_rpc_call *c, ps_status *st) {
  return 0;
}

const ps_rpc_handler ps_ckpt_handlers[5] = {
    {"/paramserver.Ps/Snapshot", snapshot_header, no_data, NULL, NULL,
     PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Release", release_header, no_data, NULL, NULL, PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Save", ps_ckpt_save_header_, ps_ckpt_save_data_, ps_ckpt_job_free_,
     NULL, PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Merge", ps_ckpt_merge_header_, ps_ckpt_merge_data_,
     ps_ckpt_job_free_, NULL, PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Restore", ps_ckpt_restore_header_, ps_ckpt_restore_data_,
     ps_ckpt_job_free_, NULL, PS_RPC_ACCESS_ADMIN},
};
