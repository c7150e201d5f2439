//! The entity model policies are written against, and the Cedar schema of one tenant,
//! generated from what the tenant has: its servers, their tools and those tools' input
//! schemas, the native tools. Owns names; evaluates nothing.
//!
//! - principal `User::"<subject>"`, in `Role::"<role>"` (each role the user holds) and in
//!   `Tenant::"<slug>"`; attributes `subject`, `tenant`, `allFlocks`, `flocks`.
//! - resource `Tool::"<id>"` (id: `server__tool`, whatever the prefix the binding shows, or a
//!   native tool's name), in `Server::"<server>"`; attributes `name`, `server` (upstream tools),
//!   `native`, `title`, `digest` (of the definition served: for a pinned binding, the one an
//!   owner approved), and the four MCP annotations with the specification's defaults applied
//!   (`readOnlyHint` false, `destructiveHint` true, `idempotentHint` false, `openWorldHint` true).
//! - actions: `call_tool`, `get_prompt`, `read_resource`, `complete`; and one action per tool,
//!   `Action::"<tool id>"`, member of `call_tool`, whose context types `arguments` from the
//!   tool's `inputSchema`. The group itself types `arguments` as an empty record: a condition on
//!   an argument names the tool's own action.
//! - context: `arguments`, `revision`, `client` (when the client declared a name),
//!   `stateless`, `time` (a Cedar `datetime`, UTC).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::arguments::{Fields, record_schema};

pub const CALL_TOOL: &str = "call_tool";
pub const GET_PROMPT: &str = "get_prompt";
pub const READ_RESOURCE: &str = "read_resource";
pub const COMPLETE: &str = "complete";
/// The actions every schema has. A native tool may not take one of these names.
pub const GROUP_ACTIONS: [&str; 4] = [CALL_TOOL, GET_PROMPT, READ_RESOURCE, COMPLETE];

pub const USER: &str = "User";
pub const ROLE: &str = "Role";
pub const TENANT: &str = "Tenant";
pub const SERVER: &str = "Server";
pub const TOOL: &str = "Tool";
pub const PROMPT: &str = "Prompt";
pub const RESOURCE: &str = "Resource";

/// A tool's MCP annotations, with the specification's defaults where the tool is silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

impl Default for Hints {
    fn default() -> Self {
        Self { read_only: false, destructive: true, idempotent: false, open_world: true }
    }
}

impl Hints {
    pub fn of(annotations: Option<&rmcp::model::ToolAnnotations>) -> Self {
        let d = Self::default();
        let Some(a) = annotations else { return d };
        Self {
            read_only: a.read_only_hint.unwrap_or(d.read_only),
            destructive: a.destructive_hint.unwrap_or(d.destructive),
            idempotent: a.idempotent_hint.unwrap_or(d.idempotent),
            open_world: a.open_world_hint.unwrap_or(d.open_world),
        }
    }
}

/// One tool as policies see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFacts {
    /// The `Tool` entity's id and its action's id.
    pub id: String,
    /// The tool's own name (upstream: before the gateway's prefix).
    pub name: String,
    /// The server it comes from; `None` for a native tool.
    pub server: Option<String>,
    pub title: Option<String>,
    pub hints: Hints,
    /// Its arguments, typed from its `inputSchema`.
    pub arguments: Fields,
    /// A native tool's own role list (its ceiling); `None` for an upstream tool.
    pub roles: Option<Vec<crate::model::Role>>,
    /// The digest of the definition served (an upstream tool of a pinned binding: the approved
    /// one), `sha256:` and hex: a policy can require the definition it was written against.
    pub digest: String,
}

impl ToolFacts {
    /// An upstream tool of `server`.
    pub fn upstream(server: &str, tool: &rmcp::model::Tool) -> Self {
        Self {
            id: format!("{server}{}{}", crate::vocab::names::NAME_SEPARATOR, tool.name),
            name: tool.name.to_string(),
            server: Some(server.to_owned()),
            title: tool.title.clone(),
            hints: Hints::of(tool.annotations.as_ref()),
            arguments: super::arguments::arguments_type(&tool.input_schema),
            roles: None,
            digest: crate::vocab::digest::definition_digest(tool).1,
        }
    }

    /// A native tool, which `roles` may use.
    pub fn native(tool: &rmcp::model::Tool, roles: &[crate::model::Role]) -> Self {
        Self {
            id: tool.name.to_string(),
            name: tool.name.to_string(),
            server: None,
            title: tool.title.clone(),
            hints: Hints::of(tool.annotations.as_ref()),
            arguments: super::arguments::arguments_type(&tool.input_schema),
            roles: Some(roles.to_vec()),
            digest: crate::vocab::digest::definition_digest(tool).1,
        }
    }
}

/// What one tenant's schema is generated from.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    pub tenant: String,
    /// Every server the tenant bound (listed tools or not).
    pub servers: BTreeSet<String>,
    pub tools: Vec<ToolFacts>,
    /// The token claims policies read (`auth.policy_claims`): `principal.claims.<name>`.
    pub claims: Vec<String>,
}

/// Roles, as `Role` entity ids.
fn role_names() -> Vec<&'static str> {
    crate::model::Role::ALL.iter().map(|r| r.as_str()).collect()
}

/// The Cedar schema (JSON form) of `catalogue`'s tenant; `None`: the schema platform
/// policies are written against (any tenant, any server, no tool's arguments). `claims`: the
/// token claims policies read.
pub fn schema_json(catalogue: Option<&Catalogue>, claims: &[String]) -> Value {
    let tenant = match catalogue {
        Some(c) => json!({"enum": [c.tenant]}),
        None => json!({}),
    };
    let server = match catalogue {
        Some(c) if !c.servers.is_empty() => json!({"enum": c.servers.iter().collect::<Vec<_>>()}),
        _ => json!({}),
    };
    let string = || json!({"type": "String"});
    let boolean = || json!({"type": "Boolean"});
    let optional = |mut v: Value| {
        v["required"] = Value::Bool(false);
        v
    };
    let entity_types = json!({
        TENANT: tenant,
        ROLE: {"enum": role_names()},
        SERVER: server,
        USER: {
            "memberOfTypes": [ROLE, TENANT],
            "shape": {"type": "Record", "attributes": {
                "subject": string(),
                "tenant": string(),
                "allFlocks": boolean(),
                "flocks": {"type": "Set", "element": string()},
                "claims": {"type": "Record", "attributes": claims
                    .iter()
                    .map(|name| (name.clone(), optional(string())))
                    .collect::<Map<String, Value>>()},
            }},
        },
        TOOL: {
            "memberOfTypes": [SERVER],
            "shape": {"type": "Record", "attributes": {
                "name": string(),
                "server": optional(string()),
                "title": optional(string()),
                "digest": string(),
                "native": boolean(),
                "readOnlyHint": boolean(),
                "destructiveHint": boolean(),
                "idempotentHint": boolean(),
                "openWorldHint": boolean(),
            }},
        },
        PROMPT: {
            "memberOfTypes": [SERVER],
            "shape": {"type": "Record", "attributes": {"name": string(), "server": string()}},
        },
        RESOURCE: {
            "memberOfTypes": [SERVER],
            "shape": {"type": "Record", "attributes": {"uri": string(), "server": string()}},
        },
    });
    let context = |arguments: Value| {
        json!({"type": "Record", "attributes": {
            "arguments": arguments,
            "revision": string(),
            "client": optional(string()),
            "stateless": boolean(),
            "time": {"type": "Extension", "name": "datetime"},
        }})
    };
    let applies = |resources: &[&str], arguments: Value| json!({"appliesTo": {"principalTypes": [USER], "resourceTypes": resources, "context": context(arguments)}});
    let no_arguments = || record_schema(&Fields::new());
    let mut actions = Map::new();
    actions.insert(CALL_TOOL.into(), applies(&[TOOL], no_arguments()));
    actions.insert(GET_PROMPT.into(), applies(&[PROMPT], no_arguments()));
    actions.insert(READ_RESOURCE.into(), applies(&[RESOURCE], no_arguments()));
    actions.insert(COMPLETE.into(), applies(&[PROMPT, RESOURCE], no_arguments()));
    for tool in catalogue.map(|c| c.tools.as_slice()).unwrap_or_default() {
        if GROUP_ACTIONS.contains(&tool.id.as_str()) {
            continue;
        }
        let mut action = applies(&[TOOL], record_schema(&tool.arguments));
        action["memberOf"] = json!([{"id": CALL_TOOL}]);
        actions.insert(tool.id.clone(), action);
    }
    json!({"": {"entityTypes": entity_types, "actions": actions}})
}

/// The catalogue of `slug`: its bound servers, the tools recorded for them, the native tools.
pub fn catalogue(
    slug: &str,
    native: &[ToolFacts],
    servers: Vec<String>,
    recorded: &[(String, String)],
    claims: &[String],
) -> Catalogue {
    let mut tools: Vec<ToolFacts> = native.to_vec();
    for (server, json) in recorded {
        if !servers.contains(server) {
            continue;
        }
        match serde_json::from_str::<Vec<rmcp::model::Tool>>(json) {
            Ok(listed) => tools.extend(listed.iter().map(|t| ToolFacts::upstream(server, t))),
            Err(e) => {
                tracing::warn!(%server, error = %e, "a recorded tool list does not read; its tools are unknown to policies")
            }
        }
    }
    Catalogue { tenant: slug.to_owned(), servers: servers.into_iter().collect(), tools, claims: claims.to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generated_schema_is_a_cedar_schema() {
        cedar_policy::Schema::from_json_value(schema_json(None, &["region".to_owned()])).expect("the platform schema");
        let tool = |id: &str, arguments| ToolFacts {
            id: id.into(),
            name: id.into(),
            server: Some("fx".into()),
            title: None,
            hints: Hints::default(),
            arguments,
            roles: None,
            digest: format!("sha256:{id}"),
        };
        let typed = super::super::arguments::arguments_type(
            json!({"type": "object", "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}}})
                .as_object()
                .unwrap(),
        );
        let catalogue = Catalogue {
            tenant: "acme".into(),
            servers: ["fx".to_owned()].into(),
            tools: vec![tool("fx__refund", typed), tool("fx__ping", Fields::new())],
            claims: Vec::new(),
        };
        cedar_policy::Schema::from_json_value(schema_json(Some(&catalogue), &[])).expect("a tenant's schema");
        let empty = Catalogue { tenant: "acme".into(), ..Catalogue::default() };
        cedar_policy::Schema::from_json_value(schema_json(Some(&empty), &[])).expect("a tenant without servers");
    }
}
