//! The compiled walk's report: what was walked (the IR read, every root and how much it
//! reaches), every finding with its whole path and `file:line`, and the residue by class, as
//! Markdown for auditors, JSON and SARIF 2.1.0. It says only what the walk saw.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::compiled::{Finding, Outcome, Root, RootKind, Step};
use crate::rules::{GuardRow, Rules};
use crate::sarif::SARIF_SCHEMA;

/// Schema version of the compiled walk's JSON report.
pub const COMPILED_REPORT_VERSION: &str = "2";

/// The `walk` of a report whose walk did not run.
const NOT_RUN: &str = "not run";

/// Everything one compiled walk found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledReport {
    /// Always `scopegate-guards`.
    pub generator: String,
    /// [`COMPILED_REPORT_VERSION`].
    pub version: String,
    /// `compiled`: the walk read the LLVM IR rustc compiled; `not run`: this build was not
    /// walked (the residue says why) and the report says nothing about its code.
    pub walk: String,
    /// The library walked, as rustc names it.
    pub crate_name: String,
    /// How much was read.
    pub ir: IrRead,
    /// The guard table of the rules applied.
    pub guard_rows: Vec<GuardRow>,
    /// Every root walked: tool handlers, registered argument checks, boundary functions.
    pub roots: Vec<Root>,
    /// Every path from a root to a forbidden item; empty when the build passed.
    pub findings: Vec<Finding>,
    /// What the walk does not see, by class.
    pub residue: Vec<ResidueClass>,
}

/// The IR the walk read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IrRead {
    /// Bytes of LLVM IR text.
    pub bytes: u64,
    /// Codegen units (one file each).
    pub units: usize,
    /// Functions defined (the crate's and the generic code it instantiates).
    pub functions: usize,
    /// Seconds to read and walk it.
    pub seconds: f64,
}

/// One class of what the walk does not see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResidueClass {
    /// Short name.
    pub class: String,
    /// What it is and what backs it up.
    pub detail: String,
    /// The instances seen on the walk, where the walk can name them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<String>,
}

/// The classes every compiled report lists (the instances only for the first).
fn residue(outcome: &Outcome) -> Vec<ResidueClass> {
    let class =
        |class: &str, detail: &str| ResidueClass { class: class.into(), detail: detail.into(), items: Vec::new() };
    vec![
        ResidueClass {
            class: "other crates' functions".into(),
            detail: "functions of other crates a tool calls that are not compiled in this crate (non-generic, or \
                     generic and already instantiated upstream): called, their insides unseen; the forbidden items \
                     they are named by are still matched"
                .into(),
            items: outcome.opaque.iter().cloned().collect(),
        },
        class(
            "callables handed to other crates",
            "a callable given to another crate's own code and called back by it (a panic hook, a global logger \
             or subscriber, an inventory-style registry); boxed closures called through `dyn Fn` are walked",
        ),
        class(
            "trait objects kept by unreached code",
            "a trait object other than a callable, stored by code the walk does not reach and called inside \
             another crate's code (a call in the crate's own code reaches every impl of its shape)",
        ),
        class(
            "fields read in place",
            "a forbidden type whose public fields a function reads without calling anything of it (the \
             identity types keep their fields private to their module for this reason)",
        ),
        class(
            "inline(always)",
            "a forbidden type's #[inline(always)] method, which rustc inlines even unoptimised: a tool calling \
             only that leaves no trace of the type",
        ),
        class("executors the rules do not name", "spawn functions of crates other than tokio, std and futures"),
        class("unsafe code and FFI", "a raw pointer or a foreign function can reach anything"),
    ]
}

impl CompiledReport {
    /// The report of `outcome` under `rules`.
    pub fn new(crate_name: &str, rules: &Rules, outcome: &Outcome, ir: IrRead) -> Self {
        Self {
            generator: "scopegate-guards".into(),
            version: COMPILED_REPORT_VERSION.into(),
            walk: "compiled".into(),
            crate_name: crate_name.into(),
            ir,
            guard_rows: rules.guard_row.clone(),
            roots: outcome.roots.clone(),
            findings: outcome.findings.clone(),
            residue: residue(outcome),
        }
    }

    /// The report of a build the compiled walk did not run on, saying why: it has no guard
    /// table, no roots and no findings, and every format says it was not run.
    pub fn not_run(crate_name: &str, why: &str) -> Self {
        Self {
            generator: "scopegate-guards".into(),
            version: COMPILED_REPORT_VERSION.into(),
            walk: NOT_RUN.into(),
            crate_name: crate_name.into(),
            ir: IrRead { bytes: 0, units: 0, functions: 0, seconds: 0.0 },
            guard_rows: Vec::new(),
            roots: Vec::new(),
            findings: Vec::new(),
            residue: vec![ResidueClass { class: NOT_RUN.into(), detail: why.into(), items: Vec::new() }],
        }
    }

    /// Did the walk run (or is this [`CompiledReport::not_run`])?
    pub fn walked(&self) -> bool {
        self.walk == "compiled"
    }

    /// Writes the report into `dir` in its three formats ([`crate::COMPILED_MD`],
    /// [`crate::COMPILED_JSON`], [`crate::COMPILED_SARIF`]).
    pub fn write_to(&self, dir: &std::path::Path) -> Result<(), crate::GuardError> {
        let files = [
            (crate::COMPILED_MD, self.to_markdown()),
            (crate::COMPILED_JSON, self.to_json()),
            (crate::COMPILED_SARIF, self.to_sarif()),
        ];
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .map_err(|e| crate::GuardError::Io { path: path.display().to_string(), message: e.to_string() })?;
        }
        Ok(())
    }

    /// As JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// As Markdown, for auditors.
    pub fn to_markdown(&self) -> String {
        let mut md = format!("# Compiled guard: `{}`\n\n", self.crate_name);
        if !self.walked() {
            md.push_str("**Not run.** ");
            for r in &self.residue {
                md.push_str(&r.detail);
                md.push('\n');
            }
            return md;
        }
        let tools = self.roots.iter().filter(|r| r.why != RootKind::Boundary).count();
        md.push_str(&format!(
            "Walked the LLVM IR rustc compiled for the library: {} roots ({} serving tools), {} findings.\n\n",
            self.roots.len(),
            tools,
            self.findings.len()
        ));
        md.push_str(&format!(
            "Read {} MB of IR in {} codegen unit(s) ({} functions) and walked it in {:.1} s.\n\n",
            self.ir.bytes / 1_000_000,
            self.ir.units,
            self.ir.functions,
            self.ir.seconds
        ));
        md.push_str("## Guard table\n\n| row | title | status |\n|---|---|---|\n");
        for r in &self.guard_rows {
            md.push_str(&format!("| {} | {} | {} |\n", r.id, cell(&r.title), cell(&r.status)));
        }
        md.push_str("\n## Findings\n\n");
        if self.findings.is_empty() {
            md.push_str("None.\n");
        }
        for f in &self.findings {
            md.push_str(&format!("- **{}** `{}` reaches `{}`: {}\n", f.guard_row, f.root, f.item, f.reason));
            for step in &f.path {
                md.push_str(&format!("  - `{}`{}\n", step.function, at(step)));
            }
        }
        md.push_str("\n## Roots\n\n| root | why | functions reached |\n|---|---|---|\n");
        for r in &self.roots {
            md.push_str(&format!("| `{}` | {:?} | {} |\n", cell(&r.function), r.why, r.reached));
        }
        md.push_str("\n## Residue\n\n");
        for r in &self.residue {
            md.push_str(&format!("- **{}**: {}", r.class, r.detail));
            if r.items.is_empty() {
                md.push('\n');
            } else {
                md.push_str(&format!(" ({} on this walk):\n", r.items.len()));
                for i in &r.items {
                    md.push_str(&format!("  - `{i}`\n"));
                }
            }
        }
        md
    }

    /// As a SARIF 2.1.0 log: one rule per guard row, one result per finding, its path as a
    /// code flow.
    pub fn to_sarif(&self) -> String {
        let rules: Vec<Value> = self
            .guard_rows
            .iter()
            .map(|r| {
                json!({
                    "id": r.id,
                    "name": r.title,
                    "shortDescription": { "text": r.title },
                    "fullDescription": { "text": format!("Forbids: {}", r.forbids) },
                    "defaultConfiguration": { "level": "error" },
                    "properties": { "status": r.status, "residue": r.residue }
                })
            })
            .collect();
        let results: Vec<Value> = self
            .findings
            .iter()
            .map(|f| {
                let located: Vec<&Step> = f.path.iter().filter(|s| s.at.is_some()).collect();
                let flow: Vec<Value> = located
                    .iter()
                    .enumerate()
                    .map(|(i, s)| json!({ "location": location(s), "executionOrder": i }))
                    .collect();
                let chain: Vec<&str> = f.path.iter().map(|s| s.function.as_str()).collect();
                let mut result = json!({
                    "ruleId": f.guard_row,
                    "level": "error",
                    "message": { "text": format!("{} reaches {} ({}): {}", f.root, f.item, f.reason, chain.join(" -> ")) },
                    "locations": located.first().map(|s| vec![location(s)]).unwrap_or_default(),
                    "codeFlows": [ { "threadFlows": [ { "locations": flow } ] } ],
                    "properties": { "root": f.root, "item": f.item }
                });
                if let Some(i) = self.guard_rows.iter().position(|r| r.id == f.guard_row) {
                    result["ruleIndex"] = json!(i);
                }
                result
            })
            .collect();
        let log = json!({
            "$schema": SARIF_SCHEMA,
            "version": "2.1.0",
            "runs": [ {
                "tool": { "driver": { "name": "scopegate-guards", "version": env!("CARGO_PKG_VERSION"), "rules": rules } },
                "originalUriBaseIds": { "%SRCROOT%": { "description": { "text": "the crate root" } } },
                "results": results,
                "invocations": [ self.invocation() ],
                "properties": { "walk": self.walk, "residue": self.residue }
            } ]
        });
        serde_json::to_string_pretty(&log).unwrap_or_default()
    }
}

impl CompiledReport {
    /// SARIF's account of the run: a walk that did not run did not execute successfully, so
    /// its empty results say nothing.
    fn invocation(&self) -> Value {
        if self.walked() {
            return json!({ "executionSuccessful": true });
        }
        let why: Vec<&str> = self.residue.iter().map(|r| r.detail.as_str()).collect();
        json!({
            "executionSuccessful": false,
            "toolExecutionNotifications": [ { "level": "error", "message": { "text": why.join(" ") } } ]
        })
    }
}

fn location(s: &Step) -> Value {
    let (file, line) = s.at.as_ref().map(|l| (l.file.as_str(), l.line)).unwrap_or_default();
    json!({
        "physicalLocation": {
            "artifactLocation": { "uri": file, "uriBaseId": "%SRCROOT%" },
            "region": { "startLine": line.max(1) }
        },
        "message": { "text": s.function }
    })
}

fn at(step: &Step) -> String {
    match &step.at {
        Some(l) => format!(" at {}:{}", l.file, l.line),
        None => String::new(),
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiled::{Finding, Location, Outcome, Step};

    fn report() -> CompiledReport {
        let rules = Rules::parse(crate::rules::DEFAULT_RULES, "rules.toml").unwrap();
        let outcome = Outcome {
            roots: vec![Root { function: "crate::tool".into(), why: RootKind::Handler, reached: 3 }],
            findings: vec![Finding {
                root: "crate::tool".into(),
                path: vec![
                    Step { function: "crate::tool".into(), at: Some(Location { file: "src/tool.rs".into(), line: 7 }) },
                    Step { function: "<sqlx_core::pool::Pool<X>>::acquire".into(), at: None },
                ],
                item: "sqlx_core::pool::Pool".into(),
                guard_row: "G2".into(),
                reason: "a pool".into(),
            }],
            opaque: ["std::process::id".to_owned()].into_iter().collect(),
        };
        CompiledReport::new("probe", &rules, &outcome, IrRead { bytes: 1, units: 1, functions: 2, seconds: 0.1 })
    }

    #[test]
    fn every_format_carries_the_finding_with_its_place() {
        let r = report();
        let md = r.to_markdown();
        assert!(md.contains("- **G2** `crate::tool` reaches `sqlx_core::pool::Pool`"), "{md}");
        assert!(md.contains("  - `crate::tool` at src/tool.rs:7"), "{md}");
        assert!(md.contains("`std::process::id`"), "{md}");
        let json: CompiledReport = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json, r);
        let sarif: Value = serde_json::from_str(&r.to_sarif()).unwrap();
        let result = &sarif["runs"][0]["results"][0];
        assert_eq!(result["ruleId"], "G2");
        assert_eq!(result["locations"][0]["physicalLocation"]["region"]["startLine"], 7);
        assert_eq!(result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], "src/tool.rs");
        assert_eq!(sarif["runs"][0]["invocations"][0]["executionSuccessful"], true);
    }

    #[test]
    fn a_build_not_walked_says_so_in_every_format() {
        let r = CompiledReport::not_run("probe", "compiled without the wrapper");
        assert!(!r.walked());
        assert!(r.to_markdown().contains("**Not run.** compiled without the wrapper"), "{}", r.to_markdown());
        let json: CompiledReport = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!((json.walk.as_str(), json.guard_rows.len()), ("not run", 0));
        let sarif: Value = serde_json::from_str(&r.to_sarif()).unwrap();
        let run = &sarif["runs"][0];
        assert_eq!(run["invocations"][0]["executionSuccessful"], false);
        assert_eq!(
            run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"],
            "compiled without the wrapper"
        );
        assert_eq!(run["properties"]["walk"], "not run");
    }
}
