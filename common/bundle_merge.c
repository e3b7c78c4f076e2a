/* ps_bundle_merge: N bundles (the parts of a sharded save) into one,
 * data files renumbered in first-use order, slice lists joined. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "bundle.h"
#include "bundle_internal.h"
#include "crc32c.h"
#include "fileio.h"

/* ---- Merge ------------------------------------------------------------
 *
 * As TensorFlow's MergeBundles: entries of part k keep their values but get
 * the shard id of their data file in the merged bundle, numbered in the
 * order files are first used (so part k's only file becomes shard k).  A
 * data file no entry uses (a part without tensors) still gets the next id,
 * so that num_shards, the sum over the parts, matches the files there are
 * (TensorFlow would leave the names and the count disagreeing). */

typedef struct merge_part {
  ps_bundle_reader *r;
  int *ids; /* per input shard: merged id, -1 = not yet */
} merge_part;

static int merge_entries(merge_part *parts, size_t n, entry_set *m, int *next_id,
                         ps_status *st) {
  char kb[KEYBUF];
  for (size_t p = 0; p < n; p++) {
    ps_bundle_reader *r = parts[p].r;
    for (size_t i = 0; i < r->set.n; i++) {
      const ps_bundle_entry *e = &r->set.e[i];
      const char *ks = ps_bdl_key_str_(e->key, e->key_len, kb, sizeof kb);
      ps_bundle_entry *x = ps_bdl_es_find_(m, e->key, e->key_len);
      if (x != NULL) {
        if (x->nslices == 0 || e->nslices == 0)
          return ps_status_set(st, PS_INVALID_ARGUMENT,
                               "Duplicate tensor keyed by %s encountered, when "
                               "merging prefix: %s",
                               ks, r->prefix);
        if (x->dtype != e->dtype || !ps_shape_equal(&x->shape, &e->shape))
          return ps_status_set(st, PS_INVALID_ARGUMENT,
                               "checkpoint %s: partitioned tensor %s has another "
                               "dtype or shape than in an earlier part",
                               r->prefix, ks);
        for (size_t k = 0; k < e->nslices; k++) {
          for (size_t j = 0; j < x->nslices; j++)
            if (ps_bdl_slices_overlap_(&x->slices[j], &e->slices[k], &e->shape))
              return ps_status_set(st, PS_INVALID_ARGUMENT,
                                   "checkpoint %s: partitioned tensor %s: a slice "
                                   "overlaps one of an earlier part",
                                   r->prefix, ks);
          if (!ps_bdl_entry_add_slice_(x, &e->slices[k])) goto oom;
        }
        continue;
      }
      int *id = &parts[p].ids[e->shard_id];
      if (*id < 0) *id = (*next_id)++;
      x = ps_bdl_es_add_(m, e->key, e->key_len);
      if (x == NULL) goto oom;
      const char *key = x->key;
      *x = *e;
      x->key = key;
      x->shard_id = *id;
      x->slices = NULL;
      x->nslices = 0;
      for (size_t k = 0; k < e->nslices; k++)
        if (!ps_bdl_entry_add_slice_(x, &e->slices[k])) goto oom;
    }
  }
  return 0;
oom:
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint merge: out of memory");
}

static int merge_oom(const char *out_prefix, ps_status *st) {
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "checkpoint merge %s: out of memory",
                       out_prefix);
}

/* Opens every part; they must agree in endianness and version.  *total
 * gets their number of data shards. */
static int open_parts(const char *const *part_prefixes, size_t n, merge_part *parts,
                      int *total, const char *out_prefix, ps_status *st) {
  for (size_t p = 0; p < n; p++) {
    parts[p].r = ps_bundle_reader_open_nofollow(part_prefixes[p], st);
    if (parts[p].r == NULL) return st ? st->code : PS_UNKNOWN;
    ps_bundle_reader *r = parts[p].r, *r0 = parts[0].r;
    if (r->endianness != r0->endianness || r->version_len != r0->version_len ||
        (r->version_len && memcmp(r->version, r0->version, r->version_len) != 0))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "checkpoint %s: endianness or version differs from %s",
                           r->index_path, r0->index_path);
    if (r->num_shards > MAX_SHARDS - *total)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "checkpoint merge: too many shards");
    *total += r->num_shards;
    parts[p].ids = malloc((size_t)r->num_shards * sizeof(int));
    if (parts[p].ids == NULL) return merge_oom(out_prefix, st);
    for (int s = 0; s < r->num_shards; s++)
      parts[p].ids[s] = -1;
  }
  return 0;
}

/* Every input data file and its merged name, by merged id; all must exist
 * before anything moves. */
static int plan_moves(merge_part *parts, size_t n, const char *out_prefix, int total,
                      int next_id, char **src, char **dst, ps_status *st) {
  for (size_t p = 0; p < n; p++) {
    ps_bundle_reader *r = parts[p].r;
    for (int s = 0; s < r->num_shards; s++) {
      int *id = &parts[p].ids[s];
      if (*id < 0) *id = next_id++;
      src[*id] = ps_bdl_data_path_(r->prefix, s, r->num_shards);
      dst[*id] = ps_bdl_data_path_(out_prefix, *id, total);
      if (src[*id] == NULL || dst[*id] == NULL) return merge_oom(out_prefix, st);
      struct stat sb;
      if (stat(src[*id], &sb) != 0) {
        int e = errno;
        return ps_status_set(
            st, e == ENOENT ? PS_NOT_FOUND : ps_status_code_from_errno(e),
            "checkpoint %s: %s (%s)", src[*id],
            e == ENOENT ? "missing data shard" : "cannot stat data shard", strerror(e));
      }
    }
  }
  return 0;
}

/* Moves data shard src[i] to dst[i] for i < total, counting the moves in
 * *nmoved (the caller moves them back on failure). */
static int move_shards(char *const *src, char *const *dst, int total, size_t *nmoved,
                       ps_status *st) {
  for (; *nmoved < (size_t)total; (*nmoved)++) {
    if (rename(src[*nmoved], dst[*nmoved]) != 0) {
      int e = errno;
      return ps_status_set(st, ps_status_code_from_errno(e),
                           "checkpoint %s: cannot rename to %s: %s", src[*nmoved],
                           dst[*nmoved], strerror(e));
    }
  }
  return 0;
}

/* Best effort: the parts' indexes, then their directories if empty. */
static void remove_parts(const merge_part *parts, size_t n, const char *out_dir) {
  for (size_t p = 0; p < n; p++) {
    ps_bundle_reader *r = parts[p].r;
    unlink(r->index_path);
    char *d = ps_dir_of(r->prefix);
    if (d != NULL && strcmp(d, out_dir) != 0) rmdir(d);
    free(d);
  }
}

int ps_bundle_merge(const char *const *part_prefixes, size_t n, const char *out_prefix,
                    ps_status *st) {
  if (n == 0 || out_prefix == NULL || out_prefix[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "checkpoint merge: no parts or no output prefix");
  int rc = 0, next_id = 0, total = 0, e;
  size_t nmoved = 0;
  entry_set m = {0};
  bbuf idx = {0};
  char *index_path = NULL, *tmp = NULL, *out_dir = NULL;
  char **src = NULL, **dst = NULL;
  merge_part *parts = calloc(n, sizeof *parts);
  if (parts == NULL) goto oom;
  if ((rc = open_parts(part_prefixes, n, parts, &total, out_prefix, st)) != 0) goto out;
  if ((rc = merge_entries(parts, n, &m, &next_id, st)) != 0) goto out;
  src = calloc((size_t)total, sizeof *src);
  dst = calloc((size_t)total, sizeof *dst);
  if (src == NULL || dst == NULL) goto oom;
  if ((rc = plan_moves(parts, n, out_prefix, total, next_id, src, dst, st)) != 0)
    goto out;
  ps_bundle_reader *r0 = parts[0].r;
  if (!ps_bdl_build_index_(&m, total, r0->endianness, r0->version, r0->version_len, &idx))
    goto oom;
  index_path = ps_bdl_path_cat_(out_prefix, ".index");
  out_dir = ps_dir_of(out_prefix);
  if (index_path == NULL || out_dir == NULL) goto oom;
  if ((e = ps_bdl_make_dirs_(out_dir)) != 0) {
    rc = ps_status_set(st, ps_status_code_from_errno(e),
                       "checkpoint %s: cannot create directory %s: %s", out_prefix,
                       out_dir, strerror(e));
    goto out;
  }
  if ((e = ps_bdl_write_temp_(index_path, idx.p, idx.n, &tmp)) != 0) {
    rc = ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: write: %s",
                       index_path, strerror(e));
    goto out;
  }
  if ((rc = move_shards(src, dst, total, &nmoved, st)) != 0) goto out;
  if (rename(tmp, index_path) != 0) {
    e = errno;
    rc = ps_status_set(st, ps_status_code_from_errno(e), "checkpoint %s: rename: %s",
                       index_path, strerror(e));
    goto out;
  }
  free(tmp);
  tmp = NULL;
  if ((e = ps_fsync_dir(out_dir)) != 0) {
    rc = ps_status_set(st, ps_status_code_from_errno(e),
                       "checkpoint %s: fsync directory: %s", out_dir, strerror(e));
    /* not durable: a failed merge leaves nothing of its own behind */
    unlink(index_path);
    while (nmoved > 0) {
      nmoved--;
      rename(dst[nmoved], src[nmoved]);
    }
    goto out;
  }
  remove_parts(parts, n, out_dir);
  goto out;
oom:
  rc = merge_oom(out_prefix, st);
out:
  if (tmp != NULL) { /* failed before the index went into place: undo */
    unlink(tmp);
    free(tmp);
    while (nmoved > 0) {
      nmoved--;
      rename(dst[nmoved], src[nmoved]);
    }
  }
  for (int i = 0; src != NULL && i < total; i++) {
    free(src[i]);
    free(dst[i]);
  }
  free(src);
  free(dst);
  free(index_path);
  free(out_dir);
  ps_bdl_bb_free_(&idx);
  ps_bdl_es_free_(&m);
  for (size_t p = 0; parts != NULL && p < n; p++) {
    ps_bundle_reader_close(parts[p].r);
    free(parts[p].ids);
  }
  free(parts);
  return rc;
}
