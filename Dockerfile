# Multi-stage build: compile in the Rust image, run in a slim Debian as a non-root user.
# BuildKit (Docker Engine 23 or later) caches the crates and the compiled dependencies between
# builds, so a change to the sources rebuilds the scopegate crate alone.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The image's own toolchain (the release rust-toolchain.toml names) builds it:
# rust-toolchain.toml is not copied, so nothing is fetched in the build but crates.
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
# The build runs the guard: build.rs installs its checker, and the rustc wrapper that
# .cargo/config.toml names walks the compiled library; cargo needs every member's manifest.
COPY .cargo ./.cargo
COPY guards ./guards
COPY examples ./examples
COPY migrations ./migrations
COPY config ./config
COPY benches ./benches
# The upstream fixture is a declared [[bin]] target; cargo needs its file to read the manifest.
COPY tests/fixtures/upstream ./tests/fixtures/upstream
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin scopegate \
 && cp target/release/scopegate /usr/local/bin/scopegate

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /var/lib/scopegate --create-home scopegate
COPY --from=build /usr/local/bin/scopegate /usr/local/bin/scopegate
# The shipped defaults, for reference; a scopegate.toml mounted here is read at start
# (SCOPEGATE_CONFIG names another file).
COPY config /etc/scopegate
USER scopegate
# A fixed mmap threshold: large request buffers are given back to the system when freed
# instead of staying in glibc's arenas (docs/benchmarks.md, "Memory").
ENV MALLOC_MMAP_THRESHOLD_=131072
WORKDIR /var/lib/scopegate
EXPOSE 8080
# Ready: /readyz answers 200 (the database reached, the identity provider's keys held).
HEALTHCHECK --interval=5s --timeout=4s --start-period=30s --retries=3 CMD ["scopegate", "health"]
ENTRYPOINT ["scopegate"]
CMD ["serve"]
