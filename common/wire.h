/* Checks on the raw protobuf wire bytes of a request, before it is
 * unpacked.
 *
 * protobuf-c hands string fields over as C strings, so a name sent as
 * "w\0evil" arrives as "w" and would silently alias the variable w.  This
 * walks the wire format against the message's descriptor and refuses
 * string fields (recursing into sub-messages) that hold a NUL or another
 * control character, or that are longer than a limit.  Bytes that are not
 * valid wire format are left to the unpacker (which refuses them).
 * Pure; any thread. */
#ifndef PS_WIRE_H
#define PS_WIRE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Longest string field a request may carry (names, prefixes, slots). */
#define PS_WIRE_MAX_STRING 4096

/* 0, or INVALID_ARGUMENT naming @what (the method), the field
 * ("VariableSpec.name") and the offending value, escaped:
 *   "Create: VariableSpec.name \"w\\x00evil\" contains a control character
 *    (NUL or 0x01-0x1f, 0x7f)"
 *   "Read: ReadItem.name is 5000 bytes; the limit is 4096". */
int ps_wire_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                          const char *what, ps_status *st);

/* How many times top-level field @field occurs in the message @p[0..@n)
 * (a repeated field's element count), without unpacking anything: a limit
 * on list lengths is checked before protobuf-c allocates the list.  Stops
 * at malformed bytes (the unpacker refuses those). */
size_t ps_wire_count_field(const uint8_t *p, size_t n, uint32_t field);

/* Writes @s (@n bytes) into @out (@cap bytes, NUL-terminated) with control
 * characters, backslash, quote and bytes >= 0x7f escaped as \xHH, cut
 * with "..." when it does not fit.  For log lines and error texts. */
char *ps_wire_escape(const char *s, size_t n, char *out, size_t cap);

#endif
