/* ps-worker: a training worker with built-in models.
 *
 * Joins the cluster through the coordinator (the chief restores or
 * initializes, the others wait), trains asynchronously (or synchronously
 * with --sync), prints a progress line every --log-every steps, saves
 * periodically and at the end (chief), and prints the test metric. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_flags.h"
#include "common/bundle.h"
#include "common/cluster.h"
#include "common/log.h"
#include "common/metrics.h"
#include "paramserver/checkpoint.h"
#include "paramserver/coordinator.h"
#include "paramserver/dataset.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/partition.h"
#include "paramserver/saver.h"
#include "paramserver/session.h"
#include "security_flags.h"

static const char usage[] =
    "usage: ps-worker [--cluster FILE --job worker --task N] [options]\n"
    "       ps-worker --local [options]        (one process, in-memory variables)\n"
    "\n"
    "Trains a built-in model on the ps of a cluster.  The chief (task 0 of the\n"
    "'chief' job, else of 'worker') waits for every ps, restores the latest\n"
    "checkpoint or initializes the variables (never re-initializing a live\n"
    "cluster), saves periodically and at the end, and prints the test metric;\n"
    "the other workers wait until the cluster is ready, then train.\n"
    "Identity (first that applies): --cluster/--job/--task; TF_CONFIG; Slurm.\n"
    "\n"
    "Model and data:\n"
    "  --model NAME          linreg | softmax | mlp | wide_deep (default mlp)\n"
    "                        softmax and mlp read Fashion-MNIST (Debian package\n"
    "                        dataset-fashion-mnist), else synthetic data;\n"
    "                        linreg and wide_deep use synthetic data\n"
    "  --data-dir DIR        Fashion-MNIST IDX files (default " PS_FASHION_MNIST_DIR ")\n"
    "  --hidden N            mlp hidden units (default 128)\n"
    "  --vocab N             wide_deep ids per field (default 10000)\n"
    "  --embedding-parts N   wide_deep table parts (default: one per ps)\n"
    "  --placement NAME      round_robin | greedy: replica_device_setter's ps\n"
    "                        strategy (every worker must use the chief's)\n"
    "  --import-meta FILE    build no graph: import it from a MetaGraph (a .meta\n"
    "                        the chief wrote next to a checkpoint); --model still\n"
    "                        chooses the data\n"
    "Training:\n"
    "  --steps N             train until global_step reaches N (default per model;\n"
    "                        0: only restore/initialize and evaluate)\n"
    "  --batch N             examples per step and worker (default 100)\n"
    "  --optimizer NAME      sgd | momentum | adagrad | adam (default per model)\n"
    "  --learning-rate X     (default per model)\n"
    "  --seed N              data order and initializers (default 1)\n"
    "  --sync                synchronous training (SyncReplicas)\n"
    "  --replicas-to-aggregate N  gradients per step in --sync (default: all workers)\n"
    "  --log-every N         progress line every N local steps (default 100)\n"
    "Checkpoints (saved by the ps into their --checkpoint-dir):\n"
    "  --checkpoint-dir DIR  this worker's path to the ps checkpoint directory:\n"
    "                        the chief writes the MetaGraph <prefix>.meta there\n"
    "  --save-every-steps N  chief: save every N global steps\n"
    "  --save-every-secs S   chief: save every S seconds\n"
    "  --no-final-save       chief: do not save when training ends (saving at the\n"
    "                        end is the default when any of the above is given)\n"
    "  --restore PREFIX      chief: restore this checkpoint instead of the latest\n"
    "  --no-restore          chief: initialize even if a checkpoint exists\n"
    "  --max-to-keep N       checkpoints kept (default 5)\n"
    "Other:\n"
    "  --ps-timeout SECS     give up waiting for the ps after SECS (default 0: never)\n"
    "  --rpc-timeout SECS    fail when a ps has not answered a call for SECS: it\n"
    "                        stopped or hung (default 60; env PS_RPC_TIMEOUT);\n"
    "                        exit status 69\n"
    "  --metrics-port N      serve Prometheus metrics on GET http://HOST:N/metrics\n"
    "                        (0: a port the kernel picks, logged), plain HTTP\n"
    "                        without authentication\n"
    "  --metrics-bind HOST   serve them on HOST only (default: every interface)\n"
    "  --keep-ps             chief: leave the ps tasks running when the job is done\n"
    "                        (by default it shuts them down after its final save,\n"
    "                        so a Slurm or Kubernetes job ends; also when that\n"
    "                        save fails, and then it exits 1 naming the save)\n"
    "  --log-level LEVEL     debug | info | warn | error\n"
    "  --log-format F        text | json (one JSON object a line; env PS_LOG_FORMAT)\n"
    "  --help, --version\n" PS_MAX_MESSAGE_HELP "\n" PS_SECURITY_HELP
    "  (the chief saves, restores and shuts the ps down: it needs an admin token)\n"
    "\n"
    "Output: progress lines on stderr (\"step 1200 loss 0.4123 examples/s 8100\");\n"
    "the final metric on stdout (\"test accuracy 0.8712\" or \"test mse ...\").\n"
    "Exit status: 0 done, 1 a training or cluster error, 2 bad arguments, 69 a ps\n"
    "stopped answering (--rpc-timeout), 143 (130) stopped by SIGTERM (SIGINT) before\n"
    "--steps, after the final checkpoint.\n";

typedef enum model_kind { M_LINREG, M_SOFTMAX, M_MLP, M_WIDE_DEEP } model_kind;

typedef struct options {
  const char *cluster_file, *job, *data_dir, *ckpt_dir, *restore, *optimizer, *meta;
  const char *metrics_bind;
  int task;
  bool local, sync, final_save, no_restore, keep_ps;
  model_kind model;
  int64_t steps, batch, log_every, save_every_steps, vocab;
  int hidden, replicas, parts, max_to_keep, metrics_port;
  bool greedy;
  int num_workers;
  double lr, save_every_secs, ps_timeout;
  uint64_t seed;
  ps_client_options sec; /* the client's options: the security flags */
} options;

typedef struct model {
  ps_graph *g;
  ps_node *x, *ids, *dense, *y; /* placeholders (some NULL) */
  ps_node *loss, *train, *metric;
  ps_variable *step;
  bool classifier;
} model;

static atomic_int stop_requested; /* the signal's number, 0 while none came */
static void on_signal(int sig) {
  atomic_store(&stop_requested, sig);
  ps_coordinator_cancel(); /* a wait for the ps or the chief ends too */
}

static double now_secs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *model_name(model_kind k) {
  static const char *names[] = {"linreg", "softmax", "mlp", "wide_deep"};
  return names[k];
}

static ps_optimizer *make_optimizer(const options *o, ps_status *st) {
  const char *name = o->optimizer;
  double lr = o->lr;
  ps_optimizer *opt = NULL;
  if (!strcmp(name, "sgd"))
    opt = ps_gradient_descent_optimizer(lr);
  else if (!strcmp(name, "momentum"))
    opt = ps_momentum_optimizer(lr, 0.9, false);
  else if (!strcmp(name, "adagrad"))
    opt = ps_adagrad_optimizer(lr, 0.1);
  else if (!strcmp(name, "adam"))
    opt = ps_adam_optimizer(lr, 0.9, 0.999, 1e-8);
  if (opt == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "unknown --optimizer %s", name);
    return NULL;
  }
  if (o->sync) {
    opt = ps_sync_replicas_optimizer(opt, o->replicas, o->num_workers);
  }
  return opt;
}

static ps_variable *var(ps_graph *g, const char *name, const ps_shape *shape, bool zeros,
                        ps_status *st) {
  ps_init_spec z;
  ps_init_spec_default(&z, PS_INIT_ZEROS);
  return ps_get_variable(g, name, PS_DT_FLOAT, shape, zeros ? &z : NULL, NULL, st);
}

/* Dense layer: x [B,in] -> [B,out]. */
static ps_node *dense_layer(ps_graph *g, const char *scope, ps_node *x, int64_t in,
                            int64_t out, ps_status *st) {
  if (ps_variable_scope_push(g, scope, PS_REUSE_NONE, st) != 0) return NULL;
  ps_variable *w = var(g, "kernel", &(ps_shape){2, {in, out}}, false, st);
  ps_variable *b = var(g, "bias", &(ps_shape){1, {out}}, true, st);
  ps_variable_scope_pop(g);
  if (w == NULL || b == NULL) return NULL;
  return ps_bias_add(ps_matmul(x, ps_variable_value(w), false, false),
                     ps_variable_value(b));
}

static int build_model(const options *o, const ps_cluster *cluster, int nps, model *m,
                       ps_status *st) {
  memset(m, 0, sizeof *m);
  ps_graph *g = m->g = ps_graph_create();
  ps_graph_set_random_seed(g, (int64_t)o->seed); /* --seed: the initializers */
  ps_rds_options rds = {.strategy = o->greedy ? PS_STRATEGY_GREEDY_BYTES
                                              : PS_STRATEGY_ROUND_ROBIN};
  if (cluster) ps_device_push_fn(g, ps_replica_device_setter(cluster, &rds));
  m->step = ps_create_global_step(g, st);
  if (m->step == NULL) return st->code;
  ps_node *logits = NULL;
  switch (o->model) {
  case M_LINREG: {
    m->x = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 10}}, "x");
    m->y = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 1}}, "y");
    ps_node *pred = dense_layer(g, "linear", m->x, 10, 1, st);
    m->loss = ps_mean_squared_error(m->y, pred);
    m->metric = m->loss;
    break;
  }
  case M_SOFTMAX:
  case M_MLP: {
    m->classifier = true;
    m->x = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, 784}}, "x");
    m->y = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "y");
    if (o->model == M_SOFTMAX) {
      logits = dense_layer(g, "softmax", m->x, 784, 10, st);
    } else {
      ps_node *h = ps_relu(dense_layer(g, "hidden", m->x, 784, o->hidden, st));
      logits = dense_layer(g, "logits", h, o->hidden, 10, st);
    }
    break;
  }
  case M_WIDE_DEEP: {
    m->classifier = true;
    const int nf = 8, emb = 8;
    m->ids = ps_placeholder(g, PS_DT_INT64, &(ps_shape){2, {-1, nf}}, "ids");
    m->dense = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, PS_DATASET_CTR_DENSE}},
                              "dense");
    m->y = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "y");
    int parts = o->parts > 0 ? o->parts : (nps > 1 ? nps : 1);
    ps_partitioner p = {.kind = PS_PART_FIXED, .num_shards = parts};
    ps_init_spec rn;
    ps_init_spec_default(&rn, PS_INIT_TRUNCATED_NORMAL);
    rn.stddev = 0.05;
    ps_init_spec z;
    ps_init_spec_default(&z, PS_INIT_ZEROS);
    ps_node *flat = ps_reshape(m->ids, &(ps_shape){1, {-1}});
    /* deep: embeddings of every field, concatenated with the dense features */
    ps_partitioned_variable *table =
        ps_get_partitioned_variable(g, "deep/embeddings", PS_DT_FLOAT,
                                    &(ps_shape){2, {o->vocab, emb}}, &rn, &p, NULL, st);
    /* wide: a weight per id and class */
    ps_partitioned_variable *wide = ps_get_partitioned_variable(
        g, "wide/weights", PS_DT_FLOAT, &(ps_shape){2, {o->vocab, 2}}, &z, &p, NULL, st);
    if (table == NULL || wide == NULL) return st->code;
    ps_node *e = ps_embedding_lookup(g, table->parts, table->n, flat, PS_PARTITION_DIV);
    ps_node *ein = ps_reshape(e, &(ps_shape){2, {-1, nf * emb}});
    ps_node *cat[2] = {ein, m->dense};
    ps_node *deep_in = ps_concat(cat, 2, 1);
    ps_node *h = ps_relu(
        dense_layer(g, "deep/hidden", deep_in, nf * emb + PS_DATASET_CTR_DENSE, 32, st));
    ps_node *deep = dense_layer(g, "deep/logits", h, 32, 2, st);
    ps_node *w = ps_embedding_lookup(g, wide->parts, wide->n, flat, PS_PARTITION_DIV);
    ps_node *wsum = ps_reduce_sum(ps_reshape(w, &(ps_shape){3, {-1, nf, 2}}), 1, false);
    logits = ps_add(deep, wsum);
    break;
  }
  }
  if (m->classifier) {
    m->loss = ps_reduce_mean(ps_sparse_softmax_cross_entropy_with_logits(m->y, logits),
                             PS_ALL_AXES, false);
    m->metric = ps_reduce_mean(ps_cast(ps_equal(ps_argmax(logits, 1), m->y), PS_DT_FLOAT),
                               PS_ALL_AXES, false);
  }
  if (ps_graph_status(g)->code != PS_OK)
    return ps_status_set(st, ps_graph_status(g)->code, "building %s: %s",
                         model_name(o->model), ps_graph_status(g)->msg);
  ps_optimizer *opt = make_optimizer(o, st);
  if (opt == NULL) return st->code;
  m->train = ps_optimizer_minimize(opt, g, m->loss, m->step, NULL, 0, st);
  ps_optimizer_destroy(opt);
  if (m->train == NULL) return st->code;
  ps_collection_add_node(g, PS_LOSSES, m->loss);
  ps_collection_add_node(g, PS_TRAIN_OP, m->train);
  ps_collection_add_node(g, "metric", m->metric);
  return 0;
}

/* The graph from a MetaGraph file instead of code: placeholders by name
 * (x, ids, dense, y), the loss, train op and metric from their
 * collections, global_step from its collection; the file's Saver. */
static int import_model(const char *path, model *m, ps_saver **saver, ps_status *st) {
  memset(m, 0, sizeof *m);
  if ((m->g = ps_import_meta_graph(path, saver, st)) == NULL) return st->code;
  ps_graph *g = m->g;
  m->x = ps_graph_find_node(g, "x");
  m->ids = ps_graph_find_node(g, "ids");
  m->dense = ps_graph_find_node(g, "dense");
  m->y = ps_graph_find_node(g, "y");
  size_t nl, nt, nm, ns;
  ps_node *const *l = ps_collection_nodes(g, PS_LOSSES, &nl);
  ps_node *const *t = ps_collection_nodes(g, PS_TRAIN_OP, &nt);
  ps_node *const *mt = ps_collection_nodes(g, "metric", &nm);
  ps_variable *const *sv = ps_collection_variables(g, PS_GLOBAL_STEP, &ns);
  if (m->y == NULL || nl != 1 || nt != 1 || nm != 1 || ns != 1)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "MetaGraph %s was not written by ps-worker: it needs a placeholder "
        "y and one node each in the losses, train_op and metric collections "
        "and a global_step",
        path);
  m->loss = l[0];
  m->train = t[0];
  m->metric = mt[0];
  m->step = sv[0];
  m->classifier = ps_node_dtype(m->y) == PS_DT_INT64;
  return 0;
}

static int load_data(const options *o, ps_dataset *train, ps_dataset *test,
                     ps_status *st) {
  switch (o->model) {
  case M_LINREG: {
    double w[10], b;
    if (ps_dataset_linreg(12000, 10, 42, train, w, &b, st)) return st->code;
    /* the same generator: the last 2000 rows are the test set */
    ps_dataset all = *train;
    memset(train, 0, sizeof *train);
    int rc = ps_dataset_batch(&all, 0, 10000, train, st) ||
             ps_dataset_batch(&all, 10000, 2000, test, st);
    ps_dataset_free(&all);
    return rc ? st->code : 0;
  }
  case M_SOFTMAX:
  case M_MLP: {
    bool synthetic = false;
    if (ps_dataset_fashion_mnist(o->data_dir, train, test, &synthetic, st))
      return st->code;
    PS_INFO("Fashion-MNIST: %lld training and %lld test examples%s", (long long)train->n,
            (long long)test->n, synthetic ? " (synthetic)" : "");
    return 0;
  }
  case M_WIDE_DEEP: {
    ps_dataset all = {0};
    if (ps_dataset_ctr(60000, o->vocab, 8, 7, &all, st)) return st->code;
    int rc = ps_dataset_batch(&all, 0, 50000, train, st) ||
             ps_dataset_batch(&all, 50000, 10000, test, st);
    ps_dataset_free(&all);
    return rc ? st->code : 0;
  }
  }
  return 0;
}

static size_t feeds_of(const model *m, const ps_dataset *b, ps_feed *f) {
  size_t n = 0;
  if (m->x) f[n++] = (ps_feed){m->x, b->x};
  if (m->ids) f[n++] = (ps_feed){m->ids, b->ids};
  if (m->dense) f[n++] = (ps_feed){m->dense, b->dense};
  f[n++] = (ps_feed){m->y, b->y};
  return n;
}

/* The metric over the whole test set, in batches of 1000. */
static int evaluate(const model *m, ps_session *s, const ps_dataset *test, double *out,
                    ps_status *st) {
  double sum = 0;
  int64_t seen = 0;
  ps_dataset b = {0};
  int rc = 0;
  for (int64_t start = 0; start < test->n && rc == 0; start += 1000) {
    if ((rc = ps_dataset_batch(test, start, 1000, &b, st)) != 0) break;
    ps_feed f[4];
    size_t nf = feeds_of(m, &b, f);
    ps_tensor *v = NULL;
    ps_node *metric = m->metric;
    if ((rc = ps_session_run(s, f, nf, &metric, 1, NULL, 0, &v, st)) != 0) break;
    sum += *(float *)ps_tensor_data(v) * (double)b.n;
    seen += b.n;
    ps_tensor_destroy(v);
  }
  ps_dataset_free(&b);
  *out = seen ? sum / (double)seen : 0;
  return rc;
}

/* The global step; -1 with @st set when it cannot be read, or when the ps
 * answers with something that is not an int64 scalar. */
static int64_t read_step(const model *m, ps_session *s, ps_status *st) {
  ps_node *r = ps_variable_value(m->step);
  ps_tensor *v = NULL;
  if (ps_session_run(s, NULL, 0, &r, 1, NULL, 0, &v, st) != 0) return -1;
  if (v == NULL || v->dtype != PS_DT_INT64 || ps_tensor_num_elements(v) != 1) {
    char sh[64];
    if (v)
      ps_status_set(st, PS_INTERNAL, "global_step read as %s %s, not an int64 scalar",
                    ps_dtype_name(v->dtype), ps_shape_format(&v->shape, sh, sizeof sh));
    else
      ps_status_set(st, PS_INTERNAL, "global_step read as no tensor");
    ps_tensor_destroy(v);
    return -1;
  }
  int64_t k;
  memcpy(&k, ps_tensor_data(v), sizeof k);
  ps_tensor_destroy(v);
  return k;
}

/* The other workers of the job (tasks of "chief" and "worker" but this
 * one), with what the chief has seen of their heartbeats
 * (paramserver/coordinator.h). */
typedef struct peer {
  char task[PS_CLUSTER_MAX_JOB_NAME + 16]; /* "worker/1" */
  int64_t beat;   /* the last value read; INT64_MIN before the first */
  double changed; /* when it last changed (or was first read) */
} peer;

static peer *peers_of(const ps_cluster *cl, const ps_task_id *self, int *n) {
  static const char *const jobs[] = {"chief", "worker"};
  *n = 0;
  int cap = 0;
  for (int k = 0; k < 2; k++) {
    const ps_cluster_job *jb = ps_cluster_find_job(cl, jobs[k]);
    if (jb) cap += jb->ntasks;
  }
  peer *p = calloc((size_t)cap + 1, sizeof *p);
  if (p == NULL) return NULL;
  for (int k = 0; k < 2; k++) {
    const ps_cluster_job *jb = ps_cluster_find_job(cl, jobs[k]);
    for (int t = 0; jb && t < jb->ntasks; t++) {
      if (jb->addrs[t] == NULL || (t == self->task && !strcmp(jobs[k], self->job)))
        continue;
      snprintf(p[*n].task, sizeof p[*n].task, "%s/%d", jobs[k], t);
      p[(*n)++].beat = INT64_MIN;
    }
  }
  return p;
}

/* Appends @task to the list @buf ("worker/1, worker/3"). */
static void list_add(char *buf, size_t n, const char *task) {
  size_t len = strlen(buf);
  if (len + 2 < n) snprintf(buf + len, n - len, "%s%s", len ? ", " : "", task);
}

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

static void watch_free(watch *w) {
  if (w == NULL) return;
  free(w->p);
  free(w->tasks);
  free(w->v);
  free(w);
}

static watch *watch_new(const ps_cluster *cl, const ps_task_id *self) {
  watch *w = calloc(1, sizeof *w);
  if (w == NULL) return NULL;
  w->p = peers_of(cl, self, &w->n);
  w->tasks = calloc((size_t)w->n + 1, sizeof *w->tasks);
  w->v = calloc((size_t)w->n + 1, sizeof *w->v);
  if (w->p == NULL || w->tasks == NULL || w->v == NULL) {
    watch_free(w);
    return NULL;
  }
  for (int i = 0; i < w->n; i++)
    w->tasks[i] = w->p[i].task;
  return w;
}

/* Reads every heartbeat in one call (deadline: @c's).  A read that fails
 * ages no one (their clocks restart); a worker seen before whose
 * heartbeat reads 0 (a ps/0 that restarted empty) keeps what it was. */
static void watch_read(watch *w, ps_client *c) {
  ps_status e;
  bool ok = ps_coordinator_heartbeat_read_many(c, w->tasks, (size_t)w->n, w->v, &e) == 0;
  double now = now_secs();
  if (!ok && !w->failing)
    PS_WARN("reading the heartbeats on ps/0 failed (%s): no worker is judged gone "
            "while they cannot be read",
            e.msg);
  w->failing = !ok;
  for (int i = 0; i < w->n; i++) {
    peer *q = &w->p[i];
    if (!ok) {
      q->changed = now; /* unread: not aged */
      continue;
    }
    int64_t x = w->v[i];
    if (x == 0 && q->beat != INT64_MIN && q->beat != 0)
      x = q->beat; /* seen before, gone from a restarted ps/0 */
    if (x != q->beat) {
      if (x == PS_COORDINATOR_HEARTBEAT_DONE) PS_INFO("%s reported done", q->task);
      q->beat = x;
      q->changed = now;
    }
  }
}

/* Chief: waits until every other worker has reported done (its heartbeat
 * says DONE) or is gone, so that the final checkpoint and the test metric
 * belong to a quiescent model.  A worker is gone when its heartbeat has
 * not moved for PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS of the chief's
 * reads (it joined, then died or stopped); reads of ps/0 that fail age no
 * one.  One without a heartbeat has not joined yet and is waited for up
 * to @join_secs (the chief is about to shut the ps down: a straggler
 * still starting up would find no ps and wait for ever); one the chief
 * has seen before keeps what it was when its heartbeat reads 0 (ps/0
 * restarted empty).  A live worker (its heartbeat moves) is waited for
 * until it is done, however slow its last step, at most until global_step
 * has not moved for @idle_secs. */
static void wait_workers_done(const model *m, ps_session *s, ps_client *c, watch *w,
                              double idle_secs, double join_secs) {
  int n = w->n;
  peer *p = w->p;
  double t0 = now_secs(), last_move = t0, last_log = t0, next_read = t0;
  int64_t last_step = -1;
  int done = 0, unjoined = 0, alive = 0, gone = 0;
  char unjoined_list[256] = "", gone_list[256] = "", busy_list[256] = "";
  for (;;) {
    double now = now_secs();
    if (now >= next_read) { /* heartbeats: 5 reads a second, not 50 */
      watch_read(w, c);
      now = now_secs();
      next_read = now + 0.2;
      done = unjoined = alive = gone = 0;
      unjoined_list[0] = gone_list[0] = busy_list[0] = '\0';
      for (int i = 0; i < n; i++) {
        int64_t x = p[i].beat == INT64_MIN ? 0 : p[i].beat;
        if (x == PS_COORDINATOR_HEARTBEAT_DONE) {
          done++;
        } else if (x <= 0) {
          unjoined++;
          list_add(unjoined_list, sizeof unjoined_list, p[i].task);
        } else if (now - p[i].changed >= PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS) {
          gone++;
          list_add(gone_list, sizeof gone_list, p[i].task);
        } else {
          alive++;
          list_add(busy_list, sizeof busy_list, p[i].task);
        }
      }
    }
    if (done == n) break;
    if (atomic_load(&stop_requested)) {
      PS_WARN("stopped by a signal while %d of %d other worker(s) had not reported "
              "done: going on without them",
              n - done, n);
      break;
    }
    if (unjoined > 0 && now - t0 < join_secs) {
      if (now - last_log >= 5) {
        PS_INFO("waiting up to %.0f s for %d worker(s) that have not joined yet: %s",
                join_secs, unjoined, unjoined_list);
        last_log = now;
      }
      last_move = now; /* a joining worker may still take its steps */
      nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
      continue;
    }
    if (alive == 0) {
      if (gone > 0)
        PS_WARN("%d worker(s) joined and then stopped (no heartbeat for %.0f s): going "
                "on without them (%s)",
                gone, PS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS, gone_list);
      if (unjoined > 0)
        PS_WARN("%d worker(s) did not join within %.0f s: going on without them (%s)",
                unjoined, join_secs, unjoined_list);
      break;
    }
    ps_status e;
    int64_t gs = read_step(m, s, &e);
    if (gs != last_step) {
      last_step = gs;
      last_move = now;
    }
    if (now - last_move > idle_secs) {
      PS_WARN("%d of %d other worker(s) reported done and global_step has not moved for "
              "%.0f s: going on without them (%s%s%s)",
              done, n, idle_secs, busy_list, gone ? ", " : "", gone_list);
      break;
    }
    if (now - last_log >= 5) {
      PS_INFO("waiting for %d more worker(s) to finish their last step: %s", alive,
              busy_list);
      last_log = now;
    }
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  }
}

/* Chief with --keep-ps, at the very end: the next job on these ps starts
 * without this one's heartbeats (a DONE left there would pass for one of
 * its workers that has not joined yet). */
static void clear_heartbeats(ps_client *c, const ps_cluster *cl, const ps_task_id *self) {
  int n;
  peer *p = peers_of(cl, self, &n);
  for (int i = 0; p && i < n; i++) {
    ps_status e;
    if (ps_coordinator_heartbeat_clear(c, p[i].task, &e) != 0)
      PS_WARN("could not clear %s's heartbeat on ps/0: %s", p[i].task, e.msg);
  }
  free(p);
}

/* Exit status when a ps stopped answering (--rpc-timeout): the ps may come
 * back with its state, so a scheduler may wait and rerun rather than
 * restore (sysexits' EX_UNAVAILABLE). */
#define EXIT_PS_STALLED 69

/* The chief's end-of-job wait gives up on live workers (their heartbeats
 * move) when global_step has not moved for this long: a last step slower
 * than this is taken for a worker that is stuck. */
#define DONE_IDLE_SECS 60.0

static bool recoverable(const ps_status *e) {
  if (ps_client_stalled(e)) return false; /* waiting on would be for ever */
  return e->code == PS_UNAVAILABLE || e->code == PS_FAILED_PRECONDITION ||
         e->code == PS_NOT_FOUND || e->code == PS_DEADLINE_EXCEEDED ||
         e->code == PS_ABORTED;
}

static int parse_i64(const char *flag, const char *s, int64_t min, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*s == '\0' || *end || errno || v < min) {
    fprintf(stderr, "ps-worker: %s must be an integer >= %lld, got '%s'\n", flag,
            (long long)min, s);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_f64(const char *flag, const char *s, double min, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (*s == '\0' || *end || !(v >= min) || !isfinite(v)) {
    fprintf(stderr, "ps-worker: %s must be a number >= %g, got '%s'\n", flag, min, s);
    return -1;
  }
  *out = v;
  return 0;
}

/* The option codes, in groups (apply_option). */
enum {
  O_CLUSTER = 1000,
  O_JOB,
  O_TASK,
  O_LOCAL,
  O_MODEL,
  O_DATA,
  O_HIDDEN,
  O_VOCAB,
  O_PARTS,
  O_STEPS,
  O_BATCH,
  O_OPT,
  O_LR,
  O_SEED,
  O_SYNC,
  O_REPL,
  O_LOG_EVERY,
  O_CKPT,
  O_SAVE_STEPS,
  O_SAVE_SECS,
  O_NO_FINAL,
  O_KEEP_PS,
  O_METRICS_PORT,
  O_METRICS_BIND,
  O_RESTORE,
  O_NO_RESTORE,
  O_KEEP,
  O_PS_TIMEOUT,
  O_RPC_TIMEOUT,
  O_LOG_LEVEL,
  O_LOG_FORMAT,
  O_PLACEMENT,
  O_META,
  O_HELP,
  O_VERSION,
  O_MAX_MESSAGE
};

/* Where the task is: --cluster, --job, --task, --local. */
static int cluster_option(int c, options *o) {
  int64_t v;
  switch (c) {
  case O_CLUSTER:
    o->cluster_file = optarg;
    break;
  case O_JOB:
    o->job = optarg;
    break;
  case O_TASK:
    if (parse_i64("--task", optarg, 0, &v)) return 2;
    o->task = (int)v;
    break;
  case O_LOCAL:
    o->local = true;
    break;
  }
  return 0;
}

/* What is trained and how: --model ... --seed. */
static int model_option(int c, options *o) {
  int64_t v;
  switch (c) {
  case O_MODEL:
    if (!strcmp(optarg, "linreg"))
      o->model = M_LINREG;
    else if (!strcmp(optarg, "softmax"))
      o->model = M_SOFTMAX;
    else if (!strcmp(optarg, "mlp"))
      o->model = M_MLP;
    else if (!strcmp(optarg, "wide_deep") || !strcmp(optarg, "wide-deep"))
      o->model = M_WIDE_DEEP;
    else {
      fprintf(stderr,
              "ps-worker: unknown --model '%s' (linreg, softmax, mlp, wide_deep)\n",
              optarg);
      return 2;
    }
    break;
  case O_DATA:
    o->data_dir = optarg;
    break;
  case O_HIDDEN:
    if (parse_i64("--hidden", optarg, 1, &v)) return 2;
    o->hidden = (int)v;
    break;
  case O_VOCAB:
    if (parse_i64("--vocab", optarg, 2, &o->vocab)) return 2;
    break;
  case O_PARTS:
    if (parse_i64("--embedding-parts", optarg, 1, &v)) return 2;
    o->parts = (int)v;
    break;
  case O_STEPS:
    if (parse_i64("--steps", optarg, 0, &o->steps)) return 2;
    break;
  case O_BATCH:
    if (parse_i64("--batch", optarg, 1, &o->batch)) return 2;
    break;
  case O_OPT:
    o->optimizer = optarg;
    break;
  case O_LR:
    if (parse_f64("--learning-rate", optarg, 0, &o->lr)) return 2;
    break;
  case O_SEED:
    if (parse_i64("--seed", optarg, 0, &v)) return 2;
    o->seed = (uint64_t)v;
    break;
  }
  return 0;
}

/* How the job runs: --sync ... --import-meta. */
static int run_option(int c, options *o) {
  int64_t v;
  double d;
  switch (c) {
  case O_SYNC:
    o->sync = true;
    break;
  case O_REPL:
    if (parse_i64("--replicas-to-aggregate", optarg, 1, &v)) return 2;
    o->replicas = (int)v;
    break;
  case O_LOG_EVERY:
    if (parse_i64("--log-every", optarg, 1, &o->log_every)) return 2;
    break;
  case O_CKPT:
    o->ckpt_dir = optarg;
    break;
  case O_SAVE_STEPS:
    if (parse_i64("--save-every-steps", optarg, 1, &o->save_every_steps)) return 2;
    break;
  case O_SAVE_SECS:
    if (parse_f64("--save-every-secs", optarg, 0.001, &o->save_every_secs)) return 2;
    break;
  case O_NO_FINAL:
    o->final_save = false;
    break;
  case O_KEEP_PS:
    o->keep_ps = true;
    break;
  case O_METRICS_PORT:
    if (parse_i64("--metrics-port", optarg, 0, &v)) return 2;
    if (v > 65535) {
      fprintf(stderr,
              "ps-worker: --metrics-port must be a port number 0..65535, got '%s'\n",
              optarg);
      return 2;
    }
    o->metrics_port = (int)v;
    break;
  case O_METRICS_BIND:
    o->metrics_bind = optarg;
    break;
  case O_RESTORE:
    o->restore = optarg;
    break;
  case O_NO_RESTORE:
    o->no_restore = true;
    break;
  case O_KEEP:
    if (parse_i64("--max-to-keep", optarg, -1, &v)) return 2;
    o->max_to_keep = (int)v;
    break;
  case O_PS_TIMEOUT:
    if (parse_f64("--ps-timeout", optarg, 0, &d)) return 2;
    o->ps_timeout = d;
    break;
  case O_RPC_TIMEOUT:
    if (parse_f64("--rpc-timeout", optarg, 0.001, &d)) return 2;
    if (d > 31536000) {
      fprintf(stderr, "ps-worker: --rpc-timeout must be at most 31536000 s, got '%s'\n",
              optarg);
      return 2;
    }
    o->sec.rpc_timeout_ms = (int64_t)(d * 1000 + 0.5);
    break;
  case O_LOG_LEVEL:
    if (ps_log_level_option("ps-worker", optarg) != 0) return 2;
    break;
  case O_LOG_FORMAT:
    if (ps_log_format_option("ps-worker", optarg) != 0) return 2;
    break;
  case O_META:
    o->meta = optarg;
    break;
  case O_PLACEMENT:
    if (strcmp(optarg, "round_robin") && strcmp(optarg, "greedy")) {
      fprintf(stderr, "ps-worker: unknown --placement '%s' (round_robin, greedy)\n",
              optarg);
      return 2;
    }
    o->greedy = !strcmp(optarg, "greedy");
    break;
  }
  return 0;
}

/* 0, 1 (--help or --version: exit 0) or 2 (a usage error). */
static int apply_option(int c, options *o) {
  if (c >= O_CLUSTER && c < O_MODEL) return cluster_option(c, o);
  if (c >= O_MODEL && c < O_SYNC) return model_option(c, o);
  if (c >= O_SYNC && c < O_HELP) return run_option(c, o);
  if (c == O_HELP) {
    fputs(usage, stdout);
    return 1;
  }
  if (c == O_VERSION) {
    printf("ps-worker %s\n", PS_VERSION);
    return 1;
  }
  fputs(usage, stderr);
  return 2;
}

static int parse_args(int argc, char **argv, options *o) {
  static const struct option opts[] = {
      {"cluster", required_argument, NULL, O_CLUSTER},
      {"job", required_argument, NULL, O_JOB},
      {"task", required_argument, NULL, O_TASK},
      {"local", no_argument, NULL, O_LOCAL},
      {"model", required_argument, NULL, O_MODEL},
      {"data-dir", required_argument, NULL, O_DATA},
      {"hidden", required_argument, NULL, O_HIDDEN},
      {"vocab", required_argument, NULL, O_VOCAB},
      {"embedding-parts", required_argument, NULL, O_PARTS},
      {"steps", required_argument, NULL, O_STEPS},
      {"batch", required_argument, NULL, O_BATCH},
      {"optimizer", required_argument, NULL, O_OPT},
      {"learning-rate", required_argument, NULL, O_LR},
      {"seed", required_argument, NULL, O_SEED},
      {"sync", no_argument, NULL, O_SYNC},
      {"replicas-to-aggregate", required_argument, NULL, O_REPL},
      {"log-every", required_argument, NULL, O_LOG_EVERY},
      {"checkpoint-dir", required_argument, NULL, O_CKPT},
      {"save-every-steps", required_argument, NULL, O_SAVE_STEPS},
      {"save-every-secs", required_argument, NULL, O_SAVE_SECS},
      {"no-final-save", no_argument, NULL, O_NO_FINAL},
      {"keep-ps", no_argument, NULL, O_KEEP_PS},
      {"metrics-port", required_argument, NULL, O_METRICS_PORT},
      {"metrics-bind", required_argument, NULL, O_METRICS_BIND},
      {"restore", required_argument, NULL, O_RESTORE},
      {"no-restore", no_argument, NULL, O_NO_RESTORE},
      {"max-to-keep", required_argument, NULL, O_KEEP},
      {"ps-timeout", required_argument, NULL, O_PS_TIMEOUT},
      {"rpc-timeout", required_argument, NULL, O_RPC_TIMEOUT},
      {"log-level", required_argument, NULL, O_LOG_LEVEL},
      {"log-format", required_argument, NULL, O_LOG_FORMAT},
      {"placement", required_argument, NULL, O_PLACEMENT},
      {"import-meta", required_argument, NULL, O_META},
      {"help", no_argument, NULL, O_HELP},
      {"version", no_argument, NULL, O_VERSION},
      {"max-message-bytes", required_argument, NULL, O_MAX_MESSAGE},
      PS_SECURITY_OPTIONS,
      {NULL, 0, NULL, 0}};
  ps_client_options_default(&o->sec);
  o->task = -1;
  o->model = M_MLP;
  o->steps = -1;
  o->batch = 100;
  o->log_every = 100;
  o->hidden = 128;
  o->vocab = 10000;
  o->seed = 1;
  o->final_save = true;
  o->lr = -1;
  o->max_to_keep = 5;
  o->metrics_port = -1;
  int c, rc;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
    if (c == O_MAX_MESSAGE) {
      if ((rc = ps_max_message_bytes_option("ps-worker", optarg,
                                            &o->sec.max_message_bytes)) != 0)
        return rc;
    } else if (!ps_security_option(c, optarg, &o->sec) &&
               (rc = apply_option(c, o)) != 0) {
      return rc;
    }
  if (optind < argc) {
    fprintf(stderr, "ps-worker: unexpected argument '%s'\n%s", argv[optind], usage);
    return 2;
  }
  if (o->metrics_bind && o->metrics_port < 0) {
    fprintf(stderr, "ps-worker: --metrics-bind needs --metrics-port\n");
    return 2;
  }
  static const struct {
    int64_t steps;
    const char *opt;
    double lr;
  } defaults[] = {{1000, "sgd", 0.1},
                  {1500, "adam", 0.001},
                  {2000, "adam", 0.001},
                  {2000, "adagrad", 0.1}};
  if (o->steps < 0) o->steps = defaults[o->model].steps;
  if (o->optimizer == NULL) o->optimizer = defaults[o->model].opt;
  if (o->lr < 0) o->lr = defaults[o->model].lr;
  return 0;
}

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

/* The cluster and this task's place in it (--local: none); 0 or 2. */
static int resolve_cluster(job *j, ps_status *st) {
  j->self = (ps_task_id){.job = "local", .task = 0};
  j->chief = true;
  j->num_workers = 1;
  if (j->o.local) return 0;
  const char *name = j->o.job;
  int task = j->o.task;
  if (j->o.cluster_file && name == NULL) name = "worker";
  if (name != NULL && task < 0) task = 0;
  j->cluster = ps_cluster_resolve(j->o.cluster_file, name, task, &j->self, st);
  if (j->cluster == NULL) {
    fprintf(stderr, "ps-worker: %s\n", st->msg);
    return 2;
  }
  j->evaluator = !strcmp(j->self.job, "evaluator");
  if (strcmp(j->self.job, "chief") != 0 && strcmp(j->self.job, "worker") != 0 &&
      !j->evaluator) {
    fprintf(
        stderr,
        "ps-worker: this task is %s/%d in the cluster spec, but ps-worker runs chief, "
        "worker and evaluator tasks%s\n",
        j->self.job, j->self.task,
        !strcmp(j->self.job, "ps") ? " (a ps task runs ps-server)" : "");
    return 2;
  }
  if (j->evaluator && j->o.ckpt_dir == NULL) {
    fprintf(stderr, "ps-worker: an evaluator needs --checkpoint-dir, the directory the "
                    "chief's checkpoints appear in\n");
    return 2;
  }
  if (ps_cluster_num_tasks(j->cluster, "ps") < 1) {
    fprintf(stderr, "ps-worker: the cluster spec has no ps job (use --local to train "
                    "in one process)\n");
    return 2;
  }
  ps_task_id ch;
  j->chief = ps_cluster_chief(j->cluster, &ch) == 0 && !strcmp(ch.job, j->self.job) &&
             ch.task == j->self.task;
  /* the tasks the spec lists (a sparse spec has holes), and this one's
   * place among them: its data shard */
  int nchief = ps_cluster_num_listed(j->cluster, "chief");
  j->num_workers = nchief + ps_cluster_num_listed(j->cluster, "worker");
  j->worker_index = 0;
  if (strcmp(j->self.job, "chief") != 0) {
    j->worker_index = nchief;
    for (int t = 0; t < j->self.task; t++)
      j->worker_index += ps_cluster_address(j->cluster, "worker", t) != NULL;
  }
  return 0;
}

/* Data, client, model, saver, session, and the coordinator's start-up;
 * then the iterator over this worker's share of the training data. */
/* ---- the evaluator (TensorFlow's: outside the training, reading
 * checkpoints) ---- */

/* One assign per global variable, fed from a checkpoint file. */
typedef struct eval_vars {
  size_t n;
  ps_variable **v;
  ps_node **in, **assign;
} eval_vars;
static eval_vars EV;

static int set_up_evaluator(job *j, ps_status *st) {
  const options *o = &j->o;
  if (o->meta || o->model == M_WIDE_DEEP) {
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "an evaluator builds linreg, softmax or mlp in code (not "
                         "--import-meta, not partitioned wide_deep)");
  }
  /* the model with its variables in this process: no ps is touched */
  if (build_model(o, NULL, 0, &j->m, st)) return -1;
  ps_variable *const *gv = ps_collection_variables(j->m.g, PS_GLOBAL_VARIABLES, &EV.n);
  EV.v = calloc(EV.n + 1, sizeof *EV.v);
  EV.in = calloc(EV.n + 1, sizeof *EV.in);
  EV.assign = calloc(EV.n + 1, sizeof *EV.assign);
  if (!EV.v || !EV.in || !EV.assign)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  memcpy(EV.v, gv, EV.n * sizeof *EV.v);
  for (size_t i = 0; i < EV.n; i++) {
    EV.in[i] = ps_placeholder(j->m.g, ps_variable_dtype(EV.v[i]),
                              ps_variable_shape(EV.v[i]), NULL);
    EV.assign[i] = ps_assign(EV.v[i], EV.in[i]);
    if (EV.assign[i] == NULL)
      return ps_status_set(st, ps_graph_status(j->m.g)->code, "%s",
                           ps_graph_status(j->m.g)->msg);
  }
  if ((j->s = ps_session_create(j->m.g, NULL, st)) == NULL) return -1;
  PS_INFO("%s model: evaluating each new checkpoint in %s", model_name(o->model),
          o->ckpt_dir);
  return 0;
}

/* Loads @prefix (a path) into the evaluator's variables. */
static int load_checkpoint(job *j, const char *prefix, ps_status *st) {
  ps_bundle_reader *r = ps_bundle_reader_open(prefix, st);
  if (r == NULL) return st->code;
  ps_feed *f = calloc(EV.n + 1, sizeof *f);
  ps_tensor **t = calloc(EV.n + 1, sizeof *t);
  int rc = f && t ? 0 : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < EV.n && rc == 0; i++) {
    const char *name = ps_variable_name(EV.v[i]);
    if ((t[i] = ps_tensor_create(ps_variable_dtype(EV.v[i]), ps_variable_shape(EV.v[i]),
                                 false)) == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    rc = ps_bundle_reader_read_into(r, name, ps_tensor_data(t[i]), ps_tensor_nbytes(t[i]),
                                    st);
    if (rc != 0) ps_status_prefix(st, "checkpoint %s, variable %s", prefix, name);
    f[i] = (ps_feed){EV.in[i], t[i]};
  }
  if (rc == 0) rc = ps_session_run(j->s, f, EV.n, NULL, 0, EV.assign, EV.n, NULL, st);
  for (size_t i = 0; t && i < EV.n; i++)
    ps_tensor_destroy(t[i]);
  free(t);
  free(f);
  ps_bundle_reader_close(r);
  return rc;
}

/* Evaluates each new checkpoint of --checkpoint-dir as it appears, until
 * one reaches --steps or a signal; trains nothing and touches no ps. */
static int evaluate_loop(job *j, ps_status *st) {
  const options *o = &j->o;
  char *last = NULL;
  int rc = 0;
  while (!atomic_load(&stop_requested)) {
    char *latest = NULL;
    ps_status e;
    if (ps_latest_checkpoint(o->ckpt_dir, &latest, &e) == 0 && latest &&
        (last == NULL || strcmp(last, latest) != 0)) {
      double metric;
      if ((rc = load_checkpoint(j, latest, st)) != 0 ||
          (rc = evaluate(&j->m, j->s, &j->test, &metric, st)) != 0 ||
          (j->gs = read_step(&j->m, j->s, st)) < 0) {
        free(latest);
        rc = rc ? rc : st->code;
        break;
      }
      const char *what = j->m.classifier ? "accuracy" : "mse";
      PS_INFO("evaluated %s: global step %lld, test %s %.4f", latest, (long long)j->gs,
              what, metric);
      printf("evaluated %s global step %lld test %s %.4f\n", latest, (long long)j->gs,
             what, metric);
      fflush(stdout);
      free(last);
      last = latest;
      if (j->gs >= o->steps) break;
      continue;
    }
    free(latest);
    for (int k = 0; k < 20 && !atomic_load(&stop_requested); k++)
      usleep(50000);
  }
  free(last);
  return rc;
}

static int set_up_evaluator(job *j, ps_status *st);

static int set_up(job *j, ps_status *st) {
  const options *o = &j->o;
  if (load_data(o, &j->train, &j->test, st)) return -1;
  if (j->evaluator) return set_up_evaluator(j, st);
  if (j->cluster) {
    ps_library_init();
    j->rpc_up = true;
    if (j->chief) ps_security_admin_token(&j->o.sec, j->cluster);
    if ((j->client = ps_client_create(j->cluster, "ps", &j->o.sec, st)) == NULL)
      return -1;
    /* heartbeats, their reads and the done mark: bounded when ps/0 does
     * not answer (the data deadline is 300 s) */
    ps_client_options ho = j->o.sec;
    ho.control_timeout_ms = ho.data_timeout_ms = PS_COORDINATOR_HEARTBEAT_CALL_MS;
    ho.max_retries = 1;
    if ((j->hbc = ps_client_create(j->cluster, "ps", &ho, st)) == NULL) return -1;
  }
  if (o->meta) {
    if (import_model(o->meta, &j->m, &j->saver, st)) return -1;
    PS_INFO("graph imported from %s (%zu nodes)", o->meta, ps_graph_num_nodes(j->m.g));
  } else {
    if (build_model(o, j->cluster, j->client ? ps_client_num_ps(j->client) : 0, &j->m,
                    st))
      return -1;
    /* ps-worker owns its checkpoint directory: retention over its list,
     * across restarts (tf.train.CheckpointManager's way) */
    ps_saver_options so = {.max_to_keep = o->max_to_keep, .directory_retention = true};
    if ((j->saver = ps_saver_create(j->m.g, &so, st)) == NULL) return -1;
  }
  if ((j->s = ps_session_create(j->m.g, j->client, st)) == NULL) return -1;
  PS_INFO("%s model%s, %d worker(s), this one %s%s", model_name(o->model),
          o->sync ? " (synchronous)" : "", j->num_workers,
          j->chief ? "the chief" : "not the chief", o->local ? " (local variables)" : "");
  j->co = (ps_coordinator_options){.is_chief = j->chief,
                                   .ps_timeout_secs = o->ps_timeout,
                                   .restore_prefix = o->restore,
                                   .no_restore = o->no_restore,
                                   .saver = j->saver};
  ps_coordinator_outcome outcome;
  if (ps_coordinator_prepare(j->s, &j->co, &outcome, st)) return -1;
  if (!j->chief && j->client) { /* the chief waits for joined workers at the end */
    char me[PS_CLUSTER_MAX_JOB_NAME + 16];
    snprintf(me, sizeof me, "%s/%d", j->self.job, j->self.task);
    if ((j->hb = ps_coordinator_heartbeat_start(j->hbc, me, st)) == NULL) return -1;
  }
  if (j->chief && j->client && j->num_workers > 1 &&
      (j->watch = watch_new(j->cluster, &j->self)) == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  if ((j->gs = read_step(&j->m, j->s, st)) < 0) return -1;
  PS_INFO("cluster ready (%s) at global step %lld; training to step %lld",
          ps_coordinator_outcome_name(outcome), (long long)j->gs, (long long)o->steps);
  ps_dataset_iter_options io = {.batch_size = o->batch,
                                .shuffle = true,
                                .seed = o->seed * 1000003u + (uint64_t)j->worker_index,
                                .task = j->worker_index,
                                .num_tasks = j->num_workers};
  if ((j->it = ps_dataset_iter_create(&j->train, &io, st)) == NULL) return -1;
  return 0;
}

/* After a failed step that may pass (a ps restarted or went away): a new
 * session, and the coordinator restores or re-joins. */
static int recover(job *j, const ps_status *e, ps_status *st) {
  PS_WARN("step failed (%s); waiting for the cluster to recover", e->msg);
  ps_session_destroy(j->s);
  if ((j->s = ps_session_create(j->m.g, j->client, st)) == NULL) return -1;
  ps_coordinator_outcome outcome;
  if (ps_coordinator_prepare(j->s, &j->co, &outcome, st)) return -1;
  PS_INFO("recovered (%s)", ps_coordinator_outcome_name(outcome));
  /* (a restarted ps/0 lost this worker's heartbeat: its next beat makes it
   * again) */
  return 0;
}

/* Steps until global_step reaches --steps or a signal: logs every
 * --log-every steps; the chief saves on schedule. */
/* The worker's Prometheus page (--metrics-port). */
static void render_metrics(ps_mbuf *b, void *arg) {
  job *j = arg;
  ps_mbuf_family(b, "ps_worker_steps_total", "counter",
                 "Training steps this worker ran.");
  ps_mbuf_printf(b, "ps_worker_steps_total %lld\n", (long long)atomic_load(&j->m_steps));
  ps_mbuf_family(b, "ps_worker_examples_total", "counter",
                 "Examples this worker trained on.");
  ps_mbuf_printf(b, "ps_worker_examples_total %lld\n",
                 (long long)atomic_load(&j->m_examples));
  ps_mbuf_family(b, "ps_worker_examples_per_second", "gauge",
                 "Examples per second over the last progress interval.");
  ps_mbuf_printf(b, "ps_worker_examples_per_second %.3f\n",
                 atomic_load(&j->m_examples_per_sec));
  ps_mbuf_family(b, "ps_worker_global_step", "gauge",
                 "The global step after its last step.");
  ps_mbuf_printf(b, "ps_worker_global_step %lld\n",
                 (long long)atomic_load(&j->m_global_step));
  ps_mbuf_family(b, "ps_worker_loss", "gauge", "The loss of its last step.");
  ps_mbuf_printf(b, "ps_worker_loss %.6g\n", atomic_load(&j->m_loss));
  if (j->client == NULL) return;
  int n = ps_client_num_ps(j->client);
  ps_mbuf_family(b, "ps_worker_ps_calls_total", "counter", "Calls to each ps task.");
  for (int t = 0; t < n; t++) {
    unsigned long long calls;
    double secs;
    ps_client_task_stats(j->client, t, &calls, &secs);
    ps_mbuf_printf(b, "ps_worker_ps_calls_total{ps=\"ps/%d\"} %llu\n", t, calls);
  }
  ps_mbuf_family(b, "ps_worker_ps_wait_seconds_total", "counter",
                 "Seconds this worker waited for calls to each ps task.");
  for (int t = 0; t < n; t++) {
    unsigned long long calls;
    double secs;
    ps_client_task_stats(j->client, t, &calls, &secs);
    ps_mbuf_printf(b, "ps_worker_ps_wait_seconds_total{ps=\"ps/%d\"} %.6f\n", t, secs);
  }
  ps_mbuf_family(b, "ps_worker_ps_unanswered_seconds", "gauge",
                 "Seconds the calls waiting on each ps task have heard nothing from it "
                 "(0: answering); at --rpc-timeout the worker fails.");
  for (int t = 0; t < n; t++)
    ps_mbuf_printf(b, "ps_worker_ps_unanswered_seconds{ps=\"ps/%d\"} %.3f\n", t,
                   ps_client_task_unanswered_secs(j->client, t));
  ps_mbuf_family(b, "ps_worker_rpc_timeout_seconds", "gauge",
                 "--rpc-timeout: the silence of a ps after which the worker fails.");
  ps_mbuf_printf(b, "ps_worker_rpc_timeout_seconds %.3f\n",
                 (double)ps_client_rpc_timeout_ms(j->client) / 1000);
}

static int train_loop(job *j, ps_status *st) {
  const options *o = &j->o;
  ps_node *fetch[2] = {j->m.loss, ps_variable_value(j->m.step)};
  double t0 = now_secs(), tlog = t0, last_save_t = t0, loss_sum = 0;
  int64_t since_log = 0, last_save_step = j->gs;
  int recoveries = 0;
  while (j->gs < o->steps && !atomic_load(&stop_requested)) {
    if (ps_dataset_iter_next(j->it, &j->batch, st)) return -1;
    ps_feed f[4];
    size_t nf = feeds_of(&j->m, &j->batch, f);
    ps_tensor *out[2] = {NULL, NULL};
    ps_status e;
    if (ps_session_run(j->s, f, nf, fetch, 2, &j->m.train, 1, out, &e) != 0) {
      if (!recoverable(&e) || ++recoveries > 10) {
        *st = e;
        return -1;
      }
      if (recover(j, &e, st)) return -1;
      continue;
    }
    j->trained = true;
    if (j->watch && now_secs() >= j->watch->next_read) { /* once a second */
      watch_read(j->watch, j->hbc);
      j->watch->next_read = now_secs() + PS_COORDINATOR_HEARTBEAT_SECS;
    }
    double loss = *(float *)ps_tensor_data(out[0]);
    j->gs = *(int64_t *)ps_tensor_data(out[1]) + 1;
    ps_tensor_destroy(out[0]);
    ps_tensor_destroy(out[1]);
    j->local++;
    since_log++;
    loss_sum += loss;
    atomic_fetch_add(&j->m_steps, 1);
    atomic_fetch_add(&j->m_examples, o->batch);
    atomic_store(&j->m_global_step, j->gs);
    atomic_store(&j->m_loss, loss);
    double now = now_secs();
    if (since_log == o->log_every) {
      PS_INFO("step %lld loss %.4f examples/s %.0f", (long long)j->gs,
              loss_sum / (double)since_log,
              (double)(since_log * o->batch) / (now - tlog));
      atomic_store(&j->m_examples_per_sec, (double)(since_log * o->batch) / (now - tlog));
      since_log = 0;
      loss_sum = 0;
      tlog = now;
    }
    if (j->chief && j->client &&
        ((o->save_every_steps && j->gs - last_save_step >= o->save_every_steps) ||
         (o->save_every_secs > 0 && now - last_save_t >= o->save_every_secs))) {
      ps_status se;
      if (ps_saver_save_at_step(j->saver, j->s, "model.ckpt", j->m.step, o->ckpt_dir,
                                NULL, &j->saved_step, &se) != 0)
        PS_WARN("periodic save failed: %s", se.msg);
      last_save_step = j->gs;
      last_save_t = now_secs();
    }
  }
  double secs = now_secs() - t0;
  if (j->local)
    PS_INFO("trained %lld local steps in %.1f s: %.0f examples/s", (long long)j->local,
            secs, (double)(j->local * o->batch) / secs);
  if (atomic_load(&stop_requested))
    PS_WARN("stopped by a signal at global step %lld", (long long)j->gs);
  return 0;
}

/* The job is over (the other workers reported done or are gone, the
 * final checkpoint is written, or the chief's last phase failed): every ps
 * task stops, so that the job's allocation ends.  A ps that does not
 * answer is only logged.  @failed: what failed, or NULL. */
static void shutdown_ps(job *j, const char *failed) {
  int n = ps_client_num_ps(j->client), ok = 0;
  for (int t = 0; t < n; t++) {
    ps_status e;
    if (ps_client_shutdown(j->client, t,
                           failed ? "the chief's job failed" : "the chief's job is done",
                           &e) == 0)
      ok++;
    else
      PS_WARN("ps/%d (%s) did not take the shutdown: %s", t,
              ps_client_address(j->client, t), e.msg);
  }
  if (failed)
    PS_WARN("job failed (%s): %d of %d ps task(s) shutting down all the same, so the "
            "allocation ends (--keep-ps keeps them)",
            failed, ok, n);
  else
    PS_INFO("job done: %d of %d ps task(s) shutting down (--keep-ps keeps them)", ok, n);
}

/* The chief's last phase: wait for the others, the final save, the test
 * metric.  @failed is set to what failed when it returns -1. */
static int finish_chief(job *j, const char **failed, ps_status *st) {
  const options *o = &j->o;
  *failed = "reading global_step";
  /* (also when this chief took no step: a job restored at --steps or past
   * it.  The others, still waiting for readiness, join, find it done and
   * report so; shut down under them, they would wait for ps that are gone) */
  if (j->client && j->watch)
    wait_workers_done(&j->m, j->s, j->hbc, j->watch, DONE_IDLE_SECS,
                      o->keep_ps ? 0 : 60.0);
  if ((j->gs = read_step(&j->m, j->s, st)) < 0) return -1;
  bool saving = o->ckpt_dir || o->save_every_steps || o->save_every_secs > 0;
  /* With other workers, a periodic save at this very step may still have
   * missed a step's update on another ps (a step's updates go to every ps
   * at once, the global step's too): now that they are done, save again. */
  if (j->client && saving && o->final_save && j->trained &&
      (j->saved_step != j->gs || j->num_workers > 1)) {
    char *path = NULL;
    /* named by the step it holds: another worker may step until the save's
     * snapshot (stopped by a signal, they all are at once) */
    if (ps_saver_save_at_step(j->saver, j->s, "model.ckpt", j->m.step, o->ckpt_dir, &path,
                              &j->gs, st) != 0) {
      *failed = "the final save failed";
      ps_status_prefix(st, "final save of model.ckpt at global step %lld",
                       (long long)j->gs);
      return -1;
    }
    printf("checkpoint %s\n", path);
    free(path);
  }
  double metric;
  if (evaluate(&j->m, j->s, &j->test, &metric, st)) {
    *failed = "the evaluation failed";
    return -1;
  }
  const char *what = j->m.classifier ? "accuracy" : "mse";
  PS_INFO("global step %lld: test %s %.4f", (long long)j->gs, what, metric);
  printf("global step %lld\ntest %s %.4f\n", (long long)j->gs, what, metric);
  fflush(stdout);
  return 0;
}

/* The end of the job: workers report done; the chief waits for them,
 * saves a final checkpoint, evaluates on the test set and shuts the ps
 * down (unless --keep-ps or a signal stopped it), also when the save or
 * the evaluation failed: the job is over either way, and ps left running
 * would hold the allocation until its time limit. */
static int finish(job *j, ps_status *st) {
  const options *o = &j->o;
  if (!j->chief) {
    ps_coordinator_heartbeat *hb = j->hb;
    j->hb = NULL;
    if (ps_coordinator_heartbeat_stop(hb, true, st) == 0) return 0;
    if (!atomic_load(&stop_requested)) return -1;
    /* stopped by a signal: the mark is best effort (the chief, stopped
     * too, does not wait; one that does finds the heartbeat standing) */
    PS_WARN("%s", st->msg);
    return 0;
  }
  const char *failed = NULL;
  int rc = finish_chief(j, &failed, st);
  if (j->client && !o->keep_ps && !atomic_load(&stop_requested)) {
    ps_status de;
    /* a worker still waiting for readiness sees it and ends with 0 */
    if (rc == 0 && ps_coordinator_mark_done(j->client, &de) != 0) PS_WARN("%s", de.msg);
    shutdown_ps(j, rc ? failed : NULL);
  } else if (j->client && o->keep_ps && j->num_workers > 1)
    clear_heartbeats(j->hbc, j->cluster, &j->self);
  return rc;
}

/* A non-chief worker that could not go on (its start-up or a recovery
 * ended): is the job already done?  The chief marked it done on ps/0
 * (PS_COORDINATOR_DONE_MSG), or the ps are gone (UNAVAILABLE) and the
 * latest checkpoint of --checkpoint-dir holds --steps. */
static bool found_job_done(job *j, const ps_status *st) {
  if (j->chief || j->evaluator || j->m.step == NULL) return false;
  if (ps_coordinator_job_done(st)) {
    PS_INFO("%s (--steps %lld)", st->msg, (long long)j->o.steps);
    return true;
  }
  if (st->code != PS_UNAVAILABLE || j->o.ckpt_dir == NULL) return false;
  char *latest = NULL;
  ps_status e;
  int64_t step = -1;
  if (ps_latest_checkpoint(j->o.ckpt_dir, &latest, &e) == 0 && latest) {
    ps_bundle_reader *r = ps_bundle_reader_open(latest, &e);
    if (r && ps_bundle_reader_read_into(r, ps_variable_name(j->m.step), &step,
                                        sizeof step, &e) != 0)
      step = -1;
    ps_bundle_reader_close(r);
  }
  bool done = step >= j->o.steps;
  if (done)
    PS_INFO("the ps went away (%s), and the latest checkpoint %s holds global step %lld "
            "of --steps %lld: the job is done",
            st->msg, latest, (long long)step, (long long)j->o.steps);
  free(latest);
  return done;
}

/* Whether a restart of the chief may get past @e: the ps did not answer
 * in time or went away (a restarted chief, e.g. under Kubernetes'
 * restartPolicy, finds them back with their state), or a signal stopped
 * it.  Anything else (a --restore path that does not exist, a checkpoint
 * or graph that does not fit, bad data) fails the same way again. */
static bool restart_may_fix(const ps_status *e) {
  return e->code == PS_UNAVAILABLE || e->code == PS_DEADLINE_EXCEEDED ||
         e->code == PS_ABORTED || e->code == PS_CANCELLED;
}

/* The chief failed before its last phase (set-up or training, @phase):
 * when a restart cannot fix it, the job is over, so the ps are shut down
 * as at the end of a job (unless --keep-ps or a signal), and the job's
 * allocation ends; on a transient failure they are left running for the
 * chief's restart, which finds them live. */
static void chief_failed(job *j, const char *phase, const ps_status *e) {
  if (!j->chief || j->cluster == NULL || j->o.keep_ps || atomic_load(&stop_requested))
    return;
  if (restart_may_fix(e)) {
    PS_WARN("the ps are left running: a restarted chief may get past this %s failure "
            "(%s) and finds them live",
            phase, ps_status_code_name(e->code));
    return;
  }
  if (j->client == NULL) { /* failed before its client existed (bad data) */
    ps_status ce;
    if (!j->rpc_up) {
      ps_library_init();
      j->rpc_up = true;
      ps_security_admin_token(&j->o.sec, j->cluster);
    }
    if ((j->client = ps_client_create(j->cluster, "ps", &j->o.sec, &ce)) == NULL) {
      PS_WARN("cannot shut the ps down: %s", ce.msg);
      return;
    }
  }
  char why[96];
  snprintf(why, sizeof why, "the %s failed (%s), a restart would fail again", phase,
           ps_status_code_name(e->code));
  shutdown_ps(j, why);
}

static void job_free(job *j) {
  ps_metrics_stop(j->metrics); /* before what its page reads is freed */
  ps_status hbe;
  if (ps_coordinator_heartbeat_stop(j->hb, false, &hbe) != 0) PS_WARN("%s", hbe.msg);
  free(EV.v);
  free(EV.in);
  free(EV.assign);
  ps_dataset_iter_destroy(j->it);
  ps_dataset_free(&j->batch);
  ps_dataset_free(&j->train);
  ps_dataset_free(&j->test);
  ps_session_destroy(j->s);
  ps_saver_destroy(j->saver);
  ps_graph_destroy(j->m.g);
  watch_free(j->watch);
  ps_client_destroy(j->hbc);
  ps_client_destroy(j->client);
  ps_cluster_destroy(j->cluster);
  if (j->rpc_up) ps_library_shutdown();
}

int main(int argc, char **argv) {
  job j = {.saved_step = -1};
  int prc = parse_args(argc, argv, &j.o);
  if (prc) return prc == 1 ? 0 : 2;
  ps_status st;
  ps_status_clear(&st);
  if (resolve_cluster(&j, &st) != 0) {
    ps_cluster_destroy(j.cluster);
    return 2;
  }
  char taskname[96];
  snprintf(taskname, sizeof taskname, "%s/%d", j.self.job, j.self.task);
  ps_log_set_task(taskname);
  if (j.o.replicas == 0) j.o.replicas = j.num_workers;
  j.o.num_workers = j.num_workers;
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  int rc = 0;
  int up = set_up(&j, &st);
  if (up == 0 && j.o.metrics_port >= 0) {
    if ((j.metrics = ps_metrics_start(j.o.metrics_bind, j.o.metrics_port, render_metrics,
                                      &j, &st)) == NULL) {
      ps_status_prefix(&st, "--metrics-port %d", j.o.metrics_port);
      up = -1;
    } else {
      PS_INFO("metrics on port %d of %s (GET /metrics)", ps_metrics_port(j.metrics),
              ps_metrics_host(j.metrics));
    }
  }
  if (up != 0 && st.code == PS_CANCELLED && atomic_load(&stop_requested)) {
    /* SIGTERM before training started: nothing to save, a clean stop */
    PS_WARN("stopped by a signal before training: %s", st.msg);
  } else if (up == 0 && j.evaluator) {
    if (evaluate_loop(&j, &st) != 0) {
      PS_ERROR("%s", st.msg);
      fprintf(stderr, "ps-worker: %s\n", st.msg);
      rc = 1;
    }
  } else if (up != 0 || train_loop(&j, &st) != 0) {
    if (!found_job_done(&j, &st)) {
      PS_ERROR("%s", st.msg);
      fprintf(stderr, "ps-worker: %s\n", st.msg);
      rc = ps_client_stalled(&st) ? EXIT_PS_STALLED : 1;
      chief_failed(&j, up != 0 ? "set-up" : "training", &st);
    }
  } else if (finish(&j, &st) != 0 && !found_job_done(&j, &st)) {
    PS_ERROR("%s", st.msg);
    fprintf(stderr, "ps-worker: %s\n", st.msg);
    rc = ps_client_stalled(&st) ? EXIT_PS_STALLED : 1;
  }
  /* Stopped by SIGTERM/SIGINT before --steps (a time limit, scancel): the
   * final checkpoint is saved, but the job is not done, so 128 + the
   * signal's number (143 for SIGTERM) tells the scheduler to resume it. */
  int sig = atomic_load(&stop_requested);
  if (rc == 0 && sig != 0 && !j.evaluator && j.gs < j.o.steps) {
    PS_WARN(
        "exit %d: stopped by signal %d at global step %lld of %lld; resubmit to resume",
        128 + sig, sig, (long long)j.gs, (long long)j.o.steps);
    rc = 128 + sig;
  }
  job_free(&j);
  return rc;
}
