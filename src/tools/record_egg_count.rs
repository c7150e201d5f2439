//! `record_egg_count`: record (or correct) the eggs one flock laid on one day. Workers
//! only for their assigned flocks; owners and managers for any flock of the tenant.

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{tool, tool_router};
use serde::Deserialize;
use time::Duration;

use super::FarmTools;
use super::{ToolFailure, parse_day, today};
use crate::context::McpCallContext;
use crate::identity::scoped::{EggCount, FlockKey};

/// Most eggs one record may hold: far beyond any real barn, small enough to catch typos.
const MAX_EGGS: i64 = 1_000_000;

#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub struct RecordEggCount {
    /// The flock's name or id.
    pub flock: String,
    /// The day the eggs were laid, YYYY-MM-DD; not in the future, at most a year ago.
    pub day: String,
    /// Eggs collected that day (0 to 1,000,000).
    pub eggs: i64,
}

#[tool_router(router = record_egg_count_router, vis = "pub(crate)")]
impl FarmTools {
    #[tool(description = "Record the number of eggs a flock laid on a day (replaces an earlier count for that day).")]
    async fn record_egg_count(
        &self,
        ctx: McpCallContext,
        Parameters(args): Parameters<RecordEggCount>,
    ) -> Result<Json<EggCount>, ToolFailure> {
        let day = parse_day("day", &args.day)?;
        let today = today();
        if day > today {
            return Err(ToolFailure::invalid("day", "must not be in the future"));
        }
        if day < today - Duration::days(366) {
            return Err(ToolFailure::invalid("day", "must be within the last year"));
        }
        if !(0..=MAX_EGGS).contains(&args.eggs) {
            return Err(ToolFailure::invalid("eggs", format!("must be 0 to {MAX_EGGS}")));
        }
        let recorded = ctx.store()?.record_egg_count(&FlockKey::parse(&args.flock), day, args.eggs).await?;
        Ok(Json(recorded))
    }
}
