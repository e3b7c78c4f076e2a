#!/usr/bin/env bash
# The click-through model on embedding tables (ps-worker --model ctr),
# through ps-launch with 2 ps + 2 workers on 127.0.0.1: on the generated
# click log it comes within 2% of the best achievable AUC (the log's own
# probabilities) and its checkpoint, tables included, restores into 3 ps;
# it trains on a log in Criteo's TSV layout; the memory
# policies' flags work, as psctl tables shows; the README's C example
# (table-demo) runs; a malformed log and misplaced flags say what
# is wrong.  Prints "N passed, N failed".
set -uo pipefail
PS_WORKER=${PS_WORKER:?}; PS_LAUNCH=${PS_LAUNCH:?}; PSCTL=${PSCTL:?}
TABLE_DEMO=${TABLE_DEMO:?}
source "$(dirname "$0")/../support/lib.sh"
test_init ctr
BAD_TAIL=40
val() { sed -n "s/^\(worker\/0: \)\{0,1\}$2 //p" "$1" | tail -1; }

# ---- 1. the generated log, the full default run, checkpointed
ck="$dir/ck"; mkdir -p "$ck"
"$PS_LAUNCH" --ps 2 --workers 2 --ps-arg "--checkpoint-dir=$ck" -- \
  "$PS_WORKER" --model ctr --log-every 1000 --checkpoint-dir "$ck" \
  > "$dir/gen.out" 2> "$dir/gen.err"
rc=$?
auc=$(val "$dir/gen.out" "test auc"); best=$(val "$dir/gen.out" "best auc")
ll=$(val "$dir/gen.out" "test logloss"); bll=$(val "$dir/gen.out" "best logloss")
show="$dir/gen.err"
check "generated log: the job exits 0 (exit $rc)" test "$rc" = 0
check "generated log: AUC $auc within 2% of the best achievable $best" \
  awk -v a="${auc:-0}" -v b="${best:-1}" 'BEGIN { exit !(b > 0.8 && a >= 0.98 * b) }'
check "generated log: log loss $ll near the best $bll" \
  awk -v a="${ll:-9}" -v b="${bll:-0}" 'BEGIN { exit !(b > 0 && a <= 1.1 * b) }'
check "generated log: both workers trained" \
  grep -q 'worker/1: .*trained [0-9]* local steps' "$dir/gen.err"
# a new cluster of 3 ps restores the chief's checkpoint, tables included:
# the same AUC without a step of training
"$PS_LAUNCH" --ps 3 --workers 1 --ps-arg "--checkpoint-dir=$ck" -- \
  "$PS_WORKER" --model ctr --steps 0 --checkpoint-dir "$ck" > "$dir/re.out" 2> "$dir/re.err"
rc=$?
show="$dir/re.err"
check "restore: a new cluster of 3 ps restores (exit $rc)" has "$dir/re.err" "cluster ready (restored)"
check "restore: the tables came back: AUC $(val "$dir/re.out" "test auc") = $auc" \
  test -n "$auc" -a "$(val "$dir/re.out" "test auc")" = "$auc"
show=""

# ---- 2. Criteo's TSV layout: label, 13 integers, 26 hex categories
/usr/bin/python3 - "$dir/criteo.tsv" <<'PY'
import random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(3000):
        cats = ["" if r.random() < 0.05 else "%08x" % r.randrange(50 * (k + 1)) for k in range(26)]
        ints = ["" if r.random() < 0.1 else str(r.randrange(-2, 1000)) for _ in range(13)]
        y = 1 if (int(cats[0] or "0", 16) % 3 == 0) != (r.random() < 0.2) else 0
        f.write("\t".join([str(y)] + ints + cats) + "\n")
PY
"$PS_LAUNCH" --ps 2 --workers 2 -- "$PS_WORKER" --model ctr --data "$dir/criteo.tsv" \
  --steps 300 --batch 100 --log-every 100 > "$dir/tsv.out" 2> "$dir/tsv.err"
rc=$?
auc=$(val "$dir/tsv.out" "test auc")
show="$dir/tsv.err"
check "Criteo TSV: the job exits 0 (exit $rc)" test "$rc" = 0
check "Criteo TSV: read 2400 training and 600 test examples" \
  grep -q 'click log: 2400 training and 600 test examples from' "$dir/tsv.err"
check "Criteo TSV: AUC $auc above chance (the label follows C1)" \
  awk -v a="${auc:-0}" 'BEGIN { exit !(a >= 0.65) }'
check "Criteo TSV: no best achievable for a real log" \
  bash -c "! grep -q 'best auc' '$dir/tsv.out'"
show=""

# ---- 3. the memory policies' flags, seen by psctl tables on the ps the
# job leaves running (--keep-ps)
echo '{"ps": ["127.0.0.1:0", "127.0.0.1:0"], "worker": ["127.0.0.1:0"]}' > "$dir/boot.json"
"$PS_LAUNCH" --cluster "$dir/boot.json" --write-cluster "$dir/pol.json" \
  > "$dir/launch.out" 2> "$dir/launch.err" &
lpid=$!
if wait_for "$dir/launch.err" "cluster ready" 60; then
  "$PS_WORKER" --cluster "$dir/pol.json" --job worker --task 0 --model ctr --examples 20000 \
    --steps 300 --table-max-rows 100 --table-min-count 2 --table-ttl-steps 50 \
    --log-every 100 --keep-ps > "$dir/pol.out" 2> "$dir/pol.err"
  rc=$?
  show="$dir/pol.err"
  check "policies: the job exits 0 (exit $rc)" test "$rc" = 0
  "$PSCTL" --cluster "$dir/pol.json" tables > "$dir/tables.out" 2>&1
  show="$dir/tables.out"
  check "policies: psctl tables lists both tables on both ps" \
    test "$(grep -cE '^ctr/(embeddings|wide) +ps/[01] ' "$dir/tables.out")" = 4
  check "policies: at most 100 rows per table and ps" \
    awk '/^ctr\// { if ($5 > 100) bad = 1 } END { exit bad }' "$dir/tables.out"
  check "policies: rows evicted, keys refused, the policy shown" \
    awk '/^ctr\/embeddings/ && $7 > 0 && $9 > 0 && /min_count=2 ttl_steps=50/ { ok = 1 }
         END { exit !ok }' "$dir/tables.out"
  # the README's worked example, on the same cluster
  out=$("$TABLE_DEMO" "$dir/pol.json" 2>&1); rc=$?
  check "table-demo: exits 0 (exit $rc)" test "$rc" = 0
  check "table-demo: a repeated key reads one row" grep -q "5 rows made, key 7 twice: the same row" <<< "$out"
  check "table-demo: the step moved the row" \
    awk '/^key -1, element 0:/ { ok = $5 != $9 } END { exit !ok }' <<< "$out"
  check "table-demo: each ps holds its keys' rows" \
    bash -c "grep -q 'ps/0: table user_emb dim 8 (adagrad): 2 rows' <<< \"\$0\" &&
             grep -q 'ps/1: table user_emb dim 8 (adagrad): 3 rows' <<< \"\$0\"" "$out"
else
  bad "policies: the ps cluster started" "$(cat "$dir/launch.err")"
fi
kill -TERM "$lpid" 2>/dev/null; wait "$lpid" 2>/dev/null
show=""

# ---- 4. what is wrong, said plainly
printf '1\t2\t3\n' > "$dir/bad.tsv"
expect "a malformed log: file, line and layout" 1 \
  "$dir/bad.tsv:1: 3 tab-separated fields, Criteo's layout has 40" \
  "$PS_WORKER" --local --model ctr --data "$dir/bad.tsv"
expect "a missing log" 1 "$dir/none.tsv: No such file or directory" \
  "$PS_WORKER" --local --model ctr --data "$dir/none.tsv"
expect "--data belongs to ctr" 2 "--data and --table-* apply to --model ctr" \
  "$PS_WORKER" --local --model mlp --data "$dir/bad.tsv"
expect "tables need a ps" 1 "embedding tables live on ps tasks" \
  "$PS_WORKER" --local --model ctr --examples 100 --steps 1
finish
