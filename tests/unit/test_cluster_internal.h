/* What test_cluster.c and test_cluster_env.c share: parse helpers, the
 * environment fixture, and the function that adds the second file's tests. */
#ifndef PS_TEST_CLUSTER_INTERNAL_H
#define PS_TEST_CLUSTER_INTERNAL_H

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cluster.h"
#include "testdir.h"
#include "tests/support/assert.h"

void clear_env(void);
void tf_config_fails(const char *json, const char *needle);
extern const char *const tf_ok;
void slurm_env(const char *procid, const char *ntasks, const char *nodelist,
               const char *tpn);
const char *job_addrs(const ps_cluster *c, const char *job);
void cluster_env_tests(TCase *tc);
void cluster_repl_tests(TCase *tc); /* test_cluster_repl.c */

#endif
