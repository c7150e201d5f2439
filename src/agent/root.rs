//! The agent's root: the `file:` URI the gateway knows it by and the directory on this machine
//! it stands for. This is the one place the agent turns a URI into a host path, and it never
//! maps a URI outside the root, as written or once symlinks are resolved.
//!
//! By default the directory is the root's own native path (`--root file:///srv/mcp` is
//! `/srv/mcp`), so the root must be written in this machine's convention. With `--root-dir DIR`
//! the root may be written in either convention and stands for DIR: `--root file:///C:/plugins
//! --root-dir /opt/plugins` serves `file:///C:/plugins/demo` from `/opt/plugins/demo` (a host
//! whose URI namespace differs from its filesystem, such as a container whose plugins are
//! mounted elsewhere). The gateway only ever sees the URI. Either way the root is read in the
//! convention it is written in, as the gateway reads it.
//!
//! A URI is mapped in three steps: lexical containment in the root URI ([`PathUri::contains`],
//! no file touched), its decoded names below the root appended to the directory (each must be
//! one plain path component on this host), then its real path checked against the real path of
//! the directory (a symlink inside pointing out is refused).

use std::path::{Component, Path, PathBuf};

use super::AgentError;
use crate::decl::canonical::style_of;
use crate::decl::{PathError, PathStyle, PathUri};
use crate::tunnel::Refusal;

/// The root URI and the directory it stands for.
#[derive(Debug)]
pub struct AgentRoot {
    uri: PathUri,
    /// The directory with its symlinks resolved, at start: names are appended to it and real
    /// paths are compared against it.
    real_dir: PathBuf,
}

/// Reads `--root` in the convention it is written in (a drive letter or a server name makes it
/// Windows), as the gateway reads the root the agent reports, so both sides agree on it.
pub fn parse_root_uri(text: &str) -> Result<PathUri, PathError> {
    PathUri::parse(text, style_of(text))
}

fn host_style() -> PathStyle {
    if cfg!(windows) { PathStyle::Windows } else { PathStyle::Posix }
}

impl AgentRoot {
    /// `uri` standing for `dir`, or for its own native path when `dir` is `None` (then `uri`
    /// must be in this machine's convention). The directory must exist.
    pub fn new(uri: PathUri, dir: Option<PathBuf>) -> Result<Self, AgentError> {
        let real_dir = match dir {
            Some(dir) => {
                let bad = |message: String| AgentError::RootDir { path: dir.clone(), message };
                let real = std::fs::canonicalize(&dir).map_err(|e| bad(e.to_string()))?;
                if !real.is_dir() {
                    return Err(bad("not a directory".to_owned()));
                }
                real
            }
            None => {
                let bad = |message: String| AgentError::Root { root: uri.to_string(), message };
                if uri.style() != host_style() {
                    let message =
                        "not in this machine's path convention (give --root-dir for the directory it stands for)";
                    return Err(bad(message.to_owned()));
                }
                let real = std::fs::canonicalize(uri.to_native()).map_err(|e| bad(e.to_string()))?;
                if !real.is_dir() {
                    return Err(bad("not a directory".to_owned()));
                }
                real
            }
        };
        Ok(Self { uri, real_dir })
    }

    /// The root as the gateway knows it.
    pub fn uri(&self) -> &PathUri {
        &self.uri
    }

    /// The directory the root stands for, symlinks resolved.
    pub fn dir(&self) -> &Path {
        &self.real_dir
    }

    /// Where `uri` is on this machine, lexically: it must lie inside the root URI, and each of
    /// its names below the root must be one plain path component here. Touches no file; the
    /// reason is worded to follow the URI.
    pub fn host_path(&self, uri: &PathUri) -> Result<PathBuf, String> {
        let names = uri.names_below(&self.uri).ok_or_else(|| self.outside())?;
        let mut path = self.real_dir.clone();
        for name in names {
            if !plain_component(name) {
                return Err(format!("has the name {name:?}, which is not a plain file name on this machine"));
            }
            path.push(name);
        }
        Ok(path)
    }

    /// `uri` (a `file:` URI in the root's convention) as a real path inside the root: mapped
    /// by [`AgentRoot::host_path`], then its symlinks resolved and the result checked to be
    /// still inside the directory. `what` names the field for the reason.
    /// The reason carries its [`Refusal`] class, so the gateway can tell refusals apart.
    pub fn contained(&self, what: &str, uri: &str) -> Result<PathBuf, String> {
        let reason = |e: String| format!("{what} {uri:?} {e}");
        let parsed = PathUri::parse(uri, self.uri.style())
            .map_err(|e| Refusal::Invalid.tag(&reason(format!("is not acceptable: {e}"))))?;
        let outside = || Refusal::OutsideRoot.tag(&reason(self.outside()));
        if !self.uri.contains(&parsed) {
            return Err(outside());
        }
        let path = self.host_path(&parsed).map_err(|e| Refusal::Invalid.tag(&reason(e)))?;
        let real = std::fs::canonicalize(&path)
            .map_err(|e| super::serve::io_refusal(&e).tag(&reason(format!("can't be used: {e}"))))?;
        if !real.starts_with(&self.real_dir) {
            return Err(outside());
        }
        Ok(real)
    }

    fn outside(&self) -> String {
        format!("is outside the executor's root {}", self.uri)
    }
}

/// Whether `name` is exactly one ordinary path component on this host: not empty, `.` or
/// `..`, no separator, no NUL, and on Windows no `\` and no `:` (a drive or a stream).
fn plain_component(name: &str) -> bool {
    if name.is_empty() || name.contains(['/', '\0']) {
        return false;
    }
    if cfg!(windows) && name.contains(['\\', ':']) {
        return false;
    }
    let mut components = Path::new(name).components();
    matches!((components.next(), components.next()), (Some(Component::Normal(n)), None) if n == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decl::PathStyle::{Posix, Windows};

    fn uri(s: &str, style: PathStyle) -> PathUri {
        PathUri::parse(s, style).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// A real directory (symlinks resolved) holding `plugins/demo/` and a sibling `outside/`.
    struct Dirs {
        _tmp: tempfile::TempDir,
        base: PathBuf,
        plugins: PathBuf,
    }

    fn dirs() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let plugins = base.join("plugins");
        std::fs::create_dir_all(plugins.join("demo")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        Dirs { _tmp: tmp, base, plugins }
    }

    #[test]
    fn uris_below_the_root_map_onto_its_directory() {
        let d = dirs();
        let rows = [
            ("POSIX", "file:///srv/plugins", Posix, "file:///srv/plugins/demo/x", &["demo", "x"][..]),
            ("POSIX root itself", "file:///srv/plugins", Posix, "file:///srv/plugins", &[][..]),
            ("Windows drive", "file:///C:/plugins", Windows, "file:///C:/plugins/demo", &["demo"][..]),
            ("drive letter case", "file:///C:/plugins", Windows, "file:///c:/plugins/demo", &["demo"][..]),
            ("UNC", "file://server/share/plugins", Windows, "file://SERVER/share/plugins/demo", &["demo"][..]),
            ("UNC share root", "file://server/share", Windows, "file://server/share/demo/a", &["demo", "a"][..]),
            (
                "percent-encoded",
                "file:///C:/plugins",
                Windows,
                "file:///C:/plugins/my%20demo/caf%C3%A9",
                &["my demo", "café"][..],
            ),
            ("encoded dots normalized", "file:///srv/p", Posix, "file:///srv/p/a/%2e%2e/demo", &["demo"][..]),
        ];
        for (why, root, style, path, names) in rows {
            let root = AgentRoot::new(uri(root, style), Some(d.plugins.clone())).unwrap();
            let mapped = root.host_path(&uri(path, style)).unwrap_or_else(|e| panic!("{why}: {e}"));
            let want = names.iter().fold(d.plugins.clone(), |p, n| p.join(n));
            assert_eq!(mapped, want, "{why}");
        }
    }

    #[test]
    fn uris_outside_the_root_are_refused_before_any_host_access() {
        // The directory is removed after start: a refusal that needed the filesystem would
        // fail differently (and `host_path` never touches it at all).
        let d = dirs();
        let rows = [
            ("parent", "file:///C:/plugins", "file:///C:/", Windows),
            ("sibling with a shared prefix", "file:///C:/plugins", "file:///C:/pluginsx/demo", Windows),
            ("climbs out", "file:///C:/plugins", "file:///C:/plugins/../outside", Windows),
            ("encoded climb", "file:///C:/plugins", "file:///C:/plugins/%2e%2e/outside", Windows),
            ("other drive", "file:///C:/plugins", "file:///D:/plugins/demo", Windows),
            ("names compare exactly", "file:///C:/plugins", "file:///C:/Plugins/demo", Windows),
            ("UNC other share", "file://server/share", "file://server/other/x", Windows),
            ("drive is not UNC", "file:///C:/plugins", "file://server/plugins/x", Windows),
            ("POSIX sibling", "file:///srv/p", "file:///srv/px", Posix),
        ];
        let roots: Vec<_> = rows
            .iter()
            .map(|(_, root, _, style)| AgentRoot::new(uri(root, *style), Some(d.plugins.clone())).unwrap())
            .collect();
        std::fs::remove_dir_all(&d.plugins).unwrap();
        for ((why, _, path, style), root) in rows.iter().zip(&roots) {
            let err = root.host_path(&uri(path, *style)).expect_err(why);
            assert!(err.contains("outside the executor's root"), "{why}: {err}");
            let err = root.contained("cwd", path).expect_err(why);
            assert!(err.contains("outside the executor's root") && err.contains(path), "{why}: {err}");
        }
        // Another convention than the root's never parses, so never maps.
        let windows = &roots[0];
        let err = windows.contained("uri", "file:///srv/plugins").unwrap_err();
        assert!(err.contains("drive letter"), "{err}");
    }

    #[test]
    fn names_that_are_not_one_plain_component_are_refused() {
        let mut rows = vec![
            ("empty", "", false),
            ("dot", ".", false),
            ("dot-dot", "..", false),
            ("slash", "a/b", false),
            ("leading slash", "/etc", false),
            ("trailing slash", "a/", false),
            ("NUL", "a\0b", false),
            ("plain", "demo", true),
            ("space and unicode", "my café", true),
            ("dots inside", "a..b", true),
            ("three dots", "...", true),
        ];
        if cfg!(windows) {
            rows.extend([("backslash", "a\\b", false), ("drive", "C:", false), ("stream", "a:b", false)]);
        } else {
            rows.extend([("backslash is a POSIX name", "a\\b", true), ("colon is a POSIX name", "a:b", true)]);
        }
        for (why, name, plain) in rows {
            assert_eq!(plain_component(name), plain, "{why}: {name:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_inside_the_directory_that_leads_out_is_refused() {
        let d = dirs();
        std::os::unix::fs::symlink(d.base.join("outside"), d.plugins.join("escape")).unwrap();
        std::os::unix::fs::symlink(d.plugins.join("demo"), d.plugins.join("inner")).unwrap();
        std::fs::write(d.base.join("outside/secret.json"), "{}").unwrap();
        let root = AgentRoot::new(uri("file:///C:/plugins", Windows), Some(d.plugins.clone())).unwrap();
        for path in ["file:///C:/plugins/escape", "file:///C:/plugins/escape/secret.json"] {
            // Lexically inside: mapped, then refused once the link is resolved.
            assert!(root.host_path(&uri(path, Windows)).is_ok(), "{path}");
            let err = root.contained("uri", path).unwrap_err();
            assert!(err.contains("outside the executor's root"), "{path}: {err}");
        }
        assert_eq!(root.contained("cwd", "file:///C:/plugins/inner").unwrap(), d.plugins.join("demo"));
        assert_eq!(root.contained("cwd", "file:///C:/plugins").unwrap(), d.plugins);
    }

    #[cfg(unix)]
    #[test]
    fn the_directory_must_exist_and_a_foreign_root_needs_one() {
        let d = dirs();
        let file = d.base.join("file");
        std::fs::write(&file, "x").unwrap();
        let root = uri("file:///C:/plugins", Windows);
        let err = AgentRoot::new(root.clone(), Some(d.base.join("missing"))).unwrap_err().to_string();
        assert!(err.starts_with("--root-dir"), "{err}");
        let err = AgentRoot::new(root.clone(), Some(file)).unwrap_err().to_string();
        assert!(err.starts_with("--root-dir") && err.contains("not a directory"), "{err}");
        let err = AgentRoot::new(root, None).unwrap_err().to_string();
        assert!(err.starts_with("--root") && err.contains("--root-dir"), "{err}");
        // Without a directory, a root in this machine's convention is its own native path.
        let native = format!("file://{}", d.plugins.display());
        let own = AgentRoot::new(parse_root_uri(&native).unwrap(), None).unwrap();
        assert_eq!(own.dir(), d.plugins);
        assert_eq!(own.contained("cwd", &format!("{native}/demo")).unwrap(), d.plugins.join("demo"));
    }

    #[test]
    fn the_root_is_read_in_the_convention_it_is_written_in() {
        let rows = [
            ("file:///C:/plugins", Windows),
            ("file://localhost/c:/plugins", Windows),
            ("file://server/share", Windows),
            ("file:///srv/plugins", Posix),
            ("file:///srv/C:/x", Posix),
        ];
        for (text, style) in rows {
            assert_eq!(parse_root_uri(text).unwrap().style(), style, "{text}");
        }
        for bad in ["/srv/plugins", "C:\\plugins", "file:///C:plugins", "plugins"] {
            assert!(parse_root_uri(bad).is_err(), "{bad}");
        }
    }
}
