/* Fuzz target for the frames of the replication link (ps/repl_link.c): a
 * backup reads headers, STAGE and UNSTAGE frames from anyone who connects
 * to its link port and keeps their stages in a table; a primary reads the
 * backup's ACKs.  Input: bytes 0-1 pick the limits of meta and data (none,
 * the header's own sizes, one below them, or a power of two), the rest is
 * a 24-byte header followed by meta, read both as ACK meta and as STAGE
 * meta (shorter: ACK meta only); after 24 bytes of that meta comes a
 * program of operations on a stage table (run_stages() says how it reads).
 *
 * Besides "no crash, no leak, no UB" it checks properties:
 *  - ps_link_get_hdr, for every kind (the 5 and the one in the input):
 *    an error carries a "replication link: " message and the code of its
 *    cause (INVALID_ARGUMENT for a bad magic or kind, RESOURCE_EXHAUSTED
 *    for sizes over the limits); success means the magic and kind were
 *    right and the sizes are the header's, within the limits; a header
 *    over a limit by one byte is refused, one at the limit accepted;
 *  - ps_link_kind gives the header's kind field;
 *  - ps_link_get_ack: an error carries a "replication link: " message;
 *    success gives a code of 0..16 and a message of printable ASCII only
 *    (empty for code 0);
 *  - ps_link_get_stage (the meta after the header, of the header's meta
 *    length and of 24 bytes, for the header's data bytes, the limit on the
 *    total picked by byte 1 from the total in the meta): it takes exactly
 *    the meta of 24 bytes with an id other than 0, 0 < total <= the limit,
 *    offset <= total and data <= total - offset, and gives back the
 *    fields the bytes hold; anything else is INVALID_ARGUMENT with a
 *    "replication link: " message; a limit one below the total refuses
 *    the meta, one equal to it takes it;
 *  - round trips: ps_link_put_hdr -> ps_link_get_hdr, ps_link_put_ack ->
 *    ps_link_get_ack and ps_link_put_stage -> ps_link_get_stage give back
 *    equal fields (the ACK's message: its printable ASCII, cut at
 *    PS_LINK_ACK_MAX - 20 bytes);
 *  - a ps_link_stages table driven by the program agrees with a model of
 *    its own (per id: live or not, total, bytes written): every piece
 *    goes through ps_link_get_stage as the link's would, then
 *    ps_link_stages_dest takes exactly the pieces the model takes (the
 *    next bytes of a live stage with its total, or byte 0 of a new one
 *    while fewer than 8 live) and refuses the others with the error the
 *    model names, leaving the table as it was; each piece written is
 *    filled with bytes made from its id and position, and
 *    ps_link_stages_take gives a buffer only for a complete stage of the
 *    bytes asked (never for a dropped, taken or unknown one), holding
 *    exactly the bytes written; never more than 8 stages live, and the
 *    table's ids, totals and counts match the model's after every
 *    operation.
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer
 * target; otherwise the shared driver (driver.c) replays the corpus and
 * deterministic mutations of it. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "driver.h"
#include "ps/repl_frame.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_link: " __VA_ARGS__);                                          \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

#define PREFIX "replication link: "

static uint32_t get32(const uint8_t *b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)b[i] << (8 * i);
  return v;
}
static uint64_t get64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)b[i] << (8 * i);
  return v;
}

/* Whether @rc and @st are an error with a "replication link: " message, of
 * @code (0: any). */
static bool is_error(int rc, const ps_status *st, int code) {
  return rc != 0 && st->code == rc && strncmp(st->msg, PREFIX, strlen(PREFIX)) == 0 &&
         (code == 0 || rc == code);
}

static void expect_error(int rc, const ps_status *st, int code, const char *what) {
  if (rc == 0 || st->code != rc || strncmp(st->msg, PREFIX, strlen(PREFIX)) != 0)
    FAIL("%s failed without a \"" PREFIX "\" message (%d: %s)", what, rc, st->msg);
  if (code != 0 && rc != code)
    FAIL("%s: code %d where %d belongs (%s)", what, rc, code, st->msg);
}

/* A limit from @sel: none, the header's own size (so at the limit), one
 * below it, or a power of two. */
static uint64_t limit_of(uint8_t sel, uint64_t size) {
  switch (sel % 4) {
  case 0:
    return UINT64_MAX;
  case 1:
    return size;
  case 2:
    return size ? size - 1 : 0;
  default:
    return (uint64_t)1 << (sel / 4 % 64);
  }
}

/* ps_link_get_hdr on @b for @kind with the limits; checks the outcome
 * against the header's fields. */
static void check_hdr(const uint8_t *b, uint32_t kind, uint64_t max_meta,
                      uint64_t max_data) {
  char what[96]; /* made for a message only (snprintf is slow under ASan) */
#define WHAT                                                                             \
  (snprintf(what, sizeof what, "get_hdr(kind %u, limits %llu + %llu)", kind,             \
            (unsigned long long)max_meta, (unsigned long long)max_data),                 \
   what)
  uint32_t magic = get32(b), k = get32(b + 4);
  uint64_t meta = get64(b + 8), data = get64(b + 16);
  ps_link_hdr h;
  memset(&h, 0xa5, sizeof h);
  ps_status st;
  ps_status_clear(&st);
  int rc = ps_link_get_hdr(b, kind, max_meta, max_data, &h, &st);
  int want = 0;
  if (magic != 0x4c525350u || k != kind)
    want = PS_INVALID_ARGUMENT;
  else if (meta > max_meta || data > max_data)
    want = PS_RESOURCE_EXHAUSTED;
  if (want != 0) {
    if (!is_error(rc, &st, want)) expect_error(rc, &st, want, WHAT);
    if (want == PS_INVALID_ARGUMENT && magic != 0x4c525350u &&
        strstr(st.msg, "not a frame") == NULL)
      FAIL("%s: a bad magic's message does not say so: %s", WHAT, st.msg);
    if (want == PS_RESOURCE_EXHAUSTED && strstr(st.msg, "over the limit") == NULL)
      FAIL("%s: a size's message names no limit: %s", WHAT, st.msg);
    return;
  }
  if (rc != 0) FAIL("%s refused a valid header: %d %s", WHAT, rc, st.msg);
  if (st.code != PS_OK) FAIL("%s: success with a status %d", WHAT, st.code);
  if (h.kind != kind || h.meta != meta || h.data != data)
    FAIL("%s: fields %u %llu %llu, the header says %u %llu %llu", WHAT, h.kind,
         (unsigned long long)h.meta, (unsigned long long)h.data, k,
         (unsigned long long)meta, (unsigned long long)data);
  if (h.meta > max_meta || h.data > max_data) FAIL("%s: over the limits", WHAT);
}
#undef WHAT

static void hdr_round_trip(uint32_t kind, uint64_t meta, uint64_t data) {
  uint8_t b[PS_LINK_HDR];
  ps_link_put_hdr(b, kind, meta, data);
  ps_link_hdr h;
  ps_status st;
  ps_status_clear(&st);
  if (ps_link_get_hdr(b, kind, meta, data, &h, &st) != 0)
    FAIL("put_hdr(%u, %llu, %llu) does not decode at its own limits: %s", kind,
         (unsigned long long)meta, (unsigned long long)data, st.msg);
  if (h.kind != kind || h.meta != meta || h.data != data)
    FAIL("put_hdr(%u, %llu, %llu) came back as %u %llu %llu", kind,
         (unsigned long long)meta, (unsigned long long)data, h.kind,
         (unsigned long long)h.meta, (unsigned long long)h.data);
  /* one byte over either limit is refused, with the limit named */
  int rc;
  if (meta > 0) {
    rc = ps_link_get_hdr(b, kind, meta - 1, data, &h, &st);
    expect_error(rc, &st, PS_RESOURCE_EXHAUSTED, "put_hdr, meta limit - 1");
  }
  if (data > 0) {
    rc = ps_link_get_hdr(b, kind, meta, data - 1, &h, &st);
    expect_error(rc, &st, PS_RESOURCE_EXHAUSTED, "put_hdr, data limit - 1");
  }
  rc = ps_link_get_hdr(b, kind + 1, UINT64_MAX, UINT64_MAX, &h, &st);
  expect_error(rc, &st, PS_INVALID_ARGUMENT, "put_hdr, another kind");
}

static void check_ack(const uint8_t *p, size_t n) {
  int64_t applied = -7;
  ps_status res, st;
  ps_status_clear(&st);
  ps_status_set(&res, PS_UNKNOWN, "stale");
  int rc = ps_link_get_ack(p, n, &applied, &res, &st);
  if (rc != 0) {
    expect_error(rc, &st, 0, "get_ack");
    if (n >= 20 && n <= PS_LINK_ACK_MAX && get32(p) <= 16)
      FAIL("get_ack refused a valid answer of %zu bytes, code %u: %s", n, get32(p),
           st.msg);
    return;
  }
  if (n < 20 || n > PS_LINK_ACK_MAX) FAIL("get_ack took an answer of %zu bytes", n);
  if (res.code != (int)get32(p) || res.code < 0 || res.code > 16)
    FAIL("get_ack: code %d from %u", res.code, get32(p));
  if (applied != (int64_t)get64(p + 4)) FAIL("get_ack: applied %lld", (long long)applied);
  if (res.code == 0 && res.msg[0] != '\0') FAIL("get_ack: code 0 with a text");
  size_t m = strlen(res.msg);
  if (m > n - 20) FAIL("get_ack: a text of %zu bytes from %zu", m, n - 20);
  for (size_t i = 0; i < m; i++)
    if ((unsigned char)res.msg[i] < 0x20 || (unsigned char)res.msg[i] > 0x7e)
      FAIL("get_ack: an unprintable byte %02x in its text", (unsigned char)res.msg[i]);
}

/* put_ack -> get_ack with @code, @applied, @epoch and a printable text
 * made of @src (@n bytes; the unprintable ones replaced). */
static void ack_round_trip(int code, int64_t applied, int64_t epoch, const uint8_t *src,
                           size_t n) {
  char msg[2 * PS_LINK_ACK_MAX];
  if (n >= sizeof msg) n = sizeof msg - 1;
  for (size_t i = 0; i < n; i++)
    msg[i] = (char)(src[i] >= 0x20 && src[i] <= 0x7e ? src[i] : 'a' + src[i] % 26);
  msg[n] = '\0';
  uint8_t b[PS_LINK_ACK_MAX + 1];
  b[PS_LINK_ACK_MAX] = 0x5a; /* a canary: put_ack writes at most the max */
  size_t len = ps_link_put_ack(b, code, applied, epoch, n ? msg : NULL);
  if (b[PS_LINK_ACK_MAX] != 0x5a || len > PS_LINK_ACK_MAX)
    FAIL("put_ack wrote %zu bytes, over %d", len, PS_LINK_ACK_MAX);
  size_t keep = n < PS_LINK_ACK_MAX - 20 ? n : PS_LINK_ACK_MAX - 20;
  if (len != 20 + keep) FAIL("put_ack: %zu bytes for a text of %zu", len, n);
  if ((int64_t)get64(b + 12) != epoch) FAIL("put_ack: epoch %lld", (long long)epoch);
  int64_t got = 0;
  ps_status res, st;
  ps_status_clear(&st);
  if (ps_link_get_ack(b, len, &got, &res, &st) != 0)
    FAIL("put_ack(code %d, text of %zu) does not decode: %s", code, n, st.msg);
  if (res.code != code || got != applied)
    FAIL("put_ack(code %d, applied %lld) came back as %d, %lld", code, (long long)applied,
         res.code, (long long)got);
  if (code == 0 ? res.msg[0] != '\0'
                : strlen(res.msg) != keep || memcmp(res.msg, msg, keep) != 0)
    FAIL("put_ack(code %d): the text \"%.*s\" came back as \"%s\"", code, (int)keep, msg,
         res.msg);
}

/* ---- STAGE meta ---- */

/* Whether ps_link_get_stage should take @n bytes of meta @p for a piece
 * of @data bytes under @max_total. */
static bool stage_valid(const uint8_t *p, size_t n, uint64_t data, uint64_t max_total) {
  if (n != PS_LINK_STAGE_META) return false;
  uint64_t id = get64(p), total = get64(p + 8), off = get64(p + 16);
  return id != 0 && total != 0 && total <= max_total && off <= total &&
         data <= total - off;
}

/* ps_link_get_stage on @p checked against stage_valid(); its status, and
 * the fields in *@out (when not NULL) on success. */
static int check_stage(const uint8_t *p, size_t n, uint64_t data, uint64_t max_total,
                       ps_link_stage *out, const char *what) {
  ps_link_stage s;
  memset(&s, 0xa5, sizeof s);
  ps_status st;
  ps_status_clear(&st);
  int rc = ps_link_get_stage(p, n, data, max_total, &s, &st);
  if (!stage_valid(p, n, data, max_total)) {
    if (rc == 0)
      FAIL("%s: get_stage took meta of %zu bytes (id %llu, total %llu, offset %llu) for "
           "%llu bytes under a limit of %llu",
           what, n, n >= 8 ? (unsigned long long)get64(p) : 0ull,
           n >= 16 ? (unsigned long long)get64(p + 8) : 0ull,
           n >= 24 ? (unsigned long long)get64(p + 16) : 0ull, (unsigned long long)data,
           (unsigned long long)max_total);
    expect_error(rc, &st, PS_INVALID_ARGUMENT, what);
    return rc;
  }
  if (rc != 0)
    FAIL("%s: get_stage refused valid meta (id %llu, total %llu, offset %llu) for %llu "
         "bytes under a limit of %llu: %d %s",
         what, (unsigned long long)get64(p), (unsigned long long)get64(p + 8),
         (unsigned long long)get64(p + 16), (unsigned long long)data,
         (unsigned long long)max_total, rc, st.msg);
  if (st.code != PS_OK) FAIL("%s: get_stage succeeded with a status %d", what, st.code);
  if (s.id != get64(p) || s.total != get64(p + 8) || s.offset != get64(p + 16))
    FAIL("%s: get_stage gave %llu %llu %llu, the meta says %llu %llu %llu", what,
         (unsigned long long)s.id, (unsigned long long)s.total,
         (unsigned long long)s.offset, (unsigned long long)get64(p),
         (unsigned long long)get64(p + 8), (unsigned long long)get64(p + 16));
  if (s.id == 0 || s.total == 0 || s.total > max_total || s.offset > s.total ||
      data > s.total - s.offset)
    FAIL("%s: get_stage took a stage out of its bounds", what);
  if (out) *out = s;
  return 0;
}

/* The 24 bytes of meta @m for a piece of @data bytes: refused under a
 * limit one below its total, taken under one equal to it (if the rest of
 * it is valid). */
static void stage_boundary(const uint8_t *m, uint64_t data) {
  uint64_t id = get64(m), total = get64(m + 8), off = get64(m + 16);
  int at =
      check_stage(m, PS_LINK_STAGE_META, data, total, NULL, "get_stage, limit = total");
  if (total == 0) return;
  int below = check_stage(m, PS_LINK_STAGE_META, data, total - 1, NULL,
                          "get_stage, limit = total - 1");
  if (id != 0 && off <= total && data <= total - off && (at != 0 || below == 0))
    FAIL("get_stage(total %llu): %s under the limit %llu", (unsigned long long)total,
         at != 0 ? "refused" : "taken",
         (unsigned long long)(at != 0 ? total : total - 1));
}

/* put_stage -> get_stage with the fields as they are, then made valid
 * (id and total not 0, the offset within the total) for pieces of 0 bytes
 * and of the rest of the stage. */
static void stage_round_trip(uint64_t id, uint64_t total, uint64_t off, uint64_t data) {
  uint8_t b[PS_LINK_STAGE_META + 1];
  b[PS_LINK_STAGE_META] = 0x5a; /* a canary: put_stage writes 24 bytes */
  ps_link_put_stage(b, &(ps_link_stage){id, total, off});
  if (b[PS_LINK_STAGE_META] != 0x5a) FAIL("put_stage wrote over 24 bytes");
  if (get64(b) != id || get64(b + 8) != total || get64(b + 16) != off)
    FAIL("put_stage(%llu, %llu, %llu) wrote other fields", (unsigned long long)id,
         (unsigned long long)total, (unsigned long long)off);
  check_stage(b, PS_LINK_STAGE_META, data, UINT64_MAX, NULL, "put_stage as it is");
  if (id == 0) id = 1;
  if (total == 0) total = 1;
  if (total != UINT64_MAX) off %= total + 1;
  ps_link_put_stage(b, &(ps_link_stage){id, total, off});
  uint64_t sizes[2] = {0, total - off};
  for (int i = 0; i < 2; i++) {
    ps_link_stage s;
    if (check_stage(b, PS_LINK_STAGE_META, sizes[i], total, &s, "put_stage") != 0)
      FAIL("put_stage(%llu, %llu, %llu) does not decode for %llu bytes",
           (unsigned long long)id, (unsigned long long)total, (unsigned long long)off,
           (unsigned long long)sizes[i]);
    if (s.id != id || s.total != total || s.offset != off)
      FAIL("put_stage(%llu, %llu, %llu) came back as %llu %llu %llu",
           (unsigned long long)id, (unsigned long long)total, (unsigned long long)off,
           (unsigned long long)s.id, (unsigned long long)s.total,
           (unsigned long long)s.offset);
  }
}

/* ---- a stage table against its model ---- */

/* The model's own limits: the table holds 8 stages (a change of
 * PS_LINK_MAX_STAGES is a change of this model), totals stay small. */
#define MODEL_MAX_STAGES 8
_Static_assert(PS_LINK_MAX_STAGES == MODEL_MAX_STAGES, "fuzz_link models 8 stages");
#define MODEL_MAX_TOTAL 2048
#define MODEL_MAX_OPS 256
#define NIDS 16

enum { NEVER, LIVE, DROPPED, TAKEN };

typedef struct model_stage {
  int state;
  uint64_t total, got;
} model_stage;

/* The ids a program names (by 4 bits): 12 small ones, so more than 8 at
 * once, big ones (over 32 bits, so a truncation shows) and 0 (which
 * get_stage refuses). */
static uint64_t id_of(int k) {
  static const uint64_t big[4] = {UINT64_MAX, (uint64_t)1 << 63, (uint64_t)1 << 32, 0};
  return k < 12 ? (uint64_t)k + 1 : big[k - 12];
}

/* The byte at @pos of stage @id. */
static uint8_t fill_byte(uint64_t id, uint64_t pos) {
  uint64_t h = (id ^ (pos * 0x9e3779b97f4a7c15u)) * 0xbf58476d1ce4e5b9u;
  return (uint8_t)(h >> 56);
}

static int model_live(const model_stage *md) {
  int n = 0;
  for (int k = 0; k < NIDS; k++)
    n += md[k].state == LIVE;
  return n;
}

/* The table holds exactly the model's live stages, with their totals and
 * bytes received. */
static void check_table(const ps_link_stages *t, const model_stage *md,
                        const char *after) {
  if (t->n < 0 || t->n > MODEL_MAX_STAGES)
    FAIL("stages, after %s: %d live, over %d", after, t->n, MODEL_MAX_STAGES);
  int live = model_live(md);
  if (t->n != live)
    FAIL("stages, after %s: %d live where the model has %d", after, t->n, live);
  for (int k = 0; k < NIDS; k++) {
    if (md[k].state != LIVE) continue;
    int i = 0;
    while (i < t->n && t->v[i].id != id_of(k))
      i++;
    if (i == t->n)
      FAIL("stages, after %s: stage %llu is missing", after,
           (unsigned long long)id_of(k));
    if (t->v[i].buf == NULL || t->v[i].buf->size != md[k].total ||
        t->v[i].got != md[k].got)
      FAIL("stages, after %s: stage %llu has %zu of %zu bytes, the model %llu of %llu",
           after, (unsigned long long)id_of(k), t->v[i].got,
           t->v[i].buf ? t->v[i].buf->size : 0, (unsigned long long)md[k].got,
           (unsigned long long)md[k].total);
  }
}

/* A STAGE piece of stage @k, as the link reads it: get_stage, then dest,
 * the bytes, got.  @x picks the total (bits 0-1: the stage's, or a new one
 * from bits 2-4 and @z), the offset (bits 5-6: the next byte, a gap or a
 * replay, or @z * 8) and whether the length @y is cut to what the stage
 * has left (bit 7 clear). */
static void op_piece(ps_link_stages *t, model_stage *md, int k, uint8_t x, uint8_t y,
                     uint8_t z) {
  model_stage *s = &md[k];
  bool live = s->state == LIVE;
  uint64_t id = id_of(k);
  uint64_t total = live && (x & 3) != 3 ? s->total : 1 + (uint64_t)(x >> 2 & 7) * 256 + z;
  uint64_t base = live ? s->got : 0, off;
  switch (x >> 5 & 3) {
  case 2:
    if (z & 1)
      off = base + 1 + (z >> 1 & 15);
    else
      off = base ? base - 1 - (uint64_t)(z >> 1) % base : 0;
    break;
  case 3:
    off = (uint64_t)z * 8;
    break;
  default:
    off = base;
    break;
  }
  uint64_t data = y;
  if (!(x & 0x80)) {
    uint64_t rest = off <= total ? total - off : 0;
    if (data > rest) data = rest;
  }
  uint8_t meta[PS_LINK_STAGE_META];
  ps_link_put_stage(meta, &(ps_link_stage){id, total, off});
  ps_link_stage m;
  if (check_stage(meta, sizeof meta, data, MODEL_MAX_TOTAL, &m, "a piece") != 0)
    return; /* (the link would answer and close) */
  /* the model's answer */
  int want = 0;
  char text[96] = "";
  if (!live && off != 0) {
    want = PS_INVALID_ARGUMENT;
    snprintf(text, sizeof text, "stage %llu starts at byte %llu, not 0",
             (unsigned long long)id, (unsigned long long)off);
  } else if (!live && model_live(md) == MODEL_MAX_STAGES) {
    want = PS_RESOURCE_EXHAUSTED;
    snprintf(text, sizeof text, "more than %d stages at once", MODEL_MAX_STAGES);
  } else if (live && (total != s->total || off != s->got)) {
    want = PS_INVALID_ARGUMENT;
    snprintf(text, sizeof text, "stage %llu: ", (unsigned long long)id);
  }
  ps_status st;
  ps_status_clear(&st);
  uint8_t *dest = ps_link_stages_dest(t, &m, data, &st);
  if (want != 0) {
    if (dest != NULL && !live)
      FAIL("stages: took %llu bytes at %llu of stage %llu (total %llu), which the model "
           "refuses: %s",
           (unsigned long long)data, (unsigned long long)off, (unsigned long long)id,
           (unsigned long long)total, text);
    if (dest != NULL)
      FAIL("stages: took %llu bytes at %llu of stage %llu (total %llu) where %llu of "
           "%llu bytes came",
           (unsigned long long)data, (unsigned long long)off, (unsigned long long)id,
           (unsigned long long)total, (unsigned long long)s->got,
           (unsigned long long)s->total);
    if (!is_error(st.code, &st, want))
      FAIL("stages_dest: refused with %d where %d belongs: %s", st.code, want, st.msg);
    if (strstr(st.msg, text) == NULL)
      FAIL("stages_dest: \"%s\" does not say \"%s\"", st.msg, text);
    return;
  }
  if (dest == NULL)
    FAIL("stages: refused %llu bytes at %llu of stage %llu (total %llu) the model takes: "
         "%d %s",
         (unsigned long long)data, (unsigned long long)off, (unsigned long long)id,
         (unsigned long long)total, st.code, st.msg);
  if (!live) *s = (model_stage){LIVE, total, 0};
  for (uint64_t i = 0; i < data; i++)
    dest[i] = fill_byte(id, off + i);
  ps_link_stages_got(t, id, data);
  s->got += data;
}

/* Takes stage @k of @bytes bytes: a buffer exactly when the model has it
 * live, complete and of that size, holding the bytes written. */
static void op_take(ps_link_stages *t, model_stage *md, int k, uint64_t bytes) {
  model_stage *s = &md[k];
  uint64_t id = id_of(k);
  ps_buf *b = ps_link_stages_take(t, id, (size_t)bytes);
  if (s->state != LIVE || s->got != s->total || s->total != bytes) {
    if (b != NULL) {
      static const char *const why[] = {"a stage never made", "", "a dropped stage",
                                        "a stage taken already"};
      if (s->state != LIVE)
        FAIL("stages: take(%llu, %llu bytes) gave %s", (unsigned long long)id,
             (unsigned long long)bytes, why[s->state]);
      FAIL("stages: take(%llu, %llu bytes) gave a stage of %llu bytes, %llu received",
           (unsigned long long)id, (unsigned long long)bytes,
           (unsigned long long)s->total, (unsigned long long)s->got);
    }
    return;
  }
  if (b == NULL)
    FAIL("stages: take(%llu, %llu bytes) refused the complete stage",
         (unsigned long long)id, (unsigned long long)bytes);
  if (b->size != bytes)
    FAIL("stages: take(%llu, %llu bytes) gave %zu bytes", (unsigned long long)id,
         (unsigned long long)bytes, b->size);
  const uint8_t *d = b->data;
  for (size_t i = 0; i < b->size; i++)
    if (d[i] != fill_byte(id, i))
      FAIL("stages: take(%llu): byte %zu is %02x, %02x was written",
           (unsigned long long)id, i, d[i], fill_byte(id, i));
  ps_buf_unref(b);
  s->state = TAKEN;
}

static void op_drop(ps_link_stages *t, model_stage *md, int k) {
  ps_link_stages_drop(t, id_of(k));
  if (md[k].state == LIVE) md[k].state = DROPPED;
}

/* A program on a fresh table: up to MODEL_MAX_OPS operations, each a byte
 * (bits 0-3: the operation, 4-7: the id, by id_of()) and its arguments:
 *   0-7, 15  x y z   a piece (op_piece);
 *   8-10     w       take, of the stage's total (w & 3 != 3; of w * 8 for
 *                    a stage the model does not have) or that plus
 *                    (w >> 2) - 32;
 *   11-12            drop;
 *   13       y       got(y) of a stage the model does not have (a no-op);
 *   14               drop, then take of the dropped stage's total.
 * The table is checked against the model after each; at the end it is
 * finished (LeakSanitizer sees what it keeps). */
static void run_stages(const uint8_t *p, size_t n) {
  ps_link_stages t;
  memset(&t, 0, sizeof t);
  model_stage md[NIDS];
  memset(md, 0, sizeof md);
  static const char *const names[16] = {"a piece", "a piece", "a piece",   "a piece",
                                        "a piece", "a piece", "a piece",   "a piece",
                                        "take",    "take",    "take",      "drop",
                                        "drop",    "got",     "drop+take", "a piece"};
  size_t i = 0;
  for (int ops = 0; ops < MODEL_MAX_OPS && i < n; ops++) {
    int op = p[i] & 15, k = p[i] >> 4;
    i++;
    if (op < 8 || op == 15) {
      if (n - i < 3) break;
      op_piece(&t, md, k, p[i], p[i + 1], p[i + 2]);
      i += 3;
    } else if (op <= 10) {
      if (n - i < 1) break;
      uint8_t w = p[i++];
      uint64_t bytes = md[k].state == LIVE ? md[k].total : (uint64_t)w * 8;
      if ((w & 3) == 3) bytes = bytes + (w >> 2) - 32;
      op_take(&t, md, k, bytes);
    } else if (op <= 12) {
      op_drop(&t, md, k);
    } else if (op == 13) {
      if (n - i < 1) break;
      uint8_t y = p[i++];
      if (md[k].state != LIVE) ps_link_stages_got(&t, id_of(k), y);
    } else {
      uint64_t bytes = md[k].total;
      op_drop(&t, md, k);
      op_take(&t, md, k, bytes);
    }
    check_table(&t, md, names[op]);
  }
  ps_link_stages_fini(&t);
  if (t.n != 0) FAIL("stages: %d left after fini", t.n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  uint8_t sel_meta = data[0], sel_data = data[1];
  const uint8_t *p = data + 2;
  size_t n = size - 2;
  if (n >= PS_LINK_HDR) {
    uint64_t meta = get64(p + 8), dlen = get64(p + 16);
    uint64_t mm = limit_of(sel_meta, meta), md = limit_of(sel_data, dlen);
    for (uint32_t kind = PS_LINK_HELLO; kind <= PS_LINK_UNSTAGE; kind++)
      check_hdr(p, kind, mm, md);
    if (ps_link_kind(p) != get32(p + 4)) FAIL("ps_link_kind: %u", ps_link_kind(p));
    /* as conn_stage reads STAGE and UNSTAGE headers */
    check_hdr(p, PS_LINK_STAGE, PS_LINK_STAGE_META, md);
    check_hdr(p, PS_LINK_UNSTAGE, PS_LINK_UNSTAGE_META, 0);
    check_hdr(p, get32(p + 4), mm, md);
    check_hdr(p, get32(p + 4), UINT64_MAX, UINT64_MAX);
    check_hdr(p, get32(p + 4), 0, 0);
    hdr_round_trip(get32(p + 4), meta, dlen);
    /* the ACK meta after the header, as link_ack reads it */
    const uint8_t *m = p + PS_LINK_HDR;
    size_t mn = n - PS_LINK_HDR;
    check_ack(m, mn);
    if (mn >= 20)
      ack_round_trip((int)(get32(m) % 17), (int64_t)get64(m + 4), (int64_t)get64(m + 12),
                     m + 20, mn - 20);
    /* the same meta as STAGE meta, of the header's meta length (what is
     * there of it) and of 24 bytes, under a limit picked by byte 1 */
    size_t sn = meta < mn ? (size_t)meta : mn;
    uint64_t mt = limit_of(sel_data, mn >= 16 ? get64(m + 8) : 0);
    check_stage(m, sn, dlen, mt, NULL, "get_stage");
    if (mn >= PS_LINK_STAGE_META) {
      check_stage(m, PS_LINK_STAGE_META, dlen, mt, NULL, "get_stage of 24 bytes");
      stage_boundary(m, dlen);
      stage_round_trip(get64(m), get64(m + 8), get64(m + 16), dlen);
    }
    stage_round_trip(get64(p), meta, dlen, dlen);
    if (mn > PS_LINK_STAGE_META)
      run_stages(m + PS_LINK_STAGE_META, mn - PS_LINK_STAGE_META);
  } else {
    check_ack(p, n);
  }
  return 0;
}

#ifndef PS_LIBFUZZER

/* Pieces of frames, so mutations reach past the magic and the kind. */
static const uint8_t magic[] = {0x50, 0x53, 0x52, 0x4c};
static const uint8_t kinds[][4] = {{1, 0, 0, 0},
                                   {2, 0, 0, 0},
                                   {3, 0, 0, 0},
                                   {4, 0, 0, 0},
                                   {5, 0, 0, 0},
                                   {0, 0, 0, 0},
                                   {0xff, 0xff, 0xff, 0xff}};
static const uint8_t sizes[][8] = {
    {0, 0, 0, 0, 0, 0, 0, 0},    {36, 0, 0, 0, 0, 0, 0, 0},
    {20, 0, 0, 0, 0, 0, 0, 0},   {0x13, 1, 0, 0, 0, 0, 0, 0},
    {0, 0, 0, 0, 0, 1, 0, 0},    {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
    {0, 0, 0, 0, 0, 0, 0, 0x80}, {0, 0, 0, 4, 0, 0, 0, 0},
};
/* Fields of STAGE meta: 0, 1, 24, 256, 2048 (the model's largest total),
 * 2 ** 32, 2 ** 63, the largest. */
static const uint64_t stage_fields[] = {
    0, 1, 24, 256, 2048, (uint64_t)1 << 32, (uint64_t)1 << 63, UINT64_MAX};
/* Operations of a stage table program (run_stages()), id bits clear: a
 * piece of the next bytes (cut to the stage's rest), a take of the total,
 * a drop, drop+take. */
static const uint8_t stage_ops[][4] = {
    {0x00, 0x00, 0x40, 0x10}, {0x00, 0x04, 0xff, 0x00}, {0x08, 0x00}, {0x0b}, {0x0e}};
static const size_t stage_op_len[] = {4, 4, 2, 1, 1};
static const uint8_t codes[][4] = {{0, 0, 0, 0},  {3, 0, 0, 0},
                                   {7, 0, 0, 0},  {16, 0, 0, 0},
                                   {17, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}};

size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  int rounds = 1 + (int)fuzz_rnd(2);
  for (int r = 0; r < rounds; r++) {
    size_t pos = fuzz_rnd(n + 1);
    switch (fuzz_rnd(15)) {
    case 0: /* flip a bit */
      if (n) buf[fuzz_rnd(n)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1: /* random byte (the limit bytes often) */
      if (n)
        buf[fuzz_rnd(2) ? fuzz_rnd(n < 2 ? n : 2) : fuzz_rnd(n)] = (uint8_t)fuzz_rng();
      break;
    case 2: /* a field of the header (after the 2 limit bytes) overwritten */
      if (n >= 2 + PS_LINK_HDR) {
        switch (fuzz_rnd(3)) {
        case 0:
          memcpy(buf + 2, magic, 4);
          break;
        case 1:
          memcpy(buf + 6, kinds[fuzz_rnd(sizeof kinds / sizeof kinds[0])], 4);
          break;
        default:
          memcpy(buf + 10 + 8 * fuzz_rnd(2),
                 sizes[fuzz_rnd(sizeof sizes / sizeof sizes[0])], 8);
          break;
        }
      }
      break;
    case 3: /* an ACK code */
      if (n >= 30) memcpy(buf + 26, codes[fuzz_rnd(sizeof codes / sizeof codes[0])], 4);
      break;
    case 4: /* erase a range */
      n = fuzz_erase(buf, n, pos);
      break;
    case 5: /* duplicate a range (longer texts) */
      n = fuzz_duplicate(buf, n, cap, pos, 128);
      break;
    case 6: /* splice in part of another input */
      n = fuzz_splice(buf, n, cap, pos);
      break;
    case 7: /* a size byte changed */
    case 8:
      if (n >= 26) buf[10 + fuzz_rnd(16)] = (uint8_t)fuzz_rng();
      break;
    case 9: /* an unprintable byte into the text */
      if (n > 46)
        buf[46 + fuzz_rnd(n - 46)] =
            (uint8_t)(fuzz_rnd(2) ? fuzz_rnd(32) : 0x7f + fuzz_rnd(129));
      break;
    case 10: /* a field of the STAGE meta, or the header's data, set */
      if (n >= 50) {
        uint8_t *at = fuzz_rnd(4) ? buf + 26 + 8 * fuzz_rnd(3) : buf + 18;
        uint64_t f = stage_fields[fuzz_rnd(sizeof stage_fields / sizeof stage_fields[0])];
        if (fuzz_rnd(3) == 0) { /* data = total - offset (+-1): a piece that just fits */
          at = buf + 18;
          f = get64(buf + 34) - get64(buf + 42) + fuzz_rnd(3) - 1;
        }
        for (int i = 0; i < 8; i++)
          at[i] = (uint8_t)(f >> (8 * i));
      }
      break;
    case 11: /* an operation of the program inserted, on one of the ids */
      if (n >= 50) {
        size_t o = fuzz_rnd(sizeof stage_ops / sizeof stage_ops[0]);
        uint8_t op[4];
        memcpy(op, stage_ops[o], 4);
        op[0] |= (uint8_t)(fuzz_rnd(fuzz_rnd(2) ? 3 : 16) << 4);
        n = fuzz_insert(buf, n, cap, 50 + fuzz_rnd(n - 49), op, stage_op_len[o]);
      }
      break;
    case 12: /* a byte of the program */
      if (n > 50) buf[50 + fuzz_rnd(n - 50)] = (uint8_t)fuzz_rng();
      break;
    default: /* truncate */
      n = pos;
      break;
    }
  }
  return n;
}

#endif
