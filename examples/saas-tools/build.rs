//! Build script: the scopegate guard, with the shipped rules plus this crate's `guards.toml`.
//! Run by cargo, it leaves the checker in `OUT_DIR`; run by the workspace's rustc wrapper, it
//! is that checker: it walks the library rustc compiles, fails the compilation on any path
//! from a tool to a forbidden item, and leaves the report (Markdown, JSON, SARIF) in `OUT_DIR`.

fn main() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    // No `.rules(..)`: the rules shipped inside the guard crate, the gateway's own file.
    let options = guards::Options::new(root).extra_rules("guards.toml");
    guards::run_build_script(&options);
}
