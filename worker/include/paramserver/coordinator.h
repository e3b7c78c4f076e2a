/* The coordinator: how a worker joins a cluster (TensorFlow's
 * SessionManager / MonitoredTrainingSession start-up, done right).
 *
 * Chief:  waits for every ps (logging which it still waits for); creates
 *         the graph's variables; if every ps variable already holds a value
 *         (a restarted chief, a live cluster) it touches nothing; else it
 *         restores the uninitialized ones from the latest checkpoint (or a
 *         named one) when there is one, and otherwise initializes only the
 *         uninitialized ones, in dependency order (a variable whose initial
 *         value reads another's initialized_value() waits for it, across ps
 *         too; an already initialized dependency is not re-run).  Last it
 *         writes the ready mark `_coordinator/ready` on ps/0.
 * Others: wait for every ps, then poll with backoff (50 ms doubling to
 *         1 s) until the ready mark is there and none of their variables is
 *         uninitialized (or missing: a restarted ps the chief has not
 *         restored yet); a worker whose graph places a variable on another
 *         ps than the chief did (or with another shape or dtype) is refused
 *         with an error naming the first such variable. */
#ifndef PARAMSERVER_COORDINATOR_H
#define PARAMSERVER_COORDINATOR_H

#include <stdbool.h>

#include "paramserver/api.h"
#include "paramserver/saver.h"
#include "paramserver/session.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PS_COORDINATOR_READY "_coordinator/ready"
/* The chief's "the job is done" mark on ps/0, written just before it
 * shuts the ps down (ps_coordinator_mark_done). */
#define PS_COORDINATOR_DONE "_coordinator/done"
#define PS_COORDINATOR_DONE_MSG "the chief has marked the job done: nothing left to train"
/* A worker waiting for readiness gives up when no ps task has answered
 * for this long (the chief shut them down, or the job failed). */
#define PS_COORDINATOR_GONE_SECS 10.0

typedef struct ps_coordinator_options {
  bool is_chief;
  /* 0: wait forever. */
  double ps_timeout_secs;
  double ready_timeout_secs;
  /* Chief: restore from this prefix (relative to the ps --checkpoint-dir);
   * NULL: the latest checkpoint if there is one. */
  const char *restore_prefix;
  bool no_restore; /* chief: never restore, initialize */
  ps_saver *saver; /* chief: what to restore (NULL: every global variable) */
} ps_coordinator_options;

typedef enum ps_coordinator_outcome {
  PS_COORD_INITIALIZED, /* chief initialized (some) variables */
  PS_COORD_RESTORED,    /* chief restored (some) variables */
  PS_COORD_LIVE,        /* chief found every variable initialized */
  PS_COORD_JOINED,      /* a non-chief worker found the cluster ready */
} ps_coordinator_outcome;

PS_API const char *ps_coordinator_outcome_name(ps_coordinator_outcome o);

/* Stops every wait of the coordinator in this process (for ps, for the
 * chief): they return CANCELLED "stopped while waiting for ...".  Async-
 * signal-safe: call it from a SIGTERM handler.  It cannot be undone. */
PS_API void ps_coordinator_cancel(void);
PS_API bool ps_coordinator_cancelled(void);

/* Polls Status on every ps of the session's client until all answer.  A
 * ps that accepts connections but does not answer for the client's
 * rpc_timeout_ms (stopped, hung: ps_client_stalled) ends the wait with
 * that DEADLINE_EXCEEDED, as does ps/0 while a worker waits for the
 * chief in ps_coordinator_prepare. */
PS_API int ps_coordinator_wait_for_ps(ps_session *s, double timeout_secs, ps_status *st);

/* The whole start-up above; @outcome (may be NULL) says what happened.
 * A non-chief worker waiting for readiness also ends the wait when
 * - ps/0 holds the done mark: OUT_OF_RANGE, PS_COORDINATOR_DONE_MSG
 *   (ps_coordinator_job_done() says so): the job is over, nothing to do;
 * - no ps task has answered for PS_COORDINATOR_GONE_SECS (every ps gone
 *   at once, not one restarting): UNAVAILABLE "every ps task stopped
 *   answering while this worker waited for the chief to mark the cluster
 *   ready (...)". */
PS_API int ps_coordinator_prepare(ps_session *s, const ps_coordinator_options *o,
                                  ps_coordinator_outcome *outcome, ps_status *st);

/* The chief, its job done, marks it so on ps/0 before it shuts the ps
 * down: a worker still waiting for readiness then ends with
 * PS_COORDINATOR_DONE_MSG instead of waiting for ps that are gone. */
PS_API int ps_coordinator_mark_done(ps_client *c, ps_status *st);
PS_API bool ps_coordinator_job_done(const ps_status *st);

/* Worker heartbeats, for the chief's end-of-job wait: it must tell a
 * worker that has not joined yet (wait for it) from one that joined and
 * died (do not).  A non-chief worker that has joined runs a heartbeat: a
 * thread that adds 1 to "_coordinator/heartbeat/<job>/<task>" (int64, on
 * ps/0; created if missing, so a ps/0 that restarted empty gets it back)
 * every PS_COORDINATOR_HEARTBEAT_SECS.  When the worker is done it stops
 * the thread and sets the variable to PS_COORDINATOR_HEARTBEAT_DONE.  The
 * chief reads each other worker's value: DONE is done; 0 (or no variable)
 * never joined; a count that has not moved between reads
 * PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS apart (reads that failed do not
 * count) is a worker that is gone.  The values live on the ps, so a
 * restarted chief sees them too.  Heartbeat calls should carry a short
 * deadline, PS_COORDINATOR_HEARTBEAT_CALL_MS (ps-worker gives them a
 * client of their own), so that stopping a heartbeat and marking it done
 * are bounded when ps/0 does not answer. */
#define PS_COORDINATOR_HEARTBEAT_PREFIX "_coordinator/heartbeat/"
#define PS_COORDINATOR_HEARTBEAT_SECS 1.0
#define PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS 10.0
#define PS_COORDINATOR_HEARTBEAT_CALL_MS 2000
#define PS_COORDINATOR_HEARTBEAT_DONE (-1)

typedef struct ps_coordinator_heartbeat ps_coordinator_heartbeat;

/* Starts the heartbeat of task @task ("worker/1") on ps/0 of @c (borrowed:
 * it must outlive the heartbeat); the first beat is sent before it
 * returns.  NULL on error (@st says why). */
PS_API ps_coordinator_heartbeat *
ps_coordinator_heartbeat_start(ps_client *c, const char *task, ps_status *st);

/* Stops the thread and frees @h (NULL: nothing); @done: then marks the
 * task done.  0, or the error of that mark. */
PS_API int ps_coordinator_heartbeat_stop(ps_coordinator_heartbeat *h, bool done,
                                         ps_status *st);

/* Marks task @task ("worker/1") done on ps/0 of @c, as
 * ps_coordinator_heartbeat_stop does: one try (a caller whose ps/0 is busy
 * or away tries again).  0, or its error. */
PS_API int ps_coordinator_heartbeat_mark_done(ps_client *c, const char *task,
                                              ps_status *st);

/* Task @task's heartbeat value on ps/0 into *@value: a count of beats, 0
 * if none (no variable: it never joined, or ps/0 restarted since), or
 * PS_COORDINATOR_HEARTBEAT_DONE. */
PS_API int ps_coordinator_heartbeat_read(ps_client *c, const char *task, int64_t *value,
                                         ps_status *st);

/* The heartbeats of @n tasks in one Read of ps/0 (per task when one of
 * them has none), into @values[i] as ps_coordinator_heartbeat_read does. */
PS_API int ps_coordinator_heartbeat_read_many(ps_client *c, const char *const *tasks,
                                              size_t n, int64_t *values, ps_status *st);

/* Sets task @task's heartbeat to 0 (no variable: nothing): a chief that
 * leaves the ps running for the next job (--keep-ps) forgets its workers. */
PS_API int ps_coordinator_heartbeat_clear(ps_client *c, const char *task, ps_status *st);

#ifdef __cplusplus
}
#endif

#endif
