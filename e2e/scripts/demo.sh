#!/usr/bin/env bash
# Runs a local waycast cluster with the quickstart applied and tells the user
# how to reach it. Ctrl-C stops everything and removes its state.
set -euo pipefail
cd "$(dirname "$0")/../.."

target_dir="${CARGO_TARGET_DIR:-target}"
bin_dir="$(bash e2e/scripts/build-k8s.sh --print)"
kubectl_bin="${KUBEBUILDER_ASSETS:+$KUBEBUILDER_ASSETS/kubectl}"
[[ -x "${kubectl_bin:-}" ]] || kubectl_bin="$bin_dir/kubectl"

"$target_dir/debug/waycast-cluster" up --apply examples/quickstart/quickstart.yaml | while IFS= read -r line; do
  case "$line" in
    "ready kubeconfig="*)
      kubeconfig="${line#ready kubeconfig=}"
      state_dir="$(dirname "$kubeconfig")"
      server="$(awk '/server:/ {print $2}' "$kubeconfig")"
      cat <<MSG

waycast demo: a local control plane is running with the waycast CRDs installed
and examples/quickstart applied to the default namespace.

In another shell:
  export KUBECONFIG=$kubeconfig
  alias kubectl=$kubectl_bin
  kubectl get waycast                  # Gateways, ModelEndpoints and ApiKeys
  kubectl explain gateway.spec         # the API, documented field by field
  kubectl apply -f examples/self-service/platform.yaml

Or straight to the API:
  curl --cacert $state_dir/pki/ca.crt --cert $state_dir/pki/admin.crt --key $state_dir/pki/admin.key $server/apis/waycast.dev/v1alpha1/namespaces/default/gateways

Not running yet: the operator and gateway pods (they need the node and the
operator, which are still being built). Press Ctrl-C to stop and clean up.
MSG
      ;;
    *) echo "$line" ;;
  esac
done
