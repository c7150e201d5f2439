# Multi-stage build: compile in the Rust image, run in a slim Debian as a non-root user.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rust-toolchain.toml build.rs ./
COPY src ./src
# The build runs the guard (build.rs); cargo needs every workspace member's manifest.
COPY guards ./guards
COPY examples ./examples
COPY migrations ./migrations
COPY config ./config
COPY benches ./benches
# The upstream fixture is a declared [[bin]] target; cargo needs its file to read the manifest.
COPY tests/fixtures/upstream ./tests/fixtures/upstream
RUN cargo build --release --locked --bin scopegate

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /var/lib/scopegate --create-home scopegate
COPY --from=build /src/target/release/scopegate /usr/local/bin/scopegate
COPY config /etc/scopegate
USER scopegate
# A fixed mmap threshold: large request buffers are given back to the system when freed
# instead of staying in glibc's arenas (docs/benchmarks.md, "Memory").
ENV MALLOC_MMAP_THRESHOLD_=131072
WORKDIR /var/lib/scopegate
EXPOSE 8080
ENTRYPOINT ["scopegate"]
CMD ["serve"]
