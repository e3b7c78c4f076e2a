/* The path guard of checkpoint files: a prefix is resolved (symbolic
 * links included) and must stay inside the root directory.  The ps
 * confines every file of a save, restore and merge under --checkpoint-dir
 * with it. */
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

#include "checkpoint_internal.h"
#include "common/bundle.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/tensor.h"

/* ---- Path confinement ---------------------------------------------------- */

/* Symbolic links: the deepest existing directory on the way from @cand_abs
 * up to @root_abs must really be inside the real root, and no link on the
 * way may dangle. */
static int check_links(const char *prefix, const char *root, const char *root_abs,
                       const char *cand_abs, ps_status *st) {
  char *rroot = realpath(root_abs, NULL), *cur = NULL;
  int rc = 0;
  if (rroot != NULL) {
    cur = strdup(cand_abs);
    if (cur == NULL) {
      rc = ps_ckpt_oom_(st);
      goto done;
    }
    while (ps_path_within_(cur, root_abs) && strcmp(cur, root_abs) != 0) {
      char *real = realpath(cur, NULL);
      struct stat lsb;
      if (real == NULL && lstat(cur, &lsb) == 0 && S_ISLNK(lsb.st_mode)) {
        /* a dangling link: creating the file would follow it anywhere */
        rc = ps_status_set(st, PS_PERMISSION_DENIED,
                           "checkpoint path %s: %s is a symbolic link that does not "
                           "resolve; refused (checkpoint directory %s)",
                           prefix, cur, root);
        goto done;
      }
      if (real != NULL) {
        bool inside = ps_path_within_(real, rroot);
        if (!inside) {
          rc = ps_status_set(st, PS_PERMISSION_DENIED,
                             "checkpoint path %s leads to %s (through a symbolic link), "
                             "outside the checkpoint directory %s",
                             prefix, real, root);
          free(real);
          goto done;
        }
        free(real);
        break;
      }
      char *slash = strrchr(cur, '/');
      if (slash == NULL || slash == cur) break;
      *slash = '\0';
    }
  }
done:
  free(rroot);
  free(cur);
  return rc;
}

/* Control characters have no business in a checkpoint path. */
static int check_chars(const char *root, const char *prefix, ps_status *st) {
  for (const unsigned char *c = (const unsigned char *)prefix; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "checkpoint path has a control character (byte 0x%02x at "
                           "offset %zu): refused (directory %s)",
                           *c, (size_t)((const char *)c - prefix), root);
  return 0;
}

int ps_ckpt_path_confined(const char *root, const char *prefix, char *resolved, size_t n,
                          ps_status *st) {
  if (root == NULL || root[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "empty checkpoint directory (for %s)",
                         prefix ? prefix : "(null)");
  if (prefix == NULL || prefix[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "empty checkpoint path (directory %s)",
                         root);
  int rc = check_chars(root, prefix, st);
  if (rc != 0) return rc;
  char *rootn = NULL, *pn = NULL, *cand = NULL, *cand_abs = NULL, *root_abs = NULL;
  if (prefix[0] == '/') {
    root_abs = ps_path_abs_normalize_(root);
    cand = ps_path_normalize_(prefix);
    if (root_abs == NULL || cand == NULL) goto nomem;
    if (!ps_path_within_(cand, root_abs)) goto outside;
  } else {
    rootn = ps_path_normalize_(root);
    pn = ps_path_normalize_(prefix);
    if (rootn == NULL || pn == NULL) goto nomem;
    if (strcmp(pn, "..") == 0 || strncmp(pn, "../", 3) == 0) goto outside;
    if (strcmp(pn, ".") == 0) goto is_root;
    char *j = ps_path_join_(rootn, pn);
    if (j == NULL) goto nomem;
    cand = ps_path_normalize_(j);
    free(j);
    root_abs = ps_path_abs_normalize_(root);
    if (cand == NULL || root_abs == NULL) goto nomem;
  }
  cand_abs = ps_path_abs_normalize_(cand);
  if (cand_abs == NULL) goto nomem;
  if (strcmp(cand_abs, root_abs) == 0) goto is_root;
  if ((rc = check_links(prefix, root, root_abs, cand_abs, st)) != 0) goto done;
  if (strlen(cand) >= n) {
    rc =
        ps_status_set(st, PS_INVALID_ARGUMENT,
                      "checkpoint path %s under %s: %zu bytes, more than the %zu allowed",
                      prefix, root, strlen(cand), n ? n - 1 : 0);
    goto done;
  }
  memcpy(resolved, cand, strlen(cand) + 1);
  goto done;
outside:
  rc = ps_status_set(
      st, PS_PERMISSION_DENIED,
      "checkpoint path %s is outside the checkpoint directory %s%s", prefix, root,
      strstr(prefix, "..") ? " (\"..\" escapes the checkpoint directory)" : "");
  goto done;
is_root:
  rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                     "checkpoint path %s names the checkpoint directory %s itself, "
                     "not a checkpoint in it",
                     prefix, root);
  goto done;
nomem:
  rc = ps_ckpt_oom_(st);
done:
  free(rootn);
  free(pn);
  free(cand);
  free(cand_abs);
  free(root_abs);
  return rc;
}
