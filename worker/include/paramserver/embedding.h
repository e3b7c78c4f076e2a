/* Embedding tables: hash-keyed sparse variables that grow (README
 * "Embedding tables", DESIGN.md "Embedding tables").
 *
 * A table maps int64 keys, any value, to float rows of a fixed dim.  It
 * exists on every ps task; key k's row lives on task
 * ps_table_key_task(k, tasks), and a call touches each task once.  A row
 * is made by a training lookup of its key (once admission lets it in),
 * from the table's initializer, deterministic per (seed, table, key): a
 * row made again, on any number of ps tasks, starts the same.  It goes
 * when it expires or is evicted for room.  The optimizer's slots (Adagrad's
 * accumulator, Adam's m and v, FTRL's accumulator and linear term) live
 * beside each row and go with it.
 *
 *   ps_table_spec t;
 *   ps_table_spec_default(&t, "user_emb", 16);
 *   t.optimizer = PS_TABLE_ADAGRAD;
 *   t.policy.max_rows = 10000000;     // per ps, least recently used go
 *   ps_client_table_create(c, &t, &st);
 *   ps_tensor *rows = NULL;           // [n, 16]
 *   ps_client_table_lookup(c, "user_emb", keys, true, step, &rows, NULL, &st);
 *   ...                               // gradients grads [n, 16]
 *   double lr = 0.05;
 *   ps_client_table_update(c, "user_emb", PS_TABLE_OP_ADAGRAD, keys, grads,
 *                          &lr, 1, step, NULL, &st);
 *
 * Thread safety and errors as in paramserver/client.h. */
#ifndef PARAMSERVER_EMBEDDING_H
#define PARAMSERVER_EMBEDDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paramserver/api.h"
#include "paramserver/client.h"
#include "paramserver/graph.h"
#include "paramserver/init.h"
#include "paramserver/status.h"
#include "paramserver/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The optimizer a table keeps slots for.  Every table also takes
 * scatter-adds and SGD steps. */
typedef enum ps_table_optimizer {
  PS_TABLE_SGD = 0, /* no slots */
  PS_TABLE_ADAGRAD, /* accumulator, starting at slot_init */
  PS_TABLE_ADAM,    /* m, v (lazy: only the rows a step touches) */
  PS_TABLE_FTRL,    /* accumulator (slot_init), linear */
} ps_table_optimizer;

typedef enum ps_table_evict { PS_TABLE_EVICT_LRU = 0, PS_TABLE_EVICT_LFU } ps_table_evict;

/* Memory policies, per table and ps task; 0 turns each off. */
typedef struct ps_table_policy {
  /* Admission: a key gets a row at its min_count-th training lookup
   * (0, 1: the first; at most 65535).  Until then a lookup reads its
   * initial row and an update of it is dropped.  Unseen keys are counted
   * in a count-min sketch of sketch_depth rows of sketch_width 16-bit
   * counters (0: 4 x 2^20, 8 MiB), never one entry per key. */
  int64_t min_count;
  int64_t sketch_width;
  int sketch_depth;
  /* Expiry: a row untouched for more than ttl_steps global steps (the
   * largest step the training calls brought; an inference lookup's step
   * moves nothing) or ttl_seconds seconds is removed.  A row restored
   * without its step (TensorFlow's own tables) ages by steps once it is
   * touched. */
  int64_t ttl_steps;
  int64_t ttl_seconds;
  /* Capacity: at most max_rows rows per ps task; at capacity the least
   * recently (LRU) or least frequently (LFU: fewest training lookups)
   * used row goes, chosen among 16 sampled rows (all of them while the
   * stripe holds no more).  Below 65536 rows the table is one stripe, so
   * the bound is exact; above, each of the 64 stripes holds its share. */
  int64_t max_rows;
  ps_table_evict evict;
} ps_table_policy;

typedef struct ps_table_spec {
  const char *name;
  ps_dtype dtype;    /* PS_DT_FLOAT */
  int64_t dim;       /* 1 to 65536 */
  ps_init_spec init; /* a new row's values; its seed 0: 87654321 */
  ps_table_optimizer optimizer;
  double slot_init; /* Adagrad's and FTRL's accumulators (0: 0.1) */
  ps_table_policy policy;
} ps_table_spec;

/* float rows of @dim, initialized truncated_normal(stddev 1/sqrt(dim))
 * (TensorFlow's embedding_column), SGD, no policies. */
PS_API void ps_table_spec_default(ps_table_spec *s, const char *name, int64_t dim);

/* The ps task (of @ntasks) holding key @key's row. */
PS_API int ps_table_key_task(int64_t key, int ntasks);

/* Makes the table on every ps task.  An existing table with the same spec
 * is fine; one with another is ALREADY_EXISTS naming what differs.
 * INVALID_ARGUMENT names the option out of range. */
PS_API int ps_client_table_create(ps_client *c, const ps_table_spec *spec, ps_status *st);

typedef struct ps_table_counts {
  int64_t created; /* rows made (lookups) */
  int64_t missing; /* keys without a row: read as their initial row
                      (lookups), gradients dropped (updates) */
} ps_table_counts;

/* The rows of @keys (int64, any shape; repeated keys travel once) into
 * *@out, shaped keys.shape + [dim]: allocated when *@out is NULL, else it
 * must be such a float tensor.  @train: make missing rows (admission
 * permitting) and mark rows used; false (inference): nothing changes on
 * the ps and a key without a row reads its initial row.  @step: the
 * caller's global step (expiry by steps; 0: none).  @counts may be NULL. */
PS_API int ps_client_table_lookup(ps_client *c, const char *name, const ps_tensor *keys,
                                  bool train, int64_t step, ps_tensor **out,
                                  ps_table_counts *counts, ps_status *st);

typedef enum ps_table_op {
  PS_TABLE_OP_SCATTER_ADD = 0, /* row += g              hparams: none */
  PS_TABLE_OP_SGD,             /* row -= lr g           [lr] */
  PS_TABLE_OP_ADAGRAD,         /* TensorFlow's SparseApplyAdagrad  [lr] */
  PS_TABLE_OP_ADAM,            /* lazy Adam  [lr, beta1, beta2, epsilon,
                                  beta1^t, beta2^t] */
  PS_TABLE_OP_FTRL,            /* TensorFlow's ApplyFtrl  [lr, l1, l2, lr_power] */
} ps_table_op;

/* Applies @op with gradients @grads (float, keys.shape + [dim]) to the
 * rows of @keys.  Gradients of a repeated key are summed first and
 * applied once (TensorFlow's optimizers deduplicate IndexedSlices so).
 * Keys without a row are skipped and counted in @counts->missing. */
PS_API int ps_client_table_update(ps_client *c, const char *name, ps_table_op op,
                                  const ps_tensor *keys, const ps_tensor *grads,
                                  const double *hparams, size_t nhparams, int64_t step,
                                  ps_table_counts *counts, ps_status *st);

/* Checkpoints: a cluster save (ps_client_save without a selection, psctl
 * save) writes every table of every ps as of the same moment as the
 * variables, and ps_client_restore puts them back, into any number of ps
 * tasks (each takes the rows of its keys).  This restores the one table
 * @name (made already, on every ps) from the checkpoint's table @from
 * (NULL: @name) of @prefix (NULL: the latest): every ps checks first,
 * then every ps restores.  NOT_FOUND when the checkpoint has no such
 * table, INVALID_ARGUMENT when its rows have another dim. */
PS_API int ps_client_table_restore(ps_client *c, const char *name, const char *prefix,
                                   const char *from, ps_status *st);

typedef struct ps_table_info {
  char *name;
  int64_t dim;
  char *optimizer; /* "none", "adagrad", "adam", "ftrl" */
  int64_t rows, bytes;
  int64_t evicted, expired, refused, created;
  ps_table_policy policy;
} ps_table_info;

/* The tables of ps task @task, sorted by name; free with
 * ps_client_free_table_info(). */
PS_API int ps_client_table_list(ps_client *c, int task, ps_table_info **out, size_t *n,
                                ps_status *st);
PS_API void ps_client_free_table_info(ps_table_info *v, size_t n);

/* ---- in graphs ----
 *
 * A graph's table: ps_get_embedding_table registers @spec in @g (the same
 * name again: the same table).  Its lookups are ops of the graph; the
 * first lookup or update a session runs makes the table on every ps.  An
 * optimizer's minimize() (paramserver/optimizer.h) also updates every
 * table looked up on the way to the loss, with its sparse rule:
 * GradientDescent any table, Adagrad a PS_TABLE_ADAGRAD one, Adam a
 * PS_TABLE_ADAM one (lazy Adam, with the beta powers of the graph's
 * variables).  Tables are saved by cluster saves (ps_client_save without
 * a selection, psctl save) and by the graph's Saver, which restores them
 * too. */
typedef struct ps_embedding_table ps_embedding_table;

PS_API ps_embedding_table *ps_get_embedding_table(ps_graph *g, const ps_table_spec *spec,
                                                  ps_status *st);
PS_API const ps_table_spec *ps_embedding_table_spec(const ps_embedding_table *t);

/* The rows of @keys (int64, any shape): float keys.shape + [dim].  A
 * training lookup (rows made and marked used).  @step: the global step
 * (an int scalar node, e.g. the read of global_step), or NULL. */
PS_API ps_node *ps_embedding_table_lookup(ps_embedding_table *t, ps_node *keys,
                                          ps_node *step);

typedef enum ps_combiner {
  PS_COMBINER_SUM = 0,
  PS_COMBINER_MEAN,
  PS_COMBINER_SQRTN, /* sum / sqrt(count) */
} ps_combiner;

/* TensorFlow's embedding_lookup_sparse over a ragged batch: @keys [nnz]
 * int64, @row_splits [B + 1] int64 (example b holds keys
 * row_splits[b]..row_splits[b+1]) -> [B, dim], each example's rows
 * combined; an example without keys gets zeros.  Differentiable. */
PS_API ps_node *ps_embedding_table_lookup_sparse(ps_embedding_table *t, ps_node *keys,
                                                 ps_node *row_splits,
                                                 ps_combiner combiner, ps_node *step);

#ifdef __cplusplus
}
#endif

#endif
