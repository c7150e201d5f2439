//! Third-party programs the tests install themselves, pinned, once per target directory into
//! `<target>/interop/`: the npm tree of tests/fixtures/npm (`npm ci` from its lock file) and a
//! Python venv with the official MCP SDK. A file lock keeps concurrent test binaries from
//! racing. A missing `node`, `npm` or `python3` fails the tests that need them, never skips them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::Digest;

/// The official Python SDK (2.x: `MCPServer`, Python >= 3.10).
pub const PY_MCP_VERSION: &str = "2.3.0";

/// `<target>/interop`: the fixture binary lives in `<target>/<profile>/`.
pub fn cache_dir() -> PathBuf {
    let fixture = Path::new(env!("CARGO_BIN_EXE_scopegate-fixture-upstream"));
    fixture.parent().and_then(Path::parent).expect("the target directory").join("interop")
}

/// `tests/fixtures/<rel>` of this workspace.
pub fn fixture_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(rel)
}

/// `program` by its absolute path on PATH (the gateway starts stdio upstreams with a cleared
/// environment), or a failure that says what the tests need.
pub fn required_tool(program: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|candidate| candidate.is_file()).ok_or_else(|| {
        format!("`{program}` is required by the tests (tests/it/support/installs.rs) and is not on PATH")
    })
}

/// Runs `cmd` to completion, its output in the error when it fails.
pub fn run(cmd: &mut std::process::Command) -> Result<(), String> {
    let what = format!("{cmd:?}");
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Installs once per cache (marker file `marker` under `dir`), under an exclusive lock on
/// `<dir>.lock` so that concurrent test binaries do not install over each other.
pub fn install_once(dir: &Path, marker: &str, install: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    std::fs::create_dir_all(cache_dir()).map_err(|e| format!("create {}: {e}", cache_dir().display()))?;
    let lock_path = dir.with_extension("lock");
    let lock = std::fs::File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("lock {}: {e}", lock_path.display()))?;
    let marker = dir.join(marker);
    if marker.is_file() {
        return Ok(());
    }
    install()?;
    std::fs::write(&marker, b"").map_err(|e| format!("{}: {e}", marker.display()))
}

/// Node and the installed npm tree of tests/fixtures/npm.
pub struct NpmTree {
    pub node: PathBuf,
    /// Holds `node_modules`.
    pub dir: PathBuf,
}

impl NpmTree {
    /// `node_modules/<rel>`, which must exist.
    pub fn module(&self, rel: &str) -> Result<PathBuf, String> {
        let path = self.dir.join("node_modules").join(rel);
        if path.is_file() { Ok(path) } else { Err(format!("{} is missing after npm install", path.display())) }
    }

    /// The fixture script `tests/fixtures/npm/<name>`, copied beside `node_modules` so that
    /// Node resolves its imports from the tree. Copied at each call (a test runs the script
    /// of its own checkout), through a rename so that concurrent tests never see half a file.
    pub fn script(&self, name: &str) -> PathBuf {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let target = self.dir.join(name);
        let tmp = self.dir.join(format!(".{name}.{}.{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        let source = fixture_file(&format!("npm/{name}"));
        std::fs::copy(&source, &tmp).unwrap_or_else(|e| panic!("copy {}: {e}", source.display()));
        std::fs::rename(&tmp, &target).unwrap_or_else(|e| panic!("{}: {e}", target.display()));
        target
    }
}

fn npm_install() -> Result<NpmTree, String> {
    let node = required_tool("node")?;
    let npm = required_tool("npm")?;
    let dir = cache_dir().join("npm");
    // The whole tree pinned by the lock file beside the fixtures, installed with `npm ci`;
    // a new lock file installs again.
    let fixtures = fixture_file("npm");
    let lock = std::fs::read(fixtures.join("package-lock.json")).map_err(|e| format!("the npm lock file: {e}"))?;
    let marker = format!(".installed-{:x}", sha2::Sha256::digest(&lock));
    install_once(&dir, &marker, || {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(fixtures.join(file), dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        }
        run(std::process::Command::new(&npm).args(["ci", "--prefix"]).arg(&dir).args([
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ]))
    })?;
    Ok(NpmTree { node, dir })
}

/// The npm tree, installed on first use.
pub async fn npm_tree() -> &'static NpmTree {
    static INSTALLED: OnceLock<Result<NpmTree, String>> = OnceLock::new();
    let installed = tokio::task::spawn_blocking(|| INSTALLED.get_or_init(npm_install).as_ref()).await.unwrap();
    installed.unwrap_or_else(|e| panic!("installing the npm fixtures (tests/fixtures/npm): {e}"))
}

/// The venv's Python with the pinned `mcp`.
fn python_install() -> Result<PathBuf, String> {
    let python3 = required_tool("python3")?;
    let dir = cache_dir().join("py");
    let python = dir.join("bin/python");
    install_once(&dir, &format!(".installed-mcp-{PY_MCP_VERSION}"), || {
        run(std::process::Command::new(&python3).args(["-m", "venv", "--clear"]).arg(&dir))?;
        run(std::process::Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet"])
            .arg(format!("mcp=={PY_MCP_VERSION}")))
    })?;
    Ok(python)
}

/// The venv's Python, installed on first use.
pub async fn python() -> &'static Path {
    static INSTALLED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let installed = tokio::task::spawn_blocking(|| INSTALLED.get_or_init(python_install).as_ref()).await.unwrap();
    installed.map(PathBuf::as_path).unwrap_or_else(|e| panic!("installing the Python SDK (mcp=={PY_MCP_VERSION}): {e}"))
}
