//! Requests an upstream makes of its client (sampling, elicitation, roots): relayed to the one
//! session whose call it is serving, or asked by the multi round-trip of a 2026-07-28 caller;
//! every one audited.

use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{ClientResult, ElicitRequestParams, ErrorCode, InputRequest, ServerRequest};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::Value;

use crate::audit::Outcome;
use crate::telemetry::metrics;

use super::*;

/// The request of the client an upstream's `input_required` names, as the request the gateway
/// relays or audits; `None` for a kind the gateway does not know.
pub(crate) fn asked_request(asked: InputRequest) -> Option<ServerRequest> {
    match asked {
        InputRequest::CreateMessage(r) => Some(ServerRequest::CreateMessageRequest(r)),
        InputRequest::Elicitation(r) => Some(ServerRequest::ElicitRequest(r)),
        InputRequest::ListRoots(r) => Some(ServerRequest::ListRootsRequest(r)),
        _ => None,
    }
}

/// An upstream's answer that is not the result of what it was asked.
pub(super) fn answered_otherwise() -> ErrorData {
    ErrorData::internal_error("the client answered with something else", None)
}

/// How the client's answer to a relayed request is read.
type Parse = fn(Value) -> Result<ClientResult, serde_json::Error>;

/// A request of the client: its method, whether the connection's clients declared it, its
/// params (the audit digests them), and how its answer is read.
pub(crate) struct Asked {
    pub(super) method: &'static str,
    declared: bool,
    arguments: Value,
    parse: Parse,
}

impl Asked {
    pub(crate) fn of(request: &ServerRequest, caps: RelayCaps) -> Result<Self, ErrorData> {
        let params = |p: serde_json::Result<Value>| p.unwrap_or(Value::Null);
        Ok(match request {
            ServerRequest::CreateMessageRequest(r) => Self {
                method: "sampling/createMessage",
                declared: caps.sampling,
                arguments: params(serde_json::to_value(&r.params)),
                parse: |v| serde_json::from_value(v).map(|r| ClientResult::CreateMessageResult(Box::new(r))),
            },
            ServerRequest::ElicitRequest(r) => Self {
                method: "elicitation/create",
                declared: match &r.params {
                    ElicitRequestParams::UrlElicitationParams { .. } => caps.elicitation_url,
                    _ => caps.elicitation_form,
                },
                arguments: params(serde_json::to_value(&r.params)),
                parse: |v| serde_json::from_value(v).map(ClientResult::ElicitResult),
            },
            ServerRequest::ListRootsRequest(_) => Self {
                method: "roots/list",
                declared: caps.roots,
                arguments: Value::Null,
                parse: |v| serde_json::from_value(v).map(ClientResult::ListRootsResult),
            },
            _ => return Err(ErrorData::invalid_request("only sampling, elicitation and roots are relayed", None)),
        })
    }
}

/// Asks `target`'s client `request` on behalf of `server`'s upstream (see `ProxyClient::relay`):
/// only when that client declared the capability, by multi round-trip for a 2026-07-28
/// caller, within the call's timeout, ended by `ct`; audited.
pub(crate) async fn relay_to(
    server: &str,
    target: &Downstream,
    Asked { method, declared, arguments, parse }: Asked,
    request: ServerRequest,
    ct: &tokio_util::sync::CancellationToken,
) -> Result<ClientResult, ErrorData> {
    let refuse = |why: &'static str| {
        metrics::denial(why);
        tracing::debug!(%server, %method, why, "request to the client refused");
    };
    let Some(origin) = target.origin.clone() else {
        refuse("upstream_request_unroutable");
        return Err(ErrorData::invalid_request(format!("{method} refused: the call has no client to ask"), None));
    };
    let audit = origin.audit_of(server, method, &arguments);
    let outcome = if !declared {
        refuse("upstream_request_not_declared");
        Err((
            ErrorData::new(ErrorCode::METHOD_NOT_FOUND, format!("the client does not support {method}"), None),
            "not_declared",
        ))
    } else if let Some(rounds) = &target.rounds {
        ask_by_round(method, rounds, request, parse, origin.timeout, ct).await
    } else {
        match &target.sink {
            Sink::Peer(peer) => ask_through_peer(server, method, peer, request, origin.timeout, ct).await,
            Sink::Stream { answer, asks, .. } => {
                ask_on_answer(method, asks, &target.owner, answer, request, parse, origin.timeout, ct).await
            }
        }
    };
    let event = match &outcome {
        Ok(_) => audit.event(Outcome::Ok, None),
        Err((_, class)) => audit.event(Outcome::Failed, Some(class)),
    };
    // Fail closed: without its audit event the client's answer is not handed over.
    origin.audit.record_or_withhold(event, method).await?;
    outcome.map_err(|(e, _)| e)
}

/// The requests of a 2026-07-28 upstream's `input_required`, passed through to a 2026-07-28
/// caller as its request's answer: each is audited as asked of the caller (the method, the
/// digest of its params), and one the caller's client did not declare fails the request
/// (audited as such) instead of reaching it.
pub(crate) async fn audit_passed(
    server: &str,
    target: &Downstream,
    caps: RelayCaps,
    input: &rmcp::model::InputRequiredResult,
) -> Result<(), ErrorData> {
    let Some(origin) = target.origin.as_ref() else {
        return Err(ErrorData::invalid_request("the request has no client to ask", None));
    };
    let mut refused = None;
    for asked in input.input_requests.iter().flat_map(|r| r.values()) {
        let Some(request) = asked_request(asked.clone()) else {
            return Err(ErrorData::invalid_request("an input request of an unknown kind", None));
        };
        let Asked { method, declared, arguments, .. } = Asked::of(&request, caps)?;
        let audit = origin.audit_of(server, method, &arguments);
        let event = if declared {
            audit.event(Outcome::Ok, None)
        } else {
            metrics::denial("upstream_request_not_declared");
            refused = Some(method);
            audit.event(Outcome::Failed, Some("not_declared"))
        };
        origin.audit.record_or_withhold(event, method).await?;
    }
    match refused {
        Some(method) => {
            Err(ErrorData::new(ErrorCode::METHOD_NOT_FOUND, format!("the client does not support {method}"), None))
        }
        None => Ok(()),
    }
}

/// Asks a caller through its rmcp session (rmcp puts the request on the call's event stream).
async fn ask_through_peer(
    server: &str,
    method: &str,
    peer: &rmcp::service::Peer<rmcp::RoleServer>,
    request: ServerRequest,
    timeout: Duration,
    ct: &tokio_util::sync::CancellationToken,
) -> Result<ClientResult, (ErrorData, &'static str)> {
    let options = PeerRequestOptions::with_timeout(timeout);
    let sent = async {
        let handle = peer.send_request_with_option(request, options).await?;
        handle.await_response().await
    };
    tokio::select! {
        answer = sent => match answer {
            Ok(result) => Ok(result),
            Err(ServiceError::McpError(e)) => Err((e, "client_error")),
            Err(ServiceError::Timeout { .. }) => {
                Err((ErrorData::internal_error(format!("{method}: the client did not answer in time"), None), "timeout"))
            }
            Err(e) => {
                tracing::debug!(%server, %method, error = %e, "relayed request failed");
                Err((ErrorData::internal_error(format!("{method}: the client could not be asked"), None), "unavailable"))
            }
        },
        () = ct.cancelled() => Err((ErrorData::internal_error("cancelled by the server", None), "cancelled")),
    }
}

/// Asks a caller of the lean relay on its call's answer (an event stream by then): the request
/// goes out as an event before the answer, and the client POSTs its answer to the endpoint in
/// the same session, where the relay hands it here (`mcp::lean`).
#[allow(clippy::too_many_arguments)]
async fn ask_on_answer(
    method: &str,
    asks: &Asks,
    session: &str,
    answer: &tokio::sync::mpsc::Sender<super::Note>,
    request: ServerRequest,
    parse: Parse,
    timeout: Duration,
    ct: &tokio_util::sync::CancellationToken,
) -> Result<ClientResult, (ErrorData, &'static str)> {
    let gone = || (ErrorData::internal_error(format!("{method}: the client could not be asked"), None), "unavailable");
    let (id, mut waiting) = asks.wait(session);
    let message = rmcp::model::ServerJsonRpcMessage::Request(rmcp::model::JsonRpcRequest::new(id, request));
    let bytes = serde_json::to_vec(&message).map_err(|_| gone())?;
    answer.send(super::Note::Message(bytes.into())).await.map_err(|_| gone())?;
    tokio::select! {
        answered = tokio::time::timeout(timeout, &mut waiting.answered) => match answered {
            Ok(Ok(Ok(value))) => parse(value).map_err(|e| {
                (ErrorData::invalid_params(format!("{method}: the client's answer does not fit: {e}"), None), "client_error")
            }),
            Ok(Ok(Err(e))) => Err((e, "client_error")),
            Ok(Err(_)) => Err(gone()),
            Err(_) => Err((ErrorData::internal_error(format!("{method}: the client did not answer in time"), None), "timeout")),
        },
        () = ct.cancelled() => Err((ErrorData::internal_error("cancelled by the server", None), "cancelled")),
    }
}

/// Asks a 2026-07-28 caller through the multi round-trip: the request goes out in the call's
/// `input_required` answer and the client's answer comes back with its retry.
async fn ask_by_round(
    method: &str,
    rounds: &tokio::sync::mpsc::Sender<Round>,
    request: ServerRequest,
    parse: Parse,
    timeout: Duration,
    ct: &tokio_util::sync::CancellationToken,
) -> Result<ClientResult, (ErrorData, &'static str)> {
    let request = match request {
        ServerRequest::CreateMessageRequest(r) => InputRequest::CreateMessage(r),
        ServerRequest::ElicitRequest(r) => InputRequest::Elicitation(r),
        ServerRequest::ListRootsRequest(r) => InputRequest::ListRoots(r),
        _ => return Err((ErrorData::invalid_request(format!("{method} can't be asked"), None), "invalid")),
    };
    let (answer, answered) = tokio::sync::oneshot::channel();
    let gone = || (ErrorData::internal_error(format!("{method}: the client could not be asked"), None), "unavailable");
    rounds.send(Round::Ask { request, answer }).await.map_err(|_| gone())?;
    tokio::select! {
        answer = tokio::time::timeout(timeout, answered) => match answer {
            Ok(Ok(value)) => parse(value).map_err(|e| {
                (ErrorData::invalid_params(format!("{method}: the client's answer does not fit: {e}"), None), "client_error")
            }),
            Ok(Err(_)) => Err(gone()),
            Err(_) => Err((ErrorData::internal_error(format!("{method}: the client did not answer in time"), None), "timeout")),
        },
        () = ct.cancelled() => Err((ErrorData::internal_error("cancelled by the server", None), "cancelled")),
    }
}
