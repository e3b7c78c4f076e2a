/* Save: writes this ps's shard of a snapshot as a complete TensorFlow
 * bundle (P_temp/part-SSSSS-of-NNNNN) on a thread of its own. */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/log.h"
#include "common/wire.h"
#include "embed.h"
#include "paramserver/checkpoint.h"
#include "ps.pb-c.h"
#include "service.h"
#include "service_internal.h"
#include "store.h"

/* Removes P.index and P.data-?????-of-NNNNN (@nshards) of a bundle this
 * job wrote and could not finish; best effort. */
void ps_ckpt_remove_bundle_(const char *prefix, int nshards) {
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s.index", prefix);
  unlink(p);
  for (int k = 0; k < nshards; k++)
    if (ps_bundle_data_filename(prefix, k, nshards, p, sizeof p)) unlink(p);
}

/* Embedding table @es of this ps's part, TensorFlow's MutableHashTable
 * layout as TensorFlow Recommenders-Addons shards it (DESIGN.md
 * "Embedding tables"): NAME_mht_SofN-keys [n] int64, -values [n, dim]
 * float, -versions and -freqs [n] int64 (the step each row was last
 * touched at, its training lookups), and per slot NAME/SLOT_mht_SofN-keys
 * and -values; S is this shard + 1 of N.  Adds the tensors written to
 * *@count. */
static int write_table(job *j, ps_bundle_writer *w, ps_embed_snap *es, int64_t *count) {
  ps_status *st = &j->st;
  const ps_embed_spec *sp = ps_embed_snap_spec(es);
  ps_embed_export e;
  int rc = ps_embed_snap_export(es, &e, st);
  if (rc != 0) return rc;
  ps_shape keys = {.rank = 1, .dim = {e.n}}, rows = {.rank = 2, .dim = {e.n, e.dim}};
  size_t kb = (size_t)e.n * sizeof(int64_t), rb = (size_t)e.n * (size_t)e.dim * 4;
  char key[1024];
  for (int k = -1; k < e.nslots && rc == 0; k++) {
    const char *slot = k < 0 ? NULL : ps_embed_slot_name(sp->optimizer, k);
    char base[600];
    snprintf(base, sizeof base, "%s%s%s_mht_%dof%d", sp->name, slot ? "/" : "",
             slot ? slot : "", j->shard + 1, j->nshards);
    snprintf(key, sizeof key, "%s-keys", base);
    rc = ps_bundle_writer_add(w, key, PS_DT_INT64, &keys, e.keys, kb, st);
    snprintf(key, sizeof key, "%s-values", base);
    if (rc == 0)
      rc = ps_bundle_writer_add(w, key, PS_DT_FLOAT, &rows, k < 0 ? e.values : e.slots[k],
                                rb, st);
    *count += 2;
    if (k >= 0 || rc != 0) continue;
    snprintf(key, sizeof key, "%s-versions", base);
    rc = ps_bundle_writer_add(w, key, PS_DT_INT64, &keys, e.versions, kb, st);
    snprintf(key, sizeof key, "%s-freqs", base);
    if (rc == 0) rc = ps_bundle_writer_add(w, key, PS_DT_INT64, &keys, e.freqs, kb, st);
    *count += 2;
  }
  ps_embed_export_fini(&e);
  return rc;
}

static int write_shard(job *j, int64_t *tensors, int64_t *bytes) {
  ps_status *st = &j->st;
  char dir[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s_temp", j->prefix);
  /* every file of the part, confined (a link planted in the directory) */
  char conf[PATH_MAX + 64];
  char pidx[PATH_MAX + 64], pdata[PATH_MAX + 64];
  snprintf(pidx, sizeof pidx, "%s.index", j->part);
  snprintf(pdata, sizeof pdata, "%s.data-00000-of-00001", j->part);
  const char *root = ps_service_checkpoint_dir(j->svc);
  if (ps_ckpt_path_confined(root, pidx, conf, sizeof conf, st) ||
      ps_ckpt_path_confined(root, pdata, conf, sizeof conf, st))
    return st->code;
  /* the prefix's directory and the temp directory, held open from here on:
   * a link swapped in later leads nowhere */
  char pdir[PATH_MAX], tname[NAME_MAX + 1], part[96];
  const char *base = ps_ckpt_split_base_(j->prefix, pdir, sizeof pdir);
  snprintf(tname, sizeof tname, "%s_temp", base);
  held_dir pd, td;
  if (ps_ckpt_held_open_(root, pdir, true, &pd, st) != 0) return st->code;
  ps_ckpt_sweep_dir_(pd.fd, pd.path, 0); /* leftovers of crashed saves beside this one */
  if (ps_ckpt_held_sub_(&pd, tname, true, LOCK_SH, &td) != 0) {
    int e = errno;
    ps_ckpt_held_close_(&pd);
    return ps_status_set(st,
                         e == ELOOP || e == ENOTDIR ? PS_PERMISSION_DENIED
                                                    : ps_status_code_from_errno(e),
                         "cannot hold %s: %s%s", dir, strerror(e),
                         e == ELOOP || e == ENOTDIR
                             ? " (a symbolic link or a file where its temp directory "
                               "goes: links under the checkpoint directory are not "
                               "followed)"
                             : "");
  }
  snprintf(part, sizeof part, "%s/part-%05d-of-%05d", td.proc, j->shard, j->nshards);
  int rc = 0;
  ps_bundle_writer *w = ps_bundle_writer_create(part, st);
  if (w == NULL) {
    ps_ckpt_held_msg_(st, &td);
    ps_ckpt_held_close_(&td);
    ps_ckpt_held_close_(&pd);
    return st->code;
  }
  ps_bundle_writer_set_cancel(w, ps_ckpt_aborting_, NULL);
  for (size_t i = 0; i < j->snap->n && rc == 0; i++) {
    ps_snapshot_entry *e = &j->snap->e[i];
    part_info *pi = &j->pi[i];
    ps_ckpt_slow_point_("save_tensor");
    if ((rc = ps_ckpt_job_check_(j, "save")) != 0) break;
    if (pi->full_name && e->shape.rank > 0) {
      /* a part of a partitioned variable: a slice of the full tensor */
      int64_t start[PS_MAX_RANK] = {0}, len[PS_MAX_RANK];
      int64_t row =
          e->shape.dim[0] ? ps_shape_num_elements(&e->shape) / e->shape.dim[0] : 0;
      start[0] = row ? pi->offset / row : 0;
      for (int d = 0; d < e->shape.rank; d++)
        len[d] = e->shape.dim[d];
      rc = ps_bundle_writer_add_slice(w, e->key ? e->key : pi->full_name, e->dtype,
                                      &pi->full_shape, start, len, e->buf->data,
                                      e->buf->size, st);
    } else {
      rc = ps_bundle_writer_add(w, e->key ? e->key : e->name, e->dtype, &e->shape,
                                e->buf->data, e->buf->size, st);
    }
    if (rc == PS_CANCELLED) rc = ps_ckpt_job_check_(j, "save");
    /* the snapshot's reference is dropped as soon as its bytes are out */
    ps_buf_unref(e->buf);
    e->buf = NULL;
    if (i == 0) ps_ckpt_crash_point_("save_mid_shard");
  }
  int64_t ntab = 0;
  for (size_t i = 0; i < j->snap->ntables && rc == 0; i++) {
    if ((rc = ps_ckpt_job_check_(j, "save")) != 0) break;
    rc = write_table(j, w, j->snap->tables[i], &ntab);
    if (rc == PS_CANCELLED) rc = ps_ckpt_job_check_(j, "save");
    ps_embed_snap_free(j->snap->tables[i]); /* its copies go as soon as they are out */
    j->snap->tables[i] = NULL;
  }
  if (rc == 0) rc = ps_ckpt_job_check_(j, "save");
  if (rc == 0) rc = ps_bundle_writer_finish(w, st);
  if (rc == 0) ps_ckpt_crash_point_("save_after_shard");
  /* shutdown asked during the finish: no merge will come for it */
  if (rc == 0) rc = ps_ckpt_job_check_(j, "save");
  *bytes = (int64_t)ps_bundle_writer_bytes(w);
  *tensors = (int64_t)j->snap->n + ntab;
  ps_bundle_writer_destroy(w); /* an unfinished part's files go with it */
  ps_ckpt_held_msg_(st, &td);
  if (rc != 0) {
    ps_ckpt_remove_bundle_(part, 1);
    unlinkat(pd.fd, tname, AT_REMOVEDIR); /* if this ps was the only one in it */
  } else if (j->shard == j->nshards - 1) {
    ps_ckpt_unmerged_add_(root, j->part, pidx);
  }
  ps_ckpt_held_close_(&td);
  ps_ckpt_held_close_(&pd);
  return rc;
}

static double clock_secs(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *save_thread(void *arg) {
  job *j = arg;
  int64_t tensors = 0, bytes = 0;
  double t0 = clock_secs(CLOCK_MONOTONIC);
  int rc = write_shard(j, &tensors, &bytes);
  if (rc == 0) {
    ps_service_saved(j->svc, clock_secs(CLOCK_REALTIME), clock_secs(CLOCK_MONOTONIC) - t0,
                     (long long)bytes);
    PS_INFO("saved shard %d of %d of %s: %lld tensors, %lld bytes", j->shard, j->nshards,
            j->prefix, (long long)tensors, (long long)bytes);
    Paramserver__SaveResponse r = PARAMSERVER__SAVE_RESPONSE__INIT;
    r.tensors = tensors;
    r.bytes = bytes;
    ps_rpc_call_reply(j->c, &r.base);
  } else {
    PS_ERROR("save of %s failed: %s", j->prefix, j->st.msg);
  }
  ps_rpc_call_resume(j->c, rc, &j->st); /* @j may be freed from here on */
  ps_ckpt_job_done_();
  return NULL;
}

/* --max-checkpoint-bytes: an upper bound of the bytes of the index a
 * shard of @snap writes.  Per entry its key (table blocks store it, the
 * index block may store a separator as long), the BundleEntryProto and the
 * block overhead; a part of a partitioned variable has two entries (the
 * full tensor's, with its slices, and the slice's); then the header entry,
 * the footer and block trailers. */
static int64_t index_estimate(const ps_snapshot *snap) {
  int64_t b = 4096;
  for (size_t i = 0; i < snap->n; i++) {
    const ps_snapshot_entry *e = &snap->e[i];
    const char *k = e->key ? e->key : e->full_name ? e->full_name : e->name;
    int64_t one = 2 * (int64_t)strlen(k) + 128 + 32 * (int64_t)e->shape.rank;
    b += e->full_name ? 2 * one + 32 * (int64_t)e->full_shape.rank : one;
  }
  return b;
}

int ps_ckpt_save_header_(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  job *j = ps_ckpt_job_new_(c);
  if (j == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  Paramserver__SaveRequest *rq = paramserver__save_request__unpack(NULL, n, p);
  if (rq == NULL) return ps_ckpt_bad_request_(st, "Save");
  int rc = ps_ckpt_check_raw_prefix_(p, n, 2, "Save", st);
  if (rc == 0)
    rc = ps_ckpt_path_(ps_service_checkpoint_dir(j->svc), rq->prefix, j->prefix,
                       sizeof j->prefix, st);
  if (rc == 0)
    rc = ps_wire_check_strings(&paramserver__save_request__descriptor, p, n, "Save", st);
  j->shard = rq->shard;
  j->nshards = rq->num_shards;
  if (rc == 0 && (rq->num_shards < 1 || rq->num_shards > 99999 || rq->shard < 0 ||
                  rq->shard >= rq->num_shards))
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "Save: shard %d of %d is not valid",
                       rq->shard, rq->num_shards);
  int64_t sid = rq->snapshot_id;
  if (rc == 0) rc = ps_svc_route_(j->svc, rq->route, "Save", st);
  paramserver__save_request__free_unpacked(rq, NULL);
  if (rc) return rc;
  snprintf(j->part, sizeof j->part, "%s_temp/part-%05d-of-%05d", j->prefix, j->shard,
           j->nshards);
  ps_store *store = ps_service_store(j->svc);
  if (sid == 0) { /* this ps alone, now (replicated: the shards it is primary of) */
    size_t nsh = 0;
    bool *sh = ps_svc_primary_shards_(j->svc, &nsh);
    if (ps_service_repl(j->svc) && sh == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    rc = ps_store_snapshot_begin_in(store, -1, 10000, false, NULL, sh, nsh, st);
    free(sh);
    if (rc != 0) return rc;
    ps_store_snapshot_release(store, -1);
    j->snap = ps_store_snapshot_take(store, -1);
  } else {
    j->snap = ps_store_snapshot_take(store, sid);
    if (j->snap == NULL)
      return ps_status_set(st, PS_FAILED_PRECONDITION,
                           "Save: snapshot %lld is not held by %s (taken already, or "
                           "never)",
                           (long long)sid, j->task);
  }
  if (j->snap == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Save: out of memory");
  int64_t shard = 0;
  for (size_t i = 0; i < j->snap->n; i++)
    if (j->snap->e[i].buf) shard += (int64_t)j->snap->e[i].buf->size;
  for (size_t i = 0; i < j->snap->ntables; i++) { /* keys, rows, slots, counters */
    const ps_embed_spec *sp = ps_embed_snap_spec(j->snap->tables[i]);
    int ns = ps_embed_optimizer_slots(sp->optimizer);
    shard +=
        ps_embed_snap_rows(j->snap->tables[i]) * (24 + 8 * ns + 4 * sp->dim * (1 + ns));
    shard += 2 * (6 + 2 * ns) * (2 * (int64_t)strlen(sp->name) + 200);
  }
  shard += 2 * index_estimate(j->snap); /* its part's, then the merged one */
  char what[128];
  snprintf(what, sizeof what, "shard %d of %s (tensors and index)", j->shard, j->task);
  if ((rc = ps_ckpt_check_quota_(j, "Save", what, shard, true, st)) != 0) return rc;
  j->pi = calloc(j->snap->n + 1, sizeof *j->pi);
  if (j->pi == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < j->snap->n; i++) {
    const ps_snapshot_entry *e = &j->snap->e[i];
    if (e->full_name == NULL) continue;
    j->pi[i].full_name = strdup(e->full_name);
    if (j->pi[i].full_name == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    j->pi[i].full_shape = e->full_shape;
    j->pi[i].offset = e->offset;
  }
  return 0;
}

int ps_ckpt_save_data_(ps_rpc_call *c, ps_status *st) {
  return ps_ckpt_spawn_(save_thread, ps_rpc_call_ctx(c), st);
}
