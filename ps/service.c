/* The paramserver.Ps RPC handlers: the service object, Create, Initialize,
 * IsInitialized, ReportUninitialized, List, Status, Delete, Shutdown and
 * the health service, with their handler table (ps_svc_handlers).  The
 * request checks every handler shares are service_check.c, Update
 * service_update.c, Read service_read.c, the checkpoint RPCs ckpt.c; the
 * table of them all service_handlers.c.
 *
 * Every handler decodes its header (bytes that do not parse are
 * INVALID_ARGUMENT), resolves variable names (NOT_FOUND naming the
 * variable), stages bulk bytes into fresh buffers while the request
 * streams in, and only then locks the variables it touches (in name order),
 * validates the whole request against their current state and applies it.
 * A request that fails validation changes nothing.  Error texts follow
 * TensorFlow's kernels where TensorFlow has one.
 *
 * Optimizer updates (APPLY_*) name slot variables besides the variable:
 * they join the request's lock set and its simulated state like any
 * variable it touches, and common/kernels.c does the arithmetic.
 *
 * Synchronous updates (replicas_to_aggregate > 0) go into their variable's
 * conditional accumulator (ps/sync.c) instead, under the same locks and
 * after the same validation.  The update that fills a step applies its
 * aggregate there and then.  A call with updates still waiting returns
 * PS_RPC_PENDING and holds no thread: its per-call state counts its
 * waiting updates plus one for the handler itself, whoever brings the count
 * to zero answers the call (the handler directly, or the call that
 * completed the last step, with ps_rpc_call_resume after dropping its
 * locks), and ps_service_shutdown() fails the waiting updates with
 * UNAVAILABLE so that no call outlives the server.
 *
 * Nothing from a request is trusted before it is checked: the raw header
 * bytes are walked first (common/wire.c: string fields with NUL or control
 * characters, or longer than 4096 bytes, are INVALID_ARGUMENT, because
 * protobuf-c would cut "w\0evil" to "w"); every byte size goes through the
 * checked helpers of common/tensor.h and is held to the limits
 * (ps_service_limits, ps/SERVER.md "Limits") before anything is allocated.
 * Variables may be deleted while other calls hold them (ps/store.h): a
 * handler checks ps_var_gone() once it holds a variable's lock. */
#include "service.h"
#include "embed.h"
#include "service_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/checkpoint_at.h"
#include "common/kernels.h"
#include "common/log.h"
#include "common/variable.h"
#include "common/wire.h"
#include "health.pb-c.h"
#include "paramserver/checkpoint.h"
#include "ps.pb-c.h"
#include "repl_internal.h"
#include "sync.h"

void ps_service_limits_default(ps_service_limits *l) {
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  l->max_tensor_bytes = pages > 0 && psz > 0 ? (int64_t)pages * psz : INT64_MAX;
  l->max_read_names = 100000;
  l->max_gather_rows = 1048576;
  l->max_hold_ms = 60000;
  l->max_checkpoint_bytes = 0;
}

void ps_service_set_limits(ps_service *s, const ps_service_limits *l) {
  s->limits = *l;
  ps_store_set_gate_limits(s->store, l->max_hold_ms, l->max_tensor_bytes);
}

const ps_service_limits *ps_service_limits_of(const ps_service *s) {
  return &s->limits;
}

ps_embed_store *ps_service_tables(ps_service *s) {
  return s->tables;
}

ps_service *ps_service_create(ps_store *store, const char *task) {
  ps_service *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  s->store = store;
  if ((s->tables = ps_embed_store_create()) == NULL) {
    free(s);
    return NULL;
  }
  ps_store_set_tables(store, s->tables);
  ps_service_limits_default(&s->limits);
  ps_store_set_gate_limits(store, s->limits.max_hold_ms, s->limits.max_tensor_bytes);
  snprintf(s->task, sizeof s->task, "%s", task);
  clock_gettime(CLOCK_MONOTONIC, &s->start);
  pthread_mutex_init(&s->ckpt_mu, NULL);
  return s;
}

void ps_service_destroy(ps_service *s) {
  if (s == NULL) return;
  free(s->ckpt_dir);
  ps_embed_store_destroy(s->tables);
  pthread_mutex_destroy(&s->ckpt_mu);
  free(s);
}

void ps_service_saved(ps_service *s, double end, double secs, long long bytes) {
  pthread_mutex_lock(&s->ckpt_mu);
  s->ckpt_time = end;
  s->ckpt_secs = secs;
  s->ckpt_bytes = bytes;
  s->ckpt_count++;
  pthread_mutex_unlock(&s->ckpt_mu);
}

void ps_service_last_save(ps_service *s, double *end, double *secs, long long *bytes,
                          long long *count) {
  pthread_mutex_lock(&s->ckpt_mu);
  *end = s->ckpt_time;
  *secs = s->ckpt_secs;
  *bytes = s->ckpt_bytes;
  *count = s->ckpt_count;
  pthread_mutex_unlock(&s->ckpt_mu);
}

ps_store *ps_service_store(ps_service *s) {
  return s->store;
}
void ps_service_set_checkpoint_dir(ps_service *s, const char *dir) {
  free(s->ckpt_dir);
  s->ckpt_dir = dir ? strdup(dir) : NULL;
}
const char *ps_service_checkpoint_dir(ps_service *s) {
  return s->ckpt_dir;
}

void ps_service_set_address(ps_service *s, const char *addr) {
  snprintf(s->address, sizeof s->address, "%s", addr);
}

/* ---- Create ---- */

/* The initializer of spec @v (already parsed into @init) against its
 * shape and, for a part, its full shape and offset. */
static int check_spec_init(const Paramserver__VariableSpec *v, const ps_shape *shape,
                           const ps_init_spec *init, ps_status *st) {
  const Paramserver__Initializer *pi = v->initializer;
  ps_shape full = *shape;
  if (pi->n_full_shape &&
      ps_svc_shape_from_(&full, pi->full_shape, pi->n_full_shape, v->name, st) != 0)
    return st->code;
  const char *nm = pi->full_name[0] ? pi->full_name : v->name;
  int rc = ps_init_check(init, nm, v->dtype, &full, pi->offset,
                         ps_shape_num_elements(shape), st);
  if (rc != 0 && strcmp(nm, v->name) != 0) ps_status_prefix(st, "variable %s", v->name);
  return rc;
}

static int create_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__create_request__descriptor, "Create");
  Paramserver__CreateRequest *req = paramserver__create_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "Create");
  Paramserver__CreateResponse resp = PARAMSERVER__CREATE_RESPONSE__INIT;
  int rc = ps_svc_route_(s, req->route, "Create", st);
  int shard = ps_svc_route_shard_(s, req->route);
  if (shard < 0) shard = ps_store_own_shard(s->store);
  /* Validate every spec first so a bad one creates nothing. */
  for (size_t i = 0; i < req->n_vars && rc == 0; i++) {
    Paramserver__VariableSpec *v = req->vars[i];
    ps_shape shape;
    ps_init_spec init;
    size_t bytes;
    if (v->name[0] == '\0')
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "variable %zu has no name", i);
    else if (ps_dtype_size(v->dtype) == 0 || v->dtype == PS_DT_COMPLEX64 ||
             v->dtype == PS_DT_COMPLEX128)
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "variable %s: unsupported dtype %d",
                         v->name, v->dtype);
    else if ((rc = ps_svc_shape_from_(&shape, v->shape, v->n_shape, v->name, st)) == 0 &&
             (rc = ps_svc_tensor_bytes_(s, v->dtype, &shape, "Create", v->name, &bytes,
                                        st)) == 0 &&
             v->initializer &&
             (rc = ps_svc_init_from_proto_(v->initializer, v->name, v->dtype, &init,
                                           st)) == 0)
      rc = check_spec_init(v, &shape, &init, st);
  }
  /* Then create them; a conflict found by the store undoes what this call
   * created, so the batch still creates all or nothing. */
  char **made = calloc(req->n_vars + 1, sizeof *made);
  size_t nmade = 0;
  ps_repl_group g = {0};
  bool meta = s->repl && rc == 0;
  if (meta) { /* this shard's primary, not fenced; Creates and Deletes in order */
    rc = ps_repl_check_route(s->repl, shard, -1, "Create", st);
    ps_repl_meta_lock(s->repl);
  }
  if (made == NULL && rc == 0)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < req->n_vars && rc == 0; i++) {
    Paramserver__VariableSpec *v = req->vars[i];
    ps_shape shape, full;
    ps_init_spec init;
    ps_svc_shape_from_(&shape, v->shape, v->n_shape, v->name, st);
    const ps_init_spec *ip = NULL;
    const char *full_name = NULL;
    const ps_shape *fs = NULL;
    int64_t off = 0;
    if (v->initializer) {
      ps_svc_init_from_proto_(v->initializer, v->name, v->dtype, &init, st);
      ip = &init;
      if (v->initializer->full_name[0]) full_name = v->initializer->full_name;
      if (v->initializer->n_full_shape) {
        if ((rc = ps_svc_shape_from_(&full, v->initializer->full_shape,
                                     v->initializer->n_full_shape, v->name, st)) != 0)
          break;
        fs = &full;
      }
      off = v->initializer->offset;
    }
    bool created;
    rc = ps_store_create_var_in(s->store, shard, v->name, (ps_dtype)v->dtype, &shape, ip,
                                full_name, fs, off, &created, st);
    if (rc == 0) {
      if (created) {
        resp.created++;
        made[nmade++] = v->name;
        PS_DEBUG("created %s", v->name);
      } else {
        resp.existed++;
      }
    }
  }
  if (rc != 0 && nmade > 0) {
    ps_var **gone = NULL;
    size_t ngone = 0;
    ps_status st2;
    if (ps_store_remove(s->store, made, nmade, PS_REMOVE_MISSING_OK, &gone, &ngone, NULL,
                        &st2) == 0) {
      for (size_t i = 0; i < ngone; i++) {
        pthread_rwlock_wrlock(&gone[i]->lock);
        ps_var_mark_deleted(s->store, gone[i]);
        pthread_rwlock_unlock(&gone[i]->lock);
      }
      free(gone);
    }
  }
  if (s->repl && rc == 0) { /* the new variables reach the backups */
    for (size_t i = 0; i < nmade; i++) {
      ps_var *v = ps_store_lookup(s->store, made[i]);
      if (v == NULL) continue;
      pthread_rwlock_rdlock(&v->lock);
      if (!v->deleted) ps_repl_add_create(&g, v);
      pthread_rwlock_unlock(&v->lock);
    }
    rc = ps_svc_commit_(c, &g, st);
  }
  if (meta) ps_repl_meta_unlock(s->repl);
  free(made);
  if (rc == 0) ps_rpc_call_reply(c, &resp.base);
  paramserver__create_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- Initialize ---- */

/* Variables named in @names (all when empty), or NOT_FOUND. */
static ps_var **resolve(ps_service *s, int shard, char **names, size_t n, size_t *out_n,
                        ps_status *st) {
  ps_var **vars = n == 0 ? ps_svc_list_(s, shard, out_n) : malloc(n * sizeof *vars);
  if (vars == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  if (n == 0) return vars;
  for (size_t i = 0; i < n; i++) {
    vars[i] = ps_svc_find_(s, shard, names[i], st);
    if (vars[i] == NULL) {
      free(vars);
      return NULL;
    }
  }
  *out_n = n;
  return vars;
}

/* Validates every initializer of the batch by computing all the new
 * values first, under the write locks of all the variables; only when all
 * succeeded are they installed (pointer swaps), so a failed Initialize
 * changes nothing. */
static int initialize_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__initialize_request__descriptor, "Initialize");
  Paramserver__InitializeRequest *req =
      paramserver__initialize_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "Initialize");
  size_t nv = 0;
  int rc = 0;
  ps_var **vars = NULL;
  if (ps_svc_route_(s, req->route, "Initialize", st) == 0)
    vars =
        resolve(s, ps_svc_route_shard_(s, req->route), req->names, req->n_names, &nv, st);
  if (vars == NULL) {
    paramserver__initialize_request__free_unpacked(req, NULL);
    return st->code;
  }
  bool explicit_names = req->n_names > 0;
  for (size_t i = 0; i < nv && rc == 0; i++)
    if (explicit_names && !vars[i]->has_init)
      rc = ps_status_set(st, PS_FAILED_PRECONDITION,
                         "variable %s has no initializer on %s: its value must "
                         "be assigned by the client",
                         vars[i]->name, s->task);
  char **done = calloc(nv + 1, sizeof *done);
  ps_buf **bufs = calloc(nv + 1, sizeof *bufs);
  size_t nd = 0;
  if (rc == 0 && (done == NULL || bufs == NULL))
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  if (rc == 0 && nv > 0) {
    ps_store_lock_set(vars, nv, true);
    if (s->repl) rc = ps_repl_check_vars(s->repl, vars, nv, "Initialize", st);
    for (size_t i = 0; i < nv && rc == 0; i++) {
      ps_var *v = vars[i];
      if ((rc = ps_var_gone(s->store, v, st)) != 0) break;
      if (!v->has_init) continue;
      if (req->only_uninitialized && v->buf) continue;
      if (v->buf && ps_rpc_call_role(c) != PS_ROLE_ADMIN) {
        rc = ps_status_set(st, PS_PERMISSION_DENIED,
                           "Initialize: %s on %s already holds a value; re-initializing "
                           "it needs an admin token (this call's token has the %s role)",
                           v->name, s->task, ps_role_name(ps_rpc_call_role(c)));
        break;
      }
      bool dup = false;
      for (size_t k = 0; k < i; k++)
        dup |= vars[k] == v;
      if (dup) continue;
      if ((bufs[i] = ps_var_init_buf(s->store, v, st)) == NULL) rc = st->code;
    }
    ps_repl_group g = {0};
    if (rc == 0)
      for (size_t i = 0; i < nv; i++)
        if (bufs[i]) {
          ps_var_set_buf(s->store, vars[i], bufs[i], NULL);
          done[nd++] = vars[i]->name;
          if (s->repl) ps_repl_add_value(&g, vars[i]);
        }
    if (rc == 0 && s->repl) rc = ps_svc_commit_(c, &g, st);
    ps_store_unlock_set(vars, nv);
  }
  if (rc == 0) {
    Paramserver__InitializeResponse resp = PARAMSERVER__INITIALIZE_RESPONSE__INIT;
    resp.initialized = done;
    resp.n_initialized = nd;
    ps_rpc_call_reply(c, &resp.base);
  }
  for (size_t i = 0; bufs && i < nv; i++)
    ps_buf_unref(bufs[i]);
  free(bufs);
  free(done);
  free(vars);
  paramserver__initialize_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- IsInitialized / ReportUninitialized ---- */

/* What both answer: the variables of @req (all when it names none), each
 * looked at under its lock.  A variable deleted meanwhile is NOT_FOUND if
 * named, else left out.  *@names and *@init (malloc'd, *@n entries): the
 * name of each variable left and whether it holds a value. */
static int init_state(ps_service *s, const Paramserver__NamesRequest *req,
                      const char *method, char ***names, protobuf_c_boolean **init,
                      size_t *n, ps_status *st) {
  size_t nv = 0, k = 0;
  if (ps_svc_route_(s, req->route, method, st) != 0) return st->code;
  ps_var **vars =
      resolve(s, ps_svc_route_shard_(s, req->route), req->names, req->n_names, &nv, st);
  if (vars == NULL) return st->code;
  *names = calloc(nv + 1, sizeof **names);
  *init = calloc(nv + 1, sizeof **init);
  int rc = 0;
  if (*names == NULL || *init == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < nv && rc == 0; i++) {
    pthread_rwlock_rdlock(&vars[i]->lock);
    if (!vars[i]->deleted) {
      (*names)[k] = vars[i]->name;
      (*init)[k++] = vars[i]->buf != NULL;
    } else if (req->n_names) {
      rc = ps_var_gone(s->store, vars[i], st);
    }
    pthread_rwlock_unlock(&vars[i]->lock);
  }
  free(vars);
  if (rc != 0) {
    free(*names);
    free(*init);
    *names = NULL;
    *init = NULL;
  }
  *n = k;
  return rc;
}

static int is_init_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__names_request__descriptor, "IsInitialized");
  Paramserver__NamesRequest *req = paramserver__names_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "IsInitialized");
  char **names;
  protobuf_c_boolean *init;
  size_t nv;
  int rc = init_state(s, req, "IsInitialized", &names, &init, &nv, st);
  if (rc == 0) {
    Paramserver__IsInitializedResponse resp = PARAMSERVER__IS_INITIALIZED_RESPONSE__INIT;
    resp.initialized = init;
    resp.n_initialized = nv;
    ps_rpc_call_reply(c, &resp.base);
    free(names);
    free(init);
  }
  paramserver__names_request__free_unpacked(req, NULL);
  return rc;
}

static int report_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__names_request__descriptor, "ReportUninitialized");
  Paramserver__NamesRequest *req = paramserver__names_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "ReportUninitialized");
  char **names;
  protobuf_c_boolean *init;
  size_t nv;
  int rc = init_state(s, req, "ReportUninitialized", &names, &init, &nv, st);
  if (rc == 0) {
    size_t k = 0;
    for (size_t i = 0; i < nv; i++)
      if (!init[i]) names[k++] = names[i];
    Paramserver__ReportUninitializedResponse resp =
        PARAMSERVER__REPORT_UNINITIALIZED_RESPONSE__INIT;
    resp.names = names;
    resp.n_names = k;
    ps_rpc_call_reply(c, &resp.base);
    free(names);
    free(init);
  }
  paramserver__names_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- List / Status ---- */

static int list_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__list_request__descriptor, "List");
  Paramserver__ListRequest *req = paramserver__list_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "List");
  int shard = ps_svc_route_shard_(s, req->route);
  int rc0 = ps_svc_route_(s, req->route, "List", st);
  paramserver__list_request__free_unpacked(req, NULL);
  if (rc0 != 0) return rc0;
  size_t nv = 0;
  ps_var **vars = ps_svc_list_(s, shard, &nv);
  Paramserver__VarInfo *infos = calloc(nv + 1, sizeof *infos);
  Paramserver__VarInfo **ptrs = calloc(nv + 1, sizeof *ptrs);
  int64_t *dims = calloc(nv * PS_MAX_RANK + 1, sizeof *dims);
  int64_t *fdims = calloc(nv * PS_MAX_RANK + 1, sizeof *fdims);
  if (!vars || !infos || !ptrs || !dims || !fdims) {
    free(fdims);
    free(dims);
    free(ptrs);
    free(infos);
    free(vars);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  size_t k = 0;
  for (size_t j = 0; j < nv; j++) {
    ps_var *v = vars[j];
    size_t i = k;
    paramserver__var_info__init(&infos[i]);
    pthread_rwlock_rdlock(&v->lock);
    if (v->deleted) { /* deleted after the list was taken */
      pthread_rwlock_unlock(&v->lock);
      continue;
    }
    k++;
    infos[i].name = v->name;
    infos[i].dtype = v->dtype;
    memcpy(dims + i * PS_MAX_RANK, v->shape.dim, (size_t)v->shape.rank * sizeof *dims);
    infos[i].shape = dims + i * PS_MAX_RANK;
    infos[i].n_shape = (size_t)v->shape.rank;
    size_t bytes = 0;
    ps_size_bytes(v->dtype, &v->shape, &bytes); /* checked at Create */
    infos[i].bytes = (int64_t)bytes;
    infos[i].initialized = v->buf != NULL;
    infos[i].version = v->version;
    if (v->init_full_name && strcmp(v->init_full_name, v->name) != 0) {
      infos[i].full_name = v->init_full_name; /* fixed at Create */
      memcpy(fdims + i * PS_MAX_RANK, v->init_full_shape.dim,
             (size_t)v->init_full_shape.rank * sizeof *fdims);
      infos[i].full_shape = fdims + i * PS_MAX_RANK;
      infos[i].n_full_shape = (size_t)v->init_full_shape.rank;
      infos[i].offset = v->init_offset;
    }
    pthread_rwlock_unlock(&v->lock);
    ptrs[i] = &infos[i];
  }
  Paramserver__ListResponse resp = PARAMSERVER__LIST_RESPONSE__INIT;
  if (s->repl) resp.epoch = ps_repl_epoch(s->repl);
  resp.vars = ptrs;
  resp.n_vars = k;
  ps_rpc_call_reply(c, &resp.base);
  free(fdims);
  free(dims);
  free(ptrs);
  free(infos);
  free(vars);
  return 0;
}

static int status_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__status_request__descriptor, "Status");
  Paramserver__StatusRequest *req = paramserver__status_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "Status");
  paramserver__status_request__free_unpacked(req, NULL);
  Paramserver__StatusResponse resp = PARAMSERVER__STATUS_RESPONSE__INIT;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  resp.task = s->task;
  resp.address = s->address;
  resp.version = PS_VERSION;
  ps_store_totals(s->store, &resp.num_vars, &resp.bytes);
  resp.uptime_secs = (double)(now.tv_sec - s->start.tv_sec) +
                     (double)(now.tv_nsec - s->start.tv_nsec) / 1e9;
  resp.pid = getpid();
  resp.rpcs = atomic_load(&s->rpcs);
  if (s->repl) ps_repl_status(s->repl, &resp);
  ps_rpc_call_reply(c, &resp.base);
  if (s->repl) ps_repl_status_free(&resp);
  return 0;
}

static int no_data(ps_rpc_call *c, ps_status *st) {
  return 0;
}

/* ---- Delete ---- */

static int delete_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__delete_request__descriptor, "Delete");
  Paramserver__DeleteRequest *req = paramserver__delete_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "Delete");
  int rc = 0;
  ps_var **vars = NULL;
  size_t nv = 0, nmiss = 0;
  char **names = NULL, **miss = NULL;
  bool *missing = NULL;
  if (req->n_names == 0) {
    rc = ps_status_set(st, PS_INVALID_ARGUMENT, "Delete: no variable names given");
    goto out;
  }
  int flags = (req->with_slots ? PS_REMOVE_SLOTS : 0) |
              (req->missing_ok ? PS_REMOVE_MISSING_OK : 0);
  missing = calloc(req->n_names, sizeof *missing);
  miss = calloc(req->n_names, sizeof *miss);
  if (missing == NULL || miss == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  if ((rc = ps_svc_route_(s, req->route, "Delete", st)) != 0) goto out;
  if (s->repl) { /* only variables of shards it is primary of (the route's) */
    int shard = ps_svc_route_shard_(s, req->route);
    for (size_t i = 0; i < req->n_names && rc == 0; i++) {
      ps_var *v = ps_store_lookup(s->store, req->names[i]);
      if (v && shard >= 0 && v->shard != shard)
        rc = ps_status_set(st, PS_NOT_FOUND,
                           "variable %s does not exist in shard %d on %s", v->name, shard,
                           s->task);
      else if (v)
        rc = ps_repl_check_vars(s->repl, &v, 1, "Delete", st);
    }
    if (rc != 0) goto out;
    ps_repl_meta_lock(s->repl);
  }
  /* replicated: the route's shard only (its parts and slots too: the
   * other shards' copies here are their primaries' to delete) */
  rc = ps_store_remove_in(s->store, s->repl ? ps_svc_route_shard_(s, req->route) : -1,
                          req->names, req->n_names, flags, &vars, &nv, missing, st);
  if (rc != 0 && s->repl) ps_repl_meta_unlock(s->repl);
  if (rc != 0) goto out;
  for (size_t i = 0; i < req->n_names; i++)
    if (missing[i]) miss[nmiss++] = req->names[i];
  ps_repl_group g = {0};
  /* Out of the table now; mark each deleted under its lock, so calls that
   * still hold it answer NOT_FOUND, and fail what waits for its step. */
  for (size_t i = 0; i < nv; i++) {
    ps_var *v = vars[i];
    ps_sync_waiter *w = NULL;
    pthread_rwlock_wrlock(&v->lock);
    if (v->accum) {
      char msg[PS_STATUS_MSG_MAX];
      snprintf(msg, sizeof msg,
               "variable %s was deleted on %s: synchronous step %lld "
               "was not applied",
               v->name, s->task, (long long)ps_accum_step(v->accum));
      w = ps_accum_fail(v->accum, PS_NOT_FOUND, msg);
    }
    ps_var_mark_deleted(s->store, v);
    if (s->repl) ps_repl_add_delete(&g, v->shard, v->name);
    pthread_rwlock_unlock(&v->lock);
    ps_svc_sync_release_all_(w);
    PS_INFO("deleted variable %s", v->name);
  }
  if (s->repl) {
    rc = ps_svc_commit_(c, &g, st);
    ps_repl_meta_unlock(s->repl);
    if (rc != 0) goto out;
  }
  names = calloc(nv + 1, sizeof *names);
  if (names == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < nv; i++)
    names[i] = vars[i]->name;
  Paramserver__DeleteResponse resp = PARAMSERVER__DELETE_RESPONSE__INIT;
  resp.deleted = names;
  resp.n_deleted = nv;
  resp.missing = miss;
  resp.n_missing = nmiss;
  ps_rpc_call_reply(c, &resp.base);
out:
  free(missing);
  free(miss);
  free(names);
  free(vars);
  paramserver__delete_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- Shutdown ---- */

void ps_service_set_shutdown_hook(ps_service *svc, void (*fn)(void *), void *arg) {
  svc->on_shutdown = fn;
  svc->shutdown_arg = arg;
}

static int shutdown_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = ps_svc_of_(c);
  CHECK_WIRE(paramserver__shutdown_request__descriptor, "Shutdown");
  Paramserver__ShutdownRequest *req = paramserver__shutdown_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, "Shutdown");
  int rc = 0;
  if (s->on_shutdown == NULL) {
    rc = ps_status_set(st, PS_UNIMPLEMENTED, "Shutdown: %s cannot be shut down by a call",
                       s->task);
  } else if (strlen(req->reason) > 256) {
    rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                       "Shutdown: the reason is %zu bytes, more than 256",
                       strlen(req->reason));
  } else {
    PS_INFO("Shutdown asked by a client%s%s", req->reason[0] ? ": " : "", req->reason);
    Paramserver__ShutdownResponse resp = PARAMSERVER__SHUTDOWN_RESPONSE__INIT;
    resp.task = s->task;
    ps_rpc_call_reply(c, &resp.base);
    s->on_shutdown(s->shutdown_arg);
  }
  paramserver__shutdown_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- grpc.health.v1.Health ---- */

/* Check: SERVING (once the ps is stopping, common/rpc_server.c refuses new calls
 * before they get here); NOT_FOUND for a service it does not have (the
 * protocol's rule).  Watch: the same status
 * as the first message of a stream that stays open (an unknown service is
 * SERVICE_UNKNOWN, and its stream stays open too, as the protocol says);
 * when the ps stops, every stream gets NOT_SERVING and ends.  A Watch that
 * arrives once the ps is stopping gets NOT_SERVING and ends at once. */
static int health_call(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st,
                       bool watch) {
  ps_service *s = ps_svc_of_(c);
  const char *method = watch ? "Health.Watch" : "Health.Check";
  int rc = ps_wire_check_strings(&grpc__health__v1__health_check_request__descriptor, p,
                                 n, method, st);
  if (rc != 0) return rc;
  Grpc__Health__V1__HealthCheckRequest *req =
      grpc__health__v1__health_check_request__unpack(NULL, n, p);
  if (req == NULL) return ps_svc_bad_request_(st, method);
  Grpc__Health__V1__HealthCheckResponse resp =
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  bool known = req->service[0] == '\0' || !strcmp(req->service, "paramserver.Ps");
  if (!known && !watch) {
    rc = ps_status_set(st, PS_NOT_FOUND, "%s: unknown service %.200s", method,
                       req->service);
  } else {
    resp.status =
        !known ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN
        : atomic_load(&s->sync_closed) || (s->repl && ps_repl_fenced(s->repl, NULL, 0))
            ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
            : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    ps_rpc_call_reply(c, &resp.base);
    /* the stream stays open unless the ps is stopping already */
    if (watch && resp.status !=
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING)
      ps_rpc_call_set_ctx(c, c);
  }
  grpc__health__v1__health_check_request__free_unpacked(req, NULL);
  return rc;
}

static int health_check(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  return health_call(c, p, n, st, false);
}

static int health_watch(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  return health_call(c, p, n, st, true);
}

static int health_watch_open(ps_rpc_call *c, ps_status *st) {
  (void)st;
  return ps_rpc_call_ctx(c) ? PS_RPC_STREAM : 0;
}

static void health_watch_end(ps_rpc_call *c) {
  Grpc__Health__V1__HealthCheckResponse resp =
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
  ps_rpc_call_reply(c, &resp.base);
}

const ps_rpc_handler ps_svc_handlers[10] = {
    {"/paramserver.Ps/Create", create_header, ps_svc_held_data_, ps_svc_held_free_, NULL,
     PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/Initialize", initialize_header, ps_svc_held_data_,
     ps_svc_held_free_, NULL, PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/IsInitialized", is_init_header, no_data, NULL, NULL,
     PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/ReportUninitialized", report_header, no_data, NULL, NULL,
     PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/List", list_header, no_data, NULL, NULL, PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/Status", status_header, no_data, NULL, NULL, PS_RPC_ACCESS_WORKER},
    {"/paramserver.Ps/Delete", delete_header, ps_svc_held_data_, ps_svc_held_free_, NULL,
     PS_RPC_ACCESS_ADMIN},
    {"/paramserver.Ps/Shutdown", shutdown_header, no_data, NULL, NULL,
     PS_RPC_ACCESS_ADMIN},
    {"/grpc.health.v1.Health/Check", health_check, no_data, NULL, NULL,
     PS_RPC_ACCESS_OPEN},
    {"/grpc.health.v1.Health/Watch", health_watch, health_watch_open, NULL,
     health_watch_end, PS_RPC_ACCESS_OPEN},
};

/* ---- the `checkpoint` state file (common/checkpoint_state.c) ---- */

int ps_service_update_state(ps_service *svc, int dirfd, const char *prefix,
                            const ps_state_update *u, char ***listed, size_t *nlisted,
                            ps_status *st) {
  (void)svc;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", prefix);
  char *sl = strrchr(dir, '/');
  if (sl) *sl = '\0';
  ps_ckpt_manager_options o;
  ps_ckpt_manager_options_init(&o);
  o.max_to_keep = u->max_to_keep < 0 ? 0 : u->max_to_keep;
  if (u->keep_every_n_hours > 0) o.keep_checkpoint_every_n_hours = u->keep_every_n_hours;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
  if (listed) *listed = NULL, *nlisted = 0;
  /* through the directory the merge holds: the state file and the
   * evicted checkpoints are reached without following a link */
  ps_ckpt_manager *m = ps_ckpt_manager_create_at(dirfd, dir, &o, now, st);
  if (m == NULL) return st->code;
  int rc = u->own_list ? ps_ckpt_manager_retain(m, u->own, u->nown, st) : 0;
  if (rc == 0) rc = ps_ckpt_manager_add(m, prefix, now, st);
  size_t n = ps_ckpt_manager_count(m);
  if (rc == 0 && listed && (*listed = calloc(n + 1, sizeof **listed)) != NULL) {
    for (size_t i = 0; i < n; i++)
      if (((*listed)[i] = strdup(ps_ckpt_manager_path(m, i))) != NULL) (*nlisted)++;
  }
  ps_ckpt_manager_destroy(m);
  return rc;
}

int ps_service_latest(ps_service *svc, char **prefix, ps_status *st) {
  if (svc->ckpt_dir == NULL)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "this ps has no --checkpoint-dir: it cannot save or restore");
  return ps_latest_checkpoint(svc->ckpt_dir, prefix, st);
}
