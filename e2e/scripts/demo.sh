#!/usr/bin/env bash
# Runs waycast locally: a control plane and a node on this machine, the mock
# upstream as an in-cluster inference server, two gateway pods in front of
# it, and a working curl. Ctrl-C stops everything and cleans up. Needs root
# (the node sets up a bridge and iptables rules, and restores them).
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
      echo "waycast demo: a control plane and a node are running here; in namespace"
      echo "waycast-demo, the mock upstream serves as an inference server and two"
      echo "gateway pods (config from a Secret, read with their own ServiceAccount)"
      echo "stand in front of it. A first request through the gateway's ClusterIP:"
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
  kubectl get waycast -A               # the waycast.dev API (the operator is not built yet)

Press Ctrl-C to stop; the machine is left as it was found.
MSG
      ;;
    *) echo "$line" ;;
  esac
done
