/* What the bench_ps*.c files share: the options, the CPU placement and
 * timing helpers, the baselines' peers, and each file's measurements. */
#ifndef PS_BENCH_PS_INTERNAL_H
#define PS_BENCH_PS_INTERNAL_H

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
extern size_t bulk_bytes;
#define NSMALL 1000
/* (a): repetitions of the second size per repetition of the first */
#define SMALL_PER_REP 8
#define PING_METHOD "/bench.Bare/Ping"
#define PING_REQ 16
#define PING_REPLY 8

typedef struct opts {
  int reps;           /* (a) repetitions per kind */
  int bulk_mib;       /* (a) transfer size */
  int small_mib;      /* (a) second size, SMALL_PER_REP x reps (0: none) */
  const char *iperf3; /* (a) iperf3's path, NULL: no iperf3 baseline */
  int iters;          /* latency samples per side */
  int warmup;         /* latency warm-up calls per side */
  int steps;          /* per-variable steps for (c); batched gets 10x */
  int ps_threads;     /* 0: ps-server default */
  /* every ps-server's --recv-window and the clients' PS_RECV_WINDOW
   * (NULL: the defaults) */
  const char *recv_window;
  const char *only; /* subset of "abcde" to run */
  int pin;          /* control CPU placement (see place()) */
  int split_b;      /* (b): the servers on the second CPU, not the client's */
  /* (d) sparse */
  int rows, dim, batch, sparse_steps;
  double zipf;
  int adagrad; /* the push is a sparse Adagrad step, not a plain add */
} opts;

/* The ps-server options of @o (--threads, --recv-window) into @argv
 * (room for 5), @threads holding the number; how many were written.
 * @argv is NULL-terminated. */
int bench_ps_args(const opts *o, const char **argv, char threads[16]);

/* A bare gRPC core client (bench_ps_bare.c). */
typedef struct bare_client {
  grpc_channel *ch;
  void *reg;
  grpc_completion_queue *cq;
} bare_client;

double now_s(void);
int cmp_i64(const void *a, const void *b);
double thread_cpu_s(void);
double proc_cpu_s(pid_t pid);
void place(const opts *o, const pid_t *servers, int n, int split);
void unplace(const opts *o, const pid_t *servers, int n);
double quantile(double *v, size_t n, double q);
int ps_fail(const char *what, const ps_status *st);
void print_reps(const char *name, const double *gbs, int n);
void tcp_child(int lfd);
int bench_sparse(ps_client *c, int tfd, const opts *o);
void bare_server_main(int port_fd, int ctl_fd);
int bare_client_init(bare_client *b, int port);
void bare_client_fini(bare_client *b);
int bare_ping(bare_client *b, uint32_t seq);
int bench_tls(const opts *o);

#endif
