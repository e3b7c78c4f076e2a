/* Tensors: TensorFlow's DataType numbers, shapes, and refcounted buffers.
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

#include "status.h"

/* TensorFlow's DataType enum (types.proto). */
typedef enum ps_dtype {
  PS_DT_INVALID = 0,
  PS_DT_FLOAT = 1,
  PS_DT_DOUBLE = 2,
  PS_DT_INT32 = 3,
  PS_DT_UINT8 = 4,
  PS_DT_INT16 = 5,
  PS_DT_INT8 = 6,
  PS_DT_STRING = 7,
  PS_DT_COMPLEX64 = 8,
  PS_DT_INT64 = 9,
  PS_DT_BOOL = 10,
  PS_DT_BFLOAT16 = 14,
  PS_DT_UINT16 = 17,
  PS_DT_COMPLEX128 = 18,
  PS_DT_HALF = 19,
  PS_DT_UINT32 = 22,
  PS_DT_UINT64 = 23,
} ps_dtype;

/* Bytes per element; 0 for DT_STRING, DT_INVALID and unknown numbers. */
size_t ps_dtype_size(int dtype);
/* TensorFlow's DataTypeString: "float", "int32", "bfloat16"... ("unknown"). */
const char *ps_dtype_name(int dtype);
/* The enum name: "DT_FLOAT" ("DT_INVALID" if unknown). */
const char *ps_dtype_enum_name(int dtype);
/* Accepts "float", "float32", "DT_FLOAT", "int64", ...; PS_DT_INVALID if not. */
ps_dtype ps_dtype_from_name(const char *s);
/* True for the numeric types the ps can do arithmetic on. */
bool ps_dtype_is_numeric(int dtype);
bool ps_dtype_is_floating(int dtype);

#define PS_MAX_RANK 16

typedef struct ps_shape {
  int rank;
  int64_t dim[PS_MAX_RANK];
} ps_shape;

/* Number of elements; -1 if any dim is negative or the product overflows. */
int64_t ps_shape_num_elements(const ps_shape *s);
bool ps_shape_equal(const ps_shape *a, const ps_shape *b);
/* "[2,3]" as TensorFlow prints shapes in errors ("[]" for a scalar). */
char *ps_shape_format(const ps_shape *s, char *buf, size_t n);
/* Fills @s from @dims[0..rank); INVALID_ARGUMENT for rank > PS_MAX_RANK or a
 * negative dim. */
int ps_shape_set(ps_shape *s, const int64_t *dims, size_t rank, ps_status *st);

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
typedef struct ps_buf {
  atomic_long refs;
  size_t size;
  size_t alloc; /* bytes allocated (size rounded up to 64) */
  void *data;
} ps_buf;

/* Uninitialized bytes (zeroed if @zero).  NULL if out of memory or if
 * @size exceeds PS_SIZE_MAX (so the rounding up to 64 cannot wrap).  Big
 * buffers (>= 1 MiB) are recycled through a small bounded cache
 * (PS_BUF_CACHE_MB, default 256; 0 disables it). */
ps_buf *ps_buf_create(size_t size, bool zero);
ps_buf *ps_buf_ref(ps_buf *b);
void ps_buf_unref(ps_buf *b); /* NULL is a no-op */

typedef struct ps_tensor {
  ps_dtype dtype;
  ps_shape shape;
  ps_buf *buf; /* NULL for an empty tensor */
} ps_tensor;

/* Heap tensor with uninitialized (or zeroed) contents; NULL on bad dtype,
 * negative dims or out of memory. */
ps_tensor *ps_tensor_create(ps_dtype dtype, const ps_shape *shape, bool zero);
/* Convenience: rank and dims as arguments. */
ps_tensor *ps_tensor_new(ps_dtype dtype, int rank, const int64_t *dims);
void ps_tensor_destroy(ps_tensor *t); /* NULL is a no-op */
static inline void *ps_tensor_data(const ps_tensor *t) {
  return t->buf ? t->buf->data : NULL;
}
size_t ps_tensor_nbytes(const ps_tensor *t);
int64_t ps_tensor_num_elements(const ps_tensor *t);

/* IEEE half and bfloat16 conversions (round to nearest even). */
float ps_half_to_float(uint16_t h);
uint16_t ps_float_to_half(float f);
float ps_bf16_to_float(uint16_t h);
uint16_t ps_float_to_bf16(float f);

/* Element i of a numeric buffer as double / store a double. */
double ps_elem_get(int dtype, const void *p, int64_t i);
void ps_elem_set(int dtype, void *p, int64_t i, double v);

/* dst op= src elementwise over @n elements of @dtype (op: '+', '-', '=').
 * Integer arithmetic wraps (two's complement), as TensorFlow's does.
 * Returns -1 for a dtype without arithmetic. */
int ps_elem_apply(int dtype, char op, void *dst, const void *src, int64_t n);

#endif
