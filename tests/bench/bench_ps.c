/* bench_ps: how close the parameter server gets to what the transport
 * underneath it can do, each figure against a baseline measured in the same
 * run, on the same machine, interleaved with it (so that the noise of a
 * shared box hits both sides alike), with the same CPU placement.
 *
 *  (a) read_64MiB / assign_64MiB: ps_client_read / ps_client_update(ASSIGN)
 *      of a 64 MiB float32 variable (--bulk-mib N: read_NMiB ...), in GB/s
 *      (1e9 bytes/s), median of --reps repetitions.  Baseline: raw TCP over
 *      loopback between this process and a forked child, one request byte
 *      then 64 MiB back (pull, for reads) or 64 MiB then one ack byte
 *      (push, for assigns); the receiver writes into a reused, pre-touched
 *      buffer, as the client's read does (it passes a preallocated output
 *      tensor): one kernel copy each way, no framing, no extra user-space
 *      copy.  read_4MiB / assign_4MiB (--small-mib): the same with a 4 MiB
 *      variable and a peer of its own, SMALL_PER_REP repetitions after each
 *      64 MiB one.  After each repetition, iperf3 (iperf3.c) moves 64 MiB
 *      each way, placed as the ps and the client: *_vs_iperf3 compare the
 *      ps's and the raw TCP's medians with it, the wire limit.  Then the
 *      ps's peak RSS, holding both variables.  Client on one CPU, servers
 *      on the other.
 *  (b) assign_add_latency: median round trip of ps_client_update(ASSIGN_ADD)
 *      of one float.  Baseline: a bare gRPC core unary ping-pong (16-byte
 *      request, 8-byte reply) against a minimal server in a forked child:
 *      registered method with the request payload read up front, one
 *      completion-queue thread, reply in one batch.  Both servers are
 *      separate processes, both clients use a registered call with a
 *      deadline, one batch and a `next' completion queue, both channels
 *      carry the ps client's channel arguments, and calls alternate in
 *      blocks of 100.  Client and both servers share one CPU (see place()):
 *      with one call outstanding nothing overlaps anyway, and it keeps the
 *      VM's cross-CPU wake-ups (random, ~50 us each) out of the comparison.
 *      The difference is the ps itself: its client library, protobuf
 *      framing, name lookup, locking, arithmetic and its server threads.
 *      assign_add_tcp_rtt: a third block, raw TCP round trips of the bare
 *      call's payloads to the forked tcp peer: what any protocol over TCP
 *      pays.  --split-b puts the three servers on the second CPU.
 *  (c) read_1000_vars_batched: one step reading 1000 small variables
 *      (scalars and [4] floats) on one ps in one ps_client_read, against
 *      1000 one-variable ps_client_read calls; ms per step, ratio = speedup.
 *  (d) sparse_*: the embedding workload parameter servers exist for.  A
 *      step pulls --batch row ids drawn from Zipf(--zipf) over a --rows x
 *      --dim float32 table (ps_client_read with indices: a gather) and
 *      pushes as many gradient rows added into those ids
 *      (PS_SCATTER_ADD; duplicates add each occurrence, in order).
 *      Baselines in the same run, step by step on the same ids: raw TCP
 *      with the same request pattern against a forked child holding its
 *      own table (ids out, rows back; ids and rows out, an ack back), and
 *      the same gather and scatter-add on a table in this process.  At the
 *      end the ps's table must equal both others bit for bit.
 *  (e) tls_*: what TLS with bearer tokens costs.  Two new ps-servers, one
 *      plaintext, one with --tls-cert, --tls-key and --auth-token-file
 *      (certificates and tokens from deploy/gen-certs.sh); on each, (a)'s
 *      read and assign (placed as in (a)) and (b)'s scalar assign_add
 *      (placed as in (b)), the two sides alternating repetition by
 *      repetition and block by block.  The plaintext side is the baseline:
 *      ratios are TLS / plaintext, and the round trip's cost is TLS's
 *      median minus plaintext's, in us.
 *
 * stdout gets exactly one `bench: NAME VALUE UNIT baseline=B ratio=R
 * target=OP T' line per result ((e): `bench: NAME VALUE [UNIT] tls=X
 * plaintext=Y target=OP T', then which targets held); progress and detail
 * go to stderr.  Targets are reported, not asserted: the exit status is 1
 * only when something fails (an RPC error, a wrong value, a server that
 * does not start/stop).
 *
 * The baselines' raw TCP peer and (d) are in bench_ps_sparse.c, the bare
 * gRPC core server and client in bench_ps_bare.c, (e) in bench_ps_tls.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_ps_internal.h"
#include "common/rpc.h"
#include "harness.h"
#include "iperf3.h"
#include "paramserver/client.h"
#include "tcp.h"
#include "zipf.h"

/* (a)'s transfer size: --bulk-mib (default 64), set before the TCP peer
 * is forked so both sides agree. */
size_t bulk_bytes = (size_t)64 << 20;

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time used so far by all threads of process @pid, in seconds (from
 * /proc/PID/task/TID/schedstat, nanoseconds); -1 if unavailable. */
double proc_cpu_s(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (d == NULL) return -1;
  double sum = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char f[128];
    snprintf(f, sizeof f, "/proc/%d/task/%.20s/schedstat", (int)pid, e->d_name);
    FILE *fp = fopen(f, "r");
    unsigned long long ns = 0;
    if (fp == NULL) continue;
    if (fscanf(fp, "%llu", &ns) == 1) sum += (double)ns * 1e-9;
    fclose(fp);
  }
  closedir(d);
  return sum;
}

/* ---- CPU placement ----
 * On this VM a wake-up across vCPUs costs ~50 us, more than a whole RPC, and
 * the scheduler places the client and a server on the same or on different
 * vCPUs at random, so unpinned latency figures are bimodal (30 or 150 us)
 * and a ratio can come out anywhere from 0.3 to 5.  The bench therefore puts
 * each client/server pair in a fixed, identical situation. */

static cpu_set_t all_cpus;
static int cpu_a = -1, cpu_b = -1; /* the first two usable CPUs */

static void cpus_init(void) {
  CPU_ZERO(&all_cpus);
  if (sched_getaffinity(0, sizeof all_cpus, &all_cpus) != 0) return;
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &all_cpus)) {
      if (cpu_a < 0)
        cpu_a = i;
      else if (cpu_b < 0)
        cpu_b = i;
    }
}

/* Peak resident set of process @pid in MiB (VmHWM), or -1. */
static double proc_peak_rss_mib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  double kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
  fclose(f);
  return kib < 0 ? -1 : kib / 1024;
}

/* Every thread of @pid onto @cpu (< 0: back to all CPUs). */
static void pin_pid(pid_t pid, int cpu) {
  cpu_set_t set = all_cpus;
  if (cpu >= 0) {
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') sched_setaffinity(atoi(e->d_name), sizeof set, &set);
  closedir(d);
}

/* @client (this process) on one CPU, @servers on @split ? the other : the same. */
void place(const opts *o, const pid_t *servers, int n, int split) {
  if (!o->pin || cpu_a < 0) return;
  int sc = split && cpu_b >= 0 ? cpu_b : cpu_a;
  pin_pid(getpid(), cpu_a);
  for (int i = 0; i < n; i++)
    pin_pid(servers[i], sc);
  fprintf(stderr, "  placement: client on cpu %d, servers on cpu %d\n", cpu_a, sc);
}

void unplace(const opts *o, const pid_t *servers, int n) {
  if (!o->pin || cpu_a < 0) return;
  pin_pid(getpid(), -1);
  for (int i = 0; i < n; i++)
    pin_pid(servers[i], -1);
}

/* Sorts @v in place; returns the value at quantile @q (0..1). */
double quantile(double *v, size_t n, double q) {
  if (n == 0) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}

/* ---- the measurements ---- */

int ps_fail(const char *what, const ps_status *st) {
  fprintf(stderr, "bench: %s failed: %s\n", what, st->msg);
  return -1;
}

void print_reps(const char *name, const double *gbs, int n) {
  fprintf(stderr, "  %-18s GB/s:", name);
  for (int i = 0; i < n; i++)
    fprintf(stderr, " %.2f", gbs[i]);
  fprintf(stderr, "\n");
}

/* ---- (a) dense reads and assigns against TCP pulls and pushes ---- */

enum { K_TCP_PULL, K_READ, K_TCP_PUSH, K_ASSIGN, NKINDS };
static const char *const kind_name[NKINDS] = {"tcp pull", "ps read", "tcp push",
                                              "ps assign"};

/* One size of (a): the ps variable @var, its value and the reused output
 * tensor, the TCP peer serving this size on @fd and the receiver's buffer,
 * and the GB/s of each kind of transfer, one per repetition. */
typedef struct bulk_size {
  const char *var;
  size_t n;
  int fd, reps;
  ps_tensor *val, *out;
  char *tbuf;
  double *v; /* [NKINDS * reps] */
  ps_update up;
  ps_read rd;
} bulk_size;

static double *bulk_kind(const bulk_size *b, int k) {
  return b->v + (size_t)k * (size_t)b->reps;
}

static void bulk_fini(bulk_size *b) {
  ps_tensor_destroy(b->val);
  ps_tensor_destroy(b->out);
  free(b->tbuf);
  free(b->v);
}

/* Creates @b's variable on @c, then warms both sides up (connections,
 * flow-control windows, allocators) and checks the value read back.  0,
 * or -1 after saying why; bulk_fini() in both cases. */
static int bulk_init(bulk_size *b, ps_client *c, const char *var, size_t n, int fd,
                     int reps) {
  ps_status st;
  int64_t ne = (int64_t)(n / 4);
  *b = (bulk_size){.var = var, .n = n, .fd = fd, .reps = reps};
  ps_var_spec spec = {
      .name = var, .dtype = PS_DT_FLOAT, .shape = {.rank = 1, .dim = {ne}}};
  if (ps_client_create_vars(c, 0, &spec, 1, &st) != 0) return ps_fail("create", &st);
  b->val = ps_tensor_new(PS_DT_FLOAT, 1, &ne);
  b->out = ps_tensor_new(PS_DT_FLOAT, 1, &ne);
  b->tbuf = malloc(n);
  b->v = calloc((size_t)reps * NKINDS, sizeof *b->v);
  if (!b->val || !b->out || !b->tbuf || !b->v) {
    fprintf(stderr, "bench: out of memory\n");
    return -1;
  }
  float *pv = ps_tensor_data(b->val);
  for (size_t i = 0; i < n / 4; i++)
    pv[i] = (float)(i % 4099);
  memset(ps_tensor_data(b->out), 0, n); /* reused, pre-touched */
  memset(b->tbuf, 0, n);
  b->up = (ps_update){.name = var, .op = PS_ASSIGN, .value = b->val};
  b->rd = (ps_read){.name = var, .out = b->out};
  if (ps_client_update(c, 0, &b->up, 1, &st) != 0) return ps_fail("assign", &st);
  if (ps_client_read(c, 0, &b->rd, 1, &st) != 0) return ps_fail("read", &st);
  if (memcmp(ps_tensor_data(b->out), pv, n) != 0) {
    fprintf(stderr, "bench: read of %s returned other values than assigned\n", var);
    return -1;
  }
  if (tcp_bulk_xfer(fd, 'R', b->tbuf, n) != 0 ||
      tcp_bulk_xfer(fd, 'W', b->tbuf, n) != 0) {
    fprintf(stderr, "bench: tcp baseline failed\n");
    return -1;
  }
  return 0;
}

/* Repetition @r of @b: TCP pull, ps read, TCP push, ps assign.  0, or -1
 * after saying why. */
static int bulk_rep(bulk_size *b, ps_client *c, int r) {
  ps_status st;
  double t[NKINDS + 1];
  t[0] = now_s();
  if (tcp_bulk_xfer(b->fd, 'R', b->tbuf, b->n) != 0) goto tcp_err;
  t[1] = now_s();
  if (ps_client_read(c, 0, &b->rd, 1, &st) != 0) return ps_fail("read", &st);
  t[2] = now_s();
  if (tcp_bulk_xfer(b->fd, 'W', b->tbuf, b->n) != 0) goto tcp_err;
  t[3] = now_s();
  if (ps_client_update(c, 0, &b->up, 1, &st) != 0) return ps_fail("assign", &st);
  t[4] = now_s();
  for (int k = 0; k < NKINDS; k++)
    bulk_kind(b, k)[r] = (double)b->n / 1e9 / (t[k + 1] - t[k]);
  return 0;
tcp_err:
  fprintf(stderr, "bench: tcp baseline failed\n");
  return -1;
}

/* Prints @b's repetitions (stderr) and its read and assign lines against
 * TCP with the target >= @target; the medians of the kinds go to @med. */
static void bulk_report(bulk_size *b, double target, double *med) {
  size_t n = (size_t)b->reps;
  int mib = (int)(b->n >> 20);
  for (int k = 0; k < NKINDS; k++) {
    char name[32];
    snprintf(name, sizeof name, "%s %dMiB", kind_name[k], mib);
    print_reps(name, bulk_kind(b, k), b->reps);
  }
  for (int k = 0; k < NKINDS; k++)
    med[k] = quantile(bulk_kind(b, k), n, 0.5); /* sorts: the best is last */
  fprintf(
      stderr,
      "  best %d MiB: tcp pull %.2f, ps read %.2f, tcp push %.2f, ps assign %.2f GB/s\n",
      mib, bulk_kind(b, K_TCP_PULL)[n - 1], bulk_kind(b, K_READ)[n - 1],
      bulk_kind(b, K_TCP_PUSH)[n - 1], bulk_kind(b, K_ASSIGN)[n - 1]);
  printf("bench: read_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= %.1f\n", mib,
         med[K_READ], med[K_TCP_PULL], med[K_READ] / med[K_TCP_PULL], target);
  printf("bench: assign_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= %.1f\n", mib,
         med[K_ASSIGN], med[K_TCP_PUSH], med[K_ASSIGN] / med[K_TCP_PUSH], target);
  fflush(stdout);
}

/* One line of (a) against iperf3: NAME_<mib>MiB_vs_iperf3SFX, @ours over
 * @wire (GB/s); @who names our side (ours, tcp); @tail ends the line. */
static void iperf3_line(const char *name, const char *sfx, const char *who, double ours,
                        double wire, const char *tail) {
  printf("bench: %s_%dMiB_vs_iperf3%s %.2f %s=%.2f GB/s iperf3=%.2f GB/s %s\n", name,
         (int)(bulk_bytes >> 20), sfx, ours / wire, who, ours, wire, tail);
}

/* iperf3's lines: the ps's and our raw TCP's medians @med of bulk_bytes
 * against iperf3's, @push and @pull (@n each). */
static void iperf3_report(const double *med, double *push, double *pull, int n) {
  print_reps("iperf3 push", push, n);
  print_reps("iperf3 pull", pull, n);
  double ip = quantile(push, (size_t)n, 0.5), il = quantile(pull, (size_t)n, 0.5);
  const char *tcp_tail = "(the raw TCP baseline against the wire limit)";
  iperf3_line("assign", "", "ours", med[K_ASSIGN], ip, "target=>= 0.85");
  iperf3_line("read", "", "ours", med[K_READ], il, "target=>= 0.85");
  iperf3_line("tcp_push", "", "tcp", med[K_TCP_PUSH], ip, tcp_tail);
  iperf3_line("tcp_pull", "", "tcp", med[K_TCP_PULL], il, tcp_tail);
  fflush(stdout);
}

/* (a): bulk_bytes against TCP on @tfd and, when @sfd >= 0, --small-mib
 * against TCP on @sfd, SMALL_PER_REP of its repetitions after each of the
 * first's; after the repetitions IPERF3_RUNS iperf3 transfers of
 * bulk_bytes each way (started by @h's harness), when there is iperf3,
 * and one steady run (iperf3 -t 1) each way; at the end the
 * peak RSS of the ps (@ps_pid), which then holds both variables. */
#define IPERF3_RUNS 7 /* same-bytes iperf3 transfers each way */
static int bench_bulk(ps_client *c, int tfd, int sfd, ps_harness *h, pid_t ps_pid,
                      const opts *o) {
  bulk_size big = {0}, small = {0};
  double *ip = NULL; /* [2 * reps]: iperf3 push, then pull */
  int rc = -1, nip = 0, iperf = o->iperf3 != NULL, scpu = -1, ccpu = -1;
  if (o->pin && cpu_a >= 0) { /* as place(): the ps's CPU and ours */
    ccpu = cpu_a;
    scpu = cpu_b >= 0 ? cpu_b : cpu_a;
  }
  if (bulk_init(&big, c, "big", bulk_bytes, tfd, o->reps) != 0) goto out;
  if (sfd >= 0 && bulk_init(&small, c, "bulk_small", (size_t)o->small_mib << 20, sfd,
                            o->reps * SMALL_PER_REP) != 0)
    goto out;
  if (iperf && (ip = calloc(2 * (size_t)o->reps, sizeof *ip)) == NULL) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  if (!iperf) printf("bench: iperf3 baseline skipped (no iperf3)\n");
  for (int r = 0; r < o->reps; r++) {
    if (bulk_rep(&big, c, r) != 0) goto out;
    for (int k = 0; k < SMALL_PER_REP && sfd >= 0; k++)
      if (bulk_rep(&small, c, r * SMALL_PER_REP + k) != 0) goto out;
    fprintf(stderr,
            "  rep %d: tcp pull %.2f, ps read %.2f, tcp push %.2f, ps assign %.2f GB/s\n",
            r + 1, bulk_kind(&big, K_TCP_PULL)[r], bulk_kind(&big, K_READ)[r],
            bulk_kind(&big, K_TCP_PUSH)[r], bulk_kind(&big, K_ASSIGN)[r]);
  }
  /* iperf3 after the repetitions, not between them: run between them, it
   * slowed the next repetition's transfers (a 4 MiB read: 1.05 against
   * 2.83 GB/s without it). */
  for (int r = 0; iperf && r < o->reps && r < IPERF3_RUNS; r++) {
    double push = iperf3_gbs(h, o->iperf3, bulk_bytes, 0, scpu, ccpu);
    double pull = push > 0 ? iperf3_gbs(h, o->iperf3, bulk_bytes, 1, scpu, ccpu) : -1;
    if (pull > 0) {
      ip[nip] = push;
      ip[o->reps + nip++] = pull;
    } else {
      iperf = 0;
      printf("bench: iperf3 baseline skipped (iperf3 failed, see stderr)\n");
    }
  }
  double med[NKINDS], smed[NKINDS];
  bulk_report(&big, 0.6, med);
  if (sfd >= 0) bulk_report(&small, 0.8, smed);
  if (iperf) iperf3_report(med, ip, ip + o->reps, nip);
  if (iperf) { /* the wire's steady rate: iperf3 -t 1 each way */
    double sp = iperf3_gbs(h, o->iperf3, 0, 0, scpu, ccpu);
    double sl = sp > 0 ? iperf3_gbs(h, o->iperf3, 0, 1, scpu, ccpu) : -1;
    fprintf(stderr, "  iperf3 -t 1: push %.2f, pull %.2f GB/s\n", sp, sl);
    if (sl > 0) {
      iperf3_line("assign", "_steady", "ours", med[K_ASSIGN], sp,
                  "(iperf3 -t 1) target=>= 0.85");
      iperf3_line("read", "_steady", "ours", med[K_READ], sl,
                  "(iperf3 -t 1 -R) target=>= 0.85");
    } else {
      printf("bench: iperf3 steady baseline skipped (iperf3 failed, see stderr)\n");
    }
    fflush(stdout);
  }
  /* The ps held both variables while each assign brought a new value. */
  double peak = proc_peak_rss_mib(ps_pid);
  double held = (double)(bulk_bytes + (sfd >= 0 ? small.n : 0)) / (1 << 20);
  if (peak > 0) {
    printf("bench: ps_peak_rss %.1f MiB baseline=%.1f ratio=%.2f target=<= 1.0 "
           "(ratio: peak / (1.1 x held + 16 MiB))\n",
           peak, held, peak / (1.1 * held + 16));
    fprintf(stderr, "  ps_peak_rss against the earlier bound 1.1 x held + 64 MiB: %.2f\n",
            peak / (1.1 * held + 64));
  }
  rc = 0;
out:
  bulk_fini(&big);
  bulk_fini(&small);
  free(ip);
  return rc;
}

/* One raw TCP round trip on @fd to the tcp peer: 'P' and the bare call's
 * request bytes, its reply bytes back; 0 or -1 (message on stderr). */
static int tcp_ping(int fd, uint32_t seq) {
  uint8_t req[1 + PING_REQ] = {'P'}, rep[PING_REPLY];
  memcpy(req + 1, &seq, sizeof seq);
  uint32_t echo = 0;
  if (write_full(fd, req, sizeof req) != 0 || read_full(fd, rep, sizeof rep) != 0) {
    perror("bench: tcp ping");
    return -1;
  }
  memcpy(&echo, rep, sizeof echo);
  if (echo != seq) fprintf(stderr, "bench: tcp ping: reply %u to %u\n", echo, seq);
  return echo == seq ? 0 : -1;
}

/* (b) scalar assign_add round trip against a bare gRPC unary ping-pong and
 * a raw TCP one on @tfd, alternating blocks of calls so all three see the
 * same background load. */
static int bench_latency(ps_client *c, bare_client *b, int tfd, pid_t ps_pid,
                         pid_t bare_pid, const opts *o) {
  ps_status st;
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_var_spec spec = {
      .name = "scalar", .dtype = PS_DT_FLOAT, .shape = {.rank = 0}, .init = &zeros};
  const char *name = "scalar";
  if (ps_client_create_vars(c, 0, &spec, 1, &st) != 0)
    return ps_fail("create scalar", &st);
  if (ps_client_initialize(c, 0, &name, 1, false, NULL, &st) != 0)
    return ps_fail("initialize scalar", &st);
  ps_shape s0 = {.rank = 0};
  ps_tensor *one = ps_tensor_create(PS_DT_FLOAT, &s0, false);
  size_t n = (size_t)o->iters;
  double *tp = calloc(n + 1, sizeof *tp), *tb = calloc(n + 1, sizeof *tb),
         *tt = calloc(n + 1, sizeof *tt);
  int rc = -1;
  if (!one || !tp || !tb || !tt) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  *(float *)ps_tensor_data(one) = 1.0f;
  ps_update up = {.name = "scalar", .op = PS_ASSIGN_ADD, .value = one};
  long adds = 0;
  uint32_t seq = 0;
  for (int i = 0; i < o->warmup; i++) {
    if (ps_client_update(c, 0, &up, 1, &st) != 0) {
      ps_fail("assign_add scalar", &st);
      goto out;
    }
    adds++;
    if (bare_ping(b, ++seq) != 0 || tcp_ping(tfd, seq) != 0) goto out;
  }
  const size_t block = 100;
  size_t ip = 0, ib = 0, it = 0;
  double w0 = now_s(), wp = 0, wb = 0, cp = 0, cb = 0;
  double sp0 = proc_cpu_s(ps_pid), sb0 = proc_cpu_s(bare_pid);
  while (ip < n || ib < n) {
    double c0 = thread_cpu_s();
    double t0 = now_s();
    for (size_t k = 0; k < block && ip < n; k++, ip++) {
      double t = now_s();
      if (ps_client_update(c, 0, &up, 1, &st) != 0) {
        ps_fail("assign_add scalar", &st);
        goto out;
      }
      tp[ip] = (now_s() - t) * 1e6;
      adds++;
    }
    double t1 = now_s(), c1 = thread_cpu_s();
    for (size_t k = 0; k < block && ib < n; k++, ib++) {
      double t = now_s();
      if (bare_ping(b, ++seq) != 0) goto out;
      tb[ib] = (now_s() - t) * 1e6;
    }
    wp += t1 - t0;
    wb += now_s() - t1;
    cp += c1 - c0;
    cb += thread_cpu_s() - c1;
    for (size_t k = 0; k < block && it < n; k++, it++) {
      double t = now_s();
      if (tcp_ping(tfd, ++seq) != 0) goto out;
      tt[it] = (now_s() - t) * 1e6;
    }
  }
  double sp = proc_cpu_s(ps_pid) - sp0, sb = proc_cpu_s(bare_pid) - sb0;
  /* The ps must have applied every add exactly once. */
  ps_read rd = {.name = "scalar"};
  if (ps_client_read(c, 0, &rd, 1, &st) != 0) {
    ps_fail("read scalar", &st);
    goto out;
  }
  float got = *(float *)ps_tensor_data(rd.out);
  ps_tensor_destroy(rd.out);
  if (got != (float)adds) {
    fprintf(stderr, "bench: scalar is %g after %ld assign_adds of 1\n", (double)got,
            adds);
    goto out;
  }
  double pm = quantile(tp, n, 0.5), bm = quantile(tb, n, 0.5), tm = quantile(tt, n, 0.5);
  fprintf(stderr,
          "  ps assign_add: min %.1f p10 %.1f median %.1f p90 %.1f p99 %.1f us, %.0f "
          "calls/s\n",
          tp[0], quantile(tp, n, 0.1), pm, quantile(tp, n, 0.9), quantile(tp, n, 0.99),
          (double)n / wp);
  fprintf(stderr,
          "  bare gRPC unary: min %.1f p10 %.1f median %.1f p90 %.1f p99 %.1f us, %.0f "
          "calls/s\n",
          tb[0], quantile(tb, n, 0.1), bm, quantile(tb, n, 0.9), quantile(tb, n, 0.99),
          (double)n / wb);
  fprintf(stderr,
          "  raw TCP ping-pong: min %.1f p10 %.1f median %.1f p90 %.1f p99 %.1f us\n",
          tt[0], quantile(tt, n, 0.1), tm, quantile(tt, n, 0.9), quantile(tt, n, 0.99));
  fprintf(stderr, "  (%zu samples each, %.1f s wall)\n", n, now_s() - w0);
  fprintf(stderr,
          "  CPU per call: ps server %.1f us, bare server %.1f us; "
          "client thread %.1f us (ps) vs %.1f us (bare)\n",
          sp0 < 0 ? -1.0 : sp * 1e6 / (double)n, sb0 < 0 ? -1.0 : sb * 1e6 / (double)n,
          cp * 1e6 / (double)n, cb * 1e6 / (double)n);
  printf("bench: assign_add_latency %.1f us baseline=%.1f ratio=%.2f target=<= 1.3\n", pm,
         bm, pm / bm);
  printf("bench: assign_add_tcp_rtt %.1f us ours=%.1f ratio=%.2f (raw TCP round trip of "
         "the bare call's %d and %d payload bytes)\n",
         tm, pm, pm / tm, PING_REQ, PING_REPLY);
  fflush(stdout);
  rc = 0;
out:
  ps_tensor_destroy(one);
  free(tp);
  free(tb);
  free(tt);
  return rc;
}

/* (c) one step = read 1000 small variables: one batched read against one
 * read per variable. */
static int bench_many(ps_client *c, const opts *o) {
  ps_status st;
  ps_init_spec ones;
  ps_init_spec_default(&ones, PS_INIT_ONES);
  char(*names)[16] = calloc(NSMALL, sizeof *names);
  const char **np = calloc(NSMALL, sizeof *np);
  ps_var_spec *specs = calloc(NSMALL, sizeof *specs);
  ps_read *rd = calloc(NSMALL, sizeof *rd);
  size_t nb = (size_t)o->steps * 10, nu = (size_t)o->steps;
  double *tb = calloc(nb + 1, sizeof *tb), *tu = calloc(nu + 1, sizeof *tu);
  int rc = -1;
  if (!names || !np || !specs || !rd || !tb || !tu) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  for (int i = 0; i < NSMALL; i++) {
    snprintf(names[i], sizeof names[i], "small/%04d", i);
    np[i] = names[i];
    ps_shape sh = {.rank = i % 2, .dim = {4}}; /* scalars and [4] */
    specs[i] =
        (ps_var_spec){.name = names[i], .dtype = PS_DT_FLOAT, .shape = sh, .init = &ones};
    rd[i].name = names[i];
    rd[i].out = ps_tensor_create(PS_DT_FLOAT, &sh, true); /* reused */
    if (rd[i].out == NULL) {
      fprintf(stderr, "bench: out of memory\n");
      goto out;
    }
  }
  if (ps_client_create_vars(c, 0, specs, NSMALL, &st) != 0) {
    ps_fail("create 1000 variables", &st);
    goto out;
  }
  size_t ninit = 0;
  if (ps_client_initialize(c, 0, np, NSMALL, false, &ninit, &st) != 0) {
    ps_fail("initialize 1000 variables", &st);
    goto out;
  }
  /* Warm-up, and a check of the values. */
  if (ps_client_read(c, 0, rd, NSMALL, &st) != 0) {
    ps_fail("batched read", &st);
    goto out;
  }
  for (int i = 0; i < NSMALL; i++) {
    if (ps_client_read(c, 0, &rd[i], 1, &st) != 0) {
      ps_fail("single read", &st);
      goto out;
    }
    float *f = ps_tensor_data(rd[i].out);
    if (f[0] != 1.0f || (i % 2 && f[3] != 1.0f)) {
      fprintf(stderr, "bench: %s does not read as ones\n", names[i]);
      goto out;
    }
  }
  size_t ib = 0;
  for (size_t s = 0; s < nu; s++) {
    double t = now_s();
    for (int i = 0; i < NSMALL; i++)
      if (ps_client_read(c, 0, &rd[i], 1, &st) != 0) {
        ps_fail("single read", &st);
        goto out;
      }
    tu[s] = (now_s() - t) * 1e3;
    for (int k = 0; k < 10; k++, ib++) {
      t = now_s();
      if (ps_client_read(c, 0, rd, NSMALL, &st) != 0) {
        ps_fail("batched read", &st);
        goto out;
      }
      tb[ib] = (now_s() - t) * 1e3;
    }
  }
  double bm = quantile(tb, nb, 0.5), um = quantile(tu, nu, 0.5);
  fprintf(stderr,
          "  batched: min %.2f median %.2f max %.2f ms/step (%.0f steps/s), %zu steps\n",
          tb[0], bm, tb[nb - 1], 1e3 / bm, nb);
  fprintf(stderr,
          "  per-variable: min %.1f median %.1f max %.1f ms/step (%.1f steps/s, %.1f "
          "us/RPC), %zu steps\n",
          tu[0], um, tu[nu - 1], 1e3 / um, um * 1e3 / NSMALL, nu);
  printf("bench: read_1000_vars_batched %.2f ms baseline=%.1f ratio=%.1f target=>= 10\n",
         bm, um, um / bm);
  fflush(stdout);
  rc = 0;
out:
  if (rd)
    for (int i = 0; i < NSMALL; i++)
      ps_tensor_destroy(rd[i].out);
  free(names);
  free(np);
  free(specs);
  free(rd);
  free(tb);
  free(tu);
  return rc;
}

/* Forks a TCP peer that serves tcp_bulk_serve() of @n bytes on one
 * connection, dying with the bench; its pid with our end in *@fd, or -1
 * after saying why.  Fork before grpc_init().  The peer holds no other
 * descriptor of ours, so it sees EOF when we close *@fd, and no other
 * peer holds its connection. */
static pid_t fork_bulk_peer(size_t n, int *fd) {
  int port, lfd = tcp_listen(&port);
  if (lfd < 0) {
    perror("bench: tcp listen");
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("bench: fork");
    close(lfd);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int c = accept(lfd, NULL, NULL);
    if (c < 0 || dup2(c, 3) != 3) _exit(1);
    close_range(4, ~0u, 0);
    set_nodelay(3);
    _exit(tcp_bulk_serve(3, n) == 0 ? 0 : 1);
  }
  close(lfd);
  if ((*fd = tcp_connect(port)) < 0) {
    perror("bench: tcp connect");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  return pid;
}

/* (d) the sparse embedding workload; see the top of the file. */

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

int bench_ps_args(const opts *o, const char **argv, char threads[16]) {
  int n = 0;
  snprintf(threads, 16, "%d", o->ps_threads);
  if (o->ps_threads > 0) {
    argv[n++] = "--threads";
    argv[n++] = threads;
  }
  if (o->recv_window) {
    argv[n++] = "--recv-window";
    argv[n++] = o->recv_window;
  }
  argv[n] = NULL;
  return n;
}

static const char usage[] =
    "usage: bench_ps [--reps N] [--iters N] [--steps N] [--ps-threads N]\n"
    "  --reps N        64 MiB repetitions of each kind (default 11)\n"
    "  --iters N       latency samples per side (default 5000)\n"
    "  --steps N       per-variable steps of the 1000-variable read; the\n"
    "                  batched read runs 10x as many (default 10)\n"
    "  --ps-threads N  pass --threads N to ps-server (default: its own)\n"
    "  --recv-window N pass --recv-window N to every ps-server and set the\n"
    "                  clients' PS_RECV_WINDOW to N (default: the defaults)\n"
    "  --only LIST     run only these parts, e.g. --only b (default abcde)\n"
    "  --bulk-mib N    (a): the read and assign size in MiB (default 64)\n"
    "  --small-mib N   (a): a second size, 8x the reps (default 4, 0: none)\n"
    "  --rows N --dim N --batch N --zipf S --sparse-steps N\n"
    "                  (d): table rows (1048576) and width (64), ids per step\n"
    "                  (8192) from Zipf(S) (1.1), timed steps (100)\n"
    "  --sparse-op OP  (d): the push is a scatter-add (add, default) or a\n"
    "                  sparse Adagrad step (adagrad)\n"
    "  --no-pin        leave CPU placement to the scheduler (noisy ratios)\n"
    "  --split-b       (b): the servers on a second CPU, not the client's\n"
    "Needs PS_SERVER (path of ps-server); see tests/bench/README.md.\n";

int main(int argc, char **argv) {
  opts o = {.reps = 11,
            .iters = 5000,
            .warmup = 500,
            .steps = 10,
            .ps_threads = 0,
            .only = "abcde",
            .pin = 1,
            .rows = 1 << 20,
            .dim = 64,
            .batch = 8192,
            .sparse_steps = 100,
            .zipf = 1.1,
            .bulk_mib = 64,
            .small_mib = 4};
  for (int i = 1; i < argc; i++) {
    int *dst = NULL, lo = 1, hi = 1000000;
    if (!strcmp(argv[i], "--reps"))
      dst = &o.reps, hi = 1000;
    else if (!strcmp(argv[i], "--iters"))
      dst = &o.iters;
    else if (!strcmp(argv[i], "--steps"))
      dst = &o.steps, hi = 10000;
    else if (!strcmp(argv[i], "--ps-threads"))
      dst = &o.ps_threads, hi = 256;
    else if (!strcmp(argv[i], "--bulk-mib"))
      dst = &o.bulk_mib, hi = 1024;
    else if (!strcmp(argv[i], "--small-mib"))
      dst = &o.small_mib, lo = 0, hi = 1024;
    else if (!strcmp(argv[i], "--rows"))
      dst = &o.rows, hi = 1 << 26;
    else if (!strcmp(argv[i], "--dim"))
      dst = &o.dim, hi = 4096;
    else if (!strcmp(argv[i], "--batch"))
      dst = &o.batch, hi = 1 << 20;
    else if (!strcmp(argv[i], "--sparse-steps"))
      dst = &o.sparse_steps, hi = 100000;
    else if (!strcmp(argv[i], "--sparse-op") && i + 1 < argc) {
      const char *op = argv[++i];
      if (strcmp(op, "add") && strcmp(op, "adagrad")) {
        fprintf(stderr, "bench_ps: --sparse-op is add or adagrad\n%s", usage);
        return 2;
      }
      o.adagrad = !strcmp(op, "adagrad");
      continue;
    } else if (!strcmp(argv[i], "--zipf") && i + 1 < argc) {
      char *end;
      o.zipf = strtod(argv[++i], &end);
      if (*end || !(o.zipf > 0 && o.zipf < 10)) {
        fprintf(stderr, "bench_ps: --zipf must be in (0, 10)\n%s", usage);
        return 2;
      }
      continue;
    } else if (!strcmp(argv[i], "--no-pin")) {
      o.pin = 0;
      continue;
    } else if (!strcmp(argv[i], "--split-b")) {
      o.split_b = 1;
      continue;
    } else if (!strcmp(argv[i], "--recv-window") && i + 1 < argc) {
      int64_t w;
      if (ps_rpc_parse_recv_window(argv[++i], &w) != 0) {
        fprintf(
            stderr,
            "bench_ps: --recv-window must be 0 (gRPC's probing) or a size from 64K to "
            "1G, got '%s'\n%s",
            argv[i], usage);
        return 2;
      }
      o.recv_window = argv[i];
      continue;
    } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
      o.only = argv[++i];
      continue;
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    }
    if (dst == NULL || i + 1 >= argc || parse_int(argv[i + 1], lo, hi, dst) != 0) {
      fprintf(stderr, "bench_ps: bad argument '%s'\n%s", argv[i], usage);
      return 2;
    }
    i++;
  }
  if (o.warmup > o.iters) o.warmup = o.iters;
  /* The bench configures security itself: these would turn TLS or tokens
   * on in every ps-server it starts and every client it makes (both read
   * them for what their flags and options leave unset). */
  static const char *const sec_env[] = {
      "PS_TLS_CA",          "PS_TLS_CERT",        "PS_TLS_KEY",
      "PS_TLS_SERVER_NAME", "PS_TLS_CLIENT_CA",   "PS_TOKEN_FILE",
      "PS_AUTH_TOKEN",      "PS_AUTH_TOKEN_FILE", "PS_REQUIRE_AUTH"};
  for (size_t i = 0; i < sizeof sec_env / sizeof *sec_env; i++)
    unsetenv(sec_env[i]);
  /* read by ps_rpc_global_init: this process's channels and the bare
   * client's own window stay gRPC's (bench_ps_bare.c sets no window) */
  if (o.recv_window) setenv("PS_RECV_WINDOW", o.recv_window, 1);
  bulk_bytes = (size_t)o.bulk_mib << 20;
  setvbuf(stdout, NULL, _IOLBF, 0);
  double t_start = now_s();
  cpus_init();

  /* Children first: gRPC does not survive a fork after grpc_init(). */
  int tcp_port = 0, lfd = tcp_listen(&tcp_port), sfd = -1;
  pid_t small_pid = -1;
  if (lfd < 0) {
    perror("bench: tcp listen");
    return 1;
  }
  pid_t tcp_pid = fork();
  if (tcp_pid < 0) {
    perror("bench: fork");
    return 1;
  }
  if (tcp_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the bench */
    tcp_child(lfd);
  }
  int port_pipe[2], ctl_pipe[2];
  if (pipe2(port_pipe, O_CLOEXEC) != 0 || pipe2(ctl_pipe, O_CLOEXEC) != 0) {
    perror("bench: pipe");
    return 1;
  }
  pid_t bare_pid = fork();
  if (bare_pid < 0) {
    perror("bench: fork");
    return 1;
  }
  if (bare_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(lfd);
    close(port_pipe[0]);
    close(ctl_pipe[1]);
    bare_server_main(port_pipe[1], ctl_pipe[0]);
  }
  close(port_pipe[1]);
  close(ctl_pipe[0]);
  int ctl = ctl_pipe[1];

  int rc = 1, harness_up = 0, grpc_up = 0, bare_port = 0;
  ps_harness h;
  ps_client *c = NULL;
  bare_client bc = {0};
  int tfd = tcp_connect(tcp_port);
  close(lfd);
  struct pollfd pfd = {port_pipe[0], POLLIN, 0};
  if (tfd < 0) {
    perror("bench: tcp connect");
    goto done;
  }
  /* (a)'s second size, unless it is the first (two lines of one name) */
  if (strchr(o.only, 'a') && o.small_mib > 0 && o.small_mib != o.bulk_mib &&
      (small_pid = fork_bulk_peer((size_t)o.small_mib << 20, &sfd)) < 0) {
    fprintf(stderr, "bench: cannot start the tcp peer of %d MiB\n", o.small_mib);
    goto done;
  }
  if (poll(&pfd, 1, 30000) != 1 ||
      read(port_pipe[0], &bare_port, sizeof bare_port) != (ssize_t)sizeof bare_port ||
      bare_port <= 0) {
    fprintf(stderr, "bench: the bare gRPC server did not start\n");
    goto done;
  }
  close(port_pipe[0]);
  port_pipe[0] = -1;

  char threads_arg[16];
  const char *extra[5];
  if (harness_start(&h, 1, bench_ps_args(&o, extra, threads_arg) ? extra : NULL) != 0) {
    fprintf(stderr, "bench: cannot start ps-server (PS_SERVER=%s)\n",
            harness_prog("PS_SERVER", "build/ps/ps-server"));
    goto done;
  }
  harness_up = 1;
  ps_rpc_global_init();
  grpc_up = 1;
  ps_status st;
  if ((c = ps_client_create(h.cluster, "ps", NULL, &st)) == NULL) {
    ps_fail("ps_client_create", &st);
    goto done;
  }
  if (bare_client_init(&bc, bare_port) != 0) {
    fprintf(stderr, "bench: cannot create the bare gRPC channel\n");
    goto done;
  }
  fprintf(stderr,
          "bench: ps/0 on %s (pid %d), bare gRPC server on 127.0.0.1:%d (pid %d), "
          "tcp peer pid %d\n",
          h.addrs[0], (int)h.pids[0], bare_port, (int)bare_pid, (int)tcp_pid);

  /* Bulk: sender and receiver run in parallel on two CPUs.  Round trips:
   * one call outstanding, nothing to overlap, so client and server share
   * one CPU and no cross-CPU wake-up blurs the software cost. */
  pid_t servers[3] = {h.pids[0], tcp_pid, bare_pid};
  if (strchr(o.only, 'a')) {
    char iperf3[4096];
    if (iperf3_find(iperf3, sizeof iperf3) == 0) o.iperf3 = iperf3;
    fprintf(stderr, "bench: (a) %d MiB read/assign vs raw TCP, %d reps", o.bulk_mib,
            o.reps);
    if (sfd >= 0)
      fprintf(stderr, "; %d MiB, %d reps", o.small_mib, o.reps * SMALL_PER_REP);
    fprintf(stderr, "; iperf3: %s\n", o.iperf3 ? o.iperf3 : "none");
    pid_t bulk_servers[3] = {h.pids[0], tcp_pid, small_pid};
    place(&o, bulk_servers, sfd >= 0 ? 3 : 2, 1);
    int r = bench_bulk(c, tfd, sfd, &h, h.pids[0], &o);
    unplace(&o, bulk_servers, sfd >= 0 ? 3 : 2);
    o.iperf3 = NULL;
    if (r != 0) goto done;
  }
  if (strchr(o.only, 'b')) {
    fprintf(stderr, "bench: (b) scalar assign_add vs bare gRPC unary, %d calls each\n",
            o.iters);
    place(&o, servers, 3, o.split_b);
    int r = bench_latency(c, &bc, tfd, h.pids[0], bare_pid, &o);
    unplace(&o, servers, 3);
    if (r != 0) goto done;
  }
  if (strchr(o.only, 'd')) {
    fprintf(stderr, "bench: (d) sparse pull + scatter-add vs raw TCP and in-process\n");
    place(&o, servers, 2, 1);
    int r = bench_sparse(c, tfd, &o);
    unplace(&o, servers, 2);
    if (r != 0) goto done;
  }
  if (strchr(o.only, 'c')) {
    fprintf(stderr, "bench: (c) read of %d small variables, batched vs one RPC each\n",
            NSMALL);
    place(&o, servers, 1, 0);
    int r = bench_many(c, &o);
    unplace(&o, servers, 1);
    if (r != 0) goto done;
  }
  if (strchr(o.only, 'e')) {
    fprintf(stderr, "bench: (e) TLS with tokens vs plaintext, two new ps-servers\n");
    if (bench_tls(&o) != 0) goto done;
  }
  rc = 0;

done:
  bare_client_fini(&bc);
  ps_client_destroy(c);
  if (grpc_up) ps_rpc_global_shutdown();
  if (harness_up && harness_stop(&h) != 0) {
    fprintf(stderr, "bench: ps-server did not stop cleanly\n");
    rc = 1;
  }
  if (port_pipe[0] >= 0) close(port_pipe[0]);
  close(ctl);               /* EOF: the bare server shuts down */
  if (tfd >= 0) close(tfd); /* EOF: the tcp peer exits */
  if (sfd >= 0) close(sfd); /* and the second size's */
  int status;
  if (waitpid(bare_pid, &status, 0) == bare_pid &&
      (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    fprintf(stderr, "bench: bare gRPC server exited with status 0x%x\n", status);
    rc = 1;
  }
  if (waitpid(tcp_pid, &status, 0) == tcp_pid &&
      (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    fprintf(stderr, "bench: tcp peer exited with status 0x%x\n", status);
    rc = 1;
  }
  if (small_pid > 0 && waitpid(small_pid, &status, 0) == small_pid &&
      (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    fprintf(stderr, "bench: tcp peer of %d MiB exited with status 0x%x\n", o.small_mib,
            status);
    rc = 1;
  }
  fprintf(stderr, "bench: %s in %.1f s\n", rc ? "FAILED" : "done", now_s() - t_start);
  return rc;
}
