/* Worker graphs: nodes, variables on the ps, scopes, collections, placement.
 *
 * A graph is built once, then run many times by a session.  Node outputs
 * are dense tensors; a gradient of a gather is "sparse" (rows + indices) and
 * travels to the ps as rows.  Names follow TensorFlow: "dense/MatMul",
 * uniquified with "_1", "_2"...; variables created with ps_get_variable()
 * live in variable scopes with TensorFlow's reuse rules and messages.
 *
 * Ownership: the graph owns every node and variable; pointers stay valid
 * until ps_graph_destroy().  Not thread-safe while being built. */
#ifndef PARAMSERVER_GRAPH_H
#define PARAMSERVER_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paramserver/cluster.h"
#include "paramserver/init.h"
#include "paramserver/status.h"
#include "paramserver/tensor.h"

typedef struct ps_graph ps_graph;
typedef struct ps_node ps_node;
typedef struct ps_variable ps_variable;

ps_graph *ps_graph_create(void);
void ps_graph_destroy(ps_graph *g);
/* The first error met while building (NULL-returning constructors set it);
 * later constructors given a NULL input return NULL too. */
const ps_status *ps_graph_status(const ps_graph *g);
/* The graph-level random seed (tf.set_random_seed): random ops built after
 * it without a seed of their own derive one from it, as TensorFlow's
 * get_seed does. */
void ps_graph_set_random_seed(ps_graph *g, int64_t seed);

/* ---- nodes ---- */
const char *ps_node_name(const ps_node *n);
const char *ps_node_op(const ps_node *n); /* "MatMul" */
ps_dtype ps_node_dtype(const ps_node *n);
const ps_shape *ps_node_shape(const ps_node *n); /* dims of -1 are unknown */
const char *ps_node_device(const ps_node *n);
ps_node *ps_graph_find_node(ps_graph *g, const char *name);
/* Nodes in creation order. */
size_t ps_graph_num_nodes(const ps_graph *g);
ps_node *ps_graph_node(const ps_graph *g, size_t i);
/* Runs @n only after every node in @deps (TF's control_dependencies). */
int ps_node_add_control_deps(ps_node *n, ps_node *const *deps, size_t ndeps);

/* ---- scopes ---- */
void ps_name_scope_push(ps_graph *g, const char *name);
void ps_name_scope_pop(ps_graph *g);

typedef enum ps_reuse {
  PS_REUSE_NONE = 0,
  PS_REUSE_TRUE = 1,
  PS_AUTO_REUSE = 2
} ps_reuse;
/* A variable scope also opens the name scope of the same name.  Reuse is
 * inherited: a scope inside a reusing scope reuses (as TensorFlow). */
void ps_variable_scope_push(ps_graph *g, const char *name, ps_reuse reuse);
void ps_variable_scope_pop(ps_graph *g);

/* Device scopes: a device string ("/job:ps/task:1", "/cpu:0") or a device
 * function (ps_replica_device_setter).  Applied innermost first, merging as
 * TensorFlow's DeviceSpec.merge_from does. */
typedef struct ps_device_fn ps_device_fn;
/* Opens a device scope (NULL: clears the scopes below it, as
 * tf.device(None)).  An unparsable device string is INVALID_ARGUMENT with
 * TensorFlow's wording ("Unknown attribute: 'nonsense' in
 * '/nonsense:xyz'") and opens no scope (do not pop it), as tf.device
 * raises; more than 64 nested scopes is RESOURCE_EXHAUSTED.  The graph
 * stays usable either way. */
int ps_device_push(ps_graph *g, const char *device, ps_status *st);
void ps_device_push_fn(ps_graph *g, ps_device_fn *fn); /* graph takes ownership */
void ps_device_pop(ps_graph *g);

typedef enum ps_ps_strategy {
  PS_STRATEGY_ROUND_ROBIN = 0,
  PS_STRATEGY_GREEDY_BYTES = 1
} ps_ps_strategy;
typedef struct ps_rds_options {
  const char *ps_device;     /* default "/job:ps" */
  const char *worker_device; /* default "/job:worker" */
  ps_ps_strategy strategy;
  const char *const *ps_ops; /* op types placed on the ps; NULL: variables */
  size_t nps_ops;
} ps_rds_options;
/* TensorFlow's replica_device_setter(cluster=...).  NULL (no device at all,
 * as TensorFlow returns None) when the cluster has no ps job. */
ps_device_fn *ps_replica_device_setter(const ps_cluster *cluster,
                                       const ps_rds_options *opt);

/* ---- collections (GraphKeys) ---- */
#define PS_GLOBAL_VARIABLES "variables"
#define PS_LOCAL_VARIABLES "local_variables"
#define PS_TRAINABLE_VARIABLES "trainable_variables"
#define PS_MODEL_VARIABLES "model_variables"
#define PS_GLOBAL_STEP "global_step"
#define PS_TRAIN_OP "train_op"
#define PS_LOSSES "losses"

void ps_collection_add_variable(ps_graph *g, const char *key, ps_variable *v);
void ps_collection_add_node(ps_graph *g, const char *key, ps_node *n);
/* Borrowed arrays, valid until the collection changes. */
ps_variable *const *ps_collection_variables(ps_graph *g, const char *key, size_t *n);
ps_node *const *ps_collection_nodes(ps_graph *g, const char *key, size_t *n);

/* ---- variables ---- */
typedef struct ps_var_options {
  bool not_trainable;             /* default trainable */
  const char *const *collections; /* NULL: GLOBAL (+ TRAINABLE if trainable) */
  size_t ncollections;
  bool local; /* LOCAL_VARIABLES instead of GLOBAL */
} ps_var_options;

/* tf.Variable(initial_value, name=...): the name is uniquified, never an
 * error.  @initial_value may be any node (computed on the worker, then
 * assigned on the ps), e.g. ps_initialized_value(w) * 2. */
ps_variable *ps_variable_create(ps_graph *g, ps_node *initial_value, const char *name,
                                const ps_var_options *opt);
/* tf.get_variable inside the current variable scope.  @init NULL: glorot
 * uniform for floating types, zeros otherwise (as TensorFlow).  Errors:
 * "Variable conv1/weights already exists, disallowed. Did you mean to set
 * reuse=True or reuse=tf.AUTO_REUSE in VarScope?" and "Variable
 * conv1/weights does not exist, or was not created with tf.get_variable().
 * Did you mean to set reuse=tf.AUTO_REUSE in VarScope?"; shape / dtype
 * mismatches on reuse name both. */
ps_variable *ps_get_variable(ps_graph *g, const char *name, ps_dtype dtype,
                             const ps_shape *shape, const ps_init_spec *init,
                             const ps_var_options *opt, ps_status *st);

const char *ps_variable_name(const ps_variable *v);
ps_dtype ps_variable_dtype(const ps_variable *v);
const ps_shape *ps_variable_shape(const ps_variable *v);
const char *ps_variable_device(const ps_variable *v);
int ps_variable_task(const ps_variable *v); /* ps task, -1 if not on a ps */
bool ps_variable_trainable(const ps_variable *v);
ps_node *ps_variable_value(ps_variable *v);       /* "<name>/read" */
ps_node *ps_variable_initializer(ps_variable *v); /* "<name>/Assign" */
/* A read that waits for @v's initializer (TF's initialized_value()). */
ps_node *ps_initialized_value(ps_variable *v);
/* A new read in the current control-dependency context (read_value()). */
ps_node *ps_read_value(ps_variable *v, ps_node *const *deps, size_t ndeps);

ps_node *ps_assign(ps_variable *v, ps_node *value);
ps_node *ps_assign_add(ps_variable *v, ps_node *value);
ps_node *ps_assign_sub(ps_variable *v, ps_node *value);

ps_node *ps_variables_initializer(ps_graph *g, ps_variable *const *vars, size_t n,
                                  const char *name);
ps_node *ps_global_variables_initializer(ps_graph *g);
ps_node *ps_local_variables_initializer(ps_graph *g);
/* 1-D DT_STRING-like result: fetch with ps_session_run_report(). */
ps_node *ps_report_uninitialized_variables(ps_graph *g, ps_variable *const *vars,
                                           size_t n);
ps_node *ps_is_variable_initialized(ps_variable *v); /* scalar bool */

/* A no-op that runs its inputs (tf.group). */
ps_node *ps_group(ps_graph *g, ps_node *const *deps, size_t n, const char *name);

/* ---- basic nodes (ops.h has the math) ---- */
ps_node *ps_placeholder(ps_graph *g, ps_dtype dtype, const ps_shape *shape,
                        const char *name);
/* Takes a copy of @value. */
ps_node *ps_constant(ps_graph *g, const ps_tensor *value, const char *name);
ps_node *ps_scalar(ps_graph *g, ps_dtype dtype, double value);

#endif
