/* Control calls: Create (with the checkpoint key-space checks across
 * tasks), Initialize, IsInitialized, ReportUninitialized, Delete,
 * Shutdown, List, Status and probes. */
#include "client_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/tensor.h"

/* ---- the checkpoint key space across tasks ---- */

static const char *spec_full(const ps_var_spec *s) {
  return s->full_name && strcmp(s->full_name, s->name) != 0 ? s->full_name : NULL;
}

static const char *info_key(const ps_var_info *v) {
  return v->full_name ? v->full_name : v->name;
}

static int cmp_info_name(const void *a, const void *b) {
  return strcmp((*(ps_var_info *const *)a)->name, (*(ps_var_info *const *)b)->name);
}

static int cmp_info_key(const void *a, const void *b) {
  return strcmp(info_key(*(ps_var_info *const *)a), info_key(*(ps_var_info *const *)b));
}

/* The first of @by (sorted by @cmp) equal to @probe, or -1. */
static ptrdiff_t lower_bound(ps_var_info **by, size_t n, ps_var_info *probe,
                             int (*cmp)(const void *, const void *)) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cmp(&by[mid], &probe) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && cmp(&by[lo], &probe) == 0 ? (ptrdiff_t)lo : -1;
}

/* Would @s, created on ps @task, share a checkpoint key with one of
 * @vars of another task in a way no checkpoint can hold? */
static int key_conflict(int task, const ps_var_spec *s, ps_var_info **by_name,
                        ps_var_info **by_key, size_t nv, ps_status *st) {
  char a[256], b[256];
  const char *full = spec_full(s), *key = full ? full : s->name;
  ps_var_info probe = {.name = (char *)s->name};
  ptrdiff_t i = lower_bound(by_name, nv, &probe, cmp_info_name);
  if (i >= 0)
    return ps_status_set(st, PS_ALREADY_EXISTS,
                         "variable %s: a variable of that name is on ps/%d; creating "
                         "it on ps/%d too would put it twice in every checkpoint",
                         s->name, by_name[i]->task, task);
  probe.name = (char *)key;
  i = lower_bound(by_key, nv, &probe, cmp_info_key);
  for (; i >= 0 && (size_t)i < nv && !strcmp(info_key(by_key[i]), key); i++) {
    const ps_var_info *v = by_key[i];
    if (full == NULL)
      return ps_status_set(st, PS_ALREADY_EXISTS,
                           "variable %s: %s is the full name of the partitioned "
                           "variable whose part %s is on ps/%d; a checkpoint cannot "
                           "hold both under one name",
                           s->name, s->name, v->name, v->task);
    if (v->full_name == NULL)
      return ps_status_set(st, PS_ALREADY_EXISTS,
                           "variable %s: its full name %s is a variable on ps/%d; a "
                           "checkpoint cannot hold both under one name",
                           s->name, full, v->task);
    const ps_shape *fs = s->full_shape ? s->full_shape : &s->shape;
    if (v->dtype != s->dtype || !ps_shape_equal(&v->full_shape, fs))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: part of %s with dtype %s and full shape %s, "
                           "but its part %s on ps/%d has dtype %s and full shape %s",
                           s->name, full, ps_dtype_name(s->dtype),
                           ps_shape_format(fs, a, sizeof a), v->name, v->task,
                           ps_dtype_name(v->dtype),
                           ps_shape_format(&v->full_shape, b, sizeof b));
    int64_t n = ps_shape_num_elements(&s->shape), pn = ps_shape_num_elements(&v->shape);
    int64_t po = v->offset, o = s->offset;
    if (n > 0 && pn > 0 && o < po + pn && po < o + n)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: its elements [%lld, %lld) of %s overlap "
                           "those of part %s [%lld, %lld) on ps/%d",
                           s->name, (long long)o, (long long)(o + n), full, v->name,
                           (long long)po, (long long)(po + pn), v->task);
  }
  return 0;
}

/* The key-space rules of ps_client_create_vars() against every other task. */
static int check_key_space(ps_client *c, int task, const ps_var_spec *specs, size_t n,
                           ps_status *st) {
  int rc = 0;
  for (int u = 0; u < c->nps && rc == 0; u++) {
    if (u == task) continue;
    ps_var_info *v = NULL;
    size_t nv = 0;
    ps_status lst;
    if (ps_client_list(c, u, &v, &nv, &lst) != 0) {
      PS_WARN("creating variables on ps/%d: ps/%d not checked for checkpoint key "
              "conflicts: %s",
              task, u, lst.msg);
      continue;
    }
    ps_var_info **by_name = calloc(nv + 1, sizeof *by_name);
    ps_var_info **by_key = calloc(nv + 1, sizeof *by_key);
    if (by_name == NULL || by_key == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    } else {
      for (size_t i = 0; i < nv; i++)
        by_name[i] = by_key[i] = &v[i];
      qsort(by_name, nv, sizeof *by_name, cmp_info_name);
      qsort(by_key, nv, sizeof *by_key, cmp_info_key);
      for (size_t i = 0; i < n && rc == 0; i++)
        rc = key_conflict(task, &specs[i], by_name, by_key, nv, st);
    }
    free(by_name);
    free(by_key);
    ps_client_free_var_info(v, nv);
  }
  return rc;
}

int ps_client_create_vars(ps_client *c, int task, const ps_var_spec *specs, size_t n,
                          ps_status *st) {
  if (ps_cl_check_task_(c, task, st)) return st->code;
  for (size_t i = 0; i < n; i++)
    if (specs[i].name == NULL)
      return ps_status_set(st, PS_INVALID_ARGUMENT, "Create: variable %zu has no name",
                           i);
  /* the coordinator's own names (heartbeats, marks: "_coordinator/...")
   * never go into a checkpoint: no List of every other ps for each */
  bool own = n > 0;
  for (size_t i = 0; i < n && own; i++)
    own = strncmp(specs[i].name, "_coordinator/", 13) == 0;
  if (c->nps > 1 && !own) {
    int rc = check_key_space(c, task, specs, n, st);
    if (rc != 0) return rc;
  }
  Paramserver__VariableSpec *vs = calloc(n + 1, sizeof *vs);
  Paramserver__VariableSpec **vp = calloc(n + 1, sizeof *vp);
  Paramserver__Initializer *inits = calloc(n + 1, sizeof *inits);
  if (!vs || !vp || !inits) {
    free(vs);
    free(vp);
    free(inits);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    paramserver__variable_spec__init(&vs[i]);
    vs[i].name = (char *)specs[i].name;
    vs[i].dtype = specs[i].dtype;
    vs[i].shape = (int64_t *)specs[i].shape.dim;
    vs[i].n_shape = (size_t)specs[i].shape.rank;
    if (specs[i].init) {
      ps_cl_init_to_proto_(specs[i].init, &inits[i]);
      if (specs[i].full_name) inits[i].full_name = (char *)specs[i].full_name;
      if (specs[i].full_shape) {
        inits[i].full_shape = (int64_t *)specs[i].full_shape->dim;
        inits[i].n_full_shape = (size_t)specs[i].full_shape->rank;
      }
      inits[i].offset = specs[i].offset;
      vs[i].initializer = &inits[i];
    }
    vp[i] = &vs[i];
  }
  Paramserver__CreateRequest req = PARAMSERVER__CREATE_REQUEST__INIT;
  req.vars = vp;
  req.n_vars = n;
  int rc = ps_cl_control_call_(c, task, M_CREATE, &req.base, true, NULL, NULL, st);
  free(vs);
  free(vp);
  free(inits);
  return rc;
}

int ps_cl_parse_initialize_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                            ps_status *st) {
  init_out *o = user;
  if (ps_cl_wire_ok_(&paramserver__initialize_response__descriptor, M_INITIALIZE, p, n,
                     st))
    return st->code;
  Paramserver__InitializeResponse *r =
      paramserver__initialize_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_INITIALIZE, "the answer does not parse");
  int rc = ps_cl_names_ok_(M_INITIALIZE, "initialized name", r->initialized,
                           r->n_initialized, st);
  if (rc == 0 && o->asked > 0 && r->n_initialized > o->asked)
    rc = ps_cl_bad_answer_(st, M_INITIALIZE, "%zu variables initialized for %zu names",
                           r->n_initialized, o->asked);
  if (rc == 0) o->n = r->n_initialized;
  paramserver__initialize_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_initialize(ps_client *c, int task, const char *const *names, size_t n,
                         bool only_uninitialized, size_t *ninit, ps_status *st) {
  Paramserver__InitializeRequest req = PARAMSERVER__INITIALIZE_REQUEST__INIT;
  req.names = (char **)names;
  req.n_names = n;
  req.only_uninitialized = only_uninitialized;
  init_out out = {0, n};
  int rc = ps_cl_control_call_(c, task, M_INITIALIZE, &req.base, only_uninitialized,
                               ps_cl_parse_initialize_, &out, st);
  if (ninit) *ninit = out.n;
  return rc;
}

int ps_cl_parse_is_init_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                         ps_status *st) {
  bools_out *o = user;
  Paramserver__IsInitializedResponse *r =
      paramserver__is_initialized_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_IS_INIT, "the answer does not parse");
  int rc = 0;
  if (o->n > 0 && r->n_initialized != o->n)
    rc = ps_cl_bad_answer_(st, M_IS_INIT, "%zu answers for %zu names (%s%s)",
                           r->n_initialized, o->n, o->first, o->n > 1 ? ", ..." : "");
  for (size_t i = 0; rc == 0 && i < o->n; i++)
    o->out[i] = r->initialized[i];
  paramserver__is_initialized_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_is_initialized(ps_client *c, int task, const char *const *names, size_t n,
                             bool *out, ps_status *st) {
  Paramserver__NamesRequest req = PARAMSERVER__NAMES_REQUEST__INIT;
  req.names = (char **)names;
  req.n_names = n;
  bools_out o = {out, n, n ? names[0] : ""};
  return ps_cl_control_call_(c, task, M_IS_INIT, &req.base, true, ps_cl_parse_is_init_,
                             &o, st);
}

int ps_cl_parse_report_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  names_out *o = user;
  if (ps_cl_wire_ok_(&paramserver__report_uninitialized_response__descriptor, M_REPORT, p,
                     n, st))
    return st->code;
  Paramserver__ReportUninitializedResponse *r =
      paramserver__report_uninitialized_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_REPORT, "the answer does not parse");
  ps_client_free_names(o->names, o->n);
  o->names = NULL;
  o->n = 0;
  int rc = ps_cl_names_ok_(M_REPORT, "name", r->names, r->n_names, st);
  if (rc == 0 && o->asked > 0 && r->n_names > o->asked)
    rc = ps_cl_bad_answer_(st, M_REPORT, "%zu uninitialized variables for %zu names",
                           r->n_names, o->asked);
  if (rc == 0 && (o->names = calloc(r->n_names + 1, sizeof *o->names)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; rc == 0 && i < r->n_names; i++) {
    if ((o->names[i] = strdup(r->names[i])) == NULL)
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    else
      o->n++;
  }
  paramserver__report_uninitialized_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_report_uninitialized(ps_client *c, int task, const char *const *names,
                                   size_t n, char ***out, size_t *nout, ps_status *st) {
  Paramserver__NamesRequest req = PARAMSERVER__NAMES_REQUEST__INIT;
  req.names = (char **)names;
  req.n_names = n;
  names_out o = {NULL, 0, n};
  int rc = ps_cl_control_call_(c, task, M_REPORT, &req.base, true, ps_cl_parse_report_,
                               &o, st);
  if (rc != 0) {
    ps_client_free_names(o.names, o.n);
    o.names = NULL;
    o.n = 0;
  }
  *out = o.names;
  *nout = o.n;
  return rc;
}

static int copy_names(char **in, size_t n, char ***out, size_t *nout, ps_status *st) {
  *out = calloc(n + 1, sizeof **out);
  if (*out == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < n; i++) {
    if (((*out)[i] = strdup(in[i])) == NULL)
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    (*nout)++;
  }
  return 0;
}

int ps_cl_parse_delete_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  delete_out *d = user;
  ps_delete_result *o = d->out;
  ps_delete_result_free(o); /* a header parsed again */
  if (ps_cl_wire_ok_(&paramserver__delete_response__descriptor, M_DELETE, p, n, st))
    return st->code;
  Paramserver__DeleteResponse *r = paramserver__delete_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_DELETE, "the answer does not parse");
  int rc = ps_cl_names_ok_(M_DELETE, "deleted name", r->deleted, r->n_deleted, st);
  if (rc == 0)
    rc = ps_cl_names_ok_(M_DELETE, "missing name", r->missing, r->n_missing, st);
  if (rc == 0 && r->n_missing > d->asked)
    rc = ps_cl_bad_answer_(st, M_DELETE, "%zu names missing of %zu asked", r->n_missing,
                           d->asked);
  if (rc == 0) rc = copy_names(r->deleted, r->n_deleted, &o->deleted, &o->ndeleted, st);
  if (rc == 0) rc = copy_names(r->missing, r->n_missing, &o->missing, &o->nmissing, st);
  paramserver__delete_response__free_unpacked(r, NULL);
  return rc;
}

void ps_delete_result_free(ps_delete_result *r) {
  if (r == NULL) return;
  ps_client_free_names(r->deleted, r->ndeleted);
  ps_client_free_names(r->missing, r->nmissing);
  memset(r, 0, sizeof *r);
}

int ps_client_delete(ps_client *c, int task, const char *const *names, size_t n,
                     int flags, ps_delete_result *out, ps_status *st) {
  Paramserver__DeleteRequest req = PARAMSERVER__DELETE_REQUEST__INIT;
  req.names = (char **)names;
  req.n_names = n;
  req.with_slots = (flags & PS_DELETE_SLOTS) != 0;
  req.missing_ok = (flags & PS_DELETE_MISSING_OK) != 0;
  ps_delete_result o = {0};
  delete_out d = {&o, n};
  int rc = ps_cl_control_call_(c, task, M_DELETE, &req.base, false, ps_cl_parse_delete_,
                               &d, st);
  if (rc != 0 || out == NULL) ps_delete_result_free(&o);
  if (out) *out = o;
  return rc;
}

int ps_cl_parse_shutdown_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                          ps_status *st) {
  (void)user;
  Paramserver__ShutdownResponse *r = paramserver__shutdown_response__unpack(NULL, n, p);
  if (r == NULL)
    return ps_status_set(st, PS_INTERNAL, "Shutdown: response does not parse");
  paramserver__shutdown_response__free_unpacked(r, NULL);
  return 0;
}

int ps_client_shutdown(ps_client *c, int task, const char *reason, ps_status *st) {
  Paramserver__ShutdownRequest req = PARAMSERVER__SHUTDOWN_REQUEST__INIT;
  req.reason = (char *)(reason ? reason : "");
  return ps_cl_control_call_(c, task, M_SHUTDOWN, &req.base, false, ps_cl_parse_shutdown_,
                             NULL, st);
}

void ps_client_free_names(char **names, size_t n) {
  if (names == NULL) return;
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

int ps_client_list(ps_client *c, int task, ps_var_info **out, size_t *n, ps_status *st) {
  Paramserver__ListRequest req = PARAMSERVER__LIST_REQUEST__INIT;
  list_out o = {NULL, 0, task, c->opt.max_message_bytes, NULL};
  if (task >= 0 && task < c->nps) o.addr = c->addrs[task];
  int rc =
      ps_cl_control_call_(c, task, M_LIST, &req.base, true, ps_cl_parse_list_, &o, st);
  if (rc != 0) {
    ps_client_free_var_info(o.v, o.n);
    o.v = NULL;
    o.n = 0;
  }
  *out = o.v;
  *n = o.n;
  return rc;
}
int ps_cl_parse_status_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                        ps_status *st) {
  ps_task_status *o = user;
  if (ps_cl_wire_ok_(&paramserver__status_response__descriptor, M_STATUS, p, n, st))
    return st->code;
  Paramserver__StatusResponse *r = paramserver__status_response__unpack(NULL, n, p);
  if (r == NULL) return ps_cl_bad_answer_(st, M_STATUS, "the answer does not parse");
  int rc = 0;
  if (r->num_vars < 0 || r->bytes < 0 || r->rpcs < 0 || r->pid < 0 ||
      !(r->uptime_secs >= 0))
    rc = ps_cl_bad_answer_(st, M_STATUS,
                           "a negative count (vars %lld, bytes %lld, rpcs %lld, "
                           "pid %lld, uptime %g)",
                           (long long)r->num_vars, (long long)r->bytes,
                           (long long)r->rpcs, (long long)r->pid, r->uptime_secs);
  if (rc == 0) {
    snprintf(o->task, sizeof o->task, "%s", r->task);
    snprintf(o->address, sizeof o->address, "%s", r->address);
    snprintf(o->version, sizeof o->version, "%s", r->version);
    o->num_vars = r->num_vars;
    o->bytes = r->bytes;
    o->pid = r->pid;
    o->rpcs = r->rpcs;
    o->uptime_secs = r->uptime_secs;
  }
  paramserver__status_response__free_unpacked(r, NULL);
  return rc;
}

int ps_client_status(ps_client *c, int task, ps_task_status *out, ps_status *st) {
  Paramserver__StatusRequest req = PARAMSERVER__STATUS_REQUEST__INIT;
  memset(out, 0, sizeof *out);
  return ps_cl_control_call_(c, task, M_STATUS, &req.base, true, ps_cl_parse_status_, out,
                             st);
}

int ps_client_probe(ps_client *c, int task, ps_status *st) {
  return ps_client_probe_within(c, task, 0, st);
}

int ps_client_probe_within(ps_client *c, int task, int64_t within_ms, ps_status *st) {
  if (ps_cl_check_task_(c, task, st)) return st->code;
  /* replicated: @task names a shard, which its primary serves */
  int64_t epoch;
  int primary = c->view ? ps_cl_view_route_(c, task, &epoch) : -1;
  if (primary >= 0) task = primary;
  Paramserver__StatusRequest req = PARAMSERVER__STATUS_REQUEST__INIT;
  ps_task_status out;
  memset(&out, 0, sizeof out);
  ps_rpc_req r;
  answer a;
  ps_cl_req_init_(c, &r, task, M_STATUS, &req.base, true, false);
  if (within_ms > 0 && within_ms < r.stall_timeout_ms) {
    r.stall_timeout_ms = within_ms;
    if (r.timeout_ms > within_ms + 1000) r.timeout_ms = within_ms + 1000;
  }
  ps_cl_answer_init_(c, task, &r, &a, ps_cl_parse_status_, &out, NULL);
  ps_cl_run_reqs_(c, &r, &task, 1, false);
  if (st) *st = r.st;
  return r.st.code;
}
