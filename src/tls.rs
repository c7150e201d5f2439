//! The process-wide TLS set-up for outgoing HTTPS (JWKS, upstreams, checkpoint sinks): every
//! layer that dials out calls it, so it sits below them all. Never skips verification.

/// Installs rustls' ring provider as the process default. Idempotent.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Trusts the CA certificates of the PEM file at `path` on top of the platform's roots. The
/// error says what is wrong with the file (unreadable, not PEM, no certificate in it).
pub fn trust_ca_file(
    builder: reqwest::ClientBuilder,
    path: &std::path::Path,
) -> Result<reqwest::ClientBuilder, String> {
    let pem = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate in the file".to_owned());
    }
    Ok(builder.tls_certs_merge(certs))
}
