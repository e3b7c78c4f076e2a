#!/usr/bin/python3
"""A ps that lies (tests/integration/test_hostile_ps.sh).

Usage: hostile_ps.py MODE PORTFILE

Serves every /paramserver.Ps method on 127.0.0.1 (a port the kernel picks,
written to PORTFILE once it listens) with python3-grpcio and raw bytes.
Every answer is what a real ps would say about a float32 scalar "w", an
int64 scalar "global_step" and the variables a Create asked for (all of
them zeros and initialized), except the one MODE lies about:

  read_no_header  Read answers OK with no message at all
  list_flood      List answers 5 MB: 2.5 million empty entries
  list_big        List answers 40 MB (one entry with a 40 MB name)
  isinit_empty    IsInitialized answers 0 entries for any number of names
  read_shape_30   Read announces shape [3,0] and then sends 12 bytes
  read_huge       Read announces float32 [2^40]
  read_wrong_name Read answers a tensor named "v" for "w"
  update_count    Update answers 0 versions for its updates
  merge_empty     Merge answers no checkpoint name; global_step reads as
                  float [0]
  list_valid_flood List answers 3.6 million valid entries of 9 bytes ("a",
                  float, 4 bytes): under the 32 MiB limit
  list_dup        List answers "w" twice
  read_retry      the first Read with a gather sends its header and ends
                  the call UNAVAILABLE (the client retries); then as usual
  read_empty_tail Read sends its header and data, then empty messages
                  until the client gives up
  restore_flood   Restore answers 16 million empty names (32 MB)
  restore_list_flood Restore answers a checkpoint list (psctl restore's
                  first call) of one scalar tensor with 15 million empty
                  slices (30 MB)
  restore_list_disorder Restore answers a checkpoint list naming tensor
                  "b" before "a" (an index is sorted)
"""
import os
import struct
import sys
import threading
import time
from concurrent import futures

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from pbwire import fields, ld as field, read_varint, varint, vi as vfield  # noqa: E402

MODE, PORTFILE = sys.argv[1], sys.argv[2]


VARS = {b"w": (1, [], 4), b"global_step": (9, [], 8)}  # dtype, shape, bytes


def tensor_meta(name, dtype, shape):
    m = field(1, name) + vfield(2, dtype)
    if shape:
        m += field(3, b"".join(varint(d) for d in shape))
    return m


def chunk(data):
    return field(1, data)


def varints(b):
    out, v, shift = [], 0, 0
    for x in b:
        v |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            out.append(v)
            v, shift = 0, 0
    return out


SIZES = {1: 4, 2: 8, 3: 4, 9: 8, 10: 1}  # float, double, int32, int64, bool


def create(f):
    """Remembers the variables of a Create, so Reads answer their shapes."""
    for num, spec in f:
        if num != 1:
            continue
        name, dtype, shape = b"", 1, []
        for n, v in fields(spec):
            if n == 1:
                name = v
            elif n == 2:
                dtype = v
            elif n == 3:
                shape += varints(v) if isinstance(v, bytes) else [v]
        nb = SIZES.get(dtype, 4)
        for d in shape:
            nb *= d
        VARS[name] = (dtype, shape, nb)


ABORT = object()        # ends the call UNAVAILABLE after the messages before it
EMPTY_TAIL = object()   # empty messages until the call ends
RETRIED = []


def read_items(f):
    """[(name, num_indices or None)] of a ReadRequest."""
    out = []
    for n, v in f:
        if n != 1:
            continue
        name, gather, num = b"", False, 0
        for k, x in fields(v):
            if k == 1:
                name = x
            elif k == 2:
                gather = bool(x)
            elif k == 4:
                num = x
        out.append((name, num if gather else None))
    return out


def answer(method, header):
    f = fields(header)
    if method == "Create":
        create(f)
        return [b""]
    if method == "Read":
        names = [fields(v)[0][1] for n, v in f if n == 1]
        if MODE == "read_no_header":
            return []
        if MODE == "read_shape_30":
            return [field(1, tensor_meta(names[0], 1, [3, 0])), chunk(b"\0" * 12)]
        if MODE == "read_huge":
            return [field(1, tensor_meta(names[0], 1, [1 << 40]))]
        if MODE == "merge_empty" and names == [b"global_step"]:
            return [field(1, tensor_meta(b"global_step", 1, [0]))]
        if MODE == "read_wrong_name":
            return [field(1, tensor_meta(b"v", 1, []))] + [chunk(b"\0" * 4)]
        metas, data, gathers = b"", b"", False
        for nm, num in read_items(f):
            dt, shape, nb = VARS.get(nm, (1, [], 4))
            if num is not None and shape:  # a gather: num rows
                gathers = True
                nb = nb // shape[0] * num if shape[0] else 0
                shape = [num] + shape[1:]
            metas += field(1, tensor_meta(nm, dt, shape))
            data += b"\0" * nb
        if MODE == "read_retry" and gathers and not RETRIED:
            RETRIED.append(1)
            sys.stderr.write("read_retry: a gather's header sent, the call ends UNAVAILABLE\n")
            sys.stderr.flush()
            return [metas, ABORT]
        if MODE == "read_empty_tail":
            return [metas, chunk(data), EMPTY_TAIL]
        return [metas, chunk(data)] if data else [metas]
    if method == "List":
        if MODE == "list_flood":
            return [b"\x0a\x00" * 2500000]
        if MODE == "list_valid_flood":
            return [field(1, field(1, b"a") + vfield(2, 1) + vfield(4, 4)) * 3600000]
        if MODE == "list_dup":
            return [b"".join(field(1, field(1, n) + vfield(2, dt) + vfield(4, nb) + vfield(5, 1))
                             for n, (dt, shape, nb) in list(VARS.items()) + [(b"w", VARS[b"w"])])]
        if MODE == "list_big":
            return [field(1, field(1, b"x" * (40 << 20)) + vfield(2, 1) + vfield(4, 4))]
        return [b"".join(field(1, field(1, n) + vfield(2, dt) + vfield(4, nb) + vfield(5, 1))
                         for n, (dt, shape, nb) in VARS.items())]
    if method == "IsInitialized":
        n = sum(1 for num, _ in f if num == 1)
        if MODE == "isinit_empty":
            return [b""]
        return [field(1, b"\x01" * n)] if n else [b""]
    if method == "Update":
        n = sum(1 for num, _ in f if num == 1)
        if MODE == "update_count":
            return [b""]
        return [field(1, b"".join(varint(1) for _ in range(n)))] if n else [b""]
    if method == "Status":
        return [field(1, b"ps/0") + field(3, b"hostile") + vfield(4, len(VARS))]
    if method == "Restore" and MODE == "restore_flood":
        return [b"\x0a\x00" * 16000000]
    if method == "Restore" and MODE == "restore_list_flood":
        entry = field(1, b"a") + vfield(2, 1) + b"\x22\x00" * 15000000
        return [field(2, b"x") + vfield(4, 1) + field(5, entry)]
    if method == "Restore" and MODE == "restore_list_disorder":
        return [field(2, b"x") + vfield(4, 1) + field(5, field(1, b"b") + vfield(2, 1)) +
                field(5, field(1, b"a") + vfield(2, 1))]
    if method == "Initialize":
        return [b""]
    # Create, ReportUninitialized, Snapshot, Release, Delete, Shutdown...: empty
    return [b""]


def handler(method):
    def serve(requests, context):
        header = None
        for msg in requests:
            if header is None:
                header = msg
        for m in answer(method, header or b""):
            if m is ABORT:
                context.abort(grpc.StatusCode.UNAVAILABLE, "hostile: going away")
            elif m is EMPTY_TAIL:
                while context.is_active():
                    yield b""
                    time.sleep(0.01)
                return
            else:
                yield m
    return grpc.stream_stream_rpc_method_handler(serve)


class Generic(grpc.GenericRpcHandler):
    def service(self, details):
        m = details.method
        if m.startswith("/paramserver.Ps/"):
            return handler(m.split("/")[-1])
        return None


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                     options=[("grpc.max_send_message_length", -1),
                              ("grpc.max_receive_message_length", -1)])
server.add_generic_rpc_handlers((Generic(),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
with open(PORTFILE + ".tmp", "w") as fh:
    fh.write("%d\n" % port)
import os
os.rename(PORTFILE + ".tmp", PORTFILE)
threading.Event().wait()
