#!/usr/bin/env bash
# Counts the gateway's instructions per request with valgrind's callgrind:
# repeatable whatever else the machine is doing, unlike timings. Serves a
# warm-up, zeroes the counters, serves N requests of the S2 shape (1 KB chat,
# no stream) from waycast-bench's sink, and prints Ir per request and the
# top functions.
#
#   bench/scripts/profile-gateway.sh [REQUESTS] [access-log: on|off] [stream: no|yes] [limits: off|on|budget]
#
# With limits on, the key has generous request and token limits (never
# reached): the difference is the cost of the limit check; with budget,
# the key has a daily token budget never reached (the cost of a budget). Streams have
# CHUNKS chunks (default 5; the sink's x-bench-* headers are forwarded for
# streams only, so the request figures stay comparable); two runs with
# different CHUNKS give the cost of one relayed chunk. CHUNK_MS (default 0)
# spaces the sink's chunks: back to back, several arrive in one read and
# are relayed as one frame; 1 ms apart, each is read and relayed alone, as
# tokens are. BAD_KEY=1 presents a key the gateway does not know: every
# request is refused with a 401 (the cost of a flood of bad keys; the
# bench opens a new connection after each error answer, so each request
# also pays a connection's setup, as a flood of new clients would).
# TOKEN=1 presents a bearer token (an ES256 JWT of an issuer the config
# trusts, served through an AccessGrant) instead of the key: after the
# warm-up it is remembered, so the count is a remembered token's request.
# CONCURRENCY (default 8) sets the load's concurrency: at 1 the count of
# one build repeats within about 100 instructions, at 8 runs differed by
# up to 900 (how requests batch per wake-up varies), so compare builds at 1.
#
# TELEMETRY=off|on|sampled: off (default) no telemetry; on, an OTLP
# endpoint configured (the sink stands in for the collector) with sampling
# 0 (each request still sends its usage record); sampled, every request
# traced as well. The exporter thread's instructions count too.
#
# GATEWAY=PATH counts another build (e.g. a copy of an earlier profiling
# build, for an A/B in one session).
#
# Needs the profiling build (symbols) of the gateway and the bench tool:
#   cargo build --profile profiling -p waycast-gateway
#   cargo build --profile bench-tool -p waycast-bench
set -euo pipefail
requests="${1:-2000}"
access_log="${2:-on}"
stream="${3:-no}"
limits="${4:-off}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
# GATEWAY: another build to count (an A/B against a copy of an earlier one).
gateway="${GATEWAY:-$target/profiling/waycast-gateway}"
bench="$target/bench-tool/waycast-bench"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; [[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
key=wc_benchmark_key_0123456789abcdefghijklmnop
identity=""
if [[ -n "${TOKEN:-}" ]]; then
  token="$("$bench" issue-token --group bench --jwks-out "$work/jwks.json")"
  jwks="$(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$work/jwks.json")"
  identity=",\"providers\":[{\"name\":\"bench\",\"issuer\":\"https://sso.bench.invalid\",\"audiences\":[\"waycast\"],\"keySet\":$jwks}],\"grants\":[{\"id\":\"bench/grant\",\"provider\":\"bench\",\"groups\":[\"bench\"]}]"
fi
sink_port=$((20000 + RANDOM % 10000)); gw_port=$((sink_port + 1)); admin_port=$((sink_port + 2))
"$bench" sink --listen "127.0.0.1:$sink_port" 2>/dev/null &
cat >"$work/config.json" <<JSON
{"apiVersion":"waycast.dev/config-v1",
 "models":[{"name":"benchmark-model","backends":[{"url":"http://127.0.0.1:$sink_port/v1","weight":1}],
            "timeouts":{"connect":"5s","firstByte":"300s","idle":"60s"}$([[ $stream == yes ]] && echo ',"forwardHeaders":["x-bench-*"]')}],
 "keys":[{"id":"bench/load","sha256":"$(printf %s "$key" | sha256sum | cut -d' ' -f1)"$([[ $limits == on ]] && echo ',"limits":{"requestsPerMinute":1000000000,"tokensPerMinute":1000000000000}')$([[ $limits == budget ]] && echo ',"budgets":[{"period":"Day","tokens":1000000000000}]')}]$identity,
 "settings":{"maxRequestBodyBytes":10485760,"accessLog":$([[ $access_log == on ]] && echo true || echo false)$(case "${TELEMETRY:-off}" in on) echo ",\"telemetry\":{\"endpoint\":\"http://127.0.0.1:$sink_port\",\"sampling\":0}";; sampled) echo ",\"telemetry\":{\"endpoint\":\"http://127.0.0.1:$sink_port\",\"sampling\":1}";; esac)}}
JSON
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/callgrind.out" \
  "$gateway" --config-file "$work/config.json" --listen "127.0.0.1:$gw_port" \
  --admin-listen "127.0.0.1:$admin_port" --log info >"$work/gateway.log" 2>"$work/valgrind.log" &
presented="$key"
[[ -n "${TOKEN:-}" ]] && presented="$token"
[[ -n "${BAD_KEY:-}" ]] && presented=wc_not_a_key_of_this_gateway_0000000000000
run() {
  local extra=()
  [[ $stream == yes ]] && extra=(--stream --chunks "${CHUNKS:-5}" --chunk-interval-ms "${CHUNK_MS:-0}")
  # With BAD_KEY every answer is a 401, which the bench counts as an error.
  "$bench" run --target "http://127.0.0.1:$gw_port" --key "$presented" --requests "$1" --concurrency "${CONCURRENCY:-8}" "${extra[@]}" >/dev/null ||
    [[ -n "${BAD_KEY:-}" ]]
}
# Ready, not just listening: under valgrind a cold start can take seconds
# between the bind and the first config loaded, and a warm-up answered 503
# ended the run.
for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$admin_port/readyz" >/dev/null && break; sleep 0.1; done
run 500
callgrind_control -i on >/dev/null
run "$requests"
callgrind_control -i off >/dev/null
callgrind_control -d >/dev/null
sleep 1
annotated="$(callgrind_annotate --inclusive=no "$work"/callgrind.out.1 2>/dev/null || true)"
total="$(awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}' <<<"$annotated")"
echo "requests: $requests  bearer: $([[ -n "${TOKEN:-}" ]] && echo token || echo key)  access log: $access_log  stream: $stream$([[ $stream == yes ]] && echo " (${CHUNKS:-5} chunks)")  limits: $limits  telemetry: ${TELEMETRY:-off}"
echo "instructions per request: $((total / requests))"
sed -n '/^Ir  *file:function/,$p' <<<"$annotated" | head -28
