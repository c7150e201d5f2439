//! Audit: every `tools/call` leaves an event, chained per tenant. A write's event is
//! inserted in the write's own transaction; every other event goes through a group
//! commit. When the insert fails the call fails (fail closed). Never skips an event.
//!
//! Chain: each tenant's events count up from `seq` 1; each stores the SHA-256 of its
//! predecessor (`prev_hash`) and its own `hash` over (prev_hash, canonical event). Every
//! append moves the tenant's row in `audit_heads` in its own transaction: a compare-and-swap
//! from the head this replica cached, or, when another replica moved it, a locked read of the
//! real head. The row lock serialises a tenant's appends across replicas, so an append never
//! collides on UNIQUE (tenant_id, seq) and needs no retry. One in-process lock per tenant
//! keeps the appends of one replica off that row lock's queue; it is always taken before any
//! database transaction, so it can't deadlock against SQLite's write lock.

pub mod checkpoint;
pub mod digest;
pub mod export;
pub(crate) mod refusal;
pub mod verify;
pub(crate) mod writer;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use sqlx::AnyConnection;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::store::{AuditEventId, StoreError, TenantId, UserId};
pub use writer::{AuditError, AuditWriter, Begun, Withheld};

/// What became of an audited call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The tool ran and succeeded.
    Ok,
    /// Refused before the tool ran (unknown or forbidden tool, context refused, rate limit).
    Denied,
    /// The tool ran and failed (bad input, not found, timeout, internal error).
    Failed,
    /// A call's record, committed while its upstream (or native tool) works: its outcome
    /// follows in an event of its own that names it ([`AuditEvent::call_id`]). A record that
    /// no outcome names is a call whose outcome is unknown.
    Started,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Denied => "denied",
            Outcome::Failed => "failed",
            Outcome::Started => "started",
        }
    }

    /// The outcome a stored or exported event names.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "ok" => Some(Outcome::Ok),
            "denied" => Some(Outcome::Denied),
            "failed" => Some(Outcome::Failed),
            "started" => Some(Outcome::Started),
            _ => None,
        }
    }
}

/// One audit event, before it is chained.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEvent {
    pub id: AuditEventId,
    pub tenant: TenantId,
    pub occurred_at: i64,
    pub user: UserId,
    pub session_id: Option<String>,
    pub request_id: Option<String>,
    pub client_name: Option<String>,
    pub client_version: Option<String>,
    pub action: String,
    pub tool: Option<String>,
    pub args_digest: Option<String>,
    pub args_raw: Option<String>,
    pub outcome: Outcome,
    pub error_class: Option<String>,
    pub duration_us: i64,
    /// How many calls the event stands for: 1, except for an aggregated refusal (calls
    /// refused by the rate limiter in one window, see [`refusal`]).
    pub calls: i64,
    /// The policies that decided a call, when the tenant's policies took part (JSON, see
    /// [`crate::policy::audit_text`]); `None` when grants alone decided.
    pub policy: Option<String>,
    /// An outcome's call: the id of the call's record (outcome [`Outcome::Started`]), earlier in
    /// the same chain. `None` for every other event.
    pub call_id: Option<AuditEventId>,
    /// An outcome's result: the SHA-256 of the canonical JSON of the result the caller was
    /// given (`None` when it was given an error, and for every other event).
    pub result_digest: Option<String>,
}

/// The newest event of a tenant's chain (seq 0 and [`GENESIS`] for a chain with no events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub seq: i64,
    pub hash: String,
}

/// The hash of the (absent) predecessor of a chain's first event.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

type ChainSlot = Arc<AsyncMutex<Option<Head>>>;

/// Per-tenant chain locks with a cached head (`None`: read it from the database).
#[derive(Default)]
pub(crate) struct Chains {
    slots: Mutex<HashMap<TenantId, ChainSlot>>,
}

impl Chains {
    pub async fn lock(&self, tenant: TenantId) -> OwnedMutexGuard<Option<Head>> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(slots.entry(tenant).or_default())
        };
        slot.lock_owned().await
    }
}

/// Locks `tenant`'s head row (inside the caller's transaction, until it ends) and reads it,
/// creating the row of a chain that has none. A no-op UPDATE takes the row lock on
/// PostgreSQL and reads the newest committed head once it has it; SQLite has no row locks,
/// and its writers are already serialised by `BEGIN IMMEDIATE`.
async fn lock_head(conn: &mut AnyConnection, tenant: TenantId) -> Result<Head, StoreError> {
    const LOCK: &str = "UPDATE audit_heads SET seq = seq WHERE tenant_id = $1 RETURNING seq, hash";
    let row: Option<(i64, String)> = sqlx::query_as(LOCK).bind(tenant).fetch_optional(&mut *conn).await?;
    if let Some((seq, hash)) = row {
        return Ok(Head { seq, hash });
    }
    // A chain with no head row yet; a concurrent first append of another replica may create
    // it first, then this lock waits for that one to commit.
    sqlx::query("INSERT INTO audit_heads (tenant_id, seq, hash) VALUES ($1, 0, $2) ON CONFLICT (tenant_id) DO NOTHING")
        .bind(tenant)
        .bind(GENESIS)
        .execute(&mut *conn)
        .await?;
    let (seq, hash): (i64, String) = sqlx::query_as(LOCK).bind(tenant).fetch_one(&mut *conn).await?;
    Ok(Head { seq, hash })
}

/// Links `events` after `cached` (the head this replica last saw, `None`: unknown) and moves
/// the tenant's head row to the last of them, inside the caller's transaction. When another
/// replica moved the head since, the events are linked again after the real head. Either way
/// the caller holds the head row's lock until it commits, so no other append can take these
/// sequence numbers. Returns the links to insert and the new head.
pub(crate) async fn claim<'a>(
    conn: &mut AnyConnection,
    tenant: TenantId,
    cached: Option<&Head>,
    events: &[&'a AuditEvent],
) -> Result<(Vec<Link<'a>>, Head), StoreError> {
    if let Some(cached) = cached {
        let (links, head) = link_all(cached, events);
        let swapped = sqlx::query("UPDATE audit_heads SET seq = $1, hash = $2 WHERE tenant_id = $3 AND seq = $4")
            .bind(head.seq)
            .bind(head.hash.clone())
            .bind(tenant)
            .bind(cached.seq)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if swapped == 1 {
            return Ok((links, head));
        }
    }
    let real = lock_head(conn, tenant).await?;
    let (links, head) = link_all(&real, events);
    sqlx::query("UPDATE audit_heads SET seq = $1, hash = $2 WHERE tenant_id = $3")
        .bind(head.seq)
        .bind(head.hash.clone())
        .bind(tenant)
        .execute(&mut *conn)
        .await?;
    Ok((links, head))
}

fn link_all<'a>(head: &Head, events: &[&'a AuditEvent]) -> (Vec<Link<'a>>, Head) {
    let mut head = head.clone();
    let mut links = Vec::with_capacity(events.len());
    for event in events {
        let l = link(&head, event);
        head = Head { seq: l.seq, hash: l.hash.clone() };
        links.push(l);
    }
    (links, head)
}

/// One event placed in its chain: its sequence number and the hashes that link it.
pub(crate) struct Link<'a> {
    pub event: &'a AuditEvent,
    pub seq: i64,
    pub prev_hash: String,
    pub hash: String,
}

/// Places `event` after `head` (the chain's newest event; seq 0 for an empty chain).
pub(crate) fn link<'a>(head: &Head, event: &'a AuditEvent) -> Link<'a> {
    let seq = head.seq + 1;
    let hash = digest::chain_hash(&head.hash, seq, event);
    Link { event, seq, prev_hash: head.hash.clone(), hash }
}

const COLUMNS: usize = 22;

/// The columns of an event row, in the order [`bind_links`] binds them.
const EVENT_COLUMNS: &str = "INSERT INTO audit_events (id, tenant_id, seq, occurred_at, user_id, session_id, \
     request_id, client_name, client_version, action, tool, args_digest, args_raw, outcome, error_class, \
     duration_us, calls, policy, call_id, result_digest, prev_hash, hash) ";

/// Appends the placeholders of `rows` event rows to `sql`: `(?, ...), (...)` when
/// `anonymous` (SQLite binds a numbered placeholder by looking its name up among all of the
/// statement's, a scan each: quadratic in a batch's 300 values; an anonymous one by place),
/// else numbered from `$after + 1`.
fn push_rows(sql: &mut String, rows: usize, anonymous: bool, after: usize) {
    for i in 0..rows {
        sql.push_str(if i == 0 { "(" } else { ", (" });
        for c in 1..=COLUMNS {
            if c > 1 {
                sql.push_str(", ");
            }
            if anonymous {
                sql.push('?');
            } else {
                // Writing to a String cannot fail.
                let _ = write!(sql, "${}", after + i * COLUMNS + c);
            }
        }
        sql.push(')');
    }
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// Binds the values of `links`, row after row, in [`EVENT_COLUMNS`] order.
fn bind_links<'q>(mut query: AnyQuery<'q>, links: &[Link<'_>]) -> AnyQuery<'q> {
    for l in links {
        let e = l.event;
        query = query
            .bind(e.id)
            .bind(e.tenant)
            .bind(l.seq)
            .bind(e.occurred_at)
            .bind(e.user)
            .bind(e.session_id.clone())
            .bind(e.request_id.clone())
            .bind(e.client_name.clone())
            .bind(e.client_version.clone())
            .bind(e.action.clone())
            .bind(e.tool.clone())
            .bind(e.args_digest.clone())
            .bind(e.args_raw.clone())
            .bind(e.outcome.as_str())
            .bind(e.error_class.clone())
            .bind(e.duration_us)
            .bind(e.calls)
            .bind(e.policy.clone())
            .bind(e.call_id)
            .bind(e.result_digest.clone())
            .bind(l.prev_hash.clone())
            .bind(l.hash.clone());
    }
    query
}

/// Inserts `links` with ONE statement (atomic by itself, one round trip).
pub(crate) async fn insert_links(conn: &mut AnyConnection, links: &[Link<'_>]) -> Result<(), StoreError> {
    if links.is_empty() {
        return Ok(());
    }
    let mut sql = format!("{EVENT_COLUMNS}VALUES ");
    push_rows(&mut sql, links.len(), conn.backend_name() == "SQLite", 0);
    // Only placeholders are interpolated; every value is bound.
    bind_links(sqlx::query(sqlx::AssertSqlSafe(sql)), links).execute(conn).await?;
    Ok(())
}

/// Appends one tenant's events to PostgreSQL in one statement, which commits by itself (one
/// round trip instead of four: no `BEGIN`, no `COMMIT`): the head is moved from the cached one
/// (compare and swap) in a data-modifying `WITH`, and the events are inserted only where it
/// moved. `None`: another replica moved the head since it was cached, and nothing was written.
pub(crate) async fn append_known_alone(
    conn: &mut AnyConnection,
    tenant: TenantId,
    cached: &Head,
    events: &[&AuditEvent],
) -> Result<Option<Head>, StoreError> {
    let (links, head) = link_all(cached, events);
    let mut sql = String::from(
        "WITH moved AS (UPDATE audit_heads SET seq = $1, hash = $2 WHERE tenant_id = $3 AND seq = $4 RETURNING 1) ",
    );
    sql.push_str(EVENT_COLUMNS);
    sql.push_str("SELECT * FROM (VALUES ");
    push_rows(&mut sql, links.len(), false, 4);
    sql.push_str(") AS linked WHERE EXISTS (SELECT 1 FROM moved)");
    // Only placeholders are interpolated; every value is bound.
    let query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(head.seq).bind(head.hash.clone()).bind(tenant);
    let query = bind_links(query.bind(cached.seq), &links);
    let inserted = query.execute(conn).await?.rows_affected();
    match inserted {
        0 => Ok(None),
        n if n == links.len() as u64 => Ok(Some(head)),
        n => Err(StoreError::Invalid {
            field: "audit_events",
            message: format!("{n} of {} events went in", links.len()),
        }),
    }
}

/// Inserts `event` as the next link of its tenant's chain on `conn` (inside the caller's
/// transaction). `head` is the cached head under the tenant's in-process lock (`None`:
/// unknown). Returns the new head, which the caller stores only after its commit.
pub(crate) async fn append(
    conn: &mut AnyConnection,
    head: &Option<Head>,
    event: &AuditEvent,
) -> Result<Head, StoreError> {
    let (links, head) = claim(conn, event.tenant, head.as_ref(), &[event]).await?;
    insert_links(conn, &links).await?;
    Ok(head)
}

/// The audit record of one tool call in progress: who, what, since when, and whether
/// a unit of work already wrote its event.
#[derive(Debug)]
pub struct CallAudit {
    pub tenant: TenantId,
    pub user: UserId,
    pub session_id: Option<String>,
    pub request_id: Option<String>,
    pub client_name: Option<String>,
    pub client_version: Option<String>,
    pub tool: String,
    pub args_digest: String,
    pub args_raw: Option<String>,
    pub started: Instant,
    recorded: AtomicBool,
    /// What the policies decided, when they took part.
    policy: std::sync::OnceLock<String>,
    /// Who confirmed the call, when it needed a confirmation (JSON: see `mcp::confirm`).
    confirmation: std::sync::OnceLock<serde_json::Value>,
    /// The call's record, once it was forwarded ([`CallAudit::start`]).
    record: Mutex<Record>,
}

/// Where the record of a forwarded call stands.
#[derive(Debug, Default)]
pub enum Record {
    /// Not forwarded: the call's one event is written when it ends.
    #[default]
    None,
    /// Handed to the writer; its commit runs while the call does.
    Pending(Begun),
    /// Committed (before the call was forwarded, under write-ahead).
    Committed(AuditEventId),
    /// Could not be committed (logged): the answer is withheld.
    Failed,
}

impl CallAudit {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tenant: TenantId,
        user: UserId,
        session_id: Option<String>,
        request_id: Option<String>,
        client: Option<(String, String)>,
        tool: String,
        args_digest: String,
        args_raw: Option<String>,
    ) -> Self {
        // Everything the caller chose is stored in its safe rendering (no U+0000, bounded).
        let (client_name, client_version) = match client {
            Some((n, v)) => (Some(refusal::safe_text(&n)), Some(refusal::safe_text(&v))),
            None => (None, None),
        };
        Self {
            tenant,
            user,
            session_id: session_id.as_deref().map(refusal::safe_text),
            request_id: request_id.as_deref().map(refusal::safe_text),
            client_name,
            client_version,
            tool: refusal::safe_text(&tool),
            args_digest,
            args_raw,
            started: Instant::now(),
            recorded: AtomicBool::new(false),
            policy: std::sync::OnceLock::new(),
            confirmation: std::sync::OnceLock::new(),
            record: Mutex::new(Record::None),
        }
    }

    /// Starts the append of this call's record (outcome [`Outcome::Started`]: who, what, with
    /// which arguments, as decided) as the call is forwarded: its commit runs while the
    /// upstream (or the tool) works, and the call's answer waits for both (see
    /// `mcp::pipeline::conclude`). With `write_ahead` (the tenant's `audit_write_ahead`) the
    /// commit is waited for here, so nothing sees the call before its record is durable.
    /// `Err(Withheld)`: the record could not be written (logged and counted): the call must not
    /// go on, and its answer is an internal error.
    pub async fn start(&self, audit: &AuditWriter, write_ahead: bool) -> Result<(), Withheld> {
        let event = self.event(Outcome::Started, None);
        // Boxed: the call's own future (already large) does not grow by the event and the send.
        let state = Box::pin(async move {
            match audit.begin(event).await {
                Ok(begun) if !write_ahead => Ok(Record::Pending(begun)),
                Ok(begun) => begun.committed().await.map(Record::Committed),
                Err(e) => Err(e),
            }
        })
        .await;
        let (state, result) = match state {
            Ok(state) => (state, Ok(())),
            Err(e) => (Record::Failed, Err(writer::withheld(&e, &self.tool))),
        };
        *self.record.lock().unwrap_or_else(|p| p.into_inner()) = state;
        result
    }

    /// The call's record, once committed (waited for here when it is still on its way), for
    /// a unit of work that writes the call's outcome with its write: `Ok(None)` when the call
    /// has no record (its one event is the unit's). `Err(Withheld)`: the record could not be
    /// committed, and nothing may be written.
    pub async fn committed_record(&self) -> Result<Option<AuditEventId>, Withheld> {
        let state = std::mem::take(&mut *self.record.lock().unwrap_or_else(|p| p.into_inner()));
        let (state, result) = match state {
            Record::None => (Record::None, Ok(None)),
            Record::Committed(id) => (Record::Committed(id), Ok(Some(id))),
            Record::Failed => (Record::Failed, Err(Withheld)),
            Record::Pending(begun) => match begun.committed().await {
                Ok(id) => (Record::Committed(id), Ok(Some(id))),
                Err(e) => (Record::Failed, Err(writer::withheld(&e, &self.tool))),
            },
        };
        *self.record.lock().unwrap_or_else(|p| p.into_inner()) = state;
        result
    }

    /// Where the call's record stands, taken (the call concludes once).
    pub fn take_record(&self) -> Record {
        std::mem::take(&mut *self.record.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The outcome of the call whose record is `record`: how it ended, the digest of the result
    /// the caller was given, and how long it took. It names the call as the record does (tool,
    /// caller, session, request, the arguments' digest), but does not repeat the arguments'
    /// text or what decided the call: those are the record's.
    pub fn outcome_event(
        &self,
        record: AuditEventId,
        outcome: Outcome,
        error_class: Option<&str>,
        result_digest: Option<String>,
    ) -> AuditEvent {
        AuditEvent { call_id: Some(record), result_digest, ..self.base(outcome, error_class, None, None) }
    }

    /// What the call's event records beside its outcome: the policies' decision (when they
    /// took part) and the confirmation (when the call needed one), as one JSON object.
    fn decided(&self) -> Option<String> {
        let Some(confirmation) = self.confirmation.get() else {
            return self.policy.get().cloned();
        };
        let mut json = self
            .policy
            .get()
            .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
            .filter(serde_json::Value::is_object)
            .unwrap_or_else(|| serde_json::json!({}));
        json["confirm"] = confirmation.clone();
        Some(crate::vocab::digest::canonical_json(&json))
    }

    /// An event of this call's confirmation (`confirm.request`, `confirm.answer`): the call's
    /// own tool, arguments' digest, session and request, by `user` (the caller, or the approver
    /// who answered), with `record` (what was asked or answered, and the confirmation's id that
    /// the call's own event names too) where a call's event has what decided it.
    pub fn confirmation_event(
        &self,
        action: &str,
        user: UserId,
        outcome: Outcome,
        error_class: Option<&str>,
        record: &serde_json::Value,
    ) -> AuditEvent {
        AuditEvent {
            action: action.to_owned(),
            user,
            duration_us: 0,
            policy: Some(crate::vocab::digest::canonical_json(&serde_json::json!({ "confirm": record }))),
            ..self.event(outcome, error_class)
        }
    }

    pub fn event(&self, outcome: Outcome, error_class: Option<&str>) -> AuditEvent {
        self.base(outcome, error_class, self.args_raw.clone(), self.decided())
    }

    /// The call's event with the arguments' text and the decision given (an outcome carries
    /// neither: they are not built for it).
    fn base(
        &self,
        outcome: Outcome,
        error_class: Option<&str>,
        args_raw: Option<String>,
        policy: Option<String>,
    ) -> AuditEvent {
        AuditEvent {
            id: AuditEventId::generate(),
            tenant: self.tenant,
            occurred_at: crate::store::now_millis(),
            user: self.user,
            session_id: self.session_id.clone(),
            request_id: self.request_id.clone(),
            client_name: self.client_name.clone(),
            client_version: self.client_version.clone(),
            action: "tools/call".to_owned(),
            tool: Some(self.tool.clone()),
            args_digest: Some(self.args_digest.clone()),
            args_raw,
            outcome,
            error_class: error_class.map(str::to_owned),
            duration_us: self.started.elapsed().as_micros() as i64,
            calls: 1,
            policy,
            call_id: None,
            result_digest: None,
        }
    }

    /// Records the policies that decided this call (once; a later decision is ignored).
    pub fn set_policy(&self, policy: String) {
        let _ = self.policy.set(policy);
    }

    /// Records who confirmed this call (once).
    pub fn set_confirmation(&self, confirmation: serde_json::Value) {
        let _ = self.confirmation.set(confirmation);
    }

    /// A unit of work committed this call's event with its write.
    pub(crate) fn mark_recorded(&self) {
        self.recorded.store(true, Ordering::Release);
    }

    pub fn is_recorded(&self) -> bool {
        self.recorded.load(Ordering::Acquire)
    }
}
