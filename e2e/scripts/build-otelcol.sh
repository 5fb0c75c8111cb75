#!/usr/bin/env bash
# Builds a minimal OpenTelemetry Collector the telemetry tests send to —
# the OTLP receiver and the debug and file exporters, nothing else — from
# the Go module proxy, at pinned versions, into a cache outside the
# repository. (The project's own `otelcorecol` is not on the proxy: this is
# the main.go its builder generates, written out.)
#
#   e2e/scripts/build-otelcol.sh            # build (or reuse) it; prints its path
#   e2e/scripts/build-otelcol.sh --print    # print the path without building
set -euo pipefail

# Core modules at one release, the stable ones at theirs (v0.161.0 pairs
# with v1.67.0).
OTELCOL_VERSION="${WAYCAST_OTELCOL_VERSION:-v0.161.0}"
OTELCOL_STABLE="${WAYCAST_OTELCOL_STABLE:-v1.67.0}"
CACHE_ROOT="${WAYCAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/waycast}"
OTELCOL_BIN="$CACHE_ROOT/otelcol-$OTELCOL_VERSION/bin/otelcol"

source "$(dirname "$0")/go-tool.sh"
go_tool_begin otelcol "$OTELCOL_VERSION" "$OTELCOL_BIN" "$@"

cat >"$GO_TOOL_WORK/go.mod" <<GOMOD
module waycast.dev/e2e/otelcol

go 1.26

require (
	github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter $OTELCOL_VERSION
	go.opentelemetry.io/collector/component $OTELCOL_STABLE
	go.opentelemetry.io/collector/confmap $OTELCOL_STABLE
	go.opentelemetry.io/collector/confmap/provider/envprovider $OTELCOL_STABLE
	go.opentelemetry.io/collector/confmap/provider/fileprovider $OTELCOL_STABLE
	go.opentelemetry.io/collector/exporter $OTELCOL_STABLE
	go.opentelemetry.io/collector/exporter/debugexporter $OTELCOL_VERSION
	go.opentelemetry.io/collector/otelcol $OTELCOL_VERSION
	go.opentelemetry.io/collector/receiver $OTELCOL_STABLE
	go.opentelemetry.io/collector/receiver/otlpreceiver $OTELCOL_VERSION
	go.opentelemetry.io/collector/service $OTELCOL_VERSION
)
GOMOD
cat >"$GO_TOOL_WORK/main.go" <<'GOMAIN'
// Command otelcol is a minimal OpenTelemetry Collector: the OTLP receiver
// and the debug and file exporters.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	factories := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	var err error
	if factories.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return factories, err
	}
	factories.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](debugexporter.NewFactory(), fileexporter.NewFactory())
	return factories, err
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol", Description: "waycast test collector", Version: "0.161.0"},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{envprovider.NewFactory(), fileprovider.NewFactory()},
				DefaultScheme:     "env",
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
GOMAIN
go_tool_build . "$OTELCOL_BIN" -ldflags "-s -w"

echo "$OTELCOL_BIN"
