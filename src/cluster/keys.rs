//! The published key set: every replica's assertion-signing public keys, in the database.
//!
//! A replica publishes a key before it signs with it (at start, and at a rotation: the new key
//! is written, then installed), and keeps the key it signs with published one assertion
//! lifetime and three heartbeats ahead. A key retired by a rotation, or whose replica stopped
//! or died, is not extended any more and so drops out of the set once every assertion it may
//! have signed has expired. `/.well-known/jwks.json` on any replica reads the set, so an
//! upstream that fetches it through a load balancer verifies an assertion of any replica.
//!
//! Threat model: the private keys never leave their process (the database holds public keys
//! only), so reading the database signs nothing; writing it could publish a key of the
//! writer's choosing, as writing it could already grant anything.

use std::time::Duration;

use serde_json::{Value, json};

use super::Cluster;
use crate::auth::assertion::{AssertionError, NextKey};
use crate::store::{StoreError, now_millis};

/// Why a rotation did not happen (the current key keeps signing).
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error(transparent)]
    Key(#[from] AssertionError),
    #[error("publishing the new key: {0}")]
    Store(#[from] StoreError),
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

impl Cluster {
    /// Until when a key signing now must stay published: past the expiry of an assertion signed
    /// just before the next heartbeat, with two heartbeats to spare.
    fn publish_horizon(&self) -> i64 {
        now_millis() + millis(self.signer.lifetime()) + 3 * millis(self.heartbeat) + 1000
    }

    /// Publishes the key signing now (or keeps it published) up to the horizon.
    pub(super) async fn publish_current_key(&self) -> Result<(), StoreError> {
        let (kid, jwk) = self.signer.current();
        let until = self.publish_horizon();
        self.db.publish_signing_key(&kid, &jwk.to_string(), &self.id, now_millis(), until).await
    }

    /// Starts signing with a new key, published first; the old one stays published until its
    /// last assertions have expired (its horizon already covers them).
    pub async fn rotate_key(&self) -> Result<(), RotateError> {
        let next = NextKey::generate()?;
        let (kid, jwk) = next.public();
        let now = now_millis();
        self.db.publish_signing_key(&kid, &jwk.to_string(), &self.id, now, self.publish_horizon()).await?;
        let (old, _) = self.signer.current();
        self.signer.install(next);
        // The old key signed until now: published for a lifetime more at least.
        self.db.extend_signing_key(&old, now + millis(self.signer.lifetime()) + 1000).await?;
        tracing::info!(kid = %kid, retired = %old, "assertion signing key rotated");
        Ok(())
    }

    /// The published key set, as `/.well-known/jwks.json` serves it: every replica's keys from
    /// the database; when it can't be read, this replica's own (what it signs with is always
    /// verifiable from here).
    pub async fn jwks(&self) -> Value {
        match self.db.published_signing_keys(now_millis()).await {
            Ok(rows) => {
                let mut keys: Vec<Value> = rows.iter().filter_map(|jwk| serde_json::from_str(jwk).ok()).collect();
                // A key installed here is published first; this only covers a row that a
                // concurrent purge or a clock step took away.
                for own in self.signer.jwks()["keys"].as_array().into_iter().flatten() {
                    if !keys.iter().any(|k| k["kid"] == own["kid"]) {
                        keys.push(own.clone());
                    }
                }
                json!({ "keys": keys })
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the published keys failed; serving this replica's own");
                self.signer.jwks()
            }
        }
    }
}
