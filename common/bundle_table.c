/* The SSTable of a bundle's .index file (LevelDB's table format as
 * TensorFlow writes it): block builder, table builder, table reader.  See
 * bundle_format.c for the format. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "bundle.h"
#include "bundle_internal.h"
#include "crc32c.h"
#include "fileio.h"

static void bl_reset(block_builder *bl) {
  bl->buf.n = 0;
  bl->restarts.n = 0;
  ps_bdl_bb_fixed32_(&bl->restarts, 0);
  bl->nrestarts = 1;
  bl->counter = 0;
  bl->last_key.n = 0;
}

static void bl_init(block_builder *bl, int interval) {
  *bl = (block_builder){.interval = interval};
  bl_reset(bl);
}

static void bl_free(block_builder *bl) {
  ps_bdl_bb_free_(&bl->buf);
  ps_bdl_bb_free_(&bl->restarts);
  ps_bdl_bb_free_(&bl->last_key);
}

static bool bl_empty(const block_builder *bl) {
  return bl->buf.n == 0;
}

static size_t bl_size_estimate(const block_builder *bl) {
  return bl->buf.n + 4 * bl->nrestarts + 4;
}

static void bl_add(block_builder *bl, const uint8_t *k, size_t kn, const uint8_t *v,
                   size_t vn) {
  size_t shared = 0;
  if (bl->counter < bl->interval) {
    size_t m = kn < bl->last_key.n ? kn : bl->last_key.n;
    while (shared < m && bl->last_key.p[shared] == k[shared])
      shared++;
  } else {
    ps_bdl_bb_fixed32_(&bl->restarts, (uint32_t)bl->buf.n);
    bl->nrestarts++;
    bl->counter = 0;
  }
  ps_bdl_bb_varint_(&bl->buf, shared);
  ps_bdl_bb_varint_(&bl->buf, kn - shared);
  ps_bdl_bb_varint_(&bl->buf, vn);
  ps_bdl_bb_put_(&bl->buf, k + shared, kn - shared);
  ps_bdl_bb_put_(&bl->buf, v, vn);
  bl->last_key.n = 0;
  ps_bdl_bb_put_(&bl->last_key, k, kn);
  bl->counter++;
}

static void bb_handle(bbuf *b, handle h) {
  ps_bdl_bb_varint_(b, h.offset);
  ps_bdl_bb_varint_(b, h.size);
}

/* Appends the finished block and its trailer to @out (uncompressed, as
 * TensorFlow writes bundles) and resets the builder. */
static handle write_block(bbuf *out, block_builder *bl) {
  ps_bdl_bb_put_(&bl->buf, bl->restarts.p, bl->restarts.n);
  ps_bdl_bb_fixed32_(&bl->buf, (uint32_t)bl->nrestarts);
  if (bl->buf.oom || bl->restarts.oom || bl->last_key.oom) out->oom = true;
  handle h = {out->n, bl->buf.n};
  ps_bdl_bb_put_(out, bl->buf.p, bl->buf.n);
  uint8_t type = 0;
  uint32_t crc = ps_crc32c_extend(ps_crc32c(bl->buf.p, bl->buf.n), &type, 1);
  ps_bdl_bb_byte_(out, type);
  ps_bdl_bb_fixed32_(out, ps_crc32c_mask(crc));
  bl_reset(bl);
  return h;
}

/* Shortens @start to a key >= it and < @limit (bytewise). */
static void shortest_separator(bbuf *start, const uint8_t *limit, size_t ln) {
  size_t m = start->n < ln ? start->n : ln, i = 0;
  while (i < m && start->p[i] == limit[i])
    i++;
  if (i >= m) return; /* one is a prefix of the other */
  uint8_t c = start->p[i];
  if (c < 0xff && c + 1 < limit[i]) {
    start->p[i]++;
    start->n = i + 1;
  }
}

static void short_successor(bbuf *key) {
  for (size_t i = 0; i < key->n; i++) {
    if (key->p[i] != 0xff) {
      key->p[i]++;
      key->n = i + 1;
      return;
    }
  }
}

void ps_bdl_tb_init_(table_builder *tb) {
  *tb = (table_builder){0};
  bl_init(&tb->data, RESTART_INTERVAL);
  bl_init(&tb->index, 1);
}

void ps_bdl_tb_free_(table_builder *tb) {
  ps_bdl_bb_free_(&tb->out);
  bl_free(&tb->data);
  bl_free(&tb->index);
  ps_bdl_bb_free_(&tb->last_key);
}

static void tb_flush(table_builder *tb) {
  if (bl_empty(&tb->data)) return;
  tb->pending_handle = write_block(&tb->out, &tb->data);
  tb->pending = true;
}

static void tb_add_index_entry(table_builder *tb) {
  bbuf h = {0};
  bb_handle(&h, tb->pending_handle);
  bl_add(&tb->index, tb->last_key.p, tb->last_key.n, h.p, h.n);
  if (h.oom) tb->out.oom = true;
  ps_bdl_bb_free_(&h);
  tb->pending = false;
}

/* Keys must come strictly increasing. */
void ps_bdl_tb_add_(table_builder *tb, const uint8_t *k, size_t kn, const uint8_t *v,
                    size_t vn) {
  if (tb->nentries > 0 && kn + vn >= 2 * (size_t)BLOCK_SIZE) tb_flush(tb);
  if (tb->pending) {
    shortest_separator(&tb->last_key, k, kn);
    tb_add_index_entry(tb);
  }
  tb->last_key.n = 0;
  ps_bdl_bb_put_(&tb->last_key, k, kn);
  tb->nentries++;
  bl_add(&tb->data, k, kn, v, vn);
  if (bl_size_estimate(&tb->data) >= BLOCK_SIZE) tb_flush(tb);
}

/* Completes the table in tb->out; false if out of memory. */
bool ps_bdl_tb_finish_(table_builder *tb) {
  tb_flush(tb);
  block_builder meta;
  bl_init(&meta, RESTART_INTERVAL);
  handle mh = write_block(&tb->out, &meta);
  bl_free(&meta);
  if (tb->pending) {
    short_successor(&tb->last_key);
    tb_add_index_entry(tb);
  }
  handle ih = write_block(&tb->out, &tb->index);
  uint8_t footer[FOOTER_SIZE] = {0};
  size_t o = ps_bdl_varint_encode_(footer, mh.offset);
  o += ps_bdl_varint_encode_(footer + o, mh.size);
  o += ps_bdl_varint_encode_(footer + o, ih.offset);
  ps_bdl_varint_encode_(footer + o, ih.size);
  ps_bdl_put_le32_(footer + 40, (uint32_t)TABLE_MAGIC);
  ps_bdl_put_le32_(footer + 44, (uint32_t)(TABLE_MAGIC >> 32));
  ps_bdl_bb_put_(&tb->out, footer, sizeof footer);
  return !(tb->out.oom || tb->last_key.oom || tb->data.buf.oom || tb->index.buf.oom);
}

/* ---- The table: reading ----------------------------------------------- */

static bool decode_handle(const uint8_t **p, const uint8_t *end, handle *h) {
  return ps_bdl_get_varint_(p, end, &h->offset) && ps_bdl_get_varint_(p, end, &h->size);
}

/* Verifies and, if compressed, decompresses the block at @h.  On success
 * *@out points into the file or to *@owned (malloc'd, caller frees). */
static int read_block(const table_src *src, handle h, const char *what,
                      const uint8_t **out, size_t *outn, uint8_t **owned, ps_status *st) {
  *owned = NULL;
  if (h.offset > src->n || h.size > src->n - h.offset ||
      TRAILER_SIZE > src->n - h.offset - h.size)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: %s: extends past the end of the file "
                         "(offset %" PRIu64 ", size %" PRIu64 ", file %zu bytes; "
                         "truncated?)",
                         src->path, what, h.offset, h.size, src->n);
  const uint8_t *b = src->p + h.offset;
  size_t n = (size_t)h.size;
  uint32_t stored = ps_crc32c_unmask(ps_bdl_get_le32_(b + n + 1));
  uint32_t crc = ps_crc32c_extend(ps_crc32c(b, n), b + n, 1);
  if (crc != stored)
    return ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: %s: bad checksum", src->path,
                         what);
  if (b[n] == 0) {
    *out = b;
    *outn = n;
    return 0;
  }
  if (b[n] != 1)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: %s: unknown compression type %u", src->path,
                         what, b[n]);
  size_t ulen;
  /* Snappy expands at most ~21x (a 3-byte copy yields 64 bytes); a larger
   * claim is corruption, so it cannot make us allocate much. */
  if (snappy_validate_compressed_buffer((const char *)b, n) != SNAPPY_OK ||
      snappy_uncompressed_length((const char *)b, n, &ulen) != SNAPPY_OK || ulen / 32 > n)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: %s: corrupted compressed block contents",
                         src->path, what);
  uint8_t *u = malloc(ulen ? ulen : 1);
  if (u == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: %s: out of memory",
                         src->path, what);
  if (snappy_uncompress((const char *)b, n, (char *)u, &ulen) != SNAPPY_OK) {
    free(u);
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: %s: corrupted compressed block contents",
                         src->path, what);
  }
  *out = u;
  *outn = ulen;
  *owned = u;
  return 0;
}

/* Walks the entries of one block, rebuilding prefix-compressed keys in
 * @key. */
static int iter_block(const table_src *src, const char *what, const uint8_t *b, size_t n,
                      bbuf *key, kv_fn *fn, void *arg, ps_status *st) {
  if (n < 4)
    return ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: %s: too short (%zu bytes)",
                         src->path, what, n);
  uint32_t nrestarts = ps_bdl_get_le32_(b + n - 4);
  if (nrestarts > (n - 4) / 4)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: %s: bad restart count %" PRIu32, src->path, what,
                         nrestarts);
  const uint8_t *p = b, *end = b + n - 4 - 4 * (size_t)nrestarts;
  key->n = 0;
  while (p < end) {
    uint64_t shared, unshared, vlen;
    if (!ps_bdl_get_varint_(&p, end, &shared) ||
        !ps_bdl_get_varint_(&p, end, &unshared) || !ps_bdl_get_varint_(&p, end, &vlen) ||
        shared > key->n || unshared > (uint64_t)(end - p) ||
        vlen > (uint64_t)(end - p) - unshared)
      return ps_status_set(st, PS_DATA_LOSS,
                           "checkpoint %s: %s: corrupted entry at offset %td", src->path,
                           what, p - b);
    key->n = (size_t)shared;
    ps_bdl_bb_put_(key, p, (size_t)unshared);
    if (key->oom)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                           src->path);
    p += unshared;
    int rc = fn(arg, key->p, key->n, p, (size_t)vlen, st);
    if (rc != 0) return rc;
    p += vlen;
  }
  return 0;
}

typedef struct data_block_walk {
  const table_src *src;
  size_t block;
  bbuf key;
  kv_fn *fn;
  void *arg;
} data_block_walk;

/* For each index entry: read its data block and walk it. */
static int walk_index_entry(void *arg, const uint8_t *k, size_t kn, const uint8_t *v,
                            size_t vn, ps_status *st) {
  (void)k;
  (void)kn;
  data_block_walk *w = arg;
  char what[32];
  snprintf(what, sizeof what, "block %zu", w->block);
  const uint8_t *p = v;
  handle h;
  if (!decode_handle(&p, v + vn, &h))
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: index block: bad handle for block %zu",
                         w->src->path, w->block);
  const uint8_t *b = NULL;
  size_t n = 0;
  uint8_t *owned = NULL;
  int rc = read_block(w->src, h, what, &b, &n, &owned, st);
  if (rc == 0) rc = iter_block(w->src, what, b, n, &w->key, w->fn, w->arg, st);
  free(owned);
  w->block++;
  return rc;
}

/* Reads the table in @src, calling @fn for every key/value in order after
 * verifying the footer and every block's checksum. */
int ps_bdl_table_read_(const table_src *src, kv_fn *fn, void *arg, ps_status *st) {
  if (src->n < FOOTER_SIZE)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: file too short (%zu bytes) to be an "
                         "sstable (truncated?)",
                         src->path, src->n);
  const uint8_t *f = src->p + src->n - FOOTER_SIZE;
  uint64_t magic = (uint64_t)ps_bdl_get_le32_(f + 40) | (uint64_t)ps_bdl_get_le32_(f + 44)
                                                            << 32;
  if (magic != TABLE_MAGIC)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: not an sstable (bad magic number; "
                         "truncated or not a checkpoint index?)",
                         src->path);
  const uint8_t *p = f;
  handle mh, ih;
  if (!decode_handle(&p, f + 40, &mh) || !decode_handle(&p, f + 40, &ih))
    return ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: bad footer", src->path);
  const uint8_t *b = NULL;
  size_t n = 0;
  uint8_t *owned = NULL;
  /* The metaindex block is always empty in TensorFlow's tables; only its
   * checksum matters. */
  int rc = read_block(src, mh, "metaindex block", &b, &n, &owned, st);
  free(owned);
  if (rc != 0) return rc;
  rc = read_block(src, ih, "index block", &b, &n, &owned, st);
  if (rc != 0) return rc;
  data_block_walk w = {src, 0, {0}, fn, arg};
  bbuf ikey = {0};
  rc = iter_block(src, "index block", b, n, &ikey, walk_index_entry, &w, st);
  ps_bdl_bb_free_(&ikey);
  ps_bdl_bb_free_(&w.key);
  free(owned);
  return rc;
}
