//! Upstream definitions pinned per tenant and binding: what a tenant's callers see of an
//! upstream tool, prompt or resource template is exactly a definition its owners approved (or,
//! under `trust_first_use`, the first one seen), never a newer one.
//!
//! Every list a connection fetches passes through [`Pins::serve`] before anything reads it
//! (`Connection::ready` and `Connection::listed`: session lists, stateless requests, the lean
//! relay, policies' facts, calls): each item is digested ([`definition_digest`]) and judged
//! against the tenant's rows (`crate::store::definitions`). An item is served as its approved
//! definition's text when the upstream lists exactly that definition and no other definition of
//! it waits for an owner; otherwise it is held: not listed, and a call of it answers as an
//! unknown tool. What the rows do not settle (a first sight, a change) is recorded before
//! anything is served, so replicas and connections agree through the database, and a change
//! seen anywhere holds the item everywhere within one read of the change counter.
//!
//! The tenant's rows are held while the change counter stands, like its policies; fail closed:
//! rows that can't be read serve nothing of the tenant's pinned servers.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::identity::{Epoch, IdentityCache};
use crate::store::definitions::{DefinitionKind, DefinitionState, PinMode, PinRows, Recorded, Sighting};
use crate::store::{Db, StoreError, TenantId};
use crate::vocab::digest::definition_digest;

/// Most tenants held; past it the held rows are dropped (simple and bounded).
const MAX_TENANTS: usize = 10_000;

/// An upstream list whose items are pinned: what kind they are, and which member names them.
pub(crate) trait Pinned: serde::Serialize + serde::de::DeserializeOwned + Clone {
    const KIND: DefinitionKind;
    fn key(&self) -> &str;
}

impl Pinned for rmcp::model::Tool {
    const KIND: DefinitionKind = DefinitionKind::Tool;
    fn key(&self) -> &str {
        &self.name
    }
}

impl Pinned for rmcp::model::Prompt {
    const KIND: DefinitionKind = DefinitionKind::Prompt;
    fn key(&self) -> &str {
        &self.name
    }
}

impl Pinned for rmcp::model::ResourceTemplate {
    const KIND: DefinitionKind = DefinitionKind::Template;
    fn key(&self) -> &str {
        &self.uri_template
    }
}

/// One item's rows.
#[derive(Debug, Default)]
struct ItemPins {
    /// The approved definition: its digest and parsed text.
    approved: Option<(String, Arc<Value>)>,
    /// A definition of it waits for an owner.
    pending: bool,
    /// Every definition seen of it, by digest.
    seen: HashMap<String, DefinitionState>,
}

/// One binding's mode and items.
#[derive(Debug)]
struct ServerPins {
    mode: PinMode,
    items: HashMap<(DefinitionKind, String), ItemPins>,
}

/// A tenant's pins as last read.
#[derive(Debug)]
pub struct TenantPins {
    pub slug: String,
    /// Changes whenever any row or mode does (a served list is computed again then).
    pub version: u64,
    /// Definitions held now.
    pub held: usize,
    servers: HashMap<String, ServerPins>,
}

/// How one listed item is served.
enum Verdict {
    /// Served as the approved text.
    Serve(Arc<Value>),
    /// Served as the upstream lists it (a `follow` binding).
    AsListed,
    /// Not served.
    Hold,
    /// Not settled by the rows: record it (approved on first use when `trust`).
    Record { trust: bool },
}

impl TenantPins {
    fn from_rows(rows: PinRows) -> Result<Self, String> {
        let mut hasher = std::hash::DefaultHasher::new();
        let mut servers: HashMap<String, ServerPins> = HashMap::new();
        for (server, mode) in rows.modes {
            (server.as_str(), mode.as_str()).hash(&mut hasher);
            servers.insert(server, ServerPins { mode, items: HashMap::new() });
        }
        let mut held = 0;
        for row in rows.rows {
            // The text too: what is served is the stored text, which may be edited in place.
            (&row.id, row.state.as_str(), &row.digest, &row.definition).hash(&mut hasher);
            held += usize::from(row.state == DefinitionState::Held);
            // A row of a server no longer bound is read by no connection.
            let Some(server) = servers.get_mut(&row.server) else { continue };
            let item = server.items.entry((row.kind, row.name.clone())).or_default();
            item.seen.insert(row.digest.clone(), row.state);
            match row.state {
                DefinitionState::Held => item.pending = true,
                DefinitionState::Approved => {
                    let text = row.definition.unwrap_or_default();
                    let value: Value = serde_json::from_str(&text).map_err(|e| {
                        format!("the approved definition {} of `{}` does not read: {e}", row.id, row.name)
                    })?;
                    item.approved = Some((row.digest, Arc::new(value)));
                }
                DefinitionState::Rejected | DefinitionState::Replaced => {}
            }
        }
        Ok(Self { slug: rows.slug, version: hasher.finish(), held, servers })
    }

    /// How `server` pins (`None`: it is not bound any more; nothing of it is served).
    pub fn mode(&self, server: &str) -> Option<PinMode> {
        self.servers.get(server).map(|s| s.mode)
    }

    fn judge(&self, server: &str, kind: DefinitionKind, name: &str, digest: &str) -> Verdict {
        let Some(pins) = self.servers.get(server) else { return Verdict::Hold };
        if pins.mode == PinMode::Follow {
            return Verdict::AsListed;
        }
        let Some(item) = pins.items.get(&(kind, name.to_owned())) else {
            return Verdict::Record { trust: pins.mode == PinMode::TrustFirstUse };
        };
        if item.pending {
            return Verdict::Hold;
        }
        match (&item.approved, item.seen.get(digest)) {
            (Some((approved, text)), _) if approved == digest => Verdict::Serve(Arc::clone(text)),
            (_, Some(DefinitionState::Rejected | DefinitionState::Held)) => Verdict::Hold,
            // A definition never seen, or one approved before: held until an owner decides.
            _ => Verdict::Record { trust: false },
        }
    }
}

/// A list as served: the items, and the digest of each (to tell whether what is served changed).
pub(crate) struct Served<T> {
    pub items: Arc<Vec<T>>,
    pub digests: Vec<String>,
}

/// Every tenant's pins, as the gateway holds them.
pub struct Pins {
    db: Db,
    changes: OnceLock<Arc<IdentityCache>>,
    held: Mutex<HashMap<TenantId, (Epoch, Arc<TenantPins>)>>,
    /// The metric names each tenant (`metrics.label_tenant`); else it counts them all.
    label_tenant: std::sync::atomic::AtomicBool,
    /// Each tenant's held definitions as last read, for the metric without tenant labels.
    counts: Mutex<HashMap<TenantId, usize>>,
}

impl Pins {
    pub fn new(db: Db) -> Self {
        Self {
            db,
            changes: OnceLock::new(),
            held: Mutex::default(),
            label_tenant: std::sync::atomic::AtomicBool::new(false),
            counts: Mutex::default(),
        }
    }

    /// Whether the held-definitions metric names each tenant (`metrics.label_tenant`).
    pub fn label_tenants(&self, on: bool) {
        self.label_tenant.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn count_held(&self, tenant: TenantId, pins: &TenantPins) {
        if self.label_tenant.load(std::sync::atomic::Ordering::Relaxed) {
            crate::telemetry::metrics::definitions_held(Some(&pins.slug), pins.held);
            return;
        }
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.len() >= MAX_TENANTS && !counts.contains_key(&tenant) {
            counts.retain(|_, held| *held > 0);
        }
        counts.insert(tenant, pins.held);
        crate::telemetry::metrics::definitions_held(None, counts.values().sum());
    }

    /// Hold each tenant's rows while `changes` (the change counter) stands.
    pub(crate) fn follow_changes(&self, changes: Arc<IdentityCache>) {
        let _ = self.changes.set(changes);
    }

    fn epoch(&self) -> Option<Epoch> {
        self.changes.get().and_then(|c| c.epoch())
    }

    /// `tenant`'s pins as of the last read of the change counter.
    pub async fn of(&self, tenant: TenantId) -> Result<Arc<TenantPins>, StoreError> {
        if let Some(epoch) = self.epoch()
            && let Some((at, pins)) = self.held.lock().unwrap_or_else(|p| p.into_inner()).get(&tenant)
            && *at == epoch
        {
            return Ok(Arc::clone(pins));
        }
        self.load(tenant).await
    }

    /// `tenant`'s pins read now.
    async fn load(&self, tenant: TenantId) -> Result<Arc<TenantPins>, StoreError> {
        let epoch = self.epoch();
        let rows = self.db.pin_rows(tenant).await?;
        let pins = Arc::new(
            TenantPins::from_rows(rows).map_err(|message| StoreError::Invalid { field: "definition", message })?,
        );
        self.count_held(tenant, &pins);
        // Kept only if the counter did not move while they were read.
        if let Some(epoch) = epoch
            && self.epoch() == Some(epoch)
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if held.len() >= MAX_TENANTS {
                held.clear();
            }
            held.insert(tenant, (epoch, Arc::clone(&pins)));
        }
        Ok(pins)
    }

    /// What of `listed` (server `server` of `tenant`) is served under `pins`: each item as its
    /// approved text, in the upstream's order; held items left out. What the rows do not settle
    /// is recorded first (and the rows read again), so nothing is served on this replica's word
    /// alone. Also the pins it was judged under.
    pub(crate) async fn serve<T: Pinned>(
        &self,
        tenant: TenantId,
        server: &str,
        pins: Arc<TenantPins>,
        listed: &Arc<Vec<T>>,
    ) -> Result<(Arc<TenantPins>, Served<T>), StoreError> {
        if pins.mode(server) == Some(PinMode::Follow) {
            let digests = listed.iter().map(|item| definition_digest(item).1).collect();
            return Ok((pins, Served { items: Arc::clone(listed), digests }));
        }
        let digested: Vec<(String, String)> = listed.iter().map(definition_digest).collect();
        let mut sightings = Vec::new();
        for (item, (canonical, digest)) in listed.iter().zip(&digested) {
            if let Verdict::Record { trust } = pins.judge(server, T::KIND, item.key(), digest) {
                sightings.push(Sighting {
                    kind: T::KIND,
                    name: item.key().to_owned(),
                    digest: digest.clone(),
                    definition: canonical.clone(),
                    trust,
                });
            }
        }
        let pins = if sightings.is_empty() {
            pins
        } else {
            let recorded = self.db.record_sightings(tenant, server, &sightings).await?;
            for (sighting, recorded) in sightings.iter().zip(recorded) {
                if recorded == Recorded::Held {
                    tracing::warn!(
                        tenant = %pins.slug,
                        %server,
                        kind = sighting.kind.as_str(),
                        name = %sighting.name,
                        digest = %sighting.digest,
                        "an upstream definition is held until an owner approves it: not listed, not callable"
                    );
                }
            }
            self.load(tenant).await?
        };
        let mut items = Vec::with_capacity(listed.len());
        let mut digests = Vec::with_capacity(listed.len());
        for (item, (_, digest)) in listed.iter().zip(digested) {
            match pins.judge(server, T::KIND, item.key(), &digest) {
                Verdict::Serve(text) => match serde_json::from_value::<T>(Value::clone(&text)) {
                    Ok(approved) => {
                        items.push(approved);
                        digests.push(digest);
                    }
                    Err(e) => {
                        tracing::error!(tenant = %pins.slug, %server, name = %item.key(), error = %e, "an approved definition does not read; held");
                    }
                },
                Verdict::AsListed => {
                    items.push(item.clone());
                    digests.push(digest);
                }
                // Recorded above; still unsettled means another writer holds it, or the
                // binding is gone: held either way.
                Verdict::Hold | Verdict::Record { .. } => {}
            }
        }
        Ok((pins, Served { items: Arc::new(items), digests }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::definitions::DefinitionRow;

    fn row(name: &str, digest: &str, state: DefinitionState) -> DefinitionRow {
        DefinitionRow {
            id: format!("{name}-{digest}"),
            server: "fx".into(),
            kind: DefinitionKind::Tool,
            name: name.into(),
            digest: digest.into(),
            definition: (state == DefinitionState::Approved).then(|| format!("{{\"name\":\"{name}\"}}")),
            state,
            first_seen_at: 1,
            decided_at: None,
            decided_by: None,
        }
    }

    fn pins(mode: PinMode, rows: Vec<DefinitionRow>) -> TenantPins {
        TenantPins::from_rows(PinRows { slug: "acme".into(), modes: vec![("fx".into(), mode)], rows }).unwrap()
    }

    fn verdict(p: &TenantPins, name: &str, digest: &str) -> &'static str {
        match p.judge("fx", DefinitionKind::Tool, name, digest) {
            Verdict::Serve(_) => "serve",
            Verdict::AsListed => "as listed",
            Verdict::Hold => "hold",
            Verdict::Record { trust: true } => "trust",
            Verdict::Record { trust: false } => "record held",
        }
    }

    #[test]
    fn an_item_is_served_only_as_its_approved_definition() {
        use DefinitionState::*;
        let first = pins(PinMode::TrustFirstUse, vec![]);
        assert_eq!(verdict(&first, "t", "a"), "trust", "first sight under trust_first_use");
        assert_eq!(verdict(&pins(PinMode::Approve, vec![]), "t", "a"), "record held", "first sight under approve");
        assert_eq!(verdict(&pins(PinMode::Follow, vec![]), "t", "a"), "as listed");
        assert_eq!(
            verdict(&pins(PinMode::Follow, vec![row("t", "a", Rejected)]), "t", "a"),
            "as listed",
            "follow pins nothing"
        );

        let approved = pins(PinMode::TrustFirstUse, vec![row("t", "a", Approved)]);
        assert_eq!(verdict(&approved, "t", "a"), "serve");
        assert_eq!(verdict(&approved, "t", "b"), "record held", "a change is held, not trusted");

        let changed = pins(PinMode::TrustFirstUse, vec![row("t", "a", Approved), row("t", "b", Held)]);
        assert_eq!(verdict(&changed, "t", "b"), "hold");
        assert_eq!(verdict(&changed, "t", "a"), "hold", "while a change waits, the old one is not served either");

        let rejected = pins(PinMode::TrustFirstUse, vec![row("t", "a", Approved), row("t", "b", Rejected)]);
        assert_eq!(verdict(&rejected, "t", "b"), "hold", "a rejected definition stays held");
        assert_eq!(verdict(&rejected, "t", "a"), "serve", "going back to the approved one serves it");

        let replaced = pins(PinMode::Approve, vec![row("t", "a", Replaced), row("t", "b", Approved)]);
        assert_eq!(verdict(&replaced, "t", "a"), "record held", "a replaced definition is held again");
        let unbound = TenantPins::from_rows(PinRows { slug: "acme".into(), modes: vec![], rows: vec![] }).unwrap();
        assert_eq!(verdict(&unbound, "t", "a"), "hold", "a server no longer bound serves nothing");
        assert_ne!(approved.version, changed.version);
        assert_eq!(changed.held, 1);
    }
}
