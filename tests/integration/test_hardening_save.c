/* Saves keep working after refused requests (part of the
 * integration_hardening test): the checkpoint key space across ps tasks,
 * a save after refused conflicts and deletes. */
#include "test_hardening_internal.h"

/* ---- saves keep working (item 9) ---- */

static char ckdir[64];

void save_setup(void) {
  snprintf(ckdir, sizeof ckdir, "/tmp/ps-ckpt-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(ckdir));
  const char *extra[] = {"--checkpoint-dir", ckdir, NULL};
  start(extra);
}

void save_teardown(void) {
  char cmd[128], *out = NULL;
  snprintf(cmd, sizeof cmd, "rm -rf %s", ckdir);
  harness_run(cmd, &out);
  free(out);
  teardown();
}

void two_ps_save_setup(void) {
  snprintf(ckdir, sizeof ckdir, "/tmp/ps-ckpt-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(ckdir));
  const char *extra[] = {"--checkpoint-dir", ckdir, NULL};
  C = harness_start_client(&H, 2, extra);
  ck_assert_ptr_nonnull(C);
}

/* The checkpoint key space spans the ps tasks: one merged checkpoint holds
 * the shards of all of them, so a key on two tasks broke every save. */
START_TEST(key_space_conflicts_across_tasks_are_refused) {
  ps_status st;
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  PS_ASSERT_OK(
      create_part_on(0, "P/part_0", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st),
      st);
  ps_var_spec w = {.name = "w", .dtype = PS_DT_FLOAT, .shape = shp2(2, 3), .init = &z};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &w, 1, &st), st);
  /* a plain P on ps/1 beside the part of P on ps/0 */
  ps_var_spec plain = {
      .name = "P", .dtype = PS_DT_FLOAT, .shape = shp2(4, 2), .init = &z};
  PS_ASSERT_STATUS(ps_client_create_vars(C, 1, &plain, 1, &st), st, PS_ALREADY_EXISTS,
                   "variable P: P is the full name of the partitioned variable whose "
                   "part P/part_0 is on ps/0");
  /* parts of the plain w of ps/0 */
  PS_ASSERT_STATUS(
      create_part_on(1, "w/part_0", "w", shp2(1, 3), shp2(2, 3), 0, PS_DT_FLOAT, &st), st,
      PS_ALREADY_EXISTS, "variable w/part_0: its full name w is a variable on ps/0");
  /* the same name on both */
  PS_ASSERT_STATUS(ps_client_create_vars(C, 1, &w, 1, &st), st, PS_ALREADY_EXISTS,
                   "variable w: a variable of that name is on ps/0; creating it on "
                   "ps/1 too would put it twice in every checkpoint");
  /* overlapping parts, disagreeing full shape or dtype */
  PS_ASSERT_STATUS(
      create_part_on(1, "P/part_1", "P", shp2(2, 2), shp2(4, 2), 2, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT,
      "variable P/part_1: its elements [2, 6) of P overlap those of "
      "part P/part_0 [0, 4) on ps/0");
  PS_ASSERT_STATUS(
      create_part_on(1, "P/part_1", "P", shp2(2, 2), shp2(6, 2), 4, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT,
      "variable P/part_1: part of P with dtype float and full shape "
      "[6,2], but its part P/part_0 on ps/0 has dtype float and full "
      "shape [4,2]");
  PS_ASSERT_STATUS(
      create_part_on(1, "P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_INT32, &st), st,
      PS_INVALID_ARGUMENT, "but its part P/part_0 on ps/0 has dtype float");
  /* nothing reached ps/1 */
  ps_var_info *vi;
  size_t n;
  PS_ASSERT_OK(ps_client_list(C, 1, &vi, &n, &st), st);
  ck_assert_uint_eq(n, 0);
  ps_client_free_var_info(vi, n);
  /* the right second part: List tells whose part it is */
  PS_ASSERT_OK(
      create_part_on(1, "P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_FLOAT, &st),
      st);
  PS_ASSERT_OK(ps_client_list(C, 1, &vi, &n, &st), st);
  ck_assert_uint_eq(n, 1);
  ck_assert_str_eq(vi[0].full_name, "P");
  ck_assert_int_eq(vi[0].offset, 4);
  ck_assert_int_eq(vi[0].full_shape.rank, 2);
  ck_assert_int_eq(vi[0].full_shape.dim[0], 4);
  ps_client_free_var_info(vi, n);
  /* and the cluster saves and restores */
  for (int t = 0; t < 2; t++)
    PS_ASSERT_OK(ps_client_initialize(C, t, NULL, 0, false, NULL, &st), st);
  char *written = NULL;
  PS_ASSERT_OK(ps_client_save(C, "both", NULL, &written, NULL, &st), st);
  free(written);
  size_t nr = 0;
  PS_ASSERT_OK(ps_client_restore(C, "both", &nr, &st), st);
  ck_assert_uint_eq(nr, 3);
  /* a raw Create bypasses the client: R on ps/1, a part of R on ps/0.
   * Merge then names the duplicate key, and removing the part mends it. */
  ps_var_spec r = {.name = "R", .dtype = PS_DT_FLOAT, .shape = shp1(4), .init = &z};
  PS_ASSERT_OK(ps_client_create_vars(C, 1, &r, 1, &st), st);
  Paramserver__Initializer in = PARAMSERVER__INITIALIZER__INIT;
  in.type = "zeros";
  in.full_name = "R";
  int64_t full[1] = {4}, part[1] = {2};
  in.full_shape = full;
  in.n_full_shape = 1;
  Paramserver__VariableSpec vs = PARAMSERVER__VARIABLE_SPEC__INIT;
  vs.name = "R/part_0";
  vs.dtype = PS_DT_FLOAT;
  vs.shape = part;
  vs.n_shape = 1;
  vs.initializer = &in;
  Paramserver__VariableSpec *vp[1] = {&vs};
  Paramserver__CreateRequest cr = PARAMSERVER__CREATE_REQUEST__INIT;
  cr.vars = vp;
  cr.n_vars = 1;
  uint8_t *b = pack_msg(&cr.base, &n);
  st = raw_call("/paramserver.Ps/Create", b, n, NULL, true, 10000);
  free(b);
  PS_ASSERT_OK(st.code, st);
  for (int t = 0; t < 2; t++)
    PS_ASSERT_OK(ps_client_initialize(C, t, NULL, 0, true, NULL, &st), st);
  PS_ASSERT_STATUS(ps_client_save(C, "dup", NULL, NULL, NULL, &st), st,
                   PS_INVALID_ARGUMENT,
                   "Duplicate tensor keyed by R encountered, when merging prefix: ");
  PS_ASSERT_MSG_HAS(st, "dup_temp/part-0000");
  const char *rp[1] = {"R/part_0"};
  PS_ASSERT_OK(ps_client_delete(C, 0, rp, 1, 0, NULL, &st), st);
  PS_ASSERT_OK(ps_client_save(C, "dup", NULL, NULL, NULL, &st), st);
  /* a task that is down is not checked, and creating goes on */
  harness_kill(&H, 1);
  ps_var_spec u = {.name = "u", .dtype = PS_DT_FLOAT, .shape = shp1(1), .init = &z};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &u, 1, &st), st);
}
END_TEST

START_TEST(save_works_after_refused_conflicts_and_deletes) {
  ps_status st;
  PS_ASSERT_OK(create_part("P/part_0", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st),
               st);
  PS_ASSERT_OK(create_part("P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_FLOAT, &st),
               st);
  ps_init_spec one;
  ps_init_spec_default(&one, PS_INIT_ONES);
  ps_var_spec plain = {
      .name = "P", .dtype = PS_DT_FLOAT, .shape = shp2(4, 2), .init = &one};
  PS_ASSERT_CODE(ps_client_create_vars(C, 0, &plain, 1, &st), st, PS_ALREADY_EXISTS);
  PS_ASSERT_CODE(
      create_part("P/part_2", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st), st,
      PS_INVALID_ARGUMENT);
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, NULL, &st), st);
  ps_save_options so = {0};
  char *written = NULL;
  PS_ASSERT_OK(ps_client_save(C, "one", &so, &written, NULL, &st), st);
  free(written);
  /* P as parts is gone; a plain P of ones replaces it and saves too */
  const char *p[1] = {"P"};
  PS_ASSERT_OK(ps_client_delete(C, 0, p, 1, PS_DELETE_SLOTS, NULL, &st), st);
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &plain, 1, &st), st);
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, true, NULL, &st), st);
  PS_ASSERT_OK(ps_client_save(C, "two", &so, &written, NULL, &st), st);
  free(written);
  /* the first checkpoint's P (zeros, from the parts) restores into it */
  size_t n = 0;
  PS_ASSERT_OK(ps_client_restore(C, "one", &n, &st), st);
  ck_assert_uint_eq(n, 1);
  ps_tensor *r = read1("P", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert(((float *)ps_tensor_data(r))[7] == 0);
  ps_tensor_destroy(r);
}
END_TEST

/* Adds this file's tests to the suite's test cases. */
void hardening_save_tests(TCase *t2s, TCase *ts) {
  tcase_add_test(ts, save_works_after_refused_conflicts_and_deletes);
  tcase_add_test(t2s, key_space_conflicts_across_tasks_are_refused);
}
