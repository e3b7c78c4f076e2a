/* libpsworker: data types, shapes and tensors.
 *
 * Data types are TensorFlow's DataType numbers (types.proto), so a dtype
 * means the same on the wire, in a checkpoint and in this API.  A tensor's
 * bytes are row-major elements of its dtype; they live in a buffer the
 * library may share by reference with calls in flight, so read and write
 * them only through ps_tensor_data() of a tensor you own.
 *
 * Every function here is pure or touches only its arguments: any thread may
 * call them, on different tensors at once. */
#ifndef PARAMSERVER_TENSOR_H
#define PARAMSERVER_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paramserver/status.h"

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

/* A shape: rank 0 is a scalar.  Initialize as {rank, {d0, d1, ...}}. */
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

/* The refcounted buffer that holds a tensor's bytes (internal). */
typedef struct ps_buf ps_buf;

typedef struct ps_tensor {
  ps_dtype dtype;
  ps_shape shape;
  ps_buf *buf; /* NULL for an empty tensor; internal: use ps_tensor_data() */
} ps_tensor;

/* Heap tensor with uninitialized (or zeroed) contents; NULL on bad dtype,
 * negative dims or out of memory.  Free with ps_tensor_destroy(). */
ps_tensor *ps_tensor_create(ps_dtype dtype, const ps_shape *shape, bool zero);
/* Convenience: rank and dims as arguments; the contents are zeroed. */
ps_tensor *ps_tensor_new(ps_dtype dtype, int rank, const int64_t *dims);
void ps_tensor_destroy(ps_tensor *t); /* NULL is a no-op */
/* The first byte of the elements (64-byte aligned); NULL for an empty
 * tensor.  Valid until the tensor is destroyed. */
void *ps_tensor_data(const ps_tensor *t);
size_t ps_tensor_nbytes(const ps_tensor *t);
int64_t ps_tensor_num_elements(const ps_tensor *t);

/* IEEE half and bfloat16 conversions (round to nearest even). */
float ps_half_to_float(uint16_t h);
uint16_t ps_float_to_half(float f);
float ps_bf16_to_float(uint16_t h);
uint16_t ps_float_to_bf16(float f);

/* Element i of a numeric or bool buffer as double / store a double
 * (converted as a C cast would; 0 / nothing for other dtypes). */
double ps_elem_get(int dtype, const void *p, int64_t i);
void ps_elem_set(int dtype, void *p, int64_t i, double v);

#endif
