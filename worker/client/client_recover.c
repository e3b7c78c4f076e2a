/* psctl restore's checks on top of the cluster restore (client_ckpt.c):
 * the checkpoint's own list of variables (RestoreRequest.list) against
 * what the ps tasks hold, so that a restore never reports success while
 * a variable of the checkpoint exists on no ps (a restarted ps comes back
 * empty); on request the missing variables are created from the
 * checkpoint's names, dtypes, shapes and slices, and only what was lost
 * is restored (ps_client_restore_opts). */
#include "client_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/tensor.h"

/* The names shown of the variables that exist on no ps. */
#define ABSENT_SHOWN 8

/* The most tensors and slices a list answer may have: the ckpt_vars they
 * become take at most PS_CLIENT_RESTORE_LIST_MEMORY_FACTOR times the
 * receive limit (an empty slice, 2 bytes on the wire, becomes a ckpt_var
 * of some 300 bytes, its names and protobuf-c's slice of some 60 more). */
#define PS_CLIENT_RESTORE_LIST_MEMORY_FACTOR 2
static size_t list_max_vars(int64_t max_message_bytes) {
  if (max_message_bytes <= 0) max_message_bytes = PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES;
  return (size_t)max_message_bytes * PS_CLIENT_RESTORE_LIST_MEMORY_FACTOR /
         sizeof(ckpt_var);
}

/* The ckpt_vars an answer's entries make (each entry 1, or 1 per slice),
 * counted on the wire before anything is unpacked, up to @most + 1. */
static size_t list_count_vars(const uint8_t *p, size_t n, size_t most) {
  const uint8_t *q = p, *end = p + n, *val, *eq, *eval;
  uint64_t field, efield;
  size_t len, elen, count = 0;
  while (count <= most && ps_cl_wire_next_(&q, end, &field, &val, &len) > 0) {
    if (field != 5 || val == NULL) continue;
    size_t slices = 0;
    eq = val;
    while (count + slices <= most &&
           ps_cl_wire_next_(&eq, val + len, &efield, &eval, &elen) > 0)
      slices += efield == 4;
    count += slices ? slices : 1;
  }
  return count;
}

void ps_cl_ckpt_vars_fini_(ckpt_vars *cv) {
  int64_t max = cv->max_message_bytes;
  int task = cv->task;
  const char *addr = cv->addr;
  bool prefix_only = cv->prefix_only;
  for (size_t i = 0; cv->v && i < cv->n; i++) {
    free(cv->v[i].name);
    free(cv->v[i].key);
  }
  free(cv->v);
  free(cv->prefix);
  memset(cv, 0, sizeof *cv);
  cv->max_message_bytes = max;
  cv->task = task;
  cv->addr = addr;
  cv->prefix_only = prefix_only;
}

/* A shape of the answer: rank <= PS_MAX_RANK, dims
 * >= 0 whose byte size fits. */
static int list_shape(const char *key, int dtype, const int64_t *dims, size_t rank,
                      ps_shape *out, ps_status *st) {
  size_t bytes;
  if (rank > PS_MAX_RANK)
    return ps_cl_bad_answer_(st, M_RESTORE, "tensor %s has rank %zu, above %d", key, rank,
                             PS_MAX_RANK);
  for (size_t d = 0; d < rank; d++)
    if (dims[d] < 0)
      return ps_cl_bad_answer_(st, M_RESTORE, "tensor %s has a negative dimension", key);
  if (ps_shape_set(out, dims, rank, NULL) != 0)
    return ps_cl_bad_answer_(st, M_RESTORE, "tensor %s has a shape no ps holds", key);
  if (ps_size_bytes(dtype, out, &bytes) != 0)
    return ps_cl_bad_answer_(st, M_RESTORE, "tensor %s has too many bytes", key);
  return 0;
}

/* Part @i of entry @e, from its slice @s: rows [start, start + length) of
 * the full tensor when only dimension 0 is sliced, else not a part a ps
 * variable can hold (rows false). */
static int list_part(const Paramserver__CheckpointEntry *e, const ps_shape *full,
                     const Paramserver__CheckpointSlice *s, ckpt_var *v, ps_status *st) {
  int rank = full->rank;
  if (s->n_start != (size_t)rank || s->n_length != (size_t)rank)
    return ps_cl_bad_answer_(
        st, M_RESTORE, "tensor %s: a slice of %zu starts and %zu lengths for rank %d",
        e->key, s->n_start, s->n_length, rank);
  v->rows = rank > 0;
  v->shape = *full;
  for (int d = 0; d < rank; d++) {
    int64_t a = s->start[d], l = s->length[d], dim = full->dim[d];
    if (a < 0 || a > dim || l < -1 || (l == -1 && a != 0) || (l >= 0 && l > dim - a))
      return ps_cl_bad_answer_(st, M_RESTORE, "tensor %s: a slice outside its shape",
                               e->key);
    int64_t len = l == -1 ? dim : l;
    if (d > 0 && len != dim) v->rows = false;
    if (d == 0) v->shape.dim[0] = len;
    if (d == 0) v->offset = a;
  }
  int64_t row =
      rank > 0 && full->dim[0] > 0 ? ps_shape_num_elements(full) / full->dim[0] : 0;
  v->offset *= row;
  return 0;
}

static int cmp_part_offset(const void *a, const void *b) {
  const ckpt_var *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The variables of entry @e appended to @o: the tensor, or its parts
 * (named "KEY/part_I" in row order); a tensor of a dtype no ps variable
 * has (DT_STRING, DT_RESOURCE, DT_VARIANT...: what a program keeps in its
 * session) is not a ps variable: counted in o->skipped, left out. */
/* Whether @key is a tensor of an embedding table (NAME_mht_SofN-keys,
 * -values, -versions, -freqs; ps/ckpt_save.c): the ps restores those
 * into its tables itself, they are no variables. */
static bool table_tensor(const char *key) {
  static const char *const kinds[] = {"-keys", "-values", "-versions", "-freqs"};
  const char *m = strstr(key, "_mht_");
  while (m) {
    const char *p = m + 5;
    size_t a = strspn(p, "0123456789");
    if (a > 0 && strncmp(p + a, "of", 2) == 0) {
      p += a + 2;
      size_t b = strspn(p, "0123456789");
      for (size_t k = 0; b > 0 && k < 4; k++)
        if (strcmp(p + b, kinds[k]) == 0) return true;
    }
    m = strstr(m + 1, "_mht_");
  }
  return false;
}

static int list_entry(ckpt_vars *o, const Paramserver__CheckpointEntry *e,
                      ps_status *st) {
  ps_shape full;
  if (e->key == NULL || e->key[0] == '\0')
    return ps_cl_bad_answer_(st, M_RESTORE, "a tensor of the checkpoint has no name");
  if (e->n_slices == 0 && table_tensor(e->key)) return 0;
  if (ps_dtype_size(e->dtype) == 0) {
    o->skipped++;
    return 0;
  }
  if (list_shape(e->key, e->dtype, e->shape, e->n_shape, &full, st) != 0) return st->code;
  size_t first = o->n, nparts = e->n_slices ? e->n_slices : 1, len = strlen(e->key) + 32;
  for (size_t i = 0; i < nparts; i++) {
    ckpt_var *v = &o->v[o->n];
    memset(v, 0, sizeof *v);
    v->dtype = e->dtype;
    v->shape = full;
    if (e->n_slices) {
      v->part = true;
      v->full_shape = full;
      if (list_part(e, &full, e->slices[i], v, st) != 0) return st->code;
    }
    v->key = strdup(e->key);
    v->name = malloc(len);
    o->n++;
    if (v->key == NULL || v->name == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  if (e->n_slices) qsort(&o->v[first], nparts, sizeof *o->v, cmp_part_offset);
  for (size_t i = first + 1; e->n_slices && i < o->n; i++) {
    const ckpt_var *a = &o->v[i - 1], *b = &o->v[i];
    if (a->rows && b->rows && a->offset + ps_shape_num_elements(&a->shape) > b->offset)
      return ps_cl_bad_answer_(st, M_RESTORE, "tensor %s: two slices overlap", e->key);
  }
  for (size_t i = 0; i < nparts; i++)
    if (e->n_slices)
      snprintf(o->v[first + i].name, len, "%s/part_%zu", e->key, i);
    else
      snprintf(o->v[first + i].name, len, "%s", e->key);
  return 0;
}

int ps_cl_parse_restore_list_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                              ps_status *st) {
  ckpt_vars *o = user;
  ps_cl_ckpt_vars_fini_(o); /* a retried call parses again */
  if (ps_cl_wire_ok_(&paramserver__restore_response__descriptor, M_RESTORE, p, n, st))
    return st->code;
  size_t most = list_max_vars(o->max_message_bytes), count = list_count_vars(p, n, most);
  if (count > most)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "ps/%d at %s: Restore: the checkpoint's list has more than %zu "
                         "tensors and slices, the most a client holds with a limit of "
                         "%lld bytes (--max-message-bytes)",
                         o->task, o->addr ? o->addr : "?", most,
                         (long long)o->max_message_bytes);
  Paramserver__RestoreResponse *r = paramserver__restore_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_RESTORE, "the answer does not parse");
  int rc = 0;
  size_t total = 0;
  for (size_t i = 0; i < r->n_entries && rc == 0; i++) {
    size_t k = r->entries[i]->n_slices ? r->entries[i]->n_slices : 1;
    if (k > SIZE_MAX / sizeof *o->v - 1 - total)
      rc = ps_cl_bad_answer_(st, M_RESTORE, "too many tensors");
    total += k;
  }
  o->listed = r->listed;
  o->checked = r->checked;
  if (rc == 0 && r->listed && r->prefix[0] == '\0')
    rc = ps_cl_bad_answer_(st, M_RESTORE, "the answer names no checkpoint");
  if (rc == 0 && r->listed) {
    o->v = calloc(o->prefix_only ? 1 : total + 1, sizeof *o->v);
    o->prefix = strdup(r->prefix);
    if (o->v == NULL || o->prefix == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  for (size_t i = 0; rc == 0 && r->listed && !o->prefix_only && i < r->n_entries; i++) {
    const char *prev = i ? r->entries[i - 1]->key : NULL, *key = r->entries[i]->key;
    if (prev && key && strcmp(prev, key) >= 0)
      rc = ps_cl_bad_answer_(st, M_RESTORE,
                             "tensor %s after %s: the checkpoint's tensors are not in "
                             "order, or one is listed twice",
                             key, prev);
    else
      rc = list_entry(o, r->entries[i], st);
  }
  paramserver__restore_response__free_unpacked(r, NULL);
  if (rc != 0) ps_cl_ckpt_vars_fini_(o);
  return rc;
}

/* The one item a list request names: no variable has an empty name, so
 * an older ps-server, which ignores list and looks the item up, fails at
 * once with NOT_FOUND (reading nothing); a ps that lists ignores items. */
#define LIST_PROBE_NAME ""

/* Whether the answers of @tasks[0..@n) are lists of one checkpoint: every
 * call succeeded, every ps listed (an older ps-server fails on the probe
 * item, or checks, or restores), and all resolved the same path, as
 * ps_client_check_restore_all says. */
static int lists_agree(ps_client *c, const ps_rpc_req *reqs, const int *tasks, size_t n,
                       const ckpt_vars *cv, ps_status *st) {
  for (size_t i = 0; i < n; i++)
    if (reqs[i].st.code == PS_NOT_FOUND &&
        strstr(reqs[i].st.msg, "variable " LIST_PROBE_NAME " does not exist"))
      return ps_status_set(st, PS_FAILED_PRECONDITION,
                           "Restore: /job:ps/task:%d (%s) did not list the checkpoint: "
                           "an older ps-server; nothing changed. Upgrade every "
                           "ps-server to restore with these checks",
                           tasks[i], c->addrs[tasks[i]]);
  for (size_t i = 0; i < n; i++)
    if (reqs[i].st.code != PS_OK) {
      *st = reqs[i].st;
      return st->code;
    }
  for (size_t i = 0; i < n; i++)
    if (!cv[i].listed)
      return ps_status_set(
          st, PS_FAILED_PRECONDITION,
          "Restore: /job:ps/task:%d (%s) did not list the checkpoint: an older "
          "ps-server, which %s. Upgrade every ps-server to restore with these checks",
          tasks[i], c->addrs[tasks[i]],
          cv[i].checked ? "checked it instead; nothing changed"
                        : "ignores check_only and restored at once; its variables may "
                          "have changed");
  for (size_t i = 1; i < n; i++)
    if (strcmp(cv[i].prefix, cv[0].prefix) != 0)
      return ps_status_set(st, PS_FAILED_PRECONDITION,
                           "Restore: the ps disagree on the checkpoint: /job:ps/task:%d "
                           "checked %s, /job:ps/task:%d checked %s (a save in between, "
                           "or ps with different checkpoint directories); nothing "
                           "restored",
                           tasks[0], cv[0].prefix, tasks[i], cv[i].prefix);
  return 0;
}

/* The checkpoint's variables into *@out, as every ps task (or only
 * @o->task) lists them from its checkpoint directory, all at once; the
 * path they resolved (the latest for @prefix NULL or "") in out->prefix.
 * Only the first task's tensors are kept: the others' answers are checked
 * for the path alone, so a client holds one list whatever the ps count. */
static int list_checkpoint(ps_client *c, const char *prefix, const ps_restore_options *o,
                           ckpt_vars *out, ps_status *st) {
  size_t n = o->one_task ? 1 : (size_t)c->nps;
  Paramserver__RestoreRequest rq = PARAMSERVER__RESTORE_REQUEST__INIT;
  rq.prefix = (char *)(prefix ? prefix : "");
  rq.check_only = true; /* and one that also ignores items only checks */
  rq.list = true;
  Paramserver__RestoreItem probe = PARAMSERVER__RESTORE_ITEM__INIT, *items[1] = {&probe};
  probe.name = LIST_PROBE_NAME;
  rq.items = items;
  rq.n_items = 1;
  ps_rpc_req *reqs = calloc(n, sizeof *reqs);
  answer *as = calloc(n, sizeof *as);
  int *tasks = calloc(n, sizeof *tasks);
  ckpt_vars *cv = calloc(n, sizeof *cv);
  int rc = 0;
  if (reqs == NULL || as == NULL || tasks == NULL || cv == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    tasks[i] = o->one_task ? o->task : (int)i;
    cv[i] = (ckpt_vars){.max_message_bytes = c->opt.max_message_bytes,
                        .task = tasks[i],
                        .addr = c->addrs[tasks[i]],
                        .prefix_only = i > 0}; /* one list in memory, not nps */
    ps_cl_req_init_(c, &reqs[i], tasks[i], M_RESTORE, &rq.base, true, false);
    reqs[i].timeout_ms = c->opt.data_timeout_ms;
    ps_cl_answer_init_(c, tasks[i], &reqs[i], &as[i], ps_cl_parse_restore_list_, &cv[i],
                       NULL);
  }
  ps_cl_run_reqs_(c, reqs, tasks, n, true);
  if ((rc = lists_agree(c, reqs, tasks, n, cv, st)) == 0) {
    *out = cv[0];
    memset(&cv[0], 0, sizeof cv[0]);
  }
out:
  for (size_t i = 0; cv && i < n; i++)
    ps_cl_ckpt_vars_fini_(&cv[i]);
  free(cv);
  free(tasks);
  free(as);
  free(reqs);
  return rc;
}

/* What every ps task holds, in one array sorted by checkpoint key. */
typedef struct live_vars {
  ps_var_info **v; /* sorted by key */
  size_t n;
  ps_var_info **per; /* per task, as listed */
  size_t *nper;
  int nps;
} live_vars;

static const char *live_key(const ps_var_info *v) {
  return v->full_name ? v->full_name : v->name;
}

static int cmp_live(const void *a, const void *b) {
  return strcmp(live_key(*(ps_var_info *const *)a), live_key(*(ps_var_info *const *)b));
}

static void live_fini(live_vars *l) {
  for (int t = 0; l->per && t < l->nps; t++)
    ps_client_free_var_info(l->per[t], l->nper[t]);
  free(l->per);
  free(l->nper);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int live_list(ps_client *c, live_vars *l, ps_status *st) {
  l->nps = c->nps;
  l->per = calloc((size_t)c->nps, sizeof *l->per);
  l->nper = calloc((size_t)c->nps, sizeof *l->nper);
  if (l->per == NULL || l->nper == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  size_t total = 0;
  for (int t = 0; t < c->nps; t++) {
    if (ps_client_list(c, t, &l->per[t], &l->nper[t], st) != 0) return st->code;
    total += l->nper[t];
  }
  if ((l->v = calloc(total + 1, sizeof *l->v)) == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  for (int t = 0; t < c->nps; t++)
    for (size_t i = 0; i < l->nper[t]; i++)
      l->v[l->n++] = &l->per[t][i];
  qsort(l->v, l->n, sizeof *l->v, cmp_live);
  return 0;
}

/* The first live variable of key @key, or l->n. */
static size_t live_find(const live_vars *l, const char *key) {
  size_t lo = 0, hi = l->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(live_key(l->v[mid]), key) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

typedef struct span {
  int64_t lo, hi;
} span;

static int cmp_span(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Whether a ps holds @v: a variable of its key, plain, or parts of it
 * (a partitioned variable restored into another number of ps has other
 * parts) that together cover every element of @v's.  Out of memory: as
 * if not held (the restore then fails naming it, changing nothing). */
static bool live_holds(const live_vars *l, const ckpt_var *v) {
  int64_t lo = v->part ? v->offset : 0, hi = lo + ps_shape_num_elements(&v->shape);
  size_t first = live_find(l, v->key), k = 0;
  for (size_t i = first; i < l->n && !strcmp(live_key(l->v[i]), v->key); i++) {
    if (l->v[i]->full_name == NULL) return true;
    k++;
  }
  if (k == 0) return false;
  if (hi <= lo) return true; /* no element to cover */
  span *sp = calloc(k, sizeof *sp);
  if (sp == NULL) return false;
  for (size_t i = 0; i < k; i++) {
    const ps_var_info *w = l->v[first + i];
    sp[i] = (span){w->offset, w->offset + ps_shape_num_elements(&w->shape)};
  }
  qsort(sp, k, sizeof *sp, cmp_span);
  int64_t at = lo; /* covered up to here */
  for (size_t i = 0; i < k && at < hi; i++)
    if (sp[i].lo <= at && sp[i].hi > at) at = sp[i].hi;
  free(sp);
  return at >= hi;
}

/* "a, b, c, ..." of the variables of @cv that no ps holds, at most
 * ABSENT_SHOWN of them, into @buf. */
static void absent_names(const ckpt_vars *cv, char *buf, size_t size) {
  size_t used = 0, shown = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < cv->n; i++) {
    if (cv->v[i].present) continue;
    const char *sep = shown ? ", " : "";
    size_t w = strlen(sep) + strlen(cv->v[i].name);
    /* a name that does not fit (with room for ", ...") is not cut */
    if (shown == ABSENT_SHOWN || used + w + 6 > size) {
      if (used + 6 <= size) snprintf(buf + used, size - used, "%s...", sep);
      return;
    }
    snprintf(buf + used, size - used, "%s%s", sep, cv->v[i].name);
    used += w;
    shown++;
  }
}

/* Placement for --create, as replica_device_setter placed the variables
 * (worker/graph/placement.c): round robin over the ps tasks, each variable
 * and each part of a partitioned one a turn, in the checkpoint's order
 * (it keeps no creation order: sorted by name); a slot takes no turn and
 * goes with its primary, as TensorFlow's colocate_with (variables.c's
 * ps_slot_create_): "P/SLOT" (w/Momentum, w/Adam_1, w/part_0/Momentum;
 * part I of a partitioned slot with part I of P), and Adam's beta1_power
 * and beta2_power with the first P by name that has a P/Adam. */
static int cmp_var_name(const void *a, const void *b) {
  return strcmp((*(const ckpt_var *const *)a)->name, (*(const ckpt_var *const *)b)->name);
}

/* The variable of @cv named @name (the first @len bytes of it, then
 * @tail), or NULL; @by is @cv sorted by name. */
static const ckpt_var *find_name(ckpt_var *const *by, size_t n, const char *name,
                                 size_t len, const char *tail) {
  size_t size = len + strlen(tail) + 1;
  char *buf = malloc(size);
  if (buf == NULL) return NULL; /* out of memory: placed as a primary */
  memcpy(buf, name, len);
  memcpy(buf + len, tail, size - len);
  ckpt_var key = {.name = buf}, *kp = &key;
  ckpt_var *const *f = bsearch(&kp, by, n, sizeof *by, cmp_var_name);
  free(buf);
  return f ? *f : NULL;
}

/* Whether @s is "part_I" (a part saved under its own name takes a turn). */
static bool is_part_name(const char *s) {
  if (strncmp(s, "part_", 5) != 0 || s[5] == '\0') return false;
  for (s += 5; *s; s++)
    if (*s < '0' || *s > '9') return false;
  return true;
}

/* The primary @v is a slot of, or NULL. */
static const ckpt_var *primary_of(ckpt_var *const *by, size_t n, const ckpt_var *v,
                                  const char *adam) {
  if (!strcmp(v->key, "beta1_power") || !strcmp(v->key, "beta2_power"))
    return adam ? find_name(by, n, adam, strlen(adam) - strlen("/Adam"), "") : NULL;
  const char *slash = strrchr(v->key, '/');
  if (slash == NULL || is_part_name(slash + 1)) return NULL; /* "P/part_I" */
  size_t len = (size_t)(slash - v->key);
  const ckpt_var *p = find_name(by, n, v->key, len, "");
  if (p == NULL && v->part) /* part I of a partitioned slot: part I of P */
    p = find_name(by, n, v->key, len, v->name + strlen(v->key));
  if (p == NULL) p = find_name(by, n, v->key, len, "/part_0");
  return p;
}

/* Sets every variable's where: @o's task, else as above. */
static int place_all(const ps_client *c, ckpt_vars *cv, const ps_restore_options *o,
                     ps_status *st) {
  ckpt_var **by = calloc(cv->n + 1, sizeof *by);
  const ckpt_var **prim = calloc(cv->n + 1, sizeof *prim);
  if (by == NULL || prim == NULL) {
    free(by);
    free(prim);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Restore: out of memory");
  }
  const char *adam = NULL; /* the first "P/Adam" by name */
  for (size_t i = 0; i < cv->n; i++) {
    by[i] = &cv->v[i];
    size_t l = strlen(cv->v[i].name);
    if (l > 5 && !strcmp(cv->v[i].name + l - 5, "/Adam") &&
        (adam == NULL || strcmp(cv->v[i].name, adam) < 0))
      adam = cv->v[i].name;
  }
  qsort(by, cv->n, sizeof *by, cmp_var_name);
  size_t turn = 0;
  for (size_t i = 0; i < cv->n; i++) {
    prim[i] = o->one_task ? NULL : primary_of(by, cv->n, &cv->v[i], adam);
    if (prim[i] == &cv->v[i]) prim[i] = NULL;
    cv->v[i].where = -1;
    if (o->one_task)
      cv->v[i].where = o->task;
    else if (prim[i] == NULL)
      cv->v[i].where = (int)(turn++ % (size_t)c->nps);
  }
  /* slots after every primary has its task (beta1_power sorts first);
   * a slot of a slot follows its primary, which sorts before it */
  for (size_t i = 0; i < cv->n; i++)
    if (prim[i]) cv->v[i].where = prim[i]->where >= 0 ? prim[i]->where : 0;
  free(prim);
  free(by);
  return 0;
}

/* The ps task variable @i of @cv goes to when created. */
static int place(const ckpt_vars *cv, size_t i) {
  return cv->v[i].where;
}

/* Appends to @st's message (a failure's), as room allows. */
static void status_append(ps_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void status_append(ps_status *st, const char *fmt, ...) {
  size_t used = strlen(st->msg);
  if (used + 1 >= sizeof st->msg) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->msg + used, sizeof st->msg - used, fmt, ap);
  va_end(ap);
}

/* Deletes again the variables marked in @created (after the failure in
 * @st); returns how many are left, each task's named in @st's message. */
static size_t delete_created(ps_client *c, const ckpt_vars *cv, const bool *created,
                             ps_status *st) {
  size_t left = 0;
  const char **names = calloc(cv->n + 1, sizeof *names);
  for (int t = 0; t < c->nps; t++) {
    size_t k = 0;
    for (size_t i = 0; i < cv->n; i++)
      if (created[i] && place(cv, i) == t) {
        if (names) names[k] = cv->v[i].name;
        k++;
      }
    ps_status dst;
    if (k == 0) continue;
    if (names == NULL)
      ps_status_set(&dst, PS_RESOURCE_EXHAUSTED, "out of memory");
    else if (ps_client_delete(c, t, names, k, PS_DELETE_MISSING_OK, NULL, &dst) == 0)
      continue;
    left += k;
    PS_WARN("restore: %zu variables created on ps/%d are left: %s", k, t, dst.msg);
    status_append(st, "; %zu variables created on ps/%d are left:", k, t);
    for (size_t i = 0; i < k && names; i++)
      status_append(st, "%s %s", i ? "," : "", names[i]);
    status_append(st, " (%s)", dst.msg);
  }
  free(names);
  return left;
}

/* Creates the variables of @cv that no ps holds on their tasks, marking
 * them in @created. */
static int create_absent(ps_client *c, const ckpt_vars *cv, const ps_restore_options *o,
                         bool *created, ps_status *st) {
  for (size_t i = 0; i < cv->n; i++)
    if (!cv->v[i].present && cv->v[i].part && !cv->v[i].rows)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "restore: %s is saved in slices across more than its first "
                           "dimension, which no ps variable holds: create it from its "
                           "training program; nothing changed",
                           cv->v[i].key);
  ps_var_spec *specs = calloc(cv->n + 1, sizeof *specs);
  if (specs == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  int rc = 0;
  for (int t = 0; t < c->nps && rc == 0; t++) {
    size_t k = 0;
    for (size_t i = 0; i < cv->n; i++) {
      const ckpt_var *v = &cv->v[i];
      if (v->present || place(cv, i) != t) continue;
      specs[k++] = (ps_var_spec){.name = v->name,
                                 .dtype = (ps_dtype)v->dtype,
                                 .shape = v->shape,
                                 .full_name = v->part ? v->key : NULL,
                                 .full_shape = v->part ? &v->full_shape : NULL,
                                 .offset = v->part ? v->offset : 0};
    }
    if (k == 0) continue;
    rc = ps_client_create_vars(c, t, specs, k, st);
    for (size_t i = 0; i < cv->n && rc == 0; i++)
      created[i] |= !cv->v[i].present && place(cv, i) == t;
    if (rc == 0) PS_INFO("restore: created %zu variables on ps/%d", k, t);
  }
  free(specs);
  return rc;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* --only-missing: per task, the variables created now and those of the
 * checkpoint a ps holds without a value. */
static size_t missing_on(ps_client *c, const ckpt_vars *cv, const live_vars *l,
                         const ps_restore_options *o, const bool *created,
                         const char **keys, int t, const char **names) {
  size_t k = 0;
  for (size_t i = 0; i < cv->n; i++)
    if (created[i] && place(cv, i) == t) names[k++] = cv->v[i].name;
  for (size_t i = 0; i < l->nper[t]; i++) {
    const ps_var_info *w = &l->per[t][i];
    const char *key = live_key(w);
    if (!w->initialized && bsearch(&key, keys, cv->n, sizeof *keys, cmp_str))
      names[k++] = w->name;
  }
  return k;
}

/* Restores what @o asks for from cv->prefix: every variable (of
 * o->task), or only the missing ones, checked on every ps first. */
static int restore_chosen(ps_client *c, const ckpt_vars *cv, const live_vars *l,
                          const ps_restore_options *o, const bool *created,
                          size_t *nrestored, ps_status *st) {
  if (!o->only_missing && !o->one_task)
    return ps_cl_restore_all_(c, cv->prefix, nrestored, st);
  if (!o->only_missing)
    return ps_cl_restore_vars_(c, o->task, cv->prefix, NULL, NULL, 0, false, nrestored,
                               st);
  size_t nl = 0;
  for (int t = 0; t < c->nps; t++)
    nl += l->nper[t];
  const char **keys = calloc(cv->n + 1, sizeof *keys);
  const char **names = calloc(cv->n + nl + 1, sizeof *names);
  const char *const **per = calloc((size_t)c->nps, sizeof *per);
  size_t *n = calloc((size_t)c->nps, sizeof *n);
  char *checked = NULL;
  int rc = 0, ntasks = 0;
  if (keys == NULL || names == NULL || per == NULL || n == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < cv->n; i++)
    keys[i] = cv->v[i].key;
  qsort(keys, cv->n, sizeof *keys, cmp_str);
  size_t used = 0;
  for (int t = 0; t < c->nps; t++) {
    per[t] = names + used;
    if (!o->one_task || t == o->task)
      n[t] = missing_on(c, cv, l, o, created, keys, t, names + used);
    used += n[t];
    ntasks += n[t] > 0;
  }
  /* all or nothing across the ps, as ps_client_restore */
  if (ntasks > 1)
    rc = ps_client_check_restore_all(c, cv->prefix, per, NULL, n, &checked, st);
  for (int t = 0; t < c->nps && rc == 0; t++) {
    size_t k = 0;
    if (n[t])
      rc = ps_cl_restore_vars_(c, t, cv->prefix, per[t], NULL, n[t], false, &k, st);
    *nrestored += k;
  }
out:
  free(checked);
  free(n);
  free(per);
  free(names);
  free(keys);
  return rc;
}

/* NOT_FOUND naming what exists on no ps task, with the way out. */
#define ABSENT_FORMAT                                                                    \
  "restored 0 of %zu variables of %s (nothing changed); %zu exist on no ps task: %s "    \
  "(a restarted ps comes back empty: recreate them with psctl restore --create, or "     \
  "restore from the chief)"

/* NOT_FOUND naming what exists on no ps task, with the way out: the names
 * get the room the rest of the message leaves (a long prefix cuts names,
 * never the way out). */
static int absent_error(const ckpt_vars *cv, size_t absent, ps_status *st) {
  char names[600];
  int fixed = snprintf(NULL, 0, ABSENT_FORMAT, cv->n, cv->prefix, absent, "");
  size_t room = sizeof st->msg, size = sizeof names;
  if (fixed >= 0 && (size_t)fixed < room)
    size = room - (size_t)fixed;
  else
    size = 1;
  absent_names(cv, names, size < sizeof names ? size : sizeof names);
  return ps_status_set(st, PS_NOT_FOUND, ABSENT_FORMAT, cv->n, cv->prefix, absent, names);
}

int ps_client_restore_opts(ps_client *c, const char *prefix, const ps_restore_options *o,
                           ps_restore_result *res, ps_status *st) {
  ps_restore_options none = {0};
  if (o == NULL) o = &none;
  if (res) memset(res, 0, sizeof *res);
  if (o->one_task && (o->task < 0 || o->task >= c->nps))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "restore: ps task %d does not exist (the cluster has %d ps "
                         "tasks: 0 to %d)",
                         o->task, c->nps, c->nps - 1);
  ckpt_vars cv = {0};
  live_vars l = {0};
  bool *created = NULL;
  size_t absent = 0, ncreated = 0, nrestored = 0;
  int rc = list_checkpoint(c, prefix, o, &cv, st);
  if (rc == 0) rc = live_list(c, &l, st);
  if (rc == 0 && (created = calloc(cv.n + 1, sizeof *created)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; rc == 0 && i < cv.n; i++)
    absent += !(cv.v[i].present = live_holds(&l, &cv.v[i]));
  if (rc == 0 && absent > 0 && !o->create) rc = absent_error(&cv, absent, st);
  if (rc == 0 && absent > 0) rc = place_all(c, &cv, o, st);
  if (rc == 0 && absent > 0) rc = create_absent(c, &cv, o, created, st);
  if (rc == 0) rc = restore_chosen(c, &cv, &l, o, created, &nrestored, st);
  for (size_t i = 0; created && i < cv.n; i++)
    ncreated += created[i];
  if (rc != 0 && ncreated > 0) /* nothing changed: they go again */
    ncreated = delete_created(c, &cv, created, st);
  if (res) {
    *res = (ps_restore_result){.restored = rc == 0 ? nrestored : 0,
                               .total = cv.n,
                               .absent = absent,
                               .created = ncreated,
                               .skipped = cv.skipped,
                               .prefix = cv.prefix};
    cv.prefix = NULL;
  }
  free(created);
  live_fini(&l);
  ps_cl_ckpt_vars_fini_(&cv);
  return rc;
}

void ps_restore_result_fini(ps_restore_result *r) {
  if (r == NULL) return;
  free(r->prefix);
  memset(r, 0, sizeof *r);
}

int ps_client_restore(ps_client *c, const char *prefix, size_t *nrestored,
                      ps_status *st) {
  ps_restore_result r;
  int rc = ps_client_restore_opts(c, prefix, NULL, &r, st);
  if (nrestored) *nrestored = r.restored;
  ps_restore_result_fini(&r);
  return rc;
}
