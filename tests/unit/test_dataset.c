/* Unit tests for worker/data/dataset.c: IDX files (plain and gzip, every dtype,
 * every corruption a user can meet, with the file named in the error),
 * Fashion-MNIST (the real files when installed, the synthetic fallback
 * when not, corrupt files refused), the synthetic regression and
 * click-through data (checked against their hidden models, and learned by
 * simple models), batches, and the iterator's epochs and shards. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "common/tensor.h"
#include "paramserver/dataset.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/session.h"
#include "testdir.h"
#include "tests/support/assert.h"

/* ---- helpers ---- */

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s", path);
  ck_assert_uint_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

static uint8_t *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s", path);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = malloc((size_t)len + 1);
  ck_assert_uint_eq(fread(p, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return p;
}

static void write_gz(const char *path, const void *p, size_t n) {
  gzFile f = gzopen(path, "wb");
  ck_assert_msg(f != NULL, "%s", path);
  if (n) ck_assert_int_eq(gzwrite(f, p, (unsigned)n), (int)n);
  ck_assert_int_eq(gzclose(f), Z_OK);
}

/* An IDX image in memory: header for @type and @dims, then @data (already
 * big-endian), @ndata bytes.  Caller frees. */
static uint8_t *idx_bytes(int type, int rank, const uint32_t *dims, const void *data,
                          size_t ndata, size_t *n) {
  *n = 4 + 4 * (size_t)rank + ndata;
  uint8_t *p = malloc(*n);
  p[0] = 0, p[1] = 0, p[2] = (uint8_t)type, p[3] = (uint8_t)rank;
  for (int i = 0; i < rank; i++) {
    p[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
    p[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
    p[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
    p[7 + 4 * i] = (uint8_t)dims[i];
  }
  if (ndata) memcpy(p + 4 + 4 * rank, data, ndata);
  return p;
}

static void write_idx(const char *path, bool gz, int type, int rank, const uint32_t *dims,
                      const void *data, size_t ndata) {
  size_t n;
  uint8_t *p = idx_bytes(type, rank, dims, data, ndata, &n);
  if (gz)
    write_gz(path, p, n);
  else
    write_file(path, p, n);
  free(p);
}

/* Loading @path fails with @code and a message naming the file and
 * containing @what. */
static void expect_idx_error(const char *path, int code, const char *what) {
  ps_tensor *t = (ps_tensor *)1;
  ps_status st;
  ps_status_clear(&st);
  int rc = ps_idx_load(path, &t, &st);
  ck_assert_msg(rc != 0, "%s loaded", path);
  ck_assert_ptr_null(t);
  ck_assert_msg(rc == st.code, "rc %d, status %d", rc, st.code);
  ck_assert_msg(st.code == code, "%s: code %s, want %s: %s", path,
                ps_status_code_name(st.code), ps_status_code_name(code), st.msg);
  ck_assert_msg(strstr(st.msg, path) != NULL, "message does not name %s: %s", path,
                st.msg);
  ck_assert_msg(strstr(st.msg, what) != NULL, "message lacks \"%s\": %s", what, st.msg);
}

static ps_tensor *load_ok(const char *path) {
  ps_tensor *t = NULL;
  ps_status st;
  PS_ASSERT_OK(ps_idx_load(path, &t, &st), st);
  ck_assert_ptr_nonnull(t);
  return t;
}

/* ---- IDX ---- */

START_TEST(idx_uint8_plain_and_gzip) {
  uint8_t data[3 * 4 * 5];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t)(i * 7 + 1);
  uint32_t dims[3] = {3, 4, 5};
  TMP(plain, "images-idx3-ubyte");
  TMP(gz, "images-idx3-ubyte.gz");
  TMP(gz_no_suffix, "gzip-without-suffix");
  write_idx(plain, false, 0x08, 3, dims, data, sizeof data);
  write_idx(gz, true, 0x08, 3, dims, data, sizeof data);
  write_idx(gz_no_suffix, true, 0x08, 3, dims, data, sizeof data);
  const char *paths[] = {plain, gz, gz_no_suffix};
  for (int k = 0; k < 3; k++) {
    ps_tensor *t = load_ok(paths[k]);
    ck_assert_int_eq(t->dtype, PS_DT_UINT8);
    ck_assert_int_eq(t->shape.rank, 3);
    ck_assert_int_eq(t->shape.dim[0], 3);
    ck_assert_int_eq(t->shape.dim[1], 4);
    ck_assert_int_eq(t->shape.dim[2], 5);
    ck_assert_mem_eq(ps_tensor_data(t), data, sizeof data);
    ps_tensor_destroy(t);
  }
  /* labels, rank 1; and an empty one */
  uint8_t labels[4] = {9, 0, 0, 3};
  TMP(lbl, "labels-idx1-ubyte.gz");
  write_idx(lbl, true, 0x08, 1, (uint32_t[]){4}, labels, 4);
  ps_tensor *t = load_ok(lbl);
  ck_assert_int_eq(t->shape.rank, 1);
  ck_assert_int_eq(t->shape.dim[0], 4);
  ck_assert_mem_eq(ps_tensor_data(t), labels, 4);
  ps_tensor_destroy(t);
  TMP(empty, "empty-idx1-ubyte");
  write_idx(empty, false, 0x08, 1, (uint32_t[]){0}, NULL, 0);
  t = load_ok(empty);
  ck_assert_int_eq(t->shape.dim[0], 0);
  ck_assert_int_eq(ps_tensor_num_elements(t), 0);
  ps_tensor_destroy(t);
}
END_TEST

/* Every element type, with big-endian data converted to host order. */
START_TEST(idx_every_dtype_is_big_endian) {
  struct {
    int type;
    ps_dtype dtype;
    size_t es;
  } types[] = {{0x08, PS_DT_UINT8, 1}, {0x09, PS_DT_INT8, 1},  {0x0B, PS_DT_INT16, 2},
               {0x0C, PS_DT_INT32, 4}, {0x0D, PS_DT_FLOAT, 4}, {0x0E, PS_DT_DOUBLE, 8}};
  const double vals[6] = {1, -2, 3, 100, -7, 42};
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    uint8_t host[6 * 8], be[6 * 8];
    size_t es = types[k].es;
    for (int i = 0; i < 6; i++) {
      double v = types[k].dtype == PS_DT_UINT8 ? fabs(vals[i]) : vals[i];
      ps_elem_set(types[k].dtype, host, i, v);
      for (size_t b = 0; b < es; b++) /* host is little-endian on our targets */
        be[i * es + b] = host[i * es + es - 1 - b];
    }
    for (int gz = 0; gz < 2; gz++) {
      TMP(path, "t%02x-%d", types[k].type, gz);
      write_idx(path, gz, types[k].type, 2, (uint32_t[]){2, 3}, be, 6 * es);
      ps_tensor *t = load_ok(path);
      ck_assert_int_eq(t->dtype, types[k].dtype);
      ck_assert_int_eq(t->shape.rank, 2);
      ck_assert_int_eq(t->shape.dim[0], 2);
      ck_assert_int_eq(t->shape.dim[1], 3);
      for (int i = 0; i < 6; i++) {
        double want = types[k].dtype == PS_DT_UINT8 ? fabs(vals[i]) : vals[i];
        ck_assert_msg(ps_elem_get(t->dtype, ps_tensor_data(t), i) == want,
                      "type 0x%02x element %d: %g, want %g", types[k].type, i,
                      ps_elem_get(t->dtype, ps_tensor_data(t), i), want);
      }
      ps_tensor_destroy(t);
    }
  }
}
END_TEST

START_TEST(idx_errors_name_the_file) {
  uint8_t data[60] = {0};
  uint32_t dims[3] = {3, 4, 5};
  size_t n;

  expect_idx_error(tmp("no-such-file.gz"), PS_NOT_FOUND, "not found");
  expect_idx_error(tmp("no-such-dir/x-idx1-ubyte"), PS_NOT_FOUND, "not found");

  TMP(empty, "empty");
  write_file(empty, "", 0);
  expect_idx_error(empty, PS_DATA_LOSS, "too short for the 4-byte magic number");

  TMP(magic, "bad-magic");
  write_file(magic, "\x12\x34\x56\x78\0\0\0\1", 8);
  expect_idx_error(magic, PS_DATA_LOSS, "bad magic number 0x12345678");
  TMP(magic_gz, "bad-magic.gz");
  write_gz(magic_gz, "\x12\x34\x56\x78\0\0\0\1", 8);
  expect_idx_error(magic_gz, PS_DATA_LOSS, "bad magic number 0x12345678");

  TMP(type, "bad-type");
  write_idx(type, false, 0x0A, 1, (uint32_t[]){1}, data, 1);
  expect_idx_error(type, PS_DATA_LOSS, "unknown element type 0x0a");

  TMP(rank0, "rank0");
  write_idx(rank0, false, 0x08, 0, NULL, data, 1);
  expect_idx_error(rank0, PS_DATA_LOSS, "rank 0");
  TMP(rank17, "rank17");
  write_file(rank17, "\0\0\x08\x11", 4);
  expect_idx_error(rank17, PS_DATA_LOSS, "rank 17");

  TMP(short_dims, "short-dims");
  write_file(short_dims, "\0\0\x08\x03\0\0\0\3\0\0", 10);
  expect_idx_error(short_dims, PS_DATA_LOSS, "expected 12 bytes of dims, file has 6");

  /* truncated data, plain and gzip */
  for (int gz = 0; gz < 2; gz++) {
    TMP(trunc, "truncated-%d", gz);
    write_idx(trunc, gz, 0x08, 3, dims, data, 10);
    expect_idx_error(trunc, PS_DATA_LOSS,
                     "truncated: expected 60 bytes of data, file has 10");
    TMP(trunc4, "truncated-int-%d", gz);
    write_idx(trunc4, gz, 0x0C, 1, (uint32_t[]){5}, data, 19);
    expect_idx_error(trunc4, PS_DATA_LOSS, "expected 20 bytes of data, file has 19");
  }

  /* a gzip file cut short: the stream ends early */
  uint8_t big[5000];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (uint8_t)(i * i + i / 7);
  TMP(whole, "whole.gz");
  write_idx(whole, true, 0x08, 2, (uint32_t[]){50, 100}, big, sizeof big);
  uint8_t *gzb = read_file(whole, &n);
  TMP(cut, "cut.gz");
  write_file(cut, gzb, n / 2);
  expect_idx_error(cut, PS_DATA_LOSS, "expected 5000 bytes of data, file has");
  /* a flipped byte in the gzip trailer's CRC */
  gzb[n - 6] ^= 0xff;
  TMP(crc, "crc.gz");
  write_file(crc, gzb, n);
  expect_idx_error(crc, PS_DATA_LOSS, "corrupt gzip data");
  free(gzb);

  TMP(trailing, "trailing");
  uint8_t *p = idx_bytes(0x08, 1, (uint32_t[]){4}, data, 5, &n);
  write_file(trailing, p, n);
  free(p);
  expect_idx_error(trailing, PS_DATA_LOSS, "expected 4 bytes of data, file has more");

  /* dims whose product overflows, and huge dims that do not: neither
   * allocates what the header claims */
  TMP(overflow, "overflow");
  write_idx(overflow, false, 0x0E, 3, (uint32_t[]){0xffffffff, 0xffffffff, 0xffffffff},
            data, 8);
  expect_idx_error(overflow, PS_DATA_LOSS,
                   "dims [4294967295,4294967295,4294967295] are too large");
  TMP(huge, "huge.gz");
  write_idx(huge, true, 0x0E, 2, (uint32_t[]){0xffffffff, 0xffff}, data, 8);
  expect_idx_error(huge, PS_DATA_LOSS,
                   "expected 2251765453422600 bytes of data, file has 8");

  /* garbage: random bytes, and random bytes behind a gzip magic */
  uint8_t junk[300];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)(i * 131 + 17);
  TMP(garbage, "garbage");
  write_file(garbage, junk, sizeof junk);
  expect_idx_error(garbage, PS_DATA_LOSS, "bad magic number");
  junk[0] = 0x1f, junk[1] = 0x8b, junk[2] = 8, junk[3] = 0;
  TMP(garbage_gz, "garbage.gz");
  write_file(garbage_gz, junk, sizeof junk);
  ps_tensor *t = NULL;
  ps_status st;
  ck_assert_int_ne(ps_idx_load(garbage_gz, &t, &st), 0);
  ck_assert_msg(strstr(st.msg, garbage_gz) != NULL, "%s", st.msg);

  /* a directory */
  expect_idx_error(tmpdir, PS_UNKNOWN, "Is a directory");
}
END_TEST

/* Random mutations of valid files, plain and gzip: never a crash, a leak
 * or an unnamed error. */
START_TEST(idx_mutations_never_crash) {
  uint8_t data[2 * 3 * 4];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t)i;
  TMP(src, "src");
  TMP(src_gz, "src.gz");
  write_idx(src, false, 0x0B, 3, (uint32_t[]){2, 3, 2}, data, sizeof data);
  write_idx(src_gz, true, 0x0B, 3, (uint32_t[]){2, 3, 2}, data, sizeof data);
  uint32_t seed = 12345;
  for (int k = 0; k < 400; k++) {
    size_t n;
    uint8_t *p = read_file(k % 2 ? src_gz : src, &n);
    int flips = 1 + (int)((seed = seed * 1103515245 + 12345) >> 16) % 4;
    for (int f = 0; f < flips; f++) {
      seed = seed * 1103515245 + 12345;
      p[(seed >> 8) % n] ^= (uint8_t)(1 + (seed >> 20) % 255);
    }
    seed = seed * 1103515245 + 12345;
    size_t len = (seed >> 16) % 8 == 0 ? (seed >> 4) % (n + 1) : n;
    TMP(m, "m%d", k);
    write_file(m, p, len);
    free(p);
    ps_tensor *t = NULL;
    ps_status st;
    if (ps_idx_load(m, &t, &st) == 0) {
      ck_assert_ptr_nonnull(t);
      ps_tensor_destroy(t);
    } else {
      ck_assert_ptr_null(t);
      ck_assert_msg(strstr(st.msg, m) != NULL, "%s", st.msg);
    }
    remove(m);
  }
}
END_TEST

/* ---- Fashion-MNIST ---- */

static bool fashion_installed(void) {
  struct stat sb;
  return stat(PS_FASHION_MNIST_DIR "/train-labels-idx1-ubyte.gz", &sb) == 0;
}

static void check_fashion_split(const ps_dataset *d, int64_t n) {
  ck_assert_int_eq(d->n, n);
  ck_assert_ptr_nonnull(d->x);
  ck_assert_ptr_nonnull(d->y);
  ck_assert_ptr_null(d->ids);
  ck_assert_ptr_null(d->dense);
  ck_assert_int_eq(d->x->dtype, PS_DT_FLOAT);
  ck_assert_int_eq(d->x->shape.rank, 2);
  ck_assert_int_eq(d->x->shape.dim[0], n);
  ck_assert_int_eq(d->x->shape.dim[1], 784);
  ck_assert_int_eq(d->y->dtype, PS_DT_INT64);
  ck_assert_int_eq(d->y->shape.rank, 1);
  ck_assert_int_eq(d->y->shape.dim[0], n);
  const float *x = ps_tensor_data(d->x);
  for (int64_t i = 0; i < n * 784; i++)
    if (!(x[i] >= 0.0f && x[i] <= 1.0f))
      ck_abort_msg("pixel %lld = %g", (long long)i, x[i]);
  const int64_t *y = ps_tensor_data(d->y);
  int count[10] = {0};
  for (int64_t i = 0; i < n; i++) {
    ck_assert_msg(y[i] >= 0 && y[i] < 10, "label %lld = %lld", (long long)i,
                  (long long)y[i]);
    count[y[i]]++;
  }
  for (int c = 0; c < 10; c++)
    ck_assert_msg(n < 1000 || count[c] > n / 20, "class %d has %d of %lld examples", c,
                  count[c], (long long)n);
}

START_TEST(fashion_mnist_real_files) {
  if (!fashion_installed()) {
    fprintf(stderr,
            "fashion_mnist_real_files: skipped: %s is not there "
            "(apt-get install dataset-fashion-mnist)\n",
            PS_FASHION_MNIST_DIR);
    return;
  }
  ps_dataset train = {0}, test = {0};
  bool synthetic = true;
  ps_status st;
  PS_ASSERT_OK(ps_dataset_fashion_mnist(NULL, &train, &test, &synthetic, &st), st);
  ck_assert(!synthetic);
  check_fashion_split(&train, 60000);
  check_fashion_split(&test, 10000);
  /* the first training image is an ankle boot (class 9), as is the first
   * test image */
  ck_assert_int_eq(((int64_t *)ps_tensor_data(train.y))[0], 9);
  ck_assert_int_eq(((int64_t *)ps_tensor_data(test.y))[0], 9);
  /* pixels are byte / 255: the first image has black and white pixels */
  const float *x = ps_tensor_data(train.x);
  float lo = 1, hi = 0;
  for (int i = 0; i < 784; i++) {
    lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    float b = x[i] * 255.0f;
    ck_assert_msg(fabsf(b - roundf(b)) < 1e-3f, "pixel %d = %g", i, x[i]);
  }
  ck_assert(lo == 0.0f && hi == 1.0f);
  ps_dataset_free(&train);
  ps_dataset_free(&test);
  /* just one split */
  PS_ASSERT_OK(ps_dataset_fashion_mnist(NULL, NULL, &test, NULL, &st), st);
  ck_assert_int_eq(test.n, 10000);
  ps_dataset_free(&test);
  ps_dataset_free(&test); /* twice is fine */
}
END_TEST

/* Test accuracy of a nearest-centroid classifier fitted on @train. */
static double centroid_accuracy(const ps_dataset *train, const ps_dataset *test) {
  double *mean = calloc(10 * 784, sizeof *mean);
  int64_t count[10] = {0};
  const float *x = ps_tensor_data(train->x);
  const int64_t *y = ps_tensor_data(train->y);
  for (int64_t i = 0; i < train->n; i++) {
    count[y[i]]++;
    for (int j = 0; j < 784; j++)
      mean[y[i] * 784 + j] += x[i * 784 + j];
  }
  for (int c = 0; c < 10; c++)
    for (int j = 0; j < 784; j++)
      mean[c * 784 + j] /= count[c] ? (double)count[c] : 1.0;
  x = ps_tensor_data(test->x);
  y = ps_tensor_data(test->y);
  int64_t right = 0;
  for (int64_t i = 0; i < test->n; i++) {
    int best = 0;
    double bestd = INFINITY;
    for (int c = 0; c < 10; c++) {
      double d2 = 0;
      for (int j = 0; j < 784; j++) {
        double e = x[i * 784 + j] - mean[c * 784 + j];
        d2 += e * e;
      }
      if (d2 < bestd) bestd = d2, best = c;
    }
    right += best == y[i];
  }
  free(mean);
  return (double)right / (double)test->n;
}

START_TEST(fashion_mnist_synthetic_fallback) {
  ps_dataset train = {0}, test = {0};
  bool synthetic = false;
  ps_status st;
  TMP(dir, "not-installed");
  PS_ASSERT_OK(ps_dataset_fashion_mnist(dir, &train, &test, &synthetic, &st), st);
  ck_assert(synthetic);
  check_fashion_split(&train, 60000);
  check_fashion_split(&test, 10000);
  double acc = centroid_accuracy(&train, &test);
  ck_assert_msg(acc > 0.85, "nearest-centroid test accuracy %.3f", acc);
  fprintf(stderr, "synthetic Fashion-MNIST: nearest-centroid test accuracy %.3f\n", acc);
  /* deterministic, and the smaller variant has the same prototypes */
  ps_dataset small = {0};
  PS_ASSERT_OK(ps_dataset_fashion_mnist_synthetic(100, 0, 1, &small, NULL, &st), st);
  check_fashion_split(&small, 100);
  ck_assert_mem_eq(ps_tensor_data(small.x), ps_tensor_data(train.x), 100 * 784 * 4);
  ck_assert_mem_eq(ps_tensor_data(small.y), ps_tensor_data(train.y), 100 * 8);
  ps_dataset_free(&small);
  PS_ASSERT_OK(ps_dataset_fashion_mnist_synthetic(100, 0, 2, &small, NULL, &st), st);
  ck_assert(memcmp(ps_tensor_data(small.x), ps_tensor_data(train.x), 100 * 784 * 4) != 0);
  ps_dataset_free(&small);
  PS_ASSERT_CODE(ps_dataset_fashion_mnist_synthetic(-1, 0, 2, &small, NULL, &st), st,
                 PS_INVALID_ARGUMENT);
  ps_dataset_free(&train);
  ps_dataset_free(&test);
}
END_TEST

/* The promise of the synthetic fallback: a 784-64-10 MLP (variables held
 * by the session, Adam, batches from the shuffling iterator) learns it to
 * well above 85% test accuracy within 300 steps. */
START_TEST(mlp_learns_synthetic_fashion_mnist) {
  ps_dataset train = {0}, test = {0};
  ps_status st;
  PS_ASSERT_OK(ps_dataset_fashion_mnist_synthetic(12000, 2000, 1, &train, &test, &st),
               st);
  ps_graph *g = ps_graph_create();
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 784}}, "x");
  ps_node *labels = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "labels");
  ps_variable *w1 =
      ps_get_variable(g, "w1", PS_DT_FLOAT, &(ps_shape){2, {784, 64}}, NULL, NULL, &st);
  ps_variable *b1 =
      ps_get_variable(g, "b1", PS_DT_FLOAT, &(ps_shape){1, {64}}, NULL, NULL, &st);
  ps_variable *w2 =
      ps_get_variable(g, "w2", PS_DT_FLOAT, &(ps_shape){2, {64, 10}}, NULL, NULL, &st);
  ps_variable *b2 =
      ps_get_variable(g, "b2", PS_DT_FLOAT, &(ps_shape){1, {10}}, NULL, NULL, &st);
  ck_assert_msg(w1 && b1 && w2 && b2, "%s", st.msg);
  ps_node *h = ps_relu(ps_bias_add(ps_matmul(x, ps_variable_value(w1), false, false),
                                   ps_variable_value(b1)));
  ps_node *logits = ps_bias_add(ps_matmul(h, ps_variable_value(w2), false, false),
                                ps_variable_value(b2));
  ps_node *loss = ps_reduce_mean(
      ps_sparse_softmax_cross_entropy_with_logits(labels, logits), PS_ALL_AXES, false);
  ps_node *acc = ps_reduce_mean(
      ps_cast(ps_equal(ps_argmax(logits, 1), labels), PS_DT_FLOAT), PS_ALL_AXES, false);
  ps_optimizer *opt = ps_adam_optimizer(0.001, 0.9, 0.999, 1e-8);
  ps_node *train_op = ps_optimizer_minimize(opt, g, loss, NULL, NULL, 0, &st);
  ck_assert_msg(train_op != NULL, "%s", st.msg);
  ps_node *init = ps_global_variables_initializer(g);
  ps_session *s = ps_session_create(g, NULL, &st);
  ck_assert_msg(s != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_dataset_iter_options o = {.batch_size = 100, .shuffle = true, .seed = 5};
  ps_dataset_iter *it = ps_dataset_iter_create(&train, &o, &st);
  ps_dataset b = {0};
  for (int step = 0; step < 300; step++) {
    PS_ASSERT_OK(ps_dataset_iter_next(it, &b, &st), st);
    ps_feed f[2] = {{x, b.x}, {labels, b.y}};
    PS_ASSERT_OK(ps_session_run(s, f, 2, NULL, 0, &train_op, 1, NULL, &st), st);
  }
  ps_feed f[2] = {{x, test.x}, {labels, test.y}};
  ps_tensor *out = NULL;
  PS_ASSERT_OK(ps_session_run(s, f, 2, &acc, 1, NULL, 0, &out, &st), st);
  float a = *(float *)ps_tensor_data(out);
  fprintf(stderr, "MLP on synthetic Fashion-MNIST: test accuracy %.3f after 300 steps\n",
          a);
  ck_assert_msg(a > 0.85f, "test accuracy %.3f", a);
  ps_tensor_destroy(out);
  ps_dataset_free(&b);
  ps_dataset_iter_destroy(it);
  ps_session_destroy(s);
  ps_optimizer_destroy(opt);
  ps_graph_destroy(g);
  ps_dataset_free(&train);
  ps_dataset_free(&test);
}
END_TEST

/* A small Fashion-MNIST-format directory (plain files) loads; a corrupt or
 * missing file is an error naming it, never a silent synthetic fallback. */
START_TEST(fashion_mnist_corrupt_files_are_errors) {
  enum { N = 5 };
  uint8_t img[N * 784], lbl[N] = {9, 0, 0, 3, 0};
  for (size_t i = 0; i < sizeof img; i++)
    img[i] = (uint8_t)(i % 256);
  const char *names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  for (int k = 0; k < 4; k++) {
    TMP(p, "%s", names[k]);
    if (k % 2 == 0)
      write_idx(p, false, 0x08, 3, (uint32_t[]){N, 28, 28}, img, sizeof img);
    else
      write_idx(p, false, 0x08, 1, (uint32_t[]){N}, lbl, N);
  }
  ps_dataset train = {0}, test = {0};
  bool synthetic = true;
  ps_status st;
  PS_ASSERT_OK(ps_dataset_fashion_mnist(tmpdir, &train, &test, &synthetic, &st), st);
  ck_assert(!synthetic);
  ck_assert_int_eq(train.n, N);
  ck_assert_int_eq(((int64_t *)ps_tensor_data(train.y))[3], 3);
  ck_assert(((float *)ps_tensor_data(train.x))[255] == 1.0f);
  ps_dataset_free(&train);
  ps_dataset_free(&test);

  /* truncated test labels */
  TMP(lp, "t10k-labels-idx1-ubyte");
  write_idx(lp, false, 0x08, 1, (uint32_t[]){N}, lbl, N - 1);
  PS_ASSERT_CODE(ps_dataset_fashion_mnist(tmpdir, &train, &test, &synthetic, &st), st,
                 PS_DATA_LOSS);
  ck_assert(!synthetic);
  ck_assert_msg(strstr(st.msg, lp) &&
                    strstr(st.msg, "expected 5 bytes of data, file has 4"),
                "%s", st.msg);
  ck_assert_ptr_null(train.x);
  /* labels that do not match the images */
  write_idx(lp, false, 0x08, 1, (uint32_t[]){N - 1}, lbl, N - 1);
  PS_ASSERT_CODE(ps_dataset_fashion_mnist(tmpdir, &train, &test, &synthetic, &st), st,
                 PS_DATA_LOSS);
  ck_assert_msg(strstr(st.msg, lp) &&
                    strstr(st.msg, "expected uint8 labels of shape [5]"),
                "%s", st.msg);
  /* a label out of range */
  lbl[2] = 10;
  write_idx(lp, false, 0x08, 1, (uint32_t[]){N}, lbl, N);
  PS_ASSERT_STATUS(ps_dataset_fashion_mnist(tmpdir, &train, &test, &synthetic, &st), st,
                   PS_DATA_LOSS, "label 2 is 10");
  /* images of the wrong shape */
  TMP(ip, "t10k-images-idx3-ubyte");
  write_idx(ip, false, 0x08, 3, (uint32_t[]){N, 28, 27}, img, N * 28 * 27);
  PS_ASSERT_CODE(ps_dataset_fashion_mnist(tmpdir, NULL, &test, &synthetic, &st), st,
                 PS_DATA_LOSS);
  ck_assert_msg(strstr(st.msg, ip) && strstr(st.msg, "expected uint8 images of shape "
                                                     "[N,28,28], got uint8 [5,28,27]"),
                "%s", st.msg);
  /* garbage in place of the training images */
  TMP(tp, "train-images-idx3-ubyte");
  write_file(tp, "<html>404</html>", 16);
  PS_ASSERT_CODE(ps_dataset_fashion_mnist(tmpdir, &train, NULL, &synthetic, &st), st,
                 PS_DATA_LOSS);
  ck_assert_msg(strstr(st.msg, tp) && strstr(st.msg, "bad magic number"), "%s", st.msg);
  /* a partial set */
  remove(tp);
  PS_ASSERT_CODE(ps_dataset_fashion_mnist(tmpdir, &train, &test, &synthetic, &st), st,
                 PS_NOT_FOUND);
  ck_assert(!synthetic);
  ck_assert_msg(strstr(st.msg, tmpdir) && strstr(st.msg, "train-images-idx3-ubyte(.gz) "
                                                         "is missing"),
                "%s", st.msg);
  ck_assert_ptr_null(train.x);
  ck_assert_ptr_null(test.x);
}
END_TEST

/* ---- linear regression ---- */

START_TEST(linreg_matches_its_model) {
  enum { N = 2000, D = 5 };
  ps_dataset d = {0};
  double w[D], b;
  ps_status st;
  PS_ASSERT_OK(ps_dataset_linreg(N, D, 7, &d, w, &b, &st), st);
  ck_assert_int_eq(d.n, N);
  ck_assert_int_eq(d.x->dtype, PS_DT_FLOAT);
  ck_assert_int_eq(d.x->shape.rank, 2);
  ck_assert_int_eq(d.x->shape.dim[0], N);
  ck_assert_int_eq(d.x->shape.dim[1], D);
  ck_assert_int_eq(d.y->dtype, PS_DT_FLOAT);
  ck_assert_int_eq(d.y->shape.rank, 2);
  ck_assert_int_eq(d.y->shape.dim[0], N);
  ck_assert_int_eq(d.y->shape.dim[1], 1);
  ck_assert(b >= -1 && b <= 1);
  const float *x = ps_tensor_data(d.x), *y = ps_tensor_data(d.y);
  double sum = 0, sum2 = 0, maxe = 0, yvar = 0;
  for (int i = 0; i < N; i++) {
    double pred = b;
    for (int j = 0; j < D; j++)
      pred += x[i * D + j] * w[j];
    double e = y[i] - pred;
    sum += e, sum2 += e * e, yvar += (y[i] - b) * (y[i] - b);
    maxe = fmax(maxe, fabs(e));
  }
  double sd = sqrt(sum2 / N);
  ck_assert_msg(maxe < 6 * PS_DATASET_LINREG_NOISE, "max residual %g", maxe);
  ck_assert_msg(fabs(sd - PS_DATASET_LINREG_NOISE) < 0.2 * PS_DATASET_LINREG_NOISE,
                "residual sd %g", sd);
  ck_assert_msg(fabs(sum / N) < 0.1 * PS_DATASET_LINREG_NOISE, "residual mean %g",
                sum / N);
  ck_assert_msg(yvar / N > 1.0, "y barely depends on x: var %g", yvar / N);
  /* deterministic per seed */
  ps_dataset e = {0};
  double w2[D], b2;
  PS_ASSERT_OK(ps_dataset_linreg(N, D, 7, &e, w2, &b2, &st), st);
  ck_assert_mem_eq(ps_tensor_data(e.x), x, sizeof(float) * N * D);
  ck_assert(b2 == b && w2[0] == w[0]);
  ps_dataset_free(&e);
  PS_ASSERT_OK(ps_dataset_linreg(N, D, 8, &e, w2, NULL, &st), st);
  ck_assert(w2[0] != w[0]);
  ps_dataset_free(&e);
  PS_ASSERT_STATUS(ps_dataset_linreg(N, 0, 8, &e, NULL, NULL, &st), st,
                   PS_INVALID_ARGUMENT, "dim=0");
  ps_dataset_free(&d);
}
END_TEST

/* ---- click-through ---- */

START_TEST(ctr_ids_labels_and_learnability) {
  enum { N = 30000, NTRAIN = 24000, V = 500, F = 6, K = PS_DATASET_CTR_DENSE };
  ps_dataset d = {0};
  ps_status st;
  PS_ASSERT_OK(ps_dataset_ctr(N, V, F, 3, &d, &st), st);
  ck_assert_int_eq(d.n, N);
  ck_assert_ptr_null(d.x);
  ck_assert_int_eq(d.ids->dtype, PS_DT_INT64);
  ck_assert_int_eq(d.ids->shape.rank, 2);
  ck_assert_int_eq(d.ids->shape.dim[0], N);
  ck_assert_int_eq(d.ids->shape.dim[1], F);
  ck_assert_int_eq(d.dense->dtype, PS_DT_FLOAT);
  ck_assert_int_eq(d.dense->shape.dim[0], N);
  ck_assert_int_eq(d.dense->shape.dim[1], K);
  ck_assert_int_eq(d.y->dtype, PS_DT_INT64);
  ck_assert_int_eq(d.y->shape.rank, 1);
  ck_assert_ptr_eq(ps_dataset_tensor(&d, "ids"), d.ids);
  ck_assert_ptr_eq(ps_dataset_tensor(&d, "dense"), d.dense);
  ck_assert_ptr_null(ps_dataset_tensor(&d, "x"));
  ck_assert_ptr_null(ps_dataset_tensor(&d, "nope"));
  const int64_t *ids = ps_tensor_data(d.ids), *y = ps_tensor_data(d.y);
  const float *dense = ps_tensor_data(d.dense);
  int64_t ones = 0;
  int *freq = calloc(V, sizeof *freq);
  for (int64_t i = 0; i < N; i++) {
    ck_assert_msg(y[i] == 0 || y[i] == 1, "label %lld", (long long)y[i]);
    ones += y[i];
    for (int f = 0; f < F; f++) {
      int64_t id = ids[i * F + f];
      ck_assert_msg(id >= 0 && id < V, "id %lld", (long long)id);
      if (f == 0) freq[id]++;
    }
  }
  /* skew: field 0's top id is far above the average count N / V = 60 */
  int top = 0;
  for (int k = 0; k < V; k++)
    top = freq[k] > top ? freq[k] : top;
  ck_assert_msg(top > 20 * N / V, "top id count %d", top);
  free(freq);
  double base = (double)ones / N;
  ck_assert_msg(base > 0.2 && base < 0.7, "base rate %.3f", base);

  /* logistic regression on one-hot ids + dense, by SGD on the first
   * NTRAIN examples, beats the majority class on the rest */
  double *w = calloc(V, sizeof *w), v[K] = {0}, b = 0;
  for (int epoch = 0; epoch < 5; epoch++)
    for (int64_t i = 0; i < NTRAIN; i++) {
      double z = b;
      for (int f = 0; f < F; f++)
        z += w[ids[i * F + f]];
      for (int k = 0; k < K; k++)
        z += v[k] * dense[i * K + k];
      double g = 1.0 / (1.0 + exp(-z)) - (double)y[i], lr = 0.05;
      b -= lr * g;
      for (int f = 0; f < F; f++)
        w[ids[i * F + f]] -= lr * g;
      for (int k = 0; k < K; k++)
        v[k] -= lr * g * dense[i * K + k];
    }
  int64_t right = 0, test_ones = 0;
  for (int64_t i = NTRAIN; i < N; i++) {
    double z = b;
    for (int f = 0; f < F; f++)
      z += w[ids[i * F + f]];
    for (int k = 0; k < K; k++)
      z += v[k] * dense[i * K + k];
    right += (z > 0) == (y[i] == 1);
    test_ones += y[i];
  }
  free(w);
  double acc = (double)right / (N - NTRAIN);
  double majority =
      fmax((double)test_ones, (double)(N - NTRAIN - test_ones)) / (N - NTRAIN);
  fprintf(stderr,
          "ctr: base rate %.3f, logistic regression accuracy %.3f (majority %.3f)\n",
          base, acc, majority);
  ck_assert_msg(acc > majority + 0.08, "accuracy %.3f, majority %.3f", acc, majority);

  ps_dataset e = {0};
  PS_ASSERT_OK(ps_dataset_ctr(N, V, F, 4, &e, &st), st);
  ck_assert(memcmp(ps_tensor_data(e.y), y, sizeof(int64_t) * N) != 0);
  ps_dataset_free(&e);
  PS_ASSERT_STATUS(ps_dataset_ctr(N, 0, F, 4, &e, &st), st, PS_INVALID_ARGUMENT,
                   "vocab=0");
  ps_dataset_free(&d);
}
END_TEST

/* ---- batches and the iterator ---- */

/* n examples: x float [n,2] = (i, -i), y int64 [n] = i. */
static ps_dataset counting(int64_t n) {
  ps_dataset d = {.n = n};
  d.x = ps_tensor_create(PS_DT_FLOAT, &(ps_shape){2, {n, 2}}, false);
  d.y = ps_tensor_create(PS_DT_INT64, &(ps_shape){1, {n}}, false);
  for (int64_t i = 0; i < n; i++) {
    ((float *)ps_tensor_data(d.x))[2 * i] = (float)i;
    ((float *)ps_tensor_data(d.x))[2 * i + 1] = (float)-i;
    ((int64_t *)ps_tensor_data(d.y))[i] = i;
  }
  return d;
}

static void check_rows(const ps_dataset *b, const int64_t *want, int64_t k) {
  ck_assert_int_eq(b->n, k);
  ck_assert_int_eq(b->x->shape.dim[0], k);
  ck_assert_int_eq(b->x->shape.dim[1], 2);
  ck_assert_int_eq(b->y->shape.dim[0], k);
  for (int64_t i = 0; i < k; i++) {
    ck_assert_int_eq(((int64_t *)ps_tensor_data(b->y))[i], want[i]);
    ck_assert(((float *)ps_tensor_data(b->x))[2 * i] == (float)want[i]);
    ck_assert(((float *)ps_tensor_data(b->x))[2 * i + 1] == (float)-want[i]);
  }
}

START_TEST(batches_copy_rows) {
  ps_dataset d = counting(10), b = {0};
  ps_status st;
  PS_ASSERT_OK(ps_dataset_batch(&d, 2, 4, &b, &st), st);
  check_rows(&b, (int64_t[]){2, 3, 4, 5}, 4);
  ps_tensor *x = b.x;
  PS_ASSERT_OK(ps_dataset_batch(&d, 6, 4, &b, &st), st);
  ck_assert_ptr_eq(b.x, x); /* same shape: refilled in place */
  check_rows(&b, (int64_t[]){6, 7, 8, 9}, 4);
  PS_ASSERT_OK(ps_dataset_batch(&d, 8, 4, &b, &st), st); /* the short last batch */
  check_rows(&b, (int64_t[]){8, 9}, 2);
  /* a buffer someone else holds is not overwritten */
  ps_buf *held = ps_buf_ref(b.x->buf);
  PS_ASSERT_OK(ps_dataset_batch(&d, 0, 2, &b, &st), st);
  ck_assert_ptr_ne(b.x->buf, held);
  ck_assert(((float *)held->data)[0] == 8.0f);
  ps_buf_unref(held);
  PS_ASSERT_OK(ps_dataset_gather(&d, (int64_t[]){9, 0, 9}, 3, &b, &st), st);
  check_rows(&b, (int64_t[]){9, 0, 9}, 3);
  PS_ASSERT_CODE(ps_dataset_batch(&d, 10, 1, &b, &st), st, PS_OUT_OF_RANGE);
  ck_assert_msg(strstr(st.msg, "start 10 is not in [0, 10)"), "%s", st.msg);
  PS_ASSERT_CODE(ps_dataset_batch(&d, 0, 0, &b, &st), st, PS_INVALID_ARGUMENT);
  PS_ASSERT_CODE(ps_dataset_gather(&d, (int64_t[]){3, -1}, 2, &b, &st), st,
                 PS_OUT_OF_RANGE);
  ck_assert_msg(strstr(st.msg, "example -1 is not in [0, 10)"), "%s", st.msg);
  ps_dataset_free(&b);
  ps_dataset_free(&d);
}
END_TEST

/* Pulls @nbatches batches; returns the flattened example ids. */
static int64_t *pull(ps_dataset_iter *it, int nbatches, int64_t bs) {
  int64_t *out = malloc((size_t)(nbatches * bs) * sizeof *out);
  ps_dataset b = {0};
  ps_status st;
  for (int k = 0; k < nbatches; k++) {
    PS_ASSERT_OK(ps_dataset_iter_next(it, &b, &st), st);
    ck_assert_int_eq(b.n, bs);
    for (int64_t i = 0; i < bs; i++) {
      int64_t id = ((int64_t *)ps_tensor_data(b.y))[i];
      ck_assert(((float *)ps_tensor_data(b.x))[2 * i] == (float)id);
      out[k * bs + i] = id;
    }
  }
  ps_dataset_free(&b);
  return out;
}

/* Every block of @m consecutive ids in @ids[0..len) is a permutation of
 * the shard (examples i with i % nt == task). */
static void check_epochs(const int64_t *ids, int64_t len, int64_t m, int64_t n, int nt,
                         int task) {
  char *seen = malloc((size_t)n);
  for (int64_t e = 0; (e + 1) * m <= len; e++) {
    memset(seen, 0, (size_t)n);
    for (int64_t j = 0; j < m; j++) {
      int64_t id = ids[e * m + j];
      ck_assert_msg(id >= 0 && id < n && id % nt == task,
                    "epoch %lld: id %lld in shard %d/%d", (long long)e, (long long)id,
                    task, nt);
      ck_assert_msg(!seen[id], "epoch %lld: id %lld twice", (long long)e, (long long)id);
      seen[id] = 1;
    }
  }
  free(seen);
}

START_TEST(iterator_epochs_and_seeds) {
  enum { N = 103, B = 7 };
  ps_dataset d = counting(N);
  ps_status st;
  ps_dataset_iter_options o = {.batch_size = B, .shuffle = true, .seed = 1};
  ps_dataset_iter *it = ps_dataset_iter_create(&d, &o, &st);
  ck_assert_msg(it != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_dataset_iter_shard_size(it), N);
  /* 103 * 7 examples: 7 whole epochs in 103 batches, batches crossing
   * epoch ends */
  int64_t *a = pull(it, N, B);
  ck_assert_int_eq(ps_dataset_iter_epoch(it), B);
  check_epochs(a, N * B, N, N, 1, 0);
  /* shuffled, and each epoch differently */
  bool in_order = true, same = true;
  for (int i = 0; i < N; i++)
    in_order &= a[i] == i, same &= a[i] == a[N + i];
  ck_assert(!in_order && !same);
  ps_dataset_iter_destroy(it);
  /* the same seed gives the same stream, another seed another one */
  it = ps_dataset_iter_create(&d, &o, &st);
  int64_t *a2 = pull(it, N, B);
  ck_assert_mem_eq(a, a2, sizeof(int64_t) * N * B);
  ps_dataset_iter_destroy(it);
  o.seed = 2;
  it = ps_dataset_iter_create(&d, &o, &st);
  int64_t *c = pull(it, N, B);
  ck_assert(memcmp(a, c, sizeof(int64_t) * N) != 0);
  check_epochs(c, N * B, N, N, 1, 0);
  ps_dataset_iter_destroy(it);
  /* no shuffle: in order, wrapping around */
  o.shuffle = false;
  it = ps_dataset_iter_create(&d, &o, &st);
  int64_t *s = pull(it, 20, B);
  for (int i = 0; i < 20 * B; i++)
    ck_assert_int_eq(s[i], i % N);
  ck_assert_int_eq(ps_dataset_iter_epoch(it), 1);
  ps_dataset_iter_destroy(it);
  free(a), free(a2), free(c), free(s);
  ps_dataset_free(&d);
}
END_TEST

START_TEST(iterator_shards_partition_the_examples) {
  enum { N = 100, NT = 3, B = 5 };
  ps_dataset d = counting(N);
  ps_status st;
  int seen[N] = {0};
  for (int task = 0; task < NT; task++) {
    ps_dataset_iter_options o = {.batch_size = B,
                                 .shuffle = true,
                                 .seed = 10u + task,
                                 .task = task,
                                 .num_tasks = NT};
    ps_dataset_iter *it = ps_dataset_iter_create(&d, &o, &st);
    ck_assert_msg(it != NULL, "%s", st.msg);
    int64_t m = ps_dataset_iter_shard_size(it);
    ck_assert_int_eq(m, task == 0 ? 34 : 33);
    int64_t *ids = pull(it, (int)(3 * m), B); /* 15 epochs */
    check_epochs(ids, 3 * m * B, m, N, NT, task);
    for (int64_t j = 0; j < m; j++)
      seen[ids[j]]++;
    free(ids);
    ps_dataset_iter_destroy(it);
  }
  for (int i = 0; i < N; i++)
    ck_assert_msg(seen[i] == 1, "example %d is in %d shards", i, seen[i]);
  /* bad options */
  ps_dataset_iter_options bad = {.batch_size = 0};
  ck_assert_ptr_null(ps_dataset_iter_create(&d, &bad, &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
  bad = (ps_dataset_iter_options){.batch_size = 1, .task = 3, .num_tasks = 3};
  ck_assert_ptr_null(ps_dataset_iter_create(&d, &bad, &st));
  ck_assert_msg(strstr(st.msg, "task 3 is not in [0, 3)"), "%s", st.msg);
  ps_dataset tiny = counting(2);
  bad = (ps_dataset_iter_options){.batch_size = 1, .task = 2, .num_tasks = 3};
  ck_assert_ptr_null(ps_dataset_iter_create(&tiny, &bad, &st));
  PS_ASSERT_STATUS(st.code, st, PS_OUT_OF_RANGE,
                   "shard 2 of 3 of a dataset of 2 examples is empty");
  ps_dataset_iter_destroy(NULL);
  ps_dataset_free(&tiny);
  ps_dataset_free(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("dataset");
  TCase *tc = tcase_create("core");
  tcase_add_unchecked_fixture(tc, setup_basedir, teardown_basedir);
  tcase_add_checked_fixture(tc, setup_tmpdir, teardown_tmpdir);
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, idx_uint8_plain_and_gzip);
  tcase_add_test(tc, idx_every_dtype_is_big_endian);
  tcase_add_test(tc, idx_errors_name_the_file);
  tcase_add_test(tc, idx_mutations_never_crash);
  tcase_add_test(tc, fashion_mnist_real_files);
  tcase_add_test(tc, fashion_mnist_synthetic_fallback);
  tcase_add_test(tc, mlp_learns_synthetic_fashion_mnist);
  tcase_add_test(tc, fashion_mnist_corrupt_files_are_errors);
  tcase_add_test(tc, linreg_matches_its_model);
  tcase_add_test(tc, ctr_ids_labels_and_learnability);
  tcase_add_test(tc, batches_copy_rows);
  tcase_add_test(tc, iterator_epochs_and_seeds);
  tcase_add_test(tc, iterator_shards_partition_the_examples);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
