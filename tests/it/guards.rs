//! The guard as part of the gateway's build: the compiled walk of the gateway's library ran and
//! found nothing; what the binary serves (`scopegate guards report`, the admin API, the
//! console) is that walk's report; its roots are the tools the server lists; a tool reaching a
//! forbidden item fails the compilation with its whole path, for the gateway, for the SaaS
//! example under its own rules, and in a real `cargo build` through `.cargo/config.toml`.

use std::path::{Path, PathBuf};
use std::process::Command;

use guards::compiled::RootKind;
use guards::compiled_report::CompiledReport;
use serde_json::Value;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The report the checker wrote when this build compiled the gateway's library: the one the
/// binary embeds (the test crate shares the package's `OUT_DIR`).
fn this_build() -> CompiledReport {
    serde_json::from_str(scopegate::embedded_guard_report!().json).expect("the compiled report is JSON")
}

#[test]
fn the_gateways_library_passes_the_compiled_walk() {
    let report = this_build();
    assert!(report.walked(), "the build did not walk the library: {:?}", report.residue);
    assert_eq!(report.crate_name, "scopegate");
    assert!(report.findings.is_empty(), "{:#?}", report.findings);
    // The boundary's insides were walked on their own.
    has_root(&report, RootKind::Boundary, "crate::identity::context::McpCallContext");
    assert!(report.guard_rows.iter().any(|r| r.id == "G1"));
}

/// Asserts `report` has a root of kind `why` whose function names `function`.
fn has_root(report: &CompiledReport, why: RootKind, function: &str) {
    assert!(report.roots.iter().any(|r| r.why == why && r.function.contains(function)), "{:#?}", report.roots);
}

fn scopegate_guards(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_scopegate")).arg("guards").args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn guards_report_prints_the_compiled_walk_of_the_library_it_was_built_from() {
    let embedded = scopegate::embedded_guard_report!();
    let json = scopegate_guards(&["report", "--format", "json"]).stdout;
    assert_eq!(String::from_utf8(json).unwrap(), embedded.json);

    let md = String::from_utf8(scopegate_guards(&["report"]).stdout).unwrap();
    assert_eq!(md, embedded.markdown, "Markdown is the default");
    assert!(md.contains("## Guard table") && md.contains(", 0 findings."), "{md}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("guards.sarif");
    let out = scopegate_guards(&["report", "--format", "sarif", "--output", file.to_str().unwrap()]);
    assert!(out.stdout.is_empty(), "--output writes the file only");
    let sarif: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(sarif["version"], "2.1.0");
    assert_eq!(sarif["runs"][0]["results"].as_array().unwrap().len(), 0);
    assert_eq!(sarif["runs"][0]["invocations"][0]["executionSuccessful"], true);
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

/// The walk's tool roots are the tools the server serves natively, one for one: a tool the
/// walk missed would be served unchecked, a root the server never lists would mean the walk
/// looked at something else than what runs. The served list is the registry `tools/list` is
/// built from (`ToolSet::native`), not a copy. A handler root is the route rmcp's
/// `#[tool_router]` built for a method (`ToolRoute::<FarmTools>::new::<<FarmTools>::whoami,
/// ..>::{closure#0}`), and the farm tools are served under their methods' names.
#[test]
fn the_walks_roots_are_the_tools_the_server_lists() {
    let report = this_build();
    let receiver = std::any::type_name::<scopegate::tools::FarmTools>().replacen("scopegate::", "crate::", 1);
    let mut served: Vec<String> = scopegate::mcp::ToolSet::native().list().iter().map(|t| t.name.to_string()).collect();
    served.sort();
    assert!(!served.is_empty(), "the server serves no native tool");
    let route = format!("ToolRoute<{receiver}>>::new::<<{receiver}>::");
    let mut walked: Vec<String> = report
        .roots
        .iter()
        .filter(|r| r.why == RootKind::Handler)
        .filter_map(|r| r.function.split_once(&route))
        .map(|(_, rest)| rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap().to_owned())
        .collect();
    walked.sort();
    walked.dedup();
    assert_eq!(walked, served, "the walk's handler roots are not the served tools");
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

/// The build script output directory of `package` in this build (`target/<profile>/build/
/// <package>-<hash>/out`) holding the checker its build script installed, the newest.
fn checker_dir(package: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let build = deps.parent().unwrap().join("build");
    let prefix = format!("{package}-");
    std::fs::read_dir(&build)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join("out"))
        .filter(|out| out.join("scopegate-guard").exists())
        .max_by_key(|out| out.join("scopegate-guard").metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("no checker of {package} in {} (build the workspace)", build.display()))
}

/// What one compilation through a checker gave.
struct Compiled {
    ok: bool,
    stderr: String,
    report: String,
}

/// Compiles `source` as the library `crate_name` (a crate written against scopegate and rmcp)
/// through the checker that `package`'s build script installed, exactly as the workspace's
/// rustc wrapper runs it: `OUT_DIR/scopegate-guard --scopegate-guard-rustc rustc ARGS`, with
/// that package's manifest directory (so its rules).
fn compile_through(package: &str, manifest_dir: &Path, crate_name: &str, source: &str, extra: &[&str]) -> Compiled {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("probe.rs");
    std::fs::write(&src, source).unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let checker = checker_dir(package).join("scopegate-guard");
    let (scopegate, rmcp) = crate::support::built_libraries();
    let out = Command::new(&checker)
        .arg("--scopegate-guard-rustc")
        .arg(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .args(["--crate-name", crate_name, "--edition=2024", "--crate-type", "lib"])
        .args(["--emit=dep-info,metadata,link", "-C", "extra-filename=-probe", "-C", "debuginfo=line-tables-only"])
        .arg("--out-dir")
        .arg(dir.path())
        .arg("-L")
        .arg(format!("dependency={}", deps.display()))
        .arg("--extern")
        .arg(format!("rmcp={}", rmcp.display()))
        .arg("--extern")
        .arg(format!("scopegate={}", scopegate.display()))
        .args(extra)
        .arg(&src)
        .current_dir(manifest_dir)
        .env("OUT_DIR", &out_dir)
        .env("CARGO_MANIFEST_DIR", manifest_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = std::fs::read_to_string(out_dir.join(guards::COMPILED_MD)).unwrap_or_default();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "ll") || e.path().is_dir() && e.path() != out_dir)
        .collect();
    assert!(left.is_empty(), "the checker leaves no IR behind: {left:?}");
    Compiled { ok: out.status.success(), stderr, report }
}

/// [`compile_through`] the gateway's checker, as a SaaS crate `probe`.
fn compile_through_the_checker(source: &str) -> (bool, String, String) {
    let c = compile_through("scopegate", &workspace(), "probe", source, &[]);
    (c.ok, c.stderr, c.report)
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

/// A tool calling a callable that start-up code stored in a static; what it stored starts a
/// thread. Nothing in the tool's source names a thread.
const STATIC_THREAD: &str = r#"
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
"#;

#[test]
fn the_compiled_walk_fails_the_compilation_of_a_tool_that_starts_a_thread_through_a_static() {
    let source = format!("{PROBE_HEAD}{STATIC_THREAD}");
    let (ok, stderr, report) = compile_through_the_checker(&source);
    assert!(!ok, "the compilation must fail\n{stderr}");
    assert!(stderr.contains("reaches std::thread::functions::spawn"), "{stderr}");
    assert!(stderr.contains("<crate::Probe>::probe"), "the path names the tool\n{stderr}");
    assert!(stderr.contains("crate::start_up::{closure#0}"), "and the stored closure\n{stderr}");
    assert!(report.contains("**G5**"), "{report}");
}

/// An optimised build (`cargo build --release`, the Docker image) is walked too: the checker
/// compiles as asked, then the same sources unoptimised for the IR alone, and fails the same.
#[test]
fn an_optimised_compilation_is_walked_and_fails_the_same() {
    let source = format!("{PROBE_HEAD}{STATIC_THREAD}");
    let c = compile_through("scopegate", &workspace(), "probe", &source, &["-C", "opt-level=3", "-C", "debuginfo=0"]);
    assert!(!c.ok, "the compilation must fail\n{}", c.stderr);
    assert!(c.stderr.contains("reaches std::thread::functions::spawn"), "{}", c.stderr);
    assert!(c.stderr.contains("crate::start_up::{closure#0}  (at "), "with the line, from line tables\n{}", c.stderr);
    assert!(c.report.contains("**G5**"), "{}", c.report);
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

#[test]
fn a_tool_whose_helper_holds_the_store_fails_the_compilation_with_the_whole_path() {
    // The tool's signature is clean; its receiver's helper keeps the database handle and the
    // tool asks it for a transaction.
    let source = format!(
        "{PROBE_HEAD}{}",
        r#"
pub struct Exporter { db: Option<scopegate::store::Db> }
impl Exporter {
    pub async fn rows(&self) -> usize { match &self.db { Some(db) => db.begin().await.map(|_| 1).unwrap_or(0), None => 0 } }
}
static EXPORTER: Exporter = Exporter { db: None };
#[tool_router]
impl Probe {
    #[tool(description = "Exports.")]
    pub async fn probe(&self, ctx: McpCallContext) -> String {
        format!("{} {}", ctx.subject(), EXPORTER.rows().await)
    }
}
"#
    );
    let (ok, stderr, report) = compile_through_the_checker(&source);
    assert!(!ok, "the compilation must fail\n{stderr}");
    assert!(stderr.contains("[G2]") && stderr.contains("reaches scopegate::store::Db"), "{stderr}");
    assert!(stderr.contains("<crate::Probe>::probe"), "the path names the tool\n{stderr}");
    assert!(stderr.contains("<crate::Exporter>::rows"), "and the helper\n{stderr}");
    assert!(report.contains("**G2**"), "{report}");
}

/// One real `cargo build` of a crate set up as the guide says (`docs/guide/tools.md`): the
/// guard as its build script, the workspace's rustc wrapper named in its `.cargo/config.toml`,
/// its own handler type in its rules. A tool that starts a thread through a helper fails the
/// build with the path; without the thread the same build passes and leaves the report. The
/// target directory is kept in cargo's test tmpdir (the first run builds the guard crate).
#[test]
fn a_violating_tool_fails_cargo_build() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::create_dir_all(root.join(".cargo")).unwrap();
    std::fs::copy(workspace().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
    std::fs::copy(workspace().join("rust-toolchain.toml"), root.join("rust-toolchain.toml")).unwrap();
    let guards_crate = workspace().join("guards");
    let write = |file: &str, text: &str| std::fs::write(root.join(file), text).unwrap();
    write(
        "Cargo.toml",
        &format!(
            "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [build-dependencies]\nguards = {{ path = {:?} }}\n\n[workspace]\n",
            guards_crate.to_str().unwrap()
        ),
    );
    write(
        ".cargo/config.toml",
        &format!("[build]\nrustc-workspace-wrapper = {:?}\n", guards_crate.join("rustc-wrapper").to_str().unwrap()),
    );
    write(
        "build.rs",
        "fn main() {\n    let root = std::env::var(\"CARGO_MANIFEST_DIR\").unwrap();\n    \
         guards::run_build_script(&guards::Options::new(root).extra_rules(\"guards.toml\"));\n}\n",
    );
    write("guards.toml", "[discovery]\nhandler_types = [\"crate::Call\"]\n");
    let lib = |helper_body: &str| {
        format!(
            "pub struct Call(pub String);\n\
             pub struct Route {{ pub call: Box<dyn Fn(Call) -> usize + Send + Sync> }}\n\
             pub fn routes() -> Vec<Route> {{ vec![Route {{ call: Box::new(tool) }}] }}\n\
             fn tool(call: Call) -> usize {{ helper() + call.0.len() }}\n\
             fn helper() -> usize {{\n{helper_body}\n}}\n"
        )
    };
    // Not `--quiet`, which also silences the build script's warnings.
    let build = || {
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["build", "--offline"])
            .current_dir(root)
            .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("guards-cargo-build"))
            .env_remove("RUSTFLAGS")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .output()
            .unwrap()
    };

    write("src/lib.rs", &lib("    std::thread::spawn(|| ());\n    1"));
    let out = build();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the build must fail\n{stderr}");
    assert!(stderr.contains("could not compile `probe`"), "{stderr}");
    assert!(stderr.contains("[G5]") && stderr.contains("reaches std::thread::functions::spawn"), "{stderr}");
    for function in ["crate::tool", "crate::helper"] {
        assert!(stderr.contains(&format!("-> {function}  (at src/lib.rs:")), "the path names {function}\n{stderr}");
    }

    write("src/lib.rs", &lib("    1"));
    let out = build();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let build_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guards-cargo-build/debug/build");
    let report = std::fs::read_dir(&build_dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("out").join(guards::COMPILED_JSON)).ok())
        .filter_map(|json| serde_json::from_str::<CompiledReport>(&json).ok())
        .find(CompiledReport::walked)
        .expect("the passing build left its walk's report");
    assert!(
        report.findings.is_empty() && report.roots.iter().any(|r| r.function.contains("crate::tool")),
        "{report:#?}"
    );

    // Without the wrapper named, nothing walks the library: the build says so out loud.
    std::fs::remove_file(root.join(".cargo/config.toml")).unwrap();
    write("src/lib.rs", &lib("    std::thread::spawn(|| ());\n    1"));
    let out = build();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no rustc workspace wrapper, so this library compiles unwalked"), "{stderr}");
}

// ---------------------------------------------------------------- the SaaS example

/// The SaaS example's build walked its library under the shipped rules plus its own
/// `guards.toml`: its one tool is a root, its own row is in the table, nothing was found.
#[test]
fn saas_example_passes_its_own_rules() {
    let json = std::fs::read_to_string(checker_dir("saas-tools").join(guards::COMPILED_JSON)).unwrap();
    let report: CompiledReport = serde_json::from_str(&json).unwrap();
    assert!(report.walked(), "{:?}", report.residue);
    assert!(report.findings.is_empty(), "{:#?}", report.findings);
    has_root(&report, RootKind::Handler, "<crate::tools::greet::Greeter>::greet");
    assert!(report.guard_rows.iter().any(|r| r.id == "S1"));
}

/// The SaaS's checker with the SaaS's rules: a tool that reaches its billing key fails, with
/// the path through the billing client.
#[test]
fn saas_example_rejects_a_tool_reaching_its_billing_key() {
    let source = format!(
        "{PROBE_HEAD}{}",
        r#"
pub mod billing {
    pub struct BillingApiKey(String);
    impl BillingApiKey { pub fn tail(&self) -> usize { self.0.len() } }
    pub struct BillingClient { pub key: BillingApiKey }
    impl BillingClient { pub fn hint(&self) -> usize { self.key.tail() } }
}
static CLIENT: std::sync::OnceLock<billing::BillingClient> = std::sync::OnceLock::new();
#[tool_router]
impl Probe {
    #[tool(description = "Refunds.")]
    pub async fn probe(&self, ctx: McpCallContext) -> String {
        format!("{} {}", ctx.subject(), CLIENT.get().map(|c| c.hint()).unwrap_or(0))
    }
}
"#
    );
    let saas = workspace().join("examples/saas-tools");
    let c = compile_through("saas-tools", &saas, "saas_tools", &source, &[]);
    assert!(!c.ok, "the compilation must fail\n{}", c.stderr);
    assert!(c.stderr.contains("[S1]") && c.stderr.contains("reaches crate::billing::BillingApiKey"), "{}", c.stderr);
    assert!(c.stderr.contains("<crate::billing::BillingClient>::hint"), "{}", c.stderr);
    // The same source through the gateway's checker (its rules have no S1) passes.
    let (ok, stderr, _) = compile_through_the_checker(&source);
    assert!(ok, "{stderr}");
}
