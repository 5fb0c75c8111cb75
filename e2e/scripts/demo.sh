#!/usr/bin/env bash
# Runs waycast locally: a control plane and a node on this machine, the
# operator as a pod (deploy/operator.yaml), examples/quickstart applied (an
# in-cluster inference server, a ModelEndpoint, an ApiKey, a Gateway), and a
# working curl with the generated key. Ctrl-C stops everything and cleans up.
# Needs root (the node sets up a bridge and iptables rules, and restores them).
set -euo pipefail
cd "$(dirname "$0")/../.."

target_dir="${CARGO_TARGET_DIR:-target}"
bin_dir="$(bash e2e/scripts/build-k8s.sh --print)"
kubectl_bin="$bin_dir/kubectl"

"$target_dir/debug/waycast-cluster" up --node --demo | while IFS= read -r line; do
  case "$line" in
    "demo gateway="*)
      rest="${line#demo gateway=}"
      gateway="${rest%% *}"
      key="${rest#* key=}"
      ;;
    "ready kubeconfig="*)
      kubeconfig="${line#ready kubeconfig=}"
      curl_line="curl -s http://$gateway/v1/chat/completions -H \"Authorization: Bearer $key\" -H \"Content-Type: application/json\" -d '{\"model\":\"llama3\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'"
      echo
      echo "waycast demo: a control plane and a node run here. The operator (a pod in"
      echo "waycast-system) turned examples/quickstart, applied to namespace waycast-demo,"
      echo "into two gateway pods in front of an in-cluster inference server, and"
      echo "generated the key alice. A first request through the gateway's Service:"
      echo
      for _ in $(seq 1 50); do
        if answer="$(eval "$curl_line")" && [[ "$answer" == *chat.completion* ]]; then break; fi
        sleep 0.2
      done
      echo "  $answer"
      cat <<MSG

Try it yourself (streaming: add "stream":true):
  $curl_line

Look around:
  export KUBECONFIG=$kubeconfig
  alias kubectl=$kubectl_bin
  kubectl get pods -A -o wide
  kubectl top pods -n waycast-demo     # metrics-server, after ~15 s
  kubectl get waycast -n waycast-demo  # Gateway, ModelEndpoint and ApiKey with their status
  kubectl patch ak alice -n waycast-demo --type merge -p '{"spec":{"disabled":true}}'   # → 401 in < 1 s

Press Ctrl-C to stop; the machine is left as it was found.
MSG
      ;;
    *) echo "$line" ;;
  esac
done
