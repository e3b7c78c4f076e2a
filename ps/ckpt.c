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
 * (ps_ckpt_sweep) and, in the prefix's directory, before each save. */
#include "ckpt.h"

#include <dirent.h>
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

#include "common/bundle.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/wire.h"
#include "paramserver/checkpoint.h"
#include "ps.pb-c.h"
#include "service.h"
#include "store.h"

/* Room left after a prefix for the longest name derived from it
 * ("_temp/part-00000-of-00001.data-00000-of-00001.tempstate<20 digits>"). */
#define SUFFIX_ROOM 96
/* The same for the last component of a prefix (file names <= NAME_MAX). */
#define NAME_ROOM 64

/* Checks a prefix a client sent (a NUL is caught before, in the raw
 * request: check_raw_prefix) and confines it under --checkpoint-dir into
 * @out.  INVALID_ARGUMENT for a control character or a path over the
 * limits (PATH_MAX for the whole, NAME_MAX per component, each less the
 * room the file suffixes need), PERMISSION_DENIED outside the directory,
 * FAILED_PRECONDITION without a directory. */
static int ckpt_path(const char *root, const char *prefix, char *out, size_t n,
                     ps_status *st) {
  if (root == NULL || root[0] == '\0')
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "this ps has no --checkpoint-dir: it cannot save or restore");
  if (prefix == NULL || prefix[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint prefix is empty");
  size_t len = strlen(prefix), limit = PATH_MAX - SUFFIX_ROOM - 1;
  if ((prefix[0] == '/' ? len : len + strlen(root) + 1) > limit)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint prefix of %zu bytes under %s is too long: the "
                         "limit is %zu bytes with the directory (PATH_MAX %d less %d "
                         "for the file suffixes)",
                         len, root, limit, PATH_MAX, SUFFIX_ROOM);
  const char *base = strrchr(prefix, '/');
  base = base ? base + 1 : prefix;
  for (const char *c = prefix; *c;) { /* every component <= NAME_MAX */
    size_t cl = strcspn(c, "/");
    size_t max = c == base ? (size_t)NAME_MAX - NAME_ROOM : (size_t)NAME_MAX;
    if (cl > max)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "checkpoint prefix has a path component of %zu bytes: the "
                           "limit is %zu bytes (NAME_MAX %d%s)",
                           cl, max, NAME_MAX,
                           c == base ? ", less room for the file suffixes" : "");
    c += cl;
    while (*c == '/')
      c++;
  }
  return ps_ckpt_path_confined(root, prefix, out, n, st);
}

/* Whether the top-level string field @field of the message @p[0..n)
 * holds a NUL byte (protobuf-c's unpacked string would end there). */
static bool pb_field_has_nul(const uint8_t *p, size_t n, uint32_t field) {
  size_t i = 0;
  while (i < n) {
    uint64_t key = 0;
    for (int sh = 0; i < n && sh < 64; sh += 7) {
      key |= (uint64_t)(p[i] & 0x7f) << sh;
      if (!(p[i++] & 0x80)) break;
    }
    uint64_t len = 0;
    switch (key & 7) {
    case 0:
      while (i < n && (p[i++] & 0x80)) {
      }
      continue;
    case 1:
      i += 8;
      continue;
    case 5:
      i += 4;
      continue;
    case 2:
      for (int sh = 0; i < n && sh < 64; sh += 7) {
        len |= (uint64_t)(p[i] & 0x7f) << sh;
        if (!(p[i++] & 0x80)) break;
      }
      if (len > n - i) return false; /* does not parse: unpack says so */
      if ((key >> 3) == field && memchr(p + i, 0, (size_t)len)) return true;
      i += (size_t)len;
      continue;
    default:
      return false;
    }
  }
  return false;
}

static int check_raw_prefix(const uint8_t *p, size_t n, uint32_t field, const char *m,
                            ps_status *st) {
  if (pb_field_has_nul(p, n, field))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: the checkpoint prefix has a NUL byte: refused", m);
  return 0;
}

/* ---- Directories held open: no link swapped in later is followed ---- */

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

static void held_close(held_dir *h) {
  if (h->fd >= 0) close(h->fd);
  h->fd = -1;
}

/* @path made absolute (from the working directory) and normalized
 * lexically ("." and empty components dropped, ".." taking one back), as
 * ps_ckpt_path_confined compares paths; malloc'd, NULL if out of memory. */
static char *abs_normalize(const char *path) {
  char cwd[PATH_MAX];
  if (path[0] != '/' && getcwd(cwd, sizeof cwd) == NULL) return NULL;
  size_t n = (path[0] == '/' ? 0 : strlen(cwd) + 1) + strlen(path) + 2;
  char *in = malloc(n), *out = malloc(n);
  if (in == NULL || out == NULL) {
    free(in);
    free(out);
    return NULL;
  }
  if (path[0] == '/')
    snprintf(in, n, "%s", path);
  else
    snprintf(in, n, "%s/%s", cwd, path);
  size_t k = 0;
  char *save = NULL;
  for (char *c = strtok_r(in, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (!strcmp(c, ".")) continue;
    if (!strcmp(c, "..")) {
      while (k > 0 && out[k - 1] != '/')
        k--;
      if (k > 0) k--;
      continue;
    }
    out[k++] = '/';
    size_t cl = strlen(c);
    memcpy(out + k, c, cl);
    k += cl;
  }
  if (k == 0) out[k++] = '/';
  out[k] = '\0';
  free(in);
  return out;
}

/* Holds the directory @dir (a path ckpt_path confined under @root): opened
 * from @root (the operator's --checkpoint-dir, followed if a link) without
 * following any link below it.  PERMISSION_DENIED naming @dir when a link
 * is on the way now. */
static int held_open(const char *root, const char *dir, bool create, held_dir *h,
                     ps_status *st) {
  h->fd = -1;
  snprintf(h->path, sizeof h->path, "%s", dir);
  char *ra = abs_normalize(root), *da = abs_normalize(dir);
  int rc = 0;
  if (ra == NULL || da == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  } else {
    size_t rl = strlen(ra);
    if (rl == 1) rl = 0; /* the root directory "/" */
    const char *rel = !strcmp(da, ra)                           ? ""
                      : (!strncmp(da, ra, rl) && da[rl] == '/') ? da + rl + 1
                                                                : NULL;
    int rootfd = rel ? open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (rel == NULL)
      rc = ps_status_set(st, PS_PERMISSION_DENIED,
                         "checkpoint path %s is outside the checkpoint directory %s", dir,
                         root);
    else if (rootfd < 0)
      rc = ps_status_set(st, ps_status_code_from_errno(errno),
                         "checkpoint directory %s: %s", root, strerror(errno));
    else if ((h->fd = ps_open_beneath(rootfd, rel, create)) < 0)
      rc = ps_status_set(st,
                         errno == ELOOP || errno == ENOTDIR
                             ? PS_PERMISSION_DENIED
                             : ps_status_code_from_errno(errno),
                         "checkpoint directory %s: %s%s", dir, strerror(errno),
                         errno == ELOOP || errno == ENOTDIR
                             ? " (a symbolic link on the way: links under the "
                               "checkpoint directory are not followed)"
                             : "");
    if (rootfd >= 0) close(rootfd);
  }
  free(ra);
  free(da);
  if (rc == 0) snprintf(h->proc, sizeof h->proc, "/proc/self/fd/%d", h->fd);
  return rc;
}

/* Opens and locks (@how) the directory @name in @parent, creating it with
 * @create; the lock is retried if a sweeper removed the directory between
 * its creation and the lock.  -1 with errno. */
static int held_sub(const held_dir *parent, const char *name, bool create, int how,
                    held_dir *h) {
  h->fd = -1;
  snprintf(h->path, sizeof h->path, "%s/%s", parent->path, name);
  for (int tries = 0; tries < 5; tries++) {
    if (create && mkdirat(parent->fd, name, 0755) != 0 && errno != EEXIST) return -1;
    int fd = openat(parent->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT && create) continue;
      return -1;
    }
    if (flock(fd, how) != 0) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    struct stat a, b;
    if (fstat(fd, &a) == 0 && fstatat(parent->fd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
        a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
      h->fd = fd;
      snprintf(h->proc, sizeof h->proc, "/proc/self/fd/%d", fd);
      return 0;
    }
    close(fd);
    if (!create) {
      errno = ENOENT;
      return -1;
    }
  }
  errno = EAGAIN;
  return -1;
}

/* A message naming /proc/self/fd/N names the directory instead. */
static void held_msg(ps_status *st, const held_dir *h) {
  if (h->fd < 0 || st->code == 0) return;
  size_t pl = strlen(h->proc);
  char out[sizeof st->msg];
  size_t k = 0;
  for (const char *m = st->msg; *m && k + 1 < sizeof out;) {
    if (!strncmp(m, h->proc, pl) && (m[pl] == '/' || m[pl] == '\0' || m[pl] == ' ')) {
      k += (size_t)snprintf(out + k, sizeof out - k, "%s", h->path);
      if (k >= sizeof out) k = sizeof out - 1;
      m += pl;
    } else {
      out[k++] = *m++;
    }
  }
  out[k] = '\0';
  memcpy(st->msg, out, k + 1);
}

/* The last component of @path, and in @dir what is before it. */
static const char *split_base(const char *path, char *dir, size_t n) {
  const char *sl = strrchr(path, '/');
  if (sl == NULL) {
    snprintf(dir, n, ".");
    return path;
  }
  snprintf(dir, n, "%.*s", (int)(sl - path), path);
  if (dir[0] == '\0') snprintf(dir, n, "/");
  return sl + 1;
}

/* ---- Jobs: every save, merge and restore thread ---- */

static pthread_mutex_t jobs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;
static int jobs_running;
static atomic_bool jobs_abort;

void ps_ckpt_abort_all(void) {
  pthread_mutex_lock(&jobs_mu);
  atomic_store(&jobs_abort, true);
  pthread_cond_broadcast(&jobs_cv); /* wakes slow_point() sleepers */
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

static void empty_dir(int fd);

/* Records the finished part @part (its .index at @idx) under the
 * checkpoint directory @root. */
static void unmerged_add(const char *root, const char *part, const char *idx) {
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
    const char *tname = split_base(dir, pdir, sizeof pdir);
    held_dir pd;
    ps_status hst;
    ps_status_clear(&hst);
    if (held_open(unmerged_root, pdir, false, &pd, &hst) != 0) {
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
      held_close(&pd);
      continue;
    }
    if (all) {
      empty_dir(fd);
    } else {
      unlinkat(fd, f, 0);
      snprintf(f, sizeof f, "%s.data-00000-of-00001", name);
      unlinkat(fd, f, 0);
    }
    close(fd);
    bool gone = all && unlinkat(pd.fd, tname, AT_REMOVEDIR) == 0;
    held_close(&pd);
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

static void job_done(void) {
  pthread_mutex_lock(&jobs_mu);
  jobs_running--;
  pthread_cond_broadcast(&jobs_cv);
  pthread_mutex_unlock(&jobs_mu);
}

static bool aborting(void *arg) {
  (void)arg;
  return atomic_load(&jobs_abort);
}

/* Fault injection for the crash tests: PS_CRASH_AT=<point> makes this ps
 * die at that point of a save as kill -9 would (no cleanup, no flush). */
static void crash_point(const char *point) {
  const char *at = getenv("PS_CRASH_AT");
  if (at && !strcmp(at, point)) {
    PS_WARN("PS_CRASH_AT=%s: dying here", point);
    raise(SIGKILL);
  }
}

/* And PS_SLOW_AT=<point>:<ms> makes a job sleep there (each time), to
 * test shutdown during a long save; an abort ends the sleep. */
static void slow_point(const char *point) {
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

/* ---- Leftover temp directories ---- */

/* The newest mtime of the directory @fd and its entries (not recursive:
 * a temp directory holds files only). */
static time_t newest_mtime(int fd) {
  struct stat sb;
  time_t t = fstat(fd, &sb) == 0 ? sb.st_mtime : time(NULL);
  int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* own offset */
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (d == NULL) {
    if (dfd >= 0) close(dfd);
    return time(NULL);
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && sb.st_mtime > t)
      t = sb.st_mtime;
  }
  closedir(d);
  return t;
}

/* Removes the entries of the directory @fd (files: a temp directory). */
static void empty_dir(int fd) {
  int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* own offset */
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (d == NULL) {
    if (dfd >= 0) close(dfd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(fd, e->d_name, 0);
  closedir(d);
}

/* Removes the temp directory @name of the directory @dfd if it is stale
 * (see the top of the file); 1 if removed.  It is opened, emptied and
 * removed through @dfd, no link followed; @shown names it in the log. */
static int sweep_one(int dfd, const char *name, const char *shown) {
  slow_point("sweep");
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return 0;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) { /* a save or merge works in it: live */
    close(fd);
    return 0;
  }
  int removed = 0;
  struct stat a, b;
  if (time(NULL) - newest_mtime(fd) >= PS_CKPT_TEMP_STALE_SECS && fstat(fd, &a) == 0 &&
      fstatat(dfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_ino == b.st_ino &&
      a.st_dev == b.st_dev) {
    empty_dir(fd);
    removed = unlinkat(dfd, name, AT_REMOVEDIR) == 0;
    if (removed)
      PS_INFO("removed the leftover temp directory %s", shown);
    else
      PS_WARN("cannot remove the leftover temp directory %s: %s", shown, strerror(errno));
  }
  close(fd);
  return removed;
}

static bool ends_with_temp(const char *name) {
  size_t n = strlen(name);
  return n > 5 && !strcmp(name + n - 5, "_temp");
}

/* Sweeps the directory @dfd (@shown in the log) and, to @depth levels, its
 * subdirectories, each opened from its parent without following a link:
 * a directory swapped for a link during the walk leads nowhere. */
static int sweep_dir(int dfd, const char *shown, int depth) {
  int lfd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* own offset */
  DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
  if (d == NULL) {
    if (lfd >= 0) close(lfd);
    return 0;
  }
  int n = 0;
  struct dirent *e;
  char q[PATH_MAX];
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if ((size_t)snprintf(q, sizeof q, "%s/%s", shown, e->d_name) >= sizeof q) continue;
    struct stat sb;
    if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode))
      continue;
    if (ends_with_temp(e->d_name)) {
      n += sweep_one(dfd, e->d_name, q);
    } else if (depth > 0) {
      int sfd = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sfd >= 0) {
        n += sweep_dir(sfd, q, depth - 1);
        close(sfd);
      }
    }
  }
  closedir(d);
  return n;
}

int ps_ckpt_sweep(const char *dir, ps_status *st) {
  char real[PATH_MAX];
  if (dir == NULL || realpath(dir, real) == NULL)
    return ps_status_set(st, dir ? ps_status_code_from_errno(errno) : PS_INVALID_ARGUMENT,
                         "checkpoint directory %s: %s", dir ? dir : "(none)",
                         dir ? strerror(errno) : "not given");
  /* the operator's directory itself may be a link; nothing below it */
  int fd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return ps_status_set(st, ps_status_code_from_errno(errno),
                         "checkpoint directory %s: %s", real, strerror(errno));
  int n = sweep_dir(fd, real, 8);
  close(fd);
  if (n > 0) PS_INFO("%d leftover temp directories removed from %s", n, real);
  return 0;
}

static int bad(ps_status *st, const char *m) {
  return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: request message does not parse", m);
}

/* ---- Snapshot / Release ---- */

static int snapshot_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *svc = ps_rpc_call_server_user(c);
  if (ps_wire_check_strings(&paramserver__snapshot_request__descriptor, p, n, "Snapshot",
                            st))
    return st->code;
  Paramserver__SnapshotRequest *rq = paramserver__snapshot_request__unpack(NULL, n, p);
  if (rq == NULL) return bad(st, "Snapshot");
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
  if (rc == 0)
    rc =
        ps_store_snapshot_begin_sel(ps_service_store(svc), rq->id, hold,
                                    rq->skip_uninitialized, rq->select ? &sel : NULL, st);
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
  if (rq == NULL) return bad(st, "Release");
  ps_store_snapshot_release(ps_service_store(svc), rq->id);
  paramserver__release_request__free_unpacked(rq, NULL);
  Paramserver__ReleaseResponse r = PARAMSERVER__RELEASE_RESPONSE__INIT;
  ps_rpc_call_reply(c, &r.base);
  return 0;
}

static int no_data(ps_rpc_call *c, ps_status *st) {
  return 0;
}

/* ---- Save ---- */

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
  ps_status st;
  int64_t reserved; /* --max-checkpoint-bytes: bytes this save holds back */
} job;

/* --max-checkpoint-bytes: bytes of saves under way, counted against the
 * quota beside what the directory holds, so that saves at once cannot all
 * pass the check (quota_mu serializes the checks). */
static pthread_mutex_t quota_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t quota_reserved;

static void job_free(ps_rpc_call *c) {
  job *j = ps_rpc_call_ctx(c);
  if (j == NULL) return;
  for (size_t i = 0; j->pi && j->snap && i < j->snap->n; i++)
    free(j->pi[i].full_name);
  free(j->pi);
  ps_snapshot_free(j->snap);
  if (j->rq) paramserver__restore_request__free_unpacked(j->rq, NULL);
  if (j->mrq) paramserver__merge_request__free_unpacked(j->mrq, NULL);
  if (j->reserved) {
    pthread_mutex_lock(&quota_mu);
    quota_reserved -= j->reserved;
    pthread_mutex_unlock(&quota_mu);
  }
  free(j);
}

static job *job_new(ps_rpc_call *c) {
  job *j = calloc(1, sizeof *j);
  if (j == NULL) return NULL;
  j->c = c;
  j->svc = ps_rpc_call_server_user(c);
  snprintf(j->task, sizeof j->task, "%s", ps_store_task(ps_service_store(j->svc)));
  ps_rpc_call_set_ctx(c, j);
  return j;
}

/* UNAVAILABLE once shutdown asked the jobs to stop. */
static int job_check(job *j, const char *what) {
  if (!atomic_load(&jobs_abort)) return 0;
  return ps_status_set(&j->st, PS_UNAVAILABLE, "%s is shutting down: %s of %s cut short",
                       j->task, what, j->prefix);
}

/* Removes P.index and P.data-?????-of-NNNNN (@nshards) of a bundle this
 * job wrote and could not finish; best effort. */
static void remove_bundle(const char *prefix, int nshards) {
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s.index", prefix);
  unlink(p);
  for (int k = 0; k < nshards; k++)
    if (ps_bundle_data_filename(prefix, k, nshards, p, sizeof p)) unlink(p);
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
  const char *base = split_base(j->prefix, pdir, sizeof pdir);
  snprintf(tname, sizeof tname, "%s_temp", base);
  held_dir pd, td;
  if (held_open(root, pdir, true, &pd, st) != 0) return st->code;
  sweep_dir(pd.fd, pd.path, 0); /* leftovers of crashed saves beside this one */
  if (held_sub(&pd, tname, true, LOCK_SH, &td) != 0) {
    int e = errno;
    held_close(&pd);
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
    held_msg(st, &td);
    held_close(&td);
    held_close(&pd);
    return st->code;
  }
  ps_bundle_writer_set_cancel(w, aborting, NULL);
  for (size_t i = 0; i < j->snap->n && rc == 0; i++) {
    ps_snapshot_entry *e = &j->snap->e[i];
    part_info *pi = &j->pi[i];
    slow_point("save_tensor");
    if ((rc = job_check(j, "save")) != 0) break;
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
    if (rc == PS_CANCELLED) rc = job_check(j, "save");
    /* the snapshot's reference is dropped as soon as its bytes are out */
    ps_buf_unref(e->buf);
    e->buf = NULL;
    if (i == 0) crash_point("save_mid_shard");
  }
  if (rc == 0) rc = job_check(j, "save");
  if (rc == 0) rc = ps_bundle_writer_finish(w, st);
  if (rc == 0) crash_point("save_after_shard");
  /* shutdown asked during the finish: no merge will come for it */
  if (rc == 0) rc = job_check(j, "save");
  *bytes = (int64_t)ps_bundle_writer_bytes(w);
  *tensors = (int64_t)j->snap->n;
  ps_bundle_writer_destroy(w); /* an unfinished part's files go with it */
  held_msg(st, &td);
  if (rc != 0) {
    remove_bundle(part, 1);
    unlinkat(pd.fd, tname, AT_REMOVEDIR); /* if this ps was the only one in it */
  } else if (j->shard == j->nshards - 1) {
    unmerged_add(root, j->part, pidx);
  }
  held_close(&td);
  held_close(&pd);
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
  job_done();
  return NULL;
}

static int spawn(void *(*fn)(void *), job *j, ps_status *st) {
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
    job_done();
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
static int check_quota(job *j, const char *op, const char *what, int64_t adds, bool hold,
                       ps_status *st) {
  int64_t quota = ps_service_limits_of(j->svc)->max_checkpoint_bytes;
  if (quota <= 0) return 0;
  const char *root = ps_service_checkpoint_dir(j->svc);
  int rc = 0;
  pthread_mutex_lock(&quota_mu);
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
  pthread_mutex_unlock(&quota_mu);
  return rc;
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

static int save_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  job *j = job_new(c);
  if (j == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  Paramserver__SaveRequest *rq = paramserver__save_request__unpack(NULL, n, p);
  if (rq == NULL) return bad(st, "Save");
  int rc = check_raw_prefix(p, n, 2, "Save", st);
  if (rc == 0)
    rc = ckpt_path(ps_service_checkpoint_dir(j->svc), rq->prefix, j->prefix,
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
  paramserver__save_request__free_unpacked(rq, NULL);
  if (rc) return rc;
  snprintf(j->part, sizeof j->part, "%s_temp/part-%05d-of-%05d", j->prefix, j->shard,
           j->nshards);
  ps_store *store = ps_service_store(j->svc);
  if (sid == 0) { /* this ps alone, now */
    if ((rc = ps_store_snapshot_begin(store, -1, 10000, false, st)) != 0) return rc;
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
  shard += 2 * index_estimate(j->snap); /* its part's, then the merged one */
  char what[128];
  snprintf(what, sizeof what, "shard %d of %s (tensors and index)", j->shard, j->task);
  if ((rc = check_quota(j, "Save", what, shard, true, st)) != 0) return rc;
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

static int save_data(ps_rpc_call *c, ps_status *st) {
  return spawn(save_thread, ps_rpc_call_ctx(c), st);
}

/* ---- Merge ---- */

/* Confines P.index and P.data-?????-of-NNNNN of a bundle. */
static int confine_bundle(const char *root, const char *prefix, int nshards,
                          ps_status *st) {
  char p[PATH_MAX + 64], out[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s.index", prefix);
  if (ps_ckpt_path_confined(root, p, out, sizeof out, st)) return st->code;
  for (int k = 0; k < nshards; k++) {
    if (!ps_bundle_data_filename(prefix, k, nshards, p, sizeof p))
      return ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint %s: name too long",
                           prefix);
    if (ps_ckpt_path_confined(root, p, out, sizeof out, st)) return st->code;
  }
  return 0;
}

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
  const char *base = split_base(j->prefix, pdir, sizeof pdir);
  snprintf(tname, sizeof tname, "%s_temp", base);
  held_dir pd = {.fd = -1}, td = {.fd = -1};
  rc = ps_ckpt_path_confined(root, dir, conf, sizeof conf, &j->st);
  if (rc == 0) rc = held_open(root, pdir, false, &pd, &j->st);
  if (rc == 0 && held_sub(&pd, tname, false, LOCK_SH, &td) != 0)
    rc = ps_status_set(
        &j->st, errno == ENOENT ? PS_NOT_FOUND : ps_status_code_from_errno(errno),
        "checkpoint %s: no parts to merge (%s: %s)", j->prefix, dir, strerror(errno));
  if (rc == 0) snprintf(out, sizeof out, "%s/%s", pd.proc, base);
  if (rc == 0) rc = parts_present(j->prefix, &td, j->nshards, &j->st);
  if (rc == 0 && (names = part_names(dir, j->nshards)) == NULL)
    rc = ps_status_set(&j->st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  for (int k = 0; k < j->nshards && rc == 0; k++)
    rc = confine_bundle(root, names[k], 1, &j->st);
  if (rc == 0) rc = confine_bundle(root, j->prefix, j->nshards, &j->st);
  if (rc == 0) rc = ps_ckpt_path_confined(root, state, conf, sizeof conf, &j->st);
  /* from here on, the parts by the held temp directory */
  free_names(names, j->nshards);
  names = NULL;
  if (rc == 0 && (names = part_names(td.proc, j->nshards)) == NULL)
    rc = ps_status_set(&j->st, PS_RESOURCE_EXHAUSTED, "Merge: out of memory");
  if (rc == 0) PS_INFO("merging %d parts into %s", j->nshards, j->prefix);
  slow_point("merge");
  if (rc == 0 && (rc = job_check(j, "merge")) != 0) {
    /* the save is cut short: its parts are of no use any more */
    for (int k = 0; k < j->nshards; k++)
      remove_bundle(names[k], 1);
    unlinkat(pd.fd, tname, AT_REMOVEDIR);
  }
  if (rc == 0) crash_point("merge_before");
  /* --max-checkpoint-bytes: the parts move out of the temp directory now;
   * a quota check walking the directory meanwhile could miss them in both
   * places, so the checks wait for the moves (renames: brief) */
  bool quota = ps_service_limits_of(j->svc)->max_checkpoint_bytes > 0;
  if (quota) pthread_mutex_lock(&quota_mu);
  if (rc == 0)
    rc = ps_bundle_merge((const char *const *)names, (size_t)j->nshards, out, &j->st);
  merged = rc == 0;
  if (rc == 0) crash_point("merge_before_state");
  if (rc == 0) rc = job_check(j, "merge");
  if (rc == 0) rc = write_meta(j, out);
  if (rc == 0) unlinkat(pd.fd, tname, AT_REMOVEDIR);
  if (quota) pthread_mutex_unlock(&quota_mu);
  held_msg(&j->st, &td);
  held_msg(&j->st, &pd);
  if (rc == 0)
    rc = ps_service_update_state(j->svc, pd.fd, j->prefix, &j->su, &listed, &nlisted,
                                 &j->st);
  if (rc != 0 && merged) {
    /* the state file does not name it: what this merge wrote goes */
    remove_bundle(out, j->nshards);
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
  held_close(&td);
  held_close(&pd);
  free_names(names, j->nshards);
  for (size_t i = 0; i < nlisted; i++)
    free(listed[i]);
  free(listed);
  ps_rpc_call_resume(j->c, rc, &j->st); /* @j may be freed from here on */
  job_done();
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

static int merge_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  job *j = job_new(c);
  if (j == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  Paramserver__MergeRequest *rq = paramserver__merge_request__unpack(NULL, n, p);
  if (rq == NULL) return bad(st, "Merge");
  int rc = check_raw_prefix(p, n, 1, "Merge", st);
  if (rc == 0)
    rc = ckpt_path(ps_service_checkpoint_dir(j->svc), rq->prefix, j->prefix,
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
    rc = check_quota(j, "Merge", "its state file and MetaGraph", adds, true, st);
  }
  return rc;
}

static int merge_data(ps_rpc_call *c, ps_status *st) {
  return spawn(merge_thread, ps_rpc_call_ctx(c), st);
}

/* ---- Restore ---- */

typedef struct staged {
  ps_var *v;
  ps_buf *buf; /* the tensor read and checked, swapped in by restore_apply */
  ps_buf *old; /* the buffer replaced, released after the locks */
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
                        size_t *nv, ps_status *st) {
  ps_store *store = ps_service_store(j->svc);
  const char *root = ps_service_checkpoint_dir(j->svc);
  char idx[PATH_MAX + 16], conf[PATH_MAX + 16], pdir[PATH_MAX], in[PATH_MAX + 16];
  snprintf(idx, sizeof idx, "%s.index", j->prefix);
  int rc;
  if ((rc = ps_ckpt_path_confined(root, idx, conf, sizeof conf, st)) != 0) return rc;
  /* its files are read through its directory, held open (no link on the
   * way is followed, and none swapped in later) */
  const char *base = split_base(j->prefix, pdir, sizeof pdir);
  if ((rc = held_open(root, pdir, false, pd, st)) != 0) return rc;
  snprintf(in, sizeof in, "%s/%s", pd->proc, base);
  if ((*r = ps_bundle_reader_open_nofollow(in, st)) == NULL)
    return st->code ? st->code : PS_INTERNAL;
  if ((rc = confine_bundle(root, j->prefix, ps_bundle_reader_num_shards(*r), st)) != 0)
    return rc;
  if (j->rq->n_items == 0) {
    *vars = ps_store_list(store, nv);
    return 0;
  }
  *nv = j->rq->n_items;
  if ((*vars = calloc(*nv + 1, sizeof **vars)) == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  for (size_t i = 0; i < *nv; i++)
    if (((*vars)[i] = ps_store_find(store, j->rq->items[i]->name, st)) == NULL)
      return st->code;
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
    slow_point("restore_tensor");
    if ((rc = job_check(j, "restore")) != 0) break;
    const char *key = j->rq->n_items ? j->rq->items[i]->key : NULL;
    sv[i].v = vars[i];
    rc = restore_one(r, vars[i], key, j->rq->check_only ? NULL : &sv[i].buf, st);
  }
  return rc;
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
  for (size_t i = 0; i < nv && rc == 0; i++) {
    ps_var *v = sv[i].v;
    sv[i].old = v->buf ? ps_buf_ref(v->buf) : NULL;
    ps_var_set_buf(store, v, sv[i].buf, NULL);
  }
  ps_store_unlock_set(vars, nv);
  /* the replaced buffers are unmapped outside the locks */
  for (size_t i = 0; i < nv; i++)
    ps_buf_unref(sv[i].old);
  return rc;
}

/* The response: the names restored. */
static int restore_reply(job *j, ps_var **vars, size_t nv, ps_status *st) {
  Paramserver__RestoreResponse resp = PARAMSERVER__RESTORE_RESPONSE__INIT;
  char **names = calloc(nv + 1, sizeof *names);
  if (names == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  for (size_t i = 0; i < nv; i++)
    names[i] = vars[i]->name;
  resp.restored = names;
  resp.n_restored = nv;
  resp.prefix = j->prefix;
  resp.checked = j->rq->check_only;
  ps_rpc_call_reply(j->c, &resp.base);
  free(names);
  if (j->rq->check_only)
    PS_INFO("checked %zu variables of %s for a restore", nv, j->prefix);
  else
    PS_INFO("restored %zu variables from %s", nv, j->prefix);
  return 0;
}

static void *restore_thread(void *arg) {
  job *j = arg;
  ps_status *st = &j->st;
  ps_bundle_reader *r = NULL;
  staged *sv = NULL;
  size_t nv = 0;
  ps_var **vars = NULL;
  held_dir pd = {.fd = -1};
  int rc = restore_open(j, &pd, &r, &vars, &nv, st);
  if (rc == 0) {
    sv = calloc(nv + 1, sizeof *sv);
    if (sv == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
    else
      PS_INFO("%s %zu variables from %s", j->rq->check_only ? "checking" : "restoring",
              nv, j->prefix);
  }
  if (rc == 0) rc = restore_stage(j, r, vars, sv, nv, st);
  if (rc == 0 && !j->rq->check_only) rc = restore_apply(j, vars, sv, nv, st);
  if (rc == 0) rc = restore_reply(j, vars, nv, st);
  for (size_t i = 0; sv && i < nv; i++)
    ps_buf_unref(sv[i].buf);
  free(sv);
  free(vars);
  ps_bundle_reader_close(r);
  held_msg(st, &pd);
  held_close(&pd);
  if (rc)
    PS_ERROR("%s from %s failed: %s", j->rq->check_only ? "restore check" : "restore",
             j->prefix, st->msg);
  ps_rpc_call_resume(j->c, rc, st); /* @j may be freed from here on */
  job_done();
  return NULL;
}

static int restore_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  job *j = job_new(c);
  if (j == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  j->rq = paramserver__restore_request__unpack(NULL, n, p);
  if (j->rq == NULL) return bad(st, "Restore");
  int rc = check_raw_prefix(p, n, 1, "Restore", st);
  if (rc == 0)
    rc = ps_wire_check_strings(&paramserver__restore_request__descriptor, p, n, "Restore",
                               st);
  if (rc) return rc;
  /* test hook: answer as an older ps-server, which ignores check_only and
   * restores (tests of the client's guard against it) */
  const char *old = getenv("PS_TEST_IGNORE_CHECK_ONLY");
  if (old && old[0] == '1') j->rq->check_only = false;
  const char *root = ps_service_checkpoint_dir(j->svc);
  if (j->rq->prefix[0] == '\0') {
    char *latest = NULL;
    char conf[PATH_MAX];
    if ((rc = ckpt_path(root, PS_CKPT_STATE_FILENAME, conf, sizeof conf, st)) != 0)
      return rc;
    if ((rc = ps_service_latest(j->svc, &latest, st)) != 0) return rc;
    rc = ckpt_path(root, latest, j->prefix, sizeof j->prefix, st);
    free(latest);
    return rc;
  }
  return ckpt_path(root, j->rq->prefix, j->prefix, sizeof j->prefix, st);
}

static int restore_data(ps_rpc_call *c, ps_status *st) {
  return spawn(restore_thread, ps_rpc_call_ctx(c), st);
}

const ps_rpc_handler ps_ckpt_handlers[5] = {
    {"/paramserver.Ps/Snapshot", snapshot_header, no_data, NULL, NULL,
     PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Release", release_header, no_data, NULL, NULL, PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Save", save_header, save_data, job_free, NULL, PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Merge", merge_header, merge_data, job_free, NULL,
     PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Restore", restore_header, restore_data, job_free, NULL,
     PS_RPC_ACCESS_ADMIN},
};
