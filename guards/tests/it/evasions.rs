//! The evasions found from outside (one fixture per class, several forms each): every one
//! fails the build naming the tool, the path and the line; and what must pass, passes.

use guards::{FindingKind, Report};

use crate::{fixture, hops, run};

/// `file:line` of the first line of a fixture's file containing `needle`.
fn at(name: &str, file: &str, needle: &str) -> String {
    let text = std::fs::read_to_string(fixture(name).join(file)).unwrap();
    let line = text.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("{file}: no {needle:?}")) + 1;
    format!("{file}:{line}")
}

/// The findings as `root | row | forbidden | last hop` lines, sorted.
fn summary(r: &Report) -> Vec<String> {
    let mut v: Vec<String> = r
        .findings
        .iter()
        .map(|f| {
            format!("{} | {} | {} | {}", f.root, f.guard_row, f.forbidden, hops(f).last().cloned().unwrap_or_default())
        })
        .collect();
    v.sort();
    v
}

/// Asserts exactly these findings, and that the build failure message names each tool and
/// each place.
fn expect(r: &Report, want: &[String]) {
    let mut want = want.to_vec();
    want.sort();
    assert_eq!(summary(r), want, "{}", guards::finding_lines(r).join("\n"));
    let msg = guards::failure_message(r).expect("the build fails");
    for f in &r.findings {
        assert!(msg.contains(&format!("{} reaches", f.root)), "{msg}");
        let last = f.path.last().unwrap();
        assert!(msg.contains(&format!("({}:{})", last.file, last.line)), "{msg}");
    }
}

fn tool_names(r: &Report) -> Vec<String> {
    let mut v: Vec<String> = r.tools.iter().map(|t| t.name.clone()).collect();
    v.sort();
    v
}

#[test]
fn a_tool_outside_the_tool_modules_or_written_by_a_macro() {
    let name = "tool_elsewhere";
    let r = guards::check(&guards::Options::new(fixture(name)).tool_modules(["crate::tools"])).unwrap();
    // Every tool is a root wherever it is written: a #[tool_router] impl in another module
    // (each of its fns, #[tool] or not) or in a fn body, a #[tool] imported under another name,
    // and a fn that builds a route by hand.
    assert_eq!(
        tool_names(&r),
        [
            "FarmTools::elsewhere",
            "FarmTools::in_body",
            "FarmTools::listed",
            "FarmTools::renamed",
            "FarmTools::unmarked",
            "crate::other::hand_built"
        ]
    );
    let f = |root: &str, row: &str, item: &str, hop: String| format!("{root} | {row} | {item} | {hop}");
    expect(
        &r,
        &[
            f(
                "FarmTools::elsewhere",
                "G5",
                "tokio::spawn",
                format!("call tokio::spawn {}", at(name, "src/other.rs", "tokio::spawn")),
            ),
            f(
                "FarmTools::unmarked",
                "G2",
                "sqlx::PgPool",
                format!("type sqlx::PgPool {}", at(name, "src/other.rs", "sqlx::PgPool")),
            ),
            f(
                "FarmTools::renamed",
                "G5",
                "std::thread::spawn",
                format!("call std::thread::spawn {}", at(name, "src/other.rs", "std::thread::spawn")),
            ),
            // A #[tool_router] impl written inside a fn body.
            f(
                "FarmTools::in_body",
                "G5",
                "tokio::task::spawn_local",
                format!("call tokio::task::spawn_local {}", at(name, "src/other.rs", "spawn_local")),
            ),
            // A route built by hand: the fn that builds it is a root.
            f(
                "crate::other::hand_built",
                "G2",
                "sqlx::any::AnyPoolOptions",
                format!("type sqlx::any::AnyPoolOptions {}", at(name, "src/other.rs", "in a hand-built route")),
            ),
            // Written by macros, at item level or in a body: not walked, so the build fails
            // at the macro.
            f(
                &format!("macro make_tool! ({})", at(name, "src/generated.rs", "make_tool!(from_a_body)")),
                "G9",
                "crate::generated::make_tool!",
                format!(
                    "macro crate::generated::make_tool! {}",
                    at(name, "src/generated.rs", "make_tool!(from_a_body)")
                ),
            ),
            f(
                &format!("macro make_tool! ({})", at(name, "src/generated.rs", "make_tool!(hidden)")),
                "G9",
                "crate::generated::make_tool!",
                format!("macro crate::generated::make_tool! {}", at(name, "src/generated.rs", "make_tool!(hidden)")),
            ),
            f(
                &format!("macro wrap_impl! ({})", at(name, "src/generated.rs", "wrap_impl! {")),
                "G9",
                "crate::generated::wrap_impl!",
                format!("macro crate::generated::wrap_impl! {}", at(name, "src/generated.rs", "wrap_impl! {")),
            ),
        ],
    );
    let make = r.findings.iter().find(|f| f.forbidden == "crate::generated::make_tool!").unwrap();
    assert!(make.reason.contains("in its macro_rules! definition"), "{}", make.reason);
    let wrap = r.findings.iter().find(|f| f.forbidden == "crate::generated::wrap_impl!").unwrap();
    assert!(wrap.reason.contains("in its input"), "{}", wrap.reason);
    // A macro-written tool cannot be allowed away: allow_unresolved does not cover it.
    assert!(r.findings.iter().all(|f| f.kind == FindingKind::Unresolved || f.guard_row != "G9"));
}

#[test]
fn forbidden_things_never_named_as_types() {
    let name = "unnamed_connectors";
    let r = run(name);
    let line = |needle: &str| at(name, "src/lib.rs", needle);
    let f = |root: &str, item: &str, hop: String| format!("Farm::{root} | G2 | {item} | {hop}");
    expect(
        &r,
        &[
            f("builder", ".connect()", format!("call .connect() {}", line("AnyPoolOptions::new().connect"))),
            f(
                "builder",
                "sqlx::any::AnyPoolOptions",
                format!("type sqlx::any::AnyPoolOptions {}", line("AnyPoolOptions::new().connect")),
            ),
            f("from_str", ".connect()", format!("call .connect() {}", line("AnyConnectOptions::from_str"))),
            f(
                "from_str",
                "sqlx::any::AnyConnectOptions",
                format!("type sqlx::any::AnyConnectOptions {}", line("AnyConnectOptions::from_str")),
            ),
            f(
                "parsed",
                "sqlx::postgres::PgConnectOptions",
                format!("type sqlx::postgres::PgConnectOptions {}", line("PgConnectOptions>()")),
            ),
            // The helper's signature and body name what the tool never does.
            f(
                "through_helper",
                "sqlx::ConnectOptions",
                format!("type sqlx::ConnectOptions {}", line("-> impl sqlx::ConnectOptions")),
            ),
            f(
                "through_helper",
                "sqlx::sqlite::SqliteConnectOptions",
                format!("type sqlx::sqlite::SqliteConnectOptions {}", line("SqliteConnectOptions>()")),
            ),
            f("through_helper", ".connect()", format!("call .connect() {}", line("opts.connect()"))),
            f("lazy", ".connect_lazy()", format!("call .connect_lazy() {}", line("SqlitePoolOptions::new()"))),
            f(
                "lazy",
                "sqlx::sqlite::SqlitePoolOptions",
                format!("type sqlx::sqlite::SqlitePoolOptions {}", line("SqlitePoolOptions::new()")),
            ),
        ],
    );
}

#[test]
fn code_that_runs_without_being_called_by_name() {
    let name = "implicit_calls";
    let r = run(name);
    let line = |needle: &str| at(name, "src/lib.rs", needle);
    let f = |root: &str, row: &str, item: &str, needle: &str| {
        let kind = if item.starts_with("sqlx") { "type" } else { "call" };
        format!("Farm::{root} | {row} | {item} | {kind} {item} {}", line(needle))
    };
    expect(
        &r,
        &[
            f("displayed", "G2", "sqlx::PgPool", "sqlx::PgPool::connect_lazy"),
            // A crate macro_rules! called in the body: its rules are read for what they write.
            format!("Farm::by_macro | G5 | spawn | call spawn {}", line("// written by the macro")),
            f("dropped", "G5", "tokio::spawn", "        tokio::spawn(async {});"),
            f("defaulted", "G5", "std::thread::spawn", "        std::thread::spawn(|| ());"),
            f("awaited", "G5", "tokio::task::spawn_blocking", "spawn_blocking"),
            f("derefed", "G2", "sqlx::AnyPool", "AnyPool::connect_lazy"),
            f("inferred", "G5", "tokio::task::spawn_local", "spawn_local"),
            f("lazy_static", "G5", "std::thread::spawn", "// on first touch"),
            f("const_fn_pointer", "G5", "tokio::spawn", "= tokio::spawn;"),
        ],
    );
    // The paths say how: the Drop impl of a type the tool creates, a static's initialiser.
    let dropped = r.findings.iter().find(|f| f.root == "Farm::dropped").unwrap();
    assert!(hops(dropped).iter().any(|h| h.starts_with("impl Drop for Guard")), "{:?}", hops(dropped));
    let lazy = r.findings.iter().find(|f| f.root == "Farm::lazy_static").unwrap();
    assert!(hops(lazy).iter().any(|h| h.starts_with("static crate::STARTED")), "{:?}", hops(lazy));
}

#[test]
fn attributes_and_module_paths() {
    let name = "attribute_paths";
    let r = run(name);
    let f = |root: &str, row: &str, item: &str, kind: &str, file: &str, needle: &str| {
        format!("Farm::{root} | {row} | {item} | {kind} {item} {}", at(name, file, needle))
    };
    expect(
        &r,
        &[
            // serde calls what its attributes name.
            f("with_args", "G5", "tokio::spawn", "call", "src/lib.rs", "tokio::spawn"),
            f("with_args", "G2", "sqlx::PgPool", "type", "src/lib.rs", "PgPool::connect_lazy"),
            f("checked", "G5", "std::thread::spawn", "call", "src/lib.rs", "std::thread::spawn"),
            // The file rustc compiles, not the decoy beside it.
            f("inline_path", "G5", "tokio::task::spawn_blocking", "call", "src/inline/real.rs", "spawn_blocking"),
            // Every file a cfg_attr may put in place.
            f("cfg_path", "G2", "sqlx::SqlitePool", "type", "src/cfg/fast.rs", "SqlitePool"),
            // include! of an expression, and of a whole impl block holding a tool.
            f("included_expr", "G5", "std::thread::spawn", "call", "src/expr.rs", "std::thread::spawn"),
            f("included_tool", "G2", "sqlx::PgPool", "type", "src/more_tools.rs", "sqlx::PgPool"),
            // A file module declared in a body.
            f("block_module", "G5", "std::thread::spawn", "call", "src/blk.rs", "from a block module"),
        ],
    );
    for file in
        ["src/inline/real.rs", "src/cfg/fast.rs", "src/engine.rs", "src/expr.rs", "src/more_tools.rs", "src/blk.rs"]
    {
        assert!(r.files.iter().any(|f| f == file), "{file} not among {:?}", r.files);
    }
    assert!(!r.files.iter().any(|f| f == "src/real.rs"), "the decoy is not read: {:?}", r.files);
    let with = r.findings.iter().find(|f| f.forbidden == "sqlx::PgPool" && f.root == "Farm::with_args").unwrap();
    assert!(
        hops(with).iter().any(|h| h.starts_with("call #[serde(with = \"crate::codecs::pooled\")]")),
        "{:?}",
        hops(with)
    );
}

#[test]
fn names_that_hide_a_real_call() {
    let name = "shadowed_names";
    let r = run(name);
    let line = |needle: &str| at(name, "src/lib.rs", needle);
    let f = |root: &str, item: &str, needle: &str| format!("Farm::{root} | G5 | {item} | call {item} {}", line(needle));
    expect(
        &r,
        &[
            // Both cfg arms of `use .. as go` / `as start`, whichever is written last.
            f("cfg_arms", "tokio::spawn", "go(async {});"),
            f("cfg_arms_first", "std::thread::spawn", "start(|| ());"),
            // A binding of the same name elsewhere in the body hides nothing outside its scope.
            f("closure_param", "tokio::spawn", "// after the closure"),
            f("inner_block", "tokio::task::spawn_blocking", "offload(|| ());"),
            f("match_arm", "tokio::spawn", "// after the match"),
            // An item or a `use` in an inner block is in force in that block only.
            f("item_in_inner_block", "tokio::spawn", "// after the inner fn"),
            f("use_in_inner_block", "tokio::task::spawn_local", "// after the inner use"),
        ],
    );
}

#[test]
fn processes_are_refused_whatever_starts_them() {
    let name = "processes";
    let r = run(name);
    let line = |needle: &str| at(name, "src/lib.rs", needle);
    expect(
        &r,
        &[
            format!(
                "Farm::status | G5 | std::process::Command | type std::process::Command {}",
                line("std::process::Command::new")
            ),
            format!(
                "Farm::output | G5 | tokio::process::Command | type tokio::process::Command {}",
                line("Shell::new")
            ),
            format!(
                "Farm::helper | G5 | std::process::Child | type std::process::Child {}",
                line("Option<std::process::Child>")
            ),
        ],
    );
}

#[test]
fn a_vec_get_and_items_declared_in_a_body_pass() {
    let r = guards::check(&guards::Options::new(fixture("false_positives")).tool_modules(["crate::tools"])).unwrap();
    assert_eq!(tool_names(&r), ["FarmTools::local_items", "FarmTools::roles"]);
    assert!(r.findings.is_empty(), "{}", guards::finding_lines(&r).join("\n"));
}
