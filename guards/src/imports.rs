//! The crate's own import graph: every path that runs from one top-level module of the crate
//! to another (`use crate::store::Db`, `crate::audit::digest::sha(..)`, `super::super::x`),
//! for a layering check. Test code (`#[cfg(test)]` items) is left out.

use std::path::Path;

use syn::visit::Visit;

use crate::model::{Crate, has_cfg_test, line_of};
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

/// Every cross-module reference of the crate's non-test code, in file and line order.
pub fn imports(opts: &Options) -> Result<Vec<Import>, GuardError> {
    let krate = Crate::load(&opts.crate_root, &opts.entry_file(), Default::default())?;
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
    out.sort();
    out.dedup();
    Ok(out)
}

struct Refs<'a> {
    file: String,
    /// The module being read, below `crate` (`["store", "scoped"]`).
    module: Vec<String>,
    out: &'a mut Vec<Import>,
}

impl Refs<'_> {
    fn record(&mut self, segs: &[String], line: usize) {
        let target: Vec<String> = match segs.first().map(String::as_str) {
            Some("crate") => segs[1..].to_vec(),
            Some("super") => {
                let mut base = self.module.clone();
                let mut rest = segs;
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                base
            }
            _ => return,
        };
        let from = self.module.first().cloned().unwrap_or_else(|| "crate".into());
        let Some(to) = target.first() else { return };
        if *to != from && to != "self" {
            self.out.push(Import { file: self.file.clone(), line, from, to: to.clone(), path: segs.join("::") });
        }
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
