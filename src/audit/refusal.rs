//! Audit events for calls refused before they reached the handler (another principal's
//! session, a request id already in flight, the rate limit), and the safe rendering of text
//! that came from a caller. Never lets a flood of refusals become a flood of writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{AuditEvent, AuditWriter, Outcome};
use crate::store::Principal;
use crate::store::{AuditEventId, now_millis};

pub(crate) use crate::vocab::text::safe_text;

/// What a refusal is about, beside the principal it is charged to.
pub(crate) struct Refused<'a> {
    pub action: &'a str,
    pub tool: Option<&'a str>,
    pub request_id: Option<String>,
    pub session_id: Option<&'a str>,
    pub class: &'a str,
}

/// The event of one refusal, in the presenter's own tenant.
pub(crate) fn refusal_event(principal: Principal, refused: Refused<'_>, calls: i64) -> AuditEvent {
    AuditEvent {
        id: AuditEventId::generate(),
        tenant: principal.tenant,
        occurred_at: now_millis(),
        user: principal.user,
        session_id: refused.session_id.map(safe_text),
        request_id: refused.request_id.as_deref().map(safe_text),
        client_name: None,
        client_version: None,
        action: safe_text(refused.action),
        tool: refused.tool.map(safe_text),
        args_digest: None,
        args_raw: None,
        outcome: Outcome::Denied,
        error_class: Some(refused.class.to_owned()),
        duration_us: 0,
        calls,
        policy: None,
        call_id: None,
        result_digest: None,
    }
}

/// How long rate-limited calls of one user are gathered into one event.
pub(crate) const RATE_LIMIT_WINDOW: Duration = Duration::from_secs(1);

struct Window {
    opened: Instant,
    /// The event of the window's first refused call; its `calls` counts the whole window.
    event: AuditEvent,
}

/// Rate-limited `tools/call` requests, audited without amplifying a flood: the first refused
/// call of a user opens a window of [`RATE_LIMIT_WINDOW`]; every refused call of that user
/// until it closes is counted into the window's one event (the first call's tool and request
/// id, `calls` = how many were refused), written when the window closes. A user flooding the
/// gateway thus costs at most one audit write per window.
pub(crate) struct RateLimitAudit {
    windows: Mutex<HashMap<Principal, Window>>,
    writer: AuditWriter,
}

impl RateLimitAudit {
    /// Starts the task that writes closed windows; at `stop` it writes every open one.
    pub(crate) fn start(writer: AuditWriter, stop: tokio_util::sync::CancellationToken) -> Arc<Self> {
        let audit = Arc::new(Self { windows: Mutex::default(), writer });
        let task = Arc::clone(&audit);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RATE_LIMIT_WINDOW / 4);
            loop {
                let stopping = tokio::select! {
                    _ = stop.cancelled() => true,
                    _ = tick.tick() => false,
                };
                task.flush(stopping).await;
                if stopping {
                    return;
                }
            }
        });
        audit
    }

    /// Counts one refused `tools/call` of `principal`.
    pub(crate) fn refused(&self, principal: Principal, tool: Option<&str>, request_id: Option<String>) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        match windows.get_mut(&principal) {
            Some(window) => window.event.calls += 1,
            None => {
                let refused =
                    Refused { action: "tools/call", tool, request_id, session_id: None, class: "rate_limited" };
                windows
                    .insert(principal, Window { opened: Instant::now(), event: refusal_event(principal, refused, 1) });
            }
        }
    }

    /// Writes the windows that have closed (every window when `all`).
    async fn flush(&self, all: bool) {
        let closed: Vec<AuditEvent> = {
            let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let keys: Vec<Principal> = windows
                .iter()
                .filter(|(_, w)| all || now.duration_since(w.opened) >= RATE_LIMIT_WINDOW)
                .map(|(k, _)| *k)
                .collect();
            keys.iter().filter_map(|k| windows.remove(k)).map(|w| w.event).collect()
        };
        for event in closed {
            let calls = event.calls;
            if let Err(e) = self.writer.record(event).await {
                tracing::error!(error = %e, calls, "could not audit rate-limited calls");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::text::TEXT_LIMIT;

    #[test]
    fn safe_text_replaces_nul_and_bounds_length() {
        assert_eq!(safe_text("plain"), "plain");
        assert_eq!(safe_text("a\0b"), "a\u{FFFD}b");
        let long = "é".repeat(TEXT_LIMIT + 10);
        let cut = safe_text(&long);
        assert_eq!(cut.chars().count(), TEXT_LIMIT + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(safe_text(&"x".repeat(TEXT_LIMIT)), "x".repeat(TEXT_LIMIT), "at the limit: kept whole");
    }
}
