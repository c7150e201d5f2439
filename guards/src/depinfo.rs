//! rustc's dep-info (`--emit=dep-info`, cargo's `deps/*.d`): the ground truth of which files a
//! crate was compiled from, to compare with the files the guard parses.

use std::path::{Component, Path, PathBuf};

/// The rules of a Makefile-syntax dep-info: `target: dep dep ...`, a space in a path escaped
/// as `\ `, a line ending in `\` continued on the next; comments (`# env-dep:...`) skipped.
pub fn dep_info_rules(text: &str) -> Vec<(String, Vec<String>)> {
    let joined = text.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut rules = Vec::new();
    for line in joined.lines() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = Vec::new();
        let mut word = String::new();
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => word.extend(chars.next()),
                ' ' | '\t' => words.extend((!word.is_empty()).then(|| std::mem::take(&mut word))),
                _ => word.push(c),
            }
        }
        words.extend((!word.is_empty()).then_some(word));
        // The target ends at the first word ending in `:`.
        let Some(colon) = words.iter().position(|w| w.ends_with(':')) else { continue };
        let mut target = words[..=colon].join(" ");
        target.pop();
        rules.push((target, words.split_off(colon + 1)));
    }
    rules
}

/// `path` with `.` and `..` resolved by name (dep-info writes `src/../config/default.toml`).
pub fn normalise_path(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}
