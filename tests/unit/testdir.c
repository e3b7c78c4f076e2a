/* Scratch directories and test data paths for the unit tests (testdir.h). */
#include "testdir.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char basedir[256];
char tmpdir[300];

void setup_basedir(void) {
  const char *base = getenv("TMPDIR");
  snprintf(basedir, sizeof basedir, "%s/%s.XXXXXX", base && base[0] ? base : "/tmp",
           program_invocation_short_name);
  if (mkdtemp(basedir) == NULL) {
    perror(basedir);
    exit(EXIT_FAILURE);
  }
}

void setup_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "%s/t.XXXXXX", basedir);
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  chmod(dir, 0755);
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
      remove_tree(path);
    else
      unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

void teardown_tmpdir(void) {
  remove_tree(tmpdir);
}
void teardown_basedir(void) {
  remove_tree(basedir);
}

const char *tmp(const char *fmt, ...) {
  static char bufs[8][1024];
  static int i;
  char *b = bufs[i++ & 7];
  int o = snprintf(b, 1024, "%s/", tmpdir);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b + o, (size_t)(1024 - o), fmt, ap);
  va_end(ap);
  return b;
}

const char *tfdata(const char *rel) {
  static char bufs[4][1024];
  static int i;
  char *b = bufs[i++ & 3];
  const char *base = getenv("PS_TESTDATA");
  ck_assert_msg(base != NULL, "PS_TESTDATA is not set");
  snprintf(b, 1024, "%s/tf-checkpoints/%s", base, rel);
  return b;
}
