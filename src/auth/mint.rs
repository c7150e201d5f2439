//! Development tokens: HS256 with the configured development secret; refused without one.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("no development secret is configured (auth.hs256_secret): tokens can't be minted here")]
    NoDevSecret,
    #[error("signing: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
}

/// Mints a token for `subject` in `tenant`, valid for `ttl_secs` from now.
pub fn dev_token(config: &Config, tenant: &str, subject: &str, ttl_secs: u64) -> Result<String, MintError> {
    let secret = &config.auth.hs256_secret;
    if secret.is_empty() {
        return Err(MintError::NoDevSecret);
    }
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let claims = json!({
        "iss": config.auth.issuer,
        "aud": config.audience(),
        "sub": subject,
        config.auth.tenant_claim.as_str(): tenant,
        "iat": now,
        "nbf": now,
        "exp": now + ttl_secs as i64,
    });
    let key = EncodingKey::from_secret(secret.expose().as_bytes())?;
    Ok(jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key)?)
}

/// Parses a duration like `90s`, `15m`, `1h`, `2d` (or plain seconds) into seconds.
pub fn parse_ttl(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = digits.parse().map_err(|_| format!("`{text}` is not a duration like 90s, 15m, 1h or 2d"))?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("`{text}`: unit must be s, m, h or d")),
    };
    match n.checked_mul(factor) {
        Some(secs) if secs > 0 => Ok(secs),
        _ => Err(format!("`{text}` must be a positive duration")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ttl;

    #[test]
    fn ttl_parses_units_and_refuses_nonsense() {
        assert_eq!(parse_ttl("1h"), Ok(3600));
        assert_eq!(parse_ttl("90s"), Ok(90));
        assert_eq!(parse_ttl("15m"), Ok(900));
        assert_eq!(parse_ttl("2d"), Ok(172800));
        assert_eq!(parse_ttl("45"), Ok(45));
        for bad in ["", "h", "0s", "1w", "-1h", "1.5h"] {
            assert!(parse_ttl(bad).is_err(), "{bad} should be refused");
        }
    }
}
