/* Fuzz target for the checkpoint bundle reader (common/bundle_reader.c): the
 * index table (footer, blocks, Snappy, prefix-compressed keys, restarts),
 * the header and entry protos, and the data file (sizes, checksums,
 * string tensors, slices of partitioned tensors).
 *
 * An input is a little-endian uint32 L, then L bytes of P.index, then the
 * rest as P.data-00000-of-00001.  If bit 31 of L is set, the block
 * checksums of the index are recomputed before the files are written, so
 * that mutations get past the checksums into the decoders.  Besides "no
 * crash, no leak, no UB" it checks: every error carries a message naming
 * the checkpoint; a value read twice (as a tensor and into a buffer) reads
 * the same; and a bundle that opens, merged as the only part of a new one,
 * gives an index listing the same entries.  The input is also parsed as a
 * RestoreV2 shape_and_slices string.
 *
 * Built with -DPS_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer
 * target.  Otherwise the shared driver (driver.c) runs it over every file (or every
 * file in each directory) named on the command line and then over
 * PS_FUZZ_RUNS (default 4000) deterministic random mutations of them, so
 * it runs as an ordinary test under gcc + ASan/UBSan. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/crc32c.h"
#include "driver.h"

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "fuzz_bundle: " __VA_ARGS__);                                        \
    fputc('\n', stderr);                                                                 \
    abort();                                                                             \
  } while (0)

#define MAX_READ ((size_t)16 << 20) /* bigger tensors are only verified */

static char dir[256];
static char prefix[300], index_path[320], data_path[340], merged[320];

static void remove_dir_files(void) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *e;
  char path[600];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
}

static void cleanup(void) {
  remove_dir_files();
  rmdir(dir);
}

static void make_dir(void) {
  if (dir[0]) return;
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/fuzz_bundle.XXXXXX", base && base[0] ? base : "/tmp");
  if (mkdtemp(dir) == NULL) FAIL("mkdtemp %s failed", dir);
  snprintf(prefix, sizeof prefix, "%s/f", dir);
  snprintf(index_path, sizeof index_path, "%s.index", prefix);
  snprintf(data_path, sizeof data_path, "%s.data-00000-of-00001", prefix);
  snprintf(merged, sizeof merged, "%s/m", dir);
  atexit(cleanup);
}

static void put_file(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) FAIL("cannot write %s", path);
  if (n && fwrite(p, 1, n, f) != n) FAIL("short write to %s", path);
  fclose(f);
}

static void expect_error(const ps_status *st, const char *what) {
  if (st->code == PS_OK || st->msg[0] == '\0')
    FAIL("%s failed without a status message", what);
  if (strstr(st->msg, prefix) == NULL && st->code != PS_RESOURCE_EXHAUSTED)
    FAIL("%s: error does not name the checkpoint: %s", what, st->msg);
}

/* ---- Checksum fix-up ---------------------------------------------------- */

static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int s = 0; s < 64 && *p < end; s += 7) {
    uint8_t c = *(*p)++;
    *v |= (uint64_t)(c & 0x7f) << s;
    if (!(c & 0x80)) return true;
  }
  return false;
}

static void fix_block(uint8_t *p, size_t n, uint64_t off, uint64_t size) {
  if (off > n || size > n - off || 5 > n - off - size) return;
  uint8_t *b = p + off;
  uint32_t crc =
      ps_crc32c_mask(ps_crc32c_extend(ps_crc32c(b, (size_t)size), b + size, 1));
  for (int i = 0; i < 4; i++)
    b[size + 1 + i] = (uint8_t)(crc >> (8 * i));
}

/* Rewrites the trailers of the metaindex, index and (uncompressed index
 * block's) data blocks so that their checksums hold. */
static void fix_checksums(uint8_t *p, size_t n) {
  if (n < 48) return;
  const uint8_t *f = p + n - 48, *fe = p + n - 8;
  uint64_t mo, ms, io, is;
  if (!varint(&f, fe, &mo) || !varint(&f, fe, &ms) || !varint(&f, fe, &io) ||
      !varint(&f, fe, &is))
    return;
  fix_block(p, n, mo, ms);
  if (io > n || is > n - io || is < 4 || 5 > n - io - is || p[io + is] != 0) {
    fix_block(p, n, io, is);
    return;
  }
  const uint8_t *b = p + io;
  uint32_t nr = (uint32_t)b[is - 4] | (uint32_t)b[is - 3] << 8 |
                (uint32_t)b[is - 2] << 16 | (uint32_t)b[is - 1] << 24;
  if (nr <= (is - 4) / 4) {
    const uint8_t *q = b, *end = b + is - 4 - 4 * (size_t)nr;
    while (q < end) {
      uint64_t sh, ns, vl, off, size;
      if (!varint(&q, end, &sh) || !varint(&q, end, &ns) || !varint(&q, end, &vl) ||
          ns > (uint64_t)(end - q) || vl > (uint64_t)(end - q) - ns)
        break;
      q += ns;
      const uint8_t *v = q;
      q += vl;
      if (varint(&v, q, &off) && varint(&v, q, &size)) fix_block(p, n, off, size);
    }
  }
  fix_block(p, n, io, is);
}

/* ---- The target ------------------------------------------------------ */

static void read_entry(ps_bundle_reader *r, const ps_bundle_entry *e) {
  ps_status st = {0};
  if (e->is_slice || e->key_len != strlen(e->key)) {
    /* slice keys are read through their full tensor */
  } else if (e->dtype == PS_DT_STRING && e->nslices == 0) {
    ps_bundle_strings *s;
    if (ps_bundle_reader_read_strings(r, e->key, &s, &st) == 0) {
      for (size_t i = 0; i < s->n; i++)
        if (s->str[i][s->len[i]] != '\0') FAIL("string %zu not terminated", i);
      ps_bundle_strings_destroy(s);
    } else {
      expect_error(&st, "read_strings");
    }
  } else {
    ps_tensor *t = NULL;
    int rc = ps_bundle_reader_read(r, e->key, &t, &st);
    if (rc != 0) expect_error(&st, "read");
    if (rc == 0 && ps_tensor_nbytes(t) <= MAX_READ) {
      size_t nb = ps_tensor_nbytes(t);
      uint8_t *buf = malloc(nb ? nb : 1);
      if (buf == NULL) FAIL("out of memory");
      if (ps_bundle_reader_read_into(r, e->key, buf, nb, &st) != 0)
        FAIL("read_into fails after read: %s", st.msg);
      if (nb && memcmp(buf, ps_tensor_data(t), nb) != 0) FAIL("two reads differ");
      /* the first half of dimension 0, as a slice */
      if (t->shape.rank > 0 && t->shape.dim[0] > 1) {
        int64_t start[PS_MAX_RANK] = {0}, len[PS_MAX_RANK];
        for (int d = 0; d < t->shape.rank; d++)
          len[d] = -1;
        len[0] = t->shape.dim[0] / 2;
        size_t sn = nb / (size_t)t->shape.dim[0] * (size_t)len[0];
        if (ps_bundle_reader_read_slice(r, e->key, start, len, buf, sn, &st) != 0)
          FAIL("read_slice fails after read: %s", st.msg);
        if (sn && memcmp(buf, ps_tensor_data(t), sn) != 0) FAIL("slice read differs");
      }
      free(buf);
    }
    ps_tensor_destroy(t);
  }
}

static bool same_slices(const ps_bundle_entry *a, const ps_bundle_entry *b) {
  if (a->nslices != b->nslices) return false;
  for (size_t i = 0; i < a->nslices; i++) {
    const ps_bundle_slice *x = &a->slices[i], *y = &b->slices[i];
    if (x->rank != y->rank) return false;
    for (int d = 0; d < x->rank; d++)
      if (x->start[d] != y->start[d] || x->length[d] != y->length[d]) return false;
  }
  return true;
}

/* Merging the bundle as the only part gives the same entries. */
static void check_merge(ps_bundle_reader *r) {
  ps_status st = {0};
  size_t n = ps_bundle_reader_count(r);
  ps_bundle_entry *copy = calloc(n ? n : 1, sizeof *copy);
  if (copy == NULL) FAIL("out of memory");
  for (size_t i = 0; i < n; i++)
    copy[i] = *ps_bundle_reader_entry(r, i);
  const char *parts[] = {prefix};
  if (ps_bundle_merge(parts, 1, merged, &st) != 0) {
    expect_error(&st, "merge");
    free(copy);
    return;
  }
  ps_bundle_reader *m = ps_bundle_reader_open(merged, &st);
  if (m == NULL) FAIL("merged bundle does not open: %s", st.msg);
  if (ps_bundle_reader_count(m) != n) FAIL("merge changed the entry count");
  for (size_t i = 0; i < n; i++) {
    const ps_bundle_entry *a = &copy[i], *b = ps_bundle_reader_entry(m, i);
    if (a->key_len != b->key_len || memcmp(a->key, b->key, a->key_len) != 0 ||
        a->dtype != b->dtype || !ps_shape_equal(&a->shape, &b->shape) ||
        a->offset != b->offset || a->size != b->size || a->crc32c != b->crc32c ||
        !same_slices(a, b))
      FAIL("merge changed entry %zu", i);
  }
  ps_bundle_reader_close(m);
  free(copy);
}

/* The input as a RestoreV2 shape_and_slices string. */
static void fuzz_spec(const uint8_t *data, size_t size) {
  char spec[256];
  size_t n = size < sizeof spec - 1 ? size : sizeof spec - 1;
  memcpy(spec, data, n);
  spec[n] = '\0';
  ps_status st = {0};
  ps_shape full;
  ps_bundle_slice sl;
  bool sliced;
  if (ps_bundle_parse_shape_and_slice(spec, &full, &sl, &sliced, &st) != 0) {
    if (st.msg[0] == '\0' || strstr(st.msg, spec) == NULL)
      FAIL("shape_and_slice error does not quote the spec: %s", st.msg);
    return;
  }
  if (!sliced) return;
  if (sl.rank != full.rank || ps_shape_num_elements(&full) < 0)
    FAIL("bad parse of %s", spec);
  for (int d = 0; d < sl.rank; d++)
    if (sl.length[d] < 0 ? (sl.length[d] != -1 || sl.start[d] != 0)
                         : (sl.start[d] < 0 || sl.start[d] + sl.length[d] > full.dim[d]))
      FAIL("slice of %s outside its shape", spec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_spec(data, size);
  make_dir();
  remove_dir_files();
  if (size < 4) return 0;
  uint32_t hdr = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                 (uint32_t)data[3] << 24;
  size_t ilen = hdr & 0x7fffffffu;
  if (ilen > size - 4) ilen = size - 4;
  uint8_t *index = malloc(ilen ? ilen : 1);
  if (index == NULL) return 0;
  if (ilen) memcpy(index, data + 4, ilen);
  if (hdr & 0x80000000u) fix_checksums(index, ilen);
  put_file(index_path, index, ilen);
  put_file(data_path, data + 4 + ilen, size - 4 - ilen);
  free(index);

  ps_status st = {0};
  ps_bundle_reader *r = ps_bundle_reader_open(prefix, &st);
  if (r == NULL) {
    expect_error(&st, "open");
    return 0;
  }
  for (size_t i = 0; i < ps_bundle_reader_count(r); i++) {
    const ps_bundle_entry *e = ps_bundle_reader_entry(r, i);
    if (ps_bundle_reader_find(r, e->key) != e && e->key_len == strlen(e->key))
      FAIL("find misses entry %zu", i);
    read_entry(r, e);
  }
  if (ps_bundle_reader_verify(r, &st) != 0) expect_error(&st, "verify");
  if (ps_bundle_reader_num_shards(r) == 1) check_merge(r);
  ps_bundle_reader_close(r);
  return 0;
}

#ifndef PS_LIBFUZZER

/* Pieces of the format, so mutations reach deep paths: varint edges,
 * proto tags (dtype, shape, dim, shard, offset, size, crc, slice), the
 * empty block, the magic, OrderedCode bytes. */
static const struct {
  const char *p;
  size_t n;
} tokens[] = {
    {"\x00", 1},
    {"\x01", 1},
    {"\x7f", 1},
    {"\x80\x01", 2},
    {"\xff\xff\xff\xff\x0f", 5},
    {"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 10},
    {"\x08\x07", 2},
    {"\x08\x13", 2},
    {"\x12\x00", 2},
    {"\x12\x04\x12\x02\x08\x03", 6},
    {"\x18\x01", 2},
    {"\x20\x04", 2},
    {"\x28\x08", 2},
    {"\x35\xd8\xea\x82\xa2", 5},
    {"\x3a\x02\x0a\x00", 4},
    {"\x3a\x04\x0a\x02\x10\x01", 6},
    {"\x00\x00\x00\x00\x01\x00\x00\x00", 8},
    {"\x57\xfb\x80\x8b\x24\x75\x47\xdb", 8},
    {"\x00\x76\x00\x01\x01\x01\x80\x81", 8},
    {"10 20 0,5:0,20", 14},
    {":-", 2},
    {"9223372036854775807", 19},
};
#define NTOKENS (sizeof tokens / sizeof tokens[0])

/* Mutations keep the 4-byte length header mostly intact and aim at the
 * index (the first part) more often than at the data. */
size_t fuzz_mutate(uint8_t *buf, size_t n, size_t cap) {
  int rounds = 1 + (int)fuzz_rnd(3);
  for (int r = 0; r < rounds; r++) {
    size_t pos = 4 + fuzz_rnd(n > 4 ? n - 4 + 1 : 1);
    if (pos > n) pos = n;
    switch (fuzz_rnd(9)) {
    case 0: /* flip a bit */
      if (n > 4) buf[4 + fuzz_rnd(n - 4)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    case 1: /* random byte */
      if (n > 4) buf[4 + fuzz_rnd(n - 4)] = (uint8_t)fuzz_rng();
      break;
    case 2: { /* overwrite with a token */
      size_t k = fuzz_rnd(NTOKENS), tl = tokens[k].n;
      if (pos + tl <= n) memcpy(buf + pos, tokens[k].p, tl);
      break;
    }
    case 3: { /* insert a token */
      size_t k = fuzz_rnd(NTOKENS);
      n = fuzz_insert(buf, n, cap, pos, tokens[k].p, tokens[k].n);
      break;
    }
    case 4: /* erase a range */
      n = fuzz_erase(buf, n, pos);
      break;
    case 5: /* duplicate a range */
      n = fuzz_duplicate(buf, n, cap, pos, 64);
      break;
    case 6: /* nudge a byte by a small amount (lengths, varints) */
      if (n > 4) buf[4 + fuzz_rnd(n - 4)] += (uint8_t)(fuzz_rnd(5) - 2);
      break;
    case 7: /* move the index/data boundary */
      if (n >= 4) buf[fuzz_rnd(2)] ^= (uint8_t)(1u << fuzz_rnd(8));
      break;
    default: /* truncate */
      n = pos;
      break;
    }
  }
  return n;
}

#endif
