#!/usr/bin/env bash
# Installs (once) Claude Code from the npm registry, outside the
# repository, and prints the path of its CLI (run with the machine's node).
# 2.1.100 is the last release that is a JavaScript CLI on Node 18 or newer;
# later ones are a native binary needing Node 22.
set -euo pipefail
VERSION="${WAYCAST_CLAUDE_CODE_VERSION:-2.1.100}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
DIR="$CACHE_ROOT/tools/claude-code-$VERSION"
CLI="$DIR/node_modules/@anthropic-ai/claude-code/cli.js"
if [[ ! -f "$CLI" ]]; then
  rm -rf "$DIR"
  mkdir -p "$DIR"
  (cd "$DIR" && npm install --no-audit --no-fund --silent "@anthropic-ai/claude-code@$VERSION" >&2)
fi
echo "$CLI"
