#!/usr/bin/env bash
# chaos_check.py on logs written here: it passes a history that a correct
# store can produce, and names each kind of violation it must catch.
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
test_init chaos-check
chk="$(dirname "$0")/chaos_check.py"
# client 0: +1 acknowledged, +5 failed, +9 unanswered on v; rows 3 and 4
# of t get [13, 1] (acknowledged) and row 3 [17, 1] (failed)
cat > "$dir/c0.log" <<'LOG'
1 send 0.0 0 v - 1
2 ack 0.0 7
3 send 0.1 0 v - 5
4 fail 0.1 UNAVAILABLE ps/0 is gone
5 send 0.2 0 t 3,4 13
6 ack 0.2 8
7 send 0.3 0 t 3 17
8 fail 0.3 DEADLINE_EXCEEDED no answer
9 send 0.4 0 v - 9
LOG
final() { # V ROW3 COUNT3 ROW4 COUNT4
  printf 'var v %s\nrow t 3 %s %s\nrow t 4 %s %s\n' "$@" > "$dir/final"
}
final 10 30 2 13 1
expect "acknowledged plus some unknown attempts: OK" 0 "VERDICT: OK" python3 "$chk" "$dir/final" "$dir/c0.log"
final 15 13 1 13 1
expect "every attempt applied: OK" 0 "VERDICT: OK" python3 "$chk" "$dir/final" "$dir/c0.log"
final 0 13 1 13 1
expect "an acknowledged add missing" 1 "LOST ACKNOWLEDGED UPDATES: v is 0" python3 "$chk" "$dir/final" "$dir/c0.log"
final 1 13 1 0 0
expect "an acknowledged row add missing" 1 "LOST ACKNOWLEDGED UPDATES: t row 4 is 0" python3 "$chk" "$dir/final" "$dir/c0.log"
final 2 13 1 13 1
expect "an add applied twice" 1 "UPDATES APPLIED TWICE OR FROM NOWHERE: v is 2" python3 "$chk" "$dir/final" "$dir/c0.log"
final 16 13 1 13 1
expect "more than was sent" 1 "more than every increment sent: 15" python3 "$chk" "$dir/final" "$dir/c0.log"
final 1 30 3 13 1
expect "a row counted more often than sent" 1 "t row 3 is 30 (3 adds)" python3 "$chk" "$dir/final" "$dir/c0.log"
printf '1 ack 9.9 1\n' > "$dir/c1.log"
final 1 13 1 13 1
expect "an outcome of an attempt never sent" 1 "ack of attempt 9.9, never sent" python3 "$chk" "$dir/final" "$dir/c0.log" "$dir/c1.log"
finish
