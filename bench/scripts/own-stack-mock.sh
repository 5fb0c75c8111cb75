#!/usr/bin/env bash
# The "Your own stack" figures of docs/performance.md, reproduced: the
# vLLM-like mock (waycast-mock-upstream) as the inference server, a
# standalone gateway routing a model to it, and `waycast-bench run`
# comparing the two in interleaved rounds — each pinned to the CPUs given
# (on two cores the defaults share CPU 1 between the mock and the load).
#
#   bench/scripts/own-stack-mock.sh [GATEWAY_CPUS] [MOCK_CPUS] [BENCH_CPUS]
#
# Release binaries from BIN_DIR (default target/release: `cargo build
# --release -p waycast-gateway -p waycast-mock -p waycast-bench`). The
# run's shape comes from the environment (defaults in brackets): SLOTS [16],
# TOKEN_MS [10], PREFILL_US [20] for the mock; MAX_TOKENS [32], REQUESTS
# [600], CONCURRENCY [12], ROUNDS [5], BODY_BYTES [512], BODY_BYTES_MAX
# [4096]; SWEEP (e.g. 80:240:5) for a rate sweep instead. The report goes
# to OUT_DIR (default .) as own-stack.json and own-stack.csv.
set -euo pipefail
bin=${BIN_DIR:-target/release}
gateway_cpus=${1:-0} mock_cpus=${2:-1} bench_cpus=${3:-1}
out=${OUT_DIR:-.}
base_port=${BASE_PORT:-18100}
mock_port=$base_port gateway_port=$((base_port + 1)) admin_port=$((base_port + 2))
model=meta-llama/Llama-3.1-8B-Instruct
key=wc_own_stack_benchmark_key_0123456789abcdef
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in ${pids[@]+"${pids[@]}"}; do kill "$pid" 2>/dev/null || true; done
  # Gone before the script is: a rerun binds the same ports.
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

cat > "$dir/gateway.json" <<EOF
{"apiVersion": "waycast.dev/config-v1",
 "models": [{"name": "$model", "backends": [{"url": "http://127.0.0.1:$mock_port/v1", "weight": 1}],
             "timeouts": {"connect": "5s", "firstByte": "300s", "idle": "60s"}}],
 "keys": [{"id": "bench/own-stack", "sha256": "$(printf %s "$key" | sha256sum | cut -d' ' -f1)"}],
 "settings": {"maxRequestBodyBytes": 10485760}}
EOF

taskset -c "$mock_cpus" "$bin/waycast-mock-upstream" --listen "127.0.0.1:$mock_port" \
  --vllm-slots "${SLOTS:-16}" --token-ms "${TOKEN_MS:-10}" --prefill-us-per-byte "${PREFILL_US:-20}" \
  > "$dir/mock.log" 2>&1 &
pids+=($!)
taskset -c "$gateway_cpus" "$bin/waycast-gateway" --config-file "$dir/gateway.json" \
  --listen "127.0.0.1:$gateway_port" --admin-listen "127.0.0.1:$admin_port" --log warn > "$dir/gateway.log" 2>&1 &
pids+=($!)

# Both answer before anything is measured (and are ours: a process left
# behind by an earlier run may hold the ports, and ours would have exited).
ready=
for _ in $(seq 100); do
  if "$bin/waycast-bench" run --target "http://127.0.0.1:$gateway_port" --key "$key" --model "$model" \
    --max-tokens 1 --requests 1 --concurrency 1 --warmup 0 > /dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.1
done
for pid in "${pids[@]}"; do
  kill -0 "$pid" 2>/dev/null || { echo "own-stack: a process exited (ports $mock_port, $gateway_port in use?)" >&2; ready=; }
done
if [[ -z $ready ]]; then
  echo "own-stack: the gateway or the mock did not answer" >&2
  cat "$dir/gateway.log" "$dir/mock.log" >&2
  exit 1
fi

load=(--requests "${REQUESTS:-600}" --concurrency "${CONCURRENCY:-12}" --rounds "${ROUNDS:-5}")
if [[ -n ${SWEEP:-} ]]; then
  load=(--requests "${REQUESTS:-300}" --concurrency "${CONCURRENCY:-256}" --sweep "$SWEEP")
fi
echo "own-stack: gateway on CPUs $gateway_cpus, mock on $mock_cpus, waycast-bench on $bench_cpus" >&2
taskset -c "$bench_cpus" "$bin/waycast-bench" run \
  --target "http://127.0.0.1:$gateway_port" --key "$key" --baseline "http://127.0.0.1:$mock_port/v1" \
  --model "$model" --max-tokens "${MAX_TOKENS:-32}" --stream \
  --body-bytes "${BODY_BYTES:-512}" --body-bytes-max "${BODY_BYTES_MAX:-4096}" "${load[@]}" \
  --out "$out/own-stack.json" --csv "$out/own-stack.csv" > /dev/null
