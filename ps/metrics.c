/* ps-server's Prometheus page (--metrics-port): RPCs by method and code,
 * their latency, bytes in and out, the variables held, updates that waited
 * at a snapshot gate, the embedding tables, and the last checkpoint shard
 * this ps saved. */
#include "metrics.h"
#include "repl.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "embed.h"
#include "paramserver/status.h"
#include "store.h"

/* "paramserver.Ps/Read" from "/paramserver.Ps/Read". */
static const char *method_label(const char *m) {
  return m[0] == '/' ? m + 1 : m;
}

static void render_rpcs(ps_mbuf *b, const ps_rpc_method_stats *ms, size_t n) {
  ps_mbuf_family(b, "ps_rpc_calls_total", "counter",
                 "RPCs this ps answered, by method and gRPC status code.");
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < PS_RPC_NCODES; k++)
      if (ms[i].calls[k] || k == 0)
        ps_mbuf_printf(b, "ps_rpc_calls_total{method=\"%s\",code=\"%s\"} %llu\n",
                       method_label(ms[i].method), ps_status_code_name(k),
                       ms[i].calls[k]);
  ps_mbuf_family(b, "ps_rpc_duration_seconds", "histogram",
                 "Time from a request's arrival to the end of its call.");
  for (size_t i = 0; i < n; i++) {
    const char *m = method_label(ms[i].method);
    unsigned long long cum = 0;
    for (int k = 0; k < PS_RPC_NBUCKETS; k++) {
      cum += ms[i].buckets[k];
      ps_mbuf_printf(b, "ps_rpc_duration_seconds_bucket{method=\"%s\",le=\"%g\"} %llu\n",
                     m, ps_rpc_latency_bounds[k], cum);
    }
    cum += ms[i].buckets[PS_RPC_NBUCKETS];
    ps_mbuf_printf(b, "ps_rpc_duration_seconds_bucket{method=\"%s\",le=\"+Inf\"} %llu\n",
                   m, cum);
    ps_mbuf_printf(b, "ps_rpc_duration_seconds_sum{method=\"%s\"} %.6f\n", m,
                   ms[i].sum_secs);
    ps_mbuf_printf(b, "ps_rpc_duration_seconds_count{method=\"%s\"} %llu\n", m, cum);
  }
  ps_mbuf_family(b, "ps_rpc_received_bytes_total", "counter",
                 "Request bytes received (messages and bulk data), by method.");
  for (size_t i = 0; i < n; i++)
    ps_mbuf_printf(b, "ps_rpc_received_bytes_total{method=\"%s\"} %llu\n",
                   method_label(ms[i].method), ms[i].bytes_in);
  ps_mbuf_family(b, "ps_rpc_sent_bytes_total", "counter",
                 "Response bytes sent (messages and bulk data), by method.");
  for (size_t i = 0; i < n; i++)
    ps_mbuf_printf(b, "ps_rpc_sent_bytes_total{method=\"%s\"} %llu\n",
                   method_label(ms[i].method), ms[i].bytes_out);
}

/* One sample per table of family @name, from the stats' field at @off. */
static void table_family(ps_mbuf *b, const ps_embed_stats *v, size_t n, const char *name,
                         const char *type, const char *help, size_t off) {
  ps_mbuf_family(b, name, type, help);
  for (size_t i = 0; i < n; i++) {
    int64_t x;
    memcpy(&x, (const char *)&v[i] + off, sizeof x);
    ps_mbuf_printf(b, "%s{table=\"", name);
    ps_mbuf_label(b, v[i].name);
    ps_mbuf_printf(b, "\"} %lld\n", (long long)x);
  }
}

static void render_tables(ps_mbuf *b, ps_embed_store *es) {
  size_t n = 0;
  ps_embed_stats *v = ps_embed_list(es, &n);
  table_family(b, v, n, "ps_embedding_rows", "gauge",
               "Rows of each embedding table on this ps.",
               offsetof(ps_embed_stats, rows));
  table_family(b, v, n, "ps_embedding_bytes", "gauge",
               "Bytes of each embedding table on this ps (rows, slots, index, sketch).",
               offsetof(ps_embed_stats, bytes));
  table_family(b, v, n, "ps_embedding_evicted_total", "counter",
               "Rows evicted for room (max_rows).",
               offsetof(ps_embed_stats, evicted_total));
  table_family(b, v, n, "ps_embedding_expired_total", "counter",
               "Rows removed for age (ttl_steps, ttl_seconds).",
               offsetof(ps_embed_stats, expired_total));
  table_family(b, v, n, "ps_embedding_admission_refused_total", "counter",
               "Training lookups of keys that admission did not give a row yet "
               "(min_count).",
               offsetof(ps_embed_stats, refused_total));
  free(v);
}

static void render(ps_mbuf *b, void *arg) {
  ps_server_metrics *m = arg;
  size_t n = 0;
  ps_rpc_server *srv = atomic_load(&m->srv);
  ps_rpc_method_stats *ms = srv ? ps_rpc_server_stats(srv, &n) : NULL;
  if (srv && ms == NULL) {
    b->oom = true;
    return;
  }
  if (ms) render_rpcs(b, ms, n);
  free(ms);
  int64_t nvars = 0, bytes = 0;
  ps_store_totals(m->store, &nvars, &bytes);
  ps_mbuf_family(b, "ps_variables", "gauge", "Variables this ps holds.");
  ps_mbuf_printf(b, "ps_variables %lld\n", (long long)nvars);
  ps_mbuf_family(b, "ps_variable_bytes", "gauge",
                 "Bytes of the variables this ps holds.");
  ps_mbuf_printf(b, "ps_variable_bytes %lld\n", (long long)bytes);
  render_tables(b, ps_service_tables(m->svc));
  ps_mbuf_family(b, "ps_snapshot_gate_waits_total", "counter",
                 "Updates that waited at a closed snapshot gate (a consistent save).");
  ps_mbuf_printf(b, "ps_snapshot_gate_waits_total %llu\n", ps_store_gate_waits(m->store));
  double end, secs;
  long long sbytes, count;
  ps_service_last_save(m->svc, &end, &secs, &sbytes, &count);
  ps_mbuf_family(b, "ps_checkpoint_saves_total", "counter",
                 "Checkpoint shards this ps wrote.");
  ps_mbuf_printf(b, "ps_checkpoint_saves_total %lld\n", count);
  ps_mbuf_family(b, "ps_checkpoint_last_save_timestamp_seconds", "gauge",
                 "When the last shard this ps wrote was done (0: none yet).");
  ps_mbuf_printf(b, "ps_checkpoint_last_save_timestamp_seconds %.3f\n", end);
  ps_mbuf_family(b, "ps_checkpoint_last_save_duration_seconds", "gauge",
                 "How long the last shard this ps wrote took.");
  ps_mbuf_printf(b, "ps_checkpoint_last_save_duration_seconds %.6f\n", secs);
  ps_mbuf_family(b, "ps_checkpoint_last_save_bytes", "gauge",
                 "Bytes of the last shard this ps wrote.");
  ps_mbuf_printf(b, "ps_checkpoint_last_save_bytes %lld\n", sbytes);
  pthread_mutex_lock(&m->repl_mu);
  if (m->repl) {
    ps_repl_stats rs;
    ps_repl_get_stats(m->repl, &rs);
    ps_mbuf_family(b, "ps_view_epoch", "gauge",
                   "Epoch of the replication view this ps serves.");
    ps_mbuf_printf(b, "ps_view_epoch %lld\n", (long long)rs.epoch);
    ps_mbuf_family(b, "ps_replicas_missing", "gauge",
                   "Replicas missing from the shards this ps is primary of.");
    ps_mbuf_printf(b, "ps_replicas_missing %d\n", rs.replicas_missing);
    ps_mbuf_family(b, "ps_failovers_total", "counter",
                   "Times this ps became the primary of a shard after a failure.");
    ps_mbuf_printf(b, "ps_failovers_total %lld\n", rs.failovers);
    ps_mbuf_family(b, "ps_replication_lag_entries", "gauge",
                   "Replication entries sent to backups and not yet acknowledged.");
    ps_mbuf_printf(b, "ps_replication_lag_entries %lld\n", rs.lag_entries);
    ps_mbuf_family(b, "ps_replication_lag_bytes", "gauge",
                   "Replication bytes sent to backups and not yet acknowledged.");
    ps_mbuf_printf(b, "ps_replication_lag_bytes %lld\n", rs.lag_bytes);
    ps_mbuf_family(b, "ps_replication_cut_through_bytes_total", "counter",
                   "Bytes of large assigns forwarded to backups while they still "
                   "arrived from the client.");
    ps_mbuf_printf(b, "ps_replication_cut_through_bytes_total %lld\n",
                   rs.cut_through_bytes);
  }
  pthread_mutex_unlock(&m->repl_mu);
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  ps_mbuf_family(b, "ps_uptime_seconds", "gauge", "Seconds since this ps started.");
  ps_mbuf_printf(b, "ps_uptime_seconds %.3f\n",
                 (double)(now.tv_sec - m->start.tv_sec) +
                     (double)(now.tv_nsec - m->start.tv_nsec) / 1e9);
}

int ps_server_metrics_start(ps_server_metrics *m, const char *host, int port,
                            ps_status *st) {
  clock_gettime(CLOCK_MONOTONIC, &m->start);
  m->http = ps_metrics_start(host, port, render, m, st);
  if (m->http == NULL) return st->code;
  PS_INFO("metrics on port %d of %s (GET /metrics)", ps_metrics_port(m->http),
          ps_metrics_host(m->http));
  return 0;
}

void ps_server_metrics_stop(ps_server_metrics *m) {
  ps_metrics_stop(m->http);
  m->http = NULL;
}

void ps_server_metrics_set_repl(ps_server_metrics *m, struct ps_repl *r) {
  pthread_mutex_lock(&m->repl_mu);
  m->repl = r;
  pthread_mutex_unlock(&m->repl_mu);
}
