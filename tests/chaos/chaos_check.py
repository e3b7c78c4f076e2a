#!/usr/bin/env python3
"""The verdict of the correctness checker (tests/chaos/chaos.sh).

  chaos_check.py FINAL LOG...

FINAL: what `chaos_client read` printed ("var NAME VALUE", "row NAME R C0
C1"); LOG: the clients' event logs (tests/chaos/chaos_client.c: send, ack,
fail lines).  For every variable, and every row of every table (column 0:
the sum of the increments; column 1: the number of adds):

  sum of the acknowledged increments <= final value <= sum of all sent

and the final value minus the acknowledged sum is the sum of some of the
attempts whose outcome is unknown (failed or unanswered): an update is
applied once or not at all (checked when at most 16 attempts are unknown
for it).  Every increment is a distinct integer, so every sum is exact.
Also: every attempt has at most one outcome, and every outcome an attempt.

A final value below the acknowledged sum is reported as
"LOST ACKNOWLEDGED UPDATES"; above the sum sent, or not a sum of unknown
attempts, as "UPDATES APPLIED TWICE OR FROM NOWHERE".  Exit 0 when every
check holds, 1 otherwise (each violation named), 2 on unreadable input.
"""
import sys


def subset_sums(values):
    sums = {0}
    for v in values:
        sums |= {s + v for s in sums}
    return sums


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    final = {}  # (name, row or None) -> (value, count or None)
    with open(argv[1]) as f:
        for line in f:
            p = line.split()
            if p and p[0] == "var" and len(p) == 3:
                final[(p[1], None)] = (float(p[2]), None)
            elif p and p[0] == "row" and len(p) == 5:
                final[(p[1], int(p[2]))] = (float(p[3]), float(p[4]))
            elif p:
                print("chaos_check: %s: bad line %r" % (argv[1], line), file=sys.stderr)
                return 2
    if not final:
        print("chaos_check: %s holds no value" % argv[1], file=sys.stderr)
        return 2
    sends = {}  # id -> (targets, increment)
    outcome = {}  # id -> "ack" / "fail"
    problems = []
    for path in argv[2:]:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                p = line.rstrip("\n").split(" ")
                if len(p) < 3:
                    if line.endswith("\n"):
                        problems.append("%s:%d: a short line %r" % (path, n, line))
                    continue  # the last line cut by the end of the run
                kind, aid = p[1], p[2]
                if kind == "send":
                    if aid in sends:
                        problems.append("%s:%d: attempt %s sent twice" % (path, n, aid))
                    name, rows, inc = p[4], p[5], float(p[6])
                    keys = [(name, None)] if rows == "-" else [(name, int(r)) for r in rows.split(",")]
                    sends[aid] = (keys, inc)
                elif kind in ("ack", "fail"):
                    if aid not in sends:
                        problems.append("%s:%d: %s of attempt %s, never sent" % (path, n, kind, aid))
                    elif aid in outcome:
                        problems.append("%s:%d: attempt %s has two outcomes" % (path, n, aid))
                    outcome[aid] = kind
                else:
                    problems.append("%s:%d: unknown event %r" % (path, n, kind))
    acked = {k: [0.0, 0] for k in final}
    sent = {k: [0.0, 0] for k in final}
    unknown = {k: [] for k in final}
    nack = nfail = nopen = 0
    for aid, (keys, inc) in sends.items():
        o = outcome.get(aid)
        nack += o == "ack"
        nfail += o == "fail"
        nopen += o is None
        for k in keys:
            if k not in final:
                problems.append("attempt %s updated %s%s, which the final read lacks" % (
                    aid, k[0], "" if k[1] is None else " row %d" % k[1]))
                continue
            sent[k][0] += inc
            sent[k][1] += 1
            if o == "ack":
                acked[k][0] += inc
                acked[k][1] += 1
            else:
                unknown[k].append(inc)
    lost = twice = 0
    unchecked = 0
    for k in sorted(final, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        value, count = final[k]
        what = k[0] if k[1] is None else "%s row %d" % k
        a, s = acked[k], sent[k]
        if value < a[0] or (count is not None and count < a[1]):
            lost += 1
            problems.append("LOST ACKNOWLEDGED UPDATES: %s is %.17g (%s adds) but the acknowledged "
                            "increments sum to %.17g (%d adds): %.17g missing" % (
                                what, value, "-" if count is None else "%g" % count, a[0], a[1],
                                a[0] - value))
            continue
        if value > s[0] or (count is not None and count > s[1]):
            twice += 1
            problems.append("UPDATES APPLIED TWICE OR FROM NOWHERE: %s is %.17g (%s adds), more "
                            "than every increment sent: %.17g (%d adds)" % (
                                what, value, "-" if count is None else "%g" % count, s[0], s[1]))
            continue
        extra = value - a[0]
        u = unknown[k]
        if count is not None and count - a[1] > len(u):
            twice += 1
            problems.append("UPDATES APPLIED TWICE OR FROM NOWHERE: %s got %g adds, %d acknowledged "
                            "and %d unknown" % (what, count, a[1], len(u)))
        elif len(u) <= 16:
            if extra not in subset_sums(u):
                twice += 1
                problems.append("UPDATES APPLIED TWICE OR FROM NOWHERE: %s is %.17g = acknowledged "
                                "%.17g + %.17g, which no set of its %d unknown attempts sums to" % (
                                    what, value, a[0], extra, len(u)))
        else:
            unchecked += 1
    print("chaos_check: %d attempts: %d acknowledged, %d failed, %d unanswered; "
          "%d variables and rows checked%s" % (
              len(sends), nack, nfail, nopen, len(final),
              "" if not unchecked else " (%d with too many unknown attempts for the sum check)"
              % unchecked))
    for p in problems[:50]:
        print("chaos_check: " + p)
    if len(problems) > 50:
        print("chaos_check: ... and %d more" % (len(problems) - 50))
    if lost:
        print("chaos_check: VERDICT: lost acknowledged updates on %d variables or rows" % lost)
    if problems:
        print("chaos_check: VERDICT: FAIL (%d problems)" % len(problems))
        return 1
    print("chaos_check: VERDICT: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
