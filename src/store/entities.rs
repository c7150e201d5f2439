//! Executors (with their owning tenants and secret hashes, never a secret), `mcp-server`
//! entities, bindings and the grants of upstream tools, and the resolver that finds a server's declaration in the BOUND executor's context. Never consults
//! the resolving host's own machine name or user: the one resolving query takes only a tenant
//! and a server id.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom as _, SystemRandom};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::{AnyConnection, Row};

use super::admin::tenant_id_by_slug;
use super::{Db, StoreError, TenantId, now_millis, unique_conflict};
use crate::model::{Confirm, Role};

mod grants;
pub use grants::*;

/// Where upstream servers run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Executor {
    pub id: String,
    pub name: String,
    pub machine: String,
    pub run_as: String,
    pub kind: String,
}

/// A server's declaration as the resolver found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResolvedEntity {
    /// The hierarchical name that matched (which of the three places won).
    pub entity: String,
    /// The JSON declaration of one server.
    pub declaration: String,
    /// The executor the tenant bound the server to: its context chose the entity.
    pub executor: Executor,
    /// Whether the server's tools and prompts are exposed as `server__name` (the default) or
    /// under their own names (`binding set --no-prefix`).
    pub prefixed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntityRow {
    pub name: String,
    pub server: String,
    pub declaration: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BindingRow {
    pub server: String,
    pub executor: String,
    /// False for a binding made with `--no-prefix`.
    pub prefixed: bool,
    /// How its upstream definitions are pinned.
    pub pin: crate::store::definitions::PinMode,
}

/// A path segment of an entity name, a machine name or a user name: it must not be able to
/// forge another place in the hierarchy.
fn validate_segment(field: &'static str, value: &str) -> Result<(), StoreError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value != "."
        && value != ".."
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            field,
            message: format!("`{value}` must be 1-128 of letters, digits, `.`, `_`, `-`, `@` (and not `.` or `..`)"),
        })
    }
}

/// A server id: it becomes the `server__` prefix of tool names, so no `__` inside.
pub fn validate_server_id(value: &str) -> Result<(), StoreError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
        && !value.contains("__");
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            field: "server",
            message: format!("`{value}` must be 1-64 letters, digits, `-` or `_`, without `__`"),
        })
    }
}

/// Checks a hierarchical entity name and returns its server id.
pub fn parse_entity_name(name: &str) -> Result<&str, StoreError> {
    let parts: Vec<&str> = name.split('/').collect();
    let server = match parts.as_slice() {
        ["machines", machine, "profile", "mcp-servers", server] => {
            validate_segment("name", machine)?;
            server
        }
        ["users", user, "mcp-servers", server] => {
            validate_segment("name", user)?;
            server
        }
        ["defaults", "mcp-servers", server] => server,
        _ => {
            return Err(StoreError::Invalid {
                field: "name",
                message: format!(
                    "`{name}` must be machines/MACHINE/profile/mcp-servers/SERVER, \
                     users/USER/mcp-servers/SERVER or defaults/mcp-servers/SERVER"
                ),
            });
        }
    };
    validate_server_id(server)?;
    Ok(server)
}

/// The prefix of every executor secret: a leaked one is recognisable in logs and by scanners.
const SECRET_PREFIX: &str = "sgx_";

/// hex SHA-256 of an executor secret
pub fn executor_secret_hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A new secret: `sgx_` and 32 random bytes, base64url without padding.
fn new_executor_secret() -> Result<String, StoreError> {
    let mut bytes = [0u8; 32];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| StoreError::Invalid { field: "secret", message: "the system random source failed".into() })?;
    Ok(format!("{SECRET_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// What a presented secret's hash is compared with when there is no stored one: as long as a
/// real hash, so the comparison takes as long.
const NO_SECRET_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Equality whose time does not depend on where two equally long values first differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a remote executor agent was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentAuthError {
    #[error("no such executor")]
    Unknown,
    #[error("not a remote executor")]
    NotRemote,
    #[error("wrong secret")]
    WrongSecret,
}

/// Creates an executor. A `remote` one is owned by `owners` (tenant slugs, at least one) and
/// gets a new secret, returned once (only its hash is stored); a `local` one takes no owners
/// (every tenant may bind it) and has no secret. Everything is checked before the first write,
/// so a refusal writes nothing; the caller's transaction holds the writes together.
pub async fn create_executor(
    conn: &mut AnyConnection,
    name: &str,
    machine: &str,
    run_as: &str,
    kind: &str,
    owners: &[&str],
) -> Result<Option<String>, StoreError> {
    validate_segment("name", name)?;
    validate_segment("machine", machine)?;
    validate_segment("user", run_as)?;
    let remote = match kind {
        "local" => false,
        "remote" => true,
        _ => return Err(StoreError::Invalid { field: "kind", message: format!("`{kind}` must be local or remote") }),
    };
    if !remote && !owners.is_empty() {
        return Err(StoreError::Invalid {
            field: "tenant",
            message: "a local executor takes no --tenant: every tenant may bind it".into(),
        });
    }
    if remote && owners.is_empty() {
        return Err(StoreError::Invalid {
            field: "tenant",
            message: format!("remote executor `{name}` needs at least one owner: pass --tenant SLUG"),
        });
    }
    let mut tenants = Vec::with_capacity(owners.len());
    for slug in owners {
        let tenant = tenant_id_by_slug(&mut *conn, slug).await?;
        if !tenants.contains(&tenant) {
            tenants.push(tenant);
        }
    }
    let secret = if remote { Some(new_executor_secret()?) } else { None };
    let id = uuid::Uuid::now_v7().to_string();
    sqlx::query(
        "INSERT INTO executors (id, name, machine, run_as, kind, created_at, secret_hash) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&id)
    .bind(name)
    .bind(machine)
    .bind(run_as)
    .bind(kind)
    .bind(now_millis())
    .bind(secret.as_deref().map(executor_secret_hash))
    .execute(&mut *conn)
    .await
    .map_err(|e| unique_conflict(e, || format!("executor `{name}` already exists")))?;
    for tenant in tenants {
        sqlx::query("INSERT INTO executor_owners (executor_id, tenant_id) VALUES ($1, $2)")
            .bind(&id)
            .bind(tenant)
            .execute(&mut *conn)
            .await?;
    }
    Ok(secret)
}

/// The id of the remote executor `name`; a local one is refused, naming `executor`.
async fn remote_executor_id(conn: &mut AnyConnection, name: &str) -> Result<String, StoreError> {
    let (id, kind): (String, String) = sqlx::query_as("SELECT id, kind FROM executors WHERE name = $1")
        .bind(name)
        .fetch_optional(conn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("executor `{name}` does not exist")))?;
    if kind != "remote" {
        return Err(StoreError::Invalid {
            field: "executor",
            message: format!("`{name}` is a {kind} executor: it has no secret and no owners"),
        });
    }
    Ok(id)
}

/// Gives the remote executor `name` a new secret and returns it (once); the old one stops
/// working at once.
pub async fn rotate_executor_secret(conn: &mut AnyConnection, name: &str) -> Result<String, StoreError> {
    let id = remote_executor_id(&mut *conn, name).await?;
    let secret = new_executor_secret()?;
    sqlx::query("UPDATE executors SET secret_hash = $1 WHERE id = $2 AND kind = 'remote'")
        .bind(executor_secret_hash(&secret))
        .bind(id)
        .execute(conn)
        .await?;
    Ok(secret)
}

/// Lets the tenant bind servers to the remote executor `name`.
pub async fn add_executor_owner(conn: &mut AnyConnection, name: &str, tenant_slug: &str) -> Result<(), StoreError> {
    let id = remote_executor_id(&mut *conn, name).await?;
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    sqlx::query("INSERT INTO executor_owners (executor_id, tenant_id) VALUES ($1, $2)")
        .bind(id)
        .bind(tenant)
        .execute(conn)
        .await
        .map_err(|e| unique_conflict(e, || format!("`{tenant_slug}` already owns executor `{name}`")))?;
    Ok(())
}

/// Takes the remote executor `name` from the tenant. Refused while the tenant still binds
/// servers to it (naming them: unbind them first), and for its last owner (delete it instead).
pub async fn remove_executor_owner(conn: &mut AnyConnection, name: &str, tenant_slug: &str) -> Result<(), StoreError> {
    let id = remote_executor_id(&mut *conn, name).await?;
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let bound: Vec<String> = sqlx::query_scalar(
        "SELECT server FROM mcp_server_bindings WHERE tenant_id = $1 AND executor_id = $2 ORDER BY server",
    )
    .bind(tenant)
    .bind(&id)
    .fetch_all(&mut *conn)
    .await?;
    if !bound.is_empty() {
        return Err(StoreError::Conflict(format!(
            "`{tenant_slug}` still binds servers to executor `{name}`: {} (unbind them first)",
            bound.join(", ")
        )));
    }
    let owners: Vec<TenantId> = sqlx::query_scalar("SELECT tenant_id FROM executor_owners WHERE executor_id = $1")
        .bind(&id)
        .fetch_all(&mut *conn)
        .await?;
    if !owners.contains(&tenant) {
        return Err(StoreError::NotFound(format!("`{tenant_slug}` does not own executor `{name}`")));
    }
    if owners.len() == 1 {
        return Err(StoreError::Conflict(format!(
            "`{tenant_slug}` is the last owner of executor `{name}`: delete the executor instead"
        )));
    }
    sqlx::query("DELETE FROM executor_owners WHERE executor_id = $1 AND tenant_id = $2")
        .bind(&id)
        .bind(tenant)
        .execute(conn)
        .await?;
    Ok(())
}

/// An executor as `admin executor list` shows it: never its secret or hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecutorRow {
    pub name: String,
    pub machine: String,
    pub run_as: String,
    pub kind: String,
    /// The owning tenants' slugs, sorted (empty for `local`).
    pub owners: Vec<String>,
}

pub async fn list_executors(conn: &mut AnyConnection) -> Result<Vec<ExecutorRow>, StoreError> {
    let rows = sqlx::query("SELECT id, name, machine, run_as, kind FROM executors ORDER BY name")
        .fetch_all(&mut *conn)
        .await?;
    let owners: Vec<(String, String)> = sqlx::query_as(
        "SELECT o.executor_id, t.slug FROM executor_owners o JOIN tenants t ON t.id = o.tenant_id ORDER BY t.slug",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            let x = executor_from_row(r)?;
            Ok(ExecutorRow {
                owners: owners.iter().filter(|(id, _)| *id == x.id).map(|(_, slug)| slug.clone()).collect(),
                name: x.name,
                machine: x.machine,
                run_as: x.run_as,
                kind: x.kind,
            })
        })
        .collect()
}

fn executor_from_row(row: &sqlx::any::AnyRow) -> Result<Executor, StoreError> {
    Ok(Executor {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        machine: row.try_get("machine")?,
        run_as: row.try_get("run_as")?,
        kind: row.try_get("kind")?,
    })
}

/// Deletes an executor, with its owners. Refused while any tenant binds servers to it.
pub async fn delete_executor(conn: &mut AnyConnection, name: &str) -> Result<(), StoreError> {
    let done =
        sqlx::query("DELETE FROM executors WHERE name = $1").bind(name).execute(conn).await.map_err(|e| match &e {
            // The bindings' foreign key keeps a bound executor.
            sqlx::Error::Database(db) if db.is_foreign_key_violation() => {
                StoreError::Conflict(format!("executor `{name}` is still bound to servers"))
            }
            _ => StoreError::Sql(e),
        })?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("executor `{name}` does not exist")));
    }
    Ok(())
}

impl Db {
    /// The remote executor `name`, if `secret` is its current secret (constant-time compare of hashes).
    ///
    /// Every outcome costs the same work: one query, one hash of the presented secret and one
    /// comparison, so how long a refusal takes does not tell an unknown name (or a local
    /// executor's) from a wrong secret.
    pub async fn authenticate_executor(
        &self,
        name: &str,
        secret: &str,
    ) -> Result<Result<Executor, AgentAuthError>, StoreError> {
        let presented = executor_secret_hash(secret);
        let row = sqlx::query("SELECT id, name, machine, run_as, kind, secret_hash FROM executors WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await?;
        let (executor, stored): (Option<Executor>, Option<String>) = match &row {
            Some(row) => (Some(executor_from_row(row)?), row.try_get("secret_hash")?),
            None => (None, None),
        };
        // No stored hash (unknown, local, or a remote executor from before secrets existed):
        // compared with a stand-in all the same, and nothing matches.
        let matches = same_bytes(stored.as_deref().unwrap_or(NO_SECRET_HASH).as_bytes(), presented.as_bytes())
            && stored.is_some();
        Ok(match executor {
            // The gateway host's own name is never an agent's, whether or not a row names it.
            None if name == crate::decl::ExecutorId::LOCAL => Err(AgentAuthError::NotRemote),
            None => Err(AgentAuthError::Unknown),
            Some(executor) if executor.kind != "remote" => Err(AgentAuthError::NotRemote),
            Some(executor) if matches => Ok(executor),
            Some(_) => Err(AgentAuthError::WrongSecret),
        })
    }

    /// name -> secret hash of every remote executor (one query; the gateway polls it to drop
    /// agents whose executor was deleted or whose secret was rotated).
    pub async fn remote_executor_secrets(&self) -> Result<HashMap<String, String>, StoreError> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT name, secret_hash FROM executors WHERE kind = 'remote' AND secret_hash IS NOT NULL")
                .fetch_all(self.pool())
                .await?;
        Ok(rows.into_iter().collect())
    }
}

/// Stores one server declaration under `name` in the tenant. The declaration must already
/// have been validated by the declaration parser.
pub async fn create_entity(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    name: &str,
    declaration: &serde_json::Value,
) -> Result<(), StoreError> {
    let server = parse_entity_name(name)?;
    if !declaration.is_object() {
        return Err(StoreError::Invalid { field: "declaration", message: "must be a JSON object".into() });
    }
    let tenant = tenant_id_by_slug(conn, tenant_slug).await?;
    sqlx::query(
        "INSERT INTO mcp_server_entities (id, tenant_id, name, server, declaration, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(uuid::Uuid::now_v7().to_string())
    .bind(tenant)
    .bind(name)
    .bind(server)
    .bind(declaration.to_string())
    .bind(now_millis())
    .execute(conn)
    .await
    .map_err(|e| unique_conflict(e, || format!("entity `{name}` already exists in `{tenant_slug}`")))?;
    Ok(())
}

pub async fn list_entities(conn: &mut AnyConnection, tenant_slug: &str) -> Result<Vec<EntityRow>, StoreError> {
    let tenant = tenant_id_by_slug(conn, tenant_slug).await?;
    let rows =
        sqlx::query("SELECT name, server, declaration FROM mcp_server_entities WHERE tenant_id = $1 ORDER BY name")
            .bind(tenant)
            .fetch_all(conn)
            .await?;
    rows.iter()
        .map(|r| {
            Ok(EntityRow {
                name: r.try_get("name")?,
                server: r.try_get("server")?,
                declaration: r.try_get("declaration")?,
            })
        })
        .collect()
}

pub async fn delete_entity(conn: &mut AnyConnection, tenant_slug: &str, name: &str) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(conn, tenant_slug).await?;
    let done = sqlx::query("DELETE FROM mcp_server_entities WHERE tenant_id = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .execute(conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("entity `{name}` does not exist in `{tenant_slug}`")));
    }
    Ok(())
}

/// Binds (or rebinds) a tenant's server id to an executor: `local`, or a remote executor the
/// tenant owns. The server's tools and prompts are exposed with the `server__` prefix; a
/// rebinding restores the prefix (see [`bind_server_with_prefix`]).
pub async fn bind_server(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    server: &str,
    executor: &str,
) -> Result<(), StoreError> {
    bind_server_with_prefix(conn, tenant_slug, server, executor, None).await
}

/// The native tool whose name starts with `server__`, if any: it would read as a tool of that
/// server. (The registry refuses `__` in every tool it serves, so today there is none; kept so
/// that an unprefixed binding stays safe should that ever change.)
fn native_tool_under<'a>(server: &str, native: &[&'a str]) -> Option<&'a str> {
    let prefix = format!("{server}__");
    native.iter().copied().find(|name| name.starts_with(&prefix))
}

/// [`bind_server`], choosing whether the server's tools and prompts keep the `server__` prefix
/// (`unprefixed_beside`: `None`) or are exposed under their own names (`binding set
/// --no-prefix`: `Some` of the gateway's native tool names, which the store does not know).
///
/// An unprefixed binding is refused, naming the field `prefix`, when another server of the
/// tenant is already bound unprefixed (one per tenant, so two servers' names never meet; a
/// unique index enforces it too) or when a native tool's name starts with `SERVER__`. Whether
/// an upstream's own names collide with native ones is only known once it runs: the runtime
/// checks that when it lists them.
pub async fn bind_server_with_prefix(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    server: &str,
    executor: &str,
    unprefixed_beside: Option<&[&str]>,
) -> Result<(), StoreError> {
    validate_server_id(server)?;
    let prefixed = unprefixed_beside.is_none();
    if let Some(native) = unprefixed_beside
        && let Some(tool) = native_tool_under(server, native)
    {
        return Err(StoreError::Invalid {
            field: "prefix",
            message: format!("native tool `{tool}` starts with `{server}__`: `{server}` must keep its prefix"),
        });
    }
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    if !prefixed {
        let other: Option<String> = sqlx::query_scalar(
            "SELECT server FROM mcp_server_bindings WHERE tenant_id = $1 AND prefixed = 0 AND server <> $2",
        )
        .bind(tenant)
        .bind(server)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(other) = other {
            return Err(StoreError::Invalid {
                field: "prefix",
                message: format!(
                    "`{other}` is already bound without a prefix in `{tenant_slug}`: one server per tenant \
                     may drop it (rebind `{other}` without --no-prefix first)"
                ),
            });
        }
    }
    let (executor_id, kind): (String, String) = sqlx::query_as("SELECT id, kind FROM executors WHERE name = $1")
        .bind(executor)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("executor `{executor}` does not exist")))?;
    // A remote executor runs code on its owners' machines: only they may bind to it. Anything
    // but `local` needs an owner row (fail closed).
    if kind != "local" {
        require_owner(&mut *conn, &executor_id, tenant, tenant_slug, executor).await?;
    }
    sqlx::query(
        "INSERT INTO mcp_server_bindings (tenant_id, server, executor_id, created_at, prefixed) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (tenant_id, server) DO UPDATE SET executor_id = excluded.executor_id, prefixed = excluded.prefixed",
    )
    .bind(tenant)
    .bind(server)
    .bind(executor_id)
    .bind(now_millis())
    .bind(i64::from(prefixed))
    .execute(conn)
    .await
    // The index that keeps one unprefixed server per tenant, should another binding have
    // committed since the check above.
    .map_err(|e| unique_conflict(e, || format!("another server is already bound without a prefix in `{tenant_slug}`")))?;
    Ok(())
}

pub async fn unbind_server(conn: &mut AnyConnection, tenant_slug: &str, server: &str) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let done = sqlx::query("DELETE FROM mcp_server_bindings WHERE tenant_id = $1 AND server = $2")
        .bind(tenant)
        .bind(server)
        .execute(conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("server `{server}` is not bound in `{tenant_slug}`")));
    }
    Ok(())
}

pub async fn list_bindings(conn: &mut AnyConnection, tenant_slug: &str) -> Result<Vec<BindingRow>, StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let rows = sqlx::query(
        "SELECT b.server, x.name, b.prefixed, b.pin FROM mcp_server_bindings b JOIN executors x ON x.id = b.executor_id \
         WHERE b.tenant_id = $1 ORDER BY b.server",
    )
    .bind(tenant)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            let prefixed: i64 = r.try_get(2)?;
            let pin: String = r.try_get(3)?;
            let pin = crate::store::definitions::PinMode::parse(&pin)
                .ok_or_else(|| StoreError::Invalid { field: "pin", message: format!("stored mode `{pin}`") })?;
            Ok(BindingRow { server: r.try_get(0)?, executor: r.try_get(1)?, prefixed: prefixed != 0, pin })
        })
        .collect()
}

/// One statement: the tenant's binding of `server`, its executor, and the first of the
/// three entity names built from THAT executor's machine and user:
/// `machines/{machine}/profile/mcp-servers/{server}`, then `users/{user}/mcp-servers/{server}`,
/// then `defaults/mcp-servers/{server}`. Each candidate is a point lookup on the unique
/// (tenant_id, name) index. A binding to a remote executor the tenant does not own (any more)
/// is ignored. `None`: the server is not bound, or no entity matches.
const RESOLVE: &str = "\
SELECT e.name AS entity, e.declaration, x.id, x.name, x.machine, x.run_as, x.kind, b.prefixed, \
       CASE WHEN e.name = 'machines/' || x.machine || '/profile/mcp-servers/' || b.server THEN 1 \
            WHEN e.name = 'users/' || x.run_as || '/mcp-servers/' || b.server THEN 2 \
            ELSE 3 END AS rank \
  FROM mcp_server_bindings b \
  JOIN executors x ON x.id = b.executor_id \
  JOIN mcp_server_entities e ON e.tenant_id = b.tenant_id \
   AND e.name IN ('machines/' || x.machine || '/profile/mcp-servers/' || b.server, \
                  'users/' || x.run_as || '/mcp-servers/' || b.server, \
                  'defaults/mcp-servers/' || b.server) \
 WHERE b.tenant_id = $1 AND b.server = $2 \
   AND (x.kind = 'local' OR EXISTS (SELECT 1 FROM executor_owners o \
                                     WHERE o.executor_id = x.id AND o.tenant_id = b.tenant_id)) \
 ORDER BY rank LIMIT 1";

/// [`RESOLVE`] for every server the tenant bound: best rank first within each server.
const RESOLVE_ALL: &str = "\
SELECT b.server, e.name AS entity, e.declaration, x.id, x.name, x.machine, x.run_as, x.kind, b.prefixed, \
       CASE WHEN e.name = 'machines/' || x.machine || '/profile/mcp-servers/' || b.server THEN 1 \
            WHEN e.name = 'users/' || x.run_as || '/mcp-servers/' || b.server THEN 2 \
            ELSE 3 END AS rank \
  FROM mcp_server_bindings b \
  JOIN executors x ON x.id = b.executor_id \
  JOIN mcp_server_entities e ON e.tenant_id = b.tenant_id \
   AND e.name IN ('machines/' || x.machine || '/profile/mcp-servers/' || b.server, \
                  'users/' || x.run_as || '/mcp-servers/' || b.server, \
                  'defaults/mcp-servers/' || b.server) \
 WHERE b.tenant_id = $1 \
   AND (x.kind = 'local' OR EXISTS (SELECT 1 FROM executor_owners o \
                                     WHERE o.executor_id = x.id AND o.tenant_id = b.tenant_id)) \
 ORDER BY b.server, rank";

fn entity_from_row(r: &sqlx::any::AnyRow) -> Result<ResolvedEntity, StoreError> {
    // 0 or 1 (the table's CHECK): a BIGINT, which both databases read alike through `Any`.
    let prefixed: i64 = r.try_get("prefixed")?;
    Ok(ResolvedEntity {
        prefixed: prefixed != 0,
        entity: r.try_get("entity")?,
        declaration: r.try_get("declaration")?,
        executor: Executor {
            id: r.try_get("id")?,
            name: r.try_get("name")?,
            machine: r.try_get("machine")?,
            run_as: r.try_get("run_as")?,
            kind: r.try_get("kind")?,
        },
    })
}

impl Db {
    /// Resolves `server` for `tenant` in the context of the executor the tenant bound it to.
    pub async fn resolve_server(&self, tenant: TenantId, server: &str) -> Result<Option<ResolvedEntity>, StoreError> {
        let row = sqlx::query(RESOLVE).bind(tenant).bind(server).fetch_optional(self.pool()).await?;
        row.map(|r| entity_from_row(&r)).transpose()
    }

    /// Every server the tenant bound, each resolved like [`Db::resolve_server`] in its bound
    /// executor's context, in one query; sorted by server id. Bound servers without a matching
    /// entity are absent.
    pub async fn resolve_servers(&self, tenant: TenantId) -> Result<Vec<(String, ResolvedEntity)>, StoreError> {
        let rows = sqlx::query(RESOLVE_ALL).bind(tenant).fetch_all(self.pool()).await?;
        let mut out: Vec<(String, ResolvedEntity)> = Vec::new();
        for r in rows {
            let server: String = r.try_get("server")?;
            // Rows come best rank first within a server: keep the first of each.
            if out.last().is_some_and(|(s, _)| *s == server) {
                continue;
            }
            out.push((server, entity_from_row(&r)?));
        }
        Ok(out)
    }

    /// Every server id the tenant has bound, sorted.
    pub async fn bound_servers(&self, tenant: TenantId) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar("SELECT server FROM mcp_server_bindings WHERE tenant_id = $1 ORDER BY server")
            .bind(tenant)
            .fetch_all(self.pool())
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_names_follow_the_three_places() {
        assert_eq!(parse_entity_name("machines/build-01/profile/mcp-servers/db").unwrap(), "db");
        assert_eq!(parse_entity_name("users/ci/mcp-servers/db").unwrap(), "db");
        assert_eq!(parse_entity_name("defaults/mcp-servers/db").unwrap(), "db");
        for bad in [
            "machines/a/b/profile/mcp-servers/db",
            "machines/../profile/mcp-servers/db",
            "users//mcp-servers/db",
            "defaults/mcp-servers/a__b",
            "defaults/mcp-servers/",
            "defaults/db",
            "users/x/mcp-servers/db/extra",
        ] {
            assert!(parse_entity_name(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn tool_and_prompt_grants_are_a_star_or_one_name() {
        let (longest, too_long) = ("x".repeat(128), "x".repeat(129));
        for kind in [GrantKind::Tool, GrantKind::Prompt] {
            for good in ["*", "read_file", "db.query", "get-rows", "a__b", longest.as_str()] {
                assert!(validate_grant_name(kind, good).is_ok(), "{kind} {good} should be accepted");
            }
            for bad in
                ["", "**", "a*", "read file", "a/b", "tool\n", "\u{e9}t\u{e9}", "test://docs/*", too_long.as_str()]
            {
                assert!(
                    matches!(validate_grant_name(kind, bad), Err(StoreError::Invalid { field: "name", .. })),
                    "{kind} {bad:?} should be refused naming `name`"
                );
            }
        }
    }

    #[test]
    fn resource_grants_are_a_star_a_uri_or_a_uri_prefix() {
        let longest = format!("test://{}", "d".repeat(GRANT_URI_MAX - 7));
        let too_long = format!("{longest}x");
        let longest_prefix = format!("test://{}*", "d".repeat(GRANT_URI_MAX - 8));
        for good in [
            "*",
            "test://docs/a.md",
            "test://docs/*",
            "file:///srv/notes/today.txt",
            "urn:isbn:0451450523",
            "x:",
            "x:*",
            "git+ssh://host/repo",
            "A1.b-c+d:thing",
            "test://caf\u{e9}/men\u{fc}",
            "test://q?a=1&b=%20#frag",
            longest.as_str(),
            longest_prefix.as_str(),
        ] {
            assert!(validate_grant_name(GrantKind::Resource, good).is_ok(), "{good} should be accepted");
        }
        for bad in [
            "",
            "**",
            "docs/a.md",
            "://docs",
            ":x",
            "1test://docs",
            "te_st://docs",
            "te st://docs",
            "test ://docs",
            "test://docs/ a",
            "test://docs/\ta",
            "test://docs/\n",
            "test://docs/\u{7}",
            "test://docs/\u{85}",
            "test://docs/\u{a0}",
            "test://docs/\u{2028}",
            "test://*/docs",
            "test://docs/**",
            "*test://docs",
            "test*",
            "*:x",
            too_long.as_str(),
        ] {
            assert!(
                matches!(validate_grant_name(GrantKind::Resource, bad), Err(StoreError::Invalid { field: "name", .. })),
                "{bad:?} should be refused naming `name`"
            );
        }
    }

    #[test]
    fn grants_match_a_star_the_name_or_for_resources_a_prefix() {
        for kind in GrantKind::ALL {
            assert!(grant_matches(kind, "*", "anything"), "{kind}");
            assert!(grant_matches(kind, "*", ""), "{kind}");
            assert!(grant_matches(kind, "read_file", "read_file"), "{kind}");
            assert!(!grant_matches(kind, "read_file", "read_files"), "{kind}");
            assert!(!grant_matches(kind, "read_file", "read"), "{kind}");
            assert!(!grant_matches(kind, "read_file", "READ_FILE"), "{kind}: names are case-sensitive");
        }
        // A final `*` is a prefix for resources only: tool and prompt names never hold one.
        for kind in [GrantKind::Tool, GrantKind::Prompt] {
            assert!(!grant_matches(kind, "read*", "read_file"), "{kind}");
        }
        let r = GrantKind::Resource;
        assert!(grant_matches(r, "test://docs/*", "test://docs/a.md"));
        assert!(grant_matches(r, "test://docs/*", "test://docs/"));
        assert!(grant_matches(r, "test://docs/*", "test://docs/sub/b.md"));
        assert!(!grant_matches(r, "test://docs/*", "test://docs"), "the prefix includes the `/`");
        assert!(!grant_matches(r, "test://docs/*", "test://other/a.md"));
        assert!(!grant_matches(r, "test://docs/*", "TEST://docs/a.md"), "compared as text");
        assert!(!grant_matches(r, "test://docs/*", "x-test://docs/a.md"), "a prefix anchors at the start");
        assert!(grant_matches(r, "test://docs/a.md", "test://docs/a.md"));
        assert!(!grant_matches(r, "test://docs/a.md", "test://docs/a.md.bak"), "an exact URI is no prefix");
    }

    #[test]
    fn grant_kinds_read_and_print_lowercase() {
        for kind in GrantKind::ALL {
            assert_eq!(kind.as_str().parse::<GrantKind>().unwrap(), kind);
            assert_eq!(kind.to_string(), kind.as_str());
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(kind.as_str()));
            let parsed: GrantKind = serde_json::from_value(serde_json::json!(kind.as_str())).unwrap();
            assert_eq!(parsed, kind);
            assert_eq!(
                <GrantKind as clap::ValueEnum>::from_str(kind.as_str(), false).unwrap(),
                kind,
                "clap reads the same words"
            );
        }
        for bad in ["Tool", "tools", "", "all"] {
            assert!(bad.parse::<GrantKind>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_native_tool_under_the_server_id_is_found() {
        let native = ["whoami", "files__read", "list_flocks"];
        assert_eq!(native_tool_under("files", &native), Some("files__read"));
        assert_eq!(native_tool_under("file", &native), None, "`file__` is not a prefix of `files__read`");
        assert_eq!(native_tool_under("whoami", &native), None, "the bare name is the runtime's check");
        let real: Vec<&str> = crate::tools::TOOLS.iter().map(|t| t.name).collect();
        for tool in &real {
            assert!(!tool.contains("__"), "native tools never hold `__`: {tool}");
        }
    }
}
