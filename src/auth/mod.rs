//! Bearer authentication: verifies a JWT and returns its claims; never looks at the database.
//!
//! The algorithm is chosen by the key, never by the token: HS256 tokens are checked only
//! against the configured development secret, and a JWKS key verifies only the one
//! algorithm its type (or its declared `alg`) allows. So an HS256 token signed with an
//! RSA public key, or an `alg: none` token, never verifies.

pub mod assertion;
pub mod jwks;
pub mod mint;

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::config::Config;
use jwks::{Jwks, JwksError, JwksSource};

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
        }
    }

    /// What the client is told in `error_description`.
    pub fn description(self) -> &'static str {
        match self {
            AuthError::Missing => "a bearer token is required",
            AuthError::Expired => "the access token expired",
            AuthError::NotYetValid => "the access token is not valid yet",
            AuthError::Malformed
            | AuthError::Algorithm
            | AuthError::UnknownKey
            | AuthError::Signature
            | AuthError::Issuer
            | AuthError::Audience
            | AuthError::Claims
            | AuthError::MissingTenant => "the access token is invalid",
        }
    }
}

/// Claims of a verified token: who (`sub`), which tenant, until when.
#[derive(Debug, Clone)]
pub struct Claims {
    pub subject: String,
    pub tenant: String,
    pub expires_at: i64,
    pub issuer: String,
    /// The token's other claims (a tenant that provisions users on first sight reads its
    /// group claim, and `name`, from here).
    pub rest: Map<String, Value>,
}

/// Verifies bearer tokens against the configured keys.
pub struct Authenticator {
    hs256: Option<DecodingKey>,
    jwks: Option<Arc<Jwks>>,
    /// One validation per algorithm a key may verify, built once (each accepts only its own
    /// algorithm).
    validations: Vec<Validation>,
    tenant_claim: String,
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
        let source = match (&a.jwks_file, &a.jwks_url) {
            (Some(path), _) => Some(JwksSource::File(path.clone())),
            (None, Some(url)) => Some(JwksSource::Url(url.clone())),
            (None, None) => None,
        };
        let jwks = match source {
            Some(source) => Some(
                Jwks::load(
                    source,
                    Duration::from_secs(a.jwks_cache_secs),
                    Duration::from_secs(a.jwks_refetch_min_interval_secs),
                )
                .await?,
            ),
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
                validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
                validation.set_issuer(&[a.issuer.as_str()]);
                validation.set_audience(&[config.audience()]);
                validation
            })
            .collect();
        let leeway_secs = i64::try_from(a.leeway_secs).unwrap_or(i64::MAX);
        Ok(Self { hs256, jwks, validations, tenant_claim: a.tenant_claim.clone(), leeway_secs })
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
                let vk = jwks.key(header.kid.as_deref()).await.ok_or(AuthError::UnknownKey)?;
                if vk.alg != header.alg {
                    return Err(AuthError::Algorithm);
                }
                jsonwebtoken::decode::<Map<String, Value>>(token, &vk.key, self.validation(vk.alg)?)
            }
        };
        let mut claims = data.map_err(map_jwt_error)?.claims;
        let mut text = |name: &str| match claims.remove(name) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        };
        let (Some(subject), Some(issuer)) = (text("sub"), text("iss")) else {
            return Err(AuthError::Claims);
        };
        let tenant = text(&self.tenant_claim).filter(|t| !t.is_empty());
        let expires_at = claims.get("exp").and_then(Value::as_i64).ok_or(AuthError::Claims)?;
        if subject.is_empty() {
            return Err(AuthError::Claims);
        }
        // One rule for requests and streams: honoured until the instant exp + leeway (the
        // library's whole-second comparison would honour the token for up to a second more
        // than the streams it opened live).
        if crate::store::now_millis() >= honoured_until_ms(expires_at, self.leeway_secs) {
            return Err(AuthError::Expired);
        }
        Ok((Claims { subject, tenant: String::new(), expires_at, issuer, rest: claims }, tenant))
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
