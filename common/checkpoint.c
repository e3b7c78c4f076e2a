/* Checkpoint directories as TensorFlow's Saver keeps them: the `checkpoint`
 * state file, latest_checkpoint, retention, inspect_checkpoint and a path
 * guard.
 *
 * The state file is the one piece of a checkpoint directory that is
 * rewritten in place, so it is always replaced by rename: a reader (a
 * TensorFlow job restoring, `psctl`, a restarted ps) sees the old file or
 * the new one, never a torn one.  Retention writes the new state before it
 * deletes anything, so a crash in between leaves unlisted files behind
 * (harmless) rather than a state naming deleted checkpoints.  The manager
 * persists everything its policy needs in TensorFlow's own fields
 * (timestamps, last_preserved_timestamp), so TensorFlow's CheckpointManager
 * and this code can take turns on one directory.
 *
 * The state file format (CheckpointState, protobuf text format as Python's
 * text_format.MessageToString writes it):
 *
 *   field 1  model_checkpoint_path: "<string>"          omitted if empty
 *   field 2  all_model_checkpoint_paths: "<string>"     one line per path
 *   field 3  all_model_checkpoint_timestamps: <double>  one line per path
 *   field 4  last_preserved_timestamp: <double>         omitted if 0
 *
 * one "name: value\n" line per value, in field-number order.  Strings are
 * double-quoted with Python's CEscape: \n \r \t \" \' \\ and every other
 * byte below 0x20 or above 0x7e as a three-digit octal escape (UTF-8 is
 * therefore escaped byte by byte).  Doubles are Python's repr(): the
 * shortest digits that read back exactly, positional with at least one
 * decimal ("1672531200.0") when the decimal exponent is in [-4, 16),
 * otherwise "1e+16", "1.5e-05"; "inf", "-inf", "nan".  Readers accept the
 * whole text format (see ps_ckpt_state_parse).  Relative paths are relative
 * to the directory holding the state file. */
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

#include "common/bundle.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/tensor.h"

/* ---- Small helpers ------------------------------------------------------- */


/* A growable string; on allocation failure it stays NULL-terminated and
 * remembers the failure. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s) {
  sb_putn(b, s, strlen(s));
}
static void sb_putc(sbuf *b, char c) {
  sb_putn(b, &c, 1);
}

static char *str_cat3(const char *a, const char *b, const char *c) {
  size_t na = strlen(a), nb = strlen(b), nc = strlen(c);
  char *p = malloc(na + nb + nc + 1);
  if (p == NULL) return NULL;
  memcpy(p, a, na);
  memcpy(p + na, b, nb);
  memcpy(p + na + nb, c, nc + 1);
  return p;
}

static int oom(ps_status *st) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
}

/* ---- Paths --------------------------------------------------------------- */

/* os.path.join(dir, p) for one component list: an absolute @p wins. */
static char *path_join(const char *dir, const char *p) {
  size_t dl = strlen(dir);
  if (p[0] == '/' || dl == 0) return strdup(p);
  return str_cat3(dir, dir[dl - 1] == '/' ? "" : "/", p);
}

/* Lexical normalization: no "//", no "." components, ".." cancels the
 * component before it ("/.." is "/"; a relative path keeps its leading
 * ".."s).  "" and "." give ".". */
static char *path_normalize(const char *path) {
  size_t n = strlen(path);
  bool abs = path[0] == '/';
  char *out = malloc(n + 2);
  if (out == NULL) return NULL;
  size_t o = 0, fixed = 0; /* out[0..fixed): the root "/" or leading ".."s */
  if (abs) out[o++] = '/', fixed = 1;
  size_t i = 0;
  while (i < n) {
    while (i < n && path[i] == '/')
      i++;
    size_t s = i;
    while (i < n && path[i] != '/')
      i++;
    size_t len = i - s;
    if (len == 0 || (len == 1 && path[s] == '.')) continue;
    if (len == 2 && path[s] == '.' && path[s + 1] == '.') {
      if (o > fixed) { /* drop the last component and its separator */
        while (o > fixed && out[o - 1] != '/')
          o--;
        if (o > fixed) o--;
      } else if (!abs) { /* a leading ".." stays */
        if (o > 0) out[o++] = '/';
        out[o++] = '.', out[o++] = '.';
        fixed = o;
      }
      continue;
    }
    if (o > 0 && out[o - 1] != '/') out[o++] = '/';
    memcpy(out + o, path + s, len);
    o += len;
  }
  if (o == 0) out[o++] = '.';
  out[o] = '\0';
  return out;
}

/* path_normalize of the absolute form of @path (relative to the working
 * directory); the relative form if the working directory is unknown. */
static char *path_abs_normalize(const char *path) {
  if (path[0] == '/') return path_normalize(path);
  char cwd[4096];
  if (getcwd(cwd, sizeof cwd) == NULL) return path_normalize(path);
  char *j = path_join(cwd, path);
  if (j == NULL) return NULL;
  char *r = path_normalize(j);
  free(j);
  return r;
}

/* Whether normalized @p is @dir or below it (both normalized, same kind). */
static bool path_within(const char *p, const char *dir) {
  if (strcmp(dir, "/") == 0) return p[0] == '/';
  if (strcmp(dir, ".") == 0) return p[0] != '/' && strncmp(p, "..", 2) != 0;
  size_t dl = strlen(dir);
  return strncmp(p, dir, dl) == 0 && (p[dl] == '\0' || p[dl] == '/');
}

/* ---- Python's repr() of floats ------------------------------------------- */

enum { K_DOUBLE, K_FLOAT, K_HALF, K_BF16 };

static bool reads_back(const char *s, double v, int kind) {
  switch (kind) {
  case K_DOUBLE:
    return strtod(s, NULL) == v;
  case K_FLOAT:
    return strtof(s, NULL) == (float)v;
  case K_HALF:
    return ps_float_to_half(strtof(s, NULL)) == ps_float_to_half((float)v);
  default:
    return ps_float_to_bf16(strtof(s, NULL)) == ps_float_to_bf16((float)v);
  }
}

/* repr() of @v as a value of @kind: the shortest decimal digits that read
 * back to it, laid out as Python's float_repr_style 'short'.  With
 * @strip_zero, "2.0" becomes "2" (complex parts). */
static void repr_float(sbuf *b, double v, int kind, bool strip_zero) {
  if (isnan(v)) {
    sb_puts(b, "nan");
    return;
  }
  if (isinf(v)) {
    sb_puts(b, v < 0 ? "-inf" : "inf");
    return;
  }
  if (v == 0) {
    sb_puts(b, signbit(v) ? "-0" : "0");
    if (!strip_zero) sb_puts(b, ".0");
    return;
  }
  char e[64];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(e, sizeof e, "%.*e", prec - 1, v);
    if (reads_back(e, v, kind)) break;
  }
  /* e = "[-]d[.ddd]e(+|-)XX" */
  const char *q = e;
  bool neg = *q == '-';
  if (neg) q++;
  char dg[24];
  int nd = 0;
  for (; *q != 'e'; q++)
    if (*q != '.' && nd < (int)sizeof dg - 1) dg[nd++] = *q;
  while (nd > 1 && dg[nd - 1] == '0')
    nd--;
  dg[nd] = '\0';
  int decpt = atoi(q + 1) + 1; /* v = 0.DIGITS * 10^decpt */
  if (neg) sb_putc(b, '-');
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      sb_puts(b, "0.");
      for (int i = 0; i < -decpt; i++)
        sb_putc(b, '0');
      sb_puts(b, dg);
    } else if (decpt >= nd) {
      sb_puts(b, dg);
      for (int i = nd; i < decpt; i++)
        sb_putc(b, '0');
      if (!strip_zero) sb_puts(b, ".0");
    } else {
      sb_putn(b, dg, (size_t)decpt);
      sb_putc(b, '.');
      sb_puts(b, dg + decpt);
    }
  } else {
    sb_putc(b, dg[0]);
    if (nd > 1) {
      sb_putc(b, '.');
      sb_puts(b, dg + 1);
    }
    char x[16];
    snprintf(x, sizeof x, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    sb_puts(b, x);
  }
}

/* ---- State file: encoding ------------------------------------------------ */

/* Python protobuf's text_encoding.CEscape(bytes, as_utf8=False). */
static void put_cescaped(sbuf *b, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '\t':
      sb_puts(b, "\\t");
      break;
    case '\n':
      sb_puts(b, "\\n");
      break;
    case '\r':
      sb_puts(b, "\\r");
      break;
    case '"':
      sb_puts(b, "\\\"");
      break;
    case '\'':
      sb_puts(b, "\\'");
      break;
    case '\\':
      sb_puts(b, "\\\\");
      break;
    default:
      if (*p < 0x20 || *p >= 0x7f) {
        char o[8];
        snprintf(o, sizeof o, "\\%03o", *p);
        sb_puts(b, o);
      } else {
        sb_putc(b, (char)*p);
      }
    }
  }
}

static void put_string_field(sbuf *b, const char *name, const char *v) {
  sb_puts(b, name);
  sb_puts(b, ": \"");
  put_cescaped(b, v);
  sb_puts(b, "\"\n");
}

static void put_double_field(sbuf *b, const char *name, double v) {
  sb_puts(b, name);
  sb_puts(b, ": ");
  repr_float(b, v, K_DOUBLE, false);
  sb_putc(b, '\n');
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
  sb_puts(&b, ""); /* "" for an empty state */
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
    oom(st);
    return NULL;
  }
  if (len) *len = b.len;
  return b.p;
}

/* ---- State file: decoding ------------------------------------------------ */

/* The text format as Python's tokenizer splits it: whitespace and '#'
 * comments between tokens; identifiers [A-Za-z_][A-Za-z0-9_+-]*; numbers
 * and signed words ([0-9+-.][0-9A-Za-z_.+-]*); quoted strings that end on
 * their line; single punctuation characters. */
typedef struct lexer {
  const uint8_t *p;
  size_t n, i;
  int line;
  ps_status *st;
} lexer;

static int lex_error(lexer *lx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int lex_error(lexer *lx, const char *fmt, ...) {
  char m[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  return ps_status_set(lx->st, PS_DATA_LOSS, "line %d: %s", lx->line, m);
}

static void lex_skip(lexer *lx) {
  while (lx->i < lx->n) {
    uint8_t c = lx->p[lx->i];
    if (c == '#') {
      while (lx->i < lx->n && lx->p[lx->i] != '\n')
        lx->i++;
    } else if (c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f' ||
               c == '\n') {
      if (c == '\n') lx->line++;
      lx->i++;
    } else {
      break;
    }
  }
}

static bool lex_peek(lexer *lx, char c) {
  return lx->i < lx->n && lx->p[lx->i] == (uint8_t)c;
}

static bool is_word(uint8_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         c == '_' || c == '.' || c == '+' || c == '-';
}

/* The next token's text for messages: a word, or the character. */
static const char *lex_token_text(lexer *lx, char *buf, size_t n) {
  if (lx->i >= lx->n) return "end of file";
  size_t j = lx->i, k = 0;
  while (j < lx->n && is_word(lx->p[j]) && k + 1 < n)
    buf[k++] = (char)lx->p[j++];
  if (k == 0) buf[k++] = (char)lx->p[j];
  buf[k] = '\0';
  return buf;
}

static int hexval(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static void put_utf8(sbuf *b, uint32_t cp) {
  char u[4];
  if (cp < 0x80) {
    sb_putc(b, (char)cp);
  } else if (cp < 0x800) {
    u[0] = (char)(0xc0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3f));
    sb_putn(b, u, 2);
  } else if (cp < 0x10000) {
    u[0] = (char)(0xe0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 0x3f));
    u[2] = (char)(0x80 | (cp & 0x3f));
    sb_putn(b, u, 3);
  } else {
    u[0] = (char)(0xf0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    u[2] = (char)(0x80 | (cp >> 6 & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f));
    sb_putn(b, u, 4);
  }
}

/* One quoted string (the lexer is on its quote), unescaped into @b. */
static int lex_one_string(lexer *lx, sbuf *b) {
  uint8_t q = lx->p[lx->i++];
  for (;;) {
    if (lx->i >= lx->n || lx->p[lx->i] == '\n')
      return lex_error(lx, "unterminated string");
    uint8_t c = lx->p[lx->i++];
    if (c == q) return 0;
    if (c != '\\') {
      sb_putc(b, (char)c);
      continue;
    }
    if (lx->i >= lx->n || lx->p[lx->i] == '\n')
      return lex_error(lx, "unterminated string");
    c = lx->p[lx->i++];
    switch (c) {
    case 'a':
      sb_putc(b, '\a');
      break;
    case 'b':
      sb_putc(b, '\b');
      break;
    case 'f':
      sb_putc(b, '\f');
      break;
    case 'n':
      sb_putc(b, '\n');
      break;
    case 'r':
      sb_putc(b, '\r');
      break;
    case 't':
      sb_putc(b, '\t');
      break;
    case 'v':
      sb_putc(b, '\v');
      break;
    case '\\':
    case '\'':
    case '"':
      sb_putc(b, (char)c);
      break;
    case 'x': {
      int v = 0, k = 0;
      while (k < 2 && lx->i < lx->n && hexval(lx->p[lx->i]) >= 0)
        v = v * 16 + hexval(lx->p[lx->i++]), k++;
      if (k == 0) return lex_error(lx, "invalid \\x escape in string");
      sb_putc(b, (char)v);
      break;
    }
    case 'u':
    case 'U': {
      int want = c == 'u' ? 4 : 8;
      uint32_t v = 0;
      for (int k = 0; k < want; k++) {
        if (lx->i >= lx->n || hexval(lx->p[lx->i]) < 0)
          return lex_error(lx, "invalid \\%c escape in string", c);
        v = v * 16 + (uint32_t)hexval(lx->p[lx->i++]);
      }
      if (v > 0x10ffff) return lex_error(lx, "invalid \\%c escape in string", c);
      put_utf8(b, v);
      break;
    }
    default:
      if (c >= '0' && c <= '7') {
        int v = c - '0', k = 1;
        while (k < 3 && lx->i < lx->n && lx->p[lx->i] >= '0' && lx->p[lx->i] <= '7')
          v = v * 8 + (lx->p[lx->i++] - '0'), k++;
        if (v > 255) return lex_error(lx, "octal escape \\%o out of range in string", v);
        sb_putc(b, (char)v);
      } else { /* Python keeps an unknown escape as written */
        sb_putc(b, '\\');
        sb_putc(b, (char)c);
      }
    }
  }
}

/* A string value: one or more adjacent quoted strings.  Malloc'd. */
static int lex_string(lexer *lx, const char *field, char **out) {
  *out = NULL;
  if (!lex_peek(lx, '"') && !lex_peek(lx, '\'')) {
    char t[64];
    return lex_error(lx, "expected a string for field %s, found '%s'", field,
                     lex_token_text(lx, t, sizeof t));
  }
  sbuf b = {0};
  sb_puts(&b, "");
  do {
    size_t start = b.len;
    int rc = lex_one_string(lx, &b);
    /* checked per piece, before lex_skip moves on: the error names the
     * line of the string that holds the NUL */
    if (rc == 0 && !b.oom && memchr(b.p + start, '\0', b.len - start) != NULL)
      rc = lex_error(lx, "NUL byte in %s", field);
    if (rc != 0) {
      free(b.p);
      return rc;
    }
    lex_skip(lx);
  } while (lex_peek(lx, '"') || lex_peek(lx, '\''));
  if (b.oom) {
    free(b.p);
    return oom(lx->st);
  }
  *out = b.p;
  return 0;
}

/* A double value: Python's float() syntax plus inf/infinity/nan spellings
 * and a trailing 'f'. */
static int lex_double(lexer *lx, const char *field, double *out) {
  char t[128];
  size_t k = 0;
  while (lx->i < lx->n && is_word(lx->p[lx->i])) {
    if (k + 1 >= sizeof t) return lex_error(lx, "number too long for field %s", field);
    t[k++] = (char)lx->p[lx->i++];
  }
  t[k] = '\0';
  if (k == 0) {
    char m[64];
    return lex_error(lx, "expected a number for field %s, found '%s'", field,
                     lex_token_text(lx, m, sizeof m));
  }
  bool ok = strpbrk(t, "xXpP") == NULL; /* no hex floats */
  if (ok) {
    char *end;
    errno = 0;
    *out = strtod(t, &end);
    if (end != t && (end[0] == 'f' || end[0] == 'F') && end[1] == '\0') end++;
    ok = *end == '\0';
  }
  if (!ok) return lex_error(lx, "couldn't parse number '%s' for field %s", t, field);
  return 0;
}

enum { F_MODEL = 1, F_PATHS, F_TIMESTAMPS, F_PRESERVED };

static const struct {
  const char *name;
  int field;
} state_fields[] = {
    {"model_checkpoint_path", F_MODEL},
    {"all_model_checkpoint_paths", F_PATHS},
    {"all_model_checkpoint_timestamps", F_TIMESTAMPS},
    {"last_preserved_timestamp", F_PRESERVED},
};

static int state_add_path(ps_ckpt_state *s, char *p) {
  char **a = realloc(s->all_model_checkpoint_paths, (s->num_paths + 1) * sizeof *a);
  if (a == NULL) return -1;
  s->all_model_checkpoint_paths = a;
  a[s->num_paths++] = p;
  return 0;
}

static int state_add_timestamp(ps_ckpt_state *s, double v) {
  double *a =
      realloc(s->all_model_checkpoint_timestamps, (s->num_timestamps + 1) * sizeof *a);
  if (a == NULL) return -1;
  s->all_model_checkpoint_timestamps = a;
  a[s->num_timestamps++] = v;
  return 0;
}

/* One value of @field into @s. */
static int parse_value(lexer *lx, int field, const char *name, ps_ckpt_state *s) {
  if (field == F_MODEL || field == F_PATHS) {
    char *v;
    int rc = lex_string(lx, name, &v);
    if (rc != 0) return rc;
    if (field == F_MODEL) {
      free(s->model_checkpoint_path);
      s->model_checkpoint_path = v;
    } else if (state_add_path(s, v) != 0) {
      free(v);
      return oom(lx->st);
    }
    return 0;
  }
  double v = 0;
  int rc = lex_double(lx, name, &v);
  if (rc != 0) return rc;
  if (field == F_PRESERVED)
    s->last_preserved_timestamp = v;
  else if (state_add_timestamp(s, v) != 0)
    return oom(lx->st);
  return 0;
}

int ps_ckpt_state_parse(const uint8_t *p, size_t n, ps_ckpt_state *s, ps_status *st) {
  memset(s, 0, sizeof *s);
  lexer lx = {.p = p, .n = n, .line = 1, .st = st};
  int rc = 0;
  for (;;) {
    lex_skip(&lx);
    if (lx.i >= lx.n) break;
    char name[128], t[64];
    size_t k = 0;
    uint8_t c = lx.p[lx.i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')) {
      rc = lex_error(&lx, "expected a field name, found '%s'",
                     lex_token_text(&lx, t, sizeof t));
      goto fail;
    }
    while (lx.i < lx.n && is_word(lx.p[lx.i]) && lx.p[lx.i] != '.') {
      if (k + 1 < sizeof name) name[k++] = (char)lx.p[lx.i];
      lx.i++;
    }
    name[k] = '\0';
    int field = 0;
    for (size_t i = 0; i < sizeof state_fields / sizeof state_fields[0]; i++)
      if (strcmp(name, state_fields[i].name) == 0) field = state_fields[i].field;
    if (field == 0) {
      rc = lex_error(
          &lx, "message type \"tensorflow.CheckpointState\" has no field named \"%s\"",
          name);
      goto fail;
    }
    lex_skip(&lx);
    if (!lex_peek(&lx, ':')) {
      rc = lex_error(&lx, "expected ':' after %s, found '%s'", name,
                     lex_token_text(&lx, t, sizeof t));
      goto fail;
    }
    lx.i++;
    lex_skip(&lx);
    bool repeated = field == F_PATHS || field == F_TIMESTAMPS;
    if (repeated && lex_peek(&lx, '[')) { /* field: [v, v, ...] */
      lx.i++;
      lex_skip(&lx);
      if (lex_peek(&lx, ']')) {
        lx.i++;
      } else {
        for (;;) {
          if ((rc = parse_value(&lx, field, name, s)) != 0) goto fail;
          lex_skip(&lx);
          if (lex_peek(&lx, ']')) {
            lx.i++;
            break;
          }
          if (!lex_peek(&lx, ',')) {
            rc = lex_error(&lx, "expected ',' or ']' in the list of %s, found '%s'", name,
                           lex_token_text(&lx, t, sizeof t));
            goto fail;
          }
          lx.i++;
          lex_skip(&lx);
        }
      }
    } else if ((rc = parse_value(&lx, field, name, s)) != 0) {
      goto fail;
    }
    lex_skip(&lx);
    if (lex_peek(&lx, ',') || lex_peek(&lx, ';')) lx.i++;
  }
  return 0;
fail:
  ps_ckpt_state_free(s);
  return rc;
}

void ps_ckpt_state_free(ps_ckpt_state *s) {
  if (s == NULL) return;
  free(s->model_checkpoint_path);
  for (size_t i = 0; i < s->num_paths; i++)
    free(s->all_model_checkpoint_paths[i]);
  free(s->all_model_checkpoint_paths);
  free(s->all_model_checkpoint_timestamps);
  memset(s, 0, sizeof *s);
}

/* ---- State file: read and write ----------------------------------------- */

/* Reads all of @path (at most 64 MiB) into a malloc'd buffer. */
static int read_whole_file(const char *path, const char *what, uint8_t **out, size_t *n,
                           ps_status *st) {
  *out = NULL;
  *n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ps_status_set(st, ps_status_code_from_errno(errno), "%s %s: %s", what, path, strerror(errno));
  sbuf b = {0};
  sb_puts(&b, "");
  char chunk[8192];
  for (;;) {
    ssize_t r = read(fd, chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      free(b.p);
      return ps_status_set(st, ps_status_code_from_errno(e), "%s %s: %s", what, path, strerror(e));
    }
    if (r == 0) break;
    sb_putn(&b, chunk, (size_t)r);
    if (b.len > (64u << 20)) {
      close(fd);
      free(b.p);
      return ps_status_set(st, PS_DATA_LOSS, "%s %s: larger than 64 MiB", what, path);
    }
  }
  close(fd);
  if (b.oom) {
    free(b.p);
    return oom(st);
  }
  *out = (uint8_t *)b.p;
  *n = b.len;
  return 0;
}

/* The state file of @dir parsed, paths as written; DATA_LOSS for an empty
 * model_checkpoint_path as TensorFlow's get_checkpoint_state. */
static int state_read_raw(const char *dir, ps_ckpt_state *s, ps_status *st) {
  memset(s, 0, sizeof *s);
  char *path = path_join(dir, PS_CKPT_STATE_FILENAME);
  if (path == NULL) return oom(st);
  uint8_t *text;
  size_t n;
  int rc = read_whole_file(path, "checkpoint state", &text, &n, st);
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

int ps_ckpt_state_read(const char *dir, ps_ckpt_state *s, ps_status *st) {
  int rc = state_read_raw(dir, s, st);
  if (rc != 0) return rc;
  char *j = path_join(dir, s->model_checkpoint_path);
  if (j == NULL) goto nomem;
  free(s->model_checkpoint_path);
  s->model_checkpoint_path = j;
  for (size_t i = 0; i < s->num_paths; i++) {
    j = path_join(dir, s->all_model_checkpoint_paths[i]);
    if (j == NULL) goto nomem;
    free(s->all_model_checkpoint_paths[i]);
    s->all_model_checkpoint_paths[i] = j;
  }
  return 0;
nomem:
  ps_ckpt_state_free(s);
  return oom(st);
}

int ps_ckpt_state_write(const char *dir, const ps_ckpt_state *s, ps_status *st) {
  if (s->model_checkpoint_path == NULL || s->model_checkpoint_path[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint state for %s: empty model_checkpoint_path", dir);
  char *target = path_join(dir, PS_CKPT_STATE_FILENAME);
  char *model = path_join(dir, s->model_checkpoint_path);
  char *tk = target ? path_abs_normalize(target) : NULL;
  char *mk = model ? path_abs_normalize(model) : NULL;
  char *text = NULL, *tmp_path = NULL;
  ps_status local;
  if (st == NULL) st = &local;
  int rc;
  if (tk == NULL || mk == NULL) {
    rc = oom(st);
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
  int e = ps_replace_file(target, NULL, text, len, &op, &tmp_path);
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
  char *index = str_cat3(s.model_checkpoint_path, ".index", "");
  if (index == NULL) {
    ps_ckpt_state_free(&s);
    return oom(st);
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

static void remove_one(const char *path, int *rc, ps_status *st) {
  if (unlink(path) == 0 || errno == ENOENT) return;
  int e = errno;
  if (*rc == 0)
    *rc = ps_status_set(st, ps_status_code_from_errno(e), "deleting %s: %s", path, strerror(e));
}

int ps_ckpt_remove(const char *prefix, ps_status *st) {
  int rc = 0;
  const char *slash = strrchr(prefix, '/');
  const char *base = slash ? slash + 1 : prefix;
  char *index = str_cat3(prefix, ".index", "");
  char *meta = str_cat3(prefix, ".meta", "");
  char *dname = slash ? strndup(prefix, slash == prefix ? 1 : (size_t)(slash - prefix))
                      : strdup(".");
  if (index == NULL || meta == NULL || dname == NULL) {
    rc = oom(st);
    goto done;
  }
  remove_one(index, &rc, st);
  DIR *d = opendir(dname);
  if (d == NULL) {
    if (errno != ENOENT && rc == 0)
      rc = ps_status_set(st, ps_status_code_from_errno(errno), "deleting checkpoint %s: listing %s: %s",
                         prefix, dname, strerror(errno));
  } else {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (!is_data_file(e->d_name, base)) continue;
      char *p = path_join(dname, e->d_name);
      if (p == NULL) {
        if (rc == 0) rc = oom(st);
        continue;
      }
      remove_one(p, &rc, st);
      free(p);
    }
    closedir(d);
  }
  remove_one(meta, &rc, st);
done:
  free(index);
  free(meta);
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
  x->full = x->raw ? path_join(dir, raw) : NULL;
  x->key = x->full ? path_abs_normalize(x->full) : NULL;
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

/* When a recovered checkpoint was saved, for state files without
 * timestamps: the mtime of its index (TF1's recover_last_checkpoints). */
static double index_mtime(const char *full, double fallback) {
  char *index = str_cat3(full, ".index", "");
  struct stat sb;
  double t = fallback;
  if (index && stat(index, &sb) == 0)
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
  int rc = state_read_raw(dir, &s, &rst);
  if (rc == PS_DATA_LOSS) {
    PS_WARN("%s; starting a new checkpoint state for %s", rst.msg, dir);
  } else if (rc != 0 && rc != PS_NOT_FOUND) {
    if (st) *st = rst;
    return NULL;
  }
  if (rc != 0) memset(&s, 0, sizeof s);

  ps_ckpt_manager *m = calloc(1, sizeof *m);
  if (m == NULL) goto nomem;
  m->max_to_keep = opt->max_to_keep;
  m->period = opt->keep_checkpoint_every_n_hours > 0
                  ? opt->keep_checkpoint_every_n_hours * 3600.0
                  : 0;
  m->dir = strdup(dir);
  m->dirkey = path_abs_normalize(dir);
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
    x->ts = have_ts ? s.all_model_checkpoint_timestamps[i] : index_mtime(x->full, now);
    if (!(x->ts <= now)) x->ts = now;
    mentry *dropped;
    entries_push(m->e, &m->n, x, &dropped);
    mentry_free(dropped);
  }
  if (s.model_checkpoint_path &&
      (m->latest = path_join(dir, s.model_checkpoint_path)) == NULL)
    goto nomem;
  ps_ckpt_state_free(&s);
  return m;
nomem:
  ps_ckpt_state_free(&s);
  ps_ckpt_manager_destroy(m);
  oom(st);
  return NULL;
}

int ps_ckpt_manager_add(ps_ckpt_manager *m, const char *prefix, double now,
                        ps_status *st) {
  if (prefix == NULL || prefix[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint manager for %s: empty prefix", m->dir);
  if (isnan(now))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint manager for %s: time is NaN", m->dir);
  int rc = 0;
  mentry *x = NULL, **next = NULL, **evicted = NULL;
  char *pkey = path_abs_normalize(prefix);
  if (pkey == NULL) return oom(st);
  char *slash = strrchr(pkey, '/');
  const char *base = slash ? slash + 1 : pkey;
  bool in_dir = false;
  if (slash && base[0] != '\0' && strcmp(base, "..") != 0) {
    *slash = '\0';
    in_dir = strcmp(pkey[0] ? pkey : "/", m->dirkey) == 0;
  }
  if (!in_dir) {
    rc =
        ps_status_set(st, PS_INVALID_ARGUMENT,
                      "checkpoint %s is not in the managed directory %s", prefix, m->dir);
    goto done;
  }
  x = mentry_new(m->dir, base, now);
  next = calloc(m->n + 1, sizeof *next);
  evicted = calloc(m->n + 1, sizeof *evicted);
  if (x == NULL || next == NULL || evicted == NULL) {
    rc = oom(st);
    goto done;
  }
  size_t nn = m->n, ne = 0;
  memcpy(next, m->e, m->n * sizeof *next);
  mentry *resaved;
  entries_push(next, &nn, x, &resaved);
  double lp = m->last_preserved;
  size_t first = 0; /* next[first..nn) stay listed */
  if (m->max_to_keep == 0) {
    first = nn - 1; /* every file kept, only the latest listed */
  } else {
    while (nn - first > (size_t)m->max_to_keep) {
      mentry *old = next[first++];
      if (m->period > 0 && old->ts >= lp + m->period)
        lp = old->ts; /* preserved: stays on disk, no longer listed */
      else
        evicted[ne++] = old;
    }
  }

  size_t nk = nn - first;
  char **paths = calloc(nk, sizeof *paths);
  double *ts = calloc(nk, sizeof *ts);
  if (paths == NULL || ts == NULL) {
    free(paths);
    free(ts);
    rc = oom(st);
    goto done;
  }
  for (size_t i = 0; i < nk; i++) {
    paths[i] = next[first + i]->raw;
    ts[i] = next[first + i]->ts;
  }
  ps_ckpt_state s = {
      .model_checkpoint_path = x->raw,
      .num_paths = nk,
      .all_model_checkpoint_paths = paths,
      .num_timestamps = nk,
      .all_model_checkpoint_timestamps = ts,
      .last_preserved_timestamp = lp,
  };
  rc = ps_ckpt_state_write(m->dir, &s, st);
  free(paths);
  free(ts);
  if (rc != 0) goto done;

  /* Committed: the state on disk lists next[first..nn). */
  char *latest = strdup(x->full);
  if (latest == NULL) {
    rc = oom(st);
    goto done;
  }
  free(m->latest);
  m->latest = latest;
  m->last_preserved = lp;
  mentry_free(resaved);
  for (size_t i = 0; i < first; i++) {
    bool is_evicted = false;
    for (size_t j = 0; j < ne; j++)
      is_evicted |= evicted[j] == next[i];
    if (is_evicted) {
      /* A state file may list any path (it is a text file anyone can
       * edit): only files inside the managed directory are deleted. */
      ps_status dst = {0};
      char conf[4096];
      if (ps_ckpt_path_confined(m->dir, next[i]->full, conf, sizeof conf, &dst) != 0)
        PS_WARN("checkpoint %s not deleted: %s", next[i]->full, dst.msg);
      else if (ps_ckpt_remove(conf, &dst) != 0)
        PS_WARN("checkpoint %s not fully deleted: %s", next[i]->full, dst.msg);
    }
    mentry_free(next[i]);
  }
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

/* ---- inspect_checkpoint --------------------------------------------------- */

/* TensorFlow's DataType names the ps has no tensors for. */
static const char *dtype_name(int dtype, char *buf, size_t n) {
  static const struct {
    int dtype;
    const char *name;
  } extra[] = {
      {11, "DT_QINT8"},   {12, "DT_QUINT8"},      {13, "DT_QINT32"},
      {15, "DT_QINT16"},  {16, "DT_QUINT16"},     {20, "DT_RESOURCE"},
      {21, "DT_VARIANT"}, {24, "DT_FLOAT8_E5M2"}, {25, "DT_FLOAT8_E4M3FN"},
      {29, "DT_INT4"},    {30, "DT_UINT4"},
  };
  if (dtype == PS_DT_INVALID || strcmp(ps_dtype_enum_name(dtype), "DT_INVALID") != 0)
    return ps_dtype_enum_name(dtype);
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
    if (extra[i].dtype == dtype) return extra[i].name;
  snprintf(buf, n, "DT_UNKNOWN_%d", dtype);
  return buf;
}

/* Python's repr() of bytes. */
static void put_bytes_repr(sbuf *b, const char *s, size_t n) {
  bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
  char q = sq && !dq ? '"' : '\'';
  sb_putc(b, 'b');
  sb_putc(b, q);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == (unsigned char)q || c == '\\') {
      sb_putc(b, '\\');
      sb_putc(b, (char)c);
    } else if (c == '\t') {
      sb_puts(b, "\\t");
    } else if (c == '\n') {
      sb_puts(b, "\\n");
    } else if (c == '\r') {
      sb_puts(b, "\\r");
    } else if (c < 0x20 || c >= 0x7f) {
      char x[8];
      snprintf(x, sizeof x, "\\x%02x", c);
      sb_puts(b, x);
    } else {
      sb_putc(b, (char)c);
    }
  }
  sb_putc(b, q);
}

/* Element @i of a tensor's values, as numpy's str() shows it. */
static void put_element(sbuf *b, int dtype, const void *data,
                        const ps_bundle_strings *strs, int64_t i) {
  char t[48];
  const uint8_t *p = data;
  switch (dtype) {
  case PS_DT_FLOAT: {
    float v;
    memcpy(&v, p + 4 * i, 4);
    repr_float(b, v, K_FLOAT, false);
    return;
  }
  case PS_DT_DOUBLE: {
    double v;
    memcpy(&v, p + 8 * i, 8);
    repr_float(b, v, K_DOUBLE, false);
    return;
  }
  case PS_DT_HALF:
  case PS_DT_BFLOAT16: {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    if (dtype == PS_DT_HALF)
      repr_float(b, ps_half_to_float(h), K_HALF, false);
    else
      repr_float(b, ps_bf16_to_float(h), K_BF16, false);
    return;
  }
  case PS_DT_COMPLEX64:
  case PS_DT_COMPLEX128: {
    double re, im;
    if (dtype == PS_DT_COMPLEX64) {
      float f[2];
      memcpy(f, p + 8 * i, 8);
      re = f[0], im = f[1];
    } else {
      memcpy(&re, p + 16 * i, 8);
      memcpy(&im, p + 16 * i + 8, 8);
    }
    int kind = dtype == PS_DT_COMPLEX64 ? K_FLOAT : K_DOUBLE;
    sb_putc(b, '(');
    repr_float(b, re, kind, true);
    if (!(signbit(im) && !isnan(im))) sb_putc(b, '+');
    repr_float(b, im, kind, true);
    sb_puts(b, "j)");
    return;
  }
  case PS_DT_BOOL:
    sb_puts(b, p[i] ? "True" : "False");
    return;
  case PS_DT_STRING:
    put_bytes_repr(b, strs->str[i], strs->len[i]);
    return;
  default:
    break;
  }
  int64_t sv = 0;
  uint64_t uv = 0;
  bool is_signed = true;
  switch (dtype) {
  case PS_DT_INT8: {
    int8_t v;
    memcpy(&v, p + i, 1);
    sv = v;
    break;
  }
  case PS_DT_INT16: {
    int16_t v;
    memcpy(&v, p + 2 * i, 2);
    sv = v;
    break;
  }
  case PS_DT_INT32: {
    int32_t v;
    memcpy(&v, p + 4 * i, 4);
    sv = v;
    break;
  }
  case PS_DT_INT64: {
    memcpy(&sv, p + 8 * i, 8);
    break;
  }
  case PS_DT_UINT8: {
    uv = p[i];
    is_signed = false;
    break;
  }
  case PS_DT_UINT16: {
    uint16_t v;
    memcpy(&v, p + 2 * i, 2);
    uv = v;
    is_signed = false;
    break;
  }
  case PS_DT_UINT32: {
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    uv = v;
    is_signed = false;
    break;
  }
  case PS_DT_UINT64: {
    memcpy(&uv, p + 8 * i, 8);
    is_signed = false;
    break;
  }
  default:
    sb_puts(b, "?");
    return;
  }
  if (is_signed)
    snprintf(t, sizeof t, "%" PRId64, sv);
  else
    snprintf(t, sizeof t, "%" PRIu64, uv);
  sb_puts(b, t);
}

#define SUMMARY_THRESHOLD 1000 /* numpy's print threshold and edgeitems */
#define EDGE_ITEMS 3

typedef struct printer {
  sbuf *b;
  int dtype;
  const void *data;
  const ps_bundle_strings *strs;
  const ps_shape *shape;
  int64_t stride[PS_MAX_RANK];
  bool summarize;
} printer;

/* Between items of @axis: a space in the innermost dimension, else one
 * newline per enclosed dimension and an indent of axis+1. */
static void put_separator(printer *pr, int axis) {
  int rank = pr->shape->rank;
  if (axis == rank - 1) {
    sb_putc(pr->b, ' ');
    return;
  }
  for (int i = 0; i < rank - 1 - axis; i++)
    sb_putc(pr->b, '\n');
  for (int i = 0; i <= axis; i++)
    sb_putc(pr->b, ' ');
}

static void put_axis(printer *pr, int axis, int64_t off) {
  if (axis == pr->shape->rank) {
    put_element(pr->b, pr->dtype, pr->data, pr->strs, off);
    return;
  }
  int64_t d = pr->shape->dim[axis];
  bool skip = pr->summarize && d > 2 * EDGE_ITEMS;
  sb_putc(pr->b, '[');
  for (int64_t i = 0; i < d; i++) {
    if (skip && i == EDGE_ITEMS) {
      put_separator(pr, axis);
      sb_puts(pr->b, "...");
      i = d - EDGE_ITEMS;
    }
    if (i > 0) put_separator(pr, axis);
    put_axis(pr, axis + 1, off + i * pr->stride[axis]);
  }
  sb_putc(pr->b, ']');
}

static int put_values(sbuf *b, ps_bundle_reader *r, const ps_bundle_entry *e,
                      ps_status *st) {
  ps_tensor *t = NULL;
  ps_bundle_strings *strs = NULL;
  const void *data = NULL;
  int rc;
  if (e->dtype == PS_DT_STRING) {
    rc = ps_bundle_reader_read_strings(r, e->key, &strs, st);
  } else if (ps_dtype_size(e->dtype) > 0) {
    rc = ps_bundle_reader_read(r, e->key, &t, st);
    if (rc == 0) data = ps_tensor_data(t);
  } else {
    char nb[32];
    sb_puts(b, "(values of type ");
    sb_puts(b, dtype_name(e->dtype, nb, sizeof nb));
    sb_puts(b, " are not shown)\n");
    return 0;
  }
  if (rc != 0) return rc;
  printer pr = {
      .b = b, .dtype = e->dtype, .data = data, .strs = strs, .shape = &e->shape};
  int64_t stride = 1;
  for (int a = e->shape.rank - 1; a >= 0; a--) {
    pr.stride[a] = stride;
    stride *= e->shape.dim[a];
  }
  pr.summarize = ps_shape_num_elements(&e->shape) > SUMMARY_THRESHOLD;
  put_axis(&pr, 0, 0);
  sb_putc(b, '\n');
  ps_tensor_destroy(t);
  ps_bundle_strings_destroy(strs);
  return 0;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int flush_sbuf(sbuf *b, FILE *out, const char *prefix, ps_status *st) {
  if (b->oom) {
    b->oom = false;
    b->len = 0;
    return oom(st);
  }
  size_t n = b->len;
  b->len = 0;
  if (n && fwrite(b->p, 1, n, out) != n)
    return ps_status_set(st, PS_UNKNOWN, "inspecting %s: write error: %s", prefix,
                         strerror(errno));
  return 0;
}

int ps_ckpt_inspect(FILE *out, const char *prefix, bool all_values, ps_status *st) {
  char *latest = NULL;
  struct stat sb;
  int rc;
  ps_status local;
  if (st == NULL) st = &local;
  if (stat(prefix, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    if ((rc = ps_latest_checkpoint(prefix, &latest, st)) != 0) return rc;
    prefix = latest;
  }
  ps_bundle_reader *r = ps_bundle_reader_open(prefix, st);
  if (r == NULL) {
    rc = st->code;
    if (rc == PS_NOT_FOUND && (ends_with(prefix, ".index") || strstr(prefix, ".data-"))) {
      char m[PS_STATUS_MSG_MAX];
      snprintf(m, sizeof m, "%s", st->msg);
      ps_status_set(
          st, rc, "%.900s (give the checkpoint prefix, without .index or .data-...)", m);
    }
    free(latest);
    return rc;
  }
  sbuf b = {0};
  sb_puts(&b, "");
  rc = 0;
  for (size_t i = 0; i < ps_bundle_reader_count(r) && rc == 0; i++) {
    const ps_bundle_entry *e = ps_bundle_reader_entry(r, i);
    if (e->is_slice) continue;
    char shape[PS_MAX_RANK * 21 + 3], nb[32];
    sb_puts(&b, e->key);
    sb_puts(&b, " (");
    sb_puts(&b, dtype_name(e->dtype, nb, sizeof nb));
    sb_puts(&b, ") ");
    sb_puts(&b, ps_shape_format(&e->shape, shape, sizeof shape));
    sb_putc(&b, '\n');
    if (all_values) rc = put_values(&b, r, e, st);
    /* Print as we go, so a huge checkpoint does not sit in memory. */
    if (b.len > (1u << 16) && rc == 0) rc = flush_sbuf(&b, out, prefix, st);
  }
  /* What was printed before an error stays printed. */
  ps_status fst;
  if (flush_sbuf(&b, out, prefix, &fst) != 0 && rc == 0) {
    *st = fst;
    rc = fst.code;
  }
  if (rc == 0 && fflush(out) != 0)
    rc = ps_status_set(st, PS_UNKNOWN, "inspecting %s: write error: %s", prefix,
                       strerror(errno));
  free(b.p);
  ps_bundle_reader_close(r);
  free(latest);
  return rc;
}

/* ---- Path confinement ---------------------------------------------------- */

int ps_ckpt_path_confined(const char *root, const char *prefix, char *resolved, size_t n,
                          ps_status *st) {
  if (root == NULL || root[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "empty checkpoint directory (for %s)",
                         prefix ? prefix : "(null)");
  if (prefix == NULL || prefix[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "empty checkpoint path (directory %s)",
                         root);
  for (const unsigned char *c = (const unsigned char *)prefix; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "checkpoint path has a control character (byte 0x%02x at "
                           "offset %zu): refused (directory %s)",
                           *c, (size_t)((const char *)c - prefix), root);
  int rc = 0;
  char *rootn = NULL, *pn = NULL, *cand = NULL, *cand_abs = NULL, *root_abs = NULL;
  char *rroot = NULL, *cur = NULL;
  if (prefix[0] == '/') {
    root_abs = path_abs_normalize(root);
    cand = path_normalize(prefix);
    if (root_abs == NULL || cand == NULL) goto nomem;
    if (!path_within(cand, root_abs)) goto outside;
  } else {
    rootn = path_normalize(root);
    pn = path_normalize(prefix);
    if (rootn == NULL || pn == NULL) goto nomem;
    if (strcmp(pn, "..") == 0 || strncmp(pn, "../", 3) == 0) goto outside;
    if (strcmp(pn, ".") == 0) goto is_root;
    char *j = path_join(rootn, pn);
    if (j == NULL) goto nomem;
    cand = path_normalize(j);
    free(j);
    root_abs = path_abs_normalize(root);
    if (cand == NULL || root_abs == NULL) goto nomem;
  }
  cand_abs = path_abs_normalize(cand);
  if (cand_abs == NULL) goto nomem;
  if (strcmp(cand_abs, root_abs) == 0) goto is_root;
  /* Symbolic links: the deepest existing directory on the way must really
   * be inside the real root. */
  rroot = realpath(root_abs, NULL);
  if (rroot != NULL) {
    cur = strdup(cand_abs);
    if (cur == NULL) goto nomem;
    while (path_within(cur, root_abs) && strcmp(cur, root_abs) != 0) {
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
        bool inside = path_within(real, rroot);
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
  rc = ps_status_set(st, PS_PERMISSION_DENIED,
                     "checkpoint path %s is outside the checkpoint directory %s%s", prefix,
                     root,
                     strstr(prefix, "..") ? " (\"..\" escapes the checkpoint directory)"
                                          : "");
  goto done;
is_root:
  rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                     "checkpoint path %s names the checkpoint directory %s itself, "
                     "not a checkpoint in it",
                     prefix, root);
  goto done;
nomem:
  rc = oom(st);
done:
  free(rootn);
  free(pn);
  free(cand);
  free(cand_abs);
  free(root_abs);
  free(rroot);
  free(cur);
  return rc;
}
