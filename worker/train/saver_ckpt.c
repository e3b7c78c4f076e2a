/* The Saver's save and restore (paramserver/saver.h): a checkpoint lives
 * on the ps tasks, written and read through the client; the variables the
 * session holds itself go through staging variables on ps 0, and a save
 * carries its MetaGraph (metagraph_export.c) along. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/array.h"
#include "common/log.h"
#include "common/variable.h"
#include "saver_internal.h"
#include "train_internal.h"

/* The largest MetaGraph a save carries to the ps (well inside a message). */
#define PS_SAVER_META_MAX (16 << 20)

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
  size_t ntables = 0;
  ps_graph_tables_(s->g, &ntables);
  ps_save_options o = {.select = true,
                       .tables = ntables > 0,
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
  /* the graph's embedding tables: checked on every ps too, before anything
   * changes, then restored after the variables */
  size_t ntab = 0;
  ps_embedding_table *const *tabs = ps_graph_tables_(g, &ntab);
  for (size_t i = 0; i < ntab && rc == 0; i++) {
    const char *tn = ps_embedding_table_spec(tabs[i])->name;
    rc = ps_client_table_create(c, ps_embedding_table_spec(tabs[i]), st);
    for (int t = 0; t < nps && rc == 0; t++)
      rc = ps_client_check_restore_vars(c, t, prefix ? prefix : "", &tn, &tn, 1, st);
  }
  if (rc == 0) rc = restore_tasks(c, vars, keys, n, prefix ? prefix : "", st);
  for (size_t i = 0; i < ntab && rc == 0; i++) {
    const char *tn = ps_embedding_table_spec(tabs[i])->name;
    for (int t = 0; t < nps && rc == 0; t++)
      rc = ps_client_restore_vars(c, t, prefix ? prefix : "", &tn, &tn, 1, st);
  }
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
