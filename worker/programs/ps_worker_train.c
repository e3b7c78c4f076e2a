/* ps-worker's training: the set-up (data, client, model, saver, session,
 * the coordinator's start-up) and the loop of steps, with its recovery
 * when a ps restarts or goes away. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "ps_worker_internal.h"
#include "security_flags.h"

static bool recoverable(const ps_status *e) {
  if (ps_client_stalled(e)) return false; /* waiting on would be for ever */
  return e->code == PS_UNAVAILABLE || e->code == PS_FAILED_PRECONDITION ||
         e->code == PS_NOT_FOUND || e->code == PS_DEADLINE_EXCEEDED ||
         e->code == PS_ABORTED;
}

/* A non-chief worker with --checkpoint-dir and no --ps-timeout waits for
 * the ps in rounds of this long; between two, a latest checkpoint that
 * holds --steps means the job ended before this worker got to its ps
 * (the chief shut them down): it stops waiting for ps that are gone, and
 * ends as done (ps_worker_found_job_done_). */
#define LATE_ROUND_SECS 10.0

static int prepare(job *j, ps_coordinator_outcome *outcome, ps_status *st) {
  bool rounds = !j->chief && !j->evaluator && j->o.ps_timeout <= 0 && j->o.ckpt_dir;
  /* (a ps that accepts but does not answer ends a round at once: stalled) */
  while (rounds && ps_coordinator_wait_for_ps(j->s, LATE_ROUND_SECS, st) != 0) {
    if (st->code != PS_DEADLINE_EXCEEDED || ps_client_stalled(st)) return st->code;
    if (ps_worker_ckpt_done_(j))
      return ps_status_set(st, PS_UNAVAILABLE, "the ps did not answer for %.0f s",
                           LATE_ROUND_SECS);
  }
  return ps_coordinator_prepare(j->s, &j->co, outcome, st);
}

/* Data, client, model, saver, session, and the coordinator's start-up;
 * then the iterator over this worker's share of the training data. */

int ps_worker_set_up_(job *j, ps_status *st) {
  const options *o = &j->o;
  if (ps_worker_load_data_(o, &j->train, &j->test, &j->truth, st)) return -1;
  if (j->evaluator) return ps_worker_set_up_evaluator_(j, st);
  if (j->cluster) {
    ps_library_init();
    j->rpc_up = true;
    if (j->chief) ps_security_admin_token(&j->o.sec, j->cluster);
    if ((j->client = ps_client_create(j->cluster, "ps", &j->o.sec, st)) == NULL)
      return -1;
    /* heartbeats, their reads and the done mark: bounded when ps/0 does
     * not answer (the data deadline is 300 s) */
    ps_client_options ho = j->o.sec;
    ho.control_timeout_ms = ho.data_timeout_ms = PS_COORDINATOR_HEARTBEAT_CALL_MS;
    ho.max_retries = 1;
    if ((j->hbc = ps_client_create(j->cluster, "ps", &ho, st)) == NULL) return -1;
  }
  if (o->meta) {
    if (ps_worker_import_model_(o->meta, &j->m, &j->saver, st)) return -1;
    PS_INFO("graph imported from %s (%zu nodes)", o->meta, ps_graph_num_nodes(j->m.g));
  } else {
    if (ps_worker_build_model_(o, j->cluster, j->client ? ps_client_num_ps(j->client) : 0,
                               &j->m, st))
      return -1;
    /* ps-worker owns its checkpoint directory: retention over its list,
     * across restarts (tf.train.CheckpointManager's way) */
    ps_saver_options so = {.max_to_keep = o->max_to_keep, .directory_retention = true};
    if ((j->saver = ps_saver_create(j->m.g, &so, st)) == NULL) return -1;
  }
  if ((j->s = ps_session_create(j->m.g, j->client, st)) == NULL) return -1;
  PS_INFO("%s model%s, %d worker(s), this one %s%s", ps_worker_model_name_(o->model),
          o->sync ? " (synchronous)" : "", j->num_workers,
          j->chief ? "the chief" : "not the chief", o->local ? " (local variables)" : "");
  j->co = (ps_coordinator_options){.is_chief = j->chief,
                                   .ps_timeout_secs = o->ps_timeout,
                                   .restore_prefix = o->restore,
                                   .no_restore = o->no_restore,
                                   .saver = j->saver};
  ps_coordinator_outcome outcome;
  if (prepare(j, &outcome, st)) return -1;
  if (!j->chief && j->client) { /* the chief waits for joined workers at the end */
    char me[PS_CLUSTER_MAX_JOB_NAME + 16];
    snprintf(me, sizeof me, "%s/%d", j->self.job, j->self.task);
    if ((j->hb = ps_coordinator_heartbeat_start(j->hbc, me, st)) == NULL) return -1;
  }
  if (j->chief && j->client && j->num_workers > 1 &&
      (j->watch = ps_worker_watch_new_(j->cluster, &j->self)) == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  if ((j->gs = ps_worker_read_step_(&j->m, j->s, st)) < 0) return -1;
  PS_INFO("cluster ready (%s) at global step %lld; training to step %lld",
          ps_coordinator_outcome_name(outcome), (long long)j->gs, (long long)o->steps);
  ps_dataset_iter_options io = {.batch_size = o->batch,
                                .shuffle = true,
                                .seed = o->seed * 1000003u + (uint64_t)j->worker_index,
                                .task = j->worker_index,
                                .num_tasks = j->num_workers};
  if ((j->it = ps_dataset_iter_create(&j->train, &io, st)) == NULL) return -1;
  return 0;
}

/* After a failed step that may pass (a ps restarted or went away): a new
 * session, and the coordinator restores or re-joins. */
static int recover(job *j, const ps_status *e, ps_status *st) {
  PS_WARN("step failed (%s); waiting for the cluster to recover", e->msg);
  ps_session_destroy(j->s);
  if ((j->s = ps_session_create(j->m.g, j->client, st)) == NULL) return -1;
  ps_coordinator_outcome outcome;
  if (prepare(j, &outcome, st)) return -1;
  PS_INFO("recovered (%s)", ps_coordinator_outcome_name(outcome));
  /* (a restarted ps/0 lost this worker's heartbeat: its next beat makes it
   * again) */
  return 0;
}

/* Steps until global_step reaches --steps or a signal: logs every
 * --log-every steps; the chief saves on schedule. */

int ps_worker_train_loop_(job *j, ps_status *st) {
  const options *o = &j->o;
  ps_node *fetch[2] = {j->m.loss, ps_variable_value(j->m.step)};
  double t0 = ps_worker_now_secs_(), tlog = t0, last_save_t = t0, loss_sum = 0;
  int64_t since_log = 0, last_save_step = j->gs;
  int recoveries = 0;
  while (j->gs < o->steps && !atomic_load(&ps_worker_stop_requested_)) {
    if (ps_dataset_iter_next(j->it, &j->batch, st)) return -1;
    ps_feed f[4];
    size_t nf = ps_worker_feeds_of_(&j->m, &j->batch, f);
    ps_tensor *out[2] = {NULL, NULL};
    ps_status e;
    if (ps_session_run(j->s, f, nf, fetch, 2, &j->m.train, 1, out, &e) != 0) {
      if (!recoverable(&e) || ++recoveries > 10) {
        *st = e;
        return -1;
      }
      if (recover(j, &e, st)) return -1;
      continue;
    }
    j->trained = true;
    if (j->watch && ps_worker_now_secs_() >= j->watch->next_read) { /* once a second */
      ps_worker_watch_read_(j->watch, j->hbc);
      j->watch->next_read = ps_worker_now_secs_() + PS_COORDINATOR_HEARTBEAT_SECS;
    }
    double loss = *(float *)ps_tensor_data(out[0]);
    j->gs = *(int64_t *)ps_tensor_data(out[1]) + 1;
    ps_tensor_destroy(out[0]);
    ps_tensor_destroy(out[1]);
    j->local++;
    since_log++;
    loss_sum += loss;
    atomic_fetch_add(&j->m_steps, 1);
    atomic_fetch_add(&j->m_examples, o->batch);
    atomic_store(&j->m_global_step, j->gs);
    atomic_store(&j->m_loss, loss);
    double now = ps_worker_now_secs_();
    if (since_log == o->log_every) {
      PS_INFO("step %lld loss %.4f examples/s %.0f", (long long)j->gs,
              loss_sum / (double)since_log,
              (double)(since_log * o->batch) / (now - tlog));
      atomic_store(&j->m_examples_per_sec, (double)(since_log * o->batch) / (now - tlog));
      since_log = 0;
      loss_sum = 0;
      tlog = now;
    }
    if (j->chief && j->client &&
        ((o->save_every_steps && j->gs - last_save_step >= o->save_every_steps) ||
         (o->save_every_secs > 0 && now - last_save_t >= o->save_every_secs))) {
      ps_status se;
      if (ps_saver_save_at_step(j->saver, j->s, "model.ckpt", j->m.step, o->ckpt_dir,
                                NULL, &j->saved_step, &se) != 0)
        PS_WARN("periodic save failed: %s", se.msg);
      last_save_step = j->gs;
      last_save_t = ps_worker_now_secs_();
    }
  }
  double secs = ps_worker_now_secs_() - t0;
  if (j->local)
    PS_INFO("trained %lld local steps in %.1f s: %.0f examples/s", (long long)j->local,
            secs, (double)(j->local * o->batch) / secs);
  if (atomic_load(&ps_worker_stop_requested_))
    PS_WARN("stopped by a signal at global step %lld", (long long)j->gs);
  return 0;
}
