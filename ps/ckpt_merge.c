/* Merge (run by one ps): turns the parts of a save into P.index and
 * P.data-SSSSS-of-NNNNN, writes the .meta and updates the `checkpoint`
 * state file. */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/wire.h"
#include "paramserver/checkpoint.h"
#include "ps.pb-c.h"
#include "service.h"

static void free_names(char **names, int n) {
  if (names == NULL) return;
  for (int k = 0; k < n; k++)
    free(names[k]);
  free(names);
}

/* The parts a merge reads, P_temp/part-K-of-N for K < @n, as NULL when
 * out of memory.  Sized to the names (a request may ask for 99999). */
static char **part_names(const char *tdir, int n) {
  char **names = calloc((size_t)n, sizeof *names);
  if (names == NULL) return NULL;
  for (int k = 0; k < n; k++) {
    size_t len = strlen(tdir) + 32;
    if ((names[k] = malloc(len)) == NULL) {
      free_names(names, k);
      return NULL;
    }
    snprintf(names[k], len, "%s/part-%05d-of-%05d", tdir, k, n);
  }
  return names;
}

/* NOT_FOUND unless the first and the last of @n parts of @prefix are
 * there: checked before anything is sized to @n. */
static int parts_present(const char *prefix, const held_dir *td, int n, ps_status *st) {
  int ks[2] = {0, n - 1};
  for (int i = 0; i < 2; i++) {
    char name[64];
    snprintf(name, sizeof name, "part-%05d-of-%05d.index", ks[i], n);
    if (faccessat(td->fd, name, F_OK, AT_SYMLINK_NOFOLLOW) != 0)
      return ps_status_set(
          st, errno == ENOENT ? PS_NOT_FOUND : ps_status_code_from_errno(errno),
          "checkpoint %s: merge of %d parts, but part %d is not "
          "there (%s/%s: %s)",
          prefix, n, ks[i], td->path, name, strerror(errno));
  }
  return 0;
}

/* The Saver's MetaGraph of a merge (MergeRequest.meta_graph), as
 * <prefix>.meta, durably (no torn file under the name). */
static int write_meta(job *j, const char *out) {
  if (j->mrq->meta_graph.len == 0) return 0;
  char path[PATH_MAX + 16], shown[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s.meta", out);
  snprintf(shown, sizeof shown, "%s.meta", j->prefix);
  const char *op = NULL;
  if (ps_replace_file(path, NULL, j->mrq->meta_graph.data, j->mrq->meta_graph.len, &op,
                      NULL) != 0)
    return ps_status_set(&j->st, ps_status_code_from_errno(errno),
                         "checkpoint %s: %s its MetaGraph %s: %s", j->prefix,
                         op ? op : "writing", shown, strerror(errno));
  return 0;
}

static void remove_meta(job *j, const char *out) {
  if (j->mrq->meta_graph.len == 0) return;
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s.meta", out);
  unlink(path);
}

static void *merge_thread(void *arg) {
  job *j = arg;
  const char *root = ps_service_checkpoint_dir(j->svc);
  int rc = 0;
  bool merged = false;
  char **names = NULL, **listed = NULL;
  size_t nlisted = 0;
  char dir[PATH_MAX + 16], state[PATH_MAX + 16], conf[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s_temp", j->prefix);
  snprintf(state, sizeof state, "%s", j->prefix);
  char *sl = strrchr(state, '/');
  snprintf(sl ? sl + 1 : state, sizeof state - (size_t)(sl ? sl + 1 - state : 0), "%s",
           PS_CKPT_STATE_FILENAME);
  /* the prefix's directory and the temp directory, held open: every file
   * the merge reads, moves, writes and deletes goes through them */
  char pdir[PATH_MAX], tname[NAME_MAX + 1], out[PATH_MAX + 16];
  const char *base = ps_ckpt_split_base_(j->prefix, pdir, sizeof pdir);
  snprintf(tname, sizeof tname, "%s_temp", base);
  held_dir pd = {.fd = -1}, td = {.fd = -1};
  rc = ps_ckpt_path_confined(root, dir, conf, sizeof conf, &j->st);
  if (rc == 0) rc = ps_ckpt_held_open_(root, pdir, false, &pd, &j->st);
  if (rc == 0 && ps_ckpt_held_sub_(&pd, tname, false, LOCK_SH, &td) != 0)
    rc = ps_status_set(
        &j->st, errno == ENOENT ? PS_NOT_FOUND : ps_status_code_from_errno(errno),
        "checkpoint %s: no parts to merge (%s: %s)", j->prefix, dir, strerror(errno));
  if (rc == 0) snprintf(out, sizeof out, "%s/%s", pd.proc, base);
  if (rc == 0) rc = parts_present(j->prefix, &td, j->nshards, &j->st);
  if (rc == 0 && (names = part_names(dir, j->nshards)) == NULL)
    rc = ps_status_set(&j->st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  for (int k = 0; k < j->nshards && rc == 0; k++)
    rc = ps_ckpt_confine_bundle_(root, names[k], 1, &j->st);
  if (rc == 0) rc = ps_ckpt_confine_bundle_(root, j->prefix, j->nshards, &j->st);
  if (rc == 0) rc = ps_ckpt_path_confined(root, state, conf, sizeof conf, &j->st);
  /* from here on, the parts by the held temp directory */
  free_names(names, j->nshards);
  names = NULL;
  if (rc == 0 && (names = part_names(td.proc, j->nshards)) == NULL)
    rc = ps_status_set(&j->st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  if (rc == 0) PS_INFO("merging %d parts into %s", j->nshards, j->prefix);
  ps_ckpt_slow_point_("merge");
  if (rc == 0 && (rc = ps_ckpt_job_check_(j, "merge")) != 0) {
    /* the save is cut short: its parts are of no use any more */
    for (int k = 0; k < j->nshards; k++)
      ps_ckpt_remove_bundle_(names[k], 1);
    unlinkat(pd.fd, tname, AT_REMOVEDIR);
  }
  if (rc == 0) ps_ckpt_crash_point_("merge_before");
  /* --max-checkpoint-bytes: the parts move out of the temp directory now;
   * a quota check walking the directory meanwhile could miss them in both
   * places, so the checks wait for the moves (renames: brief) */
  bool quota = ps_service_limits_of(j->svc)->max_checkpoint_bytes > 0;
  if (quota) pthread_mutex_lock(&ps_ckpt_quota_mu_);
  if (rc == 0)
    rc = ps_bundle_merge((const char *const *)names, (size_t)j->nshards, out, &j->st);
  merged = rc == 0;
  if (rc == 0) ps_ckpt_crash_point_("merge_before_state");
  if (rc == 0) rc = ps_ckpt_job_check_(j, "merge");
  if (rc == 0) rc = write_meta(j, out);
  if (rc == 0) unlinkat(pd.fd, tname, AT_REMOVEDIR);
  if (quota) pthread_mutex_unlock(&ps_ckpt_quota_mu_);
  ps_ckpt_held_msg_(&j->st, &td);
  ps_ckpt_held_msg_(&j->st, &pd);
  if (rc == 0)
    rc = ps_service_update_state(j->svc, pd.fd, j->prefix, &j->su, &listed, &nlisted,
                                 &j->st);
  if (rc != 0 && merged) {
    /* the state file does not name it: what this merge wrote goes */
    ps_ckpt_remove_bundle_(out, j->nshards);
    remove_meta(j, out);
    PS_WARN("merge of %s failed after writing it: its .index and .data files removed",
            j->prefix);
  }
  if (rc == 0) {
    PS_INFO("checkpoint %s written (%d shards)", j->prefix, j->nshards);
    Paramserver__MergeResponse r = PARAMSERVER__MERGE_RESPONSE__INIT;
    r.prefix = j->prefix;
    r.listed = listed;
    r.n_listed = nlisted;
    ps_rpc_call_reply(j->c, &r.base);
  } else {
    PS_ERROR("merge of %s failed: %s", j->prefix, j->st.msg);
  }
  ps_ckpt_held_close_(&td);
  ps_ckpt_held_close_(&pd);
  free_names(names, j->nshards);
  for (size_t i = 0; i < nlisted; i++)
    free(listed[i]);
  free(listed);
  ps_rpc_call_resume(j->c, rc, &j->st); /* @j may be freed from here on */
  ps_ckpt_job_done_();
  return NULL;
}

/* --max-checkpoint-bytes: the bytes a merge of @j writes besides its
 * MetaGraph: the new state file (the old one's bytes, one more line naming
 * the prefix twice, and room for its header).  The merged index is not
 * counted again here: each save reserved its part's index twice (the
 * part's, then its share of the merged one, which replaces the parts'
 * indexes), so the merged index has one estimate, made before any shard
 * is written, and the header does no work per part (a request may name
 * 99999 parts that are not there). */
static int64_t merge_new_bytes(job *j) {
  if (ps_service_limits_of(j->svc)->max_checkpoint_bytes <= 0) return 0;
  int64_t b = 0;
  char p[PATH_MAX + 64];
  struct stat sb;
  snprintf(p, sizeof p, "%s", j->prefix);
  char *sl = strrchr(p, '/');
  snprintf(sl ? sl + 1 : p, sizeof p - (size_t)(sl ? sl + 1 - p : 0), "%s",
           PS_CKPT_STATE_FILENAME);
  if (lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) b += (int64_t)sb.st_size;
  return b + 2 * (int64_t)strlen(j->prefix) + 256;
}

int ps_ckpt_merge_header_(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  job *j = ps_ckpt_job_new_(c);
  if (j == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  Paramserver__MergeRequest *rq = paramserver__merge_request__unpack(NULL, n, p);
  if (rq == NULL) return ps_ckpt_bad_request_(st, "Merge");
  int rc = ps_ckpt_check_raw_prefix_(p, n, 1, "Merge", st);
  if (rc == 0)
    rc = ps_ckpt_path_(ps_service_checkpoint_dir(j->svc), rq->prefix, j->prefix,
                       sizeof j->prefix, st);
  if (rc == 0)
    rc =
        ps_wire_check_strings(&paramserver__merge_request__descriptor, p, n, "Merge", st);
  j->nshards = rq->num_shards;
  j->su.max_to_keep = rq->max_to_keep == 0 ? 5 : rq->max_to_keep;
  j->su.keep_every_n_hours = rq->keep_every_n_hours;
  j->su.own_list = rq->own_list;
  j->su.own = (const char *const *)rq->own_paths;
  j->su.nown = rq->n_own_paths;
  j->mrq = rq;
  if (rc == 0 && (j->nshards < 1 || j->nshards > 99999))
    rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                       "Merge: num_shards %d is outside [1, 99999]", j->nshards);
  if (rc == 0 && rq->n_own_paths > MAX_OWN_PATHS)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                       "Merge: %zu own_paths, more than the %d allowed", rq->n_own_paths,
                       MAX_OWN_PATHS);
  /* the data files are renamed into place; new bytes are the state file
   * and the .meta it carries (the merged index was counted by the saves) */
  if (rc == 0) {
    int64_t adds = (int64_t)rq->meta_graph.len + merge_new_bytes(j);
    rc = ps_ckpt_check_quota_(j, "Merge", "its state file and MetaGraph", adds, true, st);
  }
  return rc;
}

int ps_ckpt_merge_data_(ps_rpc_call *c, ps_status *st) {
  return ps_ckpt_spawn_(merge_thread, ps_rpc_call_ctx(c), st);
}
