#!/usr/bin/env bash
# Builds Prometheus and promtool — the server the dashboard and alert tests
# query, and the rule checker — from the Go module proxy, at a pinned
# version, into a cache outside the repository. The `remove_all_sd` tag
# leaves out every cloud service discovery (the tests scrape static
# targets), which halves the binaries and the build.
#
#   e2e/scripts/build-prometheus.sh            # build (or reuse) them; prints the directory
#   e2e/scripts/build-prometheus.sh --print    # print the directory without building
set -euo pipefail

# Module v0.316.0 is Prometheus 3.16.0 (v0.3MM.P = 3.MM.P).
PROMETHEUS_MODULE_VERSION="${WAYCAST_PROMETHEUS_VERSION:-v0.316.0}"
PROMETHEUS_VERSION="3.${PROMETHEUS_MODULE_VERSION#v0.3}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
BIN_DIR="$CACHE_ROOT/prometheus-$PROMETHEUS_MODULE_VERSION/bin"

if [[ "${1:-}" == "--print" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

source "$(dirname "$0")/go-tool.sh"
# promtool is built last: when it is there, both are.
(go_tool_begin prometheus "$PROMETHEUS_MODULE_VERSION" "$BIN_DIR/promtool" "$@" >/dev/null
go_tool_module github.com/prometheus/prometheus "$PROMETHEUS_MODULE_VERSION" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
stamp="github.com/prometheus/common/version"
ldflags="-s -w -X $stamp.Version=$PROMETHEUS_VERSION -X $stamp.Revision=$PROMETHEUS_MODULE_VERSION -X $stamp.Branch=HEAD"
for tool in prometheus promtool; do
  go_tool_build "github.com/prometheus/prometheus/cmd/$tool" "$BIN_DIR/$tool" -tags "tools remove_all_sd" -ldflags "$ldflags"
done)

echo "$BIN_DIR"
