/* What the checkpoint-directory files (checkpoint_*.c) share: a growable
 * string, os.path-style path arithmetic (join, normpath, abspath, "is
 * inside"), and Python's repr() of floats, which both the state file and
 * inspect_checkpoint print. */
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
#include "common/array.h"
#include "common/bundle.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/tensor.h"

/* ---- Small helpers ------------------------------------------------------- */

void ps_sb_putn_(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (n > SIZE_MAX - b->len - 1 ||
      ps_array_grow(&b->p, &b->cap, b->len + n + 1, 1) != 0) {
    b->oom = true;
    return;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void ps_sb_puts_(sbuf *b, const char *s) {
  ps_sb_putn_(b, s, strlen(s));
}
void ps_sb_putc_(sbuf *b, char c) {
  ps_sb_putn_(b, &c, 1);
}

char *ps_str_cat3_(const char *a, const char *b, const char *c) {
  size_t na = strlen(a), nb = strlen(b), nc = strlen(c);
  char *p = malloc(na + nb + nc + 1);
  if (p == NULL) return NULL;
  memcpy(p, a, na);
  memcpy(p + na, b, nb);
  memcpy(p + na + nb, c, nc + 1);
  return p;
}

int ps_ckpt_oom_(ps_status *st) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
}

/* ---- Paths --------------------------------------------------------------- */

/* os.path.join(dir, p) for one component list: an absolute @p wins. */
char *ps_path_join_(const char *dir, const char *p) {
  size_t dl = strlen(dir);
  if (p[0] == '/' || dl == 0) return strdup(p);
  return ps_str_cat3_(dir, dir[dl - 1] == '/' ? "" : "/", p);
}

/* Lexical normalization: no "//", no "." components, ".." cancels the
 * component before it ("/.." is "/"; a relative path keeps its leading
 * ".."s).  "" and "." give ".". */
char *ps_path_normalize_(const char *path) {
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
char *ps_path_abs_normalize_(const char *path) {
  if (path[0] == '/') return ps_path_normalize_(path);
  char cwd[4096];
  if (getcwd(cwd, sizeof cwd) == NULL) return ps_path_normalize_(path);
  char *j = ps_path_join_(cwd, path);
  if (j == NULL) return NULL;
  char *r = ps_path_normalize_(j);
  free(j);
  return r;
}

/* Whether normalized @p is @dir or below it (both normalized, same kind). */
bool ps_path_within_(const char *p, const char *dir) {
  if (strcmp(dir, "/") == 0) return p[0] == '/';
  if (strcmp(dir, ".") == 0) return p[0] != '/' && strncmp(p, "..", 2) != 0;
  size_t dl = strlen(dir);
  return strncmp(p, dir, dl) == 0 && (p[dl] == '\0' || p[dl] == '/');
}

/* ---- Python's repr() of floats ------------------------------------------- */

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
void ps_repr_float_(sbuf *b, double v, int kind, bool strip_zero) {
  if (isnan(v)) {
    ps_sb_puts_(b, "nan");
    return;
  }
  if (isinf(v)) {
    ps_sb_puts_(b, v < 0 ? "-inf" : "inf");
    return;
  }
  if (v == 0) {
    ps_sb_puts_(b, signbit(v) ? "-0" : "0");
    if (!strip_zero) ps_sb_puts_(b, ".0");
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
  if (neg) ps_sb_putc_(b, '-');
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      ps_sb_puts_(b, "0.");
      for (int i = 0; i < -decpt; i++)
        ps_sb_putc_(b, '0');
      ps_sb_puts_(b, dg);
    } else if (decpt >= nd) {
      ps_sb_puts_(b, dg);
      for (int i = nd; i < decpt; i++)
        ps_sb_putc_(b, '0');
      if (!strip_zero) ps_sb_puts_(b, ".0");
    } else {
      ps_sb_putn_(b, dg, (size_t)decpt);
      ps_sb_putc_(b, '.');
      ps_sb_puts_(b, dg + decpt);
    }
  } else {
    ps_sb_putc_(b, dg[0]);
    if (nd > 1) {
      ps_sb_putc_(b, '.');
      ps_sb_puts_(b, dg + 1);
    }
    char x[16];
    snprintf(x, sizeof x, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    ps_sb_puts_(b, x);
  }
}
