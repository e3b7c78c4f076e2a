#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_etcd (tests/fuzz/corpus_etcd/): etcd
answers encoded by hand after proto/etcd.proto, each file one byte that
picks the decoder (fuzz_etcd.c's list) and then the message.  Run from
anywhere: python3 tests/fuzz/gen_etcd_seeds.py"""
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_etcd")
VIEW = b"/paramserver/j/view"
PRE = b"/paramserver/j/"


def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def vi(field, v):
    return varint(field << 3) + varint(v)


def ld(field, data):
    return varint(field << 3 | 2) + varint(len(data)) + data


def header(rev, cluster=0x2023, member=0x5A55, term=2):
    return ld(1, vi(1, cluster) + vi(2, member) + vi(3, rev) + vi(4, term))


def kv(key, val, mod, create=None, ver=1, lease=0):
    b = ld(1, key) + vi(2, create or mod) + vi(3, mod) + vi(4, ver) + ld(5, val)
    return b + (vi(6, lease) if lease else b"")


def event(delete, k):
    return ld(11, (vi(1, 1) if delete else b"") + ld(2, k))


seeds = {
    "get_found": (0, header(12) + ld(2, kv(VIEW, b'{"epoch":5}', 10)) + vi(4, 1)),
    "get_missing": (0, header(12)),
    "get_two_keys": (0, header(12) + ld(2, kv(VIEW, b"a", 3)) + ld(2, kv(VIEW, b"b", 4))),
    "get_other_key": (0, header(12) + ld(2, kv(b"/other", b"a", 3))),
    "get_future_mod": (0, header(2) + ld(2, kv(VIEW, b"a", 9))),
    "get_negative_rev": (0, header(-1)),
    "get_no_header": (0, ld(2, kv(VIEW, b"a", 3))),
    "prefix_three": (1, header(30) + b"".join(
        ld(2, kv(PRE + b"tasks/ps/%d" % i, b"127.0.0.1:%d" % (2220 + i), 20 + i, lease=77))
        for i in range(3)) + vi(4, 3)),
    "prefix_unsorted": (1, header(30) + ld(2, kv(PRE + b"b", b"", 5)) + ld(2, kv(PRE + b"a", b"", 6))),
    "prefix_outside": (1, header(30) + ld(2, kv(b"/paramserver/k", b"", 5))),
    "prefix_nul_key": (1, header(30) + ld(2, kv(PRE + b"a\0b", b"", 5))),
    "prefix_more": (1, header(30) + ld(2, kv(PRE + b"a", b"", 5)) + vi(3, 1) + vi(4, 70000)),
    "txn_won": (2, header(41) + vi(2, 1) + ld(3, ld(2, header(41)))),
    "txn_lost": (2, header(41)),
    "txn_won_no_put": (2, header(41) + vi(2, 1)),
    "txn_won_range": (2, header(41) + vi(2, 1) + ld(3, ld(1, header(41)))),
    "put": (3, header(42)),
    "put_rev0": (3, header(0)),
    "delete": (4, header(43) + vi(2, 1)),
    "delete_many": (4, header(43) + vi(2, 5)),
    "revoke": (5, header(44)),
    "grant": (6, header(45) + vi(2, 7) + vi(3, 2)),
    "grant_error": (6, header(45) + ld(4, b"etcdserver: too many leases\n")),
    "grant_zero": (6, header(45) + vi(2, 0) + vi(3, 2)),
    "keepalive": (7, header(46) + vi(2, 7) + vi(3, 2)),
    "keepalive_gone": (7, header(46) + vi(2, 7)),
    "keepalive_other": (7, header(46) + vi(2, 8) + vi(3, 2)),
    "watch_created": (8, header(50) + vi(2, 0) + vi(3, 1)),
    "watch_events": (8, header(53) + event(False, kv(PRE + b"view", b"e6", 51)) +
                     event(True, kv(PRE + b"tasks/ps/1", b"", 52)) +
                     event(False, kv(PRE + b"tasks/ps/1", b"x", 53, ver=1, lease=9))),
    "watch_same_rev": (8, header(54) + event(False, kv(PRE + b"a", b"1", 54)) +
                       event(False, kv(PRE + b"b", b"2", 54))),
    "watch_out_of_order": (8, header(60) + event(False, kv(PRE + b"a", b"1", 55)) +
                           event(False, kv(PRE + b"b", b"2", 54))),
    "watch_compacted": (8, ld(1, vi(1, 1)) + vi(2, 0) + vi(4, 1) + vi(5, 5)),
    "watch_canceled": (8, header(50) + vi(2, 0) + vi(4, 1) + ld(6, b"permission\x01denied")),
    "watch_progress": (8, header(70) + vi(2, -1)),
    "watch_fragment": (8, header(70) + vi(7, 1)),
    "watch_key": (9, header(80) + event(False, kv(VIEW, b"{}", 80))),
    "watch_key_other": (9, header(80) + event(False, kv(PRE + b"viewx", b"{}", 80))),
    "watch_bad_type": (9, header(80) + ld(11, vi(1, 7) + ld(2, kv(VIEW, b"", 80)))),
}

if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, (sel, msg) in sorted(seeds.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(bytes([sel]) + msg)
    print("wrote %d seeds to %s" % (len(seeds), OUT))
