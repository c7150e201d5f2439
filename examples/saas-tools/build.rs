//! Build script: runs the scopegate guard on this crate's own tools with the shipped rules
//! plus this crate's `guards.toml`, fails the build on any forbidden path, and leaves the
//! report (Markdown, JSON, SARIF) in `OUT_DIR`.

fn main() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    // No `.rules(..)`: the rules shipped inside the guard crate, the gateway's own file.
    let options = guards::Options::new(root).tool_modules(["crate::tools"]).extra_rules("guards.toml");
    // Run by the workspace's rustc wrapper, this binary checks the compiled library and exits.
    guards::run_compiled_check_if_wrapped(&options);
    // Any file under src/, so a new tool module is seen as soon as it exists.
    println!("cargo:rerun-if-changed=src");
    guards::run_build_script(&options);
}
