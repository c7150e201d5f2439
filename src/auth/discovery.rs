//! The identity provider's metadata from its issuer: OAuth 2.0 Authorization Server Metadata
//! (RFC 8414) or OpenID Connect Discovery, tried at the addresses MCP clients try, in order.
//! The document must name the very issuer it was fetched for (RFC 8414 section 3.3), or it is
//! not used: a document naming another issuer could hand the gateway another's keys.

use serde::Deserialize;

use super::jwks::{JwksError, get_document};

/// What the gateway reads of the metadata.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderMetadata {
    pub issuer: String,
    pub jwks_uri: String,
    #[serde(default)]
    pub authorization_endpoint: Option<String>,
    #[serde(default)]
    pub token_endpoint: Option<String>,
}

/// The metadata addresses of `issuer`, in the order MCP clients try them: for an issuer with
/// a path, RFC 8414's and OpenID's with the well-known segment inserted before the path, then
/// OpenID's appended; for one without, RFC 8414's then OpenID's.
pub fn metadata_urls(issuer: &str) -> Result<Vec<String>, String> {
    let url = reqwest::Url::parse(issuer).map_err(|e| format!("`{issuer}` is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.query().is_some() || url.fragment().is_some() {
        return Err(format!("`{issuer}` is not an http(s) URL without query or fragment"));
    }
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/');
    Ok(if path.is_empty() {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server"),
            format!("{origin}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ]
    })
}

/// `issuer`'s metadata: the first of [`metadata_urls`] that answers with a document naming
/// `issuer` and an http(s) `jwks_uri`.
pub async fn discover(client: &reqwest::Client, issuer: &str) -> Result<ProviderMetadata, JwksError> {
    let fail = |message: String| JwksError::Discovery { issuer: issuer.to_owned(), message };
    let mut errors = Vec::new();
    for url in metadata_urls(issuer).map_err(fail)? {
        let (body, _) = match get_document(client, &url).await {
            Ok(found) => found,
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        let metadata: ProviderMetadata = match serde_json::from_slice(&body) {
            Ok(metadata) => metadata,
            Err(e) => {
                errors.push(format!("{url}: not authorization server metadata: {e}"));
                continue;
            }
        };
        if metadata.issuer != issuer {
            return Err(fail(format!("{url} names issuer `{}`, not the configured one", metadata.issuer)));
        }
        if !(metadata.jwks_uri.starts_with("https://") || metadata.jwks_uri.starts_with("http://")) {
            return Err(fail(format!("{url}: jwks_uri `{}` is not an http(s) URL", metadata.jwks_uri)));
        }
        return Ok(metadata);
    }
    Err(fail(errors.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::metadata_urls;

    #[test]
    fn metadata_addresses_follow_rfc_8414_and_openid() {
        assert_eq!(
            metadata_urls("https://idp.example.com").unwrap(),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server",
                "https://idp.example.com/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://idp.example.com/realms/acme/").unwrap(),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server/realms/acme",
                "https://idp.example.com/.well-known/openid-configuration/realms/acme",
                "https://idp.example.com/realms/acme/.well-known/openid-configuration"
            ]
        );
        assert!(metadata_urls("ftp://idp.example.com").is_err());
        assert!(metadata_urls("https://idp.example.com/?tenant=a").is_err());
    }
}
