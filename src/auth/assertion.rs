//! Identity assertions for upstream MCP servers: short-lived EdDSA JWTs signed by the
//! gateway (tenant, user, roles, flock scope; audience = the upstream server id). The client's
//! own token is never forwarded. Public keys are published at `/.well-known/jwks.json`;
//! a rotated-out key stays published until every assertion it signed has expired.
//!
//! An assertion may be reused for the same caller and upstream for a short while
//! (`upstream.assertion_reuse_ms`, at most half its lifetime): what it asserts is exactly
//! what a fresh one would (the key is every claim but the times and `jti`), so reuse never
//! makes an upstream believe anything a fresh assertion would not; its `jti` then names the
//! assertion, not the call.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde::Serialize;
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum AssertionError {
    #[error("generating a signing key failed")]
    KeyGeneration,
    #[error("signing: {0}")]
    Sign(#[from] serde_json::Error),
}

struct SigningKey {
    /// The parsed key pair: signing with it costs one signature, nothing more. (jsonwebtoken's
    /// `encode` re-parses the PKCS#8 document and re-derives the public key on every call,
    /// which cost as much again as the signature itself.)
    pair: Ed25519KeyPair,
    /// `base64url({"alg":"EdDSA","typ":"JWT","kid":...}) + "."`, the same for every assertion.
    header: String,
    /// The public key, as a JWK.
    jwk: Value,
    /// When it stopped signing (None: the current key).
    retired: Option<Instant>,
}

/// Who an assertion speaks for: plain values from `McpCallContext`.
#[derive(Debug, Clone, Serialize)]
pub struct AssertedCaller {
    pub tenant: String,
    pub tenant_id: String,
    pub user: String,
    pub user_id: String,
    pub roles: Vec<String>,
    /// "all", or the flock ids the caller may touch.
    pub flocks: Value,
}

/// Signs identity assertions; rotates its key.
pub struct AssertionSigner {
    issuer: String,
    lifetime: Duration,
    keys: RwLock<Vec<SigningKey>>,
    /// How long a signed assertion is handed out again (zero: never).
    reuse: Duration,
    /// Recently signed assertions by audience and caller, with when they were signed.
    recent: Mutex<HashMap<String, (Instant, String)>>,
}

/// Beyond this many remembered assertions, stale ones are dropped (and, if none are, all).
const MAX_REMEMBERED: usize = 10_000;

fn generate() -> Result<SigningKey, AssertionError> {
    let rng = SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| AssertionError::KeyGeneration)?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| AssertionError::KeyGeneration)?;
    let x = URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
    // The key id is a digest of the public key: unique per key, stable, meaningless.
    let kid = format!("sg-{}", &crate::vocab::digest::sha256_hex(pair.public_key().as_ref())[..24]);
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"});
    let header = json!({"alg": "EdDSA", "typ": "JWT", "kid": kid});
    let header = format!("{}.", URL_SAFE_NO_PAD.encode(header.to_string()));
    Ok(SigningKey { pair, header, jwk, retired: None })
}

fn kid_of(jwk: &Value) -> String {
    jwk["kid"].as_str().unwrap_or_default().to_owned()
}

/// A key made but not signing yet: published first (where every replica's JWKS lists it),
/// then installed with [`AssertionSigner::install`].
pub struct NextKey(SigningKey);

impl NextKey {
    pub fn generate() -> Result<Self, AssertionError> {
        generate().map(Self)
    }

    /// Its id and its public JWK.
    pub fn public(&self) -> (String, Value) {
        (kid_of(&self.0.jwk), self.0.jwk.clone())
    }
}

/// An assertion's claims, borrowed from the caller.
#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: &'a str,
    iat: i64,
    nbf: i64,
    exp: i64,
    jti: String,
    tid: &'a str,
    tenant_id: &'a str,
    user_id: &'a str,
    roles: &'a [String],
    flocks: &'a Value,
}

impl AssertionSigner {
    /// A signer with a fresh key. `lifetime` is how long each assertion is valid.
    pub fn new(issuer: impl Into<String>, lifetime: Duration) -> Result<Self, AssertionError> {
        Ok(Self {
            issuer: issuer.into(),
            lifetime,
            keys: RwLock::new(vec![generate()?]),
            reuse: Duration::ZERO,
            recent: Mutex::new(HashMap::new()),
        })
    }

    /// Hands a signed assertion out again for `reuse` (at most half the lifetime, so an
    /// upstream always receives one with at least half its life left).
    #[must_use]
    pub fn with_reuse(mut self, reuse: Duration) -> Self {
        self.reuse = reuse.min(self.lifetime / 2);
        self
    }

    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Starts signing with a new key. The old one stays published for one assertion lifetime
    /// (plus a second of slack), then is dropped.
    pub fn rotate(&self) -> Result<(), AssertionError> {
        self.install(NextKey(generate()?));
        Ok(())
    }

    /// The key signing now: its id and its public JWK.
    pub fn current(&self) -> (String, Value) {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let current = keys.iter().rev().find(|k| k.retired.is_none()).unwrap_or(&keys[keys.len() - 1]);
        (kid_of(&current.jwk), current.jwk.clone())
    }

    /// Starts signing with `next` (see [`NextKey`]); the old key is retired as by [`Self::rotate`].
    pub fn install(&self, next: NextKey) {
        let fresh = next.0;
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        for k in keys.iter_mut() {
            k.retired.get_or_insert(now);
        }
        keys.push(fresh);
        drop(keys);
        // From now on every assertion is signed with the new key.
        self.recent.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn prune(&self) {
        let keep = self.lifetime + Duration::from_secs(1);
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        keys.retain(|k| k.retired.is_none_or(|at| at.elapsed() <= keep));
    }

    /// The published key set: the current key and every retired key whose assertions may
    /// still be valid.
    pub fn jwks(&self) -> Value {
        self.prune();
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() })
    }

    /// An assertion of `caller` for `audience`: one signed for the very same claims less than
    /// the reuse period ago, or else a fresh one.
    pub fn assertion(&self, caller: &AssertedCaller, audience: &str) -> Result<String, AssertionError> {
        if self.reuse.is_zero() {
            return self.sign(caller, audience);
        }
        let key = serde_json::to_string(&(audience, caller))?;
        if let Some((signed, token)) = self.recent.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && signed.elapsed() < self.reuse
        {
            return Ok(token.clone());
        }
        let signed = Instant::now();
        let token = self.sign(caller, audience)?;
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() >= MAX_REMEMBERED {
            recent.retain(|_, (at, _)| at.elapsed() < self.reuse);
            if recent.len() >= MAX_REMEMBERED {
                recent.clear();
            }
        }
        recent.insert(key, (signed, token.clone()));
        Ok(token)
    }

    /// An assertion of `caller` for the upstream server `audience`: a compact JWS (RFC 7515)
    /// with an EdDSA signature (RFC 8037), verifiable with any JWT library and the JWKS.
    pub fn sign(&self, caller: &AssertedCaller, audience: &str) -> Result<String, AssertionError> {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let claims = Claims {
            iss: &self.issuer,
            aud: audience,
            sub: &caller.user,
            iat: now,
            nbf: now,
            exp: now + self.lifetime.as_secs().max(1) as i64,
            jti: uuid::Uuid::now_v7().to_string(),
            tid: &caller.tenant,
            tenant_id: &caller.tenant_id,
            user_id: &caller.user_id,
            roles: &caller.roles,
            flocks: &caller.flocks,
        };
        let claims = serde_json::to_vec(&claims)?;
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let current = keys.iter().rev().find(|k| k.retired.is_none()).ok_or(AssertionError::KeyGeneration)?;
        // header. + claims . + 64-byte signature, each base64url without padding.
        let len = current.header.len() + base64::encoded_len(claims.len(), false).unwrap_or(0) + 1 + 86;
        let mut token = String::with_capacity(len);
        token.push_str(&current.header);
        URL_SAFE_NO_PAD.encode_string(&claims, &mut token);
        let signature = current.pair.sign(token.as_bytes());
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(signature.as_ref(), &mut token);
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::jwk::JwkSet;
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};

    fn caller() -> AssertedCaller {
        AssertedCaller {
            tenant: "acme".into(),
            tenant_id: "t".into(),
            user: "wanda@acme.test".into(),
            user_id: "u".into(),
            roles: vec!["worker".into()],
            flocks: json!(["f1"]),
        }
    }

    fn verify(jwks: &Value, token: &str, audience: &str) -> Result<Value, jsonwebtoken::errors::Error> {
        let set: JwkSet = serde_json::from_value(jwks.clone()).unwrap();
        let kid = jsonwebtoken::decode_header(token)?.kid.unwrap();
        let jwk = set.find(&kid).ok_or(jsonwebtoken::errors::ErrorKind::InvalidKeyFormat)?;
        let mut v = Validation::new(Algorithm::EdDSA);
        v.set_audience(&[audience]);
        v.set_issuer(&["scopegate"]);
        v.leeway = 0;
        Ok(jsonwebtoken::decode::<Value>(token, &DecodingKey::from_jwk(jwk)?, &v)?.claims)
    }

    #[test]
    fn assertions_verify_with_the_published_keys_and_only_for_their_audience() {
        let signer = AssertionSigner::new("scopegate", Duration::from_secs(30)).unwrap();
        let token = signer.sign(&caller(), "notes").unwrap();
        let claims = verify(&signer.jwks(), &token, "notes").unwrap();
        assert_eq!(claims["sub"], "wanda@acme.test");
        assert_eq!(claims["tid"], "acme");
        assert_eq!(claims["flocks"], json!(["f1"]));
        assert!(verify(&signer.jwks(), &token, "other-server").is_err(), "audience is the upstream server");
        let other = AssertionSigner::new("scopegate", Duration::from_secs(30)).unwrap();
        assert!(verify(&other.jwks(), &token, "notes").is_err(), "another gateway's keys don't verify it");
    }

    #[test]
    fn an_assertion_is_reused_only_for_the_same_claims_and_within_the_period() {
        let signer =
            AssertionSigner::new("scopegate", Duration::from_secs(30)).unwrap().with_reuse(Duration::from_millis(300));
        let first = signer.assertion(&caller(), "notes").unwrap();
        assert_eq!(signer.assertion(&caller(), "notes").unwrap(), first, "reused within the period");
        assert_ne!(signer.assertion(&caller(), "other").unwrap(), first, "another audience");
        let changes: [fn(&mut AssertedCaller); 6] = [
            |c| c.tenant = "globex".into(),
            |c| c.tenant_id = "t2".into(),
            |c| c.user = "walt@acme.test".into(),
            |c| c.user_id = "u2".into(),
            |c| c.roles = vec!["owner".into()],
            |c| c.flocks = json!("all"),
        ];
        for change in changes {
            let mut other = caller();
            change(&mut other);
            let token = signer.assertion(&other, "notes").unwrap();
            assert_ne!(token, first, "{other:?} gets its own assertion");
            let claims = verify(&signer.jwks(), &token, "notes").unwrap();
            assert_eq!(claims["sub"], other.user.as_str());
            assert_eq!(claims["roles"], json!(other.roles));
            assert_eq!(claims["flocks"], other.flocks);
        }
        std::thread::sleep(Duration::from_millis(350));
        let later = signer.assertion(&caller(), "notes").unwrap();
        assert_ne!(later, first, "a fresh one once the period is over");
        assert_eq!(signer.assertion(&caller(), "notes").unwrap(), later);
        signer.rotate().unwrap();
        let rotated = signer.assertion(&caller(), "notes").unwrap();
        assert_ne!(
            jsonwebtoken::decode_header(&rotated).unwrap().kid,
            jsonwebtoken::decode_header(&later).unwrap().kid,
            "after a rotation, signed with the new key"
        );
    }

    #[test]
    fn without_reuse_and_beyond_half_the_lifetime_nothing_is_reused_longer() {
        let signer = AssertionSigner::new("scopegate", Duration::from_secs(30)).unwrap();
        assert_ne!(signer.assertion(&caller(), "notes").unwrap(), signer.assertion(&caller(), "notes").unwrap());
        let capped =
            AssertionSigner::new("scopegate", Duration::from_secs(1)).unwrap().with_reuse(Duration::from_secs(60));
        let first = capped.assertion(&caller(), "notes").unwrap();
        std::thread::sleep(Duration::from_millis(550));
        assert_ne!(capped.assertion(&caller(), "notes").unwrap(), first, "reuse is capped at half the lifetime");
    }

    #[test]
    fn a_rotated_key_stays_published_until_its_assertions_expire() {
        let signer = AssertionSigner::new("scopegate", Duration::from_secs(1)).unwrap();
        let old = signer.sign(&caller(), "notes").unwrap();
        signer.rotate().unwrap();
        let new = signer.sign(&caller(), "notes").unwrap();
        assert_ne!(jsonwebtoken::decode_header(&old).unwrap().kid, jsonwebtoken::decode_header(&new).unwrap().kid);
        assert_eq!(signer.jwks()["keys"].as_array().unwrap().len(), 2);
        verify(&signer.jwks(), &old, "notes").expect("the old key is still published");
        std::thread::sleep(Duration::from_millis(2100));
        assert_eq!(signer.jwks()["keys"].as_array().unwrap().len(), 1, "dropped once its assertions expired");
        assert!(verify(&signer.jwks(), &old, "notes").is_err());
        let fresh = signer.sign(&caller(), "notes").unwrap();
        verify(&signer.jwks(), &fresh, "notes").expect("the current key is published");
        let _ = new;
    }
}
