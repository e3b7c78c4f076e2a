/* The limits set by ps-server's flags (part of the integration_hardening
 * test): every request list, parked updates and snapshot holds are bounded,
 * and a refusal names the limit and its flag. */
#include "test_hardening_internal.h"

/* ---- limits set by flags ---- */

void limits_setup(void) {
  static const char *const extra[] = {"--max-tensor-bytes",
                                      "65536",
                                      "--max-read-names",
                                      "4",
                                      "--max-gather-rows",
                                      "8",
                                      NULL};
  start(extra);
  create("w", PS_DT_FLOAT, shp2(2, 3), NULL);
  float v[6] = {0, 1, 2, 3, 4, 5};
  assign_f("w", shp2(2, 3), v);
}

START_TEST(limits_from_flags) {
  ps_status st;
  /* a variable of 65540 bytes */
  ps_var_spec v = {.name = "big", .dtype = PS_DT_FLOAT, .shape = shp1(16385)};
  PS_ASSERT_STATUS(
      ps_client_create_vars(C, 0, &v, 1, &st), st, PS_RESOURCE_EXHAUSTED,
      "Create big: float of shape [16385] is 65540 bytes, above the limit of "
      "65536 bytes (--max-tensor-bytes)");
  ck_assert(!exists("big"));
  /* 5 names */
  ps_read r[5] = {
      {.name = "w"}, {.name = "w"}, {.name = "w"}, {.name = "w"}, {.name = "w"}};
  PS_ASSERT_STATUS(ps_client_read(C, 0, r, 5, &st), st, PS_RESOURCE_EXHAUSTED,
                   "Read: 5 items, above the limit of 4 per call (--max-read-names)");
  PS_ASSERT_OK(ps_client_read(C, 0, r, 4, &st), st);
  for (int i = 0; i < 4; i++)
    ps_tensor_destroy(r[i].out);
  /* 9 rows */
  ps_shape s9 = shp1(9);
  ps_tensor *idx = ps_tensor_create(PS_DT_INT64, &s9, true);
  ps_read g = {.name = "w", .indices = idx};
  PS_ASSERT_STATUS(
      ps_client_read(C, 0, &g, 1, &st), st, PS_RESOURCE_EXHAUSTED,
      "Gather w: 9 rows, above the limit of 8 per gather (--max-gather-rows)");
  ps_tensor_destroy(idx);
  /* 8 rows of 16 KiB: a 128 KiB response */
  create("wide", PS_DT_FLOAT, shp2(4, 4096), NULL);
  assign_f("wide", shp2(4, 4096), NULL);
  ps_shape s8 = shp1(8);
  idx = ps_tensor_create(PS_DT_INT64, &s8, true);
  ps_read g8 = {.name = "wide", .indices = idx};
  PS_ASSERT_STATUS(
      ps_client_read(C, 0, &g8, 1, &st), st, PS_RESOURCE_EXHAUSTED,
      "Gather wide: float of shape [8,4096] is 131072 bytes, above the limit "
      "of 65536 bytes (--max-tensor-bytes)");
  ps_tensor_destroy(idx);
  /* two values of 40000 bytes: each fits, together they do not */
  create("a", PS_DT_FLOAT, shp1(10000), NULL);
  create("b", PS_DT_FLOAT, shp1(10000), NULL);
  ps_shape s1 = shp1(10000);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s1, true);
  ps_update u2[2] = {{.name = "a", .op = PS_ASSIGN, .value = t},
                     {.name = "b", .op = PS_ASSIGN, .value = t}};
  PS_ASSERT_STATUS(ps_client_update(C, 0, u2, 2, &st), st, PS_RESOURCE_EXHAUSTED,
                   "Update: the tensors of the request total more than the limit of "
                   "65536 bytes (--max-tensor-bytes)");
  PS_ASSERT_OK(ps_client_update(C, 0, u2, 1, &st), st);
  ps_tensor_destroy(t);
  const char *ab[2] = {"a", "b"};
  bool init[2];
  PS_ASSERT_OK(ps_client_is_initialized(C, 0, ab, 2, init, &st), st);
  ck_assert(init[0] && !init[1]);
  assert_w_unchanged();
}
END_TEST

typedef struct parked_call {
  ps_client *c;
  const char *name;
  int rc;
  ps_status st;
} parked_call;

static void *parked_main(void *arg) {
  parked_call *pc = arg;
  ps_shape s = shp1(16000); /* 64000 bytes */
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  ps_update u = {.name = pc->name, .op = PS_ASSIGN_ADD, .value = t};
  pc->rc = ps_client_update(pc->c, 0, &u, 1, &pc->st);
  ps_tensor_destroy(t);
  return NULL;
}

/* Every request's list is bounded by --max-read-names before it is
 * unpacked (a 32 MiB header could hold millions of items). */
START_TEST(every_request_list_is_bounded) {
  char *names[5] = {"a", "b", "c", "d", "e"};
  Paramserver__NamesRequest nr = PARAMSERVER__NAMES_REQUEST__INIT;
  nr.names = names;
  nr.n_names = 5;
  ps_status st = raw_msg("/paramserver.Ps/IsInitialized", &nr.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "IsInitialized: 5 items, above the limit of 4 per call "
                   "(--max-read-names)");
  Paramserver__DeleteRequest dr = PARAMSERVER__DELETE_REQUEST__INIT;
  dr.names = names;
  dr.n_names = 5;
  st = raw_msg("/paramserver.Ps/Delete", &dr.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "Delete: 5 items, above the limit of 4");
  Paramserver__VariableSpec vs[5];
  Paramserver__VariableSpec *vp[5];
  int64_t dim = 1;
  for (int i = 0; i < 5; i++) {
    paramserver__variable_spec__init(&vs[i]);
    vs[i].name = names[i];
    vs[i].dtype = PS_DT_FLOAT;
    vs[i].shape = &dim;
    vs[i].n_shape = 1;
    vp[i] = &vs[i];
  }
  Paramserver__CreateRequest cr = PARAMSERVER__CREATE_REQUEST__INIT;
  cr.vars = vp;
  cr.n_vars = 5;
  st = raw_msg("/paramserver.Ps/Create", &cr.base, true);
  PS_ASSERT_STATUS(st.code, st, PS_RESOURCE_EXHAUSTED,
                   "Create: 5 items, above the limit of 4 per call");
  /* nothing was created; four are fine */
  ck_assert(!exists("a"));
  cr.n_vars = 4;
  st = raw_msg("/paramserver.Ps/Create", &cr.base, true);
  PS_ASSERT_OK(st.code, st);
  ck_assert(exists("a"));
}
END_TEST

START_TEST(parked_updates_are_bounded) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create("a", PS_DT_FLOAT, shp1(16000), &z);
  create("b", PS_DT_FLOAT, shp1(16000), &z);
  ps_status st;
  PS_ASSERT_OK(ps_client_initialize(C, 0, NULL, 0, false, NULL, &st), st);
  PS_ASSERT_OK((st = raw_snapshot(9, 60000)).code, st);
  ps_client_options o;
  ps_client_options_default(&o);
  o.data_timeout_ms = 1500;
  parked_call pc[2] = {{.name = "a"}, {.name = "b"}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    pc[i].c = ps_client_create(H.cluster, "ps", &o, &st);
    pthread_create(&th[i], NULL, parked_main, &pc[i]);
  }
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  /* one parked (then missed its deadline), one refused: 128000 bytes > 65536 */
  int refused = pc[0].rc == PS_RESOURCE_EXHAUSTED ? 0 : 1;
  PS_ASSERT_STATUS(pc[refused].rc, pc[refused].st, PS_RESOURCE_EXHAUSTED,
                   "ps/0: updates waiting for snapshot 9 to end hold "
                   "64000 bytes; this one (64000 bytes) would pass the "
                   "limit of 65536 bytes (--max-tensor-bytes)");
  ck_assert_int_eq(pc[1 - refused].rc, PS_DEADLINE_EXCEEDED);
  past_server_deadline();
  PS_ASSERT_OK((st = raw_release(9)).code, st);
  for (int i = 0; i < 2; i++) {
    ps_client_destroy(pc[i].c);
    ps_tensor *r = read1(pc[i].name, &st);
    ck_assert_ptr_nonnull(r);
    ck_assert(((float *)ps_tensor_data(r))[0] == 0); /* neither applied */
    ps_tensor_destroy(r);
  }
}
END_TEST

void hold_setup(void) {
  static const char *const extra[] = {"--max-hold-ms", "300", NULL};
  start(extra);
  create("w", PS_DT_FLOAT, shp2(2, 3), NULL);
  float v[6] = {0, 1, 2, 3, 4, 5};
  assign_f("w", shp2(2, 3), v);
}

START_TEST(hold_is_capped_by_max_hold_ms) {
  ps_status st = raw_snapshot(11, 1000000000000LL);
  PS_ASSERT_OK(st.code, st);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  float one[6] = {1, 1, 1, 1, 1, 1};
  ps_shape s = shp2(2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  memcpy(ps_tensor_data(t), one, sizeof one);
  ps_update u = {.name = "w", .op = PS_ASSIGN_ADD, .value = t};
  /* parks, and runs when the gate reopens after 300 ms, not 10^12 */
  PS_ASSERT_OK(ps_client_update(C, 0, &u, 1, &st), st);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
  ck_assert_msg(secs < 20, "the update waited %.1f s", secs);
  ps_tensor_destroy(t);
  ps_tensor *r = read1("w", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert(((float *)ps_tensor_data(r))[5] == 6);
  ps_tensor_destroy(r);
}
END_TEST

/* Adds this file's tests to the suite's test cases. */
void hardening_limits_tests(TCase *tl, TCase *th) {
  tcase_add_test(tl, limits_from_flags);
  tcase_add_test(tl, parked_updates_are_bounded);
  tcase_add_test(tl, every_request_list_is_bounded);
  tcase_add_test(th, hold_is_capped_by_max_hold_ms);
}
