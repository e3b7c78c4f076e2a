/* Fuzz target for the `checkpoint` state file (common/checkpoint_lexer.c):
 * ps_ckpt_state_parse, the protobuf text-format decoder of a
 * CheckpointState, and ps_ckpt_state_format, its encoder.
 *
 * Each input is used twice:
 *
 *  1. As the text of a state file.  Besides "no crash, no leak, no UB" (the
 *     text is copied into a buffer of exactly its size, so ASan sees any
 *     read past the end) it checks: a failed parse returns DATA_LOSS (or
 *     RESOURCE_EXHAUSTED) with a "line N: ..." message whose N lies inside
 *     the text, and leaves the state empty; a successful one gives
 *     NUL-free paths.  What parses is then formatted (which must fail with
 *     INVALID_ARGUMENT exactly when the timestamps do not match the paths),
 *     and the output must be printable ASCII lines, parse back to an equal
 *     state, and format again to the same bytes.
 *  2. As the raw contents of a state: the NUL-separated pieces of the input
 *     are the paths (the first also the model_checkpoint_path), its bytes
 *     read as doubles the timestamps and last_preserved_timestamp (every
 *     bit pattern: subnormals, NaNs, huge and tiny exponents).  Formatted
 *     and parsed back, it must be the same state: the paths byte for byte
 *     through the escapes, the doubles bit for bit through repr().
 *
 * States are compared as the proto sees them: an absent and an empty
 * model_checkpoint_path are equal, so are a 0 and a -0 (both omitted)
 * last_preserved_timestamp, and NaNs equal NaNs (repr() drops their sign
 * and payload).
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target.
 * Otherwise the shared driver (driver.c) runs it over every file (or every
 * file in each directory) named on the command line and then over
 * PS_FUZZ_RUNS (default 4000) deterministic random mutations of them, so it
 * runs as an ordinary test under gcc + ASan/UBSan. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "paramserver/checkpoint.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_ckpt_state: " __VA_ARGS__);                                    \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

#define MAX_RAW_PATHS 64

static bool same_double(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  return memcmp(&a, &b, sizeof a) == 0; /* -0.0 and 0.0 differ */
}

static const char *model_path(const ps_ckpt_state *s) {
  return s->model_checkpoint_path ? s->model_checkpoint_path : "";
}

/* Equal as CheckpointState messages (see the top of the file). */
static bool same_state(const ps_ckpt_state *a, const ps_ckpt_state *b) {
  if (strcmp(model_path(a), model_path(b)) != 0) return false;
  if (a->num_paths != b->num_paths || a->num_timestamps != b->num_timestamps)
    return false;
  for (size_t i = 0; i < a->num_paths; i++)
    if (strcmp(a->all_model_checkpoint_paths[i], b->all_model_checkpoint_paths[i]) != 0)
      return false;
  for (size_t i = 0; i < a->num_timestamps; i++)
    if (!same_double(a->all_model_checkpoint_timestamps[i],
                     b->all_model_checkpoint_timestamps[i]))
      return false;
  double la = a->last_preserved_timestamp, lb = b->last_preserved_timestamp;
  return (la == 0 && lb == 0) || same_double(la, lb);
}

static bool state_is_empty(const ps_ckpt_state *s) {
  return s->model_checkpoint_path == NULL && s->num_paths == 0 &&
         s->all_model_checkpoint_paths == NULL && s->num_timestamps == 0 &&
         s->all_model_checkpoint_timestamps == NULL && s->last_preserved_timestamp == 0;
}

/* A failed parse of @n bytes at @p: DATA_LOSS "line N: ..." with N in
 * range (or out of memory), and nothing left in @s. */
static void check_parse_error(const uint8_t *p, size_t n, const ps_ckpt_state *s,
                              const ps_status *st, const char *what) {
  if (!state_is_empty(s)) FAIL("%s: failed parse left a state behind", what);
  if (st->code == PS_RESOURCE_EXHAUSTED) return;
  if (st->code != PS_DATA_LOSS)
    FAIL("%s: parse failed with code %d, not DATA_LOSS: %s", what, st->code, st->msg);
  long line;
  char colon;
  if (sscanf(st->msg, "line %ld%c", &line, &colon) != 2 || colon != ':')
    FAIL("%s: error does not start with \"line N:\": %s", what, st->msg);
  long lines = 1;
  for (size_t i = 0; i < n; i++)
    lines += p[i] == '\n';
  if (line < 1 || line > lines)
    FAIL("%s: error names line %ld of a text of %ld lines: %s", what, line, lines,
         st->msg);
  /* the named line holds what the message is about */
  const uint8_t *ls = p, *end = p + n;
  for (long k = 1; k < line; k++)
    ls = (const uint8_t *)memchr(ls, '\n', (size_t)(end - ls)) + 1;
  const uint8_t *le = memchr(ls, '\n', (size_t)(end - ls));
  size_t ll = (size_t)((le ? le : end) - ls);
  const char *found = strstr(st->msg, "found '");
  const char *q = found ? found + 7 : NULL, *qe = q ? strrchr(q, '\'') : NULL;
  /* "found ''": a NUL byte, which the message cannot show */
  if (qe && qe > q && strncmp(q, "end of file'", 12) != 0) {
    size_t tl = (size_t)(qe - q);
    if (memmem(ls, ll, q, tl) == NULL)
      FAIL("%s: error names line %ld, which does not hold '%.*s': %s", what, line,
           (int)tl, q, st->msg);
  }
  if (strstr(st->msg, "NUL byte") && memchr(ls, '"', ll) == NULL &&
      memchr(ls, '\'', ll) == NULL)
    FAIL("%s: NUL byte reported on line %ld, which holds no string: %s", what, line,
         st->msg);
}

static void check_parsed(const ps_ckpt_state *s) {
  if (s->num_paths > 0 && s->all_model_checkpoint_paths == NULL)
    FAIL("%zu paths but no array", s->num_paths);
  if (s->num_timestamps > 0 && s->all_model_checkpoint_timestamps == NULL)
    FAIL("%zu timestamps but no array", s->num_timestamps);
  for (size_t i = 0; i < s->num_paths; i++)
    if (s->all_model_checkpoint_paths[i] == NULL) FAIL("path %zu is NULL", i);
}

/* Formats @s; when that must work, checks the text and that it parses
 * back to @s and formats again to the same bytes. */
static void check_round_trip(const ps_ckpt_state *s, const char *what) {
  ps_status st = {0};
  size_t len = 0;
  char *text = ps_ckpt_state_format(s, &len, &st);
  bool valid = s->num_timestamps == 0 || s->num_timestamps == s->num_paths;
  if (text == NULL) {
    if (st.code == PS_RESOURCE_EXHAUSTED) return;
    if (valid) FAIL("%s: format of a valid state failed: %s", what, st.msg);
    if (st.code != PS_INVALID_ARGUMENT || st.msg[0] == '\0')
      FAIL("%s: format of mismatched timestamps: code %d, message '%s'", what, st.code,
           st.msg);
    return;
  }
  if (!valid)
    FAIL("%s: format accepted %zu paths with %zu timestamps", what, s->num_paths,
         s->num_timestamps);
  if (strlen(text) != len) FAIL("%s: format's length %zu is not strlen", what, len);
  for (size_t i = 0; i < len; i++)
    if ((text[i] < 0x20 || text[i] > 0x7e) && text[i] != '\n')
      FAIL("%s: format wrote byte 0x%02x at %zu:\n%s", what, (unsigned char)text[i], i,
           text);
  if (len > 0 && text[len - 1] != '\n') FAIL("%s: format's last line is open", what);

  /* exact-size copy: a read past the end is an ASan error */
  uint8_t *copy = malloc(len ? len : 1);
  if (copy == NULL) FAIL("out of memory");
  memcpy(copy, text, len);
  ps_ckpt_state back;
  if (ps_ckpt_state_parse(copy, len, &back, &st) != 0) {
    if (st.code == PS_RESOURCE_EXHAUSTED) goto out;
    FAIL("%s: formatted state does not parse: %s\n%s", what, st.msg, text);
  }
  if (!same_state(s, &back)) FAIL("%s: parse(format(state)) differs:\n%s", what, text);
  size_t len2 = 0;
  char *again = ps_ckpt_state_format(&back, &len2, &st);
  if (again == NULL) {
    if (st.code != PS_RESOURCE_EXHAUSTED)
      FAIL("%s: the parsed-back state does not format: %s", what, st.msg);
  } else if (len2 != len || memcmp(again, text, len) != 0) {
    FAIL("%s: format is not stable:\n%s---\n%s", what, text, again);
  }
  free(again);
  ps_ckpt_state_free(&back);
out:
  free(copy);
  free(text);
}

/* Part 1: the input as state-file text. */
static void fuzz_text(const uint8_t *data, size_t size) {
  uint8_t *p = malloc(size ? size : 1);
  if (p == NULL) return;
  if (size) memcpy(p, data, size);
  ps_ckpt_state s;
  ps_status st = {0};
  if (ps_ckpt_state_parse(p, size, &s, &st) != 0) {
    check_parse_error(p, size, &s, &st, "text");
  } else {
    check_parsed(&s);
    check_round_trip(&s, "text");
    ps_ckpt_state_free(&s);
    ps_ckpt_state_free(&s); /* freeing an emptied state is a no-op */
  }
  free(p);
}

static double double_at(const uint8_t *data, size_t size, size_t i) {
  uint8_t b[8] = {0};
  for (size_t k = 0; k < 8 && size > 0; k++)
    b[k] = data[(i * 8 + k) % size];
  double v;
  memcpy(&v, b, sizeof v);
  return v;
}

/* Part 2: the input as the raw contents of a state. */
static void fuzz_raw(const uint8_t *data, size_t size) {
  char *buf = malloc(size + 1);
  char *paths[MAX_RAW_PATHS];
  double ts[MAX_RAW_PATHS];
  if (buf == NULL) return;
  if (size) memcpy(buf, data, size);
  buf[size] = '\0';
  size_t np = 0;
  for (size_t i = 0; i <= size && np < MAX_RAW_PATHS;) {
    paths[np++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  for (size_t i = 0; i < np; i++)
    ts[i] = double_at(data, size, i);
  /* the model path is one of the paths, or absent, as the low bits say */
  uint8_t sel = size ? data[size - 1] : 0;
  ps_ckpt_state s = {
      .model_checkpoint_path = (sel & 3) == 3 ? NULL : paths[(sel & 3) % np],
      .num_paths = np,
      .all_model_checkpoint_paths = paths,
      .num_timestamps = (sel & 4) ? 0 : np,
      .all_model_checkpoint_timestamps = ts,
      .last_preserved_timestamp = (sel & 8) ? 0 : double_at(data, size, np),
  };
  check_round_trip(&s, "raw state");
  /* a mismatch of paths and timestamps is refused, not written */
  if (np > 1) {
    s.num_timestamps = np - 1;
    check_round_trip(&s, "mismatched state");
  }
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_text(data, size);
  fuzz_raw(data, size);
  return 0;
}

#ifndef PS_LIBFUZZER

/* Pieces of the text format, so mutations reach every branch of the
 * lexer: field names, punctuation, comments, each kind of escape (and
 * broken ones), float spellings. */
static const char *const tokens[] = {
    "model_checkpoint_path",
    "all_model_checkpoint_paths",
    "all_model_checkpoint_timestamps",
    "last_preserved_timestamp",
    "model_checkpoint_path: \"a\"\n",
    "all_model_checkpoint_timestamps: [1.5, 2.5]\n",
    "all_model_checkpoint_paths: []\n",
    ":",
    " ",
    "\n",
    "\t",
    "\r\n",
    "[",
    "]",
    ",",
    ";",
    "#",
    "# comment\n",
    "\"",
    "'",
    "\" \"",
    "\"x\" 'y'",
    "\\",
    "\\n",
    "\\\"",
    "\\'",
    "\\\\",
    "\\x",
    "\\x4",
    "\\xff",
    "\\0",
    "\\000",
    "\\377",
    "\\400",
    "\\777",
    "\\u00e9",
    "\\u0000",
    "\\ud800",
    "\\U0001F600",
    "\\U00110000",
    "\\U",
    "\\q",
    "\\a\\b\\f\\v\\t\\r",
    "1601612029.9504316",
    "1e+16",
    "1e-05",
    "1e309",
    "-1e-320",
    "4.9e-324",
    "1.7976931348623157e+308",
    "inf",
    "-inf",
    "infinity",
    "-Infinity",
    "nan",
    "-nan",
    "NaN",
    "2.5f",
    "2.5F",
    "1.f",
    "0x10",
    "0x1p3",
    ".5",
    "5.",
    "-0",
    "+1",
    "1e",
    "--1",
    "1_000",
    "\xc3\xa9",
    "\xff",
    "\x00",
};
#define NTOKENS (sizeof tokens / sizeof tokens[0])

static size_t token_len(size_t k) {
  return tokens[k][0] ? strlen(tokens[k]) : 1; /* "\x00" is one NUL byte */
}

size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  int rounds = 1 + (int)fuzz_rnd(4);
  for (int r = 0; r < rounds; r++) {
    size_t pos = fuzz_rnd(n + 1);
    switch (fuzz_rnd(9)) {
    case 0: /* flip a bit */
      if (n) buf[fuzz_rnd(n)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1: /* random byte */
      if (n) buf[fuzz_rnd(n)] = (uint8_t)fuzz_rng();
      break;
    case 2:   /* insert a token */
    case 3: { /* (twice as likely) */
      size_t k = fuzz_rnd(NTOKENS);
      n = fuzz_insert(buf, n, cap, pos, tokens[k], token_len(k));
      break;
    }
    case 4: /* erase a range */
      n = fuzz_erase(buf, n, pos);
      break;
    case 5: /* duplicate a range */
      n = fuzz_duplicate(buf, n, cap, pos, 128);
      break;
    case 6: /* splice in part of another input */
      n = fuzz_splice(buf, n, cap, pos);
      break;
    case 7: /* nudge a byte (digits, quote kinds, escape letters) */
      if (n) buf[fuzz_rnd(n)] += (uint8_t)(fuzz_rnd(5) - 2);
      break;
    default: /* truncate */
      n = pos;
      break;
    }
  }
  return n;
}

#endif
