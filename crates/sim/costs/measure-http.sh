#!/bin/bash
# Measures what one HTTP request costs on this machine, for measured.toml:
# one `tierstack origin` serving the 8 KiB `single` document from its cache
# (no emulated disk), loaded by `tierstack load`. Prints the origin's CPU time
# per request (from /proc/PID/stat) and the load client's latency summary.
#
# usage: measure-http.sh TIERSTACK CONNECTIONS REQUESTS [more tierstack load flags]
# e.g.   crates/sim/costs/measure-http.sh target/release/tierstack 16 40000
#        crates/sim/costs/measure-http.sh target/release/tierstack 1 8000
set -euo pipefail
tierstack=$1 connections=$2 requests=$3
shift 3
port=${PORT:-18080}
admin=$((port + 1))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkfifo "$dir/stdin"
"$tierstack" origin --listen "127.0.0.1:$port" --admin "127.0.0.1:$admin" --trace single \
    --cache-bytes 1000000000 <"$dir/stdin" >"$dir/origin.out" 2>&1 &
origin=$!
exec 7>"$dir/stdin" # the origin serves until its standard input closes
for _ in $(seq 100); do grep -q ready "$dir/origin.out" && break; sleep 0.1; done
cpu_ticks() { awk '{print $14 + $15}' "/proc/$origin/stat"; }
before=$(cpu_ticks)
"$tierstack" load --target "http://127.0.0.1:$port" --trace single --connections "$connections" \
    --requests "$requests" --update-interval-ms 0 --json "$dir/load.json" "$@" >/dev/null
after=$(cpu_ticks)
served=$(curl -s "http://127.0.0.1:$admin/stats" | python3 -c 'import json, sys; print(json.load(sys.stdin)["requests"])')
exec 7>&-
wait "$origin"
python3 - "$dir/load.json" "$((after - before))" "$(getconf CLK_TCK)" "$served" <<'PY'
import json, sys
load = json.load(open(sys.argv[1]))
ticks, hz, served = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"origin CPU per request: {ticks * 1e9 / hz / served:.0f} ns ({ticks} ticks, {served} requests)")
print(f"throughput {load['throughput_rps']:.1f} req/s; latency {load['latency']}")
PY
