#!/usr/bin/env bash
# Installs what the e2e node needs from Debian's packages: containerd, runc,
# the CNI plugins, iptables, conntrack and iproute2; and the Lua 5.1
# interpreter the ArgoCD health-check tests run (ArgoCD's Lua is 5.1); redis-server for the
# rate-limit tests in Redis mode (started by the tests, never as a service). Idempotent; quiet when
# everything is already there.
set -euo pipefail
packages=(containerd runc containernetworking-plugins iptables conntrack iproute2 kmod lua5.1 redis-server)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "install-node-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # NB: --no-install-recommends keeps Docker-ish extras out; the packages'
  # own services are never started (policy-rc.d below, and no systemd here).
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  rm -f /usr/sbin/policy-rc.d
fi
