/* Cluster-wide checkpoints through real ps processes: consistent save
 * while training runs, restore into a cluster with another number of ps
 * and another partitioning, renames, and the errors. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/rpc.h"
#include "harness.h"
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
  harness_scratch_base(base, sizeof base, "ckpt");
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

static int start(ps_harness *h, int nps, ps_client **c) {
  const char *extra[] = {"--checkpoint-dir", dir, NULL};
  *c = harness_start_client(h, nps, extra);
  return *c ? 0 : -1;
}

static void stop(ps_harness *h, ps_client *c) {
  ck_assert_int_eq(harness_stop_client(h, c), 0);
}

typedef struct model {
  ps_graph *g;
  ps_variable *w, *step;
  ps_partitioned_variable *emb;
} model;

static void build(model *m, const ps_cluster *cluster, int emb_parts) {
  ps_status st;
  m->g = ps_graph_create();
  ps_device_push_fn(m->g, ps_replica_device_setter(cluster, NULL));
  m->step = ps_create_global_step(m->g, &st);
  ps_init_spec rn;
  ps_init_spec_default(&rn, PS_INIT_RANDOM_NORMAL);
  rn.seed = 3;
  m->w = ps_get_variable(m->g, "dense/kernel", PS_DT_FLOAT, &(ps_shape){2, {4, 3}}, &rn,
                         NULL, &st);
  ps_partitioner p = {.kind = PS_PART_FIXED, .num_shards = emb_parts};
  m->emb = ps_get_partitioned_variable(m->g, "emb", PS_DT_FLOAT, &(ps_shape){2, {7, 2}},
                                       &rn, &p, NULL, &st);
  ck_assert_ptr_nonnull(m->emb);
}

/* w, step and the full embedding table, as read from the ps */
static void read_all(model *m, ps_session *s, float *w, int64_t *step, float *emb) {
  ps_status st;
  ps_node *f[8] = {ps_variable_value(m->w), ps_variable_value(m->step)};
  for (int i = 0; i < m->emb->n; i++)
    f[2 + i] = ps_variable_value(m->emb->parts[i]);
  ps_tensor *out[8];
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, f, (size_t)(2 + m->emb->n), NULL, 0, out, &st),
               st);
  memcpy(w, ps_tensor_data(out[0]), 12 * 4);
  *step = *(int64_t *)ps_tensor_data(out[1]);
  size_t off = 0;
  for (int i = 0; i < m->emb->n; i++) {
    memcpy(emb + off, ps_tensor_data(out[2 + i]), ps_tensor_nbytes(out[2 + i]));
    off += ps_tensor_nbytes(out[2 + i]) / 4;
  }
  for (int i = 0; i < 2 + m->emb->n; i++)
    ps_tensor_destroy(out[i]);
}

START_TEST(restore_into_another_cluster_shape) {
  ps_harness h;
  ps_client *c;
  ck_assert_int_eq(start(&h, 2, &c), 0);
  model m;
  build(&m, h.cluster, 3);
  ps_status st;
  ps_session *s = ps_session_create(m.g, c, &st);
  ps_node *init = ps_global_variables_initializer(m.g);
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, &init, 1, NULL, &st), st);
  /* change every value so restore cannot be confused with init */
  ps_node *ups[2] = {
      ps_assign_add(m.step, ps_scalar(m.g, PS_DT_INT64, 41)),
      ps_assign_add(m.w, ps_mul(ps_variable_value(m.w), ps_scalar(m.g, PS_DT_FLOAT, 1)))};
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, NULL, 0, ups, 2, NULL, &st), st);
  float w0[12], emb0[14];
  int64_t step0;
  read_all(&m, s, w0, &step0, emb0);
  ck_assert_int_eq(step0, 41);
  char *written = NULL;
  int64_t bytes = 0;
  PS_ASSERT_OK(ps_client_save(c, "model.ckpt-41", NULL, &written, &bytes, &st), st);
  ck_assert_ptr_nonnull(strstr(written, "model.ckpt-41"));
  ck_assert_int_gt(bytes, 12 * 4 + 14 * 4);
  free(written);
  ps_session_destroy(s);
  ps_graph_destroy(m.g);
  stop(&h, c);

  /* the files: a merged bundle with the embedding as one sliced tensor */
  char prefix[400];
  snprintf(prefix, sizeof prefix, "%s/model.ckpt-41", dir);
  ps_bundle_reader *r = ps_bundle_reader_open(prefix, &st);
  ck_assert_msg(r != NULL, "%s", st.msg);
  ck_assert_int_eq(ps_bundle_reader_num_shards(r), 2);
  const ps_bundle_entry *e = ps_bundle_reader_find(r, "emb");
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->shape.dim[0], 7);
  ck_assert_uint_eq(e->nslices, 3);
  ps_bundle_reader_close(r);
  char state[400], line[400];
  snprintf(state, sizeof state, "%s/checkpoint", dir);
  FILE *f = fopen(state, "r");
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  fclose(f);
  ck_assert_str_eq(line, "model_checkpoint_path: \"model.ckpt-41\"\n");

  /* 3 ps now, the table in 2 parts: restore by name, re-sliced */
  ck_assert_int_eq(start(&h, 3, &c), 0);
  build(&m, h.cluster, 2);
  s = ps_session_create(m.g, c, &st);
  PS_ASSERT_OK(ps_session_create_variables(s, &st), st);
  size_t n = 0;
  PS_ASSERT_OK(ps_client_restore(c, NULL, &n, &st), st);
  ck_assert_uint_eq(n, 4);
  float w1[12], emb1[14];
  int64_t step1;
  read_all(&m, s, w1, &step1, emb1); /* no initializer ever ran */
  ck_assert_int_eq(step1, 41);
  ck_assert_int_eq(memcmp(w0, w1, sizeof w0), 0);
  ck_assert_int_eq(memcmp(emb0, emb1, sizeof emb0), 0);
  /* a rename, as Saver({"dense/kernel": other}) */
  ps_variable *other =
      ps_get_variable(m.g, "other", PS_DT_FLOAT, &(ps_shape){2, {4, 3}}, NULL, NULL, &st);
  PS_ASSERT_OK(ps_session_create_variables(s, &st), st);
  const char *names[1] = {"other"}, *keys[1] = {"dense/kernel"};
  PS_ASSERT_OK(ps_client_restore_vars(c, ps_variable_task(other), "model.ckpt-41", names,
                                      keys, 1, &st),
               st);
  ps_node *ov = ps_variable_value(other);
  ps_tensor *o;
  PS_ASSERT_OK(ps_session_run(s, NULL, 0, &ov, 1, NULL, 0, &o, &st), st);
  ck_assert_int_eq(memcmp(ps_tensor_data(o), w0, sizeof w0), 0);
  ps_tensor_destroy(o);
  /* errors: a missing key names it; a shape mismatch names both */
  const char *missing[1] = {"other"}, *mkeys[1] = {"nope"};
  PS_ASSERT_STATUS(ps_client_restore_vars(c, ps_variable_task(other), "model.ckpt-41",
                                          missing, mkeys, 1, &st),
                   st, PS_NOT_FOUND, "Key nope not found in checkpoint");
  ps_variable *bad =
      ps_get_variable(m.g, "bad", PS_DT_FLOAT, &(ps_shape){2, {3, 4}}, NULL, NULL, &st);
  PS_ASSERT_OK(ps_session_create_variables(s, &st), st);
  const char *bn[1] = {"bad"}, *bk[1] = {"dense/kernel"};
  PS_ASSERT_STATUS(
      ps_client_restore_vars(c, ps_variable_task(bad), "model.ckpt-41", bn, bk, 1, &st),
      st, PS_INVALID_ARGUMENT,
      "the checkpoint has shape [4,3], the variable has shape [3,4]");
  /* a restore of all variables fails as a whole when one is missing */
  PS_ASSERT_STATUS(ps_client_restore(c, "model.ckpt-41", &n, &st), st, PS_NOT_FOUND,
                   "not found in checkpoint");
  /* prefixes that leave the checkpoint directory are refused */
  /* (an uninitialized variable fails a save unless skipped) */
  PS_ASSERT_STATUS(ps_client_save(c, "x", NULL, NULL, NULL, &st), st,
                   PS_FAILED_PRECONDITION, "Attempting to use uninitialized value bad");
  ps_save_options skip = {.skip_uninitialized = true};
  PS_ASSERT_STATUS(ps_client_save(c, "../escape", &skip, NULL, NULL, &st), st,
                   PS_PERMISSION_DENIED, "escapes the checkpoint directory");
  PS_ASSERT_CODE(ps_client_restore(c, "/etc/passwd", &n, &st), st, PS_PERMISSION_DENIED);
  ps_session_destroy(s);
  ps_graph_destroy(m.g);
  stop(&h, c);
}
END_TEST

/* A restore into live variables (read into their own buffers) gives the
 * saved values; a checkpoint corrupted after its save is refused as a
 * whole and leaves every variable as it was. */
START_TEST(restore_in_place_and_corrupt_data) {
  ps_harness h;
  ps_client *c;
  ck_assert_int_eq(start(&h, 1, &c), 0);
  ps_status st;
  ps_init_spec one;
  ps_init_spec_default(&one, PS_INIT_ONES);
  ps_var_spec specs[2] = {
      {.name = "a", .dtype = PS_DT_FLOAT, .shape = {1, {1000}}, .init = &one},
      {.name = "b", .dtype = PS_DT_DOUBLE, .shape = {2, {10, 10}}, .init = &one}};
  PS_ASSERT_OK(ps_client_create_vars(c, 0, specs, 2, &st), st);
  PS_ASSERT_OK(ps_client_initialize(c, 0, NULL, 0, false, NULL, &st), st);
  PS_ASSERT_OK(ps_client_save(c, "p", NULL, NULL, NULL, &st), st);
  /* change both */
  ps_tensor *va = ps_tensor_new(PS_DT_FLOAT, 1, (int64_t[]){1000});
  ps_tensor *vb = ps_tensor_new(PS_DT_DOUBLE, 2, (int64_t[]){10, 10});
  for (int i = 0; i < 1000; i++)
    ((float *)ps_tensor_data(va))[i] = 7.0f;
  for (int i = 0; i < 100; i++)
    ((double *)ps_tensor_data(vb))[i] = 9.0;
  ps_update u[2] = {{.name = "a", .op = PS_ASSIGN, .value = va},
                    {.name = "b", .op = PS_ASSIGN, .value = vb}};
  PS_ASSERT_OK(ps_client_update(c, 0, u, 2, &st), st);
  size_t n = 0;
  PS_ASSERT_OK(ps_client_restore(c, "p", &n, &st), st);
  ck_assert_uint_eq(n, 2);
  ps_read r[2] = {{.name = "a"}, {.name = "b"}};
  PS_ASSERT_OK(ps_client_read(c, 0, r, 2, &st), st);
  for (int i = 0; i < 1000; i++)
    ck_assert_float_eq(((float *)ps_tensor_data(r[0].out))[i], 1.0f);
  for (int i = 0; i < 100; i++)
    ck_assert_double_eq(((double *)ps_tensor_data(r[1].out))[i], 1.0);
  ps_tensor_destroy(r[0].out);
  ps_tensor_destroy(r[1].out);
  /* corrupt one byte of b's data (stored after a's): the restore fails,
   * naming the file, and a keeps its new value too (all or nothing) */
  PS_ASSERT_OK(ps_client_update(c, 0, u, 2, &st), st);
  char data[400];
  snprintf(data, sizeof data, "%s/p.data-00000-of-00001", dir);
  FILE *f = fopen(data, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 4000 + 17, SEEK_SET);
  int ch = fgetc(f);
  fseek(f, 4000 + 17, SEEK_SET);
  fputc(ch ^ 0x40, f);
  fclose(f);
  PS_ASSERT_CODE(ps_client_restore(c, "p", &n, &st), st, PS_DATA_LOSS);
  ck_assert_msg(strstr(st.msg, "data checksum") != NULL && strstr(st.msg, data) != NULL,
                "%s", st.msg);
  ps_read r2[2] = {{.name = "a"}, {.name = "b"}};
  PS_ASSERT_OK(ps_client_read(c, 0, r2, 2, &st), st);
  for (int i = 0; i < 1000; i++)
    ck_assert_float_eq(((float *)ps_tensor_data(r2[0].out))[i], 7.0f);
  for (int i = 0; i < 100; i++)
    ck_assert_double_eq(((double *)ps_tensor_data(r2[1].out))[i], 9.0);
  ps_tensor_destroy(r2[0].out);
  ps_tensor_destroy(r2[1].out);
  ps_tensor_destroy(va);
  ps_tensor_destroy(vb);
  stop(&h, c);
}
END_TEST

typedef struct trainer {
  ps_client *c;
  atomic_int stop;
  int64_t steps;
  double max_pause_ms;
} trainer;

static void *train_loop(void *arg) {
  trainer *t = arg;
  ps_shape s0 = {0};
  ps_tensor *one = ps_tensor_create(PS_DT_INT64, &s0, false);
  *(int64_t *)ps_tensor_data(one) = 1;
  ps_update ux = {.name = "x", .op = PS_ASSIGN_ADD, .value = one};
  ps_update uy = {.name = "y", .op = PS_ASSIGN_ADD, .value = one};
  ps_status st;
  while (!atomic_load(&t->stop)) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (ps_client_update(t->c, 0, &ux, 1, &st) != 0) break; /* x first, on ps/0 */
    if (ps_client_update(t->c, 1, &uy, 1, &st) != 0) break; /* then y, on ps/1 */
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms =
        (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
    if (ms > t->max_pause_ms) t->max_pause_ms = ms;
    t->steps++;
  }
  ps_tensor_destroy(one);
  return NULL;
}

/* While a loop does x += 1 on ps/0 then y += 1 on ps/1, every checkpoint
 * has 0 <= x - y <= 1: both ps were captured at one moment.  One named
 * by x's step holds that x. */
START_TEST(save_during_training_is_consistent) {
  ps_harness h;
  ps_client *c;
  ck_assert_int_eq(start(&h, 2, &c), 0);
  ps_status st;
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_shape s0 = {0};
  ps_var_spec vx = {.name = "x", .dtype = PS_DT_INT64, .shape = s0, .init = &z};
  ps_var_spec vy = {.name = "y", .dtype = PS_DT_INT64, .shape = s0, .init = &z};
  ps_var_spec big = {
      .name = "ballast", .dtype = PS_DT_FLOAT, .shape = {1, {4 << 20}}, .init = &z};
  PS_ASSERT_OK(ps_client_create_vars(c, 0, &vx, 1, &st), st);
  PS_ASSERT_OK(ps_client_create_vars(c, 0, &big, 1, &st), st);
  PS_ASSERT_OK(ps_client_create_vars(c, 1, &vy, 1, &st), st);
  PS_ASSERT_OK(ps_client_initialize(c, 0, NULL, 0, false, NULL, &st), st);
  PS_ASSERT_OK(ps_client_initialize(c, 1, NULL, 0, false, NULL, &st), st);
  trainer t = {.c = c};
  pthread_t th;
  pthread_create(&th, NULL, train_loop, &t);
  for (int k = 0; k < 5; k++) {
    usleep(30000);
    char name[64];
    snprintf(name, sizeof name, "consistent-%d", k);
    PS_ASSERT_OK(ps_client_save(c, name, NULL, NULL, NULL, &st), st);
    char prefix[400];
    snprintf(prefix, sizeof prefix, "%s/%s", dir, name);
    ps_bundle_reader *r = ps_bundle_reader_open(prefix, &st);
    ck_assert_msg(r != NULL, "%s", st.msg);
    int64_t x, y;
    PS_ASSERT_OK(ps_bundle_reader_read_into(r, "x", &x, 8, &st), st);
    PS_ASSERT_OK(ps_bundle_reader_read_into(r, "y", &y, 8, &st), st);
    ps_bundle_reader_close(r);
    ck_assert_msg(x - y >= 0 && x - y <= 1, "checkpoint %d: x=%lld y=%lld", k,
                  (long long)x, (long long)y);
  }
  atomic_store(&t.stop, 1);
  pthread_join(th, NULL);
  ck_assert_int_gt(t.steps, 10);
  /* max_to_keep 5: the first of six is gone */
  PS_ASSERT_OK(ps_client_save(c, "consistent-5", NULL, NULL, NULL, &st), st);
  char p0[400];
  snprintf(p0, sizeof p0, "%s/consistent-0.index", dir);
  ck_assert_int_ne(access(p0, F_OK), 0);
  snprintf(p0, sizeof p0, "%s/consistent-1.index", dir);
  ck_assert_int_eq(access(p0, F_OK), 0);
  fprintf(stderr, "%lld steps, longest step %.1f ms during 6 saves\n", (long long)t.steps,
          t.max_pause_ms);
  trainer t2 = {.c = c};
  pthread_create(&th, NULL, train_loop, &t2);
  /* a Saver of x and y only, under keys of its own: the same invariant,
   * and the ballast (not in its list) is not written */
  ps_graph *g = ps_graph_create();
  ps_variable *gx = NULL, *gy = NULL;
  PS_ASSERT_OK(ps_device_push(g, "/job:ps/task:0", &st), st);
  gx = ps_get_variable(g, "x", PS_DT_INT64, &s0, &z, NULL, &st);
  ps_device_pop(g);
  PS_ASSERT_OK(ps_device_push(g, "/job:ps/task:1", &st), st);
  gy = ps_get_variable(g, "y", PS_DT_INT64, &s0, &z, NULL, &st);
  ps_device_pop(g);
  ck_assert(gx && gy);
  ps_variable *list[2] = {gx, gy};
  const char *keys[2] = {"saved_x", "saved_y"};
  ps_saver_options so = {.var_list = list, .nvars = 2, .keys = keys, .max_to_keep = -1};
  ps_saver *sv = ps_saver_create(g, &so, &st);
  ps_session *sess = ps_session_create(g, c, &st);
  ck_assert(sv && sess);
  for (int k = 0; k < 3; k++) {
    usleep(30000);
    char *written = NULL;
    PS_ASSERT_OK(ps_saver_save(sv, sess, "subset", k, NULL, &written, &st), st);
    ck_assert_ptr_nonnull(strstr(written, "subset-"));
    ps_bundle_reader *r = ps_bundle_reader_open(written, &st); /* the full path */
    free(written);
    ck_assert_msg(r != NULL, "%s", st.msg);
    int64_t x, y;
    float f;
    PS_ASSERT_OK(ps_bundle_reader_read_into(r, "saved_x", &x, 8, &st), st);
    PS_ASSERT_OK(ps_bundle_reader_read_into(r, "saved_y", &y, 8, &st), st);
    PS_ASSERT_CODE(ps_bundle_reader_read_into(r, "ballast", &f, 4, &st), st,
                   PS_NOT_FOUND);
    PS_ASSERT_CODE(ps_bundle_reader_read_into(r, "x", &x, 8, &st), st, PS_NOT_FOUND);
    ps_bundle_reader_close(r);
    ck_assert_msg(x - y >= 0 && x - y <= 1, "subset checkpoint %d: x=%lld y=%lld", k,
                  (long long)x, (long long)y);
  }
  /* named by the step it holds while x moves on: x read in the snapshot */
  for (int k = 0; k < 3; k++) {
    usleep(30000);
    char *written = NULL;
    int64_t named = -1, x = -2;
    PS_ASSERT_OK(
        ps_saver_save_at_step(sv, sess, "stepped", gx, NULL, &written, &named, &st), st);
    char want[64];
    snprintf(want, sizeof want, "/stepped-%lld", (long long)named);
    ck_assert_msg(strstr(written, want) != NULL, "%s, step %lld", written,
                  (long long)named);
    ps_bundle_reader *r = ps_bundle_reader_open(written, &st);
    ck_assert_msg(r != NULL, "%s", st.msg);
    PS_ASSERT_OK(ps_bundle_reader_read_into(r, "saved_x", &x, 8, &st), st);
    ps_bundle_reader_close(r);
    ck_assert_msg(x == named, "%s holds x=%lld", written, (long long)x);
    free(written);
  }
  ps_saver_destroy(sv);
  ps_session_destroy(sess);
  ps_graph_destroy(g);
  atomic_store(&t2.stop, 1);
  pthread_join(th, NULL);
  ck_assert_int_gt(t2.steps, 3);
  stop(&h, c);
}
END_TEST

/* Reaps ps tasks that died (the crash points kill them). */
static void reap_dead(ps_harness *h) {
  for (int i = 0; i < h->nps; i++) {
    int status;
    if (h->pids[i] > 0 && waitpid(h->pids[i], &status, WNOHANG) == h->pids[i])
      h->pids[i] = 0;
  }
}

static const char *const xname[2] = {"x0", "x1"}; /* one on each ps */

static void put_x(ps_client *c, int64_t v, bool create) {
  ps_status st;
  ps_shape s0 = {0};
  ps_tensor *val = ps_tensor_create(PS_DT_INT64, &s0, false);
  *(int64_t *)ps_tensor_data(val) = v;
  for (int t = 0; t < 2; t++) {
    if (create) {
      ps_var_spec vx = {.name = xname[t], .dtype = PS_DT_INT64, .shape = s0};
      PS_ASSERT_OK(ps_client_create_vars(c, t, &vx, 1, &st), st);
    }
    ps_update u = {.name = xname[t], .op = PS_ASSIGN, .value = val};
    PS_ASSERT_OK(ps_client_update(c, t, &u, 1, &st), st);
  }
  ps_tensor_destroy(val);
}

static int64_t get_x(ps_client *c, int t) {
  ps_status st;
  ps_read r = {.name = xname[t]};
  PS_ASSERT_OK(ps_client_read(c, t, &r, 1, &st), st);
  int64_t v = *(int64_t *)ps_tensor_data(r.out);
  ps_tensor_destroy(r.out);
  return v;
}

/* A ps dies (as kill -9) at each point of a save: the save fails, and the
 * previous checkpoint and the state file still restore. */
START_TEST(crash_at_any_point_of_a_save_keeps_the_previous_checkpoint) {
  const char *points[] = {"save_mid_shard", "save_after_shard", "merge_before",
                          "merge_before_state"};
  ps_harness h;
  ps_client *c;
  ps_status st;
  ck_assert_int_eq(start(&h, 2, &c), 0);
  put_x(c, 111, true);
  PS_ASSERT_OK(ps_client_save(c, "good", NULL, NULL, NULL, &st), st);
  stop(&h, c);
  for (size_t k = 0; k < sizeof points / sizeof points[0]; k++) {
    setenv("PS_CRASH_AT", points[k], 1);
    ck_assert_int_eq(start(&h, 2, &c), 0);
    unsetenv("PS_CRASH_AT");
    put_x(c, 222, true);
    char name[64];
    snprintf(name, sizeof name, "bad-%zu", k);
    ck_assert_msg(ps_client_save(c, name, NULL, NULL, NULL, &st) != 0,
                  "%s: save succeeded", points[k]);
    reap_dead(&h);
    for (int i = 0; i < h.nps; i++)
      if (h.pids[i] > 0) {
        kill(h.pids[i], SIGKILL);
        waitpid(h.pids[i], NULL, 0);
        h.pids[i] = 0;
      }
    stop(&h, c);
    /* a fresh cluster restores the latest: the good one */
    ck_assert_int_eq(start(&h, 2, &c), 0);
    ps_shape s0 = {0};
    for (int t = 0; t < 2; t++) {
      ps_var_spec vx = {.name = xname[t], .dtype = PS_DT_INT64, .shape = s0};
      PS_ASSERT_OK(ps_client_create_vars(c, t, &vx, 1, &st), st);
    }
    size_t n = 0;
    ck_assert_msg(ps_client_restore(c, NULL, &n, &st) == 0, "%s: %s", points[k], st.msg);
    ck_assert_int_eq(get_x(c, 0), 111);
    ck_assert_int_eq(get_x(c, 1), 111);
    stop(&h, c);
  }
}
END_TEST

/* The coordinator dies after closing the gates: updates wait, then the
 * gates reopen by themselves and training goes on. */
START_TEST(gates_reopen_when_the_coordinator_dies) {
  ps_harness h;
  ps_client *c;
  ck_assert_int_eq(start(&h, 2, &c), 0);
  put_x(c, 1, true);
  ps_rpc_channel *ch = ps_rpc_channel_create(ps_client_address(c, 0));
  /* SnapshotRequest{id: 99, hold_ms: 800} by hand */
  static const uint8_t snap[] = {0x08, 99, 0x10, 0xa0, 0x06};
  ps_rpc_req r = {.ch = ch,
                  .method = "/paramserver.Ps/Snapshot",
                  .raw_request = snap,
                  .raw_len = sizeof snap,
                  .unary_response = true,
                  .timeout_ms = 10000};
  ps_rpc_run(&r, 1);
  PS_ASSERT_OK(r.st.code, r.st);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  put_x(c, 2, false); /* waits for the gate of ps/0 */
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
  ck_assert_msg(s > 0.3 && s < 5, "update took %.2f s", s);
  ck_assert_int_eq(get_x(c, 0), 2);
  ps_rpc_channel_destroy(ch);
  stop(&h, c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("checkpoint");
  tcase_add_unchecked_fixture(tc, setup_base, teardown_base);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, restore_into_another_cluster_shape);
  tcase_add_test(tc, save_during_training_is_consistent);
  tcase_add_test(tc, crash_at_any_point_of_a_save_keeps_the_previous_checkpoint);
  tcase_add_test(tc, gates_reopen_when_the_coordinator_dies);
  tcase_add_test(tc, restore_in_place_and_corrupt_data);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
