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

if [[ "${1:-}" == "--print" ]]; then
  echo "$HELM_BIN"
  exit 0
fi

if [[ ! -x "$HELM_BIN" ]]; then
  export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local GOCACHE="$CACHE_ROOT/go-build"
  work="$CACHE_ROOT/src/helm-$HELM_VERSION"
  mkdir -p "$work" "$(dirname "$HELM_BIN")"
  # Building the command from a module that requires helm keeps helm's own
  # dependency pins; the ldflags stamp the version `helm version` reports.
  cat >"$work/go.mod" <<GOMOD
module waycast.dev/e2e/helm

go 1.26

require helm.sh/helm/v3 $HELM_VERSION
GOMOD
  cat >"$work/tools.go" <<'GOTOOLS'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GOTOOLS
  (
    cd "$work"
    echo "build-helm: building helm $HELM_VERSION" >&2
    go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }
    go build -trimpath -tags tools \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
      -o "$HELM_BIN.tmp" helm.sh/helm/v3/cmd/helm
    mv "$HELM_BIN.tmp" "$HELM_BIN"
  )
fi

echo "$HELM_BIN"
