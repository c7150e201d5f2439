//! The crate's layers, as `docs/architecture.md` draws them: every reference from one
//! top-level module to another (a `use`, or a path written in code; test code aside) runs
//! down, never sideways or up. A new import circle fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.md` file under `dir`.
fn markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// Module -> floor, from the table between `<!-- layers:begin -->` and `<!-- layers:end -->`
/// (wherever in `docs/` it is).
fn floors() -> BTreeMap<String, usize> {
    let mut files = Vec::new();
    markdown(&workspace().join("docs"), &mut files);
    let text = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .find(|t| t.contains("<!-- layers:begin -->"))
        .expect("a docs page holds the layers table");
    let table = text.split("<!-- layers:begin -->").nth(1).unwrap().split("<!-- layers:end -->").next().unwrap();
    let mut floors = BTreeMap::new();
    for row in table.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Ok(floor) = cells[1].parse::<usize>() else { continue };
        for module in cells[2].split(',') {
            let module = module.trim().trim_matches('`');
            assert!(floors.insert(module.to_owned(), floor).is_none(), "{module} is on two floors");
        }
    }
    floors
}

/// The references that break the table: `from -> to (file:line path)`.
fn breaks(floors: &BTreeMap<String, usize>, imports: &[guards::Import]) -> Vec<String> {
    let mut out = Vec::new();
    for i in imports {
        let (Some(from), Some(to)) = (floors.get(&i.from), floors.get(&i.to)) else {
            out.push(format!("{} -> {}: not in the layers table ({}:{})", i.from, i.to, i.file, i.line));
            continue;
        };
        if to >= from {
            out.push(format!(
                "{} (floor {from}) -> {} (floor {to}) at {}:{} `{}`",
                i.from, i.to, i.file, i.line, i.path
            ));
        }
    }
    out
}

#[test]
fn imports_run_down_the_layers() {
    let floors = floors();
    // Every top-level module of the crate is on a floor.
    for entry in std::fs::read_dir(workspace().join("src")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if ["lib", "main"].contains(&name.as_str()) || (path.is_file() && path.extension().is_none_or(|e| e != "rs")) {
            continue;
        }
        assert!(floors.contains_key(&name), "src/{name} is on no floor of the layers table");
    }
    let imports = guards::imports(&guards::Options::new(workspace())).unwrap();
    assert!(imports.len() > 100, "the import graph was read ({} references)", imports.len());
    let broken = breaks(&floors, &imports);
    assert!(broken.is_empty(), "references that do not run down the layers:\n{}", broken.join("\n"));
}

#[test]
fn an_upward_import_is_caught() {
    // The same check on a copy of the sources with one upward reference added: the store
    // (floor 5) naming the MCP endpoint (floor 17).
    let dir = tempfile::tempdir().unwrap();
    crate::support::copy_dir(&workspace().join("src"), &dir.path().join("src"));
    std::fs::copy(workspace().join("Cargo.toml"), dir.path().join("Cargo.toml")).unwrap();
    let ids = dir.path().join("src/store/ids.rs");
    let mut text = std::fs::read_to_string(&ids).unwrap();
    text.push_str("\n#[allow(unused_imports)]\nuse crate::mcp::ToolSet;\n");
    std::fs::write(&ids, text).unwrap();
    let imports = guards::imports(&guards::Options::new(dir.path())).unwrap();
    let floors = floors();
    let broken = breaks(&floors, &imports);
    assert_eq!(broken.len(), 1, "{broken:?}");
    let expected = format!("store (floor {}) -> mcp (floor {}) at src/store/ids.rs:", floors["store"], floors["mcp"]);
    assert!(broken[0].starts_with(&expected), "{}", broken[0]);
}

/// The folder of a module's files: `a/b.rs` with children in `a/b/` is module `b`'s own
/// file, so its folder is `a/b`, like that of `a/b/mod.rs`; any other file's is its parent.
fn module_folder(file: &str, files: &BTreeMap<&str, Vec<&str>>) -> String {
    let own = file.trim_end_matches(".rs");
    if files.keys().any(|f| Path::new(f).parent() == Some(Path::new(own))) {
        own.to_owned()
    } else {
        Path::new(file).parent().unwrap().display().to_string()
    }
}

/// The import circles among files (strongly connected sets of more than one file) that span
/// more than one module folder: `folder, folder: file, file, ...`.
fn circles_across_folders<'a>(imports: &'a [guards::FileImport]) -> Vec<String> {
    let mut edges: BTreeMap<&'a str, Vec<&'a str>> = BTreeMap::new();
    for i in imports {
        edges.entry(&i.file).or_default().push(&i.to_file);
        edges.entry(&i.to_file).or_default();
    }
    // Files that reach each other, by reachability both ways (the graph is a few hundred files).
    let reach = |from: &'a str| {
        let mut seen = std::collections::BTreeSet::from([from]);
        let mut stack = vec![from];
        while let Some(f) = stack.pop() {
            for &to in &edges[f] {
                if seen.insert(to) {
                    stack.push(to);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, _> = edges.keys().map(|&f| (f, reach(f))).collect();
    let mut out = Vec::new();
    let mut placed = std::collections::BTreeSet::new();
    for &file in edges.keys() {
        if !placed.insert(file) {
            continue;
        }
        let circle: Vec<&str> =
            reached[file].iter().copied().filter(|&other| other == file || reached[other].contains(file)).collect();
        placed.extend(circle.iter().copied());
        let folders: std::collections::BTreeSet<_> = circle.iter().map(|f| module_folder(f, &edges)).collect();
        if folders.len() > 1 {
            out.push(format!("{}: {}", folders.into_iter().collect::<Vec<_>>().join(", "), circle.join(", ")));
        }
    }
    out
}

#[test]
fn no_import_circle_crosses_folders() {
    let imports = guards::file_imports(&guards::Options::new(workspace())).unwrap();
    assert!(imports.len() > 200, "the file graph was read ({} references)", imports.len());
    let circles = circles_across_folders(&imports);
    assert!(circles.is_empty(), "import circles across folders:\n{}", circles.join("\n"));
}

#[test]
fn a_circle_across_folders_is_caught() {
    // The relay (floor 11) naming the proxy (floor 14), which uses the relay: one circle
    // through the files of several folders.
    let dir = tempfile::tempdir().unwrap();
    crate::support::copy_dir(&workspace().join("src"), &dir.path().join("src"));
    std::fs::copy(workspace().join("Cargo.toml"), dir.path().join("Cargo.toml")).unwrap();
    let order = dir.path().join("src/relay/order.rs");
    let mut text = std::fs::read_to_string(&order).unwrap();
    text.push_str("\n#[allow(unused_imports)]\nuse crate::proxy::Upstreams;\n");
    std::fs::write(&order, text).unwrap();
    let imports = guards::file_imports(&guards::Options::new(dir.path())).unwrap();
    let circles = circles_across_folders(&imports);
    assert_eq!(circles.len(), 1, "{circles:?}");
    let (folders, files) = circles[0].split_once(": ").unwrap();
    assert!(folders.contains("src/proxy") && folders.contains("src/relay"), "{}", circles[0]);
    assert!(files.contains("src/relay/order.rs") && files.contains("src/proxy/mod.rs"), "{}", circles[0]);
}
