/* The ps_graph struct and the graph's own helpers, private to worker/graph/
 * (graph.c, scopes.c, placement.c, variables.c, partition.c).  The rest of the worker
 * reaches a graph through the functions in node.h and the public graph.h. */
#ifndef PS_GRAPH_PRIV_H
#define PS_GRAPH_PRIV_H

#include "common/array.h"
#include "node.h"

#define PS_MAX_SCOPE 64
#define PS_NAME_MAX 1024 /* a node's or scope's full name, with its NUL */
#define PS_MAX_CTX 256

/* A collection holds variables and nodes, each kind in its own array (a
 * typed getter returns its kind only), each in insertion order. */
typedef struct ps_collection {
  char *key;
  ps_variable **vars;
  size_t nvars;
  ps_node **nodes;
  size_t nnodes;
} ps_collection;

/* A variable scope object (tf.VariableScope): its full name and reuse.
 * The graph owns every one made; the stack points at the open ones. */
struct ps_variable_scope {
  char *name;                /* "model/conv1" */
  char *original_name_scope; /* the name scope it opened first: "model/" */
  ps_reuse reuse;            /* effective (inherited, or set by reuse_variables) */
};

typedef struct ps_devscope {
  char *str;        /* a device string, or NULL */
  ps_device_fn *fn; /* or a device function */
} ps_devscope;

struct ps_graph {
  ps_status st;     /* the last failed constructor's error */
  unsigned nerrors; /* failures so far (ps_graph_mark_) */
  ps_node **nodes;
  size_t nnodes, capnodes;
  ps_variable **vars;
  size_t nvars;
  struct {
    char *name;
    int count;
  } * names;
  size_t nnames, capnames;
  ps_collection *coll;
  size_t ncoll;
  char *scope[PS_MAX_SCOPE]; /* each the full name scope: "model_1/conv1" */
  int nscope;
  ps_variable_scope *vscope[PS_MAX_SCOPE]; /* open variable scopes */
  int nvscope;
  ps_variable_scope **vsobjs; /* every scope object made */
  size_t nvsobjs;
  ps_devscope dev[PS_MAX_SCOPE];
  int ndev;
  struct ps_partitioned_variable **pvars;
  size_t npvars;
  ps_node *ctx[PS_MAX_CTX];
  int nctx;
  int ctx_marks[PS_MAX_CTX];
  int nctxmarks;
  bool has_seed; /* tf.set_random_seed */
  int64_t seed;
  struct ps_embedding_table **tables; /* tables.c */
  size_t ntables;
  void (*tables_free)(ps_graph *g); /* set by tables.c with its first table */
};

/* The op of a variable's node ("VariableV2", graph.c): ps_node_new does
 * not place it, the variable's constructor does. */
extern const ps_op_def ps_op_variable_def_;

/* A unique name for @full (malloc'd), or NULL with the graph failed. */
char *ps_graph_unique_name_(ps_graph *g, const char *full);
void ps_graph_scoped_name_(ps_graph *g, const char *hint, char *out, size_t n);
void ps_graph_place_(ps_graph *g, ps_node *n);
/* @name inside the current variable scopes ("outer/inner/name") into @out
 * (@n bytes) and the innermost scope's reuse (PS_REUSE_NONE at the root)
 * into *@reuse; INVALID_ARGUMENT naming the limit when the name does not
 * fit. */
int ps_graph_vscope_name_(const ps_graph *g, const char *name, char *out, size_t n,
                          ps_reuse *reuse, ps_status *st);
void ps_variable_free_(ps_variable *v);
void ps_device_fn_free_(ps_device_fn *fn);
void ps_control_dependencies_push_(ps_graph *g, ps_node *const *deps, size_t n);
void ps_control_dependencies_pop_(ps_graph *g);

#endif
