//! `GET /internal/agent-link`: where another replica dials in to reach an executor agent
//! connected to this one. Checks that the caller is one of the database's replicas (its
//! authorization, see `cluster::link`) and that the agent is connected here, then upgrades to
//! a WebSocket and carries the caller's channels to the agent (`executor::link`). Refusals say
//! only that the link was refused; the reason goes to the log.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;

use super::executors::header_text;
use crate::cluster::{Cluster, REPLICA_HEADER};
use crate::executor::link;
use crate::executor::remote::Agents;
use crate::tunnel::{self, EXECUTOR_HEADER};

/// What the link route needs.
#[derive(Clone)]
pub struct LinkRoute {
    pub cluster: Arc<Cluster>,
    pub agents: Arc<Agents>,
    pub settings: tunnel::Settings,
}

pub async fn agent_link(State(route): State<LinkRoute>, mut request: Request) -> Response {
    let (Some(executor), Some(presented)) =
        (header_text(&request, EXECUTOR_HEADER), header_text(&request, REPLICA_HEADER))
    else {
        return crate::error_body::json_error(StatusCode::UNAUTHORIZED, "unauthorized", "not a replica link");
    };
    let executor = executor.to_owned();
    if let Err(why) = route.cluster.check_link(presented, &link::purpose(&executor)) {
        tracing::warn!(executor = %executor, reason = %why, "a replica link refused");
        return crate::error_body::json_error(StatusCode::UNAUTHORIZED, "unauthorized", "not a replica link");
    }
    if route.agents.link(&executor).is_none() {
        return crate::error_body::json_error(
            StatusCode::NOT_FOUND,
            "not_connected",
            "the executor's agent is not connected to this replica",
        );
    }
    let (response, upgrading) = match tunnel::accept_upgrade(&mut request, &route.settings) {
        Ok(accepted) => accepted,
        Err(why) => return crate::error_body::json_error(StatusCode::BAD_REQUEST, "bad_request", &why),
    };
    let (agents, settings) = (Arc::clone(&route.agents), route.settings.clone());
    tokio::spawn(async move {
        match upgrading.ready().await {
            Ok(ws) => link::serve(agents, executor, ws, settings).await,
            Err(e) => tracing::warn!(executor = %executor, error = %e, "a replica link's upgrade failed"),
        }
    });
    response
}
