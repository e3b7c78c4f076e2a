/* The Read RPC: whole variables and row gathers, all as of one moment,
 * streamed out zero-copy.  See service.c for the rules every handler keeps. */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kernels.h"
#include "common/log.h"
#include "common/variable.h"
#include "common/wire.h"
#include "ps.pb-c.h"
#include "repl.h"
#include "service_internal.h"
#include "store.h"
#include "sync.h"

/* ---- Read (whole variables and gathers) ---- */

typedef struct read_item {
  ps_var *v;
  ps_buf *idx;
  size_t isize;
  int64_t nidx;
  bool gather;
} read_item;

/* Row id @k of gather @it (int32 or int64, checked in range). */
static int64_t gather_id(const read_item *it, int64_t k) {
  return it->isize == 4 ? ((const int32_t *)it->idx->data)[k]
                        : ((const int64_t *)it->idx->data)[k];
}

typedef struct read_ctx {
  read_item *items;
  size_t n;
} read_ctx;

static void read_free(ps_rpc_call *c) {
  read_ctx *x = ps_rpc_call_ctx(c);
  if (x == NULL) return;
  for (size_t i = 0; i < x->n; i++)
    ps_buf_unref(x->items[i].idx);
  free(x->items);
  free(x);
}

static int read_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__read_request__descriptor, "Read");
  Paramserver__ReadRequest *req = paramserver__read_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "Read");
  if ((uint64_t)req->n_items > (uint64_t)s->limits.max_read_names) {
    size_t ni = req->n_items;
    paramserver__read_request__free_unpacked(req, NULL);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "Read: %zu items, above the limit of %lld per call "
                         "(--max-read-names)",
                         ni, (long long)s->limits.max_read_names);
  }
  int rc = ps_svc_route_(s, req->route, "Read", st);
  int shard = ps_svc_route_shard_(s, req->route);
  if (rc != 0) {
    paramserver__read_request__free_unpacked(req, NULL);
    return rc;
  }
  read_ctx *x = calloc(1, sizeof *x);
  if (x == NULL || (x->items = calloc(req->n_items + 1, sizeof *x->items)) == NULL) {
    free(x);
    paramserver__read_request__free_unpacked(req, NULL);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  ps_rpc_call_set_ctx(c, x);
  x->n = req->n_items;
  ps_rpc_segs sink = {0};
  size_t staged = 0;
  for (size_t i = 0; i < x->n && rc == 0; i++) {
    Paramserver__ReadItem *ri = req->items[i];
    read_item *it = &x->items[i];
    if ((it->v = ps_svc_find_(s, shard, ri->name, st)) == NULL) {
      rc = st->code;
      break;
    }
    if (!ri->gather) continue;
    it->gather = true;
    if (ri->index_dtype != PS_DT_INT32 && ri->index_dtype != PS_DT_INT64) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Gather %s: indices must be int32 or int64, got %s", ri->name,
                         ps_dtype_name(ri->index_dtype));
      break;
    }
    if (ri->num_indices < 0) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "Gather %s: negative index count %lld",
                         ri->name, (long long)ri->num_indices);
      break;
    }
    if (ri->num_indices > s->limits.max_gather_rows) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "Gather %s: %lld rows, above the limit of %lld per gather "
                         "(--max-gather-rows)",
                         ri->name, (long long)ri->num_indices,
                         (long long)s->limits.max_gather_rows);
      break;
    }
    size_t ib;
    if ((rc = ps_svc_elems_bytes_(s, ri->index_dtype, ri->num_indices, "Gather", ri->name,
                                  &ib, st)) != 0 ||
        (rc = ps_svc_add_staged_(s, &staged, ib, "Read", st)) != 0)
      break;
    it->isize = ps_dtype_size(ri->index_dtype);
    it->nidx = ri->num_indices;
    it->idx = ps_buf_create(ib, false);
    if (it->idx == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Gather %s: out of memory", ri->name);
      break;
    }
    ps_rpc_segs_add(&sink, it->idx->data, it->idx->size, NULL);
  }
  if (rc == 0) ps_rpc_call_expect(c, &sink);
  ps_rpc_segs_fini(&sink);
  paramserver__read_request__free_unpacked(req, NULL);
  return rc;
}

static int read_data(ps_rpc_call *c, ps_status *st) {
  ps_service *s = ps_rpc_call_server_user(c);
  read_ctx *x = ps_rpc_call_ctx(c);
  ps_var **vars = malloc((x->n + 1) * sizeof *vars);
  Paramserver__TensorMeta *metas = calloc(x->n + 1, sizeof *metas);
  Paramserver__TensorMeta **mp = calloc(x->n + 1, sizeof *mp);
  int64_t *dims = calloc((x->n + 1) * PS_MAX_RANK, sizeof *dims);
  ps_buf **bufs = calloc(x->n + 1, sizeof *bufs);
  int rc = 0;
  if (!vars || !metas || !mp || !dims || !bufs) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < x->n; i++)
    vars[i] = x->items[i].v;
  size_t built = 0; /* bytes of the gathered tensors */
  /* All variables of one read are taken at one moment. */
  ps_store_lock_set(vars, x->n, false);
  for (size_t i = 0; i < x->n && rc == 0; i++) {
    read_item *it = &x->items[i];
    ps_var *v = it->v;
    Paramserver__TensorMeta *m = &metas[i];
    paramserver__tensor_meta__init(m);
    mp[i] = m;
    m->name = v->name;
    m->dtype = v->dtype;
    m->version = v->version;
    m->shape = dims + i * PS_MAX_RANK;
    if ((rc = ps_var_gone(s->store, v, st)) != 0) break;
    if (v->buf == NULL) {
      rc = ps_var_uninitialized(v->name, st);
      break;
    }
    if (!it->gather) {
      memcpy(m->shape, v->shape.dim, (size_t)v->shape.rank * sizeof *dims);
      m->n_shape = (size_t)v->shape.rank;
      bufs[i] = ps_buf_ref(v->buf);
      continue;
    }
    char a[256];
    if (v->shape.rank < 1) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "params must be at least 1-D, got shape %s\n\t "
                         "[[{{node %s/Gather}}]]",
                         ps_svc_fmt_shape_(&v->shape, a, sizeof a), v->name);
      break;
    }
    if ((rc = ps_svc_check_indices_(it->idx->data, it->isize, it->nidx, v->shape.dim[0],
                                    v->name, "Gather", st)) != 0)
      break;
    memcpy(m->shape, v->shape.dim, (size_t)v->shape.rank * sizeof *dims);
    m->shape[0] = it->nidx;
    m->n_shape = (size_t)v->shape.rank;
    size_t rb = v->shape.dim[0] ? v->buf->size / (size_t)v->shape.dim[0] : 0;
    ps_shape gs = v->shape;
    gs.dim[0] = it->nidx;
    size_t gb;
    if ((rc = ps_svc_tensor_bytes_(s, v->dtype, &gs, "Gather", v->name, &gb, st)) != 0 ||
        (rc = ps_svc_add_staged_(s, &built, gb, "Read", st)) != 0)
      break;
    bufs[i] = ps_buf_create(gb, false);
    if (bufs[i] == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Gather %s: out of memory", v->name);
      break;
    }
    const uint8_t *base = v->buf->data;
    for (int64_t k = 0; k < it->nidx; k++) {
      if (k + PS_ROW_AHEAD < it->nidx)
        ps_prefetch_row(base + (size_t)gather_id(it, k + PS_ROW_AHEAD) * rb, rb, false);
      memcpy((uint8_t *)bufs[i]->data + (size_t)k * rb,
             base + (size_t)gather_id(it, k) * rb, rb);
    }
  }
  ps_store_unlock_set(vars, x->n);
  if (rc == 0) {
    Paramserver__ReadResponse resp = PARAMSERVER__READ_RESPONSE__INIT;
    resp.tensors = mp;
    resp.n_tensors = x->n;
    if (s->repl) resp.epoch = ps_repl_epoch(s->repl);
    ps_rpc_call_reply(c, &resp.base);
    for (size_t i = 0; i < x->n; i++)
      ps_rpc_call_reply_data(c, bufs[i]->data, bufs[i]->size, bufs[i]);
  }
out:
  if (bufs)
    for (size_t i = 0; i < x->n; i++)
      ps_buf_unref(bufs[i]);
  free(bufs);
  free(dims);
  free(mp);
  free(metas);
  free(vars);
  return rc;
}

const ps_rpc_handler ps_svc_read_handlers[1] = {
    {"/paramserver.Ps/Read", read_header, read_data, read_free, NULL,
     PS_RPC_ACCESS_WORKER},
};
