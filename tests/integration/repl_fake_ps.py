#!/usr/bin/python3
"""A ps for the client's replication tests (test_client_repl.sh), with
python3-grpcio and raw bytes: the client's side of routing, retries, dedup
ids and stale answers, whatever the ps tasks do.

Usage: repl_fake_ps.py NAME PORTFILE LOGFILE [MODE...]

Serves every /paramserver.Ps method on 127.0.0.1 (a port the kernel picks,
written to PORTFILE once it listens).  Each request is logged to LOGFILE as
a line "NAME METHOD shard=S epoch=E client_id=C seq=Q" (its Route, and an
Update's dedup pair; -1 when absent).  Answers are what a real ps says of a
float32 scalar "w" (zeros, initialized), except as MODEs say:

  epoch=E        Update, Read and List answers carry view epoch E (field 100)
  unavailable    every Update and Read ends UNAVAILABLE ("fake: gone")
  hold=FILE      the first Read waits until FILE exists before it answers
                 (a primary stopped a while: the view moves on meanwhile)
  digest=SPEC    Digest answers SPEC: "name:version:crc,..." (sorted by the
                 caller), role "backup"
"""
import os
import sys
import threading
import time
from concurrent import futures

import grpc

NAME, PORTFILE, LOGFILE = sys.argv[1:4]
MODES = dict((m.split("=", 1) + [""])[:2] for m in sys.argv[4:])
LOCK = threading.Lock()
DELAYED = []


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


def field(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def vfield(num, v):
    return varint(num << 3) + varint(v)


def read_varint(msg, i):
    v, shift = 0, 0
    while True:
        b = msg[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def fields(msg):
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


def signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def log(method, f):
    shard = epoch = cid = seq = -1
    for n, v in f:
        if n == 100 and isinstance(v, bytes):
            shard, epoch = 0, 0
            for k, x in fields(v):
                if k == 1:
                    shard = signed(x)
                elif k == 2:
                    epoch = signed(x)
        elif n == 101 and method == "Update":
            cid = v
        elif n == 102 and method == "Update":
            seq = v
    with LOCK, open(LOGFILE, "a") as fh:
        fh.write("%s %s shard=%d epoch=%d client_id=%d seq=%d\n" %
                 (NAME, method, shard, epoch, cid, seq))


def with_epoch(msg):
    return msg + vfield(100, int(MODES["epoch"])) if "epoch" in MODES else msg


def answer(method, header, context):
    f = fields(header)
    if method != "Status":
        log(method, f)
    if method in ("Update", "Read") and "unavailable" in MODES:
        context.abort(grpc.StatusCode.UNAVAILABLE, "fake: gone")
    if method == "Read":
        if "hold" in MODES and not DELAYED:
            DELAYED.append(1)
            while not os.path.exists(MODES["hold"]) and context.is_active():
                time.sleep(0.02)
        metas = b"".join(field(1, field(1, v) + vfield(2, 1))
                         for n, item in f if n == 1 for k, v in fields(item) if k == 1)
        n = sum(1 for num, _ in f if num == 1)
        return [with_epoch(metas), field(1, b"\0" * 4 * n)]
    if method == "Update":
        n = sum(1 for num, _ in f if num == 1)
        return [with_epoch(field(1, b"".join(varint(7) for _ in range(n))))]
    if method == "List":
        return [with_epoch(field(1, field(1, b"w") + vfield(2, 1) + vfield(4, 4) +
                                 vfield(5, 1)))]
    if method == "IsInitialized":
        n = sum(1 for num, _ in f if num == 1)
        return [field(1, b"\x01" * n)] if n else [b""]
    if method == "Status":
        return [field(1, NAME.encode()) + field(3, b"fake") + vfield(4, 1)]
    if method == "Digest":
        out = vfield(1, int(MODES.get("epoch", "0"))) + field(2, b"backup")
        for spec in filter(None, MODES.get("digest", "").split(",")):
            name, version, crc = spec.split(":")
            out += field(3, field(1, name.encode()) + vfield(2, int(version)) +
                         vfield(3, int(crc)) + vfield(4, 1) + vfield(5, 4))
        return [out]
    return [b""]


def handler(method):
    def serve(requests, context):
        header = None
        for msg in requests:
            if header is None:
                header = msg
        for m in answer(method, header or b"", context):
            yield m
    return grpc.stream_stream_rpc_method_handler(serve)


class Generic(grpc.GenericRpcHandler):
    def service(self, details):
        m = details.method
        if m.startswith("/paramserver.Ps/"):
            return handler(m.split("/")[-1])
        return None


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((Generic(),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
with open(PORTFILE + ".tmp", "w") as fh:
    fh.write("%d\n" % port)
os.rename(PORTFILE + ".tmp", PORTFILE)
threading.Event().wait()
