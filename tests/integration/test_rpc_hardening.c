/* Integration tests of the RPC layer's hardening (issue 9): shutdown in the
 * middle of a big upload or read, the listener after fd exhaustion, receive
 * limits, the end of a request stream, and one log line per message.
 *
 * Each test starts its own ps-server through the harness (stderr in a
 * file, optionally under a low RLIMIT_NOFILE: harness_start_opts), and the
 * big-stream tests a client process (this program run with
 * --client-loop): both die with the test process whatever happens (the
 * harness's PR_SET_PDEATHSIG and guardian, plus an atexit hook, which also
 * runs when a Check assertion ends the forked test). */
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rpc.h"
#include "harness.h"
#include "paramserver/client.h"
#include "ps.pb-c.h"
#include "tests/support/assert.h"

/* ---- one ps-server ---- */

typedef struct srv {
  ps_harness h; /* its one ps: h.pids[0], h.addrs[0], h.cluster */
  char dir[128];
  char log[200];
} srv;

static srv S;
static pid_t CHILD; /* a client process of the test, if any */

/* Every server's directory lies in BASE, made and removed by an unchecked
 * fixture in Check's parent process: a test killed by its timeout (no
 * atexit runs in its forked child) leaves nothing behind. */
static char BASE[64];
static void base_make(void) {
  harness_scratch_base(BASE, sizeof BASE, "rpch");
}
static void base_remove(void) {
  harness_scratch_remove(BASE);
}

static void cleanup(void) {
  if (CHILD > 0) {
    kill(CHILD, SIGKILL);
    waitpid(CHILD, NULL, 0);
    CHILD = 0;
  }
  harness_kill(&S.h, 0);
  harness_stop(&S.h);
  if (S.dir[0]) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", S.dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", S.dir);
    S.dir[0] = '\0';
  }
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void pause_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* Starts ps-server with @extra args, its stderr in S.log; @nofile > 0
 * sets RLIMIT_NOFILE (soft and hard), @nofile < 0 only the soft limit, to
 * -@nofile. */
static void srv_start(const char *const *extra, long nofile) {
  static int registered;
  if (!registered) {
    atexit(cleanup);
    registered = 1;
  }
  memset(&S, 0, sizeof S);
  ck_assert_int_eq(harness_scratch_dir(S.dir, sizeof S.dir, BASE), 0);
  snprintf(S.log, sizeof S.log, "%s/ps.log", S.dir);
  harness_opts o = {.stderr_path = S.log, .nofile = nofile};
  ck_assert_int_eq(harness_start_opts(&S.h, 1, extra, &o), 0);
}

/* Waits up to @ms for the server to exit; its wait status, or -1. */
static int srv_wait(int ms) {
  int64_t end = now_ms() + ms;
  int status;
  while (now_ms() < end) {
    pid_t r = waitpid(S.h.pids[0], &status, WNOHANG);
    if (r == S.h.pids[0]) {
      S.h.pids[0] = 0;
      return status;
    }
    pause_ms(10);
  }
  return -1;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return strdup("");
  size_t n = 0, cap = 4096;
  char *b = malloc(cap);
  for (;;) {
    if (n + 1024 + 1 > cap) b = realloc(b, cap *= 2);
    size_t got = fread(b + n, 1, 1024, f);
    n += got;
    if (got == 0) break;
  }
  b[n] = '\0';
  fclose(f);
  return b;
}

static int log_has(const char *needle) {
  char *b = slurp(S.log);
  int r = strstr(b, needle) != NULL;
  free(b);
  return r;
}

/* Polls the server's log for @needle for up to @ms. */
static int log_wait(const char *needle, int ms) {
  int64_t end = now_ms() + ms;
  while (now_ms() < end) {
    if (log_has(needle)) return 1;
    pause_ms(20);
  }
  return 0;
}

/* SIGTERM; the server must exit 0 within 60 s and log its stopped line. */
static void srv_stop_ok(void) {
  kill(S.h.pids[0], SIGTERM);
  int status = srv_wait(60000);
  char *b = slurp(S.log);
  if (status == -1 && getenv("TEST_GDB")) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "gdb -p %d -batch -ex 'thread apply all bt' >&2",
             (int)S.h.pids[0]);
    if (system(cmd) != 0) fprintf(stderr, "gdb failed\n");
    snprintf(cmd, sizeof cmd, "cp %s /tmp/rpc_hang.log", S.log);
    if (system(cmd) != 0) fprintf(stderr, "cp failed\n");
  }
  if (strlen(b) > 3000) memmove(b, b + strlen(b) - 3000, 3001); /* the end */
  ck_assert_msg(status != -1, "ps-server did not stop on SIGTERM; log:\n%s", b);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "ps-server ended with status 0x%x; log:\n%s", status, b);
  ck_assert_msg(strstr(b, "stopped (") != NULL, "no stopped line; log:\n%s", b);
  free(b);
}

static ps_client *client(void) {
  ps_status st;
  ps_client_options o;
  ps_client_options_default(&o);
  o.max_retries = 0;
  o.control_timeout_ms = 20000;
  ps_client *c = ps_client_create(S.h.cluster, "ps", &o, &st);
  ck_assert_msg(c != NULL, "%s", st.msg);
  return c;
}

static void create_float(ps_client *c, const char *name, int64_t n) {
  ps_status st;
  ps_var_spec v = {.name = name, .dtype = PS_DT_FLOAT, .shape = {.rank = 1, .dim = {n}}};
  PS_ASSERT_OK(ps_client_create_vars(c, 0, &v, 1, &st), st);
}

static ps_tensor *ftensor(int64_t n, float fill) {
  ps_shape s = {.rank = 1, .dim = {n}};
  ps_tensor *t = ps_tensor_create(PS_DT_FLOAT, &s, false);
  float *p = ps_tensor_data(t);
  for (int64_t i = 0; i < n; i++)
    p[i] = fill;
  return t;
}

static void assign(ps_client *c, const char *name, const ps_tensor *t) {
  ps_status st;
  ps_update u = {.name = name, .op = PS_ASSIGN, .value = t};
  PS_ASSERT_OK(ps_client_update(c, 0, &u, 1, &st), st);
}

static long long rss_of(pid_t pid) {
  return harness_rss(pid, NULL);
}

static int status_ok(ps_status *st);

/* ---- SIGTERM in the middle of big streams ---- */

#define BIG_FLOATS ((int64_t)64 << 20) /* 256 MiB */

/* Child process (this program run as "--client-loop SPEC READS", see
 * main): creates "big" (reads: and assigns it), writes one byte to @ready,
 * then uploads (or reads) BIG_FLOATS floats until an error. */
static void client_loop(int reads, int ready) {
  ps_rpc_global_init();
  ps_client *c = client();
  create_float(c, "big", BIG_FLOATS);
  ps_tensor *t = ftensor(BIG_FLOATS, 1.5f);
  /* Reads: the assigned tensor stays alive.  Destroyed, its buffer would
   * wait in the buffer cache (common/tensor.c) and the first read's output
   * would take it, already resident: then the reader's RSS would grow only
   * by what gRPC buffers, which wait_rss cannot count on.  Kept, the first
   * read lands in new memory and the RSS grows with the stream. */
  if (reads) assign(c, "big", t);
  if (write(ready, "r", 1) != 1) _exit(3);
  ps_status st;
  for (;;) {
    if (reads) {
      ps_read r = {.name = "big"};
      if (ps_client_read(c, 0, &r, 1, &st) != 0) break;
      ps_tensor_destroy(r.out);
    } else {
      ps_update u = {.name = "big", .op = PS_ASSIGN, .value = t};
      if (ps_client_update(c, 0, &u, 1, &st) != 0) break;
    }
  }
  if (getenv("TEST_VERBOSE")) fprintf(stderr, "client loop: %s\n", st.msg);
  _exit(0);
}

/* Starts this program as a client loop of S's ps (through the harness: it
 * dies with the test) and waits until it is ready. */
static pid_t start_client_loop(int reads) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ck_assert_int_gt(n, 0);
  self[n] = '\0';
  const char *argv[] = {self, "--client-loop", S.h.spec, reads ? "1" : "0", NULL};
  int out;
  pid_t pid = harness_spawn(&S.h, argv, &out);
  ck_assert_int_gt(pid, 0);
  CHILD = pid;
  struct pollfd pfd = {out, POLLIN, 0};
  char ch;
  ck_assert_msg(poll(&pfd, 1, 120000) == 1 && read(out, &ch, 1) == 1,
                "the client did not get ready");
  close(out);
  return pid;
}

static void stop_child(void) {
  if (CHILD <= 0) return;
  kill(CHILD, SIGKILL);
  waitpid(CHILD, NULL, 0);
  CHILD = 0;
}

/* Waits until @pid's RSS is @grow bytes above @base (a stream is running). */
static void wait_rss(pid_t pid, long long base, long long grow) {
  int64_t end = now_ms() + 60000;
  long long r = 0;
  while (now_ms() < end) {
    r = rss_of(pid);
    if (r > 0 && r < base) base = r; /* memory freed since: a lower base */
    if (r - base >= grow) return;
    pause_ms(2);
  }
  ck_abort_msg("the stream did not start: rss %lld, base %lld", r, base);
}

static const char *const GRACE1[] = {"--grace-secs", "1", NULL};

/* Several RPC threads, and no grace: the calls are cancelled while chunks
 * are being copied (the abort needs a thread inside a chunk when
 * the shutdown completes; 256 MiB would finish within --grace-secs 1). */
static const char *const GRACE0[] = {"--grace-secs", "0", "--threads", "4", NULL};

/* The crash: SIGTERM during a big upload with --grace-secs 1. */
START_TEST(sigterm_during_upload) {
  for (int round = 0; round < 8; round++) {
    srv_start(round < 4 ? GRACE1 : GRACE0, 0);
    long long base = rss_of(S.h.pids[0]);
    pid_t ch = start_client_loop(0);
    /* A different moment of the stream each round. */
    wait_rss(S.h.pids[0], base, (long long)(16 + 48 * (round % 4)) << 20);
    if (round == 3) kill(ch, SIGSTOP); /* stalled: only the grace cancels it */
    srv_stop_ok();
    stop_child();
    cleanup();
  }
}
END_TEST

START_TEST(sigterm_during_read) {
  for (int round = 0; round < 4; round++) {
    srv_start(GRACE1, 0);
    pid_t ch = start_client_loop(1);
    long long base = rss_of(ch);
    wait_rss(ch, base, (long long)(16 + 8 * round) << 20);
    /* A reader that stopped reading: gRPC's cancel-all alone left such a
     * call blocked in its send (the ps never stopped). */
    if (round >= 2) kill(ch, SIGSTOP);
    srv_stop_ok();
    stop_child();
    cleanup();
  }
}
END_TEST

/* ---- fd exhaustion ---- */

static int status_ok(ps_status *st) {
  ps_client *c = client();
  ps_task_status ts;
  int rc = ps_client_status(c, 0, &ts, st);
  ps_client_destroy(c);
  return rc;
}

static int tcp_connect(const char *addr) {
  char host[64];
  const char *colon = strrchr(addr, ':');
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, host, &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Opens @n idle connections; waits until the server has taken what it
 * will take (its accept loop is behind by at most the backlog). */
static void exhaust_and_recover(void) {
  enum { N = 200 };
  int fds[N], n = 0;
  for (int i = 0; i < N; i++) {
    int fd = tcp_connect(S.h.addrs[0]);
    if (fd >= 0) fds[n++] = fd;
  }
  ck_assert_int_gt(n, 100);
  ps_status st;
  int64_t end = now_ms() + 20000;
  while (!log_has("accepting connections: Too many open files") &&
         !log_has("(--max-connections): closing new ones") && now_ms() < end)
    pause_ms(20);
  ck_assert_msg(now_ms() < end, "the server never ran out of descriptors or connections");
  for (int i = 0; i < n; i++)
    close(fds[i]);
  /* Descriptors come back as gRPC notices the closed connections. */
  int rc = -1;
  end = now_ms() + 30000;
  while (rc != 0 && now_ms() < end)
    rc = status_ok(&st);
  ck_assert_msg(rc == 0, "Status after the burst: %s", st.msg);
  /* And again: the listener still works after a second burst. */
  n = 0;
  for (int i = 0; i < N; i++) {
    int fd = tcp_connect(S.h.addrs[0]);
    if (fd >= 0) fds[n++] = fd;
  }
  for (int i = 0; i < n; i++)
    close(fds[i]);
  rc = -1;
  end = now_ms() + 30000;
  while (rc != 0 && now_ms() < end)
    rc = status_ok(&st);
  ck_assert_msg(rc == 0, "Status after the second burst: %s", st.msg);
}

START_TEST(listener_survives_fd_exhaustion) {
  /* 40 descriptors, and a connection cap that does not stop the burst. */
  const char *const extra[] = {"--max-connections", "1000", NULL};
  srv_start(extra, 40);
  ps_rpc_global_init();
  exhaust_and_recover();
  ps_rpc_global_shutdown();
  ck_assert(log_has("accepting connections: Too many open files"));
  srv_stop_ok();
  cleanup();
}
END_TEST

START_TEST(connection_cap) {
  const char *const extra[] = {"--max-connections", "8", NULL};
  srv_start(extra, 0);
  ps_rpc_global_init();
  exhaust_and_recover();
  ps_rpc_global_shutdown();
  ck_assert(log_has("8 connections open (--max-connections): closing new ones"));
  srv_stop_ok();
  cleanup();
}
END_TEST

START_TEST(fd_limit_raised_and_default_cap) {
  /* A soft limit of 40 below the hard one: the ps raises it. */
  srv_start(NULL, -40);
  char path[64], *b;
  snprintf(path, sizeof path, "/proc/%d/limits", (int)S.h.pids[0]);
  b = slurp(path);
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  char want[128];
  if (rl.rlim_max == RLIM_INFINITY)
    snprintf(want, sizeof want, "unlimited");
  else
    snprintf(want, sizeof want, "%llu", (unsigned long long)rl.rlim_max);
  char *line = strstr(b, "Max open files");
  ck_assert_ptr_nonnull(line);
  /* "Max open files   SOFT   HARD   files": soft equals hard. */
  char soft[32], hard[32];
  ck_assert_int_eq(sscanf(line + 14, "%31s %31s", soft, hard), 2);
  ck_assert_str_eq(soft, hard);
  ck_assert_str_eq(soft, want);
  free(b);
  ck_assert(log_has("at most "));
  srv_stop_ok();
  cleanup();
}
END_TEST

START_TEST(port_zero_and_no_sharing) {
  srv_start(NULL, 0);
  const char *colon = strrchr(S.h.addrs[0], ':');
  ck_assert_int_gt(atoi(colon + 1), 0);
  char dir[128], cmd[600], *out = NULL;
  snprintf(dir, sizeof dir, "%s/second.json", S.dir);
  FILE *f = fopen(dir, "w");
  fprintf(f, "{\"ps\": [\"%s\"]}\n", S.h.addrs[0]);
  fclose(f);
  snprintf(cmd, sizeof cmd, "timeout 60 %s --cluster %s 2>&1",
           harness_prog("PS_SERVER", "build/ps/ps-server"), dir);
  int rc = harness_run(cmd, &out);
  ck_assert_msg(rc != 0 && strstr(out, "address in use"), "rc %d: %s", rc, out);
  free(out);
  ps_rpc_global_init();
  ps_status st;
  PS_ASSERT_OK(status_ok(&st), st);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  cleanup();
}
END_TEST

/* ---- receive limits ---- */

START_TEST(max_message_bytes) {
  const char *const extra[] = {"--max-message-bytes", "16777232", NULL};
  srv_start(extra, 0);
  ps_rpc_global_init();
  ps_rpc_channel *ch = ps_rpc_channel_create(S.h.addrs[0]);
  /* A ReadRequest header of 17 MiB: one item with a 17 MiB name, over the
   * message limit and its quarter, the header limit. */
  size_t name_len = (size_t)17 << 20;
  uint8_t *hdr = malloc(name_len + 32);
  size_t n = 0, item = name_len + 4; /* 0x0a varint(name_len) name */
  hdr[n++] = 0x0a;
  for (uint64_t v = item;; v >>= 7) {
    hdr[n++] = (uint8_t)(v < 0x80 ? v : (v & 0x7f) | 0x80);
    if (v < 0x80) break;
  }
  hdr[n++] = 0x0a;
  for (uint64_t v = name_len;; v >>= 7) {
    hdr[n++] = (uint8_t)(v < 0x80 ? v : (v & 0x7f) | 0x80);
    if (v < 0x80) break;
  }
  memset(hdr + n, 'a', name_len);
  n += name_len;
  ps_rpc_req r = {.ch = ch,
                  .method = "/paramserver.Ps/Read",
                  .raw_request = hdr,
                  .raw_len = n,
                  .timeout_ms = 30000};
  ps_rpc_run(&r, 1);
  PS_ASSERT_STATUS(r.st.code, r.st, PS_RESOURCE_EXHAUSTED,
                   "Read: request header of 17825802 bytes is over the limit "
                   "of 16777232 bytes (--max-message-bytes)");
  /* Twice the limit and more: gRPC stops reading it. */
  ps_rpc_req r2 = {.ch = ch,
                   .method = "/paramserver.Ps/Read",
                   .raw_request = hdr,
                   .raw_len = (size_t)33 << 20,
                   .timeout_ms = 30000};
  hdr = realloc(hdr, r2.raw_len);
  memset(hdr, 0, r2.raw_len);
  r2.raw_request = hdr;
  ps_rpc_run(&r2, 1);
  ck_assert_msg(r2.st.code == PS_RESOURCE_EXHAUSTED, "%d %s", r2.st.code, r2.st.msg);
  free(hdr);
  /* A 20 MiB assign (chunks of PS_RPC_CHUNK_MAX) is under the smallest limit. */
  ps_client *c = client();
  create_float(c, "v", (int64_t)5 << 20);
  ps_tensor *t = ftensor((int64_t)5 << 20, 3.0f);
  assign(c, "v", t);
  ps_tensor_destroy(t);
  ps_client_destroy(c);
  ps_rpc_channel_destroy(ch);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  cleanup();
}
END_TEST

/* UpdateRequest{updates{name, ASSIGN, float, shape [n]}} (+ inline data). */
static size_t pack_update(uint8_t *buf, size_t cap, const char *name, int64_t n,
                          const void *inline_data, size_t inline_len) {
  Paramserver__Update u = PARAMSERVER__UPDATE__INIT;
  u.name = (char *)name;
  u.op = PARAMSERVER__UPDATE_OP__ASSIGN;
  u.dtype = 1;
  u.n_shape = 1;
  u.shape = &n;
  Paramserver__Update *up = &u;
  Paramserver__UpdateRequest req = PARAMSERVER__UPDATE_REQUEST__INIT;
  req.n_updates = 1;
  req.updates = &up;
  if (inline_data) {
    req.inline_data.data = (uint8_t *)inline_data;
    req.inline_data.len = inline_len;
  }
  size_t k = paramserver__update_request__get_packed_size(&req);
  ck_assert_uint_le(k, cap);
  return paramserver__update_request__pack(&req, buf);
}

START_TEST(stream_timeout_request) {
  const char *const extra[] = {"--stream-timeout-secs", "1", NULL};
  srv_start(extra, 0);
  ps_rpc_global_init();
  ps_client *c = client();
  create_float(c, "w", 1024);
  ps_client_destroy(c);
  ps_rpc_channel *ch = ps_rpc_channel_create(S.h.addrs[0]);
  uint8_t hdr[128];
  size_t n = pack_update(hdr, sizeof hdr, "w", 1024, NULL, 0);
  /* Announces 4 KiB, sends 1 KiB, then neither data nor end of stream. */
  ps_buf *data = ps_buf_create(4096, true);
  ps_rpc_segs send = {0};
  ps_rpc_segs_add(&send, data->data, 1024, data);
  ps_rpc_req r = {.ch = ch,
                  .method = "/paramserver.Ps/Update",
                  .raw_request = hdr,
                  .raw_len = n,
                  .send = &send,
                  .unary_response = true,
                  .keep_open = true,
                  .timeout_ms = 20000};
  int64_t t0 = now_ms();
  ps_rpc_run(&r, 1);
  PS_ASSERT_STATUS(r.st.code, r.st, PS_RESOURCE_EXHAUSTED,
                   "no request data arrived for 1 s: call cancelled "
                   "(limit --stream-timeout-secs)");
  ck_assert_int_lt(now_ms() - t0, 10000);
  ps_rpc_segs_fini(&send);
  ps_buf_unref(data);
  ps_rpc_channel_destroy(ch);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  cleanup();
}
END_TEST

/* A reader that takes the header, then stops reading until the server gave
 * up on it (seen in the server's log). */
static int stall_on_header(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                           ps_status *st) {
  (void)p;
  (void)n;
  (void)st;
  ps_buf *b = user;
  ps_rpc_segs_add(sink, b->data, b->size, b);
  log_wait("the client read no response data", 30000);
  return 0;
}

START_TEST(stream_timeout_response) {
  const char *const extra[] = {"--stream-timeout-secs", "1", NULL};
  srv_start(extra, 0);
  ps_rpc_global_init();
  ps_client *c = client();
  const int64_t nf = (int64_t)16 << 20; /* 64 MiB */
  create_float(c, "big", nf);
  ps_tensor *t = ftensor(nf, 1.0f);
  assign(c, "big", t);
  ps_tensor_destroy(t);
  ps_rpc_channel *ch = ps_rpc_channel_create(S.h.addrs[0]);
  Paramserver__ReadItem it = PARAMSERVER__READ_ITEM__INIT, *itp = &it;
  it.name = "big";
  Paramserver__ReadRequest req = PARAMSERVER__READ_REQUEST__INIT;
  req.n_items = 1;
  req.items = &itp;
  ps_buf *b = ps_buf_create((size_t)nf * 4, false);
  ps_rpc_req r = {.ch = ch,
                  .method = "/paramserver.Ps/Read",
                  .request = &req.base,
                  .on_header = stall_on_header,
                  .user = b,
                  .timeout_ms = 60000};
  ps_rpc_run(&r, 1);
  ck_assert_msg(r.st.code == PS_RESOURCE_EXHAUSTED, "%d %s", r.st.code, r.st.msg);
  ck_assert_msg(strstr(r.st.msg, "--stream-timeout-secs"), "%s", r.st.msg);
  ck_assert(log_has("/paramserver.Ps/Read: the client read no response data for 1 s: "
                    "call cancelled (limit --stream-timeout-secs)"));
  ps_buf_unref(b);
  /* The server goes on serving. */
  ps_status st;
  ps_task_status ts;
  PS_ASSERT_OK(ps_client_status(c, 0, &ts, &st), st);
  ps_client_destroy(c);
  ps_rpc_channel_destroy(ch);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  cleanup();
}
END_TEST

/* A reader that stopped for good: the call is cancelled, and when its
 * connection stays stuck in a write, the connection is closed. */
START_TEST(stream_timeout_stopped_reader) {
  const char *const extra[] = {"--stream-timeout-secs", "1", "--log-level", "debug",
                               NULL};
  srv_start(extra, 0);
  pid_t ch = start_client_loop(1);
  wait_rss(ch, rss_of(ch), (long long)16 << 20);
  kill(ch, SIGSTOP);
  ck_assert_msg(
      log_wait("the client read no response data for 1 s: call cancelled", 30000),
      "the stalled call was not cancelled");
  /* Either gRPC had nothing in the socket (flow control held the data:
   * the cancel dropped it), or the connection was stuck in a write and is
   * closed 2 s later. */
  int64_t end = now_ms() + 15000;
  while (!log_has(": its client has read nothing for ") && !log_has(": 0 bytes unsent") &&
         now_ms() < end)
    pause_ms(20);
  ck_assert_msg(now_ms() < end, "the stuck connection was not closed: %s", slurp(S.log));
  /* The ps goes on serving other clients. */
  ps_rpc_global_init();
  ps_status st;
  PS_ASSERT_OK(status_ok(&st), st);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  stop_child();
  cleanup();
}
END_TEST

static float read_first(ps_client *c, const char *name) {
  ps_status st;
  ps_read r = {.name = name};
  PS_ASSERT_OK(ps_client_read(c, 0, &r, 1, &st), st);
  float v = ((float *)ps_tensor_data(r.out))[0];
  ps_tensor_destroy(r.out);
  return v;
}

START_TEST(data_after_announced_bytes) {
  srv_start(NULL, 0);
  ps_rpc_global_init();
  ps_client *c = client();
  const int64_t nf = (int64_t)4 << 20; /* 16 MiB, in whole chunks */
  create_float(c, "w", nf);
  create_float(c, "s", 2);
  ps_tensor *t = ftensor(nf, 1.0f), *s2 = ftensor(2, 1.0f);
  assign(c, "w", t);
  assign(c, "s", s2);
  ps_tensor_destroy(t);
  ps_tensor_destroy(s2);
  ps_rpc_channel *ch = ps_rpc_channel_create(S.h.addrs[0]);
  uint8_t hdr[256];
  /* 16 MiB announced and sent in whole chunks, then one byte more in
   * one chunk after them. */
  size_t n = pack_update(hdr, sizeof hdr, "w", nf, NULL, 0);
  ps_tensor *v = ftensor(nf + 1, 7.0f);
  ps_buf *vb = v->buf;
  ps_rpc_segs send = {0};
  ps_rpc_segs_add(&send, ps_tensor_data(v), (size_t)nf * 4 + 1, vb);
  ps_rpc_req r = {.ch = ch,
                  .method = "/paramserver.Ps/Update",
                  .raw_request = hdr,
                  .raw_len = n,
                  .send = &send,
                  .unary_response = true,
                  .timeout_ms = 30000};
  ps_rpc_run(&r, 1);
  PS_ASSERT_STATUS(r.st.code, r.st, PS_INVALID_ARGUMENT,
                   "/paramserver.Ps/Update: more data than announced "
                   "(16777216 bytes)");
  ps_rpc_segs_fini(&send);
  ck_assert(read_first(c, "w") == 1.0f);
  /* Inline data, so nothing announced; a chunk follows anyway. */
  float two[2] = {7, 7};
  n = pack_update(hdr, sizeof hdr, "s", 2, two, sizeof two);
  ps_rpc_segs_add(&send, ps_tensor_data(v), 10, vb);
  ps_rpc_req r2 = {.ch = ch,
                   .method = "/paramserver.Ps/Update",
                   .raw_request = hdr,
                   .raw_len = n,
                   .send = &send,
                   .unary_response = true,
                   .timeout_ms = 30000};
  ps_rpc_run(&r2, 1);
  PS_ASSERT_STATUS(r2.st.code, r2.st, PS_INVALID_ARGUMENT,
                   "more data than announced (0 bytes)");
  ck_assert(read_first(c, "s") == 1.0f);
  /* Without the extra chunk the same request applies. */
  ps_rpc_req r3 = {.ch = ch,
                   .method = "/paramserver.Ps/Update",
                   .raw_request = hdr,
                   .raw_len = n,
                   .unary_response = true,
                   .timeout_ms = 30000};
  ps_rpc_run(&r3, 1);
  PS_ASSERT_OK(r3.st.code, r3.st);
  ck_assert(read_first(c, "s") == 7.0f);
  ps_rpc_segs_fini(&send);
  ps_tensor_destroy(v);
  ps_client_destroy(c);
  ps_rpc_channel_destroy(ch);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  cleanup();
}
END_TEST

/* ---- flags ---- */

START_TEST(bad_flag_values_exit_2) {
  static const char *const cases[][3] = {
      {"--max-message-bytes", "1M", "must be a size of at least 16777232 bytes"},
      {"--max-message-bytes", "-5", "must be a size of at least"},
      {"--stream-timeout-secs", "x",
       "--stream-timeout-secs must be a non-negative integer"},
      {"--max-connections", "0", "--max-connections must be a positive integer"},
      {"--max-tensor-bytes", "12Q", "--max-tensor-bytes must be a positive integer"},
      {"--max-tensor-bytes", "99999999999G", "--max-tensor-bytes must be a positive"},
      {"--max-read-names", "", "--max-read-names must be a positive integer"},
      {"--max-gather-rows", "0", "--max-gather-rows must be a positive integer"},
      {"--max-hold-ms", "1.5", "--max-hold-ms must be a positive integer"},
      {"--poll-spin-us", "10001",
       "--poll-spin-us must be an integer from 0 to 10000 (microseconds), got '10001'"},
      {"--poll-spin-us", "-1", "--poll-spin-us must be an integer from 0 to 10000"},
      {"--poll-spin-us", "5us", "--poll-spin-us must be an integer from 0 to 10000"},
      {"--recv-window", "1K",
       "--recv-window must be 0 (gRPC's probing) or a size from 64K to 1G, got '1K'"},
      {"--recv-window", "2G", "--recv-window must be 0 (gRPC's probing) or a size"},
      {"--recv-window", "-8M", "--recv-window must be 0 (gRPC's probing) or a size"},
  };
  const char *prog = harness_prog("PS_SERVER", "build/ps/ps-server");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s --cluster /nonexistent %s '%s' 2>&1", prog, cases[i][0],
             cases[i][1]);
    int rc = harness_run(cmd, &out);
    ck_assert_msg(rc == 2, "%s: status %d", cmd, rc);
    ck_assert_msg(strstr(out, cases[i][2]), "%s: %s", cmd, out);
    free(out);
  }
  char cmd[512], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s --help", prog);
  ck_assert_int_eq(harness_run(cmd, &out), 0);
  static const char *const flags[] = {
      "--max-tensor-bytes", "--max-read-names",    "--max-gather-rows",
      "--max-hold-ms",      "--max-message-bytes", "--stream-timeout-secs",
      "--max-connections",  "--poll-spin-us",      "--recv-window"};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    ck_assert_msg(strstr(out, flags[i]), "--help lacks %s", flags[i]);
  free(out);
}
END_TEST

START_TEST(good_flag_values_start) {
  const char *const extra[] = {"--max-tensor-bytes",
                               "1G",
                               "--max-read-names",
                               "10",
                               "--max-gather-rows",
                               "100",
                               "--max-hold-ms",
                               "500",
                               "--max-message-bytes",
                               "64MiB",
                               "--stream-timeout-secs",
                               "0",
                               "--max-connections",
                               "100",
                               "--poll-spin-us",
                               "250",
                               NULL};
  setenv("PS_POLL_SPIN_US", "0", 1); /* the flag wins */
  srv_start(extra, 0);
  unsetenv("PS_POLL_SPIN_US");
  ck_assert(log_has("at most 100 connections"));
  ck_assert(log_has(" threads polling 250 us"));
  srv_stop_ok();
  cleanup();
}
END_TEST

/* A 16 MiB assign and read through a new client, whole and in order
 * (each value its own index, so a lost or repeated window's worth shows);
 * then the client, gRPC and the ps are stopped. */
static void big_round_trip_then_stop(void) {
  ps_client *c = client();
  const int64_t n = (int64_t)4 << 20; /* 16 MiB of floats */
  create_float(c, "w", n);
  ps_tensor *t = ftensor(n, 0);
  float *p = ps_tensor_data(t);
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)i;
  assign(c, "w", t);
  ps_read r = {.name = "w"};
  ps_status st;
  PS_ASSERT_OK(ps_client_read(c, 0, &r, 1, &st), st);
  const float *q = ps_tensor_data(r.out);
  for (int64_t i = 0; i < n; i++)
    if (q[i] != (float)i) ck_abort_msg("w[%lld] is %g", (long long)i, (double)q[i]);
  ps_tensor_destroy(r.out);
  ps_tensor_destroy(t);
  ps_client_destroy(c);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  cleanup();
}

/* ps_rpc_global_init with PS_RECV_WINDOW=@value: what it wrote to stderr. */
static char *init_with_window(const char *value) {
  char path[] = "/tmp/ps-win-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  int saved = dup(2);
  dup2(fd, 2);
  setenv("PS_RECV_WINDOW", value, 1);
  ps_rpc_global_init();
  unsetenv("PS_RECV_WINDOW");
  dup2(saved, 2);
  close(saved);
  close(fd);
  char *b = slurp(path);
  unlink(path);
  return b;
}

/* --recv-window and PS_RECV_WINDOW: the smallest fixed window there is,
 * on the ps and on the client, still carries 16 MiB whole. */
START_TEST(recv_window_fixed) {
  const char *extra[] = {"--recv-window", "64K", NULL};
  srv_start(extra, 0);
  ck_assert(log_wait("HTTP/2 receive windows fixed at 65536 bytes, no probing", 10000));
  free(init_with_window("64K"));
  ck_assert_int_eq(ps_rpc_client_recv_window(), 65536);
  big_round_trip_then_stop();
}
END_TEST

/* The default and 0 (both gRPC's probing) on both sides; a
 * bad PS_RECV_WINDOW is said and changes nothing. */
START_TEST(recv_window_default_and_probing) {
  srv_start(NULL, 0);
  ck_assert(log_wait("HTTP/2 receive windows grow with gRPC's bandwidth-delay probing "
                     "(the default; --recv-window N fixes them)",
                     10000));
  srv_stop_ok();
  cleanup();
  const char *extra[] = {"--recv-window", "0", NULL};
  srv_start(extra, 0);
  ck_assert(log_wait("HTTP/2 receive windows grow with gRPC's bandwidth-delay probing "
                     "(the default; --recv-window N fixes them)",
                     10000));
  free(init_with_window("16M"));
  ps_rpc_global_shutdown();
  char *err = init_with_window("fast");
  ck_assert_msg(strstr(err, "PS_RECV_WINDOW must be 0 (gRPC's probing) or a size from "
                            "64K to 1G, got 'fast'; keeping 16777216"),
                "%s", err);
  free(err);
  ck_assert_int_eq(ps_rpc_client_recv_window(), 16777216);
  ps_rpc_global_shutdown();
  free(init_with_window("0"));
  ck_assert_int_eq(ps_rpc_client_recv_window(), 0); /* 16M before: probing again */
  big_round_trip_then_stop();
}
END_TEST

/* ---- polling before sleeping (--poll-spin-us) ---- */

/* CPU seconds (user + system) process @pid has used so far. */
static double cpu_secs(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_msg(f, "cannot open %s", path);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the name may hold spaces */
  ck_assert(p);
  unsigned long long ut = 0, stime = 0;
  /* after ")": state, then fields 4..13, then utime (14) and stime (15) */
  ck_assert_int_eq(
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stime),
      2);
  return (double)(ut + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* The longest poll there is, 10 ms after each event: after a burst of
 * calls the ps goes back to sleep, so an idle ps uses (next to) no CPU.
 * A poll that never ended would use a whole core. */
START_TEST(poll_spin_ends_when_idle) {
  const char *extra[] = {"--poll-spin-us", "10000", NULL};
  srv_start(extra, 0);
  ck_assert(log_wait("polling 10000 us", 10000));
  ps_rpc_global_init();
  ck_assert_int_eq(ps_rpc_set_poll_spin_us(10000), 0);
  ck_assert_int_eq(ps_rpc_poll_spin_us(), 10000);
  ck_assert_int_eq(ps_rpc_set_poll_spin_us(10001), -1);
  ck_assert_int_eq(ps_rpc_set_poll_spin_us(-1), -1);
  ck_assert_int_eq(ps_rpc_poll_spin_us(), 10000);  /* unchanged */
  ck_assert_int_eq(ps_rpc_set_poll_spin_us(0), 0); /* the client sleeps at once */
  ps_client *c = client();
  ps_task_status ts;
  ps_status st;
  for (int i = 0; i < 300; i++)
    PS_ASSERT_OK(ps_client_status(c, 0, &ts, &st), st);
  pause_ms(300);
  double t0 = cpu_secs(S.h.pids[0]);
  pause_ms(1500);
  double used = cpu_secs(S.h.pids[0]) - t0;
  ck_assert_msg(used < 0.3, "an idle ps-server used %.2f CPU s in 1.5 s", used);
  ps_client_destroy(c);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  cleanup();
}
END_TEST

/* CPU nanoseconds the threads of process @pid have run so far (each
 * thread's /proc/PID/task/TID/schedstat: the process's own file counts
 * its main thread alone). */
static double cpu_ns(pid_t pid) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  ck_assert_msg(d, "cannot open %s", path);
  double sum = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue; /* the thread ended */
    unsigned long long ns = 0;
    if (fscanf(f, "%llu", &ns) == 1) sum += (double)ns;
    fclose(f);
  }
  closedir(d);
  return sum;
}

/* The ps's CPU over 20 calls, each followed by 30 ms of quiet, with the
 * ps-server started with --poll-spin-us @spin (the client sleeps at once). */
static double cpu_over_calls(const char *spin) {
  const char *extra[] = {"--poll-spin-us", spin, NULL};
  srv_start(extra, 0);
  char want[64];
  snprintf(want, sizeof want, "polling %s us", spin);
  ck_assert_msg(log_wait(want, 10000), "no \"%s\" in the log", want);
  ps_rpc_global_init();
  ck_assert_int_eq(ps_rpc_set_poll_spin_us(0), 0);
  ps_client *c = client();
  ps_task_status ts;
  ps_status st;
  PS_ASSERT_OK(ps_client_status(c, 0, &ts, &st), st);
  pause_ms(100);
  double t0 = cpu_ns(S.h.pids[0]);
  for (int i = 0; i < 20; i++) {
    PS_ASSERT_OK(ps_client_status(c, 0, &ts, &st), st);
    pause_ms(30);
  }
  double used = cpu_ns(S.h.pids[0]) - t0;
  ps_client_destroy(c);
  ps_rpc_global_shutdown();
  srv_stop_ok();
  cleanup();
  return used;
}

/* After each event the ps polls for up to --poll-spin-us before it
 * sleeps: 10 ms of polling after each of 20 calls shows in its CPU time
 * (84-121 ms of the 200 ms on the 2-core VM, 4 ms without; this test
 * runs alone, so every runnable thread has a core). */
START_TEST(poll_spin_polls_after_each_event) {
  double on = cpu_over_calls("10000"), off = cpu_over_calls("0");
  fprintf(stderr, "poll_spin: the ps ran %.1f ms polling, %.1f ms not\n", on / 1e6,
          off / 1e6);
  ck_assert_msg(on >= 40e6, "polling 10 ms after each of 20 calls: the ps ran %.1f ms",
                on / 1e6);
  ck_assert_msg(off < 25e6, "no polling: the ps ran %.1f ms over 20 calls", off / 1e6);
}
END_TEST

/* --poll-spin-us values and PS_POLL_SPIN_US: digits only, 0..10000; a
 * set value wins over the environment. */
START_TEST(poll_spin_values) {
  static const char *const bad[] = {
      "", "-1", "+5", " 5", "5 ", "0x10", "10001", "99999999999999999999", "1e3", "5us"};
  int64_t us = -7;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_msg(ps_rpc_parse_poll_spin_us(bad[i], &us) == -1, "'%s' taken", bad[i]);
    ck_assert_int_eq(us, -7);
  }
  ck_assert_int_eq(ps_rpc_parse_poll_spin_us("0", &us), 0);
  ck_assert_int_eq(us, 0);
  ck_assert_int_eq(ps_rpc_parse_poll_spin_us("10000", &us), 0);
  ck_assert_int_eq(us, 10000);
  ck_assert_int_eq(ps_rpc_parse_poll_spin_us("007", &us), 0);
  ck_assert_int_eq(us, 7);
  /* (a forked test: the process-wide value starts at the default) */
  ck_assert_int_eq(ps_rpc_poll_spin_us(), PS_RPC_DEFAULT_POLL_SPIN_US);
  setenv("PS_POLL_SPIN_US", "7", 1);
  ck_assert_int_eq(ps_rpc_set_poll_spin_us(250), 0);
  ps_rpc_global_init();
  ck_assert_int_eq(ps_rpc_poll_spin_us(), 250);
  ps_rpc_global_shutdown();
  unsetenv("PS_POLL_SPIN_US");
}
END_TEST

/* PS_POLL_SPIN_US is the default of --poll-spin-us; a bad one is logged
 * and the default kept. */
START_TEST(poll_spin_environment) {
  setenv("PS_POLL_SPIN_US", "0", 1);
  srv_start(NULL, 0);
  ck_assert(log_wait("polling 0 us", 10000));
  srv_stop_ok();
  cleanup();
  setenv("PS_POLL_SPIN_US", "fast", 1);
  srv_start(NULL, 0);
  unsetenv("PS_POLL_SPIN_US");
  ck_assert(log_wait("polling 1000 us", 10000));
  ck_assert(
      log_has("PS_POLL_SPIN_US must be an integer from 0 to 10000 (microseconds), got "
              "'fast'; using 1000"));
  srv_stop_ok();
  cleanup();
}
END_TEST

/* ---- log lines ---- */

START_TEST(log_escapes_control_characters) {
  /* In this process: one message is one line. */
  char path[] = "/tmp/ps-log-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  int saved = dup(2);
  dup2(fd, 2);
  ps_log_set_task("t\n0");
  PS_ERROR("name %s end", "a\nERROR forged\r\t\x01\x7f");
  dup2(saved, 2);
  close(saved);
  close(fd);
  char *b = slurp(path);
  unlink(path);
  ck_assert_msg(strstr(b, " ERROR t\\n0: name a\\nERROR forged\\r\\t\\x01\\x7f end\n"),
                "%s", b);
  ck_assert_ptr_eq(strchr(b, '\n'), b + strlen(b) - 1);
  free(b);
  char esc[8];
  ck_assert_uint_eq(ps_log_escape(esc, sizeof esc, "ab\ncd", 5), 6);
  ck_assert_str_eq(esc, "ab\\ncd");
  ck_assert_uint_eq(ps_log_escape(esc, 3, "a\nb", 3), 1); /* no half escape */
  ck_assert_str_eq(esc, "a");

  /* Through a ps: a name with newlines, logged at debug level. */
  const char *const extra[] = {"--log-level", "debug", NULL};
  srv_start(extra, 0);
  ps_rpc_global_init();
  ps_client *c = client();
  ps_status st;
  ps_read r = {.name = "nope\n2026-01-01 00:00:00.000 INFO ps/0: forged"};
  ck_assert_int_ne(ps_client_read(c, 0, &r, 1, &st), 0);
  ps_client_destroy(c);
  ps_rpc_global_shutdown();
  ck_assert(log_wait("forged", 20000));
  srv_stop_ok();
  b = slurp(S.log);
  int lines = 0;
  for (char *line = b; *line; lines++) {
    char *nl = strchr(line, '\n');
    ck_assert_ptr_nonnull(nl);
    *nl = '\0';
    /* gRPC's own lines start with a letter and a date (E1123 ...). */
    int ours = line[0] >= '0' && line[0] <= '9';
    if (ours) {
      int y, mo, d, h, mi, s, ms;
      ck_assert_msg(sscanf(line, "%d-%d-%d %d:%d:%d.%d", &y, &mo, &d, &h, &mi, &s, &ms) ==
                        7,
                    "line %d: %s", lines, line);
      ck_assert_msg(strstr(line, " ps/0: "), "line %d: %s", lines, line);
    }
    ck_assert_msg(strncmp(line, "2026-01-01 00:00:00.000", 23) != 0, "forged line: %s",
                  line);
    line = nl + 1;
  }
  ck_assert_int_gt(lines, 2);
  free(b);
  cleanup();
}
END_TEST

/* Connections without calls (a silent TCP client, one that stops after the
 * HTTP/2 preface, an idle gRPC channel) do not hold the exit until the
 * grace period ends. */
START_TEST(sigterm_with_idle_connections_exits_at_once) {
  const char *extra[] = {"--grace-secs", "60", NULL};
  srv_start(extra, 0);
  int a = tcp_connect(S.h.addrs[0]), b = tcp_connect(S.h.addrs[0]);
  ck_assert(a >= 0 && b >= 0);
  static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  ck_assert_int_eq(write(b, preface, sizeof preface - 1), (ssize_t)(sizeof preface - 1));
  ps_rpc_global_init();
  ps_client *c = client();
  ps_task_status ts;
  ps_status st;
  PS_ASSERT_OK(ps_client_status(c, 0, &ts, &st), st);
  ck_assert(log_wait("serving on", 10000));
  int64_t t0 = now_ms();
  srv_stop_ok(); /* within 60 s */
  int64_t took = now_ms() - t0;
  ck_assert_msg(took < 30000, "SIGTERM took %lld ms with a 60 s grace period",
                (long long)took);
  ck_assert(log_has("shutting down: closed "));
  ck_assert(!log_has("after the grace period"));
  ps_client_destroy(c);
  ps_rpc_global_shutdown();
  close(a);
  close(b);
  cleanup();
}
END_TEST

/* The client loop as a test of its own, run in this process (CK_NOFORK:
 * no grandchild outlives the harness's PR_SET_PDEATHSIG), so that its
 * assertions report to Check. */
static char *LOOP_SPEC;
static int LOOP_READS, LOOP_READY;
START_TEST(client_loop_process) {
  ps_status st;
  S.h.cluster = ps_cluster_load_file(LOOP_SPEC, &st);
  ck_assert_msg(S.h.cluster != NULL, "%s", st.msg);
  client_loop(LOOP_READS, LOOP_READY);
}
END_TEST

static int run_client_loop(char *spec, int reads) {
  LOOP_SPEC = spec;
  LOOP_READS = reads;
  LOOP_READY = dup(1); /* the ready byte; Check's report goes to stderr */
  if (LOOP_READY < 0 || dup2(2, 1) < 0) return 1;
  unsetenv("CK_RUN_SUITE"); /* the test's own selection does not apply */
  unsetenv("CK_RUN_CASE");
  unsetenv("CK_INCLUDE_TAGS");
  Suite *s = suite_create("client_loop");
  TCase *tc = tcase_create("client_loop");
  tcase_add_test(tc, client_loop_process);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_SILENT); /* client_loop _exits: here it failed */
  TestResult **fail = srunner_failures(sr);
  for (int i = 0; fail && i < srunner_ntests_failed(sr); i++)
    fprintf(stderr, "client loop: %s:%d: %s\n", tr_lfile(fail[i]), tr_lno(fail[i]),
            tr_msg(fail[i]));
  free(fail);
  srunner_free(sr);
  return 1;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--client-loop") == 0)
    return run_client_loop(argv[2], argv[3][0] == '1');
  Suite *s = suite_create("rpc_hardening");
  TCase *tc = tcase_create("shutdown");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, sigterm_during_upload);
  tcase_add_test(tc, sigterm_during_read);
  tcase_add_test(tc, sigterm_with_idle_connections_exits_at_once);
  tcase_add_unchecked_fixture(tc, base_make, base_remove);
  suite_add_tcase(s, tc);
  TCase *tl = tcase_create("listener");
  tcase_set_timeout(tl, 300);
  tcase_add_test(tl, listener_survives_fd_exhaustion);
  tcase_add_test(tl, connection_cap);
  tcase_add_test(tl, fd_limit_raised_and_default_cap);
  tcase_add_test(tl, port_zero_and_no_sharing);
  tcase_add_unchecked_fixture(tl, base_make, base_remove);
  suite_add_tcase(s, tl);
  TCase *tr = tcase_create("limits");
  tcase_set_timeout(tr, 300);
  tcase_add_test(tr, max_message_bytes);
  tcase_add_test(tr, stream_timeout_request);
  tcase_add_test(tr, stream_timeout_response);
  tcase_add_test(tr, stream_timeout_stopped_reader);
  tcase_add_test(tr, data_after_announced_bytes);
  tcase_add_test(tr, bad_flag_values_exit_2);
  tcase_add_test(tr, good_flag_values_start);
  tcase_add_test(tr, poll_spin_ends_when_idle);
  tcase_add_test(tr, poll_spin_environment);
  tcase_add_test(tr, poll_spin_polls_after_each_event);
  tcase_add_test(tr, poll_spin_values);
  tcase_add_test(tr, recv_window_fixed);
  tcase_add_test(tr, recv_window_default_and_probing);
  tcase_add_test(tr, log_escapes_control_characters);
  tcase_add_unchecked_fixture(tr, base_make, base_remove);
  suite_add_tcase(s, tr);
  return ps_test_run(s);
}
