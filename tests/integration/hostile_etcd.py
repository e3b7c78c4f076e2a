#!/usr/bin/python3
"""An etcd that lies (tests/integration/test_etcd.c, tcase "hostile").

Usage: hostile_etcd.py MODE

Serves every etcd v3 method the client uses on 127.0.0.1 (a port the
kernel picks, printed on stdout once it listens) with python3-grpcio and
raw bytes (encoded as tests/fuzz/gen_etcd_seeds.py does).  Its answers
are those of an etcd holding nothing, except the one MODE lies about:

  get_other_key   Range answers a value of another key
  get_two         Range answers two values for one key
  get_garbage     Range answers bytes that are no RangeResponse
  get_no_header   Range answers an empty message
  prefix_unsorted Range of a prefix answers its keys out of order
  txn_no_put      Txn says it succeeded but answers no put
  grant_zero      LeaseGrant answers lease 0
  grant_error     LeaseGrant answers etcd's error text
  keepalive_other LeaseKeepAlive answers about another lease
  watch_other     Watch is created, then sends an event of another key
"""
import os
import sys
import time
from concurrent import futures

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz"))
from gen_etcd_seeds import PRE, VIEW, event, header, kv, ld, vi  # noqa: E402

MODE = sys.argv[1]


def answer(method, req):
    if method.endswith("/Range"):
        if MODE == "get_other_key":
            return header(9) + ld(2, kv(b"/other", b"x", 3))
        if MODE == "get_two":
            return header(9) + ld(2, kv(b"/k", b"a", 3)) + ld(2, kv(b"/k", b"b", 4))
        if MODE == "get_garbage":
            return b"\xff\xff\xff\xff"
        if MODE == "get_no_header":
            return b""
        if MODE == "prefix_unsorted":
            return header(9) + ld(2, kv(PRE + b"b", b"", 5)) + ld(2, kv(PRE + b"a", b"", 6))
        return header(9)
    if method.endswith("/Txn"):
        return header(10) + (vi(2, 1) if MODE == "txn_no_put" else b"")
    if method.endswith("/LeaseGrant"):
        if MODE == "grant_zero":
            return header(11) + vi(2, 0) + vi(3, 2)
        if MODE == "grant_error":
            return header(11) + ld(4, b"etcdserver: too many leases")
        return header(11) + vi(2, 7) + vi(3, 1)
    return header(12)  # Put, DeleteRange, LeaseRevoke


def stream(method):
    def run(requests, ctx):
        for _ in requests:
            if method.endswith("/LeaseKeepAlive"):
                lease = 8 if MODE == "keepalive_other" else 7
                yield header(13) + vi(2, lease) + vi(3, 1)
                continue
            yield header(20) + vi(2, 0) + vi(3, 1)  # created
            if MODE == "watch_other":
                yield header(21) + vi(2, 0) + event(False, kv(b"/elsewhere", b"x", 21))
    return run


class Handler(grpc.GenericRpcHandler):
    def service(self, details):
        m = details.method
        if m.endswith("/LeaseKeepAlive") or m.endswith("/Watch"):
            return grpc.stream_stream_rpc_method_handler(stream(m))
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer(m, req))


server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[Handler()])
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
while True:
    time.sleep(3600)
