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

/// Every `lib<name>-*.rlib` beside this test binary, newest first.
fn rlibs(name: &str) -> Vec<PathBuf> {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let prefix = format!("lib{name}-");
    let mut found: Vec<(Option<std::time::SystemTime>, PathBuf)> = std::fs::read_dir(&deps)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && n.ends_with(".rlib")
        })
        .map(|e| (e.metadata().and_then(|m| m.modified()).ok(), e.path()))
        .collect();
    found.sort_by_key(|b| std::cmp::Reverse(b.0));
    found.into_iter().map(|(_, path)| path).collect()
}

/// The `scopegate` and `rmcp` libraries this build compiled, for compiling a crate of a test's
/// own against them: a pair that belongs together (the target directory may also hold others,
/// of other feature sets, from `cargo build` or `cargo clippy`), found by compiling a line that
/// hands scopegate's rmcp type to rmcp, newest pair first.
pub fn built_libraries() -> &'static (PathBuf, PathBuf) {
    static PAIR: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    PAIR.get_or_init(|| {
        let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        let dir = tempfile::tempdir().unwrap();
        let probe = dir.path().join("pair.rs");
        std::fs::write(
            &probe,
            "pub fn id(c: &scopegate::McpCallContext) -> &rmcp::model::RequestId { c.request_id() }\n",
        )
        .unwrap();
        for scopegate in rlibs("scopegate") {
            for rmcp in rlibs("rmcp") {
                let ok = std::process::Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
                    .args(["--edition", "2024", "--crate-type", "lib", "--emit=metadata"])
                    .arg("--out-dir")
                    .arg(dir.path())
                    .arg("-L")
                    .arg(format!("dependency={}", deps.display()))
                    .arg("--extern")
                    .arg(format!("scopegate={}", scopegate.display()))
                    .arg("--extern")
                    .arg(format!("rmcp={}", rmcp.display()))
                    .arg(&probe)
                    .output()
                    .unwrap()
                    .status
                    .success();
                if ok {
                    return (scopegate, rmcp);
                }
            }
        }
        panic!("no scopegate and rmcp libraries of one build in {}", deps.display())
    })
}
