/* Sessions: execute the part of a graph that fetches and targets need.
 *
 * Execution goes in waves.  Each wave first runs every ready local node
 * (their kernels on the worker), then issues the ready remote nodes
 * together: all variable reads (and row gathers) for one ps in one Read
 * RPC, all initializers and updates for one ps in one Update RPC, every ps
 * at once.  A typical training step is therefore one wave of reads, local
 * forward and backward computation, and one wave of updates.
 *
 * Variables with no ps device live in the session itself (local), which is
 * also the no-RPC baseline the benchmarks compare against.
 *
 * Synchronous updates (SyncReplicasOptimizer's apply nodes) take their
 * local step from an input, global_step as read in the run's first wave,
 * and ride in the same Update RPCs; that RPC returns when the ps has
 * applied the step, so the next run reads the new values.
 *
 * This file: the session object and the variables it holds itself.  The
 * local nodes run in session_local.c, the remote waves in
 * session_remote.c, and ps_session_run in session_run.c. */
#include "paramserver/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/array.h"
#include "common/variable.h"
#include "session_internal.h"
#include "train_internal.h"

ps_session *ps_session_create(ps_graph *g, ps_client *client, ps_status *st) {
  return ps_session_create_opts(g, client, NULL, st);
}

ps_session *ps_session_create_opts(ps_graph *g, ps_client *client,
                                   const ps_session_options *opt, ps_status *st) {
  /* a graph whose constructors failed is still whole (graph.h) */
  if (g == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "session: no graph");
    return NULL;
  }
  ps_device self;
  const char *dev = opt && opt->device ? opt->device : "/job:worker";
  if (ps_device_parse(dev, &self, st) != 0) {
    ps_status_prefix(st, "session device");
    return NULL;
  }
  if (!self.job[0]) snprintf(self.job, sizeof self.job, "worker");
  ps_session *s = calloc(1, sizeof *s);
  if (s == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  s->g = g;
  s->client = client;
  s->self = self;
  s->soft_placement = opt && opt->allow_soft_placement;
  return s;
}

void ps_session_destroy(ps_session *s) {
  if (s == NULL) return;
  for (size_t i = 0; i < s->nlocals; i++)
    ps_tensor_destroy(s->locals[i].value);
  free(s->locals);
  free(s->created);
  free(s->draws);
  free(s->kruns);
  free(s->placed);
  free(s);
}

void ps_session_last_rpcs(const ps_session *s, int *reads, int *updates) {
  *reads = s->last_reads;
  *updates = s->last_updates;
}

void ps_session_last_sync(const ps_session *s, int *applied, int *stale) {
  *applied = s->last_sync_applied;
  *stale = s->last_sync_stale;
}

int ps_session_oom_(ps_status *st) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
}

/* @v's place among @g's variables (ps_variable.index, O(1)), or SIZE_MAX
 * when @v is not one of them. */
size_t ps_session_var_index_(ps_graph *g, ps_variable *v) {
  if (v == NULL || v->g != g || v->index >= ps_graph_num_vars_(g) ||
      ps_graph_var_(g, v->index) != v)
    return SIZE_MAX;
  return v->index;
}

int ps_session_not_in_graph_(ps_variable *v, ps_status *st) {
  return ps_status_set(st, PS_INVALID_ARGUMENT,
                       "variable %s is not a variable of the session's graph",
                       v ? v->name : "(null)");
}

/* Why ps_session_local_of_(@s, @v) gave NULL. */
int ps_session_local_err_(ps_session *s, ps_variable *v, ps_status *st) {
  return ps_session_var_index_(s->g, v) == SIZE_MAX ? ps_session_not_in_graph_(v, st)
                                                    : ps_session_oom_(st);
}

/* NULL when out of memory or when @v is not of the session's graph. */
local_var *ps_session_local_of_(ps_session *s, ps_variable *v) {
  size_t i = ps_session_var_index_(s->g, v);
  if (i == SIZE_MAX) return NULL;
  if (i >= s->nlocals) {
    size_t n = ps_graph_num_vars_(s->g);
    if (ps_array_grow(&s->locals, NULL, n, sizeof *s->locals) != 0) return NULL;
    memset(s->locals + s->nlocals, 0, (n - s->nlocals) * sizeof *s->locals);
    s->nlocals = n;
  }
  return &s->locals[i];
}

const ps_tensor *ps_session_local_value_(ps_session *s, ps_variable *v) {
  local_var *lv = ps_session_local_of_(s, v);
  return lv ? lv->value : NULL;
}

int ps_session_set_local_value_(ps_session *s, ps_variable *v, ps_tensor *value,
                                ps_status *st) {
  local_var *lv = ps_session_local_of_(s, v);
  if (lv == NULL) {
    ps_tensor_destroy(value);
    return ps_session_local_err_(s, v, st);
  }
  ps_tensor_destroy(lv->value);
  lv->value = value;
  return 0;
}

/* A tensor sharing @t's bytes (no copy); NULL when out of memory. */
ps_tensor *ps_session_share_(const ps_tensor *t) {
  ps_tensor *o = calloc(1, sizeof *o);
  if (o == NULL) return NULL;
  o->dtype = t->dtype;
  o->shape = t->shape;
  o->buf = ps_buf_ref(t->buf);
  return o;
}

ps_tensor *ps_session_empty_tensor_(void) {
  ps_shape s = {0};
  return ps_tensor_create(PS_DT_FLOAT, &s, true);
}

/* The output of a variable update: the variable's value after it (as
 * TensorFlow's Assign, AssignAdd, Scatter* and Apply* give) when someone
 * uses it, else an empty tensor. */
ps_tensor *ps_session_update_output_(run *r, ps_node *n, const ps_tensor *value) {
  return r->want_value && r->want_value[n->id] && value ? ps_session_share_(value)
                                                        : ps_session_empty_tensor_();
}

ps_client *ps_session_client(const ps_session *s) {
  return s->client;
}
ps_graph *ps_session_graph(const ps_session *s) {
  return s->g;
}
