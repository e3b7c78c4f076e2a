/* bench_embed_threads: does a table scale with the ps's threads?  One
 * embedding table of --rows keys (1M, dim 16, Adagrad) in this process
 * (ps/embed.c, no RPC), then each of --threads threads (1 and 2, or the
 * list given) runs training steps on it at once: a lookup of a Zipf(1.1)
 * batch of 8192 keys and an Adagrad update of the same keys, each thread
 * its own batches, for --seconds (2) per count.  Rows/s over all threads,
 * against one thread.  A table-wide lock would hold the ratio at 1; the
 * stripes (64, a lock each, one held at a time) let it approach the
 * number of cores.  stdout: `bench: embed_threads_rows_per_s' lines. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/init.h"
#include "ps/embed.h"
#include "zipf.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { BATCH = 8192, DIM = 16, BATCHES = 64 };

typedef struct run {
  ps_embed_table *t;
  const int64_t *keys, *ids;
  int id;
  double until;
  long long rows;
  int failed;
} run;

static void *thread_main(void *arg) {
  run *r = arg;
  int64_t *k = malloc(BATCH * sizeof *k);
  float *rows = malloc((size_t)BATCH * DIM * sizeof *rows);
  float *g = malloc((size_t)BATCH * DIM * sizeof *g);
  if (k == NULL || rows == NULL || g == NULL) {
    r->failed = 1;
    goto out;
  }
  for (size_t i = 0; i < (size_t)BATCH * DIM; i++)
    g[i] = 0.01f;
  double lr = ADAGRAD_LR;
  ps_status st;
  ps_embed_counts c;
  for (int64_t s = r->id * 7; now_s() < r->until; s++) {
    const int64_t *ids = r->ids + (s % BATCHES) * BATCH;
    for (int i = 0; i < BATCH; i++)
      k[i] = r->keys[ids[i]];
    if (ps_embed_lookup(r->t, k, BATCH, true, s + 2, rows, &c, &st) != 0 ||
        ps_embed_update(r->t, PS_EMBED_ADAGRAD, k, BATCH, g, &lr, s + 2, &c, &st) != 0) {
      fprintf(stderr, "bench_embed_threads: %s\n", st.msg);
      r->failed = 1;
      break;
    }
    r->rows += BATCH;
  }
out:
  free(k);
  free(rows);
  free(g);
  return NULL;
}

/* Rows/s of @n threads for @secs, or -1. */
static double measure(ps_embed_table *t, const int64_t *keys, const int64_t *ids, int n,
                      double secs) {
  run rs[64];
  pthread_t th[64];
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    rs[i] = (run){.t = t, .keys = keys, .ids = ids, .id = i, .until = t0 + secs};
    if (pthread_create(&th[i], NULL, thread_main, &rs[i]) != 0) return -1;
  }
  long long rows = 0;
  int failed = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    rows += rs[i].rows;
    failed |= rs[i].failed;
  }
  return failed ? -1 : (double)rows / (now_s() - t0);
}

int main(int argc, char **argv) {
  int64_t nrows = 1000000;
  double secs = 2;
  int counts[16] = {1, 2}, ncounts = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--rows"))
      nrows = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--seconds"))
      secs = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads") && ncounts < 16)
      counts[ncounts++] = atoi(argv[i + 1]);
    else {
      fprintf(stderr,
              "usage: bench_embed_threads [--rows N] [--seconds S] [--threads N]...\n");
      return 2;
    }
  }
  if (ncounts == 0) ncounts = 2;
  for (int i = 0; i < ncounts; i++)
    if (counts[i] < 1 || counts[i] > 64) {
      fprintf(stderr, "bench_embed_threads: --threads 1..64\n");
      return 2;
    }
  if (nrows < 1 || secs <= 0) return 2;
  ps_embed_store *es = ps_embed_store_create();
  ps_embed_spec sp = {
      .name = "t", .dtype = PS_DT_FLOAT, .dim = DIM, .optimizer = PS_EMBED_OPT_ADAGRAD};
  ps_init_spec_default(&sp.init, PS_INIT_RANDOM_NORMAL);
  ps_status st;
  bool created;
  int64_t *keys = malloc((size_t)nrows * sizeof *keys);
  int64_t *ids = zipf_ids(nrows, 1.1, BATCHES, BATCH);
  float *out = malloc((size_t)65536 * DIM * sizeof *out);
  if (es == NULL || keys == NULL || ids == NULL || out == NULL ||
      ps_embed_create(es, &sp, &created, &st) != 0)
    return 1;
  ps_embed_table *t = ps_embed_find(es, "t", &st);
  if (t == NULL) return 1;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < nrows; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    keys[i] = (int64_t)(x ^ (x >> 29));
  }
  ps_embed_counts c;
  for (int64_t i = 0; i < nrows; i += 65536) /* every row made first */
    if (ps_embed_lookup(t, keys + i, (size_t)(nrows - i < 65536 ? nrows - i : 65536),
                        true, 1, out, &c, &st) != 0) {
      fprintf(stderr, "bench_embed_threads: %s\n", st.msg);
      return 1;
    }
  double base = 0;
  int rc = 0;
  for (int i = 0; i < ncounts; i++) {
    double r = measure(t, keys, ids, counts[i], secs);
    if (r < 0) {
      rc = 1;
      break;
    }
    if (i == 0) base = r;
    printf("bench: embed_threads_rows_per_s threads=%d %.0f ratio=%.2f (to %d thread%s; "
           "%lld rows, lookup + Adagrad update of batches of %d)\n",
           counts[i], r, r / base, counts[0], counts[0] == 1 ? "" : "s", (long long)nrows,
           BATCH);
  }
  ps_embed_unref(t);
  ps_embed_store_destroy(es);
  free(keys);
  free(ids);
  free(out);
  return rc;
}
