/* The coordinator through real ps processes: dependency-ordered
 * initialization across ps, never re-initializing what a ps holds, restore
 * of only what is missing, and a non-chief that waits for the chief. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "paramserver/coordinator.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

typedef struct model {
  ps_graph *g;
  ps_variable *w, *w2;
} model;

/* w (constant 3) on ps/0; w2 = w.initialized_value() * 2 on ps/1. */
static void build(model *m, const ps_cluster *cl) {
  ps_status st;
  m->g = ps_graph_create();
  ps_device_push_fn(m->g, ps_replica_device_setter(cl, NULL));
  ps_init_spec c3;
  ps_init_spec_default(&c3, PS_INIT_CONSTANT);
  c3.value = 3;
  m->w = ps_get_variable(m->g, "w", PS_DT_FLOAT, &(ps_shape){1, {4}}, &c3, NULL, &st);
  ck_assert_ptr_nonnull(m->w);
  m->w2 = ps_variable_create(
      m->g, ps_mul(ps_initialized_value(m->w), ps_scalar(m->g, PS_DT_FLOAT, 2.0)), "w2",
      NULL);
  ck_assert_ptr_nonnull(m->w2);
  ck_assert_int_eq(ps_variable_task(m->w), 0);
  ck_assert_int_eq(ps_variable_task(m->w2), 1);
}

static void values(ps_session *s, model *m, float *w, float *w2) {
  ps_node *f[2] = {ps_variable_value(m->w), ps_variable_value(m->w2)};
  ps_tensor *out[2];
  ps_status st;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, f, 2, NULL, 0, out, &st), st);
  memcpy(w, ps_tensor_data(out[0]), 16);
  memcpy(w2, ps_tensor_data(out[1]), 16);
  ps_tensor_destroy(out[0]);
  ps_tensor_destroy(out[1]);
}

START_TEST(initializes_in_dependency_order_across_ps) {
  ps_harness h;
  ps_client *c = harness_start_client(&h, 2, NULL);
  ck_assert_ptr_nonnull(c);
  model m;
  build(&m, h.cluster);
  ps_status st;
  ps_session *s = ps_session_create(m.g, c, &st);
  ps_coordinator_options o = {.is_chief = true};
  ps_coordinator_outcome out;
  PS_ASSERT_OK(ps_coordinator_prepare(s, &o, &out, &st), st);
  ck_assert_int_eq(out, PS_COORD_INITIALIZED);
  float w[4], w2[4];
  values(s, &m, w, w2);
  for (int i = 0; i < 4; i++) {
    ck_assert_float_eq(w[i], 3.0f);
    ck_assert_float_eq(w2[i], 6.0f);
  }
  /* a restarted chief finds a live cluster: nothing re-initialized */
  ps_tensor *v = ps_tensor_new(PS_DT_FLOAT, 1, (int64_t[]){4});
  for (int i = 0; i < 4; i++)
    ((float *)ps_tensor_data(v))[i] = 10.0f + (float)i;
  ps_update u = {.name = "w", .op = PS_ASSIGN, .value = v};
  PS_ASSERT_OK(ps_client_update(c, 0, &u, 1, &st), st);
  ps_session_destroy(s);
  s = ps_session_create(m.g, c, &st);
  PS_ASSERT_OK(ps_coordinator_prepare(s, &o, &out, &st), st);
  ck_assert_int_eq(out, PS_COORD_LIVE);
  values(s, &m, w, w2);
  for (int i = 0; i < 4; i++) {
    ck_assert_float_eq(w[i], 10.0f + (float)i);
    ck_assert_float_eq(w2[i], 6.0f);
  }
  ps_tensor_destroy(v);
  ps_session_destroy(s);
  ps_graph_destroy(m.g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* w already holds a value on a live ps/0, w2 lost (a fresh ps/1): only w2
 * is initialized, from the live w, and w's initializer does not run. */
START_TEST(initializes_only_what_is_missing) {
  ps_harness h;
  ps_client *c = harness_start_client(&h, 2, NULL);
  ck_assert_ptr_nonnull(c);
  model m;
  build(&m, h.cluster);
  ps_status st;
  ps_session *s = ps_session_create(m.g, c, &st);
  PS_ASSERT_OK(ps_session_create_variables(s, &st), st);
  ps_tensor *v = ps_tensor_new(PS_DT_FLOAT, 1, (int64_t[]){4});
  for (int i = 0; i < 4; i++)
    ((float *)ps_tensor_data(v))[i] = 5.0f;
  ps_update u = {.name = "w", .op = PS_ASSIGN, .value = v};
  PS_ASSERT_OK(ps_client_update(c, 0, &u, 1, &st), st);
  ps_coordinator_options o = {.is_chief = true, .no_restore = true};
  ps_coordinator_outcome out;
  PS_ASSERT_OK(ps_coordinator_prepare(s, &o, &out, &st), st);
  ck_assert_int_eq(out, PS_COORD_INITIALIZED);
  float w[4], w2[4];
  values(s, &m, w, w2);
  for (int i = 0; i < 4; i++) {
    ck_assert_float_eq(w[i], 5.0f);   /* not re-initialized to 3 */
    ck_assert_float_eq(w2[i], 10.0f); /* from the live w */
  }
  ps_tensor_destroy(v);
  ps_session_destroy(s);
  ps_graph_destroy(m.g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

typedef struct waiter {
  ps_session *s;
  int rc;
  ps_coordinator_outcome out;
  ps_status st;
} waiter;

static void *wait_thread(void *arg) {
  waiter *w = arg;
  ps_coordinator_options o = {.is_chief = false, .ready_timeout_secs = 60};
  w->rc = ps_coordinator_prepare(w->s, &o, &w->out, &w->st);
  return NULL;
}

/* A non-chief started first waits until the chief has initialized. */
START_TEST(non_chief_waits_for_the_chief) {
  ps_harness h;
  ps_client *c = harness_start_client(&h, 2, NULL);
  ck_assert_ptr_nonnull(c);
  ps_status st;
  model m1, m2;
  build(&m1, h.cluster);
  build(&m2, h.cluster);
  waiter wt = {.s = ps_session_create(m2.g, c, &st)};
  pthread_t th;
  pthread_create(&th, NULL, wait_thread, &wt);
  usleep(300 * 1000); /* the waiter is polling; nothing is there yet */
  ps_session *chief = ps_session_create(m1.g, c, &st);
  ps_coordinator_options o = {.is_chief = true};
  PS_ASSERT_OK(ps_coordinator_prepare(chief, &o, NULL, &st), st);
  pthread_join(th, NULL);
  PS_ASSERT_OK(wt.rc, wt.st);
  ck_assert_int_eq(wt.out, PS_COORD_JOINED);
  float w[4], w2[4];
  values(wt.s, &m2, w, w2);
  ck_assert_float_eq(w2[0], 6.0f);
  /* a short ready timeout on a cluster without a chief is an error saying why */
  ps_session_destroy(wt.s);
  ps_session_destroy(chief);
  ps_graph_destroy(m1.g);
  ps_graph_destroy(m2.g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
  c = harness_start_client(&h, 2, NULL);
  model m3;
  build(&m3, h.cluster);
  ps_session *s3 = ps_session_create(m3.g, c, &st);
  ps_coordinator_options o3 = {.is_chief = false, .ready_timeout_secs = 0.5};
  ck_assert_int_ne(ps_coordinator_prepare(s3, &o3, NULL, &st), 0);
  PS_ASSERT_STATUS(st.code, st, PS_DEADLINE_EXCEEDED,
                   "the chief has not marked the cluster ready");
  ps_session_destroy(s3);
  ps_graph_destroy(m3.g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* A non-chief waiting for readiness ends when the chief marks the job
 * done (the chief is about to shut the ps down): OUT_OF_RANGE with
 * PS_COORDINATOR_DONE_MSG, which ps_coordinator_job_done recognizes. */
START_TEST(non_chief_ends_when_the_job_is_done) {
  ps_harness h;
  ps_client *c = harness_start_client(&h, 2, NULL);
  ck_assert_ptr_nonnull(c);
  ps_status st;
  model m;
  build(&m, h.cluster);
  waiter wt = {.s = ps_session_create(m.g, c, &st)};
  pthread_t th;
  pthread_create(&th, NULL, wait_thread, &wt);
  usleep(300 * 1000); /* the waiter is polling; no ready mark */
  PS_ASSERT_OK(ps_coordinator_mark_done(c, &st), st);
  pthread_join(th, NULL);
  PS_ASSERT_CODE(wt.rc, wt.st, PS_OUT_OF_RANGE);
  ck_assert_str_eq(wt.st.msg, "the chief has marked the job done: nothing left to train");
  ck_assert(ps_coordinator_job_done(&wt.st));
  ps_status other = {.code = PS_OUT_OF_RANGE};
  snprintf(other.msg, sizeof other.msg, "end of sequence");
  ck_assert(!ps_coordinator_job_done(&other));
  ps_session_destroy(wt.s);
  ps_graph_destroy(m.g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* Heartbeats on ps/0: none before a worker joins, a count that moves
 * while it runs, DONE when it is done, 0 again when cleared; the API's
 * errors name the task. */
START_TEST(heartbeats_tell_joined_from_done) {
  ps_harness h;
  ps_client *c = harness_start_client(&h, 1, NULL);
  ck_assert_ptr_nonnull(c);
  ps_status st;
  int64_t v = 7;
  PS_ASSERT_OK(ps_coordinator_heartbeat_read(c, "worker/1", &v, &st), st);
  ck_assert_int_eq(v, 0); /* never joined: no variable */
  PS_ASSERT_OK(ps_coordinator_heartbeat_clear(c, "worker/1", &st), st); /* none: ok */
  ps_coordinator_heartbeat *hb = ps_coordinator_heartbeat_start(c, "worker/1", &st);
  ck_assert_msg(hb != NULL, "%s", st.msg);
  PS_ASSERT_OK(ps_coordinator_heartbeat_read(c, "worker/1", &v, &st), st);
  ck_assert_int_ge(v, 1); /* the first beat is in before start returns */
  int64_t first = v;
  for (int i = 0; i < 100 && v == first; i++) { /* beats once a second */
    usleep(50 * 1000);
    PS_ASSERT_OK(ps_coordinator_heartbeat_read(c, "worker/1", &v, &st), st);
  }
  ck_assert_int_gt(v, first);
  PS_ASSERT_OK(ps_coordinator_heartbeat_stop(hb, true, &st), st);
  PS_ASSERT_OK(ps_coordinator_heartbeat_read(c, "worker/1", &v, &st), st);
  ck_assert_int_eq(v, PS_COORDINATOR_HEARTBEAT_DONE);
  { /* several in one call; one without a heartbeat reads 0 */
    const char *tasks[2] = {"worker/1", "worker/2"};
    int64_t vals[2] = {7, 7};
    PS_ASSERT_OK(ps_coordinator_heartbeat_read_many(c, tasks, 2, vals, &st), st);
    ck_assert_int_eq(vals[0], PS_COORDINATOR_HEARTBEAT_DONE);
    ck_assert_int_eq(vals[1], 0);
    PS_ASSERT_OK(ps_coordinator_heartbeat_read_many(c, tasks, 1, vals, &st), st);
    ck_assert_int_eq(vals[0], PS_COORDINATOR_HEARTBEAT_DONE);
  }
  /* a later life of the worker reads as a change, never as DONE */
  hb = ps_coordinator_heartbeat_start(c, "worker/1", &st);
  ck_assert_ptr_nonnull(hb);
  PS_ASSERT_OK(ps_coordinator_heartbeat_read(c, "worker/1", &v, &st), st);
  ck_assert_int_eq(v, 1);
  PS_ASSERT_OK(ps_coordinator_heartbeat_stop(hb, false, &st), st);
  PS_ASSERT_OK(ps_coordinator_heartbeat_clear(c, "worker/1", &st), st);
  PS_ASSERT_OK(ps_coordinator_heartbeat_read(c, "worker/1", &v, &st), st);
  ck_assert_int_eq(v, 0);
  PS_ASSERT_OK(ps_coordinator_heartbeat_stop(NULL, true, &st), st);
  char longname[300];
  memset(longname, 'w', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  ck_assert_ptr_null(ps_coordinator_heartbeat_start(c, longname, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT, "is too long for a heartbeat");
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("coordinator");
  TCase *tc = tcase_create("coordinator");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, initializes_in_dependency_order_across_ps);
  tcase_add_test(tc, initializes_only_what_is_missing);
  tcase_add_test(tc, non_chief_waits_for_the_chief);
  tcase_add_test(tc, heartbeats_tell_joined_from_done);
  tcase_add_test(tc, non_chief_ends_when_the_job_is_done);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
