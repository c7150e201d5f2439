//! `scopegate audit verify`: recomputes every tenant's chain and names the first broken event.

use serde::Serialize;
use sqlx::Row;

use super::digest::chain_hash;
use super::{AuditEvent, GENESIS, Outcome};
use crate::store::{Db, StoreError};

/// The verdict on one tenant's chain.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ChainReport {
    pub tenant: String,
    pub events: i64,
    pub broken: Option<BrokenLink>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BrokenLink {
    pub seq: i64,
    pub event_id: String,
    pub reason: String,
}

/// Verifies the chains of every tenant, or of the one whose slug is given.
pub async fn verify(db: &Db, tenant: Option<&str>) -> Result<Vec<ChainReport>, StoreError> {
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
        let rows = sqlx::query(
            "SELECT id, tenant_id, seq, occurred_at, user_id, session_id, request_id, client_name, \
             client_version, action, tool, args_digest, args_raw, outcome, error_class, duration_us, \
             calls, prev_hash, hash FROM audit_events WHERE tenant_id = $1 ORDER BY seq",
        )
        .bind(&tenant_id)
        .fetch_all(&mut *tx)
        .await?;
        let mut prev = GENESIS.to_owned();
        let mut broken = None;
        let mut count = 0;
        for (i, row) in rows.iter().enumerate() {
            count += 1;
            let seq: i64 = row.try_get("seq")?;
            let id: String = row.try_get("id")?;
            let stored_prev: String = row.try_get("prev_hash")?;
            let stored_hash: String = row.try_get("hash")?;
            let reason = if seq != i as i64 + 1 {
                Some(format!("sequence gap: expected {}, found {seq}", i + 1))
            } else if stored_prev != prev {
                Some("prev_hash does not match the previous event's hash".to_owned())
            } else {
                let event = event_from_row(row)?;
                (chain_hash(&prev, seq, &event) != stored_hash)
                    .then(|| "hash does not match the event's contents".to_owned())
            };
            if let Some(reason) = reason {
                broken = Some(BrokenLink { seq, event_id: id, reason });
                break;
            }
            prev = stored_hash;
        }
        reports.push(ChainReport { tenant: slug, events: count, broken });
    }
    Ok(reports)
}

fn event_from_row(row: &sqlx::any::AnyRow) -> Result<AuditEvent, StoreError> {
    let outcome = match row.try_get::<String, _>("outcome")?.as_str() {
        "ok" => Outcome::Ok,
        "denied" => Outcome::Denied,
        "failed" => Outcome::Failed,
        other => {
            return Err(StoreError::Invalid { field: "outcome", message: format!("unknown outcome `{other}`") });
        }
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
    })
}
