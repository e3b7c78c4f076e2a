/* The embedding tables' RPCs: TableCreate, TableLookup, TableUpdate and
 * TableList (proto/ps.proto, ps/embed.h).  Every size a request names is
 * held to the ps's limits before anything is allocated: keys per call to
 * --max-gather-rows, keys and rows to --max-tensor-bytes.  A call that
 * fails has changed nothing, except a lookup that ran out of memory
 * after making some rows (each made row is a valid row). */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/wire.h"
#include "embed.h"
#include "ps.pb-c.h"
#include "service_internal.h"
#include "store.h"

static int no_data(ps_rpc_call *c, ps_status *st) {
  return 0;
}

static int tables_here(ps_service *s, const char *method, const char *name,
                       ps_status *st) {
  if (s->repl == NULL) return 0;
  return ps_status_set(st, PS_UNIMPLEMENTED,
                       "%s %s: embedding tables are not replicated yet; run the ps "
                       "without --replicas",
                       method, name);
}

/* ---- TableCreate ---- */

static int spec_from_proto(const Paramserver__TableSpec *p, ps_embed_spec *out,
                           ps_status *st) {
  memset(out, 0, sizeof *out);
  out->name = p->name;
  out->dtype = p->dtype;
  out->dim = p->dim;
  if (p->initializer == NULL) {
    ps_init_spec_default(&out->init, PS_INIT_ZEROS);
  } else if (ps_svc_init_from_proto_(p->initializer, p->name, p->dtype, &out->init, st) !=
             0) {
    return st->code;
  }
  int o = ps_embed_optimizer_from_name(p->optimizer);
  if (o < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TableCreate %s: unknown optimizer '%s' (sgd, adagrad, adam, "
                         "ftrl)",
                         p->name, p->optimizer);
  out->optimizer = (ps_embed_optimizer)o;
  out->slot_init = p->slot_init;
  if (p->policy) {
    const Paramserver__TablePolicy *q = p->policy;
    int e = ps_embed_evict_from_name(q->evict);
    if (e < 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "TableCreate %s: unknown evict policy '%s' (lru, lfu)",
                           p->name, q->evict);
    out->policy = (ps_embed_policy){.min_count = q->min_count,
                                    .sketch_width = q->sketch_width,
                                    .sketch_depth = q->sketch_depth,
                                    .ttl_steps = q->ttl_steps,
                                    .ttl_seconds = q->ttl_seconds,
                                    .max_rows = q->max_rows,
                                    .evict = (ps_embed_evict)e};
  }
  return 0;
}

static int create_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  int rc = ps_wire_check_strings(&paramserver__table_create_request__descriptor, p, n,
                                 "TableCreate", st);
  if (rc != 0) return rc;
  Paramserver__TableCreateRequest *req =
      paramserver__table_create_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "TableCreate");
  ps_embed_spec spec;
  bool created = false;
  if (req->spec == NULL)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "TableCreate: the request has no spec");
  if (rc == 0) rc = tables_here(s, "TableCreate", req->spec->name, st);
  if (rc == 0) rc = ps_svc_route_(s, req->route, "TableCreate", st);
  if (rc == 0) rc = spec_from_proto(req->spec, &spec, st);
  if (rc == 0) rc = ps_embed_check_spec(&spec, st);
  if (rc == 0 && ps_embed_sketch_bytes(&spec) > s->limits.max_tensor_bytes)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                       "TableCreate %s: admission's sketch takes %lld bytes, above the "
                       "limit of %lld bytes (--max-tensor-bytes)",
                       spec.name, (long long)ps_embed_sketch_bytes(&spec),
                       (long long)s->limits.max_tensor_bytes);
  if (rc == 0) rc = ps_embed_create(s->tables, &spec, &created, st);
  if (rc == 0) {
    Paramserver__TableCreateResponse resp = PARAMSERVER__TABLE_CREATE_RESPONSE__INIT;
    resp.created = created;
    ps_rpc_call_reply(c, &resp.base);
  }
  paramserver__table_create_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- TableLookup and TableUpdate ---- */

typedef struct table_call {
  ps_embed_table *t;
  ps_buf *keys, *grads;
  int64_t n;
  int64_t step;
  bool train;
  ps_embed_op op;
  double hp[6];
} table_call;

static void call_free(ps_rpc_call *c) {
  table_call *x = ps_rpc_call_ctx(c);
  if (x == NULL) return;
  ps_embed_unref(x->t);
  ps_buf_unref(x->keys);
  ps_buf_unref(x->grads);
  free(x);
}

/* The checks both calls make of their table and keys, and the keys'
 * buffer added to @sink. */
static int keys_in(ps_service *s, ps_rpc_call *c, const char *method, const char *name,
                   int key_dtype, int64_t num_keys, ps_rpc_segs *sink, size_t *staged,
                   ps_status *st) {
  table_call *x = calloc(1, sizeof *x);
  if (x == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  ps_rpc_call_set_ctx(c, x);
  if ((x->t = ps_embed_find(s->tables, name, st)) == NULL) return st->code;
  if (key_dtype != PS_DT_INT64)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: keys must be int64, got %s",
                         method, name, ps_dtype_name(key_dtype));
  if (num_keys < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: negative key count %lld",
                         method, name, (long long)num_keys);
  if (num_keys > s->limits.max_gather_rows)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "%s %s: %lld keys, above the limit of %lld per call "
                         "(--max-gather-rows)",
                         method, name, (long long)num_keys,
                         (long long)s->limits.max_gather_rows);
  size_t kb, rb;
  ps_shape rows = {.rank = 2, .dim = {num_keys, ps_embed_table_spec(x->t)->dim}};
  int rc;
  if ((rc = ps_svc_elems_bytes_(s, PS_DT_INT64, num_keys, method, name, &kb, st)) != 0 ||
      (rc = ps_svc_add_staged_(s, staged, kb, method, st)) != 0 ||
      (rc = ps_svc_tensor_bytes_(s, PS_DT_FLOAT, &rows, method, name, &rb, st)) != 0 ||
      (rc = ps_svc_add_staged_(s, staged, rb, method, st)) != 0)
    return rc;
  x->n = num_keys;
  if ((x->keys = ps_buf_create(kb, false)) == NULL ||
      ps_rpc_segs_add(sink, x->keys->data, kb, NULL) != 0)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "%s %s: out of memory", method, name);
  return 0;
}

static int lookup_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  int rc = ps_wire_check_strings(&paramserver__table_lookup_request__descriptor, p, n,
                                 "TableLookup", st);
  if (rc != 0) return rc;
  Paramserver__TableLookupRequest *req =
      paramserver__table_lookup_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "TableLookup");
  ps_rpc_segs sink = {0};
  size_t staged = 0;
  rc = ps_svc_route_(s, req->route, "TableLookup", st);
  if (rc == 0)
    rc = keys_in(s, c, "TableLookup", req->name, req->key_dtype, req->num_keys, &sink,
                 &staged, st);
  if (rc == 0) {
    table_call *x = ps_rpc_call_ctx(c);
    x->train = req->train;
    x->step = req->step;
  }
  rc = ps_svc_expect_(c, rc, &req->inline_data, &sink, "TableLookup", "keys", st);
  paramserver__table_lookup_request__free_unpacked(req, NULL);
  return rc;
}

static int lookup_run(ps_rpc_call *c, ps_status *st) {
  table_call *x = ps_rpc_call_ctx(c);
  int64_t dim = ps_embed_table_spec(x->t)->dim;
  ps_buf *rows = ps_buf_create((size_t)x->n * (size_t)dim * sizeof(float), false);
  if (rows == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableLookup %s: out of memory",
                         ps_embed_table_spec(x->t)->name);
  ps_embed_counts cnt;
  int rc = ps_embed_lookup(x->t, x->keys->data, (size_t)x->n, x->train, x->step,
                           rows->data, &cnt, st);
  if (rc == 0) {
    Paramserver__TableLookupResponse resp = PARAMSERVER__TABLE_LOOKUP_RESPONSE__INIT;
    resp.num_keys = x->n;
    resp.dim = dim;
    resp.dtype = PS_DT_FLOAT;
    resp.created = cnt.created;
    resp.missing = cnt.missing;
    ps_rpc_call_reply(c, &resp.base);
    ps_rpc_call_reply_data(c, rows->data, rows->size, rows);
  }
  ps_buf_unref(rows);
  return rc;
}

/* The hyperparameters of @op, checked as TensorFlow's kernels check them. */
static int hparams_ok(const Paramserver__TableUpdateRequest *r, ps_embed_op op,
                      ps_status *st) {
  size_t want = ps_embed_op_hparams(op);
  if (r->n_hparams != want)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "TableUpdate %s: %s takes %zu hparams, got %zu", r->name,
                         ps_embed_op_name(op), want, r->n_hparams);
  for (size_t i = 0; i < want; i++)
    if (!isfinite(r->hparams[i]))
      return ps_status_set(st, PS_INVALID_ARGUMENT, "TableUpdate %s: %s hparam %zu is %g",
                           r->name, ps_embed_op_name(op), i, r->hparams[i]);
  if (op == PS_EMBED_FTRL) {
    const double *h = r->hparams;
    if (h[0] <= 0 || h[1] < 0 || h[2] < 0 || h[3] > 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "TableUpdate %s: ApplyFtrl needs lr > 0, l1 >= 0, l2 >= 0 and "
                           "lr_power <= 0; got %g, %g, %g, %g",
                           r->name, h[0], h[1], h[2], h[3]);
  }
  return 0;
}

static int update_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  int rc = ps_wire_check_strings(&paramserver__table_update_request__descriptor, p, n,
                                 "TableUpdate", st);
  if (rc != 0) return rc;
  Paramserver__TableUpdateRequest *req =
      paramserver__table_update_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "TableUpdate");
  ps_rpc_segs sink = {0};
  size_t staged = 0;
  ps_embed_op op = (ps_embed_op)req->op;
  rc = ps_svc_route_(s, req->route, "TableUpdate", st);
  if (rc == 0)
    rc = keys_in(s, c, "TableUpdate", req->name, req->key_dtype, req->num_keys, &sink,
                 &staged, st);
  table_call *x = ps_rpc_call_ctx(c);
  if (rc == 0 && (unsigned)op >= PS_EMBED_NUM_OPS)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "TableUpdate %s: unknown op %d",
                       req->name, (int)op);
  if (rc == 0 && req->dtype != PS_DT_FLOAT)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                       "TableUpdate %s: gradients must be float, got %s", req->name,
                       ps_dtype_name(req->dtype));
  int64_t dim = rc == 0 ? ps_embed_table_spec(x->t)->dim : 0;
  if (rc == 0 && req->dim != dim)
    rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                       "TableUpdate %s: gradient rows have dim %lld, the table's dim is "
                       "%lld",
                       req->name, (long long)req->dim, (long long)dim);
  if (rc == 0) rc = hparams_ok(req, op, st);
  if (rc == 0) {
    x->op = op;
    x->step = req->step;
    if (req->n_hparams)
      memcpy(x->hp, req->hparams, req->n_hparams * sizeof *req->hparams);
    size_t gb = (size_t)x->n * (size_t)dim * sizeof(float); /* checked in keys_in */
    if ((x->grads = ps_buf_create(gb, false)) == NULL ||
        ps_rpc_segs_add(&sink, x->grads->data, gb, NULL) != 0)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "TableUpdate %s: out of memory",
                         req->name);
  }
  rc =
      ps_svc_expect_(c, rc, &req->inline_data, &sink, "TableUpdate", "keys and rows", st);
  paramserver__table_update_request__free_unpacked(req, NULL);
  return rc;
}

static int update_run(ps_rpc_call *c, ps_status *st) {
  table_call *x = ps_rpc_call_ctx(c);
  ps_embed_counts cnt;
  int rc = ps_embed_update(x->t, x->op, x->keys->data, (size_t)x->n, x->grads->data,
                           x->hp, x->step, &cnt, st);
  if (rc == 0) {
    Paramserver__TableUpdateResponse resp = PARAMSERVER__TABLE_UPDATE_RESPONSE__INIT;
    resp.applied = x->n - cnt.missing;
    resp.missing = cnt.missing;
    ps_rpc_call_reply(c, &resp.base);
  }
  return rc;
}

/* Training lookups and updates change the table: like Update they pass
 * the store's gate, so a cluster save sees every table and variable as
 * of one moment; while a snapshot holds the gate closed they wait
 * (parked, not holding an RPC thread). */
static void table_deferred(void *arg) {
  ps_rpc_call *c = arg;
  ps_service *s = ps_rpc_call_server_user(c);
  table_call *x = ps_rpc_call_ctx(c);
  const char *m = x->grads ? "TableUpdate" : "TableLookup";
  ps_status st;
  ps_status_clear(&st);
  int rc;
  if (atomic_load(&s->sync_closed))
    rc = ps_status_set(&st, PS_UNAVAILABLE,
                       "%s is shutting down: the %s waited for a snapshot and was not "
                       "applied",
                       s->task, m);
  else if (ps_rpc_call_expired(c))
    rc = ps_status_set(&st, PS_DEADLINE_EXCEEDED,
                       "%s: the deadline passed while the call waited for a snapshot on "
                       "%s; not applied",
                       m, s->task);
  else
    rc = x->grads ? update_run(c, &st) : lookup_run(c, &st);
  ps_store_update_leave(s->store);
  ps_rpc_call_resume(c, rc, &st);
}

static int gated(ps_rpc_call *c, int (*run)(ps_rpc_call *, ps_status *), ps_status *st) {
  ps_service *s = ps_rpc_call_server_user(c);
  table_call *x = ps_rpc_call_ctx(c);
  bool parked;
  int64_t held = (int64_t)x->keys->size + (x->grads ? (int64_t)x->grads->size : 0);
  int rc = ps_store_update_admit(s->store, table_deferred, c, held, &parked, st);
  if (rc != 0) return rc;
  if (parked) return PS_RPC_PENDING;
  rc = run(c, st);
  ps_store_update_leave(s->store);
  return rc;
}

static int lookup_data(ps_rpc_call *c, ps_status *st) {
  table_call *x = ps_rpc_call_ctx(c);
  return x->train ? gated(c, lookup_run, st) : lookup_run(c, st);
}

static int update_data(ps_rpc_call *c, ps_status *st) {
  return gated(c, update_run, st);
}

/* ---- TableList ---- */

static int list_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  Paramserver__TableListRequest *req =
      paramserver__table_list_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "TableList");
  int rc = ps_svc_route_(s, req->route, "TableList", st);
  paramserver__table_list_request__free_unpacked(req, NULL);
  if (rc != 0) return rc;
  size_t nt = 0;
  ps_embed_stats *v = ps_embed_list(s->tables, &nt);
  Paramserver__TableInfo *infos = calloc(nt + 1, sizeof *infos);
  Paramserver__TableInfo **ptrs = calloc(nt + 1, sizeof *ptrs);
  Paramserver__TablePolicy *pols = calloc(nt + 1, sizeof *pols);
  if (!infos || !ptrs || !pols) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < nt; i++) {
    Paramserver__TableInfo *ti = &infos[i];
    paramserver__table_info__init(ti);
    paramserver__table_policy__init(&pols[i]);
    ti->name = v[i].name;
    ti->dtype = PS_DT_FLOAT;
    ti->dim = v[i].dim;
    ti->optimizer = (char *)ps_embed_optimizer_name(v[i].optimizer);
    ti->rows = v[i].rows;
    ti->bytes = v[i].bytes;
    ti->evicted = v[i].evicted_total;
    ti->expired = v[i].expired_total;
    ti->refused = v[i].refused_total;
    ti->created = v[i].created_total;
    const ps_embed_policy *q = &v[i].policy;
    pols[i].min_count = q->min_count;
    pols[i].sketch_width = q->sketch_width;
    pols[i].sketch_depth = q->sketch_depth;
    pols[i].ttl_steps = q->ttl_steps;
    pols[i].ttl_seconds = q->ttl_seconds;
    pols[i].max_rows = q->max_rows;
    pols[i].evict = (char *)ps_embed_evict_name(q->evict);
    ti->policy = &pols[i];
    ptrs[i] = ti;
  }
  Paramserver__TableListResponse resp = PARAMSERVER__TABLE_LIST_RESPONSE__INIT;
  resp.tables = ptrs;
  resp.n_tables = nt;
  ps_rpc_call_reply(c, &resp.base);
out:
  free(pols);
  free(ptrs);
  free(infos);
  free(v);
  return rc;
}

const ps_rpc_handler ps_svc_embed_handlers[4] = {
    {"/paramserver.Ps/TableCreate", create_header, no_data, NULL, NULL,
     PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/TableLookup", lookup_header, lookup_data, call_free, NULL,
     PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/TableUpdate", update_header, update_data, call_free, NULL,
     PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/TableList", list_header, no_data, NULL, NULL, PS_RPC_ACCESS_WORKER},
};
