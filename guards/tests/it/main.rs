//! Integration tests for the guard, compiled into one binary: one fixture per evasion, the
//! renderers, and the rules file.

mod compiled;
mod evasions;
mod files;
mod fixtures;
mod renderers;
mod rules;
mod schema;

use std::path::PathBuf;

use guards::{Finding, Options, Report};

/// The fixture crate root `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(name)
}

/// Runs the guard with the shipped rules on a fixture.
pub fn run(name: &str) -> Report {
    guards::check(&Options::new(fixture(name))).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A finding's path as `kind label file:line` strings.
pub fn hops(f: &Finding) -> Vec<String> {
    f.path.iter().map(|h| format!("{} {} {}:{}", h.kind.as_str(), h.label, h.file, h.line)).collect()
}

/// The one finding whose forbidden item is `forbidden`.
pub fn finding<'a>(r: &'a Report, forbidden: &str) -> &'a Finding {
    let all: Vec<&Finding> = r.findings.iter().filter(|f| f.forbidden == forbidden).collect();
    assert_eq!(
        all.len(),
        1,
        "expected exactly one finding for {forbidden}, got:\n{}",
        guards::finding_lines(r).join("\n")
    );
    all[0]
}
