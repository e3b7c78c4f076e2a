/* MetaGraph export (paramserver/saver.h): walks the graph into
 * proto/meta.proto's messages (names stand for pointers), with the
 * Saver's definition and a checksum at the end (see proto/meta.proto). */
#include <stdlib.h>
#include <string.h>

#include "common/array.h"
#include "common/crc32c.h"
#include "common/fileio.h"
#include "common/variable.h"
#include "meta.pb-c.h"
#include "paramserver/partition.h"
#include "saver_internal.h"

/* Every allocation of one export, freed together. */
typedef struct arena {
  void **p;
  size_t n, cap;
  bool failed;
} arena;

static void *arena_alloc(arena *a, size_t size) {
  if (ps_array_grow(&a->p, &a->cap, a->n + 1, sizeof *a->p) != 0) {
    a->failed = true;
    return NULL;
  }
  void *x = calloc(1, size ? size : 1);
  if (x == NULL) {
    a->failed = true;
    return NULL;
  }
  a->p[a->n++] = x;
  return x;
}

static void arena_free(arena *a) {
  for (size_t i = 0; i < a->n; i++)
    free(a->p[i]);
  free(a->p);
}

#define ARENA_ARRAY(a, T, n) ((T *)arena_alloc((a), ((n) + 1) * sizeof(T)))

static Paramserver__Meta__Shape *shape_out(arena *a, const ps_shape *s) {
  Paramserver__Meta__Shape *m = arena_alloc(a, sizeof *m);
  if (m == NULL) return NULL;
  paramserver__meta__shape__init(m);
  m->rank = s->rank;
  if (s->rank > 0) {
    m->dim = ARENA_ARRAY(a, int64_t, (size_t)s->rank);
    if (m->dim == NULL) return NULL;
    m->n_dim = (size_t)s->rank;
    memcpy(m->dim, s->dim, (size_t)s->rank * sizeof *m->dim);
  }
  return m;
}

static char *name_of(const ps_node *n) {
  return n ? n->name : (char *)"";
}

bool ps_meta_is_part_op_(const ps_node *n) {
  for (int i = 0; ps_opdefs_partition_[i]; i++)
    if (n->def == ps_opdefs_partition_[i]) return true;
  return false;
}

static Paramserver__Meta__NodeDef *node_out(arena *a, const ps_node *n) {
  Paramserver__Meta__NodeDef *m = arena_alloc(a, sizeof *m);
  if (m == NULL) return NULL;
  paramserver__meta__node_def__init(m);
  m->name = n->name;
  m->op = (char *)n->def->type;
  m->kind = n->def->kind;
  m->input = ARENA_ARRAY(a, char *, (size_t)n->nin);
  m->control_input = ARENA_ARRAY(a, char *, (size_t)n->nctrl);
  if (m->input == NULL || m->control_input == NULL) return NULL;
  for (int i = 0; i < n->nin; i++)
    m->input[m->n_input++] = n->in[i]->name;
  for (int i = 0; i < n->nctrl; i++)
    m->control_input[m->n_control_input++] = n->ctrl[i]->name;
  m->dtype = n->dtype;
  m->shape = shape_out(a, &n->shape);
  m->device = (char *)n->device;
  m->int_attr = (int64_t *)n->ia;
  m->n_int_attr = 4;
  m->float_attr = (double *)n->fa;
  m->n_float_attr = 4;
  if (n->value) {
    Paramserver__Meta__TensorValue *v = arena_alloc(a, sizeof *v);
    if (v == NULL) return NULL;
    paramserver__meta__tensor_value__init(v);
    v->dtype = n->value->dtype;
    v->shape = shape_out(a, &n->value->shape);
    v->data.data = ps_tensor_data(n->value);
    v->data.len = ps_tensor_nbytes(n->value);
    m->value = v;
  }
  m->variable = n->var ? n->var->name : (char *)"";
  m->update_op = n->update_op;
  m->sparse_indices = name_of(n->sparse_indices);
  if (n->sparse_indices) m->sparse_dense_shape = shape_out(a, &n->sparse_dense_shape);
  if (n->extra == NULL) return m;
  if (n->def->kind == PS_OPK_LOCAL && !strcmp(n->def->type, "Reshape")) {
    m->reshape_to = shape_out(a, n->extra);
  } else if (n->def->kind == PS_OPK_VAR_UPDATE) {
    const ps_apply_extra *e = n->extra;
    Paramserver__Meta__ApplyExtra *x = arena_alloc(a, sizeof *x);
    if (x == NULL) return NULL;
    paramserver__meta__apply_extra__init(x);
    x->slot = ARENA_ARRAY(a, char *, e->nslots);
    if (x->slot == NULL) return NULL;
    for (size_t i = 0; i < e->nslots; i++)
      x->slot[x->n_slot++] = (char *)e->slots[i];
    x->hparam = (double *)e->hparams;
    x->n_hparam = e->nhparams;
    x->ndynamic = (int32_t)e->ndynamic;
    x->use_nesterov = e->use_nesterov;
    x->sync_replicas = e->sync_replicas_to_aggregate;
    x->sync_total = e->sync_total_num_replicas;
    m->apply = x;
  } else if (ps_meta_is_part_op_(n)) {
    Paramserver__Meta__PartExtra *x = arena_alloc(a, sizeof *x);
    if (x == NULL) return NULL;
    paramserver__meta__part_extra__init(x);
    const ps_part_info *pi = n->extra;
    x->part = pi->p;
    x->nparts = pi->nparts;
    x->strategy = pi->strategy;
    x->total = pi->total;
    if (!strcmp(n->def->type, "DynamicStitch")) {
      const ps_stitch_info *si = n->extra;
      x->positions = ARENA_ARRAY(a, char *, (size_t)pi->nparts);
      if (x->positions == NULL) return NULL;
      for (int i = 0; i < pi->nparts; i++)
        x->positions[x->n_positions++] = si->positions[i]->name;
    }
    m->part = x;
  } else if (n->def->kind == PS_OPK_REPORT_UNINIT) {
    const ps_report_extra *e = n->extra;
    m->report_variable = ARENA_ARRAY(a, char *, e->n);
    if (m->report_variable == NULL) return NULL;
    for (size_t i = 0; i < e->n; i++)
      m->report_variable[m->n_report_variable++] = e->vars[i]->name;
  }
  return m;
}

static Paramserver__Meta__VariableDef *var_out(arena *a, const ps_variable *v) {
  Paramserver__Meta__VariableDef *m = arena_alloc(a, sizeof *m);
  Paramserver__Meta__InitSpec *i = arena_alloc(a, sizeof *i);
  if (m == NULL || i == NULL) return NULL;
  paramserver__meta__variable_def__init(m);
  paramserver__meta__init_spec__init(i);
  m->name = v->name;
  m->dtype = v->dtype;
  m->shape = shape_out(a, &v->shape);
  m->trainable = v->trainable;
  m->local = v->local;
  m->device = (char *)v->device;
  m->task = v->task;
  m->has_init = v->has_init;
  i->type = (int32_t)v->init.type;
  i->value = v->init.value;
  i->values = (double *)v->init.values;
  i->n_values = v->init.values ? v->init.nvalues : 0;
  i->minval = v->init.minval;
  i->maxval = v->init.maxval;
  i->mean = v->init.mean;
  i->stddev = v->init.stddev;
  i->scale = v->init.scale;
  i->mode = (int32_t)v->init.mode;
  i->distribution = (int32_t)v->init.distribution;
  i->seed = v->init.seed;
  m->init = i;
  m->from_get_variable = v->from_get_variable;
  m->initial_value = name_of(v->initial_value);
  m->node = name_of(v->node);
  m->read = name_of(v->read);
  m->initializer = name_of(v->initializer);
  m->full_name = v->full_name ? v->full_name : (char *)"";
  if (v->full_name) m->full_shape = shape_out(a, &v->full_shape);
  m->offset = v->offset;
  m->primary = v->primary ? v->primary->name : (char *)"";
  return m;
}

uint8_t *ps_meta_graph_serialize(ps_graph *g, const ps_saver *saver, size_t *len,
                                 ps_status *st) {
  arena a = {0};
  Paramserver__Meta__MetaGraphDef m = PARAMSERVER__META__META_GRAPH_DEF__INIT;
  Paramserver__Meta__SaverDef sd = PARAMSERVER__META__SAVER_DEF__INIT;
  uint8_t *out = NULL;
  m.format = (char *)META_FORMAT;
  size_t nnodes = ps_graph_num_nodes(g), nvars = ps_graph_num_vars_(g),
         npvars = ps_graph_num_partitioned_(g), ncoll = ps_graph_num_collections_(g);
  m.node = ARENA_ARRAY(&a, Paramserver__Meta__NodeDef *, nnodes);
  m.variable = ARENA_ARRAY(&a, Paramserver__Meta__VariableDef *, nvars);
  m.partitioned = ARENA_ARRAY(&a, Paramserver__Meta__PartitionedVariableDef *, npvars);
  m.collection = ARENA_ARRAY(&a, Paramserver__Meta__CollectionDef *, 2 * ncoll);
  if (a.failed) goto oom;
  for (size_t i = 0; i < nnodes; i++)
    if ((m.node[m.n_node++] = node_out(&a, ps_graph_node(g, i))) == NULL) goto oom;
  for (size_t i = 0; i < nvars; i++)
    if ((m.variable[m.n_variable++] = var_out(&a, ps_graph_var_(g, i))) == NULL) goto oom;
  for (size_t i = 0; i < npvars; i++) {
    const ps_partitioned_variable *pv = ps_graph_partitioned_(g, i);
    Paramserver__Meta__PartitionedVariableDef *d = arena_alloc(&a, sizeof *d);
    if (d == NULL) goto oom;
    paramserver__meta__partitioned_variable_def__init(d);
    d->name = pv->name;
    d->dtype = pv->dtype;
    d->shape = shape_out(&a, &pv->shape);
    d->part = ARENA_ARRAY(&a, char *, (size_t)pv->n);
    if (d->part == NULL) goto oom;
    for (int k = 0; k < pv->n; k++)
      d->part[d->n_part++] = pv->parts[k]->name;
    m.partitioned[m.n_partitioned++] = d;
  }
  for (size_t i = 0; i < ncoll; i++) {
    ps_variable *const *vars;
    ps_node *const *nodes;
    size_t nv, nn;
    const char *key = ps_graph_collection_(g, i, &vars, &nv, &nodes, &nn);
    /* a collection of both kinds is two CollectionDefs of one key; an empty
     * one is one CollectionDef of nodes */
    for (int is_var = 1; is_var >= 0; is_var--) {
      size_t nitems = is_var ? nv : nn;
      if (nitems == 0 && (is_var || nv > 0)) continue;
      Paramserver__Meta__CollectionDef *d = arena_alloc(&a, sizeof *d);
      if (d == NULL) goto oom;
      paramserver__meta__collection_def__init(d);
      d->key = (char *)key;
      d->is_variable = is_var;
      d->item = ARENA_ARRAY(&a, char *, nitems);
      if (d->item == NULL) goto oom;
      for (size_t k = 0; k < nitems; k++)
        d->item[d->n_item++] = is_var ? vars[k]->name : nodes[k]->name;
      m.collection[m.n_collection++] = d;
    }
  }
  if (saver) {
    m.has_saver = true;
    sd.max_to_keep = saver->max_to_keep;
    sd.keep_checkpoint_every_n_hours = saver->keep_hours;
    if (!saver->all) {
      sd.variable = saver->vars;
      sd.n_variable = saver->n;
      sd.key = ARENA_ARRAY(&a, char *, saver->n);
      if (sd.key == NULL) goto oom;
      bool any = false;
      for (size_t i = 0; i < saver->n; i++) {
        sd.key[i] = saver->keys[i] ? saver->keys[i] : saver->vars[i];
        any |= saver->keys[i] != NULL;
      }
      sd.n_key = any ? saver->n : 0;
    }
    m.saver = &sd;
  }
  if (a.failed) goto oom;
  /* checksum 0 is not packed (proto3); the field goes last, by hand */
  size_t body = paramserver__meta__meta_graph_def__get_packed_size(&m);
  *len = body + 5;
  out = malloc(*len);
  if (out == NULL) goto oom;
  paramserver__meta__meta_graph_def__pack(&m, out);
  uint32_t crc = ps_crc32c_mask(ps_crc32c(out, body));
  out[body] = META_CHECKSUM_TAG;
  for (int i = 0; i < 4; i++)
    out[body + 1 + (size_t)i] = (uint8_t)(crc >> (8 * i));
  arena_free(&a);
  return out;
oom:
  arena_free(&a);
  ps_status_set(st, PS_RESOURCE_EXHAUSTED, "MetaGraph export: out of memory");
  return NULL;
}

int ps_export_meta_graph(ps_graph *g, const ps_saver *saver, const char *path,
                         ps_status *st) {
  size_t len = 0;
  uint8_t *buf = ps_meta_graph_serialize(g, saver, &len, st);
  if (buf == NULL) return st->code;
  const char *op = NULL;
  char *tmp = NULL;
  int rc = 0, e = ps_replace_file(path, NULL, buf, len, &op, &tmp);
  if (e != 0)
    rc = ps_status_set(st, ps_status_code_from_errno(e), "MetaGraph %s: %s %s: %s", path,
                       op, tmp ? tmp : path, strerror(e));
  free(tmp);
  free(buf);
  return rc;
}
