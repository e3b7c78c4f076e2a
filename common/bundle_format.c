/* TensorFlow V2 checkpoints: a reader, a writer and the merge of sharded
 * saves, byte compatible with TensorFlow's BundleWriter/BundleReader.
 *
 * Each ps saves its variables with a writer, one ps merges the parts of
 * all ps tasks into one checkpoint, and restore reads entries (or slices of
 * partitioned variables) by name; TensorFlow tools read what we write and
 * we read what TensorFlow wrote.  Everything read from disk is untrusted:
 * every length and count is checked against the bytes actually there
 * before it is used or allocated, and every checksum is verified.
 *
 * The format, byte by byte (data files, the index as a LevelDB table,
 * BundleHeaderProto and BundleEntryProto, slice keys, string tensors, the
 * masked CRC32C) is described once, in CHECKPOINT_FORMAT.md beside this
 * file.  This file holds the protobuf encoding of the header and entries
 * and the byte-level helpers the other bundle_*.c files share. */

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

#define DT_RESOURCE 20
#define DT_VARIANT 21

/* Element sizes of every fixed-size TensorFlow dtype, including those the
 * ps does no arithmetic on (quantized types): a checkpoint may hold them
 * (PS_DTYPE_LIST and PS_DTYPE_STORED_LIST, common/tensor.h). */
size_t ps_bdl_elem_size_(int dtype) {
  return ps_dtype_stored_size(dtype);
}

/* Byte-swap unit: complex numbers swap each half. */
size_t ps_bdl_swap_size_(int dtype) {
  size_t s = ps_bdl_elem_size_(dtype);
  return (dtype == 8 || dtype == 18) ? s / 2 : s;
}

int ps_bdl_host_endianness_(void) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return 1;
#else
  return 0;
#endif
}

/* A key for messages: printable bytes as they are, others as \xNN,
 * shortened past 200 bytes. */
const char *ps_bdl_key_str_(const char *k, size_t n, char *buf, size_t cap) {
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

/* ---- Growable byte buffer --------------------------------------------- */

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

void ps_bdl_bb_put_(bbuf *b, const void *p, size_t n) {
  if (n == 0) return;
  bb_reserve(b, n);
  if (b->oom) return;
  memcpy(b->p + b->n, p, n);
  b->n += n;
}

void ps_bdl_bb_byte_(bbuf *b, uint8_t c) {
  ps_bdl_bb_put_(b, &c, 1);
}

size_t ps_bdl_varint_encode_(uint8_t *out, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  return n;
}

void ps_bdl_bb_varint_(bbuf *b, uint64_t v) {
  uint8_t tmp[10];
  ps_bdl_bb_put_(b, tmp, ps_bdl_varint_encode_(tmp, v));
}

void ps_bdl_put_le32_(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

uint32_t ps_bdl_get_le32_(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

void ps_bdl_bb_fixed32_(bbuf *b, uint32_t v) {
  uint8_t tmp[4];
  ps_bdl_put_le32_(tmp, v);
  ps_bdl_bb_put_(b, tmp, 4);
}

void ps_bdl_bb_free_(bbuf *b) {
  free(b->p);
  *b = (bbuf){0};
}

/* Reads a varint of at most 10 bytes (64 bits) from [*p, end); false if it
 * is cut short or too long. */
bool ps_bdl_get_varint_(const uint8_t **p, const uint8_t *end, uint64_t *v) {
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
  ps_bdl_bb_varint_(b, (uint64_t)field << 3 | (uint64_t)wire);
}

static void bb_submsg(bbuf *b, uint32_t field, const bbuf *sub) {
  bb_tag(b, field, 2);
  ps_bdl_bb_varint_(b, sub->n);
  ps_bdl_bb_put_(b, sub->p, sub->n);
  if (sub->oom) b->oom = true;
}

static void encode_shape(bbuf *b, const ps_shape *s) {
  bbuf sh = {0};
  for (int i = 0; i < s->rank; i++) {
    bbuf dim = {0};
    if (s->dim[i] != 0) {
      bb_tag(&dim, 1, 0);
      ps_bdl_bb_varint_(&dim, (uint64_t)s->dim[i]);
    }
    bb_submsg(&sh, 2, &dim);
    ps_bdl_bb_free_(&dim);
  }
  bb_submsg(b, 2, &sh);
  ps_bdl_bb_free_(&sh);
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
        ps_bdl_bb_varint_(&ext, (uint64_t)sl->start[i]);
      }
      bb_tag(&ext, 2, 0);
      ps_bdl_bb_varint_(&ext, (uint64_t)sl->length[i]);
    }
    bb_submsg(&m, 1, &ext);
    ps_bdl_bb_free_(&ext);
  }
  bb_submsg(b, 7, &m);
  ps_bdl_bb_free_(&m);
}

void ps_bdl_encode_entry_(bbuf *b, const ps_bundle_entry *e) {
  if (e->dtype != 0) {
    bb_tag(b, 1, 0);
    ps_bdl_bb_varint_(b, (uint64_t)(int64_t)e->dtype);
  }
  encode_shape(b, &e->shape);
  if (e->shard_id != 0) {
    bb_tag(b, 3, 0);
    ps_bdl_bb_varint_(b, (uint64_t)(int64_t)e->shard_id);
  }
  if (e->offset != 0) {
    bb_tag(b, 4, 0);
    ps_bdl_bb_varint_(b, e->offset);
  }
  if (e->size != 0) {
    bb_tag(b, 5, 0);
    ps_bdl_bb_varint_(b, e->size);
  }
  if (e->crc32c != 0) {
    bb_tag(b, 6, 5);
    ps_bdl_bb_fixed32_(b, e->crc32c);
  }
  for (size_t i = 0; i < e->nslices; i++)
    encode_slice(b, &e->slices[i]);
}

/* The header as TensorFlow writes it: num_shards, endianness, and the
 * VersionDef's serialized bytes (producer 1 = "08 01" for a new bundle;
 * a merge keeps the first part's). */
void ps_bdl_encode_header_(bbuf *b, int num_shards, int endianness,
                           const uint8_t *version, size_t version_len) {
  if (num_shards != 0) {
    bb_tag(b, 1, 0);
    ps_bdl_bb_varint_(b, (uint64_t)(int64_t)num_shards);
  }
  if (endianness != 0) {
    bb_tag(b, 2, 0);
    ps_bdl_bb_varint_(b, (uint64_t)(int64_t)endianness);
  }
  bbuf v = {0};
  ps_bdl_bb_put_(&v, version, version_len);
  bb_submsg(b, 3, &v);
  ps_bdl_bb_free_(&v);
}

const uint8_t ps_bdl_new_version_[2] = {0x08, 0x01}; /* producer = 1 */

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
  if (!ps_bdl_get_varint_(p, end, &tag)) return -1;
  if ((tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) return -1;
  f->num = (uint32_t)(tag >> 3);
  f->wire = (int)(tag & 7);
  switch (f->wire) {
  case 0:
    return ps_bdl_get_varint_(p, end, &f->v) ? 1 : -1;
  case 1:
    if (end - *p < 8) return -1;
    f->v = (uint64_t)ps_bdl_get_le32_(*p) | (uint64_t)ps_bdl_get_le32_(*p + 4) << 32;
    *p += 8;
    return 1;
  case 2:
    if (!ps_bdl_get_varint_(p, end, &f->v) || f->v > (uint64_t)(end - *p)) return -1;
    f->p = *p;
    f->n = (size_t)f->v;
    *p += f->n;
    return 1;
  case 5:
    if (end - *p < 4) return -1;
    f->v = ps_bdl_get_le32_(*p);
    *p += 4;
    return 1;
  default: /* groups are not used by these protos */
    return -1;
  }
}

/* On error returns -1 with the fault in @why. */
static int decode_version(const uint8_t *p, size_t n, char *why, size_t cap) {
  const uint8_t *end = p + n;
  pfield f = {0};
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
        if (f.wire == 2 && !ps_bdl_get_varint_(&q, qe, &bad)) {
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

int ps_bdl_decode_header_(const uint8_t *p, size_t n, header *h, char *why, size_t cap) {
  const uint8_t *end = p + n;
  pfield f = {0};
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
  pfield f = {0}, g = {0};
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
  pfield f = {0}, g = {0};
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
bool ps_bdl_slice_inside_(const ps_bundle_slice *sl, const ps_shape *full) {
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
int ps_bdl_decode_entry_(const uint8_t *p, size_t n, ps_bundle_entry *e, char *why,
                         size_t cap) {
  const uint8_t *end = p + n;
  pfield f = {0};
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
    if (!ps_bdl_slice_inside_(&slices[i], &e->shape)) {
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
