#!/usr/bin/env bash
# cargo-deny over the workspace (deny.toml): bans, licenses and sources
# always; advisories against the RustSec database when it can be had. The
# database is a git repository on GitHub, which some build machines cannot
# reach: then a copy already on disk is used, and without one the run says
# plainly that advisories were not checked instead of failing or pretending.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.20.2
tools="${WAYCAST_TOOLS:-$HOME/.cache/waycast/tools}"
deny="$tools/bin/cargo-deny"
if [[ "$("$deny" --version 2>/dev/null || true)" != "cargo-deny $version" ]]; then
  echo "deny: installing cargo-deny $version into $tools (once)" >&2
  # Its own temporary build directory, not the workspace's target dir.
  env -u CARGO_TARGET_DIR cargo install --locked --quiet cargo-deny --version "$version" --root "$tools"
fi

"$deny" --color never check --hide-inclusion-graph bans licenses sources

databases="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
if timeout 120 "$deny" --color never fetch db >/dev/null 2>&1; then
  "$deny" --color never check advisories
elif compgen -G "$databases/advisory-db-*/crates" >/dev/null; then
  echo "deny: the RustSec database cannot be fetched; checking advisories against the copy in $databases" >&2
  "$deny" --color never check --disable-fetch advisories
else
  echo "deny: advisories NOT checked: the RustSec database (github.com/RustSec/advisory-db) cannot be fetched from this machine and no copy is in $databases; bans, licenses and sources passed" >&2
fi
