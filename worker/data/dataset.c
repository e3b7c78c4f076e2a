/* Datasets for the built-in models: IDX files, Fashion-MNIST, synthetic
 * regression and click-through data, batches and a sharding iterator.
 *
 * IDX is the format of LeCun's MNIST and of Fashion-MNIST:
 *
 *   magic    4 bytes: 0x00 0x00, a type byte, a rank byte (1..255; we
 *            take 1..PS_MAX_RANK).  Types: 0x08 uint8, 0x09 int8,
 *            0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64.
 *   dims     rank big-endian uint32s, outermost first.
 *   data     the product of the dims elements, C order, each big-endian;
 *            nothing after them.
 *
 * Files are usually gzip-compressed.  zlib's gzread reads gzip and plain
 * files alike, so one path serves both and the name does not matter.  The
 * header is outside input: the dims are checked for overflow, and memory
 * grows with the data actually read, so a header that claims terabytes
 * costs nothing but an error.  After the data we read one more byte, which
 * finds trailing garbage and makes zlib check the gzip trailer's CRC.
 *
 * Synthetic data come from Philox streams keyed by the caller's seed with a
 * fixed seed2 per purpose (prototypes, examples, weights), so they depend on
 * the arguments only; the generators are simple on purpose: what matters is
 * that a model of the intended kind can learn them, and that tests can
 * check that it did. */
#include "paramserver/dataset.h"
#include "common/appendf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "common/log.h"
#include "common/philox.h"
#include "common/tensor.h"

/* ---- datasets ---- */

/* The named tensors, in a fixed order. */
static const char *const field_names[] = {"x", "ids", "dense", "y"};
enum { NFIELDS = 4 };

static ps_tensor **field(ps_dataset *d, int i) {
  ps_tensor **f[NFIELDS] = {&d->x, &d->ids, &d->dense, &d->y};
  return f[i];
}

static ps_tensor *field_c(const ps_dataset *d, int i) {
  ps_tensor *f[NFIELDS] = {d->x, d->ids, d->dense, d->y};
  return f[i];
}

void ps_dataset_free(ps_dataset *d) {
  if (d == NULL) return;
  for (int i = 0; i < NFIELDS; i++)
    ps_tensor_destroy(*field(d, i));
  *d = (ps_dataset){0};
}

ps_tensor *ps_dataset_tensor(const ps_dataset *d, const char *name) {
  for (int i = 0; i < NFIELDS; i++)
    if (strcmp(name, field_names[i]) == 0) return field_c(d, i);
  return NULL;
}

/* A tensor of @dtype with dims @d0 (and @d1 when rank 2). */
static ps_tensor *new_tensor(ps_dtype dtype, int rank, int64_t d0, int64_t d1) {
  ps_shape s = {.rank = rank, .dim = {d0, d1}};
  return ps_tensor_create(dtype, &s, false);
}

static int oom(ps_status *st, const char *what) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "%s: out of memory", what);
}

/* ---- random numbers ---- */

typedef struct rng {
  ps_philox p;
  uint32_t w[4];
  int used; /* words of w already handed out */
} rng;

static void rng_init(rng *r, uint64_t seed, uint64_t seed2) {
  ps_philox_init(&r->p, seed, seed2);
  r->used = 4;
}

static uint32_t rng_u32(rng *r) {
  if (r->used == 4) {
    ps_philox_next(&r->p, r->w);
    r->used = 0;
  }
  return r->w[r->used++];
}

static double rng_uniform(rng *r) { /* [0,1) */
  uint32_t a = rng_u32(r);
  return ps_uint64_to_double(a, rng_u32(r));
}

static double rng_normal(rng *r) {
  uint32_t w[4];
  for (int i = 0; i < 4; i++)
    w[i] = rng_u32(r);
  double a, b;
  ps_box_muller_double(w[0], w[1], w[2], w[3], &a, &b);
  return a;
}

/* Uniform in [0, n) (n >= 1); the modulo bias is below 2^-32 for n < 2^32. */
static int64_t rng_below(rng *r, int64_t n) {
  uint64_t hi = rng_u32(r);
  uint64_t v = hi << 32 | rng_u32(r);
  return (int64_t)(v % (uint64_t)n);
}

/* seed2 of each purpose's Philox stream */
enum {
  STREAM_PARAMS = 1,    /* prototypes, true weights */
  STREAM_TRAIN = 2,     /* examples (train split) */
  STREAM_TEST = 3,      /* examples (test split) */
  STREAM_ID_WEIGHT = 4, /* ctr: weight of id k is the normal at counter k */
  STREAM_LOG = 5,       /* ctr_log: the examples */
  STREAM_KEY_WEIGHT = 6 /* ctr_log: the weight of a key (counter: its hash) */
};

/* ---- IDX files ---- */

/* The error zlib recorded for @f, if any (a truncated gzip stream is not
 * an error here: the caller sees the short count). */
static int gz_fault(gzFile f, const char *path, ps_status *st) {
  int errnum = Z_OK;
  const char *msg = gzerror(f, &errnum);
  if (errnum == Z_OK || errnum == Z_BUF_ERROR) return 0;
  if (errnum == Z_ERRNO)
    return ps_status_set(st, ps_status_code_from_errno(errno), "IDX file %s: read: %s",
                         path, strerror(errno));
  if (errnum == Z_MEM_ERROR) return oom(st, path);
  return ps_status_set(st, PS_DATA_LOSS, "IDX file %s: corrupt gzip data: %s", path, msg);
}

/* Reads up to @n bytes; *@got says how many came before the end of the
 * file.  Nonzero only for a read error or corrupt gzip data. */
static int gz_read_full(gzFile f, const char *path, void *buf, size_t n, size_t *got,
                        ps_status *st) {
  *got = 0;
  while (*got < n) {
    size_t want = n - *got;
    if (want > (1u << 30)) want = 1u << 30;
    int r = gzread(f, (uint8_t *)buf + *got, (unsigned)want);
    if (r < 0) {
      if (gz_fault(f, path, st) == 0)
        ps_status_set(st, PS_UNKNOWN, "IDX file %s: read failed", path);
      return -1;
    }
    *got += (size_t)r;
    if (gz_fault(f, path, st) != 0) return -1;
    if (r == 0) break;
  }
  return 0;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static ps_dtype idx_dtype(int type) {
  switch (type) {
  case 0x08:
    return PS_DT_UINT8;
  case 0x09:
    return PS_DT_INT8;
  case 0x0B:
    return PS_DT_INT16;
  case 0x0C:
    return PS_DT_INT32;
  case 0x0D:
    return PS_DT_FLOAT;
  case 0x0E:
    return PS_DT_DOUBLE;
  default:
    return PS_DT_INVALID;
  }
}

/* Big-endian elements of @es bytes to host order, in place. */
static void from_big_endian(uint8_t *p, size_t n, size_t es) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  (void)p, (void)n, (void)es;
#else
  for (size_t i = 0; es > 1 && i + es <= n; i += es)
    for (size_t a = 0, b = es - 1; a < b; a++, b--) {
      uint8_t t = p[i + a];
      p[i + a] = p[i + b];
      p[i + b] = t;
    }
#endif
}

/* The data, after the header: memory grows with what is read. */
static int idx_read_data(gzFile f, const char *path, size_t nbytes, uint8_t **out,
                         ps_status *st) {
  size_t cap = nbytes < ((size_t)16 << 20) ? nbytes : (size_t)16 << 20, have = 0;
  uint8_t *buf = malloc(cap ? cap : 1);
  if (buf == NULL) return oom(st, path);
  for (;;) {
    size_t got;
    if (gz_read_full(f, path, buf + have, cap - have, &got, st) != 0) goto fail;
    have += got;
    if (have < cap) {
      ps_status_set(st, PS_DATA_LOSS,
                    "IDX file %s: truncated: expected %zu bytes of data, file has %zu",
                    path, nbytes, have);
      goto fail;
    }
    if (cap == nbytes) break;
    size_t ncap = cap > nbytes / 2 ? nbytes : cap * 2;
    uint8_t *nb = realloc(buf, ncap);
    if (nb == NULL) {
      oom(st, path);
      goto fail;
    }
    buf = nb;
    cap = ncap;
  }
  uint8_t extra;
  size_t got;
  if (gz_read_full(f, path, &extra, 1, &got, st) != 0) goto fail;
  if (got != 0) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: expected %zu bytes of data, file has more (trailing "
                  "bytes after the data)",
                  path, nbytes);
    goto fail;
  }
  *out = buf;
  return 0;
fail:
  free(buf);
  return st->code;
}

int ps_idx_load(const char *path, ps_tensor **out, ps_status *st) {
  ps_status local;
  if (st == NULL) st = &local;
  *out = NULL;
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (f == NULL) {
    int e = errno ? errno : ENOMEM;
    return ps_status_set(st, ps_status_code_from_errno(e), "IDX file %s: %s", path,
                         e == ENOENT ? "not found" : strerror(e));
  }
  gzbuffer(f, 1 << 17);
  uint8_t *data = NULL;
  uint8_t hdr[4 + 4 * PS_MAX_RANK];
  size_t got;
  if (gz_read_full(f, path, hdr, 4, &got, st) != 0) goto fail;
  if (got < 4) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: truncated: %zu bytes, too short for the 4-byte magic "
                  "number",
                  path, got);
    goto fail;
  }
  uint32_t magic = be32(hdr);
  int type = hdr[2], rank = hdr[3];
  ps_dtype dtype = idx_dtype(type);
  if (hdr[0] != 0 || hdr[1] != 0) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: bad magic number 0x%08x (an IDX file starts with 0x0000 "
                  "then type and rank bytes; not an IDX file, or not gzip?)",
                  path, magic);
    goto fail;
  }
  if (dtype == PS_DT_INVALID) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: bad magic number 0x%08x: unknown element type 0x%02x",
                  path, magic, type);
    goto fail;
  }
  if (rank < 1 || rank > PS_MAX_RANK) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: bad magic number 0x%08x: rank %d (1 to %d supported)",
                  path, magic, rank, PS_MAX_RANK);
    goto fail;
  }
  if (gz_read_full(f, path, hdr + 4, 4 * (size_t)rank, &got, st) != 0) goto fail;
  if (got < 4 * (size_t)rank) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: truncated: expected %d bytes of dims, file has %zu", path,
                  4 * rank, got);
    goto fail;
  }
  ps_shape shape = {.rank = rank};
  size_t es = ps_dtype_size(dtype);
  uint64_t nbytes = es;
  bool overflow = false;
  char dims[16 * 12] = "";
  size_t dlen = 0;
  for (int i = 0; i < rank; i++) {
    uint32_t d = be32(hdr + 4 + 4 * i);
    shape.dim[i] = d;
    ps_appendf(dims, sizeof dims, &dlen, "%s%u", i ? "," : "", d);
    if (d != 0 && nbytes > (uint64_t)INT64_MAX / d)
      overflow = true;
    else
      nbytes *= d;
  }
  if (overflow || nbytes > SIZE_MAX) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: dims [%s] are too large: the size overflows", path, dims);
    goto fail;
  }
  if (idx_read_data(f, path, (size_t)nbytes, &data, st) != 0) goto fail;
  gzclose(f);
  f = NULL;
  ps_tensor *t = ps_tensor_create(dtype, &shape, false);
  if (t == NULL) {
    oom(st, path);
    goto fail;
  }
  if (nbytes) memcpy(ps_tensor_data(t), data, (size_t)nbytes);
  free(data);
  from_big_endian(ps_tensor_data(t), (size_t)nbytes, es);
  *out = t;
  return 0;
fail:
  free(data);
  if (f) gzclose(f);
  return st->code;
}

/* ---- Fashion-MNIST ---- */

enum { IMG_SIDE = 28, IMG_PIXELS = IMG_SIDE * IMG_SIDE, NCLASSES = 10 };

static const char *const fashion_files[4] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte"};

/* "dir/base.gz" if it exists, else "dir/base" if that exists. */
static bool find_file(const char *dir, const char *base, char *path, size_t n) {
  struct stat sb;
  snprintf(path, n, "%s/%s.gz", dir, base);
  if (stat(path, &sb) == 0) return true;
  snprintf(path, n, "%s/%s", dir, base);
  return stat(path, &sb) == 0;
}

/* Images and labels of one split into @out. */
static int fashion_load_split(const char *img_path, const char *lbl_path, ps_dataset *out,
                              ps_status *st) {
  ps_tensor *img = NULL, *lbl = NULL;
  ps_dataset d = {0};
  char s1[64], s2[64];
  if (ps_idx_load(img_path, &img, st) != 0) goto fail;
  if (ps_idx_load(lbl_path, &lbl, st) != 0) goto fail;
  if (img->dtype != PS_DT_UINT8 || img->shape.rank != 3 ||
      img->shape.dim[1] != IMG_SIDE || img->shape.dim[2] != IMG_SIDE) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: expected uint8 images of shape [N,28,28], got %s %s",
                  img_path, ps_dtype_name(img->dtype),
                  ps_shape_format(&img->shape, s1, sizeof s1));
    goto fail;
  }
  int64_t n = img->shape.dim[0];
  if (lbl->dtype != PS_DT_UINT8 || lbl->shape.rank != 1 || lbl->shape.dim[0] != n) {
    ps_status_set(st, PS_DATA_LOSS,
                  "IDX file %s: expected uint8 labels of shape [%lld] to match %s, got "
                  "%s %s",
                  lbl_path, (long long)n, ps_shape_format(&img->shape, s1, sizeof s1),
                  ps_dtype_name(lbl->dtype), ps_shape_format(&lbl->shape, s2, sizeof s2));
    goto fail;
  }
  const uint8_t *lp = ps_tensor_data(lbl), *ip = ps_tensor_data(img);
  for (int64_t i = 0; i < n; i++)
    if (lp[i] >= NCLASSES) {
      ps_status_set(st, PS_DATA_LOSS,
                    "IDX file %s: label %lld is %d, not a class in [0, 10)", lbl_path,
                    (long long)i, lp[i]);
      goto fail;
    }
  d.n = n;
  d.x = new_tensor(PS_DT_FLOAT, 2, n, IMG_PIXELS);
  d.y = new_tensor(PS_DT_INT64, 1, n, 0);
  if (d.x == NULL || d.y == NULL) {
    oom(st, img_path);
    goto fail;
  }
  float *x = ps_tensor_data(d.x);
  int64_t *y = ps_tensor_data(d.y);
  for (int64_t i = 0; i < n * IMG_PIXELS; i++)
    x[i] = ip[i] / 255.0f;
  for (int64_t i = 0; i < n; i++)
    y[i] = lp[i];
  ps_tensor_destroy(img);
  ps_tensor_destroy(lbl);
  *out = d;
  return 0;
fail:
  ps_dataset_free(&d);
  ps_tensor_destroy(img);
  ps_tensor_destroy(lbl);
  return st->code;
}

int ps_dataset_fashion_mnist(const char *dir, ps_dataset *train, ps_dataset *test,
                             bool *synthetic, ps_status *st) {
  ps_status local;
  if (st == NULL) st = &local;
  if (dir == NULL) dir = PS_FASHION_MNIST_DIR;
  if (synthetic) *synthetic = false;
  char path[4][1024];
  int found = 0, missing = -1;
  for (int i = 0; i < 4; i++) {
    if (find_file(dir, fashion_files[i], path[i], sizeof path[i]))
      found++;
    else if (missing < 0)
      missing = i;
  }
  if (found == 0) {
    PS_WARN("Fashion-MNIST: no data in %s: the Debian package dataset-fashion-mnist is "
            "not installed (apt-get install dataset-fashion-mnist); using synthetic "
            "data instead (10 classes, 60000 train / 10000 test 28x28 images)",
            dir);
    if (synthetic) *synthetic = true;
    return ps_dataset_fashion_mnist_synthetic(60000, 10000, 1, train, test, st);
  }
  if (missing >= 0)
    return ps_status_set(st, PS_NOT_FOUND,
                         "Fashion-MNIST in %s: %s(.gz) is missing (%d of the 4 files are "
                         "there; reinstall dataset-fashion-mnist)",
                         dir, fashion_files[missing], found);
  ps_dataset tr = {0}, te = {0};
  if (train && fashion_load_split(path[0], path[1], &tr, st) != 0) return st->code;
  if (test && fashion_load_split(path[2], path[3], &te, st) != 0) {
    ps_dataset_free(&tr);
    return st->code;
  }
  if (train) *train = tr;
  if (test) *test = te;
  return 0;
}

/* @n examples around @protos into @out. */
static int fashion_synth_split(int64_t n, const float *protos, uint64_t seed,
                               uint64_t stream, ps_dataset *out, ps_status *st) {
  ps_dataset d = {.n = n};
  d.x = new_tensor(PS_DT_FLOAT, 2, n, IMG_PIXELS);
  d.y = new_tensor(PS_DT_INT64, 1, n, 0);
  if (d.x == NULL || d.y == NULL) {
    ps_dataset_free(&d);
    return oom(st, "synthetic Fashion-MNIST");
  }
  float *x = ps_tensor_data(d.x);
  int64_t *y = ps_tensor_data(d.y);
  rng r;
  rng_init(&r, seed, stream);
  for (int64_t i = 0; i < n; i++) {
    int c = (int)rng_below(&r, NCLASSES);
    float scale = 0.6f + 0.8f * ps_uint32_to_float(rng_u32(&r));
    const float *p = protos + (size_t)c * IMG_PIXELS;
    float *xi = x + i * IMG_PIXELS;
    for (int j = 0; j < IMG_PIXELS; j++) {
      float v = scale * p[j] + 1.5f * (ps_uint32_to_float(rng_u32(&r)) - 0.5f);
      xi[j] = v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
    }
    y[i] = c;
  }
  *out = d;
  return 0;
}

int ps_dataset_fashion_mnist_synthetic(int64_t ntrain, int64_t ntest, uint64_t seed,
                                       ps_dataset *train, ps_dataset *test,
                                       ps_status *st) {
  if (ntrain < 0 || ntest < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "synthetic Fashion-MNIST: negative size (train %lld, test %lld)",
                         (long long)ntrain, (long long)ntest);
  /* Prototypes share a common base, as clothes share a silhouette; each
   * class adds its own pattern on top.  The noise (uniform, +-0.75 before
   * clamping) is strong enough that the task is not trivial: a
   * nearest-centroid classifier gets about 97%. */
  float *protos = malloc((size_t)NCLASSES * IMG_PIXELS * sizeof *protos);
  if (protos == NULL) return oom(st, "synthetic Fashion-MNIST");
  rng r;
  rng_init(&r, seed, STREAM_PARAMS);
  float base[IMG_PIXELS];
  for (int j = 0; j < IMG_PIXELS; j++)
    base[j] = ps_uint32_to_float(rng_u32(&r));
  for (int c = 0; c < NCLASSES; c++)
    for (int j = 0; j < IMG_PIXELS; j++)
      protos[c * IMG_PIXELS + j] =
          0.7f * base[j] + 0.3f * ps_uint32_to_float(rng_u32(&r));
  ps_dataset tr = {0}, te = {0};
  int rc = 0;
  if (train) rc = fashion_synth_split(ntrain, protos, seed, STREAM_TRAIN, &tr, st);
  if (rc == 0 && test)
    rc = fashion_synth_split(ntest, protos, seed, STREAM_TEST, &te, st);
  free(protos);
  if (rc != 0) {
    ps_dataset_free(&tr);
    return rc;
  }
  if (train) *train = tr;
  if (test) *test = te;
  return 0;
}

/* ---- linear regression ---- */

int ps_dataset_linreg(int64_t n, int64_t dim, uint64_t seed, ps_dataset *out,
                      double *true_w, double *true_b, ps_status *st) {
  if (n < 0 || dim < 1)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "linreg dataset: bad size n=%lld dim=%lld (need n >= 0, dim >= 1)", (long long)n,
        (long long)dim);
  double *w = malloc((size_t)dim * sizeof *w);
  ps_dataset d = {.n = n};
  d.x = new_tensor(PS_DT_FLOAT, 2, n, dim);
  d.y = new_tensor(PS_DT_FLOAT, 2, n, 1);
  if (w == NULL || d.x == NULL || d.y == NULL) {
    free(w);
    ps_dataset_free(&d);
    return oom(st, "linreg dataset");
  }
  rng r;
  rng_init(&r, seed, STREAM_PARAMS);
  for (int64_t j = 0; j < dim; j++)
    w[j] = rng_normal(&r);
  double b = 2.0 * rng_uniform(&r) - 1.0;
  rng_init(&r, seed, STREAM_TRAIN);
  float *x = ps_tensor_data(d.x), *y = ps_tensor_data(d.y);
  for (int64_t i = 0; i < n; i++) {
    double acc = b;
    for (int64_t j = 0; j < dim; j++) {
      float v = (float)rng_normal(&r);
      x[i * dim + j] = v;
      acc += v * w[j];
    }
    y[i] = (float)(acc + PS_DATASET_LINREG_NOISE * rng_normal(&r));
  }
  if (true_w) memcpy(true_w, w, (size_t)dim * sizeof *w);
  if (true_b) *true_b = b;
  free(w);
  *out = d;
  return 0;
}

/* ---- click-through ---- */

/* The hidden weight of id @k: the normal at counter @k of its own stream,
 * so no table of vocab weights is needed. */
static double ctr_id_weight(uint64_t seed, int64_t k) {
  rng r;
  rng_init(&r, seed, STREAM_ID_WEIGHT);
  ps_philox_skip(&r.p, (uint64_t)k);
  return rng_normal(&r);
}

/* A click-through dataset's tensors (@n examples of @nfields ids and the
 * dense features), the hidden dense weights @v, and @r at the start of
 * the examples' @stream.  -1: out of memory (@d freed). */
static int ctr_start(int64_t n, int nfields, uint64_t seed, uint64_t stream,
                     ps_dataset *d, rng *r, double v[PS_DATASET_CTR_DENSE]) {
  *d = (ps_dataset){.n = n};
  d->ids = new_tensor(PS_DT_INT64, 2, n, nfields);
  d->dense = new_tensor(PS_DT_FLOAT, 2, n, PS_DATASET_CTR_DENSE);
  d->y = new_tensor(PS_DT_INT64, 1, n, 0);
  if (d->ids == NULL || d->dense == NULL || d->y == NULL) {
    ps_dataset_free(d);
    return -1;
  }
  rng_init(r, seed, STREAM_PARAMS);
  for (int k = 0; k < PS_DATASET_CTR_DENSE; k++)
    v[k] = rng_normal(r);
  rng_init(r, seed, stream);
  return 0;
}

int ps_dataset_ctr(int64_t n, int64_t vocab, int nfields, uint64_t seed, ps_dataset *out,
                   ps_status *st) {
  if (n < 0 || vocab < 1 || nfields < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "ctr dataset: bad size n=%lld vocab=%lld nfields=%d (need n >= "
                         "0, vocab >= 1, nfields >= 1)",
                         (long long)n, (long long)vocab, nfields);
  ps_dataset d;
  rng r;
  double v[PS_DATASET_CTR_DENSE];
  if (ctr_start(n, nfields, seed, STREAM_TRAIN, &d, &r, v) != 0)
    return oom(st, "ctr dataset");
  int64_t *ids = ps_tensor_data(d.ids), *y = ps_tensor_data(d.y);
  float *dense = ps_tensor_data(d.dense);
  /* Rank k with probability ~ log((k+2)/(k+1)) ~ 1/(k+1): (vocab+1)^u - 1
   * for uniform u.  Field f shifts ranks by f * vocab / nfields, so every
   * field has frequent ids of its own. */
  double lv = log((double)vocab + 1.0), wscale = 2.0 / sqrt((double)nfields);
  int64_t stride = vocab / nfields;
  for (int64_t i = 0; i < n; i++) {
    double logit = -0.5;
    for (int f = 0; f < nfields; f++) {
      int64_t rank = (int64_t)(exp(rng_uniform(&r) * lv) - 1.0);
      if (rank < 0) rank = 0;
      if (rank >= vocab) rank = vocab - 1;
      int64_t id =
          (int64_t)(((uint64_t)rank + (uint64_t)f * (uint64_t)stride) % (uint64_t)vocab);
      ids[i * nfields + f] = id;
      logit += wscale * ctr_id_weight(seed, id);
    }
    for (int k = 0; k < PS_DATASET_CTR_DENSE; k++) {
      float dk = (float)rng_normal(&r);
      dense[i * PS_DATASET_CTR_DENSE + k] = dk;
      logit += 0.5 * v[k] * dk;
    }
    y[i] = rng_uniform(&r) < 1.0 / (1.0 + exp(-logit));
  }
  *out = d;
  return 0;
}

/* ---- click log with hash keys (embedding tables) ---- */

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The key of rank @rank of field @f: any 64-bit value. */
static int64_t log_key(uint64_t seed, int f, int64_t rank) {
  return (int64_t)mix64(mix64(seed ^ 0x6A09E667F3BCC909ull) +
                        (uint64_t)f * 0x9E3779B97F4A7C15ull +
                        (uint64_t)rank * 0xD1B54A32D192ED03ull);
}

static double log_key_weight(uint64_t seed, int64_t key) {
  rng r;
  rng_init(&r, seed, STREAM_KEY_WEIGHT);
  ps_philox_skip(&r.p, mix64((uint64_t)key) >> 2);
  return rng_normal(&r);
}

int ps_dataset_ctr_log(int64_t n, int nfields, int64_t vocab, uint64_t seed,
                       ps_dataset *out, float *prob, ps_status *st) {
  if (n < 0 || nfields < 1 || vocab < 2)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "ctr log: bad size n=%lld nfields=%d vocab=%lld (need n >= 0, "
                         "nfields >= 1, vocab >= 2)",
                         (long long)n, nfields, (long long)vocab);
  ps_dataset d;
  rng r;
  double v[PS_DATASET_CTR_DENSE];
  if (ctr_start(n, nfields, seed, STREAM_LOG, &d, &r, v) != 0) return oom(st, "ctr log");
  int64_t *ids = ps_tensor_data(d.ids), *y = ps_tensor_data(d.y);
  float *dense = ps_tensor_data(d.dense);
  const double s = PS_DATASET_CTR_LOG_ZIPF, wscale = 2.0 / sqrt((double)nfields);
  for (int64_t i = 0; i < n; i++) {
    /* the vocabulary grows from half to all of @vocab over the log: new
     * keys keep arriving */
    double nv = (double)vocab * (0.5 + 0.5 * (double)i / (double)(n > 1 ? n - 1 : 1));
    double a = pow(nv + 1.0, 1.0 - s) - 1.0;
    double logit = -1.0;
    for (int f = 0; f < nfields; f++) {
      /* Zipf(s) rank by inverting the continuous CDF ~ x^(1-s) */
      double u = rng_uniform(&r);
      int64_t rank = (int64_t)(pow(a * u + 1.0, 1.0 / (1.0 - s)) - 1.0);
      if (rank < 0) rank = 0;
      if (rank >= vocab) rank = vocab - 1;
      int64_t key = log_key(seed, f, rank);
      ids[i * nfields + f] = key;
      logit += wscale * log_key_weight(seed, key);
    }
    for (int k = 0; k < PS_DATASET_CTR_DENSE; k++) {
      float dk = (float)rng_normal(&r);
      dense[i * PS_DATASET_CTR_DENSE + k] = dk;
      logit += 0.5 * v[k] * dk;
    }
    double p = 1.0 / (1.0 + exp(-logit));
    if (prob) prob[i] = (float)p;
    y[i] = rng_uniform(&r) < p;
  }
  *out = d;
  return 0;
}

/* ---- Criteo's TSV layout ---- */

static int criteo_line(char *line, int64_t *ids, float *dense, int64_t *y,
                       const char *path, int64_t lineno, ps_status *st) {
  char *f[PS_DATASET_CRITEO_DENSE + PS_DATASET_CRITEO_FIELDS + 1];
  int nf = 0;
  char *p = line;
  size_t len = strlen(p);
  while (len && (p[len - 1] == '\n' || p[len - 1] == '\r'))
    p[--len] = '\0';
  for (;;) {
    if (nf == (int)(sizeof f / sizeof f[0])) {
      nf++;
      break;
    }
    f[nf++] = p;
    char *tab = strchr(p, '\t');
    if (tab == NULL) break;
    *tab = '\0';
    p = tab + 1;
  }
  int want = 1 + PS_DATASET_CRITEO_DENSE + PS_DATASET_CRITEO_FIELDS;
  if (nf != want)
    return ps_status_set(st, PS_DATA_LOSS,
                         "%s:%lld: %s%d tab-separated fields, Criteo's layout has %d "
                         "(label, 13 integers, 26 categories)",
                         path, (long long)lineno, nf > want ? "more than " : "",
                         nf > want ? want : nf, want);
  if (strcmp(f[0], "0") != 0 && strcmp(f[0], "1") != 0)
    return ps_status_set(st, PS_DATA_LOSS, "%s:%lld: the label is '%.32s', not 0 or 1",
                         path, (long long)lineno, f[0]);
  *y = f[0][0] == '1';
  for (int k = 0; k < PS_DATASET_CRITEO_DENSE; k++) {
    const char *v = f[1 + k];
    if (v[0] == '\0') {
      dense[k] = 0;
      continue;
    }
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end != '\0' || errno)
      return ps_status_set(st, PS_DATA_LOSS,
                           "%s:%lld: integer feature %d is '%.32s', not an integer", path,
                           (long long)lineno, k + 1, v);
    dense[k] = (float)log1p(x > 0 ? (double)x : 0.0);
  }
  for (int k = 0; k < PS_DATASET_CRITEO_FIELDS; k++) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the string, per field */
    for (const char *c = f[1 + PS_DATASET_CRITEO_DENSE + k]; *c; c++)
      h = (h ^ (unsigned char)*c) * 1099511628211ull;
    ids[k] = (int64_t)mix64(h + (uint64_t)(k + 1) * 0x9E3779B97F4A7C15ull);
  }
  return 0;
}

int ps_dataset_criteo_tsv(const char *path, int64_t max_rows, ps_dataset *out,
                          ps_status *st) {
  FILE *fp = fopen(path, "r");
  if (fp == NULL)
    return ps_status_set(st, ps_status_code_from_errno(errno), "%s: %s", path,
                         strerror(errno));
  int64_t cap = 0, n = 0;
  int64_t *ids = NULL, *y = NULL;
  float *dense = NULL;
  char *line = NULL;
  size_t lcap = 0;
  int rc = 0;
  int64_t lineno = 0;
  while ((max_rows <= 0 || n < max_rows) && getline(&line, &lcap, fp) > 0) {
    lineno++;
    if (n == cap) {
      int64_t c = cap ? cap * 2 : 4096;
      int64_t *i2 = realloc(ids, (size_t)c * PS_DATASET_CRITEO_FIELDS * sizeof *ids);
      if (i2) ids = i2;
      float *d2 =
          i2 ? realloc(dense, (size_t)c * PS_DATASET_CRITEO_DENSE * sizeof *dense) : NULL;
      if (d2) dense = d2;
      int64_t *y2 = d2 ? realloc(y, (size_t)c * sizeof *y) : NULL;
      if (y2) y = y2;
      if (!i2 || !d2 || !y2) {
        rc = oom(st, "Criteo log");
        break;
      }
      cap = c;
    }
    if ((rc = criteo_line(line, ids + n * PS_DATASET_CRITEO_FIELDS,
                          dense + n * PS_DATASET_CRITEO_DENSE, y + n, path, lineno,
                          st)) != 0)
      break;
    n++;
  }
  if (rc == 0 && ferror(fp))
    rc = ps_status_set(st, PS_DATA_LOSS, "%s: read error after line %lld", path,
                       (long long)lineno);
  fclose(fp);
  free(line);
  ps_dataset d = {.n = n};
  if (rc == 0) {
    d.ids = new_tensor(PS_DT_INT64, 2, n, PS_DATASET_CRITEO_FIELDS);
    d.dense = new_tensor(PS_DT_FLOAT, 2, n, PS_DATASET_CRITEO_DENSE);
    d.y = new_tensor(PS_DT_INT64, 1, n, 0);
    if (d.ids == NULL || d.dense == NULL || d.y == NULL) {
      ps_dataset_free(&d);
      rc = oom(st, "Criteo log");
    } else if (n > 0) {
      memcpy(ps_tensor_data(d.ids), ids,
             (size_t)n * PS_DATASET_CRITEO_FIELDS * sizeof *ids);
      memcpy(ps_tensor_data(d.dense), dense,
             (size_t)n * PS_DATASET_CRITEO_DENSE * sizeof *dense);
      memcpy(ps_tensor_data(d.y), y, (size_t)n * sizeof *y);
    }
  }
  free(ids);
  free(dense);
  free(y);
  if (rc == 0) *out = d;
  return rc;
}

/* ---- batches ---- */

/* @b's tensor for field @i, shaped like @src with dim 0 = @k: reused when
 * it has that shape and nobody else holds its buffer (copy on write). */
static ps_tensor *batch_tensor(ps_tensor **slot, const ps_tensor *src, int64_t k) {
  ps_shape s = src->shape;
  s.dim[0] = k;
  ps_tensor *t = *slot;
  if (t && t->dtype == src->dtype && ps_shape_equal(&t->shape, &s) && t->buf &&
      atomic_load(&t->buf->refs) == 1)
    return t;
  ps_tensor_destroy(t);
  *slot = ps_tensor_create(src->dtype, &s, false);
  return *slot;
}

int ps_dataset_gather(const ps_dataset *d, const int64_t *idx, int64_t k, ps_dataset *b,
                      ps_status *st) {
  if (k < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "dataset batch: size %lld < 1",
                         (long long)k);
  for (int64_t i = 0; i < k; i++)
    if (idx[i] < 0 || idx[i] >= d->n)
      return ps_status_set(st, PS_OUT_OF_RANGE,
                           "dataset batch: example %lld is not in [0, %lld)",
                           (long long)idx[i], (long long)d->n);
  for (int f = 0; f < NFIELDS; f++) {
    const ps_tensor *src = field_c(d, f);
    ps_tensor **slot = field(b, f);
    if (src == NULL) {
      ps_tensor_destroy(*slot);
      *slot = NULL;
      continue;
    }
    ps_tensor *t = batch_tensor(slot, src, k);
    if (t == NULL) return oom(st, "dataset batch");
    size_t row = ps_tensor_nbytes(src) / (size_t)d->n;
    const uint8_t *sp = ps_tensor_data(src);
    uint8_t *dp = ps_tensor_data(t);
    for (int64_t i = 0; i < k; i++)
      memcpy(dp + (size_t)i * row, sp + (size_t)idx[i] * row, row);
  }
  b->n = k;
  return 0;
}

int ps_dataset_batch(const ps_dataset *d, int64_t start, int64_t size, ps_dataset *b,
                     ps_status *st) {
  if (size < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "dataset batch: size %lld < 1",
                         (long long)size);
  if (start < 0 || start >= d->n)
    return ps_status_set(st, PS_OUT_OF_RANGE,
                         "dataset batch: start %lld is not in [0, %lld)",
                         (long long)start, (long long)d->n);
  int64_t k = d->n - start < size ? d->n - start : size;
  int64_t *idx = malloc((size_t)k * sizeof *idx);
  if (idx == NULL) return oom(st, "dataset batch");
  for (int64_t i = 0; i < k; i++)
    idx[i] = start + i;
  int rc = ps_dataset_gather(d, idx, k, b, st);
  free(idx);
  return rc;
}

/* ---- iterator ---- */

struct ps_dataset_iter {
  const ps_dataset *d;
  ps_dataset_iter_options o;
  int64_t m;      /* examples in the shard */
  int64_t *order; /* this epoch's order of the shard's examples */
  int64_t pos;    /* next position in order */
  int64_t epoch;
  int64_t *idx; /* batch_size indices of the batch being built */
};

/* The shard in index order, then (if shuffling) Fisher-Yates keyed by
 * (seed, epoch): each epoch's order depends on the seed and epoch only. */
static void iter_order(ps_dataset_iter *it) {
  int64_t nt = it->o.num_tasks > 1 ? it->o.num_tasks : 1;
  int64_t task = it->o.num_tasks > 1 ? it->o.task : 0;
  for (int64_t j = 0; j < it->m; j++)
    it->order[j] = task + j * nt;
  if (!it->o.shuffle) return;
  rng r;
  rng_init(&r, it->o.seed, (uint64_t)it->epoch);
  for (int64_t j = it->m - 1; j > 0; j--) {
    int64_t k = rng_below(&r, j + 1), t = it->order[j];
    it->order[j] = it->order[k];
    it->order[k] = t;
  }
}

ps_dataset_iter *ps_dataset_iter_create(const ps_dataset *d,
                                        const ps_dataset_iter_options *o, ps_status *st) {
  if (o->batch_size < 1) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "dataset iterator: batch size %lld < 1",
                  (long long)o->batch_size);
    return NULL;
  }
  if (o->num_tasks < 0 ||
      (o->num_tasks > 1 && (o->task < 0 || o->task >= o->num_tasks))) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "dataset iterator: task %d is not in [0, %d)",
                  o->task, o->num_tasks);
    return NULL;
  }
  int64_t nt = o->num_tasks > 1 ? o->num_tasks : 1;
  int64_t task = o->num_tasks > 1 ? o->task : 0;
  int64_t m = d->n > task ? (d->n - task + nt - 1) / nt : 0;
  if (m == 0) {
    ps_status_set(st, PS_OUT_OF_RANGE,
                  "dataset iterator: shard %lld of %lld of a dataset of %lld examples is "
                  "empty",
                  (long long)task, (long long)nt, (long long)d->n);
    return NULL;
  }
  ps_dataset_iter *it = calloc(1, sizeof *it);
  if (it == NULL) goto nomem;
  it->d = d;
  it->o = *o;
  it->m = m;
  it->order = malloc((size_t)m * sizeof *it->order);
  it->idx = malloc((size_t)o->batch_size * sizeof *it->idx);
  if (it->order == NULL || it->idx == NULL) goto nomem;
  iter_order(it);
  return it;
nomem:
  ps_dataset_iter_destroy(it);
  oom(st, "dataset iterator");
  return NULL;
}

void ps_dataset_iter_destroy(ps_dataset_iter *it) {
  if (it == NULL) return;
  free(it->order);
  free(it->idx);
  free(it);
}

int ps_dataset_iter_next(ps_dataset_iter *it, ps_dataset *b, ps_status *st) {
  for (int64_t i = 0; i < it->o.batch_size; i++) {
    it->idx[i] = it->order[it->pos++];
    if (it->pos == it->m) {
      it->pos = 0;
      it->epoch++;
      iter_order(it);
    }
  }
  return ps_dataset_gather(it->d, it->idx, it->o.batch_size, b, st);
}

int64_t ps_dataset_iter_shard_size(const ps_dataset_iter *it) {
  return it->m;
}

int64_t ps_dataset_iter_epoch(const ps_dataset_iter *it) {
  return it->epoch;
}
