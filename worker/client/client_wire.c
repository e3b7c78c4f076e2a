/* Checks of a ps's answers: a ps is input from outside, so every answer
 * is checked against its request (strings, shapes, byte sizes, names)
 * before anything is used or allocated. */
#include "client_internal.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/tensor.h"
#include "common/wire.h"

/* "Read" of "/paramserver.Ps/Read". */
const char *ps_cl_method_name_(const char *method) {
  const char *s = strrchr(method, '/');
  return s ? s + 1 : method;
}

/* INTERNAL: the ps broke the protocol ("Read: ..."); the task is added by
 * ps_cl_annotate_(). */
int ps_cl_bad_answer_(ps_status *st, const char *method, const char *fmt, ...) {
  char m[PS_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  return ps_status_set(st, PS_INTERNAL, "%s: %s", ps_cl_method_name_(method), m);
}

/* Strings of an answer with control characters, or over the limit of a
 * name, are refused before anything is unpacked (a name printed by psctl
 * must not carry terminal escapes). */
int ps_cl_wire_ok_(const ProtobufCMessageDescriptor *d, const char *method,
                   const uint8_t *p, size_t n, ps_status *st) {
  ps_status w;
  ps_status_clear(&w);
  if (ps_wire_check_strings(d, p, n, "answer", &w) == 0) return 0;
  return ps_cl_bad_answer_(st, method, "%s", w.msg);
}

/* The bytes of the biggest tensor an answer may announce: this machine's
 * memory.  Checked before the allocator is asked. */
size_t ps_cl_tensor_limit_(void) {
  static _Atomic size_t lim;
  size_t l = atomic_load(&lim);
  if (l == 0) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0 || ps_size_mul((size_t)pages, (size_t)psz, &l) != 0)
      l = PS_SIZE_MAX;
    atomic_store(&lim, l);
  }
  return l;
}

/* Reads a varint at *@q (before @end); -1 if malformed. */
static int wire_varint(const uint8_t **q, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*q >= end) return -1;
    uint8_t b = *(*q)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* The next top-level field at *@q: its number, and for a length-delimited
 * one its bytes (@val, @len; else @val NULL).  1: a field, 0: the end,
 * -1: malformed. */
int ps_cl_wire_next_(const uint8_t **q, const uint8_t *end, uint64_t *field,
                     const uint8_t **val, size_t *len) {
  if (*q >= end) return 0;
  uint64_t key, v;
  if (wire_varint(q, end, &key) != 0) return -1;
  *field = key >> 3;
  *val = NULL;
  *len = 0;
  switch (key & 7) {
  case 0:
    return wire_varint(q, end, &v) == 0 ? 1 : -1;
  case 1:
  case 5: {
    size_t w = (key & 7) == 1 ? 8 : 4;
    if ((size_t)(end - *q) < w) return -1;
    *q += w;
    return 1;
  }
  case 2:
    if (wire_varint(q, end, &v) != 0 || v > (uint64_t)(end - *q)) return -1;
    *val = *q;
    *len = (size_t)v;
    *q += v;
    return 1;
  default:
    return -1;
  }
}

/* A shape and dtype of an answer: a dtype with a size, a rank of at most
 * PS_MAX_RANK, dims >= 0, a byte size that fits and that this machine
 * could hold (*@bytes). */
int ps_cl_answer_shape_(int task, const char *method, const char *name, int dtype,
                        const int64_t *dims, size_t rank, ps_shape *out, size_t *bytes,
                        ps_status *st) {
  if (ps_dtype_size(dtype) == 0)
    return ps_cl_bad_answer_(st, method, "variable %s has dtype %d, not a dtype", name,
                             dtype);
  if (rank > PS_MAX_RANK)
    return ps_cl_bad_answer_(st, method,
                             "variable %s has rank %zu, above the maximum of %d", name,
                             rank, PS_MAX_RANK);
  for (size_t i = 0; i < rank; i++)
    if (dims[i] < 0)
      return ps_cl_bad_answer_(st, method, "variable %s has a negative dimension (%lld)",
                               name, (long long)dims[i]);
  ps_shape_set(out, dims, rank, NULL);
  size_t b;
  char sh[256];
  if (ps_size_bytes(dtype, out, &b) != 0)
    return ps_cl_bad_answer_(st, method, "variable %s: %s of shape %s has too many bytes",
                             name, ps_dtype_name(dtype),
                             ps_shape_format(out, sh, sizeof sh));
  if (b > ps_cl_tensor_limit_())
    return ps_status_set(st, PS_RESOURCE_EXHAUSTED,
                         "ps/%d: %s: variable %s: %s of shape %s is %zu bytes, more "
                         "than this machine's memory (%zu bytes)",
                         task, ps_cl_method_name_(method), name, ps_dtype_name(dtype),
                         ps_shape_format(out, sh, sizeof sh), b, ps_cl_tensor_limit_());
  *bytes = b;
  return 0;
}

/* Every string of an answer's list is a name: not empty. */
int ps_cl_names_ok_(const char *method, const char *what, char **v, size_t n,
                    ps_status *st) {
  for (size_t i = 0; i < n; i++)
    if (v[i] == NULL || v[i][0] == '\0')
      return ps_cl_bad_answer_(st, method, "%s %zu is empty", what, i);
  return 0;
}
