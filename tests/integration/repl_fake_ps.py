#!/usr/bin/python3
"""A ps for the client's replication tests (test_client_repl.sh), with
python3-grpcio and raw bytes: the client's side of routing, retries, dedup
ids and stale answers, whatever the ps tasks do.

Usage: repl_fake_ps.py NAME PORTFILE LOGFILE [MODE...]

Serves every /paramserver.Ps method on 127.0.0.1 (a port the kernel picks,
written to PORTFILE once it listens).  Each request is logged to LOGFILE as
a line "NAME METHOD shard=S epoch=E client_id=C seq=Q parts=P" (its Route,
an Update's dedup pair, a Save's or Merge's num_shards; -1 when absent).  Answers are what a real ps says of a
float32 scalar "w" (zeros, initialized), except as MODEs say:

  epoch=E        Update, Read and List answers carry view epoch E (field 100)
  unavailable    every Update and Read ends UNAVAILABLE ("fake: gone")
  snap_stale=N   the first N Snapshots fail FAILED_PRECONDITION "ps/K: view
                 epoch differs (stale)" (a save that met a failover)
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
from pbwire import fields, ld as field, varint, vi as vfield

NAME, PORTFILE, LOGFILE = sys.argv[1:4]
MODES = dict((m.split("=", 1) + [""])[:2] for m in sys.argv[4:])
LOCK = threading.Lock()
DELAYED = []
STALE = [0]


def signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def log(method, f):
    shard = epoch = cid = seq = parts = -1
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
        elif (n, method) in ((4, "Save"), (2, "Merge")):
            parts = v
    with LOCK, open(LOGFILE, "a") as fh:
        fh.write("%s %s shard=%d epoch=%d client_id=%d seq=%d parts=%d\n" %
                 (NAME, method, shard, epoch, cid, seq, parts))


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
    if method == "Snapshot" and STALE[0] < int(MODES.get("snap_stale", "0")):
        STALE[0] += 1
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "%s: view epoch differs (stale)" % NAME)
    if method == "Merge":
        prefix = [v for n, v in f if n == 1]
        return [field(1, prefix[0] if prefix else b"")]
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
