#!/usr/bin/env bash
# The installed tree is usable on its own: `meson install --destdir` of the
# build directory, then the example client built with nothing but
# `pkg-config paramserver` against that tree (shared and static), run
# against the installed ps-server on kernel-picked ports; the library
# exports exactly the functions its headers declare, and a C++ program
# builds and runs against it; the man pages and LICENSE are there.  Prints "N passed, N failed".
#   test_install.sh BUILD_DIR PS_DEMO_SOURCE
# PS_SANITIZE_FLAGS (build-asan: -fsanitize=...) goes into every program
# the test builds: a sanitized libpsworker needs the sanitizer runtime in
# each program linking it.
set -uo pipefail
build=${1:?build dir}; demo_src=${2:?ps_demo.c}
CC=${CC:-cc}
san=${PS_SANITIZE_FLAGS:-}
command -v pkg-config >/dev/null || { echo "skip: no pkg-config"; exit 77; }
source "$(dirname "$0")/../support/lib.sh"
test_init install

dest="$dir/root"
out=$(meson install -C "$build" --destdir "$dest" --no-rebuild 2>&1) \
  || { bad "meson install --destdir" "$out"; finish; }
ok "meson install --destdir"

# Locate the tree through the .pc file only: the prefix is where meson was
# configured to install, rewritten to live under $dest.
pc=$(find "$dest" -name paramserver.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || { bad "paramserver.pc installed"; finish; }
ok "paramserver.pc installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
unset PKG_CONFIG_SYSROOT_DIR
prefix=$(pkg-config --variable=prefix paramserver)
root="$dest$prefix"
pcx=(--define-variable=prefix="$root")
libdir=$(pkg-config "${pcx[@]}" --variable=libdir paramserver)
cflags=$(pkg-config "${pcx[@]}" --cflags paramserver)
libs=$(pkg-config "${pcx[@]}" --libs paramserver)
[[ "$cflags" == *"-I$root/include"* && "$libs" == *"-L$libdir"* ]] \
  && ok "pkg-config points into the installed tree" \
  || bad "pkg-config points into the installed tree" "$cflags $libs"
[ -L "$libdir/libpsworker.so" ] && [ -f "$libdir/libpsworker.a" ] \
  && ok "shared and static libpsworker" || bad "shared and static libpsworker" "$(ls -l "$libdir")"
soname=$(readelf -d "$libdir/libpsworker.so" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
major=$(pkg-config --modversion paramserver | cut -d. -f1)
[ "$soname" = "libpsworker.so.$major" ] && ok "soname $soname" || bad "soname" "'$soname'"

# Every public header compiles alone from the installed tree.
hdr_fail=""
for h in "$root"/include/paramserver/*.h; do
  printf "#include <paramserver/%s>\ntypedef int ps_header_check_;\n" "$(basename "$h")" |
    $CC -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only $cflags -x c - 2>&1 ||
    hdr_fail+=" $(basename "$h")"
done
[ -z "$hdr_fail" ] && ok "headers self-contained" || bad "headers self-contained" "$hdr_fail"

# The export list is the API: libpsworker.so's dynamic symbols are exactly
# the functions the installed headers declare, no internal one besides
# and none missing.  The compiler parses the headers: gcc's -aux-info
# writes every prototype it reads, one a line, after the file and line it
# came from ("/* F:L:NC */ extern int ps_x (int);"; static inline ones
# read "static" and are not exported).
all_h="$dir/all_headers.c"
for h in "$root"/include/paramserver/*.h; do
  echo "#include <paramserver/$(basename "$h")>"
done > "$all_h"
if out=$(gcc -std=c11 $cflags -fsyntax-only -aux-info "$dir/aux.txt" "$all_h" 2>&1); then
  awk -v inc="$root/include/paramserver/" '
    index($0, "/* " inc) == 1 && / \*\/ extern / {
      sub(/^\/\*[^*]*\*\/ /, "")
      if (match($0, /[A-Za-z_][A-Za-z0-9_]* \(/)) print substr($0, RSTART, RLENGTH - 2)
    }' "$dir/aux.txt" | sort > "$dir/declared.txt"
  nm -D --defined-only "$libdir/libpsworker.so" | awk '{ sub(/@.*/, "", $NF); print $NF }' |
    sort > "$dir/exported.txt"
  extra=$(comm -13 "$dir/declared.txt" "$dir/exported.txt" | tr '\n' ' ')
  missing=$(comm -23 "$dir/declared.txt" "$dir/exported.txt" | tr '\n' ' ')
  ndecl=$(wc -l < "$dir/declared.txt")
  if ! grep -qx ps_library_init "$dir/declared.txt"; then
    bad "exports: the headers parse" "no ps_library_init among: $(tr '\n' ' ' < "$dir/declared.txt")"
  elif [ -z "$extra$missing" ]; then
    ok "exports: exactly the $ndecl functions the headers declare"
  else
    bad "exports: exactly the $ndecl functions the headers declare" \
      "exported but in no installed header ($(wc -w <<< "$extra")): $extra
declared but not exported ($(wc -w <<< "$missing")): $missing"
  fi
  # C++ callers need C linkage: every header that declares a function
  # opens extern "C" for C++.
  guard_fail=""
  for h in $(awk '/ \*\/ extern / { sub(/^\/\* /, ""); sub(/:.*/, ""); print }' "$dir/aux.txt" |
    grep -F "$root/include/paramserver/" | sort -u); do
    grep -q '^extern "C" {' "$h" || guard_fail+=" $(basename "$h")"
  done
  [ -z "$guard_fail" ] && ok 'headers have extern "C" guards' \
    || bad 'headers have extern "C" guards' "$guard_fail"
else
  bad "exports: gcc -aux-info parses the headers" "$out"
fi

# Build the example and a version/init check with the installed flags only.
cp "$demo_src" "$dir/ps_demo.c"
expect "build ps_demo (shared)" 0 "" \
  $CC -std=c11 -Wall -Wextra -Werror $san -o "$dir/demo" "$dir/ps_demo.c" $cflags $libs
expect "build ps_demo (static)" 0 "" \
  $CC -std=c11 -Wall -Wextra -Werror $san -o "$dir/demo-static" "$dir/ps_demo.c" $cflags \
  "$libdir/libpsworker.a" $(pkg-config "${pcx[@]}" --static --libs paramserver | sed 's/-lpsworker//')
cat > "$dir/version.c" <<'C'
#include <paramserver/paramserver.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  /* reference counted: nested pairs, and an extra shutdown is a no-op */
  if (ps_library_init() != 0 || ps_library_init() != 0) return 1;
  ps_library_shutdown();
  ps_library_shutdown();
  ps_library_shutdown();
  if (ps_library_init() != 0) return 1;
  ps_library_shutdown();
  printf("%d.%d.%d %s %s %s\n", PS_VERSION_MAJOR, PS_VERSION_MINOR, PS_VERSION_PATCH,
         PS_VERSION_STRING, ps_library_version(),
         PS_VERSION_AT_LEAST(PS_VERSION_MAJOR, 0, 0) ? "ok" : "bad");
  return strcmp(PS_VERSION_STRING, ps_library_version()) != 0;
}
C
v=$(pkg-config --modversion paramserver)
expect "build version check" 0 "" $CC -std=c11 -Wall -Wextra -Werror $san -o "$dir/version" \
  "$dir/version.c" $cflags $libs
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
expect "version macros and ps_library_*" 0 "$v $v $v ok" "$dir/version"

# A C++ program includes every public header and calls the API through
# the installed shared library.
CXX=${CXX:-g++}
{
  for h in "$root"/include/paramserver/*.h; do
    echo "#include <paramserver/$(basename "$h")>"
  done
  cat <<'CXX'
#include <cstdio>
#include <string>
int main() {
  if (ps_library_init() != 0) return 1;
  ps_status st;
  ps_status_clear(&st);
  static const char spec[] = "{\"ps\": [\"127.0.0.1:2222\"], \"worker\": [\"h1:2\", \"h2:3\"]}";
  ps_cluster *cl = ps_cluster_parse(spec, sizeof spec - 1, "c++", &st);
  if (cl == nullptr) {
    std::fprintf(stderr, "%s\n", st.msg);
    return 1;
  }
  const int64_t dims[2] = {2, 3};
  ps_tensor *t = ps_tensor_new(PS_DT_FLOAT, 2, dims);
  if (t == nullptr) return 1;
  static_cast<float *>(ps_tensor_data(t))[5] = 1.5f;
  char shape[32];
  std::string out = std::string(ps_cluster_address(cl, "worker", 1)) + " " +
                    std::to_string(ps_cluster_num_tasks(cl, "worker")) + " " +
                    ps_shape_format(&t->shape, shape, sizeof shape) + " " +
                    ps_dtype_name(t->dtype) + " " +
                    std::to_string(ps_elem_get(t->dtype, ps_tensor_data(t), 5)) + " ";
  ps_graph *g = ps_graph_create();
  ps_tensor *c = ps_tensor_new(PS_DT_FLOAT, 0, nullptr);
  ps_node *n = ps_constant(g, c, "two");
  out += std::string(n != nullptr ? ps_node_op(n) : "?") + " ";
  if (ps_cluster_parse("[", 1, "c++", &st) != nullptr) return 1;
  out += ps_status_code_name(st.code);
  std::printf("%s\n", out.c_str());
  ps_tensor_destroy(c);
  ps_graph_destroy(g);
  ps_tensor_destroy(t);
  ps_cluster_destroy(cl);
  ps_library_shutdown();
  return 0;
}
CXX
} > "$dir/api.cc"
if command -v "$CXX" >/dev/null; then
  expect "build a C++ program (shared)" 0 "" \
    "$CXX" -std=c++17 -Wall -Wextra -Werror $san -o "$dir/api_cxx" "$dir/api.cc" $cflags $libs
  expect "C++ program runs" 0 "h2:3 2 [2,3] float 1.500000 Const INVALID_ARGUMENT" "$dir/api_cxx"
  [[ "$(ldd "$dir/api_cxx")" == *"$libdir/libpsworker.so.$major"* ]] \
    && ok "C++ program loads the installed libpsworker" \
    || bad "C++ program loads the installed libpsworker" "$(ldd "$dir/api_cxx")"
else
  bad "a C++ compiler ($CXX)" "not found: deploy/setup.sh installs g++ (build-essential)"
fi
[[ "$(ldd "$dir/demo")" == *"$libdir/libpsworker.so.$major"* ]] \
  && ok "demo loads the installed libpsworker" || bad "demo loads the installed libpsworker" "$(ldd "$dir/demo")"

# A real cluster of two installed ps-servers, ports picked by the kernel;
# they die with this script even if it is killed (setpriv, util-linux).
pdeath=()
setpriv --pdeathsig KILL true 2>/dev/null && pdeath=(setpriv --pdeathsig KILL)
start_ps() {
  local fifo="$dir/ready.$1"
  mkfifo "$fifo"
  "${pdeath[@]}" "$root/bin/ps-server" --cluster "$dir/boot.json" --job ps --task "$1" > "$fifo" 2>> "$dir/ps.log" &
  local line=""
  read -r -t 60 line < "$fifo" || true
  ADDR=${line##* }
  [[ "$line" == "ps/$1 ready on 127.0.0.1:"* ]]
}
echo '{"ps": ["127.0.0.1:0", "127.0.0.1:0"]}' > "$dir/boot.json"
if start_ps 0 && A0=$ADDR && start_ps 1 && A1=$ADDR; then
  ok "installed ps-server ready"
  echo "{\"ps\": [\"$A0\", \"$A1\"]}" > "$dir/cluster.json"
  expect "demo (shared) runs" 0 "updated: global_step += 1; dense/bias -= 0.5; embedding[1,4] += 1" \
    "$dir/demo" "$dir/cluster.json"
  expect "demo saw both ps" 0 "ps/1 at $A1: 2 variables" "$dir/demo" "$dir/cluster.json"
  expect "demo (static) runs" 0 "cluster: 2 ps task(s)" "$dir/demo-static" "$dir/cluster.json"
  expect "installed psctl sees them" 0 "ps/1 $A1 up vars=2" \
    "$root/bin/psctl" --cluster "$dir/cluster.json" status
else
  bad "installed ps-server ready" "$(cat "$dir/ps.log" 2>/dev/null)"
fi

# Programs, man pages, LICENSE.
for p in ps-server psctl ps-worker ps-launch; do
  expect "$p installed" 0 "usage: $p" "$root/bin/$p" --help
  m="$root/share/man/man1/$p.1"
  if [ -f "$m" ] && grep -q '^\.SH NAME' "$m" && grep -q '^\.SH OPTIONS' "$m"; then
    ok "man page $p.1"
  else
    bad "man page $p.1" "$(ls "$root/share/man/man1" 2>&1)"
  fi
done
lic="$root/share/doc/paramserver/LICENSE"
grep -q 'Apache License' "$lic" 2>/dev/null && grep -q 'Version 2.0, January 2004' "$lic" \
  && ok "LICENSE installed" || bad "LICENSE installed" "$lic"
finish
