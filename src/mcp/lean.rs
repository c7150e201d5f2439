//! The lean relay: a proxied `tools/call` in a session, served beside rmcp's Streamable HTTP
//! service instead of through it. The gate has parsed the JSON-RPC envelope already; this
//! reads the call's params once more (borrowed: the arguments stay the caller's bytes), makes
//! the same decisions as the rmcp path (the fail-closed caller, the session's snapshot and its
//! grants), sends the call on the lean leg (`proxy::lean`), audits it before
//! answering, and answers with the upstream's result as it came: as plain JSON when nothing
//! comes before it, as an event stream (the notifications in order, then the answer) when
//! something does. A session's event stream is resumable (SEP-1699: a priming event, an id on
//! every event, a `GET` with `Last-Event-ID` brings the rest), and when the upstream polls
//! (ends the call's stream before answering, to be resumed) the relay does the same to a
//! caller whose session is on 2025-11-25 (the revision that lets a server do so: SEP-1699): it
//! ends the answer's stream after an event with an id and the upstream's `retry`, and the
//! answer waits for the client's `GET`.
//!
//! The relay takes only what it serves exactly like rmcp would, and hands everything else back
//! untouched to rmcp (which then answers it, errors included):
//! - a POSTed `tools/call` request in a session that rmcp holds and whose `initialized`
//!   notification the gateway saw, with the headers rmcp accepts without a second look (a
//!   JSON body, an `Accept` of JSON and event streams, an allowed `Host`, no `Origin`, no
//!   protocol version beyond 2025-11-25);
//! - or a 2026-07-28 `tools/call` standing alone (no session), with those headers, the
//!   revision's own (one `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` matching the
//!   request, no `Mcp-Param-*`), and a `_meta` rmcp accepts (the revision, valid client
//!   capabilities), selecting no roots, and not declaring tasks to a 2026-07-28 upstream
//!   (which may answer with a task the rmcp path adopts). Its client's capabilities, name and
//!   log level are the request's own. The first round only: a retry (`requestState`,
//!   `inputResponses`) goes to rmcp. What its upstream asks the client answers the request
//!   `input_required`, exactly as on the rmcp path: an upstream on an older revision asks by a
//!   request, and the call waits in the multi round-trip ([`super::rounds`]); a 2026-07-28
//!   upstream's own `input_required` passes through, its state sealed. Its result carries
//!   `resultType`, and an error the HTTP status rmcp would give it;
//! - params of a plain call (a name, object arguments, a progress token at most: no task, no
//!   multi round-trip);
//! - a tool of one of the tenant's servers (not a native one, not a selected root's) that the
//!   caller's grants allow, that no grant or policy asks a person to confirm, and that
//!   [`Upstreams::lean_target`] can reach.
//!
//! A request the upstream makes of the caller while serving the call (sampling, elicitation,
//! roots, for a client that declared them) goes out as an event of the call's answer, as rmcp
//! would send it, with an id of the relay's own (`scopegate-ask-N`); the client's answer, POSTed
//! in the same session, is taken here and handed to the call that asked (only that session's
//! answer is: another session presenting the id is left to rmcp, which knows no such request).
//!
//! Its calls' cancellations (`notifications/cancelled` naming one of them) are taken here too.

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderMap, Method, StatusCode, header};
use rmcp::model::{ProgressToken, RequestId, ServerResult};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::jsonrpc::{Inspection, id_text};
use super::pipeline::{Verdict, argument_digests, call_audit, conclude};
use super::rounds;
use super::shared::Shared;
use crate::context::{CallSite, McpCallContext};
use crate::identity::SESSION_HEADER;
use crate::proxy::surface;
use crate::proxy::{
    CallOrigin, Downstream, Exchange, LeanResult, LogLevel, PassedInput, ProxyError, RelayCaps, Round, Sink,
};
use crate::relay::Note;
use crate::selection;
use crate::store::entities::GrantKind;
use crate::telemetry::trace;
use crate::vocab::names::split_tool_name;

/// What the relay knows of a session from its handshake (its rmcp handler records it when the
/// client says it is initialized).
pub(crate) struct LeanSession {
    /// The session's rmcp peer: what comes for a call after its answer went goes through it.
    pub peer: rmcp::service::Peer<rmcp::RoleServer>,
    pub caps: RelayCaps,
    pub client: Option<(String, String)>,
    pub log_level: Arc<LogLevel>,
    /// The session's revision lets a server end a request's stream before its answer, for the
    /// client to resume (2025-11-25, SEP-1699; before it, a server SHOULD NOT).
    pub polling: bool,
}

/// The sessions the relay may serve, by session id.
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, Arc<LeanSession>>>);

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LeanSession>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register(&self, session: &str, known: LeanSession) {
        self.lock().insert(session.to_owned(), Arc::new(known));
    }

    fn get(&self, session: &str) -> Option<Arc<LeanSession>> {
        self.lock().get(session).cloned()
    }

    /// Forgets the sessions that ended.
    pub(crate) fn retain(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|id, _| live(id));
    }
}

/// The protocol versions whose requests the relay serves (those of a session; rmcp checks
/// nothing more of them for a `tools/call`).
const SESSION_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// The revision whose requests stand alone (no session): the relay serves its `tools/call`
/// too, with what the request's `_meta` says of its client.
const ALONE_VERSION: &str = "2026-07-28";

/// The per-request protocol version of 2026-07-28 requests (in a session's request, it goes to
/// rmcp), and what else such a request's `_meta` says of its client.
const REQUEST_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";
const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";
const CLIENT_INFO_META: &str = "io.modelcontextprotocol/clientInfo";
const LOG_LEVEL_META: &str = "io.modelcontextprotocol/logLevel";

/// The relay: the endpoint's shared state, rmcp's sessions, and the calls in flight (so a
/// cancellation finds them).
pub(crate) struct Relay {
    shared: Arc<Shared>,
    manager: Arc<LocalSessionManager>,
    allowed_hosts: Vec<String>,
    calls: Mutex<HashMap<(String, String), (u64, CancellationToken)>>,
    next_call: std::sync::atomic::AtomicU64,
    /// The requests the relay's calls asked their clients, waiting for the answers.
    asks: Arc<crate::relay::Asks>,
    /// A session's answers given as event streams, which its client may resume.
    replays: Replays,
}

#[derive(Deserialize)]
struct CallEnvelope<'a> {
    #[serde(borrow)]
    params: CallParams<'a>,
}

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(rename = "_meta", borrow)]
    meta: Option<HashMap<Cow<'a, str>, &'a RawValue>>,
    #[serde(borrow)]
    task: Option<&'a RawValue>,
    #[serde(rename = "requestState", borrow)]
    request_state: Option<&'a RawValue>,
    #[serde(rename = "inputResponses", borrow)]
    input_responses: Option<&'a RawValue>,
}

/// What the relay serves of a POSTed message.
enum Kind {
    Call,
    Cancel,
    /// A client's answer (to a request the relay may have asked it).
    Answer,
}

/// A client's answer to a request.
#[derive(Deserialize)]
struct AnswerEnvelope {
    result: Option<serde_json::Value>,
    error: Option<rmcp::ErrorData>,
}

#[derive(Deserialize)]
struct CancelEnvelope {
    params: CancelParams,
}

#[derive(Deserialize)]
struct CancelParams {
    #[serde(rename = "requestId")]
    request_id: RequestId,
}

#[derive(Serialize)]
struct Answer<'a> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a rmcp::ErrorData>,
}

/// A call the relay takes: everything decided, nothing sent yet.
struct Accepted {
    ctx: McpCallContext,
    caller: Caller,
    target: crate::proxy::LeanTarget,
    tool: String,
    upstream_tool: String,
    progress: Option<ProgressToken>,
    /// The arguments in the form the call's leg sends them: as the caller sent them on the
    /// lean HTTP leg, parsed (once, for the audit too) through rmcp's client; and what the
    /// audit records of them.
    arguments: Option<Box<RawValue>>,
    parsed: Option<serde_json::Map<String, serde_json::Value>>,
    args_digest: String,
    args_raw: Option<String>,
    /// What the tenant's policies decided, when they took part (for the audit).
    policy: Option<String>,
}

/// Who the relay serves a call for, as the call's downstream needs it.
struct Caller {
    /// The session's rmcp peer: what comes for a call after its answer went goes through it
    /// (`None`: a 2026-07-28 caller, without a session).
    peer: Option<rmcp::service::Peer<rmcp::RoleServer>>,
    client: Option<(String, String)>,
    log_level: Arc<LogLevel>,
    /// A 2026-07-28 caller: how what its upstream asks reaches it.
    rounds: Option<ByRounds>,
    /// The upstream's polling is passed on ([`LeanSession::polling`]; never to a 2026-07-28
    /// caller, whose revision resumes nothing).
    polling: bool,
}

/// How a 2026-07-28 caller's call takes its multi round-trip.
struct ByRounds {
    /// What binds its `requestState`: the caller, the tool as named, the digest of the
    /// arguments (as the rmcp path binds it).
    binding: rounds::Binding,
    /// The upstream speaks 2026-07-28 too: its own `input_required` passes through.
    passed: bool,
}

/// The caller as the request shows it: its session's record, or its own `_meta`.
enum Known<'a> {
    Session(&'a str, Arc<LeanSession>),
    Alone(Alone),
}

/// The caller's side of a call the relay takes: in a session the relay knows, or a 2026-07-28
/// request standing alone.
#[derive(Clone, Copy)]
enum Asking<'a> {
    Session(&'a str),
    Alone,
}

impl Relay {
    pub(crate) fn new(shared: Arc<Shared>, manager: Arc<LocalSessionManager>, allowed_hosts: Vec<String>) -> Self {
        Self {
            shared,
            manager,
            allowed_hosts,
            calls: Mutex::default(),
            next_call: Default::default(),
            asks: Arc::default(),
            replays: Replays::default(),
        }
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (u64, CancellationToken)>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `request` when the relay takes it; hands it back otherwise.
    pub(crate) async fn serve(self: &Arc<Self>, request: Request) -> Result<Response, Request> {
        if request.method() == Method::GET {
            return self.resume(&request).ok_or(request);
        }
        if request.method() != Method::POST {
            return Err(request);
        }
        // Only three kinds of message are the relay's; anything else goes on without a copy made.
        let kind = match request.extensions().get::<Inspection>() {
            Some(i) if i.method() == Some("tools/call") && i.is_request() => Kind::Call,
            Some(i) if i.method() == Some("notifications/cancelled") && !i.is_request() => Kind::Cancel,
            Some(i) if i.method().is_none() && i.request_id().is_some() => Kind::Answer,
            _ => return Err(request),
        };
        let Some(inspection) = request.extensions().get::<Inspection>().cloned() else { return Err(request) };
        let session = match request.headers().get(SESSION_HEADER) {
            Some(value) => match value.to_str() {
                Ok(session) => Some(session.to_owned()),
                Err(_) => return Err(request),
            },
            None => None,
        };
        let asking = match (&kind, &session) {
            (Kind::Cancel, Some(session)) if self.cancel(session, inspection.body()) => return Ok(accepted()),
            (Kind::Answer, Some(session)) if self.answered(session, &inspection) => return Ok(accepted()),
            (Kind::Call, Some(session)) if self.plain(request.headers()) => Asking::Session(session),
            (Kind::Call, None) if self.plain_alone(request.headers()) => Asking::Alone,
            _ => return Err(request),
        };
        let (parts, body) = request.into_parts();
        match self.accept(&parts, asking, &inspection).await {
            Some(accepted) => {
                let span = trace::tool_span(trace::parent_in(&parts.extensions));
                Ok(self.relay(accepted, session.as_deref(), span).await)
            }
            None => Err(Request::from_parts(parts, body)),
        }
    }

    /// Cancels the relay's call that a client's `notifications/cancelled` names, if it is one.
    fn cancel(&self, session: &str, body: &[u8]) -> bool {
        let Ok(cancel) = serde_json::from_slice::<CancelEnvelope>(body) else { return false };
        let key = (session.to_owned(), id_text(&cancel.params.request_id));
        match self.calls().get(&key) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Hands a client's answer to the request of the relay's it answers (one the relay put on
    /// a call's answer in this session); false when it answers nothing of the relay's.
    fn answered(&self, session: &str, inspection: &Inspection) -> bool {
        let Some(id) = inspection.request_id() else { return false };
        let Ok(answer) = serde_json::from_slice::<AnswerEnvelope>(inspection.body()) else { return false };
        let answer = match answer {
            AnswerEnvelope { result: Some(result), error: None } => Ok(result),
            AnswerEnvelope { result: None, error: Some(error) } => Err(error),
            _ => return false,
        };
        self.asks.answer(session, &id_text(id), answer)
    }

    /// Whether the request's headers are ones rmcp accepts for a session's request without
    /// another look (anything else goes to rmcp, which answers it).
    fn plain(&self, headers: &HeaderMap) -> bool {
        let version_ok = match headers.get("mcp-protocol-version").map(|v| v.to_str().ok()) {
            None => true,
            Some(Some(v)) => SESSION_VERSIONS.contains(&v),
            Some(None) => false,
        };
        version_ok && self.plain_transport(headers)
    }

    /// Whether the headers of a request without a session are ones rmcp accepts for a
    /// 2026-07-28 `tools/call` without another look: one `MCP-Protocol-Version` naming that
    /// revision, one `Mcp-Method` naming the method, and no `Mcp-Param-*` header (the relay's
    /// tools declare none: rmcp would have to read them). `Mcp-Name` is checked against the
    /// tool when the params are read.
    fn plain_alone(&self, headers: &HeaderMap) -> bool {
        sole(headers, "mcp-protocol-version") == Some(ALONE_VERSION)
            && sole(headers, "mcp-method") == Some("tools/call")
            && !headers.keys().any(|name| name.as_str().starts_with("mcp-param-"))
            && self.plain_transport(headers)
    }

    /// What every request the relay takes has: a JSON body, an `Accept` of JSON and event
    /// streams, an allowed `Host` and no `Origin`.
    fn plain_transport(&self, headers: &HeaderMap) -> bool {
        let text = |name: &str| headers.get(name).map(|v| v.to_str().ok());
        let json_body = text(header::CONTENT_TYPE.as_str()).flatten().is_some_and(|v| {
            v.split(';').next().is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
        });
        let accepts = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>();
        let accepts_both = accepts.iter().any(|v| v.contains("application/json"))
            && accepts.iter().any(|v| v.contains("text/event-stream"));
        let host_ok = match text(header::HOST.as_str()) {
            Some(Some(host)) => self.host_allowed(host),
            _ => false,
        };
        json_body && accepts_both && host_ok && !headers.contains_key(header::ORIGIN)
    }

    /// `Host` is one of the allowed hosts, compared plainly (an entry without a port allows
    /// any port); anything rmcp would have to normalize first is left to rmcp.
    fn host_allowed(&self, host: &str) -> bool {
        self.allowed_hosts.is_empty() || host_allowed_in(&self.allowed_hosts, host)
    }

    /// Decides whether the relay takes the call, exactly as the rmcp path would decide its
    /// caller, name and grant; `None` hands it to rmcp.
    async fn accept(
        &self,
        parts: &http::request::Parts,
        asking: Asking<'_>,
        inspection: &Inspection,
    ) -> Option<Accepted> {
        let shared = &self.shared;
        let call: CallEnvelope = serde_json::from_slice(inspection.body()).ok()?;
        let params = call.params;
        let object_arguments = params.arguments.is_none_or(|a| a.get().trim_start().starts_with('{'));
        if !object_arguments
            || params.task.is_some()
            || params.request_state.is_some()
            || params.input_responses.is_some()
        {
            return None;
        }
        let meta = params.meta.as_ref();
        let progress = match meta.and_then(|m| m.get("progressToken")) {
            Some(token) => Some(serde_json::from_str::<ProgressToken>(token.get()).ok()?),
            None => None,
        };
        let tool = params.name.as_ref();
        if shared.tools.has(tool) {
            return None;
        }
        if split_tool_name(tool).is_some_and(|(server, _)| selection::is_selected_server(server)) {
            return None;
        }
        let known = match asking {
            Asking::Session(session) => {
                if meta.is_some_and(|m| m.contains_key(REQUEST_VERSION_META)) {
                    return None;
                }
                let known = shared.lean.get(session)?;
                let session_id: rmcp::transport::streamable_http_server::SessionId = session.into();
                if !self.manager.has_session(&session_id).await.unwrap_or(false) {
                    return None;
                }
                Known::Session(session, known)
            }
            Asking::Alone => Known::Alone(Alone::of(&parts.headers, tool, meta?)?),
        };
        let (session, caps) = match &known {
            Known::Session(session, known) => (Some(*session), known.caps),
            Known::Alone(alone) => (None, alone.caps),
        };
        let request_id = inspection.request_id()?;
        let site = CallSite { parts: Some(parts), request_id, session_id: session };
        let ctx = McpCallContext::for_call(site, &shared.sessions).ok()?;
        let upstreams = &shared.upstreams;
        let policies = upstreams.policies().of(ctx.tenant_id(), ctx.tenant_slug()).await;
        let snapshot = upstreams.snapshot(ctx.tenant_id(), ctx.user_id(), session, caps).await.ok()?;
        let (server, name) = surface::route_name(&*snapshot, tool)?;
        if policies.is_empty() && !snapshot.allowed(server, name, ctx.roles()) {
            return None;
        }
        // A call a person confirms is asked for on the rmcp path.
        if snapshot.confirm_of(server, name, ctx.roles()).is_some() {
            return None;
        }
        let connection = snapshot.connection(server)?;
        let target = upstreams.lean_target(connection, name).await?;
        // Known once the connection runs. A 2026-07-28 upstream may answer a caller that
        // declared tasks with a task, which the rmcp path adopts.
        let modern_upstream = connection.speaks_modern();
        if modern_upstream && matches!(&known, Known::Alone(alone) if alone.tasks) {
            return None;
        }
        // The arguments are digested from one parse; they go upstream as the caller's bytes.
        let parsed: Option<serde_json::Map<String, serde_json::Value>> = match params.arguments {
            Some(raw) => serde_json::from_str(raw.get()).ok()?,
            None => None,
        };
        let (args_digest, args_raw) = argument_digests(parsed.as_ref(), shared.record_raw_arguments);
        // A tenant with policies: they decide with the arguments. The relay serves only what
        // they allow; a refusal is the rmcp path's to answer and audit (it decides again).
        let policy = match policies.is_empty() {
            true => None,
            false => {
                let facts = upstreams.connection_facts(ctx.tenant_id(), connection).await.ok()?;
                let grant = snapshot.granting(server, GrantKind::Tool, name, ctx.roles());
                let revision = sole(&parts.headers, "mcp-protocol-version").unwrap_or_default();
                let client = match &known {
                    Known::Session(_, known) => known.client.as_ref().map(|(name, _)| name.clone()),
                    Known::Alone(alone) => alone.client.as_ref().map(|(name, _)| name.clone()),
                };
                let ask = crate::proxy::Ask::new(Arc::clone(&policies), &ctx, revision, client.as_deref());
                let outcome = ask.call(facts.get(name)?, grant.as_deref(), parsed.as_ref());
                if !outcome.decision.allow || outcome.decision.confirm.is_some() {
                    return None;
                }
                outcome.consulted.then(|| crate::policy::audit_text(&outcome))
            }
        };
        // Each leg keeps the form it sends: the caller's bytes, or the parsed arguments.
        let (arguments, parsed) = match target {
            crate::proxy::LeanTarget::Http(_) => (params.arguments.map(|raw| raw.to_owned()), None),
            crate::proxy::LeanTarget::Peer { .. } => (None, parsed),
        };
        let caller = match known {
            Known::Session(_, known) => Caller {
                peer: Some(known.peer.clone()),
                client: known.client.clone(),
                log_level: Arc::clone(&known.log_level),
                rounds: None,
                polling: known.polling,
            },
            Known::Alone(alone) => Caller {
                peer: None,
                client: alone.client,
                log_level: Arc::new(LogLevel::of_request(alone.log_level)),
                rounds: Some(ByRounds {
                    binding: rounds::Binding {
                        tenant: ctx.tenant_id().to_string(),
                        user: ctx.user_id().to_string(),
                        tool: tool.to_owned(),
                        arguments: args_digest.clone(),
                    },
                    passed: modern_upstream,
                }),
                polling: false,
            },
        };
        Some(Accepted {
            ctx,
            caller,
            target,
            tool: tool.to_owned(),
            upstream_tool: name.to_owned(),
            progress,
            arguments,
            parsed,
            args_digest,
            args_raw,
            policy,
        })
    }

    /// Runs an accepted call in a task of its own (it is audited and its upstream told to
    /// cancel even when the caller goes away) and answers with what it sends: the answer alone
    /// as JSON, or, when a notification (or the upstream's polling, passed on) comes first, an
    /// event stream.
    async fn relay(self: &Arc<Self>, accepted: Accepted, session: Option<&str>, span: tracing::Span) -> Response {
        let (notes, mut noted) = mpsc::channel::<Note>(64);
        let (answer, mut answered) = oneshot::channel::<Reply>();
        let cancelled = CancellationToken::new();
        let request_id = accepted.ctx.request_id().clone();
        let polling = session.is_some() && accepted.caller.polling;
        // A session's call is found by its cancellation (a request alone has no session to
        // send one in). Numbered: a call whose client went away may end after another took its id.
        let key = session.map(|session| (session.to_owned(), id_text(&request_id)));
        let number = self.next_call.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(key) = &key {
            self.calls().insert(key.clone(), (number, cancelled.clone()));
        }
        let relay = Arc::clone(self);
        tokio::spawn(
            async move {
                let reply = relay.run(accepted, notes, &cancelled).await;
                if let Some(key) = key {
                    let mut calls = relay.calls();
                    if calls.get(&key).is_some_and(|(n, _)| *n == number) {
                        calls.remove(&key);
                    }
                }
                let _ = answer.send(reply);
            }
            .instrument(span),
        );
        // A note queued before the answer is taken first.
        loop {
            tokio::select! {
                biased;
                Some(note) = noted.recv() => match session {
                    // Not passed on (a 2026-07-28 caller, or a session before 2025-11-25): the
                    // upstream's polling stays the gateway's business, and the caller waits for
                    // the answer.
                    _ if !polling && matches!(note, Note::Polled { .. }) => {}
                    Some(session) => return self.replayed_response(session, note, polling, noted, answered, request_id),
                    None => return events_response(note, noted, answered, request_id),
                },
                answer = &mut answered => return json_response(answer.unwrap_or_else(|_| gone(&request_id))),
            }
        }
    }

    /// A session's answer as an event stream that its client may resume (SEP-1699), as rmcp
    /// answers a session's request: a priming event first (an id, the session's `retry`, no
    /// data), then each message with an id. What the call sends is kept (in a task of its own,
    /// whether the client is connected or not) until the answer, and a while after it,
    /// for a `GET` with `Last-Event-ID` in the same session ([`Relay::resume`]); the time is
    /// rmcp's for its own answered streams (`completed_cache_ttl`). When the upstream polls and
    /// the session's revision allows it (`polling`), this response ends as the upstream's did
    /// ([`Replay::poll`]) and the client's `GET` brings the rest.
    fn replayed_response(
        &self,
        session: &str,
        first: Note,
        polling: bool,
        mut noted: mpsc::Receiver<Note>,
        mut answered: oneshot::Receiver<Reply>,
        id: RequestId,
    ) -> Response {
        let config = &self.manager.session_config;
        let (replay, retry) = (self.replays.open(session, config.completed_cache_ttl), config.sse_retry);
        let note = move |replay: &Replay, note: Note| match note {
            Note::Polled { .. } if !polling => {}
            note => replay.note(note, retry),
        };
        replay.push(None, retry);
        note(&replay, first);
        let reading = Arc::clone(&replay).read_from(0, true);
        tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        biased;
                        Some(next) = noted.recv() => note(&replay, next),
                        answer = &mut answered => {
                            let answer = answer.unwrap_or_else(|_| gone(&id));
                            replay.push(Some(&answer.bytes), None);
                            replay.finish();
                            break;
                        }
                    }
                }
            }
            .in_current_span(),
        );
        stream_response(reading)
    }

    /// A `GET` resuming one of the relay's event streams (its `Last-Event-ID` is one of the
    /// relay's ids) in the session that stream answered: the events after that id, then the
    /// rest as it comes. Anything else goes to rmcp (which, for an id of the relay's it does
    /// not know, answers with an empty stream: another session's events are never sent).
    fn resume(&self, request: &Request) -> Option<Response> {
        let text = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        let accepts_events = request
            .headers()
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("text/event-stream"));
        let position = text("last-event-id").and_then(replay_position);
        let found = match (position, text(SESSION_HEADER)) {
            (Some((number, index)), Some(session)) if accepts_events => {
                self.replays.find(number, session).map(|replay| (replay, index))
            }
            _ => None,
        };
        found.map(|(replay, index)| stream_response(replay.read_from(index + 1, false)))
    }

    /// The call itself: sent, audited (fail closed), and its answer as the caller gets it.
    async fn run(&self, accepted: Accepted, notes: mpsc::Sender<Note>, cancelled: &CancellationToken) -> Reply {
        let shared = &self.shared;
        let Accepted {
            ctx,
            caller,
            target,
            tool,
            upstream_tool,
            progress,
            arguments,
            parsed,
            args_digest,
            args_raw,
            policy,
        } = accepted;
        let request_id = ctx.request_id().clone();
        let session_id = ctx.session_id().map(str::to_owned);
        let call = call_audit(&ctx, caller.client.clone(), tool.clone(), args_digest, args_raw);
        if let Some(policy) = policy {
            call.set_policy(policy);
        }
        let downstream = Downstream {
            owner: session_id.clone().unwrap_or_else(|| shared.upstreams.stateless_owner()),
            sink: Sink::Stream { answer: notes, session: caller.peer, asks: Arc::clone(&self.asks) },
            progress,
            log_level: caller.log_level,
            rounds: None,
            origin: Some(Arc::new(CallOrigin {
                audit: shared.audit.clone(),
                tenant: ctx.tenant_id(),
                user: ctx.user_id(),
                session: session_id,
                request_id: Some(id_text(&request_id)),
                client: caller.client,
                timeout: shared.call_timeout,
            })),
        };
        let exchange =
            Exchange { downstream, timeout: shared.call_timeout, cancelled: cancelled.clone(), passed: None };
        target.connection().calls.lean.increment(1);
        let alone = caller.rounds.is_some();
        // The call's record commits while the upstream works (or first, under write-ahead).
        let verdict = match (call.start(&shared.audit, ctx.audit_write_ahead()).await, caller.rounds) {
            (Err(_), _) => Verdict::ProxyFailed(ProxyError::Unavailable("the call was not recorded".to_owned())),
            (Ok(()), None) => Verdict::from(
                shared.upstreams.call_lean(&target, &ctx, &upstream_tool, arguments.as_deref(), parsed, exchange).await,
            ),
            (Ok(()), Some(ByRounds { binding, passed: true })) => {
                let mut exchange = exchange;
                exchange.passed = Some(PassedInput::default());
                let called =
                    shared.upstreams.call_lean(&target, &ctx, &upstream_tool, arguments.as_deref(), parsed, exchange);
                Verdict::from(called.await.and_then(|done| self.sealed(&binding, done)))
            }
            (Ok(()), Some(ByRounds { binding, passed: false })) => {
                let call = LeanCall { ctx: ctx.clone(), target, tool: upstream_tool, arguments, parsed };
                self.by_rounds(binding, call, exchange).await
            }
        };
        match conclude(shared, &ctx, &call, &tool, true, verdict).await {
            // A 2026-07-28 caller finds `resultType` on every result.
            Ok(done) if alone => Reply::ok(message(&request_id, Ok(&completed(&done)))),
            Ok(done) => Reply::ok(message(&request_id, Ok(&done.result))),
            // An error answers a request standing alone as rmcp answers it: some with their
            // own HTTP status.
            Err(e) if alone => Reply { bytes: message(&request_id, Err(&e)), status: alone_status(&e) },
            Err(e) => Reply::ok(message(&request_id, Err(&e))),
        }
    }

    /// A 2026-07-28 upstream's answer to a 2026-07-28 caller: its `input_required` (the first
    /// round's: a retry goes to the rmcp path) with the upstream's own `requestState` wrapped
    /// in the gateway's, sealed and bound as the rmcp path seals it; anything else as it is.
    fn sealed(&self, binding: &rounds::Binding, mut done: LeanResult) -> Result<LeanResult, ProxyError> {
        let Some(mut input) = done.input.take() else { return Ok(done) };
        let upstream = input.request_state.take();
        let shared = &self.shared;
        input.request_state = Some(rounds::seal_passed(&shared.cursors, binding, upstream, shared.call_timeout));
        let result = serde_json::value::to_raw_value(&input)
            .map_err(|e| ProxyError::Unavailable(format!("the upstream's question: {e}")))?;
        Ok(LeanResult { result, error_class: None, input: None, typed: true })
    }

    /// A 2026-07-28 caller's call, which takes no request from the server: it runs in a task of
    /// its own, and when its upstream asks the client something, the question is this
    /// request's answer (`input_required`, its `requestState` sealed and bound as the rmcp
    /// path binds it) and the call waits in the multi round-trip (`rounds`), where the retry
    /// that answers it finds it (on the rmcp path, as every retry).
    async fn by_rounds(&self, binding: rounds::Binding, call: LeanCall, mut exchange: Exchange) -> Verdict<LeanResult> {
        let shared = &self.shared;
        let (rounds, mut asked) = mpsc::channel::<Round>(2);
        exchange.downstream.rounds = Some(rounds.clone());
        // The call ends when its waiting exchange is dropped unanswered (it expired).
        let stop = CancellationToken::new();
        exchange.cancelled = stop.clone();
        let (done, mut ended) = oneshot::channel::<Result<LeanResult, ProxyError>>();
        let upstreams = Arc::clone(&shared.upstreams);
        tokio::spawn(
            async move {
                let LeanCall { ctx, target, tool, arguments, parsed } = call;
                let result = upstreams.call_lean(&target, &ctx, &tool, arguments.as_deref(), parsed, exchange).await;
                if let Err(result) = done.send(result) {
                    // Handed to the multi round-trip: the retry that answered takes the result.
                    let result = result.and_then(|r| {
                        serde_json::from_str(r.result.get())
                            .map(ServerResult::CallToolResult)
                            .map_err(|e| ProxyError::Unavailable(format!("the upstream's result: {e}")))
                    });
                    let _ = rounds.send(Round::Done(result)).await;
                }
            }
            .in_current_span(),
        );
        // The result, when it comes before any question.
        let first = tokio::select! {
            biased;
            result = &mut ended => Ok(result),
            Some(round) = asked.recv() => Err(round),
        };
        let round = match first {
            Ok(result) => {
                let ended = result.unwrap_or_else(|_| Err(ProxyError::Unavailable("the call ended".to_owned())));
                return Verdict::from(ended);
            }
            Err(round) => round,
        };
        drop(ended);
        let running = rounds::Running { rounds: asked, call: stop.drop_guard() };
        let key = &shared.rounds_key;
        match shared.rounds.settle(key, &shared.replica, binding, round, running, shared.call_timeout) {
            Ok(rounds::Next::Input(input)) => match serde_json::value::to_raw_value(&input) {
                Ok(result) => Verdict::Answered(Ok(LeanResult { result, error_class: None, input: None, typed: true })),
                Err(e) => Verdict::ProxyFailed(ProxyError::Unavailable(format!("the question: {e}"))),
            },
            // A result comes on the rounds only once the call was handed over.
            Ok(rounds::Next::Done(_)) => Verdict::ProxyFailed(ProxyError::Unavailable("the call ended".to_owned())),
            Err(e) => Verdict::ProxyFailed(e),
        }
    }
}

/// What a 2026-07-28 request standing alone says of its client, read as rmcp reads it: the
/// request is the relay's only when its `_meta` names the revision of its header and valid
/// client capabilities (rmcp refuses it otherwise), selects no roots, and its one `Mcp-Name`
/// names the tool plainly.
#[allow(deprecated)]
struct Alone {
    caps: RelayCaps,
    /// The client declared the tasks extension.
    tasks: bool,
    client: Option<(String, String)>,
    log_level: Option<rmcp::model::LoggingLevel>,
}

impl Alone {
    fn of(headers: &HeaderMap, tool: &str, meta: &HashMap<Cow<'_, str>, &RawValue>) -> Option<Self> {
        let name_ok = sole(headers, "mcp-name") == Some(tool) && !tool.starts_with("=?");
        let version = serde_json::from_str::<String>(meta.get(REQUEST_VERSION_META)?.get()).ok()?;
        if !name_ok || version != ALONE_VERSION || meta.contains_key(selection::SELECTED_ROOTS_KEY) {
            return None;
        }
        let caps: rmcp::model::ClientCapabilities =
            serde_json::from_str(meta.get(CLIENT_CAPABILITIES_META)?.get()).ok()?;
        // What does not parse is not there, as rmcp reads it.
        let client = meta
            .get(CLIENT_INFO_META)
            .and_then(|raw| serde_json::from_str::<rmcp::model::Implementation>(raw.get()).ok())
            .map(|info| (info.name, info.version));
        let log_level = meta.get(LOG_LEVEL_META).and_then(|raw| serde_json::from_str(raw.get()).ok());
        let tasks = caps.supports_tasks();
        Some(Self { caps: RelayCaps { modern: true, ..RelayCaps::declared_by(&caps) }, tasks, client, log_level })
    }
}

/// A call as it goes on in a task of its own.
struct LeanCall {
    ctx: McpCallContext,
    target: crate::proxy::LeanTarget,
    tool: String,
    arguments: Option<Box<RawValue>>,
    parsed: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The answer to a call, and its HTTP status when it is the whole response.
struct Reply {
    bytes: Bytes,
    status: StatusCode,
}

impl Reply {
    fn ok(bytes: Bytes) -> Self {
        Self { bytes, status: StatusCode::OK }
    }
}

/// The HTTP status rmcp gives an error that answers a 2026-07-28 request on its own.
fn alone_status(error: &rmcp::ErrorData) -> StatusCode {
    use rmcp::model::ErrorCode;
    match error.code {
        ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
        | ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        | ErrorCode::HEADER_MISMATCH => StatusCode::BAD_REQUEST,
        ErrorCode::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// A result as a 2026-07-28 caller gets it: with `resultType` (`complete` where the upstream
/// left it out; one it gave is kept).
fn completed(done: &LeanResult) -> Cow<'_, RawValue> {
    let result = &*done.result;
    if done.typed {
        return Cow::Borrowed(result);
    }
    let Some(rest) = result.get().trim_start().strip_prefix('{') else { return Cow::Borrowed(result) };
    let separator = if rest.trim_start().starts_with('}') { "" } else { "," };
    match RawValue::from_string(format!("{{\"resultType\":\"complete\"{separator}{rest}")) {
        Ok(spliced) => Cow::Owned(spliced),
        Err(_) => Cow::Borrowed(result),
    }
}

/// The one value of header `name`, as text (`None`: absent, repeated or not text; rmcp refuses
/// a repeated one of the revision's own headers).
fn sole<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok(),
        _ => None,
    }
}

/// `host` (a `Host` header) is one of `allowed`, by plain comparison: a lowercase name or
/// address, with a port or without (an entry without a port allows any).
fn host_allowed_in(allowed: &[String], host: &str) -> bool {
    if host.starts_with('[') || host.bytes().any(|b| b.is_ascii_uppercase()) {
        return false;
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ if host.contains(':') => return false,
        _ => host,
    };
    allowed.iter().any(|entry| entry == host || entry == name)
}

/// The JSON-RPC answer to `id`.
fn message(id: &RequestId, outcome: Result<&RawValue, &rmcp::ErrorData>) -> Bytes {
    let (result, error) = match outcome {
        Ok(result) => (Some(result), None),
        Err(error) => (None, Some(error)),
    };
    let answer = Answer { jsonrpc: "2.0", id, result, error };
    serde_json::to_vec(&answer).map(Bytes::from).unwrap_or_else(|_| {
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"internal error"}}"#)
    })
}

/// The answer when the call's task ended without one (it panicked).
fn gone(id: &RequestId) -> Reply {
    Reply::ok(message(id, Err(&rmcp::ErrorData::internal_error("internal error", None))))
}

/// One server-sent event carrying `message` (a line of its own for each of its lines: an
/// upstream's result may be pretty-printed).
fn event(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 16);
    for line in message.split(|b| *b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
        out.push(b'\n');
    }
    out.push(b'\n');
    Bytes::from(out)
}

fn json_response(answer: Reply) -> Response {
    let mut response = Response::new(Body::from(answer.bytes));
    *response.status_mut() = answer.status;
    response.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// The notifications (`first` and what follows) and then the answer, as an event stream (for
/// a 2026-07-28 caller, whose revision resumes no stream: no ids, and the upstream's polling
/// does not end it).
fn events_response(
    first: Note,
    noted: mpsc::Receiver<Note>,
    answered: oneshot::Receiver<Reply>,
    id: RequestId,
) -> Response {
    struct State {
        first: Option<Note>,
        noted: mpsc::Receiver<Note>,
        answered: oneshot::Receiver<Reply>,
        id: RequestId,
        done: bool,
    }
    let state = State { first: Some(first), noted, answered, id, done: false };
    let events = futures_util::stream::unfold(state, |mut state| async move {
        if let Some(Note::Message(first)) = state.first.take() {
            return Some((Ok::<Bytes, Infallible>(event(&first)), state));
        }
        loop {
            if state.done {
                return None;
            }
            // A notification queued before the answer is taken before it.
            let next = tokio::select! {
                biased;
                Some(note) = state.noted.recv() => match note {
                    Note::Message(note) => note,
                    Note::Polled { .. } => continue,
                },
                answer = &mut state.answered => {
                    state.done = true;
                    answer.unwrap_or_else(|_| gone(&state.id)).bytes
                }
            };
            return Some((Ok(event(&next)), state));
        }
    });
    stream_response(events)
}

/// The prefix of the relay's event ids (`scopegate-lean-STREAM-INDEX`): never one rmcp's
/// sessions give (`INDEX` or `INDEX/REQUEST`), so a `GET` naming one is the relay's.
const REPLAY_PREFIX: &str = "scopegate-lean-";

/// The most events one replay keeps: an older one is dropped, and resuming from before it
/// is refused (an empty stream), as rmcp's sessions refuse an id they no longer hold.
const MAX_REPLAYED: usize = 1024;

/// The stream and event index an event id of the relay's names.
fn replay_position(id: &str) -> Option<(u64, usize)> {
    let (stream, index) = id.strip_prefix(REPLAY_PREFIX)?.split_once('-')?;
    Some((stream.parse().ok()?, index.parse().ok()?))
}

/// The relay's resumable answers, by stream number; an ended one is forgotten `kept` after its
/// answer (looked at whenever one opens or is looked for).
#[derive(Default)]
struct Replays {
    next: std::sync::atomic::AtomicU64,
    live: Mutex<HashMap<u64, Arc<Replay>>>,
}

impl Replays {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Replay>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open(&self, session: &str, kept: std::time::Duration) -> Arc<Replay> {
        let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let replay = Arc::new(Replay {
            number,
            session: session.to_owned(),
            kept,
            state: Mutex::default(),
            grown: tokio::sync::watch::Sender::new(()),
        });
        let mut live = self.lock();
        live.retain(|_, replay| !replay.expired());
        live.insert(number, Arc::clone(&replay));
        replay
    }

    /// Stream `number`, if it answered `session` and is still kept.
    fn find(&self, number: u64, session: &str) -> Option<Arc<Replay>> {
        let mut live = self.lock();
        live.retain(|_, replay| !replay.expired());
        live.get(&number).filter(|replay| replay.session == session).cloned()
    }
}

/// One answer's events, each with its id, as written so far.
struct Replay {
    number: u64,
    /// The session it answers: the only one that may resume it.
    session: String,
    kept: std::time::Duration,
    state: Mutex<Replayed>,
    /// Told whenever an event is added or the answer is complete.
    grown: tokio::sync::watch::Sender<()>,
}

#[derive(Default)]
struct Replayed {
    /// The index of `events[0]`.
    base: usize,
    events: std::collections::VecDeque<Bytes>,
    /// When the answer was written.
    done: Option<std::time::Instant>,
    /// The index of the event after which the POST's own response ends: the upstream polled.
    polled: Option<usize>,
}

/// What a reader of a replay finds at its place.
enum Found {
    Event(Bytes),
    Wait,
    End,
}

impl Replay {
    fn lock(&self) -> std::sync::MutexGuard<'_, Replayed> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expired(&self) -> bool {
        self.lock().done.is_some_and(|done| done.elapsed() > self.kept)
    }

    /// Adds an event with the next id: `message` as its data (none: a priming event), with a
    /// `retry` field when given.
    fn push(&self, message: Option<&[u8]>, retry: Option<std::time::Duration>) {
        self.write(message, retry, false);
    }

    /// Adds what the call sent: a message, or the upstream's polling ([`Replay::poll`]), with
    /// `retry` (the session's) where the upstream announced none.
    fn note(&self, note: Note, retry: Option<std::time::Duration>) {
        match note {
            Note::Message(message) => self.push(Some(&message), None),
            Note::Polled { retry: announced } => self.poll(announced.or(retry)),
        }
    }

    /// The upstream polled (SEP-1699): the POST's response ends here, as the upstream's did,
    /// after an event with an id and `retry` and no data, as rmcp's sessions end a stream they
    /// close (`close_sse_stream`); its client resumes with a `GET` and that id, and gets the
    /// rest, the answer included, when it comes. Once only: a later stream is the client's
    /// `GET`, which goes on to the answer.
    fn poll(&self, retry: Option<std::time::Duration>) {
        self.write(None, retry, true);
    }

    fn write(&self, message: Option<&[u8]>, retry: Option<std::time::Duration>, polled: bool) {
        let mut state = self.lock();
        if polled && state.polled.is_some() {
            return;
        }
        let index = state.base + state.events.len();
        if polled {
            // Set with the event, under one lock: a reader never sees one without the other.
            state.polled = Some(index);
        }
        let mut out = format!("id: {REPLAY_PREFIX}{}-{index}\n", self.number).into_bytes();
        if let Some(retry) = retry {
            out.extend_from_slice(format!("retry: {}\n", retry.as_millis()).as_bytes());
        }
        match message {
            Some(message) => out.extend_from_slice(&event(message)),
            None => out.extend_from_slice(b"data: \n\n"),
        }
        if state.events.len() >= MAX_REPLAYED {
            state.events.pop_front();
            state.base += 1;
        }
        state.events.push_back(Bytes::from(out));
        drop(state);
        self.grown.send_replace(());
    }

    fn finish(&self) {
        self.lock().done = Some(std::time::Instant::now());
        self.grown.send_replace(());
    }

    /// The event at `index`, for the POST's own response (`posted`) or a `GET`'s.
    fn at(&self, index: usize, posted: bool) -> Found {
        let state = self.lock();
        if index < state.base || (posted && state.polled.is_some_and(|last| index > last)) {
            return Found::End;
        }
        match state.events.get(index - state.base) {
            Some(event) => Found::Event(event.clone()),
            None if state.done.is_some() => Found::End,
            None => Found::Wait,
        }
    }

    /// The events from index `from` on, as they come, until the answer; for the POST's own
    /// response (`posted`), until the upstream polled if it did.
    fn read_from(
        self: Arc<Self>,
        from: usize,
        posted: bool,
    ) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
        let grown = self.grown.subscribe();
        futures_util::stream::unfold((self, from, grown), move |(replay, next, mut grown)| async move {
            loop {
                match replay.at(next, posted) {
                    Found::Event(event) => return Some((Ok(event), (replay, next + 1, grown))),
                    Found::End => return None,
                    Found::Wait => grown.changed().await.ok()?,
                }
            }
        })
    }
}

/// An event stream response with `events` as its body.
fn stream_response(events: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static) -> Response {
    let mut response = Response::new(Body::from_stream(events));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, http::HeaderValue::from_static("no-cache"));
    response
}

fn accepted() -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_of_a_message_is_a_data_line_of_one_event() {
        assert_eq!(&event(br#"{"a":1}"#)[..], b"data: {\"a\":1}\n\n");
        assert_eq!(&event(b"{\r\n  \"a\": 1\n}")[..], b"data: {\ndata:   \"a\": 1\ndata: }\n\n");
    }

    #[test]
    fn hosts_are_compared_plainly_and_anything_else_is_left_to_rmcp() {
        let shared_free = |hosts: &[&str]| {
            let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
            move |host: &str| {
                if hosts.is_empty() {
                    return true;
                }
                host_allowed_in(&hosts, host)
            }
        };
        let allowed = shared_free(&["localhost", "gw.example:8443"]);
        assert!(allowed("localhost"));
        assert!(allowed("localhost:3000"), "an entry without a port allows any port");
        assert!(allowed("gw.example:8443"));
        assert!(!allowed("gw.example:9000"));
        assert!(!allowed("gw.example"));
        assert!(!allowed("evil.example"));
        assert!(!allowed("[::1]:80"), "bracketed addresses are rmcp's to normalize");
        assert!(!allowed("LOCALHOST"), "so are names in another case");
    }
}
