/* The replication link (ps/repl_internal.h, DESIGN.md "The replication
 * link"): a primary's batches to a backup over a plain TCP connection of
 * their own instead of Replicate calls, which cost a gRPC call each (its
 * headers, its trips through completion queues and threads: most of an
 * update's time with R = 2).
 *
 * The backup listens on a port the kernel picks.  A primary asks for it
 * with a Replicate call (open_link: checked as any Replicate, the replica
 * role's token when tokens are required) and gets the port and the
 * backup's key, 32 random bytes; it connects and says HELLO with the key.
 * Then each BATCH is answered by one ACK, in order, on the connection's
 * own thread on the backup, which applies it as a Replicate call would
 * (ps_repl_batch_apply).  A frame that does not decode ends the
 * connection after its ACK; an error after the batch was read (stale
 * epoch, a view behind) is only answered.  A link that breaks or stays
 * silent is a failed Replicate (the sender's caller reports the backup).
 * With TLS there is no link: it would carry the data in the clear. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "ps.pb-c.h"
#include "repl_internal.h"
#include "service_internal.h"

#define LINK_KEY 32
#define LINK_MAX_CONNS 64
#define LINK_HELLO_MS 5000
/* A backup silent this long while a batch is out (probes by Health/Check
 * every second keep a busy one) breaks the link, as the Replicate call's
 * stall timeout would. */
#define LINK_STALL_MS 3000
#define LINK_CALL_MS 120000

struct ps_link_conn {
  ps_link_conn *next;
  ps_repl *r;
  int fd;
  pthread_t th;
  bool done;             /* its thread ended (under r->mu) */
  int from;              /* the primary's task (its HELLO) */
  ps_link_stages stages; /* its thread's: cut-through */
};

/* ---- I/O ---- */

int64_t ps_repl_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Blocking full read (the backup's threads); 0, or -1 (EOF, error). */
static int read_full(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n > 0) {
    ssize_t k = recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

static int write_full(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

static bool key_equal(const uint8_t *a, const uint8_t *b) {
  uint8_t d = 0; /* constant time */
  for (int i = 0; i < LINK_KEY; i++)
    d |= (uint8_t)(a[i] ^ b[i]);
  return d == 0;
}

static void nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---- the backup ---- */

static int send_ack(int fd, int code, int64_t applied, int64_t epoch, const char *msg) {
  uint8_t b[PS_LINK_HDR + PS_LINK_ACK_MAX];
  size_t m = ps_link_put_ack(b + PS_LINK_HDR, code, applied, epoch, msg);
  ps_link_put_hdr(b, PS_LINK_ACK, m, 0);
  return write_full(fd, b, PS_LINK_HDR + m);
}

/* @n bytes by @deadline (monotonic ms): 0, or -1 (late, EOF, error). */
static int read_by(int fd, void *p, size_t n, int64_t deadline) {
  uint8_t *b = p;
  while (n > 0) {
    int64_t left = deadline - ps_repl_now_ms();
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (left <= 0) return -1;
    int k = poll(&pf, 1, (int)left);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    ssize_t m = recv(fd, b, n, MSG_DONTWAIT);
    if (m < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (m <= 0) return -1;
    b += m;
    n -= (size_t)m;
  }
  return 0;
}

/* HELLO, whole within LINK_HELLO_MS: the key this ps handed out.  0, or
 * -1 (answered, to close). */
static int conn_hello(ps_link_conn *c, int *from) {
  ps_repl *r = c->r;
  uint8_t h[PS_LINK_HDR], meta[4 + LINK_KEY];
  ps_link_hdr hd;
  ps_status st;
  int64_t deadline = ps_repl_now_ms() + LINK_HELLO_MS;
  if (read_by(c->fd, h, sizeof h, deadline) != 0) return -1;
  int rc = ps_link_get_hdr(h, PS_LINK_HELLO, sizeof meta, 0, &hd, &st);
  if (rc == 0 && hd.meta != sizeof meta)
    rc =
        ps_status_set(&st, PS_INVALID_ARGUMENT, "replication link: a HELLO of %llu bytes",
                      (unsigned long long)hd.meta);
  if (rc != 0) {
    send_ack(c->fd, st.code, 0, 0, st.msg);
    return -1;
  }
  if (read_by(c->fd, meta, sizeof meta, deadline) != 0) return -1;
  *from = (int)ps_link_get32(meta);
  if (!key_equal(meta + 4, r->link_key) || *from < 0 || *from >= r->ntasks ||
      *from == r->self) {
    PS_WARN("replication link: a connection that did not present this ps's key "
            "(or named task %d) was refused",
            *from);
    send_ack(c->fd, PS_PERMISSION_DENIED, 0, 0,
             "replication link: wrong key (ask for the link with a Replicate call)");
    return -1;
  }
  return send_ack(c->fd, 0, 0, 0, NULL);
}

/* A STAGE piece (header @h) into its stage, or UNSTAGE: 0 to go on, -1
 * to close (answered by an ACK with the error, as a bad BATCH). */
static int conn_stage(ps_link_conn *c, const uint8_t *h) {
  uint64_t max_data = (uint64_t)c->r->svc->limits.max_tensor_bytes;
  bool un = ps_link_kind(h) == PS_LINK_UNSTAGE;
  uint8_t meta[PS_LINK_STAGE_META];
  ps_link_hdr hd;
  ps_link_stage m;
  ps_status st;
  ps_status_clear(&st);
  uint8_t *dest = NULL;
  if (ps_link_get_hdr(h, un ? PS_LINK_UNSTAGE : PS_LINK_STAGE,
                      un ? PS_LINK_UNSTAGE_META : PS_LINK_STAGE_META, un ? 0 : max_data,
                      &hd, &st) != 0)
    goto bad;
  if (read_full(c->fd, meta, hd.meta) != 0) return -1;
  if (un) {
    if (hd.meta != PS_LINK_UNSTAGE_META) {
      ps_status_set(&st, PS_INVALID_ARGUMENT,
                    "replication link: an unstage header of %llu bytes",
                    (unsigned long long)hd.meta);
      goto bad;
    }
    ps_link_stages_drop(&c->stages, ps_link_get64(meta));
    return 0;
  }
  if (ps_link_get_stage(meta, hd.meta, hd.data, max_data, &m, &st) != 0 ||
      (dest = ps_link_stages_dest(&c->stages, &m, hd.data, &st)) == NULL)
    goto bad;
  if (read_full(c->fd, dest, hd.data) != 0) return -1;
  ps_link_stages_got(&c->stages, m.id, hd.data);
  return 0;
bad:
  /* no answer is awaited: the ACK (entries applied -1: "a frame before
   * the batch") reaches the primary only if it reads one next; the log
   * says it in any case */
  PS_WARN("replication link: a frame from ps/%d was refused: %s", c->from, st.msg);
  send_ack(c->fd, st.code, -1, 0, st.msg);
  return -1;
}

/* One BATCH (header @h): 0 to go on, -1 to close. */
static int conn_batch(ps_link_conn *c, const uint8_t *h) {
  ps_repl *r = c->r;
  ps_service *s = r->svc;
  ps_link_hdr hd;
  ps_status st;
  ps_status_clear(&st);
  uint64_t max_data = (uint64_t)s->limits.max_tensor_bytes;
  if (ps_link_get_hdr(h, PS_LINK_BATCH, (uint64_t)PS_RPC_DEFAULT_MAX_MESSAGE_BYTES,
                      max_data, &hd, &st) != 0) {
    send_ack(c->fd, st.code, 0, 0, st.msg);
    return -1;
  }
  uint8_t *meta = malloc(hd.meta ? hd.meta : 1);
  if (meta == NULL) {
    send_ack(c->fd, PS_RESOURCE_EXHAUSTED, 0, 0, "replication link: out of memory");
    return -1;
  }
  if (read_full(c->fd, meta, hd.meta) != 0) {
    free(meta);
    return -1;
  }
  ps_repl_batch *b = NULL;
  ps_rpc_segs sink = {0};
  int rc = ps_repl_batch_decode(s, meta, hd.meta, &b, &sink, &st);
  free(meta);
  if (rc == 0) rc = ps_repl_batch_take_staged(b, &c->stages, &st);
  if (rc == 0 && (ps_repl_batch_inline(b)->len > 0 || sink.total != hd.data))
    rc = ps_status_set(
        &st, PS_INVALID_ARGUMENT,
        "replication link: a batch of %llu data bytes whose entries need %zu",
        (unsigned long long)hd.data, sink.total);
  if (rc != 0) {
    ps_rpc_segs_fini(&sink);
    ps_repl_batch_free(b);
    send_ack(c->fd, rc, 0, 0, st.msg);
    return -1;
  }
  for (size_t i = 0; i < sink.n && rc == 0; i++)
    if (read_full(c->fd, sink.v[i].ptr, sink.v[i].len) != 0) rc = -1;
  ps_rpc_segs_fini(&sink);
  if (rc != 0) {
    ps_repl_batch_free(b);
    return -1;
  }
  int64_t applied = 0, epoch = 0;
  rc = ps_repl_batch_apply(s, b, &applied, &epoch, &st);
  ps_repl_batch_free(b);
  return send_ack(c->fd, rc, applied, epoch, rc ? st.msg : NULL);
}

static void *conn_main(void *arg) {
  ps_link_conn *c = arg;
  int from = -1;
  if (conn_hello(c, &from) == 0) {
    PS_DEBUG("replication link: ps/%d connected", from);
    c->from = from;
    uint8_t h[PS_LINK_HDR];
    while (read_full(c->fd, h, sizeof h) == 0) {
      uint32_t k = ps_link_kind(h);
      if ((k == PS_LINK_STAGE || k == PS_LINK_UNSTAGE ? conn_stage(c, h)
                                                      : conn_batch(c, h)) != 0)
        break;
    }
  }
  ps_link_stages_fini(&c->stages);
  /* the primary sees the end at once: closed now, with bytes of a refused
   * frame still unread, the socket answers RST, so a primary still
   * writing that frame fails at once (after a mere shutdown the bytes
   * would fill the buffers, and a primary that hears the backup answer
   * its probes would wait for its write up to LINK_CALL_MS) */
  shutdown(c->fd, SHUT_RDWR);
  pthread_mutex_lock(&c->r->mu);
  close(c->fd);
  c->fd = -1;
  c->done = true;
  pthread_mutex_unlock(&c->r->mu);
  return NULL;
}

/* Joins and frees the connections whose thread ended (@all: every one,
 * after shutting their sockets). */
static void conns_reap(ps_repl *r, bool all) {
  ps_link_conn *gone = NULL;
  pthread_mutex_lock(&r->mu);
  for (ps_link_conn **pp = &r->link_conns; *pp;) {
    ps_link_conn *c = *pp;
    if (all && !c->done) shutdown(c->fd, SHUT_RDWR); /* (its thread closes it) */
    if (all || c->done) {
      *pp = c->next;
      c->next = gone;
      gone = c;
      r->nlink_conns--;
    } else {
      pp = &c->next;
    }
  }
  pthread_mutex_unlock(&r->mu);
  while (gone) {
    ps_link_conn *n = gone->next;
    pthread_join(gone->th, NULL);
    free(gone);
    gone = n;
  }
}

static void *accept_main(void *arg) {
  ps_repl *r = arg;
  for (;;) {
    int fd = accept4(r->link_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
        continue;
      }
      break; /* shut down */
    }
    conns_reap(r, false);
    nodelay(fd);
    /* a primary whose host vanished without closing is noticed (~90 s) */
    int one = 1, idle = 60, intvl = 10, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    ps_link_conn *c = calloc(1, sizeof *c);
    pthread_mutex_lock(&r->mu);
    bool stop = r->stopping || r->nlink_conns >= LINK_MAX_CONNS;
    if (c && !stop) {
      c->r = r;
      c->fd = fd;
      if (pthread_create(&c->th, NULL, conn_main, c) == 0) {
        c->next = r->link_conns;
        r->link_conns = c;
        r->nlink_conns++;
        c = NULL;
        fd = -1;
      }
    }
    pthread_mutex_unlock(&r->mu);
    if (fd >= 0) {
      static int64_t warned; /* (this thread's alone) */
      if (!r->stopping && ps_repl_now_ms() - warned >= 10000) {
        PS_WARN("replication link: a connection refused (%s)",
                stop ? "64 connections at once already" : "out of resources");
        warned = ps_repl_now_ms();
      }
      close(fd);
    }
    free(c);
  }
  return NULL;
}

int ps_repl_link_start(ps_repl *r, const char *bind_host, int port, ps_status *st) {
  if (r->sec.ca_pem) /* TLS: the link would carry the data in the clear */
    return 0;
  r->link_asked = true;
  if (getrandom(r->link_key, sizeof r->link_key, 0) != (ssize_t)sizeof r->link_key)
    return ps_status_set(st, PS_INTERNAL, "replication link: no random key: %s",
                         strerror(errno));
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE},
                  *ai = NULL;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int e = getaddrinfo(bind_host, ps, &hints, &ai);
  if (e != 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "replication link: cannot resolve %s: %s",
                         bind_host ? bind_host : "every interface", gai_strerror(e));
  int fd = -1;
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1; /* a restart within TIME_WAIT binds the same --repl-link-port */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  if (fd < 0 || getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    return ps_status_set(st, PS_UNAVAILABLE,
                         "replication link: cannot listen on port %d of %s: %s", port,
                         bind_host ? bind_host : "every interface", strerror(err));
  }
  r->link_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                : ((struct sockaddr_in *)&sa)->sin_port);
  r->link_fd = fd;
  if (pthread_create(&r->link_th, NULL, accept_main, r) != 0) {
    close(fd);
    r->link_fd = -1;
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "replication link: no thread");
  }
  PS_INFO("replication link on port %d (the other replicas' batches; --no-repl-link "
          "sends them as Replicate calls)",
          r->link_port);
  return 0;
}

void ps_repl_link_stop(ps_repl *r) {
  if (r->link_fd < 0) return;
  shutdown(r->link_fd, SHUT_RDWR); /* accept() returns */
  pthread_join(r->link_th, NULL);
  close(r->link_fd);
  r->link_fd = -1;
  conns_reap(r, true);
}

/* ---- the primary ---- */

void ps_repl_link_close(ps_repl_sender *snd) {
  if (snd->link_fd >= 0) close(snd->link_fd);
  snd->link_fd = -1;
}

typedef struct offer {
  int port;
  uint8_t key[LINK_KEY];
  bool got;
} offer;

static int on_offer(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                    ps_status *st) {
  (void)sink;
  offer *o = user;
  Paramserver__ReplicateResponse *resp =
      paramserver__replicate_response__unpack(NULL, n, p);
  if (resp == NULL)
    return ps_status_set(st, PS_INTERNAL,
                         "Replicate: the backup's answer does not parse");
  if (resp->link_port > 0 && resp->link_port < 65536 && resp->link_key.len == LINK_KEY) {
    o->port = resp->link_port;
    memcpy(o->key, resp->link_key.data, LINK_KEY);
    o->got = true;
  }
  paramserver__replicate_response__free_unpacked(resp, NULL);
  return 0;
}

/* "host:port", "[v6]:port" -> host */
static void host_of(const char *addr, char *out, size_t n) {
  const char *c = strrchr(addr, ':');
  size_t len = c ? (size_t)(c - addr) : strlen(addr);
  if (len >= 2 && addr[0] == '[' && addr[len - 1] == ']') {
    addr++;
    len -= 2;
  }
  snprintf(out, n, "%.*s", (int)len, addr);
}

/* Waits until @fd is ready for @ev (POLLIN or POLLOUT), probing a silent
 * backup: 0, or -1 with @st (stalled, broken, too long). */
static int wait_fd(ps_repl_sender *snd, int fd, short ev, int64_t start, int64_t *heard,
                   ps_status *st) {
  for (;;) {
    int64_t now = ps_repl_now_ms();
    if (now - start > LINK_CALL_MS) {
      ps_status_set(st, PS_DEADLINE_EXCEEDED, "Replicate to ps/%d: no answer within %d s",
                    snd->task, LINK_CALL_MS / 1000);
      return -1;
    }
    struct pollfd p = {.fd = fd, .events = ev};
    int k = poll(&p, 1, 1000);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      ps_status_set(st, PS_UNAVAILABLE, "Replicate to ps/%d: poll: %s", snd->task,
                    strerror(errno));
      return -1;
    }
    if (k > 0) return 0; /* ready, or an error the next call reports */
    if (ps_repl_now_ms() - *heard >= LINK_STALL_MS) {
      ps_status_set(st, PS_DEADLINE_EXCEEDED,
                    "Replicate: no answer for %g s over the replication link",
                    LINK_STALL_MS / 1000.0);
      return -1;
    }
    /* a quiet second: is the backup there, only busy? */
    ps_rpc_req pr = {.ch = snd->ch,
                     .method = "/grpc.health.v1.Health/Check",
                     .raw_request = "",
                     .unary_response = true,
                     .timeout_ms = 1000};
    ps_rpc_run(&pr, 1);
    if (pr.st.code == PS_OK) *heard = ps_repl_now_ms();
  }
}

static int link_write(ps_repl_sender *snd, struct iovec *iov, int niov, int64_t start,
                      int64_t *heard, ps_status *st) {
  int fd = snd->link_fd;
  while (niov > 0) {
    struct msghdr mh = {.msg_iov = iov,
                        .msg_iovlen = (size_t)(niov > 1024 ? 1024 : niov)};
    ssize_t k = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_fd(snd, fd, POLLOUT, start, heard, st) != 0) return -1;
      continue;
    }
    if (k < 0) {
      ps_status_set(st, PS_UNAVAILABLE, "Replicate to ps/%d: the link broke: %s",
                    snd->task, strerror(errno));
      return -1;
    }
    *heard = ps_repl_now_ms();
    size_t left = (size_t)k;
    while (niov > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      iov++;
      niov--;
    }
    if (niov > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + left;
      iov->iov_len -= left;
    }
  }
  return 0;
}

static int link_read(ps_repl_sender *snd, void *p, size_t n, int64_t start,
                     int64_t *heard, ps_status *st) {
  uint8_t *b = p;
  while (n > 0) {
    ssize_t k = recv(snd->link_fd, b, n, MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_fd(snd, snd->link_fd, POLLIN, start, heard, st) != 0) return -1;
      continue;
    }
    if (k <= 0) {
      ps_status_set(st, PS_UNAVAILABLE, "Replicate to ps/%d: the link broke: %s",
                    snd->task, k == 0 ? "closed by the backup" : strerror(errno));
      return -1;
    }
    *heard = ps_repl_now_ms();
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Reads one ACK: 0 (and the backup's verdict in @res), or -1 (broken). */
static int link_ack(ps_repl_sender *snd, int64_t start, int64_t *heard, int64_t *applied,
                    ps_status *res, ps_status *st) {
  uint8_t h[PS_LINK_HDR], m[PS_LINK_ACK_MAX];
  ps_link_hdr hd;
  if (link_read(snd, h, sizeof h, start, heard, st) != 0) return -1;
  if (ps_link_get_hdr(h, PS_LINK_ACK, PS_LINK_ACK_MAX, 0, &hd, st) != 0 ||
      link_read(snd, m, hd.meta, start, heard, st) != 0 ||
      ps_link_get_ack(m, hd.meta, applied, res, st) != 0) {
    if (st->code != PS_UNAVAILABLE) st->code = PS_INTERNAL; /* a backup that lies */
    return -1;
  }
  return 0;
}

int ps_repl_link_open(ps_repl_sender *snd, int64_t epoch, ps_status *st) {
  ps_repl *r = snd->r;
  Paramserver__ReplicateRequest req = PARAMSERVER__REPLICATE_REQUEST__INIT;
  req.epoch = epoch;
  req.from_task = r->self;
  req.open_link = true;
  offer o = {0};
  ps_rpc_req call = {.ch = snd->ch,
                     .method = "/paramserver.Ps/Replicate",
                     .request = &req.base,
                     .unary_response = true,
                     .timeout_ms = 3000,
                     .on_header = on_offer,
                     .user = &o};
  ps_rpc_run(&call, 1);
  if (call.st.code != PS_OK) {
    *st = call.st;
    return st->code;
  }
  if (!o.got)
    return ps_status_set(st, PS_UNIMPLEMENTED, "ps/%d offers no replication link",
                         snd->task);
  char host[256], port[16];
  host_of(r->addrs[snd->task], host, sizeof host);
  snprintf(port, sizeof port, "%d", o.port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM},
                  *ai = NULL;
  int e = getaddrinfo(host, port, &hints, &ai);
  if (e != 0)
    return ps_status_set(st, PS_UNAVAILABLE, "replication link: cannot resolve %s: %s",
                         host, gai_strerror(e));
  int fd = -1;
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      close(fd);
      fd = -1;
      continue;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int err = 0;
    socklen_t el = sizeof err;
    if (poll(&p, 1, 1000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 ||
        err != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0) {
    /* offered but out of reach (a firewall?): asked again only now and then */
    ps_status_set(st, PS_UNIMPLEMENTED,
                  "replication link: cannot connect to ps/%d at %s:%d", snd->task, host,
                  o.port);
    PS_WARN("%s: its batches go as Replicate calls (the port may be blocked between the "
            "ps hosts; --no-repl-link on every ps turns the link off)",
            st->msg);
    return st->code;
  }
  nodelay(fd);
  snd->link_fd = fd;
  snd->link_gen++;
  uint8_t hello[PS_LINK_HDR + 4 + LINK_KEY];
  ps_link_put_hdr(hello, PS_LINK_HELLO, 4 + LINK_KEY, 0);
  ps_link_put32(hello + PS_LINK_HDR, (uint32_t)r->self);
  memcpy(hello + PS_LINK_HDR + 4, o.key, LINK_KEY);
  struct iovec iov = {hello, sizeof hello};
  int64_t start = ps_repl_now_ms(), heard = start, applied = 0;
  ps_status res;
  if (link_write(snd, &iov, 1, start, &heard, st) != 0 ||
      link_ack(snd, start, &heard, &applied, &res, st) != 0) {
    ps_repl_link_close(snd);
    return st->code;
  }
  if (res.code != PS_OK) {
    ps_repl_link_close(snd);
    ps_status_set(st, PS_UNIMPLEMENTED, "replication link to ps/%d refused: %s",
                  snd->task, res.msg);
    PS_WARN("%s: its batches go as Replicate calls", st->msg);
    return st->code;
  }
  PS_INFO("replication to ps/%d over its replication link (%s:%d)", snd->task, host,
          o.port);
  return 0;
}

int ps_repl_link_stage(ps_repl_sender *snd, uint64_t id, const ps_buf *buf, size_t off,
                       size_t n, ps_status *st) {
  uint8_t h[PS_LINK_HDR + PS_LINK_STAGE_META];
  ps_link_put_hdr(h, PS_LINK_STAGE, PS_LINK_STAGE_META, n);
  ps_link_put_stage(h + PS_LINK_HDR, &(ps_link_stage){id, buf->size, off});
  struct iovec iov[2] = {{h, sizeof h}, {(uint8_t *)buf->data + off, n}};
  int64_t start = ps_repl_now_ms(), heard = start;
  if (link_write(snd, iov, 2, start, &heard, st) != 0) {
    ps_repl_link_close(snd);
    return st->code;
  }
  return 0;
}

int ps_repl_link_unstage(ps_repl_sender *snd, uint64_t id, ps_status *st) {
  uint8_t h[PS_LINK_HDR + PS_LINK_UNSTAGE_META];
  ps_link_put_hdr(h, PS_LINK_UNSTAGE, PS_LINK_UNSTAGE_META, 0);
  ps_link_put64(h + PS_LINK_HDR, id);
  struct iovec iov[1] = {{h, sizeof h}};
  int64_t start = ps_repl_now_ms(), heard = start;
  if (link_write(snd, iov, 1, start, &heard, st) != 0) {
    ps_repl_link_close(snd);
    return st->code;
  }
  return 0;
}

int ps_repl_link_send(ps_repl_sender *snd, const Paramserver__ReplicateRequest *req,
                      const ps_rpc_segs *segs, int64_t *applied, ps_status *st) {
  size_t mlen = paramserver__replicate_request__get_packed_size(req);
  size_t niov = 2 + segs->n;
  uint8_t *buf = malloc(PS_LINK_HDR + mlen);
  struct iovec *iov = calloc(niov, sizeof *iov);
  int rc = 0;
  if (buf == NULL || iov == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Replicate: out of memory");
    goto out;
  }
  paramserver__replicate_request__pack(req, buf + PS_LINK_HDR);
  ps_link_put_hdr(buf, PS_LINK_BATCH, mlen, segs->total);
  iov[0] = (struct iovec){buf, PS_LINK_HDR + mlen};
  for (size_t i = 0; i < segs->n; i++)
    iov[1 + i] = (struct iovec){segs->v[i].ptr, segs->v[i].len};
  int64_t start = ps_repl_now_ms(), heard = start;
  ps_status res;
  if (link_write(snd, iov, (int)(1 + segs->n), start, &heard, st) != 0 ||
      link_ack(snd, start, &heard, applied, &res, st) != 0) {
    ps_repl_link_close(snd);
    rc = st->code;
    goto out;
  }
  if (res.code != PS_OK) {
    *st = res;
    if (*applied < 0) /* the answer to a STAGE frame it refused */
      ps_status_set(st, res.code, "ps/%d refused a frame before the batch: %s", snd->task,
                    res.msg);
    rc = st->code;
    /* only "a view behind" leaves the backup's side open (it read the
     * batch whole); after anything else it may have closed it */
    if (rc != PS_ABORTED) ps_repl_link_close(snd);
  }
out:
  free(buf);
  free(iov);
  return rc;
}
