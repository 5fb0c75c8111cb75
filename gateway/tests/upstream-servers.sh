#!/usr/bin/env bash
# The real, non-hyper HTTP/1.1 servers the upstream client is tested
# against (gateway/src/upstream/http1_servers.rs), installed outside the
# repository, each from the registry a user would take it from:
#   nginx    Debian's package (its own service is never started)
#   uvicorn  PyPI, with h11 as its HTTP/1.1 parser, in a virtualenv of its own
# Prints `nginx=PATH` and `uvicorn_python=PATH`. With `--find` it installs
# nothing and exits 1 when one is missing (what the test runs). Idempotent;
# `make upstream-servers` (a prerequisite of `make test`) runs it.
set -euo pipefail
UVICORN_VERSION="${WAYCAST_UVICORN_VERSION:-0.54.0}"
H11_VERSION="${WAYCAST_H11_VERSION:-0.16.0}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
VENV="$CACHE_ROOT/venv-uvicorn-$UVICORN_VERSION-h11-$H11_VERSION"
find_only=false
[[ "${1:-}" == "--find" ]] && find_only=true

nginx_path() { command -v nginx 2>/dev/null || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; } || true; }

if [[ -z "$(nginx_path)" ]]; then
  $find_only && { echo "upstream-servers: nginx is not installed (make upstream-servers)" >&2; exit 1; }
  echo "upstream-servers: installing nginx from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # The package's own service must not start (port 80, a system-wide
  # config); the test runs nginx with a config of its own.
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  status=0
  apt-get install -y -qq --no-install-recommends nginx >&2 || status=$?
  rm -f /usr/sbin/policy-rc.d
  ((status == 0)) || exit "$status"
fi

if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c "import uvicorn, h11" 2>/dev/null; then
  $find_only && { echo "upstream-servers: no uvicorn $UVICORN_VERSION with h11 in $VENV (make upstream-servers)" >&2; exit 1; }
  echo "upstream-servers: installing uvicorn $UVICORN_VERSION and h11 $H11_VERSION from PyPI" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "uvicorn==$UVICORN_VERSION" "h11==$H11_VERSION" >&2
fi

echo "nginx=$(nginx_path)"
echo "uvicorn_python=$VENV/bin/python"
