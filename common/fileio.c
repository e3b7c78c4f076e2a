/* File reads and writes every module shares (see fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Reads @fd to its end into *@out (at most @max bytes); @size is the
 * file's size if known, else 0. */
static int read_fd(int fd, size_t size, size_t max, char **out, size_t *n) {
  if (max > SIZE_MAX - 2) max = SIZE_MAX - 2; /* room for one byte more and a NUL */
  if (size > max) {
    *n = size;
    return EFBIG;
  }
  /* a known size fits at once, with room to see the end and for the NUL */
  size_t cap = size > 0 ? size + 2 : (max + 2 < 4096 ? max + 2 : 4096), len = 0;
  char *buf = malloc(cap);
  if (buf == NULL) return ENOMEM;
  for (;;) {
    if (len == cap - 1) { /* full but for the NUL (len <= max: see below) */
      size_t nc = cap > (max + 2) / 2 ? max + 2 : cap * 2;
      char *nb = realloc(buf, nc);
      if (nb == NULL) {
        free(buf);
        return ENOMEM;
      }
      buf = nb;
      cap = nc;
    }
    ssize_t r = read(fd, buf + len, cap - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      return e;
    }
    if (r == 0) break;
    len += (size_t)r;
    if (len > max) {
      free(buf);
      *n = len;
      return EFBIG;
    }
  }
  buf[len] = '\0';
  *out = buf;
  *n = len;
  return 0;
}

int ps_read_file(int dirfd, const char *path, int flags, size_t max, char **out,
                 size_t *n, unsigned *type, const char **op) {
  *out = NULL;
  *n = 0;
  if (type) *type = 0;
  if (op) *op = "opening";
  bool nofollow = (flags & PS_READ_NOFOLLOW) != 0;
  int fd = (flags & PS_READ_REGULAR)
               ? ps_open_regular(dirfd, path, nofollow, type)
               : openat(dirfd, path, O_RDONLY | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
  if (fd < 0) return errno;
  if (op) *op = "reading";
  struct stat sb;
  size_t size = 0;
  if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0)
    size = (uint64_t)sb.st_size > SIZE_MAX ? SIZE_MAX : (size_t)sb.st_size;
  int e = read_fd(fd, size, max, out, n);
  close(fd);
  return e;
}

int ps_write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

int ps_fsync_dir(const char *dir) {
  int fd = open(dir[0] ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = fsync(fd) != 0 ? errno : 0;
  close(fd);
  return (err == EINVAL || err == EROFS) ? 0 : err;
}

char *ps_dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL) return strdup(".");
  if (slash == path) return strdup("/");
  size_t n = (size_t)(slash - path);
  char *d = malloc(n + 1);
  if (d == NULL) return NULL;
  memcpy(d, path, n);
  d[n] = '\0';
  return d;
}

static char *temp_name(const char *path) {
  uint64_t r;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
    r = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&r ^ (uint64_t)time(NULL);
  size_t n = strlen(path) + 32;
  char *t = malloc(n);
  if (t != NULL) snprintf(t, n, "%s.tmp%016" PRIx64, path, r);
  return t;
}

int ps_write_file_at(int dirfd, const char *tmp, const void *p, size_t n,
                     const char **op) {
  const char *step = "creating";
  int err = 0,
      fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (op) *op = step;
    return errno;
  }
  step = "writing";
  if (fchmod(fd, 0644) != 0) err = errno; /* whatever the umask */
  if (err == 0) err = ps_write_all(fd, p, n);
  if (err == 0) {
    step = "syncing";
    if (fsync(fd) != 0) err = errno;
  }
  if (close(fd) != 0 && err == 0) {
    step = "closing";
    err = errno;
  }
  if (err != 0) unlinkat(dirfd, tmp, 0);
  if (op) *op = step;
  return err;
}

int ps_write_file(const char *tmp, const void *p, size_t n, const char **op) {
  return ps_write_file_at(AT_FDCWD, tmp, p, n, op);
}

int ps_replace_file(const char *path, const char *tmp, const void *p, size_t n,
                    const char **op, char **tmp_used) {
  const char *step = "creating";
  char *t = NULL, *dir = ps_dir_of(path);
  int err = 0;
  if (dir == NULL) {
    err = ENOMEM;
  } else if (tmp != NULL) {
    if ((t = strdup(tmp)) == NULL)
      err = ENOMEM;
    else
      err = ps_write_file(t, p, n, &step);
  } else {
    for (int attempt = 0; attempt < 10; attempt++) { /* a fresh name on EEXIST */
      free(t);
      if ((t = temp_name(path)) == NULL) {
        err = ENOMEM;
        break;
      }
      if ((err = ps_write_file(t, p, n, &step)) != EEXIST) break;
    }
  }
  if (err == 0) {
    step = "renaming";
    if (rename(t, path) != 0) {
      err = errno;
      unlink(t);
    }
  }
  if (err == 0) {
    step = "syncing the directory of";
    err = ps_fsync_dir(dir);
  }
  if (op) *op = step;
  if (tmp_used)
    *tmp_used = t;
  else
    free(t);
  free(dir);
  return err;
}

int ps_replace_file_at(int dirfd, const char *name, const void *p, size_t n,
                       const char **op, char **tmp_used) {
  const char *step = "creating";
  char *t = NULL;
  int err = 0;
  if (strchr(name, '/') != NULL) {
    err = EINVAL;
  } else {
    for (int attempt = 0; attempt < 10; attempt++) { /* a fresh name on EEXIST */
      free(t);
      if ((t = temp_name(name)) == NULL) {
        err = ENOMEM;
        break;
      }
      if ((err = ps_write_file_at(dirfd, t, p, n, &step)) != EEXIST) break;
    }
  }
  if (err == 0) {
    step = "renaming";
    if (renameat(dirfd, t, dirfd, name) != 0) {
      err = errno;
      unlinkat(dirfd, t, 0);
    }
  }
  if (err == 0) {
    step = "syncing the directory of";
    if (fsync(dirfd) != 0 && errno != EINVAL && errno != EROFS) err = errno;
  }
  if (op) *op = step;
  if (tmp_used)
    *tmp_used = t;
  else
    free(t);
  return err;
}

int ps_open_beneath(int dirfd, const char *rel, bool create) {
  size_t n = strlen(rel) + 1;
  char *buf = malloc(n);
  if (buf == NULL) {
    errno = ENOMEM;
    return -1;
  }
  memcpy(buf, rel, n);
  int fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  char *save = NULL;
  for (char *c = fd < 0 ? NULL : strtok_r(buf, "/", &save); c;
       c = strtok_r(NULL, "/", &save)) {
    int nfd = -1;
    if (!strcmp(c, "..")) {
      errno = EPERM; /* never up, whatever the lexical path says */
    } else {
      nfd = openat(fd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (nfd < 0 && errno == ENOENT && create) {
        if (mkdirat(fd, c, 0755) == 0 || errno == EEXIST)
          nfd = openat(fd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      }
    }
    int e = errno;
    close(fd);
    fd = nfd;
    if (fd < 0) {
      errno = e;
      break;
    }
  }
  free(buf);
  return fd;
}

int ps_open_regular(int dirfd, const char *path, bool nofollow, unsigned *type) {
  if (type) *type = 0;
  int fd = openat(dirfd, path,
                  O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
  if (fd < 0) return -1;
  struct stat sb;
  int fl;
  if (fstat(fd, &sb) != 0) goto fail;
  if (S_ISDIR(sb.st_mode)) {
    close(fd);
    errno = EISDIR;
    return -1;
  }
  if (!S_ISREG(sb.st_mode)) {
    if (type) *type = (unsigned)(sb.st_mode & S_IFMT);
    close(fd);
    errno = EINVAL;
    return -1;
  }
  if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
    goto fail;
  return fd;
fail:;
  int e = errno;
  close(fd);
  errno = e;
  return -1;
}

const char *ps_file_type_name(unsigned type) {
  switch (type & S_IFMT) {
  case S_IFIFO:
    return "a FIFO";
  case S_IFDIR:
    return "a directory";
  case S_IFSOCK:
    return "a socket";
  case S_IFCHR:
  case S_IFBLK:
    return "a device";
  default:
    return "not a regular file";
  }
}
