/* Replication entries (ps/repl_internal.h): building a request's group
 * of effects while it holds its variables' locks, and copying entries for
 * each backup's FIFO.  A VALUE entry references the variable's buffer
 * (zero copy: a writer copies a referenced buffer before changing it). */
#include <stdlib.h>
#include <string.h>

#include "ps.pb-c.h"
#include "repl_internal.h"

static ps_repl_entry *group_push(ps_repl_group *g, int kind, int shard,
                                 const char *name) {
  if (g->oom) return NULL;
  if (g->n == g->cap) {
    size_t nc = g->cap ? g->cap * 2 : 8;
    ps_repl_entry *ne = realloc(g->e, nc * sizeof *ne);
    if (ne == NULL) {
      g->oom = true;
      return NULL;
    }
    g->e = ne;
    g->cap = nc;
  }
  ps_repl_entry *e = &g->e[g->n];
  memset(e, 0, sizeof *e);
  e->kind = kind;
  e->shard = shard;
  if (name && (e->name = strdup(name)) == NULL) {
    g->oom = true;
    return NULL;
  }
  g->n++;
  return e;
}

void ps_repl_add_value(ps_repl_group *g, const ps_var *v) {
  ps_repl_entry *e = group_push(g, PS_REPL_VALUE, v->shard, v->name);
  if (e == NULL) return;
  e->dtype = v->dtype;
  e->shape = v->shape;
  e->version = v->version;
  e->var_epoch = v->epoch;
  e->initialized = v->buf != NULL;
  if (v->buf) {
    e->val = ps_buf_ref(v->buf);
    e->bytes = (int64_t)v->buf->size;
  }
}

void ps_repl_add_rows(ps_repl_group *g, const ps_var *v, int64_t base_version,
                      ps_buf *idx, int index_dtype, int64_t nidx) {
  size_t es = ps_dtype_size(v->dtype), isz = ps_dtype_size(index_dtype);
  int64_t row = 1;
  for (int d = 1; d < v->shape.rank; d++)
    row *= v->shape.dim[d];
  size_t rb = (size_t)row * es;
  ps_buf *rows = ps_buf_create(rb * (size_t)nidx, false);
  if (rows == NULL) {
    g->oom = true;
    return;
  }
  for (int64_t k = 0; k < nidx; k++) {
    int64_t i =
        isz == 4 ? ((const int32_t *)idx->data)[k] : ((const int64_t *)idx->data)[k];
    memcpy((uint8_t *)rows->data + (size_t)k * rb,
           (const uint8_t *)v->buf->data + (size_t)i * rb, rb);
  }
  ps_repl_entry *e = group_push(g, PS_REPL_ROWS, v->shard, v->name);
  if (e == NULL) {
    ps_buf_unref(rows);
    return;
  }
  e->dtype = v->dtype;
  e->shape = v->shape;
  e->version = v->version;
  e->var_epoch = v->epoch;
  e->base_version = base_version;
  e->val = rows;
  e->idx = ps_buf_ref(idx);
  e->index_dtype = index_dtype;
  e->num_indices = nidx;
  e->bytes = (int64_t)(rows->size + idx->size);
}

static const char *fan_name(int m) {
  return m == PS_FAN_OUT ? "fan_out" : m == PS_FAN_AVG ? "fan_avg" : "fan_in";
}

static const char *dist_name(int d) {
  return d == PS_DIST_UNTRUNCATED_NORMAL ? "untruncated_normal"
         : d == PS_DIST_UNIFORM          ? "uniform"
                                         : "truncated_normal";
}

void ps_repl_add_create(ps_repl_group *g, const ps_var *v) {
  Paramserver__VariableSpec spec = PARAMSERVER__VARIABLE_SPEC__INIT;
  Paramserver__Initializer in = PARAMSERVER__INITIALIZER__INIT;
  spec.name = v->name;
  spec.dtype = v->dtype;
  spec.shape = (int64_t *)v->shape.dim;
  spec.n_shape = (size_t)v->shape.rank;
  if (v->has_init) {
    in.type = (char *)ps_init_type_name(v->init.type);
    in.value = v->init.value;
    in.values = (double *)v->init.values;
    in.n_values = v->init.nvalues;
    in.minval = v->init.minval;
    in.maxval = v->init.maxval;
    in.mean = v->init.mean;
    in.stddev = v->init.stddev;
    in.scale = v->init.scale;
    in.mode = (char *)fan_name(v->init.mode);
    in.distribution = (char *)dist_name(v->init.distribution);
    in.seed = v->init.seed;
    in.full_name = v->init_full_name ? v->init_full_name : "";
    in.full_shape = (int64_t *)v->init_full_shape.dim;
    in.n_full_shape = (size_t)v->init_full_shape.rank;
    in.offset = v->init_offset;
    spec.initializer = &in;
  }
  size_t len = paramserver__variable_spec__get_packed_size(&spec);
  uint8_t *p = malloc(len + 1);
  if (p == NULL) {
    g->oom = true;
    return;
  }
  paramserver__variable_spec__pack(&spec, p);
  ps_repl_entry *e = group_push(g, PS_REPL_CREATE, v->shard, v->name);
  if (e == NULL) {
    free(p);
    return;
  }
  e->spec = p;
  e->spec_len = len;
}

void ps_repl_add_delete(ps_repl_group *g, int shard, const char *name) {
  group_push(g, PS_REPL_DELETE, shard, name);
}

void ps_repl_add_dedup(ps_repl_group *g, int shard, uint64_t cid, uint64_t seq) {
  ps_repl_entry *e = group_push(g, PS_REPL_DEDUP, shard, NULL);
  if (e) e->client_id = cid, e->seq = seq;
}

void ps_repl_entry_fini(ps_repl_entry *e) {
  free(e->name);
  free(e->spec);
  ps_buf_unref(e->val);
  ps_buf_unref(e->idx);
  ps_repl_stage_unref(e->stage);
}

void ps_repl_group_fini(ps_repl_group *g) {
  for (size_t i = 0; i < g->n; i++)
    ps_repl_entry_fini(&g->e[i]);
  free(g->e);
  memset(g, 0, sizeof *g);
}

ps_repl_entry *ps_repl_entry_clone(const ps_repl_entry *e) {
  ps_repl_entry *c = malloc(sizeof *c);
  if (c == NULL) return NULL;
  *c = *e;
  c->next = NULL;
  c->wait = NULL;
  c->stage = NULL;
  c->name = NULL;
  c->spec = NULL;
  if ((e->name && (c->name = strdup(e->name)) == NULL) ||
      (e->spec && (c->spec = malloc(e->spec_len + 1)) == NULL)) {
    free(c->name);
    free(c);
    return NULL;
  }
  if (e->spec) memcpy(c->spec, e->spec, e->spec_len);
  c->val = e->val ? ps_buf_ref(e->val) : NULL;
  c->idx = e->idx ? ps_buf_ref(e->idx) : NULL;
  return c;
}

void ps_repl_entry_free(ps_repl_entry *e) {
  if (e == NULL) return;
  ps_repl_entry_fini(e);
  free(e);
}
