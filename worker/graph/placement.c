/* Placement: the device stack of a graph (ps_device_push, device
 * functions) and replica_device_setter, which gives each variable a ps
 * task (round robin in creation order, or greedy by bytes; an explicit
 * /job:ps/task:k keeps k but still takes its turn).  ps_node_new
 * (graph.c) places every node but a variable as it is made; a variable is
 * placed when made (variables.c), and its read, initializer and update
 * nodes are colocated with it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_priv.h"
#include "node.h"

/* ---- device functions ---- */

struct ps_device_fn {
  ps_device ps, worker;
  int nps;
  ps_ps_strategy strategy;
  int next;
  int64_t *loads;
  char **ps_ops;
  size_t nps_ops;
};

void ps_device_fn_free_(ps_device_fn *fn) {
  if (fn == NULL) return;
  free(fn->loads);
  for (size_t i = 0; i < fn->nps_ops; i++)
    free(fn->ps_ops[i]);
  free(fn->ps_ops);
  free(fn);
}

ps_device_fn *ps_replica_device_setter(const ps_cluster *cluster,
                                       const ps_rds_options *opt) {
  ps_rds_options o = {0};
  if (opt) o = *opt;
  ps_device_fn *fn = calloc(1, sizeof *fn);
  if (fn == NULL) return NULL;
  if (ps_device_parse(o.ps_device ? o.ps_device : "/job:ps", &fn->ps, NULL) != 0 ||
      ps_device_parse(o.worker_device ? o.worker_device : "/job:worker", &fn->worker,
                      NULL) != 0) {
    free(fn);
    return NULL;
  }
  fn->nps = cluster ? ps_cluster_num_tasks(cluster, fn->ps.job) : 0;
  if (fn->nps <= 0) { /* TensorFlow returns None: no device function */
    free(fn);
    return NULL;
  }
  fn->strategy = o.strategy;
  fn->loads = calloc((size_t)fn->nps, sizeof *fn->loads);
  const char *def_ops[] = {"VariableV2"};
  const char *const *ops = o.ps_ops ? o.ps_ops : def_ops;
  size_t nops = o.ps_ops ? o.nps_ops : 1;
  fn->ps_ops = calloc(nops + 1, sizeof *fn->ps_ops);
  bool oom = fn->loads == NULL || fn->ps_ops == NULL;
  for (size_t i = 0; i < nops && !oom; i++, fn->nps_ops++)
    oom = (fn->ps_ops[i] = strdup(ops[i])) == NULL;
  if (oom) { /* out of memory: no device function, like TensorFlow's None */
    ps_device_fn_free_(fn);
    return NULL;
  }
  return fn;
}

static bool is_ps_op(const ps_device_fn *fn, const char *type) {
  for (size_t i = 0; i < fn->nps_ops; i++)
    if (!strcmp(fn->ps_ops[i], type)) return true;
  return false;
}

static int64_t node_bytes(const ps_node *n) {
  int64_t e = ps_shape_num_elements(&n->shape);
  return e < 0 ? 0 : e * (int64_t)ps_dtype_size(n->dtype);
}

/* _ReplicaDeviceChooser.device_function */
static void apply_fn(ps_device_fn *fn, ps_node *n, ps_device *cur) {
  if (is_ps_op(fn, n->def->type)) {
    ps_device ps = fn->ps;
    if (ps.job[0] && (!cur->job[0] || !strcmp(cur->job, ps.job))) {
      int task;
      if (fn->strategy == PS_STRATEGY_GREEDY_BYTES) {
        task = 0;
        for (int i = 1; i < fn->nps; i++)
          if (fn->loads[i] < fn->loads[task]) task = i;
        fn->loads[task] += node_bytes(n);
      } else {
        task = fn->next;
        fn->next = (fn->next + 1) % fn->nps;
      }
      ps.task = task;
    }
    ps_device_merge(&ps, cur);
    *cur = ps;
    return;
  }
  ps_device w = fn->worker;
  ps_device_merge(&w, cur);
  *cur = w;
}

void ps_graph_place_(ps_graph *g, ps_node *n) {
  ps_device cur;
  ps_device_init(&cur);
  for (int i = g->ndev - 1; i >= 0; i--) {
    if (g->dev[i].fn) {
      apply_fn(g->dev[i].fn, n, &cur);
    } else if (g->dev[i].str) {
      ps_device d;
      if (ps_device_parse(g->dev[i].str, &d, NULL) == 0) {
        ps_device_merge(&d, &cur); /* inner (already set) fields win */
        cur = d;
      }
    } else { /* ps_device_push(NULL): clears the stack below */
      break;
    }
  }
  ps_device_format(&cur, n->device, sizeof n->device);
}

int ps_device_push(ps_graph *g, const char *device, ps_status *st) {
  ps_device d;
  if (g == NULL) return ps_status_set(st, PS_INVALID_ARGUMENT, "device scope: no graph");
  if (device && ps_device_parse(device, &d, st) != 0) return PS_INVALID_ARGUMENT;
  if (g->ndev >= PS_MAX_SCOPE)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "device scope %s: more than %d nested",
                         device ? device : "(none)", PS_MAX_SCOPE);
  char *copy = device ? strdup(device) : NULL;
  if (device && copy == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  g->dev[g->ndev].str = copy;
  g->dev[g->ndev].fn = NULL;
  g->ndev++;
  return 0;
}

void ps_device_push_fn(ps_graph *g, ps_device_fn *fn) {
  if (g->ndev >= PS_MAX_SCOPE) {
    ps_device_fn_free_(fn);
    return;
  }
  g->dev[g->ndev].str = NULL;
  g->dev[g->ndev].fn = fn;
  g->ndev++;
}

void ps_device_pop(ps_graph *g) {
  if (g->ndev <= 0) return;
  g->ndev--;
  free(g->dev[g->ndev].str);
  ps_device_fn_free_(g->dev[g->ndev].fn);
  g->dev[g->ndev].str = NULL;
  g->dev[g->ndev].fn = NULL;
}
