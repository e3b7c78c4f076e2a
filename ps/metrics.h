/* ps-server's Prometheus endpoint (--metrics-port, --metrics-bind); metrics.c. */
#ifndef PS_SERVER_METRICS_H
#define PS_SERVER_METRICS_H

#include <stdatomic.h>
#include <time.h>

#include "common/metrics.h"
#include "common/rpc.h"
#include "service.h"

typedef struct ps_server_metrics {
  _Atomic(ps_rpc_server *) srv; /* NULL until the RPC server exists */
  ps_store *store;
  ps_service *svc;
  struct timespec start;
  ps_metrics_server *http;
} ps_server_metrics;

/* Serves the page on @port (0: the kernel picks; the log says which) of
 * @host (NULL: every interface; see ps_metrics_start). */
int ps_server_metrics_start(ps_server_metrics *m, const char *host, int port,
                            ps_status *st);
void ps_server_metrics_stop(ps_server_metrics *m);

#endif
