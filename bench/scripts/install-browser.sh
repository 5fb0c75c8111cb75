#!/usr/bin/env bash
# Installs Debian's Chromium for the page test (bench/tests/page.rs drives
# waycast-bench's page in it, headless). Idempotent; quiet when it is there.
set -euo pipefail
if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
  echo "install-browser: installing chromium" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium >&2
fi
