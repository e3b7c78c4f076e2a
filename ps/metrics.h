/* ps-server's Prometheus endpoint (--metrics-port, --metrics-bind); metrics.c. */
#ifndef PS_SERVER_METRICS_H
#define PS_SERVER_METRICS_H

#include <pthread.h>
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
  /* replicated (ps/repl.h): its stats, until ps_server_metrics_set_repl
   * NULL before it is destroyed */
  pthread_mutex_t repl_mu; /* PTHREAD_MUTEX_INITIALIZER */
  struct ps_repl *repl;
  int replicas;
} ps_server_metrics;
void ps_server_metrics_set_repl(ps_server_metrics *m, struct ps_repl *r);

/* Serves the page on @port (0: the kernel picks; the log says which) of
 * @host (NULL: every interface; see ps_metrics_start). */
int ps_server_metrics_start(ps_server_metrics *m, const char *host, int port,
                            ps_status *st);
void ps_server_metrics_stop(ps_server_metrics *m);

#endif
