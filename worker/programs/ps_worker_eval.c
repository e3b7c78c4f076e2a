/* ps-worker's evaluator task: loads each new checkpoint of
 * --checkpoint-dir into its own graph and prints the test metric. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/bundle.h"
#include "common/log.h"
#include "paramserver/checkpoint.h"
#include "paramserver/ops.h"
#include "ps_worker_internal.h"

/* ---- the evaluator (TensorFlow's: outside the training, reading
 * checkpoints) ---- */

eval_vars ps_worker_ev_;

int ps_worker_set_up_evaluator_(job *j, ps_status *st) {
  const options *o = &j->o;
  if (o->meta || o->model == M_WIDE_DEEP || o->model == M_CTR) {
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "an evaluator builds linreg, softmax or mlp in code (not "
                         "--import-meta, not partitioned wide_deep, not ctr)");
  }
  /* the model with its variables in this process: no ps is touched */
  if (ps_worker_build_model_(o, NULL, 0, &j->m, st)) return -1;
  ps_variable *const *gv =
      ps_collection_variables(j->m.g, PS_GLOBAL_VARIABLES, &ps_worker_ev_.n);
  ps_worker_ev_.v = calloc(ps_worker_ev_.n + 1, sizeof *ps_worker_ev_.v);
  ps_worker_ev_.in = calloc(ps_worker_ev_.n + 1, sizeof *ps_worker_ev_.in);
  ps_worker_ev_.assign = calloc(ps_worker_ev_.n + 1, sizeof *ps_worker_ev_.assign);
  if (!ps_worker_ev_.v || !ps_worker_ev_.in || !ps_worker_ev_.assign)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  memcpy(ps_worker_ev_.v, gv, ps_worker_ev_.n * sizeof *ps_worker_ev_.v);
  for (size_t i = 0; i < ps_worker_ev_.n; i++) {
    ps_worker_ev_.in[i] = ps_placeholder(j->m.g, ps_variable_dtype(ps_worker_ev_.v[i]),
                                         ps_variable_shape(ps_worker_ev_.v[i]), NULL);
    ps_worker_ev_.assign[i] = ps_assign(ps_worker_ev_.v[i], ps_worker_ev_.in[i]);
    if (ps_worker_ev_.assign[i] == NULL)
      return ps_status_set(st, ps_graph_status(j->m.g)->code, "%s",
                           ps_graph_status(j->m.g)->msg);
  }
  if ((j->s = ps_session_create(j->m.g, NULL, st)) == NULL) return -1;
  PS_INFO("%s model: evaluating each new checkpoint in %s",
          ps_worker_model_name_(o->model), o->ckpt_dir);
  return 0;
}

/* Loads @prefix (a path) into the evaluator's variables. */
static int load_checkpoint(job *j, const char *prefix, ps_status *st) {
  ps_bundle_reader *r = ps_bundle_reader_open(prefix, st);
  if (r == NULL) return st->code;
  ps_feed *f = calloc(ps_worker_ev_.n + 1, sizeof *f);
  ps_tensor **t = calloc(ps_worker_ev_.n + 1, sizeof *t);
  int rc = f && t ? 0 : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < ps_worker_ev_.n && rc == 0; i++) {
    const char *name = ps_variable_name(ps_worker_ev_.v[i]);
    if ((t[i] = ps_tensor_create(ps_variable_dtype(ps_worker_ev_.v[i]),
                                 ps_variable_shape(ps_worker_ev_.v[i]), false)) == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    rc = ps_bundle_reader_read_into(r, name, ps_tensor_data(t[i]), ps_tensor_nbytes(t[i]),
                                    st);
    if (rc != 0) ps_status_prefix(st, "checkpoint %s, variable %s", prefix, name);
    f[i] = (ps_feed){ps_worker_ev_.in[i], t[i]};
  }
  if (rc == 0)
    rc = ps_session_run(j->s, f, ps_worker_ev_.n, NULL, 0, ps_worker_ev_.assign,
                        ps_worker_ev_.n, NULL, st);
  for (size_t i = 0; t && i < ps_worker_ev_.n; i++)
    ps_tensor_destroy(t[i]);
  free(t);
  free(f);
  ps_bundle_reader_close(r);
  return rc;
}

/* Evaluates each new checkpoint of --checkpoint-dir as it appears, until
 * one reaches --steps or a signal; trains nothing and touches no ps. */
int ps_worker_evaluate_loop_(job *j, ps_status *st) {
  const options *o = &j->o;
  char *last = NULL;
  int rc = 0;
  while (!atomic_load(&ps_worker_stop_requested_)) {
    char *latest = NULL;
    ps_status e;
    if (ps_latest_checkpoint(o->ckpt_dir, &latest, &e) == 0 && latest &&
        (last == NULL || strcmp(last, latest) != 0)) {
      double metric;
      if ((rc = load_checkpoint(j, latest, st)) != 0 ||
          (rc = ps_worker_evaluate_(&j->m, j->s, &j->test, &metric, st)) != 0 ||
          (j->gs = ps_worker_read_step_(&j->m, j->s, st)) < 0) {
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
    for (int k = 0; k < 20 && !atomic_load(&ps_worker_stop_requested_); k++)
      usleep(50000);
  }
  free(last);
  return rc;
}
