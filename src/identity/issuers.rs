//! The issuers tenants trust (`store::issuers`), as a snapshot read again whenever the identity
//! change counter moves (a trust added or removed moves it): a removed issuer stops working
//! within one read of the counter, and a token of a trusted issuer costs no query while nothing
//! changes. Without the identity cache (or with its counter stale) every token of a foreign
//! issuer reads the rows again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Epoch, IdentityCache};
use crate::store::issuers::TrustedIssuer;
use crate::store::{Db, StoreError};

type Snapshot = Arc<HashMap<String, Vec<TrustedIssuer>>>;

pub(crate) struct TrustedIssuers {
    db: Db,
    cache: Option<Arc<IdentityCache>>,
    held: Mutex<Option<(Epoch, Snapshot)>>,
}

impl TrustedIssuers {
    pub fn new(db: Db, cache: Option<Arc<IdentityCache>>) -> Self {
        Self { db, cache, held: Mutex::new(None) }
    }

    /// Every trust of `issuer` (of tenants that are not retired).
    pub async fn of(&self, issuer: &str) -> Result<Vec<TrustedIssuer>, StoreError> {
        Ok(self.snapshot().await?.get(issuer).cloned().unwrap_or_default())
    }

    /// Every trusted issuer (for the protected resource metadata).
    pub async fn issuers(&self) -> Result<Vec<String>, StoreError> {
        let mut issuers: Vec<String> = self.snapshot().await?.keys().cloned().collect();
        issuers.sort();
        Ok(issuers)
    }

    /// The trusts of `tenant_slug` through which the console signs its people in (those with a
    /// console client), by issuer.
    pub async fn console_clients(&self, tenant_slug: &str) -> Result<Vec<TrustedIssuer>, StoreError> {
        let snapshot = self.snapshot().await?;
        let mut trusts: Vec<TrustedIssuer> = snapshot
            .values()
            .flatten()
            .filter(|t| t.tenant_slug == tenant_slug && t.console_client_id.is_some())
            .cloned()
            .collect();
        trusts.sort_by(|a, b| a.issuer.cmp(&b.issuer));
        Ok(trusts)
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let epoch = self.cache.as_ref().and_then(|c| c.epoch());
        if let Some(epoch) = epoch
            && let Some((held, snapshot)) = self.held.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
            && *held == epoch
        {
            return Ok(Arc::clone(snapshot));
        }
        let rows = {
            let mut conn = self.db.pool().acquire().await?;
            crate::store::issuers::all(&mut conn).await?
        };
        let mut by_issuer: HashMap<String, Vec<TrustedIssuer>> = HashMap::new();
        for row in rows {
            by_issuer.entry(row.issuer.clone()).or_default().push(row);
        }
        let snapshot = Arc::new(by_issuer);
        if let Some(epoch) = epoch {
            *self.held.lock().unwrap_or_else(|p| p.into_inner()) = Some((epoch, Arc::clone(&snapshot)));
        }
        Ok(snapshot)
    }
}
