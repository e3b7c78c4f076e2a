/* libpsworker: the cluster spec, which job/task lives at which host:port.
 *
 * Sources, in the shapes TensorFlow 1.x uses:
 *   - a JSON file in tf.train.ClusterSpec's shape
 *       {"ps": ["h1:2222", "h2:2222"], "worker": {"0": "h3:2222", "2": ...}}
 *     (each job a list, task i = position, or a sparse object of index ->
 *     address; a missing index is a hole);
 *   - the TF_CONFIG environment variable ({"cluster": {...}, "task":
 *     {"type": "worker", "index": 1}}), as Estimator's RunConfig reads it;
 *   - a Slurm job step, as TF's SlurmClusterResolver derives it.
 *
 * A ps_cluster is immutable after construction except through
 * ps_cluster_set_address(); reading it from several threads is safe,
 * changing it while others read is not.  Pointers returned by the lookup
 * functions are borrowed from the cluster and live until it is destroyed
 * (or, for an address, until that address is replaced). */
#ifndef PARAMSERVER_CLUSTER_H
#define PARAMSERVER_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "paramserver/api.h"
#include "paramserver/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest job name: ps_task_id.job and ps_device.job hold it. */
#define PS_CLUSTER_MAX_JOB_NAME 63

typedef struct ps_cluster_job {
  char *name;   /* [A-Za-z0-9_]+, at most PS_CLUSTER_MAX_JOB_NAME chars */
  int ntasks;   /* max index + 1, >= 1 */
  char **addrs; /* ntasks entries; addrs[i] NULL for a hole (sparse form) */
} ps_cluster_job;

/* A spec's optional "security" section (common/SECURITY.md): paths of the
 * files each program uses when neither its flag nor its environment
 * variable names one; NULL when absent.  The ps side: server_cert,
 * server_key, client_ca, auth_token_file, require_auth.  The clients: ca,
 * client_cert, client_key, token_file (workers), admin_token_file (the
 * chief and psctl). */
typedef struct ps_cluster_security {
  char *ca, *client_cert, *client_key, *token_file, *admin_token_file;
  char *server_cert, *server_key, *client_ca, *auth_token_file;
  int require_auth; /* 1: "require_auth": true */
} ps_cluster_security;

/* A spec's optional "replication" section (replicated ps shards, DESIGN.md
 * "Replication"): {"replicas": 2, "etcd": "h1:2379,h2:2379", "job": "mnist",
 * "lease_ttl": 2}.  Every key is optional: one the spec leaves out is 0
 * (NULL for a string).  The ps-server flags --replicas, --etcd, --job and
 * --lease-ttl win over it. */
typedef struct ps_cluster_replication {
  int replicas;        /* 1..3: copies of each shard (1: unreplicated) */
  char *etcd;          /* etcd endpoints "HOST:PORT[,HOST:PORT...]", at most 16 */
  char *job;           /* etcd keys under /paramserver/JOB/: [A-Za-z0-9_.-]{1,100} */
  int64_t lease_ttl_s; /* 1..3600: a ps is declared gone this long after it stops */
} ps_cluster_replication;

typedef struct ps_cluster {
  int njobs;                           /* >= 1 */
  ps_cluster_job *jobs;                /* sorted by name, as TF's ClusterDef */
  ps_cluster_security *security;       /* NULL: the spec has no "security" */
  ps_cluster_replication *replication; /* NULL: the spec has no "replication" */
} ps_cluster;

typedef struct ps_task_id {
  char job[64];
  int task;
} ps_task_id;

/* Parses a cluster spec in ClusterSpec's JSON shape (plus the optional
 * "security" and "replication" sections, which are not jobs).  @json need not be
 * NUL-terminated.  @origin names the source in messages, which read
 * "cluster spec <origin>: ..." (a file path; NULL reads "(string)").
 * Checks: valid JSON; an object of job names ([A-Za-z0-9_]+); each job a
 * non-empty list of "host:port" strings or an object {"<index>":
 * "host:port"}; host a name, IPv4 or [IPv6], port 0..65535; no address
 * other than port 0 used by two tasks.  Returns NULL with
 * PS_INVALID_ARGUMENT (PS_RESOURCE_EXHAUSTED if out of memory). */
PS_API ps_cluster *ps_cluster_parse(const char *json, size_t len, const char *origin,
                                    ps_status *st);

/* Reads and parses @path.  A missing file is PS_NOT_FOUND, an unreadable
 * one PS_PERMISSION_DENIED, a bad one PS_INVALID_ARGUMENT. */
PS_API ps_cluster *ps_cluster_load_file(const char *path, ps_status *st);

PS_API void ps_cluster_destroy(ps_cluster *c);

/* NULL if @c has no job @job. */
PS_API const ps_cluster_job *ps_cluster_find_job(const ps_cluster *c, const char *job);
/* max index + 1; 0 if no such job. */
PS_API int ps_cluster_num_tasks(const ps_cluster *c, const char *job);
/* The tasks the spec lists for @job (TensorFlow's num_tasks): in a sparse
 * spec ({"worker": {"1": ...}}) fewer than ps_cluster_num_tasks, which is
 * the highest index + 1. */
PS_API int ps_cluster_num_listed(const ps_cluster *c, const char *job);
/* NULL if no such job or task, or the task is a hole. */
PS_API const char *ps_cluster_address(const ps_cluster *c, const char *job, int task);

/* Replaces (or fills the hole of) job/task's address with a copy of @addr,
 * e.g. once a test learns the port the kernel picked.  PS_NOT_FOUND if the
 * task is outside the job, PS_INVALID_ARGUMENT if @addr is not host:port
 * or is already another task's. */
PS_API int ps_cluster_set_address(ps_cluster *c, const char *job, int task,
                                  const char *addr, ps_status *st);

/* The spec as TF's ClusterSpec.as_dict() prints it: jobs in name order,
 * each a list, or an {"index": address} object if it has holes (so the
 * output always parses back to the same cluster).  malloc'd; the caller
 * frees it.  NULL if out of memory. */
PS_API char *ps_cluster_to_json(const ps_cluster *c);

/* Resolves the cluster and this task's identity, first source that applies:
 *   1. @cluster_file != NULL: load it; @job and @task (>= 0) are required
 *      and must name a task of it;
 *   2. TF_CONFIG set and non-empty in the environment: ps_cluster_from_tf_config;
 *   3. SLURM_PROCID set: ps_cluster_from_slurm with jobs from PS_SLURM_JOBS
 *      (default: all worker) and port base PS_SLURM_PORT_BASE (default
 *      8888, TF's);
 *   4. otherwise PS_INVALID_ARGUMENT "no cluster spec: pass --cluster FILE
 *      --job NAME --task N or set TF_CONFIG".
 * In cases 2 and 3 a non-NULL @job overrides the task identity found there
 * (as TF's resolvers allow), and must name a task of the cluster. */
PS_API ps_cluster *ps_cluster_resolve(const char *cluster_file, const char *job, int task,
                                      ps_task_id *self, ps_status *st);

/* The spec's "replication" section; NULL if it has none (or @c is NULL). */
PS_API const ps_cluster_replication *ps_cluster_get_replication(const ps_cluster *c);

/* The chief: "chief"/0 if that job exists, else "worker"/0.  Returns 0, or
 * PS_NOT_FOUND if neither exists. */
PS_API int ps_cluster_chief(const ps_cluster *c, ps_task_id *chief);

#ifdef __cplusplus
}
#endif

#endif
