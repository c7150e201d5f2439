//! Cedar policies over the caller, the tool and its arguments: the entity model and each
//! tenant's generated schema (`model`), the arguments typed from a tool's input schema
//! (`arguments`), and compiled policy sets that decide calls and listings (`engine`). Reads
//! no database and calls no upstream: callers hand it what it decides on.
//!
//! How a decision combines with what came before policies: a grant is a permit (shown as Cedar
//! by [`grant_text`]), a native tool's role list is a ceiling no policy widens, default deny,
//! and a satisfied forbid (the tenant's or the platform's) refuses whatever permits.

pub mod arguments;
pub mod engine;
pub mod model;

pub use engine::{
    Caller, Circumstances, Decision, Item, ItemAction, Mode, Outcome, Problem, Reason, Source, TenantPolicies,
};
pub use model::{Catalogue, Hints, ToolFacts};

use crate::store::entities::GrantKind;

/// What allows a native tool's call before policies: its own role list (named so in decisions).
pub const NATIVE_ROLES: &str = "tool-roles";

/// A string as a Cedar string literal.
fn literal(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

fn decision_json(decision: &Decision) -> serde_json::Value {
    let mut json = serde_json::json!({
        "decision": if decision.allow { "allow" } else { "deny" },
        "reason": decision.reason.label(),
        "policies": decision.by,
    });
    match &decision.reason {
        Reason::PolicyError(why) => json["detail"] = why.clone().into(),
        Reason::ArgumentsInvalid(mismatch) => json["detail"] = mismatch.to_string().into(),
        Reason::Permit | Reason::Forbid | Reason::NoPermit => {}
    }
    json
}

/// What the audit records of a decision policies took part in: canonical JSON with the
/// decision, its reason, the deciding policy ids, and a log-only tenant's own decision.
pub fn audit_text(outcome: &Outcome) -> String {
    let mut json = decision_json(&outcome.decision);
    if let Some(shadow) = &outcome.log_only {
        json["log_only"] = decision_json(shadow);
    }
    crate::vocab::digest::canonical_json(&json)
}

/// The id under which a grant takes part in decisions.
pub fn grant_policy_id(grant_id: &str) -> String {
    format!("grant/{grant_id}")
}

/// A grant as the Cedar permit policy it is (with its `@confirm`, when it asks for one).
pub fn grant_text(
    server: &str,
    role: &str,
    kind: GrantKind,
    name: &str,
    confirm: Option<crate::model::Confirm>,
) -> String {
    let text = grant_permit(server, role, kind, name);
    match confirm {
        Some(confirm) => format!("@{}(\"{}\")\n{text}", engine::CONFIRM_ANNOTATION, confirm.as_str()),
        None => text,
    }
}

fn grant_permit(server: &str, role: &str, kind: GrantKind, name: &str) -> String {
    let principal = format!("principal in {}::{}", model::ROLE, literal(role));
    let in_server = format!("resource in {}::{}", model::SERVER, literal(server));
    // `complete` applies to prompts and resources alike: a grant names which it covers.
    let is_in_server = |kind: &str| format!("resource is {kind} in {}::{}", model::SERVER, literal(server));
    let id = |name: &str| literal(&format!("{server}{}{name}", crate::vocab::names::NAME_SEPARATOR));
    match (kind, name) {
        (GrantKind::Tool, "*") => {
            format!("permit ({principal}, action in Action::\"{}\", {in_server});", model::CALL_TOOL)
        }
        (GrantKind::Tool, name) => {
            format!(
                "permit ({principal}, action in Action::\"{}\", resource == {}::{});",
                model::CALL_TOOL,
                model::TOOL,
                id(name)
            )
        }
        (GrantKind::Prompt, "*") => format!(
            "permit ({principal}, action in [Action::\"{}\", Action::\"{}\"], {});",
            model::GET_PROMPT,
            model::COMPLETE,
            is_in_server(model::PROMPT)
        ),
        (GrantKind::Prompt, name) => format!(
            "permit ({principal}, action in [Action::\"{}\", Action::\"{}\"], resource == {}::{});",
            model::GET_PROMPT,
            model::COMPLETE,
            model::PROMPT,
            id(name)
        ),
        (GrantKind::Resource, name) => {
            let actions = format!("action in [Action::\"{}\", Action::\"{}\"]", model::READ_RESOURCE, model::COMPLETE);
            let in_server = is_in_server(model::RESOURCE);
            match name {
                "*" => format!("permit ({principal}, {actions}, {in_server});"),
                prefix if prefix.ends_with('*') => {
                    // `like` reads `*` as a wildcard: the prefix's own stars are escaped.
                    let escaped = literal(&prefix[..prefix.len() - 1]).replace('*', "\\*");
                    let pattern = format!("{}*\"", &escaped[..escaped.len() - 1]);
                    format!("permit ({principal}, {actions}, {in_server}) when {{ resource.uri like {pattern} }};")
                }
                uri => {
                    format!("permit ({principal}, {actions}, {in_server}) when {{ resource.uri == {} }};", literal(uri))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
