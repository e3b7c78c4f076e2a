/* Cluster spec internals: limits, writing a spec file, and the TF_CONFIG
 * and Slurm sources ps_cluster_resolve() reads.  The type and the lookups
 * are public (paramserver/cluster.h). */
#ifndef PS_CLUSTER_H
#define PS_CLUSTER_H

#include <stddef.h>

#include "paramserver/cluster.h"
#include "status.h"

/* Largest number of tasks (max index + 1) one job may have. */
#define PS_CLUSTER_MAX_TASKS 65536
/* Largest cluster spec text accepted (file or string). */
#define PS_CLUSTER_MAX_BYTES (16u << 20)

/* Replication settings (the spec's "replication" section and the
 * ps-server flags alike; view.h's ps_repl_conf holds them). */
#define PS_REPL_DEFAULT_JOB "default"
#define PS_REPL_DEFAULT_LEASE_TTL_S 2
#define PS_REPL_MAX_LEASE_TTL_S 3600
#define PS_REPL_MAX_ENDPOINTS 16
#define PS_REPL_MAX_ETCD_CHARS 1023
#define PS_REPL_MAX_JOB_CHARS 100

/* The checks of the etcd endpoint list ("HOST:PORT[,HOST:PORT...]", at
 * most 16 endpoints and 1023 characters, port 1..65535) and of the job
 * name ([A-Za-z0-9_.-], 1 to 100 characters).  INVALID_ARGUMENT "@name:
 * ..." or "@name \"VALUE\" ..." (e.g. @name "--etcd"). */
int ps_repl_check_etcd(const char *endpoints, const char *name, ps_status *st);
int ps_repl_check_job(const char *job, const char *name, ps_status *st);

/* The settings a job gets from its spec (@c may be NULL): replicas 1,
 * no etcd, job "default", lease TTL 2 s, each replaced by what the
 * "replication" section gives.  Flags then overwrite fields of @out. */
struct ps_repl_conf;
void ps_repl_conf_from_cluster(const ps_cluster *c, struct ps_repl_conf *out);

/* The hosts the placement compares (view.h, ps_view_placement's @hosts):
 * ps/i's address in @c without ":PORT" ("h1" of "h1:2222", "[::1]" of
 * "[::1]:2222"), NULL for a hole.  *@n = ps_cluster_num_tasks(c, "ps")
 * (0: no ps job, *@hosts NULL).  Free with ps_repl_hosts_free. */
int ps_repl_hosts_from_cluster(const ps_cluster *c, char ***hosts, int *n, ps_status *st);
void ps_repl_hosts_free(char **hosts, int n);

/* Writes ps_cluster_to_json() (pretty-printed) to @path atomically: a
 * temporary file in the same directory, fsync, rename. */
int ps_cluster_write_file(const ps_cluster *c, const char *path, ps_status *st);

/* Reads a TF_CONFIG value.  "cluster" and "task" ({"type": J, "index": N})
 * are required, other keys ignored; J/N must be a task of the cluster; a
 * "chief" job must have exactly one task.  Messages start "TF_CONFIG: ".
 * Fills @self (may be NULL) with the task. */
ps_cluster *ps_cluster_from_tf_config(const char *tf_config, ps_task_id *self,
                                      ps_status *st);

/* Builds the cluster of the current Slurm job step as TF's
 * SlurmClusterResolver does: this task's rank from SLURM_PROCID; hosts from
 * SLURM_STEP_NODELIST (hostlist syntax "n[01-03],m5", zero padding kept)
 * paired with SLURM_STEP_TASKS_PER_NODE ("3(x2),2"); hosts sorted by name,
 * host h's k-th task at h:(port_base+k); jobs sorted by name take
 * consecutive ranks.  @jobs_spec "ps:2,worker:2", or NULL for as many
 * "worker" tasks as SLURM_STEP_NUM_TASKS.  A missing variable gives TF's
 * "SLURM_X not found in environment. Not running inside a SLURM step?".
 * Fills @self (may be NULL) with the task owning this rank.  GPU
 * assignment (CUDA_VISIBLE_DEVICES) is not done. */
ps_cluster *ps_cluster_from_slurm(const char *jobs_spec, int port_base, ps_task_id *self,
                                  ps_status *st);

#endif
