/* Fuzz target for the frames of the replication link (ps/repl_link.c): a
 * backup reads headers from anyone who connects to its link port, a
 * primary reads the backup's ACKs.  Input: bytes 0-1 pick the limits of
 * meta and data (none, the header's own sizes, one below them, or a power
 * of two), the rest is a 24-byte header followed by ACK meta (shorter: ACK
 * meta only).
 *
 * Besides "no crash, no leak, no UB" it checks properties:
 *  - ps_link_get_hdr, for every kind (the 3 and the one in the input):
 *    an error carries a "replication link: " message and the code of its
 *    cause (INVALID_ARGUMENT for a bad magic or kind, RESOURCE_EXHAUSTED
 *    for sizes over the limits); success means the magic and kind were
 *    right and the sizes are the header's, within the limits; a header
 *    over a limit by one byte is refused, one at the limit accepted;
 *  - ps_link_get_ack: an error carries a "replication link: " message;
 *    success gives a code of 0..16 and a message of printable ASCII only
 *    (empty for code 0);
 *  - round trips: ps_link_put_hdr -> ps_link_get_hdr and ps_link_put_ack
 *    -> ps_link_get_ack give back equal fields (the message: its printable
 *    ASCII, cut at PS_LINK_ACK_MAX - 20 bytes).
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer
 * target; otherwise the shared driver (driver.c) replays the corpus and
 * deterministic mutations of it. */
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
  char what[96];
  snprintf(what, sizeof what, "get_hdr(kind %u, limits %llu + %llu)", kind,
           (unsigned long long)max_meta, (unsigned long long)max_data);
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
    expect_error(rc, &st, want, what);
    if (want == PS_INVALID_ARGUMENT && magic != 0x4c525350u &&
        strstr(st.msg, "not a frame") == NULL)
      FAIL("%s: a bad magic's message does not say so: %s", what, st.msg);
    if (want == PS_RESOURCE_EXHAUSTED && strstr(st.msg, "over the limit") == NULL)
      FAIL("%s: a size's message names no limit: %s", what, st.msg);
    return;
  }
  if (rc != 0) FAIL("%s refused a valid header: %d %s", what, rc, st.msg);
  if (st.code != PS_OK) FAIL("%s: success with a status %d", what, st.code);
  if (h.kind != kind || h.meta != meta || h.data != data)
    FAIL("%s: fields %u %llu %llu, the header says %u %llu %llu", what, h.kind,
         (unsigned long long)h.meta, (unsigned long long)h.data, k,
         (unsigned long long)meta, (unsigned long long)data);
  if (h.meta > max_meta || h.data > max_data) FAIL("%s: over the limits", what);
}

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  uint8_t sel_meta = data[0], sel_data = data[1];
  const uint8_t *p = data + 2;
  size_t n = size - 2;
  if (n >= PS_LINK_HDR) {
    uint64_t meta = get64(p + 8), dlen = get64(p + 16);
    uint64_t mm = limit_of(sel_meta, meta), md = limit_of(sel_data, dlen);
    for (uint32_t kind = PS_LINK_HELLO; kind <= PS_LINK_ACK; kind++)
      check_hdr(p, kind, mm, md);
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
  } else {
    check_ack(p, n);
  }
  return 0;
}

#ifndef PS_LIBFUZZER

/* Pieces of frames, so mutations reach past the magic and the kind. */
static const uint8_t magic[] = {0x50, 0x53, 0x52, 0x4c};
static const uint8_t kinds[][4] = {
    {1, 0, 0, 0}, {2, 0, 0, 0}, {3, 0, 0, 0}, {0, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}};
static const uint8_t sizes[][8] = {
    {0, 0, 0, 0, 0, 0, 0, 0},    {36, 0, 0, 0, 0, 0, 0, 0},
    {20, 0, 0, 0, 0, 0, 0, 0},   {0x13, 1, 0, 0, 0, 0, 0, 0},
    {0, 0, 0, 0, 0, 1, 0, 0},    {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
    {0, 0, 0, 0, 0, 0, 0, 0x80}, {0, 0, 0, 4, 0, 0, 0, 0},
};
static const uint8_t codes[][4] = {{0, 0, 0, 0},  {3, 0, 0, 0},
                                   {7, 0, 0, 0},  {16, 0, 0, 0},
                                   {17, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}};

size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  int rounds = 1 + (int)fuzz_rnd(2);
  for (int r = 0; r < rounds; r++) {
    size_t pos = fuzz_rnd(n + 1);
    switch (fuzz_rnd(12)) {
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
    default: /* truncate */
      n = pos;
      break;
    }
  }
  return n;
}

#endif
