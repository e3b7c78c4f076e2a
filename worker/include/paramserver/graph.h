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

#include "paramserver/api.h"
#include "paramserver/cluster.h"
#include "paramserver/init.h"
#include "paramserver/status.h"
#include "paramserver/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_graph ps_graph;
typedef struct ps_node ps_node;
typedef struct ps_variable ps_variable;

PS_API ps_graph *ps_graph_create(void);
PS_API void ps_graph_destroy(ps_graph *g);
/* Errors: one rule for every constructor (each function that adds a node,
 * a variable or a scope).  On failure it returns NULL (or an error code),
 * adds nothing to the graph and records its error: ps_graph_status()
 * returns it until the next failure or ps_graph_clear_status(), and a
 * constructor taking a ps_status reports there too.  The graph stays
 * usable: later constructors and sessions work as if the failed call had
 * never been made (as TensorFlow's raising constructors leave the graph).
 * A constructor given a NULL input (the result of one that failed)
 * returns NULL and keeps the error that made that input NULL.  Every
 * accessor takes NULL and returns NULL / 0 / PS_DT_INVALID. */
PS_API const ps_status *ps_graph_status(const ps_graph *g);
PS_API void ps_graph_clear_status(ps_graph *g);
/* The graph-level random seed (tf.set_random_seed): random ops built after
 * it without a seed of their own derive one from it, as TensorFlow's
 * get_seed does. */
PS_API void ps_graph_set_random_seed(ps_graph *g, int64_t seed);

/* ---- nodes ---- */
PS_API const char *ps_node_name(const ps_node *n);
PS_API const char *ps_node_op(const ps_node *n); /* "MatMul" */
PS_API ps_dtype ps_node_dtype(const ps_node *n);
PS_API const ps_shape *ps_node_shape(const ps_node *n); /* dims of -1 are unknown */
PS_API const char *ps_node_device(const ps_node *n);
PS_API ps_node *ps_graph_find_node(ps_graph *g, const char *name);
/* Nodes in creation order. */
PS_API size_t ps_graph_num_nodes(const ps_graph *g);
PS_API ps_node *ps_graph_node(const ps_graph *g, size_t i);
/* Runs @n only after every node in @deps (TF's control_dependencies). */
PS_API int ps_node_add_control_deps(ps_node *n, ps_node *const *deps, size_t ndeps);

/* ---- scopes ---- */
/* Opens the name scope @name inside the current one, made unique as
 * TensorFlow's name_scope does: "model", then "model_1" when re-entered.
 * A name ending in "/" re-enters that exact (full) scope; "" is the root.
 * Errors (nothing is opened then; do not pop): more than 64 nested scopes
 * is RESOURCE_EXHAUSTED; a scope name over 1023 bytes INVALID_ARGUMENT. */
PS_API int ps_name_scope_push(ps_graph *g, const char *name, ps_status *st);
PS_API void ps_name_scope_pop(ps_graph *g);

typedef enum ps_reuse {
  PS_REUSE_NONE = 0,
  PS_REUSE_TRUE = 1,
  PS_AUTO_REUSE = 2
} ps_reuse;
/* tf.variable_scope(name, reuse=...): opens the variable scope @name inside
 * the current one, and the name scope of the same name (made unique, so
 * re-entering "model" names ops "model_1/conv2/Relu" while its variables
 * stay "model/conv2/weights").  Reuse is inherited: a scope inside a
 * reusing scope reuses.  Errors as ps_name_scope_push; nothing is opened
 * then. */
PS_API int ps_variable_scope_push(ps_graph *g, const char *name, ps_reuse reuse,
                                  ps_status *st);
/* A variable scope object (`with tf.variable_scope(...) as scope`), owned
 * by the graph. */
typedef struct ps_variable_scope ps_variable_scope;
/* The innermost open variable scope; NULL at the root. */
PS_API ps_variable_scope *ps_variable_scope_current(ps_graph *g);
/* tf.variable_scope(scope_object, reuse=...): re-enters @scope by its full
 * name wherever it is opened (not nested in the current variable scope),
 * reusing if @reuse or @scope does; its name scope is opened anew
 * ("model_1"), as TensorFlow does. */
PS_API int ps_variable_scope_push_scope(ps_graph *g, ps_variable_scope *scope,
                                        ps_reuse reuse, ps_status *st);
/* scope.reuse_variables(): get_variable reuses in @scope from now on. */
PS_API void ps_variable_scope_reuse_variables(ps_variable_scope *scope);
/* Its full name: "model/conv1". */
PS_API const char *ps_variable_scope_name(const ps_variable_scope *scope);
/* The name scope it opened when made, with a trailing "/": "model/". */
PS_API const char *ps_variable_scope_original_name_scope(const ps_variable_scope *scope);
PS_API ps_reuse ps_variable_scope_reuse(const ps_variable_scope *scope);
PS_API void ps_variable_scope_pop(ps_graph *g);

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
PS_API int ps_device_push(ps_graph *g, const char *device, ps_status *st);
PS_API void ps_device_push_fn(ps_graph *g, ps_device_fn *fn); /* graph takes ownership */
PS_API void ps_device_pop(ps_graph *g);

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
PS_API ps_device_fn *ps_replica_device_setter(const ps_cluster *cluster,
                                              const ps_rds_options *opt);

/* ---- collections (GraphKeys) ---- */
#define PS_GLOBAL_VARIABLES "variables"
#define PS_LOCAL_VARIABLES "local_variables"
#define PS_TRAINABLE_VARIABLES "trainable_variables"
#define PS_MODEL_VARIABLES "model_variables"
#define PS_GLOBAL_STEP "global_step"
#define PS_TRAIN_OP "train_op"
#define PS_LOSSES "losses"

PS_API void ps_collection_add_variable(ps_graph *g, const char *key, ps_variable *v);
PS_API void ps_collection_add_node(ps_graph *g, const char *key, ps_node *n);
/* Borrowed arrays, valid until the collection changes. */
PS_API ps_variable *const *ps_collection_variables(ps_graph *g, const char *key,
                                                   size_t *n);
PS_API ps_node *const *ps_collection_nodes(ps_graph *g, const char *key, size_t *n);

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
PS_API ps_variable *ps_variable_create(ps_graph *g, ps_node *initial_value,
                                       const char *name, const ps_var_options *opt);
/* tf.get_variable inside the current variable scope.  @init NULL: glorot
 * uniform for floating types, zeros otherwise (as TensorFlow).  @dtype
 * PS_DT_INVALID is float32 (TensorFlow's dtype=None).  Variables are
 * shared by the name given here, among get_variable's own: a name a
 * tf.Variable (ps_variable_create) holds is made unique ("v_1", still
 * found as "v" by a later get_variable with reuse), as TensorFlow does.
 * Errors:
 * "Variable conv1/weights already exists, disallowed. Did you mean to set
 * reuse=True or reuse=tf.AUTO_REUSE in VarScope?" and "Variable
 * conv1/weights does not exist, or was not created with tf.get_variable().
 * Did you mean to set reuse=tf.AUTO_REUSE in VarScope?"; shape / dtype
 * mismatches on reuse name both. */
PS_API ps_variable *ps_get_variable(ps_graph *g, const char *name, ps_dtype dtype,
                                    const ps_shape *shape, const ps_init_spec *init,
                                    const ps_var_options *opt, ps_status *st);

/* tf.get_variable(name, initializer=<tensor>): the shape and dtype come
 * from @initial_value (any node with a fully known shape; computed on the
 * worker, then assigned on the ps).  @shape must be NULL ("If initializer
 * is a constant, do not specify shape.", as TensorFlow); @dtype is
 * PS_DT_INVALID or the initial value's.  Scopes and reuse as above. */
PS_API ps_variable *ps_get_variable_from(ps_graph *g, const char *name, ps_dtype dtype,
                                         const ps_shape *shape, ps_node *initial_value,
                                         const ps_var_options *opt, ps_status *st);

PS_API const char *ps_variable_name(const ps_variable *v);
PS_API ps_dtype ps_variable_dtype(const ps_variable *v);
PS_API const ps_shape *ps_variable_shape(const ps_variable *v);
PS_API const char *ps_variable_device(const ps_variable *v);
PS_API int ps_variable_task(const ps_variable *v); /* ps task, -1 if not on a ps */
PS_API bool ps_variable_trainable(const ps_variable *v);
PS_API ps_node *ps_variable_value(ps_variable *v);       /* "<name>/read" */
PS_API ps_node *ps_variable_initializer(ps_variable *v); /* "<name>/Assign" */
/* TF 1.x's initialized_value(): a read that waits for @v's initializer when
 * that runs too; when @v is uninitialized (and its initializer does not
 * run), @v's initial value instead (@v stays uninitialized), so
 * w = initialized_value(v) + 1 initializes w alone, through any chain. */
PS_API ps_node *ps_initialized_value(ps_variable *v);
/* A new read in the current control-dependency context (read_value()). */
PS_API ps_node *ps_read_value(ps_variable *v, ps_node *const *deps, size_t ndeps);

PS_API ps_node *ps_assign(ps_variable *v, ps_node *value);
PS_API ps_node *ps_assign_add(ps_variable *v, ps_node *value);
PS_API ps_node *ps_assign_sub(ps_variable *v, ps_node *value);

PS_API ps_node *ps_variables_initializer(ps_graph *g, ps_variable *const *vars, size_t n,
                                         const char *name);
PS_API ps_node *ps_global_variables_initializer(ps_graph *g);
PS_API ps_node *ps_local_variables_initializer(ps_graph *g);
/* Fetched by ps_session_run: a 1-D DT_STRING tensor of the uninitialized
 * variables' names (ps_tensor_string); ps_session_run_report() gives them
 * as a C array. */
PS_API ps_node *ps_report_uninitialized_variables(ps_graph *g, ps_variable *const *vars,
                                                  size_t n);
PS_API ps_node *ps_is_variable_initialized(ps_variable *v); /* scalar bool */

/* A no-op that runs its inputs (tf.group). */
PS_API ps_node *ps_group(ps_graph *g, ps_node *const *deps, size_t n, const char *name);

/* ---- basic nodes (ops.h has the math) ---- */
PS_API ps_node *ps_placeholder(ps_graph *g, ps_dtype dtype, const ps_shape *shape,
                               const char *name);
/* Takes a copy of @value. */
PS_API ps_node *ps_constant(ps_graph *g, const ps_tensor *value, const char *name);
PS_API ps_node *ps_scalar(ps_graph *g, ps_dtype dtype, double value);

#ifdef __cplusplus
}
#endif

#endif
