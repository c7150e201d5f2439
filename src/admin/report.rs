//! The guard report of this build: what the compiled walk found when rustc compiled the
//! library (`guards-compiled.*`, written by the checker the build script installs). The
//! library cannot embed it, since it is written while the library compiles: the binary that
//! links the library embeds it and installs it before it serves ([`install`]). Never re-runs
//! the guard.

use std::sync::OnceLock;

use super::{AdminError, Authority, Need};

/// The report in its three formats.
#[derive(Debug, Clone, Copy)]
pub struct GuardReport {
    /// For auditors.
    pub markdown: &'static str,
    /// See `guards/report.schema.json`.
    pub json: &'static str,
    /// SARIF 2.1.0.
    pub sarif: &'static str,
}

/// The report embedded in the crate this is expanded in, from its build's `OUT_DIR`: in the
/// `scopegate` binary, the walk of the library it links.
#[macro_export]
macro_rules! embedded_guard_report {
    () => {
        $crate::admin::report::GuardReport {
            markdown: include_str!(concat!(env!("OUT_DIR"), "/guards-compiled.md")),
            json: include_str!(concat!(env!("OUT_DIR"), "/guards-compiled.json")),
            sarif: include_str!(concat!(env!("OUT_DIR"), "/guards-compiled.sarif")),
        }
    };
}

static INSTALLED: OnceLock<GuardReport> = OnceLock::new();

/// Makes `report` the one this program serves; the first installed stays.
pub fn install(report: GuardReport) {
    let _ = INSTALLED.set(report);
}

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

/// The installed report's text in `format`, or `None` when the program installed none.
pub fn text(format: ReportFormat) -> Option<&'static str> {
    let report = INSTALLED.get()?;
    Some(match format {
        ReportFormat::Md => report.markdown,
        ReportFormat::Json => report.json,
        ReportFormat::Sarif => report.sarif,
    })
}

/// The report for `who` (an owner or auditor of any tenant: it is the same for all).
pub fn guard_report(who: &Authority, format: ReportFormat) -> Result<&'static str, AdminError> {
    who.authorize(Need::Report)?;
    text(format).ok_or_else(|| AdminError::NotFound("this program carries no guard report".into()))
}
