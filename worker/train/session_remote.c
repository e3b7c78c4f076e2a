/* The remote nodes of a run's wave (session.c says how a run goes): the
 * reads, initializers and updates of the variables on the ps, batched
 * into one Read and one Update RPC per ps, every ps at once; and the
 * creation of the variables on their ps.  An optimizer update marked
 * bf16_gradient (ps_optimizer_set_gradient_dtype) of a float variable
 * sends its gradient as a bfloat16 copy made here, freed with the batch;
 * the ps widens it back (ps/service_update.c). */
#include <stdlib.h>
#include <string.h>

#include "common/array.h"
#include "common/variable.h"
#include "session_internal.h"

/* ---- remote waves ---- */

typedef struct task_work {
  ps_read *reads;
  ps_node **read_nodes;
  size_t nreads;
  ps_update *ups;
  ps_node **up_nodes;
  ps_update_result *up_results; /* synchronous updates report here */
  size_t nups;
  ps_update_fill *fills; /* the fills of the ups that are fills, in order */
  size_t nfills;
} task_work;

/* Room for element @n of @arr; false when out of memory. */
#define GROW(arr, n) (ps_array_grow(&(arr), NULL, (n) + 1, sizeof *(arr)) == 0)

static int ensure_created(run *r, ps_node **wave, size_t nw) {
  ps_session *s = r->s;
  ps_graph *g = s->g;
  size_t nvars = ps_graph_num_vars_(g);
  if (s->ncreated < nvars) {
    if (ps_array_grow(&s->created, NULL, nvars, sizeof *s->created) != 0)
      return ps_session_oom_(r->st);
    memset(s->created + s->ncreated, 0, (nvars - s->ncreated) * sizeof(bool));
    s->ncreated = nvars;
  }
  int nps = ps_client_num_ps(s->client);
  ps_var_spec **specs = calloc((size_t)nps, sizeof *specs);
  size_t *nspecs = calloc((size_t)nps, sizeof *nspecs);
  size_t *which = calloc(nvars + 1, sizeof *which), nwhich = 0;
  int rc = specs && nspecs && which ? 0 : ps_session_oom_(r->st);
  for (size_t k = 0; k < nw && rc == 0; k++) {
    ps_variable *v = wave[k]->var;
    if (v == NULL || v->task < 0) continue;
    size_t i = ps_session_var_index_(g, v);
    if (i == SIZE_MAX) {
      rc = ps_session_not_in_graph_(v, r->st);
      break;
    }
    if (s->created[i]) continue;
    if (v->task >= nps) {
      rc = ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "variable %s is placed on %s but the cluster has %d ps tasks",
                         v->name, v->device, nps);
      break;
    }
    if (!GROW(specs[v->task], nspecs[v->task])) {
      rc = ps_session_oom_(r->st);
      break;
    }
    s->created[i] = true;
    which[nwhich++] = i;
    ps_var_spec *sp = &specs[v->task][nspecs[v->task]++];
    memset(sp, 0, sizeof *sp);
    sp->name = v->name;
    sp->dtype = v->dtype;
    sp->shape = v->shape;
    sp->init = v->has_init ? &v->init : NULL;
    sp->full_name = v->full_name;
    sp->full_shape = v->full_name ? &v->full_shape : NULL;
    sp->offset = v->offset;
  }
  for (int t = 0; t < nps && rc == 0; t++)
    if (nspecs[t]) rc = ps_client_create_vars(s->client, t, specs[t], nspecs[t], r->st);
  /* not created after all: the next run tries again (and says why again) */
  if (rc != 0)
    for (size_t j = 0; j < nwhich; j++)
      s->created[which[j]] = false;
  for (int t = 0; t < nps && specs; t++)
    free(specs[t]);
  free(specs);
  free(nspecs);
  free(which);
  return rc;
}

/* One wave's remote work: per ps task, the reads, initializers and updates
 * that go out as one batched call each. */
typedef struct remote_batch {
  int nps;
  task_work *tw;
  ps_task_reads *tr;
  ps_task_updates *tu;
  double **hparams; /* the per-update hyperparameter arrays, owned */
  size_t nhparams;
  ps_tensor **narrow; /* the bfloat16 copies of gradients, owned */
  size_t nnarrow;
} remote_batch;

static void batch_free(remote_batch *b, run *r, int rc) {
  for (int t = 0; b->tw && t < b->nps; t++) {
    task_work *w = &b->tw[t];
    if (rc != 0)
      for (size_t i = 0; i < w->nreads; i++)
        if (r->val[w->read_nodes[i]->id] != w->reads[i].out)
          ps_tensor_destroy(w->reads[i].out);
    free(w->reads);
    free(w->read_nodes);
    free(w->ups);
    free(w->up_nodes);
    free(w->up_results);
    free(w->fills);
  }
  for (size_t i = 0; i < b->nhparams; i++)
    free(b->hparams[i]);
  free(b->hparams);
  for (size_t i = 0; i < b->nnarrow; i++)
    ps_tensor_destroy(b->narrow[i]);
  free(b->narrow);
  free(b->tw);
  free(b->tr);
  free(b->tu);
}

/* A read of @n's variable (rows @indices, or all of it when NULL). */
static int batch_add_read(run *r, task_work *w, ps_node *n, const ps_tensor *indices) {
  if (!GROW(w->reads, w->nreads) || !GROW(w->read_nodes, w->nreads))
    return ps_session_oom_(r->st);
  w->reads[w->nreads] = (ps_read){.name = n->var->name, .indices = indices};
  w->read_nodes[w->nreads++] = n;
  return 0;
}

/* The update op that goes out for @n (an assign of its initial value, or its
 * update), the sparse form when the value is a sparse gradient; *idx gets
 * the row indices then. */
static int update_op_of(run *r, ps_node *n, const ps_tensor **idx, int *opp) {
  ps_node *x = n->in[0];
  int op = n->def->kind == PS_OPK_VAR_INIT ? PS_ASSIGN : n->update_op;
  *idx = NULL;
  if (x->sparse_indices) {
    *idx = r->val[x->sparse_indices->id];
    if (op >= PS_APPLY_GRADIENT_DESCENT) {
      /* optimizer kernels take sparse rows as they are */
    } else if (op == PS_ASSIGN_ADD)
      op = PS_SCATTER_ADD;
    else if (op == PS_ASSIGN_SUB)
      op = PS_SCATTER_SUB;
    else if (op == PS_ASSIGN)
      op = PS_SCATTER_UPDATE;
    if ((*idx)->dtype != PS_DT_INT64 && (*idx)->dtype != PS_DT_INT32)
      return ps_status_set(r->st, PS_INVALID_ARGUMENT, "%s: bad sparse indices", n->name);
  }
  *opp = op;
  return 0;
}

/* SyncReplicas: the local step of update @u, global_step as this run read
 * it (input 1 + ndynamic of @n). */
static int set_sync_step(run *r, ps_node *n, const ps_apply_extra *se, ps_update *u,
                         ps_update_result *res) {
  if ((int)(1 + se->ndynamic) >= n->nin)
    return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "%s: a synchronous update without its local step input",
                         n->name);
  const ps_tensor *ls = r->val[n->in[1 + se->ndynamic]->id];
  const void *lp = ps_tensor_data(ls);
  int64_t step = ls->dtype == PS_DT_INT64   ? *(const int64_t *)lp
                 : ls->dtype == PS_DT_INT32 ? *(const int32_t *)lp
                                            : (int64_t)ps_elem_get(ls->dtype, lp, 0);
  u->replicas_to_aggregate = se->sync_replicas_to_aggregate;
  u->sync_local_step = step;
  u->result = res;
  return 0;
}

/* An optimizer update's hyperparameters: the constant ones, then the
 * per-step ones (Adam's beta powers, read at the start of the step). */
static int set_hparams(run *r, remote_batch *b, ps_node *n, ps_update *u) {
  ps_apply_extra *e = n->extra;
  double *hp = calloc(e->nhparams + e->ndynamic + 1, sizeof *hp);
  if (hp == NULL || !GROW(b->hparams, b->nhparams)) {
    free(hp);
    return ps_session_oom_(r->st);
  }
  memcpy(hp, e->hparams, e->nhparams * sizeof *hp);
  for (size_t d = 0; d < e->ndynamic; d++) {
    ps_tensor *t = r->val[n->in[1 + d]->id];
    hp[e->nhparams + d] = ps_elem_get(t->dtype, ps_tensor_data(t), 0);
  }
  b->hparams[b->nhparams++] = hp; /* room made above */
  u->slots = e->slots;
  u->nslots = e->nslots;
  u->hparams = hp;
  u->nhparams = e->nhparams + e->ndynamic;
  u->use_nesterov = e->use_nesterov;
  return 0;
}

/* The gradient @val of optimizer update @n rounded to bfloat16 (a new
 * tensor the batch owns) when @n asks for it and the variable is float;
 * else @val itself.  NULL when out of memory. */
static const ps_tensor *wire_value(run *r, remote_batch *b, ps_node *n, int op,
                                   const ps_tensor *val) {
  const ps_apply_extra *e = n->extra;
  if (op < PS_APPLY_GRADIENT_DESCENT || e == NULL || !e->bf16_gradient ||
      val->dtype != PS_DT_FLOAT)
    return val;
  ps_tensor *t = ps_tensor_create(PS_DT_BFLOAT16, &val->shape, false);
  if (t == NULL || !GROW(b->narrow, b->nnarrow)) {
    ps_tensor_destroy(t);
    ps_session_oom_(r->st);
    return NULL;
  }
  ps_bf16_narrow(ps_tensor_data(t), ps_tensor_data(val),
                 (size_t)ps_tensor_num_elements(val));
  b->narrow[b->nnarrow++] = t; /* room made above */
  return t;
}

/* An update of @n's variable (or the assign of its computed initial value). */
static int batch_add_update(run *r, remote_batch *b, task_work *w, ps_node *n) {
  ps_variable *v = n->var;
  ps_tensor *val = r->val[n->in[0]->id];
  const ps_tensor *idx;
  int op = 0, rc = update_op_of(r, n, &idx, &op);
  if (rc) return rc;
  if (val->dtype != v->dtype)
    return ps_status_set(r->st, PS_INVALID_ARGUMENT,
                         "%s: value has dtype %s but %s is %s", n->name,
                         ps_dtype_name(val->dtype), v->name, ps_dtype_name(v->dtype));
  const ps_tensor *wv =
      n->def->kind == PS_OPK_VAR_UPDATE ? wire_value(r, b, n, op, val) : val;
  if (wv == NULL) return r->st->code;
  if (!GROW(w->ups, w->nups) || !GROW(w->up_nodes, w->nups) ||
      !GROW(w->up_results, w->nups))
    return ps_session_oom_(r->st);
  ps_update *u = &w->ups[w->nups];
  *u = (ps_update){.name = v->name, .op = (ps_update_op)op, .value = wv, .indices = idx};
  w->up_results[w->nups] = (ps_update_result){0};
  ps_apply_extra *se = n->def->kind == PS_OPK_VAR_UPDATE ? n->extra : NULL;
  if (se && se->sync_replicas_to_aggregate > 0 &&
      (rc = set_sync_step(r, n, se, u, &w->up_results[w->nups])) != 0)
    return rc;
  if (op >= PS_APPLY_GRADIENT_DESCENT && n->extra && (rc = set_hparams(r, b, n, u)) != 0)
    return rc;
  w->up_nodes[w->nups++] = n;
  return 0;
}

/* @n is the initializer of a variable with an initializer spec. */
static bool is_fill(const ps_node *n) {
  return n->def->kind == PS_OPK_VAR_INIT && n->var->has_init;
}

/* The initializer @n of a variable with an initializer spec: an assign
 * the ps fills with this run's draw (init_draw), as TensorFlow runs the
 * initializer op on the variable's device; the values never cross the
 * network nor sit in the worker's memory. */
static int batch_add_fill(run *r, task_work *w, ps_node *n) {
  ps_variable *v = n->var;
  if (!GROW(w->fills, w->nfills) || !GROW(w->ups, w->nups) ||
      !GROW(w->up_nodes, w->nups) || !GROW(w->up_results, w->nups))
    return ps_session_oom_(r->st);
  ps_update_fill *f = &w->fills[w->nfills];
  *f = (ps_update_fill){.init = &v->init, .dtype = v->dtype, .shape = v->shape};
  if (v->full_name) {
    f->full_name = v->full_name;
    f->full_shape = &v->full_shape;
    f->offset = v->offset;
  }
  int rc = ps_session_init_draw_(r->s, v, &f->seed, &f->draw, r->st);
  if (rc != 0) return rc;
  w->nfills++;
  w->ups[w->nups] = (ps_update){.name = v->name, .op = PS_ASSIGN};
  w->up_results[w->nups] = (ps_update_result){0};
  w->up_nodes[w->nups++] = n;
  return 0;
}

/* Sorts the wave's variable ops into per-task work. */
static int batch_collect(run *r, remote_batch *b, ps_node **wave, size_t nw) {
  int rc = 0;
  for (size_t k = 0; k < nw && rc == 0; k++) {
    ps_node *n = wave[k];
    if (n->def->kind == PS_OPK_REPORT_UNINIT) continue;
    ps_variable *v = n->var;
    task_work *w = &b->tw[v->task];
    switch (n->def->kind) {
    case PS_OPK_VAR_READ:
      if (!ps_session_falls_back_(n)) rc = batch_add_read(r, w, n, NULL);
      break;
    case PS_OPK_LOCAL: /* a gather served by the ps */
      rc = batch_add_read(r, w, n, r->val[n->in[1]->id]);
      break;
    case PS_OPK_VAR_INIT:
      if (is_fill(n)) {
        rc = batch_add_fill(r, w, n);
        break;
      }
      /* assign the computed initial value */
      __attribute__((fallthrough));
    case PS_OPK_VAR_UPDATE:
      rc = batch_add_update(r, b, w, n);
      break;
    default:
      break;
    }
  }
  return rc;
}

/* The reads, one call per task, all tasks at once. */
static int batch_read(run *r, remote_batch *b) {
  ps_session *s = r->s;
  size_t ntr = 0;
  for (int t = 0; t < b->nps; t++)
    if (b->tw[t].nreads)
      b->tr[ntr++] =
          (ps_task_reads){.task = t, .reads = b->tw[t].reads, .n = b->tw[t].nreads};
  if (ntr == 0) return 0;
  int rc = ps_client_read_many(s->client, b->tr, ntr, r->st);
  s->last_reads += (int)ntr;
  if (rc == 0)
    for (int t = 0; t < b->nps; t++)
      for (size_t i = 0; i < b->tw[t].nreads; i++)
        r->val[b->tw[t].read_nodes[i]->id] = b->tw[t].reads[i].out;
  return rc;
}

/* The updates, one call per task, all tasks at once. */
static int batch_update(run *r, remote_batch *b) {
  ps_session *s = r->s;
  size_t ntu = 0;
  for (int t = 0; t < b->nps; t++)
    if (b->tw[t].nups)
      b->tu[ntu++] =
          (ps_task_updates){.task = t, .updates = b->tw[t].ups, .n = b->tw[t].nups};
  if (ntu == 0) return 0;
  /* the results and fills arrays may have moved while growing: point again */
  for (int t = 0; t < b->nps; t++) {
    size_t k = 0;
    for (size_t i = 0; i < b->tw[t].nups; i++) {
      if (b->tw[t].ups[i].result) b->tw[t].ups[i].result = &b->tw[t].up_results[i];
      if (is_fill(b->tw[t].up_nodes[i])) b->tw[t].ups[i].fill = &b->tw[t].fills[k++];
    }
  }
  int rc = ps_client_update_many(s->client, b->tu, ntu, r->st);
  s->last_updates += (int)ntu;
  if (rc == 0)
    for (int t = 0; t < b->nps; t++)
      for (size_t i = 0; i < b->tw[t].nups; i++) {
        task_work *w = &b->tw[t];
        if ((r->val[w->up_nodes[i]->id] = ps_session_empty_tensor_()) == NULL)
          rc = ps_session_oom_(r->st);
        if (w->ups[i].result == NULL) continue;
        if (w->up_results[i].stale)
          s->last_sync_stale++;
        else
          s->last_sync_applied++;
      }
  return rc;
}

/* The update nodes of this wave whose value is used get it: their
 * variables are read after the wave's updates, one call per task. */
static int read_updated(run *r, remote_batch *b) {
  size_t nps = b->nps > 0 ? (size_t)b->nps : 0;
  ps_read **rd = calloc(nps + 1, sizeof *rd);
  ps_node ***who = calloc(nps + 1, sizeof *who);
  size_t *cnt = calloc(nps + 1, sizeof *cnt), ntr = 0;
  int rc = rd && who && cnt ? 0 : ps_session_oom_(r->st);
  for (int t = 0; t < b->nps && rc == 0; t++) {
    task_work *w = &b->tw[t];
    for (size_t i = 0; i < w->nups && rc == 0; i++) {
      ps_node *n = w->up_nodes[i];
      if (r->want_value == NULL || !r->want_value[n->id]) continue;
      if (!GROW(rd[t], cnt[t]) || !GROW(who[t], cnt[t])) {
        rc = ps_session_oom_(r->st);
        break;
      }
      rd[t][cnt[t]] = (ps_read){.name = n->var->name};
      who[t][cnt[t]++] = n;
    }
    if (cnt[t]) b->tr[ntr++] = (ps_task_reads){.task = t, .reads = rd[t], .n = cnt[t]};
  }
  if (rc == 0 && ntr) {
    rc = ps_client_read_many(r->s->client, b->tr, ntr, r->st);
    r->s->last_reads += (int)ntr;
    for (int t = 0; t < b->nps; t++)
      for (size_t i = 0; i < cnt[t]; i++) {
        if (rc == 0) {
          ps_tensor_destroy(r->val[who[t][i]->id]);
          r->val[who[t][i]->id] = rd[t][i].out;
        } else {
          ps_tensor_destroy(rd[t][i].out);
        }
      }
  }
  for (int t = 0; t < b->nps; t++) {
    if (rd) free(rd[t]);
    if (who) free(who[t]);
  }
  free(rd);
  free(who);
  free(cnt);
  return rc;
}

/* is_initialized and report: one call per node (rare, control plane). */
static int run_control_ops(run *r, ps_node **wave, size_t nw) {
  int rc = 0;
  for (size_t k = 0; k < nw && rc == 0; k++) {
    ps_node *n = wave[k];
    if (n->def->kind == PS_OPK_VAR_IS_INIT) {
      bool b = false;
      const char *nm[1] = {n->var->name};
      rc = ps_client_is_initialized(r->s->client, n->var->task, nm, 1, &b, r->st);
      ps_shape s0 = {0};
      if (rc == 0 && (r->val[n->id] = ps_tensor_create(PS_DT_BOOL, &s0, true)) == NULL)
        rc = ps_session_oom_(r->st);
      if (rc == 0) *(uint8_t *)ps_tensor_data(r->val[n->id]) = b;
    }
  }
  return rc;
}

/* The wave's remote ops: reads, then initializers, then updates, batched
 * per task; then the control-plane ops. */
int ps_session_run_remote_(run *r, ps_node **wave, size_t nw) {
  ps_session *s = r->s;
  if (s->client == NULL)
    return ps_status_set(r->st, PS_FAILED_PRECONDITION,
                         "%s needs a ps, but the session has no client", wave[0]->name);
  int rc = ensure_created(r, wave, nw);
  if (rc) return rc;
  remote_batch b = {.nps = ps_client_num_ps(s->client)};
  b.tw = calloc((size_t)b.nps, sizeof *b.tw);
  b.tr = calloc((size_t)b.nps, sizeof *b.tr);
  b.tu = calloc((size_t)b.nps, sizeof *b.tu);
  if (!b.tw || !b.tr || !b.tu) rc = ps_session_oom_(r->st);
  if (rc == 0) rc = batch_collect(r, &b, wave, nw);
  if (rc == 0) rc = batch_read(r, &b);
  if (rc == 0) rc = ps_session_run_fallback_reads_(r, wave, nw);
  if (rc == 0) rc = batch_update(r, &b);
  if (rc == 0) rc = read_updated(r, &b);
  if (rc == 0) rc = run_control_ops(r, wave, nw);
  batch_free(&b, r, rc);
  return rc;
}

int ps_session_create_variables(ps_session *s, ps_status *st) {
  ps_graph *g = s->g;
  if (s->client == NULL) return 0;
  ps_node **reads = calloc(ps_graph_num_vars_(g) + 1, sizeof *reads);
  if (reads == NULL) return ps_session_oom_(st);
  size_t n = 0;
  for (size_t i = 0; i < ps_graph_num_vars_(g); i++)
    if (ps_graph_var_(g, i)->task >= 0) reads[n++] = ps_graph_var_(g, i)->read;
  run r = {.s = s, .n = ps_graph_num_nodes(g), .st = st};
  int rc = n ? ensure_created(&r, reads, n) : 0;
  free(reads);
  return rc;
}
