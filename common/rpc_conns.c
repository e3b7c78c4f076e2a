/* Connection policing: the server's table of accepted connections (see
 * "Listener" and "Silent connections" in rpc_internal.h).  Connections
 * gRPC closed are swept, those gRPC's own TLS listener accepted are found
 * in /proc/self/fd, silent ones are shut after UNAUTH_CONN_MS, and one
 * whose client reads nothing after a cancelled call is shut down.  Calls
 * no other rpc file; the listener, the monitor and the server use it. */
#include "rpc_internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "log.h"

/* Forgets connections gRPC has closed (their fd is closed or reused).
 * Under accept_mu. */
void ps_rpc_conns_sweep_(ps_rpc_server *s) {
  int k = 0;
  for (int i = 0; i < s->nconns; i++) {
    struct stat sb;
    conn_slot *c = &s->conns[i];
    if (fstat(c->fd, &sb) == 0 && S_ISSOCK(sb.st_mode) && sb.st_ino == c->ino &&
        sb.st_dev == c->dev)
      s->conns[k++] = *c;
    else if (!c->authed)
      atomic_fetch_sub(&s->unauthed, 1);
  }
  s->nconns = k;
}

/* A new connection may carry the peer name ("fd:12", an address and port)
 * of one that closed: the names marked before are forgotten.  Under
 * accept_mu. */
void ps_rpc_authed_peers_forget_(ps_rpc_server *s) {
  for (int i = 0; i < 16; i++)
    s->authed_peers[i][0] = '\0';
}

/* TLS: gRPC 1.51's listener stops for good on an accept4 error (out of
 * descriptors): connections then wait in its queue and are never served.
 * A queue that stays non-empty for 5 s is logged at ERROR every 30 s, so
 * that the operator (or a probe: new connections hang) restarts the ps.
 * For a listening socket TCP_INFO's tcpi_unacked is its accept queue.
 * Under accept_mu. */
static void listener_check(ps_rpc_server *s, int fd) {
  struct tcp_info ti;
  socklen_t tl = sizeof ti;
  int64_t t = now_ms();
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0 || ti.tcpi_unacked == 0) {
    s->queue_since_ms = 0;
    return;
  }
  if (s->queue_since_ms == 0) s->queue_since_ms = t;
  if (t - s->queue_since_ms >= 5000 && t - s->last_dead_log_ms >= 30000) {
    PS_ERROR(
        "the TLS listener accepts no more (%u connection(s) have waited in its queue "
        "for %lld s; gRPC's listener stops for good when descriptors run out): "
        "new clients cannot connect, restart this ps",
        ti.tcpi_unacked, (long long)((t - s->queue_since_ms) / 1000));
    s->last_dead_log_ms = t;
  }
}

/* TLS: adds the connections gRPC's listener accepted to the table (see
 * "Listener"); those over max_connections are shut down.  Under accept_mu. */
void ps_rpc_conns_discover_(ps_rpc_server *s) {
  if (!s->tls || s->tls_own || s->port <= 0 || s->fd_dir == NULL) return;
  ps_rpc_conns_sweep_(s);
  DIR *d = s->fd_dir; /* open for good: out of descriptors, a scan still runs */
  rewinddir(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    if (*end || e->d_name[0] == '\0' || fd == dirfd(d)) continue;
    struct stat sb;
    if (fstat((int)fd, &sb) != 0 || !S_ISSOCK(sb.st_mode)) continue;
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (getsockname((int)fd, (struct sockaddr *)&sa, &sl) != 0) continue;
    int port = sa.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&sa)->sin_port)
               : sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                                          : -1;
    int listening = 0;
    socklen_t ol = sizeof listening;
    if (port != s->port ||
        getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0)
      continue;
    if (listening) {
      listener_check(s, (int)fd);
      continue;
    }
    int known = 0;
    for (int i = 0; i < s->nconns && !known; i++)
      known = s->conns[i].ino == sb.st_ino && s->conns[i].dev == sb.st_dev;
    if (known) continue;
    if (s->nconns >= s->opt.max_connections || !s->accepting) {
      int64_t t = now_ms();
      if (s->accepting && t - s->last_full_log_ms >= 10000) {
        PS_WARN("%d connections open (--max-connections): closing new ones", s->nconns);
        s->last_full_log_ms = t;
      }
      shutdown((int)fd, SHUT_RDWR);
      continue;
    }
    s->conns[s->nconns++] =
        (conn_slot){(int)fd, sb.st_ino, sb.st_dev, 0, 0, 0, now_ms(), 0};
    atomic_fetch_add(&s->unauthed, 1);
    ps_rpc_authed_peers_forget_(s); /* its peer name may be a closed one's */
  }
}

/* Whether @c is the connection gRPC names @peer: "fd:12" for connections
 * handed over by fd, else "ipv4:1.2.3.4:5" or "ipv6:[::1]:5" (an IPv4
 * client of a dual-stack listener, ::ffff:1.2.3.4, is ipv4 to gRPC). */
static bool slot_is_peer(const conn_slot *c, const char *peer) {
  if (!strncmp(peer, "fd:", 3)) return atoi(peer + 3) == c->fd;
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  char host[INET6_ADDRSTRLEN], name[INET6_ADDRSTRLEN + 32];
  if (getpeername(c->fd, (struct sockaddr *)&sa, &sl) != 0) return false;
  if (sa.ss_family == AF_INET) {
    struct sockaddr_in *a = (struct sockaddr_in *)&sa;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    snprintf(name, sizeof name, "ipv4:%s:%d", host, ntohs(a->sin_port));
  } else if (sa.ss_family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&sa;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], host, sizeof host);
      snprintf(name, sizeof name, "ipv4:%s:%d", host, ntohs(a->sin6_port));
    } else {
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      snprintf(name, sizeof name, "ipv6:[%s]:%d", host, ntohs(a->sin6_port));
    }
  } else {
    return false;
  }
  return strcmp(name, peer) == 0;
}

/* Shuts down the sockets of the connections still open (all, or the one
 * whose peer is @peer, as gRPC spells it: "fd:12" for connections added
 * by fd, "ipv4:127.0.0.1:5000").  gRPC
 * 1.51 delays closing a connection until its in-flight write finishes, and
 * a write to a client that stopped reading never does: so a cancelled call
 * would stay, holding its memory, and shutdown would wait forever.  A
 * socket shut down under it fails the write.  Returns the number shut. */

int ps_rpc_conns_shutdown_(ps_rpc_server *s, const char *peer) {
  int n = 0;
  pthread_mutex_lock(&s->accept_mu);
  ps_rpc_conns_sweep_(s);
  ps_rpc_conns_discover_(s);
  for (int i = 0; i < s->nconns; i++) {
    if (peer && !slot_is_peer(&s->conns[i], peer)) continue;
    if (shutdown(s->conns[i].fd, SHUT_RDWR) == 0) n++;
  }
  pthread_mutex_unlock(&s->accept_mu);
  return n;
}

/* The connection of @c, which made a call (with tokens: whose token
 * checked out), keeps its slot.  Only while some tracked connection is
 * not authed (a connection is marked once; the lookup is a scan). */
void ps_rpc_conns_mark_authed_(ps_rpc_call *c) {
  ps_rpc_server *s = c->srv;
  if (atomic_load(&s->unauthed) <= 0) return;
  char *peer = grpc_call_get_peer(c->call);
  if (peer == NULL) return;
  pthread_mutex_lock(&s->accept_mu);
  for (int i = 0; i < 16; i++)
    if (!strcmp(s->authed_peers[i], peer)) goto done; /* marked already */
  snprintf(s->authed_peers[s->authed_next], sizeof s->authed_peers[0], "%s", peer);
  s->authed_next = (s->authed_next + 1) % 16;
  for (int pass = 0; pass < 2; pass++) {
    int found = 0;
    for (int i = 0; i < s->nconns && !found; i++)
      if (slot_is_peer(&s->conns[i], peer)) {
        found = 1;
        if (!s->conns[i].authed) {
          s->conns[i].authed = 1;
          atomic_fetch_sub(&s->unauthed, 1);
        }
      }
    if (found || !s->tls) break;
    ps_rpc_conns_discover_(s); /* TLS: not seen by the monitor yet */
  }
done:
  pthread_mutex_unlock(&s->accept_mu);
  gpr_free(peer);
}

/* The bytes the peer of socket @fd has sent (TCP_INFO's
 * tcpi_bytes_received, Linux 4.1 and later; glibc's struct tcp_info ends
 * before it, so it is read at its offset in the kernel's, which never
 * moves); -1 if the kernel does not say. */
static int64_t conn_bytes_in(int fd) {
  enum { BYTES_RECEIVED_OFF = 128 };
  uint64_t ti[32];
  socklen_t tl = sizeof ti;
  memset(ti, 0, sizeof ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, ti, &tl) != 0 ||
      tl < BYTES_RECEIVED_OFF + sizeof(uint64_t))
    return -1;
  return (int64_t)ti[BYTES_RECEIVED_OFF / sizeof(uint64_t)];
}

/* Without tokens, a connection that has sent more than its handshake
 * takes is in use even before a call of it reached call_authorize (its
 * calls wait behind a busy RPC thread): plaintext, the HTTP/2 preface and
 * SETTINGS (24 + 9 + 6 per setting: 91 bytes from gRPC's clients, a call's
 * HEADERS frame brings ~250 more); TLS, a ClientHello (517 from gRPC's
 * clients, larger with post-quantum key shares), the client's Finished and
 * the encrypted preface.  A client that stops halfway through a handshake
 * of more than this is left to gRPC's handshake deadline
 * (UNAUTH_CONN_MS + 5 s). */
#define CONN_HANDSHAKE_BYTES_PLAIN 128
#define CONN_HANDSHAKE_BYTES_TLS 2048

/* Shuts down the connections that made no call (with tokens: none with a
 * valid token; without, that sent no more than a handshake either) within
 * UNAUTH_CONN_MS of being seen (monitor). */
void ps_rpc_conns_close_unauthed_(ps_rpc_server *s, int64_t t) {
  if (atomic_load(&s->unauthed) <= 0) return;
  int n = 0;
  int64_t allowance = s->tls ? CONN_HANDSHAKE_BYTES_TLS : CONN_HANDSHAKE_BYTES_PLAIN;
  pthread_mutex_lock(&s->accept_mu);
  ps_rpc_conns_sweep_(s);
  for (int i = 0; i < s->nconns; i++) {
    conn_slot *c = &s->conns[i];
    if (c->authed || t - c->since_ms < UNAUTH_CONN_MS) continue;
    if (s->opt.auth == NULL && conn_bytes_in(c->fd) > allowance) {
      c->authed = 1; /* in use: its call is on the way */
      atomic_fetch_sub(&s->unauthed, 1);
      continue;
    }
    shutdown(c->fd, SHUT_RDWR);
    c->authed = 1;
    atomic_fetch_sub(&s->unauthed, 1);
    n++;
  }
  if (n && t - s->last_unauth_log_ms >= 10000) {
    if (s->opt.auth)
      PS_WARN("closed %d connection(s) that made no call with a valid token within %d s",
              n, UNAUTH_CONN_MS / 1000);
    else
      PS_WARN("closed %d connection(s) that made no call within %d s (silent, or never "
              "past their handshake)",
              n, UNAUTH_CONN_MS / 1000);
    s->last_unauth_log_ms = t;
  }
  pthread_mutex_unlock(&s->accept_mu);
}

/* A call timed out waiting for its client to read: remember how much each
 * connection's socket had not sent yet. */
void ps_rpc_conns_suspect_(ps_rpc_server *s, int64_t t) {
  pthread_mutex_lock(&s->accept_mu);
  ps_rpc_conns_sweep_(s);
  for (int i = 0; i < s->nconns; i++) {
    int q = 0;
    if (s->conns[i].suspect_ms || ioctl(s->conns[i].fd, SIOCOUTQ, &q) != 0) continue;
    PS_DEBUG("connection fd:%d: %d bytes unsent", s->conns[i].fd, q);
    if (q == 0) continue;
    s->conns[i].suspect_ms = t;
    s->conns[i].outq = q;
  }
  pthread_mutex_unlock(&s->accept_mu);
}

/* 2 s after a call was cancelled that way: a connection that has still
 * not sent a byte of what it had queued belongs to a client that reads
 * nothing, and
 * gRPC would keep the connection, its write and all it references for
 * good (see conns_shutdown): shut the socket down. */
void ps_rpc_conns_check_suspects_(ps_rpc_server *s, int64_t t) {
  pthread_mutex_lock(&s->accept_mu);
  for (int i = 0; i < s->nconns; i++) {
    conn_slot *c = &s->conns[i];
    if (c->suspect_ms == 0 || t - c->suspect_ms < 2000) continue;
    int q = 0;
    struct stat sb;
    int bad = fstat(c->fd, &sb) != 0 || sb.st_ino != c->ino || sb.st_dev != c->dev ||
              ioctl(c->fd, SIOCOUTQ, &q) != 0;
    PS_DEBUG("connection fd:%d: %d bytes unsent (was %d)", c->fd, bad ? -1 : q, c->outq);
    if (bad || q == 0) {
      c->suspect_ms = 0; /* gone, or it sent everything: it reads */
    } else if (q != c->outq) {
      c->suspect_ms = t; /* still moving: watch on */
      c->outq = q;
    } else {
      if (shutdown(c->fd, SHUT_RDWR) == 0)
        PS_WARN("closed the connection of fd:%d: its client has read nothing for "
                "2 s after a call was cancelled (--stream-timeout-secs)",
                c->fd);
      c->suspect_ms = 0;
    }
  }
  pthread_mutex_unlock(&s->accept_mu);
}
