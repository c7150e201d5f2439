//! Logging set-up: tracing to stderr (stdout is for command output), pretty or JSON.

pub mod metrics;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, TelemetryConfig};

/// Installs the global subscriber. `RUST_LOG`, when set, overrides the configured filter.
/// Calling it twice is harmless (the second call changes nothing).
pub fn init(config: &TelemetryConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match config.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
}
