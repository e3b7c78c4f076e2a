/* The jobs of the checkpoint RPCs: every save, merge and restore runs on
 * a thread of its own, counted so that shutdown can stop them and wait
 * for them (ps_ckpt_abort_all, ps_ckpt_wait_all); the parts a stopped ps
 * will never merge; the --max-checkpoint-bytes quota; fault injection
 * for the crash tests. */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "ps.pb-c.h"
#include "service.h"
#include "store.h"

static pthread_mutex_t jobs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;
static int jobs_running;
static atomic_bool jobs_abort;

void ps_ckpt_abort_all(void) {
  pthread_mutex_lock(&jobs_mu);
  atomic_store(&jobs_abort, true);
  pthread_cond_broadcast(&jobs_cv); /* wakes ps_ckpt_slow_point_() sleepers */
  pthread_mutex_unlock(&jobs_mu);
}

/* Parts this ps wrote as the merging shard (the last: the client merges
 * on the last ps) that no merge has taken yet: once this ps stops, no
 * merge will, so ps_ckpt_wait_all() removes them (the other ps' parts of
 * such a save may still be merged by theirs and are kept).  Known by the
 * device and inode of the part's .index, so that a part written again
 * since by someone else is not touched. */
typedef struct unmerged {
  char part[PATH_MAX + 64]; /* P_temp/part-K-of-N */
  dev_t dev;
  ino_t ino;
} unmerged;
#define MAX_UNMERGED 64
static unmerged unmerged_parts[MAX_UNMERGED];
static int n_unmerged;
static char unmerged_root[PATH_MAX]; /* --checkpoint-dir */

static bool same_file(const char *path, dev_t dev, ino_t ino) {
  struct stat sb;
  return lstat(path, &sb) == 0 && sb.st_dev == dev && sb.st_ino == ino;
}

/* Records the finished part @part (its .index at @idx) under the
 * checkpoint directory @root. */
void ps_ckpt_unmerged_add_(const char *root, const char *part, const char *idx) {
  struct stat sb;
  if (lstat(idx, &sb) != 0) return;
  pthread_mutex_lock(&jobs_mu);
  snprintf(unmerged_root, sizeof unmerged_root, "%s", root);
  /* entries a merge took (their .index gone) make room first */
  int k = 0;
  for (int i = 0; i < n_unmerged; i++) {
    char p[PATH_MAX + 80];
    snprintf(p, sizeof p, "%s.index", unmerged_parts[i].part);
    if (same_file(p, unmerged_parts[i].dev, unmerged_parts[i].ino))
      unmerged_parts[k++] = unmerged_parts[i];
  }
  n_unmerged = k;
  if (n_unmerged == MAX_UNMERGED) { /* the oldest is forgotten: the sweep has it */
    memmove(unmerged_parts, unmerged_parts + 1,
            (MAX_UNMERGED - 1) * sizeof *unmerged_parts);
    n_unmerged--;
  }
  unmerged *u = &unmerged_parts[n_unmerged++];
  snprintf(u->part, sizeof u->part, "%s", part);
  u->dev = sb.st_dev;
  u->ino = sb.st_ino;
  pthread_mutex_unlock(&jobs_mu);
}

/* On the way out: the merging shards no merge took are removed, with the
 * other parts of their save when no one works in the temp directory; the
 * files and the temp directory go through its directory, opened from
 * --checkpoint-dir down without following a link. */
static void unmerged_remove_all(void) {
  for (int i = 0; i < n_unmerged; i++) {
    unmerged *u = &unmerged_parts[i];
    char idx[PATH_MAX + 80], dir[PATH_MAX + 64];
    snprintf(idx, sizeof idx, "%s.index", u->part);
    if (!same_file(idx, u->dev, u->ino)) continue; /* merged, or not ours now */
    snprintf(dir, sizeof dir, "%s", u->part);
    char *sl = strrchr(dir, '/');
    if (sl == NULL) continue;
    *sl = '\0';
    const char *name = sl + 1;
    char pdir[PATH_MAX];
    const char *tname = ps_ckpt_split_base_(dir, pdir, sizeof pdir);
    held_dir pd;
    ps_status hst;
    ps_status_clear(&hst);
    if (ps_ckpt_held_open_(unmerged_root, pdir, false, &pd, &hst) != 0) {
      PS_WARN("the unmerged part %s is left: %s", u->part, hst.msg);
      continue;
    }
    int fd = openat(pd.fd, tname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    /* another ps works in it: this part alone */
    bool all = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0;
    struct stat sb;
    char f[NAME_MAX + 1];
    snprintf(f, sizeof f, "%s.index", name);
    if (fd < 0 || fstatat(fd, f, &sb, AT_SYMLINK_NOFOLLOW) != 0 || sb.st_ino != u->ino ||
        sb.st_dev != u->dev) {
      if (fd >= 0) close(fd);
      ps_ckpt_held_close_(&pd);
      continue;
    }
    if (all) {
      ps_ckpt_empty_dir_(fd);
    } else {
      unlinkat(fd, f, 0);
      snprintf(f, sizeof f, "%s.data-00000-of-00001", name);
      unlinkat(fd, f, 0);
    }
    close(fd);
    bool gone = all && unlinkat(pd.fd, tname, AT_REMOVEDIR) == 0;
    ps_ckpt_held_close_(&pd);
    if (gone)
      PS_INFO("removed %s: a save this ps would have merged, stopped before its merge",
              dir);
    else
      PS_INFO("removed the unmerged part %s of a save stopped before its merge", u->part);
  }
  n_unmerged = 0;
}

void ps_ckpt_wait_all(void) {
  pthread_mutex_lock(&jobs_mu);
  while (jobs_running > 0)
    pthread_cond_wait(&jobs_cv, &jobs_mu);
  pthread_mutex_unlock(&jobs_mu);
  unmerged_remove_all();
}

void ps_ckpt_job_done_(void) {
  pthread_mutex_lock(&jobs_mu);
  jobs_running--;
  pthread_cond_broadcast(&jobs_cv);
  pthread_mutex_unlock(&jobs_mu);
}

bool ps_ckpt_aborting_(void *arg) {
  (void)arg;
  return atomic_load(&jobs_abort);
}

/* Fault injection for the crash tests: PS_CRASH_AT=<point> makes this ps
 * die at that point of a save as kill -9 would (no cleanup, no flush). */
void ps_ckpt_crash_point_(const char *point) {
  const char *at = getenv("PS_CRASH_AT");
  if (at && !strcmp(at, point)) {
    PS_WARN("PS_CRASH_AT=%s: dying here", point);
    raise(SIGKILL);
  }
}

/* And PS_SLOW_AT=<point>:<ms> makes a job sleep there (each time), to
 * test shutdown during a long save; an abort ends the sleep. */
void ps_ckpt_slow_point_(const char *point) {
  const char *at = getenv("PS_SLOW_AT");
  size_t pl = strlen(point);
  if (at == NULL || strncmp(at, point, pl) != 0 || at[pl] != ':') return;
  long ms = strtol(at + pl + 1, NULL, 10);
  PS_INFO("PS_SLOW_AT=%s: waiting %ld ms", point, ms);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&jobs_mu);
  while (!atomic_load(&jobs_abort) &&
         pthread_cond_timedwait(&jobs_cv, &jobs_mu, &until) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&jobs_mu);
}

int ps_ckpt_bad_request_(ps_status *st, const char *m) {
  return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: request message does not parse", m);
}

/* --max-checkpoint-bytes: bytes of saves under way, counted against the
 * quota beside what the directory holds, so that saves at once cannot all
 * pass the check (ps_ckpt_quota_mu_ serializes the checks). */
pthread_mutex_t ps_ckpt_quota_mu_ = PTHREAD_MUTEX_INITIALIZER;
static int64_t quota_reserved;

void ps_ckpt_job_free_(ps_rpc_call *c) {
  job *j = ps_rpc_call_ctx(c);
  if (j == NULL) return;
  for (size_t i = 0; j->pi && j->snap && i < j->snap->n; i++)
    free(j->pi[i].full_name);
  free(j->pi);
  ps_snapshot_free(j->snap);
  if (j->rq) paramserver__restore_request__free_unpacked(j->rq, NULL);
  free(j->item_of);
  if (j->mrq) paramserver__merge_request__free_unpacked(j->mrq, NULL);
  if (j->reserved) {
    pthread_mutex_lock(&ps_ckpt_quota_mu_);
    quota_reserved -= j->reserved;
    pthread_mutex_unlock(&ps_ckpt_quota_mu_);
  }
  free(j);
}

job *ps_ckpt_job_new_(ps_rpc_call *c) {
  job *j = calloc(1, sizeof *j);
  if (j == NULL) return NULL;
  j->c = c;
  j->svc = ps_rpc_call_server_user(c);
  snprintf(j->task, sizeof j->task, "%s", ps_store_task(ps_service_store(j->svc)));
  ps_rpc_call_set_ctx(c, j);
  return j;
}

/* UNAVAILABLE once shutdown asked the jobs to stop. */
int ps_ckpt_job_check_(job *j, const char *what) {
  if (!atomic_load(&jobs_abort)) return 0;
  return ps_status_set(&j->st, PS_UNAVAILABLE, "%s is shutting down: %s of %s cut short",
                       j->task, what, j->prefix);
}

int ps_ckpt_spawn_(void *(*fn)(void *), job *j, ps_status *st) {
  pthread_mutex_lock(&jobs_mu);
  if (atomic_load(&jobs_abort)) {
    pthread_mutex_unlock(&jobs_mu);
    return ps_status_set(st, PS_UNAVAILABLE, "%s is shutting down", j->task);
  }
  jobs_running++;
  pthread_mutex_unlock(&jobs_mu);
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  int e = pthread_create(&t, &a, fn, j);
  pthread_attr_destroy(&a);
  if (e != 0) {
    ps_ckpt_job_done_();
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "cannot start a thread: %s",
                         strerror(e));
  }
  return PS_RPC_PENDING;
}

/* Bytes of the regular files under the checkpoint directory (nftw). */
static _Thread_local int64_t dir_bytes_sum;
static int dir_bytes_add(const char *path, const struct stat *sb, int type,
                         struct FTW *ftw) {
  (void)path;
  (void)ftw;
  if (type == FTW_F && S_ISREG(sb->st_mode)) dir_bytes_sum += (int64_t)sb->st_size;
  return 0;
}

/* --max-checkpoint-bytes: what the directory holds, what saves under way
 * hold back and @adds (this shard's tensors, or a Merge's .meta) must stay
 * within the quota, else RESOURCE_EXHAUSTED naming it, before anything is
 * written; a save's bytes stay held back until its call ends.  Files that
 * vanish during the walk (a merge renaming) are skipped. */
int ps_ckpt_check_quota_(job *j, const char *op, const char *what, int64_t adds,
                         bool hold, ps_status *st) {
  int64_t quota = ps_service_limits_of(j->svc)->max_checkpoint_bytes;
  if (quota <= 0) return 0;
  const char *root = ps_service_checkpoint_dir(j->svc);
  int rc = 0;
  pthread_mutex_lock(&ps_ckpt_quota_mu_);
  dir_bytes_sum = 0;
  nftw(root, dir_bytes_add, 16, FTW_PHYS);
  int64_t held = dir_bytes_sum + quota_reserved;
  if (held > quota || adds > quota - held)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                       "%s of %s: %s holds %lld bytes (with saves under way) and %s adds "
                       "%lld, more than --max-checkpoint-bytes %lld (delete old "
                       "checkpoints, or lower max_to_keep)",
                       op, j->prefix, root, (long long)held, what, (long long)adds,
                       (long long)quota);
  else if (hold)
    quota_reserved += (j->reserved = adds);
  pthread_mutex_unlock(&ps_ckpt_quota_mu_);
  return rc;
}
