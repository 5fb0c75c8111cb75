#!/usr/bin/env bash
# cargo-deny over the workspace (deny.toml): bans, licenses, sources, and
# advisories against the RustSec database. Exits non-zero when any check
# fails, and when advisories could not be checked at all.
#
# The database is a git repository on GitHub. Where it cannot be fetched,
# a snapshot is used instead, and must be recent:
#   WAYCAST_ADVISORY_DB=PATH   a git clone of the advisory database, or a
#                              .tar.gz/.tgz holding one (with its .git)
#   else the copy a previous fetch left in $CARGO_HOME/advisory-dbs
#   WAYCAST_ADVISORIES_WAIVED=REASON  with no database at all, pass with a
#                              loud line naming REASON (only .ci/run sets it)
# A snapshot's age is its HEAD commit's date (not a file time, which a copy
# would reset); older than WAYCAST_ADVISORY_MAX_AGE_DAYS (default 30) fails.
#
# First a self-test: the workspace against a one-advisory database
# (.ci/advisory-fixture: a made-up advisory for a crate in Cargo.lock) must
# fail, and a stale snapshot must be refused — so a pass below means the
# check read a database, not that it looked at nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.20.2
max_age_days="${WAYCAST_ADVISORY_MAX_AGE_DAYS:-30}"
tools="${WAYCAST_TOOLS:-$HOME/.cache/waycast/tools}"
deny="$tools/bin/cargo-deny"
if [[ "$("$deny" --version 2>/dev/null || true)" != "cargo-deny $version" ]]; then
  echo "deny: installing cargo-deny $version into $tools (once)" >&2
  # Its own temporary build directory, not the workspace's target dir.
  env -u CARGO_TARGET_DIR cargo install --locked --quiet cargo-deny --version "$version" --root "$tools"
fi

"$deny" --color never check --hide-inclusion-graph bans licenses sources

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# deny.toml with the advisory databases under $1 (cargo-deny keeps each in
# a directory named after its URL there).
config_with_db_path() {
  sed "s|^\[advisories\]$|[advisories]\ndb-path = \"$1\"|" deny.toml >"$work/deny-$2.toml"
  echo "$work/deny-$2.toml"
}

# The directory cargo-deny opens for the default database under the
# db-path of config $1 (a name derived from the database's URL).
db_dir_of() {
  "$deny" --color never -L debug --config "$1" --offline check advisories 2>&1 |
    sed -n "s/.*Opening advisory database at '\(.*\)'.*/\1/p" | head -1 || true
}

# The age in days of the git checkout at $1 by its HEAD commit.
age_days() {
  local committed
  committed="$(git -C "$1" log -1 --format=%ct HEAD)"
  echo $((($(date +%s) - committed) / 86400))
}

# Runs the advisory check, without fetching, against the checkout at $1
# (copied where cargo-deny looks for it under a db-path of its own).
check_against() {
  local config dir
  config="$(config_with_db_path "$work/dbs-$2" "$2")"
  dir="$(db_dir_of "$config")"
  [[ -n "$dir" ]] || {
    echo "deny: cargo-deny $version did not say where it opens the advisory database" >&2
    return 2
  }
  rm -rf "$dir" && mkdir -p "$(dirname "$dir")" && cp -a "$1" "$dir"
  "$deny" --color never --config "$config" --offline check --hide-inclusion-graph advisories
}

# A git checkout of .ci/advisory-fixture committed $1 days ago, at $2.
fixture_db() {
  rm -rf "$2" && cp -a .ci/advisory-fixture "$2"
  local when
  when="$(date -u -d "@$(($(date +%s) - $1 * 86400))" +%Y-%m-%dT%H:%M:%SZ)"
  git -C "$2" init -q -b main
  git -C "$2" add -A
  GIT_AUTHOR_DATE="$when" GIT_COMMITTER_DATE="$when" git -C "$2" \
    -c user.name=waycast -c user.email=waycast@invalid commit -q -m fixture
}

# --- self-test --------------------------------------------------------------
fixture_db 0 "$work/fixture"
if check_against "$work/fixture" selftest >"$work/selftest.log" 2>&1; then
  cat "$work/selftest.log" >&2
  echo "deny: SELF-TEST FAILED: the made-up advisory for itoa was not reported (itoa must stay in Cargo.lock for this fixture); the advisory check checks nothing" >&2
  exit 1
elif ! grep -q "RUSTSEC-2000-0001" "$work/selftest.log"; then
  cat "$work/selftest.log" >&2
  echo "deny: SELF-TEST FAILED: the advisory check failed without naming the made-up advisory" >&2
  exit 1
fi
fixture_db $((max_age_days + 1)) "$work/stale"
if (($(age_days "$work/stale") <= max_age_days)); then
  echo "deny: SELF-TEST FAILED: a snapshot $((max_age_days + 1)) days old was not seen as stale" >&2
  exit 1
fi
echo "deny: self-test passed: a database with a matching advisory fails the check, a stale one is refused" >&2

# --- the real database --------------------------------------------------------
default_dbs="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
if timeout 120 "$deny" --color never fetch db >/dev/null 2>&1; then
  exec "$deny" --color never check --hide-inclusion-graph advisories
fi

snapshot=""
if [[ -n "${WAYCAST_ADVISORY_DB:-}" ]]; then
  case "$WAYCAST_ADVISORY_DB" in
    *.tar.gz | *.tgz)
      mkdir -p "$work/unpacked"
      tar -xzf "$WAYCAST_ADVISORY_DB" -C "$work/unpacked"
      snapshot="$(dirname "$(find "$work/unpacked" -maxdepth 3 -name .git -print -quit)")"
      ;;
    *) snapshot="$WAYCAST_ADVISORY_DB" ;;
  esac
  [[ -d "$snapshot/.git" && -d "$snapshot/crates" ]] || {
    echo "deny: FAILED: WAYCAST_ADVISORY_DB=$WAYCAST_ADVISORY_DB is not a git checkout of the RustSec advisory database" >&2
    exit 1
  }
elif compgen -G "$default_dbs/advisory-db-*/crates" >/dev/null; then
  snapshot="$(dirname "$(compgen -G "$default_dbs/advisory-db-*/crates" | head -1)")"
fi

if [[ -z "$snapshot" && -n "${WAYCAST_ADVISORIES_WAIVED:-}" ]]; then
  # An explicit, named waiver (set by .ci/run, never by default): the run
  # says loudly that advisories were not checked and why, and passes.
  echo "deny: *** ADVISORIES NOT CHECKED (waived: $WAYCAST_ADVISORIES_WAIVED) ***; bans, licenses and sources passed. See docs/testing.md, \"Advisories\"." >&2
  exit 0
fi
if [[ -z "$snapshot" ]]; then
  echo "deny: FAILED: advisories NOT checked: the RustSec database (github.com/RustSec/advisory-db) cannot be fetched from this machine, WAYCAST_ADVISORY_DB is not set and no copy is in $default_dbs (bans, licenses and sources passed). See docs/testing.md, \"Advisories\"." >&2
  exit 1
fi
age="$(age_days "$snapshot")"
committed="$(git -C "$snapshot" log -1 --format=%cs HEAD)"
if ((age > max_age_days)); then
  echo "deny: FAILED: the advisory snapshot at $snapshot is $age days old (last advisory commit $committed; at most $max_age_days allowed: WAYCAST_ADVISORY_MAX_AGE_DAYS)" >&2
  exit 1
fi
echo "deny: the RustSec database cannot be fetched; checking advisories against the snapshot at $snapshot ($age days old, last commit $committed)" >&2
check_against "$snapshot" snapshot
