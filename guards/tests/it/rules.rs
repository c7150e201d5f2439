//! The rules file: the shipped rules, extension by a second file, and validation.

use guards::{Enforcement, Options, Rules};

use crate::{finding, fixture, hops};

#[test]
fn shipped_rules_cover_the_design() {
    let rules = Rules::parse(guards::DEFAULT_RULES, "rules.toml").unwrap();
    rules.validate().unwrap();
    let ids: Vec<&str> = rules.guard_row.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["G1", "G2", "G3", "G4", "G5", "G6", "G7", "G8", "G9"]);
    let names: Vec<&str> = rules.forbidden_type.iter().map(|t| t.name.as_str()).collect();
    for want in [
        "TenantContext",
        "CurrentUserContext",
        "FlockScope",
        "ResolvedIdentity",
        "Claims",
        "Pool",
        "PgPool",
        "SqlitePool",
        "AnyPool",
        "MySqlPool",
        "PoolConnection",
        "PgConnection",
        "SqliteConnection",
        "AnyConnection",
        "Transaction",
        "Executor",
        "Acquire",
        "Parts",
        "Extensions",
        "HeaderMap",
        "Request",
        "RequestContext",
    ] {
        assert!(names.contains(&want), "rules.toml lacks forbidden type {want}");
    }
    let calls: Vec<&str> = rules.forbidden_call.iter().map(|c| c.path.as_str()).collect();
    for want in ["spawn", "block_on", "thread::scope"] {
        assert!(calls.contains(&want), "rules.toml lacks forbidden call {want}");
    }
    for want in ["Runtime", "Builder", "Handle", "JoinSet", "LocalSet"] {
        assert!(names.contains(&want), "rules.toml lacks G5 type {want}");
    }
    // No row reads "enforced" while it names what passes it.
    for row in &rules.guard_row {
        assert!(!row.status.starts_with("enforced") || row.residue.is_empty(), "{}", row.id);
    }
    let g6 = rules.guard_row.iter().find(|r| r.id == "G6").unwrap();
    assert_eq!(g6.enforced_by, [Enforcement::RuntimeFailClosedFactory]);
    assert_eq!(rules.boundary[0].name, "McpCallContext");
}

#[test]
fn every_walk_row_names_a_test_of_this_binary() {
    let rules = Rules::parse(guards::DEFAULT_RULES, "rules.toml").unwrap();
    let sources = [
        ("fixtures", include_str!("fixtures.rs")),
        ("evasions", include_str!("evasions.rs")),
        ("rules", include_str!("rules.rs")),
    ];
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

#[test]
fn extension_adds_rules() {
    let base = guards::check(&Options::new(fixture("extension"))).unwrap();
    assert!(base.findings.is_empty());
    let r = guards::check(&Options::new(fixture("extension")).extra_rules("guards.toml")).unwrap();
    assert_eq!(r.guard_rows.last().unwrap().id, "S1");
    assert_eq!(r.guard_rows.len(), 10);
    let f = finding(&r, "crate::BillingSecret");
    assert_eq!(f.guard_row, "S1");
    assert_eq!(
        hops(f),
        ["tool Billing::invoice src/lib.rs:9", "param secret src/lib.rs:9", "type crate::BillingSecret src/lib.rs:1",]
    );
}

#[test]
fn an_extension_cannot_replace_a_row() {
    let err = guards::check(&Options::new(fixture("extension")).extra_rules("duplicate.toml")).unwrap_err();
    assert!(err.to_string().contains("`G1` is already defined"), "{err}");
}

#[test]
fn validation_rejects_dangling_rows_and_pathless_boundaries() {
    let dangling = r#"
        [[forbidden_type]]
        name = "X"
        reason = "r"
        guard_row = "NOPE"
    "#;
    let err = Rules::parse(dangling, "t").unwrap().validate().unwrap_err();
    assert!(err.to_string().contains("unknown guard row `NOPE`"), "{err}");

    let pathless = r#"
        [[boundary]]
        name = "McpCallContext"
        paths = []
        reason = "r"
    "#;
    let err = Rules::parse(pathless, "t").unwrap().validate().unwrap_err();
    assert!(err.to_string().contains("needs at least one path"), "{err}");

    let unknown_key = "[[boundary]]\nname = \"A\"\npaths = [\"a\"]\nreason = \"r\"\nallowed = 1\n";
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
    // The unresolved-names row can't be dropped from a base file.
    let err = shipped_with(|t| t.replace("id = \"G9\"", "id = \"G10\"")).unwrap_err();
    assert!(err.to_string().contains("`G9`"), "{err}");
    // A path-only type needs paths; an allowance needs a crate item and a reason.
    let err = shipped_with(|t| t.replace("paths = [\"tokio::task::JoinSet\"]", "paths = []")).unwrap_err();
    assert!(err.to_string().contains("matches by paths only"), "{err}");
    let err =
        shipped_with(|t| format!("{t}\n[[allow_unresolved]]\nitem = \"Generated\"\nreason = \"r\"\n")).unwrap_err();
    assert!(err.to_string().contains("allow_unresolved `Generated`"), "{err}");
    let err = shipped_with(|t| format!("{t}\n[[allow_unresolved]]\nitem = \"crate::Generated\"\nreason = \" \"\n"))
        .unwrap_err();
    assert!(err.to_string().contains("and a reason"), "{err}");
}
