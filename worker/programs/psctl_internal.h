/* psctl's files: psctl.c (the command line, the commands of one ps task
 * each) and psctl_repl.c (replicated shards: status of the shards,
 * verify).  Private to worker/programs/. */
#ifndef PSCTL_INTERNAL_H
#define PSCTL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "paramserver/client.h"

/* The command line, once parsed. */
typedef struct psctl_args {
  const char *cluster_file, *job;
  int64_t timeout_ms, limit;
  int64_t rpc_timeout_ms; /* --rpc-timeout (0: not given) */
  int max_to_keep;
  bool all_values;
  ps_restore_options restore; /* restore --create, --only-missing, --task N */
  ps_client_options sec;      /* the security flags' part */
  const char *cmd;
  char **rest; /* the command's arguments */
  int nrest;
  const ps_cluster *cluster; /* once loaded */
} psctl_args;

/* psctl.c */
void psctl_task_error(const psctl_args *a, int task, const ps_status *st);

/* psctl_repl.c: status's lines per shard (replicated clusters), and
 * verify; 0, or 1 after printing what failed or differs. */
int psctl_status_shards(const psctl_args *a, ps_client *c, ps_status *st);
int psctl_verify(const psctl_args *a, ps_client *c, ps_status *st);

#endif
