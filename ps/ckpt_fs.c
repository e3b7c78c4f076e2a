/* Paths and directories of the checkpoint RPCs: prefixes a client sent,
 * confined under --checkpoint-dir, and directories held open (held_dir),
 * so that no link swapped in later is followed.  See ckpt.c for the
 * rules. */
#include "ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include "paramserver/checkpoint.h"

/* Room left after a prefix for the longest name derived from it
 * ("_temp/part-00000-of-00001.data-00000-of-00001.tempstate<20 digits>"). */
#define SUFFIX_ROOM 96
/* The same for the last component of a prefix (file names <= NAME_MAX). */
#define NAME_ROOM 64

/* Checks a prefix a client sent (a NUL is caught before, in the raw
 * request: ps_ckpt_check_raw_prefix_) and confines it under --checkpoint-dir into
 * @out.  INVALID_ARGUMENT for a control character or a path over the
 * limits (PATH_MAX for the whole, NAME_MAX per component, each less the
 * room the file suffixes need), PERMISSION_DENIED outside the directory,
 * FAILED_PRECONDITION without a directory. */
int ps_ckpt_path_(const char *root, const char *prefix, char *out, size_t n,
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

int ps_ckpt_check_raw_prefix_(const uint8_t *p, size_t n, uint32_t field, const char *m,
                              ps_status *st) {
  if (pb_field_has_nul(p, n, field))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: the checkpoint prefix has a NUL byte: refused", m);
  return 0;
}

/* ---- Directories held open: no link swapped in later is followed ---- */

void ps_ckpt_held_close_(held_dir *h) {
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

/* Holds the directory @dir (a path ps_ckpt_path_ confined under @root): opened
 * from @root (the operator's --checkpoint-dir, followed if a link) without
 * following any link below it.  PERMISSION_DENIED naming @dir when a link
 * is on the way now. */
int ps_ckpt_held_open_(const char *root, const char *dir, bool create, held_dir *h,
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
int ps_ckpt_held_sub_(const held_dir *parent, const char *name, bool create, int how,
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
void ps_ckpt_held_msg_(ps_status *st, const held_dir *h) {
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
const char *ps_ckpt_split_base_(const char *path, char *dir, size_t n) {
  const char *sl = strrchr(path, '/');
  if (sl == NULL) {
    snprintf(dir, n, ".");
    return path;
  }
  snprintf(dir, n, "%.*s", (int)(sl - path), path);
  if (dir[0] == '\0') snprintf(dir, n, "/");
  return sl + 1;
}

/* Removes the entries of the directory @fd (files: a temp directory). */
void ps_ckpt_empty_dir_(int fd) {
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

/* Confines P.index and P.data-?????-of-NNNNN of a bundle. */
int ps_ckpt_confine_bundle_(const char *root, const char *prefix, int nshards,
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
