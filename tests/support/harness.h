/* Test harness: starts real ps-server processes on 127.0.0.1 with ports the
 * kernel picks, learns their addresses from the readiness line, writes the
 * real cluster spec, and stops them.
 *
 * Nothing outlives a test, however it ends (a failed ck_assert, which in
 * Check's fork mode is _exit(1) without the checked teardown; a crash; a
 * timeout's SIGKILL):
 *  - every child is forked with PR_SET_PDEATHSIG(SIGKILL), so it dies with
 *    the thread that started it: call harness_start() (and harness_spawn())
 *    from the test's own thread, not from a thread that ends before it;
 *  - harness_start() also starts a guardian (a small sh in its own session,
 *    so a kill of the test's process group spares it) that holds the read
 *    end of a pipe only the test process writes to.  When the test process
 *    is gone without harness_stop(), the pipe reads EOF: the guardian kills
 *    what is left of the children and removes the scratch directory. */
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
  pid_t guardian;      /* cleans up if the test dies (see above) */
  int guard_fd;        /* write end of the guardian's pipe (-1: none) */
} ps_harness;

/* How harness_start_opts starts the ps tasks (a zeroed struct: as
 * harness_start does). */
typedef struct harness_opts {
  /* The tasks' stderr goes to this file, emptied first (the tests that read
   * a ps's log); NULL: the test's own stderr. */
  const char *stderr_path;
  /* "NAME=VALUE" added to the tasks' environment, or NULL. */
  const char *env;
  /* RLIMIT_NOFILE of the tasks: > 0 sets the soft and hard limit to it,
   * < 0 only the soft limit, to -nofile; 0 leaves it as the test's. */
  long nofile;
  /* The tasks' spec names ports picked free (bind to 0, read, close)
   * instead of port 0: replicated tasks (--replicas) reach each other at
   * the spec's addresses. */
  int fixed_ports;
} harness_opts;

/* Starts @nps ps tasks (plus one worker address in the spec).  Extra
 * arguments for ps-server may be given in @extra (NULL-terminated, may be
 * NULL).  Returns 0, or -1 after printing why. */
int harness_start(ps_harness *h, int nps, const char *const *extra);
/* harness_start with the options @o (may be NULL). */
int harness_start_opts(ps_harness *h, int nps, const char *const *extra,
                       const harness_opts *o);
/* harness_start, then gRPC and a client of its ps tasks (NULL after
 * printing why).  harness_stop_client() undoes all three and returns what
 * harness_stop() returns. */
struct ps_client *harness_start_client(ps_harness *h, int nps, const char *const *extra);
int harness_stop_client(ps_harness *h, struct ps_client *c);
/* SIGTERM to each live task, waits; returns 0 if every one exited 0. */
int harness_stop(ps_harness *h);
/* Forks and execs @argv (argv[0] is the program) the way harness_start
 * starts a ps: PR_SET_PDEATHSIG(SIGKILL), known to the guardian.  If
 * @stdout_fd is not NULL, the child's stdout is a pipe whose read end is
 * returned there.  Returns the pid, or -1 after printing why.  The caller
 * waits for the child (or puts it in h->pids[] for harness_stop). */
pid_t harness_spawn(ps_harness *h, const char *const *argv, int *stdout_fd);
/* SIGKILL one task. */
void harness_kill(ps_harness *h, int task);
/* Path of a built program from the environment (PS_SERVER, PSCTL...). */
const char *harness_prog(const char *env, const char *fallback);
/* Runs a shell command, captures stdout+stderr into a malloc'd string;
 * returns the exit status. */
int harness_run(const char *cmd, char **out);

/* Scratch directories for tests that write files: one base directory per
 * test case ("/tmp/ps-TAG-XXXXXX"), made and removed by an unchecked
 * fixture (its teardown runs in Check's parent process, so a failing test
 * leaves nothing behind), and one directory per test inside it.  Each
 * aborts / returns -1 on failure. */
void harness_scratch_base(char *base, size_t n, const char *tag);
int harness_scratch_dir(char *dir, size_t n, const char *base);
int harness_scratch_remove(const char *path);
/* Resident set and its peak of a process, in bytes (from /proc). */
long long harness_rss(pid_t pid, long long *peak);

/* etcd for the tests (Debian's etcd-server: the program `etcd`, or $ETCD).
 * ps_harness_etcd_start starts @members (1 or 3) members of a new cluster
 * on 127.0.0.1 with fast raft timings (heartbeat 10 ms, election 100 ms:
 * the shortest lease TTL is then 1 s), each with its own data directory in
 * a fresh scratch directory and its log in DIR/mN.log.  Ports are picked
 * free (bind to 0, read, close) and passed to etcd; if one was taken in
 * between, etcd says "address already in use" and the cluster is started
 * again on new ports (5 tries).  Ready when every member's /health says
 * {"health":"true"} (15 s at most).  Members are forked as harness_spawn
 * does (PR_SET_PDEATHSIG, a guardian): nothing outlives the test.
 * Returns 0, or -1 after printing why (then nothing is left running).
 * Call from the test's own thread. */
#define HARNESS_ETCD_MAX 3
typedef struct ps_harness_etcd {
  int n;
  pid_t pids[HARNESS_ETCD_MAX]; /* 0: not running */
  int client_port[HARNESS_ETCD_MAX], peer_port[HARNESS_ETCD_MAX];
  char client[HARNESS_ETCD_MAX][32];     /* "127.0.0.1:PORT" */
  char endpoints[HARNESS_ETCD_MAX * 32]; /* the clients, comma-separated */
  ps_harness h;                          /* scratch dir, guardian */
  char cluster[HARNESS_ETCD_MAX * 64];   /* --initial-cluster */
} ps_harness_etcd;
int ps_harness_etcd_start(ps_harness_etcd *e, int members);
/* SIGKILL member @m and wait for it (its data stays). */
void ps_harness_etcd_kill(ps_harness_etcd *e, int m);
/* Starts member @m again, same ports and data; waits until it is healthy.
 * 0, or -1 after printing why. */
int ps_harness_etcd_restart(ps_harness_etcd *e, int m);
/* Waits until member @m's /health says true (@timeout_ms at most): 0 or -1. */
int ps_harness_etcd_wait_healthy(ps_harness_etcd *e, int m, int timeout_ms);
/* SIGTERM every member, waits (SIGKILL after 10 s), removes the scratch
 * directory.  Returns 0 if every member stopped on SIGTERM.  A zeroed or
 * already stopped struct is a no-op. */
int ps_harness_etcd_stop(ps_harness_etcd *e);

#endif
