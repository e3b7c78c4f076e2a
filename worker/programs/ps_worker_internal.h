/* Shared by the files of ps-worker (worker/programs/ps_worker*.c), each a
 * layer over the ones before it, none calling back:
 *   ps_worker_stop.c     the stop a signal requests
 *   ps_worker_options.c  flags, --help
 *   ps_worker_models.c   the built-in models, their data and test metric
 *   ps_worker_eval.c     the evaluator task
 *   ps_worker_finish.c   the end of the job: the chief's watch of the other
 *                        workers, its final save, the ps shutdown
 *   ps_worker_train.c    set-up and the training loop
 *   ps_worker.c          main
 * Private to worker/programs/. */
#ifndef PS_WORKER_INTERNAL_H
#define PS_WORKER_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/metrics.h"
#include "paramserver/coordinator.h"
#include "paramserver/dataset.h"
#include "paramserver/graph.h"
#include "paramserver/saver.h"
#include "paramserver/session.h"

typedef enum model_kind { M_LINREG, M_SOFTMAX, M_MLP, M_WIDE_DEEP, M_CTR } model_kind;

typedef struct options {
  const char *cluster_file, *job, *data_dir, *ckpt_dir, *restore, *optimizer, *meta;
  const char *metrics_bind;
  const char *ctr_data; /* --data: a Criteo TSV log (ctr) */
  int64_t examples, table_max_rows, table_min_count, table_ttl_steps;
  int task;
  bool local, sync, final_save, no_restore, keep_ps;
  model_kind model;
  int64_t steps, batch, log_every, save_every_steps, vocab;
  int hidden, replicas, parts, max_to_keep, metrics_port;
  bool greedy;
  bool bf16_gradients; /* --gradient-dtype bfloat16 */
  int num_workers;
  double lr, save_every_secs, ps_timeout;
  uint64_t seed;
  ps_client_options sec; /* the client's options: the security flags */
} options;

typedef struct model {
  ps_graph *g;
  ps_node *x, *ids, *dense, *y; /* placeholders (some NULL) */
  ps_node *loss, *train, *metric;
  ps_node *prob; /* ctr: the click probability of each example */
  ps_variable *step;
  bool classifier;
} model;

/* The other workers of the job (tasks of "chief" and "worker" but this
 * one), with what the chief has seen of their heartbeats
 * (paramserver/coordinator.h). */
typedef struct peer {
  char task[PS_CLUSTER_MAX_JOB_NAME + 16]; /* "worker/1" */
  int64_t beat;   /* the last value read; INT64_MIN before the first */
  double changed; /* when it last changed (or was first read) */
} peer;

/* What the chief has seen of the other workers' heartbeats, read during
 * training (once a second) and in its end-of-job wait, so that a worker
 * that died long before the end is seen as gone at once and one that
 * finished before a ps/0 restart is still done. */
typedef struct watch {
  peer *p;
  const char **tasks;
  int64_t *v;
  int n;
  bool failing;     /* the last read failed (logged once) */
  double next_read; /* when to read again */
} watch;

/* One worker's job: where it runs, what it trains, and the objects it
 * made (freed by job_free). */
typedef struct job {
  options o;
  ps_task_id self;
  ps_cluster *cluster;
  bool chief;
  int num_workers, worker_index;
  model m;
  ps_client *client;
  ps_session *s;
  ps_saver *saver;
  ps_dataset train, test, batch;
  float *truth; /* ctr on a generated log: each test example's true p */
  ps_dataset_iter *it;
  bool rpc_up;
  ps_coordinator_options co;
  ps_coordinator_heartbeat *hb; /* a non-chief worker's, once it has joined */
  ps_client *hbc;      /* heartbeat calls: deadline PS_COORDINATOR_HEARTBEAT_CALL_MS */
  struct watch *watch; /* the chief's view of the others' heartbeats */
  /* the training loop's progress */
  int64_t gs, local, saved_step;
  bool trained;
  bool evaluator; /* evaluates each new checkpoint, never trains */
  /* --metrics-port: what the page shows (the training thread writes, the
   * metrics thread reads) */
  ps_metrics_server *metrics;
  atomic_llong m_steps, m_examples, m_global_step;
  _Atomic double m_loss, m_examples_per_sec;
} job;

/* One assign per global variable, fed from a checkpoint file. */
typedef struct eval_vars {
  size_t n;
  ps_variable **v;
  ps_node **in, **assign;
} eval_vars;

/* ps_worker_stop.c */
/* The signal's number, 0 while none came. */
extern atomic_int ps_worker_stop_requested_;
void ps_worker_on_signal_(int sig);

/* ps_worker_options.c: 0, 1 (--help or --version: exit 0) or 2 (a usage
 * error). */
int ps_worker_parse_args_(int argc, char **argv, options *o);

/* ps_worker_models.c */
const char *ps_worker_model_name_(model_kind k);
int ps_worker_build_model_(const options *o, const ps_cluster *cluster, int nps, model *m,
                           ps_status *st);
int ps_worker_import_model_(const char *path, model *m, ps_saver **saver, ps_status *st);
/* @truth: ctr on a generated log, each test example's true P(click)
 * (malloc'd), else NULL. */
int ps_worker_load_data_(const options *o, ps_dataset *train, ps_dataset *test,
                         float **truth, ps_status *st);
size_t ps_worker_feeds_of_(const model *m, const ps_dataset *b, ps_feed *f);
int ps_worker_evaluate_(const model *m, ps_session *s, const ps_dataset *test,
                        double *out, ps_status *st);
int64_t ps_worker_read_step_(const model *m, ps_session *s, ps_status *st);
/* ctr: AUC and log loss of the model on @test, and of the true
 * probabilities @truth (the best achievable; 0 without them). */
#define PS_CTR_FIELDS 8 /* fields of the generated click log */
typedef struct ctr_report {
  double auc, logloss, best_auc, best_logloss;
} ctr_report;
int ps_worker_ctr_report_(const model *m, ps_session *s, const ps_dataset *test,
                          const float *truth, ctr_report *out, ps_status *st);

/* ps_worker_eval.c */
extern eval_vars ps_worker_ev_;
int ps_worker_set_up_evaluator_(job *j, ps_status *st);
int ps_worker_evaluate_loop_(job *j, ps_status *st);

/* ps_worker_finish.c */
double ps_worker_now_secs_(void);
void ps_worker_watch_free_(watch *w);
watch *ps_worker_watch_new_(const ps_cluster *cl, const ps_task_id *self);
void ps_worker_watch_read_(watch *w, ps_client *c);
int ps_worker_finish_(job *j, ps_status *st);
bool ps_worker_found_job_done_(job *j, const ps_status *st);
/* Whether the latest checkpoint of --checkpoint-dir holds --steps (quiet). */
bool ps_worker_ckpt_done_(job *j);
void ps_worker_chief_failed_(job *j, const char *phase, const ps_status *e);

/* ps_worker_train.c */
int ps_worker_set_up_(job *j, ps_status *st);
int ps_worker_train_loop_(job *j, ps_status *st);

#endif
