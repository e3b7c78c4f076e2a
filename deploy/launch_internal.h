/* Shared by the files of ps-launch (deploy/launch*.c), each a layer over
 * the ones before it, none calling back:
 *   launch_util.c   small helpers
 *   launch_spec.c   --help, the options, the cluster spec and its tasks
 *   launch_etcd.c   --replicas: the spec's replication section, the local
 *                   etcd
 *   launch_stop.c   stopping the tasks, the end of the loop
 *   launch_tasks.c  the tasks' processes, output, exits, restarts and the
 *                   ps bring-up
 *   launch.c        main and the event loop
 * Private to deploy/. */
#ifndef PS_LAUNCH_INTERNAL_H
#define PS_LAUNCH_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/cluster.h"
#include "common/status.h"

/* --secure DIR: the files deploy/gen-certs.sh --tokens writes there. */
enum {
  SEC_CA,
  SEC_CERT,
  SEC_KEY,
  SEC_TOKENS,
  SEC_ADMIN_CERT,
  SEC_ADMIN_KEY,
  SEC_ADMIN_TOKEN,
  SEC_WORKER_CERT,
  SEC_WORKER_KEY,
  SEC_WORKER_TOKEN,
  SEC_NFILES
};

typedef struct launcher launcher;
typedef struct task task;

/* Text not yet ending in a newline, after the task's prefix. */
typedef struct linebuf {
  char *buf; /* prefix, then pending bytes */
  size_t len, cap, prefix_len;
  int fd; /* where lines go: 1 or 2 */
} linebuf;

/* One process of a task.  Freed when all four of its handles are closed,
 * which may be after the task has moved on to a new run. */
typedef struct run {
  task *t;
  uv_process_t proc;
  uv_pipe_t pipe[2]; /* the child's stdout, stderr */
  uv_timer_t drain;
  linebuf lb[2];
  int open_handles;
  int pipes_open;
  int exited;   /* exit callback seen: the pid is reaped */
  int finished; /* run_finish done */
  int ready;    /* ps: readiness line seen */
  int64_t status;
  int signum;
} run;

struct task {
  launcher *L;
  char job[PS_CLUSTER_MAX_JOB_NAME + 1];
  int index;
  char name[PS_CLUSTER_MAX_JOB_NAME + 16]; /* "ps/0" */
  int is_ps, is_chief;
  run *cur;   /* the running process, NULL if none */
  char *addr; /* ps: address from its first readiness line */
  int restarts;
  int restart_pending;
  uv_timer_t restart_timer;
};

struct launcher {
  uv_loop_t loop;
  uv_signal_t sigint, sigterm, sighup;
  uv_timer_t grace, ready;
  /* options */
  const char *cluster_file, *write_cluster, *ps_server_opt;
  char *ps_server;
  const char **ps_args;
  int nps_args;
  const char *secure_dir;
  char *sec_paths[SEC_NFILES]; /* --secure: DIR/<sec_files[i]> */
  char **cmd;
  int ncmd;
  int restart, restart_workers, max_restarts, grace_secs, ready_secs;
  int sync; /* --sync-workers: a missing worker stalls the job */
  /* --replicas and the local etcd (launch_etcd.c) */
  int replicas, lease_ttl, replicated;
  const char *etcd_opt, *repl_job, *etcd_bin;
  int etcd_heartbeat_ms, etcd_election_ms;
  int etcd_pid; /* the local etcd, 0 if none */
  char etcd_endpoint[32];
  char *etcd_data, *etcd_log;
  /* cluster */
  ps_cluster *spec;
  char *spec_path; /* what the ps tasks start with */
  char *eff_path;  /* what workers and restarted ps tasks get */
  char *tmpdir;
  task *tasks;
  int ntasks, nps, nready;
  /* state */
  int workers_started, stopping, closing;
  int exit_set, exit_code;
  char readbuf[64 * 1024];
};

/* launch_util.c */
void *ps_launch_xcheck_(void *p);
char *ps_launch_xstrdup_(const char *s);
char *ps_launch_path_join_(const char *dir, const char *name);
void ps_launch_describe_(char *buf, size_t n, int64_t status, int signum);
void ps_launch_write_all_(int fd, const char *p, size_t n);
int ps_launch_parse_int_(const char *flag, const char *s, int min, int max, int *out);
void ps_launch_set_exit_(launcher *L, int code);
int ps_launch_tmpdir_get_(launcher *L);

/* launch_spec.c */
int ps_launch_secure_setup_(launcher *L);
char *ps_launch_find_ps_server_(const char *opt);
int ps_launch_make_tasks_(launcher *L);
void ps_launch_cleanup_files_(launcher *L);
int ps_launch_parse_options_(launcher *L, int argc, char **argv, int *nps, int *nworkers);
int ps_launch_load_spec_(launcher *L, int nps, int nworkers);

/* launch_etcd.c */
int ps_launch_replication_setup_(launcher *L);
void ps_launch_etcd_stop_(launcher *L);

/* launch_stop.c */
void ps_launch_begin_stop_(launcher *L);
void ps_launch_fail_(launcher *L);
void ps_launch_maybe_finish_(launcher *L);
void ps_launch_on_signal_(uv_signal_t *h, int signum);

/* launch_tasks.c */
int ps_launch_task_spawn_(task *t);
void ps_launch_on_ready_timeout_(uv_timer_t *h);

#endif
