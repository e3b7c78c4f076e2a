/* bench_agg: the aggregate throughput of ps tasks serving worker processes
 * at once, against raw TCP with the same pattern, measured in the same run.
 *
 * Default: 2 ps tasks serving 2 workers.  Each worker (a process of its
 * own, this program run with --worker) holds one --mib MiB float32
 * variable on each ps.  A push phase: every worker assigns its value to
 * both of its variables, the two ps in parallel (ps_client_update_many),
 * --reps times; a pull phase reads both back (ps_client_read_many) into
 * reused tensors.  The baseline phases do the same over raw TCP against
 * two forked peers (one per "ps"): the same bytes out and an ack back, or
 * a request byte out and the bytes back, each peer served by its own
 * thread in the worker, as the ps client serves each task at once.
 *
 * --clients N: 1 ps task serving N workers at once (one variable each),
 * against worker 0 alone on the same ps, and raw TCP with N workers and
 * with 1 against one forked peer (a thread per connection): does the ps
 * lose throughput when clients are added?
 *
 * Nothing is pinned: servers, workers and their threads share the
 * machine's CPUs, as in a job.  Phases start together: each worker says
 * "ready" on stdout, and blocks on a FIFO of its own until this process
 * has every worker of the phase ready and lets them go.  A phase's
 * aggregate is all bytes moved by its workers over the longest of their
 * times.  The phases run in --rounds interleaved rounds; the medians are
 * reported.
 *
 * stdout: `bench: agg_push_NMiB V GB/s baseline=B ratio=R target=>= 0.8'
 * and the same for agg_pull; with --clients N, `bench:
 * ps_Nclients_push_NMiB V GB/s baseline=B ratio=R target=>= 1.0
 * tcp_Nclients=T tcp_1client=U vs_tcp=V/T' and the same for pull.  Exit
 * status 0 when everything ran, 1 when something failed, 2 for a bad
 * option.  Needs PS_SERVER. */
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

#define MAX_TASKS 2
#define MAX_WORKERS 16
#define NPHASES 4 /* tcp push, ps push, tcp pull, ps pull */
static const char *const phase_name[NPHASES] = {"tcp_push", "ps_push", "tcp_pull",
                                                "ps_pull"};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- TCP peer (forked): a thread per connection, each serving
 * tcp_bulk_serve() of @n bytes until EOF ---- */

typedef struct peer_conn {
  int fd;
  size_t n;
} peer_conn;

static void *peer_serve(void *arg) {
  peer_conn *pc = arg;
  tcp_bulk_serve(pc->fd, pc->n);
  close(pc->fd);
  return NULL;
}

static void peer_main(int lfd, size_t n, int nconn) {
  pthread_t th[MAX_WORKERS];
  peer_conn pc[MAX_WORKERS];
  int k = 0;
  for (; k < nconn; k++) {
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
  for (int r = 0; r < j->reps && j->rc == 0; r++)
    if (tcp_bulk_xfer(j->fd, j->cmd, j->buf, j->n) != 0) j->rc = -1;
  return NULL;
}

/* @cmd on each of the @nt connections @fds at once, a thread each. */
static int tcp_phase(int nt, const int *fds, char cmd, char *const *bufs, size_t n,
                     int reps) {
  pthread_t th[MAX_TASKS];
  tcp_job j[MAX_TASKS];
  int started = 0, rc = 0;
  for (; started < nt; started++) {
    j[started] = (tcp_job){
        .fd = fds[started], .reps = reps, .cmd = cmd, .buf = bufs[started], .n = n};
    if (pthread_create(&th[started], NULL, tcp_run, &j[started]) != 0) {
      rc = -1;
      break;
    }
  }
  for (int t = 0; t < started; t++) {
    pthread_join(th[t], NULL);
    rc |= j[t].rc;
  }
  return rc;
}

static int worker_fail(const char *what, const ps_status *st) {
  fprintf(stderr, "bench_agg worker: %s: %s\n", what, st ? st->msg : "failed");
  return 1;
}

/* --worker IDX SPEC FIFO MIB REPS NTASKS PORT... (a peer's port per task):
 * one variable on each of the spec's first NTASKS ps tasks, and a
 * connection to each peer.  Exits when it reads 'q' (or EOF) from FIFO;
 * a failure exits 1 at once (the parent kills the rest). */
static int worker_main(int argc, char **a) {
  int idx = atoi(a[0]), reps = atoi(a[4]), nt = atoi(a[5]);
  if (nt < 1 || nt > MAX_TASKS || argc != 6 + nt) return worker_fail("arguments", NULL);
  size_t n = (size_t)atoi(a[3]) << 20;
  int64_t ne = (int64_t)(n / 4);
  ps_status st;
  ps_library_init();
  ps_cluster *cl = ps_cluster_load_file(a[1], &st);
  ps_client *c = cl ? ps_client_create(cl, "ps", NULL, &st) : NULL;
  if (c == NULL) return worker_fail("client", &st);
  char name[MAX_TASKS][32];
  ps_tensor *val = ps_tensor_new(PS_DT_FLOAT, 1, &ne);
  ps_tensor *out[MAX_TASKS];
  char *tbuf[MAX_TASKS];
  int fds[MAX_TASKS];
  if (val == NULL) return worker_fail("set-up", NULL);
  for (int t = 0; t < nt; t++) {
    out[t] = ps_tensor_new(PS_DT_FLOAT, 1, &ne);
    tbuf[t] = malloc(n);
    fds[t] = tcp_connect(atoi(a[6 + t]));
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
  ps_update up[MAX_TASKS];
  ps_read rd[MAX_TASKS];
  ps_task_updates tu[MAX_TASKS];
  ps_task_reads tr[MAX_TASKS];
  for (int t = 0; t < nt; t++) {
    up[t] = (ps_update){.name = name[t], .op = PS_ASSIGN, .value = val};
    rd[t] = (ps_read){.name = name[t], .out = out[t]};
    tu[t] = (ps_task_updates){.task = t, .updates = &up[t], .n = 1};
    tr[t] = (ps_task_reads){.task = t, .reads = &rd[t], .n = 1};
  }
  /* warm-up, and the values come back */
  if (ps_client_update_many(c, tu, (size_t)nt, &st) != 0 ||
      ps_client_read_many(c, tr, (size_t)nt, &st) != 0)
    return worker_fail("warm-up", &st);
  for (int t = 0; t < nt; t++)
    if (memcmp(ps_tensor_data(out[t]), pv, n) != 0)
      return worker_fail("values differ", NULL);
  if (tcp_phase(nt, fds, 'W', tbuf, n, 1) != 0 ||
      tcp_phase(nt, fds, 'R', tbuf, n, 1) != 0)
    return worker_fail("tcp warm-up", NULL);
  int go = open(a[2], O_RDONLY);
  if (go < 0) return worker_fail("fifo", NULL);
  for (;;) {
    printf("ready\n");
    fflush(stdout);
    char ph;
    if (read(go, &ph, 1) != 1 || ph == 'q') break;
    int k = ph - '0', rc = 0;
    if (k < 0 || k >= NPHASES) return worker_fail("unknown phase", NULL);
    double t0 = now_s();
    if (k == 0 || k == 2) {
      rc = tcp_phase(nt, fds, k == 0 ? 'W' : 'R', tbuf, n, reps);
    } else {
      for (int r = 0; r < reps && rc == 0; r++)
        rc = k == 1 ? ps_client_update_many(c, tu, (size_t)nt, &st)
                    : ps_client_read_many(c, tr, (size_t)nt, &st);
    }
    if (rc != 0) return worker_fail(phase_name[k], k == 1 || k == 3 ? &st : NULL);
    printf("done %d %.9f\n", k, now_s() - t0);
    fflush(stdout);
  }
  close(go);
  for (int t = 0; t < nt; t++) {
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

/* The processes of a run: ps tasks (the harness), a TCP peer per task,
 * and the workers with their stdout and FIFO. */
typedef struct agg_run {
  int ntasks, nworkers, mib, reps;
  ps_harness h;
  int started;             /* the harness is up */
  pid_t peers[MAX_TASKS];  /* -1: none */
  pid_t wpid[MAX_WORKERS]; /* 0: none */
  FILE *wout[MAX_WORKERS]; /* each worker's stdout */
  int go[MAX_WORKERS];     /* each worker's FIFO (-1: none) */
  int ready[MAX_WORKERS];  /* "ready" read, no phase sent since */
  char fifo[MAX_WORKERS][300];
} agg_run;

static int read_line(FILE *f, char *line, size_t n) {
  return fgets(line, (int)n, f) ? 0 : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts @v (@n) and returns its median (the upper one for even @n). */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* Starts the peers, @ps_args' ps tasks and the workers of @a (ntasks,
 * nworkers, mib and reps set; the rest zeroed).  0, or -1 after saying
 * why; agg_stop() in both cases. */
static int agg_start(agg_run *a, const char *const *ps_args) {
  size_t n = (size_t)a->mib << 20;
  int ports[MAX_TASKS];
  for (int t = 0; t < MAX_TASKS; t++)
    a->peers[t] = -1;
  for (int w = 0; w < MAX_WORKERS; w++)
    a->go[w] = -1;
  /* the TCP peers first: forked before anything else runs */
  for (int t = 0; t < a->ntasks; t++) {
    int lfd = tcp_listen(&ports[t]);
    if (lfd < 0 || (a->peers[t] = fork()) < 0) {
      fprintf(stderr, "bench_agg: cannot start the tcp peers\n");
      if (lfd >= 0) close(lfd);
      return -1;
    }
    if (a->peers[t] == 0) peer_main(lfd, n, a->nworkers);
    close(lfd);
  }
  if (harness_start(&a->h, a->ntasks, ps_args) != 0) return -1;
  a->started = 1;
  char self[4096];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sl <= 0) {
    perror("bench_agg: /proc/self/exe");
    return -1;
  }
  self[sl] = '\0';
  for (int w = 0; w < a->nworkers; w++) {
    snprintf(a->fifo[w], sizeof a->fifo[w], "%s/go%d", a->h.dir, w);
    if (mkfifo(a->fifo[w], 0600) != 0 || (a->go[w] = open(a->fifo[w], O_RDWR)) < 0) {
      fprintf(stderr, "bench_agg: cannot make %s\n", a->fifo[w]);
      return -1;
    }
    char idx[8], m[16], r[16], nt[8], p[MAX_TASKS][16];
    snprintf(idx, sizeof idx, "%d", w);
    snprintf(m, sizeof m, "%d", a->mib);
    snprintf(r, sizeof r, "%d", a->reps);
    snprintf(nt, sizeof nt, "%d", a->ntasks);
    const char *av[8 + MAX_TASKS + 1] = {self,       "--worker", idx, a->h.spec,
                                         a->fifo[w], m,          r,   nt};
    for (int t = 0; t < a->ntasks; t++) {
      snprintf(p[t], sizeof p[t], "%d", ports[t]);
      av[8 + t] = p[t];
    }
    av[8 + a->ntasks] = NULL;
    int fd;
    if ((a->wpid[w] = harness_spawn(&a->h, av, &fd)) < 0) return -1;
    if ((a->wout[w] = fdopen(fd, "r")) == NULL) {
      close(fd);
      return -1;
    }
  }
  return 0;
}

/* Stops everything agg_start() started, workers first (told to quit, or
 * killed when @rc != 0); returns @rc, or 1 if something did not end
 * cleanly. */
static int agg_stop(agg_run *a, int rc) {
  for (int w = 0; w < a->nworkers; w++)
    if (a->go[w] >= 0 && write(a->go[w], "q", 1) != 1) rc = 1;
  for (int w = 0; w < a->nworkers; w++) {
    if (a->wpid[w] > 0) {
      int ws;
      if (rc != 0) kill(a->wpid[w], SIGKILL);
      if (waitpid(a->wpid[w], &ws, 0) != a->wpid[w] || !WIFEXITED(ws) ||
          WEXITSTATUS(ws) != 0)
        rc = 1;
    }
    if (a->wout[w]) fclose(a->wout[w]);
    if (a->go[w] >= 0) close(a->go[w]);
  }
  if (a->started && harness_stop(&a->h) != 0) {
    fprintf(stderr, "bench_agg: a ps-server did not stop cleanly\n");
    rc = 1;
  }
  for (int t = 0; t < a->ntasks; t++) {
    if (a->peers[t] <= 0) continue;
    kill(a->peers[t], SIGKILL);
    waitpid(a->peers[t], NULL, 0);
  }
  return rc;
}

/* Phase @k on workers 0..@nw-1 at once: their aggregate GB/s (all their
 * bytes over the longest of their times), or -1 after saying why. */
static double agg_phase(agg_run *a, int k, int nw) {
  char line[128];
  for (int w = 0; w < nw; w++) {
    if (a->ready[w]) continue;
    if (read_line(a->wout[w], line, sizeof line) != 0 || strncmp(line, "ready", 5)) {
      fprintf(stderr, "bench_agg: worker %d failed (see above)\n", w);
      return -1;
    }
    a->ready[w] = 1;
  }
  char ph = (char)('0' + k);
  for (int w = 0; w < nw; w++) {
    if (write(a->go[w], &ph, 1) != 1) return -1;
    a->ready[w] = 0;
  }
  double longest = 0;
  for (int w = 0; w < nw; w++) {
    int kk;
    double secs;
    if (read_line(a->wout[w], line, sizeof line) != 0 ||
        sscanf(line, "done %d %lf", &kk, &secs) != 2 || kk != k) {
      fprintf(stderr, "bench_agg: worker %d failed in %s (see above)\n", w,
              phase_name[k]);
      return -1;
    }
    if (secs > longest) longest = secs;
  }
  return (double)((size_t)a->mib << 20) * a->ntasks * a->reps * nw / 1e9 / longest;
}

/* Default: 2 ps, 2 workers; the four phases per round. */
static int run_pairs(agg_run *a, int rounds) {
  fprintf(stderr,
          "bench_agg: 2 ps (%s, %s), 2 workers, %d MiB variables, %d reps, %d rounds\n",
          a->h.addrs[0], a->h.addrs[1], a->mib, a->reps, rounds);
  double *gbs = calloc((size_t)NPHASES * (size_t)rounds, sizeof *gbs);
  if (gbs == NULL) {
    fprintf(stderr, "bench_agg: out of memory\n");
    return -1;
  }
  for (int round = 0; round < rounds; round++)
    for (int k = 0; k < NPHASES; k++) {
      double g = agg_phase(a, k, a->nworkers);
      if (g < 0) {
        free(gbs);
        return -1;
      }
      gbs[k * rounds + round] = g;
      fprintf(stderr, "  round %d %-8s %.2f GB/s aggregate\n", round + 1, phase_name[k],
              g);
    }
  double med[NPHASES];
  for (int k = 0; k < NPHASES; k++)
    med[k] = median(gbs + k * rounds, rounds);
  free(gbs);
  printf("bench: agg_push_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= 0.8\n",
         a->mib, med[1], med[0], med[1] / med[0]);
  printf("bench: agg_pull_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= 0.8\n",
         a->mib, med[3], med[2], med[3] / med[2]);
  return 0;
}

/* --clients N: 1 ps; each of the four phases with all N workers and with
 * worker 0 alone, which of the two first alternating by round. */
static int run_clients(agg_run *a, int rounds) {
  int nc = a->nworkers;
  fprintf(stderr,
          "bench_agg: 1 ps (%s), %d clients against 1, %d MiB variables, %d reps, "
          "%d rounds\n",
          a->h.addrs[0], nc, a->mib, a->reps, rounds);
  /* [(k * 2 + alone) * rounds + round] */
  double *gbs = calloc((size_t)NPHASES * 2 * (size_t)rounds, sizeof *gbs);
  if (gbs == NULL) {
    fprintf(stderr, "bench_agg: out of memory\n");
    return -1;
  }
  for (int round = 0; round < rounds; round++)
    for (int k = 0; k < NPHASES; k++)
      for (int i = 0; i < 2; i++) {
        int alone = (i + round) % 2, nw = alone ? 1 : nc;
        double g = agg_phase(a, k, nw);
        if (g < 0) {
          free(gbs);
          return -1;
        }
        gbs[(k * 2 + alone) * rounds + round] = g;
        fprintf(stderr, "  round %d %-8s %2d client%s %.2f GB/s aggregate\n", round + 1,
                phase_name[k], nw, nw > 1 ? "s" : " ", g);
      }
  double med[NPHASES][2];
  for (int k = 0; k < NPHASES; k++)
    for (int alone = 0; alone < 2; alone++)
      med[k][alone] = median(gbs + (k * 2 + alone) * rounds, rounds);
  free(gbs);
  for (int dir = 0; dir < 2; dir++) { /* push: phases 0, 1; pull: 2, 3 */
    const double *tcp = med[2 * dir], *ps = med[2 * dir + 1];
    printf("bench: ps_%dclients_%s_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f "
           "target=>= 1.0 tcp_%dclients=%.2f tcp_1client=%.2f vs_tcp=%.2f\n",
           nc, dir ? "pull" : "push", a->mib, ps[0], ps[1], ps[0] / ps[1], nc, tcp[0],
           tcp[1], ps[0] / tcp[0]);
  }
  return 0;
}

static const char usage[] =
    "usage: bench_agg [--clients N] [--mib N] [--reps N] [--rounds N] [--ps-threads N]\n"
    "                 [--recv-window N]\n"
    "  Default: 2 ps and 2 worker processes at once, against raw TCP with the\n"
    "  same pattern: aggregate push (assign) and pull (read) GB/s.\n"
    "  --clients N     instead: 1 ps serving N worker processes at once,\n"
    "                  against 1 alone, and raw TCP with N and with 1\n"
    "  --mib N         bytes of each variable, MiB (default 4)\n"
    "  --reps N        pushes (pulls) per worker and phase (default 50)\n"
    "  --rounds N      interleaved rounds of the phases (default 3; 5 with\n"
    "                  --clients)\n"
    "  --ps-threads N  pass --threads N to ps-server (default: its own)\n"
    "  --recv-window N pass --recv-window N to every ps-server (which checks\n"
    "                  it) and set the workers' PS_RECV_WINDOW to N\n"
    "Needs PS_SERVER (path of ps-server).\n";

int main(int argc, char **argv) {
  if (argc >= 8 && !strcmp(argv[1], "--worker")) return worker_main(argc - 2, argv + 2);
  int mib = 4, reps = 50, rounds = 0, clients = 0, ps_threads = 0;
  const char *window = NULL;
  for (int i = 1; i < argc; i += 2) { /* FLAG VALUE pairs */
    if (!strcmp(argv[i], "--recv-window") && i + 1 < argc && argv[i + 1][0]) {
      window = argv[i + 1];
      continue;
    }
    int *dst = !strcmp(argv[i], "--mib")          ? &mib
               : !strcmp(argv[i], "--reps")       ? &reps
               : !strcmp(argv[i], "--rounds")     ? &rounds
               : !strcmp(argv[i], "--clients")    ? &clients
               : !strcmp(argv[i], "--ps-threads") ? &ps_threads
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
  if (mib > 1024 || clients > MAX_WORKERS || ps_threads > 256) {
    fprintf(stderr, "bench_agg: at most --mib 1024, --clients %d, --ps-threads 256\n",
            MAX_WORKERS);
    return 2;
  }
  if (rounds == 0) rounds = clients ? 5 : 3;
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  static agg_run a; /* zeroed */
  a.ntasks = clients ? 1 : 2;
  a.nworkers = clients ? clients : 2;
  a.mib = mib;
  a.reps = reps;
  char threads[16];
  snprintf(threads, sizeof threads, "%d", ps_threads);
  const char *extra[5];
  int n = 0;
  if (ps_threads) {
    extra[n++] = "--threads";
    extra[n++] = threads;
  }
  if (window) { /* the workers (this program again) read PS_RECV_WINDOW */
    extra[n++] = "--recv-window";
    extra[n++] = window;
    setenv("PS_RECV_WINDOW", window, 1);
  }
  extra[n] = NULL;
  int rc = agg_start(&a, n ? extra : NULL) != 0 ||
           (clients ? run_clients(&a, rounds) : run_pairs(&a, rounds)) != 0;
  return agg_stop(&a, rc);
}
