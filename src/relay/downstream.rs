//! Who a call's notifications and requests go back to: the caller's sink (its rmcp session,
//! or a stream the lean relay holds), its progress token and log level, and who made it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::LoggingLevel;
use rmcp::model::{InputRequest, ProgressToken, ServerNotification};
use rmcp::service::Peer;
use serde_json::Value;

use crate::audit::{AuditWriter, CallAudit, digest};
use crate::store::{TenantId, UserId};

#[derive(Clone)]
pub struct Downstream {
    /// The session id, or a per-request id for a stateless call.
    pub owner: String,
    /// Where notifications for the caller go.
    pub sink: Sink,
    /// The downstream request's progress token, when its client asked for progress.
    pub progress: Option<ProgressToken>,
    /// The least severe log level the session wants (its `logging/setLevel`).
    pub log_level: Arc<LogLevel>,
    /// Who made the call, for the audit of the requests the upstream makes of its client
    /// while serving it, and how long those may take.
    pub origin: Option<Arc<CallOrigin>>,
    /// A caller on protocol 2026-07-28 takes no requests: what the upstream asks of it goes
    /// here, to be answered by the multi round-trip (`input_required`, SEP-2322).
    pub rounds: Option<tokio::sync::mpsc::Sender<Round>>,
}

/// Where notifications for a caller go while an upstream serves its request.
#[derive(Clone)]
pub enum Sink {
    /// Through the caller's rmcp session (on the request's own event stream).
    Peer(Peer<RoleServer>),
    /// Onto the answer of a call the lean relay serves (`mcp::lean`): each item is one
    /// serialized JSON-RPC notification, written before the answer, in order. Once the answer
    /// is gone, what still comes for the call (a log line an upstream sent on its own stream,
    /// routed within the linger) goes through the caller's rmcp session, as on the rmcp path;
    /// a caller without a session (2026-07-28) has nothing after its answer, as on rmcp's
    /// stateless path. A request the upstream makes of a session's caller goes on the answer
    /// too, and the client's answer to it comes back through `asks`.
    Stream { answer: tokio::sync::mpsc::Sender<Note>, session: Option<Peer<RoleServer>>, asks: Arc<Asks> },
}

/// What goes onto the answer of a call the lean relay serves before the answer itself, in the
/// order the upstream sent it.
#[derive(Debug)]
pub enum Note {
    /// One serialized JSON-RPC message: a notification, or a request of the client.
    Message(bytes::Bytes),
    /// The upstream ended the call's event stream before answering, to be polled (SEP-1699),
    /// and the call's leg resumed it: the relay may end its own answer's stream at this point
    /// too (when its caller's revision allows it), with an event id to resume from and the
    /// upstream's `retry` (if it announced one).
    Polled { retry: Option<Duration> },
}

/// What a client answered to a request the lean relay put on one of its calls' answers.
pub(crate) type AskAnswer = Result<Value, rmcp::ErrorData>;

/// The requests the lean relay asked its callers on their calls' answers and whose answers
/// (POSTed to the endpoint like any message of the session) it waits for: by session and
/// request id. Only the session a request went to can answer it.
#[derive(Default)]
pub struct Asks {
    waiting: std::sync::Mutex<std::collections::HashMap<(String, String), tokio::sync::oneshot::Sender<AskAnswer>>>,
    next: std::sync::atomic::AtomicU64,
}

/// A request waiting for its answer; it stops waiting when dropped.
pub(crate) struct Waiting<'a> {
    asks: &'a Asks,
    key: (String, String),
    pub(crate) answered: tokio::sync::oneshot::Receiver<AskAnswer>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.asks.lock().remove(&self.key);
    }
}

impl Asks {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), tokio::sync::oneshot::Sender<AskAnswer>>>
    {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new request id for `session` (a string, so it never meets the numbers rmcp gives the
    /// session's own requests), waiting for its answer.
    pub(crate) fn wait(&self, session: &str) -> (rmcp::model::RequestId, Waiting<'_>) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("scopegate-ask-{n}");
        let (answer, answered) = tokio::sync::oneshot::channel();
        let key = (session.to_owned(), id.clone());
        self.lock().insert(key.clone(), answer);
        (rmcp::model::RequestId::String(id.into()), Waiting { asks: self, key, answered })
    }

    /// Hands `answer` to the request `id` of `session` waits; false when none waits.
    pub(crate) fn answer(&self, session: &str, id: &str, answer: AskAnswer) -> bool {
        let waiting = self.lock().remove(&(session.to_owned(), id.to_owned()));
        waiting.is_some_and(|w| w.send(answer).is_ok())
    }
}

impl Sink {
    pub(crate) async fn notify(&self, notification: ServerNotification) -> Result<(), String> {
        match self {
            Self::Peer(peer) => peer.send_notification(notification).await.map_err(|e| e.to_string()),
            // A place on the answer first: the notification is serialized only when it has
            // one, and goes to the session whole when the answer is gone.
            Self::Stream { answer, session, .. } => match answer.reserve().await {
                Ok(place) => {
                    let message = rmcp::model::ServerJsonRpcMessage::notification(notification);
                    place.send(Note::Message(serde_json::to_vec(&message).map_err(|e| e.to_string())?.into()));
                    Ok(())
                }
                Err(_) => match session {
                    Some(session) => session.send_notification(notification).await.map_err(|e| e.to_string()),
                    None => Err("the request was answered".to_owned()),
                },
            },
        }
    }

    /// Tells the caller's answer that the upstream polled (see [`Note::Polled`]), after what
    /// the upstream sent before it and before what it sends after. Only the lean relay's
    /// answers can act on it: rmcp's server gives a tool's handler no hold on the event stream
    /// of the request it serves, so a caller through rmcp's session keeps its stream open and
    /// gets the answer on it. Once the answer is gone there is nothing to end.
    pub(crate) async fn polled(&self, retry: Option<Duration>) {
        if let Self::Stream { answer, .. } = self {
            let _ = answer.send(Note::Polled { retry }).await;
        }
    }
}

/// Whether the request is on protocol 2026-07-28, whose client takes no requests from the
/// server (what the upstream asks of it goes by multi round-trip).
pub fn by_rounds(context: &rmcp::service::RequestContext<RoleServer>) -> bool {
    context.protocol_version().is_some_and(|v| v == rmcp::model::ProtocolVersion::V_2026_07_28)
}

/// What happens next in a call made for a 2026-07-28 caller: the upstream asks its client
/// something (answered through `answer`), or the call is over.
pub enum Round {
    Ask { request: InputRequest, answer: tokio::sync::oneshot::Sender<Value> },
    Done(Result<rmcp::model::ServerResult, super::ProxyError>),
}

/// Who made a proxied call: what the audit of a relayed sampling, elicitation or roots
/// request records.
pub struct CallOrigin {
    pub audit: AuditWriter,
    pub tenant: TenantId,
    pub user: UserId,
    pub session: Option<String>,
    pub request_id: Option<String>,
    pub client: Option<(String, String)>,
    /// How long a relayed request may take (the call's own timeout).
    pub timeout: Duration,
}

impl CallOrigin {
    /// The audit of a request `server`'s upstream makes of this caller (`ID:method`, the
    /// digest of its params).
    pub(super) fn audit_of(&self, server: &str, method: &str, arguments: &Value) -> CallAudit {
        let digest = match arguments {
            Value::Object(map) => digest::arguments_digest(Some(map)),
            _ => digest::arguments_digest(None),
        };
        CallAudit::new(
            self.tenant,
            self.user,
            self.session.clone(),
            self.request_id.clone(),
            self.client.clone(),
            format!("{server}:{method}"),
            digest,
            None,
        )
    }
}

/// A session's logging level (`logging/setLevel`); until it sets one, `info` and above.
pub struct LogLevel(AtomicU8);

impl Default for LogLevel {
    fn default() -> Self {
        #[allow(deprecated)]
        Self(AtomicU8::new(severity(LoggingLevel::Info)))
    }
}

/// The severity above every level: nothing passes.
const OFF: u8 = 8;

impl LogLevel {
    /// The level of one 2026-07-28 request: what its `_meta` names
    /// (`io.modelcontextprotocol/logLevel`), and without one no log line at all.
    pub fn of_request(level: Option<LoggingLevel>) -> Self {
        Self(AtomicU8::new(level.map_or(OFF, severity)))
    }

    #[allow(deprecated)]
    pub fn set(&self, level: LoggingLevel) {
        self.0.store(severity(level), Ordering::Relaxed);
    }

    #[allow(deprecated)]
    pub fn allows(&self, level: LoggingLevel) -> bool {
        severity(level) >= self.0.load(Ordering::Relaxed)
    }

    /// The least severe level that passes (`None`: nothing passes), for a 2026-07-28
    /// upstream's request `_meta`.
    pub fn level(&self) -> Option<LoggingLevel> {
        const LEVELS: [LoggingLevel; 8] = [
            LoggingLevel::Debug,
            LoggingLevel::Info,
            LoggingLevel::Notice,
            LoggingLevel::Warning,
            LoggingLevel::Error,
            LoggingLevel::Critical,
            LoggingLevel::Alert,
            LoggingLevel::Emergency,
        ];
        LEVELS.get(usize::from(self.0.load(Ordering::Relaxed))).copied()
    }
}

#[allow(deprecated)]
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}
