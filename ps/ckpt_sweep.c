/* The sweep of leftover "P_temp" directories of crashed saves: at
 * startup (ps_ckpt_sweep) and in a prefix's directory before each save;
 * see ckpt.c for when a temp directory counts as left over. */
#include "ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

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

/* Removes the temp directory @name of the directory @dfd if it is stale
 * (see the top of the file); 1 if removed.  It is opened, emptied and
 * removed through @dfd, no link followed; @shown names it in the log. */
static int sweep_one(int dfd, const char *name, const char *shown) {
  ps_ckpt_slow_point_("sweep");
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
    ps_ckpt_empty_dir_(fd);
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
int ps_ckpt_sweep_dir_(int dfd, const char *shown, int depth) {
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
        n += ps_ckpt_sweep_dir_(sfd, q, depth - 1);
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
  int n = ps_ckpt_sweep_dir_(fd, real, 8);
  close(fd);
  if (n > 0) PS_INFO("%d leftover temp directories removed from %s", n, real);
  return 0;
}
