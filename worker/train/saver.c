/* The Saver object (paramserver/saver.h): which variables a save writes,
 * under which keys, and how many checkpoints it keeps.  Its save and
 * restore are in saver_ckpt.c, its MetaGraph form in metagraph_export.c
 * and metagraph_import.c. */
#include <stdlib.h>
#include <string.h>

#include "common/variable.h"
#include "saver_internal.h"

ps_saver *ps_saver_new_(ps_graph *g) {
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

int ps_saver_add_(ps_saver *s, const char *var, const char *key) {
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
  ps_saver *s = ps_saver_new_(g);
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
    if (ps_saver_add_(s, v->name, key) != 0) {
      ps_saver_destroy(s);
      ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
      return NULL;
    }
  }
  return s;
}
