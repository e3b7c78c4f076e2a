/* How ps-launch stops: the signal to a task's process group, SIGINT,
 * SIGTERM and SIGHUP, the grace period before SIGKILL, a failure that ends
 * the job, and the end of the loop once every task has ended. */
#include <signal.h>
#include <stdio.h>

#include "common/log.h"
#include "launch_internal.h"

/* Signals the task's process group while its leader is not reaped (after
 * that the group id may belong to someone else). */
static void task_signal(task *t, int signum) {
  run *r = t->cur;
  if (r == NULL || r->exited) return;
  if (kill(-r->proc.pid, signum) != 0) kill(r->proc.pid, signum);
}

static void on_grace(uv_timer_t *h) {
  launcher *L = h->data;
  for (int i = 0; i < L->ntasks; i++) {
    task *t = &L->tasks[i];
    if (t->cur == NULL || t->cur->exited) continue;
    PS_WARN("%s still running %d s after SIGTERM: sending SIGKILL", t->name,
            L->grace_secs);
    task_signal(t, SIGKILL);
  }
}

/* Stops every task: SIGTERM now, SIGKILL after the grace period. */
void ps_launch_begin_stop_(launcher *L) {
  if (L->stopping) return;
  L->stopping = 1;
  uv_timer_stop(&L->ready);
  int running = 0;
  for (int i = 0; i < L->ntasks; i++) {
    task *t = &L->tasks[i];
    if (t->restart_pending) {
      uv_timer_stop(&t->restart_timer);
      t->restart_pending = 0;
    }
    if (t->cur && !t->cur->exited) {
      task_signal(t, SIGTERM);
      running++;
    }
  }
  if (running) {
    PS_INFO("stopping %d task%s (SIGTERM, SIGKILL after %d s)", running,
            running == 1 ? "" : "s", L->grace_secs);
    uv_timer_start(&L->grace, on_grace, (uint64_t)L->grace_secs * 1000, 0);
  }
  ps_launch_maybe_finish_(L);
}

void ps_launch_fail_(launcher *L) {
  ps_launch_set_exit_(L, 1);
  ps_launch_begin_stop_(L);
}

/* When no task runs or waits for a restart, close the launcher's own
 * handles so that uv_run returns. */
void ps_launch_maybe_finish_(launcher *L) {
  if (L->closing) return;
  for (int i = 0; i < L->ntasks; i++)
    if (L->tasks[i].cur || L->tasks[i].restart_pending) return;
  L->closing = 1;
  uv_close((uv_handle_t *)&L->sigint, NULL);
  uv_close((uv_handle_t *)&L->sigterm, NULL);
  uv_close((uv_handle_t *)&L->sighup, NULL);
  uv_close((uv_handle_t *)&L->grace, NULL);
  uv_close((uv_handle_t *)&L->ready, NULL);
  for (int i = 0; i < L->ntasks; i++)
    uv_close((uv_handle_t *)&L->tasks[i].restart_timer, NULL);
}

void ps_launch_on_signal_(uv_signal_t *h, int signum) {
  launcher *L = h->data;
  const char *name = signum == SIGINT    ? "SIGINT"
                     : signum == SIGTERM ? "SIGTERM"
                                         : "SIGHUP";
  if (L->stopping) {
    PS_WARN("received %s while stopping: killing every task", name);
    for (int i = 0; i < L->ntasks; i++)
      task_signal(&L->tasks[i], SIGKILL);
    ps_launch_set_exit_(L, 128 + signum);
    return;
  }
  PS_INFO("received %s: stopping every task", name);
  ps_launch_set_exit_(L, 128 + signum);
  ps_launch_begin_stop_(L);
}
