//! SARIF 2.1.0 rendering of a report: one rule per guard row, one result per finding, the
//! whole path as related locations and a code flow. It adds nothing the report does not say.

use serde_json::{Value, json};

use crate::report::{Hop, Report};
use crate::rules::UNRESOLVED_ROW;

/// The SARIF 2.1.0 schema URI written into `$schema`.
pub const SARIF_SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";

fn physical(h: &Hop) -> Value {
    json!({
        "artifactLocation": { "uri": h.file, "uriBaseId": "%SRCROOT%" },
        "region": { "startLine": h.line.max(1) }
    })
}

fn hop_text(h: &Hop) -> String {
    format!("{} {}", h.kind.as_str(), h.label)
}

impl Report {
    /// The report as a SARIF 2.1.0 log.
    pub fn to_sarif(&self) -> String {
        let rules: Vec<Value> = self
            .guard_rows
            .iter()
            .map(|r| {
                let by: Vec<&str> = r.enforced_by.iter().map(|e| e.as_str()).collect();
                json!({
                    "id": r.id,
                    "name": r.title,
                    "shortDescription": { "text": r.title },
                    "fullDescription": { "text": format!("Forbids: {}", r.forbids) },
                    "help": { "text": format!(
                        "Enforced by: {}. Proved by: {}. Status: {}. Known to pass (residue): {}.",
                        by.join(", "),
                        r.test,
                        r.status,
                        if r.residue.is_empty() { "none known".to_string() } else { r.residue.join("; ") }
                    ) },
                    "defaultConfiguration": { "level": "error" },
                    "properties": { "enforcedBy": by, "test": r.test, "status": r.status, "residue": r.residue }
                })
            })
            .collect();
        let mut results: Vec<Value> = self
            .findings
            .iter()
            .map(|f| {
                let last = f.path.last();
                let chain: Vec<String> = f.path.iter().map(hop_text).collect();
                let related: Vec<Value> = f
                    .path
                    .iter()
                    .enumerate()
                    .map(|(i, h)| {
                        json!({ "id": i, "physicalLocation": physical(h), "message": { "text": hop_text(h) } })
                    })
                    .collect();
                let flow: Vec<Value> = f
                    .path
                    .iter()
                    .enumerate()
                    .map(|(i, h)| {
                        json!({
                            "location": { "physicalLocation": physical(h), "message": { "text": hop_text(h) } },
                            "nestingLevel": i,
                            "executionOrder": i
                        })
                    })
                    .collect();
                let mut result = json!({
                    "ruleId": f.guard_row,
                    "level": "error",
                    "message": { "text": format!("{} reaches forbidden {} ({}): {}", f.root, f.forbidden, f.reason, chain.join(" -> ")) },
                    "locations": last.map(|h| vec![json!({ "physicalLocation": physical(h) })]).unwrap_or_default(),
                    "relatedLocations": related,
                    "codeFlows": [ { "threadFlows": [ { "locations": flow } ] } ],
                    "properties": { "kind": f.kind, "root": f.root, "forbidden": f.forbidden }
                });
                if let Some(i) = self.guard_rows.iter().position(|r| r.id == f.guard_row) {
                    result["ruleIndex"] = json!(i);
                }
                result
            })
            .collect();
        // Unresolved names the rules allow: results suppressed with the rules' reason, so a
        // SARIF viewer shows each one and why it passes.
        let row = self.guard_rows.iter().position(|r| r.id == UNRESOLVED_ROW);
        for r in &self.residue {
            let Some(item) = &r.item else { continue };
            for h in &r.reached_at {
                let mut result = json!({
                    "ruleId": UNRESOLVED_ROW,
                    "level": "note",
                    "message": { "text": format!("unresolved name {item}, allowed by the rules: {}", r.detail) },
                    "locations": [ { "physicalLocation": physical(h) } ],
                    "suppressions": [ { "kind": "external", "justification": r.detail } ],
                    "properties": { "kind": "unresolved_allowed", "item": item }
                });
                if let Some(i) = row {
                    result["ruleIndex"] = json!(i);
                }
                results.push(result);
            }
        }
        let log = json!({
            "$schema": SARIF_SCHEMA,
            "version": "2.1.0",
            "runs": [ {
                "tool": { "driver": {
                    "name": "scopegate-guards",
                    "version": env!("CARGO_PKG_VERSION"),
                    "rules": rules
                } },
                "originalUriBaseIds": { "%SRCROOT%": { "description": { "text": "the crate root" } } },
                "results": results,
                "properties": { "residue": self.residue }
            } ]
        });
        serde_json::to_string_pretty(&log).unwrap_or_default()
    }
}
