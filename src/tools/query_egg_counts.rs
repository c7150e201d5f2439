//! `query_egg_counts`: egg counts over a date range, per day and per flock, with totals.

use std::collections::BTreeMap;

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{tool, tool_router};
use serde::{Deserialize, Serialize};

use super::FarmTools;
use super::{ToolFailure, parse_day};
use crate::context::McpCallContext;
use crate::identity::scoped::{EggCount, FlockKey};

/// Longest range one query may span.
const MAX_DAYS: i64 = 366;

#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub struct QueryEggCounts {
    /// First day, YYYY-MM-DD (inclusive).
    pub from: String,
    /// Last day, YYYY-MM-DD (inclusive); at most 366 days after `from`.
    pub to: String,
    /// Only this flock (name or id); all flocks you may see when absent.
    #[serde(default)]
    pub flock: Option<String>,
}

#[derive(Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct FlockTotal {
    pub flock: String,
    pub days: i64,
    pub eggs: i64,
}

#[derive(Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct EggReport {
    pub from: String,
    pub to: String,
    pub counts: Vec<EggCount>,
    pub per_flock: Vec<FlockTotal>,
    pub total_eggs: i64,
}

#[tool_router(router = query_egg_counts_router, vis = "pub(crate)")]
impl FarmTools {
    #[tool(description = "Egg counts between two dates (inclusive), per day and per flock, with totals.")]
    async fn query_egg_counts(
        &self,
        ctx: McpCallContext,
        Parameters(args): Parameters<QueryEggCounts>,
    ) -> Result<Json<EggReport>, ToolFailure> {
        let from = parse_day("from", &args.from)?;
        let to = parse_day("to", &args.to)?;
        if to < from {
            return Err(ToolFailure::invalid("to", "must not be before `from`"));
        }
        if (to - from).whole_days() >= MAX_DAYS {
            return Err(ToolFailure::invalid("to", format!("the range may span at most {MAX_DAYS} days")));
        }
        let key = args.flock.as_deref().map(FlockKey::parse);
        let counts = ctx.store()?.egg_counts(key.as_ref(), from, to).await?;
        let mut totals: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for c in &counts {
            let t = totals.entry(c.flock.as_str()).or_default();
            t.0 += 1;
            t.1 += c.eggs;
        }
        let per_flock: Vec<FlockTotal> = totals
            .into_iter()
            .map(|(flock, (days, eggs))| FlockTotal { flock: flock.to_owned(), days, eggs })
            .collect();
        let total_eggs = per_flock.iter().map(|t| t.eggs).sum();
        Ok(Json(EggReport { from: from.to_string(), to: to.to_string(), counts, per_flock, total_eggs }))
    }
}
