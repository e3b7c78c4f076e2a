/* Wire-level checks of protobuf requests (see wire.h).
 *
 * The protobuf encoding is a sequence of (tag, value) pairs; the tag is a
 * varint holding field_number << 3 | wire_type.  Wire type 2 (length
 * delimited) carries strings, bytes, sub-messages and packed repeated
 * scalars; the descriptor says which.  Only strings are checked and only
 * sub-messages are entered (to a bounded depth), so the walk is linear in
 * the request size and never allocates. */
#include "wire.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 16

static bool read_varint(const uint8_t *p, size_t n, size_t *off, uint64_t *v) {
  uint64_t r = 0;
  for (int shift = 0; shift < 64 && *off < n; shift += 7) {
    uint8_t b = p[(*off)++];
    r |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = r;
      return true;
    }
  }
  return false;
}

char *ps_wire_escape(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  if (cap == 0) return out;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char tmp[5];
    size_t k;
    if (c < 0x20 || c >= 0x7f || c == '\\' || c == '"')
      k = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
    else {
      tmp[0] = (char)c;
      k = 1;
    }
    if (o + k + 4 > cap) { /* room for "..." and the NUL */
      if (o + 4 <= cap) memcpy(out + o, "...", 3), o += 3;
      break;
    }
    memcpy(out + o, tmp, k);
    o += k;
  }
  out[o] = '\0';
  return out;
}

static int check_string(const ProtobufCMessageDescriptor *d,
                        const ProtobufCFieldDescriptor *f, const uint8_t *s, size_t len,
                        const char *what, ps_status *st) {
  if (len > PS_WIRE_MAX_STRING)
    return ps_status_set(st, PS_INVALID_ARGUMENT,
                         "%s: %s.%s is %zu bytes; the limit is %d", what, d->short_name,
                         f->name, len, PS_WIRE_MAX_STRING);
  for (size_t i = 0; i < len; i++)
    if (s[i] < 0x20 || s[i] == 0x7f) {
      char esc[200];
      return ps_status_set(st, PS_INVALID_ARGUMENT,
                           "%s: %s.%s \"%s\" contains a control character "
                           "(NUL or 0x01-0x1f, 0x7f)",
                           what, d->short_name, f->name,
                           ps_wire_escape((const char *)s, len, esc, sizeof esc));
    }
  return 0;
}

static int walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                int depth, const char *what, ps_status *st) {
  size_t off = 0;
  while (off < n) {
    uint64_t tag, len;
    if (!read_varint(p, n, &off, &tag)) return 0; /* malformed: the unpacker says so */
    unsigned wt = (unsigned)(tag & 7);
    uint64_t num = tag >> 3;
    switch (wt) {
    case 0:
      if (!read_varint(p, n, &off, &len)) return 0;
      break;
    case 1:
      if (n - off < 8) return 0;
      off += 8;
      break;
    case 5:
      if (n - off < 4) return 0;
      off += 4;
      break;
    case 2: {
      if (!read_varint(p, n, &off, &len) || len > n - off) return 0;
      const ProtobufCFieldDescriptor *f =
          num <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)num)
                            : NULL;
      const uint8_t *v = p + off;
      off += (size_t)len;
      if (f == NULL) break;
      int rc = 0;
      if (f->type == PROTOBUF_C_TYPE_STRING)
        rc = check_string(d, f, v, (size_t)len, what, st);
      else if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth < MAX_DEPTH)
        rc = walk(f->descriptor, v, (size_t)len, depth + 1, what, st);
      if (rc != 0) return rc;
      break;
    }
    default:
      return 0; /* groups are not proto3: the unpacker decides */
    }
  }
  return 0;
}

size_t ps_wire_count_field(const uint8_t *p, size_t n, uint32_t field) {
  size_t off = 0, count = 0;
  while (off < n) {
    uint64_t tag, v;
    if (!read_varint(p, n, &off, &tag)) break;
    switch (tag & 7) {
    case 0:
      if (!read_varint(p, n, &off, &v)) return count;
      break;
    case 1:
      if (n - off < 8) return count;
      off += 8;
      break;
    case 5:
      if (n - off < 4) return count;
      off += 4;
      break;
    case 2:
      if (!read_varint(p, n, &off, &v) || v > n - off) return count;
      off += (size_t)v;
      break;
    default:
      return count;
    }
    if ((tag >> 3) == field) count++;
  }
  return count;
}

int ps_wire_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                          const char *what, ps_status *st) {
  if (d == NULL || (p == NULL && n > 0)) return 0;
  return walk(d, p, n, 0, what, st);
}
