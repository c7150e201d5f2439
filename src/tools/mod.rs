//! The native tools (the farm reference set), one file each. A tool reaches the caller and
//! the data only through `McpCallContext`; it never names a pool, a request or an identity.

mod get_flock;
mod list_flocks;
mod query_egg_counts;
mod recent_audit_events;
mod record_egg_count;
mod whoami;

use rmcp::ErrorData;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject, MetaObject};
use serde_json::json;
use time::Date;
use time::macros::format_description;

use crate::model::Role;
use crate::store::StoreError;

const EVERYONE: &[Role] = &[Role::Owner, Role::Manager, Role::Worker, Role::Auditor];

/// A native tool's entry in the registry: who may use it, and how its arguments are
/// checked before it runs (so a type error names the field).
#[derive(Clone)]
pub struct ToolSpec {
    pub name: &'static str,
    pub roles: &'static [Role],
    pub validate: fn(&JsonObject) -> Result<(), ToolFailure>,
}

/// The one authorization table behind both `tools/list` and `tools/call`. A tool missing
/// here is never listed and never runs.
pub const TOOLS: &[ToolSpec] = &[
    ToolSpec { name: "whoami", roles: EVERYONE, validate: arguments::<NoArguments> },
    ToolSpec { name: "list_flocks", roles: EVERYONE, validate: arguments::<NoArguments> },
    ToolSpec { name: "get_flock", roles: EVERYONE, validate: arguments::<get_flock::GetFlock> },
    ToolSpec { name: "query_egg_counts", roles: EVERYONE, validate: arguments::<query_egg_counts::QueryEggCounts> },
    ToolSpec {
        name: "record_egg_count",
        roles: &[Role::Owner, Role::Manager, Role::Worker],
        validate: arguments::<record_egg_count::RecordEggCount>,
    },
    ToolSpec {
        name: "recent_audit_events",
        roles: &[Role::Owner, Role::Auditor],
        validate: arguments::<recent_audit_events::RecentAuditEvents>,
    },
];

pub fn spec(name: &str) -> Option<&'static ToolSpec> {
    TOOLS.iter().find(|t| t.name == name)
}

/// Tools without parameters accept no arguments.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArguments {}

/// Deserializes the arguments as `T` would be, reporting the path of the first bad field.
/// The argument check of a [`ToolSpec`]: `validate: arguments::<MyParams>`.
pub fn arguments<T: serde::de::DeserializeOwned>(args: &JsonObject) -> Result<(), ToolFailure> {
    // Straight from the borrowed map: a copy of the arguments would cost as much as the body.
    serde_path_to_error::deserialize::<_, T>(args).map(|_| ()).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "arguments".to_owned() } else { path };
        ToolFailure::Invalid { field, message: e.into_inner().to_string() }
    })
}

/// The native tools. Deliberately empty: a tool method's receiver reaches nothing, so the
/// only way to the caller and the data is the `McpCallContext` parameter (the guard walks
/// receivers too; a struct holding the database here would fail the build).
#[derive(Debug, Clone, Copy, Default)]
pub struct FarmTools;

/// The native tool router.
pub(crate) fn router() -> ToolRouter<FarmTools> {
    FarmTools::whoami_router()
        + FarmTools::list_flocks_router()
        + FarmTools::get_flock_router()
        + FarmTools::query_egg_counts_router()
        + FarmTools::record_egg_count_router()
        + FarmTools::recent_audit_events_router()
}

pub use crate::vocab::text::{ERROR_CLASS_META, error_class};

/// Why a tool call failed. Bad input and missing things go back to the caller as a tool
/// error (`isError: true`, the message as text, the error class in `_meta`); internal
/// failures are logged and become an opaque JSON-RPC internal error.
#[derive(Debug)]
pub enum ToolFailure {
    Invalid { field: String, message: String },
    NotFound(&'static str),
    Internal(String),
}

impl ToolFailure {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid { field: field.to_owned(), message: message.into() }
    }
}

impl From<StoreError> for ToolFailure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(_) => ToolFailure::NotFound("flock not found"),
            StoreError::Invalid { field, message } => ToolFailure::Invalid { field: field.to_owned(), message },
            other => ToolFailure::Internal(other.to_string()),
        }
    }
}

impl From<crate::identity::ContextError> for ToolFailure {
    fn from(e: crate::identity::ContextError) -> Self {
        ToolFailure::Internal(e.to_string())
    }
}

impl IntoCallToolResult for ToolFailure {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        let (class, message) = match self {
            ToolFailure::Invalid { field, message } => {
                ("invalid_argument", format!("invalid argument `{field}`: {message}"))
            }
            ToolFailure::NotFound(what) => ("not_found", what.to_owned()),
            ToolFailure::Internal(cause) => {
                tracing::error!(%cause, "tool failed");
                return Err(ErrorData::internal_error("internal error", None));
            }
        };
        // No structured content: it would have to match the tool's declared output schema
        // (clients that validate it, like the TypeScript SDK's, reject the whole result
        // otherwise), and an error is not the tool's output. The class rides in `_meta`,
        // which no schema covers, for the audit and for clients that want it.
        let mut result = CallToolResult::error(vec![ContentBlock::text(message)]);
        result.meta = Some(MetaObject(JsonObject::from_iter([(ERROR_CLASS_META.to_owned(), json!(class))])));
        Ok(result.into())
    }
}

/// Parses an ISO date (YYYY-MM-DD).
pub(crate) fn parse_day(field: &'static str, text: &str) -> Result<Date, ToolFailure> {
    Date::parse(text, format_description!("[year]-[month]-[day]"))
        .map_err(|_| ToolFailure::invalid(field, format!("`{text}` is not a date (YYYY-MM-DD)")))
}

pub(crate) fn today() -> Date {
    time::OffsetDateTime::now_utc().date()
}
