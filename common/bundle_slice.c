/* Slices of partitioned tensors in bundles: TensorFlow's OrderedCode slice
 * keys, slice arithmetic, and the paths of a bundle's files. */
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
  ps_bdl_bb_put_(b, tmp, (size_t)n + 1);
}

/* String: 00 -> 00 ff, ff -> ff 00, then the terminator 00 01. */
static void oc_string(bbuf *b, const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (s[i] == 0x00) {
      ps_bdl_bb_byte_(b, 0x00);
      ps_bdl_bb_byte_(b, 0xff);
    } else if (s[i] == 0xff) {
      ps_bdl_bb_byte_(b, 0xff);
      ps_bdl_bb_byte_(b, 0x00);
    } else {
      ps_bdl_bb_byte_(b, s[i]);
    }
  }
  ps_bdl_bb_byte_(b, 0x00);
  ps_bdl_bb_byte_(b, 0x01);
}

/* SignedNumIncreasing: one byte 0x80 ^ v for |v| < 64; otherwise the low
 * L bytes of v's 10-byte sign-extended big-endian form, L = 1 + bits/7,
 * with a header of L-1 one bits XORed into the first bytes. */
static void oc_signed_num_increasing(bbuf *b, int64_t v) {
  uint64_t x = v < 0 ? ~(uint64_t)v : (uint64_t)v;
  if (x < 64) {
    ps_bdl_bb_byte_(b, (uint8_t)(0x80 ^ (uint8_t)v));
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
  ps_bdl_bb_put_(b, begin, (size_t)len);
}

/* The key TensorFlow's EncodeTensorNameSlice gives slice @sl of @name. */
void ps_bdl_encode_slice_key_(bbuf *b, const char *name, size_t name_len,
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
void ps_bdl_slice_bounds_(const ps_bundle_slice *sl, const ps_shape *full, int d,
                          int64_t *lo, int64_t *hi) {
  if (sl->length[d] < 0) {
    *lo = 0;
    *hi = full->dim[d];
  } else {
    *lo = sl->start[d];
    *hi = sl->start[d] + sl->length[d];
  }
}

void ps_bdl_slice_shape_(const ps_bundle_slice *sl, const ps_shape *full, ps_shape *out) {
  out->rank = sl->rank;
  for (int d = 0; d < sl->rank; d++) {
    int64_t lo, hi;
    ps_bdl_slice_bounds_(sl, full, d, &lo, &hi);
    out->dim[d] = hi - lo;
  }
}

bool ps_bdl_slice_is_full_(const ps_bundle_slice *sl, const ps_shape *full) {
  ps_shape s;
  ps_bdl_slice_shape_(sl, full, &s);
  return ps_shape_equal(&s, full);
}

/* Fills @sl from caller arrays, checking it against @full. */
int ps_bdl_make_slice_(const ps_shape *full, const int64_t *start, const int64_t *length,
                       ps_bundle_slice *sl, const char *name, ps_status *st) {
  sl->rank = full->rank;
  for (int d = 0; d < full->rank; d++) {
    sl->start[d] = start[d];
    sl->length[d] = length[d];
  }
  if (!ps_bdl_slice_inside_(sl, full)) {
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
  if (sl.rank != sh.rank || !ps_bdl_slice_inside_(&sl, &sh))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "shape_and_slice \"%s\": the slice does not match the shape",
                         spec);
  *full = sh;
  *slice = sl;
  *sliced = true;
  return 0;
}

char *ps_bundle_data_filename(const char *prefix, int id, int num_shards, char *buf,
                              size_t n) {
  int r = snprintf(buf, n, "%s.data-%05d-of-%05d", prefix, id, num_shards);
  return (r < 0 || (size_t)r >= n) ? NULL : buf;
}

/* malloc'd "prefix.data-..." or "prefix" + suffix; NULL if out of memory. */
char *ps_bdl_data_path_(const char *prefix, int id, int num_shards) {
  size_t n = strlen(prefix) + 40;
  char *p = malloc(n);
  if (p) ps_bundle_data_filename(prefix, id, num_shards, p, n);
  return p;
}

char *ps_bdl_path_cat_(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  char *p = malloc(na + nb + 1);
  if (p == NULL) return NULL;
  memcpy(p, a, na);
  memcpy(p + na, b, nb + 1);
  return p;
}

/* "P.tempstate<random decimal>", TensorFlow's temporary names. */
char *ps_bdl_temp_path_(const char *path) {
  uint64_t r;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
    r = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&r ^ (uint64_t)time(NULL);
  char suffix[40];
  snprintf(suffix, sizeof suffix, ".tempstate%" PRIu64, r);
  return ps_bdl_path_cat_(path, suffix);
}

/* mkdir -p */
int ps_bdl_make_dirs_(const char *dir) {
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
int ps_bdl_write_temp_(const char *path, const uint8_t *p, size_t n, char **tmp) {
  *tmp = ps_bdl_temp_path_(path);
  if (*tmp == NULL) return ENOMEM;
  int err = ps_write_file(*tmp, p, n, NULL);
  if (err != 0) {
    free(*tmp);
    *tmp = NULL;
  }
  return err;
}

/* ps_replace_file with TensorFlow's temporary name.  0 or an errno. */
int ps_bdl_write_file_atomic_(const char *path, const uint8_t *p, size_t n) {
  char *tmp = ps_bdl_temp_path_(path);
  if (tmp == NULL) return ENOMEM;
  int err = ps_replace_file(path, tmp, p, n, NULL, NULL);
  free(tmp);
  return err;
}
