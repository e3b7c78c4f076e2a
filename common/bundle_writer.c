/* The bundle writer (ps_bundle_writer_*): entry sets, data files written
 * through a copy buffer with their checksums, the index at finish.  See
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
#include "common/array.h"
#include "crc32c.h"
#include "fileio.h"

/* ---- Entry sets ------------------------------------------------------- */

/* Entries by key: an array plus an open-addressing hash of indexes, used
 * by the writer and the merge (the reader keeps its array sorted). */

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

ps_bundle_entry *ps_bdl_es_find_(const entry_set *s, const char *k, size_t n) {
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
ps_bundle_entry *ps_bdl_es_add_(entry_set *s, const char *k, size_t n) {
  if (ps_array_grow(&s->e, &s->cap, s->n + 1, sizeof *s->e) != 0) return NULL;
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
bool ps_bdl_entry_add_slice_(ps_bundle_entry *e, const ps_bundle_slice *sl) {
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

void ps_bdl_es_free_(entry_set *s) {
  for (size_t i = 0; i < s->n; i++)
    entry_fini(&s->e[i]);
  free(s->e);
  free(s->slot);
  *s = (entry_set){0};
}

int ps_bdl_cmp_key_(const char *a, size_t an, const char *b, size_t bn) {
  size_t m = an < bn ? an : bn;
  int c = m ? memcmp(a, b, m) : 0;
  if (c != 0) return c;
  return an < bn ? -1 : an > bn;
}

static int cmp_entry_ptr(const void *a, const void *b) {
  const ps_bundle_entry *x = *(const ps_bundle_entry *const *)a;
  const ps_bundle_entry *y = *(const ps_bundle_entry *const *)b;
  return ps_bdl_cmp_key_(x->key, x->key_len, y->key, y->key_len);
}

/* The index table for @s: header first, then the entries sorted by key.
 * False if out of memory. */
bool ps_bdl_build_index_(const entry_set *s, int num_shards, int endianness,
                         const uint8_t *version, size_t version_len, bbuf *out) {
  const ps_bundle_entry **sorted = malloc((s->n ? s->n : 1) * sizeof *sorted);
  if (sorted == NULL) return false;
  for (size_t i = 0; i < s->n; i++)
    sorted[i] = &s->e[i];
  qsort(sorted, s->n, sizeof *sorted, cmp_entry_ptr);
  table_builder tb;
  ps_bdl_tb_init_(&tb);
  bbuf v = {0};
  ps_bdl_encode_header_(&v, num_shards, endianness, version, version_len);
  ps_bdl_tb_add_(&tb, (const uint8_t *)"", 0, v.p, v.n);
  for (size_t i = 0; i < s->n && !v.oom; i++) {
    v.n = 0;
    ps_bdl_encode_entry_(&v, sorted[i]);
    ps_bdl_tb_add_(&tb, (const uint8_t *)sorted[i]->key, sorted[i]->key_len, v.p, v.n);
  }
  bool ok = !v.oom && ps_bdl_tb_finish_(&tb);
  ps_bdl_bb_free_(&v);
  free(sorted);
  if (ok) {
    *out = tb.out;
    tb.out = (bbuf){0};
  }
  ps_bdl_tb_free_(&tb);
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
  ps_status_set(&w->err, ps_status_code_from_errno(e), "checkpoint %s: %s: %s", path,
                what, strerror(e));
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
  w->data_final = ps_bdl_data_path_(prefix, 0, 1);
  w->data_tmp = w->data_final ? ps_bdl_temp_path_(w->data_final) : NULL;
  w->buf = malloc(WRITE_BUF);
  if (w->prefix == NULL || w->data_tmp == NULL || w->buf == NULL) goto oom;
  char *dir = ps_dir_of(prefix);
  if (dir == NULL) goto oom;
  int e = ps_bdl_make_dirs_(dir);
  if (e != 0) {
    ps_status_set(st, ps_status_code_from_errno(e),
                  "checkpoint %s: cannot create directory %s: %s", prefix, dir,
                  strerror(e));
    free(dir);
    goto fail;
  }
  free(dir);
  w->fd = open(w->data_tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (w->fd < 0) {
    e = errno;
    ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: cannot create: %s",
                  w->data_tmp, strerror(e));
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
  if (ps_bdl_es_find_(&w->set, key, klen) != NULL) {
    char kb[KEYBUF];
    return ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint %s: tensor %s added twice",
                         w->prefix, ps_bdl_key_str_(key, klen, kb, sizeof kb));
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
  ps_bundle_entry *e = ps_bdl_es_add_(&w->set, key, klen);
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
  size_t es = ps_bdl_elem_size_(dtype);
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
    ps_bdl_bb_varint_(&v, len);
    uint8_t le[8];
    for (int j = 0; j < 8; j++)
      le[j] = (uint8_t)(len >> (8 * j));
    crc = ps_crc32c_extend(crc, le, len <= UINT32_MAX ? 4 : 8);
    size += len;
  }
  if (v.oom) {
    ps_bdl_bb_free_(&v);
    return writer_oom(w, st);
  }
  uint64_t offset = w->bytes;
  uint32_t ignored = 0;
  uint8_t lc[4];
  ps_bdl_put_le32_(lc, ps_crc32c_mask(crc));
  rc = writer_put(w, v.p, v.n, &ignored, st);
  if (rc == 0) rc = writer_put(w, lc, 4, &crc, st);
  for (size_t i = 0; i < n && rc == 0; i++)
    rc = writer_put(w, strs[i], lens ? lens[i] : strlen(strs[i]), &crc, st);
  size += v.n + 4;
  ps_bdl_bb_free_(&v);
  if (rc != 0) return rc;
  ps_bundle_entry *e = ps_bdl_es_add_(&w->set, key, klen);
  if (e == NULL) return writer_oom(w, st);
  e->dtype = DT_STRING;
  e->shape = *shape;
  e->offset = offset;
  e->size = size;
  e->crc32c = ps_crc32c_mask(crc);
  return 0;
}

bool ps_bdl_slices_overlap_(const ps_bundle_slice *a, const ps_bundle_slice *b,
                            const ps_shape *full) {
  for (int d = 0; d < full->rank; d++) {
    int64_t alo, ahi, blo, bhi;
    ps_bdl_slice_bounds_(a, full, d, &alo, &ahi);
    ps_bdl_slice_bounds_(b, full, d, &blo, &bhi);
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
  if (rc == 0) rc = ps_bdl_make_slice_(full_shape, start, length, &sl, full_name, st);
  if (rc != 0) return rc;
  ps_bdl_slice_shape_(&sl, full_shape, &ss);
  if (ps_bdl_slice_is_full_(&sl, full_shape))
    return ps_bundle_writer_add(w, full_name, dtype, full_shape, data, nbytes, st);
  if (full_shape->rank == 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s: a scalar cannot be sliced", w->prefix,
                         full_name);
  if ((rc = check_fixed(w->prefix, full_name, dtype, &ss, nbytes, st)) != 0) return rc;
  ps_bundle_entry *full = ps_bdl_es_find_(&w->set, full_name, nlen);
  if (full != NULL) {
    if (full->nslices == 0 || full->dtype != dtype ||
        !ps_shape_equal(&full->shape, full_shape))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "checkpoint %s: tensor %s added twice (as a whole tensor "
                           "or with another dtype or shape)",
                           w->prefix, full_name);
    for (size_t i = 0; i < full->nslices; i++)
      if (ps_bdl_slices_overlap_(&full->slices[i], &sl, full_shape))
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "checkpoint %s: tensor %s: slice %zu overlaps one "
                             "added before",
                             w->prefix, full_name, full->nslices);
  }
  bbuf key = {0};
  ps_bdl_encode_slice_key_(&key, full_name, nlen, &sl);
  if (key.oom) return writer_oom(w, st);
  if (ps_bdl_es_find_(&w->set, (const char *)key.p, key.n) != NULL) { /* an empty slice */
    ps_bdl_bb_free_(&key);
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint %s: tensor %s: the same slice added twice",
                         w->prefix, full_name);
  }
  rc = writer_add_raw(w, (const char *)key.p, key.n, dtype, &ss, data, nbytes, st);
  ps_bdl_bb_free_(&key);
  if (rc != 0) return rc;
  /* the slice's entry may have moved the entries: find the full one again */
  full = ps_bdl_es_find_(&w->set, full_name, nlen);
  if (full == NULL) {
    full = ps_bdl_es_add_(&w->set, full_name, nlen);
    if (full == NULL) return writer_oom(w, st);
    full->dtype = dtype;
    full->shape = *full_shape;
  }
  if (!ps_bdl_entry_add_slice_(full, &sl)) return writer_oom(w, st);
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
  if (!ps_bdl_build_index_(&w->set, 1, ps_bdl_host_endianness_(), ps_bdl_new_version_,
                           sizeof ps_bdl_new_version_, &idx))
    return writer_oom(w, st);
  char *path = ps_bdl_path_cat_(w->prefix, ".index");
  if (path == NULL) {
    ps_bdl_bb_free_(&idx);
    return writer_oom(w, st);
  }
  int e = ps_bdl_write_file_atomic_(path, idx.p, idx.n);
  ps_bdl_bb_free_(&idx);
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
  ps_bdl_es_free_(&w->set);
  free(w->buf);
  free(w->prefix);
  free(w->data_tmp);
  free(w->data_final);
  free(w);
}
