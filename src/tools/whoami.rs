//! `whoami`: who the gateway thinks is calling.

use rmcp::handler::server::wrapper::Json;
use rmcp::{tool, tool_router};
use serde::Serialize;

use super::FarmTools;
use super::ToolFailure;
use crate::context::{FlockAccess, McpCallContext};

#[derive(Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct WhoAmI {
    /// Tenant slug.
    pub tenant: String,
    pub tenant_name: String,
    /// The caller's subject (`sub`).
    pub user: String,
    pub display_name: String,
    pub roles: Vec<String>,
    /// "all" for every flock of the tenant, else the assigned flock names (maybe none).
    pub flock_scope: serde_json::Value,
}

#[tool_router(router = whoami_router, vis = "pub(crate)")]
impl FarmTools {
    #[tool(description = "Who is calling: tenant, user, roles, and which flocks the caller may see.")]
    async fn whoami(&self, ctx: McpCallContext) -> Result<Json<WhoAmI>, ToolFailure> {
        let flock_scope = match ctx.flocks() {
            FlockAccess::AllOfTenant => serde_json::json!("all"),
            FlockAccess::Only(_) => {
                let names: Vec<String> = ctx.store()?.list_flocks().await?.into_iter().map(|f| f.name).collect();
                serde_json::json!(names)
            }
        };
        Ok(Json(WhoAmI {
            tenant: ctx.tenant_slug().to_owned(),
            tenant_name: ctx.tenant_name().to_owned(),
            user: ctx.subject().to_owned(),
            display_name: ctx.display_name().to_owned(),
            roles: ctx.roles().iter().map(|r| r.as_str().to_owned()).collect(),
            flock_scope,
        }))
    }
}
