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
    /// A name the walk cannot resolve to a definition (written by a macro, or unknown), not
    /// allowed in the rules.
    Unresolved,
}

impl FindingKind {
    /// How messages say what was reached: `forbidden` or `unresolved`.
    pub fn verb(self) -> &'static str {
        match self {
            FindingKind::Unresolved => "unresolved",
            _ => "forbidden",
        }
    }
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
    /// Where the walk came to it from, when that is not where it is defined: the line of a
    /// body that names a static, calls a fn or writes a turbofish, or the type written in a
    /// signature that leads to a definition elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_at: Option<Site>,
}

/// A place in the sources.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Site {
    /// File relative to the crate root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
}

impl Hop {
    /// `file:line`, and `, used at file:line` when it was reached from elsewhere.
    pub fn location(&self) -> String {
        match &self.used_at {
            Some(u) => format!("{}:{}, used at {}:{}", self.file, self.line, u.file, u.line),
            None => format!("{}:{}", self.file, self.line),
        }
    }
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
    /// A name the walk cannot resolve (a finding).
    Unresolved,
    /// A name the walk cannot resolve, allowed by the rules: residue.
    Allowed,
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
    /// Where it was reached from, when not where it is defined (see [`Hop::used_at`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_at: Option<Site>,
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
    /// For an unresolved name the rules allow: the item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    /// For an allowed item: every place a tool reached it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reached_at: Vec<Hop>,
}

fn residue_entry(title: &str, detail: &str, backstop: Vec<Enforcement>) -> Residue {
    Residue { title: title.into(), detail: detail.into(), backstop, item: None, reached_at: Vec::new() }
}

/// What no run of the walk closes, whatever the sources, by class (items allowed unresolved
/// and the macros of other crates met in the sources are added per run).
pub(crate) fn residue() -> Vec<Residue> {
    use Enforcement::*;
    vec![
        residue_entry(
            "Tools the walk does not see",
            "Roots are every fn carrying a tool attribute (`#[tool]`, also imported under another name), every fn of a `#[tool_router]` impl (also one written inside a fn body), every fn that builds tool routes by hand (names `ToolRoute`, calls `.with_route` or `.add_route`), every `tool_set` item, wherever in the crate they are written, and every handler-trait impl in the tool modules; every impl of a tool's type is read with it. A macro of the crate invoked as an item or statement, whose input or `macro_rules!` rules name a tool attribute or handler trait, fails the build (a tool it writes would not be walked), and so does `include!` of a file the walk cannot name unless the rules allow that exact item. Not seen: a tool written by another crate's item-level macro whose input names no tool attribute (each such macro of this build is listed in the next section), a tool router assembled inside another crate, and a handler-trait impl outside the tool modules (the dispatcher, the sanctioned bridge).",
            vec![RuntimeFailClosedFactory, AuditBackstop],
        ),
        residue_entry(
            "Detached work the walk cannot see (G5)",
            "Refused by name in tool bodies, every body of every impl of a type they reach, static and const initialisers, and every crate body they call: every fn or method whose name starts with `spawn` (tokio, std::thread, task sets, runtime handles, thread builders, scoped threads, futures executors), `block_on`, `std::thread::scope`, the runtime, task-set and thread-builder types themselves, and the process types (`std::process::Command` and `Child`, tokio's), whatever starts the process (`spawn`, `status`, `output`, a shell that backgrounds a worker), through `use` renames, every `#[cfg]` arm of a `use`, and local bindings alike. Not seen: work spawned or a process started inside another crate's function the tool calls, work handed to an executor behind a trait object or a generic parameter (`dyn Executor`, `E: Executor`), and work sent to a task started elsewhere (a channel, a queue).",
            vec![RuntimeFailClosedFactory, AuditBackstop],
        ),
        residue_entry(
            "Macro-generated code",
            "Macro expansions are not walked. A name a tool reaches that no definition in the crate answers, and that is not provably another crate's, fails the build as unresolved (G9), naming the item-level macros that may have written it; `allow_unresolved` in the rules can let an exact item pass with a reason, and each such item is listed in this section. A type written by a macro call (`ty!()`) is unresolved too. Macro calls inside bodies are read when their input parses as expressions or statements; otherwise their tokens are scanned for the names of forbidden calls and types (found by name only), and the call is marked `macro` (opaque) when none is there. `include!` of a named file is read as if written in place. Attribute and derive macros (rmcp's #[tool], #[tool_router], #[tool_handler], serde's derives) are not expanded: code they add is not seen, except the functions and types serde's and schemars' attributes name (next sections).",
            vec![RuntimeFailClosedFactory, AuditBackstop],
        ),
        residue_entry(
            "Code named by attributes",
            "serde's `with` (the module's `serialize` and `deserialize`), `serialize_with`, `deserialize_with`, `default = \"..\"`, `skip_serializing_if`, `getter` and the types of `from`, `try_from`, `into` and `remote`, and schemars' `with` and `schema_with`, on a reached type, its fields and variants, are walked as calls and types. Functions or types named in the attributes of other derive macros (a validator's `custom = \"..\"`, clap's `value_parser`) are not seen.",
            vec![RuntimeFailClosedFactory, AuditBackstop],
        ),
        residue_entry(
            "unsafe and FFI",
            "unsafe code, raw pointers cast to other types, transmute and foreign functions can reach anything; they are outside the walk.",
            vec![TypePrivacy, RuntimeFailClosedFactory, AuditBackstop],
        ),
        residue_entry(
            "Types and functions from other crates are opaque",
            "A type is called external only when it is provably another crate's: its path starts at a dependency of the manifest or a sysroot crate, it is a prelude name or a primitive, or another crate's glob brought it into a module no macro writes items into. It is matched against the forbidden list by its resolved path and last segment, never walked: another crate's type that privately holds a forbidden type, and another crate's function that opens a pool or connection or starts work inside, are not seen unless a name on the forbidden list is written (the pool and connect options, `.connect*()` and the process types are on it, so a pool or connection is refused whether or not its own type is ever written).",
            vec![TypePrivacy, AuditBackstop],
        ),
        residue_entry(
            "Sanctioned boundaries",
            "The walk stops at each [[boundary]] type (McpCallContext): what it hands out is trusted. When the boundary is defined in the walked crate its own fields and signatures are audited against allowed_in (its method bodies are its trusted code); when it comes from another crate it is audited by that crate's build.",
            vec![RuntimeFailClosedFactory, TypePrivacy],
        ),
        residue_entry(
            "Method calls resolved without type inference",
            "There is no type inference; the walk reads code wherever a type is reached instead. Every body of every impl of a crate type the walk reaches is read (so `Drop::drop`, `Deref::deref`, `Future::poll`, `Default::default` and inherent methods run on it are seen whether or not they are named, and whatever its receiver's inferred type), and so is every impl that names a reached type in its trait's arguments (`impl From<Local> for String`). A method call `.name()` reaches the crate traits that declare `name` and are in scope where the call is written (defined, imported, renamed, `as _`, or by glob) or that the walk has reached (a bound, `dyn Trait`): their types, signatures, and the bodies of `name` in every impl and default. Not seen: a method of a crate type the walk never reaches, called on a value created inside another crate's code.",
            vec![RuntimeFailClosedFactory, AuditBackstop],
        ),
        residue_entry(
            "cfg-gated code is walked as if enabled",
            "Every #[cfg(..)] item is read whatever the features and target: a feature-gated module, tool or type is checked as if the feature were on; when two cfg arms define the same name (an item, a module, a `use .. as`) both are walked; every file a `#[cfg_attr(.., path = ..)]` may put in place of a module is read besides the default one, and a `#[path]` inside an inline module is taken from that module's directory, as rustc does (the files read are compared with rustc's dep-info in the tests). Only #[cfg(test)] modules, fns and impls are skipped (they are not in the built crate).",
            vec![BuildTimeWalk],
        ),
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
        out.push_str("| id | protection | forbids | enforced by | proved by | status | known to pass (residue) |\n");
        out.push_str("|---|---|---|---|---|---|---|\n");
        for r in &self.guard_rows {
            let by: Vec<&str> = r.enforced_by.iter().map(|e| e.as_str()).collect();
            let residue = if r.residue.is_empty() { "none known".to_string() } else { r.residue.join("; ") };
            out.push_str(&format!(
                "| {} | {} | {} | {} | `{}` | {} | {} |\n",
                cell(&r.id),
                cell(&r.title),
                cell(&r.forbids),
                cell(&by.join(", ")),
                cell(&r.test),
                cell(&r.status),
                cell(&residue)
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
                out.push_str(&format!("   - {} `{}` ({})\n", h.kind.as_str(), h.label, h.location()));
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
            let backstop = if by.is_empty() { String::new() } else { format!(" Backstop: {}.", by.join(", ")) };
            out.push_str(&format!("- **{}**: {}{}\n", r.title, r.detail, backstop));
            for h in &r.reached_at {
                out.push_str(&format!("  - reached: {} `{}` ({})\n", h.kind.as_str(), h.label, h.location()));
            }
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
        Some(Mark::Unresolved) => " **UNRESOLVED**".into(),
        Some(Mark::Allowed) => " (unresolved, allowed: residue)".into(),
        None => String::new(),
    };
    let used = n.used_at.as_ref().map(|u| format!(", used at {}:{}", u.file, u.line)).unwrap_or_default();
    out.push_str(&format!(
        "{}- {} `{}` ({}:{}{}){}\n",
        "  ".repeat(depth),
        n.kind.as_str(),
        n.label,
        n.file,
        n.line,
        used,
        mark
    ));
    for c in &n.children {
        tree_md(out, c, depth + 1);
    }
}
