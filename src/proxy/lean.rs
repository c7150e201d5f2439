//! The lean leg of a proxied `tools/call`: the gateway POSTs the call to a local Streamable
//! HTTP upstream itself, on the session rmcp's client opened (same address, session id,
//! declared headers, negotiated version and per-request `_meta`), over the same pooled HTTP
//! client, and reads the answer without building rmcp model values: the call's arguments go
//! up as the caller sent them and the upstream's result comes back as raw JSON, checked for
//! shape, never rebuilt.
//!
//! What the upstream sends on the call's event stream before its answer is handled in order
//! as it arrives, as rmcp's side would handle it: progress under the caller's own token, log
//! lines at the session's level, list changes and resource updates for the sessions that
//! follow them, `ping` answered, and a request of the client refused or relayed exactly as
//! [`crate::relay::relay_to`] decides. A 2026-07-28 upstream's `input_required` goes
//! the same way as on rmcp's side. The call is announced in the connection's route table like
//! any other, so what the upstream sends on its session's own stream finds it too; the answer
//! waits for those. At the timeout, or when the caller cancels, the upstream is told to cancel.
//! A stream the upstream ends before the answer is resumed (`wire::resume`); when it ended
//! cleanly (the upstream polls, SEP-1699) the caller's sink is told, in its place among the
//! rest ([`crate::relay::Note::Polled`]), so the relay can end its own answer's stream alike.
//!
//! The relay's other calls (stdio upstreams, those through a remote executor, those that
//! carry a credential, tools that take request headers from their arguments) go through
//! rmcp's client on the running connection, exactly as on the rmcp path, and only the result
//! is turned into JSON here: [`Upstreams::lean_target`] says which leg a call takes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::header::{ACCEPT, CONTENT_TYPE};
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientJsonRpcMessage, ClientResult, NumberOrString, ProgressNotificationParam, ProgressToken, RequestId,
    ResourceUpdatedNotificationParam, ServerJsonRpcMessage, ServerRequest,
};
use rmcp::service::{Peer, RoleClient};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::McpCallContext;
use crate::proxy::{
    Connection, Downstream, Exchange, MAX_UPSTREAM_ROUNDS, ProxyError, Upstreams, asserted_caller, unavailable,
};
use crate::relay::catalog::ListKind;
use crate::relay::{Asked, forward_log, forward_progress, relay_to};
use crate::telemetry::trace;
use crate::wire::client::Wire;
use crate::wire::resume::Resumption;

/// The most an upstream's answer to one call may hold (its JSON body, or all the events of
/// its event stream together).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// How long telling an upstream to cancel may take.
const CANCEL_BOUND: Duration = Duration::from_secs(5);

/// Ids of the gateway's own requests on the lean leg: strings, so they never meet the
/// numbers rmcp's client gives its requests on the same session.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A call the lean relay can serve, and how it reaches its upstream.
pub enum LeanTarget {
    /// POSTed by the gateway itself on the session rmcp's client opened.
    Http(HttpTarget),
    /// Sent by rmcp's client on its running connection: a stdio upstream, one through a
    /// remote executor, one that carries a credential, or a tool that takes request headers.
    Peer { connection: Arc<Connection>, peer: Peer<RoleClient> },
}

impl LeanTarget {
    /// The connection the call goes on.
    pub fn connection(&self) -> &Connection {
        match self {
            Self::Http(target) => &target.connection,
            Self::Peer { connection, .. } => connection,
        }
    }
}

/// A call that takes the lean HTTP leg: the running connection, how its session is reached,
/// and its peer (for an upstream session that expired: rmcp's side opens a new one).
pub struct HttpTarget {
    connection: Arc<Connection>,
    wire: Arc<Wire>,
    peer: Peer<RoleClient>,
}

/// An upstream's result, as it sent it, and what the audit records of it.
pub struct LeanResult {
    pub result: Box<RawValue>,
    /// The result is a tool error (`isError`), with its class (`_meta`, caller-chosen text).
    pub error_class: Option<String>,
    /// Passed through (see [`Exchange::passed`]): the upstream asks its client first, and this is
    /// its `input_required` (audited as asked of the caller), whose `requestState` the answer
    /// seals; `result` is the same, as it came.
    pub input: Option<rmcp::model::InputRequiredResult>,
    /// `result` names its `resultType` (read with its shape, so a caller that needs one
    /// finds out without reading it again).
    pub typed: bool,
}

/// The members of a message from the upstream that matter here.
#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
    result: Option<Box<RawValue>>,
    error: Option<rmcp::ErrorData>,
}

/// A `tools/call` result's shape: what is checked, and what the audit reads.
#[derive(Deserialize)]
struct ResultShape<'a> {
    content: Option<Vec<ContentShape<'a>>>,
    #[serde(rename = "isError")]
    is_error: Option<bool>,
    #[serde(rename = "structuredContent", borrow)]
    structured: Option<&'a RawValue>,
    #[serde(rename = "_meta", borrow)]
    meta: Option<HashMap<Cow<'a, str>, &'a RawValue>>,
    #[serde(rename = "resultType", borrow)]
    result_type: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ContentShape<'a> {
    #[serde(rename = "type", borrow)]
    #[allow(dead_code)]
    kind: Cow<'a, str>,
}

#[derive(Serialize)]
struct Outgoing<'a> {
    jsonrpc: &'static str,
    id: &'a str,
    method: &'static str,
    params: OutParams<'a>,
}

#[derive(Serialize)]
struct OutParams<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a RawValue>,
    #[serde(rename = "_meta")]
    meta: OutMeta<'a>,
    #[serde(rename = "inputResponses", skip_serializing_if = "Option::is_none")]
    input_responses: Option<&'a Value>,
    #[serde(rename = "requestState", skip_serializing_if = "Option::is_none")]
    request_state: Option<&'a str>,
}

#[derive(Serialize)]
#[allow(deprecated)]
struct OutMeta<'a> {
    #[serde(flatten)]
    protocol: &'a Map<String, Value>,
    #[serde(rename = "progressToken")]
    progress_token: &'a str,
    /// Towards a 2026-07-28 upstream, the caller's log level (its session's): the upstream
    /// logs to a request only at the level it names.
    #[serde(rename = "io.modelcontextprotocol/logLevel", skip_serializing_if = "Option::is_none")]
    log_level: Option<rmcp::model::LoggingLevel>,
}

/// How one exchange with the upstream ended.
enum Ended {
    Answer(LeanResult),
    /// The upstream asks its client first (2026-07-28): the params of the next round.
    Input(rmcp::model::InputRequiredResult),
    /// The upstream no longer knows the session: nothing was done; rmcp's side takes over.
    SessionGone,
}

/// Why the lean leg did not bring an answer.
#[derive(Debug)]
pub(crate) enum LeanFailure {
    /// The upstream no longer knows the session and nothing was sent: rmcp's client opens a
    /// new one and the call goes through it.
    SessionGone,
    /// The call failed on the way to or from its upstream.
    Failed(ProxyError),
}

impl From<ProxyError> for LeanFailure {
    fn from(e: ProxyError) -> Self {
        Self::Failed(e)
    }
}

impl Upstreams {
    /// Whether a call of `tool` on `connection` can be served by the lean relay, and how: the
    /// connection is running (it is started if need be) and has the tool, which the gateway
    /// does not run as a task of its own. The call takes the lean HTTP leg when it reaches a
    /// local Streamable HTTP session that carries no credential and the tool takes no request
    /// header from its arguments (SEP-2243), nor needs its name encoded for one; else it goes
    /// through rmcp's client.
    pub(crate) async fn lean_target(&self, connection: &Arc<Connection>, tool: &str) -> Option<LeanTarget> {
        let (peer, tools) = connection.ready(self.connect_timeout).await.ok()?;
        let listed = tools.iter().find(|t| t.name == tool)?;
        if connection.task_support(tool).is_some() && !crate::proxy::Upstream(peer.clone()).offers_tasks() {
            return None;
        }
        let connection = Arc::clone(connection);
        let wire = connection.wire.current().filter(|wire| {
            connection.auth.is_none()
                && !(wire.standard_headers
                    && (!tool.bytes().all(|b| b.is_ascii_graphic()) || takes_headers(&listed.input_schema)))
        });
        Some(match wire {
            Some(wire) => LeanTarget::Http(HttpTarget { connection, wire, peer }),
            None => LeanTarget::Peer { connection, peer },
        })
    }

    /// Calls `tool` on the target's upstream for the caller: the call carries an identity
    /// assertion (audience: the server id) and nothing of the client's own credentials. It
    /// ends at `timeout` or when `cancelled`; either way the upstream is told to cancel.
    /// `parsed`: the same arguments already parsed, when the caller has them (rmcp's client
    /// sends them so; without them they are parsed from `arguments` when needed).
    pub(crate) async fn call_lean(
        &self,
        target: &LeanTarget,
        ctx: &McpCallContext,
        tool: &str,
        arguments: Option<&RawValue>,
        parsed: Option<Map<String, Value>>,
        exchange: Exchange,
    ) -> Result<LeanResult, ProxyError> {
        let target = match target {
            LeanTarget::Http(target) => target,
            LeanTarget::Peer { connection, peer } => {
                return self.call_by_peer(connection, peer, ctx, tool, arguments, parsed, exchange).await;
            }
        };
        let connection = &target.connection;
        let call = connection.begin_call();
        let span = trace::upstream_span(connection.server().as_str(), tool, "lean");
        let result = self.call_lean_inner(target, ctx, tool, arguments, &exchange).instrument(span).await;
        drop(call);
        match result {
            Err(LeanFailure::SessionGone) => {
                // The upstream's session ended: rmcp's client opens a new one.
                tracing::debug!(server = %connection.server(), "upstream session gone; the call goes through rmcp");
                self.call_by_peer(connection, &target.peer, ctx, tool, arguments, parsed, exchange).await
            }
            Err(LeanFailure::Failed(e)) => Err(e),
            Ok(done) => Ok(done),
        }
    }

    /// Calls `tool` through rmcp's client on the running connection, as the rmcp path does
    /// ([`Upstreams::call`]: the same assertion, relaying, cancellation and login check), and
    /// gives back its result as JSON, as a caller on a session's revision gets it.
    #[allow(clippy::too_many_arguments)]
    async fn call_by_peer(
        &self,
        connection: &Connection,
        peer: &Peer<RoleClient>,
        ctx: &McpCallContext,
        tool: &str,
        arguments: Option<&RawValue>,
        parsed: Option<Map<String, Value>>,
        Exchange { downstream, timeout, cancelled, passed }: Exchange,
    ) -> Result<LeanResult, ProxyError> {
        let arguments = match (parsed, arguments) {
            (Some(parsed), _) => Some(parsed),
            (None, Some(raw)) => serde_json::from_str(raw.get()).map_err(unavailable)?,
            (None, None) => None,
        };
        let call = crate::proxy::UpstreamCall { tool, arguments, downstream, timeout, cancelled, passed };
        let mut result = match self.call(connection, crate::proxy::Upstream(peer.clone()), ctx, call).await? {
            rmcp::model::ServerResult::CallToolResult(result) => result,
            // Passed through: audited as asked of the caller where it was sent.
            rmcp::model::ServerResult::InputRequiredResult(input) => {
                let result = serde_json::value::to_raw_value(&input).map_err(unavailable)?;
                return Ok(LeanResult { result, error_class: None, input: Some(input), typed: true });
            }
            _ => return Err(unavailable("the upstream answered a call with something else")),
        };
        // The relay serves session revisions, whose results carry no `resultType`.
        result.result_type = None;
        let error_class =
            (result.is_error == Some(true)).then(|| crate::vocab::text::error_class(result.meta.as_ref()));
        let result = serde_json::value::to_raw_value(&result).map_err(unavailable)?;
        Ok(LeanResult { result, error_class, input: None, typed: false })
    }

    /// `Err(LeanFailure::SessionGone)`: the upstream session is gone and nothing was sent.
    /// With [`Exchange::passed`], the upstream's `input_required` is the answer.
    async fn call_lean_inner(
        &self,
        target: &HttpTarget,
        ctx: &McpCallContext,
        tool: &str,
        arguments: Option<&RawValue>,
        exchange: &Exchange,
    ) -> Result<LeanResult, LeanFailure> {
        let Exchange { downstream, timeout, cancelled, passed } = exchange;
        let (timeout, passed) = (*timeout, passed.is_some());
        let connection = &target.connection;
        let server = connection.server().as_str();
        let assertion = self.signer.assertion(&asserted_caller(ctx), server).map_err(|_| ProxyError::Assertion)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let log_level = downstream.log_level.level();
        let (mut responses, mut state) = (None::<Value>, None::<String>);
        for round in 0..=MAX_UPSTREAM_ROUNDS {
            let id = format!("scopegate-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
            let body = serde_json::to_vec(&Outgoing {
                jsonrpc: "2.0",
                id: &id,
                method: "tools/call",
                params: OutParams {
                    name: tool,
                    arguments,
                    meta: OutMeta {
                        protocol: &target.wire.meta,
                        progress_token: &id,
                        log_level: log_level.filter(|_| target.wire.standard_headers),
                    },
                    input_responses: responses.as_ref(),
                    request_state: state.as_deref(),
                },
            })
            .map_err(unavailable)?;
            // Announced before it is sent, like every call: what the upstream sends on its
            // session's own stream for this call finds it.
            let mut route = connection.routes.announce(downstream.clone());
            let (token, request) = (NumberOrString::String(id.as_str().into()), RequestId::String(id.as_str().into()));
            if let Some((target, early)) = route.route(&ProgressToken(token), &request) {
                for params in early {
                    forward_progress(server, target.clone(), params).await;
                }
            }
            let exchange = self.lean_exchange(target, tool, &assertion, &id, body, downstream, cancelled);
            let ended = tokio::select! {
                ended = exchange => ended,
                () = tokio::time::sleep_until(deadline) => {
                    self.lean_cancel(target, &id, "timed out").await;
                    return Err(ProxyError::Timeout.into());
                }
                () = cancelled.cancelled() => {
                    self.lean_cancel(target, &id, "cancelled by the client").await;
                    return Err(ProxyError::Cancelled.into());
                }
            };
            let ended = ended?;
            // What the upstream sent before its answer reaches the caller before the answer.
            connection.routes.dispatch.settle(connection.routes.dispatch.horizon()).await;
            drop(route);
            match ended {
                Ended::Answer(result) => return Ok(result),
                Ended::SessionGone if round == 0 => return Err(LeanFailure::SessionGone),
                Ended::SessionGone => {
                    return Err(unavailable("the upstream session ended during a multi round-trip").into());
                }
                Ended::Input(input) if passed => {
                    crate::relay::audit_passed(server, downstream, connection.caps, &input)
                        .await
                        .map_err(ProxyError::Upstream)?;
                    let result = serde_json::value::to_raw_value(&input).map_err(unavailable)?;
                    return Ok(LeanResult { result, error_class: None, input: Some(input), typed: true });
                }
                Ended::Input(input) => {
                    let mut answers = Map::new();
                    for (key, asked) in input.input_requests.unwrap_or_default() {
                        let answer = crate::proxy::ask_for_upstream(connection, downstream, asked, cancelled).await;
                        answers.insert(key, answer.map_err(ProxyError::Upstream)?);
                    }
                    (responses, state) = (Some(Value::Object(answers)), input.request_state);
                }
            }
        }
        Err(LeanFailure::Failed(ProxyError::Unavailable(format!(
            "the upstream asked more than {MAX_UPSTREAM_ROUNDS} rounds of input"
        ))))
    }

    /// One POST of the call and everything the upstream sends until its answer.
    #[allow(clippy::too_many_arguments)]
    async fn lean_exchange(
        &self,
        target: &HttpTarget,
        tool: &str,
        assertion: &str,
        id: &str,
        body: Vec<u8>,
        downstream: &Downstream,
        cancelled: &CancellationToken,
    ) -> Result<Ended, ProxyError> {
        let mut request = self.lean_post(&target.wire, "tools/call", body);
        request = request.header(&self.local.assertion_header, assertion);
        // The call's trace context (its upstream span's): `traceparent` and `tracestate` only.
        for (name, value) in trace::outgoing() {
            request = request.header(name, value);
        }
        if target.wire.standard_headers {
            request = request.header("mcp-name", tool);
        }
        let mut response = request.send().await.map_err(unavailable)?;
        let status = response.status();
        if status == http::StatusCode::NOT_FOUND && target.wire.session.is_some() {
            return Ok(Ended::SessionGone);
        }
        let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        if essence == "application/json" {
            let body = read_bounded(response.bytes_stream()).await?;
            let text = std::str::from_utf8(&body).map_err(unavailable)?;
            return match self.lean_message(target, text, id, downstream, cancelled).await? {
                Some(ended) => Ok(ended),
                None if status.is_success() => Err(unavailable("the upstream answered with no answer to the call")),
                None => Err(unavailable(format!("the upstream answered HTTP {status}"))),
            };
        }
        if !status.is_success() || essence != "text/event-stream" {
            return Err(unavailable(format!("the upstream answered HTTP {status} ({content_type})")));
        }
        // The bound holds for all the events of the call's stream together, resumed or not.
        let mut seen = 0usize;
        let mut resumption = if target.wire.resumable() { Resumption::default() } else { Resumption::none() };
        // Whether the caller was told that the upstream polled (once: its stream ends there).
        let mut told = false;
        loop {
            let broken = {
                let seen = &mut seen;
                let bytes = response.bytes_stream().map(move |chunk| {
                    let chunk = chunk.map_err(std::io::Error::other)?;
                    *seen += chunk.len();
                    if *seen > MAX_ANSWER_BYTES {
                        return Err(std::io::Error::other("the upstream's answer is too large"));
                    }
                    Ok::<Bytes, std::io::Error>(chunk)
                });
                let mut events = sse_stream::SseStream::from_bytes_stream(bytes);
                loop {
                    let event = match events.next().await {
                        Some(Ok(event)) => event,
                        Some(Err(e)) => break Some(e),
                        None => break None,
                    };
                    resumption.saw(event.id.as_deref(), event.retry);
                    let Some(data) = event.data.as_deref().filter(|d| !d.trim().is_empty()) else { continue };
                    if let Some(ended) = self.lean_message(target, data, id, downstream, cancelled).await? {
                        return Ok(ended);
                    }
                }
            };
            if seen > MAX_ANSWER_BYTES {
                return Err(unavailable("the upstream's answer is too large"));
            }
            // The stream ended (or broke) before the answer: resumed on the session, as the
            // upstream's event ids and `retry` allow, within the call's deadline (its caller's).
            let Some(last) = resumption.next().await else {
                return Err(match broken {
                    Some(e) => unavailable(e),
                    None => unavailable("the upstream's event stream ended before its answer"),
                });
            };
            // A stream closed cleanly with an id to resume from is the upstream polling
            // (SEP-1699): the caller's answer may do as the upstream did (end its stream,
            // resumable, and let the client come back for the answer); after what came
            // before it, so nothing is reordered. A broken connection is the gateway's
            // business alone.
            if broken.is_none() && !told {
                told = true;
                downstream.sink.polled(resumption.announced()).await;
            }
            response = self.lean_resume(target, &last).await?;
        }
    }

    /// A `GET` resuming the call's event stream after `last` (the last event id it showed), on
    /// the session the call went on, with the session's headers: none of the call's own (its
    /// assertion, its trace context) is sent again.
    async fn lean_resume(&self, target: &HttpTarget, last: &str) -> Result<reqwest::Response, ProxyError> {
        let wire = &target.wire;
        let mut request =
            self.local.http.get(wire.url.clone()).headers(wire.headers.clone()).header(ACCEPT, "text/event-stream");
        if let Some(session) = &wire.session {
            request = request.header("mcp-session-id", &**session);
        }
        let response = request.header("last-event-id", last).send().await.map_err(unavailable)?;
        let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        if !response.status().is_success() || !essence.eq_ignore_ascii_case("text/event-stream") {
            let status = response.status();
            return Err(unavailable(format!("resuming the call's event stream: HTTP {status} ({content_type})")));
        }
        tracing::debug!(server = %target.connection.server(), "a call's event stream resumed");
        Ok(response)
    }

    /// Handles one message from the upstream; `Some` when it ends the exchange.
    async fn lean_message(
        &self,
        target: &HttpTarget,
        text: &str,
        id: &str,
        downstream: &Downstream,
        cancelled: &CancellationToken,
    ) -> Result<Option<Ended>, ProxyError> {
        let message: Incoming = serde_json::from_str(text).map_err(unavailable)?;
        // The call's id is plain text (`scopegate-N`): its JSON form is it between quotes.
        let is_call = |raw: &RawValue| raw.get().strip_prefix('"').and_then(|r| r.strip_suffix('"')) == Some(id);
        let server = target.connection.server().as_str();
        match (&message.method, message.id) {
            (None, Some(answered)) if is_call(answered) => match (message.result, message.error) {
                (Some(result), None) => answer(result).map(Some),
                (None, Some(error)) => Err(ProxyError::Upstream(error)),
                _ => Err(unavailable("the upstream's answer is neither a result nor an error")),
            },
            // An answer to something else: not this call's.
            (None, _) => Ok(None),
            (Some(method), Some(asked_id)) => {
                let id: RequestId = serde_json::from_str(asked_id.get()).map_err(unavailable)?;
                let answer = if method == "ping" {
                    ClientJsonRpcMessage::response(ClientResult::empty(()), id)
                } else {
                    match self.asked(target, text, downstream, cancelled).await {
                        Ok(result) => ClientJsonRpcMessage::response(result, id),
                        Err(e) => ClientJsonRpcMessage::error(e, Some(id)),
                    }
                };
                let body = serde_json::to_vec(&answer).map_err(unavailable)?;
                let response = self.lean_post(&target.wire, "", body).send().await;
                if let Err(e) = response {
                    tracing::debug!(%server, error = %e, "an answer to the upstream was not delivered");
                }
                Ok(None)
            }
            (Some(method), None) => {
                let params = message.params.map_or("{}", RawValue::get);
                self.lean_notification(target, id, method, params, downstream).await;
                Ok(None)
            }
        }
    }

    /// What the upstream asks its client while serving the call: refused or relayed exactly as
    /// on rmcp's side.
    async fn asked(
        &self,
        target: &HttpTarget,
        text: &str,
        downstream: &Downstream,
        cancelled: &CancellationToken,
    ) -> Result<ClientResult, rmcp::ErrorData> {
        let request = match serde_json::from_str::<ServerJsonRpcMessage>(text) {
            Ok(ServerJsonRpcMessage::Request(request)) => request.request,
            _ => return Err(rmcp::ErrorData::invalid_request("not a request the gateway knows", None)),
        };
        if !matches!(
            request,
            ServerRequest::CreateMessageRequest(_)
                | ServerRequest::ElicitRequest(_)
                | ServerRequest::ListRootsRequest(_)
        ) {
            return Err(rmcp::ErrorData::new(rmcp::model::ErrorCode::METHOD_NOT_FOUND, "method not found", None));
        }
        let asked = Asked::of(&request, target.connection.caps)?;
        relay_to(target.connection.server().as_str(), downstream, asked, request, cancelled).await
    }

    /// A notification on the call's stream.
    async fn lean_notification(
        &self,
        target: &HttpTarget,
        id: &str,
        method: &str,
        params: &str,
        downstream: &Downstream,
    ) {
        let connection = &target.connection;
        let server = connection.server().as_str();
        match method {
            "notifications/progress" => {
                // Only this call's progress: its token is the call's own id.
                if let Ok(params) = serde_json::from_str::<ProgressNotificationParam>(params)
                    && matches!(&params.progress_token.0, NumberOrString::String(token) if **token == *id)
                {
                    forward_progress(server, downstream.clone(), params).await;
                }
            }
            "notifications/message" => {
                #[allow(deprecated)]
                if let Ok(params) = serde_json::from_str::<LoggingMessageNotificationParam>(params) {
                    forward_log(server, downstream, params).await;
                }
            }
            "notifications/tools/list_changed" => connection.handler().list_changed(ListKind::Tools).await,
            "notifications/prompts/list_changed" => connection.handler().list_changed(ListKind::Prompts).await,
            "notifications/resources/list_changed" => connection.handler().list_changed(ListKind::Resources).await,
            "notifications/resources/updated" => {
                if let Ok(params) = serde_json::from_str::<ResourceUpdatedNotificationParam>(params) {
                    connection.handler().resource_updated(params).await;
                }
            }
            other => tracing::debug!(%server, method = other, "upstream notification on a call's stream ignored"),
        }
    }

    /// Tells the upstream to cancel the call `id` (bounded; a failure is only logged).
    async fn lean_cancel(&self, target: &HttpTarget, id: &str, reason: &str) {
        let message = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": reason},
        });
        let body = serde_json::to_vec(&message).unwrap_or_default();
        let sent = self.lean_post(&target.wire, "notifications/cancelled", body).send();
        match tokio::time::timeout(CANCEL_BOUND, sent).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(server = %target.connection.server(), error = %e, "cancellation not delivered")
            }
            Err(_) => tracing::debug!(server = %target.connection.server(), "cancellation not delivered in time"),
        }
    }

    /// A POST of `body` on the session, with its headers (and `Mcp-Method` when the version
    /// asks for the standard headers and `method` is given).
    fn lean_post(&self, wire: &Wire, method: &str, body: Vec<u8>) -> reqwest::RequestBuilder {
        let mut request = self
            .local
            .http
            .post(wire.url.clone())
            .headers(wire.headers.clone())
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json");
        if let Some(session) = &wire.session {
            request = request.header("mcp-session-id", &**session);
        }
        if wire.standard_headers && !method.is_empty() {
            request = request.header("mcp-method", method);
        }
        request.body(body)
    }
}

/// Reads a JSON answer's body, at most [`MAX_ANSWER_BYTES`].
async fn read_bounded(
    mut stream: impl Stream<Item = Result<Bytes, reqwest::Error>> + Unpin,
) -> Result<Vec<u8>, ProxyError> {
    let mut body = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(unavailable)?;
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(unavailable("the upstream's answer is too large"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The upstream's result of the call, checked for the shape of a `tools/call` result (an
/// object; `content` a list of typed blocks, `isError` a boolean, `structuredContent` an
/// object, where present), or its request for input.
fn answer(result: Box<RawValue>) -> Result<Ended, ProxyError> {
    let not_a_result =
        |e: serde_json::Error| unavailable(format!("the upstream answered a call with something else: {e}"));
    let shape: ResultShape = serde_json::from_str(result.get()).map_err(not_a_result)?;
    if shape.result_type.as_deref() == Some("input_required") {
        let input = serde_json::from_str(result.get()).map_err(not_a_result)?;
        return Ok(Ended::Input(input));
    }
    if shape.structured.is_some_and(|s| !s.get().trim_start().starts_with('{')) {
        return Err(unavailable("the upstream's structuredContent is not an object"));
    }
    let _ = shape.content;
    let error_class = (shape.is_error == Some(true)).then(|| {
        let class = shape
            .meta
            .as_ref()
            .and_then(|m| m.get(crate::vocab::text::ERROR_CLASS_META))
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok());
        crate::audit::refusal::safe_text(class.as_deref().unwrap_or("tool_error"))
    });
    let typed = shape.result_type.is_some();
    Ok(Ended::Answer(LeanResult { result, error_class, input: None, typed }))
}

/// Whether a tool's input schema names a request header for one of its arguments
/// (`x-mcp-header`, SEP-2243): such a call needs rmcp's client, which sends them.
fn takes_headers(schema: &Map<String, Value>) -> bool {
    fn walk(value: &Value, depth: usize) -> bool {
        match value {
            _ if depth > 32 => true,
            Value::Object(map) => map.iter().any(|(k, v)| k == "x-mcp-header" || walk(v, depth + 1)),
            Value::Array(items) => items.iter().any(|v| walk(v, depth + 1)),
            _ => false,
        }
    }
    schema.iter().any(|(k, v)| k == "x-mcp-header" || walk(v, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn results_are_checked_for_shape_and_kept_as_sent() {
        let sent = r#"{"content":[{"type":"text","text":"hi","extra":1}],"isError":false,"x":{"kept":true}}"#;
        match answer(raw(sent)) {
            Ok(Ended::Answer(r)) => {
                assert_eq!(r.result.get(), sent, "relayed byte for byte");
                assert_eq!(r.error_class, None);
            }
            _ => panic!("a result"),
        }
        let failed = r#"{"content":[],"isError":true,"_meta":{"io.scopegate/error":"quota\nexceeded"}}"#;
        match answer(raw(failed)) {
            Ok(Ended::Answer(r)) => {
                let made_safe = crate::audit::refusal::safe_text("quota\nexceeded");
                assert_eq!(r.error_class, Some(made_safe), "the class is the result's, made safe for the audit");
            }
            _ => panic!("a tool error"),
        }
        for bad in [
            r#"[1]"#,
            r#""text""#,
            r#"{"content":"text"}"#,
            r#"{"content":[{"text":"no type"}]}"#,
            r#"{"isError":"yes"}"#,
            r#"{"structuredContent":[1]}"#,
        ] {
            assert!(matches!(answer(raw(bad)), Err(ProxyError::Unavailable(_))), "{bad}");
        }
        let input = r#"{"resultType":"input_required","inputRequests":{},"requestState":"s"}"#;
        assert!(matches!(answer(raw(input)), Ok(Ended::Input(_))));
    }

    #[test]
    fn header_annotations_anywhere_in_a_schema_are_found() {
        let plain = serde_json::json!({"type":"object","properties":{"a":{"type":"string"}}});
        let annotated = serde_json::json!({"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"string","x-mcp-header":"B"}}}}});
        assert!(!takes_headers(plain.as_object().unwrap()));
        assert!(takes_headers(annotated.as_object().unwrap()));
    }
}
