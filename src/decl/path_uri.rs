//! `PathUri`: executor `file:` URIs, normalized, joined and compared lexically; never touches the host filesystem.
//!
//! A path that belongs to an executor may live on another machine with another convention, so
//! it stays a URI tagged with its [`PathStyle`] instead of becoming a host `Path`. Everything
//! here is string work: no `canonicalize`, no symlink resolution, no `std::fs`.
//!
//! Rules worth knowing:
//! - Native path strings (`/srv/p`, `C:\x`) are refused where a URI is required.
//! - Percent-encoded dots are dots (`%2e%2e` is `..`), as RFC 3986 says; an encoded separator
//!   (`%2f`, `%5c`) is refused instead of being decoded into a separator.
//! - `..` never climbs above the root, the drive or the UNC share when parsing; [`PathUri::join`]
//!   and [`PathUri::join_ref`] go further and refuse any `..` that would leave the base.
//! - Windows: drive letters and UNC server names are case-insensitive (stored upper- and
//!   lower-case). Share and folder names compare exactly: a false "not contained" only refuses
//!   a path, while a false "contained" could let a path out of a case-sensitive folder (Windows
//!   supports those per directory). Names Windows would rewrite or treat as devices (trailing dot
//!   or space, `< > : " | ? *`, `CON`, `NUL`, `COM1`...) are refused.

use std::fmt;

/// The path convention of the executor a path belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathStyle {
    /// `file:///srv/p`
    Posix,
    /// `file:///C:/plugins/demo` or UNC `file://server/share/dir`
    Windows,
}

/// Why a string is not an acceptable `file:` URI or relative path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("`{input}` is a native path, not a file: URI (write it as {hint})")]
    NativePath { input: String, hint: &'static str },
    #[error("`{0}` is not a file: URI")]
    NotFileUri(String),
    #[error("a file: URI must have an absolute path")]
    NotAbsolute,
    #[error("a file: URI can't carry a query or a fragment")]
    QueryOrFragment,
    #[error("a backslash is not allowed in a URI (use `/`)")]
    Backslash,
    #[error("a control character is not allowed in a path")]
    ControlCharacter,
    #[error("invalid percent-encoding in `{0}`")]
    BadPercent(String),
    #[error("`{0}` decodes to bytes that are not UTF-8")]
    NotUtf8(String),
    #[error("`{0}` encodes a path separator inside a name")]
    EncodedSeparator(String),
    #[error("a POSIX file: URI can't name a host (`{0}`)")]
    PosixHost(String),
    #[error("invalid UNC server name `{0}`")]
    BadServer(String),
    #[error("a UNC URI needs a share after the server")]
    MissingShare,
    #[error("a Windows file: URI needs a drive letter (file:///C:/...) or a UNC server")]
    MissingDrive,
    #[error("`{0}` is drive-relative; write the drive's absolute path")]
    DriveRelative(String),
    #[error("invalid name `{name}`: {reason}")]
    BadName { name: String, reason: &'static str },
    #[error("`{0}` is not a relative path")]
    NotRelative(String),
    #[error("`{0}` climbs out of its base folder")]
    Escapes(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Root {
    Posix,
    /// An upper-case ASCII drive letter.
    Drive(char),
    /// A lower-case server and a share as written.
    Unc {
        server: String,
        share: String,
    },
}

/// An absolute, normalized `file:` URI in one executor's path convention.
///
/// Equality is structural on the normalized form (drive letters and UNC servers are
/// normalized at parse, so `C:` equals `c:`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PathUri {
    root: Root,
    /// Decoded names below the root; never empty, `.` or `..`.
    segments: Vec<String>,
}

impl PathUri {
    /// Parses a `file:` URI in `style`'s convention, normalizing `.`, `..` and duplicate
    /// separators. Accepts `file:///p`, `file://localhost/p`, `file:/p` and (Windows) UNC
    /// `file://server/share/p`.
    pub fn parse(input: &str, style: PathStyle) -> Result<Self, PathError> {
        let Some(rest) = strip_file_scheme(input) else {
            return Err(not_a_uri(input));
        };
        if rest.contains(['?', '#']) {
            return Err(PathError::QueryOrFragment);
        }
        if rest.contains('\\') {
            return Err(PathError::Backslash);
        }
        if rest.chars().any(char::is_control) {
            return Err(PathError::ControlCharacter);
        }
        let (authority, path) = match rest.strip_prefix("//") {
            Some(after) => after.split_at(after.find('/').unwrap_or(after.len())),
            None if rest.starts_with('/') => ("", rest),
            None => return Err(PathError::NotAbsolute),
        };
        let local = authority.is_empty() || authority.eq_ignore_ascii_case("localhost");
        let mut raw = path.split('/').filter(|s| !s.is_empty());
        let root = match style {
            PathStyle::Posix if local => Root::Posix,
            PathStyle::Posix => return Err(PathError::PosixHost(authority.to_owned())),
            PathStyle::Windows if local => {
                let first = raw.next().ok_or(PathError::MissingDrive)?;
                let first = decode(first)?;
                match drive_prefix(&first) {
                    Some((letter, "")) => Root::Drive(letter),
                    Some(_) => return Err(PathError::DriveRelative(first)),
                    None => return Err(PathError::MissingDrive),
                }
            }
            PathStyle::Windows => {
                let server = unc_server(authority)?;
                let share = decode(raw.next().ok_or(PathError::MissingShare)?)?;
                if share == "." || share == ".." {
                    return Err(PathError::MissingShare);
                }
                check_name(&share, style)?;
                Root::Unc { server, share }
            }
        };
        let mut segments = Vec::new();
        for segment in raw {
            match decode(segment)?.as_str() {
                "." => {}
                ".." => {
                    segments.pop();
                }
                name => {
                    check_name(name, style)?;
                    segments.push(name.to_owned());
                }
            }
        }
        Ok(PathUri { root, segments })
    }

    /// A root an agent reports, read in its own convention: a drive letter (`file:///C:/x`) or
    /// a server name (`file://server/share`) makes it a Windows path, anything else POSIX.
    pub fn parse_reported(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("file:")?;
        let (authority, path) = match rest.strip_prefix("//") {
            Some(after) => after.split_at(after.find('/').unwrap_or(after.len())),
            None => ("", rest),
        };
        let drive =
            path.as_bytes().get(1).is_some_and(u8::is_ascii_alphabetic) && path.as_bytes().get(2) == Some(&b':');
        let style = if drive || !(authority.is_empty() || authority == "localhost") {
            PathStyle::Windows
        } else {
            PathStyle::Posix
        };
        Self::parse(text, style).ok()
    }

    /// The gateway host's own absolute path (POSIX), as a URI: for the local executor's plugin
    /// root, which the gateway reads from its own working directory. `.` and `..` are refused
    /// rather than normalized, since a host path may cross symlinks.
    pub fn from_host_path(path: &str) -> Result<Self, PathError> {
        let Some(rest) = path.strip_prefix('/') else {
            return Err(PathError::NotAbsolute);
        };
        let mut segments = Vec::new();
        for name in rest.split('/').filter(|s| !s.is_empty()) {
            if name == "." || name == ".." {
                return Err(PathError::BadName { name: name.to_owned(), reason: "a host path must be normalized" });
            }
            check_name(name, PathStyle::Posix)?;
            segments.push(name.to_owned());
        }
        Ok(PathUri { root: Root::Posix, segments })
    }

    /// The path convention this URI keeps.
    pub fn style(&self) -> PathStyle {
        match self.root {
            Root::Posix => PathStyle::Posix,
            Root::Drive(_) | Root::Unc { .. } => PathStyle::Windows,
        }
    }

    /// Joins a relative path written in this style's own separators (Windows accepts `\` and
    /// `/`). Names are taken literally: no percent-decoding. Refuses absolute, rooted,
    /// drive-relative and UNC paths, and any `..` that would leave `self`.
    pub fn join(&self, relative: &str) -> Result<Self, PathError> {
        if relative.chars().any(char::is_control) {
            return Err(PathError::ControlCharacter);
        }
        let style = self.style();
        let rooted = match style {
            PathStyle::Posix => relative.starts_with('/'),
            PathStyle::Windows => relative.starts_with(['/', '\\']) || drive_prefix(relative).is_some(),
        };
        if rooted {
            return Err(PathError::NotRelative(relative.to_owned()));
        }
        let names: Vec<&str> = match style {
            PathStyle::Posix => relative.split('/').collect(),
            PathStyle::Windows => relative.split(['/', '\\']).collect(),
        };
        self.descend(relative, names.into_iter().map(|n| Ok(n.to_owned())))
    }

    /// Joins a relative URI reference (`sub/dir%20x`): percent-decoded like [`PathUri::parse`].
    /// Refuses a reference with a scheme, a drive, an authority or an absolute path, and any
    /// `..` (encoded or not) that would leave `self`.
    pub fn join_ref(&self, reference: &str) -> Result<Self, PathError> {
        if reference.contains(['?', '#']) {
            return Err(PathError::QueryOrFragment);
        }
        if reference.contains('\\') {
            return Err(PathError::Backslash);
        }
        if reference.chars().any(char::is_control) {
            return Err(PathError::ControlCharacter);
        }
        let first = reference.split('/').next().unwrap_or_default();
        if reference.starts_with('/') || first.contains(':') {
            return Err(PathError::NotRelative(reference.to_owned()));
        }
        self.descend(reference, reference.split('/').map(decode))
    }

    /// Whether `other` is `self` or lies below it, compared name by name (`/srv/p` does not
    /// contain `/srv/px`). Paths of different styles never contain each other.
    pub fn contains(&self, other: &PathUri) -> bool {
        self.root == other.root
            && other.segments.len() >= self.segments.len()
            && self.segments.iter().zip(&other.segments).all(|(a, b)| a == b)
    }

    /// The decoded names of `self` below `base`, or `None` when `base` does not contain it.
    pub fn names_below(&self, base: &PathUri) -> Option<&[String]> {
        base.contains(self).then(|| &self.segments[base.segments.len()..])
    }

    /// The folder holding this path, or `None` at a root, drive or share.
    pub fn parent(&self) -> Option<Self> {
        let mut segments = self.segments.clone();
        segments.pop()?;
        Some(PathUri { root: self.root.clone(), segments })
    }

    /// The path as its executor writes it natively (`/srv/p`, `C:\x`, `\\server\share\x`),
    /// for handing to a process launcher on that executor.
    pub fn to_native(&self) -> String {
        match &self.root {
            Root::Posix => format!("/{}", self.segments.join("/")),
            Root::Drive(letter) => format!("{letter}:\\{}", self.segments.join("\\")),
            Root::Unc { server, share } => {
                let mut out = format!("\\\\{server}\\{share}");
                for segment in &self.segments {
                    out.push('\\');
                    out.push_str(segment);
                }
                out
            }
        }
    }

    /// Pushes `names` below `self`, refusing a `..` that would pop one of `self`'s own names.
    fn descend(&self, input: &str, names: impl Iterator<Item = Result<String, PathError>>) -> Result<Self, PathError> {
        let style = self.style();
        let base = self.segments.len();
        let mut segments = self.segments.clone();
        for name in names {
            match name?.as_str() {
                "" | "." => {}
                ".." => {
                    if segments.len() == base {
                        return Err(PathError::Escapes(input.to_owned()));
                    }
                    segments.pop();
                }
                name => {
                    check_name(name, style)?;
                    segments.push(name.to_owned());
                }
            }
        }
        Ok(PathUri { root: self.root.clone(), segments })
    }
}

/// The canonical URI: `file:///srv/p`, `file:///C:/x`, `file://server/share/x`, names
/// percent-encoded except for unreserved characters and `!$&'()*+,;=@`.
impl fmt::Display for PathUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.root {
            Root::Posix => f.write_str("file://")?,
            Root::Drive(letter) => write!(f, "file:///{letter}:")?,
            Root::Unc { server, share } => {
                write!(f, "file://{server}/")?;
                encode(f, share)?;
            }
        }
        let drive_or_posix_root = !matches!(self.root, Root::Unc { .. });
        if self.segments.is_empty() && drive_or_posix_root {
            return f.write_str("/");
        }
        for segment in &self.segments {
            f.write_str("/")?;
            encode(f, segment)?;
        }
        Ok(())
    }
}

fn strip_file_scheme(input: &str) -> Option<&str> {
    let scheme = input.get(..5)?;
    scheme.eq_ignore_ascii_case("file:").then(|| &input[5..])
}

fn not_a_uri(input: &str) -> PathError {
    let native = |hint| PathError::NativePath { input: input.to_owned(), hint };
    if input.starts_with("\\\\") {
        native("file://server/share/...")
    } else if drive_prefix(input).is_some() {
        native("file:///C:/...")
    } else if input.starts_with(['/', '\\', '~']) {
        native("file:///...")
    } else {
        PathError::NotFileUri(input.to_owned())
    }
}

/// `C:rest` -> (`C`, `rest`) with the letter upper-cased.
fn drive_prefix(s: &str) -> Option<(char, &str)> {
    let mut chars = s.chars();
    let letter = chars.next().filter(char::is_ascii_alphabetic)?;
    (chars.next() == Some(':')).then(|| (letter.to_ascii_uppercase(), &s[2..]))
}

fn unc_server(authority: &str) -> Result<String, PathError> {
    let valid = authority.len() <= 253
        && authority.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        && authority.chars().any(|c| c.is_ascii_alphanumeric());
    if !valid {
        return Err(PathError::BadServer(authority.to_owned()));
    }
    Ok(authority.to_ascii_lowercase())
}

fn decode(raw: &str) -> Result<String, PathError> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = raw.get(i + 1..i + 3).filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
            let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
            let byte = byte.ok_or_else(|| PathError::BadPercent(raw.to_owned()))?;
            if byte == b'/' || byte == b'\\' {
                return Err(PathError::EncodedSeparator(raw.to_owned()));
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let decoded = String::from_utf8(out).map_err(|_| PathError::NotUtf8(raw.to_owned()))?;
    if decoded.chars().any(char::is_control) {
        return Err(PathError::ControlCharacter);
    }
    Ok(decoded)
}

fn encode(f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
    for byte in name.bytes() {
        let keep = byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=@".contains(&byte);
        if keep {
            write!(f, "{}", byte as char)?;
        } else {
            write!(f, "%{byte:02X}")?;
        }
    }
    Ok(())
}

/// Checks one name (never `.` or `..`, handled by the caller).
fn check_name(name: &str, style: PathStyle) -> Result<(), PathError> {
    let bad = |reason| Err(PathError::BadName { name: name.to_owned(), reason });
    if name.contains(['/', '\\']) {
        return bad("a name can't contain a separator");
    }
    if name.chars().any(char::is_control) {
        return bad("a name can't contain a control character");
    }
    if style == PathStyle::Windows {
        if name.contains(['<', '>', ':', '"', '|', '?', '*']) {
            return bad("Windows names can't contain < > : \" | ? *");
        }
        if name.ends_with(['.', ' ']) {
            return bad("Windows drops a trailing dot or space, so the name would mean another file");
        }
        if is_windows_device(name) {
            return bad("a Windows device name");
        }
    }
    Ok(())
}

fn is_windows_device(name: &str) -> bool {
    let stem = name.split('.').next().unwrap_or_default().trim_end_matches(' ').to_ascii_uppercase();
    match stem.as_str() {
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$" => true,
        _ => {
            let numbered = stem.strip_prefix("COM").or_else(|| stem.strip_prefix("LPT"));
            numbered.is_some_and(|n| matches!(n, "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" | "¹" | "²" | "³"))
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::PathStyle::{Posix, Windows};
    use super::*;

    /// Which error a refused row must produce.
    type Expect = fn(&PathError) -> bool;

    fn uri(s: &str, style: PathStyle) -> PathUri {
        PathUri::parse(s, style).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parse_prints_canonical_uris() {
        let rows = [
            ("plain POSIX", "file:///srv/p", Posix, "file:///srv/p"),
            ("POSIX root", "file:///", Posix, "file:///"),
            ("localhost is local", "file://localhost/srv/p", Posix, "file:///srv/p"),
            ("LOCALHOST is local", "file://LOCALHOST/srv", Posix, "file:///srv"),
            ("one-slash form", "file:/srv/p", Posix, "file:///srv/p"),
            ("scheme is case-insensitive", "FILE:///srv/p", Posix, "file:///srv/p"),
            ("trailing slash dropped", "file:///srv/p/", Posix, "file:///srv/p"),
            ("duplicate separators", "file:///srv//p///q", Posix, "file:///srv/p/q"),
            ("dot segments", "file:///srv/./p/../q", Posix, "file:///srv/q"),
            ("dot-dot clamps at root", "file:///../../etc", Posix, "file:///etc"),
            ("encoded dots are dots", "file:///srv/p/%2e%2e/q", Posix, "file:///srv/q"),
            ("mixed-case encoded dots", "file:///srv/p/%2E./q", Posix, "file:///srv/q"),
            ("encoded single dot", "file:///srv/%2E/p", Posix, "file:///srv/p"),
            ("space re-encoded", "file:///srv/my dir", Posix, "file:///srv/my%20dir"),
            ("percent decoded and re-encoded", "file:///srv/a%20b%41", Posix, "file:///srv/a%20bA"),
            ("non-ASCII encoded as UTF-8", "file:///srv/caf%C3%A9", Posix, "file:///srv/caf%C3%A9"),
            ("raw non-ASCII accepted", "file:///srv/café", Posix, "file:///srv/caf%C3%A9"),
            ("literal percent", "file:///srv/100%25", Posix, "file:///srv/100%25"),
            ("colon in a POSIX name", "file:///srv/a:b", Posix, "file:///srv/a%3Ab"),
            ("POSIX keeps C: as a name", "file:///C:/x", Posix, "file:///C%3A/x"),
            ("Windows drive", "file:///C:/plugins/demo", Windows, "file:///C:/plugins/demo"),
            ("lower-case drive normalized", "file:///c:/plugins", Windows, "file:///C:/plugins"),
            ("drive root", "file:///C:", Windows, "file:///C:/"),
            ("drive root with slash", "file:///C:/", Windows, "file:///C:/"),
            ("dot-dot clamps at drive", "file:///C:/../../Windows", Windows, "file:///C:/Windows"),
            ("Windows encoded dots", "file:///C:/a/%2e%2E/b", Windows, "file:///C:/b"),
            ("Windows localhost", "file://localhost/D:/x", Windows, "file:///D:/x"),
            ("UNC", "file://server/share/dir", Windows, "file://server/share/dir"),
            ("UNC server lower-cased", "file://SERVER.corp/Share/Dir", Windows, "file://server.corp/Share/Dir"),
            ("UNC share root", "file://server/share/", Windows, "file://server/share"),
            ("dot-dot clamps at share", "file://server/share/a/../../../x", Windows, "file://server/share/x"),
        ];
        for (why, input, style, want) in rows {
            let parsed = PathUri::parse(input, style).unwrap_or_else(|e| panic!("{why}: {input}: {e}"));
            assert_eq!(parsed.to_string(), want, "{why}");
            assert_eq!(PathUri::parse(want, style).as_ref(), Ok(&parsed), "{why}: round trip");
        }
    }

    #[test]
    fn parse_refuses() {
        use PathError as E;
        let rows: [(&str, &str, PathStyle, Expect); 28] = [
            ("native POSIX path", "/srv/p", Posix, |e| matches!(e, E::NativePath { .. })),
            ("native Windows path", "C:\\x", Windows, |e| matches!(e, E::NativePath { .. })),
            ("native Windows path, slashes", "c:/x", Windows, |e| matches!(e, E::NativePath { .. })),
            ("native UNC path", "\\\\server\\share", Windows, |e| matches!(e, E::NativePath { .. })),
            ("home-relative path", "~/p", Posix, |e| matches!(e, E::NativePath { .. })),
            ("relative path", "srv/p", Posix, |e| matches!(e, E::NotFileUri(_))),
            ("other scheme", "https://example.com/p", Posix, |e| matches!(e, E::NotFileUri(_))),
            ("empty", "", Posix, |e| matches!(e, E::NotFileUri(_))),
            ("no absolute path", "file:srv/p", Posix, |e| matches!(e, E::NotAbsolute)),
            ("query", "file:///srv/p?x=1", Posix, |e| matches!(e, E::QueryOrFragment)),
            ("fragment", "file:///srv/p#x", Posix, |e| matches!(e, E::QueryOrFragment)),
            ("backslash in URI", "file:///C:\\x", Windows, |e| matches!(e, E::Backslash)),
            ("mixed separators in URI", "file:///srv/a\\..\\b", Posix, |e| matches!(e, E::Backslash)),
            ("bad escape", "file:///srv/%zz", Posix, |e| matches!(e, E::BadPercent(_))),
            ("truncated escape", "file:///srv/%2", Posix, |e| matches!(e, E::BadPercent(_))),
            ("not UTF-8", "file:///srv/%ff", Posix, |e| matches!(e, E::NotUtf8(_))),
            ("encoded slash", "file:///srv/..%2f..%2fetc", Posix, |e| matches!(e, E::EncodedSeparator(_))),
            ("encoded upper slash", "file:///srv/a%2Fb", Posix, |e| matches!(e, E::EncodedSeparator(_))),
            ("encoded backslash", "file:///C:/a%5c..%5c..", Windows, |e| matches!(e, E::EncodedSeparator(_))),
            ("encoded NUL", "file:///srv/a%00", Posix, |e| matches!(e, E::ControlCharacter)),
            ("POSIX with a host", "file://server/srv", Posix, |e| matches!(e, E::PosixHost(_))),
            ("Windows without drive", "file:///srv/p", Windows, |e| matches!(e, E::MissingDrive)),
            ("Windows empty path", "file:///", Windows, |e| matches!(e, E::MissingDrive)),
            ("drive-relative", "file:///C:relative", Windows, |e| matches!(e, E::DriveRelative(_))),
            ("UNC without share", "file://server/", Windows, |e| matches!(e, E::MissingShare)),
            ("UNC device namespace", "file://%3F/C:/x", Windows, |e| matches!(e, E::BadServer(_))),
            ("UNC dot server", "file://./pipe/x", Windows, |e| matches!(e, E::BadServer(_))),
            ("UNC server with port", "file://server:445/share", Windows, |e| matches!(e, E::BadServer(_))),
        ];
        for (why, input, style, expected) in rows {
            match PathUri::parse(input, style) {
                Ok(p) => panic!("{why}: {input} parsed as {p}"),
                Err(e) => assert!(expected(&e), "{why}: {input}: unexpected error {e:?}"),
            }
        }
    }

    #[test]
    fn windows_names_that_would_change_meaning_are_refused() {
        let rows = [
            ("trailing dot", "file:///C:/a./b"),
            ("dots then space", "file:///C:/.. /x"),
            ("three dots", "file:///C:/x/.../y"),
            ("trailing space", "file:///C:/a%20"),
            ("alternate data stream", "file:///C:/a/b:stream"),
            ("wildcard", "file:///C:/a*"),
            ("device", "file:///C:/x/NUL"),
            ("device with extension", "file:///C:/x/con.txt"),
            ("numbered device", "file:///C:/x/COM1"),
            ("UNC share device", "file://server/AUX"),
        ];
        for (why, input) in rows {
            let result = PathUri::parse(input, Windows);
            assert!(matches!(result, Err(PathError::BadName { .. })), "{why}: {input}: {result:?}");
        }
        assert!(PathUri::parse("file:///srv/a./con", Posix).is_ok(), "POSIX allows these names");
        assert!(PathUri::parse("file:///C:/x/COM10/console", Windows).is_ok(), "not devices");
    }

    #[test]
    fn join_resolves_relative_paths_under_the_base() {
        let rows = [
            ("simple", "file:///srv/p", Posix, "bin", "file:///srv/p/bin"),
            ("nested", "file:///srv/p", Posix, "a/b/c", "file:///srv/p/a/b/c"),
            ("empty is the base", "file:///srv/p", Posix, "", "file:///srv/p"),
            ("dot is the base", "file:///srv/p", Posix, ".", "file:///srv/p"),
            ("dot-dot inside", "file:///srv/p", Posix, "a/../b", "file:///srv/p/b"),
            ("back to the base", "file:///srv/p", Posix, "a/..", "file:///srv/p"),
            ("duplicate separators", "file:///srv/p", Posix, "a//b/", "file:///srv/p/a/b"),
            ("names are literal", "file:///srv/p", Posix, "%2e%2e", "file:///srv/p/%252e%252e"),
            ("space encoded", "file:///srv/p", Posix, "my dir", "file:///srv/p/my%20dir"),
            ("under the POSIX root", "file:///", Posix, "etc", "file:///etc"),
            ("Windows backslashes", "file:///C:/plugins/demo", Windows, "sub\\bin", "file:///C:/plugins/demo/sub/bin"),
            ("Windows slashes", "file:///C:/plugins/demo", Windows, "sub/bin", "file:///C:/plugins/demo/sub/bin"),
            ("mixed separators", "file:///C:/plugins/demo", Windows, "a\\b/c", "file:///C:/plugins/demo/a/b/c"),
            ("mixed dot-dot inside", "file:///C:/p", Windows, "a\\b/..\\c", "file:///C:/p/a/c"),
            ("UNC", "file://server/share/p", Windows, "x\\y", "file://server/share/p/x/y"),
        ];
        for (why, base, style, rel, want) in rows {
            let base = uri(base, style);
            let joined = base.join(rel).unwrap_or_else(|e| panic!("{why}: {rel}: {e}"));
            assert_eq!(joined.to_string(), want, "{why}");
            assert!(base.contains(&joined), "{why}: contained");
        }
    }

    #[test]
    fn join_refuses_escapes_and_non_relative_paths() {
        use PathError as E;
        let rows: [(&str, &str, PathStyle, &str, Expect); 14] = [
            ("climbs out", "file:///srv/p", Posix, "../../etc", |e| matches!(e, E::Escapes(_))),
            ("climbs one level", "file:///srv/p", Posix, "..", |e| matches!(e, E::Escapes(_))),
            ("climbs out after descending", "file:///srv/p", Posix, "a/../../p/x", |e| matches!(e, E::Escapes(_))),
            ("absolute", "file:///srv/p", Posix, "/etc", |e| matches!(e, E::NotRelative(_))),
            ("backslash name on POSIX", "file:///srv/p", Posix, "..\\..\\etc", |e| matches!(e, E::BadName { .. })),
            ("Windows climbs out", "file:///C:/p", Windows, "..\\..\\Windows", |e| matches!(e, E::Escapes(_))),
            ("Windows mixed climb", "file:///C:/p", Windows, "a/..\\../x", |e| matches!(e, E::Escapes(_))),
            ("drive-relative", "file:///C:/p", Windows, "C:relative", |e| matches!(e, E::NotRelative(_))),
            ("other drive", "file:///C:/p", Windows, "d:\\x", |e| matches!(e, E::NotRelative(_))),
            ("drive-rooted", "file:///C:/p", Windows, "\\Windows", |e| matches!(e, E::NotRelative(_))),
            ("UNC", "file:///C:/p", Windows, "\\\\server\\share", |e| matches!(e, E::NotRelative(_))),
            ("stream name", "file:///C:/p", Windows, "a\\b:c", |e| matches!(e, E::BadName { .. })),
            ("control character", "file:///srv/p", Posix, "a\nb", |e| matches!(e, E::ControlCharacter)),
            ("UNC share climb", "file://server/share", Windows, "..\\other", |e| matches!(e, E::Escapes(_))),
        ];
        for (why, base, style, rel, expected) in rows {
            match uri(base, style).join(rel) {
                Ok(p) => panic!("{why}: {rel} joined as {p}"),
                Err(e) => assert!(expected(&e), "{why}: {rel}: unexpected error {e:?}"),
            }
        }
    }

    #[test]
    fn join_ref_decodes_and_refuses_escapes() {
        use PathError as E;
        let base = uri("file:///srv/p", Posix);
        let good = [
            ("plain", "a/b", "file:///srv/p/a/b"),
            ("encoded space", "my%20dir", "file:///srv/p/my%20dir"),
            ("encoded dots inside", "a/%2e%2e/b", "file:///srv/p/b"),
        ];
        for (why, reference, want) in good {
            let joined = base.join_ref(reference).unwrap_or_else(|e| panic!("{why}: {e}"));
            assert_eq!(joined.to_string(), want, "{why}");
        }
        let bad: [(&str, &str, Expect); 8] = [
            ("encoded dots climb", "%2e%2e/%2E%2E/etc", |e| matches!(e, E::Escapes(_))),
            ("mixed-case encoded dots climb", "%2E./x", |e| matches!(e, E::Escapes(_))),
            ("encoded slash", "..%2f..%2fetc", |e| matches!(e, E::EncodedSeparator(_))),
            ("encoded backslash", "..%5c..%5cetc", |e| matches!(e, E::EncodedSeparator(_))),
            ("absolute path", "/etc", |e| matches!(e, E::NotRelative(_))),
            ("network path", "//server/x", |e| matches!(e, E::NotRelative(_))),
            ("scheme", "file:///etc", |e| matches!(e, E::NotRelative(_))),
            ("backslash", "a\\b", |e| matches!(e, E::Backslash)),
        ];
        for (why, reference, expected) in bad {
            match base.join_ref(reference) {
                Ok(p) => panic!("{why}: {reference} joined as {p}"),
                Err(e) => assert!(expected(&e), "{why}: {reference}: unexpected error {e:?}"),
            }
        }
        let windows = uri("file:///C:/p", Windows);
        assert!(matches!(windows.join_ref("D:/x"), Err(E::NotRelative(_))), "drive in a reference");
    }

    #[test]
    fn names_below_are_the_decoded_names_under_a_containing_base() {
        // The names joined with `|`.
        let rows = [
            ("itself", "file:///srv/p", "file:///srv/p", Posix, Some("")),
            ("decoded", "file:///srv/p", "file:///srv/p/a/my%20dir", Posix, Some("a|my dir")),
            ("drive letter case", "file:///C:/plugins", "file:///c:/plugins/demo", Windows, Some("demo")),
            ("UNC", "file://server/share", "file://SERVER/share/x", Windows, Some("x")),
            ("sibling", "file:///srv/p", "file:///srv/px", Posix, None),
            ("other share", "file://server/share", "file://server/other/x", Windows, None),
        ];
        for (why, base, path, style, want) in rows {
            let (base, path) = (uri(base, style), uri(path, style));
            assert_eq!(path.names_below(&base).map(|n| n.join("|")).as_deref(), want, "{why}");
        }
    }

    #[test]
    fn containment_is_lexical_and_segment_wise() {
        let rows = [
            ("itself", "file:///srv/p", "file:///srv/p", Posix, true),
            ("child", "file:///srv/p", "file:///srv/p/x/y", Posix, true),
            ("sibling with shared prefix", "file:///srv/p", "file:///srv/px", Posix, false),
            ("parent", "file:///srv/p", "file:///srv", Posix, false),
            ("root contains all", "file:///", "file:///etc", Posix, true),
            ("normalized before comparing", "file:///srv/p", "file:///srv/p/../px", Posix, false),
            ("POSIX is case-sensitive", "file:///srv/p", "file:///srv/P/x", Posix, false),
            ("drive letters ignore case", "file:///C:/plugins", "file:///c:/plugins/demo", Windows, true),
            ("other drive", "file:///C:/plugins", "file:///D:/plugins/demo", Windows, false),
            ("Windows names compare exactly", "file:///C:/plugins", "file:///C:/Plugins/demo", Windows, false),
            ("drive root contains the drive", "file:///C:/", "file:///C:/x", Windows, true),
            ("UNC child", "file://server/share", "file://server/share/x", Windows, true),
            ("UNC server ignores case", "file://Server/share", "file://SERVER/share/x", Windows, true),
            ("UNC other share", "file://server/share", "file://server/other/x", Windows, false),
            ("UNC is not a drive", "file:///C:/", "file://server/share", Windows, false),
        ];
        for (why, a, b, style, want) in rows {
            assert_eq!(uri(a, style).contains(&uri(b, style)), want, "{why}");
        }
        let posix_root = uri("file:///", Posix);
        let windows = uri("file:///C:/x", Windows);
        assert!(!posix_root.contains(&windows), "styles never contain each other");
    }

    #[test]
    fn parent_and_native_forms() {
        let rows = [
            ("file:///srv/p/.mcp.json", Posix, Some("file:///srv/p"), "/srv/p/.mcp.json"),
            ("file:///", Posix, None, "/"),
            ("file:///C:/plugins/demo", Windows, Some("file:///C:/plugins"), "C:\\plugins\\demo"),
            ("file:///C:/", Windows, None, "C:\\"),
            ("file://server/share/dir", Windows, Some("file://server/share"), "\\\\server\\share\\dir"),
            ("file://server/share", Windows, None, "\\\\server\\share"),
        ];
        for (input, style, parent, native) in rows {
            let p = uri(input, style);
            assert_eq!(p.parent().map(|p| p.to_string()).as_deref(), parent, "{input}: parent");
            assert_eq!(p.to_native(), native, "{input}: native");
        }
    }

    /// Pieces that exercise normalization, encoding and traversal.
    fn atom() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "a",
            "B",
            "sub",
            "x y",
            "%20",
            "caf%C3%A9",
            ".",
            "..",
            "",
            "%2e%2e",
            "%2E.",
            "%2e",
            "%41",
            "p",
            "px",
            "~t",
            "a.b",
            "%25",
            "%2f",
            "%5C",
            "c:",
            "NUL",
            "a.",
            "é",
        ])
    }

    fn style() -> impl Strategy<Value = PathStyle> {
        prop_oneof![Just(Posix), Just(Windows)]
    }

    fn root_prefix(style: PathStyle) -> impl Strategy<Value = &'static str> {
        match style {
            Posix => prop::sample::select(vec!["file://", "file://localhost", "file:"]),
            Windows => {
                prop::sample::select(vec!["file:///C:", "file:///c:", "file://Srv/share", "file://localhost/D:"])
            }
        }
    }

    /// A messy URI: the root, then atoms joined by one or two slashes.
    fn messy_uri() -> impl Strategy<Value = (PathStyle, String)> {
        style().prop_flat_map(|style| {
            let seps = prop::collection::vec((atom(), prop::bool::ANY), 0..8);
            (Just(style), root_prefix(style), seps).prop_map(|(style, prefix, parts)| {
                let mut s = prefix.to_owned();
                for (atom, double) in parts {
                    s.push_str(if double { "//" } else { "/" });
                    s.push_str(atom);
                }
                (style, s)
            })
        })
    }

    /// A relative path in the style's separators, Windows mixing `\` and `/`.
    fn relative(style: PathStyle) -> impl Strategy<Value = String> {
        prop::collection::vec((atom(), prop::bool::ANY), 0..8).prop_map(move |parts| {
            let mut s = String::new();
            for (i, (atom, backslash)) in parts.into_iter().enumerate() {
                if i > 0 {
                    s.push(if backslash && style == Windows { '\\' } else { '/' });
                }
                s.push_str(atom);
            }
            s
        })
    }

    fn parsed_with_relative() -> impl Strategy<Value = (PathUri, String)> {
        messy_uri().prop_filter_map("unparsable", |(style, s)| PathUri::parse(&s, style).ok()).prop_flat_map(|base| {
            let style = base.style();
            (Just(base), relative(style))
        })
    }

    fn encoded_suffix(base: &PathUri, other: &PathUri) -> String {
        struct Enc<'a>(&'a str);
        impl fmt::Display for Enc<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                encode(f, self.0)
            }
        }
        let names: Vec<String> = other.segments[base.segments.len()..].iter().map(|s| Enc(s).to_string()).collect();
        names.join("/")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn display_round_trips_and_normalizing_is_idempotent((style, s) in messy_uri()) {
            if let Ok(p) = PathUri::parse(&s, style) {
                let printed = p.to_string();
                let again = PathUri::parse(&printed, style).expect("canonical form parses");
                prop_assert_eq!(&again, &p);
                prop_assert_eq!(again.to_string(), printed);
                prop_assert!(p.contains(&p), "containment is reflexive");
            }
        }

        #[test]
        fn join_stays_inside_or_fails((base, rel) in parsed_with_relative()) {
            if let Ok(joined) = base.join(&rel) {
                prop_assert!(base.contains(&joined), "{} joined {:?} gave {}", base, rel, joined);
                let reparsed = PathUri::parse(&joined.to_string(), base.style());
                prop_assert_eq!(reparsed.as_ref(), Ok(&joined));
            }
            let reference = rel.replace('\\', "/");
            if let Ok(joined) = base.join_ref(&reference) {
                prop_assert!(base.contains(&joined), "{} joined ref {:?} gave {}", base, reference, joined);
            }
        }

        #[test]
        fn containment_agrees_with_join((base, rel) in parsed_with_relative(), (style, s) in messy_uri()) {
            if let Ok(joined) = base.join(&rel) {
                let back = base.join_ref(&encoded_suffix(&base, &joined));
                prop_assert_eq!(back.as_ref(), Ok(&joined));
            }
            if let Ok(other) = PathUri::parse(&s, style)
                && base.contains(&other)
            {
                let back = base.join_ref(&encoded_suffix(&base, &other));
                prop_assert_eq!(back.as_ref(), Ok(&other), "a contained path is a join of its suffix");
            }
        }
    }
}
