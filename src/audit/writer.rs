//! The group-commit audit writer: events of concurrent calls are appended in one
//! transaction; each caller is answered only after that transaction committed.

use std::collections::BTreeMap;
use std::sync::Arc;

use sqlx::Any;
use sqlx::pool::PoolConnection;
use tokio::sync::{mpsc, oneshot};

use super::{AuditEvent, Chains, Head, append_known_alone, claim, insert_links};
use crate::store::{Db, DbKind, StoreError, TenantId};

struct Pending {
    event: AuditEvent,
    done: oneshot::Sender<Result<(), String>>,
}

/// Appends audit events. Cheap to clone.
#[derive(Clone)]
pub struct AuditWriter {
    chains: Arc<Chains>,
    queue: mpsc::Sender<Pending>,
}

#[derive(Debug, thiserror::Error)]
#[error("audit event could not be recorded: {0}")]
pub struct AuditError(pub String);

/// A call whose audit event could not be committed: its answer is withheld (fail closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Withheld;

impl From<Withheld> for rmcp::ErrorData {
    fn from(_: Withheld) -> Self {
        rmcp::ErrorData::internal_error("internal error", None)
    }
}

impl AuditWriter {
    /// Starts the group-commit task; it ends when the last writer is dropped.
    pub fn start(db: Db, max_batch: usize) -> Self {
        let chains = Arc::new(Chains::default());
        let (queue, rx) = mpsc::channel(max_batch * 4);
        tokio::spawn(run(db.clone(), Arc::clone(&chains), rx, max_batch));
        Self { chains, queue }
    }

    /// The one fail-closed audit step of a call: records `event`, and when it cannot be
    /// committed logs why (`what` names the call), counts the refusal and returns
    /// [`Withheld`]: the caller withholds its answer and answers an internal error instead.
    pub async fn record_or_withhold(&self, event: AuditEvent, what: &str) -> Result<(), Withheld> {
        use tracing::Instrument;
        let span = crate::telemetry::trace::audit_span(event.outcome.as_str());
        self.record(event).instrument(span).await.map_err(|e| {
            tracing::error!(error = %e, call = what, "audit failed; the call's answer is withheld");
            crate::telemetry::metrics::denial("audit_unavailable");
            Withheld
        })
    }

    /// Appends `event` and returns once it is committed (or failed to be).
    pub async fn record(&self, event: AuditEvent) -> Result<(), AuditError> {
        let (done, wait) = oneshot::channel();
        self.queue.send(Pending { event, done }).await.map_err(|_| AuditError("the audit writer stopped".into()))?;
        wait.await.map_err(|_| AuditError("the audit writer stopped".into()))?.map_err(AuditError)
    }

    pub(crate) fn chains(&self) -> &Chains {
        &self.chains
    }
}

async fn run(db: Db, chains: Arc<Chains>, mut rx: mpsc::Receiver<Pending>, max_batch: usize) {
    // The writer keeps its connection between batches: a connection returned to the pool is
    // pinged first (one more round trip per batch). It is dropped after any failure, so the
    // next batch starts on a fresh one, and when the pool closes, so that closing completes.
    let mut conn: Option<PoolConnection<Any>> = None;
    let closing = db.pool().close_event();
    tokio::pin!(closing);
    let mut closed = false;
    loop {
        let first = tokio::select! {
            first = rx.recv() => match first {
                Some(first) => first,
                None => break,
            },
            () = &mut closing, if !closed => {
                closed = true;
                conn = None;
                continue;
            }
        };
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let size = batch.len();
        let result = commit(&db, &mut conn, &chains, &batch).await;
        crate::telemetry::metrics::audit_batch(size, started.elapsed());
        match result {
            Ok(()) => {
                for p in batch {
                    let _ = p.done.send(Ok(()));
                }
            }
            Err(e) if batch.len() > 1 => {
                // One bad event must not fail its neighbours: retry each on its own.
                tracing::warn!(error = %e, size = batch.len(), "audit batch failed; retrying one by one");
                for p in batch {
                    let result =
                        commit(&db, &mut conn, &chains, std::slice::from_ref(&p)).await.map_err(|e| e.to_string());
                    let _ = p.done.send(result);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "audit event could not be recorded");
                for p in batch {
                    let _ = p.done.send(Err(e.to_string()));
                }
            }
        }
    }
}

/// Appends `batch` in one transaction: each tenant's head row moved (in tenant order, so
/// replicas committing batches of the same tenants can't deadlock), then one multi-row INSERT;
/// on PostgreSQL, a batch of one tenant whose head is known in one statement
/// ([`append_known_alone`]).
/// Holds the in-process chain lock of every tenant in it (taken in tenant order, before
/// touching the database).
async fn commit(
    db: &Db,
    held: &mut Option<PoolConnection<Any>>,
    chains: &Chains,
    batch: &[Pending],
) -> Result<(), StoreError> {
    let mut by_tenant: BTreeMap<TenantId, Vec<&AuditEvent>> = BTreeMap::new();
    for p in batch {
        by_tenant.entry(p.event.tenant).or_default().push(&p.event);
    }
    let mut guards = Vec::with_capacity(by_tenant.len());
    for tenant in by_tenant.keys() {
        guards.push(chains.lock(*tenant).await);
    }
    let result: Result<Vec<Head>, StoreError> = async {
        let conn = match held {
            Some(conn) => conn,
            None => held.insert(db.pool().acquire().await?),
        };
        // PostgreSQL, one tenant whose head is known: one statement that commits by itself.
        // When another replica moved the head meanwhile, nothing was written and the head is
        // read again below.
        let mut swapped = false;
        if db.kind() == DbKind::Postgres
            && let ([guard], Some((tenant, events))) = (&guards[..], by_tenant.first_key_value())
            && let Some(cached) = guard.as_ref()
        {
            match append_known_alone(conn, *tenant, cached, events).await? {
                Some(head) => return Ok(vec![head]),
                None => swapped = true,
            }
        }
        let mut tx = db.begin_on(conn).await?;
        let mut links = Vec::with_capacity(batch.len());
        let mut heads = Vec::with_capacity(by_tenant.len());
        for ((tenant, events), guard) in by_tenant.iter().zip(guards.iter()) {
            let cached = if swapped { None } else { guard.as_ref() };
            let (mut tenant_links, head) = claim(&mut tx, *tenant, cached, events).await?;
            links.append(&mut tenant_links);
            heads.push(head);
        }
        insert_links(&mut tx, &links).await?;
        tx.commit().await?;
        Ok(heads)
    }
    .await;
    match result {
        Ok(heads) => {
            for (guard, head) in guards.iter_mut().zip(heads) {
                **guard = Some(head);
            }
            Ok(())
        }
        Err(e) => {
            for guard in guards.iter_mut() {
                **guard = None;
            }
            *held = None;
            Err(e)
        }
    }
}
