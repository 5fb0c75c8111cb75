#!/usr/bin/env bash
# Builds the Helm CLI the chart tests run, from the Go module proxy, at a
# pinned version, into a cache outside the repository.
#
#   e2e/scripts/build-helm.sh            # build (or reuse) helm; prints its path
#   e2e/scripts/build-helm.sh --print    # print the path without building
set -euo pipefail

HELM_VERSION="${WAYCAST_HELM_VERSION:-v3.21.4}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
HELM_BIN="$CACHE_ROOT/helm-$HELM_VERSION/bin/helm"

source "$(dirname "$0")/go-tool.sh"
go_tool_begin helm "$HELM_VERSION" "$HELM_BIN" "$@"

# Building the command from a module that requires helm keeps helm's own
# dependency pins; the ldflags stamp the version `helm version` reports.
go_tool_module helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
go_tool_build helm.sh/helm/v3/cmd/helm "$HELM_BIN" -tags tools \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"

echo "$HELM_BIN"
