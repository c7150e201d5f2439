//! The parsed crate behind the layering tests' import analysis ([`crate::imports()`],
//! [`crate::file_imports()`]): the module tree, the names each module defines and imports, and
//! name resolution. It never judges anything; it only answers "what does this path name here"
//! and in which file that is written.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;

use crate::GuardError;

pub(crate) type ModId = usize;
/// `use` bindings: local name -> every path bound to it.
type Uses = HashMap<String, Vec<Vec<String>>>;
pub(crate) type DefId = usize;

/// How deep `use` chains and globs are followed before giving up (cycles, pathological code).
const MAX_DEPTH: usize = 24;

#[derive(Default)]
pub(crate) struct Crate {
    pub modules: Vec<Module>,
    /// The crate's types: structs, enums, unions, traits and type aliases.
    pub defs: Vec<Def>,
    /// Free fns.
    pub fns: Vec<FnInfo>,
    /// Statics and consts.
    pub statics: Vec<StaticInfo>,
    /// Every source file read, relative to the crate root.
    pub files: Vec<String>,
}

pub(crate) struct Module {
    pub path: Vec<String>,
    pub parent: Option<ModId>,
    pub file: String,
    pub children: HashMap<String, ModId>,
    pub types: HashMap<String, DefId>,
    pub values: HashMap<String, Value>,
    /// Local name -> every path a `use` binds it to (more than one when `#[cfg(..)]` arms
    /// import the same name; anonymous imports, `use Trait as _`, are kept under `_`).
    pub uses: Uses,
    pub globs: Vec<Vec<String>>,
    /// A macro is invoked at item level in this module (`make!(Name);`, an `include!` of a
    /// path computed at build time): it may define names the model never sees.
    pub item_macros: bool,
}

#[derive(Clone, Copy)]
pub(crate) enum Value {
    Fn(usize),
    Static(usize),
}

/// A crate type (struct, enum, union, trait or type alias).
pub(crate) struct Def {
    /// The file it is written in, relative to the crate root.
    pub file: String,
    /// Its variants' names when it is an enum (`use Enum::*` brings them in); empty otherwise.
    pub variants: Vec<String>,
}

/// A free fn.
pub(crate) struct FnInfo {
    /// The file it is written in, relative to the crate root.
    pub file: String,
}

/// A `static` or `const`.
pub(crate) struct StaticInfo {
    /// The file it is written in, relative to the crate root.
    pub file: String,
}

/// What a path names. The names and paths the variants carry tell apart the answers of a path
/// that `#[cfg(..)]` arms resolve more than one way (see [`Crate::resolve_all`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Res {
    Def(DefId),
    /// An item under a crate type: `Type::new`, `Enum::Variant`, `Self::helper`.
    Assoc(DefId, String),
    Module(ModId),
    Fn(usize),
    Static(usize),
    /// Provably another crate's: anchored at a sysroot crate, a prelude name or a primitive, or
    /// brought in by another crate's glob in a module no macro writes items into.
    External(Vec<String>),
    /// Looked up in the crate's own namespace (module `.0`) and answered by no definition:
    /// written by a macro, another crate's, or otherwise unknown.
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

/// Whether a first path segment names a sysroot crate or the prelude for sure.
fn is_extern_root(first: &str) -> bool {
    SYSROOT.contains(&first) || PRELUDE.contains(&first)
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
    /// Reads `entry` (relative to `root`) and every file module it declares.
    pub fn load(root: &Path, entry: &Path) -> Result<Crate, GuardError> {
        let mut krate = Crate::default();
        let entry_abs = root.join(entry);
        let child_dir = entry_abs.parent().map(Path::to_path_buf).unwrap_or_default();
        let root_mod = krate.new_module(vec!["crate".into()], None, String::new());
        krate.load_file(root, &entry_abs, root_mod, &child_dir)?;
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
            item_macros: false,
        });
        self.modules.len() - 1
    }

    /// Reads and parses one source file, noting it among the files read. `from`: the file and
    /// line that named it (for the error when it is missing).
    fn read(
        &mut self,
        root: &Path,
        file: &Path,
        from: Option<(&str, usize)>,
    ) -> Result<(String, syn::File), GuardError> {
        let rel = relative(root, file);
        let text = std::fs::read_to_string(file).map_err(|e| GuardError::Io {
            path: rel.clone(),
            message: match from {
                Some((f, l)) => format!("{e} (named at {f}:{l})"),
                None => e.to_string(),
            },
        })?;
        let parsed = syn::parse_file(&text).map_err(|e| GuardError::Parse {
            path: rel.clone(),
            line: e.span().start().line,
            message: e.to_string(),
        })?;
        if !self.files.contains(&rel) {
            self.files.push(rel.clone());
        }
        Ok((rel, parsed))
    }

    fn load_file(&mut self, root: &Path, file: &Path, module: ModId, child_dir: &Path) -> Result<(), GuardError> {
        let (rel, parsed) = self.read(root, file, None)?;
        self.modules[module].file = rel.clone();
        self.collect(root, module, parsed.items, &rel, file, child_dir, false)
    }

    /// Reads a module's items. `child_dir`: where its file modules live; `inline`: the items
    /// are inside an inline `mod x { .. }` (a `#[path]` there is taken from `child_dir`).
    #[allow(clippy::too_many_arguments)]
    fn collect(
        &mut self,
        root: &Path,
        module: ModId,
        items: Vec<syn::Item>,
        rel: &str,
        file_abs: &Path,
        child_dir: &Path,
        inline: bool,
    ) -> Result<(), GuardError> {
        for item in items {
            let attrs_skip = match &item {
                syn::Item::Mod(m) => has_cfg_test(&m.attrs),
                syn::Item::Fn(f) => has_cfg_test(&f.attrs),
                _ => false,
            };
            if attrs_skip {
                continue;
            }
            match item {
                syn::Item::Struct(syn::ItemStruct { ident, .. })
                | syn::Item::Union(syn::ItemUnion { ident, .. })
                | syn::Item::Trait(syn::ItemTrait { ident, .. })
                | syn::Item::Type(syn::ItemType { ident, .. }) => self.add_def(module, &ident, rel, Vec::new()),
                syn::Item::Enum(e) => {
                    let variants = e.variants.iter().map(|v| v.ident.to_string()).collect();
                    self.add_def(module, &e.ident, rel, variants);
                }
                syn::Item::Fn(f) => {
                    self.fns.push(FnInfo { file: rel.to_string() });
                    let id = self.fns.len() - 1;
                    self.modules[module].values.insert(f.sig.ident.to_string(), Value::Fn(id));
                }
                // `macro_rules! name { .. }` defines a macro, no items.
                syn::Item::Macro(m) if m.ident.is_some() && m.mac.path.is_ident("macro_rules") => {}
                syn::Item::Macro(m) => {
                    if is_include(&m.mac.path)
                        && let Ok(lit) = m.mac.parse_body::<syn::LitStr>()
                    {
                        // `include!("x.rs")` of items: read where it is written, as if written there.
                        let line = line_of(&m.mac.path);
                        let f = file_abs.parent().unwrap_or(Path::new("")).join(lit.value());
                        let (frel, parsed) = self.read(root, &f, Some((rel, line)))?;
                        self.collect(root, module, parsed.items, &frel, &f, child_dir, inline)?;
                    } else {
                        // Any other macro, or an `include!` of a path computed at build time
                        // (`concat!(env!("OUT_DIR"), ..)`, unread): whatever it writes is unseen.
                        self.modules[module].item_macros = true;
                    }
                }
                syn::Item::Static(s) => self.add_static(module, &s.ident, rel),
                syn::Item::Const(c) => self.add_static(module, &c.ident, rel),
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
                        bind(&mut self.modules[module].uses, alias.to_string(), vec![e.ident.to_string()]);
                    }
                }
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    // Two `#[cfg]` arms of one module name are one module to the model: both read.
                    let sub = match self.modules[module].children.get(&name) {
                        Some(&sub) => sub,
                        None => {
                            let mut path = self.modules[module].path.clone();
                            path.push(name.clone());
                            let sub = self.new_module(path, Some(module), rel.to_string());
                            self.modules[module].children.insert(name.clone(), sub);
                            sub
                        }
                    };
                    let (direct, conditional) = path_attrs(&m.attrs);
                    // rustc takes a `#[path]` from the file's directory, or inside an inline
                    // module from that module's directory.
                    let base = if inline {
                        child_dir.to_path_buf()
                    } else {
                        file_abs.parent().map(Path::to_path_buf).unwrap_or_default()
                    };
                    let line = line_of(&m.ident);
                    match m.content {
                        Some((_, items)) => {
                            let dir = match &direct {
                                Some(p) => base.join(p),
                                None => child_dir.join(&name),
                            };
                            self.collect(root, sub, items, rel, file_abs, &dir, true)?;
                        }
                        None => {
                            // Every file the module may be read from: the one rustc takes with no
                            // cfg on, and each one a `cfg_attr(.., path = ..)` names.
                            let mut files: Vec<(PathBuf, PathBuf)> = Vec::new();
                            match &direct {
                                Some(p) => {
                                    let f = base.join(p);
                                    let d = f.parent().map(Path::to_path_buf).unwrap_or_default();
                                    files.push((f, d));
                                }
                                None => {
                                    let flat = child_dir.join(format!("{name}.rs"));
                                    let nested = child_dir.join(&name).join("mod.rs");
                                    let f = if flat.is_file() { flat } else { nested };
                                    if f.is_file() || conditional.is_empty() {
                                        files.push((f, child_dir.join(&name)));
                                    }
                                }
                            }
                            for p in &conditional {
                                let f = base.join(p);
                                let d = f.parent().map(Path::to_path_buf).unwrap_or_default();
                                files.push((f, d));
                            }
                            for (file, dir) in files {
                                if !file.is_file() {
                                    return Err(GuardError::Io {
                                        path: relative(root, &file),
                                        message: format!("module `{name}` declared in {rel}:{line} has no file"),
                                    });
                                }
                                self.load_file(root, &file, sub, &dir)?;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn add_def(&mut self, module: ModId, ident: &syn::Ident, file: &str, variants: Vec<String>) {
        self.defs.push(Def { file: file.to_string(), variants });
        let id = self.defs.len() - 1;
        self.modules[module].types.insert(ident.to_string(), id);
    }

    fn add_static(&mut self, module: ModId, ident: &syn::Ident, file: &str) {
        self.statics.push(StaticInfo { file: file.to_string() });
        let id = self.statics.len() - 1;
        self.modules[module].values.insert(ident.to_string(), Value::Static(id));
    }

    /// Resolves path segments in module `m` (when `#[cfg]` arms bind a name to several paths:
    /// the last of [`Crate::resolve_all`]'s answers).
    pub fn resolve(&self, m: ModId, segs: &[String], depth: usize) -> Res {
        let mut all = self.resolve_all(m, segs, depth);
        all.pop().unwrap_or_else(|| self.unresolved(m, segs.first().map(String::as_str).unwrap_or_default()))
    }

    /// Every item a path may name in module `m`: one, or one per `#[cfg(..)]` arm of a `use`
    /// the path goes through (rustc keeps one arm per build; the model reads them all).
    fn resolve_all(&self, m: ModId, segs: &[String], depth: usize) -> Vec<Res> {
        if segs.is_empty() {
            return vec![Res::Module(m)];
        }
        if depth > MAX_DEPTH {
            return vec![self.unresolved(m, &segs[0])];
        }
        let first = segs[0].as_str();
        let starts = match first {
            "::" => {
                return vec![match segs.get(1) {
                    Some(c) if is_extern_root(c) => Res::External(segs[1..].to_vec()),
                    // `::name` where `name` is no sysroot crate.
                    _ => self.unresolved(0, segs.get(1).map(String::as_str).unwrap_or("::")),
                }];
            }
            "crate" | "$crate" => vec![Res::Module(0)],
            "self" => vec![Res::Module(m)],
            "super" => vec![Res::Module(self.modules[m].parent.unwrap_or(0))],
            _ => {
                let found = self.lookup_seen(m, first, depth, &mut Vec::new());
                if !found.is_empty() {
                    found
                } else if is_extern_root(first) {
                    return vec![Res::External(segs.to_vec())];
                } else {
                    vec![self.fallback(m, first, depth)]
                }
            }
        };
        let mut out = Vec::new();
        for start in starts {
            for r in self.descend(m, start, &segs[1..], depth, first) {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
        out
    }

    /// What a `use` binding `name` -> `target` names from module `m`.
    fn use_target(&self, m: ModId, name: &str, target: &[String], depth: usize) -> Vec<Res> {
        // `use tokio;` names the extern crate, not itself.
        if target.len() == 1 && target[0] == name {
            return vec![if is_extern_root(name) { Res::External(target.to_vec()) } else { self.unresolved(m, name) }];
        }
        self.resolve_all(m, target, depth + 1)
    }

    /// The rest of a path's segments, below what its first segments named.
    fn descend(&self, m: ModId, cur: Res, rest: &[String], depth: usize, first: &str) -> Vec<Res> {
        let Some((seg, more)) = rest.split_first() else { return vec![cur] };
        let next = match cur {
            Res::Module(mm) if seg == "super" => vec![Res::Module(self.modules[mm].parent.unwrap_or(0))],
            Res::Module(mm) if seg == "self" => vec![Res::Module(mm)],
            Res::Module(mm) => {
                let found = self.lookup_seen(mm, seg, depth, &mut Vec::new());
                if found.is_empty() { vec![self.fallback(mm, seg, depth)] } else { found }
            }
            Res::Def(d) | Res::Assoc(d, _) => vec![Res::Assoc(d, seg.clone())],
            Res::External(mut p) => {
                p.push(seg.clone());
                vec![Res::External(p)]
            }
            // Whatever follows an unresolved item is under it.
            Res::Unresolved(..) => return vec![cur],
            Res::Fn(_) | Res::Static(_) => return vec![self.unresolved(m, first)],
        };
        next.into_iter().flat_map(|n| self.descend(m, n, more, depth, first)).collect()
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
        if self.item_macros_in_scope(m, depth) {
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

    /// Whether module `m`, or a crate module it globs from, invokes a macro at item level: what
    /// may have written a name `m` does not define.
    fn item_macros_in_scope(&self, m: ModId, depth: usize) -> bool {
        let mut seen = vec![m];
        let mut todo = vec![m];
        while let Some(cur) = todo.pop() {
            if self.modules[cur].item_macros {
                return true;
            }
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
        false
    }

    /// Looks a single name up in a module's namespace: types, modules, `use`s (every cfg arm),
    /// values, and the crate's own globs. Empty: nothing in the crate answers it (see
    /// [`Crate::fallback`]).
    fn lookup_seen(&self, m: ModId, name: &str, depth: usize, seen: &mut Vec<ModId>) -> Vec<Res> {
        seen.push(m);
        let module = &self.modules[m];
        if let Some(&d) = module.types.get(name) {
            return vec![Res::Def(d)];
        }
        if let Some(&c) = module.children.get(name) {
            return vec![Res::Module(c)];
        }
        if let Some(targets) = module.uses.get(name) {
            return targets.iter().flat_map(|t| self.use_target(m, name, t, depth)).collect();
        }
        if let Some(v) = module.values.get(name) {
            return vec![match *v {
                Value::Fn(f) => Res::Fn(f),
                Value::Static(s) => Res::Static(s),
            }];
        }
        for g in &module.globs {
            if depth > MAX_DEPTH {
                break;
            }
            match self.resolve(m, g, depth + 1) {
                Res::Module(gm) if !seen.contains(&gm) => {
                    let found = self.lookup_seen(gm, name, depth + 1, seen);
                    if !found.is_empty() {
                        return found;
                    }
                }
                // `use Enum::*`: its variants.
                Res::Def(d) if self.defs[d].variants.iter().any(|v| v == name) => {
                    return vec![Res::Assoc(d, name.to_string())];
                }
                _ => {}
            }
        }
        Vec::new()
    }
}

fn relative(root: &Path, file: &Path) -> String {
    let rel: PathBuf = file.strip_prefix(root).map(Path::to_path_buf).unwrap_or_else(|_| file.to_path_buf());
    rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}

/// `include!`, `std::include!`, `core::include!`.
fn is_include(path: &syn::Path) -> bool {
    let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    matches!(segs.iter().map(String::as_str).collect::<Vec<_>>().as_slice(), ["include"] | ["std" | "core", "include"])
}

/// A module's `#[path = ..]` and the paths its `#[cfg_attr(.., path = ..)]` (nested too) name.
fn path_attrs(attrs: &[syn::Attribute]) -> (Option<String>, Vec<String>) {
    use syn::punctuated::Punctuated;
    fn cfg_attr_paths(list: &syn::MetaList, out: &mut Vec<String>) {
        let Ok(metas) = list.parse_args_with(Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated) else {
            return;
        };
        // The first is the predicate; the rest are the attributes it applies.
        for meta in metas.iter().skip(1) {
            match meta {
                syn::Meta::NameValue(nv) if nv.path.is_ident("path") => out.extend(lit_str(&nv.value)),
                syn::Meta::List(l) if l.path.is_ident("cfg_attr") => cfg_attr_paths(l, out),
                _ => {}
            }
        }
    }
    let mut direct = None;
    let mut conditional = Vec::new();
    for a in attrs {
        match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("path") => direct = lit_str(&nv.value),
            syn::Meta::List(l) if l.path.is_ident("cfg_attr") => cfg_attr_paths(l, &mut conditional),
            _ => {}
        }
    }
    (direct, conditional)
}

fn lit_str(e: &syn::Expr) -> Option<String> {
    match e {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
        _ => None,
    }
}

/// Flattens a `use` tree into local name -> written path, and glob prefixes.
fn flatten_use(tree: &syn::UseTree, prefix: &mut Vec<String>, uses: &mut Uses, globs: &mut Vec<Vec<String>>) {
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
                    bind(uses, last, prefix.clone());
                }
            } else {
                let mut full = prefix.clone();
                full.push(name.clone());
                bind(uses, name, full);
            }
        }
        syn::UseTree::Rename(r) => {
            // `as _` too: it brings a trait's methods into scope; kept under `_`.
            let alias = r.rename.to_string();
            let mut full = prefix.clone();
            if r.ident != "self" {
                full.push(r.ident.to_string());
            }
            bind(uses, alias, full);
        }
        syn::UseTree::Glob(_) => globs.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, uses, globs);
            }
        }
    }
}

/// Adds a `use` binding (a second `#[cfg]` arm of a name is kept beside the first).
fn bind(uses: &mut Uses, name: String, path: Vec<String>) {
    let targets = uses.entry(name).or_default();
    if !targets.contains(&path) {
        targets.push(path);
    }
}
