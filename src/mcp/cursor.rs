//! Pagination cursors of the aggregated lists (`prompts/list`, `resources/list`,
//! `resources/templates/list`): opaque to the client, sealed (HMAC-SHA256) with a key that
//! every replica on the database shares, so a page minted by one replica is good on another
//! (stateless requests go to any of them), and bound to the list, the tenant, the user and the
//! session (or, outside a session, to the tenant and user alone), with an expiry. A cursor that was altered, minted
//! for another caller or another list, or that expired is refused (-32602): it can never
//! reach another tenant's items, and a forged offset reads nothing.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use serde::{Deserialize, Serialize};

use crate::store::now_millis;

/// How many items one page holds.
pub const PAGE: usize = 100;

/// How long a cursor stays usable.
const LIFETIME_MS: i64 = 10 * 60 * 1000;

/// A sealing key.
pub struct CursorKey(hmac::Key);

/// Who and what a cursor was minted for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    pub list: &'static str,
    pub tenant: &'a str,
    pub user: &'a str,
    pub session: Option<&'a str>,
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    l: String,
    t: String,
    u: String,
    s: Option<String>,
    o: usize,
    x: i64,
}

impl CursorKey {
    /// The key of a secret the replicas share (see [`crate::store::Db::shared_key`]): what it
    /// seals is good on every replica of the database.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    /// `value`, sealed: readable by anyone, alterable by nobody without the key.
    pub fn seal(&self, value: &impl Serialize) -> String {
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap_or_default());
        let tag = URL_SAFE_NO_PAD.encode(hmac::sign(&self.0, body.as_bytes()).as_ref());
        format!("{body}.{tag}")
    }

    /// What [`CursorKey::seal`] sealed, if `token` is intact.
    pub fn unseal<T: serde::de::DeserializeOwned>(&self, token: &str) -> Option<T> {
        let (body, tag) = token.split_once('.')?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        hmac::verify(&self.0, body.as_bytes(), &tag).ok()?;
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()
    }

    /// The cursor of the page that starts at `offset`.
    pub fn mint(&self, owner: &Owner<'_>, offset: usize) -> String {
        let sealed = Sealed {
            l: owner.list.to_owned(),
            t: owner.tenant.to_owned(),
            u: owner.user.to_owned(),
            s: owner.session.map(str::to_owned),
            o: offset,
            x: now_millis() + LIFETIME_MS,
        };
        self.seal(&sealed)
    }

    /// The offset `cursor` stands for, if it is intact, unexpired and `owner`'s.
    pub fn open(&self, owner: &Owner<'_>, cursor: &str) -> Option<usize> {
        let sealed: Sealed = self.unseal(cursor)?;
        let mine = sealed.l == owner.list
            && sealed.t == owner.tenant
            && sealed.u == owner.user
            && sealed.s.as_deref() == owner.session
            && sealed.x > now_millis();
        mine.then_some(sealed.o)
    }
}

/// One page of `items` for the request's cursor, and the next page's cursor. A cursor that
/// does not open is refused.
pub fn page<T>(
    key: &CursorKey,
    owner: &Owner<'_>,
    cursor: Option<&str>,
    mut items: Vec<T>,
) -> Result<(Vec<T>, Option<String>), rmcp::ErrorData> {
    let start = match cursor {
        None => 0,
        Some(cursor) => {
            key.open(owner, cursor).ok_or_else(|| rmcp::ErrorData::invalid_params("invalid cursor", None))?
        }
    };
    let start = start.min(items.len());
    let end = start.saturating_add(PAGE).min(items.len());
    let next = (end < items.len()).then(|| key.mint(owner, end));
    items.truncate(end);
    Ok((items.split_off(start), next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner<'a>(tenant: &'a str, session: Option<&'a str>) -> Owner<'a> {
        Owner { list: "resources", tenant, user: "u1", session }
    }

    #[test]
    fn pages_follow_each_other_and_end() {
        let key = CursorKey::from_secret(&[5; 32]);
        let me = owner("t1", Some("s1"));
        let items: Vec<usize> = (0..PAGE * 2 + 5).collect();
        let (first, next) = page(&key, &me, None, items.clone()).unwrap();
        assert_eq!(first, (0..PAGE).collect::<Vec<_>>());
        let (second, next) = page(&key, &me, next.as_deref(), items.clone()).unwrap();
        assert_eq!(second.first(), Some(&PAGE));
        let (third, next) = page(&key, &me, next.as_deref(), items).unwrap();
        assert_eq!(third.len(), 5);
        assert!(next.is_none());
    }

    #[test]
    fn a_cursor_is_refused_to_anyone_else_and_when_altered() {
        let key = CursorKey::from_secret(&[5; 32]);
        let me = owner("t1", Some("s1"));
        let cursor = key.mint(&me, 100);
        assert_eq!(key.open(&me, &cursor), Some(100));
        assert_eq!(key.open(&owner("t2", Some("s1")), &cursor), None, "another tenant");
        assert_eq!(key.open(&owner("t1", Some("s2")), &cursor), None, "another session");
        assert_eq!(key.open(&owner("t1", None), &cursor), None, "outside the session");
        assert_eq!(key.open(&Owner { user: "u2", ..me.clone() }, &cursor), None, "another user");
        assert_eq!(key.open(&Owner { list: "prompts", ..me.clone() }, &cursor), None, "another list");
        assert_eq!(CursorKey::from_secret(&[6; 32]).open(&me, &cursor), None, "another key");
        // A forged body (offset 0 for another tenant) with the old tag.
        let (_, tag) = cursor.split_once('.').unwrap();
        let forged =
            Sealed { l: "resources".into(), t: "t2".into(), u: "u1".into(), s: Some("s1".into()), o: 0, x: i64::MAX };
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
        assert_eq!(key.open(&owner("t2", Some("s1")), &format!("{body}.{tag}")), None);
        assert!(page(&key, &me, Some("garbage"), vec![1]).is_err());
    }
}
