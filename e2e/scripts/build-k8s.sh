#!/usr/bin/env bash
# Builds the Kubernetes binaries the e2e harness runs, from the Go module
# proxy, at pinned versions, into a cache outside the repository.
#
#   e2e/scripts/build-k8s.sh            # build (or reuse) everything
#   e2e/scripts/build-k8s.sh --print    # print the directory holding them
#
# NB: a binary found in $KUBEBUILDER_ASSETS (as envtest lays it out) is used as
# it is and not built; the harness looks there first, then in the printed dir.
set -euo pipefail

K8S_VERSION="${WAYCAST_K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${WAYCAST_ETCD_VERSION:-v3.6.4}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
BIN_DIR="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/bin"
METRICS_SERVER_VERSION="${WAYCAST_METRICS_SERVER_VERSION:-v0.9.0}"
# The control plane, the node agents and kubectl.
K8S_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)

if [[ "${1:-}" == "--print" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

mkdir -p "$BIN_DIR"
log() { echo "build-k8s: $*" >&2; }

provided() { [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/$1" ]]; }
missing=()
for cmd in "${K8S_COMMANDS[@]}"; do
  provided "$cmd" || [[ -x "$BIN_DIR/$cmd" ]] || missing+=("$cmd")
done

export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
# A build cache of the project's own (the disk tool may remove it; the
# user's own Go cache is never touched).
export GOCACHE="$CACHE_ROOT/go-build"
if ((${#missing[@]})); then
  work="$CACHE_ROOT/src/kubernetes-$K8S_VERSION"
  mkdir -p "$work"
  # k8s.io/kubernetes points its staging modules at ./staging; a module that
  # depends on it must point each of them at the published v0.x.y instead.
  go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >"$work/download.json"
  k8s_gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' "$work/download.json")"
  go_line="$(awk '$1 == "go" {print $2; exit}' "$k8s_gomod")"
  staging_version="v0.${K8S_VERSION#v1.}"
  {
    echo "module waycast.dev/e2e/kubernetes"
    echo
    echo "go $go_line"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$k8s_gomod" \
      | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"$work/go.mod"
  {
    echo "//go:build tools"
    echo "package tools"
    echo "import ("
    for cmd in "${K8S_COMMANDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$cmd\""; done
    echo ")"
  } >"$work/tools.go"
  major="${K8S_VERSION#v}"; major="${major%%.*}"
  minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (
    cd "$work"
    log "resolving k8s.io/kubernetes $K8S_VERSION modules"
    go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }
    for cmd in "${missing[@]}"; do
      log "building $cmd $K8S_VERSION"
      go build -trimpath -tags tools -ldflags "$ldflags" -o "$BIN_DIR/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
      mv "$BIN_DIR/$cmd.tmp" "$BIN_DIR/$cmd"
    done
  )
fi

if ! provided etcd && [[ ! -x "$BIN_DIR/etcd" ]]; then
  work="$CACHE_ROOT/src/etcd-$ETCD_VERSION"
  mkdir -p "$work"
  cat >"$work/go.mod" <<GOMOD
module waycast.dev/e2e/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat >"$work/main.go" <<'GOMAIN'
// Command etcd is the upstream etcd server, built from its module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GOMAIN
  (
    cd "$work"
    log "building etcd $ETCD_VERSION"
    go mod tidy >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }
    go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd.tmp" .
    mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
  )
fi

if [[ ! -x "$BIN_DIR/metrics-server" ]]; then
  work="$CACHE_ROOT/src/metrics-server-$METRICS_SERVER_VERSION"
  mkdir -p "$work"
  # metrics-server's own go.mod pins its Kubernetes libraries; building its
  # command from a module that requires it keeps those pins.
  cat >"$work/go.mod" <<GOMOD
module waycast.dev/e2e/metrics-server

go 1.24

require sigs.k8s.io/metrics-server $METRICS_SERVER_VERSION
GOMOD
  cat >"$work/tools.go" <<'GOTOOLS'
//go:build tools

package tools

import _ "sigs.k8s.io/metrics-server/cmd/metrics-server"
GOTOOLS
  (
    cd "$work"
    log "building metrics-server $METRICS_SERVER_VERSION"
    go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }
    go build -trimpath -tags tools -ldflags "-s -w" -o "$BIN_DIR/metrics-server.tmp" sigs.k8s.io/metrics-server/cmd/metrics-server
    mv "$BIN_DIR/metrics-server.tmp" "$BIN_DIR/metrics-server"
  )
fi

echo "$BIN_DIR"
