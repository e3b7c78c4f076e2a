/* Variable initializers that run on the ps (TensorFlow's init_ops.py).
 *
 * The spec and its names are public (paramserver/init.h); filling is done
 * only by the ps (and a session's local variables).  Values are
 * deterministic by (seed, variable name, element index) only, so a ps
 * holding one part of a partitioned variable fills exactly the values the
 * same range of an unpartitioned fill would have.  All functions are pure
 * and may be called from any thread. */
#ifndef PS_INIT_H
#define PS_INIT_H

#include <stddef.h>
#include <stdint.h>

#include "paramserver/init.h"
#include "status.h"
#include "tensor.h"

/* Fills elements [@offset, @offset + @count) of the full tensor of shape
 * @full_shape (row-major) into @out, which holds @count elements of
 * @dtype.  @name is the variable's full name: it picks the random stream
 * and appears in error messages.  Fans for variance scaling come from
 * @full_shape, so every part of a partitioned variable uses the same scale.
 *
 * Random initializers need float, double, half or bfloat16; zeros, ones
 * and constant take any numeric dtype, complex and bool.  Errors
 * (INVALID_ARGUMENT, @out untouched): a bad range or shape, an unsupported
 * dtype, bad parameters, a constant list longer than the tensor. */
int ps_init_fill(const ps_init_spec *spec, const char *name, int dtype,
                 const ps_shape *full_shape, int64_t offset, int64_t count, void *out,
                 ps_status *st);

/* ps_init_fill() for draw @draw of the initializer (0: the first) with
 * @seed (NULL: 87654321) when the spec gives none (seed 0).  TensorFlow's
 * random kernels advance their Philox counter at every run by 256 samples
 * per output; draw d starts there, d * 64 * (elements of @full_shape)
 * calls on, so every part of a partitioned variable agrees on it. */
int ps_init_fill_draw(const ps_init_spec *spec, const char *name, int dtype,
                      const ps_shape *full_shape, int64_t offset, int64_t count,
                      const uint64_t *seed, uint64_t draw, void *out, ps_status *st);

/* Everything ps_init_fill() checks, without filling: the parameters, the
 * dtype, and that elements [@offset, @offset + @count) lie inside
 * @full_shape.  0 or INVALID_ARGUMENT naming @name, with ps_init_fill()'s
 * texts.  A spec that passes cannot make ps_init_fill() fail. */
int ps_init_check(const ps_init_spec *spec, const char *name, int dtype,
                  const ps_shape *full_shape, int64_t offset, int64_t count,
                  ps_status *st);

/* FNV-1a 64 of the name's bytes (NULL hashes as ""); the Philox seed2. */
uint64_t ps_init_name_hash(const char *name);

#endif
