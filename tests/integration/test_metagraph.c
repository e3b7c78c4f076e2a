/* MetaGraph export/import through real ps processes: a model trained for a
 * few steps is saved with its graph; a fresh cluster and a graph imported
 * from P.meta (no model code) restore it and continue training with the
 * same losses, step for step, as the original graph.  Plus the Saver's name
 * map surviving export, .meta eviction with max_to_keep, and corrupt or
 * truncated .meta files giving errors that name the file. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "paramserver/checkpoint.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/partition.h"
#include "paramserver/saver.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

static char dir[256];

/* Each test's directory lives in one base directory per test case,
 * removed by an unchecked fixture: that teardown runs in Check's parent
 * process, so a test that fails (its child exits without the checked
 * teardown) leaves nothing behind. */
static char base[200];
static void setup_base(void) {
  harness_scratch_base(base, sizeof base, "meta");
}
static void teardown_base(void) {
  harness_scratch_remove(base);
}

static void setup(void) {
  ck_assert_int_eq(harness_scratch_dir(dir, sizeof dir, base), 0);
}

static void teardown(void) {
  ck_assert_int_eq(harness_scratch_remove(dir), 0);
}

static ps_client *start(ps_harness *h, int nps) {
  const char *extra[] = {"--checkpoint-dir", dir, NULL};
  ps_client *c = harness_start_client(h, nps, extra);
  ck_assert_ptr_nonnull(c);
  return c;
}

/* A small classifier: dense layer + a partitioned embedding, Adam, a
 * variable initialized from another's initialized_value(). */
static ps_graph *build(const ps_cluster *cluster) {
  ps_status st;
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(cluster, NULL));
  ps_variable *step = ps_create_global_step(g, &st);
  ck_assert_ptr_nonnull(step);
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 4}}, "x");
  ps_node *ids = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "ids");
  ps_node *labels = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "labels");
  ps_init_spec rn;
  ps_init_spec_default(&rn, PS_INIT_TRUNCATED_NORMAL);
  rn.stddev = 0.5;
  rn.seed = 7;
  PS_ASSERT_OK(ps_variable_scope_push(g, "dense", PS_REUSE_NONE, &st), st);
  ps_variable *w =
      ps_get_variable(g, "kernel", PS_DT_FLOAT, &(ps_shape){2, {4, 3}}, &rn, NULL, &st);
  ps_init_spec c1;
  ps_init_spec_default(&c1, PS_INIT_CONSTANT);
  c1.value = 0.25;
  ps_variable *b =
      ps_get_variable(g, "bias", PS_DT_FLOAT, &(ps_shape){1, {3}}, &c1, NULL, &st);
  ps_variable_scope_pop(g);
  ck_assert_ptr_nonnull(w);
  ck_assert_ptr_nonnull(b);
  /* b2 = b.initialized_value() * 2, on the other ps */
  ps_variable *b2 = ps_variable_create(
      g, ps_mul(ps_initialized_value(b), ps_scalar(g, PS_DT_FLOAT, 2.0)), "b2", NULL);
  ck_assert_ptr_nonnull(b2);
  ps_partitioner p = {.kind = PS_PART_FIXED, .num_shards = 3};
  ps_partitioned_variable *emb = ps_get_partitioned_variable(
      g, "emb", PS_DT_FLOAT, &(ps_shape){2, {10, 3}}, &rn, &p, NULL, &st);
  ck_assert_ptr_nonnull(emb);
  ps_node *e = ps_embedding_lookup(g, emb->parts, emb->n, ids, PS_PARTITION_DIV);
  ps_node *h =
      ps_bias_add(ps_matmul(x, ps_variable_value(w), false, false), ps_variable_value(b));
  ps_node *logits = ps_add(ps_add(h, e), ps_variable_value(b2));
  ps_node *loss = ps_reduce_mean(
      ps_sparse_softmax_cross_entropy_with_logits(labels, logits), -1, false);
  ck_assert_ptr_nonnull(loss);
  ps_reshape(x, &(ps_shape){1, {-1}}); /* a Reshape with a constant target */
  ps_optimizer *o = ps_adam_optimizer(0.05, 0.9, 0.999, 1e-8);
  ps_node *train = ps_optimizer_minimize(o, g, loss, step, NULL, 0, &st);
  ck_assert_msg(train != NULL, "%s", st.msg);
  ps_optimizer_destroy(o);
  ps_collection_add_node(g, PS_LOSSES, loss);
  ps_collection_add_node(g, PS_TRAIN_OP, train);
  PS_ASSERT_OK(ps_graph_status(g)->code, *ps_graph_status(g));
  return g;
}

/* The feed of step @i, from names only (works on an imported graph). */
static double step_loss(ps_graph *g, ps_session *s, int i) {
  float xv[8];
  int64_t idv[2] = {i % 10, (3 * i + 1) % 10}, lv[2] = {i % 3, (i + 1) % 3};
  for (int k = 0; k < 8; k++)
    xv[k] = (float)((k * 7 + i * 3) % 11) / 10.0f - 0.5f;
  ps_tensor *x = ps_tensor_new(PS_DT_FLOAT, 2, (int64_t[]){2, 4});
  ps_tensor *ids = ps_tensor_new(PS_DT_INT64, 1, (int64_t[]){2});
  ps_tensor *lab = ps_tensor_new(PS_DT_INT64, 1, (int64_t[]){2});
  memcpy(ps_tensor_data(x), xv, sizeof xv);
  memcpy(ps_tensor_data(ids), idv, sizeof idv);
  memcpy(ps_tensor_data(lab), lv, sizeof lv);
  ps_feed f[3] = {{ps_graph_find_node(g, "x"), x},
                  {ps_graph_find_node(g, "ids"), ids},
                  {ps_graph_find_node(g, "labels"), lab}};
  size_t n1, n2;
  ps_node *loss = ps_collection_nodes(g, PS_LOSSES, &n1)[0];
  ps_node *train = ps_collection_nodes(g, PS_TRAIN_OP, &n2)[0];
  ck_assert(f[0].node && f[1].node && f[2].node);
  ps_tensor *out = NULL;
  ps_status st;
  PS_ASSERT_OK(ps_session_run(s, f, 3, &loss, 1, &train, 1, &out, &st), st);
  double l = *(float *)ps_tensor_data(out);
  ps_tensor_destroy(out);
  ps_tensor_destroy(x);
  ps_tensor_destroy(ids);
  ps_tensor_destroy(lab);
  return l;
}

static int64_t global_step(ps_graph *g, ps_session *s) {
  size_t n;
  ps_variable *const *v = ps_collection_variables(g, PS_GLOBAL_STEP, &n);
  ck_assert_uint_eq(n, 1);
  ps_node *r = ps_variable_value(v[0]);
  ps_tensor *out;
  ps_status st;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, &r, 1, NULL, 0, &out, &st), st);
  int64_t k = *(int64_t *)ps_tensor_data(out);
  ps_tensor_destroy(out);
  return k;
}

START_TEST(export_import_restore_continue) {
  ps_harness h;
  ps_client *c = start(&h, 2);
  ps_status st;
  ps_graph *g = build(h.cluster);
  ps_session *s = ps_session_create(g, c, &st);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  for (int i = 0; i < 5; i++)
    step_loss(g, s, i);
  ps_saver_options so = {.max_to_keep = 3};
  ps_saver *sv = ps_saver_create(g, &so, &st);
  char *path = NULL;
  PS_ASSERT_OK(ps_saver_save(sv, s, "model.ckpt", global_step(g, s), dir, &path, &st),
               st);
  char want_path[400];
  snprintf(want_path, sizeof want_path, "%s/model.ckpt-5", dir);
  ck_assert_str_eq(path, want_path);
  free(path);
  double want[4];
  for (int i = 0; i < 4; i++)
    want[i] = step_loss(g, s, 5 + i);
  size_t nnodes = ps_graph_num_nodes(g);
  ps_session_destroy(s);
  ps_saver_destroy(sv);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);

  /* a fresh cluster, the graph from the file */
  char mp[400];
  snprintf(mp, sizeof mp, "%s/model.ckpt-5.meta", dir);
  ps_saver *sv2 = NULL;
  ps_graph *g2 = ps_import_meta_graph(mp, &sv2, &st);
  ck_assert_msg(g2 != NULL, "%s", st.msg);
  ck_assert_ptr_nonnull(sv2);
  ck_assert_uint_eq(ps_graph_num_nodes(g2), nnodes);
  for (size_t i = 0; i < nnodes; i++) {
    ps_node *a = ps_graph_node(g, i), *b = ps_graph_node(g2, i);
    ck_assert_str_eq(ps_node_name(a), ps_node_name(b));
    ck_assert_str_eq(ps_node_op(a), ps_node_op(b));
    ck_assert_str_eq(ps_node_device(a), ps_node_device(b));
  }
  const char *keys[] = {PS_GLOBAL_VARIABLES, PS_TRAINABLE_VARIABLES, PS_GLOBAL_STEP};
  for (size_t k = 0; k < 3; k++) {
    size_t na, nb;
    ps_variable *const *va = ps_collection_variables(g, keys[k], &na);
    ps_variable *const *vb = ps_collection_variables(g2, keys[k], &nb);
    ck_assert_uint_eq(na, nb);
    for (size_t i = 0; i < na; i++) {
      ck_assert_str_eq(ps_variable_name(va[i]), ps_variable_name(vb[i]));
      ck_assert_int_eq(ps_variable_task(va[i]), ps_variable_task(vb[i]));
      ck_assert(ps_shape_equal(ps_variable_shape(va[i]), ps_variable_shape(vb[i])));
    }
  }
  ps_graph_destroy(g);
  c = start(&h, 2);
  ps_session *s2 = ps_session_create(g2, c, &st);
  ck_assert_ptr_nonnull(s2);
  PS_ASSERT_OK(ps_saver_restore(sv2, s2, NULL, &st), st); /* latest */
  ck_assert_int_eq(global_step(g2, s2), 5);
  for (int i = 0; i < 4; i++) {
    double l = step_loss(g2, s2, 5 + i);
    ck_assert_msg(l == want[i], "step %d: loss %.9g after import, %.9g in the original",
                  5 + i, l, want[i]);
  }
  ck_assert_int_eq(global_step(g2, s2), 9);
  /* the imported graph takes new nodes without name clashes */
  ps_node *extra = ps_placeholder(g2, PS_DT_FLOAT, NULL, "x");
  ck_assert_str_eq(ps_node_name(extra), "x_1");
  ps_session_destroy(s2);
  ps_saver_destroy(sv2);
  ps_graph_destroy(g2);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

START_TEST(name_map_and_eviction) {
  ps_harness h;
  ps_client *c = start(&h, 2);
  ps_status st;
  ps_graph *g = build(h.cluster);
  ps_session *s = ps_session_create(g, c, &st);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_variable *w = NULL;
  size_t nv;
  ps_variable *const *gv = ps_collection_variables(g, PS_GLOBAL_VARIABLES, &nv);
  for (size_t i = 0; i < nv; i++)
    if (!strcmp(ps_variable_name(gv[i]), "dense/kernel")) w = gv[i];
  ck_assert_ptr_nonnull(w);
  /* max_to_keep 2: the first checkpoint and its .meta go */
  ps_saver_options so = {.max_to_keep = 2};
  ps_saver *sv = ps_saver_create(g, &so, &st);
  for (int i = 1; i <= 3; i++)
    PS_ASSERT_OK(ps_saver_save(sv, s, "m", i, dir, NULL, &st), st);
  char p[400];
  struct stat sb;
  for (int i = 1; i <= 3; i++) {
    snprintf(p, sizeof p, "%s/m-%d.meta", dir, i);
    ck_assert_msg((stat(p, &sb) == 0) == (i > 1), "%s: %s", p,
                  i > 1 ? "missing" : "not deleted");
    snprintf(p, sizeof p, "%s/m-%d.index", dir, i);
    ck_assert_msg((stat(p, &sb) == 0) == (i > 1), "%s", p);
  }
  ps_saver_destroy(sv);
  /* Saver({"renamed": w}) survives the export, and restoring looks the key up */
  const char *key[] = {"renamed"};
  ps_saver_options rn = {.var_list = &w, .nvars = 1, .keys = key};
  sv = ps_saver_create(g, &rn, &st);
  ck_assert_ptr_nonnull(sv);
  snprintf(p, sizeof p, "%s/renamed.meta", dir);
  PS_ASSERT_OK(ps_export_meta_graph(g, sv, p, &st), st);
  ps_saver *sv2 = NULL;
  ps_graph *g2 = ps_import_meta_graph(p, &sv2, &st);
  ck_assert_msg(g2 != NULL, "%s", st.msg);
  ps_session *s2 = ps_session_create(g2, c, &st);
  ck_assert_int_ne(ps_saver_restore(sv2, s2, "m-3", &st), 0);
  ck_assert_msg(strstr(st.msg, "Key renamed not found in checkpoint") != NULL, "%s",
                st.msg);
  /* a duplicate key is refused at creation */
  ps_variable *two[2] = {w, w};
  ps_saver_options dup = {.var_list = two, .nvars = 2};
  ck_assert_ptr_null(ps_saver_create(g, &dup, &st));
  ck_assert_msg(strstr(st.msg, "dense/kernel") != NULL, "%s", st.msg);
  ps_session_destroy(s2);
  ps_saver_destroy(sv2);
  ps_graph_destroy(g2);
  ps_saver_destroy(sv);
  ps_session_destroy(s);
  ps_graph_destroy(g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* Two Savers in one directory, as TensorFlow's: a Saver's max_to_keep
 * evicts only the checkpoints it wrote itself (it deleted the other
 * Saver's "best" before), and the state file lists only its own; a Saver
 * with directory_retention (ps-worker's) works on the directory's list. */
START_TEST(a_saver_evicts_only_its_own_checkpoints) {
  ps_harness h;
  ps_client *c = start(&h, 2);
  ps_status st;
  ps_graph *g = build(h.cluster);
  ps_session *s = ps_session_create(g, c, &st);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_saver_options keep5 = {.max_to_keep = 5}, keep1 = {.max_to_keep = 1};
  ps_saver *best = ps_saver_create(g, &keep5, &st), *a = ps_saver_create(g, &keep1, &st);
  ck_assert(best != NULL && a != NULL);
  PS_ASSERT_OK(ps_saver_save(best, s, "best", -1, NULL, NULL, &st), st);
  for (int i = 1; i <= 3; i++)
    PS_ASSERT_OK(ps_saver_save(a, s, "m", i, NULL, NULL, &st), st);
  char p[400];
  struct stat sb;
  snprintf(p, sizeof p, "%s/best.index", dir);
  ck_assert_msg(stat(p, &sb) == 0, "%s was deleted by another Saver's max_to_keep", p);
  for (int i = 1; i <= 3; i++) {
    snprintf(p, sizeof p, "%s/m-%d.index", dir, i);
    ck_assert_msg((stat(p, &sb) == 0) == (i == 3), "%s", p);
  }
  ps_ckpt_state cs;
  PS_ASSERT_OK(ps_ckpt_state_read(dir, &cs, &st), st);
  ck_assert_uint_eq(cs.num_paths, 1);
  ck_assert_ptr_nonnull(strstr(cs.all_model_checkpoint_paths[0], "m-3"));
  ps_ckpt_state_free(&cs);
  /* the "best" Saver again: its own list is best and best-2 */
  PS_ASSERT_OK(ps_saver_save(best, s, "best", 2, NULL, NULL, &st), st);
  PS_ASSERT_OK(ps_ckpt_state_read(dir, &cs, &st), st);
  ck_assert_uint_eq(cs.num_paths, 2);
  ps_ckpt_state_free(&cs);
  snprintf(p, sizeof p, "%s/m-3.index", dir);
  ck_assert_msg(stat(p, &sb) == 0, "%s", p);
  /* directory retention: max_to_keep 1 over the directory's list */
  ps_saver_options dirwide = {.max_to_keep = 1, .directory_retention = true};
  ps_saver *d = ps_saver_create(g, &dirwide, &st);
  PS_ASSERT_OK(ps_saver_save(d, s, "d", 1, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "%s/best-2.index", dir);
  ck_assert_msg(stat(p, &sb) != 0, "%s: directory retention kept it", p);
  ps_saver_destroy(d);
  ps_saver_destroy(a);
  ps_saver_destroy(best);
  ps_session_destroy(s);
  ps_graph_destroy(g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* The tensors of checkpoint @prefix, as inspect lists them. */
static char *listing(const char *prefix) {
  char *buf = NULL;
  size_t len = 0;
  ps_status st;
  FILE *f = open_memstream(&buf, &len);
  ck_assert_ptr_nonnull(f);
  int rc = ps_ckpt_inspect(f, prefix, false, &st);
  fclose(f);
  ck_assert_msg(rc == 0, "%s", st.msg);
  return buf;
}

/* A Saver saves its var_list under its names, as TensorFlow's: not the
 * other variables of the cluster (another program's, even uninitialized,
 * failed the save), and Saver({"my_v2": v2}) writes my_v2, which its own
 * restore then finds (it wrote v2 and could not restore). */
START_TEST(a_saver_saves_its_var_list_under_its_names) {
  ps_harness h;
  ps_client *c = start(&h, 2);
  ps_status st;
  ps_shape s2 = {.rank = 1, .dim = {2}};
  ps_init_spec one;
  ps_init_spec_default(&one, PS_INIT_CONSTANT);
  one.value = 1;
  /* another program: v1 initialized, p4b_c never */
  ps_graph *other = ps_graph_create();
  ps_device_push_fn(other, ps_replica_device_setter(h.cluster, NULL));
  ps_variable *v1 = ps_get_variable(other, "v1", PS_DT_FLOAT, &s2, &one, NULL, &st);
  ps_get_variable(other, "p4b_c", PS_DT_FLOAT, &s2, &one, NULL, &st);
  ps_session *so = ps_session_create(other, c, &st);
  PS_ASSERT_OK(ps_session_create_variables(so, &st), st);
  ps_node *init_v1 = ps_variables_initializer(other, &v1, 1, "init_v1");
  PS_ASSERT_OK(ps_session_run(so, NULL, 0, NULL, 0, &init_v1, 1, NULL, &st), st);
  /* this program: weights and v2 */
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(h.cluster, NULL));
  ps_variable *w = ps_get_variable(g, "weights", PS_DT_FLOAT, &s2, &one, NULL, &st);
  ps_variable *v2 = ps_get_variable(g, "v2", PS_DT_FLOAT, &s2, &one, NULL, &st);
  ck_assert(w != NULL && v2 != NULL);
  ps_session *s = ps_session_create(g, c, &st);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_saver *all = ps_saver_create(g, NULL, &st);
  ck_assert_ptr_nonnull(all);
  PS_ASSERT_OK(ps_saver_save(all, s, "mine", -1, NULL, NULL, &st), st);
  char p[400];
  snprintf(p, sizeof p, "%s/mine", dir);
  char *l = listing(p);
  ck_assert_str_eq(l, "v2 (DT_FLOAT) [2]\nweights (DT_FLOAT) [2]\n");
  free(l);
  /* renamed */
  const char *key[] = {"my_v2"};
  ps_saver_options rn = {.var_list = &v2, .nvars = 1, .keys = key};
  ps_saver *renamed = ps_saver_create(g, &rn, &st);
  ck_assert_ptr_nonnull(renamed);
  PS_ASSERT_OK(ps_saver_save(renamed, s, "renamed", -1, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "%s/renamed", dir);
  l = listing(p);
  ck_assert_str_eq(l, "my_v2 (DT_FLOAT) [2]\n");
  free(l);
  PS_ASSERT_OK(ps_saver_restore(renamed, s, "renamed", &st), st);
  /* the operator's save still takes everything initialized on the cluster */
  ps_save_options everything = {.skip_uninitialized = true};
  PS_ASSERT_OK(ps_client_save(c, "everything", &everything, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "%s/everything", dir);
  l = listing(p);
  ck_assert_str_eq(l, "v1 (DT_FLOAT) [2]\nv2 (DT_FLOAT) [2]\nweights (DT_FLOAT) [2]\n");
  free(l);
  /* global_step as the variable (saver.save(sess, p, global_step=gs)) */
  ps_shape s0 = {0};
  ps_init_spec seven;
  ps_init_spec_default(&seven, PS_INIT_CONSTANT);
  seven.value = 7;
  ps_variable *gs = ps_get_variable(g, "step", PS_DT_INT64, &s0, &seven, NULL, &st);
  ps_node *init_gs = ps_variables_initializer(g, &gs, 1, "init_gs");
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init_gs, 1, NULL, &st), st);
  char *path = NULL;
  PS_ASSERT_OK(ps_saver_save_at_step(renamed, s, "stepped", gs, NULL, &path, NULL, &st),
               st);
  ck_assert_msg(path && strstr(path, "/stepped-7"), "%s", path ? path : "(null)");
  free(path);
  /* a step that is not a non-negative integer scalar names nothing: the
   * save is refused (read in the snapshot, before any shard is written) */
  ps_variable *fs = ps_get_variable(g, "fstep", PS_DT_FLOAT, &s0, &seven, NULL, &st);
  seven.value = -3;
  ps_variable *neg = ps_get_variable(g, "negstep", PS_DT_INT64, &s0, &seven, NULL, &st);
  ps_variable *both[2] = {fs, neg};
  ps_node *init_bad = ps_variables_initializer(g, both, 2, "init_bad");
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init_bad, 1, NULL, &st), st);
  for (int k = 0; k < 2; k++) {
    path = NULL;
    PS_ASSERT_CODE(
        ps_saver_save_at_step(renamed, s, "badstep", both[k], NULL, &path, NULL, &st), st,
        PS_INVALID_ARGUMENT);
    char want[128];
    snprintf(want, sizeof want,
             "save: step variable %s is not a non-negative integer scalar",
             k ? "negstep" : "fstep");
    ck_assert_msg(strstr(st.msg, want) != NULL, "%s", st.msg);
    ck_assert_ptr_null(path);
  }
  DIR *dd = opendir(dir);
  ck_assert_ptr_nonnull(dd);
  for (struct dirent *e; (e = readdir(dd)) != NULL;)
    ck_assert_msg(strncmp(e->d_name, "badstep", 7) != 0, "%s was written", e->d_name);
  closedir(dd);
  ps_saver_destroy(renamed);
  ps_saver_destroy(all);
  ps_session_destroy(s);
  ps_session_destroy(so);
  ps_graph_destroy(g);
  ps_graph_destroy(other);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* A SyncReplicas graph stays synchronous through export and import. */
/* A Saver saves every variable of its list wherever it lives: one held by
 * the session (no ps device) is written under its name (through a staging
 * variable on ps 0, deleted afterwards), and a restore brings it back; an
 * uninitialized one fails the save with TensorFlow's text and writes no
 * checkpoint. */
START_TEST(a_saver_saves_variables_held_by_the_session) {
  ps_harness h;
  ps_client *c = start(&h, 2);
  ps_status st;
  ps_shape s3 = {.rank = 1, .dim = {3}};
  ps_init_spec one;
  ps_init_spec_default(&one, PS_INIT_CONSTANT);
  one.value = 1;
  ps_graph *g = ps_graph_create();
  ps_variable *local = ps_get_variable(g, "local_v", PS_DT_FLOAT, &s3, &one, NULL, &st);
  ps_device_push_fn(g, ps_replica_device_setter(h.cluster, NULL));
  ps_variable *remote = ps_get_variable(g, "remote_v", PS_DT_FLOAT, &s3, &one, NULL, &st);
  ck_assert(local && remote);
  ck_assert_int_eq(ps_variable_task(local), -1);
  ps_session *s = ps_session_create(g, c, &st);
  ps_saver *sv = ps_saver_create(g, NULL, &st);
  ck_assert_ptr_nonnull(sv);
  /* uninitialized: the save fails, nothing is written */
  ps_node *init_remote = ps_variables_initializer(g, &remote, 1, "init_remote");
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init_remote, 1, NULL, &st), st);
  PS_ASSERT_STATUS(ps_saver_save(sv, s, "never", -1, NULL, NULL, &st), st,
                   PS_FAILED_PRECONDITION,
                   "Attempting to use uninitialized value local_v");
  char p[400];
  snprintf(p, sizeof p, "%s/never.index", dir);
  ck_assert_int_ne(access(p, F_OK), 0);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_tensor *three = ps_tensor_create(PS_DT_FLOAT, &s3, false);
  for (int i = 0; i < 3; i++)
    ((float *)ps_tensor_data(three))[i] = 3;
  ps_node *bump = ps_assign_add(local, ps_constant(g, three, "three"));
  ps_tensor_destroy(three);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &bump, 1, NULL, &st), st);
  PS_ASSERT_OK(ps_saver_save(sv, s, "both", -1, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "%s/both", dir);
  char *l = listing(p);
  ck_assert_str_eq(l, "local_v (DT_FLOAT) [3]\nremote_v (DT_FLOAT) [3]\n");
  free(l);
  /* no staging variable is left on the ps */
  ps_var_info *info;
  size_t ninfo;
  PS_ASSERT_OK(ps_client_list(c, 0, &info, &ninfo, &st), st);
  for (size_t i = 0; i < ninfo; i++)
    ck_assert_ptr_null(strstr(info[i].name, "_saver_staging"));
  ps_client_free_var_info(info, ninfo);
  /* a fresh session (its own copy, uninitialized) restores it */
  ps_session *s2 = ps_session_create(g, c, &st);
  PS_ASSERT_OK(ps_saver_restore(sv, s2, "both", &st), st);
  ps_node *read = ps_variable_value(local);
  ps_tensor *t = NULL;
  PS_ASSERT_OK(ps_session_run(s2, NULL, 0, &read, 1, NULL, 0, &t, &st), st);
  ck_assert(((float *)ps_tensor_data(t))[2] == 4.0f);
  ps_tensor_destroy(t);
  /* under a name of its own */
  const char *key[] = {"renamed_local"};
  ps_saver_options rn = {.var_list = &local, .nvars = 1, .keys = key};
  ps_saver *renamed = ps_saver_create(g, &rn, &st);
  PS_ASSERT_OK(ps_saver_save(renamed, s2, "renamed_local", -1, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "%s/renamed_local", dir);
  l = listing(p);
  ck_assert_str_eq(l, "renamed_local (DT_FLOAT) [3]\n");
  free(l);
  PS_ASSERT_OK(ps_saver_restore(renamed, s, "renamed_local", &st), st);
  ps_saver_destroy(renamed);
  ps_saver_destroy(sv);
  ps_session_destroy(s2);
  ps_session_destroy(s);
  ps_graph_destroy(g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* write_meta_graph: every Saver save writes <checkpoint>.meta on the ps by
 * default (it imports), none with no_meta_graph, and the .meta goes with
 * its checkpoint when max_to_keep evicts it. */
START_TEST(a_save_writes_its_meta_graph_by_default) {
  ps_harness h;
  ps_client *c = start(&h, 2);
  ps_status st;
  ps_shape s2 = {.rank = 1, .dim = {2}};
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(h.cluster, NULL));
  ps_variable *v = ps_get_variable(g, "v", PS_DT_FLOAT, &s2, NULL, NULL, &st);
  ck_assert_ptr_nonnull(v);
  ps_session *s = ps_session_create(g, c, &st);
  ps_node *init = ps_global_variables_initializer(g);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_saver_options keep1 = {.max_to_keep = 1};
  ps_saver *sv = ps_saver_create(g, &keep1, &st);
  PS_ASSERT_OK(ps_saver_save(sv, s, "m", 1, NULL, NULL, &st), st);
  char p[400];
  snprintf(p, sizeof p, "%s/m-1.meta", dir);
  ps_saver *isv = NULL;
  ps_graph *ig = ps_import_meta_graph(p, &isv, &st);
  ck_assert_msg(ig != NULL, "%s", st.msg);
  ck_assert_ptr_nonnull(ps_graph_find_node(ig, "v/read"));
  ps_saver_destroy(isv);
  ps_graph_destroy(ig);
  PS_ASSERT_OK(ps_saver_save(sv, s, "m", 2, NULL, NULL, &st), st);
  ck_assert_int_ne(access(p, F_OK), 0); /* evicted with m-1 */
  snprintf(p, sizeof p, "%s/m-2.meta", dir);
  ck_assert_int_eq(access(p, F_OK), 0);
  ps_saver_options nometa = {.no_meta_graph = true};
  ps_saver *bare = ps_saver_create(g, &nometa, &st);
  PS_ASSERT_OK(ps_saver_save(bare, s, "bare", -1, NULL, NULL, &st), st);
  snprintf(p, sizeof p, "%s/bare.meta", dir);
  ck_assert_int_ne(access(p, F_OK), 0);
  snprintf(p, sizeof p, "%s/bare.index", dir);
  ck_assert_int_eq(access(p, F_OK), 0);
  ps_saver_destroy(bare);
  ps_saver_destroy(sv);
  ps_session_destroy(s);
  ps_graph_destroy(g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

START_TEST(sync_graph_round_trip) {
  ps_harness h;
  ps_client *c = start(&h, 2);
  ps_status st;
  ps_graph *g = ps_graph_create();
  ps_device_push_fn(g, ps_replica_device_setter(h.cluster, NULL));
  ps_variable *step = ps_create_global_step(g, &st);
  ps_node *x = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 2}}, "x");
  ps_variable *w =
      ps_get_variable(g, "w", PS_DT_FLOAT, &(ps_shape){2, {2, 1}}, NULL, NULL, &st);
  ps_node *loss = ps_reduce_mean(ps_matmul(x, ps_variable_value(w), false, false),
                                 PS_ALL_AXES, false);
  ps_optimizer *o = ps_sync_replicas_optimizer(ps_gradient_descent_optimizer(0.1), 1, 1);
  ps_node *train = ps_optimizer_minimize(o, g, loss, step, NULL, 0, &st);
  ck_assert_msg(train != NULL, "%s", st.msg);
  ps_optimizer_destroy(o);
  ps_collection_add_node(g, PS_TRAIN_OP, train);
  char p[400];
  snprintf(p, sizeof p, "%s/sync.meta", dir);
  PS_ASSERT_OK(ps_export_meta_graph(g, NULL, p, &st), st);
  ps_graph_destroy(g);
  ps_graph *g2 = ps_import_meta_graph(p, NULL, &st);
  ck_assert_msg(g2 != NULL, "%s", st.msg);
  ps_session *s = ps_session_create(g2, c, &st);
  ps_node *init = ps_global_variables_initializer(g2);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  ps_tensor *xv = ps_tensor_new(PS_DT_FLOAT, 2, (int64_t[]){1, 2});
  ps_feed f = {ps_graph_find_node(g2, "x"), xv};
  size_t n;
  ps_node *t = ps_collection_nodes(g2, PS_TRAIN_OP, &n)[0];
  PS_ASSERT_OK(ps_session_run(s, &f, 1, NULL, 0, &t, 1, NULL, &st), st);
  int applied = 0, stale = 0;
  ps_session_last_sync(s, &applied, &stale);
  ck_assert_int_gt(applied, 0);
  ck_assert_int_eq(stale, 0);
  ps_tensor_destroy(xv);
  ps_session_destroy(s);
  ps_graph_destroy(g2);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* The .meta checksum: every truncation and every one of 3000 random flips
 * of 1 to 4 bits is an error naming the file (never a graph, never a
 * crash); an older file (format /1, no checksum) is still read. */
START_TEST(corrupt_meta_files) {
  ps_status st;
  const char *spec = "{\"ps\": [\"127.0.0.1:1\", \"127.0.0.1:2\"]}";
  ps_cluster *cl = ps_cluster_parse(spec, strlen(spec), "test", &st);
  ck_assert_ptr_nonnull(cl);
  ps_graph *g = build(cl);
  size_t len = 0;
  uint8_t *buf = ps_meta_graph_serialize(g, NULL, &len, &st);
  ck_assert_ptr_nonnull(buf);
  ck_assert_uint_gt(len, 1000);
  ps_graph *whole = ps_meta_graph_parse(buf, len, "whole.meta", NULL, &st);
  ck_assert_msg(whole != NULL, "%s", st.msg);
  ps_graph_destroy(whole);
  int cuts = 0;
  for (size_t cut = 0; cut < len; cut++, cuts++) {
    ps_graph *x = ps_meta_graph_parse(buf, cut, "cut.meta", NULL, &st);
    ck_assert_msg(x == NULL, "a cut at %zu of %zu bytes was imported", cut, len);
    PS_ASSERT_CODE(st.code, st, PS_DATA_LOSS);
    ck_assert_msg(strstr(st.msg, "MetaGraph cut.meta: ") == st.msg, "%s", st.msg);
  }
  ck_assert_int_eq(cuts, (int)len);
  uint8_t *copy = malloc(len);
  unsigned seed = 12345;
  int sums = 0;
  for (int i = 0; i < 3000; i++) {
    memcpy(copy, buf, len);
    for (int k = 0; k < 1 + i % 4; k++) {
      seed = seed * 1103515245u + 12345u;
      copy[(seed >> 8) % len] ^= (uint8_t)(1u << ((seed >> 4) % 8));
    }
    if (memcmp(copy, buf, len) == 0) continue; /* two flips undid each other */
    ps_saver *sv = NULL;
    ps_graph *x = ps_meta_graph_parse(copy, len, "flip.meta", &sv, &st);
    ck_assert_msg(x == NULL, "flip %d was imported silently", i);
    PS_ASSERT_CODE(st.code, st, PS_DATA_LOSS);
    ck_assert_msg(strstr(st.msg, "MetaGraph flip.meta: ") == st.msg, "%s", st.msg);
    sums += strstr(st.msg, "checksum") != NULL;
    ps_saver_destroy(sv);
  }
  ck_assert_int_gt(sums, 2500);
  /* a file as paramserver wrote it before the checksum: format /1, no
   * trailing field; read when it parses */
  memcpy(copy, buf, len - 5);
  uint8_t *f2 = memmem(copy, len - 5, "paramserver.meta/2", 18);
  ck_assert_ptr_nonnull(f2);
  f2[17] = '1';
  ps_graph *old = ps_meta_graph_parse(copy, len - 5, "old.meta", NULL, &st);
  ck_assert_msg(old != NULL, "%s", st.msg);
  ps_graph_destroy(old);
  /* the same bytes claiming format /2: refused */
  f2[17] = '2';
  ck_assert_ptr_null(ps_meta_graph_parse(copy, len - 5, "unsigned.meta", NULL, &st));
  ck_assert_msg(strstr(st.msg, "MetaGraph unsigned.meta: format \"paramserver.meta/2\" "
                               "without its checksum"),
                "%s", st.msg);
  free(copy);
  /* through a file: a flipped byte names the file */
  char p[400];
  snprintf(p, sizeof p, "%s/flipped.meta", dir);
  FILE *ff = fopen(p, "wb");
  buf[len / 2] ^= 0x10;
  fwrite(buf, 1, len, ff);
  fclose(ff);
  ck_assert_ptr_null(ps_import_meta_graph(p, NULL, &st));
  PS_ASSERT_CODE(st.code, st, PS_DATA_LOSS);
  ck_assert_msg(strstr(st.msg, p) && strstr(st.msg, "checksum mismatch"), "%s", st.msg);
  /* a missing file, and a file that is not a MetaGraph */
  snprintf(p, sizeof p, "%s/none.meta", dir);
  ck_assert_ptr_null(ps_import_meta_graph(p, NULL, &st));
  PS_ASSERT_STATUS(st.code, st, PS_NOT_FOUND, p);
  snprintf(p, sizeof p, "%s/text.meta", dir);
  FILE *f = fopen(p, "w");
  fputs("model_checkpoint_path: \"x\"\n", f);
  fclose(f);
  ck_assert_ptr_null(ps_import_meta_graph(p, NULL, &st));
  ck_assert_msg(strstr(st.msg, p) != NULL, "%s", st.msg);
  free(buf);
  ps_graph_destroy(g);
  ps_cluster_destroy(cl);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("metagraph");
  TCase *tc = tcase_create("metagraph");
  tcase_add_unchecked_fixture(tc, setup_base, teardown_base);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, export_import_restore_continue);
  tcase_add_test(tc, name_map_and_eviction);
  tcase_add_test(tc, a_saver_evicts_only_its_own_checkpoints);
  tcase_add_test(tc, a_saver_saves_its_var_list_under_its_names);
  tcase_add_test(tc, a_saver_saves_variables_held_by_the_session);
  tcase_add_test(tc, a_save_writes_its_meta_graph_by_default);
  tcase_add_test(tc, corrupt_meta_files);
  tcase_add_test(tc, sync_graph_round_trip);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return ps_test_run(suite());
}
