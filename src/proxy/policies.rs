//! Each tenant's policies as the gateway holds them (`crate::policy` compiles and decides): loaded from the database (with the
//! platform's, and the schema from the recorded tool catalogue and the native tools), kept while
//! the identity change counter stands (a policy, a mode, a catalogue or a binding written moves
//! it), loaded again when it moves. Fail closed: a tenant whose policies can't be read or
//! compiled gets a set that refuses every call and lists nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::identity::{Epoch, IdentityCache};
use crate::policy::ToolFacts;
use crate::policy::engine::TenantPolicies;
use crate::store::policies::PolicyInputs;
use crate::store::{Db, TenantId};

/// Most tenants held; past it the held sets are dropped (simple and bounded).
const MAX_TENANTS: usize = 10_000;

pub struct Policies {
    db: Db,
    changes: Option<Arc<IdentityCache>>,
    /// The gateway's native tools, as policies see them.
    native: Vec<ToolFacts>,
    /// The token claims policies read (`auth.policy_claims`).
    claims: Vec<String>,
    held: Mutex<HashMap<TenantId, (Epoch, Arc<TenantPolicies>)>>,
}

impl Policies {
    pub(crate) fn new(
        db: Db,
        changes: Option<Arc<IdentityCache>>,
        native: Vec<ToolFacts>,
        claims: Vec<String>,
    ) -> Self {
        Self { db, changes, native, claims, held: Mutex::default() }
    }

    /// The native tools, as policies see them.
    pub fn native(&self) -> &[ToolFacts] {
        &self.native
    }

    /// The native tool `name`, as policies see it.
    pub fn native_facts(&self, name: &str) -> Option<&ToolFacts> {
        self.native.iter().find(|t| t.name == name)
    }

    /// `tenant`'s policies (slug `slug`), as of the last read of the change counter.
    pub async fn of(&self, tenant: TenantId, slug: &str) -> Arc<TenantPolicies> {
        let epoch = self.changes.as_ref().and_then(|c| c.epoch());
        if let Some(epoch) = epoch
            && let Some((held, policies)) = self.held.lock().unwrap_or_else(|p| p.into_inner()).get(&tenant)
            && *held == epoch
        {
            return Arc::clone(policies);
        }
        let loaded = Arc::new(match self.db.policy_inputs(tenant).await {
            Ok(inputs) => load(slug, &self.native, &self.claims, inputs),
            Err(e) => {
                tracing::error!(tenant = %slug, error = %e, "reading the tenant's policies failed; refusing its calls");
                TenantPolicies::failed(slug, format!("the policies could not be read: {e}"))
            }
        });
        // Kept only if the counter did not move while they were read.
        if let Some(epoch) = epoch
            && self.changes.as_ref().and_then(|c| c.epoch()) == Some(epoch)
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if held.len() >= MAX_TENANTS {
                held.clear();
            }
            held.insert(tenant, (epoch, Arc::clone(&loaded)));
        }
        loaded
    }
}

fn load(slug: &str, native: &[ToolFacts], claims: &[String], inputs: PolicyInputs) -> TenantPolicies {
    let catalogue = crate::policy::model::catalogue(slug, native, inputs.servers, &inputs.catalogue, claims);
    match TenantPolicies::from_stored(&catalogue, &inputs.mode, inputs.tenant, inputs.platform) {
        Ok(policies) => {
            for (id, problems) in policies.stale() {
                let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
                tracing::warn!(tenant = %slug, policy = %id, problems = ?problems, "a policy no longer validates; it forbids what its scope names");
            }
            policies
        }
        Err(e) => {
            tracing::error!(tenant = %slug, error = %e, "the tenant's policies do not load; refusing its calls");
            TenantPolicies::failed(slug, e)
        }
    }
}
