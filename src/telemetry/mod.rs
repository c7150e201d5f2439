//! Logging set-up: tracing to stderr (stdout is for command output), pretty or JSON; and, when
//! an OTLP endpoint is configured, traces (see [`trace`]). Never logs or exports a token.

pub mod metrics;
pub mod trace;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, TelemetryConfig};

pub use trace::TraceSetupError;

/// An error and its causes, on one line (reqwest's own text leaves out the cause: "error
/// sending request").
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// rmcp's OAuth module logs an authorization code at debug level: when the filter lets debug
/// through, that module is held at info, so no level setting puts a code in the log.
const OAUTH_CAP: &str = "rmcp::transport::auth=info";

/// What [`start`] set up; [`Telemetry::shutdown`] sends the spans still buffered.
#[must_use = "shut it down at exit, or the last spans are lost"]
pub struct Telemetry {
    traces: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter (a no-op without traces).
    pub async fn shutdown(self) {
        let Some(provider) = self.traces else { return };
        // The export runs on this runtime while the provider waits for it: wait elsewhere.
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "trace exporter shutdown failed; the last spans may be lost");
        }
    }
}

/// Installs the global subscriber, logs only (for the commands that serve nothing). `RUST_LOG`,
/// when set, overrides the configured filter. Calling it twice is harmless (the second call
/// changes nothing).
pub fn init(config: &TelemetryConfig) {
    // Logs only: nothing is buffered, nothing to shut down.
    let _ = install(config, None);
}

/// Installs the global subscriber: the log, and traces when `telemetry.otlp_endpoint` is set.
/// Must run inside the Tokio runtime (the exporter sends on it).
pub fn start(config: &TelemetryConfig) -> Result<Telemetry, TraceSetupError> {
    let pipeline = trace::Pipeline::from_config(config)?;
    Ok(install(config, pipeline))
}

fn install(config: &TelemetryConfig, traces: Option<trace::Pipeline>) -> Telemetry {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let verbose = filter.max_level_hint().is_none_or(|level| level > tracing::level_filters::LevelFilter::INFO);
    let filter = match OAUTH_CAP.parse() {
        Ok(cap) if verbose => filter.add_directive(cap),
        _ => filter,
    };
    let log = match config.format {
        LogFormat::Json => tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).boxed(),
        LogFormat::Pretty => tracing_subscriber::fmt::layer().with_writer(std::io::stderr).boxed(),
    };
    // The spans made for traces never show in the log: it reads as it did without them.
    let log = log.with_filter(filter.and(filter_fn(|meta| meta.target() != trace::TARGET)));
    let (layer, provider) = match traces {
        Some(pipeline) => (Some(trace::layer(pipeline.tracer)), Some(pipeline.provider)),
        None => (None, None),
    };
    let installed = tracing_subscriber::registry().with(log).with(layer).try_init().is_ok();
    if installed && provider.is_some() {
        trace::enable();
    }
    Telemetry { traces: provider.filter(|_| installed) }
}
