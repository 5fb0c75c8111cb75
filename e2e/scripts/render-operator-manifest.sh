#!/usr/bin/env bash
# Renders deploy/operator.yaml from the Helm chart, so that kubectl-only
# installs get exactly the objects (and RBAC) the chart installs.
#
#   e2e/scripts/render-operator-manifest.sh            # rewrite deploy/operator.yaml
#   e2e/scripts/render-operator-manifest.sh --stdout   # print it instead
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
helm="$(bash "$root/e2e/scripts/build-helm.sh")"
render() {
  cat <<'HEADER'
# The waycast operator with least-privilege RBAC, for installs without Helm.
# GENERATED from charts/waycast by `make generate` (do not edit): the chart is
# the one source. Apply the CRDs first, then this file:
#   kubectl apply --server-side -f crds/yaml/ && kubectl apply --server-side -f deploy/operator.yaml
# Images are the locally built :dev tags; the chart defaults to its appVersion.
apiVersion: v1
kind: Namespace
metadata:
  name: waycast-system
HEADER
  "$helm" template waycast "$root/charts/waycast" --namespace waycast-system --kube-version 1.34.0 \
    --set operator.image.tag=dev --set gatewayImage.tag=dev \
    | sed 's|app.kubernetes.io/managed-by: Helm|app.kubernetes.io/managed-by: kubectl|'
}
if [[ "${1:-}" == "--stdout" ]]; then
  render
else
  render >"$root/deploy/operator.yaml.tmp"
  mv "$root/deploy/operator.yaml.tmp" "$root/deploy/operator.yaml"
fi
