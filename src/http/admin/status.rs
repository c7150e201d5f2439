//! What the gateway is doing now, for operators: executor agents (connected, where, last
//! heard, reconnects), a tenant's upstream servers (negotiated revision, last failure, tools
//! listed) and live sessions. Read from this replica's memory and, for where an agent is
//! connected, from the replicas' shared table; never cached.

use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

use crate::admin::{AdminError, Authority, Collection, Need};
use crate::cluster::Cluster;
use crate::executor::agents::Agents;
use crate::identity::SessionRegistry;
use crate::proxy::Upstreams;

/// The registries of the running gateway.
#[derive(Clone)]
pub(crate) struct Runtime {
    pub agents: Arc<Agents>,
    pub upstreams: Arc<Upstreams>,
    pub sessions: Arc<SessionRegistry>,
    pub cluster: Arc<Cluster>,
}

/// An executor and its agent.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ExecutorStatus {
    pub name: String,
    /// `local` or `remote`.
    pub kind: String,
    /// A remote executor's agent is connected to a live replica (a local executor is always
    /// at hand: true).
    pub connected: bool,
    /// The replica its agent is connected to (its internal URL).
    pub replica: Option<String>,
    /// Connected to the replica that answers.
    pub here: bool,
    /// When the agent last connected to the replica that answers (Unix milliseconds).
    pub connected_at: Option<i64>,
    /// When the replica that answers last heard from the agent (heartbeats included).
    pub last_heartbeat: Option<i64>,
    /// How many times the agent connected again to the replica that answers since it started.
    pub reconnects: u64,
}

/// A tenant's bound server and the connections this replica holds to it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ServerStatus {
    pub server: String,
    pub executor: String,
    /// How its upstream definitions are pinned: `approve`, `trust_first_use` or `follow`.
    pub pin: String,
    pub connections: Vec<ConnectionView>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ConnectionView {
    /// The protocol revision negotiated at its last start.
    pub revision: Option<String>,
    /// Its last failure to start, when it has not started since: what happened, in the
    /// gateway's words (the whole error is in the gateway's log)...
    pub last_error: Option<String>,
    /// ...its class (`connect_failed`, `timeout`, `launch_failed`, `login_needed`,
    /// `unauthorized`, `executor_offline`, `executor`, `outside_root`, `declaration`)...
    pub last_error_class: Option<String>,
    /// ...and when.
    pub last_error_at: Option<i64>,
    /// The tools it listed, when its list is held.
    pub tools: Option<usize>,
    pub last_used: i64,
    pub in_flight: usize,
}

/// A tenant's live sessions on the replica that answers.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct SessionCount {
    pub tenant: String,
    pub sessions: usize,
}

fn text(v: &serde_json::Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

pub(crate) async fn executors(api: &super::AdminApi, who: &Authority) -> Result<Vec<ExecutorStatus>, AdminError> {
    who.authorize(Need::Platform)?;
    let runtime = &api.runtime;
    let since = crate::store::now_millis() - 3 * i64::try_from(runtime.cluster.heartbeat().as_millis()).unwrap_or(0);
    let mut out = Vec::new();
    for x in api.admin.list_all(who, &Collection::Executors).await? {
        let name = text(&x["name"]);
        let kind = text(&x["kind"]);
        let local = kind == "local";
        let holders = if local { Vec::new() } else { api.admin.db().agent_holders(&name, since).await? };
        let mine = runtime.agents.status(&name);
        let here = mine.as_ref().is_some_and(|s| s.connected);
        out.push(ExecutorStatus {
            connected: local || here || !holders.is_empty(),
            // Connected here: this replica, whether or not its row in the replicas' table is
            // written yet; else the live replica that holds it.
            replica: if here {
                Some(runtime.cluster.internal_url().to_owned())
            } else {
                holders.first().map(|h| h.internal_url.clone())
            },
            here,
            connected_at: mine.as_ref().map(|s| s.connected_at),
            last_heartbeat: mine.as_ref().and_then(|s| s.last_heard_ms),
            reconnects: mine.as_ref().map_or(0, |s| s.connects.saturating_sub(1)),
            name,
            kind,
        });
    }
    Ok(out)
}

pub(crate) async fn servers(
    api: &super::AdminApi,
    who: &Authority,
    tenant: &str,
) -> Result<Vec<ServerStatus>, AdminError> {
    who.authorize(Need::Manage(tenant))?;
    let bindings = api.admin.list_all(who, &Collection::Bindings { tenant: tenant.to_owned() }).await?;
    let id = {
        let mut conn = api.admin.db().begin_read().await?;
        crate::store::admin::tenant_id_by_slug(&mut conn, tenant).await?
    };
    let held = api.runtime.upstreams.tenant_status(id);
    Ok(bindings
        .iter()
        .map(|b| {
            let server = text(&b["server"]);
            let connections = held
                .iter()
                .filter(|c| c.server == server)
                .map(|c| ConnectionView {
                    revision: c.health.revision.clone(),
                    last_error: c.health.last_error.as_ref().map(|f| f.message.clone()),
                    last_error_class: c.health.last_error.as_ref().map(|f| f.class.to_owned()),
                    last_error_at: c.health.last_error.as_ref().map(|f| f.at),
                    tools: c.tools,
                    last_used: c.last_used_ms,
                    in_flight: c.in_flight,
                })
                .collect();
            ServerStatus { executor: text(&b["executor"]), pin: text(&b["pin"]), server, connections }
        })
        .collect())
}

pub(crate) async fn sessions(api: &super::AdminApi, who: &Authority) -> Result<Vec<SessionCount>, AdminError> {
    who.authorize(Need::Platform)?;
    let counts = api.runtime.sessions.per_tenant();
    let mut conn = api.admin.db().begin_read().await?;
    let tenants: Vec<(crate::store::TenantId, String)> =
        sqlx::query_as("SELECT id, slug FROM tenants WHERE slug <> $1 ORDER BY slug")
            .bind(crate::store::admin::PLATFORM_SLUG)
            .fetch_all(&mut *conn)
            .await?;
    Ok(tenants
        .into_iter()
        .map(|(id, slug)| SessionCount { tenant: slug, sessions: counts.get(&id).copied().unwrap_or(0) })
        .collect())
}
