//! Bearer authentication: verifies a JWT and returns its claims; never looks at the database.
//!
//! The algorithm is chosen by the key, never by the token: HS256 tokens are checked only
//! against the configured development secret, and a JWKS key verifies only the one
//! algorithm its type (or its declared `alg`) allows. So an HS256 token signed with an
//! RSA public key, or an `alg: none` token, never verifies.

pub mod assertion;
pub mod discovery;
pub mod jwks;
pub mod mapping;
pub mod mint;

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::config::{Config, TenantMatch};
use jwks::{FetchPolicy, Jwks, JwksError, KeyMiss};
use mapping::ClaimPath;

/// Why a bearer token was refused. Every variant is a 401; the text goes to logs and
/// metrics, and a short, fixed description goes to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token")]
    Missing,
    #[error("malformed token")]
    Malformed,
    #[error("algorithm not accepted")]
    Algorithm,
    #[error("unknown key id")]
    UnknownKey,
    #[error("bad signature")]
    Signature,
    #[error("token expired")]
    Expired,
    #[error("token not yet valid")]
    NotYetValid,
    #[error("wrong issuer")]
    Issuer,
    #[error("wrong audience")]
    Audience,
    #[error("missing or invalid claim")]
    Claims,
    #[error("no tenant claim")]
    MissingTenant,
    #[error("the tenant claim names several tenants")]
    AmbiguousTenant,
    #[error("the identity provider's keys are not available")]
    KeysUnavailable,
}

impl AuthError {
    /// A stable label for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            AuthError::Missing => "missing_token",
            AuthError::Malformed => "malformed",
            AuthError::Algorithm => "algorithm",
            AuthError::UnknownKey => "unknown_kid",
            AuthError::Signature => "signature",
            AuthError::Expired => "expired",
            AuthError::NotYetValid => "not_yet_valid",
            AuthError::Issuer => "issuer",
            AuthError::Audience => "audience",
            AuthError::Claims => "claims",
            AuthError::MissingTenant => "missing_tenant",
            AuthError::AmbiguousTenant => "ambiguous_tenant",
            AuthError::KeysUnavailable => "keys_unavailable",
        }
    }

    /// What the client is told in `error_description`.
    pub fn description(self) -> &'static str {
        match self {
            AuthError::Missing => "a bearer token is required",
            AuthError::Expired => "the access token expired",
            AuthError::NotYetValid => "the access token is not valid yet",
            AuthError::KeysUnavailable => "the access token cannot be verified now; try again shortly",
            AuthError::Malformed
            | AuthError::Algorithm
            | AuthError::UnknownKey
            | AuthError::Signature
            | AuthError::Issuer
            | AuthError::Audience
            | AuthError::Claims
            | AuthError::MissingTenant
            | AuthError::AmbiguousTenant => "the access token is invalid",
        }
    }
}

/// Claims of a verified token: who (`sub`), which tenant, until when.
#[derive(Debug, Clone)]
pub struct Claims {
    /// The subject, from `auth.subject_claim`.
    pub subject: String,
    /// The tenant claim's value: a slug, or an organization id (`tenant_match`).
    pub tenant: String,
    /// What `tenant` names.
    pub tenant_match: TenantMatch,
    pub expires_at: i64,
    pub issuer: String,
    /// The token's scopes (`scope` and `scp`), sorted.
    pub scopes: Vec<String>,
    /// Issued by an identity provider a tenant trusts (`store::issuers`), not the gateway's
    /// own: it names that tenant's users only, never a platform administrator or a service.
    pub tenant_issuer: bool,
    /// All the token's claims (a tenant that provisions users on first sight reads its
    /// group claim, and `name`, from here).
    pub rest: Map<String, Value>,
}

impl Claims {
    /// How the token names its tenant.
    pub fn tenant_key(&self) -> crate::store::principal::TenantKey<'_> {
        use crate::store::principal::TenantKey;
        match self.tenant_match {
            TenantMatch::Slug => TenantKey::Slug(&self.tenant),
            TenantMatch::OrgId => TenantKey::OrgId(&self.tenant),
        }
    }

    /// Whether the token carries every one of `scopes`.
    pub fn has_scopes(&self, scopes: &[String]) -> bool {
        scopes.iter().all(|s| self.scopes.binary_search(s).is_ok())
    }
}

/// Verifies bearer tokens against the configured keys.
pub struct Authenticator {
    hs256: Option<DecodingKey>,
    jwks: Option<Arc<Jwks>>,
    /// One validation per algorithm a key may verify, built once (each accepts only its own
    /// algorithm).
    validations: Vec<Validation>,
    tenant_claim: ClaimPath,
    tenant_match: TenantMatch,
    subject_claim: ClaimPath,
    /// `auth.issuer`.
    own_issuer: String,
    /// The gateway's audience, the default of a tenant issuer's.
    audience: String,
    /// How key sets are fetched (the own issuer's and tenants' alike).
    policy: FetchPolicy,
    /// `auth.tenant_issuers_insecure`.
    insecure: bool,
    /// Key sets of tenants' issuers, made on first use.
    tenant_keys: std::sync::Mutex<std::collections::HashMap<jwks::JwksSource, Arc<Jwks>>>,
    /// Set once the background tasks start: tenant key sets are refreshed until it is cancelled.
    shutdown: std::sync::OnceLock<tokio_util::sync::CancellationToken>,
    /// `auth.leeway_secs`: a token is honoured until the instant `exp` plus this.
    leeway_secs: i64,
}

/// Every algorithm a configured key can verify: HS256 with the development secret, the
/// asymmetric ones from a JWKS.
const KEY_ALGORITHMS: &[Algorithm] = &[
    Algorithm::HS256,
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// How long start-up waits for the identity provider's keys before going on without them.
const FIRST_LOAD_PATIENCE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error(transparent)]
    Jwks(#[from] JwksError),
    #[error("auth.hs256_secret: {0}")]
    Secret(jsonwebtoken::errors::Error),
}

impl Authenticator {
    pub async fn from_config(config: &Config) -> Result<Self, AuthSetupError> {
        let a = &config.auth;
        let hs256 = if a.hs256_secret.is_empty() {
            None
        } else {
            Some(DecodingKey::from_secret(a.hs256_secret.expose().as_bytes()).map_err(AuthSetupError::Secret)?)
        };
        let policy = FetchPolicy {
            max_age: Duration::from_secs(a.jwks_cache_secs),
            floor: Duration::from_secs(a.jwks_refetch_min_interval_secs),
            per_minute: a.jwks_refetch_per_minute,
        };
        let jwks = match config.key_source() {
            Some(source) => {
                let jwks = Jwks::new(source, policy, false)?;
                jwks.first_load(FIRST_LOAD_PATIENCE).await?;
                Some(jwks)
            }
            None => None,
        };
        let validations = KEY_ALGORITHMS
            .iter()
            .map(|alg| {
                let mut validation = Validation::new(*alg);
                validation.leeway = a.leeway_secs;
                validation.validate_exp = true;
                validation.validate_nbf = true;
                validation.validate_aud = true;
                // `sub` is read where `auth.subject_claim` says (and required there).
                validation.set_required_spec_claims(&["exp", "iss", "aud"]);
                validation.set_issuer(&[a.issuer.as_str()]);
                validation.set_audience(&[config.audience()]);
                validation
            })
            .collect();
        let leeway_secs = i64::try_from(a.leeway_secs).unwrap_or(i64::MAX);
        Ok(Self {
            hs256,
            jwks,
            validations,
            tenant_claim: ClaimPath::parse(&a.tenant_claim),
            tenant_match: a.tenant_match,
            subject_claim: ClaimPath::parse(&a.subject_claim),
            own_issuer: a.issuer.clone(),
            audience: config.audience(),
            policy,
            insecure: a.tenant_issuers_insecure,
            tenant_keys: std::sync::Mutex::default(),
            shutdown: std::sync::OnceLock::new(),
            leeway_secs,
        })
    }

    /// The `iss` of a token that is not the gateway's own issuer's (read before verifying, to
    /// know which tenant issuer's keys verify it); `None` for the own issuer's, an HS256 token,
    /// or a token that is not a JWT (those take the own issuer's path, and its refusals).
    pub fn foreign_issuer(&self, token: &str) -> Option<String> {
        use base64::Engine;
        let header = jsonwebtoken::decode_header(token).ok()?;
        if matches!(header.alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
            return None;
        }
        let payload = token.split('.').nth(1)?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
        #[derive(serde::Deserialize)]
        struct Iss {
            iss: String,
        }
        let Iss { iss } = serde_json::from_slice(&bytes).ok()?;
        (iss != self.own_issuer).then_some(iss)
    }

    /// Verifies a token of `issuer`, an issuer tenants trust (`trusts`: its rows, all of that
    /// issuer): with that issuer's keys (its key set URL, or discovered) and audience, and then
    /// the tenant: the trusting row's, where its tenant claim (if it names one) names that
    /// row's tenant. Exactly one row must match: none is no tenant, several are ambiguous. A
    /// token of an issuer no tenant trusts is refused as of a wrong issuer.
    pub async fn verify_trusted(
        &self,
        token: &str,
        issuer: &str,
        trusts: &[crate::store::issuers::TrustedIssuer],
    ) -> Result<Claims, AuthError> {
        if trusts.is_empty() {
            return Err(AuthError::Issuer);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Malformed)?;
        // Rows that verify alike (the same keys and audience) are tried together.
        let mut groups: Vec<(jwks::JwksSource, String, Vec<&crate::store::issuers::TrustedIssuer>)> = Vec::new();
        for row in trusts {
            let source = match &row.jwks_url {
                Some(url) => jwks::JwksSource::Url(url.clone()),
                None => jwks::JwksSource::Issuer(issuer.to_owned()),
            };
            let audience = row.audience.clone().unwrap_or_else(|| self.audience.clone());
            match groups.iter_mut().find(|(s, a, _)| *s == source && *a == audience) {
                Some((_, _, rows)) => rows.push(row),
                None => groups.push((source, audience, vec![row])),
            }
        }
        let mut refusal = AuthError::Signature;
        for (source, audience, rows) in groups {
            let jwks = self.tenant_jwks(source)?;
            let vk = match jwks.key(header.kid.as_deref()).await {
                Ok(vk) => vk,
                Err(KeyMiss::Unknown) => {
                    refusal = AuthError::UnknownKey;
                    continue;
                }
                Err(KeyMiss::NoKeys) => return Err(AuthError::KeysUnavailable),
            };
            if vk.alg != header.alg {
                refusal = AuthError::Algorithm;
                continue;
            }
            let mut validation = self.validation(vk.alg)?.clone();
            validation.set_issuer(&[issuer]);
            validation.set_audience(&[audience.as_str()]);
            let claims = match jsonwebtoken::decode::<Map<String, Value>>(token, &vk.key, &validation) {
                Ok(data) => data.claims,
                Err(e) => {
                    refusal = map_jwt_error(e);
                    continue;
                }
            };
            let mut matching = Vec::new();
            for row in &rows {
                let named = match &row.tenant_claim {
                    None => true,
                    Some(path) => {
                        mapping::tenant_of(ClaimPath::parse(path).find(&claims))?.as_deref()
                            == Some(row.tenant_slug.as_str())
                    }
                };
                if named {
                    matching.push(*row);
                }
            }
            let row = match matching.as_slice() {
                [one] => *one,
                [] => return Err(AuthError::MissingTenant),
                _ => return Err(AuthError::AmbiguousTenant),
            };
            let subject_claim = ClaimPath::parse(&row.subject_claim);
            let (mut claims, _) = self.claims_of(claims, &subject_claim, &self.tenant_claim)?;
            claims.tenant = row.tenant_slug.clone();
            claims.tenant_match = TenantMatch::Slug;
            claims.tenant_issuer = true;
            return Ok(claims);
        }
        Err(refusal)
    }

    /// The key set of a tenant's issuer: made on first use, refreshed in the background.
    fn tenant_jwks(&self, source: jwks::JwksSource) -> Result<Arc<Jwks>, AuthError> {
        let mut keys = self.tenant_keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(jwks) = keys.get(&source) {
            return Ok(Arc::clone(jwks));
        }
        let jwks = Jwks::new(source.clone(), self.policy, !self.insecure).map_err(|e| {
            tracing::error!(error = %e, "a tenant issuer's key set cannot be fetched");
            AuthError::KeysUnavailable
        })?;
        if let Some(shutdown) = self.shutdown.get() {
            jwks.spawn_refresh(shutdown.clone());
        }
        keys.insert(source, Arc::clone(&jwks));
        Ok(jwks)
    }

    /// Whether tokens can be verified: no identity provider is configured, or its keys are
    /// held.
    pub fn keys_ready(&self) -> bool {
        self.jwks.as_ref().is_none_or(|j| j.has_keys())
    }

    /// Keeps the identity provider's keys fresh in the background (see [`jwks`]).
    pub fn spawn_refresh(&self, shutdown: tokio_util::sync::CancellationToken) {
        if let Some(jwks) = &self.jwks {
            jwks.spawn_refresh(shutdown.clone());
        }
        let _ = self.shutdown.set(shutdown);
    }

    /// The validation accepting exactly `alg`.
    fn validation(&self, alg: Algorithm) -> Result<&Validation, AuthError> {
        self.validations.iter().find(|v| v.algorithms == [alg]).ok_or(AuthError::Algorithm)
    }

    /// Verifies `token` (without the `Bearer ` prefix).
    pub async fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let (claims, tenant) = self.verify_token(token).await?;
        match tenant {
            Some(tenant) => Ok(Claims { tenant, ..claims }),
            None => Err(AuthError::MissingTenant),
        }
    }

    /// [`Authenticator::verify`], for a token that may name no tenant (a platform
    /// administrator's, on the admin API): the same checks, and the tenant claim when there
    /// is one (`Claims::tenant` is then empty).
    pub async fn verify_any_tenant(&self, token: &str) -> Result<(Claims, Option<String>), AuthError> {
        self.verify_token(token).await
    }

    async fn verify_token(&self, token: &str) -> Result<(Claims, Option<String>), AuthError> {
        // Unknown algorithms, `none` included, fail here: the header's `alg` must name one
        // of jsonwebtoken's algorithms.
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Malformed)?;
        let data = match header.alg {
            Algorithm::HS256 => {
                let key = self.hs256.as_ref().ok_or(AuthError::Algorithm)?;
                jsonwebtoken::decode::<Map<String, Value>>(token, key, self.validation(Algorithm::HS256)?)
            }
            Algorithm::HS384 | Algorithm::HS512 => return Err(AuthError::Algorithm),
            _ => {
                let Some(jwks) = &self.jwks else {
                    return Err(AuthError::Algorithm);
                };
                let vk = jwks.key(header.kid.as_deref()).await.map_err(|miss| match miss {
                    KeyMiss::Unknown => AuthError::UnknownKey,
                    KeyMiss::NoKeys => AuthError::KeysUnavailable,
                })?;
                if vk.alg != header.alg {
                    return Err(AuthError::Algorithm);
                }
                jsonwebtoken::decode::<Map<String, Value>>(token, &vk.key, self.validation(vk.alg)?)
            }
        };
        let claims = data.map_err(map_jwt_error)?.claims;
        self.claims_of(claims, &self.subject_claim, &self.tenant_claim)
    }

    /// The claims of a verified token, its subject and tenant read where `subject_claim` and
    /// `tenant_claim` say; refused when expired by the gateway's own rule.
    fn claims_of(
        &self,
        claims: Map<String, Value>,
        subject_claim: &ClaimPath,
        tenant_claim: &ClaimPath,
    ) -> Result<(Claims, Option<String>), AuthError> {
        let issuer = match claims.get("iss") {
            Some(Value::String(iss)) => iss.clone(),
            _ => return Err(AuthError::Claims),
        };
        let subject = mapping::subject_of(subject_claim.find(&claims)).ok_or(AuthError::Claims)?;
        let tenant = mapping::tenant_of(tenant_claim.find(&claims))?;
        let expires_at = claims.get("exp").and_then(Value::as_i64).ok_or(AuthError::Claims)?;
        // One rule for requests and streams: honoured until the instant exp + leeway (the
        // library's whole-second comparison would honour the token for up to a second more
        // than the streams it opened live).
        if crate::store::now_millis() >= honoured_until_ms(expires_at, self.leeway_secs) {
            return Err(AuthError::Expired);
        }
        let scopes = mapping::scopes_of(&claims);
        let claims = Claims {
            subject,
            tenant: String::new(),
            tenant_match: self.tenant_match,
            expires_at,
            issuer,
            scopes,
            tenant_issuer: false,
            rest: claims,
        };
        Ok((claims, tenant))
    }
}

/// The instant (Unix milliseconds) from which a token with `exp` is no longer honoured.
pub(crate) fn honoured_until_ms(expires_at: i64, leeway_secs: i64) -> i64 {
    expires_at.saturating_add(leeway_secs).saturating_mul(1000)
}

fn map_jwt_error(e: jsonwebtoken::errors::Error) -> AuthError {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => AuthError::Expired,
        K::ImmatureSignature => AuthError::NotYetValid,
        K::InvalidIssuer => AuthError::Issuer,
        K::InvalidAudience => AuthError::Audience,
        K::InvalidSignature => AuthError::Signature,
        K::InvalidAlgorithm | K::InvalidAlgorithmName => AuthError::Algorithm,
        K::MissingRequiredClaim(_) | K::InvalidSubject | K::Json(_) => AuthError::Claims,
        _ => AuthError::Malformed,
    }
}
