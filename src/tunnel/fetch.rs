//! The wire types of a Fetch channel (see the module docs of `tunnel`): the response head the
//! agent sends first, and the text form header values travel in. Both sides use these, so the
//! encoding is written once.

use serde::{Deserialize, Serialize};

/// The largest request body a Fetch carries (it travels inside the Open).
pub const FETCH_MAX_BODY: usize = 64 * 1024;

/// The most redirects a Fetch that follows them follows (the eleventh fails as unreachable).
pub const FETCH_MAX_REDIRECTS: usize = 10;

/// The response head: the first Data frame of an accepted Fetch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchHead {
    pub status: u16,
    /// In order, a name repeated as often as received; values as [`header_to_wire`] writes them.
    pub headers: Vec<(String, String)>,
}

/// A header value as JSON text: every byte becomes the character of that code point
/// (ISO-8859-1), so any value, even one that is not UTF-8, comes back byte for byte and an
/// ASCII value reads as itself.
pub fn header_to_wire(value: &[u8]) -> String {
    value.iter().map(|&b| char::from(b)).collect()
}

/// The bytes of a header value written by [`header_to_wire`]; `None` for a character above
/// U+00FF, which that never writes.
pub fn header_from_wire(text: &str) -> Option<Vec<u8>> {
    text.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_travel_byte_for_byte() {
        let all: Vec<u8> = (0..=255u8).collect();
        for value in [&b"Bearer abc.def"[..], b"", &all, "d\u{e9}j\u{e0}".as_bytes()] {
            let text = header_to_wire(value);
            assert_eq!(header_from_wire(&text).as_deref(), Some(value), "{text:?}");
        }
        assert_eq!(header_to_wire(b"text/html; q=0.9"), "text/html; q=0.9", "ASCII reads as itself");
        assert_eq!(header_from_wire("\u{100}"), None);
    }
}
