#!/usr/bin/env bash
# The man pages (deploy/man/*.1) against the programs' --help, both ways:
# every flag a program's --help prints is an entry in its man page, every
# flag the man page has an entry for appears in --help, and the program
# accepts it (getopt does not call it unrecognized).  Flags live in one
# place, the man pages (issue 22 point 4); --help is their summary.
#   test_man_flags.sh MAN_DIR PROGRAM...   (man page: MAN_DIR/NAME.1)
# A flag of --help: one in the usage lines (from "usage:" to the first
# blank line), or in the term of an entry line (two spaces of indent, then
# the entry's words up to its description: "  --tls-cert FILE  ...",
# "  --help, --version", "  inspect PREFIX [--all]  ...").  A flag of the
# man page: one in the tag line of a .TP entry.
source "$(dirname "$0")/../support/lib.sh"
test_init man-flags

man_dir=${1:?usage: test_man_flags.sh MAN_DIR PROGRAM...}
shift
[ $# -gt 0 ] || { echo "test_man_flags.sh: no program given" >&2; exit 2; }

# help_flags: the flags of a --help text on stdin, one a line, sorted
help_flags() {
  awk '
    function flags(s,   n, i, w, out) {
      n = split(s, w, /[ \t]+/)
      for (i = 1; i <= n; i++)
        while (match(w[i], /--[a-z0-9][a-z0-9-]*/)) {
          print substr(w[i], RSTART, RLENGTH)
          w[i] = substr(w[i], RSTART + RLENGTH)
        }
    }
    /^usage:/ { usage = 1 }
    usage && /^[ \t]*$/ { usage = 0 }
    usage { flags($0); next }
    /^  [^ ]/ {
      n = split(substr($0, 3), w, / /)
      term = w[1]
      for (i = 2; i <= n; i++) {
        # the term: flags and metavariables (FILE, [PREFIX], NAME...)
        if (w[i] !~ /^\[?(--[a-z0-9][a-z0-9-]*|[A-Z][A-Z0-9_]*(\.\.\.)?)\]?,?$/) break
        term = term " " w[i]
      }
      flags(term)
    }' | sort -u
}

# man_flags FILE: the flags of the .TP tag lines of a man page, sorted
man_flags() {
  awk 'tag { gsub(/\\-/, "-"); gsub(/"/, " ");
             s = $0
             while (match(s, /--[a-z0-9][a-z0-9-]*/)) {
               print substr(s, RSTART, RLENGTH)
               s = substr(s, RSTART + RLENGTH)
             }
             tag = 0; next }
       /^\.TP/ { tag = 1 }' "$1" | sort -u
}

for prog in "$@"; do
  name=$(basename "$prog")
  page=$man_dir/$name.1
  if ! "$prog" --help >"$dir/$name.help" 2>&1; then
    bad "$name --help exits 0" "$(cat "$dir/$name.help")"
    continue
  fi
  if [ ! -f "$page" ]; then
    bad "$name has a man page ($page)"
    continue
  fi
  help_flags <"$dir/$name.help" >"$dir/$name.hf"
  man_flags "$page" >"$dir/$name.mf"
  if [ "$(wc -l <"$dir/$name.hf")" -lt 3 ]; then
    bad "$name: flags found in --help" "$(cat "$dir/$name.hf")"
    continue
  fi
  missing=$(comm -23 "$dir/$name.hf" "$dir/$name.mf")
  if [ -z "$missing" ]; then
    ok "$name: the $(wc -l <"$dir/$name.hf") flags of --help have entries in $name.1"
  else
    bad "$name: flags of --help without an entry in $page:" "$missing"
  fi
  extra=$(comm -13 "$dir/$name.hf" "$dir/$name.mf")
  if [ -z "$extra" ]; then
    ok "$name: every flag of $name.1 appears in --help"
  else
    bad "$name: flags of $page that --help does not print:" "$extra"
  fi
  # every flag of the man page is one the program takes
  unknown=""
  while read -r f; do
    out=$(timeout 20 "$prog" "$f=x" --help 2>&1 </dev/null)
    case $out in *"unrecognized option"*) unknown="$unknown $f" ;; esac
  done <"$dir/$name.mf"
  if [ -z "$unknown" ]; then
    ok "$name accepts every flag of $name.1"
  else
    bad "$name does not accept flags of $page:" "$unknown"
  fi
done
finish
