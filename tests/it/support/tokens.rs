//! Tokens for tests: a JWT signer of any algorithm, key sets, and the claims a test gateway
//! accepts.

use std::path::PathBuf;

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use scopegate::config::Config;
use serde_json::{Value, json};

/// A JWT signer for tests: any algorithm, any claims.
pub struct Signer {
    pub alg: Algorithm,
    pub kid: Option<String>,
    pub key: EncodingKey,
}

/// The HS256 secret of the tests' gateways. Not the shipped one: that one is refused on a
/// gateway others can reach, and the tests' public URL (`http://gateway.test`) is such a gateway.
pub const TEST_SECRET: &str = "scopegate-tests-private-secret-0123456789abcdef";

pub fn key_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/keys").join(name)
}

impl Signer {
    pub fn hs256(secret: &str) -> Self {
        Self { alg: Algorithm::HS256, kid: None, key: EncodingKey::from_secret(secret.as_bytes()).unwrap() }
    }

    /// The tests' development secret ([`TEST_SECRET`]).
    pub fn dev() -> Self {
        Self::hs256(TEST_SECRET)
    }

    pub fn from_pem(alg: Algorithm, file: &str, kid: &str) -> Self {
        let pem = std::fs::read(key_path(file)).expect("read key");
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem),
            other => panic!("no PEM signer for {other:?}"),
        }
        .expect("parse key");
        Self { alg, kid: Some(kid.to_owned()), key }
    }

    /// The public JWK of this signer (asymmetric only).
    pub fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg).expect("jwk");
        jwk.common.key_id = self.kid.clone();
        jwk
    }

    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = self.kid.clone();
        jsonwebtoken::encode(&header, claims, &self.key).expect("sign")
    }
}

pub fn jwks_json(signers: &[&Signer]) -> String {
    serde_json::to_string(&JwkSet { keys: signers.iter().map(|s| s.jwk()).collect() }).unwrap()
}

pub fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Claims the gateway `config` accepts, for `subject` in `tenant`.
pub fn claims(config: &Config, tenant: &str, subject: &str) -> Value {
    json!({
        "iss": config.auth.issuer,
        "aud": config.audience(),
        "sub": subject,
        "tid": tenant,
        "iat": now(),
        "exp": now() + 600,
    })
}

/// The tenant of a demo subject: `olivia@acme.test` is acme's.
pub fn tenant_of(subject: &str) -> &str {
    subject.rsplit('@').next().unwrap().split('.').next().unwrap()
}
