//! Authorizing a replica-to-replica link: a replica proves it is one of the database's
//! replicas by an HMAC under the key they share (`shared_keys` row `replicas`), over what it
//! asks for (a purpose such as one executor's agent), which replica it asks, when, and a
//! nonce. The asked replica accepts an authorization once, within [`MAX_SKEW_MS`] of its time,
//! and only when it is the one asked.
//!
//! `scopegate-replica: <from>.<unix ms>.<nonce>.<base64url HMAC-SHA256>`, the HMAC over
//! `"<purpose>\n<from>\n<to>\n<unix ms>\n<nonce>"`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;

use std::collections::HashMap;
use std::sync::Mutex;

use super::lock;
use crate::store::now_millis;

/// The request header that carries a link's authorization.
pub const REPLICA_HEADER: &str = "scopegate-replica";

/// How far the two replicas' clocks (and the request's travel) may differ.
const MAX_SKEW_MS: i64 = 30_000;

/// Why a link was refused (the text is for logs; the peer learns only that it was).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefused {
    #[error("malformed authorization")]
    Malformed,
    #[error("addressed to another replica")]
    NotForUs,
    #[error("outside the allowed clock skew")]
    Stale,
    #[error("bad signature")]
    Signature,
    #[error("authorization already used")]
    Replayed,
}

fn message(purpose: &str, from: &str, to: &str, at: i64, nonce: &str) -> String {
    format!("{purpose}\n{from}\n{to}\n{at}\n{nonce}")
}

/// One replica's side of link authorization.
pub(super) struct Links {
    id: String,
    key: hmac::Key,
    /// Authorizations already accepted, by sender and nonce, with when they go stale.
    seen: Mutex<HashMap<String, i64>>,
}

impl Links {
    pub(super) fn new(id: &str, secret: &[u8; 32]) -> Self {
        Self { id: id.to_owned(), key: hmac::Key::new(hmac::HMAC_SHA256, secret), seen: Mutex::default() }
    }

    /// The authorization for asking replica `to` for `purpose`.
    pub(super) fn authorize(&self, to: &str, purpose: &str) -> String {
        let at = now_millis();
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let tag = hmac::sign(&self.key, message(purpose, &self.id, to, at, &nonce).as_bytes());
        format!("{}.{at}.{nonce}.{}", self.id, URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// Checks an authorization presented to this replica for `purpose`; the asking replica's
    /// id when it holds.
    pub(super) fn check(&self, presented: &str, purpose: &str) -> Result<String, LinkRefused> {
        let mut parts = presented.trim().split('.');
        let (Some(from), Some(at), Some(nonce), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(LinkRefused::Malformed);
        };
        let at: i64 = at.parse().map_err(|_| LinkRefused::Malformed)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| LinkRefused::Malformed)?;
        if from.is_empty() || nonce.is_empty() || nonce.len() > 64 {
            return Err(LinkRefused::Malformed);
        }
        hmac::verify(&self.key, message(purpose, from, &self.id, at, nonce).as_bytes(), &tag)
            .map_err(|_| LinkRefused::Signature)?;
        let now = now_millis();
        if (now - at).abs() > MAX_SKEW_MS {
            return Err(LinkRefused::Stale);
        }
        let mut seen = lock(&self.seen);
        seen.retain(|_, expires| *expires > now);
        if seen.insert(format!("{from}.{nonce}"), at + MAX_SKEW_MS).is_some() {
            return Err(LinkRefused::Replayed);
        }
        Ok(from.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_holds_once_for_its_purpose_between_replicas_of_one_key() {
        let (a, b) = (Links::new("a", &[7; 32]), Links::new("b", &[7; 32]));
        let auth = a.authorize("b", "agent:build-01");
        assert_eq!(b.check(&auth, "agent:build-01"), Ok("a".to_owned()));
        assert_eq!(b.check(&auth, "agent:build-01"), Err(LinkRefused::Replayed), "used once");
        let auth = a.authorize("b", "agent:build-01");
        assert_eq!(b.check(&auth, "agent:other"), Err(LinkRefused::Signature), "another purpose");
        let c = Links::new("c", &[7; 32]);
        assert_eq!(c.check(&a.authorize("b", "p"), "p"), Err(LinkRefused::Signature), "asked another replica");
        let stranger = Links::new("a", &[8; 32]);
        assert_eq!(b.check(&stranger.authorize("b", "p"), "p"), Err(LinkRefused::Signature), "another key");
        for bad in ["", "a.b.c", "a.1.n.!!", "a.x.n.AAAA", "a.1.n.AAAA.extra"] {
            assert!(b.check(bad, "p").is_err(), "{bad}");
        }
        // Signed correctly, but long ago.
        let old = now_millis() - 60_000;
        let tag = hmac::sign(&a.key, message("p", "a", "b", old, "n1").as_bytes());
        let stale = format!("a.{old}.n1.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()));
        assert_eq!(b.check(&stale, "p"), Err(LinkRefused::Stale));
    }
}
