/* Prometheus text endpoints (--metrics-port and --metrics-bind of ps-server
 * and ps-worker):
 * an HTTP server (libmicrohttpd, its own thread) answering GET /metrics
 * with the page a callback renders at each scrape, and a small writer for
 * the text exposition format (version 0.0.4). */
#ifndef PS_METRICS_H
#define PS_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

/* A growing text buffer; after an allocation failure it stays as it was
 * and @oom is set. */
typedef struct ps_mbuf {
  char *p;
  size_t n, cap;
  bool oom;
} ps_mbuf;

void ps_mbuf_printf(ps_mbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* "# HELP name help" and "# TYPE name type" */
void ps_mbuf_family(ps_mbuf *b, const char *name, const char *type, const char *help);
/* A label value with \, " and newline escaped, as the format wants. */
void ps_mbuf_label(ps_mbuf *b, const char *value);

typedef void (*ps_metrics_render_fn)(ps_mbuf *out, void *arg);
typedef struct ps_metrics_server ps_metrics_server;

/* Serves GET /metrics on @port (0: the kernel picks) of @host: the first
 * address a name resolves to, a numeric IPv4 or IPv6 address ("[::1]" or
 * "::1"), or, for NULL, "", 0.0.0.0, :: and *, every interface (IPv4 and
 * IPv6).  The page has no authentication: callers bind it where their
 * RPC port listens (ps-server --bind) unless told otherwise.  @render runs
 * on the server's thread, one scrape at a time.  NULL with @st set when
 * the port cannot be had: UNAVAILABLE "cannot serve metrics on port N
 * (in use, or no permission)", "... on port N of HOST (...)" or "cannot
 * serve metrics on HOST: <resolver error>". */
ps_metrics_server *ps_metrics_start(const char *host, int port,
                                    ps_metrics_render_fn render, void *arg,
                                    ps_status *st);
int ps_metrics_port(const ps_metrics_server *m);
/* Where it listens: the host given, or "every interface". */
const char *ps_metrics_host(const ps_metrics_server *m);
/* Stops serving (waits for a scrape in progress) and frees; NULL is fine. */
void ps_metrics_stop(ps_metrics_server *m);

#endif
