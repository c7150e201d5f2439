//! The walk over what rustc compiled: the call graph of the guarded crate's LLVM IR, from every
//! tool the crate serves, checked against the rules on resolved paths.
//!
//! Every name here is the compiler's: a function is its v0 symbol, demangled (`<scopegate::
//! tools::FarmTools>::whoami::{closure#0}`, `tokio::task::spawn::spawn::<F>`,
//! `core::ptr::drop_in_place::<sqlx_core::pool::Pool<sqlx_postgres::database::Postgres>>`), so
//! a type or call is matched by the path it is defined at, whatever it was called in the source.
//!
//! Edges, over-approximated where the IR cannot tell:
//! - a direct call: its callee;
//! - the address of a function (a pointer stored, passed, returned, a closure boxed): the
//!   function, since whoever holds it may call it; the address of a vtable: every function in
//!   it; of a constant: everything stored in it;
//! - the address of a writable static: the static's initialiser and every function that takes
//!   its address anywhere in the crate (a value stored there by start-up code is reachable by
//!   any reader);
//! - a call through vtable slot `n`: slot `n` of every vtable in the crate with a function of
//!   the call's LLVM signature; through a plain function pointer: every function whose address
//!   the crate takes, of that signature.
//!
//! A function of a boundary type (`McpCallContext`) ends the walk from a tool: its insides are
//! walked on their own, where a forbidden type is allowed only in the modules its rule lists.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use crate::ir::{Module, Signature, UseKind};

/// What the compiled walk checks, by defining path (`crate::` is the guarded crate).
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The guarded crate's name as symbols spell it (`scopegate`, `saas_tools`).
    pub crate_name: String,
    /// Forbidden items: a function whose demangled name mentions one of `paths` (as the
    /// function itself, its impl's type or trait, or a generic argument) is forbidden.
    pub forbidden: Vec<Forbidden>,
    /// Boundary types: their functions end a tool's walk and are walked on their own.
    pub boundaries: Vec<String>,
    /// Types that only tool handlers take: a function in a vtable whose entries mention one
    /// is a tool root (rmcp's `ToolCallContext`).
    pub handler_types: Vec<String>,
    /// Functions that register tools (`ToolSet::with`): the functions whose addresses the
    /// registering code takes (validation functions, handlers) are tool roots.
    pub registrations: Vec<String>,
}

impl Policy {
    /// The compiled walk's view of `rules` for the crate `crate_name`: every forbidden type,
    /// call and boundary by the paths it is `defined` at. A path that starts with the crate's
    /// own name is the crate's (`scopegate::store::Db` is `crate::store::Db` when the
    /// gateway itself is guarded).
    pub fn from_rules(rules: &crate::Rules, crate_name: &str) -> Self {
        let own = |p: &String| match p.strip_prefix(crate_name).and_then(|r| r.strip_prefix("::")) {
            Some(rest) => format!("crate::{rest}"),
            None => p.clone(),
        };
        let mut forbidden = Vec::new();
        for t in &rules.forbidden_type {
            if !t.defined.is_empty() {
                forbidden.push(Forbidden {
                    types: t.defined.iter().map(own).collect(),
                    calls: Vec::new(),
                    guard_row: t.guard_row.clone(),
                    reason: t.reason.clone(),
                    allowed_in: t.allowed_in.iter().map(own).collect(),
                });
            }
        }
        for c in &rules.forbidden_call {
            if !c.defined.is_empty() {
                forbidden.push(Forbidden {
                    types: Vec::new(),
                    calls: c.defined.iter().map(own).collect(),
                    guard_row: c.guard_row.clone(),
                    reason: c.reason.clone(),
                    allowed_in: Vec::new(),
                });
            }
        }
        Policy {
            crate_name: crate_name.to_owned(),
            forbidden,
            boundaries: rules.boundary.iter().flat_map(|b| b.defined.iter().map(own)).collect(),
            handler_types: rules.discovery.handler_types.iter().map(own).collect(),
            registrations: rules.discovery.registrations.iter().map(own).collect(),
        }
    }
}

/// One forbidden item.
#[derive(Debug, Clone, Default)]
pub struct Forbidden {
    /// Defining paths of types and traits (`sqlx_core::pool::Pool`,
    /// `crate::identity::TenantContext`): a function of the crate that names one, or calls a
    /// function that names one (as its type, its impl's type or trait, a generic argument),
    /// reaches it. A path matches itself and every item under it.
    pub types: Vec<String>,
    /// Defining paths of functions (`tokio::task::spawn::spawn`,
    /// `std::thread::Builder::spawn`): a function of the crate that calls one, or takes its
    /// address, reaches it.
    pub calls: Vec<String>,
    /// The rule's guard row.
    pub guard_row: String,
    /// Why.
    pub reason: String,
    /// Modules (`crate::store`) where a boundary's insides may use it.
    pub allowed_in: Vec<String>,
}

/// A path from a root to a forbidden item.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Finding {
    /// The root (a tool handler, a validation function, or a boundary function).
    pub root: String,
    /// Each step: the function, and `file:line` of the call or reference leading on.
    pub path: Vec<Step>,
    /// The forbidden item's path as it matched.
    pub item: String,
    /// Its guard row.
    pub guard_row: String,
    /// Its reason.
    pub reason: String,
}

/// One function on a path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// The function, demangled without hashes.
    pub function: String,
    /// Where it calls or references the next step, when the debug info says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Location>,
}

/// A place in the crate's sources.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Location {
    /// Relative to the crate root (as rustc was given it).
    pub file: String,
    /// 1-based.
    pub line: u32,
}

impl Location {
    fn of(graph: &Graph<'_>, dbg: Option<crate::ir::Dbg>) -> Option<Self> {
        dbg.and_then(|d| graph.module.location(d)).map(|(file, line)| Location { file, line })
    }
}

/// A root and what reaches it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Root {
    /// The root function, demangled.
    pub function: String,
    /// Why it is a root.
    pub why: RootKind,
    /// How many functions of the crate and of instantiated generic code it reaches.
    pub reached: usize,
}

/// Why a function is a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootKind {
    /// In a vtable of a tool handler (`dyn Fn(ToolCallContext<..>)`).
    Handler,
    /// Its address is taken by code that registers tools (a validation function).
    Registered,
    /// A function of a boundary type, walked on its own.
    Boundary,
}

/// What the compiled walk found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every root, walked.
    pub roots: Vec<Root>,
    /// Every path to a forbidden item (at most one per root and item).
    pub findings: Vec<Finding>,
    /// Calls into other crates' code that is not instantiated here (its insides unseen),
    /// reached from a tool: the residue, by callee.
    pub opaque: BTreeSet<String>,
}

/// The demangled names of a module's symbols, demangled when first asked for.
struct Names {
    crate_name: String,
    demangled: std::cell::RefCell<HashMap<String, String>>,
}

impl Names {
    fn new(crate_name: &str) -> Self {
        Self { crate_name: crate_name.to_owned(), demangled: Default::default() }
    }

    fn of(&self, symbol: &str) -> String {
        if let Some(name) = self.demangled.borrow().get(symbol) {
            return name.clone();
        }
        let name = demangle(symbol, &self.crate_name);
        self.demangled.borrow_mut().insert(symbol.to_owned(), name.clone());
        name
    }
}

/// A symbol demangled without hashes, with the guarded crate spelled `crate`.
pub fn demangle(symbol: &str, crate_name: &str) -> String {
    let text = match rustc_demangle::try_demangle(symbol.split_once(".llvm.").map_or(symbol, |(s, _)| s)) {
        Ok(d) => format!("{d:#}"),
        Err(_) => return symbol.to_owned(),
    };
    with_crate(&text, crate_name)
}

/// Replaces the path segment `crate_name` where it starts a path with `crate`.
fn with_crate(text: &str, crate_name: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(crate_name)
            && text[i + crate_name.len()..].starts_with("::")
            && (i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':')
        {
            out.push_str("crate");
            i += crate_name.len();
        } else {
            let c = text[i..].chars().next().unwrap_or_default();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The argument tuple of the one `dyn Fn`/`FnMut`/`FnOnce` a name mentions
/// (`<Box<dyn core::ops::function::Fn<(u32,), Output = u32>> as ..>::call` gives `(u32,)`),
/// lifetimes removed.
fn fn_trait_args(name: &str) -> Option<String> {
    // `dyn for<'a> Fn<(&'a str,)>`: the binder says nothing about the arguments.
    let unbound;
    let name = if name.contains("dyn for<") {
        unbound = remove_binders(name);
        unbound.as_str()
    } else {
        name
    };
    let mut found = None;
    for family in
        ["dyn core::ops::function::Fn<", "dyn core::ops::function::FnMut<", "dyn core::ops::function::FnOnce<"]
    {
        let mut from = 0;
        while let Some(at) = name[from..].find(family) {
            let start = from + at + family.len();
            let args = balanced_prefix(&name[start..])?;
            let args = strip_lifetimes(args);
            match &found {
                Some(a) if *a != args => return None,
                _ => found = Some(args),
            }
            from = start;
        }
    }
    found
}

/// `text` without its higher-ranked binders (`for<'a, 'b> `).
fn remove_binders(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("for<") {
        let binder_ends = rest[at..].find("> ").map(|e| at + e + "> ".len());
        let preceded_by_word = rest[..at].bytes().next_back().is_some_and(is_ident);
        match binder_ends {
            Some(end) if !preceded_by_word => {
                out.push_str(&rest[..at]);
                rest = &rest[end..];
            }
            _ => {
                out.push_str(&rest[..at + "for<".len()]);
                rest = &rest[at + "for<".len()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The argument tuple of a closure's or function's `FnOnce::call_once` vtable shim
/// (`<{closure} as core::ops::function::FnOnce<(u32,)>>::call_once::{shim:vtable#0}`).
fn call_once_args(name: &str) -> Option<String> {
    let marker = " as core::ops::function::FnOnce<";
    let at = name.rfind(marker)? + marker.len();
    if !name[at..].contains(">>::call_once") {
        return None;
    }
    balanced_prefix(&name[at..]).map(strip_lifetimes)
}

/// The leading `( .. )` of `text`, balanced (`<>` and `[]` nest inside it too).
fn balanced_prefix(text: &str) -> Option<&str> {
    if !text.starts_with('(') {
        return None;
    }
    crate::ir::balanced(text.char_indices(), &['(', '<', '['], &[')', '>', ']'], false).map(|end| &text[..=end])
}

fn strip_lifetimes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            while chars.peek().is_some_and(|c| c.is_alphanumeric() || *c == '_') {
                chars.next();
            }
            if chars.peek() == Some(&' ') {
                chars.next();
            }
            continue;
        }
        out.push(c);
    }
    out.replace("for<> ", "").replace("for<, > ", "")
}

/// The crate's own code (its functions, closures and impls), not another crate's generic code
/// instantiated with its types.
fn is_own(name: &str) -> bool {
    let own_self = ["crate::", "<crate::", "<dyn crate::", "<&crate::", "<&mut crate::"];
    // The drop glue of the crate's types (and closures): what dropping one runs.
    own_self.iter().any(|p| name.starts_with(p))
        || name.starts_with("core::ptr::drop_in_place::<crate::")
        || impl_of_own_trait(name)
}

/// `<T as crate::Trait>::m`: an impl of the crate's trait, for any self type (`u16`, `&str`):
/// only the crate can have written it.
fn impl_of_own_trait(name: &str) -> bool {
    let Some(inner) = name.strip_prefix('<') else { return false };
    let mut depth = 0usize;
    for (i, c) in inner.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' if depth == 0 => return false,
            '>' | ')' | ']' => depth -= 1,
            ' ' if depth == 0 && inner[i..].starts_with(" as ") => {
                return inner[i + " as ".len()..].starts_with("crate::");
            }
            _ => {}
        }
    }
    false
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Every path (`a::b::C`) a demangled name mentions: the function's own path, its impl's
/// type and trait, and every generic argument, each without its generic arguments.
pub fn mentions(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = name.as_bytes();
    let mut i = 0;
    let mut current = String::new();
    // `<X as T>::m`: after the `>` closing a qualified self, `::m` continues the trait's path.
    while i < bytes.len() {
        let b = bytes[i];
        if is_ident(b) {
            let start = i;
            while i < bytes.len() && is_ident(bytes[i]) {
                i += 1;
            }
            let word = &name[start..i];
            if word == "as" || word == "dyn" || word == "mut" || word == "const" || word == "unsafe" {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
                continue;
            }
            if !current.is_empty() && !current.ends_with("::") {
                out.push(std::mem::take(&mut current));
            }
            current.push_str(word);
            continue;
        }
        if name[i..].starts_with("::") {
            if current.is_empty() {
                // `>::m`: a method of a qualified self; the method alone says nothing.
                i += 2;
                while i < bytes.len() && is_ident(bytes[i]) {
                    i += 1;
                }
                continue;
            }
            current.push_str("::");
            i += 2;
            continue;
        }
        if b == b'{' {
            // `{closure#0}`, `{shim:vtable#0}`: part of the enclosing function, not a path.
            while i < bytes.len() && bytes[i] != b'}' {
                i += 1;
            }
            i += 1;
            if current.ends_with("::") {
                current.truncate(current.len() - 2);
            }
            continue;
        }
        if !current.is_empty() {
            out.push(std::mem::take(&mut current).trim_end_matches("::").to_owned());
        }
        i += 1;
    }
    if !current.is_empty() {
        out.push(current.trim_end_matches("::").to_owned());
    }
    out.retain(|p| p.contains("::"));
    out.sort();
    out.dedup();
    out
}

/// A function's own path without generic arguments: `<X>::m` and `<X as T>::m` are `X::m`,
/// `a::b::f::<G>` is `a::b::f`; closures and shims belong to their function.
pub fn item_path(name: &str) -> String {
    let mut out = String::new();
    let mut rest = name;
    if let Some(inner) = rest.strip_prefix('<') {
        // The qualified self: up to its matching `>`.
        let mut depth = 1;
        let mut end = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '<' => depth += 1,
                '>' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let qualified = &inner[..end];
        let self_type = qualified.split(" as ").next().unwrap_or(qualified);
        out.push_str(&strip_generics(self_type.trim_start_matches('&').trim_start_matches("mut ")));
        rest = &inner[end + 1..];
    }
    out.push_str(&strip_generics(rest));
    out.split("::{").next().unwrap_or_default().to_owned()
}

fn strip_generics(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.replace("::::", "::").trim_end_matches("::").to_owned()
}

/// The module a local function belongs to, for `allowed_in`: the path before its last item
/// segment, or its impl's self type's module (`<crate::store::Db>::begin` is in `crate::store`).
fn module_of(name: &str) -> Option<String> {
    let first_path = |text: &'_ str| -> String {
        let text = text.trim_start_matches("&mut ").trim_start_matches('&').trim_start_matches("dyn ");
        text[..text.find([' ', '>', '<', ',']).unwrap_or(text.len())].to_owned()
    };
    let owner = if let Some(glued) = name.strip_prefix("core::ptr::drop_in_place::<") {
        // Drop glue is in the module of the type it drops.
        first_path(glued)
    } else if let Some(rest) = name.strip_prefix('<') {
        // The self type of `<X as T>::m` or `<X>::m`; the trait's, for the crate's trait
        // implemented for another crate's type.
        let own = first_path(rest);
        match rest.find(" as crate::") {
            Some(at) if !own.starts_with("crate::") && impl_of_own_trait(name) => {
                first_path(&rest[at + " as ".len()..])
            }
            _ => own,
        }
    } else {
        let end = name.find(['<', '{']).unwrap_or(name.len());
        name[..end].trim_end_matches("::").to_owned()
    };
    if !owner.starts_with("crate::") {
        return None;
    }
    let segments: Vec<&str> = owner.split("::").collect();
    // `crate::m::f` is in `crate::m`; `crate::m::Type` (self type) also.
    let keep = segments.len().saturating_sub(1).max(1);
    let mut module = segments[..keep].join("::");
    // A method path `crate::m::Type::method` (inherent, without `<>`): drop the type too when
    // it is capitalised.
    if name.starts_with("crate::") && segments.len() >= 3 && segments[keep - 1].starts_with(char::is_uppercase) {
        module = segments[..keep - 1].join("::");
    }
    Some(module)
}

fn in_module(module: &str, allowed: &str) -> bool {
    module == allowed || module.starts_with(&format!("{allowed}::"))
}

/// Does `mentioned` (a path) fall under `rule` (a path): itself or an item below it?
fn under(mentioned: &str, rule: &str) -> bool {
    mentioned == rule || (mentioned.starts_with(rule) && mentioned[rule.len()..].starts_with("::"))
}

/// The walk's graph: symbols and their successors, with the debug location of each edge.
struct Graph<'m> {
    module: &'m Module,
    names: Names,
    /// Every writable static and the functions that take its address.
    writers: HashMap<&'m str, Vec<&'m str>>,
    vtables: Vec<&'m str>,
    /// The candidates of a call through a vtable slot, by slot and the call's signature: what
    /// that slot of each vtable holds, where it may be a function of that signature (one
    /// without a body here may be any), with the vtable, in `vtables` order.
    slot_targets: HashMap<(u32, &'m Signature), Vec<(&'m str, &'m str)>>,
    /// The vtables of callables taking `A`, by `A`: those with a closure's or function's
    /// `FnOnce<A>::call_once` shim among their entries.
    callables: HashMap<String, HashSet<&'m str>>,
    /// The candidates of a call through a plain function pointer, by the call's signature:
    /// every function whose address is taken somewhere (a function or global) of that
    /// signature.
    pointer_targets: HashMap<&'m Signature, Vec<&'m str>>,
}

impl<'m> Graph<'m> {
    fn new(module: &'m Module, crate_name: &str) -> Self {
        let names = Names::new(crate_name);
        let mut writers: HashMap<&str, Vec<&str>> = HashMap::new();
        let mut taken: BTreeSet<&str> = BTreeSet::new();
        for function in module.functions.values() {
            for u in &function.uses {
                if let UseKind::Address(target) = &u.kind {
                    let function_address = module.functions.contains_key(target) || module.declared.contains(target);
                    // Storage: a writable global, or any static of Rust's (a `static` item,
                    // a thread-local's key, another crate's static) whatever its constness, as
                    // a key or a cell leads to storage any referrer may write.
                    let storage = module.globals.get(target).is_some_and(|g| g.writable)
                        || (target.starts_with("_R") && !function_address);
                    if storage {
                        writers.entry(target.as_str()).or_default().push(function.symbol.as_str());
                    }
                    if function_address {
                        taken.insert(target.as_str());
                    }
                }
            }
        }
        for global in module.globals.values() {
            if global.vtable {
                continue;
            }
            for (_, s) in &global.slots {
                if module.functions.contains_key(s) {
                    taken.insert(s.as_str());
                }
            }
        }
        // In symbol order, so that of two paths equally short the report names the same one
        // on every build.
        for list in writers.values_mut() {
            list.sort_unstable();
            list.dedup();
        }
        let mut vtables: Vec<&str> = module.globals.values().filter(|g| g.vtable).map(|g| g.symbol.as_str()).collect();
        vtables.sort_unstable();
        let mut graph = Graph {
            module,
            names,
            writers,
            vtables,
            slot_targets: HashMap::new(),
            callables: HashMap::new(),
            pointer_targets: HashMap::new(),
        };
        // Every indirect call's candidates, once for each slot and signature the module calls
        // through.
        let admits = |call: &Signature, f: &str| module.functions.get(f).is_none_or(|f| call.admits(&f.signature));
        let mut slot_targets = HashMap::new();
        let mut pointer_targets = HashMap::new();
        for u in module.functions.values().flat_map(|f| &f.uses) {
            match &u.kind {
                UseKind::Virtual { slot, signature, .. } => {
                    slot_targets.entry((*slot, signature)).or_insert_with(|| {
                        let mut targets = Vec::new();
                        for vt in &graph.vtables {
                            if let Some(f) = module.globals[*vt].slot(*slot)
                                && admits(signature, f)
                                && let Some(t) = graph.key(f)
                            {
                                targets.push((*vt, t));
                            }
                        }
                        targets
                    });
                }
                UseKind::Pointer { signature } => {
                    pointer_targets
                        .entry(signature)
                        .or_insert_with(|| taken.iter().copied().filter(|f| admits(signature, f)).collect());
                }
                _ => {}
            }
        }
        let mut callables: HashMap<String, HashSet<&str>> = HashMap::new();
        for vt in &graph.vtables {
            for (_, e) in &module.globals[*vt].slots {
                if let Some(args) = call_once_args(&graph.names.of(e)) {
                    callables.entry(args).or_default().insert(*vt);
                }
            }
        }
        graph.slot_targets = slot_targets;
        graph.pointer_targets = pointer_targets;
        graph.callables = callables;
        graph
    }

    /// The successors of `symbol` with the location of the edge.
    fn successors(&self, symbol: &str) -> Vec<(&'m str, Option<crate::ir::Dbg>)> {
        let mut out = Vec::new();
        if let Some(function) = self.module.functions.get(symbol) {
            // An indirect call in the crate's own code may land in any vtable or function of
            // its shape the crate makes; one inside another crate's code instantiated here
            // (a waker, a formatter, `<Box<dyn Fn()> as Fn<()>>::call`) calls what it was
            // handed, and what code on this walk hands out is reached already through the
            // addresses it takes (see `Graph::successors`' callers and the residue).
            let name = self.names.of(symbol);
            let own = is_own(&name);
            let args = std::cell::OnceCell::new();
            for u in &function.uses {
                match &u.kind {
                    UseKind::Call(target) | UseKind::Address(target) => {
                        if let Some(t) = self.key(target) {
                            out.push((t, u.dbg));
                        }
                    }
                    // A closure called through `dyn Fn(A) -> R` inside other crates' code (a
                    // boxed callable kept anywhere: a static, a thread-local, a receiver): any
                    // closure or function of the crate boxed as a callable taking `A`.
                    UseKind::Virtual { slot, signature, .. } if !own => {
                        let callable =
                            args.get_or_init(|| fn_trait_args(&name)).as_ref().and_then(|a| self.callables.get(a));
                        if let Some(callable) = callable {
                            let targets = self.slot_targets.get(&(*slot, signature)).into_iter().flatten();
                            out.extend(targets.filter(|(vt, _)| callable.contains(vt)).map(|(_, t)| (*t, u.dbg)));
                        }
                    }
                    UseKind::Pointer { .. } if !own => {}
                    // A trait object another crate's function returned right here (the global
                    // logger): it calls what that crate was handed, as above.
                    UseKind::Virtual { source: Some(f), .. }
                        if self.module.declared.contains(f) && !self.module.functions.contains_key(f) => {}
                    UseKind::Virtual { slot, signature, .. } => {
                        let targets = self.slot_targets.get(&(*slot, signature)).into_iter().flatten();
                        out.extend(targets.map(|(_, t)| (*t, u.dbg)));
                    }
                    UseKind::Pointer { signature } => {
                        let targets = self.pointer_targets.get(signature).into_iter().flatten();
                        out.extend(targets.map(|f| (*f, u.dbg)));
                    }
                }
            }
        } else {
            if let Some(global) = self.module.globals.get(symbol) {
                for (_, s) in &global.slots {
                    if let Some(t) = self.key(s) {
                        out.push((t, None));
                    }
                }
            }
            if let Some(writers) = self.writers.get(symbol) {
                out.extend(writers.iter().map(|w| (*w, None)));
            }
        }
        out
    }

    /// The module's own copy of a symbol's name, when the module knows it.
    fn key(&self, symbol: &str) -> Option<&'m str> {
        if let Some((k, _)) = self.module.functions.get_key_value(symbol) {
            return Some(k.as_str());
        }
        if let Some((k, _)) = self.module.globals.get_key_value(symbol) {
            return Some(k.as_str());
        }
        if let Some(d) = self.module.declared.get(symbol) {
            return Some(d.as_str());
        }
        self.writers.get_key_value(symbol).map(|(k, _)| *k)
    }
}

/// Walks every root of `module` under `policy`.
pub fn check(module: &Module, policy: &Policy) -> Outcome {
    let graph = Graph::new(module, &policy.crate_name);
    let roots = find_roots(&graph, policy);
    let mut outcome = Outcome::default();
    for (symbol, kind) in roots {
        let name = graph.names.of(symbol);
        let reached = walk(&graph, policy, symbol, kind, &name, &mut outcome);
        outcome.roots.push(Root { function: name, why: kind, reached });
    }
    outcome.roots.sort_by(|a, b| (a.why, &a.function).cmp(&(b.why, &b.function)));
    outcome.findings.sort_by(|a, b| (&a.root, &a.item).cmp(&(&b.root, &b.item)));
    outcome
}

fn is_boundary(policy: &Policy, name: &str) -> bool {
    // A function of a boundary type (`<crate::context::McpCallContext>::store`, a trait impl
    // for it, a closure or async body inside one), or the drop glue of one of those.
    let name =
        name.strip_prefix("core::ptr::drop_in_place::<").and_then(|inner| inner.strip_suffix('>')).unwrap_or(name);
    let path = item_path(name);
    policy.boundaries.iter().any(|b| under(&path, b))
}

fn find_roots<'m>(graph: &Graph<'m>, policy: &Policy) -> Vec<(&'m str, RootKind)> {
    let module = graph.module;
    let mut roots: BTreeMap<&str, RootKind> = BTreeMap::new();
    // Tool handlers: every function in a vtable one of whose entries takes a handler type.
    for vt in &graph.vtables {
        let global = &module.globals[*vt];
        let handler = global.slots.iter().any(|(_, s)| {
            let name = graph.names.of(s);
            mentions(&name).iter().any(|m| policy.handler_types.iter().any(|h| under(m, h)))
        });
        if handler {
            for (offset, s) in &global.slots {
                if *offset >= 24
                    && let Some(k) = graph.key(s)
                    && module.functions.contains_key(k)
                {
                    roots.insert(k, RootKind::Handler);
                }
            }
        }
    }
    // Registered: what the code that registers tools hands over, by address, from itself and
    // from every local function it calls (not from the registration function's own insides).
    let registers = |name: &str| {
        let own = item_path(name);
        policy.registrations.contains(&own)
    };
    let registering: Vec<&str> = module
        .functions
        .values()
        .filter(|f| f.uses.iter().any(|u| matches!(&u.kind, UseKind::Call(t) if registers(&graph.names.of(t)))))
        .map(|f| f.symbol.as_str())
        .collect();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut queue: VecDeque<&str> = registering.into_iter().collect();
    while let Some(symbol) = queue.pop_front() {
        if !seen.insert(symbol) {
            continue;
        }
        let Some(function) = module.functions.get(symbol) else { continue };
        for u in &function.uses {
            match &u.kind {
                UseKind::Call(t) => {
                    let name = graph.names.of(t);
                    if name.starts_with("crate::") && !registers(&name) && module.functions.contains_key(t) {
                        queue.push_back(t.as_str());
                    }
                }
                UseKind::Address(t) => {
                    let mut stack = vec![t.as_str()];
                    let mut visited = HashSet::new();
                    while let Some(s) = stack.pop() {
                        if !visited.insert(s) {
                            continue;
                        }
                        if let Some(k) = graph.key(s).filter(|k| module.functions.contains_key(*k)) {
                            roots.entry(k).or_insert(RootKind::Registered);
                        } else if let Some(g) = module.globals.get(s).filter(|g| !g.writable) {
                            stack.extend(g.slots.iter().map(|(_, x)| x.as_str()));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    // Boundaries: every function of a boundary type defined here.
    for function in module.functions.values() {
        if is_boundary(policy, &graph.names.of(&function.symbol)) {
            roots.entry(function.symbol.as_str()).or_insert(RootKind::Boundary);
        }
    }
    roots.into_iter().collect()
}

/// Breadth-first from `root`: the shortest path to each forbidden item.
fn walk(
    graph: &Graph<'_>,
    policy: &Policy,
    root: &str,
    kind: RootKind,
    root_name: &str,
    outcome: &mut Outcome,
) -> usize {
    let mut parent: HashMap<&str, (&str, Option<crate::ir::Dbg>)> = HashMap::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut queue = VecDeque::new();
    let Some(start) = graph.key(root) else { return 0 };
    seen.insert(start);
    queue.push_back(start);
    let mut found: BTreeSet<String> = BTreeSet::new();
    let mut reached = 0;
    let mut cache = HashMap::new();
    while let Some(symbol) = queue.pop_front() {
        reached += 1;
        let name = graph.names.of(symbol);
        if symbol != start && is_boundary(policy, &name) && kind != RootKind::Boundary {
            continue;
        }
        let own = is_own(&name);
        let successors = graph.successors(symbol);
        // What the crate's own code does: the forbidden items its functions name, and those
        // named by what they call or take the address of. (Other crates' code reached on the
        // way is walked for the crate's code it calls back, not judged itself.)
        if own {
            let here = std::iter::once((symbol, None)).chain(successors.iter().map(|(s, at)| (*s, *at)));
            for (target, at) in here {
                let target_name = graph.names.of(target);
                let Some((item, rule)) = forbidden_in(policy, &target_name, &mut cache) else { continue };
                let allowed = kind == RootKind::Boundary
                    && module_of(&name).is_some_and(|m| rule.allowed_in.iter().any(|a| in_module(&m, a)));
                if allowed || !found.insert(item.clone()) {
                    continue;
                }
                let mut path = path_to(graph, &parent, symbol);
                if target != symbol {
                    if let Some(last) = path.last_mut() {
                        last.at = Location::of(graph, at);
                    }
                    path.push(Step { function: target_name, at: None });
                }
                outcome.findings.push(Finding {
                    root: root_name.to_owned(),
                    path,
                    item,
                    guard_row: rule.guard_row.clone(),
                    reason: rule.reason.clone(),
                });
            }
        }
        if graph.module.declared.contains(symbol) && !graph.module.functions.contains_key(symbol) {
            if kind != RootKind::Boundary {
                outcome.opaque.insert(name);
            }
            continue;
        }
        for (next, at) in successors {
            if seen.insert(next) {
                parent.insert(next, (symbol, at));
                queue.push_back(next);
            }
        }
    }
    reached
}

/// The forbidden item `name` mentions, if any: its path and rule.
fn forbidden_in<'p>(
    policy: &'p Policy,
    name: &str,
    cache: &mut HashMap<String, Option<(String, usize)>>,
) -> Option<(String, &'p Forbidden)> {
    let hit = cache.entry(name.to_owned()).or_insert_with(|| first_forbidden(policy, name)).clone();
    hit.map(|(item, rule)| (item, &policy.forbidden[rule]))
}

fn first_forbidden(policy: &Policy, name: &str) -> Option<(String, usize)> {
    let mentioned = mentions(name);
    let path = item_path(name);
    for (index, rule) in policy.forbidden.iter().enumerate() {
        if let Some(call) = rule.calls.iter().find(|c| under(&path, c)) {
            return Some((call.clone(), index));
        }
        for m in &mentioned {
            if rule.types.iter().any(|p| under(m, p)) {
                return Some((m.clone(), index));
            }
            // A forbidden function handed on as a value (`.map(std::thread::spawn)`): whoever
            // it is handed to calls it.
            if let Some(call) = rule.calls.iter().find(|c| *m == **c) {
                return Some((call.clone(), index));
            }
        }
    }
    None
}

fn path_to(graph: &Graph<'_>, parent: &HashMap<&str, (&str, Option<crate::ir::Dbg>)>, symbol: &str) -> Vec<Step> {
    let mut steps = vec![Step { function: graph.names.of(symbol), at: None }];
    let mut current = symbol;
    while let Some((up, at)) = parent.get(current) {
        steps.push(Step { function: graph.names.of(up), at: Location::of(graph, *at) });
        current = up;
    }
    steps.reverse();
    steps
}

/// The build's failure message: every finding with its whole path, or `None`.
pub fn failure(outcome: &Outcome) -> Option<String> {
    if outcome.findings.is_empty() {
        return None;
    }
    let mut msg = format!(
        "scopegate guard: {} path(s) from a tool to a forbidden item in the compiled crate:\n",
        outcome.findings.len()
    );
    for f in &outcome.findings {
        msg.push_str(&format!("\n[{}] {} reaches {} ({})\n", f.guard_row, f.root, f.item, f.reason));
        for step in &f.path {
            match &step.at {
                Some(Location { file, line }) => {
                    msg.push_str(&format!("   -> {}  (at {file}:{line})\n", step.function))
                }
                None => msg.push_str(&format!("   -> {}\n", step.function)),
            }
        }
    }
    Some(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_every_path_without_generics() {
        let name = "<alloc::vec::Vec<crate::db::PgPool> as core::ops::drop::Drop>::drop";
        assert_eq!(mentions(name), vec!["alloc::vec::Vec", "core::ops::drop::Drop", "crate::db::PgPool"]);
        assert_eq!(
            mentions("core::ptr::drop_in_place::<sqlx_core::pool::Pool<sqlx_postgres::database::Postgres>>"),
            vec!["core::ptr::drop_in_place", "sqlx_core::pool::Pool", "sqlx_postgres::database::Postgres"]
        );
        assert_eq!(mentions("crate::tool_entry::{closure#0}"), vec!["crate::tool_entry"]);
        assert_eq!(mentions("<dyn crate::Tool as crate::Tool>::run"), vec!["crate::Tool"]);
    }

    #[test]
    fn the_guarded_crate_is_spelled_crate() {
        assert_eq!(with_crate("<lib::A as lib::Tool>::run", "lib"), "<crate::A as crate::Tool>::run");
        assert_eq!(with_crate("mylib::x::lib::y", "lib"), "mylib::x::lib::y");
    }

    #[test]
    fn callable_argument_tuples() {
        assert_eq!(
            fn_trait_args("<alloc::boxed::Box<dyn core::ops::function::Fn<(u32,), Output = u32> + core::marker::Send> as core::ops::function::Fn<(u32,)>>::call").as_deref(),
            Some("(u32,)")
        );
        assert_eq!(
            call_once_args(
                "<crate::start_up::{closure#0} as core::ops::function::FnOnce<(u32,)>>::call_once::{shim:vtable#0}"
            )
            .as_deref(),
            Some("(u32,)")
        );
        assert_eq!(strip_lifetimes("(&'a str, &'_ u8)"), "(&str, &u8)");
        assert_eq!(fn_trait_args("<core::task::wake::Waker>::wake"), None);
    }

    #[test]
    fn the_crates_own_code_includes_its_trait_impls_and_drop_glue() {
        for own in [
            "crate::f",
            "<crate::A>::m",
            "<u16 as crate::Go>::go",
            "<&crate::Shown as core::fmt::Display>::fmt",
            "<alloc::vec::Vec<u8> as crate::Go>::go",
            "core::ptr::drop_in_place::<crate::Repo>",
        ] {
            assert!(is_own(own), "{own}");
        }
        for other in [
            "<u16 as core::fmt::Display>::fmt",
            "<alloc::vec::Vec<crate::A> as core::ops::drop::Drop>::drop",
            "core::ptr::drop_in_place::<alloc::vec::Vec<crate::A>>",
            "core::option::Option<crate::A>::map::<u8, crate::f>",
        ] {
            assert!(!is_own(other), "{other}");
        }
    }

    #[test]
    fn higher_ranked_callables_have_their_argument_tuples() {
        let name = "<alloc::boxed::Box<dyn for<'a> core::ops::function::Fn<(&'a str,), Output = u32>> as \
                    core::ops::function::Fn<(&str,)>>::call";
        assert_eq!(fn_trait_args(name).as_deref(), Some("(&str,)"));
        assert_eq!(remove_binders("dyn for<'a, 'b> Fn<(&'a u8, &'b u8)>"), "dyn Fn<(&'a u8, &'b u8)>");
        assert_eq!(remove_binders("crate::wait_for<u8> x"), "crate::wait_for<u8> x");
    }

    #[test]
    fn item_paths() {
        assert_eq!(item_path("<tokio::runtime::handle::Handle>::spawn::<F>"), "tokio::runtime::handle::Handle::spawn");
        assert_eq!(item_path("<crate::A as crate::Tool>::run::{closure#0}"), "crate::A::run");
        assert_eq!(item_path("tokio::task::spawn::spawn::<crate::f::{closure#0}>"), "tokio::task::spawn::spawn");
        assert_eq!(
            item_path("<&mut alloc::vec::Vec<u8> as core::fmt::Write>::write_str"),
            "alloc::vec::Vec::write_str"
        );
    }

    #[test]
    fn modules_of_local_functions() {
        assert_eq!(module_of("crate::store::open::{closure#0}").as_deref(), Some("crate::store"));
        assert_eq!(module_of("<crate::store::Db>::begin").as_deref(), Some("crate::store"));
        assert_eq!(module_of("<crate::store::Db as core::clone::Clone>::clone").as_deref(), Some("crate::store"));
        assert_eq!(module_of("core::ptr::drop_in_place::<crate::gateway::Ctx>").as_deref(), Some("crate::gateway"));
        assert_eq!(module_of("<u16 as crate::inner::Go>::go").as_deref(), Some("crate::inner"));
        assert_eq!(module_of("<&crate::store::Db as core::fmt::Debug>::fmt").as_deref(), Some("crate::store"));
        assert_eq!(module_of("core::ptr::drop_in_place::<alloc::string::String>"), None);
    }
}
