/* ps-worker's built-in models (linreg, softmax, mlp, wide_deep, ctr):
 * their graphs (built, or imported from a MetaGraph), their data, and the
 * test metric (ctr: also AUC and log loss against the best achievable). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "paramserver/embedding.h"
#include "paramserver/ops.h"
#include "paramserver/optimizer.h"
#include "paramserver/partition.h"
#include "ps_worker_internal.h"

const char *ps_worker_model_name_(model_kind k) {
  static const char *names[] = {"linreg", "softmax", "mlp", "wide_deep", "ctr"};
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
  if (opt && o->bf16_gradients) {
    if (ps_optimizer_set_gradient_dtype(opt, PS_DT_BFLOAT16, st) != 0) {
      ps_optimizer_destroy(opt);
      return NULL;
    }
    PS_INFO("gradients go to the ps as bfloat16 (--gradient-dtype)%s",
            o->local ? ": ignored with --local, nothing goes to a ps" : "");
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

int ps_worker_build_model_(const options *o, const ps_cluster *cluster, int nps, model *m,
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
  case M_CTR: {
    /* a small DLRM: hash-keyed embedding tables on the ps (deep: 8 per key,
     * wide: a weight per key and class), the dense features, an MLP */
    m->classifier = true;
    int nf = o->ctr_data ? PS_DATASET_CRITEO_FIELDS : PS_CTR_FIELDS;
    int nd = o->ctr_data ? PS_DATASET_CRITEO_DENSE : PS_DATASET_CTR_DENSE;
    const int emb = 8;
    m->ids = ps_placeholder(g, PS_DT_INT64, &(ps_shape){2, {-1, nf}}, "ids");
    m->dense = ps_placeholder(g, PS_DT_FLOAT, &(ps_shape){2, {-1, nd}}, "dense");
    m->y = ps_placeholder(g, PS_DT_INT64, &(ps_shape){1, {-1}}, "y");
    ps_table_optimizer to = !strcmp(o->optimizer, "adagrad") ? PS_TABLE_ADAGRAD
                            : !strcmp(o->optimizer, "adam")  ? PS_TABLE_ADAM
                                                             : PS_TABLE_SGD;
    ps_table_policy pol = {.min_count = o->table_min_count,
                           .ttl_steps = o->table_ttl_steps,
                           .max_rows = o->table_max_rows};
    ps_table_spec es, ws;
    ps_table_spec_default(&es, "ctr/embeddings", emb);
    es.init.stddev = 0.05;
    es.init.seed = (int64_t)o->seed;
    es.optimizer = to;
    es.policy = pol;
    ps_table_spec_default(&ws, "ctr/wide", 2);
    ps_init_spec_default(&ws.init, PS_INIT_ZEROS);
    ws.optimizer = to;
    ws.policy = pol;
    ps_embedding_table *et = ps_get_embedding_table(g, &es, st);
    ps_embedding_table *wt = et ? ps_get_embedding_table(g, &ws, st) : NULL;
    if (wt == NULL) return st->code;
    ps_node *step = ps_variable_value(m->step);
    ps_node *e = ps_embedding_table_lookup(et, m->ids, step);
    ps_node *cat[2] = {ps_reshape(e, &(ps_shape){2, {-1, nf * emb}}), m->dense};
    ps_node *h = ps_relu(
        dense_layer(g, "ctr/hidden", ps_concat(cat, 2, 1), nf * emb + nd, o->hidden, st));
    ps_node *deep = dense_layer(g, "ctr/logits", h, o->hidden, 2, st);
    ps_node *wsum = ps_reduce_sum(ps_embedding_table_lookup(wt, m->ids, step), 1, false);
    logits = ps_add(deep, wsum);
    /* P(click) = sigmoid(logit 1 - logit 0) */
    ps_shape s21 = {2, {2, 1}};
    ps_tensor *d = ps_tensor_create(PS_DT_FLOAT, &s21, false);
    if (d == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    ((float *)ps_tensor_data(d))[0] = -1;
    ((float *)ps_tensor_data(d))[1] = 1;
    ps_node *diff = ps_matmul(logits, ps_constant(g, d, "class_diff"), false, false);
    ps_tensor_destroy(d);
    m->prob = ps_reshape(ps_sigmoid(diff), &(ps_shape){1, {-1}});
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
                         ps_worker_model_name_(o->model), ps_graph_status(g)->msg);
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
int ps_worker_import_model_(const char *path, model *m, ps_saver **saver, ps_status *st) {
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

int ps_worker_load_data_(const options *o, ps_dataset *train, ps_dataset *test,
                         float **truth, ps_status *st) {
  *truth = NULL;
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
  case M_CTR: {
    /* the log's first 80% trains, its last 20% (newer keys) tests */
    ps_dataset all = {0};
    float *p = NULL;
    if (o->ctr_data) {
      if (ps_dataset_criteo_tsv(o->ctr_data, 0, &all, st)) return st->code;
      if (all.n < 10)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s: %lld examples, need 10 or more", o->ctr_data,
                             (long long)all.n);
    } else {
      if ((p = malloc((size_t)o->examples * sizeof *p)) == NULL)
        return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      if (ps_dataset_ctr_log(o->examples, PS_CTR_FIELDS, o->vocab, 11, &all, p, st)) {
        free(p);
        return st->code;
      }
    }
    int64_t ntrain = all.n * 4 / 5;
    int rc = ps_dataset_batch(&all, 0, ntrain, train, st) ||
             ps_dataset_batch(&all, ntrain, all.n - ntrain, test, st);
    ps_dataset_free(&all);
    if (p && rc == 0) {
      memmove(p, p + ntrain, (size_t)(test->n) * sizeof *p);
      *truth = p;
    } else {
      free(p);
    }
    PS_INFO("click log: %lld training and %lld test examples%s%s", (long long)train->n,
            (long long)test->n, o->ctr_data ? " from " : " (generated)",
            o->ctr_data ? o->ctr_data : "");
    return rc ? st->code : 0;
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

size_t ps_worker_feeds_of_(const model *m, const ps_dataset *b, ps_feed *f) {
  size_t n = 0;
  if (m->x) f[n++] = (ps_feed){m->x, b->x};
  if (m->ids) f[n++] = (ps_feed){m->ids, b->ids};
  if (m->dense) f[n++] = (ps_feed){m->dense, b->dense};
  f[n++] = (ps_feed){m->y, b->y};
  return n;
}

/* The metric over the whole test set, in batches of 1000. */
int ps_worker_evaluate_(const model *m, ps_session *s, const ps_dataset *test,
                        double *out, ps_status *st) {
  double sum = 0;
  int64_t seen = 0;
  ps_dataset b = {0};
  int rc = 0;
  for (int64_t start = 0; start < test->n && rc == 0; start += 1000) {
    if ((rc = ps_dataset_batch(test, start, 1000, &b, st)) != 0) break;
    ps_feed f[4];
    size_t nf = ps_worker_feeds_of_(m, &b, f);
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

/* AUC (the probability that a random click scores above a random
 * non-click; ties count half) of @score for labels @y. */
typedef struct scored {
  float s;
  int64_t y;
} scored;

static int by_score(const void *a, const void *b) {
  float x = ((const scored *)a)->s, z = ((const scored *)b)->s;
  return (x > z) - (x < z);
}

static double auc_of(scored *v, int64_t n) {
  qsort(v, (size_t)n, sizeof *v, by_score);
  double pos = 0, neg = 0, rank_sum = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j < n && v[j].s == v[i].s)
      j++;
    double mid = (double)(i + j + 1) / 2.0; /* ranks i+1..j, averaged */
    for (int64_t k = i; k < j; k++)
      if (v[k].y) {
        rank_sum += mid;
        pos++;
      } else {
        neg++;
      }
    i = j;
  }
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

static double logloss_of(const scored *v, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    double p = v[i].s < 1e-7 ? 1e-7 : v[i].s > 1 - 1e-7 ? 1 - 1e-7 : v[i].s;
    sum -= v[i].y ? log(p) : log(1 - p);
  }
  return n ? sum / (double)n : 0;
}

int ps_worker_ctr_report_(const model *m, ps_session *s, const ps_dataset *test,
                          const float *truth, ctr_report *out, ps_status *st) {
  memset(out, 0, sizeof *out);
  scored *v = malloc(((size_t)test->n + 1) * sizeof *v);
  if (v == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  ps_dataset b = {0};
  int rc = 0;
  const int64_t *y = ps_tensor_data(test->y);
  for (int64_t start = 0; start < test->n && rc == 0; start += 1000) {
    if ((rc = ps_dataset_batch(test, start, 1000, &b, st)) != 0) break;
    ps_feed f[4];
    size_t nf = ps_worker_feeds_of_(m, &b, f);
    ps_tensor *p = NULL;
    ps_node *prob = m->prob;
    if ((rc = ps_session_run(s, f, nf, &prob, 1, NULL, 0, &p, st)) != 0) break;
    for (int64_t i = 0; i < b.n; i++)
      v[start + i] = (scored){((const float *)ps_tensor_data(p))[i], y[start + i]};
    ps_tensor_destroy(p);
  }
  ps_dataset_free(&b);
  if (rc == 0) {
    out->logloss = logloss_of(v, test->n);
    out->auc = auc_of(v, test->n);
    if (truth) {
      for (int64_t i = 0; i < test->n; i++)
        v[i] = (scored){truth[i], y[i]};
      out->best_logloss = logloss_of(v, test->n);
      out->best_auc = auc_of(v, test->n);
    }
  }
  free(v);
  return rc;
}

/* The global step; -1 with @st set when it cannot be read, or when the ps
 * answers with something that is not an int64 scalar. */
int64_t ps_worker_read_step_(const model *m, ps_session *s, ps_status *st) {
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
