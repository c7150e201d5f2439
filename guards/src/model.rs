//! The parsed crate: module tree, definitions, impls, `use` tables and name resolution.
//! It never judges anything; it only answers "what does this path name here".

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::visit_mut::VisitMut;

use crate::GuardError;

pub(crate) type ModId = usize;
/// `use` bindings: local name -> every path bound to it.
pub(crate) type Uses = HashMap<String, Vec<Vec<String>>>;
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
    /// The identifiers of each `macro_rules!` definition's rules.
    pub macro_idents: HashMap<String, Vec<String>>,
    /// The identifiers of each `macro_rules!` definition's rules with their lines, and its file.
    pub macro_tokens: HashMap<String, (String, Vec<(String, usize)>)>,
    /// A definition shadowed in its module's namespace by a later one of the same name (the
    /// other arm of a `#[cfg(..)]` pair): the later def's id -> the earlier ones. Both are walked.
    pub def_twins: HashMap<DefId, Vec<DefId>>,
    /// The same for free fns.
    pub fn_twins: HashMap<usize, Vec<usize>>,
    /// `include!("x.rs")` written where an expression goes: (file, line, column of the macro's
    /// path) -> the included file and the expression it holds.
    pub included_exprs: HashMap<(String, usize, usize), (String, syn::Expr)>,
    /// `include!(..)` of items whose file the walk cannot name (a path computed at build time):
    /// whatever it writes is unseen.
    pub opaque_includes: Vec<(ModId, ItemMacro)>,
    /// Macros invoked as items or statements inside fn bodies.
    pub nested_macros: Vec<(ModId, ItemMacro)>,
}

/// A macro invoked where items are written (`make!(Name);`): it may define names the walk
/// never sees.
#[derive(Clone, Debug)]
pub(crate) struct ItemMacro {
    /// The macro's path as written (`make`, `tokio::task_local`).
    pub path: String,
    pub file: String,
    pub line: usize,
    /// The identifiers of its input.
    pub idents: Vec<String>,
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
    /// Crate types named in the trait's generic arguments or inside the self type, besides the
    /// self type itself (`impl From<Local> for String`, `impl Display for &Local`): code that
    /// holds one of them may call the impl's methods.
    pub trait_arg_defs: Vec<DefId>,
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
    /// The initialiser: it runs when the item is first touched (a `static`, a `LazyLock`), or
    /// is copied where a `const` is used.
    pub expr: syn::Expr,
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
            macro_idents: HashMap::new(),
            macro_tokens: HashMap::new(),
            included_exprs: HashMap::new(),
            opaque_includes: Vec::new(),
            nested_macros: Vec::new(),
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
            let mut named = TypePaths::default();
            // The self type's own paths too: `impl Display for &Local`, `impl dyn Local`.
            named.visit_type(&krate.impls[i].item.self_ty);
            if let Some((_, path, _)) = &krate.impls[i].item.trait_ {
                for seg in &path.segments {
                    named.visit_path_arguments(&seg.arguments);
                }
            }
            let mut arg_defs = Vec::new();
            for p in &named.0 {
                for r in krate.resolve_all_with(krate.impls[i].module, &p.0, 0, &Uses::new()) {
                    if let Res::Def(d) = r
                        && !arg_defs.contains(&d)
                        && Some(d) != self_def
                    {
                        arg_defs.push(d);
                    }
                }
            }
            krate.impls[i].trait_arg_defs = arg_defs;
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

    /// Reads and parses one source file, noting it among the files read. `from`: the file and
    /// line that named it (for the error when it is missing).
    fn read(
        &mut self,
        root: &Path,
        file: &Path,
        from: Option<(&str, usize)>,
    ) -> Result<(String, syn::File), GuardError> {
        let (rel, mut parsed) = parse_file_at(root, file, from.map(|(f, l)| format!("named at {f}:{l}")))?;
        if !self.files.contains(&rel) {
            self.files.push(rel.clone());
        }
        // `fn f() { #[path = "x.rs"] mod m; .. }`: the file is read into the module, so the
        // body reads it as its own.
        let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut block_mods = BlockModules { root, dirs: vec![dir], in_block: 0, read: Vec::new(), error: None };
        syn::visit_mut::VisitMut::visit_file_mut(&mut block_mods, &mut parsed);
        if let Some(e) = block_mods.error {
            return Err(e);
        }
        for f in block_mods.read {
            if !self.files.contains(&f) {
                self.files.push(f);
            }
        }
        let mut found = ExprIncludes::default();
        found.visit_file(&parsed);
        self.read_expr_includes(root, file, &rel, found.0, 0)?;
        Ok((rel, parsed))
    }

    /// `include!("x.rs")` written where an expression goes, anywhere in `parsed`: each file is
    /// read and parsed as the expression it stands for, kept by where the macro is written.
    fn read_expr_includes(
        &mut self,
        root: &Path,
        file: &Path,
        rel: &str,
        found: Vec<(usize, usize, String)>,
        depth: usize,
    ) -> Result<(), GuardError> {
        for (line, column, lit) in found {
            let f = file.parent().unwrap_or(Path::new("")).join(&lit);
            let frel = relative(root, &f);
            let text = std::fs::read_to_string(&f)
                .map_err(|e| GuardError::Io { path: frel.clone(), message: format!("{e} (named at {rel}:{line})") })?;
            let expr: syn::Expr = syn::parse_str(&text).map_err(|e| GuardError::Parse {
                path: frel.clone(),
                line: e.span().start().line,
                message: format!("{e} (included as an expression at {rel}:{line})"),
            })?;
            if !self.files.contains(&frel) {
                self.files.push(frel.clone());
            }
            if depth < MAX_DEPTH {
                let mut inner = ExprIncludes::default();
                inner.visit_expr(&expr);
                self.read_expr_includes(root, &f, &frel, inner.0, depth + 1)?;
            }
            self.included_exprs.insert((rel.to_string(), line, column), (frel, expr));
        }
        Ok(())
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
            // Impls and macros written inside fn bodies: an impl there is global (a tool router
            // may be written in one), and a macro there may write one.
            let mut nested = NestedItems::default();
            nested.visit_item(&item);
            for imp in nested.impls {
                self.impls.push(ImplInfo {
                    module,
                    file: rel.to_string(),
                    item: imp,
                    self_def: None,
                    trait_def: None,
                    trait_arg_defs: Vec::new(),
                });
            }
            for (name, line, idents, tokens) in nested.macro_rules {
                self.macro_defs.insert(name.clone(), (rel.to_string(), line));
                self.macro_idents.insert(name.clone(), idents);
                self.macro_tokens.insert(name, (rel.to_string(), tokens));
            }
            for (path, line, idents) in nested.macros {
                self.nested_macros.push((module, ItemMacro { path, file: rel.to_string(), line, idents }));
            }
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
                syn::Item::Macro(m) if is_include(&m.mac.path) => {
                    let line = line_of(&m.mac.path);
                    match m.mac.parse_body::<syn::LitStr>() {
                        // `include!("x.rs")` of items: read where it is written, as if written there.
                        Ok(lit) => {
                            let f = file_abs.parent().unwrap_or(Path::new("")).join(lit.value());
                            let (frel, parsed) = self.read(root, &f, Some((rel, line)))?;
                            self.collect(root, module, parsed.items, &frel, &f, child_dir, inline)?;
                        }
                        // A path computed at build time (`concat!(env!("OUT_DIR"), ..)`): unread;
                        // whatever it writes is unresolved where a tool names it.
                        Err(_) => {
                            let path = m.mac.path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>();
                            let mac =
                                ItemMacro { path: path.join("::"), file: rel.to_string(), line, idents: Vec::new() };
                            self.modules[module].item_macros.push(mac.clone());
                            self.opaque_includes.push((module, mac));
                        }
                    }
                }
                syn::Item::Macro(m) => {
                    let line = line_of(&m.mac.path);
                    match &m.ident {
                        // `macro_rules! name { .. }`
                        Some(name) if m.mac.path.is_ident("macro_rules") => {
                            self.macro_defs.insert(name.to_string(), (rel.to_string(), line));
                            self.macro_idents.insert(name.to_string(), idents_of(m.mac.tokens.clone()));
                            self.macro_tokens
                                .insert(name.to_string(), (rel.to_string(), idents_at(m.mac.tokens.clone())));
                        }
                        _ => {
                            let path = m.mac.path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>();
                            self.modules[module].item_macros.push(ItemMacro {
                                path: path.join("::"),
                                file: rel.to_string(),
                                line,
                                idents: idents_of(m.mac.tokens.clone()),
                            });
                        }
                    }
                }
                syn::Item::Static(s) => {
                    self.add_static(module, &s.ident, *s.ty, *s.expr, rel);
                }
                syn::Item::Const(c) => {
                    self.add_static(module, &c.ident, *c.ty, *c.expr, rel);
                }
                syn::Item::Impl(i) => self.impls.push(ImplInfo {
                    module,
                    file: rel.to_string(),
                    item: i,
                    self_def: None,
                    trait_def: None,
                    trait_arg_defs: Vec::new(),
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
                        bind(&mut self.modules[module].uses, alias.to_string(), vec![e.ident.to_string()]);
                    }
                }
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    // Two `#[cfg]` arms of one module name are one module to the walk: both read.
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

    fn add_def(&mut self, module: ModId, name: String, file: &str, line: usize, kind: DefKind) {
        self.defs.push(Def { name: name.clone(), module, file: file.to_string(), line, kind });
        let id = self.defs.len() - 1;
        if let Some(earlier) = self.modules[module].types.insert(name, id) {
            let mut twins = self.def_twins.remove(&earlier).unwrap_or_default();
            twins.push(earlier);
            self.def_twins.insert(id, twins);
        }
    }

    fn add_static(&mut self, module: ModId, ident: &syn::Ident, ty: syn::Type, expr: syn::Expr, file: &str) {
        self.statics.push(StaticInfo {
            name: ident.to_string(),
            module,
            file: file.to_string(),
            line: line_of(ident),
            ty,
            expr,
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

    /// Resolves path segments in module `m` (when `#[cfg]` arms bind a name to several paths:
    /// the last arm; [`Crate::resolve_all_with`] gives every arm).
    pub fn resolve(&self, m: ModId, segs: &[String], depth: usize) -> Res {
        self.resolve_with(m, segs, depth, &Uses::new())
    }

    /// Like [`Crate::resolve`], with extra `use` items in scope (those of a fn body).
    pub fn resolve_with(&self, m: ModId, segs: &[String], depth: usize, local_uses: &Uses) -> Res {
        let mut all = self.resolve_all_with(m, segs, depth, local_uses);
        all.pop().unwrap_or_else(|| self.unresolved(m, segs.first().map(String::as_str).unwrap_or_default()))
    }

    /// Every item a path may name in module `m`: one, or one per `#[cfg(..)]` arm of a `use`
    /// the path goes through (rustc keeps one arm per build; the walk reads them all).
    pub fn resolve_all_with(&self, m: ModId, segs: &[String], depth: usize, local_uses: &Uses) -> Vec<Res> {
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
                    Some(c) if is_extern_root(&self.externs, c) => Res::External(segs[1..].to_vec()),
                    // `::name` where `name` is no crate this one depends on.
                    _ => self.unresolved(0, segs.get(1).map(String::as_str).unwrap_or("::")),
                }];
            }
            "crate" | "$crate" => vec![Res::Module(0)],
            "self" => vec![Res::Module(m)],
            "super" => vec![Res::Module(self.modules[m].parent.unwrap_or(0))],
            _ => match local_uses.get(first) {
                // A block's `use` of the name, in force where the path is written.
                Some(targets) => targets.iter().flat_map(|t| self.use_target(m, first, t, depth)).collect(),
                None => {
                    let found = self.lookup_seen(m, first, depth, &mut Vec::new());
                    if !found.is_empty() {
                        found
                    } else if is_extern_root(&self.externs, first) {
                        return vec![Res::External(segs.to_vec())];
                    } else {
                        vec![self.fallback(m, first, depth)]
                    }
                }
            },
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
            return vec![if is_extern_root(&self.externs, name) {
                Res::External(target.to_vec())
            } else {
                self.unresolved(m, name)
            }];
        }
        self.resolve_all_with(m, target, depth + 1, &Uses::new())
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

    /// Every crate trait in scope in module `m` with a body's `local_uses`: defined there,
    /// imported by any `use` (renamed or `as _`), or brought by a glob. Only these traits'
    /// methods can be called with method syntax there (besides those of a bound or `dyn`).
    pub fn traits_in_scope(&self, m: ModId, local_uses: &Uses) -> HashSet<DefId> {
        let mut out = HashSet::new();
        let is_trait = |d: DefId| matches!(self.defs[d].kind, DefKind::Trait(_));
        let add = |r: Res, out: &mut HashSet<DefId>| {
            if let Res::Def(d) = r
                && is_trait(d)
            {
                out.insert(d);
            }
        };
        let module = &self.modules[m];
        for &d in module.types.values() {
            add(Res::Def(d), &mut out);
        }
        for targets in module.uses.values().chain(local_uses.values()) {
            for t in targets {
                for r in self.resolve_all_with(m, t, 1, &Uses::new()) {
                    add(r, &mut out);
                }
            }
        }
        for g in &module.globs {
            if let Res::Module(gm) = self.resolve(m, g, 1) {
                for &d in self.modules[gm].types.values() {
                    add(Res::Def(d), &mut out);
                }
                for targets in self.modules[gm].uses.values() {
                    for t in targets {
                        for r in self.resolve_all_with(gm, t, 1, &Uses::new()) {
                            add(r, &mut out);
                        }
                    }
                }
            }
        }
        out
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
                Res::Def(d) => {
                    if let DefKind::Enum(e) = &self.defs[d].kind
                        && e.variants.iter().any(|v| v.ident == name)
                    {
                        return vec![Res::Assoc(d, name.to_string())];
                    }
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

/// Every identifier in a token stream, groups included; the path of each attribute written in
/// it (`#[rmcp::tool(..)]`, `#![..]`) is added once more as `#` and its last segment (`#tool`).
fn idents_of(ts: proc_macro2::TokenStream) -> Vec<String> {
    use proc_macro2::{Delimiter, TokenTree};
    let mut out = Vec::new();
    let mut after_pound = false;
    for tt in ts {
        match tt {
            TokenTree::Punct(p) if p.as_char() == '#' => {
                after_pound = true;
                continue;
            }
            TokenTree::Punct(p) if p.as_char() == '!' && after_pound => continue,
            TokenTree::Group(g) => {
                if after_pound && g.delimiter() == Delimiter::Bracket {
                    let last = g
                        .stream()
                        .into_iter()
                        .take_while(|t| {
                            !matches!(t, TokenTree::Group(_)) && !matches!(t, TokenTree::Punct(p) if p.as_char() == '=')
                        })
                        .filter_map(|t| match t {
                            TokenTree::Ident(i) => Some(i.to_string()),
                            _ => None,
                        })
                        .last();
                    out.extend(last.map(|l| format!("#{l}")));
                }
                out.extend(idents_of(g.stream()));
            }
            TokenTree::Ident(i) => out.push(i.to_string()),
            _ => {}
        }
        after_pound = false;
    }
    out
}

/// Every identifier in a token stream, groups included, with its line.
pub(crate) fn idents_at(ts: proc_macro2::TokenStream) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for tt in ts {
        match tt {
            proc_macro2::TokenTree::Ident(i) => out.push((i.to_string(), i.span().start().line)),
            proc_macro2::TokenTree::Group(g) => out.extend(idents_at(g.stream())),
            _ => {}
        }
    }
    out
}

/// `include!`, `std::include!`, `core::include!`.
pub(crate) fn is_include(path: &syn::Path) -> bool {
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

pub(crate) fn lit_str(e: &syn::Expr) -> Option<String> {
    match e {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
        _ => None,
    }
}

/// `include!("x.rs")` macros written where expressions go: (line, column, path).
/// A `macro_rules!` written in a body: name, line, its identifiers (see [`idents_of`]) and
/// its identifiers with their lines.
type NestedMacroRules = (String, usize, Vec<String>, Vec<(String, usize)>);

/// What is written inside the blocks of an item: impls, `macro_rules!` definitions and macro
/// calls in item or statement position.
#[derive(Default)]
struct NestedItems {
    in_block: usize,
    impls: Vec<syn::ItemImpl>,
    macro_rules: Vec<NestedMacroRules>,
    macros: Vec<(String, usize, Vec<String>)>,
}

impl<'ast> syn::visit::Visit<'ast> for NestedItems {
    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.in_block += 1;
        syn::visit::visit_block(self, b);
        self.in_block -= 1;
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // A module outside any block is read by `collect`, with its own nested items.
        if self.in_block > 0 {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if self.in_block > 0 && !has_cfg_test(&i.attrs) {
            self.impls.push(i.clone());
        }
        syn::visit::visit_item_impl(self, i);
    }

    fn visit_item_macro(&mut self, m: &'ast syn::ItemMacro) {
        if self.in_block > 0 {
            let line = line_of(&m.mac.path);
            match &m.ident {
                Some(name) if m.mac.path.is_ident("macro_rules") => self.macro_rules.push((
                    name.to_string(),
                    line,
                    idents_of(m.mac.tokens.clone()),
                    idents_at(m.mac.tokens.clone()),
                )),
                _ => self.macros.push((tokens_path(&m.mac.path), line, idents_of(m.mac.tokens.clone()))),
            }
        }
    }

    fn visit_stmt_macro(&mut self, m: &'ast syn::StmtMacro) {
        if self.in_block > 0 {
            self.macros.push((tokens_path(&m.mac.path), line_of(&m.mac.path), idents_of(m.mac.tokens.clone())));
        }
    }
}

fn tokens_path(p: &syn::Path) -> String {
    p.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>().join("::")
}

/// Reads and parses the source file `file`: its path relative to `root` and its syntax.
/// `why`: what named the file, added to the error when it cannot be read.
fn parse_file_at(root: &Path, file: &Path, why: Option<String>) -> Result<(String, syn::File), GuardError> {
    let rel = relative(root, file);
    let text = std::fs::read_to_string(file).map_err(|e| GuardError::Io {
        path: rel.clone(),
        message: match &why {
            Some(why) => format!("{e} ({why})"),
            None => e.to_string(),
        },
    })?;
    let parsed = syn::parse_file(&text).map_err(|e| GuardError::Parse {
        path: rel.clone(),
        line: e.span().start().line,
        message: e.to_string(),
    })?;
    Ok((rel, parsed))
}

/// The attribute [`BlockModules`] puts on a module it read from a file (never in sources).
pub(crate) const FILE_MARK: &str = "scopegate_guard_file";

/// Reads the files of modules declared inside fn bodies (`#[path = "x.rs"] mod m;`, the only
/// file module a block may declare, taken from the file's directory) into the modules, with the
/// file modules those files declare in turn.
struct BlockModules<'a> {
    root: &'a Path,
    /// The directory file modules are taken from, innermost last.
    dirs: Vec<PathBuf>,
    in_block: usize,
    /// Files read, relative to the crate root.
    read: Vec<String>,
    error: Option<GuardError>,
}

impl BlockModules<'_> {
    fn load(&mut self, m: &mut syn::ItemMod) -> Result<(), GuardError> {
        let dir = self.dirs.last().cloned().unwrap_or_default();
        let (direct, conditional) = path_attrs(&m.attrs);
        let name = m.ident.to_string();
        let mut files: Vec<PathBuf> = direct.iter().chain(&conditional).map(|p| dir.join(p)).collect();
        if direct.is_none() {
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(&name).join("mod.rs");
            let f = if flat.is_file() { flat } else { nested };
            if f.is_file() || conditional.is_empty() {
                files.push(f);
            }
        }
        let mut items = Vec::new();
        for f in files {
            let (rel, mut parsed) =
                parse_file_at(self.root, &f, Some(format!("module `{name}` declared in a fn body")))?;
            self.read.push(rel);
            // Its own file modules are taken from beside it.
            self.dirs.push(f.parent().map(Path::to_path_buf).unwrap_or_default());
            let depth = self.in_block;
            self.in_block = 1;
            for item in &mut parsed.items {
                self.visit_item_mut(item);
            }
            self.in_block = depth;
            self.dirs.pop();
            items.extend(parsed.items);
        }
        m.content = Some((syn::token::Brace::default(), items));
        // The body reads the module as its own, and must name the file its lines are in.
        if let Some(rel) = self.read.last() {
            let mark = syn::Ident::new(FILE_MARK, proc_macro2::Span::call_site());
            m.attrs.push(syn::parse_quote!(#[#mark = #rel]));
        }
        Ok(())
    }
}

impl syn::visit_mut::VisitMut for BlockModules<'_> {
    fn visit_block_mut(&mut self, b: &mut syn::Block) {
        self.in_block += 1;
        syn::visit_mut::visit_block_mut(self, b);
        self.in_block -= 1;
    }

    fn visit_item_mod_mut(&mut self, m: &mut syn::ItemMod) {
        if self.error.is_some() || self.dirs.len() > MAX_DEPTH {
            return;
        }
        if self.in_block > 0 && m.content.is_none() {
            if let Err(e) = self.load(m) {
                self.error = Some(e);
            }
            return;
        }
        syn::visit_mut::visit_item_mod_mut(self, m);
    }
}

/// The paths of every type written in a syntax tree (as segments).
#[derive(Default)]
struct TypePaths(Vec<(Vec<String>,)>);

impl<'ast> syn::visit::Visit<'ast> for TypePaths {
    fn visit_type_path(&mut self, t: &'ast syn::TypePath) {
        if t.qself.is_none() {
            let mut segs: Vec<String> = t.path.segments.iter().map(|s| s.ident.to_string()).collect();
            if t.path.leading_colon.is_some() {
                segs.insert(0, "::".into());
            }
            self.0.push((segs,));
        }
        syn::visit::visit_type_path(self, t);
    }
}

#[derive(Default)]
struct ExprIncludes(Vec<(usize, usize, String)>);

impl<'ast> syn::visit::Visit<'ast> for ExprIncludes {
    fn visit_item_macro(&mut self, _: &'ast syn::ItemMacro) {
        // Items: read by `collect`.
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        if is_include(&m.path)
            && let Ok(lit) = m.parse_body::<syn::LitStr>()
        {
            let at = m.path.span().start();
            self.0.push((at.line, at.column, lit.value()));
        }
    }
}

/// Flattens a `use` tree into local name -> written path, and glob prefixes.
pub(crate) fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    uses: &mut Uses,
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
pub(crate) fn bind(uses: &mut Uses, name: String, path: Vec<String>) {
    let targets = uses.entry(name).or_default();
    if !targets.contains(&path) {
        targets.push(path);
    }
}
