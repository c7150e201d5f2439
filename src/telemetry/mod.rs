//! Logging set-up: tracing to stderr (stdout is for command output), pretty or JSON.

pub mod metrics;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, TelemetryConfig};

/// rmcp's OAuth module logs an authorization code at debug level: when the filter lets debug
/// through, that module is held at info, so no level setting puts a code in the log.
const OAUTH_CAP: &str = "rmcp::transport::auth=info";

/// Installs the global subscriber. `RUST_LOG`, when set, overrides the configured filter.
/// Calling it twice is harmless (the second call changes nothing).
pub fn init(config: &TelemetryConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let verbose = filter.max_level_hint().is_none_or(|level| level > tracing::level_filters::LevelFilter::INFO);
    let filter = match OAUTH_CAP.parse() {
        Ok(cap) if verbose => filter.add_directive(cap),
        _ => filter,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match config.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
}
