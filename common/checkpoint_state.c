/* The `checkpoint` state file of a checkpoint directory, as TensorFlow's
 * Saver keeps it: formatting, reading and writing it (parsing is in
 * checkpoint_lexer.c), and latest_checkpoint.  The other files of the
 * directory's code: checkpoint_manager.c (retention), checkpoint_inspect.c
 * (inspect_checkpoint), checkpoint_confine.c (the path guard),
 * checkpoint_util.c (what they share).
 *
 * The state file is the one piece of a checkpoint directory that is
 * rewritten in place, so it is always replaced by rename: a reader (a
 * TensorFlow job restoring, `psctl`, a restarted ps) sees the old file or
 * the new one, never a torn one.
 *
 * The state file's format (CheckpointState in protobuf text format as
 * Python's text_format.MessageToString writes it) is described in
 * CHECKPOINT_FORMAT.md beside this file. */
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

/* ---- State file: encoding ------------------------------------------------ */

/* Python protobuf's text_encoding.CEscape(bytes, as_utf8=False). */
static void put_cescaped(sbuf *b, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '\t':
      ps_sb_puts_(b, "\\t");
      break;
    case '\n':
      ps_sb_puts_(b, "\\n");
      break;
    case '\r':
      ps_sb_puts_(b, "\\r");
      break;
    case '"':
      ps_sb_puts_(b, "\\\"");
      break;
    case '\'':
      ps_sb_puts_(b, "\\'");
      break;
    case '\\':
      ps_sb_puts_(b, "\\\\");
      break;
    default:
      if (*p < 0x20 || *p >= 0x7f) {
        char o[8];
        snprintf(o, sizeof o, "\\%03o", *p);
        ps_sb_puts_(b, o);
      } else {
        ps_sb_putc_(b, (char)*p);
      }
    }
  }
}

static void put_string_field(sbuf *b, const char *name, const char *v) {
  ps_sb_puts_(b, name);
  ps_sb_puts_(b, ": \"");
  put_cescaped(b, v);
  ps_sb_puts_(b, "\"\n");
}

static void put_double_field(sbuf *b, const char *name, double v) {
  ps_sb_puts_(b, name);
  ps_sb_puts_(b, ": ");
  ps_repr_float_(b, v, K_DOUBLE, false);
  ps_sb_putc_(b, '\n');
}

char *ps_ckpt_state_format(const ps_ckpt_state *s, size_t *len, ps_status *st) {
  if (s->num_timestamps != 0 && s->num_timestamps != s->num_paths) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "Checkpoint timestamps, if provided, must match checkpoint paths "
                  "(got %zu paths and %zu timestamps)",
                  s->num_paths, s->num_timestamps);
    return NULL;
  }
  sbuf b = {0};
  ps_sb_puts_(&b, ""); /* "" for an empty state */
  if (s->model_checkpoint_path && s->model_checkpoint_path[0])
    put_string_field(&b, "model_checkpoint_path", s->model_checkpoint_path);
  for (size_t i = 0; i < s->num_paths; i++)
    put_string_field(&b, "all_model_checkpoint_paths", s->all_model_checkpoint_paths[i]);
  for (size_t i = 0; i < s->num_timestamps; i++)
    put_double_field(&b, "all_model_checkpoint_timestamps",
                     s->all_model_checkpoint_timestamps[i]);
  if (s->last_preserved_timestamp != 0)
    put_double_field(&b, "last_preserved_timestamp", s->last_preserved_timestamp);
  if (b.oom) {
    free(b.p);
    ps_ckpt_oom_(st);
    return NULL;
  }
  if (len) *len = b.len;
  return b.p;
}

/* ---- State file: read and write ----------------------------------------- */

/* Reads all of @path (at most 64 MiB) into a malloc'd buffer; with a
 * directory @dirfd (not AT_FDCWD), @name in it, a link not followed. */
static int read_whole_file(int dirfd, const char *name, const char *path,
                           const char *what, uint8_t **out, size_t *n, ps_status *st) {
  *out = NULL;
  *n = 0;
  unsigned type = 0; /* a FIFO would block the read: only regular files */
  char *text;
  int e = ps_read_file(dirfd, dirfd == AT_FDCWD ? path : name,
                       PS_READ_REGULAR | (dirfd != AT_FDCWD ? PS_READ_NOFOLLOW : 0),
                       64u << 20, &text, n, &type, NULL);
  if (e == 0) {
    *out = (uint8_t *)text;
    return 0;
  }
  *n = 0;
  if (type != 0)
    return ps_status_set(st, PS_FAILED_PRECONDITION, "%s %s: is %s, not a regular file",
                         what, path, ps_file_type_name(type));
  if (dirfd != AT_FDCWD && e == ELOOP)
    return ps_status_set(st, PS_PERMISSION_DENIED,
                         "%s %s: %s (a symbolic link: links under the checkpoint "
                         "directory are not followed)",
                         what, path, strerror(e));
  if (e == EFBIG)
    return ps_status_set(st, PS_DATA_LOSS, "%s %s: larger than 64 MiB", what, path);
  if (e == ENOMEM) return ps_ckpt_oom_(st);
  return ps_status_set(st, ps_status_code_from_errno(e), "%s %s: %s", what, path,
                       strerror(e));
}

/* The state file of @dir parsed, paths as written; DATA_LOSS for an empty
 * model_checkpoint_path as TensorFlow's get_checkpoint_state. */
int ps_ckpt_state_read_raw_at_(int dirfd, const char *dir, ps_ckpt_state *s,
                               ps_status *st) {
  memset(s, 0, sizeof *s);
  char *path = ps_path_join_(dir, PS_CKPT_STATE_FILENAME);
  if (path == NULL) return ps_ckpt_oom_(st);
  uint8_t *text;
  size_t n;
  int rc = read_whole_file(dirfd, PS_CKPT_STATE_FILENAME, path, "checkpoint state", &text,
                           &n, st);
  if (rc == 0) {
    rc = ps_ckpt_state_parse(text, n, s, st);
    free(text);
    if (rc != 0) {
      ps_status_prefix(st, "checkpoint state %s", path);
    } else if (s->model_checkpoint_path == NULL || s->model_checkpoint_path[0] == '\0') {
      ps_ckpt_state_free(s);
      rc = ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint state %s: Invalid checkpoint state loaded from %s "
                         "(no model_checkpoint_path)",
                         path, dir);
    }
  }
  free(path);
  return rc;
}

int ps_ckpt_state_read_raw_(const char *dir, ps_ckpt_state *s, ps_status *st) {
  return ps_ckpt_state_read_raw_at_(AT_FDCWD, dir, s, st);
}

int ps_ckpt_state_read(const char *dir, ps_ckpt_state *s, ps_status *st) {
  int rc = ps_ckpt_state_read_raw_(dir, s, st);
  if (rc != 0) return rc;
  char *j = ps_path_join_(dir, s->model_checkpoint_path);
  if (j == NULL) goto nomem;
  free(s->model_checkpoint_path);
  s->model_checkpoint_path = j;
  for (size_t i = 0; i < s->num_paths; i++) {
    j = ps_path_join_(dir, s->all_model_checkpoint_paths[i]);
    if (j == NULL) goto nomem;
    free(s->all_model_checkpoint_paths[i]);
    s->all_model_checkpoint_paths[i] = j;
  }
  return 0;
nomem:
  ps_ckpt_state_free(s);
  return ps_ckpt_oom_(st);
}

int ps_ckpt_state_write(const char *dir, const ps_ckpt_state *s, ps_status *st) {
  return ps_ckpt_state_write_at_(AT_FDCWD, dir, s, st);
}

int ps_ckpt_state_write_at_(int dirfd, const char *dir, const ps_ckpt_state *s,
                            ps_status *st) {
  if (s->model_checkpoint_path == NULL || s->model_checkpoint_path[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint state for %s: empty model_checkpoint_path", dir);
  char *target = ps_path_join_(dir, PS_CKPT_STATE_FILENAME);
  char *model = ps_path_join_(dir, s->model_checkpoint_path);
  char *tk = target ? ps_path_abs_normalize_(target) : NULL;
  char *mk = model ? ps_path_abs_normalize_(model) : NULL;
  char *text = NULL, *tmp_path = NULL;
  ps_status local;
  if (st == NULL) st = &local;
  int rc;
  if (tk == NULL || mk == NULL) {
    rc = ps_ckpt_oom_(st);
    goto done;
  }
  if (strcmp(tk, mk) == 0) {
    rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                       "Save path '%s' conflicts with path used for checkpoint state.  "
                       "Please use a different save path.",
                       s->model_checkpoint_path);
    goto done;
  }
  size_t len;
  text = ps_ckpt_state_format(s, &len, st);
  if (text == NULL) {
    rc = st->code;
    goto done;
  }
  const char *op = NULL;
  int e = dirfd == AT_FDCWD ? ps_replace_file(target, NULL, text, len, &op, &tmp_path)
                            : ps_replace_file_at(dirfd, PS_CKPT_STATE_FILENAME, text, len,
                                                 &op, &tmp_path);
  if (dirfd != AT_FDCWD && tmp_path != NULL) { /* named in its directory */
    char *shown = ps_path_join_(dir, tmp_path);
    free(tmp_path);
    tmp_path = shown;
  }
  if (e != 0 && !strcmp(op, "syncing the directory of")) {
    /* the new file is in place and nothing can undo that: say so only */
    PS_WARN("checkpoint directory %s: fsync: %s", dir, strerror(e));
    e = 0;
  }
  rc = e == 0 ? 0
              : ps_status_set(st, ps_status_code_from_errno(e),
                              "checkpoint state %s: %s %s: %s", target, op,
                              tmp_path ? tmp_path : target, strerror(e));
done:
  free(tmp_path);
  free(text);
  free(tk);
  free(mk);
  free(target);
  free(model);
  return rc;
}

/* ---- latest_checkpoint --------------------------------------------------- */

static bool file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

int ps_latest_checkpoint(const char *dir, char **prefix_out, ps_status *st) {
  *prefix_out = NULL;
  ps_ckpt_state s;
  ps_status rst = {0};
  int rc = ps_ckpt_state_read(dir, &s, &rst);
  if (rc == PS_NOT_FOUND)
    return ps_status_set(st, PS_NOT_FOUND, "no checkpoint in %s (%s)", dir, rst.msg);
  if (rc != 0) {
    if (st) *st = rst;
    return rc;
  }
  char *index = ps_str_cat3_(s.model_checkpoint_path, ".index", "");
  if (index == NULL) {
    ps_ckpt_state_free(&s);
    return ps_ckpt_oom_(st);
  }
  bool ok = file_exists(index);
  free(index);
  if (!ok) {
    rc = ps_status_set(st, PS_NOT_FOUND, "Couldn't match files for checkpoint %s",
                       s.model_checkpoint_path);
    ps_ckpt_state_free(&s);
    return rc;
  }
  *prefix_out = s.model_checkpoint_path;
  s.model_checkpoint_path = NULL;
  ps_ckpt_state_free(&s);
  return 0;
}
