//! One fixture per evasion: each asserts the finding and its exact path, hop by hop.

use guards::{FindingKind, Mark, TreeNode};

use crate::{finding, hops, run};

/// Asserts the fixture has exactly these forbidden items and returns nothing else.
fn only(r: &guards::Report, forbidden: &[&str]) {
    let mut got: Vec<&str> = r.findings.iter().map(|f| f.forbidden.as_str()).collect();
    got.sort();
    let mut want = forbidden.to_vec();
    want.sort();
    assert_eq!(got, want, "{}", guards::finding_lines(r).join("\n"));
}

#[test]
fn direct_param() {
    let r = run("direct_param");
    only(&r, &["crate::identity::TenantContext"]);
    let f = finding(&r, "crate::identity::TenantContext");
    assert_eq!((f.guard_row.as_str(), f.kind), ("G1", FindingKind::Type));
    assert_eq!(
        hops(f),
        [
            "tool Farm::whoami src/tools.rs:9",
            "param tenant src/tools.rs:9",
            "type crate::identity::TenantContext src/identity.rs:1",
        ]
    );
}

#[test]
fn tool_struct_field() {
    let r = run("tool_struct_field");
    only(&r, &["sqlx::PgPool"]);
    assert_eq!(
        hops(finding(&r, "sqlx::PgPool")),
        [
            "tool Farm::list_flocks src/lib.rs:11",
            "receiver Farm src/lib.rs:9",
            "type crate::Farm src/lib.rs:4",
            "field pool src/lib.rs:6",
            "type sqlx::PgPool src/lib.rs:6",
        ]
    );
}

#[test]
fn helper_two_levels_down_with_a_cycle() {
    let r = run("helper_two_levels");
    only(&r, &["sqlx::postgres::PgConnection"]);
    assert_eq!(
        hops(finding(&r, "sqlx::postgres::PgConnection")),
        [
            "tool Farm::count_eggs src/lib.rs:11",
            "receiver Farm src/lib.rs:9",
            "type crate::Farm src/lib.rs:5",
            "field svc src/lib.rs:6",
            "type crate::service::Service src/service.rs:3",
            "field repo src/service.rs:4",
            "type crate::service::Repo src/service.rs:7",
            "field conn src/service.rs:9",
            "type sqlx::postgres::PgConnection src/service.rs:9",
        ]
    );
    // Repo points back at Service: the second visit is a leaf, so the walk ends.
    let tree = &r.tools[0].tree;
    assert!(find(tree, &|n| n.label == "crate::service::Service" && n.mark == Some(Mark::Visited)));
}

#[test]
fn type_alias() {
    let r = run("type_alias");
    only(&r, &["sqlx::PgPool"]);
    assert_eq!(
        hops(finding(&r, "sqlx::PgPool")),
        [
            "tool Farm::list src/lib.rs:9",
            "param db src/lib.rs:9",
            "alias crate::db::Db src/lib.rs:2",
            "type sqlx::PgPool src/lib.rs:2",
        ]
    );
}

#[test]
fn use_rename() {
    let r = run("use_rename");
    only(&r, &["crate::identity::TenantContext"]);
    assert_eq!(
        hops(finding(&r, "crate::identity::TenantContext")),
        [
            "tool Farm::whoami src/lib.rs:11",
            "param t src/lib.rs:11",
            "type crate::identity::TenantContext src/lib.rs:2",
        ]
    );
}

#[test]
fn reexport_through_other_modules() {
    // tools/flocks.rs: `use super::super::prelude::*` -> prelude: `pub use crate::identity::User`
    // -> identity/mod.rs: `pub use self::inner::CurrentUserContext as User`.
    let r = run("reexport");
    only(&r, &["crate::identity::inner::CurrentUserContext"]);
    assert_eq!(
        hops(finding(&r, "crate::identity::inner::CurrentUserContext")),
        [
            "tool Farm::mine src/tools/flocks.rs:7",
            "param me src/tools/flocks.rs:7",
            "type crate::identity::inner::CurrentUserContext src/identity/inner.rs:1",
        ]
    );
}

#[test]
fn wrappers() {
    let r = run("wrappers");
    only(&r, &["crate::identity::TenantContext", "crate::identity::FlockScope"]);
    assert_eq!(
        hops(finding(&r, "crate::identity::TenantContext")),
        [
            "tool Farm::deep src/lib.rs:15",
            "param a src/lib.rs:15",
            "type Option src/lib.rs:15",
            "type Vec src/lib.rs:15",
            "type std::sync::Arc src/lib.rs:15",
            "type Box src/lib.rs:15",
            "type crate::identity::TenantContext src/lib.rs:5",
        ]
    );
    // HashMap<String, [(u8, &FlockScope); 2]>: map values, arrays, tuples, references.
    assert_eq!(
        hops(finding(&r, "crate::identity::FlockScope")),
        [
            "tool Farm::deep src/lib.rs:15",
            "param b src/lib.rs:15",
            "type std::collections::HashMap src/lib.rs:15",
            "type crate::identity::FlockScope src/lib.rs:6",
        ]
    );
}

#[test]
fn http_request_types() {
    let r = run("http_request_types");
    only(&r, &["http::request::Parts", "http::HeaderMap"]);
    assert_eq!(
        hops(finding(&r, "http::request::Parts")),
        [
            "tool Farm::sneaky src/lib.rs:9",
            "param parts src/lib.rs:9",
            "type axum::Extension src/lib.rs:9",
            "type http::request::Parts src/lib.rs:9",
        ]
    );
    assert_eq!(finding(&r, "http::HeaderMap").guard_row, "G3");
}

#[test]
fn request_context() {
    let r = run("request_context");
    only(&r, &["rmcp::service::RequestContext"]);
    let f = finding(&r, "rmcp::service::RequestContext");
    assert_eq!(f.guard_row, "G4");
    assert_eq!(
        hops(f),
        ["tool Farm::raw src/lib.rs:7", "param ctx src/lib.rs:7", "type rmcp::service::RequestContext src/lib.rs:7",]
    );
}

#[test]
fn generic_bound_and_where_clause() {
    let r = run("generic_bound");
    assert_eq!(r.findings.len(), 2, "{}", guards::finding_lines(&r).join("\n"));
    let by_root = |root: &str| r.findings.iter().find(|f| f.root == root).map(hops).unwrap_or_default();
    assert_eq!(
        by_root("Farm::generic"),
        [
            "tool Farm::generic src/lib.rs:9",
            "bound T: HasPool src/lib.rs:9",
            "trait crate::HasPool src/lib.rs:1",
            "method pool src/lib.rs:2",
            "returns &sqlx::SqlitePool src/lib.rs:2",
            "type sqlx::SqlitePool src/lib.rs:2",
        ]
    );
    assert_eq!(
        by_root("Farm::where_clause"),
        [
            "tool Farm::where_clause src/lib.rs:14",
            "bound S: Send + HasPool src/lib.rs:16",
            "trait crate::HasPool src/lib.rs:1",
            "method pool src/lib.rs:2",
            "returns &sqlx::SqlitePool src/lib.rs:2",
            "type sqlx::SqlitePool src/lib.rs:2",
        ]
    );
}

#[test]
fn trait_object_returns_pool() {
    let r = run("trait_object_returns_pool");
    only(&r, &["sqlx::AnyPool"]);
    assert_eq!(
        hops(finding(&r, "sqlx::AnyPool")),
        [
            "tool Farm::list src/lib.rs:13",
            "receiver Farm src/lib.rs:11",
            "type crate::Farm src/lib.rs:7",
            "field repo src/lib.rs:8",
            "type Box src/lib.rs:8",
            "trait crate::Repo src/lib.rs:3",
            "method pool src/lib.rs:4",
            "returns AnyPool src/lib.rs:4",
            "type sqlx::AnyPool src/lib.rs:4",
        ]
    );
}

#[test]
fn stored_closure_factory_and_fn_pointer() {
    let r = run("closure_factory");
    only(&r, &["sqlx::Transaction", "sqlx::Executor"]);
    assert_eq!(
        hops(finding(&r, "sqlx::Transaction")),
        [
            "tool Farm::build src/lib.rs:16",
            "receiver Farm src/lib.rs:14",
            "type crate::Farm src/lib.rs:9",
            "field make src/lib.rs:10",
            "type Box src/lib.rs:10",
            "type Fn src/lib.rs:10",
            "type crate::Helper src/lib.rs:1",
            "field tx src/lib.rs:2",
            "type sqlx::Transaction src/lib.rs:2",
        ]
    );
    // `fn(u8) -> Other`, Other holding a `dyn sqlx::Executor`.
    assert_eq!(
        hops(finding(&r, "sqlx::Executor")),
        [
            "tool Farm::build src/lib.rs:16",
            "receiver Farm src/lib.rs:14",
            "type crate::Farm src/lib.rs:9",
            "field other src/lib.rs:11",
            "type crate::Other src/lib.rs:5",
            "field exec src/lib.rs:6",
            "type Box src/lib.rs:6",
            "type sqlx::Executor src/lib.rs:6",
        ]
    );
}

#[test]
fn spawn_in_tool_body() {
    let r = run("spawn_in_tool_body");
    only(
        &r,
        &["tokio::spawn", "std::thread::spawn", "tokio::task::spawn_blocking", ".block_on()", "tokio::runtime::Handle"],
    );
    assert!(r.findings.iter().all(|f| f.guard_row == "G5"));
    assert_eq!(
        hops(finding(&r, "tokio::spawn")),
        ["tool Farm::detach src/lib.rs:7", "body Farm::detach src/lib.rs:7", "call tokio::spawn src/lib.rs:8",]
    );
    // A helper method of the receiver (every body of a reached type's impls is read), through
    // `use std::thread`.
    assert_eq!(
        hops(finding(&r, "std::thread::spawn")),
        [
            "tool Farm::detach src/lib.rs:7",
            "receiver Farm src/lib.rs:5",
            "type crate::Farm src/lib.rs:3",
            "method Farm::helper src/lib.rs:14",
            "call std::thread::spawn src/lib.rs:15",
        ]
    );
    // A crate fn the body calls, with a body-local `use ... as sb` rename.
    assert_eq!(
        hops(finding(&r, "tokio::task::spawn_blocking")),
        [
            "tool Farm::detach src/lib.rs:7",
            "body Farm::detach src/lib.rs:7",
            "call crate::offload src/lib.rs:19",
            "call tokio::task::spawn_blocking src/lib.rs:23",
        ]
    );
    assert_eq!(
        hops(finding(&r, ".block_on()")),
        [
            "tool Farm::detach src/lib.rs:7",
            "body Farm::detach src/lib.rs:7",
            "call crate::offload src/lib.rs:19",
            "call .block_on() src/lib.rs:22",
        ]
    );
}

#[test]
fn server_handler_holding_a_pool() {
    let r = run("server_handler");
    only(&r, &["sqlx::PgPool", "rmcp::service::RequestContext"]);
    assert_eq!(r.tools[0].kind, guards::ToolKind::ServerHandler);
    assert_eq!(
        hops(finding(&r, "sqlx::PgPool")),
        [
            "tool Proxy as ServerHandler src/lib.rs:9",
            "receiver Proxy src/lib.rs:9",
            "type crate::Proxy src/lib.rs:5",
            "field pool src/lib.rs:6",
            "type sqlx::PgPool src/lib.rs:6",
        ]
    );
    assert_eq!(
        hops(finding(&r, "rmcp::service::RequestContext")),
        [
            "tool Proxy as ServerHandler src/lib.rs:9",
            "method Proxy::call_tool src/lib.rs:10",
            "param context src/lib.rs:13",
            "type rmcp::service::RequestContext src/lib.rs:13",
        ]
    );
}

#[test]
fn constructor_parameter() {
    let r = run("constructor_param");
    only(&r, &["sqlx::SqlitePool"]);
    assert_eq!(
        hops(finding(&r, "sqlx::SqlitePool")),
        [
            "tool Farm::list src/lib.rs:19",
            "receiver Farm src/lib.rs:17",
            "type crate::Farm src/lib.rs:13",
            "field store src/lib.rs:14",
            "type crate::Store src/lib.rs:3",
            "constructor Store::new src/lib.rs:8",
            "param pool src/lib.rs:8",
            "type sqlx::SqlitePool src/lib.rs:8",
        ]
    );
}

#[test]
fn boundary_leak() {
    // HeaderMap is not allowed in crate::context, so the boundary itself is a finding.
    let r = run("boundary_leak");
    only(&r, &["http::HeaderMap"]);
    let f = finding(&r, "http::HeaderMap");
    assert_eq!(f.kind, FindingKind::BoundaryLeak);
    assert_eq!(f.root, "boundary crate::context::McpCallContext");
    assert_eq!(
        hops(f),
        [
            "type crate::context::McpCallContext src/context.rs:1",
            "field headers src/context.rs:2",
            "type http::HeaderMap src/context.rs:2",
        ]
    );
}

#[test]
fn clean_tool_gives_no_finding() {
    let r = run("clean");
    assert!(r.findings.is_empty(), "{}", guards::finding_lines(&r).join("\n"));
    assert_eq!(r.tools.len(), 1);
    let tool = &r.tools[0];
    assert_eq!(tool.name, "FarmTools::list_flocks");
    assert_eq!(tool.module, "crate::tools::flocks");
    // The walk stops at McpCallContext ...
    assert!(find(&tool.tree, &|n| n.label == "crate::context::McpCallContext" && n.mark == Some(Mark::Boundary)));
    // ... but walks Parameters<ListArgs> into the crate type, and the local `Pool`.
    assert!(find(&tool.tree, &|n| n.label == "crate::tools::flocks::ListArgs"));
    assert!(find(&tool.tree, &|n| n.label == "crate::tools::flocks::Pool" && n.mark.is_none()));
    // The boundary's own insides: the identity, allowed in crate::context.
    let b = &r.boundaries[0];
    assert_eq!(b.crossed_by, ["FarmTools::list_flocks"]);
    assert_eq!(b.holds.len(), 1);
    assert_eq!(b.holds[0].forbidden, "crate::identity::ResolvedIdentity");
    assert_eq!(b.holds[0].module, "crate::context");
}

#[test]
fn tool_modules_filter() {
    // A #[tool] is a root wherever it is written: naming other tool modules does not hide it.
    let opts = guards::Options::new(crate::fixture("direct_param")).tool_modules(["crate::other"]);
    let r = guards::check(&opts).unwrap();
    assert_eq!(r.tools.len(), 1);
    assert_eq!(r.findings.len(), 1);
    // The tool modules only limit which handler-trait impls are roots (the gateway's
    // dispatcher, the sanctioned bridge, implements ServerHandler outside them).
    let opts = guards::Options::new(crate::fixture("server_handler")).tool_modules(["crate::other"]);
    let r = guards::check(&opts).unwrap();
    assert!(r.tools.iter().all(|t| t.kind != guards::ToolKind::ServerHandler), "{:?}", r.tools);
    let r = run("server_handler");
    assert!(r.tools.iter().any(|t| t.kind == guards::ToolKind::ServerHandler));
}

#[test]
fn missing_module_file_fails_closed() {
    let dir = std::env::temp_dir().join(format!("guards-missing-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/lib.rs"), "mod gone;\n").unwrap();
    std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"gone\"\n").unwrap();
    let err = guards::check(&guards::Options::new(&dir)).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(err.to_string().contains("module `gone`"), "{err}");
}

#[test]
fn a_crate_without_its_manifest_fails_closed() {
    // Without the dependencies, no name could be proved another crate's.
    let dir = std::env::temp_dir().join(format!("guards-no-manifest-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/lib.rs"), "pub struct Farm;\n").unwrap();
    let err = guards::check(&guards::Options::new(&dir)).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(err.to_string().contains("Cargo.toml"), "{err}");
}

fn find(n: &TreeNode, pred: &dyn Fn(&TreeNode) -> bool) -> bool {
    pred(n) || n.children.iter().any(|c| find(c, pred))
}

#[test]
fn more_evasions() {
    let r = run("more_evasions");
    let mut roots: Vec<&str> = r.tools.iter().map(|t| t.name.as_str()).collect();
    roots.sort();
    assert_eq!(
        roots,
        ["Farm::connect", "Farm::deref", "Farm::factory", "Farm::global", "Registry (tool_set)", "crate::free_tool",]
    );
    let path_of = |root: &str| {
        let f: Vec<_> = r.findings.iter().filter(|f| f.root == root).collect();
        // Deref is reached twice: its `Target` and `deref`'s return type, two sites.
        let want = if root == "Farm::deref" { 2 } else { 1 };
        assert_eq!(f.len(), want, "{root}: {}", guards::finding_lines(&r).join("\n"));
        hops(f[0])
    };
    // A static read in the body.
    assert_eq!(
        path_of("Farm::global"),
        [
            "tool Farm::global src/lib.rs:28",
            "body Farm::global src/lib.rs:28",
            "static crate::POOL src/lib.rs:6",
            "type std::sync::OnceLock src/lib.rs:6",
            "type sqlx::SqlitePool src/lib.rs:6",
        ]
    );
    // `impl Deref<Target = PgPool>` on a parameter type.
    assert_eq!(
        path_of("Farm::deref"),
        [
            "tool Farm::deref src/lib.rs:34",
            "param w src/lib.rs:34",
            "type crate::Wrapped src/lib.rs:10",
            "impl Deref for Wrapped src/lib.rs:12",
            "assoc_type Wrapped::Target src/lib.rs:13",
            "type sqlx::PgPool src/lib.rs:13",
        ]
    );
    // `impl Fn(u8) -> Source`, the enum's struct variant holding a connection.
    assert_eq!(
        path_of("Farm::factory"),
        [
            "tool Farm::factory src/lib.rs:37",
            "param f src/lib.rs:37",
            "type Fn src/lib.rs:37",
            "type crate::Source src/lib.rs:19",
            "variant Live src/lib.rs:21",
            "field conn src/lib.rs:21",
            "type sqlx::AnyConnection src/lib.rs:21",
        ]
    );
    // A pool built inside the body.
    assert_eq!(
        path_of("Farm::connect"),
        ["tool Farm::connect src/lib.rs:40", "body Farm::connect src/lib.rs:40", "type sqlx::PgPool src/lib.rs:41",]
    );
    assert_eq!(
        path_of("Registry (tool_set)"),
        [
            "tool Registry (tool_set) src/lib.rs:46",
            "receiver Registry src/lib.rs:46",
            "type crate::Registry src/lib.rs:46",
            "field claims src/lib.rs:47",
            "type crate::auth::Claims src/lib.rs:51",
        ]
    );
    assert_eq!(
        path_of("crate::free_tool"),
        ["tool crate::free_tool src/lib.rs:55", "param parts src/lib.rs:55", "type http::request::Parts src/lib.rs:55",]
    );
}

#[test]
fn a_tool_module_that_does_not_exist_is_no_error() {
    // A tool module that does not exist yet is no error, and the tools elsewhere are walked.
    let opts = guards::Options::new(crate::fixture("clean")).tool_modules(["crate::absent"]);
    let r = guards::check(&opts).unwrap();
    assert_eq!(r.tools.len(), run("clean").tools.len(), "{:?}", r.tools);
    assert!(r.findings.is_empty());
}

/// The forbidden (or unresolved) items found from one tool root, sorted.
fn from_root(r: &guards::Report, root: &str) -> Vec<String> {
    let mut v: Vec<String> = r.findings.iter().filter(|f| f.root == root).map(|f| f.forbidden.clone()).collect();
    v.sort();
    v
}

/// The one finding of `root` for `forbidden`.
fn finding_of<'a>(r: &'a guards::Report, root: &str, forbidden: &str) -> &'a guards::Finding {
    let all: Vec<&guards::Finding> = r.findings.iter().filter(|f| f.root == root && f.forbidden == forbidden).collect();
    assert_eq!(all.len(), 1, "{}", guards::finding_lines(r).join("\n"));
    all[0]
}

#[test]
fn detached_methods() {
    // Spawning as method calls on handles, task sets and builders, scoped threads, processes,
    // building a runtime, a `use` rename, a local binding and a held task set.
    let r = run("detached_methods");
    assert!(r.findings.iter().all(|f| f.guard_row == "G5"), "{}", guards::finding_lines(&r).join("\n"));
    for (root, want) in [
        ("Farm::handle_spawn", vec![".spawn()", "tokio::runtime::Handle"]),
        ("Farm::task_set", vec![".spawn()", "tokio::task::JoinSet"]),
        ("Farm::builders", vec![".spawn()", "std::thread::Builder", "tokio::runtime::Builder"]),
        ("Farm::scoped", vec![".spawn()", "std::thread::scope"]),
        ("Farm::renamed", vec!["tokio::spawn", "tokio::task::spawn_local"]),
        ("Farm::process", vec![".spawn()", "std::process::Command"]),
        ("Keeper::held", vec!["tokio::task::JoinSet"]),
        // Inside a macro whose input is not Rust the walk can read: found by name.
        ("Selecting::inside_a_macro", vec!["spawn_blocking"]),
    ] {
        assert_eq!(from_root(&r, root), want, "{root}:\n{}", guards::finding_lines(&r).join("\n"));
    }
    // `use tokio::spawn as go; go(..)` and `let detach = tokio::task::spawn_local; detach(..)`.
    assert_eq!(
        hops(finding_of(&r, "Farm::renamed", "tokio::spawn")),
        ["tool Farm::renamed src/lib.rs:34", "body Farm::renamed src/lib.rs:34", "call tokio::spawn src/lib.rs:35"]
    );
    assert_eq!(
        hops(finding_of(&r, "Farm::renamed", "tokio::task::spawn_local")).last().unwrap(),
        "call tokio::task::spawn_local src/lib.rs:36"
    );
    assert_eq!(hops(finding_of(&r, "Farm::handle_spawn", ".spawn()")).last().unwrap(), "call .spawn() src/lib.rs:11");
    // The report does not call G5 enforced: what it cannot see is named.
    let g5 = r.guard_rows.iter().find(|g| g.id == "G5").unwrap();
    assert_eq!(g5.status, "partly");
    assert!(g5.residue.iter().any(|x| x.contains("trait object")), "{:?}", g5.residue);
    assert!(r.residue.iter().any(|x| x.title.contains("Detached work") && x.detail.contains("Not seen")));
}

#[test]
fn local_trait_implemented_for_foreign_types() {
    // `impl Leak for u8 { type Out = PgPool }`, `impl<T> Whoami for Option<T>`, `impl Go for
    // u16` with a spawning body: reached through a bound, a method call, a qualified path.
    let r = run("foreign_impl");
    assert_eq!(from_root(&r, "Farm::by_bound"), ["sqlx::PgPool"]);
    assert_eq!(from_root(&r, "Farm::by_method"), ["sqlx::PgPool"]);
    assert_eq!(from_root(&r, "Farm::by_qself"), ["sqlx::PgPool"]);
    assert_eq!(from_root(&r, "Farm::generic_self"), ["crate::identity::TenantContext"]);
    assert_eq!(from_root(&r, "Farm::detached"), ["tokio::spawn"]);
    assert_eq!(
        hops(finding_of(&r, "Farm::by_bound", "sqlx::PgPool")),
        [
            "tool Farm::by_bound src/lib.rs:57",
            "param source src/lib.rs:57",
            "trait crate::Leak src/lib.rs:9",
            "impl Leak for u8 src/lib.rs:14",
            "assoc_type u8::Out src/lib.rs:15",
            "type sqlx::PgPool src/lib.rs:15",
        ]
    );
    assert_eq!(
        hops(finding_of(&r, "Farm::by_method", "sqlx::PgPool"))[..4],
        [
            "tool Farm::by_method src/lib.rs:62",
            "body Farm::by_method src/lib.rs:62",
            "call .make() src/lib.rs:63",
            "trait crate::Leak src/lib.rs:9",
        ]
    );
    assert_eq!(
        hops(finding_of(&r, "Farm::generic_self", "crate::identity::TenantContext"))[2..5],
        ["call .who() src/lib.rs:73", "trait crate::Whoami src/lib.rs:33", "method who src/lib.rs:34"]
    );
    // The body of the foreign type's impl method, reached by the method call (a reached
    // trait's impls are read whole).
    assert_eq!(
        hops(finding_of(&r, "Farm::detached", "tokio::spawn"))[2..],
        [
            "call .go() src/lib.rs:78",
            "trait crate::Go src/lib.rs:43",
            "impl Go for u16 src/lib.rs:47",
            "method u16::go src/lib.rs:48",
            "call tokio::spawn src/lib.rs:49"
        ]
    );
}

#[test]
fn macro_generated_items() {
    // Without the crate's own rules: every name no definition answers fails, naming the
    // macros that may have written it and the place the tool names it.
    let r = run("macro_generated");
    assert!(r.findings.iter().all(|f| f.kind == FindingKind::Unresolved && f.guard_row == "G9"));
    assert_eq!(from_root(&r, "Farm::param"), ["crate::Sneaky"]);
    assert_eq!(from_root(&r, "Farm::call"), ["crate::leak"]);
    assert_eq!(from_root(&r, "Farm::included"), ["crate::generated::Schema"]);
    assert_eq!(from_root(&r, "Farm::allowed"), ["crate::generated::Version"]);
    assert_eq!(from_root(&r, "Farm::undeclared"), ["crate::notadep"]);
    assert_eq!(from_root(&r, "Farm::typed"), ["crate::pick_type!"]);
    // Locals, closures, items inside the body, the prelude and primitives are not unresolved.
    assert_eq!(from_root(&r, "Farm::locals_and_prelude"), Vec::<String>::new());
    let sneaky = finding_of(&r, "Farm::param", "crate::Sneaky");
    assert_eq!(
        hops(sneaky),
        ["tool Farm::param src/lib.rs:28", "param s src/lib.rs:28", "type crate::Sneaky src/lib.rs:28"]
    );
    assert!(sneaky.reason.contains("`holder!` at src/lib.rs:17 (macro_rules! at src/lib.rs:1)"), "{}", sneaky.reason);
    let leak = finding_of(&r, "Farm::call", "crate::leak");
    assert_eq!(hops(leak).last().unwrap(), "call crate::leak src/lib.rs:32");
    assert!(leak.reason.contains("`helper_fn!` at src/lib.rs:18"), "{}", leak.reason);
    let schema = finding_of(&r, "Farm::included", "crate::generated::Schema");
    assert!(schema.reason.contains("`include!` at src/lib.rs:21"), "{}", schema.reason);
    assert!(!schema.reason.contains("holder!"), "only the macros of the module it is looked up in: {}", schema.reason);
    let msg = guards::failure_message(&r).unwrap();
    assert!(msg.contains("Farm::param reaches unresolved crate::Sneaky"), "{msg}");
    // Never "external": the tree marks it unresolved.
    let tool = r.tools.iter().find(|t| t.name == "Farm::param").unwrap();
    assert!(find(&tool.tree, &|n| n.label == "crate::Sneaky" && n.mark == Some(Mark::Unresolved)));
    assert!(!find(&tool.tree, &|n| n.mark == Some(Mark::External) && n.label.contains("Sneaky")));
}

#[test]
fn an_allowed_unresolved_item_is_residue_in_every_format() {
    let opts = guards::Options::new(crate::fixture("macro_generated")).extra_rules("guards.toml");
    let r = guards::check(&opts).unwrap();
    assert!(r.findings.iter().all(|f| f.forbidden != "crate::generated::Version"));
    assert_eq!(from_root(&r, "Farm::param"), ["crate::Sneaky"], "an allowance covers that exact item only");
    let residue = r.residue.iter().find(|x| x.item.as_deref() == Some("crate::generated::Version")).unwrap();
    assert!(residue.detail.starts_with("build.rs writes it from the package version"));
    assert_eq!(residue.reached_at.len(), 1);
    assert_eq!((residue.reached_at[0].file.as_str(), residue.reached_at[0].line), ("src/lib.rs", 39));
    let tool = r.tools.iter().find(|t| t.name == "Farm::allowed").unwrap();
    assert!(find(&tool.tree, &|n| n.label == "crate::generated::Version" && n.mark == Some(Mark::Allowed)));
    let md = r.to_markdown();
    assert!(md.contains("**Unresolved name allowed by the rules: `crate::generated::Version`**"), "{md}");
    assert!(md.contains("  - reached: type `crate::generated::Version` (src/lib.rs:39)"));
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert!(json["residue"].as_array().unwrap().iter().any(|x| x["item"] == "crate::generated::Version"));
    let sarif: serde_json::Value = serde_json::from_str(&r.to_sarif()).unwrap();
    let run = &sarif["runs"][0];
    let suppressed: Vec<&serde_json::Value> =
        run["results"].as_array().unwrap().iter().filter(|x| x["suppressions"].is_array()).collect();
    assert_eq!(suppressed.len(), 1);
    assert_eq!(suppressed[0]["ruleId"], "G9");
    assert_eq!(suppressed[0]["properties"]["item"], "crate::generated::Version");
    assert!(suppressed[0]["suppressions"][0]["justification"].as_str().unwrap().starts_with("build.rs writes it"));
    assert!(run["properties"]["residue"].as_array().unwrap().iter().any(|x| x["item"] == "crate::generated::Version"));
}

#[test]
fn messages_name_the_use_site() {
    // A static, a crate fn, a turbofish to a forbidden type and one to a crate type holding one.
    let r = run("use_sites");
    let msg = guards::failure_message(&r).unwrap();
    for want in [
        "-> static crate::LEAK (src/lib.rs:3, used at src/lib.rs:23)",
        "-> call crate::helper (src/lib.rs:9, used at src/lib.rs:24)",
        "-> type sqlx::SqlitePool (src/lib.rs:25)",
        "-> type crate::Holder (src/lib.rs:5, used at src/lib.rs:26)",
    ] {
        assert!(msg.contains(want), "missing {want:?} in:\n{msg}");
    }
    let f = finding(&r, "sqlx::PgPool");
    let hop = f.path.iter().find(|h| h.label == "crate::LEAK").unwrap();
    assert_eq!(hop.used_at, Some(guards::Site { file: "src/lib.rs".into(), line: 23 }));
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert!(json.to_string().contains(r#""used_at":{"file":"src/lib.rs","line":24}"#));
}

#[test]
fn cfg_gated_code_is_walked() {
    // A feature-gated tool module, and both arms of a cfg pair (a type and a fn).
    let r = run("cfg_gated");
    assert_eq!(from_root(&r, "Admin::wipe"), ["sqlx::PgPool"]);
    assert_eq!(from_root(&r, "Farm::count"), ["sqlx::AnyPool", "sqlx::PgConnection", "sqlx::SqlitePool"]);
    assert!(r.residue.iter().any(|x| x.title.contains("cfg-gated code is walked")));
    assert!(r.to_markdown().contains("cfg-gated code is walked as if enabled"));
}
