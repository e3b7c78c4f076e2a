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
#   by the files of that folder (worker/graph/graph_priv.h by worker/graph/).
# Prints each violation as FILE:LINE: why, and exits 1 if there is any.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
PUBLIC_TODO=""
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
  b=$(basename "$h")
  case " $PUBLIC_TODO " in *" $b "*) continue ;; esac
  while IFS= read -r hit; do
    say "$h:${hit%%:*}" "a public header includes a non-public header"
  done < <(grep -n '#[[:space:]]*include[[:space:]]*"' "$h" | grep -v '"paramserver/' | cut -d: -f1)
done
n_todo=$(echo $PUBLIC_TODO | wc -w)
if [ "$n_todo" -gt 0 ]; then echo "note: $n_todo public headers still include non-public headers: $PUBLIC_TODO"; fi

if [ $bad -ne 0 ]; then echo "check_layers: FAILED"; exit 1; fi
echo "check_layers: ok"
