# Sourced by the build-*.sh scripts that build a Go command from the Go
# module proxy into a cache outside the repository. Each script names its
# tool, version and binary, writes its throwaway module into $GO_TOOL_WORK,
# then calls go_tool_build.
#
#   go_tool_begin NAME VERSION BINARY_PATH "$@"
#     prints the binary's path and exits when it is already built or when
#     the script was called with --print; otherwise sets up the Go
#     environment (its own build cache, no cgo, no toolchain download) and
#     $GO_TOOL_WORK, and returns.
#   go_tool_module MODULE_REQUIREMENT VERSION PACKAGE...
#     writes the throwaway module: a go.mod requiring MODULE_REQUIREMENT at
#     VERSION (so the tool keeps its own dependency pins) and a tools.go
#     importing each PACKAGE.
#   go_tool_build PACKAGE OUTPUT [go build flags ...]
#     tidies the module (printing the log on failure) and builds PACKAGE
#     into OUTPUT, atomically.

go_tool_begin() {
  local name="$1" version="$2" binary="$3"
  shift 3
  if [[ "${1:-}" == "--print" || -x "$binary" ]]; then
    echo "$binary"
    exit 0
  fi
  export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local GOCACHE="$CACHE_ROOT/go-build"
  GO_TOOL_NAME="$name"
  GO_TOOL_WORK="$CACHE_ROOT/src/$name-$version"
  mkdir -p "$GO_TOOL_WORK" "$(dirname "$binary")"
  echo "build-$name: building $name $version" >&2
}

go_tool_module() {
  local requirement="$1" version="$2"
  shift 2
  printf 'module waycast.dev/e2e/%s\n\ngo 1.26\n\nrequire %s %s\n' "$GO_TOOL_NAME" "$requirement" "$version" \
    >"$GO_TOOL_WORK/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    printf '\t_ "%s"\n' "$@"
    printf ')\n'
  } >"$GO_TOOL_WORK/tools.go"
}

go_tool_tidied=""

go_tool_build() {
  local package="$1" output="$2"
  shift 2
  (
    cd "$GO_TOOL_WORK"
    if [[ -z "$go_tool_tidied" ]]; then
      go mod tidy -e >/dev/null 2>"$GO_TOOL_WORK/tidy.log" || { cat "$GO_TOOL_WORK/tidy.log" >&2; exit 1; }
    fi
    go build -trimpath "$@" -o "$output.tmp" "$package"
    mv "$output.tmp" "$output"
  )
  go_tool_tidied=1
}
