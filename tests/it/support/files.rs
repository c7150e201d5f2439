//! The workspace's own files: its documentation pages, copies of its trees, and the libraries
//! this build compiled.

use std::path::{Path, PathBuf};

/// `README.md` and every `*.md` under `docs/`, as (path from the repository root, text), in
/// path order, read at run time (editing a page needs no rebuild).
pub fn pages() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut paths = Vec::new();
    walk(root, &root.join("docs"), &mut paths);
    paths.sort();
    paths.insert(0, "README.md".to_owned());
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
            (path, text)
        })
        .collect()
}

/// Copies the tree at `from` to `to` (created), files and folders alike.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The newest `lib<name>-*.rlib` beside this test binary (the one this build compiled), for
/// compiling a crate of a test's own against the gateway's libraries.
pub fn built_rlib(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let prefix = format!("lib{name}-");
    std::fs::read_dir(&deps)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && n.ends_with(".rlib")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .unwrap_or_else(|| panic!("no lib{name}-*.rlib in {}", deps.display()))
}
