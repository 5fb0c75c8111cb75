#!/usr/bin/env bash
# CPU time per request of one or more gateway binaries, interleaved round by
# round so that they meet the same moments of a noisy machine (an A/B of two
# builds): each round starts each binary afresh, warms it with 2,000
# requests, then serves REQUESTS of the S2 shape (1 KB chat, no stream, 64
# concurrent) from waycast-bench's sink, and prints the gateway's user +
# system CPU (from /proc) per request, in microseconds.
#
#   bench/scripts/cpu-per-request.sh REQUESTS ROUNDS GATEWAY_BIN...
#
# GW_CPUS (default 0) and WORKERS (default 1) place the gateway; LOAD_CPUS
# (default 1) the load generator and the sink. Needs the bench tool:
#   cargo build --profile bench-tool -p waycast-bench
set -euo pipefail
if (($# < 3)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
requests="$1"
rounds="$2"
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bench="${CARGO_TARGET_DIR:-$root/target}/bench-tool/waycast-bench"
gateway_cpus="${GW_CPUS:-0}"
load_cpus="${LOAD_CPUS:-1}"
workers="${WORKERS:-1}"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
key=wc_benchmark_key_0123456789abcdefghijklmnop
sink_port=$((20000 + RANDOM % 10000))
taskset -c "$load_cpus" "$bench" sink --listen "127.0.0.1:$sink_port" 2>/dev/null &
cat >"$work/config.json" <<JSON
{"apiVersion":"waycast.dev/config-v1",
 "models":[{"name":"benchmark-model","backends":[{"url":"http://127.0.0.1:$sink_port/v1","weight":1}]}],
 "keys":[{"id":"bench/load","sha256":"$(printf %s "$key" | sha256sum | cut -d' ' -f1)"}],
 "settings":{"maxRequestBodyBytes":10485760,"accessLog":true}}
JSON
load() {
  taskset -c "$load_cpus" "$bench" run --target "http://127.0.0.1:$1" --key "$key" --requests "$2" --concurrency "$3" >/dev/null
}
ticks_per_second="$(getconf CLK_TCK)"
for round in $(seq 1 "$rounds"); do
  for gateway in "$@"; do
    port=$((sink_port + 10 + RANDOM % 1000))
    taskset -c "$gateway_cpus" "$gateway" --config-file "$work/config.json" --listen "127.0.0.1:$port" \
      --admin-listen "127.0.0.1:$((port + 1))" --workers "$workers" --log info >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do load "$port" 1 1 2>/dev/null && break; sleep 0.05; done
    load "$port" 2000 64
    before="$(awk '{print $14 + $15}' "/proc/$pid/stat")"
    load "$port" "$requests" 64
    after="$(awk '{print $14 + $15}' "/proc/$pid/stat")"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    micros="$(awk -v t="$((after - before))" -v hz="$ticks_per_second" -v n="$requests" 'BEGIN {printf "%.2f", t / hz / n * 1e6}')"
    echo "round $round  $gateway  $micros µs CPU per request"
  done
done
