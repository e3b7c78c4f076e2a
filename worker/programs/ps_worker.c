/* ps-worker: a training worker with built-in models.
 *
 * Joins the cluster through the coordinator (the chief restores or
 * initializes, the others wait), trains asynchronously (or synchronously
 * with --sync), prints a progress line every --log-every steps, saves
 * periodically and at the end (chief), and prints the test metric.
 *
 * This file is main; ps_worker_internal.h lists the files of the rest. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "ps_worker_internal.h"

/* Exit status when a ps stopped answering (--rpc-timeout): the ps may come
 * back with its state, so a scheduler may wait and rerun rather than
 * restore (sysexits' EX_UNAVAILABLE). */
#define EXIT_PS_STALLED 69

/* The cluster and this task's place in it (--local: none); 0 or 2. */
static int resolve_cluster(job *j, ps_status *st) {
  j->self = (ps_task_id){.job = "local", .task = 0};
  j->chief = true;
  j->num_workers = 1;
  if (j->o.local) return 0;
  const char *name = j->o.job;
  int task = j->o.task;
  if (j->o.cluster_file && name == NULL) name = "worker";
  if (name != NULL && task < 0) task = 0;
  j->cluster = ps_cluster_resolve(j->o.cluster_file, name, task, &j->self, st);
  if (j->cluster == NULL) {
    fprintf(stderr, "ps-worker: %s\n", st->msg);
    return 2;
  }
  j->evaluator = !strcmp(j->self.job, "evaluator");
  if (strcmp(j->self.job, "chief") != 0 && strcmp(j->self.job, "worker") != 0 &&
      !j->evaluator) {
    fprintf(
        stderr,
        "ps-worker: this task is %s/%d in the cluster spec, but ps-worker runs chief, "
        "worker and evaluator tasks%s\n",
        j->self.job, j->self.task,
        !strcmp(j->self.job, "ps") ? " (a ps task runs ps-server)" : "");
    return 2;
  }
  if (j->evaluator && j->o.ckpt_dir == NULL) {
    fprintf(stderr, "ps-worker: an evaluator needs --checkpoint-dir, the directory the "
                    "chief's checkpoints appear in\n");
    return 2;
  }
  if (ps_cluster_num_tasks(j->cluster, "ps") < 1) {
    fprintf(stderr, "ps-worker: the cluster spec has no ps job (use --local to train "
                    "in one process)\n");
    return 2;
  }
  ps_task_id ch;
  j->chief = ps_cluster_chief(j->cluster, &ch) == 0 && !strcmp(ch.job, j->self.job) &&
             ch.task == j->self.task;
  /* the tasks the spec lists (a sparse spec has holes), and this one's
   * place among them: its data shard */
  int nchief = ps_cluster_num_listed(j->cluster, "chief");
  j->num_workers = nchief + ps_cluster_num_listed(j->cluster, "worker");
  j->worker_index = 0;
  if (strcmp(j->self.job, "chief") != 0) {
    j->worker_index = nchief;
    for (int t = 0; t < j->self.task; t++)
      j->worker_index += ps_cluster_address(j->cluster, "worker", t) != NULL;
  }
  return 0;
}

/* The worker's Prometheus page (--metrics-port). */
static void render_metrics(ps_mbuf *b, void *arg) {
  job *j = arg;
  ps_mbuf_family(b, "ps_worker_steps_total", "counter",
                 "Training steps this worker ran.");
  ps_mbuf_printf(b, "ps_worker_steps_total %lld\n", (long long)atomic_load(&j->m_steps));
  ps_mbuf_family(b, "ps_worker_examples_total", "counter",
                 "Examples this worker trained on.");
  ps_mbuf_printf(b, "ps_worker_examples_total %lld\n",
                 (long long)atomic_load(&j->m_examples));
  ps_mbuf_family(b, "ps_worker_examples_per_second", "gauge",
                 "Examples per second over the last progress interval.");
  ps_mbuf_printf(b, "ps_worker_examples_per_second %.3f\n",
                 atomic_load(&j->m_examples_per_sec));
  ps_mbuf_family(b, "ps_worker_global_step", "gauge",
                 "The global step after its last step.");
  ps_mbuf_printf(b, "ps_worker_global_step %lld\n",
                 (long long)atomic_load(&j->m_global_step));
  ps_mbuf_family(b, "ps_worker_loss", "gauge", "The loss of its last step.");
  ps_mbuf_printf(b, "ps_worker_loss %.6g\n", atomic_load(&j->m_loss));
  if (j->client == NULL) return;
  int n = ps_client_num_ps(j->client);
  ps_mbuf_family(b, "ps_worker_ps_calls_total", "counter", "Calls to each ps task.");
  for (int t = 0; t < n; t++) {
    unsigned long long calls;
    double secs;
    ps_client_task_stats(j->client, t, &calls, &secs);
    ps_mbuf_printf(b, "ps_worker_ps_calls_total{ps=\"ps/%d\"} %llu\n", t, calls);
  }
  ps_mbuf_family(b, "ps_worker_ps_wait_seconds_total", "counter",
                 "Seconds this worker waited for calls to each ps task.");
  for (int t = 0; t < n; t++) {
    unsigned long long calls;
    double secs;
    ps_client_task_stats(j->client, t, &calls, &secs);
    ps_mbuf_printf(b, "ps_worker_ps_wait_seconds_total{ps=\"ps/%d\"} %.6f\n", t, secs);
  }
  ps_mbuf_family(b, "ps_worker_ps_unanswered_seconds", "gauge",
                 "Seconds the calls waiting on each ps task have heard nothing from it "
                 "(0: answering); at --rpc-timeout the worker fails.");
  for (int t = 0; t < n; t++)
    ps_mbuf_printf(b, "ps_worker_ps_unanswered_seconds{ps=\"ps/%d\"} %.3f\n", t,
                   ps_client_task_unanswered_secs(j->client, t));
  ps_mbuf_family(b, "ps_worker_rpc_timeout_seconds", "gauge",
                 "--rpc-timeout: the silence of a ps after which the worker fails.");
  ps_mbuf_printf(b, "ps_worker_rpc_timeout_seconds %.3f\n",
                 (double)ps_client_rpc_timeout_ms(j->client) / 1000);
}

static void job_free(job *j) {
  ps_metrics_stop(j->metrics); /* before what its page reads is freed */
  ps_status hbe;
  if (ps_coordinator_heartbeat_stop(j->hb, false, &hbe) != 0) PS_WARN("%s", hbe.msg);
  free(ps_worker_ev_.v);
  free(ps_worker_ev_.in);
  free(ps_worker_ev_.assign);
  ps_dataset_iter_destroy(j->it);
  ps_dataset_free(&j->batch);
  ps_dataset_free(&j->train);
  ps_dataset_free(&j->test);
  free(j->truth);
  ps_session_destroy(j->s);
  ps_saver_destroy(j->saver);
  ps_graph_destroy(j->m.g);
  ps_worker_watch_free_(j->watch);
  ps_client_destroy(j->hbc);
  ps_client_destroy(j->client);
  ps_cluster_destroy(j->cluster);
  if (j->rpc_up) ps_library_shutdown();
}

int main(int argc, char **argv) {
  job j = {.saved_step = -1};
  int prc = ps_worker_parse_args_(argc, argv, &j.o);
  if (prc) return prc == 1 ? 0 : 2;
  ps_status st;
  ps_status_clear(&st);
  if (resolve_cluster(&j, &st) != 0) {
    ps_cluster_destroy(j.cluster);
    return 2;
  }
  char taskname[96];
  snprintf(taskname, sizeof taskname, "%s/%d", j.self.job, j.self.task);
  ps_log_set_task(taskname);
  if (j.o.replicas == 0) j.o.replicas = j.num_workers;
  j.o.num_workers = j.num_workers;
  signal(SIGINT, ps_worker_on_signal_);
  signal(SIGTERM, ps_worker_on_signal_);
  int rc = 0;
  int up = ps_worker_set_up_(&j, &st);
  if (up == 0 && j.o.metrics_port >= 0) {
    if ((j.metrics = ps_metrics_start(j.o.metrics_bind, j.o.metrics_port, render_metrics,
                                      &j, &st)) == NULL) {
      ps_status_prefix(&st, "--metrics-port %d", j.o.metrics_port);
      up = -1;
    } else {
      PS_INFO("metrics on port %d of %s (GET /metrics)", ps_metrics_port(j.metrics),
              ps_metrics_host(j.metrics));
    }
  }
  if (up != 0 && st.code == PS_CANCELLED && atomic_load(&ps_worker_stop_requested_)) {
    /* SIGTERM before training started: nothing to save, a clean stop */
    PS_WARN("stopped by a signal before training: %s", st.msg);
  } else if (up == 0 && j.evaluator) {
    if (ps_worker_evaluate_loop_(&j, &st) != 0) {
      PS_ERROR("%s", st.msg);
      fprintf(stderr, "ps-worker: %s\n", st.msg);
      rc = 1;
    }
  } else if (up != 0 || ps_worker_train_loop_(&j, &st) != 0) {
    if (!ps_worker_found_job_done_(&j, &st)) {
      PS_ERROR("%s", st.msg);
      fprintf(stderr, "ps-worker: %s\n", st.msg);
      rc = ps_client_stalled(&st) ? EXIT_PS_STALLED : 1;
      ps_worker_chief_failed_(&j, up != 0 ? "set-up" : "training", &st);
    }
  } else if (ps_worker_finish_(&j, &st) != 0 && !ps_worker_found_job_done_(&j, &st)) {
    PS_ERROR("%s", st.msg);
    fprintf(stderr, "ps-worker: %s\n", st.msg);
    rc = ps_client_stalled(&st) ? EXIT_PS_STALLED : 1;
  }
  /* Stopped by SIGTERM/SIGINT before --steps (a time limit, scancel): the
   * final checkpoint is saved, but the job is not done, so 128 + the
   * signal's number (143 for SIGTERM) tells the scheduler to resume it. */
  int sig = atomic_load(&ps_worker_stop_requested_);
  if (rc == 0 && sig != 0 && !j.evaluator && j.gs < j.o.steps) {
    PS_WARN(
        "exit %d: stopped by signal %d at global step %lld of %lld; resubmit to resume",
        128 + sig, sig, (long long)j.gs, (long long)j.o.steps);
    rc = 128 + sig;
  }
  job_free(&j);
  return rc;
}
