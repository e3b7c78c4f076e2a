/* Retention of a checkpoint directory (TensorFlow's CheckpointManager and
 * Saver's max_to_keep / keep_checkpoint_every_n_hours), and deleting a
 * checkpoint's files.
 *
 * Retention writes the new state before it deletes anything, so a crash in
 * between leaves unlisted files behind (harmless) rather than a state
 * naming deleted checkpoints.  The manager persists everything its policy
 * needs in TensorFlow's own fields (timestamps, last_preserved_timestamp),
 * so TensorFlow's CheckpointManager and this code can take turns on one
 * directory. */
#include "paramserver/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_at.h"
#include "checkpoint_internal.h"
#include "common/bundle.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/tensor.h"

/* ---- Deleting a checkpoint ---------------------------------------------- */

/* "<base>.data-NNNNN-of-NNNNN", five digits each (TensorFlow's glob
 * "?????"). */
static bool is_data_file(const char *name, const char *base) {
  size_t bl = strlen(base);
  if (strncmp(name, base, bl) != 0) return false;
  const char *p = name + bl;
  static const char pat[] = ".data-#####-of-#####";
  for (size_t i = 0; i < sizeof pat - 1; i++, p++) {
    if (pat[i] == '#' ? !(*p >= '0' && *p <= '9') : *p != pat[i]) return false;
  }
  return *p == '\0';
}

/* Deletes @name in @dfd (a link itself, never what it names); the first
 * failure but a missing file goes to *@rc, naming @shown_dir/@name. */
static void remove_one(int dfd, const char *shown_dir, const char *name, int *rc,
                       ps_status *st) {
  if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) return;
  int e = errno;
  if (*rc == 0) {
    char *p = ps_path_join_(shown_dir, name);
    *rc = ps_status_set(st, ps_status_code_from_errno(e), "deleting %s: %s", p ? p : name,
                        strerror(e));
    free(p);
  }
}

int ps_ckpt_remove_at(int dfd, const char *dir, const char *base, ps_status *st) {
  int rc = 0;
  char *index = ps_str_cat3_(base, ".index", "");
  char *meta = ps_str_cat3_(base, ".meta", "");
  if (index == NULL || meta == NULL) {
    rc = ps_ckpt_oom_(st);
    goto done;
  }
  remove_one(dfd, dir, index, &rc, st);
  /* its own descriptor: readdir moves the offset */
  int lfd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
  if (d == NULL) {
    if (lfd >= 0) close(lfd);
    if (rc == 0)
      rc = ps_status_set(st, ps_status_code_from_errno(errno),
                         "deleting checkpoint %s/%s: listing %s: %s", dir, base, dir,
                         strerror(errno));
  } else {
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
      if (is_data_file(e->d_name, base)) remove_one(dfd, dir, e->d_name, &rc, st);
    closedir(d);
  }
  remove_one(dfd, dir, meta, &rc, st);
done:
  free(index);
  free(meta);
  return rc;
}

int ps_ckpt_remove(const char *prefix, ps_status *st) {
  const char *slash = strrchr(prefix, '/');
  const char *base = slash ? slash + 1 : prefix;
  char *dname = slash ? strndup(prefix, slash == prefix ? 1 : (size_t)(slash - prefix))
                      : strdup(".");
  if (dname == NULL) return ps_ckpt_oom_(st);
  int rc = 0, dfd = open(dname, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    rc = ps_ckpt_remove_at(dfd, dname, base, st);
    close(dfd);
  } else if (errno != ENOENT) { /* no directory: nothing to delete */
    rc = ps_status_set(st, ps_status_code_from_errno(errno),
                       "deleting checkpoint %s: listing %s: %s", prefix, dname,
                       strerror(errno));
  }
  free(dname);
  return rc;
}

/* ---- Retention ----------------------------------------------------------- */

void ps_ckpt_manager_options_init(ps_ckpt_manager_options *opt) {
  opt->max_to_keep = 5;
  opt->keep_checkpoint_every_n_hours = 10000.0;
}

typedef struct mentry {
  char *raw;  /* as in the state file */
  char *full; /* joined with the directory */
  char *key;  /* absolute and normalized, to recognize a path saved again */
  double ts;
} mentry;

struct ps_ckpt_manager {
  int dfd; /* the directory opened (not owned), or AT_FDCWD: by its path */
  char *dir;
  char *dirkey; /* absolute and normalized */
  int max_to_keep;
  double period; /* seconds; 0 = never preserve */
  /* TensorFlow's CheckpointManager rule: an evicted checkpoint is kept if
   * its timestamp >= last_preserved + period, and then becomes the last
   * preserved.  (TF1's Saver advances a "next time" by one period instead,
   * so after a long pause it keeps a run of consecutive checkpoints; the
   * two agree otherwise, and this one is what last_preserved_timestamp
   * means in the state file.) */
  double last_preserved;
  char *latest;
  mentry **e; /* oldest first */
  size_t n;
};

static void mentry_free(mentry *x) {
  if (x == NULL) return;
  free(x->raw);
  free(x->full);
  free(x->key);
  free(x);
}

static mentry *mentry_new(const char *dir, const char *raw, double ts) {
  mentry *x = calloc(1, sizeof *x);
  if (x == NULL) return NULL;
  x->raw = strdup(raw);
  x->full = x->raw ? ps_path_join_(dir, raw) : NULL;
  x->key = x->full ? ps_path_abs_normalize_(x->full) : NULL;
  x->ts = ts;
  if (x->key == NULL) {
    mentry_free(x);
    return NULL;
  }
  return x;
}

void ps_ckpt_manager_destroy(ps_ckpt_manager *m) {
  if (m == NULL) return;
  for (size_t i = 0; i < m->n; i++)
    mentry_free(m->e[i]);
  free(m->e);
  free(m->dir);
  free(m->dirkey);
  free(m->latest);
  free(m);
}

/* @key (absolute, normalized) relative to the managed directory, or NULL
 * when it is not below it. */
static const char *rel_of(const ps_ckpt_manager *m, const char *key) {
  size_t dl = strlen(m->dirkey);
  if (dl == 1) dl = 0; /* "/" */
  if (strncmp(key, m->dirkey, dl) != 0 || key[dl] != '/' || key[dl + 1] == '\0')
    return NULL;
  return key + dl + 1;
}

/* When a recovered checkpoint was saved, for state files without
 * timestamps: the mtime of its index (TF1's recover_last_checkpoints).
 * @full is its path, @key the same normalized; through the directory
 * opened, only one below it is looked at, links not followed. */
static double index_mtime(const ps_ckpt_manager *m, const char *full, const char *key,
                          double fallback) {
  const char *rel = m->dfd == AT_FDCWD ? full : rel_of(m, key);
  char *index = rel ? ps_str_cat3_(rel, ".index", "") : NULL;
  struct stat sb;
  double t = fallback;
  if (index &&
      fstatat(m->dfd, index, &sb, m->dfd == AT_FDCWD ? 0 : AT_SYMLINK_NOFOLLOW) == 0)
    t = (double)sb.st_mtim.tv_sec + (double)sb.st_mtim.tv_nsec * 1e-9;
  free(index);
  return t;
}

/* Appends @x, dropping an earlier entry for the same path. */
static void entries_push(mentry **e, size_t *n, mentry *x, mentry **dropped) {
  *dropped = NULL;
  for (size_t i = 0; i < *n; i++) {
    if (strcmp(e[i]->key, x->key) == 0) {
      *dropped = e[i];
      memmove(e + i, e + i + 1, (*n - i - 1) * sizeof *e);
      (*n)--;
      break;
    }
  }
  e[(*n)++] = x;
}

ps_ckpt_manager *ps_ckpt_manager_create(const char *dir,
                                        const ps_ckpt_manager_options *opt, double now,
                                        ps_status *st) {
  return ps_ckpt_manager_create_at(AT_FDCWD, dir, opt, now, st);
}

ps_ckpt_manager *ps_ckpt_manager_create_at(int dirfd, const char *dir,
                                           const ps_ckpt_manager_options *opt, double now,
                                           ps_status *st) {
  ps_ckpt_manager_options defaults;
  if (opt == NULL) {
    ps_ckpt_manager_options_init(&defaults);
    opt = &defaults;
  }
  if (dir == NULL || dir[0] == '\0') {
    ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint manager: empty directory");
    return NULL;
  }
  if (opt->max_to_keep < 0 || isnan(opt->keep_checkpoint_every_n_hours) || isnan(now)) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "checkpoint manager for %s: max_to_keep %d must be >= 0 and "
                  "keep_checkpoint_every_n_hours and the time must be numbers",
                  dir, opt->max_to_keep);
    return NULL;
  }
  ps_ckpt_state s;
  ps_status rst = {0};
  int rc = ps_ckpt_state_read_raw_at_(dirfd, dir, &s, &rst);
  if (rc == PS_DATA_LOSS) {
    PS_WARN("%s; starting a new checkpoint state for %s", rst.msg, dir);
  } else if (rc != 0 && rc != PS_NOT_FOUND) {
    if (st) *st = rst;
    return NULL;
  }
  if (rc != 0) memset(&s, 0, sizeof s);

  ps_ckpt_manager *m = calloc(1, sizeof *m);
  if (m == NULL) goto nomem;
  m->dfd = dirfd;
  m->max_to_keep = opt->max_to_keep;
  m->period = opt->keep_checkpoint_every_n_hours > 0
                  ? opt->keep_checkpoint_every_n_hours * 3600.0
                  : 0;
  m->dir = strdup(dir);
  m->dirkey = ps_path_abs_normalize_(dir);
  m->e = calloc(s.num_paths + 1, sizeof *m->e);
  if (m->dir == NULL || m->dirkey == NULL || m->e == NULL) goto nomem;
  /* A last_preserved_timestamp in the future means the clock went back:
   * clamp, as TensorFlow does, so old checkpoints are not kept forever. */
  m->last_preserved = s.last_preserved_timestamp > 0 && s.last_preserved_timestamp < now
                          ? s.last_preserved_timestamp
                          : now;
  bool have_ts = s.num_timestamps == s.num_paths;
  for (size_t i = 0; i < s.num_paths; i++) {
    mentry *x = mentry_new(dir, s.all_model_checkpoint_paths[i], 0);
    if (x == NULL) goto nomem;
    x->ts = have_ts ? s.all_model_checkpoint_timestamps[i]
                    : index_mtime(m, x->full, x->key, now);
    if (!(x->ts <= now)) x->ts = now;
    mentry *dropped;
    entries_push(m->e, &m->n, x, &dropped);
    mentry_free(dropped);
  }
  if (s.model_checkpoint_path &&
      (m->latest = ps_path_join_(dir, s.model_checkpoint_path)) == NULL)
    goto nomem;
  ps_ckpt_state_free(&s);
  return m;
nomem:
  ps_ckpt_state_free(&s);
  ps_ckpt_manager_destroy(m);
  ps_ckpt_oom_(st);
  return NULL;
}

/* The base name of @prefix when it names a file directly in the managed
 * directory; *@pkey (freed by the caller) holds the normalized prefix. */
static int base_in_dir(const ps_ckpt_manager *m, const char *prefix, char **pkey,
                       const char **base, ps_status *st) {
  if ((*pkey = ps_path_abs_normalize_(prefix)) == NULL) return ps_ckpt_oom_(st);
  char *slash = strrchr(*pkey, '/');
  *base = slash ? slash + 1 : *pkey;
  bool in_dir = false;
  if (slash && (*base)[0] != '\0' && strcmp(*base, "..") != 0) {
    *slash = '\0';
    in_dir = strcmp((*pkey)[0] ? *pkey : "/", m->dirkey) == 0;
  }
  if (!in_dir)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s is not in the managed directory %s", prefix,
                         m->dir);
  return 0;
}

/* The retention policy over next[0..nn): returns the first entry that stays
 * listed; the ones before it are evicted (into evicted[0..*ne)) or, every
 * keep_checkpoint_every_n_hours, preserved on disk (*lp moves). */
static size_t apply_policy(const ps_ckpt_manager *m, mentry **next, size_t nn,
                           mentry **evicted, size_t *ne, double *lp) {
  size_t first = 0;
  if (m->max_to_keep == 0) return nn - 1; /* every file kept, only the latest listed */
  while (nn - first > (size_t)m->max_to_keep) {
    mentry *old = next[first++];
    if (m->period > 0 && old->ts >= *lp + m->period)
      *lp = old->ts; /* preserved: stays on disk, no longer listed */
    else
      evicted[(*ne)++] = old;
  }
  return first;
}

/* Writes the state that lists @keep[0..nk), the latest being @x. */
static int write_listed(const ps_ckpt_manager *m, const mentry *x, mentry *const *keep,
                        size_t nk, double lp, ps_status *st) {
  char **paths = calloc(nk + 1, sizeof *paths);
  double *ts = calloc(nk + 1, sizeof *ts);
  if (paths == NULL || ts == NULL) {
    free(paths);
    free(ts);
    return ps_ckpt_oom_(st);
  }
  for (size_t i = 0; i < nk; i++) {
    paths[i] = keep[i]->raw;
    ts[i] = keep[i]->ts;
  }
  ps_ckpt_state s = {
      .model_checkpoint_path = x->raw,
      .num_paths = nk,
      .all_model_checkpoint_paths = paths,
      .num_timestamps = nk,
      .all_model_checkpoint_timestamps = ts,
      .last_preserved_timestamp = lp,
  };
  int rc = ps_ckpt_state_write_at_(m->dfd, m->dir, &s, st);
  free(paths);
  free(ts);
  return rc;
}

/* Deletes the files of the checkpoint @x, which only is done inside the
 * managed directory: a state file may list any path (it is a text file
 * anyone can edit).  Through the directory opened, @x must be below it
 * lexically and is reached from it without following a link, so a
 * directory swapped for a link meanwhile leads nowhere. */
static void remove_evicted(const ps_ckpt_manager *m, const mentry *x) {
  ps_status dst = {0};
  if (m->dfd == AT_FDCWD) {
    char conf[4096];
    if (ps_ckpt_path_confined(m->dir, x->full, conf, sizeof conf, &dst) != 0)
      PS_WARN("checkpoint %s not deleted: %s", x->full, dst.msg);
    else if (ps_ckpt_remove(conf, &dst) != 0)
      PS_WARN("checkpoint %s not fully deleted: %s", x->full, dst.msg);
    return;
  }
  const char *rel = rel_of(m, x->key);
  if (rel == NULL) {
    PS_WARN("checkpoint %s not deleted: it is outside the directory %s", x->full, m->dir);
    return;
  }
  char *sub = strdup(rel), *shown = ps_dir_of(x->key);
  char *slash = sub ? strrchr(sub, '/') : NULL;
  const char *base = slash ? slash + 1 : rel;
  if (slash) *slash = '\0';
  int sfd = sub == NULL || shown == NULL
                ? -1
                : ps_open_beneath(m->dfd, slash ? sub : "", false);
  if (sub == NULL || shown == NULL)
    PS_WARN("checkpoint %s not deleted: out of memory", x->full);
  else if (sfd < 0 && errno != ENOENT)
    PS_WARN("checkpoint %s not deleted: %s: %s%s", x->full, shown, strerror(errno),
            errno == ELOOP || errno == ENOTDIR ? " (links are not followed)" : "");
  else if (sfd >= 0 && ps_ckpt_remove_at(sfd, shown, base, &dst) != 0)
    PS_WARN("checkpoint %s not fully deleted: %s", x->full, dst.msg);
  if (sfd >= 0) close(sfd);
  free(sub);
  free(shown);
}

/* Deletes the files of the evicted entries among next[0..first) and frees
 * all of those entries. */
static void drop_unlisted(const ps_ckpt_manager *m, mentry **next, size_t first,
                          mentry *const *evicted, size_t ne) {
  for (size_t i = 0; i < first; i++) {
    bool is_evicted = false;
    for (size_t j = 0; j < ne; j++)
      is_evicted |= evicted[j] == next[i];
    if (is_evicted) remove_evicted(m, next[i]);
    mentry_free(next[i]);
  }
}

int ps_ckpt_manager_add(ps_ckpt_manager *m, const char *prefix, double now,
                        ps_status *st) {
  if (prefix == NULL || prefix[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint manager for %s: empty prefix", m->dir);
  if (isnan(now))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint manager for %s: time is NaN", m->dir);
  mentry *x = NULL, **next = NULL, **evicted = NULL;
  char *pkey = NULL, *latest = NULL;
  const char *base = NULL;
  int rc = base_in_dir(m, prefix, &pkey, &base, st);
  if (rc != 0) goto done;
  x = mentry_new(m->dir, base, now);
  next = calloc(m->n + 1, sizeof *next);
  evicted = calloc(m->n + 1, sizeof *evicted);
  if (x == NULL || next == NULL || evicted == NULL) {
    rc = ps_ckpt_oom_(st);
    goto done;
  }
  size_t nn = m->n, ne = 0;
  memcpy(next, m->e, m->n * sizeof *next);
  mentry *resaved;
  entries_push(next, &nn, x, &resaved);
  double lp = m->last_preserved;
  size_t first = apply_policy(m, next, nn, evicted, &ne, &lp); /* next[first..nn) stay */
  size_t nk = nn - first;
  if ((rc = write_listed(m, x, next + first, nk, lp, st)) != 0) goto done;
  /* Committed: the state on disk lists next[first..nn). */
  if ((latest = strdup(x->full)) == NULL) {
    rc = ps_ckpt_oom_(st);
    goto done;
  }
  free(m->latest);
  m->latest = latest;
  m->last_preserved = lp;
  mentry_free(resaved);
  drop_unlisted(m, next, first, evicted, ne);
  memmove(next, next + first, nk * sizeof *next);
  free(m->e);
  m->e = next;
  m->n = nk;
  next = NULL;
  x = NULL;
done:
  free(next); /* not committed: m->e still owns every old entry */
  mentry_free(x);
  free(evicted);
  free(pkey);
  return rc;
}

const char *ps_ckpt_manager_latest(const ps_ckpt_manager *m) {
  return m->latest;
}
size_t ps_ckpt_manager_count(const ps_ckpt_manager *m) {
  return m->n;
}
/* The entry for own path @path: the listed one with its timestamp, or one
 * made for a checkpoint of the directory whose index exists (timestamp:
 * the index's mtime, as TF's recover_last_checkpoints); NULL with *@rc 0
 * when there is none, with *@rc set when out of memory. */
static mentry *own_entry(ps_ckpt_manager *m, const char *path, int *rc, ps_status *st) {
  char *full = ps_path_join_(m->dir, path),
       *key = full ? ps_path_abs_normalize_(full) : NULL;
  free(full);
  if (key == NULL) {
    *rc = ps_ckpt_oom_(st);
    return NULL;
  }
  mentry *x = NULL;
  for (size_t i = 0; i < m->n && x == NULL; i++)
    if (m->e[i] != NULL && strcmp(m->e[i]->key, key) == 0) {
      x = m->e[i];
      m->e[i] = NULL; /* taken */
    }
  char *slash = strrchr(key, '/');
  if (x == NULL && slash != NULL && slash[1] != '\0') {
    *slash = '\0';
    bool in_dir = strcmp(key[0] ? key : "/", m->dirkey) == 0;
    *slash = '/';
    /* through the directory opened: its own name there, no link followed */
    char *index = ps_str_cat3_(m->dfd == AT_FDCWD ? key : slash + 1, ".index", "");
    struct stat sb;
    if (index == NULL)
      *rc = ps_ckpt_oom_(st);
    else if (in_dir &&
             fstatat(m->dfd, index, &sb, m->dfd == AT_FDCWD ? 0 : AT_SYMLINK_NOFOLLOW) ==
                 0 &&
             (x = mentry_new(m->dir, slash + 1, index_mtime(m, key, key, 0))) == NULL)
      *rc = ps_ckpt_oom_(st);
    free(index);
  }
  free(key);
  return x;
}

int ps_ckpt_manager_retain(ps_ckpt_manager *m, const char *const *paths, size_t n,
                           ps_status *st) {
  mentry **keep = calloc(n + 1, sizeof *keep);
  if (keep == NULL) return ps_ckpt_oom_(st);
  size_t k = 0;
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    mentry *x = own_entry(m, paths[i] ? paths[i] : "", &rc, st);
    if (x != NULL) keep[k++] = x;
  }
  /* the entries not taken are no longer listed; their files stay */
  for (size_t i = 0; i < m->n; i++)
    mentry_free(m->e[i]);
  free(m->e);
  m->e = keep;
  m->n = k;
  return rc;
}

const char *ps_ckpt_manager_path(const ps_ckpt_manager *m, size_t i) {
  return i < m->n ? m->e[i]->full : NULL;
}
double ps_ckpt_manager_timestamp(const ps_ckpt_manager *m, size_t i) {
  return i < m->n ? m->e[i]->ts : 0;
}

int ps_ckpt_record(const char *dir, const char *prefix,
                   const ps_ckpt_manager_options *opt, double now, ps_status *st) {
  ps_status local;
  if (st == NULL) st = &local;
  ps_ckpt_manager *m = ps_ckpt_manager_create(dir, opt, now, st);
  if (m == NULL) return st->code;
  int rc = ps_ckpt_manager_add(m, prefix, now, st);
  ps_ckpt_manager_destroy(m);
  return rc;
}
