/* TensorFlow V2 checkpoints ("tensor bundles"): read, write and merge.
 *
 * A bundle with prefix P is the metadata table P.index plus data files
 * P.data-00000-of-0000N; the format is specified at the top of bundle_format.c.
 * What this module writes is byte for byte what TensorFlow's BundleWriter
 * and MergeV2Checkpoints write for the same tensors, and it reads anything
 * they wrote (including Snappy-compressed index blocks from older builds).
 *
 * Errors name the file and the fault, e.g.
 *   checkpoint /ckpt/model-100.index: block 3: bad checksum
 *   checkpoint /ckpt/model-100.data-00000-of-00002: tensor "w": data
 *   checksum mismatch (stored 0x..., computed 0x...)
 * Codes: NOT_FOUND for a missing file or key, DATA_LOSS for a corrupt or
 * truncated file, INVALID_ARGUMENT for bad calls, UNIMPLEMENTED for dtypes
 * a call cannot handle, and for failed system calls the errno's code
 * (ENOENT NOT_FOUND, EACCES PERMISSION_DENIED, ENOSPC RESOURCE_EXHAUSTED,
 * others UNKNOWN) with strerror in the message. */
#ifndef PS_BUNDLE_H
#define PS_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tensor.h"

/* One slice of a partitioned tensor (TensorFlow's TensorSlice): per
 * dimension a start and a length, length -1 meaning "the whole dimension"
 * (start is then 0).  Functions below take the two arrays, with the rank of
 * the full tensor. */
typedef struct ps_bundle_slice {
  int rank;
  int64_t start[PS_MAX_RANK];
  int64_t length[PS_MAX_RANK];
} ps_bundle_slice;

/* Parses a SaveV2/RestoreV2 "shape_and_slices" string, e.g. "10 20 0,5:0,20"
 * (the full shape, then per dimension "start,length" or "-" joined by ':').
 * The empty string means "the whole tensor": *@sliced = false and @full and
 * @slice are left untouched.  INVALID_ARGUMENT on a malformed spec or a
 * slice outside the shape. */
int ps_bundle_parse_shape_and_slice(const char *spec, ps_shape *full,
                                    ps_bundle_slice *slice, bool *sliced, ps_status *st);

/* Data file name: "<prefix>.data-%05d-of-%05d".  Returns @buf, or NULL if
 * @n is too small. */
char *ps_bundle_data_filename(const char *prefix, int shard, int num_shards, char *buf,
                              size_t n);

/* ---- Writer ----------------------------------------------------------- */

/* One writer is used by one thread at a time. */
typedef struct ps_bundle_writer ps_bundle_writer;

/* Starts a bundle at @prefix: creates the directory of @prefix if needed and
 * opens the data file under a temporary name
 * ("P.data-00000-of-00001.tempstate<random>").  NULL on error. */
ps_bundle_writer *ps_bundle_writer_create(const char *prefix, ps_status *st);

/* @cancel(@arg) is asked before each piece (4 MiB) goes to the file; when
 * it returns true the writer stops with CANCELLED (sticky, like an I/O
 * error), so a big tensor does not delay a shutdown.  NULL: never. */
void ps_bundle_writer_set_cancel(ps_bundle_writer *w, bool (*cancel)(void *arg),
                                 void *arg);

/* Data bytes written so far (the data file's size), for progress reports. */
uint64_t ps_bundle_writer_bytes(const ps_bundle_writer *w);

/* Appends a tensor of a fixed-size dtype (every TensorFlow dtype but
 * DT_STRING, DT_RESOURCE and DT_VARIANT), @nbytes = elements * element size,
 * in host byte order.  Keys may come in any order (the index is sorted at
 * finish; data stays in call order, as TensorFlow does); a duplicate or empty
 * key is INVALID_ARGUMENT.  @data is copied to the file through a bounded
 * buffer and checksummed from that copy, so a tensor that changes while it
 * is written still gives a self-consistent file.  After an I/O error every
 * later call fails with the same status. */
int ps_bundle_writer_add(ps_bundle_writer *w, const char *key, int dtype,
                         const ps_shape *shape, const void *data, size_t nbytes,
                         ps_status *st);

/* Appends a DT_STRING tensor of ps_shape_num_elements(@shape) strings;
 * @lens may be NULL for NUL-terminated strings. */
int ps_bundle_writer_add_strings(ps_bundle_writer *w, const char *key,
                                 const ps_shape *shape, const char *const *strs,
                                 const size_t *lens, ps_status *st);

/* Appends one slice of the partitioned tensor @full_name (TensorFlow's
 * BundleWriter::AddSlice): per dimension of @full_shape, @start[d] and
 * @length[d] (-1 = the whole dimension).  The entry @full_name records
 * dtype, the full shape and the list of slices; the values go under an
 * encoded slice key.  @data holds the slice's elements row-major.  A slice
 * covering the whole tensor is a plain ps_bundle_writer_add().  Adding the
 * same slice twice, or a slice of a name added as a plain tensor (or with
 * another dtype or full shape), is INVALID_ARGUMENT. */
int ps_bundle_writer_add_slice(ps_bundle_writer *w, const char *full_name, int dtype,
                               const ps_shape *full_shape, const int64_t *start,
                               const int64_t *length, const void *data, size_t nbytes,
                               ps_status *st);

/* Completes the bundle: flushes and fdatasyncs the data file and renames it
 * into place, writes the index under a temporary name, fsyncs it and
 * renames it to P.index, then fsyncs the directory.  A crash at any point
 * leaves either no P.index or a complete one.  The writer is then spent:
 * destroy it. */
int ps_bundle_writer_finish(ps_bundle_writer *w, ps_status *st);

/* Frees the writer; an unfinished bundle's temporary files are removed.
 * NULL is a no-op. */
void ps_bundle_writer_destroy(ps_bundle_writer *w);

/* ---- Merge ------------------------------------------------------------ */

/* TensorFlow's MergeV2Checkpoints: merges the bundles @part_prefixes[0..n)
 * (each written by one writer, e.g. "P_temp/part-00000-of-00002") into
 * @out_prefix.  Part k's data file becomes P.data-0000k-of-0000N (renamed,
 * not copied); entries get their new shard_id; slices of one partitioned
 * tensor from several parts are joined.  The merged index is written to a
 * temporary name first and renamed into place last, after the data files,
 * so a crash never leaves a half-written or dangling P.index.  Then, best
 * effort, the parts' .index files are deleted and their directories removed
 * if empty and not the output's directory.  Nothing is moved if any part is
 * unreadable or conflicts (duplicate key, dtype or shape mismatch); on any
 * failure the merged index is removed and the data files are moved back. */
int ps_bundle_merge(const char *const *part_prefixes, size_t n, const char *out_prefix,
                    ps_status *st);

/* ---- Reader ----------------------------------------------------------- */

typedef struct ps_bundle_reader ps_bundle_reader;

/* One index entry.  Pointers stay valid until the reader is closed. */
typedef struct ps_bundle_entry {
  const char *key; /* NUL-terminated; slice keys contain NUL bytes, see key_len */
  size_t key_len;
  int dtype;
  ps_shape shape; /* for a partitioned tensor: the full shape */
  bool is_slice;  /* an encoded slice key (TensorFlow hides these in listings) */
  int shard_id;
  uint64_t offset; /* in the data file */
  uint64_t size;   /* bytes */
  uint32_t crc32c; /* masked */
  size_t nslices;  /* > 0: a partitioned tensor whose values are in slices */
  const ps_bundle_slice *slices;
} ps_bundle_entry;

/* Opens P.index: reads the whole table, verifying every block's checksum,
 * the header and every entry.  Data files are opened on first read; a
 * missing one is NOT_FOUND "...: missing data shard".  NULL on error
 * (NOT_FOUND if P.index does not exist, DATA_LOSS if corrupt).  After open,
 * all functions may be called from several threads at once. */
ps_bundle_reader *ps_bundle_reader_open(const char *prefix, ps_status *st);
/* The same, refusing a symbolic link at the index or a data file itself
 * (PERMISSION_DENIED): for files in a directory where a link can only be
 * planted (the ps's checkpoint directory).  Either open refuses an index
 * or data file that is not a regular file (a FIFO would block every read)
 * with FAILED_PRECONDITION naming it, without blocking. */
ps_bundle_reader *ps_bundle_reader_open_nofollow(const char *prefix, ps_status *st);
void ps_bundle_reader_close(ps_bundle_reader *r); /* NULL is a no-op */

const char *ps_bundle_reader_prefix(const ps_bundle_reader *r);
int ps_bundle_reader_num_shards(const ps_bundle_reader *r);
/* Entries in key order (slice keys first, they start with a NUL byte), the
 * header excluded. */
size_t ps_bundle_reader_count(const ps_bundle_reader *r);
const ps_bundle_entry *ps_bundle_reader_entry(const ps_bundle_reader *r, size_t i);
/* NULL if there is no such key. */
const ps_bundle_entry *ps_bundle_reader_find(const ps_bundle_reader *r, const char *key);

/* Reads a tensor of a ps_tensor dtype into a new tensor (caller destroys
 * it); a partitioned tensor is assembled from its slices.  NOT_FOUND
 * "Key X not found in checkpoint P" if absent; DT_STRING is
 * INVALID_ARGUMENT (use ps_bundle_reader_read_strings). */
int ps_bundle_reader_read(ps_bundle_reader *r, const char *key, ps_tensor **out,
                          ps_status *st);

/* Reads a fixed-size-dtype tensor straight into @dst, which must hold
 * exactly its @nbytes.  Verifies size and checksum; converts byte order if
 * the bundle was written on a host of the other byte order. */
int ps_bundle_reader_read_into(ps_bundle_reader *r, const char *key, void *dst,
                               size_t nbytes, ps_status *st);

/* Reads a plain fixed-size tensor through a small scratch buffer and
 * verifies its size and checksum, keeping nothing. */
int ps_bundle_reader_check(ps_bundle_reader *r, const char *key, ps_status *st);
/* What ps_bundle_reader_read_slice (@start NULL: ps_bundle_reader_read_into)
 * would read into @nbytes, checked the same way (key, size, coverage,
 * every stored piece it touches read and checksummed) through a bounded
 * scratch buffer: no allocation of the tensor's size, nothing kept. */
int ps_bundle_reader_check_slice(ps_bundle_reader *r, const char *full_name,
                                 const int64_t *start, const int64_t *length,
                                 size_t nbytes, ps_status *st);
/* Reads the slice (@start[d], @length[d]; length -1 = whole dimension, one
 * pair per dimension of the full tensor) of the fixed-size-dtype tensor
 * @full_name into @dst (the slice's elements, row-major): from a plain
 * entry, or from the stored slices of a partitioned one, which must cover
 * it (else NOT_FOUND).  Every stored piece it touches is read whole and
 * checksummed. */
int ps_bundle_reader_read_slice(ps_bundle_reader *r, const char *full_name,
                                const int64_t *start, const int64_t *length, void *dst,
                                size_t nbytes, ps_status *st);

/* A DT_STRING tensor: one allocation, freed with ps_bundle_strings_destroy.
 * str[i] is NUL-terminated (strings may contain NUL bytes: use len[i]). */
typedef struct ps_bundle_strings {
  ps_shape shape;
  size_t n;
  const char **str;
  const size_t *len;
} ps_bundle_strings;

int ps_bundle_reader_read_strings(ps_bundle_reader *r, const char *key,
                                  ps_bundle_strings **out, ps_status *st);
void ps_bundle_strings_destroy(ps_bundle_strings *s); /* NULL is a no-op */

/* Reads every entry and checks its size and checksum (and that every slice
 * of a partitioned tensor is stored), without keeping the values. */
int ps_bundle_reader_verify(ps_bundle_reader *r, ps_status *st);

#endif
