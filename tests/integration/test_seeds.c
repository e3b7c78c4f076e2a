/* The examples of the seed documents (TensorFlow 1.x's "Variables" guides:
 * "Variables: Creation, Initialization, Saving, and Loading" and
 * "Variables: persistent state in TensorFlow"), ported to the C API and
 * run on a real 2-ps cluster.  Each test is named after the section whose
 * code it follows and checks what that section says happens. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/saver.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

static char base[200], dir[300];
static ps_harness H;
static ps_client *C;

/* scratch directories (harness.h): a failing test leaves nothing behind */
static void setup_base(void) {
  harness_scratch_base(base, sizeof base, "seeds");
}
static void teardown_base(void) {
  harness_scratch_remove(base);
}

static void setup(void) {
  ck_assert_int_eq(harness_scratch_dir(dir, sizeof dir, base), 0);
  const char *extra[] = {"--checkpoint-dir", dir, NULL};
  C = harness_start_client(&H, 2, extra);
  ck_assert_ptr_nonnull(C);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
  ck_assert_int_eq(harness_scratch_remove(dir), 0);
}

static ps_shape shape1(int64_t a) {
  return (ps_shape){1, {a}};
}

/* sess.run(n) */
static ps_tensor *eval(ps_session *s, ps_node *n) {
  ps_status st;
  ps_tensor *t = NULL;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, &n, 1, NULL, 0, &t, &st), st);
  return t;
}

/* sess.run(target) */
static void run(ps_session *s, ps_node *target) {
  ps_status st;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &target, 1, NULL, &st), st);
}

static float f32(const ps_tensor *t, int64_t i) {
  return ((const float *)ps_tensor_data(t))[i];
}

/* A graph whose variables replica_device_setter spreads over the 2 ps. */
static ps_graph *ps_graph_on_cluster(void) {
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(H.cluster, NULL));
  return g;
}

/* "Creation": weights = tf.Variable(tf.random_normal([784, 200],
 * stddev=0.35), name="weights"); biases = tf.Variable(tf.zeros([200]),
 * name="biases"); then the init op.  A second program with the same graph
 * seed computes the same initial values. */
START_TEST(creation) {
  ps_shape ws = {2, {784, 200}}, bs = shape1(200);
  ps_tensor *first = NULL;
  for (int prog = 0; prog < 2; prog++) {
    ps_graph *g = ps_graph_on_cluster();
    ps_graph_set_random_seed(g, 1234);
    ps_status st;
    ps_variable *weights = ps_variable_create(
        g, ps_random_normal(g, &ws, PS_DT_FLOAT, 0, 0.35, NULL, NULL), "weights", NULL);
    ps_tensor *z = ps_tensor_create(PS_DT_FLOAT, &bs, true);
    ps_variable *biases =
        ps_variable_create(g, ps_constant(g, z, "zeros"), "biases", NULL);
    ps_tensor_destroy(z);
    ck_assert_msg(weights && biases, "%s", ps_graph_status(g)->msg);
    ck_assert_int_ne(ps_variable_task(weights), ps_variable_task(biases));
    ps_session *s = ps_session_create(g, C, &st);
    run(s, ps_global_variables_initializer(g));
    ps_tensor *w = eval(s, ps_variable_value(weights));
    ps_tensor *b = eval(s, ps_variable_value(biases));
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < 784 * 200; i++) {
      sum += f32(w, i);
      sq += (double)f32(w, i) * f32(w, i);
    }
    double mean = sum / (784 * 200), sd = sqrt(sq / (784 * 200) - mean * mean);
    ck_assert_msg(fabs(mean) < 0.01 && fabs(sd - 0.35) < 0.01, "mean %g sd %g", mean, sd);
    for (int i = 0; i < 200; i++)
      ck_assert(f32(b, i) == 0.0f);
    if (prog == 0) {
      first = w;
    } else {
      ck_assert_int_eq(memcmp(ps_tensor_data(first), ps_tensor_data(w), 784 * 200 * 4),
                       0);
      ps_tensor_destroy(w);
    }
    ps_tensor_destroy(b);
    ps_session_destroy(s);
    ps_graph_destroy(g);
  }
  ps_tensor_destroy(first);
}
END_TEST

/* "Initialization from another Variable": w2 =
 * tf.Variable(weights.initialized_value(), name="w2"); w_twice =
 * tf.Variable(weights.initialized_value() * 2.0, name="w_twice"), all
 * initialized by one init op, in the right order. */
START_TEST(initialization_from_another_variable) {
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_shape ws = {2, {784, 200}};
  int64_t seed = 7;
  ps_variable *weights = ps_variable_create(
      g, ps_random_normal(g, &ws, PS_DT_FLOAT, 0, 0.35, &seed, NULL), "weights", NULL);
  ps_variable *w2 = ps_variable_create(g, ps_initialized_value(weights), "w2", NULL);
  ps_variable *w_twice = ps_variable_create(
      g, ps_mul(ps_initialized_value(weights), ps_scalar(g, PS_DT_FLOAT, 2.0)), "w_twice",
      NULL);
  ck_assert_msg(weights && w2 && w_twice, "%s", ps_graph_status(g)->msg);
  ps_session *s = ps_session_create(g, C, &st);
  run(s, ps_global_variables_initializer(g));
  ps_tensor *a = eval(s, ps_variable_value(weights));
  ps_tensor *b = eval(s, ps_variable_value(w2));
  ps_tensor *c = eval(s, ps_variable_value(w_twice));
  for (int64_t i = 0; i < 784 * 200; i++) {
    ck_assert(f32(a, i) == f32(b, i));
    ck_assert(f32(c, i) == 2 * f32(a, i));
  }
  ps_tensor_destroy(a);
  ps_tensor_destroy(b);
  ps_tensor_destroy(c);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* "Creating a Variable": get_variable("my_variable", [1, 2, 3]) is float32
 * with glorot_uniform values; dtype=tf.int32 with zeros_initializer; a
 * tensor initializer gives the shape (and a shape given too is an
 * error). */
START_TEST(creating_a_variable) {
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_shape s123 = {3, {1, 2, 3}};
  ps_variable *my_variable =
      ps_get_variable(g, "my_variable", PS_DT_FLOAT, &s123, NULL, NULL, &st);
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_variable *my_int_variable =
      ps_get_variable(g, "my_int_variable", PS_DT_INT32, &s123, &zeros, NULL, &st);
  ps_shape s2 = shape1(2);
  ps_tensor *v = ps_tensor_create(PS_DT_INT32, &s2, false);
  ((int32_t *)ps_tensor_data(v))[0] = 23;
  ((int32_t *)ps_tensor_data(v))[1] = 42;
  ps_node *c = ps_constant(g, v, "Const");
  ps_tensor_destroy(v);
  ps_variable *other_variable =
      ps_get_variable_from(g, "other_variable", PS_DT_INT32, NULL, c, NULL, &st);
  ck_assert_msg(my_variable && my_int_variable && other_variable, "%s", st.msg);
  ck_assert_int_eq(ps_variable_dtype(my_variable), PS_DT_FLOAT);
  ck_assert_int_eq(ps_variable_shape(other_variable)->rank, 1);
  ck_assert_int_eq(ps_variable_shape(other_variable)->dim[0], 2);
  ck_assert_ptr_null(ps_get_variable_from(g, "bad", PS_DT_INT32, &s2, c, NULL, &st));
  ck_assert_str_eq(st.msg, "If initializer is a constant, do not specify shape.");
  ps_session *s = ps_session_create(g, C, &st);
  run(s, ps_global_variables_initializer(g));
  ps_tensor *t = eval(s, ps_variable_value(my_variable));
  /* glorot_uniform: fan_in 2, fan_out 3 for [1, 2, 3] (TensorFlow's fans) */
  double limit = sqrt(6.0 / (2 + 3));
  bool any_nonzero = false;
  for (int i = 0; i < 6; i++) {
    ck_assert(fabs(f32(t, i)) <= limit);
    any_nonzero |= f32(t, i) != 0;
  }
  ck_assert(any_nonzero);
  ps_tensor_destroy(t);
  t = eval(s, ps_variable_value(my_int_variable));
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(((int32_t *)ps_tensor_data(t))[i], 0);
  ps_tensor_destroy(t);
  t = eval(s, ps_variable_value(other_variable));
  ck_assert_int_eq(((int32_t *)ps_tensor_data(t))[0], 23);
  ck_assert_int_eq(((int32_t *)ps_tensor_data(t))[1], 42);
  ps_tensor_destroy(t);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* "Variable collections": my_local in LOCAL_VARIABLES, my_non_trainable not
 * trainable, tf.add_to_collection / tf.get_collection. */
START_TEST(variable_collections) {
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_shape s0 = {0};
  const char *local_coll[] = {PS_LOCAL_VARIABLES};
  ps_var_options lo = {.collections = local_coll, .ncollections = 1};
  ps_variable *my_local =
      ps_get_variable(g, "my_local", PS_DT_FLOAT, &s0, NULL, &lo, &st);
  ps_var_options nt = {.not_trainable = true};
  ps_variable *my_non_trainable =
      ps_get_variable(g, "my_non_trainable", PS_DT_FLOAT, &s0, NULL, &nt, &st);
  ck_assert(my_local && my_non_trainable);
  size_t n;
  ps_variable *const *l = ps_collection_variables(g, PS_LOCAL_VARIABLES, &n);
  ck_assert_uint_eq(n, 1);
  ck_assert_ptr_eq(l[0], my_local);
  /* trainable by default: TensorFlow adds it to TRAINABLE_VARIABLES too */
  ps_variable *const *tv = ps_collection_variables(g, PS_TRAINABLE_VARIABLES, &n);
  ck_assert_uint_eq(n, 1);
  ck_assert_ptr_eq(tv[0], my_local);
  ps_variable *const *gv = ps_collection_variables(g, PS_GLOBAL_VARIABLES, &n);
  ck_assert_uint_eq(n, 1);
  ck_assert_ptr_eq(gv[0], my_non_trainable);
  ps_collection_add_variable(g, "my_collection_name", my_local);
  l = ps_collection_variables(g, "my_collection_name", &n);
  ck_assert_uint_eq(n, 1);
  ck_assert_ptr_eq(l[0], my_local);
  ps_graph_destroy(g);
}
END_TEST

/* "Device placement": tf.device("/gpu:1") on a machine without GPUs fails
 * placement (soft placement puts it here); replica_device_setter with a
 * cluster spec puts the variable on a ps. */
START_TEST(device_placement) {
  ps_status st;
  ps_graph *g = ps_graph_create();
  PS_ASSERT_OK(ps_device_push(g, "/gpu:1", &st), st);
  ps_shape s1 = shape1(1);
  ps_variable *v = ps_get_variable(g, "v", PS_DT_FLOAT, &s1, NULL, NULL, &st);
  ps_device_pop(g);
  ck_assert_ptr_nonnull(v);
  ps_session *s = ps_session_create(g, C, &st);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_STATUS(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st,
                   PS_INVALID_ARGUMENT,
                   "Cannot assign a device for operation v: Operation was explicitly "
                   "assigned to /device:GPU:1");
  ps_session_destroy(s);
  ps_session_options soft = {.allow_soft_placement = true};
  s = ps_session_create_opts(g, C, &soft, &st);
  run(s, init);
  ps_session_destroy(s);
  ps_graph_destroy(g);
  /* cluster_spec = {"ps": [...], "worker": [...]} */
  g = ps_graph_on_cluster();
  ps_shape s20 = {2, {20, 20}};
  ps_variable *pv = ps_get_variable(g, "v", PS_DT_FLOAT, &s20, NULL, NULL, &st);
  ck_assert_ptr_nonnull(pv);
  ck_assert_str_eq(ps_variable_device(pv), "/job:ps/task:0");
  ps_graph_destroy(g);
}
END_TEST

/* "Initializing variables": global_variables_initializer, one variable's
 * initializer, report_uninitialized_variables printed as names, and
 * w = v.initialized_value() + 1. */
START_TEST(initializing_variables) {
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_shape s0 = {0}, s3 = {3, {1, 2, 3}};
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_variable *my_variable =
      ps_get_variable(g, "my_variable", PS_DT_FLOAT, &s3, NULL, NULL, &st);
  ps_variable *v = ps_get_variable(g, "v", PS_DT_FLOAT, &s0, &zeros, NULL, &st);
  ps_variable *w = ps_get_variable_from(
      g, "w", PS_DT_INVALID, NULL,
      ps_add(ps_initialized_value(v), ps_scalar(g, PS_DT_FLOAT, 1)), NULL, &st);
  ck_assert_msg(my_variable && v && w, "%s", st.msg);
  ps_session *s = ps_session_create(g, C, &st);
  ps_node *report = ps_report_uninitialized_variables(g, NULL, 0);
  ps_tensor *names = eval(s, report);
  ck_assert_int_eq(names->shape.dim[0], 3);
  ck_assert_str_eq(ps_tensor_string(names, 0), "my_variable");
  ck_assert_str_eq(ps_tensor_string(names, 2), "w");
  ps_tensor_destroy(names);
  run(s, ps_variable_initializer(my_variable));
  run(s, ps_variable_initializer(w)); /* v stays uninitialized */
  names = eval(s, report);
  ck_assert_int_eq(names->shape.dim[0], 1);
  ck_assert_str_eq(ps_tensor_string(names, 0), "v");
  ps_tensor_destroy(names);
  ps_tensor *t = eval(s, ps_variable_value(w));
  ck_assert(f32(t, 0) == 1.0f);
  ps_tensor_destroy(t);
  run(s, ps_global_variables_initializer(g));
  names = eval(s, report);
  ck_assert_int_eq(names->shape.dim[0], 0);
  ps_tensor_destroy(names);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* "Using variables": w = v + 1; v.assign_add(1); read_value() under
 * control_dependencies([assignment]) sees the update. */
START_TEST(using_variables) {
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_shape s0 = {0};
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_variable *v = ps_get_variable(g, "v", PS_DT_FLOAT, &s0, &zeros, NULL, &st);
  ps_node *one = ps_scalar(g, PS_DT_FLOAT, 1);
  ps_node *w = ps_add(ps_variable_value(v), one);
  ck_assert_str_eq(ps_node_name(w), "add");
  ps_node *assignment = ps_assign_add(v, one);
  ps_node *after = ps_read_value(v, &assignment, 1);
  ps_session *s = ps_session_create(g, C, &st);
  run(s, ps_global_variables_initializer(g));
  run(s, assignment);
  ps_tensor *t = eval(s, w);
  ck_assert(f32(t, 0) == 2.0f);
  ps_tensor_destroy(t);
  t = eval(s, after); /* runs the assign_add first */
  ck_assert(f32(t, 0) == 2.0f);
  ps_tensor_destroy(t);
  t = eval(s, assignment); /* an assign op's value: v after the update */
  ck_assert(f32(t, 0) == 3.0f);
  ps_tensor_destroy(t);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* The save half of the Saver examples: v1, v2 zeros; inc_v1 =
 * v1.assign(v1+1), dec_v2 = v2.assign(v2-1); save to model.ckpt. */
static char *saving_variables_program(void) {
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_shape s3 = shape1(3), s5 = shape1(5);
  ps_variable *v1 = ps_get_variable(g, "v1", PS_DT_FLOAT, &s3, &zeros, NULL, &st);
  ps_variable *v2 = ps_get_variable(g, "v2", PS_DT_FLOAT, &s5, &zeros, NULL, &st);
  ps_node *one = ps_scalar(g, PS_DT_FLOAT, 1);
  ps_node *inc_v1 = ps_assign(v1, ps_add(ps_variable_value(v1), one));
  ps_node *dec_v2 = ps_assign(v2, ps_sub(ps_variable_value(v2), one));
  ps_node *init_op = ps_global_variables_initializer(g);
  ps_saver *saver = ps_saver_create(g, NULL, &st);
  ck_assert_ptr_nonnull(saver);
  ps_session *s = ps_session_create(g, C, &st);
  run(s, init_op);
  run(s, inc_v1);
  run(s, dec_v2);
  char *save_path = NULL;
  PS_ASSERT_OK(ps_saver_save(saver, s, "model.ckpt", -1, NULL, &save_path, &st), st);
  ps_saver_destroy(saver);
  ps_session_destroy(s);
  ps_graph_destroy(g);
  /* tf.reset_default_graph() on a fresh cluster: the variables go */
  const char *names[] = {"v1", "v2"};
  for (int t = 0; t < 2; t++)
    PS_ASSERT_OK(ps_client_delete(C, t, names, 2, PS_DELETE_MISSING_OK, NULL, &st), st);
  return save_path;
}

START_TEST(saving_variables) {
  char *save_path = saving_variables_program();
  ck_assert_ptr_nonnull(strstr(save_path, "model.ckpt"));
  char p[400];
  snprintf(p, sizeof p, "%s/model.ckpt.index", dir);
  ck_assert_int_eq(access(p, F_OK), 0);
  /* the MetaGraph too, by default (write_meta_graph=True), written by the
   * ps; import_meta_graph gives back the graph and its Saver */
  snprintf(p, sizeof p, "%s/model.ckpt.meta", dir);
  ps_status st;
  ps_saver *sv = NULL;
  ps_graph *g = ps_import_meta_graph(p, &sv, &st);
  ck_assert_msg(g != NULL, "%s", st.msg);
  ck_assert_ptr_nonnull(ps_graph_find_node(g, "v1/read"));
  ps_saver_destroy(sv);
  ps_graph_destroy(g);
  free(save_path);
}
END_TEST

/* "Restoring Variables": a new graph with v1 [3] and v2 [5] (default
 * initializers), Saver(), restore without initializing: v1 = [1, 1, 1],
 * v2 = [-1 x 5]. */
START_TEST(restoring_variables) {
  free(saving_variables_program());
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_shape s3 = shape1(3), s5 = shape1(5);
  ps_variable *v1 = ps_get_variable(g, "v1", PS_DT_FLOAT, &s3, NULL, NULL, &st);
  ps_variable *v2 = ps_get_variable(g, "v2", PS_DT_FLOAT, &s5, NULL, NULL, &st);
  ps_saver *saver = ps_saver_create(g, NULL, &st);
  ps_session *s = ps_session_create(g, C, &st);
  PS_ASSERT_OK(ps_saver_restore(saver, s, "model.ckpt", &st), st);
  ps_tensor *a = eval(s, ps_variable_value(v1)), *b = eval(s, ps_variable_value(v2));
  for (int i = 0; i < 3; i++)
    ck_assert(f32(a, i) == 1.0f);
  for (int i = 0; i < 5; i++)
    ck_assert(f32(b, i) == -1.0f);
  ps_tensor_destroy(a);
  ps_tensor_destroy(b);
  ps_saver_destroy(saver);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* "Choosing which Variables to Save and Restore": Saver({"v2": v2}) restores
 * v2 only, v1 initialized by its own initializer (zeros); and
 * Saver({"my_v2": v2}) saves and restores under "my_v2". */
START_TEST(choosing_which_variables_to_save_and_restore) {
  free(saving_variables_program());
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_shape s3 = shape1(3), s5 = shape1(5);
  ps_variable *v1 = ps_get_variable(g, "v1", PS_DT_FLOAT, &s3, &zeros, NULL, &st);
  ps_variable *v2 = ps_get_variable(g, "v2", PS_DT_FLOAT, &s5, &zeros, NULL, &st);
  const char *key[] = {"v2"};
  ps_saver_options o = {.var_list = &v2, .nvars = 1, .keys = key};
  ps_saver *saver = ps_saver_create(g, &o, &st);
  ps_session *s = ps_session_create(g, C, &st);
  run(s, ps_variable_initializer(v1));
  PS_ASSERT_OK(ps_saver_restore(saver, s, "model.ckpt", &st), st);
  ps_tensor *a = eval(s, ps_variable_value(v1)), *b = eval(s, ps_variable_value(v2));
  ck_assert(f32(a, 0) == 0.0f);
  ck_assert(f32(b, 4) == -1.0f);
  ps_tensor_destroy(a);
  ps_tensor_destroy(b);
  const char *my[] = {"my_v2"};
  ps_saver_options mo = {.var_list = &v2, .nvars = 1, .keys = my};
  ps_saver *my_saver = ps_saver_create(g, &mo, &st);
  PS_ASSERT_OK(ps_saver_save(my_saver, s, "my.ckpt", -1, NULL, NULL, &st), st);
  run(s, ps_assign(v2, ps_mul(ps_variable_value(v2), ps_scalar(g, PS_DT_FLOAT, 0))));
  PS_ASSERT_OK(ps_saver_restore(my_saver, s, "my.ckpt", &st), st);
  b = eval(s, ps_variable_value(v2));
  ck_assert(f32(b, 4) == -1.0f);
  ps_tensor_destroy(b);
  ps_saver_destroy(my_saver);
  ps_saver_destroy(saver);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* "Sharing variables": conv_relu in variable scopes conv1/conv2 inside
 * my_image_filter; calling it twice at the top fails ("already exists");
 * reuse by re-entering "model" with reuse=True, by scope.reuse_variables()
 * and by the scope object: the same four variables, the second output
 * computed with them (equal to the first on the same input). */
static ps_node *conv_relu(ps_graph *g, ps_node *input, const ps_shape *kernel_shape,
                          const ps_shape *bias_shape, ps_status *st) {
  ps_init_spec rn, c0;
  ps_init_spec_default(&rn, PS_INIT_RANDOM_NORMAL);
  ps_init_spec_default(&c0, PS_INIT_CONSTANT);
  c0.value = 0.0;
  ps_variable *weights =
      ps_get_variable(g, "weights", PS_DT_FLOAT, kernel_shape, &rn, NULL, st);
  if (weights == NULL) return NULL;
  ps_variable *biases =
      ps_get_variable(g, "biases", PS_DT_FLOAT, bias_shape, &c0, NULL, st);
  if (biases == NULL) return NULL;
  const int strides[4] = {1, 1, 1, 1};
  ps_node *conv = ps_conv2d(input, ps_variable_value(weights), strides, "SAME", NULL);
  return ps_relu(ps_add(conv, ps_variable_value(biases)));
}

static ps_node *my_image_filter(ps_graph *g, ps_node *input_images, ps_status *st) {
  ps_shape k1 = {4, {5, 5, 1, 32}}, k2 = {4, {5, 5, 32, 32}}, b = {1, {32}};
  PS_ASSERT_OK(ps_variable_scope_push(g, "conv1", PS_REUSE_NONE, st), *st);
  ps_node *relu1 = conv_relu(g, input_images, &k1, &b, st);
  ps_variable_scope_pop(g);
  PS_ASSERT_OK(ps_variable_scope_push(g, "conv2", PS_REUSE_NONE, st), *st);
  ps_node *out = relu1 ? conv_relu(g, relu1, &k2, &b, st) : NULL;
  ps_variable_scope_pop(g);
  return out;
}

START_TEST(sharing_variables) {
  ps_graph *g = ps_graph_on_cluster();
  ps_status st;
  ps_shape is1 = {4, {1, 10, 10, 1}}, is2 = {4, {1, 20, 20, 1}};
  int64_t seed = 3;
  ps_node *input1 = ps_random_normal(g, &is1, PS_DT_FLOAT, 0, 1, &seed, NULL);
  ps_node *input2 = ps_random_normal(g, &is2, PS_DT_FLOAT, 0, 1, &seed, NULL);
  /* calling conv_relu twice in one scope fails */
  ps_shape k1 = {4, {5, 5, 1, 32}}, k2 = {4, {5, 5, 32, 32}}, b = {1, {32}};
  ps_node *x = conv_relu(g, input1, &k1, &b, &st);
  ck_assert_ptr_nonnull(x);
  ck_assert_ptr_null(conv_relu(g, x, &k2, &b, &st));
  ck_assert_str_eq(st.msg, "Variable weights already exists, disallowed. Did you mean to "
                           "set reuse=True or reuse=tf.AUTO_REUSE in VarScope?");
  /* with tf.variable_scope("model"): output1; then reuse=True: output2 */
  PS_ASSERT_OK(ps_variable_scope_push(g, "model", PS_REUSE_NONE, &st), st);
  ps_node *output1 = my_image_filter(g, input1, &st);
  ps_variable_scope *scope = ps_variable_scope_current(g);
  ps_variable_scope_pop(g);
  PS_ASSERT_OK(ps_variable_scope_push(g, "model", PS_REUSE_TRUE, &st), st);
  ps_node *output2 = my_image_filter(g, input2, &st);
  ps_variable_scope_pop(g);
  ck_assert_msg(output1 && output2, "%s", st.msg);
  ck_assert_str_eq(ps_node_name(output1), "model/conv2/Relu");
  ck_assert_str_eq(ps_node_name(output2), "model_1/conv2/Relu");
  /* the shape mismatch message of a wrong reuse, in TensorFlow's spelling */
  PS_ASSERT_OK(ps_variable_scope_push(g, "model", PS_REUSE_TRUE, &st), st);
  PS_ASSERT_OK(ps_variable_scope_push(g, "conv1", PS_REUSE_NONE, &st), st);
  ck_assert_ptr_null(ps_get_variable(g, "weights", PS_DT_FLOAT, &k2, NULL, NULL, &st));
  ck_assert_str_eq(st.msg, "Trying to share variable model/conv1/weights, but specified "
                           "shape (5, 5, 32, 32) and found shape (5, 5, 1, 32).");
  ps_variable_scope_pop(g);
  ps_variable_scope_pop(g);
  /* scope.reuse_variables() and tf.variable_scope(scope, reuse=True) */
  PS_ASSERT_OK(ps_variable_scope_push_scope(g, scope, PS_REUSE_NONE, &st), st);
  ps_variable_scope_reuse_variables(ps_variable_scope_current(g));
  ps_node *output3 = my_image_filter(g, input1, &st);
  ps_variable_scope_pop(g);
  PS_ASSERT_OK(ps_variable_scope_push_scope(g, scope, PS_REUSE_TRUE, &st), st);
  ps_node *output4 = my_image_filter(g, input1, &st);
  ps_variable_scope_pop(g);
  ck_assert_msg(output3 && output4, "%s", st.msg);
  size_t n;
  ps_collection_variables(g, PS_GLOBAL_VARIABLES, &n);
  ck_assert_uint_eq(n, 2 + 4); /* weights, biases and model's four */
  ps_session *s = ps_session_create(g, C, &st);
  run(s, ps_global_variables_initializer(g));
  ps_node *f[3] = {output1, output3, output4};
  ps_tensor *out[3] = {0};
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, f, 3, NULL, 0, out, &st), st);
  ck_assert_int_eq(out[0]->shape.dim[1], 10);
  ck_assert_int_eq(out[0]->shape.dim[3], 32);
  bool any_positive = false;
  for (int64_t i = 0; i < ps_tensor_num_elements(out[0]); i++) {
    ck_assert(f32(out[0], i) >= 0.0f);
    any_positive |= f32(out[0], i) > 0;
  }
  ck_assert(any_positive);
  ps_tensor_destroy(out[0]);
  ps_tensor_destroy(out[1]);
  ps_tensor_destroy(out[2]);
  ps_tensor *o2 = eval(s, output2);
  ck_assert_int_eq(o2->shape.dim[1], 20);
  ps_tensor_destroy(o2);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("seeds");
  TCase *tc = tcase_create("seeds");
  tcase_set_timeout(tc, 120);
  tcase_add_unchecked_fixture(tc, setup_base, teardown_base);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, creation);
  tcase_add_test(tc, initialization_from_another_variable);
  tcase_add_test(tc, creating_a_variable);
  tcase_add_test(tc, variable_collections);
  tcase_add_test(tc, device_placement);
  tcase_add_test(tc, initializing_variables);
  tcase_add_test(tc, using_variables);
  tcase_add_test(tc, saving_variables);
  tcase_add_test(tc, restoring_variables);
  tcase_add_test(tc, choosing_which_variables_to_save_and_restore);
  tcase_add_test(tc, sharing_variables);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
