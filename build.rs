//! Build script: runs the guard on the gateway's own tools, fails the build on any path from a
//! tool to a forbidden type or call, and leaves the report in `OUT_DIR` for the binary to embed.
//!
//! It never skips the check: there is no switch to silence it.

/// Where handler-trait impls are tool roots (a tool written anywhere else is walked all the
/// same: `#[tool]` fns and `#[tool_router]` impls are roots wherever they are).
///
/// `crate::mcp` is not among them: it holds the dispatcher (rmcp's `ServerHandler` for the
/// gateway's endpoint), which by its trait's signature receives rmcp's `RequestContext` and,
/// to build `McpCallContext` and write the audit, holds the database. It is the sanctioned
/// bridge, like `McpCallContext` itself. Tools are methods of the empty `FarmTools` in
/// `crate::tools`; a tool that reached the dispatcher's state would be walked into it and fail.
const TOOL_MODULES: [&str; 1] = ["crate::tools"];
/// The shipped rules, the same file every SaaS building on the library starts from.
const RULES: &str = "guards/rules.toml";

fn main() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let options = guards::Options::new(root).tool_modules(TOOL_MODULES).rules(RULES);
    // Run by the rustc wrapper (`.cargo/config.toml`), this binary is the checker of the
    // compiled library and exits there; run by cargo, it is the build script.
    guards::run_compiled_check_if_wrapped(&options);
    // The whole tree, so a new module file is seen; the guard adds one line per parsed file.
    println!("cargo:rerun-if-changed=src");
    guards::run_build_script(&options);
}
