//! Build script: the guard. Run by cargo, it leaves the checker in `OUT_DIR`; run by the
//! workspace's rustc wrapper (`.cargo/config.toml`), it is that checker: it compiles the
//! library as cargo asked, walks what rustc compiled from every tool the library serves,
//! fails the compilation on any path to a forbidden type or call, and leaves the report in
//! `OUT_DIR` for the binary to embed.
//!
//! It never skips the check: there is no switch to silence it.

/// The shipped rules, the same file every SaaS building on the library starts from.
const RULES: &str = "guards/rules.toml";

fn main() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    guards::run_build_script(&guards::Options::new(root).rules(RULES));
}
