/* MetaGraph import (paramserver/saver.h): rebuilds the structs the
 * constructors would have made, node by node, with the op definitions
 * found by type and kind in the per-file registries (ps_opdefs_*_).
 * Everything read is validated before use: a reference to a missing node,
 * an op this build doesn't know, a bad dtype or shape, or extras that
 * don't fit their op name the file and the fault. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/fileio.h"
#include "common/variable.h"
#include "meta.pb-c.h"
#include "paramserver/partition.h"
#include "saver_internal.h"

typedef struct importer {
  const char *what; /* the file, for messages */
  ps_graph *g;
  ps_status *st;
} importer;

static int bad(importer *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(importer *im, const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ps_status_set(im->st, PS_DATA_LOSS, "MetaGraph %s: %s", im->what, msg);
}

static int shape_in(importer *im, const Paramserver__Meta__Shape *m, ps_shape *s,
                    const char *whose) {
  memset(s, 0, sizeof *s);
  if (m == NULL) return bad(im, "%s: shape missing", whose);
  if (m->rank < -1 || m->rank > PS_MAX_RANK)
    return bad(im, "%s: rank %d is not in [-1, %d]", whose, m->rank, PS_MAX_RANK);
  if (m->n_dim != (size_t)(m->rank > 0 ? m->rank : 0))
    return bad(im, "%s: rank %d with %zu dimensions", whose, m->rank, m->n_dim);
  s->rank = m->rank;
  for (size_t i = 0; i < m->n_dim; i++) {
    if (m->dim[i] < -1) return bad(im, "%s: dimension %lld", whose, (long long)m->dim[i]);
    s->dim[i] = m->dim[i];
  }
  return 0;
}

static int dtype_in(importer *im, int32_t dt, const char *whose, bool allow_string) {
  if ((dt == PS_DT_STRING && allow_string) ||
      (dt > 0 && dt < 32 && ps_dtype_size(dt) > 0))
    return 0;
  return bad(im, "%s: unknown dtype %d", whose, dt);
}

static const ps_op_def *find_def(const char *type, int kind) {
  const ps_op_def *const *sets[] = {
      ps_opdefs_math_,   ps_opdefs_nn_,        ps_opdefs_reduce_,    ps_opdefs_array_,
      ps_opdefs_graph_,  ps_opdefs_variables_, ps_opdefs_partition_, ps_opdefs_optimizer_,
      ps_opdefs_random_, ps_opdefs_conv_};
  for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
    for (int i = 0; sets[s][i]; i++)
      if ((int)sets[s][i]->kind == kind && !strcmp(sets[s][i]->type, type))
        return sets[s][i];
  return NULL;
}

static ps_node *node_ref(importer *im, const char *name, const char *whose) {
  if (name == NULL || name[0] == '\0') return NULL;
  ps_node *n = ps_graph_find_node(im->g, name);
  if (n == NULL) bad(im, "%s refers to node %s, which is not in the graph", whose, name);
  return n;
}

static ps_variable *var_ref(importer *im, const char *name, const char *whose) {
  if (name == NULL || name[0] == '\0') return NULL;
  ps_variable *v = ps_graph_find_var_(im->g, name);
  if (v != NULL) return v;
  bad(im, "%s refers to variable %s, which is not in the graph", whose, name);
  return NULL;
}

/* Pass 1: the node itself, without references. */
static int node_in(importer *im, const Paramserver__Meta__NodeDef *m) {
  ps_graph *g = im->g;
  if (m->name == NULL || m->name[0] == '\0') return bad(im, "a node has no name");
  const ps_op_def *def = find_def(m->op, m->kind);
  if (def == NULL)
    return bad(im, "node %s: unknown op %s (kind %d); written by a newer paramserver?",
               m->name, m->op, m->kind);
  if (ps_graph_find_node(g, m->name)) return bad(im, "two nodes are named %s", m->name);
  if (dtype_in(im, m->dtype, m->name, true) ||
      shape_in(im, m->shape, &(ps_shape){0}, m->name))
    return im->st->code;
  ps_node *n = ps_graph_import_node_(g, def, m->name);
  if (n == NULL) return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
  n->dtype = m->dtype;
  shape_in(im, m->shape, &n->shape, m->name);
  snprintf(n->device, sizeof n->device, "%s", m->device ? m->device : "");
  for (size_t i = 0; i < 4 && i < m->n_int_attr; i++)
    n->ia[i] = m->int_attr[i];
  for (size_t i = 0; i < 4 && i < m->n_float_attr; i++)
    n->fa[i] = m->float_attr[i];
  n->update_op = m->update_op;
  if (m->value) {
    ps_shape s;
    if (dtype_in(im, m->value->dtype, m->name, false) ||
        shape_in(im, m->value->shape, &s, m->name))
      return im->st->code;
    int64_t ne = ps_shape_num_elements(&s);
    if (s.rank < 0 || ne < 0 || (uint64_t)ne > m->value->data.len ||
        m->value->data.len != (size_t)ne * ps_dtype_size(m->value->dtype))
      return bad(im, "node %s: constant of %zu bytes for %lld elements of %s", m->name,
                 m->value->data.len, (long long)ne, ps_dtype_name(m->value->dtype));
    n->value = ps_tensor_create(m->value->dtype, &s, false);
    if (n->value == NULL)
      return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
    if (m->value->data.len)
      memcpy(ps_tensor_data(n->value), m->value->data.data, m->value->data.len);
  }
  if (def->kind == PS_OPK_CONST && n->value == NULL)
    return bad(im, "node %s: Const without a value", m->name);
  return 0;
}

static ps_node **node_list(importer *im, char **names, size_t n, const char *whose) {
  ps_node **out = calloc(n + 1, sizeof *out);
  if (out == NULL) {
    ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    if ((out[i] = node_ref(im, names[i], whose)) == NULL) {
      if (im->st->code == PS_OK) bad(im, "%s: input %zu is empty", whose, i);
      free(out);
      return NULL;
    }
  return out;
}

/* Pass 2: inputs, variables and extras. */
/* A node's inputs, control inputs, variable and sparse-gradient links. */
static int node_edges(importer *im, ps_node *n, const Paramserver__Meta__NodeDef *m) {
  if (m->n_input > 1024 || m->n_control_input > 65536)
    return bad(im, "node %s: %zu inputs", n->name, m->n_input);
  if (m->n_input) {
    if ((n->in = node_list(im, m->input, m->n_input, n->name)) == NULL)
      return im->st->code;
    n->nin = (int)m->n_input;
  }
  if (m->n_control_input) {
    if ((n->ctrl = node_list(im, m->control_input, m->n_control_input, n->name)) == NULL)
      return im->st->code;
    n->nctrl = (int)m->n_control_input;
  }
  if (m->variable && m->variable[0] &&
      (n->var = var_ref(im, m->variable, n->name)) == NULL)
    return im->st->code;
  int kind = n->def->kind;
  if ((kind == PS_OPK_VAR_READ || kind == PS_OPK_VAR_INIT || kind == PS_OPK_VAR_UPDATE ||
       kind == PS_OPK_VAR_IS_INIT || ps_node_is_variable_(n)) &&
      n->var == NULL)
    return bad(im, "node %s: a %s without its variable", n->name, n->def->type);
  if ((kind == PS_OPK_VAR_INIT || kind == PS_OPK_VAR_UPDATE) && n->nin < 1 &&
      kind == PS_OPK_VAR_UPDATE)
    return bad(im, "node %s: an update without its value", n->name);
  if (kind == PS_OPK_LOCAL && n->nin < 1)
    return bad(im, "node %s: %s without inputs", n->name, n->def->type);
  if (m->sparse_indices && m->sparse_indices[0]) {
    if ((n->sparse_indices = node_ref(im, m->sparse_indices, n->name)) == NULL)
      return im->st->code;
    if (shape_in(im, m->sparse_dense_shape, &n->sparse_dense_shape, n->name))
      return im->st->code;
  }
  return 0;
}

/* n->extra of Reshape and of optimizer updates. */
static int node_extra_in(importer *im, ps_node *n, const Paramserver__Meta__NodeDef *m) {
  int kind = n->def->kind;
  if (m->reshape_to) {
    ps_shape *s = malloc(sizeof *s);
    if (s == NULL) return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
    n->extra = s;
    if (shape_in(im, m->reshape_to, s, n->name)) return im->st->code;
  } else if (strcmp(n->def->type, "Reshape") == 0 && n->nin < 2) {
    return bad(im, "node %s: Reshape without a target shape", n->name);
  }
  if (kind == PS_OPK_VAR_UPDATE && m->apply) {
    const Paramserver__Meta__ApplyExtra *x = m->apply;
    ps_apply_extra *e = calloc(1, sizeof *e);
    if (e == NULL) return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
    n->extra = e;
    if (x->n_slot > 4 || x->n_hparam > 8 || x->ndynamic < 0 ||
        (size_t)x->ndynamic + 1 > (size_t)n->nin)
      return bad(im, "node %s: %zu slots, %zu hyperparameters, %d dynamic of %d inputs",
                 n->name, x->n_slot, x->n_hparam, x->ndynamic, n->nin);
    for (size_t i = 0; i < x->n_slot; i++) {
      ps_variable *sv = var_ref(im, x->slot[i], n->name);
      if (sv == NULL) return im->st->code;
      e->slots[e->nslots++] = sv->name;
    }
    for (size_t i = 0; i < x->n_hparam; i++)
      e->hparams[e->nhparams++] = x->hparam[i];
    e->ndynamic = (size_t)x->ndynamic;
    e->use_nesterov = x->use_nesterov;
    if (x->sync_replicas < 0 || x->sync_total < 0 ||
        (x->sync_replicas > 0 && (size_t)x->ndynamic + 2 > (size_t)n->nin))
      return bad(im, "node %s: bad SyncReplicas settings (%d of %d)", n->name,
                 x->sync_replicas, x->sync_total);
    e->sync_replicas_to_aggregate = x->sync_replicas;
    e->sync_total_num_replicas = x->sync_total;
  } else if (kind == PS_OPK_VAR_UPDATE && n->update_op >= PS_APPLY_GRADIENT_DESCENT) {
    return bad(im, "node %s: an optimizer update without its settings", n->name);
  }
  return 0;
}

/* n->extra of the embedding-lookup helpers and of ReportUninitialized. */
static int node_lookup_extra_in(importer *im, ps_node *n,
                                const Paramserver__Meta__NodeDef *m) {
  int kind = n->def->kind;
  bool part_op = ps_meta_is_part_op_(n);
  if (part_op != (m->part != NULL))
    return bad(im, "node %s: %s embedding-lookup settings", n->name,
               part_op ? "missing" : "unexpected");
  if (part_op) {
    const Paramserver__Meta__PartExtra *x = m->part;
    bool stitch = !strcmp(n->def->type, "DynamicStitch");
    if (x->nparts < 1 || x->nparts > 1 << 20 || x->part < 0 || x->part >= x->nparts ||
        x->total < 0 ||
        (x->strategy != PS_PARTITION_MOD && x->strategy != PS_PARTITION_DIV) ||
        (stitch && (x->n_positions != (size_t)x->nparts || n->nin != x->nparts + 1)))
      return bad(im, "node %s: bad embedding-lookup settings (part %d of %d)", n->name,
                 x->part, x->nparts);
    ps_part_info pi = {x->part, x->nparts, x->strategy, x->total};
    if (stitch) {
      ps_stitch_info *si = calloc(1, sizeof *si + (size_t)x->nparts * sizeof(ps_node *));
      if (si == NULL)
        return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
      n->extra = si;
      si->pi = pi;
      for (int i = 0; i < x->nparts; i++)
        if ((si->positions[i] = node_ref(im, x->positions[i], n->name)) == NULL)
          return im->st->code ? im->st->code
                              : bad(im, "node %s: empty position", n->name);
    } else {
      ps_part_info *p = malloc(sizeof *p);
      if (p == NULL) return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
      *p = pi;
      n->extra = p;
    }
  }
  if (kind == PS_OPK_REPORT_UNINIT) {
    ps_report_extra *e =
        malloc(sizeof *e + (m->n_report_variable + 1) * sizeof(ps_variable *));
    if (e == NULL) return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
    n->extra = e;
    e->n = 0;
    for (size_t i = 0; i < m->n_report_variable; i++)
      if ((e->vars[e->n++] = var_ref(im, m->report_variable[i], n->name)) == NULL)
        return im->st->code;
  }
  return 0;
}

static int node_links(importer *im, ps_node *n, const Paramserver__Meta__NodeDef *m) {
  int rc = node_edges(im, n, m);
  if (rc == 0) rc = node_extra_in(im, n, m);
  if (rc == 0) rc = node_lookup_extra_in(im, n, m);
  return rc;
}

static int var_in(importer *im, const Paramserver__Meta__VariableDef *m) {
  ps_graph *g = im->g;
  if (m->name == NULL || m->name[0] == '\0') return bad(im, "a variable has no name");
  if (ps_graph_find_var_(g, m->name))
    return bad(im, "two variables are named %s", m->name);
  ps_variable *v = ps_graph_import_var_(g, m->name);
  if (v == NULL) return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
  if (dtype_in(im, m->dtype, m->name, false) ||
      shape_in(im, m->shape, &v->shape, m->name))
    return im->st->code;
  if (v->shape.rank < 0 || ps_shape_num_elements(&v->shape) < 0)
    return bad(im, "variable %s: its shape must be fully defined", m->name);
  v->dtype = m->dtype;
  v->trainable = m->trainable;
  v->local = m->local;
  snprintf(v->device, sizeof v->device, "%s", m->device ? m->device : "");
  if (m->task < -1 || m->task > 1 << 20)
    return bad(im, "variable %s: task %d", m->name, m->task);
  v->task = m->task;
  v->has_init = m->has_init;
  v->from_get_variable = m->from_get_variable;
  const Paramserver__Meta__InitSpec *i = m->init;
  if (i == NULL) return bad(im, "variable %s: no initializer settings", m->name);
  if (i->type < PS_INIT_ZEROS || i->type > PS_INIT_VARIANCE_SCALING || i->mode < 0 ||
      i->mode > PS_FAN_AVG || i->distribution < 0 || i->distribution > PS_DIST_UNIFORM)
    return bad(im, "variable %s: unknown initializer %d", m->name, i->type);
  ps_init_spec_default(&v->init, (ps_init_type)i->type);
  v->init.value = i->value;
  v->init.minval = i->minval;
  v->init.maxval = i->maxval;
  v->init.mean = i->mean;
  v->init.stddev = i->stddev;
  v->init.scale = i->scale;
  v->init.mode = (ps_fan_mode)i->mode;
  v->init.distribution = (ps_distribution)i->distribution;
  v->init.seed = i->seed;
  if (i->n_values) {
    v->init_values = malloc(i->n_values * sizeof *v->init_values);
    if (v->init_values == NULL)
      return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(v->init_values, i->values, i->n_values * sizeof *v->init_values);
    v->init.values = v->init_values;
    v->init.nvalues = i->n_values;
  }
  if (m->full_name && m->full_name[0]) {
    if ((v->full_name = strdup(m->full_name)) == NULL)
      return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
    if (shape_in(im, m->full_shape, &v->full_shape, m->name)) return im->st->code;
  }
  v->offset = m->offset;
  return 0;
}

static int var_links(importer *im, ps_variable *v,
                     const Paramserver__Meta__VariableDef *m) {
  v->node = node_ref(im, m->node, v->name);
  v->read = node_ref(im, m->read, v->name);
  v->initializer = node_ref(im, m->initializer, v->name);
  if (im->st->code) return im->st->code;
  if (v->node == NULL || v->read == NULL || v->initializer == NULL)
    return bad(im, "variable %s: its VariableV2, read or initializer node is missing",
               v->name);
  if (v->node->var != v || v->read->var != v || v->initializer->var != v)
    return bad(im, "variable %s: its nodes belong to another variable", v->name);
  if (m->initial_value && m->initial_value[0] &&
      (v->initial_value = node_ref(im, m->initial_value, v->name)) == NULL)
    return im->st->code;
  if (!v->has_init && v->initial_value == NULL)
    return bad(im, "variable %s: no initial value", v->name);
  if (m->primary && m->primary[0] &&
      (v->primary = var_ref(im, m->primary, v->name)) == NULL)
    return im->st->code;
  return 0;
}

static int partitioned_in(importer *im,
                          const Paramserver__Meta__PartitionedVariableDef *m) {
  ps_partitioned_variable *pv =
      ps_graph_import_partitioned_(im->g, m->name ? m->name : "", m->n_part);
  if (pv == NULL) return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
  if (dtype_in(im, m->dtype, pv->name, false) ||
      shape_in(im, m->shape, &pv->shape, pv->name))
    return im->st->code;
  pv->dtype = m->dtype;
  for (size_t i = 0; i < m->n_part; i++)
    if ((pv->parts[pv->n++] = var_ref(im, m->part[i], pv->name)) == NULL)
      return im->st->code;
  return 0;
}

static int collection_in(importer *im, const Paramserver__Meta__CollectionDef *m) {
  if (m->key == NULL || m->key[0] == '\0') return bad(im, "a collection has no key");
  for (size_t i = 0; i < m->n_item; i++) {
    if (m->is_variable) {
      ps_variable *v = var_ref(im, m->item[i], m->key);
      if (v == NULL) return im->st->code;
      ps_collection_add_variable(im->g, m->key, v);
    } else {
      ps_node *n = node_ref(im, m->item[i], m->key);
      if (n == NULL)
        return im->st->code ? im->st->code : bad(im, "collection %s: empty name", m->key);
      ps_collection_add_node(im->g, m->key, n);
    }
  }
  if (m->n_item == 0) (void)ps_collection_nodes(im->g, m->key, &(size_t){0});
  return 0;
}

static int saver_in(importer *im, const Paramserver__Meta__MetaGraphDef *m,
                    ps_saver **out) {
  ps_saver *s = ps_saver_new_(im->g);
  if (s == NULL) return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
  *out = s;
  s->all = true;
  if (!m->has_saver || m->saver == NULL) return 0;
  const Paramserver__Meta__SaverDef *d = m->saver;
  s->max_to_keep = d->max_to_keep;
  s->keep_hours = d->keep_checkpoint_every_n_hours;
  if (d->n_variable == 0) return 0;
  s->all = false;
  if (d->n_key && d->n_key != d->n_variable)
    return bad(im, "saver: %zu keys for %zu variables", d->n_key, d->n_variable);
  for (size_t i = 0; i < d->n_variable; i++) {
    if (var_ref(im, d->variable[i], "saver") == NULL) return im->st->code;
    const char *key = d->n_key && strcmp(d->key[i], d->variable[i]) ? d->key[i] : NULL;
    if (ps_saver_add_(s, d->variable[i], key) != 0)
      return ps_status_set(im->st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  return 0;
}

ps_graph *ps_meta_graph_parse(const uint8_t *p, size_t n, const char *what,
                              ps_saver **saver, ps_status *st) {
  if (saver) *saver = NULL;
  /* the passes test st->code: it starts clear, whatever the caller had */
  ps_status local;
  if (st == NULL) st = &local;
  memset(st, 0, sizeof *st);
  importer im = {.what = what ? what : "(memory)", .st = st};
  /* The checksum (see proto/meta.proto): a file of format /2 must end in
   * the checksum of the bytes before it.  A file without a valid one is
   * read only if it parses, has format /1 and no checksum field at all: an
   * older file (whose last bytes may look like the tag by chance). */
  bool sum_ok = false;
  uint32_t want = 0, got = 0;
  if (n >= 5 && p[n - 5] == META_CHECKSUM_TAG) {
    want = (uint32_t)p[n - 4] | (uint32_t)p[n - 3] << 8 | (uint32_t)p[n - 2] << 16 |
           (uint32_t)p[n - 1] << 24;
    got = ps_crc32c_mask(ps_crc32c(p, n - 5));
    sum_ok = want == got;
  }
  Paramserver__Meta__MetaGraphDef *m =
      paramserver__meta__meta_graph_def__unpack(NULL, n, p);
  const char *fmt = m && m->format ? m->format : "";
  bool legacy = m && m->checksum == 0 && strcmp(fmt, META_FORMAT_V1) == 0;
  if (!sum_ok && !legacy) {
    if (want != got)
      bad(&im, "checksum mismatch (stored 0x%08x, computed 0x%08x): the file is corrupt",
          want, got);
    else if (m == NULL)
      bad(&im, "not a MetaGraph (%zu bytes do not parse)", n);
    else if (m->checksum != 0)
      bad(&im, "the checksum is not the last field: the file is corrupt");
    else if (strcmp(fmt, META_FORMAT) == 0)
      bad(&im,
          "format \"%s\" without its checksum at the end: the file is truncated "
          "or corrupt",
          fmt);
    else
      bad(&im, "format \"%s\", expected \"%s\"", fmt, META_FORMAT);
    if (m) paramserver__meta__meta_graph_def__free_unpacked(m, NULL);
    return NULL;
  }
  if (m == NULL) {
    bad(&im, "not a MetaGraph (%zu bytes do not parse)", n);
    return NULL;
  }
  if (strcmp(fmt, META_FORMAT) != 0 && strcmp(fmt, META_FORMAT_V1) != 0) {
    bad(&im, "format \"%s\", expected \"%s\"", fmt, META_FORMAT);
    paramserver__meta__meta_graph_def__free_unpacked(m, NULL);
    return NULL;
  }
  ps_saver *sv = NULL;
  im.g = ps_graph_create();
  if (im.g == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    paramserver__meta__meta_graph_def__free_unpacked(m, NULL);
    return NULL;
  }
  int rc = 0;
  for (size_t i = 0; i < m->n_node && rc == 0; i++)
    rc = node_in(&im, m->node[i]);
  for (size_t i = 0; i < m->n_variable && rc == 0; i++)
    rc = var_in(&im, m->variable[i]);
  for (size_t i = 0; i < m->n_node && rc == 0; i++)
    rc = node_links(&im, ps_graph_node(im.g, i), m->node[i]);
  for (size_t i = 0; i < m->n_variable && rc == 0; i++)
    rc = var_links(&im, ps_graph_var_(im.g, i), m->variable[i]);
  for (size_t i = 0; i < m->n_partitioned && rc == 0; i++)
    rc = partitioned_in(&im, m->partitioned[i]);
  for (size_t i = 0; i < m->n_collection && rc == 0; i++)
    rc = collection_in(&im, m->collection[i]);
  /* every variable op must point at a variable whose own nodes are known */
  for (size_t i = 0; i < ps_graph_num_nodes(im.g) && rc == 0; i++) {
    ps_node *x = ps_graph_node(im.g, i);
    if (x->var && x->var->node == NULL)
      rc = bad(&im, "node %s: variable %s is incomplete", x->name, x->var->name);
  }
  if (rc == 0) rc = saver_in(&im, m, &sv);
  paramserver__meta__meta_graph_def__free_unpacked(m, NULL);
  if (rc != 0) {
    ps_saver_destroy(sv);
    ps_graph_destroy(im.g);
    return NULL;
  }
  if (saver)
    *saver = sv;
  else
    ps_saver_destroy(sv);
  return im.g;
}

ps_graph *ps_import_meta_graph(const char *path, ps_saver **saver, ps_status *st) {
  if (saver) *saver = NULL;
  char *buf = NULL;
  size_t n = 0;
  const char *op = NULL;
  int e = ps_read_file(AT_FDCWD, path, PS_READ_REGULAR, SIZE_MAX, &buf, &n, NULL, &op);
  if (e == ENOMEM) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "MetaGraph %s: out of memory", path);
    return NULL;
  }
  if (e != 0) {
    if (op == NULL || strcmp(op, "opening") == 0)
      ps_status_set(st, ps_status_code_from_errno(e), "MetaGraph %s: %s", path,
                    strerror(e));
    else
      ps_status_set(st, PS_INTERNAL, "MetaGraph %s: read error: %s", path, strerror(e));
    return NULL;
  }
  ps_graph *g = ps_meta_graph_parse((const uint8_t *)buf, n, path, saver, st);
  free(buf);
  return g;
}
