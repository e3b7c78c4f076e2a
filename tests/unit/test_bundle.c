/* Unit tests for common/bundle_*.c and common/crc32c.c: TensorFlow V2
 * checkpoints.
 *
 * Reads the real TensorFlow checkpoints in $PS_TESTDATA/tf-checkpoints
 * (see the README there) with the values it lists, checks that what we
 * write is byte for byte what TensorFlow writes, round-trips every dtype,
 * strings, a ~100 MiB tensor and partitioned (sliced) tensors, merges
 * parts, and sees the error text of every corruption a user can meet.
 * Each test works in a fresh mkdtemp() directory, removed afterwards
 * (even when the test fails).
 *
 * Partitioned tensors and merges are tested in test_bundle_slices.c,
 * corrupt files and writer misuse in test_bundle_corrupt.c (one program:
 * unit_bundle).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/crc32c.h"
#include "test_bundle_internal.h"
#include "testdir.h"
#include "tests/support/assert.h"

uint8_t *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = malloc((size_t)len + 1);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq(fread(p, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return p;
}

void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

void copy_file(const char *from, const char *to) {
  size_t n;
  uint8_t *p = read_file(from, &n);
  write_file(to, p, n);
  free(p);
}

bool exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

static void assert_same_file(const char *a, const char *b) {
  size_t na, nb;
  uint8_t *pa = read_file(a, &na), *pb = read_file(b, &nb);
  ck_assert_msg(na == nb, "%s has %zu bytes, %s %zu", a, na, b, nb);
  for (size_t i = 0; i < na; i++)
    ck_assert_msg(pa[i] == pb[i], "%s and %s differ at byte %zu: %02x %02x", a, b, i,
                  pa[i], pb[i]);
  free(pa);
  free(pb);
}

ps_shape shp(int rank, ...) {
  ps_shape s = {.rank = rank};
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++)
    s.dim[i] = va_arg(ap, int64_t);
  va_end(ap);
  return s;
}

float read_float(ps_bundle_reader *r, const char *key) {
  float v = -1;
  ps_status st = {0};
  ck_assert_msg(ps_bundle_reader_read_into(r, key, &v, sizeof v, &st) == 0, "%s: %s", key,
                st.msg);
  return v;
}

/* ---- CRC32C ------------------------------------------------------------ */

START_TEST(crc32c_check_values) {
  ck_assert_uint_eq(ps_crc32c("123456789", 9), 0xE3069283u);
  ck_assert_uint_eq(ps_crc32c_extend_sw(0, "123456789", 9), 0xE3069283u);
  if (ps_crc32c_hw_available())
    ck_assert_uint_eq(ps_crc32c_extend_hw(0, "123456789", 9), 0xE3069283u);
  ck_assert_uint_eq(ps_crc32c(NULL, 0), 0);
  ck_assert_uint_eq(ps_crc32c_mask(0), 0xa282ead8u);
  static const uint8_t zero[4] = {0}, half[4] = {0, 0, 0, 0x3f};
  ck_assert_uint_eq(ps_crc32c_mask(ps_crc32c(zero, 4)), 0x3a117ba6u);
  ck_assert_uint_eq(ps_crc32c_mask(ps_crc32c(half, 4)), 0x1f273806u);
  for (uint32_t c = 1; c < 0xF0000000u; c += 0x0F0F0F0Fu)
    ck_assert_uint_eq(ps_crc32c_unmask(ps_crc32c_mask(c)), c);
}
END_TEST

START_TEST(crc32c_hw_and_table_agree) {
  uint8_t buf[4096 + 16];
  uint32_t x = 12345;
  for (size_t i = 0; i < sizeof buf; i++) {
    x = x * 1103515245u + 12345u;
    buf[i] = (uint8_t)(x >> 16);
  }
  for (size_t off = 0; off < 9; off++) {
    for (size_t n = 0; n < 200; n += 1 + n / 8) {
      uint32_t sw = ps_crc32c_extend_sw(0, buf + off, n);
      ck_assert_uint_eq(ps_crc32c(buf + off, n), sw);
      if (ps_crc32c_hw_available())
        ck_assert_uint_eq(ps_crc32c_extend_hw(0, buf + off, n), sw);
      /* crc(a || b) = extend(crc(a), b) */
      ck_assert_uint_eq(
          ps_crc32c_extend(ps_crc32c(buf + off, n / 3), buf + off + n / 3, n - n / 3),
          sw);
    }
  }
  ck_assert_uint_eq(ps_crc32c_extend_sw(0, buf, 4096),
                    ps_crc32c_hw_available() ? ps_crc32c_extend_hw(0, buf, 4096)
                                             : ps_crc32c(buf, 4096));
}
END_TEST

/* Long buffers take the three-stream path (rounds of 3 x 4096 bytes):
 * every length around a round's edges, every start alignment, and a
 * chained extend that splits inside a round agree with the table. */
START_TEST(crc32c_long_buffers_agree) {
  enum { N = 5 * 3 * 4096 + 64 };
  uint8_t *buf = malloc(N);
  ck_assert_ptr_nonnull(buf);
  uint32_t x = 777;
  for (size_t i = 0; i < N; i++) {
    x = x * 1103515245u + 12345u;
    buf[i] = (uint8_t)(x >> 16);
  }
  static const size_t lens[] = {12287, 12288, 12289, 12295, 12296, 24575,
                                24576, 24583, 36864, 61439, 61440, 61447};
  for (size_t off = 0; off < 9; off++)
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
      size_t n = lens[k];
      uint32_t sw = ps_crc32c_extend_sw(0, buf + off, n);
      ck_assert_uint_eq(ps_crc32c(buf + off, n), sw);
      if (ps_crc32c_hw_available())
        ck_assert_uint_eq(ps_crc32c_extend_hw(0, buf + off, n), sw);
      ck_assert_uint_eq(
          ps_crc32c_extend(ps_crc32c(buf + off, 5000), buf + off + 5000, n - 5000), sw);
    }
  free(buf);
}
END_TEST

/* ---- Checkpoints TensorFlow wrote --------------------------------------- */

START_TEST(reads_tf_counter) {
  ps_status st = {0};
  ps_bundle_reader *r = ps_bundle_reader_open(tfdata("counter/variables"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_bundle_reader_num_shards(r), 1);
  ck_assert_uint_eq(ps_bundle_reader_count(r), 1);
  const ps_bundle_entry *e = ps_bundle_reader_entry(r, 0);
  ck_assert_str_eq(e->key, "counter");
  ck_assert_int_eq(e->dtype, PS_DT_FLOAT);
  ck_assert_int_eq(e->shape.rank, 0);
  ck_assert_uint_eq(e->size, 4);
  ck_assert_uint_eq(e->crc32c, 0x3a117ba6u);
  ck_assert(!e->is_slice);
  ck_assert_uint_eq(e->nslices, 0);
  ck_assert(ps_bundle_reader_find(r, "counter") == e);
  ck_assert(ps_bundle_reader_find(r, "count") == NULL);
  ps_tensor *t;
  PS_ASSERT_OK(ps_bundle_reader_read(r, "counter", &t, &st), st);
  ck_assert_int_eq(t->dtype, PS_DT_FLOAT);
  ck_assert_int_eq(t->shape.rank, 0);
  ck_assert(*(float *)ps_tensor_data(t) == 0.0f);
  ps_tensor_destroy(t);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  PS_ASSERT_CODE(ps_bundle_reader_read(r, "nope", &t, &st), st, PS_NOT_FOUND);
  ck_assert_ptr_null(t);
  PS_ASSERT_MSG_HAS(st, "Key nope not found in checkpoint");
  ps_bundle_reader_close(r);
}
END_TEST

START_TEST(reads_tf_half_plus_two) {
  ps_status st = {0};
  ps_bundle_reader *r = ps_bundle_reader_open(tfdata("half_plus_two_gpu/variables"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_uint_eq(ps_bundle_reader_count(r), 3);
  ck_assert(read_float(r, "a") == 0.5f);
  ck_assert(read_float(r, "b") == 2.0f);
  ck_assert(read_float(r, "c") == 3.0f);
  ck_assert_uint_eq(ps_bundle_reader_find(r, "a")->offset, 0);
  ck_assert_uint_eq(ps_bundle_reader_find(r, "b")->offset, 4);
  ck_assert_uint_eq(ps_bundle_reader_find(r, "c")->offset, 8);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ps_bundle_reader_close(r);

  /* The same model with a Snappy-compressed index block. */
  r = ps_bundle_reader_open(tfdata("half_plus_two_cpu/variables"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  static const char *const keys[] = {"a", "a2", "b", "c", "c2"};
  static const float vals[] = {0.5f, 0.5f, 2.0f, 3.0f, 3.0f};
  ck_assert_uint_eq(ps_bundle_reader_count(r), 5);
  for (int i = 0; i < 5; i++) {
    const ps_bundle_entry *e = ps_bundle_reader_entry(r, (size_t)i);
    ck_assert_str_eq(e->key, keys[i]);
    ck_assert_int_eq(e->dtype, PS_DT_FLOAT);
    ck_assert_int_eq(e->shape.rank, 0);
    ck_assert(read_float(r, keys[i]) == vals[i]);
  }
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ps_bundle_reader_close(r);
}
END_TEST

START_TEST(reads_tf_index_with_many_restarts) {
  ps_status st = {0};
  /* swift-style.index has no data file: the prefix is "swift-style". */
  ps_bundle_reader *r = ps_bundle_reader_open(tfdata("swift-style"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_bundle_reader_num_shards(r), 1);
  ck_assert_uint_eq(ps_bundle_reader_count(r), 92);
  ck_assert_str_eq(ps_bundle_reader_entry(r, 0)->key, "conv1.conv2d.bias");
  ck_assert_str_eq(ps_bundle_reader_entry(r, 91)->key, "res5.in2.weight");
  for (size_t i = 0; i < 92; i++) {
    const ps_bundle_entry *e = ps_bundle_reader_entry(r, i);
    ck_assert(ps_bundle_reader_find(r, e->key) == e);
    ck_assert_int_eq(e->dtype, PS_DT_FLOAT);
    ck_assert_uint_eq(e->size, 4 * (uint64_t)ps_shape_num_elements(&e->shape));
    if (i == 0) {
      ck_assert_uint_eq(e->offset, 0);
      continue;
    }
    /* TF1's Saver adds tensors sorted by name: back to back in key order */
    const ps_bundle_entry *prev = ps_bundle_reader_entry(r, i - 1);
    ck_assert_int_lt(strcmp(prev->key, e->key), 0);
    ck_assert_uint_eq(e->offset, prev->offset + prev->size);
  }
  ck_assert_int_eq(ps_bundle_reader_find(r, "conv1.conv2d.weight")->shape.rank, 4);
  /* Reading needs the data file, which is not there. */
  float b[32];
  PS_ASSERT_STATUS(ps_bundle_reader_read_into(r, "conv1.conv2d.bias", b, sizeof b, &st),
                   st, PS_NOT_FOUND,
                   "swift-style.data-00000-of-00001: missing data shard");
  ps_bundle_reader_close(r);
}
END_TEST

/* ---- Byte-for-byte compatibility -------------------------------------- */

START_TEST(writes_counter_exactly_as_tensorflow) {
  ps_status st = {0};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("ckpt/variables"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ps_shape scalar = {.rank = 0};
  float zero = 0.0f;
  PS_ASSERT_OK(ps_bundle_writer_add(w, "counter", PS_DT_FLOAT, &scalar, &zero, 4, &st),
               st);
  ck_assert_uint_eq(ps_bundle_writer_bytes(w), 4);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  assert_same_file(tmp("ckpt/variables.index"), tfdata("counter/variables.index"));
  assert_same_file(tmp("ckpt/variables.data-00000-of-00001"),
                   tfdata("counter/variables.data-00000-of-00001"));
  /* Nothing else (no temporary files) is left in the directory. */
  DIR *d = opendir(tmp("ckpt"));
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  ck_assert_int_eq(n, 2);

  /* half_plus_two: three scalars added in file order. */
  w = ps_bundle_writer_create(tmp("hp2/variables"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  const char *keys[] = {"a", "b", "c"};
  float vals[] = {0.5f, 2.0f, 3.0f};
  for (int i = 0; i < 3; i++)
    PS_ASSERT_OK(ps_bundle_writer_add(w, keys[i], PS_DT_FLOAT, &scalar, &vals[i], 4, &st),
                 st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  assert_same_file(tmp("hp2/variables.index"),
                   tfdata("half_plus_two_gpu/variables.index"));
  assert_same_file(tmp("hp2/variables.data-00000-of-00001"),
                   tfdata("half_plus_two_gpu/variables.data-00000-of-00001"));
}
END_TEST

/* Merging a single part rewrites its index with our table writer: for
 * TensorFlow's 92-entry index (several restart intervals, shared prefixes)
 * the result must be the same bytes. */
START_TEST(rewrites_tf_index_exactly) {
  ps_status st = {0};
  ps_bundle_reader *r = ps_bundle_reader_open(tfdata("swift-style"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  uint64_t end = 0;
  for (size_t i = 0; i < ps_bundle_reader_count(r); i++) {
    const ps_bundle_entry *e = ps_bundle_reader_entry(r, i);
    if (e->offset + e->size > end) end = e->offset + e->size;
  }
  ps_bundle_reader_close(r);
  ck_assert_int_eq(mkdir(tmp("part"), 0777), 0);
  copy_file(tfdata("swift-style.index"), tmp("part/p.index"));
  int fd = open(tmp("part/p.data-00000-of-00001"), O_CREAT | O_WRONLY, 0666);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, (off_t)end), 0); /* merge only renames data */
  close(fd);
  TMP(part, "part/p");
  const char *parts[] = {part};
  PS_ASSERT_OK(ps_bundle_merge(parts, 1, tmp("out/style"), &st), st);
  assert_same_file(tmp("out/style.index"), tfdata("swift-style.index"));
  ck_assert(exists(tmp("out/style.data-00000-of-00001")));
  ck_assert(!exists(tmp("part/p.index")));
  ck_assert(!exists(tmp("part"))); /* the emptied part directory is removed */

  /* Same for counter, whose data file comes along. */
  ck_assert_int_eq(mkdir(tmp("c"), 0777), 0);
  copy_file(tfdata("counter/variables.index"), tmp("c/v.index"));
  copy_file(tfdata("counter/variables.data-00000-of-00001"),
            tmp("c/v.data-00000-of-00001"));
  TMP(cv, "c/v");
  parts[0] = cv;
  PS_ASSERT_OK(ps_bundle_merge(parts, 1, tmp("out/counter"), &st), st);
  assert_same_file(tmp("out/counter.index"), tfdata("counter/variables.index"));
  r = ps_bundle_reader_open(tmp("out/counter"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert(read_float(r, "counter") == 0.0f);
  ps_bundle_reader_close(r);
}
END_TEST

/* ---- Round trips -------------------------------------------------------- */

static const struct {
  int dtype;
  size_t size;
} all_dtypes[] = {
    {1, 4},  {2, 8},  {3, 4},   {4, 1},  {5, 2},  {6, 1},  {8, 8},
    {9, 8},  {10, 1}, {11, 1},  {12, 1}, {13, 4}, {14, 2}, {15, 2},
    {16, 2}, {17, 2}, {18, 16}, {19, 2}, {22, 4}, {23, 8},
};
#define NDT (sizeof all_dtypes / sizeof all_dtypes[0])

START_TEST(round_trips_every_dtype) {
  ps_status st = {0};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("rt/model.ckpt-7"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ps_shape sh = shp(2, (int64_t)3, (int64_t)5);
  uint8_t data[NDT][15 * 16];
  char key[NDT][32];
  for (size_t i = 0; i < NDT; i++) {
    for (size_t j = 0; j < sizeof data[i]; j++)
      data[i][j] = (uint8_t)(i * 31 + j * 7 + 1);
    if (all_dtypes[i].dtype == PS_DT_BOOL)
      for (size_t j = 0; j < 15; j++)
        data[i][j] = (uint8_t)(j & 1);
    snprintf(key[i], sizeof key[i], "v/%s_%d", ps_dtype_name(all_dtypes[i].dtype),
             all_dtypes[i].dtype);
  }
  for (size_t i = NDT; i-- > 0;) /* reverse key order: the index sorts */
    ck_assert_msg(ps_bundle_writer_add(w, key[i], all_dtypes[i].dtype, &sh, data[i],
                                       15 * all_dtypes[i].size, &st) == 0,
                  "%s: %s", key[i], st.msg);
  /* half and bfloat16 values through the conversions */
  uint16_t h[4], bf[4];
  float fv[4] = {1.0f, -2.5f, 0.099975586f, 65504.0f};
  for (int i = 0; i < 4; i++) {
    h[i] = ps_float_to_half(fv[i]);
    bf[i] = ps_float_to_bf16(fv[i]);
  }
  ps_shape four = shp(1, (int64_t)4);
  PS_ASSERT_OK(ps_bundle_writer_add(w, "half", PS_DT_HALF, &four, h, sizeof h, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_add(w, "bf16", PS_DT_BFLOAT16, &four, bf, sizeof bf, &st),
               st);
  /* empty tensors and a scalar */
  ps_shape empty = shp(2, (int64_t)2, (int64_t)0), scalar = {.rank = 0};
  int64_t big = -1234567890123LL;
  PS_ASSERT_OK(ps_bundle_writer_add(w, "empty", PS_DT_FLOAT, &empty, NULL, 0, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_add(w, "global_step", PS_DT_INT64, &scalar, &big, 8, &st),
               st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);

  ps_bundle_reader *r = ps_bundle_reader_open(tmp("rt/model.ckpt-7"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_uint_eq(ps_bundle_reader_count(r), NDT + 4);
  for (size_t i = 1; i < ps_bundle_reader_count(r); i++)
    ck_assert_int_lt(
        strcmp(ps_bundle_reader_entry(r, i - 1)->key, ps_bundle_reader_entry(r, i)->key),
        0);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  for (size_t i = 0; i < NDT; i++) {
    const ps_bundle_entry *e = ps_bundle_reader_find(r, key[i]);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->dtype, all_dtypes[i].dtype);
    ck_assert(ps_shape_equal(&e->shape, &sh));
    ck_assert_uint_eq(e->size, 15 * all_dtypes[i].size);
    uint8_t back[15 * 16] = {0};
    PS_ASSERT_OK(ps_bundle_reader_read_into(r, key[i], back, e->size, &st), st);
    ck_assert_int_eq(memcmp(back, data[i], e->size), 0);
    ps_tensor *t = NULL;
    int rc = ps_bundle_reader_read(r, key[i], &t, &st);
    if (ps_dtype_size(e->dtype) != 0) {
      PS_ASSERT_OK(rc, st);
      ck_assert_int_eq(memcmp(ps_tensor_data(t), data[i], e->size), 0);
      ck_assert(ps_shape_equal(&t->shape, &sh));
      ps_tensor_destroy(t);
    } else { /* quantized types: bytes only */
      ck_assert_int_eq(rc, PS_UNIMPLEMENTED);
      ck_assert_ptr_null(t);
    }
    /* a wrong buffer size is the caller's error */
    PS_ASSERT_CODE(ps_bundle_reader_read_into(r, key[i], back, e->size - 1, &st), st,
                   PS_INVALID_ARGUMENT);
  }
  ps_tensor *t;
  PS_ASSERT_OK(ps_bundle_reader_read(r, "half", &t, &st), st);
  ck_assert_int_eq(t->dtype, PS_DT_HALF);
  for (int i = 0; i < 4; i++)
    ck_assert(ps_half_to_float(((uint16_t *)ps_tensor_data(t))[i]) ==
              ps_half_to_float(h[i]));
  ck_assert(ps_half_to_float(((uint16_t *)ps_tensor_data(t))[1]) == -2.5f);
  ps_tensor_destroy(t);
  PS_ASSERT_OK(ps_bundle_reader_read(r, "bf16", &t, &st), st);
  ck_assert_int_eq(t->dtype, PS_DT_BFLOAT16);
  ck_assert(ps_bf16_to_float(((uint16_t *)ps_tensor_data(t))[0]) == 1.0f);
  ck_assert(ps_bf16_to_float(((uint16_t *)ps_tensor_data(t))[1]) == -2.5f);
  ps_tensor_destroy(t);
  PS_ASSERT_OK(ps_bundle_reader_read(r, "empty", &t, &st), st);
  ck_assert_int_eq(ps_tensor_num_elements(t), 0);
  ck_assert_uint_eq(ps_bundle_reader_find(r, "empty")->crc32c, 0xa282ead8u); /* Mask(0) */
  ps_tensor_destroy(t);
  int64_t gs = 0;
  PS_ASSERT_OK(ps_bundle_reader_read_into(r, "global_step", &gs, 8, &st), st);
  ck_assert_int_eq(gs, big);
  ps_bundle_reader_close(r);
}
END_TEST

START_TEST(round_trips_strings) {
  ps_status st = {0};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("s/ckpt"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  /* TensorFlow's StringTensorsOldFormat contents, plus NUL bytes inside. */
  char c1024[1024];
  memset(c1024, 'c', sizeof c1024);
  const char *strs[] = {"hello", "", "x01", c1024};
  size_t lens[] = {5, 0, 3, 1024};
  ps_shape four = shp(1, (int64_t)4), one = shp(1, (int64_t)1), scalar = {.rank = 0};
  ps_shape none = shp(1, (int64_t)0);
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "strs", &four, strs, lens, &st), st);
  const char *hello[] = {"hello"};
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "scalar", &one, hello, NULL, &st), st);
  const char *emptys[] = {""};
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "string_tensor", &one, emptys, NULL, &st),
               st);
  const char *nul[] = {"a\0b\xff"};
  size_t nullen[] = {4};
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "nul", &scalar, nul, nullen, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "none", &none, NULL, NULL, &st), st);
  float f[6] = {16.18f, 16.18f, 16.18f, 16.18f, 16.18f, 16.18f};
  ps_shape two3 = shp(2, (int64_t)2, (int64_t)3);
  PS_ASSERT_OK(ps_bundle_writer_add(w, "floats", PS_DT_FLOAT, &two3, f, sizeof f, &st),
               st);
  PS_ASSERT_STATUS(ps_bundle_writer_add(w, "bad", PS_DT_STRING, &one, "x", 1, &st), st,
                   PS_INVALID_ARGUMENT, "ps_bundle_writer_add_strings");
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);

  ps_bundle_reader *r = ps_bundle_reader_open(tmp("s/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ps_bundle_strings *s;
  PS_ASSERT_OK(ps_bundle_reader_read_strings(r, "strs", &s, &st), st);
  ck_assert_uint_eq(s->n, 4);
  ck_assert(ps_shape_equal(&s->shape, &four));
  for (int i = 0; i < 4; i++) {
    ck_assert_uint_eq(s->len[i], lens[i]);
    ck_assert_int_eq(memcmp(s->str[i], strs[i], lens[i]), 0);
    ck_assert_int_eq(s->str[i][lens[i]], '\0');
  }
  ps_bundle_strings_destroy(s);
  PS_ASSERT_OK(ps_bundle_reader_read_strings(r, "nul", &s, &st), st);
  ck_assert_uint_eq(s->n, 1);
  ck_assert_uint_eq(s->len[0], 4);
  ck_assert_int_eq(memcmp(s->str[0], "a\0b\xff", 4), 0);
  ps_bundle_strings_destroy(s);
  PS_ASSERT_OK(ps_bundle_reader_read_strings(r, "none", &s, &st), st);
  ck_assert_uint_eq(s->n, 0);
  ps_bundle_strings_destroy(s);
  /* The layout: varint lengths, masked crc of the lengths as uint32, bytes. */
  const ps_bundle_entry *e = ps_bundle_reader_find(r, "scalar");
  ck_assert_int_eq(e->dtype, PS_DT_STRING);
  ck_assert_uint_eq(e->size, 1 + 4 + 5);
  size_t n;
  uint8_t *data = read_file(tmp("s/ckpt.data-00000-of-00001"), &n);
  const uint8_t *p = data + e->offset;
  ck_assert_uint_eq(p[0], 5);
  static const uint8_t five[4] = {5, 0, 0, 0};
  uint32_t c = ps_crc32c(five, 4);
  ck_assert_uint_eq((uint32_t)p[1] | (uint32_t)p[2] << 8 | (uint32_t)p[3] << 16 |
                        (uint32_t)p[4] << 24,
                    ps_crc32c_mask(c));
  ck_assert_int_eq(memcmp(p + 5, "hello", 5), 0);
  ck_assert_uint_eq(e->crc32c, ps_crc32c_mask(ps_crc32c_extend(c, p + 1, 9)));
  free(data);
  /* Strings are not tensors of the ps. */
  ps_tensor *t;
  PS_ASSERT_STATUS(ps_bundle_reader_read(r, "strs", &t, &st), st, PS_INVALID_ARGUMENT,
                   "ps_bundle_reader_read_strings");
  PS_ASSERT_CODE(ps_bundle_reader_read_strings(r, "floats", &s, &st), st,
                 PS_INVALID_ARGUMENT);
  PS_ASSERT_OK(ps_bundle_reader_read(r, "floats", &t, &st), st);
  ck_assert(((float *)ps_tensor_data(t))[5] == 16.18f);
  ps_tensor_destroy(t);
  ps_bundle_reader_close(r);
}
END_TEST

START_TEST(round_trips_a_100mib_tensor) {
  ps_status st = {0};
  const int64_t n = 25 << 20; /* floats: 100 MiB */
  float *v = malloc((size_t)n * 4);
  ck_assert_ptr_nonnull(v);
  for (int64_t i = 0; i < n; i++)
    v[i] = (float)(i % 1000003) * 0.5f;
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("big/ckpt"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ps_shape sh = shp(2, (int64_t)(n / 1024), (int64_t)1024), scalar = {.rank = 0};
  int64_t step = 42;
  PS_ASSERT_OK(
      ps_bundle_writer_add(w, "global_step", PS_DT_INT64, &scalar, &step, 8, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_add(w, "emb", PS_DT_FLOAT, &sh, v, (size_t)n * 4, &st),
               st);
  ck_assert_uint_eq(ps_bundle_writer_bytes(w), 8 + (uint64_t)n * 4);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("big/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_uint_eq(ps_bundle_reader_find(r, "emb")->offset, 8);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ps_tensor *t;
  PS_ASSERT_OK(ps_bundle_reader_read(r, "emb", &t, &st), st);
  ck_assert_int_eq(memcmp(ps_tensor_data(t), v, (size_t)n * 4), 0);
  ps_tensor_destroy(t);
  /* a window out of the middle of a plain entry */
  int64_t start[2] = {12345, 100}, len[2] = {3, 5};
  float win[15];
  PS_ASSERT_OK(ps_bundle_reader_read_slice(r, "emb", start, len, win, sizeof win, &st),
               st);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++)
      ck_assert(win[i * 5 + j] == v[(12345 + i) * 1024 + 100 + j]);
  ps_bundle_reader_close(r);
  free(v);
}
END_TEST

/* ---- Big indexes and threads -------------------------------------------- */

/* 12000 tensors make an index of several 256 KiB blocks: block boundaries,
 * shortest-separator index keys, and lookups across blocks. */
START_TEST(index_spans_several_blocks) {
  ps_status st = {0};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("many/ckpt"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ps_shape sh = shp(1, (int64_t)2);
  char key[128];
  for (int i = 11999; i >= 0; i--) {
    snprintf(key, sizeof key, "tower_%d/layer_%04d/some/rather/long/variable/name/kernel",
             i % 3, i);
    float v[2] = {(float)i, (float)-i};
    PS_ASSERT_OK(ps_bundle_writer_add(w, key, PS_DT_FLOAT, &sh, v, 8, &st), st);
  }
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  /* count the index block's entries: one per data block */
  size_t n;
  uint8_t *idx = read_file(tmp("many/ckpt.index"), &n);
  ck_assert_uint_gt(n, 2 * 262144);
  const uint8_t *f = idx + n - 48;
  get_varint(&f);
  get_varint(&f);
  uint64_t io = get_varint(&f), is = get_varint(&f);
  const uint8_t *b = idx + io;
  uint32_t nrestarts = (uint32_t)b[is - 4] | (uint32_t)b[is - 3] << 8;
  ck_assert_uint_ge(nrestarts, 3); /* restart interval 1: one per entry */
  free(idx);
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("many/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_uint_eq(ps_bundle_reader_count(r), 12000);
  for (int i = 0; i < 12000; i += 7) {
    snprintf(key, sizeof key, "tower_%d/layer_%04d/some/rather/long/variable/name/kernel",
             i % 3, i);
    float v[2];
    PS_ASSERT_OK(ps_bundle_reader_read_into(r, key, v, sizeof v, &st), st);
    ck_assert(v[0] == (float)i && v[1] == (float)-i);
  }
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ps_bundle_reader_close(r);
}
END_TEST

typedef struct reader_arg {
  ps_bundle_reader *r;
  int errors;
} reader_arg;

static void *read_all(void *p) {
  reader_arg *a = p;
  ps_status st = {0};
  for (int round = 0; round < 20; round++) {
    ps_tensor *t;
    if (ps_bundle_reader_read(a->r, "v", &t, &st) != 0) {
      a->errors++;
      continue;
    }
    for (int i = 0; i < 10; i++)
      if (((float *)ps_tensor_data(t))[i * 20 + 7] != vval(i, 7)) a->errors++;
    ps_tensor_destroy(t);
    float x;
    if (ps_bundle_reader_read_into(a->r, "x", &x, 4, &st) != 0 || x != 42.0f) a->errors++;
  }
  return NULL;
}

START_TEST(reads_from_several_threads) {
  ps_status st = {0};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("thr/ckpt"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  add_v_slice(w, 0, 5);
  add_v_slice(w, 5, 5);
  ps_shape scalar = {.rank = 0};
  float x = 42.0f;
  PS_ASSERT_OK(ps_bundle_writer_add(w, "x", PS_DT_FLOAT, &scalar, &x, 4, &st), st);
  /* the same empty slice twice is refused */
  ps_shape full = shp(2, (int64_t)10, (int64_t)20);
  int64_t s0[2] = {0, 0}, l0[2] = {0, 20};
  PS_ASSERT_OK(
      ps_bundle_writer_add_slice(w, "e", PS_DT_FLOAT, &full, s0, l0, NULL, 0, &st), st);
  PS_ASSERT_STATUS(
      ps_bundle_writer_add_slice(w, "e", PS_DT_FLOAT, &full, s0, l0, NULL, 0, &st), st,
      PS_INVALID_ARGUMENT, "the same slice added twice");
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("thr/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  pthread_t th[4];
  reader_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (reader_arg){r, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, read_all, &args[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(args[i].errors, 0);
  }
  ps_bundle_reader_close(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("bundle");
  TCase *tc = tcase_create("core");
  tcase_add_unchecked_fixture(tc, setup_basedir, teardown_basedir);
  tcase_add_checked_fixture(tc, setup_tmpdir, teardown_tmpdir);
  tcase_set_timeout(tc, 100);
  tcase_add_test(tc, crc32c_check_values);
  tcase_add_test(tc, crc32c_hw_and_table_agree);
  tcase_add_test(tc, crc32c_long_buffers_agree);
  tcase_add_test(tc, reads_tf_counter);
  tcase_add_test(tc, reads_tf_half_plus_two);
  tcase_add_test(tc, reads_tf_index_with_many_restarts);
  tcase_add_test(tc, writes_counter_exactly_as_tensorflow);
  tcase_add_test(tc, rewrites_tf_index_exactly);
  tcase_add_test(tc, round_trips_every_dtype);
  tcase_add_test(tc, round_trips_strings);
  tcase_add_test(tc, round_trips_a_100mib_tensor);
  bundle_slices_tests(tc);
  bundle_corrupt_tests(tc);
  tcase_add_test(tc, index_spans_several_blocks);
  tcase_add_test(tc, reads_from_several_threads);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
