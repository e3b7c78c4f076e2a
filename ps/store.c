/* Variable table of one ps task.
 *
 * A chained hash table under one rwlock maps names to variables; lookups
 * take it shared, so the hot path (read/update RPCs) never serializes on
 * it.  Each variable has its own rwlock.  A variable's value is a
 * refcounted ps_buf: readers take a reference and stream it out zero-copy
 * after dropping the lock; a writer that wants to change bytes in place
 * first copies a buffer somebody else still references.  So a read never
 * sees a half-applied update, and an assign is a pointer swap.
 *
 * Beside the table, under the same lock, an index maps the full name of
 * every partitioned variable to its parts on this ps, so that Create can
 * keep the checkpoint key space consistent (no plain variable and parts
 * under one key, no overlapping parts) without scanning the table.
 * Deleted variables leave both at once and wait in a list until the store
 * is destroyed, because other calls may still hold pointers to them. */
#include "store.h"

#include "embed.h"

#include "common/variable.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/array.h"
#include "common/log.h"
#include "sync.h"

struct ps_store {
  unsigned long long gate_waits; /* updates parked at a closed gate (gate_mu) */
  pthread_mutex_t gate_mu;
  pthread_cond_t gate_cv;
  int gate_closed; /* a snapshot is being taken or held */
  int64_t gate_id;
  struct timespec gate_until;
  int in_flight;           /* updates between enter and leave */
  ps_snapshot *pending[8]; /* taken, not yet written */
  struct deferred {
    ps_gate_fn fn;
    void *arg;
  } * deferred;
  size_t ndeferred;
  int64_t max_hold_ms;      /* longest hold of the gate */
  int64_t max_parked_bytes; /* bytes parked updates may hold together */
  int64_t parked_bytes;     /* under gate_mu */
  pthread_rwlock_t lock;
  ps_var **buckets;
  size_t nbuckets, count;
  struct part_group **groups; /* full name -> parts (GROUP_BUCKETS) */
  ps_var *graveyard;          /* deleted variables, freed by destroy */
  atomic_llong bytes;
  char task[64];
  int own_shard;          /* N of "ps/N" */
  ps_embed_store *tables; /* the embedding tables a cluster save takes too */
};

#define GROUP_BUCKETS 256

/* The parts of one partitioned variable present on this ps. */
typedef struct part_group {
  char *full;
  ps_dtype dtype;
  ps_shape full_shape;
  ps_var **parts;
  size_t n, cap;
  struct part_group *next;
} part_group;

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

ps_store *ps_store_create(const char *task) {
  ps_store *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  pthread_rwlock_init(&s->lock, NULL);
  pthread_mutex_init(&s->gate_mu, NULL);
  pthread_cond_init(&s->gate_cv, NULL);
  s->nbuckets = 1024;
  s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
  s->groups = calloc(GROUP_BUCKETS, sizeof *s->groups);
  s->max_hold_ms = 60000;
  s->max_parked_bytes = INT64_MAX;
  if (s->buckets == NULL || s->groups == NULL) {
    free(s->buckets);
    free(s->groups);
    pthread_rwlock_destroy(&s->lock);
    pthread_mutex_destroy(&s->gate_mu);
    pthread_cond_destroy(&s->gate_cv);
    free(s);
    return NULL;
  }
  snprintf(s->task, sizeof s->task, "%s", task ? task : "ps");
  const char *sl = strrchr(s->task, '/');
  long own = sl ? strtol(sl + 1, NULL, 10) : 0;
  s->own_shard = own > 0 && own < INT32_MAX ? (int)own : 0;
  return s;
}

static void var_free(ps_var *v) {
  ps_accum_destroy(v->accum);
  ps_buf_unref(v->buf);
  pthread_rwlock_destroy(&v->lock);
  free(v->init_values);
  free(v->init_full_name);
  free(v->name);
  free(v);
}

void ps_store_destroy(ps_store *s) {
  if (s == NULL) return;
  for (size_t i = 0; i < s->nbuckets; i++) {
    ps_var *v = s->buckets[i];
    while (v) {
      ps_var *n = v->next;
      var_free(v);
      v = n;
    }
  }
  free(s->buckets);
  while (s->graveyard) {
    ps_var *n = s->graveyard->next;
    var_free(s->graveyard);
    s->graveyard = n;
  }
  for (size_t i = 0; i < GROUP_BUCKETS; i++)
    while (s->groups[i]) {
      part_group *g = s->groups[i];
      s->groups[i] = g->next;
      free(g->parts);
      free(g->full);
      free(g);
    }
  free(s->groups);
  for (int i = 0; i < 8; i++)
    ps_snapshot_free(s->pending[i]);
  free(s->deferred);
  pthread_rwlock_destroy(&s->lock);
  pthread_mutex_destroy(&s->gate_mu);
  pthread_cond_destroy(&s->gate_cv);
  free(s);
}

const char *ps_store_task(const ps_store *s) {
  return s->task;
}

void ps_store_set_gate_limits(ps_store *s, int64_t max_hold_ms,
                              int64_t max_parked_bytes) {
  pthread_mutex_lock(&s->gate_mu);
  s->max_hold_ms = max_hold_ms < 0 ? 0 : max_hold_ms;
  s->max_parked_bytes = max_parked_bytes < 0 ? 0 : max_parked_bytes;
  pthread_mutex_unlock(&s->gate_mu);
}

static ps_var *lookup_locked(ps_store *s, const char *name) {
  for (ps_var *v = s->buckets[hash_name(name) % s->nbuckets]; v; v = v->next)
    if (!strcmp(v->name, name)) return v;
  return NULL;
}

/* ---- the partition index (table lock held) ---- */

/* True if @v is a part of a partitioned variable: its checkpoint key is
 * its full name, not its own. */
static bool is_part(const ps_var *v) {
  return v->init_full_name && strcmp(v->init_full_name, v->name) != 0;
}

static part_group *group_find(ps_store *s, const char *full) {
  for (part_group *g = s->groups[hash_name(full) % GROUP_BUCKETS]; g; g = g->next)
    if (!strcmp(g->full, full)) return g;
  return NULL;
}

static int group_add(ps_store *s, ps_var *v) {
  part_group *g = group_find(s, v->init_full_name);
  if (g == NULL) {
    if ((g = calloc(1, sizeof *g)) == NULL) return -1;
    if ((g->full = strdup(v->init_full_name)) == NULL) {
      free(g);
      return -1;
    }
    g->dtype = v->dtype;
    g->full_shape = v->init_full_shape;
    size_t k = hash_name(g->full) % GROUP_BUCKETS;
    g->next = s->groups[k];
    s->groups[k] = g;
  }
  if (ps_array_grow(&g->parts, &g->cap, g->n + 1, sizeof *g->parts) != 0)
    return -1; /* an empty group stays: harmless */
  g->parts[g->n++] = v;
  return 0;
}

static void group_remove(ps_store *s, ps_var *v) {
  size_t k = hash_name(v->init_full_name) % GROUP_BUCKETS;
  for (part_group **pg = &s->groups[k]; *pg; pg = &(*pg)->next) {
    part_group *g = *pg;
    if (strcmp(g->full, v->init_full_name)) continue;
    for (size_t i = 0; i < g->n; i++)
      if (g->parts[i] == v) {
        g->parts[i] = g->parts[--g->n];
        break;
      }
    if (g->n == 0) {
      *pg = g->next;
      free(g->parts);
      free(g->full);
      free(g);
    }
    return;
  }
}

/* The key-space rules of ps_store_create_var for a new variable @name
 * (a part of @full when @full is not NULL). */
static int check_key_space(ps_store *s, const char *name, ps_dtype dtype,
                           const ps_shape *shape, const char *full,
                           const ps_shape *full_shape, int64_t offset, ps_status *st) {
  char a[256], b[256];
  if (full == NULL) {
    part_group *g = group_find(s, name);
    if (g && g->n > 0)
      return ps_status_set(st, PS_ALREADY_EXISTS,
                           "variable %s: %s is the full name of the partitioned "
                           "variable whose part %s is on %s; a checkpoint cannot "
                           "hold both under one name",
                           name, name, g->parts[0]->name, s->task);
    return 0;
  }
  ps_var *o = lookup_locked(s, full);
  if (o && !is_part(o))
    return ps_status_set(st, PS_ALREADY_EXISTS,
                         "variable %s: its full name %s is a variable on %s; a "
                         "checkpoint cannot hold both under one name",
                         name, full, s->task);
  part_group *g = group_find(s, full);
  if (g == NULL || g->n == 0) return 0;
  if (g->dtype != dtype || !ps_shape_equal(&g->full_shape, full_shape))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: part of %s with dtype %s and full shape %s, "
                         "but its part %s has dtype %s and full shape %s",
                         name, full, ps_dtype_name(dtype),
                         ps_shape_format(full_shape, a, sizeof a), g->parts[0]->name,
                         ps_dtype_name(g->dtype),
                         ps_shape_format(&g->full_shape, b, sizeof b));
  int64_t n = ps_shape_num_elements(shape);
  for (size_t i = 0; i < g->n; i++) {
    ps_var *p = g->parts[i];
    int64_t po = p->init_offset, pn = ps_shape_num_elements(&p->shape);
    if (n > 0 && pn > 0 && offset < po + pn && po < offset + n)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: its elements [%lld, %lld) of %s overlap "
                           "those of part %s [%lld, %lld)",
                           name, (long long)offset, (long long)(offset + n), full,
                           p->name, (long long)po, (long long)(po + pn));
  }
  return 0;
}

ps_var *ps_store_lookup(ps_store *s, const char *name) {
  pthread_rwlock_rdlock(&s->lock);
  ps_var *v = lookup_locked(s, name);
  pthread_rwlock_unlock(&s->lock);
  return v;
}

ps_var *ps_store_find(ps_store *s, const char *name, ps_status *st) {
  ps_var *v = ps_store_lookup(s, name);
  if (v == NULL)
    ps_status_set(st, PS_NOT_FOUND, "variable %s does not exist on %s", name, s->task);
  return v;
}

static void grow(ps_store *s) {
  size_t nb = s->nbuckets * 4;
  ps_var **b = calloc(nb, sizeof *b);
  if (b == NULL) return;
  for (size_t i = 0; i < s->nbuckets; i++) {
    ps_var *v = s->buckets[i];
    while (v) {
      ps_var *n = v->next;
      size_t k = hash_name(v->name) % nb;
      v->next = b[k];
      b[k] = v;
      v = n;
    }
  }
  free(s->buckets);
  s->buckets = b;
  s->nbuckets = nb;
}

/* The same place in the same partitioned variable (or both plain). */
static bool part_equal(const ps_var *v, const char *full_name, const ps_shape *full_shape,
                       int64_t offset) {
  const char *fa = v->init_full_name ? v->init_full_name : "";
  if (strcmp(fa, full_name ? full_name : "")) return false;
  if (fa[0] == '\0') return true;
  if (full_shape && !ps_shape_equal(&v->init_full_shape, full_shape)) return false;
  return v->init_offset == offset;
}

int ps_store_own_shard(const ps_store *s) {
  return s->own_shard;
}

int ps_store_create_var(ps_store *s, const char *name, ps_dtype dtype,
                        const ps_shape *shape, const ps_init_spec *init,
                        const char *full_name, const ps_shape *full_shape, int64_t offset,
                        bool *created, ps_status *st) {
  return ps_store_create_var_in(s, s->own_shard, name, dtype, shape, init, full_name,
                                full_shape, offset, created, st);
}

int ps_store_create_var_in(ps_store *s, int shard, const char *name, ps_dtype dtype,
                           const ps_shape *shape, const ps_init_spec *init,
                           const char *full_name, const ps_shape *full_shape,
                           int64_t offset, bool *created, ps_status *st) {
  *created = false;
  if (name == NULL || name[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "variable name is empty");
  if (!ps_dtype_is_numeric(dtype) && dtype != PS_DT_BOOL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: unsupported dtype %d (%s)", name, (int)dtype,
                         ps_dtype_name(dtype));
  if (ps_shape_num_elements(shape) < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "variable %s: invalid shape", name);
  pthread_rwlock_wrlock(&s->lock);
  ps_var *v = lookup_locked(s, name);
  if (v == NULL && init) {
    const char *fn =
        full_name && full_name[0] && strcmp(full_name, name) ? full_name : NULL;
    int rc = check_key_space(s, name, dtype, shape, fn, full_shape ? full_shape : shape,
                             offset, st);
    if (rc != 0) {
      pthread_rwlock_unlock(&s->lock);
      return rc;
    }
  } else if (v == NULL) {
    int rc = check_key_space(s, name, dtype, shape, NULL, NULL, 0, st);
    if (rc != 0) {
      pthread_rwlock_unlock(&s->lock);
      return rc;
    }
  }
  if (v) {
    char a[256], b[256];
    int rc = 0;
    if (v->shard != shard)
      /* replicated: this ps holds the name for another shard (as its
       * primary or a backup); one store, keyed by name, holds every shard
       * this ps replicates, so a name is the cluster's (DESIGN.md "Shards
       * and their placement") */
      rc = ps_status_set(st, PS_ALREADY_EXISTS,
                         "variable %s already exists in shard %d (on %s); with "
                         "--replicas a variable name belongs to one shard: it cannot "
                         "also be made in shard %d",
                         name, v->shard, s->task, shard);
    else if (v->dtype != dtype || !ps_shape_equal(&v->shape, shape))
      rc = ps_status_set(st, PS_ALREADY_EXISTS,
                         "variable %s already exists on %s with dtype %s shape "
                         "%s; requested dtype %s shape %s",
                         name, s->task, ps_dtype_name(v->dtype),
                         ps_shape_format(&v->shape, a, sizeof a), ps_dtype_name(dtype),
                         ps_shape_format(shape, b, sizeof b));
    else if (!part_equal(v, full_name, full_shape, offset))
      rc = ps_status_set(
          st, PS_ALREADY_EXISTS,
          "variable %s already exists on %s as %s%s at offset %lld; "
          "requested %s%s at offset %lld",
          name, s->task, v->init_full_name ? "a part of " : "a whole variable",
          v->init_full_name ? v->init_full_name : "", (long long)v->init_offset,
          full_name ? "a part of " : "a whole variable", full_name ? full_name : "",
          (long long)offset);
    /* else: shared by name, as TensorFlow's variables are; another
     * initializer does not matter (the variable keeps the one it was
     * created with) */
    pthread_rwlock_unlock(&s->lock);
    return rc;
  }
  v = calloc(1, sizeof *v);
  if (v == NULL) goto oom;
  v->name = strdup(name);
  if (v->name == NULL) goto oom;
  v->dtype = dtype;
  v->shape = *shape;
  v->shard = shard;
  if (init) {
    v->has_init = true;
    v->init = *init;
    if (init->nvalues) {
      size_t nb;
      if (ps_size_mul(init->nvalues, sizeof(double), &nb) != 0 ||
          (v->init_values = malloc(nb)) == NULL)
        goto oom;
      memcpy(v->init_values, init->values, nb);
      v->init.values = v->init_values;
    }
    if (full_name && full_name[0] && (v->init_full_name = strdup(full_name)) == NULL)
      goto oom;
    v->init_full_shape = full_shape ? *full_shape : *shape;
    v->init_offset = offset;
  }
  if (is_part(v) && group_add(s, v) != 0) goto oom;
  pthread_rwlock_init(&v->lock, NULL); /* nothing fails from here on */
  if (s->count + 1 > s->nbuckets) grow(s);
  size_t k = hash_name(name) % s->nbuckets;
  v->next = s->buckets[k];
  s->buckets[k] = v;
  s->count++;
  pthread_rwlock_unlock(&s->lock);
  *created = true;
  return 0;
oom:
  pthread_rwlock_unlock(&s->lock);
  if (v) {
    free(v->init_values);
    free(v->init_full_name);
    free(v->name);
    free(v);
  }
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory creating %s", name);
}

static int cmp_var_name(const void *a, const void *b) {
  const ps_var *x = *(ps_var *const *)a, *y = *(ps_var *const *)b;
  return strcmp(x->name, y->name);
}

int ps_var_gone(ps_store *s, const ps_var *v, ps_status *st) {
  if (!v->deleted) return 0;
  return ps_status_set(st, PS_NOT_FOUND, "variable %s does not exist on %s", v->name,
                       s->task);
}

/* Appends @v to @out (duplicates are removed later by dedup()). */
static int push(ps_var ***out, size_t *n, size_t *cap, ps_var *v) {
  if (ps_array_grow(out, cap, *n + 1, sizeof **out) != 0) return -1;
  (*out)[(*n)++] = v;
  return 0;
}

/* Sorts @vs by name and drops duplicates (names in the table are unique,
 * so equal names are the same variable); returns the new count. */
static size_t dedup(ps_var **vs, size_t n) {
  if (n == 0) return 0;
  qsort(vs, n, sizeof *vs, cmp_var_name);
  size_t k = 1;
  for (size_t i = 1; i < n; i++)
    if (vs[i] != vs[k - 1]) vs[k++] = vs[i];
  return k;
}

/* Orders a name of @len bytes (not NUL-terminated) against a variable's. */
typedef struct name_key {
  const char *s;
  size_t len;
} name_key;

static int cmp_key_var(const void *k, const void *e) {
  const name_key *a = k;
  const char *b = (*(ps_var *const *)e)->name;
  int c = strncmp(a->s, b, a->len);
  if (c != 0) return c;
  return b[a->len] == '\0' ? 0 : -1;
}

/* True if @name is M "/" S, with S non-empty and without '/', for a
 * variable M among @vs[0..n) (sorted by name). */
static bool is_slot_of_any(const char *name, ps_var **vs, size_t n) {
  const char *slash = strrchr(name, '/');
  if (slash == NULL || slash[1] == '\0') return false;
  name_key k = {name, (size_t)(slash - name)};
  return bsearch(&k, vs, n, sizeof *vs, cmp_key_var) != NULL;
}

int ps_store_remove(ps_store *s, char *const *names, size_t n, int flags, ps_var ***out,
                    size_t *nout, bool *missing, ps_status *st) {
  return ps_store_remove_in(s, -1, names, n, flags, out, nout, missing, st);
}

int ps_store_remove_in(ps_store *s, int shard, char *const *names, size_t n, int flags,
                       ps_var ***out, size_t *nout, bool *missing, ps_status *st) {
  ps_var **vs = NULL;
  size_t nv = 0, cap = 0;
  int rc = 0;
  *out = NULL;
  *nout = 0;
  pthread_rwlock_wrlock(&s->lock);
  for (size_t i = 0; i < n && rc == 0; i++) {
    ps_var *v = lookup_locked(s, names[i]);
    if (v && shard >= 0 && v->shard != shard) v = NULL;
    if (v && push(&vs, &nv, &cap, v) != 0) goto oom;
    part_group *g = group_find(s, names[i]);
    bool parts = false;
    for (size_t k = 0; g && k < g->n; k++) {
      if (shard >= 0 && g->parts[k]->shard != shard) continue;
      parts = true;
      if (push(&vs, &nv, &cap, g->parts[k]) != 0) goto oom;
    }
    bool none = v == NULL && !parts;
    if (missing) missing[i] = none;
    if (none && !(flags & PS_REMOVE_MISSING_OK))
      rc = ps_status_set(st, PS_NOT_FOUND, "variable %s does not exist on %s", names[i],
                         s->task);
  }
  if (rc == 0 && (flags & PS_REMOVE_SLOTS) && nv > 0) {
    /* one pass over the table, each name's parent looked up among the
     * matched variables (sorted): O(table * log matched) */
    size_t nmatched = nv = dedup(vs, nv);
    for (size_t b = 0; b < s->nbuckets; b++)
      for (ps_var *v = s->buckets[b]; v; v = v->next)
        if ((shard < 0 || v->shard == shard) && is_slot_of_any(v->name, vs, nmatched) &&
            push(&vs, &nv, &cap, v) != 0)
          goto oom;
  }
  nv = dedup(vs, nv);
  if (rc == 0)
    for (size_t i = 0; i < nv; i++) {
      ps_var *v = vs[i];
      for (ps_var **pv = &s->buckets[hash_name(v->name) % s->nbuckets]; *pv;
           pv = &(*pv)->next)
        if (*pv == v) {
          *pv = v->next;
          break;
        }
      if (is_part(v)) group_remove(s, v);
      v->next = s->graveyard;
      s->graveyard = v;
      s->count--;
    }
  pthread_rwlock_unlock(&s->lock);
  if (rc != 0) {
    free(vs);
    return rc;
  }
  *out = vs;
  *nout = nv;
  return 0;
oom:
  pthread_rwlock_unlock(&s->lock);
  free(vs);
  return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory deleting variables");
}

void ps_var_mark_deleted(ps_store *s, ps_var *v) {
  if (v->deleted) return;
  v->deleted = true;
  if (v->buf) ps_store_account(s, -(int64_t)v->buf->size);
  ps_buf_unref(v->buf);
  v->buf = NULL;
  v->version++;
}

ps_var **ps_store_list(ps_store *s, size_t *n) {
  pthread_rwlock_rdlock(&s->lock);
  ps_var **out = malloc((s->count + 1) * sizeof *out);
  size_t k = 0;
  if (out)
    for (size_t i = 0; i < s->nbuckets; i++)
      for (ps_var *v = s->buckets[i]; v; v = v->next)
        out[k++] = v;
  pthread_rwlock_unlock(&s->lock);
  if (out) qsort(out, k, sizeof *out, cmp_var_name);
  *n = k;
  return out;
}

void ps_store_totals(ps_store *s, int64_t *nvars, int64_t *bytes) {
  pthread_rwlock_rdlock(&s->lock);
  *nvars = (int64_t)s->count;
  pthread_rwlock_unlock(&s->lock);
  *bytes = atomic_load(&s->bytes);
}

void ps_store_account(ps_store *s, int64_t delta) {
  atomic_fetch_add(&s->bytes, delta);
}

static void var_lock(ps_var *v, int how) {
  if (how == 1)
    pthread_rwlock_wrlock(&v->lock);
  else if (how == 0)
    pthread_rwlock_rdlock(&v->lock);
  else
    pthread_rwlock_unlock(&v->lock);
}

/* The lock order: by name, then (a deleted variable and its namesake) by
 * address. */
static int lock_order(const ps_var *x, const ps_var *y) {
  int c = strcmp(x->name, y->name);
  return c ? c : (x > y) - (x < y);
}

static int cmp_lock_order(const void *a, const void *b) {
  return lock_order(*(ps_var *const *)a, *(ps_var *const *)b);
}

/* var_lock(v, @how) once for each distinct variable of @vars, in name
 * order (the one order every lock set takes, so two never deadlock); how
 * many distinct there were.  Sorts a copy, on the stack for small sets;
 * with no memory for a larger copy, picks the next name by passes over
 * @vars (n x distinct comparisons) rather than fail. */
static size_t each_distinct(ps_var **vars, size_t n, int how) {
  ps_var *small[16], **sorted = n <= 16 ? small : malloc(n * sizeof *sorted);
  size_t nd = 0;
  if (sorted == NULL) {
    for (const ps_var *last = NULL;; nd++) {
      ps_var *next = NULL;
      for (size_t i = 0; i < n; i++)
        if ((last == NULL || lock_order(vars[i], last) > 0) &&
            (next == NULL || lock_order(vars[i], next) < 0))
          next = vars[i];
      if (next == NULL) return nd;
      var_lock(next, how);
      last = next;
    }
  }
  memcpy(sorted, vars, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, cmp_lock_order);
  for (size_t i = 0; i < n; i++)
    if (i == 0 || sorted[i] != sorted[i - 1]) {
      var_lock(sorted[i], how);
      nd++;
    }
  if (sorted != small) free(sorted);
  return nd;
}

bool ps_store_lock_set(ps_var **vars, size_t n, bool write) {
  if (n == 1) { /* the common case: no sorting */
    var_lock(vars[0], write);
    return true;
  }
  return each_distinct(vars, n, write) == n;
}

void ps_store_unlock_set(ps_var **vars, size_t n) {
  if (n == 1)
    pthread_rwlock_unlock(&vars[0]->lock);
  else
    each_distinct(vars, n, -1);
}

void ps_var_set_buf(ps_store *s, ps_var *v, ps_buf *buf, const ps_shape *shape) {
  if (v->deleted) return;
  int64_t delta = (int64_t)buf->size - (v->buf ? (int64_t)v->buf->size : 0);
  ps_buf_ref(buf);
  ps_buf_unref(v->buf);
  v->buf = buf;
  if (shape) v->shape = *shape;
  v->version++;
  v->epoch++;
  ps_store_account(s, delta);
}

int ps_var_make_private(ps_var *v, ps_status *st) {
  if (v->buf == NULL || atomic_load(&v->buf->refs) == 1) return 0;
  ps_buf *b = ps_buf_create(v->buf->size, false);
  if (b == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "out of memory copying variable %s (%zu bytes)", v->name,
                         v->buf->size);
  memcpy(b->data, v->buf->data, v->buf->size);
  ps_buf_unref(v->buf);
  v->buf = b;
  return 0;
}

ps_buf *ps_var_init_buf(ps_store *s, ps_var *v, ps_status *st) {
  if (!v->has_init) {
    ps_status_set(st, PS_FAILED_PRECONDITION,
                  "variable %s has no initializer on %s: its value must "
                  "be assigned by the client",
                  v->name, s->task);
    return NULL;
  }
  size_t bytes;
  if (ps_size_bytes(v->dtype, &v->shape, &bytes) != 0) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "variable %s: its size does not fit in memory",
                  v->name);
    return NULL;
  }
  bool zero = v->init.type == PS_INIT_ZEROS;
  ps_buf *b = ps_buf_create(bytes, zero);
  if (b == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory initializing %s (%zu bytes)",
                  v->name, bytes);
    return NULL;
  }
  if (!zero) {
    const char *nm = v->init_full_name ? v->init_full_name : v->name;
    if (ps_init_fill(&v->init, nm, v->dtype, &v->init_full_shape, v->init_offset,
                     ps_shape_num_elements(&v->shape), b->data, st) != 0) {
      ps_buf_unref(b);
      return NULL;
    }
  }
  return b;
}

int ps_var_run_initializer(ps_store *s, ps_var *v, ps_status *st) {
  ps_buf *b = ps_var_init_buf(s, v, st);
  if (b == NULL) return st->code;
  ps_var_set_buf(s, v, b, NULL);
  ps_buf_unref(b);
  return 0;
}

/* ---- snapshots ---- */

void ps_store_set_tables(ps_store *s, ps_embed_store *tables) {
  s->tables = tables;
}

void ps_snapshot_free(ps_snapshot *snap) {
  if (snap == NULL) return;
  for (size_t i = 0; i < snap->ntables; i++)
    ps_embed_snap_free(snap->tables[i]);
  free(snap->tables);
  for (size_t i = 0; i < snap->n; i++) {
    free(snap->e[i].name);
    free(snap->e[i].full_name);
    free(snap->e[i].key);
    ps_buf_unref(snap->e[i].buf);
  }
  free(snap->e);
  free(snap);
}

static bool gate_expired(ps_store *s) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec > s->gate_until.tv_sec ||
         (now.tv_sec == s->gate_until.tv_sec && now.tv_nsec >= s->gate_until.tv_nsec);
}

/* Opens the gate (gate_mu held, released here) and runs what waited. */
static void gate_open_locked(ps_store *s) {
  s->gate_closed = 0;
  s->parked_bytes = 0;
  struct deferred *d = s->deferred;
  size_t n = s->ndeferred;
  s->deferred = NULL;
  s->ndeferred = 0;
  s->in_flight += (int)n;
  pthread_cond_broadcast(&s->gate_cv);
  pthread_mutex_unlock(&s->gate_mu);
  for (size_t i = 0; i < n; i++)
    d[i].fn(d[i].arg);
  free(d);
}

bool ps_store_update_enter(ps_store *s, ps_gate_fn fn, void *arg) {
  bool parked = false;
  ps_store_update_admit(s, fn, arg, 0, &parked, NULL);
  return !parked;
}

int ps_store_update_admit(ps_store *s, ps_gate_fn fn, void *arg, int64_t bytes,
                          bool *parked, ps_status *st) {
  *parked = false;
  pthread_mutex_lock(&s->gate_mu);
  if (s->gate_closed && gate_expired(s)) {
    PS_WARN("snapshot %lld: gate held past its limit, reopening", (long long)s->gate_id);
    gate_open_locked(s);
    pthread_mutex_lock(&s->gate_mu);
  }
  if (s->gate_closed) {
    if (s->ndeferred >= PS_STORE_MAX_PARKED ||
        bytes > s->max_parked_bytes - s->parked_bytes) {
      int64_t id = s->gate_id, held = s->parked_bytes, lim = s->max_parked_bytes;
      size_t calls = s->ndeferred;
      pthread_mutex_unlock(&s->gate_mu);
      if (calls >= PS_STORE_MAX_PARKED)
        return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                             "%s: %zu updates already wait for snapshot %lld to "
                             "end, the most that may wait (%d); try again",
                             s->task, calls, (long long)id, PS_STORE_MAX_PARKED);
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "%s: updates waiting for snapshot %lld to end hold %lld "
                           "bytes; this one (%lld bytes) would pass the limit of "
                           "%lld bytes (--max-tensor-bytes); try again",
                           s->task, (long long)id, (long long)held, (long long)bytes,
                           (long long)lim);
    }
    struct deferred *d = realloc(s->deferred, (s->ndeferred + 1) * sizeof *d);
    if (d != NULL) {
      s->deferred = d;
      d[s->ndeferred++] = (struct deferred){fn, arg};
      s->parked_bytes += bytes;
      s->gate_waits++;
      pthread_mutex_unlock(&s->gate_mu);
      *parked = true;
      return 0;
    }
  }
  s->in_flight++;
  pthread_mutex_unlock(&s->gate_mu);
  return 0;
}

void ps_store_update_leave(ps_store *s) {
  pthread_mutex_lock(&s->gate_mu);
  s->in_flight--;
  pthread_cond_broadcast(&s->gate_cv);
  pthread_mutex_unlock(&s->gate_mu);
}

void ps_store_gate_open(ps_store *s) {
  pthread_mutex_lock(&s->gate_mu);
  if (s->gate_closed) {
    gate_open_locked(s);
    return;
  }
  pthread_mutex_unlock(&s->gate_mu);
}

void ps_store_gate_tick(ps_store *s) {
  pthread_mutex_lock(&s->gate_mu);
  if (s->gate_closed && gate_expired(s)) {
    PS_WARN("snapshot %lld: gate held past its limit, reopening", (long long)s->gate_id);
    gate_open_locked(s);
    return;
  }
  pthread_mutex_unlock(&s->gate_mu);
}

int ps_store_snapshot_begin(ps_store *s, int64_t id, int64_t hold_ms,
                            bool skip_uninitialized, ps_status *st) {
  return ps_store_snapshot_begin_sel(s, id, hold_ms, skip_uninitialized, NULL, st);
}

/* The index in @sel of @name (sorted[] holds sel's indices sorted by
 * name), or -1. */
static long sel_find(const ps_snapshot_select *sel, const size_t *sorted,
                     const char *name) {
  size_t lo = 0, hi = sel->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(sel->names[sorted[mid]], name);
    if (c == 0) return (long)sorted[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

/* qsort_r order of selection indices by name. */
static int cmp_sel(const void *a, const void *b, void *ctx) {
  const char *const *n = ((const ps_snapshot_select *)ctx)->names;
  return strcmp(n[*(const size_t *)a], n[*(const size_t *)b]);
}

int ps_store_snapshot_begin_sel(ps_store *s, int64_t id, int64_t hold_ms,
                                bool skip_uninitialized, const ps_snapshot_select *sel,
                                ps_status *st) {
  return ps_store_snapshot_begin_in(s, id, hold_ms, skip_uninitialized, sel, NULL, 0, st);
}

/* Every table of @s into @snap, as of now (the gate is closed). */
static int snapshot_tables(ps_store *s, ps_snapshot *snap, int64_t id, ps_status *st) {
  size_t n = 0;
  ps_embed_table **t = ps_embed_tables(s->tables, &n);
  if (t == NULL && n > 0)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory taking snapshot %lld",
                         (long long)id);
  int rc = 0;
  snap->tables = calloc(n + 1, sizeof *snap->tables);
  if (snap->tables == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory taking snapshot %lld",
                       (long long)id);
  for (size_t i = 0; i < n && rc == 0; i++) {
    ps_embed_snap *es = ps_embed_snap_begin(t[i]);
    if (es == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory taking snapshot %lld",
                         (long long)id);
      break;
    }
    snap->tables[snap->ntables++] = es;
    snap->bytes += ps_embed_snap_rows(es) * ps_embed_snap_spec(es)->dim * 4;
  }
  for (size_t i = 0; i < n; i++)
    ps_embed_unref(t[i]);
  free(t);
  return rc;
}

static int snapshot_begin(ps_store *s, int64_t id, int64_t hold_ms,
                          bool skip_uninitialized, const ps_snapshot_select *sel,
                          const bool *shards, size_t nshards, bool tables, ps_status *st);

int ps_store_snapshot_begin_in(ps_store *s, int64_t id, int64_t hold_ms,
                               bool skip_uninitialized, const ps_snapshot_select *sel,
                               const bool *shards, size_t nshards, ps_status *st) {
  return snapshot_begin(s, id, hold_ms, skip_uninitialized, sel, shards, nshards,
                        sel == NULL && shards == NULL, st);
}

int ps_store_snapshot_begin_tables(ps_store *s, int64_t id, int64_t hold_ms,
                                   bool skip_uninitialized, const ps_snapshot_select *sel,
                                   ps_status *st) {
  return snapshot_begin(s, id, hold_ms, skip_uninitialized, sel, NULL, 0, true, st);
}

static int snapshot_begin(ps_store *s, int64_t id, int64_t hold_ms,
                          bool skip_uninitialized, const ps_snapshot_select *sel,
                          const bool *shards, size_t nshards, bool tables,
                          ps_status *st) {
  size_t *sorted = NULL;
  bool *seen = NULL;
  if (sel) {
    sorted = calloc(sel->n + 1, sizeof *sorted);
    seen = calloc(sel->n + 1, sizeof *seen);
    if (sorted == NULL || seen == NULL) {
      free(sorted);
      free(seen);
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "out of memory taking snapshot %lld", (long long)id);
    }
    for (size_t i = 0; i < sel->n; i++)
      sorted[i] = i;
    qsort_r(sorted, sel->n, sizeof *sorted, cmp_sel, (void *)sel);
  }
  pthread_mutex_lock(&s->gate_mu);
  if (s->gate_closed && !gate_expired(s)) {
    pthread_mutex_unlock(&s->gate_mu);
    return ps_status_set(st, PS_ABORTED, "%s: snapshot %lld is being taken; try again",
                         s->task, (long long)s->gate_id);
  }
  if (hold_ms < 0) hold_ms = 0;
  if (hold_ms > s->max_hold_ms) {
    PS_WARN("snapshot %lld: hold_ms %lld is above --max-hold-ms; holding the gate "
            "for at most %lld ms",
            (long long)id, (long long)hold_ms, (long long)s->max_hold_ms);
    hold_ms = s->max_hold_ms;
  }
  s->gate_closed = 1;
  s->gate_id = id;
  clock_gettime(CLOCK_REALTIME, &s->gate_until);
  s->gate_until.tv_sec += hold_ms / 1000;
  s->gate_until.tv_nsec += (hold_ms % 1000) * 1000000;
  if (s->gate_until.tv_nsec >= 1000000000) {
    s->gate_until.tv_sec++;
    s->gate_until.tv_nsec -= 1000000000;
  }
  while (s->in_flight > 0)
    pthread_cond_wait(&s->gate_cv, &s->gate_mu);
  pthread_mutex_unlock(&s->gate_mu);
  size_t n;
  ps_var **vars = ps_store_list(s, &n);
  ps_snapshot *snap = calloc(1, sizeof *snap);
  int rc = 0;
  if (vars == NULL || snap == NULL ||
      (snap->e = calloc(n + 1, sizeof *snap->e)) == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory taking snapshot %lld",
                       (long long)id);
    n = 0;
  } else {
    snap->id = id;
  }
  for (size_t i = 0; i < n && rc == 0; i++) {
    ps_var *v = vars[i];
    if (shards && (v->shard < 0 || (size_t)v->shard >= nshards || !shards[v->shard]))
      continue; /* a shard held as a backup */
    long k = sel ? sel_find(sel, sorted, v->name) : -1;
    if (sel && k < 0) continue;
    if (sel) seen[k] = true;
    pthread_rwlock_rdlock(&v->lock);
    if (v->deleted) {
      /* deleted after the list was taken: not part of the snapshot */
    } else if (v->buf == NULL) {
      if (!skip_uninitialized) rc = ps_var_uninitialized(v->name, st);
    } else {
      ps_snapshot_entry *e = &snap->e[snap->n++];
      e->name = strdup(v->name);
      e->dtype = v->dtype;
      e->shape = v->shape;
      e->buf = ps_buf_ref(v->buf);
      if (sel && sel->keys && sel->keys[k] && sel->keys[k][0] &&
          (e->key = strdup(sel->keys[k])) == NULL)
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "out of memory taking snapshot %lld", (long long)id);
      if (is_part(v)) {
        e->full_name = strdup(v->init_full_name);
        e->full_shape = v->init_full_shape;
        e->offset = v->init_offset;
        if (e->full_name == NULL)
          rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                             "out of memory taking snapshot %lld", (long long)id);
      }
      if (e->name == NULL)
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "out of memory taking snapshot %lld", (long long)id);
      snap->bytes += (int64_t)v->buf->size;
    }
    pthread_rwlock_unlock(&v->lock);
  }
  free(vars);
  /* a cluster save of this ps takes its embedding tables too (a Saver's
   * selection names variables only) */
  if (rc == 0 && tables && s->tables) rc = snapshot_tables(s, snap, id, st);
  for (size_t i = 0; sel && rc == 0 && i < sel->n; i++)
    if (!seen[i])
      rc = ps_status_set(st, PS_NOT_FOUND, "variable %s does not exist on %s",
                         sel->names[i], s->task);
  free(sorted);
  free(seen);
  pthread_mutex_lock(&s->gate_mu);
  if (rc != 0) {
    gate_open_locked(s);
    pthread_mutex_lock(&s->gate_mu);
  } else {
    int slot = (int)(id % 8 + 8) % 8;
    ps_snapshot_free(s->pending[slot]);
    s->pending[slot] = snap;
    snap = NULL;
  }
  pthread_mutex_unlock(&s->gate_mu);
  ps_snapshot_free(snap);
  return rc;
}

void ps_store_snapshot_release(ps_store *s, int64_t id) {
  pthread_mutex_lock(&s->gate_mu);
  if (s->gate_closed && s->gate_id == id) {
    gate_open_locked(s);
    return;
  }
  pthread_mutex_unlock(&s->gate_mu);
}

ps_snapshot *ps_store_snapshot_take(ps_store *s, int64_t id) {
  ps_snapshot *snap = NULL;
  pthread_mutex_lock(&s->gate_mu);
  for (int i = 0; i < 8; i++)
    if (s->pending[i] && s->pending[i]->id == id) {
      snap = s->pending[i];
      s->pending[i] = NULL;
    }
  pthread_mutex_unlock(&s->gate_mu);
  return snap;
}

void ps_store_snapshot_stats(ps_store *s, int64_t id, int64_t *nvars, int64_t *bytes) {
  *nvars = *bytes = 0;
  pthread_mutex_lock(&s->gate_mu);
  for (int i = 0; i < 8; i++)
    if (s->pending[i] && s->pending[i]->id == id) {
      *nvars = (int64_t)s->pending[i]->n;
      *bytes = s->pending[i]->bytes;
    }
  pthread_mutex_unlock(&s->gate_mu);
}

unsigned long long ps_store_gate_waits(ps_store *s) {
  pthread_mutex_lock(&s->gate_mu);
  unsigned long long n = s->gate_waits;
  pthread_mutex_unlock(&s->gate_mu);
  return n;
}
