/* The List answer's decoder: entries unpacked and checked one at a time,
 * against the client's receive limit. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/tensor.h"
#include "common/wire.h"

/* The most entries a List answer may have: their ps_var_infos take at most
 * PS_CLIENT_LIST_MEMORY_FACTOR times the receive limit (a 9-byte entry on
 * the wire becomes a ps_var_info of some 340 bytes). */
#define PS_CLIENT_LIST_MEMORY_FACTOR 4
static size_t list_max_entries(int64_t max_message_bytes) {
  if (max_message_bytes <= 0) max_message_bytes = PS_CLIENT_DEFAULT_MAX_MESSAGE_BYTES;
  return (size_t)max_message_bytes * PS_CLIENT_LIST_MEMORY_FACTOR / sizeof(ps_var_info);
}

static int cmp_name_ptr(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A variable listed twice: a ps holds one variable per name. */
static int list_unique(const list_out *o, ps_status *st) {
  if (o->n < 2) return 0;
  char **names = malloc(o->n * sizeof *names);
  if (names == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < o->n; i++)
    names[i] = o->v[i].name;
  qsort(names, o->n, sizeof *names, cmp_name_ptr);
  int rc = 0;
  for (size_t i = 1; i < o->n && rc == 0; i++)
    if (strcmp(names[i - 1], names[i]) == 0)
      rc = ps_cl_bad_answer_(st, M_LIST, "variable %s is listed twice", names[i]);
  free(names);
  return rc;
}

/* One entry of a List answer, checked, appended to @o. */
static int list_add(list_out *o, size_t *cap, size_t i, const Paramserver__VarInfo *vi,
                    ps_status *st) {
  if (vi->name[0] == '\0')
    return ps_cl_bad_answer_(st, M_LIST, "entry %zu has no name", i);
  ps_var_info v = {.dtype = (ps_dtype)vi->dtype,
                   .bytes = vi->bytes,
                   .initialized = vi->initialized,
                   .version = vi->version,
                   .task = o->task,
                   .offset = vi->offset};
  size_t bytes;
  if (ps_cl_answer_shape_(o->task, M_LIST, vi->name, vi->dtype, vi->shape, vi->n_shape,
                          &v.shape, &bytes, st) != 0)
    return st->code;
  if (vi->bytes < 0 || (size_t)vi->bytes != bytes)
    return ps_cl_bad_answer_(st, M_LIST, "variable %s has %lld bytes, its shape %zu",
                             vi->name, (long long)vi->bytes, bytes);
  bool part = vi->full_name && vi->full_name[0];
  if (part) {
    size_t fb;
    int64_t n = ps_shape_num_elements(&v.shape);
    if (ps_cl_answer_shape_(o->task, M_LIST, vi->full_name, vi->dtype, vi->full_shape,
                            vi->n_full_shape, &v.full_shape, &fb, st) != 0)
      return st->code;
    if (vi->offset < 0 || vi->offset > ps_shape_num_elements(&v.full_shape) - n)
      return ps_cl_bad_answer_(st, M_LIST, "variable %s: offset %lld is outside %s",
                               vi->name, (long long)vi->offset, vi->full_name);
  } else {
    v.offset = 0;
  }
  if (o->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    ps_var_info *nv = realloc(o->v, (nc + 1) * sizeof *nv);
    if (nv == NULL) return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
    o->v = nv;
    *cap = nc;
  }
  v.name = strdup(vi->name);
  v.full_name = part ? strdup(vi->full_name) : NULL;
  if (v.name == NULL || (part && v.full_name == NULL)) {
    free(v.name);
    free(v.full_name);
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  }
  o->v[o->n++] = v;
  return 0;
}

/* The entries are unpacked one at a time and checked as they come, so a
 * flood of empty or bad ones stops at the first. */
int ps_cl_parse_list_(void *user, const uint8_t *p, size_t n, ps_rpc_segs *sink,
                      ps_status *st) {
  list_out *o = user;
  ps_client_free_var_info(o->v, o->n);
  o->v = NULL;
  o->n = 0;
  if (ps_cl_wire_ok_(&paramserver__list_response__descriptor, M_LIST, p, n, st))
    return st->code;
  /* counted on the wire before anything is allocated for them */
  size_t count = ps_wire_count_field(p, n, 1),
         most = list_max_entries(o->max_message_bytes);
  if (count > most)
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "ps/%d at %s: List: %zu variables, more than the %zu a "
                         "client holds with a limit of %lld bytes (--max-message-bytes)",
                         o->task, o->addr, count, most, (long long)o->max_message_bytes);
  const uint8_t *q = p, *end = p + n, *val;
  uint64_t field;
  size_t len, cap = 0, i = 0;
  int w, rc = 0;
  while (rc == 0 && (w = ps_cl_wire_next_(&q, end, &field, &val, &len)) > 0) {
    if (field != 1) continue;
    Paramserver__VarInfo *vi = val ? paramserver__var_info__unpack(NULL, len, val) : NULL;
    if (vi == NULL) {
      rc = ps_cl_bad_answer_(st, M_LIST, "entry %zu does not parse", i);
      break;
    }
    rc = list_add(o, &cap, i++, vi, st);
    paramserver__var_info__free_unpacked(vi, NULL);
  }
  if (rc == 0 && w < 0) rc = ps_cl_bad_answer_(st, M_LIST, "the answer does not parse");
  if (rc == 0) rc = list_unique(o, st);
  if (rc == 0 && o->v == NULL && (o->v = calloc(1, sizeof *o->v)) == NULL)
    rc = ps_status_set(st, PS_RESOURCE_EXHAUSTED, "out of memory");
  return rc;
}

void ps_client_free_var_info(ps_var_info *v, size_t n) {
  if (v == NULL) return;
  for (size_t i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].full_name);
  }
  free(v);
}
