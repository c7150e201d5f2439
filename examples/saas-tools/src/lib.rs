//! A SaaS's own MCP tools, written against the `scopegate` library. Owns its tools and its
//! billing client; a tool never holds the billing key (guard row S1 in `guards.toml`).

pub mod billing;
pub mod tools;

/// The guard report of this crate's own tools, as its build script wrote it (Markdown; the
/// same directory holds `guards-report.json` and `guards-report.sarif`).
pub const GUARD_REPORT: &str = include_str!(concat!(env!("OUT_DIR"), "/guards-report.md"));

#[cfg(test)]
mod tests {
    #[test]
    fn the_embedded_report_covers_this_crates_tool_and_its_own_row() {
        let report = super::GUARD_REPORT;
        assert!(report.contains("Greeter::greet"), "{report}");
        assert!(report.contains("| S1 |"), "{report}");
        assert!(report.contains(", 0 findings."), "{report}");
    }
}
