/* The cost of replication (issue 23): the same three workloads on two
 * 2-ps clusters started side by side from the same ps-server build, one
 * unreplicated (R=1, the baseline) and one with --replicas 2 on a local
 * etcd (shard 0's primary ps/0, its in-sync backup ps/1).  The two are
 * measured interleaved (alternating repetitions, steps or blocks of calls)
 * so that drift on a shared machine hits both alike; only ratios are
 * reported, never absolute targets:
 *   repl_assign_64MiB  GB/s of a dense 64 MiB assign,  R=2 >= 0.5 x R=1;
 *   repl_sparse_step   ms of a gather + scatter-add of 8192 Zipf(1.1) ids
 *                      on a 1M x 64 float table (bench_ps's (d)),
 *                      R=2 <= 1.6 x R=1;
 *   repl_assign_add    median us of a scalar assign_add round trip,
 *                      R=2 <= R=1 + one loopback RTT + 30 us (the RTT a
 *                      raw TCP 1-byte ping-pong, measured in the same run).
 * stdout: one `bench: NAME VALUE UNIT baseline=B ratio=R target=OP T'
 * line each (repl_assign_add also prints rtt= and bound=); detail on
 * stderr.  Options: --reps N (dense, default 7), --steps N (sparse,
 * default 40), --iters N (scalar calls per cluster, default 3000),
 * --rows N (default 1048576). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "paramserver/client.h"
#include "paramserver/library.h"
#include "tcp.h"
#include "zipf.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int fail(const char *what, int r, const ps_status *st) {
  fprintf(stderr, "bench: R=%d %s failed: %s\n", r, what, st->msg);
  return -1;
}

/* One cluster: its ps tasks and a client that routes by the view. */
typedef struct cluster {
  int r;
  ps_harness h;
  ps_client *c;
} cluster;

static int cluster_start(cluster *k, int r, const char *etcd, const char *job) {
  const char *rep[] = {"--replicas", "2", "--etcd", etcd, "--repl-job", job, NULL};
  k->r = r;
  /* the same fixed ports for both (R=2's tasks reach each other at the
   * spec's addresses) */
  harness_opts ho = {.fixed_ports = 1};
  if (harness_start_opts(&k->h, 2, r == 2 ? rep : NULL, &ho) != 0) return -1;
  ps_client_options o;
  ps_client_options_default(&o);
  if (r == 2) {
    o.replicas = 2;
    o.etcd = etcd;
    o.repl_job = job;
  }
  ps_status st;
  k->c = ps_client_create(k->h.cluster, "ps", &o, &st);
  if (!k->c) return fail("client", r, &st);
  return 0;
}

/* The R=2 cluster's shard 0 must still be on two in-sync replicas, in the
 * view it started with: after a failover the figures would be R=1's. */
static int still_replicated(cluster *k, int64_t epoch0, const char *part) {
  ps_shard_replicas sr;
  ps_status st;
  if (ps_client_shard_replicas(k->c, 0, &sr, &st) != 0)
    return fail("shard replicas", 2, &st);
  if (sr.n == 2 && sr.state[1] == PS_SHARD_BACKUP && sr.epoch == epoch0) return 0;
  fprintf(stderr,
          "bench: R=2 shard 0 is no longer on 2 in-sync replicas after the %s part (view "
          "epoch %lld, was %lld; %d replicas): its figures would not be R=2's\n",
          part, (long long)sr.epoch, (long long)epoch0, sr.n);
  return -1;
}

/* Dense: one repetition of a 64 MiB assign; returns GB/s or < 0. */
static double dense_once(cluster *k, ps_tensor *val) {
  ps_status st;
  ps_update up = {.name = "big", .op = PS_ASSIGN, .value = val};
  double t0 = now_s();
  if (ps_client_update(k->c, 0, &up, 1, &st) != 0) return fail("assign big", k->r, &st);
  return (double)ps_tensor_nbytes(val) / (now_s() - t0) / 1e9;
}

static int bench_dense(cluster *k, int reps) {
  int64_t n = (int64_t)(64 << 20) / 4;
  ps_var_spec spec = {
      .name = "big", .dtype = PS_DT_FLOAT, .shape = {.rank = 1, .dim = {n}}};
  ps_tensor *val = ps_tensor_new(PS_DT_FLOAT, 1, &n);
  double *v[2] = {calloc((size_t)reps, sizeof(double)),
                  calloc((size_t)reps, sizeof(double))};
  int rc = -1;
  ps_status st;
  if (!val || !v[0] || !v[1]) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  float *pv = ps_tensor_data(val);
  for (int64_t i = 0; i < n; i++)
    pv[i] = (float)(i % 4099);
  for (int j = 0; j < 2; j++) {
    if (ps_client_create_vars(k[j].c, 0, &spec, 1, &st) != 0) {
      fail("create big", k[j].r, &st);
      goto out;
    }
    if (dense_once(&k[j], val) < 0) goto out; /* warm-up */
  }
  for (int i = 0; i < reps; i++)
    for (int jj = 0; jj < 2; jj++) {
      int j = (i + jj) % 2;
      if ((v[j][i] = dense_once(&k[j], val)) < 0) goto out;
    }
  double m0 = median(v[0], (size_t)reps), m1 = median(v[1], (size_t)reps);
  fprintf(
      stderr,
      "  dense 64 MiB assign: R=1 %.2f GB/s (%.2f..%.2f), R=2 %.2f GB/s (%.2f..%.2f)\n",
      m0, v[0][0], v[0][reps - 1], m1, v[1][0], v[1][reps - 1]);
  printf("bench: repl_assign_64MiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= 0.5\n",
         m1, m0, m1 / m0);
  rc = 0;
out:
  ps_tensor_destroy(val);
  free(v[0]);
  free(v[1]);
  return rc;
}

static int bench_sparse(cluster *k, int64_t rows, int steps) {
  const int64_t dim = 64, b = 8192;
  const size_t warm = 5, nall = warm + (size_t)steps;
  int64_t *ids = zipf_ids(rows, 1.1, nall, (size_t)b);
  int64_t gd[2] = {b, dim};
  ps_tensor *ix = ps_tensor_new(PS_DT_INT64, 1, &b),
            *gt = ps_tensor_new(PS_DT_FLOAT, 2, gd),
            *out = ps_tensor_new(PS_DT_FLOAT, 2, gd);
  double *v[2] = {calloc(nall, sizeof(double)), calloc(nall, sizeof(double))};
  int rc = -1;
  ps_status st;
  if (!ids || !ix || !gt || !out || !v[0] || !v[1]) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_var_spec spec = {.name = "emb",
                      .dtype = PS_DT_FLOAT,
                      .shape = {.rank = 2, .dim = {rows, dim}},
                      .init = &z};
  const char *nm = "emb";
  for (int j = 0; j < 2; j++)
    if (ps_client_create_vars(k[j].c, 0, &spec, 1, &st) != 0 ||
        ps_client_initialize(k[j].c, 0, &nm, 1, false, NULL, &st) != 0) {
      fail("create emb", k[j].r, &st);
      goto out;
    }
  for (size_t i = 0; i < nall; i++) {
    float *g = ps_tensor_data(gt);
    for (int64_t q = 0; q < b * dim; q++)
      g[q] = grad_value((int64_t)i, q);
    memcpy(ps_tensor_data(ix), ids + i * (size_t)b, (size_t)b * sizeof *ids);
    for (int jj = 0; jj < 2; jj++) {
      int j = (int)((i + (size_t)jj) % 2);
      ps_read r = {.name = "emb", .indices = ix, .out = out};
      ps_update u = {.name = "emb", .op = PS_SCATTER_ADD, .value = gt, .indices = ix};
      double t0 = now_s();
      if (ps_client_read(k[j].c, 0, &r, 1, &st) != 0) {
        fail("sparse pull", k[j].r, &st);
        goto out;
      }
      if (ps_client_update(k[j].c, 0, &u, 1, &st) != 0) {
        fail("sparse push", k[j].r, &st);
        goto out;
      }
      v[j][i] = (now_s() - t0) * 1e3;
    }
  }
  double m0 = median(v[0] + warm, (size_t)steps), m1 = median(v[1] + warm, (size_t)steps);
  fprintf(stderr,
          "  sparse step (%lld x 64, 8192 Zipf(1.1) ids): R=1 %.2f ms (%.2f..%.2f), "
          "R=2 %.2f ms (%.2f..%.2f)\n",
          (long long)rows, m0, v[0][warm], v[0][nall - 1], m1, v[1][warm],
          v[1][nall - 1]);
  printf("bench: repl_sparse_step %.2f ms baseline=%.2f ratio=%.2f target=<= 1.6\n", m1,
         m0, m1 / m0);
  rc = 0;
out:
  free(ids);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(gt);
  ps_tensor_destroy(out);
  free(v[0]);
  free(v[1]);
  return rc;
}

/* Median us of @n 1-byte ping-pongs with the echo child on @fd. */
static double tcp_rtt(int fd, size_t n, double *v) {
  char c = 'p';
  for (size_t i = 0; i < n; i++) {
    double t0 = now_s();
    if (write_full(fd, &c, 1) != 0 || read_full(fd, &c, 1) != 0) return -1;
    v[i] = (now_s() - t0) * 1e6;
  }
  return median(v, n);
}

static int bench_scalar(cluster *k, int fd, int iters) {
  const size_t block = 100, n = (size_t)iters;
  double *v[3] = {calloc(n, sizeof(double)), calloc(n, sizeof(double)),
                  calloc(n, sizeof(double))};
  ps_tensor *one = ps_tensor_new(PS_DT_FLOAT, 0, NULL);
  int rc = -1;
  ps_status st;
  if (!v[0] || !v[1] || !v[2] || !one) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  ps_var_spec spec = {.name = "scalar", .dtype = PS_DT_FLOAT};
  *(float *)ps_tensor_data(one) = 1.0f;
  ps_update up = {.name = "scalar", .op = PS_ASSIGN_ADD, .value = one};
  for (int j = 0; j < 2; j++) {
    ps_update a = {.name = "scalar", .op = PS_ASSIGN, .value = one};
    if (ps_client_create_vars(k[j].c, 0, &spec, 1, &st) != 0 ||
        ps_client_update(k[j].c, 0, &a, 1, &st) != 0) {
      fail("create scalar", k[j].r, &st);
      goto out;
    }
    for (int w = 0; w < 200; w++)
      if (ps_client_update(k[j].c, 0, &up, 1, &st) != 0) {
        fail("assign_add scalar", k[j].r, &st);
        goto out;
      }
  }
  double rtt[200];
  if (tcp_rtt(fd, 200, rtt) < 0) goto tcpfail;
  /* blocks of 100 calls: R=1, R=2, TCP, rotating */
  for (size_t base = 0, blk = 0; base < n; base += block, blk++) {
    size_t m = n - base < block ? n - base : block;
    for (size_t jj = 0; jj < 3; jj++) {
      size_t j = (blk + jj) % 3;
      if (j == 2) {
        if (tcp_rtt(fd, m, rtt) < 0) goto tcpfail;
        memcpy(v[2] + base, rtt, m * sizeof *rtt); /* sorted, fine for a median */
        continue;
      }
      for (size_t i = 0; i < m; i++) {
        double t0 = now_s();
        if (ps_client_update(k[j].c, 0, &up, 1, &st) != 0) {
          fail("assign_add scalar", k[j].r, &st);
          goto out;
        }
        v[j][base + i] = (now_s() - t0) * 1e6;
      }
    }
  }
  for (int j = 0; j < 2; j++) { /* every add applied exactly once */
    ps_read rd = {.name = "scalar"};
    if (ps_client_read(k[j].c, 0, &rd, 1, &st) != 0) {
      fail("read scalar", k[j].r, &st);
      goto out;
    }
    float got = *(float *)ps_tensor_data(rd.out), want = (float)(1 + 200 + n);
    ps_tensor_destroy(rd.out);
    if (got != want) {
      fprintf(stderr, "bench: R=%d scalar is %g, not %g\n", k[j].r, (double)got,
              (double)want);
      goto out;
    }
  }
  double m0 = median(v[0], n), m1 = median(v[1], n), mr = median(v[2], n);
  double bound = m0 + mr + 30.0;
  fprintf(stderr,
          "  scalar assign_add: R=1 median %.1f us (p90 %.1f), R=2 median %.1f us (p90 "
          "%.1f), "
          "loopback 1-byte RTT %.1f us; bound R=1 + RTT + 30 = %.1f us\n",
          m0, v[0][n * 9 / 10], m1, v[1][n * 9 / 10], mr, bound);
  printf(
      "bench: repl_assign_add %.1f us baseline=%.1f ratio=%.2f target=<= %.2f rtt=%.1f "
      "bound=%.1f\n",
      m1, m0, m1 / m0, bound / m0, mr, bound);
  rc = 0;
  goto out;
tcpfail:
  fprintf(stderr, "bench: tcp ping-pong failed\n");
out:
  free(v[0]);
  free(v[1]);
  free(v[2]);
  ps_tensor_destroy(one);
  return rc;
}

static void echo_child(int lfd) {
  int fd = accept(lfd, NULL, NULL);
  close(lfd);
  if (fd < 0) _exit(1);
  set_nodelay(fd);
  char c;
  while (read_full(fd, &c, 1) == 0)
    if (write_full(fd, &c, 1) != 0) _exit(1);
  _exit(0);
}

static int arg_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  int reps = 7, steps = 40, iters = 3000, rows = 1 << 20;
  for (int i = 1; i < argc; i++) {
    int *dst = !strcmp(argv[i], "--reps")    ? &reps
               : !strcmp(argv[i], "--steps") ? &steps
               : !strcmp(argv[i], "--iters") ? &iters
               : !strcmp(argv[i], "--rows")  ? &rows
                                             : NULL;
    if (!dst || i + 1 >= argc || arg_int(argv[++i], 1, 1 << 24, dst) != 0) {
      fprintf(stderr,
              "usage: bench_repl [--reps N] [--steps N] [--iters N] [--rows N]\n");
      return 2;
    }
  }
  double t_start = now_s();
  int port, lfd = tcp_listen(&port);
  if (lfd < 0) {
    perror("bench: tcp listen");
    return 1;
  }
  pid_t echo = fork();
  if (echo < 0) {
    perror("bench: fork");
    return 1;
  }
  if (echo == 0) echo_child(lfd);
  close(lfd);
  int tfd = tcp_connect(port);
  ps_harness_etcd e = {0};
  cluster k[2] = {0};
  int rc = 1;
  char job[64];
  snprintf(job, sizeof job, "bench-repl-%d", (int)getpid());
  ps_library_init();
  if (tfd < 0) {
    perror("bench: tcp connect");
    goto out;
  }
  if (ps_harness_etcd_start(&e, 1) != 0 ||
      cluster_start(&k[0], 1, e.endpoints, job) != 0 ||
      cluster_start(&k[1], 2, e.endpoints, job) != 0)
    goto out;
  fprintf(stderr, "bench: R=1 ps on %s, %s; R=2 ps on %s, %s (etcd %s)\n",
          k[0].h.addrs[0], k[0].h.addrs[1], k[1].h.addrs[0], k[1].h.addrs[1],
          e.endpoints);
  ps_shard_replicas sr;
  ps_status st;
  if (ps_client_shard_replicas(k[1].c, 0, &sr, &st) != 0) {
    fail("shard replicas", 2, &st);
    goto out;
  }
  if (bench_dense(k, reps) == 0 && still_replicated(&k[1], sr.epoch, "dense") == 0 &&
      bench_sparse(k, rows, steps) == 0 &&
      still_replicated(&k[1], sr.epoch, "sparse") == 0 &&
      bench_scalar(k, tfd, iters) == 0 &&
      still_replicated(&k[1], sr.epoch, "scalar") == 0)
    rc = 0;
out:
  for (int j = 0; j < 2; j++) {
    if (k[j].c) ps_client_destroy(k[j].c);
    if (k[j].h.nps > 0 && harness_stop(&k[j].h) != 0) {
      fprintf(stderr, "bench: R=%d ps-server did not stop cleanly\n", j + 1);
      rc = 1;
    }
  }
  ps_harness_etcd_stop(&e);
  ps_library_shutdown();
  if (tfd >= 0) close(tfd);
  int status;
  kill(echo, SIGTERM);
  waitpid(echo, &status, 0);
  fprintf(stderr, "bench: %s in %.1f s\n", rc ? "FAILED" : "done", now_s() - t_start);
  return rc;
}
