//! Upstream definitions pinned per tenant and binding (migration 0023): how each binding pins
//! (`approve`, `trust_first_use`, `follow`), and every definition of a pinned binding's tools,
//! prompts and resource templates the gateway saw, with its state. The runtime
//! (`crate::proxy::pins`) decides what is served from these rows; owners decide through
//! [`decide`].

use serde::{Deserialize, Serialize};
use sqlx::{AnyConnection, Row};

use super::{Db, StoreError, TenantId, now_millis};

/// How a binding's definitions are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PinMode {
    /// A definition first seen is held until an owner approves it.
    Approve,
    /// Approved on first sight, held when it changes afterwards.
    #[default]
    TrustFirstUse,
    /// Served as the upstream lists it now: nothing pinned (the unsafe choice).
    Follow,
}

impl PinMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::TrustFirstUse => "trust_first_use",
            Self::Follow => "follow",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "approve" => Self::Approve,
            "trust_first_use" => Self::TrustFirstUse,
            "follow" => Self::Follow,
            _ => return None,
        })
    }
}

/// What a definition defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DefinitionKind {
    Tool,
    Prompt,
    /// A resource template, named by its URI template.
    Template,
}

impl DefinitionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tool => "tool",
            Self::Prompt => "prompt",
            Self::Template => "template",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "tool" => Self::Tool,
            "prompt" => Self::Prompt,
            "template" => Self::Template,
            _ => return None,
        })
    }
}

/// Where a definition stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DefinitionState {
    /// Served (at most one per item).
    Approved,
    /// Waiting for an owner: while one is, the item is served nowhere.
    Held,
    /// An owner refused it: never served.
    Rejected,
    /// Approved once, before the approved one.
    Replaced,
}

impl DefinitionState {
    /// A filter of definitions by state: one state, or `all` (none).
    pub fn filter(text: &str) -> Result<Option<Self>, StoreError> {
        if text == "all" {
            return Ok(None);
        }
        Self::parse(text).map(Some).ok_or_else(|| StoreError::Invalid {
            field: "state",
            message: format!("`{text}`: held, approved, rejected, replaced or all"),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Held => "held",
            Self::Rejected => "rejected",
            Self::Replaced => "replaced",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "approved" => Self::Approved,
            "held" => Self::Held,
            "rejected" => Self::Rejected,
            "replaced" => Self::Replaced,
            _ => return None,
        })
    }
}

/// The actor recorded for a definition approved on first sight.
pub const FIRST_USE: &str = "trust_first_use";

/// One stored definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinitionRow {
    pub id: String,
    pub server: String,
    pub kind: DefinitionKind,
    pub name: String,
    pub digest: String,
    /// Its canonical JSON (not read where only the state matters).
    pub definition: Option<String>,
    pub state: DefinitionState,
    pub first_seen_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
}

/// What the runtime serves a tenant's pinned bindings from.
#[derive(Debug, Clone, Default)]
pub struct PinRows {
    pub slug: String,
    /// Each bound server and how it pins.
    pub modes: Vec<(String, PinMode)>,
    /// Every definition seen; the text only of approved ones.
    pub rows: Vec<DefinitionRow>,
}

/// A definition seen by the runtime that the rows do not settle.
#[derive(Debug, Clone)]
pub struct Sighting {
    pub kind: DefinitionKind,
    pub name: String,
    pub digest: String,
    pub definition: String,
    /// Approve it if the item was never seen before (`trust_first_use`); held otherwise.
    pub trust: bool,
}

/// What recording a sighting did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Approved on first sight.
    Trusted,
    /// Held (newly, or again: a replaced definition seen again).
    Held,
    /// Another writer settled it first.
    Nothing,
}

const COLUMNS: &str = "id, server, kind, name, digest, state, first_seen_at, decided_at, decided_by";

fn row_of(r: &sqlx::any::AnyRow, with_text: bool) -> Result<DefinitionRow, StoreError> {
    let kind: String = r.try_get("kind")?;
    let state: String = r.try_get("state")?;
    let bad = |what: &str, value: &str| StoreError::Invalid {
        field: "definition",
        message: format!("stored {what} `{value}`"),
    };
    Ok(DefinitionRow {
        id: r.try_get("id")?,
        server: r.try_get("server")?,
        kind: DefinitionKind::parse(&kind).ok_or_else(|| bad("kind", &kind))?,
        name: r.try_get("name")?,
        digest: r.try_get("digest")?,
        definition: if with_text { Some(r.try_get("definition")?) } else { None },
        state: DefinitionState::parse(&state).ok_or_else(|| bad("state", &state))?,
        first_seen_at: r.try_get("first_seen_at")?,
        decided_at: r.try_get("decided_at")?,
        decided_by: r.try_get("decided_by")?,
    })
}

/// Sets a binding's pin mode.
pub async fn set_pin_mode(
    conn: &mut AnyConnection,
    tenant: TenantId,
    server: &str,
    mode: PinMode,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE mcp_server_bindings SET pin = $1 WHERE tenant_id = $2 AND server = $3")
        .bind(mode.as_str())
        .bind(tenant)
        .bind(server)
        .execute(conn)
        .await?;
    Ok(())
}

/// A tenant's definitions, newest first seen first, without their text.
pub async fn list(conn: &mut AnyConnection, tenant: TenantId) -> Result<Vec<DefinitionRow>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM tool_definitions WHERE tenant_id = $1 ORDER BY first_seen_at DESC, server, kind, name, id"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(tenant).fetch_all(conn).await?;
    rows.iter().map(|r| row_of(r, false)).collect()
}

/// Every definition of one item of a tenant, with their text.
pub async fn of_item(
    conn: &mut AnyConnection,
    tenant: TenantId,
    server: &str,
    kind: DefinitionKind,
    name: &str,
) -> Result<Vec<DefinitionRow>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS}, definition FROM tool_definitions \
         WHERE tenant_id = $1 AND server = $2 AND kind = $3 AND name = $4 ORDER BY id"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(tenant)
        .bind(server)
        .bind(kind.as_str())
        .bind(name)
        .fetch_all(conn)
        .await?;
    rows.iter().map(|r| row_of(r, true)).collect()
}

/// One of a tenant's definitions, with its text.
pub async fn get(conn: &mut AnyConnection, tenant: TenantId, id: &str) -> Result<Option<DefinitionRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS}, definition FROM tool_definitions WHERE tenant_id = $1 AND id = $2");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(tenant).bind(id).fetch_optional(conn).await?;
    row.map(|r| row_of(&r, true)).transpose()
}

/// An owner's decision on a definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Serve it: the approved one before it (if any) is replaced.
    Approve,
    /// Never serve it.
    Reject,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Reject => "reject",
        }
    }
}

/// Decides definition `id` of `tenant` for `by`. Approving one that is held, rejected or
/// replaced makes it the item's approved definition (the one approved before it becomes
/// replaced); rejecting one that is held or approved makes it rejected (an approved one so
/// withdrawn leaves the item with none). Anything else is a conflict: the state it is in.
/// Answers the decided row and the digest of the item's approved definition before.
pub async fn decide(
    conn: &mut AnyConnection,
    tenant: TenantId,
    id: &str,
    decision: Decision,
    by: &str,
) -> Result<(DefinitionRow, Option<String>), StoreError> {
    let row = get(&mut *conn, tenant, id)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("definition `{id}` does not exist in this tenant")))?;
    let allowed = match decision {
        Decision::Approve => row.state != DefinitionState::Approved,
        Decision::Reject => matches!(row.state, DefinitionState::Held | DefinitionState::Approved),
    };
    if !allowed {
        return Err(StoreError::Conflict(format!(
            "definition `{id}` is {}: it can't be {}d",
            row.state.as_str(),
            decision.as_str()
        )));
    }
    let approved_before: Option<String> = sqlx::query_scalar(
        "SELECT digest FROM tool_definitions \
         WHERE tenant_id = $1 AND server = $2 AND kind = $3 AND name = $4 AND state = 'approved'",
    )
    .bind(tenant)
    .bind(&row.server)
    .bind(row.kind.as_str())
    .bind(&row.name)
    .fetch_optional(&mut *conn)
    .await?;
    let now = now_millis();
    if decision == Decision::Approve {
        sqlx::query(
            "UPDATE tool_definitions SET state = 'replaced' \
             WHERE tenant_id = $1 AND server = $2 AND kind = $3 AND name = $4 AND state = 'approved'",
        )
        .bind(tenant)
        .bind(&row.server)
        .bind(row.kind.as_str())
        .bind(&row.name)
        .execute(&mut *conn)
        .await?;
    }
    let state = match decision {
        Decision::Approve => DefinitionState::Approved,
        Decision::Reject => DefinitionState::Rejected,
    };
    sqlx::query(
        "UPDATE tool_definitions SET state = $1, decided_at = $2, decided_by = $3 WHERE tenant_id = $4 AND id = $5",
    )
    .bind(state.as_str())
    .bind(now)
    .bind(by)
    .bind(tenant)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    Ok((DefinitionRow { state, decided_at: Some(now), decided_by: Some(by.to_owned()), ..row }, approved_before))
}

impl Db {
    /// Everything the runtime serves `tenant`'s pinned bindings from, in one transaction.
    pub async fn pin_rows(&self, tenant: TenantId) -> Result<PinRows, StoreError> {
        let mut tx = self.pool().begin().await?;
        let slug: String = sqlx::query_scalar("SELECT slug FROM tenants WHERE id = $1")
            .bind(tenant)
            .fetch_optional(&mut *tx)
            .await?
            .unwrap_or_default();
        let modes = sqlx::query("SELECT server, pin FROM mcp_server_bindings WHERE tenant_id = $1 ORDER BY server")
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| {
                let (server, pin): (String, String) = (r.try_get("server")?, r.try_get("pin")?);
                let mode = PinMode::parse(&pin)
                    .ok_or_else(|| StoreError::Invalid { field: "pin", message: format!("stored mode `{pin}`") })?;
                Ok((server, mode))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        // The text of approved definitions only: it is what is served.
        let sql = format!(
            "SELECT {COLUMNS}, CASE WHEN state = 'approved' THEN definition ELSE '' END AS definition \
             FROM tool_definitions WHERE tenant_id = $1 ORDER BY id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| {
                let mut row = row_of(r, true)?;
                if row.state != DefinitionState::Approved {
                    row.definition = None;
                }
                Ok(row)
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        tx.commit().await?;
        Ok(PinRows { slug, modes, rows })
    }

    /// Records what `server` of `tenant` listed that the stored rows did not settle, in one
    /// transaction: a definition of an item never seen is approved when its sighting trusts
    /// first use (unless another writer recorded the item first), else held; a replaced one
    /// seen again is held again. Idempotent: replicas that see the same change record it once.
    pub async fn record_sightings(
        &self,
        tenant: TenantId,
        server: &str,
        sightings: &[Sighting],
    ) -> Result<Vec<Recorded>, StoreError> {
        let mut tx = self.begin().await?;
        let now = now_millis();
        let mut out = Vec::with_capacity(sightings.len());
        for s in sightings {
            if s.trust && insert(&mut tx, tenant, server, s, DefinitionState::Approved, now).await? {
                out.push(Recorded::Trusted);
                continue;
            }
            if insert(&mut tx, tenant, server, s, DefinitionState::Held, now).await? {
                out.push(Recorded::Held);
                continue;
            }
            let again = sqlx::query(
                "UPDATE tool_definitions SET state = 'held', decided_at = NULL, decided_by = NULL \
                 WHERE tenant_id = $1 AND server = $2 AND kind = $3 AND name = $4 AND digest = $5 AND state = 'replaced'",
            )
            .bind(tenant)
            .bind(server)
            .bind(s.kind.as_str())
            .bind(&s.name)
            .bind(&s.digest)
            .execute(&mut *tx)
            .await?;
            out.push(if again.rows_affected() > 0 { Recorded::Held } else { Recorded::Nothing });
        }
        tx.commit().await?;
        Ok(out)
    }
}

/// Inserts sighting `s` as a definition in `state`: held, or approved on first use (decided now,
/// and only when the item has no definition yet). Whether it was inserted (not when another
/// writer recorded the same definition, or, approving, any definition of the item, first).
async fn insert(
    conn: &mut AnyConnection,
    tenant: TenantId,
    server: &str,
    s: &Sighting,
    state: DefinitionState,
    now: i64,
) -> Result<bool, StoreError> {
    let trusted = state == DefinitionState::Approved;
    let done = sqlx::query(
        "INSERT INTO tool_definitions \
           (id, tenant_id, server, kind, name, digest, definition, state, first_seen_at, decided_at, decided_by) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 \
         WHERE $12 = 0 OR NOT EXISTS (SELECT 1 FROM tool_definitions \
                                      WHERE tenant_id = $2 AND server = $3 AND kind = $4 AND name = $5) \
         ON CONFLICT DO NOTHING",
    )
    .bind(uuid::Uuid::now_v7().to_string())
    .bind(tenant)
    .bind(server)
    .bind(s.kind.as_str())
    .bind(&s.name)
    .bind(&s.digest)
    .bind(&s.definition)
    .bind(state.as_str())
    .bind(now)
    .bind(trusted.then_some(now))
    .bind(trusted.then_some(FIRST_USE))
    .bind(i64::from(trusted))
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}
