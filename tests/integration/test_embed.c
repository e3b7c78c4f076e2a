/* Integration tests of embedding tables (paramserver/embedding.h): real
 * ps-server processes, the libpsworker client.  Rows made the same on
 * any ps count, keys spread by the documented rule, training with the
 * sparse optimizers, repeated keys, inference lookups, the policies, and
 * every user-facing error with its text, with nothing changed after it. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "paramserver/client.h"
#include "paramserver/embedding.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/session.h"
#include "tests/support/assert.h"

static ps_harness H;
static ps_client *C;
/* The checkpoint tests' scratch directories live under one base made and
 * removed by an unchecked fixture: its teardown runs in Check's parent
 * process, so a failing test leaves nothing behind. */
static char base[256];

static void setup_base(void) {
  harness_scratch_base(base, sizeof base, "embed");
}

static void teardown_base(void) {
  harness_scratch_remove(base);
}

static void setup(void) {
  C = harness_start_client(&H, 2, NULL);
  ck_assert_ptr_nonnull(C);
}

static void teardown(void) {
  ck_assert_int_eq(harness_stop_client(&H, C), 0);
}

static ps_tensor *keys_of(const int64_t *k, int64_t n) {
  ps_shape s = {.rank = 1, .dim = {n}};
  ps_tensor *t = ps_tensor_create(PS_DT_INT64, &s, false);
  ck_assert_ptr_nonnull(t);
  memcpy(ps_tensor_data(t), k, (size_t)n * sizeof *k);
  return t;
}

static ps_tensor *rows_of(int64_t n, int64_t dim, float v) {
  ps_shape s = {.rank = 2, .dim = {n, dim}};
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  ck_assert_ptr_nonnull(t);
  float *f = ps_tensor_data(t);
  for (int64_t i = 0; i < n * dim; i++)
    f[i] = v;
  return t;
}

static ps_tensor *lookup(ps_client *c, const char *name, const ps_tensor *k, bool train) {
  ps_tensor *out = NULL;
  ps_status st;
  PS_ASSERT_OK(ps_client_table_lookup(c, name, k, train, 1, &out, NULL, &st), st);
  return out;
}

static int64_t rows_on(ps_client *c, int task, const char *name, ps_table_info *copy) {
  ps_table_info *v;
  size_t n;
  ps_status st;
  PS_ASSERT_OK(ps_client_table_list(c, task, &v, &n, &st), st);
  int64_t rows = -1;
  for (size_t i = 0; i < n; i++)
    if (strcmp(v[i].name, name) == 0) {
      rows = v[i].rows;
      if (copy) {
        *copy = v[i];
        copy->name = copy->optimizer = NULL;
      }
    }
  ps_client_free_table_info(v, n);
  return rows;
}

START_TEST(rows_are_the_same_on_any_ps_count_and_spread_by_key) {
  ps_table_spec sp;
  ps_table_spec_default(&sp, "emb", 8);
  sp.init.seed = 3;
  ps_status st;
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st);
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st); /* the same spec: fine */
  int64_t k[64];
  for (int i = 0; i < 64; i++)
    k[i] = (int64_t)((uint64_t)i * 0x9E3779B97F4A7C15ull);
  ps_tensor *keys = keys_of(k, 64);
  ps_tensor *two = lookup(C, "emb", keys, true);
  /* each task holds the keys the rule gives it */
  int64_t on0 = 0;
  for (int i = 0; i < 64; i++)
    on0 += ps_table_key_task(k[i], 2) == 0;
  ck_assert_int_eq(rows_on(C, 0, "emb", NULL), on0);
  ck_assert_int_eq(rows_on(C, 1, "emb", NULL), 64 - on0);
  ck_assert(on0 > 10 && on0 < 54);
  /* three other ps tasks make the same rows */
  ps_harness h3;
  ps_client *c3 = harness_start_client(&h3, 3, NULL);
  ck_assert_ptr_nonnull(c3);
  PS_ASSERT_OK(ps_client_table_create(c3, &sp, &st), st);
  ps_tensor *three = lookup(c3, "emb", keys, true);
  ck_assert_mem_eq(ps_tensor_data(two), ps_tensor_data(three), 64 * 8 * sizeof(float));
  ps_tensor_destroy(three);
  ck_assert_int_eq(harness_stop_client(&h3, c3), 0);
  ps_tensor_destroy(two);
  ps_tensor_destroy(keys);
}
END_TEST

START_TEST(adagrad_training_with_repeated_keys) {
  ps_table_spec sp;
  ps_table_spec_default(&sp, "emb", 4);
  sp.optimizer = PS_TABLE_ADAGRAD;
  sp.slot_init = 0.1;
  ps_status st;
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st);
  int64_t k[] = {5, -7, 5, 1LL << 62};
  ps_tensor *keys = keys_of(k, 4);
  ps_table_counts cnt;
  ps_tensor *r0 = NULL;
  PS_ASSERT_OK(ps_client_table_lookup(C, "emb", keys, true, 1, &r0, &cnt, &st), st);
  ck_assert_int_eq(cnt.created, 3);
  const float *w0 = ps_tensor_data(r0);
  ck_assert_mem_eq(w0, w0 + 8, 4 * sizeof(float)); /* key 5 twice: one row */
  ps_tensor *g = rows_of(4, 4, 0.5f);
  double lr = 0.1;
  PS_ASSERT_OK(ps_client_table_update(C, "emb", PS_TABLE_OP_ADAGRAD, keys, g, &lr, 1, 1,
                                      &cnt, &st),
               st);
  ck_assert_int_eq(cnt.missing, 0);
  ps_tensor *r1 = lookup(C, "emb", keys, false);
  const float *w1 = ps_tensor_data(r1);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      double gsum = k[i] == 5 ? 1.0 : 0.5; /* key 5's two gradients summed */
      double acc = 0.1 + gsum * gsum;
      double want = w0[i * 4 + j] - lr * gsum / sqrt(acc);
      ck_assert_msg(fabs(w1[i * 4 + j] - want) < 1e-6, "row %d: %g, want %g", i,
                    w1[i * 4 + j], want);
    }
  ps_tensor_destroy(r0);
  ps_tensor_destroy(r1);
  ps_tensor_destroy(g);
  ps_tensor_destroy(keys);
}
END_TEST

START_TEST(inference_lookups_make_no_rows) {
  ps_table_spec sp;
  ps_table_spec_default(&sp, "emb", 4);
  ps_status st;
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st);
  int64_t k[] = {1, 2, 3};
  ps_tensor *keys = keys_of(k, 3);
  ps_table_counts cnt;
  ps_tensor *a = NULL, *b = NULL;
  PS_ASSERT_OK(ps_client_table_lookup(C, "emb", keys, false, 0, &a, &cnt, &st), st);
  ck_assert_int_eq(cnt.missing, 3);
  ck_assert_int_eq(rows_on(C, 0, "emb", NULL) + rows_on(C, 1, "emb", NULL), 0);
  /* the rows a training lookup then makes are the ones inference read */
  PS_ASSERT_OK(ps_client_table_lookup(C, "emb", keys, true, 0, &b, &cnt, &st), st);
  ck_assert_int_eq(cnt.created, 3);
  ck_assert_mem_eq(ps_tensor_data(a), ps_tensor_data(b), 12 * sizeof(float));
  ps_tensor_destroy(a);
  ps_tensor_destroy(b);
  ps_tensor_destroy(keys);
}
END_TEST

START_TEST(policies_admit_expire_and_evict) {
  ps_table_spec sp;
  ps_table_spec_default(&sp, "adm", 4);
  sp.policy.min_count = 2;
  ps_status st;
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st);
  int64_t k[] = {10, 11, 12, 13};
  ps_tensor *keys = keys_of(k, 4);
  ps_table_counts cnt;
  ps_tensor *r = NULL;
  PS_ASSERT_OK(ps_client_table_lookup(C, "adm", keys, true, 1, &r, &cnt, &st), st);
  ck_assert_int_eq(cnt.created, 0);
  ck_assert_int_eq(cnt.missing, 4);
  PS_ASSERT_OK(ps_client_table_lookup(C, "adm", keys, true, 2, &r, &cnt, &st), st);
  ck_assert_int_eq(cnt.created, 4);
  ps_table_info info;
  int64_t refused = 0;
  for (int t = 0; t < 2; t++) {
    rows_on(C, t, "adm", &info);
    refused += info.refused;
    ck_assert_int_eq(info.policy.min_count, 2);
  }
  ck_assert_int_eq(refused, 4);
  /* expiry by steps */
  ps_table_spec_default(&sp, "ttl", 4);
  sp.policy.ttl_steps = 3;
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st);
  PS_ASSERT_OK(ps_client_table_lookup(C, "ttl", keys, true, 1, &r, &cnt, &st), st);
  ps_tensor *g = rows_of(4, 4, 1.0f);
  PS_ASSERT_OK(ps_client_table_update(C, "ttl", PS_TABLE_OP_SCATTER_ADD, keys, g, NULL, 0,
                                      10, &cnt, &st),
               st);
  ck_assert_int_eq(cnt.missing, 4); /* 9 steps old at step 10: gone */
  /* capacity per ps, least recently used first */
  ps_table_spec_default(&sp, "cap", 4);
  sp.policy.max_rows = 2;
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st);
  int64_t many[40];
  for (int i = 0; i < 40; i++)
    many[i] = 1000 + i;
  ps_tensor *mk = keys_of(many, 40);
  ps_tensor_destroy(r);
  r = NULL;
  PS_ASSERT_OK(ps_client_table_lookup(C, "cap", mk, true, 1, &r, &cnt, &st), st);
  int64_t evicted = 0;
  for (int t = 0; t < 2; t++) {
    ck_assert_int_eq(rows_on(C, t, "cap", &info), 2);
    evicted += info.evicted;
  }
  ck_assert_int_eq(evicted, 36);
  ps_tensor_destroy(r);
  ps_tensor_destroy(g);
  ps_tensor_destroy(mk);
  ps_tensor_destroy(keys);
}
END_TEST

START_TEST(errors_name_the_table_and_change_nothing) {
  ps_table_spec sp;
  ps_table_spec_default(&sp, "emb", 4);
  ps_status st;
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st);
  ps_table_spec other = sp;
  other.dim = 8;
  PS_ASSERT_STATUS(ps_client_table_create(C, &other, &st), st, PS_ALREADY_EXISTS,
                   "TableCreate emb: the table exists with another dim");
  other = sp;
  other.name = "bad";
  other.policy.max_rows = -1;
  PS_ASSERT_STATUS(ps_client_table_create(C, &other, &st), st, PS_INVALID_ARGUMENT,
                   "TableCreate bad: max_rows -1 is out of range (0 to 4294967168)");
  other.policy.max_rows = 0;
  other.policy.min_count = 1 << 20;
  PS_ASSERT_STATUS(ps_client_table_create(C, &other, &st), st, PS_INVALID_ARGUMENT,
                   "TableCreate bad: min_count 1048576 is out of range (0 to 65535)");
  other.policy.min_count = 0;
  other.dtype = PS_DT_DOUBLE;
  PS_ASSERT_STATUS(ps_client_table_create(C, &other, &st), st, PS_INVALID_ARGUMENT,
                   "TableCreate bad: dtype double is not supported");
  int64_t k[] = {1, 2, 3};
  ps_tensor *keys = keys_of(k, 3);
  ps_tensor *before = lookup(C, "emb", keys, true);
  /* keys of another dtype */
  ps_shape s3 = {.rank = 1, .dim = {3}};
  ps_tensor *k32 = ps_tensor_create(PS_DT_INT32, &s3, true);
  ps_tensor *out = NULL;
  PS_ASSERT_STATUS(ps_client_table_lookup(C, "emb", k32, true, 0, &out, NULL, &st), st,
                   PS_INVALID_ARGUMENT, "TableLookup emb: keys must be int64, got int32");
  /* gradient rows of another dim: the ps refuses, nothing changes */
  ps_tensor *g8 = rows_of(3, 8, 1.0f);
  PS_ASSERT_STATUS(ps_client_table_update(C, "emb", PS_TABLE_OP_SCATTER_ADD, keys, g8,
                                          NULL, 0, 0, NULL, &st),
                   st, PS_INVALID_ARGUMENT,
                   "TableUpdate emb: gradient rows have dim 8, the table's dim is 4");
  /* an optimizer the table keeps no slots for */
  ps_tensor *g4 = rows_of(3, 4, 1.0f);
  double lr = 0.1;
  PS_ASSERT_STATUS(ps_client_table_update(C, "emb", PS_TABLE_OP_ADAGRAD, keys, g4, &lr, 1,
                                          0, NULL, &st),
                   st, PS_INVALID_ARGUMENT,
                   "ApplyAdagrad needs a table made for its optimizer");
  /* the wrong number of hyperparameters */
  PS_ASSERT_STATUS(
      ps_client_table_update(C, "emb", PS_TABLE_OP_SGD, keys, g4, NULL, 0, 0, NULL, &st),
      st, PS_INVALID_ARGUMENT,
      "TableUpdate emb: ApplyGradientDescent takes 1 hparams, got 0");
  ps_tensor *after = lookup(C, "emb", keys, false);
  ck_assert_mem_eq(ps_tensor_data(before), ps_tensor_data(after), 12 * sizeof(float));
  /* a table that does not exist */
  PS_ASSERT_STATUS(ps_client_table_lookup(C, "nope", keys, true, 0, &out, NULL, &st), st,
                   PS_NOT_FOUND, "table nope not found");
  ps_tensor_destroy(after);
  ps_tensor_destroy(before);
  ps_tensor_destroy(g4);
  ps_tensor_destroy(g8);
  ps_tensor_destroy(k32);
  ps_tensor_destroy(keys);
}
END_TEST

/* Many keys (chunked on the wire, not inline), from keys of rank 2. */
START_TEST(large_batches_travel_in_chunks) {
  ps_table_spec sp;
  ps_table_spec_default(&sp, "big", 16);
  ps_init_spec_default(&sp.init, PS_INIT_ZEROS);
  ps_status st;
  PS_ASSERT_OK(ps_client_table_create(C, &sp, &st), st);
  enum { N = 50000 };
  ps_shape ks = {.rank = 2, .dim = {N / 10, 10}};
  ps_tensor *keys = ps_tensor_create(PS_DT_INT64, &ks, false);
  int64_t *k = ps_tensor_data(keys);
  for (int i = 0; i < N; i++)
    k[i] = (int64_t)i * 1000003 % 20011; /* repeats */
  ps_shape gs = {.rank = 3, .dim = {N / 10, 10, 16}};
  ps_tensor *g = ps_tensor_create(PS_DT_FLOAT, &gs, false);
  float *gf = ps_tensor_data(g);
  for (int i = 0; i < N * 16; i++)
    gf[i] = 1.0f;
  ps_tensor *r = lookup(C, "big", keys, true);
  ck_assert_int_eq(r->shape.rank, 3);
  ck_assert_int_eq(r->shape.dim[2], 16);
  PS_ASSERT_OK(ps_client_table_update(C, "big", PS_TABLE_OP_SCATTER_ADD, keys, g, NULL, 0,
                                      1, NULL, &st),
               st);
  ps_tensor_destroy(r);
  r = lookup(C, "big", keys, false);
  /* each row holds how often its key came */
  int *times = calloc(20011, sizeof *times);
  for (int i = 0; i < N; i++)
    times[k[i]]++;
  const float *rf = ps_tensor_data(r);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(rf[i * 16 + 15], (float)times[k[i]]);
  free(times);
  ps_tensor_destroy(r);
  ps_tensor_destroy(g);
  ps_tensor_destroy(keys);
}
END_TEST

/* Cluster saves take the tables; a restore brings them back on the same
 * ps count and on another, whole, in part and under another name. */
START_TEST(checkpoints_save_and_restore_tables_on_any_ps_count) {
  char dir[300];
  ck_assert_int_eq(harness_scratch_dir(dir, sizeof dir, base), 0);
  const char *extra[] = {"--checkpoint-dir", dir, NULL};
  ps_harness h2;
  ps_client *c2 = harness_start_client(&h2, 2, extra);
  ck_assert_ptr_nonnull(c2);
  ps_table_spec sp;
  ps_table_spec_default(&sp, "emb", 4);
  sp.optimizer = PS_TABLE_ADAGRAD;
  ps_status st;
  PS_ASSERT_OK(ps_client_table_create(c2, &sp, &st), st);
  enum { N = 300 };
  int64_t k[N];
  for (int i = 0; i < N; i++)
    k[i] = (int64_t)i * 7919 - 1000;
  ps_tensor *keys = keys_of(k, N);
  ps_tensor *g = rows_of(N, 4, 0.5f);
  double lr = 0.1;
  ps_tensor_destroy(lookup(c2, "emb", keys, true));
  PS_ASSERT_OK(ps_client_table_update(c2, "emb", PS_TABLE_OP_ADAGRAD, keys, g, &lr, 1, 1,
                                      NULL, &st),
               st);
  ps_tensor *saved = lookup(c2, "emb", keys, false);
  PS_ASSERT_OK(ps_client_save(c2, "ck", NULL, NULL, NULL, &st), st);
  /* the checkpoint lists the table's tensors, TensorFlow Recommenders-Addons' way */
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s inspect %s/ck 2>&1", harness_prog("PSCTL", "psctl"), dir);
  ck_assert_int_eq(harness_run(cmd, &out), 0);
  const char *want[] = {"emb_mht_1of2-keys", "emb_mht_2of2-values",
                        "emb_mht_1of2-versions", "emb_mht_2of2-freqs",
                        "emb/Adagrad_mht_1of2-values"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_msg(strstr(out, want[i]), "psctl inspect lacks %s:\n%s", want[i], out);
  free(out);
  /* training goes on; the restore brings the saved rows back */
  PS_ASSERT_OK(ps_client_table_update(c2, "emb", PS_TABLE_OP_ADAGRAD, keys, g, &lr, 1, 2,
                                      NULL, &st),
               st);
  int64_t extra_key[1] = {123456789};
  ps_tensor *ek = keys_of(extra_key, 1);
  ps_tensor_destroy(lookup(c2, "emb", ek, true));
  size_t n = 0;
  PS_ASSERT_OK(ps_client_restore(c2, "ck", &n, &st), st);
  ck_assert_int_eq(n, 2); /* the table, on each ps */
  ps_tensor *back = lookup(c2, "emb", keys, false);
  ck_assert_mem_eq(ps_tensor_data(back), ps_tensor_data(saved), N * 4 * sizeof(float));
  ck_assert_int_eq(rows_on(c2, 0, "emb", NULL) + rows_on(c2, 1, "emb", NULL), N);
  ps_tensor_destroy(back);
  /* the accumulators came back too: the same step gives the same rows */
  PS_ASSERT_OK(ps_client_table_update(c2, "emb", PS_TABLE_OP_ADAGRAD, keys, g, &lr, 1, 2,
                                      NULL, &st),
               st);
  ps_tensor *step2 = lookup(c2, "emb", keys, false);
  ck_assert_int_eq(harness_stop_client(&h2, c2), 0);

  /* three ps: each takes the rows of its keys */
  ps_harness h3;
  ps_client *c3 = harness_start_client(&h3, 3, extra);
  ck_assert_ptr_nonnull(c3);
  PS_ASSERT_OK(ps_client_table_create(c3, &sp, &st), st);
  PS_ASSERT_OK(ps_client_restore(c3, "ck", &n, &st), st);
  back = lookup(c3, "emb", keys, false);
  ck_assert_mem_eq(ps_tensor_data(back), ps_tensor_data(saved), N * 4 * sizeof(float));
  ps_tensor_destroy(back);
  for (int t = 0; t < 3; t++) {
    int64_t mine = 0;
    for (int i = 0; i < N; i++)
      mine += ps_table_key_task(k[i], 3) == t;
    ck_assert_int_eq(rows_on(c3, t, "emb", NULL), mine);
  }
  PS_ASSERT_OK(ps_client_table_update(c3, "emb", PS_TABLE_OP_ADAGRAD, keys, g, &lr, 1, 2,
                                      NULL, &st),
               st);
  back = lookup(c3, "emb", keys, false);
  ck_assert_mem_eq(ps_tensor_data(back), ps_tensor_data(step2), N * 4 * sizeof(float));
  ps_tensor_destroy(back);
  /* one table, under another name */
  ps_table_spec other = sp;
  other.name = "renamed";
  PS_ASSERT_OK(ps_client_table_create(c3, &other, &st), st);
  PS_ASSERT_OK(ps_client_table_restore(c3, "renamed", "ck", "emb", &st), st);
  back = lookup(c3, "renamed", keys, false);
  ck_assert_mem_eq(ps_tensor_data(back), ps_tensor_data(saved), N * 4 * sizeof(float));
  ps_tensor_destroy(back);
  /* into a table of another dim: refused on every ps, nothing changes */
  ps_table_spec wide = sp;
  wide.name = "wide";
  wide.dim = 8;
  PS_ASSERT_OK(ps_client_table_create(c3, &wide, &st), st);
  PS_ASSERT_STATUS(
      ps_client_table_restore(c3, "wide", "ck", "emb", &st), st, PS_INVALID_ARGUMENT,
      "restoring table wide from emb_mht_1of2-values: the checkpoint has dim 4, "
      "the table has dim 8");
  for (int t = 0; t < 3; t++)
    ck_assert_int_eq(rows_on(c3, t, "wide", NULL), 0);
  /* a table the checkpoint lacks */
  PS_ASSERT_STATUS(ps_client_table_restore(c3, "wide", "ck", "nope", &st), st,
                   PS_NOT_FOUND, "checkpoint");
  ck_assert_int_eq(harness_stop_client(&h3, c3), 0);
  ps_tensor_destroy(step2);
  ps_tensor_destroy(saved);
  ps_tensor_destroy(ek);
  ps_tensor_destroy(g);
  ps_tensor_destroy(keys);
}
END_TEST

/* A save while training: each ps's part of an update of 1000 keys (over
 * every stripe) is in a checkpoint whole or not at all. */
typedef struct trainer {
  ps_client *c;
  ps_tensor *keys, *g;
  atomic_int stop;
  atomic_int steps;
  char err[256];
} trainer;

static void *train_loop(void *p) {
  trainer *tr = p;
  ps_status st;
  while (!atomic_load(&tr->stop)) {
    if (ps_client_table_update(tr->c, "emb", PS_TABLE_OP_SCATTER_ADD, tr->keys, tr->g,
                               NULL, 0, atomic_load(&tr->steps), NULL, &st) != 0) {
      snprintf(tr->err, sizeof tr->err, "%s", st.msg);
      atomic_store(&tr->stop, 1);
      break;
    }
    atomic_fetch_add(&tr->steps, 1);
  }
  return NULL;
}

START_TEST(saves_while_training_take_whole_updates) {
  char dir[300];
  ck_assert_int_eq(harness_scratch_dir(dir, sizeof dir, base), 0);
  const char *extra[] = {"--checkpoint-dir", dir, NULL};
  ps_harness h;
  ps_client *c = harness_start_client(&h, 2, extra);
  ck_assert_ptr_nonnull(c);
  ps_table_spec sp;
  ps_table_spec_default(&sp, "emb", 2);
  ps_init_spec_default(&sp.init, PS_INIT_ZEROS);
  ps_status st;
  PS_ASSERT_OK(ps_client_table_create(c, &sp, &st), st);
  enum { N = 1000 };
  int64_t k[N];
  for (int i = 0; i < N; i++)
    k[i] = i;
  trainer tr = {.c = c, .keys = keys_of(k, N), .g = rows_of(N, 2, 1.0f)};
  ps_tensor_destroy(lookup(c, "emb", tr.keys, true));
  pthread_t th;
  pthread_create(&th, NULL, train_loop, &tr);
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "s%d", i);
    /* a readiness wait: until the trainer is 5 steps further */
    while (atomic_load(&tr.steps) < 5 * (i + 1) && !atomic_load(&tr.stop))
      nanosleep(&(struct timespec){0, 5000000}, NULL);
    PS_ASSERT_OK(ps_client_save(c, name, NULL, NULL, NULL, &st), st);
  }
  atomic_store(&tr.stop, 1);
  pthread_join(th, NULL);
  ck_assert_msg(tr.err[0] == '\0', "training failed: %s", tr.err);
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "s%d", i);
    PS_ASSERT_OK(ps_client_restore(c, name, NULL, &st), st);
    ps_tensor *r = lookup(c, "emb", tr.keys, false);
    const float *f = ps_tensor_data(r);
    /* per ps, every row alike (one call is one moment); across the two ps
     * a step's two calls may fall on either side of the save */
    float first[2] = {-1, -1};
    for (int j = 0; j < N; j++) {
      int t = ps_table_key_task(k[j], 2);
      if (first[t] < 0) first[t] = f[2 * j];
      ck_assert_msg(f[2 * j] == first[t] && f[2 * j + 1] == first[t],
                    "%s: row %d holds %g, ps/%d's first %g: a torn update", name, j,
                    f[2 * j], t, first[t]);
    }
    ck_assert(first[0] >= 5 * (i + 1) - 1 && fabsf(first[0] - first[1]) <= 1);
    ps_tensor_destroy(r);
  }
  ps_tensor_destroy(tr.keys);
  ps_tensor_destroy(tr.g);
  ck_assert_int_eq(harness_stop_client(&h, c), 0);
}
END_TEST

/* In a graph: a ragged lookup with a combiner, its gradient, and the
 * table update minimize() adds, run by a session on real ps tasks. */
static ps_tensor *i64_tensor(const int64_t *v, int64_t n) {
  return keys_of(v, n);
}

START_TEST(graphs_look_up_combine_and_train_tables) {
  ps_status st;
  ps_graph *g = ps_graph_create();
  ps_table_spec sp;
  ps_table_spec_default(&sp, "gemb", 2);
  ps_init_spec_default(&sp.init, PS_INIT_ZEROS);
  ps_embedding_table *t = ps_get_embedding_table(g, &sp, &st);
  ck_assert_ptr_nonnull(t);
  ck_assert_ptr_eq(ps_get_embedding_table(g, &sp, &st), t); /* the same name: the same */
  ps_node *keys = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "keys");
  ps_node *splits = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "splits");
  ps_node *mean =
      ps_embedding_table_lookup_sparse(t, keys, splits, PS_COMBINER_MEAN, NULL);
  ps_node *sqrtn =
      ps_embedding_table_lookup_sparse(t, keys, splits, PS_COMBINER_SQRTN, NULL);
  ps_node *loss = ps_reduce_sum(mean, PS_ALL_AXES, false);
  ps_optimizer *opt = ps_gradient_descent_optimizer(0.5);
  ps_node *train = ps_optimizer_minimize(opt, g, loss, NULL, NULL, 0, &st);
  ps_optimizer_destroy(opt);
  ck_assert_msg(train != NULL, "%s", st.msg);
  ps_session *s = ps_session_create(g, C, &st);
  ck_assert_ptr_nonnull(s);
  /* example 0 holds keys 5, 6, 5; example 1 key 7; example 2 none */
  int64_t kv[] = {5, 6, 5, 7}, sv[] = {0, 3, 4, 4};
  ps_tensor *kt = i64_tensor(kv, 4), *stt = i64_tensor(sv, 4);
  ps_feed f[2] = {{keys, kt}, {splits, stt}};
  PS_ASSERT_OK(ps_session_run(s, f, 2, NULL, 0, &train, 1, NULL, &st), st);
  /* d loss / d row: 1/3 for each of example 0's keys (5 twice: summed),
   * 1 for key 7 */
  int64_t q[] = {5, 6, 7};
  ps_tensor *qk = keys_of(q, 3);
  ps_tensor *rows = lookup(C, "gemb", qk, false);
  const float *r = ps_tensor_data(rows);
  float want[3] = {-0.5f * 2 / 3, -0.5f / 3, -0.5f};
  for (int i = 0; i < 3; i++) {
    ck_assert_float_eq_tol(r[2 * i], want[i], 1e-6);
    ck_assert_float_eq_tol(r[2 * i + 1], want[i], 1e-6);
  }
  /* the combiners forward: mean and sum / sqrt(count); no keys: zeros */
  ps_node *fetch[2] = {mean, sqrtn};
  ps_tensor *out[2] = {NULL, NULL};
  PS_ASSERT_OK(ps_session_run(s, f, 2, fetch, 2, NULL, 0, out, &st), st);
  const float *m = ps_tensor_data(out[0]), *q2 = ps_tensor_data(out[1]);
  float sum0 = 2 * want[0] + want[1];
  ck_assert_int_eq(out[0]->shape.dim[0], 3);
  ck_assert_float_eq_tol(m[0], sum0 / 3, 1e-6);
  ck_assert_float_eq_tol(m[2], want[2], 1e-6);
  ck_assert_float_eq(m[4], 0);
  ck_assert_float_eq_tol(q2[0], sum0 / sqrtf(3), 1e-6);
  /* ragged splits that do not fit the keys are refused */
  int64_t bad[] = {0, 5};
  ps_tensor *bt = i64_tensor(bad, 2);
  ps_feed fb[2] = {{keys, kt}, {splits, bt}};
  ps_tensor *o1 = NULL;
  PS_ASSERT_STATUS(ps_session_run(s, fb, 2, &mean, 1, NULL, 0, &o1, &st), st,
                   PS_INVALID_ARGUMENT,
                   "row_splits must start at 0 and end at the 4 keys");
  ps_tensor_destroy(bt);
  ps_tensor_destroy(out[0]);
  ps_tensor_destroy(out[1]);
  ps_tensor_destroy(rows);
  ps_tensor_destroy(qk);
  ps_tensor_destroy(kt);
  ps_tensor_destroy(stt);
  ps_session_destroy(s);
  /* a step that is no integer scalar is refused when the graph is built */
  ck_assert_ptr_null(ps_embedding_table_lookup(t, keys, ps_scalar(g, PS_DT_FLOAT, 1.0)));
  ck_assert_str_eq(ps_graph_status(g)->msg,
                   "table gemb: the step must be an int32 or int64 scalar, got float");
  /* an optimizer the table keeps no slots for */
  ps_optimizer *ada = ps_adagrad_optimizer(0.1, 0.1);
  ck_assert_ptr_null(ps_optimizer_minimize(ada, g, loss, NULL, NULL, 0, &st));
  PS_ASSERT_MSG_HAS(st, "minimize: table gemb keeps slots for sgd, which Adagrad cannot");
  ps_optimizer_destroy(ada);
  ps_graph_destroy(g);
}
END_TEST

int main(void) {
  Suite *s = suite_create("embed");
  TCase *tc = tcase_create("embed");
  tcase_add_unchecked_fixture(tc, setup_base, teardown_base);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, rows_are_the_same_on_any_ps_count_and_spread_by_key);
  tcase_add_test(tc, adagrad_training_with_repeated_keys);
  tcase_add_test(tc, inference_lookups_make_no_rows);
  tcase_add_test(tc, policies_admit_expire_and_evict);
  tcase_add_test(tc, errors_name_the_table_and_change_nothing);
  tcase_add_test(tc, large_batches_travel_in_chunks);
  tcase_add_test(tc, checkpoints_save_and_restore_tables_on_any_ps_count);
  tcase_add_test(tc, saves_while_training_take_whole_updates);
  tcase_add_test(tc, graphs_look_up_combine_and_train_tables);
  suite_add_tcase(s, tc);
  return ps_test_run(s);
}
