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

#include "paramserver/api.h"
#include "paramserver/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The data types, written once.  Each row:
 *   X(ENUM, number, name, size, C type, arithmetic type, kind)
 * ENUM makes PS_DT_<ENUM>; number is TensorFlow's DataType (types.proto);
 * name is TF's DataTypeString; size is bytes per element (0: no fixed
 * size); the C type is how one element is stored (for COMPLEX, each of
 * its two halves); the arithmetic type is
 * the type sums run in (the unsigned twin for integers, so they wrap as
 * TensorFlow's do); kind is one of
 *   FLOAT  native floating point        INT     native integer
 *   HALF   IEEE half, through float     BF16    bfloat16, through float
 *   BOOL   one byte, 0 or 1             COMPLEX two floating halves
 *   STRING no fixed size
 * The dtype enum, the name/size table and the element access of tensor.c
 * are generated from this list; add a type here and nowhere else. */
#define PS_DTYPE_LIST(X)                                                                 \
  X(FLOAT, 1, "float", 4, float, float, FLOAT)                                           \
  X(DOUBLE, 2, "double", 8, double, double, FLOAT)                                       \
  X(INT32, 3, "int32", 4, int32_t, uint32_t, INT)                                        \
  X(UINT8, 4, "uint8", 1, uint8_t, uint8_t, INT)                                         \
  X(INT16, 5, "int16", 2, int16_t, uint16_t, INT)                                        \
  X(INT8, 6, "int8", 1, int8_t, uint8_t, INT)                                            \
  X(STRING, 7, "string", 0, void, void, STRING)                                          \
  X(COMPLEX64, 8, "complex64", 8, float, float, COMPLEX)                                 \
  X(INT64, 9, "int64", 8, int64_t, uint64_t, INT)                                        \
  X(BOOL, 10, "bool", 1, uint8_t, uint8_t, BOOL)                                         \
  X(BFLOAT16, 14, "bfloat16", 2, uint16_t, float, BF16)                                  \
  X(UINT16, 17, "uint16", 2, uint16_t, uint16_t, INT)                                    \
  X(COMPLEX128, 18, "complex128", 16, double, double, COMPLEX)                           \
  X(HALF, 19, "half", 2, uint16_t, float, HALF)                                          \
  X(UINT32, 22, "uint32", 4, uint32_t, uint32_t, INT)                                    \
  X(UINT64, 23, "uint64", 8, uint64_t, uint64_t, INT)

/* TensorFlow's DataType enum (types.proto): PS_DT_FLOAT = 1, ... */
#define PS_DTYPE_ENUM_(E, N, NAME, SIZE, T, U, KIND) PS_DT_##E = N,
typedef enum ps_dtype { PS_DT_INVALID = 0, PS_DTYPE_LIST(PS_DTYPE_ENUM_) } ps_dtype;
#undef PS_DTYPE_ENUM_

/* Bytes per element; 0 for DT_STRING, DT_INVALID and unknown numbers. */
PS_API size_t ps_dtype_size(int dtype);
/* TensorFlow's DataTypeString: "float", "int32", "bfloat16"... ("unknown"). */
PS_API const char *ps_dtype_name(int dtype);
/* The Python DType.name: "float32", "float64", "float16", else as
 * ps_dtype_name ("int32", "bool", "bfloat16"...). */
PS_API const char *ps_dtype_python_name(int dtype);
/* The enum name: "DT_FLOAT" ("DT_INVALID" if unknown). */
PS_API const char *ps_dtype_enum_name(int dtype);
/* Accepts "float", "float32", "DT_FLOAT", "int64", ...; PS_DT_INVALID if not. */
PS_API ps_dtype ps_dtype_from_name(const char *s);
/* True for the numeric types the ps can do arithmetic on. */
PS_API bool ps_dtype_is_numeric(int dtype);
PS_API bool ps_dtype_is_floating(int dtype);

#define PS_MAX_RANK 16

/* A shape: rank 0 is a scalar.  Initialize as {rank, {d0, d1, ...}}. */
typedef struct ps_shape {
  int rank;
  int64_t dim[PS_MAX_RANK];
} ps_shape;

/* Number of elements; -1 if any dim is negative or the product overflows. */
PS_API int64_t ps_shape_num_elements(const ps_shape *s);
PS_API bool ps_shape_equal(const ps_shape *a, const ps_shape *b);
/* "[2,3]" as TensorFlow prints shapes in errors ("[]" for a scalar). */
PS_API char *ps_shape_format(const ps_shape *s, char *buf, size_t n);
/* As Python's TensorShape prints: "(5, 5, 32, 32)", "(3,)", "()", "(?, 2)",
 * "<unknown>" for an unknown rank. */
PS_API char *ps_shape_format_py(const ps_shape *s, char *buf, size_t n);
/* Fills @s from @dims[0..rank); INVALID_ARGUMENT for rank > PS_MAX_RANK or a
 * negative dim. */
PS_API int ps_shape_set(ps_shape *s, const int64_t *dims, size_t rank, ps_status *st);

/* The refcounted buffer that holds a tensor's bytes (internal). */
typedef struct ps_buf ps_buf;

typedef struct ps_tensor {
  ps_dtype dtype;
  ps_shape shape;
  ps_buf *buf; /* NULL for an empty tensor; internal: use ps_tensor_data() */
} ps_tensor;

/* Heap tensor with uninitialized (or zeroed) contents; NULL on bad dtype,
 * negative dims or out of memory.  Free with ps_tensor_destroy(). */
PS_API ps_tensor *ps_tensor_create(ps_dtype dtype, const ps_shape *shape, bool zero);
/* Convenience: rank and dims as arguments; the contents are zeroed. */
PS_API ps_tensor *ps_tensor_new(ps_dtype dtype, int rank, const int64_t *dims);
PS_API void ps_tensor_destroy(ps_tensor *t); /* NULL is a no-op */
/* The first byte of the elements (64-byte aligned); NULL for an empty
 * tensor.  Valid until the tensor is destroyed. */
PS_API void *ps_tensor_data(const ps_tensor *t);
PS_API size_t ps_tensor_nbytes(const ps_tensor *t);
PS_API int64_t ps_tensor_num_elements(const ps_tensor *t);

/* String tensors (DT_STRING), as fetched from report_uninitialized_variables:
 * a 1-D tensor of @n copies of the NUL-terminated strings @s.  Their bytes
 * are not the element array of ps_tensor_data(); read them with
 * ps_tensor_string(). */
PS_API ps_tensor *ps_tensor_new_strings(const char *const *s, size_t n);
/* Element @i of a DT_STRING tensor; NULL if @t is not one or @i is out of
 * range. */
PS_API const char *ps_tensor_string(const ps_tensor *t, int64_t i);

/* IEEE half and bfloat16 conversions (round to nearest even). */
PS_API float ps_half_to_float(uint16_t h);
PS_API uint16_t ps_float_to_half(float f);
PS_API float ps_bf16_to_float(uint16_t h);
PS_API uint16_t ps_float_to_bf16(float f);

/* Element i of a numeric or bool buffer as double / store a double
 * (converted as a C cast would; 0 / nothing for other dtypes). */
PS_API double ps_elem_get(int dtype, const void *p, int64_t i);
PS_API void ps_elem_set(int dtype, void *p, int64_t i, double v);

#ifdef __cplusplus
}
#endif

#endif
