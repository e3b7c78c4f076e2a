/* libpsworker client: typed calls to the ps tasks of a cluster.
 *
 * One gRPC channel per ps task.  Every call carries a deadline; calls that
 * are safe to repeat (create, initialize-if-uninitialized, reads, status)
 * are retried with exponential backoff when a ps is UNAVAILABLE.  The
 * *_many functions contact several ps tasks at once and return when all
 * have answered.
 *
 * Thread safety: a ps_client may be used from several threads at once.
 * Errors: functions return 0 or a gRPC status code, with @st (may be NULL)
 * holding a message that names the variable or task.
 *
 * Setup: a program calls ps_library_init() (paramserver/library.h) once
 * before ps_client_create() and ps_library_shutdown() once after the last
 * ps_client_destroy():
 *
 *   ps_library_init();
 *   ps_cluster *cl = ps_cluster_load_file("cluster.json", &st);
 *   ps_client *c = ps_client_create(cl, "ps", NULL, &st);
 *   ...
 *   ps_client_destroy(c);
 *   ps_cluster_destroy(cl);
 *   ps_library_shutdown(); */
#ifndef PARAMSERVER_CLIENT_H
#define PARAMSERVER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paramserver/api.h"
#include "paramserver/cluster.h"
#include "paramserver/init.h"
#include "paramserver/library.h"
#include "paramserver/status.h"
#include "paramserver/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_client ps_client;

typedef struct ps_client_options {
  /* Whole-call deadlines of control calls, and of reads, updates, saves
   * and restores; 0 (the default): 30 s and 300 s, or rpc_timeout_ms
   * plus 5 s when that is longer. */
  int64_t control_timeout_ms;
  int64_t data_timeout_ms;
  int max_retries;          /* UNAVAILABLE retries of safe calls (default 6) */
  int64_t retry_initial_ms; /* first backoff (default 50 ms), doubling */
  int64_t retry_max_ms;     /* backoff cap (default 2 s) */
  /* Security (common/SECURITY.md); each NULL one is taken from the
   * environment variable named after it, if set.  tls_ca_file (PS_TLS_CA):
   * TLS, the ps certificates must be signed by this PEM CA; tls_cert_file
   * and tls_key_file (PS_TLS_CERT, PS_TLS_KEY): this client's certificate
   * for mutual TLS; tls_server_name (PS_TLS_SERVER_NAME): the name the ps
   * certificates carry, when not each task's host; token_file
   * (PS_TOKEN_FILE) or token (PS_AUTH_TOKEN): sent on every call as
   * "authorization: Bearer TOKEN". */
  const char *tls_ca_file, *tls_cert_file, *tls_key_file, *tls_server_name;
  const char *token_file, *token;
  /* The largest answer message (header or data chunk) taken from a ps;
   * a larger one fails the call with RESOURCE_EXHAUSTED naming the limit
   * (--max-message-bytes of psctl and ps-worker).  0 or less: the default,
   * 32 MiB; raised to 16 MiB + 16 (a data chunk of any version). */
  int64_t max_message_bytes;
  /* A ps that stops answering (stopped, hung, its host frozen; deploy/DEPLOY.md
   * "A ps that stops answering"): a call that hears nothing for this long fails with
   * DEADLINE_EXCEEDED, "ps/1 at HOST:PORT: Update: no answer for 60 s
   * (--rpc-timeout)".  Hearing is any progress of the call, or an answer
   * to a Status call the client sends the same ps while the call is quiet:
   * a ps that is busy (a long save) or holds the call on purpose
   * (synchronous updates) still answers.  Shorter stops only delay the
   * call.  0: the environment variable PS_RPC_TIMEOUT (seconds), else 60 s. */
  int64_t rpc_timeout_ms;
  /* Replicated ps shards (ps-server --replicas; worker/LIBRARY.md
   * "Replication").  @replicas: the job's replication factor R (1 to 3);
   * 0 (the default): the cluster spec's "replication" section, else 1, or
   * with etcd endpoints known, the R of the view in etcd.  @etcd: the
   * etcd endpoints "HOST:PORT[,HOST:PORT...]" (NULL: the spec's section,
   * else the environment variable PS_ETCD); @repl_job: the job's name in
   * etcd (NULL: the spec's section, else "default").  With R >= 2 the
   * client reads the view (which task is each shard's primary) from etcd
   * and watches it; "task" in the calls below then names a shard (the
   * variables placed on ps/task), sent to its primary wherever it is. */
  int replicas;
  const char *etcd;
  const char *repl_job;
} ps_client_options;

#define PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES ((int64_t)32 << 20)

/* The default of ps_client_options.rpc_timeout_ms, in seconds. */
#define PS_DEFAULT_RPC_TIMEOUT_SECS 60

PS_API void ps_client_options_default(ps_client_options *o);

/* Channels to every task of @ps_job ("ps") in @cluster (copied).
 * @opt may be NULL for defaults. */
PS_API ps_client *ps_client_create(const ps_cluster *cluster, const char *ps_job,
                                   const ps_client_options *opt, ps_status *st);
PS_API void ps_client_destroy(ps_client *c); /* NULL is a no-op */
PS_API int ps_client_num_ps(const ps_client *c);
/* Calls made to ps @task so far and the seconds callers waited for them
 * (for metrics: time blocked on each ps).  Any thread. */
PS_API void ps_client_task_stats(const ps_client *c, int task, unsigned long long *calls,
                                 double *wait_secs);
PS_API const char *ps_client_address(const ps_client *c, int task);
/* Seconds the calls now waiting on ps @task have heard nothing from it
 * (0 when none waits, or it answered within the last second): a stopped
 * ps shows here until rpc_timeout_ms ends the calls.  Any thread. */
PS_API double ps_client_task_unanswered_secs(const ps_client *c, int task);
/* True when @st is a call that failed for want of an answer within
 * rpc_timeout_ms (DEADLINE_EXCEEDED, "... no answer for N s (--rpc-timeout)"). */
PS_API bool ps_client_stalled(const ps_status *st);
/* The rpc_timeout_ms the client runs with (its option, PS_RPC_TIMEOUT or
 * the default). */
PS_API int64_t ps_client_rpc_timeout_ms(const ps_client *c);

/* Replication.  The replication factor the client runs with (1:
 * unreplicated), and the epoch of the view it routes by (0: unreplicated,
 * or no ps wrote a view yet). */
PS_API int ps_client_replicas(const ps_client *c);
PS_API int64_t ps_client_view_epoch(ps_client *c);

#define PS_SHARD_PRIMARY 0
#define PS_SHARD_BACKUP 1  /* in sync: holds every acknowledged update */
#define PS_SHARD_SYNCING 2 /* copying the shard from its primary */
/* Shard @shard's replicas as the client's view has them: task[0] the
 * primary.  Unreplicated: the shard's own task alone.  n == 0: the shard
 * is lost (every replica gone). */
typedef struct ps_shard_replicas {
  int n;
  int task[3];
  int state[3];         /* PS_SHARD_* */
  int64_t epoch, since; /* the view's epoch; since when task[0] is primary */
} ps_shard_replicas;
PS_API int ps_client_shard_replicas(ps_client *c, int shard, ps_shard_replicas *out,
                                    ps_status *st);

typedef struct ps_var_spec {
  const char *name;
  ps_dtype dtype;
  ps_shape shape;
  const ps_init_spec *init; /* NULL: the value is assigned by the client */
  /* Parts of partitioned variables: the full variable (else NULL/0). */
  const char *full_name;
  const ps_shape *full_shape;
  int64_t offset; /* first element of this part in the full variable */
} ps_var_spec;

/* Variables are shared by name, as TensorFlow's: creating one that exists
 * with the same dtype, shape and partition succeeds whatever its
 * initializer (it keeps the one it was created with); ALREADY_EXISTS for
 * another dtype, shape or partition.
 * With more than one ps, the variables of the other tasks are listed first
 * and a spec that would put two tensors under one checkpoint key across
 * tasks is refused before anything is created: a name already on another
 * task, or a plain variable beside parts of it (ALREADY_EXISTS), parts of
 * one variable with another dtype or full shape, or overlapping elements
 * (INVALID_ARGUMENT); each message names both variables and the task.  A
 * task that cannot be listed is skipped with a warning. */
PS_API int ps_client_create_vars(ps_client *c, int task, const ps_var_spec *specs,
                                 size_t n, ps_status *st);
/* Runs the server-side initializers of @names (all when n == 0).  With
 * @only_uninitialized, variables that hold a value are left alone.
 * @ninit (may be NULL) receives how many were initialized. */
PS_API int ps_client_initialize(ps_client *c, int task, const char *const *names,
                                size_t n, bool only_uninitialized, size_t *ninit,
                                ps_status *st);
PS_API int ps_client_is_initialized(ps_client *c, int task, const char *const *names,
                                    size_t n, bool *out, ps_status *st);
/* Names of uninitialized variables among @names (all when n == 0);
 * free with ps_client_free_names(). */
PS_API int ps_client_report_uninitialized(ps_client *c, int task,
                                          const char *const *names, size_t n, char ***out,
                                          size_t *nout, ps_status *st);
PS_API void ps_client_free_names(char **names, size_t n);

typedef enum ps_update_op {
  PS_ASSIGN = 0,
  PS_ASSIGN_ADD = 1,
  PS_ASSIGN_SUB = 2,
  PS_SCATTER_UPDATE = 3,
  PS_SCATTER_ADD = 4,
  PS_SCATTER_SUB = 5,
  /* Optimizer updates: @value is the gradient and the ps that owns the
   * variable runs TensorFlow's update kernel on it and its slots. */
  PS_APPLY_GRADIENT_DESCENT = 6,
  PS_APPLY_MOMENTUM = 7,
  PS_APPLY_ADAGRAD = 8,
  PS_APPLY_ADAM = 9,
} ps_update_op;

/* One update of one variable.
 *
 * Scatter ops: @indices (required) selects rows; @value has shape
 * [n] + var.shape[1:].
 *
 * Optimizer ops (PS_APPLY_*): @value is the gradient, with the variable's
 * dtype (float or double).  Without @indices it is dense and has the
 * variable's shape; with @indices it is sparse: row k of @value, shaped
 * [n] + var.shape[1:], is the gradient of row indices[k].  @slots name the
 * slot variables (on the same ps, same dtype and shape as the variable,
 * initialized; they are locked and updated together with it) and @hparams
 * are the hyperparameters, in this order:
 *
 *   PS_APPLY_GRADIENT_DESCENT  slots {}              hparams {lr}
 *       var -= lr*g; sparse: per row, duplicate indices accumulate.
 *   PS_APPLY_MOMENTUM          slots {accum}         hparams {lr, momentum}
 *       accum = accum*momentum + g; var -= lr*accum, or with use_nesterov
 *       var -= g*lr + accum*momentum*lr; sparse: rows one after another.
 *   PS_APPLY_ADAGRAD           slots {accum}         hparams {lr}
 *       accum += g^2; var -= lr*g/sqrt(accum); sparse: rows one after another.
 *   PS_APPLY_ADAM              slots {m, v}
 *       hparams {lr, beta1, beta2, epsilon, beta1_power, beta2_power}
 *       alpha = lr*sqrt(1-beta2_power)/(1-beta1_power);
 *       m += (g-m)*(1-beta1); v += (g^2-v)*(1-beta2);
 *       var -= m*alpha/(sqrt(v)+epsilon), or with use_nesterov
 *       var -= (g*(1-beta1) + beta1*m)*alpha/(sqrt(v)+epsilon).
 *       Sparse (no use_nesterov): TensorFlow's non-lazy sparse Adam: all rows
 *       of m and v decay, m[idx] += g*(1-beta1) and v[idx] += g^2*(1-beta2)
 *       (duplicates accumulate), then var is updated densely.
 *       The caller keeps beta1_power and beta2_power (beta^t, t from 1) and
 *       multiplies them by beta1, beta2 after each step, as TensorFlow does.
 *
 * The ps applies what it is given: to mirror TensorFlow's Optimizer, sum
 * the rows of duplicate indices first (except for gradient descent).
 * Errors (nothing changes): wrong counts of slots or hparams, a slot of
 * another dtype or shape, use_nesterov where not supported, a gradient of
 * the wrong dtype or shape, an index out of range (INVALID_ARGUMENT); a
 * missing slot (NOT_FOUND); an uninitialized variable or slot
 * (FAILED_PRECONDITION "Attempting to use uninitialized value NAME").
 *
 * Synchronous updates (TensorFlow's SyncReplicasOptimizer), when
 * @replicas_to_aggregate R > 0: the ps aggregates the updates of each
 * variable per step in a conditional accumulator and applies them once
 * when R have arrived; @sync_local_step is the global_step the worker read
 * at the start of its step.  An update older than the accumulator's step
 * is dropped as stale (@result->stale).  The call returns only when every
 * synchronous update it carries has been applied, so after a worker's
 * updates to all ps return, its next reads see the new step.  Optimizer
 * ops apply to the mean gradient (sparse: each row divided by the number
 * of gradients that had its index), ASSIGN_ADD/SUB add or subtract the
 * mean value (global_step's increment of 1 adds 1 per step), ASSIGN
 * stores the step's first value; scatter ops cannot be synchronous.  A
 * ps shutting down fails waiting calls with UNAVAILABLE.  The full rules
 * are in proto/ps.proto. */
typedef struct ps_update_result {
  int64_t version;   /* the variable's version after the update */
  bool stale;        /* synchronous: dropped as stale, nothing changed */
  int64_t sync_step; /* synchronous: the accumulator's step afterwards
                        (applied: the step joined + 1; stale: its step) */
} ps_update_result;

/* A PS_ASSIGN whose value the ps computes: a graph's initializer run on
 * the ps (TensorFlow runs it on the variable's device), so the values
 * never cross the network.  The ps fills @dtype, @shape as
 * ps_init_fill_draw(@init, full name, dtype, full shape, @offset, ...,
 * &@seed, @draw) would: the same values, bit for bit.  @seed is the key
 * when init->seed is 0.  Borrowed for the call. */
typedef struct ps_update_fill {
  const ps_init_spec *init;
  ps_dtype dtype;
  ps_shape shape;
  const char *full_name;      /* parts of partitioned variables, else NULL */
  const ps_shape *full_shape; /* NULL: @shape */
  int64_t offset;
  uint64_t seed;
  uint64_t draw; /* the run of the initializer in the session (0: first) */
} ps_update_fill;

typedef struct ps_update {
  const char *name;
  ps_update_op op;
  const ps_tensor *value;   /* sent zero-copy: not modified during the call */
  const ps_tensor *indices; /* scatter ops, sparse gradients: 1-D int32/int64 */
  bool no_validate_shape;   /* ASSIGN: TensorFlow's validate_shape=False */
  /* Optimizer ops only (else 0/NULL/false).  Borrowed for the call. */
  const char *const *slots;
  size_t nslots;
  const double *hparams;
  size_t nhparams;
  bool use_nesterov; /* PS_APPLY_MOMENTUM, PS_APPLY_ADAM */
  /* Synchronous updates (0: asynchronous). */
  int replicas_to_aggregate;
  int64_t sync_local_step;
  ps_update_result *result;   /* out (may be NULL): filled when the call succeeds */
  const ps_update_fill *fill; /* PS_ASSIGN without @value: the ps fills it */
} ps_update;

/* Applies @n updates on one ps atomically: if one fails, none applies.
 * An unreplicated ps may answer once it has checked them and apply them
 * after the answer; any read or update of those variables that reaches
 * it after the answer, from this client or another, sees them. */
PS_API int ps_client_update(ps_client *c, int task, const ps_update *u, size_t n,
                            ps_status *st);

typedef struct ps_read {
  const char *name;
  const ps_tensor *indices; /* NULL: whole variable; else gather rows (axis 0) */
  ps_tensor *out;           /* in: NULL (allocated) or a tensor of the right
                               dtype and size, filled in place (as the answer
                               arrives: a failed call may leave part of one
                               in it); out: result */
} ps_read;

/* Reads @n variables of one ps in one RPC, all as of one moment.  On
 * failure, outputs this call allocated are freed and set back to NULL. */
PS_API int ps_client_read(ps_client *c, int task, ps_read *r, size_t n, ps_status *st);

/* Work for one ps task in a *_many call. */
typedef struct ps_task_reads {
  int task;
  ps_read *reads;
  size_t n;
  ps_status st; /* out */
} ps_task_reads;
typedef struct ps_task_updates {
  int task;
  const ps_update *updates;
  size_t n;
  ps_status st; /* out */
} ps_task_updates;

/* All tasks in parallel; returns 0 if all succeeded, else the first failing
 * task's code (each entry's st says how it went). */
PS_API int ps_client_read_many(ps_client *c, ps_task_reads *t, size_t n, ps_status *st);
PS_API int ps_client_update_many(ps_client *c, ps_task_updates *t, size_t n,
                                 ps_status *st);

typedef struct ps_var_info {
  char *name;
  ps_dtype dtype;
  ps_shape shape;
  int64_t bytes;
  bool initialized;
  int64_t version;
  int task;
  /* A part of a partitioned variable: the full variable (its checkpoint
   * key) and this part's first element in it; else NULL/0. */
  char *full_name;
  ps_shape full_shape;
  int64_t offset;
} ps_var_info;

PS_API int ps_client_list(ps_client *c, int task, ps_var_info **out, size_t *n,
                          ps_status *st);
PS_API void ps_client_free_var_info(ps_var_info *v, size_t n);

/* Flags of ps_client_delete(). */
#define PS_DELETE_SLOTS 1      /* also the slot variables NAME/SLOT */
#define PS_DELETE_MISSING_OK 2 /* a name that matches nothing is no error */
/* Removes variables from ps @task, atomically.  Each name matches the
 * variable of that name and, if it is the full name of a partitioned
 * variable, its parts on that ps; with PS_DELETE_SLOTS also every
 * variable named M/S where M is a matched variable and S one more path
 * part without '/' (TensorFlow's slots: w/Momentum, w/Adam_1,
 * w/part_0/Adagrad).  A name that matches nothing is NOT_FOUND and
 * nothing is removed, unless PS_DELETE_MISSING_OK.  Calls that hold a
 * removed variable fail with NOT_FOUND; the name may be created again.
 * @out (may be NULL) receives the removed names and, with
 * PS_DELETE_MISSING_OK, the names that matched nothing; free it with
 * ps_delete_result_free().  Not retried. */
typedef struct ps_delete_result {
  char **deleted; /* sorted */
  size_t ndeleted;
  char **missing;
  size_t nmissing;
} ps_delete_result;
PS_API int ps_client_delete(ps_client *c, int task, const char *const *names, size_t n,
                            int flags, ps_delete_result *out, ps_status *st);
PS_API void ps_delete_result_free(ps_delete_result *r); /* NULL is a no-op */

typedef struct ps_task_status {
  char task[64];
  char address[256];
  char version[32];
  int64_t num_vars, bytes, pid, rpcs;
  double uptime_secs;
} ps_task_status;

PS_API int ps_client_status(ps_client *c, int task, ps_task_status *out, ps_status *st);

/* Replication: the shards ps @task holds a replica of, as it reports them
 * (its Status).  role: "primary", "backup" (in sync) or "syncing"; on a
 * primary, per backup in the view's order, the replication entries and
 * bytes sent and not yet acknowledged (its lag); on a syncing backup, the
 * bytes of the state copy received so far. */
typedef struct ps_shard_status {
  int shard;
  char role[16];
  int64_t num_vars, bytes;
  int nlag;
  int64_t lag_entries[3], lag_bytes[3];
  int64_t synced_bytes;
} ps_shard_status;
typedef struct ps_task_repl {
  int replicas;       /* 0: the ps runs unreplicated */
  int64_t view_epoch; /* the ps's view */
  bool fenced;        /* cut off: it acknowledges nothing */
  char fenced_reason[256];
  ps_shard_status *shards; /* malloc'd: free with ps_task_repl_fini */
  size_t nshards;
} ps_task_repl;
PS_API int ps_client_status_repl(ps_client *c, int task, ps_task_repl *out,
                                 ps_status *st);
PS_API void ps_task_repl_fini(ps_task_repl *r); /* NULL is a no-op */

/* Digest (psctl verify): per variable of shard @shard held by ps @task (a
 * replica of it, primary or backup), its version and a CRC32C of its
 * value, as of one moment.  Unreplicated: @shard is @task's own.  Sorted
 * by name; free with ps_digest_fini. */
typedef struct ps_var_digest {
  char *name;
  int64_t version;
  uint32_t crc32c;
  bool initialized;
  int64_t bytes;
} ps_var_digest;
typedef struct ps_digest {
  int64_t epoch;
  char role[16];
  ps_var_digest *vars;
  size_t n;
} ps_digest;
PS_API int ps_client_digest(ps_client *c, int task, int shard, ps_digest *out,
                            ps_status *st);
PS_API void ps_digest_fini(ps_digest *d); /* NULL is a no-op */
/* Asks ps @task to stop as on SIGTERM (calls in flight finish within its
 * --grace-secs, then it exits 0); @reason (may be NULL, at most 256 bytes)
 * goes to its log.  Not retried. */
PS_API int ps_client_shutdown(ps_client *c, int task, const char *reason, ps_status *st);
/* One Status call, not retried: 0 when ps @task answers now (for callers
 * that poll and must stay responsive, e.g. to a signal).  Replicated
 * (ps_client_options.replicas >= 2): the primary of shard @task in the
 * view, so a task that failed over does not hold the caller. */
PS_API int ps_client_probe(ps_client *c, int task, ps_status *st);
/* ps_client_probe, but a ps that accepts and does not answer fails it
 * after @within_ms (when shorter than the stall timeout, rpc_timeout_ms)
 * with the same DEADLINE_EXCEEDED; 0: rpc_timeout_ms. */
PS_API int ps_client_probe_within(ps_client *c, int task, int64_t within_ms,
                                  ps_status *st);

/* ---- checkpoints (see proto/ps.proto) ----
 * Paths are relative to the ps tasks' --checkpoint-dir (a filesystem they
 * share), e.g. "model.ckpt-1000". */
/* The checkpoints one Saver wrote (TensorFlow's Saver.last_checkpoints),
 * as the ps names them, oldest first.  Owned by whoever holds it; free
 * with ps_ckpt_list_fini. */
typedef struct ps_ckpt_list {
  char **paths;
  size_t n;
} ps_ckpt_list;
PS_API void ps_ckpt_list_fini(ps_ckpt_list *l);

/* One variable of a Saver's save: on ps @task, saved under @key (NULL or
 * "": its name, or its partitioned variable's name for a part). */
typedef struct ps_save_item {
  int task;
  const char *name;
  const char *key;
} ps_save_item;

typedef struct ps_save_options {
  /* false: every variable of every ps, under its name (an operator's save,
   * psctl save).  true: only items[0..nitems) (a Saver's var_list, maybe
   * none on some ps), each under its key; an item's variable that does not
   * exist is NOT_FOUND naming it. */
  bool select;
  const ps_save_item *items;
  size_t nitems;
  /* With select: every embedding table of every ps too
   * (paramserver/embedding.h; a Saver of a graph with tables). */
  bool tables;
  int max_to_keep;           /* 0: 5 (TensorFlow's default); -1: keep all */
  double keep_every_n_hours; /* 0: never */
  bool skip_uninitialized;   /* else an uninitialized variable fails the save */
  int64_t hold_ms;           /* the longest the update gates stay closed (10 s) */
  /* NULL: retention runs over the directory's list, as the state file has
   * it (an operator's save, psctl save).  Else a Saver's save: the state
   * file lists only *own and the new checkpoint, retention deletes only
   * among them (never another Saver's checkpoints), and on success *own is
   * replaced with the list after the save. */
  ps_ckpt_list *own;
  /* A MetaGraph to write as <prefix>.meta next to the checkpoint (by the
   * ps that merges, before the state file names it); NULL: none. */
  const uint8_t *meta_graph;
  size_t meta_graph_len;
  /* NULL: the checkpoint is @prefix.  Else a scalar integer variable of ps
   * task step_task (the global step): the checkpoint is @prefix-<step>,
   * its value in the snapshot, read while every update gate is closed, so
   * the name and the saved step agree while other workers train on
   * (TensorFlow reads the step before it saves, and they can differ).
   * *step (may be NULL) receives it. */
  const char *step_name;
  int step_task;
  int64_t *step;
  /* May be NULL: called with the checkpoint's name before any shard is
   * written; nonzero fails the save (a .meta written beside it). */
  int (*on_name)(void *arg, const char *prefix, ps_status *st);
  void *on_name_arg;
} ps_save_options;

/* Saves every variable of every ps as of one moment: each ps writes its
 * shard, the last ps merges them into @prefix.index + .data-*, then the
 * `checkpoint` state file is replaced atomically.  @written (may be NULL)
 * receives the checkpoint's path on the ps (malloc'd), @bytes the bytes
 * written. */
PS_API int ps_client_save(ps_client *c, const char *prefix, const ps_save_options *o,
                          char **written, int64_t *bytes, ps_status *st);
/* Restores every variable of every ps by name from @prefix (NULL or "":
 * the latest checkpoint of the directory); no initialization needed.
 * @nrestored (may be NULL) receives how many variables were restored.
 * NOT_FOUND, changing nothing, when the checkpoint holds variables that
 * exist on no ps task (ps_client_restore_opts with no options). */
PS_API int ps_client_restore(ps_client *c, const char *prefix, size_t *nrestored,
                             ps_status *st);

/* psctl restore's options (all zero: ps_client_restore). */
typedef struct ps_restore_options {
  /* Creates the checkpoint's variables that exist on no ps task from its
   * own names, dtypes, shapes and slices (a part of a partitioned variable
   * as "NAME/part_I"), then restores them too.  Each goes to ps task
   * @task with @one_task, else where replica_device_setter puts variables
   * created in the checkpoint's order (sorted by name): round robin, each
   * variable and each part of a partitioned one a turn; a slot "P/SLOT"
   * of a checkpoint variable P takes no turn and goes with P, and
   * beta1_power, beta2_power with the first P that has a "P/Adam".  The
   * checkpoint keeps no creation order: a program that created its
   * variables in another order finds them elsewhere (its chief recovers
   * by its graph instead). */
  bool create;
  /* Restores only the variables created now and those that exist without
   * a value (uninitialized); every other variable keeps its value. */
  bool only_missing;
  /* Only ps task @task: its variables alone are restored (or created). */
  bool one_task;
  int task;
} ps_restore_options;

typedef struct ps_restore_result {
  size_t restored; /* variables restored */
  size_t total;    /* variables the checkpoint holds (each part one) */
  size_t absent;   /* of them, on no ps task before the restore */
  size_t created;  /* of them, created (create); after a failure, those
                    * that could not be deleted again */
  size_t skipped;  /* tensors of dtypes no ps variable has (DT_STRING,
                    * DT_RESOURCE...: kept in a program's session), not
                    * ps variables: left out of total and absent */
  char *prefix;    /* the checkpoint's path on the ps (malloc'd) */
} ps_restore_result;

/* Restores from @prefix (NULL or "": the latest) as @o (may be NULL) says.
 * NOT_FOUND when the checkpoint holds variables that exist on no ps task
 * and @o->create is not set; the message gives their number and names (at
 * most 8, then "..."), and res->absent the number.  After any failure
 * nothing has changed: variables it created are deleted again; if that
 * fails too, the message adds "N variables created on ps/T are left:
 * NAMES (why)" and res->created counts them.
 * INVALID_ARGUMENT for a task that does not exist.  @res (may be NULL):
 * free with ps_restore_result_fini(). */
PS_API int ps_client_restore_opts(ps_client *c, const char *prefix,
                                  const ps_restore_options *o, ps_restore_result *res,
                                  ps_status *st);
PS_API void ps_restore_result_fini(ps_restore_result *r); /* NULL is a no-op */
/* Restores some variables of one ps, each from @keys[i] in the checkpoint
 * (NULL: the variable's own name), as TensorFlow's Saver({"key": var}). */
PS_API int ps_client_restore_vars(ps_client *c, int task, const char *prefix,
                                  const char *const *names, const char *const *keys,
                                  size_t n, ps_status *st);
/* What ps_client_restore_vars would do, checked (keys, dtypes, shapes,
 * checksums) without changing anything: a restore across several ps
 * checks every ps first, so that a failure changes no variable. */
PS_API int ps_client_check_restore_vars(ps_client *c, int task, const char *prefix,
                                        const char *const *names, const char *const *keys,
                                        size_t n, ps_status *st);
/* The check before a restore across several ps, on every ps at once: for
 * each task t with @n[t] > 0, what ps_client_restore_vars(c, t, @prefix,
 * @names[t], @keys[t] (may be NULL), @n[t]) would do, checked without
 * changing anything; @names NULL: every variable of every ps, as
 * ps_client_restore.  *@resolved receives (to free) the path of the
 * checkpoint every ps checked, the latest one when @prefix is NULL or "":
 * restore from it, not from @prefix, so that every ps restores what was
 * checked, whatever a save does meanwhile.  FAILED_PRECONDITION when the
 * ps name different checkpoints (both paths and tasks in the message), or
 * when a ps is an older ps-server that restored instead of checking. */
PS_API int ps_client_check_restore_all(ps_client *c, const char *prefix,
                                       const char *const *const *names,
                                       const char *const *const *keys, const size_t *n,
                                       char **resolved, ps_status *st);

#ifdef __cplusplus
}
#endif

#endif
