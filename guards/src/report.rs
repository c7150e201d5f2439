//! The guard report: guard table, findings with their full paths, per-tool dependency trees,
//! boundaries and the residue no walk can close; rendered as Markdown and JSON here.
//! It never claims a hazard is unreachable: it only lists what the walk saw.

use serde::{Deserialize, Serialize};

use crate::rules::{Enforcement, GuardRow};

/// Schema version of the JSON report.
pub const REPORT_VERSION: &str = "1";

/// Everything one run of the guard found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always `scopegate-guards`.
    pub generator: String,
    /// [`REPORT_VERSION`].
    pub version: String,
    /// The entry file, relative to the crate root.
    pub entry: String,
    /// Module prefixes tools were looked for in (empty: the whole crate).
    pub tool_modules: Vec<String>,
    /// Every source file parsed, relative to the crate root.
    pub files: Vec<String>,
    /// The guard table.
    pub guard_rows: Vec<GuardRow>,
    /// Violations; empty means the walk found no path to a forbidden type or call.
    pub findings: Vec<Finding>,
    /// Every tool root and its dependency tree.
    pub tools: Vec<ToolReport>,
    /// Sanctioned boundaries, what they hold and which tools cross them.
    pub boundaries: Vec<BoundaryReport>,
    /// What the walk cannot see, and what backs it up.
    pub residue: Vec<Residue>,
}

/// One path from a root to a forbidden type or call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The guard row violated (also the SARIF rule id).
    pub guard_row: String,
    /// What was reached.
    pub kind: FindingKind,
    /// The tool (or `boundary ...`) the path starts at.
    pub root: String,
    /// The forbidden type or call, as resolved.
    pub forbidden: String,
    /// The rule's reason.
    pub reason: String,
    /// Every hop, root first, forbidden item last.
    pub path: Vec<Hop>,
}

/// What a finding reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A forbidden type, reached from a tool.
    Type,
    /// A forbidden call in a tool body or a body the tool reaches.
    Call,
    /// A forbidden type held inside a boundary, named in a module not in its `allowed_in`.
    BoundaryLeak,
}

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hop {
    /// What the step is.
    pub kind: HopKind,
    /// Its name: a resolved type path, a field or parameter name, a call path.
    pub label: String,
    /// File relative to the crate root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
}

/// What a hop or tree node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HopKind {
    /// A tool root.
    Tool,
    /// The type that serves the tool (`self`).
    Receiver,
    /// A parameter of a tool, method or constructor.
    Param,
    /// A generic bound or where clause.
    Bound,
    /// A struct, union or variant field.
    Field,
    /// An enum variant.
    Variant,
    /// A type (crate or external).
    Type,
    /// A type alias.
    Alias,
    /// A trait.
    Trait,
    /// A method (trait method, helper method, handler method).
    Method,
    /// A return type.
    Returns,
    /// An associated type.
    AssocType,
    /// An associated fn returning `Self`: its parameters are what the type is built from.
    Constructor,
    /// A trait impl of a reached type.
    Impl,
    /// A generic parameter (its bounds are walked where it is declared).
    GenericParam,
    /// A `static` or `const` named in a body.
    Static,
    /// A fn body.
    Body,
    /// A call (a forbidden one, or a crate fn followed into).
    Call,
    /// A macro the walk could not look into.
    Macro,
}

impl HopKind {
    /// Lower-case name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            HopKind::Tool => "tool",
            HopKind::Receiver => "receiver",
            HopKind::Param => "param",
            HopKind::Bound => "bound",
            HopKind::Field => "field",
            HopKind::Variant => "variant",
            HopKind::Type => "type",
            HopKind::Alias => "alias",
            HopKind::Trait => "trait",
            HopKind::Method => "method",
            HopKind::Returns => "returns",
            HopKind::AssocType => "assoc_type",
            HopKind::Constructor => "constructor",
            HopKind::Impl => "impl",
            HopKind::GenericParam => "generic_param",
            HopKind::Static => "static",
            HopKind::Body => "body",
            HopKind::Call => "call",
            HopKind::Macro => "macro",
        }
    }
}

/// Why a tree node is a leaf, or notable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    /// A forbidden type or call (a finding).
    Forbidden,
    /// A sanctioned boundary: the walk stops.
    Boundary,
    /// Already expanded earlier in this tree.
    Visited,
    /// From another crate: matched by name and path only, not walked.
    External,
    /// Outside the walk (macro).
    Opaque,
}

/// A node of a dependency tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeNode {
    /// What the node is.
    pub kind: HopKind,
    /// Its name.
    pub label: String,
    /// File relative to the crate root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// Why it is a leaf or notable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mark: Option<Mark>,
    /// For forbidden nodes: the guard row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard_row: Option<String>,
    /// What it leads to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<TreeNode>,
}

/// How a tool root was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// A fn with a tool attribute.
    Tool,
    /// An impl of a handler trait (`ServerHandler`).
    ServerHandler,
    /// A type or impl with a tool-set attribute.
    ToolSet,
}

/// One tool root and its dependency tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolReport {
    /// `Type::fn_name`, `Type as ServerHandler`, `Type (tool_set)`.
    pub name: String,
    /// How it was found.
    pub kind: ToolKind,
    /// The module it is declared in.
    pub module: String,
    /// File relative to the crate root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// Its dependency tree (the root node is the tool).
    pub tree: TreeNode,
}

/// A sanctioned boundary, as seen in this crate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundaryReport {
    /// Display name.
    pub name: String,
    /// The paths that are this boundary.
    pub paths: Vec<String>,
    /// Why the walk may stop here.
    pub reason: String,
    /// Where it is defined, when in this crate (otherwise it is opaque, audited in its own crate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defined_at: Option<Hop>,
    /// Forbidden types it holds in modules that allow them (leaks are findings instead).
    pub holds: Vec<Held>,
    /// Tools whose walk stopped here.
    pub crossed_by: Vec<String>,
    /// The boundary's own tree, when defined in this crate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeNode>,
}

/// A forbidden type held, with permission, inside a boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The forbidden type.
    pub forbidden: String,
    /// Its guard row.
    pub guard_row: String,
    /// The module that names it (listed in the rule's `allowed_in`).
    pub module: String,
    /// File relative to the crate root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
}

/// Something no build-time walk can close.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Residue {
    /// Short name.
    pub title: String,
    /// What escapes the walk, and why.
    pub detail: String,
    /// What catches it instead.
    pub backstop: Vec<Enforcement>,
}

pub(crate) fn residue() -> Vec<Residue> {
    use Enforcement::*;
    vec![
        Residue {
            title: "Detached background work".into(),
            detail: "Work moved off the call (a spawned task, a channel to a worker, a queue) changes no type graph. The walk flags the spawn points it knows by name in tool bodies and the receiver's methods; any other way out is not seen.".into(),
            backstop: vec![RuntimeFailClosedFactory, AuditBackstop],
        },
        Residue {
            title: "Macro-generated code".into(),
            detail: "Code written by macros, including rmcp's own #[tool], #[tool_router] and #[tool_handler] expansions, is not expanded: the walk sees the source as written. Macro calls whose input does not parse as expressions are marked `macro` (opaque) in the trees.".into(),
            backstop: vec![RuntimeFailClosedFactory, AuditBackstop],
        },
        Residue {
            title: "unsafe and FFI".into(),
            detail: "unsafe code, raw pointers cast to other types, transmute and foreign functions can reach anything; they are outside the walk.".into(),
            backstop: vec![TypePrivacy, RuntimeFailClosedFactory, AuditBackstop],
        },
        Residue {
            title: "Types from other crates are opaque".into(),
            detail: "A type defined in another crate is matched against the forbidden list by its resolved path and last segment, never walked: a foreign wrapper that privately holds a pool is not seen unless its name or path is listed.".into(),
            backstop: vec![TypePrivacy, AuditBackstop],
        },
        Residue {
            title: "Sanctioned boundaries".into(),
            detail: "The walk stops at each [[boundary]] type (McpCallContext): what it hands out is trusted. When the boundary is defined in the walked crate its own insides are audited against allowed_in; when it comes from another crate it is audited by that crate's build.".into(),
            backstop: vec![RuntimeFailClosedFactory, TypePrivacy],
        },
        Residue {
            title: "Best-effort name resolution".into(),
            detail: "Glob imports from other crates, method calls (resolved by name only, no type inference), trait-dispatched calls and cfg-gated items are resolved best effort; cfg(test) modules are skipped. Names are matched on the last segment too, so a rename cannot hide a forbidden type, but an unresolved glob can hide where a forbidden call came from.".into(),
            backstop: vec![RuntimeFailClosedFactory, AuditBackstop],
        },
    ]
}

impl Report {
    /// Pretty JSON (matches `guards/report.schema.json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Markdown for auditors: guard table, findings, trees, boundaries, residue.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        out.push_str("# scopegate guard report\n\n");
        out.push_str(&format!(
            "Entry `{}`, {} files parsed, {} tool roots, {} findings.\n\n",
            self.entry,
            self.files.len(),
            self.tools.len(),
            self.findings.len()
        ));
        out.push_str("## Guard table\n\n");
        out.push_str("| id | protection | forbids | enforced by | proved by | status |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        for r in &self.guard_rows {
            let by: Vec<&str> = r.enforced_by.iter().map(|e| e.as_str()).collect();
            out.push_str(&format!(
                "| {} | {} | {} | {} | `{}` | {} |\n",
                cell(&r.id),
                cell(&r.title),
                cell(&r.forbids),
                cell(&by.join(", ")),
                cell(&r.test),
                cell(&r.status)
            ));
        }
        out.push_str("\n## Findings\n\n");
        if self.findings.is_empty() {
            out.push_str("No path from a tool to a forbidden type or call was found by the walk (see the residue for what it cannot see).\n");
        }
        for (i, f) in self.findings.iter().enumerate() {
            out.push_str(&format!(
                "{}. **{}** `{}` reaches `{}`: {}\n",
                i + 1,
                f.guard_row,
                f.root,
                f.forbidden,
                f.reason
            ));
            for h in &f.path {
                out.push_str(&format!("   - {} `{}` ({}:{})\n", h.kind.as_str(), h.label, h.file, h.line));
            }
        }
        out.push_str("\n## Tools and their dependency trees\n\n");
        for t in &self.tools {
            out.push_str(&format!("### `{}` ({}:{})\n\n", t.name, t.file, t.line));
            for c in &t.tree.children {
                tree_md(&mut out, c, 0);
            }
            out.push('\n');
        }
        out.push_str("## Boundaries\n\n");
        for b in &self.boundaries {
            out.push_str(&format!("- **{}** ({}): {}\n", b.name, b.paths.join(", "), b.reason));
            match &b.defined_at {
                Some(h) => out.push_str(&format!("  - defined at {}:{}\n", h.file, h.line)),
                None => out.push_str("  - not defined in this crate: opaque here\n"),
            }
            for h in &b.holds {
                out.push_str(&format!(
                    "  - holds `{}` ({}) named in `{}` ({}:{}), allowed there\n",
                    h.forbidden, h.guard_row, h.module, h.file, h.line
                ));
            }
            if !b.crossed_by.is_empty() {
                out.push_str(&format!("  - crossed by: {}\n", b.crossed_by.join(", ")));
            }
        }
        out.push_str("\n## Residue\n\n");
        for r in &self.residue {
            let by: Vec<&str> = r.backstop.iter().map(|e| e.as_str()).collect();
            out.push_str(&format!("- **{}**: {} Backstop: {}.\n", r.title, r.detail, by.join(", ")));
        }
        out
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn tree_md(out: &mut String, n: &TreeNode, depth: usize) {
    let mark = match n.mark {
        Some(Mark::Forbidden) => {
            format!(" **FORBIDDEN ({})**", n.guard_row.as_deref().unwrap_or("?"))
        }
        Some(Mark::Boundary) => " (boundary: walk stops)".into(),
        Some(Mark::Visited) => " (see above)".into(),
        Some(Mark::External) => " (external)".into(),
        Some(Mark::Opaque) => " (opaque)".into(),
        None => String::new(),
    };
    out.push_str(&format!(
        "{}- {} `{}` ({}:{}){}\n",
        "  ".repeat(depth),
        n.kind.as_str(),
        n.label,
        n.file,
        n.line,
        mark
    ));
    for c in &n.children {
        tree_md(out, c, depth + 1);
    }
}
