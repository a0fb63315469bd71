# syntax=docker/dockerfile:1
#
# ambientd's container image: a static-ish release binary on distroless/cc, as a numeric
# non-root user. Build from the repository root:
#
#   docker build -t ambientd:0.1.0 .
#
# The dependency layer is cached until Cargo.toml, Cargo.lock, build.rs, proto/ or vendor/
# change: it builds every dependency against placeholder sources first. build.rs compiles proto/ with
# protox (pure Rust), so no protoc is needed.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never

# 1. Dependencies (and the generated protos), against placeholder sources. Cargo.toml names
#    its benches, so placeholders for them too.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
# h2 with ambientd's idle-connection memory patch (vendor/h2/AMBIENTD-PATCH.md).
COPY vendor vendor
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && for bench in index kube_ingest ca scale; do echo 'fn main() {}' > "benches/$bench.rs"; done \
 && cargo build --release --locked --bin ambientd \
 && rm -rf src

# 2. ambientd itself. COPY keeps the sources' old timestamps, so touch them: cargo must not
#    take the placeholder build as fresh.
COPY src src
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin ambientd \
 && cp target/release/ambientd /ambientd

# The runtime: glibc and libgcc only (distroless/cc), no shell, user nonroot (65532).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /ambientd /usr/local/bin/ambientd
USER 65532:65532
# Without --ca-dir, the self-signed CA goes to ./ambientd-ca: the nonroot user's home.
WORKDIR /home/nonroot
# 15010 plaintext delta xDS, 15012 TLS delta xDS and the CA, 15014 /ready, /metrics, /debug.
EXPOSE 15010 15012 15014
ENTRYPOINT ["/usr/local/bin/ambientd"]
CMD ["serve"]
