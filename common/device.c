/* TensorFlow device strings: parse, merge and print them the way TF 1.x's
 * Python DeviceSpec does (tensorflow/python/framework/device.py), because
 * the device strings a worker puts on ops are produced by that code and the
 * ps must place variables by the very same rules (replica_device_setter is
 * parse + merge_from + to_string).
 *
 * The string is read part by part ("/"-separated, each split at ':') with
 * no allocation and no copy of the input beyond the bounded struct fields.
 * Where Python would accept garbage that only fails later in the C++
 * placer (a job called "", a task "+1", a 200-character job name) this
 * parser rejects it here, naming the whole string. */
#include "device.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

void ps_device_init(ps_device *d) {
  memset(d, 0, sizeof *d);
  d->replica = PS_DEVICE_UNSET;
  d->task = PS_DEVICE_UNSET;
  d->index = PS_DEVICE_UNSET;
}

/* One ':'-separated field of a part: not NUL-terminated. */
typedef struct field {
  const char *p;
  size_t n;
} field;

static bool field_is(field f, const char *word) {
  return f.n == strlen(word) && memcmp(f.p, word, f.n) == 0;
}

/* Case-insensitive, for the legacy "/cpu:0" form (TF upper()s it). */
static bool field_is_nocase(field f, const char *word) {
  if (f.n != strlen(word)) return false;
  for (size_t i = 0; i < f.n; i++)
    if (toupper((unsigned char)f.p[i]) != word[i]) return false;
  return true;
}

/* Decimal digits only, 0..INT_MAX; -1 if anything else. */
static int field_number(field f) {
  if (f.n == 0 || f.n > 10) return -1;
  long long v = 0;
  for (size_t i = 0; i < f.n; i++) {
    if (f.p[i] < '0' || f.p[i] > '9') return -1;
    v = v * 10 + (f.p[i] - '0');
  }
  return v > INT_MAX ? -1 : (int)v;
}

static bool field_is_name(field f) {
  if (f.n == 0) return false;
  for (size_t i = 0; i < f.n; i++) {
    unsigned char c = (unsigned char)f.p[i];
    if (!isalnum(c) && c != '_') return false;
  }
  return true;
}

static int bad_number(const char *what, field f, const char *s, ps_status *st) {
  return ps_status_set(st, PS_INVALID_ARGUMENT,
                       "device '%.256s': bad %s '%.*s' (must be a number "
                       "from 0 to %d)",
                       s, what, (int)(f.n > 64 ? 64 : f.n), f.p, INT_MAX);
}

static int set_index(ps_device *d, field f, const char *s, ps_status *st) {
  if (field_is(f, "*")) {
    d->index = PS_DEVICE_ANY;
    return 0;
  }
  int v = field_number(f);
  if (v < 0) return bad_number("device index", f, s, st);
  d->index = v;
  return 0;
}

/* Applies one part ("job:ps", "device:GPU:1", "cpu") of @s to @d. */
static int apply_part(ps_device *d, const field *y, int ly, const char *s,
                      ps_status *st) {
  if (ly == 2 && field_is(y[0], "job")) {
    if (!field_is_name(y[1]))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "device '%.256s': bad job name '%.*s' (letters, "
                           "digits and _ only)",
                           s, (int)(y[1].n > 64 ? 64 : y[1].n), y[1].p);
    if (y[1].n >= sizeof d->job)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "device '%.256s': job name is too long (max %zu "
                           "characters)",
                           s, sizeof d->job - 1);
    memcpy(d->job, y[1].p, y[1].n);
    d->job[y[1].n] = '\0';
    return 0;
  }
  if (ly == 2 && (field_is(y[0], "replica") || field_is(y[0], "task"))) {
    bool replica = field_is(y[0], "replica");
    int v = field_number(y[1]);
    if (v < 0) return bad_number(replica ? "replica" : "task", y[1], s, st);
    *(replica ? &d->replica : &d->task) = v;
    return 0;
  }
  if ((ly == 1 || ly == 2) &&
      (field_is_nocase(y[0], "CPU") || field_is_nocase(y[0], "GPU") ||
       field_is_nocase(y[0], "EPU"))) {
    if (d->type[0] != '\0')
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Cannot specify multiple device types: %.256s", s);
    for (size_t i = 0; i < 3; i++)
      d->type[i] = (char)toupper((unsigned char)y[0].p[i]);
    d->type[3] = '\0';
    return ly == 2 ? set_index(d, y[1], s, st) : 0;
  }
  if (ly == 3 && field_is(y[0], "device")) {
    if (d->type[0] != '\0')
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "Cannot specify multiple device types: %.256s", s);
    if (!field_is_name(y[1]))
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "device '%.256s': bad device type '%.*s' (letters, "
                           "digits and _ only)",
                           s, (int)(y[1].n > 64 ? 64 : y[1].n), y[1].p);
    if (y[1].n >= sizeof d->type)
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "device '%.256s': device type is too long (max "
                           "%zu characters)",
                           s, sizeof d->type - 1);
    if (field_is(y[1], "cpu") || field_is(y[1], "gpu")) {
      for (size_t i = 0; i < 3; i++)
        d->type[i] = (char)toupper((unsigned char)y[1].p[i]);
      d->type[3] = '\0';
    } else {
      memcpy(d->type, y[1].p, y[1].n);
      d->type[y[1].n] = '\0';
    }
    return set_index(d, y[2], s, st);
  }
  return ps_status_set(st, PS_INVALID_ARGUMENT, "Unknown attribute: '%.*s' in '%.256s'",
                       (int)(y[0].n > 64 ? 64 : y[0].n), y[0].p, s);
}

int ps_device_parse(const char *s, ps_device *d, ps_status *st) {
  ps_device out;
  ps_device_init(&out);
  ps_device_init(d);
  if (s == NULL) s = "";
  const char *p = s;
  for (;;) {
    const char *end = strchr(p, '/');
    if (end == NULL) end = p + strlen(p);
    if (end > p) {
      /* At most 3 fields mean something; a 4th only needs to be noticed. */
      field y[4];
      int ly = 0;
      const char *q = p;
      while (ly < 4) {
        const char *c = memchr(q, ':', (size_t)(end - q));
        const char *fe = c ? c : end;
        y[ly++] = (field){q, (size_t)(fe - q)};
        if (c == NULL) break;
        q = c + 1;
      }
      int rc = apply_part(&out, y, ly, s, st);
      if (rc != 0) return rc;
    }
    if (*end == '\0') break;
    p = end + 1;
  }
  *d = out;
  return 0;
}

void ps_device_merge(ps_device *dst, const ps_device *src) {
  if (src->job[0] != '\0') memcpy(dst->job, src->job, sizeof dst->job);
  if (src->replica >= 0) dst->replica = src->replica;
  if (src->task >= 0) dst->task = src->task;
  if (src->type[0] != '\0') memcpy(dst->type, src->type, sizeof dst->type);
  /* '*' is None in TF, so it never overwrites. */
  if (src->index >= 0) dst->index = src->index;
}

char *ps_device_format(const ps_device *d, char *buf, size_t n) {
  char job[72] = "", replica[24] = "", task[24] = "", dev[48] = "";
  if (n == 0) return buf;
  if (d->job[0] != '\0') snprintf(job, sizeof job, "/job:%.63s", d->job);
  if (d->replica >= 0) snprintf(replica, sizeof replica, "/replica:%d", d->replica);
  if (d->task >= 0) snprintf(task, sizeof task, "/task:%d", d->task);
  if (d->type[0] != '\0') {
    if (d->index >= 0)
      snprintf(dev, sizeof dev, "/device:%.15s:%d", d->type, d->index);
    else
      snprintf(dev, sizeof dev, "/device:%.15s:*", d->type);
  }
  snprintf(buf, n, "%s%s%s%s", job, replica, task, dev);
  return buf;
}

bool ps_device_equal(const ps_device *a, const ps_device *b) {
  char x[PS_DEVICE_STRING_MAX], y[PS_DEVICE_STRING_MAX];
  return strcmp(ps_device_format(a, x, sizeof x), ps_device_format(b, y, sizeof y)) == 0;
}
