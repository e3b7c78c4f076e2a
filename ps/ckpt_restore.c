/* Restore: reads a checkpoint's tensors into new buffers, checks them,
 * and swaps them in under the variables' locks, all or nothing; or lists
 * the checkpoint's tensors (RestoreRequest.list). */
#include "ckpt_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/log.h"
#include "common/wire.h"
#include "embed.h"
#include "paramserver/checkpoint.h"
#include "ps.pb-c.h"
#include "repl_internal.h"
#include "service.h"
#include "service_internal.h"
#include "store.h"

typedef struct staged {
  ps_var *v;
  ps_buf *buf;            /* the tensor read and checked, swapped in by restore_apply */
  ps_buf *old;            /* the buffer replaced, released after the locks */
  int64_t version, epoch; /* the variable's before the swap */
} staged;

/* Reads and checks @v's tensor into a new buffer *@out; @out NULL: checks
 * the same (key, dtype, shape, every byte's checksum) through the reader's
 * bounded scratch buffer, allocating nothing of the tensor's size. */
static int restore_one(ps_bundle_reader *r, ps_var *v, const char *key, ps_buf **out,
                       ps_status *st) {
  const char *k = key && key[0] ? key : (v->init_full_name ? v->init_full_name : v->name);
  const ps_bundle_entry *e = ps_bundle_reader_find(r, k);
  if (e == NULL)
    return ps_status_set(st, PS_NOT_FOUND, "Key %s not found in checkpoint %s", k,
                         ps_bundle_reader_prefix(r));
  char a[256], b[256];
  if (e->dtype != (int)v->dtype)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "restoring %s from %s: the checkpoint has dtype %s, the "
                         "variable has dtype %s",
                         v->name, k, ps_dtype_name(e->dtype), ps_dtype_name(v->dtype));
  size_t es = ps_dtype_size(v->dtype);
  size_t nbytes = (size_t)ps_shape_num_elements(&v->shape) * es;
  ps_buf *buf = out ? ps_buf_create_for_read(nbytes) : NULL;
  if (out && buf == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "restoring %s: out of memory",
                         v->name);
  int rc;
  bool part =
      strcmp(k, v->name) != 0 && v->init_full_name && !strcmp(k, v->init_full_name);
  if (part) {
    /* this variable is a slice of the stored full tensor */
    if (!ps_shape_equal(&e->shape, &v->init_full_shape)) {
      ps_buf_unref(buf);
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "restoring %s: the checkpoint's %s has shape %s, the "
                           "partitioned variable has shape %s",
                           v->name, k, ps_shape_format(&e->shape, a, sizeof a),
                           ps_shape_format(&v->init_full_shape, b, sizeof b));
    }
    int64_t start[PS_MAX_RANK] = {0}, len[PS_MAX_RANK];
    int64_t row =
        v->shape.dim[0] ? ps_shape_num_elements(&v->shape) / v->shape.dim[0] : 0;
    start[0] = row ? v->init_offset / row : 0;
    for (int d = 0; d < v->shape.rank; d++)
      len[d] = v->shape.dim[d];
    rc = buf ? ps_bundle_reader_read_slice(r, k, start, len, buf->data, nbytes, st)
             : ps_bundle_reader_check_slice(r, k, start, len, nbytes, st);
  } else {
    if (!ps_shape_equal(&e->shape, &v->shape)) {
      ps_buf_unref(buf);
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "restoring %s from %s: the checkpoint has shape %s, the "
                           "variable has shape %s",
                           v->name, k, ps_shape_format(&e->shape, a, sizeof a),
                           ps_shape_format(&v->shape, b, sizeof b));
    }
    if (buf == NULL)
      rc = ps_bundle_reader_check_slice(r, k, NULL, NULL, nbytes, st);
    else if (e->nslices)
      rc = ps_bundle_reader_read_slice(r, k, (int64_t[PS_MAX_RANK]){0},
                                       (int64_t[PS_MAX_RANK]){-1, -1, -1, -1, -1, -1, -1,
                                                              -1, -1, -1, -1, -1, -1, -1,
                                                              -1, -1},
                                       buf->data, nbytes, st);
    else
      rc = ps_bundle_reader_read_into(r, k, buf->data, nbytes, st);
  }
  if (rc) {
    ps_buf_unref(buf);
    return rc;
  }
  ps_buf_advise_huge(buf); /* filled: huge pages from here on (tensor.c) */
  if (out) *out = buf;
  return 0;
}

/* The reader of the checkpoint and the variables to restore (those of the
 * request, else every variable).  The index, then (their number is in it)
 * the data files, are confined before a byte of them is read. */
static int restore_open(job *j, held_dir *pd, ps_bundle_reader **r, ps_var ***vars,
                        size_t *nv, ps_ckpt_table **tabs, size_t *ntabs, ps_status *st) {
  ps_store *store = ps_service_store(j->svc);
  const char *root = ps_service_checkpoint_dir(j->svc);
  char idx[PATH_MAX + 16], conf[PATH_MAX + 16], pdir[PATH_MAX], in[PATH_MAX + 16];
  snprintf(idx, sizeof idx, "%s.index", j->prefix);
  int rc;
  if ((rc = ps_ckpt_path_confined(root, idx, conf, sizeof conf, st)) != 0) return rc;
  /* its files are read through its directory, held open (no link on the
   * way is followed, and none swapped in later) */
  const char *base = ps_ckpt_split_base_(j->prefix, pdir, sizeof pdir);
  if ((rc = ps_ckpt_held_open_(root, pdir, false, pd, st)) != 0) return rc;
  snprintf(in, sizeof in, "%s/%s", pd->proc, base);
  if ((*r = ps_bundle_reader_open_nofollow(in, st)) == NULL)
    return st->code ? st->code : PS_INTERNAL;
  if ((rc = ps_ckpt_confine_bundle_(root, j->prefix, ps_bundle_reader_num_shards(*r),
                                    st)) != 0)
    return rc;
  if (j->rq->list) return 0; /* no variable is looked at (restore_list) */
  ps_embed_store *es = ps_service_tables(j->svc);
  if (j->rq->n_items == 0) {
    /* every table too, each from its own name */
    size_t nt = 0;
    ps_embed_table **all = ps_embed_tables(es, &nt);
    if (all == NULL && nt > 0)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
    if ((*tabs = calloc(nt + 1, sizeof **tabs)) == NULL) {
      for (size_t i = 0; i < nt; i++)
        ps_embed_unref(all[i]);
      free(all);
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
    }
    for (size_t i = 0; i < nt; i++)
      (*tabs)[i] = (ps_ckpt_table){.t = all[i], .key = ps_embed_table_spec(all[i])->name};
    *ntabs = nt;
    free(all);
    *vars = ps_store_list(store, nv);
    size_t nsh = 0, k = 0; /* replicated: the shards it is primary of */
    bool *sh = ps_svc_primary_shards_(j->svc, &nsh);
    for (size_t i = 0; sh && *vars && i < *nv; i++)
      if ((*vars)[i]->shard >= 0 && (size_t)(*vars)[i]->shard < nsh &&
          sh[(*vars)[i]->shard])
        (*vars)[k++] = (*vars)[i];
    if (sh) *nv = k;
    free(sh);
    return 0;
  }
  size_t n = j->rq->n_items;
  *nv = 0;
  if ((*vars = calloc(n + 1, sizeof **vars)) == NULL ||
      (j->item_of = calloc(n + 1, sizeof *j->item_of)) == NULL ||
      (*tabs = calloc(n + 1, sizeof **tabs)) == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  for (size_t i = 0; i < n; i++) {
    Paramserver__RestoreItem *it = j->rq->items[i];
    ps_var *v = ps_store_find(store, it->name, st);
    if (v) {
      j->item_of[*nv] = i;
      (*vars)[(*nv)++] = v;
      continue;
    }
    /* an embedding table of that name, from the checkpoint's table @key */
    ps_status st2;
    ps_embed_table *t = ps_embed_find(es, it->name, &st2);
    if (t == NULL) return st->code; /* the variable's NOT_FOUND */
    (*tabs)[(*ntabs)++] = (ps_ckpt_table){.t = t, .key = it->key[0] ? it->key : it->name};
  }
  return 0;
}

/* Phase 1, no locks: every tensor is read into a new buffer and checked
 * (checksum, dtype, shape).  Nothing a variable holds changes here, so a
 * failure (a corrupt file, a file rewritten while it is read) leaves every
 * variable as it was.  Never into a variable's own buffer: a checksum
 * known only after the last byte would come too late to undo it.  A
 * check_only request reads through the reader's bounded scratch buffer
 * instead: it keeps nothing, so it allocates nothing of a tensor's size. */
static int restore_stage(job *j, ps_bundle_reader *r, ps_var **vars, staged *sv,
                         size_t nv, ps_status *st) {
  int rc = 0;
  for (size_t i = 0; i < nv && rc == 0; i++) {
    ps_ckpt_slow_point_("restore_tensor");
    if ((rc = ps_ckpt_job_check_(j, "restore")) != 0) break;
    const char *key = j->rq->n_items ? j->rq->items[j->item_of[i]]->key : NULL;
    sv[i].v = vars[i];
    rc = restore_one(r, vars[i], key, j->rq->check_only ? NULL : &sv[i].buf, st);
  }
  return rc;
}

/* Puts back what restore_apply swapped out of @x->v (locked): its old
 * buffer (a reference, released after the locks as before), version and
 * epoch. */
static void restore_undo(ps_store *store, staged *x) {
  ps_var *v = x->v;
  if (v->deleted) return;
  int64_t delta =
      (x->old ? (int64_t)x->old->size : 0) - (v->buf ? (int64_t)v->buf->size : 0);
  ps_buf_unref(v->buf);
  v->buf = x->old ? ps_buf_ref(x->old) : NULL;
  v->version = x->version;
  v->epoch = x->epoch;
  ps_store_account(store, delta);
}

/* Phase 2: all or nothing, and as one update: the checked buffers are
 * swapped in under every variable's lock; no byte is read here. */
static int restore_apply(job *j, ps_var **vars, staged *sv, size_t nv, ps_status *st) {
  ps_store *store = ps_service_store(j->svc);
  int rc = 0;
  ps_store_lock_set(vars, nv, true);
  /* a variable deleted since phase 1 fails the whole restore */
  for (size_t i = 0; i < nv && rc == 0; i++)
    rc = ps_var_gone(store, sv[i].v, st);
  /* and so does one whose size changed since (read unlocked in phase 1) */
  for (size_t i = 0; i < nv && rc == 0; i++) {
    ps_var *v = sv[i].v;
    size_t want = (size_t)ps_shape_num_elements(&v->shape) * ps_dtype_size(v->dtype);
    if (sv[i].buf->size != want)
      rc = ps_status_set(st, PS_ABORTED,
                         "restoring %s: the variable changed shape during the restore",
                         v->name);
  }
  ps_repl *repl = ps_service_repl(j->svc);
  if (rc == 0 && repl) rc = ps_repl_check_vars(repl, vars, nv, "Restore", st);
  ps_repl_group g = {0};
  for (size_t i = 0; i < nv && rc == 0; i++) {
    ps_var *v = sv[i].v;
    sv[i].old = v->buf ? ps_buf_ref(v->buf) : NULL;
    sv[i].version = v->version;
    sv[i].epoch = v->epoch;
    ps_var_set_buf(store, v, sv[i].buf, NULL);
    if (repl) ps_repl_add_value(&g, v);
  }
  /* replicated: the restored values fill every replica before the answer */
  ps_svc_blocking b;
  int rr = rc == 0 && repl ? ps_svc_blocking_commit_(j->svc, &g, &b, st) : 0;
  if (rc == 0 && repl && rr != 0 && rr != PS_RPC_PENDING) {
    /* nothing reached the backups (fenced, out of memory): the old values
     * go back, so the primary does not differ from them (review r23 #11) */
    for (size_t i = 0; i < nv; i++)
      restore_undo(store, &sv[i]);
  }
  ps_store_unlock_set(vars, nv);
  if (rc == 0 && repl) rc = ps_svc_blocking_wait_(&b, rr, st);
  /* the replaced buffers are unmapped outside the locks */
  for (size_t i = 0; i < nv; i++)
    ps_buf_unref(sv[i].old);
  return rc;
}

/* The response: the names restored (variables, then tables). */
static int restore_reply(job *j, ps_var **vars, size_t nv, const ps_ckpt_table *tabs,
                         size_t ntabs, ps_status *st) {
  Paramserver__RestoreResponse resp = PARAMSERVER__RESTORE_RESPONSE__INIT;
  char **names = calloc(nv + ntabs + 1, sizeof *names);
  if (names == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  for (size_t i = 0; i < nv; i++)
    names[i] = vars[i]->name;
  for (size_t i = 0; i < ntabs; i++)
    names[nv + i] = (char *)ps_embed_table_spec(tabs[i].t)->name;
  resp.restored = names;
  resp.n_restored = nv + ntabs;
  resp.prefix = j->prefix;
  resp.checked = j->rq->check_only;
  ps_rpc_call_reply(j->c, &resp.base);
  free(names);
  if (j->rq->check_only)
    PS_INFO("checked %zu variables and %zu tables of %s for a restore", nv, ntabs,
            j->prefix);
  else
    PS_INFO("restored %zu variables and %zu tables from %s", nv, ntabs, j->prefix);
  return 0;
}

/* RestoreRequest.list: the checkpoint's tensors (not the slice keys) with
 * their dtypes, shapes and slices, from the index alone. */
static int restore_list(job *j, ps_bundle_reader *r, ps_status *st) {
  size_t n = ps_bundle_reader_count(r), ns = 0, k = 0, m = 0;
  for (size_t i = 0; i < n; i++)
    ns += ps_bundle_reader_entry(r, i)->nslices;
  Paramserver__CheckpointEntry *es = calloc(n + 1, sizeof *es);
  Paramserver__CheckpointEntry **ep = calloc(n + 1, sizeof *ep);
  Paramserver__CheckpointSlice *ss = calloc(ns + 1, sizeof *ss);
  Paramserver__CheckpointSlice **sp = calloc(ns + 1, sizeof *sp);
  int rc = 0;
  if (es == NULL || ep == NULL || ss == NULL || sp == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const ps_bundle_entry *e = ps_bundle_reader_entry(r, i);
    if (e->is_slice) continue;
    paramserver__checkpoint_entry__init(&es[k]);
    es[k].key = (char *)e->key;
    es[k].dtype = e->dtype;
    es[k].shape = (int64_t *)e->shape.dim;
    es[k].n_shape = (size_t)e->shape.rank;
    es[k].slices = &sp[m];
    for (size_t s = 0; s < e->nslices; s++, m++) {
      paramserver__checkpoint_slice__init(&ss[m]);
      ss[m].start = (int64_t *)e->slices[s].start;
      ss[m].n_start = (size_t)e->slices[s].rank;
      ss[m].length = (int64_t *)e->slices[s].length;
      ss[m].n_length = (size_t)e->slices[s].rank;
      sp[m] = &ss[m];
    }
    es[k].n_slices = e->nslices;
    ep[k] = &es[k];
    k++;
  }
  Paramserver__RestoreResponse resp = PARAMSERVER__RESTORE_RESPONSE__INIT;
  resp.prefix = j->prefix;
  resp.checked = true;
  resp.listed = true;
  resp.entries = ep;
  resp.n_entries = k;
  ps_rpc_call_reply(j->c, &resp.base);
  PS_INFO("listed the %zu tensors of %s", k, j->prefix);
out:
  free(sp);
  free(ss);
  free(ep);
  free(es);
  return rc;
}

static void *restore_thread(void *arg) {
  job *j = arg;
  ps_status *st = &j->st;
  ps_bundle_reader *r = NULL;
  staged *sv = NULL;
  size_t nv = 0;
  ps_var **vars = NULL;
  ps_ckpt_table *tabs = NULL;
  size_t ntabs = 0;
  held_dir pd = {.fd = -1};
  int rc = restore_open(j, &pd, &r, &vars, &nv, &tabs, &ntabs, st);
  if (rc == 0 && j->rq->list) {
    rc = restore_list(j, r, st);
  } else if (rc == 0) {
    sv = calloc(nv + 1, sizeof *sv);
    if (sv == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
    else
      PS_INFO("%s %zu variables from %s", j->rq->check_only ? "checking" : "restoring",
              nv, j->prefix);
  }
  if (rc == 0 && !j->rq->list) rc = restore_stage(j, r, vars, sv, nv, st);
  /* the tables' rows read, checked and built aside too, before anything
   * changes */
  int task = j->rq->table_tasks > 0 ? j->rq->table_task : 0;
  int ntasks = j->rq->table_tasks > 0 ? j->rq->table_tasks : 1;
  for (size_t i = 0; i < ntabs && rc == 0 && !j->rq->list; i++) {
    if ((rc = ps_ckpt_job_check_(j, "restore")) != 0) break;
    rc = ps_ckpt_table_stage_(r, &tabs[i], task, ntasks, j->rq->check_only, st);
  }
  if (rc == 0 && !j->rq->list && !j->rq->check_only)
    rc = restore_apply(j, vars, sv, nv, st);
  /* the variables are in: the tables follow (their commit cannot fail) */
  for (size_t i = 0; i < ntabs && rc == 0 && !j->rq->list && !j->rq->check_only; i++) {
    ps_embed_replace_commit(tabs[i].t, tabs[i].prepared);
    tabs[i].prepared = NULL;
    PS_INFO("restored table %s from %s: %lld rows", ps_embed_table_spec(tabs[i].t)->name,
            tabs[i].key, (long long)tabs[i].rows);
  }
  if (rc == 0 && !j->rq->list) rc = restore_reply(j, vars, nv, tabs, ntabs, st);
  for (size_t i = 0; i < ntabs; i++) {
    ps_embed_unref(tabs[i].prepared);
    ps_embed_unref(tabs[i].t);
  }
  free(tabs);
  for (size_t i = 0; sv && i < nv; i++)
    ps_buf_unref(sv[i].buf);
  free(sv);
  free(vars);
  ps_bundle_reader_close(r);
  ps_ckpt_held_msg_(st, &pd);
  ps_ckpt_held_close_(&pd);
  if (rc)
    PS_ERROR("%s from %s failed: %s", j->rq->check_only ? "restore check" : "restore",
             j->prefix, st->msg);
  ps_rpc_call_resume(j->c, rc, st); /* @j may be freed from here on */
  ps_ckpt_job_done_();
  return NULL;
}

int ps_ckpt_restore_header_(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  job *j = ps_ckpt_job_new_(c);
  if (j == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  j->rq = paramserver__restore_request__unpack(NULL, n, p);
  if (j->rq == NULL) return ps_ckpt_bad_request_(st, "Restore");
  int rc = ps_ckpt_check_raw_prefix_(p, n, 1, "Restore", st);
  if (rc == 0)
    rc = ps_wire_check_strings(&paramserver__restore_request__descriptor, p, n, "Restore",
                               st);
  if (rc == 0) rc = ps_svc_route_(j->svc, j->rq->route, "Restore", st);
  if (rc == 0 &&
      (j->rq->table_tasks < 0 || j->rq->table_tasks > 99999 || j->rq->table_task < 0 ||
       (j->rq->table_tasks > 0 && j->rq->table_task >= j->rq->table_tasks)))
    rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                       "Restore: table task %d of %d is not valid", j->rq->table_task,
                       j->rq->table_tasks);
  if (rc) return rc;
  /* test hook: answer as an older ps-server, which ignores check_only and
   * restores (tests of the client's guard against it) */
  const char *old = getenv("PS_TEST_IGNORE_CHECK_ONLY");
  if (old && old[0] == '1') j->rq->check_only = false;
  /* and as one older still, which ignores list */
  const char *nolist = getenv("PS_TEST_IGNORE_LIST");
  if (nolist && nolist[0] == '1') j->rq->list = false;
  const char *root = ps_service_checkpoint_dir(j->svc);
  if (j->rq->prefix[0] == '\0') {
    char *latest = NULL;
    char conf[PATH_MAX];
    if ((rc = ps_ckpt_path_(root, PS_CKPT_STATE_FILENAME, conf, sizeof conf, st)) != 0)
      return rc;
    if ((rc = ps_service_latest(j->svc, &latest, st)) != 0) return rc;
    rc = ps_ckpt_path_(root, latest, j->prefix, sizeof j->prefix, st);
    free(latest);
    return rc;
  }
  return ps_ckpt_path_(root, j->rq->prefix, j->prefix, sizeof j->prefix, st);
}

int ps_ckpt_restore_data_(ps_rpc_call *c, ps_status *st) {
  return ps_ckpt_spawn_(restore_thread, ps_rpc_call_ctx(c), st);
}
