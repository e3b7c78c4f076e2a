#!/usr/bin/env bash
# Training jobs through real processes (ps-server, ps-worker, ps-launch,
# psctl) on 127.0.0.1, ports from the kernel: an end-to-end job that trains,
# checkpoints and restores into a new cluster; a chief restarted on a live
# cluster; a worker started before any ps; a non-chief killed during
# asynchronous training; a placement that differs from the chief's; psctl
# save and restore while training runs; ps-worker's argument errors.
# Prints "N passed, N failed".
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}; PS_WORKER=${PS_WORKER:?}; PS_LAUNCH=${PS_LAUNCH:?}
source "$(dirname "$0")/../support/lib.sh"
test_init jobs
BAD_TAIL=40
# wait_for FILE PATTERN SECS: until PATTERN (a basic regex) appears in FILE
wait_for() {
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
accuracy() { sed -n 's/^\(worker\/0: \)\{0,1\}test accuracy //p' "$1" | tail -1; }
step_of() { sed -n 's/^\(worker\/0: \)\{0,1\}global step //p' "$1" | tail -1; }

# Small and quick, also under the sanitizers.
W=(--model mlp --hidden 32 --batch 50 --log-every 50)

# ---- 1. end to end: train with 2 ps + 2 workers, checkpoint, restore elsewhere
ck="$dir/ck1"; mkdir -p "$ck"
"$PS_LAUNCH" --ps 2 --workers 2 --ps-arg "--checkpoint-dir=$ck" -- \
  "$PS_WORKER" "${W[@]}" --steps 300 --save-every-steps 100 --checkpoint-dir "$ck" \
  > "$dir/e2e.out" 2> "$dir/e2e.err"
rc=$?
acc1=$(accuracy "$dir/e2e.out")
check "e2e: job exits 0" test "$rc" = 0
# Asynchronous: worker/1 may join when the chief has taken most steps
# (under the sanitizers its start-up is slow), so only the chief is sure
# to log progress; that both train is the synchronous part's check.
check "e2e: the chief trained (progress lines)" \
  grep -q 'worker/0: .*step [0-9]* loss [0-9.]* examples/s' "$dir/e2e.err"
check "e2e: non-chief waited for the chief, then joined" \
  bash -c "grep -q 'worker/1: .*cluster ready (joined)' '$dir/e2e.err'"
check "e2e: chief initialized" has "$dir/e2e.err" "worker/0: .*cluster ready (initialized) at global step 0"
check "e2e: test accuracy $acc1 >= 0.70" awk -v a="${acc1:-0}" 'BEGIN { exit !(a >= 0.70) }'
last=$("$PSCTL" latest "$ck" 2>&1)
check "e2e: periodic + final checkpoints, latest is $last" \
  bash -c "ls '$ck' | grep -q 'model.ckpt-1[0-9][0-9].index' && test -f '$last.index' && test -f '$last.meta'"
"$PS_LAUNCH" --ps 2 --workers 1 --ps-arg "--checkpoint-dir=$ck" -- \
  "$PS_WORKER" "${W[@]}" --steps 0 --checkpoint-dir "$ck" > "$dir/e2e2.out" 2> "$dir/e2e2.err"
rc=$?
acc2=$(accuracy "$dir/e2e2.out")
check "e2e: a new cluster restores (exit $rc)" has "$dir/e2e2.err" "cluster ready (restored)"
check "e2e: same accuracy after restore ($acc1 vs $acc2)" test -n "$acc1" -a "$acc1" = "$acc2"
check "e2e: same global step after restore" test "$(step_of "$dir/e2e.out")" = "$(step_of "$dir/e2e2.out")"
# a fresh worker with no model code: the graph from the checkpoint's .meta
"$PS_LAUNCH" --ps 2 --workers 1 --ps-arg "--checkpoint-dir=$ck" -- \
  "$PS_WORKER" --model mlp --import-meta "$last.meta" --steps 0 > "$dir/e2e3.out" 2> "$dir/e2e3.err"
rc=$?
check "e2e: --import-meta builds the graph from $last.meta (exit $rc)" has "$dir/e2e3.err" "graph imported from $last.meta"
check "e2e: ... restores and gives the same accuracy ($(accuracy "$dir/e2e3.out"))" test "$(accuracy "$dir/e2e3.out")" = "$acc1"
echo garbage > "$dir/bad.meta"
expect_rc() { "$@" > "$dir/x.out" 2>&1; echo $?; }
rc=$(expect_rc "$PS_WORKER" --local --import-meta "$dir/bad.meta")
check "e2e: a corrupt .meta is an error naming it (exit $rc)" bash -c "test $rc = 1 && grep -q 'MetaGraph $dir/bad.meta' '$dir/x.out'"
# no Fashion-MNIST files: a clear warning, synthetic data, training works
"$PS_WORKER" --local --data-dir "$dir/nowhere" --steps 50 "${W[@]}" > "$dir/syn.out" 2> "$dir/syn.err"
rc=$?
check "synthetic data when Fashion-MNIST is missing (exit $rc)" \
  bash -c "test $rc = 0 && grep -q 'apt-get install dataset-fashion-mnist' '$dir/syn.err' && grep -q 'test accuracy' '$dir/syn.out'"

# ---- synchronous training: both workers move step by step together
"$PS_LAUNCH" --ps 2 --workers 2 -- "$PS_WORKER" "${W[@]}" --sync --steps 100 --log-every 25 \
  > "$dir/sync.out" 2> "$dir/sync.err"
rc=$?
check "sync: job exits 0 (exit $rc)" test "$rc" = 0
check "sync: exactly 100 global steps (one per aggregated step)" test "$(step_of "$dir/sync.out")" = 100
w0=$(grep -o 'worker/0: .* step [0-9]* loss' "$dir/sync.err" | grep -o 'step [0-9]*' | tr '\n' ' ')
w1=$(grep -o 'worker/1: .* step [0-9]* loss' "$dir/sync.err" | grep -o 'step [0-9]*' | tr '\n' ' ')
check "sync: both workers log the same steps ($w0)" test -n "$w0" -a "$w0" = "$w1"

# ---- a ps cluster that stays up (ps-launch without a worker command)
ck="$dir/ck2"; mkdir -p "$ck"
echo '{"ps": ["127.0.0.1:0", "127.0.0.1:0"], "worker": ["127.0.0.1:0", "127.0.0.1:0"]}' > "$dir/boot.json"
"$PS_LAUNCH" --cluster "$dir/boot.json" --write-cluster "$dir/spec.json" \
  --ps-arg "--checkpoint-dir=$ck" > "$dir/launch.out" 2> "$dir/launch.err" &
lpid=$!; pids+=("$lpid")
wait_for "$dir/launch.err" "cluster ready" 60 || bad "ps cluster did not start" "$(cat "$dir/launch.err")"
spec="$dir/spec.json"

# ---- 2. a restarted chief on a live cluster does not re-initialize
"$PS_WORKER" "${W[@]}" --cluster "$spec" --job worker --task 0 --steps 100 --no-final-save --keep-ps \
  > "$dir/c1.out" 2> "$dir/c1.err"
check "chief: first start initializes" has "$dir/c1.err" "cluster ready (initialized) at global step 0"
# (with no polling before sleeping: --poll-spin-us 0 changes nothing but CPU)
"$PS_WORKER" "${W[@]}" --cluster "$spec" --job worker --task 0 --steps 150 --no-final-save --keep-ps \
  --poll-spin-us 0 > "$dir/c2.out" 2> "$dir/c2.err"
check "chief: second start finds the live cluster and continues at step 100" \
  has "$dir/c2.err" "cluster ready (live) at global step 10[01]"
check "chief: second start trains on to 150" test "$(step_of "$dir/c2.out")" -ge 150
acc_live=$(accuracy "$dir/c2.out")

# ---- 3. psctl save and restore while a job trains; a non-chief killed mid-training
# The chief is stopped (SIGSTOP) from its "cluster ready" until worker/1 has
# been killed: asynchronous, it could otherwise reach --steps during the
# save and restore. worker/1 trains alone meanwhile, on and on (--steps
# 100000000), so it is killed while it trains and never reports done.
"$PS_WORKER" "${W[@]}" --cluster "$spec" --job worker --task 0 --steps 2400 --no-final-save \
  --keep-ps --log-every 10 > "$dir/t0.out" 2> "$dir/t0.err" &
t0=$!; pids+=("$t0")
wait_for "$dir/t0.err" "cluster ready (live)" 120 || bad "the chief found the live cluster" "$(cat "$dir/t0.err")"
kill -STOP "$t0"
"$PS_WORKER" "${W[@]}" --cluster "$spec" --job worker --task 1 --steps 100000000 --log-every 10 \
  > "$dir/t1.out" 2> "$dir/t1.err" &
t1=$!; pids+=("$t1")
wait_for "$dir/t1.err" "worker/1: .*step [0-9]* loss" 120 || bad "worker/1 never trained" "$(cat "$dir/t1.err")"
"$PSCTL" --cluster "$spec" save model.ckpt-psctl > "$dir/save.out" 2>&1
rc=$?
check "psctl save while training (exit $rc)" bash -c "test $rc = 0 && test -f '$ck/model.ckpt-psctl.index' && grep -q model.ckpt-psctl '$ck/checkpoint'" 
out=$("$PSCTL" --cluster "$spec" restore 2>&1)
rc=$?
check "psctl restore while training (exit $rc)" test "$rc" = 0
check "async: worker/1 still trains when it is killed" kill -0 "$t1"
kill -KILL "$t1"; wait "$t1" 2>/dev/null
n_before=$(grep -c "worker/0: .*step [0-9]* loss" "$dir/t0.err")
kill -CONT "$t0"
wait "$t0"; rc=$?
n_after=$(grep -c "worker/0: .*step [0-9]* loss" "$dir/t0.err")
check "async: chief goes on after worker/1 is killed and finishes (exit $rc)" test "$rc" = 0
check "async: chief trained after the kill ($n_before -> $n_after progress lines)" test "$n_after" -gt "$n_before"
check "async: chief reports its accuracy" test -n "$(accuracy "$dir/t0.out")"
check "async: chief did not wait long for the dead worker" has "$dir/t0.err" "going on without them"

# ---- 4. placement that differs from the chief's is refused
"$PS_WORKER" "${W[@]}" --cluster "$spec" --job worker --task 1 --steps 0 --placement greedy \
  > "$dir/p.out" 2> "$dir/p.err"
rc=$?
check "placement: refused (exit $rc)" test "$rc" = 1
check "placement: names the first variable that differs" \
  has "$dir/p.err" "placement differs from the chief's: variable logits/kernel is on /job:ps/task:1 in the chief's placement but on /job:ps/task:0 in this worker's"
"$PS_WORKER" --model mlp --hidden 16 --cluster "$spec" --job worker --task 1 --steps 0 \
  > "$dir/p2.out" 2> "$dir/p2.err"
check "graph: another shape is refused naming both" \
  has "$dir/p2.err" "variable hidden/kernel is float \[784,32\] on the ps but float \[784,16\] here"
kill -INT "$lpid"; wait "$lpid" 2>/dev/null

# ---- 5. a worker started before any ps waits, then joins.  The ps's
# ports must be in the spec before they start, so they are picked free
# and may be taken before a ps binds its own: then the whole start is
# done again on fresh ports, saying so
for attempt in 1 2 3; do
  read -r p0 p1 < <(pick_ports 2)
  echo "{\"ps\": [\"127.0.0.1:$p0\", \"127.0.0.1:$p1\"], \"worker\": [\"127.0.0.1:0\"]}" > "$dir/early.json"
  "$PS_WORKER" "${W[@]}" --cluster "$dir/early.json" --job worker --task 0 --steps 30 --no-final-save \
    > "$dir/early.out" 2> "$dir/early.err" &
  ew=$!; pids+=("$ew")
  wait_for "$dir/early.err" "waiting for 2 ps task(s): ps/0 (127.0.0.1:$p0), ps/1 (127.0.0.1:$p1)" 60
  waited=$?
  eps=() taken=""
  for t in 0 1; do
    start_ps_on "$dir/early.json" $t "$dir/early-ps.err"
    case $? in
      0) pids+=("$PID"); eps+=("$PID") ;;
      2) taken="ps/$t's port $([ $t = 0 ] && echo "$p0" || echo "$p1")"; break ;;
      *) bad "early worker: ps/$t starts" "$(tail -5 "$dir/early-ps.err")"; break ;;
    esac
  done
  [ -z "$taken" ] && break
  kill -KILL "$ew" "${eps[@]}" 2> /dev/null; wait "$ew" "${eps[@]}" 2> /dev/null
  [ "$attempt" = 3 ] && { bad "early worker: the ps's ports were taken 3 times in a row" "$taken"; break; }
  echo "early worker: $taken was taken before the ps bound it (address in use): starting again on fresh ports (attempt $((attempt + 1)) of 3)"
done
check "early worker: logs which ps it waits for" test "$waited" = 0
wait "$ew"; rc=$?
check "early worker: joins once the ps are up and finishes (exit $rc)" test "$rc" = 0
check "early worker: reports accuracy" test -n "$(accuracy "$dir/early.out")"
# the job is done: the chief shut the ps down, and they exit 0 by themselves
check "job done: the chief shuts the ps down" has "$dir/early.err" "job done: 2 of 2 ps task(s) shutting down"
wait "${eps[0]}"; r0=$?; wait "${eps[1]}"; r1=$?
check "job done: both ps exit 0 on their own (exit $r0 $r1)" test "$r0$r1" = 00
check "job done: the ps logged why" has "$dir/early-ps.err" "Shutdown asked by a client: the chief's job is done"

# ---- 5b. a sparse spec counts only the tasks it lists: a chief and
# worker/3 train synchronously (replicas = 2, not 5) and end
# (the ps first, on a port of its own: the spec gets its address)
start_ps_cluster 1 "$dir/sparse-ps.err" || bad "sparse spec: the ps starts" "$(tail -5 "$dir/sparse-ps.err")"
spp=${PS_PIDS[0]}; pids+=("$spp")
echo "{\"ps\": [$PS_LIST], \"chief\": [\"127.0.0.1:0\"], \"worker\": {\"3\": \"127.0.0.1:0\"}}" > "$dir/sparse.json"
for role in "chief 0" "worker 3"; do
  set -- $role
  timeout 300 "$PS_WORKER" --model linreg --cluster "$dir/sparse.json" --job "$1" --task "$2" --sync \
    --steps 40 --log-every 10 > "$dir/sparse-$1.out" 2> "$dir/sparse-$1.err" &
  pids+=($!); eval "sp_$1=$!"
done
wait "$sp_chief"; rc_c=$?; wait "$sp_worker"; rc_w=$?
check "sparse spec: chief and worker/3 finish (exit $rc_c $rc_w)" test "$rc_c$rc_w" = 00
check "sparse spec: 2 workers counted" has "$dir/sparse-chief.err" "2 worker(s)"
wait "$spp"; check "sparse spec: the ps was shut down by the chief (exit $?)" test $? = 0

# ---- 5d. an evaluator outside the cluster spec (TensorFlow's layout)
# evaluates each new checkpoint and never trains
ck="$dir/ck-eval"; mkdir -p "$ck"
start_ps_cluster 1 "$dir/eval-ps.err" --checkpoint-dir "$ck" \
  || bad "evaluator: the ps starts" "$(tail -5 "$dir/eval-ps.err")"
evps=${PS_PIDS[0]}; pids+=("$evps")
echo "{\"ps\": [$PS_LIST], \"worker\": [\"127.0.0.1:0\"]}" > "$dir/eval.json"
"$PS_WORKER" --cluster "$dir/eval.json" --job evaluator --task 0 --model linreg --steps 600 \
  --checkpoint-dir "$ck" > "$dir/evaluator.out" 2> "$dir/evaluator.err" &
pids+=($!); ev=$!
"$PS_WORKER" --cluster "$dir/eval.json" --job worker --task 0 --model linreg --steps 600 \
  --save-every-steps 150 --log-every 100 --checkpoint-dir "$ck" > "$dir/eval-chief.out" 2> "$dir/eval-chief.err"
check "evaluator: the chief trains and ends (exit $?)" test $? = 0
wait "$ev"; rc=$?
check "evaluator: ends once a checkpoint reaches --steps (exit $rc)" test "$rc" = 0
n=$(grep -c "^evaluated .* global step [0-9]* test mse" "$dir/evaluator.out")
check "evaluator: evaluated the checkpoints as they came ($n)" test "$n" -ge 1
check "evaluator: the last one is the final checkpoint" grep -q "global step 600 test mse" "$dir/evaluator.out"
check "evaluator: never trained" bash -c "! grep -q 'step [0-9]* loss' '$dir/evaluator.err'"
wait "$evps"
expect "evaluator: needs --checkpoint-dir" 2 "an evaluator needs --checkpoint-dir" \
  "$PS_WORKER" --cluster "$dir/eval.json" --job evaluator --task 0 --model linreg

# ---- 5d'. a worker that starts after the job ended (its ps shut down,
# the checkpoint at --steps) stops waiting for them and ends 0 within a
# round of 10 s, saying why, instead of waiting for ever
echo "{\"ps\": [$PS_LIST], \"worker\": [\"127.0.0.1:0\", \"127.0.0.1:0\"]}" > "$dir/late.json"
t0=$SECONDS
timeout 60 "$PS_WORKER" --cluster "$dir/late.json" --job worker --task 1 --model linreg --steps 600 \
  --checkpoint-dir "$ck" > "$dir/late.out" 2> "$dir/late.err"
rc=$?
check "late worker: ends 0 after the job ended (exit $rc, $((SECONDS - t0)) s)" test "$rc" = 0 -a $((SECONDS - t0)) -lt 40
check "late worker: says the job is done" has "$dir/late.err" "holds global step 600 of --steps 600: the job is done"

# ---- 5e. a straggler: worker/1 starts after the chief has finished its
# steps; the chief waits for it to join before shutting the ps down, so it
# does not wait for ever for ps that are gone, and the job ends
start_ps_cluster 1 "$dir/strag-ps.err" || bad "straggler: the ps starts" "$(tail -5 "$dir/strag-ps.err")"
sgps=${PS_PIDS[0]}; pids+=("$sgps")
echo "{\"ps\": [$PS_LIST], \"worker\": [\"127.0.0.1:0\", \"127.0.0.1:0\"]}" > "$dir/strag.json"
"$PS_WORKER" --cluster "$dir/strag.json" --job worker --task 0 --model linreg --steps 200 \
  > "$dir/strag0.out" 2> "$dir/strag0.err" &
pids+=($!); sg0=$!
wait_for "$dir/strag0.err" "have not joined yet" 120
check "straggler: the chief waits for the worker that has not joined" has "$dir/strag0.err" "waiting up to 60 s for 1 worker(s) that have not joined yet"
timeout 120 "$PS_WORKER" --cluster "$dir/strag.json" --job worker --task 1 --model linreg --steps 200 \
  > "$dir/strag1.out" 2> "$dir/strag1.err"
check "straggler: it joins, finds the job done and ends (exit $?)" test $? = 0
wait "$sg0"; r0=$?; wait "$sgps"; rp=$?
check "straggler: the chief and the ps end (exit $r0 $rp)" test "$r0$rp" = 00

# ---- 5c. the whole job gets SIGTERM at once (scancel, a Kubernetes
# eviction): the ps (--drain-secs) serve on until the chief has written its
# final checkpoint, which holds the last step it reached; then every task
# exits by itself: the ps 0, the workers 143 (stopped before --steps)
ck="$dir/ck-term"; mkdir -p "$ck"
start_ps_cluster 2 "$dir/term-ps.err" --checkpoint-dir "$ck" --drain-secs 60 \
  || bad "SIGTERM to the whole job: the ps start" "$(tail -5 "$dir/term-ps.err")"
tps=("${PS_PIDS[@]}"); tws=(); pids+=("${PS_PIDS[@]}")
echo "{\"ps\": [$PS_LIST], \"worker\": [\"127.0.0.1:0\", \"127.0.0.1:0\"]}" > "$dir/term.json"
for t in 0 1; do
  "$PS_WORKER" "${W[@]}" --cluster "$dir/term.json" --job worker --task $t --steps 100000000 \
    --log-every 20 --checkpoint-dir "$ck" > "$dir/term-w$t.out" 2> "$dir/term-w$t.err" &
  tws+=($!); pids+=($!)
done
if wait_for "$dir/term-w0.err" "worker/0: .*step [0-9]* loss" 120 || wait_for "$dir/term-w0.err" "step [0-9]* loss" 5; then
  kill -TERM "${tps[@]}" "${tws[@]}"
  rcs=""
  for p in "${tws[@]}" "${tps[@]}"; do wait "$p"; rcs="$rcs$?"; done
  check "SIGTERM to the whole job: the workers exit 143, the ps 0 ($rcs)" test "$rcs" = 14314300
  # the chief's last global step (read after the other worker stopped too)
  last=$(step_of "$dir/term-w0.out")
  saved=$(sed -n 's/^checkpoint .*model.ckpt-\([0-9]*\)$/\1/p' "$dir/term-w0.out" | tail -1)
  check "SIGTERM to the whole job: the final checkpoint holds the last step ($last, saved $saved)" \
    test -n "$last" -a "$last" = "$saved" -a -f "$ck/model.ckpt-$saved.index"
  check "SIGTERM to the whole job: the ps served on for it" has "$dir/term-ps.err" "serving on for a final checkpoint"
  check "SIGTERM to the whole job: the ps stopped once idle" has "$dir/term-ps.err" "no calls for 3 s after SIGTERM"
else
  bad "SIGTERM to the whole job: training never started" "$(tail -5 "$dir/term-w0.err")"
fi

# ---- 6. a ps killed with -9 during training: ps-launch --restart brings it
# back on its address, the chief restores its variables from the latest
# checkpoint, both workers go on, the job ends well
ck="$dir/ck3"; mkdir -p "$ck"
"$PS_LAUNCH" --ps 2 --workers 2 --restart --ps-arg "--checkpoint-dir=$ck" -- \
  "$PS_WORKER" "${W[@]}" --steps 1500 --save-every-steps 100 --checkpoint-dir "$ck" \
  > "$dir/rs.out" 2> "$dir/rs.err" &
rs=$!; pids+=("$rs")
wait_for "$dir/rs.err" "worker/0: .*saved checkpoint" 120 || bad "restart: no checkpoint saved" "$(cat "$dir/rs.err")"
pkill -KILL -f -- "--task 1 --checkpoint-dir=$ck"
wait "$rs"; rc=$?
check "restart: the job survives ps/1 killed with -9 (exit $rc)" test "$rc" = 0
check "restart: ps-launch restarted ps/1" has "$dir/rs.err" "ps/1 restarted (restart 1)"
check "restart: the chief restored the lost variables" has "$dir/rs.err" "worker/0: .*recovered (restored)"
check "restart: the job still reaches its accuracy" test -n "$(accuracy "$dir/rs.out")"

# ---- 7. argument errors
expect "ps-worker --model nope" 2 "unknown --model 'nope'" "$PS_WORKER" --model nope
expect "ps-worker --steps -3" 2 "--steps must be an integer >= 0" "$PS_WORKER" --steps -3
expect "ps-worker --poll-spin-us 20000" 2 \
  "ps-worker: --poll-spin-us must be an integer from 0 to 10000 (microseconds), got '20000'" \
  "$PS_WORKER" --poll-spin-us 20000
expect "ps-worker --placement nope" 2 "unknown --placement 'nope'" "$PS_WORKER" --placement nope
expect "ps-worker missing spec" 2 "$dir/none.json" "$PS_WORKER" --cluster "$dir/none.json"
echo '{"worker": ["127.0.0.1:0"]}' > "$dir/nops.json"
expect "ps-worker spec without ps" 2 "has no ps job" "$PS_WORKER" --cluster "$dir/nops.json"
expect "ps-worker --help" 0 "usage: ps-worker" "$PS_WORKER" --help
# no ps ever answers (its port held bound, never listening, so that
# nothing else takes it): --ps-timeout gives up with the task and address
hold_port || bad "a port held closed" "python3 could not bind one"
port=$HELD_PORT
echo "{\"ps\": [\"127.0.0.1:$port\"], \"worker\": [\"127.0.0.1:0\"]}" > "$dir/dead.json"
expect "ps-worker --ps-timeout" 1 "ps/0 (127.0.0.1:$port) and 0 other ps task(s) did not answer within 1 s" \
  "$PS_WORKER" --cluster "$dir/dead.json" --ps-timeout 1 --steps 1

# identities of the wrong job are refused, each naming the program to run
echo "{\"ps\": [\"127.0.0.1:$port\"], \"worker\": [\"127.0.0.1:0\"], \"evaluator\": [\"127.0.0.1:0\"]}" > "$dir/roles.json"
echo "{\"ps\": [\"127.0.0.1:$port\"], \"reviewer\": [\"127.0.0.1:0\"]}" > "$dir/roles2.json"
expect "ps-worker with a ps identity" 2 "this task is ps/0 in the cluster spec, but ps-worker runs chief, worker and evaluator tasks (a ps task runs ps-server)" \
  "$PS_WORKER" --cluster "$dir/roles.json" --job ps --task 0
expect "ps-worker with an unknown job" 2 "ps-worker runs chief, worker and evaluator tasks" \
  "$PS_WORKER" --cluster "$dir/roles2.json" --job reviewer --task 0
expect "ps-server with a worker identity" 2 "this task is worker/0 in the cluster spec, but ps-server runs ps tasks" \
  "$PS_SERVER" --cluster "$dir/roles.json" --job worker --task 0
# SIGTERM while waiting for a ps that never comes: a prompt, clean stop
"$PS_WORKER" --cluster "$dir/dead.json" --steps 1 > "$dir/term.out" 2> "$dir/term.err" &
wpid=$!
if wait_for "$dir/term.err" "waiting for 1 ps task" 60; then
  t0=$(date +%s%N)
  kill -TERM "$wpid"; wait "$wpid"; wrc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ "$wrc" = 143 ] && grep -q "stopped by a signal before training: stopped while waiting for ps/0 (127.0.0.1:$port)" "$dir/term.err" \
    && ok "SIGTERM while waiting for the ps ($ms ms)" || bad "SIGTERM while waiting for the ps" "rc=$wrc $(tail -3 "$dir/term.err")"
else
  kill -KILL "$wpid"; wait "$wpid"
  bad "SIGTERM while waiting for the ps" "never logged its wait: $(tail -3 "$dir/term.err")"
fi

finish
