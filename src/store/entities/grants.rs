//! Grants: which roles of a tenant may use which of a bound server's tools, prompts and
//! resources, their names and patterns checked before they are written.

use super::*;

/// What a grant covers on its server: upstream tools (the default, and what every grant made
/// before kinds existed is), prompts, or resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GrantKind {
    Tool,
    Prompt,
    Resource,
}

impl GrantKind {
    pub const ALL: [GrantKind; 3] = [GrantKind::Tool, GrantKind::Prompt, GrantKind::Resource];

    pub fn as_str(self) -> &'static str {
        match self {
            GrantKind::Tool => "tool",
            GrantKind::Prompt => "prompt",
            GrantKind::Resource => "resource",
        }
    }
}

impl std::fmt::Display for GrantKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown grant kind `{0}` (expected tool, prompt or resource)")]
pub struct UnknownGrantKind(pub String);

impl std::str::FromStr for GrantKind {
    type Err = UnknownGrantKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GrantKind::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| UnknownGrantKind(s.to_owned()))
    }
}

/// One entry of a tenant's allow list of upstream tools, prompts and resources: `role` may use
/// the `kind` thing called `name` on `server` (`*`: every one of that kind; for a resource, a
/// final `*` also covers every URI that begins with what precedes it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantRow {
    pub server: String,
    pub role: Role,
    pub kind: GrantKind,
    pub name: String,
    /// Who confirms each call the grant allows (tool grants only); `None`: nobody.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm: Option<Confirm>,
}

impl GrantRow {
    /// Whether this grant lets one of `roles` use the `kind` thing `name` of `server`.
    pub fn covers(&self, server: &str, kind: GrantKind, name: &str, roles: &[Role]) -> bool {
        self.server == server
            && self.kind == kind
            && roles.contains(&self.role)
            && grant_matches(kind, &self.name, name)
    }
}

/// The `name` of a grant that covers everything of its kind on its server.
pub const GRANT_ALL: &str = "*";

/// The longest resource URI (or URI prefix) a grant may name, in bytes.
pub const GRANT_URI_MAX: usize = 2048;

/// The name of a grant of `kind`, refused naming the field `name`:
/// - tool and prompt: `*`, or one name as the upstream spells it (before the gateway's
///   `server__` prefix): 1-128 letters, digits, `_`, `-` or `.`;
/// - resource: `*`, an exact URI, or a URI prefix ending in `*`. A URI starts with a scheme
///   (RFC 3986: a letter, then letters, digits, `+`, `-` or `.`) and `:`, is at most 2048
///   bytes, and holds no whitespace, no control character and no `*` but one final one.
pub fn validate_grant_name(kind: GrantKind, value: &str) -> Result<(), StoreError> {
    if value == GRANT_ALL {
        return Ok(());
    }
    let problem = match kind {
        GrantKind::Tool | GrantKind::Prompt => {
            let ok = !value.is_empty()
                && value.len() <= 128
                && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            (!ok).then(|| {
                format!(
                    "`{}` must be `*` or 1-128 letters, digits, `_`, `-` or `.` (a {kind} name)",
                    value.escape_debug()
                )
            })
        }
        GrantKind::Resource => resource_pattern_problem(value),
    };
    match problem {
        None => Ok(()),
        Some(message) => Err(StoreError::Invalid { field: "name", message }),
    }
}

/// Why `value` is not a resource URI or URI prefix, if it is not.
pub(super) fn resource_pattern_problem(value: &str) -> Option<String> {
    if value.len() > GRANT_URI_MAX {
        return Some(format!("a resource URI must be at most {GRANT_URI_MAX} bytes (this one is {})", value.len()));
    }
    // Shown escaped: the value may hold the very characters that are refused.
    let shown = value.escape_debug();
    if let Some(c) = value.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Some(format!("`{shown}` holds {:?}: a resource URI has no whitespace or control characters", c));
    }
    let uri = value.strip_suffix('*').unwrap_or(value);
    if uri.contains('*') {
        return Some(format!("`{shown}` may hold `*` only as its last character (a URI prefix)"));
    }
    let scheme = uri.split_once(':').map(|(scheme, _)| scheme).unwrap_or("");
    let mut chars = scheme.chars();
    let scheme_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return Some(format!(
            "`{shown}` must be `*`, a URI (`scheme:...`, the scheme a letter then letters, digits, `+`, `-` or `.`) \
             or a URI prefix ending in `*`"
        ));
    }
    None
}

/// Whether a grant of `kind` named `grant_name` covers the thing called `name`: `*` covers
/// everything of its kind, any other name itself; for resources, a name ending in `*` also
/// covers every URI that begins with what precedes the `*` (compared as text, byte for byte:
/// the gateway does not normalise URIs, so `test://docs/*` covers `test://docs/../x` too if the
/// upstream lists such a URI).
pub fn grant_matches(kind: GrantKind, grant_name: &str, name: &str) -> bool {
    if grant_name == GRANT_ALL || grant_name == name {
        return true;
    }
    match (kind, grant_name.strip_suffix('*')) {
        (GrantKind::Resource, Some(prefix)) => name.starts_with(prefix),
        _ => false,
    }
}

/// Grants `role` the use of tool `tool` (or `*`) of a server the tenant has bound: [`grant`]
/// of kind tool.
pub async fn grant_tool(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    server: &str,
    role: Role,
    tool: &str,
) -> Result<(), StoreError> {
    grant(conn, tenant_slug, server, role, GrantKind::Tool, tool).await
}

/// Grants `role` the use of the `kind` thing `name` (see [`validate_grant_name`]) of a server
/// the tenant has bound. The same name may be granted once per kind.
pub async fn grant(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    server: &str,
    role: Role,
    kind: GrantKind,
    name: &str,
) -> Result<(), StoreError> {
    grant_confirmed(conn, tenant_slug, server, role, kind, name, None).await
}

/// [`grant`], each call it allows confirmed by `confirm` (a tool grant only: prompts and
/// resources are read, not called).
pub async fn grant_confirmed(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    server: &str,
    role: Role,
    kind: GrantKind,
    name: &str,
    confirm: Option<Confirm>,
) -> Result<(), StoreError> {
    validate_server_id(server)?;
    validate_grant_name(kind, name)?;
    if confirm.is_some() && kind != GrantKind::Tool {
        return Err(StoreError::Invalid {
            field: "confirm",
            message: format!("only a tool grant can require a confirmation (this one is a {kind} grant)"),
        });
    }
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    // Inserted from the binding row itself: an unbound server inserts nothing, whether or not
    // the connection enforces foreign keys.
    let done = sqlx::query(
        "INSERT INTO mcp_server_grants (tenant_id, server, role, kind, name, created_at, confirm) \
         SELECT tenant_id, server, $3, $4, $5, $6, $7 FROM mcp_server_bindings WHERE tenant_id = $1 AND server = $2",
    )
    .bind(tenant)
    .bind(server)
    .bind(role.as_str())
    .bind(kind.as_str())
    .bind(name)
    .bind(now_millis())
    .bind(confirm.map(Confirm::as_str))
    .execute(conn)
    .await
    .map_err(|e| {
        unique_conflict(e, || format!("`{role}` already has {kind} `{name}` of `{server}` in `{tenant_slug}`"))
    })?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("server `{server}` is not bound in `{tenant_slug}`")));
    }
    Ok(())
}

/// Revokes a grant of kind tool: [`revoke`].
pub async fn revoke_tool(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    server: &str,
    role: Role,
    tool: &str,
) -> Result<(), StoreError> {
    revoke(conn, tenant_slug, server, role, GrantKind::Tool, tool).await
}

/// Revokes exactly one grant (`*` and a prefix are grants of their own here, not patterns).
pub async fn revoke(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    server: &str,
    role: Role,
    kind: GrantKind,
    name: &str,
) -> Result<(), StoreError> {
    validate_grant_name(kind, name)?;
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let done = sqlx::query(
        "DELETE FROM mcp_server_grants \
         WHERE tenant_id = $1 AND server = $2 AND role = $3 AND kind = $4 AND name = $5",
    )
    .bind(tenant)
    .bind(server)
    .bind(role.as_str())
    .bind(kind.as_str())
    .bind(name)
    .execute(conn)
    .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!(
            "`{role}` has no grant of {kind} `{name}` of `{server}` in `{tenant_slug}`"
        )));
    }
    Ok(())
}

pub(super) const GRANTS: &str = "SELECT server, role, kind, name, confirm FROM mcp_server_grants WHERE tenant_id = $1 \
                      ORDER BY server, role, kind, name";

pub(super) fn grant_from_row(row: &sqlx::any::AnyRow) -> Result<GrantRow, StoreError> {
    let role: String = row.try_get("role")?;
    let kind: String = row.try_get("kind")?;
    let confirm: Option<String> = row.try_get("confirm")?;
    Ok(GrantRow {
        server: row.try_get("server")?,
        // The table's CHECKs admit only the five roles and the three kinds; anything else is a
        // broken database.
        role: role.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        kind: kind.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        name: row.try_get("name")?,
        confirm: match confirm {
            None => None,
            Some(text) => Some(
                Confirm::parse(&text)
                    .ok_or_else(|| sqlx::Error::Decode(format!("unknown confirmation `{text}` of a grant").into()))?,
            ),
        },
    })
}

pub async fn list_grants(conn: &mut AnyConnection, tenant_slug: &str) -> Result<Vec<GrantRow>, StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let rows = sqlx::query(GRANTS).bind(tenant).fetch_all(conn).await?;
    rows.iter().map(grant_from_row).collect()
}

impl Db {
    /// Every grant of the tenant, in one query, ordered by server, role, kind and name: the
    /// allow list the proxy applies to upstream tools, prompts and resources (no grant, no
    /// access).
    pub async fn upstream_grants(&self, tenant: TenantId) -> Result<Vec<GrantRow>, StoreError> {
        let rows = sqlx::query(GRANTS).bind(tenant).fetch_all(self.pool()).await?;
        rows.iter().map(grant_from_row).collect()
    }
}

/// Refuses (naming the field `executor`) unless tenant `tenant` owns executor `executor_id`
/// (named `name`): what binding a server to it or selecting roots on it requires.
pub(crate) async fn require_owner(
    conn: &mut AnyConnection,
    executor_id: &str,
    tenant: TenantId,
    tenant_slug: &str,
    name: &str,
) -> Result<(), StoreError> {
    let owned: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM executor_owners WHERE executor_id = $1 AND tenant_id = $2")
            .bind(executor_id)
            .bind(tenant)
            .fetch_one(&mut *conn)
            .await?;
    if owned == 0 {
        return Err(StoreError::Invalid {
            field: "executor",
            message: format!("tenant `{tenant_slug}` does not own remote executor `{name}`"),
        });
    }
    Ok(())
}
