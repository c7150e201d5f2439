//! Type privacy (guard rows G1 and G2): code outside the gateway, such as a SaaS's tools
//! module, can't name the raw identity types, forge an `McpCallContext`, or take the pool out
//! of the store. Each case in tests/ui is compiled by rustc as a crate of its own against the
//! libraries this build compiled (scopegate, rmcp) and must fail with the errors its `.stderr`
//! lists: each `error[..]` line, and where in the case it points.
//!
//! After changing a case, refresh the lists with `SCOPEGATE_UI=overwrite cargo test --test it
//! type_privacy` and review the diff.

use std::path::Path;
use std::process::Command;

use crate::support::built_libraries;

/// What of rustc's output a case's `.stderr` holds: the errors, and their places in the case.
fn errors(stderr: &str) -> String {
    let kept: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| (l.starts_with("error") && !l.starts_with("error: aborting")) || l.starts_with("--> tests/ui/"))
        .collect();
    kept.join("\n") + "\n"
}

#[test]
fn outside_code_cannot_reach_raw_identity_or_the_pool() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let out = tempfile::tempdir().unwrap();
    let overwrite = std::env::var("SCOPEGATE_UI").is_ok_and(|v| v == "overwrite");
    let mut cases: Vec<_> = std::fs::read_dir(root.join("tests/ui"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 4, "the cases are in tests/ui: {cases:?}");
    let (scopegate, rmcp) = built_libraries();
    for case in cases {
        let name = case.strip_prefix(root).unwrap();
        let compiled = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
            .current_dir(root)
            .args(["--edition", "2024", "--crate-type", "bin", "--emit=metadata", "--error-format=human"])
            .arg("--out-dir")
            .arg(out.path())
            .arg("-L")
            .arg(format!("dependency={}", deps.display()))
            .arg("--extern")
            .arg(format!("scopegate={}", scopegate.display()))
            .arg("--extern")
            .arg(format!("rmcp={}", rmcp.display()))
            .arg(name)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&compiled.stderr);
        assert!(!compiled.status.success(), "{} compiles: outside code reached what it must not", name.display());
        let expected_file = case.with_extension("stderr");
        let got = errors(&stderr);
        if overwrite {
            std::fs::write(&expected_file, &got).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_file).unwrap_or_default();
        assert_eq!(got, expected, "{}: not the expected errors; rustc said:\n{stderr}", name.display());
    }
}
