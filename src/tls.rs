//! The process-wide TLS set-up for outgoing HTTPS (JWKS, upstreams, checkpoint sinks): every
//! layer that dials out calls it, so it sits below them all. Never skips verification.

/// Installs rustls' ring provider as the process default. Idempotent.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
