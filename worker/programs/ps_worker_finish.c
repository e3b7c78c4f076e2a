/* The end of a ps-worker job: the chief's watch of the other workers'
 * heartbeats and its wait for them, the final save and test metric, the
 * ps shutdown; and what a worker that could not go on decides (is the job
 * done, may a restart fix it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/bundle.h"
#include "common/log.h"
#include "paramserver/checkpoint.h"
#include "ps_worker_internal.h"
#include "security_flags.h"

double ps_worker_now_secs_(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static peer *peers_of(const ps_cluster *cl, const ps_task_id *self, int *n) {
  static const char *const jobs[] = {"chief", "worker"};
  *n = 0;
  int cap = 0;
  for (int k = 0; k < 2; k++) {
    const ps_cluster_job *jb = ps_cluster_find_job(cl, jobs[k]);
    if (jb) cap += jb->ntasks;
  }
  peer *p = calloc((size_t)cap + 1, sizeof *p);
  if (p == NULL) return NULL;
  for (int k = 0; k < 2; k++) {
    const ps_cluster_job *jb = ps_cluster_find_job(cl, jobs[k]);
    for (int t = 0; jb && t < jb->ntasks; t++) {
      if (jb->addrs[t] == NULL || (t == self->task && !strcmp(jobs[k], self->job)))
        continue;
      snprintf(p[*n].task, sizeof p[*n].task, "%s/%d", jobs[k], t);
      p[(*n)++].beat = INT64_MIN;
    }
  }
  return p;
}

/* Appends @task to the list @buf ("worker/1, worker/3"). */
static void list_add(char *buf, size_t n, const char *task) {
  size_t len = strlen(buf);
  if (len + 2 < n) snprintf(buf + len, n - len, "%s%s", len ? ", " : "", task);
}

void ps_worker_watch_free_(watch *w) {
  if (w == NULL) return;
  free(w->p);
  free(w->tasks);
  free(w->v);
  free(w);
}

watch *ps_worker_watch_new_(const ps_cluster *cl, const ps_task_id *self) {
  watch *w = calloc(1, sizeof *w);
  if (w == NULL) return NULL;
  w->p = peers_of(cl, self, &w->n);
  w->tasks = calloc((size_t)w->n + 1, sizeof *w->tasks);
  w->v = calloc((size_t)w->n + 1, sizeof *w->v);
  if (w->p == NULL || w->tasks == NULL || w->v == NULL) {
    ps_worker_watch_free_(w);
    return NULL;
  }
  for (int i = 0; i < w->n; i++)
    w->tasks[i] = w->p[i].task;
  return w;
}

/* Reads every heartbeat in one call (deadline: @c's).  A read that fails
 * ages no one (their clocks restart); a worker seen before whose
 * heartbeat reads 0 (a ps/0 that restarted empty) keeps what it was. */
void ps_worker_watch_read_(watch *w, ps_client *c) {
  ps_status e;
  bool ok = ps_coordinator_heartbeat_read_many(c, w->tasks, (size_t)w->n, w->v, &e) == 0;
  double now = ps_worker_now_secs_();
  if (!ok && !w->failing)
    PS_WARN("reading the heartbeats on ps/0 failed (%s): no worker is judged gone "
            "while they cannot be read",
            e.msg);
  w->failing = !ok;
  for (int i = 0; i < w->n; i++) {
    peer *q = &w->p[i];
    if (!ok) {
      q->changed = now; /* unread: not aged */
      continue;
    }
    int64_t x = w->v[i];
    if (x == 0 && q->beat != INT64_MIN && q->beat != 0)
      x = q->beat; /* seen before, gone from a restarted ps/0 */
    if (x != q->beat) {
      if (x == PS_COORDINATOR_HEARTBEAT_DONE) PS_INFO("%s reported done", q->task);
      q->beat = x;
      q->changed = now;
    }
  }
}

/* Chief: waits until every other worker has reported done (its heartbeat
 * says DONE) or is gone, so that the final checkpoint and the test metric
 * belong to a quiescent model.  A worker is gone when its heartbeat has
 * not moved for PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS of the chief's
 * reads (it joined, then died or stopped); reads of ps/0 that fail age no
 * one.  One without a heartbeat has not joined yet and is waited for up
 * to @join_secs (the chief is about to shut the ps down: a straggler
 * still starting up would find no ps and wait for ever); one the chief
 * has seen before keeps what it was when its heartbeat reads 0 (ps/0
 * restarted empty).  A live worker (its heartbeat moves) is waited for
 * until it is done, however slow its last step, at most until global_step
 * has not moved for @idle_secs. */
static void wait_workers_done(const model *m, ps_session *s, ps_client *c, watch *w,
                              double idle_secs, double join_secs) {
  int n = w->n;
  peer *p = w->p;
  double t0 = ps_worker_now_secs_(), last_move = t0, last_log = t0, next_read = t0;
  int64_t last_step = -1;
  int done = 0, unjoined = 0, alive = 0, gone = 0;
  char unjoined_list[256] = "", gone_list[256] = "", busy_list[256] = "";
  for (;;) {
    double now = ps_worker_now_secs_();
    if (now >= next_read) { /* heartbeats: 5 reads a second, not 50 */
      ps_worker_watch_read_(w, c);
      now = ps_worker_now_secs_();
      next_read = now + 0.2;
      done = unjoined = alive = gone = 0;
      unjoined_list[0] = gone_list[0] = busy_list[0] = '\0';
      for (int i = 0; i < n; i++) {
        int64_t x = p[i].beat == INT64_MIN ? 0 : p[i].beat;
        if (x == PS_COORDINATOR_HEARTBEAT_DONE) {
          done++;
        } else if (x <= 0) {
          unjoined++;
          list_add(unjoined_list, sizeof unjoined_list, p[i].task);
        } else if (now - p[i].changed >= PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS) {
          gone++;
          list_add(gone_list, sizeof gone_list, p[i].task);
        } else {
          alive++;
          list_add(busy_list, sizeof busy_list, p[i].task);
        }
      }
    }
    if (done == n) break;
    if (atomic_load(&ps_worker_stop_requested_)) {
      PS_WARN("stopped by a signal while %d of %d other worker(s) had not reported "
              "done: going on without them",
              n - done, n);
      break;
    }
    if (unjoined > 0 && now - t0 < join_secs) {
      if (now - last_log >= 5) {
        PS_INFO("waiting up to %.0f s for %d worker(s) that have not joined yet: %s",
                join_secs, unjoined, unjoined_list);
        last_log = now;
      }
      last_move = now; /* a joining worker may still take its steps */
      nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
      continue;
    }
    if (alive == 0) {
      if (gone > 0)
        PS_WARN("%d worker(s) joined and then stopped (no heartbeat for %.0f s): going "
                "on without them (%s)",
                gone, PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS, gone_list);
      if (unjoined > 0)
        PS_WARN("%d worker(s) did not join within %.0f s: going on without them (%s)",
                unjoined, join_secs, unjoined_list);
      break;
    }
    ps_status e;
    int64_t gs = ps_worker_read_step_(m, s, &e);
    if (gs != last_step) {
      last_step = gs;
      last_move = now;
    }
    if (now - last_move > idle_secs) {
      PS_WARN("%d of %d other worker(s) reported done and global_step has not moved for "
              "%.0f s: going on without them (%s%s%s)",
              done, n, idle_secs, busy_list, gone ? ", " : "", gone_list);
      break;
    }
    if (now - last_log >= 5) {
      PS_INFO("waiting for %d more worker(s) to finish their last step: %s", alive,
              busy_list);
      last_log = now;
    }
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  }
}

/* Chief with --keep-ps, at the very end: the next job on these ps starts
 * without this one's heartbeats (a DONE left there would pass for one of
 * its workers that has not joined yet). */
static void clear_heartbeats(ps_client *c, const ps_cluster *cl, const ps_task_id *self) {
  int n;
  peer *p = peers_of(cl, self, &n);
  for (int i = 0; p && i < n; i++) {
    ps_status e;
    if (ps_coordinator_heartbeat_clear(c, p[i].task, &e) != 0)
      PS_WARN("could not clear %s's heartbeat on ps/0: %s", p[i].task, e.msg);
  }
  free(p);
}

/* The chief's end-of-job wait gives up on live workers (their heartbeats
 * move) when global_step has not moved for this long: a last step slower
 * than this is taken for a worker that is stuck. */
#define DONE_IDLE_SECS 60.0

/* The job is over (the other workers reported done or are gone, the
 * final checkpoint is written, or the chief's last phase failed): every ps
 * task stops, so that the job's allocation ends.  A ps that does not
 * answer is only logged.  @failed: what failed, or NULL. */
static void shutdown_ps(job *j, const char *failed) {
  int n = ps_client_num_ps(j->client), ok = 0;
  for (int t = 0; t < n; t++) {
    ps_status e;
    if (ps_client_shutdown(j->client, t,
                           failed ? "the chief's job failed" : "the chief's job is done",
                           &e) == 0)
      ok++;
    else
      PS_WARN("ps/%d (%s) did not take the shutdown: %s", t,
              ps_client_address(j->client, t), e.msg);
  }
  if (failed)
    PS_WARN("job failed (%s): %d of %d ps task(s) shutting down all the same, so the "
            "allocation ends (--keep-ps keeps them)",
            failed, ok, n);
  else
    PS_INFO("job done: %d of %d ps task(s) shutting down (--keep-ps keeps them)", ok, n);
}

/* The chief's last phase: wait for the others, the final save, the test
 * metric.  @failed is set to what failed when it returns -1. */
static int finish_chief(job *j, const char **failed, ps_status *st) {
  const options *o = &j->o;
  *failed = "reading global_step";
  /* (also when this chief took no step: a job restored at --steps or past
   * it.  The others, still waiting for readiness, join, find it done and
   * report so; shut down under them, they would wait for ps that are gone) */
  if (j->client && j->watch)
    wait_workers_done(&j->m, j->s, j->hbc, j->watch, DONE_IDLE_SECS,
                      o->keep_ps ? 0 : 60.0);
  if ((j->gs = ps_worker_read_step_(&j->m, j->s, st)) < 0) return -1;
  bool saving = o->ckpt_dir || o->save_every_steps || o->save_every_secs > 0;
  /* With other workers, a periodic save at this very step may still have
   * missed a step's update on another ps (a step's updates go to every ps
   * at once, the global step's too): now that they are done, save again. */
  if (j->client && saving && o->final_save && j->trained &&
      (j->saved_step != j->gs || j->num_workers > 1)) {
    char *path = NULL;
    /* named by the step it holds: another worker may step until the save's
     * snapshot (stopped by a signal, they all are at once) */
    if (ps_saver_save_at_step(j->saver, j->s, "model.ckpt", j->m.step, o->ckpt_dir, &path,
                              &j->gs, st) != 0) {
      *failed = "the final save failed";
      ps_status_prefix(st, "final save of model.ckpt at global step %lld",
                       (long long)j->gs);
      return -1;
    }
    printf("checkpoint %s\n", path);
    free(path);
  }
  double metric;
  if (ps_worker_evaluate_(&j->m, j->s, &j->test, &metric, st)) {
    *failed = "the evaluation failed";
    return -1;
  }
  const char *what = j->m.classifier ? "accuracy" : "mse";
  PS_INFO("global step %lld: test %s %.4f", (long long)j->gs, what, metric);
  printf("global step %lld\ntest %s %.4f\n", (long long)j->gs, what, metric);
  if (j->m.prob) {
    ctr_report r;
    if (ps_worker_ctr_report_(&j->m, j->s, &j->test, j->truth, &r, st)) {
      *failed = "the evaluation failed";
      return -1;
    }
    PS_INFO("test auc %.4f, log loss %.4f", r.auc, r.logloss);
    printf("test auc %.4f\ntest logloss %.4f\n", r.auc, r.logloss);
    if (j->truth) {
      PS_INFO("best achievable (the log's own probabilities): auc %.4f, log loss %.4f",
              r.best_auc, r.best_logloss);
      printf("best auc %.4f\nbest logloss %.4f\n", r.best_auc, r.best_logloss);
    }
  }
  fflush(stdout);
  return 0;
}

/* The end of the job: workers report done; the chief waits for them,
 * saves a final checkpoint, evaluates on the test set and shuts the ps
 * down (unless --keep-ps or a signal stopped it), also when the save or
 * the evaluation failed: the job is over either way, and ps left running
 * would hold the allocation until its time limit. */
int ps_worker_finish_(job *j, ps_status *st) {
  const options *o = &j->o;
  if (!j->chief) {
    ps_coordinator_heartbeat *hb = j->hb;
    j->hb = NULL;
    if (ps_coordinator_heartbeat_stop(hb, true, st) == 0) return 0;
    /* ps/0 busy or away for a moment: tried again every second for as
     * long as the chief would still wait for a beat, unless a signal
     * stops this worker */
    char me[PS_CLUSTER_MAX_JOB_NAME + 16];
    snprintf(me, sizeof me, "%s/%d", j->self.job, j->self.task);
    double t0 = ps_worker_now_secs_();
    int tries = 1;
    while ((st->code == PS_DEADLINE_EXCEEDED || st->code == PS_UNAVAILABLE) &&
           !atomic_load(&ps_worker_stop_requested_) &&
           ps_worker_now_secs_() - t0 + PS_COORDINATOR_HEARTBEAT_SECS <
               PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS) {
      nanosleep(&(struct timespec){(time_t)PS_COORDINATOR_HEARTBEAT_SECS, 0}, NULL);
      tries++;
      if (ps_coordinator_heartbeat_mark_done(j->hbc, me, st) == 0) return 0;
    }
    size_t ml = strlen(st->msg);
    if (tries > 1 && ml < sizeof st->msg)
      snprintf(st->msg + ml, sizeof st->msg - ml, " (%d tries in %.0f s)", tries,
               ps_worker_now_secs_() - t0);
    if (atomic_load(&ps_worker_stop_requested_)) {
      /* stopped by a signal: the mark is best effort (the chief, stopped
       * too, does not wait; one that does finds the heartbeat standing) */
      PS_WARN("%s", st->msg);
      return 0;
    }
    if (j->gs >= o->steps &&
        (st->code == PS_DEADLINE_EXCEEDED || st->code == PS_UNAVAILABLE)) {
      /* the job is done: a chief still waiting takes the silent heartbeat
       * for a worker that ended; one that ended shut ps/0 down */
      PS_WARN("%s: ending all the same, global step %lld holds --steps %lld", st->msg,
              (long long)j->gs, (long long)o->steps);
      return 0;
    }
    return -1;
  }
  const char *failed = NULL;
  int rc = finish_chief(j, &failed, st);
  if (j->client && !o->keep_ps && !atomic_load(&ps_worker_stop_requested_)) {
    ps_status de;
    /* a worker still waiting for readiness sees it and ends with 0 */
    if (rc == 0 && ps_coordinator_mark_done(j->client, &de) != 0) PS_WARN("%s", de.msg);
    shutdown_ps(j, rc ? failed : NULL);
  } else if (j->client && o->keep_ps && j->num_workers > 1)
    clear_heartbeats(j->hbc, j->cluster, &j->self);
  return rc;
}

/* The global step of the latest checkpoint of --checkpoint-dir (-1: none
 * or unreadable); *@latest its prefix (malloc'd, may be NULL). */
static int64_t latest_step(job *j, char **latest) {
  ps_status e;
  int64_t step = -1;
  *latest = NULL;
  if (j->o.ckpt_dir && j->m.step &&
      ps_latest_checkpoint(j->o.ckpt_dir, latest, &e) == 0 && *latest) {
    ps_bundle_reader *r = ps_bundle_reader_open(*latest, &e);
    if (r && ps_bundle_reader_read_into(r, ps_variable_name(j->m.step), &step,
                                        sizeof step, &e) != 0)
      step = -1;
    ps_bundle_reader_close(r);
  }
  return step;
}

bool ps_worker_ckpt_done_(job *j) {
  char *latest = NULL;
  bool done = latest_step(j, &latest) >= j->o.steps;
  free(latest);
  return done;
}

/* A non-chief worker that could not go on (its start-up or a recovery
 * ended): is the job already done?  The chief marked it done on ps/0
 * (PS_COORDINATOR_DONE_MSG), or the ps are gone (UNAVAILABLE) and the
 * latest checkpoint of --checkpoint-dir holds --steps. */
bool ps_worker_found_job_done_(job *j, const ps_status *st) {
  if (j->chief || j->evaluator || j->m.step == NULL) return false;
  if (ps_coordinator_job_done(st)) {
    PS_INFO("%s (--steps %lld)", st->msg, (long long)j->o.steps);
    return true;
  }
  if (st->code != PS_UNAVAILABLE || j->o.ckpt_dir == NULL) return false;
  char *latest = NULL;
  int64_t step = latest_step(j, &latest);
  bool done = step >= j->o.steps;
  if (done)
    PS_INFO("the ps went away (%s), and the latest checkpoint %s holds global step %lld "
            "of --steps %lld: the job is done",
            st->msg, latest, (long long)step, (long long)j->o.steps);
  free(latest);
  return done;
}

/* Whether a restart of the chief may get past @e: the ps did not answer
 * in time or went away (a restarted chief, e.g. under Kubernetes'
 * restartPolicy, finds them back with their state), or a signal stopped
 * it.  Anything else (a --restore path that does not exist, a checkpoint
 * or graph that does not fit, bad data) fails the same way again. */
static bool restart_may_fix(const ps_status *e) {
  return e->code == PS_UNAVAILABLE || e->code == PS_DEADLINE_EXCEEDED ||
         e->code == PS_ABORTED || e->code == PS_CANCELLED;
}

/* The chief failed before its last phase (set-up or training, @phase):
 * when a restart cannot fix it, the job is over, so the ps are shut down
 * as at the end of a job (unless --keep-ps or a signal), and the job's
 * allocation ends; on a transient failure they are left running for the
 * chief's restart, which finds them live. */
void ps_worker_chief_failed_(job *j, const char *phase, const ps_status *e) {
  if (!j->chief || j->cluster == NULL || j->o.keep_ps ||
      atomic_load(&ps_worker_stop_requested_))
    return;
  if (restart_may_fix(e)) {
    PS_WARN("the ps are left running: a restarted chief may get past this %s failure "
            "(%s) and finds them live",
            phase, ps_status_code_name(e->code));
    return;
  }
  if (j->client == NULL) { /* failed before its client existed (bad data) */
    ps_status ce;
    if (!j->rpc_up) {
      ps_library_init();
      j->rpc_up = true;
      ps_security_admin_token(&j->o.sec, j->cluster);
    }
    if ((j->client = ps_client_create(j->cluster, "ps", &j->o.sec, &ce)) == NULL) {
      PS_WARN("cannot shut the ps down: %s", ce.msg);
      return;
    }
  }
  char why[96];
  snprintf(why, sizeof why, "the %s failed (%s), a restart would fail again", phase,
           ps_status_code_name(e->code));
  shutdown_ps(j, why);
}
