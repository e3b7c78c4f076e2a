/* The bundle reader (ps_bundle_reader_*): the index parsed and checked
 * up front, tensors and slices read, checked and byte-swapped on demand.
 * See bundle_format.c for the format. */
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
#include "common/array.h"
#include "crc32c.h"
#include "fileio.h"

/* ---- Reader ----------------------------------------------------------- */

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
    if (ps_bdl_decode_header_(v, vn, &h, why, sizeof why) != 0)
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
  if (kn == 0 || (s->n > 0 && ps_bdl_cmp_key_(s->e[s->n - 1].key, s->e[s->n - 1].key_len,
                                              (const char *)k, kn) >= 0))
    return ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: entry %s: keys out of order",
                         r->index_path,
                         ps_bdl_key_str_((const char *)k, kn, kb, sizeof kb));
  if (ps_array_grow(&s->e, &s->cap, s->n + 1, sizeof *s->e) != 0)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         r->index_path);
  ps_bundle_entry *e = &s->e[s->n];
  *e = (ps_bundle_entry){0};
  if (ps_bdl_decode_entry_(v, vn, e, why, sizeof why) != 0)
    return ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: entry %s: %s", r->index_path,
                         ps_bdl_key_str_((const char *)k, kn, kb, sizeof kb), why);
  if (e->shard_id >= r->num_shards) {
    free((void *)e->slices);
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: entry %s: shard_id %d but the bundle has %d "
                         "shard(s)",
                         r->index_path,
                         ps_bdl_key_str_((const char *)k, kn, kb, sizeof kb), e->shard_id,
                         r->num_shards);
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

/* The message of a failed ps_open_regular of @path (@err its errno, @type
 * what it found), with @what ("cannot open data shard") for other errors. */
static int open_failed(const char *path, int err, unsigned type, const char *what,
                       ps_status *st) {
  if (type != 0)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "checkpoint %s: is %s, not a regular file: not read", path,
                         ps_file_type_name(type));
  if (err == ELOOP)
    return ps_status_set(st, PS_PERMISSION_DENIED,
                         "checkpoint %s: a symbolic link (links under the checkpoint "
                         "directory are not followed)",
                         path);
  return ps_status_set(st, err == ENOENT ? PS_NOT_FOUND : ps_status_code_from_errno(err),
                       "checkpoint %s: %s (%s)", path, what, strerror(err));
}

static ps_bundle_reader *reader_open(const char *prefix, bool nofollow, ps_status *st);

ps_bundle_reader *ps_bundle_reader_open(const char *prefix, ps_status *st) {
  return reader_open(prefix, false, st);
}

ps_bundle_reader *ps_bundle_reader_open_nofollow(const char *prefix, ps_status *st) {
  return reader_open(prefix, true, st);
}

static ps_bundle_reader *reader_open(const char *prefix, bool nofollow, ps_status *st) {
  if (prefix == NULL || prefix[0] == '\0') {
    ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint prefix is empty");
    return NULL;
  }
  ps_bundle_reader *r = calloc(1, sizeof *r);
  char *file = NULL;
  if (r == NULL) goto oom;
  pthread_mutex_init(&r->mu, NULL);
  r->prefix = strdup(prefix);
  r->index_path = ps_bdl_path_cat_(prefix, ".index");
  if (r->prefix == NULL || r->index_path == NULL) goto oom;
  r->nofollow = nofollow;
  size_t n = 0;
  unsigned type = 0;
  /* the index is read whole: no limit but memory */
  int e = ps_read_file(AT_FDCWD, r->index_path,
                       PS_READ_REGULAR | (nofollow ? PS_READ_NOFOLLOW : 0), SIZE_MAX,
                       &file, &n, &type, NULL);
  if (e != 0 && (type != 0 || e == ELOOP)) {
    open_failed(r->index_path, e, type, "", st);
    goto fail;
  }
  if (e != 0) {
    ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: %s", r->index_path,
                  e == ENOENT ? "not found" : strerror(e));
    goto fail;
  }
  table_src src = {r->index_path, (const uint8_t *)file, n};
  load_state ls = {r, false};
  if (ps_bdl_table_read_(&src, load_kv, &ls, st) != 0) goto fail;
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
  ps_bdl_es_free_(&r->set);
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
    int c = ps_bdl_cmp_key_(e->key, e->key_len, k, n);
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
    if (sh->path == NULL)
      sh->path = ps_bdl_data_path_(r->prefix, e->shard_id, r->num_shards);
    if (sh->path == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         r->prefix);
    } else {
      unsigned type = 0;
      int fd = ps_open_regular(AT_FDCWD, sh->path, r->nofollow, &type);
      struct stat sb;
      if (fd < 0 || fstat(fd, &sb) != 0) {
        int err = errno;
        if (fd >= 0) close(fd);
        rc = open_failed(sh->path, err, type,
                         err == ENOENT ? "missing data shard" : "cannot open data shard",
                         st);
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
                         sh->path, ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
                         e->offset, e->size, sh->size);
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
                           ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
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
                       ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb), what, stored,
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
  size_t es = ps_bdl_elem_size_(e->dtype);
  if (es == 0)
    return ps_status_set(
        st, e->dtype == DT_STRING ? PS_INVALID_ARGUMENT : PS_UNIMPLEMENTED,
        "checkpoint %s: tensor %s: dtype %s (%d) is not a "
        "fixed-size type",
        r->index_path, ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
        ps_dtype_enum_name(e->dtype), e->dtype);
  uint64_t n = (uint64_t)ps_shape_num_elements(&e->shape);
  if (n > UINT64_MAX / es || n * es != e->size)
    return ps_status_set(st, PS_DATA_LOSS,
                         "checkpoint %s: tensor %s: invalid size in bundle entry "
                         "(stored %" PRIu64 " bytes, the shape needs %" PRIu64 ")",
                         r->index_path,
                         ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb), e->size,
                         n > UINT64_MAX / es ? UINT64_MAX : n * es);
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
  if (r->endianness != ps_bdl_host_endianness_())
    swap_bytes(dst, (size_t)n, ps_bdl_swap_size_(e->dtype));
  return 0;
}

/* Reads plain fixed-size entry @e through a bounded scratch buffer and
 * verifies its checksum, keeping nothing. */
static int check_fixed(ps_bundle_reader *r, const ps_bundle_entry *e, ps_status *st) {
  uint64_t n;
  uint32_t crc;
  int rc = check_fixed_entry(r, e, &n, st);
  if (rc == 0) rc = read_range(r, e, NULL, &crc, st);
  if (rc == 0 && crc != ps_crc32c_unmask(e->crc32c))
    rc = checksum_mismatch(r, e, "data checksum", ps_crc32c_unmask(e->crc32c), crc, st);
  return rc;
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
    ps_bdl_slice_bounds_(sl, full, d, &b->lo[d], &b->hi[d]);
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
/* A slice of an entry stored whole: read it, and copy the box out when the
 * slice is not all of it. */
static int read_from_whole(ps_bundle_reader *r, const ps_bundle_entry *e, const box *tb,
                           const ps_bundle_slice *t, uint8_t *dst, bool verify,
                           ps_status *st) {
  uint64_t n;
  int rc;
  if ((rc = check_fixed_entry(r, e, &n, st)) != 0) return rc;
  if (dst == NULL) return verify ? check_fixed(r, e, st) : 0;
  if (ps_bdl_slice_is_full_(t, &e->shape)) return read_fixed(r, e, dst, st);
  uint8_t *tmp = malloc(n ? (size_t)n : 1);
  if (tmp == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         r->prefix);
  rc = read_fixed(r, e, tmp, st);
  if (rc == 0) {
    int64_t zero[PS_MAX_RANK] = {0};
    copy_box(e->shape.rank, ps_bdl_elem_size_(e->dtype), tb->lo, tb->hi, tmp, zero,
             e->shape.dim, dst, tb->lo, tb->dim);
  }
  free(tmp);
  return rc;
}

/* The stored slices of @e that meet box @tb, into use[0..*nuse); they must
 * not overlap and must cover @tb. */
static int slices_covering(ps_bundle_reader *r, const ps_bundle_entry *e, const box *tb,
                           const ps_bundle_slice *t, size_t *use, size_t *nuse,
                           ps_status *st) {
  char kb[KEYBUF], sb[512];
  int rank = e->shape.rank;
  int64_t covered = 0;
  box sbox, ibox, jbox, x;
  *nuse = 0;
  for (size_t i = 0; i < e->nslices; i++) {
    make_box(&e->slices[i], &e->shape, &sbox);
    int64_t v = intersect(&sbox, tb, rank, &ibox);
    if (v == 0) continue;
    for (size_t j = 0; j < *nuse; j++) {
      make_box(&e->slices[use[j]], &e->shape, &jbox);
      if (intersect(&sbox, &jbox, rank, &x) != 0)
        return ps_status_set(
            st, PS_DATA_LOSS,
            "checkpoint %s: tensor %s: stored slices %zu and %zu "
            "overlap",
            r->index_path, ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb), use[j], i);
    }
    use[(*nuse)++] = i;
    covered += v;
  }
  int64_t want = 1;
  for (int d = 0; d < rank; d++)
    want *= tb->dim[d];
  if (covered != want)
    return ps_status_set(st, PS_NOT_FOUND,
                         "checkpoint %s: tensor %s: the stored slices do not cover "
                         "slice %s",
                         r->prefix, ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
                         slice_spec(t, sb, sizeof sb));
  return 0;
}

/* Every contributing slice entry must exist, match and be in its file. */
static int check_slice_entries(ps_bundle_reader *r, const ps_bundle_entry *e,
                               const size_t *use, size_t nuse, bbuf *key, ps_status *st) {
  char kb[KEYBUF], sb[512];
  uint64_t n;
  int rc = 0;
  for (size_t k = 0; k < nuse && rc == 0; k++) {
    const ps_bundle_slice *sl = &e->slices[use[k]];
    key->n = 0;
    ps_bdl_encode_slice_key_(key, e->key, e->key_len, sl);
    const ps_bundle_entry *se =
        key->oom ? NULL : find_key(r, (const char *)key->p, key->n);
    ps_shape ss;
    ps_bdl_slice_shape_(sl, &e->shape, &ss);
    if (se == NULL || se->nslices != 0 || se->dtype != e->dtype ||
        !ps_shape_equal(&se->shape, &ss))
      rc =
          ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: tensor %s: slice %s is %s",
                        r->index_path, ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
                        slice_spec(sl, sb, sizeof sb),
                        se ? "stored with another dtype or shape" : "missing");
    else
      rc = check_fixed_entry(r, se, &n, st);
  }
  return rc;
}

/* Copies the part of each contributing slice inside box @tb into @dst. */
static int copy_slices(ps_bundle_reader *r, const ps_bundle_entry *e, const box *tb,
                       const size_t *use, size_t nuse, bbuf *key, uint8_t *dst,
                       ps_status *st) {
  int rank = e->shape.rank, rc = 0;
  size_t es = ps_bdl_elem_size_(e->dtype);
  box sbox, ibox;
  for (size_t k = 0; k < nuse && rc == 0; k++) {
    const ps_bundle_slice *sl = &e->slices[use[k]];
    key->n = 0;
    ps_bdl_encode_slice_key_(key, e->key, e->key_len, sl);
    const ps_bundle_entry *se = find_key(r, (const char *)key->p, key->n);
    make_box(sl, &e->shape, &sbox);
    intersect(&sbox, tb, rank, &ibox);
    if (memcmp(sbox.lo, tb->lo, (size_t)rank * sizeof tb->lo[0]) == 0 &&
        memcmp(sbox.hi, tb->hi, (size_t)rank * sizeof tb->hi[0]) == 0) {
      rc = read_fixed(r, se, dst, st); /* the slice is exactly what is wanted */
      continue;
    }
    uint8_t *tmp = malloc(se->size ? (size_t)se->size : 1);
    if (tmp == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                           r->prefix);
    rc = read_fixed(r, se, tmp, st);
    if (rc == 0)
      copy_box(rank, es, ibox.lo, ibox.hi, tmp, sbox.lo, sbox.dim, dst, tb->lo, tb->dim);
    free(tmp);
  }
  return rc;
}

/* @dst NULL and @verify: every stored piece the slice touches is read
 * through a bounded scratch buffer and checksummed, nothing kept. */
static int read_slice_impl(ps_bundle_reader *r, const ps_bundle_entry *e,
                           const ps_bundle_slice *t, uint8_t *dst, bool verify,
                           ps_status *st) {
  box tb;
  make_box(t, &e->shape, &tb);
  if (e->nslices == 0) return read_from_whole(r, e, &tb, t, dst, verify, st);
  char kb[KEYBUF];
  if (ps_bdl_elem_size_(e->dtype) == 0)
    return ps_status_set(st, PS_UNIMPLEMENTED,
                         "checkpoint %s: tensor %s: partitioned tensors of dtype %s "
                         "are not supported",
                         r->index_path,
                         ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
                         ps_dtype_enum_name(e->dtype));
  size_t *use = malloc(e->nslices * sizeof *use), nuse = 0;
  if (use == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                         r->prefix);
  bbuf key = {0};
  int rc = slices_covering(r, e, &tb, t, use, &nuse, st);
  if (rc == 0) rc = check_slice_entries(r, e, use, nuse, &key, st);
  if (rc == 0 && dst != NULL) rc = copy_slices(r, e, &tb, use, nuse, &key, dst, st);
  for (size_t k = 0; rc == 0 && dst == NULL && verify && k < nuse; k++) {
    key.n = 0;
    ps_bdl_encode_slice_key_(&key, e->key, e->key_len, &e->slices[use[k]]);
    const ps_bundle_entry *se = key.oom ? NULL : find_key(r, (const char *)key.p, key.n);
    rc = se ? check_fixed(r, se, st)
            : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory",
                            r->prefix);
  }
  ps_bdl_bb_free_(&key);
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
  size_t es = ps_bdl_elem_size_(e->dtype);
  if (es == 0)
    return ps_status_set(st,
                         e->dtype == DT_STRING ? PS_INVALID_ARGUMENT : PS_UNIMPLEMENTED,
                         "checkpoint %s: tensor %s: dtype %s (%d) is not a "
                         "fixed-size type",
                         r->prefix, ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
                         ps_dtype_enum_name(e->dtype), e->dtype);
  ps_shape ts;
  ps_bdl_slice_shape_(t, &e->shape, &ts);
  uint64_t n = (uint64_t)ps_shape_num_elements(&ts);
  if (n > SIZE_MAX / es || n * es != nbytes)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s: a buffer of %zu bytes given for "
                         "%s %s",
                         r->prefix, ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
                         nbytes, ps_dtype_name(e->dtype),
                         ps_shape_format(&ts, sb, sizeof sb));
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
  return read_slice_impl(r, e, &t, dst, false, st);
}

int ps_bundle_reader_check(ps_bundle_reader *r, const char *key, ps_status *st) {
  const ps_bundle_entry *e = ps_bundle_reader_find(r, key);
  if (e == NULL) return not_found(r, key, st);
  if (e->nslices > 0 || e->dtype == DT_STRING)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: %s is not a plain fixed-size tensor",
                         r->index_path, key);
  return check_fixed(r, e, st);
}

int ps_bundle_reader_check_slice(ps_bundle_reader *r, const char *full_name,
                                 const int64_t *start, const int64_t *length,
                                 size_t nbytes, ps_status *st) {
  const ps_bundle_entry *e = ps_bundle_reader_find(r, full_name);
  if (e == NULL) return not_found(r, full_name, st);
  ps_bundle_slice t;
  int rc;
  if (start == NULL)
    full_slice(e->shape.rank, &t);
  else if ((rc = ps_bdl_make_slice_(&e->shape, start, length, &t, full_name, st)) != 0)
    return rc;
  if ((rc = check_dst(r, e, &t, nbytes, st)) != 0) return rc;
  return read_slice_impl(r, e, &t, NULL, true, st);
}

int ps_bundle_reader_read_slice(ps_bundle_reader *r, const char *full_name,
                                const int64_t *start, const int64_t *length, void *dst,
                                size_t nbytes, ps_status *st) {
  const ps_bundle_entry *e = ps_bundle_reader_find(r, full_name);
  if (e == NULL) return not_found(r, full_name, st);
  ps_bundle_slice t;
  int rc = ps_bdl_make_slice_(&e->shape, start, length, &t, full_name, st);
  if (rc == 0) rc = check_dst(r, e, &t, nbytes, st);
  if (rc != 0) return rc;
  return read_slice_impl(r, e, &t, dst, false, st);
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
        r->prefix, ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
        ps_dtype_enum_name(e->dtype), e->dtype,
        e->dtype == DT_STRING ? " (use ps_bundle_reader_read_strings)" : "");
  ps_bundle_slice t;
  full_slice(e->shape.rank, &t);
  int rc = read_slice_impl(r, e, &t, NULL, false, st); /* checks before allocating */
  if (rc != 0) return rc;
  ps_tensor *x = ps_tensor_create((ps_dtype)e->dtype, &e->shape, false);
  if (x == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "checkpoint %s: tensor %s: out of memory", r->prefix,
                         ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb));
  rc = read_slice_impl(r, e, &t, ps_tensor_data(x), false, st);
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
  uint32_t v = ps_bdl_get_le32_(p);
  return endianness ? __builtin_bswap32(v) : v;
}

static int read_strings(ps_bundle_reader *r, const ps_bundle_entry *e,
                        ps_bundle_strings **out, ps_status *st) {
  *out = NULL;
  char kb[KEYBUF];
  const char *ks = ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb);
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
    if (!ps_bdl_get_varint_(&p, end, &len) || len > e->size) {
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
    ps_bdl_get_varint_(&q, end, &len); /* checked above */
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
        ps_bdl_encode_slice_key_(&key, e->key, e->key_len, &e->slices[k]);
        const ps_bundle_entry *se =
            key.oom ? NULL : find_key(r, (const char *)key.p, key.n);
        ps_shape ss;
        ps_bdl_slice_shape_(&e->slices[k], &e->shape, &ss);
        if (se == NULL || se->nslices != 0 || se->dtype != e->dtype ||
            !ps_shape_equal(&se->shape, &ss))
          rc = ps_status_set(st, PS_DATA_LOSS, "checkpoint %s: tensor %s: slice %s is %s",
                             r->index_path,
                             ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb),
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
  ps_bdl_bb_free_(&key);
  return rc;
}
