/* Unit tests of inspect and path confinement (part of the unit_checkpoint
 * test): inspect output compared with exact expected text for the
 * TensorFlow-written checkpoints in $PS_TESTDATA/tf-checkpoints and for
 * bundles written here; checkpoint prefixes confined to their root. */
#include "test_checkpoint_internal.h"

/* ---- inspect -------------------------------------------------------------- */

START_TEST(inspect_tensorflow_checkpoints) {
  assert_inspect(tfdata("counter/variables"), false, "counter (DT_FLOAT) []\n");
  assert_inspect(tfdata("counter/variables"), true, "tensor_name:  counter\n0.0\n");
  assert_inspect(tfdata("half_plus_two_cpu/variables"), false,
                 "a (DT_FLOAT) []\n"
                 "a2 (DT_FLOAT) []\n"
                 "b (DT_FLOAT) []\n"
                 "c (DT_FLOAT) []\n"
                 "c2 (DT_FLOAT) []\n");
  assert_inspect(tfdata("half_plus_two_cpu/variables"), true,
                 "tensor_name:  a\n0.5\n"
                 "tensor_name:  a2\n0.5\n"
                 "tensor_name:  b\n2.0\n"
                 "tensor_name:  c\n3.0\n"
                 "tensor_name:  c2\n3.0\n");
  assert_inspect(tfdata("half_plus_two_gpu/variables"), true,
                 "tensor_name:  a\n0.5\n"
                 "tensor_name:  b\n2.0\n"
                 "tensor_name:  c\n3.0\n");
  /* a directory: its latest checkpoint */
  char text[2200];
  snprintf(text, sizeof text, "model_checkpoint_path: \"%s\"\n",
           tfdata("half_plus_two_gpu/variables"));
  write_text(tmp("checkpoint"), text);
  assert_inspect(tmpdir, false, "a (DT_FLOAT) []\nb (DT_FLOAT) []\nc (DT_FLOAT) []\n");
}
END_TEST

START_TEST(inspect_errors_name_the_file) {
  ps_status st = {0};
  char *out = inspect(tmp("missing"), false, &st);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, tmp("missing.index"));
  ck_assert_str_eq(out, "");
  free(out);
  /* given the index file instead of the prefix */
  out = inspect(tfdata("counter/variables.index"), false, &st);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, "variables.index.index");
  PS_ASSERT_MSG_HAS(st, "give the checkpoint prefix");
  free(out);
  /* a directory without checkpoints */
  out = inspect(tmpdir, false, &st);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, "no checkpoint in");
  free(out);
  /* a corrupt index */
  write_text(tmp("bad.index"), "not a table");
  out = inspect(tmp("bad"), false, &st);
  PS_ASSERT_STATUS(st.code, st, PS_DATA_LOSS, tmp("bad.index"));
  free(out);
  /* a missing data file: the lines before the failing value stay */
  ps_bundle_writer *w = ps_bundle_writer_create(tmp("nodata"), &st);
  ck_assert_ptr_nonnull(w);
  float v = 1;
  ps_shape scalar = {0};
  PS_ASSERT_OK(ps_bundle_writer_add(w, "v", PS_DT_FLOAT, &scalar, &v, 4, &st), st);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);
  ck_assert_int_eq(unlink(tmp("nodata.data-00000-of-00001")), 0);
  assert_inspect(tmp("nodata"), false, "v (DT_FLOAT) []\n");
  out = inspect(tmp("nodata"), true, &st);
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, tmp("nodata.data-00000-of-00001"));
  ck_assert_str_eq(out, "tensor_name:  v\n");
  free(out);
}
END_TEST

static void add_tensor(ps_bundle_writer *w, const char *key, int dtype, ps_shape shape,
                       const void *data) {
  ps_status st = {0};
  size_t n = (size_t)ps_shape_num_elements(&shape) * ps_dtype_size(dtype);
  PS_ASSERT_OK(ps_bundle_writer_add(w, key, dtype, &shape, data, n, &st), st);
}

START_TEST(inspect_values_like_numpy) {
  ps_status st = {0};
  TMP(prefix, "model.ckpt-7");
  ps_bundle_writer *w = ps_bundle_writer_create(prefix, &st);
  ck_assert_ptr_nonnull(w);
  uint8_t bools[3] = {1, 0, 1};
  add_tensor(w, "bools", PS_DT_BOOL, (ps_shape){1, {3}}, bools);
  /* a partitioned [4,2] variable in two slices */
  float emb[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  ps_shape full = {2, {4, 2}};
  int64_t start0[2] = {0, 0}, start1[2] = {2, 0}, len[2] = {2, -1};
  PS_ASSERT_OK(ps_bundle_writer_add_slice(w, "emb", PS_DT_FLOAT, &full, start1, len,
                                          emb + 4, 16, &st),
               st);
  PS_ASSERT_OK(
      ps_bundle_writer_add_slice(w, "emb", PS_DT_FLOAT, &full, start0, len, emb, 16, &st),
      st);
  int64_t step = 1000;
  add_tensor(w, "global_step", PS_DT_INT64, (ps_shape){0, {0}}, &step);
  uint16_t half[2] = {ps_float_to_half(0.5f), ps_float_to_half(0.1f)};
  add_tensor(w, "half", PS_DT_HALF, (ps_shape){1, {2}}, half);
  int32_t i3[8] = {0, 1, 2, 3, 4, 5, 6, -7};
  add_tensor(w, "int3", PS_DT_INT32, (ps_shape){3, {2, 2, 2}}, i3);
  int32_t *lng = malloc(2000 * sizeof *lng);
  for (int i = 0; i < 2000; i++)
    lng[i] = i;
  add_tensor(w, "long", PS_DT_INT32, (ps_shape){1, {2000}}, lng);
  free(lng);
  double mat[6] = {1, 2.5, -3, 1e-5, 1e16, 0.1};
  add_tensor(w, "matrix", PS_DT_DOUBLE, (ps_shape){2, {2, 3}}, mat);
  float cplx[2] = {1.5f, -2};
  add_tensor(w, "cplx", PS_DT_COMPLEX64, (ps_shape){0, {0}}, cplx);
  const char *strs[3] = {"a", "it's", "x\n\x01\xff"};
  ps_shape sshape = {1, {3}};
  PS_ASSERT_OK(ps_bundle_writer_add_strings(w, "names", &sshape, strs, NULL, &st), st);
  float *table = malloc(2000 * sizeof *table);
  for (int i = 0; i < 2000; i++)
    table[i] = (float)i;
  add_tensor(w, "table", PS_DT_FLOAT, (ps_shape){2, {100, 20}}, table);
  free(table);
  uint64_t big = UINT64_MAX;
  add_tensor(w, "u64", PS_DT_UINT64, (ps_shape){1, {1}}, &big);
  PS_ASSERT_OK(ps_bundle_writer_finish(w, &st), st);
  ps_bundle_writer_destroy(w);

  assert_inspect(prefix, false,
                 "bools (DT_BOOL) [3]\n"
                 "cplx (DT_COMPLEX64) []\n"
                 "emb (DT_FLOAT) [4,2]\n"
                 "global_step (DT_INT64) []\n"
                 "half (DT_HALF) [2]\n"
                 "int3 (DT_INT32) [2,2,2]\n"
                 "long (DT_INT32) [2000]\n"
                 "matrix (DT_DOUBLE) [2,3]\n"
                 "names (DT_STRING) [3]\n"
                 "table (DT_FLOAT) [100,20]\n"
                 "u64 (DT_UINT64) [1]\n");
  assert_inspect(prefix, true,
                 "tensor_name:  bools\n"
                 "[True False True]\n"
                 "tensor_name:  cplx\n"
                 "(1.5-2j)\n"
                 "tensor_name:  emb\n"
                 "[[0.0 1.0]\n"
                 " [2.0 3.0]\n"
                 " [4.0 5.0]\n"
                 " [6.0 7.0]]\n"
                 "tensor_name:  global_step\n"
                 "1000\n"
                 "tensor_name:  half\n"
                 "[0.5 0.1]\n"
                 "tensor_name:  int3\n"
                 "[[[0 1]\n"
                 "  [2 3]]\n"
                 "\n"
                 " [[4 5]\n"
                 "  [6 -7]]]\n"
                 "tensor_name:  long\n"
                 "[0 1 2 ... 1997 1998 1999]\n"
                 "tensor_name:  matrix\n"
                 "[[1.0 2.5 -3.0]\n"
                 " [1e-05 1e+16 0.1]]\n"
                 "tensor_name:  names\n"
                 "[b'a' b\"it's\" b'x\\n\\x01\\xff']\n"
                 "tensor_name:  table\n"
                 "[[0.0 1.0 2.0 ... 17.0 18.0 19.0]\n"
                 " [20.0 21.0 22.0 ... 37.0 38.0 39.0]\n"
                 " [40.0 41.0 42.0 ... 57.0 58.0 59.0]\n"
                 " ...\n"
                 " [1940.0 1941.0 1942.0 ... 1957.0 1958.0 1959.0]\n"
                 " [1960.0 1961.0 1962.0 ... 1977.0 1978.0 1979.0]\n"
                 " [1980.0 1981.0 1982.0 ... 1997.0 1998.0 1999.0]]\n"
                 "tensor_name:  u64\n"
                 "[18446744073709551615]\n");
}
END_TEST

/* ---- Path confinement ----------------------------------------------------- */

static void assert_confined(const char *root, const char *prefix, const char *want) {
  char out[1024];
  ps_status st = {0};
  ck_assert_msg(ps_ckpt_path_confined(root, prefix, out, sizeof out, &st) == 0,
                "%s under %s: %s", prefix, root, st.msg);
  ck_assert_str_eq(out, want);
}

static void assert_refused(const char *root, const char *prefix, int code,
                           const char *msg) {
  char out[1024] = "untouched";
  ps_status st = {0};
  PS_ASSERT_CODE(ps_ckpt_path_confined(root, prefix, out, sizeof out, &st), st, code);
  PS_ASSERT_STATUS(st.code, st, code, msg);
  if (prefix[0]) PS_ASSERT_MSG_HAS(st, prefix);
  if (root[0]) PS_ASSERT_MSG_HAS(st, root);
  ck_assert_str_eq(out, "untouched");
}

START_TEST(path_confinement) {
  const char *root = tmpdir;
  assert_confined(root, "model.ckpt-1", tmp("model.ckpt-1"));
  assert_confined(root, "sub/./model", tmp("sub/model"));
  assert_confined(root, "a//b/../model/", tmp("a/model"));
  assert_confined(root, tmp("x/model"), tmp("x/model"));
  char root_slash[1100];
  snprintf(root_slash, sizeof root_slash, "%s/", tmpdir);
  assert_confined(root_slash, "m", tmp("m"));
  /* leaving the root */
  assert_refused(root, "../evil", PS_PERMISSION_DENIED,
                 "is outside the checkpoint directory");
  assert_refused(root, "a/../../evil", PS_PERMISSION_DENIED, "is outside");
  assert_refused(root, "..", PS_PERMISSION_DENIED, "is outside");
  assert_refused(root, "/etc/passwd", PS_PERMISSION_DENIED, "is outside");
  assert_refused(root, tmp("../x"), PS_PERMISSION_DENIED, "is outside");
  char sibling[1100];
  snprintf(sibling, sizeof sibling, "%s-other/model", tmpdir);
  assert_refused(root, sibling, PS_PERMISSION_DENIED, "is outside");
  /* the root itself: its files would sit beside it */
  assert_refused(root, ".", PS_INVALID_ARGUMENT, "names the checkpoint directory");
  assert_refused(root, "a/..", PS_INVALID_ARGUMENT, "names the checkpoint directory");
  assert_refused(root, root, PS_INVALID_ARGUMENT, "names the checkpoint directory");
  assert_refused(root, "", PS_INVALID_ARGUMENT, "empty checkpoint path");
  assert_refused("", "m", PS_INVALID_ARGUMENT, "empty checkpoint directory");
  /* symbolic links inside the root */
  TMP(outside, "outside");
  TMP(inroot, "root");
  ck_assert_int_eq(mkdir(outside, 0755), 0);
  ck_assert_int_eq(mkdir(inroot, 0755), 0);
  ck_assert_int_eq(mkdir(tmp("root/sub"), 0755), 0);
  ck_assert_int_eq(symlink(outside, tmp("root/out")), 0);
  ck_assert_int_eq(symlink("sub", tmp("root/in")), 0);
  assert_refused(inroot, "out/model", PS_PERMISSION_DENIED, "through a symbolic link");
  assert_refused(inroot, "out/new/deeper/model", PS_PERMISSION_DENIED, "symbolic link");
  assert_confined(inroot, "in/model", tmp("root/in/model"));
  assert_confined(inroot, "new/dir/model", tmp("root/new/dir/model"));
  /* a relative root stays relative */
  assert_confined("ckpt", "model", "ckpt/model");
  assert_confined("./ckpt/", "a/../model", "ckpt/model");
  assert_confined(".", "model", "model");
  assert_refused("ckpt", "../model", PS_PERMISSION_DENIED, "is outside");
  /* too small a buffer */
  char small[8];
  ps_status st = {0};
  PS_ASSERT_STATUS(ps_ckpt_path_confined(root, "model", small, sizeof small, &st), st,
                   PS_INVALID_ARGUMENT, "more than the 7 allowed");
}
END_TEST

/* Adds this file's tests to the suite's test cases. */
void checkpoint_inspect_tests(TCase *tc) {
  tcase_add_test(tc, inspect_tensorflow_checkpoints);
  tcase_add_test(tc, inspect_errors_name_the_file);
  tcase_add_test(tc, inspect_values_like_numpy);
  tcase_add_test(tc, path_confinement);
}
