//! The parsed crate: module tree, definitions, impls, `use` tables and name resolution.
//! It never judges anything; it only answers "what does this path name here".

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;

use crate::GuardError;

pub(crate) type ModId = usize;
pub(crate) type DefId = usize;

/// How deep `use` chains and globs are followed before giving up (cycles, pathological code).
const MAX_DEPTH: usize = 24;

pub(crate) struct Crate {
    pub modules: Vec<Module>,
    pub defs: Vec<Def>,
    pub impls: Vec<ImplInfo>,
    pub fns: Vec<FnInfo>,
    pub statics: Vec<StaticInfo>,
    /// Every source file read, relative to the crate root.
    pub files: Vec<String>,
    /// Names that are provably other crates: the manifest's dependencies and the sysroot crates.
    pub externs: HashSet<String>,
    /// `macro_rules!` definitions of the crate, by name: where each is written.
    pub macro_defs: HashMap<String, (String, usize)>,
    /// A definition shadowed in its module's namespace by a later one of the same name (the
    /// other arm of a `#[cfg(..)]` pair): the later def's id -> the earlier ones. Both are walked.
    pub def_twins: HashMap<DefId, Vec<DefId>>,
    /// The same for free fns.
    pub fn_twins: HashMap<usize, Vec<usize>>,
}

/// A macro invoked where items are written (`make!(Name);`): it may define names the walk
/// never sees.
#[derive(Clone, Debug)]
pub(crate) struct ItemMacro {
    /// The macro's path as written (`make`, `tokio::task_local`).
    pub path: String,
    pub file: String,
    pub line: usize,
}

pub(crate) struct Module {
    pub path: Vec<String>,
    pub parent: Option<ModId>,
    pub file: String,
    pub children: HashMap<String, ModId>,
    pub types: HashMap<String, DefId>,
    pub values: HashMap<String, Value>,
    pub uses: HashMap<String, Vec<String>>,
    pub globs: Vec<Vec<String>>,
    /// Macros invoked at item level in this module.
    pub item_macros: Vec<ItemMacro>,
}

#[derive(Clone, Copy)]
pub(crate) enum Value {
    Fn(usize),
    Static(usize),
}

pub(crate) struct Def {
    pub name: String,
    pub module: ModId,
    pub file: String,
    pub line: usize,
    pub kind: DefKind,
}

pub(crate) enum DefKind {
    Struct(syn::ItemStruct),
    Enum(syn::ItemEnum),
    Union(syn::ItemUnion),
    Trait(syn::ItemTrait),
    Alias(syn::ItemType),
}

impl Def {
    pub fn generics(&self) -> &syn::Generics {
        match &self.kind {
            DefKind::Struct(s) => &s.generics,
            DefKind::Enum(e) => &e.generics,
            DefKind::Union(u) => &u.generics,
            DefKind::Trait(t) => &t.generics,
            DefKind::Alias(a) => &a.generics,
        }
    }
    pub fn attrs(&self) -> &[syn::Attribute] {
        match &self.kind {
            DefKind::Struct(s) => &s.attrs,
            DefKind::Enum(e) => &e.attrs,
            DefKind::Union(u) => &u.attrs,
            DefKind::Trait(t) => &t.attrs,
            DefKind::Alias(a) => &a.attrs,
        }
    }
}

pub(crate) struct ImplInfo {
    pub module: ModId,
    pub file: String,
    pub item: syn::ItemImpl,
    /// The crate type the impl is for, when it is one.
    pub self_def: Option<DefId>,
    /// The crate trait it implements, when it is one.
    pub trait_def: Option<DefId>,
}

pub(crate) struct FnInfo {
    pub module: ModId,
    pub file: String,
    pub item: syn::ItemFn,
}

pub(crate) struct StaticInfo {
    pub name: String,
    pub module: ModId,
    pub file: String,
    pub line: usize,
    pub ty: syn::Type,
}

/// What a path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Res {
    Def(DefId),
    /// An item under a crate type: `Type::new`, `Enum::Variant`, `Self::helper`.
    Assoc(DefId, String),
    Module(ModId),
    Fn(usize),
    Static(usize),
    /// Provably another crate's: anchored at a dependency or sysroot crate, a prelude name or a
    /// primitive, or brought in by another crate's glob in a module no macro writes items into.
    External(Vec<String>),
    /// Looked up in the crate's own namespace (module `.0`) and answered by no definition:
    /// written by a macro, or otherwise unknown. Never safe.
    Unresolved(ModId, Vec<String>),
}

/// The sysroot crates, always in the extern prelude.
const SYSROOT: [&str; 4] = ["std", "core", "alloc", "proc_macro"];

/// Names the standard prelude (2024 edition) and the language bring into every module.
const PRELUDE: [&str; 61] = [
    "bool",
    "char",
    "str",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "f32",
    "f64",
    "Copy",
    "Send",
    "Sized",
    "Sync",
    "Unpin",
    "Drop",
    "Fn",
    "FnMut",
    "FnOnce",
    "AsyncFn",
    "AsyncFnMut",
    "AsyncFnOnce",
    "drop",
    "Box",
    "ToOwned",
    "Clone",
    "PartialEq",
    "PartialOrd",
    "Eq",
    "Ord",
    "AsRef",
    "AsMut",
    "Into",
    "From",
    "Default",
    "Iterator",
    "Extend",
    "IntoIterator",
    "DoubleEndedIterator",
    "ExactSizeIterator",
    "Option",
    "Some",
    "None",
    "Result",
    "Ok",
    "Err",
    "String",
    "ToString",
    "Vec",
    "TryFrom",
    "TryInto",
    "FromIterator",
    "Future",
    "IntoFuture",
];

/// Whether a first path segment names another crate or the prelude for sure.
fn is_extern_root(externs: &HashSet<String>, first: &str) -> bool {
    SYSROOT.contains(&first) || PRELUDE.contains(&first) || externs.contains(first)
}

pub(crate) fn line_of<T: Spanned>(node: &T) -> usize {
    node.span().start().line
}

pub(crate) fn has_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().map(|m| m.path().is_ident("test")).unwrap_or(false)
    })
}

impl Crate {
    /// Reads `entry` (relative to `root`) and every file module it declares; `externs` are the
    /// crate's dependencies as code names them (`-` written `_`).
    pub fn load(root: &Path, entry: &Path, externs: HashSet<String>) -> Result<Crate, GuardError> {
        let mut krate = Crate {
            modules: Vec::new(),
            defs: Vec::new(),
            impls: Vec::new(),
            fns: Vec::new(),
            statics: Vec::new(),
            files: Vec::new(),
            externs,
            macro_defs: HashMap::new(),
            def_twins: HashMap::new(),
            fn_twins: HashMap::new(),
        };
        let entry_abs = root.join(entry);
        let child_dir = entry_abs.parent().map(Path::to_path_buf).unwrap_or_default();
        let root_mod = krate.new_module(vec!["crate".into()], None, String::new());
        krate.load_file(root, &entry_abs, root_mod, &child_dir)?;
        for i in 0..krate.impls.len() {
            let self_def = match &*krate.impls[i].item.self_ty {
                syn::Type::Path(tp) if tp.qself.is_none() => {
                    match krate.resolve_path(krate.impls[i].module, &tp.path) {
                        Res::Def(d) => Some(d),
                        _ => None,
                    }
                }
                _ => None,
            };
            krate.impls[i].self_def = self_def;
            let trait_def = match &krate.impls[i].item.trait_ {
                Some((_, path, _)) => match krate.resolve_path(krate.impls[i].module, path) {
                    Res::Def(d) if matches!(krate.defs[d].kind, DefKind::Trait(_)) => Some(d),
                    _ => None,
                },
                None => None,
            };
            krate.impls[i].trait_def = trait_def;
        }
        Ok(krate)
    }

    fn new_module(&mut self, path: Vec<String>, parent: Option<ModId>, file: String) -> ModId {
        self.modules.push(Module {
            path,
            parent,
            file,
            children: HashMap::new(),
            types: HashMap::new(),
            values: HashMap::new(),
            uses: HashMap::new(),
            globs: Vec::new(),
            item_macros: Vec::new(),
        });
        self.modules.len() - 1
    }

    fn load_file(&mut self, root: &Path, file: &Path, module: ModId, child_dir: &Path) -> Result<(), GuardError> {
        let rel = relative(root, file);
        let text =
            std::fs::read_to_string(file).map_err(|e| GuardError::Io { path: rel.clone(), message: e.to_string() })?;
        let parsed = syn::parse_file(&text).map_err(|e| GuardError::Parse {
            path: rel.clone(),
            line: e.span().start().line,
            message: e.to_string(),
        })?;
        self.files.push(rel.clone());
        self.modules[module].file = rel.clone();
        self.collect(root, module, parsed.items, &rel, file, child_dir)
    }

    fn collect(
        &mut self,
        root: &Path,
        module: ModId,
        items: Vec<syn::Item>,
        rel: &str,
        file_abs: &Path,
        child_dir: &Path,
    ) -> Result<(), GuardError> {
        for item in items {
            let attrs_skip = match &item {
                syn::Item::Mod(m) => has_cfg_test(&m.attrs),
                syn::Item::Fn(f) => has_cfg_test(&f.attrs),
                syn::Item::Impl(i) => has_cfg_test(&i.attrs),
                _ => false,
            };
            if attrs_skip {
                continue;
            }
            match item {
                syn::Item::Struct(s) => {
                    let name = s.ident.to_string();
                    let line = line_of(&s.ident);
                    self.add_def(module, name, rel, line, DefKind::Struct(s));
                }
                syn::Item::Enum(e) => {
                    let name = e.ident.to_string();
                    let line = line_of(&e.ident);
                    self.add_def(module, name, rel, line, DefKind::Enum(e));
                }
                syn::Item::Union(u) => {
                    let name = u.ident.to_string();
                    let line = line_of(&u.ident);
                    self.add_def(module, name, rel, line, DefKind::Union(u));
                }
                syn::Item::Trait(t) => {
                    let name = t.ident.to_string();
                    let line = line_of(&t.ident);
                    self.add_def(module, name, rel, line, DefKind::Trait(t));
                }
                syn::Item::Type(a) => {
                    let name = a.ident.to_string();
                    let line = line_of(&a.ident);
                    self.add_def(module, name, rel, line, DefKind::Alias(a));
                }
                syn::Item::Fn(f) => {
                    let name = f.sig.ident.to_string();
                    self.fns.push(FnInfo { module, file: rel.to_string(), item: f });
                    let id = self.fns.len() - 1;
                    if let Some(Value::Fn(earlier)) = self.modules[module].values.insert(name, Value::Fn(id)) {
                        let mut twins = self.fn_twins.remove(&earlier).unwrap_or_default();
                        twins.push(earlier);
                        self.fn_twins.insert(id, twins);
                    }
                }
                syn::Item::Macro(m) => {
                    let line = line_of(&m.mac.path);
                    match &m.ident {
                        // `macro_rules! name { .. }`
                        Some(name) if m.mac.path.is_ident("macro_rules") => {
                            self.macro_defs.insert(name.to_string(), (rel.to_string(), line));
                        }
                        _ => {
                            let path = m.mac.path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>();
                            self.modules[module].item_macros.push(ItemMacro {
                                path: path.join("::"),
                                file: rel.to_string(),
                                line,
                            });
                        }
                    }
                }
                syn::Item::Static(s) => {
                    self.add_static(module, &s.ident, *s.ty, rel);
                }
                syn::Item::Const(c) => {
                    self.add_static(module, &c.ident, *c.ty, rel);
                }
                syn::Item::Impl(i) => self.impls.push(ImplInfo {
                    module,
                    file: rel.to_string(),
                    item: i,
                    self_def: None,
                    trait_def: None,
                }),
                syn::Item::Use(u) => {
                    let mut prefix = Vec::new();
                    if u.leading_colon.is_some() {
                        prefix.push("::".to_string());
                    }
                    let m = &mut self.modules[module];
                    flatten_use(&u.tree, &mut prefix, &mut m.uses, &mut m.globs);
                }
                syn::Item::ExternCrate(e) => {
                    if let Some((_, alias)) = &e.rename {
                        self.modules[module].uses.insert(alias.to_string(), vec![e.ident.to_string()]);
                    }
                }
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut path = self.modules[module].path.clone();
                    path.push(name.clone());
                    let path_attr = m.attrs.iter().find_map(|a| match &a.meta {
                        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
                            _ => None,
                        },
                        _ => None,
                    });
                    let sub = self.new_module(path, Some(module), rel.to_string());
                    self.modules[module].children.insert(name.clone(), sub);
                    match m.content {
                        Some((_, items)) => {
                            let dir = child_dir.join(&name);
                            self.collect(root, sub, items, rel, file_abs, &dir)?;
                        }
                        None => {
                            let (file, dir) = match path_attr {
                                Some(p) => {
                                    let base = file_abs.parent().unwrap_or(Path::new(""));
                                    let f = base.join(p);
                                    let d = f.parent().map(Path::to_path_buf).unwrap_or_default();
                                    (f, d)
                                }
                                None => {
                                    let flat = child_dir.join(format!("{name}.rs"));
                                    if flat.is_file() {
                                        (flat, child_dir.join(&name))
                                    } else {
                                        let nested = child_dir.join(&name).join("mod.rs");
                                        (nested, child_dir.join(&name))
                                    }
                                }
                            };
                            if !file.is_file() {
                                return Err(GuardError::Io {
                                    path: relative(root, &file),
                                    message: format!(
                                        "module `{name}` declared in {rel}:{} has no file",
                                        line_of(&m.ident)
                                    ),
                                });
                            }
                            self.load_file(root, &file, sub, &dir)?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn add_def(&mut self, module: ModId, name: String, file: &str, line: usize, kind: DefKind) {
        self.defs.push(Def { name: name.clone(), module, file: file.to_string(), line, kind });
        let id = self.defs.len() - 1;
        if let Some(earlier) = self.modules[module].types.insert(name, id) {
            let mut twins = self.def_twins.remove(&earlier).unwrap_or_default();
            twins.push(earlier);
            self.def_twins.insert(id, twins);
        }
    }

    fn add_static(&mut self, module: ModId, ident: &syn::Ident, ty: syn::Type, file: &str) {
        self.statics.push(StaticInfo {
            name: ident.to_string(),
            module,
            file: file.to_string(),
            line: line_of(ident),
            ty,
        });
        let id = self.statics.len() - 1;
        self.modules[module].values.insert(ident.to_string(), Value::Static(id));
    }

    /// `crate::a::b::Name` for a crate type.
    pub fn def_path(&self, d: DefId) -> String {
        let def = &self.defs[d];
        let mut p = self.modules[def.module].path.clone();
        p.push(def.name.clone());
        p.join("::")
    }

    pub fn module_path(&self, m: ModId) -> String {
        self.modules[m].path.join("::")
    }

    /// Resolves a written path in module `m` (no generics or `Self` handling: see the walker).
    pub fn resolve_path(&self, m: ModId, path: &syn::Path) -> Res {
        let mut segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if path.leading_colon.is_some() {
            segs.insert(0, "::".into());
        }
        self.resolve(m, &segs, 0)
    }

    /// Resolves path segments in module `m`.
    pub fn resolve(&self, m: ModId, segs: &[String], depth: usize) -> Res {
        self.resolve_with(m, segs, depth, &HashMap::new())
    }

    /// Like [`Crate::resolve`], with extra `use` items in scope (those of a fn body).
    pub fn resolve_with(
        &self,
        m: ModId,
        segs: &[String],
        depth: usize,
        local_uses: &HashMap<String, Vec<String>>,
    ) -> Res {
        if segs.is_empty() {
            return Res::Module(m);
        }
        if depth > MAX_DEPTH {
            return self.unresolved(m, &segs[0]);
        }
        let first = segs[0].as_str();
        let (mut cur, rest) = match first {
            "::" => {
                return match segs.get(1) {
                    Some(c) if is_extern_root(&self.externs, c) => Res::External(segs[1..].to_vec()),
                    // `::name` where `name` is no crate this one depends on.
                    _ => self.unresolved(0, segs.get(1).map(String::as_str).unwrap_or("::")),
                };
            }
            "crate" | "$crate" => (Res::Module(0), &segs[1..]),
            "self" => (Res::Module(m), &segs[1..]),
            "super" => (Res::Module(self.modules[m].parent.unwrap_or(0)), &segs[1..]),
            _ => {
                let found = match local_uses.get(first) {
                    Some(target) if target.as_slice() != [first.to_string()] => self.resolve(m, target, depth + 1),
                    // A body's `use tokio;`.
                    Some(_) if is_extern_root(&self.externs, first) => Res::External(vec![first.to_string()]),
                    Some(_) => self.unresolved(m, first),
                    None => match self.lookup(m, first, depth) {
                        Some(r) => r,
                        None if is_extern_root(&self.externs, first) => return Res::External(segs.to_vec()),
                        None => self.fallback(m, first, depth),
                    },
                };
                (found, &segs[1..])
            }
        };
        for seg in rest {
            cur = match cur {
                Res::Module(mm) if seg == "super" => Res::Module(self.modules[mm].parent.unwrap_or(0)),
                Res::Module(mm) if seg == "self" => Res::Module(mm),
                Res::Module(mm) => match self.lookup(mm, seg, depth) {
                    Some(r) => r,
                    None => self.fallback(mm, seg, depth),
                },
                Res::Def(d) => Res::Assoc(d, seg.clone()),
                Res::Assoc(d, _) => Res::Assoc(d, seg.clone()),
                Res::External(mut p) => {
                    p.push(seg.clone());
                    Res::External(p)
                }
                // Whatever follows an unresolved item is under it.
                Res::Unresolved(..) => return cur,
                Res::Fn(_) | Res::Static(_) => return self.unresolved(m, &segs[0]),
            };
        }
        cur
    }

    /// `name`, looked up in module `m` and found nowhere in the crate.
    fn unresolved(&self, m: ModId, name: &str) -> Res {
        let mut p = self.modules[m].path.clone();
        p.push(name.to_string());
        Res::Unresolved(m, p)
    }

    /// A name module `m` does not define, import or glob from the crate: another crate's glob
    /// brought it when there is exactly such a source and no macro writes items into `m` (or
    /// into a module `m` globs from); otherwise it is unresolved.
    fn fallback(&self, m: ModId, name: &str, depth: usize) -> Res {
        if !self.macros_in_scope(m, depth).is_empty() {
            return self.unresolved(m, name);
        }
        let mut external = Vec::new();
        for g in &self.modules[m].globs {
            if let Res::External(p) = self.resolve(m, g, depth + 1) {
                external.push(p);
            }
        }
        match external.len() {
            0 => self.unresolved(m, name),
            1 => {
                let mut p = external.pop().unwrap_or_default();
                p.push(name.to_string());
                Res::External(p)
            }
            // One of several other crates' globs: another crate's, but not which.
            _ => Res::External(vec![name.to_string()]),
        }
    }

    /// Item-level macros of module `m` and of every crate module it globs from: what may have
    /// written a name `m` does not define.
    pub fn macros_in_scope(&self, m: ModId, depth: usize) -> Vec<ItemMacro> {
        let mut seen = vec![m];
        let mut todo = vec![m];
        let mut out = Vec::new();
        while let Some(cur) = todo.pop() {
            out.extend(self.modules[cur].item_macros.iter().cloned());
            for g in &self.modules[cur].globs {
                if let Res::Module(gm) = self.resolve(cur, g, depth + 1)
                    && !seen.contains(&gm)
                    && seen.len() < 64
                {
                    seen.push(gm);
                    todo.push(gm);
                }
            }
        }
        out
    }

    /// Looks a single name up in a module's namespace: types, modules, `use`s, values, and the
    /// crate's own globs. `None`: nothing in the crate answers it (see [`Crate::fallback`]).
    fn lookup(&self, m: ModId, name: &str, depth: usize) -> Option<Res> {
        self.lookup_seen(m, name, depth, &mut Vec::new())
    }

    fn lookup_seen(&self, m: ModId, name: &str, depth: usize, seen: &mut Vec<ModId>) -> Option<Res> {
        seen.push(m);
        let module = &self.modules[m];
        if let Some(&d) = module.types.get(name) {
            return Some(Res::Def(d));
        }
        if let Some(&c) = module.children.get(name) {
            return Some(Res::Module(c));
        }
        if let Some(target) = module.uses.get(name) {
            // `use tokio;` names the extern crate, not itself.
            if target.len() == 1 && target[0] == name {
                return Some(if is_extern_root(&self.externs, name) {
                    Res::External(target.clone())
                } else {
                    self.unresolved(m, name)
                });
            }
            return Some(self.resolve(m, target, depth + 1));
        }
        if let Some(v) = module.values.get(name) {
            return Some(match *v {
                Value::Fn(f) => Res::Fn(f),
                Value::Static(s) => Res::Static(s),
            });
        }
        for g in &module.globs {
            if depth > MAX_DEPTH {
                break;
            }
            match self.resolve(m, g, depth + 1) {
                Res::Module(gm) if !seen.contains(&gm) => {
                    if let Some(r) = self.lookup_seen(gm, name, depth + 1, seen) {
                        return Some(r);
                    }
                }
                // `use Enum::*`: its variants.
                Res::Def(d) => {
                    if let DefKind::Enum(e) = &self.defs[d].kind
                        && e.variants.iter().any(|v| v.ident == name)
                    {
                        return Some(Res::Assoc(d, name.to_string()));
                    }
                }
                _ => {}
            }
        }
        None
    }
}

fn relative(root: &Path, file: &Path) -> String {
    let rel: PathBuf = file.strip_prefix(root).map(Path::to_path_buf).unwrap_or_else(|_| file.to_path_buf());
    rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}

/// Flattens a `use` tree into local name -> written path, and glob prefixes.
pub(crate) fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    uses: &mut HashMap<String, Vec<String>>,
    globs: &mut Vec<Vec<String>>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, uses, globs);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                if let Some(last) = prefix.last().cloned() {
                    uses.insert(last, prefix.clone());
                }
            } else {
                let mut full = prefix.clone();
                full.push(name.clone());
                uses.insert(name, full);
            }
        }
        syn::UseTree::Rename(r) => {
            let alias = r.rename.to_string();
            if alias == "_" {
                return;
            }
            let mut full = prefix.clone();
            if r.ident != "self" {
                full.push(r.ident.to_string());
            }
            uses.insert(alias, full);
        }
        syn::UseTree::Glob(_) => globs.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, uses, globs);
            }
        }
    }
}
