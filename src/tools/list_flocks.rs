//! `list_flocks`: the flocks the caller may see.

use rmcp::handler::server::wrapper::Json;
use rmcp::{tool, tool_router};
use serde::Serialize;

use super::FarmTools;
use super::ToolFailure;
use crate::context::McpCallContext;
use crate::identity::scoped::Flock;

#[derive(Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct FlockList {
    pub flocks: Vec<Flock>,
}

#[tool_router(router = list_flocks_router, vis = "pub(crate)")]
impl FarmTools {
    #[tool(description = "List the flocks you may see (all of your tenant's, or only those assigned to you).")]
    async fn list_flocks(&self, ctx: McpCallContext) -> Result<Json<FlockList>, ToolFailure> {
        Ok(Json(FlockList { flocks: ctx.store()?.list_flocks().await? }))
    }
}
