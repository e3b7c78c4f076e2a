/* ps-launch: starts every task of a cluster on this machine, copies their
 * output with a task prefix, and stops them together.
 *
 * Everything runs on one libuv loop: uv_spawn for the children, a pipe for
 * each child's stdout and stderr, signal handles for SIGINT/SIGTERM/SIGHUP and
 * timers for readiness, grace and restart backoff.  A single thread means
 * no locks, and output lines from different children can never interleave
 * inside a line: each complete line is written with one write(2).
 *
 * Bring-up follows deploy/local-cluster.sh: the ps tasks start first; each
 * prints one readiness line whose last word is its real address, which is
 * how a spec with port 0 ("--ps N", or a spec file that says 127.0.0.1:0)
 * learns the ports the kernel picked.  Once every ps is ready the effective
 * spec is written and the worker command starts once per non-ps task with
 * "--cluster SPEC --job JOB --task I" appended.
 *
 * Each child runs in its own session and process group
 * (UV_PROCESS_DETACHED), so a terminal's Ctrl-C or hang-up reaches only
 * ps-launch, which then stops the tasks in an orderly way, and a SIGTERM to
 * the group reaches what a worker script started too.  The price: a
 * SIGKILL to ps-launch itself leaves its children running.
 * A process's exit is handled only once its pipes are drained (or after a
 * short drain period, in case a grandchild holds them open), so a task's
 * last lines come before the launcher's message about its exit.
 *
 * A ps restarted with --restart keeps its address: it restarts with the
 * effective spec, which names the port it first got.  Only the chief's exit
 * or a ps's failure ends the job: a non-chief worker that fails is logged
 * and asynchronous training goes on without it (--restart-workers starts
 * it again, and it joins the running job), since the chief's end-of-job
 * wait sees it gone.  When every step waits for every worker (synchronous
 * replicas aggregating all of them) the user says so with --sync-workers:
 * then a failed worker stops the job unless it is restarted.  ps-launch
 * does not guess it from the worker command: a wrapper script hides its
 * flags, and --sync with --replicas-to-aggregate below the worker count
 * does not wait for every worker.
 *
 * This file is main; launch_internal.h lists the files of the rest. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "launch_internal.h"

/* The event loop: every ps task is started, the workers follow when the
 * ps tasks are ready (on_ready...), until every task has ended.  Returns
 * the launch's exit status. */
static int run_tasks(launcher *L) {
  signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill us; children
                               get default dispositions from uv_spawn */
  if (uv_loop_init(&L->loop) != 0) return 1;
  uv_signal_init(&L->loop, &L->sigint);
  uv_signal_init(&L->loop, &L->sigterm);
  uv_signal_init(&L->loop, &L->sighup);
  uv_timer_init(&L->loop, &L->grace);
  uv_timer_init(&L->loop, &L->ready);
  L->sigint.data = L->sigterm.data = L->sighup.data = L->grace.data = L->ready.data = L;
  if (ps_launch_make_tasks_(L) != 0) {
    PS_ERROR("out of memory");
    ps_launch_maybe_finish_(L);
    uv_run(&L->loop, UV_RUN_DEFAULT);
    uv_loop_close(&L->loop);
    return 1;
  }
  uv_signal_start(&L->sigint, ps_launch_on_signal_, SIGINT);
  uv_signal_start(&L->sigterm, ps_launch_on_signal_, SIGTERM);
  /* The children have no terminal (own sessions): a hang-up must stop them
   * through us. */
  uv_signal_start(&L->sighup, ps_launch_on_signal_, SIGHUP);
  PS_DEBUG("ps-server: %s", L->ps_server);
  uv_timer_start(&L->ready, ps_launch_on_ready_timeout_, (uint64_t)L->ready_secs * 1000,
                 0);
  for (int i = 0; i < L->ntasks && !L->stopping; i++) {
    if (!L->tasks[i].is_ps) continue;
    if (ps_launch_task_spawn_(&L->tasks[i]) != 0) {
      PS_ERROR("%s could not start: stopping every task", L->tasks[i].name);
      ps_launch_fail_(L);
    }
  }
  ps_launch_maybe_finish_(L);
  uv_run(&L->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&L->loop) != 0) PS_WARN("event loop still busy at exit");
  ps_launch_etcd_stop_(L); /* last: every task has ended */
  if (L->exit_code != 0) PS_INFO("exit status %d", L->exit_code);
  return L->exit_code;
}

static void launcher_free(launcher *L) {
  ps_launch_etcd_stop_(L);
  ps_launch_cleanup_files_(L);
  for (int i = 0; i < L->ntasks; i++)
    free(L->tasks[i].addr);
  free(L->tasks);
  ps_cluster_destroy(L->spec);
  free(L->ps_server);
  free(L->spec_path);
  free(L->eff_path);
  free(L->tmpdir);
  free(L->ps_args);
  for (int i = 0; i < SEC_NFILES; i++)
    free(L->sec_paths[i]);
}

int main(int argc, char **argv) {
  static launcher launch; /* big read buffer: not on the stack */
  launcher *L = &launch;
  int nps = -1, nworkers = -1, rc;
  L->max_restarts = 3;
  L->grace_secs = 10;
  L->ready_secs = 60;
  L->etcd_bin = "etcd";
  L->etcd_heartbeat_ms = 10;
  L->etcd_election_ms = 100;
  ps_log_set_task("launch");
  L->ps_args = calloc((size_t)argc + 8, sizeof *L->ps_args); /* + secure_setup's */
  if (L->ps_args == NULL) return 1;
  if ((rc = ps_launch_parse_options_(L, argc, argv, &nps, &nworkers)) >= 0 ||
      (rc = ps_launch_load_spec_(L, nps, nworkers)) != 0 ||
      (rc = ps_launch_secure_setup_(L)) != 0)
    goto out;
  rc = 2;
  L->ps_server = ps_launch_find_ps_server_(L->ps_server_opt);
  if (L->ps_server == NULL) {
    if (L->ps_server_opt)
      fprintf(stderr, "ps-launch: --ps-server %s: not an executable file\n",
              L->ps_server_opt);
    else
      fprintf(stderr, "ps-launch: cannot find ps-server beside ps-launch or on PATH; "
                      "pass --ps-server PATH\n");
    goto out;
  }
  if ((rc = ps_launch_replication_setup_(L)) != 0) goto out;
  if (L->spec_path == NULL) {
    ps_status st;
    ps_status_clear(&st);
    rc = 1;
    if (ps_launch_tmpdir_get_(L) != 0) goto out;
    L->spec_path = ps_launch_path_join_(L->tmpdir, "boot.json");
    if (ps_cluster_write_file(L->spec, L->spec_path, &st) != 0) {
      PS_ERROR("%s", st.msg);
      goto out;
    }
  }
  rc = run_tasks(L);
out:
  launcher_free(L);
  return rc;
}
