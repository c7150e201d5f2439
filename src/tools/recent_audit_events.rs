//! `recent_audit_events`: the tenant's newest audit events (owners and auditors only).

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{tool, tool_router};
use serde::{Deserialize, Serialize};

use super::FarmTools;
use super::ToolFailure;
use crate::context::McpCallContext;
use crate::identity::scoped::AuditEntry;

#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub struct RecentAuditEvents {
    /// How many events, newest first (1 to 200; default 20).
    #[serde(default)]
    pub limit: Option<i64>,
}

#[derive(Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct AuditList {
    pub events: Vec<AuditEntry>,
}

#[tool_router(router = recent_audit_events_router, vis = "pub(crate)")]
impl FarmTools {
    #[tool(description = "The newest audit events of your tenant: who called which tool, when, and how it ended.")]
    async fn recent_audit_events(
        &self,
        ctx: McpCallContext,
        Parameters(args): Parameters<RecentAuditEvents>,
    ) -> Result<Json<AuditList>, ToolFailure> {
        let limit = args.limit.unwrap_or(20);
        if !(1..=200).contains(&limit) {
            return Err(ToolFailure::invalid("limit", "must be 1 to 200"));
        }
        Ok(Json(AuditList { events: ctx.store()?.recent_audit_events(limit).await? }))
    }
}
