//! JWKS key sets from a file or a URL: cached, refetched on an unknown `kid` at a bounded rate.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::{Mutex, RwLock};

/// A verification key and the one algorithm it may verify. Binding the algorithm to the
/// key (not to the token's header) is what stops algorithm confusion.
#[derive(Clone)]
pub struct VerifyingKey {
    pub key: DecodingKey,
    pub alg: Algorithm,
}

#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("reading JWKS file {path}: {source}")]
    File { path: PathBuf, source: std::io::Error },
    #[error("fetching JWKS from {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("parsing JWKS: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("JWKS holds no usable RS256, ES256 or EdDSA key")]
    Empty,
}

#[derive(Debug, Clone)]
pub enum JwksSource {
    File(PathBuf),
    Url(String),
}

#[derive(Default)]
struct KeySet {
    by_kid: HashMap<String, VerifyingKey>,
    /// The key to use for a token without `kid`: only when the set holds exactly one key.
    only: Option<VerifyingKey>,
}

struct Fetched {
    keys: KeySet,
    at: Instant,
}

/// Keys from one JWKS source.
pub struct Jwks {
    source: JwksSource,
    client: reqwest::Client,
    current: RwLock<Fetched>,
    /// Serializes refetches and remembers when the last one was attempted.
    last_attempt: Mutex<Instant>,
    max_age: Duration,
    min_refetch_interval: Duration,
}

/// The algorithm a JWK may verify: its `alg` when present, else the one its key type implies.
/// Symmetric (`oct`) keys are never taken from a JWKS.
fn key_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    let implied = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P384 => Algorithm::ES384,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => Algorithm::EdDSA,
        _ => return None,
    };
    let declared = match jwk.common.key_algorithm {
        None => return Some(implied),
        Some(KeyAlgorithm::RS256) => Algorithm::RS256,
        Some(KeyAlgorithm::RS384) => Algorithm::RS384,
        Some(KeyAlgorithm::RS512) => Algorithm::RS512,
        Some(KeyAlgorithm::PS256) => Algorithm::PS256,
        Some(KeyAlgorithm::PS384) => Algorithm::PS384,
        Some(KeyAlgorithm::PS512) => Algorithm::PS512,
        Some(KeyAlgorithm::ES256) => Algorithm::ES256,
        Some(KeyAlgorithm::ES384) => Algorithm::ES384,
        Some(KeyAlgorithm::EdDSA) => Algorithm::EdDSA,
        Some(_) => return None,
    };
    // A declared alg must belong to the key's own family.
    (declared.family() == implied.family()).then_some(declared)
}

fn parse_set(body: &[u8]) -> Result<KeySet, JwksError> {
    let set: JwkSet = serde_json::from_slice(body)?;
    let mut keys = KeySet::default();
    let mut usable = Vec::new();
    for jwk in &set.keys {
        let Some(alg) = key_algorithm(jwk) else {
            tracing::warn!(kid = ?jwk.common.key_id, "JWKS key skipped: not an RSA, P-256/P-384 or Ed25519 key");
            continue;
        };
        let key = match DecodingKey::from_jwk(jwk) {
            Ok(key) => key,
            Err(e) => {
                tracing::warn!(kid = ?jwk.common.key_id, error = %e, "JWKS key skipped: unreadable");
                continue;
            }
        };
        let vk = VerifyingKey { key, alg };
        if let Some(kid) = &jwk.common.key_id {
            keys.by_kid.insert(kid.clone(), vk.clone());
        }
        usable.push(vk);
    }
    if usable.is_empty() {
        return Err(JwksError::Empty);
    }
    if usable.len() == 1 {
        keys.only = usable.pop();
    }
    Ok(keys)
}

impl Jwks {
    /// Loads the set once; start-up fails when it can't be read.
    pub async fn load(
        source: JwksSource,
        max_age: Duration,
        min_refetch_interval: Duration,
    ) -> Result<Arc<Self>, JwksError> {
        crate::tls::install_provider();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| JwksError::Fetch { url: String::new(), message: e.to_string() })?;
        let keys = fetch(&source, &client).await?;
        let now = Instant::now();
        Ok(Arc::new(Self {
            source,
            client,
            current: RwLock::new(Fetched { keys, at: now }),
            last_attempt: Mutex::new(now),
            max_age,
            min_refetch_interval,
        }))
    }

    /// The key for `kid` (or the only key, for a token without `kid`). An unknown `kid`,
    /// or a cache older than its max age, triggers a refetch, at most one per interval.
    pub async fn key(&self, kid: Option<&str>) -> Option<VerifyingKey> {
        {
            let current = self.current.read().await;
            if current.at.elapsed() < self.max_age
                && let Some(found) = lookup(&current.keys, kid)
            {
                return Some(found);
            }
        }
        self.refetch().await;
        lookup(&self.current.read().await.keys, kid)
    }

    async fn refetch(&self) {
        let mut last = self.last_attempt.lock().await;
        if last.elapsed() < self.min_refetch_interval {
            return;
        }
        *last = Instant::now();
        match fetch(&self.source, &self.client).await {
            Ok(keys) => {
                *self.current.write().await = Fetched { keys, at: Instant::now() };
                tracing::info!("JWKS refreshed");
            }
            // Keep serving the keys we have; a broken IdP must not lock everyone out at once.
            Err(e) => tracing::warn!(error = %e, "JWKS refetch failed; keeping the cached keys"),
        }
    }
}

fn lookup(keys: &KeySet, kid: Option<&str>) -> Option<VerifyingKey> {
    match kid {
        Some(kid) => keys.by_kid.get(kid).cloned(),
        None => keys.only.clone(),
    }
}

async fn fetch(source: &JwksSource, client: &reqwest::Client) -> Result<KeySet, JwksError> {
    let body = match source {
        JwksSource::File(path) => {
            tokio::fs::read(path).await.map_err(|source| JwksError::File { path: path.clone(), source })?
        }
        JwksSource::Url(url) => {
            let err = |e: reqwest::Error| JwksError::Fetch { url: url.clone(), message: e.to_string() };
            let resp = client.get(url).send().await.map_err(err)?.error_for_status().map_err(err)?;
            resp.bytes().await.map_err(err)?.to_vec()
        }
    };
    parse_set(&body)
}
