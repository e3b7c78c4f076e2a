#!/usr/bin/env bash
# psctl restore into a restarted ps (issue 26; README "Recovering a
# restarted ps with psctl").  Two ps tasks share a checkpoint directory;
# restore-counters puts ack/c0..c7 round robin on them (ps/0: c0 c2 c4 c6,
# ps/1: c1 c3 c5 c7); psctl save ack; ps/0's counters change (+100); ps/1
# is killed with -9 and started again on its address, empty.  Then:
#  a. psctl restore fails (exit 1), naming the 4 variables on no ps task
#     and the way out, and changes nothing; so do ps_client_restore and
#     ps_client_restore_opts (NOT_FOUND, the count in absent);
#  b. --create --only-missing creates the 4 on ps/1 (round robin, as
#     replica_device_setter placed them) and restores them alone: ps/0's
#     counters keep their new values;
#  c. --create restores all 8 (ps/0's roll back, as a full restore does);
#  d. --task 1 --create: all missing ones on ps/1, ps/1 alone restored;
#  e. a partitioned variable lost in part comes back as its part;
#  f. errors: --task out of range, not a number, unknown options, the
#     restore flags on another command, --only-missing without --create;
#  g. a restore that fails after --create deletes what it created; one
#     with a ps down creates nothing;
#  h. a checkpoint's tensors of dtypes no ps holds (DT_STRING) are not ps
#     variables: skipped, said so, the rest restored;
#  i. --create puts a slot (P/Momentum, P/Adam) with its primary P, taking
#     no turn, and Adam's beta1_power with the first P that has P/Adam;
#  j. an older ps-server (PS_TEST_IGNORE_LIST: it ignores list; and
#     PS_TEST_IGNORE_CHECK_ONLY: check_only too) fails the list's probe
#     item at once: psctl says so and nothing was restored;
#  k. a restore that fails after --create and cannot delete what it
#     created says what is left (ps/1 killed during its restore);
#  l. a checkpoint tensor of which the ps hold only some rows (a live part
#     of it) exists on no ps task: named, nothing restored;
#  m. more than 8 variables on no ps task (8 named, then "..."); a tensor
#     saved in slices across two dimensions cannot be created; and
#     --only-missing restores a live uninitialized variable, leaving the
#     initialized ones alone;
#  n. a prefix so long that not every name fits: names are not cut, the
#     way out is kept; --task twice; a PREFIX after "--".
# Checkpoints no ps variable set saves are written by restore-ckpt.
# Ports are chosen at run time; every process is stopped by pid.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}; RESTORE_COUNTERS=${RESTORE_COUNTERS:?}
RESTORE_CKPT=${RESTORE_CKPT:?}
source "$(dirname "$0")/../support/lib.sh"
test_init restore-recovery
BAD_TAIL=30

# up [--parts]: a fresh pair of ps tasks on one checkpoint directory, the
# counters (and with --parts ack/w) on them, saved as ack, then ps/0's
# counters +100.  P0 P1 the pids, A1 ps/1's address, $spec the cluster.
up() {
  [ -n "${P0:-}" ] && kill -KILL "$P0" "$P1" 2> /dev/null && wait "$P0" "$P1" 2> /dev/null
  rm -rf "$dir/ckpt" && mkdir -p "$dir/ckpt"
  start_ps_cluster 2 "$dir/ps.log" --checkpoint-dir "$dir/ckpt" || { bad "ps tasks up" "$(cat "$dir/ps.log")"; finish; }
  P0=${PS_PIDS[0]} P1=${PS_PIDS[1]} A1=${PS_ADDRS[1]}
  spec="$dir/spec.json"
  echo "{\"ps\": [$PS_LIST]}" > "$spec"
  "$RESTORE_COUNTERS" "$spec" create "$@" || { bad "counters created"; finish; }
  "$PSCTL" --cluster "$spec" save ack > "$dir/save.out" 2>&1 || { bad "save" "$(cat "$dir/save.out")"; finish; }
  "$RESTORE_COUNTERS" "$spec" add 100 || { bad "counters changed"; finish; }
}

# restart1: ps/1 killed with -9 and started again on its address, empty
restart1() {
  kill -KILL "$P1"; wait "$P1" 2> /dev/null
  start_ps_on "$spec" 1 "$dir/ps.log" --checkpoint-dir "$dir/ckpt"
  case $? in
    0) P1=$PID ;;
    *) bad "ps/1 restarted on $A1" "$(tail -5 "$dir/ps.log")"; finish ;;
  esac
}

psctl() { "$PSCTL" --cluster "$spec" "$@"; }
# value NAME: what psctl read prints as the value (its last line)
value() { psctl read "$1" 2>&1 | tail -n +2 | tr -d '\n'; }
# values WANT NAME...: each NAME reads as WANT[i] (space-separated lists)
values() {
  local want=($1) got="" n; shift
  for n in "$@"; do got="$got${got:+ }$(value "$n")"; done
  if [ "$got" = "${want[*]}" ]; then ok "$*: ${want[*]}"; else bad "$* are ${want[*]}" "got: $got"; fi
}
# part_is NAME WANT: the value psctl read prints, its lines joined
part_is() {
  local got
  got=$(value "$1")
  if [ "$got" = "$2" ]; then ok "$1: $2"; else bad "$1 is $2" "got: $got"; fi
}

# a. a restore that cannot be whole says so and changes nothing
up
restart1
expect "restore into a restarted ps fails" 1 \
  "restored 0 of 8 variables of $dir/ckpt/ack (nothing changed); 4 exist on no ps task: ack/c1, ack/c3, ack/c5, ack/c7 (a restarted ps comes back empty: recreate them with psctl restore --create, or restore from the chief)" \
  psctl restore ack
values "101 103 105 107" ack/c0 ack/c2 ack/c4 ack/c6
expect "the C API reports the count" 0 "restore_opts: NOT_FOUND restored=0 total=8 absent=4 created=0" \
  "$RESTORE_COUNTERS" "$spec" restore ack
expect "ps_client_restore fails the same" 0 "restore: NOT_FOUND restored=0: restored 0 of 8 variables" \
  "$RESTORE_COUNTERS" "$spec" restore ack
expect "still missing afterwards" 1 "variable ack/c1 not found on any ps task" psctl read ack/c1
expect "--only-missing needs --create when something is missing" 1 \
  "4 exist on no ps task: ack/c1, ack/c3, ack/c5, ack/c7" psctl restore ack --only-missing

# b. only what was lost
expect "restore --create --only-missing" 0 \
  "restored 4 of 8 variables from $dir/ckpt/ack; created 4 that existed on no ps task; only the missing ones" \
  psctl restore ack --create --only-missing
values "2 4 6 8" ack/c1 ack/c3 ack/c5 ack/c7
values "101 103 105 107" ack/c0 ack/c2 ack/c4 ack/c6
expect "created on ps/1, where replica_device_setter had them" 0 "ack/c7 (DT_FLOAT) [] on ps/1" psctl read ack/c7
expect "nothing missing: --only-missing restores nothing" 0 "restored 0 of 8 variables" \
  psctl restore ack --create --only-missing
values "101 103" ack/c0 ack/c2

# c. everything, created where missing
restart1
expect "restore --create" 0 "restored 8 of 8 variables from $dir/ckpt/ack; created 4 that existed on no ps task" \
  psctl restore ack --create
values "1 2 3 4 5 6 7 8" ack/c0 ack/c1 ack/c2 ack/c3 ack/c4 ack/c5 ack/c6 ack/c7

# d. one task: every missing variable created on it, it alone restored
up
restart1
expect "restore --task 1 --create" 0 \
  "restored 4 of 8 variables from $dir/ckpt/ack; created 4 that existed on no ps task; only ps/1" \
  psctl restore --task 1 ack --create
values "2 4 6 8" ack/c1 ack/c3 ack/c5 ack/c7
values "101 103 105 107" ack/c0 ack/c2 ack/c4 ack/c6
"$RESTORE_COUNTERS" "$spec" add 50 1 || bad "ps/1's counters changed"
expect "restore --task 0" 0 "restored 4 of 8 variables from $dir/ckpt/ack; only ps/0" \
  psctl restore ack --task=0
values "1 3 5 7" ack/c0 ack/c2 ack/c4 ack/c6
values "52 54 56 58" ack/c1 ack/c3 ack/c5 ack/c7
restart1
expect "restore --task 0 --create puts them all on ps/0" 0 "created 4 that existed on no ps task; only ps/0" \
  psctl restore ack --task 0 --create
expect "ack/c5 now on ps/0" 0 "ack/c5 (DT_FLOAT) [] on ps/0" psctl read ack/c5
values "6" ack/c5

# e. a partitioned variable: ps/1 held its second part
up --parts
restart1
expect "a lost part is named" 1 \
  "restored 0 of 10 variables of $dir/ckpt/ack (nothing changed); 5 exist on no ps task: ack/c1, ack/c3, ack/c5, ack/c7, ack/w/part_1 (" \
  psctl restore ack
expect "restore --create --only-missing with parts" 0 "restored 5 of 10 variables" \
  psctl restore ack --only-missing --create
expect "the part is back on ps/1 with its rows" 0 "ack/w/part_1 (DT_FLOAT) [2,2] on ps/1" psctl read ack/w/part_1
part_is ack/w/part_1 "[[4, 5] [6, 7]]"
part_is ack/w/part_0 "[[0, 1] [2, 3]]"
values "101 2" ack/c0 ack/c1

# f. errors, each with its message, changing nothing
expect "--task out of range" 1 "restore: ps task 2 does not exist (the cluster has 2 ps tasks: 0 to 1)" \
  psctl restore ack --task 2
expect "--task not a number" 2 "--task must be a ps task number (0, 1, ...), got 'one'" psctl restore ack --task one
expect "--task without a number" 2 "--task must be a ps task number (0, 1, ...), got ''" psctl restore ack --task
expect "unknown restore option" 2 "psctl: restore: unknown option '--bogus'" psctl restore ack --bogus
expect "two prefixes" 2 "psctl: restore: one PREFIX only, got 'other' too" psctl restore ack other
expect "restore flags on save" 2 "--create, --only-missing and --task are options of restore" psctl --create save x
expect "a checkpoint that does not exist" 1 "NOT_FOUND" psctl restore nope --create
values "101 2" ack/c0 ack/c1
expect "--help shows the flags" 0 "--only-missing" "$PSCTL" --help

# g. a restore that fails after --create deletes what it created: ps/1
# restarted, then given an ack/c3 of another shape
up
restart1
"$RESTORE_COUNTERS" "$spec" wrong ack/c3 1 || bad "a wrong ack/c3 made"
expect "a failing restore with --create" 1 "INVALID_ARGUMENT: restoring ack/c3 from ack/c3: the checkpoint has shape [], the variable has shape [3]" \
  psctl restore ack --create
expect "what it created is gone again" 1 "variable ack/c1 not found on any ps task" psctl read ack/c1
values "101 103" ack/c0 ack/c2
# and one whose ps is down creates nothing
kill -KILL "$P1"; wait "$P1" 2> /dev/null
expect "restore with ps/1 down" 1 "ps/1 at $A1" psctl restore ack --create --only-missing
values "101 103" ack/c0 ack/c2

# h. a DT_STRING tensor (a program's session state) is no ps variable
up
"$RESTORE_CKPT" "$dir/ckpt/withstr" strings || bad "checkpoint withstr written"
expect "a DT_STRING tensor is skipped and said so" 0 \
  "restored 8 of 8 variables from $dir/ckpt/withstr; skipped 1 tensors of dtypes no ps holds (not ps variables)" \
  psctl restore withstr
values "1 2 3 4 5 6 7 8" ack/c0 ack/c1 ack/c2 ack/c3 ack/c4 ack/c5 ack/c6 ack/c7
expect "the C API restores it too" 0 "restore: OK restored=8" \
  "$RESTORE_COUNTERS" "$spec" restore withstr

# i. slots go with their primary (TensorFlow's colocate_with): with 2 ps,
# s/a s/b s/c take turns 0 1 0; beta1_power goes with s/b (the first that
# has an Adam slot)
"$RESTORE_CKPT" "$dir/ckpt/slots" slots || bad "checkpoint slots written"
expect "restore --create --only-missing of a checkpoint with slots" 0 \
  "restored 7 of 7 variables from $dir/ckpt/slots; created 7 that existed on no ps task" \
  psctl restore slots --create --only-missing
for v in s/a:0 s/a/Momentum:0 s/b:1 s/b/Adam:1 s/b/Momentum:1 s/c:0 beta1_power:1; do
  expect "${v%:*} created on ps/${v#*:}" 0 "${v%:*} (DT_FLOAT) [2] on ps/${v#*:}" psctl read "${v%:*}"
done

# j. an older ps-server, which ignores list and check_only, would restore
# everything if asked for every variable: the list names one item of no
# variable, so it fails at once and changes nothing
PS_PREFIX="env PS_TEST_IGNORE_LIST=1 PS_TEST_IGNORE_CHECK_ONLY=1" up
: > "$dir/ps.log" # the ps append to it: from here on, this section's lines
expect "restore from older ps-servers" 1 \
  "FAILED_PRECONDITION: Restore: /job:ps/task:0 (${PS_ADDRS[0]}) did not list the checkpoint: an older ps-server; nothing changed" \
  psctl restore ack
values "101 2 103 4" ack/c0 ack/c1 ack/c2 ack/c3
if grep -q "restored [0-9]* variables from" "$dir/ps.log"; then
  bad "an older ps-server restored nothing" "$(grep "restored" "$dir/ps.log")"
else
  ok "an older ps-server restored nothing"
fi

# k. ps/1, restarted, waits in its restore (PS_SLOW_AT) and is killed
# there: the restore fails, and the 4 variables created on ps/1 cannot be
# deleted again; the message names them
up
PS_PREFIX="env PS_SLOW_AT=restore_tensor:20000" restart1
: > "$dir/ps.log"
psctl --timeout-ms 3000 restore ack --create --only-missing > "$dir/k.out" 2>&1 &
kpid=$!
wait_for "$dir/ps.log" "ps/1: PS_SLOW_AT=restore_tensor" 30 || bad "ps/1 reached its restore" "$(cat "$dir/ps.log")"
kill -KILL "$P1"; wait "$P1" 2> /dev/null
wait "$kpid"; krc=$?
if [ "$krc" = 1 ] && grep -qF "; 4 variables created on ps/1 are left: ack/c1, ack/c3, ack/c5, ack/c7 (" "$dir/k.out"; then
  ok "a failed rollback names what is left"
else
  bad "a failed rollback names what is left (exit $krc)" "$(cat "$dir/k.out")"
fi
values "101 103" ack/c0 ack/c2

# l. p/w [4,2] saved whole; the ps hold only p/w/part_0, its rows 0..1
up
"$RESTORE_CKPT" "$dir/ckpt/whole" whole || bad "checkpoint whole written"
"$RESTORE_COUNTERS" "$spec" part p/w/part_0 p/w 0 || bad "p/w/part_0 made"
expect "a tensor the ps hold only in part is absent" 1 \
  "restored 0 of 1 variables of $dir/ckpt/whole (nothing changed); 1 exist on no ps task: p/w (" \
  psctl restore whole
part_is p/w/part_0 "[[0, 0] [0, 0]]"

# m. 10 absent: the first 8 named, then "..."
"$RESTORE_CKPT" "$dir/ckpt/many" many || bad "checkpoint many written"
expect "10 variables on no ps task" 1 \
  "restored 0 of 10 variables of $dir/ckpt/many (nothing changed); 10 exist on no ps task: m/v0, m/v1, m/v2, m/v3, m/v4, m/v5, m/v6, m/v7, ... (a restarted ps comes back empty" \
  psctl restore many
# g [2,2] saved in four 1x1 slices: no ps variable holds such a part
"$RESTORE_CKPT" "$dir/ckpt/grid" grid || bad "checkpoint grid written"
expect "a tensor sliced across two dimensions" 1 \
  "INVALID_ARGUMENT: restore: g is saved in slices across more than its first dimension, which no ps variable holds: create it from its training program; nothing changed" \
  psctl restore grid --create --only-missing
expect "nothing of it created" 1 "variable g/part_0 not found on any ps task" psctl read g/part_0
# ps/1 restarted, ack/c1 made again by a program but not yet initialized
restart1
"$RESTORE_COUNTERS" "$spec" uninit ack/c1 1 || bad "an uninitialized ack/c1 made"
expect "--only-missing restores the uninitialized one too" 0 \
  "restored 4 of 8 variables from $dir/ckpt/ack; created 3 that existed on no ps task; only the missing ones" \
  psctl restore ack --create --only-missing
values "2 4 6 8" ack/c1 ack/c3 ack/c5 ack/c7
values "101 103 105 107" ack/c0 ack/c2 ack/c4 ack/c6

# n. the message keeps its way out when the prefix leaves little room:
# a checkpoint path of about 800 bytes, the names given what is left
base="restored 0 of 10 variables of  (nothing changed); 10 exist on no ps task:  (a restarted ps comes back empty: recreate them with psctl restore --create, or restore from the chief)"
need=$((1000 - ${#base} - ${#dir} - 6 - 4)) # "/ckpt/", "many"
rel=""
while [ "$need" -gt 1 ]; do
  n=$((need > 200 ? 200 : need)); rel="$rel$(head -c $((n - 1)) /dev/zero | tr '\0' d)/"; need=$((need - n))
done
mkdir -p "$dir/ckpt/$rel"
"$RESTORE_CKPT" "$dir/ckpt/${rel}many" many || bad "checkpoint ${rel}many written"
out=$(psctl restore "${rel}many" 2>&1)
if [[ "$out" == *"10 exist on no ps task: m/v0, "*", ... (a restarted ps comes back empty: recreate them with psctl restore --create, or restore from the chief)" ]]; then
  ok "a long prefix: names shortened, the way out kept"
else
  bad "a long prefix: names shortened, the way out kept" "$out"
fi
expect "--task twice" 2 "psctl: --task given twice (0 and 1): one task only" \
  psctl restore ack --task 0 --task 1
expect "a PREFIX after --" 1 "$dir/ckpt/-x" psctl restore -- -x
finish
