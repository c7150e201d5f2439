//! The group-commit audit writer: events of concurrent calls are appended in one
//! transaction; each caller is answered only after that transaction committed.

use std::collections::BTreeMap;
use std::sync::Arc;

use sqlx::Any;
use sqlx::pool::PoolConnection;
use tokio::sync::{mpsc, oneshot};

use super::{AuditEvent, Chains, Head, insert_links, link, load_head};
use crate::store::{Db, StoreError, TenantId};

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

impl AuditWriter {
    /// Starts the group-commit task; it ends when the last writer is dropped.
    pub fn start(db: Db, max_batch: usize) -> Self {
        let chains = Arc::new(Chains::default());
        let (queue, rx) = mpsc::channel(max_batch * 4);
        tokio::spawn(run(db.clone(), Arc::clone(&chains), rx, max_batch));
        Self { chains, queue }
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

/// Appends `batch` with one multi-row INSERT (atomic, one round trip), holding the chain
/// lock of every tenant in it (taken in tenant order, before touching the database).
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
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut heads: Vec<Option<Head>> = guards.iter().map(|g| (**g).clone()).collect();
        let result: Result<(), StoreError> = async {
            let conn = match held {
                Some(conn) => conn,
                None => held.insert(db.pool().acquire().await?),
            };
            let mut links = Vec::with_capacity(batch.len());
            for ((tenant, events), head) in by_tenant.iter().zip(heads.iter_mut()) {
                if head.is_none() {
                    *head = load_head(conn, *tenant).await?;
                }
                for event in events {
                    let l = link(head.as_ref(), event);
                    *head = Some(Head { seq: l.seq, hash: l.hash.clone() });
                    links.push(l);
                }
            }
            insert_links(conn, &links).await
        }
        .await;
        match result {
            Ok(()) => {
                for (guard, head) in guards.iter_mut().zip(heads) {
                    **guard = head;
                }
                return Ok(());
            }
            Err(StoreError::Sql(sqlx::Error::Database(e))) if e.is_unique_violation() && attempt < 3 => {
                // Another replica appended first: forget the cached heads and retry.
                for guard in guards.iter_mut() {
                    **guard = None;
                }
            }
            Err(e) => {
                for guard in guards.iter_mut() {
                    **guard = None;
                }
                *held = None;
                return Err(e);
            }
        }
    }
}
