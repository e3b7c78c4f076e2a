/* The request checks every handler of the Ps service shares (declared in
 * service_internal.h, with CHECK_WIRE): the service of a call, a request
 * that does not parse, the number of items of a request, byte sizes held
 * to the limits (ps_service_limits) before anything is allocated, shapes,
 * initializers and indices.  Each returns 0, or the status it set, whose
 * text names the method, the variable and the limit. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/init.h"
#include "common/status.h"
#include "common/tensor.h"
#include "common/variable.h"
#include "common/wire.h"
#include "ps.pb-c.h"
#include "service_internal.h"

ps_service *ps_svc_of_(ps_rpc_call *c) {
  ps_service *s = ps_rpc_call_server_user(c);
  atomic_fetch_add_explicit(&s->rpcs, 1, memory_order_relaxed);
  return s;
}

int ps_svc_bad_request_(ps_status *st, const char *method) {
  return ps_status_set(st, PS_INVALID_ARGUMENT, "%s: request message does not parse",
                       method);
}

/* CHECK_WIRE's second step, once ps_wire_check_strings has refused names
 * with NUL or control characters, or over-long (protobuf-c would cut
 * "w\0evil" to "w"): every request's list (field 1: Create's vars,
 * Update's updates, Read's items, the names of Initialize, IsInitialized,
 * ReportUninitialized and Delete) is counted on the wire before protobuf-c
 * allocates it: a 32 MiB header could otherwise hold millions of items. */
int ps_svc_check_items_(ps_service *s, const uint8_t *p, size_t n, const char *method,
                        ps_status *st) {
  size_t k = ps_wire_count_field(p, n, 1);
  if ((uint64_t)k > (uint64_t)s->limits.max_read_names)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "%s: %zu items, above the limit of %lld per call "
                         "(--max-read-names)",
                         method, k, (long long)s->limits.max_read_names);
  return 0;
}

/* The byte size of a tensor of @dtype and @shape that a request names:
 * INVALID_ARGUMENT if it does not fit in memory at all, RESOURCE_EXHAUSTED
 * above --max-tensor-bytes; checked before anything is allocated. */
int ps_svc_tensor_bytes_(ps_service *s, int dtype, const ps_shape *shape,
                         const char *what, const char *var, size_t *out, ps_status *st) {
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
int ps_svc_add_staged_(ps_service *s, size_t *total, size_t add, const char *method,
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
int ps_svc_elems_bytes_(ps_service *s, int dtype, int64_t count, const char *what,
                        const char *var, size_t *out, ps_status *st) {
  ps_shape sh = {.rank = 1, .dim = {count}};
  return ps_svc_tensor_bytes_(s, dtype, &sh, what, var, out, st);
}

int ps_svc_shape_from_(ps_shape *s, const int64_t *dims, size_t n, const char *var,
                       ps_status *st) {
  if (ps_shape_set(s, dims, n, st) != 0) return ps_status_prefix(st, "variable %s", var);
  return 0;
}

const char *ps_svc_fmt_shape_(const ps_shape *s, char *buf, size_t n) {
  return ps_shape_format(s, buf, n);
}

int ps_svc_init_from_proto_(const Paramserver__Initializer *p, const char *var, int dtype,
                            ps_init_spec *out, ps_status *st) {
  int t = ps_init_type_from_name(p->type);
  if (t < 0)
    return ps_status_set(st, PS_INVALID_ARGUMENT, "variable %s: unknown initializer '%s'",
                         var, p->type);
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
      return ps_status_set(st, PS_INVALID_ARGUMENT, "variable %s: unknown fan mode '%s'",
                           var, p->mode);
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

int ps_svc_check_indices_(const void *idx, size_t isize, int64_t n, int64_t bound,
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

/* Update.fill's spec, the full shape it fills a part of (@shape for a
 * whole variable) and the name that picks its random stream. */
static int fill_spec(const Paramserver__Update *u, const ps_shape *shape,
                     ps_init_spec *init, ps_shape *full, const char **nm, ps_status *st) {
  *full = *shape;
  *nm = u->fill->full_name[0] ? u->fill->full_name : u->name;
  int rc = ps_svc_init_from_proto_(u->fill, u->name, u->dtype, init, st);
  if (rc == 0 && u->fill->n_full_shape)
    rc =
        ps_svc_shape_from_(full, u->fill->full_shape, u->fill->n_full_shape, u->name, st);
  return rc;
}

/* An assign of a graph's initializer filled here (Update.fill): an
 * asynchronous ASSIGN without indices, its initializer valid for the
 * value's dtype and shape (or for the part's place in its full shape). */
int ps_svc_check_fill_(const Paramserver__Update *u, const ps_shape *shape, bool sync,
                       const char *op, ps_status *st) {
  if (u->op != PARAMSERVER__UPDATE_OP__ASSIGN || sync || u->index_dtype || u->num_indices)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s %s: only an asynchronous Assign can take an initializer "
                         "(fill)",
                         op, u->name);
  ps_init_spec init;
  ps_shape full;
  const char *nm;
  int rc = fill_spec(u, shape, &init, &full, &nm, st);
  if (rc == 0)
    rc = ps_init_check(&init, nm, u->dtype, &full, u->fill->offset,
                       ps_shape_num_elements(shape), st);
  if (rc != 0) ps_status_prefix(st, "Assign %s", u->name);
  return rc;
}

/* Fills it->val with the initializer check_fill() accepted: the values
 * the client's ps_init_fill_draw() would compute for the same run. */
int ps_svc_run_fill_(const Paramserver__Update *u, const ps_shape *shape, void *out,
                     ps_status *st) {
  ps_init_spec init;
  ps_shape full;
  const char *nm;
  uint64_t seed = u->fill_seed;
  int rc = fill_spec(u, shape, &init, &full, &nm, st);
  if (rc == 0)
    rc = ps_init_fill_draw(&init, nm, u->dtype, &full, u->fill->offset,
                           ps_shape_num_elements(shape), &seed, u->fill_draw, out, st);
  if (rc != 0) ps_status_prefix(st, "Assign %s", u->name);
  return rc;
}

int ps_svc_expect_(ps_rpc_call *c, int rc, const ProtobufCBinaryData *inl,
                   ps_rpc_segs *sink, const char *method, const char *items,
                   ps_status *st) {
  if (rc == 0 && inl->len > 0) {
    if (inl->len != sink->total)
      rc = ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: inline data has %zu bytes, the %s need %zu", method,
                         inl->len, items, sink->total);
    else
      ps_rpc_segs_fill(sink, 0, inl->data, sink->total);
    ps_rpc_segs_fini(sink);
  }
  if (rc == 0) ps_rpc_call_expect(c, sink);
  ps_rpc_segs_fini(sink);
  return rc;
}
