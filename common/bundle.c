/* TensorFlow V2 checkpoints: a reader, a writer and the merge of sharded
 * saves, byte compatible with TensorFlow's BundleWriter/BundleReader.
 *
 * The ps saves its variables with a writer, the coordinator merges the
 * parts of all ps tasks, and restore reads entries (or slices of
 * partitioned variables) by name; TensorFlow tools read what we write and
 * we read what TensorFlow wrote.  Everything read from disk is untrusted:
 * every length and count is checked against the bytes actually there
 * before it is used or allocated, and every checksum is verified.
 *
 * THE FORMAT
 *
 * A bundle with prefix P is P.index plus the data files
 * P.data-SSSSS-of-NNNNN (printf "%s.data-%05d-of-%05d", shard ids from 0).
 *
 * Data files hold tensor bytes back to back, in the order they were added,
 * with no header and no padding.  A fixed-size dtype is stored as its
 * row-major elements in the writer's byte order.  A DT_STRING tensor of n
 * strings is: n varint64 lengths; a fixed32 "length checksum", the masked
 * CRC32C of the lengths each written as a little-endian uint32 (uint64 if
 * the length does not fit); then the string bytes concatenated.  Its entry
 * checksum continues that CRC (unmasked) over the 4 stored checksum bytes
 * and then the string bytes.
 *
 * P.index is a LevelDB table (TensorFlow's fork, no filter blocks):
 *
 *   data block, trailer ... data block, trailer
 *   metaindex block, trailer      always the empty block
 *   index block, trailer          one entry per data block
 *   footer                        48 bytes
 *
 * A trailer is 5 bytes: the compression type (0 none, 1 Snappy raw block
 * format) and the fixed32 masked CRC32C of the stored block bytes followed
 * by that type byte.  The footer is two block handles (varint64 offset,
 * varint64 size excluding the trailer): metaindex, then index; zeros up to
 * byte 40; then the magic 0xdb4775248b80fb57 as two fixed32, low word
 * first.  All fixed-width integers are little-endian.
 *
 * A block is a sequence of entries followed by the restart array and its
 * length (fixed32 each):
 *
 *   entry := varint32 shared, varint32 unshared, varint32 value_len,
 *            key bytes [shared..shared+unshared), value bytes
 *
 * where the key is the previous key's first @shared bytes plus the stored
 * delta.  A restart entry has shared = 0 and its offset listed in the
 * restart array; TensorFlow restarts every 16 entries in data blocks and at
 * every entry in the index block.  The writer cuts a data block when its
 * estimated size (bytes + 4 * restarts + 4) reaches 256 KiB, or before an
 * entry whose key + value is at least 512 KiB.  The index block's key for
 * a data block is the shortest separator between its last key and the
 * next block's first key (the short successor of the last key for the last
 * block), its value the block's handle.  TensorFlow writes uncompressed
 * blocks; Snappy blocks come from older or Google-internal builds.
 *
 * Keys sort bytewise.  The first key is "" whose value is the
 * BundleHeaderProto {1: num_shards, 2: endianness (0 little, 1 big),
 * 3: VersionDef {1: producer = 1, 2: min_consumer, 3: bad_consumers}}.
 * Every other value is a BundleEntryProto {1: dtype, 2: TensorShapeProto
 * {2: repeated Dim {1: size}}, 3: shard_id, 4: offset, 5: size,
 * 6: fixed32 masked crc32c of the stored bytes, 7: repeated
 * TensorSliceProto {1: repeated Extent {1: start, 2: length}}}, serialized
 * in field order with zero scalars omitted and the shape always present.
 *
 * A partitioned tensor saved in slices has one entry under its name with
 * the full shape and the list of slices (an extent without length is the
 * whole dimension), and one ordinary entry per slice under the key
 * OrderedCode(0, name, rank, start0, length0, start1, ...) (numbers as
 * OrderedCode's NumIncreasing and SignedNumIncreasing, a whole dimension as
 * start 0 length -1), which starts with a NUL byte.  Merging N bundles
 * renumbers their data files in first-use order and joins the slice lists
 * of a partitioned tensor.
 *
 * Masked CRC32C (crc32c.h): rotate right by 15 and add 0xa282ead8. */
#include "bundle.h"

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

#include "crc32c.h"
#include "fileio.h"

#define BLOCK_SIZE 262144
#define RESTART_INTERVAL 16
#define TRAILER_SIZE 5
#define FOOTER_SIZE 48
#define TABLE_MAGIC 0xdb4775248b80fb57ull
#define IO_CHUNK ((size_t)1 << 20)  /* reads and writes move at most this: small enough that a
                                        * checksum reads the piece while it is in cache */
#define WRITE_BUF ((size_t)4 << 20) /* the writer's copy buffer */
#define MAX_SHARDS 1000000          /* beyond any real checkpoint */

#define DT_STRING 7
#define DT_RESOURCE 20
#define DT_VARIANT 21

/* Element sizes of every fixed-size TensorFlow dtype, including those the
 * ps does no arithmetic on (quantized types): a checkpoint may hold them. */
static size_t elem_size(int dtype) {
  static const uint8_t sizes[] = {
      [1] = 4,   /* float */
      [2] = 8,   /* double */
      [3] = 4,   /* int32 */
      [4] = 1,   /* uint8 */
      [5] = 2,   /* int16 */
      [6] = 1,   /* int8 */
      [8] = 8,   /* complex64 */
      [9] = 8,   /* int64 */
      [10] = 1,  /* bool */
      [11] = 1,  /* qint8 */
      [12] = 1,  /* quint8 */
      [13] = 4,  /* qint32 */
      [14] = 2,  /* bfloat16 */
      [15] = 2,  /* qint16 */
      [16] = 2,  /* quint16 */
      [17] = 2,  /* uint16 */
      [18] = 16, /* complex128 */
      [19] = 2,  /* half */
      [22] = 4,  /* uint32 */
      [23] = 8,  /* uint64 */
  };
  return dtype > 0 && (size_t)dtype < sizeof sizes ? sizes[dtype] : 0;
}

/* Byte-swap unit: complex numbers swap each half. */
static size_t swap_size(int dtype) {
  size_t s = elem_size(dtype);
  return (dtype == 8 || dtype == 18) ? s / 2 : s;
}

static int host_endianness(void) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return 1;
#else
  return 0;
#endif
}


/* A key for messages: printable bytes as they are, others as \xNN,
 * shortened past 200 bytes. */
static const char *key_str(const char *k, size_t n, char *buf, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 8 < cap; i++) {
    unsigned char c = (unsigned char)k[i];
    if (i == 200) {
      o += (size_t)snprintf(buf + o, cap - o, "...");
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\\')
      buf[o++] = (char)c;
    else
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
  }
  buf[o] = '\0';
  return buf;
}
#define KEYBUF 1024

/* ---- Growable byte buffer --------------------------------------------- */

typedef struct bbuf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
} bbuf;

static void bb_reserve(bbuf *b, size_t more) {
  if (b->oom) return;
  if (more > SIZE_MAX / 2 - b->n) {
    b->oom = true;
    return;
  }
  if (b->n + more <= b->cap) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->n + more)
    cap *= 2;
  uint8_t *np = realloc(b->p, cap);
  if (np == NULL) {
    b->oom = true;
    return;
  }
  b->p = np;
  b->cap = cap;
}

static void bb_put(bbuf *b, const void *p, size_t n) {
  if (n == 0) return;
  bb_reserve(b, n);
  if (b->oom) return;
  memcpy(b->p + b->n, p, n);
  b->n += n;
}

static void bb_byte(bbuf *b, uint8_t c) {
  bb_put(b, &c, 1);
}

static size_t varint_encode(uint8_t *out, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  return n;
}

static void bb_varint(bbuf *b, uint64_t v) {
  uint8_t tmp[10];
  bb_put(b, tmp, varint_encode(tmp, v));
}

static void put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static void bb_fixed32(bbuf *b, uint32_t v) {
  uint8_t tmp[4];
  put_le32(tmp, v);
  bb_put(b, tmp, 4);
}

static void bb_free(bbuf *b) {
  free(b->p);
  *b = (bbuf){0};
}

/* Reads a varint of at most 10 bytes (64 bits) from [*p, end); false if it
 * is cut short or too long. */
static bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t r = 0;
  for (int shift = 0; shift <= 63 && *p < end; shift += 7) {
    uint8_t c = *(*p)++;
    if (shift == 63 && c > 1) return false;
    r |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) {
      *v = r;
      return true;
    }
  }
  return false;
}

/* ---- Protos ------------------------------------------------------------
 *
 * BundleHeaderProto and BundleEntryProto are small and fixed, so they are
 * encoded by hand: that keeps the output byte-identical to protobuf's
 * (fields in number order, proto3 zeros omitted) without generated code,
 * and the decoder checks every length against the bytes it was given.
 * Unknown fields are skipped; a known field with the wrong wire type is
 * corruption. */

static void bb_tag(bbuf *b, uint32_t field, int wire) {
  bb_varint(b, (uint64_t)field << 3 | (uint64_t)wire);
}

static void bb_submsg(bbuf *b, uint32_t field, const bbuf *sub) {
  bb_tag(b, field, 2);
  bb_varint(b, sub->n);
  bb_put(b, sub->p, sub->n);
  if (sub->oom) b->oom = true;
}

static void encode_shape(bbuf *b, const ps_shape *s) {
  bbuf sh = {0};
  for (int i = 0; i < s->rank; i++) {
    bbuf dim = {0};
    if (s->dim[i] != 0) {
      bb_tag(&dim, 1, 0);
      bb_varint(&dim, (uint64_t)s->dim[i]);
    }
    bb_submsg(&sh, 2, &dim);
    bb_free(&dim);
  }
  bb_submsg(b, 2, &sh);
  bb_free(&sh);
}

/* TensorSlice::AsProto: a whole dimension is an empty Extent; otherwise
 * start (if not 0) and length (always: it is in a oneof). */
static void encode_slice(bbuf *b, const ps_bundle_slice *sl) {
  bbuf m = {0};
  for (int i = 0; i < sl->rank; i++) {
    bbuf ext = {0};
    if (sl->length[i] >= 0) {
      if (sl->start[i] != 0) {
        bb_tag(&ext, 1, 0);
        bb_varint(&ext, (uint64_t)sl->start[i]);
      }
      bb_tag(&ext, 2, 0);
      bb_varint(&ext, (uint64_t)sl->length[i]);
    }
    bb_submsg(&m, 1, &ext);
    bb_free(&ext);
  }
  bb_submsg(b, 7, &m);
  bb_free(&m);
}

static void encode_entry(bbuf *b, const ps_bundle_entry *e) {
  if (e->dtype != 0) {
    bb_tag(b, 1, 0);
    bb_varint(b, (uint64_t)(int64_t)e->dtype);
  }
  encode_shape(b, &e->shape);
  if (e->shard_id != 0) {
    bb_tag(b, 3, 0);
    bb_varint(b, (uint64_t)(int64_t)e->shard_id);
  }
  if (e->offset != 0) {
    bb_tag(b, 4, 0);
    bb_varint(b, e->offset);
  }
  if (e->size != 0) {
    bb_tag(b, 5, 0);
    bb_varint(b, e->size);
  }
  if (e->crc32c != 0) {
    bb_tag(b, 6, 5);
    bb_fixed32(b, e->crc32c);
  }
  for (size_t i = 0; i < e->nslices; i++)
    encode_slice(b, &e->slices[i]);
}

/* The header as TensorFlow writes it: num_shards, endianness, and the
 * VersionDef's serialized bytes (producer 1 = "08 01" for a new bundle;
 * a merge keeps the first part's). */
static void encode_header(bbuf *b, int num_shards, int endianness, const uint8_t *version,
                          size_t version_len) {
  if (num_shards != 0) {
    bb_tag(b, 1, 0);
    bb_varint(b, (uint64_t)(int64_t)num_shards);
  }
  if (endianness != 0) {
    bb_tag(b, 2, 0);
    bb_varint(b, (uint64_t)(int64_t)endianness);
  }
  bbuf v = {0};
  bb_put(&v, version, version_len);
  bb_submsg(b, 3, &v);
  bb_free(&v);
}

static const uint8_t new_version[] = {0x08, 0x01}; /* producer = 1 */

typedef struct pfield {
  uint32_t num;
  int wire;
  uint64_t v;       /* wire 0, 1, 5 */
  const uint8_t *p; /* wire 2 */
  size_t n;
} pfield;

/* 1 = a field, 0 = end of message, -1 = malformed. */
static int next_field(const uint8_t **p, const uint8_t *end, pfield *f) {
  if (*p == end) return 0;
  uint64_t tag;
  if (!get_varint(p, end, &tag)) return -1;
  if ((tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) return -1;
  f->num = (uint32_t)(tag >> 3);
  f->wire = (int)(tag & 7);
  switch (f->wire) {
  case 0:
    return get_varint(p, end, &f->v) ? 1 : -1;
  case 1:
    if (end - *p < 8) return -1;
    f->v = (uint64_t)get_le32(*p) | (uint64_t)get_le32(*p + 4) << 32;
    *p += 8;
    return 1;
  case 2:
    if (!get_varint(p, end, &f->v) || f->v > (uint64_t)(end - *p)) return -1;
    f->p = *p;
    f->n = (size_t)f->v;
    *p += f->n;
    return 1;
  case 5:
    if (end - *p < 4) return -1;
    f->v = get_le32(*p);
    *p += 4;
    return 1;
  default: /* groups are not used by these protos */
    return -1;
  }
}

typedef struct header {
  int num_shards;
  int endianness;
  const uint8_t *version; /* points into the decoded bytes */
  size_t version_len;
} header;

/* On error returns -1 with the fault in @why. */
static int decode_version(const uint8_t *p, size_t n, char *why, size_t cap) {
  const uint8_t *end = p + n;
  pfield f;
  int r;
  int64_t producer = 0, min_consumer = 0;
  while ((r = next_field(&p, end, &f)) == 1) {
    if (f.num == 1 && f.wire == 0) {
      producer = (int64_t)f.v;
    } else if (f.num == 2 && f.wire == 0) {
      min_consumer = (int64_t)f.v;
    } else if (f.num == 3 && (f.wire == 0 || f.wire == 2)) {
      const uint8_t *q = f.p, *qe = f.p + (f.wire == 2 ? f.n : 0);
      uint64_t bad = f.v;
      do {
        if (f.wire == 2 && !get_varint(&q, qe, &bad)) {
          snprintf(why, cap, "malformed header version");
          return -1;
        }
        if ((int64_t)bad == 1) {
          snprintf(why, cap,
                   "version 1 of the bundle reader is a bad consumer "
                   "of this checkpoint");
          return -1;
        }
      } while (f.wire == 2 && q < qe);
    } else if (f.num <= 3) {
      r = -1;
      break;
    }
  }
  if (r < 0) {
    snprintf(why, cap, "malformed header version");
    return -1;
  }
  if (producer < 0 || min_consumer > 1) {
    snprintf(why, cap,
             "checkpoint version not supported (producer %" PRId64
             ", min consumer %" PRId64 "; this reader is consumer 1)",
             producer, min_consumer);
    return -1;
  }
  return 0;
}

static int decode_header(const uint8_t *p, size_t n, header *h, char *why, size_t cap) {
  const uint8_t *end = p + n;
  pfield f;
  int r;
  *h = (header){0, 0, NULL, 0};
  bool have_version = false;
  while ((r = next_field(&p, end, &f)) == 1) {
    if (f.num == 1 && f.wire == 0) {
      int64_t v = (int64_t)f.v;
      if (v < 1 || v > MAX_SHARDS) {
        snprintf(why, cap, "header: bad num_shards %" PRId64, v);
        return -1;
      }
      h->num_shards = (int)v;
    } else if (f.num == 2 && f.wire == 0) {
      if (f.v > 1) {
        snprintf(why, cap, "header: bad endianness %" PRIu64, f.v);
        return -1;
      }
      h->endianness = (int)f.v;
    } else if (f.num == 3 && f.wire == 2) {
      if (decode_version(f.p, f.n, why, cap) != 0) return -1;
      h->version = f.p;
      h->version_len = f.n;
      have_version = true;
    } else if (f.num <= 3) {
      r = -1;
      break;
    }
  }
  if (r < 0) {
    snprintf(why, cap, "malformed header");
    return -1;
  }
  if (h->num_shards == 0) {
    snprintf(why, cap, "header: bad num_shards 0");
    return -1;
  }
  if (!have_version) { /* an empty VersionDef: producer 0 */
    h->version = NULL;
    h->version_len = 0;
  }
  return 0;
}

static int decode_shape(const uint8_t *p, size_t n, ps_shape *s, char *why, size_t cap) {
  const uint8_t *end = p + n;
  pfield f, g;
  int r;
  s->rank = 0;
  while ((r = next_field(&p, end, &f)) == 1) {
    if (f.num == 2 && f.wire == 2) {
      if (s->rank == PS_MAX_RANK) {
        snprintf(why, cap, "shape has more than %d dimensions", PS_MAX_RANK);
        return -1;
      }
      int64_t size = 0;
      const uint8_t *q = f.p, *qe = f.p + f.n;
      while ((r = next_field(&q, qe, &g)) == 1) {
        if (g.num == 1 && g.wire == 0)
          size = (int64_t)g.v;
        else if (g.num == 1)
          r = -1;
        if (r < 0) break;
      }
      if (r < 0) break;
      if (size < 0) {
        snprintf(why, cap, "shape has a negative dimension");
        return -1;
      }
      s->dim[s->rank++] = size;
    } else if (f.num == 3 && f.wire == 0) {
      if (f.v != 0) {
        snprintf(why, cap, "shape of unknown rank");
        return -1;
      }
    } else if (f.num <= 3) {
      r = -1;
      break;
    }
  }
  if (r < 0) {
    snprintf(why, cap, "malformed shape");
    return -1;
  }
  if (ps_shape_num_elements(s) < 0) {
    snprintf(why, cap, "shape has too many elements");
    return -1;
  }
  return 0;
}

static int decode_slice(const uint8_t *p, size_t n, ps_bundle_slice *sl, char *why,
                        size_t cap) {
  const uint8_t *end = p + n;
  pfield f, g;
  int r;
  memset(sl, 0, sizeof *sl);
  while ((r = next_field(&p, end, &f)) == 1) {
    if (f.num == 1 && f.wire == 2) {
      if (sl->rank == PS_MAX_RANK) {
        snprintf(why, cap, "slice has more than %d dimensions", PS_MAX_RANK);
        return -1;
      }
      int64_t start = 0, length = -1;
      bool has_length = false;
      const uint8_t *q = f.p, *qe = f.p + f.n;
      while ((r = next_field(&q, qe, &g)) == 1) {
        if (g.num == 1 && g.wire == 0) {
          start = (int64_t)g.v;
        } else if (g.num == 2 && g.wire == 0) {
          length = (int64_t)g.v;
          has_length = true;
        } else if (g.num <= 2) {
          r = -1;
        }
        if (r < 0) break;
      }
      if (r < 0) break;
      if (start < 0 || (has_length && length < 0) || (!has_length && start != 0)) {
        snprintf(why, cap, "bad slice extent (start %" PRId64 ", length %" PRId64 ")",
                 start, length);
        return -1;
      }
      sl->start[sl->rank] = start;
      sl->length[sl->rank] = length;
      sl->rank++;
    } else if (f.num == 1) {
      r = -1;
      break;
    }
  }
  if (r < 0) {
    snprintf(why, cap, "malformed slice");
    return -1;
  }
  return 0;
}

/* True if @sl (rank of @full) lies inside @full. */
static bool slice_inside(const ps_bundle_slice *sl, const ps_shape *full) {
  if (sl->rank != full->rank) return false;
  for (int d = 0; d < sl->rank; d++) {
    if (sl->length[d] < 0) {
      if (sl->length[d] != -1 || sl->start[d] != 0) return false;
      continue;
    }
    if (sl->start[d] < 0 || sl->start[d] > full->dim[d] ||
        sl->length[d] > full->dim[d] - sl->start[d])
      return false;
  }
  return true;
}

/* Fills @e (key fields excepted) from a BundleEntryProto; the slices array
 * is malloc'd into e->slices. */
static int decode_entry(const uint8_t *p, size_t n, ps_bundle_entry *e, char *why,
                        size_t cap) {
  const uint8_t *end = p + n;
  pfield f;
  int r;
  ps_bundle_slice *slices = NULL;
  size_t nslices = 0, slcap = 0;
  e->dtype = 0;
  e->shape.rank = 0;
  e->shard_id = 0;
  e->offset = e->size = 0;
  e->crc32c = 0;
  while ((r = next_field(&p, end, &f)) == 1) {
    if (f.num == 1 && f.wire == 0) {
      if ((int64_t)f.v <= 0 || f.v > INT_MAX) {
        snprintf(why, cap, "bad dtype %" PRId64, (int64_t)f.v);
        goto fail;
      }
      e->dtype = (int)f.v;
    } else if (f.num == 2 && f.wire == 2) {
      if (decode_shape(f.p, f.n, &e->shape, why, cap) != 0) goto fail;
    } else if (f.num == 3 && f.wire == 0) {
      if ((int64_t)f.v < 0 || f.v >= MAX_SHARDS) {
        snprintf(why, cap, "bad shard_id %" PRId64, (int64_t)f.v);
        goto fail;
      }
      e->shard_id = (int)f.v;
    } else if ((f.num == 4 || f.num == 5) && f.wire == 0) {
      if ((int64_t)f.v < 0) {
        snprintf(why, cap, "negative %s", f.num == 4 ? "offset" : "size");
        goto fail;
      }
      if (f.num == 4)
        e->offset = f.v;
      else
        e->size = f.v;
    } else if (f.num == 6 && f.wire == 5) {
      e->crc32c = (uint32_t)f.v;
    } else if (f.num == 7 && f.wire == 2) {
      if (nslices == slcap) {
        slcap = slcap ? 2 * slcap : 1;
        ps_bundle_slice *ns = realloc(slices, slcap * sizeof *ns);
        if (ns == NULL) {
          snprintf(why, cap, "out of memory");
          goto fail;
        }
        slices = ns;
      }
      if (decode_slice(f.p, f.n, &slices[nslices], why, cap) != 0) goto fail;
      nslices++;
    } else if (f.num <= 7) {
      r = -1;
      break;
    }
  }
  if (r < 0) {
    snprintf(why, cap, "malformed entry");
    goto fail;
  }
  if (e->offset > UINT64_MAX - e->size) {
    snprintf(why, cap, "offset + size overflows");
    goto fail;
  }
  for (size_t i = 0; i < nslices; i++) {
    if (!slice_inside(&slices[i], &e->shape)) {
      snprintf(why, cap, "slice %zu does not fit the shape", i);
      goto fail;
    }
  }
  e->slices = slices;
  e->nslices = nslices;
  return 0;
fail:
  free(slices);
  return -1;
}

/* ---- The table: writing ------------------------------------------------
 *
 * The whole index is built in memory (it is small next to the data: about
 * 60 bytes per tensor) and written with one write. */

typedef struct block_builder {
  bbuf buf;
  bbuf restarts; /* fixed32 offsets */
  size_t nrestarts;
  int counter;
  int interval;
  bbuf last_key;
} block_builder;

static void bl_reset(block_builder *bl) {
  bl->buf.n = 0;
  bl->restarts.n = 0;
  bb_fixed32(&bl->restarts, 0);
  bl->nrestarts = 1;
  bl->counter = 0;
  bl->last_key.n = 0;
}

static void bl_init(block_builder *bl, int interval) {
  *bl = (block_builder){.interval = interval};
  bl_reset(bl);
}

static void bl_free(block_builder *bl) {
  bb_free(&bl->buf);
  bb_free(&bl->restarts);
  bb_free(&bl->last_key);
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
    bb_fixed32(&bl->restarts, (uint32_t)bl->buf.n);
    bl->nrestarts++;
    bl->counter = 0;
  }
  bb_varint(&bl->buf, shared);
  bb_varint(&bl->buf, kn - shared);
  bb_varint(&bl->buf, vn);
  bb_put(&bl->buf, k + shared, kn - shared);
  bb_put(&bl->buf, v, vn);
  bl->last_key.n = 0;
  bb_put(&bl->last_key, k, kn);
  bl->counter++;
}

typedef struct handle {
  uint64_t offset, size;
} handle;

static void bb_handle(bbuf *b, handle h) {
  bb_varint(b, h.offset);
  bb_varint(b, h.size);
}

/* Appends the finished block and its trailer to @out (uncompressed, as
 * TensorFlow writes bundles) and resets the builder. */
static handle write_block(bbuf *out, block_builder *bl) {
  bb_put(&bl->buf, bl->restarts.p, bl->restarts.n);
  bb_fixed32(&bl->buf, (uint32_t)bl->nrestarts);
  if (bl->buf.oom || bl->restarts.oom || bl->last_key.oom) out->oom = true;
  handle h = {out->n, bl->buf.n};
  bb_put(out, bl->buf.p, bl->buf.n);
  uint8_t type = 0;
  uint32_t crc = ps_crc32c_extend(ps_crc32c(bl->buf.p, bl->buf.n), &type, 1);
  bb_byte(out, type);
  bb_fixed32(out, ps_crc32c_mask(crc));
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

typedef struct table_builder {
  bbuf out;
  block_builder data, index;
  bbuf last_key;
  size_t nentries;
  bool pending;
  handle pending_handle;
} table_builder;

static void tb_init(table_builder *tb) {
  *tb = (table_builder){0};
  bl_init(&tb->data, RESTART_INTERVAL);
  bl_init(&tb->index, 1);
}

static void tb_free(table_builder *tb) {
  bb_free(&tb->out);
  bl_free(&tb->data);
  bl_free(&tb->index);
  bb_free(&tb->last_key);
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
  bb_free(&h);
  tb->pending = false;
}

/* Keys must come strictly increasing. */
static void tb_add(table_builder *tb, const uint8_t *k, size_t kn, const uint8_t *v,
                   size_t vn) {
  if (tb->nentries > 0 && kn + vn >= 2 * (size_t)BLOCK_SIZE) tb_flush(tb);
  if (tb->pending) {
    shortest_separator(&tb->last_key, k, kn);
    tb_add_index_entry(tb);
  }
  tb->last_key.n = 0;
  bb_put(&tb->last_key, k, kn);
  tb->nentries++;
  bl_add(&tb->data, k, kn, v, vn);
  if (bl_size_estimate(&tb->data) >= BLOCK_SIZE) tb_flush(tb);
}

/* Completes the table in tb->out; false if out of memory. */
static bool tb_finish(table_builder *tb) {
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
  size_t o = varint_encode(footer, mh.offset);
  o += varint_encode(footer + o, mh.size);
  o += varint_encode(footer + o, ih.offset);
  varint_encode(footer + o, ih.size);
  put_le32(footer + 40, (uint32_t)TABLE_MAGIC);
  put_le32(footer + 44, (uint32_t)(TABLE_MAGIC >> 32));
  bb_put(&tb->out, footer, sizeof footer);
  return !(tb->out.oom || tb->last_key.oom || tb->data.buf.oom || tb->index.buf.oom);
}

/* ---- The table: reading ----------------------------------------------- */

typedef struct table_src {
  const char *path; /* for messages */
  const uint8_t *p;
  size_t n;
} table_src;

/* Called for every key/value in order; returns 0 or a status code (@st
 * set). */
typedef int kv_fn(void *arg, const uint8_t *k, size_t kn, const uint8_t *v, size_t vn,
                  ps_status *st);

static bool decode_handle(const uint8_t **p, const uint8_t *end, handle *h) {
  return get_varint(p, end, &h->offset) && get_varint(p, end, &h->size);
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
  uint32_t stored = ps_crc32c_unmask(get_le32(b + n + 1));
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
  uint32_t nrestarts = get_le32(b + n - 4);
  if (nrestarts > (n - 4) / 4)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: %s: bad restart count %" PRIu32, src->path, what,
                         nrestarts);
  const uint8_t *p = b, *end = b + n - 4 - 4 * (size_t)nrestarts;
  key->n = 0;
  while (p < end) {
    uint64_t shared, unshared, vlen;
    if (!get_varint(&p, end, &shared) || !get_varint(&p, end, &unshared) ||
        !get_varint(&p, end, &vlen) || shared > key->n ||
        unshared > (uint64_t)(end - p) || vlen > (uint64_t)(end - p) - unshared)
      return ps_status_set(st, PS_DATA_LOSS,
                           "checkpoint %s: %s: corrupted entry at offset %td", src->path,
                           what, p - b);
    key->n = (size_t)shared;
    bb_put(key, p, (size_t)unshared);
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
static int table_read(const table_src *src, kv_fn *fn, void *arg, ps_status *st) {
  if (src->n < FOOTER_SIZE)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: file too short (%zu bytes) to be an "
                         "sstable (truncated?)",
                         src->path, src->n);
  const uint8_t *f = src->p + src->n - FOOTER_SIZE;
  uint64_t magic = (uint64_t)get_le32(f + 40) | (uint64_t)get_le32(f + 44) << 32;
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
  bb_free(&ikey);
  bb_free(&w.key);
  free(owned);
  return rc;
}

/* ---- Slice keys (TensorFlow's OrderedCode) ----------------------------- */

/* NumIncreasing: a length byte, then the value big-endian without leading
 * zero bytes. */
static void oc_num_increasing(bbuf *b, uint64_t v) {
  uint8_t tmp[9];
  int n = 0;
  for (uint64_t x = v; x != 0; x >>= 8)
    n++;
  tmp[0] = (uint8_t)n;
  for (int i = 0; i < n; i++)
    tmp[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
  bb_put(b, tmp, (size_t)n + 1);
}

/* String: 00 -> 00 ff, ff -> ff 00, then the terminator 00 01. */
static void oc_string(bbuf *b, const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (s[i] == 0x00) {
      bb_byte(b, 0x00);
      bb_byte(b, 0xff);
    } else if (s[i] == 0xff) {
      bb_byte(b, 0xff);
      bb_byte(b, 0x00);
    } else {
      bb_byte(b, s[i]);
    }
  }
  bb_byte(b, 0x00);
  bb_byte(b, 0x01);
}

/* SignedNumIncreasing: one byte 0x80 ^ v for |v| < 64; otherwise the low
 * L bytes of v's 10-byte sign-extended big-endian form, L = 1 + bits/7,
 * with a header of L-1 one bits XORed into the first bytes. */
static void oc_signed_num_increasing(bbuf *b, int64_t v) {
  uint64_t x = v < 0 ? ~(uint64_t)v : (uint64_t)v;
  if (x < 64) {
    bb_byte(b, (uint8_t)(0x80 ^ (uint8_t)v));
    return;
  }
  static const uint8_t hdr[11][2] = {
      {0, 0},    {0x80, 0}, {0xc0, 0}, {0xe0, 0},    {0xf0, 0},    {0xf8, 0},
      {0xfc, 0}, {0xfe, 0}, {0xff, 0}, {0xff, 0x80}, {0xff, 0xc0},
  };
  int bits = 64 - __builtin_clzll(x);
  int len = bits / 7 + 1;
  uint8_t buf[10];
  uint8_t sign = v < 0 ? 0xff : 0x00;
  buf[0] = buf[1] = sign;
  for (int i = 0; i < 8; i++)
    buf[2 + i] = (uint8_t)((uint64_t)v >> (56 - 8 * i));
  uint8_t *begin = buf + 10 - len;
  begin[0] ^= hdr[len][0];
  begin[1] ^= hdr[len][1];
  bb_put(b, begin, (size_t)len);
}

/* The key TensorFlow's EncodeTensorNameSlice gives slice @sl of @name. */
static void encode_slice_key(bbuf *b, const char *name, size_t name_len,
                             const ps_bundle_slice *sl) {
  oc_num_increasing(b, 0);
  oc_string(b, (const uint8_t *)name, name_len);
  oc_num_increasing(b, (uint64_t)sl->rank);
  for (int d = 0; d < sl->rank; d++) {
    bool full = sl->length[d] < 0;
    oc_signed_num_increasing(b, full ? 0 : sl->start[d]);
    oc_signed_num_increasing(b, full ? -1 : sl->length[d]);
  }
}

/* ---- Slices ----------------------------------------------------------- */

/* Normalized extents: [lo, hi) per dimension. */
static void slice_bounds(const ps_bundle_slice *sl, const ps_shape *full, int d,
                         int64_t *lo, int64_t *hi) {
  if (sl->length[d] < 0) {
    *lo = 0;
    *hi = full->dim[d];
  } else {
    *lo = sl->start[d];
    *hi = sl->start[d] + sl->length[d];
  }
}

static void slice_shape(const ps_bundle_slice *sl, const ps_shape *full, ps_shape *out) {
  out->rank = sl->rank;
  for (int d = 0; d < sl->rank; d++) {
    int64_t lo, hi;
    slice_bounds(sl, full, d, &lo, &hi);
    out->dim[d] = hi - lo;
  }
}

static bool slice_is_full(const ps_bundle_slice *sl, const ps_shape *full) {
  ps_shape s;
  slice_shape(sl, full, &s);
  return ps_shape_equal(&s, full);
}

/* Fills @sl from caller arrays, checking it against @full. */
static int make_slice(const ps_shape *full, const int64_t *start, const int64_t *length,
                      ps_bundle_slice *sl, const char *name, ps_status *st) {
  sl->rank = full->rank;
  for (int d = 0; d < full->rank; d++) {
    sl->start[d] = start[d];
    sl->length[d] = length[d];
  }
  if (!slice_inside(sl, full)) {
    char fs[256];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "slice of tensor %s does not fit its shape %s (dimension "
                         "starts and lengths must be >= 0 and inside, or 0 and -1)",
                         name, ps_shape_format(full, fs, sizeof fs));
  }
  return 0;
}

static bool parse_i64(const char **p, int64_t *v) {
  const char *s = *p;
  bool neg = false;
  if (*s == '-') {
    neg = true;
    s++;
  }
  if (*s < '0' || *s > '9') return false;
  uint64_t x = 0;
  while (*s >= '0' && *s <= '9') {
    if (x > (uint64_t)INT64_MAX / 10) return false;
    x = x * 10 + (uint64_t)(*s++ - '0');
    if (x > (uint64_t)INT64_MAX) return false;
  }
  *v = neg ? -(int64_t)x : (int64_t)x;
  *p = s;
  return true;
}

int ps_bundle_parse_shape_and_slice(const char *spec, ps_shape *full,
                                    ps_bundle_slice *slice, bool *sliced, ps_status *st) {
  *sliced = false;
  if (spec == NULL || spec[0] == '\0') return 0;
  /* Tokens separated by single spaces: the dims, then the slice spec. */
  const char *last = strrchr(spec, ' ');
  if (last == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "shape_and_slice \"%s\": expected the full shape and a "
                         "slice separated by spaces",
                         spec);
  ps_shape sh = {0};
  const char *p = spec;
  while (p < last) {
    int64_t v;
    if (sh.rank == PS_MAX_RANK || !parse_i64(&p, &v) || v < 0 || (*p != ' '))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "shape_and_slice \"%s\": bad dimension", spec);
    sh.dim[sh.rank++] = v;
    p++;
  }
  if (ps_shape_num_elements(&sh) < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "shape_and_slice \"%s\": too many elements", spec);
  ps_bundle_slice sl = {.rank = 0};
  p = last + 1;
  for (;;) {
    if (sl.rank == PS_MAX_RANK)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "shape_and_slice \"%s\": too many dimensions", spec);
    if (*p == '-' && (p[1] == ':' || p[1] == '\0')) {
      sl.start[sl.rank] = 0;
      sl.length[sl.rank] = -1;
      p++;
    } else {
      int64_t a, b;
      if (!parse_i64(&p, &a) || *p++ != ',' || !parse_i64(&p, &b))
        return ps_status_set(st, PS_INVALID_ARGUMENT, "shape_and_slice \"%s\": bad slice",
                             spec);
      sl.start[sl.rank] = a;
      sl.length[sl.rank] = b;
    }
    sl.rank++;
    if (*p == '\0') break;
    if (*p++ != ':')
      return ps_status_set(st, PS_INVALID_ARGUMENT, "shape_and_slice \"%s\": bad slice",
                           spec);
  }
  if (sl.rank != sh.rank || !slice_inside(&sl, &sh))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "shape_and_slice \"%s\": the slice does not match the shape",
                         spec);
  *full = sh;
  *slice = sl;
  *sliced = true;
  return 0;
}

char *ps_bundle_data_filename(const char *prefix, int shard, int num_shards, char *buf,
                              size_t n) {
  int r = snprintf(buf, n, "%s.data-%05d-of-%05d", prefix, shard, num_shards);
  return (r < 0 || (size_t)r >= n) ? NULL : buf;
}

/* malloc'd "prefix.data-..." or "prefix" + suffix; NULL if out of memory. */
static char *data_path(const char *prefix, int shard, int num_shards) {
  size_t n = strlen(prefix) + 40;
  char *p = malloc(n);
  if (p) ps_bundle_data_filename(prefix, shard, num_shards, p, n);
  return p;
}

static char *path_cat(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  char *p = malloc(na + nb + 1);
  if (p == NULL) return NULL;
  memcpy(p, a, na);
  memcpy(p + na, b, nb + 1);
  return p;
}

/* "P.tempstate<random decimal>", TensorFlow's temporary names. */
static char *temp_path(const char *path) {
  uint64_t r;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
    r = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&r ^ (uint64_t)time(NULL);
  char suffix[40];
  snprintf(suffix, sizeof suffix, ".tempstate%" PRIu64, r);
  return path_cat(path, suffix);
}


/* mkdir -p */
static int make_dirs(const char *dir) {
  char *d = strdup(dir);
  if (d == NULL) return ENOMEM;
  int err = 0;
  for (char *p = d + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (mkdir(d, 0777) != 0 && errno != EEXIST) {
        err = errno;
        break;
      }
      *p = c;
      if (c == '\0') break;
    }
  }
  free(d);
  return err;
}



/* Writes @p to a new temporary file beside @path (TensorFlow's
 * "P.tempstate<r>" name) and fsyncs it; its name in *@tmp (malloc'd).
 * Returns 0 or an errno (no file left behind). */
static int write_temp(const char *path, const uint8_t *p, size_t n, char **tmp) {
  *tmp = temp_path(path);
  if (*tmp == NULL) return ENOMEM;
  int err = ps_write_file(*tmp, p, n, NULL);
  if (err != 0) {
    free(*tmp);
    *tmp = NULL;
  }
  return err;
}

/* ps_replace_file with TensorFlow's temporary name.  0 or an errno. */
static int write_file_atomic(const char *path, const uint8_t *p, size_t n) {
  char *tmp = temp_path(path);
  if (tmp == NULL) return ENOMEM;
  int err = ps_replace_file(path, tmp, p, n, NULL, NULL);
  free(tmp);
  return err;
}

/* ---- Entry sets ------------------------------------------------------- */

/* Entries by key: an array plus an open-addressing hash of indexes, used
 * by the writer and the merge (the reader keeps its array sorted). */
typedef struct entry_set {
  ps_bundle_entry *e;
  size_t n, cap;
  size_t *slot; /* index + 1, 0 = empty */
  size_t nslot;
} entry_set;

static uint64_t key_hash(const char *k, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) {
    h ^= (uint8_t)k[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static bool key_eq(const ps_bundle_entry *e, const char *k, size_t n) {
  return e->key_len == n && (n == 0 || memcmp(e->key, k, n) == 0);
}

static ps_bundle_entry *es_find(const entry_set *s, const char *k, size_t n) {
  if (s->nslot == 0) return NULL;
  for (size_t i = key_hash(k, n) & (s->nslot - 1);; i = (i + 1) & (s->nslot - 1)) {
    if (s->slot[i] == 0) return NULL;
    ps_bundle_entry *e = &s->e[s->slot[i] - 1];
    if (key_eq(e, k, n)) return e;
  }
}

static void es_index(entry_set *s, size_t idx) {
  const ps_bundle_entry *e = &s->e[idx];
  size_t i = key_hash(e->key, e->key_len) & (s->nslot - 1);
  while (s->slot[i] != 0)
    i = (i + 1) & (s->nslot - 1);
  s->slot[i] = idx + 1;
}

/* Appends a zeroed entry with a copy of key @k (not yet present).  NULL if
 * out of memory. */
static ps_bundle_entry *es_add(entry_set *s, const char *k, size_t n) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    ps_bundle_entry *ne = realloc(s->e, cap * sizeof *ne);
    if (ne == NULL) return NULL;
    s->e = ne;
    s->cap = cap;
  }
  if (2 * (s->n + 1) > s->nslot) {
    size_t nslot = s->nslot ? 2 * s->nslot : 128;
    size_t *ns = calloc(nslot, sizeof *ns);
    if (ns == NULL) return NULL;
    free(s->slot);
    s->slot = ns;
    s->nslot = nslot;
    for (size_t i = 0; i < s->n; i++)
      es_index(s, i);
  }
  char *key = malloc(n + 1);
  if (key == NULL) return NULL;
  if (n) memcpy(key, k, n);
  key[n] = '\0';
  ps_bundle_entry *e = &s->e[s->n];
  *e = (ps_bundle_entry){.key = key, .key_len = n, .is_slice = n > 0 && key[0] == 0};
  es_index(s, s->n++);
  return e;
}

/* Appends @sl to @e's slices; false if out of memory. */
static bool entry_add_slice(ps_bundle_entry *e, const ps_bundle_slice *sl) {
  ps_bundle_slice *ns = realloc((void *)e->slices, (e->nslices + 1) * sizeof *ns);
  if (ns == NULL) return false;
  ns[e->nslices++] = *sl;
  e->slices = ns;
  return true;
}

static void entry_fini(ps_bundle_entry *e) {
  free((void *)e->key);
  free((void *)e->slices);
}

static void es_free(entry_set *s) {
  for (size_t i = 0; i < s->n; i++)
    entry_fini(&s->e[i]);
  free(s->e);
  free(s->slot);
  *s = (entry_set){0};
}

static int cmp_key(const char *a, size_t an, const char *b, size_t bn) {
  size_t m = an < bn ? an : bn;
  int c = m ? memcmp(a, b, m) : 0;
  if (c != 0) return c;
  return an < bn ? -1 : an > bn;
}

static int cmp_entry_ptr(const void *a, const void *b) {
  const ps_bundle_entry *x = *(const ps_bundle_entry *const *)a;
  const ps_bundle_entry *y = *(const ps_bundle_entry *const *)b;
  return cmp_key(x->key, x->key_len, y->key, y->key_len);
}

/* The index table for @s: header first, then the entries sorted by key.
 * False if out of memory. */
static bool build_index(const entry_set *s, int num_shards, int endianness,
                        const uint8_t *version, size_t version_len, bbuf *out) {
  const ps_bundle_entry **sorted = malloc((s->n ? s->n : 1) * sizeof *sorted);
  if (sorted == NULL) return false;
  for (size_t i = 0; i < s->n; i++)
    sorted[i] = &s->e[i];
  qsort(sorted, s->n, sizeof *sorted, cmp_entry_ptr);
  table_builder tb;
  tb_init(&tb);
  bbuf v = {0};
  encode_header(&v, num_shards, endianness, version, version_len);
  tb_add(&tb, (const uint8_t *)"", 0, v.p, v.n);
  for (size_t i = 0; i < s->n && !v.oom; i++) {
    v.n = 0;
    encode_entry(&v, sorted[i]);
    tb_add(&tb, (const uint8_t *)sorted[i]->key, sorted[i]->key_len, v.p, v.n);
  }
  bool ok = !v.oom && tb_finish(&tb);
  bb_free(&v);
  free(sorted);
  if (ok) {
    *out = tb.out;
    tb.out = (bbuf){0};
  }
  tb_free(&tb);
  return ok;
}

/* ---- Writer ----------------------------------------------------------- */

struct ps_bundle_writer {
  char *prefix;
  char *data_tmp;   /* P.data-00000-of-00001.tempstate<r> */
  char *data_final; /* P.data-00000-of-00001 */
  int fd;           /* the temporary data file; -1 when closed */
  uint8_t *buf;     /* data not yet written */
  size_t buf_n;
  uint64_t bytes; /* data file size, buffered bytes included */
  ps_status err;  /* first I/O error: sticky */
  bool finished;
  entry_set set;
  bool (*cancel)(void *arg); /* asked between pieces; true stops */
  void *cancel_arg;
};

static int writer_fail(ps_bundle_writer *w, int e, const char *path, const char *what,
                       ps_status *st) {
  ps_status_set(&w->err, ps_status_code_from_errno(e), "checkpoint %s: %s: %s", path, what, strerror(e));
  if (st) *st = w->err;
  return w->err.code;
}

static int writer_flush(ps_bundle_writer *w, ps_status *st) {
  if (w->cancel && w->cancel(w->cancel_arg)) {
    w->buf_n = 0;
    ps_status_set(&w->err, PS_CANCELLED, "checkpoint %s: cancelled", w->prefix);
    if (st) *st = w->err;
    return w->err.code;
  }
  int e = ps_write_all(w->fd, w->buf, w->buf_n);
  w->buf_n = 0;
  return e ? writer_fail(w, e, w->data_tmp, "write", st) : 0;
}

/* Copies @n bytes into the file buffer, extending *@crc over the copy. */
static int writer_put(ps_bundle_writer *w, const void *data, size_t n, uint32_t *crc,
                      ps_status *st) {
  const uint8_t *p = data;
  while (n > 0) {
    size_t k = WRITE_BUF - w->buf_n;
    if (k > n) k = n;
    memcpy(w->buf + w->buf_n, p, k);
    *crc = ps_crc32c_extend(*crc, w->buf + w->buf_n, k);
    w->buf_n += k;
    w->bytes += k;
    p += k;
    n -= k;
    if (w->buf_n == WRITE_BUF && writer_flush(w, st) != 0) return w->err.code;
  }
  return 0;
}

ps_bundle_writer *ps_bundle_writer_create(const char *prefix, ps_status *st) {
  if (prefix == NULL || prefix[0] == '\0') {
    ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint prefix is empty");
    return NULL;
  }
  ps_bundle_writer *w = calloc(1, sizeof *w);
  if (w == NULL) goto oom;
  w->fd = -1;
  w->prefix = strdup(prefix);
  w->data_final = data_path(prefix, 0, 1);
  w->data_tmp = w->data_final ? temp_path(w->data_final) : NULL;
  w->buf = malloc(WRITE_BUF);
  if (w->prefix == NULL || w->data_tmp == NULL || w->buf == NULL) goto oom;
  char *dir = ps_dir_of(prefix);
  if (dir == NULL) goto oom;
  int e = make_dirs(dir);
  if (e != 0) {
    ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: cannot create directory %s: %s",
                  prefix, dir, strerror(e));
    free(dir);
    goto fail;
  }
  free(dir);
  w->fd = open(w->data_tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (w->fd < 0) {
    e = errno;
    ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: cannot create: %s", w->data_tmp,
                  strerror(e));
    goto fail;
  }
  return w;
oom:
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                prefix ? prefix : "");
fail:
  ps_bundle_writer_destroy(w);
  return NULL;
}

void ps_bundle_writer_set_cancel(ps_bundle_writer *w, bool (*cancel)(void *arg),
                                 void *arg) {
  w->cancel = cancel;
  w->cancel_arg = arg;
}

uint64_t ps_bundle_writer_bytes(const ps_bundle_writer *w) {
  return w->bytes;
}

/* Checks that @key can be added; returns 0 or INVALID_ARGUMENT. */
static int writer_check(ps_bundle_writer *w, const char *key, size_t klen,
                        ps_status *st) {
  if (w->err.code != 0) {
    if (st) *st = w->err;
    return w->err.code;
  }
  if (w->finished)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "checkpoint %s: writer already finished", w->prefix);
  if (klen == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: a tensor key may not be empty", w->prefix);
  if (es_find(&w->set, key, klen) != NULL) {
    char kb[KEYBUF];
    return ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint %s: tensor %s added twice",
                         w->prefix, key_str(key, klen, kb, sizeof kb));
  }
  return 0;
}

static int writer_oom(ps_bundle_writer *w, ps_status *st) {
  ps_status_set(&w->err, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                w->prefix);
  if (st) *st = w->err;
  return w->err.code;
}

static int check_shape(const char *prefix, const char *name, const ps_shape *shape,
                       ps_status *st) {
  if (shape == NULL || shape->rank < 0 || shape->rank > PS_MAX_RANK ||
      ps_shape_num_elements(shape) < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s: invalid shape", prefix, name);
  return 0;
}

/* Writes a fixed-size tensor under @key (already checked). */
static int writer_add_raw(ps_bundle_writer *w, const char *key, size_t klen, int dtype,
                          const ps_shape *shape, const void *data, size_t nbytes,
                          ps_status *st) {
  uint64_t offset = w->bytes;
  uint32_t crc = 0;
  if (writer_put(w, data, nbytes, &crc, st) != 0) return w->err.code;
  ps_bundle_entry *e = es_add(&w->set, key, klen);
  if (e == NULL) return writer_oom(w, st);
  e->dtype = dtype;
  e->shape = *shape;
  e->offset = offset;
  e->size = nbytes;
  e->crc32c = ps_crc32c_mask(crc);
  return 0;
}

static int check_fixed(const char *prefix, const char *name, int dtype,
                       const ps_shape *shape, size_t nbytes, ps_status *st) {
  size_t es = elem_size(dtype);
  if (es == 0)
    return ps_status_set(st, dtype == DT_STRING ? PS_INVALID_ARGUMENT : PS_UNIMPLEMENTED,
                         "checkpoint %s: tensor %s: dtype %d is not a fixed-size "
                         "type%s",
                         prefix, name, dtype,
                         dtype == DT_STRING ? " (use ps_bundle_writer_add_strings)" : "");
  int rc = check_shape(prefix, name, shape, st);
  if (rc != 0) return rc;
  uint64_t n = (uint64_t)ps_shape_num_elements(shape);
  if (n > SIZE_MAX / es || n * es != nbytes) {
    char sb[256];
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s: %zu bytes given for dtype %s "
                         "shape %s",
                         prefix, name, nbytes, ps_dtype_name(dtype),
                         ps_shape_format(shape, sb, sizeof sb));
  }
  return 0;
}

int ps_bundle_writer_add(ps_bundle_writer *w, const char *key, int dtype,
                         const ps_shape *shape, const void *data, size_t nbytes,
                         ps_status *st) {
  size_t klen = key ? strlen(key) : 0;
  int rc = writer_check(w, key, klen, st);
  if (rc != 0) return rc;
  rc = check_fixed(w->prefix, key, dtype, shape, nbytes, st);
  if (rc != 0) return rc;
  return writer_add_raw(w, key, klen, dtype, shape, data, nbytes, st);
}

int ps_bundle_writer_add_strings(ps_bundle_writer *w, const char *key,
                                 const ps_shape *shape, const char *const *strs,
                                 const size_t *lens, ps_status *st) {
  size_t klen = key ? strlen(key) : 0;
  int rc = writer_check(w, key, klen, st);
  if (rc != 0) return rc;
  if ((rc = check_shape(w->prefix, key, shape, st)) != 0) return rc;
  size_t n = (size_t)ps_shape_num_elements(shape);
  /* The lengths as varints, checksummed as uint32 (uint64 if bigger). */
  bbuf v = {0};
  uint32_t crc = 0;
  uint64_t size = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t len = lens ? lens[i] : strlen(strs[i]);
    bb_varint(&v, len);
    uint8_t le[8];
    for (int j = 0; j < 8; j++)
      le[j] = (uint8_t)(len >> (8 * j));
    crc = ps_crc32c_extend(crc, le, len <= UINT32_MAX ? 4 : 8);
    size += len;
  }
  if (v.oom) {
    bb_free(&v);
    return writer_oom(w, st);
  }
  uint64_t offset = w->bytes;
  uint32_t ignored = 0;
  uint8_t lc[4];
  put_le32(lc, ps_crc32c_mask(crc));
  rc = writer_put(w, v.p, v.n, &ignored, st);
  if (rc == 0) rc = writer_put(w, lc, 4, &crc, st);
  for (size_t i = 0; i < n && rc == 0; i++)
    rc = writer_put(w, strs[i], lens ? lens[i] : strlen(strs[i]), &crc, st);
  size += v.n + 4;
  bb_free(&v);
  if (rc != 0) return rc;
  ps_bundle_entry *e = es_add(&w->set, key, klen);
  if (e == NULL) return writer_oom(w, st);
  e->dtype = DT_STRING;
  e->shape = *shape;
  e->offset = offset;
  e->size = size;
  e->crc32c = ps_crc32c_mask(crc);
  return 0;
}

static bool slices_overlap(const ps_bundle_slice *a, const ps_bundle_slice *b,
                           const ps_shape *full) {
  for (int d = 0; d < full->rank; d++) {
    int64_t alo, ahi, blo, bhi;
    slice_bounds(a, full, d, &alo, &ahi);
    slice_bounds(b, full, d, &blo, &bhi);
    if (ahi <= blo || bhi <= alo) return false;
  }
  return true;
}

int ps_bundle_writer_add_slice(ps_bundle_writer *w, const char *full_name, int dtype,
                               const ps_shape *full_shape, const int64_t *start,
                               const int64_t *length, const void *data, size_t nbytes,
                               ps_status *st) {
  size_t nlen = full_name ? strlen(full_name) : 0;
  ps_bundle_slice sl;
  ps_shape ss;
  if (w->err.code != 0) {
    if (st) *st = w->err;
    return w->err.code;
  }
  if (nlen == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: a tensor key may not be empty", w->prefix);
  int rc = check_shape(w->prefix, full_name, full_shape, st);
  if (rc == 0) rc = make_slice(full_shape, start, length, &sl, full_name, st);
  if (rc != 0) return rc;
  slice_shape(&sl, full_shape, &ss);
  if (slice_is_full(&sl, full_shape))
    return ps_bundle_writer_add(w, full_name, dtype, full_shape, data, nbytes, st);
  if (full_shape->rank == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s: a scalar cannot be sliced", w->prefix,
                         full_name);
  if ((rc = check_fixed(w->prefix, full_name, dtype, &ss, nbytes, st)) != 0) return rc;
  ps_bundle_entry *full = es_find(&w->set, full_name, nlen);
  if (full != NULL) {
    if (full->nslices == 0 || full->dtype != dtype ||
        !ps_shape_equal(&full->shape, full_shape))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "checkpoint %s: tensor %s added twice (as a whole tensor "
                           "or with another dtype or shape)",
                           w->prefix, full_name);
    for (size_t i = 0; i < full->nslices; i++)
      if (slices_overlap(&full->slices[i], &sl, full_shape))
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "checkpoint %s: tensor %s: slice %zu overlaps one "
                             "added before",
                             w->prefix, full_name, full->nslices);
  }
  bbuf key = {0};
  encode_slice_key(&key, full_name, nlen, &sl);
  if (key.oom) return writer_oom(w, st);
  if (es_find(&w->set, (const char *)key.p, key.n) != NULL) { /* an empty slice */
    bb_free(&key);
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s: the same slice added twice",
                         w->prefix, full_name);
  }
  rc = writer_add_raw(w, (const char *)key.p, key.n, dtype, &ss, data, nbytes, st);
  bb_free(&key);
  if (rc != 0) return rc;
  if (full == NULL) {
    full = es_add(&w->set, full_name, nlen);
    if (full == NULL) return writer_oom(w, st);
    full->dtype = dtype;
    full->shape = *full_shape;
  }
  if (!entry_add_slice(full, &sl)) return writer_oom(w, st);
  return 0;
}

int ps_bundle_writer_finish(ps_bundle_writer *w, ps_status *st) {
  if (w->err.code != 0) {
    if (st) *st = w->err;
    return w->err.code;
  }
  if (w->finished)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "checkpoint %s: writer already finished", w->prefix);
  if (writer_flush(w, st) != 0) return w->err.code;
  if (fdatasync(w->fd) != 0) return writer_fail(w, errno, w->data_tmp, "fdatasync", st);
  int fd = w->fd;
  w->fd = -1;
  if (close(fd) != 0) return writer_fail(w, errno, w->data_tmp, "close", st);
  if (rename(w->data_tmp, w->data_final) != 0)
    return writer_fail(w, errno, w->data_final, "rename", st);
  w->finished = true; /* the temporary data file is gone */
  bbuf idx = {0};
  if (!build_index(&w->set, 1, host_endianness(), new_version, sizeof new_version, &idx))
    return writer_oom(w, st);
  char *path = path_cat(w->prefix, ".index");
  if (path == NULL) {
    bb_free(&idx);
    return writer_oom(w, st);
  }
  int e = write_file_atomic(path, idx.p, idx.n);
  bb_free(&idx);
  if (e != 0) {
    writer_fail(w, e, path, "write", st);
    free(path);
    return w->err.code;
  }
  free(path);
  return 0;
}

void ps_bundle_writer_destroy(ps_bundle_writer *w) {
  if (w == NULL) return;
  if (w->fd >= 0) close(w->fd);
  if (!w->finished && w->data_tmp) unlink(w->data_tmp);
  es_free(&w->set);
  free(w->buf);
  free(w->prefix);
  free(w->data_tmp);
  free(w->data_final);
  free(w);
}

/* ---- Reader ----------------------------------------------------------- */

typedef struct shard {
  char *path;
  int fd; /* -1 until first use */
  uint64_t size;
  struct timespec mtime, ctime; /* when opened: to see whether it changed */
} shard;

struct ps_bundle_reader {
  char *prefix;
  char *index_path;
  int num_shards;
  int endianness;
  uint8_t *version;
  size_t version_len;
  entry_set set;      /* sorted by key; no hash */
  pthread_mutex_t mu; /* guards opening shards */
  shard *shards;
};

typedef struct load_state {
  ps_bundle_reader *r;
  bool have_header;
} load_state;

static int load_kv(void *arg, const uint8_t *k, size_t kn, const uint8_t *v, size_t vn,
                   ps_status *st) {
  load_state *ls = arg;
  ps_bundle_reader *r = ls->r;
  char why[256], kb[KEYBUF];
  if (!ls->have_header) {
    if (kn != 0)
      return ps_status_set(st, PS_DATA_LOSS,
                           "checkpoint %s: the first entry is not the bundle header",
                           r->index_path);
    header h;
    if (decode_header(v, vn, &h, why, sizeof why) != 0)
      return ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: %s", r->index_path, why);
    r->num_shards = h.num_shards;
    r->endianness = h.endianness;
    r->version = malloc(h.version_len ? h.version_len : 1);
    if (r->version == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                           r->index_path);
    if (h.version_len) memcpy(r->version, h.version, h.version_len);
    r->version_len = h.version_len;
    ls->have_header = true;
    return 0;
  }
  entry_set *s = &r->set;
  if (kn == 0 || (s->n > 0 && cmp_key(s->e[s->n - 1].key, s->e[s->n - 1].key_len,
                                      (const char *)k, kn) >= 0))
    return ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: entry %s: keys out of order",
                         r->index_path, key_str((const char *)k, kn, kb, sizeof kb));
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    ps_bundle_entry *ne = realloc(s->e, cap * sizeof *ne);
    if (ne == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                           r->index_path);
    s->e = ne;
    s->cap = cap;
  }
  ps_bundle_entry *e = &s->e[s->n];
  *e = (ps_bundle_entry){0};
  if (decode_entry(v, vn, e, why, sizeof why) != 0)
    return ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: entry %s: %s", r->index_path,
                         key_str((const char *)k, kn, kb, sizeof kb), why);
  if (e->shard_id >= r->num_shards) {
    free((void *)e->slices);
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: entry %s: shard_id %d but the bundle has %d "
                         "shard(s)",
                         r->index_path, key_str((const char *)k, kn, kb, sizeof kb),
                         e->shard_id, r->num_shards);
  }
  char *key = malloc(kn + 1);
  if (key == NULL) {
    free((void *)e->slices);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         r->index_path);
  }
  memcpy(key, k, kn);
  key[kn] = '\0';
  e->key = key;
  e->key_len = kn;
  e->is_slice = k[0] == 0;
  s->n++;
  return 0;
}

/* Reads all of @path; 0 or an errno. */
static int slurp(const char *path, uint8_t **out, size_t *outn) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return e;
  }
  size_t cap = (size_t)sb.st_size, n = 0;
  uint8_t *p = malloc(cap ? cap : 1);
  if (p == NULL) {
    close(fd);
    return ENOMEM;
  }
  while (n < cap) {
    ssize_t r = read(fd, p + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(p);
      close(fd);
      return e;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  *out = p;
  *outn = n;
  return 0;
}

ps_bundle_reader *ps_bundle_reader_open(const char *prefix, ps_status *st) {
  if (prefix == NULL || prefix[0] == '\0') {
    ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint prefix is empty");
    return NULL;
  }
  ps_bundle_reader *r = calloc(1, sizeof *r);
  uint8_t *file = NULL;
  if (r == NULL) goto oom;
  pthread_mutex_init(&r->mu, NULL);
  r->prefix = strdup(prefix);
  r->index_path = path_cat(prefix, ".index");
  if (r->prefix == NULL || r->index_path == NULL) goto oom;
  size_t n = 0;
  int e = slurp(r->index_path, &file, &n);
  if (e != 0) {
    ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: %s", r->index_path,
                  e == ENOENT ? "not found" : strerror(e));
    goto fail;
  }
  table_src src = {r->index_path, file, n};
  load_state ls = {r, false};
  if (table_read(&src, load_kv, &ls, st) != 0) goto fail;
  if (!ls.have_header) {
    ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: no bundle header", r->index_path);
    goto fail;
  }
  free(file);
  file = NULL;
  r->shards = calloc((size_t)r->num_shards, sizeof *r->shards);
  if (r->shards == NULL) goto oom;
  for (int i = 0; i < r->num_shards; i++)
    r->shards[i].fd = -1;
  return r;
oom:
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                prefix ? prefix : "");
fail:
  free(file);
  ps_bundle_reader_close(r);
  return NULL;
}

void ps_bundle_reader_close(ps_bundle_reader *r) {
  if (r == NULL) return;
  if (r->shards) {
    for (int i = 0; i < r->num_shards; i++) {
      if (r->shards[i].fd >= 0) close(r->shards[i].fd);
      free(r->shards[i].path);
    }
    free(r->shards);
  }
  es_free(&r->set);
  pthread_mutex_destroy(&r->mu);
  free(r->version);
  free(r->prefix);
  free(r->index_path);
  free(r);
}

const char *ps_bundle_reader_prefix(const ps_bundle_reader *r) {
  return r->prefix;
}
int ps_bundle_reader_num_shards(const ps_bundle_reader *r) {
  return r->num_shards;
}
size_t ps_bundle_reader_count(const ps_bundle_reader *r) {
  return r->set.n;
}

const ps_bundle_entry *ps_bundle_reader_entry(const ps_bundle_reader *r, size_t i) {
  return i < r->set.n ? &r->set.e[i] : NULL;
}

static const ps_bundle_entry *find_key(const ps_bundle_reader *r, const char *k,
                                       size_t n) {
  size_t lo = 0, hi = r->set.n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const ps_bundle_entry *e = &r->set.e[mid];
    int c = cmp_key(e->key, e->key_len, k, n);
    if (c == 0) return e;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

const ps_bundle_entry *ps_bundle_reader_find(const ps_bundle_reader *r, const char *key) {
  return key ? find_key(r, key, strlen(key)) : NULL;
}

static int not_found(const ps_bundle_reader *r, const char *key, ps_status *st) {
  return ps_status_set(st, PS_NOT_FOUND, "Key %s not found in checkpoint %s", key,
                       r->prefix);
}

/* Opens @e's data file if needed and checks that @e lies inside it. */
static int entry_shard(ps_bundle_reader *r, const ps_bundle_entry *e, shard **out,
                       ps_status *st) {
  shard *sh = &r->shards[e->shard_id];
  int rc = 0;
  pthread_mutex_lock(&r->mu);
  if (sh->fd < 0) {
    if (sh->path == NULL) sh->path = data_path(r->prefix, e->shard_id, r->num_shards);
    if (sh->path == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         r->prefix);
    } else {
      int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
      struct stat sb;
      if (fd < 0 || fstat(fd, &sb) != 0) {
        int err = errno;
        if (fd >= 0) close(fd);
        rc = ps_status_set(
            st, err == ENOENT ? PS_NOT_FOUND : ps_status_code_from_errno(err), "checkpoint %s: %s (%s)",
            sh->path, err == ENOENT ? "missing data shard" : "cannot open data shard",
            strerror(err));
      } else {
        sh->fd = fd;
        sh->size = (uint64_t)sb.st_size;
        sh->mtime = sb.st_mtim;
        sh->ctime = sb.st_ctim;
      }
    }
  }
  pthread_mutex_unlock(&r->mu);
  if (rc != 0) return rc;
  if (e->offset > sh->size || e->size > sh->size - e->offset) {
    char kb[KEYBUF];
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: tensor %s: entry past the end of its shard "
                         "(offset %" PRIu64 " + size %" PRIu64 " > file size %" PRIu64
                         "; truncated?)",
                         sh->path, key_str(e->key, e->key_len, kb, sizeof kb), e->offset,
                         e->size, sh->size);
  }
  *out = sh;
  return 0;
}

/* Reads @e's @e->size bytes into @dst (NULL: through a scratch buffer, for
 * checking only) and returns their CRC in *@crc. */
static int read_range(ps_bundle_reader *r, const ps_bundle_entry *e, uint8_t *dst,
                      uint32_t *crc, ps_status *st) {
  shard *sh;
  int rc = entry_shard(r, e, &sh, st);
  if (rc != 0) return rc;
  uint8_t *scratch = NULL;
  if (dst == NULL && e->size > 0) {
    scratch = malloc(e->size < IO_CHUNK ? (size_t)e->size : IO_CHUNK);
    if (scratch == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                           sh->path);
  }
  uint32_t c = 0;
  uint64_t done = 0;
  while (done < e->size) {
    size_t want = e->size - done < IO_CHUNK ? (size_t)(e->size - done) : IO_CHUNK;
    uint8_t *p = dst ? dst + done : scratch;
    ssize_t got = pread(sh->fd, p, want, (off_t)(e->offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int err = got < 0 ? errno : 0;
      char kb[KEYBUF];
      free(scratch);
      return ps_status_set(st, err ? ps_status_code_from_errno(err) : PS_DATA_LOSS,
                           "checkpoint %s: tensor %s: %s", sh->path,
                           key_str(e->key, e->key_len, kb, sizeof kb),
                           err ? strerror(err) : "unexpected end of file");
    }
    c = ps_crc32c_extend(c, p, (size_t)got);
    done += (uint64_t)got;
  }
  free(scratch);
  *crc = c;
  return 0;
}

static int checksum_mismatch(ps_bundle_reader *r, const ps_bundle_entry *e,
                             const char *what, uint32_t stored, uint32_t computed,
                             ps_status *st) {
  char kb[KEYBUF];
  return ps_status_set(st, PS_DATA_LOSS,
                       "checkpoint %s: tensor %s: %s mismatch (stored 0x%08" PRIx32
                       ", computed 0x%08" PRIx32 ")",
                       r->shards[e->shard_id].path,
                       key_str(e->key, e->key_len, kb, sizeof kb), what, stored,
                       computed);
}

static void swap_bytes(uint8_t *p, size_t n, size_t unit) {
  if (unit <= 1) return;
  for (size_t i = 0; i + unit <= n; i += unit)
    for (size_t a = 0, b = unit - 1; a < b; a++, b--) {
      uint8_t t = p[i + a];
      p[i + a] = p[i + b];
      p[i + b] = t;
    }
}

/* Checks that plain fixed-size entry @e holds what its shape says and that
 * it lies inside its shard, without reading it. */
static int check_fixed_entry(ps_bundle_reader *r, const ps_bundle_entry *e,
                             uint64_t *nbytes, ps_status *st) {
  char kb[KEYBUF];
  size_t es = elem_size(e->dtype);
  if (es == 0)
    return ps_status_set(st,
                         e->dtype == DT_STRING ? PS_INVALID_ARGUMENT : PS_UNIMPLEMENTED,
                         "checkpoint %s: tensor %s: dtype %s (%d) is not a "
                         "fixed-size type",
                         r->index_path, key_str(e->key, e->key_len, kb, sizeof kb),
                         ps_dtype_enum_name(e->dtype), e->dtype);
  uint64_t n = (uint64_t)ps_shape_num_elements(&e->shape);
  if (n > UINT64_MAX / es || n * es != e->size)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: tensor %s: invalid size in bundle entry "
                         "(stored %" PRIu64 " bytes, the shape needs %" PRIu64 ")",
                         r->index_path, key_str(e->key, e->key_len, kb, sizeof kb),
                         e->size, n > UINT64_MAX / es ? UINT64_MAX : n * es);
  shard *sh;
  int rc = entry_shard(r, e, &sh, st);
  if (rc != 0) return rc;
  *nbytes = e->size;
  return 0;
}

/* Reads plain fixed-size entry @e into @dst (exactly its bytes). */
static int read_fixed(ps_bundle_reader *r, const ps_bundle_entry *e, void *dst,
                      ps_status *st) {
  uint64_t n;
  uint32_t crc;
  int rc = check_fixed_entry(r, e, &n, st);
  if (rc == 0) rc = read_range(r, e, dst, &crc, st);
  if (rc != 0) return rc;
  if (crc != ps_crc32c_unmask(e->crc32c))
    return checksum_mismatch(r, e, "data checksum", ps_crc32c_unmask(e->crc32c), crc, st);
  if (r->endianness != host_endianness()) swap_bytes(dst, (size_t)n, swap_size(e->dtype));
  return 0;
}

/* Copies the box [lo, hi) (full-tensor coordinates) from @src, holding the
 * region starting at @slo with dims @sdim row-major, into @dst, holding the
 * region at @dlo with dims @ddim. */
static void copy_box(int rank, size_t es, const int64_t *lo, const int64_t *hi,
                     const uint8_t *src, const int64_t *slo, const int64_t *sdim,
                     uint8_t *dst, const int64_t *dlo, const int64_t *ddim) {
  if (rank == 0) {
    memcpy(dst, src, es);
    return;
  }
  for (int d = 0; d < rank; d++)
    if (hi[d] <= lo[d]) return;
  int64_t sstride[PS_MAX_RANK], dstride[PS_MAX_RANK], idx[PS_MAX_RANK];
  sstride[rank - 1] = dstride[rank - 1] = 1;
  for (int d = rank - 2; d >= 0; d--) {
    sstride[d] = sstride[d + 1] * sdim[d + 1];
    dstride[d] = dstride[d + 1] * ddim[d + 1];
  }
  for (int d = 0; d < rank; d++)
    idx[d] = lo[d];
  size_t run = (size_t)(hi[rank - 1] - lo[rank - 1]) * es;
  for (;;) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < rank; d++) {
      so += (idx[d] - slo[d]) * sstride[d];
      doff += (idx[d] - dlo[d]) * dstride[d];
    }
    memcpy(dst + (size_t)doff * es, src + (size_t)so * es, run);
    int d = rank - 2;
    while (d >= 0) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      d--;
    }
    if (d < 0) break;
  }
}

typedef struct box {
  int64_t lo[PS_MAX_RANK], hi[PS_MAX_RANK], dim[PS_MAX_RANK];
} box;

static void make_box(const ps_bundle_slice *sl, const ps_shape *full, box *b) {
  for (int d = 0; d < full->rank; d++) {
    slice_bounds(sl, full, d, &b->lo[d], &b->hi[d]);
    b->dim[d] = b->hi[d] - b->lo[d];
  }
}

/* Intersection of @a and @b in @out; its element count. */
static int64_t intersect(const box *a, const box *b, int rank, box *out) {
  int64_t vol = 1;
  for (int d = 0; d < rank; d++) {
    out->lo[d] = a->lo[d] > b->lo[d] ? a->lo[d] : b->lo[d];
    out->hi[d] = a->hi[d] < b->hi[d] ? a->hi[d] : b->hi[d];
    out->dim[d] = out->hi[d] > out->lo[d] ? out->hi[d] - out->lo[d] : 0;
    vol *= out->dim[d];
  }
  return vol;
}

static char *slice_spec(const ps_bundle_slice *sl, char *buf, size_t n) {
  size_t o = 0;
  buf[0] = '\0';
  for (int d = 0; d < sl->rank && o < n; d++) {
    const char *sep = d ? ":" : "";
    if (sl->length[d] < 0)
      o += (size_t)snprintf(buf + o, n - o, "%s-", sep);
    else
      o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64 ",%" PRId64, sep, sl->start[d],
                            sl->length[d]);
  }
  return buf;
}

/* Reads slice @t of tensor @e into @dst.  Checks everything (sizes, shard
 * bounds, coverage) before reading anything; with @dst NULL only checks,
 * so a caller can allocate knowing the bytes are really there. */
static int read_slice_impl(ps_bundle_reader *r, const ps_bundle_entry *e,
                           const ps_bundle_slice *t, uint8_t *dst, ps_status *st) {
  const ps_shape *full = &e->shape;
  int rank = full->rank;
  size_t es = elem_size(e->dtype);
  box tb;
  make_box(t, full, &tb);
  char kb[KEYBUF], sb[512];
  uint64_t n;
  int rc;
  if (e->nslices == 0) {
    if ((rc = check_fixed_entry(r, e, &n, st)) != 0 || dst == NULL) return rc;
    if (slice_is_full(t, full)) return read_fixed(r, e, dst, st);
    uint8_t *tmp = malloc(n ? (size_t)n : 1);
    if (tmp == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                           r->prefix);
    rc = read_fixed(r, e, tmp, st);
    if (rc == 0) {
      int64_t zero[PS_MAX_RANK] = {0};
      copy_box(rank, es, tb.lo, tb.hi, tmp, zero, full->dim, dst, tb.lo, tb.dim);
    }
    free(tmp);
    return rc;
  }
  if (es == 0)
    return ps_status_set(st, PS_UNIMPLEMENTED,
                         "checkpoint %s: tensor %s: partitioned tensors of dtype %s "
                         "are not supported",
                         r->index_path, key_str(e->key, e->key_len, kb, sizeof kb),
                         ps_dtype_enum_name(e->dtype));
  size_t *use = malloc(e->nslices * sizeof *use);
  if (use == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         r->prefix);
  size_t nuse = 0;
  int64_t covered = 0;
  box sbox, ibox, jbox, x;
  for (size_t i = 0; i < e->nslices; i++) {
    make_box(&e->slices[i], full, &sbox);
    int64_t v = intersect(&sbox, &tb, rank, &ibox);
    if (v == 0) continue;
    for (size_t j = 0; j < nuse; j++) {
      make_box(&e->slices[use[j]], full, &jbox);
      if (intersect(&sbox, &jbox, rank, &x) != 0) {
        size_t other = use[j];
        free(use);
        return ps_status_set(st, PS_DATA_LOSS,
                             "checkpoint %s: tensor %s: stored slices %zu and %zu "
                             "overlap",
                             r->index_path, key_str(e->key, e->key_len, kb, sizeof kb),
                             other, i);
      }
    }
    use[nuse++] = i;
    covered += v;
  }
  int64_t want = 1;
  for (int d = 0; d < rank; d++)
    want *= tb.dim[d];
  rc = 0;
  if (covered != want)
    rc = ps_status_set(st, PS_NOT_FOUND,
                       "checkpoint %s: tensor %s: the stored slices do not cover "
                       "slice %s",
                       r->prefix, key_str(e->key, e->key_len, kb, sizeof kb),
                       slice_spec(t, sb, sizeof sb));
  /* Every contributing slice entry must exist, match and be in its file. */
  bbuf key = {0};
  for (size_t k = 0; k < nuse && rc == 0; k++) {
    const ps_bundle_slice *sl = &e->slices[use[k]];
    key.n = 0;
    encode_slice_key(&key, e->key, e->key_len, sl);
    const ps_bundle_entry *se = key.oom ? NULL : find_key(r, (const char *)key.p, key.n);
    ps_shape ss;
    slice_shape(sl, full, &ss);
    if (se == NULL || se->nslices != 0 || se->dtype != e->dtype ||
        !ps_shape_equal(&se->shape, &ss))
      rc = ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: tensor %s: slice %s is %s",
                         r->index_path, key_str(e->key, e->key_len, kb, sizeof kb),
                         slice_spec(sl, sb, sizeof sb),
                         se ? "stored with another dtype or shape" : "missing");
    else
      rc = check_fixed_entry(r, se, &n, st);
  }
  for (size_t k = 0; k < nuse && rc == 0 && dst != NULL; k++) {
    const ps_bundle_slice *sl = &e->slices[use[k]];
    key.n = 0;
    encode_slice_key(&key, e->key, e->key_len, sl);
    const ps_bundle_entry *se = find_key(r, (const char *)key.p, key.n);
    make_box(sl, full, &sbox);
    intersect(&sbox, &tb, rank, &ibox);
    if (memcmp(sbox.lo, tb.lo, (size_t)rank * sizeof tb.lo[0]) == 0 &&
        memcmp(sbox.hi, tb.hi, (size_t)rank * sizeof tb.hi[0]) == 0) {
      rc = read_fixed(r, se, dst, st); /* the slice is exactly what is wanted */
      continue;
    }
    uint8_t *tmp = malloc(se->size ? (size_t)se->size : 1);
    if (tmp == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         r->prefix);
      break;
    }
    rc = read_fixed(r, se, tmp, st);
    if (rc == 0)
      copy_box(rank, es, ibox.lo, ibox.hi, tmp, sbox.lo, sbox.dim, dst, tb.lo, tb.dim);
    free(tmp);
  }
  bb_free(&key);
  free(use);
  return rc;
}

static void full_slice(int rank, ps_bundle_slice *t) {
  t->rank = rank;
  for (int d = 0; d < rank; d++) {
    t->start[d] = 0;
    t->length[d] = -1;
  }
}

/* INVALID_ARGUMENT unless @nbytes is what @t of @e holds. */
static int check_dst(ps_bundle_reader *r, const ps_bundle_entry *e,
                     const ps_bundle_slice *t, size_t nbytes, ps_status *st) {
  char kb[KEYBUF], sb[256];
  size_t es = elem_size(e->dtype);
  if (es == 0)
    return ps_status_set(st,
                         e->dtype == DT_STRING ? PS_INVALID_ARGUMENT : PS_UNIMPLEMENTED,
                         "checkpoint %s: tensor %s: dtype %s (%d) is not a "
                         "fixed-size type",
                         r->prefix, key_str(e->key, e->key_len, kb, sizeof kb),
                         ps_dtype_enum_name(e->dtype), e->dtype);
  ps_shape ts;
  slice_shape(t, &e->shape, &ts);
  uint64_t n = (uint64_t)ps_shape_num_elements(&ts);
  if (n > SIZE_MAX / es || n * es != nbytes)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s: a buffer of %zu bytes given for "
                         "%s %s",
                         r->prefix, key_str(e->key, e->key_len, kb, sizeof kb), nbytes,
                         ps_dtype_name(e->dtype), ps_shape_format(&ts, sb, sizeof sb));
  return 0;
}

int ps_bundle_reader_read_into(ps_bundle_reader *r, const char *key, void *dst,
                               size_t nbytes, ps_status *st) {
  const ps_bundle_entry *e = ps_bundle_reader_find(r, key);
  if (e == NULL) return not_found(r, key, st);
  ps_bundle_slice t;
  full_slice(e->shape.rank, &t);
  int rc = check_dst(r, e, &t, nbytes, st);
  if (rc != 0) return rc;
  return read_slice_impl(r, e, &t, dst, st);
}

int ps_bundle_reader_check(ps_bundle_reader *r, const char *key, ps_status *st) {
  const ps_bundle_entry *e = ps_bundle_reader_find(r, key);
  if (e == NULL) return not_found(r, key, st);
  if (e->nslices > 0 || e->dtype == DT_STRING)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: %s is not a plain fixed-size tensor", r->index_path,
                         key);
  uint64_t n;
  uint32_t crc;
  int rc = check_fixed_entry(r, e, &n, st);
  if (rc == 0) rc = read_range(r, e, NULL, &crc, st);
  if (rc == 0 && crc != ps_crc32c_unmask(e->crc32c))
    rc = checksum_mismatch(r, e, "data checksum", ps_crc32c_unmask(e->crc32c), crc, st);
  return rc;
}

int ps_bundle_reader_read_checked(ps_bundle_reader *r, const char *key, void *dst,
                                  size_t nbytes, ps_status *st) {
  const ps_bundle_entry *e = ps_bundle_reader_find(r, key);
  if (e == NULL) return not_found(r, key, st);
  shard *sh;
  uint64_t n;
  struct stat sb;
  if (e->nslices > 0 || e->dtype == DT_STRING || r->endianness != host_endianness() ||
      check_fixed_entry(r, e, &n, st) != 0 || n != nbytes || entry_shard(r, e, &sh, st) != 0 ||
      fstat(sh->fd, &sb) != 0 || (uint64_t)sb.st_size != sh->size ||
      sb.st_mtim.tv_sec != sh->mtime.tv_sec || sb.st_mtim.tv_nsec != sh->mtime.tv_nsec ||
      sb.st_ctim.tv_sec != sh->ctime.tv_sec || sb.st_ctim.tv_nsec != sh->ctime.tv_nsec)
    return ps_bundle_reader_read_into(r, key, dst, nbytes, st); /* the checked way */
  uint64_t done = 0;
  while (done < e->size) {
    size_t want = e->size - done < IO_CHUNK ? (size_t)(e->size - done) : IO_CHUNK;
    ssize_t got = pread(sh->fd, (uint8_t *)dst + done, want, (off_t)(e->offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int err = got < 0 ? errno : 0;
      char kb[KEYBUF];
      return ps_status_set(st, err ? ps_status_code_from_errno(err) : PS_DATA_LOSS,
                           "checkpoint %s: tensor %s: %s", sh->path,
                           key_str(e->key, e->key_len, kb, sizeof kb),
                           err ? strerror(err) : "unexpected end of file");
    }
    done += (uint64_t)got;
  }
  return 0;
}

int ps_bundle_reader_read_slice(ps_bundle_reader *r, const char *full_name,
                                const int64_t *start, const int64_t *length, void *dst,
                                size_t nbytes, ps_status *st) {
  const ps_bundle_entry *e = ps_bundle_reader_find(r, full_name);
  if (e == NULL) return not_found(r, full_name, st);
  ps_bundle_slice t;
  int rc = make_slice(&e->shape, start, length, &t, full_name, st);
  if (rc == 0) rc = check_dst(r, e, &t, nbytes, st);
  if (rc != 0) return rc;
  return read_slice_impl(r, e, &t, dst, st);
}

int ps_bundle_reader_read(ps_bundle_reader *r, const char *key, ps_tensor **out,
                          ps_status *st) {
  *out = NULL;
  const ps_bundle_entry *e = ps_bundle_reader_find(r, key);
  if (e == NULL) return not_found(r, key, st);
  char kb[KEYBUF];
  if (ps_dtype_size(e->dtype) == 0)
    return ps_status_set(
        st, e->dtype == DT_STRING ? PS_INVALID_ARGUMENT : PS_UNIMPLEMENTED,
        "checkpoint %s: tensor %s: dtype %s (%d) cannot be read as a "
        "ps_tensor%s",
        r->prefix, key_str(e->key, e->key_len, kb, sizeof kb),
        ps_dtype_enum_name(e->dtype), e->dtype,
        e->dtype == DT_STRING ? " (use ps_bundle_reader_read_strings)" : "");
  ps_bundle_slice t;
  full_slice(e->shape.rank, &t);
  int rc = read_slice_impl(r, e, &t, NULL, st); /* checks before allocating */
  if (rc != 0) return rc;
  ps_tensor *x = ps_tensor_create((ps_dtype)e->dtype, &e->shape, false);
  if (x == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "checkpoint %s: tensor %s: out of memory", r->prefix,
                         key_str(e->key, e->key_len, kb, sizeof kb));
  rc = read_slice_impl(r, e, &t, ps_tensor_data(x), st);
  if (rc != 0) {
    ps_tensor_destroy(x);
    return rc;
  }
  *out = x;
  return 0;
}

void ps_bundle_strings_destroy(ps_bundle_strings *s) {
  free(s);
}

/* A fixed32 as the bundle's writer stored it. */
static uint32_t get_u32(const uint8_t *p, int endianness) {
  uint32_t v = get_le32(p);
  return endianness ? __builtin_bswap32(v) : v;
}

static int read_strings(ps_bundle_reader *r, const ps_bundle_entry *e,
                        ps_bundle_strings **out, ps_status *st) {
  *out = NULL;
  char kb[KEYBUF];
  const char *ks = key_str(e->key, e->key_len, kb, sizeof kb);
  if (e->dtype != DT_STRING || e->nslices != 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s is %s%s, not a DT_STRING tensor",
                         r->prefix, ks, e->nslices ? "partitioned " : "",
                         ps_dtype_enum_name(e->dtype));
  shard *sh;
  int rc = entry_shard(r, e, &sh, st);
  if (rc != 0) return rc;
  uint64_t n = (uint64_t)ps_shape_num_elements(&e->shape);
  /* Each string takes at least its 1-byte length, plus the checksum. */
  if (e->size < 4 || n > e->size - 4)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: tensor %s: invalid size in bundle entry "
                         "(%" PRIu64 " bytes for %" PRIu64 " strings)",
                         sh->path, ks, e->size, n);
  uint8_t *raw = malloc(e->size);
  if (raw == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         sh->path);
  uint32_t ignored, crc = 0;
  ps_bundle_strings *s = NULL;
  if ((rc = read_range(r, e, raw, &ignored, st)) != 0) goto out;
  const uint8_t *p = raw, *end = raw + e->size;
  uint64_t total = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t len;
    if (!get_varint(&p, end, &len) || len > e->size) {
      rc = ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: tensor %s: bad length of string %" PRIu64,
                         sh->path, ks, i);
      goto out;
    }
    uint8_t w[8];
    int width = len <= UINT32_MAX ? 4 : 8;
    for (int j = 0; j < width; j++)
      w[j] = (uint8_t)(len >> (8 * (r->endianness ? width - 1 - j : j)));
    crc = ps_crc32c_extend(crc, w, (size_t)width);
    total += len;
  }
  if (end - p < 4 || total != (uint64_t)(end - p - 4)) {
    rc = ps_status_set(st, PS_DATA_LOSS,
                       "checkpoint %s: tensor %s: invalid size in bundle entry "
                       "(%" PRIu64 " bytes; the lengths say %" PRIu64 ")",
                       sh->path, ks, e->size, (uint64_t)(p - raw) + 4 + total);
    goto out;
  }
  uint32_t lc = ps_crc32c_unmask(get_u32(p, r->endianness));
  if (lc != crc) {
    rc = checksum_mismatch(r, e, "length checksum", lc, crc, st);
    goto out;
  }
  crc = ps_crc32c_extend(crc, p, 4);
  p += 4;
  crc = ps_crc32c_extend(crc, p, (size_t)total);
  if (crc != ps_crc32c_unmask(e->crc32c)) {
    rc = checksum_mismatch(r, e, "data checksum", ps_crc32c_unmask(e->crc32c), crc, st);
    goto out;
  }
  /* One block: the struct, n pointers, n lengths, the bytes with NULs. */
  size_t hdr = sizeof *s + (size_t)n * (sizeof(char *) + sizeof(size_t));
  s = malloc(hdr + (size_t)(total + n) + 1);
  if (s == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                       sh->path);
    goto out;
  }
  const char **strs = (const char **)(s + 1);
  size_t *lens = (size_t *)(strs + n);
  char *bytes = (char *)(lens + n);
  s->shape = e->shape;
  s->n = (size_t)n;
  s->str = strs;
  s->len = lens;
  const uint8_t *q = raw;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t len = 0;
    get_varint(&q, end, &len); /* checked above */
    lens[i] = (size_t)len;
    strs[i] = bytes;
    if (len) memcpy(bytes, p, (size_t)len);
    bytes[len] = '\0';
    bytes += len + 1;
    p += len;
  }
  *out = s;
out:
  free(raw);
  return rc;
}

int ps_bundle_reader_read_strings(ps_bundle_reader *r, const char *key,
                                  ps_bundle_strings **out, ps_status *st) {
  *out = NULL;
  const ps_bundle_entry *e = ps_bundle_reader_find(r, key);
  if (e == NULL) return not_found(r, key, st);
  return read_strings(r, e, out, st);
}

int ps_bundle_reader_verify(ps_bundle_reader *r, ps_status *st) {
  char kb[KEYBUF], sb[512];
  bbuf key = {0};
  int rc = 0;
  for (size_t i = 0; i < r->set.n && rc == 0; i++) {
    const ps_bundle_entry *e = &r->set.e[i];
    if (e->nslices > 0) {
      for (size_t k = 0; k < e->nslices && rc == 0; k++) {
        key.n = 0;
        encode_slice_key(&key, e->key, e->key_len, &e->slices[k]);
        const ps_bundle_entry *se =
            key.oom ? NULL : find_key(r, (const char *)key.p, key.n);
        ps_shape ss;
        slice_shape(&e->slices[k], &e->shape, &ss);
        if (se == NULL || se->nslices != 0 || se->dtype != e->dtype ||
            !ps_shape_equal(&se->shape, &ss))
          rc = ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: tensor %s: slice %s is %s",
                             r->index_path, key_str(e->key, e->key_len, kb, sizeof kb),
                             slice_spec(&e->slices[k], sb, sizeof sb),
                             se ? "stored with another dtype or shape" : "missing");
      }
    } else if (e->dtype == DT_STRING) {
      ps_bundle_strings *s;
      rc = read_strings(r, e, &s, st);
      ps_bundle_strings_destroy(s);
    } else {
      uint64_t n;
      uint32_t crc;
      rc = check_fixed_entry(r, e, &n, st);
      if (rc == 0) rc = read_range(r, e, NULL, &crc, st);
      if (rc == 0 && crc != ps_crc32c_unmask(e->crc32c))
        rc = checksum_mismatch(r, e, "data checksum", ps_crc32c_unmask(e->crc32c), crc,
                               st);
    }
  }
  bb_free(&key);
  return rc;
}

/* ---- Merge ------------------------------------------------------------
 *
 * As TensorFlow's MergeBundles: entries of part k keep their values but get
 * the shard id of their data file in the merged bundle, numbered in the
 * order files are first used (so part k's only file becomes shard k).  A
 * data file no entry uses (a part without tensors) still gets the next id,
 * so that num_shards, the sum over the parts, matches the files there are
 * (TensorFlow would leave the names and the count disagreeing). */

typedef struct merge_part {
  ps_bundle_reader *r;
  int *ids; /* per input shard: merged id, -1 = not yet */
} merge_part;

static int merge_entries(merge_part *parts, size_t n, entry_set *m, int *next_id,
                         ps_status *st) {
  char kb[KEYBUF];
  for (size_t p = 0; p < n; p++) {
    ps_bundle_reader *r = parts[p].r;
    for (size_t i = 0; i < r->set.n; i++) {
      const ps_bundle_entry *e = &r->set.e[i];
      const char *ks = key_str(e->key, e->key_len, kb, sizeof kb);
      ps_bundle_entry *x = es_find(m, e->key, e->key_len);
      if (x != NULL) {
        if (x->nslices == 0 || e->nslices == 0)
          return ps_status_set(st, PS_INVALID_ARGUMENT,
                               "Duplicate tensor keyed by %s encountered, when "
                               "merging prefix: %s",
                               ks, r->prefix);
        if (x->dtype != e->dtype || !ps_shape_equal(&x->shape, &e->shape))
          return ps_status_set(st, PS_INVALID_ARGUMENT,
                               "checkpoint %s: partitioned tensor %s has another "
                               "dtype or shape than in an earlier part",
                               r->prefix, ks);
        for (size_t k = 0; k < e->nslices; k++) {
          for (size_t j = 0; j < x->nslices; j++)
            if (slices_overlap(&x->slices[j], &e->slices[k], &e->shape))
              return ps_status_set(st, PS_INVALID_ARGUMENT,
                                   "checkpoint %s: partitioned tensor %s: a slice "
                                   "overlaps one of an earlier part",
                                   r->prefix, ks);
          if (!entry_add_slice(x, &e->slices[k])) goto oom;
        }
        continue;
      }
      int *id = &parts[p].ids[e->shard_id];
      if (*id < 0) *id = (*next_id)++;
      x = es_add(m, e->key, e->key_len);
      if (x == NULL) goto oom;
      const char *key = x->key;
      *x = *e;
      x->key = key;
      x->shard_id = *id;
      x->slices = NULL;
      x->nslices = 0;
      for (size_t k = 0; k < e->nslices; k++)
        if (!entry_add_slice(x, &e->slices[k])) goto oom;
    }
  }
  return 0;
oom:
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint merge: out of memory");
}

int ps_bundle_merge(const char *const *part_prefixes, size_t n, const char *out_prefix,
                    ps_status *st) {
  if (n == 0 || out_prefix == NULL || out_prefix[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint merge: no parts or no output prefix");
  int rc = 0, next_id = 0, total = 0, e;
  size_t nmoved = 0;
  entry_set m = {0};
  bbuf idx = {0};
  char *index_path = NULL, *tmp = NULL, *out_dir = NULL;
  char **src = NULL, **dst = NULL;
  merge_part *parts = calloc(n, sizeof *parts);
  if (parts == NULL) goto oom;
  for (size_t p = 0; p < n; p++) {
    parts[p].r = ps_bundle_reader_open(part_prefixes[p], st);
    if (parts[p].r == NULL) {
      rc = st ? st->code : PS_UNKNOWN;
      goto out;
    }
    ps_bundle_reader *r = parts[p].r, *r0 = parts[0].r;
    if (r->endianness != r0->endianness || r->version_len != r0->version_len ||
        (r->version_len && memcmp(r->version, r0->version, r->version_len) != 0)) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: endianness or version differs from %s",
                         r->index_path, r0->index_path);
      goto out;
    }
    if (r->num_shards > MAX_SHARDS - total) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint merge: too many shards");
      goto out;
    }
    total += r->num_shards;
    parts[p].ids = malloc((size_t)r->num_shards * sizeof(int));
    if (parts[p].ids == NULL) goto oom;
    for (int s = 0; s < r->num_shards; s++)
      parts[p].ids[s] = -1;
  }
  if ((rc = merge_entries(parts, n, &m, &next_id, st)) != 0) goto out;
  src = calloc((size_t)total, sizeof *src);
  dst = calloc((size_t)total, sizeof *dst);
  if (src == NULL || dst == NULL) goto oom;
  /* Every input data file, by merged id; all must exist before any moves. */
  for (size_t p = 0; p < n; p++) {
    ps_bundle_reader *r = parts[p].r;
    for (int s = 0; s < r->num_shards; s++) {
      int *id = &parts[p].ids[s];
      if (*id < 0) *id = next_id++;
      src[*id] = data_path(r->prefix, s, r->num_shards);
      dst[*id] = data_path(out_prefix, *id, total);
      if (src[*id] == NULL || dst[*id] == NULL) goto oom;
      struct stat sb;
      if (stat(src[*id], &sb) != 0) {
        e = errno;
        rc = ps_status_set(st, e == ENOENT ? PS_NOT_FOUND : ps_status_code_from_errno(e),
                           "checkpoint %s: %s (%s)", src[*id],
                           e == ENOENT ? "missing data shard" : "cannot stat data shard",
                           strerror(e));
        goto out;
      }
    }
  }
  ps_bundle_reader *r0 = parts[0].r;
  if (!build_index(&m, total, r0->endianness, r0->version, r0->version_len, &idx))
    goto oom;
  index_path = path_cat(out_prefix, ".index");
  out_dir = ps_dir_of(out_prefix);
  if (index_path == NULL || out_dir == NULL) goto oom;
  if ((e = make_dirs(out_dir)) != 0) {
    rc = ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: cannot create directory %s: %s",
                       out_prefix, out_dir, strerror(e));
    goto out;
  }
  if ((e = write_temp(index_path, idx.p, idx.n, &tmp)) != 0) {
    rc = ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: write: %s", index_path,
                       strerror(e));
    goto out;
  }
  for (; nmoved < (size_t)total; nmoved++) {
    if (rename(src[nmoved], dst[nmoved]) != 0) {
      e = errno;
      rc = ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: cannot rename to %s: %s",
                         src[nmoved], dst[nmoved], strerror(e));
      goto out;
    }
  }
  if (rename(tmp, index_path) != 0) {
    e = errno;
    rc = ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: rename: %s", index_path,
                       strerror(e));
    goto out;
  }
  free(tmp);
  tmp = NULL;
  if ((e = ps_fsync_dir(out_dir)) != 0) {
    rc = ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: fsync directory: %s", out_dir,
                       strerror(e));
    /* not durable: a failed merge leaves nothing of its own behind */
    unlink(index_path);
    while (nmoved > 0) {
      nmoved--;
      rename(dst[nmoved], src[nmoved]);
    }
    goto out;
  }
  /* Best effort: the parts' indexes, then their directories if empty. */
  for (size_t p = 0; p < n; p++) {
    ps_bundle_reader *r = parts[p].r;
    unlink(r->index_path);
    char *d = ps_dir_of(r->prefix);
    if (d != NULL && strcmp(d, out_dir) != 0) rmdir(d);
    free(d);
  }
  goto out;
oom:
  rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint merge %s: out of memory",
                     out_prefix);
out:
  if (tmp != NULL) { /* failed before the index went into place: undo */
    unlink(tmp);
    free(tmp);
    while (nmoved > 0) {
      nmoved--;
      rename(dst[nmoved], src[nmoved]);
    }
  }
  for (int i = 0; src != NULL && i < total; i++) {
    free(src[i]);
    free(dst[i]);
  }
  free(src);
  free(dst);
  free(index_path);
  free(out_dir);
  bb_free(&idx);
  es_free(&m);
  for (size_t p = 0; parts != NULL && p < n; p++) {
    ps_bundle_reader_close(parts[p].r);
    free(parts[p].ids);
  }
  free(parts);
  return rc;
}
