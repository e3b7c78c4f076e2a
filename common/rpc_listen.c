/* The server's listener: its own listening sockets (no SO_REUSEPORT) and
 * the accept loop the monitor thread runs, which backs off on EMFILE,
 * closes connections beyond --max-connections, and hands each accepted
 * connection to gRPC (plaintext by fd; TLS through gRPC's external
 * connection handler).  See "Listener" in rpc_internal.h.  Above
 * rpc_conns.c. */
#include "rpc_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

void ps_rpc_close_listeners_(ps_rpc_server *s) {
  for (int i = 0; i < s->nlfd; i++)
    close(s->lfd[i]);
  s->nlfd = 0;
}

/* Splits "host:port" / "[v6]:port"; 0 or -1. */
int ps_rpc_split_addr_(const char *addr, char *host, size_t hn, char *port, size_t pn) {
  const char *colon = strrchr(addr, ':');
  if (colon == NULL || colon[1] == '\0') return -1;
  const char *h = addr;
  size_t hl = (size_t)(colon - addr);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl >= hn || strlen(colon + 1) >= pn) return -1;
  memcpy(host, h, hl);
  host[hl] = '\0';
  snprintf(port, pn, "%s", colon + 1);
  return 0;
}

/* Binds and listens on every address of @addr; the port of the first
 * socket is used for the others when @addr asks for port 0.  The
 * wildcards 0.0.0.0 and [::] listen on both IPv4 and IPv6, as gRPC's own
 * listener does. */
int ps_rpc_open_listeners_(ps_rpc_server *s, const char *addr, ps_status *st) {
  char host[256], port[32];
  if (ps_rpc_split_addr_(addr, host, sizeof host, port, sizeof port) != 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "cannot listen on %s: not HOST:PORT",
                         addr);
  if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "*"))
    host[0] = '\0';
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int e = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (e != 0)
    return ps_status_set(st, PS_UNAVAILABLE, "cannot listen on %s: %s", addr,
                         gai_strerror(e));
  int bound_port = 0, err = 0;
  for (struct addrinfo *ai = res; ai && s->nlfd < MAX_LISTENERS; ai = ai->ai_next) {
    struct sockaddr_storage sa;
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    if (bound_port) {
      if (sa.ss_family == AF_INET)
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)bound_port);
      else if (sa.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)bound_port);
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    /* SO_REUSEADDR only: a restarted ps may bind over TIME_WAIT, but no
     * second process can share the port (no SO_REUSEPORT). */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6)
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, ai->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
      err = errno;
      close(fd);
      if (err == EADDRINUSE && s->nlfd == 0) break;
      /* the other family of a wildcard: serve on what was bound */
      if (s->nlfd > 0) err = 0;
      continue;
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    if (getsockname(fd, (struct sockaddr *)&got, &gl) == 0) {
      if (got.ss_family == AF_INET)
        bound_port = ntohs(((struct sockaddr_in *)&got)->sin_port);
      else if (got.ss_family == AF_INET6)
        bound_port = ntohs(((struct sockaddr_in6 *)&got)->sin6_port);
    }
    s->lfd[s->nlfd++] = fd;
  }
  freeaddrinfo(res);
  if (s->nlfd == 0 || err == EADDRINUSE) {
    ps_rpc_close_listeners_(s);
    return ps_status_set(st, PS_UNAVAILABLE, "cannot listen on %s: %s", addr,
                         err == EADDRINUSE ? "address in use"
                         : err             ? strerror(err)
                                           : "no address");
  }
  s->port = bound_port;
  return 0;
}

/* TLS: gRPC 1.51 takes a connection accepted outside it, with the
 * server's TLS credentials, through the port "external:NAME" (the C++
 * ExternalConnectionAcceptor's door): grpc_server_add_http2_port stores a
 * grpc_core::TcpServerFdHandler* where the channel argument NAME points
 * (src/core/lib/iomgr/tcp_server.h):
 *
 *   class TcpServerFdHandler {
 *    public:
 *     virtual ~TcpServerFdHandler() = default;
 *     virtual void Handle(int listener_fd, int fd, grpc_byte_buffer *pending_read) = 0;
 *   };
 *
 * Its Handle (with an ExecCtx of its own) starts the TLS handshake on fd as
 * gRPC's own listener would.  Under the Itanium C++ ABI the object starts
 * with its vtable pointer, whose entries are the two destructors, then
 * Handle: the third.  Used only with gRPC core 29 (1.51), where this was
 * checked (tls_external_ok); any other falls back to gRPC's listener. */

typedef void (*fd_handle_fn)(void *self, int listener_fd, int fd,
                             grpc_byte_buffer *pending);

bool ps_rpc_tls_external_ok_(void) {
  const char *e = getenv("PS_TLS_GRPC_LISTENER"); /* 1: gRPC's listener (tests) */
  return strncmp(grpc_version_string(), "29.", 3) == 0 && !(e && !strcmp(e, "1"));
}

/* Whether @h is the handler checked above: its vtable's type_info
 * (vtable[-1]; its second word the mangled name, '*' first for a type of
 * internal linkage) names ExternalConnectionHandler of
 * src/cpp/server/external_connection_acceptor_impl.cc's anonymous
 * namespace.  Anything else (another build, an object of another type
 * in the argument) is not called. */

bool ps_rpc_tls_handler_ok_(void *h) {
  void **vt = *(void ***)h;
  if (vt == NULL || vt[-1] == NULL) return false;
  const char *name = ((const char *const *)vt[-1])[1];
  if (name == NULL) return false;
  if (name[0] == '*') name++;
  /* tests: PS_TLS_HANDLER_TYPE names another type, as another build would */
  const char *want = getenv("PS_TLS_HANDLER_TYPE");
  return strcmp(name, want && *want ? want : TLS_EXTERNAL_TYPE) == 0;
}

static void tls_hand_over(ps_rpc_server *s, int lfd, int fd) {
  fd_handle_fn *vt = *(fd_handle_fn **)s->fd_handler;
  vt[2](s->fd_handler, lfd, fd, NULL);
}

void ps_rpc_accept_ready_(ps_rpc_server *s, int lfd, int64_t *backoff_until) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      /* EMFILE, ENFILE, ENOBUFS, ENOMEM...: leave the connection in the
       * backlog and try again shortly. */
      int64_t t = now_ms();
      if (t - s->last_emfile_log_ms >= 10000) {
        PS_WARN("accepting connections: %s; retrying every 100 ms", strerror(errno));
        s->last_emfile_log_ms = t;
      }
      *backoff_until = t + 100;
      return;
    }
    pthread_mutex_lock(&s->accept_mu);
    if (s->nconns >= s->opt.max_connections) ps_rpc_conns_sweep_(s);
    if (s->nconns >= s->opt.max_connections) {
      int64_t t = now_ms();
      if (t - s->last_full_log_ms >= 10000) {
        PS_WARN("%d connections open (--max-connections): closing new ones", s->nconns);
        s->last_full_log_ms = t;
      }
      pthread_mutex_unlock(&s->accept_mu);
      close(fd);
      continue;
    }
    struct stat sb;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fstat(fd, &sb) != 0 || !s->accepting) {
      pthread_mutex_unlock(&s->accept_mu);
      close(fd);
      return;
    }
    s->conns[s->nconns++] = (conn_slot){fd, sb.st_ino, sb.st_dev, 0, 0, 0, now_ms(), 0};
    atomic_fetch_add(&s->unauthed, 1);
    ps_rpc_authed_peers_forget_(s); /* its peer name may be a closed one's */
    if (s->fd_handler) {
      tls_hand_over(s, lfd, fd); /* gRPC owns fd now */
    } else {
      grpc_server_credentials *sc = grpc_insecure_server_credentials_create();
      grpc_server_add_channel_from_fd(s->srv, fd, sc); /* gRPC owns fd now */
      grpc_server_credentials_release(sc);
    }
    pthread_mutex_unlock(&s->accept_mu);
  }
}
