//! The crate's own import graph: every path that runs from one top-level module of the crate
//! to another (`use crate::store::Db`, `crate::audit::digest::sha(..)`, `super::super::x`),
//! for a layering check, and the same references between files ([`file_imports`]), for the
//! check that no import circle crosses folders. Test code (`#[cfg(test)]` items) is left out.

use std::path::Path;

use syn::visit::Visit;

use crate::model::{Crate, Res, has_cfg_test, line_of};
use crate::{GuardError, Options};

/// One reference from a file of top-level module `from` to top-level module `to`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Import {
    /// The file, relative to the crate root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// The top-level module the file belongs to (`store`; the crate root's own items: `crate`).
    pub from: String,
    /// The top-level module referred to.
    pub to: String,
    /// The path as written.
    pub path: String,
}

/// One reference from a file of the crate to the file that defines the module it names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileImport {
    /// The file, relative to the crate root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// The file that defines what the path names (through `use` and re-exports).
    pub to_file: String,
    /// The path as written.
    pub path: String,
}

/// Every cross-module reference of the crate's non-test code, in file and line order.
pub fn imports(opts: &Options) -> Result<Vec<Import>, GuardError> {
    let (_, refs) = references(opts)?;
    let mut out: Vec<Import> = refs
        .into_iter()
        .filter(|r| !r.relative)
        .filter_map(|r| {
            let from = r.module.first().cloned().unwrap_or_else(|| "crate".into());
            let to = r.target.first()?.clone();
            (to != from && to != "self").then_some(Import { file: r.file, line: r.line, from, to, path: r.path })
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// Every reference of the crate's non-test code from one file to another, in file and line order:
/// each path resolved as rustc would (through `use` and re-exports) to the file that defines
/// what it names.
pub fn file_imports(opts: &Options) -> Result<Vec<FileImport>, GuardError> {
    let (krate, refs) = references(opts)?;
    let mut out: Vec<FileImport> = refs
        .into_iter()
        .filter_map(|r| {
            let module = krate.modules.iter().position(|m| m.path[1..] == r.module[..])?;
            let segs: Vec<String> = r.path.split("::").map(str::to_owned).collect();
            let to_file = match krate.resolve(module, &segs, 0) {
                Res::Def(d) | Res::Assoc(d, _) => krate.defs[d].file.clone(),
                Res::Module(m) => krate.modules[m].file.clone(),
                Res::Fn(f) => krate.fns[f].file.clone(),
                Res::Static(s) => krate.statics[s].file.clone(),
                Res::External(_) | Res::Unresolved(..) => return None,
            };
            (to_file != r.file).then_some(FileImport { file: r.file, line: r.line, to_file, path: r.path })
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// A path of the crate's own, resolved: the module it is written in and what it names.
struct Reference {
    file: String,
    line: usize,
    /// The module the path is written in, below `crate`.
    module: Vec<String>,
    /// What it names, below `crate`.
    target: Vec<String>,
    path: String,
    /// Written relative to its module (neither `crate`, `super` nor `self`): it never leaves the
    /// module's own subtree.
    relative: bool,
}

fn references(opts: &Options) -> Result<(Crate, Vec<Reference>), GuardError> {
    let krate = Crate::load(&opts.crate_root, &opts.entry_file())?;
    let mut out = Vec::new();
    for file in &krate.files {
        // The module whose own file this is (the shortest path among those read from it).
        let Some(module) = krate.modules.iter().filter(|m| m.file == *file).min_by_key(|m| m.path.len()) else {
            continue;
        };
        let text = std::fs::read_to_string(opts.crate_root.join(Path::new(file)))
            .map_err(|e| GuardError::Io { path: file.clone(), message: e.to_string() })?;
        let parsed = syn::parse_file(&text).map_err(|e| GuardError::Parse {
            path: file.clone(),
            line: e.span().start().line,
            message: e.to_string(),
        })?;
        let mut v = Refs { file: file.clone(), module: module.path[1..].to_vec(), out: &mut out };
        v.visit_file(&parsed);
    }
    Ok((krate, out))
}

struct Refs<'a> {
    file: String,
    /// The module being read, below `crate` (`["store", "scoped"]`).
    module: Vec<String>,
    out: &'a mut Vec<Reference>,
}

impl Refs<'_> {
    fn record(&mut self, segs: &[String], line: usize) {
        let (target, relative): (Vec<String>, bool) = match segs.first().map(String::as_str) {
            Some("crate") => (segs[1..].to_vec(), false),
            Some("super") => {
                let mut base = self.module.clone();
                let mut rest = segs;
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                (base, false)
            }
            Some("self") => (self.module.iter().chain(&segs[1..]).cloned().collect(), false),
            // Relative to this module: a child module's items (`mod child; child::X`), or a
            // name that is no module of the crate (resolved to this file, so left out).
            Some(_) => (self.module.iter().chain(segs).cloned().collect(), true),
            None => return,
        };
        self.out.push(Reference {
            file: self.file.clone(),
            line,
            module: self.module.clone(),
            target,
            path: segs.join("::"),
            relative,
        });
    }

    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>, line: usize) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix, line);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.record(prefix, line);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.record(prefix, line);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.record(prefix, line),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix, line);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs = match i {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(x) => &x.attrs,
            syn::Item::Use(u) => &u.attrs,
            _ => return syn::visit::visit_item(self, i),
        };
        if has_cfg_test(attrs) {
            return;
        }
        syn::visit::visit_item(self, i);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // Inline modules: read here; file modules: read from their own file.
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    /// `pub(crate)`, `pub(super)`, `pub(in crate::x)` name where an item is visible, not what
    /// it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = line_of(u);
        self.use_tree(&u.tree, &mut Vec::new(), line);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.record(&segs, line_of(p));
        }
        syn::visit::visit_path(self, p);
    }
}
