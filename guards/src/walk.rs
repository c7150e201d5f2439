//! The walk: finds tool roots, follows every type, bound, alias, trait, closure, constructor
//! and body they reach, and records each path to a forbidden type or call. It never stops
//! early on a finding elsewhere and never treats an unresolved name as safe by default.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use quote::ToTokens;
use syn::visit::Visit;

use syn::spanned::Spanned;

use crate::model::{Crate, DefId, DefKind, ModId, Res, Uses, flatten_use, is_include, line_of};
use crate::report::{
    BoundaryReport, Finding, FindingKind, Held, Hop, HopKind, Mark, Residue, Site, ToolKind, ToolReport, TreeNode,
};
use crate::rules::{ForbiddenType, Rules, UNRESOLVED_ROW};

/// Where a type or expression is written: resolution context.
#[derive(Clone)]
struct Scope {
    module: ModId,
    file: String,
    generics: Vec<String>,
    self_def: Option<DefId>,
    uses: Rc<Uses>,
    /// Items declared inside the body being read (`struct`, `type`, `fn` ..): a path starting
    /// at one names what the body itself declares (and is read as part of it). Value bindings
    /// are told apart where they are written (see [`Collector`]).
    locals: Rc<HashSet<String>>,
}

/// Output of walking a crate.
pub(crate) struct Walked {
    pub tools: Vec<ToolReport>,
    pub findings: Vec<Finding>,
    pub boundaries: Vec<BoundaryReport>,
    /// One entry per `allow_unresolved` rule, with where tools reached it.
    pub residue: Vec<Residue>,
}

/// One root's walk (a tool, or a boundary audit).
struct Walk<'a> {
    krate: &'a Crate,
    rules: &'a Rules,
    root: String,
    /// When auditing a boundary: its def (not a stop for itself); forbidden hits are checked
    /// against `allowed_in` instead of being findings outright.
    audit: Option<DefId>,
    visited_defs: HashSet<DefId>,
    visited_fns: HashSet<(String, usize)>,
    stack: Vec<Hop>,
    findings: Vec<Finding>,
    seen_findings: HashSet<(String, String, String, usize)>,
    held: Vec<Held>,
    boundaries_hit: HashSet<String>,
    /// Allowed unresolved items met: item -> where, with the path to it.
    allowed: Vec<(String, Hop)>,
    /// The crate traits in scope in a module with no block `use`s (see
    /// [`Crate::traits_in_scope`]), worked out once per module.
    traits_in_scope: HashMap<ModId, Rc<HashSet<DefId>>>,
}

pub(crate) fn walk_crate(krate: &Crate, rules: &Rules, tool_modules: &[String]) -> Walked {
    let mut tools = Vec::new();
    let mut findings = Vec::new();
    let mut crossings: HashMap<String, Vec<String>> = HashMap::new();
    let (unseen, mut allowed) = unseen_code(krate, rules);
    findings.extend(unseen);
    for root in discover(krate, rules, tool_modules) {
        let mut w = Walk::new(krate, rules, root.name.clone(), None);
        let tree = w.walk_root(&root);
        for b in &w.boundaries_hit {
            crossings.entry(b.clone()).or_default().push(root.name.clone());
        }
        allowed.extend(w.allowed);
        findings.extend(w.findings);
        tools.push(ToolReport {
            name: root.name.clone(),
            kind: root.kind,
            module: krate.module_path(root.module),
            file: root.file.clone(),
            line: root.line,
            tree,
        });
    }
    let mut boundaries = Vec::new();
    for b in &rules.boundary {
        let local = (0..krate.defs.len()).find(|&d| b.paths.contains(&krate.def_path(d)));
        let mut report = BoundaryReport {
            name: b.name.clone(),
            paths: b.paths.clone(),
            reason: b.reason.clone(),
            defined_at: None,
            holds: Vec::new(),
            crossed_by: crossings.remove(&b.name).unwrap_or_default(),
            tree: None,
        };
        if let Some(d) = local {
            let def = &krate.defs[d];
            report.defined_at = Some(Hop {
                used_at: None,
                kind: HopKind::Type,
                label: krate.def_path(d),
                file: def.file.clone(),
                line: def.line,
            });
            let mut w = Walk::new(krate, rules, format!("boundary {}", krate.def_path(d)), Some(d));
            let sc = w.def_scope(d);
            let nodes = w.def_node(d, None, &sc);
            report.tree = nodes.into_iter().next();
            report.holds = w.held;
            allowed.extend(w.allowed);
            findings.extend(w.findings);
        }
        boundaries.push(report);
    }
    let residue: Vec<Residue> = rules
        .allow_unresolved
        .iter()
        .map(|a| {
            let mut reached_at: Vec<Hop> =
                allowed.iter().filter(|(item, _)| *item == a.item).map(|(_, h)| h.clone()).collect();
            reached_at.dedup();
            Residue {
                title: format!("Unresolved name allowed by the rules: `{}`", a.item),
                detail: format!(
                    "{}{} The walk cannot see what this name is; it passes because the rules allow this exact item.{}",
                    a.reason.trim_end_matches('.'),
                    ".",
                    if reached_at.is_empty() { " No tool reaches it in this run." } else { "" }
                ),
                backstop: vec![
                    crate::rules::Enforcement::RuntimeFailClosedFactory,
                    crate::rules::Enforcement::AuditBackstop,
                ],
                item: Some(a.item.clone()),
                reached_at,
            }
        })
        .collect();
    let mut residue = residue;
    residue.push(foreign_item_macros(krate));
    Walked { tools, findings, boundaries, residue }
}

/// The item-level macros of other crates in this build (the walk does not expand them, and
/// one could write a tool whose attributes its input does not name): listed per run.
fn foreign_item_macros(krate: &Crate) -> Residue {
    let mut reached_at = Vec::new();
    for module in &krate.modules {
        for mac in &module.item_macros {
            let last = mac.path.rsplit("::").next().unwrap_or(&mac.path);
            if krate.macro_defs.contains_key(last) || last == "include" {
                continue;
            }
            reached_at.push(Hop {
                used_at: None,
                kind: HopKind::Macro,
                label: format!("{}!", mac.path),
                file: mac.file.clone(),
                line: mac.line,
            });
        }
    }
    let detail = if reached_at.is_empty() {
        "None in this build.".to_string()
    } else {
        format!(
            "{} in this build, listed below: what they expand to is not walked; a tool one of them writes without naming a tool attribute in its input would be served unchecked.",
            reached_at.len()
        )
    };
    Residue {
        title: "Item-level macros of other crates".into(),
        detail,
        backstop: vec![crate::rules::Enforcement::RuntimeFailClosedFactory, crate::rules::Enforcement::AuditBackstop],
        item: None,
        reached_at,
    }
}

// ------------------------------------------------------------------ discovery

enum RootKind {
    /// A `#[tool]` fn in impl `impl_idx` (item index), or a free fn (`fns` index).
    ImplFn {
        impl_idx: usize,
        item: usize,
    },
    FreeFn {
        fn_idx: usize,
    },
    /// Every method of an impl is a root (handler trait, tool_set impl).
    WholeImpl {
        impl_idx: usize,
    },
    /// A type with a tool_set attribute.
    Type {
        def: DefId,
    },
}

struct Root {
    name: String,
    kind: ToolKind,
    module: ModId,
    file: String,
    line: usize,
    what: RootKind,
}

fn attr_matches(attrs: &[syn::Attribute], names: &[String]) -> bool {
    attrs.iter().any(|a| a.path().segments.last().is_some_and(|s| names.iter().any(|n| s.ident == n)))
}

/// Like [`attr_matches`], and also an attribute imported under another name
/// (`use rmcp::tool as expose; #[expose]`): its path is resolved in module `m`.
fn attr_is(krate: &Crate, m: ModId, attrs: &[syn::Attribute], names: &[String]) -> bool {
    attr_matches(attrs, names)
        || attrs.iter().any(|a| {
            let segs: Vec<String> = a.path().segments.iter().map(|s| s.ident.to_string()).collect();
            krate.resolve_all_with(m, &segs, 0, &Uses::new()).into_iter().any(|r| match r {
                Res::External(p) => p.last().is_some_and(|l| names.contains(l)),
                _ => false,
            })
        })
}

fn in_filter(krate: &Crate, m: ModId, filter: &[String]) -> bool {
    if filter.is_empty() {
        return true;
    }
    let p = krate.module_path(m);
    filter.iter().any(|f| p == *f || p.starts_with(&format!("{f}::")))
}

fn self_ty_name(krate: &Crate, imp: &crate::model::ImplInfo) -> String {
    match imp.self_def {
        Some(d) => krate.defs[d].name.clone(),
        None => tokens(&*imp.item.self_ty),
    }
}

/// Tool roots. `#[tool]` fns, every fn of a `#[tool_router]` impl and `tool_set` items are
/// roots wherever they are written in the crate (the server serves them wherever they are);
/// `filter` (the tool modules) only limits which handler-trait impls are roots, so the
/// dispatcher, the sanctioned bridge that implements `ServerHandler` outside them, is not one.
fn discover(krate: &Crate, rules: &Rules, filter: &[String]) -> Vec<Root> {
    let d = &rules.discovery;
    let mut roots = Vec::new();
    for (i, imp) in krate.impls.iter().enumerate() {
        let ty = self_ty_name(krate, imp);
        let handler = imp.item.trait_.as_ref().and_then(|(_, p, _)| {
            p.segments.last().filter(|s| d.handler_traits.iter().any(|h| s.ident == h)).map(|s| s.ident.to_string())
        });
        if let Some(tr) = handler
            && in_filter(krate, imp.module, filter)
        {
            roots.push(Root {
                name: format!("{ty} as {tr}"),
                kind: ToolKind::ServerHandler,
                module: imp.module,
                file: imp.file.clone(),
                line: line_of(&imp.item.self_ty),
                what: RootKind::WholeImpl { impl_idx: i },
            });
            continue;
        }
        if attr_is(krate, imp.module, &imp.item.attrs, &d.tool_set_attributes) {
            roots.push(Root {
                name: format!("{ty} (tool_set)"),
                kind: ToolKind::ToolSet,
                module: imp.module,
                file: imp.file.clone(),
                line: line_of(&imp.item.self_ty),
                what: RootKind::WholeImpl { impl_idx: i },
            });
            continue;
        }
        let router = attr_is(krate, imp.module, &imp.item.attrs, &d.tool_router_attributes);
        for (j, item) in imp.item.items.iter().enumerate() {
            if let syn::ImplItem::Fn(f) = item
                && (router
                    || attr_is(krate, imp.module, &f.attrs, &d.tool_attributes)
                    || builds_routes(&f.block, &d.route_builders))
            {
                roots.push(Root {
                    name: format!("{ty}::{}", f.sig.ident),
                    kind: ToolKind::Tool,
                    module: imp.module,
                    file: imp.file.clone(),
                    line: line_of(&f.sig.ident),
                    what: RootKind::ImplFn { impl_idx: i, item: j },
                });
            }
        }
    }
    for (i, f) in krate.fns.iter().enumerate() {
        if attr_is(krate, f.module, &f.item.attrs, &d.tool_attributes)
            || builds_routes(&f.item.block, &d.route_builders)
        {
            roots.push(Root {
                name: format!("{}::{}", krate.module_path(f.module), f.item.sig.ident),
                kind: ToolKind::Tool,
                module: f.module,
                file: f.file.clone(),
                line: line_of(&f.item.sig.ident),
                what: RootKind::FreeFn { fn_idx: i },
            });
        }
    }
    for (i, def) in krate.defs.iter().enumerate() {
        if !matches!(def.kind, DefKind::Trait(_) | DefKind::Alias(_))
            && attr_is(krate, def.module, def.attrs(), &d.tool_set_attributes)
        {
            roots.push(Root {
                name: format!("{} (tool_set)", def.name),
                kind: ToolKind::ToolSet,
                module: def.module,
                file: def.file.clone(),
                line: def.line,
                what: RootKind::Type { def: i },
            });
        }
    }
    roots
}

/// Whether a body builds tool routes by hand (names `ToolRoute`, calls `.with_route(..)`).
fn builds_routes(block: &syn::Block, names: &[String]) -> bool {
    struct Finder<'a>(&'a [String], bool);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_path(&mut self, p: &'ast syn::Path) {
            self.1 |= p.segments.iter().any(|s| self.0.iter().any(|n| s.ident == n));
            syn::visit::visit_path(self, p);
        }
        fn visit_expr_method_call(&mut self, e: &'ast syn::ExprMethodCall) {
            self.1 |= self.0.iter().any(|n| e.method == n);
            syn::visit::visit_expr_method_call(self, e);
        }
    }
    let mut f = Finder(names, false);
    f.visit_block(block);
    f.1
}

/// What the walk cannot read and that may write a tool: an item-level macro whose input, or
/// (for the crate's own `macro_rules!`) whose rules, name a tool attribute or a handler trait,
/// and `include!` of a file it cannot name. The first fails the build outright (a tool the
/// walk does not see would be served unchecked); the second is unresolved (G9), which the
/// rules may allow item by item.
fn unseen_code(krate: &Crate, rules: &Rules) -> (Vec<Finding>, Vec<(String, Hop)>) {
    let d = &rules.discovery;
    // Tool attributes as attributes (`#[tool]`: `#tool`), handler traits by name.
    let marks: Vec<String> = d
        .tool_attributes
        .iter()
        .chain(&d.tool_router_attributes)
        .chain(&d.tool_set_attributes)
        .map(|a| format!("#{a}"))
        .chain(d.handler_traits.iter().cloned())
        .collect();
    let mut w = Walk::new(krate, rules, String::new(), None);
    let item_level =
        krate.modules.iter().enumerate().flat_map(|(m, module)| module.item_macros.iter().map(move |x| (m, x)));
    let in_bodies = krate.nested_macros.iter().map(|(m, x)| (*m, x));
    for (m, mac) in item_level.chain(in_bodies) {
        {
            let last = mac.path.rsplit("::").next().unwrap_or(&mac.path);
            let in_input = mac.idents.iter().find(|i| marks.contains(i));
            let in_rules = krate.macro_idents.get(last).and_then(|ids| ids.iter().find(|i| marks.contains(i)));
            let Some(mark) = in_input.or(in_rules) else { continue };
            let mark = mark.strip_prefix('#').map(|a| format!("#[{a}]")).unwrap_or_else(|| mark.clone());
            let label = format!("{}::{}!", krate.module_path(m), last);
            w.root = format!("macro {}! ({}:{})", mac.path, mac.file, mac.line);
            let hop = Hop {
                used_at: None,
                kind: HopKind::Macro,
                label: label.clone(),
                file: mac.file.clone(),
                line: mac.line,
            };
            let whose = if in_input.is_some() { "its input" } else { "its macro_rules! definition" };
            let reason = format!(
                "a macro writes tool code the walk cannot read (`{mark}` in {whose}): a tool it writes would be served without being walked; write the tool out (the walk reads every #[tool] fn and #[tool_router] impl wherever it is)"
            );
            w.record(FindingKind::Unresolved, hop, UNRESOLVED_ROW, &label, &reason);
        }
    }
    for (m, mac) in &krate.opaque_includes {
        w.root = format!("include! ({}:{})", mac.file, mac.line);
        let item = vec![krate.module_path(*m), "include!".to_string()];
        w.unresolved(*m, &item, HopKind::Macro, &mac.file, mac.line);
    }
    (w.findings, w.allowed)
}

// ------------------------------------------------------------------ helpers

/// Token text with the spaces `quote` puts around punctuation removed.
pub(crate) fn tokens<T: ToTokens + ?Sized>(t: &T) -> String {
    let raw = t.to_token_stream().to_string();
    let chars: Vec<char> = raw.chars().collect();
    let mut out = String::with_capacity(raw.len());
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' {
            let prev = out.chars().last();
            let next = chars.get(i + 1).copied();
            let after_path_sep = out.ends_with("::");
            let drop = matches!(prev, Some('<' | '(' | '[' | '&' | '.' | '!'))
                || matches!(next, Some('>' | ')' | ']' | ',' | ';' | ':' | '.' | '(' | '<'))
                || after_path_sep;
            if drop {
                continue;
            }
        }
        out.push(c);
    }
    out
}

fn generic_names(g: &syn::Generics) -> Vec<String> {
    g.type_params().map(|t| t.ident.to_string()).collect()
}

fn pat_label(p: &syn::Pat) -> String {
    match p {
        syn::Pat::Ident(i) => i.ident.to_string(),
        syn::Pat::Type(t) => pat_label(&t.pat),
        other => tokens(other),
    }
}

/// Whether a subtree says anything beyond leaf external types: used to prune impl and body
/// sections of the trees (never the findings, which are recorded as they are met).
fn interesting(n: &TreeNode) -> bool {
    match n.mark {
        Some(Mark::Forbidden)
        | Some(Mark::Boundary)
        | Some(Mark::Opaque)
        | Some(Mark::Unresolved)
        | Some(Mark::Allowed) => {
            return true;
        }
        Some(Mark::External) | Some(Mark::Visited) => {}
        None => {
            if matches!(n.kind, HopKind::Type | HopKind::Alias | HopKind::Trait)
                || (n.kind == HopKind::Call)
                || n.kind == HopKind::Static
            {
                return true;
            }
        }
    }
    n.children.iter().any(interesting)
}

fn returns_self(output: &syn::ReturnType, name: &str) -> bool {
    let syn::ReturnType::Type(_, ty) = output else {
        return false;
    };
    fn mentions(ty: &syn::Type, name: &str) -> bool {
        match ty {
            syn::Type::Path(tp) => tp.path.segments.iter().any(|s| {
                s.ident == "Self"
                    || s.ident == name
                    || match &s.arguments {
                        syn::PathArguments::AngleBracketed(a) => a.args.iter().any(|g| match g {
                            syn::GenericArgument::Type(t) => mentions(t, name),
                            _ => false,
                        }),
                        _ => false,
                    }
            }),
            syn::Type::Paren(p) => mentions(&p.elem, name),
            syn::Type::Group(g) => mentions(&g.elem, name),
            _ => false,
        }
    }
    mentions(ty, name)
}

fn leaf(kind: HopKind, label: String, file: &str, line: usize, mark: Option<Mark>) -> TreeNode {
    TreeNode { kind, label, file: file.to_string(), line, used_at: None, mark, guard_row: None, children: Vec::new() }
}

// ------------------------------------------------------------------ the walk

impl<'a> Walk<'a> {
    fn new(krate: &'a Crate, rules: &'a Rules, root: String, audit: Option<DefId>) -> Self {
        Walk {
            krate,
            rules,
            root,
            audit,
            visited_defs: HashSet::new(),
            visited_fns: HashSet::new(),
            stack: Vec::new(),
            findings: Vec::new(),
            seen_findings: HashSet::new(),
            held: Vec::new(),
            boundaries_hit: HashSet::new(),
            allowed: Vec::new(),
            traits_in_scope: HashMap::new(),
        }
    }

    /// Builds a node: the hop is on the path stack while its children are walked.
    fn node(&mut self, hop: Hop, f: impl FnOnce(&mut Self) -> Vec<TreeNode>) -> TreeNode {
        self.stack.push(hop.clone());
        let children = f(self);
        self.stack.pop();
        TreeNode {
            kind: hop.kind,
            label: hop.label,
            file: hop.file,
            line: hop.line,
            used_at: hop.used_at,
            mark: None,
            guard_row: None,
            children,
        }
    }

    fn record(&mut self, kind: FindingKind, hop: Hop, guard_row: &str, forbidden: &str, reason: &str) {
        let key = (guard_row.to_string(), forbidden.to_string(), hop.file.clone(), hop.line);
        if !self.seen_findings.insert(key) {
            return;
        }
        let mut path = self.stack.clone();
        path.push(hop);
        self.findings.push(Finding {
            guard_row: guard_row.to_string(),
            kind,
            root: self.root.clone(),
            forbidden: forbidden.to_string(),
            reason: reason.to_string(),
            path,
        });
    }

    /// A forbidden type was met at `hop`, named in module `site` at `site_line` of the scope's file.
    fn forbidden_type(&mut self, hop: Hop, rule: &ForbiddenType, sc: &Scope, site_line: usize) -> TreeNode {
        let site = sc.module;
        let label = hop.label.clone();
        if self.audit.is_some() {
            let module = self.krate.module_path(site);
            let allowed = rule.allowed_in.iter().any(|a| module == *a || module.starts_with(&format!("{a}::")));
            if allowed {
                self.held.push(Held {
                    forbidden: label.clone(),
                    guard_row: rule.guard_row.clone(),
                    module,
                    file: sc.file.clone(),
                    line: site_line,
                });
            } else {
                self.record(FindingKind::BoundaryLeak, hop.clone(), &rule.guard_row, &label, &rule.reason);
            }
        } else {
            self.record(FindingKind::Type, hop.clone(), &rule.guard_row, &label, &rule.reason);
        }
        let mut n = leaf(hop.kind, label, &hop.file, hop.line, Some(Mark::Forbidden));
        n.guard_row = Some(rule.guard_row.clone());
        n
    }

    fn forbidden_call(&mut self, label: String, file: &str, line: usize, row: &str, reason: &str) -> TreeNode {
        let hop = Hop { used_at: None, kind: HopKind::Call, label: label.clone(), file: file.to_string(), line };
        self.record(FindingKind::Call, hop, row, &label, reason);
        let mut n = leaf(HopKind::Call, label, file, line, Some(Mark::Forbidden));
        n.guard_row = Some(row.to_string());
        n
    }

    /// A name no definition answers: a finding, unless the rules allow that exact item.
    fn unresolved(&mut self, m: ModId, item: &[String], kind: HopKind, file: &str, line: usize) -> TreeNode {
        let label = item.join("::");
        let hop = Hop { used_at: None, kind, label: label.clone(), file: file.to_string(), line };
        if self.rules.allowed_unresolved(&label).is_some() {
            self.allowed.push((label.clone(), hop));
            return leaf(kind, label, file, line, Some(Mark::Allowed));
        }
        let krate = self.krate;
        let module = krate.module_path(m);
        let macros = krate.macros_in_scope(m, 0);
        let mut reason = format!(
            "no definition in the crate answers this name (looked up in `{module}`), and it is not provably another crate's: no dependency in Cargo.toml, sysroot crate or prelude name starts it, and no other crate's glob brings it in"
        );
        if !macros.is_empty() {
            let list: Vec<String> = macros
                .iter()
                .map(|mac| {
                    let last = mac.path.rsplit("::").next().unwrap_or(&mac.path);
                    match krate.macro_defs.get(last) {
                        Some((f, l)) => {
                            format!("`{}!` at {}:{} (macro_rules! at {f}:{l})", mac.path, mac.file, mac.line)
                        }
                        None => format!("`{}!` at {}:{}", mac.path, mac.file, mac.line),
                    }
                })
                .collect();
            reason.push_str(&format!(
                "; an item-level macro in scope may write it: {} (the walk does not see macro expansions)",
                list.join(", ")
            ));
        }
        reason.push_str(
            "; an unresolved name is never taken as safe (to let it pass, list the exact item in the rules' allow_unresolved with a reason)",
        );
        self.record(FindingKind::Unresolved, hop, UNRESOLVED_ROW, &label, &reason);
        let mut n = leaf(kind, label, file, line, Some(Mark::Unresolved));
        n.guard_row = Some(UNRESOLVED_ROW.to_string());
        n
    }

    fn def_scope(&self, d: DefId) -> Scope {
        let def = &self.krate.defs[d];
        Scope {
            module: def.module,
            file: def.file.clone(),
            generics: generic_names(def.generics()),
            self_def: Some(d),
            uses: Rc::default(),
            locals: Rc::default(),
        }
    }

    /// Every item a written path may name (more than one through `#[cfg]` arms of a `use`).
    fn resolve(&self, path: &syn::Path, sc: &Scope) -> Vec<Res> {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if path.leading_colon.is_none()
            && let Some(first) = segs.first()
            && first == "Self"
        {
            return vec![match sc.self_def {
                Some(d) if segs.len() == 1 => Res::Def(d),
                Some(d) => Res::Assoc(d, segs[segs.len() - 1].clone()),
                // The self type of an impl for another crate's type (`impl Local for u8`), whose
                // own type is walked where the impl is: `Self` adds nothing more here.
                None => Res::External(segs),
            }];
        }
        let mut segs = segs;
        if path.leading_colon.is_some() {
            segs.insert(0, "::".into());
        }
        self.krate.resolve_all_with(sc.module, &segs, 0, &sc.uses)
    }

    // -------------------------------------------------------------- types

    fn walk_type(&mut self, ty: &syn::Type, sc: &Scope) -> Vec<TreeNode> {
        match ty {
            syn::Type::Path(tp) => {
                let mut out = Vec::new();
                if let Some(q) = &tp.qself {
                    out.extend(self.walk_type(&q.ty, sc));
                }
                out.extend(self.walk_path_type(&tp.path, sc));
                out
            }
            syn::Type::Reference(r) => self.walk_type(&r.elem, sc),
            syn::Type::Ptr(p) => self.walk_type(&p.elem, sc),
            syn::Type::Slice(s) => self.walk_type(&s.elem, sc),
            syn::Type::Array(a) => self.walk_type(&a.elem, sc),
            syn::Type::Paren(p) => self.walk_type(&p.elem, sc),
            syn::Type::Group(g) => self.walk_type(&g.elem, sc),
            syn::Type::Tuple(t) => t.elems.iter().flat_map(|e| self.walk_type(e, sc)).collect(),
            syn::Type::TraitObject(o) => o.bounds.iter().flat_map(|b| self.walk_bound(b, sc)).collect(),
            syn::Type::ImplTrait(i) => i.bounds.iter().flat_map(|b| self.walk_bound(b, sc)).collect(),
            syn::Type::BareFn(f) => {
                let mut out: Vec<TreeNode> = f.inputs.iter().flat_map(|a| self.walk_type(&a.ty, sc)).collect();
                if let syn::ReturnType::Type(_, t) = &f.output {
                    out.extend(self.walk_type(t, sc));
                }
                out
            }
            // A type written by a macro: what it expands to is not seen, so it is unresolved.
            syn::Type::Macro(m) => {
                let item = vec![self.krate.module_path(sc.module), format!("{}!", tokens(&m.mac.path))];
                vec![self.unresolved(sc.module, &item, HopKind::Macro, &sc.file, line_of(&m.mac.path))]
            }
            _ => Vec::new(),
        }
    }

    fn walk_bound(&mut self, b: &syn::TypeParamBound, sc: &Scope) -> Vec<TreeNode> {
        match b {
            syn::TypeParamBound::Trait(t) => self.walk_path_type(&t.path, sc),
            _ => Vec::new(),
        }
    }

    /// Generic arguments of every segment, `Fn(A) -> B` sugar included.
    fn path_args(&mut self, path: &syn::Path, sc: &Scope) -> Vec<TreeNode> {
        let mut out = Vec::new();
        for seg in &path.segments {
            match &seg.arguments {
                syn::PathArguments::AngleBracketed(a) => {
                    for g in &a.args {
                        match g {
                            syn::GenericArgument::Type(t) => out.extend(self.walk_type(t, sc)),
                            syn::GenericArgument::AssocType(at) => out.extend(self.walk_type(&at.ty, sc)),
                            syn::GenericArgument::Constraint(c) => {
                                for b in &c.bounds {
                                    out.extend(self.walk_bound(b, sc));
                                }
                            }
                            _ => {}
                        }
                    }
                }
                syn::PathArguments::Parenthesized(p) => {
                    for t in &p.inputs {
                        out.extend(self.walk_type(t, sc));
                    }
                    if let syn::ReturnType::Type(_, t) = &p.output {
                        out.extend(self.walk_type(t, sc));
                    }
                }
                syn::PathArguments::None => {}
            }
        }
        out
    }

    fn walk_path_type(&mut self, path: &syn::Path, sc: &Scope) -> Vec<TreeNode> {
        let line = line_of(path);
        if path.leading_colon.is_none()
            && path.segments[0].arguments.is_none()
            && sc.generics.iter().any(|g| path.segments[0].ident == g)
        {
            // `T`, or `S::Ok`: a generic parameter (its bounds are walked where it is declared).
            return vec![leaf(HopKind::GenericParam, tokens(path), &sc.file, line, None)];
        }
        if path.leading_colon.is_none() && sc.locals.contains(&path.segments[0].ident.to_string()) {
            // A type the body declares: read as part of the body; its generic arguments here.
            return self.path_args(path, sc);
        }
        let mut out = Vec::new();
        for res in self.resolve(path, sc) {
            out.extend(self.walk_resolved_type(res, path, sc, line));
        }
        out
    }

    fn walk_resolved_type(&mut self, res: Res, path: &syn::Path, sc: &Scope, line: usize) -> Vec<TreeNode> {
        match res {
            Res::Def(d) | Res::Assoc(d, _) => self.def_node(d, Some(path), sc),
            Res::External(p) => vec![self.external_node(p.join("::"), Some(path), sc, line)],
            Res::Unresolved(m, item) => {
                let mut n = self.unresolved(m, &item, HopKind::Type, &sc.file, line);
                n.children = self.path_args(path, sc);
                vec![n]
            }
            // A module, fn or static where a type is written: nothing the walk can name.
            Res::Module(_) | Res::Fn(_) | Res::Static(_) => {
                let item: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
                vec![self.unresolved(sc.module, &item, HopKind::Type, &sc.file, line)]
            }
        }
    }

    fn external_node(&mut self, full: String, args: Option<&syn::Path>, sc: &Scope, line: usize) -> TreeNode {
        let hop = Hop { used_at: None, kind: HopKind::Type, label: full.clone(), file: sc.file.clone(), line };
        if let Some(rule) = self.rules.forbidden_type(&full, false) {
            return self.forbidden_type(hop, rule, sc, line);
        }
        if let Some(b) = self.rules.boundary(&full) {
            self.boundaries_hit.insert(b.name.clone());
            return leaf(HopKind::Type, full, &sc.file, line, Some(Mark::Boundary));
        }
        let mut n = self.node(hop, |w| match args {
            Some(p) => w.path_args(p, sc),
            None => Vec::new(),
        });
        n.mark = Some(Mark::External);
        n
    }

    /// A crate type reached from `sc` (generic arguments of `args` walked too), with every
    /// other `cfg` arm that defines the same name.
    fn def_node(&mut self, d: DefId, args: Option<&syn::Path>, sc: &Scope) -> Vec<TreeNode> {
        let mut out = Vec::new();
        // The other cfg arms that define this name: walked as well.
        for &t in self.krate.def_twins.get(&d).map(Vec::as_slice).unwrap_or_default() {
            out.extend(self.def_node_one(t, args, sc));
        }
        out.extend(self.def_node_one(d, args, sc));
        out
    }

    /// One crate definition reached from `sc` (generic arguments of `args` walked too).
    fn def_node_one(&mut self, d: DefId, args: Option<&syn::Path>, sc: &Scope) -> Vec<TreeNode> {
        let krate = self.krate;
        let def = &krate.defs[d];
        let used_at = args
            .map(|p| Site { file: sc.file.clone(), line: line_of(p) })
            .filter(|u| (u.file.as_str(), u.line) != (def.file.as_str(), def.line));
        let kind = match def.kind {
            DefKind::Alias(_) => HopKind::Alias,
            DefKind::Trait(_) => HopKind::Trait,
            _ => HopKind::Type,
        };
        let hop = Hop { used_at, kind, label: krate.def_path(d), file: def.file.clone(), line: def.line };
        let full = hop.label.clone();
        let kind = hop.kind;
        if let Some(rule) = self.rules.forbidden_type(&full, true) {
            let site_line = args.map(line_of).unwrap_or(def.line);
            return vec![self.forbidden_type(hop, rule, sc, site_line)];
        }
        if self.audit != Some(d)
            && let Some(b) = self.rules.boundary(&full)
        {
            self.boundaries_hit.insert(b.name.clone());
            return vec![leaf(kind, full, &def.file, def.line, Some(Mark::Boundary))];
        }
        let first = self.visited_defs.insert(d);
        let mut n = self.node(hop, |w| {
            let mut ch = Vec::new();
            if first {
                ch.extend(w.expand_def(d));
            }
            if let Some(p) = args {
                ch.extend(w.path_args(p, sc));
            }
            ch
        });
        if !first {
            n.mark = Some(Mark::Visited);
        }
        vec![n]
    }

    fn generics_nodes(&mut self, g: &syn::Generics, sc: &Scope) -> Vec<TreeNode> {
        let mut out = Vec::new();
        for tp in g.type_params() {
            for b in &tp.bounds {
                if let syn::TypeParamBound::Trait(_) = b {
                    let hop = Hop {
                        used_at: None,
                        kind: HopKind::Bound,
                        label: format!("{}: {}", tp.ident, tokens(b)),
                        file: sc.file.clone(),
                        line: line_of(b),
                    };
                    out.push(self.node(hop, |w| w.walk_bound(b, sc)));
                }
            }
            if let Some(def) = &tp.default {
                let hop = Hop {
                    used_at: None,
                    kind: HopKind::Bound,
                    label: format!("{} = {}", tp.ident, tokens(def)),
                    file: sc.file.clone(),
                    line: line_of(def),
                };
                out.push(self.node(hop, |w| w.walk_type(def, sc)));
            }
        }
        if let Some(wc) = &g.where_clause {
            for p in &wc.predicates {
                if let syn::WherePredicate::Type(pt) = p {
                    let hop = Hop {
                        used_at: None,
                        kind: HopKind::Bound,
                        label: tokens(pt),
                        file: sc.file.clone(),
                        line: line_of(pt),
                    };
                    out.push(self.node(hop, |w| {
                        let mut ch = w.walk_type(&pt.bounded_ty, sc);
                        for b in &pt.bounds {
                            ch.extend(w.walk_bound(b, sc));
                        }
                        ch
                    }));
                }
            }
        }
        out
    }

    fn fields_nodes(&mut self, fields: &syn::Fields, sc: &Scope) -> Vec<TreeNode> {
        fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let (label, line) = match &f.ident {
                    Some(id) => (id.to_string(), line_of(id)),
                    None => (i.to_string(), line_of(&f.ty)),
                };
                let hop = Hop { used_at: None, kind: HopKind::Field, label, file: sc.file.clone(), line };
                self.node(hop, |w| {
                    let mut ch = w.walk_type(&f.ty, sc);
                    ch.extend(w.attr_code(&f.attrs, sc));
                    ch
                })
            })
            .collect()
    }

    /// Code a derive calls by the name an attribute gives it: serde's `with = "module"` (its
    /// `serialize` and `deserialize`), `serialize_with`, `deserialize_with`, `default = ".."`,
    /// `skip_serializing_if`, `getter`, and the types of `from`, `try_from`, `into`, `remote`
    /// (schemars' alike, where `with` names a type and `schema_with` a fn).
    fn attr_code(&mut self, attrs: &[syn::Attribute], sc: &Scope) -> Vec<TreeNode> {
        const FNS: [&str; 6] =
            ["serialize_with", "deserialize_with", "default", "skip_serializing_if", "getter", "schema_with"];
        const TYPES: [&str; 4] = ["from", "try_from", "into", "remote"];
        let mut out = Vec::new();
        for a in attrs {
            let Some(which) = a.path().segments.last().map(|s| s.ident.to_string()) else { continue };
            if which != "serde" && which != "schemars" {
                continue;
            }
            let mut pairs: Vec<(String, syn::LitStr)> = Vec::new();
            let _ = a.parse_nested_meta(|meta| {
                let key = meta.path.get_ident().map(ToString::to_string).unwrap_or_default();
                if meta.input.peek(syn::Token![=]) {
                    let value: syn::Expr = meta.value()?.parse()?;
                    if let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(v), .. }) = value {
                        pairs.push((key, v));
                    }
                } else if meta.input.peek(syn::token::Paren) {
                    // `rename(serialize = "..")`, `bound(..)`: nothing called by name.
                    let _ = meta.parse_nested_meta(|inner| {
                        if inner.input.peek(syn::Token![=]) {
                            let _: syn::Expr = inner.value()?.parse()?;
                        }
                        Ok(())
                    });
                }
                Ok(())
            });
            for (key, lit) in pairs {
                let value = lit.value();
                let line = line_of(&lit);
                let hop = Hop {
                    used_at: None,
                    kind: HopKind::Call,
                    label: format!("#[{which}({key} = \"{value}\")]"),
                    file: sc.file.clone(),
                    line,
                };
                let n = self.node(hop, |w| {
                    // Parsed from the literal, so every span is the literal's.
                    if key == "with" && which == "serde" {
                        w.with_module(&lit, line, sc)
                    } else if TYPES.contains(&key.as_str()) || (key == "with" && which == "schemars") {
                        match lit.parse::<syn::Type>() {
                            Ok(t) => w.walk_type(&t, sc),
                            Err(_) => Vec::new(),
                        }
                    } else if FNS.contains(&key.as_str()) {
                        match lit.parse::<syn::Path>() {
                            Ok(p) => w.body_path(&p, line, sc),
                            Err(_) => Vec::new(),
                        }
                    } else {
                        Vec::new()
                    }
                });
                if interesting(&n) {
                    out.push(n);
                }
            }
        }
        out
    }

    /// `#[serde(with = "m")]`: serde calls `m::serialize` and `m::deserialize`.
    fn with_module(&mut self, lit: &syn::LitStr, line: usize, sc: &Scope) -> Vec<TreeNode> {
        let Ok(path) = lit.parse::<syn::Path>() else { return Vec::new() };
        let mut out = Vec::new();
        for res in self.resolve(&path, sc) {
            match res {
                Res::Module(m) => {
                    for name in ["serialize", "deserialize"] {
                        if self.krate.modules[m].values.contains_key(name) {
                            let mut p = path.clone();
                            p.segments
                                .push(syn::PathSegment::from(syn::Ident::new(name, proc_macro2::Span::call_site())));
                            out.extend(self.body_path(&p, line, sc));
                        }
                    }
                }
                Res::External(mut segs) => {
                    for name in ["serialize", "deserialize"] {
                        segs.push(name.to_string());
                        if let Some(rule) = self.rules.forbidden_path_call(&segs) {
                            let (row, reason) = (rule.guard_row.clone(), rule.reason.clone());
                            out.push(self.forbidden_call(segs.join("::"), &sc.file, line, &row, &reason));
                        }
                        segs.pop();
                    }
                }
                // A type with `serialize`/`deserialize` associated fns, or a name no module answers.
                other => out.extend(self.body_resolved(other, &path, line, sc)),
            }
        }
        out
    }

    /// Parameters (not `self`) and, when asked, the return type of a signature.
    fn sig_nodes(&mut self, sig: &syn::Signature, sc: &Scope, params: bool, ret: bool) -> Vec<TreeNode> {
        // A signature's bounds are capabilities only for whoever supplies its parameters.
        let mut out = if params { self.generics_nodes(&sig.generics, sc) } else { Vec::new() };
        if params {
            for input in &sig.inputs {
                if let syn::FnArg::Typed(pt) = input {
                    let hop = Hop {
                        used_at: None,
                        kind: HopKind::Param,
                        label: pat_label(&pt.pat),
                        file: sc.file.clone(),
                        line: line_of(&pt.pat),
                    };
                    out.push(self.node(hop, |w| w.walk_type(&pt.ty, sc)));
                }
            }
        }
        if ret && let syn::ReturnType::Type(_, t) = &sig.output {
            let hop = Hop {
                used_at: None,
                kind: HopKind::Returns,
                label: tokens(&**t),
                file: sc.file.clone(),
                line: line_of(&**t),
            };
            out.push(self.node(hop, |w| w.walk_type(t, sc)));
        }
        out
    }

    fn with_generics(sc: &Scope, g: &syn::Generics) -> Scope {
        let mut s = sc.clone();
        s.generics.extend(generic_names(g));
        s
    }

    fn expand_def(&mut self, d: DefId) -> Vec<TreeNode> {
        let krate = self.krate;
        let def = &krate.defs[d];
        let sc = self.def_scope(d);
        let mut out = self.generics_nodes(def.generics(), &sc);
        out.extend(self.attr_code(def.attrs(), &sc));
        match &def.kind {
            DefKind::Struct(s) => out.extend(self.fields_nodes(&s.fields, &sc)),
            DefKind::Union(u) => out.extend(self.fields_nodes(&syn::Fields::Named(u.fields.clone()), &sc)),
            DefKind::Enum(e) => {
                for v in &e.variants {
                    out.extend(self.attr_code(&v.attrs, &sc));
                    let hop = Hop {
                        used_at: None,
                        kind: HopKind::Variant,
                        label: v.ident.to_string(),
                        file: sc.file.clone(),
                        line: line_of(&v.ident),
                    };
                    out.push(self.node(hop, |w| w.fields_nodes(&v.fields, &sc)));
                }
            }
            DefKind::Alias(a) => out.extend(self.walk_type(&a.ty, &sc)),
            DefKind::Trait(t) => {
                for b in &t.supertraits {
                    out.extend(self.walk_bound(b, &sc));
                }
                for item in &t.items {
                    match item {
                        syn::TraitItem::Fn(f) => {
                            let msc = Self::with_generics(&sc, &f.sig.generics);
                            let hop = Hop {
                                used_at: None,
                                kind: HopKind::Method,
                                label: f.sig.ident.to_string(),
                                file: sc.file.clone(),
                                line: line_of(&f.sig.ident),
                            };
                            out.push(self.node(hop, |w| w.sig_nodes(&f.sig, &msc, true, true)));
                        }
                        syn::TraitItem::Type(at) => {
                            let hop = Hop {
                                used_at: None,
                                kind: HopKind::AssocType,
                                label: at.ident.to_string(),
                                file: sc.file.clone(),
                                line: line_of(&at.ident),
                            };
                            out.push(self.node(hop, |w| {
                                let mut ch: Vec<TreeNode> =
                                    at.bounds.iter().flat_map(|b| w.walk_bound(b, &sc)).collect();
                                if let Some((_, t)) = &at.default {
                                    ch.extend(w.walk_type(t, &sc));
                                }
                                ch
                            }));
                        }
                        syn::TraitItem::Const(c) => out.extend(self.walk_type(&c.ty, &sc)),
                        _ => {}
                    }
                }
                // Every impl of the trait, whatever its self type (`impl Local for u8`,
                // `impl<T> Local for Option<T>`): its self type, associated types and signatures.
                for i in 0..krate.impls.len() {
                    if krate.impls[i].trait_def == Some(d) {
                        out.extend(self.trait_impl_node(i));
                    }
                }
            }
        }
        for i in 0..krate.impls.len() {
            if krate.impls[i].self_def == Some(d) {
                out.extend(self.impl_nodes(i, d));
            } else if krate.impls[i].trait_arg_defs.contains(&d) && krate.impls[i].trait_def != Some(d) {
                // `impl From<Local> for String`, `impl Drop for Wrapper<Local>`: reached with `Local`.
                out.extend(self.trait_impl_node(i));
            }
        }
        out
    }

    /// What an impl of a reached type adds: constructors' parameters, methods' return types,
    /// associated types, and a trait impl's generic arguments (`impl AsRef<PgPool> for X`).
    fn impl_nodes(&mut self, i: usize, d: DefId) -> Vec<TreeNode> {
        let krate = self.krate;
        let imp = &krate.impls[i];
        let name = krate.defs[d].name.clone();
        let sc = Scope {
            module: imp.module,
            file: imp.file.clone(),
            generics: generic_names(&imp.item.generics),
            self_def: Some(d),
            uses: Rc::default(),
            locals: Rc::default(),
        };
        match &imp.item.trait_ {
            Some((_, tpath, _)) => {
                let hop = Hop {
                    used_at: None,
                    kind: HopKind::Impl,
                    label: format!("{} for {name}", tokens(tpath)),
                    file: sc.file.clone(),
                    line: line_of(tpath),
                };
                let n = self.node(hop, |w| {
                    let mut ch = w.path_args(tpath, &sc);
                    ch.extend(w.impl_items(&imp.item, &name, &sc, false));
                    ch
                });
                if interesting(&n) { vec![n] } else { Vec::new() }
            }
            None => self.impl_items(&imp.item, &name, &sc, false),
        }
    }

    /// An impl of a reached crate trait: what implements it, and everything its items hand
    /// out or take (associated types, every method's parameters and return type).
    fn trait_impl_node(&mut self, i: usize) -> Vec<TreeNode> {
        let krate = self.krate;
        let imp = &krate.impls[i];
        let sc = self.impl_scope(i);
        let name = self_ty_name(krate, imp);
        let (label, line) = match &imp.item.trait_ {
            Some((_, tpath, _)) => (format!("{} for {}", tokens(tpath), tokens(&*imp.item.self_ty)), line_of(tpath)),
            // `impl dyn Local { .. }`
            None => (tokens(&*imp.item.self_ty), line_of(&imp.item.self_ty)),
        };
        let hop = Hop { used_at: None, kind: HopKind::Impl, label, file: imp.file.clone(), line };
        let n = self.node(hop, |w| {
            let mut ch = w.walk_type(&imp.item.self_ty, &sc);
            ch.extend(w.generics_nodes(&imp.item.generics, &sc));
            if let Some((_, tpath, _)) = &imp.item.trait_ {
                ch.extend(w.path_args(tpath, &sc));
            }
            ch.extend(w.impl_items(&imp.item, &name, &sc, true));
            ch
        });
        if interesting(&n) { vec![n] } else { Vec::new() }
    }

    /// The items of an impl of a reached type: associated types, constructors' parameters,
    /// methods' return types and every method's body (code that holds a value of the type can
    /// call any of them, and `Drop::drop`, `Deref::deref`, `Future::poll` and the like run
    /// without being named); with `whole`, for an impl reached through its trait, every
    /// method's parameters and the associated consts too. Tools of the impl are their own roots.
    fn impl_items(&mut self, item: &syn::ItemImpl, name: &str, sc: &Scope, whole: bool) -> Vec<TreeNode> {
        let mut items = Vec::new();
        let impl_item = item;
        for item in &item.items {
            match item {
                syn::ImplItem::Fn(f) => {
                    if self.is_root_fn(sc.module, impl_item, f) {
                        continue;
                    }
                    let msc = Self::with_generics(sc, &f.sig.generics);
                    let ctor = f.sig.receiver().is_none() && returns_self(&f.sig.output, name);
                    let line = line_of(&f.sig.ident);
                    let hop = Hop {
                        used_at: None,
                        kind: if ctor { HopKind::Constructor } else { HopKind::Method },
                        label: format!("{name}::{}", f.sig.ident),
                        file: sc.file.clone(),
                        line,
                    };
                    // A boundary's own bodies are its trusted code: its audit reads its types.
                    let first = self.audit.is_none() && self.visited_fns.insert((sc.file.clone(), line));
                    let n = self.node(hop, |w| {
                        let mut ch = w.sig_nodes(&f.sig, &msc, ctor || whole, !ctor || whole);
                        if first {
                            ch.extend(w.scan_body(&f.sig, &f.block, &msc));
                        }
                        ch
                    });
                    if interesting(&n) {
                        items.push(n);
                    }
                }
                syn::ImplItem::Type(t) => {
                    let hop = Hop {
                        used_at: None,
                        kind: HopKind::AssocType,
                        label: format!("{name}::{}", t.ident),
                        file: sc.file.clone(),
                        line: line_of(&t.ident),
                    };
                    items.push(self.node(hop, |w| w.walk_type(&t.ty, sc)));
                }
                syn::ImplItem::Const(c) => {
                    let hop = Hop {
                        used_at: None,
                        kind: HopKind::Static,
                        label: format!("{name}::{}", c.ident),
                        file: sc.file.clone(),
                        line: line_of(&c.ident),
                    };
                    let n = self.node(hop, |w| {
                        let mut ch = w.walk_type(&c.ty, sc);
                        if w.audit.is_none() {
                            ch.extend(w.scan_expr(&c.expr, sc));
                        }
                        ch
                    });
                    if interesting(&n) {
                        items.push(n);
                    }
                }
                _ => {}
            }
        }
        items
    }

    /// A fn walked as a tool root of its own: `#[tool]`, or any fn of a `#[tool_router]` impl.
    fn is_root_fn(&self, m: ModId, imp: &syn::ItemImpl, f: &syn::ImplItemFn) -> bool {
        let d = &self.rules.discovery;
        attr_is(self.krate, m, &f.attrs, &d.tool_attributes)
            || attr_is(self.krate, m, &imp.attrs, &d.tool_router_attributes)
    }

    // -------------------------------------------------------------- roots

    fn walk_root(&mut self, root: &Root) -> TreeNode {
        let krate = self.krate;
        let hop = Hop {
            used_at: None,
            kind: HopKind::Tool,
            label: root.name.clone(),
            file: root.file.clone(),
            line: root.line,
        };
        self.node(hop, |w| match &root.what {
            RootKind::ImplFn { impl_idx, item } => {
                let imp = &krate.impls[*impl_idx];
                let syn::ImplItem::Fn(f) = &imp.item.items[*item] else {
                    return Vec::new();
                };
                let sc = w.impl_scope(*impl_idx);
                w.visited_fns.insert((imp.file.clone(), line_of(&f.sig.ident)));
                let mut ch = vec![w.receiver_node(*impl_idx)];
                let fsc = Self::with_generics(&sc, &f.sig.generics);
                ch.extend(w.sig_nodes(&f.sig, &fsc, true, false));
                let label = format!("{}::{}", self_ty_name(krate, imp), f.sig.ident);
                ch.extend(w.body_node(label, (&f.sig, &f.block), &fsc));
                ch.extend(w.receiver_methods(imp.self_def));
                ch
            }
            RootKind::FreeFn { fn_idx } => {
                let f = &krate.fns[*fn_idx];
                let sc = Scope {
                    module: f.module,
                    file: f.file.clone(),
                    generics: generic_names(&f.item.sig.generics),
                    self_def: None,
                    uses: Rc::default(),
                    locals: Rc::default(),
                };
                let mut ch = w.sig_nodes(&f.item.sig, &sc, true, false);
                w.visited_fns.insert((f.file.clone(), line_of(&f.item.sig.ident)));
                let label = format!("{}::{}", krate.module_path(f.module), f.item.sig.ident);
                ch.extend(w.body_node(label, (&f.item.sig, &f.item.block), &sc));
                ch
            }
            RootKind::WholeImpl { impl_idx } => {
                let imp = &krate.impls[*impl_idx];
                let sc = w.impl_scope(*impl_idx);
                let mut ch = vec![w.receiver_node(*impl_idx)];
                let ty = self_ty_name(krate, imp);
                for item in &imp.item.items {
                    if let syn::ImplItem::Fn(f) = item {
                        let fsc = Self::with_generics(&sc, &f.sig.generics);
                        let line = line_of(&f.sig.ident);
                        w.visited_fns.insert((imp.file.clone(), line));
                        let label = format!("{ty}::{}", f.sig.ident);
                        let hop = Hop {
                            used_at: None,
                            kind: HopKind::Method,
                            label: label.clone(),
                            file: imp.file.clone(),
                            line,
                        };
                        ch.push(w.node(hop, |w| {
                            let mut m = w.sig_nodes(&f.sig, &fsc, true, false);
                            m.extend(w.body_node(label, (&f.sig, &f.block), &fsc));
                            m
                        }));
                    }
                }
                ch.extend(w.receiver_methods(imp.self_def));
                ch
            }
            RootKind::Type { def } => {
                let sc = w.def_scope(*def);
                let hop = Hop {
                    used_at: None,
                    kind: HopKind::Receiver,
                    label: krate.defs[*def].name.clone(),
                    file: sc.file.clone(),
                    line: krate.defs[*def].line,
                };
                let mut ch = vec![w.node(hop, |w| w.def_node(*def, None, &sc))];
                ch.extend(w.receiver_methods(Some(*def)));
                ch
            }
        })
    }

    fn impl_scope(&self, i: usize) -> Scope {
        let imp = &self.krate.impls[i];
        Scope {
            module: imp.module,
            file: imp.file.clone(),
            generics: generic_names(&imp.item.generics),
            self_def: imp.self_def,
            uses: Rc::default(),
            locals: Rc::default(),
        }
    }

    fn receiver_node(&mut self, i: usize) -> TreeNode {
        let imp = &self.krate.impls[i];
        let sc = self.impl_scope(i);
        let hop = Hop {
            used_at: None,
            kind: HopKind::Receiver,
            label: tokens(&*imp.item.self_ty),
            file: imp.file.clone(),
            line: line_of(&imp.item.self_ty),
        };
        let mut n = self.node(hop, |w| w.walk_type(&imp.item.self_ty, &sc));
        n.children.extend(self.generics_nodes(&imp.item.generics, &sc));
        n
    }

    /// Bodies of the receiver type's other methods (helpers); tools are walked as their own roots.
    fn receiver_methods(&mut self, d: Option<DefId>) -> Vec<TreeNode> {
        let Some(d) = d else { return Vec::new() };
        let krate = self.krate;
        let mut out = Vec::new();
        for i in 0..krate.impls.len() {
            let imp = &krate.impls[i];
            if imp.self_def != Some(d) {
                continue;
            }
            let sc = self.impl_scope(i);
            for item in &imp.item.items {
                if let syn::ImplItem::Fn(f) = item {
                    let line = line_of(&f.sig.ident);
                    if self.is_root_fn(imp.module, &imp.item, f) || !self.visited_fns.insert((imp.file.clone(), line)) {
                        continue;
                    }
                    let fsc = Self::with_generics(&sc, &f.sig.generics);
                    let label = format!("{}::{}", krate.defs[d].name, f.sig.ident);
                    let hop = Hop {
                        used_at: None,
                        kind: HopKind::Method,
                        label: label.clone(),
                        file: imp.file.clone(),
                        line,
                    };
                    let n = self.node(hop, |w| w.scan_body(&f.sig, &f.block, &fsc));
                    if interesting(&n) {
                        out.push(n);
                    }
                }
            }
        }
        out
    }

    fn body_node(&mut self, label: String, f: (&syn::Signature, &syn::Block), sc: &Scope) -> Option<TreeNode> {
        let line = line_of(&f.0.ident);
        let hop = Hop { used_at: None, kind: HopKind::Body, label, file: sc.file.clone(), line };
        let n = self.node(hop, |w| w.scan_body(f.0, f.1, sc));
        (!n.children.is_empty()).then_some(n)
    }

    // -------------------------------------------------------------- bodies

    /// Reads a fn body: every path, type, method call and macro it writes.
    fn scan_body(&mut self, sig: &syn::Signature, block: &syn::Block, sc: &Scope) -> Vec<TreeNode> {
        let mut c = Collector::default();
        c.scopes.push(HashSet::new());
        c.bind_params(sig);
        c.visit_block(block);
        self.scan_events(c, sc)
    }

    /// Reads an expression (an initialiser, an included file) as a body.
    fn scan_expr(&mut self, e: &syn::Expr, sc: &Scope) -> Vec<TreeNode> {
        let mut c = Collector::default();
        c.visit_expr(e);
        self.scan_events(c, sc)
    }

    fn scan_events(&mut self, c: Collector, sc: &Scope) -> Vec<TreeNode> {
        let mut out = Vec::new();
        for ev in c.events {
            match ev {
                Event::Path(_, _, true, _) => {}
                Event::Path(p, line, false, ctx) => out.extend(self.body_path(&p, line, &Self::in_ctx(sc, ctx))),
                Event::Method(name, line, ctx) => {
                    let sc = Self::in_ctx(sc, ctx);
                    if let Some(rule) = self.rules.forbidden_method_call(&name) {
                        let (row, reason) = (rule.guard_row.clone(), rule.reason.clone());
                        out.push(self.forbidden_call(format!(".{name}()"), &sc.file, line, &row, &reason));
                    }
                    out.extend(self.method_reach(&name, line, &sc));
                }
                Event::Type(t, ctx) => {
                    for n in self.walk_type(&t, &Self::in_ctx(sc, ctx)) {
                        if interesting(&n) {
                            out.push(n);
                        }
                    }
                }
                Event::Macro(name, line, idents) => out.push(self.opaque_macro(name, line, &idents, sc)),
                Event::Include(line, column) => out.push(self.include_expr(line, column, sc)),
                Event::MacroUse(name, line) => out.extend(self.crate_macro(&name, line, sc)),
            }
        }
        out
    }

    /// A crate `macro_rules!` called in a body: its expansion is not seen, so its rules are
    /// scanned for the names of forbidden calls and types (by name, once per walk).
    fn crate_macro(&mut self, name: &str, line: usize, sc: &Scope) -> Option<TreeNode> {
        let krate = self.krate;
        let (file, idents) = krate.macro_tokens.get(name)?;
        let def_line = krate.macro_defs.get(name).map(|(_, l)| *l).unwrap_or(line);
        if !self.visited_fns.insert((file.clone(), def_line)) {
            return None;
        }
        let hop = Hop {
            used_at: Some(Site { file: sc.file.clone(), line }),
            kind: HopKind::Macro,
            label: format!("macro_rules! {name}"),
            file: file.clone(),
            line: def_line,
        };
        let msc = Scope { file: file.clone(), ..sc.clone() };
        let n = self.node(hop, |w| w.forbidden_names(idents, &msc));
        (!n.children.is_empty()).then_some(n)
    }

    /// The forbidden calls and types named among `idents` (by name only).
    fn forbidden_names(&mut self, idents: &[(String, usize)], sc: &Scope) -> Vec<TreeNode> {
        let mut ch = Vec::new();
        for (id, at) in idents {
            if let Some(rule) = self
                .rules
                .forbidden_method_call(id)
                .or_else(|| self.rules.forbidden_path_call(std::slice::from_ref(id)))
            {
                let (row, reason) = (rule.guard_row.clone(), rule.reason.clone());
                ch.push(self.forbidden_call(id.clone(), &sc.file, *at, &row, &reason));
            } else if let Some(rule) = self.rules.forbidden_type(id, false) {
                let hop =
                    Hop { used_at: None, kind: HopKind::Type, label: id.clone(), file: sc.file.clone(), line: *at };
                ch.push(self.forbidden_type(hop, rule, sc, *at));
            }
        }
        ch
    }

    /// The scope of an event: the body's, with what its blocks declare and import there.
    fn in_ctx(sc: &Scope, ctx: Ctx) -> Scope {
        let uses = if ctx.uses.is_empty() {
            sc.uses.clone()
        } else if sc.uses.is_empty() {
            ctx.uses
        } else {
            let mut u = (*sc.uses).clone();
            for (k, v) in ctx.uses.iter() {
                u.insert(k.clone(), v.clone());
            }
            Rc::new(u)
        };
        let locals = if sc.locals.is_empty() {
            ctx.items
        } else {
            Rc::new(sc.locals.iter().chain(ctx.items.iter()).cloned().collect())
        };
        let file = ctx.file.map(|f| f.to_string()).unwrap_or_else(|| sc.file.clone());
        Scope { uses, locals, file, ..sc.clone() }
    }

    /// `include!("x.rs")` in a body: the expression the file holds, read where it is written
    /// (its hops name the included file). A file the walk could not name is unresolved.
    fn include_expr(&mut self, line: usize, column: usize, sc: &Scope) -> TreeNode {
        let krate = self.krate;
        let Some((file, expr)) = krate.included_exprs.get(&(sc.file.clone(), line, column)) else {
            let item = vec![krate.module_path(sc.module), "include!".to_string()];
            return self.unresolved(sc.module, &item, HopKind::Macro, &sc.file, line);
        };
        let hop = Hop {
            used_at: None,
            kind: HopKind::Macro,
            label: format!("include!(\"{file}\")"),
            file: sc.file.clone(),
            line,
        };
        let isc = Scope { file: file.clone(), ..sc.clone() };
        self.node(hop, |w| w.scan_expr(expr, &isc))
    }

    /// A macro call in a body whose input is not Rust the walk can read (`select! { .. }`):
    /// its tokens are scanned for the names of forbidden calls and types, so a spawn or a pool
    /// written inside it is still found (by name only: the macro's expansion is not seen).
    fn opaque_macro(&mut self, name: String, line: usize, idents: &[(String, usize)], sc: &Scope) -> TreeNode {
        let hop = Hop { used_at: None, kind: HopKind::Macro, label: format!("{name}!"), file: sc.file.clone(), line };
        let mut n = self.node(hop, |w| w.forbidden_names(idents, sc));
        if n.children.is_empty() {
            n.mark = Some(Mark::Opaque);
        }
        n
    }

    fn body_path(&mut self, p: &syn::Path, line: usize, sc: &Scope) -> Vec<TreeNode> {
        let first = p.segments[0].ident.to_string();
        // A generic parameter, or an item declared in the body (read as part of it).
        if p.leading_colon.is_none() && (sc.generics.contains(&first) || sc.locals.contains(&first)) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for res in self.resolve(p, sc) {
            out.extend(self.body_resolved(res, p, line, sc));
        }
        out
    }

    fn body_resolved(&mut self, res: Res, p: &syn::Path, line: usize, sc: &Scope) -> Vec<TreeNode> {
        let krate = self.krate;
        let site = Site { file: sc.file.clone(), line };
        match res {
            Res::Unresolved(m, item) => {
                let last = item.last().map(String::as_str).unwrap_or_default();
                let kind = if last.starts_with(char::is_uppercase) { HopKind::Type } else { HopKind::Call };
                vec![self.unresolved(m, &item, kind, &sc.file, line)]
            }
            Res::External(segs) => {
                // `PgPool::connect(..)`, `Parts { .. }`: the body names a forbidden type.
                for n in (1..=segs.len()).rev() {
                    let full = segs[..n].join("::");
                    if let Some(rule) = self.rules.forbidden_type(&full, false) {
                        let hop = Hop { used_at: None, kind: HopKind::Type, label: full, file: sc.file.clone(), line };
                        return vec![self.forbidden_type(hop, rule, sc, line)];
                    }
                }
                if let Some(rule) = self.rules.forbidden_path_call(&segs) {
                    let (row, reason) = (rule.guard_row.clone(), rule.reason.clone());
                    return vec![self.forbidden_call(segs.join("::"), &sc.file, line, &row, &reason)];
                }
                Vec::new()
            }
            Res::Fn(f) => {
                // The other cfg arms of a fn of this name are walked too.
                let twins = krate.fn_twins.get(&f).map(Vec::as_slice).unwrap_or_default();
                twins.iter().chain([&f]).flat_map(|&f| self.call_fn(f, &site)).collect()
            }
            Res::Static(s) => {
                let st = &krate.statics[s];
                let ssc = Scope {
                    module: st.module,
                    file: st.file.clone(),
                    generics: Vec::new(),
                    self_def: None,
                    uses: Rc::default(),
                    locals: Rc::default(),
                };
                let hop = Hop {
                    used_at: Some(site),
                    kind: HopKind::Static,
                    label: format!("{}::{}", krate.module_path(st.module), st.name),
                    file: st.file.clone(),
                    line: st.line,
                };
                // Its initialiser runs when it is first touched (`LazyLock::new(|| ..)`), or is
                // copied where a `const` is used (`const GO: fn(..) = tokio::spawn`).
                let first = self.visited_fns.insert((st.file.clone(), st.line));
                vec![self.node(hop, |w| {
                    let mut ch = w.walk_type(&st.ty, &ssc);
                    if first {
                        ch.extend(w.scan_expr(&st.expr, &ssc));
                    }
                    ch
                })]
            }
            Res::Def(d) => self.def_node(d, Some(p), sc).into_iter().filter(interesting).collect(),
            Res::Assoc(d, name) => {
                let mut out: Vec<TreeNode> = self.def_node(d, Some(p), sc).into_iter().filter(interesting).collect();
                if matches!(krate.defs[d].kind, DefKind::Trait(_)) {
                    out.extend(self.trait_method_bodies(d, &name, &site));
                } else {
                    out.extend(self.follow_assoc_fn(d, &name, &site));
                }
                out
            }
            Res::Module(_) => Vec::new(),
        }
    }

    /// A crate fn a body names: its signature and body.
    fn call_fn(&mut self, f: usize, site: &Site) -> Vec<TreeNode> {
        let krate = self.krate;
        let info = &krate.fns[f];
        let key = (info.file.clone(), line_of(&info.item.sig.ident));
        if !self.visited_fns.insert(key) {
            return Vec::new();
        }
        let fsc = Scope {
            module: info.module,
            file: info.file.clone(),
            generics: generic_names(&info.item.sig.generics),
            self_def: None,
            uses: Rc::default(),
            locals: Rc::default(),
        };
        let hop = Hop {
            used_at: Some(site.clone()),
            kind: HopKind::Call,
            label: format!("{}::{}", krate.module_path(info.module), info.item.sig.ident),
            file: info.file.clone(),
            line: line_of(&info.item.sig.ident),
        };
        let n = self.node(hop, |w| {
            let mut ch = w.sig_nodes(&info.item.sig, &fsc, true, true);
            ch.retain(interesting);
            ch.extend(w.scan_body(&info.item.sig, &info.item.block, &fsc));
            ch
        });
        vec![n]
    }

    /// `.name(..)` in a body. Without types, the method is looked for where Rust looks for it
    /// by name: in every crate trait that declares `name` and is in scope where the call is
    /// written (defined or imported there, renamed or `as _`, or brought by a glob), or that
    /// this walk has reached (a bound, `dyn Trait`): its types, signatures, impls and the
    /// bodies of `name` in them. Inherent methods are read with their type: every body of
    /// every impl of a type the walk reaches is read (see [`Walk::impl_items`]); a receiver
    /// whose type the walk never reaches is in the residue.
    fn method_reach(&mut self, name: &str, line: usize, sc: &Scope) -> Vec<TreeNode> {
        let krate = self.krate;
        let site = Site { file: sc.file.clone(), line };
        let in_scope = if sc.uses.is_empty() {
            Rc::clone(
                self.traits_in_scope
                    .entry(sc.module)
                    .or_insert_with(|| Rc::new(krate.traits_in_scope(sc.module, &sc.uses))),
            )
        } else {
            Rc::new(krate.traits_in_scope(sc.module, &sc.uses))
        };
        let mut out = Vec::new();
        for d in 0..krate.defs.len() {
            let DefKind::Trait(t) = &krate.defs[d].kind else { continue };
            let declares = t.items.iter().any(|it| matches!(it, syn::TraitItem::Fn(f) if f.sig.ident == name));
            if !declares || !(in_scope.contains(&d) || self.visited_defs.contains(&d)) {
                continue;
            }
            let hop =
                Hop { used_at: None, kind: HopKind::Call, label: format!(".{name}()"), file: site.file.clone(), line };
            let n = self.node(hop, |w| {
                let mut ch: Vec<TreeNode> = w.def_node(d, None, sc).into_iter().filter(interesting).collect();
                ch.extend(w.trait_method_bodies(d, name, &site));
                ch
            });
            if interesting(&n) {
                out.push(n);
            }
        }
        out
    }

    /// The bodies of method `name` of crate trait `d`: its default body and every impl's.
    fn trait_method_bodies(&mut self, d: DefId, name: &str, site: &Site) -> Vec<TreeNode> {
        let krate = self.krate;
        let mut out = Vec::new();
        let DefKind::Trait(t) = &krate.defs[d].kind else { return out };
        for it in &t.items {
            if let syn::TraitItem::Fn(f) = it
                && f.sig.ident == name
                && let Some(block) = &f.default
            {
                let line = line_of(&f.sig.ident);
                if self.visited_fns.insert((krate.defs[d].file.clone(), line)) {
                    let tsc = Self::with_generics(&self.def_scope(d), &f.sig.generics);
                    let hop = Hop {
                        used_at: Some(site.clone()),
                        kind: HopKind::Call,
                        label: format!("{}::{name}", krate.def_path(d)),
                        file: krate.defs[d].file.clone(),
                        line,
                    };
                    let n = self.node(hop, |w| w.scan_body(&f.sig, block, &tsc));
                    if interesting(&n) {
                        out.push(n);
                    }
                }
            }
        }
        for i in 0..krate.impls.len() {
            if krate.impls[i].trait_def == Some(d) {
                out.extend(self.impl_method_body(i, name, site, None).filter(interesting));
            }
        }
        out
    }

    /// The body of method `name` in impl `i`, once per walk, under a call hop labelled `label`
    /// (`Type::name` when `None`). `None`: the impl has no such method.
    fn impl_method_body(&mut self, i: usize, name: &str, site: &Site, label: Option<String>) -> Option<TreeNode> {
        let krate = self.krate;
        let imp = &krate.impls[i];
        let f = imp.item.items.iter().find_map(|item| match item {
            syn::ImplItem::Fn(f) if f.sig.ident == name => Some(f),
            _ => None,
        })?;
        let line = line_of(&f.sig.ident);
        let first = self.visited_fns.insert((imp.file.clone(), line));
        let fsc = Self::with_generics(&self.impl_scope(i), &f.sig.generics);
        let hop = Hop {
            used_at: Some(site.clone()),
            kind: HopKind::Call,
            label: label.unwrap_or_else(|| format!("{}::{name}", tokens(&*imp.item.self_ty))),
            file: imp.file.clone(),
            line,
        };
        let mut n = self.node(hop, |w| if first { w.scan_body(&f.sig, &f.block, &fsc) } else { Vec::new() });
        if !first {
            n.mark = Some(Mark::Visited);
        }
        Some(n)
    }

    /// `Type::helper(..)` in a body: scan that fn too.
    fn follow_assoc_fn(&mut self, d: DefId, name: &str, site: &Site) -> Vec<TreeNode> {
        let krate = self.krate;
        for i in 0..krate.impls.len() {
            if krate.impls[i].self_def == Some(d)
                && let Some(n) = self.impl_method_body(i, name, site, Some(format!("{}::{name}", krate.def_path(d))))
            {
                return if n.mark == Some(Mark::Visited) { Vec::new() } else { vec![n] };
            }
        }
        Vec::new()
    }
}

// ------------------------------------------------------------------ body collector

enum Event {
    /// A path in an expression or pattern; `true`: it names a local binding in scope where it
    /// is written (a `let`, a parameter, a closure or match binding) or an item of the body.
    Path(syn::Path, usize, bool, Ctx),
    Method(String, usize, Ctx),
    Type(Box<syn::Type>, Ctx),
    /// A macro call whose input does not parse: its path, line, and every identifier in it.
    Macro(String, usize, Vec<(String, usize)>),
    /// `include!(..)` where an expression goes: the line and column of its path.
    Include(usize, usize),
    /// A macro call in a body, by its path's last segment and line: when the crate defines it
    /// with `macro_rules!`, its rules are scanned for what they write.
    MacroUse(String, usize),
}

/// What is in force where an event is written: the items and generic parameters declared in
/// the blocks and nested items around it, and the `use`s of those blocks.
#[derive(Clone, Default)]
struct Ctx {
    items: Rc<HashSet<String>>,
    uses: Rc<Uses>,
    /// The file the lines are in, when not the body's (a module a body declares with `#[path]`).
    file: Option<Rc<str>>,
}

/// Reads a body in order, keeping lexical scopes: a binding hides an item of the same name
/// only where it is in scope (after its `let`, inside its closure, match arm or loop).
#[derive(Default)]
struct Collector {
    events: Vec<Event>,
    /// Value bindings in scope, innermost last.
    scopes: Vec<HashSet<String>>,
    /// Per enclosing block or nested item: the items and generic parameters it declares, and
    /// its `use`s (a block's items and `use`s are in force in all of it).
    item_scopes: Vec<(HashSet<String>, Uses)>,
    /// What `item_scopes` adds up to.
    now: Ctx,
}

impl Collector {
    fn with_scopes(from: &Collector) -> Self {
        Collector {
            scopes: from.scopes.clone(),
            item_scopes: from.item_scopes.clone(),
            now: from.now.clone(),
            ..Collector::default()
        }
    }

    fn bound(&self, name: &str) -> bool {
        self.scopes.iter().any(|s| s.contains(name))
    }

    fn push_items(&mut self, names: HashSet<String>, uses: Uses) {
        self.item_scopes.push((names, uses));
        self.set_now();
    }

    fn pop_items(&mut self) {
        self.item_scopes.pop();
        self.set_now();
    }

    fn set_now(&mut self) {
        let items = self.item_scopes.iter().flat_map(|(n, _)| n.iter().cloned()).collect();
        // An inner block's `use` of a name replaces an outer one.
        let mut uses = Uses::new();
        for (_, u) in &self.item_scopes {
            for (k, v) in u {
                uses.insert(k.clone(), v.clone());
            }
        }
        self.now = Ctx { items: Rc::new(items), uses: Rc::new(uses), file: self.now.file.clone() };
    }

    /// Binds the names a pattern binds (`x`, `(a, b)`, `S { f, .. }`, `ref mut y`) in the
    /// innermost scope, after reading what the pattern itself names (types, paths).
    fn bind_pat(&mut self, p: &syn::Pat) {
        let mut names = PatNames::default();
        names.visit_pat(p);
        // Paths and types inside the pattern (`Enum::Variant(x)`, `x: Type`).
        syn::visit::visit_pat(self, p);
        if self.scopes.is_empty() {
            self.scopes.push(HashSet::new());
        }
        if let Some(top) = self.scopes.last_mut() {
            top.extend(names.0);
        }
    }

    /// Binds a fn's parameters in the innermost scope.
    fn bind_params(&mut self, sig: &syn::Signature) {
        for input in &sig.inputs {
            if let syn::FnArg::Typed(pt) = input {
                self.bind_pat(&pt.pat);
            }
        }
    }

    fn scoped(&mut self, f: impl FnOnce(&mut Self)) {
        self.scopes.push(HashSet::new());
        f(self);
        self.scopes.pop();
    }

    /// An item inside the body: it sees no local binding of the body around it, and its own
    /// generic parameters are names of its own.
    fn item_scope(&mut self, generics: Option<&syn::Generics>, f: impl FnOnce(&mut Self)) {
        let saved = std::mem::take(&mut self.scopes);
        self.scopes.push(HashSet::new());
        let g: HashSet<String> = generics.map(|g| generic_names(g).into_iter().collect()).unwrap_or_default();
        let pushed = !g.is_empty();
        if pushed {
            self.push_items(g, Uses::new());
        }
        f(self);
        if pushed {
            self.pop_items();
        }
        self.scopes = saved;
    }
}

/// The identifiers a pattern binds.
#[derive(Default)]
struct PatNames(HashSet<String>);

impl<'ast> Visit<'ast> for PatNames {
    fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
        self.0.insert(p.ident.to_string());
        syn::visit::visit_pat_ident(self, p);
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {
        // Read where its block is entered (`visit_block`).
    }

    /// Items declared inside the body: what they contain is read here as part of the body
    /// (their names are in scope in their block, see `visit_block`).
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let generics = match i {
            syn::Item::Fn(x) => Some(&x.sig.generics),
            syn::Item::Struct(x) => Some(&x.generics),
            syn::Item::Enum(x) => Some(&x.generics),
            syn::Item::Union(x) => Some(&x.generics),
            syn::Item::Trait(x) => Some(&x.generics),
            syn::Item::Type(x) => Some(&x.generics),
            syn::Item::Impl(x) => Some(&x.generics),
            _ => None,
        };
        self.item_scope(generics, |c| syn::visit::visit_item(c, i));
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.bind_params(&f.sig);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.item_scope(Some(&f.sig.generics), |c| {
            c.bind_params(&f.sig);
            syn::visit::visit_impl_item_fn(c, f);
        });
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        self.item_scope(Some(&f.sig.generics), |c| {
            c.bind_params(&f.sig);
            syn::visit::visit_trait_item_fn(c, f);
        });
    }

    /// A module a body declares with `#[path]`, read from its file: its lines are that file's.
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let file = m.attrs.iter().find_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident(crate::model::FILE_MARK) => crate::model::lit_str(&nv.value),
            _ => None,
        });
        match file {
            Some(f) => {
                let saved = self.now.file.replace(Rc::from(f.as_str()));
                syn::visit::visit_item_mod(self, m);
                self.now.file = saved;
            }
            None => syn::visit::visit_item_mod(self, m),
        }
    }

    /// A block: its items and `use`s are in force in all of it, its bindings from where they
    /// are made.
    fn visit_block(&mut self, b: &'ast syn::Block) {
        let mut names = HashSet::new();
        let mut uses = Uses::new();
        let mut globs = Vec::new();
        for stmt in &b.stmts {
            match stmt {
                syn::Stmt::Item(syn::Item::Use(u)) => flatten_use(&u.tree, &mut Vec::new(), &mut uses, &mut globs),
                syn::Stmt::Item(i) => names.extend(item_name(i)),
                _ => {}
            }
        }
        let pushed = !names.is_empty() || !uses.is_empty();
        if pushed {
            self.push_items(names, uses);
        }
        self.scoped(|c| syn::visit::visit_block(c, b));
        if pushed {
            self.pop_items();
        }
    }

    /// `let p = init else { .. };`: the initialiser is read before `p` binds.
    fn visit_local(&mut self, l: &'ast syn::Local) {
        if let Some(init) = &l.init {
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        self.bind_pat(&l.pat);
    }

    fn visit_expr_closure(&mut self, e: &'ast syn::ExprClosure) {
        self.scoped(|c| {
            for p in &e.inputs {
                c.bind_pat(p);
            }
            if let syn::ReturnType::Type(_, t) = &e.output {
                c.visit_type(t);
            }
            c.visit_expr(&e.body);
        });
    }

    fn visit_arm(&mut self, a: &'ast syn::Arm) {
        self.scoped(|c| {
            c.bind_pat(&a.pat);
            if let Some((_, g)) = &a.guard {
                c.visit_expr(g);
            }
            c.visit_expr(&a.body);
        });
    }

    /// `if let p = e { .. }` (and let chains): `p` binds in the condition's rest and the
    /// `then` block, not in `else`.
    fn visit_expr_if(&mut self, e: &'ast syn::ExprIf) {
        self.scoped(|c| {
            c.visit_expr(&e.cond);
            c.visit_block(&e.then_branch);
        });
        if let Some((_, el)) = &e.else_branch {
            self.visit_expr(el);
        }
    }

    fn visit_expr_while(&mut self, e: &'ast syn::ExprWhile) {
        self.scoped(|c| {
            c.visit_expr(&e.cond);
            c.visit_block(&e.body);
        });
    }

    fn visit_expr_let(&mut self, e: &'ast syn::ExprLet) {
        self.visit_expr(&e.expr);
        self.bind_pat(&e.pat);
    }

    fn visit_expr_for_loop(&mut self, e: &'ast syn::ExprForLoop) {
        self.visit_expr(&e.expr);
        self.scoped(|c| {
            c.bind_pat(&e.pat);
            c.visit_block(&e.body);
        });
    }

    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        let first = e.path.segments[0].ident.to_string();
        let plain = e.qself.is_none() && e.path.leading_colon.is_none();
        let local = plain && ((e.path.segments.len() == 1 && self.bound(&first)) || self.now.items.contains(&first));
        self.events.push(Event::Path(e.path.clone(), line_of(&e.path), local, self.now.clone()));
        syn::visit::visit_expr_path(self, e);
    }

    fn visit_expr_struct(&mut self, e: &'ast syn::ExprStruct) {
        let first = e.path.segments[0].ident.to_string();
        let local = e.qself.is_none() && e.path.leading_colon.is_none() && self.now.items.contains(&first);
        self.events.push(Event::Path(e.path.clone(), line_of(&e.path), local, self.now.clone()));
        syn::visit::visit_expr_struct(self, e);
    }

    fn visit_expr_method_call(&mut self, e: &'ast syn::ExprMethodCall) {
        self.events.push(Event::Method(e.method.to_string(), line_of(&e.method), self.now.clone()));
        syn::visit::visit_expr_method_call(self, e);
    }

    fn visit_type(&mut self, t: &'ast syn::Type) {
        self.events.push(Event::Type(Box::new(t.clone()), self.now.clone()));
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        use syn::punctuated::Punctuated;
        if is_include(&m.path) {
            let at = m.path.span().start();
            self.events.push(Event::Include(at.line, at.column));
            return;
        }
        if let Some(last) = m.path.segments.last() {
            self.events.push(Event::MacroUse(last.ident.to_string(), line_of(&m.path)));
        }
        let parsed = m.parse_body_with(Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated);
        // The parsed tokens live only here, so they go through a fresh collector that sees the
        // bindings in scope where the macro is written.
        let mut sub = Collector::with_scopes(self);
        match parsed {
            Ok(exprs) => {
                for e in &exprs {
                    sub.visit_expr(e);
                }
            }
            Err(_) => match m.parse_body_with(syn::Block::parse_within) {
                Ok(stmts) => sub.visit_block(&syn::Block { brace_token: Default::default(), stmts }),
                Err(_) => {
                    let mut idents = Vec::new();
                    idents.extend(crate::model::idents_at(m.tokens.clone()));
                    self.events.push(Event::Macro(tokens(&m.path), line_of(&m.path), idents))
                }
            },
        }
        self.events.extend(sub.events);
    }
}

/// The name an item declares, if any.
fn item_name(i: &syn::Item) -> Option<String> {
    let ident = match i {
        syn::Item::Const(x) => &x.ident,
        syn::Item::Enum(x) => &x.ident,
        syn::Item::Fn(x) => &x.sig.ident,
        syn::Item::Mod(x) => &x.ident,
        syn::Item::Static(x) => &x.ident,
        syn::Item::Struct(x) => &x.ident,
        syn::Item::Trait(x) => &x.ident,
        syn::Item::Type(x) => &x.ident,
        syn::Item::Union(x) => &x.ident,
        _ => return None,
    };
    Some(ident.to_string())
}
