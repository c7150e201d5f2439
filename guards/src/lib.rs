//! Build-time guard for scopegate tools: walks the LLVM IR rustc compiled for a library, from
//! every tool the library serves, and fails the compilation on any path to a forbidden type or
//! call (an identity type, a database pool, a thread or task spawned past the call, ...).
//!
//! Called from `build.rs`:
//!
//! ```no_run
//! // build.rs, inside `fn main()`:
//! let opts = guards::Options::new(std::env::var("CARGO_MANIFEST_DIR").unwrap())
//!     .extra_rules("guards.toml"); // optional: the crate's own additions
//! guards::run_build_script(&opts);
//! ```
//!
//! with the workspace's `.cargo/config.toml` naming this crate's rustc wrapper
//! (`[build] rustc-workspace-wrapper = "<path to this crate>/rustc-wrapper"`). The build script
//! leaves its own binary in `OUT_DIR` as the checker; the wrapper hands the package's
//! compilations to it ([`rustc`]); it walks the library ([`compiled`], over [`ir`]) and writes
//! the report ([`compiled_report`]) into `OUT_DIR`, where a binary of the package embeds it.
//! The rules and the guard table are in `rules.toml`; what the walk cannot see is in the
//! report's residue.
//!
//! [`imports()`](fn@imports) and [`file_imports`] read the sources with `syn` for another
//! purpose: the project's layering tests (which module may use which).

#![forbid(unsafe_code)]

pub mod compiled;
pub mod compiled_report;
mod imports;
pub mod ir;
mod model;
mod rules;
pub mod rustc;
mod sarif;

use std::path::{Path, PathBuf};

pub use imports::{FileImport, Import, file_imports, imports};
pub use rules::{Boundary, DEFAULT_RULES, Discovery, Enforcement, ForbiddenCall, ForbiddenType, GuardRow, Rules};
pub use sarif::SARIF_SCHEMA;

/// Why the guard could not run (a walk that finds a forbidden path is not an error: it is
/// the walk's outcome).
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

/// Where the crate is and which rules apply.
#[derive(Debug, Clone)]
pub struct Options {
    /// The crate root (the directory holding `Cargo.toml`).
    pub crate_root: PathBuf,
    /// The entry file relative to the crate root, for [`imports`]; `None`: `src/lib.rs`, else
    /// `src/main.rs`.
    pub entry: Option<PathBuf>,
    /// The base rules file; `None`: [`DEFAULT_RULES`].
    pub rules: Option<PathBuf>,
    /// Files that add to the base rules.
    pub extra_rules: Vec<PathBuf>,
}

impl Options {
    /// The crate at `crate_root`, with the shipped rules.
    pub fn new(crate_root: impl Into<PathBuf>) -> Self {
        Options { crate_root: crate_root.into(), entry: None, rules: None, extra_rules: Vec::new() }
    }

    /// Sets the entry file (relative to the crate root).
    pub fn entry(mut self, entry: impl Into<PathBuf>) -> Self {
        self.entry = Some(entry.into());
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

    /// The rules files: for `rerun-if-changed`.
    fn rules_files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.rules.iter().map(|p| self.under_root(p)).collect();
        v.extend(self.extra_rules.iter().map(|p| self.under_root(p)));
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

/// For `build.rs`: checks the rules load, prints `cargo:rerun-if-changed` for each rules
/// file, and leaves this build script's binary in `OUT_DIR` as the checker the workspace's
/// rustc wrapper hands the package's compilations to, with the compiled walk's report files
/// saying the walk has not run (the checker replaces them when it walks the library). The
/// check itself runs when the library compiles, and fails that compilation on any finding.
/// Warns when no workspace wrapper is configured (then nothing walks the library).
pub fn run_build_script(opts: &Options) {
    run_compiled_check_if_wrapped(opts);
    for f in opts.rules_files() {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    // A rules file that does not load fails here, before anything compiles.
    if let Err(e) = load_rules(opts) {
        panic!("scopegate guards could not load the rules: {e}");
    }
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    install_checker(Path::new(&out));
    // Cargo tells a workspace member's build script the wrapper it compiles members with, and
    // sets none when no configuration names one: then nothing hands the library to the
    // checker. Said out loud, not refused: a package built as another workspace's dependency
    // is never a member, so never walked there, and must still build.
    if std::env::var_os("RUSTC_WORKSPACE_WRAPPER").is_none() {
        println!(
            "cargo:warning=scopegate guards: no rustc workspace wrapper, so this library compiles unwalked and its \
             report says `not run`; name the guard's wrapper in the workspace's .cargo/config.toml: \
             [build] rustc-workspace-wrapper = \"<path to the guards crate>/rustc-wrapper\""
        );
    }
}

/// First thing in [`run_build_script`]: when the workspace's rustc wrapper (`guards/rustc-wrapper`)
/// runs this binary instead of cargo, it is the checker of the compiled library: it compiles
/// as asked, walks the library's LLVM IR, and exits with the outcome. Otherwise returns.
fn run_compiled_check_if_wrapped(opts: &Options) {
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
    let package = std::env::var("CARGO_PKG_NAME").unwrap_or_default().replace('-', "_");
    let pending = compiled_report::CompiledReport::not_run(
        &package,
        "this build did not compile the library through the workspace's rustc wrapper \
         (`.cargo/config.toml`): a check-only build (cargo check, cargo clippy), or a build with the \
         wrapper replaced or removed.",
    );
    pending.write_to(out_dir).unwrap_or_else(|e| panic!("scopegate guards: {e}"));
}

/// The compiled walk's Markdown report in `OUT_DIR`.
pub const COMPILED_MD: &str = "guards-compiled.md";
/// The compiled walk's JSON report in `OUT_DIR`.
pub const COMPILED_JSON: &str = "guards-compiled.json";
/// The compiled walk's SARIF 2.1.0 report in `OUT_DIR`.
pub const COMPILED_SARIF: &str = "guards-compiled.sarif";

/// Wrapper mode: compiles as cargo asked (the arguments after the flag are rustc and its
/// arguments) and, for a library, walks the LLVM IR of its unoptimised code. The exit
/// code of the whole: rustc's, or 1 on a finding or an unreadable IR.
fn compiled_check(opts: &Options) -> i32 {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(2).collect();
    let Some((rustc_path, rest)) = args.split_first() else {
        eprintln!("scopegate guard: no rustc given to the wrapper");
        return 1;
    };
    let invocation = rustc::Invocation::parse(rest);
    if !(invocation.library && invocation.codegen) {
        return rustc::run(rustc_path, rest);
    }
    let Some(out_dir) = invocation.out_dir.clone() else { return rustc::run(rustc_path, rest) };
    let (crate_name, extra) = (&invocation.crate_name, &invocation.extra_filename);
    // Unoptimised: the IR comes with the compilation cargo asked for. Optimised: that
    // compilation as asked, then an unoptimised one of the same sources for the IR alone.
    let (files, walk_dir) = if invocation.unoptimised {
        let code = rustc::run(rustc_path, &invocation.guarded_args(rest));
        let files = rustc::ir_files(&out_dir, crate_name, extra);
        if code != 0 {
            rustc::remove(&files);
            return code;
        }
        (files, None)
    } else {
        let code = rustc::run(rustc_path, rest);
        if code != 0 {
            return code;
        }
        let dir = out_dir.join(format!("{crate_name}{extra}-guard-walk"));
        if let Err(output) = rustc::run_quiet(rustc_path, &invocation.walk_args(rest, &dir)) {
            let _ = std::fs::remove_dir_all(&dir);
            eprintln!("scopegate guard: the unoptimised compilation of {crate_name} for the walk failed:\n{output}");
            return 1;
        }
        (rustc::ir_files(&dir, crate_name, extra), Some(dir))
    };
    let outcome = rustc::walk(opts, &invocation, &files);
    rustc::remove(&files);
    if let Some(dir) = walk_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
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
