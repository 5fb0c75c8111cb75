#!/usr/bin/env bash
# Installs the peers `make bench-peers` measures waycast against, each from
# the registry a user would take it from, outside the repository (cached):
#   nginx    Debian's package (the physical-limit reference; its service is never started)
#   onwards  crates.io (`cargo install`, pinned, --locked)
#   LiteLLM  PyPI (its proxy extra, in a virtualenv of its own)
# Prints one `NAME=PATH` line per installed peer on stdout. A peer that fails
# to install is reported on stderr and left out: the bench runs the others.
# Idempotent; quiet when everything is already there.
set -uo pipefail
ONWARDS_VERSION="${WAYCAST_ONWARDS_VERSION:-1.2.0}"
# 1.106 and later require a certifi release the index did not serve on 2026-11-23.
LITELLM_VERSION="${WAYCAST_LITELLM_VERSION:-1.100.0}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}/peers"
mkdir -p "$CACHE_ROOT"

install_nginx() {
  if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
    echo "install-peers: installing nginx from Debian" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || return 1
    # The package's own service must not start (port 80, a system-wide
    # config); the bench runs nginx with a config of its own.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    apt-get install -y -qq --no-install-recommends nginx >&2
    local status=$?
    rm -f /usr/sbin/policy-rc.d
    ((status == 0)) || return 1
  fi
  echo "nginx=$(command -v nginx || echo /usr/sbin/nginx)"
}

install_onwards() {
  local root="$CACHE_ROOT/onwards-$ONWARDS_VERSION"
  if [[ ! -x "$root/bin/onwards" ]]; then
    echo "install-peers: building onwards $ONWARDS_VERSION from crates.io (several minutes)" >&2
    # Its own target dir, so it never churns the project's.
    CARGO_TARGET_DIR="$CACHE_ROOT/onwards-build" \
      cargo install --quiet --locked --version "$ONWARDS_VERSION" --root "$root" onwards >&2 || return 1
    rm -rf "$CACHE_ROOT/onwards-build"
  fi
  echo "onwards=$root/bin/onwards"
}

install_litellm() {
  local venv="$CACHE_ROOT/litellm-$LITELLM_VERSION"
  if [[ ! -x "$venv/bin/litellm" ]] || ! "$venv/bin/python" -c "import litellm.proxy.proxy_server" 2>/dev/null; then
    echo "install-peers: installing LiteLLM $LITELLM_VERSION from PyPI" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 || return 1
    "$venv/bin/pip" install --quiet --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION" >&2 || return 1
  fi
  echo "litellm=$venv/bin/litellm"
}

for peer in ${WAYCAST_PEERS:-nginx onwards litellm}; do
  "install_$peer" || echo "install-peers: $peer could not be installed; the bench leaves it out" >&2
done
