/* Prometheus text endpoints: see metrics.h. */
#include "metrics.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_mbuf_printf(ps_mbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->n;
    int k = vsnprintf(b->p ? b->p + b->n : NULL, room, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = true;
      return;
    }
    if ((size_t)k < room) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap - b->n <= (size_t)k)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
}

void ps_mbuf_family(ps_mbuf *b, const char *name, const char *type, const char *help) {
  ps_mbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void ps_mbuf_label(ps_mbuf *b, const char *value) {
  for (const char *c = value; *c; c++) {
    if (*c == '\\' || *c == '"')
      ps_mbuf_printf(b, "\\%c", *c);
    else if (*c == '\n')
      ps_mbuf_printf(b, "\\n");
    else
      ps_mbuf_printf(b, "%c", *c);
  }
}

struct ps_metrics_server {
  struct MHD_Daemon *d;
  ps_metrics_render_fn render;
  void *arg;
  pthread_mutex_t mu; /* one scrape at a time */
  int port;
  char host[256]; /* where it listens, for the log */
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state) {
  (void)version;
  (void)upload;
  (void)upload_size;
  (void)state;
  ps_metrics_server *m = cls;
  struct MHD_Response *r;
  unsigned int code = MHD_HTTP_OK;
  ps_mbuf b = {0};
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    code = MHD_HTTP_METHOD_NOT_ALLOWED;
    ps_mbuf_printf(&b, "only GET /metrics\n");
  } else if (strcmp(url, "/metrics") != 0) {
    code = MHD_HTTP_NOT_FOUND;
    ps_mbuf_printf(&b, "not found: the metrics are at /metrics\n");
  } else {
    pthread_mutex_lock(&m->mu);
    m->render(&b, m->arg);
    pthread_mutex_unlock(&m->mu);
  }
  if (b.oom) {
    free(b.p);
    b = (ps_mbuf){0};
    code = MHD_HTTP_INTERNAL_SERVER_ERROR;
  }
  r = MHD_create_response_from_buffer(b.n, b.p ? b.p : (char *)"", MHD_RESPMEM_MUST_COPY);
  free(b.p);
  if (r == NULL) return MHD_NO;
  MHD_add_response_header(r, "Content-Type",
                          code == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8"
                                              : "text/plain; charset=utf-8");
  enum MHD_Result ret = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ret;
}

/* Whether @host means every interface. */
static bool is_wildcard(const char *host) {
  return host == NULL || host[0] == '\0' || !strcmp(host, "0.0.0.0") ||
         !strcmp(host, "::") || !strcmp(host, "[::]") || !strcmp(host, "*");
}

ps_metrics_server *ps_metrics_start(const char *host, int port,
                                    ps_metrics_render_fn render, void *arg,
                                    ps_status *st) {
  if (port < 0 || port > 65535) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "metrics port %d is not a port number", port);
    return NULL;
  }
  /* one address of @host (the first it resolves to), or every interface */
  struct sockaddr_storage sa;
  bool any = is_wildcard(host);
  char hbuf[256];
  if (!any) {
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') /* [v6] */
      snprintf(hbuf, sizeof hbuf, "%.*s", (int)(hl - 2), host + 1);
    else
      snprintf(hbuf, sizeof hbuf, "%s", host);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *res = NULL;
    int e = getaddrinfo(hbuf, NULL, &hints, &res);
    if (e != 0 || res == NULL || res->ai_addrlen > sizeof sa) {
      ps_status_set(st, PS_UNAVAILABLE, "cannot serve metrics on %s: %s", hbuf,
                    e ? gai_strerror(e) : "no address");
      if (res) freeaddrinfo(res);
      return NULL;
    }
    memset(&sa, 0, sizeof sa);
    memcpy(&sa, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (sa.ss_family == AF_INET)
      ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);
    else
      ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
  }
  ps_metrics_server *m = calloc(1, sizeof *m);
  if (m == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  m->render = render;
  m->arg = arg;
  pthread_mutex_init(&m->mu, NULL);
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD;
  if (any)
    flags |= MHD_USE_DUAL_STACK;
  else if (sa.ss_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  if (any)
    m->d =
        MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, answer, m,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned int)64,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10, MHD_OPTION_END);
  else
    m->d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)64,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10, MHD_OPTION_END);
  if (m->d == NULL) {
    pthread_mutex_destroy(&m->mu);
    free(m);
    if (any)
      ps_status_set(st, PS_UNAVAILABLE,
                    "cannot serve metrics on port %d (in use, or no permission)", port);
    else
      ps_status_set(st, PS_UNAVAILABLE,
                    "cannot serve metrics on port %d of %s (in use, not an address of "
                    "this host, or no permission)",
                    port, hbuf);
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
  m->port = info ? (int)info->port : port;
  snprintf(m->host, sizeof m->host, "%s", any ? "every interface" : hbuf);
  return m;
}

int ps_metrics_port(const ps_metrics_server *m) {
  return m ? m->port : 0;
}

const char *ps_metrics_host(const ps_metrics_server *m) {
  return m ? m->host : "";
}

void ps_metrics_stop(ps_metrics_server *m) {
  if (m == NULL) return;
  MHD_stop_daemon(m->d);
  pthread_mutex_destroy(&m->mu);
  free(m);
}
