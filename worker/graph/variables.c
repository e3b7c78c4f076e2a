/* Variables: ps_variable_create and get_variable (reuse, partitions made
 * by partition.c), their read, initializer and update nodes, the
 * initializers and uninitialized reports of a graph, and slot variables.
 *
 * A variable is a "VariableV2" node placed by the device stack
 * (placement.c) when it is made.  Its read, initializer and update nodes
 * are colocated with it (TensorFlow's ref-edge rule), so they run on its
 * ps.  A variable whose device names no ps task lives in the session
 * (local). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_priv.h"
#include "node.h"

static const ps_op_def op_read = {"Identity", PS_OPK_VAR_READ, NULL, NULL};
static const ps_op_def op_init = {"Assign", PS_OPK_VAR_INIT, NULL, NULL};
static const ps_op_def op_update = {"Assign", PS_OPK_VAR_UPDATE, NULL, NULL};
static const ps_op_def op_is_init = {"IsVariableInitialized", PS_OPK_VAR_IS_INIT, NULL,
                                     NULL};
static const ps_op_def op_report = {"ReportUninitializedVariables", PS_OPK_REPORT_UNINIT,
                                    NULL, NULL};

/* ---- variables ---- */

static int task_of(const char *device) {
  ps_device d;
  if (ps_device_parse(device, &d, NULL) != 0) return -1;
  if (strcmp(d.job, "ps") != 0) return -1;
  return d.task < 0 ? 0 : d.task;
}

/* Node colocated with @v: the variable's device, no device functions. */
static ps_node *colocated(ps_variable *v, const ps_op_def *def, const char *hint,
                          ps_node *const *in, int nin) {
  if (v == NULL) return NULL;
  ps_graph *g = v->g;
  /* names are relative to the variable, not to the current scope */
  int saved = g->nscope;
  char *saved_scope[PS_MAX_SCOPE];
  memcpy(saved_scope, g->scope, sizeof saved_scope);
  g->nscope = 0;
  char name[1024];
  snprintf(name, sizeof name, "%s/%s", v->name, hint);
  int saved_dev = g->ndev;
  g->ndev = 0;
  ps_node *n = ps_node_new(g, def, name, in, nin);
  g->ndev = saved_dev;
  g->nscope = saved;
  memcpy(g->scope, saved_scope, sizeof saved_scope);
  if (n) {
    snprintf(n->device, sizeof n->device, "%s", v->device);
    n->var = v;
    n->dtype = v->dtype;
    n->shape = v->shape;
  }
  return n;
}

static void add_to_collections(ps_graph *g, ps_variable *v, const ps_var_options *o) {
  if (o && o->collections) {
    for (size_t i = 0; i < o->ncollections; i++)
      ps_collection_add_variable(g, o->collections[i], v);
  } else {
    ps_collection_add_variable(g, v->local ? PS_LOCAL_VARIABLES : PS_GLOBAL_VARIABLES, v);
  }
  if (v->trainable) ps_collection_add_variable(g, PS_TRAINABLE_VARIABLES, v);
}

/* Creates the variable node with the exact name @full (already unique). */
static ps_variable *new_variable(ps_graph *g, const char *full, ps_dtype dtype,
                                 const ps_shape *shape, const ps_var_options *o) {
  ps_variable *v = calloc(1, sizeof *v);
  if (v == NULL || ps_array_grow(&g->vars, NULL, g->nvars + 1, sizeof *g->vars) != 0) {
    free(v);
    ps_graph_oom_(g);
    return NULL;
  }
  v->g = g;
  v->dtype = dtype;
  v->shape = *shape;
  v->trainable = !(o && o->not_trainable);
  v->local = o && o->local;
  /* the VariableV2 node: named exactly, placed after its shape is known */
  int saved = g->nscope;
  g->nscope = 0;
  ps_node *n = ps_node_new(g, &ps_op_variable_def_, full, NULL, 0);
  g->nscope = saved;
  if (n == NULL) {
    ps_variable_free_(v);
    return NULL;
  }
  n->dtype = dtype;
  n->shape = *shape;
  n->var = v;
  v->name = strdup(n->name); /* @full, made unique for tf.Variable */
  if (v->name == NULL) {
    n->var = NULL;
    ps_variable_free_(v);
    ps_graph_oom_(g);
    return NULL;
  }
  v->node = n;
  ps_graph_place_(g, n);
  snprintf(v->device, sizeof v->device, "%s", n->device);
  v->task = task_of(v->device);
  v->index = g->nvars;
  g->vars[g->nvars++] = v; /* room made above */
  v->read = colocated(v, &op_read, "read", NULL, 0);
  return v;
}

/* ---- TensorFlow 1.x's _try_guard_against_uninitialized_dependencies ---- */

#define GUARD_MAX_DEPTH 4096

static bool in_variable_collections(ps_graph *g, const ps_variable *v) {
  const char *keys[2] = {PS_GLOBAL_VARIABLES, PS_LOCAL_VARIABLES};
  for (int k = 0; k < 2; k++) {
    size_t n;
    ps_variable *const *vs = ps_collection_variables(g, keys[k], &n);
    for (size_t i = 0; i < n; i++)
      if (vs[i] == v) return true;
  }
  return false;
}

/* A copy of worker op @x with inputs @in, named "<x>_<vname>" from the
 * root; NULL (the graph failed) when out of memory.  Ops with state the
 * copy cannot share (other than Reshape's shape) are not copied: @x. */
static ps_node *copy_op(ps_graph *g, ps_node *x, ps_node **in, const char *vname) {
  bool reshape = !strcmp(x->def->type, "Reshape");
  if ((x->extra && !reshape) || x->value) return x;
  void *extra = NULL;
  if (x->extra && (extra = malloc(sizeof(ps_shape))) == NULL) return ps_graph_oom_(g);
  if (extra) memcpy(extra, x->extra, sizeof(ps_shape));
  char name[PS_NAME_MAX];
  snprintf(name, sizeof name, "%s_%s", x->name, vname);
  int saved = g->nscope;
  g->nscope = 0;
  ps_node *n = ps_node_new(g, x->def, name, in, x->nin);
  g->nscope = saved;
  if (n == NULL) {
    free(extra);
    return NULL;
  }
  n->dtype = x->dtype;
  n->shape = x->shape;
  memcpy(n->ia, x->ia, sizeof n->ia);
  memcpy(n->fa, x->fa, sizeof n->fa);
  n->update_op = x->update_op;
  n->extra = extra;
  n->sparse_indices = x->sparse_indices;
  n->sparse_dense_shape = x->sparse_dense_shape;
  if (x->nctrl) ps_node_add_control_deps(n, x->ctrl, (size_t)x->nctrl);
  return n;
}

/* @x with every plain read of a variable of GLOBAL_VARIABLES or
 * LOCAL_VARIABLES replaced by its initialized_value(), the worker ops on
 * the way copied (@memo: the result per original node id).  NULL when out
 * of memory. */
static ps_node *guard(ps_graph *g, ps_node *x, const char *vname, ps_node **memo,
                      size_t nmemo, int depth) {
  if ((size_t)x->id < nmemo && memo[x->id]) return memo[x->id];
  ps_node *r = x;
  if (x->def->kind == PS_OPK_VAR_READ && x->var && x->ia[1] != 1 &&
      in_variable_collections(g, x->var)) {
    r = ps_initialized_value(x->var);
  } else if (x->def->kind == PS_OPK_LOCAL && x->nin > 0 && depth < GUARD_MAX_DEPTH) {
    ps_node *small[8], **in = x->nin <= 8 ? small : malloc((size_t)x->nin * sizeof *in);
    if (in == NULL) return ps_graph_oom_(g);
    bool changed = false;
    for (int i = 0; i < x->nin && r; i++) {
      in[i] = guard(g, x->in[i], vname, memo, nmemo, depth + 1);
      if (in[i] == NULL) r = NULL;
      changed |= in[i] != x->in[i];
    }
    if (r && changed) r = copy_op(g, x, in, vname);
    if (in != small) free(in);
  }
  if (r && (size_t)x->id < nmemo) memo[x->id] = r;
  return r;
}

/* TensorFlow 1.x (variables.py): the initializer of a variable assigns its
 * initial value with each variable it reads made initialized_value(), so
 * global_variables_initializer runs xa's initializer before
 * xb = Variable(xa.value() * 2)'s, and an xa that is initialized already
 * (and not re-initialized) is read.  The guarded expression is also the
 * variable's initial value (what its own initialized_value() falls back
 * to): a session computes a fallback's inputs before it knows whether the
 * variable is initialized, where TensorFlow's cond runs one branch.  NULL
 * when out of memory. */
static ps_node *guard_initial_value(ps_graph *g, ps_node *iv, const char *vname) {
  size_t n = g->nnodes;
  ps_node **memo = calloc(n + 1, sizeof *memo);
  if (memo == NULL) return ps_graph_oom_(g);
  ps_node *r = guard(g, iv, vname, memo, n, 0);
  free(memo);
  return r;
}

/* The checks of an initial value given as a node. */
static int check_initial_value(const ps_node *iv, const char *name, ps_status *st) {
  if (iv == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Variable %s: no initial value", name);
  if (iv->shape.rank < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Variable %s: the initial value's shape must be known", name);
  for (int i = 0; i < iv->shape.rank; i++)
    if (iv->shape.dim[i] < 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Variable %s: the initial value's shape must be fully defined",
                           name);
  return 0;
}

/* The one error rule (graph.h) for the variable constructors: a failed one
 * adds nothing and records its error in the graph and in @st. */
static ps_variable *failed(ps_graph *g, ps_graph_mark m, ps_status *err, ps_status *st) {
  ps_graph_rollback_(g, m);
  if (err->code == PS_OK) { /* a builder below recorded it */
    err->code = g->st.code ? g->st.code : PS_RESOURCE_EXHAUSTED;
    snprintf(err->msg, sizeof err->msg, "%s", g->st.code ? g->st.msg : "out of memory");
  }
  ps_graph_fail(g, err->code, "%s", err->msg);
  ps_status_set(st, err->code, "%s", err->msg);
  return NULL;
}

ps_variable *ps_variable_create(ps_graph *g, ps_node *initial_value, const char *name,
                                const ps_var_options *opt) {
  if (g == NULL) return NULL;
  ps_graph_mark m = ps_graph_mark_(g);
  ps_status err;
  ps_status_clear(&err);
  if (initial_value == NULL && g->nerrors > 0) return NULL; /* keeps its error */
  if (check_initial_value(initial_value, name ? name : "Variable", &err) != 0)
    return failed(g, m, &err, NULL);
  char full[PS_NAME_MAX];
  ps_graph_scoped_name_(g, name ? name : "Variable", full, sizeof full);
  ps_variable *v =
      new_variable(g, full, initial_value->dtype, &initial_value->shape, opt);
  if (v == NULL) return failed(g, m, &err, NULL);
  ps_node *in[1] = {v->initial_value = guard_initial_value(g, initial_value, v->name)};
  v->initializer = in[0] ? colocated(v, &op_init, "Assign", in, 1) : NULL;
  add_to_collections(g, v, opt);
  if (v->read == NULL || v->initializer == NULL || ps_graph_failed_since_(g, m))
    return failed(g, m, &err, NULL);
  return v;
}

static ps_variable *find_var(ps_graph *g, const char *name) {
  for (size_t i = 0; i < g->nvars; i++)
    if (!strcmp(g->vars[i]->name, name)) return g->vars[i];
  return NULL;
}

/* The variable get_variable made under @key (TensorFlow's
 * _VariableStore._vars): a tf.Variable of that name is not one of them. */
static ps_variable *find_stored(ps_graph *g, const char *key) {
  for (size_t i = 0; i < g->nvars; i++) {
    ps_variable *v = g->vars[i];
    if (v->from_get_variable && !strcmp(v->store_key ? v->store_key : v->name, key))
      return v;
  }
  return NULL;
}

/* Sets @st and gives NULL (for the constructors' error paths). */
#define refuse(st, ...) (ps_status_set((st), __VA_ARGS__), (ps_variable *)NULL)

/* tf.get_variable: @init (an initializer the ps runs) or @iv (a node giving
 * the initial value, TensorFlow's initializer=<tensor>).  Errors go to
 * @st only; the callers apply the error rule. */
static ps_variable *get_variable(ps_graph *g, const char *name, ps_dtype dtype,
                                 const ps_shape *shape, const ps_init_spec *init,
                                 ps_node *iv, const ps_var_options *opt, ps_status *st) {
  char full[PS_NAME_MAX];
  ps_reuse reuse;
  if (name == NULL) return refuse(st, PS_INVALID_ARGUMENT, "get_variable: no name");
  if (ps_graph_vscope_name_(g, name, full, sizeof full, &reuse, st) != 0) return NULL;
  if (iv) {
    if (shape)
      return refuse(st, PS_INVALID_ARGUMENT,
                    "If initializer is a constant, do not specify shape.");
    if (check_initial_value(iv, full, st) != 0) return NULL;
    if (dtype != PS_DT_INVALID && dtype != iv->dtype)
      return refuse(st, PS_INVALID_ARGUMENT,
                    "Variable %s: dtype %s was given but the initializer has dtype %s",
                    full, ps_dtype_python_name(dtype), ps_dtype_python_name(iv->dtype));
    shape = &iv->shape;
    dtype = iv->dtype;
  }
  if (dtype == PS_DT_INVALID) dtype = PS_DT_FLOAT; /* TensorFlow's dtype=None */
  ps_variable *v = find_stored(g, full);
  char a[256], b[256];
  if (v) {
    if (reuse == PS_REUSE_NONE) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "Variable %s already exists, disallowed. Did you mean to set "
                    "reuse=True or reuse=tf.AUTO_REUSE in VarScope?",
                    full);
      return NULL;
    }
    if (shape && !ps_shape_equal(shape, &v->shape)) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "Trying to share variable %s, but specified shape %s and found "
                    "shape %s.",
                    full, ps_shape_format_py(shape, a, sizeof a),
                    ps_shape_format_py(&v->shape, b, sizeof b));
      return NULL;
    }
    if (dtype != v->dtype) {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "Trying to share variable %s, but specified dtype %s and found "
                    "dtype %s_ref.",
                    full, ps_dtype_python_name(dtype), ps_dtype_python_name(v->dtype));
      return NULL;
    }
    return v;
  }
  if (reuse == PS_REUSE_TRUE) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "Variable %s does not exist, or was not created with "
                  "tf.get_variable(). Did you mean to set reuse=tf.AUTO_REUSE in "
                  "VarScope?",
                  full);
    return NULL;
  }
  if (shape == NULL || ps_shape_num_elements(shape) < 0) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "Shape of a new variable (%s) must be fully defined, but instead was "
                  "%s.",
                  full, shape ? ps_shape_format_py(shape, a, sizeof a) : "<unknown>");
    return NULL;
  }
  ps_init_spec def;
  if (init == NULL && iv == NULL) {
    if (ps_dtype_is_floating(dtype)) {
      ps_init_spec_default(&def, PS_INIT_GLOROT_UNIFORM);
    } else if (ps_dtype_is_numeric(dtype) || dtype == PS_DT_BOOL) {
      ps_init_spec_default(&def, PS_INIT_ZEROS);
    } else {
      ps_status_set(st, PS_INVALID_ARGUMENT,
                    "An initializer for variable %s of type %s is required", full,
                    ps_dtype_python_name(dtype));
      return NULL;
    }
    init = &def;
  }
  /* a name another op holds (a tf.Variable's) is made unique, as
   * TensorFlow's Variable() does under name_scope(name): "v_1", stored
   * under "v" */
  v = new_variable(g, full, dtype, shape, opt);
  if (v == NULL) return NULL;
  v->from_get_variable = true;
  if (strcmp(v->name, full) != 0 && (v->store_key = strdup(full)) == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  if (iv) {
    ps_node *in[1] = {v->initial_value = guard_initial_value(g, iv, v->name)};
    v->initializer = in[0] ? colocated(v, &op_init, "Assign", in, 1) : NULL;
  } else {
    v->has_init = true;
    v->init = *init;
    if (init->nvalues) {
      v->init_values = malloc(init->nvalues * sizeof(double));
      if (v->init_values == NULL) {
        v->init.values = NULL;
        v->init.nvalues = 0;
        ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
      }
      memcpy(v->init_values, init->values, init->nvalues * sizeof(double));
      v->init.values = v->init_values;
    }
    v->initializer = colocated(v, &op_init, "Assign", NULL, 0);
  }
  add_to_collections(g, v, opt);
  return v->initializer && v->read ? v : NULL;
}

ps_variable *ps_get_variable(ps_graph *g, const char *name, ps_dtype dtype,
                             const ps_shape *shape, const ps_init_spec *init,
                             const ps_var_options *opt, ps_status *st) {
  if (g == NULL) return refuse(st, PS_INVALID_ARGUMENT, "get_variable: no graph");
  ps_graph_mark m = ps_graph_mark_(g);
  ps_status err;
  ps_status_clear(&err);
  ps_variable *v = get_variable(g, name, dtype, shape, init, NULL, opt, &err);
  if (v == NULL || ps_graph_failed_since_(g, m)) return failed(g, m, &err, st);
  ps_status_clear(st);
  return v;
}

ps_variable *ps_get_variable_from(ps_graph *g, const char *name, ps_dtype dtype,
                                  const ps_shape *shape, ps_node *initial_value,
                                  const ps_var_options *opt, ps_status *st) {
  if (g == NULL) return refuse(st, PS_INVALID_ARGUMENT, "get_variable: no graph");
  ps_graph_mark m = ps_graph_mark_(g);
  ps_status err;
  ps_status_clear(&err);
  if (initial_value == NULL && g->nerrors > 0) {
    ps_status_set(st, g->st.code, "%s", g->st.msg);
    return NULL; /* keeps the error that made it NULL */
  }
  ps_variable *v =
      initial_value == NULL
          ? refuse(&err, PS_INVALID_ARGUMENT, "Variable %s: no initializer",
                   name ? name : "")
          : get_variable(g, name, dtype, shape, NULL, initial_value, opt, &err);
  if (v == NULL || ps_graph_failed_since_(g, m)) return failed(g, m, &err, st);
  ps_status_clear(st);
  return v;
}

const char *ps_variable_name(const ps_variable *v) {
  return v ? v->name : NULL;
}
ps_dtype ps_variable_dtype(const ps_variable *v) {
  return v ? v->dtype : PS_DT_INVALID;
}
const ps_shape *ps_variable_shape(const ps_variable *v) {
  return v ? &v->shape : NULL;
}
const char *ps_variable_device(const ps_variable *v) {
  return v ? v->device : NULL;
}
int ps_variable_task(const ps_variable *v) {
  return v ? v->task : -1;
}
bool ps_variable_trainable(const ps_variable *v) {
  return v ? v->trainable : false;
}
ps_node *ps_variable_value(ps_variable *v) {
  return v ? v->read : NULL;
}
ps_node *ps_variable_initializer(ps_variable *v) {
  return v ? v->initializer : NULL;
}

ps_node *ps_initialized_value(ps_variable *v) {
  if (v == NULL) return NULL;
  ps_node *iv[1] = {v->initial_value};
  ps_node *n = colocated(v, &op_read, "initialized_value", iv, v->initial_value ? 1 : 0);
  if (n) {
    ps_node_add_control_deps(n, &v->initializer, 1);
    n->ia[0] = 1; /* soft: waits for the initializer only if it runs too */
    n->ia[1] = 1; /* uninitialized: the initial value instead (session.c) */
  }
  return n;
}

ps_node *ps_read_value(ps_variable *v, ps_node *const *deps, size_t ndeps) {
  ps_node *n = colocated(v, &op_read, "read", NULL, 0);
  if (n) ps_node_add_control_deps(n, deps, ndeps);
  return n;
}

static ps_node *update(ps_variable *v, ps_node *value, int op, const char *hint) {
  if (v == NULL || value == NULL) return NULL;
  if (value->dtype != v->dtype)
    return ps_graph_fail(v->g, PS_INVALID_ARGUMENT,
                         "%s %s: value has dtype %s that does not match dtype %s of "
                         "the variable",
                         hint, v->name, ps_dtype_name(value->dtype),
                         ps_dtype_name(v->dtype));
  ps_node *in[1] = {value};
  ps_node *n = colocated(v, &op_update, hint, in, 1);
  if (n) {
    n->update_op = op;
    /* its value is the variable's after the update (TensorFlow's Assign*) */
    n->dtype = v->dtype;
    n->shape = v->shape;
  }
  return n;
}

ps_node *ps_assign(ps_variable *v, ps_node *value) {
  return update(v, value, PS_ASSIGN, "Assign");
}
ps_node *ps_assign_add(ps_variable *v, ps_node *value) {
  return update(v, value, PS_ASSIGN_ADD, "AssignAdd");
}
ps_node *ps_assign_sub(ps_variable *v, ps_node *value) {
  return update(v, value, PS_ASSIGN_SUB, "AssignSub");
}

ps_node *ps_variables_initializer(ps_graph *g, ps_variable *const *vars, size_t n,
                                  const char *name) {
  if (g == NULL) return NULL;
  for (size_t i = 0; i < n; i++)
    if (vars[i] == NULL)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "variables_initializer: variable %zu "
                           "is NULL",
                           i);
  ps_node **deps = calloc(n + 1, sizeof *deps);
  if (deps == NULL) return ps_graph_oom_(g);
  for (size_t i = 0; i < n; i++)
    deps[i] = vars[i]->initializer;
  ps_node *x = ps_group(g, deps, n, name ? name : "init");
  free(deps);
  return x;
}

ps_node *ps_global_variables_initializer(ps_graph *g) {
  size_t n;
  ps_variable *const *v = ps_collection_variables(g, PS_GLOBAL_VARIABLES, &n);
  return ps_variables_initializer(g, v, n, "init");
}

ps_node *ps_local_variables_initializer(ps_graph *g) {
  size_t n;
  ps_variable *const *v = ps_collection_variables(g, PS_LOCAL_VARIABLES, &n);
  return ps_variables_initializer(g, v, n, "init_1");
}

ps_node *ps_is_variable_initialized(ps_variable *v) {
  ps_node *n = colocated(v, &op_is_init, "IsVariableInitialized", NULL, 0);
  if (n) {
    n->dtype = PS_DT_BOOL;
    n->shape.rank = 0;
  }
  return n;
}

typedef ps_report_extra report_extra;

ps_node *ps_report_uninitialized_variables(ps_graph *g, ps_variable *const *vars,
                                           size_t n) {
  if (g == NULL) return NULL;
  if (vars == NULL) {
    size_t ng, nl;
    ps_variable *const *gv = ps_collection_variables(g, PS_GLOBAL_VARIABLES, &ng);
    ps_variable *const *lv = ps_collection_variables(g, PS_LOCAL_VARIABLES, &nl);
    ps_variable **all = malloc((ng + nl + 1) * sizeof *all);
    if (all == NULL) return ps_graph_oom_(g);
    if (ng) memcpy(all, gv, ng * sizeof *all);
    if (nl) memcpy(all + ng, lv, nl * sizeof *all);
    ps_node *r = ps_report_uninitialized_variables(g, all, ng + nl);
    free(all);
    return r;
  }
  for (size_t i = 0; i < n; i++)
    if (vars[i] == NULL)
      return ps_graph_fail(g, PS_INVALID_ARGUMENT,
                           "report_uninitialized_variables: variable %zu is NULL", i);
  report_extra *e = malloc(sizeof *e + (n + 1) * sizeof(ps_variable *));
  if (e == NULL) return ps_graph_oom_(g);
  if (ps_name_scope_push(g, "report_uninitialized_variables", NULL) != 0) {
    free(e);
    return NULL;
  }
  ps_node *x = ps_node_new(g, &op_report, "boolean_mask", NULL, 0);
  ps_name_scope_pop(g);
  if (x == NULL) {
    free(e);
    return NULL;
  }
  e->n = n;
  if (n) memcpy(e->vars, vars, n * sizeof *vars);
  x->extra = e;
  x->dtype = PS_DT_STRING;
  x->shape.rank = 1;
  x->shape.dim[0] = -1;
  return x;
}

/* Optimizer slots and Adam's beta powers: placed with @primary (TensorFlow's
 * colocate_with: no device function runs, no round-robin turn is taken),
 * filled with @value, not trainable, in GLOBAL_VARIABLES.  @name is the
 * full name ("w/Momentum", "beta1_power"); an existing one is returned. */
ps_variable *ps_slot_create_(ps_variable *primary, const char *name, double value,
                             const ps_shape *shape, ps_status *st) {
  ps_graph *g = primary->g;
  ps_variable *v = find_var(g, name);
  if (v) return v;
  int saved_dev = g->ndev, saved_ns = g->nscope;
  g->ndev = 0;
  g->nscope = 0;
  ps_var_options o = {.not_trainable = true};
  v = new_variable(g, name, primary->dtype, shape, &o);
  g->ndev = saved_dev;
  g->nscope = saved_ns;
  if (v == NULL) {
    ps_status_set(st, g->st.code ? g->st.code : PS_RESOURCE_EXHAUSTED, "%s",
                  g->st.code ? g->st.msg : "out of memory");
    return NULL;
  }
  snprintf(v->device, sizeof v->device, "%s", primary->device);
  v->task = primary->task;
  snprintf(v->read->device, sizeof v->read->device, "%s", primary->device);
  snprintf(v->node->device, sizeof v->node->device, "%s", primary->device);
  v->from_get_variable = true;
  v->has_init = true;
  ps_init_spec_default(&v->init, value == 0 ? PS_INIT_ZEROS : PS_INIT_CONSTANT);
  v->init.value = value;
  v->primary = primary;
  v->initializer = colocated(v, &op_init, "Assign", NULL, 0);
  add_to_collections(g, v, &o);
  return v;
}

/* Every op of this file, for MetaGraph import (saver.c). */
const ps_op_def *const ps_opdefs_variables_[] = {
    &ps_op_variable_def_, &op_read, &op_init, &op_update, &op_is_init, &op_report, NULL};
