//! One request's questions to its tenant's policies: the caller and the circumstances, taken
//! once from the call's context and asked for each tool the request lists or calls.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::identity::{FlockAccess, McpCallContext};
use crate::model::Role;
use crate::policy::ToolFacts;
use crate::policy::engine::{Base, Caller, Circumstances, Outcome, TenantPolicies};

/// The caller of one request and its circumstances, with the tenant's policies.
pub struct Ask {
    policies: Arc<TenantPolicies>,
    tenant: String,
    subject: String,
    roles: Vec<Role>,
    flocks: Option<Vec<String>>,
    claims: Vec<(String, String)>,
    revision: String,
    client: Option<String>,
    stateless: bool,
    now: time::OffsetDateTime,
}

impl Ask {
    /// The questions of `ctx`'s caller, on a request of `revision` from `client` (its declared
    /// name, if any).
    pub fn new(policies: Arc<TenantPolicies>, ctx: &McpCallContext, revision: &str, client: Option<&str>) -> Self {
        let flocks = match ctx.flocks() {
            FlockAccess::AllOfTenant => None,
            FlockAccess::Only(ids) => Some(ids.iter().map(ToString::to_string).collect()),
        };
        Self {
            policies,
            tenant: ctx.tenant_slug().to_owned(),
            subject: ctx.subject().to_owned(),
            roles: ctx.roles().to_vec(),
            flocks,
            claims: ctx.policy_claims().to_vec(),
            revision: revision.to_owned(),
            client: client.map(str::to_owned),
            stateless: ctx.session_id().is_none(),
            now: time::OffsetDateTime::now_utc(),
        }
    }

    /// The questions of a tenant with no policy loaded (`policies.is_empty()`): grants alone
    /// decide, so nothing of the caller is copied (the hot path of most tenants).
    pub fn grants_only_for(policies: Arc<TenantPolicies>) -> Self {
        debug_assert!(policies.is_empty());
        Self {
            policies,
            tenant: String::new(),
            subject: String::new(),
            roles: Vec::new(),
            flocks: None,
            claims: Vec::new(),
            revision: String::new(),
            client: None,
            stateless: false,
            now: time::OffsetDateTime::UNIX_EPOCH,
        }
    }

    /// Whether no policy is loaded for the tenant: grants alone decide.
    pub fn grants_only(&self) -> bool {
        self.policies.is_empty()
    }

    fn caller(&self) -> Caller<'_> {
        Caller {
            tenant: &self.tenant,
            subject: &self.subject,
            roles: &self.roles,
            flocks: self.flocks.as_deref(),
            claims: &self.claims,
        }
    }

    fn circumstances(&self) -> Circumstances<'_> {
        Circumstances {
            revision: &self.revision,
            client: self.client.as_deref(),
            stateless: self.stateless,
            now: self.now,
        }
    }

    /// The decision for calling `tool` with `arguments`; `base`: what allows it without policies.
    pub fn call(&self, tool: &ToolFacts, base: Base<'_>, arguments: Option<&Map<String, Value>>) -> Outcome {
        self.policies.decide_call(&self.caller(), tool, base, arguments, &self.circumstances())
    }

    /// Whether `tool` is listed.
    pub fn list(&self, tool: &ToolFacts, base: Base<'_>) -> bool {
        self.policies.decide_list(&self.caller(), tool, base, &self.circumstances())
    }
}
