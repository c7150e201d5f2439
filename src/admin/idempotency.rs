//! Idempotent creation: a client-chosen key makes a retried request answer what the first one
//! did instead of acting twice (a retried sign-up never makes two tenants).
//!
//! The key's row is inserted first thing in the write's own transaction and filled with the
//! answer just before it commits. A retry that comes after the commit finds the row and gets
//! the stored answer. One that comes during it waits on the row (PostgreSQL's unique index;
//! SQLite's single writer) and then finds it; if the first one rolled back there is no row and
//! the retry runs itself. Keys belong to the principal that sent them, and a key sent again
//! with another request (method, path or body) is refused.

use sqlx::AnyConnection;

use super::{AdminError, Done};
use crate::store::now_millis;

/// How long a key is remembered.
const KEPT_MS: i64 = 24 * 60 * 60 * 1000;

/// An `Idempotency-Key` and the digest of the request it came with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: String,
    pub fingerprint: String,
}

impl Idempotency {
    /// Checks the key (1 to 255 visible ASCII characters).
    pub fn new(key: &str, fingerprint: String) -> Result<Self, AdminError> {
        if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AdminError::Invalid {
                field: "Idempotency-Key",
                message: "must be 1 to 255 visible ASCII characters".into(),
            });
        }
        Ok(Self { key: key.to_owned(), fingerprint })
    }
}

/// Claims `idem` for `principal` inside the caller's transaction: `None` when this request is
/// the first with the key (it runs), or the stored answer of the one that was.
pub(super) async fn claim(
    conn: &mut AnyConnection,
    principal: &str,
    idem: &Idempotency,
) -> Result<Option<Done>, AdminError> {
    let now = now_millis();
    sqlx::query("DELETE FROM admin_idempotency WHERE created_at < $1").bind(now - KEPT_MS).execute(&mut *conn).await?;
    let inserted = sqlx::query(
        "INSERT INTO admin_idempotency (principal, key, fingerprint, status, body, created_at) \
         VALUES ($1, $2, $3, 0, '', $4) ON CONFLICT (principal, key) DO NOTHING",
    )
    .bind(principal)
    .bind(&idem.key)
    .bind(&idem.fingerprint)
    .bind(now)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        return Ok(None);
    }
    let (fingerprint, status, body, etag, location): (String, i64, String, Option<String>, Option<String>) =
        sqlx::query_as(
            "SELECT fingerprint, status, body, etag, location FROM admin_idempotency \
              WHERE principal = $1 AND key = $2",
        )
        .bind(principal)
        .bind(&idem.key)
        .fetch_one(&mut *conn)
        .await?;
    if fingerprint != idem.fingerprint {
        return Err(AdminError::KeyReused);
    }
    let body = if body.is_empty() { None } else { serde_json::from_str(&body).ok() };
    Ok(Some(Done {
        status: u16::try_from(status).unwrap_or(200),
        body,
        etag,
        location,
        secret: None,
        secret_name: "secret",
        skipped: Vec::new(),
        replayed: true,
    }))
}

/// Stores the answer of the request that claimed `idem` (never a secret).
pub(super) async fn store(
    conn: &mut AnyConnection,
    principal: &str,
    idem: &Idempotency,
    done: &Done,
) -> Result<(), AdminError> {
    let body = done.body.as_ref().map(serde_json::Value::to_string).unwrap_or_default();
    sqlx::query(
        "UPDATE admin_idempotency SET status = $1, body = $2, etag = $3, location = $4 \
          WHERE principal = $5 AND key = $6",
    )
    .bind(i64::from(done.status))
    .bind(body)
    .bind(done.etag.clone())
    .bind(done.location.clone())
    .bind(principal)
    .bind(&idem.key)
    .execute(conn)
    .await?;
    Ok(())
}
