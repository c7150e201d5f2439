//! Build-time dependency-graph guard for scopegate tools: parses a crate's sources, walks
//! every tool's dependency graph and reports each path to a forbidden type or call.
//!
//! Called from `build.rs`:
//!
//! ```no_run
//! // build.rs, inside `fn main()`:
//! let opts = guards::Options::new(std::env::var("CARGO_MANIFEST_DIR").unwrap())
//!     .tool_modules(["crate::tools", "crate::mcp"]) // optional: where tools live
//!     .extra_rules("guards.toml"); // optional: the crate's own additions
//! guards::run_build_script(&opts); // prints cargo: lines, panics on any finding
//! ```
//!
//! The build script also leaves the report in `OUT_DIR` (see [`write_reports`]), so the crate
//! can embed the report of the very sources it was built from:
//! `include_str!(concat!(env!("OUT_DIR"), "/guards-report.md"))`.
//!
//! Tools are fns with an attribute ending in `tool` (`#[tool]`, `#[rmcp::tool(..)]`, or one
//! imported under another name), every fn of a `#[tool_router]` impl, and any struct, enum or
//! impl carrying an attribute ending in `tool_set` (`#[scopegate::tool_set]`), wherever they
//! are written in the crate; and every `impl ServerHandler for X` in the tool modules. An
//! item-level macro of the crate that writes tool code fails the check. The walk, the rules
//! file and what the walk cannot see are described in `rules.toml` and in the report's residue.

#![forbid(unsafe_code)]

pub mod compiled;
pub mod compiled_report;
mod depinfo;
mod imports;
pub mod ir;
mod model;
mod report;
mod rules;
pub mod rustc;
mod sarif;
mod walk;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

pub use depinfo::{dep_info_rules, normalise_path};
pub use imports::{FileImport, Import, file_imports, imports};
pub use report::{
    BoundaryReport, Finding, FindingKind, Held, Hop, HopKind, Mark, REPORT_VERSION, Report, Residue, Site, ToolKind,
    ToolReport, TreeNode,
};
pub use rules::{
    AllowUnresolved, Boundary, DEFAULT_RULES, Discovery, Enforcement, ForbiddenCall, ForbiddenType, GuardRow,
    NameScope, Rules, UNRESOLVED_ROW,
};
pub use sarif::SARIF_SCHEMA;

/// Why the guard could not run (a run that finds violations is not an error: see [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// A file could not be read, or a declared module has no file.
    #[error("{path}: {message}")]
    Io {
        /// Path relative to the crate root.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// A source file does not parse.
    #[error("{path}:{line}: cannot parse: {message}")]
    Parse {
        /// Path relative to the crate root.
        path: String,
        /// 1-based line.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A rules file is malformed or inconsistent.
    #[error("rules ({origin}): {message}")]
    Rules {
        /// Which file.
        origin: String,
        /// What is wrong.
        message: String,
    },
}

/// What to check.
#[derive(Debug, Clone)]
pub struct Options {
    /// The crate root (the directory holding `Cargo.toml`); report paths are relative to it.
    pub crate_root: PathBuf,
    /// The entry file relative to the crate root; `None`: `src/lib.rs`, else `src/main.rs`.
    pub entry: Option<PathBuf>,
    /// Module paths (`crate::tools`) whose handler-trait impls are tool roots, with their
    /// submodules; empty: the whole crate. Tool-attributed fns, `#[tool_router]` impls and
    /// tool sets are roots wherever they are; types are walked across the whole crate.
    pub tool_modules: Vec<String>,
    /// The base rules file; `None`: [`DEFAULT_RULES`].
    pub rules: Option<PathBuf>,
    /// Files that add to the base rules.
    pub extra_rules: Vec<PathBuf>,
    /// Crate names code may use besides the dependencies `Cargo.toml` lists (for crates linked
    /// some other way). A path starting with a name that is neither is never called external.
    pub extern_crates: Vec<String>,
}

impl Options {
    /// Checks the crate at `crate_root` with the default rules and every module.
    pub fn new(crate_root: impl Into<PathBuf>) -> Self {
        Options {
            crate_root: crate_root.into(),
            entry: None,
            tool_modules: Vec::new(),
            rules: None,
            extra_rules: Vec::new(),
            extern_crates: Vec::new(),
        }
    }

    /// Adds crate names that are other crates besides the manifest's dependencies.
    pub fn extern_crates<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extern_crates.extend(names.into_iter().map(Into::into));
        self
    }

    /// Sets the entry file (relative to the crate root).
    pub fn entry(mut self, entry: impl Into<PathBuf>) -> Self {
        self.entry = Some(entry.into());
        self
    }

    /// Restricts where tools are looked for.
    pub fn tool_modules<I, S>(mut self, modules: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tool_modules = modules.into_iter().map(Into::into).collect();
        self
    }

    /// Replaces the base rules file (relative paths are taken from the crate root).
    pub fn rules(mut self, path: impl Into<PathBuf>) -> Self {
        self.rules = Some(path.into());
        self
    }

    /// Adds a rules file on top of the base.
    pub fn extra_rules(mut self, path: impl Into<PathBuf>) -> Self {
        self.extra_rules.push(path.into());
        self
    }

    fn under_root(&self, p: &Path) -> PathBuf {
        if p.is_absolute() { p.to_path_buf() } else { self.crate_root.join(p) }
    }

    pub(crate) fn entry_file(&self) -> PathBuf {
        match &self.entry {
            Some(e) => e.clone(),
            None if self.crate_root.join("src/lib.rs").is_file() => PathBuf::from("src/lib.rs"),
            None => PathBuf::from("src/main.rs"),
        }
    }

    /// Every input of a run (rules files and, after a run, sources): for `rerun-if-changed`.
    fn rules_files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.rules.iter().map(|p| self.under_root(p)).collect();
        v.extend(self.extra_rules.iter().map(|p| self.under_root(p)));
        v.push(self.crate_root.join("Cargo.toml"));
        v
    }
}

fn read_rules(opts: &Options, path: &Path) -> Result<Rules, GuardError> {
    let full = opts.under_root(path);
    let origin = path.display().to_string();
    let text =
        std::fs::read_to_string(&full).map_err(|e| GuardError::Io { path: origin.clone(), message: e.to_string() })?;
    Rules::parse(&text, &origin)
}

/// Loads the base rules and their extensions, merged and validated.
pub fn load_rules(opts: &Options) -> Result<Rules, GuardError> {
    let mut rules = match &opts.rules {
        Some(p) => read_rules(opts, p)?,
        None => Rules::parse(DEFAULT_RULES, "built-in rules.toml")?,
    };
    for extra in &opts.extra_rules {
        let more = read_rules(opts, extra)?;
        rules.extend(more, &extra.display().to_string())?;
    }
    rules.validate()?;
    Ok(rules)
}

/// The names code uses for the crate's dependencies (`[dependencies]` and every
/// `[target.*.dependencies]` of `Cargo.toml`, `-` written `_`), plus [`Options::extern_crates`].
/// Dev- and build-dependencies are not visible to the library's code, so they are not listed.
fn extern_crates(opts: &Options) -> Result<HashSet<String>, GuardError> {
    let manifest = opts.crate_root.join("Cargo.toml");
    let io = |message: String| GuardError::Io { path: "Cargo.toml".into(), message };
    let text = std::fs::read_to_string(&manifest).map_err(|e| {
        io(format!(
            "{e}: the walk needs the crate's dependencies to tell other crates' names from names it cannot resolve"
        ))
    })?;
    let doc: toml::Table = toml::from_str(&text).map_err(|e| io(format!("cannot parse: {e}")))?;
    let mut tables = vec![doc.get("dependencies")];
    if let Some(targets) = doc.get("target").and_then(toml::Value::as_table) {
        tables.extend(targets.values().map(|t| t.get("dependencies")));
    }
    let mut out: HashSet<String> = opts.extern_crates.iter().cloned().collect();
    for table in tables.into_iter().flatten() {
        let Some(table) = table.as_table() else {
            return Err(io("a dependencies section is not a table".into()));
        };
        out.extend(table.keys().map(|k| k.replace('-', "_")));
    }
    Ok(out)
}

/// Parses the crate and walks every tool; the report lists findings, it does not fail on them.
pub fn check(opts: &Options) -> Result<Report, GuardError> {
    let rules = load_rules(opts)?;
    check_with_rules(opts, &rules)
}

/// Like [`check`], with rules already loaded.
pub fn check_with_rules(opts: &Options, rules: &Rules) -> Result<Report, GuardError> {
    let entry = opts.entry_file();
    let krate = model::Crate::load(&opts.crate_root, &entry, extern_crates(opts)?)?;
    let walked = walk::walk_crate(&krate, rules, &opts.tool_modules);
    Ok(Report {
        generator: "scopegate-guards".into(),
        version: REPORT_VERSION.into(),
        entry: entry.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/"),
        tool_modules: opts.tool_modules.clone(),
        files: krate.files.clone(),
        guard_rows: rules.guard_row.clone(),
        findings: walked.findings,
        tools: walked.tools,
        boundaries: walked.boundaries,
        residue: report::residue().into_iter().chain(walked.residue).collect(),
    })
}

/// One line per finding: `G2 Server::run: tool ... -> field pool (src/x.rs:4) -> ...`.
pub fn finding_lines(report: &Report) -> Vec<String> {
    report
        .findings
        .iter()
        .map(|f| {
            let hops: Vec<String> =
                f.path.iter().map(|h| format!("{} {} ({})", h.kind.as_str(), h.label, h.location())).collect();
            format!(
                "[{}] {} reaches {} {}: {} | {}",
                f.guard_row,
                f.root,
                f.kind.verb(),
                f.forbidden,
                f.reason,
                hops.join(" -> ")
            )
        })
        .collect()
}

/// The build failure message, or `None` when there are no findings.
pub fn failure_message(report: &Report) -> Option<String> {
    if report.findings.is_empty() {
        return None;
    }
    let mut msg = format!("scopegate guards: {} forbidden path(s) from tools:\n", report.findings.len());
    for (i, f) in report.findings.iter().enumerate() {
        msg.push_str(&format!(
            "\n{}. [{}] {} reaches {} {}\n   why: {}\n",
            i + 1,
            f.guard_row,
            f.root,
            f.kind.verb(),
            f.forbidden,
            f.reason
        ));
        for h in &f.path {
            msg.push_str(&format!("   -> {} {} ({})\n", h.kind.as_str(), h.label, h.location()));
        }
    }
    Some(msg)
}

/// The Markdown copy [`write_reports`] writes.
pub const REPORT_MD: &str = "guards-report.md";
/// The JSON copy [`write_reports`] writes (it matches `report.schema.json`).
pub const REPORT_JSON: &str = "guards-report.json";
/// The SARIF 2.1.0 copy [`write_reports`] writes.
pub const REPORT_SARIF: &str = "guards-report.sarif";

/// Writes the report as Markdown, JSON and SARIF into `dir` ([`REPORT_MD`], [`REPORT_JSON`],
/// [`REPORT_SARIF`]).
/// The report holds paths relative to the crate root only, so the copies are the same on
/// every machine.
pub fn write_reports(report: &Report, dir: &Path) -> Result<(), GuardError> {
    let files = [(REPORT_MD, report.to_markdown()), (REPORT_JSON, report.to_json()), (REPORT_SARIF, report.to_sarif())];
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| GuardError::Io { path: path.display().to_string(), message: e.to_string() })?;
    }
    Ok(())
}

/// For `build.rs`: runs the check, prints `cargo:rerun-if-changed` for every input, writes
/// the report copies into `OUT_DIR` (when cargo sets it; see [`write_reports`]), prints a
/// `cargo:warning=` per finding, and panics (failing the build) with every full path when
/// anything is found or the check cannot run. The copies are written before failing, so a
/// failed build still leaves its report behind.
pub fn run_build_script(opts: &Options) {
    run_compiled_check_if_wrapped(opts);
    if let Some(out) = std::env::var_os("OUT_DIR") {
        install_checker(Path::new(&out));
    }
    for f in opts.rules_files() {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let report = match check(opts) {
        Ok(r) => r,
        Err(e) => panic!("scopegate guards could not run: {e}"),
    };
    for f in &report.files {
        println!("cargo:rerun-if-changed={}", opts.crate_root.join(f).display());
    }
    if let Some(out) = std::env::var_os("OUT_DIR")
        && let Err(e) = write_reports(&report, Path::new(&out))
    {
        panic!("scopegate guards could not write the report: {e}");
    }
    for line in finding_lines(&report) {
        println!("cargo:warning={line}");
    }
    if let Some(msg) = failure_message(&report) {
        panic!("{msg}");
    }
}

/// For `build.rs`, first thing: when the workspace's rustc wrapper (`guards/rustc-wrapper`)
/// runs this binary instead of cargo, it is the checker of the compiled library: it compiles
/// as asked, walks the library's LLVM IR, and exits with the outcome. Otherwise returns.
pub fn run_compiled_check_if_wrapped(opts: &Options) {
    if std::env::args_os().nth(1).is_some_and(|a| a == rustc::WRAPPER_FLAG) {
        std::process::exit(compiled_check(opts));
    }
}

/// Leaves this build script's own binary in `out_dir` as the checker the workspace's rustc
/// wrapper runs for this package's compilations, and the compiled walk's report files saying
/// the walk has not run yet (the wrapper replaces them when it walks the compiled library).
fn install_checker(out_dir: &Path) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("scopegate guards: own path: {e}"));
    let target = out_dir.join(rustc::CHECKER);
    let _ = std::fs::remove_file(&target);
    if std::fs::hard_link(&exe, &target).is_err() {
        std::fs::copy(&exe, &target).unwrap_or_else(|e| panic!("scopegate guards: installing the checker: {e}"));
    }
    let pending = "# Compiled guard\n\nNot run: this build did not compile the library through the workspace's \
                   rustc wrapper (`.cargo/config.toml`), or it compiled it optimised or without code.\n";
    let _ = std::fs::write(out_dir.join(COMPILED_MD), pending);
    for stale in [COMPILED_JSON, COMPILED_SARIF] {
        let _ = std::fs::remove_file(out_dir.join(stale));
    }
}

/// The compiled walk's Markdown report in `OUT_DIR`.
pub const COMPILED_MD: &str = "guards-compiled.md";
/// The compiled walk's JSON report in `OUT_DIR`.
pub const COMPILED_JSON: &str = "guards-compiled.json";
/// The compiled walk's SARIF 2.1.0 report in `OUT_DIR`.
pub const COMPILED_SARIF: &str = "guards-compiled.sarif";

/// Wrapper mode: compiles as cargo asked (the arguments after the flag are rustc and its
/// arguments) and, for the library of a debug build, walks the LLVM IR it compiled. The exit
/// code of the whole: rustc's, or 1 on a finding or an unreadable IR.
fn compiled_check(opts: &Options) -> i32 {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(2).collect();
    let Some((rustc_path, rest)) = args.split_first() else {
        eprintln!("scopegate guard: no rustc given to the wrapper");
        return 1;
    };
    let invocation = rustc::Invocation::parse(rest);
    if !(invocation.library && invocation.codegen && invocation.unoptimised) {
        return rustc::run(rustc_path, rest);
    }
    let Some(out_dir) = invocation.out_dir.clone() else { return rustc::run(rustc_path, rest) };
    let code = rustc::run(rustc_path, &rustc::guarded_args(rest));
    let files = rustc::ir_files(&out_dir, &invocation.crate_name, &invocation.extra_filename);
    if code != 0 {
        rustc::remove(&files);
        return code;
    }
    let outcome = rustc::walk(opts, &invocation, &files);
    rustc::remove(&files);
    match outcome {
        Ok(message) => match message {
            None => 0,
            Some(failure) => {
                eprintln!("{failure}");
                1
            }
        },
        Err(e) => {
            eprintln!("scopegate guard: {e}");
            1
        }
    }
}
