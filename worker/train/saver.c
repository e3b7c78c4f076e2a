/* Saver and MetaGraph export/import (paramserver/saver.h).
 *
 * Export walks the graph into proto/meta.proto's messages (names stand for
 * pointers); import rebuilds the structs the constructors would have made,
 * node by node, with the op definitions found by type and kind in the
 * per-file registries (ps_opdefs_*_).  Everything read is validated before
 * use: a reference to a missing node, an op this build doesn't know, a bad
 * dtype or shape, or extras that don't fit their op name the file and the
 * fault. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/array.h"
#include "common/crc32c.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/variable.h"
#include "graph/node.h"
#include "meta.pb-c.h"
#include "paramserver/partition.h"
#include "paramserver/saver.h"
#include "train_internal.h"

/* The format written; /1 (no checksum) is still read.  See proto/meta.proto
 * for the checksum: the last 5 bytes of the file. */
#define META_FORMAT "paramserver.meta/2"
/* The largest MetaGraph a save carries to the ps (well inside a message). */
#define PS_SAVER_META_MAX (16 << 20)
#define META_FORMAT_V1 "paramserver.meta/1"
#define META_CHECKSUM_TAG 0x7d /* field 15, wire type 5 (fixed32) */

extern const ps_op_def ps_op_variable_def_;

struct ps_saver {
  ps_graph *g;
  bool all; /* every global variable, resolved at restore time */
  size_t n;
  char **vars;
  char **keys; /* entries may be NULL: the variable's own name */
  int max_to_keep;
  double keep_hours;
  bool dir_retention;
  bool no_meta_graph;
  ps_ckpt_list own; /* the checkpoints it wrote that are still listed */
};

/* ---- saver ---- */

static ps_saver *saver_new(ps_graph *g) {
  ps_saver *s = calloc(1, sizeof *s);
  if (s) s->g = g;
  return s;
}

void ps_saver_destroy(ps_saver *s) {
  if (s == NULL) return;
  for (size_t i = 0; i < s->n; i++) {
    free(s->vars[i]);
    free(s->keys[i]);
  }
  ps_ckpt_list_fini(&s->own);
  free(s->vars);
  free(s->keys);
  free(s);
}

static int saver_add(ps_saver *s, const char *var, const char *key) {
  char **v = realloc(s->vars, (s->n + 1) * sizeof *v);
  if (v == NULL) return -1;
  s->vars = v;
  char **k = realloc(s->keys, (s->n + 1) * sizeof *k);
  if (k == NULL) return -1;
  s->keys = k;
  s->vars[s->n] = strdup(var);
  s->keys[s->n] = key ? strdup(key) : NULL;
  if (s->vars[s->n] == NULL || (key && s->keys[s->n] == NULL)) {
    free(s->vars[s->n]);
    free(s->keys[s->n]);
    return -1;
  }
  s->n++;
  return 0;
}

ps_saver *ps_saver_create(ps_graph *g, const ps_saver_options *o, ps_status *st) {
  ps_saver *s = saver_new(g);
  if (s == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  s->all = o == NULL || o->var_list == NULL;
  if (o) {
    s->max_to_keep = o->max_to_keep;
    s->keep_hours = o->keep_checkpoint_every_n_hours;
    s->dir_retention = o->directory_retention;
    s->no_meta_graph = o->no_meta_graph;
  }
  if (s->all) return s;
  for (size_t i = 0; i < o->nvars; i++) {
    const ps_variable *v = o->var_list[i];
    const char *key = o->keys ? o->keys[i] : NULL;
    if (v == NULL) {
      ps_saver_destroy(s);
      ps_status_set(st, PS_INVALID_ARGUMENT, "Saver: var_list[%zu] is NULL", i);
      return NULL;
    }
    for (size_t j = 0; j < s->n; j++) {
      const char *kj = s->keys[j] ? s->keys[j] : s->vars[j];
      if (!strcmp(kj, key ? key : v->name)) {
        ps_status_set(st, PS_INVALID_ARGUMENT,
                      "The same saveable will be restored with two names: %s", kj);
        ps_saver_destroy(s);
        return NULL;
      }
    }
    if (saver_add(s, v->name, key) != 0) {
      ps_saver_destroy(s);
      ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      return NULL;
    }
  }
  return s;
}

/* ---- variables held by the session ----
 * A checkpoint lives on the ps, so a variable the session holds itself goes
 * through a staging variable on ps 0, "_saver_staging/<random>/<name>":
 * a save assigns the session's value to it and writes it under the
 * variable's key; a restore reads the key into it and takes its value.
 * The staging variables are deleted when the save or restore ends. */
typedef struct staging {
  char **names;
  size_t n;
} staging;

static void staging_free(staging *sg, ps_client *c) {
  if (sg->n > 0 && c) {
    ps_status ignored;
    ps_client_delete(c, 0, (const char *const *)sg->names, sg->n, PS_DELETE_MISSING_OK,
                     NULL, &ignored);
  }
  for (size_t i = 0; i < sg->n; i++)
    free(sg->names[i]);
  free(sg->names);
  sg->names = NULL;
  sg->n = 0;
}

/* Creates the staging variable of @v on ps 0; its name goes into @sg. */
static const char *staging_create(staging *sg, ps_client *c, ps_variable *v,
                                  ps_status *st) {
  if (v->full_name)
    return ps_status_set(st, PS_UNIMPLEMENTED,
                         "Saver: %s is a part of a partitioned variable held by the "
                         "session; place it on the ps to checkpoint it",
                         v->name),
           NULL;
  uint64_t tag = 0;
  if (getrandom(&tag, sizeof tag, 0) != sizeof tag) tag = (uint64_t)getpid() << 20;
  char name[1100];
  snprintf(name, sizeof name, "_saver_staging/%016llx/%s", (unsigned long long)tag,
           v->name);
  char *copy = strdup(name);
  if (copy == NULL ||
      ps_array_grow(&sg->names, NULL, sg->n + 1, sizeof *sg->names) != 0) {
    free(copy);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory"), NULL;
  }
  sg->names[sg->n++] = copy;
  ps_var_spec sp = {.name = copy, .dtype = v->dtype, .shape = v->shape};
  if (ps_client_create_vars(c, 0, &sp, 1, st) != 0) return NULL;
  return copy;
}

/* A save's staging variable of @v, holding the session's value. */
static const char *stage_out(staging *sg, ps_client *c, ps_session *sess, ps_variable *v,
                             ps_status *st) {
  const ps_tensor *val = ps_session_local_value_(sess, v);
  if (val == NULL) return ps_var_uninitialized(v->name, st), NULL;
  const char *name = staging_create(sg, c, v, st);
  if (name == NULL) return NULL;
  ps_update u = {.name = name, .op = PS_ASSIGN, .value = val};
  return ps_client_update(c, 0, &u, 1, st) == 0 ? name : NULL;
}

/* The session's @v as stored under @key of @prefix, read through a
 * staging variable into *@out; nothing the session holds changes. */
static int stage_in(staging *sg, ps_client *c, ps_variable *v, const char *key,
                    const char *prefix, ps_tensor **out, ps_status *st) {
  const char *name = staging_create(sg, c, v, st);
  if (name == NULL) return st->code;
  const char *k = key ? key : v->name;
  if (ps_client_restore_vars(c, 0, prefix, &name, &k, 1, st) != 0) return st->code;
  ps_read rd = {.name = name};
  if (ps_client_read(c, 0, &rd, 1, st) != 0) return st->code;
  *out = rd.out;
  return 0;
}

/* What a save writes: the Saver's variables (every global variable of the
 * graph, or its var_list) with their ps task and checkpoint key; those the
 * session holds through staging variables (@sg). */
static int saver_items(const ps_saver *s, ps_session *sess, ps_client *c, staging *sg,
                       ps_save_item **items, size_t *n, ps_status *st) {
  size_t ng = 0;
  ps_variable *const *gv = NULL;
  if (s->all) gv = ps_collection_variables(s->g, PS_GLOBAL_VARIABLES, &ng);
  size_t cap = s->all ? ng : s->n;
  *n = 0;
  if ((*items = calloc(cap + 1, sizeof **items)) == NULL)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  int rc = 0;
  for (size_t i = 0; i < cap && rc == 0; i++) {
    ps_variable *v = s->all ? gv[i] : ps_graph_find_var_(s->g, s->vars[i]);
    const char *key = s->all ? NULL : s->keys[i];
    if (v == NULL) {
      rc = ps_status_set(st, PS_NOT_FOUND, "Saver: variable %s is not in the graph",
                         s->vars[i]);
    } else if (v->task < 0) { /* held by the session */
      const char *name = stage_out(sg, c, sess, v, st);
      if (name == NULL) rc = st->code;
      (*items)[(*n)++] = (ps_save_item){0, name, key ? key : v->name};
    } else {
      (*items)[(*n)++] = (ps_save_item){v->task, v->name, key};
    }
  }
  if (rc != 0) {
    free(*items);
    *items = NULL;
    *n = 0;
  }
  return rc;
}

/* A save's .meta written by this worker: <meta_dir>/<checkpoint>.meta,
 * once the checkpoint's name is known (ps_save_options.on_name). */
typedef struct meta_file {
  const ps_saver *s;
  const char *dir;
  char path[2048];
} meta_file;

static int write_meta(void *arg, const char *prefix, ps_status *st) {
  meta_file *m = arg;
  snprintf(m->path, sizeof m->path, "%s/%s.meta", m->dir, prefix);
  if (ps_export_meta_graph(m->s->g, m->s, m->path, st) != 0) {
    m->path[0] = '\0';
    return st->code;
  }
  return 0;
}

/* ps_saver_save and ps_saver_save_at_step: @step_var (may be NULL) names
 * the checkpoint by its value in the save's snapshot; else @global_step. */
static int save(ps_saver *s, ps_session *sess, const char *prefix, int64_t global_step,
                const ps_variable *step_var, const char *meta_dir, char **path,
                int64_t *saved_step, ps_status *st) {
  ps_client *c = ps_session_client(sess);
  if (c == NULL)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Saver: the session has no ps cluster to save");
  char full[1024];
  if (prefix == NULL || prefix[0] == '\0') prefix = "model.ckpt";
  if (global_step >= 0 && step_var == NULL)
    snprintf(full, sizeof full, "%s-%lld", prefix, (long long)global_step);
  else
    snprintf(full, sizeof full, "%s", prefix);
  ps_save_item *items = NULL;
  size_t nitems = 0;
  staging sg = {0};
  int rc = saver_items(s, sess, c, &sg, &items, &nitems, st);
  if (rc != 0) {
    staging_free(&sg, c);
    return rc;
  }
  /* TensorFlow's write_meta_graph=True: the .meta goes with the save to the
   * ps that merges it (meta_dir: written here instead) */
  uint8_t *meta = NULL;
  size_t meta_len = 0;
  if (meta_dir == NULL && !s->no_meta_graph) {
    meta = ps_meta_graph_serialize(s->g, s, &meta_len, st);
    if (meta == NULL) {
      free(items);
      staging_free(&sg, c);
      return st->code;
    }
    if (meta_len > PS_SAVER_META_MAX) {
      PS_WARN("MetaGraph of %s is %zu bytes, more than the %d a save carries: no .meta "
              "(give ps_saver_save a meta_dir to write it there)",
              full, meta_len, PS_SAVER_META_MAX);
      free(meta);
      meta = NULL;
    }
  }
  /* The meta graph goes first: once the state file names the checkpoint,
   * its .meta is there too. */
  meta_file mf = {.s = s, .dir = meta_dir};
  int64_t step = global_step;
  ps_save_options o = {.select = true,
                       .meta_graph = meta,
                       .meta_graph_len = meta ? meta_len : 0,
                       .items = items,
                       .nitems = nitems,
                       .max_to_keep = s->max_to_keep,
                       .keep_every_n_hours = s->keep_hours,
                       .own = s->dir_retention ? NULL : &s->own,
                       .step_name = step_var ? step_var->name : NULL,
                       .step_task = step_var ? step_var->task : 0,
                       .step = &step,
                       .on_name = meta_dir ? write_meta : NULL,
                       .on_name_arg = &mf};
  char *written = NULL;
  int64_t bytes = 0;
  rc = ps_client_save(c, full, &o, &written, &bytes, st);
  free(items);
  free(meta);
  staging_free(&sg, c);
  if (rc != 0) {
    if (mf.path[0]) unlink(mf.path); /* no checkpoint: no .meta of its own either */
    return st->code;
  }
  PS_INFO("saved checkpoint %s (%lld bytes)", written ? written : full, (long long)bytes);
  if (saved_step) *saved_step = step;
  if (path)
    *path = written;
  else
    free(written);
  return 0;
}

int ps_saver_save(ps_saver *s, ps_session *sess, const char *prefix, int64_t global_step,
                  const char *meta_dir, char **path, ps_status *st) {
  return save(s, sess, prefix, global_step, NULL, meta_dir, path, NULL, st);
}

int ps_saver_save_at_step(ps_saver *s, ps_session *sess, const char *prefix,
                          ps_variable *global_step, const char *meta_dir, char **path,
                          int64_t *saved_step, ps_status *st) {
  ps_node *r = ps_variable_value(global_step);
  if (r == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "Saver: no global_step variable");
  /* on a ps: read inside the save's snapshot (the session must know it) */
  if (global_step->task >= 0 && ps_session_client(sess) != NULL)
    return save(s, sess, prefix, -1, global_step, meta_dir, path, saved_step, st);
  ps_tensor *t = NULL;
  if (ps_session_run(sess, NULL, 0, &r, 1, NULL, 0, &t, st) != 0) return st->code;
  int64_t step = ps_tensor_num_elements(t) == 1
                     ? (int64_t)ps_elem_get(t->dtype, ps_tensor_data(t), 0)
                     : -1;
  ps_tensor_destroy(t);
  if (step < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Saver: global_step %s is not a non-negative scalar",
                         ps_variable_name(global_step));
  return save(s, sess, prefix, step, NULL, meta_dir, path, saved_step, st);
}

/* Restores @vars[0..n) on their ps tasks, each task's in one call (a ps
 * restores its part all or nothing). */
static int restore_tasks(ps_client *c, ps_variable **vars, const char **keys, size_t n,
                         const char *prefix, ps_status *st) {
  int nps = ps_client_num_ps(c), rc = 0;
  const char **names = calloc(n + 1, sizeof *names);
  const char **tk = calloc(n + 1, sizeof *tk);
  if (names == NULL || tk == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (int t = 0; t < nps && rc == 0; t++) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
      if (vars[i]->task == t) {
        names[k] = vars[i]->name;
        tk[k++] = keys[i];
      }
    if (k == 0) continue;
    rc = ps_client_restore_vars(c, t, prefix, names, tk, k, st);
  }
  free(names);
  free(tk);
  return rc;
}

/* The check before a restore of @vars[0..n) that takes more than one call
 * (several ps, or variables held by the session, staged through a ps): on
 * every ps at once, nothing changed.  *@checked receives the path of the
 * checkpoint every ps checked (NULL when no check was needed): every later
 * call restores from it, so "the latest" is resolved once. */
static int check_tasks(ps_client *c, ps_variable **vars, const char **keys, size_t n,
                       const char *prefix, char **checked, ps_status *st) {
  int nps = ps_client_num_ps(c), ntasks = 0;
  bool held = false;
  *checked = NULL;
  for (size_t i = 0; i < n; i++)
    held |= vars[i]->task < 0;
  for (int t = 0; t < nps; t++) {
    size_t i = 0;
    while (i < n && vars[i]->task != t)
      i++;
    ntasks += i < n;
  }
  if (ntasks + held < 2 || ntasks == 0) return 0;
  const char **names = calloc(n + 1, sizeof *names);
  const char **tk = calloc(n + 1, sizeof *tk);
  const char *const **pn = calloc((size_t)nps + 1, sizeof *pn);
  const char *const **pk = calloc((size_t)nps + 1, sizeof *pk);
  size_t *cnt = calloc((size_t)nps + 1, sizeof *cnt);
  int rc = 0;
  if (names == NULL || tk == NULL || pn == NULL || pk == NULL || cnt == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  size_t k = 0;
  for (int t = 0; t < nps && rc == 0; t++) {
    pn[t] = names + k;
    pk[t] = tk + k;
    for (size_t i = 0; i < n; i++)
      if (vars[i]->task == t) {
        names[k] = vars[i]->name;
        tk[k++] = keys[i];
        cnt[t]++;
      }
  }
  if (rc == 0) rc = ps_client_check_restore_all(c, prefix, pn, pk, cnt, checked, st);
  free(cnt);
  free(pk);
  free(pn);
  free(tk);
  free(names);
  return rc;
}

/* Name and key of each variable to restore, grouped by ps task. */
int ps_saver_restore(ps_saver *s, ps_session *sess, const char *prefix, ps_status *st) {
  ps_client *c = ps_session_client(sess);
  ps_graph *g = s->g;
  if (c == NULL)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "Saver: the session has no ps cluster to restore into");
  if (ps_session_create_variables(sess, st) != 0) return st->code;
  size_t n = 0;
  ps_variable **vars = NULL;
  const char **keys = NULL;
  int rc = 0;
  if (s->all) {
    size_t ng;
    ps_variable *const *gv = ps_collection_variables(g, PS_GLOBAL_VARIABLES, &ng);
    vars = calloc(ng + 1, sizeof *vars);
    keys = calloc(ng + 1, sizeof *keys);
    if (vars == NULL || keys == NULL) goto oom;
    for (size_t i = 0; i < ng; i++)
      vars[n++] = gv[i];
  } else {
    vars = calloc(s->n + 1, sizeof *vars);
    keys = calloc(s->n + 1, sizeof *keys);
    if (vars == NULL || keys == NULL) goto oom;
    for (size_t i = 0; i < s->n; i++) {
      ps_variable *v = ps_graph_find_var_(g, s->vars[i]);
      if (v == NULL) {
        rc = ps_status_set(st, PS_NOT_FOUND, "Saver: variable %s is not in the graph",
                           s->vars[i]);
        goto done;
      }
      keys[n] = s->keys[i];
      vars[n++] = v;
    }
  }
  int nps = ps_client_num_ps(c);
  for (size_t i = 0; i < n && rc == 0; i++)
    if (vars[i]->task >= nps)
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Saver: variable %s is placed on /job:ps/task:%d but the "
                         "cluster has %d ps tasks",
                         vars[i]->name, vars[i]->task, nps);
  /* All or nothing, as TensorFlow's restore: every ps checks its part
   * (keys, dtypes, shapes, checksums) and the session's variables are read
   * through staging variables before any variable changes. */
  char *checked = NULL;
  if (rc == 0) rc = check_tasks(c, vars, keys, n, prefix ? prefix : "", &checked, st);
  if (checked) prefix = checked; /* "the latest" resolved once */
  ps_tensor **held = calloc(n + 1, sizeof *held);
  if (held == NULL) {
    free(checked);
    goto oom;
  }
  staging sg = {0};
  for (size_t i = 0; i < n && rc == 0; i++) /* held by the session */
    if (vars[i]->task < 0)
      rc = stage_in(&sg, c, vars[i], keys[i], prefix ? prefix : "", &held[i], st);
  staging_free(&sg, c);
  if (rc == 0) rc = restore_tasks(c, vars, keys, n, prefix ? prefix : "", st);
  free(checked);
  for (size_t i = 0; i < n; i++) {
    if (rc == 0 && held[i]) {
      rc = ps_session_set_local_value_(sess, vars[i], held[i], st);
      held[i] = NULL; /* taken, or freed on failure */
    }
    ps_tensor_destroy(held[i]);
  }
  free(held);
  goto done;
oom:
  rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
done:
  free(vars);
  free(keys);
  return rc;
}

/* ---- export ---- */

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

static bool is_part_op(const ps_node *n) {
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
  } else if (is_part_op(n)) {
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

/* ---- import ---- */

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
       kind == PS_OPK_VAR_IS_INIT || n->def == &ps_op_variable_def_) &&
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
  bool part_op = is_part_op(n);
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
  ps_saver *s = saver_new(im->g);
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
    if (saver_add(s, d->variable[i], key) != 0)
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
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    ps_status_set(st, ps_status_code_from_errno(errno), "MetaGraph %s: %s", path,
                  strerror(errno));
    return NULL;
  }
  uint8_t *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (ps_array_grow(&buf, &cap, n + (1 << 16), 1) != 0) {
      free(buf);
      fclose(f);
      ps_status_set(st, PS_RESOURCE_EXHAUSTED, "MetaGraph %s: out of memory", path);
      return NULL;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
  }
  bool err = ferror(f);
  fclose(f);
  if (err) {
    free(buf);
    ps_status_set(st, PS_INTERNAL, "MetaGraph %s: read error", path);
    return NULL;
  }
  ps_graph *g = ps_meta_graph_parse(buf, n, path, saver, st);
  free(buf);
  return g;
}
