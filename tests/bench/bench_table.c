/* bench_table: an embedding table at recommender scale (issue 25), against
 * raw TCP moving the same bytes in the same pattern, in the same run.
 *
 * The table: --rows distinct 64-bit keys (default 10M, any int64 value),
 * rows of --dim floats (16) with Adagrad's accumulator beside each, on
 * --ps ps tasks (1), filled first by training lookups of every key in
 * batches of 65536.  Then --steps steps (200) per round: a batch of
 * --batch keys (8192) drawn Zipf(--zipf, 1.1) over the keys (zipf.h, the
 * ids bench_ps (d) and ps-lite's side draw), a training lookup of their
 * rows, and a sparse Adagrad update with gradients for every position
 * (repeated keys summed by the client, as TensorFlow's optimizers do).
 *
 * The baseline: a forked peer over raw TCP.  Per step the client finds
 * the batch's distinct keys as ours does (dedup by hash), sends them and
 * receives their rows (a lookup), then sends them with their summed
 * gradients and receives a byte (an update).  The peer does no table
 * work: the floor any transport pays for these bytes.
 *
 * The policies' cost: the same steps on a second table with admission
 * (min_count 2, so filled by two lookups of every key) and expiry by steps
 * (a TTL that expires nothing, but every call sweeps), against the plain
 * table.
 *
 * Memory: the table's bytes (TableList: rows, slots, index) over its rows,
 * less key, row and slot, against the 24 bytes DESIGN.md allows; and the
 * ps's resident set per row.
 *
 * A save's pause (--pause 0 skips it; needs Adagrad): a training loop on
 * its own thread (lookup + update of the table, or gather + sparse Adagrad
 * of a dense variable [rows, dim] with its accumulator on ps 0: the
 * table's bytes) runs from 1 s before to 1 s after a save of the table
 * alone, or of the dense variable alone (ps_save_options.select), twice
 * each in alternating order, into a directory of $TMPDIR (each checkpoint
 * removed after it).  Reported: the longest step that overlapped each
 * kind's save, table against dense (target: no longer), with the saves'
 * durations and the steps' median outside them.
 *
 * --policy 0 leaves the policy table out, --optimizer sgd the accumulator
 * (the scale run: --rows 100000000 --ps 4 --policy 0 --pause 0).
 *
 * Rounds (--rounds 3) interleave ours, the baseline and the policy table;
 * medians are reported.  stdout: `bench: NAME VALUE ...' lines.  Needs
 * PS_SERVER.  Exit 0 when everything ran, 1 when something failed. */
#include <errno.h>
#include <math.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "paramserver/checkpoint.h"
#include "paramserver/client.h"
#include "paramserver/embedding.h"
#include "paramserver/library.h"
#include "steps.h"
#include "tcp.h"
#include "zipf.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return v[n / 2];
}

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

typedef struct opts {
  int64_t rows, dim, batch, steps;
  double zipf;
  int nps, rounds;
  int policy; /* --policy 0: no second table (the scale run) */
  int slots;  /* --optimizer sgd: 0 (no accumulator), else adagrad: 1 */
  int pause;  /* --pause 0: no save-pause phase */
} opts;

/* ---- the baseline's peer: per step, u keys in and u rows out; u keys and
 * u rows in and a byte out ---- */

static void peer_main(int lfd, int64_t dim, int64_t batch) {
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) _exit(1);
  set_nodelay(fd);
  size_t rb = (size_t)dim * sizeof(float);
  uint8_t *buf = calloc((size_t)batch, 8 + rb);
  if (buf == NULL) _exit(1);
  for (;;) {
    uint32_t u;
    char op;
    if (read_full(fd, &op, 1) != 0 || read_full(fd, &u, sizeof u) != 0) _exit(0);
    if (u > batch) _exit(1);
    if (op == 'L') {
      if (read_full(fd, buf, (size_t)u * 8) ||
          write_full(fd, buf + (size_t)batch * 8, (size_t)u * rb))
        _exit(1);
    } else {
      char ack = 1;
      if (read_full(fd, buf, (size_t)u * (8 + rb)) || write_full(fd, &ack, 1)) _exit(1);
    }
  }
}

/* The distinct keys of @k[0..n) into @u (first-seen order), each
 * position's index among them into @slot; returns how many. */
static int64_t distinct(const int64_t *k, int64_t n, int64_t *u, uint32_t *slot,
                        int64_t *tab, size_t cap) {
  memset(tab, 0xff, cap * sizeof *tab);
  int64_t nu = 0;
  for (int64_t i = 0; i < n; i++) {
    size_t h = (size_t)mix((uint64_t)k[i]) & (cap - 1);
    while (tab[h] >= 0 && u[tab[h]] != k[i])
      h = (h + 1) & (cap - 1);
    if (tab[h] < 0) {
      tab[h] = nu;
      u[nu++] = k[i];
    }
    slot[i] = (uint32_t)tab[h];
  }
  return nu;
}

/* One round of the baseline: the lookup and update halves' seconds. */
static int tcp_round(int fd, const opts *o, const int64_t *keys, const int64_t *ids,
                     double *tl, double *tu) {
  size_t cap = 16;
  while (cap < (size_t)o->batch * 2)
    cap *= 2;
  size_t rb = (size_t)o->dim * sizeof(float);
  int64_t *k = malloc((size_t)o->batch * sizeof *k), *u = malloc((size_t)o->batch * 8);
  int64_t *tab = malloc(cap * sizeof *tab);
  uint32_t *slot = malloc((size_t)o->batch * sizeof *slot);
  float *rows = malloc((size_t)o->batch * rb), *out = malloc((size_t)o->batch * rb);
  uint8_t *push = malloc((size_t)o->batch * (8 + rb));
  int rc = k && u && tab && slot && rows && out && push ? 0 : -1;
  double l = 0, w = 0;
  for (int64_t s = 0; s < o->steps && rc == 0; s++) {
    for (int64_t i = 0; i < o->batch; i++)
      k[i] = keys[ids[s * o->batch + i]];
    double t0 = now_s();
    uint32_t nu = (uint32_t)distinct(k, o->batch, u, slot, tab, cap);
    char op = 'L';
    if (write_full(fd, &op, 1) || write_full(fd, &nu, 4) ||
        write_full(fd, u, (size_t)nu * 8) || read_full(fd, rows, (size_t)nu * rb)) {
      rc = -1;
      break;
    }
    for (int64_t i = 0; i < o->batch; i++) /* every position gets its row */
      memcpy(out + i * o->dim, rows + (size_t)slot[i] * (size_t)o->dim, rb);
    double t1 = now_s();
    /* the gradients of each key summed, behind the keys */
    memcpy(push, u, (size_t)nu * 8);
    float *g = (float *)(void *)(push + (size_t)nu * 8);
    memset(g, 0, (size_t)nu * rb);
    for (int64_t i = 0; i < o->batch; i++)
      for (int64_t j = 0; j < o->dim; j++)
        g[(size_t)slot[i] * (size_t)o->dim + (size_t)j] += grad_value(s, j);
    op = 'U';
    char ack;
    if (write_full(fd, &op, 1) || write_full(fd, &nu, 4) ||
        write_full(fd, push, (size_t)nu * (8 + rb)) || read_full(fd, &ack, 1)) {
      rc = -1;
      break;
    }
    double t2 = now_s();
    l += t1 - t0;
    w += t2 - t1;
  }
  *tl = l;
  *tu = w;
  free(k);
  free(u);
  free(tab);
  free(slot);
  free(rows);
  free(out);
  free(push);
  return rc;
}

/* ---- ours ---- */

static int make_table(ps_client *c, const char *name, const opts *o, int64_t min_count,
                      int64_t ttl_steps, ps_status *st) {
  ps_table_spec sp;
  ps_table_spec_default(&sp, name, o->dim);
  sp.optimizer = o->slots ? PS_TABLE_ADAGRAD : PS_TABLE_SGD;
  sp.policy.min_count = min_count;
  sp.policy.ttl_steps = ttl_steps;
  return ps_client_table_create(c, &sp, st);
}

/* Training lookups of every key, @times times. */
static int fill(ps_client *c, const char *name, const opts *o, const int64_t *keys,
                int times, ps_status *st) {
  const int64_t chunk = 65536;
  ps_tensor *out = NULL;
  for (int r = 0; r < times; r++)
    for (int64_t i = 0; i < o->rows; i += chunk) {
      int64_t n = o->rows - i < chunk ? o->rows - i : chunk;
      ps_shape s = {.rank = 1, .dim = {n}};
      ps_tensor *k = ps_tensor_create(PS_DT_INT64, &s, false);
      if (k == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      memcpy(ps_tensor_data(k), keys + i, (size_t)n * 8);
      ps_tensor_destroy(out);
      out = NULL;
      int rc = ps_client_table_lookup(c, name, k, true, 1, &out, NULL, st);
      ps_tensor_destroy(k);
      if (rc != 0) return rc;
      if ((i / chunk) % 32 == 31)
        fprintf(stderr, "bench_table: %s: %lld of %lld keys looked up (pass %d)\n", name,
                (long long)(i + n), (long long)o->rows, r + 1);
    }
  ps_tensor_destroy(out);
  return 0;
}

static int ours_round(ps_client *c, const char *name, const opts *o, const int64_t *keys,
                      const int64_t *ids, double *tl, double *tu, ps_status *st) {
  ps_shape ks = {.rank = 1, .dim = {o->batch}},
           gs = {.rank = 2, .dim = {o->batch, o->dim}};
  ps_tensor *k = ps_tensor_create(PS_DT_INT64, &ks, false);
  ps_tensor *g = ps_tensor_create(PS_DT_FLOAT, &gs, false);
  ps_tensor *rows = NULL;
  if (k == NULL || g == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "oom");
  double l = 0, w = 0, lr = ADAGRAD_LR;
  int rc = 0;
  for (int64_t s = 0; s < o->steps && rc == 0; s++) {
    int64_t *kp = ps_tensor_data(k);
    float *gp = ps_tensor_data(g);
    for (int64_t i = 0; i < o->batch; i++) {
      kp[i] = keys[ids[s * o->batch + i]];
      for (int64_t j = 0; j < o->dim; j++)
        gp[i * o->dim + j] = grad_value(s, j);
    }
    double t0 = now_s();
    if ((rc = ps_client_table_lookup(c, name, k, true, s + 2, &rows, NULL, st)) != 0)
      break;
    double t1 = now_s();
    rc = ps_client_table_update(c, name, o->slots ? PS_TABLE_OP_ADAGRAD : PS_TABLE_OP_SGD,
                                k, g, &lr, 1, s + 2, NULL, st);
    double t2 = now_s();
    l += t1 - t0;
    w += t2 - t1;
  }
  ps_tensor_destroy(rows);
  ps_tensor_destroy(k);
  ps_tensor_destroy(g);
  *tl = l;
  *tu = w;
  return rc;
}

/* ---- a save's pause: the table's steps against a dense variable's ---- */

/* A training loop on its own thread: the table's steps (lookup + Adagrad
 * update of a batch) or the dense variable's (gather of the batch's rows +
 * SparseApplyAdagrad), each step's start and latency recorded. */
typedef struct trainer {
  ps_client *c;
  const opts *o;
  const int64_t *keys, *ids;
  int dense;
  atomic_int stop;
  step_log log;
  int failed;
  ps_status st;
} trainer;

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static int dense_step(trainer *tr, int64_t s, int64_t *u) {
  const opts *o = tr->o;
  int64_t n = 0;
  for (int64_t i = 0; i < o->batch; i++)
    u[n++] = tr->ids[s * o->batch + i];
  qsort(u, (size_t)n, sizeof *u, cmp_i64);
  int64_t m = 0;
  for (int64_t i = 0; i < n; i++)
    if (m == 0 || u[m - 1] != u[i]) u[m++] = u[i];
  ps_shape is = {.rank = 1, .dim = {m}}, gs = {.rank = 2, .dim = {m, o->dim}};
  ps_tensor *ix = ps_tensor_create(PS_DT_INT64, &is, false);
  ps_tensor *g = ps_tensor_create(PS_DT_FLOAT, &gs, false);
  int rc = -1;
  if (ix && g) {
    memcpy(ps_tensor_data(ix), u, (size_t)m * sizeof *u);
    float *gp = ps_tensor_data(g);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < o->dim; j++)
        gp[i * o->dim + j] = grad_value(s, j);
    ps_read r = {.name = "dense", .indices = ix};
    static const char *slots[1] = {"dense/Adagrad"};
    static const double hp[1] = {ADAGRAD_LR};
    ps_update up = {.name = "dense",
                    .op = PS_APPLY_ADAGRAD,
                    .value = g,
                    .indices = ix,
                    .slots = slots,
                    .nslots = 1,
                    .hparams = hp,
                    .nhparams = 1};
    rc = ps_client_read(tr->c, 0, &r, 1, &tr->st);
    ps_tensor_destroy(r.out);
    if (rc == 0) rc = ps_client_update(tr->c, 0, &up, 1, &tr->st);
  } else {
    ps_status_set(&tr->st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  ps_tensor_destroy(ix);
  ps_tensor_destroy(g);
  return rc;
}

static int table_step(trainer *tr, int64_t s, ps_tensor *k, ps_tensor *g) {
  const opts *o = tr->o;
  int64_t *kp = ps_tensor_data(k);
  float *gp = ps_tensor_data(g);
  for (int64_t i = 0; i < o->batch; i++) {
    kp[i] = tr->keys[tr->ids[s * o->batch + i]];
    for (int64_t j = 0; j < o->dim; j++)
      gp[i * o->dim + j] = grad_value(s, j);
  }
  ps_tensor *rows = NULL;
  double lr = ADAGRAD_LR;
  int rc = ps_client_table_lookup(tr->c, "plain", k, true, s + 2, &rows, NULL, &tr->st);
  ps_tensor_destroy(rows);
  if (rc == 0)
    rc = ps_client_table_update(tr->c, "plain", PS_TABLE_OP_ADAGRAD, k, g, &lr, 1, s + 2,
                                NULL, &tr->st);
  return rc;
}

static void *trainer_main(void *arg) {
  trainer *tr = arg;
  const opts *o = tr->o;
  ps_shape ks = {.rank = 1, .dim = {o->batch}},
           gs = {.rank = 2, .dim = {o->batch, o->dim}};
  ps_tensor *k = ps_tensor_create(PS_DT_INT64, &ks, false);
  ps_tensor *g = ps_tensor_create(PS_DT_FLOAT, &gs, false);
  int64_t *u = malloc((size_t)o->batch * sizeof *u);
  if (k == NULL || g == NULL || u == NULL) tr->failed = 1;
  for (int64_t s = 0; !tr->failed && !atomic_load(&tr->stop); s = (s + 1) % o->steps) {
    double t0 = now_s();
    int rc = tr->dense ? dense_step(tr, s, u) : table_step(tr, s, k, g);
    double t1 = now_s();
    if (rc != 0) {
      tr->failed = 1;
      break;
    }
    if (step_log_add(&tr->log, t0, t1 - t0) != 0) {
      tr->failed = 1;
      break;
    }
  }
  ps_tensor_destroy(k);
  ps_tensor_destroy(g);
  free(u);
  return NULL;
}

typedef struct pause_result {
  double max_ms, max_at_ms, save_ms, median_ms; /* the longest step during the save
                                                 (its start from the save's); steps
                                                 outside */
} pause_result;

/* A save of the table, or (@dense) of the dense variable, with its own
 * training loop running from 1 s before to 1 s after it. */
static int save_pause(ps_client *c, const opts *o, const int64_t *keys,
                      const int64_t *ids, int dense, int rep, pause_result *pr,
                      ps_status *st) {
  trainer tr = {.c = c, .o = o, .keys = keys, .ids = ids, .dense = dense};
  pthread_t th;
  if (pthread_create(&th, NULL, trainer_main, &tr) != 0)
    return ps_status_set(st, PS_INTERNAL, "pthread_create failed");
  sleep_s(1.0);
  char prefix[64], *written = NULL;
  snprintf(prefix, sizeof prefix, "pause-%s-%d", dense ? "dense" : "table", rep);
  /* the table alone, or the dense variable and its accumulator alone */
  static const ps_save_item items[2] = {{0, "dense", "dense"},
                                        {0, "dense/Adagrad", "dense/Adagrad"}};
  ps_save_options so = {.select = true, .max_to_keep = -1};
  if (dense) {
    so.items = items;
    so.nitems = 2;
  } else {
    so.tables = true;
  }
  double s0 = now_s();
  int rc = ps_client_save(c, prefix, &so, &written, NULL, st);
  double s1 = now_s();
  sleep_s(1.0);
  atomic_store(&tr.stop, 1);
  pthread_join(th, NULL);
  if (written) {
    ps_status rs;
    if (ps_ckpt_remove(written, &rs) != 0)
      fprintf(stderr, "bench_table: removing %s: %s\n", written, rs.msg);
    free(written);
  }
  if (rc == 0 && tr.failed)
    rc = ps_status_set(st, tr.st.code, "%s step: %s", dense ? "dense" : "table",
                       tr.st.msg);
  memset(pr, 0, sizeof *pr);
  pr->save_ms = (s1 - s0) * 1e3;
  double *out = malloc((tr.log.n ? tr.log.n : 1) * sizeof *out);
  size_t nout = 0, during = 0;
  if (out)
    during = step_log_split(&tr.log, s0, s1, &pr->max_ms, &pr->max_at_ms, out, &nout);
  if (nout) pr->median_ms = median(out, (int)nout);
  if (rc == 0 && (out == NULL || during == 0))
    rc = ps_status_set(st, PS_INTERNAL, "no step overlapped the save");
  free(out);
  step_log_free(&tr.log);
  fprintf(stderr,
          "bench_table: save with %s steps: %.0f ms; longest step during it %.1f ms "
          "(began at %+.0f ms), median outside %.2f ms\n",
          dense ? "dense" : "table", pr->save_ms, pr->max_ms, pr->max_at_ms,
          pr->median_ms);
  return rc;
}

/* The dense variable of the table's bytes: [rows, dim] and its Adagrad
 * accumulator, on ps 0, filled on the ps. */
static int make_dense(ps_client *c, const opts *o, ps_status *st) {
  ps_init_spec ru, acc;
  ps_init_spec_default(&ru, PS_INIT_RANDOM_UNIFORM);
  ps_init_spec_default(&acc, PS_INIT_CONSTANT);
  acc.value = 0.1;
  ps_var_spec v[2] = {{.name = "dense",
                       .dtype = PS_DT_FLOAT,
                       .shape = {2, {o->rows, o->dim}},
                       .init = &ru},
                      {.name = "dense/Adagrad",
                       .dtype = PS_DT_FLOAT,
                       .shape = {2, {o->rows, o->dim}},
                       .init = &acc}};
  int rc = ps_client_create_vars(c, 0, v, 2, st);
  if (rc == 0) rc = ps_client_initialize(c, 0, NULL, 0, false, NULL, st);
  return rc;
}

/* The save-pause measurement: a save of the table while it trains, and
 * one of a dense variable of its bytes while that trains, twice, in
 * alternating order: the longest step of each.  Run while "plain" is the
 * only table (a save of tables takes them all). */
static int save_pause_phase(ps_client *c, const opts *o, const int64_t *keys,
                            const int64_t *ids, ps_status *st) {
  int rc = 0;
  pause_result pr, worst[2] = {{0}};
  double med[2][2] = {{0}};
  double t1 = now_s();
  if ((rc = make_dense(c, o, st)) == 0)
    fprintf(
        stderr,
        "bench_table: dense variable [%lld, %lld] and its accumulator made in %.1f s\n",
        (long long)o->rows, (long long)o->dim, now_s() - t1);
  for (int r = 0; r < 2 && rc == 0; r++)
    for (int k = 0; k < 2 && rc == 0; k++) {
      int dense = k ^ r;
      if ((rc = save_pause(c, o, keys, ids, dense, r, &pr, st)) != 0) break;
      med[dense][r] = pr.median_ms;
      if (pr.max_ms > worst[dense].max_ms) worst[dense] = pr;
    }
  if (rc != 0) {
    fprintf(stderr, "bench_table: save pause: %s\n", st->msg);
  } else {
    printf("bench: table_save_pause_max_ms %.1f (save %.0f ms; steps outside: median "
           "%.2f ms) dense_save_pause_max_ms=%.1f (save %.0f ms; median %.2f ms) "
           "ratio=%.2f target=<= 1 (the longest step of a training loop during a save "
           "of a table of %lld rows, and of a dense variable of its bytes)\n",
           worst[0].max_ms, worst[0].save_ms, (med[0][0] + med[0][1]) / 2,
           worst[1].max_ms, worst[1].save_ms, (med[1][0] + med[1][1]) / 2,
           worst[0].max_ms / worst[1].max_ms, (long long)o->rows);
  }
  return rc;
}

int main(int argc, char **argv) {
  opts o = {.rows = 10000000,
            .dim = 16,
            .batch = 8192,
            .steps = 200,
            .zipf = 1.1,
            .nps = 1,
            .rounds = 3,
            .policy = 1,
            .slots = 1,
            .pause = 1};
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *f = argv[i], *v = argv[i + 1];
    if (!strcmp(f, "--rows"))
      o.rows = atoll(v);
    else if (!strcmp(f, "--dim"))
      o.dim = atoll(v);
    else if (!strcmp(f, "--batch"))
      o.batch = atoll(v);
    else if (!strcmp(f, "--steps"))
      o.steps = atoll(v);
    else if (!strcmp(f, "--zipf"))
      o.zipf = atof(v);
    else if (!strcmp(f, "--ps"))
      o.nps = atoi(v);
    else if (!strcmp(f, "--rounds"))
      o.rounds = atoi(v);
    else if (!strcmp(f, "--policy"))
      o.policy = atoi(v);
    else if (!strcmp(f, "--optimizer"))
      o.slots = strcmp(v, "sgd") != 0;
    else if (!strcmp(f, "--pause"))
      o.pause = atoi(v);
    else {
      fprintf(stderr, "bench_table: unknown option %s\n", f);
      return 2;
    }
  }
  if (o.rows < 1 || o.dim < 1 || o.batch < 1 || o.steps < 1 || o.nps < 1 ||
      o.nps > HARNESS_MAX_PS || o.rounds < 1) {
    fprintf(stderr, "bench_table: bad option values\n");
    return 2;
  }
  int64_t *keys = malloc((size_t)o.rows * sizeof *keys);
  int64_t *ids = zipf_ids(o.rows, o.zipf, (size_t)o.steps, (size_t)o.batch);
  if (keys == NULL || ids == NULL) return 1;
  for (int64_t r = 0; r < o.rows; r++) /* distinct: mix is a bijection */
    keys[r] = (int64_t)mix((uint64_t)r ^ 0x5DEECE66Dull);
  /* the baseline's peer */
  int port, lfd = tcp_listen(&port);
  if (lfd < 0) return 1;
  pid_t peer = fork();
  if (peer == 0) peer_main(lfd, o.dim, o.batch);
  close(lfd);
  int fd = tcp_connect(port);
  /* the save-pause phase saves into a directory of its own */
  const char *tmp = getenv("TMPDIR");
  char dir[256];
  snprintf(dir, sizeof dir, "%s/bench-table-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (o.pause && mkdtemp(dir) == NULL) {
    perror("bench_table: mkdtemp");
    return 1;
  }
  const char *extra[] = {"--checkpoint-dir", dir, NULL};
  ps_harness h;
  ps_client *c = harness_start_client(&h, o.nps, o.pause ? extra : NULL);
  if (c == NULL || fd < 0) return 1;
  ps_status st;
  int rc = 0;
  double t0 = now_s();
  if ((rc = make_table(c, "plain", &o, 0, 0, &st)) == 0)
    rc = fill(c, "plain", &o, keys, 1, &st);
  double fill_s = now_s() - t0;
  /* memory at --rows rows */
  int64_t rows = 0, bytes = 0;
  long long rss = 0;
  for (int t = 0; t < o.nps && rc == 0; t++) {
    ps_table_info *v;
    size_t n;
    if ((rc = ps_client_table_list(c, t, &v, &n, &st)) != 0) break;
    for (size_t i = 0; i < n; i++)
      if (!strcmp(v[i].name, "plain")) rows += v[i].rows, bytes += v[i].bytes;
    ps_client_free_table_info(v, n);
    long long peak;
    rss += harness_rss(h.pids[t], &peak);
  }
  if (rc == 0 && o.pause && o.slots) rc = save_pause_phase(c, &o, keys, ids, &st);
  if (rc == 0 && o.policy && (rc = make_table(c, "policy", &o, 2, 1000000000, &st)) == 0)
    rc = fill(c, "policy", &o, keys, 2, &st);
  double *ol = calloc((size_t)o.rounds * 6, sizeof *ol);
  double *ou = ol + o.rounds, *bl = ol + 2 * o.rounds, *bu = ol + 3 * o.rounds;
  double *pl = ol + 4 * o.rounds, *pu = ol + 5 * o.rounds;
  for (int r = 0; r < o.rounds && rc == 0; r++) {
    if ((rc = ours_round(c, "plain", &o, keys, ids, &ol[r], &ou[r], &st)) != 0) break;
    if (tcp_round(fd, &o, keys, ids, &bl[r], &bu[r]) != 0) {
      rc = ps_status_set(&st, PS_INTERNAL, "the TCP baseline failed");
      break;
    }
    if (o.policy) rc = ours_round(c, "policy", &o, keys, ids, &pl[r], &pu[r], &st);
    fprintf(stderr,
            "bench_table: round %d: lookup %.3f s (tcp %.3f), update %.3f s (tcp %.3f), "
            "policy step %.3f s\n",
            r + 1, ol[r], bl[r], ou[r], bu[r], pl[r] + pu[r]);
  }
  if (rc != 0) {
    fprintf(stderr, "bench_table: %s\n", st.msg);
  } else {
    double n = (double)o.steps * (double)o.batch;
    double steps_plain[64], steps_policy[64];
    for (int r = 0; r < o.rounds && r < 64; r++) {
      steps_plain[r] = ol[r] + ou[r];
      steps_policy[r] = pl[r] + pu[r];
    }
    double mol = median(ol, o.rounds), mou = median(ou, o.rounds);
    double mbl = median(bl, o.rounds), mbu = median(bu, o.rounds);
    double sp = median(steps_plain, o.rounds < 64 ? o.rounds : 64);
    double sq = median(steps_policy, o.rounds < 64 ? o.rounds : 64);
    double slot = 8.0 + 4.0 * (double)o.dim * (o.slots ? 2 : 1); /* key, row, slot */
    printf("bench: table_fill_rows_per_s %.0f (%lld rows in %.1f s)\n",
           (double)rows / fill_s, (long long)rows, fill_s);
    printf("bench: table_lookup_rows_per_s %.0f baseline_tcp=%.0f ratio=%.2f\n", n / mol,
           n / mbl, mbl / mol);
    printf("bench: table_update_rows_per_s %.0f baseline_tcp=%.0f ratio=%.2f\n", n / mou,
           n / mbu, mbu / mou);
    printf("bench: table_step_ms %.3f baseline_tcp=%.3f\n", sp / (double)o.steps * 1e3,
           (mbl + mbu) / (double)o.steps * 1e3);
    printf("bench: table_overhead_bytes_per_row %.1f target=<= 24 (table bytes %lld over "
           "%lld rows, less %.0f of key, row and slot)\n",
           rows ? (double)bytes / (double)rows - slot : 0, (long long)bytes,
           (long long)rows, slot);
    printf("bench: table_rss_bytes_per_row %.1f (every ps's resident set, both tables "
           "not yet: after the first fill)\n",
           rows ? (double)rss / (double)rows : 0);
    if (o.policy)
      printf(
          "bench: table_policy_step_ratio %.3f target=<= 1.15 (admission + expiry sweep "
          "against none)\n",
          sq / sp);
  }
  if (o.pause) { /* the saves are removed; their state file is left */
    char f[300];
    snprintf(f, sizeof f, "%s/checkpoint", dir);
    unlink(f);
    if (rmdir(dir) != 0)
      fprintf(stderr, "bench_table: rmdir %s: %s\n", dir, strerror(errno));
  }
  free(ol);
  close(fd);
  kill(peer, SIGTERM);
  waitpid(peer, NULL, 0);
  harness_stop_client(&h, c);
  free(keys);
  free(ids);
  return rc ? 1 : 0;
}
