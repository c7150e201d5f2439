//! The build's guard report, as `build.rs` wrote it before this crate compiled: the text
//! describes exactly the sources of this build. Never re-runs the guard.

use super::{AdminError, Authority, Need};

const MARKDOWN: &str = include_str!(concat!(env!("OUT_DIR"), "/guards-report.md"));
const JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/guards-report.json"));
const SARIF: &str = include_str!(concat!(env!("OUT_DIR"), "/guards-report.sarif"));

/// How the report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportFormat {
    /// For auditors.
    Md,
    /// See `guards/report.schema.json`.
    Json,
    /// SARIF 2.1.0.
    Sarif,
}

/// The report's text in `format`.
pub fn text(format: ReportFormat) -> &'static str {
    match format {
        ReportFormat::Md => MARKDOWN,
        ReportFormat::Json => JSON,
        ReportFormat::Sarif => SARIF,
    }
}

/// The report for `who` (an owner or auditor of any tenant: it is the same for all).
pub fn guard_report(who: &Authority, format: ReportFormat) -> Result<&'static str, AdminError> {
    who.authorize(Need::Report)?;
    Ok(text(format))
}
