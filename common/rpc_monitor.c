/* The server's monitor thread: runs the accept loop (rpc_listen.c),
 * polices connections (rpc_conns.c), cancels calls that waited on their
 * client past --stream-timeout-secs, starts gRPC's shutdown once a stop
 * has settled, closes idle connections while stopping, and gives freed
 * heap back to the system.  Above rpc_listen.c and rpc_conns.c. */
#include "rpc_internal.h"

#include <fcntl.h>
#include <grpc/grpc.h>
#include <linux/sockios.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "tensor.h"

/* Cancels calls that waited on their client for too long. */
static void check_stalls(ps_rpc_server *s) {
  int64_t limit = s->opt.stream_timeout_ms, t = now_ms();
  if (limit <= 0) return;
  pthread_mutex_lock(&s->calls_mu);
  for (ps_rpc_call *c = s->calls; c; c = c->next) {
    int64_t since = atomic_load(&c->wait_since_ms);
    if (since == 0 || t - since < limit) continue;
    if (atomic_load(&c->timed_out)) continue;
    atomic_store(&c->timed_out, 1);
    char msg[256];
    int dir = atomic_load(&c->wait_dir);
    snprintf(msg, sizeof msg,
             "%s: %s for %lld s: call cancelled (limit --stream-timeout-secs)",
             s->h[c->hi].method,
             dir == 1 ? "no request data arrived" : "the client read no response data",
             (long long)(limit / 1000));
    PS_WARN("%s", msg);
    grpc_call_cancel_with_status(c->call, GRPC_STATUS_RESOURCE_EXHAUSTED, msg, NULL);
    /* gRPC names a connection added by fd "unknown", so every
     * connection is checked for a client that reads nothing at all. */
    if (dir == 2) ps_rpc_conns_suspect_(s, t);
  }
  pthread_mutex_unlock(&s->calls_mu);
}

/* Shutting down with no call left: gRPC waits for every connection to go,
 * and a client that keeps one open without calls (or never finishes its
 * handshake) would hold the exit until the grace period ends.  Once no
 * call has run for IDLE_CLOSE_MS, the sockets are shut down (what the
 * finished calls sent is in the kernel already and still goes out). */
#define IDLE_CLOSE_MS 200
/* gRPC's own shutdown sends GOAWAY and closes each connection as soon as
 * its last call ended, while a big response may still be on its way: the
 * bytes sit in the kernel's send queue, and the client's window updates
 * arriving at the shut socket make the kernel reset it, so the client
 * loses the tail of its read.  So a stop first refuses new calls itself
 * (UNAVAILABLE) and lets the running ones end; gRPC's shutdown starts
 * once no call runs, every connection has sent everything (SIOCOUTQ 0)
 * and those that carried a big response have gone quiet for
 * STOP_QUIET_MS (the client took it all), or after STOP_WAIT_MAX_MS, or
 * at a cancel. */
#define STOP_QUIET_MS 200
#define STOP_WAIT_MAX_MS 5000
#define STOP_BIG_BYTES 65536

/* Nothing is handed to gRPC once its shutdown starts: gRPC deletes the
 * external-connection handler (fd_handler) when it finishes shutting
 * down, so it is forgotten here, under accept_mu (accept_ready checks
 * accepting under it), whoever stops gRPC (shutdown, cancel_all). */
void ps_rpc_grpc_stop_(ps_rpc_server *s) {
  pthread_mutex_lock(&s->accept_mu);
  s->accepting = 0;
  s->fd_handler = NULL;
  pthread_mutex_unlock(&s->accept_mu);
  if (atomic_exchange(&s->grpc_stopped, 1) == 0)
    grpc_server_shutdown_and_notify(s->srv, s->cq, &s->shutdown_tag);
}

static bool conns_settled(ps_rpc_server *s) {
  bool settled = true;
  pthread_mutex_lock(&s->accept_mu);
  ps_rpc_conns_sweep_(s);
  for (int i = 0; i < s->nconns; i++) {
    conn_slot *c = &s->conns[i];
    int q = 0;
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (ioctl(c->fd, SIOCOUTQ, &q) != 0 ||
        getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0)
      continue;
    if (q >= STOP_BIG_BYTES) c->sent_big = 1;
    if (q > 0 || (c->sent_big && ti.tcpi_last_data_recv < STOP_QUIET_MS)) settled = false;
  }
  pthread_mutex_unlock(&s->accept_mu);
  return settled;
}

static void stop_when_settled(ps_rpc_server *s) {
  if (!atomic_load(&s->shutting_down) || atomic_load(&s->grpc_stopped)) return;
  pthread_mutex_lock(&s->calls_mu);
  bool idle = s->calls == NULL;
  pthread_mutex_unlock(&s->calls_mu);
  if ((idle && conns_settled(s)) || now_ms() - s->stop_begin_ms >= STOP_WAIT_MAX_MS)
    ps_rpc_grpc_stop_(s);
}

static void close_idle(ps_rpc_server *s) {
  if (!atomic_load(&s->grpc_stopped) || s->idle_closed) return;
  pthread_mutex_lock(&s->calls_mu);
  bool idle = s->calls == NULL;
  pthread_mutex_unlock(&s->calls_mu);
  int64_t t = now_ms();
  if (!idle) {
    s->idle_since_ms = 0;
    return;
  }
  if (s->idle_since_ms == 0) {
    s->idle_since_ms = t;
    return;
  }
  if (t - s->idle_since_ms < IDLE_CLOSE_MS) return;
  int n = ps_rpc_conns_shutdown_(s, NULL);
  if (n > 0) PS_INFO("shutting down: closed %d idle connection%s", n, n == 1 ? "" : "s");
  s->idle_closed = 1;
}

/* Freed heap goes back to the system.  gRPC 1.51 buffers a request
 * message whole before any limit is checked, its own (twice
 * --max-message-bytes) included: one refused 1 GiB message left ~1 GiB of
 * free heap in the arenas of gRPC's threads, and glibc keeps free heap
 * (tune_malloc keeps up to 64 MiB at the top of the main heap on purpose;
 * the other arenas shrink only from their top, which a live block pins).
 * The monitor reads the process's RSS once a second (/proc/self/statm: no
 * allocator lock); only for 10 s after it grew by HEAP_KEEP_BYTES / 2
 * since the last look, and every 60 s otherwise, does it look at the free
 * heap (mallinfo2, which walks the free chunks under the arenas' locks)
 * and, above HEAP_KEEP_BYTES, hand its free pages back with
 * malloc_trim: when it has changed by HEAP_MOVED_BYTES since the last
 * trim (gRPC frees a refused message's buffers over a few seconds), or
 * 60 s after it.  The transfers of a busy ps free far less than
 * that (their messages are 1 MiB chunks), so they keep their warm heap. */
#define HEAP_KEEP_BYTES ((size_t)128 << 20)
#define HEAP_MOVED_BYTES ((size_t)4 << 20)

/* Under AddressSanitizer (build-asan) glibc's heap is not the one in use:
 * its allocator's own figures and purge stand in (weak: absent otherwise). */
extern size_t __sanitizer_get_heap_size(void) __attribute__((weak));
extern size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));
extern void __sanitizer_purge_allocator(void) __attribute__((weak));

static size_t heap_free_bytes(void) {
  if (__sanitizer_get_heap_size && __sanitizer_get_current_allocated_bytes) {
    size_t h = __sanitizer_get_heap_size(), a = __sanitizer_get_current_allocated_bytes();
    return h > a ? h - a : 0;
  }
  return mallinfo2().fordblks;
}

/* The process's resident bytes, or -1. */
static int64_t rss_bytes(void) {
  char b[128];
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, b, sizeof b - 1);
  close(fd);
  long long size, res;
  if (n <= 0) return -1;
  b[n] = '\0';
  if (sscanf(b, "%lld %lld", &size, &res) != 2) return -1;
  return (int64_t)res * sysconf(_SC_PAGESIZE);
}

static void heap_trim(ps_rpc_server *s, int64_t t) {
  if (t - s->trim_check_ms < 1000) return;
  int64_t rss = rss_bytes();
  if (rss < 0 || rss >= s->look_rss + (int64_t)(HEAP_KEEP_BYTES / 2))
    s->look_until = t + 10000; /* grew: a large message came in */
  if (t >= s->look_until && t - s->trim_check_ms < 60000) return;
  s->trim_check_ms = t;
  s->look_rss = rss;
  size_t f = heap_free_bytes(),
         d = f > s->trim_free ? f - s->trim_free : s->trim_free - f;
  if (f <= HEAP_KEEP_BYTES || (d < HEAP_MOVED_BYTES && t - s->trim_ms < 60000)) return;
  if (__sanitizer_purge_allocator)
    __sanitizer_purge_allocator();
  else
    malloc_trim(0);
  if (d >= HEAP_KEEP_BYTES / 2) {
    int64_t after = rss_bytes();
    PS_INFO("gave %zu MiB of freed heap back to the system (a large message was "
            "received or refused; RSS %lld -> %lld MiB)",
            f >> 20, (long long)(rss >> 20), (long long)(after >> 20));
  }
  s->look_rss = rss_bytes();
  s->trim_free = f;
  s->trim_ms = t;
}

/* A ps at rest gives back its warm memory.  While it moves bytes, the
 * buffer cache (tensor.c) and the free heap tune_malloc keeps make each
 * transfer cheaper; once less than IDLE_TRIM_BYTES of request and reply
 * chunks have moved for IDLE_TRIM_MS (counted chunk by chunk, so a long
 * transfer is never idle; health probes and scalar updates carry no
 * chunks), the cached buffers are freed and the heap trimmed, once until
 * bytes move again, so its resident memory comes back to the variables
 * it holds. */
#define IDLE_TRIM_MS 2000
#define IDLE_TRIM_BYTES ((unsigned long long)1 << 20)

static void idle_trim(ps_rpc_server *s, int64_t t) {
  unsigned long long moved = atomic_load_explicit(&s->bulk_bytes, memory_order_relaxed);
  if (moved - s->quiet_bytes >= IDLE_TRIM_BYTES) {
    s->quiet_bytes = moved;
    s->quiet_since_ms = t;
    s->quiet_trimmed = 0;
    return;
  }
  if (s->quiet_trimmed || t - s->quiet_since_ms < IDLE_TRIM_MS) return;
  s->quiet_trimmed = 1;
  int64_t before = rss_bytes();
  size_t cached = ps_buf_cache_release();
  if (__sanitizer_purge_allocator)
    __sanitizer_purge_allocator();
  else
    malloc_trim(0);
  int64_t after = rss_bytes();
  if (cached == 0 && before - after < (int64_t)1 << 20) return; /* nothing to say */
  PS_DEBUG("at rest: gave back %zu MiB of cached buffers and the free heap "
           "(RSS %lld -> %lld MiB)",
           cached >> 20, (long long)(before >> 20), (long long)(after >> 20));
}

void *ps_rpc_monitor_thread_(void *arg) {
  ps_rpc_server *s = arg;
  int64_t backoff_until = 0;
  while (!atomic_load(&s->stop_monitor)) {
    struct pollfd p[MAX_LISTENERS + 1];
    int n = 0;
    p[n++] = (struct pollfd){s->wake[0], POLLIN, 0};
    int64_t t = now_ms();
    int listening = s->nlfd > 0 && t >= backoff_until;
    if (listening)
      for (int i = 0; i < s->nlfd; i++)
        p[n++] = (struct pollfd){s->lfd[i], POLLIN, 0};
    int timeout = !atomic_load(&s->shutting_down)  ? 1000
                  : !atomic_load(&s->grpc_stopped) ? 10
                  : !s->idle_closed                ? IDLE_CLOSE_MS / 2
                                                   : 1000;
    if (s->opt.stream_timeout_ms > 0 && s->opt.stream_timeout_ms / 4 < timeout)
      timeout = (int)(s->opt.stream_timeout_ms / 4) + 1;
    /* TLS: connections over the limit are shut within 0.2 s */
    if (s->tls && !s->tls_own && timeout > 200) timeout = 200;
    if (s->nlfd > 0 && !listening && backoff_until - t < timeout)
      timeout = (int)(backoff_until - t) + 1;
    int r = poll(p, (nfds_t)n, timeout);
    if (r > 0 && (p[0].revents & POLLIN)) {
      char buf[64];
      while (read(s->wake[0], buf, sizeof buf) > 0) {
      }
      pthread_mutex_lock(&s->accept_mu);
      if (!s->accepting) ps_rpc_close_listeners_(s);
      pthread_mutex_unlock(&s->accept_mu);
      continue;
    }
    for (int i = 1; r > 0 && i < n; i++)
      if (p[i].revents & POLLIN) ps_rpc_accept_ready_(s, p[i].fd, &backoff_until);
    if (s->tls && !s->tls_own) {
      pthread_mutex_lock(&s->accept_mu);
      ps_rpc_conns_discover_(s);
      pthread_mutex_unlock(&s->accept_mu);
    }
    check_stalls(s);
    ps_rpc_conns_close_unauthed_(s, now_ms());
    ps_rpc_conns_check_suspects_(s, now_ms());
    stop_when_settled(s);
    close_idle(s);
    heap_trim(s, now_ms());
    idle_trim(s, now_ms());
  }
  return NULL;
}
