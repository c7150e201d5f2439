//! The identity provider's key set: from a file, a URL, or the issuer's discovery metadata.
//!
//! - **Start-up never waits on the provider.** The first fetch is tried once (briefly); when
//!   the provider is down the gateway starts without keys, refuses the tokens it cannot verify
//!   (503, not 401: a client must not re-authorise because of it), reports not ready on
//!   `/readyz`, and a background task fetches with backoff until it has them.
//! - **Periodic refresh** after the key set's `Cache-Control: max-age` (clamped), or
//!   `auth.jwks_cache_secs` when it sends none; a failed refresh keeps the keys it has.
//! - **Rotation without a refusal window.** A `kid` the set does not hold makes one fetch at
//!   once; requests arriving meanwhile wait for that same fetch (single flight). Fetches
//!   provoked this way are at least `auth.jwks_refetch_min_interval_secs` apart (a request
//!   inside the floor waits for its end rather than being refused) and at most
//!   `auth.jwks_refetch_per_minute` a minute (beyond that, an unknown `kid` is refused at once).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio_util::sync::CancellationToken;

use super::discovery;

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
    #[error("fetching {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("parsing JWKS: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("JWKS holds no usable RS256, ES256 or EdDSA key")]
    Empty,
    #[error("discovering the key set of issuer {issuer}: {message}")]
    Discovery { issuer: String, message: String },
}

pub use crate::config::JwksSource;

/// How often the key set is fetched.
#[derive(Debug, Clone, Copy)]
pub struct FetchPolicy {
    /// Refresh interval when the key set sends no `Cache-Control: max-age`.
    pub max_age: Duration,
    /// Floor between two fetches provoked by an unknown `kid`.
    pub floor: Duration,
    /// Most fetches provoked by unknown `kid`s per minute.
    pub per_minute: u32,
}

/// A `Cache-Control: max-age` is honoured within these bounds.
const MIN_MAX_AGE: Duration = Duration::from_secs(30);
const MAX_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Backoff of the background fetch while it has no keys, or a refresh fails.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// Largest key set or metadata document read.
pub(crate) const MAX_DOCUMENT_BYTES: usize = 1 << 20;

#[derive(Default)]
struct KeySet {
    by_kid: HashMap<String, VerifyingKey>,
    /// The key to use for a token without `kid`: only when the set holds exactly one key.
    only: Option<VerifyingKey>,
}

struct Fetched {
    keys: Arc<KeySet>,
    /// When to fetch again (periodic refresh).
    refresh_at: Instant,
}

/// What the on-demand fetches remember: when each was made (the last minute's).
#[derive(Default)]
struct Demand {
    recent: VecDeque<Instant>,
}

/// Keys from one source.
pub struct Jwks {
    source: JwksSource,
    client: reqwest::Client,
    policy: FetchPolicy,
    current: RwLock<Option<Fetched>>,
    /// The key set's URL once known (the discovered `jwks_uri`, for an issuer).
    jwks_uri: RwLock<Option<String>>,
    /// Bumped by every completed fetch attempt: a request that waited for the single-flight
    /// lock sees whether a fetch happened meanwhile.
    attempts: AtomicU64,
    /// Serializes fetches (single flight) and holds the on-demand budget.
    demand: tokio::sync::Mutex<Demand>,
    /// A tenant's issuer: the key set its metadata names must be at a public https URL (see
    /// `store::issuers::check_url`).
    restricted: bool,
}

/// Why a key was not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMiss {
    /// The set (as fetched now) has no such key.
    Unknown,
    /// There is no key set yet: the provider has not been reached.
    NoKeys,
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
        // A key meant for encryption never verifies a signature.
        if jwk.common.public_key_use.as_ref().is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature) {
            continue;
        }
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

/// A document's body, at most [`MAX_DOCUMENT_BYTES`], and its `Cache-Control: max-age`.
pub(crate) async fn get_document(
    client: &reqwest::Client,
    url: &str,
) -> Result<(Vec<u8>, Option<Duration>), JwksError> {
    let err = |message: String| JwksError::Fetch { url: url.to_owned(), message };
    let mut resp = client.get(url).send().await.map_err(|e| err(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(err(format!("HTTP {}", resp.status())));
    }
    let max_age = resp.headers().get(http::header::CACHE_CONTROL).and_then(|v| v.to_str().ok()).and_then(cache_max_age);
    let body = read_bounded(&mut resp, MAX_DOCUMENT_BYTES).await.map_err(|e| err(e.to_string()))?;
    Ok((body, max_age))
}

/// Why a bounded body was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("larger than {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    Read(reqwest::Error),
}

/// A response's body, refused once it passes `limit` bytes (what a provider answers is read
/// no further than that).
pub(crate) async fn read_bounded(resp: &mut reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Read)? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `max-age` of a `Cache-Control` value (`no-store` and `no-cache` count as zero).
fn cache_max_age(value: &str) -> Option<Duration> {
    let mut age = None;
    for directive in value.split(',').map(str::trim) {
        let lower = directive.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(secs) = lower.strip_prefix("max-age=") {
            age = secs.trim_matches('"').parse::<u64>().ok().map(Duration::from_secs);
        }
    }
    age
}

impl Jwks {
    /// A key set from `source`, not fetched yet (see [`Jwks::first_load`] and
    /// [`Jwks::spawn_refresh`]).
    pub fn new(source: JwksSource, policy: FetchPolicy, restricted: bool) -> Result<Arc<Self>, JwksError> {
        crate::tls::install_provider();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .build()
            .map_err(|e| JwksError::Fetch { url: String::new(), message: e.to_string() })?;
        let jwks_uri = match &source {
            JwksSource::Url(url) => Some(url.clone()),
            _ => None,
        };
        Ok(Arc::new(Self {
            source,
            client,
            policy,
            current: RwLock::new(None),
            jwks_uri: RwLock::new(jwks_uri),
            attempts: AtomicU64::new(0),
            demand: tokio::sync::Mutex::new(Demand::default()),
            restricted,
        }))
    }

    /// The first fetch, at start-up. A file must be readable (it is local: an error is a
    /// configuration error); a URL or an issuer is tried once, within `patience`, and when the
    /// provider is down start-up goes on without keys (the background task keeps trying).
    pub async fn first_load(&self, patience: Duration) -> Result<(), JwksError> {
        if let JwksSource::File(_) = self.source {
            return self.fetch_now().await;
        }
        match tokio::time::timeout(patience, self.fetch_now()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the identity provider's keys could not be fetched at start-up; \
                 tokens are refused (503) and /readyz says not ready until they are"),
            Err(_) => tracing::warn!(
                "the identity provider did not answer at start-up; tokens are refused (503) \
                 and /readyz says not ready until its keys are fetched"
            ),
        }
        Ok(())
    }

    /// Whether a key set is held.
    pub fn has_keys(&self) -> bool {
        self.current.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    fn snapshot(&self) -> Option<(Arc<KeySet>, Instant)> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).as_ref().map(|f| (Arc::clone(&f.keys), f.refresh_at))
    }

    /// The key for `kid` (or the only key, for a token without `kid`). A miss makes one
    /// on-demand fetch, shared with every request that misses meanwhile.
    pub async fn key(&self, kid: Option<&str>) -> Result<VerifyingKey, KeyMiss> {
        let seen = self.attempts.load(Ordering::Acquire);
        if let Some((keys, _)) = self.snapshot()
            && let Some(found) = lookup(&keys, kid)
        {
            return Ok(found);
        }
        self.on_demand(seen).await;
        match self.snapshot() {
            Some((keys, _)) => lookup(&keys, kid).ok_or(KeyMiss::Unknown),
            None => Err(KeyMiss::NoKeys),
        }
    }

    /// One fetch for a miss seen when `seen` attempts had completed: none if another
    /// completed since (it is the fetch this request waited for), none beyond the minute's
    /// budget, and not before the floor since the last one (the request waits for it).
    async fn on_demand(&self, seen: u64) {
        let mut demand = self.demand.lock().await;
        if self.attempts.load(Ordering::Acquire) != seen {
            return;
        }
        let now = Instant::now();
        while demand.recent.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60)) {
            demand.recent.pop_front();
        }
        if demand.recent.len() >= self.policy.per_minute as usize {
            crate::telemetry::metrics::jwks_fetch("budget");
            return;
        }
        if let Some(last) = demand.recent.back() {
            let wait = self.policy.floor.saturating_sub(now.duration_since(*last));
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        demand.recent.push_back(Instant::now());
        if let Err(e) = self.fetch_now().await {
            tracing::warn!(error = %e, "key set fetch for an unknown kid failed; keeping the keys held");
        }
    }

    /// Fetches the set now and installs it; on failure the held keys stay.
    async fn fetch_now(&self) -> Result<(), JwksError> {
        let result = self.fetch().await;
        self.attempts.fetch_add(1, Ordering::AcqRel);
        match result {
            Ok((keys, max_age)) => {
                let max_age = match max_age {
                    Some(age) => age.clamp(MIN_MAX_AGE, MAX_MAX_AGE),
                    None => self.policy.max_age,
                };
                let fetched = Fetched { keys: Arc::new(keys), refresh_at: Instant::now() + max_age };
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(fetched);
                crate::telemetry::metrics::jwks_fetch("ok");
                tracing::debug!(refresh_in_secs = max_age.as_secs(), "key set fetched");
                Ok(())
            }
            Err(e) => {
                crate::telemetry::metrics::jwks_fetch("error");
                Err(e)
            }
        }
    }

    async fn fetch(&self) -> Result<(KeySet, Option<Duration>), JwksError> {
        let url = match &self.source {
            JwksSource::File(path) => {
                let body =
                    tokio::fs::read(path).await.map_err(|source| JwksError::File { path: path.clone(), source })?;
                return Ok((parse_set(&body)?, None));
            }
            JwksSource::Url(url) => url.clone(),
            JwksSource::Issuer(issuer) => {
                let known = self.jwks_uri.read().unwrap_or_else(|p| p.into_inner()).clone();
                match known {
                    Some(url) => url,
                    None => {
                        let metadata = discovery::discover(&self.client, issuer).await?;
                        if self.restricted
                            && let Err(e) = crate::store::issuers::check_url("jwks_uri", &metadata.jwks_uri, false)
                        {
                            return Err(JwksError::Discovery { issuer: issuer.clone(), message: e.to_string() });
                        }
                        *self.jwks_uri.write().unwrap_or_else(|p| p.into_inner()) = Some(metadata.jwks_uri.clone());
                        metadata.jwks_uri
                    }
                }
            }
        };
        let fetched = get_document(&self.client, &url).await.and_then(|(body, age)| Ok((parse_set(&body)?, age)));
        if fetched.is_err() && matches!(self.source, JwksSource::Issuer(_)) {
            // The key set may have moved: discover it again next time.
            *self.jwks_uri.write().unwrap_or_else(|p| p.into_inner()) = None;
        }
        fetched
    }

    /// The background task: fetches until there are keys (backoff from half a second to 30 s),
    /// then refreshes them when they are due.
    pub fn spawn_refresh(self: &Arc<Self>, shutdown: CancellationToken) {
        let jwks = Arc::clone(self);
        tokio::spawn(async move {
            let mut backoff = BACKOFF_FIRST;
            loop {
                let wait = match jwks.snapshot() {
                    None => Duration::ZERO,
                    Some((_, due)) => due.saturating_duration_since(Instant::now()),
                };
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                // A fetch on demand may have refreshed the set meanwhile.
                if jwks.snapshot().is_some_and(|(_, due)| due > Instant::now()) {
                    continue;
                }
                let fetched = {
                    let _single = jwks.demand.lock().await;
                    jwks.fetch_now().await
                };
                match fetched {
                    Ok(()) => backoff = BACKOFF_FIRST,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "key set fetch failed");
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(BACKOFF_CAP);
                        // A held set that failed to refresh is tried again after the backoff.
                        if let Some(fetched) = jwks.current.write().unwrap_or_else(|p| p.into_inner()).as_mut() {
                            fetched.refresh_at = Instant::now();
                        }
                    }
                }
            }
        });
    }
}

fn lookup(keys: &KeySet, kid: Option<&str>) -> Option<VerifyingKey> {
    match kid {
        Some(kid) => keys.by_kid.get(kid).cloned(),
        None => keys.only.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_read_from_cache_control() {
        assert_eq!(cache_max_age("public, max-age=600"), Some(Duration::from_secs(600)));
        assert_eq!(cache_max_age("max-age=\"60\", must-revalidate"), Some(Duration::from_secs(60)));
        assert_eq!(cache_max_age("no-store"), Some(Duration::ZERO));
        assert_eq!(cache_max_age("public"), None);
    }
}
