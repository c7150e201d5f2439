//! The guard inside the build: a rustc wrapper that compiles the guarded crate as cargo asked,
//! plus its LLVM IR, and walks what was compiled before the build may go on.
//!
//! Cargo runs the workspace's wrapper (`.cargo/config.toml`, `build.rustc-workspace-wrapper`,
//! a short bash script shipped in this crate) for every compilation of a workspace crate. The
//! script hands the compilation to the checker its package's build script left in `OUT_DIR`
//! (the build script binary itself, see [`crate::run_build_script`]); a package without one
//! is compiled untouched. The checker compiles every target as asked. For the library of an
//! unoptimised build it adds `llvm-ir` to the outputs and v0 symbol mangling; for the library
//! of an optimised build it compiles a second time, unoptimised, for the IR alone
//! ([`Invocation::walk_args`]). Then it walks the IR and writes the report next to the build
//! script's outputs. Any finding, or IR that cannot be read, fails that compilation, so
//! `cargo build`, `cargo test` and `cargo build --release` fail.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The first argument that puts the build script binary in wrapper mode.
pub const WRAPPER_FLAG: &str = "--scopegate-guard-rustc";
/// The checker's file name in `OUT_DIR`.
pub const CHECKER: &str = "scopegate-guard";

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
    /// `-C codegen-units`, when given.
    pub codegen_units: Option<String>,
    /// `-C incremental`, when given: the incremental compilation's directory.
    pub incremental: Option<PathBuf>,
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
        let codegen_units = option("codegen-units");
        let incremental = option("incremental").map(PathBuf::from);
        Self { crate_name, library, codegen, out_dir, extra_filename, unoptimised, codegen_units, incremental }
    }

    /// Arguments for the guarded compilation of `args` (the arguments this was parsed from):
    /// `llvm-ir` added to `--emit` (one `.ll` file per codegen unit, next to the other
    /// outputs), and v0 symbol mangling, whose names carry every generic argument. Everything
    /// else as cargo asked.
    pub fn guarded_args(&self, args: &[OsString]) -> Vec<OsString> {
        let mut out = Vec::with_capacity(args.len() + 4);
        let mut iter = args.iter();
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
        // rustc compiles into one codegen unit when asked for IR unless the number is given;
        // keep what the profile would have used (256 incremental, else 16), so code generation
        // stays parallel and incremental.
        if self.codegen_units.is_none() {
            out.push(if self.incremental.is_some() { "-Ccodegen-units=256" } else { "-Ccodegen-units=16" }.into());
        }
        out
    }
}

/// The `-C` options [`Invocation::walk_args`] sets itself: how code is optimised and emitted,
/// none of which changes what the source means.
const WALK_SETS: [&str; 8] = [
    "opt-level",
    "incremental",
    "lto",
    "embed-bitcode",
    "linker-plugin-lto",
    "debuginfo",
    "codegen-units",
    "symbol-mangling-version",
];

impl Invocation {
    /// Arguments for a second compilation of an optimised library's `args`, for the walk
    /// alone: the same sources, `cfg`, features and dependencies, unoptimised (optimisation
    /// inlines and folds calls away), emitting only LLVM IR into `dir`, with line tables and
    /// v0 mangling. `debug_assertions` (and `overflow_checks`, which follows it) stays as the
    /// optimised compilation had it: an unoptimised one would turn it on by default.
    pub fn walk_args(&self, args: &[OsString], dir: &Path) -> Vec<OsString> {
        let mut out = Vec::with_capacity(args.len() + 8);
        let mut debug_assertions = false;
        let mut iter = args.iter();
        while let Some(a) = iter.next() {
            let text = a.to_string_lossy();
            let (option, separate) = match text.as_ref() {
                "--emit" | "--out-dir" | "-o" => {
                    iter.next();
                    continue;
                }
                "-C" | "--codegen" => (iter.next().map(|v| v.to_string_lossy().into_owned()), true),
                t if t.starts_with("--emit=") || t.starts_with("--out-dir=") => continue,
                t => (t.strip_prefix("-C").or_else(|| t.strip_prefix("--codegen=")).map(str::to_owned), false),
            };
            let Some(option) = option else {
                out.push(a.clone());
                continue;
            };
            let key = option.split('=').next().unwrap_or_default();
            if WALK_SETS.contains(&key) {
                continue;
            }
            debug_assertions |= key == "debug-assertions";
            if separate {
                out.push("-C".into());
            }
            out.push(if separate { option.into() } else { a.clone() });
        }
        out.push("--emit=llvm-ir".into());
        out.push("--out-dir".into());
        out.push(dir.as_os_str().to_owned());
        for option in ["opt-level=0", "debuginfo=line-tables-only", "symbol-mangling-version=v0", "codegen-units=16"] {
            out.push(format!("-C{option}").into());
        }
        if !debug_assertions {
            out.push("-Cdebug-assertions=off".into());
        }
        out
    }
}

/// Runs `rustc` with `args`, keeping its output (the diagnostics are the first compilation's
/// to show); rustc's output when it fails.
pub fn run_quiet(rustc: &OsString, args: &[OsString]) -> Result<(), String> {
    match Command::new(rustc).args(args).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))),
        Err(e) => Err(format!("cannot run {}: {e}", rustc.to_string_lossy())),
    }
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
        report.write_to(Path::new(&out))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<OsString> {
        text.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn guarded_args_add_ir_mangling_and_keep_the_codegen_units() {
        let debug = args("--crate-name lib --crate-type lib --emit=dep-info,metadata,link -C incremental=inc");
        let invocation = Invocation::parse(&debug);
        assert_eq!(invocation.incremental, Some(PathBuf::from("inc")));
        assert_eq!(invocation.codegen_units, None);
        let guarded_args = |a: &[OsString]| Invocation::parse(a).guarded_args(a);
        assert_eq!(
            guarded_args(&debug),
            args(
                "--crate-name lib --crate-type lib --emit=dep-info,metadata,link,llvm-ir -C incremental=inc \
                 -Csymbol-mangling-version=v0 -Ccodegen-units=256"
            )
        );
        let given = args("--emit link -Ccodegen-units=4");
        assert_eq!(Invocation::parse(&given).codegen_units.as_deref(), Some("4"));
        assert_eq!(guarded_args(&given), args("--emit link,llvm-ir -Ccodegen-units=4 -Csymbol-mangling-version=v0"));
        assert_eq!(
            guarded_args(&args("--emit=link")),
            args("--emit=link,llvm-ir -Csymbol-mangling-version=v0 -Ccodegen-units=16")
        );
    }

    #[test]
    fn walk_args_compile_the_same_sources_unoptimised_for_the_ir_alone() {
        let release = args(
            "--crate-name lib --edition=2024 src/lib.rs --error-format=json --crate-type lib \
             --emit=dep-info,metadata,link -C opt-level=3 -C embed-bitcode=no -C lto=off --cfg feature=\"x\" \
             -C metadata=abc -C extra-filename=-abc --out-dir target/release/deps -Ccodegen-units=4 \
             -C strip=debuginfo -L dependency=target/release/deps --extern serde=libserde.rlib",
        );
        let invocation = Invocation::parse(&release);
        assert!(!invocation.unoptimised && invocation.library && invocation.codegen);
        let walk = invocation.walk_args(&release, Path::new("walk"));
        assert_eq!(
            walk,
            args(
                "--crate-name lib --edition=2024 src/lib.rs --error-format=json --crate-type lib \
                 --cfg feature=\"x\" -C metadata=abc -C extra-filename=-abc -C strip=debuginfo \
                 -L dependency=target/release/deps --extern serde=libserde.rlib --emit=llvm-ir --out-dir walk \
                 -Copt-level=0 -Cdebuginfo=line-tables-only -Csymbol-mangling-version=v0 -Ccodegen-units=16 \
                 -Cdebug-assertions=off"
            )
        );
        // A profile that asks for debug assertions keeps them, as it says.
        let asserted = args("--crate-type lib --emit=link -Copt-level=2 -C debug-assertions=on --out-dir d");
        let walk = Invocation::parse(&asserted).walk_args(&asserted, Path::new("w"));
        assert_eq!(walk.iter().filter(|a| a.to_string_lossy().contains("debug-assertions")).count(), 1, "{walk:?}");
        assert!(walk.contains(&OsString::from("debug-assertions=on")), "{walk:?}");
    }
}
