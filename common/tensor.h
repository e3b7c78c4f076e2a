/* Tensor internals: checked size arithmetic, refcounted buffers and
 * elementwise arithmetic.  Data types, shapes and the tensor API are public
 * (paramserver/tensor.h).
 *
 * A tensor's bytes live in a ps_buf, which is shared by reference: the ps
 * hands a buffer to gRPC as a zero-copy slice and keeps serving; writers
 * replace or copy a buffer that someone else still references (copy on
 * write), so a reader always sees a consistent value. */
#ifndef PS_TENSOR_H
#define PS_TENSOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paramserver/tensor.h"
#include "status.h"

/* Checked size arithmetic: every byte count computed from sizes that come
 * from outside (shapes, element and index counts of requests and files)
 * goes through these before anything is allocated or indexed.  Each
 * returns 0 and sets *@out, or -1 (*@out untouched) when the result does
 * not fit in PS_SIZE_MAX (INT64_MAX, so it also fits an int64 and a
 * size_t). */
#define PS_SIZE_MAX ((size_t)INT64_MAX)
int ps_size_mul(size_t a, size_t b, size_t *out);
int ps_size_add(size_t a, size_t b, size_t *out);
/* Bytes of a tensor of @dtype and @s: -1 also for a dtype without a fixed
 * size (string, unknown) and for a negative dim. */
int ps_size_bytes(int dtype, const ps_shape *s, size_t *out);
/* Bytes of @count elements of @dtype (a negative count is -1). */
int ps_size_elems(int dtype, int64_t count, size_t *out);

/* Refcounted byte buffer, 64-byte aligned.  Any thread may ref/unref. */
struct ps_buf {
  atomic_long refs;
  size_t size;
  size_t alloc; /* bytes allocated (size rounded up to 64) */
  void *data;
};

/* Uninitialized bytes (zeroed if @zero).  NULL if out of memory or if
 * @size exceeds PS_SIZE_MAX (so the rounding up to 64 cannot wrap).  Big
 * buffers (>= 1 MiB) are recycled through a small bounded cache
 * (PS_BUF_CACHE_MB, default 256; 0 disables it). */
ps_buf *ps_buf_create(size_t size, bool zero);
/* As ps_buf_create(@size, false) for a buffer a read fills at once (a
 * restore's staging buffer): new memory is faulted in small pages, and
 * ps_buf_advise_huge(), called once it is filled, lets the kernel merge it
 * into huge pages later (see tensor.c). */
ps_buf *ps_buf_create_for_read(size_t size);
void ps_buf_advise_huge(ps_buf *b);
ps_buf *ps_buf_ref(ps_buf *b);
void ps_buf_unref(ps_buf *b); /* NULL is a no-op */
/* Frees the big buffers the cache keeps for reuse; returns their bytes. */
size_t ps_buf_cache_release(void);

/* Internal code reads the buffer pointer inline; the public function of
 * the same name (tensor.c) serves library users. */
static inline void *ps_tensor_data_inline(const ps_tensor *t) {
  return t->buf ? t->buf->data : NULL;
}
#define ps_tensor_data(t) ps_tensor_data_inline(t)

/* dst op= src elementwise over @n elements of @dtype (op: '+', '-', '=').
 * Integer arithmetic wraps (two's complement), as TensorFlow's does.
 * Returns -1 for a dtype without arithmetic. */
int ps_elem_apply(int dtype, char op, void *dst, const void *src, int64_t n);

/* @n bfloat16 values to float32 (exact) and float32 to bfloat16 (rounded to
 * nearest even, NaN kept a NaN), as ps_bf16_to_float / ps_float_to_bf16
 * do one at a time: the wire form of gradients sent as bfloat16. */
void ps_bf16_widen(float *dst, const uint16_t *src, size_t n);
void ps_bf16_narrow(uint16_t *dst, const float *src, size_t n);

/* TensorFlow's other dtypes (types.proto), which a checkpoint may hold but
 * the ps computes nothing on, written once:
 *   X(number, enum name, bytes per element: 0 when not a fixed size) */
#define PS_DTYPE_STORED_LIST(X)                                                          \
  X(11, "DT_QINT8", 1)                                                                   \
  X(12, "DT_QUINT8", 1)                                                                  \
  X(13, "DT_QINT32", 4)                                                                  \
  X(15, "DT_QINT16", 2)                                                                  \
  X(16, "DT_QUINT16", 2)                                                                 \
  X(20, "DT_RESOURCE", 0)                                                                \
  X(21, "DT_VARIANT", 0)                                                                 \
  X(24, "DT_FLOAT8_E5M2", 0)                                                             \
  X(25, "DT_FLOAT8_E4M3FN", 0)                                                           \
  X(29, "DT_INT4", 0)                                                                    \
  X(30, "DT_UINT4", 0)

/* Bytes per element of any dtype of either list (a checkpoint's entries);
 * 0 for strings, unknown numbers and dtypes without a fixed size. */
size_t ps_dtype_stored_size(int dtype);
/* TensorFlow's enum name of any dtype of either list ("DT_QINT8"); NULL
 * for an unknown number. */
const char *ps_dtype_any_enum_name(int dtype);

/* ---- per-dtype code from PS_DTYPE_LIST ----
 *
 * Integer arithmetic wraps (two's complement), TensorFlow's rule, written
 * once: T is the element type, U its arithmetic type (the list's unsigned
 * twin).  1u * widens narrow types to unsigned int first, so that no
 * operand is promoted to a signed int that could overflow. */
#define PS_WRAP_ADD(T, U, a, b) ((T)(1u * (U)(a) + 1u * (U)(b)))
#define PS_WRAP_SUB(T, U, a, b) ((T)(1u * (U)(a)-1u * (U)(b)))
#define PS_WRAP_MUL(T, U, a, b) ((T)(1u * (U)(a) * (U)(b)))

/* A switch on @dt with one case per dtype of PS_DTYPE_LIST that code runs
 * natively.  The caller defines, around the switch,
 *   PS_CASE_FLOAT(T, U)   the statement for float and double
 *   PS_CASE_INT(T, U)     (PS_DTYPE_SWITCH_NATIVE) the one for the integers
 * and every other dtype runs @otherwise.  Each case ends with break. */
#define PS_DTYPE_CASE_FLOAT_(E, T, U)                                                    \
  case PS_DT_##E:                                                                        \
    PS_CASE_FLOAT(T, U);                                                                 \
    break;
#define PS_DTYPE_CASE_INT_(E, T, U)                                                      \
  case PS_DT_##E:                                                                        \
    PS_CASE_INT(T, U);                                                                   \
    break;
#define PS_DTYPE_CASE_NONE_(E, T, U)
#define PS_DTYPE_FLOAT_FLOAT_ PS_DTYPE_CASE_FLOAT_
#define PS_DTYPE_FLOAT_INT_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_NATIVE_FLOAT_ PS_DTYPE_CASE_FLOAT_
#define PS_DTYPE_NATIVE_INT_ PS_DTYPE_CASE_INT_
#define PS_DTYPE_FLOAT_HALF_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_NATIVE_HALF_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_FLOAT_BF16_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_NATIVE_BF16_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_FLOAT_BOOL_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_NATIVE_BOOL_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_FLOAT_COMPLEX_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_NATIVE_COMPLEX_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_FLOAT_STRING_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_NATIVE_STRING_ PS_DTYPE_CASE_NONE_
#define PS_DTYPE_X_FLOAT_(E, N, NAME, SIZE, T, U, KIND) PS_DTYPE_FLOAT_##KIND##_(E, T, U)
#define PS_DTYPE_X_NATIVE_(E, N, NAME, SIZE, T, U, KIND)                                 \
  PS_DTYPE_NATIVE_##KIND##_(E, T, U)
#define PS_DTYPE_SWITCH_FLOAT(dt, otherwise)                                             \
  switch (dt) {                                                                          \
    PS_DTYPE_LIST(PS_DTYPE_X_FLOAT_)                                                     \
  default:                                                                               \
    otherwise;                                                                           \
    break;                                                                               \
  }
#define PS_DTYPE_SWITCH_NATIVE(dt, otherwise)                                            \
  switch (dt) {                                                                          \
    PS_DTYPE_LIST(PS_DTYPE_X_NATIVE_)                                                    \
  default:                                                                               \
    otherwise;                                                                           \
    break;                                                                               \
  }

#endif
