//! The rules file: the shipped rules, extension by a second file, and validation.

use guards::compiled::Policy;
use guards::{Enforcement, Options, Rules};

use crate::compiled::{PRELUDE, finding, path_has, served, walk_with};

#[test]
fn shipped_rules_cover_the_design() {
    let rules = Rules::parse(guards::DEFAULT_RULES, "rules.toml").unwrap();
    rules.validate().unwrap();
    let ids: Vec<&str> = rules.guard_row.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["G1", "G2", "G3", "G4", "G5", "G6", "G7", "G8"]);
    let defined: Vec<&str> = rules.forbidden_type.iter().flat_map(|t| t.defined.iter().map(String::as_str)).collect();
    for want in [
        "scopegate::identity::tenant::TenantContext",
        "scopegate::identity::user::CurrentUserContext",
        "scopegate::identity::flock_scope::FlockScope",
        "scopegate::identity::ResolvedIdentity",
        "scopegate::auth::Claims",
        "sqlx_core::pool::Pool",
        "sqlx_core::pool::connection::PoolConnection",
        "sqlx_core::transaction::Transaction",
        "sqlx_core::executor::Executor",
        "sqlx_core::acquire::Acquire",
        "sqlx_core::connection::Connection",
        "scopegate::store::Db",
        "http::request::Parts",
        "http::header::map::HeaderMap",
        "rmcp::service::RequestContext",
        "tokio::runtime::handle::Handle",
        "tokio::task::join_set::JoinSet",
        "std::thread::builder::Builder",
        "std::process::Command",
    ] {
        assert!(defined.contains(&want), "rules.toml lacks forbidden type {want}");
    }
    let calls: Vec<&str> = rules.forbidden_call.iter().flat_map(|c| c.defined.iter().map(String::as_str)).collect();
    for want in ["tokio::task::spawn::spawn", "std::thread::functions::spawn", "std::thread::scoped::scope"] {
        assert!(calls.contains(&want), "rules.toml lacks forbidden call {want}");
    }
    let g6 = rules.guard_row.iter().find(|r| r.id == "G6").unwrap();
    assert_eq!(g6.enforced_by, [Enforcement::RuntimeFailClosedFactory]);
    assert_eq!(rules.boundary[0].name, "McpCallContext");
    assert_eq!(rules.discovery.handler_types, ["rmcp::handler::server::tool::ToolCallContext"]);
}

#[test]
fn every_walk_row_names_a_test_of_this_binary() {
    let rules = Rules::parse(guards::DEFAULT_RULES, "rules.toml").unwrap();
    let sources = [("compiled", include_str!("compiled.rs")), ("ported", include_str!("ported.rs"))];
    for row in rules.guard_row.iter().filter(|r| r.enforced_by.contains(&Enforcement::BuildTimeWalk)) {
        for test in row.test.split(", ") {
            let (module, name) = test
                .strip_prefix("it::")
                .and_then(|t| t.split_once("::"))
                .unwrap_or_else(|| panic!("{}: test `{test}` is not in this binary", row.id));
            let src = sources.iter().find(|(m, _)| *m == module).map(|(_, s)| *s);
            assert!(
                src.is_some_and(|s| s.contains(&format!("fn {name}()"))),
                "{}: test `{test}` does not exist",
                row.id
            );
        }
    }
}

/// A SaaS's extension, as a file next to its manifest.
const EXTENSION: &str = r#"
[[guard_row]]
id = "S1"
title = "Billing secrets stay out of tools"
forbids = "the billing secret"
enforced_by = ["build-time walk"]
test = "it::rules::extension_adds_rules"
status = "enforced"

[[forbidden_type]]
name = "BillingSecret"
reason = "it charges any customer"
guard_row = "S1"
allowed_in = ["crate::billing"]
defined = ["fixture::billing::BillingSecret"]
"#;

fn with_extension(text: &str) -> Result<Rules, guards::GuardError> {
    let dir = tempfile_dir();
    std::fs::write(dir.join("guards.toml"), text).unwrap();
    let loaded = guards::load_rules(&Options::new(&dir).extra_rules("guards.toml"));
    std::fs::remove_dir_all(&dir).ok();
    loaded
}

fn tempfile_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "scopegate-rules-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn extension_adds_rules() {
    let rules = with_extension(EXTENSION).unwrap();
    assert_eq!(rules.guard_row.last().unwrap().id, "S1");
    assert_eq!(rules.guard_row.len(), 9);
    // The crate's own type, named by its crate, is `crate::` to the walk of that crate.
    let mut policy = Policy::from_rules(&rules, "fixture");
    let s1 = policy.forbidden.iter().find(|f| f.guard_row == "S1").unwrap();
    assert_eq!(s1.types, ["crate::billing::BillingSecret"]);
    // The fixture's stand-ins for the gateway, as the harness names them.
    policy.handler_types = vec!["crate::rmcp::ToolCallContext".into()];
    let src = r#"
pub mod billing {
    pub struct BillingSecret(String);
    impl BillingSecret { pub fn len(&self) -> usize { self.0.len() } }
    pub static KEY: std::sync::OnceLock<BillingSecret> = std::sync::OnceLock::new();
}
pub fn tool(_c: &McpCallContext, _a: &str) -> u32 { billing::KEY.get().map(|k| k.len() as u32).unwrap_or(0) }
"#;
    let out = walk_with(&format!("{src}{}", served(&["tool"])), &[], &policy);
    let f = finding(&out, "router", "crate::billing::BillingSecret");
    assert_eq!(f.guard_row, "S1");
    assert!(path_has(f, "crate::tool"), "{f:#?}");
    assert!(PRELUDE.contains("pub mod rmcp"));
}

#[test]
fn an_extension_cannot_replace_a_row() {
    let err = with_extension(&EXTENSION.replace("id = \"S1\"", "id = \"G1\"")).unwrap_err();
    assert!(err.to_string().contains("`G1` is already defined"), "{err}");
}

#[test]
fn validation_rejects_dangling_rows_and_rules_that_name_no_definition() {
    let dangling = "[[forbidden_type]]\nname = \"X\"\nreason = \"r\"\nguard_row = \"NOPE\"\ndefined = [\"a::X\"]\n";
    let err = Rules::parse(dangling, "t").unwrap().validate().unwrap_err();
    assert!(err.to_string().contains("unknown guard row `NOPE`"), "{err}");

    // A rule without `defined` would match nothing: refused, for every kind.
    for undefined in [
        "[[boundary]]\nname = \"McpCallContext\"\nreason = \"r\"\ndefined = []\n",
        "[[boundary]]\nname = \"McpCallContext\"\nreason = \"r\"\ndefined = [\"McpCallContext\"]\n",
    ] {
        let err = Rules::parse(undefined, "t").unwrap().validate().unwrap_err();
        assert!(err.to_string().contains("needs `defined`"), "{err}");
    }
    let err = shipped_with(|t| {
        t.replacen("defined = [\"std::process::Command\", \"tokio::process::Command\"]", "defined = []", 1)
    })
    .unwrap_err();
    assert!(err.to_string().contains("forbidden type `Command` needs `defined`"), "{err}");
    assert!(Rules::parse("[[forbidden_call]]\nname = \"spawn\"\nreason = \"r\"\nguard_row = \"G5\"\n", "t").is_err());

    let unknown_key = "[[boundary]]\nname = \"A\"\nreason = \"r\"\ndefined = [\"a::A\"]\npaths = [\"a\"]\n";
    assert!(Rules::parse(unknown_key, "t").is_err());
}

/// The shipped rules with `edit` applied to their text.
fn shipped_with(edit: impl Fn(&str) -> String) -> Result<(), guards::GuardError> {
    Rules::parse(&edit(guards::DEFAULT_RULES), "edited").unwrap().validate()
}

#[test]
fn validation_keeps_the_table_honest() {
    shipped_with(|t| t.to_string()).unwrap();
    // A row with residue can't read "enforced".
    let err = shipped_with(|t| t.replacen("status = \"partly\"", "status = \"enforced\"", 1)).unwrap_err();
    assert!(err.to_string().contains("reads `enforced` but lists residue"), "{err}");
    // "partly" names what passes.
    let err = shipped_with(|t| t.replacen("status = \"enforced\"", "status = \"partly\"", 1)).unwrap_err();
    assert!(err.to_string().contains("names no residue"), "{err}");
}
