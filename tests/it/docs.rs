//! The documentation agrees with what it describes.
//!
//! - The configuration reference (`docs/reference/configuration.md`) names exactly the keys of
//!   `config/default.toml`, those set and those documented commented out, and gives the shipped
//!   value of every key the file sets; the file names every key the gateway reads.
//! - The README's source map names every top-level entry of `src/`, and nothing that is gone.
//! - CI (`.ci/run`) runs the test command the README gives.
//! - Every relative link in `README.md` and `docs/` leads to a file that exists, and to a heading
//!   of it when the link names one.
//!
//! The Markdown pages are read at run time, so editing them needs no rebuild.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use figment::Figment;
use figment::providers::{Format, Toml};
use serde_json::Value;

use crate::support::pages;

const CONFIG_FILE: &str = "config/default.toml";
const CONFIG_DOC: &str = "docs/reference/configuration.md";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// A Markdown table row's cells; a `|` between backticks belongs to its cell.
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let (mut cells, mut cell, mut code) = (Vec::new(), String::new(), false);
    for c in inner.chars() {
        match c {
            '`' => {
                code = !code;
                cell.push(c);
            }
            '|' if !code => cells.push(std::mem::take(&mut cell).trim().to_owned()),
            _ => cell.push(c),
        }
    }
    cells.push(cell.trim().to_owned());
    cells
}

/// The text between backticks, in order.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `section.key`, as the reference writes keys.
fn is_dotted_key(s: &str) -> bool {
    s.split_once('.').is_some_and(|(section, key)| is_name(section) && is_name(key))
}

/// What `config/default.toml` holds: every key it sets, with its value (as the gateway's own
/// TOML reader sees the file), and every key it documents commented out (`# key = value` in a
/// section), the optional keys without a default.
struct ConfigFile {
    set: BTreeMap<String, Value>,
    commented: BTreeSet<String>,
}

impl ConfigFile {
    fn read() -> Self {
        let text = read(CONFIG_FILE);
        let sections: BTreeMap<String, BTreeMap<String, Value>> =
            Figment::from(Toml::string(&text)).extract().expect("config/default.toml parses");
        let set: BTreeMap<String, Value> = sections
            .iter()
            .flat_map(|(section, keys)| keys.iter().map(move |(key, v)| (format!("{section}.{key}"), v.clone())))
            .collect();

        // By hand: the commented-out keys (no TOML reader sees comments), and, as a check on
        // this reading, the keys set, which must come out as the TOML reader's.
        let (mut section, mut by_hand, mut commented) = (String::new(), BTreeSet::new(), BTreeSet::new());
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.trim().to_owned();
                continue;
            }
            let (commented_out, assignment) = match line.strip_prefix('#') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            let Some((key, value)) = assignment.split_once('=') else { continue };
            let key = key.trim();
            if !is_name(key) || value.trim().is_empty() {
                continue;
            }
            assert!(!section.is_empty(), "{CONFIG_FILE}: `{key}` outside a section");
            let dotted = format!("{section}.{key}");
            if commented_out {
                commented.insert(dotted);
            } else {
                by_hand.insert(dotted);
            }
        }
        assert_eq!(by_hand, set.keys().cloned().collect::<BTreeSet<_>>(), "the hand reading of {CONFIG_FILE}");
        assert!(set.len() > 50, "{CONFIG_FILE} read as {} keys", set.len());
        let both: Vec<_> = commented.intersection(&by_hand).collect();
        assert!(both.is_empty(), "{CONFIG_FILE}: keys both set and commented out: {both:?}");
        ConfigFile { set, commented }
    }

    fn all_keys(&self) -> BTreeSet<String> {
        self.set.keys().chain(&self.commented).cloned().collect()
    }
}

/// The key tables of the configuration reference: (keys of the row, default cell), for every
/// table row whose first cell names `section.key` keys and nothing else.
fn reference_rows() -> Vec<(Vec<String>, String)> {
    let doc = read(CONFIG_DOC);
    let mut rows = Vec::new();
    for line in doc.lines().filter(|l| l.trim_start().starts_with('|')) {
        let cells = cells(line);
        let keys: Vec<&str> = code_spans(&cells[0]).into_iter().filter(|s| is_dotted_key(s)).collect();
        if keys.is_empty() {
            continue;
        }
        assert!(cells.len() >= 3, "{CONFIG_DOC}: a key row has key, default and meaning: {line}");
        rows.push((keys.into_iter().map(str::to_owned).collect(), cells[1].clone()));
    }
    rows
}

#[test]
fn configuration_reference_names_every_key_of_default_toml() {
    let file = ConfigFile::read().all_keys();
    let mut documented = BTreeSet::new();
    for (keys, _) in reference_rows() {
        for key in keys {
            assert!(documented.insert(key.clone()), "{CONFIG_DOC} names `{key}` twice");
        }
    }
    let missing: Vec<_> = file.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&file).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{CONFIG_DOC} and {CONFIG_FILE} disagree.\n  keys of the file missing from the reference: {missing:?}\n  \
         keys in the reference the file lacks: {unknown:?}"
    );
}

/// How a value of the file is written in the reference's default column: a string as itself
/// (an empty one as `""`), an array as its elements (an empty one as `[]`).
fn written(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) if s.is_empty() => vec!["\"\"".to_owned()],
        Value::String(s) => vec![s.clone()],
        Value::Array(items) if items.is_empty() => vec!["[]".to_owned()],
        Value::Array(items) => items.iter().flat_map(written).collect(),
        other => vec![other.to_string()],
    }
}

fn same_value(doc: &str, file: &str) -> bool {
    doc == file || matches!((doc.parse::<f64>(), file.parse::<f64>()), (Ok(a), Ok(b)) if a == b)
}

#[test]
fn configuration_reference_gives_the_shipped_defaults() {
    let file = ConfigFile::read();
    for (keys, default) in reference_rows() {
        let [key] = keys.as_slice() else { continue };
        let Some(value) = file.set.get(key) else {
            assert!(file.commented.contains(key), "{key} is not in {CONFIG_FILE}");
            continue;
        };
        let expected = written(value);
        let given = code_spans(&default);
        assert!(
            given.len() == expected.len() && given.iter().zip(&expected).all(|(d, f)| same_value(d, f)),
            "{CONFIG_DOC}: the default of `{key}` is {given:?}; {CONFIG_FILE} ships {expected:?}"
        );
    }
}

#[test]
fn default_toml_names_every_key_the_gateway_reads() {
    let config = crate::support::config_with("sqlite://unused.db", &[]);
    let mut read_by_gateway = BTreeSet::new();
    if let Value::Object(sections) = serde_json::to_value(&config).unwrap() {
        for (section, fields) in sections {
            if let Value::Object(fields) = fields {
                read_by_gateway.extend(fields.keys().map(|k| format!("{section}.{k}")));
            }
        }
    }
    assert!(read_by_gateway.len() > 50, "the configuration serialised as {} keys", read_by_gateway.len());
    let file = ConfigFile::read().all_keys();
    let missing: Vec<_> = read_by_gateway.difference(&file).collect();
    let unknown: Vec<_> = file.difference(&read_by_gateway).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{CONFIG_FILE} and the gateway's configuration disagree.\n  read by the gateway, not in the file: \
         {missing:?}\n  in the file, not read by the gateway: {unknown:?}"
    );
}

/// The README's `## Source map` section.
fn source_map() -> String {
    let readme = read("README.md");
    let start = readme.find("\n## Source map\n").expect("README.md has a `## Source map` section");
    let section = &readme[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 4);
    section[..end].to_owned()
}

#[test]
fn the_readme_source_map_names_every_top_level_entry_of_src() {
    let map = source_map();
    // The first code span of each list item is the entry it describes.
    let listed: BTreeSet<String> = map
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .filter_map(|item| code_spans(item).first().map(|s| s.to_string()))
        .collect();
    let mut in_src = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("src")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() {
            in_src.insert(format!("src/{name}/"));
        } else if name.ends_with(".rs") {
            in_src.insert(format!("src/{name}"));
        }
    }
    let missing: Vec<_> = in_src.difference(&listed).collect();
    assert!(missing.is_empty(), "README.md's source map lacks {missing:?}");
    let gone: Vec<_> = listed.iter().filter(|p| p.starts_with("src/") && !in_src.contains(*p)).collect();
    assert!(gone.is_empty(), "README.md's source map lists {gone:?}, which src/ does not hold");
    for folder in ["guards/", "examples/", "scripts/", "deploy/", "tests/"] {
        assert!(listed.contains(folder), "README.md's source map has a line for `{folder}`");
        assert!(root().join(folder).is_dir(), "{folder} exists");
    }
}

/// The command lines of the README's quick start (the first `sh` block), comments cut.
fn quick_start_commands() -> Vec<String> {
    let readme = read("README.md");
    let start = readme.find("```sh\n").expect("the README has an `sh` block") + "```sh\n".len();
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    block.lines().map(|l| l.split(" #").next().unwrap().trim().to_owned()).filter(|l| !l.is_empty()).collect()
}

#[test]
fn ci_runs_the_readme_test_command() {
    let commands = quick_start_commands();
    assert!(commands.iter().any(|c| c == "cargo run -- serve --demo"), "the quick start serves the demo: {commands:?}");
    let test = commands.iter().find(|c| c.starts_with("cargo test")).expect("the quick start gives the test command");
    let ci = read(".ci/run");
    let line = ci
        .lines()
        .skip_while(|l| l.trim() != "# The README's test command:")
        .nth(1)
        .expect(".ci/run marks the README's test command");
    assert_eq!(line.trim().strip_suffix(" --locked"), Some(test.as_str()), ".ci/run runs `{test}` (with --locked)");
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (outside fenced blocks).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Targets of inline links `[text](target)` outside fenced blocks and code spans.
fn link_targets(markdown: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn links_between_the_pages_resolve() {
    let pages = pages();
    let by_path: BTreeMap<&str, &str> = pages.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    assert!(by_path.contains_key("docs/README.md"), "docs/ has its table of contents");
    let mut checked = 0;
    for (path, text) in &pages {
        for (line, target) in link_targets(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target.as_str(), ""));
            let base = Path::new(path).parent().unwrap();
            let joined = if file.is_empty() { Path::new(path).to_path_buf() } else { base.join(file) };
            // Normalise `..` lexically: the target must name a file of this repository.
            let mut parts: Vec<String> = Vec::new();
            for part in joined.components() {
                match part {
                    std::path::Component::ParentDir => {
                        assert!(parts.pop().is_some(), "{path}:{line}: `{target}` leaves the repository");
                    }
                    std::path::Component::CurDir => {}
                    other => parts.push(other.as_os_str().to_string_lossy().into_owned()),
                }
            }
            let resolved = parts.join("/");
            assert!(root().join(&resolved).exists(), "{path}:{line}: `{target}`: {resolved} does not exist");
            if !fragment.is_empty() {
                let page = by_path
                    .get(resolved.as_str())
                    .unwrap_or_else(|| panic!("{path}:{line}: `{target}`: an anchor into a page that is not checked"));
                assert!(
                    anchors(page).contains(fragment),
                    "{path}:{line}: `{target}`: {resolved} has no heading `#{fragment}`"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} links found");
}

#[test]
fn the_link_rules_read_markdown_as_github_does() {
    assert_eq!(anchor(" tools/call through the whole stack"), "toolscall-through-the-whole-stack");
    assert_eq!(
        anchor(" Selecting plugin roots (the `io.scopegate/selectedRoots` extension)"),
        "selecting-plugin-roots-the-ioscopegateselectedroots-extension"
    );
    assert_eq!(anchor(" Upstream OAuth: rmcp's protocol"), "upstream-oauth-rmcps-protocol");
    let links = link_targets("[a](x.md) `[b](not-a-link)` [c](y.md#z)\n```\n[d](fenced.md)\n```\n");
    assert_eq!(links, vec![(1, "x.md".to_owned()), (1, "y.md#z".to_owned())]);
    assert_eq!(cells("| `a.b` | `x|y` | z |"), vec!["`a.b`", "`x|y`", "z"]);
    assert_eq!(written(&serde_json::json!(["PATH", "HOME"])), vec!["PATH", "HOME"]);
    assert!(same_value("200", "200.0") && !same_value("200", "201"));
}
