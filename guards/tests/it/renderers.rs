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
    for residue in RESIDUE_CLASSES {
        assert!(md.contains(residue), "residue lacks {residue}");
    }
    assert!(!md.contains("unreachable"), "the report must never claim unreachability");
}

/// What the walk cannot see, by class: in every report, whatever the sources.
const RESIDUE_CLASSES: [&str; 10] = [
    "Tools the walk does not see",
    "Detached work the walk cannot see",
    "Macro-generated code",
    "Code named by attributes",
    "unsafe and FFI",
    "Types and functions from other crates are opaque",
    "Sanctioned boundaries",
    "Method calls resolved without type inference",
    "cfg-gated code",
    "Item-level macros of other crates",
];

#[test]
fn every_residue_class_is_in_every_format_and_its_rows_read_partly() {
    let r = run("macro_generated");
    let md = r.to_markdown();
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    let sarif = r.to_sarif();
    for class in RESIDUE_CLASSES {
        assert!(md.contains(class), "md lacks {class}");
        assert!(
            json["residue"].as_array().unwrap().iter().any(|x| x["title"].as_str().unwrap().contains(class)),
            "json lacks {class}"
        );
        assert!(sarif.contains(class), "sarif lacks {class}");
    }
    // The macros of other crates met in a build are listed, each where it is written (the
    // crate's own are not: a tool they write fails the build).
    let foreign = |r: &guards::Report| -> Vec<String> {
        let x = r.residue.iter().find(|x| x.title == "Item-level macros of other crates").unwrap();
        x.reached_at.iter().map(|h| format!("{} {}:{}", h.label, h.file, h.line)).collect()
    };
    assert_eq!(foreign(&r), Vec::<String>::new());
    assert_eq!(foreign(&run("false_positives")), ["thread_local! src/dispatcher.rs:28"]);
    // The rows whose residue these classes are read `partly`, never `enforced`.
    for row in &r.guard_rows {
        if ["G1", "G2", "G3", "G4", "G5", "G9"].contains(&row.id.as_str()) {
            assert!(row.status.starts_with("partly"), "{} reads {}", row.id, row.status);
            assert!(!row.residue.is_empty());
        }
    }
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
