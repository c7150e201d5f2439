//! The guard inside the build: a rustc wrapper that compiles the guarded crate as cargo asked,
//! plus its LLVM IR, and walks what was compiled before the build may go on.
//!
//! Cargo runs the workspace's wrapper (`.cargo/config.toml`, `build.rustc-workspace-wrapper`,
//! a four-line shell script shipped in this crate) for every compilation of a workspace
//! crate. The script hands the compilation to the checker its package's build script left in
//! `OUT_DIR` (the build script binary itself, see [`crate::build_script`]); a package without
//! one is compiled untouched. The checker compiles every target as asked; for the library
//! target it adds `llvm-ir` to the outputs (in a directory of its own) and v0 symbol mangling,
//! then walks the IR and writes the report next to the build script's outputs. Any finding, or
//! IR that cannot be read, fails that compilation, so `cargo build` and `cargo test` fail.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The first argument that puts the build script binary in wrapper mode.
pub const WRAPPER_FLAG: &str = "--scopegate-guard-rustc";
/// The checker's file name in `OUT_DIR`.
pub const CHECKER: &str = "scopegate-guard";
/// The options the build script leaves for the checker (JSON).
pub const OPTIONS: &str = "scopegate-guard-options.json";

/// What a rustc command line is compiling, as far as the guard cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// `--crate-name`.
    pub crate_name: String,
    /// A library target (`--crate-type lib`/`rlib`), not its test harness (`--test`).
    pub library: bool,
    /// Code is generated (`--emit` holds `link`): a build, not `cargo check` or `cargo doc`.
    pub codegen: bool,
    /// `--out-dir`.
    pub out_dir: Option<PathBuf>,
    /// `-C extra-filename`: the suffix of every file of this compilation.
    pub extra_filename: String,
    /// No `-C opt-level` other than 0: a debug build, whose code is what the source says
    /// (an optimised build inlines and merges functions, so a call's callee may vanish).
    pub unoptimised: bool,
}

impl Invocation {
    /// Reads rustc's arguments (without the program itself).
    pub fn parse(args: &[OsString]) -> Self {
        let args: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let value = |flag: &str| -> Vec<String> {
            let mut out = Vec::new();
            for (i, a) in args.iter().enumerate() {
                if a == flag {
                    if let Some(v) = args.get(i + 1) {
                        out.push(v.clone());
                    }
                } else if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
                    out.push(v.to_owned());
                }
            }
            out
        };
        let crate_name = value("--crate-name").pop().unwrap_or_default();
        let types = value("--crate-type");
        let library = types.iter().any(|t| t == "lib" || t == "rlib") && !args.iter().any(|a| a == "--test");
        let codegen = value("--emit").iter().any(|e| e.split(',').any(|x| x == "link" || x.starts_with("link=")));
        let out_dir = value("--out-dir").pop().map(PathBuf::from);
        let mut codegen_options = Vec::new();
        for (i, a) in args.iter().enumerate() {
            if a == "-C" {
                codegen_options.extend(args.get(i + 1).cloned());
            } else if let Some(o) = a.strip_prefix("-C") {
                codegen_options.push(o.to_owned());
            } else if let Some(o) = a.strip_prefix("--codegen=") {
                codegen_options.push(o.to_owned());
            }
        }
        let option = |key: &str| {
            codegen_options.iter().filter_map(|o| o.strip_prefix(&format!("{key}=")).map(str::to_owned)).next_back()
        };
        let extra_filename = option("extra-filename").unwrap_or_default();
        let unoptimised = option("opt-level").is_none_or(|o| o == "0");
        Self { crate_name, library, codegen, out_dir, extra_filename, unoptimised }
    }
}

/// Arguments for the guarded compilation: `llvm-ir` added to `--emit` (one `.ll` file per
/// codegen unit, next to the other outputs), and v0 symbol mangling, whose names carry every
/// generic argument. Everything else as cargo asked.
pub fn guarded_args(args: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len() + 4);
    let mut iter = args.iter().peekable();
    while let Some(a) = iter.next() {
        let text = a.to_string_lossy();
        if text == "--emit" {
            if let Some(v) = iter.next() {
                out.push(a.clone());
                out.push(format!("{},llvm-ir", v.to_string_lossy()).into());
            }
            continue;
        }
        if let Some(v) = text.strip_prefix("--emit=") {
            out.push(format!("--emit={v},llvm-ir").into());
            continue;
        }
        out.push(a.clone());
    }
    out.push("-Csymbol-mangling-version=v0".into());
    // rustc compiles into one codegen unit when asked for IR unless the number is given; keep
    // what the profile would have used (256 incremental, else 16), so code generation stays
    // parallel and incremental.
    let given = |key: &str| {
        args.iter().enumerate().any(|(i, a)| {
            let a = a.to_string_lossy();
            a.starts_with(&format!("-C{key}"))
                || (a == "-C" && args.get(i + 1).is_some_and(|v| v.to_string_lossy().starts_with(key)))
        })
    };
    if !given("codegen-units") {
        out.push(if given("incremental") { "-Ccodegen-units=256" } else { "-Ccodegen-units=16" }.into());
    }
    out
}

/// Removes the IR files once read (they are large).
pub fn remove(files: &[PathBuf]) {
    for f in files {
        let _ = std::fs::remove_file(f);
    }
}

/// Reads the IR files and walks them with the rules of `opts`; writes the compiled walk's
/// report into `OUT_DIR`. `Some(message)` when anything is found.
pub fn walk(
    opts: &crate::Options,
    invocation: &Invocation,
    files: &[PathBuf],
) -> Result<Option<String>, crate::GuardError> {
    if files.is_empty() {
        return Err(crate::GuardError::Io {
            path: invocation.crate_name.clone(),
            message: "rustc wrote no LLVM IR for the library: nothing to walk".into(),
        });
    }
    let started = std::time::Instant::now();
    let rules = crate::load_rules(opts)?;
    let bytes: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    let module = crate::ir::Module::read_files(files)
        .map_err(|e| crate::GuardError::Io { path: invocation.crate_name.clone(), message: e.to_string() })?;
    let policy = crate::compiled::Policy::from_rules(&rules, &invocation.crate_name);
    let outcome = crate::compiled::check(&module, &policy);
    let ir = crate::compiled_report::IrRead {
        bytes,
        units: files.len(),
        functions: module.functions.len(),
        seconds: started.elapsed().as_secs_f64(),
    };
    let report = crate::compiled_report::CompiledReport::new(&invocation.crate_name, &rules, &outcome, ir);
    if let Some(out) = std::env::var_os("OUT_DIR") {
        let files = [
            (crate::COMPILED_MD, report.to_markdown()),
            (crate::COMPILED_JSON, report.to_json()),
            (crate::COMPILED_SARIF, report.to_sarif()),
        ];
        for (name, text) in files {
            let path = Path::new(&out).join(name);
            std::fs::write(&path, text)
                .map_err(|e| crate::GuardError::Io { path: path.display().to_string(), message: e.to_string() })?;
        }
    }
    if outcome.roots.iter().all(|r| r.why == crate::compiled::RootKind::Boundary) {
        // Nothing served: a crate without tools passes (its report says so).
        return Ok(None);
    }
    Ok(crate::compiled::failure(&outcome))
}

/// The `.ll` files rustc wrote for crate `crate_name` into `dir` (one per codegen unit, or one).
pub fn ir_files(dir: &Path, crate_name: &str, extra: &str) -> Vec<PathBuf> {
    let prefix = format!("{crate_name}{extra}");
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "ll")
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix))
        })
        .collect();
    out.sort();
    out
}

/// Runs `rustc` with `args`, passing its output through; its exit code.
pub fn run(rustc: &OsString, args: &[OsString]) -> i32 {
    match Command::new(rustc).args(args).status() {
        Ok(status) => status.code().unwrap_or(1),
        Err(e) => {
            eprintln!("scopegate guard: cannot run {}: {e}", rustc.to_string_lossy());
            1
        }
    }
}
