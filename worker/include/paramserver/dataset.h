/* Datasets for the built-in training models: Fashion-MNIST (read from IDX
 * files, or synthetic when the files are not installed), synthetic linear
 * regression, and synthetic click-through data for wide-and-deep models;
 * plus batching and a shuffling, sharding iterator.
 *
 * A dataset is a few tensors whose first dimension is the example index:
 *
 *   dataset        x                  ids                dense        y
 *   fashion-mnist  float [n,784] 0..1 -                  -            int64 [n] 0..9
 *   linreg         float [n,dim]      -                  -            float [n,1]
 *   ctr            -                  int64 [n,nfields]  float [n,4]  int64 [n] 0/1
 *
 * Labels are int64, as the project's placeholders feed
 * ps_sparse_softmax_cross_entropy_with_logits; a batch is again a
 * ps_dataset, whose tensors can be fed to ps_session_run directly.
 *
 * Nothing here keeps global state: any thread may call any function on
 * its own datasets and iterators (reading one dataset from several threads
 * at once is fine).  Generated data depend only on the arguments (Philox
 * streams keyed by the seed), so every worker of a job that passes the same
 * seed sees the same data. */
#ifndef PARAMSERVER_DATASET_H
#define PARAMSERVER_DATASET_H

#include <stdbool.h>
#include <stdint.h>

#include "paramserver/api.h"
#include "paramserver/status.h"
#include "paramserver/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_dataset {
  int64_t n;        /* examples: dim 0 of every tensor below */
  ps_tensor *x;     /* features (NULL if the dataset has none) */
  ps_tensor *ids;   /* sparse categorical ids, one per field */
  ps_tensor *dense; /* dense features next to @ids */
  ps_tensor *y;     /* labels */
} ps_dataset;

/* The dataset owns its tensors.  Frees them and zeroes @d; NULL and a
 * zeroed dataset are no-ops, so a dataset can be freed twice. */
PS_API void ps_dataset_free(ps_dataset *d);

/* The tensor named "x", "ids", "dense" or "y"; NULL if @d has none. */
PS_API ps_tensor *ps_dataset_tensor(const ps_dataset *d, const char *name);

/* ---- IDX files (MNIST's format) ---- */

/* Reads an IDX file, gzip-compressed or plain (zlib reads both, whatever
 * the name): magic 0x0000TTRR with type TT 0x08 uint8, 0x09 int8, 0x0B
 * int16, 0x0C int32, 0x0D float, 0x0E double and rank RR, then RR
 * big-endian uint32 dims, then the elements, big-endian.  On success *out
 * is a new tensor of that dtype and shape (caller destroys it).  Errors
 * name the file and the fault: NOT_FOUND, PERMISSION_DENIED, or DATA_LOSS
 * for bad magic / bad type or rank / truncated ("expected N bytes of data,
 * file has M") / trailing bytes / corrupt gzip / dims whose size
 * overflows.  Never trusts a dim: memory grows with the data read.  @st
 * may be NULL. */
PS_API int ps_idx_load(const char *path, ps_tensor **out, ps_status *st);

/* ---- Fashion-MNIST ---- */

#define PS_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Loads Fashion-MNIST from @dir (NULL: PS_FASHION_MNIST_DIR, where the
 * Debian package dataset-fashion-mnist installs it): the files
 * train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte
 * and t10k-labels-idx1-ubyte, each with or without ".gz".  @train gets
 * 60000 examples, @test 10000: x float [n,784] (pixel / 255), y int64 [n].
 * Either of @train / @test may be NULL to skip it.
 *
 * When none of the four files exists, logs one warning (install the
 * package: apt-get install dataset-fashion-mnist), sets *@synthetic (may
 * be NULL) and returns ps_dataset_fashion_mnist_synthetic(60000, 10000,
 * 1, ...).  Files that exist but are corrupt, or a partial set, are an
 * error naming the file (no fallback).  On error nothing is allocated. */
PS_API int ps_dataset_fashion_mnist(const char *dir, ps_dataset *train, ps_dataset *test,
                                    bool *synthetic, ps_status *st);

/* Synthetic stand-in with Fashion-MNIST's shapes and dtypes: 10 class
 * prototype images (from @seed) plus per-example brightness and pixel
 * noise, clamped to [0,1]; labels uniform over 0..9.  An MLP (or even a
 * nearest-centroid classifier) gets well above 85% test accuracy.  Train
 * and test share the prototypes but not the noise.  @ntrain / @ntest >= 0;
 * a NULL dataset is skipped. */
PS_API int ps_dataset_fashion_mnist_synthetic(int64_t ntrain, int64_t ntest,
                                              uint64_t seed, ps_dataset *train,
                                              ps_dataset *test, ps_status *st);

/* ---- Synthetic regression and click-through data ---- */

#define PS_DATASET_LINREG_NOISE 0.01 /* standard deviation of y's noise */

/* y = x . w + b + noise: x float [n,dim] standard normal, w standard
 * normal, b uniform in [-1,1], noise normal with standard deviation
 * PS_DATASET_LINREG_NOISE; y float [n,1].  The true parameters go to
 * @true_w (dim doubles) and @true_b when not NULL.  n >= 0, dim >= 1. */
PS_API int ps_dataset_linreg(int64_t n, int64_t dim, uint64_t seed, ps_dataset *out,
                             double *true_w, double *true_b, ps_status *st);

#define PS_DATASET_CTR_DENSE 4 /* dense features per click-through example */

/* Click-through examples for wide-and-deep models: ids int64 [n,nfields],
 * one id per field in [0,vocab) with a Zipf-like skew (P(rank k) ~ 1/(k+1);
 * each field has its own frequent ids); dense float [n,PS_DATASET_CTR_DENSE]
 * standard normal; y int64 [n] 0/1 drawn from a hidden logistic model:
 * p = sigmoid(-0.5 + 2/sqrt(nfields) * sum_f w[ids_f] + 0.5 * v . dense)
 * with per-id weights w and dense weights v standard normal (from @seed).
 * About 40% of labels are 1; a logistic model over one-hot ids and the
 * dense features learns it well above the base rate.  n >= 0, vocab >= 1,
 * nfields >= 1. */
PS_API int ps_dataset_ctr(int64_t n, int64_t vocab, int nfields, uint64_t seed,
                          ps_dataset *out, ps_status *st);

/* A click log for embedding tables (paramserver/embedding.h): as
 * ps_dataset_ctr, but each field's ids are 64-bit keys (any int64 value,
 * a hash of the field and the key's rank), ranks follow Zipf(s =
 * PS_DATASET_CTR_LOG_ZIPF) over a vocabulary that grows from @vocab / 2
 * to @vocab keys per field along the log (new keys keep arriving, so a
 * test split from the log's end holds keys training never saw), and the
 * label is drawn from a planted logistic model
 *   p = sigmoid(-1 + 2/sqrt(nfields) * sum_f w(key_f) + 0.5 * v . dense)
 * with w(key) and v standard normal (from @seed).  @prob (may be NULL)
 * receives each example's p: the best any model can predict, for AUC and
 * log loss to be compared with.  n >= 0, nfields >= 1, vocab >= 2. */
#define PS_DATASET_CTR_LOG_ZIPF 1.1
PS_API int ps_dataset_ctr_log(int64_t n, int nfields, int64_t vocab, uint64_t seed,
                              ps_dataset *out, float *prob, ps_status *st);

/* Reads a click log in Criteo's TSV layout: per line a 0/1 label, 13
 * integer features and 26 categorical ones (hex strings), tab-separated,
 * any of them empty.  ids int64 [n,26]: each a hash of its field and
 * string (an empty one is its own key per field); dense float [n,13]:
 * log(1 + max(x, 0)) (empty: 0); y int64 [n].  At most @max_rows lines
 * (0: all).  NOT_FOUND / DATA_LOSS name the file and line. */
#define PS_DATASET_CRITEO_DENSE 13
#define PS_DATASET_CRITEO_FIELDS 26
PS_API int ps_dataset_criteo_tsv(const char *path, int64_t max_rows, ps_dataset *out,
                                 ps_status *st);

/* ---- Batches ---- */

/* Rows [start, min(start + size, n)) of @d into @b (a batch is a dataset
 * of those rows; 0 <= start < n, size >= 1).  @b must be zeroed or hold an
 * earlier batch: tensors of the right shape that nobody else references
 * are refilled in place, others are replaced.  Free @b with
 * ps_dataset_free.  INVALID_ARGUMENT / OUT_OF_RANGE / RESOURCE_EXHAUSTED. */
PS_API int ps_dataset_batch(const ps_dataset *d, int64_t start, int64_t size,
                            ps_dataset *b, ps_status *st);

/* Rows @idx[0..k) of @d, in that order, into @b (as ps_dataset_batch). */
PS_API int ps_dataset_gather(const ps_dataset *d, const int64_t *idx, int64_t k,
                             ps_dataset *b, ps_status *st);

typedef struct ps_dataset_iter ps_dataset_iter;

typedef struct ps_dataset_iter_options {
  int64_t batch_size; /* >= 1 */
  bool shuffle;       /* reshuffle every epoch; false: in order */
  uint64_t seed;      /* the orders: epoch e is a permutation keyed by (seed, e) */
  int task;           /* shard: this worker gets examples i with */
  int num_tasks;      /*   i % num_tasks == task; num_tasks 0 or 1: all */
} ps_dataset_iter_options;

/* An endless stream of batches over @d (borrowed: it must outlive the
 * iterator and not change).  Each epoch visits every example of the shard
 * once; batches wrap around epoch ends, so every batch has batch_size
 * rows.  Workers with different seeds see different orders.  NULL with
 * @st set on bad options (e.g. an empty shard) or out of memory.  One
 * thread at a time per iterator. */
PS_API ps_dataset_iter *ps_dataset_iter_create(const ps_dataset *d,
                                               const ps_dataset_iter_options *o,
                                               ps_status *st);
PS_API void ps_dataset_iter_destroy(ps_dataset_iter *it); /* NULL is a no-op */
/* The next batch into @b (as ps_dataset_batch: reuses @b's tensors). */
PS_API int ps_dataset_iter_next(ps_dataset_iter *it, ps_dataset *b, ps_status *st);
/* Examples in this iterator's shard. */
PS_API int64_t ps_dataset_iter_shard_size(const ps_dataset_iter *it);
/* Completed epochs: 0 until the shard's last example has been returned. */
PS_API int64_t ps_dataset_iter_epoch(const ps_dataset_iter *it);

#ifdef __cplusplus
}
#endif

#endif
