//! `scopegate audit verify`: recomputes every tenant's chain and names the first broken event;
//! with signed checkpoints, also names a chain that no longer reaches a checkpointed head.

use std::collections::HashMap;

use serde::Serialize;
use sqlx::Row;

use super::checkpoint::{Checkpoint, SignatureProblem, VerifyingKey};
use super::digest::chain_hash;
use super::{AuditEvent, GENESIS, Outcome};
use crate::store::{Db, StoreError};

/// The verdict on one tenant's chain.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ChainReport {
    pub tenant: String,
    pub events: i64,
    pub broken: Option<BrokenLink>,
    /// Checkpoints of this tenant whose signature holds and whose head the chain reaches.
    pub checkpoints_reached: usize,
    /// The newest seq among them.
    pub newest_checkpoint: Option<i64>,
    /// Checkpoints of this tenant that fail: a bad signature, an unknown key, or a head the
    /// chain no longer reaches.
    pub checkpoint_problems: Vec<String>,
    /// Calls whose record no outcome follows: the gateway stopped while they ran (or they run
    /// now). Not a break of the chain: what is known of them is there.
    pub outcome_unknown: Vec<UnknownOutcome>,
}

/// A call whose record stands without an outcome.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UnknownOutcome {
    pub seq: i64,
    pub event_id: String,
    pub tool: Option<String>,
    pub occurred_at: i64,
}

impl std::fmt::Display for UnknownOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tool = self.tool.as_deref().unwrap_or("-");
        write!(
            f,
            "the call of `{tool}` recorded at seq {} (event {}, {} ms) has no outcome",
            self.seq, self.event_id, self.occurred_at
        )
    }
}

/// Checkpoint lines to hold the chains against (see [`super::checkpoint::parse_lines`]), and
/// the keys they may be signed with.
pub struct Checkpoints<'a> {
    pub lines: &'a [(usize, Result<Checkpoint, String>)],
    pub keys: &'a [VerifyingKey],
}

/// What `verify_with_checkpoints` found: a report per tenant, and problems that belong to no
/// tenant of the database (a malformed line, a checkpoint of a tenant that no longer exists).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Verdict {
    pub chains: Vec<ChainReport>,
    pub problems: Vec<String>,
}

impl Verdict {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty() && self.chains.iter().all(|c| c.broken.is_none() && c.checkpoint_problems.is_empty())
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BrokenLink {
    pub seq: i64,
    pub event_id: String,
    pub reason: String,
}

/// Verifies the chains of every tenant, or of the one whose slug is given.
pub async fn verify(db: &Db, tenant: Option<&str>) -> Result<Vec<ChainReport>, StoreError> {
    Ok(verify_with_checkpoints(db, tenant, None).await?.chains)
}

/// [`verify`], and every checkpoint (of the tenant given, or of all) checked: its signature,
/// and that the chain still holds its head (an event at its seq with its hash).
pub async fn verify_with_checkpoints(
    db: &Db,
    tenant: Option<&str>,
    checkpoints: Option<Checkpoints<'_>>,
) -> Result<Verdict, StoreError> {
    let mut problems = Vec::new();
    let mut by_tenant: HashMap<&str, Vec<(usize, &Checkpoint)>> = HashMap::new();
    if let Some(c) = &checkpoints {
        for (line, parsed) in c.lines {
            match parsed {
                Ok(cp) if tenant.is_none_or(|slug| slug == cp.tenant) => {
                    by_tenant.entry(cp.tenant_id.as_str()).or_default().push((*line, cp));
                }
                Ok(_) => {}
                Err(e) => problems.push(format!("checkpoint line {line} is not a checkpoint: {e}")),
            }
        }
    }
    let keys = checkpoints.as_ref().map_or(&[][..], |c| c.keys);
    let mut tx = db.begin_read().await?;
    let tenants: Vec<(String, String)> = match tenant {
        Some(slug) => {
            sqlx::query_as("SELECT id, slug FROM tenants WHERE slug = $1").bind(slug).fetch_all(&mut *tx).await?
        }
        None => sqlx::query_as("SELECT id, slug FROM tenants ORDER BY slug").fetch_all(&mut *tx).await?,
    };
    if let Some(slug) = tenant
        && tenants.is_empty()
    {
        return Err(StoreError::NotFound(format!("tenant `{slug}` does not exist")));
    }
    let mut reports = Vec::new();
    for (tenant_id, slug) in tenants {
        // The head row first: every event up to it had committed when it was read, so the
        // events read next reach it, whatever is appended meanwhile.
        let head: Option<(i64, String)> = sqlx::query_as("SELECT seq, hash FROM audit_heads WHERE tenant_id = $1")
            .bind(&tenant_id)
            .fetch_optional(&mut *tx)
            .await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {EVENT_COLUMNS} FROM audit_events WHERE tenant_id = $1 ORDER BY seq"
        )))
        .bind(&tenant_id)
        .fetch_all(&mut *tx)
        .await?;
        // The whole chain: its first event follows seq 0 and the genesis hash.
        let mut before = (0, GENESIS.to_owned());
        let mut broken = None;
        let mut count = 0;
        let mut hashes: HashMap<i64, String> = HashMap::new();
        let mut calls = Calls::default();
        for row in &rows {
            count += 1;
            let seq: i64 = row.try_get("seq")?;
            let stored_prev: String = row.try_get("prev_hash")?;
            let stored_hash: String = row.try_get("hash")?;
            let event = event_from_row(row)?;
            let problem = link_problem(Some(&before), seq, &stored_prev, &stored_hash, &event)
                .or_else(|| calls.follow(seq, &event));
            if let Some(reason) = problem {
                broken = Some(BrokenLink { seq, event_id: event.id.to_string(), reason });
                break;
            }
            hashes.insert(seq, stored_hash.clone());
            before = (seq, stored_hash);
        }
        if broken.is_none() {
            broken = head_problem(head.as_ref(), &hashes, count);
        }
        let mut report = ChainReport {
            tenant: slug,
            events: count,
            broken,
            checkpoints_reached: 0,
            newest_checkpoint: None,
            checkpoint_problems: Vec::new(),
            outcome_unknown: calls.unknown(),
        };
        for (line, cp) in by_tenant.remove(tenant_id.as_str()).unwrap_or_default() {
            match held_by_chain(cp, keys, &hashes) {
                Ok(()) => {
                    report.checkpoints_reached += 1;
                    report.newest_checkpoint = report.newest_checkpoint.max(Some(cp.seq));
                }
                Err(problem) => report.checkpoint_problems.push(format!("checkpoint line {line}: {problem}")),
            }
        }
        reports.push(report);
    }
    // Checkpoints of tenants the database no longer has: the whole chain is gone.
    let mut gone: Vec<(usize, &Checkpoint)> = by_tenant.into_values().flatten().collect();
    gone.sort_by_key(|(line, _)| *line);
    for (line, cp) in gone {
        let signed = match cp.check_signature(keys) {
            Ok(()) => "",
            Err(_) => " (and its signature does not hold)",
        };
        problems.push(format!(
            "checkpoint line {line}: tenant `{}` ({}) is not in the database, but its chain was checkpointed at seq {}{signed}",
            cp.tenant, cp.tenant_id, cp.seq
        ));
    }
    Ok(Verdict { chains: reports, problems })
}

/// The calls of a chain read so far: each record (outcome `started`) waits for its one outcome.
#[derive(Default)]
pub(crate) struct Calls {
    open: HashMap<crate::store::AuditEventId, UnknownOutcome>,
    /// Calls that had their outcome: where each was recorded (`None`: before what was read).
    closed: HashMap<crate::store::AuditEventId, Option<i64>>,
    /// What is read starts after the chain's first event (an export `--since`): an outcome may
    /// follow a record before it.
    partial: bool,
}

impl Calls {
    /// The calls of what is read from the middle of a chain on: an outcome whose record is
    /// not among them may follow one before them (a second outcome of a call is still found).
    pub(crate) fn from_the_middle() -> Self {
        Self { partial: true, ..Self::default() }
    }

    /// Takes `event` (at `seq`) into account; why it does not hold as a record or an outcome.
    pub(crate) fn follow(&mut self, seq: i64, event: &AuditEvent) -> Option<String> {
        match (event.outcome, event.call_id) {
            (Outcome::Started, Some(_)) => Some("a call's record names a call of its own".to_owned()),
            (Outcome::Started, None) => {
                let unknown = UnknownOutcome {
                    seq,
                    event_id: event.id.to_string(),
                    tool: event.tool.clone(),
                    occurred_at: event.occurred_at,
                };
                self.open.insert(event.id, unknown);
                None
            }
            (_, None) => None,
            (_, Some(call)) => {
                match self.closed.get(&call) {
                    Some(Some(at)) => return Some(format!("a second outcome of the call recorded at seq {at}")),
                    Some(None) => return Some(format!("a second outcome of call {call}")),
                    None => {}
                }
                let Some(record) = self.open.get(&call) else {
                    if self.partial {
                        self.closed.insert(call, None);
                        return None;
                    }
                    return Some(format!("an outcome of call {call}, which no record before it in the chain is"));
                };
                if record.tool != event.tool {
                    return Some(format!(
                        "an outcome of another tool than its call's (recorded at seq {})",
                        record.seq
                    ));
                }
                let seq = record.seq;
                self.open.remove(&call);
                self.closed.insert(call, Some(seq));
                None
            }
        }
    }

    /// The records no outcome followed, in chain order.
    pub(crate) fn unknown(self) -> Vec<UnknownOutcome> {
        let mut open: Vec<UnknownOutcome> = self.open.into_values().collect();
        open.sort_by_key(|u| u.seq);
        open
    }
}

/// Why an intact chain (`hashes`: the seq and hash of each of its `count` events) does not
/// reach the head row the gateway keeps for it: events at its end were removed (the chain stops
/// short of the head), the last one was replaced, or the head row is missing.
fn head_problem(head: Option<&(i64, String)>, hashes: &HashMap<i64, String>, count: i64) -> Option<BrokenLink> {
    let (seq, reason) = match head {
        None if count == 0 => return None,
        None => (count, "the chain has events but no head row".to_owned()),
        Some((seq, hash)) => match hashes.get(seq) {
            Some(found) if found == hash => return None,
            Some(_) => (*seq, format!("event {seq} is not the one the chain's head row names")),
            None => (
                *seq,
                format!(
                    "the chain ends at seq {count}, but its head row is at seq {seq}: events at its end were removed"
                ),
            ),
        },
    };
    Some(BrokenLink { seq, event_id: String::new(), reason })
}

/// Whether `cp` is signed by one of `keys` and its head is in the chain (`hashes`: the seq
/// and hash of every event up to the first broken one).
fn held_by_chain(cp: &Checkpoint, keys: &[VerifyingKey], hashes: &HashMap<i64, String>) -> Result<(), String> {
    match cp.check_signature(keys) {
        Ok(()) => {}
        Err(SignatureProblem::UnknownKey) => return Err(format!("signed by an unknown key `{}`", cp.key_id)),
        Err(SignatureProblem::BadSignature) => return Err("signature does not verify".to_owned()),
    }
    if cp.seq == 0 {
        return Ok(());
    }
    match hashes.get(&cp.seq) {
        Some(hash) if *hash == cp.hash => Ok(()),
        Some(_) => Err(format!("the chain no longer reaches the checkpointed head: event {} has another hash", cp.seq)),
        None => {
            let end = hashes.len();
            Err(format!(
                "the chain no longer reaches the checkpointed head: it was at seq {} (signed at {} ms), \
                 the intact chain ends at seq {end}",
                cp.seq, cp.at
            ))
        }
    }
}

/// Why a chain link does not hold: its hash is not that of its fields, or it does not follow the
/// link before it (`before`: that link's seq and hash; `None` for the first of an export, which
/// may start anywhere in the chain).
pub(crate) fn link_problem(
    before: Option<&(i64, String)>,
    seq: i64,
    prev_hash: &str,
    hash: &str,
    event: &AuditEvent,
) -> Option<String> {
    match before {
        Some((before_seq, _)) if seq != before_seq + 1 => {
            return Some(format!("sequence gap: expected {}, found {seq}", before_seq + 1));
        }
        Some((_, before_hash)) if prev_hash != before_hash => {
            return Some("prev_hash does not match the previous event's hash".to_owned());
        }
        None if seq == 1 && prev_hash != GENESIS => {
            return Some("the chain's first event does not follow the genesis hash".to_owned());
        }
        None if seq < 1 => return Some(format!("seq {seq} is not a chain position")),
        _ => {}
    }
    (chain_hash(prev_hash, seq, event) != hash).then(|| "hash does not match the event's contents".to_owned())
}

/// The columns [`event_from_row`] reads, with `seq`, `prev_hash` and `hash`.
pub(crate) const EVENT_COLUMNS: &str = "id, tenant_id, seq, occurred_at, user_id, session_id, request_id, \
     client_name, client_version, action, tool, args_digest, args_raw, outcome, error_class, duration_us, calls, \
     policy, call_id, result_digest, prev_hash, hash";

pub(crate) fn event_from_row(row: &sqlx::any::AnyRow) -> Result<AuditEvent, StoreError> {
    let text: String = row.try_get("outcome")?;
    let Some(outcome) = Outcome::parse(&text) else {
        return Err(StoreError::Invalid { field: "outcome", message: format!("unknown outcome `{text}`") });
    };
    Ok(AuditEvent {
        id: row.try_get("id")?,
        tenant: row.try_get("tenant_id")?,
        occurred_at: row.try_get("occurred_at")?,
        user: row.try_get("user_id")?,
        session_id: row.try_get("session_id")?,
        request_id: row.try_get("request_id")?,
        client_name: row.try_get("client_name")?,
        client_version: row.try_get("client_version")?,
        action: row.try_get("action")?,
        tool: row.try_get("tool")?,
        args_digest: row.try_get("args_digest")?,
        args_raw: row.try_get("args_raw")?,
        outcome,
        error_class: row.try_get("error_class")?,
        duration_us: row.try_get("duration_us")?,
        calls: row.try_get("calls")?,
        policy: row.try_get("policy")?,
        call_id: row.try_get("call_id")?,
        result_digest: row.try_get("result_digest")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AuditEventId, TenantId, UserId};

    fn event(outcome: Outcome, tool: &str, call: Option<AuditEventId>) -> AuditEvent {
        AuditEvent {
            id: AuditEventId::generate(),
            tenant: TenantId::nil(),
            occurred_at: 1,
            user: UserId::nil(),
            session_id: None,
            request_id: None,
            client_name: None,
            client_version: None,
            action: "tools/call".into(),
            tool: Some(tool.into()),
            args_digest: None,
            args_raw: None,
            outcome,
            error_class: None,
            duration_us: 0,
            calls: 1,
            policy: None,
            call_id: call,
            result_digest: None,
        }
    }

    #[test]
    fn every_outcome_follows_its_own_record_once() {
        let mut calls = Calls::default();
        let a = event(Outcome::Started, "fx__echo", None);
        let b = event(Outcome::Started, "fx__echo", None);
        assert_eq!(calls.follow(1, &a), None);
        assert_eq!(calls.follow(2, &b), None);
        assert_eq!(calls.follow(3, &event(Outcome::Ok, "fx__echo", Some(a.id))), None);
        // One event, a refusal: no record, no outcome.
        assert_eq!(calls.follow(4, &event(Outcome::Denied, "fx__other", None)), None);
        let second = calls.follow(5, &event(Outcome::Failed, "fx__echo", Some(a.id)));
        assert!(second.is_some_and(|r| r.contains("second outcome of the call recorded at seq 1")));
        let orphan = calls.follow(5, &event(Outcome::Ok, "fx__echo", Some(AuditEventId::generate())));
        assert!(orphan.is_some_and(|r| r.contains("which no record before it")));
        let other_tool = calls.follow(5, &event(Outcome::Ok, "fx__other", Some(b.id)));
        assert!(other_tool.is_some_and(|r| r.contains("another tool")));
        let record_naming = calls.follow(5, &event(Outcome::Started, "fx__echo", Some(b.id)));
        assert!(record_naming.is_some_and(|r| r.contains("names a call of its own")));
        // b never got one: its outcome is unknown.
        let unknown = calls.unknown();
        assert_eq!(unknown.iter().map(|u| u.seq).collect::<Vec<_>>(), [2]);

        // Read from the middle: an outcome of a call recorded before is taken, once.
        let mut middle = Calls::from_the_middle();
        let before = AuditEventId::generate();
        assert_eq!(middle.follow(7, &event(Outcome::Ok, "fx__echo", Some(before))), None);
        let again = middle.follow(8, &event(Outcome::Ok, "fx__echo", Some(before)));
        assert!(again.is_some_and(|r| r.contains("second outcome of call")));
        let c = event(Outcome::Started, "fx__echo", None);
        assert_eq!(middle.follow(9, &c), None);
        let other_tool = middle.follow(10, &event(Outcome::Ok, "fx__other", Some(c.id)));
        assert!(other_tool.is_some_and(|r| r.contains("another tool")));
    }
}
