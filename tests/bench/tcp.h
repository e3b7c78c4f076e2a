/* Raw TCP over loopback for the benches' baselines: whole sends and
 * receives, a listener on a kernel-picked port, a connection with
 * TCP_NODELAY, and the bulk pull/push pattern both sides of a dense
 * baseline speak. */
#ifndef PS_BENCH_TCP_H
#define PS_BENCH_TCP_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static inline int write_full(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

static inline int read_full(int fd, void *p, size_t n) {
  char *c = p;
  while (n > 0) {
    ssize_t k = recv(fd, c, n, MSG_WAITALL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

static inline void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static inline int tcp_listen(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 1) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

static inline int tcp_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  set_nodelay(fd);
  return fd;
}

/* The dense baselines' pattern, one transfer of @n bytes: 'R' (a pull)
 * sends one request byte and receives @n bytes into @buf; 'W' (a push)
 * sends the byte and the @n bytes of @buf, then receives a 1-byte ack.
 * 0, or -1 when the connection failed. */
static inline int tcp_bulk_xfer(int fd, char cmd, char *buf, size_t n) {
  char ack;
  if (write_full(fd, &cmd, 1) != 0) return -1;
  if (cmd == 'R') return read_full(fd, buf, n);
  return write_full(fd, buf, n) != 0 || read_full(fd, &ack, 1) != 0 ? -1 : 0;
}

/* The peer's side of tcp_bulk_xfer() for transfers of @n bytes, from and
 * into one reused buffer of its own, until the connection ends (EOF, an
 * error or an unknown command).  -1 if the buffer cannot be had, else 0. */
static inline int tcp_bulk_serve(int fd, size_t n) {
  char *buf = malloc(n);
  if (buf == NULL) return -1;
  memset(buf, 1, n); /* pre-touched */
  char cmd;
  while (read_full(fd, &cmd, 1) == 0) {
    if (cmd == 'W') {
      if (read_full(fd, buf, n) != 0 || write_full(fd, "k", 1) != 0) break;
    } else if (cmd != 'R' || write_full(fd, buf, n) != 0) {
      break;
    }
  }
  free(buf);
  return 0;
}

#endif
