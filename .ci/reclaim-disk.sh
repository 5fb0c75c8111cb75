#!/usr/bin/env bash
# Makes room for a test run on a disk that is filling up, by removing only
# waycast's own caches, those cheapest to rebuild first, and stopping as
# soon as there is room. Nothing else on the machine is touched.
#
#   .ci/reclaim-disk.sh     # uses CARGO_TARGET_DIR (or the repository's target/)
#
# A target directory is waycast's only when it is the repository's own
# target/ or lies under waycast's cache (CI's): one shared with other
# projects is never emptied, only looked at.
#
# Room means: what the e2e node wants (the kubelet's 1 % eviction threshold
# plus 3 GiB, as e2e/src/node checks) plus WAYCAST_BUILD_ROOM_GIB (default
# 12) for the build itself, on the filesystem of the Cargo target directory.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
cache_root="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
build_room_gib="${WAYCAST_BUILD_ROOM_GIB:-12}"
log() { echo "reclaim-disk: $*" >&2; }

mkdir -p "$target"
target_is_ours=false
case "$(cd "$target" && pwd -P)/" in
  "$(pwd -P)/target/" | "$(mkdir -p "$cache_root" && cd "$cache_root" && pwd -P)"/*) target_is_ours=true ;;
esac
read -r available size < <(df -B1 --output=avail,size "$target" | tail -n 1)
needed=$((size / 100 + (3 + build_room_gib) * (1 << 30)))
gib() { awk -v b="$1" 'BEGIN { printf "%.1f GiB", b / 2^30 }'; }
has_room() {
  read -r available _ < <(df -B1 --output=avail,size "$target" | tail -n 1)
  ((available >= needed))
}

if has_room; then
  exit 0
fi
log "$(gib "$available") free, $(gib "$needed") wanted; what waycast's caches hold:"
du -sh "$target"/* "$cache_root"/* 2>/dev/null | sort -h | tail -n 12 >&2 || true

# Each step: a description, then the paths it removes.
remove() {
  local what="$1"
  shift
  local present=()
  for path in "$@"; do [[ -e "$path" ]] && present+=("$path"); done
  ((${#present[@]})) || return 0
  rm -rf "${present[@]}"
  mkdir -p "$target"
  log "removed $what: now $(gib "$(df -B1 --output=avail "$target" | tail -n 1)") free"
}

# Outputs of earlier commits: each build of a changed crate links new test
# binaries beside the old ones under a new hash, and nothing ever removes
# those (.ci/prune-stale-artifacts.py says which go).
prune_stale_artifacts() {
  [[ -d "$1/debug/deps" ]] || { echo 0.0; return 0; }
  python3 .ci/prune-stale-artifacts.py "$1/debug/deps"
}

if $target_is_ours; then
  log "removed $(prune_stale_artifacts "$target") GiB of earlier commits' build outputs: now $(gib "$(df -B1 --output=avail "$target" | tail -n 1)") free"
  has_room && exit 0
  remove "incremental compilation caches" "$target"/*/incremental
  has_room && exit 0
  # Profiles `make test` does not build: benchmarks and profiling.
  remove "release, profiling and bench-tool builds" "$target/release" "$target/profiling" "$target/bench-tool"
  has_room && exit 0
else
  log "$target is shared with other projects (not target/ nor under $cache_root): left alone"
fi
# The Kubernetes binaries are kept; only what built them goes: the Go
# build cache the project's builds use (never the user's own).
remove "the project's Go build cache" "$cache_root/go-build"
# Keycloak (keycloak-<version>, ~190 MB, rebuilt in under a minute) stays:
# the sign-in tests run it. Only what an interrupted install left goes.
remove "interrupted Keycloak installs" "$cache_root"/.keycloak-*
remove "Kubernetes sources" "$cache_root/src"
has_room && exit 0
if $target_is_ours; then
  remove "the whole Cargo target directory (a full rebuild follows)" "$target"
  has_room && exit 0
fi
log "still only $(gib "$available") free of $(gib "$needed") wanted, after removing every waycast cache: the rest of the disk is not ours"
exit 1
