//! The retired source walk's fixtures and evasion cases (deleted with it), ported to the
//! compiled walk: each class of case the source walk caught, written as a std-only crate
//! over the stand-ins of `compiled.rs`. Where a fixture only named a type in a signature, the
//! port does something with it (calls a method, or drops it), since the compiled walk judges
//! what code does. The harness policy has no G3 (HTTP request types) or G4 (rmcp's
//! RequestContext) rows: those fixtures are ported with the identity and database stand-ins.

use guards::compiled::{Finding, Outcome, RootKind, failure};

use crate::compiled::{PRELUDE, finding, path_has, served, walk};

/// The router of a fixture whose receiver type is `receiver`: one tool handler per expression of
/// `handlers` (over the call `c: ToolCallContext<receiver>`), and the registration handing over
/// a receiver.
fn routed(receiver: &str, handlers: &[&str]) -> String {
    let mut s = format!("pub fn router() -> ToolRouter<{receiver}> {{\n    ToolRouter {{ routes: Vec::new() }}");
    for h in handlers {
        s.push_str(&format!("\n        .with(|c: ToolCallContext<{receiver}>| {h})"));
    }
    s.push_str(&format!(
        "\n}}\npub fn register(tools: {receiver}) -> ToolSet {{ ToolSet.with(tools, router(), &[]) }}\n"
    ));
    s
}

/// A stand-in for the extractor rmcp calls to make a tool's parameter from the call: `name`,
/// giving a `ty`. Not generic, so only the tool that takes the value names its type.
fn extractor(name: &str, receiver: &str, ty: &str) -> String {
    format!("fn {name}(_c: &ToolCallContext<{receiver}>) -> {ty} {{ unimplemented!(\"rmcp's extractor\") }}\n")
}

/// The finding of `item` whose path passes through `function`, from whichever root.
fn through<'o>(out: &'o Outcome, item: &str, function: &str) -> &'o Finding {
    out.findings
        .iter()
        .find(|f| f.item == item && path_has(f, function))
        .unwrap_or_else(|| panic!("no finding of {item} through {function}: {:#?}", out.findings))
}

/// No finding, and the tool router's handlers were walked.
fn passes(out: &Outcome) {
    assert!(out.findings.is_empty(), "{:#?}", out.findings);
    assert!(
        out.roots.iter().any(|r| r.why == RootKind::Handler && r.function.contains("router")),
        "the tool is a root: {:#?}",
        out.roots
    );
}

/// The 1-based line of the first line of `text` holding `needle`.
fn line_of(text: &str, needle: &str) -> u32 {
    let at = text.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("no {needle:?}"));
    u32::try_from(at).unwrap() + 1
}

const TENANT: &str = "crate::gateway::TenantContext";
const POOL: &str = "crate::gateway::Pool";
const DB: &str = "crate::gateway::Db";
const OPEN: &str = "crate::gateway::open";
const SPAWN: &str = "std::thread::functions::spawn";
const SCOPE: &str = "std::thread::scoped::scope";
const BUILDER: &str = "std::thread::builder::Builder";
const COMMAND: &str = "std::process::Command";

/// Was the source walk's `direct_param` fixture.
#[test]
fn an_identity_a_tool_takes_as_a_parameter_is_reached_when_read() {
    let src = format!(
        "pub struct Tools;\n{}pub fn whoami(tenant: TenantContext) -> u32 {{ tenant.subject().len() as u32 }}\n{}",
        extractor("tenant_of", "Tools", "TenantContext"),
        routed("Tools", &["whoami(tenant_of(&c))"])
    );
    let out = walk(&src, &[]);
    let f = finding(&out, "router", TENANT);
    assert!(path_has(f, "crate::whoami"), "{f:#?}");
}

/// Was the source walk's `request_context` fixture (the harness has no G4 row: the raw context
/// is the identity stand-in).
#[test]
fn a_raw_context_a_tool_takes_by_value_is_reached_by_its_drop_alone() {
    let src = format!(
        "pub struct Tools;\n{}pub fn raw(ctx: TenantContext) -> u32 {{ 0 }}\n{}",
        extractor("context_of", "Tools", "TenantContext"),
        routed("Tools", &["raw(context_of(&c))"])
    );
    let out = walk(&src, &[]);
    let f = finding(&out, "router", TENANT);
    assert!(path_has(f, "crate::raw") && f.path.last().unwrap().function.contains("drop_in_place"), "{f:#?}");
}

/// Was the source walk's `tool_struct_field` fixture.
#[test]
fn a_pool_in_a_field_of_the_tools_receiver_is_reached() {
    let src = r#"
pub struct Farm { name: String, pool: Pool }
impl Farm { pub fn list_flocks(&self) -> u32 { self.name.len() as u32 + self.pool.query() } }
"#;
    let out = walk(&format!("{src}{}", routed("Farm", &["c.receiver.list_flocks()"])), &[]);
    let f = finding(&out, "router", POOL);
    assert!(path_has(f, "<crate::Farm>::list_flocks"), "{f:#?}");
}

/// Was the source walk's `helper_two_levels` fixture.
#[test]
fn a_connection_two_services_down_the_receiver_is_reached_through_a_cycle() {
    let src = r#"
mod service {
    use crate::gateway::Db;
    pub struct Service { pub repo: Repo }
    pub struct Repo { pub back: Option<Box<Service>>, pub conn: Db }
    impl Service { pub fn count(&self) -> u32 { self.repo.count() } }
    impl Repo { pub fn count(&self) -> u32 { self.back.as_ref().map_or(0, |s| s.count()) + self.conn.begin() } }
}
pub struct Farm { svc: service::Service }
impl Farm { pub fn count_eggs(&self) -> u32 { self.svc.count() } }
"#;
    let out = walk(&format!("{src}{}", routed("Farm", &["c.receiver.count_eggs()"])), &[]);
    let f = finding(&out, "router", DB);
    for step in ["<crate::Farm>::count_eggs", "<crate::service::Service>::count", "<crate::service::Repo>::count"] {
        assert!(path_has(f, step), "{step}: {f:#?}");
    }
}

/// Was the source walk's `helper_two_levels` fixture, where what the crate type holds is never
/// used: a tool dropping a crate type that holds an identity.
#[test]
fn an_identity_dropped_inside_a_crate_type_the_tool_takes_is_reached() {
    let src = format!(
        "pub struct Tools;\npub struct Repo {{ pub who: TenantContext }}\n{}pub fn forget(r: Repo) -> u32 {{ 0 }}\n{}",
        extractor("repo_of", "Tools", "Repo"),
        routed("Tools", &["forget(repo_of(&c))"])
    );
    let out = walk(&src, &[]);
    let f = finding(&out, "router", TENANT);
    assert!(path_has(f, "crate::forget"), "{f:#?}");
}

/// Was the source walk's `type_alias` fixture.
#[test]
fn a_pool_behind_a_type_alias_is_reached() {
    let src = format!(
        "pub mod db {{ pub type Handle = crate::gateway::Pool; }}\npub struct Tools;\n{}{}{}",
        extractor("handle_of", "Tools", "db::Handle"),
        "pub fn list(db: crate::db::Handle) -> u32 { db.query() }\n",
        routed("Tools", &["list(handle_of(&c))"])
    );
    let out = walk(&src, &[]);
    let f = finding(&out, "router", POOL);
    assert!(path_has(f, "crate::list"), "{f:#?}");
}

/// Was the source walk's `use_rename` fixture.
#[test]
fn an_identity_renamed_by_use_is_reached() {
    let src = format!(
        "use gateway::TenantContext as Tc;\npub struct Tools;\n{}{}{}",
        extractor("caller_of", "Tools", "&'static Tc"),
        "pub fn whoami(t: &Tc) -> u32 { t.subject().len() as u32 }\n",
        routed("Tools", &["whoami(caller_of(&c))"])
    );
    let out = walk(&src, &[]);
    let f = finding(&out, "router", TENANT);
    assert!(path_has(f, "crate::whoami"), "{f:#?}");
}

/// Was the source walk's `reexport` fixture.
#[test]
fn an_identity_re_exported_under_another_name_through_a_glob_is_reached() {
    let src = r#"
pub mod identity { mod inner { pub use crate::gateway::TenantContext as CurrentUserContext; } pub use self::inner::CurrentUserContext as User; }
pub mod prelude { pub use crate::identity::User; }
pub mod tools {
    mod flocks { use super::super::prelude::*; pub fn mine(me: User) -> u32 { me.subject().len() as u32 } }
    pub use flocks::mine;
}
pub struct Tools;
"#;
    let src = format!(
        "{src}{}{}",
        extractor("user_of", "Tools", "prelude::User"),
        routed("Tools", &["tools::mine(user_of(&c))"])
    );
    let out = walk(&src, &[]);
    let f = finding(&out, "router", TENANT);
    assert!(path_has(f, "crate::tools::flocks::mine"), "{f:#?}");
}

/// Was the source walk's `wrappers` fixture.
#[test]
fn identity_and_pools_nested_in_std_wrappers_are_reached() {
    let src = r#"
use std::collections::HashMap;
use std::sync::Arc;
pub struct Tools;
pub type Deep = (Option<Vec<Arc<Box<TenantContext>>>>, HashMap<String, [(u8, &'static Pool); 2]>);
pub fn deep((a, b): Deep) -> u32 {
    a.map_or(0, |v| v.len() as u32) + b.len() as u32
}
"#;
    let src = format!("{src}{}{}", extractor("deep_of", "Tools", "Deep"), routed("Tools", &["deep(deep_of(&c))"]));
    let out = walk(&src, &[]);
    for item in [TENANT, POOL] {
        let f = finding(&out, "router", item);
        assert!(path_has(f, "crate::deep"), "{f:#?}");
    }
}

/// Was the source walk's `http_request_types` fixture (the harness has no G3 row: the request
/// parts and headers are the identity and database stand-ins).
#[test]
fn identity_taken_out_of_an_extractor_wrapper_and_a_borrowed_handle_are_reached() {
    let src = r#"
pub struct Extension<T>(pub T);
pub struct Tools;
pub type Parts = (Extension<TenantContext>, &'static Db);
pub fn sneaky((Extension(parts), headers): Parts) -> u32 {
    parts.subject().len() as u32 + headers.begin()
}
"#;
    let src = format!("{src}{}{}", extractor("parts_of", "Tools", "Parts"), routed("Tools", &["sneaky(parts_of(&c))"]));
    let out = walk(&src, &[]);
    for item in [TENANT, DB] {
        let f = finding(&out, "router", item);
        assert!(path_has(f, "crate::sneaky"), "{f:#?}");
    }
}

/// Was the source walk's `generic_bound` fixture.
#[test]
fn a_pool_reached_through_a_generic_bound_or_a_where_clause_is_reached() {
    let src = r#"
pub trait HasPool { fn pool(&self) -> &Pool; }
pub struct Store { pool: Pool }
impl HasPool for Store { fn pool(&self) -> &Pool { &self.pool } }
pub struct Tools;
pub fn generic<T: HasPool>(x: T) -> u32 { x.pool().query() }
pub fn where_clause<S>(s: S) -> u32 where S: Send + HasPool { s.pool().query() }
"#;
    let src = format!(
        "{src}{}{}",
        extractor("store_of", "Tools", "Store"),
        routed("Tools", &["generic(store_of(&c))", "where_clause(store_of(&c))"])
    );
    let out = walk(&src, &[]);
    through(&out, POOL, "crate::generic::<crate::Store>");
    through(&out, POOL, "crate::where_clause::<crate::Store>");
}

/// Was the source walk's `trait_object_returns_pool` fixture.
#[test]
fn a_pool_returned_by_a_trait_object_in_the_receiver_is_reached() {
    let src = r#"
pub trait Repo: Send + Sync { fn pool(&self) -> Pool; }
pub struct Live;
impl Repo for Live { fn pool(&self) -> Pool { gateway::open() } }
pub struct Farm { repo: Box<dyn Repo> }
pub fn start_up() -> Farm { Farm { repo: Box::new(Live) } }
impl Farm { pub fn list(&self) -> u32 { self.repo.pool().query() } }
"#;
    let out = walk(&format!("{src}{}", routed("Farm", &["c.receiver.list()"])), &[]);
    let f = finding(&out, "router", OPEN);
    assert!(path_has(f, "<crate::Farm>::list") && path_has(f, "<crate::Live as crate::Repo>::pool"), "{f:#?}");
    assert!(path_has(finding(&out, "router", POOL), "<crate::Farm>::list"));
}

/// Was the source walk's `closure_factory` fixture.
#[test]
fn what_a_stored_closure_or_a_fn_pointer_of_the_receiver_returns_is_reached() {
    let src = r#"
pub struct Helper { pub tx: Pool }
pub struct Other { pub exec: Box<dyn Fn() -> u32 + Send + Sync> }
pub struct Farm { make: Box<dyn Fn() -> Helper + Send + Sync>, other: fn(u8) -> Other }
fn other(n: u8) -> Other { Other { exec: Box::new(move || McpCallContext::get().db().begin() + n as u32) } }
pub fn start_up() -> Farm { Farm { make: Box::new(|| Helper { tx: gateway::open() }), other } }
impl Farm { pub fn build(&self) -> u32 { (self.make)().tx.query() + ((self.other)(1).exec)() } }
"#;
    let out = walk(&format!("{src}{}", routed("Farm", &["c.receiver.build()"])), &[]);
    assert!(path_has(finding(&out, "router", POOL), "<crate::Farm>::build"));
    let f = finding(&out, "router", OPEN);
    assert!(path_has(f, "<crate::Farm>::build") && path_has(f, "crate::start_up::{closure#0}"), "{f:#?}");
    let f = finding(&out, "router", DB);
    assert!(path_has(f, "<crate::Farm>::build") && path_has(f, "crate::other::{closure#0}"), "{f:#?}");
}

/// Was the source walk's `spawn_in_tool_body` fixture.
#[test]
fn detached_work_in_the_body_a_receiver_method_or_a_helper_with_a_local_rename_is_reached() {
    let src = r#"
use std::thread;
pub struct Farm;
impl Farm {
    pub fn detach(&self) -> u32 { thread::spawn(|| 1u32); self.helper(); offload(); 0 }
    fn helper(&self) { let _ = thread::Builder::new().spawn(|| ()); }
}
fn offload() { use std::thread::scope as sc; sc(|s| { s.spawn(|| ()); }); }
"#;
    let out = walk(&format!("{src}{}", routed("Farm", &["c.receiver.detach()"])), &[]);
    assert!(path_has(finding(&out, "router", SPAWN), "<crate::Farm>::detach"));
    assert!(path_has(finding(&out, "router", BUILDER), "<crate::Farm>::helper"));
    assert!(path_has(finding(&out, "router", SCOPE), "crate::offload"));
}

/// Was the source walk's `server_handler` fixture: a handler trait implemented by hand on a
/// receiver holding a pool. A root is what the crate serves: the object served through a
/// route is walked into its impl; the same impl that nothing serves is no root.
#[test]
fn a_handler_trait_implemented_by_hand_is_walked_where_it_is_served() {
    let handler = r#"
pub trait Handler: Send + Sync { fn call_tool(&self, c: ToolCallContext<Proxy>) -> u32; }
pub struct Proxy { pool: Pool }
impl Handler for Proxy { fn call_tool(&self, c: ToolCallContext<Proxy>) -> u32 { self.pool.query() + c.args.len() as u32 } }
pub fn serve(proxy: Proxy) -> Box<dyn Handler> { Box::new(proxy) }
"#;
    let served = format!(
        "{handler}{}",
        routed("Proxy", &["{ let h: &dyn Handler = &Proxy { pool: gateway::open() }; h.call_tool(c) }"])
    );
    let out = walk(&served, &[]);
    let f = through(&out, POOL, "<crate::Proxy as crate::Handler>::call_tool");
    assert!(f.root.contains("router"), "{f:#?}");
    let out = walk(handler, &[]);
    assert!(out.roots.iter().all(|r| !r.function.contains("call_tool")), "{:#?}", out.roots);
}

/// Was the source walk's `constructor_param` fixture.
#[test]
fn a_pool_a_constructor_captures_in_a_stored_closure_is_reached() {
    let src = r#"
pub struct Store { run: Box<dyn Fn(&str) -> u32 + Send + Sync> }
impl Store { pub fn new(pool: Pool) -> Self { Store { run: Box::new(move |s| pool.query() + s.len() as u32) } } }
pub struct Farm { store: Store }
impl Farm { pub fn list(&self) -> u32 { (self.store.run)("flocks") } }
"#;
    let out = walk(&format!("{src}{}", routed("Farm", &["c.receiver.list()"])), &[]);
    let f = finding(&out, "router", POOL);
    assert!(path_has(f, "<crate::Farm>::list") && path_has(f, "<crate::Store>::new::{closure#0}"), "{f:#?}");
}

/// Was the source walk's `boundary_leak` fixture (a boundary holding what its module may not:
/// here it starts a process, which no module may).
#[test]
fn a_boundary_reaching_what_its_module_may_not_is_a_finding_of_the_boundary() {
    let src = r#"
impl McpCallContext { pub fn audit(&self) -> u32 { let _ = std::process::Command::new("logger").status(); 0 } }
pub fn whoami(ctx: &McpCallContext, _a: &str) -> u32 { ctx.audit() }
"#;
    let out = walk(&format!("{src}{}", served(&["whoami"])), &[]);
    let f = finding(&out, "McpCallContext>::audit", COMMAND);
    assert_eq!(f.path[0].function, "<crate::gateway::McpCallContext>::audit");
    assert!(out.roots.iter().any(|r| r.why == RootKind::Boundary && r.function == f.root), "{:#?}", out.roots);
    // The tool's walk stops at the boundary: the boundary is the finding, not the tool.
    assert!(out.findings.iter().all(|f| !f.root.contains("router")), "{:#?}", out.findings);
}

/// Was the source walk's `clean` fixture.
#[test]
fn a_tool_using_only_the_boundary_and_its_own_types_passes() {
    let src = r#"
pub mod tools {
    use crate::McpCallContext;
    pub struct ListArgs { pub limit: Option<u32> }
    /// A local type that happens to be called `Pool`.
    pub struct Pool { size: usize }
    pub struct FarmTools { workers: Pool }
    impl FarmTools {
        pub fn list_flocks(&self, ctx: &McpCallContext, args: ListArgs) -> u32 {
            ctx.subject().len() as u32 + args.limit.unwrap_or(0) + vec![0u8; 4].len() as u32 + self.workers.size as u32
        }
    }
    pub fn args_of(args: &str) -> ListArgs { ListArgs { limit: args.parse().ok() } }
}
"#;
    let handler = "c.receiver.list_flocks(&McpCallContext::get(), tools::args_of(&c.args))";
    let out = walk(&format!("{src}{}", routed("tools::FarmTools", &[handler])), &[]);
    passes(&out);
    // The boundary's own insides (the identity it holds) are walked, and allowed where it is.
    assert!(
        out.roots.iter().any(|r| r.why == RootKind::Boundary && r.function.contains("McpCallContext>::subject")),
        "{:#?}",
        out.roots
    );
}

/// Was the source walk's `more_evasions` fixture (its `global`, `connect` and `free_tool` tools).
#[test]
fn a_pool_read_from_a_static_or_opened_in_the_body_and_identity_taken_by_a_free_tool_are_reached() {
    let src = r#"
use std::sync::OnceLock;
static POOL: OnceLock<Pool> = OnceLock::new();
pub fn global(_c: &McpCallContext, _a: &str) -> u32 { POOL.get().map_or(0, |p| p.query()) }
pub fn connect(_c: &McpCallContext, _a: &str) -> u32 { gateway::open().query() }
"#;
    let src = format!(
        "{src}pub struct Tools;\n{}pub fn free_tool(parts: TenantContext) -> u32 {{ parts.subject().len() as u32 }}\n{}",
        extractor("parts_of", "Tools", "TenantContext"),
        routed(
            "Tools",
            &[
                "global(&McpCallContext::get(), &c.args)",
                "connect(&McpCallContext::get(), &c.args)",
                "free_tool(parts_of(&c))",
            ]
        )
    );
    let out = walk(&src, &[]);
    through(&out, POOL, "crate::global");
    through(&out, OPEN, "crate::connect");
    through(&out, TENANT, "crate::free_tool");
}

/// Was the source walk's `more_evasions` fixture (its `deref` tool).
#[test]
fn a_pool_reached_by_auto_deref_of_a_parameter_is_reached() {
    let src = r#"
pub struct Wrapped(Pool);
impl std::ops::Deref for Wrapped { type Target = Pool; fn deref(&self) -> &Pool { &self.0 } }
pub struct Tools;
pub fn by_deref(w: Wrapped) -> u32 { w.query() }
"#;
    let src = format!(
        "{src}{}{}",
        extractor("wrapped_of", "Tools", "Wrapped"),
        routed("Tools", &["by_deref(wrapped_of(&c))"])
    );
    let out = walk(&src, &[]);
    let f = finding(&out, "router", POOL);
    assert!(path_has(f, "crate::by_deref"), "{f:#?}");
}

/// Was the source walk's `more_evasions` fixture (its `factory` tool).
#[test]
fn a_connection_in_an_enum_variant_a_callable_parameter_returns_is_reached() {
    let src = r#"
pub enum Source { Cached(u64), Live { conn: Db } }
pub fn factory(f: impl Fn(u8) -> Source) -> u32 {
    match f(1) { Source::Live { conn } => conn.begin(), Source::Cached(n) => n as u32 }
}
"#;
    let handler = "factory(|n| Source::Cached(n.into()))";
    let out = walk(&format!("{src}pub struct Tools;\n{}", routed("Tools", &[handler])), &[]);
    let f = finding(&out, "router", DB);
    assert!(path_has(f, "crate::factory::<"), "{f:#?}");
}

/// Was the source walk's `more_evasions` fixture (its `#[tool_set]` receiver `Registry`).
#[test]
fn identity_held_by_a_registered_tool_sets_receiver_is_reached() {
    let src = r#"
pub struct Registry { claims: TenantContext }
impl Registry { pub fn claims(&self) -> u32 { self.claims.subject().len() as u32 } }
"#;
    let out = walk(&format!("{src}{}", routed("Registry", &["c.receiver.claims()"])), &[]);
    let f = finding(&out, "router", TENANT);
    assert!(path_has(f, "<crate::Registry>::claims"), "{f:#?}");
}

/// Was the source walk's `detached_methods` fixture (tokio's handles, task sets and runtime
/// builders have no std stand-in: std's thread builder and scopes are the methods here).
#[test]
fn threads_started_by_builders_scopes_renames_bindings_macros_and_processes_are_reached() {
    let src = r#"
use std::process::Command;
use std::thread;
use std::thread::spawn as go;
pub fn builders(_a: &str) -> u32 { let _ = thread::Builder::new().name("worker".into()).spawn(|| ()); 0 }
pub fn scoped(_a: &str) -> u32 { thread::scope(|s| { s.spawn(|| ()); }); 0 }
pub fn renamed(_a: &str) -> u32 { go(|| ()); 0 }
pub fn bound(_a: &str) -> u32 { let detach = thread::spawn; detach(|| ()); 0 }
pub fn process(_a: &str) -> u32 { let _ = Command::new("sleep").arg("60").spawn(); 0 }
pub fn inside_a_macro(_a: &str) -> u32 { format!("{:?}", thread::spawn(|| ()).thread().id()).len() as u32 }
pub struct Keeper { cmd: Command }
impl Keeper { pub fn held(&self) -> u32 { self.cmd.get_program().len() as u32 } }
"#;
    let handlers = [
        "builders(&c.args)",
        "scoped(&c.args)",
        "renamed(&c.args)",
        "bound(&c.args)",
        "process(&c.args)",
        "inside_a_macro(&c.args)",
        "c.receiver.held()",
    ];
    let out = walk(&format!("{src}{}", routed("Keeper", &handlers)), &[]);
    for (item, function) in [
        (BUILDER, "crate::builders"),
        (SCOPE, "crate::scoped"),
        (SPAWN, "crate::renamed"),
        (SPAWN, "crate::bound"),
        (COMMAND, "crate::process"),
        (SPAWN, "crate::inside_a_macro"),
        (COMMAND, "<crate::Keeper>::held"),
    ] {
        through(&out, item, function);
    }
}

/// Was the source walk's `detached_methods` fixture (its `let detach = spawn_local` binding),
/// the spawn fn handed on as a value to another crate's generic code instead of called.
#[test]
fn a_spawn_fn_handed_to_a_combinator_is_reached() {
    let src =
        "pub fn handed(_c: &McpCallContext, _a: &str) -> u32 { let _ = Some(|| ()).map(std::thread::spawn); 0 }\n";
    let out = walk(&format!("{src}{}", served(&["handed"])), &[]);
    through(&out, SPAWN, "crate::handed");
}

/// Was the source walk's `foreign_impl` fixture.
#[test]
fn a_crate_trait_implemented_for_foreign_types_is_reached_by_bound_method_path_and_generic_impl() {
    let src = r#"
pub trait Leak { type Out; fn make(&self) -> Option<Self::Out>; }
impl Leak for u8 { type Out = Pool; fn make(&self) -> Option<Pool> { Some(gateway::open()) } }
pub struct Local;
impl Leak for Vec<Local> { type Out = (); fn make(&self) -> Option<()> { None } }
impl<T> Leak for Option<T> { type Out = u8; fn make(&self) -> Option<u8> { None } }
pub trait Whoami { fn who(&self, seed: u8) -> Option<TenantContext>; }
impl<T> Whoami for Option<T> { fn who(&self, _seed: u8) -> Option<TenantContext> { None } }
pub fn by_bound(source: impl Leak<Out = Pool>) -> u32 { source.make().map_or(0, |p| p.query()) }
pub fn by_method(_a: &str) -> u32 { 7u8.make().map_or(0, |p| p.query()) }
pub fn by_qself(_a: &str) -> u32 { <u8 as Leak>::make(&7).map_or(0, |p| p.query()) }
pub fn generic_self(_a: &str) -> u32 { Some(1u32).who(0).map_or(0, |t| t.subject().len() as u32) }
"#;
    let handlers = ["by_bound(7u8)", "by_method(&c.args)", "by_qself(&c.args)", "generic_self(&c.args)"];
    let out = walk(&format!("{src}pub struct Tools;\n{}", routed("Tools", &handlers)), &[]);
    for tool in ["crate::by_bound", "crate::by_method", "crate::by_qself"] {
        let f = through(&out, OPEN, tool);
        assert!(path_has(f, "<u8 as crate::Leak>::make"), "{f:#?}");
        through(&out, POOL, tool);
    }
    through(&out, TENANT, "crate::generic_self");
}

/// Was the source walk's `foreign_impl` fixture (its `detached` tool) and `implicit_calls`'
/// `Display for &Shown`: a crate trait's impl for a type that is not the crate's.
#[test]
fn a_spawn_in_a_crate_traits_impl_for_a_foreign_type_is_reached() {
    let src = r#"
pub trait Go { fn go(&self); }
impl Go for u16 { fn go(&self) { std::thread::spawn(|| ()); } }
pub struct Shown;
impl std::fmt::Display for &Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { let _ = std::thread::Builder::new(); write!(f, "shown") }
}
pub fn detached(_c: &McpCallContext, _a: &str) -> u32 { 1u16.go(); 0 }
pub fn displayed(_c: &McpCallContext, _a: &str) -> u32 { format!("{}", &Shown).len() as u32 }
"#;
    let out = walk(&format!("{src}{}", served(&["detached", "displayed"])), &[]);
    let f = through(&out, SPAWN, "crate::detached");
    assert!(path_has(f, "<u16 as crate::Go>::go"), "{f:#?}");
    let f = through(&out, BUILDER, "crate::displayed");
    assert!(path_has(f, "<&crate::Shown as core::fmt::Display>::fmt"), "{f:#?}");
}

/// Was the source walk's `macro_generated` fixture.
#[test]
fn items_written_by_macros_and_included_files_are_reached() {
    let src = r#"
macro_rules! holder { ($name:ident) => { pub struct $name { pub pool: Pool } }; }
macro_rules! helper_fn { ($name:ident) => { pub fn $name() { std::thread::spawn(|| ()); } }; }
macro_rules! pick_type { () => { TenantContext }; }
holder!(Sneaky);
helper_fn!(leak);
pub mod generated { include!("schema.rs"); }
pub struct Tools;
pub fn param(s: Sneaky) -> u32 { s.pool.query() }
pub fn call(_a: &str) -> u32 { leak(); 0 }
pub fn included(schema: generated::Schema) -> u32 { schema.db.begin() }
pub fn typed(t: pick_type!()) -> u32 { t.subject().len() as u32 }
"#;
    let src = format!(
        "{src}{}{}{}{}",
        extractor("sneaky_of", "Tools", "Sneaky"),
        extractor("schema_of", "Tools", "generated::Schema"),
        extractor("picked_of", "Tools", "pick_type!()"),
        routed("Tools", &["param(sneaky_of(&c))", "call(&c.args)", "included(schema_of(&c))", "typed(picked_of(&c))"])
    );
    let out = walk(&src, &[("schema.rs", "pub struct Schema { pub db: crate::gateway::Db }\n")]);
    through(&out, POOL, "crate::param");
    let f = through(&out, SPAWN, "crate::call");
    assert!(path_has(f, "crate::leak"), "{f:#?}");
    through(&out, DB, "crate::included");
    through(&out, TENANT, "crate::typed");
}

/// Was the source walk's `use_sites` fixture: each step names the line of the call leading on.
#[test]
fn each_step_names_the_line_of_its_use() {
    let src = r#"
use std::sync::OnceLock;
static LEAK: OnceLock<Pool> = OnceLock::new();
fn helper() -> u32 { let t: Option<TenantContext> = None; t.map_or(0, |t| t.subject().len() as u32) }
fn make<T>() -> Option<T> { None }
pub fn uses_static(_c: &McpCallContext, _a: &str) -> u32 {
    LEAK.get().map_or(0, |p| p.query()) // the static
}
pub fn uses_helper(_c: &McpCallContext, _a: &str) -> u32 {
    helper() // the helper
}
pub fn uses_turbofish(_c: &McpCallContext, _a: &str) -> u32 {
    make::<Pool>().map_or(0, |p| p.query()) // the turbofish
}
"#;
    let src = format!("{src}{}", served(&["uses_static", "uses_helper", "uses_turbofish"]));
    let out = walk(&src, &[]);
    let text = format!("{PRELUDE}\n{src}");
    let message = failure(&out).expect("the build fails");
    for (item, tool, needle) in [
        (POOL, "crate::uses_static", "// the static"),
        (TENANT, "crate::uses_helper", "// the helper"),
        (POOL, "crate::uses_turbofish", "// the turbofish"),
    ] {
        let f = through(&out, item, tool);
        let step = f.path.iter().find(|s| s.function == tool).unwrap();
        let at = step.at.clone().unwrap_or_else(|| panic!("no line: {f:#?}"));
        let (file, line) = (at.file, at.line);
        assert!(file.ends_with("lib.rs") && line == line_of(&text, needle), "{needle}: {f:#?}");
        assert!(message.contains(&format!("lib.rs:{line})")), "{message}");
    }
    assert!(path_has(through(&out, TENANT, "crate::uses_helper"), "crate::helper"));
}

/// Was the source walk's `use_sites` fixture (its `Vec::<Holder>` use): a call that may unwind
/// past a value to drop is an `invoke`, whose debug location is on the instruction's second line.
#[test]
fn the_line_of_a_call_made_while_a_value_is_held_is_named() {
    let src = r#"
pub struct Holder { pub conn: Db }
pub fn uses_holder(_c: &McpCallContext, _a: &str) -> u32 {
    let mut n = 0;
    for h in &Vec::<Holder>::new() {
        n += h.conn.begin(); // the holder
    }
    n
}
"#;
    let src = format!("{src}{}", served(&["uses_holder"]));
    let out = walk(&src, &[]);
    let f = through(&out, DB, "crate::uses_holder");
    let step = f.path.iter().find(|s| s.function == "crate::uses_holder").unwrap();
    assert_eq!(step.at.as_ref().map(|at| at.line), Some(line_of(&format!("{PRELUDE}\n{src}"), "// the holder")));
}

/// Was the source walk's `cfg_gated` fixture. The compiled walk sees the cfg arms the build
/// compiled, not the others: each build is checked as it is configured.
#[test]
fn a_cfg_gated_tool_module_and_the_compiled_arm_of_a_cfg_pair_are_walked() {
    let src = r#"
#[cfg(not(feature = "quiet"))]
pub mod admin { pub fn wipe(_c: &crate::McpCallContext, _a: &str) -> u32 { crate::gateway::open().query() } }
#[cfg(feature = "lite")]
pub struct Store { pub pool: Pool }
#[cfg(not(feature = "lite"))]
pub struct Store { pub conn: Db }
#[cfg(feature = "lite")]
fn open_store() -> Store { Store { pool: gateway::open() } }
#[cfg(not(feature = "lite"))]
fn open_store() -> Store { Store { conn: Db { pool: gateway::open() } } }
pub fn count(_c: &McpCallContext, _a: &str) -> u32 { open_store().conn.begin() }
"#;
    let out = walk(&format!("{src}{}", served(&["admin::wipe", "count"])), &[]);
    through(&out, OPEN, "crate::admin::wipe");
    through(&out, DB, "crate::count");
    through(&out, OPEN, "crate::open_store");
}

/// Was the source walk's `attribute_paths` fixture (serde's `with`, `deserialize_with` and
/// `try_from`: code a derive writes calls to; std's derives stand in for serde's).
#[test]
fn code_a_derive_calls_is_reached() {
    let src = r#"
pub struct Sneaky(u8);
impl Default for Sneaky { fn default() -> Self { std::thread::spawn(|| ()); Sneaky(0) } }
pub struct Pooled(u32);
impl Clone for Pooled { fn clone(&self) -> Self { Pooled(gateway::open().query()) } }
#[derive(Default)]
pub struct Args { pub count: Sneaky }
#[derive(Clone)]
pub struct Checked(pub Pooled);
pub fn with_args(_c: &McpCallContext, _a: &str) -> u32 { Args::default().count.0 as u32 }
pub fn checked(_c: &McpCallContext, _a: &str) -> u32 { Checked(Pooled(1)).clone().0.0 }
"#;
    let out = walk(&format!("{src}{}", served(&["with_args", "checked"])), &[]);
    let f = through(&out, SPAWN, "crate::with_args");
    assert!(path_has(f, "<crate::Args as core::default::Default>::default"), "{f:#?}");
    assert!(path_has(f, "<crate::Sneaky as core::default::Default>::default"), "{f:#?}");
    let f = through(&out, OPEN, "crate::checked");
    assert!(path_has(f, "<crate::Checked as core::clone::Clone>::clone"), "{f:#?}");
    assert!(path_has(f, "<crate::Pooled as core::clone::Clone>::clone"), "{f:#?}");
}

/// Was the source walk's `attribute_paths` fixture (`#[path]` under `cfg_attr` beside a decoy,
/// a file module declared in a body, `include!` of an expression and of items holding a tool).
#[test]
fn modules_named_by_path_attributes_and_included_code_are_what_was_compiled() {
    let src = r#"
#[cfg_attr(not(feature = "slow"), path = "fast.rs")]
pub mod engine;
include!("more_tools.rs");
pub fn cfg_path(_c: &McpCallContext, _a: &str) -> u32 { engine::run() }
pub fn included_expr(_c: &McpCallContext, _a: &str) -> u32 { include!("expr.rs") }
pub fn block_module(_c: &McpCallContext, _a: &str) -> u32 {
    #[path = "blk.rs"]
    mod blk;
    blk::go()
}
"#;
    let files = [
        ("fast.rs", "pub fn run() -> u32 {\n    crate::gateway::open().query()\n}\n"),
        ("engine.rs", "// A decoy: rustc compiles fast.rs.\npub fn run() -> u32 { 0 }\n"),
        (
            "more_tools.rs",
            "pub fn included_tool(_c: &McpCallContext, _a: &str) -> u32 { crate::McpCallContext::get().db().begin() }\n",
        ),
        ("expr.rs", "{\n    std::thread::spawn(|| ());\n    1\n}\n"),
        ("blk.rs", "pub fn go() -> u32 {\n    let _ = std::process::Command::new(\"true\").status();\n    0\n}\n"),
    ];
    let out =
        walk(&format!("{src}{}", served(&["cfg_path", "included_expr", "block_module", "included_tool"])), &files);
    let at = |f: &Finding, function: &str| {
        let step = f.path.iter().find(|s| s.function == function).unwrap_or_else(|| panic!("{f:#?}"));
        step.at.clone().map(|at| at.file).unwrap_or_default()
    };
    let f = through(&out, OPEN, "crate::cfg_path");
    assert!(at(f, "crate::engine::run").ends_with("fast.rs"), "{f:#?}");
    let f = through(&out, SPAWN, "crate::included_expr");
    assert!(at(f, "crate::included_expr").ends_with("expr.rs"), "{f:#?}");
    through(&out, COMMAND, "crate::block_module::blk::go");
    through(&out, DB, "crate::included_tool");
}

/// Was the source walk's `tool_elsewhere` case of `evasions.rs`: a tool is whatever is served,
/// wherever its route is built and whatever wrote it.
#[test]
fn tools_served_from_other_modules_fn_bodies_macros_and_hand_built_routes_are_roots() {
    let src = r#"
pub struct FarmTools;
pub mod other {
    use crate::*;
    fn elsewhere(_a: &str) -> u32 { std::thread::spawn(|| ()); 0 }
    pub fn elsewhere_router() -> ToolRouter<FarmTools> {
        ToolRouter { routes: Vec::new() }.with(|c: ToolCallContext<FarmTools>| elsewhere(&c.args))
    }
    pub fn in_body_router() -> ToolRouter<FarmTools> {
        fn in_body(_a: &str) -> u32 { let _ = std::process::Command::new("true").status(); 0 }
        ToolRouter { routes: Vec::new() }.with(|c: ToolCallContext<FarmTools>| in_body(&c.args))
    }
    pub fn hand_built() -> ToolRouter<FarmTools> {
        let route = ToolRoute { call: Box::new(|c: ToolCallContext<FarmTools>| gateway::open().query() + c.args.len() as u32) };
        ToolRouter { routes: vec![route] }
    }
}
pub mod generated {
    macro_rules! make_tool {
        ($name:ident) => {
            pub fn $name() -> crate::ToolRouter<crate::FarmTools> {
                crate::ToolRouter { routes: Vec::new() }
                    .with(|c: crate::ToolCallContext<crate::FarmTools>| crate::McpCallContext::get().db().begin() + c.args.len() as u32)
            }
        };
    }
    make_tool!(hidden);
    pub fn setup() -> crate::ToolRouter<crate::FarmTools> { make_tool!(from_a_body); from_a_body() }
}
"#;
    let out = walk(src, &[]);
    through(&out, SPAWN, "crate::other::elsewhere");
    through(&out, COMMAND, "crate::other::in_body_router::in_body");
    finding(&out, "crate::other::hand_built::{closure#0}", OPEN);
    finding(&out, "crate::generated::hidden::{closure#0}", DB);
    finding(&out, "crate::generated::setup::from_a_body::{closure#0}", DB);
}

/// Was the source walk's `unnamed_connectors` case of `evasions.rs`: pools opened by connectors
/// whose types the tool never writes.
#[test]
fn pools_opened_by_connectors_whose_types_are_never_written_are_reached() {
    let src = r#"
pub trait Connect { fn connect(&self) -> u32; }
impl Connect for Pool { fn connect(&self) -> u32 { self.query() } }
pub struct Conn(Pool);
impl std::str::FromStr for Conn { type Err = (); fn from_str(_s: &str) -> Result<Self, ()> { Ok(Conn(gateway::open())) } }
pub mod helpers {
    pub fn options(_url: &str) -> impl crate::Connect { crate::gateway::open() }
    pub fn lazy(_url: &str) -> u8 { let _ = crate::gateway::open(); 0 }
}
pub fn builder(_c: &McpCallContext, url: &str) -> u32 { std::iter::repeat_with(gateway::open).take(url.len()).map(|p| p.query()).sum() }
pub fn parsed(_c: &McpCallContext, url: &str) -> u32 { url.parse::<Conn>().map_or(0, |c| c.0.query()) }
pub fn through_helper(_c: &McpCallContext, url: &str) -> u32 { helpers::options(url).connect() }
pub fn lazy(_c: &McpCallContext, url: &str) -> u32 { helpers::lazy(url).into() }
"#;
    let out = walk(&format!("{src}{}", served(&["builder", "parsed", "through_helper", "lazy"])), &[]);
    through(&out, POOL, "crate::builder");
    let f = through(&out, OPEN, "crate::parsed");
    assert!(path_has(f, "<crate::Conn as core::str::traits::FromStr>::from_str"), "{f:#?}");
    through(&out, POOL, "crate::through_helper");
    through(&out, OPEN, "crate::helpers::options");
    through(&out, OPEN, "crate::helpers::lazy");
}

/// Was the source walk's `implicit_calls` case of `evasions.rs` (and the implicit conversion of
/// `?`, for `attribute_paths`' `try_from`).
#[test]
fn code_run_without_being_called_by_name_is_reached() {
    let src = r#"
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll, Waker};
pub struct Guard;
impl Drop for Guard { fn drop(&mut self) { std::thread::spawn(|| ()); } }
pub struct Settings;
impl Default for Settings { fn default() -> Self { let _ = std::thread::Builder::new(); Settings } }
pub struct Later;
impl Future for Later {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> { std::thread::scope(|_| ()); Poll::Ready(()) }
}
pub struct Wrapped;
impl std::ops::Deref for Wrapped { type Target = u32; fn deref(&self) -> &u32 { let _ = gateway::open(); &0 } }
pub mod hidden {
    pub struct Hidden;
    impl Hidden { pub fn leak(&self) { let _ = std::process::Command::new("true").status(); } }
    pub fn make() -> Hidden { Hidden }
}
static STARTED: LazyLock<u32> = LazyLock::new(|| { std::thread::spawn(|| ()); 1 });
const GO: fn(Box<dyn FnOnce() + Send>) -> std::thread::JoinHandle<()> = std::thread::spawn;
macro_rules! detach { ($e:expr) => { std::thread::spawn($e) }; }
pub struct Shown;
impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { let _ = std::thread::Builder::new(); write!(f, "shown") }
}
pub struct Raw;
pub struct Refused;
impl From<Raw> for Refused { fn from(_: Raw) -> Self { let _ = std::process::Command::new("true").status(); Refused } }
fn checked(a: &str) -> Result<u32, Refused> { if a.is_empty() { Err(Raw)? } Ok(1) }
async fn later() { Later.await }
pub fn by_macro(_c: &McpCallContext, _a: &str) -> u32 { detach!(|| ()); 0 }
pub fn displayed(_c: &McpCallContext, _a: &str) -> u32 { format!("{}", Shown).len() as u32 }
pub fn dropped(_c: &McpCallContext, _a: &str) -> u32 { let _g = Guard; 0 }
pub fn defaulted(_c: &McpCallContext, _a: &str) -> u32 { let _s: Settings = Default::default(); 0 }
pub fn awaited(_c: &McpCallContext, _a: &str) -> u32 {
    let mut f = std::pin::pin!(later());
    f.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready().into()
}
pub fn derefed(_c: &McpCallContext, _a: &str) -> u32 { *Wrapped }
pub fn inferred(_c: &McpCallContext, _a: &str) -> u32 { let h = hidden::make(); h.leak(); 0 }
pub fn lazy_static(_c: &McpCallContext, _a: &str) -> u32 { *STARTED }
pub fn const_fn_pointer(_c: &McpCallContext, _a: &str) -> u32 { GO(Box::new(|| ())); 0 }
pub fn converted(_c: &McpCallContext, a: &str) -> u32 { checked(a).unwrap_or(0) }
"#;
    let tools = [
        "by_macro",
        "displayed",
        "dropped",
        "defaulted",
        "awaited",
        "derefed",
        "inferred",
        "lazy_static",
        "const_fn_pointer",
        "converted",
    ];
    let out = walk(&format!("{src}{}", served(&tools)), &[]);
    for (item, tool, how) in [
        (SPAWN, "crate::by_macro", "crate::by_macro"),
        (BUILDER, "crate::displayed", "<crate::Shown as core::fmt::Display>::fmt"),
        (SPAWN, "crate::dropped", "<crate::Guard as core::ops::drop::Drop>::drop"),
        (BUILDER, "crate::defaulted", "<crate::Settings as core::default::Default>::default"),
        (SCOPE, "crate::awaited", "<crate::Later as core::future::future::Future>::poll"),
        (OPEN, "crate::derefed", "<crate::Wrapped as core::ops::deref::Deref>::deref"),
        (COMMAND, "crate::inferred", "<crate::hidden::Hidden>::leak"),
        (SPAWN, "crate::lazy_static", "crate::STARTED::{closure#0}"),
        (SPAWN, "crate::const_fn_pointer", "crate::const_fn_pointer"),
        (COMMAND, "crate::converted", "<crate::Refused as core::convert::From<crate::Raw>>::from"),
    ] {
        let f = through(&out, item, tool);
        assert!(path_has(f, how), "{tool} through {how}: {f:#?}");
    }
}

/// Was the source walk's `shadowed_names` case of `evasions.rs`.
#[test]
fn calls_behind_cfg_arms_and_shadowed_names_are_reached_and_a_real_shadow_passes() {
    let src = r#"
#[cfg(feature = "quiet")]
use std::convert::identity as go;
#[cfg(not(feature = "quiet"))]
use std::thread::spawn as go;
#[cfg(not(feature = "quiet"))]
use std::process::Command as Start;
#[cfg(feature = "quiet")]
use std::convert::identity as Start;
use std::thread::spawn;
use std::thread::scope as offload;
use std::thread::Builder as Detach;
pub fn cfg_arms(_c: &McpCallContext, _a: &str) -> u32 { go(|| ()); 0 }
pub fn cfg_arms_first(_c: &McpCallContext, _a: &str) -> u32 { let _ = Start::new("true").status(); 0 }
pub fn closure_param(_c: &McpCallContext, _a: &str) -> u32 { let double = |spawn: u8| spawn * 2; let _ = double(1); spawn(|| ()); 0 }
pub fn inner_block(_c: &McpCallContext, _a: &str) -> u32 { { let offload = 3; let _ = offload; } offload(|_| ()); 0 }
pub fn match_arm(_c: &McpCallContext, a: &str) -> u32 { match a.len() { spawn => { let _ = spawn; } } spawn(|| ()); 0 }
pub fn item_in_inner_block(_c: &McpCallContext, _a: &str) -> u32 { { fn spawn<T>(_: T) {} spawn(1); } spawn(|| ()); 0 }
pub fn use_in_inner_block(_c: &McpCallContext, _a: &str) -> u32 {
    { use std::convert::identity as Detach; let _ = Detach(1); }
    let _ = Detach::new();
    0
}
pub fn shadowed_for_real(_c: &McpCallContext, _a: &str) -> u32 { let spawn = |x: u8| x; spawn(1).into() }
"#;
    let tools = [
        "cfg_arms",
        "cfg_arms_first",
        "closure_param",
        "inner_block",
        "match_arm",
        "item_in_inner_block",
        "use_in_inner_block",
        "shadowed_for_real",
    ];
    let out = walk(&format!("{src}{}", served(&tools)), &[]);
    for (item, tool) in [
        (SPAWN, "crate::cfg_arms"),
        (COMMAND, "crate::cfg_arms_first"),
        (SPAWN, "crate::closure_param"),
        (SCOPE, "crate::inner_block"),
        (SPAWN, "crate::match_arm"),
        (SPAWN, "crate::item_in_inner_block"),
        (BUILDER, "crate::use_in_inner_block"),
    ] {
        through(&out, item, tool);
    }
    assert!(!out.findings.iter().any(|f| path_has(f, "crate::shadowed_for_real")), "{:#?}", out.findings);
}

/// Was the source walk's `processes` case of `evasions.rs`.
#[test]
fn processes_are_reached_whatever_starts_them() {
    let src = r#"
use std::process::Command as Shell;
pub fn status(_c: &McpCallContext, _a: &str) -> u32 { let _ = std::process::Command::new("sh").arg("-c").arg("nohup worker &").status(); 0 }
pub fn output(_c: &McpCallContext, _a: &str) -> u32 { Shell::new("sh").arg("-c").arg("worker &").output().map_or(0, |o| o.stdout.len() as u32) }
pub fn helper(_c: &McpCallContext, _a: &str) -> u32 { start("worker").map_or(0, |c| c.id()) }
pub fn start(name: &str) -> Option<std::process::Child> { Shell::new(name).spawn().ok() }
"#;
    let out = walk(&format!("{src}{}", served(&["status", "output", "helper"])), &[]);
    through(&out, COMMAND, "crate::status");
    through(&out, COMMAND, "crate::output");
    let f = through(&out, COMMAND, "crate::helper");
    assert!(path_has(f, "crate::start"), "{f:#?}");
}

/// Was the source walk's `false_positives` case of `evasions.rs` (with the locals and local
/// items of `macro_generated`'s `locals_and_prelude`).
#[test]
fn methods_named_like_a_dispatchers_and_items_declared_in_a_body_pass() {
    let src = r#"
pub mod dispatcher {
    use crate::gateway::TenantContext;
    pub trait Routes {
        fn get(&self, t: &TenantContext) -> Option<String>;
        fn has(&self, t: &TenantContext) -> bool;
        fn list(&self, t: &TenantContext) -> Vec<String>;
        fn call(&self, t: TenantContext);
    }
    pub struct Dispatcher;
    impl Routes for Dispatcher {
        fn get(&self, t: &TenantContext) -> Option<String> { Some(t.subject().to_owned()) }
        fn has(&self, t: &TenantContext) -> bool { !t.subject().is_empty() }
        fn list(&self, t: &TenantContext) -> Vec<String> { vec![t.subject().to_owned()] }
        fn call(&self, _t: TenantContext) {}
    }
    pub fn routes() -> Box<dyn Routes> { Box::new(Dispatcher) }
    thread_local! { static DEPTH: std::cell::Cell<u8> = const { std::cell::Cell::new(0) }; }
}
pub mod tools {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU8, Ordering};
    use crate::McpCallContext;
    pub fn roles(_c: &McpCallContext, a: &str) -> u32 {
        let roles: Vec<String> = a.split(',').map(String::from).collect();
        let first = roles.get(0).cloned();
        let mut index: HashMap<String, usize> = HashMap::new();
        index.insert("a".into(), 1);
        let _ = index.get("a");
        let _ = roles.iter().any(|r| r == "owner");
        let counter = AtomicU8::new(0);
        let _ = counter.load(Ordering::Acquire);
        let list = vec![1u8, 2];
        first.map_or(0, |f| f.len() as u32) + list.len() as u32
    }
    pub fn local_items(_c: &McpCallContext, a: &str) -> u32 {
        struct Row { name: String, eggs: u32 }
        type Pair = (u32, u32);
        enum Kind { Hen }
        fn inner() -> u8 { 1 }
        let rows: Vec<Row> = vec![Row { name: a.into(), eggs: 1 }];
        let pair: Pair = (1, 2);
        let _k = Kind::Hen;
        let name = |x: u32| x.to_string();
        let doubled = pair.1 * 2;
        rows.iter().map(|r| (r.name.len() as u32 + r.eggs)).sum::<u32>() + name(doubled).len() as u32 + u32::from(inner())
    }
}
pub use tools::{local_items, roles};
"#;
    let out = walk(&format!("{src}{}", served(&["roles", "local_items"])), &[]);
    passes(&out);
}
