/* bench_agg: the aggregate throughput of 2 ps tasks serving 2 workers at
 * once, against raw TCP with the same pattern, measured in the same run.
 *
 * Each worker (a process of its own, this program run with --worker) holds
 * one --mib MiB float32 variable on each ps.  A push phase: every worker
 * assigns its value to both of its variables, the two ps in parallel
 * (ps_client_update_many), --reps times; a pull phase reads both back
 * (ps_client_read_many) into reused tensors.  The baseline phases do the
 * same over raw TCP against two forked peers (one per "ps"): the same
 * bytes out and an ack back, or a request byte out and the bytes back,
 * each peer served by its own thread in the worker, as the ps client
 * serves each task at once.  Nothing is pinned: 2 servers, 2 workers and
 * their threads share the machine's CPUs, as in a job.
 *
 * Phases start together: each worker says "ready" on stdout, and blocks on
 * a FIFO until this process has both ready and lets them go.  A phase's
 * aggregate is all bytes moved by both workers over the longer of their
 * two times.  The four phases (tcp push, ps push, tcp pull, ps pull) run
 * in --rounds interleaved rounds; the medians are reported.
 *
 * stdout: `bench: agg_push_NMiB V GB/s baseline=B ratio=R target=>= 0.8'
 * and the same for agg_pull.  Exit status 0 when everything ran, 1 when
 * something failed, 2 for a bad option.  Needs PS_SERVER. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "harness.h"
#include "paramserver/client.h"
#include "paramserver/library.h"
#include "tcp.h"

#define NPS 2
#define NWORKERS 2
#define NPHASES 4
static const char *const phase_name[NPHASES] = {"tcp_push", "ps_push", "tcp_pull",
                                                "ps_pull"};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- TCP peer (forked): per connection, 'W' reads @n bytes and acks,
 * 'R' sends @n bytes; EOF ends the connection ---- */

typedef struct peer_conn {
  int fd;
  size_t n;
} peer_conn;

static void *peer_serve(void *arg) {
  peer_conn *pc = arg;
  char *buf = malloc(pc->n);
  if (buf != NULL) {
    memset(buf, 1, pc->n);
    char cmd;
    while (read_full(pc->fd, &cmd, 1) == 0) {
      if (cmd == 'W'
              ? read_full(pc->fd, buf, pc->n) != 0 || write_full(pc->fd, "k", 1) != 0
              : write_full(pc->fd, buf, pc->n) != 0)
        break;
    }
  }
  free(buf);
  close(pc->fd);
  return NULL;
}

static void peer_main(int lfd, size_t n) {
  pthread_t th[NWORKERS];
  peer_conn pc[NWORKERS];
  int k = 0;
  for (; k < NWORKERS; k++) {
    pc[k].fd = accept(lfd, NULL, NULL);
    pc[k].n = n;
    if (pc[k].fd < 0 || pthread_create(&th[k], NULL, peer_serve, &pc[k]) != 0) break;
    set_nodelay(pc[k].fd);
  }
  for (int i = 0; i < k; i++)
    pthread_join(th[i], NULL);
  _exit(0);
}

/* ---- worker ---- */

typedef struct tcp_job {
  int fd, reps;
  char cmd;
  char *buf;
  size_t n;
  int rc;
} tcp_job;

static void *tcp_run(void *arg) {
  tcp_job *j = arg;
  char ack;
  for (int r = 0; r < j->reps && j->rc == 0; r++) {
    if (write_full(j->fd, &j->cmd, 1) != 0 ||
        (j->cmd == 'W'
             ? write_full(j->fd, j->buf, j->n) != 0 || read_full(j->fd, &ack, 1) != 0
             : read_full(j->fd, j->buf, j->n) != 0))
      j->rc = -1;
  }
  return NULL;
}

static int tcp_phase(const int *fds, char cmd, char *const *bufs, size_t n, int reps) {
  pthread_t th[NPS];
  tcp_job j[NPS];
  for (int t = 0; t < NPS; t++) {
    j[t] = (tcp_job){.fd = fds[t], .reps = reps, .cmd = cmd, .buf = bufs[t], .n = n};
    if (pthread_create(&th[t], NULL, tcp_run, &j[t]) != 0) return -1;
  }
  int rc = 0;
  for (int t = 0; t < NPS; t++) {
    pthread_join(th[t], NULL);
    rc |= j[t].rc;
  }
  return rc;
}

static int worker_fail(const char *what, const ps_status *st) {
  fprintf(stderr, "bench_agg worker: %s: %s\n", what, st ? st->msg : "failed");
  return 1;
}

/* --worker IDX SPEC FIFO MIB REPS PORT0 PORT1 */
static int worker_main(char **a) {
  int idx = atoi(a[0]), reps = atoi(a[4]);
  size_t n = (size_t)atoi(a[3]) << 20;
  int64_t ne = (int64_t)(n / 4);
  ps_status st;
  ps_library_init();
  ps_cluster *cl = ps_cluster_load_file(a[1], &st);
  ps_client *c = cl ? ps_client_create(cl, "ps", NULL, &st) : NULL;
  if (c == NULL) return worker_fail("client", &st);
  char name[NPS][32];
  ps_tensor *val = ps_tensor_new(PS_DT_FLOAT, 1, &ne);
  ps_tensor *out[NPS];
  char *tbuf[NPS];
  int fds[NPS];
  for (int t = 0; t < NPS; t++) {
    out[t] = ps_tensor_new(PS_DT_FLOAT, 1, &ne);
    tbuf[t] = malloc(n);
    fds[t] = tcp_connect(atoi(a[5 + t]));
    if (!out[t] || !tbuf[t] || fds[t] < 0) return worker_fail("set-up", NULL);
    memset(ps_tensor_data(out[t]), 0, n);
    memset(tbuf[t], 0, n);
    snprintf(name[t], sizeof name[t], "agg/w%d/ps%d", idx, t);
    ps_var_spec spec = {
        .name = name[t], .dtype = PS_DT_FLOAT, .shape = {.rank = 1, .dim = {ne}}};
    if (ps_client_create_vars(c, t, &spec, 1, &st) != 0)
      return worker_fail("create", &st);
  }
  float *pv = ps_tensor_data(val);
  for (int64_t i = 0; i < ne; i++)
    pv[i] = (float)((i + idx) % 4099);
  ps_update up[NPS];
  ps_read rd[NPS];
  ps_task_updates tu[NPS];
  ps_task_reads tr[NPS];
  for (int t = 0; t < NPS; t++) {
    up[t] = (ps_update){.name = name[t], .op = PS_ASSIGN, .value = val};
    rd[t] = (ps_read){.name = name[t], .out = out[t]};
    tu[t] = (ps_task_updates){.task = t, .updates = &up[t], .n = 1};
    tr[t] = (ps_task_reads){.task = t, .reads = &rd[t], .n = 1};
  }
  /* warm-up, and the values come back */
  if (ps_client_update_many(c, tu, NPS, &st) != 0 ||
      ps_client_read_many(c, tr, NPS, &st) != 0)
    return worker_fail("warm-up", &st);
  for (int t = 0; t < NPS; t++)
    if (memcmp(ps_tensor_data(out[t]), pv, n) != 0)
      return worker_fail("values differ", NULL);
  if (tcp_phase(fds, 'W', tbuf, n, 1) != 0 || tcp_phase(fds, 'R', tbuf, n, 1) != 0)
    return worker_fail("tcp warm-up", NULL);
  int go = open(a[2], O_RDONLY);
  if (go < 0) return worker_fail("fifo", NULL);
  for (;;) {
    printf("ready\n");
    fflush(stdout);
    char ph;
    if (read(go, &ph, 1) != 1 || ph == 'q') break;
    int k = ph - '0', rc = 0;
    double t0 = now_s();
    if (k == 0 || k == 2) {
      rc = tcp_phase(fds, k == 0 ? 'W' : 'R', tbuf, n, reps);
    } else {
      for (int r = 0; r < reps && rc == 0; r++)
        rc = k == 1 ? ps_client_update_many(c, tu, NPS, &st)
                    : ps_client_read_many(c, tr, NPS, &st);
    }
    if (rc != 0) return worker_fail(phase_name[k], k == 1 || k == 3 ? &st : NULL);
    printf("done %d %.9f\n", k, now_s() - t0);
    fflush(stdout);
  }
  close(go);
  for (int t = 0; t < NPS; t++) {
    ps_tensor_destroy(out[t]);
    free(tbuf[t]);
    close(fds[t]);
  }
  ps_tensor_destroy(val);
  ps_client_destroy(c);
  ps_cluster_destroy(cl);
  ps_library_shutdown();
  return 0;
}

/* ---- parent ---- */

static int read_line(FILE *f, char *line, size_t n) {
  return fgets(line, (int)n, f) ? 0 : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static const char usage[] =
    "usage: bench_agg [--mib N] [--reps N] [--rounds N]\n"
    "  2 ps and 2 worker processes at once, against raw TCP with the same\n"
    "  pattern: aggregate push (assign) and pull (read) GB/s.\n"
    "  --mib N     bytes of each variable, MiB (default 4)\n"
    "  --reps N    pushes (pulls) per worker and phase (default 50)\n"
    "  --rounds N  interleaved rounds of the four phases (default 3)\n"
    "Needs PS_SERVER (path of ps-server).\n";

int main(int argc, char **argv) {
  if (argc == 9 && !strcmp(argv[1], "--worker")) return worker_main(argv + 2);
  int mib = 4, reps = 50, rounds = 3;
  for (int i = 1; i < argc; i += 2) { /* FLAG VALUE pairs */
    int *dst = !strcmp(argv[i], "--mib")      ? &mib
               : !strcmp(argv[i], "--reps")   ? &reps
               : !strcmp(argv[i], "--rounds") ? &rounds
                                              : NULL;
    if (!strcmp(argv[i], "--help")) {
      fputs(usage, stdout);
      return 0;
    }
    if (dst == NULL || i + 1 >= argc || (*dst = atoi(argv[i + 1])) <= 0 ||
        *dst > 100000) {
      fprintf(stderr, "bench_agg: bad argument '%s'\n%s", argv[i], usage);
      return 2;
    }
  }
  if (mib > 1024) {
    fprintf(stderr, "bench_agg: --mib is at most 1024\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  size_t n = (size_t)mib << 20;
  ps_harness h;
  int rc = 1;
  FILE *wout[NWORKERS] = {NULL};
  pid_t wpid[NWORKERS] = {0};
  int go = -1, started = 0;
  /* the TCP peers first: forked before anything else runs */
  int ports[NPS];
  pid_t peers[NPS] = {-1, -1};
  for (int t = 0; t < NPS; t++) {
    int lfd = tcp_listen(&ports[t]);
    if (lfd < 0 || (peers[t] = fork()) < 0) {
      fprintf(stderr, "bench_agg: cannot start the tcp peers\n");
      goto peers;
    }
    if (peers[t] == 0) peer_main(lfd, n);
    close(lfd);
  }
  if (harness_start(&h, NPS, NULL) != 0) goto peers;
  started = 1;
  char fifo[300], self[4096];
  snprintf(fifo, sizeof fifo, "%s/go", h.dir);
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sl <= 0 || mkfifo(fifo, 0600) != 0 || (go = open(fifo, O_RDWR)) < 0) {
    fprintf(stderr, "bench_agg: cannot make %s\n", fifo);
    goto out;
  }
  self[sl] = '\0';
  fprintf(stderr,
          "bench_agg: 2 ps (%s, %s), 2 workers, %d MiB variables, %d reps, %d rounds\n",
          h.addrs[0], h.addrs[1], mib, reps, rounds);
  for (int w = 0; w < NWORKERS; w++) {
    char idx[8], m[16], r[16], p0[16], p1[16];
    snprintf(idx, sizeof idx, "%d", w);
    snprintf(m, sizeof m, "%d", mib);
    snprintf(r, sizeof r, "%d", reps);
    snprintf(p0, sizeof p0, "%d", ports[0]);
    snprintf(p1, sizeof p1, "%d", ports[1]);
    const char *const av[] = {self, "--worker", idx, h.spec, fifo, m, r, p0, p1, NULL};
    int fd;
    if ((wpid[w] = harness_spawn(&h, av, &fd)) < 0 || (wout[w] = fdopen(fd, "r")) == NULL)
      goto out;
  }
  double *gbs = calloc((size_t)NPHASES * (size_t)rounds, sizeof *gbs);
  if (gbs == NULL) goto out;
  const double bytes = (double)n * NPS * NWORKERS * reps;
  for (int round = 0; round < rounds; round++) {
    for (int k = 0; k < NPHASES; k++) {
      char line[128];
      for (int w = 0; w < NWORKERS; w++)
        if (read_line(wout[w], line, sizeof line) != 0 || strncmp(line, "ready", 5)) {
          fprintf(stderr, "bench_agg: worker %d failed (see above)\n", w);
          free(gbs);
          goto out;
        }
      char ph[NWORKERS];
      memset(ph, '0' + k, sizeof ph);
      if (write(go, ph, sizeof ph) != (ssize_t)sizeof ph) {
        free(gbs);
        goto out;
      }
      double longest = 0;
      for (int w = 0; w < NWORKERS; w++) {
        int kk;
        double secs;
        if (read_line(wout[w], line, sizeof line) != 0 ||
            sscanf(line, "done %d %lf", &kk, &secs) != 2 || kk != k) {
          fprintf(stderr, "bench_agg: worker %d failed in %s (see above)\n", w,
                  phase_name[k]);
          free(gbs);
          goto out;
        }
        if (secs > longest) longest = secs;
      }
      gbs[k * rounds + round] = bytes / 1e9 / longest;
      fprintf(stderr, "  round %d %-8s %.2f GB/s aggregate\n", round + 1, phase_name[k],
              gbs[k * rounds + round]);
    }
  }
  double med[NPHASES];
  for (int k = 0; k < NPHASES; k++) {
    qsort(gbs + k * rounds, (size_t)rounds, sizeof *gbs, cmp_double);
    med[k] = gbs[k * rounds + rounds / 2];
  }
  free(gbs);
  printf("bench: agg_push_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= 0.8\n", mib,
         med[1], med[0], med[1] / med[0]);
  printf("bench: agg_pull_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= 0.8\n", mib,
         med[3], med[2], med[3] / med[2]);
  rc = 0;
out:
  if (go >= 0) {
    char q[NWORKERS];
    memset(q, 'q', sizeof q);
    if (write(go, q, sizeof q) < 0) rc = 1;
  }
  for (int w = 0; w < NWORKERS; w++) {
    if (wpid[w] <= 0) continue;
    int ws;
    if (rc != 0) kill(wpid[w], SIGKILL);
    if (waitpid(wpid[w], &ws, 0) != wpid[w] || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
      rc = 1;
    if (wout[w]) fclose(wout[w]);
  }
  if (go >= 0) close(go);
  if (started && harness_stop(&h) != 0) {
    fprintf(stderr, "bench_agg: a ps-server did not stop cleanly\n");
    rc = 1;
  }
peers:
  for (int t = 0; t < NPS; t++) {
    if (peers[t] <= 0) continue;
    kill(peers[t], SIGKILL);
    waitpid(peers[t], NULL, 0);
  }
  return rc;
}
