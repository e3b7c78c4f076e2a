#!/usr/bin/env bash
# The correctness checker in the spirit of Jepsen (tests/README.md "chaos";
# DESIGN.md "Replication: what the checker checks").
#
#   chaos.sh [--rounds N] [--replicas R] [--clients N] [--seed S]
#            [--round-secs S] [--faults LIST] [--rate N] [--expect-lost]
#            [--shard S] [--big-mib N] [--bench]
#
# Starts a real etcd (3 members when the fault list has etcd), 3 ps-server
# --replicas R (the cluster spec's "replication" section), N chaos_client
# processes (--rate attempts a second each, default 150) that send assign_adds and row adds with distinct increments and
# log every attempt and acknowledgement; then, round after round, waits a
# random time (seeded: the seed is printed; --seed replays it), injects one
# fault and waits until every shard has R replicas in sync again.  The
# faults (--faults, comma-separated; default all that can run here):
#   kill-primary   kill -9 of a shard's primary, then started again (rejoins)
#   kill-backup    kill -9 of a shard's backup, then started again
#   freeze-kill    a shard's backup stopped (SIGSTOP), its primary killed
#                  with -9 0.3 s later, the backup continued: updates the
#                  primary acknowledged without the backup are lost, so a
#                  correct primary acknowledges none in that time
#   stop           SIGSTOP of a ps for 5 s, then SIGCONT (exit 75 if fenced:
#                  started again)
#   cut-front      a primary's link to etcd and the workers down for 3 s, its
#                  link to the other ps up (network namespaces)
#   cut-back       the reverse: its link to the other ps down, to etcd and
#                  the workers up (network namespaces)
#   etcd-member    one member of the 3-member etcd killed with -9, restarted
#   save           a cluster-wide save (psctl save) under the load; the
#                  checkpoint is rN under $dir/ckpt, each ps's --checkpoint-dir
#                  (needs PSCTL; a default fault when PSCTL is set)
# The partitions need network namespaces (root, iproute2): without them
# they are skipped with a message, and everything runs on 127.0.0.1
# (CHAOS_NO_NETNS=1 asks for that too).  --replicas 1 (plain ps-server,
# no etcd) takes only stop and the partitions: a kill loses the shard.
# At the end: every variable and row read back (chaos_client read), and
# tests/chaos/chaos_check.py: acknowledged <= final <= sent, each update
# applied once or not at all; replicas bit-identical (psctl verify); no ps
# crashed (exit codes only 137 from our kills, 75 from fencing; no
# sanitizer report).  --expect-lost turns the verdict round (the checker's
# own test, against ps-server-ackearly): the run passes only if the checker
# reports lost acknowledged updates.  Logs are kept (and named) on failure.
# --shard S: every fault hits shard S (else a random one); --big-mib N: a
# never-updated N MiB variable on shard 0 (the state a rejoin copies);
# --bench: after a kill of a primary, a line "chaos: failover shard S: N ms"
# from the kill -9 to the first acknowledgement of an update of that shard;
# after a kill of a backup, "chaos: pause shard S rejoin: N ms", the
# longest acknowledgement (send to ack) of an update of shard S sent from
# the restart of the killed ps until it is in sync again (its copy); after
# a save, "chaos: pause shard S save: N ms", the same while the save ran
# (tests/bench/failover.sh compares the two).
# Env: PS_SERVER, CHAOS_CLIENT, PSCTL (the programs); KEEP_DIR=1 keeps logs.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; CHAOS_CLIENT=${CHAOS_CLIENT:?}; PSCTL=${PSCTL:-}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/lib.sh"

rounds=20 replicas=2 nclients=4 seed=$(((RANDOM << 15) | RANDOM)) round_secs=1.5
faults="" expect_lost=0 rate=150 fix_shard="" big_mib=0 bench=0
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --clients) nclients=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --round-secs) round_secs=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --expect-lost) expect_lost=1; shift ;;
    --rate) rate=$2; shift 2 ;;
    --shard) fix_shard=$2; shift 2 ;;
    --big-mib) big_mib=$2; shift 2 ;;
    --bench) bench=1; shift ;;
    *) echo "chaos.sh: unknown option $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[0-9]+$ && "$nclients" =~ ^[1-9][0-9]*$ && "$seed" =~ ^[0-9]+$ \
  && "$replicas" =~ ^[1-3]$ ]] || { echo "chaos.sh: bad --rounds/--clients/--seed/--replicas" >&2; exit 2; }
RANDOM=$seed
echo "chaos: seed $seed (replay: --seed $seed), $rounds rounds, R=$replicas, $nclients clients"
test_init chaos
mkdir -p "$dir/ckpt"
nps=3
failed=0
fail_run() { echo "chaos: FAIL: $*"; failed=1; }

# ---- hosts: network namespaces when usable, else everything on 127.0.0.1
ns=""
if [ "$(id -u)" = 0 ] && command -v ip > /dev/null && [ -z "${CHAOS_NO_NETNS:-}" ]; then
  ns=chs$$
  net=10.$((RANDOM % 100 + 120)).$((RANDOM % 200 + 20))
fi
netns_cleanup() {
  [ -n "$ns" ] || return 0
  local h p
  for h in e w p0 p1 p2; do
    for p in $(ip netns pids "$ns-$h" 2> /dev/null); do kill -KILL "$p" 2> /dev/null; done
    ip netns del "$ns-$h" 2> /dev/null
  done
  ip netns del "$ns-sw" 2> /dev/null
}
# every process this script started, by pid, whatever the outcome; logs
# kept when the run failed
test_cleanup_hook() {
  local p
  for p in "${PSPID[@]}" "${ETCDPID[@]}" "${CLPID[@]}"; do
    [ -n "$p" ] && kill -CONT "$p" 2> /dev/null && kill -KILL "$p" 2> /dev/null
  done
  netns_cleanup
}
PSPID=() ETCDPID=() CLPID=()
# Front net 10.A.B.0/26: every host (h: etcd 1, workers 2, ps/i 10+i);
# back net .64/26: the ps hosts alone; ps/i serves on 10.A.B.(128+i)/32 on
# its loopback, routed through the front from etcd's and the workers'
# hosts and through the back from the other ps: so a link down cuts a ps
# from one side only.
if [ -n "$ns" ]; then
  if ip netns add "$ns-sw" 2> /dev/null && ip -n "$ns-sw" link add br0 type bridge \
    && ip -n "$ns-sw" link add br1 type bridge && ip -n "$ns-sw" link set br0 up \
    && ip -n "$ns-sw" link set br1 up; then
    hostnum() { case $1 in e) echo 1 ;; w) echo 2 ;; p*) echo $((10 + ${1#p})) ;; esac; }
    for h in e w p0 p1 p2; do
      n=$(hostnum "$h")
      ip netns add "$ns-$h"
      ip -n "$ns-$h" link set lo up
      ip -n "$ns-sw" link add "f$h" type veth peer name eth0 netns "$ns-$h"
      ip -n "$ns-sw" link set "f$h" master br0 && ip -n "$ns-sw" link set "f$h" up
      ip -n "$ns-$h" addr add "$net.$n/26" dev eth0 && ip -n "$ns-$h" link set eth0 up
      if [[ $h == p* ]]; then
        i=${h#p}
        ip -n "$ns-sw" link add "b$h" type veth peer name eth1 netns "$ns-$h"
        ip -n "$ns-sw" link set "b$h" master br1 && ip -n "$ns-sw" link set "b$h" up
        ip -n "$ns-$h" addr add "$net.$((64 + n))/26" dev eth1 && ip -n "$ns-$h" link set eth1 up
        ip -n "$ns-$h" addr add "$net.$((128 + i))/32" dev lo
      fi
    done
    for h in e w p0 p1 p2; do
      for ((j = 0; j < nps; j++)); do
        [ "$h" = "p$j" ] && continue
        if [[ $h == p* ]]; then via=$net.$((64 + 10 + j)); else via=$net.$((10 + j)); fi
        ip -n "$ns-$h" route add "$net.$((128 + j))/32" via "$via"
      done
    done
    echo "chaos: hosts in network namespaces $ns-* (front $net.0/26, back $net.64/26)"
  else
    echo "chaos: network namespaces unusable here: partitions skipped, all on 127.0.0.1"
    netns_cleanup
    ns=""
  fi
else
  echo "chaos: no network namespaces (needs root and iproute2; or CHAOS_NO_NETNS is set): partitions skipped, all on 127.0.0.1"
fi
# on HOST CMD...: run CMD on HOST (e, w, p0..p2).  A process started in
# the background is started as "${ON[@]}" CMD & after `at HOST` (no
# function in between: $! is then the program's own pid, ip netns exec
# execs it)
at() { ON=(); [ -z "$ns" ] || ON=(ip netns exec "$ns-$1"); }
on() { local h=$1; shift; at "$h"; "${ON[@]}" "$@"; }
all_faults="kill-primary,kill-backup,freeze-kill,stop,etcd-member"
[ -n "$ns" ] && all_faults="$all_faults,cut-front,cut-back"
[ -n "$PSCTL" ] && all_faults="$all_faults,save"
[ "$replicas" = 1 ] && all_faults="stop"
[ -n "$faults" ] || faults=$all_faults
IFS=, read -r -a fault_list <<< "$faults"
for f in "${fault_list[@]}"; do
  case $f in
    none | stop | kill-primary | kill-backup | freeze-kill | etcd-member) ;;
    save) [ -n "$PSCTL" ] || { echo "chaos.sh: fault save needs PSCTL" >&2; exit 2; } ;;
    cut-front | cut-back) [ -n "$ns" ] || { echo "chaos: $f skipped: no network namespaces"; fault_list=("${fault_list[@]/$f/}"); } ;;
    *) echo "chaos.sh: unknown fault $f" >&2; exit 2 ;;
  esac
  [ "$replicas" = 1 ] && [[ $f == kill-backup || $f == freeze-kill || $f == etcd-member ]] \
    && { echo "chaos.sh: fault $f needs --replicas 2 or 3" >&2; exit 2; }
done
IFS=' ' read -r -a fault_list <<< "${fault_list[*]}"
[ ${#fault_list[@]} -gt 0 ] || fault_list=(none)
metcd=1
[[ " ${fault_list[*]} " == *" etcd-member "* ]] && metcd=3

# ---- etcd (R >= 2): members on the etcd host
ETCDARGS=() ETCDEP=""
start_etcd_member() { # I
  local i=$1
  at e
  "${ON[@]}" etcd "${ETCDARGS[@]}" --name "m$i" --data-dir "$dir/etcd$i" \
    --listen-client-urls "http://${EHOST}:${ECP[$i]}" --advertise-client-urls "http://${EHOST}:${ECP[$i]}" \
    --listen-peer-urls "http://${EHOST}:${EPP[$i]}" --initial-advertise-peer-urls "http://${EHOST}:${EPP[$i]}" \
    > /dev/null 2>> "$dir/etcd$i.log" &
  ETCDPID[$i]=$!
}
etcd_healthy() { # I
  on w curl -s -m 1 "http://${EHOST}:${ECP[$1]}/health" 2> /dev/null | grep -q '"health":"true"'
}
start_etcd() {
  local try i ok cluster
  EHOST=127.0.0.1
  [ -n "$ns" ] && EHOST=$net.1
  for ((try = 0; try < 5; try++)); do
    ECP=() EPP=() cluster=""
    if [ -n "$ns" ]; then
      for ((i = 0; i < metcd; i++)); do ECP[$i]=$((2379 + 10 * i)); EPP[$i]=$((2380 + 10 * i)); done
    else
      read -r -a ports <<< "$(pick_ports $((2 * metcd)))"
      for ((i = 0; i < metcd; i++)); do ECP[$i]=${ports[$((2 * i))]}; EPP[$i]=${ports[$((2 * i + 1))]}; done
    fi
    for ((i = 0; i < metcd; i++)); do cluster="$cluster${cluster:+,}m$i=http://${EHOST}:${EPP[$i]}"; done
    ETCDARGS=(--initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "chaos-$$-$try"
      --heartbeat-interval 10 --election-timeout 100 --logger zap --log-outputs stderr --log-level warn)
    for ((i = 0; i < metcd; i++)); do rm -rf "$dir/etcd$i"; start_etcd_member "$i"; done
    for ((t = 0; t < 200; t++)); do
      ok=1
      for ((i = 0; i < metcd; i++)); do etcd_healthy "$i" || ok=0; done
      [ $ok = 1 ] && break
      for ((i = 0; i < metcd; i++)); do kill -0 "${ETCDPID[$i]}" 2> /dev/null || ok=2; done
      [ $ok = 2 ] && break
      sleep 0.05
    done
    if [ $ok = 1 ]; then
      ETCDEP=""
      for ((i = 0; i < metcd; i++)); do ETCDEP="$ETCDEP${ETCDEP:+,}${EHOST}:${ECP[$i]}"; done
      echo "chaos: etcd of $metcd member(s) at $ETCDEP"
      return 0
    fi
    for ((i = 0; i < metcd; i++)); do kill -KILL "${ETCDPID[$i]}" 2> /dev/null; wait "${ETCDPID[$i]}" 2> /dev/null; done
    grep -q "address already in use" "$dir"/etcd*.log 2> /dev/null || break
    echo "chaos: an etcd port was taken, trying fresh ports"
  done
  echo "chaos: etcd never became healthy:"; tail -5 "$dir"/etcd*.log
  return 1
}

# ---- ps tasks
spec="$dir/cluster.json"
PSADDR=() PSHOST=()
write_spec() {
  local items="" i repl=""
  for ((i = 0; i < nps; i++)); do items="$items${items:+, }\"${PSADDR[$i]}\""; done
  [ "$replicas" -ge 2 ] && repl=", \"replication\": {\"replicas\": $replicas, \"etcd\": \"$ETCDEP\", \"job\": \"chaos$$\", \"lease_ttl\": 1}"
  echo "{\"ps\": [$items]$repl}" > "$spec"
}
KILLED=() # 1: we killed ps/i with -9 (its 137 is ours)
start_ps_task() { # I: 0 ready, 1 not
  local i=$1 fifo="$dir/ready$1.$RANDOM" line=""
  mkfifo "$fifo"
  at "p$i"
  "${ON[@]}" "$PS_SERVER" --cluster "$spec" --job ps --task "$i" --checkpoint-dir "$dir/ckpt" \
    > "$fifo" 2>> "$dir/ps$i.log" &
  PSPID[$i]=$!
  KILLED[$i]=0
  read -r -t 60 line < "$fifo"
  rm -f "$fifo"
  [[ "$line" == *" ready on "* ]] && return 0
  echo "chaos: ps/$i did not start:"; tail -5 "$dir/ps$i.log"
  return 1
}
# ps_exited I: the exit status of ps/I if it has ended (and reaps it), else
# nothing
ps_exited() {
  local p=${PSPID[$1]} st
  [ -n "$p" ] || return 1
  st=$(awk '{ print $3 }' "/proc/$p/stat" 2> /dev/null)
  [ -z "$st" ] || [ "$st" = Z ] || return 1
  wait "$p"; EXITED=$?
  PSPID[$1]=""
  return 0
}
# check_exit I CODE: an exit status we caused (137 after our kill -9), or 75
# (fenced: restarted); anything else is a crash
check_exit() {
  local i=$1 c=$2
  if [ "$c" = 137 ] && [ "${KILLED[$i]}" = 1 ]; then return 0; fi
  if [ "$c" = 75 ] && [ "$replicas" -ge 2 ]; then
    echo "chaos:   ps/$i exited 75 ($(grep -o 'fenced: .*' "$dir/ps$i.log" | tail -1)); started again"
    return 0
  fi
  fail_run "ps/$i exited with status $c (not our kill, not fenced): a crash; log $dir/ps$i.log"
  tail -20 "$dir/ps$i.log"
  return 1
}
# kill_ps I: kill -9 of ps/I, reaped at once (its 137 is ours)
kill_ps() {
  KILLED[$1]=1
  kill -KILL "${PSPID[$1]}"
  wait "${PSPID[$1]}" 2> /dev/null
  PSPID[$1]=""
}
# wait_gone I EPOCH: until a view after EPOCH lists ps/I in no shard (the
# others saw it go and failed over), 15 s at most; then it is started
# again (it rejoins)
wait_gone() {
  local t
  for ((t = 0; t < 150; t++)); do
    if view_json | python3 -c '
import json, sys
v = json.loads(sys.stdin.read())
sys.exit(0 if v["epoch"] > int(sys.argv[2]) and
         all(int(sys.argv[1]) not in s["replicas"] for s in v["shards"]) else 1)' "$1" "$2" 2> /dev/null; then
      T_RESTART=$(now_ms)
      start_ps_task "$1" || fail_run "ps/$1 could not start again"
      return 0
    fi
    sleep 0.1
  done
  fail_run "ps/$1 was killed, but 15 s later the view still lists it: $(view_json)"
  start_ps_task "$1"
  return 1
}
# restart_dead: every ps that has ended is checked and started again
restart_dead() {
  local i
  for ((i = 0; i < nps; i++)); do
    if ps_exited "$i"; then
      check_exit "$i" "$EXITED"
      start_ps_task "$i" || fail_run "ps/$i could not start again"
    fi
  done
}

# ---- the view (R >= 2), read from etcd
view_json() {
  on w etcdctl --endpoints "$ETCDEP" --command-timeout=1s get "/paramserver/chaos$$/view" --print-value-only 2> /dev/null
}
# view_query WHAT: "synced" (0 when every shard has R replicas in sync),
# "primary S", "backup S" (a task number), "epoch"
view_query() {
  view_json | python3 -c '
import json, sys
try:
    v = json.loads(sys.stdin.read())
except Exception:
    sys.exit(1)
R, what = int(sys.argv[1]), sys.argv[2]
sh = v["shards"]
if what == "synced":
    ok = all(len(s["replicas"]) == R and not s.get("syncing") for s in sh)
    sys.exit(0 if ok else 1)
if what == "epoch":
    print(v["epoch"]); sys.exit(0)
s = sh[int(sys.argv[3])]["replicas"]
if not s: sys.exit(1)
print(s[0] if what == "primary" else s[-1] if len(s) > 1 else "")' "$replicas" "$@"
}
now_ms() { date +%s%3N; }
# all_keys: every ps holds its task key (a lease that expired in the fault
# shows here before the view changes: the view alone may still be the one
# from before the fault)
all_keys() {
  local n
  n=$(on w etcdctl --endpoints "$ETCDEP" --command-timeout=1s get --prefix --keys-only \
    "/paramserver/chaos$$/tasks/ps/" 2> /dev/null | grep -c . || true)
  [ "$n" = "$nps" ]
}
# wait_synced SECONDS: every ps up (restarting a fenced one), holding its
# task key, and every shard back in sync
# A failure may show in the view some time after the fault healed (a
# Replicate that fails only at its deadline): the view must stay in sync,
# at one epoch, for 2 s.
wait_synced() {
  local end=$((SECONDS + $1)) ep since=0 last=-1 now
  while ((SECONDS <= end)); do
    restart_dead
    [ "$replicas" = 1 ] && return 0
    if view_query synced && all_keys; then
      ep=$(view_query epoch) now=$(now_ms)
      if [ "$ep" != "$last" ]; then
        last=$ep since=$now
      elif ((now - since >= 2000)); then
        return 0
      fi
    else
      last=-1
    fi
    sleep 0.1
  done
  return 1
}

acks() { cat "$dir"/client*.log 2> /dev/null | grep -c ' ack '; }
# wait_acks N SECONDS: until the clients have N acknowledgements in all
wait_acks() {
  local t
  for ((t = 0; t < $2 * 20; t++)); do
    [ "$(acks)" -ge "$1" ] && return 0
    sleep 0.05
  done
  return 1
}

if [ "$replicas" -ge 2 ]; then
  start_etcd || fail_run "etcd"
fi
for ((i = 0; i < nps; i++)); do
  if [ -n "$ns" ]; then PSADDR[$i]="$net.$((128 + i)):2222"; fi
done
if [ -z "$ns" ]; then
  read -r -a ports <<< "$(pick_ports $nps)"
  for ((i = 0; i < nps; i++)); do PSADDR[$i]="127.0.0.1:${ports[$i]}"; done
fi
write_spec
if [ $failed = 0 ]; then
  for ((i = 0; i < nps; i++)); do start_ps_task "$i" || { fail_run "ps/$i start"; break; }; done
fi
if [ $failed = 0 ]; then
  wait_synced 60 || fail_run "the first view never showed every shard in sync: $(view_json)"
fi
if [ $failed = 0 ]; then
  out=$(on w "$CHAOS_CLIENT" --cluster "$spec" --big-mib "$big_mib" init 2>&1) || fail_run "init: $out"
fi
if [ $failed = 0 ]; then
  at w
  for ((k = 0; k < nclients; k++)); do
    "${ON[@]}" "$CHAOS_CLIENT" --cluster "$spec" --id "$k" --clients "$nclients" --seed "$seed" \
      --rate "$rate" --log "$dir/client$k.log" run 2>> "$dir/client$k.err" &
    CLPID[$k]=$!
  done
  wait_acks 10 30 || fail_run "no acknowledgement: $(tail -3 "$dir/client0.log" "$dir/client0.err")"
fi

# ---- the rounds
# pause_ms S FROM TO: the longest time from send to acknowledgement of an
# update of shard S sent between FROM and TO (ms; "none" without one)
pause_ms() {
  awk -v s="$1" -v a="$2" -v b="$3" '$2 == "send" && $4 == s && $1 >= a && $1 <= b { t[$3] = $1 }
    $2 == "ack" && ($3 in t) { d = $1 - t[$3]; if (d > m) m = d; n++ }
    END { print n ? m : "none" }' "$dir"/client*.log
}
rand_ms() { echo $((RANDOM % $1)); } # 0 <= n < $1
secs() { awk -v m="$1" 'BEGIN { printf "%.3f", m / 1000 }'; }
done_faults=""
for ((r = 1; r <= rounds && failed == 0; r++)); do
  pause=$(rand_ms "$(awk -v s="$round_secs" 'BEGIN { print int(s * 1000) + 1 }')")
  sleep "$(secs "$pause")"
  f=${fault_list[$((RANDOM % ${#fault_list[@]}))]}
  s=$((RANDOM % nps))
  [ -n "$fix_shard" ] && s=$fix_shard
  before=$(acks)
  t0=$(now_ms)
  what=""
  case $f in
    none) what="no fault" ;;
    kill-primary | kill-backup | freeze-kill | stop | cut-front | cut-back)
      if [ "$replicas" = 1 ]; then victim=$s; else
        q=primary; [ "$f" = kill-backup ] && q=backup
        victim=$(view_query $q "$s") || victim=""
        if [ "$f" = freeze-kill ] && [ -n "$victim" ]; then
          q=backup; frozen=$(view_query backup "$s") || frozen=""
          [ -n "$frozen" ] || victim=""
        fi
      fi
      if [ -z "$victim" ]; then what="$f skipped: shard $s has no $q in the view"; f=none; fi
      ;;
  esac
  case $f in
    kill-primary | kill-backup)
      if [ "$expect_lost" = 1 ]; then # right after an acknowledgement
        wait_acks $(($(acks) + 1)) 5
      fi
      what="kill -9 of ps/$victim (${f#kill-} of shard $s)"
      if [ "$replicas" = 1 ]; then # it comes back empty: made again, at zero
        kill_ps "$victim"
        start_ps_task "$victim" || fail_run "ps/$victim could not start again"
        out=$(on w "$CHAOS_CLIENT" --cluster "$spec" --shard "$victim" init 2>&1) || fail_run "init: $out"
        what="$what, started again empty"
      else
        e0=$(view_query epoch)
        t_kill=$(now_ms)
        kill_ps "$victim"
        t_dead=$(now_ms)
        wait_gone "$victim" "$e0"
      fi
      ;;
    freeze-kill)
      what="ps/$frozen (backup of shard $s) stopped, kill -9 of ps/$victim (its primary) 0.3 s later"
      e0=$(view_query epoch)
      kill -STOP "${PSPID[$frozen]}"
      sleep 0.3
      kill_ps "$victim"
      sleep 0.05
      kill -CONT "${PSPID[$frozen]}"
      wait_gone "$victim" "$e0"
      ;;
    stop)
      what="SIGSTOP of ps/$victim for 5 s (shard $s)"
      kill -STOP "${PSPID[$victim]}"; sleep 5; kill -CONT "${PSPID[$victim]}"
      ;;
    cut-front | cut-back)
      side=f; [ "$f" = cut-back ] && side=b
      what="ps/$victim (shard $s's primary) cut from $([ $side = f ] && echo "etcd and the workers" || echo "the other ps") for 3 s"
      ip -n "$ns-sw" link set "${side}p$victim" down; sleep 3; ip -n "$ns-sw" link set "${side}p$victim" up
      ;;
    save)
      what="a save of every shard (psctl save)"
      t_save=$(now_ms)
      out=$(on w "$PSCTL" --cluster "$spec" --timeout-ms 60000 save "r$r" 2>> "$dir/save.err") ||
        fail_run "round $r: psctl save failed: $(tail -3 "$dir/save.err")"
      t_saved=$(now_ms)
      what="$what: $(secs $((t_saved - t_save))) s, ${out#saved }"
      ;;
    etcd-member)
      m=$((RANDOM % metcd))
      what="kill -9 of etcd member m$m, started again"
      kill -KILL "${ETCDPID[$m]}"; wait "${ETCDPID[$m]}" 2> /dev/null
      sleep 0.5
      start_etcd_member "$m"
      for ((t = 0; t < 200; t++)); do etcd_healthy "$m" && break; sleep 0.05; done
      etcd_healthy "$m" || fail_run "etcd member m$m did not come back: $(tail -3 "$dir/etcd$m.log")"
      ;;
  esac
  wait_synced 60 || fail_run "round $r: not back in sync within 60 s: $(view_json)"
  t1=$(now_ms)
  # the load goes on: an acknowledgement after the recovery
  wait_acks $(($(acks) + 1)) 30
  after=$(acks)
  if [ "$bench" = 1 ] && [ "$f" = kill-primary ]; then
    # the first acknowledgement of an update of shard s logged after the
    # killed ps was reaped (so from the new primary), timed from the kill
    ms=$(awk -v t0="$t_kill" -v td="$t_dead" -v s="$s" '$2 == "send" && $4 == s { mine[$3] = 1 }
      $2 == "ack" && $1 > td && ($3 in mine) && (best == "" || $1 < best) { best = $1 }
      END { if (best != "") print best - t0 }' "$dir"/client*.log)
    echo "chaos: failover shard $s: ${ms:-none} ms from kill -9 to the first acknowledged update"
  fi
  if [ "$bench" = 1 ] && [ "$f" = kill-backup ] && [ "$replicas" -ge 2 ]; then
    echo "chaos: pause shard $s rejoin: $(pause_ms "$s" "$T_RESTART" "$t1") ms (the longest acknowledgement while the killed backup copied the shard)"
  fi
  if [ "$bench" = 1 ] && [ "$f" = save ]; then
    echo "chaos: pause shard $s save: $(pause_ms "$s" "$t_save" "$t_saved") ms (the longest acknowledgement while the save ran)"
  fi
  ep=""
  [ "$replicas" -ge 2 ] && ep="; view epoch $(view_query epoch)"
  printf 'chaos: round %d/%d: %s; in sync after %s s%s; %d acknowledged (+%d)\n' "$r" "$rounds" \
    "$what" "$(secs $((t1 - t0)))" "$ep" "$after" $((after - before))
  done_faults="$done_faults $f"
  for ((k = 0; k < nclients; k++)); do
    kill -0 "${CLPID[$k]}" 2> /dev/null || { fail_run "client $k ended early: $(tail -3 "$dir/client$k.err")"; break; }
  done
done

# ---- the end: stop the load, read everything back, check
[ -n "$done_faults" ] && echo "chaos: $((r - 1)) rounds:$(echo "$done_faults" | tr ' ' '\n' | sed '/^$/d' | sort | uniq -c | awk '{ printf " %s %d,", $2, $1 }' | sed 's/,$//')"
for p in "${CLPID[@]}"; do kill -TERM "$p" 2> /dev/null; done
for k in "${!CLPID[@]}"; do
  wait "${CLPID[$k]}"; c=$?
  [ $c = 0 ] || [ $failed = 1 ] || fail_run "client $k exited $c: $(tail -3 "$dir/client$k.err")"
  CLPID[$k]=""
done
verdict=1
if [ $failed = 0 ]; then
  wait_synced 60 || fail_run "not in sync at the end: $(view_json)"
  if on w "$CHAOS_CLIENT" --cluster "$spec" read > "$dir/final.txt" 2> "$dir/read.err"; then
    python3 "$here/chaos_check.py" "$dir/final.txt" "$dir"/client*.log > "$dir/check.out" 2>&1
    verdict=$?
    cat "$dir/check.out"
  else
    fail_run "the final read failed: $(cat "$dir/read.err")"
  fi
  if [ "$replicas" -ge 2 ]; then
    if [ -n "$PSCTL" ] && "$PSCTL" --help 2>&1 | grep -q verify; then
      if out=$(on w "$PSCTL" --cluster "$spec" verify 2>&1); then
        echo "chaos: replicas bit-identical (psctl verify): $(echo "$out" | tail -1)"
      else
        fail_run "replicas differ (psctl verify): $out"
      fi
    else
      echo "chaos: replicas NOT compared: no psctl verify in ${PSCTL:-(PSCTL unset)}"
    fi
  fi
fi
# every ps stopped by pid; a crash or a sanitizer report fails the run
for ((i = 0; i < nps; i++)); do
  p=${PSPID[$i]:-}
  [ -n "$p" ] || continue
  if ps_exited "$i"; then check_exit "$i" "$EXITED"; continue; fi
  kill -CONT "$p" 2> /dev/null; kill -TERM "$p"
  wait "$p"; c=$?
  PSPID[$i]=""
  [ $c = 0 ] || [ $c = 75 ] || fail_run "ps/$i exited $c on SIGTERM; log $dir/ps$i.log"
done
for ((i = 0; i < ${#ETCDPID[@]}; i++)); do
  kill -TERM "${ETCDPID[$i]}" 2> /dev/null; wait "${ETCDPID[$i]}" 2> /dev/null; ETCDPID[$i]=""
done
if grep -lE "ERROR: (Address|Leak|Thread)Sanitizer|runtime error:" "$dir"/ps*.log "$dir"/client*.err > "$dir/san" 2> /dev/null; then
  fail_run "a sanitizer report in $(tr '\n' ' ' < "$dir/san")"
fi
if [ "$expect_lost" = 1 ]; then
  if [ $verdict = 1 ] && grep -q "LOST ACKNOWLEDGED UPDATES" "$dir/check.out" 2> /dev/null; then
    echo "chaos: the checker reported the lost acknowledged updates, as it must here"
    verdict=0
  else
    fail_run "the checker did not report lost acknowledged updates (ack before replication)"
  fi
fi
[ $verdict = 0 ] || [ $failed = 1 ] || fail_run "the checker's verdict"
if [ $failed = 0 ]; then
  echo "chaos: VERDICT: PASS (seed $seed)"
  exit 0
fi
KEEP_DIR=1
echo "chaos: VERDICT: FAIL (seed $seed; logs kept in $dir)"
exit 1
