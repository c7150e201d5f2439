//! The command-line examples of the README and the book (`docs/`) run as written.
//!
//! The rule: every fenced block of README.md or of a Markdown page under `docs/` tagged `sh`
//! that has a line starting with `scopegate ` or `cargo run -- ` is an example, and runs whole,
//! by `sh -e`, with the built binary as `scopegate` (`cargo run -- ` stands for it, and so does
//! `docker compose exec -T gateway scopegate `: the CLI in the compose deployment), in a fresh
//! working folder, against a fresh database holding the demo data (what the quick start sets
//! up). Each command must succeed. A block that starts the server (`serve`) or an executor agent
//! (`executor`) is not run: neither exits (the `serve` and executor tests start them). Such lines
//! in a block tagged otherwise fail the test, so an example can't escape by its tag.
//!
//! A block with a line starting with `curl ` is an example of the admin API: it runs the same
//! way, with `scopegate serve --demo` running on the same database (as the quick start leaves
//! it) and `GW` set to its base URL, so the block's `${GW:-http://127.0.0.1:8080}` reaches it.

use std::path::Path;
use std::process::Command;

use crate::support::*;

struct Block {
    info: String,
    text: String,
    line: usize,
}

fn fenced_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        match (&mut open, trimmed.strip_prefix("```")) {
            (None, Some(info)) => open = Some(Block { info: info.trim().to_owned(), text: String::new(), line: n + 1 }),
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

/// The CLI in the gateway's container of the compose deployment.
const COMPOSE_CLI: &str = "docker compose exec -T gateway scopegate ";

fn is_cli_line(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("scopegate ") || line.starts_with("cargo run -- ") || is_api_line(line)
}

/// A request to the admin API of the gateway `serve --demo` runs.
fn is_api_line(line: &str) -> bool {
    line.trim_start().starts_with("curl ")
}

/// The gateway (`serve`) and the executor agent (`executor`) run until stopped.
fn starts_server(line: &str) -> bool {
    let line = line.trim_start();
    ["scopegate serve", "cargo run -- serve", "scopegate executor ", "cargo run -- executor "]
        .iter()
        .any(|start| line.starts_with(start))
}

/// The examples to run: (page, line of the block, script), the README's first and then the
/// pages of `docs/` in path order.
fn examples() -> Vec<(String, usize, String)> {
    let mut examples = Vec::new();
    for (page, text) in pages() {
        examples.extend(examples_of(&page, &text).into_iter().map(|(line, script)| (page.clone(), line, script)));
    }
    examples
}

/// The examples of one page: (line of the block, script).
fn examples_of(page: &str, markdown: &str) -> Vec<(usize, String)> {
    let mut examples = Vec::new();
    for block in fenced_blocks(markdown) {
        if !block.text.lines().any(is_cli_line) {
            continue;
        }
        assert_eq!(block.info, "sh", "{page} line {}: a block with CLI examples is tagged `sh`", block.line);
        if block.text.lines().any(starts_server) {
            continue;
        }
        let script: String = block
            .text
            .lines()
            .map(|l| match l.trim_start().strip_prefix("cargo run -- ") {
                Some(rest) => format!("scopegate {rest}\n"),
                None => format!("{}\n", l.replace(COMPOSE_CLI, "scopegate ")),
            })
            .collect();
        examples.push((block.line, script));
    }
    examples
}

#[test]
fn the_rule_finds_the_examples() {
    let examples = examples();
    let all: String = examples.iter().map(|(_, _, s)| s.as_str()).collect();
    for needle in [
        "scopegate admin ",
        "scopegate audit verify",
        "scopegate guards report",
        "scopegate token ",
        "curl ",
        "/admin/v1/tenants",
        // The first run of the compose deployment (docs/operations/deploy.md).
        "first-run-initech",
    ] {
        assert!(all.contains(needle), "the README's and the book's examples include `{needle}`");
    }
    assert!(examples.iter().any(|(page, _, _)| page.starts_with("docs/")), "the pages of docs/ are read");
    let blocks =
        fenced_blocks("text\n```sh\nscopegate admin tenant list\n```\n```sh\ncargo run -- serve --demo\n```\n");
    assert_eq!(blocks.len(), 2);
    assert!(blocks[0].text.lines().any(is_cli_line) && blocks[1].text.lines().any(starts_server));
}

async fn readme_examples_run_as_written(backend: Backend) {
    let bin = Path::new(env!("CARGO_BIN_EXE_scopegate"));
    let path = format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    for (page, line, script) in examples() {
        let test_db = TestDb::new(backend).await;
        let db = db_for(&config_with(&test_db.url, &[])).await;
        seed_demo(&db).await;
        db.close().await;
        let dir = tempfile::tempdir().unwrap();
        // An API example talks to the gateway of the quick start.
        let server = script.lines().any(is_api_line).then(|| Replica::demo(dir.path(), &test_db.url));
        let mut cmd = Command::new("sh");
        if let Some(server) = &server {
            cmd.env("GW", format!("http://{}", server.addr));
        }
        cmd.args(["-e", "-x", "-c", &script]).current_dir(dir.path());
        for (key, _) in std::env::vars() {
            if key.starts_with("SCOPEGATE_") {
                cmd.env_remove(key);
            }
        }
        let out = cmd
            .env("PATH", &path)
            .env("RUST_LOG", "warn")
            .env("SCOPEGATE_DATABASE__URL", &test_db.url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{page}: the block at line {line} fails as written:\n{script}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
both_dbs!(readme_cli_examples, readme_examples_run_as_written);
