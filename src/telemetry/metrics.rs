//! Prometheus metrics: requests by status, tool calls by tool and outcome, denials by
//! reason, call latency, database pool use. No tenant or user id is a label value unless
//! `metrics.label_tenant` asks for the tenant slug.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Installs the process-wide recorder once; later calls reuse it.
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("duration_seconds".into()), LATENCY_BUCKETS)
                .ok()?;
            match builder.install_recorder() {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed");
                    None
                }
            }
        })
        .as_ref()
}

/// Histogram samples are held raw by the recorder until they are drained into their
/// distributions: by a scrape, or by an upkeep. The recorder is installed without the
/// exporter's own upkeep task (that needs a runtime at install time), so without this a
/// gateway nobody scrapes keeps every sample it ever took: 8 bytes and more per call, for
/// ever. Every UPKEEP_EVERY samples, the recording call drains them.
const UPKEEP_EVERY: u64 = 4096;

static SAMPLES: AtomicU64 = AtomicU64::new(0);

/// Counts `n` histogram samples just recorded; drains them all once enough have been taken.
fn sampled(n: u64) {
    let before = SAMPLES.fetch_add(n, Ordering::Relaxed);
    if (before + n) / UPKEEP_EVERY != before / UPKEEP_EVERY
        && let Some(Some(handle)) = HANDLE.get()
    {
        handle.run_upkeep();
    }
}

pub fn render(pool: (u32, usize)) -> String {
    let (size, idle) = pool;
    metrics::gauge!("scopegate_db_pool_connections", "state" => "idle").set(idle as f64);
    metrics::gauge!("scopegate_db_pool_connections", "state" => "in_use").set(size.saturating_sub(idle as u32) as f64);
    install().map(|h| h.render()).unwrap_or_default()
}

pub fn http_request(status: u16) {
    metrics::counter!("scopegate_http_requests_total", "status" => status.to_string()).increment(1);
}

pub fn denial(reason: &'static str) {
    metrics::counter!("scopegate_denials_total", "reason" => reason).increment(1);
}

/// A call's outcome that could not be recorded after its answer (its record stands without one).
pub fn audit_outcome_lost() {
    metrics::counter!("scopegate_audit_outcomes_lost_total").increment(1);
}

pub fn tool_call(tool: &str, outcome: &'static str, tenant: &str, elapsed: Duration) {
    if tenant.is_empty() {
        metrics::counter!("scopegate_tool_calls_total", "tool" => tool.to_owned(), "outcome" => outcome).increment(1);
    } else {
        metrics::counter!("scopegate_tool_calls_total", "tool" => tool.to_owned(), "outcome" => outcome, "tenant" => tenant.to_owned())
            .increment(1);
    }
    metrics::histogram!("scopegate_tool_call_duration_seconds", "tool" => tool.to_owned())
        .record(elapsed.as_secs_f64());
    sampled(1);
}

/// One upstream server's proxied `tools/call` requests, by the path that served them (`lean`:
/// the lean relay; `rmcp`: rmcp's server): registered once, counted per call.
pub struct ProxiedCalls {
    pub lean: metrics::Counter,
    pub rmcp: metrics::Counter,
}

impl ProxiedCalls {
    pub fn of(server: &str) -> Self {
        let counter = |relay: &'static str| metrics::counter!("scopegate_proxied_calls_total", "server" => server.to_owned(), "relay" => relay);
        Self { lean: counter("lean"), rmcp: counter("rmcp") }
    }
}

/// One group commit of the audit writer: how many events, how long.
pub fn audit_batch(events: usize, elapsed: Duration) {
    metrics::histogram!("scopegate_audit_batch_events").record(events as f64);
    metrics::histogram!("scopegate_audit_commit_duration_seconds").record(elapsed.as_secs_f64());
    sampled(2);
}

/// How many upstream definitions are held for an owner's decision, as this replica last read
/// them: a tenant's (`metrics.label_tenant`), or every tenant's it read together (an alert on it
/// above zero tells that a tool changed or waits).
pub fn definitions_held(tenant: Option<&str>, held: usize) {
    match tenant {
        Some(tenant) => {
            metrics::gauge!("scopegate_tool_definitions_held", "tenant" => tenant.to_owned()).set(held as f64)
        }
        None => metrics::gauge!("scopegate_tool_definitions_held").set(held as f64),
    }
}

/// An upstream connection found closed (crashed, exited) and started again.
pub fn upstream_restart(server: &str) {
    metrics::counter!("scopegate_upstream_restarts_total", "server" => server.to_owned()).increment(1);
}

/// An upstream connection completed its handshake on protocol `revision` (the one negotiated,
/// or the one its declaration pins).
pub fn upstream_connected(server: &str, revision: &str) {
    metrics::counter!(
        "scopegate_upstream_connections_total",
        "server" => server.to_owned(),
        "revision" => revision.to_owned()
    )
    .increment(1);
}

/// An executor agent connected (`returning`: its executor had connected to this replica
/// before, so this is a reconnect).
pub fn executor_connected(returning: bool) {
    metrics::gauge!("scopegate_executors_connected").increment(1.0);
    metrics::counter!("scopegate_executor_connections_total").increment(1);
    if returning {
        metrics::counter!("scopegate_executor_reconnects_total").increment(1);
    }
}

/// An executor agent's tunnel ended.
pub fn executor_disconnected() {
    metrics::gauge!("scopegate_executors_connected").decrement(1.0);
}

/// An agent refused at connect: `unknown`, `not_remote`, `wrong_secret`, `name_in_use`,
/// `bad_request`, `unavailable`.
pub fn executor_refused(reason: &'static str) {
    metrics::counter!("scopegate_executor_refusals_total", "reason" => reason).increment(1);
}

/// A connected agent dropped by the gateway: `deleted`, `secret_rotated`.
pub fn executor_dropped(reason: &'static str) {
    metrics::counter!("scopegate_executor_drops_total", "reason" => reason).increment(1);
}

/// A file read through an executor's agent, by outcome: `ok`, or the `ReadFileError` class
/// (`not_connected`, `outside_root`, `not_found`, `not_a_file`, `too_large`, `refused`,
/// `over_limit`, `failed`, `disconnected`, `timeout`).
pub fn executor_file_read(outcome: &'static str) {
    metrics::counter!("scopegate_executor_file_reads_total", "outcome" => outcome).increment(1);
}

/// A channel opened on an executor's agent, by route: `local` (the agent is connected to this
/// replica), `relayed` (through the replica that holds it), `served` (this replica carried it
/// for another one).
pub fn executor_channel(route: &'static str) {
    metrics::counter!("scopegate_executor_channels_total", "route" => route).increment(1);
}

/// A request sent on to the replica where what it continues waits, by outcome (`ok`, `gone`,
/// `failed`).
pub fn forwarded(outcome: &'static str) {
    metrics::counter!("scopegate_forwarded_requests_total", "outcome" => outcome).increment(1);
}

/// One HTTP exchange through an executor's agent, by outcome (`ok` or the error's outcome).
pub fn executor_fetch(outcome: &'static str) {
    metrics::counter!("scopegate_executor_fetches_total", "outcome" => outcome).increment(1);
}

/// Where a request's identity rows came from: the identity cache or the database.
pub fn identity_lookup(cached: bool) {
    let source = if cached { "cache" } else { "database" };
    metrics::counter!("scopegate_identity_lookups_total", "source" => source).increment(1);
}

/// Whether the identity change counter was just read (1) or could not be (0: the identity
/// cache is off until a read succeeds).
pub fn identity_counter_readable(readable: bool) {
    metrics::gauge!("scopegate_identity_counter_readable").set(if readable { 1.0 } else { 0.0 });
}

/// A fetch of the identity provider's key set: `ok`, `error`, or `budget` (an unknown `kid`
/// found the minute's on-demand fetches spent).
pub fn jwks_fetch(outcome: &'static str) {
    metrics::counter!("scopegate_jwks_fetches_total", "outcome" => outcome).increment(1);
}

/// A token on the MCP endpoint answered 403 `insufficient_scope`.
pub fn insufficient_scope() {
    metrics::counter!("scopegate_insufficient_scope_total").increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's resident set, in bytes.
    fn rss() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb * 1024
    }

    /// Ten million histogram samples with no scrape in between: held raw, they take 80 MB and
    /// more; drained as they come, the distributions they land in stay the same size.
    #[test]
    fn histogram_samples_do_not_pile_up_without_a_scrape() {
        let handle = install().expect("the recorder installs");
        audit_batch(1, Duration::from_micros(100));
        handle.render();
        let before = rss();
        for i in 0..5_000_000u64 {
            audit_batch(1 + (i % 8) as usize, Duration::from_micros(100 + i % 1000));
        }
        let grown = rss().saturating_sub(before);
        assert!(grown < 24 * 1024 * 1024, "the resident set grew by {} MiB over 10,000,000 samples", grown >> 20);
    }
}
