/* Shared by the cluster spec code (cluster.c: construction, JSON, lookups,
 * output) and its resolvers (cluster_resolve.c: TF_CONFIG, Slurm, which
 * task this process is).  Private to common/. */
#ifndef PS_CLUSTER_INTERNAL_H
#define PS_CLUSTER_INTERNAL_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>

#include "cluster.h"

/* Prefix of every message: "cluster spec /tmp/c.json", "TF_CONFIG". */
#define PRE_MAX 600
/* Untrusted text quoted in a message is cut to this. */
#define SHOW_MAX 96
/* Slurm step limits: hosts after expansion, jobs in a jobs spec. */
#define SLURM_MAX_HOSTS 65536
#define SLURM_MAX_JOBS 64

/* addr_check results */
enum { ADDR_OK, ADDR_NOT_HOSTPORT, ADDR_BAD_PORT };

int ps_cl_oom_(const char *pre, ps_status *st);
const char *ps_cl_show_(const char *s, size_t n, char *buf, size_t bn);
bool ps_cl_is_name_(const char *s, size_t n);
long ps_cl_parse_num_(const char *s, size_t n, long max);
char *ps_cl_dup_n_(const char *s, size_t n);
int ps_cl_addr_check_(const char *a, size_t n, int *port);
int ps_cl_addr_error_(int why, const char *a, size_t n, const char *pre, const char *job,
                      int task, ps_status *st);
ps_cluster *ps_cl_cluster_new_(int njobs);
int ps_cl_job_alloc_(ps_cluster_job *j, const char *name, size_t namelen, int ntasks);
int ps_cl_cluster_finish_(ps_cluster *c, const char *pre, ps_status *st);
json_object *ps_cl_json_parse_(const char *text, size_t len, const char *pre,
                               ps_status *st);
ps_cluster *ps_cl_cluster_from_json_(json_object *top, const char *what, const char *pre,
                                     ps_status *st);
/* An "evaluator" task of a spec without an evaluator job: TensorFlow's
 * usual layout, where the evaluator reads checkpoints and is no part of
 * the cluster. */
bool ps_cl_evaluator_outside_(const ps_cluster *c, const char *job);
bool ps_cl_task_present_(const ps_cluster *c, const char *job, int task, char *why,
                         size_t n);
void ps_cl_task_id_set_(ps_task_id *id, const char *job, int task);

#endif
