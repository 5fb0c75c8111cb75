#!/usr/bin/env bash
# Fetches ArgoCD's own CRDs (Application, AppProject) at a pinned version
# from the Go module proxy — the argo-cd module carries manifests/crds — so
# the e2e tests apply the ArgoCD examples against the real schema.
# Prints the directory that holds them.
set -euo pipefail
ARGOCD_VERSION="${WAYCAST_ARGOCD_VERSION:-v3.2.0}"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
# `go mod download` caches in the Go module cache; repeated runs are instant.
dir="$(cd / && go mod download -json "github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[[ -f "$dir/manifests/crds/application-crd.yaml" ]] || { echo "fetch-argocd-crds: no CRDs in $dir" >&2; exit 1; }
echo "$dir/manifests/crds"
