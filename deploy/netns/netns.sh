#!/usr/bin/env bash
# Engines on separate hosts, on one machine: Linux network namespaces as hosts (docs/cluster.md,
# "Engines on separate hosts"). Needs root, iproute2 (ip, tc). Each "host" is a namespace NAME-i
# with one interface eth0 at SUBNET.(i+2)/24, the far end of a veth pair whose near end is on a
# bridge NAME-br (SUBNET.1) in the root namespace; the file system (the KV directory) is shared.
#
#   netns.sh up NAME COUNT [--subnet 10.231.0] [--cnic-mbit M]
#       make the bridge and COUNT namespaces; with --cnic-mbit, cap each host's link to M Mbit/s in
#       each direction with tc tbf on both ends of its veth (the compute NIC). Prints one line
#       `cnic=tc`, `cnic=emulate` (tc refused: pass --cnic-gbps to the engines instead, the
#       in-process emulation) or `cnic=none`.
#   netns.sh cap NAME COUNT M  /  netns.sh uncap NAME COUNT
#       put (replace) or remove the tc tbf cap of M Mbit/s on the COUNT hosts' links.
#   netns.sh down NAME COUNT
#       kill what still runs in the namespaces, delete them and the bridge (idempotent).
#   netns.sh cluster NAME RUN_DIR [--subnet S] [--cnic-mbit M] [--prefill 1] [--decode 1] [--model tiny]
#       the whole recipe: up, then the scheduler on host 0 (CURVE key made in RUN_DIR), one engine
#       per further host (`dualpath engine --restart-on-exit`), the KV directory RUN_DIR/kv; logs and
#       pids in RUN_DIR. Prints the scheduler address and the key file.
#   netns.sh stop NAME RUN_DIR
#       stop what `cluster` started (SIGTERM by pid file), then down.
#
# DUALPATH (default: dualpath) is the command run inside the namespaces.
set -euo pipefail

usage() { sed -n '2,25p' "$0" >&2; exit 2; }
die() { echo "netns.sh: error: $*" >&2; exit 2; }

[ $# -ge 2 ] || usage
cmd=$1 name=$2
shift 2
[ ${#name} -le 10 ] || die "NAME '$name' is longer than 10 characters (interface names are at most 15)"
[[ $name =~ ^[a-z][a-z0-9]*$ ]] || die "NAME '$name' must be lowercase letters and digits"

subnet=10.231.0 cnic_mbit="" prefill=1 decode=1 model=tiny count="" run_dir=""
positional() {
  while [ $# -gt 0 ]; do
    case $1 in
      --subnet) subnet=$2; shift 2 ;;
      --cnic-mbit) cnic_mbit=$2; shift 2 ;;
      --prefill) prefill=$2; shift 2 ;;
      --decode) decode=$2; shift 2 ;;
      --model) model=$2; shift 2 ;;
      -*) die "unknown option $1" ;;
      *) rest+=("$1"); shift ;;
    esac
  done
}
rest=()
positional "$@"

host_ip() { echo "$subnet.$(($1 + 2))"; }

tbf() {  # tbf DEV [NETNS]: cap DEV's egress at cnic_mbit; burst >= one 64 KiB GSO segment
  local dev=$1 ns=${2:-} bytes burst
  bytes=$((cnic_mbit * 125000))
  burst=$((bytes / 100 > 131072 ? bytes / 100 : 131072))
  if [ -n "$ns" ]; then
    ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${cnic_mbit}mbit" burst "$burst" latency 100ms
  else
    tc qdisc replace dev "$dev" root tbf rate "${cnic_mbit}mbit" burst "$burst" latency 100ms
  fi
}

up() {
  local n=$1 i ns cnic=none
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "COUNT '$n' must be in 1..200"
  [[ $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet '$subnet' must be three octets (10.231.0)"
  ip link add "$name-br" type bridge
  ip addr add "$subnet.1/24" dev "$name-br"
  ip link set "$name-br" up
  for ((i = 0; i < n; i++)); do
    ns=$name-$i
    ip netns add "$ns"
    ip link add "${name}v$i" type veth peer name eth0 netns "$ns"
    ip link set "${name}v$i" master "$name-br" up
    ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via "$subnet.1"
  done
  [ -n "$cnic_mbit" ] && cnic=$(cap "$n")
  echo "cnic=$cnic"
}

cap() {  # cap COUNT: tbf on both ends of each veth; prints tc, or emulate where tc refuses
  local n=$1 i
  [[ $cnic_mbit =~ ^[0-9]+$ ]] && [ "$cnic_mbit" -ge 1 ] || die "the cap '$cnic_mbit' must be a whole number of Mbit/s >= 1"
  for ((i = 0; i < n; i++)); do
    if ! { tbf "${name}v$i" && tbf eth0 "$name-$i"; } 2>/dev/null; then echo emulate; return; fi
  done
  echo tc
}

uncap() {
  local n=$1 i
  for ((i = 0; i < n; i++)); do
    tc qdisc del dev "${name}v$i" root 2>/dev/null || true
    ip netns exec "$name-$i" tc qdisc del dev eth0 root 2>/dev/null || true
  done
}

down() {
  local n=$1 i ns pid
  for ((i = 0; i < n; i++)); do
    ns=$name-$i
    [ -e "/run/netns/$ns" ] || continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$name-br" 2>/dev/null || true
  for ((i = 0; i < n; i++)); do ip link del "${name}v$i" 2>/dev/null || true; done
}

dp() { local ns=$1; shift; ip netns exec "$ns" env OMP_NUM_THREADS=1 ${DUALPATH:-dualpath} "$@"; }

cluster() {
  local dir=$1 n=$((prefill + decode + 1)) i role cnic flags=() port=7500
  mkdir -p "$dir/kv"
  cnic=$(up "$n" | sed -n 's/^cnic=//p')
  [ "$cnic" = emulate ] && flags=(--cnic-gbps "$(awk "BEGIN{print $cnic_mbit/1000}")")
  if [ "$model" = tiny ]; then
    python3 -c "import sys; from pathlib import Path; from dualpath.runtime.cluster.local import tiny_model_dir; print(tiny_model_dir(Path(sys.argv[1])))" "$dir" >/dev/null
    model=$dir/tiny-model
  fi
  rm -f "$dir/cluster.key"
  dp "$name-0" scheduler --kv-dir "$dir/kv" --host "$(host_ip 0)" --port $port --model "$model" \
    --key-file "$dir/cluster.key" --create-key --state-file "$dir/scheduler.state" >"$dir/scheduler.log" 2>&1 &
  echo $! >"$dir/scheduler.pid"
  for ((i = 1; i < n; i++)); do
    role=decode; [ "$i" -le "$prefill" ] && role=prefill
    while [ ! -s "$dir/cluster.key" ]; do sleep 0.1; done
    dp "$name-$i" engine --role $role --scheduler "$(host_ip 0):$port" --kv-dir "$dir/kv" --node-id $((i - 1)) \
      --host "$(host_ip "$i")" --model "$model" --key-file "$dir/cluster.key" --cluster-id "$name-$i" \
      --restart-on-exit "${flags[@]}" >"$dir/engine$i.log" 2>&1 &
    echo $! >"$dir/engine$i.pid"
  done
  echo "$n" >"$dir/hosts"
  echo "scheduler tcp://$(host_ip 0):$port key_file $dir/cluster.key cnic=$cnic logs $dir"
}

stop() {
  local dir=$1 f
  for f in "$dir"/engine*.pid "$dir"/scheduler.pid; do
    [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  sleep 2
  down "$(cat "$dir/hosts" 2>/dev/null || echo 8)"
}

case $cmd in
  up) [ ${#rest[@]} -eq 1 ] || usage; up "${rest[0]}" ;;
  down) [ ${#rest[@]} -eq 1 ] || usage; down "${rest[0]}" ;;
  cap) [ ${#rest[@]} -eq 2 ] || usage; cnic_mbit=${rest[1]}; cap "${rest[0]}" ;;
  uncap) [ ${#rest[@]} -eq 1 ] || usage; uncap "${rest[0]}" ;;
  cluster) [ ${#rest[@]} -eq 1 ] || usage; cluster "${rest[0]}" ;;
  stop) [ ${#rest[@]} -eq 1 ] || usage; stop "${rest[0]}" ;;
  *) usage ;;
esac
