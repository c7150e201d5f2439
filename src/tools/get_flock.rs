//! `get_flock`: one flock by name or id.

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{tool, tool_router};
use serde::Deserialize;

use super::FarmTools;
use super::ToolFailure;
use crate::context::McpCallContext;
use crate::identity::scoped::{Flock, FlockKey};

#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub struct GetFlock {
    /// The flock's name (e.g. "north-barn") or id.
    pub flock: String,
}

#[tool_router(router = get_flock_router, vis = "pub(crate)")]
impl FarmTools {
    #[tool(description = "Get one flock by name or id. A flock you may not see is reported as not found.")]
    async fn get_flock(
        &self,
        ctx: McpCallContext,
        Parameters(args): Parameters<GetFlock>,
    ) -> Result<Json<Flock>, ToolFailure> {
        ctx.store()?
            .find_flock(&FlockKey::parse(&args.flock))
            .await?
            .map(Json)
            .ok_or(ToolFailure::NotFound("flock not found"))
    }
}
