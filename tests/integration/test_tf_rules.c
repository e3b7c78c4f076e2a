/* TensorFlow 1.x rules the held-out probes of issue 21 found broken, each
 * through the public C API on a real 2-ps cluster: get_variable beside a
 * tf.Variable of the same name, dtype=None, each graph's initializer being
 * its own, unseeded and seeded random initializers re-run, and initial
 * values that read another variable's value(). */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "paramserver/client.h"
#include "paramserver/graph.h"
#include "paramserver/init.h"
#include "paramserver/ops.h"
#include "paramserver/partition.h"
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
  /* and a partitioned one: its parts are float32 */
  ps_partitioner two = {.kind = PS_PART_FIXED, .num_shards = 2};
  ps_partitioned_variable *pv = ps_get_partitioned_variable(
      g, "p", PS_DT_INVALID, &(ps_shape){2, {4, 2}}, NULL, &two, NULL, &st);
  ck_assert_msg(pv != NULL, "%s", st.msg);
  ck_assert_int_eq(pv->n, 2);
  ck_assert_int_eq(pv->dtype, PS_DT_FLOAT);
  ck_assert_int_eq(ps_variable_dtype(pv->parts[0]), PS_DT_FLOAT);
  ck_assert_int_eq(ps_variable_dtype(pv->parts[1]), PS_DT_FLOAT);
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

/* A graph with get_variable("r", [n]) initialized by @spec, its session
 * and the initializer run once; the value read into *@out. */
typedef struct prog {
  ps_graph *g;
  ps_session *s;
  ps_variable *v;
  ps_node *init;
} prog;

static prog prog_new(const ps_init_spec *spec, int64_t n, const int64_t *graph_seed) {
  ps_status st;
  prog p;
  p.g = graph_on_cluster();
  if (graph_seed) ps_graph_set_random_seed(p.g, *graph_seed);
  ps_shape sh = shape1(n);
  p.v = ps_get_variable(p.g, "r", PS_DT_FLOAT, &sh, spec, NULL, &st);
  ck_assert_msg(p.v != NULL, "%s", st.msg);
  p.init = ps_global_variables_initializer(p.g);
  p.s = ps_session_create(p.g, C, &st);
  ck_assert_ptr_nonnull(p.s);
  return p;
}

/* Runs @p's initializer and reads the variable back from its ps. */
static ps_tensor *prog_init(prog *p) {
  run(p->s, p->init);
  return eval(p->s, ps_variable_value(p->v));
}

static void prog_free(prog *p) {
  ps_session_destroy(p->s);
  ps_graph_destroy(p->g);
}

static bool same(const ps_tensor *a, const ps_tensor *b) {
  return ps_tensor_nbytes(a) == ps_tensor_nbytes(b) &&
         memcmp(ps_tensor_data(a), ps_tensor_data(b), ps_tensor_nbytes(a)) == 0;
}

/* Values in [lo, hi) and not all equal. */
static void assert_random(const ps_tensor *t, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(f32(t, i) >= lo && f32(t, i) < hi, "%g", (double)f32(t, i));
  bool varied = false;
  for (int64_t i = 1; i < n; i++)
    varied |= f32(t, i) != f32(t, 0);
  ck_assert(varied);
}

/* An unseeded random initializer (seed 0 in the spec, no graph seed) draws
 * new values at every run, and in every program, as TensorFlow's unseeded
 * random ops do: re-running the initializer changes the variable.  The
 * default initializer (glorot_uniform, unseeded) too. */
START_TEST(an_unseeded_initializer_draws_new_values_each_run) {
  ps_init_spec u;
  ps_init_spec_default(&u, PS_INIT_RANDOM_UNIFORM);
  prog p = prog_new(&u, 1000, NULL);
  ps_tensor *a = prog_init(&p), *b = prog_init(&p);
  assert_random(a, 1000, 0, 1);
  assert_random(b, 1000, 0, 1);
  ck_assert(!same(a, b));
  prog q = prog_new(&u, 1000, NULL);
  ps_tensor *c = prog_init(&q);
  ck_assert(!same(a, c) && !same(b, c));
  ps_tensor_destroy(a);
  ps_tensor_destroy(b);
  ps_tensor_destroy(c);
  prog_free(&q);
  prog_free(&p);
  prog d = prog_new(NULL, 1000, NULL); /* glorot_uniform: limit sqrt(6/2000) */
  a = prog_init(&d);
  b = prog_init(&d);
  float lim = sqrtf(6.0f / 2000);
  assert_random(a, 1000, -lim, lim);
  ck_assert(!same(a, b));
  ps_tensor_destroy(a);
  ps_tensor_destroy(b);
  prog_free(&d);
}
END_TEST

/* A seeded initializer (op seed, or a graph seed alone) also gives the
 * next values at each run of the initializer in a session (TensorFlow's
 * kernel advances its Philox counter), and the same sequence in every
 * program: a second program's first and second runs give the first's. */
START_TEST(a_seeded_initializer_repeats_its_sequence_across_programs) {
  ps_init_spec u;
  ps_init_spec_default(&u, PS_INIT_TRUNCATED_NORMAL);
  u.seed = 42;
  int64_t gs = 5;
  for (int k = 0; k < 2; k++) { /* op seed; graph seed only */
    if (k == 1) u.seed = 0;
    const int64_t *graph_seed = k == 1 ? &gs : NULL;
    prog p = prog_new(&u, 1000, graph_seed);
    ps_tensor *a1 = prog_init(&p), *a2 = prog_init(&p);
    assert_random(a1, 1000, -2, 2);
    assert_random(a2, 1000, -2, 2);
    ck_assert(!same(a1, a2));
    prog q = prog_new(&u, 1000, graph_seed);
    ps_tensor *b1 = prog_init(&q), *b2 = prog_init(&q);
    ck_assert(same(a1, b1));
    ck_assert(same(a2, b2));
    /* another graph seed gives other values */
    int64_t other = 6;
    prog o = prog_new(&u, 1000, k == 1 ? &other : graph_seed);
    ps_tensor *c1 = prog_init(&o);
    ck_assert(k == 0 ? same(a1, c1) : !same(a1, c1));
    ps_tensor_destroy(a1);
    ps_tensor_destroy(a2);
    ps_tensor_destroy(b1);
    ps_tensor_destroy(b2);
    ps_tensor_destroy(c1);
    prog_free(&o);
    prog_free(&q);
    prog_free(&p);
  }
}
END_TEST

/* tf.Variable(tf.random_uniform([1000], seed=3)): each run of its
 * initializer in a session gives the next values; a second session on the
 * same graph starts the sequence again (TensorFlow's stateful kernels are
 * per session); without a seed every run differs. */
START_TEST(a_seeded_random_op_restarts_in_a_new_session) {
  ps_graph *g = graph_on_cluster();
  ps_status st;
  ps_shape sh = shape1(1000);
  int64_t seed = 3;
  ps_variable *v = ps_variable_create(
      g, ps_random_uniform(g, &sh, PS_DT_FLOAT, 0, 1, &seed, NULL), "ru", NULL);
  ps_variable *w = ps_variable_create(
      g, ps_random_uniform(g, &sh, PS_DT_FLOAT, 0, 1, NULL, NULL), "ru_unseeded", NULL);
  ck_assert(v && w);
  ps_session *s1 = ps_session_create(g, C, &st);
  ck_assert_ptr_nonnull(s1);
  run(s1, ps_variable_initializer(v));
  ps_tensor *a1 = eval(s1, ps_variable_value(v));
  run(s1, ps_variable_initializer(v));
  ps_tensor *a2 = eval(s1, ps_variable_value(v));
  ck_assert(!same(a1, a2));
  ps_session_destroy(s1);
  ps_session *s2 = ps_session_create(g, C, &st);
  ck_assert_ptr_nonnull(s2);
  run(s2, ps_variable_initializer(v));
  ps_tensor *b1 = eval(s2, ps_variable_value(v));
  run(s2, ps_variable_initializer(v));
  ps_tensor *b2 = eval(s2, ps_variable_value(v));
  ck_assert(same(a1, b1));
  ck_assert(same(a2, b2));
  run(s2, ps_variable_initializer(w));
  ps_tensor *c1 = eval(s2, ps_variable_value(w));
  run(s2, ps_variable_initializer(w));
  ps_tensor *c2 = eval(s2, ps_variable_value(w));
  assert_random(c1, 1000, 0, 1);
  ck_assert(!same(c1, c2));
  ps_tensor *t[6] = {a1, a2, b1, b2, c1, c2};
  for (int i = 0; i < 6; i++)
    ps_tensor_destroy(t[i]);
  ps_session_destroy(s2);
  ps_graph_destroy(g);
}
END_TEST

/* The draws of a seeded initializer do not depend on partitioning: the
 * parts of "emb" on the two ps hold, run after run, the rows an
 * unpartitioned "emb" (held by a session without a cluster) draws. */
START_TEST(draws_agree_across_partitionings) {
  ps_status st;
  ps_init_spec u;
  ps_init_spec_default(&u, PS_INIT_RANDOM_NORMAL);
  u.seed = 11;
  ps_shape full = {2, {7, 3}};
  ps_partitioner two = {.kind = PS_PART_FIXED, .num_shards = 2};
  ps_graph *ga = graph_on_cluster(), *gb = ps_graph_create();
  ps_partitioned_variable *pv =
      ps_get_partitioned_variable(ga, "emb", PS_DT_FLOAT, &full, &u, &two, NULL, &st);
  ck_assert_msg(pv != NULL, "%s", st.msg);
  ck_assert_int_ne(ps_variable_task(pv->parts[0]), ps_variable_task(pv->parts[1]));
  ps_variable *whole = ps_get_variable(gb, "emb", PS_DT_FLOAT, &full, &u, NULL, &st);
  ck_assert_msg(whole != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_variable_task(whole), -1);
  ps_session *sa = ps_session_create(ga, C, &st), *sb = ps_session_create(gb, NULL, &st);
  ck_assert(sa && sb);
  ps_node *ia = ps_global_variables_initializer(ga);
  ps_node *ib = ps_global_variables_initializer(gb);
  ps_tensor *prev = NULL;
  for (int d = 0; d < 3; d++) {
    run(sa, ia);
    run(sb, ib);
    ps_tensor *w = eval(sb, ps_variable_value(whole));
    ps_tensor *p0 = eval(sa, ps_variable_value(pv->parts[0]));
    ps_tensor *p1 = eval(sa, ps_variable_value(pv->parts[1]));
    int64_t n0 = ps_tensor_num_elements(p0), n1 = ps_tensor_num_elements(p1);
    ck_assert_int_eq(n0 + n1, 21);
    ck_assert_int_eq(n0, 12); /* rows 0..3, the first part one row larger */
    for (int64_t i = 0; i < n0; i++)
      ck_assert(f32(p0, i) == f32(w, i));
    for (int64_t i = 0; i < n1; i++)
      ck_assert(f32(p1, i) == f32(w, n0 + i));
    if (prev) ck_assert(!same(prev, w));
    ps_tensor_destroy(prev);
    prev = w;
    ps_tensor_destroy(p0);
    ps_tensor_destroy(p1);
  }
  ps_tensor_destroy(prev);
  ps_session_destroy(sb);
  ps_session_destroy(sa);
  ps_graph_destroy(gb);
  ps_graph_destroy(ga);
}
END_TEST

/* Graph A creates shared_tbl with zeros and other with 1; graph B declares
 * them with constant 7 and 2.  The variables are shared by name, but each
 * graph's initializer op is its own (TensorFlow's Assign of the graph's
 * own initial value): B's global initializer gives 7 7 7 and 2, A's then
 * gives 0 0 0 and 1 again. */
START_TEST(each_graph_runs_its_own_initializer) {
  ps_status st;
  ps_shape s3 = shape1(3), s1 = shape1(1);
  ps_init_spec zeros, one, seven, two;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_init_spec_default(&one, PS_INIT_CONSTANT);
  one.value = 1;
  seven = one;
  seven.value = 7;
  two = one;
  two.value = 2;
  ps_graph *ga = graph_on_cluster(), *gb = graph_on_cluster();
  ps_variable *ta =
      ps_get_variable(ga, "shared_tbl", PS_DT_FLOAT, &s3, &zeros, NULL, &st);
  ps_variable *oa = ps_get_variable(ga, "other", PS_DT_FLOAT, &s1, &one, NULL, &st);
  ps_variable *tb =
      ps_get_variable(gb, "shared_tbl", PS_DT_FLOAT, &s3, &seven, NULL, &st);
  ps_variable *ob = ps_get_variable(gb, "other", PS_DT_FLOAT, &s1, &two, NULL, &st);
  ck_assert(ta && oa && tb && ob);
  ps_session *sa = ps_session_create(ga, C, &st), *sb = ps_session_create(gb, C, &st);
  ck_assert(sa && sb);
  ps_node *ia = ps_global_variables_initializer(ga);
  ps_node *ib = ps_global_variables_initializer(gb);
  run(sa, ia);
  run(sb, ib);
  ps_tensor *t = eval(sb, ps_variable_value(tb)), *o = eval(sb, ps_variable_value(ob));
  ck_assert_msg(f32(t, 0) == 7 && f32(t, 1) == 7 && f32(t, 2) == 7, "B reads %g %g %g",
                (double)f32(t, 0), (double)f32(t, 1), (double)f32(t, 2));
  ck_assert_msg(f32(o, 0) == 2, "B reads other = %g", (double)f32(o, 0));
  ps_tensor_destroy(t);
  ps_tensor_destroy(o);
  /* A sees B's values (one variable), until its own initializer runs */
  t = eval(sa, ps_variable_value(ta));
  ck_assert(f32(t, 0) == 7);
  ps_tensor_destroy(t);
  run(sa, ps_variable_initializer(ta));
  run(sa, ps_variable_initializer(oa));
  t = eval(sb, ps_variable_value(tb));
  o = eval(sb, ps_variable_value(ob));
  ck_assert(f32(t, 0) == 0 && f32(t, 1) == 0 && f32(t, 2) == 0 && f32(o, 0) == 1);
  ps_tensor_destroy(t);
  ps_tensor_destroy(o);
  ps_session_destroy(sb);
  ps_session_destroy(sa);
  ps_graph_destroy(gb);
  ps_graph_destroy(ga);
}
END_TEST

/* xb = tf.Variable(xa.value() * 2) (a plain read, not initialized_value())
 * and xc = tf.get_variable("xc", initializer=xb.value() + xa.value()), on
 * the two ps: global_variables_initializer orders them (TensorFlow 1.x
 * rewrites each initial value to read initialized_value() of the
 * variables it uses), so every one is initialized, with the values of
 * the order.  An initializer run alone reads what its dependency holds. */
START_TEST(an_initial_value_reading_another_variable_is_ordered) {
  ps_graph *g = graph_on_cluster();
  ps_status st;
  const float v123[3] = {1, 2, 3};
  ps_variable *xa = ps_variable_create(g, floats(g, v123, 3, "c"), "xa", NULL);
  ps_variable *xb = ps_variable_create(
      g, ps_mul(ps_variable_value(xa), ps_scalar(g, PS_DT_FLOAT, 2)), "xb", NULL);
  ps_variable *xc = ps_get_variable_from(
      g, "xc", PS_DT_INVALID, NULL, ps_add(ps_variable_value(xb), ps_variable_value(xa)),
      NULL, &st);
  /* through an op with attributes of its own (Reshape's shape) */
  ps_variable *xd = ps_variable_create(
      g, ps_reshape(ps_variable_value(xb), &(ps_shape){2, {3, 1}}), "xd", NULL);
  ck_assert_msg(xa && xb && xc && xd, "%s %s", ps_graph_status(g)->msg, st.msg);
  ck_assert_ptr_nonnull(ps_graph_find_node(g, "Reshape_xd"));
  ck_assert_int_ne(ps_variable_task(xa), ps_variable_task(xb));
  ps_session *s = ps_session_create(g, C, &st);
  ck_assert_ptr_nonnull(s);
  run(s, ps_global_variables_initializer(g));
  ps_tensor *a = eval(s, ps_variable_value(xa)), *b = eval(s, ps_variable_value(xb));
  ps_tensor *c = eval(s, ps_variable_value(xc)), *d = eval(s, ps_variable_value(xd));
  ck_assert_int_eq(d->shape.rank, 2);
  for (int i = 0; i < 3; i++) {
    ck_assert(f32(d, i) == 2 * v123[i]);
    ck_assert(f32(a, i) == v123[i]);
    ck_assert(f32(b, i) == 2 * v123[i]);
    ck_assert(f32(c, i) == 3 * v123[i]);
  }
  ps_tensor_destroy(a);
  ps_tensor_destroy(b);
  ps_tensor_destroy(c);
  ps_tensor_destroy(d);
  char **names = NULL;
  size_t n = 9;
  PS_ASSERT_OK(ps_session_run_report(s, ps_report_uninitialized_variables(g, NULL, 0),
                                     &names, &n, &st),
               st);
  ck_assert_uint_eq(n, 0);
  ps_client_free_names(names, n);
  /* xa changed, then xb's initializer alone: it reads xa's value */
  const float ten[3] = {10, 20, 30};
  run(s, ps_assign(xa, floats(g, ten, 3, "ten")));
  run(s, ps_variable_initializer(xb));
  b = eval(s, ps_variable_value(xb));
  ck_assert(f32(b, 0) == 20 && f32(b, 1) == 40 && f32(b, 2) == 60);
  ps_tensor_destroy(b);
  ps_session_destroy(s);
  ps_graph_destroy(g);
}
END_TEST

/* The peak resident set of this process is reset to its current size
 * (/proc/self/clear_refs 5); returns that size. */
static long long reset_peak(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fputs("5", f) >= 0, 1);
  ck_assert_int_eq(fclose(f), 0);
  long long peak = 0, rss = harness_rss(getpid(), &peak);
  ck_assert_int_gt(rss, 0);
  return peak;
}

/* A graph's initializer runs on the ps, as TensorFlow runs the initializer
 * op on the variable's device: the 32 MiB of a random_normal variable are
 * filled by the ps (the Update carries the spec, the key and the draw),
 * so the worker never holds them (its peak grows by far less than the
 * variable), and the values are the ones the worker's own fill gives
 * for each run: a session-held variable of the same name and spec run
 * twice agrees bit for bit with the first and the second ps run. */
START_TEST(a_graph_initializer_fills_on_the_ps) {
  const int64_t n = 8 << 20; /* 32 MiB of float */
  ps_init_spec spec;
  ps_init_spec_default(&spec, PS_INIT_RANDOM_NORMAL);
  spec.seed = 11;
  prog p = prog_new(&spec, n, NULL);
  ps_session_run(p.s, NULL, 0, NULL, 0, NULL, 0, NULL, NULL); /* warm up */
  long long before = reset_peak();
  run(p.s, p.init);
  long long peak = 0;
  ck_assert_int_gt(harness_rss(getpid(), &peak), 0);
  ck_assert_msg(peak - before < 8 << 20,
                "the worker's peak grew by %lld bytes initializing a %lld-byte variable",
                peak - before, (long long)(n * 4));
  ps_tensor *a1 = eval(p.s, ps_variable_value(p.v));
  run(p.s, p.init);
  ps_tensor *a2 = eval(p.s, ps_variable_value(p.v));
  ck_assert(!same(a1, a2));
  /* the same spec held by a session: filled by the worker */
  ps_status st;
  ps_graph *g = ps_graph_create();
  ps_shape sh = shape1(n);
  ps_variable *l = ps_get_variable(g, "r", PS_DT_FLOAT, &sh, &spec, NULL, &st);
  ck_assert_msg(l != NULL, "%s", st.msg);
  ck_assert_int_lt(ps_variable_task(l), 0);
  ps_session *ls = ps_session_create(g, NULL, &st);
  ck_assert_ptr_nonnull(ls);
  run(ls, ps_variable_initializer(l));
  ps_tensor *b1 = eval(ls, ps_variable_value(l));
  ck_assert(same(a1, b1));
  ps_tensor_destroy(b1);
  run(ls, ps_variable_initializer(l));
  b1 = eval(ls, ps_variable_value(l));
  ck_assert(same(a2, b1));
  ps_tensor_destroy(b1);
  ps_tensor_destroy(a1);
  ps_tensor_destroy(a2);
  ps_session_destroy(ls);
  ps_graph_destroy(g);
  prog_free(&p);
}
END_TEST

/* Each element of @t is @x. */
static void assert_all(const ps_tensor *t, float x) {
  for (int64_t i = 0; i < ps_tensor_num_elements(t); i++)
    ck_assert_msg(f32(t, i) == x, "[%lld] = %g, want %g", (long long)i, (double)f32(t, i),
                  (double)x);
}

/* common/SECURITY.md: a graph's initializer is an Assign (filled on the ps),
 * which a worker token may send whether or not the variable holds a
 * value, as any assign; the Initialize RPC of a variable that holds a
 * value (psctl init, the ps's own copy of the initializer) needs an admin
 * token.  On a ps with tokens, a worker-token session runs its graph's
 * initializer twice (the second over an assigned value); the worker
 * token's Initialize is PERMISSION_DENIED and changes nothing; the admin
 * token's runs. */
START_TEST(a_worker_token_reruns_its_graphs_initializer) {
  char tokens[] = "/tmp/ps-tf-rules-tokens-XXXXXX";
  int fd = mkstemp(tokens);
  ck_assert_int_ge(fd, 0);
  const char *wtok = "worker-0123456789abcdef", *atok = "admin-0123456789abcdef";
  char body[200];
  int len = snprintf(body, sizeof body, "worker %s\nadmin %s\n", wtok, atok);
  ck_assert_int_eq(write(fd, body, (size_t)len), len);
  close(fd);
  ps_harness h;
  const char *extra[] = {"--auth-token-file", tokens, NULL};
  int started = harness_start(&h, 1, extra);
  unlink(tokens);
  ck_assert_int_eq(started, 0);
  ps_status st;
  ps_client_options o;
  ps_client_options_default(&o);
  o.token = wtok;
  ps_client *wc = ps_client_create(h.cluster, "ps", &o, &st);
  ck_assert_msg(wc != NULL, "%s", st.msg);
  o.token = atok;
  ps_client *ac = ps_client_create(h.cluster, "ps", &o, &st);
  ck_assert_msg(ac != NULL, "%s", st.msg);
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(h.cluster, NULL));
  ps_init_spec seven;
  ps_init_spec_default(&seven, PS_INIT_CONSTANT);
  seven.value = 7;
  ps_shape sh = shape1(4);
  ps_variable *v = ps_get_variable(g, "tok_tbl", PS_DT_FLOAT, &sh, &seven, NULL, &st);
  ck_assert_msg(v != NULL, "%s", st.msg);
  ps_session *s = ps_session_create(g, wc, &st);
  ck_assert_ptr_nonnull(s);
  run(s, ps_variable_initializer(v));
  ps_tensor *t = eval(s, ps_variable_value(v));
  assert_all(t, 7);
  ps_tensor_destroy(t);
  const float ones[4] = {1, 1, 1, 1};
  run(s, ps_assign(v, floats(g, ones, 4, "ones")));
  run(s, ps_variable_initializer(v)); /* over a value, with a worker token */
  t = eval(s, ps_variable_value(v));
  assert_all(t, 7);
  ps_tensor_destroy(t);
  run(s, ps_assign(v, floats(g, ones, 4, "ones2")));
  const char *nm[1] = {"tok_tbl"};
  PS_ASSERT_STATUS(ps_client_initialize(wc, 0, nm, 1, false, NULL, &st), st,
                   PS_PERMISSION_DENIED,
                   "Initialize: tok_tbl on ps/0 already holds a value; "
                   "re-initializing it needs an admin token (this call's "
                   "token has the worker role)");
  t = eval(s, ps_variable_value(v));
  assert_all(t, 1);
  ps_tensor_destroy(t);
  size_t ninit = 0;
  PS_ASSERT_OK(ps_client_initialize(ac, 0, nm, 1, false, &ninit, &st), st);
  ck_assert_uint_eq(ninit, 1);
  t = eval(s, ps_variable_value(v));
  assert_all(t, 7);
  ps_tensor_destroy(t);
  ps_session_destroy(s);
  ps_graph_destroy(g);
  ps_client_destroy(wc);
  ps_client_destroy(ac);
  ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* A session runs only its own graph's ops: a fetch or a target of another
 * graph (here another graph's variable initializer and value, whose ids
 * and variable index mean nothing in this graph) is INVALID_ARGUMENT, as
 * TensorFlow's "is not an element of this graph", and nothing runs. */
START_TEST(a_node_of_another_graph_is_refused) {
  ps_status st;
  ps_graph *ga = graph_on_cluster(), *gb = graph_on_cluster();
  ps_shape sh = shape1(3);
  ps_variable *va = ps_get_variable(ga, "ga_v", PS_DT_FLOAT, &sh, NULL, NULL, &st);
  ck_assert_msg(va != NULL, "%s", st.msg);
  ps_variable *vb[40];
  for (int i = 0; i < 40; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "gb_v%d", i);
    vb[i] = ps_get_variable(gb, nm, PS_DT_FLOAT, &sh, NULL, NULL, &st);
    ck_assert_msg(vb[i] != NULL, "%s", st.msg);
  }
  ps_session *s = ps_session_create(ga, C, &st);
  ck_assert_ptr_nonnull(s);
  ps_node *init = ps_variable_initializer(vb[39]);
  PS_ASSERT_STATUS(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st,
                   PS_INVALID_ARGUMENT, "is not an element of this graph");
  ck_assert_msg(strstr(st.msg, "gb_v39"), "%s", st.msg);
  ps_node *val = ps_variable_value(vb[0]);
  ps_tensor *out = NULL;
  PS_ASSERT_STATUS(ps_session_run(s, NULL, 0, &val, 1, NULL, 0, &out, &st), st,
                   PS_INVALID_ARGUMENT, "is not an element of this graph");
  ck_assert_ptr_null(out);
  bool init_b = true;
  const char *nm[1] = {"gb_v39"};
  int rc = ps_client_is_initialized(C, ps_variable_task(vb[39]), nm, 1, &init_b, &st);
  ck_assert(rc == PS_NOT_FOUND || (rc == 0 && !init_b));
  run(s, ps_variable_initializer(va));
  ps_session_destroy(s);
  ps_graph_destroy(gb);
  ps_graph_destroy(ga);
}
END_TEST

/* Update.fill through the client API: a fill that cannot be made is
 * refused with its message, by the client (with a value, or on another
 * op) or by the ps (a synchronous one; an initializer invalid for the
 * dtype or parameters; a part outside its full shape), and nothing
 * changes; a valid one assigns. */
START_TEST(a_bad_fill_is_refused_and_changes_nothing) {
  ps_status st;
  ps_shape sh = shape1(4);
  ps_var_spec vs[2] = {{.name = "fill_f", .dtype = PS_DT_FLOAT, .shape = sh},
                       {.name = "fill_i", .dtype = PS_DT_INT32, .shape = sh}};
  PS_ASSERT_OK(ps_client_create_vars(C, 0, vs, 2, &st), st);
  const float ones[4] = {1, 1, 1, 1};
  ps_tensor *one = ps_tensor_create(PS_DT_FLOAT, &sh, false);
  ck_assert_ptr_nonnull(one);
  memcpy(ps_tensor_data(one), ones, sizeof ones);
  ps_update a = {.name = "fill_f", .op = PS_ASSIGN, .value = one};
  PS_ASSERT_OK(ps_client_update(C, 0, &a, 1, &st), st);
  ps_init_spec ru;
  ps_init_spec_default(&ru, PS_INIT_RANDOM_UNIFORM);
  ps_update_fill f = {.init = &ru, .dtype = PS_DT_FLOAT, .shape = sh, .seed = 3};
  struct {
    ps_update u;
    const char *want;
  } bad[] = {
      {{.name = "fill_f", .op = PS_ASSIGN, .value = one, .fill = &f},
       "update of fill_f: a fill is an assign of an initializer, without a value"},
      {{.name = "fill_f", .op = PS_ASSIGN_ADD, .fill = &f},
       "update of fill_f: a fill is an assign of an initializer, without a value"},
      {{.name = "fill_f", .op = PS_ASSIGN, .fill = &f, .replicas_to_aggregate = 2},
       "Assign fill_f: only an asynchronous Assign can take an initializer (fill)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    PS_ASSERT_STATUS(ps_client_update(C, 0, &bad[i].u, 1, &st), st, PS_INVALID_ARGUMENT,
                     bad[i].want);
  }
  /* the ps's checks of the spec */
  ps_update_fill fi = {.init = &ru, .dtype = PS_DT_INT32, .shape = sh};
  ps_update u = {.name = "fill_i", .op = PS_ASSIGN, .fill = &fi};
  PS_ASSERT_CODE(ps_client_update(C, 0, &u, 1, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "fill_i") && strstr(st.msg, "needs a floating dtype"),
                "%s", st.msg);
  ps_init_spec wrong = ru;
  wrong.minval = 2;
  wrong.maxval = 1;
  ps_update_fill fw = {.init = &wrong, .dtype = PS_DT_FLOAT, .shape = sh};
  ps_update ok = {.name = "fill_f", .op = PS_ASSIGN, .fill = &f};
  ps_update two[2] = {ok, {.name = "fill_f", .op = PS_ASSIGN, .fill = &fw}};
  PS_ASSERT_STATUS(ps_client_update(C, 0, two, 2, &st), st, PS_INVALID_ARGUMENT,
                   "Assign fill_f");
  ps_shape full = shape1(6);
  ps_update_fill fp = {.init = &ru,
                       .dtype = PS_DT_FLOAT,
                       .shape = sh,
                       .full_name = "fill_full",
                       .full_shape = &full,
                       .offset = 4};
  ps_update part = {.name = "fill_f", .op = PS_ASSIGN, .fill = &fp};
  PS_ASSERT_CODE(ps_client_update(C, 0, &part, 1, &st), st, PS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(st.msg, "elements [4, 4 + 4) are outside shape [6]"), "%s",
                st.msg);
  ps_read r = {.name = "fill_f"};
  PS_ASSERT_OK(ps_client_read(C, 0, &r, 1, &st), st);
  assert_all(r.out, 1); /* nothing changed */
  ps_tensor_destroy(r.out);
  /* a valid fill assigns the draw the worker would make */
  PS_ASSERT_OK(ps_client_update(C, 0, &ok, 1, &st), st);
  r.out = NULL;
  PS_ASSERT_OK(ps_client_read(C, 0, &r, 1, &st), st);
  assert_random(r.out, 4, 0, 1);
  ps_tensor_destroy(r.out);
  ps_tensor_destroy(one);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tf_rules");
  TCase *tc = tcase_create("tf_rules");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, get_variable_beside_a_variable_of_that_name);
  tcase_add_test(tc, an_unseeded_initializer_draws_new_values_each_run);
  tcase_add_test(tc, a_seeded_initializer_repeats_its_sequence_across_programs);
  tcase_add_test(tc, a_seeded_random_op_restarts_in_a_new_session);
  tcase_add_test(tc, draws_agree_across_partitionings);
  tcase_add_test(tc, each_graph_runs_its_own_initializer);
  tcase_add_test(tc, an_initial_value_reading_another_variable_is_ordered);
  tcase_add_test(tc, a_graph_initializer_fills_on_the_ps);
  tcase_add_test(tc, a_worker_token_reruns_its_graphs_initializer);
  tcase_add_test(tc, a_node_of_another_graph_is_refused);
  tcase_add_test(tc, a_bad_fill_is_refused_and_changes_nothing);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
