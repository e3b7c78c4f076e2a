/* Embedding tables from the client (paramserver/embedding.h): a call's
 * keys deduplicated, split by the ps task each key lives on
 * (common/embed_key.h), sent to every task concerned at once, and the
 * answers' rows copied back to every position that asked. */
#include "client_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/embed_key.h"
#include "common/tensor.h"
#include "paramserver/embedding.h"

#define M_TCREATE "/paramserver.Ps/TableCreate"
#define M_TLOOKUP "/paramserver.Ps/TableLookup"
#define M_TUPDATE "/paramserver.Ps/TableUpdate"
#define M_TLIST "/paramserver.Ps/TableList"
#define MAX_DIM 65536

void ps_table_spec_default(ps_table_spec *s, const char *name, int64_t dim) {
  memset(s, 0, sizeof *s);
  s->name = name;
  s->dtype = PS_DT_FLOAT;
  s->dim = dim;
  ps_init_spec_default(&s->init, PS_INIT_TRUNCATED_NORMAL);
  s->init.stddev = dim > 0 ? 1.0 / sqrt((double)dim) : 1.0;
}

int ps_table_key_task(int64_t key, int ntasks) {
  return ntasks > 0 ? ps_embed_key_task(key, ntasks) : -1;
}

/* ---- TableCreate ---- */

int ps_cl_parse_table_create_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                              ps_status *st) {
  Paramserver__TableCreateResponse *r =
      paramserver__table_create_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_TCREATE, "the answer does not parse");
  *(bool *)user = r->created;
  paramserver__table_create_response__free_unpacked(r, NULL);
  return 0;
}

static const char *const opt_names[] = {"sgd", "adagrad", "adam", "ftrl"};

int ps_client_table_create(ps_client *c, const ps_table_spec *spec, ps_status *st) {
  if (spec == NULL || spec->name == NULL || spec->name[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "TableCreate: a table needs a name");
  if ((unsigned)spec->optimizer > PS_TABLE_FTRL || (unsigned)spec->policy.evict > 1)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT, "TableCreate %s: unknown %s %d", spec->name,
        (unsigned)spec->optimizer > PS_TABLE_FTRL ? "optimizer" : "evict",
        (unsigned)spec->optimizer > PS_TABLE_FTRL ? (int)spec->optimizer
                                                  : (int)spec->policy.evict);
  Paramserver__Initializer init;
  ps_cl_init_to_proto_(&spec->init, &init);
  Paramserver__TablePolicy pol = PARAMSERVER__TABLE_POLICY__INIT;
  pol.min_count = spec->policy.min_count;
  pol.sketch_width = spec->policy.sketch_width;
  pol.sketch_depth = spec->policy.sketch_depth;
  pol.ttl_steps = spec->policy.ttl_steps;
  pol.ttl_seconds = spec->policy.ttl_seconds;
  pol.max_rows = spec->policy.max_rows;
  pol.evict = spec->policy.evict == PS_TABLE_EVICT_LFU ? "lfu" : "lru";
  Paramserver__TableSpec ts = PARAMSERVER__TABLE_SPEC__INIT;
  ts.name = (char *)spec->name;
  ts.dtype = spec->dtype;
  ts.dim = spec->dim;
  ts.initializer = &init;
  ts.optimizer = (char *)opt_names[spec->optimizer];
  ts.slot_init = spec->slot_init;
  ts.policy = &pol;
  Paramserver__TableCreateRequest req = PARAMSERVER__TABLE_CREATE_REQUEST__INIT;
  req.spec = &ts;
  int n = c->nps;
  ps_rpc_req *reqs = calloc((size_t)n + 1, sizeof *reqs);
  answer *ans = calloc((size_t)n + 1, sizeof *ans);
  int *tasks = calloc((size_t)n + 1, sizeof *tasks);
  bool *created = calloc((size_t)n + 1, sizeof *created);
  int rc = 0;
  if (!reqs || !ans || !tasks || !created) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (int t = 0; t < n; t++) {
    tasks[t] = t;
    ps_cl_req_init_(c, &reqs[t], t, M_TCREATE, &req.base, true, false);
    ps_cl_answer_init_(c, t, &reqs[t], &ans[t], ps_cl_parse_table_create_, &created[t],
                       spec->name);
  }
  ps_cl_run_reqs_(c, reqs, tasks, (size_t)n, true);
  for (int t = 0; t < n && rc == 0; t++)
    if (reqs[t].st.code != PS_OK) {
      rc = reqs[t].st.code;
      if (st) *st = reqs[t].st;
    }
out:
  free(created);
  free(tasks);
  free(ans);
  free(reqs);
  return rc;
}

/* ---- a call's keys, deduplicated and split by task ---- */

typedef ps_cl_keyset keyset;

static void keyset_fini(keyset *k) {
  ps_cl_keyset_fini_(k);
}

static int keyset_init(keyset *k, const int64_t *keys, int64_t n, int ntasks) {
  memset(k, 0, sizeof *k);
  k->n = n;
  size_t cap = 16;
  while (cap < (size_t)n * 2)
    cap *= 2;
  int64_t *slot = malloc(cap * sizeof *slot); /* index + 1 into first-seen keys */
  int64_t *first = malloc(((size_t)n + 1) * sizeof *first);
  int *task = malloc(((size_t)n + 1) * sizeof *task);
  int64_t *rank = malloc(((size_t)n + 1) * sizeof *rank);
  k->u = malloc(((size_t)n + 1) * sizeof *k->u);
  k->from = malloc(((size_t)n + 1) * sizeof *k->from);
  k->start = calloc((size_t)ntasks + 2, sizeof *k->start);
  int rc = 0;
  if (!slot || !first || !task || !rank || !k->u || !k->from || !k->start) {
    rc = -1;
    goto out;
  }
  memset(slot, 0, cap * sizeof *slot);
  int64_t nu = 0;
  for (int64_t i = 0; i < n; i++) {
    uint64_t h = ps_embed_key_hash(keys[i]);
    size_t pos = (size_t)(h * 0x9E3779B97F4A7C15ull) & (cap - 1);
    while (slot[pos] && first[slot[pos] - 1] != keys[i])
      pos = (pos + 1) & (cap - 1);
    if (slot[pos] == 0) {
      first[nu] = keys[i];
      task[nu] = (int)(h % (uint64_t)ntasks);
      k->start[task[nu] + 1]++;
      slot[pos] = ++nu;
    }
    k->from[i] = slot[pos] - 1; /* first-seen order for now */
  }
  k->nu = nu;
  for (int t = 0; t < ntasks; t++)
    k->start[t + 1] += k->start[t];
  int64_t *at = rank; /* reuse: the next place of each task, then ranks */
  int64_t *next = calloc((size_t)ntasks + 1, sizeof *next);
  if (next == NULL) {
    rc = -1;
    goto out;
  }
  memcpy(next, k->start, (size_t)ntasks * sizeof *next);
  for (int64_t j = 0; j < nu; j++) {
    at[j] = next[task[j]]++;
    k->u[at[j]] = first[j];
  }
  free(next);
  for (int64_t i = 0; i < n; i++)
    k->from[i] = at[k->from[i]];
out:
  free(slot);
  free(first);
  free(task);
  free(rank);
  if (rc != 0) keyset_fini(k);
  return rc;
}

/* A copy of @src into @dst (@ntasks tasks); -1: out of memory. */
static int keyset_copy(keyset *dst, const keyset *src, int ntasks) {
  memset(dst, 0, sizeof *dst);
  dst->n = src->n;
  dst->nu = src->nu;
  dst->u = malloc(((size_t)src->nu + 1) * sizeof *dst->u);
  dst->from = malloc(((size_t)src->n + 1) * sizeof *dst->from);
  dst->start = malloc(((size_t)ntasks + 2) * sizeof *dst->start);
  if (!dst->u || !dst->from || !dst->start) {
    keyset_fini(dst);
    return -1;
  }
  memcpy(dst->u, src->u, (size_t)src->nu * sizeof *dst->u);
  memcpy(dst->from, src->from, (size_t)src->n * sizeof *dst->from);
  memcpy(dst->start, src->start, ((size_t)ntasks + 1) * sizeof *dst->start);
  return 0;
}

/* @keys' keyset: the memo's copy when the last training lookup had these
 * keys (a training step's update), else made; a training lookup's
 * (@remember) goes into the memo.  -1: out of memory. */
static int keyset_get(ps_client *c, const int64_t *keys, int64_t n, bool remember,
                      keyset *out) {
  ps_cl_table_memo *m = &c->tmemo;
  pthread_mutex_lock(&m->mu);
  bool hit = m->valid && m->ks.n == n && m->nps == c->nps &&
             memcmp(m->keys, keys, (size_t)n * sizeof *keys) == 0;
  int rc = hit ? keyset_copy(out, &m->ks, c->nps) : 1;
  pthread_mutex_unlock(&m->mu);
  if (rc <= 0) return rc;
  if (keyset_init(out, keys, n, c->nps) != 0) return -1;
  if (!remember || n > ((int64_t)1 << 20)) return 0;
  keyset copy;
  int64_t *kc = malloc(((size_t)n + 1) * sizeof *kc);
  if (kc == NULL || keyset_copy(&copy, out, c->nps) != 0) {
    free(kc);
    return 0; /* not remembered: nothing lost */
  }
  memcpy(kc, keys, (size_t)n * sizeof *kc);
  pthread_mutex_lock(&m->mu);
  keyset_fini(&m->ks);
  free(m->keys);
  m->ks = copy;
  m->keys = kc;
  m->nps = c->nps;
  m->valid = true;
  pthread_mutex_unlock(&m->mu);
  return 0;
}

/* The checks of a call's keys; their count into *@n. */
static int keys_ok(const char *method, const char *name, const ps_tensor *keys,
                   int64_t *n, ps_status *st) {
  if (name == NULL || name[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: no table name", method);
  if (keys == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: no keys", method, name);
  if (keys->dtype != PS_DT_INT64)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: keys must be int64, got %s",
                         method, name, ps_dtype_name(keys->dtype));
  if (keys->shape.rank >= PS_MAX_RANK)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: keys of rank %d leave no room for the rows' dim", method,
                         name, keys->shape.rank);
  *n = ps_shape_num_elements(&keys->shape);
  if (*n < 0 || (uint64_t)*n > UINT32_MAX)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: %lld keys in one call", method,
                         name, (long long)*n);
  return 0;
}

/* ---- TableLookup ---- */

int ps_cl_parse_table_lookup_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                              ps_status *st) {
  table_lookup_out *k = user;
  free(k->rows); /* a retried call parses a header again */
  k->rows = NULL;
  Paramserver__TableLookupResponse *r =
      paramserver__table_lookup_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_TLOOKUP, "the answer does not parse");
  int rc = 0;
  size_t bytes = 0;
  if (r->num_keys != k->n || r->dtype != PS_DT_FLOAT || r->dim < 1 || r->dim > MAX_DIM ||
      r->created < 0 || r->missing < 0 || r->created > k->n || r->missing > k->n)
    rc = ps_cl_bad_answer_(st, M_TLOOKUP,
                           "table %s: %lld rows of dim %lld, dtype %s (%lld made, %lld "
                           "missing) for %lld keys",
                           k->name, (long long)r->num_keys, (long long)r->dim,
                           ps_dtype_name(r->dtype), (long long)r->created,
                           (long long)r->missing, (long long)k->n);
  else if (ps_size_mul((size_t)k->n, (size_t)r->dim * sizeof(float), &bytes) != 0 ||
           bytes > ps_cl_tensor_limit_())
    rc =
        ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                      "ps/%d: TableLookup: table %s: %lld rows of dim %lld are more than "
                      "this machine's memory",
                      k->task, k->name, (long long)k->n, (long long)r->dim);
  else if ((k->rows = malloc(bytes ? bytes : 1)) == NULL ||
           ps_rpc_segs_add(sink, k->rows, bytes, NULL) != 0)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                       "TableLookup %s: cannot allocate %zu bytes", k->name, bytes);
  if (rc == 0) {
    k->dim = r->dim;
    k->created = r->created;
    k->missing = r->missing;
  }
  paramserver__table_lookup_response__free_unpacked(r, NULL);
  return rc;
}

/* Runs one call per task of @ks's keys (@build fills task t's request);
 * the first failure into @st. */
static int run_tasks(ps_client *c, ps_rpc_req *reqs, int *tasks, size_t n, bool safe,
                     ps_status *st) {
  ps_cl_run_reqs_(c, reqs, tasks, n, safe);
  for (size_t i = 0; i < n; i++)
    if (reqs[i].st.code != PS_OK) {
      if (st) *st = reqs[i].st;
      return reqs[i].st.code;
    }
  return 0;
}

int ps_client_table_lookup(ps_client *c, const char *name, const ps_tensor *keys,
                           bool train, int64_t step, ps_tensor **out,
                           ps_table_counts *counts, ps_status *st) {
  int64_t n;
  int rc = keys_ok("TableLookup", name, keys, &n, st);
  if (rc != 0) return rc;
  if (out == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "TableLookup %s: no output", name);
  keyset ks;
  if (keyset_get(c, ps_tensor_data(keys), n, train, &ks) != 0)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableLookup %s: out of memory",
                         name);
  int nps = c->nps;
  table_lookup_out *lt = calloc((size_t)nps + 1, sizeof *lt);
  ps_rpc_req *reqs = calloc((size_t)nps + 1, sizeof *reqs);
  int *tasks = calloc((size_t)nps + 1, sizeof *tasks);
  size_t nreq = 0;
  if (!lt || !reqs || !tasks) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableLookup %s: out of memory", name);
    goto out;
  }
  /* with no keys, one call to task 0 still learns the dim (and that the
   * table exists) */
  for (int t = 0; t < nps; t++) {
    int64_t kn = ks.start[t + 1] - ks.start[t];
    if (kn == 0 && !(n == 0 && t == 0)) continue;
    table_lookup_out *k = &lt[nreq];
    k->name = name;
    k->task = t;
    k->n = kn;
    paramserver__table_lookup_request__init(&k->req);
    k->req.name = (char *)name;
    k->req.key_dtype = PS_DT_INT64;
    k->req.num_keys = kn;
    k->req.train = train;
    k->req.step = step;
    size_t kb = (size_t)kn * sizeof(int64_t);
    if (kb <= PS_RPC_INLINE_MAX) {
      k->req.inline_data.data = (uint8_t *)(ks.u + ks.start[t]);
      k->req.inline_data.len = kb;
    } else if (ps_rpc_segs_add(&k->segs, ks.u + ks.start[t], kb, NULL) != 0) {
      rc =
          ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableLookup %s: out of memory", name);
      goto out;
    }
    ps_cl_req_init_(c, &reqs[nreq], t, M_TLOOKUP, &k->req.base, false, true);
    reqs[nreq].send = &k->segs;
    ps_cl_answer_init_(c, t, &reqs[nreq], &k->ans, ps_cl_parse_table_lookup_, k, name);
    tasks[nreq++] = t;
  }
  /* an inference lookup is safe to repeat; a training one counts toward
   * admission and makes rows: not retried */
  if ((rc = run_tasks(c, reqs, tasks, nreq, !train, st)) != 0) goto out;
  int64_t dim = lt[0].dim;
  for (size_t i = 1; i < nreq; i++)
    if (lt[i].dim != dim) {
      rc = ps_cl_bad_answer_(
          st, M_TLOOKUP, "table %s has dim %lld on ps/%d and %lld on ps/%d", name,
          (long long)dim, lt[0].task, (long long)lt[i].dim, lt[i].task);
      goto out;
    }
  ps_shape shape = keys->shape;
  shape.dim[shape.rank++] = dim;
  if (*out != NULL) {
    if ((*out)->dtype != PS_DT_FLOAT || !ps_shape_equal(&(*out)->shape, &shape)) {
      char a[128], b[128];
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TableLookup %s: destination is %s %s, the rows are float %s",
                         name, ps_dtype_name((*out)->dtype),
                         ps_shape_format(&(*out)->shape, a, sizeof a),
                         ps_shape_format(&shape, b, sizeof b));
      goto out;
    }
  } else if ((*out = ps_tensor_create(PS_DT_FLOAT, &shape, false)) == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableLookup %s: out of memory", name);
    goto out;
  }
  /* task t's rows are its keys' rows in u's order from start[t] */
  const float **base = calloc((size_t)nps + 1, sizeof *base);
  if (base == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableLookup %s: out of memory", name);
    goto out;
  }
  for (size_t i = 0; i < nreq; i++)
    base[lt[i].task] = lt[i].rows;
  float *dst = ps_tensor_data(*out);
  int t = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t u = ks.from[i];
    while (u >= ks.start[t + 1])
      t++;
    while (u < ks.start[t])
      t--;
    memcpy(dst + i * dim, base[t] + (u - ks.start[t]) * dim, (size_t)dim * sizeof *dst);
  }
  free(base);
  if (counts) {
    memset(counts, 0, sizeof *counts);
    for (size_t i = 0; i < nreq; i++) {
      counts->created += lt[i].created;
      counts->missing += lt[i].missing;
    }
  }
out:
  for (size_t i = 0; lt && i < nreq; i++) {
    free(lt[i].rows);
    ps_rpc_segs_fini(&lt[i].segs);
  }
  free(lt);
  free(reqs);
  free(tasks);
  keyset_fini(&ks);
  return rc;
}

/* ---- TableUpdate ---- */

int ps_cl_parse_table_update_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                              ps_status *st) {
  table_update_out *k = user;
  Paramserver__TableUpdateResponse *r =
      paramserver__table_update_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_TUPDATE, "the answer does not parse");
  int rc = 0;
  if (r->applied < 0 || r->missing < 0 || r->applied > k->n ||
      r->missing != k->n - r->applied)
    rc = ps_cl_bad_answer_(
        st, M_TUPDATE, "table %s: %lld applied and %lld missing of %lld keys", k->name,
        (long long)r->applied, (long long)r->missing, (long long)k->n);
  k->applied = r->applied;
  k->missing = r->missing;
  paramserver__table_update_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_table_update(ps_client *c, const char *name, ps_table_op op,
                           const ps_tensor *keys, const ps_tensor *grads,
                           const double *hparams, size_t nhparams, int64_t step,
                           ps_table_counts *counts, ps_status *st) {
  int64_t n;
  int rc = keys_ok("TableUpdate", name, keys, &n, st);
  if (rc != 0) return rc;
  if (grads == NULL || grads->dtype != PS_DT_FLOAT)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TableUpdate %s: gradients must be float, got %s", name,
                         grads ? ps_dtype_name(grads->dtype) : "none");
  bool fits = grads->shape.rank == keys->shape.rank + 1;
  for (int i = 0; fits && i < keys->shape.rank; i++)
    fits = grads->shape.dim[i] == keys->shape.dim[i];
  if (!fits) {
    char a[128], b[128];
    return ps_status_set(
        st, PS_INVALID_ARGUMENT,
        "TableUpdate %s: gradients of shape %s for keys of shape %s (want "
        "the keys' shape + [dim])",
        name, ps_shape_format(&grads->shape, a, sizeof a),
        ps_shape_format(&keys->shape, b, sizeof b));
  }
  if (nhparams && hparams == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "TableUpdate %s: hparams is NULL",
                         name);
  int64_t dim = grads->shape.dim[grads->shape.rank - 1];
  keyset ks;
  if (keyset_get(c, ps_tensor_data(keys), n, false, &ks) != 0)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableUpdate %s: out of memory",
                         name);
  int nps = c->nps;
  table_update_out *ut = calloc((size_t)nps + 1, sizeof *ut);
  ps_rpc_req *reqs = calloc((size_t)nps + 1, sizeof *reqs);
  int *tasks = calloc((size_t)nps + 1, sizeof *tasks);
  size_t nreq = 0;
  const float *g = ps_tensor_data(grads);
  size_t rowb = (size_t)dim * sizeof(float);
  if (!ut || !reqs || !tasks) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableUpdate %s: out of memory", name);
    goto out;
  }
  for (int t = 0; t < nps; t++) {
    int64_t kn = ks.start[t + 1] - ks.start[t];
    if (kn == 0) continue;
    table_update_out *k = &ut[nreq];
    k->name = name;
    k->n = kn;
    size_t kb = (size_t)kn * sizeof(int64_t), gb = (size_t)kn * rowb;
    if ((k->buf = calloc(1, kb + gb)) == NULL) {
      rc =
          ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableUpdate %s: out of memory", name);
      goto out;
    }
    memcpy(k->buf, ks.u + ks.start[t], kb);
    paramserver__table_update_request__init(&k->req);
    k->req.name = (char *)name;
    k->req.op = (Paramserver__TableOp)op;
    k->req.key_dtype = PS_DT_INT64;
    k->req.num_keys = kn;
    k->req.dtype = PS_DT_FLOAT;
    k->req.dim = dim;
    k->req.hparams = (double *)hparams;
    k->req.n_hparams = nhparams;
    k->req.step = step;
    tasks[nreq++] = t;
  }
  /* every key's gradient summed into its distinct key's row */
  for (int64_t i = 0; i < n; i++) {
    int64_t u = ks.from[i];
    size_t r = 0;
    while (u >= ks.start[tasks[r] + 1])
      r++;
    float *row = (float *)(void *)(ut[r].buf + (size_t)ut[r].n * sizeof(int64_t) +
                                   (size_t)(u - ks.start[tasks[r]]) * rowb);
    const float *src = g + (size_t)i * (size_t)dim;
    for (int64_t j = 0; j < dim; j++)
      row[j] += src[j];
  }
  for (size_t i = 0; i < nreq; i++) {
    table_update_out *k = &ut[i];
    size_t total = (size_t)k->n * (sizeof(int64_t) + rowb);
    if (total <= PS_RPC_INLINE_MAX) {
      k->req.inline_data.data = k->buf;
      k->req.inline_data.len = total;
    } else if (ps_rpc_segs_add(&k->segs, k->buf, total, NULL) != 0) {
      rc =
          ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableUpdate %s: out of memory", name);
      goto out;
    }
    ps_cl_req_init_(c, &reqs[i], tasks[i], M_TUPDATE, &k->req.base, true, true);
    reqs[i].send = &k->segs;
    ps_cl_answer_init_(c, tasks[i], &reqs[i], &k->ans, ps_cl_parse_table_update_, k,
                       name);
  }
  if ((rc = run_tasks(c, reqs, tasks, nreq, false, st)) != 0) goto out;
  if (counts) {
    memset(counts, 0, sizeof *counts);
    for (size_t i = 0; i < nreq; i++)
      counts->missing += ut[i].missing;
  }
out:
  for (size_t i = 0; ut && i < (size_t)nps; i++) {
    free(ut[i].buf);
    ps_rpc_segs_fini(&ut[i].segs);
  }
  free(ut);
  free(reqs);
  free(tasks);
  keyset_fini(&ks);
  return rc;
}

/* ---- TableList ---- */

static char *dup_str(const char *s) {
  return strdup(s ? s : "");
}

int ps_cl_parse_table_list_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                            ps_status *st) {
  table_list_out *o = user;
  ps_client_free_table_info(o->v, o->n);
  o->v = NULL;
  o->n = 0;
  if (ps_cl_wire_ok_(&paramserver__table_list_response__descriptor, M_TLIST, p, n, st))
    return st->code;
  Paramserver__TableListResponse *r =
      paramserver__table_list_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_TLIST, "the answer does not parse");
  int rc = 0;
  o->v = calloc(r->n_tables + 1, sizeof *o->v);
  if (o->v == NULL) rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; rc == 0 && i < r->n_tables; i++) {
    Paramserver__TableInfo *ti = r->tables[i];
    ps_table_info *d = &o->v[i];
    o->n = i + 1;
    d->name = dup_str(ti->name);
    d->optimizer = dup_str(ti->optimizer);
    if (d->name == NULL || d->optimizer == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    d->dim = ti->dim;
    d->rows = ti->rows;
    d->bytes = ti->bytes;
    d->evicted = ti->evicted;
    d->expired = ti->expired;
    d->refused = ti->refused;
    d->created = ti->created;
    if (ti->policy) {
      d->policy.min_count = ti->policy->min_count;
      d->policy.sketch_width = ti->policy->sketch_width;
      d->policy.sketch_depth = ti->policy->sketch_depth;
      d->policy.ttl_steps = ti->policy->ttl_steps;
      d->policy.ttl_seconds = ti->policy->ttl_seconds;
      d->policy.max_rows = ti->policy->max_rows;
      d->policy.evict =
          strcmp(ti->policy->evict, "lfu") == 0 ? PS_TABLE_EVICT_LFU : PS_TABLE_EVICT_LRU;
    }
  }
  paramserver__table_list_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_table_list(ps_client *c, int task, ps_table_info **out, size_t *n,
                         ps_status *st) {
  Paramserver__TableListRequest req = PARAMSERVER__TABLE_LIST_REQUEST__INIT;
  table_list_out o = {0};
  int rc = ps_cl_control_call_(c, task, M_TLIST, &req.base, true, ps_cl_parse_table_list_,
                               &o, st);
  if (rc != 0) {
    ps_client_free_table_info(o.v, o.n);
    return rc;
  }
  *out = o.v;
  *n = o.n;
  return 0;
}

void ps_client_free_table_info(ps_table_info *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].name);
    free(v[i].optimizer);
  }
  free(v);
}

/* ---- restore of one table ---- */

int ps_client_table_restore(ps_client *c, const char *name, const char *prefix,
                            const char *from, ps_status *st) {
  if (name == NULL || name[0] == '\0')
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Restore: no table name");
  const char *names[1] = {name}, *keys[1] = {from ? from : ""};
  int nps = c->nps;
  const char *const **pn = calloc((size_t)nps + 1, sizeof *pn);
  const char *const **pk = calloc((size_t)nps + 1, sizeof *pk);
  size_t *cnt = calloc((size_t)nps + 1, sizeof *cnt);
  char *checked = NULL;
  int rc =
      pn && pk && cnt ? 0 : ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (int t = 0; t < nps && rc == 0; t++) {
    pn[t] = names;
    pk[t] = keys;
    cnt[t] = 1;
  }
  /* every ps checks, all at once, the one checkpoint then restored ("the
   * latest" resolved once): one that would fail changes nothing anywhere */
  if (rc == 0) rc = ps_client_check_restore_all(c, prefix, pn, pk, cnt, &checked, st);
  for (int t = 0; t < nps && rc == 0; t++)
    rc = ps_cl_restore_vars_(c, t, checked ? checked : prefix, names, keys, 1, false,
                             NULL, st);
  free(checked);
  free(cnt);
  free(pk);
  free(pn);
  return rc;
}
