/* The paramserver.Ps RPC handlers.
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
 * (ps_service_limits, README "Limits") before anything is allocated.
 * Variables may be deleted while other calls hold them (ps/store.h): a
 * handler checks ps_var_gone() once it holds a variable's lock. */
#include "service.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>

#include "ckpt.h"
#include "paramserver/checkpoint.h"
#include "common/log.h"
#include "common/wire.h"
#include "common/kernels.h"
#include "common/variable.h"
#include "ps.pb-c.h"
#include "sync.h"

struct ps_service {
  ps_store *store;
  char *ckpt_dir;
  char task[64];
  char address[256];
  struct timespec start;
  atomic_llong rpcs;
  atomic_bool sync_closed; /* shutting down: no call may start waiting */
  ps_service_limits limits;
};

void ps_service_limits_default(ps_service_limits *l) {
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  l->max_tensor_bytes = pages > 0 && psz > 0 ? (int64_t)pages * psz : INT64_MAX;
  l->max_read_names = 100000;
  l->max_gather_rows = 1048576;
  l->max_hold_ms = 60000;
}

void ps_service_set_limits(ps_service *s, const ps_service_limits *l) {
  s->limits = *l;
  ps_store_set_gate_limits(s->store, l->max_hold_ms, l->max_tensor_bytes);
}

const ps_service_limits *ps_service_limits_of(const ps_service *s) {
  return &s->limits;
}

ps_service *ps_service_create(ps_store *store, const char *task) {
  ps_service *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  s->store = store;
  ps_service_limits_default(&s->limits);
  ps_store_set_gate_limits(store, s->limits.max_hold_ms, s->limits.max_tensor_bytes);
  snprintf(s->task, sizeof s->task, "%s", task);
  clock_gettime(CLOCK_MONOTONIC, &s->start);
  return s;
}

void ps_service_destroy(ps_service *s) {
  if (s) free(s->ckpt_dir);
  free(s);
}

ps_store *ps_service_store(ps_service *s) { return s->store; }
void ps_service_set_checkpoint_dir(ps_service *s, const char *dir) {
  free(s->ckpt_dir);
  s->ckpt_dir = dir ? strdup(dir) : NULL;
}
const char *ps_service_checkpoint_dir(ps_service *s) { return s->ckpt_dir; }

void ps_service_set_address(ps_service *s, const char *addr) {
  snprintf(s->address, sizeof s->address, "%s", addr);
}

static ps_service *svc_of(ps_rpc_call *c) {
  ps_service *s = ps_rpc_call_server_user(c);
  atomic_fetch_add_explicit(&s->rpcs, 1, memory_order_relaxed);
  return s;
}

static int bad_request(ps_status *st, const char *method) {
  return ps_status_set(st, PS_INVALID_ARGUMENT,
                       "%s: request message does not parse", method);
}

/* Before unpacking a request: names with NUL or control characters, or
 * over-long, are INVALID_ARGUMENT (protobuf-c would cut "w\0evil" to "w"). */
/* Every request's list (field 1: Create's vars, Update's updates, Read's
 * items, the names of Initialize, IsInitialized, ReportUninitialized and
 * Delete) is counted on the wire before protobuf-c allocates it: a 32 MiB
 * header could otherwise hold millions of items. */
static int check_items(ps_service *s, const uint8_t *p, size_t n, const char *method,
                       ps_status *st) {
  size_t k = ps_wire_count_field(p, n, 1);
  if ((uint64_t)k > (uint64_t)s->limits.max_read_names)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "%s: %zu items, above the limit of %lld per call "
                         "(--max-read-names)",
                         method, k, (long long)s->limits.max_read_names);
  return 0;
}

#define CHECK_WIRE(desc, method)                                              \
  do {                                                                        \
    int rc_ = ps_wire_check_strings(&(desc), p, n, method, st);               \
    if (rc_ == 0) rc_ = check_items(s, p, n, method, st);                     \
    if (rc_ != 0) return rc_;                                                 \
  } while (0)

/* The byte size of a tensor of @dtype and @shape that a request names:
 * INVALID_ARGUMENT if it does not fit in memory at all, RESOURCE_EXHAUSTED
 * above --max-tensor-bytes; checked before anything is allocated. */
static int tensor_bytes(ps_service *s, int dtype, const ps_shape *shape,
                        const char *what, const char *var, size_t *out,
                        ps_status *st) {
  char a[256];
  if (ps_size_bytes(dtype, shape, out) != 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: %s of shape %s does not fit in memory", what, var,
                         ps_dtype_name(dtype), ps_shape_format(shape, a, sizeof a));
  if ((uint64_t)*out > (uint64_t)s->limits.max_tensor_bytes)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "%s %s: %s of shape %s is %zu bytes, above the limit of "
                         "%lld bytes (--max-tensor-bytes)",
                         what, var, ps_dtype_name(dtype),
                         ps_shape_format(shape, a, sizeof a), *out,
                         (long long)s->limits.max_tensor_bytes);
  return 0;
}

/* Adds @add bytes to the bytes one request stages or builds (*@total):
 * together they may not pass --max-tensor-bytes either. */
static int add_staged(ps_service *s, size_t *total, size_t add, const char *method,
                      ps_status *st) {
  if (ps_size_add(*total, add, total) != 0 ||
      (uint64_t)*total > (uint64_t)s->limits.max_tensor_bytes)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "%s: the tensors of the request total more than the limit of "
                         "%lld bytes (--max-tensor-bytes)",
                         method, (long long)s->limits.max_tensor_bytes);
  return 0;
}

/* The same for @count elements of @dtype (indices, gathered rows). */
static int elems_bytes(ps_service *s, int dtype, int64_t count, const char *what,
                       const char *var, size_t *out, ps_status *st) {
  ps_shape sh = {.rank = 1, .dim = {count}};
  return tensor_bytes(s, dtype, &sh, what, var, out, st);
}

static int shape_from(ps_shape *s, const int64_t *dims, size_t n, const char *var,
                      ps_status *st) {
  if (ps_shape_set(s, dims, n, st) != 0)
    return ps_status_prefix(st, "variable %s", var);
  return 0;
}

static const char *fmt_shape(const ps_shape *s, char *buf, size_t n) {
  return ps_shape_format(s, buf, n);
}

/* ---- Create ---- */

static int init_from_proto(const Paramserver__Initializer *p, const char *var,
                           int dtype, ps_init_spec *out, ps_status *st) {
  int t = ps_init_type_from_name(p->type);
  if (t < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: unknown initializer '%s'", var, p->type);
  ps_init_spec_default(out, (ps_init_type)t);
  out->value = p->value;
  out->values = p->values;
  out->nvalues = p->n_values;
  out->minval = p->minval;
  out->maxval = p->maxval;
  out->mean = p->mean;
  out->stddev = p->stddev;
  if (p->scale != 0) out->scale = p->scale;
  if (p->mode[0]) {
    int m = ps_fan_mode_from_name(p->mode);
    if (m < 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: unknown fan mode '%s'", var, p->mode);
    out->mode = (ps_fan_mode)m;
  }
  if (p->distribution[0]) {
    int d = ps_distribution_from_name(p->distribution);
    if (d < 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "variable %s: unknown distribution '%s'", var,
                           p->distribution);
    out->distribution = (ps_distribution)d;
  }
  out->seed = p->seed;
  bool random = t != PS_INIT_ZEROS && t != PS_INIT_ONES && t != PS_INIT_CONSTANT;
  if (random && !ps_dtype_is_floating(dtype))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: initializer %s needs a floating dtype, "
                         "got %s",
                         var, p->type, ps_dtype_name(dtype));
  return 0;
}

/* The initializer of spec @v (already parsed into @init) against its
 * shape and, for a part, its full shape and offset. */
static int check_spec_init(const Paramserver__VariableSpec *v, const ps_shape *shape,
                           const ps_init_spec *init, ps_status *st) {
  const Paramserver__Initializer *pi = v->initializer;
  ps_shape full = *shape;
  if (pi->n_full_shape &&
      shape_from(&full, pi->full_shape, pi->n_full_shape, v->name, st) != 0)
    return st->code;
  const char *nm = pi->full_name[0] ? pi->full_name : v->name;
  int rc = ps_init_check(init, nm, v->dtype, &full, pi->offset,
                         ps_shape_num_elements(shape), st);
  if (rc != 0 && strcmp(nm, v->name) != 0)
    ps_status_prefix(st, "variable %s", v->name);
  return rc;
}

static int create_header(ps_rpc_call *c, const uint8_t *p, size_t n,
                         ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__create_request__descriptor, "Create");
  Paramserver__CreateRequest *req =
      paramserver__create_request__unpack(NULL, n, p);
  if (req == NULL) return bad_request(st, "Create");
  Paramserver__CreateResponse resp = PARAMSERVER__CREATE_RESPONSE__INIT;
  int rc = 0;
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
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "variable %s: unsupported dtype %d", v->name, v->dtype);
    else if ((rc = shape_from(&shape, v->shape, v->n_shape, v->name, st)) == 0 &&
             (rc = tensor_bytes(s, v->dtype, &shape, "Create", v->name, &bytes,
                                st)) == 0 &&
             v->initializer &&
             (rc = init_from_proto(v->initializer, v->name, v->dtype, &init, st)) == 0)
      rc = check_spec_init(v, &shape, &init, st);
  }
  /* Then create them; a conflict found by the store undoes what this call
   * created, so the batch still creates all or nothing. */
  char **made = calloc(req->n_vars + 1, sizeof *made);
  size_t nmade = 0;
  if (made == NULL && rc == 0)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < req->n_vars && rc == 0; i++) {
    Paramserver__VariableSpec *v = req->vars[i];
    ps_shape shape, full;
    ps_init_spec init;
    shape_from(&shape, v->shape, v->n_shape, v->name, st);
    const ps_init_spec *ip = NULL;
    const char *full_name = NULL;
    const ps_shape *fs = NULL;
    int64_t off = 0;
    if (v->initializer) {
      init_from_proto(v->initializer, v->name, v->dtype, &init, st);
      ip = &init;
      if (v->initializer->full_name[0]) full_name = v->initializer->full_name;
      if (v->initializer->n_full_shape) {
        if ((rc = shape_from(&full, v->initializer->full_shape,
                             v->initializer->n_full_shape, v->name, st)) != 0)
          break;
        fs = &full;
      }
      off = v->initializer->offset;
    }
    bool created;
    rc = ps_store_create_var(s->store, v->name, (ps_dtype)v->dtype, &shape, ip,
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
    if (ps_store_remove(s->store, made, nmade, PS_REMOVE_MISSING_OK, &gone, &ngone,
                        NULL, &st2) == 0) {
      for (size_t i = 0; i < ngone; i++) {
        pthread_rwlock_wrlock(&gone[i]->lock);
        ps_var_mark_deleted(s->store, gone[i]);
        pthread_rwlock_unlock(&gone[i]->lock);
      }
      free(gone);
    }
  }
  free(made);
  if (rc == 0) ps_rpc_call_reply(c, &resp.base);
  paramserver__create_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- Initialize ---- */

/* Variables named in @names (all when empty), or NOT_FOUND. */
static ps_var **resolve(ps_service *s, char **names, size_t n, size_t *out_n,
                        ps_status *st) {
  if (n == 0) return ps_store_list(s->store, out_n);
  ps_var **vars = malloc(n * sizeof *vars);
  if (vars == NULL) {
    ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    vars[i] = ps_store_find(s->store, names[i], st);
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
static int initialize_header(ps_rpc_call *c, const uint8_t *p, size_t n,
                             ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__initialize_request__descriptor, "Initialize");
  Paramserver__InitializeRequest *req =
      paramserver__initialize_request__unpack(NULL, n, p);
  if (req == NULL) return bad_request(st, "Initialize");
  size_t nv = 0;
  int rc = 0;
  ps_var **vars = resolve(s, req->names, req->n_names, &nv, st);
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
    for (size_t i = 0; i < nv && rc == 0; i++) {
      ps_var *v = vars[i];
      if ((rc = ps_var_gone(s->store, v, st)) != 0) break;
      if (!v->has_init) continue;
      if (req->only_uninitialized && v->buf) continue;
      bool dup = false;
      for (size_t k = 0; k < i; k++) dup |= vars[k] == v;
      if (dup) continue;
      if ((bufs[i] = ps_var_init_buf(s->store, v, st)) == NULL) rc = st->code;
    }
    if (rc == 0)
      for (size_t i = 0; i < nv; i++)
        if (bufs[i]) {
          ps_var_set_buf(s->store, vars[i], bufs[i], NULL);
          done[nd++] = vars[i]->name;
        }
    ps_store_unlock_set(vars, nv);
  }
  if (rc == 0) {
    Paramserver__InitializeResponse resp = PARAMSERVER__INITIALIZE_RESPONSE__INIT;
    resp.initialized = done;
    resp.n_initialized = nd;
    ps_rpc_call_reply(c, &resp.base);
  }
  for (size_t i = 0; bufs && i < nv; i++) ps_buf_unref(bufs[i]);
  free(bufs);
  free(done);
  free(vars);
  paramserver__initialize_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- IsInitialized / ReportUninitialized ---- */

static int is_init_header(ps_rpc_call *c, const uint8_t *p, size_t n,
                          ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__names_request__descriptor, "IsInitialized");
  Paramserver__NamesRequest *req = paramserver__names_request__unpack(NULL, n, p);
  if (req == NULL) return bad_request(st, "IsInitialized");
  size_t nv = 0;
  ps_var **vars = resolve(s, req->names, req->n_names, &nv, st);
  int rc = st->code;
  if (vars) {
    protobuf_c_boolean *b = calloc(nv + 1, sizeof *b);
    if (b == NULL) {
      free(vars);
      paramserver__names_request__free_unpacked(req, NULL);
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < nv; i++) {
      pthread_rwlock_rdlock(&vars[i]->lock);
      /* a variable deleted meanwhile: NOT_FOUND if named, else left out */
      if (!vars[i]->deleted)
        b[k++] = vars[i]->buf != NULL;
      else if (req->n_names && rc == 0)
        rc = ps_var_gone(s->store, vars[i], st);
      pthread_rwlock_unlock(&vars[i]->lock);
    }
    if (rc != 0) {
      free(b);
      free(vars);
      paramserver__names_request__free_unpacked(req, NULL);
      return rc;
    }
    nv = k;
    Paramserver__IsInitializedResponse resp =
        PARAMSERVER__IS_INITIALIZED_RESPONSE__INIT;
    resp.initialized = b;
    resp.n_initialized = nv;
    ps_rpc_call_reply(c, &resp.base);
    free(b);
    free(vars);
    rc = 0;
  }
  paramserver__names_request__free_unpacked(req, NULL);
  return rc;
}

static int report_header(ps_rpc_call *c, const uint8_t *p, size_t n,
                         ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__names_request__descriptor, "ReportUninitialized");
  Paramserver__NamesRequest *req = paramserver__names_request__unpack(NULL, n, p);
  if (req == NULL) return bad_request(st, "ReportUninitialized");
  size_t nv = 0;
  ps_var **vars = resolve(s, req->names, req->n_names, &nv, st);
  int rc = st->code;
  if (vars) {
    char **names = calloc(nv + 1, sizeof *names);
    if (names == NULL) {
      free(vars);
      paramserver__names_request__free_unpacked(req, NULL);
      return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < nv; i++) {
      pthread_rwlock_rdlock(&vars[i]->lock);
      if (vars[i]->deleted) {
        if (req->n_names && rc == 0) rc = ps_var_gone(s->store, vars[i], st);
      } else if (vars[i]->buf == NULL) {
        names[k++] = vars[i]->name;
      }
      pthread_rwlock_unlock(&vars[i]->lock);
    }
    if (rc != 0) {
      free(names);
      free(vars);
      paramserver__names_request__free_unpacked(req, NULL);
      return rc;
    }
    Paramserver__ReportUninitializedResponse resp =
        PARAMSERVER__REPORT_UNINITIALIZED_RESPONSE__INIT;
    resp.names = names;
    resp.n_names = k;
    ps_rpc_call_reply(c, &resp.base);
    free(names);
    free(vars);
    rc = 0;
  }
  paramserver__names_request__free_unpacked(req, NULL);
  return rc;
}

/* ---- List / Status ---- */

static int list_header(ps_rpc_call *c, const uint8_t *p, size_t n,
                       ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__list_request__descriptor, "List");
  Paramserver__ListRequest *req = paramserver__list_request__unpack(NULL, n, p);
  if (req == NULL) return bad_request(st, "List");
  paramserver__list_request__free_unpacked(req, NULL);
  size_t nv = 0;
  ps_var **vars = ps_store_list(s->store, &nv);
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

static int status_header(ps_rpc_call *c, const uint8_t *p, size_t n,
                         ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__status_request__descriptor, "Status");
  Paramserver__StatusRequest *req = paramserver__status_request__unpack(NULL, n, p);
  if (req == NULL) return bad_request(st, "Status");
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
  ps_rpc_call_reply(c, &resp.base);
  return 0;
}

static int no_data(ps_rpc_call *c, ps_status *st) { return 0; }

/* ---- Update ---- */

struct upd_ctx;

typedef struct upd_item {
  Paramserver__Update *u;
  struct upd_ctx *x;
  ps_var *v;
  ps_shape shape;   /* value shape */
  ps_buf *val;      /* staged value */
  ps_buf *idx;      /* staged indices (scatter, sparse gradient) */
  size_t isize;     /* bytes per index */
  const ps_opt_info *opt;    /* optimizer ops, else NULL */
  ps_var *slots[PS_OPT_MAX_SLOTS]; /* its slot variables */
  bool sparse;                     /* optimizer op with a sparse gradient */
  /* synchronous updates */
  bool sync;
  ps_sync_update su;
  bool stale;        /* dropped */
  bool waiting;      /* queued in the accumulator (w) */
  int64_t sync_step; /* reply: accumulator step */
  int64_t version;   /* reply: the variable's version */
  ps_sync_waiter w;
} upd_item;

typedef struct upd_ctx {
  Paramserver__UpdateRequest *req;
  upd_item *items;
  size_t n;
  ps_rpc_call *call;
  bool any_sync;
  int64_t bytes;      /* staged bytes (values and indices) */
  atomic_int pending; /* waiting updates + 1 while the handler runs */
  ps_status err;      /* a failure after validation (out of memory) */
} upd_ctx;

/* An APPLY_* op minus APPLY_GRADIENT_DESCENT is its ps_opt_kind. */
#define OPT_OF(op, kind)                                                                 \
  _Static_assert(PARAMSERVER__UPDATE_OP__##op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT == \
                     (kind),                                                             \
                 #op " is " #kind)
OPT_OF(APPLY_GRADIENT_DESCENT, PS_OPT_GRADIENT_DESCENT);
OPT_OF(APPLY_MOMENTUM, PS_OPT_MOMENTUM);
OPT_OF(APPLY_ADAGRAD, PS_OPT_ADAGRAD);
OPT_OF(APPLY_ADAM, PS_OPT_ADAM);
_Static_assert(PARAMSERVER__UPDATE_OP__APPLY_ADAM - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT ==
                   PS_OPT_COUNT - 1,
               "every APPLY_* op has a kernel");
#undef OPT_OF

static const char *op_name(int op) {
  switch (op) {
  case PARAMSERVER__UPDATE_OP__ASSIGN: return "Assign";
  case PARAMSERVER__UPDATE_OP__ASSIGN_ADD: return "AssignAdd";
  case PARAMSERVER__UPDATE_OP__ASSIGN_SUB: return "AssignSub";
  case PARAMSERVER__UPDATE_OP__SCATTER_UPDATE: return "ScatterUpdate";
  case PARAMSERVER__UPDATE_OP__SCATTER_ADD: return "ScatterAdd";
  case PARAMSERVER__UPDATE_OP__SCATTER_SUB: return "ScatterSub";
  default: {
    const ps_opt_info *oi =
        ps_opt_info_get(op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT);
    return oi ? oi->op : "Unknown";
  }
  }
}

static bool is_scatter(int op) {
  return op >= PARAMSERVER__UPDATE_OP__SCATTER_UPDATE &&
         op <= PARAMSERVER__UPDATE_OP__SCATTER_SUB;
}

static bool is_optimizer(int op) {
  return op >= PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT &&
         op <= PARAMSERVER__UPDATE_OP__APPLY_ADAM;
}

/* The kernel's name in errors: SparseApplyMomentum for a sparse gradient. */
static const char *item_op(const upd_item *it) {
  if (it->opt) return it->sparse ? it->opt->sparse_op : it->opt->op;
  return op_name(it->u->op);
}

static const char *plural(size_t n) {
  return n == 1 ? "" : "s";
}

/* Checks what only optimizer ops take (slots, hparams, use_nesterov) and
 * resolves the slot variables; counts are per kernel.  Nothing here depends
 * on the variables' state, which update_data checks under the locks. */
static int resolve_optimizer(ps_service *s, upd_item *it, ps_status *st) {
  Paramserver__Update *u = it->u;
  if (!is_optimizer(u->op)) {
    if (u->n_slots || u->n_hparams || u->use_nesterov)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: only optimizer updates take slots, hparams or "
                           "use_nesterov",
                           op_name(u->op), u->name);
    return 0;
  }
  const ps_opt_info *oi =
      ps_opt_info_get(u->op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT);
  it->opt = oi;
  it->sparse = u->index_dtype != 0;
  const char *op = item_op(it);
  if (!it->sparse && u->num_indices != 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: num_indices is %lld but index_dtype is unset; a "
                         "sparse gradient needs int32 or int64 indices",
                         op, u->name, (long long)u->num_indices);
  if (u->n_slots != oi->nslots) {
    if (oi->nslots == 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: takes no slot variables, got %zu", op, u->name,
                           u->n_slots);
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: takes %zu slot variable%s (%s), got %zu", op, u->name,
                         oi->nslots, plural(oi->nslots), oi->slot_names, u->n_slots);
  }
  if (u->n_hparams != oi->nhparams)
    return ps_status_set(
        st, PS_INVALID_ARGUMENT, "%s %s: takes %zu hparam%s (%s), got %zu", op, u->name,
        oi->nhparams, plural(oi->nhparams), oi->hparam_names, u->n_hparams);
  if (u->use_nesterov && !oi->nesterov)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: use_nesterov applies only to Momentum and Adam", op,
                         u->name);
  if (u->use_nesterov && it->sparse && !oi->sparse_nesterov)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: use_nesterov is not supported with a sparse "
                         "gradient (TensorFlow's sparse Adam has no Nesterov "
                         "variant)",
                         op, u->name);
  for (size_t k = 0; k < u->n_slots; k++) {
    ps_var *sv = ps_store_lookup(s->store, u->slots[k]);
    if (sv == NULL)
      return ps_status_set(st, PS_NOT_FOUND,
                           "%s %s: slot variable %s does not exist on %s", op, u->name,
                           u->slots[k], ps_store_task(s->store));
    if (sv == it->v)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: slot variable %s is the variable itself", op, u->name,
                           u->slots[k]);
    for (size_t j = 0; j < k; j++)
      if (it->slots[j] == sv)
        return ps_status_set(st, PS_INVALID_ARGUMENT,
                             "%s %s: slot variable %s is given twice", op, u->name,
                             u->slots[k]);
    it->slots[k] = sv;
  }
  return 0;
}

/* Checks the synchronous fields of update @i (the rules are in
 * proto/ps.proto). */
static int resolve_sync(upd_ctx *x, size_t i, ps_status *st) {
  upd_item *it = &x->items[i];
  Paramserver__Update *u = it->u;
  const char *op = item_op(it);
  if (u->replicas_to_aggregate < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: replicas_to_aggregate must be positive for a "
                         "synchronous update (0: asynchronous), got %d",
                         op, u->name, u->replicas_to_aggregate);
  if (u->replicas_to_aggregate == 0) {
    if (u->sync_local_step != 0)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: sync_local_step is set but replicas_to_aggregate "
                           "is 0 (asynchronous)",
                           op, u->name);
    return 0;
  }
  if (is_scatter(u->op))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: scatter updates cannot be synchronous", op, u->name);
  if (u->op == PARAMSERVER__UPDATE_OP__ASSIGN && u->no_validate_shape)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Assign %s: a synchronous assign cannot change the shape "
                         "(no_validate_shape)",
                         u->name);
  /* the accumulator adopts a fresh local step and counts on from it */
  if (u->sync_local_step < 0 || u->sync_local_step == INT64_MAX)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: sync_local_step must be in [0, %lld), got %lld", op,
                         u->name, (long long)INT64_MAX, (long long)u->sync_local_step);
  it->sync = true;
  x->any_sync = true;
  return 0;
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)*(void *const *)a, y = (uintptr_t)*(void *const *)b;
  return (x > y) - (x < y);
}

/* At most one synchronous update per variable and request: a worker sends
 * one gradient per step, and the accumulator counts requests' updates. */
static int check_sync_unique(upd_ctx *x, ps_status *st) {
  ps_var **v = malloc((x->n + 1) * sizeof *v);
  if (v == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  size_t k = 0;
  for (size_t i = 0; i < x->n; i++)
    if (x->items[i].sync) v[k++] = x->items[i].v;
  qsort(v, k, sizeof *v, cmp_ptr);
  int rc = 0;
  for (size_t i = 1; i < k && rc == 0; i++)
    if (v[i] == v[i - 1])
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Update: the request has two synchronous updates of %s",
                         v[i]->name);
  free(v);
  return rc;
}

static void update_free(ps_rpc_call *c) {
  upd_ctx *x = ps_rpc_call_ctx(c);
  if (x == NULL) return;
  for (size_t i = 0; i < x->n; i++) {
    ps_buf_unref(x->items[i].val);
    ps_buf_unref(x->items[i].idx);
  }
  free(x->items);
  if (x->req) paramserver__update_request__free_unpacked(x->req, NULL);
  free(x);
}

static int update_header(ps_rpc_call *c, const uint8_t *p, size_t n,
                         ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__update_request__descriptor, "Update");
  upd_ctx *x = calloc(1, sizeof *x);
  if (x == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  ps_rpc_call_set_ctx(c, x);
  x->call = c;
  atomic_init(&x->pending, 1);
  x->req = paramserver__update_request__unpack(NULL, n, p);
  if (x->req == NULL) return bad_request(st, "Update");
  x->n = x->req->n_updates;
  x->items = calloc(x->n + 1, sizeof *x->items);
  if (x->items == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  ps_rpc_segs sink = {0};
  int rc = 0;
  size_t staged = 0;
  for (size_t i = 0; i < x->n && rc == 0; i++) {
    upd_item *it = &x->items[i];
    Paramserver__Update *u = x->req->updates[i];
    it->u = u;
    it->x = x;
    if ((int)u->op < 0 || u->op > PARAMSERVER__UPDATE_OP__APPLY_ADAM) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "update of %s: unknown op %d",
                         u->name, (int)u->op);
      break;
    }
    if ((it->v = ps_store_find(s->store, u->name, st)) == NULL) {
      rc = st->code;
      break;
    }
    if ((rc = resolve_optimizer(s, it, st)) != 0) break;
    if ((rc = resolve_sync(x, i, st)) != 0) break;
    const char *op = item_op(it);
    size_t es = ps_dtype_size(u->dtype);
    if (es == 0) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: unsupported value dtype %d", op,
                         u->name, u->dtype);
      break;
    }
    if ((rc = shape_from(&it->shape, u->shape, u->n_shape, u->name, st)) != 0) break;
    if (is_scatter(u->op) || it->sparse) {
      if (u->index_dtype != PS_DT_INT32 && u->index_dtype != PS_DT_INT64) {
        rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: indices must be int32 or int64, got %s", op, u->name,
                           ps_dtype_name(u->index_dtype));
        break;
      }
      if (u->num_indices < 0) {
        rc = ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: negative index count", op,
                           u->name);
        break;
      }
      it->isize = ps_dtype_size(u->index_dtype);
      size_t ib;
      if ((rc = elems_bytes(s, u->index_dtype, u->num_indices, op, u->name, &ib, st)) !=
              0 ||
          (rc = add_staged(s, &staged, ib, "Update", st)) != 0)
        break;
      if ((it->idx = ps_buf_create(ib, false)) == NULL) {
        rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                           "%s %s: cannot allocate %lld indices", op, u->name,
                           (long long)u->num_indices);
        break;
      }
      ps_rpc_segs_add(&sink, it->idx->data, it->idx->size, NULL);
    }
    size_t vb;
    if ((rc = tensor_bytes(s, u->dtype, &it->shape, op, u->name, &vb, st)) != 0 ||
        (rc = add_staged(s, &staged, vb, "Update", st)) != 0)
      break;
    if ((it->val = ps_buf_create(vb, false)) == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "%s %s: cannot allocate the value (%zu bytes)", op, u->name, vb);
      break;
    }
    ps_rpc_segs_add(&sink, it->val->data, it->val->size, NULL);
  }
  if (rc == 0 && x->any_sync) rc = check_sync_unique(x, st);
  x->bytes = (int64_t)sink.total;
  if (rc == 0 && x->req->inline_data.len > 0) {
    if (x->req->inline_data.len != sink.total)
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Update: inline data has %zu bytes, the updates need %zu",
                         x->req->inline_data.len, sink.total);
    else
      ps_rpc_segs_fill(&sink, 0, x->req->inline_data.data, sink.total);
    ps_rpc_segs_fini(&sink);
  }
  if (rc == 0) ps_rpc_call_expect(c, &sink);
  ps_rpc_segs_fini(&sink);
  return rc;
}

static int64_t index_at(const upd_item *it, int64_t k) {
  if (it->isize == 4) return ((const int32_t *)it->idx->data)[k];
  return ((const int64_t *)it->idx->data)[k];
}

static int check_indices(const void *idx, size_t isize, int64_t n, int64_t bound,
                         const char *var, const char *op, ps_status *st) {
  for (int64_t k = 0; k < n; k++) {
    int64_t i = isize == 4 ? ((const int32_t *)idx)[k] : ((const int64_t *)idx)[k];
    if (i < 0 || i >= bound)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "indices[%lld] = %lld is not in [0, %lld)\n\t "
                           "[[{{node %s/%s}}]]",
                           (long long)k, (long long)i, (long long)bound, var, op);
  }
  return 0;
}

/* Simulated state of a variable while validating a batch in order. */
typedef struct sim {
  ps_var *v;
  bool init;
  ps_shape shape;
} sim;

static int validate_update(upd_item *it, sim *sm, ps_status *st) {
  Paramserver__Update *u = it->u;
  ps_var *v = it->v;
  char a[256], b[256], c2[256];
  const char *op = op_name(u->op);
  if (u->op == PARAMSERVER__UPDATE_OP__ASSIGN && u->no_validate_shape &&
      u->dtype == (int)v->dtype && v->init_full_name &&
      strcmp(v->init_full_name, v->name) && !ps_shape_equal(&sm->shape, &it->shape))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Assign %s: a part of partitioned variable %s cannot "
                         "change its shape (%s to %s, validate_shape off)",
                         v->name, v->init_full_name, fmt_shape(&sm->shape, a, sizeof a),
                         fmt_shape(&it->shape, b, sizeof b));
  if (!is_scatter(u->op)) {
    ps_var_update_kind k = u->op == PARAMSERVER__UPDATE_OP__ASSIGN       ? PS_VAR_ASSIGN
                           : u->op == PARAMSERVER__UPDATE_OP__ASSIGN_ADD ? PS_VAR_ASSIGN_ADD
                                                                         : PS_VAR_ASSIGN_SUB;
    int rc = ps_var_check_update(k, v->name, v->dtype, &sm->shape, sm->init,
                                 (ps_dtype)u->dtype, &it->shape, !u->no_validate_shape, st);
    if (rc == 0 && k == PS_VAR_ASSIGN) {
      sm->init = true;
      sm->shape = it->shape;
    }
    return rc;
  }
  int rc = ps_var_check_dtype(op, v->name, "value", (ps_dtype)u->dtype, v->dtype, st);
  if (rc != 0) return rc;
  if (!sm->init) return ps_var_uninitialized(v->name, st);
  if (!ps_dtype_is_numeric(v->dtype) && u->op != PARAMSERVER__UPDATE_OP__SCATTER_UPDATE)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "%s %s: dtype %s has no arithmetic",
                         op, v->name, ps_dtype_name(v->dtype));
  if (sm->shape.rank < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "params must be at least 1-D, got shape %s\n\t "
                         "[[{{node %s/%s}}]]",
                         fmt_shape(&sm->shape, a, sizeof a), v->name, op);
  ps_shape want = sm->shape, ishape = {.rank = 1, .dim = {u->num_indices}};
  want.dim[0] = u->num_indices;
  if (!ps_shape_equal(&want, &it->shape))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Must have updates.shape = indices.shape + "
                         "params.shape[1:], got updates.shape %s, indices.shape "
                         "%s, params.shape %s\n\t [[{{node %s/%s}}]]",
                         fmt_shape(&it->shape, a, sizeof a),
                         fmt_shape(&ishape, b, sizeof b),
                         fmt_shape(&sm->shape, c2, sizeof c2), v->name, op);
  return check_indices(it->idx->data, it->isize, u->num_indices, sm->shape.dim[0],
                       v->name, op, st);
}

static sim *sim_of(sim *sims, size_t *nsim, ps_var *v) {
  for (size_t k = 0; k < *nsim; k++)
    if (sims[k].v == v) return &sims[k];
  sim *sm = &sims[(*nsim)++];
  sm->v = v;
  sm->init = v->buf != NULL;
  sm->shape = v->shape;
  return sm;
}

/* An optimizer update against the simulated state of its variable (@sm)
 * and slots (@ss).  It changes neither's shape nor initialization. */
static int validate_optimizer(upd_item *it, const sim *sm, sim *const *ss,
                              ps_status *st) {
  Paramserver__Update *u = it->u;
  ps_var *v = it->v;
  const char *op = item_op(it);
  char a[256], b[256], c2[256];
  if (ps_var_check_dtype(op, v->name, "gradient", (ps_dtype)u->dtype, v->dtype, st))
    return st->code;
  if (!ps_kernel_dtype_ok(v->dtype))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: dtype %s is not supported; the optimizer kernels "
                         "run on float and double",
                         op, v->name, ps_dtype_name(v->dtype));
  if (!sm->init)
    return ps_var_uninitialized(v->name, st);
  for (size_t k = 0; k < it->opt->nslots; k++) {
    ps_var *sv = it->slots[k];
    if (sv->dtype != v->dtype)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: slot variable %s has dtype %s, the variable has "
                           "dtype %s",
                           op, v->name, sv->name, ps_dtype_name(sv->dtype),
                           ps_dtype_name(v->dtype));
    if (!ss[k]->init)
      return ps_var_uninitialized(sv->name, st);
    if (!ps_shape_equal(&ss[k]->shape, &sm->shape))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: slot variable %s has shape %s, the variable has "
                           "shape %s",
                           op, v->name, sv->name, fmt_shape(&ss[k]->shape, a, sizeof a),
                           fmt_shape(&sm->shape, b, sizeof b));
  }
  if (!it->sparse) {
    if (!ps_shape_equal(&sm->shape, &it->shape))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s %s: var and grad do not have the same shape: var %s, "
                           "grad %s",
                           op, v->name, fmt_shape(&sm->shape, a, sizeof a),
                           fmt_shape(&it->shape, b, sizeof b));
    return 0;
  }
  if (sm->shape.rank < 1)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: var must be at least 1 dimensional for a sparse "
                         "gradient, got shape %s",
                         op, v->name, fmt_shape(&sm->shape, a, sizeof a));
  ps_shape want = sm->shape, ishape = {.rank = 1, .dim = {u->num_indices}};
  want.dim[0] = u->num_indices;
  if (!ps_shape_equal(&want, &it->shape))
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: Must have grad.shape = indices.shape + "
                         "var.shape[1:], got grad.shape %s, indices.shape %s, "
                         "var.shape %s",
                         op, v->name, fmt_shape(&it->shape, a, sizeof a),
                         fmt_shape(&ishape, b, sizeof b),
                         fmt_shape(&sm->shape, c2, sizeof c2));
  return check_indices(it->idx->data, it->isize, u->num_indices, sm->shape.dim[0],
                       v->name, op, st);
}

/* Runs optimizer @opt's kernel on @v and its slots @slots (validated, all
 * write-locked): the gradient @grad is dense, or rows of @indices. */
static void run_kernel(ps_var *v, ps_var *const *slots, int opt, const char *opname,
                       const void *grad, bool sparse, const void *indices,
                       size_t isize, int64_t nindices, const double *hparams,
                       bool use_nesterov) {
  const ps_opt_info *oi = ps_opt_info_get(opt);
  size_t ns = oi ? oi->nslots : 0;
  ps_status st;
  int rc = ps_var_make_private(v, &st);
  for (size_t k = 0; k < ns && rc == 0; k++)
    rc = ps_var_make_private(slots[k], &st);
  if (rc != 0) {
    PS_ERROR("%s %s: %s", opname, v->name, st.msg);
    return;
  }
  ps_kernel_args a = {
      .opt = (ps_opt_kind)opt,
      .dtype = v->dtype,
      .var = v->buf->data,
      .var_elems = ps_shape_num_elements(&v->shape),
      .row_elems = 1,
      .grad = grad,
      .sparse = sparse,
      .indices = indices,
      .index_size = isize,
      .nindices = nindices,
      .hparams = hparams,
      .use_nesterov = use_nesterov,
  };
  for (size_t k = 0; k < ns; k++)
    a.slots[k] = slots[k]->buf->data;
  for (int d = 1; d < v->shape.rank; d++)
    a.row_elems *= v->shape.dim[d];
  if (ps_kernel_apply(&a) != 0) {
    PS_ERROR("%s %s: the kernel refused a validated update", opname, v->name);
    return;
  }
  v->version++;
  for (size_t k = 0; k < ns; k++)
    slots[k]->version++;
}

static void apply_optimizer(upd_item *it) {
  run_kernel(it->v, it->slots,
             (int)(it->u->op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT),
             item_op(it), it->val->data, it->sparse, it->idx ? it->idx->data : NULL,
             it->isize, it->u->num_indices, it->u->hparams, it->u->use_nesterov);
}

static void apply_update(ps_store *store, upd_item *it) {
  Paramserver__Update *u = it->u;
  ps_var *v = it->v;
  ps_status st;
  if (it->opt) {
    apply_optimizer(it);
    return;
  }
  if (u->op == PARAMSERVER__UPDATE_OP__ASSIGN) {
    ps_var_set_buf(store, v, it->val, &it->shape);
    return;
  }
  if (ps_var_make_private(v, &st) != 0) {
    PS_ERROR("%s", st.msg);
    return;
  }
  int64_t ne = ps_shape_num_elements(&it->shape);
  switch (u->op) {
  case PARAMSERVER__UPDATE_OP__ASSIGN_ADD:
    ps_elem_apply(v->dtype, '+', v->buf->data, it->val->data, ne);
    break;
  case PARAMSERVER__UPDATE_OP__ASSIGN_SUB:
    ps_elem_apply(v->dtype, '-', v->buf->data, it->val->data, ne);
    break;
  default: {
    char opc = u->op == PARAMSERVER__UPDATE_OP__SCATTER_ADD   ? '+'
               : u->op == PARAMSERVER__UPDATE_OP__SCATTER_SUB ? '-'
                                                              : '=';
    int64_t row = v->shape.dim[0] ? ne / (u->num_indices ? u->num_indices : 1) : 0;
    size_t rb = (size_t)row * ps_dtype_size(v->dtype);
    for (int64_t k = 0; k < u->num_indices; k++)
      ps_elem_apply(v->dtype, opc, (uint8_t *)v->buf->data + (size_t)index_at(it, k) * rb,
                    (uint8_t *)it->val->data + (size_t)k * rb, row);
    break;
  }
  }
  v->version++;
}

/* ---- synchronous updates ---- */

/* The accumulator's view of synchronous update @it. */
static void sync_describe(upd_item *it) {
  Paramserver__Update *u = it->u;
  ps_sync_update *su = &it->su;
  memset(su, 0, sizeof *su);
  switch (u->op) {
  case PARAMSERVER__UPDATE_OP__ASSIGN: su->kind = PS_SYNC_ASSIGN; break;
  case PARAMSERVER__UPDATE_OP__ASSIGN_ADD: su->kind = PS_SYNC_ADD; break;
  case PARAMSERVER__UPDATE_OP__ASSIGN_SUB: su->kind = PS_SYNC_SUB; break;
  default:
    su->kind = PS_SYNC_APPLY;
    su->opt = (int)(u->op - PARAMSERVER__UPDATE_OP__APPLY_GRADIENT_DESCENT);
    break;
  }
  su->dtype = (ps_dtype)u->dtype;
  su->shape = it->shape;
  su->value = it->val->data;
  su->sparse = it->sparse;
  su->indices = it->idx ? it->idx->data : NULL;
  su->isize = it->isize;
  su->nindices = it->sparse ? u->num_indices : 0;
  su->slots = u->slots;
  su->nslots = u->n_slots;
  su->hparams = u->hparams;
  su->nhparams = u->n_hparams;
  su->use_nesterov = u->use_nesterov;
  su->replicas = u->replicas_to_aggregate;
  su->local_step = u->sync_local_step;
}

/* Validation of synchronous update @it against its accumulator and the
 * simulated state @sm of its variable (after the checks every update gets;
 * the variable must hold a value before them, also for an assign). */
static int validate_sync(ps_service *s, upd_item *it, const sim *sm, ps_status *st) {
  if (atomic_load(&s->sync_closed))
    return ps_status_set(st, PS_UNAVAILABLE,
                         "%s is shutting down: synchronous update of %s refused",
                         s->task, it->v->name);
  sync_describe(it);
  bool stale, completes;
  int64_t rows = sm->shape.rank > 0 ? sm->shape.dim[0] : 0;
  return ps_accum_check(it->v->accum, &it->su, it->v->epoch, rows, it->v->name, &stale,
                        &completes, st);
}

/* Applies the full step of @it's accumulator with @it's (locked) variable
 * and slots, and prepends the step's waiters to *@done. */
static void sync_apply_step(ps_store *store, upd_item *it, ps_sync_waiter **done) {
  ps_var *v = it->v;
  ps_accum *a = v->accum;
  ps_sync_take t;
  ps_status st;
  if (ps_accum_take(a, &t, &st) != 0) {
    PS_ERROR("synchronous step of %s: %s", v->name, st.msg);
    ps_sync_waiter *w = ps_accum_fail(a, st.code, st.msg);
    while (w) {
      ps_sync_waiter *next = w->next;
      w->next = *done;
      *done = w;
      w = next;
    }
    return;
  }
  switch (t.kind) {
  case PS_SYNC_APPLY: {
    const ps_opt_info *oi = ps_opt_info_get(t.opt);
    run_kernel(v, it->slots, t.opt, t.sparse ? oi->sparse_op : oi->op, t.value, t.sparse,
               t.indices, sizeof(int64_t), t.nindices, t.hparams, t.use_nesterov);
    break;
  }
  case PS_SYNC_ASSIGN: {
    size_t bytes = 0;
    ps_size_bytes(v->dtype, &v->shape, &bytes); /* the variable's: checked */
    ps_buf *b = ps_buf_create(bytes, false);
    if (b == NULL) {
      PS_ERROR("Assign %s: out of memory applying a synchronous step", v->name);
      break;
    }
    memcpy(b->data, t.value, b->size);
    ps_var_set_buf(store, v, b, NULL);
    ps_buf_unref(b);
    break;
  }
  case PS_SYNC_ADD:
  case PS_SYNC_SUB:
    if (ps_var_make_private(v, &st) != 0) {
      PS_ERROR("%s", st.msg);
      break;
    }
    ps_elem_apply(v->dtype, t.kind == PS_SYNC_ADD ? '+' : '-', v->buf->data, t.value,
                  ps_shape_num_elements(&v->shape));
    v->version++;
    break;
  }
  PS_DEBUG("synchronous step %lld of %s applied", (long long)t.step, v->name);
  ps_sync_waiter *w = ps_accum_finish(a, v->version, v->epoch);
  while (w) {
    ps_sync_waiter *next = w->next;
    w->next = *done;
    *done = w;
    w = next;
  }
}

/* Synchronous update @it (validated): dropped when stale, else queued in
 * its accumulator; applies the step when @it fills it. */
static void sync_update(ps_service *s, upd_item *it, ps_sync_waiter **done) {
  ps_var *v = it->v;
  upd_ctx *x = it->x;
  ps_status st;
  if (v->accum == NULL && (v->accum = ps_accum_create()) == NULL) {
    ps_status_set(&x->err, PS_RESOURCE_EXHAUSTED,
                  "out of memory creating the accumulator of %s", v->name);
    return;
  }
  bool stale, completes;
  int64_t rows = v->shape.rank > 0 ? v->shape.dim[0] : 0;
  if (ps_accum_check(v->accum, &it->su, v->epoch, rows, v->name, &stale, &completes,
                     &st) != 0) {
    /* validated a moment ago under the same locks: cannot happen */
    x->err = st;
    return;
  }
  if (stale) {
    it->stale = true;
    it->sync_step = ps_accum_step(v->accum);
    it->version = v->version;
    PS_DEBUG("%s: stale update (local step %lld < %lld) dropped", v->name,
             (long long)it->su.local_step, (long long)it->sync_step);
    return;
  }
  if (ps_accum_add(v->accum, &it->su, v->epoch, &it->w, &st) != 0) {
    x->err = st;
    return;
  }
  it->waiting = true;
  atomic_fetch_add(&x->pending, 1);
  if (ps_accum_full(v->accum)) sync_apply_step(s->store, it, done);
}

/* The reply of a finished call (every synchronous update applied or
 * failed): 0, or the first failure. */
static int update_reply(upd_ctx *x, ps_status *st) {
  if (x->err.code != PS_OK) {
    *st = x->err;
    return st->code;
  }
  for (size_t i = 0; i < x->n; i++) {
    upd_item *it = &x->items[i];
    if (it->waiting && it->w.st.code != PS_OK) {
      *st = it->w.st;
      return st->code;
    }
  }
  Paramserver__UpdateResponse resp = PARAMSERVER__UPDATE_RESPONSE__INIT;
  int64_t *versions = calloc(x->n + 1, sizeof *versions);
  int64_t *steps = calloc(x->n + 1, sizeof *steps);
  protobuf_c_boolean *stale = calloc(x->n + 1, sizeof *stale);
  if (!versions || !steps || !stale) {
    free(versions);
    free(steps);
    free(stale);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < x->n; i++) {
    upd_item *it = &x->items[i];
    versions[i] = it->waiting ? it->w.version : it->version;
    steps[i] = it->waiting ? it->w.step : it->sync_step;
    stale[i] = it->stale;
  }
  resp.versions = versions;
  resp.n_versions = x->n;
  if (x->any_sync) {
    resp.stale = stale;
    resp.n_stale = x->n;
    resp.sync_steps = steps;
    resp.n_sync_steps = x->n;
  }
  ps_rpc_call_reply(x->call, &resp.base);
  free(versions);
  free(steps);
  free(stale);
  return 0;
}

/* One waiting update of a call is done; the last one answers the call.
 * Runs without variable locks (the reply goes out from here). */
static void sync_release(upd_ctx *x) {
  if (atomic_fetch_sub(&x->pending, 1) != 1) return;
  ps_status st;
  ps_status_clear(&st);
  int rc = update_reply(x, &st);
  ps_rpc_call_resume(x->call, rc, &st);
}

static void sync_release_all(ps_sync_waiter *w) {
  while (w) {
    ps_sync_waiter *next = w->next;
    upd_item *it = (upd_item *)(void *)((char *)w - offsetof(upd_item, w));
    sync_release(it->x);
    w = next;
  }
}

void ps_service_shutdown(ps_service *s) {
  atomic_store(&s->sync_closed, true);
  size_t n = 0;
  ps_var **vars = ps_store_list(s->store, &n);
  size_t failed = 0;
  for (size_t i = 0; vars && i < n; i++) {
    ps_var *v = vars[i];
    pthread_rwlock_wrlock(&v->lock);
    ps_sync_waiter *w = NULL;
    if (v->accum) {
      char msg[PS_STATUS_MSG_MAX];
      snprintf(msg, sizeof msg,
               "%s is shutting down: synchronous step %lld of %s was not applied",
               s->task, (long long)ps_accum_step(v->accum), v->name);
      w = ps_accum_fail(v->accum, PS_UNAVAILABLE, msg);
    }
    pthread_rwlock_unlock(&v->lock);
    for (ps_sync_waiter *k = w; k; k = k->next) failed++;
    sync_release_all(w);
  }
  free(vars);
  if (failed) PS_INFO("shutdown: failed %zu waiting synchronous update(s)", failed);
  /* updates parked at a closed snapshot gate are answered now (UNAVAILABLE,
   * see update_deferred) rather than when the gate's hold runs out */
  ps_store_gate_open(s->store);
}

/* ---- the Update handler ---- */

/* Locks every variable of the request, slots included (one write-lock set,
 * taken in name order), validates the whole batch in order against a
 * simulated state, and applies it only if all of it is valid.  Returns 0
 * (replied), an error, or PS_RPC_PENDING when synchronous updates wait for
 * their step. */
static int update_apply(ps_rpc_call *c, ps_status *st);

/* An update that found the snapshot gate closed runs here when it opens. */
static void update_deferred(void *arg) {
  ps_rpc_call *c = arg;
  ps_service *s = ps_rpc_call_server_user(c);
  ps_status st;
  ps_status_clear(&st);
  int rc;
  if (atomic_load(&s->sync_closed)) /* shutting down: answer, apply nothing */
    rc = ps_status_set(&st, PS_UNAVAILABLE,
                       "%s is shutting down: the update waited for a snapshot and was "
                       "not applied",
                       s->task);
  else if (ps_rpc_call_expired(c)) /* its client was told it failed: never apply it */
    rc = ps_status_set(&st, PS_DEADLINE_EXCEEDED,
                       "Update: the deadline passed while the update waited for a "
                       "snapshot on %s; not applied",
                       s->task);
  else
    rc = update_apply(c, &st);
  ps_store_update_leave(s->store);
  if (rc != PS_RPC_PENDING) ps_rpc_call_resume(c, rc, &st);
}

static int update_data(ps_rpc_call *c, ps_status *st) {
  ps_service *s = ps_rpc_call_server_user(c);
  upd_ctx *x = ps_rpc_call_ctx(c);
  bool parked;
  int rc0 = ps_store_update_admit(s->store, update_deferred, c, x->bytes, &parked, st);
  if (rc0 != 0) return rc0;
  if (parked) return PS_RPC_PENDING;
  int rc = update_apply(c, st);
  ps_store_update_leave(s->store);
  return rc;
}

static int update_apply(ps_rpc_call *c, ps_status *st) {
  ps_service *s = ps_rpc_call_server_user(c);
  upd_ctx *x = ps_rpc_call_ctx(c);
  size_t nlock = 0;
  for (size_t i = 0; i < x->n; i++)
    nlock += 1 + (x->items[i].opt ? x->items[i].opt->nslots : 0);
  ps_var **vars = malloc((nlock + 1) * sizeof *vars);
  sim *sims = calloc(nlock + 1, sizeof *sims);
  if (vars == NULL || sims == NULL) {
    free(vars);
    free(sims);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  nlock = 0;
  for (size_t i = 0; i < x->n; i++) {
    upd_item *it = &x->items[i];
    vars[nlock++] = it->v;
    for (size_t k = 0; it->opt && k < it->opt->nslots; k++)
      vars[nlock++] = it->slots[k];
  }
  ps_store_lock_set(vars, nlock, true);
  int rc = 0;
  size_t nsim = 0;
  for (size_t i = 0; i < nlock && rc == 0; i++) rc = ps_var_gone(s->store, vars[i], st);
  for (size_t i = 0; i < x->n && rc == 0; i++) {
    upd_item *it = &x->items[i];
    sim *sm = sim_of(sims, &nsim, it->v);
    if (it->sync && !sm->init) {
      rc = ps_var_uninitialized(it->v->name, st);
      break;
    }
    if (it->opt) {
      sim *ss[PS_OPT_MAX_SLOTS] = {NULL};
      for (size_t k = 0; k < it->opt->nslots; k++)
        ss[k] = sim_of(sims, &nsim, it->slots[k]);
      rc = validate_optimizer(it, sm, ss, st);
    } else {
      rc = validate_update(it, sm, st);
    }
    if (rc == 0 && it->sync) rc = validate_sync(s, it, sm, st);
  }
  ps_sync_waiter *done = NULL;
  if (rc == 0)
    for (size_t i = 0; i < x->n; i++) {
      upd_item *it = &x->items[i];
      if (it->sync) {
        sync_update(s, it, &done);
      } else {
        apply_update(s->store, it);
        it->version = it->v->version;
      }
    }
  ps_store_unlock_set(vars, nlock);
  free(vars);
  free(sims);
  if (rc != 0) return rc;
  /* answer the calls whose last waiting update this one completed (this
   * call still holds its own count, so it is not among them) */
  sync_release_all(done);
  if (atomic_fetch_sub(&x->pending, 1) != 1) return PS_RPC_PENDING;
  return update_reply(x, st);
}

/* ---- Read (whole variables and gathers) ---- */

typedef struct read_item {
  ps_var *v;
  ps_buf *idx;
  size_t isize;
  int64_t nidx;
  bool gather;
} read_item;

typedef struct read_ctx {
  read_item *items;
  size_t n;
} read_ctx;

static void read_free(ps_rpc_call *c) {
  read_ctx *x = ps_rpc_call_ctx(c);
  if (x == NULL) return;
  for (size_t i = 0; i < x->n; i++) ps_buf_unref(x->items[i].idx);
  free(x->items);
  free(x);
}

static int read_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__read_request__descriptor, "Read");
  Paramserver__ReadRequest *req = paramserver__read_request__unpack(NULL, n, p);
  if (req == NULL) return bad_request(st, "Read");
  if ((uint64_t)req->n_items > (uint64_t)s->limits.max_read_names) {
    size_t ni = req->n_items;
    paramserver__read_request__free_unpacked(req, NULL);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "Read: %zu items, above the limit of %lld per call "
                         "(--max-read-names)",
                         ni, (long long)s->limits.max_read_names);
  }
  read_ctx *x = calloc(1, sizeof *x);
  int rc = 0;
  if (x == NULL || (x->items = calloc(req->n_items + 1, sizeof *x->items)) == NULL) {
    free(x);
    paramserver__read_request__free_unpacked(req, NULL);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  ps_rpc_call_set_ctx(c, x);
  x->n = req->n_items;
  ps_rpc_segs sink = {0};
  size_t staged = 0;
  for (size_t i = 0; i < x->n && rc == 0; i++) {
    Paramserver__ReadItem *ri = req->items[i];
    read_item *it = &x->items[i];
    if ((it->v = ps_store_find(s->store, ri->name, st)) == NULL) {
      rc = st->code;
      break;
    }
    if (!ri->gather) continue;
    it->gather = true;
    if (ri->index_dtype != PS_DT_INT32 && ri->index_dtype != PS_DT_INT64) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "Gather %s: indices must be int32 or int64, got %s",
                         ri->name, ps_dtype_name(ri->index_dtype));
      break;
    }
    if (ri->num_indices < 0) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT, "Gather %s: negative index count %lld",
                         ri->name, (long long)ri->num_indices);
      break;
    }
    if (ri->num_indices > s->limits.max_gather_rows) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "Gather %s: %lld rows, above the limit of %lld per gather "
                         "(--max-gather-rows)",
                         ri->name, (long long)ri->num_indices,
                         (long long)s->limits.max_gather_rows);
      break;
    }
    size_t ib;
    if ((rc = elems_bytes(s, ri->index_dtype, ri->num_indices, "Gather", ri->name, &ib,
                          st)) != 0 ||
        (rc = add_staged(s, &staged, ib, "Read", st)) != 0)
      break;
    it->isize = ps_dtype_size(ri->index_dtype);
    it->nidx = ri->num_indices;
    it->idx = ps_buf_create(ib, false);
    if (it->idx == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Gather %s: out of memory",
                         ri->name);
      break;
    }
    ps_rpc_segs_add(&sink, it->idx->data, it->idx->size, NULL);
  }
  if (rc == 0) ps_rpc_call_expect(c, &sink);
  ps_rpc_segs_fini(&sink);
  paramserver__read_request__free_unpacked(req, NULL);
  return rc;
}

static int read_data(ps_rpc_call *c, ps_status *st) {
  ps_service *s = ps_rpc_call_server_user(c);
  read_ctx *x = ps_rpc_call_ctx(c);
  ps_var **vars = malloc((x->n + 1) * sizeof *vars);
  Paramserver__TensorMeta *metas = calloc(x->n + 1, sizeof *metas);
  Paramserver__TensorMeta **mp = calloc(x->n + 1, sizeof *mp);
  int64_t *dims = calloc((x->n + 1) * PS_MAX_RANK, sizeof *dims);
  ps_buf **bufs = calloc(x->n + 1, sizeof *bufs);
  int rc = 0;
  if (!vars || !metas || !mp || !dims || !bufs) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < x->n; i++) vars[i] = x->items[i].v;
  size_t built = 0; /* bytes of the gathered tensors */
  /* All variables of one read are taken at one moment. */
  ps_store_lock_set(vars, x->n, false);
  for (size_t i = 0; i < x->n && rc == 0; i++) {
    read_item *it = &x->items[i];
    ps_var *v = it->v;
    Paramserver__TensorMeta *m = &metas[i];
    paramserver__tensor_meta__init(m);
    mp[i] = m;
    m->name = v->name;
    m->dtype = v->dtype;
    m->version = v->version;
    m->shape = dims + i * PS_MAX_RANK;
    if ((rc = ps_var_gone(s->store, v, st)) != 0) break;
    if (v->buf == NULL) {
      rc = ps_var_uninitialized(v->name, st);
      break;
    }
    if (!it->gather) {
      memcpy(m->shape, v->shape.dim, (size_t)v->shape.rank * sizeof *dims);
      m->n_shape = (size_t)v->shape.rank;
      bufs[i] = ps_buf_ref(v->buf);
      continue;
    }
    char a[256];
    if (v->shape.rank < 1) {
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "params must be at least 1-D, got shape %s\n\t "
                         "[[{{node %s/Gather}}]]",
                         fmt_shape(&v->shape, a, sizeof a), v->name);
      break;
    }
    if ((rc = check_indices(it->idx->data, it->isize, it->nidx, v->shape.dim[0],
                            v->name, "Gather", st)) != 0)
      break;
    memcpy(m->shape, v->shape.dim, (size_t)v->shape.rank * sizeof *dims);
    m->shape[0] = it->nidx;
    m->n_shape = (size_t)v->shape.rank;
    size_t rb = v->shape.dim[0] ? v->buf->size / (size_t)v->shape.dim[0] : 0;
    ps_shape gs = v->shape;
    gs.dim[0] = it->nidx;
    size_t gb;
    if ((rc = tensor_bytes(s, v->dtype, &gs, "Gather", v->name, &gb, st)) != 0 ||
        (rc = add_staged(s, &built, gb, "Read", st)) != 0)
      break;
    bufs[i] = ps_buf_create(gb, false);
    if (bufs[i] == NULL) {
      rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "Gather %s: out of memory",
                         v->name);
      break;
    }
    for (int64_t k = 0; k < it->nidx; k++) {
      int64_t r = it->isize == 4 ? ((const int32_t *)it->idx->data)[k]
                                 : ((const int64_t *)it->idx->data)[k];
      memcpy((uint8_t *)bufs[i]->data + (size_t)k * rb,
             (const uint8_t *)v->buf->data + (size_t)r * rb, rb);
    }
  }
  ps_store_unlock_set(vars, x->n);
  if (rc == 0) {
    Paramserver__ReadResponse resp = PARAMSERVER__READ_RESPONSE__INIT;
    resp.tensors = mp;
    resp.n_tensors = x->n;
    ps_rpc_call_reply(c, &resp.base);
    for (size_t i = 0; i < x->n; i++)
      ps_rpc_call_reply_data(c, bufs[i]->data, bufs[i]->size, bufs[i]);
  }
out:
  if (bufs)
    for (size_t i = 0; i < x->n; i++) ps_buf_unref(bufs[i]);
  free(bufs);
  free(dims);
  free(mp);
  free(metas);
  free(vars);
  return rc;
}

/* ---- Delete ---- */

static int delete_header(ps_rpc_call *c, const uint8_t *p, size_t n, ps_status *st) {
  ps_service *s = svc_of(c);
  CHECK_WIRE(paramserver__delete_request__descriptor, "Delete");
  Paramserver__DeleteRequest *req = paramserver__delete_request__unpack(NULL, n, p);
  if (req == NULL) return bad_request(st, "Delete");
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
  if ((rc = ps_store_remove(s->store, req->names, req->n_names, flags, &vars, &nv,
                            missing, st)) != 0)
    goto out;
  for (size_t i = 0; i < req->n_names; i++)
    if (missing[i]) miss[nmiss++] = req->names[i];
  /* Out of the table now; mark each deleted under its lock, so calls that
   * still hold it answer NOT_FOUND, and fail what waits for its step. */
  for (size_t i = 0; i < nv; i++) {
    ps_var *v = vars[i];
    ps_sync_waiter *w = NULL;
    pthread_rwlock_wrlock(&v->lock);
    if (v->accum) {
      char msg[PS_STATUS_MSG_MAX];
      snprintf(msg, sizeof msg, "variable %s was deleted on %s: synchronous step %lld "
               "was not applied", v->name, s->task, (long long)ps_accum_step(v->accum));
      w = ps_accum_fail(v->accum, PS_NOT_FOUND, msg);
    }
    ps_var_mark_deleted(s->store, v);
    pthread_rwlock_unlock(&v->lock);
    sync_release_all(w);
    PS_INFO("deleted variable %s", v->name);
  }
  names = calloc(nv + 1, sizeof *names);
  if (names == NULL) {
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < nv; i++) names[i] = vars[i]->name;
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

static ps_rpc_handler handlers[64];
static size_t nhandlers;
static const ps_rpc_handler base_handlers[] = {
    {"/paramserver.Ps/Create", create_header, no_data, NULL},
    {"/paramserver.Ps/Initialize", initialize_header, no_data, NULL},
    {"/paramserver.Ps/IsInitialized", is_init_header, no_data, NULL},
    {"/paramserver.Ps/ReportUninitialized", report_header, no_data, NULL},
    {"/paramserver.Ps/Update", update_header, update_data, update_free},
    {"/paramserver.Ps/Read", read_header, read_data, read_free},
    {"/paramserver.Ps/List", list_header, no_data, NULL},
    {"/paramserver.Ps/Status", status_header, no_data, NULL},
    {"/paramserver.Ps/Delete", delete_header, no_data, NULL},
};

const ps_rpc_handler *ps_service_handlers(size_t *n) {
  if (nhandlers == 0) {
    size_t nb = sizeof base_handlers / sizeof base_handlers[0];
    memcpy(handlers, base_handlers, sizeof base_handlers);
    memcpy(handlers + nb, ps_ckpt_handlers, sizeof ps_ckpt_handlers);
    nhandlers = nb + sizeof ps_ckpt_handlers / sizeof ps_ckpt_handlers[0];
  }
  *n = nhandlers;
  return handlers;
}

/* ---- the `checkpoint` state file (common/checkpoint.c) ---- */

int ps_service_update_state(ps_service *svc, const char *prefix, int max_to_keep,
                            double keep_every_n_hours, ps_status *st) {
  (void)svc;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", prefix);
  char *sl = strrchr(dir, '/');
  if (sl) *sl = '\0';
  ps_ckpt_manager_options o;
  ps_ckpt_manager_options_init(&o);
  o.max_to_keep = max_to_keep < 0 ? 0 : max_to_keep;
  if (keep_every_n_hours > 0) o.keep_checkpoint_every_n_hours = keep_every_n_hours;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return ps_ckpt_record(dir, prefix, &o, (double)now.tv_sec + (double)now.tv_nsec / 1e9, st);
}

int ps_service_latest(ps_service *svc, char **prefix, ps_status *st) {
  if (svc->ckpt_dir == NULL)
    return ps_status_set(st, PS_FAILED_PRECONDITION,
                         "this ps has no --checkpoint-dir: it cannot save or restore");
  return ps_latest_checkpoint(svc->ckpt_dir, prefix, st);
}
