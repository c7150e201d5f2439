//! The compiled walk on real compiled code: each fixture is a small crate compiled by rustc
//! (LLVM IR, v0 mangling, unoptimised, as the wrapper compiles), walked with a policy whose
//! tool handlers, boundary and forbidden items are the fixture's own stand-ins for rmcp's and
//! the gateway's (so a fixture needs nothing but std). One fixture per class of evasion the
//! source walk missed, and the look-alikes it refused that must pass.

use std::path::PathBuf;
use std::process::Command;

use guards::compiled::{Forbidden, Outcome, Policy, check};
use guards::ir::Module;

/// The stand-ins every fixture starts with: a tool router whose handlers take a
/// `ToolCallContext`, a registry whose `with` takes argument checks, the boundary
/// `McpCallContext` (which, like a careless one, also hands out the database), and the
/// forbidden `TenantContext`, `Db` and `Pool`.
pub(crate) const PRELUDE: &str = r#"
#![allow(dead_code, unused_imports, unused_variables, unused_macros)]
pub mod rmcp {
    pub struct ToolCallContext<S> { pub receiver: S, pub args: String }
    pub struct ToolRoute<S> { pub call: Box<dyn Fn(ToolCallContext<S>) -> u32 + Send + Sync> }
    pub struct ToolRouter<S> { pub routes: Vec<ToolRoute<S>> }
    impl<S> ToolRouter<S> {
        pub fn with(mut self, call: impl Fn(ToolCallContext<S>) -> u32 + Send + Sync + 'static) -> Self {
            self.routes.push(ToolRoute { call: Box::new(call) });
            self
        }
    }
}
pub mod gateway {
    pub struct TenantContext { subject: String }
    impl TenantContext { pub fn subject(&self) -> &str { &self.subject } }
    pub struct Pool(u32);
    impl Pool { pub fn query(&self) -> u32 { self.0 } }
    pub struct Db { pub pool: Pool }
    impl Db { pub fn begin(&self) -> u32 { self.pool.query() } }
    pub struct McpCallContext { tenant: TenantContext, db: Db }
    impl McpCallContext {
        pub fn subject(&self) -> &str { self.tenant.subject() }
        pub fn db(&self) -> &Db { &self.db }
        pub fn get() -> McpCallContext { McpCallContext { tenant: TenantContext { subject: String::new() }, db: Db { pool: Pool(1) } } }
    }
    pub fn open() -> Pool { Pool(2) }
    pub struct ToolSpec { pub name: &'static str, pub validate: fn(&str) -> bool }
    pub struct ToolSet;
    impl ToolSet {
        pub fn with<T>(self, receiver: T, router: crate::rmcp::ToolRouter<T>, specs: &[ToolSpec]) -> Self { self }
    }
}
use gateway::*;
use rmcp::*;
"#;

pub(crate) fn policy() -> Policy {
    let rule = |types: &[&str], calls: &[&str], row: &str, allowed: &[&str]| Forbidden {
        types: types.iter().map(|s| s.to_string()).collect(),
        calls: calls.iter().map(|s| s.to_string()).collect(),
        guard_row: row.into(),
        reason: format!("{row} forbids it"),
        allowed_in: allowed.iter().map(|s| s.to_string()).collect(),
    };
    Policy {
        crate_name: "fixture".into(),
        forbidden: vec![
            rule(&["crate::gateway::TenantContext"], &[], "G1", &["crate::gateway"]),
            rule(&["crate::gateway::Pool", "crate::gateway::Db"], &["crate::gateway::open"], "G2", &["crate::gateway"]),
            rule(
                &["std::process::Command", "std::thread::builder::Builder"],
                &["std::thread::functions::spawn", "std::thread::scoped::scope"],
                "G5",
                &[],
            ),
        ],
        boundaries: vec!["crate::gateway::McpCallContext".into()],
        handler_types: vec!["crate::rmcp::ToolCallContext".into()],
        registrations: vec!["crate::gateway::ToolSet::with".into()],
    }
}

/// Compiles `source` (after the prelude; `files` beside it) as the library `fixture` and
/// walks it.
pub(crate) fn walk(source: &str, files: &[(&str, &str)]) -> Outcome {
    walk_with(source, files, &policy())
}

/// [`walk`] under `policy`.
pub(crate) fn walk_with(source: &str, files: &[(&str, &str)], policy: &Policy) -> Outcome {
    let dir = std::env::temp_dir().join(format!("scopegate-compiled-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let lib = dir.join("lib.rs");
    std::fs::write(&lib, format!("{PRELUDE}\n{source}")).unwrap();
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--edition", "2024", "--crate-type", "lib", "--crate-name", "fixture"])
        .args(["--emit=link,llvm-ir", "-Csymbol-mangling-version=v0", "-Cdebuginfo=line-tables-only"])
        .arg("--out-dir")
        .arg(&dir)
        .arg(&lib)
        .output()
        .unwrap();
    assert!(out.status.success(), "the fixture compiles: {}", String::from_utf8_lossy(&out.stderr));
    let mut module = Module::default();
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path: PathBuf = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "ll") {
            module.add_unit(&std::fs::read_to_string(&path).unwrap());
            read += 1;
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(read > 0, "rustc wrote the IR");
    check(&module, policy)
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The finding for `item` from a root whose name contains `root`, with its whole path.
pub(crate) fn finding<'o>(outcome: &'o Outcome, root: &str, item: &str) -> &'o guards::compiled::Finding {
    outcome
        .findings
        .iter()
        .find(|f| f.root.contains(root) && f.item == item)
        .unwrap_or_else(|| panic!("no finding of {item} from {root}: {:#?}", outcome.findings))
}

pub(crate) fn path_has(f: &guards::compiled::Finding, function: &str) -> bool {
    f.path.iter().any(|s| s.function.contains(function))
}

/// The tool router of the fixture: `tool` served as a handler, with the registry called.
pub(crate) fn served(tools: &[&str]) -> String {
    let mut s = String::from(
        "pub struct Tools;\npub fn router() -> ToolRouter<Tools> {\n    ToolRouter { routes: Vec::new() }",
    );
    for t in tools {
        s.push_str(&format!("\n        .with(|c: ToolCallContext<Tools>| {t}(&McpCallContext::get(), &c.args))"));
    }
    s.push_str("\n}\npub fn register() -> ToolSet { ToolSet.with(Tools, router(), &[]) }\n");
    s
}

#[test]
fn a_function_named_like_a_module_is_walked() {
    let src = r#"
pub mod fetch { pub fn go() -> u32 { 1 } }
pub fn fetch(ctx: &McpCallContext) -> u32 { ctx.db().begin() }
pub fn tool(ctx: &McpCallContext, _a: &str) -> u32 { fetch(ctx) + fetch::go() }
"#;
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    let f = finding(&out, "router", "crate::gateway::Db");
    assert!(path_has(f, "crate::fetch") && path_has(f, "crate::tool"), "{f:#?}");
    // The line of the call in the tool is in the path.
    assert!(f.path.iter().any(|s| s.at.as_ref().is_some_and(|l| l.line > 0)), "{f:#?}");
}

#[test]
fn only_the_compiled_cfg_arm_counts_and_it_is_walked() {
    let src = r#"
#[cfg(not(any()))]
pub fn helper() -> u32 { gateway::open().query() }
#[cfg(any())]
pub use std::convert::identity as helper;
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { helper() }
"#;
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    let f = finding(&out, "router", "crate::gateway::open");
    assert!(path_has(f, "crate::helper"), "{f:#?}");
}

#[test]
fn a_trait_in_scope_through_a_glob_of_a_glob_is_resolved() {
    let src = r#"
mod inner { pub trait Sneaky { fn go(&self) -> u32; } impl Sneaky for u8 { fn go(&self) -> u32 { crate::gateway::open().query() } } }
mod middle { pub use super::inner::*; }
mod outer { pub use super::middle::*; }
use outer::*;
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { 7u8.go() }
"#;
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    let f = finding(&out, "router", "crate::gateway::open");
    assert!(path_has(f, "<u8 as crate::inner::Sneaky>::go"), "{f:#?}");
}

#[test]
fn modules_written_by_macros_and_included_files_are_what_was_compiled() {
    let src = r#"
macro_rules! hide { () => { pub mod hidden { pub fn go() -> u32 { crate::gateway::open().query() } } }; }
hide!();
use std::include as pull;
pub mod pulled { crate::pull!("pulled.rs"); }
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { hidden::go() }
pub fn other(_c: &McpCallContext, _a: &str) -> u32 { pulled::leak() }
"#;
    let files = [("pulled.rs", "pub fn leak() -> u32 { let t = crate::McpCallContext::get(); t.db().begin() }")];
    let out = walk(&format!("{src}{}", served(&["tool", "other"])), &files);
    assert!(
        out.findings.iter().any(|f| f.item == "crate::gateway::open" && path_has(f, "crate::hidden::go")),
        "{out:#?}"
    );
    assert!(
        out.findings.iter().any(|f| f.item == "crate::gateway::Db" && path_has(f, "crate::pulled::leak")),
        "{out:#?}"
    );
}

#[test]
fn callables_stored_in_statics_by_start_up_code_are_reached_by_their_reader() {
    let src = r#"
use std::sync::OnceLock;
static HOOK: OnceLock<Box<dyn Fn() -> u32 + Send + Sync>> = OnceLock::new();
static POINTER: OnceLock<fn() -> u32> = OnceLock::new();
fn secret() -> u32 { gateway::open().query() }
pub fn start() {
    let _ = HOOK.set(Box::new(|| { let t = McpCallContext::get(); t.db().begin() }));
    let _ = POINTER.set(secret);
}
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { HOOK.get().map(|f| f()).unwrap_or(0) }
pub fn other(_c: &McpCallContext, _a: &str) -> u32 { POINTER.get().map(|f| f()).unwrap_or(0) }
"#;
    let out = walk(&format!("{src}{}", served(&["tool", "other"])), &[]);
    assert!(out.findings.iter().any(|f| f.item == "crate::gateway::Db" && path_has(f, "crate::start")), "{out:#?}");
    assert!(out.findings.iter().any(|f| f.item == "crate::gateway::open" && path_has(f, "crate::secret")), "{out:#?}");
}

#[test]
fn what_a_boundary_hands_out_is_walked_when_a_tool_uses_it() {
    // `db()` is the boundary's (its insides are audited with it), but calling the handle it
    // returns is the tool's own code.
    let src = "pub fn tool(ctx: &McpCallContext, _a: &str) -> u32 { ctx.db().pool.query() }\n";
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    let f = finding(&out, "router", "crate::gateway::Pool");
    assert!(path_has(f, "crate::tool"), "{f:#?}");
    // A tool reading only what the boundary means to give passes.
    let src = "pub fn tool(ctx: &McpCallContext, _a: &str) -> u32 { ctx.subject().len() as u32 }\n";
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    assert!(out.findings.is_empty(), "{:#?}", out.findings);
}

#[test]
fn a_tools_argument_check_is_a_root() {
    let src = r#"
fn check(args: &str) -> bool { gateway::open().query() > args.len() as u32 }
pub struct Tools;
pub fn register() -> ToolSet {
    const SPECS: &[ToolSpec] = &[ToolSpec { name: "tool", validate: check }];
    ToolSet.with(Tools, ToolRouter { routes: Vec::new() }, SPECS)
}
"#;
    let out = walk(src, &[]);
    assert!(out.roots.iter().any(|r| r.function == "crate::check"), "{:#?}", out.roots);
    let f = finding(&out, "crate::check", "crate::gateway::open");
    assert_eq!(f.path[0].function, "crate::check");
}

#[test]
fn identity_kept_as_plain_data_by_middleware_is_reached_through_the_static() {
    let src = r#"
use std::sync::Mutex;
static SEEN: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
pub fn middleware(t: &TenantContext) { SEEN.lock().unwrap().push((t.subject().to_owned(), String::new())); }
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { SEEN.lock().unwrap().len() as u32 }
"#;
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    let f = finding(&out, "router", "crate::gateway::TenantContext");
    assert!(path_has(f, "crate::middleware"), "{f:#?}");
}

#[test]
fn a_call_through_a_trait_object_reaches_every_impl_of_its_shape() {
    // The receiver holds trait objects made by start-up code the walk never reaches: the
    // tool's call through them may land in any impl of the shape the crate makes.
    let src = r#"
pub trait Step { fn run(&self) -> u32; }
pub struct Harmless; pub struct Leaky;
impl Step for Harmless { fn run(&self) -> u32 { 1 } }
impl Step for Leaky { fn run(&self) -> u32 { gateway::open().query() } }
pub struct Tools { steps: Vec<Box<dyn Step + Send + Sync>> }
pub fn start_up() -> Tools { Tools { steps: vec![Box::new(Harmless), Box::new(Leaky)] } }
pub fn tool(tools: &Tools) -> u32 { let mut n = 0; for s in &tools.steps { n += s.run(); } n }
pub fn router() -> ToolRouter<Tools> {
    ToolRouter { routes: Vec::new() }.with(|c: ToolCallContext<Tools>| tool(&c.receiver))
}
pub fn register(tools: Tools) -> ToolSet { ToolSet.with(tools, router(), &[]) }
"#;
    let out = walk(src, &[]);
    let f = finding(&out, "router", "crate::gateway::open");
    assert!(path_has(f, "<crate::Leaky as crate::Step>::run"), "{f:#?}");
}

#[test]
fn detached_work_and_processes_are_found_by_their_definitions() {
    let src = r#"
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { std::thread::spawn(|| 1u32); 0 }
pub fn other(_c: &McpCallContext, _a: &str) -> u32 { let _ = std::process::Command::new("true").status(); 0 }
"#;
    let out = walk(&format!("{src}{}", served(&["tool", "other"])), &[]);
    assert!(out.findings.iter().any(|f| f.item == "std::thread::functions::spawn"), "{:#?}", out.findings);
    assert!(out.findings.iter().any(|f| f.item == "std::process::Command"), "{:#?}", out.findings);
}

#[test]
fn look_alikes_of_forbidden_names_pass() {
    // A tool's own types named like identity types, a method named `spawn_rate`, a `connect`
    // of an unrelated type: matched by where they are defined, none is forbidden.
    let src = r#"
pub mod mine {
    pub struct TenantContext { pub name: String }
    pub struct Claims(pub u32);
    pub struct Pool(pub u32);
    pub struct Link;
    impl Link { pub fn connect(&self) -> u32 { 3 } pub fn spawn_rate(&self) -> u32 { 4 } }
}
pub fn tool(ctx: &McpCallContext, _a: &str) -> u32 {
    let t = mine::TenantContext { name: ctx.subject().to_owned() };
    let p = mine::Pool(1);
    let c = mine::Claims(2);
    let l = mine::Link;
    t.name.len() as u32 + p.0 + c.0 + l.connect() + l.spawn_rate()
}
"#;
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    assert!(out.findings.is_empty(), "{:#?}", out.findings);
    assert!(out.roots.iter().any(|r| r.function.contains("router")), "the tool is a root: {:#?}", out.roots);
}

#[test]
fn a_boundarys_insides_may_use_what_its_module_is_allowed() {
    // The boundary's own functions are roots; `Db` and `Pool` are allowed in `crate::gateway`.
    let out = walk(&served(&[]), &[]);
    assert!(out.roots.iter().any(|r| r.function.contains("McpCallContext>::db")), "{:#?}", out.roots);
    assert!(out.findings.is_empty(), "{:#?}", out.findings);
}

#[test]
fn a_callable_kept_in_a_thread_local_is_reached_by_its_reader() {
    let src = r#"
use std::cell::RefCell;
thread_local! { static HOOK: RefCell<Option<Box<dyn Fn() -> u32>>> = RefCell::new(None); }
pub fn middleware() { HOOK.with(|h| *h.borrow_mut() = Some(Box::new(|| gateway::open().query()))); }
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { HOOK.with(|h| h.borrow().as_ref().map(|f| f()).unwrap_or(0)) }
"#;
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    let f = finding(&out, "router", "crate::gateway::open");
    assert!(path_has(f, "crate::middleware"), "{f:#?}");
}

#[test]
fn a_callable_stored_through_a_setter_is_reached_by_its_reader() {
    let src = r#"
use std::sync::OnceLock;
static HOOK: OnceLock<Box<dyn Fn(u32) -> u32 + Send + Sync>> = OnceLock::new();
pub fn set_hook(f: Box<dyn Fn(u32) -> u32 + Send + Sync>) { let _ = HOOK.set(f); }
pub fn start_up() { set_hook(Box::new(|n| n + gateway::open().query())); }
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { HOOK.get().map(|f| f(1)).unwrap_or(0) }
"#;
    let out = walk(&format!("{src}{}", served(&["tool"])), &[]);
    let f = finding(&out, "router", "crate::gateway::open");
    assert!(path_has(f, "crate::start_up::{closure#0}"), "{f:#?}");
}
