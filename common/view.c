/* The replication view (view.h): placement, the JSON codec, and the
 * transitions membership applies with a compare-and-swap in etcd.
 *
 * Everything here is a pure function of its arguments, so two ps tasks
 * that compute one transition from one view write the same bytes: the
 * encoder prints a fixed key order and no floating point, and the
 * transitions visit shards and replicas in index order.
 *
 * The decoder reads a value from etcd, which is outside input: json-c in
 * strict mode with UTF-8 validation and its default depth limit, a size
 * cap, every key known, every number an integer in its range, and the
 * invariants the transitions rely on (a task at most once per shard, the
 * primary in sync, since <= epoch).  A view that decodes can go through
 * every transition; what they produce encodes and decodes again. */
#include "view.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "appendf.h"

/* Epochs stay below this, so that epoch + 1 never overflows and a
 * saturated json-c integer (INT64_MAX) is refused. */
#define MAX_EPOCH (INT64_MAX - 1)

/* ---- placement -------------------------------------------------------- */

/* @hosts NULL: one host.  A NULL entry is a host of its own. */
static bool same_host(const char *const *hosts, int a, int b) {
  if (hosts == NULL || a == b) return true;
  if (hosts[a] == NULL || hosts[b] == NULL) return false;
  return strcmp(hosts[a], hosts[b]) == 0;
}

int ps_view_placement(int ntasks, int replicas, const char *const *hosts, int s,
                      int *tasks) {
  if (ntasks < 1 || ntasks > PS_VIEW_MAX_TASKS || s < 0 || s >= ntasks || replicas < 1)
    return 0;
  int r = replicas;
  if (r > PS_VIEW_MAX_REPLICAS) r = PS_VIEW_MAX_REPLICAS;
  if (r > ntasks) r = ntasks;
  tasks[0] = s;
  for (int k = 1; k < r; k++) {
    int pick = -1, first = -1;
    for (int d = 1; d < ntasks && pick < 0; d++) {
      int t = (s + d) % ntasks;
      bool taken = false, host_used = false;
      for (int j = 0; j < k; j++) {
        taken |= tasks[j] == t;
        host_used |= same_host(hosts, tasks[j], t);
      }
      if (taken) continue;
      if (first < 0) first = t;
      if (!host_used) pick = t;
    }
    tasks[k] = pick >= 0 ? pick : first;
  }
  return r;
}

/* ---- construction ----------------------------------------------------- */

static int view_alloc(ps_view *v, int ntasks, ps_status *st) {
  memset(v, 0, sizeof *v);
  v->shard = calloc((size_t)ntasks, sizeof *v->shard);
  v->joined = calloc((size_t)ntasks, sizeof *v->joined);
  if (v->shard == NULL || v->joined == NULL) {
    ps_view_free(v);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "view: out of memory (%d tasks)",
                         ntasks);
  }
  v->ntasks = ntasks;
  return 0;
}

void ps_view_free(ps_view *v) {
  if (v == NULL) return;
  free(v->shard);
  free(v->joined);
  memset(v, 0, sizeof *v);
}

int ps_view_copy(const ps_view *v, ps_view *out, ps_status *st) {
  ps_view c;
  if (v == NULL || v->ntasks < 1 || v->ntasks > PS_VIEW_MAX_TASKS)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: copy of an empty view");
  int rc = view_alloc(&c, v->ntasks, st);
  if (rc != 0) return rc;
  c.epoch = v->epoch;
  c.replicas = v->replicas;
  memcpy(c.shard, v->shard, (size_t)v->ntasks * sizeof *c.shard);
  memcpy(c.joined, v->joined, (size_t)v->ntasks * sizeof *c.joined);
  *out = c;
  return 0;
}

int ps_view_initial(int ntasks, int replicas, const char *const *hosts, ps_view *out,
                    ps_status *st) {
  if (ntasks < 1 || ntasks > PS_VIEW_MAX_TASKS)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: %d ps tasks (a replicated job has 1 to %d)", ntasks,
                         PS_VIEW_MAX_TASKS);
  if (replicas < 2 || replicas > PS_VIEW_MAX_REPLICAS)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "--replicas %d is out of range (a replicated view has 2 to %d)",
                         replicas, PS_VIEW_MAX_REPLICAS);
  if (replicas > ntasks)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "--replicas %d needs at least %d ps tasks, the cluster has %d",
                         replicas, replicas, ntasks);
  ps_view v;
  int rc = view_alloc(&v, ntasks, st);
  if (rc != 0) return rc;
  v.epoch = 1;
  v.replicas = replicas;
  for (int s = 0; s < ntasks; s++) {
    ps_view_shard *sh = &v.shard[s];
    sh->n = ps_view_placement(ntasks, replicas, hosts, s, sh->task);
    sh->since = 1;
  }
  *out = v;
  return 0;
}

/* ---- queries ---------------------------------------------------------- */

int ps_view_primary(const ps_view *v, int s) {
  if (v == NULL || s < 0 || s >= v->ntasks || v->shard[s].n < 1) return -1;
  return v->shard[s].task[0];
}

static int index_of(const ps_view_shard *sh, int task) {
  for (int i = 0; i < sh->n; i++)
    if (sh->task[i] == task) return i;
  return -1;
}

int ps_view_role(const ps_view *v, int s, int task, bool *is_primary) {
  if (is_primary) *is_primary = false;
  if (v == NULL || s < 0 || s >= v->ntasks) return -1;
  int i = index_of(&v->shard[s], task);
  if (i < 0) return -1;
  if (is_primary) *is_primary = i == 0;
  return v->shard[s].state[i];
}

/* Everything but the epoch. */
static bool same_content(const ps_view *a, const ps_view *b) {
  if (a->replicas != b->replicas || a->ntasks != b->ntasks) return false;
  for (int s = 0; s < a->ntasks; s++) {
    const ps_view_shard *x = &a->shard[s], *y = &b->shard[s];
    if (a->joined[s] != b->joined[s] || x->n != y->n || x->since != y->since)
      return false;
    for (int i = 0; i < x->n; i++)
      if (x->task[i] != y->task[i] || x->state[i] != y->state[i]) return false;
  }
  return true;
}

bool ps_view_equal(const ps_view *a, const ps_view *b) {
  if (a == NULL || b == NULL) return a == b;
  return a->epoch == b->epoch && same_content(a, b);
}

/* ---- JSON out --------------------------------------------------------- */

char *ps_view_encode(const ps_view *v) {
  if (v == NULL || v->ntasks < 1 || v->ntasks > PS_VIEW_MAX_TASKS) return NULL;
  /* Bounds: a joined entry ",false" is 6 bytes; a shard is at most
   * {"replicas":[4095,4095,4095],"syncing":[4095,4095],"since":<20>}, < 120. */
  size_t cap = 128 + (size_t)v->ntasks * (6 + 120);
  char *buf = malloc(cap);
  if (buf == NULL) return NULL;
  size_t off = 0;
  buf[0] = '\0';
  int rc = ps_appendf(buf, cap, &off, "{\"epoch\":%lld,\"replicas\":%d,\"joined\":[",
                      (long long)v->epoch, v->replicas);
  for (int t = 0; t < v->ntasks; t++)
    rc |=
        ps_appendf(buf, cap, &off, "%s%s", t ? "," : "", v->joined[t] ? "true" : "false");
  rc |= ps_appendf(buf, cap, &off, "],\"shards\":[");
  for (int s = 0; s < v->ntasks; s++) {
    const ps_view_shard *sh = &v->shard[s];
    rc |= ps_appendf(buf, cap, &off, "%s{\"replicas\":[", s ? "," : "");
    for (int i = 0; i < sh->n; i++)
      rc |= ps_appendf(buf, cap, &off, "%s%d", i ? "," : "", sh->task[i]);
    rc |= ps_appendf(buf, cap, &off, "],\"syncing\":[");
    for (int i = 0, k = 0; i < sh->n; i++)
      if (sh->state[i] == PS_REPLICA_SYNCING)
        rc |= ps_appendf(buf, cap, &off, "%s%d", k++ ? "," : "", sh->task[i]);
    rc |= ps_appendf(buf, cap, &off, "],\"since\":%lld}", (long long)sh->since);
  }
  rc |= ps_appendf(buf, cap, &off, "]}");
  if (rc != 0) { /* cannot happen with the bound above; never emit a cut view */
    free(buf);
    return NULL;
  }
  return buf;
}

/* ---- JSON in ---------------------------------------------------------- */

/* A printable, bounded copy of untrusted text for a message. */
static const char *show(const char *s, char *buf, size_t bn) {
  size_t i = 0, o = 0;
  for (; s[i] != '\0' && o + 4 < bn; i++) {
    unsigned char c = (unsigned char)s[i];
    buf[o++] = (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') ? '?' : (char)c;
  }
  if (s[i] != '\0') {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o] = '\0';
  return buf;
}

static json_object *parse_json(const char *text, size_t len, ps_status *st) {
  const char *nul = memchr(text, '\0', len);
  if (nul != NULL)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: invalid JSON: NUL byte at offset %zu",
                         (size_t)(nul - text)),
           NULL;
  /* json-c ends a top-level number only at the terminating NUL: hand it a
   * NUL-terminated copy, NUL included. */
  char *copy = malloc(len + 1);
  struct json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
  if (copy == NULL || tok == NULL) {
    free(copy);
    if (tok) json_tokener_free(tok);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "view: out of memory"), NULL;
  }
  memcpy(copy, text, len);
  copy[len] = '\0';
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
  json_object *o = json_tokener_parse_ex(tok, copy, (int)len + 1);
  enum json_tokener_error err = json_tokener_get_error(tok);
  if (o == NULL || err != json_tokener_success) {
    size_t end = json_tokener_get_parse_end(tok);
    const char *what = json_tokener_error_desc(err);
    if (len == 0 || err == json_tokener_continue) what = "unexpected end of data";
    ps_status_set(st, PS_INVALID_ARGUMENT, "view: invalid JSON at offset %zu: %s",
                  end > len ? len : end, what);
    json_object_put(o);
    o = NULL;
  }
  json_tokener_free(tok);
  free(copy);
  return o;
}

/* @o's keys are exactly @keys (@n of them): fills @vals in that order.
 * @where prefixes messages ("view", "view: shard 3"). */
static int get_keys(json_object *o, const char *const *keys, json_object **vals, int n,
                    const char *where, ps_status *st) {
  char b[64];
  bool seen[8] = {false}; /* (a JSON null is a NULL value, not a missing key) */
  for (int i = 0; i < n; i++)
    vals[i] = NULL;
  json_object_object_foreach(o, key, val) {
    int i = 0;
    while (i < n && strcmp(key, keys[i]) != 0)
      i++;
    if (i == n)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: unknown key \"%s\"", where,
                           show(key, b, sizeof b));
    vals[i] = val;
    seen[i] = true;
  }
  for (int i = 0; i < n; i++)
    if (!seen[i])
      return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: \"%s\" is missing", where,
                           keys[i]);
  return 0;
}

/* An integer in [lo, hi] (json-c saturates what does not fit in int64, so
 * @hi < INT64_MAX refuses those too). */
static bool get_int(json_object *o, int64_t lo, int64_t hi, int64_t *out) {
  if (!json_object_is_type(o, json_type_int)) return false;
  int64_t v = json_object_get_int64(o);
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* A list of at most @max task indices (< @ntasks), each once. */
static int get_tasks(json_object *a, const char *name, int max, int ntasks, int *out,
                     int *n, int s, ps_status *st) {
  if (!json_object_is_type(a, json_type_array))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: shard %d: \"%s\" must be a list of task indices", s,
                         name);
  size_t len = json_object_array_length(a);
  if (len > (size_t)max)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: shard %d: \"%s\" lists %zu tasks (at most %d)", s, name,
                         len, max);
  for (size_t i = 0; i < len; i++) {
    int64_t t;
    if (!get_int(json_object_array_get_idx(a, i), 0, ntasks - 1, &t))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "view: shard %d: %s[%zu] must be a task index from 0 to %d", s,
                           name, i, ntasks - 1);
    for (size_t j = 0; j < i; j++)
      if (out[j] == (int)t)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "view: shard %d: \"%s\" lists task %d twice", s, name,
                             (int)t);
    out[i] = (int)t;
  }
  *n = (int)len;
  return 0;
}

static int shard_from_json(json_object *o, int s, ps_view *v, ps_status *st) {
  static const char *const keys[] = {"replicas", "syncing", "since"};
  json_object *val[3];
  char where[48];
  snprintf(where, sizeof where, "view: shard %d", s);
  if (!json_object_is_type(o, json_type_object))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s must be an object", where);
  int rc = get_keys(o, keys, val, 3, where, st);
  if (rc != 0) return rc;
  ps_view_shard *sh = &v->shard[s];
  rc = get_tasks(val[0], "replicas", v->replicas, v->ntasks, sh->task, &sh->n, s, st);
  if (rc != 0) return rc;
  int sync[PS_VIEW_MAX_REPLICAS], nsync = 0;
  rc = get_tasks(val[1], "syncing", v->replicas, v->ntasks, sync, &nsync, s, st);
  if (rc != 0) return rc;
  for (int k = 0; k < nsync; k++) {
    int i = index_of(sh, sync[k]);
    if (i < 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: syncing task %d is not one of its replicas", where,
                           sync[k]);
    if (i == 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: its primary (task %d) cannot be syncing", where, sync[k]);
    sh->state[i] = PS_REPLICA_SYNCING;
  }
  if (!get_int(val[2], 1, v->epoch, &sh->since))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: \"since\" must be an epoch from 1 to the view's (%lld)",
                         where, (long long)v->epoch);
  return 0;
}

static int view_from_json(json_object *top, int ntasks, ps_view *out, ps_status *st) {
  static const char *const keys[] = {"epoch", "replicas", "joined", "shards"};
  json_object *val[4];
  if (!json_object_is_type(top, json_type_object))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: not a JSON object");
  int rc = get_keys(top, keys, val, 4, "view", st);
  if (rc != 0) return rc;
  int64_t epoch, replicas;
  if (!get_int(val[0], 1, MAX_EPOCH, &epoch))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: \"epoch\" must be a whole number from 1 to %lld",
                         (long long)MAX_EPOCH);
  if (!get_int(val[1], 2, PS_VIEW_MAX_REPLICAS, &replicas))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: \"replicas\" must be 2 to %d",
                         PS_VIEW_MAX_REPLICAS);
  json_object *joined = val[2], *shards = val[3];
  if (!json_object_is_type(joined, json_type_array))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: \"joined\" must be a list of true/false");
  if (!json_object_is_type(shards, json_type_array))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: \"shards\" must be a list of objects");
  size_t n = json_object_array_length(joined);
  if (n < 1 || n > PS_VIEW_MAX_TASKS)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: \"joined\" lists %zu tasks (1 to %d)", n,
                         PS_VIEW_MAX_TASKS);
  if (ntasks > 0 && n != (size_t)ntasks)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: it has %zu ps tasks, the cluster has %d", n, ntasks);
  if (json_object_array_length(shards) != n)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: \"shards\" lists %zu shards for %zu ps tasks",
                         json_object_array_length(shards), n);
  if ((size_t)replicas > n)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: \"replicas\" is %d, more than its %zu ps tasks",
                         (int)replicas, n);
  ps_view v;
  rc = view_alloc(&v, (int)n, st);
  if (rc != 0) return rc;
  v.epoch = epoch;
  v.replicas = (int)replicas;
  for (size_t t = 0; t < n; t++) {
    json_object *j = json_object_array_get_idx(joined, t);
    if (!json_object_is_type(j, json_type_boolean)) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "view: joined[%zu] must be true or false", t);
      goto fail;
    }
    v.joined[t] = json_object_get_boolean(j);
  }
  for (size_t s = 0; s < n; s++)
    if ((rc = shard_from_json(json_object_array_get_idx(shards, s), (int)s, &v, st)) != 0)
      goto fail;
  *out = v;
  return 0;
fail:
  ps_view_free(&v);
  return rc;
}

int ps_view_decode(const char *text, size_t len, int ntasks, ps_view *out,
                   ps_status *st) {
  if (text == NULL) text = "", len = 0;
  if (len > PS_VIEW_MAX_BYTES)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: too large (%zu bytes, max %u)",
                         len, PS_VIEW_MAX_BYTES);
  if (ntasks < 0 || ntasks > PS_VIEW_MAX_TASKS)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: bad task count %d (0 to %d)",
                         ntasks, PS_VIEW_MAX_TASKS);
  json_object *top = parse_json(text, len, st);
  if (top == NULL) return st->code ? st->code : PS_INVALID_ARGUMENT;
  int rc = view_from_json(top, ntasks, out, st);
  json_object_put(top);
  return rc;
}

/* ---- transitions ------------------------------------------------------ */

/* A copy of @v to change; refuses a view at its last epoch and a task
 * outside it. */
static int begin(const ps_view *v, int task, ps_view *w, ps_status *st) {
  if (v == NULL || v->ntasks < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: no view to change");
  if (v->epoch < 1 || v->epoch >= MAX_EPOCH)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: epoch %lld cannot advance",
                         (long long)v->epoch);
  if (task < 0 || task >= v->ntasks)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: no task ps/%d (the view has %d)",
                         task, v->ntasks);
  return ps_view_copy(v, w, st);
}

/* The result: epoch + 1 if anything changed, else @w is a copy of @v. */
static void finish(const ps_view *v, ps_view *w, ps_view *out, bool *changed) {
  bool ch = !same_content(v, w);
  w->epoch = ch ? v->epoch + 1 : v->epoch;
  if (changed) *changed = ch;
  *out = *w;
}

/* @task leaves every shard of @w (promotion where it was the primary);
 * returns how many shards it left with no replica. */
static int remove_in(ps_view *w, int task, int64_t new_epoch) {
  int lost = 0;
  for (int s = 0; s < w->ntasks; s++) {
    ps_view_shard *sh = &w->shard[s];
    int i = index_of(sh, task);
    if (i < 0) continue;
    if (i > 0) {
      for (int j = i; j + 1 < sh->n; j++) {
        sh->task[j] = sh->task[j + 1];
        sh->state[j] = sh->state[j + 1];
      }
      sh->n--;
      sh->task[sh->n] = sh->state[sh->n] = 0;
      continue;
    }
    int k = 1;
    while (k < sh->n && sh->state[k] != PS_REPLICA_IN_SYNC)
      k++;
    ps_view_shard nsh = {0};
    nsh.since = sh->since;
    if (k < sh->n) { /* promotion; the other backups copy it anew */
      nsh.task[nsh.n++] = sh->task[k];
      for (int j = 1; j < sh->n; j++)
        if (j != k) {
          nsh.task[nsh.n] = sh->task[j];
          nsh.state[nsh.n++] = PS_REPLICA_SYNCING;
        }
      nsh.since = new_epoch;
    } else {
      lost++;
    }
    *sh = nsh;
  }
  return lost;
}

/* @task comes back SYNCING to every shard of its placement that is not
 * lost, lacks it and has fewer than R replicas. */
static void add_in(ps_view *w, int task, const char *const *hosts) {
  for (int s = 0; s < w->ntasks; s++) {
    ps_view_shard *sh = &w->shard[s];
    if (sh->n == 0 || sh->n >= w->replicas || index_of(sh, task) >= 0) continue;
    int p[PS_VIEW_MAX_REPLICAS];
    int np = ps_view_placement(w->ntasks, w->replicas, hosts, s, p), j = 0;
    while (j < np && p[j] != task)
      j++;
    if (j == np) continue;
    sh->task[sh->n] = task;
    sh->state[sh->n++] = PS_REPLICA_SYNCING;
  }
}

/* remove_task and leave: @task out of every shard; a leave also clears
 * its joined flag. */
static int remove_or_leave(const ps_view *v, int task, bool leave, ps_view *out,
                           bool *changed, int *lost, ps_status *st) {
  ps_view w;
  int rc = begin(v, task, &w, st);
  if (rc != 0) return rc;
  int n = remove_in(&w, task, v->epoch + 1);
  if (leave) w.joined[task] = false;
  if (lost) *lost = n;
  finish(v, &w, out, changed);
  return 0;
}

int ps_view_remove_task(const ps_view *v, int task, ps_view *out, bool *changed,
                        int *lost, ps_status *st) {
  return remove_or_leave(v, task, false, out, changed, lost, st);
}

int ps_view_leave(const ps_view *v, int task, ps_view *out, bool *changed, int *lost,
                  ps_status *st) {
  return remove_or_leave(v, task, true, out, changed, lost, st);
}

int ps_view_drop_backup(const ps_view *v, int s, int task, ps_view *out, bool *changed,
                        ps_status *st) {
  if (v != NULL && (s < 0 || s >= v->ntasks))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: no shard %d (the view has %d)",
                         s, v->ntasks);
  ps_view w;
  int rc = begin(v, task, &w, st);
  if (rc != 0) return rc;
  ps_view_shard *sh = &w.shard[s];
  int i = index_of(sh, task);
  if (i > 0) { /* never the primary: that is remove_task's, on evidence of death */
    for (int j = i; j + 1 < sh->n; j++) {
      sh->task[j] = sh->task[j + 1];
      sh->state[j] = sh->state[j + 1];
    }
    sh->n--;
    sh->task[sh->n] = sh->state[sh->n] = 0;
  }
  finish(v, &w, out, changed);
  return 0;
}

int ps_view_join(const ps_view *v, int task, const char *const *hosts, ps_view *out,
                 bool *changed, ps_status *st) {
  ps_view w;
  int rc = begin(v, task, &w, st);
  if (rc != 0) return rc;
  if (w.joined[task])
    remove_in(&w, task, v->epoch + 1);
  else
    w.joined[task] = true;
  add_in(&w, task, hosts);
  finish(v, &w, out, changed);
  return 0;
}

int ps_view_rejoin(const ps_view *v, int task, const char *const *hosts, ps_view *out,
                   bool *changed, ps_status *st) {
  ps_view w;
  int rc = begin(v, task, &w, st);
  if (rc != 0) return rc;
  add_in(&w, task, hosts);
  finish(v, &w, out, changed);
  return 0;
}

int ps_view_in_sync(const ps_view *v, int s, int task, ps_view *out, bool *changed,
                    ps_status *st) {
  if (v != NULL && (s < 0 || s >= v->ntasks))
    return ps_status_set(st, PS_INVALID_ARGUMENT, "view: no shard %d (the view has %d)",
                         s, v->ntasks);
  ps_view w;
  int rc = begin(v, task, &w, st);
  if (rc != 0) return rc;
  int i = index_of(&w.shard[s], task);
  if (i > 0) w.shard[s].state[i] = PS_REPLICA_IN_SYNC;
  finish(v, &w, out, changed);
  return 0;
}

/* ---- text ------------------------------------------------------------- */

void ps_view_describe(const ps_view *v, char *buf, size_t n) {
  if (n == 0) return;
  size_t off = 0;
  buf[0] = '\0';
  if (v == NULL || v->ntasks < 1) {
    ps_appendf(buf, n, &off, "no view");
    return;
  }
  int rc = ps_appendf(buf, n, &off, "epoch %lld:", (long long)v->epoch);
  for (int s = 0; s < v->ntasks && rc == 0; s++) {
    const ps_view_shard *sh = &v->shard[s];
    rc |= ps_appendf(buf, n, &off, " %d=[", s);
    if (sh->n == 0) rc |= ps_appendf(buf, n, &off, "lost");
    for (int i = 0; i < sh->n; i++)
      rc |= ps_appendf(buf, n, &off, "%s%d%s", i ? "," : "", sh->task[i],
                       i == 0                               ? "*"
                       : sh->state[i] == PS_REPLICA_SYNCING ? "~"
                                                            : "");
    rc |= ps_appendf(buf, n, &off, "]");
  }
  if (rc != 0 && n >= 4) memcpy(buf + n - 4, "...", 4); /* cut: say so */
}

void ps_view_describe_placement(int ntasks, int replicas, const char *const *hosts,
                                char *buf, size_t n) {
  if (n == 0) return;
  size_t off = 0;
  buf[0] = '\0';
  bool many = false;
  for (int t = 1; hosts && t < ntasks && !many; t++)
    many = !same_host(hosts, 0, t);
  int rc = ps_appendf(buf, n, &off, "placement (R=%d, ring order%s):", replicas,
                      many ? ", a new host first" : "");
  for (int s = 0; s < ntasks && rc == 0; s++) {
    int t[PS_VIEW_MAX_REPLICAS];
    int k = ps_view_placement(ntasks, replicas, hosts, s, t);
    rc |= ps_appendf(buf, n, &off, " %d=[", s);
    for (int i = 0; i < k; i++)
      rc |= ps_appendf(buf, n, &off, "%s%d", i ? "," : "", t[i]);
    rc |= ps_appendf(buf, n, &off, "]");
  }
  if (rc != 0 && n >= 4) memcpy(buf + n - 4, "...", 4);
}
