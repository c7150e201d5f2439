//! The renderers: Markdown for auditors, JSON (round trip), SARIF 2.1.0, and the build message.

use serde_json::Value;

use crate::run;

#[test]
fn markdown_has_table_findings_trees_and_residue() {
    let md = run("constructor_param").to_markdown();
    assert!(md.contains("| id | protection | forbids | enforced by | proved by | status | known to pass (residue) |"));
    assert!(md.contains("| partly | a type of another crate that privately holds a pool"));
    assert!(md.contains("| G2 | No pools, connections or transactions in tools |"));
    assert!(md.contains("1. **G2** `Farm::list` reaches `sqlx::SqlitePool`"));
    assert!(md.contains("   - constructor `Store::new` (src/lib.rs:8)"));
    // The tree is a nested list: field under receiver type, constructor under the store type.
    assert!(md.contains("### `Farm::list` (src/lib.rs:19)"));
    assert!(md.contains("\n    - field `store` (src/lib.rs:14)\n"));
    assert!(md.contains("- param `pool` (src/lib.rs:8)\n"));
    assert!(md.contains("type `sqlx::SqlitePool` (src/lib.rs:8) **FORBIDDEN (G2)**"));
    for residue in [
        "Detached work the walk cannot see",
        "Macro-generated code",
        "unsafe and FFI",
        "Types from other crates are opaque",
        "cfg-gated code",
    ] {
        assert!(md.contains(residue), "residue lacks {residue}");
    }
    assert!(!md.contains("unreachable"), "the report must never claim unreachability");
}

#[test]
fn markdown_of_a_clean_crate_shows_the_boundary() {
    let md = run("clean").to_markdown();
    assert!(md.contains("No path from a tool to a forbidden type or call was found by the walk"));
    assert!(md.contains("(boundary: walk stops)"));
    assert!(md.contains("- **McpCallContext** (crate::context::McpCallContext"));
    assert!(md.contains("holds `crate::identity::ResolvedIdentity` (G1) named in `crate::context` (src/context.rs:7)"));
    assert!(md.contains("crossed by: FarmTools::list_flocks"));
}

#[test]
fn json_round_trips() {
    let report = run("spawn_in_tool_body");
    let back: guards::Report = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(back, report);
}

#[test]
fn sarif_has_the_required_fields() {
    let report = run("helper_two_levels");
    let sarif: Value = serde_json::from_str(&report.to_sarif()).unwrap();
    assert_eq!(sarif["version"], "2.1.0");
    assert_eq!(sarif["$schema"], guards::SARIF_SCHEMA);
    let run = &sarif["runs"][0];
    assert_eq!(run["tool"]["driver"]["name"], "scopegate-guards");
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), report.guard_rows.len());
    assert!(rules.iter().all(|r| r["id"].is_string() && r["shortDescription"]["text"].is_string()));
    let results = run["results"].as_array().unwrap();
    assert_eq!(results.len(), 1);
    let r = &results[0];
    assert_eq!(r["ruleId"], "G2");
    assert_eq!(r["level"], "error");
    assert!(
        r["message"]["text"]
            .as_str()
            .unwrap()
            .contains("Farm::count_eggs reaches forbidden sqlx::postgres::PgConnection")
    );
    let loc = &r["locations"][0]["physicalLocation"];
    assert_eq!(loc["artifactLocation"]["uri"], "src/service.rs");
    assert_eq!(loc["region"]["startLine"], 9);
    // The whole path, as related locations and as one code flow.
    let related = r["relatedLocations"].as_array().unwrap();
    assert_eq!(related.len(), 9);
    assert_eq!(related[0]["physicalLocation"]["artifactLocation"]["uri"], "src/lib.rs");
    assert_eq!(related[0]["message"]["text"], "tool Farm::count_eggs");
    let flow = r["codeFlows"][0]["threadFlows"][0]["locations"].as_array().unwrap();
    assert_eq!(flow.len(), 9);
    assert_eq!(flow[8]["location"]["physicalLocation"]["region"]["startLine"], 9);
    // Every rule index points at its rule.
    let idx = r["ruleIndex"].as_u64().unwrap() as usize;
    assert_eq!(rules[idx]["id"], "G2");
}

#[test]
fn sarif_of_a_clean_crate_has_no_results() {
    let sarif: Value = serde_json::from_str(&run("clean").to_sarif()).unwrap();
    assert_eq!(sarif["runs"][0]["results"].as_array().unwrap().len(), 0);
}

#[test]
fn build_failure_message_prints_every_path() {
    let report = run("trait_object_returns_pool");
    let msg = guards::failure_message(&report).unwrap();
    assert!(msg.contains("1 forbidden path(s)"));
    assert!(msg.contains("[G2] Farm::list reaches forbidden sqlx::AnyPool"));
    assert!(
        msg.contains(
            "   -> trait crate::Repo (src/lib.rs:3, used at src/lib.rs:8)\n   -> method pool (src/lib.rs:4)\n"
        )
    );
    let lines = guards::finding_lines(&report);
    assert_eq!(lines.len(), 1);
    assert!(lines[0].ends_with("type sqlx::AnyPool (src/lib.rs:4)"));
    assert!(guards::failure_message(&run("clean")).is_none());
}

#[test]
#[should_panic(expected = "reaches forbidden sqlx::PgPool")]
fn run_build_script_panics_on_findings() {
    guards::run_build_script(&guards::Options::new(crate::fixture("tool_struct_field")));
}

#[test]
fn write_reports_leaves_the_three_renderings() {
    let report = run("tool_struct_field");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("write_reports");
    std::fs::create_dir_all(&dir).unwrap();
    guards::write_reports(&report, &dir).unwrap();
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    assert_eq!(read(guards::REPORT_MD), report.to_markdown());
    assert_eq!(read(guards::REPORT_JSON), report.to_json());
    assert_eq!(read(guards::REPORT_SARIF), report.to_sarif());
}
