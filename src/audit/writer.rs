//! The group-commit audit writer: events of concurrent calls are appended in one
//! transaction; each caller is answered only after that transaction committed.
//!
//! Two kinds of events go through it. One that somebody waits for (a call's record, a refusal,
//! a single event of a call) starts a commit as soon as the writer is free. An outcome nobody
//! waits for ([`AuditWriter::follow`]) waits up to `linger` for one of those and rides in its
//! commit: at one caller, the outcome of a call goes in with the record of the next one, and a
//! call costs one commit, not two.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Any;
use sqlx::pool::PoolConnection;
use tokio::sync::{mpsc, oneshot};

use super::{AuditEvent, Chains, Head, append_known_alone, claim, insert_links};
use crate::store::{AuditEventId, Db, DbKind, StoreError, TenantId};

struct Pending {
    event: AuditEvent,
    /// Who waits for the commit; `None`: an outcome nobody waits for.
    done: Option<oneshot::Sender<Result<(), String>>>,
}

impl Pending {
    fn answer(self, result: Result<(), String>) {
        match self.done {
            Some(done) => {
                let _ = done.send(result);
            }
            None => {
                if let Err(e) = result {
                    // Nobody waits: the call was answered. Its record stands without an outcome,
                    // which `audit verify` shows as "outcome unknown".
                    tracing::error!(error = %e, event = %self.event.id, "an outcome could not be recorded");
                    crate::telemetry::metrics::audit_outcome_lost();
                }
            }
        }
    }
}

/// What the writer is handed: an event, or a wish to see everything before it committed.
// Nearly every message is an event: boxing it would cost an allocation per event to shrink the
// rare flush.
#[allow(clippy::large_enum_variant)]
enum Message {
    Event(Pending),
    Flush(oneshot::Sender<()>),
}

/// Appends audit events. Cheap to clone.
#[derive(Clone)]
pub struct AuditWriter {
    chains: Arc<Chains>,
    queue: mpsc::Sender<Message>,
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

/// A call's record on its way into the chain ([`AuditWriter::begin`]).
#[derive(Debug)]
pub struct Begun {
    id: AuditEventId,
    wait: oneshot::Receiver<Result<(), String>>,
}

impl Begun {
    /// Waits for the record's commit.
    pub async fn committed(self) -> Result<AuditEventId, AuditError> {
        let stopped = || AuditError("the audit writer stopped".into());
        self.wait.await.map_err(|_| stopped())?.map_err(AuditError)?;
        Ok(self.id)
    }
}

impl AuditWriter {
    /// Starts the group-commit task; it ends when the last writer is dropped. An outcome
    /// waits up to `linger` for a commit to ride in.
    pub fn start(db: Db, max_batch: usize, linger: Duration) -> Self {
        let chains = Arc::new(Chains::default());
        let (queue, rx) = mpsc::channel(max_batch * 4);
        tokio::spawn(run(db.clone(), Arc::clone(&chains), rx, max_batch, linger));
        Self { chains, queue }
    }

    /// The one fail-closed audit step of a call: records `event`, and when it cannot be
    /// committed logs why (`what` names the call), counts the refusal and returns
    /// [`Withheld`]: the caller withholds its answer and answers an internal error instead.
    pub async fn record_or_withhold(&self, event: AuditEvent, what: &str) -> Result<(), Withheld> {
        use tracing::Instrument;
        let span = crate::telemetry::trace::audit_span(event.outcome.as_str());
        self.record(event).instrument(span).await.map_err(|e| withheld(&e, what))
    }

    /// Appends `event` and returns once it is committed (or failed to be).
    pub async fn record(&self, event: AuditEvent) -> Result<(), AuditError> {
        self.begin(event).await?.committed().await.map(drop)
    }

    /// Hands `event` (a call's record) to the writer and returns at once: its commit starts
    /// as soon as the writer is free, while the caller goes on (forwards the call);
    /// [`Begun::committed`] waits for it.
    pub async fn begin(&self, event: AuditEvent) -> Result<Begun, AuditError> {
        let (done, wait) = oneshot::channel();
        let id = event.id;
        let pending = Pending { event, done: Some(done) };
        self.queue.send(Message::Event(pending)).await.map_err(|_| AuditError("the audit writer stopped".into()))?;
        Ok(Begun { id, wait })
    }

    /// Returns once every event handed to the writer before it was committed (or failed to
    /// be): the outcomes waiting for a commit to ride in go in now.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.queue.send(Message::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// Appends `event` (a call's outcome, whose record committed) without waiting: it rides in
    /// the next commit. When it cannot be recorded the writer logs it and counts it; the call's
    /// record then stands without an outcome.
    pub fn follow(&self, event: AuditEvent) {
        let stopped = |message: Message| {
            if let Message::Event(pending) = message {
                pending.answer(Err("the audit writer stopped".into()));
            }
        };
        match self.queue.try_send(Message::Event(Pending { event, done: None })) {
            Ok(()) => {}
            // A full queue: the outcome waits for room in a task of its own, not the answer.
            Err(mpsc::error::TrySendError::Full(message)) => {
                let queue = self.queue.clone();
                tokio::spawn(async move {
                    if let Err(mpsc::error::SendError(message)) = queue.send(message).await {
                        stopped(message);
                    }
                });
            }
            Err(mpsc::error::TrySendError::Closed(message)) => stopped(message),
        }
    }

    pub(crate) fn chains(&self) -> &Chains {
        &self.chains
    }
}

/// Logs why a call's event could not be committed (`what` names the call), counts the refusal,
/// and gives the [`Withheld`] its caller answers with.
pub(crate) fn withheld(error: &AuditError, what: &str) -> Withheld {
    tracing::error!(error = %error, call = what, "audit failed; the call's answer is withheld");
    crate::telemetry::metrics::denial("audit_unavailable");
    Withheld
}

async fn run(db: Db, chains: Arc<Chains>, mut rx: mpsc::Receiver<Message>, max_batch: usize, linger: Duration) {
    // The writer keeps its connection between batches: a connection returned to the pool is
    // pinged first (one more round trip per batch). It is dropped after any failure, so the
    // next batch starts on a fresh one, and when the pool closes, so that closing completes.
    let mut conn: Option<PoolConnection<Any>> = None;
    let closing = db.pool().close_event();
    tokio::pin!(closing);
    let mut closed = false;
    // Outcomes waiting for a commit to ride in, and until when they wait.
    let mut riding: Vec<Pending> = Vec::new();
    let mut until: Option<tokio::time::Instant> = None;
    loop {
        let lingering = until.unwrap_or_else(tokio::time::Instant::now);
        let first = tokio::select! {
            first = rx.recv() => first,
            () = tokio::time::sleep_until(lingering), if until.is_some() => {
                // Nothing came to ride with: the outcomes go in alone.
                until = None;
                commit_batch(&db, &mut conn, &chains, std::mem::take(&mut riding)).await;
                continue;
            }
            () = &mut closing, if !closed => {
                closed = true;
                // The outcomes still waiting go in before the connection is let go.
                until = None;
                commit_batch(&db, &mut conn, &chains, std::mem::take(&mut riding)).await;
                conn = None;
                continue;
            }
        };
        let Some(first) = first else { break };
        let mut batch = std::mem::take(&mut riding);
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Event(pending) => batch.push(pending),
                Message::Flush(done) => flushes.push(done),
            }
            if batch.len() < max_batch {
                next = rx.try_recv().ok();
            }
        }
        let waited_for = !flushes.is_empty() || batch.iter().any(|p| p.done.is_some());
        if !waited_for && batch.len() < max_batch && !closed {
            // Only outcomes: they wait for a commit somebody waits for, up to `linger`.
            until.get_or_insert_with(|| tokio::time::Instant::now() + linger);
            riding = batch;
            continue;
        }
        until = None;
        commit_batch(&db, &mut conn, &chains, batch).await;
        for done in flushes {
            let _ = done.send(());
        }
    }
    // Every writer is gone: what still waits goes in.
    commit_batch(&db, &mut conn, &chains, riding).await;
}

/// Commits `batch` and answers each of its events; when the batch fails, each event is tried
/// on its own, so that one bad event does not fail its neighbours.
async fn commit_batch(db: &Db, conn: &mut Option<PoolConnection<Any>>, chains: &Chains, batch: Vec<Pending>) {
    if batch.is_empty() {
        return;
    }
    let started = std::time::Instant::now();
    let size = batch.len();
    let result = commit(db, conn, chains, &batch).await;
    crate::telemetry::metrics::audit_batch(size, started.elapsed());
    match result {
        Ok(()) => {
            for p in batch {
                p.answer(Ok(()));
            }
        }
        Err(e) if batch.len() > 1 => {
            tracing::warn!(error = %e, size = batch.len(), "audit batch failed; retrying one by one");
            for p in batch {
                let result = commit(db, conn, chains, std::slice::from_ref(&p)).await.map_err(|e| e.to_string());
                p.answer(result);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "audit event could not be recorded");
            for p in batch {
                p.answer(Err(e.to_string()));
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
