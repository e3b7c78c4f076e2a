#!/usr/bin/env bash
# ps-launch --replicas (issue 23) through real processes: the flags'
# errors; an external etcd (--etcd) is used and none is started; a local
# etcd is started, named in the spec, and stopped by ps-launch, also when
# ps-launch is killed -9; a ps that exits 75 (fenced) or is killed -9 is
# restarted on its address to rejoin, counted against --max-restarts; a
# job trains across the kill -9 of a ps with no restore from a
# checkpoint, and no etcd is left behind (checked by pid).
# Ports are picked at run time; waits poll with deadlines.
set -uo pipefail
PS_LAUNCH=${PS_LAUNCH:?}; PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}
PS_WORKER=${PS_WORKER:?}
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
test_init launch-repl
export TMPDIR=$dir # ps-launch's temporary directory (spec, etcd data) under $dir

alive() {
  local st
  st=$(cut -d' ' -f3 "/proc/$1/stat" 2> /dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
# every process naming $dir (ps-server, etcd's --data-dir, the wrapper)
leftovers() {
  local p out=""
  for p in $(pgrep -f -- "$dir"); do alive "$p" && out+=" $p"; done
  echo "$out"
}
test_cleanup_hook() { for p in $(leftovers); do kill -KILL "$p" 2> /dev/null; done; }
no_leftovers() { local l; l=$(leftovers); [ -z "$l" ] || { echo "left running:$l"; return 1; }; }
gone() { ! alive "$1"; }
etcd_pid_of() { grep -oE 'started etcd \(pid [0-9]+\)' "$1" | grep -oE '[0-9]+' | tail -1; }
launched_pid() { grep -oE "started $2 \(pid [0-9]+\)" "$1" | tail -1 | grep -oE '[0-9]+\)' | tr -d ')'; }
rc_is() { [ "$1" = "$2" ]; }
hasE() { grep -qE -- "$2" "$1"; }

# ---- the flags' errors: nothing starts -----------------------------------
expect "--replicas 4 is refused" 2 "ps-launch: --replicas must be an integer in 1..3, got '4'" \
  "$PS_LAUNCH" --ps 2 --replicas 4
expect "--etcd with a bad endpoint is refused, naming the flag" 2 \
  'ps-launch: --etcd: endpoint "nohost" is not HOST:PORT' \
  "$PS_LAUNCH" --ps 2 --replicas 2 --etcd "nohost"
expect "--job with a bad name is refused" 2 \
  'ps-launch: --job "a/b" must be 1 to 100 characters of A-Z a-z 0-9 _ . -' \
  "$PS_LAUNCH" --ps 2 --replicas 2 --etcd 127.0.0.1:1 --job "a/b"
expect "--etcd-election-ms under 5 x heartbeat is refused" 2 \
  "ps-launch: --etcd-election-ms (40) must be at least 5 times --etcd-heartbeat-ms (10)" \
  "$PS_LAUNCH" --ps 2 --replicas 2 --etcd-election-ms 40
expect "an etcd that cannot run: exit 1, its error shown" 1 \
  "etcd (/nonexistent/etcd) exited with status 127 before it was healthy" \
  "$PS_LAUNCH" --ps 2 --replicas 2 --etcd-bin /nonexistent/etcd
check "no process left after the errors" no_leftovers

# ---- an external etcd: used, none started --------------------------------
etcd_start ext || { bad "the test's etcd starts"; finish; }
"$PS_LAUNCH" --ps 2 --replicas 2 --etcd "$ETCD_ENDPOINT" --job extjob --lease-ttl 3 \
  --write-cluster "$dir/ext.json" > "$dir/ext.out" 2> "$dir/ext.err" &
lp=$!
show="$dir/ext.err"
check "external etcd: the cluster comes up" wait_for "$dir/ext.err" 'launch: cluster ready' 60
check "external etcd: ps-launch says which etcd it uses" \
  hasE "$dir/ext.err" "INFO launch: replicated \(2 replicas per shard\) with the etcd at $ETCD_ENDPOINT\$"
check "external etcd: no etcd started" bash -c "! grep -q 'started etcd' '$dir/ext.err'"
out=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["replication"], sort_keys=True))' "$dir/ext.json" 2>&1)
want="{\"etcd\": \"$ETCD_ENDPOINT\", \"job\": \"extjob\", \"lease_ttl\": 3, \"replicas\": 2}"
if [ "$out" = "$want" ]; then ok "external etcd: the spec's replication section"; else bad "external etcd: the spec's replication section" "$out (want $want)"; fi
kill -TERM "$lp"; wait "$lp"; rc=$?
check "external etcd: SIGTERM stops the job (143)" rc_is "$rc" 143
check "external etcd: the test's etcd still runs" alive "$ETCD_PID"
etcd_stop
check "external etcd: no process left" no_leftovers

# ---- a local etcd; a ps that exits 75 (fenced) is restarted --------------
# fake-ps.sh: the real ps-server; the first run of ps/1 exits 75 once
# $dir/fence exists (what a fenced ps does), the later runs are the real one.
cat > "$dir/fake-ps.sh" << EOF
#!/usr/bin/env bash
task=\$(sed -n 's/.*--task \([0-9]*\).*/\1/p' <<< "\$*")
if [ "\$task" != 1 ] || [ -e "$dir/fenced-once" ]; then exec "$PS_SERVER" "\$@"; fi
"$PS_SERVER" "\$@" & p=\$!
while [ ! -e "$dir/fence" ]; do sleep 0.02; done
kill -KILL \$p; wait \$p; : > "$dir/fenced-once"; exit 75
EOF
chmod +x "$dir/fake-ps.sh"
"$PS_LAUNCH" --ps 2 --replicas 2 --ps-server "$dir/fake-ps.sh" --write-cluster "$dir/f.json" \
  > "$dir/f.out" 2> "$dir/f.err" &
lp=$!
show="$dir/f.err"
check "local etcd: the cluster comes up" wait_for "$dir/f.err" 'launch: cluster ready' 60
check "local etcd: started, healthy, named" \
  hasE "$dir/f.err" 'INFO launch: started etcd \(pid [0-9]+\) on 127\.0\.0\.1:[0-9]+ \(peer port [0-9]+, heartbeat 10 ms, election 100 ms, data .*/etcd\.data\): healthy after [0-9.]+ s$'
check "local etcd: replicated implies restarts" \
  hasE "$dir/f.err" 'INFO launch: replicated \(2 replicas per shard\): a ps that fails or is fenced is restarted \(at most 3 times\) and rejoins as a backup$'
epid=$(etcd_pid_of "$dir/f.err")
ep=$(grep -oE 'started etcd \(pid [0-9]+\) on [0-9.:]+' "$dir/f.err" | grep -oE '[0-9.]+:[0-9]+$')
check "local etcd: it runs (pid $epid)" alive "$epid"
check "local etcd: it answers /health" bash -c "curl -s -m 2 http://$ep/health | grep -q '\"health\":\"true\"'"
check "local etcd: the spec names it" bash -c "grep -q '\"etcd\":\"$ep\"' '$dir/f.json' || grep -q '\"etcd\": \"$ep\"' '$dir/f.json'"
ps1=$(launched_pid "$dir/f.err" ps/1)
addr1=$(sed -n 's/^ps\/1: ps\/1 ready on //p' "$dir/f.out" | head -1)
: > "$dir/fence"
check "a fenced ps (exit 75) is restarted on its address to rejoin" \
  wait_for "$dir/f.err" "WARN launch: ps/1 was fenced \(exit 75\): restarting it on $addr1 in 0\.5 s to rejoin as a backup \(restart 1 of 3\)$" 30
check "the fenced ps is back" wait_for "$dir/f.err" "INFO launch: ps/1 restarted \(restart 1\): ready again on $addr1\$" 30
check "nothing stopped for it" bash -c "! grep -q 'stopping every task' '$dir/f.err'"
kill -TERM "$lp"; wait "$lp"; rc=$?
check "local etcd: SIGTERM stops the job (143)" rc_is "$rc" 143
check "local etcd: stopped last, by pid" bash -c "grep -n . '$dir/f.err' | tail -3 | grep -q 'INFO launch: etcd (pid $epid) stopped'"
check "local etcd: not running (pid $epid)" gone "$epid"
check "local etcd: its data removed" bash -c "! ls -d '$dir'/ps-launch-*/etcd.data 2> /dev/null"
check "local etcd: no process left" no_leftovers

# ---- --max-restarts 0: a fenced ps ends the job ---------------------------
rm -f "$dir/fence" "$dir/fenced-once"
"$PS_LAUNCH" --ps 2 --replicas 2 --max-restarts 0 --ps-server "$dir/fake-ps.sh" \
  > "$dir/m.out" 2> "$dir/m.err" &
lp=$!
show="$dir/m.err"
check "max-restarts 0: the cluster comes up" wait_for "$dir/m.err" 'launch: cluster ready' 60
epid=$(etcd_pid_of "$dir/m.err")
: > "$dir/fence"
wait "$lp"; rc=$?
check "max-restarts 0: exit 1" rc_is "$rc" 1
check "max-restarts 0: says why" hasE "$dir/m.err" 'ERROR launch: ps/1 failed: was fenced \(exit 75\) \(no restarts left\): stopping every task$'
check "max-restarts 0: etcd not running (pid $epid)" gone "$epid"
check "max-restarts 0: no process left" no_leftovers

# ---- ps-launch killed -9: its etcd goes with it ---------------------------
"$PS_LAUNCH" --ps 1 --replicas 2 > "$dir/k.out" 2> "$dir/k.err" &
lp=$!
check "kill -9: etcd started" wait_for "$dir/k.err" 'started etcd' 60
epid=$(etcd_pid_of "$dir/k.err")
kill -KILL "$lp"; wait "$lp" 2> /dev/null
for ((i = 0; i < 200; i++)); do alive "$epid" || break; sleep 0.05; done
check "kill -9 of ps-launch: its etcd is gone too (pid $epid)" gone "$epid"
test_cleanup_hook # the ps tasks are left running, as documented

# ---- a replicated job trains across the kill -9 of a ps -------------------
# The chief is held (SIGSTOP) from step 50 until ps/1 is back and the
# view has it again, so the job cannot end before; then it trains on to
# --steps through ps/1's rejoin.
STEPS=400
ck="$dir/ck"; mkdir -p "$ck"
"$PS_LAUNCH" --ps 2 --workers 1 --replicas 2 --write-cluster "$dir/j.json" \
  --ps-arg "--checkpoint-dir=$ck" \
  -- "$PS_WORKER" --model linreg --steps "$STEPS" --log-every 10 --checkpoint-dir "$ck" \
  --rpc-timeout 20 > "$dir/j.out" 2> "$dir/j.err" &
lp=$!
show="$dir/j.err"
check "job: etcd started" wait_for "$dir/j.err" 'started etcd' 60
epid=$(etcd_pid_of "$dir/j.err")
check "job: the chief trains" wait_for "$dir/j.err" '^worker/0: .*step [0-9]*[1-9]0 loss' 120
cp=$(launched_pid "$dir/j.err" worker/0)
kill -STOP "$cp"
# view_epoch: EPOCH, the epoch of the view in etcd as psctl status shows
# it (0: none there yet, the initial placement), and ST its output
view_epoch() {
  ST=$("$PSCTL" --cluster "$dir/j.json" --timeout-ms 3000 status 2>&1)
  EPOCH=$(sed -n 's/^replication: 2 replicas per shard, view epoch \([0-9]*\).*/\1/p' <<< "$ST")
}
view_epoch
e0=$EPOCH
if [ "${e0:-0}" -ge 1 ]; then ok "job: the ps tasks keep their view in ps-launch's etcd (epoch $e0)"; else bad "job: the ps tasks keep their view in ps-launch's etcd" "$ST"; fi
ps1=$(launched_pid "$dir/j.err" ps/1)
addr1=$(sed -n 's/^ps\/1: ps\/1 ready on //p' "$dir/j.out" | head -1)
kill -KILL "$ps1"
check "job: the killed ps is restarted on its address" \
  wait_for "$dir/j.err" "WARN launch: ps/1 killed by signal 9 \(Killed\): restarting it on $addr1 in 0\.5 s to rejoin as a backup \(restart 1 of 3\)$" 30
check "job: it is back" wait_for "$dir/j.err" "INFO launch: ps/1 restarted \(restart 1\): ready again on $addr1\$" 30
# it rejoins: a newer view has it again, in sync, for both shards
rejoined() {
  view_epoch
  [ "${EPOCH:-0}" -gt "${e0:-0}" ] && [ "$(grep -cE '^shard [01]: .*ps/1 (primary|backup) \(' <<< "$ST")" = 2 ] &&
    ! grep -qE 'syncing|down' <<< "$ST"
}
for ((i = 0; i < 300; i++)); do rejoined && break; sleep 0.05; done
if rejoined; then ok "job: the restarted ps rejoined, in sync (view epoch $e0 -> newer)"; else bad "job: the restarted ps rejoined, in sync (epoch before: $e0)" "$ST"; fi
kill -CONT "$cp"
wait "$lp"; rc=$?
check "job: exit status is the chief's (0)" rc_is "$rc" 0
steps=$(grep -oE '^worker/0: .*\bstep [0-9]+ loss' "$dir/j.err" | grep -oE 'step [0-9]+' | grep -oE '[0-9]+')
back=$(awk 'NR > 1 && $1 < prev { print prev " -> " $1 } { prev = $1 }' <<< "$steps")
check "job: the global step never went back" test -z "$back"
check "job: trained to the end" test "$(tail -1 <<< "$steps")" = "$STEPS"
check "job: no restore from a checkpoint (nothing acknowledged was lost)" \
  bash -c "! grep -qE 'waiting for the cluster to recover|restor(ed|ing) ps/1' '$dir/j.err'"
check "job: etcd not running (pid $epid)" gone "$epid"
check "job: no process left" no_leftovers

finish
