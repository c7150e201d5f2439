//! Canonical `file:` URIs: a root or a base is written exactly as [`PathUri`] prints it, and
//! its convention (POSIX or Windows) comes from the URI itself. The rules are in
//! `selection::roots`, which decides who may select which root with them.

use super::{PathError, PathStyle, PathUri};

/// Why a string is not a canonical `file:` URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    /// Not a `file:` URI at all (a native path, a relative path, another scheme) or a
    /// malformed one (encoded separators, bad escapes, Windows device names...).
    #[error(transparent)]
    Syntax(#[from] PathError),
    /// A valid `file:` URI written another way than the gateway prints it.
    #[error("`{given}` is not a canonical file: URI (write it as `{canonical}`)")]
    NotCanonical { given: String, canonical: String },
}

/// The path convention a `file:` URI is written in: Windows for a drive letter or a server
/// name, POSIX otherwise.
pub fn style_of(uri: &str) -> PathStyle {
    let rest = match uri.get(..5) {
        Some(scheme) if scheme.eq_ignore_ascii_case("file:") => &uri[5..],
        _ => return PathStyle::Posix,
    };
    let (authority, path) = match rest.strip_prefix("//") {
        Some(after) => after.split_at(after.find('/').unwrap_or(after.len())),
        None => ("", rest),
    };
    let b = path.as_bytes();
    let drive = b.first() == Some(&b'/') && b.get(1).is_some_and(u8::is_ascii_alphabetic) && b.get(2) == Some(&b':');
    let server = !(authority.is_empty() || authority.eq_ignore_ascii_case("localhost"));
    if drive || server { PathStyle::Windows } else { PathStyle::Posix }
}

/// Parses `input` in the convention it is written in ([`style_of`]) and accepts it only if it
/// is already in canonical form.
pub fn parse_canonical(input: &str) -> Result<PathUri, CanonicalError> {
    let parsed = PathUri::parse(input, style_of(input))?;
    let canonical = parsed.to_string();
    if canonical != input {
        return Err(CanonicalError::NotCanonical { given: input.to_owned(), canonical });
    }
    Ok(parsed)
}
