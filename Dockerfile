# syntax=docker/dockerfile:1
# waycast's images for users who build with Docker:
#   docker build --target gateway  -t waycast/gateway:0.1.0 .
#   docker build --target operator -t waycast/operator:0.1.0 .
#   docker build --target bench    -t waycast/bench:0.1.0 .     (the load generator)
# The final images hold one static-ish binary on distroless/cc (glibc and
# libgcc only, no shell, no package manager) and run as the non-root user
# 65532. The project's own packer (`make images`, e2e/src/image.rs) builds
# the same layout without a Docker engine: the binary at /<name> as the
# entrypoint, user 65532:65532 — a test checks this file agrees with it.

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The release profile (LTO, one codegen unit, panic=abort, stripped) is in
# Cargo.toml; the cache mounts keep rebuilds incremental.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p waycast-gateway -p waycast-operator \
    && cargo build --profile bench-tool --locked -p waycast-bench \
    && install -D target/release/waycast-gateway /out/waycast-gateway \
    && install -D target/release/waycast-operator /out/waycast-operator \
    && install -D target/bench-tool/waycast-bench /out/waycast-bench

FROM gcr.io/distroless/cc-debian12:nonroot AS gateway
COPY --from=build /out/waycast-gateway /waycast-gateway
USER 65532:65532
# 8080 serves the API, 9090 /metrics, /healthz and /readyz.
EXPOSE 8080 9090
ENTRYPOINT ["/waycast-gateway"]

FROM gcr.io/distroless/cc-debian12:nonroot AS operator
COPY --from=build /out/waycast-operator /waycast-operator
USER 65532:65532
# 8080 serves /metrics, /healthz and /readyz.
EXPOSE 8080
ENTRYPOINT ["/waycast-operator"]

FROM gcr.io/distroless/cc-debian12:nonroot AS bench
COPY --from=build /out/waycast-bench /waycast-bench
USER 65532:65532
# 8090: the page, the REST API (/runs) and the sink (/v1).
EXPOSE 8090
ENTRYPOINT ["/waycast-bench"]
