//! The browser's side of an upstream OAuth login: the start link and the callback. Neither
//! needs a bearer token: the start link's secret and the callback's `state` are the
//! credentials, each good once, for the one owner (tenant, server, user) the login was asked
//! for. Pages say what happened in plain text and never echo a code, a token or a secret.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::oauth::LoginError;
use crate::proxy::Upstreams;

/// What the login routes need.
#[derive(Clone)]
pub struct LoginRoute {
    pub upstreams: Arc<Upstreams>,
}

fn page(status: StatusCode, text: impl Into<String>) -> Response {
    let headers = [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::CACHE_CONTROL, "no-store")];
    (status, headers, text.into()).into_response()
}

fn refused(e: &LoginError) -> Response {
    let status = match e {
        LoginError::UnknownLink | LoginError::UnknownState => StatusCode::NOT_FOUND,
        LoginError::Denied(_) | LoginError::NotProtected(_) => StatusCode::BAD_REQUEST,
        LoginError::NoVault => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    page(status, format!("Login failed: {e}\n"))
}

/// `GET /oauth/start/{secret}`: discovers and registers through the server's executor, then
/// redirects to the authorization server.
pub async fn start(State(route): State<LoginRoute>, Path(secret): Path<String>) -> Response {
    match start_inner(&route, &secret).await {
        Ok(url) => {
            let headers = [(header::LOCATION, url.as_str()), (header::CACHE_CONTROL, "no-store")];
            (StatusCode::FOUND, headers).into_response()
        }
        Err(e) => refused(&e),
    }
}

async fn start_inner(route: &LoginRoute, secret: &str) -> Result<String, LoginError> {
    let oauth = route.upstreams.oauth().ok_or(LoginError::NoVault)?;
    if secret.len() > 128 {
        return Err(LoginError::UnknownLink);
    }
    let login = oauth.pending(secret).await?;
    let (server, executor) = route
        .upstreams
        .resolve_one(login.tenant, &login.server)
        .await
        .map_err(|message| LoginError::Server { server: login.server.clone(), message })?;
    oauth.start(&login, &server, &executor).await
}

/// The authorization server's redirect back (RFC 6749 §4.1.2, RFC 9207 `iss`).
#[derive(Deserialize)]
pub struct Callback {
    state: Option<String>,
    code: Option<String>,
    iss: Option<String>,
    error: Option<String>,
}

/// `GET /oauth/callback`: completes the login its `state` names, once.
pub async fn callback(State(route): State<LoginRoute>, Query(callback): Query<Callback>) -> Response {
    let Some(oauth) = route.upstreams.oauth() else { return refused(&LoginError::NoVault) };
    let Some(state) = callback.state.filter(|s| !s.is_empty() && s.len() <= 512) else {
        return page(StatusCode::BAD_REQUEST, "Login failed: the callback has no state.\n");
    };
    if let Some(error) = callback.error {
        // The login is over either way: its state is taken so it can't be completed later.
        let _ = oauth.vault().take_login(&state).await;
        let error: String = error.chars().filter(char::is_ascii_alphanumeric).take(64).collect();
        return refused(&LoginError::Denied(error));
    }
    let Some(code) = callback.code.filter(|c| !c.is_empty() && c.len() <= 4096) else {
        return page(StatusCode::BAD_REQUEST, "Login failed: the callback has no code.\n");
    };
    let upstreams = &route.upstreams;
    let resolve = |tenant, server: String| async move {
        upstreams
            .resolve_one(tenant, &server)
            .await
            .map_err(|message| LoginError::Server { server: server.clone(), message })
    };
    match oauth.complete(&state, &code, callback.iss.as_deref(), resolve).await {
        Ok(owner) => page(
            StatusCode::OK,
            format!("Logged in to `{}`. You can close this page and call its tools again.\n", owner.server),
        ),
        Err(e) => refused(&e),
    }
}
