/* Scopes: name scopes (a node's name is "<name scope>/<hint>", each scope
 * opened under a unique name, TensorFlow's tf.name_scope) and variable
 * scopes (tf.variable_scope: the prefix of a variable's name and its
 * reuse), and the root scopes a graph function runs under. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/appendf.h"
#include "common/array.h"
#include "graph_priv.h"
#include "node.h"

/* ---- name scopes ---- */

/* The full name scope that pushing @name opens (malloc'd), or NULL with
 * @st set. */
static char *name_scope_for(ps_graph *g, const char *name, ps_status *st) {
  size_t len = name ? strlen(name) : 0;
  char full[PS_NAME_MAX];
  if (len > 0 && name[len - 1] != '/') ps_graph_scoped_name_(g, name, full, sizeof full);
  if (len >= PS_NAME_MAX - 1 ||
      (len > 0 && name[len - 1] != '/' && strlen(full) >= PS_NAME_MAX - 1)) {
    ps_status_set(st, PS_INVALID_ARGUMENT,
                  "name scope %.64s...: longer than %d bytes with its scopes", name,
                  PS_NAME_MAX - 2);
    return NULL;
  }
  char *u;
  if (len == 0)
    u = strdup(""); /* the root */
  else if (name[len - 1] == '/')
    u = strndup(name, len - 1); /* re-entered exactly */
  else
    u = ps_graph_unique_name_(g, full);
  if (u == NULL) ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  return u;
}

int ps_name_scope_push(ps_graph *g, const char *name, ps_status *st) {
  ps_status local;
  if (g == NULL) return ps_status_set(st, PS_INVALID_ARGUMENT, "name scope: no graph");
  if (g->nscope >= PS_MAX_SCOPE)
    ps_status_set(&local, PS_RESOURCE_EXHAUSTED, "name scope %.64s: more than %d nested",
                  name ? name : "", PS_MAX_SCOPE);
  char *full = g->nscope < PS_MAX_SCOPE ? name_scope_for(g, name, &local) : NULL;
  if (full == NULL) {
    ps_graph_fail(g, local.code, "%s", local.msg);
    return ps_status_set(st, local.code, "%s", local.msg);
  }
  g->scope[g->nscope++] = full;
  return 0;
}

void ps_name_scope_pop(ps_graph *g) {
  if (g == NULL || g->nscope <= 0) return;
  g->nscope--;
  free(g->scope[g->nscope]);
  g->scope[g->nscope] = NULL;
}

/* ---- scopes cleared for a graph function (node.h) ---- */

ps_scope_mark ps_graph_scopes_clear_(ps_graph *g) {
  ps_scope_mark m = {g->nscope, g->nvscope};
  /* the root scopes, pushed on top so nothing below is overwritten */
  if (ps_name_scope_push(g, "", NULL) == 0) {
    if (g->nvscope < PS_MAX_SCOPE)
      g->vscope[g->nvscope++] = NULL;
    else
      ps_name_scope_pop(g);
  }
  return m;
}

void ps_graph_scopes_restore_(ps_graph *g, ps_scope_mark m) {
  while (g->nscope > m.nscope)
    ps_name_scope_pop(g);
  if (g->nvscope > m.nvscope) g->nvscope = m.nvscope;
}

/* ---- variable scopes ---- */

/* Opens a new scope object named @full with @reuse, and the name scope
 * @ns (unique below the current one). */
static int vscope_open(ps_graph *g, const char *full, const char *ns, ps_reuse reuse,
                       ps_status *st) {
  if (g->nvscope >= PS_MAX_SCOPE) {
    ps_graph_fail(g, PS_RESOURCE_EXHAUSTED, "variable scope %.64s: more than %d nested",
                  full, PS_MAX_SCOPE);
    return ps_status_set(st, g->st.code, "%s", g->st.msg);
  }
  if (strlen(full) >= PS_NAME_MAX - 1) {
    ps_graph_fail(g, PS_INVALID_ARGUMENT,
                  "variable scope %.64s...: longer than %d bytes with its scopes", full,
                  PS_NAME_MAX - 2);
    return ps_status_set(st, g->st.code, "%s", g->st.msg);
  }
  ps_variable_scope *o = calloc(1, sizeof *o);
  if (o == NULL || (o->name = strdup(full)) == NULL ||
      ps_array_grow(&g->vsobjs, NULL, g->nvsobjs + 1, sizeof *g->vsobjs) != 0) {
    if (o) free(o->name);
    free(o);
    ps_graph_oom_(g);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  g->vsobjs[g->nvsobjs++] = o;
  o->reuse = reuse;
  if (ps_name_scope_push(g, ns, st) != 0) return -1; /* @o stays with the graph */
  const char *opened = g->scope[g->nscope - 1];
  size_t len = strlen(opened);
  if ((o->original_name_scope = malloc(len + 2)) == NULL) {
    ps_name_scope_pop(g);
    ps_graph_oom_(g);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  memcpy(o->original_name_scope, opened, len);
  memcpy(o->original_name_scope + len, "/", 2);
  if (len == 0) o->original_name_scope[0] = '\0';
  g->vscope[g->nvscope++] = o;
  return 0;
}

int ps_variable_scope_push(ps_graph *g, const char *name, ps_reuse reuse, ps_status *st) {
  if (g == NULL || name == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "variable scope: no %s",
                         g ? "name" : "graph");
  ps_variable_scope *top = g->nvscope > 0 ? g->vscope[g->nvscope - 1] : NULL;
  ps_reuse eff = reuse;
  if (top && top->reuse != PS_REUSE_NONE && reuse == PS_REUSE_NONE) eff = top->reuse;
  char full[PS_NAME_MAX];
  snprintf(full, sizeof full, "%s%s%s", top && top->name[0] ? top->name : "",
           top && top->name[0] ? "/" : "", name);
  return vscope_open(g, full, name, eff, st);
}

int ps_variable_scope_push_scope(ps_graph *g, ps_variable_scope *scope, ps_reuse reuse,
                                 ps_status *st) {
  if (g == NULL || scope == NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "variable scope: no %s",
                         g ? "scope" : "graph");
  const char *last = strrchr(scope->name, '/');
  last = last ? last + 1 : scope->name;
  return vscope_open(g, scope->name, last, reuse != PS_REUSE_NONE ? reuse : scope->reuse,
                     st);
}

ps_variable_scope *ps_variable_scope_current(ps_graph *g) {
  return g && g->nvscope > 0 ? g->vscope[g->nvscope - 1] : NULL;
}

void ps_variable_scope_reuse_variables(ps_variable_scope *scope) {
  if (scope) scope->reuse = PS_REUSE_TRUE;
}

const char *ps_variable_scope_name(const ps_variable_scope *scope) {
  return scope ? scope->name : NULL;
}

const char *ps_variable_scope_original_name_scope(const ps_variable_scope *scope) {
  return scope ? scope->original_name_scope : NULL;
}

ps_reuse ps_variable_scope_reuse(const ps_variable_scope *scope) {
  return scope ? scope->reuse : PS_REUSE_NONE;
}

void ps_variable_scope_pop(ps_graph *g) {
  if (g == NULL || g->nvscope <= 0) return;
  g->nvscope--;
  ps_name_scope_pop(g);
}

int ps_graph_vscope_name_(const ps_graph *g, const char *name, char *out, size_t n,
                          ps_reuse *reuse, ps_status *st) {
  size_t off = 0;
  int rc = 0;
  const ps_variable_scope *top = g->nvscope > 0 ? g->vscope[g->nvscope - 1] : NULL;
  out[0] = '\0';
  if (top && top->name[0]) rc |= ps_appendf(out, n, &off, "%s/", top->name);
  rc |= ps_appendf(out, n, &off, "%s", name);
  if (rc != 0) {
    out[0] = '\0';
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %.64s...: the name with its variable scopes is longer "
                         "than %zu bytes",
                         name, n - 1);
  }
  *reuse = top ? top->reuse : PS_REUSE_NONE;
  return 0;
}
