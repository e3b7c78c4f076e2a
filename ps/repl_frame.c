/* The frames of the replication link (ps/repl_frame.h): encoders and
 * decoders of the bytes a backup reads from whoever connects to its link
 * port and a primary reads from the backup, and the backup's table of a
 * connection's stages.  No I/O: tests/fuzz/fuzz_link.c runs them. */
#include <string.h>

#include "repl_internal.h"

#define LINK_MAGIC 0x4c525350u /* "PSRL" */

/* ---- frames ---- */

void ps_link_put32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++)
    b[i] = (uint8_t)(v >> (8 * i));
}
void ps_link_put64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)(v >> (8 * i));
}
uint32_t ps_link_get32(const uint8_t *b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)b[i] << (8 * i);
  return v;
}
uint64_t ps_link_get64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)b[i] << (8 * i);
  return v;
}

void ps_link_put_hdr(uint8_t *b, uint32_t kind, uint64_t meta, uint64_t data) {
  ps_link_put32(b, LINK_MAGIC);
  ps_link_put32(b + 4, kind);
  ps_link_put64(b + 8, meta);
  ps_link_put64(b + 16, data);
}

int ps_link_get_hdr(const uint8_t *b, uint32_t kind, uint64_t max_meta, uint64_t max_data,
                    ps_link_hdr *h, ps_status *st) {
  if (ps_link_get32(b) != LINK_MAGIC)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "replication link: not a frame (magic %08x)", ps_link_get32(b));
  h->kind = ps_link_get32(b + 4);
  h->meta = ps_link_get64(b + 8);
  h->data = ps_link_get64(b + 16);
  if (h->kind != kind)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "replication link: a frame of kind %u where %u belongs", h->kind,
                         kind);
  if (h->meta > max_meta || h->data > max_data)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "replication link: a frame of %llu + %llu bytes, over the limit "
                         "of %llu + %llu",
                         (unsigned long long)h->meta, (unsigned long long)h->data,
                         (unsigned long long)max_meta, (unsigned long long)max_data);
  return 0;
}

size_t ps_link_put_ack(uint8_t *b, int code, int64_t applied, int64_t epoch,
                       const char *msg) {
  ps_link_put32(b, (uint32_t)code);
  ps_link_put64(b + 4, (uint64_t)applied);
  ps_link_put64(b + 12, (uint64_t)epoch);
  size_t n = msg ? strnlen(msg, PS_LINK_ACK_MAX - 20) : 0;
  if (n) memcpy(b + 20, msg, n);
  return 20 + n;
}

int ps_link_get_ack(const uint8_t *p, size_t n, int64_t *applied, ps_status *res,
                    ps_status *st) {
  if (n < 20 || n > PS_LINK_ACK_MAX)
    return ps_status_set(st, PS_INTERNAL, "replication link: an answer of %zu bytes", n);
  uint32_t code = ps_link_get32(p);
  if (code > 16)
    return ps_status_set(st, PS_INTERNAL, "replication link: an answer with code %u",
                         code);
  *applied = (int64_t)ps_link_get64(p + 4);
  ps_status_clear(res);
  if (code != 0) {
    char msg[PS_LINK_ACK_MAX];
    size_t m = n - 20;
    memcpy(msg, p + 20, m);
    msg[m] = '\0';
    for (size_t i = 0; i < m; i++) /* an outsider's text: printable only */
      if ((unsigned char)msg[i] < 0x20 || (unsigned char)msg[i] > 0x7e) msg[i] = '?';
    ps_status_set(res, (int)code, "%s", msg);
  }
  return 0;
}

uint32_t ps_link_kind(const uint8_t *b) {
  return ps_link_get32(b + 4);
}

void ps_link_put_stage(uint8_t *b, const ps_link_stage *s) {
  ps_link_put64(b, s->id);
  ps_link_put64(b + 8, s->total);
  ps_link_put64(b + 16, s->offset);
}

int ps_link_get_stage(const uint8_t *p, size_t n, uint64_t data, uint64_t max_total,
                      ps_link_stage *s, ps_status *st) {
  if (n != PS_LINK_STAGE_META)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "replication link: a stage header of %zu bytes", n);
  s->id = ps_link_get64(p);
  s->total = ps_link_get64(p + 8);
  s->offset = ps_link_get64(p + 16);
  if (s->id == 0 || s->total == 0 || s->total > max_total)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "replication link: stage %llu of %llu bytes (the limit is %llu)",
                         (unsigned long long)s->id, (unsigned long long)s->total,
                         (unsigned long long)max_total);
  if (s->offset > s->total || data > s->total - s->offset)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "replication link: %llu bytes at %llu of stage %llu, past its "
                         "%llu bytes",
                         (unsigned long long)data, (unsigned long long)s->offset,
                         (unsigned long long)s->id, (unsigned long long)s->total);
  return 0;
}

/* ---- the backup's stages ---- */

static int stage_find(const ps_link_stages *t, uint64_t id) {
  for (int i = 0; i < t->n; i++)
    if (t->v[i].id == id) return i;
  return -1;
}

uint8_t *ps_link_stages_dest(ps_link_stages *t, const ps_link_stage *m, uint64_t data,
                             ps_status *st) {
  int i = stage_find(t, m->id);
  if (i < 0) {
    if (m->offset != 0) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "replication link: stage %llu starts at byte %llu, not 0",
                    (unsigned long long)m->id, (unsigned long long)m->offset);
      return NULL;
    }
    if (t->n == PS_LINK_MAX_STAGES) {
      ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                    "replication link: more than %d stages at once", PS_LINK_MAX_STAGES);
      return NULL;
    }
    ps_buf *b = ps_buf_create((size_t)m->total, false);
    if (b == NULL) {
      ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                    "replication link: cannot allocate stage %llu (%llu bytes)",
                    (unsigned long long)m->id, (unsigned long long)m->total);
      return NULL;
    }
    i = t->n++;
    t->v[i].id = m->id;
    t->v[i].buf = b;
    t->v[i].got = 0;
  }
  if (m->total != t->v[i].buf->size || m->offset != t->v[i].got) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "replication link: stage %llu: %llu bytes at %llu, where %zu of %zu "
                  "came",
                  (unsigned long long)m->id, (unsigned long long)data,
                  (unsigned long long)m->offset, t->v[i].got, t->v[i].buf->size);
    return NULL;
  }
  (void)data; /* (ps_link_get_stage checked it against the total) */
  return (uint8_t *)t->v[i].buf->data + m->offset;
}

void ps_link_stages_got(ps_link_stages *t, uint64_t id, uint64_t data) {
  int i = stage_find(t, id);
  if (i >= 0) t->v[i].got += (size_t)data;
}

static void stage_remove(ps_link_stages *t, int i) {
  t->v[i] = t->v[--t->n];
}

void ps_link_stages_drop(ps_link_stages *t, uint64_t id) {
  int i = stage_find(t, id);
  if (i < 0) return;
  ps_buf_unref(t->v[i].buf);
  stage_remove(t, i);
}

ps_buf *ps_link_stages_take(ps_link_stages *t, uint64_t id, size_t bytes) {
  int i = stage_find(t, id);
  if (i < 0 || t->v[i].got != t->v[i].buf->size || t->v[i].buf->size != bytes)
    return NULL;
  ps_buf *b = t->v[i].buf;
  stage_remove(t, i);
  return b;
}

void ps_link_stages_fini(ps_link_stages *t) {
  for (int i = 0; i < t->n; i++)
    ps_buf_unref(t->v[i].buf);
  t->n = 0;
}
