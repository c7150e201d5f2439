//! One request's questions to its tenant's policies: the caller and the circumstances, taken
//! once from the call's context and asked for each tool the request lists or calls.

use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

use crate::identity::{FlockAccess, McpCallContext};
use crate::model::Role;
use crate::policy::engine::{Base, Caller, Circumstances, Outcome, TenantPolicies};
use crate::policy::{Item, ToolFacts};
use crate::relay::ProxyError;

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
    /// What the policies decided of the request's prompt, resource or completion, for its audit.
    noted: OnceLock<String>,
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
            noted: OnceLock::new(),
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
            noted: OnceLock::new(),
        }
    }

    /// The questions of a request about a selected root's server (the session's own, outside
    /// the tenant's catalogue): its grants alone decide, as for its tools.
    pub fn grants_alone() -> Self {
        static NONE: std::sync::LazyLock<Arc<TenantPolicies>> =
            std::sync::LazyLock::new(|| Arc::new(TenantPolicies::none("")));
        Self::grants_only_for(Arc::clone(&NONE))
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

    /// Whether `item` (a prompt, a resource or a template of an upstream) is listed; `base`:
    /// the grant that allows it.
    pub fn list_item(&self, item: &Item<'_>, base: Base<'_>) -> bool {
        self.policies.decide_item_list(&self.caller(), item, base, &self.circumstances())
    }

    /// Decides a request of `item` (`base`: the grant that allows it), noting what the
    /// policies decided for the request's audit ([`Ask::noted`]). `Err`: refused, answered as
    /// a name that does not exist.
    pub fn decide_item(&self, item: &Item<'_>, base: Base<'_>) -> Result<(), ProxyError> {
        let outcome = self.policies.decide_item(&self.caller(), item, base, &self.circumstances());
        if outcome.consulted {
            let _ = self.noted.set(crate::policy::audit_text(&outcome));
        }
        match outcome.decision.allow {
            true => Ok(()),
            false => Err(ProxyError::Refused(outcome.decision.reason.refusal_class())),
        }
    }

    /// What the policies decided of this request's item, when they took part.
    pub fn noted(&self) -> Option<String> {
        self.noted.get().cloned()
    }
}
