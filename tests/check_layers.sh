#!/usr/bin/env bash
# The layers of the tree (DESIGN.md, "Layers"), checked on every test run:
#   common/  <-  ps/, worker/  <-  programs
# - common/ includes nothing from ps/ or worker/ (the public API headers
#   worker/include/paramserver/*.h excepted: every layer may include them);
# - ps/ includes nothing from worker/ but the public API headers, worker/
#   nothing from ps/;
# - gRPC headers appear in common/rpc*.c and rpc_internal.h alone (benchmarks
#   excepted), and rpc_internal.h is included by common/rpc*.c alone;
# - no meson.build compiles another folder's sources or puts ".." on the
#   include path;
# - public headers include only each other and system headers;
# - a folder's private headers (*_priv.h, *_internal.h) are included only
#   by the files of that folder (worker/graph/graph_priv.h by worker/graph/);
# - no circle between files: with a build directory (the second argument,
#   as meson test passes it), the object files of common/, ps/, worker/
#   and deploy/ must not use each other round a circle (A uses a symbol B
#   defines, and B, or a file B leads to, one A defines).
# Prints each violation as FILE:LINE: why, or a circle as
# A.c <-> B.c: A.c uses x, B.c uses y, and exits 1 if there is any.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
build=${2:-}
cd "$root" || exit 2
bad=0
say() { echo "$1: $2"; bad=1; }

names_in() { # the basenames of the headers directly in a folder
  find "$1" -maxdepth 1 -name '*.h' -printf '%f\n' 2>/dev/null
}
ps_h=$(names_in ps)
worker_h=$(names_in worker)

check_includes() { # FOLDER FORBIDDEN-PREFIX-REGEX FORBIDDEN-BARE-NAMES WHY
  local dir=$1 re=$2 bare=$3 why=$4 f line inc
  while IFS= read -r hit; do
    f=${hit%%:*}; line=${hit#*:}; line=${line%%:*}
    inc=$(sed -n "${line}p" "$f" | sed -E 's/.*#include *"([^"]*)".*/\1/')
    if [[ "$inc" =~ $re ]]; then say "$f:$line" "includes \"$inc\": $why"; continue; fi
    if [[ "$inc" != */* ]] && [ ! -f "$(dirname "$f")/$inc" ]; then
      for b in $bare; do
        [ "$inc" = "$b" ] && say "$f:$line" "includes \"$inc\" of another folder: $why"
      done
    fi
  done < <(grep -rn --include='*.c' --include='*.h' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$dir" | cut -d: -f1,2)
}

check_includes common '^(ps|worker)/' "$ps_h $worker_h" "common/ depends on nothing above it"
check_includes ps '^worker/' "$worker_h" "ps/ may use worker/ only through paramserver/ public headers"
check_includes worker '^ps/' "$ps_h" "worker/ never includes ps/"

# private headers: their own folder only (tests included: they go through
# a folder's interface like everyone else)
while IFS= read -r hit; do
  f=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
  inc=$(sed -n "${line}p" "$f" | sed -E 's/.*#include *"([^"]*)".*/\1/')
  case "$inc" in */*) target=$inc ;; *) target=$(dirname "$f")/$inc ;; esac
  [ "$(dirname "$target")" = "$(dirname "$f")" ] && [ -f "$target" ] && continue
  say "$f:$line" "includes \"$inc\", a header private to its own folder"
done < <(grep -rn --include='*.c' --include='*.h' -E '#[[:space:]]*include[[:space:]]*"[^"]*(_priv|_internal)\.h"' common ps worker deploy tests | cut -d: -f1,2)

# gRPC core: common/rpc*.c and their private header alone; that header
# brings gRPC's, so only they include it
while IFS= read -r hit; do
  f=${hit%%:*}
  case "$f" in common/rpc*.c|common/rpc_internal.h|tests/bench/*) continue ;; esac
  say "$hit" "includes a gRPC header: only common/rpc*.c may (benchmarks excepted)"
done < <(grep -rn --include='*.c' --include='*.h' '#[[:space:]]*include[[:space:]]*<grpc/' common ps worker deploy tests | cut -d: -f1,2)
while IFS= read -r hit; do
  f=${hit%%:*}
  case "$f" in common/rpc*.c) continue ;; esac
  say "$hit" "includes rpc_internal.h, which brings gRPC: only common/rpc*.c may"
done < <(grep -rn --include='*.c' --include='*.h' '#[[:space:]]*include[[:space:]]*"rpc_internal\.h"' common ps worker deploy tests | cut -d: -f1,2)

# meson: no folder compiles another's sources, no ".." include directory
while IFS= read -r hit; do
  say "$hit" "a meson.build reaches into another folder ('../'): declare a dependency instead"
done < <(grep -rn --include=meson.build -E "(files|include_directories)\([^)]*'\.\./|include_directories\([^)]*'\.\.'" common ps worker deploy proto tests meson.build 2>/dev/null | cut -d: -f1,2)

# public headers: only each other and system headers
for h in worker/include/paramserver/*.h; do
  while IFS= read -r hit; do
    say "$h:${hit%%:*}" "a public header includes a non-public header"
  done < <(grep -n '#[[:space:]]*include[[:space:]]*"' "$h" | grep -v '"paramserver/' | cut -d: -f1)
done

# no circles between files: who uses whose symbols, from nm of the objects
# (compile_commands.json maps each source to its object)
if [ -n "$build" ]; then
  python3 - "$root" "$build" <<'EOF_PY' || bad=1
import json, os, subprocess, sys
root, build = sys.argv[1], sys.argv[2]
try:
    cmds = json.load(open(os.path.join(build, "compile_commands.json")))
except OSError as e:
    print(f"{build}: no compile_commands.json ({e.strerror}): configure the build first")
    sys.exit(1)
objs, unbuilt = {}, set()  # source (relative to root) -> object
for c in cmds:
    src = os.path.relpath(os.path.join(c["directory"], c["file"]), root)
    if src.split("/")[0] not in ("common", "ps", "worker", "deploy") or not src.endswith(".c"):
        continue
    obj = os.path.join(c["directory"], c["output"])
    if os.path.exists(obj):
        objs.setdefault(src, obj)
    else:
        unbuilt.add(src)
unbuilt -= set(objs)
if unbuilt:  # a circle through a file not built would go unseen
    print(f"{build}: no object file for {', '.join(sorted(unbuilt))}: build first")
    sys.exit(1)
byobj = {o: s for s, o in objs.items()}
out = subprocess.run(["nm", "-g", "-A"] + sorted(objs.values()), capture_output=True,
                     text=True, check=True).stdout
defs, uses = {}, {s: set() for s in objs}
for line in out.splitlines():
    path, _, rest = line.partition(": ") if ": " in line else line.partition(":")
    f = rest.split()
    if len(f) < 2 or path not in byobj:
        continue
    typ, sym = f[-2], f[-1]
    if typ == "U":
        uses[byobj[path]].add(sym)
    elif typ.isupper() or typ in "vw":
        defs.setdefault(sym, byobj[path])
edges = {s: {} for s in objs}  # a -> b -> the symbols a uses that b defines
for a, syms in uses.items():
    for sym in syms:
        b = defs.get(sym)
        if b is not None and b != a:
            edges[a].setdefault(b, set()).add(sym)

def sccs(nodes, succ):  # Tarjan, iterative
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]
    for v0 in sorted(nodes):
        if v0 in index:
            continue
        work = [(v0, iter(sorted(succ(v0))))]
        index[v0] = low[v0] = n[0]; n[0] += 1; stack.append(v0); on.add(v0)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n[0]; n[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(succ(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out

def names(syms):
    s = sorted(syms)
    return ", ".join(s[:3]) + (f" (+{len(s) - 3} more)" if len(s) > 3 else "")

bad = 0
for a in sorted(edges):
    for b in sorted(edges[a]):
        if a < b and a in edges.get(b, {}):
            print(f"{a} <-> {b}: {os.path.basename(a)} uses {names(edges[a][b])}, "
                  f"{os.path.basename(b)} uses {names(edges[b][a])}")
            bad = 1
# longer circles: those left with the two-way pairs taken out
one_way = lambda v: [w for w in edges[v] if v not in edges[w]]  # noqa: E731
for comp in sccs(edges, one_way):
    inside = set(comp)
    path, seen, v = [comp[0]], {comp[0]: 0}, comp[0]
    while True:  # walk inside the component until a file repeats
        v = min(w for w in one_way(v) if w in inside)
        if v in seen:
            break
        seen[v] = len(path); path.append(v)
    cyc = path[seen[v]:] + [v]
    print(" -> ".join(cyc) + ": " + "; ".join(
        f"{os.path.basename(x)} uses {names(edges[x][y])}" for x, y in zip(cyc, cyc[1:])))
    bad = 1
sys.exit(bad)
EOF_PY
fi

if [ $bad -ne 0 ]; then echo "check_layers: FAILED"; exit 1; fi
echo "check_layers: ok"
