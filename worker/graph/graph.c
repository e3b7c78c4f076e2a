/* Worker graphs: the graph object, its nodes (ps_node_new, names made
 * unique), placeholders and constants, control dependencies, collections,
 * the rollback of a failed constructor, and what the runtime and the
 * MetaGraph import read of a graph (node.h).  Name and variable scopes are
 * scopes.c, device scopes and replica_device_setter placement.c,
 * variables variables.c, partitioned variables partition.c; ops are in
 * worker/ops/, the executor in worker/train/session*.c.
 *
 * Names follow TensorFlow: a node's name is "<name scope>/<hint>", and a
 * name already taken gets "_1", "_2"... (Graph.unique_name). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/appendf.h"
#include "common/array.h"
#include "graph_priv.h"
#include "node.h"
#include "paramserver/partition.h"

/* a variable's node; its other ops are in variables.c */
const ps_op_def ps_op_variable_def_ = {"VariableV2", PS_OPK_NOOP, NULL, NULL};
static const ps_op_def op_placeholder = {"Placeholder", PS_OPK_PLACEHOLDER, NULL, NULL};
static const ps_op_def op_const = {"Const", PS_OPK_CONST, NULL, NULL};
static const ps_op_def op_noop = {"NoOp", PS_OPK_NOOP, NULL, NULL};

ps_graph *ps_graph_create(void) {
  ps_graph *g = calloc(1, sizeof *g);
  if (g == NULL) return NULL;
  ps_status_clear(&g->st);
  return g;
}

static void free_node(ps_node *n) {
  free(n->name);
  free(n->in);
  free(n->ctrl);
  free(n->extra);
  ps_tensor_destroy(n->value);
  free(n);
}

void ps_graph_destroy(ps_graph *g) {
  if (g == NULL) return;
  for (size_t i = 0; i < g->nnodes; i++)
    free_node(g->nodes[i]);
  free(g->nodes);
  for (size_t i = 0; i < g->nvars; i++)
    ps_variable_free_(g->vars[i]);
  free(g->vars);
  for (size_t i = 0; i < g->npvars; i++) {
    free(g->pvars[i]->name);
    free(g->pvars[i]->parts);
    free(g->pvars[i]);
  }
  free(g->pvars);
  if (g->tables_free) g->tables_free(g);
  for (size_t i = 0; i < g->nnames; i++)
    free(g->names[i].name);
  free(g->names);
  for (size_t i = 0; i < g->ncoll; i++) {
    free(g->coll[i].key);
    free(g->coll[i].vars);
    free(g->coll[i].nodes);
  }
  free(g->coll);
  for (int i = 0; i < g->nscope; i++)
    free(g->scope[i]);
  for (size_t i = 0; i < g->nvsobjs; i++) {
    free(g->vsobjs[i]->name);
    free(g->vsobjs[i]->original_name_scope);
    free(g->vsobjs[i]);
  }
  free(g->vsobjs);
  for (int i = 0; i < g->ndev; i++) {
    free(g->dev[i].str);
    ps_device_fn_free_(g->dev[i].fn);
  }
  free(g);
}

const ps_status *ps_graph_status(const ps_graph *g) {
  static const ps_status no_graph = {PS_INVALID_ARGUMENT, "no graph"};
  return g ? &g->st : &no_graph;
}

void ps_graph_clear_status(ps_graph *g) {
  if (g) ps_status_clear(&g->st);
}

void ps_graph_set_random_seed(ps_graph *g, int64_t seed) {
  if (g == NULL) return;
  g->has_seed = true;
  g->seed = seed;
}

_Thread_local uint64_t *ps_kernel_runs_;

bool ps_graph_random_seed_(const ps_graph *g, int64_t *seed) {
  if (g->has_seed) *seed = g->seed;
  return g->has_seed;
}

ps_node *ps_graph_fail(ps_graph *g, int code, const char *fmt, ...) {
  g->nerrors++;
  g->st.code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->st.msg, sizeof g->st.msg, fmt, ap);
  va_end(ap);
  return NULL;
}

ps_node *ps_graph_oom_(ps_graph *g) {
  return ps_graph_fail(g, PS_RESOURCE_EXHAUSTED, "out of memory");
}

size_t ps_graph_num_nodes(const ps_graph *g) {
  return g ? g->nnodes : 0;
}
ps_node *ps_graph_node(const ps_graph *g, size_t i) {
  return g && i < g->nnodes ? g->nodes[i] : NULL;
}

void ps_variable_free_(ps_variable *v) {
  free(v->name);
  free(v->store_key);
  free(v->init_values);
  free(v->full_name);
  free(v);
}

/* ---- a failed constructor adds nothing (node.h) ---- */

ps_graph_mark ps_graph_mark_(const ps_graph *g) {
  ps_graph_mark m = {g->nnodes, g->nvars, g->nnames, g->npvars, g->nerrors};
  return m;
}

bool ps_graph_failed_since_(const ps_graph *g, ps_graph_mark m) {
  return g->nerrors != m.nerrors;
}

/* Drops from *@items (n of them) those for which @gone says so. */
static void drop_items(void *items, size_t *n,
                       bool (*gone)(const ps_graph *, void *, const ps_graph_mark *),
                       const ps_graph *g, const ps_graph_mark *m) {
  void **v;
  memcpy(&v, items, sizeof v);
  size_t k = 0;
  for (size_t i = 0; i < *n; i++)
    if (!gone(g, v[i], m)) v[k++] = v[i];
  *n = k;
}

static bool node_gone(const ps_graph *g, void *x, const ps_graph_mark *m) {
  (void)g;
  return (size_t)((ps_node *)x)->id >= m->nnodes;
}

static bool var_gone(const ps_graph *g, void *x, const ps_graph_mark *m) {
  const ps_variable *v = x;
  return v->g == g && v->index >= m->nvars && v->index < g->nvars &&
         g->vars[v->index] == v;
}

void ps_graph_rollback_(ps_graph *g, ps_graph_mark m) {
  for (size_t i = 0; i < g->ncoll; i++) {
    drop_items(&g->coll[i].nodes, &g->coll[i].nnodes, node_gone, g, &m);
    drop_items(&g->coll[i].vars, &g->coll[i].nvars, var_gone, g, &m);
  }
  for (size_t i = m.nnodes; i < g->nnodes; i++)
    free_node(g->nodes[i]);
  for (size_t i = m.nvars; i < g->nvars; i++)
    ps_variable_free_(g->vars[i]);
  for (size_t i = m.npvars; i < g->npvars; i++) {
    free(g->pvars[i]->name);
    free(g->pvars[i]->parts);
    free(g->pvars[i]);
  }
  for (size_t i = m.nnames; i < g->nnames; i++)
    free(g->names[i].name);
  if (m.nnodes < g->nnodes) g->nnodes = m.nnodes;
  if (m.nvars < g->nvars) g->nvars = m.nvars;
  if (m.npvars < g->npvars) g->npvars = m.npvars;
  if (m.nnames < g->nnames) g->nnames = m.nnames;
}

/* ---- the graph's contents, for the runtime (node.h) ---- */

size_t ps_graph_num_vars_(const ps_graph *g) {
  return g->nvars;
}
ps_variable *ps_graph_var_(const ps_graph *g, size_t i) {
  return g->vars[i];
}
ps_variable **ps_graph_vars_(const ps_graph *g, size_t *n) {
  *n = g->nvars;
  return g->vars;
}

ps_variable *ps_graph_find_var_(const ps_graph *g, const char *name) {
  for (size_t i = 0; i < g->nvars; i++)
    if (!strcmp(g->vars[i]->name, name)) return g->vars[i];
  return NULL;
}

bool ps_node_is_variable_(const ps_node *n) {
  return n->def == &ps_op_variable_def_;
}

size_t ps_graph_num_partitioned_(const ps_graph *g) {
  return g->npvars;
}
const ps_partitioned_variable *ps_graph_partitioned_(const ps_graph *g, size_t i) {
  return g->pvars[i];
}

size_t ps_graph_num_collections_(const ps_graph *g) {
  return g->ncoll;
}
const char *ps_graph_collection_(const ps_graph *g, size_t i, ps_variable *const **vars,
                                 size_t *nvars, ps_node *const **nodes, size_t *nnodes) {
  *vars = g->coll[i].vars;
  *nvars = g->coll[i].nvars;
  *nodes = g->coll[i].nodes;
  *nnodes = g->coll[i].nnodes;
  return g->coll[i].key;
}

/* ---- MetaGraph import (node.h) ---- */

ps_node *ps_graph_import_node_(ps_graph *g, const ps_op_def *def, const char *name) {
  if (ps_array_grow(&g->nodes, &g->capnodes, g->nnodes + 1, sizeof *g->nodes) != 0)
    return ps_graph_oom_(g);
  ps_node *n = calloc(1, sizeof *n);
  if (n == NULL) return ps_graph_oom_(g);
  n->name = ps_graph_unique_name_(g, name);
  if (n->name == NULL) {
    free(n);
    return NULL;
  }
  n->g = g;
  n->id = (int)g->nnodes;
  n->def = def;
  g->nodes[g->nnodes++] = n;
  return n;
}

ps_variable *ps_graph_import_var_(ps_graph *g, const char *name) {
  if (ps_array_grow(&g->vars, NULL, g->nvars + 1, sizeof *g->vars) != 0)
    return (void *)ps_graph_oom_(g);
  ps_variable *v = calloc(1, sizeof *v);
  if (v == NULL || (v->name = strdup(name)) == NULL) {
    free(v);
    return (void *)ps_graph_oom_(g);
  }
  v->g = g;
  v->index = g->nvars;
  g->vars[g->nvars++] = v;
  return v;
}

ps_partitioned_variable *ps_graph_import_partitioned_(ps_graph *g, const char *name,
                                                      size_t nparts) {
  if (ps_array_grow(&g->pvars, NULL, g->npvars + 1, sizeof *g->pvars) != 0)
    return (void *)ps_graph_oom_(g);
  ps_partitioned_variable *pv = calloc(1, sizeof *pv);
  if (pv == NULL) return (void *)ps_graph_oom_(g);
  pv->name = strdup(name);
  pv->parts = calloc(nparts + 1, sizeof *pv->parts);
  if (pv->name == NULL || pv->parts == NULL) {
    free(pv->name);
    free(pv->parts);
    free(pv);
    return (void *)ps_graph_oom_(g);
  }
  g->pvars[g->npvars++] = pv;
  return pv;
}

/* ---- unique names ---- */

static int name_lookup(ps_graph *g, const char *name) {
  for (size_t i = 0; i < g->nnames; i++)
    if (!strcmp(g->names[i].name, name)) return (int)i;
  return -1;
}

/* TensorFlow's Graph.unique_name: "x", "x_1", "x_2"... */
char *ps_graph_unique_name_(ps_graph *g, const char *full) {
  char buf[PS_NAME_MAX];
  snprintf(buf, sizeof buf, "%s", full);
  int k = name_lookup(g, buf);
  if (k >= 0) {
    int i = g->names[k].count;
    do {
      snprintf(buf, sizeof buf, "%s_%d", full, i++);
    } while (name_lookup(g, buf) >= 0);
    g->names[k].count = i;
  }
  char *mine = strdup(buf), *out = strdup(buf);
  if (mine == NULL || out == NULL ||
      ps_array_grow(&g->names, &g->capnames, g->nnames + 1, sizeof *g->names) != 0) {
    free(mine);
    free(out);
    ps_graph_oom_(g);
    return NULL;
  }
  g->names[g->nnames].name = mine;
  g->names[g->nnames].count = 1;
  g->nnames++;
  return out;
}

void ps_graph_scoped_name_(ps_graph *g, const char *hint, char *out, size_t n) {
  size_t off = 0;
  const char *top = g->nscope > 0 ? g->scope[g->nscope - 1] : "";
  out[0] = '\0';
  if (top[0]) ps_appendf(out, n, &off, "%s/", top);
  ps_appendf(out, n, &off, "%s", hint);
}

/* ---- nodes ---- */

ps_node *ps_node_new(ps_graph *g, const ps_op_def *def, const char *name_hint,
                     ps_node *const *in, int nin) {
  for (int i = 0; i < nin; i++)
    if (in[i] == NULL) {
      if (g->st.code == PS_OK)
        ps_graph_fail(g, PS_INVALID_ARGUMENT, "%s: input %d is missing", def->type, i);
      return NULL;
    }
  ps_node *n = calloc(1, sizeof *n);
  if (n == NULL) return ps_graph_fail(g, PS_RESOURCE_EXHAUSTED, "out of memory");
  n->g = g;
  n->def = def;
  n->id = (int)g->nnodes;
  char full[PS_NAME_MAX];
  ps_graph_scoped_name_(g, name_hint ? name_hint : def->type, full, sizeof full);
  n->name = ps_graph_unique_name_(g, full);
  if (n->name == NULL ||
      ps_array_grow(&g->nodes, &g->capnodes, g->nnodes + 1, sizeof *g->nodes) != 0 ||
      (nin > 0 && (n->in = malloc((size_t)nin * sizeof *n->in)) == NULL)) {
    free_node(n);
    return ps_graph_oom_(g);
  }
  if (nin > 0) {
    memcpy(n->in, in, (size_t)nin * sizeof *n->in);
    n->nin = nin;
    n->dtype = in[0]->dtype;
    n->shape = in[0]->shape;
  }
  /* control dependencies of the current context */
  if (g->nctx > 0) ps_node_add_control_deps(n, g->ctx, (size_t)g->nctx);
  /* variables are placed once their dtype and shape are known */
  if (def != &ps_op_variable_def_) ps_graph_place_(g, n);
  g->nodes[g->nnodes++] = n; /* room made above */
  return n;
}

const char *ps_node_name(const ps_node *n) {
  return n ? n->name : NULL;
}
const char *ps_node_op(const ps_node *n) {
  return n ? n->def->type : NULL;
}
ps_dtype ps_node_dtype(const ps_node *n) {
  return n ? n->dtype : PS_DT_INVALID;
}
const ps_shape *ps_node_shape(const ps_node *n) {
  return n ? &n->shape : NULL;
}
const char *ps_node_device(const ps_node *n) {
  return n ? n->device : NULL;
}

ps_node *ps_graph_find_node(ps_graph *g, const char *name) {
  if (g == NULL || name == NULL) return NULL;
  for (size_t i = 0; i < g->nnodes; i++)
    if (!strcmp(g->nodes[i]->name, name)) return g->nodes[i];
  return NULL;
}

int ps_node_add_control_deps(ps_node *n, ps_node *const *deps, size_t ndeps) {
  if (n == NULL) return -1;
  if (ps_array_grow(&n->ctrl, NULL, (size_t)n->nctrl + ndeps, sizeof *n->ctrl) != 0) {
    ps_graph_oom_(n->g);
    return -1;
  }
  for (size_t i = 0; i < ndeps; i++)
    if (deps[i]) n->ctrl[n->nctrl++] = deps[i];
  return 0;
}

void ps_control_dependencies_push_(ps_graph *g, ps_node *const *deps, size_t n) {
  for (size_t i = 0; i < n && g->nctx < PS_MAX_CTX; i++)
    g->ctx[g->nctx++] = deps[i];
  g->ctx_marks[g->nctxmarks++] = (int)n;
}

void ps_control_dependencies_pop_(ps_graph *g) {
  if (g->nctxmarks <= 0) return;
  g->nctx -= g->ctx_marks[--g->nctxmarks];
  if (g->nctx < 0) g->nctx = 0;
}

ps_node *ps_placeholder(ps_graph *g, ps_dtype dtype, const ps_shape *shape,
                        const char *name) {
  if (g == NULL) return NULL;
  ps_node *n = ps_node_new(g, &op_placeholder, name ? name : "Placeholder", NULL, 0);
  if (n == NULL) return NULL;
  n->dtype = dtype;
  if (shape)
    n->shape = *shape;
  else
    n->shape.rank = -1;
  return n;
}

ps_node *ps_constant(ps_graph *g, const ps_tensor *value, const char *name) {
  if (g == NULL) return NULL;
  if (value == NULL || value->dtype == PS_DT_STRING)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "Const: %s",
                         value ? "string constants are not supported" : "no value");
  /* the copy first: a failure adds no node */
  ps_tensor *copy = ps_tensor_create(value->dtype, &value->shape, false);
  if (copy == NULL) return ps_graph_fail(g, PS_RESOURCE_EXHAUSTED, "out of memory");
  memcpy(ps_tensor_data(copy), ps_tensor_data(value), ps_tensor_nbytes(value));
  ps_node *n = ps_node_new(g, &op_const, name ? name : "Const", NULL, 0);
  if (n == NULL) {
    ps_tensor_destroy(copy);
    return NULL;
  }
  n->dtype = value->dtype;
  n->shape = value->shape;
  n->value = copy;
  return n;
}

ps_node *ps_scalar(ps_graph *g, ps_dtype dtype, double value) {
  if (g == NULL) return NULL;
  ps_shape s = {0};
  ps_tensor *t = ps_tensor_create(dtype, &s, true);
  if (t == NULL)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "scalar: bad dtype %d", dtype);
  ps_elem_set(dtype, ps_tensor_data(t), 0, value);
  ps_node *n = ps_constant(g, t, "Const");
  ps_tensor_destroy(t);
  return n;
}

ps_node *ps_group(ps_graph *g, ps_node *const *deps, size_t n, const char *name) {
  if (g == NULL) return NULL;
  ps_node *x = ps_node_new(g, &op_noop, name ? name : "group_deps", NULL, 0);
  if (x == NULL) return NULL;
  x->dtype = PS_DT_FLOAT;
  x->shape.rank = 0;
  ps_node_add_control_deps(x, deps, n);
  return x;
}

/* ---- collections ---- */

static ps_collection *collection(ps_graph *g, const char *key) {
  for (size_t i = 0; i < g->ncoll; i++)
    if (!strcmp(g->coll[i].key, key)) return &g->coll[i];
  char *k = strdup(key);
  if (k == NULL || ps_array_grow(&g->coll, NULL, g->ncoll + 1, sizeof *g->coll) != 0) {
    free(k);
    ps_graph_oom_(g);
    return NULL;
  }
  ps_collection *c = &g->coll[g->ncoll++];
  memset(c, 0, sizeof *c);
  c->key = k;
  return c;
}

/* Appends @item to *@items (n of them) unless it is there already. */
static void coll_push(ps_graph *g, void *items, size_t *n, void *item) {
  void **v;
  memcpy(&v, items, sizeof v);
  for (size_t i = 0; i < *n; i++)
    if (v[i] == item) return;
  if (ps_array_grow(items, NULL, *n + 1, sizeof item) != 0) {
    ps_graph_oom_(g);
    return;
  }
  memcpy(&v, items, sizeof v);
  v[(*n)++] = item;
}

void ps_collection_add_variable(ps_graph *g, const char *key, ps_variable *v) {
  ps_collection *c = g && key && v ? collection(g, key) : NULL;
  if (c) coll_push(g, &c->vars, &c->nvars, v);
}
void ps_collection_add_node(ps_graph *g, const char *key, ps_node *n) {
  ps_collection *c = g && key && n ? collection(g, key) : NULL;
  if (c) coll_push(g, &c->nodes, &c->nnodes, n);
}
ps_variable *const *ps_collection_variables(ps_graph *g, const char *key, size_t *n) {
  ps_collection *c = g && key ? collection(g, key) : NULL;
  if (n) *n = c ? c->nvars : 0;
  return c ? c->vars : NULL;
}
ps_node *const *ps_collection_nodes(ps_graph *g, const char *key, size_t *n) {
  ps_collection *c = g && key ? collection(g, key) : NULL;
  if (n) *n = c ? c->nnodes : 0;
  return c ? c->nodes : NULL;
}

/* Every op of this file, for MetaGraph import (saver.c). */
const ps_op_def *const ps_opdefs_graph_[] = {&op_placeholder, &op_const, &op_noop, NULL};
