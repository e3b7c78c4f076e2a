/* Worker graphs through real ps processes: variables, scopes, collections,
 * placement, initialization order and sessions. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/partition.h"
#include "paramserver/saver.h"
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

static ps_shape shp(int rank, int64_t a, int64_t b) {
  ps_shape s = {.rank = rank, .dim = {a, b}};
  return s;
}

START_TEST(round_robin_placement_in_creation_order) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_shape s = shp(1, 3, 0);
  ps_variable *a = ps_get_variable(g, "a", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ps_variable *b = ps_get_variable(g, "b", PS_DT_FLOAT, &s, NULL, NULL, &st);
  /* an explicit task wins but still takes its turn */
  PS_ASSERT_OK(ps_device_push(g, "/job:ps/task:0", &st), st);
  ps_variable *c = ps_get_variable(g, "c", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ps_device_pop(g);
  ps_variable *d = ps_get_variable(g, "d", PS_DT_FLOAT, &s, NULL, NULL, &st);
  PS_ASSERT_OK(ps_device_push(g, "/cpu:0", &st), st);
  ps_variable *e = ps_get_variable(g, "e", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ps_device_pop(g);
  /* an unparsable device: TensorFlow's error, no scope, the graph usable */
  PS_ASSERT_STATUS(ps_device_push(g, "/nonsense:xyz", &st), st, PS_INVALID_ARGUMENT,
                   "Unknown attribute: 'nonsense' in '/nonsense:xyz'");
  PS_ASSERT_OK(ps_graph_status(g)->code, *ps_graph_status(g));
  ck_assert_str_eq(ps_variable_device(a), "/job:ps/task:0");
  ck_assert_str_eq(ps_variable_device(b), "/job:ps/task:1");
  ck_assert_str_eq(ps_variable_device(c), "/job:ps/task:0");
  ck_assert_str_eq(ps_variable_device(d), "/job:ps/task:1");
  ck_assert_str_eq(ps_variable_device(e), "/job:ps/task:0/device:CPU:0");
  ck_assert_int_eq(ps_variable_task(d), 1);
  /* reads and updates are colocated with the variable */
  ck_assert_str_eq(ps_node_device(ps_variable_value(b)), "/job:ps/task:1");
  ps_node *ph = ps_placeholder(g, PS_DT_FLOAT, &s, "x");
  ck_assert_str_eq(ps_node_device(ph), "/job:worker");
  ck_assert_str_eq(ps_node_name(ps_variable_value(b)), "b/read");
  ps_graph_destroy(g);
}
END_TEST

START_TEST(greedy_placement_by_bytes) {
  ps_graph *g = ps_graph_create();
  ps_rds_options o = {.strategy = PS_STRATEGY_GREEDY_BYTES};
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, &o));
  ps_status st;
  ps_shape big = shp(2, 100, 100), small = shp(1, 10, 0);
  ps_variable *a = ps_get_variable(g, "big", PS_DT_FLOAT, &big, NULL, NULL, &st);
  ps_variable *b = ps_get_variable(g, "s1", PS_DT_FLOAT, &small, NULL, NULL, &st);
  ps_variable *c = ps_get_variable(g, "s2", PS_DT_FLOAT, &small, NULL, NULL, &st);
  ps_variable *d = ps_get_variable(g, "s3", PS_DT_FLOAT, &small, NULL, NULL, &st);
  ck_assert_int_eq(ps_variable_task(a), 0);
  ck_assert_int_eq(ps_variable_task(b), 1);
  ck_assert_int_eq(ps_variable_task(c), 1);
  ck_assert_int_eq(ps_variable_task(d), 1);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(no_ps_job_means_no_device_function) {
  ps_status st;
  ps_cluster *c =
      ps_cluster_parse("{\"worker\": [\"127.0.0.1:1\"]}",
                       strlen("{\"worker\": [\"127.0.0.1:1\"]}"), "test", &st);
  ck_assert_ptr_nonnull(c);
  ck_assert_ptr_null(ps_replica_device_setter(c, NULL));
  ps_cluster_destroy(c);
}
END_TEST

START_TEST(scopes_reuse_and_their_errors) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_shape s = shp(2, 3, 3);
  PS_ASSERT_OK(ps_variable_scope_push(g, "conv1", PS_REUSE_NONE, &st), st);
  ps_variable *w = ps_get_variable(g, "weights", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ck_assert_ptr_nonnull(w);
  ck_assert_str_eq(ps_variable_name(w), "conv1/weights");
  ck_assert_ptr_null(ps_get_variable(g, "weights", PS_DT_FLOAT, &s, NULL, NULL, &st));
  ck_assert_str_eq(st.msg, "Variable conv1/weights already exists, disallowed. Did you "
                           "mean to set reuse=True or reuse=tf.AUTO_REUSE in VarScope?");
  ps_variable_scope_pop(g);
  PS_ASSERT_OK(ps_variable_scope_push(g, "conv1", PS_REUSE_TRUE, &st), st);
  ck_assert_ptr_eq(ps_get_variable(g, "weights", PS_DT_FLOAT, &s, NULL, NULL, &st), w);
  ck_assert_ptr_null(ps_get_variable(g, "biases", PS_DT_FLOAT, &s, NULL, NULL, &st));
  ck_assert_str_eq(st.msg, "Variable conv1/biases does not exist, or was not created "
                           "with tf.get_variable(). Did you mean to set "
                           "reuse=tf.AUTO_REUSE in VarScope?");
  ps_shape other = shp(2, 3, 4);
  ck_assert_ptr_null(ps_get_variable(g, "weights", PS_DT_FLOAT, &other, NULL, NULL, &st));
  ck_assert_str_eq(st.msg, "Trying to share variable conv1/weights, but specified shape "
                           "(3, 4) and found shape (3, 3).");
  ck_assert_ptr_null(ps_get_variable(g, "weights", PS_DT_DOUBLE, &s, NULL, NULL, &st));
  ck_assert_str_eq(st.msg, "Trying to share variable conv1/weights, but specified dtype "
                           "float64 and found dtype float32_ref.");
  /* nested scopes inherit reuse */
  PS_ASSERT_OK(ps_variable_scope_push(g, "inner", PS_REUSE_NONE, &st), st);
  ck_assert_ptr_null(ps_get_variable(g, "x", PS_DT_FLOAT, &s, NULL, NULL, &st));
  ck_assert_ptr_nonnull(strstr(st.msg, "conv1/inner/x does not exist"));
  ps_variable_scope_pop(g);
  ps_variable_scope_pop(g);
  PS_ASSERT_OK(ps_variable_scope_push(g, "conv2", PS_AUTO_REUSE, &st), st);
  ps_variable *a1 = ps_get_variable(g, "w", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ps_variable *a2 = ps_get_variable(g, "w", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ck_assert_ptr_nonnull(a1);
  ck_assert_ptr_eq(a1, a2);
  ps_variable_scope_pop(g);
  /* tf.Variable never errors: it uniquifies */
  ps_shape s0 = {0};
  ps_tensor *one = ps_tensor_create(PS_DT_FLOAT, &s0, true);
  ps_node *c1 = ps_constant(g, one, "one");
  ps_variable *v1 = ps_variable_create(g, c1, "v", NULL);
  ps_variable *v2 = ps_variable_create(g, c1, "v", NULL);
  ck_assert_str_eq(ps_variable_name(v1), "v");
  ck_assert_str_eq(ps_variable_name(v2), "v_1");
  ps_tensor_destroy(one);
  /* collections */
  size_t n;
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &n);
  ck_assert_uint_eq(n, 4);
  ps_var_options nt = {.not_trainable = true};
  ps_get_variable(g, "global_step", PS_DT_INT64, &s0, NULL, &nt, &st);
  ps_collection_variables(g, PS_TRAINABLE_VARIABLES, &n);
  ck_assert_uint_eq(n, 4);
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &n);
  ck_assert_uint_eq(n, 5);
  ps_collection_add_variable(g, "my_vars", w);
  ps_variable *const *mine = ps_collection_variables(g, "my_vars", &n);
  ck_assert_uint_eq(n, 1);
  ck_assert_ptr_eq(mine[0], w);
  ps_graph_destroy(g);
}
END_TEST

/* TensorFlow's collections hold any objects: a collection of a variable
 * and a node gives each typed getter its own kind (the node was returned
 * as a variable and crashed the caller), also after a MetaGraph round
 * trip; accessors take the NULL of a failed constructor. */
START_TEST(mixed_collections_and_null_accessors) {
  ps_graph *g = ps_graph_create();
  ps_status st;
  ps_shape s = shp(1, 3, 0);
  ps_variable *w = ps_get_variable(g, "w", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ck_assert_ptr_nonnull(w);
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &s, "x");
  ps_collection_add_variable(g, "mixed", w);
  ps_collection_add_node(g, "mixed", x);
  size_t nv, nn;
  ps_variable *const *vs = ps_collection_variables(g, "mixed", &nv);
  ps_node *const *ns = ps_collection_nodes(g, "mixed", &nn);
  ck_assert_uint_eq(nv, 1);
  ck_assert_uint_eq(nn, 1);
  ck_assert_str_eq(ps_variable_name(vs[0]), "w");
  ck_assert_str_eq(ps_node_name(ns[0]), "x");
  size_t len;
  uint8_t *buf = ps_meta_graph_serialize(g, NULL, &len, &st);
  ck_assert_msg(buf != NULL, "%s", st.msg);
  ps_graph *g2 = ps_meta_graph_parse(buf, len, "mixed", NULL, &st);
  free(buf);
  ck_assert_msg(g2 != NULL, "%s", st.msg);
  vs = ps_collection_variables(g2, "mixed", &nv);
  ns = ps_collection_nodes(g2, "mixed", &nn);
  ck_assert_uint_eq(nv, 1);
  ck_assert_uint_eq(nn, 1);
  ck_assert_str_eq(ps_variable_name(vs[0]), "w");
  ck_assert_str_eq(ps_node_name(ns[0]), "x");
  ps_graph_destroy(g2);
  /* a failed get_variable, then the README's pattern without a NULL check */
  ps_variable *again = ps_get_variable(g, "w", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ck_assert_ptr_null(again);
  ck_assert_ptr_null(ps_variable_value(again));
  ck_assert_ptr_null(ps_variable_initializer(again));
  ck_assert_ptr_null(ps_initialized_value(again));
  ck_assert_ptr_null(ps_read_value(again, NULL, 0));
  ck_assert_ptr_null(ps_assign(again, x));
  ck_assert_ptr_null(ps_is_variable_initialized(again));
  ck_assert_ptr_null(ps_variable_name(again));
  ck_assert_int_eq(ps_variable_task(again), -1);
  ck_assert_ptr_null(ps_node_name(NULL));
  ck_assert_ptr_null(ps_node_shape(NULL));
  ck_assert_int_eq(ps_node_dtype(NULL), PS_DT_INVALID);
  /* graph accessors and constructors take a NULL graph or variable too */
  ck_assert_uint_eq(ps_graph_num_nodes(NULL), 0);
  ck_assert_ptr_null(ps_graph_node(NULL, 0));
  ck_assert_ptr_null(ps_graph_node(g, 1u << 30));
  ck_assert_ptr_null(ps_graph_find_node(NULL, "w"));
  ck_assert_ptr_null(ps_graph_find_node(g, NULL));
  ck_assert_ptr_null(ps_global_variables_initializer(NULL));
  ck_assert_ptr_null(ps_report_uninitialized_variables(NULL, NULL, 0));
  ck_assert_ptr_null(ps_scalar(NULL, PS_DT_FLOAT, 1));
  ck_assert_ptr_null(ps_variable_scope_current(NULL));
  PS_ASSERT_CODE(ps_graph_status(NULL)->code, *ps_graph_status(NULL),
                 PS_INVALID_ARGUMENT);
  size_t before = ps_graph_num_nodes(g);
  ck_assert_ptr_null(ps_variables_initializer(g, &again, 1, "init_again"));
  ck_assert_ptr_nonnull(strstr(ps_graph_status(g)->msg, "variable 0 is NULL"));
  ck_assert_ptr_null(ps_report_uninitialized_variables(g, &again, 1));
  ck_assert_uint_eq(ps_graph_num_nodes(g), before); /* nothing added */
  ps_graph_destroy(g);
}
END_TEST

/* Variable scopes whose names add up to more than a name buffer: an error
 * naming the limit, for plain and partitioned variables (the scoped name
 * was built with an unchecked offset and overran the stack). */
START_TEST(a_scoped_name_over_the_limit_is_refused) {
  ps_graph *g = ps_graph_create();
  ps_status st;
  ps_shape s = shp(2, 4, 3);
  char scope[700];
  memset(scope, 'a', sizeof scope - 1);
  scope[sizeof scope - 1] = '\0';
  PS_ASSERT_OK(ps_variable_scope_push(g, scope, PS_REUSE_NONE, &st), st);
  /* a scope that does not fit is refused and opens nothing */
  PS_ASSERT_STATUS(ps_variable_scope_push(g, scope, PS_REUSE_NONE, &st), st,
                   PS_INVALID_ARGUMENT, "longer than 1022 bytes with its scopes");
  PS_ASSERT_CODE(ps_graph_status(g)->code, *ps_graph_status(g), PS_INVALID_ARGUMENT);
  ck_assert_str_eq(ps_variable_scope_name(ps_variable_scope_current(g)), scope);
  char inner[321];
  memset(inner, 'b', sizeof inner - 1);
  inner[sizeof inner - 1] = '\0';
  PS_ASSERT_OK(ps_variable_scope_push(g, inner, PS_REUSE_NONE, &st), st);
  ck_assert_ptr_null(ps_get_variable(g, "wwwww", PS_DT_FLOAT, &s, NULL, NULL, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "variable wwwww...: the name with its variable scopes is longer "
                   "than 1023 bytes");
  ps_partitioner p = {.kind = PS_PART_FIXED, .num_shards = 2};
  ck_assert_ptr_null(
      ps_get_partitioned_variable(g, "eeeee", PS_DT_FLOAT, &s, NULL, &p, NULL, &st));
  PS_ASSERT_STATUS(st.code, st, PS_INVALID_ARGUMENT,
                   "variable eeeee...: the name with its variable scopes is longer "
                   "than 1023 bytes");
  ps_variable_scope_pop(g);
  ps_variable *w = ps_get_variable(g, "w", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ck_assert_ptr_nonnull(w);
  ck_assert_uint_eq(strlen(ps_variable_name(w)), 699 + 2);
  ps_variable_scope_pop(g);
  ps_graph_destroy(g);
}
END_TEST

/* w on ps/0 from an initializer, w2 on ps/1 from w.initialized_value(),
 * u uninitialized; initialize, read, update, report. */
START_TEST(initialize_in_dependency_order_across_ps) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_shape s = shp(1, 4, 0);
  ps_init_spec k;
  ps_init_spec_default(&k, PS_INIT_CONSTANT);
  k.value = 3;
  ps_variable *w = ps_get_variable(g, "w", PS_DT_FLOAT, &s, &k, NULL, &st);
  ps_variable *w2 = ps_variable_create(g, ps_initialized_value(w), "w2", NULL);
  ck_assert_int_eq(ps_variable_task(w), 0);
  ck_assert_int_eq(ps_variable_task(w2), 1);
  ps_node *init = ps_global_variables_initializer(g);
  ps_node *report = ps_report_uninitialized_variables(g, NULL, 0);
  ps_session *sess = ps_session_create(g, C, &st);
  ck_assert_ptr_nonnull(sess);
  char **names;
  size_t nn;
  PS_ASSERT_OK(ps_session_run_report(sess, report, &names, &nn, &st), st);
  ck_assert_uint_eq(nn, 2);
  ck_assert_str_eq(names[0], "w");
  ck_assert_str_eq(names[1], "w2");
  ps_client_free_names(names, nn);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  PS_ASSERT_OK(ps_session_run_report(sess, report, &names, &nn, &st), st);
  ck_assert_uint_eq(nn, 0);
  free(names);
  ps_node *fetch[2] = {ps_variable_value(w), ps_variable_value(w2)};
  ps_tensor *out[2];
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, fetch, 2, NULL, 0, out, &st), st);
  int reads, updates;
  ps_session_last_rpcs(sess, &reads, &updates);
  ck_assert_int_eq(reads, 2); /* one read per ps, in one wave */
  for (int i = 0; i < 4; i++) {
    ck_assert(((float *)ps_tensor_data(out[0]))[i] == 3.f);
    ck_assert(((float *)ps_tensor_data(out[1]))[i] == 3.f);
  }
  ps_tensor_destroy(out[0]);
  ps_tensor_destroy(out[1]);
  /* assign_add from a fed placeholder, then read_value after it */
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &s, "x");
  ps_node *add = ps_assign_add(w2, x);
  ps_node *after = ps_read_value(w2, &add, 1);
  ps_tensor *xv = ps_tensor_create(PS_DT_FLOAT, &s, true);
  for (int i = 0; i < 4; i++)
    ((float *)ps_tensor_data(xv))[i] = (float)i;
  ps_feed feed = {x, xv};
  ps_session_destroy(sess);
  sess = ps_session_create(g, C, &st);
  PS_ASSERT_OK(ps_session_run(sess, &feed, 1, &after, 1, NULL, 0, out, &st), st);
  for (int i = 0; i < 4; i++)
    ck_assert(((float *)ps_tensor_data(out[0]))[i] == 3.f + (float)i);
  ps_tensor_destroy(out[0]);
  /* is_variable_initialized */
  ps_node *isw = ps_is_variable_initialized(w);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, &isw, 1, NULL, 0, out, &st), st);
  ck_assert_int_eq(*(uint8_t *)ps_tensor_data(out[0]), 1);
  ps_tensor_destroy(out[0]);
  /* feeding errors */
  ps_node *fx = x;
  PS_ASSERT_STATUS(ps_session_run(sess, NULL, 0, &fx, 1, NULL, 0, out, &st), st,
                   PS_INVALID_ARGUMENT,
                   "You must feed a value for placeholder tensor 'x'");
  ps_tensor_destroy(xv);
  ps_session_destroy(sess);
  ps_graph_destroy(g);
}
END_TEST

START_TEST(uninitialized_read_through_a_session) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_shape s = shp(1, 2, 0);
  ps_variable *w = ps_get_variable(g, "lonely", PS_DT_FLOAT, &s, NULL, NULL, &st);
  ps_session *sess = ps_session_create(g, C, &st);
  ps_node *r = ps_variable_value(w);
  ps_tensor *out;
  PS_ASSERT_CODE(ps_session_run(sess, NULL, 0, &r, 1, NULL, 0, &out, &st), st,
                 PS_FAILED_PRECONDITION);
  ck_assert_str_eq(st.msg, "Attempting to use uninitialized value lonely");
  ps_session_destroy(sess);
  ps_graph_destroy(g);
}
END_TEST

/* The value of an assign op is the variable's after the update, fetched or
 * used by another op, on a ps and in the session (TensorFlow:
 * sess.run(u.assign_add(1)) is [11 11 11], u.assign_add(1) + 1 is
 * [13 13 13]); a training step that only runs the update reads nothing. */
START_TEST(an_assign_op_gives_the_value_after_the_update) {
  for (int remote = 1; remote >= 0; remote--) {
    ps_graph *g = ps_graph_create();
    if (remote) ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
    ps_status st;
    ps_shape s3 = shp(1, 3, 0);
    ps_init_spec ten;
    ps_init_spec_default(&ten, PS_INIT_CONSTANT);
    ten.value = 10;
    ps_variable *u = ps_get_variable(g, "u", PS_DT_FLOAT, &s3, &ten, NULL, &st);
    ck_assert_msg(u != NULL, "%s", st.msg);
    ck_assert_int_eq(ps_variable_task(u) >= 0, remote);
    ps_tensor *ones = ps_tensor_create(PS_DT_FLOAT, &s3, false);
    for (int i = 0; i < 3; i++)
      ((float *)ps_tensor_data(ones))[i] = 1;
    ps_node *one = ps_constant(g, ones, "ones");
    ps_tensor_destroy(ones);
    ps_node *add1 = ps_assign_add(u, one);
    ps_node *plus1 = ps_add(ps_assign_add(u, one), ps_scalar(g, PS_DT_FLOAT, 1));
    ps_node *init = ps_global_variables_initializer(g);
    ck_assert_int_eq(ps_node_dtype(add1), PS_DT_FLOAT);
    ck_assert_int_eq(ps_node_shape(add1)->rank, 1);
    ps_session *sess = ps_session_create(g, remote ? C : NULL, &st);
    PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
    ps_tensor *out = NULL;
    PS_ASSERT_OK(ps_session_run(sess, NULL, 0, &add1, 1, NULL, 0, &out, &st), st);
    ck_assert_int_eq(ps_tensor_num_elements(out), 3);
    for (int i = 0; i < 3; i++)
      ck_assert(((float *)ps_tensor_data(out))[i] == 11);
    ps_tensor_destroy(out);
    PS_ASSERT_OK(ps_session_run(sess, NULL, 0, &plus1, 1, NULL, 0, &out, &st), st);
    for (int i = 0; i < 3; i++)
      ck_assert_msg(((float *)ps_tensor_data(out))[i] == 13, "%s: %g",
                    remote ? "ps" : "local", (double)((float *)ps_tensor_data(out))[i]);
    ps_tensor_destroy(out);
    /* run as a target only: one update call, no read */
    PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &add1, 1, NULL, &st), st);
    if (remote) {
      int reads, updates;
      ps_session_last_rpcs(sess, &reads, &updates);
      ck_assert_int_eq(reads, 0);
      ck_assert_int_eq(updates, 1);
    }
    ps_session_destroy(sess);
    ps_graph_destroy(g);
  }
}
END_TEST

/* Two programs declare one variable with different initializers: it is
 * shared by name (only dtype and shape must agree), keeps the initializer
 * it was created with, and the second program reads the first's value (a
 * live cluster refused the second program before: the seeds' restore
 * example). */
START_TEST(a_variable_is_shared_whatever_its_initializer) {
  ps_status st;
  ps_shape s2 = shp(1, 2, 0);
  ps_init_spec zeros, glorot;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_init_spec_default(&glorot, PS_INIT_GLOROT_UNIFORM);
  ps_graph *g1 = ps_graph_create(), *g2 = ps_graph_create();
  ps_device_push_fn(g1, ps_replica_device_setter(H.cluster, NULL));
  ps_device_push_fn(g2, ps_replica_device_setter(H.cluster, NULL));
  ps_variable *a = ps_get_variable(g1, "shared_w", PS_DT_FLOAT, &s2, &zeros, NULL, &st);
  ps_variable *b = ps_get_variable(g2, "shared_w", PS_DT_FLOAT, &s2, &glorot, NULL, &st);
  ck_assert(a != NULL && b != NULL);
  ps_session *s1 = ps_session_create(g1, C, &st), *sb = ps_session_create(g2, C, &st);
  ps_node *init = ps_global_variables_initializer(g1);
  PS_ASSERT_OK(ps_session_run(s1, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  PS_ASSERT_OK(ps_session_create_variables(sb, &st), st);
  ps_node *r = ps_variable_value(b);
  ps_tensor *out = NULL;
  PS_ASSERT_OK(ps_session_run(sb, NULL, 0, &r, 1, NULL, 0, &out, &st), st);
  ck_assert(((float *)ps_tensor_data(out))[0] == 0 &&
            ((float *)ps_tensor_data(out))[1] == 0);
  ps_tensor_destroy(out);
  ps_session_destroy(sb);
  ps_session_destroy(s1);
  ps_graph_destroy(g2);
  ps_graph_destroy(g1);
}
END_TEST

/* A variable the session holds (no ps device) and one on a ps refuse the
 * same updates with the same texts (common/variable.c). */
/* tf.variable_scope re-entered by name or by scope object, and
 * scope.reuse_variables(): the variables are shared, the ops get the
 * re-entered name scope ("model_1/conv1/Relu"), as TensorFlow names them. */
static ps_node *conv_relu_like(ps_graph *g, ps_node *x, const char *scope,
                               ps_status *st) {
  PS_ASSERT_OK(ps_variable_scope_push(g, scope, PS_REUSE_NONE, st), *st);
  ps_shape ws = shp(2, 2, 2), bs = shp(1, 2, 0);
  ps_variable *w = ps_get_variable(g, "weights", PS_DT_FLOAT, &ws, NULL, NULL, st);
  ps_variable *b = ps_get_variable(g, "biases", PS_DT_FLOAT, &bs, NULL, NULL, st);
  ck_assert_msg(w && b, "%s", st->msg);
  ps_node *y = ps_relu(
      ps_add(ps_matmul(x, ps_variable_value(w), false, false), ps_variable_value(b)));
  ps_variable_scope_pop(g);
  return y;
}

START_TEST(scope_objects_and_reentered_names) {
  ps_graph *g = ps_graph_create();
  ps_status st;
  ps_shape xs = shp(2, 1, 2);
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &xs, "x");
  PS_ASSERT_OK(ps_variable_scope_push(g, "model", PS_REUSE_NONE, &st), st);
  ps_variable_scope *scope = ps_variable_scope_current(g);
  ck_assert_str_eq(ps_variable_scope_name(scope), "model");
  ck_assert_str_eq(ps_variable_scope_original_name_scope(scope), "model/");
  ps_node *y1 = conv_relu_like(g, conv_relu_like(g, x, "conv1", &st), "conv2", &st);
  ck_assert_str_eq(ps_node_name(y1), "model/conv2/Relu");
  ck_assert_str_eq(ps_node_op(y1), "Relu");
  /* scope.reuse_variables() */
  ps_variable_scope_reuse_variables(scope);
  ck_assert_int_eq(ps_variable_scope_reuse(scope), PS_REUSE_TRUE);
  size_t nvars;
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &nvars);
  ps_node *y2 = conv_relu_like(g, conv_relu_like(g, x, "conv1", &st), "conv2", &st);
  ck_assert_str_eq(ps_node_name(y2), "model/conv2_1/Relu");
  ps_variable_scope_pop(g);
  /* by name, with reuse */
  PS_ASSERT_OK(ps_variable_scope_push(g, "model", PS_REUSE_TRUE, &st), st);
  ps_node *y3 = conv_relu_like(g, conv_relu_like(g, x, "conv1", &st), "conv2", &st);
  ck_assert_str_eq(ps_node_name(y3), "model_1/conv2/Relu");
  ps_variable_scope_pop(g);
  /* by scope object, from inside another scope: its own full name */
  PS_ASSERT_OK(ps_variable_scope_push(g, "other", PS_REUSE_NONE, &st), st);
  PS_ASSERT_OK(ps_variable_scope_push_scope(g, scope, PS_REUSE_TRUE, &st), st);
  ck_assert_str_eq(ps_variable_scope_name(ps_variable_scope_current(g)), "model");
  ps_node *y4 = conv_relu_like(g, conv_relu_like(g, x, "conv1", &st), "conv2", &st);
  ck_assert_str_eq(ps_node_name(y4), "other/model/conv2/Relu");
  ps_variable_scope_pop(g);
  ps_variable_scope_pop(g);
  size_t nvars_after;
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &nvars_after);
  ck_assert_uint_eq(nvars, 4);
  ck_assert_uint_eq(nvars_after, 4); /* shared, not made again */
  /* a name scope re-entered exactly with a trailing "/" */
  PS_ASSERT_OK(ps_name_scope_push(g, "model/", &st), st);
  ck_assert_str_eq(ps_node_name(ps_neg(x)), "model/Neg");
  ps_name_scope_pop(g);
  ps_graph_destroy(g);
}
END_TEST

/* One error rule: a failed constructor returns NULL, adds nothing, reports
 * its error (ps_graph_status, and its ps_status if it takes one), and the
 * graph stays usable: a session runs it. */
START_TEST(a_failed_constructor_leaves_the_graph_usable) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_shape s3 = shp(1, 3, 0), s2 = shp(1, 2, 0);
  ps_init_spec ones;
  ps_init_spec_default(&ones, PS_INIT_ONES);
  ps_variable *v = ps_get_variable(g, "v", PS_DT_FLOAT, &s3, &ones, NULL, &st);
  ck_assert_ptr_nonnull(v);
  size_t nodes = ps_graph_num_nodes(g);
  /* an op with mismatched shapes */
  ps_node *bad = ps_add(ps_variable_value(v), ps_placeholder(g, PS_DT_FLOAT, &s2, "p"));
  ck_assert_ptr_null(bad);
  PS_ASSERT_STATUS(ps_graph_status(g)->code, *ps_graph_status(g), PS_INVALID_ARGUMENT,
                   "Incompatible shapes: [3] vs. [2]");
  nodes++; /* the placeholder was made before the add failed */
  ck_assert_uint_eq(ps_graph_num_nodes(g), nodes);
  /* a NULL input keeps the error that made it */
  ck_assert_ptr_null(ps_neg(bad));
  ck_assert_ptr_nonnull(strstr(ps_graph_status(g)->msg, "Incompatible shapes"));
  /* get_variable: its status and the graph's say the same; nothing added */
  size_t nvars;
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &nvars);
  ck_assert_ptr_null(ps_get_variable(g, "v", PS_DT_FLOAT, &s3, NULL, NULL, &st));
  ck_assert_str_eq(st.msg, ps_graph_status(g)->msg);
  ck_assert_ptr_nonnull(strstr(st.msg, "Variable v already exists"));
  ps_node *tensor_init = ps_scalar(g, PS_DT_FLOAT, 2);
  nodes++;
  ck_assert_ptr_null(
      ps_get_variable_from(g, "w", PS_DT_INVALID, &s3, tensor_init, NULL, &st));
  ck_assert_str_eq(st.msg, "If initializer is a constant, do not specify shape.");
  ck_assert_uint_eq(ps_graph_num_nodes(g), nodes);
  size_t nvars_after;
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &nvars_after);
  ck_assert_uint_eq(nvars_after, nvars);
  ps_graph_clear_status(g);
  PS_ASSERT_OK(ps_graph_status(g)->code, *ps_graph_status(g));
  /* the name is free again: the failed w left nothing behind */
  ps_variable *w =
      ps_get_variable_from(g, "w", PS_DT_INVALID, NULL, tensor_init, NULL, &st);
  ck_assert_msg(w != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_variable_shape(w)->rank, 0);
  /* and a session runs the graph */
  ps_session *sess = ps_session_create(g, C, &st);
  ck_assert_msg(sess != NULL, "%s", st.msg);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_node *f[2] = {ps_add(ps_variable_value(v), ps_variable_value(v)),
                   ps_variable_value(w)};
  ps_tensor *out[2] = {0};
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, f, 2, NULL, 0, out, &st), st);
  ck_assert(((float *)ps_tensor_data(out[0]))[2] == 2.0f);
  ck_assert(((float *)ps_tensor_data(out[1]))[0] == 2.0f);
  ps_tensor_destroy(out[0]);
  ps_tensor_destroy(out[1]);
  /* a partitioned variable whose second part cannot be made leaves no part */
  ps_variable *blocker =
      ps_get_variable(g, "e/part_1", PS_DT_FLOAT, &s2, NULL, NULL, &st);
  ck_assert_ptr_nonnull(blocker);
  size_t nv0;
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &nv0);
  ps_shape es = shp(2, 4, 2);
  ps_partitioner p2 = {.kind = PS_PART_FIXED, .num_shards = 2};
  ck_assert_ptr_null(
      ps_get_partitioned_variable(g, "e", PS_DT_FLOAT, &es, NULL, &p2, NULL, &st));
  ck_assert_ptr_nonnull(strstr(st.msg, "Variable e/part_1 already exists"));
  ck_assert_str_eq(ps_graph_status(g)->msg, st.msg);
  size_t nv1;
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &nv1);
  ck_assert_uint_eq(nv1, nv0);
  ck_assert_ptr_null(ps_graph_find_node(g, "e/part_0"));
  /* scope pushes report errors too */
  PS_ASSERT_STATUS(ps_variable_scope_push(g, NULL, PS_REUSE_NONE, &st), st,
                   PS_INVALID_ARGUMENT, "variable scope: no name");
  ck_assert_ptr_null(ps_variable_scope_current(g));
  ps_session_destroy(sess);
  ps_graph_destroy(g);
}
END_TEST

static float scalar_of(ps_session *sess, ps_node *n) {
  ps_status st;
  ps_tensor *t = NULL;
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, &n, 1, NULL, 0, &t, &st), st);
  float f = ((float *)ps_tensor_data(t))[0];
  ps_tensor_destroy(t);
  return f;
}

/* initialized_value() of an uninitialized variable falls back to its
 * initial value, as TensorFlow 1.x's cond(is_initialized, read,
 * initial_value): running only w's initializer gives w = v0 + 1 and leaves
 * v uninitialized; the same through a 3-deep chain, for variables on the
 * ps and held by the session.  Fetching report_uninitialized_variables
 * with the ordinary run gives a 1-D string tensor of names. */
static void initialized_value_chain(bool on_ps) {
  ps_graph *g = ps_graph_create();
  if (on_ps) ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  ps_status st;
  ps_shape s0 = {0};
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_variable *u = ps_get_variable(g, "u", PS_DT_FLOAT, &s0, &zeros, NULL, &st);
  ps_node *one = ps_scalar(g, PS_DT_FLOAT, 1);
  ps_variable *v = ps_get_variable_from(g, "v", PS_DT_INVALID, NULL,
                                        ps_add(ps_initialized_value(u), one), NULL, &st);
  ps_variable *w = ps_variable_create(g, ps_add(ps_initialized_value(v), one), "w", NULL);
  ck_assert_msg(u && v && w, "%s", ps_graph_status(g)->msg);
  ck_assert_int_eq(ps_variable_task(u) >= 0, on_ps);
  ps_session *sess = ps_session_create(g, on_ps ? C : NULL, &st);
  ck_assert_ptr_nonnull(sess);
  ps_node *wi = ps_variable_initializer(w);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &wi, 1, NULL, &st), st);
  ck_assert(scalar_of(sess, ps_variable_value(w)) == 2.0f);
  ps_node *report = ps_report_uninitialized_variables(g, NULL, 0);
  ps_tensor *names = NULL;
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, &report, 1, NULL, 0, &names, &st), st);
  ck_assert_int_eq(names->dtype, PS_DT_STRING);
  ck_assert_int_eq(names->shape.rank, 1);
  ck_assert_int_eq(names->shape.dim[0], 2);
  ck_assert_str_eq(ps_tensor_string(names, 0), "u");
  ck_assert_str_eq(ps_tensor_string(names, 1), "v");
  ck_assert_ptr_null(ps_tensor_string(names, 2));
  ps_tensor_destroy(names);
  ps_node *read_v = ps_variable_value(v);
  PS_ASSERT_STATUS(ps_session_run(sess, NULL, 0, &read_v, 1, NULL, 0, &names, &st), st,
                   PS_FAILED_PRECONDITION, "Attempting to use uninitialized value v");
  /* once v holds a value, initialized_value() reads it */
  ps_node *set_v = ps_assign(v, ps_scalar(g, PS_DT_FLOAT, 5));
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &set_v, 1, NULL, &st), st);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &wi, 1, NULL, &st), st);
  ck_assert(scalar_of(sess, ps_variable_value(w)) == 6.0f);
  /* all initializers at once: v's waits for u's, w's for v's */
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ck_assert(scalar_of(sess, ps_variable_value(w)) == 2.0f);
  ps_node *report2 = ps_report_uninitialized_variables(g, NULL, 0);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, &report2, 1, NULL, 0, &names, &st), st);
  ck_assert_int_eq(names->shape.dim[0], 0);
  ps_tensor_destroy(names);
  ps_session_destroy(sess);
  ps_graph_destroy(g);
}

START_TEST(initialized_value_falls_back_to_the_initial_value) {
  initialized_value_chain(true);
  initialized_value_chain(false);
}
END_TEST

/* A variable on a device that does not exist fails the run with
 * TensorFlow's placement error unless the session allows soft placement;
 * another worker task's device is not this process's. */
static int run_init_on(const char *device, const ps_session_options *o, int *task,
                       ps_status *st) {
  ps_graph *g = ps_graph_create();
  PS_ASSERT_OK(ps_device_push(g, device, st), *st);
  ps_shape s = shp(1, 2, 0);
  ps_init_spec ones;
  ps_init_spec_default(&ones, PS_INIT_ONES);
  ps_variable *v = ps_get_variable(g, "v", PS_DT_FLOAT, &s, &ones, NULL, st);
  ck_assert_ptr_nonnull(v);
  *task = ps_variable_task(v);
  ps_session *sess = ps_session_create_opts(g, C, o, st);
  ck_assert_ptr_nonnull(sess);
  ps_node *init = ps_variable_initializer(v), *read = ps_variable_value(v);
  ps_tensor *out = NULL;
  int rc = ps_session_run(sess, NULL, 0, NULL, 0, &init, 1, NULL, st);
  if (rc == 0) rc = ps_session_run(sess, NULL, 0, &read, 1, NULL, 0, &out, st);
  if (rc == 0) ck_assert(((float *)ps_tensor_data(out))[1] == 1.0f);
  ps_tensor_destroy(out);
  ps_session_destroy(sess);
  ps_graph_destroy(g);
  return rc;
}

START_TEST(unavailable_devices_fail_unless_soft_placement) {
  ps_status st;
  int task;
  ps_session_options soft = {.allow_soft_placement = true};
  PS_ASSERT_STATUS(run_init_on("/gpu:1", NULL, &task, &st), st, PS_INVALID_ARGUMENT,
                   "Cannot assign a device for operation v: Operation was explicitly "
                   "assigned to /device:GPU:1 but available devices are [ "
                   "/job:ps/replica:0/task:0/device:CPU:0, "
                   "/job:ps/replica:0/task:1/device:CPU:0, "
                   "/job:worker/replica:0/device:CPU:0 ]. Make sure the device "
                   "specification refers to a valid device.");
  PS_ASSERT_OK(run_init_on("/gpu:1", &soft, &task, &st), st);
  ck_assert_int_eq(task, -1); /* held by the session */
  PS_ASSERT_STATUS(run_init_on("/job:ps/task:1/device:GPU:0", NULL, &task, &st), st,
                   PS_INVALID_ARGUMENT,
                   "explicitly assigned to /job:ps/task:1/device:GPU:0");
  PS_ASSERT_OK(run_init_on("/job:ps/task:1/device:GPU:0", &soft, &task, &st), st);
  ck_assert_int_eq(task, 1);
  /* another worker's task: not this process unless it says it is */
  PS_ASSERT_STATUS(run_init_on("/job:worker/task:0", NULL, &task, &st), st,
                   PS_INVALID_ARGUMENT, "explicitly assigned to /job:worker/task:0");
  ps_session_options w1 = {.device = "/job:worker/task:1"};
  PS_ASSERT_STATUS(run_init_on("/job:worker/task:0", &w1, &task, &st), st,
                   PS_INVALID_ARGUMENT,
                   "available devices are [ /job:ps/replica:0/task:0/device:CPU:0, "
                   "/job:ps/replica:0/task:1/device:CPU:0, "
                   "/job:worker/replica:0/task:1/device:CPU:0 ]");
  ps_session_options w0 = {.device = "/job:worker/task:0"};
  PS_ASSERT_OK(run_init_on("/job:worker/task:0", &w0, &task, &st), st);
  PS_ASSERT_OK(run_init_on("/cpu:0", NULL, &task, &st), st);
  PS_ASSERT_OK(
      run_init_on("/job:localhost/replica:0/task:0/device:CPU:0", NULL, &task, &st), st);
  ps_session_options bad = {.device = "/nonsense:xyz"};
  ps_graph *g = ps_graph_create();
  ck_assert_ptr_null(ps_session_create_opts(g, C, &bad, &st));
  PS_ASSERT_MSG_HAS(st, "session device: Unknown attribute: 'nonsense'");
  ps_graph_destroy(g);
}
END_TEST

START_TEST(local_and_remote_variables_say_the_same) {
  ps_graph *g = ps_graph_create();
  ps_status st;
  ps_shape s2 = shp(1, 2, 0), s3 = shp(1, 3, 0);
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  PS_ASSERT_OK(ps_device_push(g, "/job:ps/task:0", &st), st);
  ps_variable *r = ps_get_variable(g, "r", PS_DT_FLOAT, &s2, &z, NULL, &st);
  ps_device_pop(g);
  ps_variable *l = ps_get_variable(g, "l", PS_DT_FLOAT, &s2, &z, NULL, &st);
  ck_assert(r != NULL && l != NULL);
  ck_assert_int_eq(ps_variable_task(r), 0);
  ck_assert_int_lt(ps_variable_task(l), 0);
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, NULL, "x");
  ps_node *add_r = ps_assign_add(r, x), *add_l = ps_assign_add(l, x);
  ps_node *set_r = ps_assign(r, x), *set_l = ps_assign(l, x);
  ck_assert(add_r && add_l && set_r && set_l);
  ps_session *sess = ps_session_create(g, C, &st);
  ck_assert_ptr_nonnull(sess);
  ps_tensor *three = ps_tensor_create(PS_DT_FLOAT, &s3, true);
  ps_feed f = {x, three};
  const char *names[2] = {"r", "l"};
  ps_node *adds[2] = {add_r, add_l}, *sets[2] = {set_r, set_l};
  for (int i = 0; i < 2; i++) {
    char want[256];
    /* not initialized yet */
    PS_ASSERT_CODE(ps_session_run(sess, &f, 1, NULL, 0, &adds[i], 1, NULL, &st), st,
                   PS_FAILED_PRECONDITION);
    snprintf(want, sizeof want, "Attempting to use uninitialized value %s", names[i]);
    ck_assert_msg(strstr(st.msg, want) != NULL, "%s", st.msg);
    /* shapes */
    PS_ASSERT_CODE(ps_session_run(sess, &f, 1, NULL, 0, &sets[i], 1, NULL, &st), st,
                   PS_INVALID_ARGUMENT);
    snprintf(want, sizeof want,
             "Assign requires shapes of both tensors to match. lhs shape= [2] rhs "
             "shape= [3]\n\t [[{{node %s/Assign}}]]",
             names[i]);
    ck_assert_msg(strstr(st.msg, want) != NULL, "%s", st.msg);
  }
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(sess, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  for (int i = 0; i < 2; i++) {
    char want[256];
    PS_ASSERT_CODE(ps_session_run(sess, &f, 1, NULL, 0, &adds[i], 1, NULL, &st), st,
                   PS_INVALID_ARGUMENT);
    snprintf(want, sizeof want,
             "Cannot update variable with shape [2] using a Tensor with shape [3], "
             "shapes must be equal.\n\t [[{{node %s/AssignAdd}}]]",
             names[i]);
    ck_assert_msg(strstr(st.msg, want) != NULL, "%s", st.msg);
  }
  ps_tensor_destroy(three);
  ps_session_destroy(sess);
  ps_graph_destroy(g);
}
END_TEST

int main(void) {
  Suite *s = suite_create("graph");
  TCase *tc = tcase_create("graph");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, round_robin_placement_in_creation_order);
  tcase_add_test(tc, greedy_placement_by_bytes);
  tcase_add_test(tc, no_ps_job_means_no_device_function);
  tcase_add_test(tc, scopes_reuse_and_their_errors);
  tcase_add_test(tc, a_scoped_name_over_the_limit_is_refused);
  tcase_add_test(tc, mixed_collections_and_null_accessors);
  tcase_add_test(tc, initialize_in_dependency_order_across_ps);
  tcase_add_test(tc, uninitialized_read_through_a_session);
  tcase_add_test(tc, local_and_remote_variables_say_the_same);
  tcase_add_test(tc, an_assign_op_gives_the_value_after_the_update);
  tcase_add_test(tc, a_variable_is_shared_whatever_its_initializer);
  tcase_add_test(tc, scope_objects_and_reentered_names);
  tcase_add_test(tc, a_failed_constructor_leaves_the_graph_usable);
  tcase_add_test(tc, initialized_value_falls_back_to_the_initial_value);
  tcase_add_test(tc, unavailable_devices_fail_unless_soft_placement);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
