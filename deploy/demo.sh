#!/usr/bin/env bash
# The main job: a local cluster (2 ps + 2 workers, started by ps-launch)
# trains the Fashion-MNIST MLP asynchronously, the chief saves a sharded
# checkpoint (and its MetaGraph) and reports the test accuracy; the cluster
# stops; a new cluster restores the checkpoint and reports the accuracy
# again.  Fails unless the accuracy is >= 0.85 and the same both times.
#
#   deploy/demo.sh [--secure | --replicated] [BUILD_DIR] [STEPS]
#
# --secure: the same job with TLS, client certificates and tokens
# (common/SECURITY.md): deploy/gen-certs.sh makes them, ps-launch --secure hands
# them out (the chief an admin token, the other worker a worker token), and
# every ps runs with --require-auth.
#
# --replicated: the same job with replicated ps shards (ps-launch
# --replicas 2 starts a local etcd and names it in the spec): ps/1 is
# killed with -9 mid-training, the job trains on, ps-launch restarts ps/1
# and it rejoins as a backup (deploy/demo-replicated.sh prints the
# failover time, the acknowledged updates lost, and psctl verify).
set -euo pipefail
secure=0
replicated=0
if [ "${1:-}" = --secure ]; then
  secure=1
  shift
elif [ "${1:-}" = --replicated ]; then
  replicated=1
  shift
fi
build=${1:-build}
steps=${2:-5000}
dir=$(mktemp -d /tmp/ps-demo-XXXXXX)
trap 'rm -rf "$dir"' EXIT
launch=("$build/deploy/ps-launch" --ps 2 --ps-arg "--checkpoint-dir=$dir")
if [ "$secure" = 1 ]; then
  bash "$(dirname "$0")/gen-certs.sh" --tokens "$dir/certs"
  launch+=(--secure "$dir/certs" --ps-arg --require-auth)
  echo "== secure: TLS with client certificates and tokens (certificates in $dir/certs)"
fi
worker=("$build/worker/ps-worker" --model mlp --hidden 256 --checkpoint-dir "$dir")

if [ "$replicated" = 1 ]; then
  launch+=(--replicas 2)
  echo "== replicated: every shard on 2 ps tasks, the view in a local etcd started by ps-launch"
  echo "== 1. train: 2 ps + 2 workers, MLP 784-256-10 on Fashion-MNIST, $steps steps; ps/1 killed -9 mid-training"
  source "$(dirname "$0")/demo-replicated.sh"
  demo_replicated_train
else
  echo "== 1. train: 2 ps + 2 workers, MLP 784-256-10 on Fashion-MNIST, $steps steps (checkpoints in $dir)"
  "${launch[@]}" --workers 2 -- "${worker[@]}" --steps "$steps" --log-every 500 \
    --save-every-secs 10 | tee "$dir/train.out"
fi
acc1=$(sed -n 's/^worker\/0: test accuracy //p' "$dir/train.out")
echo "== checkpoint files:"
ls -l "$dir" | grep -v -e '\.out$' -e '^total' -e ' certs$'

echo "== 2. a new cluster (2 ps + 1 worker) restores the latest checkpoint and evaluates"
"${launch[@]}" --workers 1 -- "${worker[@]}" --steps 0 | tee "$dir/restore.out"
acc2=$(sed -n 's/^worker\/0: test accuracy //p' "$dir/restore.out")

echo "== test accuracy after training: ${acc1:-none}; after restoring into a new cluster: ${acc2:-none}"
if [ -z "$acc1" ] || [ "$acc1" != "$acc2" ]; then
  echo "demo: FAILED: the restored model does not give the trained model's accuracy" >&2
  exit 1
fi
if ! awk -v a="$acc1" 'BEGIN { exit !(a >= 0.85) }'; then
  echo "demo: FAILED: test accuracy $acc1 is below 0.85" >&2
  exit 1
fi
if [ "$replicated" = 1 ]; then
  echo "== main job, replicated, finished: ps/1 killed -9 at step $killed_step; failover $failover_s s;" \
    "acknowledged updates lost: $lost; accuracy $acc1 >= 0.85, identical after restore"
else
  echo "== main job finished: accuracy $acc1 >= 0.85, identical after restore"
fi
