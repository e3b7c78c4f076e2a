/* Embedding tables in checkpoints: the restore of a table from the
 * tensors ckpt_save.c writes (NAME_mht_SofN-keys, -values, -versions,
 * -freqs, and NAME/SLOT_mht_SofN-keys and -values per slot; DESIGN.md
 * "Embedding tables").  Every shard of the table in the checkpoint is
 * read, and the rows whose keys this ps holds (common/embed_key.h) are
 * kept: a table restores into any number of ps. */
#include "ckpt_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bundle.h"
#include "common/embed_key.h"
#include "embed.h"

/* Whether @k is @name's "_mht_SofN-keys": then *@s, *@n. */
static bool shard_key(const char *k, const char *name, int *s, int *n) {
  size_t l = strlen(name);
  if (strncmp(k, name, l) != 0 || strncmp(k + l, "_mht_", 5) != 0) return false;
  const char *p = k + l + 5;
  char *end;
  long a = strtol(p, &end, 10);
  if (end == p || *p < '0' || *p > '9' || strncmp(end, "of", 2) != 0) return false;
  p = end + 2;
  long b = strtol(p, &end, 10);
  if (end == p || *p < '0' || *p > '9' || strcmp(end, "-keys") != 0) return false;
  if (a < 1 || b < 1 || a > b || b > 99999) return false;
  *s = (int)a;
  *n = (int)b;
  return true;
}

/* Appends @n values of @size bytes to a growing array. */
static int grow(void **v, size_t *cap, size_t have, size_t add, size_t size) {
  size_t need;
  if (__builtin_add_overflow(have, add, &need)) return -1;
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 1024;
  while (c < need)
    if (__builtin_mul_overflow(c, 2, &c)) return -1;
  size_t bytes;
  if (__builtin_mul_overflow(c, size, &bytes)) return -1;
  void *p = realloc(*v, bytes);
  if (p == NULL) return -1;
  *v = p;
  *cap = c;
  return 0;
}

/* Reads tensor @key of @dtype and shape [@n] or [@n, @dim] (@dim 0: rank
 * 1) into a new buffer: NULL and @st set when it is not so. */
static void *read_tensor(ps_bundle_reader *r, const char *table, const char *key,
                         int dtype, int64_t n, int64_t dim, ps_status *st) {
  const ps_bundle_entry *e = ps_bundle_reader_find(r, key);
  if (e == NULL) {
    ps_status_set(st, PS_NOT_FOUND,
                  "restoring table %s: Key %s not found in checkpoint %s", table, key,
                  ps_bundle_reader_prefix(r));
    return NULL;
  }
  bool rows = dim > 0;
  if (e->dtype != dtype || e->shape.rank != (rows ? 2 : 1) ||
      (n >= 0 && e->shape.dim[0] != n)) {
    char a[256];
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "restoring table %s from %s: the checkpoint has %s %s, want %s of %s",
                  table, key, ps_dtype_name(e->dtype),
                  ps_shape_format(&e->shape, a, sizeof a), ps_dtype_name(dtype),
                  rows ? "[keys, dim]" : "[keys]");
    return NULL;
  }
  if (rows && e->shape.dim[1] != dim) {
    ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "restoring table %s from %s: the checkpoint has dim %lld, the table has "
        "dim %lld",
        table, key, (long long)e->shape.dim[1], (long long)dim);
    return NULL;
  }
  size_t nb;
  if (ps_size_bytes(dtype, &e->shape, &nb) != 0) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "restoring table %s from %s: too big", table,
                  key);
    return NULL;
  }
  void *buf = malloc(nb ? nb : 1);
  if (buf == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "restoring table %s from %s: out of memory",
                  table, key);
    return NULL;
  }
  if (ps_bundle_reader_read_into(r, key, buf, nb, st) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* The rows of one shard of the checkpoint's table that this ps holds,
 * appended to @x. */
static int stage_shard(ps_bundle_reader *r, ps_ckpt_table *tj, const ps_embed_spec *sp,
                       int s, int n, int task, int ntasks, ps_embed_export *x,
                       size_t caps[5], ps_status *st) {
  char base[600], key[700];
  snprintf(base, sizeof base, "%s_mht_%dof%d", tj->key, s, n);
  snprintf(key, sizeof key, "%s-keys", base);
  const ps_bundle_entry *ke = ps_bundle_reader_find(r, key);
  int64_t rows = ke && ke->shape.rank == 1 ? ke->shape.dim[0] : -1;
  int64_t *keys = read_tensor(r, sp->name, key, PS_DT_INT64, rows, 0, st);
  if (keys == NULL) return st->code;
  int rc = 0;
  int ns = ps_embed_optimizer_slots(sp->optimizer);
  float *vals = NULL, *slots[2] = {NULL, NULL};
  int64_t *vers = NULL, *freqs = NULL;
  snprintf(key, sizeof key, "%s-values", base);
  if ((vals = read_tensor(r, sp->name, key, PS_DT_FLOAT, rows, sp->dim, st)) == NULL) {
    rc = st->code;
    goto out;
  }
  snprintf(key, sizeof key, "%s-versions", base);
  if (ps_bundle_reader_find(r, key) &&
      (vers = read_tensor(r, sp->name, key, PS_DT_INT64, rows, 0, st)) == NULL) {
    rc = st->code;
    goto out;
  }
  snprintf(key, sizeof key, "%s-freqs", base);
  if (ps_bundle_reader_find(r, key) &&
      (freqs = read_tensor(r, sp->name, key, PS_DT_INT64, rows, 0, st)) == NULL) {
    rc = st->code;
    goto out;
  }
  for (int k = 0; k < ns; k++) {
    /* a slot the checkpoint lacks (trained with another optimizer) starts
     * afresh; one it has must list the same keys */
    const char *slot = ps_embed_slot_name(sp->optimizer, k);
    snprintf(key, sizeof key, "%s/%s_mht_%dof%d-values", tj->key, slot, s, n);
    if (ps_bundle_reader_find(r, key) == NULL) continue;
    if ((slots[k] = read_tensor(r, sp->name, key, PS_DT_FLOAT, rows, sp->dim, st)) ==
        NULL) {
      rc = st->code;
      goto out;
    }
    snprintf(key, sizeof key, "%s/%s_mht_%dof%d-keys", tj->key, slot, s, n);
    int64_t *sk = read_tensor(r, sp->name, key, PS_DT_INT64, rows, 0, st);
    if (sk == NULL) {
      rc = st->code;
      goto out;
    }
    bool same = memcmp(sk, keys, (size_t)rows * sizeof *sk) == 0;
    free(sk);
    if (!same) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "restoring table %s from %s: its keys are not those of %s-keys",
                         sp->name, key, base);
      goto out;
    }
  }
  size_t dim = (size_t)sp->dim;
  for (int64_t i = 0; i < rows; i++) {
    if (ps_embed_key_task(keys[i], ntasks) != task) continue;
    size_t at = (size_t)x->n;
    if (grow((void **)&x->keys, &caps[0], at, 1, sizeof *x->keys) ||
        grow((void **)&x->values, &caps[1], at * dim, dim, sizeof(float)) ||
        grow((void **)&x->versions, &caps[2], at, 1, sizeof *x->versions) ||
        grow((void **)&x->freqs, &caps[3], at, 1, sizeof *x->freqs) ||
        (ns > 0 && grow((void **)&x->slots[0], &caps[4], at * dim * (size_t)ns,
                        dim * (size_t)ns, sizeof(float)))) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "restoring table %s: out of memory",
                         sp->name);
      goto out;
    }
    x->keys[at] = keys[i];
    memcpy(x->values + at * dim, vals + (size_t)i * dim, dim * sizeof(float));
    x->versions[at] = vers ? vers[i] : 0;
    x->freqs[at] = freqs ? freqs[i] : 0;
    /* slots side by side in slots[0] for now: [slot 0 | slot 1] per row,
     * split when all shards are in */
    for (int k = 0; k < ns; k++) {
      float *d = x->slots[0] + (at * (size_t)ns + (size_t)k) * dim;
      if (slots[k]) {
        memcpy(d, slots[k] + (size_t)i * dim, dim * sizeof(float));
      } else {
        bool acc = k == 0 && (sp->optimizer == PS_EMBED_OPT_ADAGRAD ||
                              sp->optimizer == PS_EMBED_OPT_FTRL);
        for (size_t j = 0; j < dim; j++)
          d[j] = acc ? (float)sp->slot_init : 0.0f;
      }
    }
    x->n++;
  }
out:
  free(keys);
  free(vals);
  free(vers);
  free(freqs);
  free(slots[0]);
  free(slots[1]);
  return rc;
}

int ps_ckpt_table_stage_(ps_bundle_reader *r, ps_ckpt_table *tj, int task, int ntasks,
                         bool check_only, ps_status *st) {
  const ps_embed_spec *sp = ps_embed_table_spec(tj->t);
  int nshards = 0;
  size_t count = ps_bundle_reader_count(r);
  bool *have = NULL;
  for (size_t i = 0; i < count; i++) {
    const ps_bundle_entry *e = ps_bundle_reader_entry(r, i);
    int s, n;
    if (e->is_slice || !shard_key(e->key, tj->key, &s, &n)) continue;
    if (nshards == 0) {
      nshards = n;
      if ((have = calloc((size_t)n + 1, sizeof *have)) == NULL)
        return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                             "restoring table %s: out of memory", sp->name);
    } else if (n != nshards) {
      free(have);
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "restoring table %s: checkpoint %s has its shards of %d and "
                           "of %d ps",
                           sp->name, ps_bundle_reader_prefix(r), nshards, n);
    }
    have[s] = true;
  }
  if (nshards == 0)
    return ps_status_set(st, PS_NOT_FOUND,
                         "restoring table %s: checkpoint %s has no table %s (no "
                         "%s_mht_SofN-keys)",
                         sp->name, ps_bundle_reader_prefix(r), tj->key, tj->key);
  for (int s = 1; s <= nshards; s++)
    if (!have[s]) {
      free(have);
      return ps_status_set(st, PS_DATA_LOSS,
                           "restoring table %s: checkpoint %s lacks %s_mht_%dof%d-keys",
                           sp->name, ps_bundle_reader_prefix(r), tj->key, s, nshards);
    }
  free(have);
  ps_embed_export x = {.dim = sp->dim, .nslots = ps_embed_optimizer_slots(sp->optimizer)};
  size_t caps[5] = {0};
  int rc = 0;
  for (int s = 1; s <= nshards && rc == 0; s++)
    rc = stage_shard(r, tj, sp, s, nshards, task, ntasks, &x, caps, st);
  /* the slots, side by side per row, into one array each */
  size_t dim = (size_t)sp->dim, ns = (size_t)x.nslots;
  if (rc == 0 && ns > 0) {
    float *both = x.slots[0];
    for (size_t k = 0; k < ns && rc == 0; k++)
      if ((x.slots[k] = malloc(((size_t)x.n * dim + 1) * sizeof(float))) == NULL)
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "restoring table %s: out of memory",
                           sp->name);
    for (size_t k = 0; k < ns && rc == 0; k++)
      for (int64_t i = 0; i < x.n; i++)
        memcpy(x.slots[k] + (size_t)i * dim, both + ((size_t)i * ns + k) * dim,
               dim * sizeof(float));
    if (rc != 0 && x.slots[0] != both) {
      free(x.slots[0]);
      x.slots[0] = both; /* freed by the export's fini */
      free(x.slots[1]);
      x.slots[1] = NULL;
    } else {
      free(both);
    }
  }
  tj->rows = x.n;
  if (rc == 0 && !check_only &&
      (tj->prepared = ps_embed_replace_prepare(tj->t, &x, st)) == NULL)
    rc = st->code;
  ps_embed_export_fini(&x);
  return rc;
}
