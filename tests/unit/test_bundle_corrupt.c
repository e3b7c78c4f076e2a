/* Unit tests of damaged checkpoints and writer misuse (part of the
 * unit_bundle test): every corruption or truncation of an index or data
 * file, and every misuse of the writer, is refused with a text naming it. */
#include "test_bundle_internal.h"

/* ---- Corrupt and truncated files ---------------------------------------- */

/* A small bundle at tmp(dir)/ckpt: w = float[100], s = strings. */
static void write_sample(const char *dir) {
  ps_status st = {0};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("%s/ckpt", dir), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  float v[100];
  for (int i = 0; i < 100; i++)
    v[i] = (float)i;
  ps_shape sh = shp(1, (int64_t)100), two = shp(1, (int64_t)2);
  PS_ASSERT_OK(ps_bundle_writer_add(w, "w", PS_DT_FLOAT, &sh, v, sizeof v, &st), st);
  const char *strs[] = {"abc", "defgh"};
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "s", &two, strs, NULL, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
}

static void flip(const char *path, long off, uint8_t mask) {
  size_t n;
  uint8_t *p = read_file(path, &n);
  size_t at = off >= 0 ? (size_t)off : n - (size_t)(-off);
  ck_assert_uint_lt(at, n);
  p[at] ^= mask;
  write_file(path, p, n);
  free(p);
}

static int open_fails(const char *prefix, ps_status *st) {
  ps_bundle_reader *r = ps_bundle_reader_open(prefix, st);
  ck_assert_ptr_null(r);
  ck_assert_msg(strstr(st->msg, prefix) != NULL, "\"%s\" does not name %s", st->msg,
                prefix);
  return st->code;
}

START_TEST(corrupt_index_is_named) {
  ps_status st = {0};
  write_sample("ok");
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("ok/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ps_bundle_reader_close(r);
  size_t n;
  free(read_file(tmp("ok/ckpt.index"), &n));

  write_sample("magic");
  flip(tmp("magic/ckpt.index"), -1, 0x01);
  PS_ASSERT_STATUS(open_fails(tmp("magic/ckpt"), &st), st, PS_DATA_LOSS,
                   "magic/ckpt.index: not an sstable (bad magic number");

  write_sample("block");
  flip(tmp("block/ckpt.index"), 10, 0x04); /* inside data block 0 */
  PS_ASSERT_STATUS(open_fails(tmp("block/ckpt"), &st), st, PS_DATA_LOSS,
                   "block/ckpt.index: block 0: bad checksum");

  write_sample("iblock");
  flip(tmp("iblock/ckpt.index"), -(48 + 5 + 2),
       0x80); /* the index block's restart count */
  PS_ASSERT_STATUS(open_fails(tmp("iblock/ckpt"), &st), st, PS_DATA_LOSS,
                   "iblock/ckpt.index: index block: bad checksum");

  write_sample("trailer");
  flip(tmp("trailer/ckpt.index"), -(48 + 1), 0x10); /* the index block's stored crc */
  PS_ASSERT_STATUS(open_fails(tmp("trailer/ckpt"), &st), st, PS_DATA_LOSS,
                   "index block: bad checksum");

  write_sample("trunc");
  ck_assert_int_eq(truncate(tmp("trunc/ckpt.index"), (off_t)(n / 2)), 0);
  PS_ASSERT_STATUS(open_fails(tmp("trunc/ckpt"), &st), st, PS_DATA_LOSS,
                   "trunc/ckpt.index: not an sstable");
  ck_assert_int_eq(truncate(tmp("trunc/ckpt.index"), 20), 0);
  PS_ASSERT_STATUS(open_fails(tmp("trunc/ckpt"), &st), st, PS_DATA_LOSS,
                   "trunc/ckpt.index: file too short (20 bytes)");
  ck_assert_int_eq(truncate(tmp("trunc/ckpt.index"), 0), 0);
  PS_ASSERT_CODE(open_fails(tmp("trunc/ckpt"), &st), st, PS_DATA_LOSS);

  /* the footer says the index block lies beyond the end */
  write_sample("handle");
  size_t hn;
  uint8_t *h = read_file(tmp("handle/ckpt.index"), &hn);
  uint8_t *f = h + hn - 48;
  ck_assert_uint_lt(f[0], 0x80); /* metaindex offset, then size, index offset, size */
  f[2] = (uint8_t)(f[2] + 100) & 0x7f;
  write_file(tmp("handle/ckpt.index"), h, hn);
  free(h);
  PS_ASSERT_CODE(open_fails(tmp("handle/ckpt"), &st), st, PS_DATA_LOSS);

  PS_ASSERT_STATUS(open_fails(tmp("nothing/ckpt"), &st), st, PS_NOT_FOUND,
                   "nothing/ckpt.index: not found");
}
END_TEST

START_TEST(corrupt_data_is_named) {
  ps_status st = {0};
  float v[100];
  ps_tensor *t;
  ps_bundle_strings *s;

  write_sample("flip");
  flip(tmp("flip/ckpt.data-00000-of-00001"), 40, 0x01); /* inside w */
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("flip/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  PS_ASSERT_STATUS(ps_bundle_reader_read_into(r, "w", v, sizeof v, &st), st, PS_DATA_LOSS,
                   "flip/ckpt.data-00000-of-00001: tensor w: data checksum mismatch");
  PS_ASSERT_CODE(ps_bundle_reader_read(r, "w", &t, &st), st, PS_DATA_LOSS);
  ck_assert_ptr_null(t);
  PS_ASSERT_STATUS(ps_bundle_reader_verify(r, &st), st, PS_DATA_LOSS,
                   "flip/ckpt.data-00000-of-00001: tensor w: data checksum mismatch");
  PS_ASSERT_OK(ps_bundle_reader_read_strings(r, "s", &s, &st), st); /* untouched */
  ps_bundle_strings_destroy(s);
  ps_bundle_reader_close(r);

  /* the string tensor: a length, then a string byte */
  write_sample("str");
  flip(tmp("str/ckpt.data-00000-of-00001"), 400, 0x02); /* first length varint */
  r = ps_bundle_reader_open(tmp("str/ckpt"), &st);
  PS_ASSERT_CODE(ps_bundle_reader_read_strings(r, "s", &s, &st), st, PS_DATA_LOSS);
  ck_assert_ptr_null(s);
  PS_ASSERT_MSG_HAS(st, "str/ckpt.data-00000-of-00001: tensor s:");
  ps_bundle_reader_close(r);
  write_sample("str2");
  flip(tmp("str2/ckpt.data-00000-of-00001"), -1, 0x02); /* last byte of "defgh" */
  r = ps_bundle_reader_open(tmp("str2/ckpt"), &st);
  PS_ASSERT_STATUS(ps_bundle_reader_read_strings(r, "s", &s, &st), st, PS_DATA_LOSS,
                   "str2/ckpt.data-00000-of-00001: tensor s: data checksum mismatch");
  ps_bundle_reader_close(r);
  write_sample("str3");
  flip(tmp("str3/ckpt.data-00000-of-00001"), 403, 0x02); /* the length checksum */
  r = ps_bundle_reader_open(tmp("str3/ckpt"), &st);
  PS_ASSERT_STATUS(ps_bundle_reader_read_strings(r, "s", &s, &st), st, PS_DATA_LOSS,
                   "tensor s: length checksum mismatch");
  ps_bundle_reader_close(r);

  write_sample("short");
  ck_assert_int_eq(truncate(tmp("short/ckpt.data-00000-of-00001"), 399), 0);
  r = ps_bundle_reader_open(tmp("short/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  PS_ASSERT_STATUS(ps_bundle_reader_read_into(r, "w", v, sizeof v, &st), st, PS_DATA_LOSS,
                   "short/ckpt.data-00000-of-00001: tensor w: entry past the end of its "
                   "shard (offset 0 + size 400 > file size 399");
  PS_ASSERT_CODE(ps_bundle_reader_read(r, "w", &t, &st), st, PS_DATA_LOSS);
  PS_ASSERT_STATUS(ps_bundle_reader_read_strings(r, "s", &s, &st), st, PS_DATA_LOSS,
                   "tensor s: entry past the end of its shard");
  PS_ASSERT_CODE(ps_bundle_reader_verify(r, &st), st, PS_DATA_LOSS);
  ps_bundle_reader_close(r);

  write_sample("gone");
  ck_assert_int_eq(unlink(tmp("gone/ckpt.data-00000-of-00001")), 0);
  r = ps_bundle_reader_open(tmp("gone/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg); /* data files open on first read */
  PS_ASSERT_STATUS(ps_bundle_reader_read_into(r, "w", v, sizeof v, &st), st, PS_NOT_FOUND,
                   "gone/ckpt.data-00000-of-00001: missing data shard");
  PS_ASSERT_STATUS(ps_bundle_reader_verify(r, &st), st, PS_NOT_FOUND,
                   "missing data shard");
  ps_bundle_reader_close(r);
}
END_TEST

uint64_t get_varint(const uint8_t **p) {
  uint64_t v = 0;
  for (int s = 0;; s += 7) {
    uint8_t c = *(*p)++;
    v |= (uint64_t)(c & 0x7f) << s;
    if (!(c & 0x80)) return v;
  }
}

/* Rewrites block 0 of a table (the first data block) through @fn, with a
 * valid checksum for the new contents and type. */
static void rewrite_block0(const char *path,
                           void (*fn)(uint8_t *b, size_t n, uint8_t *type)) {
  size_t n;
  uint8_t *p = read_file(path, &n);
  const uint8_t *f = p + n - 48;
  get_varint(&f);
  get_varint(&f);
  uint64_t ioff = get_varint(&f);
  const uint8_t *q = p + ioff;
  get_varint(&q); /* shared */
  uint64_t kn = get_varint(&q);
  get_varint(&q); /* value length */
  q += kn;
  uint64_t off = get_varint(&q), size = get_varint(&q);
  uint8_t *b = p + off, type = b[size];
  fn(b, (size_t)size, &type);
  b[size] = type;
  uint32_t crc = ps_crc32c_mask(ps_crc32c_extend(ps_crc32c(b, (size_t)size), &type, 1));
  for (int i = 0; i < 4; i++)
    b[size + 1 + i] = (uint8_t)(crc >> (8 * i));
  write_file(path, p, n);
  free(p);
}

static void break_snappy(uint8_t *b, size_t n, uint8_t *type) {
  ck_assert_uint_eq(*type, 1);
  b[0] = 0x7f; /* claims 127 uncompressed bytes */
  (void)n;
}

static void unknown_type(uint8_t *b, size_t n, uint8_t *type) {
  *type = 2;
  (void)b;
  (void)n;
}

START_TEST(corrupt_compressed_block_is_named) {
  ps_status st = {0};
  ck_assert_int_eq(mkdir(tmp("z"), 0777), 0);
  copy_file(tfdata("half_plus_two_cpu/variables.index"), tmp("z/v.index"));
  rewrite_block0(tmp("z/v.index"), break_snappy);
  PS_ASSERT_STATUS(open_fails(tmp("z/v"), &st), st, PS_DATA_LOSS,
                   "z/v.index: block 0: corrupted compressed block contents");
  copy_file(tfdata("half_plus_two_gpu/variables.index"), tmp("z/v.index"));
  rewrite_block0(tmp("z/v.index"), unknown_type);
  PS_ASSERT_STATUS(open_fails(tmp("z/v"), &st), st, PS_DATA_LOSS,
                   "z/v.index: block 0: unknown compression type 2");
}
END_TEST

/* ---- Writer misuse ---------------------------------------------------- */

START_TEST(writer_errors_are_named) {
  ps_status st = {0};
  ps_shape scalar = {.rank = 0}, three = shp(1, (int64_t)3);
  float x[3] = {1, 2, 3};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("w/ckpt"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  PS_ASSERT_STATUS(ps_bundle_writer_add(w, "", PS_DT_FLOAT, &scalar, x, 4, &st), st,
                   PS_INVALID_ARGUMENT, "may not be empty");
  PS_ASSERT_STATUS(ps_bundle_writer_add(w, "x", PS_DT_FLOAT, &three, x, 8, &st), st,
                   PS_INVALID_ARGUMENT,
                   "tensor x: 8 bytes given for dtype float shape [3]");
  PS_ASSERT_CODE(ps_bundle_writer_add(w, "r", 20 /* DT_RESOURCE */, &scalar, x, 4, &st),
                 st, PS_UNIMPLEMENTED);
  PS_ASSERT_OK(ps_bundle_writer_add(w, "x", PS_DT_FLOAT, &three, x, 12, &st), st);
  PS_ASSERT_STATUS(ps_bundle_writer_add(w, "x", PS_DT_FLOAT, &three, x, 12, &st), st,
                   PS_INVALID_ARGUMENT, "w/ckpt: tensor x added twice");
  PS_ASSERT_CODE(ps_bundle_writer_add_strings(w, "x", &scalar, NULL, NULL, &st), st,
                 PS_INVALID_ARGUMENT);
  /* Abandoned: nothing is left behind. */
  ps_bundle_writer_destroy(w);
  DIR *d = opendir(tmp("w"));
  ck_assert_ptr_nonnull(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    ck_assert_msg(e->d_name[0] == '.', "left behind: %s", e->d_name);
  closedir(d);
  ps_bundle_writer_destroy(NULL);

  /* finished: no more adds */
  w = ps_bundle_writer_create(tmp("w/ckpt"), &st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  PS_ASSERT_CODE(ps_bundle_writer_add(w, "y", PS_DT_FLOAT, &scalar, x, 4, &st), st,
                 PS_FAILED_PRECONDITION);
  PS_ASSERT_CODE(ps_bundle_writer_finish(w, &st), st, PS_FAILED_PRECONDITION);
  ps_bundle_writer_destroy(w);
  /* an empty bundle is still a bundle */
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("w/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_uint_eq(ps_bundle_reader_count(r), 0);
  ps_bundle_reader_close(r);

  /* a directory that cannot be created */
  write_file(tmp("afile"), "x", 1);
  ck_assert_ptr_null(ps_bundle_writer_create(tmp("afile/sub/ckpt"), &st));
  PS_ASSERT_MSG_HAS(st, "afile/sub/ckpt: cannot create directory");
  ck_assert_ptr_null(ps_bundle_writer_create("", &st));
  PS_ASSERT_CODE(st.code, st, PS_INVALID_ARGUMENT);
}
END_TEST

/* Adds this file's tests to the suite's test cases. */
void bundle_corrupt_tests(TCase *tc) {
  tcase_add_test(tc, corrupt_index_is_named);
  tcase_add_test(tc, corrupt_data_is_named);
  tcase_add_test(tc, corrupt_compressed_block_is_named);
  tcase_add_test(tc, writer_errors_are_named);
}
