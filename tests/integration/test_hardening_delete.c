/* Delete through a real ps-server (part of the integration_hardening
 * test): variables and their slots, the parts of a partitioned variable,
 * while other calls use it, with synchronous updates waiting, and psctl rm
 * on one and on every ps task. */
#include "test_hardening_internal.h"

/* ---- Delete ---- */

START_TEST(delete_removes_variables_and_their_slots) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create("w/Momentum", PS_DT_FLOAT, shp2(2, 3), &z);
  create("w/Adam_1", PS_DT_FLOAT, shp2(2, 3), &z);
  create("w/dense/kernel", PS_DT_FLOAT, shp1(1), &z);
  create("u", PS_DT_FLOAT, shp1(1), &z);
  ps_status st;
  /* a name that matches nothing: NOT_FOUND, nothing deleted */
  const char *bad[2] = {"w", "nosuch"};
  PS_ASSERT_STATUS(ps_client_delete(C, 0, bad, 2, PS_DELETE_SLOTS, NULL, &st), st,
                   PS_NOT_FOUND, "variable nosuch does not exist on ps/0");
  assert_w_unchanged();
  /* control characters are refused before anything is looked up */
  Paramserver__DeleteRequest dr = PARAMSERVER__DELETE_REQUEST__INIT;
  char *nm[1] = {"wXu"};
  dr.names = nm;
  dr.n_names = 1;
  size_t n;
  uint8_t *b = pack_msg(&dr.base, &n);
  patch(b, n, "wXu", "w\nu", 3);
  st = raw_call("/paramserver.Ps/Delete", b, n, NULL, true, 10000);
  free(b);
  PS_ASSERT_STATUS(
      st.code, st, PS_INVALID_ARGUMENT,
      "Delete: DeleteRequest.names \"w\\x0au\" contains a control character");
  PS_ASSERT_STATUS(ps_client_delete(C, 0, NULL, 0, 0, NULL, &st), st, PS_INVALID_ARGUMENT,
                   "Delete: no variable names given");
  ps_task_status ts;
  PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
  ck_assert_int_eq(ts.num_vars, 5);
  ck_assert_int_eq(ts.bytes, 24); /* w; the others are not initialized */
  ps_delete_result res;
  const char *w[1] = {"w"};
  PS_ASSERT_OK(ps_client_delete(C, 0, w, 1, PS_DELETE_SLOTS, &res, &st), st);
  ck_assert_uint_eq(res.ndeleted, 3);
  ck_assert_str_eq(res.deleted[0], "w");
  ck_assert_str_eq(res.deleted[1], "w/Adam_1");
  ck_assert_str_eq(res.deleted[2], "w/Momentum");
  ps_delete_result_free(&res);
  ck_assert(!exists("w"));
  ck_assert(!exists("w/Momentum"));
  ck_assert(exists("w/dense/kernel")); /* not a slot: two more path parts */
  ck_assert(exists("u"));
  ck_assert_ptr_null(read1("w", &st));
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, "variable w does not exist on ps/0");
  ps_var_info *vi;
  PS_ASSERT_OK(ps_client_list(C, 0, &vi, &n, &st), st);
  ck_assert_uint_eq(n, 2);
  ps_client_free_var_info(vi, n);
  PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
  ck_assert_int_eq(ts.num_vars, 2);
  ck_assert_int_eq(ts.bytes, 0); /* w's value was freed */
  /* missing_ok reports what matched nothing */
  const char *two[2] = {"u", "w"};
  PS_ASSERT_OK(ps_client_delete(C, 0, two, 2, PS_DELETE_MISSING_OK, &res, &st), st);
  ck_assert_uint_eq(res.ndeleted, 1);
  ck_assert_uint_eq(res.nmissing, 1);
  ck_assert_str_eq(res.missing[0], "w");
  ps_delete_result_free(&res);
  /* a deleted name can be created again, with another shape */
  create("w", PS_DT_DOUBLE, shp1(4), &z);
  PS_ASSERT_OK(ps_client_initialize(C, 0, w, 1, false, NULL, &st), st);
  ps_tensor *r = read1("w", &st);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->dtype, PS_DT_DOUBLE);
  ps_tensor_destroy(r);
}
END_TEST

START_TEST(delete_removes_the_parts_of_a_partitioned_variable) {
  ps_status st;
  PS_ASSERT_OK(create_part("P/part_0", "P", shp2(2, 2), shp2(4, 2), 0, PS_DT_FLOAT, &st),
               st);
  PS_ASSERT_OK(create_part("P/part_1", "P", shp2(2, 2), shp2(4, 2), 4, PS_DT_FLOAT, &st),
               st);
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create("P/part_0/Momentum", PS_DT_FLOAT, shp2(2, 2), &z);
  ps_delete_result res;
  const char *p[1] = {"P"};
  PS_ASSERT_OK(ps_client_delete(C, 0, p, 1, PS_DELETE_SLOTS, &res, &st), st);
  ck_assert_uint_eq(res.ndeleted, 3);
  ck_assert_str_eq(res.deleted[0], "P/part_0");
  ck_assert_str_eq(res.deleted[1], "P/part_0/Momentum");
  ck_assert_str_eq(res.deleted[2], "P/part_1");
  ps_delete_result_free(&res);
  /* now a plain P is fine */
  create("P", PS_DT_FLOAT, shp2(4, 2), &z);
  assert_w_unchanged();
}
END_TEST

typedef struct churn {
  ps_client *c;
  pthread_mutex_t mu;
  int errors_other; /* codes other than 0 and NOT_FOUND (under mu) */
  char last[PS_STATUS_MSG_MAX];
  atomic_int stop;
} churn;

static void *churn_main(void *arg) {
  churn *ch = arg;
  ps_shape s = shp2(2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  while (!atomic_load(&ch->stop)) {
    ps_status st;
    ps_update u = {.name = "w", .op = PS_ASSIGN_ADD, .value = t};
    int rc = ps_client_update(ch->c, 0, &u, 1, &st);
    ps_read r = {.name = "w"};
    int rc2 = ps_client_read(ch->c, 0, &r, 1, &st);
    ps_tensor_destroy(r.out);
    if ((rc && rc != PS_NOT_FOUND && rc != PS_FAILED_PRECONDITION) ||
        (rc2 && rc2 != PS_NOT_FOUND && rc2 != PS_FAILED_PRECONDITION)) {
      pthread_mutex_lock(&ch->mu);
      ch->errors_other++;
      snprintf(ch->last, sizeof ch->last, "%s", st.msg);
      pthread_mutex_unlock(&ch->mu);
    }
  }
  ps_tensor_destroy(t);
  return NULL;
}

START_TEST(delete_is_safe_while_other_calls_use_the_variable) {
  ps_status st;
  churn ch = {.mu = PTHREAD_MUTEX_INITIALIZER};
  ch.c = ps_client_create(H.cluster, "ps", NULL, &st);
  ck_assert_ptr_nonnull(ch.c);
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    pthread_create(&th[i], NULL, churn_main, &ch);
  const char *w[1] = {"w"};
  for (int k = 0; k < 40; k++) {
    PS_ASSERT_OK(ps_client_delete(C, 0, w, 1, 0, NULL, &st), st);
    create("w", PS_DT_FLOAT, shp2(2, 3), NULL);
    assign_f("w", shp2(2, 3), NULL);
  }
  atomic_store(&ch.stop, 1);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  ps_client_destroy(ch.c);
  ck_assert_msg(ch.errors_other == 0, "%d unexpected errors, last: %s", ch.errors_other,
                ch.last);
  PS_ASSERT_OK(ps_client_status(C, 0, &(ps_task_status){0}, &st), st);
}
END_TEST

typedef struct sync_call {
  ps_client *c;
  int rc;
  ps_status st;
} sync_call;

static void *sync_main(void *arg) {
  sync_call *sc = arg;
  ps_shape s = shp2(2, 3);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, true);
  ps_update u = {
      .name = "w", .op = PS_ASSIGN_ADD, .value = t, .replicas_to_aggregate = 2};
  sc->rc = ps_client_update(sc->c, 0, &u, 1, &sc->st);
  ps_tensor_destroy(t);
  return NULL;
}

START_TEST(delete_fails_waiting_synchronous_updates) {
  sync_call sc = {0};
  ps_status st;
  sc.c = ps_client_create(H.cluster, "ps", NULL, &st);
  pthread_t th;
  pthread_create(&th, NULL, sync_main, &sc);
  /* wait until the update waits in w's accumulator: the value stays the
   * same, so poll the ps's call counter instead (bounded) */
  ps_task_status ts0, ts;
  PS_ASSERT_OK(ps_client_status(C, 0, &ts0, &st), st);
  for (int i = 0; i < 500; i++) {
    PS_ASSERT_OK(ps_client_status(C, 0, &ts, &st), st);
    if (ts.rpcs >= ts0.rpcs + 2) break; /* this Status and the Update */
    struct timespec d = {0, 10000000};
    nanosleep(&d, NULL);
  }
  const char *w[1] = {"w"};
  PS_ASSERT_OK(ps_client_delete(C, 0, w, 1, 0, NULL, &st), st);
  pthread_join(th, NULL);
  PS_ASSERT_CODE(sc.rc, sc.st, PS_NOT_FOUND);
  ck_assert(strstr(sc.st.msg, "variable w does not exist on ps/0") ||
            strstr(sc.st.msg, "variable w was deleted on ps/0: synchronous step"));
  ps_client_destroy(sc.c);
}
END_TEST

START_TEST(psctl_rm) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  create("w/Momentum", PS_DT_FLOAT, shp2(2, 3), &z);
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s rm w", harness_prog("PSCTL", "psctl"),
           H.spec);
  ck_assert_int_eq(harness_run(cmd, &out), 0);
  ck_assert_msg(strstr(out, "deleted w on ps/0\ndeleted w/Momentum on ps/0\n"), "%s",
                out);
  free(out);
  ck_assert(!exists("w"));
  snprintf(cmd, sizeof cmd, "%s --cluster %s rm nosuch", harness_prog("PSCTL", "psctl"),
           H.spec);
  ck_assert_int_eq(harness_run(cmd, &out), 1);
  ck_assert_msg(strstr(out, "psctl: rm: variable nosuch not found on any ps task"), "%s",
                out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s --cluster %s rm", harness_prog("PSCTL", "psctl"), H.spec);
  ck_assert_int_eq(harness_run(cmd, &out), 2);
  ck_assert_msg(strstr(out, "psctl: rm needs at least one variable name"), "%s", out);
  free(out);
}
END_TEST

void two_ps_setup(void) {
  C = harness_start_client(&H, 2, NULL);
  ck_assert_ptr_nonnull(C);
}

START_TEST(psctl_rm_on_every_ps_task) {
  ps_status st;
  ps_var_spec a = {.name = "a", .dtype = PS_DT_FLOAT, .shape = shp1(1)};
  ps_var_spec b = {.name = "b", .dtype = PS_DT_FLOAT, .shape = shp1(1)};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, &a, 1, &st), st);
  PS_ASSERT_OK(ps_client_create_vars(C, 1, &b, 1, &st), st);
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s rm a b", harness_prog("PSCTL", "psctl"),
           H.spec);
  ck_assert_int_eq(harness_run(cmd, &out), 0);
  ck_assert_msg(strstr(out, "deleted a on ps/0\n") && strstr(out, "deleted b on ps/1\n"),
                "%s", out);
  free(out);
  ps_var_info *vi;
  size_t n;
  for (int t = 0; t < 2; t++) {
    PS_ASSERT_OK(ps_client_list(C, t, &vi, &n, &st), st);
    ck_assert_uint_eq(n, 0);
    ps_client_free_var_info(vi, n);
  }
  ck_assert_int_eq(harness_run(cmd, &out), 1);
  ck_assert_msg(strstr(out, "psctl: rm: variable a not found on any ps task") &&
                    strstr(out, "psctl: rm: variable b not found on any ps task"),
                "%s", out);
  free(out);
}
END_TEST

/* Adds this file's tests to the suite's test cases. */
void hardening_delete_tests(TCase *tc, TCase *t2) {
  tcase_add_test(tc, delete_removes_variables_and_their_slots);
  tcase_add_test(tc, delete_removes_the_parts_of_a_partitioned_variable);
  tcase_add_test(tc, delete_is_safe_while_other_calls_use_the_variable);
  tcase_add_test(tc, delete_fails_waiting_synchronous_updates);
  tcase_add_test(tc, psctl_rm);
  tcase_add_test(t2, psctl_rm_on_every_ps_task);
}
