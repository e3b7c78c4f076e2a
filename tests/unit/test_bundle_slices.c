/* Unit tests of partitioned (sliced) tensors and merges in TensorFlow V2
 * checkpoints (part of the unit_bundle test): slices as TensorFlow writes
 * them, shape-and-slice specs, MergeV2Checkpoints and its conflicts. */
#include "test_bundle_internal.h"

/* ---- Partitioned tensors ------------------------------------------------ */

static bool has_bytes(const uint8_t *p, size_t n, const uint8_t *want, size_t wn) {
  return memmem(p, n, want, wn) != NULL;
}

/* v = [10,20] float, v[i][j] = 100 i + j, saved as rows 0-4 and 5-9 with
 * TF1 Python's explicit extents ("10 20 0,5:0,20", "10 20 5,5:0,20"). */
float vval(int64_t i, int64_t j) {
  return (float)(100 * i + j);
}

void add_v_slice(ps_bundle_writer *w, int64_t row0, int64_t rows) {
  ps_status st = {0};
  ps_shape full = shp(2, (int64_t)10, (int64_t)20);
  float buf[200];
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < 20; j++)
      buf[i * 20 + j] = vval(row0 + i, j);
  int64_t start[2] = {row0, 0}, len[2] = {rows, 20};
  PS_ASSERT_OK(ps_bundle_writer_add_slice(w, "v", PS_DT_FLOAT, &full, start, len, buf,
                                          (size_t)rows * 20 * 4, &st),
               st);
}

/* Many partitioned tensors: each slice's entry grows the entry table, which
 * may move it, while the writer held a pointer to the full tensor's entry
 * (a use after free that ASan saw once a save had more than 8 tensors). */
START_TEST(many_partitioned_tensors_round_trip) {
  ps_status st = {0};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("many/ckpt"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ps_shape full = shp(1, (int64_t)4, (int64_t)0);
  char name[32];
  for (int t = 0; t < 100; t++) {
    snprintf(name, sizeof name, "t%03d", t);
    for (int64_t part = 0; part < 2; part++) {
      float buf[2] = {(float)(10 * t + 2 * part), (float)(10 * t + 2 * part + 1)};
      int64_t start[1] = {2 * part}, len[1] = {2};
      PS_ASSERT_OK(ps_bundle_writer_add_slice(w, name, PS_DT_FLOAT, &full, start, len,
                                              buf, sizeof buf, &st),
                   st);
    }
  }
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("many/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  for (int t = 0; t < 100; t++) {
    snprintf(name, sizeof name, "t%03d", t);
    ps_tensor *x = NULL;
    PS_ASSERT_OK(ps_bundle_reader_read(r, name, &x, &st), st);
    const float *v = ps_tensor_data(x);
    for (int k = 0; k < 4; k++)
      ck_assert(v[k] == (float)(10 * t + k));
    ps_tensor_destroy(x);
  }
  ps_bundle_reader_close(r);
}
END_TEST

START_TEST(sliced_entries_match_tensorflow) {
  ps_status st = {0};
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("sl/ckpt"), &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  add_v_slice(w, 5, 5); /* any order */
  add_v_slice(w, 0, 5);
  /* the same slice twice, an overlapping one, a plain tensor of that name */
  ps_shape full = shp(2, (int64_t)10, (int64_t)20);
  float buf[300] = {0};
  int64_t s0[2] = {0, 0}, l5[2] = {5, 20}, s3[2] = {3, 0};
  PS_ASSERT_CODE(
      ps_bundle_writer_add_slice(w, "v", PS_DT_FLOAT, &full, s0, l5, buf, 400, &st), st,
      PS_INVALID_ARGUMENT);
  PS_ASSERT_STATUS(
      ps_bundle_writer_add_slice(w, "v", PS_DT_FLOAT, &full, s3, l5, buf, 400, &st), st,
      PS_INVALID_ARGUMENT, "overlaps");
  PS_ASSERT_STATUS(ps_bundle_writer_add(w, "v", PS_DT_FLOAT, &full, buf, 800, &st), st,
                   PS_INVALID_ARGUMENT, "tensor v added twice");
  /* a slice outside the shape, a wrong byte count */
  int64_t s8[2] = {8, 0};
  PS_ASSERT_STATUS(
      ps_bundle_writer_add_slice(w, "u", PS_DT_FLOAT, &full, s8, l5, buf, 400, &st), st,
      PS_INVALID_ARGUMENT, "does not fit");
  PS_ASSERT_CODE(
      ps_bundle_writer_add_slice(w, "u", PS_DT_FLOAT, &full, s0, l5, buf, 4, &st), st,
      PS_INVALID_ARGUMENT);
  /* a "slice" covering everything is a plain entry */
  int64_t z[2] = {0, 0}, all[2] = {-1, 20};
  PS_ASSERT_OK(
      ps_bundle_writer_add_slice(w, "whole", PS_DT_FLOAT, &full, z, all, buf, 800, &st),
      st);
  /* one column range of a [3, 0x500000] tensor: multi-byte OrderedCode */
  ps_shape wide = shp(2, (int64_t)3, (int64_t)0x500000);
  int64_t ws[2] = {0, 0x424242}, wl[2] = {-1, 100};
  PS_ASSERT_OK(
      ps_bundle_writer_add_slice(w, "w", PS_DT_FLOAT, &wide, ws, wl, buf, 1200, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);

  /* The index holds TensorFlow's bytes (tf-checkpoint-format.md 6.3). */
  size_t n;
  uint8_t *idx = read_file(tmp("sl/ckpt.index"), &n);
  static const uint8_t full_entry[] = {
      0x08, 0x01, 0x12, 0x08, 0x12, 0x02, 0x08, 0x0a, 0x12, 0x02, 0x08, 0x14, 0x3a,
      0x0a, 0x0a, 0x04, 0x08, 0x05, 0x10, 0x05, 0x0a, 0x02, 0x10, 0x14, /* 5,5:0,20 */
      0x3a, 0x08, 0x0a, 0x02, 0x10, 0x05, 0x0a, 0x02, 0x10, 0x14};      /* 0,5:0,20 */
  ck_assert(has_bytes(idx, n, full_entry, sizeof full_entry));
  free(idx);
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("sl/ckpt"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ck_assert_uint_eq(ps_bundle_reader_count(r), 3 + 3);
  static const uint8_t k0[] = {0x00, 0x76, 0x00, 0x01, 0x01,
                               0x02, 0x80, 0x85, 0x80, 0x94};
  static const uint8_t k1[] = {0x00, 0x76, 0x00, 0x01, 0x01,
                               0x02, 0x85, 0x85, 0x80, 0x94};
  /* 0x424242 -> f0 42 42 42, 100 -> c0 64, whole dimension -> 80 7f */
  static const uint8_t kw[] = {0x00, 0x77, 0x00, 0x01, 0x01, 0x02, 0x80,
                               0x7f, 0xf0, 0x42, 0x42, 0x42, 0xc0, 0x64};
  const ps_bundle_entry *e0 = ps_bundle_reader_entry(r, 0),
                        *e1 = ps_bundle_reader_entry(r, 1),
                        *e2 = ps_bundle_reader_entry(r, 2);
  ck_assert(e0->is_slice && e1->is_slice && e2->is_slice);
  ck_assert_uint_eq(e0->key_len, sizeof k0);
  ck_assert_int_eq(memcmp(e0->key, k0, sizeof k0), 0);
  ck_assert_int_eq(memcmp(e1->key, k1, sizeof k1), 0);
  ck_assert_uint_eq(e2->key_len, sizeof kw);
  ck_assert_int_eq(memcmp(e2->key, kw, sizeof kw), 0);
  ck_assert_int_eq(e0->shape.rank, 2);
  ck_assert_int_eq(e0->shape.dim[0], 5);
  ck_assert_uint_eq(e1->offset, 0); /* rows 5-9 were added first */
  const ps_bundle_entry *v = ps_bundle_reader_find(r, "v");
  ck_assert_uint_eq(v->nslices, 2);
  ck_assert_int_eq(v->slices[0].start[0], 5);
  ck_assert_int_eq(v->slices[1].length[0], 5);
  ck_assert_int_eq(v->shape.dim[1], 20);
  ck_assert_uint_eq(ps_bundle_reader_find(r, "whole")->nslices, 0);

  /* The full tensor, assembled. */
  ps_tensor *t;
  PS_ASSERT_OK(ps_bundle_reader_read(r, "v", &t, &st), st);
  for (int i = 0; i < 10; i++)
    for (int j = 0; j < 20; j++)
      ck_assert(((float *)ps_tensor_data(t))[i * 20 + j] == vval(i, j));
  ps_tensor_destroy(t);
  /* A window across both slices, a stored slice exactly, a "-" extent. */
  int64_t st1[2] = {3, 2}, ln1[2] = {4, 5};
  float out[200];
  PS_ASSERT_OK(ps_bundle_reader_read_slice(r, "v", st1, ln1, out, 20 * 4, &st), st);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 5; j++)
      ck_assert(out[i * 5 + j] == vval(3 + i, 2 + j));
  int64_t st2[2] = {5, 0}, ln2[2] = {5, -1};
  PS_ASSERT_OK(ps_bundle_reader_read_slice(r, "v", st2, ln2, out, 100 * 4, &st), st);
  ck_assert(out[99] == vval(9, 19));
  PS_ASSERT_CODE(ps_bundle_reader_read_slice(r, "v", st2, ln2, out, 99 * 4, &st), st,
                 PS_INVALID_ARGUMENT);
  int64_t bad[2] = {9, 0}, badl[2] = {2, 20};
  PS_ASSERT_CODE(ps_bundle_reader_read_slice(r, "v", bad, badl, out, 160, &st), st,
                 PS_INVALID_ARGUMENT);
  /* A slice of the wide tensor that was stored, and one that was not. */
  int64_t st3[2] = {1, 0x424242 + 10}, ln3[2] = {2, 3};
  PS_ASSERT_OK(ps_bundle_reader_read_slice(r, "w", st3, ln3, out, 6 * 4, &st), st);
  int64_t st4[2] = {0, 0}, ln4[2] = {1, 1};
  PS_ASSERT_STATUS(ps_bundle_reader_read_slice(r, "w", st4, ln4, out, 4, &st), st,
                   PS_NOT_FOUND,
                   "tensor w: the stored slices do not cover slice 0,1:0,1");
  PS_ASSERT_CODE(ps_bundle_reader_read(r, "w", &t, &st), st, PS_NOT_FOUND);
  ps_bundle_reader_close(r);
}
END_TEST

START_TEST(parses_shape_and_slice_specs) {
  ps_status st = {0};
  ps_shape full;
  ps_bundle_slice sl;
  bool sliced = true;
  PS_ASSERT_OK(ps_bundle_parse_shape_and_slice("", &full, &sl, &sliced, &st), st);
  ck_assert(!sliced);
  PS_ASSERT_OK(
      ps_bundle_parse_shape_and_slice("10 20 0,5:0,20", &full, &sl, &sliced, &st), st);
  ck_assert(sliced);
  ck_assert_int_eq(full.rank, 2);
  ck_assert_int_eq(full.dim[1], 20);
  ck_assert_int_eq(sl.rank, 2);
  ck_assert_int_eq(sl.length[0], 5);
  PS_ASSERT_OK(ps_bundle_parse_shape_and_slice("4 6 -:2,3", &full, &sl, &sliced, &st),
               st);
  ck_assert_int_eq(sl.start[0], 0);
  ck_assert_int_eq(sl.length[0], -1);
  ck_assert_int_eq(sl.start[1], 2);
  static const char *const bad[] = {"10 20",      "10 20 0,5",          "10 20 0,11:0,20",
                                    "10 x 0,5:-", "10 20 0,5:0,20:0,1", "10 20 -1,5:-",
                                    "10 20 0,5;-"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_msg(ps_bundle_parse_shape_and_slice(bad[i], &full, &sl, &sliced, &st) ==
                      PS_INVALID_ARGUMENT,
                  "%s", bad[i]);
    PS_ASSERT_MSG_HAS(st, bad[i]);
  }
  char name[64];
  ck_assert_str_eq(ps_bundle_data_filename("/c/m", 3, 12, name, sizeof name),
                   "/c/m.data-00003-of-00012");
  ck_assert_ptr_null(ps_bundle_data_filename("/c/m", 3, 12, name, 10));
}
END_TEST

/* ---- Merge -------------------------------------------------------------- */

START_TEST(merges_parts_like_merge_v2_checkpoints) {
  ps_status st = {0};
  TMP(p0, "P_temp/part-00000-of-00003");
  TMP(p1, "P_temp/part-00001-of-00003");
  TMP(p2, "P_temp/part-00002-of-00003");
  const char *parts[3] = {p0, p1, p2};
  ps_shape scalar = {.rank = 0};
  /* ps 0: a and rows 0-4 of v; ps 1: b, rows 5-9 of v; ps 2: strings */
  ps_bundle_writer *w = ps_bundle_writer_create(parts[0], &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  float a = 1.5f, b = -7.0f;
  PS_ASSERT_OK(ps_bundle_writer_add(w, "a", PS_DT_FLOAT, &scalar, &a, 4, &st), st);
  add_v_slice(w, 0, 5);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  w = ps_bundle_writer_create(parts[1], &st);
  PS_ASSERT_OK(ps_bundle_writer_add(w, "b", PS_DT_FLOAT, &scalar, &b, 4, &st), st);
  add_v_slice(w, 5, 5);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  w = ps_bundle_writer_create(parts[2], &st);
  const char *names[] = {"x", "yz"};
  ps_shape two = shp(1, (int64_t)2);
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "names", &two, names, NULL, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);

  PS_ASSERT_OK(ps_bundle_merge(parts, 3, tmp("model.ckpt-100"), &st), st);
  for (int k = 0; k < 3; k++) {
    char name[64];
    snprintf(name, sizeof name, "model.ckpt-100.data-%05d-of-00003", k);
    ck_assert_msg(exists(tmp("%s", name)), "%s", name);
  }
  ck_assert(!exists(tmp("P_temp"))); /* parts moved, indexes deleted, dir removed */
  size_t n;
  uint8_t *idx = read_file(tmp("model.ckpt-100.index"), &n);
  static const uint8_t header[] = {0x00, 0x00, 0x06, 0x08, 0x03, 0x1a, 0x02, 0x08, 0x01};
  ck_assert_int_eq(memcmp(idx, header, sizeof header), 0); /* num_shards = 3 */
  free(idx);

  ps_bundle_reader *r = ps_bundle_reader_open(tmp("model.ckpt-100"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_bundle_reader_num_shards(r), 3);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ck_assert_int_eq(ps_bundle_reader_find(r, "a")->shard_id, 0);
  ck_assert_int_eq(ps_bundle_reader_find(r, "b")->shard_id, 1);
  ck_assert_int_eq(ps_bundle_reader_find(r, "names")->shard_id, 2);
  ck_assert_uint_eq(ps_bundle_reader_find(r, "v")->nslices, 2);
  ck_assert(read_float(r, "a") == 1.5f);
  ck_assert(read_float(r, "b") == -7.0f);
  ps_tensor *t;
  PS_ASSERT_OK(ps_bundle_reader_read(r, "v", &t, &st), st);
  for (int i = 0; i < 10; i++)
    ck_assert(((float *)ps_tensor_data(t))[i * 20 + 19] == vval(i, 19));
  ps_tensor_destroy(t);
  ps_bundle_strings *s;
  PS_ASSERT_OK(ps_bundle_reader_read_strings(r, "names", &s, &st), st);
  ck_assert_str_eq(s->str[1], "yz");
  ps_bundle_strings_destroy(s);
  ps_bundle_reader_close(r);
}
END_TEST

START_TEST(merge_conflicts_move_nothing) {
  ps_status st = {0};
  TMP(p0, "t/p0");
  TMP(p1, "t/p1");
  TMP(p2, "t/p2");
  const char *parts[3] = {p0, p1, p2};
  ps_shape scalar = {.rank = 0};
  float x = 1;
  for (int k = 0; k < 2; k++) {
    ps_bundle_writer *w = ps_bundle_writer_create(parts[k], &st);
    ck_assert_msg(w != NULL, "%s", st.msg);
    PS_ASSERT_OK(ps_bundle_writer_add(w, "dup", PS_DT_FLOAT, &scalar, &x, 4, &st), st);
    PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
    ps_bundle_writer_destroy(w);
  }
  PS_ASSERT_STATUS(ps_bundle_merge(parts, 2, tmp("out/m"), &st), st, PS_INVALID_ARGUMENT,
                   "Duplicate tensor keyed by dup");
  PS_ASSERT_MSG_HAS(st, "t/p1");
  ck_assert(exists(tmp("t/p0.index")) && exists(tmp("t/p0.data-00000-of-00001")));
  ck_assert(exists(tmp("t/p1.index")) && exists(tmp("t/p1.data-00000-of-00001")));
  ck_assert(!exists(tmp("out/m.index")));
  /* a missing part, a part whose data file is gone */
  PS_ASSERT_STATUS(ps_bundle_merge(&parts[1], 2, tmp("out/m"), &st), st, PS_NOT_FOUND,
                   "t/p2.index: not found");
  unlink(tmp("t/p1.data-00000-of-00001"));
  PS_ASSERT_STATUS(ps_bundle_merge(&parts[1], 1, tmp("out/m"), &st), st, PS_NOT_FOUND,
                   "t/p1.data-00000-of-00001: missing data shard");
  ck_assert(exists(tmp("t/p1.index")));
  ck_assert(!exists(tmp("out/m.index")));
  /* a part with no tensors still counts as a shard, and its file moves */
  ps_bundle_writer *w = ps_bundle_writer_create(parts[2], &st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  const char *two[] = {parts[2], parts[0]};
  PS_ASSERT_OK(ps_bundle_merge(two, 2, tmp("out/m"), &st), st);
  ck_assert(exists(tmp("out/m.data-00000-of-00002")));
  ps_bundle_reader *r = ps_bundle_reader_open(tmp("out/m"), &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_bundle_reader_num_shards(r), 2);
  ck_assert_int_eq(ps_bundle_reader_find(r, "dup")->shard_id, 0); /* first used */
  ck_assert(read_float(r, "dup") == 1.0f);
  PS_ASSERT_OK(ps_bundle_reader_verify(r, &st), st);
  ps_bundle_reader_close(r);
  ck_assert(exists(tmp("out/m.data-00001-of-00002")));
}
END_TEST

/* Adds this file's tests to the suite's test cases. */
void bundle_slices_tests(TCase *tc) {
  tcase_add_test(tc, sliced_entries_match_tensorflow);
  tcase_add_test(tc, many_partitioned_tensors_round_trip);
  tcase_add_test(tc, parses_shape_and_slice_specs);
  tcase_add_test(tc, merges_parts_like_merge_v2_checkpoints);
  tcase_add_test(tc, merge_conflicts_move_nothing);
}
