#!/usr/bin/env bash
# Makes a small private CA, TLS certificates (one server certificate for all
# hosts, one per ps task, one per client) and bearer tokens for ps-server's
# --tls-* and --auth-token-file options.  Meant for tests and small clusters:
# production should use its own PKI.  Needs only openssl(1) and coreutils.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: deploy/gen-certs.sh [--cluster SPEC.json] [--hosts H1,H2,...]
                           [--clients N1,N2,...] [--days N] [--tokens] [--force] OUTDIR

Makes OUTDIR (mode 0700) holding (keys and tokens mode 0600):
  ca.crt ca.key            a self-signed CA (EC P-256)
  server.crt server.key    for all hosts: localhost, 127.0.0.1, ::1, every host
                           of --cluster and of --hosts (serverAuth, clientAuth)
  ps-I.crt ps-I.key        for each ps task I of --cluster: its host + localhost
  client-NAME.crt/.key     for each client NAME (CN=NAME, clientAuth)
  tokens NAME.token        with --tokens: the ps's token file ("ROLE TOKEN" lines,
                           for ps-server --auth-token-file; ROLE is admin for
                           names starting with "admin", else worker) and each
                           client's token

  --cluster FILE   a cluster spec ({"ps": ["host:port", ...], "worker": ...},
                   a job may also be {"0": "host:port", ...}); every task's
                   host goes into server.crt, every ps task gets ps-I.crt
  --hosts LIST     more host names or IP addresses for server.crt, comma-separated
  --clients LIST   client names, comma-separated (default: worker,admin)
  --days N         validity of new certificates in days (default: 365)
  --tokens         also write the token files
  --force          write into an OUTDIR that already has ca.key.  If it has
                   ca.crt and ca.key, that CA is KEPT and only the leaf
                   certificates (and tokens) are re-made: this is how to
                   rotate them while clients keep trusting the same ca.crt.
                   Certificates made before stay valid until they expire
                   (there is no revocation); old tokens stop working once the
                   ps re-reads the new tokens file (SIGHUP).  To replace the
                   CA too, delete ca.key first.
  -h, --help       print this and exit
EOF
}

die() { echo "gen-certs: error: $*" >&2; exit 1; }
bad_usage() { echo "gen-certs: error: $*" >&2; usage >&2; exit 2; }
say() { echo "gen-certs: $*" >&2; }

cluster='' hosts='' clients='worker,admin' days=365 tokens=0 force=0 out=''
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --cluster | --hosts | --clients | --days) # sets $cluster, $hosts, ...
      (($# >= 2)) || bad_usage "$1 needs a value"
      printf -v "${1#--}" '%s' "$2"; shift ;;
    --cluster=* | --hosts=* | --clients=* | --days=*) v=${1%%=*}; printf -v "${v#--}" '%s' "${1#*=}" ;;
    --tokens) tokens=1 ;;
    --force) force=1 ;;
    --) [[ $# -eq 2 && -z $out ]] || bad_usage "want one OUTDIR after --"; out=$2; shift ;;
    -*) bad_usage "unknown option $1" ;;
    *) [[ -z $out ]] || bad_usage "more than one OUTDIR"; out=$1 ;;
  esac
  shift
done
[[ -n $out ]] || bad_usage "no OUTDIR given"
[[ $days =~ ^[1-9][0-9]{0,5}$ ]] || bad_usage "--days wants a number of days, not '$days'"
command -v openssl >/dev/null 2>&1 || die "openssl not found in PATH"

# ---- hosts: "DNS:name" or "IP:addr" entries, in order, without duplicates.
# Prints the SAN entry for a host name or IP literal ([v6] brackets allowed).
san_of() {
  local h=$1
  if [[ $h == \[*\] ]]; then h=${h:1:${#h}-2}; fi
  h=${h%%\%*} # an IPv6 zone ("fe80::1%eth0") cannot be in a certificate
  if [[ $h =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ || ($h == *:* && $h =~ ^[0-9A-Fa-f:.]+$) ]]; then
    echo "IP:$h" # openssl rejects a malformed one
  elif [[ $h =~ ^(\*\.)?[A-Za-z0-9_][A-Za-z0-9._-]{0,252}$ ]]; then
    echo "DNS:$h"
  else
    return 1
  fi
}
declare -A seen=()
server_sans=()
add_server_host() {
  local s
  s=$(san_of "$1") || die "$2: '$1' is not a host name or IP address"
  if [[ -z ${seen[$s]:-} ]]; then seen[$s]=1 && server_sans+=("$s"); fi
}
for h in localhost 127.0.0.1 ::1; do add_server_host "$h" built-in; done

# ---- the cluster spec: a tokenizer over the JSON text prints one
# "JOB<tab>INDEX<tab>ADDRESS" line for each string in a list under a key
# (JOB) or under a numeric key (INDEX) of an object under a key (JOB).  It
# also accepts a TF_CONFIG ({"cluster": {...}, "task": {...}}).
parse_cluster() {
  awk '
    function value(t, isstr) {
      if (!isstr || d < 2 || typ[d - 1] != "{") return
      if (typ[d] == "[") printf "%s\t%d\t%s\n", key[d - 1], pos[d], t
      else if (key[d] ~ /^[0-9]+$/) printf "%s\t%d\t%s\n", key[d - 1], key[d] + 0, t
    }
    { text = text $0 "\n" }
    END {
      n = length(text); d = 0
      for (i = 1; i <= n; i++) {
        c = substr(text, i, 1)
        if (c ~ /[ \t\r\n]/ || c == ":") continue
        if (c == "{" || c == "[") { typ[++d] = c; pos[d] = 0; wantkey[d] = (c == "{"); key[d] = ""; continue }
        if (c == "}" || c == "]") { if (--d < 0) break; continue }
        if (c == ",") { if (typ[d] == "[") pos[d]++; else wantkey[d] = 1; continue }
        isstr = (c == "\""); t = ""
        if (isstr) {
          for (i++; i <= n && (c = substr(text, i, 1)) != "\""; i++) {
            if (c == "\\") c = substr(text, ++i, 1)
            t = t c
          }
          if (i > n) { print "unterminated string"; exit 1 }
        } else {
          for (; i <= n && substr(text, i, 1) !~ /[][{}:,\t\r\n ]/; i++) t = t substr(text, i, 1)
          i--
        }
        if (d >= 1 && typ[d] == "{" && wantkey[d]) { key[d] = t; wantkey[d] = 0 }
        else value(t, isstr)
      }
      if (d != 0) { print "unbalanced brackets"; exit 1 }
    }' "$1"
}

declare -A ps_host=()
if [[ -n $cluster ]]; then
  [[ -r $cluster && ! -d $cluster ]] || die "--cluster $cluster: cannot read it"
  parsed=$(parse_cluster "$cluster") || die "--cluster $cluster: not valid JSON: ${parsed##*$'\n'}"
  found=0
  while IFS=$'\t' read -r job idx addr; do
    [[ -n $addr ]] || continue
    # host:port or [v6]:port, as ps-server wants them.
    [[ $addr =~ ^(\[[^]]+\]):[0-9]+$ || $addr =~ ^([A-Za-z0-9._-]+):[0-9]+$ ]] ||
      die "--cluster $cluster: $job/$idx: address '$addr' is not host:port"
    host=${BASH_REMATCH[1]}
    add_server_host "$host" "--cluster $cluster: $job/$idx"
    if [[ $job == ps ]]; then
      [[ -z ${ps_host[$idx]:-} ]] || die "--cluster $cluster: ps/$idx is given twice"
      ps_host[$idx]=$host
    fi
    found=$((found + 1))
  done <<<"$parsed"
  ((found > 0)) || die "--cluster $cluster: no \"host:port\" address found in it"
fi
IFS=',' read -r -a extra <<<"$hosts"
for h in "${extra[@]}"; do [[ -z $h ]] || add_server_host "$h" --hosts; done

IFS=',' read -r -a client_names <<<"$clients"
names=()
for c in "${client_names[@]}"; do
  [[ -n $c ]] || continue
  [[ $c =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$ ]] || bad_usage "--clients: bad name '$c' (letters, digits, . _ -)"
  [[ " ${names[*]} " != *" $c "* ]] || bad_usage "--clients: '$c' is listed twice"
  names+=("$c")
done
((tokens == 0 || ${#names[@]} > 0)) || bad_usage "--tokens needs at least one client"

# ---- OUTDIR and the CA.
keep_ca=0
if [[ -e $out/ca.key ]]; then
  ((force)) || die "$out already has ca.key: not replacing a CA (--force keeps that CA and re-makes the other files)"
  [[ -e $out/ca.crt ]] && keep_ca=1
fi
created=0 finished=0 stage=
if [[ ! -d $out ]]; then
  { mkdir -p -- "$(dirname -- "$out")" && mkdir -m 700 -- "$out"; } || die "cannot make $out"
  created=1
fi
# Everything is made in a staging directory and moved into OUTDIR at the
# end (rename: a reader never sees half a file; a failure leaves OUTDIR as it was).
umask 077
cleanup() { [[ -z $stage ]] || rm -rf -- "$stage"; if ((created && !finished)); then rmdir -- "$out"; fi; }
trap cleanup EXIT
stage=$(mktemp -d "$out/.gen-certs.XXXXXX") || die "cannot write in $out"
staged=() report=()

ossl() { openssl "$@" >/dev/null 2>"$stage/err" || die "openssl $1 failed: $(cat "$stage/err")"; }
newkey() { ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
printf '[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n' >"$stage/req.cnf"

cadir=$stage
if ((keep_ca)); then
  cadir=$out
  a=$(openssl x509 -in "$out/ca.crt" -noout -pubkey 2>/dev/null) || die "$out/ca.crt: not a certificate"
  b=$(openssl pkey -in "$out/ca.key" -pubout 2>/dev/null) || die "$out/ca.key: not a private key"
  [[ $a == "$b" ]] || die "$out/ca.key is not the key of $out/ca.crt"
  if ! openssl x509 -in "$out/ca.crt" -noout -checkend $(((days - 1) * 86400)) >/dev/null; then
    say "warning: the kept CA ends $(openssl x509 -in "$out/ca.crt" -noout -enddate | cut -d= -f2)," \
      "before the new certificates: delete ca.key to make a new CA"
  fi
  report+=("kept ca.crt, ca.key (existing CA, --force)")
else
  newkey "$stage/ca.key"
  cat "$stage/req.cnf" - >"$stage/ca.cnf" <<'EOF'
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
EOF
  ossl req -new -x509 -config "$stage/ca.cnf" -extensions ca -key "$stage/ca.key" -sha256 \
    -subj "/CN=paramserver CA $(date -u +%Y-%m-%dT%H:%M:%SZ)" -days "$days" -out "$stage/ca.crt"
  staged+=(ca.key ca.crt) report+=("wrote ca.crt, ca.key (new CA, $days days)")
fi

# make_leaf BASE CN EKU [SAN,...]: BASE.key and BASE.crt signed by the CA.
make_leaf() {
  local base=$1 cn=$2 eku=$3 san=${4:-}
  newkey "$stage/$base.key"
  ossl req -new -config "$stage/req.cnf" -key "$stage/$base.key" -subj "/CN=$cn" -out "$stage/$base.csr"
  {
    printf '[leaf]\nbasicConstraints = CA:FALSE\nkeyUsage = critical,digitalSignature\n'
    printf 'extendedKeyUsage = %s\nsubjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n' "$eku"
    [[ -z $san ]] || printf 'subjectAltName = %s\n' "$san"
  } >"$stage/$base.ext"
  ossl x509 -req -in "$stage/$base.csr" -CA "$cadir/ca.crt" -CAkey "$cadir/ca.key" -sha256 \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" \
    -extfile "$stage/$base.ext" -extensions leaf -out "$stage/$base.crt"
  staged+=("$base.key" "$base.crt")
}

joined() { local IFS=,; echo "$*"; }
make_leaf server paramserver serverAuth,clientAuth "$(joined "${server_sans[@]}")"
report+=("wrote server.crt, server.key (SANs: $(joined "${server_sans[@]}"))")

for idx in $(printf '%s\n' "${!ps_host[@]}" | sort -n); do
  s=$(san_of "${ps_host[$idx]}")
  sans=("$s")
  for h in DNS:localhost IP:127.0.0.1 IP:::1; do [[ $h == "$s" ]] || sans+=("$h"); done
  make_leaf "ps-$idx" "ps-$idx" serverAuth,clientAuth "$(joined "${sans[@]}")"
  report+=("wrote ps-$idx.crt, ps-$idx.key (SANs: $(joined "${sans[@]}"))")
done

for c in "${names[@]}"; do
  make_leaf "client-$c" "$c" clientAuth
  report+=("wrote client-$c.crt, client-$c.key (CN=$c)")
done

if ((tokens)); then
  echo '# ROLE TOKEN, read by ps-server --auth-token-file' >"$stage/tokens"
  staged+=(tokens)
  for c in "${names[@]}"; do
    t=$(openssl rand -hex 32) || die "openssl rand failed"
    if [[ $c == admin* ]]; then echo "admin $t"; else echo "worker $t"; fi >>"$stage/tokens"
    echo "$t" >"$stage/$c.token"
    staged+=("$c.token")
  done
  report+=("wrote tokens, $(joined "${names[@]/%/.token}") (${#names[@]} tokens)")
fi

declare -A made=()
for f in "${staged[@]}"; do
  if [[ $f == *.crt ]]; then chmod 644 "$stage/$f"; fi
  mv -f -- "$stage/$f" "$out/$f" || die "cannot write $out/$f"
  made[$f]=1
done
finished=1
for r in "${report[@]}"; do say "$r"; done

# Files of an earlier run that this one did not re-make (other ps tasks or clients).
stale=()
for f in "$out"/server.* "$out"/ps-*.* "$out"/client-*.* "$out"/tokens "$out"/*.token; do
  if [[ -e $f && -z ${made[${f##*/}]:-} ]]; then stale+=("${f##*/}"); fi
done
((${#stale[@]} == 0)) || say "note: left from an earlier run: ${stale[*]}"
