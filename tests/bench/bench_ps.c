/* bench_ps: how close the parameter server gets to what the transport
 * underneath it can do, each figure against a baseline measured in the same
 * run, on the same machine, interleaved with it (so that the noise of a
 * shared box hits both sides alike), with the same CPU placement.
 *
 *  (a) read_64MiB / assign_64MiB: ps_client_read / ps_client_update(ASSIGN)
 *      of a 64 MiB float32 variable (--bulk-mib N: read_NMiB ...), in GB/s (1e9 bytes/s),
 * median of
 *      --reps repetitions.  Baseline: raw TCP over loopback between this
 *      process and a forked child, one request byte then 64 MiB back (pull,
 *      for reads) or 64 MiB then one ack byte (push, for assigns); the
 *      receiver writes into a reused, pre-touched buffer, as the client's
 *      read does (it passes a preallocated output tensor).  This is the
 *      practical ceiling: one kernel copy each way, no framing, no extra
 *      user-space copy.  Client on one CPU, servers on the other.
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
 * does not start/stop). */
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

#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "tcp.h"
#include "zipf.h"

/* (a)'s transfer size: --bulk-mib (default 64), set before the TCP peer
 * is forked so both sides agree. */
static size_t bulk_bytes = (size_t)64 << 20;
#define NSMALL 1000
#define PING_METHOD "/bench.Bare/Ping"
#define PING_REQ 16
#define PING_REPLY 8

typedef struct opts {
  int reps;         /* (a) repetitions per kind */
  int bulk_mib;     /* (a) transfer size */
  int iters;        /* latency samples per side */
  int warmup;       /* latency warm-up calls per side */
  int steps;        /* per-variable steps for (c); batched gets 10x */
  int ps_threads;   /* 0: ps-server default */
  const char *only; /* subset of "abcde" to run */
  int pin;          /* control CPU placement (see place()) */
  /* (d) sparse */
  int rows, dim, batch, sparse_steps;
  double zipf;
  int adagrad; /* the push is a sparse Adagrad step, not a plain add */
} opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time used so far by all threads of process @pid, in seconds (from
 * /proc/PID/task/TID/schedstat, nanoseconds); -1 if unavailable. */
static double proc_cpu_s(pid_t pid) {
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
static void place(const opts *o, const pid_t *servers, int n, int split) {
  if (!o->pin || cpu_a < 0) return;
  int sc = split && cpu_b >= 0 ? cpu_b : cpu_a;
  pin_pid(getpid(), cpu_a);
  for (int i = 0; i < n; i++)
    pin_pid(servers[i], sc);
  fprintf(stderr, "  placement: client on cpu %d, servers on cpu %d\n", cpu_a, sc);
}

static void unplace(const opts *o, const pid_t *servers, int n) {
  if (!o->pin || cpu_a < 0) return;
  pin_pid(getpid(), -1);
  for (int i = 0; i < n; i++)
    pin_pid(servers[i], -1);
}

/* Sorts @v in place; returns the value at quantile @q (0..1). */
static double quantile(double *v, size_t n, double q) {
  if (n == 0) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}

/* ---- raw TCP baseline (forked child, no gRPC in it) ---- */

/* A zeroed table on transparent huge pages, as the ps keeps big tensors
 * (common/tensor.c), so that the baselines have the same TLB reach. */
static float *table_alloc(size_t n) {
  size_t huge = (size_t)2 << 20, bytes = (n * sizeof(float) + huge - 1) / huge * huge;
  float *t = aligned_alloc(huge, bytes);
  if (t == NULL) return NULL;
  madvise(t, bytes, MADV_HUGEPAGE);
  memset(t, 0, bytes);
  return t;
}

/* The sparse peer's state: a table and buffers for one step. */
typedef struct sparse_peer {
  float *table, *acc; /* acc: Adagrad's accumulator ('T' with a 4th word 1) */
  int64_t rows, dim;
  int64_t *ids;
  float *vals;
  size_t cap; /* ids and rows of vals */
} sparse_peer;

/* 'T' rows dim cap adagrad: a zeroed table (and an accumulator of
 * ADAGRAD_INIT); 'G' n ids -> n rows; 'S' n ids rows -> added in order,
 * then an ack; 'A' n ids rows -> a sparse Adagrad step, then an ack;
 * 'D' -> the whole table. */
static int sparse_cmd(int fd, char cmd, sparse_peer *p) {
  int64_t h[4];
  if (cmd == 'T') {
    if (read_full(fd, h, sizeof h) != 0) return -1;
    free(p->table);
    free(p->acc);
    p->acc = NULL;
    if (h[3]) {
      p->acc = table_alloc((size_t)(h[0] * h[1]));
      if (p->acc == NULL) return -1;
      for (int64_t i = 0; i < h[0] * h[1]; i++)
        p->acc[i] = ADAGRAD_INIT;
    }
    free(p->ids);
    free(p->vals);
    p->rows = h[0];
    p->dim = h[1];
    p->cap = (size_t)h[2];
    p->table = table_alloc((size_t)(p->rows * p->dim));
    p->ids = malloc(p->cap * sizeof *p->ids);
    p->vals = malloc(p->cap * (size_t)p->dim * sizeof *p->vals);
    return p->table && p->ids && p->vals ? write_full(fd, "k", 1) : -1;
  }
  if (cmd == 'D')
    return write_full(fd, p->table, (size_t)(p->rows * p->dim) * sizeof *p->table);
  int64_t n;
  if (p->table == NULL || read_full(fd, &n, sizeof n) != 0 || n < 0 ||
      (size_t)n > p->cap || read_full(fd, p->ids, (size_t)n * sizeof *p->ids) != 0)
    return -1;
  size_t row = (size_t)p->dim * sizeof(float);
  for (int64_t i = 0; i < n; i++)
    if (p->ids[i] < 0 || p->ids[i] >= p->rows) return -1;
  if (cmd == 'G') {
    for (int64_t i = 0; i < n; i++)
      memcpy(p->vals + i * p->dim, p->table + p->ids[i] * p->dim, row);
    return write_full(fd, p->vals, (size_t)n * row);
  }
  if (read_full(fd, p->vals, (size_t)n * row) != 0) return -1;
  if (cmd == 'A') {
    if (p->acc == NULL) return -1;
    for (int64_t i = 0; i < n; i++)
      adagrad_row(p->table + p->ids[i] * p->dim, p->acc + p->ids[i] * p->dim,
                  p->vals + i * p->dim, p->dim, ADAGRAD_LR);
    return write_full(fd, "k", 1);
  }
  for (int64_t i = 0; i < n; i++) {
    float *d = p->table + p->ids[i] * p->dim, *v = p->vals + i * p->dim;
    for (int64_t k = 0; k < p->dim; k++)
      d[k] += v[k];
  }
  return write_full(fd, "k", 1);
}

/* Child: 'R' -> sends bulk_bytes; 'W' -> receives them into a reused buffer
 * and acks with one byte; 'T' 'G' 'S' 'D': the sparse peer; EOF -> exits. */
static void tcp_child(int lfd) {
  int fd = accept(lfd, NULL, NULL);
  close(lfd);
  if (fd < 0) _exit(1);
  set_nodelay(fd);
  char *buf = malloc(bulk_bytes);
  if (buf == NULL) _exit(1);
  memset(buf, 1, bulk_bytes);
  sparse_peer sp = {0};
  for (;;) {
    char cmd;
    if (read_full(fd, &cmd, 1) != 0) break;
    if (cmd == 'R') {
      if (write_full(fd, buf, bulk_bytes) != 0) break;
    } else if (cmd == 'W') {
      if (read_full(fd, buf, bulk_bytes) != 0 || write_full(fd, "k", 1) != 0) break;
    } else if (strchr("TGSAD", cmd)) {
      if (sparse_cmd(fd, cmd, &sp) != 0) break;
    } else {
      break;
    }
  }
  free(sp.table);
  free(sp.acc);
  free(sp.ids);
  free(sp.vals);
  free(buf);
  close(fd);
  _exit(0);
}

/* Seconds for one bulk_bytes pull ('R') or push ('W'); < 0 on failure. */
static double tcp_once(int fd, char cmd, char *buf) {
  double t0 = now_s();
  if (write_full(fd, &cmd, 1) != 0) return -1;
  if (cmd == 'R') {
    if (read_full(fd, buf, bulk_bytes) != 0) return -1;
  } else {
    char ack;
    if (write_full(fd, buf, bulk_bytes) != 0 || read_full(fd, &ack, 1) != 0) return -1;
  }
  return now_s() - t0;
}

/* ---- bare gRPC core server (forked child, grpc_init only there) ---- */

enum { BT_CALL = 1, BT_SHUTDOWN };

typedef struct bare_call {
  int kind; /* BT_CALL; first field, like the shutdown tag */
  int replying;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  grpc_byte_buffer *reply;
  int cancelled;
} bare_call;

static grpc_server *bare_srv;
static grpc_completion_queue *bare_cq;
static void *bare_method;
static atomic_int bare_stopping;
static int bare_shutdown_tag = BT_SHUTDOWN;

static void unlimited_args(grpc_arg *a, int server) {
  /* The same arguments common/rpc.c gives the ps server and client. */
  a[0] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                    .value.integer = -1};
  a[1] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
                    .value.integer = -1};
  a[2] = (grpc_arg){.type = GRPC_ARG_INTEGER,
                    .key = server ? GRPC_ARG_ALLOW_REUSEPORT : GRPC_ARG_ENABLE_RETRIES,
                    .value.integer = 0};
}

static void bare_free(bare_call *c) {
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  grpc_metadata_array_destroy(&c->md);
  if (c->call) grpc_call_unref(c->call);
  free(c);
}

static void bare_post(void) {
  bare_call *c = calloc(1, sizeof *c);
  if (c == NULL) return;
  c->kind = BT_CALL;
  grpc_metadata_array_init(&c->md);
  if (grpc_server_request_registered_call(bare_srv, bare_method, &c->call, &c->deadline,
                                          &c->md, &c->payload, bare_cq, bare_cq,
                                          c) != GRPC_CALL_OK)
    bare_free(c);
}

/* A request arrived: echo its first bytes back in one batch. */
static void bare_event(bare_call *c, int ok) {
  if (c->replying || !ok) {
    bare_free(c);
    return;
  }
  if (!atomic_load(&bare_stopping)) bare_post();
  uint8_t out[PING_REPLY] = {0};
  if (c->payload) {
    grpc_byte_buffer_reader r;
    if (grpc_byte_buffer_reader_init(&r, c->payload)) {
      grpc_slice s = grpc_byte_buffer_reader_readall(&r);
      size_t n = GRPC_SLICE_LENGTH(s) < PING_REPLY ? GRPC_SLICE_LENGTH(s) : PING_REPLY;
      memcpy(out, GRPC_SLICE_START_PTR(s), n);
      grpc_slice_unref(s);
      grpc_byte_buffer_reader_destroy(&r);
    }
  }
  grpc_slice sl = grpc_slice_from_copied_buffer((const char *)out, sizeof out);
  c->reply = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = c->reply;
  ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
  ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[3].data.recv_close_on_server.cancelled = &c->cancelled;
  c->replying = 1;
  if (grpc_call_start_batch(c->call, ops, 4, c, NULL) != GRPC_CALL_OK) bare_free(c);
}

/* Waits for EOF on the control pipe (the parent closed it or died). */
static void *bare_watch(void *arg) {
  int fd = *(int *)arg;
  char b;
  for (;;) {
    ssize_t k = read(fd, &b, 1);
    if (k > 0 || (k < 0 && errno == EINTR)) continue;
    break;
  }
  atomic_store(&bare_stopping, 1);
  grpc_server_shutdown_and_notify(bare_srv, bare_cq, &bare_shutdown_tag);
  grpc_server_cancel_all_calls(bare_srv);
  return NULL;
}

static void bare_server_main(int port_fd, int ctl_fd) {
  grpc_init();
  grpc_arg a[3];
  unlimited_args(a, 1);
  grpc_channel_args args = {3, a};
  bare_srv = grpc_server_create(&args, NULL);
  bare_cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(bare_srv, bare_cq, NULL);
  bare_method = grpc_server_register_method(bare_srv, PING_METHOD, NULL,
                                            GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  grpc_server_credentials *sc = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(bare_srv, "127.0.0.1:0", sc);
  grpc_server_credentials_release(sc);
  if (port == 0 || write(port_fd, &port, sizeof port) != (ssize_t)sizeof port) _exit(1);
  close(port_fd);
  grpc_server_start(bare_srv);
  for (int i = 0; i < 8; i++)
    bare_post(); /* as many as the ps keeps */
  pthread_t w;
  if (pthread_create(&w, NULL, bare_watch, &ctl_fd) != 0) _exit(1);
  /* The one completion-queue thread. */
  for (;;) {
    grpc_event ev =
        grpc_completion_queue_next(bare_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) continue;
    if (*(int *)ev.tag == BT_SHUTDOWN) break;
    bare_event(ev.tag, ev.success);
  }
  grpc_server_destroy(bare_srv);
  grpc_completion_queue_shutdown(bare_cq);
  for (;;) {
    grpc_event ev =
        grpc_completion_queue_next(bare_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type == GRPC_OP_COMPLETE && *(int *)ev.tag == BT_CALL) bare_free(ev.tag);
  }
  grpc_completion_queue_destroy(bare_cq);
  pthread_join(w, NULL);
  grpc_shutdown();
  _exit(0);
}

/* ---- bare gRPC core client (in this process, after grpc_init) ---- */

typedef struct bare_client {
  grpc_channel *ch;
  void *reg;
  grpc_completion_queue *cq;
} bare_client;

static int bare_client_init(bare_client *b, int port) {
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  grpc_arg a[3];
  unlimited_args(a, 0);
  grpc_channel_args args = {3, a};
  grpc_channel_credentials *cc = grpc_insecure_credentials_create();
  b->ch = grpc_channel_create(target, cc, &args);
  grpc_channel_credentials_release(cc);
  b->reg = grpc_channel_register_call(b->ch, PING_METHOD, NULL, NULL);
  b->cq = grpc_completion_queue_create_for_next(NULL);
  return b->ch && b->reg && b->cq ? 0 : -1;
}

static void bare_client_fini(bare_client *b) {
  if (b->ch) grpc_channel_destroy(b->ch);
  if (b->cq) {
    grpc_completion_queue_shutdown(b->cq);
    while (grpc_completion_queue_next(b->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(b->cq);
  }
  memset(b, 0, sizeof *b);
}

/* One unary call in one batch; 0 or -1 (message on stderr). */
static int bare_ping(bare_client *b, uint32_t seq) {
  gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                       gpr_time_from_millis(30000, GPR_TIMESPAN));
  grpc_call *call = grpc_channel_create_registered_call(
      b->ch, NULL, GRPC_PROPAGATE_DEFAULTS, b->cq, b->reg, deadline, NULL);
  if (call == NULL) {
    fprintf(stderr, "bench: bare call: cannot create\n");
    return -1;
  }
  uint8_t req[PING_REQ] = {0};
  memcpy(req, &seq, sizeof seq);
  grpc_slice sl = grpc_slice_from_copied_buffer((const char *)req, sizeof req);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  grpc_byte_buffer *recv = NULL;
  grpc_metadata_array init_md, trail_md;
  grpc_metadata_array_init(&init_md);
  grpc_metadata_array_init(&trail_md);
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &details;
  int rc = -1;
  if (grpc_call_start_batch(call, ops, 6, b, NULL) == GRPC_CALL_OK) {
    grpc_event ev;
    do {
      ev = grpc_completion_queue_next(b->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    } while (ev.type != GRPC_OP_COMPLETE);
    uint32_t echo = 0;
    if (ev.success && status == GRPC_STATUS_OK && recv != NULL &&
        grpc_byte_buffer_length(recv) == PING_REPLY) {
      grpc_byte_buffer_reader r;
      if (grpc_byte_buffer_reader_init(&r, recv)) {
        grpc_slice s = grpc_byte_buffer_reader_readall(&r);
        memcpy(&echo, GRPC_SLICE_START_PTR(s), sizeof echo);
        grpc_slice_unref(s);
        grpc_byte_buffer_reader_destroy(&r);
      }
      rc = echo == seq ? 0 : -1;
    }
    if (rc != 0)
      fprintf(stderr, "bench: bare call failed: success=%d status=%d '%.*s'\n",
              ev.success, (int)status, (int)GRPC_SLICE_LENGTH(details),
              (const char *)GRPC_SLICE_START_PTR(details));
  } else {
    fprintf(stderr, "bench: bare call: start_batch failed\n");
  }
  grpc_byte_buffer_destroy(send);
  if (recv) grpc_byte_buffer_destroy(recv);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&init_md);
  grpc_metadata_array_destroy(&trail_md);
  grpc_call_unref(call);
  return rc;
}

/* ---- the measurements ---- */

static int ps_fail(const char *what, const ps_status *st) {
  fprintf(stderr, "bench: %s failed: %s\n", what, st->msg);
  return -1;
}

static void print_reps(const char *name, const double *gbs, int n) {
  fprintf(stderr, "  %-18s GB/s:", name);
  for (int i = 0; i < n; i++)
    fprintf(stderr, " %.2f", gbs[i]);
  fprintf(stderr, "\n");
}

/* (a) a bulk_bytes read and assign against TCP pull and push. */
static int bench_bulk(ps_client *c, int tfd, const opts *o) {
  ps_status st;
  int64_t dims[1] = {(int64_t)(bulk_bytes / 4)};
  ps_var_spec spec = {
      .name = "big", .dtype = PS_DT_FLOAT, .shape = {.rank = 1, .dim = {dims[0]}}};
  if (ps_client_create_vars(c, 0, &spec, 1, &st) != 0) return ps_fail("create big", &st);
  ps_tensor *val = ps_tensor_new(PS_DT_FLOAT, 1, dims);
  ps_tensor *out = ps_tensor_new(PS_DT_FLOAT, 1, dims);
  char *tbuf = malloc(bulk_bytes);
  double *v = calloc((size_t)o->reps * 4, sizeof *v);
  int rc = -1;
  if (!val || !out || !tbuf || !v) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  float *pv = ps_tensor_data(val);
  for (size_t i = 0; i < bulk_bytes / 4; i++)
    pv[i] = (float)(i % 4099);
  memset(ps_tensor_data(out), 0, bulk_bytes); /* reused, pre-touched */
  memset(tbuf, 0, bulk_bytes);
  ps_update up = {.name = "big", .op = PS_ASSIGN, .value = val};
  ps_read rd = {.name = "big", .out = out};
  /* Warm-up (connections, flow-control windows, allocator); checks values. */
  if (ps_client_update(c, 0, &up, 1, &st) != 0) {
    ps_fail("assign big", &st);
    goto out;
  }
  if (ps_client_read(c, 0, &rd, 1, &st) != 0) {
    ps_fail("read big", &st);
    goto out;
  }
  if (memcmp(ps_tensor_data(out), pv, bulk_bytes) != 0) {
    fprintf(stderr, "bench: read of big returned other values than assigned\n");
    goto out;
  }
  if (tcp_once(tfd, 'R', tbuf) < 0 || tcp_once(tfd, 'W', tbuf) < 0) {
    fprintf(stderr, "bench: tcp baseline failed\n");
    goto out;
  }
  double *tpull = v, *pread = v + o->reps, *tpush = v + 2 * o->reps,
         *passign = v + 3 * o->reps;
  const double gb = (double)bulk_bytes / 1e9;
  for (int r = 0; r < o->reps; r++) {
    double t;
    if ((t = tcp_once(tfd, 'R', tbuf)) < 0) goto tcp_err;
    tpull[r] = gb / t;
    t = now_s();
    if (ps_client_read(c, 0, &rd, 1, &st) != 0) {
      ps_fail("read big", &st);
      goto out;
    }
    pread[r] = gb / (now_s() - t);
    if ((t = tcp_once(tfd, 'W', tbuf)) < 0) goto tcp_err;
    tpush[r] = gb / t;
    t = now_s();
    if (ps_client_update(c, 0, &up, 1, &st) != 0) {
      ps_fail("assign big", &st);
      goto out;
    }
    passign[r] = gb / (now_s() - t);
    fprintf(stderr,
            "  rep %d: tcp pull %.2f, ps read %.2f, tcp push %.2f, ps assign %.2f GB/s\n",
            r + 1, tpull[r], pread[r], tpush[r], passign[r]);
  }
  print_reps("tcp pull", tpull, o->reps);
  print_reps("ps read", pread, o->reps);
  print_reps("tcp push", tpush, o->reps);
  print_reps("ps assign", passign, o->reps);
  {
    size_t n = (size_t)o->reps;
    double mpull = quantile(tpull, n, 0.5), mread = quantile(pread, n, 0.5);
    double mpush = quantile(tpush, n, 0.5), massign = quantile(passign, n, 0.5);
    fprintf(stderr,
            "  best: tcp pull %.2f, ps read %.2f, tcp push %.2f, ps assign %.2f GB/s\n",
            tpull[n - 1], pread[n - 1], tpush[n - 1], passign[n - 1]);
    int mib = (int)(bulk_bytes >> 20);
    printf("bench: read_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= 0.6\n", mib,
           mread, mpull, mread / mpull);
    printf("bench: assign_%dMiB %.2f GB/s baseline=%.2f ratio=%.2f target=>= 0.6\n", mib,
           massign, mpush, massign / mpush);
    fflush(stdout);
  }
  rc = 0;
  goto out;
tcp_err:
  fprintf(stderr, "bench: tcp baseline failed\n");
out:
  ps_tensor_destroy(val);
  ps_tensor_destroy(out);
  free(tbuf);
  free(v);
  return rc;
}

/* (b) scalar assign_add round trip against a bare gRPC unary ping-pong,
 * alternating blocks of calls so both see the same background load. */
static int bench_latency(ps_client *c, bare_client *b, pid_t ps_pid, pid_t bare_pid,
                         const opts *o) {
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
  double *tp = calloc(n + 1, sizeof *tp), *tb = calloc(n + 1, sizeof *tb);
  int rc = -1;
  if (!one || !tp || !tb) {
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
    if (bare_ping(b, ++seq) != 0) goto out;
  }
  const size_t block = 100;
  size_t ip = 0, ib = 0;
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
  double pm = quantile(tp, n, 0.5), bm = quantile(tb, n, 0.5);
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
  fprintf(stderr, "  (%zu samples each, %.1f s wall)\n", n, now_s() - w0);
  fprintf(stderr,
          "  CPU per call: ps server %.1f us, bare server %.1f us; "
          "client thread %.1f us (ps) vs %.1f us (bare)\n",
          sp0 < 0 ? -1.0 : sp * 1e6 / (double)n, sb0 < 0 ? -1.0 : sb * 1e6 / (double)n,
          cp * 1e6 / (double)n, cb * 1e6 / (double)n);
  printf("bench: assign_add_latency %.1f us baseline=%.1f ratio=%.2f target=<= 1.3\n", pm,
         bm, pm / bm);
  fflush(stdout);
  rc = 0;
out:
  ps_tensor_destroy(one);
  free(tp);
  free(tb);
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

/* (d) the sparse embedding workload; see the top of the file. */

static void local_gather(const float *t, const int64_t *ids, size_t n, int64_t dim,
                         float *out) {
  for (size_t i = 0; i < n; i++)
    memcpy(out + (int64_t)i * dim, t + ids[i] * dim, (size_t)dim * sizeof *t);
}

/* What the ps client does with a batch whose ids repeat, done the same
 * way for the baselines: the distinct ids in first-occurrence order and
 * each position's slot among them (stamp/slot: per-row scratch), and the
 * gradient rows summed per distinct id in the order they come (the first
 * copied, the others added), so every table gets the same arithmetic. */
typedef struct batch_scratch {
  int32_t *stamp, *slot; /* [rows] */
  int32_t gen;
  int64_t *uid; /* [batch] */
  int32_t *from;
  float *urows, *usum; /* [batch * dim] */
} batch_scratch;

static int64_t batch_unique(batch_scratch *w, const int64_t *ids, int64_t n) {
  int64_t nu = 0;
  w->gen++;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = ids[i];
    if (w->stamp[id] != w->gen) {
      w->stamp[id] = w->gen;
      w->slot[id] = (int32_t)nu;
      w->uid[nu++] = id;
    }
    w->from[i] = w->slot[id];
  }
  return nu;
}

/* Built as the client's sum is (worker/client/dedup.c), wide vectors where
 * the CPU has them. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
batch_sum(batch_scratch *w, int64_t n, int64_t dim, const float *g) {
  int32_t seen = 0;
  for (int64_t i = 0; i < n; i++) {
    float *o = w->usum + (int64_t)w->from[i] * dim;
    const float *v = g + i * dim;
    if (w->from[i] == seen) {
      memcpy(o, v, (size_t)dim * sizeof *v);
      seen++;
    } else {
      for (int64_t k = 0; k < dim; k++)
        o[k] += v[k];
    }
  }
}

static void local_scatter_add(float *t, const int64_t *ids, size_t n, int64_t dim,
                              const float *v) {
  for (size_t i = 0; i < n; i++) {
    float *d = t + ids[i] * dim;
    const float *g = v + (int64_t)i * dim;
    for (int64_t k = 0; k < dim; k++)
      d[k] += g[k];
  }
}

/* One TCP step: 'G' then 'S' on @ids, each distinct id sent once as the
 * ps client sends it (the ids deduplicated once per step: the client's
 * push finds the pull's deduplication in its memo); pull and push
 * seconds. */
static int tcp_sparse_step(int fd, batch_scratch *w, const int64_t *ids, int64_t n,
                           const float *grad, float *rows, int64_t dim, char op,
                           double *tp, double *tq) {
  double t0 = now_s();
  size_t row = (size_t)dim * sizeof(float);
  char ack;
  int64_t nu = batch_unique(w, ids, n);
  if (write_full(fd, "G", 1) != 0 || write_full(fd, &nu, sizeof nu) != 0 ||
      write_full(fd, w->uid, (size_t)nu * sizeof *ids) != 0 ||
      read_full(fd, w->urows, (size_t)nu * row) != 0)
    return -1;
  for (int64_t i = 0; i < n; i++)
    memcpy(rows + i * dim, w->urows + (int64_t)w->from[i] * dim, row);
  double t1 = now_s();
  batch_sum(w, n, dim, grad); /* the pull's deduplication, as the client reuses it */
  if (write_full(fd, &op, 1) != 0 || write_full(fd, &nu, sizeof nu) != 0 ||
      write_full(fd, w->uid, (size_t)nu * sizeof *ids) != 0 ||
      write_full(fd, w->usum, (size_t)nu * row) != 0 || read_full(fd, &ack, 1) != 0)
    return -1;
  *tp = t1 - t0;
  *tq = now_s() - t1;
  return 0;
}

static void sparse_report(const char *what, double *v, size_t n) {
  double med = quantile(v, n, 0.5);
  fprintf(stderr, "  %-22s min %.3f  p10 %.3f  median %.3f  p90 %.3f ms\n", what,
          v[0] * 1e3, quantile(v, n, 0.1) * 1e3, med * 1e3, quantile(v, n, 0.9) * 1e3);
}

static int bench_sparse(ps_client *c, int tfd, const opts *o) {
  const int64_t rows = o->rows, dim = o->dim, b = o->batch;
  const size_t warm = 10, ns = (size_t)o->sparse_steps, nall = warm + ns;
  const size_t rb = (size_t)(b * dim) * sizeof(float);
  int rc = -1;
  int64_t *ids = zipf_ids(rows, o->zipf, nall, (size_t)b);
  float *local = table_alloc((size_t)(rows * dim));
  float *lacc = o->adagrad ? table_alloc((size_t)(rows * dim)) : NULL;
  float *lrows = malloc(rb), *trows = malloc(rb);
  float *peer = malloc((size_t)(rows * dim) * sizeof *peer);
  batch_scratch w = {.stamp = calloc((size_t)rows, sizeof(int32_t)),
                     .slot = calloc((size_t)rows, sizeof(int32_t)),
                     .uid = malloc((size_t)b * sizeof(int64_t)),
                     .from = malloc((size_t)b * sizeof(int32_t)),
                     .urows = malloc(rb),
                     .usum = malloc(rb)};
  double *t[9];
  for (int k = 0; k < 9; k++)
    t[k] = calloc(ns + 1, sizeof(double));
  ps_tensor *ix = ps_tensor_new(PS_DT_INT64, 1, &b);
  int64_t gd[2] = {b, dim};
  ps_tensor *gt = ps_tensor_new(PS_DT_FLOAT, 2, gd),
            *out = ps_tensor_new(PS_DT_FLOAT, 2, gd);
  ps_read whole = {.name = "emb"};
  if (!ids || !local || (o->adagrad && !lacc) || !lrows || !trows || !peer || !ix ||
      !gt || !out || !t[8] || !w.stamp || !w.slot || !w.uid || !w.from || !w.urows ||
      !w.usum) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  size_t uniq = 0;
  {
    int64_t *s = malloc((size_t)b * sizeof *s);
    if (s) {
      memcpy(s, ids, (size_t)b * sizeof *s);
      qsort(s, (size_t)b, sizeof *s, cmp_i64);
      for (int64_t i = 0; i < b; i++)
        uniq += i == 0 || s[i] != s[i - 1];
      free(s);
    }
  }
  fprintf(stderr,
          "  table %lld x %lld float32 (%.0f MiB), batch %lld ids of Zipf(%.2f): "
          "%zu unique in the first\n",
          (long long)rows, (long long)dim, (double)(rows * dim * 4) / 1048576.0,
          (long long)b, o->zipf, uniq);
  ps_status st;
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  ps_init_spec a0;
  ps_init_spec_default(&a0, PS_INIT_CONSTANT);
  a0.value = ADAGRAD_INIT;
  ps_var_spec spec[2] = {{.name = "emb",
                          .dtype = PS_DT_FLOAT,
                          .shape = {.rank = 2, .dim = {rows, dim}},
                          .init = &z},
                         {.name = "emb/Adagrad",
                          .dtype = PS_DT_FLOAT,
                          .shape = {.rank = 2, .dim = {rows, dim}},
                          .init = &a0}};
  const char *nm[2] = {"emb", "emb/Adagrad"};
  size_t nv = o->adagrad ? 2 : 1;
  if (ps_client_create_vars(c, 0, spec, nv, &st) != 0 ||
      ps_client_initialize(c, 0, nm, nv, false, NULL, &st) != 0) {
    rc = ps_fail("create emb", &st);
    goto out;
  }
  if (o->adagrad)
    for (int64_t i = 0; i < rows * dim; i++)
      lacc[i] = ADAGRAD_INIT;
  fprintf(stderr, "  push: %s\n",
          o->adagrad ? "sparse Adagrad (lr 0.01; rows of an id summed first, as "
                       "TensorFlow's optimizer does)"
                     : "scatter-add");
  int64_t hdr[4] = {rows, dim, b, o->adagrad};
  char ack;
  if (write_full(tfd, "T", 1) != 0 || write_full(tfd, hdr, sizeof hdr) != 0 ||
      read_full(tfd, &ack, 1) != 0) {
    fprintf(stderr, "bench: tcp sparse peer failed\n");
    goto out;
  }
  for (size_t i = 0; i < nall; i++) {
    const int64_t *si = ids + i * (size_t)b;
    float *g = ps_tensor_data(gt);
    for (int64_t j = 0; j < b * dim; j++)
      g[j] = grad_value((int64_t)i, j);
    memcpy(ps_tensor_data(ix), si, (size_t)b * sizeof *si);
    double tp, tq;
    /* the order of the three rotates, so that drift hits each alike */
    for (int k = 0; k < 3; k++) {
      int which = (int)((i + (size_t)k) % 3);
      if (which == 0) { /* the ps */
        ps_read r = {.name = "emb", .indices = ix, .out = out};
        ps_update u = {.name = "emb", .op = PS_SCATTER_ADD, .value = gt, .indices = ix};
        double t0 = now_s();
        if (ps_client_read(c, 0, &r, 1, &st) != 0) {
          rc = ps_fail("sparse pull", &st);
          goto out;
        }
        double t1 = now_s();
        ps_tensor *uix = NULL, *ug = NULL;
        if (o->adagrad) { /* the optimizer's SumDuplicateRows, then the apply */
          int64_t nu = batch_unique(&w, si, b), ud[2] = {nu, dim};
          batch_sum(&w, b, dim, g);
          uix = ps_tensor_new(PS_DT_INT64, 1, &nu);
          ug = ps_tensor_new(PS_DT_FLOAT, 2, ud);
          if (uix == NULL || ug == NULL) {
            fprintf(stderr, "bench: out of memory\n");
            ps_tensor_destroy(uix);
            ps_tensor_destroy(ug);
            goto out;
          }
          memcpy(ps_tensor_data(uix), w.uid, (size_t)nu * sizeof *w.uid);
          memcpy(ps_tensor_data(ug), w.usum, (size_t)(nu * dim) * sizeof *w.usum);
          static const char *slots[1] = {"emb/Adagrad"};
          static const double hp[1] = {ADAGRAD_LR};
          u = (ps_update){.name = "emb",
                          .op = PS_APPLY_ADAGRAD,
                          .value = ug,
                          .indices = uix,
                          .slots = slots,
                          .nslots = 1,
                          .hparams = hp,
                          .nhparams = 1};
        }
        int urc = ps_client_update(c, 0, &u, 1, &st);
        ps_tensor_destroy(uix);
        ps_tensor_destroy(ug);
        if (urc != 0) {
          rc = ps_fail("sparse push", &st);
          goto out;
        }
        tp = t1 - t0, tq = now_s() - t1;
        if (i >= warm) t[0][i - warm] = tp, t[1][i - warm] = tq, t[2][i - warm] = tp + tq;
      } else if (which == 1) { /* raw TCP */
        if (tcp_sparse_step(tfd, &w, si, b, g, trows, dim, o->adagrad ? 'A' : 'S', &tp,
                            &tq) != 0) {
          fprintf(stderr, "bench: tcp sparse step failed\n");
          goto out;
        }
        if (i >= warm) t[3][i - warm] = tp, t[4][i - warm] = tq, t[5][i - warm] = tp + tq;
      } else { /* in this process */
        double t0 = now_s();
        local_gather(local, si, (size_t)b, dim, lrows);
        double t1 = now_s();
        int64_t nu = batch_unique(&w, si, b);
        batch_sum(&w, b, dim, g);
        if (o->adagrad)
          for (int64_t q = 0; q < nu; q++)
            adagrad_row(local + w.uid[q] * dim, lacc + w.uid[q] * dim, w.usum + q * dim,
                        dim, ADAGRAD_LR);
        else
          local_scatter_add(local, w.uid, (size_t)nu, dim, w.usum);
        if (i >= warm) {
          t[6][i - warm] = t1 - t0, t[7][i - warm] = now_s() - t1;
          t[8][i - warm] = now_s() - t0;
        }
      }
    }
  }
  /* every table got the same adds in the same order: equal bit for bit */
  if (ps_client_read(c, 0, &whole, 1, &st) != 0) {
    rc = ps_fail("read emb", &st);
    goto out;
  }
  if (write_full(tfd, "D", 1) != 0 ||
      read_full(tfd, peer, (size_t)(rows * dim) * sizeof *peer) != 0) {
    fprintf(stderr, "bench: tcp sparse peer failed\n");
    goto out;
  }
  size_t tb = (size_t)(rows * dim) * sizeof(float);
  if (memcmp(ps_tensor_data(whole.out), local, tb) != 0 || memcmp(peer, local, tb) != 0) {
    fprintf(stderr, "bench: the ps's table differs from the local one after the steps\n");
    goto out;
  }
  fprintf(stderr, "  tables equal after %zu steps (ps, tcp peer, local)\n", nall);
  const char *what[9] = {"ps pull",      "ps push",           "ps step",
                         "tcp pull",     "tcp push",          "tcp step",
                         "local gather", "local scatter-add", "local step"};
  for (int k = 0; k < 9; k++)
    sparse_report(what[k], t[k], ns);
  double ps_step = quantile(t[2], ns, 0.5), tcp_step = quantile(t[5], ns, 0.5);
  double pp = (double)b / quantile(t[0], ns, 0.5) / 1e6,
         tp = (double)b / quantile(t[3], ns, 0.5) / 1e6;
  double pq = (double)b / quantile(t[1], ns, 0.5) / 1e6,
         tq = (double)b / quantile(t[4], ns, 0.5) / 1e6;
  fprintf(stderr, "  local step (gather + scatter-add in process) %.3f ms\n",
          quantile(t[8], ns, 0.5) * 1e3);
  const char *sfx = o->adagrad ? "_adagrad" : "";
  printf("bench: sparse_step%s %.3f ms baseline=%.3f ratio=%.2f target=<= 1.25\n", sfx,
         ps_step * 1e3, tcp_step * 1e3, ps_step / tcp_step);
  printf("bench: sparse_pull_rows%s %.2f M/s baseline=%.2f ratio=%.2f target=>= 0.8\n",
         sfx, pp, tp, pp / tp);
  printf("bench: sparse_push_rows%s %.2f M/s baseline=%.2f ratio=%.2f target=>= 0.8\n",
         sfx, pq, tq, pq / tq);
  rc = 0;
out : {
  ps_status dst;
  const char *nm2 = "emb";
  ps_client_delete(c, 0, &nm2, 1, PS_DELETE_MISSING_OK | PS_DELETE_SLOTS, NULL, &dst);
}
  ps_tensor_destroy(whole.out);
  ps_tensor_destroy(ix);
  ps_tensor_destroy(gt);
  ps_tensor_destroy(out);
  for (int k = 0; k < 9; k++)
    free(t[k]);
  free(ids);
  free(local);
  free(lrows);
  free(trows);
  free(lacc);
  free(w.stamp);
  free(w.slot);
  free(w.uid);
  free(w.from);
  free(w.urows);
  free(w.usum);
  free(peer);
  return rc;
}

/* ---- (e) the cost of TLS ----
 * Two fresh ps-servers started alike, one plaintext, one serving TLS with
 * bearer tokens (--tls-cert, --tls-key, --auth-token-file: the secure
 * configuration, so the figure is what a user pays for it), each with its
 * own client; the certificates come from deploy/gen-certs.sh, as a user's
 * would.  Both servers are fresh so that neither carries the variables or
 * the allocator state of (a)-(d).  Repetitions alternate between the two
 * and so does which side goes first, so a noisy moment or a warm cache
 * favours neither. */

/* meson passes the source tree's script; PS_GEN_CERTS overrides it. */
#ifndef BENCH_GEN_CERTS
#define BENCH_GEN_CERTS "deploy/gen-certs.sh"
#endif

/* One side of (e): a ps, its client, and what was measured on it. */
typedef struct tls_side {
  const char *name; /* "plaintext" or "tls" */
  ps_harness h;
  int up; /* h started: harness_stop owed */
  ps_client *c;
  double *read, *assign;               /* GB/s of each repetition */
  double *lat;                         /* us of each scalar assign_add */
  long adds;                           /* assign_adds the ps must have applied */
  double wall, client_cpu, server_cpu; /* of the timed scalar calls, s */
  /* Of the timed transfers, [read, assign], s: wall time, and CPU time of
   * this process (all its threads: gRPC's too) and of the ps. */
  double bulk_wall[2], bulk_client[2], bulk_server[2];
} tls_side;

/* Certificates and tokens in @dir/certs; 0 or -1 after printing why. */
static int tls_make_certs(const char *dir) {
  const char *gen = harness_prog("PS_GEN_CERTS", BENCH_GEN_CERTS);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "bash '%s' --tokens --clients worker --days 1 '%s/certs'",
           gen, dir);
  char *out = NULL;
  double t = now_s();
  int rc = harness_run(cmd, &out);
  if (rc != 0)
    fprintf(stderr, "bench: %s failed (status %d):\n%s", cmd, rc, out ? out : "");
  else
    fprintf(stderr, "  certificates and tokens by %s in %.1f s\n", gen, now_s() - t);
  free(out);
  return rc == 0 ? 0 : -1;
}

/* Starts @s's ps with @extra and a client with @co, then creates "big"
 * (the bulk variable) and "scalar" (zeros) on it.  0 or -1. */
static int tls_side_start(tls_side *s, const char *const *extra,
                          const ps_client_options *co, int64_t nfloats) {
  ps_status st;
  if (harness_start(&s->h, 1, extra) != 0) {
    fprintf(stderr, "bench: cannot start the %s ps-server\n", s->name);
    return -1;
  }
  s->up = 1;
  if ((s->c = ps_client_create(s->h.cluster, "ps", co, &st)) == NULL)
    return ps_fail("ps_client_create", &st);
  ps_init_spec zeros;
  ps_init_spec_default(&zeros, PS_INIT_ZEROS);
  ps_var_spec specs[2] = {
      {.name = "big", .dtype = PS_DT_FLOAT, .shape = {.rank = 1, .dim = {nfloats}}},
      {.name = "scalar", .dtype = PS_DT_FLOAT, .shape = {.rank = 0}, .init = &zeros}};
  const char *name = "scalar";
  /* The first call connects (with TLS, shakes hands too), which no timed
   * call below pays: shown apart. */
  double t = now_s();
  if (ps_client_create_vars(s->c, 0, specs, 2, &st) != 0)
    return ps_fail("create big and scalar", &st);
  fprintf(stderr, "  %s ps/0 on %s (pid %d): first call (connect%s) %.1f ms\n", s->name,
          s->h.addrs[0], (int)s->h.pids[0], co->tls_ca_file ? ", TLS handshake" : "",
          (now_s() - t) * 1e3);
  if (ps_client_initialize(s->c, 0, &name, 1, false, NULL, &st) != 0)
    return ps_fail("initialize scalar", &st);
  return 0;
}

/* Seconds of one read of "big" into @out, or of one assign of @val to it
 * (@assign); < 0 after printing why. */
static double tls_bulk_once(tls_side *s, int assign, ps_tensor *val, ps_tensor *out) {
  ps_status st;
  ps_update up = {.name = "big", .op = PS_ASSIGN, .value = val};
  ps_read rd = {.name = "big", .out = out};
  double t = now_s();
  int r = assign ? ps_client_update(s->c, 0, &up, 1, &st)
                 : ps_client_read(s->c, 0, &rd, 1, &st);
  t = now_s() - t;
  if (r != 0) {
    fprintf(stderr, "bench: %s of big on the %s ps failed: %s\n",
            assign ? "assign" : "read", s->name, st.msg);
    return -1;
  }
  return t;
}

/* Reads "big" of @s into a cleared @out and compares it with @val. */
static int tls_bulk_check(tls_side *s, ps_tensor *val, ps_tensor *out) {
  memset(ps_tensor_data(out), 0, bulk_bytes);
  if (tls_bulk_once(s, 0, val, out) < 0) return -1;
  if (memcmp(ps_tensor_data(out), ps_tensor_data(val), bulk_bytes) != 0) {
    fprintf(stderr, "bench: the %s ps read back other values than assigned\n", s->name);
    return -1;
  }
  return 0;
}

/* (e, bulk) read and assign of bulk_bytes on both sides, interleaved. */
static int tls_bulk(tls_side *sd, const opts *o) {
  int64_t dims[1] = {(int64_t)(bulk_bytes / 4)};
  ps_tensor *val = ps_tensor_new(PS_DT_FLOAT, 1, dims);
  ps_tensor *out = ps_tensor_new(PS_DT_FLOAT, 1, dims);
  int rc = -1;
  if (!val || !out) {
    fprintf(stderr, "bench: out of memory\n");
    goto out;
  }
  float *pv = ps_tensor_data(val);
  for (size_t i = 0; i < bulk_bytes / 4; i++)
    pv[i] = (float)(i % 4099);
  /* Warm-up (connections, flow-control windows, allocators); checks.  Two
   * assigns: the first timed one otherwise still finds the ps's second
   * buffer for a value (the old one is held until the new one is in)
   * untouched, and pays its page faults. */
  for (int k = 0; k < 2; k++)
    if (tls_bulk_once(&sd[k], 1, val, out) < 0 ||
        tls_bulk_once(&sd[k], 1, val, out) < 0 || tls_bulk_check(&sd[k], val, out) != 0)
      goto out;
  const double gb = (double)bulk_bytes / 1e9;
  for (int r = 0; r < o->reps; r++) {
    for (int op = 0; op < 2; op++)
      for (int k = 0; k < 2; k++) {
        tls_side *s = &sd[(r + k) % 2]; /* odd repetitions: TLS first */
        double c0 = proc_cpu_s(getpid()), s0 = proc_cpu_s(s->h.pids[0]);
        double t = tls_bulk_once(s, op, val, out);
        if (t < 0) goto out;
        (op ? s->assign : s->read)[r] = gb / t;
        s->bulk_wall[op] += t;
        s->bulk_client[op] += proc_cpu_s(getpid()) - c0;
        s->bulk_server[op] += proc_cpu_s(s->h.pids[0]) - s0;
      }
    fprintf(stderr,
            "  rep %d: read plaintext %.2f, tls %.2f; assign plaintext %.2f, tls %.2f "
            "GB/s\n",
            r + 1, sd[0].read[r], sd[1].read[r], sd[0].assign[r], sd[1].assign[r]);
  }
  /* The timed calls left the values as they were. */
  for (int k = 0; k < 2; k++)
    if (tls_bulk_check(&sd[k], val, out) != 0) goto out;
  rc = 0;
out:
  ps_tensor_destroy(val);
  ps_tensor_destroy(out);
  return rc;
}

/* One scalar assign_add on @s, its round trip in us into @lat; 0 or -1. */
static int tls_add_once(tls_side *s, ps_update *up, double *lat) {
  ps_status st;
  double t = now_s();
  if (ps_client_update(s->c, 0, up, 1, &st) != 0) {
    fprintf(stderr, "bench: assign_add of scalar on the %s ps failed: %s\n", s->name,
            st.msg);
    return -1;
  }
  if (lat) *lat = (now_s() - t) * 1e6;
  s->adds++;
  return 0;
}

/* (e, scalar) assign_add round trips on both sides in alternating blocks,
 * as (b) alternates with the bare call. */
static int tls_scalar(tls_side *sd, const opts *o) {
  ps_shape s0 = {.rank = 0};
  ps_tensor *one = ps_tensor_create(PS_DT_FLOAT, &s0, false);
  if (one == NULL) {
    fprintf(stderr, "bench: out of memory\n");
    return -1;
  }
  *(float *)ps_tensor_data(one) = 1.0f;
  ps_update up = {.name = "scalar", .op = PS_ASSIGN_ADD, .value = one};
  int rc = -1;
  for (int i = 0; i < o->warmup; i++)
    for (int k = 0; k < 2; k++)
      if (tls_add_once(&sd[k], &up, NULL) != 0) goto out;
  const size_t n = (size_t)o->iters, block = 100;
  size_t done[2] = {0, 0};
  double cpu0[2];
  for (int k = 0; k < 2; k++)
    cpu0[k] = proc_cpu_s(sd[k].h.pids[0]);
  for (size_t b = 0; done[0] < n || done[1] < n; b++)
    for (int k = 0; k < 2; k++) {
      tls_side *s = &sd[(b + (size_t)k) % 2]; /* odd blocks: TLS first */
      size_t *i = &done[s - sd];
      double w = now_s(), c = thread_cpu_s();
      for (size_t j = 0; j < block && *i < n; j++, (*i)++)
        if (tls_add_once(s, &up, &s->lat[*i]) != 0) goto out;
      s->wall += now_s() - w;
      s->client_cpu += thread_cpu_s() - c;
    }
  for (int k = 0; k < 2; k++) {
    double c1 = proc_cpu_s(sd[k].h.pids[0]);
    sd[k].server_cpu = cpu0[k] < 0 || c1 < 0 ? -1 : c1 - cpu0[k];
  }
  /* Each ps must have applied every add exactly once. */
  for (int k = 0; k < 2; k++) {
    ps_status st;
    ps_read rd = {.name = "scalar"};
    if (ps_client_read(sd[k].c, 0, &rd, 1, &st) != 0) {
      fprintf(stderr, "bench: read of scalar on the %s ps failed: %s\n", sd[k].name,
              st.msg);
      goto out;
    }
    float got = *(float *)ps_tensor_data(rd.out);
    ps_tensor_destroy(rd.out);
    if (got != (float)sd[k].adds) {
      fprintf(stderr, "bench: the %s ps's scalar is %g after %ld assign_adds of 1\n",
              sd[k].name, (double)got, sd[k].adds);
      goto out;
    }
  }
  rc = 0;
out:
  ps_tensor_destroy(one);
  return rc;
}

/* Median over repetitions of the per-repetition ratio tls / plaintext:
 * the two sides of one repetition ran back to back. */
static double paired_ratio(const double *tls, const double *plain, int n) {
  double *q = malloc((size_t)n * sizeof *q);
  if (q == NULL) return -1;
  for (int i = 0; i < n; i++)
    q[i] = tls[i] / plain[i];
  double m = quantile(q, (size_t)n, 0.5);
  free(q);
  return m;
}

/* (e) the bulk read and assign and the scalar round trip, TLS with tokens
 * against plaintext, in one run. */
static int bench_tls(const opts *o) {
  tls_side sd[2] = {{.name = "plaintext"}, {.name = "tls"}};
  char dir[64] = "/tmp/ps-bench-tls-XXXXXX", f[3][128];
  int rc = -1;
  if (mkdtemp(dir) == NULL) {
    perror("bench: mkdtemp");
    return -1;
  }
  const size_t reps = (size_t)o->reps, n = (size_t)o->iters;
  for (int k = 0; k < 2; k++) {
    sd[k].read = calloc(reps, sizeof *sd[k].read);
    sd[k].assign = calloc(reps, sizeof *sd[k].assign);
    sd[k].lat = calloc(n, sizeof *sd[k].lat);
    if (!sd[k].read || !sd[k].assign || !sd[k].lat) {
      fprintf(stderr, "bench: out of memory\n");
      goto out;
    }
  }
  if (tls_make_certs(dir) != 0) goto out;
  snprintf(f[0], sizeof f[0], "%s/certs/server.crt", dir);
  snprintf(f[1], sizeof f[1], "%s/certs/server.key", dir);
  snprintf(f[2], sizeof f[2], "%s/certs/tokens", dir);
  char ca[128], token[128], threads[16];
  snprintf(ca, sizeof ca, "%s/certs/ca.crt", dir);
  snprintf(token, sizeof token, "%s/certs/worker.token", dir);
  snprintf(threads, sizeof threads, "%d", o->ps_threads);
  /* The same --threads on both; the TLS one adds only security flags. */
  const char *plain_args[] = {"--threads", threads, NULL};
  const char *tls_args[] = {
      "--tls-cert", f[0],        "--tls-key", f[1], "--auth-token-file",
      f[2],         "--threads", threads,     NULL};
  if (o->ps_threads <= 0) tls_args[6] = NULL;
  ps_client_options plain_co, tls_co;
  ps_client_options_default(&plain_co); /* main() cleared PS_TLS_* etc. */
  ps_client_options_default(&tls_co);
  tls_co.tls_ca_file = ca;
  tls_co.token_file = token; /* a worker's token: reads and assigns */
  const int64_t nfloats = (int64_t)(bulk_bytes / 4);
  if (tls_side_start(&sd[0], o->ps_threads > 0 ? plain_args : NULL, &plain_co, nfloats) !=
          0 ||
      tls_side_start(&sd[1], tls_args, &tls_co, nfloats) != 0)
    goto out;
  pid_t servers[2] = {sd[0].h.pids[0], sd[1].h.pids[0]};

  /* Placement as in (a) for the transfers, as in (b) for round trips. */
  fprintf(stderr, "  %d MiB read and assign, %d reps each side\n", o->bulk_mib, o->reps);
  place(o, servers, 2, 1);
  int r = tls_bulk(sd, o);
  unplace(o, servers, 2);
  if (r != 0) goto out;
  fprintf(stderr, "  scalar assign_add, %d calls each side\n", o->iters);
  place(o, servers, 2, 0);
  r = tls_scalar(sd, o);
  unplace(o, servers, 2);
  if (r != 0) goto out;

  /* Paired ratios first: quantile() sorts the arrays it is given. */
  double pr = paired_ratio(sd[1].read, sd[0].read, o->reps);
  double pa = paired_ratio(sd[1].assign, sd[0].assign, o->reps);
  double rd[2], as[2], lm[2];
  for (int k = 0; k < 2; k++) {
    tls_side *s = &sd[k];
    print_reps(k ? "tls read" : "plaintext read", s->read, o->reps);
    print_reps(k ? "tls assign" : "plaintext assign", s->assign, o->reps);
    /* Both near the wall time: CPU-bound on both ends; their sum near it:
     * the two ends take turns instead of overlapping. */
    for (int op = 0; op < 2; op++)
      fprintf(stderr,
              "  %s %s: per transfer %.1f ms wall; CPU %.1f ms client, %.1f ms "
              "server\n",
              s->name, op ? "assign" : "read", s->bulk_wall[op] * 1e3 / o->reps,
              s->bulk_client[op] * 1e3 / o->reps, s->bulk_server[op] * 1e3 / o->reps);
    rd[k] = quantile(s->read, reps, 0.5);
    as[k] = quantile(s->assign, reps, 0.5);
    lm[k] = quantile(s->lat, n, 0.5);
    fprintf(stderr,
            "  %s assign_add: min %.1f p10 %.1f median %.1f p90 %.1f p99 %.1f us, "
            "%.0f calls/s; CPU per call: server %.1f us, client thread %.1f us\n",
            s->name, s->lat[0], quantile(s->lat, n, 0.1), lm[k], quantile(s->lat, n, 0.9),
            quantile(s->lat, n, 0.99), (double)n / s->wall,
            s->server_cpu < 0 ? -1.0 : s->server_cpu * 1e6 / (double)n,
            s->client_cpu * 1e6 / (double)n);
  }
  fprintf(stderr, "  median of the per-repetition ratios: read %.2f, assign %.2f\n", pr,
          pa);
  int mib = o->bulk_mib;
  double rr = rd[1] / rd[0], ar = as[1] / as[0], added = lm[1] - lm[0];
  printf("bench: tls_read_%dMiB_ratio %.2f tls=%.2f GB/s plaintext=%.2f GB/s "
         "target=>= 0.7\n",
         mib, rr, rd[1], rd[0]);
  printf("bench: tls_assign_%dMiB_ratio %.2f tls=%.2f GB/s plaintext=%.2f GB/s "
         "target=>= 0.7\n",
         mib, ar, as[1], as[0]);
  printf("bench: tls_scalar_added_us %.1f us tls=%.1f us plaintext=%.1f us "
         "target=<= 30\n",
         added, lm[1], lm[0]);
  printf("bench: tls_targets read=%s assign=%s scalar=%s\n", rr >= 0.7 ? "met" : "missed",
         ar >= 0.7 ? "met" : "missed", added <= 30 ? "met" : "missed");
  fflush(stdout);
  rc = 0;
out:
  for (int k = 0; k < 2; k++) {
    ps_client_destroy(sd[k].c);
    if (sd[k].up && harness_stop(&sd[k].h) != 0) {
      fprintf(stderr, "bench: the %s ps-server did not stop cleanly\n", sd[k].name);
      rc = -1;
    }
    free(sd[k].read);
    free(sd[k].assign);
    free(sd[k].lat);
  }
  if (harness_scratch_remove(dir) != 0) rc = -1;
  return rc;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static const char usage[] =
    "usage: bench_ps [--reps N] [--iters N] [--steps N] [--ps-threads N]\n"
    "  --reps N        64 MiB repetitions of each kind (default 11)\n"
    "  --iters N       latency samples per side (default 5000)\n"
    "  --steps N       per-variable steps of the 1000-variable read; the\n"
    "                  batched read runs 10x as many (default 10)\n"
    "  --ps-threads N  pass --threads N to ps-server (default: its own)\n"
    "  --only LIST     run only these parts, e.g. --only b (default abcde)\n"
    "  --bulk-mib N    (a): the read and assign size in MiB (default 64)\n"
    "  --rows N --dim N --batch N --zipf S --sparse-steps N\n"
    "                  (d): table rows (1048576) and width (64), ids per step\n"
    "                  (8192) from Zipf(S) (1.1), timed steps (100)\n"
    "  --sparse-op OP  (d): the push is a scatter-add (add, default) or a\n"
    "                  sparse Adagrad step (adagrad)\n"
    "  --no-pin        leave CPU placement to the scheduler (noisy ratios)\n"
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
            .bulk_mib = 64};
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
  bulk_bytes = (size_t)o.bulk_mib << 20;
  setvbuf(stdout, NULL, _IOLBF, 0);
  double t_start = now_s();
  cpus_init();

  /* Children first: gRPC does not survive a fork after grpc_init(). */
  int tcp_port = 0, lfd = tcp_listen(&tcp_port);
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
  if (poll(&pfd, 1, 30000) != 1 ||
      read(port_pipe[0], &bare_port, sizeof bare_port) != (ssize_t)sizeof bare_port ||
      bare_port <= 0) {
    fprintf(stderr, "bench: the bare gRPC server did not start\n");
    goto done;
  }
  close(port_pipe[0]);
  port_pipe[0] = -1;

  char threads_arg[16];
  const char *extra[3] = {"--threads", threads_arg, NULL};
  snprintf(threads_arg, sizeof threads_arg, "%d", o.ps_threads);
  if (harness_start(&h, 1, o.ps_threads > 0 ? extra : NULL) != 0) {
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
    fprintf(stderr, "bench: (a) %d MiB read/assign vs raw TCP, %d reps\n", o.bulk_mib,
            o.reps);
    place(&o, servers, 2, 1);
    int r = bench_bulk(c, tfd, &o);
    unplace(&o, servers, 2);
    if (r != 0) goto done;
    /* The ps held the variable while each assign brought a new
     * value: its peak against the bound 1.1 x held + 64 MiB. */
    double peak = proc_peak_rss_mib(h.pids[0]), held = (double)bulk_bytes / (1 << 20);
    if (peak > 0)
      printf("bench: ps_peak_rss %.1f MiB baseline=%.1f ratio=%.2f target=<= 1.0 "
             "(ratio: peak / (1.1 x held + 64 MiB))\n",
             peak, held, peak / (1.1 * held + 64));
  }
  if (strchr(o.only, 'b')) {
    fprintf(stderr, "bench: (b) scalar assign_add vs bare gRPC unary, %d calls each\n",
            o.iters);
    place(&o, servers, 3, 0);
    int r = bench_latency(c, &bc, h.pids[0], bare_pid, &o);
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
  fprintf(stderr, "bench: %s in %.1f s\n", rc ? "FAILED" : "done", now_s() - t_start);
  return rc;
}
