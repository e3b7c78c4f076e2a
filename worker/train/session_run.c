/* ps_session_run (session.c says how a run goes): which nodes the fetches
 * and targets need, the feeds, the placement check, and the waves of
 * local nodes (session_local.c) and remote ones (session_remote.c). */
#include <stdlib.h>
#include <string.h>

#include "common/appendf.h"
#include "common/array.h"
#include "common/variable.h"
#include "session_internal.h"

static void mark_needed(run *r, ps_node *n) {
  if (r->state[n->id] != N_UNNEEDED) return;
  r->state[n->id] = N_NEEDED;
  if (r->fed[n->id]) return;
  for (int i = 0; i < n->nin; i++)
    mark_needed(r, n->in[i]);
  if (n->ia[0] == 1 && n->def->kind == PS_OPK_VAR_READ) return; /* soft deps */
  for (int i = 0; i < n->nctrl; i++)
    mark_needed(r, n->ctrl[i]);
  if (n->sparse_indices) mark_needed(r, n->sparse_indices);
}

static bool ready(run *r, ps_node *n) {
  if (r->state[n->id] != N_NEEDED) return false;
  if (r->fed[n->id]) return true;
  for (int i = 0; i < n->nin; i++)
    if (r->state[n->in[i]->id] != N_DONE) return false;
  for (int i = 0; i < n->nctrl; i++) {
    ps_node *c = n->ctrl[i];
    if (r->state[c->id] == N_NEEDED) return false; /* soft deps: only if needed */
  }
  if (n->sparse_indices && r->state[n->sparse_indices->id] != N_DONE) return false;
  return true;
}

static bool is_remote(const ps_node *n) {
  switch (n->def->kind) {
  case PS_OPK_VAR_READ:
  case PS_OPK_VAR_INIT:
  case PS_OPK_VAR_UPDATE:
  case PS_OPK_VAR_IS_INIT:
    return n->var == NULL || n->var->task >= 0;
  default:
    return false;
  }
}

/* Reads whose every needed consumer is a gather of their rows are served
 * as row reads by the ps: the whole variable never crosses the network. */
static void plan_gathers(run *r, ps_node *const *fetches, size_t nfetches) {
  ps_graph *g = r->s->g;
  for (size_t i = 0; i < r->n; i++) {
    ps_node *n = ps_graph_node(g, i);
    if (n->def->kind != PS_OPK_VAR_READ || r->state[i] != N_NEEDED || r->fed[i]) continue;
    if (n->var->task < 0 || n->nctrl > 0) continue;
    bool only_gathers = true, any = false;
    for (size_t f = 0; f < nfetches; f++)
      if (fetches[f] == n) only_gathers = false;
    for (size_t k = 0; k < r->n && only_gathers; k++) {
      ps_node *c = ps_graph_node(g, k);
      if (r->state[k] != N_NEEDED) continue;
      for (int j = 0; j < c->nin; j++)
        if (c->in[j] == n) {
          if (strcmp(c->def->type, "GatherV2") != 0 || j != 0)
            only_gathers = false;
          else
            any = true;
        }
      for (int j = 0; j < c->nctrl; j++)
        if (c->ctrl[j] == n) only_gathers = false;
    }
    if (!only_gathers || !any) continue;
    r->skip_read[i] = true;
    for (size_t k = 0; k < r->n; k++) {
      ps_node *c = ps_graph_node(g, k);
      if (r->state[k] == N_NEEDED && c->nin >= 2 && c->in[0] == n &&
          !strcmp(c->def->type, "GatherV2"))
        r->remote_gather[k] = true;
    }
  }
}

/* Which values are used: the fetches and every data input of a needed
 * node (control inputs only order; their values are not used). */
static void mark_wanted(run *r, ps_node *const *fetches, size_t nfetches) {
  ps_graph *g = r->s->g;
  for (size_t f = 0; f < nfetches; f++)
    r->want_value[fetches[f]->id] = true;
  for (size_t i = 0; i < r->n; i++) {
    ps_node *n = ps_graph_node(g, i);
    if (r->state[i] != N_NEEDED) continue;
    for (int k = 0; k < n->nin; k++)
      if (n->in[k]) r->want_value[n->in[k]->id] = true;
  }
}

/* Feed @i (@f) checked against its node, as TensorFlow checks feeds. */
/* A fetch or target of another graph (its ids and variables index
 * nothing here): TensorFlow's "is not an element of this graph". */
static int check_in_graph(run *r, const ps_node *n) {
  if ((size_t)n->id < r->n && ps_graph_node(r->s->g, n->id) == n) return 0;
  return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                       "Fetch argument %s cannot be interpreted as a Tensor. (%s is "
                       "not an element of this graph.)",
                       n->name, n->name);
}

static int apply_feed(run *r, const ps_feed *f, size_t i) {
  ps_graph *g = r->s->g;
  ps_node *n = f->node;
  const ps_tensor *t = f->value;
  if (n == NULL || t == NULL || (size_t)n->id >= r->n || ps_graph_node(g, n->id) != n)
    return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "feed %zu is not a node of this graph", i);
  if (t->dtype != n->dtype)
    return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "Cannot feed value of dtype %s for Tensor '%s', which has "
                         "dtype %s",
                         ps_dtype_name(t->dtype), n->name, ps_dtype_name(n->dtype));
  if (n->shape.rank >= 0) {
    bool ok = t->shape.rank == n->shape.rank;
    for (int d = 0; ok && d < t->shape.rank; d++)
      ok = n->shape.dim[d] < 0 || n->shape.dim[d] == t->shape.dim[d];
    if (!ok) {
      char a[128], b[128];
      return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                           "Cannot feed value of shape %s for Tensor '%s', which has "
                           "shape %s",
                           ps_shape_format(&t->shape, a, sizeof a), n->name,
                           ps_shape_format(&n->shape, b, sizeof b));
    }
  }
  r->fed[n->id] = true;
  ps_tensor_destroy(r->val[n->id]);
  if ((r->val[n->id] = ps_session_share_(t)) == NULL) return ps_session_oom_(r->st);
  return 0;
}

/* Runs local nodes until none is ready. */
static int run_local_ready(run *r) {
  ps_graph *g = r->s->g;
  int rc = 0;
  bool progress = true;
  while (progress && rc == 0) {
    progress = false;
    for (size_t i = 0; i < r->n && rc == 0; i++) {
      ps_node *n = ps_graph_node(g, i);
      if (!ready(r, n) || r->remote_gather[i]) continue;
      if (!r->fed[i] && is_remote(n)) continue;
      rc = ps_session_run_local_(r, n);
      /* every op leaves a value (an empty one for updates) */
      if (rc == 0 && r->val[i] == NULL) rc = ps_session_oom_(r->st);
      r->state[i] = N_DONE;
      progress = true;
    }
  }
  return rc;
}

/* The next wave of remote ops into @wave; returns their number.  Reads go
 * first; updates and initializers wait until nothing else can run, so that
 * all of a step's updates to one ps share one RPC.  *any_left: some needed
 * node is not done. */
static size_t next_wave(run *r, ps_node **wave, bool *any_left) {
  ps_graph *g = r->s->g;
  size_t nw = 0;
  bool reads_ready = false;
  *any_left = false;
  for (size_t i = 0; i < r->n; i++) {
    ps_node *n = ps_graph_node(g, i);
    if (ready(r, n) && (r->remote_gather[i] || is_remote(n)) &&
        n->def->kind != PS_OPK_VAR_UPDATE && n->def->kind != PS_OPK_VAR_INIT)
      reads_ready = true;
  }
  for (size_t i = 0; i < r->n; i++) {
    ps_node *n = ps_graph_node(g, i);
    if (r->state[i] == N_NEEDED) *any_left = true;
    if (ready(r, n) && (r->remote_gather[i] || is_remote(n))) {
      bool is_write =
          n->def->kind == PS_OPK_VAR_UPDATE || n->def->kind == PS_OPK_VAR_INIT;
      if (is_write && reads_ready) continue;
      if (r->remote_gather[i] && n->var == NULL) n->var = n->in[0]->var;
      wave[nw++] = n;
    }
  }
  return nw;
}

/* Whether device @d exists for this session: a ps task's CPU, or this
 * process's (its job, "localhost" or none; its task or none; CPU:0). */
static bool device_exists(const ps_session *s, const ps_device *d) {
  if (d->type[0] && strcmp(d->type, "CPU") != 0) return false;
  if (d->index > 0) return false;
  if (!strcmp(d->job, "ps")) return true; /* its task is checked on creation */
  if (d->job[0] && strcmp(d->job, s->self.job) != 0 && strcmp(d->job, "localhost") != 0)
    return false;
  if (d->task >= 0 && strcmp(d->job, "localhost") != 0 && d->task != s->self.task)
    return false;
  return true;
}

/* The devices this session can place on, as TensorFlow lists them. */
static void list_devices(const ps_session *s, char *buf, size_t n) {
  size_t off = 0;
  int nps = s->client ? ps_client_num_ps(s->client) : 0;
  buf[0] = '\0';
  for (int t = 0; t < nps; t++)
    ps_appendf(buf, n, &off, "/job:ps/replica:0/task:%d/device:CPU:0, ", t);
  if (s->self.task >= 0)
    ps_appendf(buf, n, &off, "/job:%s/replica:0/task:%d/device:CPU:0", s->self.job,
               s->self.task);
  else
    ps_appendf(buf, n, &off, "/job:%s/replica:0/device:CPU:0", s->self.job);
}

/* TensorFlow's placement check of every needed node, once per node (a
 * variable's ops are named by the variable, their colocation group): an
 * unavailable device (a GPU, another worker task) is INVALID_ARGUMENT
 * unless the session allows soft placement (then: the ps task's CPU, or
 * this process). */
static int check_placement(run *r) {
  ps_session *s = r->s;
  if (s->nplaced < r->n) {
    if (ps_array_grow(&s->placed, NULL, r->n, 1) != 0) return ps_session_oom_(r->st);
    memset(s->placed + s->nplaced, 0, r->n - s->nplaced);
    s->nplaced = r->n;
  }
  for (size_t i = 0; i < r->n; i++) {
    if (r->state[i] == N_UNNEEDED || s->placed[i]) continue;
    ps_node *n = ps_graph_node(s->g, i);
    ps_device d;
    if (ps_device_parse(n->device, &d, NULL) == 0 && !device_exists(s, &d) &&
        !s->soft_placement) {
      char avail[1024];
      list_devices(s, avail, sizeof avail);
      return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                           "Cannot assign a device for operation %s: Operation was "
                           "explicitly assigned to %s but available devices are [ %s ]. "
                           "Make sure the device specification refers to a valid "
                           "device.",
                           n->var ? n->var->name : n->name, n->device, avail);
    }
    s->placed[i] = 1;
  }
  return 0;
}

/* Local nodes and remote waves in turn until every needed node is done. */
static int execute(run *r, ps_node **wave) {
  for (;;) {
    int rc = run_local_ready(r);
    if (rc) return rc;
    bool any_left;
    size_t nw = next_wave(r, wave, &any_left);
    if (nw == 0)
      return any_left ? ps_status_set(r->st, PS_INTERNAL, "graph has a dependency cycle")
                      : 0;
    rc = ps_session_run_remote_(r, wave, nw);
    for (size_t k = 0; k < nw; k++)
      r->state[wave[k]->id] = N_DONE;
    if (rc) return rc;
  }
}

/* The fetched values, shared into @outputs (all or none). */
static int share_outputs(run *r, ps_node *const *fetches, size_t nfetches,
                         ps_tensor **outputs) {
  for (size_t i = 0; i < nfetches; i++) {
    ps_tensor *v = r->val[fetches[i]->id];
    outputs[i] = v ? ps_session_share_(v) : NULL;
    if (v && outputs[i] == NULL) {
      for (size_t j = 0; j < i; j++) {
        ps_tensor_destroy(outputs[j]);
        outputs[j] = NULL;
      }
      return ps_session_oom_(r->st);
    }
  }
  return 0;
}

int ps_session_run(ps_session *s, const ps_feed *feeds, size_t nfeeds,
                   ps_node *const *fetches, size_t nfetches, ps_node *const *targets,
                   size_t ntargets, ps_tensor **outputs, ps_status *st) {
  ps_status local_st;
  if (st == NULL) st = &local_st;
  ps_status_clear(st);
  ps_graph *g = s->g;
  s->last_reads = s->last_updates = 0;
  s->last_sync_applied = s->last_sync_stale = 0;
  run r = {.s = s, .n = ps_graph_num_nodes(g), .st = st};
  r.state = calloc(r.n + 1, 1);
  r.val = calloc(r.n + 1, sizeof *r.val);
  r.fed = calloc(r.n + 1, sizeof *r.fed);
  r.remote_gather = calloc(r.n + 1, sizeof *r.remote_gather);
  r.skip_read = calloc(r.n + 1, sizeof *r.skip_read);
  r.want_value = calloc(r.n + 1, sizeof *r.want_value);
  ps_node **wave = calloc(r.n + 1, sizeof *wave);
  int rc = 0;
  if (!r.state || !r.val || !r.fed || !r.remote_gather || !r.skip_read || !r.want_value ||
      !wave)
    rc = ps_session_oom_(st);
  for (size_t i = 0; i < nfeeds && rc == 0; i++)
    rc = apply_feed(&r, &feeds[i], i);
  for (size_t i = 0; i < nfetches && rc == 0; i++) {
    if (fetches[i] == NULL)
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "fetch %zu is NULL", i);
    else if ((rc = check_in_graph(&r, fetches[i])) == 0)
      mark_needed(&r, fetches[i]);
  }
  for (size_t i = 0; i < ntargets && rc == 0; i++)
    if (targets[i]) rc = check_in_graph(&r, targets[i]);
  if (rc == 0) {
    for (size_t i = 0; i < ntargets; i++)
      if (targets[i]) mark_needed(&r, targets[i]);
    plan_gathers(&r, fetches, nfetches);
    mark_wanted(&r, fetches, nfetches);
    for (size_t i = 0; i < r.n; i++)
      if (r.skip_read[i]) r.state[i] = N_DONE;
    rc = check_placement(&r);
    if (rc == 0) rc = execute(&r, wave);
  }
  if (rc == 0) rc = share_outputs(&r, fetches, nfetches, outputs);
  for (size_t i = 0; r.val && i < r.n; i++)
    ps_tensor_destroy(r.val[i]);
  free(r.val);
  free(r.state);
  free(r.fed);
  free(r.remote_gather);
  free(r.skip_read);
  free(r.want_value);
  free(wave);
  return rc;
}
