/* Partitioned variables and embedding lookups.
 *
 * An embedding lookup over n parts is built from small local ops:
 * PartRows(ids, p) gives the local row of every id that belongs to part p,
 * PartPositions(ids, p) where those ids sit in the input, a gather of the
 * part's rows (served by the part's ps: only those rows cross the network)
 * and Stitch, which puts the rows back in input order.  Stitch's gradient
 * for part p is a gather of the incoming gradient at PartPositions(p), and
 * the gather's gradient is sparse, so each part is updated as rows. */
#include "paramserver/partition.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_priv.h"
#include "node.h"

int ps_partitioner_num_parts(const ps_partitioner *p, ps_dtype dtype,
                             const ps_shape *shape) {
  if (shape->rank < 1 || shape->dim[0] < 1) return 1;
  int64_t dim0 = shape->dim[0], n;
  if (p->kind == PS_PART_FIXED) {
    n = p->num_shards < 1 ? 1 : p->num_shards;
  } else {
    int64_t elems = ps_shape_num_elements(shape);
    int64_t bytes = elems * (int64_t)ps_dtype_size(dtype);
    int64_t min_slice = p->min_slice_size > 0 ? p->min_slice_size : 256 << 10;
    int64_t want = (bytes + min_slice - 1) / min_slice;
    int64_t maxp = p->max_partitions < 1 ? 1 : p->max_partitions;
    n = want < maxp ? want : maxp;
  }
  if (n > dim0) n = dim0;
  return n < 1 ? 1 : (int)n;
}

static ps_partitioned_variable *
get_partitioned(ps_graph *g, const char *name, ps_dtype dtype, const ps_shape *shape,
                const ps_init_spec *init, const ps_partitioner *part,
                const ps_var_options *opt, ps_status *st) {
  char full[1024];
  ps_reuse reuse;
  if (ps_graph_vscope_name_(g, name, full, sizeof full, &reuse, st) != 0) return NULL;
  /* an existing partitioned variable of that name? */
  char part0[1100];
  snprintf(part0, sizeof part0, "%s/part_0", full);
  bool exists = false;
  for (size_t i = 0; i < g->nvars; i++)
    if (!strcmp(g->vars[i]->name, part0)) exists = true;
  if (exists && reuse == PS_REUSE_NONE) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "Partitioned variable with name %s already exists. Did you mean "
                  "to set reuse=True or reuse=tf.AUTO_REUSE in VarScope?",
                  full);
    return NULL;
  }
  int n = ps_partitioner_num_parts(part, dtype, shape);
  ps_partitioned_variable *pv = calloc(1, sizeof *pv);
  if (pv == NULL || (pv->name = strdup(full)) == NULL ||
      (pv->parts = calloc((size_t)n, sizeof *pv->parts)) == NULL ||
      ps_array_grow(&g->pvars, NULL, g->npvars + 1, sizeof *g->pvars) != 0) {
    if (pv) {
      free(pv->name);
      free(pv->parts);
    }
    free(pv);
    ps_graph_oom_(g);
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  pv->dtype = dtype;
  pv->shape = *shape;
  pv->n = n;
  int64_t dim0 = shape->dim[0], base = dim0 / n, extra = dim0 % n, row = 0;
  int64_t row_elems = dim0 ? ps_shape_num_elements(shape) / dim0 : 0;
  for (int i = 0; i < n; i++) {
    ps_shape ps = *shape;
    ps.dim[0] = base + (i < extra ? 1 : 0);
    char pname[1100];
    snprintf(pname, sizeof pname, "%s/part_%d", name, i);
    ps_variable *v = ps_get_variable(g, pname, dtype, &ps, init, opt, st);
    if (v == NULL) {
      if (exists && reuse != PS_REUSE_NONE)
        ps_status_set(st, PS_INVALID_ARGUMENT,
                      "Trying to reuse partitioned variable %s, but specified shape "
                      "does not match its partitioning.",
                      full);
      free(pv->parts);
      free(pv->name);
      free(pv);
      return NULL;
    }
    if (!exists) {
      free(v->full_name);
      if ((v->full_name = strdup(full)) == NULL) {
        free(pv->parts);
        free(pv->name);
        free(pv);
        ps_graph_oom_(g);
        ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
      }
      v->full_shape = *shape;
      v->offset = row * row_elems;
    }
    pv->parts[i] = v;
    row += ps.dim[0];
  }
  g->pvars[g->npvars++] = pv; /* the graph owns it; room made above */
  return pv;
}

/* The one error rule (graph.h): a failure adds no part, and the graph
 * records the error. */
ps_partitioned_variable *
ps_get_partitioned_variable(ps_graph *g, const char *name, ps_dtype dtype,
                            const ps_shape *shape, const ps_init_spec *init,
                            const ps_partitioner *part, const ps_var_options *opt,
                            ps_status *st) {
  ps_status local;
  if (st == NULL) st = &local;
  if (g == NULL || name == NULL || shape == NULL || part == NULL) {
    ps_status_set(st, PS_INVALID_ARGUMENT, "partitioned variable: missing argument");
    return NULL;
  }
  if (dtype == PS_DT_INVALID) dtype = PS_DT_FLOAT; /* TensorFlow's dtype=None */
  ps_graph_mark m = ps_graph_mark_(g);
  ps_partitioned_variable *pv =
      get_partitioned(g, name, dtype, shape, init, part, opt, st);
  if (pv == NULL) {
    ps_status keep = *st;
    ps_graph_rollback_(g, m);
    ps_graph_fail(g, keep.code ? keep.code : PS_INTERNAL, "%s", keep.msg);
    *st = keep;
  }
  return pv;
}

/* ---- embedding lookup ops ---- */

typedef ps_part_info part_info;

static int64_t id_at(const ps_tensor *t, int64_t i) {
  return t->dtype == PS_DT_INT32 ? ((const int32_t *)ps_tensor_data(t))[i]
                                 : ((const int64_t *)ps_tensor_data(t))[i];
}

/* TensorFlow's embedding_lookup part/row assignment. */
static void assign_id(const part_info *pi, int64_t id, int64_t *part, int64_t *row) {
  int64_t np = pi->nparts;
  if (pi->strategy == PS_PARTITION_MOD) {
    *part = id % np;
    *row = id / np;
    return;
  }
  int64_t per = pi->total / np, extras = pi->total % np;
  int64_t a = id / (per + 1), b = per ? (id - extras) / per : a;
  *part = a > b ? a : b;
  *row = *part < extras ? id % (per + 1) : (id - extras) % (per ? per : 1);
}

static int check_ids(const part_info *pi, const ps_tensor *ids, ps_status *st) {
  for (int64_t i = 0; i < ps_tensor_num_elements(ids); i++) {
    int64_t id = id_at(ids, i);
    if (id < 0 || id >= pi->total)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "indices[%lld] = %lld is not in [0, %lld)", (long long)i,
                           (long long)id, (long long)pi->total);
  }
  return 0;
}

static int part_select(ps_node *n, ps_tensor *const *in, ps_tensor **out, ps_status *st,
                       bool rows) {
  const part_info *pi = n->extra;
  const ps_tensor *ids = in[0];
  if (check_ids(pi, ids, st)) return st->code;
  int64_t m = ps_tensor_num_elements(ids), k = 0;
  ps_shape s = {.rank = 1, .dim = {0}};
  for (int64_t i = 0; i < m; i++) {
    int64_t part, row;
    assign_id(pi, id_at(ids, i), &part, &row);
    if (part == pi->p) k++;
  }
  s.dim[0] = k;
  *out = ps_tensor_create(PS_DT_INT64, &s, false);
  if (*out == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  int64_t *o = ps_tensor_data(*out);
  k = 0;
  for (int64_t i = 0; i < m; i++) {
    int64_t part, row;
    assign_id(pi, id_at(ids, i), &part, &row);
    if (part == pi->p) o[k++] = rows ? row : i;
  }
  return 0;
}

static int part_rows_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                             ps_status *st) {
  return part_select(n, in, out, st, true);
}
static int part_positions_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                                  ps_status *st) {
  return part_select(n, in, out, st, false);
}

static const ps_op_def op_part_rows = {"PartRows", PS_OPK_LOCAL, part_rows_compute, NULL};
static const ps_op_def op_part_positions = {"PartPositions", PS_OPK_LOCAL,
                                            part_positions_compute, NULL};

typedef ps_stitch_info stitch_info;

/* in[0] = ids, in[1+p] = rows of part p (in the order PartRows gave). */
static int stitch_compute(ps_node *n, ps_tensor *const *in, ps_tensor **out,
                          ps_status *st) {
  const stitch_info *si = n->extra;
  const ps_tensor *ids = in[0];
  int64_t m = ps_tensor_num_elements(ids);
  const ps_tensor *r0 = in[1];
  ps_shape s = r0->shape;
  s.dim[0] = m;
  *out = ps_tensor_create(r0->dtype, &s, false);
  if (*out == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  size_t rb = r0->shape.dim[0] ? ps_tensor_nbytes(r0) / (size_t)r0->shape.dim[0] : 0;
  if (rb == 0) { /* find the row size from any non-empty part */
    for (int p = 0; p < si->pi.nparts; p++)
      if (in[1 + p]->shape.dim[0])
        rb = ps_tensor_nbytes(in[1 + p]) / (size_t)in[1 + p]->shape.dim[0];
  }
  int64_t *next = calloc((size_t)si->pi.nparts, sizeof *next);
  if (next == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (int64_t i = 0; i < m; i++) {
    int64_t part, row;
    assign_id(&si->pi, id_at(ids, i), &part, &row);
    const ps_tensor *src = in[1 + part];
    memcpy((uint8_t *)ps_tensor_data(*out) + (size_t)i * rb,
           (const uint8_t *)ps_tensor_data(src) + (size_t)next[part]++ * rb, rb);
  }
  free(next);
  return 0;
}

static int stitch_grad(ps_graph *g, ps_node *n, ps_node *dy, ps_node **dx,
                       ps_status *st) {
  const stitch_info *si = n->extra;
  dx[0] = NULL;
  for (int p = 0; p < si->pi.nparts; p++)
    dx[1 + p] = ps_gather(dy, si->positions[p]);
  return 0;
}

static const ps_op_def op_stitch = {"DynamicStitch", PS_OPK_LOCAL, stitch_compute,
                                    stitch_grad};

ps_node *ps_embedding_lookup(ps_graph *g, ps_variable *const *parts, int n, ps_node *ids,
                             ps_partition_strategy strategy) {
  if (ids == NULL || n < 1)
    return ps_graph_fail(g, PS_INVALID_ARGUMENT, "embedding_lookup: no ids or parts");
  if (n == 1) return ps_gather(ps_variable_value(parts[0]), ids);
  int64_t total = 0;
  for (int p = 0; p < n; p++)
    total += parts[p]->shape.dim[0];
  ps_graph_mark m = ps_graph_mark_(g);
  if (ps_name_scope_push(g, "embedding_lookup", NULL) != 0) return NULL;
  ps_node **in = calloc((size_t)n + 1, sizeof *in);
  stitch_info *si = calloc(1, sizeof *si + (size_t)n * sizeof(ps_node *));
  if (in == NULL || si == NULL) {
    free(in);
    free(si);
    ps_name_scope_pop(g);
    return ps_graph_oom_(g);
  }
  si->pi = (part_info){0, n, strategy, total};
  in[0] = ids;
  for (int p = 0; p < n; p++) {
    ps_node *rows = ps_node_new(g, &op_part_rows, "PartRows", &ids, 1);
    ps_node *pos = ps_node_new(g, &op_part_positions, "PartPositions", &ids, 1);
    if (!rows || !pos) break;
    part_info *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    if (a == NULL || b == NULL) {
      free(a);
      free(b);
      ps_graph_oom_(g);
      break;
    }
    *a = (part_info){p, n, strategy, total};
    *b = *a;
    rows->extra = a;
    pos->extra = b;
    rows->dtype = pos->dtype = PS_DT_INT64;
    rows->shape = pos->shape = (ps_shape){.rank = 1, .dim = {-1}};
    si->positions[p] = pos;
    in[1 + p] = ps_gather(ps_variable_value(parts[p]), rows);
  }
  ps_node *out = ps_graph_failed_since_(g, m)
                     ? NULL
                     : ps_node_new(g, &op_stitch, "DynamicStitch", in, n + 1);
  if (out) {
    out->extra = si;
    out->dtype = parts[0]->dtype;
    out->shape = parts[0]->shape;
    out->shape.dim[0] = ids->shape.rank == 1 ? ids->shape.dim[0] : -1;
  } else {
    free(si);
  }
  free(in);
  ps_name_scope_pop(g);
  if (out == NULL) ps_graph_rollback_(g, m);
  return out;
}

/* Every op of this file, for MetaGraph import (saver.c). */
const ps_op_def *const ps_opdefs_partition_[] = {&op_part_rows, &op_part_positions,
                                                 &op_stitch, NULL};
