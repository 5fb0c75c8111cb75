#!/usr/bin/env bash
# Creates (once) a virtualenv with the official OpenAI and Anthropic Python
# SDKs for the SDK compatibility tests, outside the repository, and prints
# its python.
set -euo pipefail
OPENAI_VERSION="${WAYCAST_OPENAI_SDK_VERSION:-3.54.0}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
ANTHROPIC_VERSION="${WAYCAST_ANTHROPIC_SDK_VERSION:-2.14.0}"
VENV="$CACHE_ROOT/venv-openai-$OPENAI_VERSION-anthropic-$ANTHROPIC_VERSION"
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c "import openai, anthropic" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION" >&2
fi
echo "$VENV/bin/python"
