//! Session binding: an MCP session belongs to the principal (tenant + user) whose
//! `initialize` created it. Anyone else presenting its `Mcp-Session-Id` (POST, GET or
//! DELETE) is answered as if the session did not exist (404) and nothing runs; the
//! refusal is audited in the presenter's own tenant (the presenter is authenticated, so
//! the event can be tied to a tenant; the session's owner is never revealed).
//!
//! A request whose JSON-RPC id is already in flight in its session is refused at once with
//! a JSON-RPC error, before anything runs. A response body (a stream included) ends when
//! the token that opened it stops being honoured: at `exp` plus the configured leeway, the
//! same instant the gate starts refusing the token's POSTs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{Method, StatusCode};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use super::jsonrpc::{Inspection, error_response, id_text};
use crate::audit::AuditWriter;
use crate::audit::refusal::{Refused, refusal_event};
use crate::error_body::json_error;
use crate::identity::{InFlight, SESSION_HEADER, SessionRegistry, request_principal};
use crate::telemetry::metrics;

pub(crate) struct Binding {
    pub sessions: Arc<SessionRegistry>,
    pub audit: AuditWriter,
    /// `auth.leeway_secs`: a token is honoured until `exp` plus this.
    pub leeway_secs: i64,
    /// `mcp.max_sessions_per_user` (0: no limit).
    pub max_sessions_per_user: usize,
}

fn no_such_session() -> Response {
    json_error(StatusCode::NOT_FOUND, "session_not_found", "no such session")
}

pub(crate) async fn bind(State(binding): State<Arc<Binding>>, request: Request, next: Next) -> Response {
    let Some((principal, expires_at)) = request_principal(request.extensions()) else {
        // The gate runs first; an identity-less request here is a wiring fault: refuse.
        return json_error(StatusCode::FORBIDDEN, "forbidden", "access denied");
    };
    let presented = request.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let method = request.method().clone();

    if let Some(session) = &presented {
        match binding.sessions.principal(session) {
            Some(owner) if owner == principal => {}
            Some(_) => {
                tracing::warn!(%method, "session presented by another principal; answered as unknown");
                metrics::denial("session_not_owned");
                // A refused `tools/call` is audited as one, with its tool and request id (the
                // presenter's own); anything else as a use of the session.
                let call = request.extensions().get::<Inspection>().filter(|i| i.method() == Some("tools/call"));
                let action = match call {
                    Some(_) => "tools/call".to_owned(),
                    None => format!("mcp/session {method}"),
                };
                let refused = Refused {
                    action: &action,
                    tool: call.and_then(Inspection::name),
                    request_id: call.and_then(Inspection::request_id).map(id_text),
                    session_id: None,
                    class: "session_not_owned",
                };
                if let Err(e) = binding.audit.record(refusal_event(principal, refused, 1)).await {
                    tracing::error!(error = %e, "could not audit a refused session");
                }
                return no_such_session();
            }
            None => {
                metrics::denial("unknown_session");
                return no_such_session();
            }
        }
    }

    // A request id already in flight in this session: refused before anything runs.
    let mut in_flight = None;
    if let (Some(session), Some(inspection)) = (&presented, request.extensions().get::<Inspection>())
        && inspection.is_request()
        && let Some(id) = inspection.request_id()
    {
        match binding.sessions.begin_request(session, id) {
            Some(held) => in_flight = Some(held),
            None => {
                metrics::denial("duplicate_request_id");
                tracing::info!("request id already in flight in its session; refused");
                if inspection.method() == Some("tools/call") {
                    let refused = Refused {
                        action: "tools/call",
                        tool: inspection.name(),
                        request_id: Some(id_text(id)),
                        session_id: Some(session),
                        class: "duplicate_request_id",
                    };
                    if let Err(e) = binding.audit.record(refusal_event(principal, refused, 1)).await {
                        tracing::error!(error = %e, "could not audit a refused duplicate request");
                    }
                }
                return error_response(
                    Some(id),
                    -32600,
                    "Invalid Request: a request with this id is already in flight in this session",
                );
            }
        }
    }

    // An `initialize` outside a session may create one: a place is held for it first, and
    // none is left once the user holds as many sessions as allowed.
    let mut slot = None;
    if presented.is_none() && request.extensions().get::<Inspection>().is_some_and(|i| i.method() == Some("initialize"))
    {
        match binding.sessions.reserve(principal, binding.max_sessions_per_user) {
            Some(held) => slot = Some(held),
            None => {
                metrics::denial("too_many_sessions");
                tracing::info!(
                    limit = binding.max_sessions_per_user,
                    "session limit of a user reached; initialize refused"
                );
                return json_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_sessions",
                    "this user holds as many sessions as allowed: end one (DELETE) or let an idle one expire",
                );
            }
        }
    }

    let response = next.run(request).await;
    // A stream outlives no token: it ends when the token that opened it stops being honoured.
    // The request id stays in flight until the answer's body is done (or dropped).
    let until = crate::auth::honoured_until_ms(expires_at, binding.leeway_secs);
    let response = response.map(|body| Body::new(UntilExpiry::new(body, until, in_flight)));

    match presented {
        Some(session) => {
            let gone = response.status() == StatusCode::NOT_FOUND
                || (method == Method::DELETE && response.status().is_success());
            if gone {
                binding.sessions.unbind(&session);
            }
        }
        None => {
            // A new session (the initialize of a stateful client): bind it to its creator.
            if let Some(created) = response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
                let bound = match slot.take() {
                    Some(slot) => binding.sessions.bind_slot(created, slot),
                    None => binding.sessions.bind(created, principal),
                };
                if !bound {
                    tracing::error!("a new session id was already bound; refusing it");
                    return no_such_session();
                }
            }
        }
    }
    response
}

/// A response body that ends when its token stops being honoured (long-lived SSE streams
/// included), holding its request id in flight while it lasts.
struct UntilExpiry {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _in_flight: Option<InFlight>,
}

impl UntilExpiry {
    /// `until`: Unix milliseconds.
    fn new(inner: Body, until: i64, in_flight: Option<InFlight>) -> Self {
        let left = until.saturating_sub(crate::store::now_millis()).max(0) as u64;
        Self { inner, deadline: Box::pin(tokio::time::sleep(Duration::from_millis(left))), _in_flight: in_flight }
    }
}

impl http_body::Body for UntilExpiry {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Drops bindings of sessions the transport closed (idle timeout, shutdown).
pub(crate) fn spawn_sweeper(
    sessions: Arc<SessionRegistry>,
    manager: Arc<LocalSessionManager>,
    shared: Arc<super::shared::Shared>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            for id in sessions.session_ids() {
                let id_arc: rmcp::transport::streamable_http_server::SessionId = id.clone().into();
                if !manager.has_session(&id_arc).await.unwrap_or(false) {
                    sessions.unbind(&id);
                }
            }
            shared.lean.retain(|id| sessions.principal(id).is_some());
        }
    });
}
