/* Test harness: starts real ps-server processes on 127.0.0.1 with ports the
 * kernel picks, learns their addresses from the readiness line, writes the
 * real cluster spec, and stops them. */
#ifndef PS_TEST_HARNESS_H
#define PS_TEST_HARNESS_H

#include <sys/types.h>

#include "common/cluster.h"

#define HARNESS_MAX_PS 8

typedef struct ps_harness {
  int nps;
  pid_t pids[HARNESS_MAX_PS];
  char addrs[HARNESS_MAX_PS][64];
  char dir[256];       /* scratch directory, removed by harness_stop */
  char spec[300];      /* the real cluster spec file */
  ps_cluster *cluster; /* parsed real spec */
} ps_harness;

/* Starts @nps ps tasks (plus one worker address in the spec).  Extra
 * arguments for ps-server may be given in @extra (NULL-terminated, may be
 * NULL).  Returns 0, or -1 after printing why. */
int harness_start(ps_harness *h, int nps, const char *const *extra);
/* harness_start, then gRPC and a client of its ps tasks (NULL after
 * printing why).  harness_stop_client() undoes all three and returns what
 * harness_stop() returns. */
struct ps_client *harness_start_client(ps_harness *h, int nps, const char *const *extra);
int harness_stop_client(ps_harness *h, struct ps_client *c);
/* SIGTERM to each live task, waits; returns 0 if every one exited 0. */
int harness_stop(ps_harness *h);
/* SIGKILL one task. */
void harness_kill(ps_harness *h, int task);
/* Path of a built program from the environment (PS_SERVER, PSCTL...). */
const char *harness_prog(const char *env, const char *fallback);
/* Runs a shell command, captures stdout+stderr into a malloc'd string;
 * returns the exit status. */
int harness_run(const char *cmd, char **out);
/* Resident set and its peak of a process, in bytes (from /proc). */
long long harness_rss(pid_t pid, long long *peak);

#endif
