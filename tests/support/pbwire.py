"""Protobuf wire bytes by hand, for the tests' fake ps tasks and seed
generators (lib.sh puts this folder on PYTHONPATH)."""


def varint(v):
    v &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def ld(num, payload):
    """A length-delimited field."""
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def vi(num, v):
    """A varint field."""
    return varint(num << 3) + varint(v)


def read_varint(msg, i):
    """The varint at msg[i]: (value, index after it)."""
    v, shift = 0, 0
    while True:
        b = msg[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def fields(msg):
    """Top-level fields of a message: [(number, value bytes or int)]."""
    out, i = [], 0
    while i < len(msg):
        key, i = read_varint(msg, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(msg, i)
            out.append((num, v))
        elif wt == 2:
            n, i = read_varint(msg, i)
            out.append((num, msg[i:i + n]))
            i += n
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
    return out
