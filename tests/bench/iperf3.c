/* iperf3 over loopback: the wire limit bench_ps compares its dense
 * transfers with.
 *
 * Each measurement starts a one-off server (`iperf3 -s -1 -B 127.0.0.1
 * --forceflush`) on a port picked at run time (bound to port 0, read,
 * closed; if iperf3 cannot listen there after all, it says so and exits,
 * and the next of 5 tries takes another port).  The server is ready when
 * it prints "Server listening", which iperf3 does once it listens: a test
 * connection would use up a one-off server, and a sleep would guess.  Then
 * one client with -J, whose JSON gives the receiver's rate,
 * end.sum_received.bits_per_second.
 *
 * Both processes are started by the harness (PR_SET_PDEATHSIG, known to
 * its guardian), and both are reaped before a measurement returns: the
 * client after its EOF, the server after its own exit at the end of the
 * test; either is killed first when it does not end in time or the
 * measurement failed. */
#include "iperf3.h"

#include <errno.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tcp.h"

#define IPERF3_TRIES 5
#define READY_MS 10000   /* for the server's listening line */
#define CLIENT_MS 120000 /* for the whole client run */
#define EXIT_MS 10000    /* for the server's exit after its test */
#define OUT_MAX (16 << 20)

int iperf3_find(char *path, size_t n) {
  const char *env = getenv("IPERF3");
  if (env && *env) {
    if (strlen(env) >= n || access(env, X_OK) != 0) return -1;
    snprintf(path, n, "%s", env);
    return 0;
  }
  const char *p = getenv("PATH");
  if (p == NULL) p = "/usr/local/bin:/usr/bin:/bin";
  while (*p) {
    size_t len = strcspn(p, ":");
    int k = snprintf(path, n, "%.*s/iperf3", (int)len, p);
    if (len > 0 && k > 0 && (size_t)k < n && access(path, X_OK) == 0) return 0;
    p += len;
    if (*p == ':') p++;
  }
  return -1;
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What a child printed so far, NUL-terminated. */
typedef struct outbuf {
  char *p;
  size_t len, cap;
} outbuf;

/* Reads @fd into @b until @b holds @needle (0; never with @needle NULL),
 * until EOF (1), or else -1: the deadline @deadline_ms passed, a read
 * failed, or no memory (said on stderr). */
static int read_out(int fd, outbuf *b, const char *needle, long long deadline_ms) {
  for (;;) {
    if (needle && b->p && strstr(b->p, needle)) return 0;
    long long left = deadline_ms - now_ms();
    struct pollfd pfd = {fd, POLLIN, 0};
    int r = left > 0 ? poll(&pfd, 1, (int)left) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    if (b->cap - b->len < 4097) {
      size_t cap = b->cap ? 2 * b->cap : 16384;
      char *q = cap <= OUT_MAX ? realloc(b->p, cap) : NULL;
      if (q == NULL) {
        fprintf(stderr, "bench: iperf3: output too long or out of memory\n");
        return -1;
      }
      b->p = q;
      b->cap = cap;
    }
    ssize_t k = read(fd, b->p + b->len, b->cap - b->len - 1);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    if (k == 0) return 1;
    b->len += (size_t)k;
    b->p[b->len] = '\0';
  }
}

/* Reaps child @pid, SIGKILLed first when @kill_it; its wait status, or -1. */
static int reap(pid_t pid, int kill_it) {
  int st;
  if (kill_it) kill(pid, SIGKILL);
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return st;
}

/* Starts the one-off server: its pid, with its stdout's read end in *@fd
 * and its port in *@port; -1 after saying why (then nothing runs). */
static pid_t start_server(ps_harness *h, const char *prog, int cpu, int *fd, int *port) {
  for (int t = 0; t < IPERF3_TRIES; t++) {
    int lfd = tcp_listen(port);
    if (lfd < 0) {
      perror("bench: iperf3: a free port");
      return -1;
    }
    close(lfd);
    char ps[16], cs[16];
    snprintf(ps, sizeof ps, "%d", *port);
    snprintf(cs, sizeof cs, "%d", cpu);
    const char *argv[] = {prog, "-s",           "-1", "-B", "127.0.0.1", "-p",
                          ps,   "--forceflush", "-A", cs,   NULL};
    if (cpu < 0) argv[8] = NULL; /* not pinned */
    pid_t pid = harness_spawn(h, argv, fd);
    if (pid < 0) return -1;
    outbuf b = {0};
    int r = read_out(*fd, &b, "Server listening", now_ms() + READY_MS);
    free(b.p);
    if (r == 0) return pid;
    close(*fd);
    reap(pid, 1); /* already gone, or does not say it listens */
    fprintf(stderr, "bench: iperf3 server on port %d %s\n", *port,
            r > 0 ? "exited before it listened" : "did not say it listens");
    if (r < 0) return -1; /* not a taken port: no retry */
  }
  return -1;
}

/* The receiver's GB/s in iperf3's JSON @s, or -1 after saying why. */
static double parse_gbs(const char *s) {
  json_object *root = s ? json_tokener_parse(s) : NULL, *end, *sum, *bps, *err;
  double v = -1;
  if (root == NULL)
    fprintf(stderr, "bench: iperf3 printed no JSON\n");
  else if (json_object_object_get_ex(root, "error", &err))
    fprintf(stderr, "bench: iperf3: %s\n", json_object_get_string(err));
  else if (json_object_object_get_ex(root, "end", &end) &&
           json_object_object_get_ex(end, "sum_received", &sum) &&
           json_object_object_get_ex(sum, "bits_per_second", &bps) &&
           (json_object_is_type(bps, json_type_double) ||
            json_object_is_type(bps, json_type_int)))
    v = json_object_get_double(bps) / 8e9;
  else
    fprintf(stderr, "bench: iperf3's JSON has no end.sum_received.bits_per_second\n");
  json_object_put(root);
  return v > 0 ? v : -1;
}

double iperf3_gbs(ps_harness *h, const char *prog, size_t bytes, int reverse,
                  int server_cpu, int client_cpu) {
  int sfd = -1, cfd = -1, port = 0;
  pid_t spid = start_server(h, prog, server_cpu, &sfd, &port);
  if (spid < 0) return -1;
  char ps[16], ns[32], cs[16];
  snprintf(ps, sizeof ps, "%d", port);
  snprintf(ns, sizeof ns, "%zu", bytes);
  snprintf(cs, sizeof cs, "%d", client_cpu);
  const char *argv[12] = {prog, "-c", "127.0.0.1", "-p", ps, "-n", ns, "-J"};
  int k = 8;
  if (bytes == 0) { /* steady state: -t 1 */
    argv[5] = "-t";
    argv[6] = "1";
  }
  if (reverse) argv[k++] = "-R";
  if (client_cpu >= 0) {
    argv[k++] = "-A";
    argv[k++] = cs;
  }
  argv[k] = NULL;
  double gbs = -1;
  outbuf out = {0};
  pid_t cpid = harness_spawn(h, argv, &cfd);
  if (cpid >= 0) {
    int r = read_out(cfd, &out, NULL, now_ms() + CLIENT_MS);
    close(cfd);
    int st = reap(cpid, r != 1);
    if (r != 1)
      fprintf(stderr, "bench: iperf3 client did not finish\n");
    else if ((gbs = parse_gbs(out.p)) > 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
      fprintf(stderr, "bench: iperf3 client exited with status 0x%x\n", st);
      gbs = -1;
    }
  }
  free(out.p);
  /* After a test the one-off server exits by itself; after a failure it
   * may wait for a client forever. */
  outbuf rest = {0};
  int r = gbs > 0 ? read_out(sfd, &rest, NULL, now_ms() + EXIT_MS) : -1;
  free(rest.p);
  close(sfd);
  int st = reap(spid, r != 1);
  if (r == 1 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
    fprintf(stderr, "bench: iperf3 server exited with status 0x%x\n", st);
  return gbs;
}
