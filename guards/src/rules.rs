//! The rules file: forbidden types and calls, sanctioned boundaries, what counts as a tool,
//! and the guard table; a base file may be extended by more files, which can add but never
//! remove.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;

use crate::GuardError;

/// The rules shipped with this crate (`guards/rules.toml`), used when no base file is given.
pub const DEFAULT_RULES: &str = include_str!("../rules.toml");

/// Every rule the walk applies, after the base file and its extensions are merged.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// How tools are recognised.
    #[serde(default)]
    pub discovery: Discovery,
    /// Rows of the guard table.
    #[serde(default)]
    pub guard_row: Vec<GuardRow>,
    /// Types (and traits) no tool may reach.
    #[serde(default)]
    pub forbidden_type: Vec<ForbiddenType>,
    /// Functions no tool may reach.
    #[serde(default)]
    pub forbidden_call: Vec<ForbiddenCall>,
    /// Sanctioned bridges where the walk from a tool stops.
    #[serde(default)]
    pub boundary: Vec<Boundary>,
}

/// What the compiled program serves as a tool.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    /// Types only a tool handler takes (rmcp's `ToolCallContext`): every function in a vtable
    /// whose methods take one is a tool root, wherever and however the route was built.
    #[serde(default)]
    pub handler_types: Vec<String>,
    /// Functions that register tools (`ToolSet::with`): every function whose address the
    /// registering code takes (a tool's argument check, a handler) is a tool root.
    #[serde(default)]
    pub registrations: Vec<String>,
}

/// How a protection is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
pub enum Enforcement {
    /// The Rust type system keeps the thing private.
    #[serde(rename = "type privacy")]
    TypePrivacy,
    /// This crate's walk fails the build.
    #[serde(rename = "build-time walk")]
    BuildTimeWalk,
    /// `McpCallContext`'s factory refuses to build a context.
    #[serde(rename = "runtime fail-closed factory")]
    RuntimeFailClosedFactory,
    /// A session answers only the principal that created it.
    #[serde(rename = "session binding")]
    SessionBinding,
    /// The audit writer fails the call when it cannot record it.
    #[serde(rename = "audit backstop")]
    AuditBackstop,
}

impl Enforcement {
    /// The name used in the rules file and the reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::TypePrivacy => "type privacy",
            Enforcement::BuildTimeWalk => "build-time walk",
            Enforcement::RuntimeFailClosedFactory => "runtime fail-closed factory",
            Enforcement::SessionBinding => "session binding",
            Enforcement::AuditBackstop => "audit backstop",
        }
    }
}

/// One row of the guard table, for auditors.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GuardRow {
    /// Stable id (`G1`...), also the SARIF rule id.
    pub id: String,
    /// The protection, in a few words.
    pub title: String,
    /// What it forbids.
    pub forbids: String,
    /// How it is enforced.
    pub enforced_by: Vec<Enforcement>,
    /// The test that fails when the protection is removed.
    pub test: String,
    /// `enforced` (nothing of it is known to pass), `partly` (see `residue`), or `planned`.
    pub status: String,
    /// Forms of what the row forbids that are known to pass its enforcement, by name; a row
    /// with any cannot read `enforced`.
    #[serde(default)]
    pub residue: Vec<String>,
}

/// A type (or trait) no tool may reach.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ForbiddenType {
    /// For people: the name the type is known by.
    pub name: String,
    /// Why it is forbidden.
    pub reason: String,
    /// The guard row it belongs to.
    pub guard_row: String,
    /// Modules where the type may be used inside a boundary (see [`Boundary`]); never a pass
    /// for a path that starts at a tool.
    #[serde(default)]
    pub allowed_in: Vec<String>,
    /// Where the type is defined: the path rustc gives it (`sqlx_core::pool::Pool`, not the
    /// re-export `sqlx::PgPool`; a path starting with the guarded crate's name is its own). A
    /// type under one of these paths is matched, an alias or re-export of it too, since the
    /// compiler has resolved them; a type of the same name elsewhere is not.
    pub defined: Vec<String>,
}

/// A function no tool may reach.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ForbiddenCall {
    /// For people: the name the function is known by.
    pub name: String,
    /// Why it is forbidden.
    pub reason: String,
    /// The guard row it belongs to.
    pub guard_row: String,
    /// Where the functions are defined (`tokio::task::spawn::spawn`,
    /// `std::thread::builder::Builder::spawn`): a call of one, or one handed on as a value, by
    /// the crate's code reached from a tool.
    pub defined: Vec<String>,
}

/// A sanctioned bridge type: the walk from a tool stops at its functions, which are walked on
/// their own, where a forbidden type passes only in the modules its rule allows.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Boundary {
    /// For people.
    pub name: String,
    /// Why the walk may stop here.
    pub reason: String,
    /// Where the boundary type and the types it hands out are defined: their functions
    /// (methods, trait impls, async bodies, drop glue) end a tool's walk.
    pub defined: Vec<String>,
}

impl Rules {
    /// Parses one rules file (no validation; see [`Rules::validate`]).
    pub fn parse(text: &str, origin: &str) -> Result<Rules, GuardError> {
        toml::from_str(text).map_err(|e| GuardError::Rules { origin: origin.to_string(), message: e.to_string() })
    }

    /// Adds another file's rules. Discovery lists are unioned; a guard row id that already
    /// exists is an error, so an extension cannot replace a base row.
    pub fn extend(&mut self, other: Rules, origin: &str) -> Result<(), GuardError> {
        let known: HashSet<String> = self.guard_row.iter().map(|r| r.id.clone()).collect();
        for row in &other.guard_row {
            if known.contains(&row.id) {
                return Err(GuardError::Rules {
                    origin: origin.to_string(),
                    message: format!("guard row `{}` is already defined", row.id),
                });
            }
        }
        union(&mut self.discovery.handler_types, other.discovery.handler_types);
        union(&mut self.discovery.registrations, other.discovery.registrations);
        self.guard_row.extend(other.guard_row);
        self.forbidden_type.extend(other.forbidden_type);
        self.forbidden_call.extend(other.forbidden_call);
        self.boundary.extend(other.boundary);
        Ok(())
    }

    /// Checks the merged rules: every rule names an existing guard row and where its items are
    /// defined (a rule that names none would match nothing), and the table is honest.
    pub fn validate(&self) -> Result<(), GuardError> {
        let rows: HashSet<&str> = self.guard_row.iter().map(|r| r.id.as_str()).collect();
        let bad = |message: String| GuardError::Rules { origin: "merged rules".into(), message };
        let items = self.forbidden_type.iter().map(|t| ("forbidden type", &t.name, Some(&t.guard_row), &t.defined));
        let calls = self.forbidden_call.iter().map(|c| ("forbidden call", &c.name, Some(&c.guard_row), &c.defined));
        let bridges = self.boundary.iter().map(|b| ("boundary", &b.name, None, &b.defined));
        for (what, name, row, defined) in items.chain(calls).chain(bridges) {
            if let Some(row) = row
                && !rows.contains(row.as_str())
            {
                return Err(bad(format!("{what} `{name}` names unknown guard row `{row}`")));
            }
            if defined.is_empty() || defined.iter().any(|d| !is_path(d)) {
                return Err(bad(format!(
                    "{what} `{name}` needs `defined`: the paths where its items are defined (`a::b::C`)"
                )));
            }
        }
        for r in &self.guard_row {
            let status = r.status.as_str();
            if status.starts_with("enforced") && !r.residue.is_empty() {
                return Err(bad(format!(
                    "guard row `{}` reads `enforced` but lists residue that passes it: say `partly`",
                    r.id
                )));
            }
            if status.starts_with("partly") && r.residue.is_empty() {
                return Err(bad(format!("guard row `{}` reads `partly` but names no residue", r.id)));
            }
        }
        Ok(())
    }
}

/// `a::b::C`: two or more identifier segments.
fn is_path(text: &str) -> bool {
    let segments: Vec<&str> = text.split("::").collect();
    segments.len() >= 2
        && segments.iter().all(|s| {
            s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
}

fn union(into: &mut Vec<String>, from: Vec<String>) {
    for s in from {
        if !into.contains(&s) {
            into.push(s);
        }
    }
}
