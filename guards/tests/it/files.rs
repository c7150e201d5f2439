//! The files the guard parses are the files rustc compiles: for each fixture, rustc's own
//! dep-info (`--emit=dep-info`) under every cfg combination tried lists the module files, and
//! the guard's `report.files` must hold every one of them (it does not know the build's cfgs,
//! so it parses each file any of them selects) and none that rustc never reads.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{fixture, run};

/// The `.rs` files rustc reads for the fixture crate `tests/fixtures/<fixture>` with these
/// cfgs set (`--cfg X` each), relative to the fixture root: it runs
/// `rustc --edition 2024 --crate-type lib --emit=dep-info=<tmp> src/lib.rs` in the fixture.
pub fn rustc_files(fixture_name: &str, cfgs: &[&str]) -> BTreeSet<String> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let root = fixture(fixture_name);
    let dep_info = TempFile(std::env::temp_dir().join(format!(
        "guards-files-{}-{}-{fixture_name}.d",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )));
    let mut emit = std::ffi::OsString::from("--emit=dep-info=");
    emit.push(&dep_info.0);
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.args(["--edition", "2024", "--crate-type", "lib"]).arg(emit).current_dir(&root);
    for cfg in cfgs {
        cmd.args(["--cfg", cfg]);
    }
    let out = cmd.arg("src/lib.rs").output().expect("rustc runs");
    assert!(
        out.status.success(),
        "rustc rejects fixture {fixture_name} with cfgs {cfgs:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&dep_info.0).unwrap();
    // The first rule: the dep-info file itself, depending on every source read.
    let (_, deps) =
        guards::dep_info_rules(&text).into_iter().next().unwrap_or_else(|| panic!("empty dep-info:\n{text}"));
    deps.into_iter()
        .filter(|d| d.ends_with(".rs"))
        .map(|d| {
            let path = guards::normalise_path(&root.join(&d));
            let rel = path.strip_prefix(&root).unwrap_or_else(|_| panic!("{d} is outside the fixture"));
            rel.to_string_lossy().replace('\\', "/")
        })
        .collect()
}

/// Removed when dropped, so a failing assertion leaves no dep-info behind.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// No cfg, each cfg alone, and all of them.
fn cfg_combinations<'a>(cfgs: &[&'a str]) -> Vec<Vec<&'a str>> {
    let mut all = vec![Vec::new()];
    all.extend(cfgs.iter().map(|c| vec![*c]));
    if cfgs.len() > 1 {
        all.push(cfgs.to_vec());
    }
    all
}

/// The guard's files hold every file rustc reads under each cfg combination, and none of
/// `decoys` (files rustc reads under none of them).
fn assert_parses_what_rustc_compiles(name: &str, cfgs: &[&str], decoys: &[&str]) {
    let parsed: BTreeSet<String> = run(name).files.into_iter().collect();
    let mut problems = Vec::new();
    let mut compiled_any = BTreeSet::new();
    for combination in cfg_combinations(cfgs) {
        let compiled = rustc_files(name, &combination);
        assert!(compiled.contains("src/lib.rs"), "{name}: rustc's dep-info lists no src/lib.rs: {compiled:?}");
        let missing: Vec<&String> = compiled.difference(&parsed).collect();
        if !missing.is_empty() {
            problems.push(format!("with cfgs {combination:?} rustc compiles, the guard does not parse: {missing:?}"));
        }
        compiled_any.extend(compiled);
    }
    for decoy in decoys {
        assert!(root_has(name, decoy), "{name}: decoy {decoy} does not exist");
        assert!(!compiled_any.contains(*decoy), "{name}: {decoy} is no decoy, rustc compiles it");
        if parsed.contains(*decoy) {
            problems.push(format!("the guard parses {decoy}, which rustc never compiles"));
        }
    }
    assert!(
        problems.is_empty(),
        "{name}: the guard's files are not rustc's\n  {}\n  guard parsed: {parsed:?}\n  rustc compiled (any cfg): {compiled_any:?}",
        problems.join("\n  ")
    );
}

fn root_has(name: &str, file: &str) -> bool {
    fixture(name).join(file).is_file()
}

fn set(files: &[&str]) -> BTreeSet<String> {
    files.iter().map(|f| (*f).to_owned()).collect()
}

#[test]
fn path_inline_parses_what_rustc_compiles() {
    // What rustc reads (checked here so a broken harness cannot pass for a broken guard): the
    // path of a `#[path]` in an inline module starts at the inline module's directory, and in
    // a non-mod-rs file (src/a.rs) at the directory named after the file's module (src/a/).
    assert_eq!(
        rustc_files("path_inline", &[]),
        set(&["src/lib.rs", "src/a.rs", "src/a/b/c.rs", "src/outer/inner_file.rs"])
    );
    assert_parses_what_rustc_compiles(
        "path_inline",
        &[],
        &["src/inner_file.rs", "src/c.rs", "src/a/c.rs", "src/b/c.rs"],
    );
}

#[test]
fn path_cfg_attr_parses_what_rustc_compiles() {
    assert_eq!(rustc_files("path_cfg_attr", &[]), set(&["src/lib.rs", "src/m.rs", "src/n.rs"]));
    assert_eq!(
        rustc_files("path_cfg_attr", &["feature_x", "feature_y"]),
        set(&["src/lib.rs", "src/real_x.rs", "src/y_alt.rs"])
    );
    assert_parses_what_rustc_compiles("path_cfg_attr", &["feature_x", "feature_y"], &[]);
}
