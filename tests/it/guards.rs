//! The guard as part of the gateway's build: the real sources pass; a tool that reaches a pool
//! through a helper fails with the whole path; `scopegate guards report` prints the report of
//! the sources the binary was built from; the SaaS example is guarded by its own rules.
//!
//! The guard library is run directly on copies of the sources (what `build.rs` does, without
//! a cargo build per case); `a_violating_tool_fails_cargo_build` runs one real build.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The options `build.rs` runs the guard with.
fn gateway_options(root: &Path) -> guards::Options {
    guards::Options::new(root).tool_modules(["crate::tools"]).rules(workspace().join("guards/rules.toml"))
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// 1-based line of the first line of `file` (relative to `root`) containing `needle`.
fn line_of(root: &Path, file: &str, needle: &str) -> usize {
    let text = std::fs::read_to_string(root.join(file)).unwrap();
    text.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("{file} has no line with {needle:?}")) + 1
}

/// Appends `mod_line` to the copy's `src/lib.rs` and writes `files` (relative paths).
fn add_sources(root: &Path, mod_line: &str, files: &[(&str, &str)]) {
    let lib = root.join("src/lib.rs");
    let mut text = std::fs::read_to_string(&lib).unwrap();
    text.push_str(mod_line);
    std::fs::write(&lib, text).unwrap();
    for (path, body) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }
}

/// The gateway's `src/` with an export tool whose helper holds the store's `Db` (and so its
/// pool): the tool's own signature is clean, only the dependency graph is not.
fn gateway_with_violating_tool(dir: &Path) {
    crate::support::copy_dir(&workspace().join("src"), &dir.join("src"));
    // The guard reads the manifest's dependencies to tell other crates' names from unresolved ones.
    std::fs::copy(workspace().join("Cargo.toml"), dir.join("Cargo.toml")).unwrap();
    let probe = ("src/tools/guard_probe_export.rs", EXPORT_TOOL);
    // Once the real tools module exists, the probe goes beside its tools.
    match ["src/tools/mod.rs", "src/tools.rs"].into_iter().find(|m| dir.join(m).exists()) {
        Some(module) => {
            let module = dir.join(module);
            let mut text = std::fs::read_to_string(&module).unwrap();
            text.push_str("\npub mod guard_probe_export;\n");
            std::fs::write(&module, text).unwrap();
            std::fs::write(dir.join(probe.0), probe.1).unwrap();
        }
        None => add_sources(dir, "\npub mod tools;\n", &[("src/tools/mod.rs", "pub mod guard_probe_export;\n"), probe]),
    }
}

const EXPORT_TOOL: &str = r#"//! A tool that looks scoped: it takes only the call context and its parameters.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::tool;

use crate::McpCallContext;
use crate::store::Db;

pub struct ExportTools {
    exporter: Exporter,
}

/// "Just a helper": it keeps the database handle for a bulk export.
struct Exporter {
    db: Db,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
pub struct ExportParams {
    pub flock: String,
}

impl ExportTools {
    #[tool(description = "Export a flock")]
    async fn export_flock(
        &self,
        ctx: McpCallContext,
        Parameters(params): Parameters<ExportParams>,
    ) -> String {
        format!("{} {}", ctx.tenant_slug(), params.flock)
    }
}
"#;

#[test]
fn the_gateway_sources_pass_the_guard() {
    let root = workspace();
    let report = guards::check(&gateway_options(&root)).unwrap();
    assert_eq!(guards::failure_message(&report), None, "the gateway's own tools reach forbidden types");
    // The boundary is the real McpCallContext, and its insides were audited.
    let boundary = &report.boundaries[0];
    assert_eq!(boundary.name, "McpCallContext");
    let defined = boundary.defined_at.as_ref().expect("McpCallContext found");
    assert_eq!(defined.file, "src/identity/context.rs");
    // A tool module that exists must yield tools: a rename must not empty the walk.
    for (module, paths) in [("crate::tools", ["src/tools", "src/tools.rs"])] {
        if paths.iter().any(|p| root.join(p).exists()) {
            assert!(
                report.tools.iter().any(|t| t.module == module || t.module.starts_with(&format!("{module}::"))),
                "{module} exists but the guard found no tool in it"
            );
        }
    }
}

#[test]
fn a_tool_whose_helper_holds_the_store_fails_the_guard_with_the_whole_path() {
    let dir = tempfile::tempdir().unwrap();
    gateway_with_violating_tool(dir.path());
    let report = guards::check(&gateway_options(dir.path())).unwrap();
    let msg = guards::failure_message(&report).expect("the violating tool is caught");

    let tool = "src/tools/guard_probe_export.rs";
    let store = "src/store/mod.rs";
    let at = |file: &str, needle: &str| format!("({file}:{})", line_of(dir.path(), file, needle));
    let expected = [
        format!("   -> tool ExportTools::export_flock {}\n", at(tool, "fn export_flock")),
        format!("   -> field exporter {}\n", at(tool, "exporter: Exporter")),
        format!("   -> field db {}\n", at(tool, "db: Db")),
        format!(
            "   -> type crate::store::Db ({store}:{}, used at {tool}:{})\n",
            line_of(dir.path(), store, "pub struct Db"),
            line_of(dir.path(), tool, "db: Db")
        ),
        format!("   -> field pool {}\n", at(store, "pool: AnyPool")),
    ];
    let mut rest = msg.as_str();
    for hop in &expected {
        let i = rest.find(hop.as_str()).unwrap_or_else(|| panic!("missing hop, in order: {hop:?}\n{msg}"));
        rest = &rest[i + hop.len()..];
    }
    assert!(
        msg.contains("[G2] ExportTools::export_flock reaches forbidden sqlx::") && msg.contains("AnyPool"),
        "{msg}"
    );
    assert!(rest.contains("AnyPool ("), "the path ends at the pool\n{msg}");
}

/// One real `cargo build`: the gateway's `build.rs`, the guard crate and the sources with the
/// violating tool, under a manifest that keeps only the guard as a build dependency, so the
/// build stops at the build script (about 15 s with a cold target directory, a few seconds
/// after that: the target directory is kept in cargo's test tmpdir).
#[test]
fn a_violating_tool_fails_cargo_build() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    gateway_with_violating_tool(root);
    for file in ["build.rs", "Cargo.lock", "rust-toolchain.toml"] {
        std::fs::copy(workspace().join(file), root.join(file)).unwrap();
    }
    std::fs::create_dir_all(root.join("guards")).unwrap();
    std::fs::copy(workspace().join("guards/rules.toml"), root.join("guards/rules.toml")).unwrap();
    let guards_crate = workspace().join("guards");
    std::fs::write(
        root.join("Cargo.toml"),
        format!(
            "[package]\nname = \"scopegate\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [build-dependencies]\nguards = {{ path = {:?} }}\n\n[workspace]\n\n\
             # The gateway's dependencies, for the guard to know them; never built (no target matches).\n\
             [target.'cfg(any())'.dependencies]\n{}",
            guards_crate.to_str().unwrap(),
            dependencies_table()
        ),
    )
    .unwrap();

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("guards-cargo-build"))
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the build must fail\n{stderr}");
    assert!(stderr.contains("failed to run custom build command for `scopegate"), "{stderr}");
    let tool = "src/tools/guard_probe_export.rs";
    for needle in [
        "forbidden path(s) from tools".to_owned(),
        "[G2] ExportTools::export_flock reaches forbidden".to_owned(),
        format!("-> field exporter ({tool}:{})", line_of(root, tool, "exporter: Exporter")),
        format!("-> field db ({tool}:{})", line_of(root, tool, "db: Db")),
        format!("-> field pool (src/store/mod.rs:{})", line_of(root, "src/store/mod.rs", "pool: AnyPool")),
    ] {
        assert!(stderr.contains(&needle), "missing {needle:?}\n{stderr}");
    }
}

/// The body of the workspace manifest's `[dependencies]` table.
fn dependencies_table() -> String {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let start =
        manifest.find("\n[dependencies]\n").expect("the manifest has dependencies") + "\n[dependencies]\n".len();
    let end = manifest[start..].find("\n[").map_or(manifest.len(), |i| start + i);
    manifest[start..end].to_owned()
}

fn scopegate_guards(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_scopegate")).arg("guards").args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn guards_report_prints_the_report_of_the_sources_it_was_built_from() {
    let fresh = guards::check(&gateway_options(&workspace())).unwrap();

    let json = scopegate_guards(&["report", "--format", "json"]).stdout;
    assert_eq!(String::from_utf8(json).unwrap(), fresh.to_json());

    let md = String::from_utf8(scopegate_guards(&["report"]).stdout).unwrap();
    assert_eq!(md, fresh.to_markdown(), "Markdown is the default");
    assert!(md.contains("## Guard table"));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("guards.sarif");
    let out = scopegate_guards(&["report", "--format", "sarif", "--output", file.to_str().unwrap()]);
    assert!(out.stdout.is_empty(), "--output writes the file only");
    let sarif: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(sarif["version"], "2.1.0");
    assert_eq!(sarif["runs"][0]["results"].as_array().unwrap().len(), 0);
}

#[test]
fn guards_report_rejects_an_unknown_format() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_scopegate")).args(["guards", "report", "--format", "html"]).output().unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("md, json, sarif"), "{stderr}");
}

// ------------------------------------------------------------------ the guard sees what ships

/// The guard's `Tool` roots are the tools the server serves natively, one for one: a tool the
/// walk misses would be served unchecked, a root the server never lists would mean the walk
/// looked at something else than what runs. The served list is the registry `tools/list` is
/// built from (`ToolSet::native`, the rmcp router of `crate::tools`), not a copy.
#[test]
fn the_guard_walks_every_tool_the_server_lists() {
    let root = workspace();
    let report = guards::check(&gateway_options(&root)).unwrap();
    // `FarmTools`, as the router's receiver type is named.
    let receiver = std::any::type_name::<scopegate::tools::FarmTools>().rsplit("::").next().unwrap();
    let mut served: Vec<String> =
        scopegate::mcp::ToolSet::native().list().iter().map(|t| format!("{receiver}::{}", t.name)).collect();
    served.sort();
    assert!(!served.is_empty(), "the server serves no native tool");

    // `Type::method`, with the method replaced by the name rmcp serves it under.
    let mut walked: Vec<String> = report
        .tools
        .iter()
        .filter(|t| t.kind == guards::ToolKind::Tool)
        .map(|t| {
            let (ty, _) =
                t.name.rsplit_once("::").unwrap_or_else(|| panic!("tool root {:?} is not `Type::fn`", t.name));
            format!("{ty}::{}", served_name(&root, t))
        })
        .collect();
    walked.sort();
    let missing: Vec<&String> = served.iter().filter(|s| !walked.contains(s)).collect();
    let extra: Vec<&String> = walked.iter().filter(|w| !served.contains(w)).collect();
    assert_eq!(
        walked, served,
        "the guard's tool roots are not the served tools\n  served, not walked: {missing:?}\n  walked, not served: {extra:?}"
    );
}

/// The name rmcp serves a `#[tool]` method under: the attribute's `name = "..."` when it has
/// one, else the fn's name. Read from the attributes written right above the fn the guard
/// reports (`tool.file`, at or just after `tool.line`).
fn served_name(root: &Path, tool: &guards::ToolReport) -> String {
    let method = tool.name.rsplit("::").next().unwrap();
    let text = std::fs::read_to_string(root.join(&tool.file)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let declares = |line: &str| {
        let line = line.split("//").next().unwrap();
        line.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w == ["fn", method])
    };
    let at = (tool.line.saturating_sub(1)..lines.len())
        .find(|&i| declares(lines[i]))
        .unwrap_or_else(|| panic!("{}:{} declares no fn {method}", tool.file, tool.line));
    // The attribute and doc lines above the fn, up to the end of the previous item.
    let mut start = at;
    while start > 0 {
        let l = lines[start - 1].trim();
        if l.is_empty() || l.ends_with('{') || l.ends_with('}') || l.ends_with(';') {
            break;
        }
        start -= 1;
    }
    let attrs = lines[start..at].join("\n");
    let Some(open) = ["#[tool(", "#[rmcp::tool("].iter().find_map(|a| attrs.find(a).map(|i| i + a.len())) else {
        return method.to_owned();
    };
    // `key = value` pairs at the top level of the attribute's parentheses.
    let mut depth = 1;
    let mut in_str = false;
    let mut escaped = false;
    let mut pair = String::new();
    let mut pairs = Vec::new();
    for c in attrs[open..].chars() {
        if in_str {
            pair.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                pairs.push(std::mem::take(&mut pair));
                continue;
            }
            _ => {}
        }
        pair.push(c);
    }
    pairs.push(pair);
    for pair in pairs {
        if let Some((key, value)) = pair.split_once('=')
            && key.trim() == "name"
        {
            let value = value.trim();
            let name = value.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
            return name.unwrap_or_else(|| panic!("{}: tool name {value} is not a plain string", tool.file)).to_owned();
        }
    }
    method.to_owned()
}

/// The files the guard parses are exactly the `.rs` files rustc compiled into the library:
/// a module the guard failed to find (a `#[path]`, a `cfg_attr`, an inline module's directory)
/// would hold tools or helpers it never walked. rustc's own dep-info for the library is the
/// truth; the test binary is built after the library, so it is there.
#[test]
fn the_files_the_guard_parses_are_the_files_rustc_compiles() {
    let root = workspace();
    let report = guards::check(&gateway_options(&root)).unwrap();
    let parsed: BTreeSet<String> = report.files.iter().cloned().collect();

    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().expect("the test binary is in target/<profile>/deps");
    let target = deps.parent().and_then(Path::parent).expect("deps is in target/<profile>");
    let (dep_info, compiled) = library_dep_info(deps);
    // `.rs` files of this crate; build-script output under the target directory is generated.
    let compiled: BTreeSet<String> = compiled
        .iter()
        .map(|p| guards::normalise_path(&if p.is_absolute() { p.clone() } else { root.join(p) }))
        .filter(|p| p.extension().is_some_and(|e| e == "rs") && !p.starts_with(target))
        .filter_map(|p| p.strip_prefix(&root).ok().map(|r| r.to_string_lossy().replace('\\', "/")))
        .collect();
    assert!(compiled.contains("src/lib.rs"), "{} lists no src/lib.rs: {compiled:?}", dep_info.display());

    let not_parsed: Vec<&String> = compiled.difference(&parsed).collect();
    let not_compiled: Vec<&String> = parsed.difference(&compiled).collect();
    assert!(
        not_parsed.is_empty() && not_compiled.is_empty(),
        "the guard's files are not the library's sources (rustc's dep-info: {})\n  \
         compiled by rustc, not parsed by the guard: {not_parsed:?}\n  \
         parsed by the guard, not compiled by rustc: {not_compiled:?}",
        dep_info.display()
    );
}

/// The newest dep-info rustc wrote for the scopegate library in `deps` (a `scopegate-<hash>.d`
/// with a rule for `libscopegate-<hash>.rlib`, or for `.rmeta` only when no build wrote one: a
/// clippy run writes a check's dep-info that may be newer than the build the tests use; the
/// binaries' and tests' dep-info have none), and the dependencies of that rule, as written (absolute, or relative to the
/// workspace root cargo runs rustc in).
fn library_dep_info(deps: &Path) -> (PathBuf, Vec<PathBuf>) {
    let mut found: Vec<((bool, std::time::SystemTime), PathBuf, Vec<PathBuf>)> = Vec::new();
    for entry in std::fs::read_dir(deps).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("scopegate-") && name.ends_with(".d")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let rules = guards::dep_info_rules(&text);
        let library = |suffix: &str| {
            rules.iter().find(|(target, _)| {
                let file = target.rsplit('/').next().unwrap();
                file.starts_with("libscopegate-") && file.ends_with(suffix)
            })
        };
        // A build's (an rlib) before a check's (clippy's rmeta only), then the newest.
        let (built, rule) = match library(".rlib") {
            Some(rule) => (true, Some(rule)),
            None => (false, library(".rmeta")),
        };
        if let Some((_, files)) = rule {
            let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
            found.push(((built, modified), path, files.iter().map(PathBuf::from).collect()));
        }
    }
    let (_, path, files) = found.into_iter().max_by_key(|(modified, ..)| *modified).unwrap_or_else(|| {
        panic!(
            "no dep-info for the scopegate library (scopegate-<hash>.d with a libscopegate rule) in {}",
            deps.display()
        )
    });
    (path, files)
}

// ------------------------------------------------------------------ the SaaS example

fn saas_options(root: &Path) -> guards::Options {
    guards::Options::new(root)
        .tool_modules(["crate::tools"])
        .extra_rules(workspace().join("examples/saas-tools/guards.toml"))
}

#[test]
fn saas_example_passes_its_own_rules() {
    let report = guards::check(&saas_options(&workspace().join("examples/saas-tools"))).unwrap();
    assert_eq!(guards::failure_message(&report), None);
    let tools: Vec<&str> = report.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tools, ["Greeter::greet"]);
    assert!(report.guard_rows.iter().any(|r| r.id == "S1"));
}

#[test]
fn saas_example_rejects_a_tool_reaching_its_billing_key() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::copy_dir(&workspace().join("examples/saas-tools/src"), &dir.path().join("src"));
    std::fs::copy(workspace().join("examples/saas-tools/Cargo.toml"), dir.path().join("Cargo.toml")).unwrap();
    let tools = dir.path().join("src/tools/mod.rs");
    let mut text = std::fs::read_to_string(&tools).unwrap();
    text.push_str("pub mod refund;\n");
    std::fs::write(&tools, text).unwrap();
    let refund = "src/tools/refund.rs";
    std::fs::write(
        dir.path().join(refund),
        r#"use rmcp::tool;
use scopegate::McpCallContext;

use crate::billing::BillingClient;

pub struct Refunds {
    billing: std::sync::Arc<BillingClient>,
}

impl Refunds {
    #[tool(description = "Refund the caller's last invoice")]
    pub async fn refund(&self, ctx: McpCallContext) -> String {
        ctx.tenant_slug().to_owned()
    }
}
"#,
    )
    .unwrap();

    let report = guards::check(&saas_options(dir.path())).unwrap();
    let msg = guards::failure_message(&report).expect("the billing key is caught");
    let billing = "src/billing.rs";
    let at = |file: &str, needle: &str| format!("({file}:{})", line_of(dir.path(), file, needle));
    assert!(msg.contains("[S1] Refunds::refund reaches forbidden crate::billing::BillingApiKey"), "{msg}");
    for hop in [
        format!("-> field billing {}", at(refund, "billing: std::sync::Arc")),
        format!(
            "-> type crate::billing::BillingClient ({billing}:{}, used at {refund}:{})",
            line_of(dir.path(), billing, "pub struct BillingClient"),
            line_of(dir.path(), refund, "billing: std::sync::Arc")
        ),
        format!("-> field key {}", at(billing, "key: BillingApiKey")),
    ] {
        assert!(msg.contains(&hop), "missing {hop:?}\n{msg}");
    }
}

#[test]
fn saas_example_rejects_a_tool_holding_the_gateways_database_handle() {
    // From a SaaS crate `scopegate::store::Db` is opaque (its pool is not walked), so the
    // shipped rules name it: the same failure as a gateway tool holding it.
    let dir = tempfile::tempdir().unwrap();
    crate::support::copy_dir(&workspace().join("examples/saas-tools/src"), &dir.path().join("src"));
    std::fs::copy(workspace().join("examples/saas-tools/Cargo.toml"), dir.path().join("Cargo.toml")).unwrap();
    let tools = dir.path().join("src/tools/mod.rs");
    let mut text = std::fs::read_to_string(&tools).unwrap();
    text.push_str("pub mod report;\n");
    std::fs::write(&tools, text).unwrap();
    std::fs::write(
        dir.path().join("src/tools/report.rs"),
        r#"use rmcp::tool;
use scopegate::McpCallContext;
use scopegate::store::Db as Database;

pub struct Reports {
    db: Option<Database>,
}

impl Reports {
    #[tool(description = "Usage report")]
    pub async fn usage(&self, ctx: McpCallContext) -> String {
        ctx.tenant_slug().to_owned()
    }
}
"#,
    )
    .unwrap();
    let report = guards::check(&saas_options(dir.path())).unwrap();
    let msg = guards::failure_message(&report).expect("the database handle is caught");
    assert!(msg.contains("[G2] Reports::usage reaches forbidden scopegate::store::Db"), "{msg}");
}

#[test]
fn the_factory_row_names_tests_that_exist() {
    // G6 is proved by the factory's unit tests in the gateway, not by the guard's fixtures.
    let rules = guards::Rules::parse(guards::DEFAULT_RULES, "rules.toml").unwrap();
    let g6 = rules.guard_row.iter().find(|r| r.id == "G6").unwrap();
    let names = g6
        .test
        .strip_prefix("scopegate::identity::context::tests::{")
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or_else(|| panic!("unexpected G6 test: {}", g6.test));
    let tests = std::fs::read_to_string(workspace().join("src/identity/context/tests.rs")).unwrap();
    for name in names.split(", ") {
        assert!(tests.contains(&format!("fn {name}()")), "G6 names {name}, which does not exist");
    }
}

#[test]
fn the_session_and_audit_rows_name_tests_that_exist() {
    let rules = guards::Rules::parse(guards::DEFAULT_RULES, "rules.toml").unwrap();
    let tests = std::fs::read_to_string(workspace().join("tests/it/mcp_http.rs")).unwrap();
    for (row, module) in [("G7", "mcp_session_hijack"), ("G8", "mcp_fail_closed_audit")] {
        let g = rules.guard_row.iter().find(|r| r.id == row).unwrap();
        assert!(g.test.contains(&format!("it::mcp_http::{module}::")), "{row}: {}", g.test);
        assert!(tests.contains(&format!("both_dbs!({module},")), "{row} names {module}, which does not exist");
    }
}

// ---------------------------------------------------------------- the compiled walk

/// The newest `lib<name>-*.rlib` beside this test binary (the one this build compiled).
fn rlib(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let prefix = format!("lib{name}-");
    std::fs::read_dir(&deps)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && n.ends_with(".rlib")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .unwrap_or_else(|| panic!("no lib{name}-*.rlib in {}", deps.display()))
}

/// Compiles `source` as the library `probe` (a SaaS crate written against scopegate and rmcp)
/// through the checker this build installed, exactly as the workspace's rustc wrapper runs it:
/// `OUT_DIR/scopegate-guard --scopegate-guard-rustc rustc ARGS`. Returns the exit status, its
/// stderr and the compiled walk's report.
fn compile_through_the_checker(source: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("probe.rs");
    std::fs::write(&src, source).unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let checker = Path::new(env!("OUT_DIR")).join("scopegate-guard");
    let rmcp = rlib("rmcp");
    let scopegate = rlib("scopegate");
    let out = Command::new(&checker)
        .arg("--scopegate-guard-rustc")
        .arg(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .args(["--crate-name", "probe", "--edition=2024", "--crate-type", "lib"])
        .args(["--emit=dep-info,metadata,link", "-C", "extra-filename=-probe", "-C", "debuginfo=line-tables-only"])
        .arg("--out-dir")
        .arg(dir.path())
        .arg("-L")
        .arg(format!("dependency={}", deps.display()))
        .arg("--extern")
        .arg(format!("rmcp={}", rmcp.display()))
        .arg("--extern")
        .arg(format!("scopegate={}", scopegate.display()))
        .arg(&src)
        .current_dir(workspace())
        .env("OUT_DIR", &out_dir)
        .env("CARGO_MANIFEST_DIR", workspace())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = std::fs::read_to_string(out_dir.join(guards::COMPILED_MD)).unwrap_or_default();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "ll"))
        .collect();
    assert!(left.is_empty(), "the checker leaves no IR behind: {left:?}");
    (out.status.success(), stderr, report)
}

const PROBE_HEAD: &str = r#"
use rmcp::{tool, tool_router};
use scopegate::McpCallContext;
use scopegate::mcp::{RegistryError, ToolSet};
use scopegate::model::Role;
use scopegate::tools::{NoArguments, ToolSpec, arguments};

pub struct Probe;
pub const PROBE_TOOLS: &[ToolSpec] =
    &[ToolSpec { name: "probe", roles: &[Role::Owner], validate: arguments::<NoArguments> }];
pub fn tool_set() -> Result<ToolSet, RegistryError> {
    ToolSet::native().with(Probe, Probe::tool_router(), PROBE_TOOLS)
}
"#;

#[test]
fn the_compiled_walk_fails_the_compilation_of_a_tool_that_starts_a_thread_through_a_static() {
    // The tool calls a callable that start-up code stored in a static; what it stored starts a
    // thread. Nothing in the tool's source names a thread.
    let source = format!(
        "{PROBE_HEAD}{}",
        r#"
static HOOK: std::sync::OnceLock<Box<dyn Fn() -> usize + Send + Sync>> = std::sync::OnceLock::new();
pub fn start_up() {
    let _ = HOOK.set(Box::new(|| { std::thread::spawn(|| ()); 1 }));
}
#[tool_router]
impl Probe {
    #[tool(description = "Counts.")]
    pub async fn probe(&self, ctx: McpCallContext) -> String {
        let n = HOOK.get().map(|f| f()).unwrap_or(0);
        format!("{} {n}", ctx.subject())
    }
}
"#
    );
    let (ok, stderr, report) = compile_through_the_checker(&source);
    assert!(!ok, "the compilation must fail\n{stderr}");
    assert!(stderr.contains("reaches std::thread::functions::spawn"), "{stderr}");
    assert!(stderr.contains("<crate::Probe>::probe"), "the path names the tool\n{stderr}");
    assert!(stderr.contains("crate::start_up::{closure#0}"), "and the stored closure\n{stderr}");
    assert!(report.contains("**G5**"), "{report}");
}

#[test]
fn the_compiled_walk_passes_a_tool_that_only_uses_its_context() {
    let source = format!(
        "{PROBE_HEAD}{}",
        r#"
pub mod mine { pub struct TenantContext { pub name: String } pub struct Link; impl Link { pub fn connect(&self) -> usize { 1 } pub fn spawn_rate(&self) -> usize { 2 } } }
#[tool_router]
impl Probe {
    #[tool(description = "Greets.")]
    pub async fn probe(&self, ctx: McpCallContext) -> String {
        let t = mine::TenantContext { name: ctx.subject().to_owned() };
        format!("{} {}", t.name, mine::Link.connect() + mine::Link.spawn_rate())
    }
}
"#
    );
    let (ok, stderr, report) = compile_through_the_checker(&source);
    assert!(ok, "the compilation passes\n{stderr}");
    assert!(report.contains(", 0 findings."), "{report}");
    assert!(report.contains("<crate::Probe>::probe"), "the tool is a root\n{report}");
}
