/* The reader of the `checkpoint` state file (ps_ckpt_state_parse): the
 * whole protobuf text format as Python's tokenizer and text_format.Merge
 * accept it, with errors that name the line.  The format is described at
 * the top of checkpoint_state.c. */
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
  /* capacities of the state's two arrays (ps_array_grow doubles them: a
   * file of 100,000 paths grew one entry at a time, which took 48 s under
   * ASan, where realloc always copies) */
  size_t paths_cap, ts_cap;
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
    ps_sb_putc_(b, (char)cp);
  } else if (cp < 0x800) {
    u[0] = (char)(0xc0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3f));
    ps_sb_putn_(b, u, 2);
  } else if (cp < 0x10000) {
    u[0] = (char)(0xe0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 0x3f));
    u[2] = (char)(0x80 | (cp & 0x3f));
    ps_sb_putn_(b, u, 3);
  } else {
    u[0] = (char)(0xf0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    u[2] = (char)(0x80 | (cp >> 6 & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f));
    ps_sb_putn_(b, u, 4);
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
      ps_sb_putc_(b, (char)c);
      continue;
    }
    if (lx->i >= lx->n || lx->p[lx->i] == '\n')
      return lex_error(lx, "unterminated string");
    c = lx->p[lx->i++];
    switch (c) {
    case 'a':
      ps_sb_putc_(b, '\a');
      break;
    case 'b':
      ps_sb_putc_(b, '\b');
      break;
    case 'f':
      ps_sb_putc_(b, '\f');
      break;
    case 'n':
      ps_sb_putc_(b, '\n');
      break;
    case 'r':
      ps_sb_putc_(b, '\r');
      break;
    case 't':
      ps_sb_putc_(b, '\t');
      break;
    case 'v':
      ps_sb_putc_(b, '\v');
      break;
    case '\\':
    case '\'':
    case '"':
      ps_sb_putc_(b, (char)c);
      break;
    case 'x': {
      int v = 0, k = 0;
      while (k < 2 && lx->i < lx->n && hexval(lx->p[lx->i]) >= 0)
        v = v * 16 + hexval(lx->p[lx->i++]), k++;
      if (k == 0) return lex_error(lx, "invalid \\x escape in string");
      ps_sb_putc_(b, (char)v);
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
        ps_sb_putc_(b, (char)v);
      } else { /* Python keeps an unknown escape as written */
        ps_sb_putc_(b, '\\');
        ps_sb_putc_(b, (char)c);
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
  ps_sb_puts_(&b, "");
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
    return ps_ckpt_oom_(lx->st);
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

static int state_add_path(lexer *lx, ps_ckpt_state *s, char *p) {
  if (ps_array_grow(&s->all_model_checkpoint_paths, &lx->paths_cap, s->num_paths + 1,
                    sizeof *s->all_model_checkpoint_paths) != 0)
    return -1;
  s->all_model_checkpoint_paths[s->num_paths++] = p;
  return 0;
}

static int state_add_timestamp(lexer *lx, ps_ckpt_state *s, double v) {
  if (ps_array_grow(&s->all_model_checkpoint_timestamps, &lx->ts_cap,
                    s->num_timestamps + 1,
                    sizeof *s->all_model_checkpoint_timestamps) != 0)
    return -1;
  s->all_model_checkpoint_timestamps[s->num_timestamps++] = v;
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
    } else if (state_add_path(lx, s, v) != 0) {
      free(v);
      return ps_ckpt_oom_(lx->st);
    }
    return 0;
  }
  double v = 0;
  int rc = lex_double(lx, name, &v);
  if (rc != 0) return rc;
  if (field == F_PRESERVED)
    s->last_preserved_timestamp = v;
  else if (state_add_timestamp(lx, s, v) != 0)
    return ps_ckpt_oom_(lx->st);
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
