/* Partitioned variables along axis 0 and embedding lookups over them.
 *
 * A partitioned variable is n ordinary variables "name/part_0".."part_n-1"
 * (each takes its own round-robin turn, so parts spread over the ps); the
 * first dim % n parts are one row larger, as TensorFlow's _iter_slices.
 * Each part remembers the full variable's name, shape and its offset, so
 * initial values do not depend on the partitioning and checkpoints store
 * the parts as slices of one tensor. */
#ifndef PARAMSERVER_PARTITION_H
#define PARAMSERVER_PARTITION_H

#include "paramserver/api.h"
#include "paramserver/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_partitioner {
  enum { PS_PART_FIXED = 0, PS_PART_MIN_MAX = 1 } kind;
  int num_shards;         /* fixed_size_partitioner(num_shards) */
  int max_partitions;     /* min_max_variable_partitioner(max_partitions, */
  int64_t min_slice_size; /*   min_slice_size=256 KiB) */
} ps_partitioner;

typedef struct ps_partitioned_variable {
  char *name;
  ps_dtype dtype;
  ps_shape shape; /* the full shape */
  int n;
  ps_variable **parts;
} ps_partitioned_variable;

/* Number of parts the partitioner gives @shape of @dtype (TensorFlow's
 * formulas; at least 1, at most shape[0]). */
PS_API int ps_partitioner_num_parts(const ps_partitioner *p, ps_dtype dtype,
                                    const ps_shape *shape);

/* get_variable with a partitioner, in the current variable scope; the
 * graph owns the result.  Reuse errors as ps_get_variable, with TF's
 * "Partitioned variable with name %s already exists..." wording; dtype
 * PS_DT_INVALID is float32 (TensorFlow's dtype=None). */
PS_API ps_partitioned_variable *
ps_get_partitioned_variable(ps_graph *g, const char *name, ps_dtype dtype,
                            const ps_shape *shape, const ps_init_spec *init,
                            const ps_partitioner *part, const ps_var_options *opt,
                            ps_status *st);

typedef enum ps_partition_strategy {
  PS_PARTITION_MOD = 0,
  PS_PARTITION_DIV = 1
} ps_partition_strategy;

/* Rows @ids (int32/int64, 1-D) of the table made of @parts: each part's
 * rows are gathered on its ps, then stitched back in order.  With n == 1
 * this is a gather.  The gradient reaches each part as sparse rows. */
PS_API ps_node *ps_embedding_lookup(ps_graph *g, ps_variable *const *parts, int n,
                                    ps_node *ids, ps_partition_strategy strategy);

#ifdef __cplusplus
}
#endif

#endif
