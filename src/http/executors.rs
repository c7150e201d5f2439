//! `GET /executors/connect`: where executor agents dial in. Authenticates the agent (its
//! executor's name and secret), applies the one-agent-per-name rule, upgrades to a WebSocket
//! and hands the tunnel to the agent registry. Never opens a server (the remote host handler
//! does), and never says which part of a failed authentication was wrong.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use http::{StatusCode, header};

use crate::decl::PathUri;
use crate::executor::remote::Agents;
use crate::store::Db;
use crate::store::entities::{AgentAuthError, executor_secret_hash};
use crate::telemetry::metrics;
use crate::tunnel::{self, EXECUTOR_HEADER, ROOT_HEADER, Side};

/// What the connect route needs.
#[derive(Clone)]
pub struct ExecutorRoute {
    pub db: Db,
    pub agents: Arc<Agents>,
    pub settings: tunnel::Settings,
}

fn refuse(status: StatusCode, reason: &'static str, message: &str) -> Response {
    metrics::executor_refused(reason);
    crate::error_body::json_error(status, reason, message)
}

/// A failed authentication, whatever failed: an unknown name, a local executor's name and a
/// wrong secret get the same answer, so the route tells no one which executors exist. The
/// metric and the log keep the reason.
fn refuse_authentication(reason: &'static str) -> Response {
    metrics::executor_refused(reason);
    crate::error_body::json_error(StatusCode::UNAUTHORIZED, "unauthorized", "executor authentication failed")
}

pub(super) fn header_text<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// The root an agent reports, in its own convention (see [`PathUri::parse_reported`]).
fn parse_root(text: &str) -> Option<PathUri> {
    PathUri::parse_reported(text)
}

pub async fn connect(State(route): State<ExecutorRoute>, mut request: Request) -> Response {
    let name = header_text(&request, EXECUTOR_HEADER).map(str::to_owned);
    let secret = header_text(&request, header::AUTHORIZATION.as_str())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|s| s.trim().to_owned());
    let (Some(name), Some(secret)) = (name, secret) else {
        return refuse(StatusCode::UNAUTHORIZED, "bad_request", "an executor agent presents its name and its secret");
    };
    let Some(root) = header_text(&request, ROOT_HEADER).and_then(parse_root) else {
        return refuse(StatusCode::BAD_REQUEST, "bad_request", "the agent's root must be an absolute file: URI");
    };
    let executor = match route.db.authenticate_executor(&name, &secret).await {
        Ok(Ok(executor)) => executor,
        Ok(Err(why)) => {
            let reason = match why {
                AgentAuthError::Unknown => "unknown",
                AgentAuthError::NotRemote => "not_remote",
                AgentAuthError::WrongSecret => "wrong_secret",
            };
            tracing::warn!(executor = %name, reason, "executor agent refused");
            return refuse_authentication(reason);
        }
        Err(e) => {
            tracing::error!(error = %e, "executor authentication: the database is unavailable");
            return refuse(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "try again later");
        }
    };
    let (response, upgrading) = match tunnel::accept_upgrade(&mut request, &route.settings) {
        Ok(accepted) => accepted,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, "bad_request", &why),
    };
    let reservation = match route.agents.reserve(executor, root, executor_secret_hash(&secret)) {
        Ok(reservation) => reservation,
        Err(e) => {
            tracing::warn!(executor = %name, "a second agent for a connected executor refused");
            return refuse(StatusCode::CONFLICT, "name_in_use", &e.to_string());
        }
    };
    let settings = route.settings.clone();
    tokio::spawn(async move {
        match upgrading.ready().await {
            Ok(ws) => {
                let (handle, _incoming) = tunnel::start(ws, Side::Gateway, settings);
                reservation.live(handle).await;
            }
            Err(e) => tracing::warn!(executor = %name, error = %e, "executor agent upgrade failed"),
        }
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decl::PathStyle;

    #[test]
    fn an_agent_root_is_read_in_its_own_convention() {
        let posix = parse_root("file:///srv/mcp").unwrap();
        assert_eq!((posix.style(), posix.to_native()), (PathStyle::Posix, "/srv/mcp".to_owned()));
        let windows = parse_root("file:///C:/mcp").unwrap();
        assert_eq!((windows.style(), windows.to_native()), (PathStyle::Windows, "C:\\mcp".to_owned()));
        assert_eq!(parse_root("file://server/share/mcp").unwrap().style(), PathStyle::Windows);
        for bad in ["/srv/mcp", "srv/mcp", "http://x/y", "file:relative", ""] {
            assert!(parse_root(bad).is_none(), "{bad}");
        }
    }
}
