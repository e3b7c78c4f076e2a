/* TensorFlow device strings ("/job:ps/replica:0/task:1/device:CPU:0"), as
 * tf.DeviceSpec parses, merges and prints them.
 *
 * All functions are pure and thread-safe; nothing allocates. */
#ifndef PS_DEVICE_H
#define PS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

/* Value of an int field that is not set (TF's None). */
#define PS_DEVICE_UNSET (-1)
/* Value of @index after an explicit '*' ("/device:GPU:*").  TF stores None
 * for it, so merge and equal treat it exactly like PS_DEVICE_UNSET; it only
 * records that the string said '*'. */
#define PS_DEVICE_ANY (-2)
/* A buffer this large always holds ps_device_format()'s output. */
#define PS_DEVICE_STRING_MAX 192

typedef struct ps_device {
  char job[64];  /* "" = unset; else [A-Za-z0-9_]+ */
  int replica;   /* -1 = unset */
  int task;      /* -1 = unset */
  char type[16]; /* "" = unset; "CPU", "GPU", "EPU" or from /device:TYPE:N */
  int index;     /* -1 = unset, PS_DEVICE_ANY = '*' */
} ps_device;

/* Sets every field to unset (the empty device string ""). */
void ps_device_init(ps_device *d);

/* Parses a device string as DeviceSpec.from_string does: "/"-separated
 * parts "job:J", "replica:R", "task:T", "device:TYPE:I" (I may be '*'), and
 * the legacy "cpu:0" / "GPU:1" / "gpu" forms; empty parts are skipped, a
 * later job/replica/task overrides an earlier one.  Lower-case cpu/gpu
 * become CPU/GPU.  Stricter than TF where TF would accept nonsense: numbers
 * are decimal digits without sign, names [A-Za-z0-9_]+ and not too long for
 * the struct.  On error returns PS_INVALID_ARGUMENT with a message naming
 * @s (TF's wording where it has one: "Unknown attribute: 'foo' in
 * '/foo:bar'", "Cannot specify multiple device types: ...") and leaves @d
 * unset. */
int ps_device_parse(const char *s, ps_device *d, ps_status *st);

/* DeviceSpec.merge_from: each field set in @src overwrites @dst. */
void ps_device_merge(ps_device *dst, const ps_device *src);

/* DeviceSpec.to_string: "/job:J", "/replica:R", "/task:T",
 * "/device:TYPE:I" (I is '*' when unset), only the parts that are set, in
 * that order.  Always NUL-terminates when @n > 0, truncating if the buffer
 * is short (PS_DEVICE_STRING_MAX is always enough).  Returns @buf. */
char *ps_device_format(const ps_device *d, char *buf, size_t n);

/* True when both print the same string (so '*' equals an unset index). */
bool ps_device_equal(const ps_device *a, const ps_device *b);

#endif
