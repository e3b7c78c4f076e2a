/* ps-launch's small helpers: allocations that end the launcher when
 * they fail, paths, exit descriptions, whole writes, integer flags, the
 * exit code and the temporary directory. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "launch_internal.h"

/* Small allocations that cannot fail in practice end the launcher if they
 * do (the children are then left running, as after a SIGKILL). */
void *ps_launch_xcheck_(void *p) {
  if (p == NULL) {
    fputs("ps-launch: out of memory\n", stderr);
    exit(1);
  }
  return p;
}

char *ps_launch_xstrdup_(const char *s) {
  return ps_launch_xcheck_(strdup(s));
}

char *ps_launch_path_join_(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = ps_launch_xcheck_(malloc(n));
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

void ps_launch_describe_(char *buf, size_t n, int64_t status, int signum) {
  if (signum)
    snprintf(buf, n, "killed by signal %d (%s)", signum, strsignal(signum));
  else
    snprintf(buf, n, "exited with status %lld", (long long)status);
}

/* Writes all of @p; a reader that went away is ignored (SIGPIPE is). */
void ps_launch_write_all_(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      poll(&pfd, 1, 1000);
      continue;
    }
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

int ps_launch_parse_int_(const char *flag, const char *s, int min, int max, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end || errno || v < min || v > max) {
    fprintf(stderr, "ps-launch: %s must be an integer in %d..%d, got '%s'\n", flag, min,
            max, s);
    return -1;
  }
  *out = (int)v;
  return 0;
}

void ps_launch_set_exit_(launcher *L, int code) {
  if (L->exit_set) return;
  L->exit_set = 1;
  L->exit_code = code;
}

int ps_launch_tmpdir_get_(launcher *L) {
  if (L->tmpdir) return 0;
  const char *base = getenv("TMPDIR");
  if (base == NULL || *base == '\0') base = "/tmp";
  char *t = ps_launch_path_join_(base, "ps-launch-XXXXXX");
  if (mkdtemp(t) == NULL) {
    PS_ERROR("cannot create a temporary directory under %s: %s", base, strerror(errno));
    free(t);
    return -1;
  }
  L->tmpdir = t;
  return 0;
}
