//! The rules file: forbidden types and calls, sanctioned boundaries, tool discovery and the
//! guard table; a base file may be extended by more files, which can add but never remove.

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
    /// Types no tool may reach.
    #[serde(default)]
    pub forbidden_type: Vec<ForbiddenType>,
    /// Calls no tool body may make.
    #[serde(default)]
    pub forbidden_call: Vec<ForbiddenCall>,
    /// Sanctioned bridges where the walk stops.
    #[serde(default)]
    pub boundary: Vec<Boundary>,
    /// Names the walk cannot resolve that may pass anyway, each with its reason (listed as
    /// residue in every report).
    #[serde(default)]
    pub allow_unresolved: Vec<AllowUnresolved>,
}

/// The guard row every finding of an unresolved name belongs to; the rules must define it.
pub const UNRESOLVED_ROW: &str = "G9";

/// One name the walk cannot resolve, allowed by its exact item path.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AllowUnresolved {
    /// The item as findings name it: the module it was looked up in and the name
    /// (`crate::tools::Generated`).
    pub item: String,
    /// Why it may pass unwalked.
    pub reason: String,
}

/// Attribute and trait names (matched by last path segment) that mark tools.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    /// Attributes on a fn that make it a tool (`#[tool]`, `#[rmcp::tool(...)]`).
    #[serde(default = "default_tool_attributes")]
    pub tool_attributes: Vec<String>,
    /// Traits whose impl makes the implementing type a tool root (`impl ServerHandler for X`).
    #[serde(default = "default_handler_traits")]
    pub handler_traits: Vec<String>,
    /// Attributes on a struct, enum or impl that make the type a tool root (`#[scopegate::tool_set]`).
    #[serde(default = "default_tool_set_attributes")]
    pub tool_set_attributes: Vec<String>,
    /// Attributes on an impl that serve every fn in it as a tool (rmcp's `#[tool_router]`):
    /// each of its fns is a root wherever the impl is written.
    #[serde(default = "default_tool_router_attributes")]
    pub tool_router_attributes: Vec<String>,
    /// Names that build tool routes by hand (rmcp's `ToolRoute`, `.with_route(..)`,
    /// `.add_route(..)`): a fn whose body names one is a root, since the handler it registers
    /// is served as a tool without any tool attribute.
    #[serde(default = "default_route_builders")]
    pub route_builders: Vec<String>,
    /// Types only a tool handler takes (rmcp's `ToolCallContext`): for the compiled walk,
    /// every function in a vtable whose methods take one is a tool root, wherever and however
    /// the route was built.
    #[serde(default)]
    pub handler_types: Vec<String>,
    /// Functions that register tools (`ToolSet::with`): for the compiled walk, every function
    /// whose address the registering code takes (a tool's argument check, a handler) is a
    /// tool root.
    #[serde(default)]
    pub registrations: Vec<String>,
}

fn default_tool_attributes() -> Vec<String> {
    vec!["tool".into()]
}
fn default_handler_traits() -> Vec<String> {
    vec!["ServerHandler".into()]
}
fn default_tool_set_attributes() -> Vec<String> {
    vec!["tool_set".into()]
}
fn default_tool_router_attributes() -> Vec<String> {
    vec!["tool_router".into()]
}
fn default_route_builders() -> Vec<String> {
    vec!["ToolRoute".into(), "with_route".into(), "add_route".into()]
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery {
            tool_attributes: default_tool_attributes(),
            tool_router_attributes: default_tool_router_attributes(),
            route_builders: default_route_builders(),
            handler_traits: default_handler_traits(),
            tool_set_attributes: default_tool_set_attributes(),
            handler_types: Vec::new(),
            registrations: Vec::new(),
        }
    }
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

/// Which types a bare-name match applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NameScope {
    /// Any type with this last segment, defined in the crate or not.
    #[default]
    Any,
    /// Only types from other crates; a type of this name defined in the crate is walked as usual.
    External,
    /// No name match at all: only the full `paths` (for names too common to match alone, such
    /// as `Builder` or `Handle`).
    Paths,
}

/// A type no tool may reach.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ForbiddenType {
    /// Matched against the last segment of the resolved path.
    pub name: String,
    /// Full paths (`sqlx::PgPool`, `crate::identity::TenantContext`) that match whatever the name.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Which types the name match applies to.
    #[serde(default)]
    pub scope: NameScope,
    /// Why it is forbidden.
    pub reason: String,
    /// The guard row it belongs to.
    pub guard_row: String,
    /// Modules where the type may be named inside a boundary (see [`Boundary`]); never a
    /// pass for a path that starts at a tool.
    #[serde(default)]
    pub allowed_in: Vec<String>,
    /// Where the type (or trait) is defined, as the compiled walk matches it: the path rustc
    /// gives it (`sqlx_core::pool::Pool`, not the re-export `sqlx::PgPool`; `crate::` is the
    /// guarded crate). A type under one of these paths is matched, an alias or re-export of it
    /// too, since the compiler has resolved them; a type of the same name elsewhere is not.
    #[serde(default)]
    pub defined: Vec<String>,
}

/// A call no tool body may make.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ForbiddenCall {
    /// Path suffix matched against the resolved call path (`tokio::spawn` matches
    /// `tokio::spawn`; `spawn_blocking` matches any path ending in it).
    pub path: String,
    /// Also match method calls `.name(...)` by the last segment.
    #[serde(default)]
    pub method: bool,
    /// The last segment matches any name it starts (`spawn` matches `spawn_local`).
    #[serde(default)]
    pub prefix: bool,
    /// Why it is forbidden.
    pub reason: String,
    /// The guard row it belongs to.
    pub guard_row: String,
    /// Where the functions are defined, as the compiled walk matches them
    /// (`tokio::task::spawn::spawn`, `std::thread::builder::Builder::spawn`): a call of one, or
    /// its address taken, by the crate's code reached from a tool.
    #[serde(default)]
    pub defined: Vec<String>,
}

impl ForbiddenCall {
    fn last_matches(&self, got: &str, want: &str) -> bool {
        if self.prefix { got.starts_with(want) } else { got == want }
    }
}

/// A sanctioned bridge type: the walk stops there, and the type's own insides are audited
/// against `allowed_in` instead.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Boundary {
    /// Display name.
    pub name: String,
    /// Full paths that are this boundary; required, so a look-alike type elsewhere is walked.
    pub paths: Vec<String>,
    /// Why the walk may stop here.
    pub reason: String,
    /// Where the boundary type and the types it hands out are defined, as the compiled walk
    /// matches them: their functions (methods, trait impls, async bodies, drop glue) end a
    /// tool's walk and are walked on their own.
    #[serde(default)]
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
        let d = other.discovery;
        union(&mut self.discovery.tool_attributes, d.tool_attributes);
        union(&mut self.discovery.tool_router_attributes, d.tool_router_attributes);
        union(&mut self.discovery.route_builders, d.route_builders);
        union(&mut self.discovery.handler_traits, d.handler_traits);
        union(&mut self.discovery.tool_set_attributes, d.tool_set_attributes);
        union(&mut self.discovery.handler_types, d.handler_types);
        union(&mut self.discovery.registrations, d.registrations);
        self.guard_row.extend(other.guard_row);
        self.forbidden_type.extend(other.forbidden_type);
        self.forbidden_call.extend(other.forbidden_call);
        self.boundary.extend(other.boundary);
        self.allow_unresolved.extend(other.allow_unresolved);
        Ok(())
    }

    /// Checks cross references: every rule names an existing guard row, boundaries have paths.
    pub fn validate(&self) -> Result<(), GuardError> {
        let rows: HashSet<&str> = self.guard_row.iter().map(|r| r.id.as_str()).collect();
        let bad = |message: String| GuardError::Rules { origin: "merged rules".into(), message };
        for t in &self.forbidden_type {
            if !rows.contains(t.guard_row.as_str()) {
                return Err(bad(format!("forbidden type `{}` names unknown guard row `{}`", t.name, t.guard_row)));
            }
        }
        for c in &self.forbidden_call {
            if !rows.contains(c.guard_row.as_str()) {
                return Err(bad(format!("forbidden call `{}` names unknown guard row `{}`", c.path, c.guard_row)));
            }
        }
        for b in &self.boundary {
            if b.paths.is_empty() {
                return Err(bad(format!("boundary `{}` needs at least one path", b.name)));
            }
        }
        if !rows.contains(UNRESOLVED_ROW) {
            return Err(bad(format!("guard row `{UNRESOLVED_ROW}` (names the walk cannot resolve) is missing")));
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
        for t in &self.forbidden_type {
            if t.scope == NameScope::Paths && t.paths.is_empty() {
                return Err(bad(format!("forbidden type `{}` matches by paths only but lists none", t.name)));
            }
        }
        for a in &self.allow_unresolved {
            if !a.item.starts_with("crate::") || a.reason.trim().is_empty() {
                return Err(bad(format!(
                    "allow_unresolved `{}` needs an item path starting `crate::` and a reason",
                    a.item
                )));
            }
        }
        Ok(())
    }

    /// The forbidden-type rule a resolved type matches, if any.
    pub(crate) fn forbidden_type(&self, full: &str, is_local: bool) -> Option<&ForbiddenType> {
        let last = full.rsplit("::").next().unwrap_or(full);
        self.forbidden_type.iter().find(|r| {
            r.paths.iter().any(|p| p == full)
                || (r.name == last
                    && match r.scope {
                        NameScope::Any => true,
                        NameScope::External => !is_local,
                        NameScope::Paths => false,
                    })
        })
    }

    /// The forbidden-call rule a resolved path matches, if any.
    pub(crate) fn forbidden_path_call(&self, path: &[String]) -> Option<&ForbiddenCall> {
        self.forbidden_call.iter().find(|r| {
            let want: Vec<&str> = r.path.split("::").collect();
            let Some((last, before)) = want.split_last() else { return false };
            let Some((got_last, got_before)) = path.split_last() else { return false };
            before.len() <= got_before.len()
                && got_before[got_before.len() - before.len()..].iter().zip(before).all(|(a, b)| a == b)
                && r.last_matches(got_last, last)
        })
    }

    /// The forbidden-call rule a method call matches, if any.
    pub(crate) fn forbidden_method_call(&self, name: &str) -> Option<&ForbiddenCall> {
        self.forbidden_call
            .iter()
            .find(|r| r.method && r.path.rsplit("::").next().is_some_and(|last| r.last_matches(name, last)))
    }

    /// The allowance for an unresolved item, if any.
    pub(crate) fn allowed_unresolved(&self, item: &str) -> Option<&AllowUnresolved> {
        self.allow_unresolved.iter().find(|a| a.item == item)
    }

    /// The boundary a resolved type path is, if any.
    pub(crate) fn boundary(&self, full: &str) -> Option<&Boundary> {
        self.boundary.iter().find(|b| b.paths.iter().any(|p| p == full))
    }
}

fn union(into: &mut Vec<String>, from: Vec<String>) {
    for s in from {
        if !into.contains(&s) {
            into.push(s);
        }
    }
}
