//! Liveness and readiness. `/readyz` is ready only after start-up finished, the identity
//! provider's keys are held (when tokens come from one), the database answers and the newest
//! migration is applied.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::AppState;
use crate::error_body::json_error;

pub(crate) async fn healthz() -> Response {
    (StatusCode::OK, "ok").into_response()
}

pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    if !state.ready.load(Ordering::Acquire) {
        return json_error(StatusCode::SERVICE_UNAVAILABLE, "not_ready", "starting");
    }
    if !state.gate.authenticator.keys_ready() {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the identity provider's keys have not been fetched yet",
        );
    }
    if !state.db.is_ready().await {
        return json_error(StatusCode::SERVICE_UNAVAILABLE, "not_ready", "database unreachable or not migrated");
    }
    (StatusCode::OK, "ready").into_response()
}
