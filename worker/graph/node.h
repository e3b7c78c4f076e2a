/* The graph's interface to the rest of the worker (ops/, train/): what a
 * node, an op definition and a variable are, and the functions through
 * which ops add nodes and the runtime (session, saver, coordinator,
 * optimizer) reads and, for MetaGraph import, builds a graph.  The ps_graph
 * struct itself is private to worker/graph/ (graph_priv.h).
 *
 * A node has one output.  Its op definition says how the session runs it:
 * local ops have a compute kernel that runs on the worker; the other kinds
 * (variable reads, initializers, updates...) are batched by the session into
 * one RPC per ps per wave.  A node whose output is the sparse gradient of a
 * gather carries `sparse_indices` (the node giving the row indices) and
 * `sparse_dense_shape` (the shape of the dense tensor it stands for); its
 * own output is the rows. */
#ifndef PS_WORKER_GRAPH_NODE_H
#define PS_WORKER_GRAPH_NODE_H

#include "common/device.h"
#include "common/init.h"
#include "common/tensor.h"
#include "paramserver/client.h"
#include "paramserver/embedding.h"
#include "paramserver/graph.h"
#include "paramserver/ops.h"

typedef enum ps_op_kind {
  PS_OPK_LOCAL = 0,   /* compute() on the worker */
  PS_OPK_PLACEHOLDER, /* must be fed */
  PS_OPK_CONST,       /* n->value */
  PS_OPK_NOOP,        /* group / control only; output is an empty tensor */
  PS_OPK_VAR_READ,    /* value of n->var (remote gather when the session can) */
  PS_OPK_VAR_INIT,    /* run n->var's initializer (input 0: initial value, if any) */
  PS_OPK_VAR_UPDATE,  /* n->update_op on n->var with input 0 (and sparse indices) */
  PS_OPK_VAR_IS_INIT, /* scalar bool */
  PS_OPK_REPORT_UNINIT,
} ps_op_kind;

typedef struct ps_op_def {
  const char *type; /* TensorFlow's op type: "MatMul" */
  ps_op_kind kind;
  /* Local ops: compute the output from the inputs (borrowed).  *out is a new
   * tensor owned by the caller. */
  int (*compute)(ps_node *n, ps_tensor *const *in, ps_tensor **out, ps_status *st);
  /* Builds the gradient of each input given @dy, the gradient of the
   * output (same shape).  dx[i] = NULL when input i gets none.  NULL:
   * the builder worker/ops/grad.c keeps for the op, if any; else not
   * differentiable (gradient stops). */
  int (*grad)(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx, ps_status *st);
} ps_op_def;

struct ps_node {
  ps_graph *g;
  int id;
  const ps_op_def *def;
  char *name;
  ps_node **in;
  int nin;
  ps_node **ctrl;
  int nctrl;
  ps_dtype dtype;
  ps_shape shape; /* rank -1: unknown; dim -1: unknown */
  char device[PS_DEVICE_STRING_MAX];
  /* attributes */
  int64_t ia[4];
  double fa[4];
  ps_tensor *value;                       /* Const */
  ps_variable *var;                       /* variable ops */
  int update_op;                          /* PS_ASSIGN... / PS_APPLY_... */
  void *extra;                            /* op-specific, freed with free() */
  struct ps_embedding_table *extra_table; /* table ops (tables.c): the graph's */
  ps_node *sparse_indices;
  ps_shape sparse_dense_shape;
};

struct ps_variable {
  ps_graph *g;
  size_t index; /* its place among @g's variables: ps_graph_var_(g, index) */
  char *name;
  ps_dtype dtype;
  ps_shape shape;
  bool trainable;
  bool local;
  char device[PS_DEVICE_STRING_MAX];
  int task;      /* ps task, -1 when not on a ps */
  bool has_init; /* server-side initializer */
  ps_init_spec init;
  double *init_values; /* owned copy of init.values */
  bool from_get_variable;
  /* get_variable's name for it when its node name had to be made unique
   * ("v" for "v_1": a tf.Variable held "v"); NULL: the same as @name */
  char *store_key;
  ps_node *initial_value; /* a worker-side expression, else NULL */
  ps_node *node;          /* the VariableV2 node */
  ps_node *read;          /* "<name>/read" */
  ps_node *initializer;   /* "<name>/Assign" */
  /* parts of partitioned variables */
  char *full_name;
  ps_shape full_shape;
  int64_t offset;       /* first element of this part in the full tensor */
  ps_variable *primary; /* optimizer slots: the variable they serve */
};

/* n->extra of optimizer update nodes. */
typedef struct ps_apply_extra {
  const char *slots[4]; /* names owned by the slot variables */
  size_t nslots;
  double hparams[8]; /* constant hyperparameters, in kernel order */
  size_t nhparams;
  size_t ndynamic; /* more hparams from inputs 1..ndynamic (scalars) */
  bool use_nesterov;
  /* ps_optimizer_set_gradient_dtype(PS_DT_BFLOAT16): the session sends
   * input 0 (the gradient) as bfloat16 when the variable is float32 and on
   * a ps (worker/train/session_remote.c); false: as computed. */
  bool bf16_gradient;
  /* SyncReplicasOptimizer (0: an asynchronous update).  The ps aggregates
   * sync_replicas_to_aggregate updates of each step (proto/ps.proto); the
   * local step is input 1 + ndynamic, a read of global_step.  The update
   * op may then also be PS_ASSIGN / PS_ASSIGN_ADD (global_step, Adam's beta
   * powers: once per step).  sync_total_num_replicas is informational. */
  int sync_replicas_to_aggregate;
  int sync_total_num_replicas;
} ps_apply_extra;

/* n->extra of the embedding-lookup helpers (PartRows, PartPositions:
 * ps_part_info; DynamicStitch: ps_stitch_info). */
typedef struct ps_part_info {
  int p, nparts, strategy;
  int64_t total; /* rows of the full table */
} ps_part_info;
typedef struct ps_stitch_info {
  ps_part_info pi;
  ps_node *positions[]; /* the PartPositions node of each part */
} ps_stitch_info;

/* n->extra of ReportUninitializedVariables. */
typedef struct ps_report_extra {
  size_t n;
  ps_variable *vars[];
} ps_report_extra;

/* Set by the session around a local op's compute(): that node's run
 * counter in this session, or NULL (then a kernel keeps its count in the
 * node).  A stateful kernel (the seeded random ops) counts its runs here,
 * so, as TensorFlow's per-session kernels, a new session starts the
 * sequence again. */
extern _Thread_local uint64_t *ps_kernel_runs_;
/* Set by the session around a local op's compute() too: its client (NULL
 * without ps tasks).  The embedding tables' kernels call it (tables.c). */
extern _Thread_local ps_client *ps_kernel_client_;

/* tables.c: an update of table @t (ps_optimizer_minimize): keys, gradients
 * of keys.shape + [dim], @nhparams constant hyperparameters and
 * @ndynamic more from nodes (scalars), the global step (or NULL). */
ps_node *ps_table_update_node_(struct ps_embedding_table *t, ps_table_op op,
                               ps_node *keys, ps_node *grads, const double *hparams,
                               size_t nhparams, ps_node *const *dynamic, size_t ndynamic,
                               ps_node *step);
/* The table a TableLookup node reads (NULL: another op). */
struct ps_embedding_table *ps_table_of_lookup_(const ps_node *n);
/* The graph's tables (a Saver saves and restores them). */
struct ps_embedding_table *const *ps_graph_tables_(const ps_graph *g, size_t *n);

/* Creates a node named @name_hint inside the current name scope (made
 * unique), placed by the device stack, with inputs @in (NULL inputs:
 * returns NULL, the graph keeps the error that made them NULL).  dtype/shape start as the
 * first input's; constructors set them. */
ps_node *ps_node_new(ps_graph *g, const ps_op_def *def, const char *name_hint,
                     ps_node *const *in, int nin);
/* The out-of-memory policy of the graph code: the graph's status becomes
 * RESOURCE_EXHAUSTED "out of memory" (recorded like every graph error) and
 * the builder returns NULL; nothing aborts.  Returns NULL. */
ps_node *ps_graph_oom_(ps_graph *g);
/* Records the graph's error (the last failure's); returns NULL for
 * convenience. */
ps_node *ps_graph_fail(ps_graph *g, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Every op definition of each file, NULL-terminated: MetaGraph import finds
 * an op by its type and kind there. */
extern const ps_op_def *const ps_opdefs_math_[],
    *const ps_opdefs_nn_[], *const ps_opdefs_reduce_[],
                                *const ps_opdefs_array_[],
                                    *const ps_opdefs_graph_[],
                                        *const ps_opdefs_variables_[],
                                            *const ps_opdefs_partition_[],
                                                *const ps_opdefs_optimizer_[],
                                                    *const ps_opdefs_random_[],
                                                        *const ps_opdefs_conv_[],
                                                            *const ps_opdefs_tables_[];
ps_node *ps_graph_node(const ps_graph *g, size_t i);

/* A failed constructor adds nothing: one that adds several nodes (or
 * variables) takes a mark first and rolls back to it when it fails.
 * ps_graph_failed_since_ tells whether any builder failed since @m. */
typedef struct ps_graph_mark {
  size_t nnodes, nvars, nnames, npvars;
  unsigned nerrors;
} ps_graph_mark;
ps_graph_mark ps_graph_mark_(const ps_graph *g);
bool ps_graph_failed_since_(const ps_graph *g, ps_graph_mark m);
/* Frees every node, variable, partitioned variable and name made since
 * @m and drops them from the collections. */
void ps_graph_rollback_(ps_graph *g, ps_graph_mark m);

/* The graph-level seed, if one was set (false otherwise). */
bool ps_graph_random_seed_(const ps_graph *g, int64_t *seed);

/* ---- the graph's contents, for the runtime ---- */
size_t ps_graph_num_vars_(const ps_graph *g);
ps_variable *ps_graph_var_(const ps_graph *g, size_t i);
/* All variables, in creation order (borrowed; valid until the next one is
 * created); *n gets their number. */
ps_variable **ps_graph_vars_(const ps_graph *g, size_t *n);
/* The variable named @name, or NULL. */
ps_variable *ps_graph_find_var_(const ps_graph *g, const char *name);
/* Whether @n is a variable's own node ("VariableV2"). */
bool ps_node_is_variable_(const ps_node *n);
size_t ps_graph_num_partitioned_(const ps_graph *g);
const struct ps_partitioned_variable *ps_graph_partitioned_(const ps_graph *g, size_t i);
size_t ps_graph_num_collections_(const ps_graph *g);
/* Collection @i: returns its key; its variables and nodes (borrowed). */
const char *ps_graph_collection_(const ps_graph *g, size_t i, ps_variable *const **vars,
                                 size_t *nvars, ps_node *const **nodes, size_t *nnodes);
/* Empties the name and variable scope stacks (without freeing them) so that
 * what is built next is named from the root, as TensorFlow names
 * global_step; ps_graph_scopes_restore_ puts them back. */
typedef struct ps_scope_mark {
  int nscope, nvscope;
} ps_scope_mark;
ps_scope_mark ps_graph_scopes_clear_(ps_graph *g);
void ps_graph_scopes_restore_(ps_graph *g, ps_scope_mark m);
/* An optimizer slot of @primary (named "<primary>/<name>"), filled with
 * @value, on @primary's device; NULL with @st set on error. */
ps_variable *ps_slot_create_(ps_variable *primary, const char *name, double value,
                             const ps_shape *shape, ps_status *st);

/* ---- MetaGraph import (train/metagraph_import.c) builds a graph with these ---- */
/* Appends a zeroed node with op @def, named @name made unique; NULL (the
 * graph failed with "out of memory") when out of memory. */
ps_node *ps_graph_import_node_(ps_graph *g, const ps_op_def *def, const char *name);
/* Appends a zeroed variable named @name (a copy); NULL when out of memory. */
ps_variable *ps_graph_import_var_(ps_graph *g, const char *name);
/* Appends a zeroed partitioned variable named @name with room for @nparts
 * parts; NULL when out of memory. */
struct ps_partitioned_variable *
ps_graph_import_partitioned_(ps_graph *g, const char *name, size_t nparts);

#endif
