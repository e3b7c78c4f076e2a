/* Embedding tables: hash-keyed sparse variables that grow (DESIGN.md
 * "Embedding tables").  A table maps int64 keys to float rows of a fixed
 * dim, each with the slots of the table's optimizer kept beside it.  A
 * row is made on a key's first training lookup by the table's
 * initializer, deterministic per (seed, table, key), and goes again when
 * it expires, is evicted for room, or the table is dropped.
 *
 * Concurrency: a table is split into PS_EMBED_STRIPES stripes by key
 * hash (common/embed_key.h), each with its own mutex, index and rows; a
 * call locks each stripe its keys fall in once, one at a time, so there
 * is no lock across the table and no lock order to keep.  The store's
 * own mutex guards only its list of tables; a table found is referenced
 * and stays valid after a concurrent drop until unreferenced.  Every
 * function may be called from any thread. */
#ifndef PS_EMBED_H
#define PS_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "paramserver/init.h"
#include "paramserver/tensor.h"

#define PS_EMBED_STRIPES 64
#define PS_EMBED_MAX_DIM 65536
#define PS_EMBED_MAX_TABLES 4096 /* per ps */
#define PS_EMBED_MAX_MIN_COUNT 65535
#define PS_EMBED_MAX_SKETCH_DEPTH 8
#define PS_EMBED_DEFAULT_SKETCH_WIDTH ((int64_t)1 << 20)
#define PS_EMBED_DEFAULT_SKETCH_DEPTH 4
#define PS_EMBED_MAX_SKETCH_WIDTH ((int64_t)1 << 30)
/* A stripe's rows are numbered in 26 bits (6 bits of the index entry are
 * the key's tag): at most this many rows per stripe, 64 times that per
 * table and ps. */
#define PS_EMBED_MAX_STRIPE_ROWS (((int64_t)1 << 26) - 2)

typedef enum ps_embed_optimizer {
  PS_EMBED_OPT_NONE = 0, /* scatter-add and SGD only, no slots */
  PS_EMBED_OPT_ADAGRAD,  /* slot: accumulator */
  PS_EMBED_OPT_ADAM,     /* slots: m, v (the lazy rule: touched rows only) */
  PS_EMBED_OPT_FTRL,     /* slots: accumulator, linear */
} ps_embed_optimizer;

typedef enum ps_embed_evict { PS_EMBED_EVICT_LRU = 0, PS_EMBED_EVICT_LFU } ps_embed_evict;

/* The update ops of a table (TableUpdate.op). */
typedef enum ps_embed_op {
  PS_EMBED_SCATTER_ADD = 0, /* row += g */
  PS_EMBED_SGD,             /* row -= lr * g            hparams [lr] */
  PS_EMBED_ADAGRAD,         /* hparams [lr] */
  PS_EMBED_ADAM,            /* hparams [lr, beta1, beta2, epsilon, beta1^t, beta2^t] */
  PS_EMBED_FTRL,            /* hparams [lr, l1, l2, lr_power] */
  PS_EMBED_NUM_OPS
} ps_embed_op;

/* Memory policies, per table and ps (Monolith's).  Zero means off. */
typedef struct ps_embed_policy {
  int64_t min_count;    /* admission: a key gets a row at its min_count-th
                           training lookup (0 and 1: at the first) */
  int64_t sketch_width; /* counters per sketch row (0: the default) */
  int sketch_depth;     /* sketch rows (0: the default) */
  int64_t ttl_steps;    /* expiry: untouched for more global steps */
  int64_t ttl_seconds;  /* expiry: untouched for more seconds */
  int64_t max_rows;     /* capacity of the table on this ps */
  ps_embed_evict evict; /* what goes first at capacity */
} ps_embed_policy;

typedef struct ps_embed_spec {
  const char *name;
  int dtype; /* PS_DT_FLOAT only */
  int64_t dim;
  ps_init_spec init; /* its seed 0: 87654321 */
  ps_embed_optimizer optimizer;
  double slot_init; /* Adagrad's and FTRL's accumulators start here */
  ps_embed_policy policy;
} ps_embed_spec;

typedef struct ps_embed_store ps_embed_store;
typedef struct ps_embed_table ps_embed_table;

/* What a lookup or update did, for its answer and the metrics. */
typedef struct ps_embed_counts {
  int64_t created; /* rows made */
  int64_t refused; /* keys without a row that admission turned away */
  int64_t missing; /* keys without a row (lookups: default rows given;
                      updates: gradients dropped) */
  int64_t evicted; /* rows dropped for room */
  int64_t expired; /* rows dropped for age */
} ps_embed_counts;

typedef struct ps_embed_stats {
  char name[256];
  int64_t dim;
  ps_embed_optimizer optimizer;
  int64_t rows;
  int64_t bytes; /* rows, index and sketch */
  int64_t evicted_total, expired_total, refused_total, created_total;
  ps_embed_policy policy;
} ps_embed_stats;

ps_embed_store *ps_embed_store_create(void);    /* NULL: out of memory */
void ps_embed_store_destroy(ps_embed_store *s); /* NULL is a no-op */

/* Checks @spec: 0 or INVALID_ARGUMENT naming the table and the option
 * ("TableCreate t: max_rows -1 is out of range (0 or more)"). */
int ps_embed_check_spec(const ps_embed_spec *spec, ps_status *st);
/* Makes table @spec->name (its strings are copied).  An existing table
 * with the same spec: 0 and *@created false; another spec: ALREADY_EXISTS
 * saying what differs.  Also INVALID_ARGUMENT (ps_embed_check_spec) and
 * RESOURCE_EXHAUSTED (memory, or PS_EMBED_MAX_TABLES tables already). */
int ps_embed_create(ps_embed_store *s, const ps_embed_spec *spec, bool *created,
                    ps_status *st);
/* The table @name, referenced (ps_embed_unref), or NULL with NOT_FOUND
 * "table NAME not found". */
ps_embed_table *ps_embed_find(ps_embed_store *s, const char *name, ps_status *st);
void ps_embed_unref(ps_embed_table *t);
/* Drops table @name (lookups holding it finish on it): 0 or NOT_FOUND. */
int ps_embed_drop(ps_embed_store *s, const char *name, ps_status *st);
/* The tables' stats, sorted by name (malloc'd, *@n of them; NULL with *@n
 * 0 when there are none or memory is short). */
ps_embed_stats *ps_embed_list(ps_embed_store *s, size_t *n);
/* Every table, referenced (ps_embed_unref each), sorted by name
 * (malloc'd; NULL with *@n > 0: out of memory). */
ps_embed_table **ps_embed_tables(ps_embed_store *s, size_t *n);
/* Rows and bytes of every table. */
void ps_embed_totals(ps_embed_store *s, int64_t *tables, int64_t *rows, int64_t *bytes);

const ps_embed_spec *ps_embed_table_spec(const ps_embed_table *t);
void ps_embed_table_stats(ps_embed_table *t, ps_embed_stats *out);
/* Bytes of admission's sketch of @spec's table once made (0: none). */
int64_t ps_embed_sketch_bytes(const ps_embed_spec *spec);
/* Slots per row of @o (0, 1 or 2). */
int ps_embed_optimizer_slots(ps_embed_optimizer o);
const char *ps_embed_optimizer_name(ps_embed_optimizer o); /* "adagrad" */
int ps_embed_optimizer_from_name(const char *s);           /* -1: unknown */
const char *ps_embed_evict_name(ps_embed_evict e);         /* "lru", "lfu" */
int ps_embed_evict_from_name(const char *s);               /* -1: unknown */
const char *ps_embed_op_name(ps_embed_op op);              /* "ApplyAdagrad" */
/* Hyperparameters op @op takes. */
size_t ps_embed_op_hparams(ps_embed_op op);

/* Rows of keys @keys[0..n) into @out (n x dim floats).  @train: a
 * training lookup, which touches rows (their step, time and count) and
 * makes missing ones that admission lets in; otherwise (inference) a
 * missing key gets its initializer row and nothing changes.  @step: the
 * caller's global step (expiry by steps; 0: none).  Errors:
 * RESOURCE_EXHAUSTED (out of memory, a stripe full), nothing made then
 * but rows already made stay (each is a valid row). */
int ps_embed_lookup(ps_embed_table *t, const int64_t *keys, size_t n, bool train,
                    int64_t step, float *out, ps_embed_counts *c, ps_status *st);
/* Applies @op with gradients @grads (n x dim) to the rows of @keys (in
 * order: a repeated key is two steps, as TensorFlow's sparse kernels do).
 * A key without a row (never admitted, expired, evicted) is skipped and
 * counted missing.  @hp: ps_embed_op_hparams(op) values, checked by the
 * caller.  INVALID_ARGUMENT when @op needs slots the table has not. */
int ps_embed_update(ps_embed_table *t, ps_embed_op op, const int64_t *keys, size_t n,
                    const float *grads, const double *hp, int64_t step,
                    ps_embed_counts *c, ps_status *st);
/* Removes every expired row now (a save, a test); returns how many. */
int64_t ps_embed_sweep(ps_embed_table *t);
/* The initializer row of @key (what a new row starts as), @dim floats. */
int ps_embed_default_row(const ps_embed_table *t, int64_t key, float *out, ps_status *st);

/* ---- snapshots and restores (checkpoints: ps/ckpt_save.c,
 * ps/ckpt_restore.c, DESIGN.md "Embedding tables") ----
 *
 * A snapshot costs no copy when it is taken: a page of 16 records is
 * copied when something is about to change one of them, and each stripe
 * when the snapshot is exported (from its copied pages and the live
 * rest); so a save pauses a training call by the copies of the pages it
 * writes, or one stripe's copy (1/64 of the table). */
typedef struct ps_embed_snap ps_embed_snap;
/* The table as it is now; call while no call changes it (the store's
 * gate is closed).  NULL: out of memory. */
ps_embed_snap *ps_embed_snap_begin(ps_embed_table *t);
const ps_embed_spec *ps_embed_snap_spec(const ps_embed_snap *snap);
int64_t ps_embed_snap_rows(const ps_embed_snap *snap); /* an estimate, for quotas */
void ps_embed_snap_free(ps_embed_snap *snap);          /* NULL is a no-op */

/* A table's rows as arrays (its unexpired rows, in no order): keys, row
 * values [n x dim], the optimizer's slots [n x dim each] (NULL: absent),
 * and per row the step it was last touched at and its training lookups. */
typedef struct ps_embed_export {
  int64_t n, dim;
  int nslots;
  int64_t *keys;
  float *values;
  float *slots[2];
  int64_t *versions, *freqs;
} ps_embed_export;
/* The snapshot's rows (the arrays are malloc'd; ps_embed_export_fini).
 * RESOURCE_EXHAUSTED: no memory for them, or for a copy the snapshot
 * needed while the table changed. */
int ps_embed_snap_export(ps_embed_snap *snap, ps_embed_export *out, ps_status *st);
void ps_embed_export_fini(ps_embed_export *e);
/* TensorFlow's slot name of slot @k of @o ("Adagrad"; Adam's "Adam",
 * "Adam_1"; FTRL's "Ftrl" (accumulator), "Ftrl_1" (linear)), NULL past
 * the last. */
const char *ps_embed_slot_name(ps_embed_optimizer o, int k);
/* Replaces every row of @t with @in's (a repeated key: the last wins;
 * slots NULL: their start values; versions, freqs NULL: 0, a row whose
 * age in steps is not known until it is touched), evicting as the
 * table's capacity says; the table's step becomes the largest of the
 * rows', the checkpoint's clock.  All or nothing: INVALID_ARGUMENT (another
 * dim) or RESOURCE_EXHAUSTED leave the table as it was. */
int ps_embed_replace(ps_embed_table *t, const ps_embed_export *in, ps_status *st);
/* ps_embed_replace in two steps, for a restore of several tables and
 * variables at once: _prepare builds the rows aside (NULL with @st set:
 * nothing changed), _commit puts them in and cannot fail; a prepared
 * table not committed goes with ps_embed_unref. */
ps_embed_table *ps_embed_replace_prepare(ps_embed_table *t, const ps_embed_export *in,
                                         ps_status *st);
void ps_embed_replace_commit(ps_embed_table *t, ps_embed_table *prepared);

#endif
