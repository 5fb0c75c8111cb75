#!/usr/bin/env bash
# Creates (once) a virtualenv with the official OpenAI Python SDK for the
# SDK compatibility test, outside the repository, and prints its python.
set -euo pipefail
OPENAI_VERSION="${WAYCAST_OPENAI_SDK_VERSION:-3.54.0}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
VENV="$CACHE_ROOT/venv-openai-$OPENAI_VERSION"
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" >&2
fi
echo "$VENV/bin/python"
