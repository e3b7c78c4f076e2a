#!/usr/bin/python3
"""Writes the seed corpus of fuzz_client (tests/fuzz/corpus_client/<Method>/):
answers a real ps gives to the requests fuzz_client_answer makes, and a
few lies each.  Usage: gen_client_seeds.py DIR (default: next to this file).
Each seed: uint32 little-endian L, L bytes of answer header, bulk bytes."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from pbwire import ld, varint, vi  # noqa: E402


def packed(num, vals):
    return ld(num, b"".join(varint(v) for v in vals))


def seed(hdr, bulk=b""):
    return struct.pack("<I", len(hdr)) + hdr + bulk


def meta(name, dtype, shape):
    return ld(1, name) + vi(2, dtype) + (packed(3, shape) if shape else b"")


F4 = struct.pack("<f", 1.5)
seeds = {
    "Read": {
        # w: float [2,3]; b: float [2] (the given tensor); emb: 20 distinct
        # rows of 4 for 80 ids; tab: 2 rows of 3
        "ok": seed(ld(1, meta(b"w", 1, [2, 3])) + ld(1, meta(b"b", 1, [2])) +
                   ld(1, meta(b"emb", 1, [20, 4])) + ld(1, meta(b"tab", 1, [2, 3])),
                   F4 * (6 + 2 + 80 + 6)),
        "scalar": seed(ld(1, meta(b"w", 9, [])) + ld(1, meta(b"b", 1, [2])) +
                       ld(1, meta(b"emb", 2, [20, 1])) + ld(1, meta(b"tab", 10, [2])),
                       b"\1" * 8 + F4 * 2 + b"\0" * 160 + b"\1\0"),
        "no_tensors": seed(b""),
        "shape_30": seed(ld(1, meta(b"w", 1, [3, 0])) + ld(1, meta(b"b", 1, [2])) +
                         ld(1, meta(b"emb", 1, [20, 0])) + ld(1, meta(b"tab", 1, [2, 0])),
                         F4 * 5),
        "huge": seed(ld(1, meta(b"w", 1, [1 << 40])) + ld(1, meta(b"b", 1, [2])) +
                     ld(1, meta(b"emb", 1, [20, 4])) + ld(1, meta(b"tab", 1, [2]))),
        "huge_rows": seed(ld(1, meta(b"w", 1, [])) + ld(1, meta(b"b", 1, [2])) +
                          ld(1, meta(b"emb", 1, [20, 1 << 36])) +
                          ld(1, meta(b"tab", 1, [2]))),
        "wrong_name": seed(ld(1, meta(b"v", 1, [])) + ld(1, meta(b"b", 1, [2])) +
                           ld(1, meta(b"emb", 1, [20, 4])) + ld(1, meta(b"tab", 1, [2])),
                           F4 * 85),
        "empty_flood": seed(b"\x0a\x00" * 1000),
        "epoch": seed(ld(1, meta(b"w", 1, [2, 3])) + ld(1, meta(b"b", 1, [2])) +
                      ld(1, meta(b"emb", 1, [20, 4])) + ld(1, meta(b"tab", 1, [2, 3])) +
                      vi(100, 5), F4 * (6 + 2 + 80 + 6)),
    },
    "List": {
        "ok": seed(ld(1, ld(1, b"w") + vi(2, 1) + packed(3, [2, 3]) + vi(4, 24) + vi(5, 1) +
                       vi(6, 7)) +
                   ld(1, ld(1, b"emb/part_0") + vi(2, 1) + packed(3, [5, 4]) + vi(4, 80) +
                      ld(7, b"emb") + packed(8, [10, 4]) + vi(9, 20))),
        "empty": seed(b""),
        "empty_entries": seed(b"\x0a\x00" * 1000),
        "bad_bytes": seed(ld(1, ld(1, b"w") + vi(2, 1) + packed(3, [2]) + vi(4, 9))),
        "neg_dim": seed(ld(1, ld(1, b"w") + vi(2, 1) + packed(3, [-2]) + vi(4, 8))),
        "epoch": seed(ld(1, ld(1, b"w") + vi(2, 1) + packed(3, [2, 3]) + vi(4, 24)) +
                      vi(100, 3)),
    },
    "IsInitialized": {
        "ok": seed(ld(1, b"\x01\x00")),
        "unpacked": seed(vi(1, 1) + vi(1, 1)),
        "empty": seed(b""),
        "three": seed(ld(1, b"\x01\x01\x01")),
    },
    "Initialize": {
        "ok": seed(ld(1, b"w") + ld(1, b"b")),
        "empty": seed(b""),
        "too_many": seed(ld(1, b"w") + ld(1, b"b") + ld(1, b"c")),
        "empty_name": seed(ld(1, b"")),
    },
    "ReportUninitialized": {
        "ok": seed(ld(1, b"w")),
        "none": seed(b""),
        "too_many": seed(ld(1, b"w") + ld(1, b"b") + ld(1, b"c")),
        "nul": seed(ld(1, b"w\0evil")),
    },
    "Delete": {
        "ok": seed(ld(1, b"w") + ld(1, b"w/Adam") + ld(2, b"b")),
        "none": seed(b""),
        "missing_many": seed(ld(2, b"a") + ld(2, b"b") + ld(2, b"c")),
    },
    "Update": {
        "ok": seed(packed(1, [3, 4])),
        "sync": seed(packed(1, [3, 4]) + packed(2, [0, 1]) + packed(3, [5, 5])),
        "none": seed(b""),
        "short_stale": seed(packed(1, [3, 4]) + packed(2, [1])),
        # replication: the answering ps's view epoch (field 100)
        "epoch": seed(packed(1, [3, 4]) + vi(100, 7)),
    },
    # Update answers as a replicated client scans them for their epoch
    "Epoch": {
        "ok": seed(packed(1, [3, 4]) + vi(100, 7)),
        "zero": seed(packed(1, [3, 4]) + vi(100, 0)),
        "negative": seed(packed(1, [3, 4]) + vi(100, -1)),
        "huge": seed(packed(1, [3, 4]) + vi(100, 1 << 62)),
        "twice": seed(vi(100, 3) + packed(1, [3, 4]) + vi(100, 9)),
        "fixed64": seed(packed(1, [3, 4]) + varint(100 << 3 | 1) + b"\1" * 8),
        "ld": seed(packed(1, [3, 4]) + ld(100, b"\7")),
        "truncated": seed(packed(1, [3, 4]) + varint(100 << 3) + b"\xff"),
    },
    # StatusResponse's replication fields (a cluster of 3 ps)
    "StatusRepl": {
        "ok": seed(ld(1, b"ps/0") + vi(100, 2) + vi(101, 4) +
                   ld(102, vi(1, 0) + ld(2, b"primary") + vi(3, 2) + vi(4, 96) +
                      packed(5, [3]) + packed(6, [300])) +
                   ld(102, vi(1, 2) + ld(2, b"syncing") + vi(7, 4096))),
        "unreplicated": seed(ld(1, b"ps/0")),
        "fenced": seed(vi(100, 2) + vi(101, 9) + vi(103, 1) + ld(104, b"lease lost")),
        "bad_role": seed(vi(100, 2) + ld(102, vi(1, 0) + ld(2, b"king"))),
        "bad_shard": seed(vi(100, 2) + ld(102, vi(1, 7) + ld(2, b"backup"))),
        "neg_lag": seed(vi(100, 2) + ld(102, vi(1, 0) + ld(2, b"primary") +
                                         packed(5, [-1]) + packed(6, [1]))),
        "lag_mismatch": seed(vi(100, 2) + ld(102, vi(1, 0) + ld(2, b"primary") +
                                              packed(5, [1, 2]) + packed(6, [1]))),
        "too_many": seed(vi(100, 2) + ld(102, vi(1, 0) + ld(2, b"backup")) * 5),
        "replicas_9": seed(vi(100, 9)),
    },
    "Digest": {
        "ok": seed(vi(1, 4) + ld(2, b"backup") +
                   ld(3, ld(1, b"b") + vi(2, 3) + vi(3, 0xdeadbeef) +
                      vi(4, 1) + vi(5, 8)) +
                   ld(3, ld(1, b"w") + vi(2, 5) + vi(4, 1) + vi(5, 24))),
        "empty": seed(b""),
        "unsorted": seed(ld(3, ld(1, b"w")) + ld(3, ld(1, b"b"))),
        "duplicate": seed(ld(3, ld(1, b"w")) + ld(3, ld(1, b"w"))),
        "no_name": seed(ld(3, vi(2, 1))),
        "negative": seed(vi(1, -3) + ld(3, ld(1, b"w") + vi(2, -1))),
        "bad_role": seed(ld(2, b"leader")),
        "flood": seed(ld(3, b"") * 2000),
    },
    "Status": {
        "ok": seed(ld(1, b"ps/0") + ld(2, b"127.0.0.1:2222") + ld(3, b"1.0") + vi(4, 3) +
                   vi(5, 100) + struct.pack("<B", 6 << 3 | 1) + struct.pack("<d", 12.5) +
                   vi(7, 4242) + vi(8, 17)),
        "negative": seed(vi(4, -1)),
        "empty": seed(b""),
    },
    "Save": {
        "ok": seed(vi(1, 4) + vi(2, 4096)),
        "negative": seed(vi(2, -5)),
        "empty": seed(b""),
    },
    "Merge": {
        "ok": seed(ld(1, b"model.ckpt-20") + ld(2, b"model.ckpt-10") +
                   ld(2, b"model.ckpt-20")),
        "no_prefix": seed(b""),
        "empty_listed": seed(ld(1, b"model.ckpt-20") + ld(2, b"")),
    },
    "Restore": {
        "ok": seed(ld(1, b"w") + ld(1, b"b") + ld(2, b"model.ckpt-20")),
        "too_many": seed(ld(1, b"w") + ld(1, b"b") + ld(1, b"c")),
        "empty": seed(b""),
    },
    "RestoreList": {  # RestoreResponse: listed (4), entries (5)
        "ok": seed(ld(2, b"model.ckpt-20") + vi(3, 1) + vi(4, 1) +
                   ld(5, ld(1, b"ack/c0") + vi(2, 1)) +
                   ld(5, ld(1, b"ack/w") + vi(2, 1) + packed(3, [4, 2]) +
                      ld(4, packed(1, [0, 0]) + packed(2, [2, -1 & 0xFFFFFFFFFFFFFFFF])) +
                      ld(4, packed(1, [2, 0]) + packed(2, [2, -1 & 0xFFFFFFFFFFFFFFFF])))),
        "not_listed": seed(ld(2, b"model.ckpt-20") + vi(3, 1)),
        "no_prefix": seed(vi(4, 1) + ld(5, ld(1, b"w") + vi(2, 1))),
        "bad_slice": seed(ld(2, b"p") + vi(4, 1) +
                          ld(5, ld(1, b"w") + vi(2, 1) + packed(3, [4]) +
                             ld(4, packed(1, [3]) + packed(2, [2]))) ),
        "bad_dtype": seed(ld(2, b"p") + vi(4, 1) + ld(5, ld(1, b"w") + vi(2, 99))),
        "negative_dim": seed(ld(2, b"p") + vi(4, 1) +
                             ld(5, ld(1, b"w") + vi(2, 1) + packed(3, [-3]))),
        "no_name": seed(ld(2, b"p") + vi(4, 1) + ld(5, vi(2, 1))),
        # a DT_STRING tensor: not a ps variable, skipped
        "string_dtype": seed(ld(2, b"p") + vi(4, 1) + ld(5, ld(1, b"a") + vi(2, 7)) +
                             ld(5, ld(1, b"b") + vi(2, 1))),
        "disorder": seed(ld(2, b"p") + vi(4, 1) + ld(5, ld(1, b"b") + vi(2, 1)) +
                         ld(5, ld(1, b"a") + vi(2, 1))),
        "overlap": seed(ld(2, b"p") + vi(4, 1) +
                        ld(5, ld(1, b"w") + vi(2, 1) + packed(3, [4]) +
                           ld(4, packed(1, [0]) + packed(2, [3])) +
                           ld(4, packed(1, [2]) + packed(2, [2])))),
        # empty slices of a scalar, counted on the wire (the flood's shape)
        "slices_flood": seed(ld(2, b"p") + vi(4, 1) +
                             ld(5, ld(1, b"a") + vi(2, 1) + b"\x22\x00" * 4096)),
    },
    # embedding tables: 5 keys of table "emb" (dim 4)
    "TableCreate": {
        "created": seed(vi(1, 1)),
        "existed": seed(b""),
        "junk": seed(b"\xff\xff"),
    },
    "TableLookup": {
        "ok": seed(vi(1, 5) + vi(2, 4) + vi(3, 1) + vi(4, 2) + vi(5, 3), F4 * 20),
        "few_rows": seed(vi(1, 4) + vi(2, 4) + vi(3, 1), F4 * 16),
        "huge_dim": seed(vi(1, 5) + vi(2, 1 << 40) + vi(3, 1)),
        "dim_65536": seed(vi(1, 5) + vi(2, 65536) + vi(3, 1)),
        "zero_dim": seed(vi(1, 5) + vi(2, 0) + vi(3, 1)),
        "double": seed(vi(1, 5) + vi(2, 4) + vi(3, 2), F4 * 40),
        "negative_counts": seed(vi(1, 5) + vi(2, 4) + vi(3, 1) + vi(4, -1) + vi(5, -7),
                                F4 * 20),
        "short_data": seed(vi(1, 5) + vi(2, 4) + vi(3, 1), F4 * 7),
    },
    "TableUpdate": {
        "ok": seed(vi(1, 3) + vi(2, 2)),
        "all_missing": seed(vi(2, 5)),
        "too_many": seed(vi(1, 9) + vi(2, 0)),
        "negative": seed(vi(1, -1) + vi(2, 6)),
    },
    "TableList": {
        "ok": seed(ld(1, ld(1, b"emb") + vi(2, 1) + vi(3, 4) + ld(4, b"adagrad") +
                      vi(5, 10) + vi(6, 1000) +
                      ld(7, vi(1, 2) + vi(4, 5) + vi(6, 100) + ld(7, b"lfu")) +
                      vi(8, 1) + vi(9, 2) + vi(10, 3) + vi(11, 4)) +
                   ld(1, ld(1, b"other") + vi(3, 8))),
        "empty": seed(b""),
        "flood": seed(b"\x0a\x00" * 1000),
        "bad_name": seed(ld(1, ld(1, b"a\x00b"))),
    },
    "Shutdown": {
        "ok": seed(ld(1, b"ps/0")),
        "empty": seed(b""),
        "junk": seed(b"\xff\xff\xff"),
    },
}

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                          "corpus_client")
for m, files in seeds.items():
    d = os.path.join(root, m)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(data)
