//! Build script: runs the scopegate guard on this crate's own tools with the shipped rules
//! plus this crate's `guards.toml`, fails the build on any forbidden path, and leaves the
//! report (Markdown, JSON, SARIF) in `OUT_DIR`.

fn main() {
    // Any file under src/, so a new tool module is seen as soon as it exists.
    println!("cargo:rerun-if-changed=src");
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    guards::run_build_script(
        // No `.rules(..)`: the rules shipped inside the guard crate, the gateway's own file.
        &guards::Options::new(root).tool_modules(["crate::tools"]).extra_rules("guards.toml"),
    );
}
