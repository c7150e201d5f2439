//! Reading resources: one by its key ([`Target`]) or a page of a collection
//! ([`Collection`]). Every read names what it needs; [`super::Admin`] checks that first.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;
use serde_json::Value;
use sqlx::{AnyConnection, Row as _};

use super::views::*;
use super::{AdminError, Need};
use crate::store::{StoreError, TenantId, entities, roots};

/// One resource, by its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tenant {
        slug: String,
    },
    User {
        tenant: String,
        subject: String,
    },
    Flock {
        tenant: String,
        name: String,
    },
    Assignment {
        tenant: String,
        subject: String,
        flock: String,
    },
    Executor {
        name: String,
    },
    Entity {
        tenant: String,
        name: String,
    },
    Binding {
        tenant: String,
        server: String,
    },
    Grant {
        tenant: String,
        id: String,
    },
    RootAllowance {
        tenant: String,
        id: String,
    },
    /// An upstream OAuth credential: the tenant's for `server`, or `user`'s own.
    Credential {
        tenant: String,
        server: String,
        user: Option<String>,
    },
    /// The tenant's provisioning of users on first sight.
    Provisioning {
        tenant: String,
    },
    /// An identity provider the tenant trusts, by its issuer.
    Issuer {
        tenant: String,
        issuer: String,
    },
    /// One of the tenant's Cedar policies.
    Policy {
        tenant: String,
        id: String,
    },
    /// One of the platform's Cedar policies.
    PlatformPolicy {
        id: String,
    },
    /// How the tenant's policies take part (`enforce` or `log_only`).
    PolicyMode {
        tenant: String,
    },
    /// One definition of an upstream tool, prompt or resource template of a pinned binding.
    Definition {
        tenant: String,
        id: String,
    },
    /// One call waiting for (or decided by) an approver.
    Approval {
        tenant: String,
        id: String,
    },
}

/// A collection of resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Collection {
    Tenants,
    Users {
        tenant: String,
    },
    Flocks {
        tenant: String,
    },
    Assignments {
        tenant: String,
    },
    Executors,
    Entities {
        tenant: String,
    },
    Bindings {
        tenant: String,
    },
    Grants {
        tenant: String,
    },
    RootAllowances {
        tenant: String,
        executor: Option<String>,
    },
    Credentials {
        tenant: String,
    },
    Issuers {
        tenant: String,
    },
    Policies {
        tenant: String,
    },
    PlatformPolicies,
    /// The definitions of a tenant's pinned bindings (only those in `state`, when given).
    Definitions {
        tenant: String,
        state: Option<crate::store::definitions::DefinitionState>,
    },
    /// The calls of a tenant waiting for (or decided by) an approver (only those in `state`,
    /// when given).
    Approvals {
        tenant: String,
        state: Option<crate::store::approvals::ApprovalState>,
    },
}

/// The characters a path segment keeps as they are: RFC 3986's unreserved ones.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn seg(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

fn to_value<T: Serialize>(view: T) -> Value {
    // The views are plain structs of text, numbers and JSON values: they always serialize.
    serde_json::to_value(view).unwrap_or(Value::Null)
}

/// A grant's id: its key (server, role, kind, name), encoded as a cursor is.
pub fn grant_id(server: &str, role: &str, kind: &str, name: &str) -> String {
    cursor_after(&[server, role, kind, name])
}

/// A grant's id as policy decisions name it (`grant/<id>`): the permit a grant is.
pub fn grant_policy_id(grant: &crate::store::entities::GrantRow) -> String {
    crate::policy::grant_policy_id(&grant_id(&grant.server, grant.role.as_str(), grant.kind.as_str(), &grant.name))
}

/// The key a grant id stands for.
pub fn grant_key(id: &str) -> Option<[String; 4]> {
    let query = PageQuery { limit: None, after: Some(id.to_owned()) };
    let parts = query.cursor(4).ok()??;
    parts.try_into().ok()
}

/// The tenant's id, or `None` when there is no such tenant.
async fn tenant_of(conn: &mut AnyConnection, slug: &str) -> Result<Option<TenantId>, StoreError> {
    Ok(sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1").bind(slug).fetch_optional(conn).await?)
}

impl Target {
    /// What reading it needs.
    pub fn need(&self) -> Need<'_> {
        match self {
            Target::Tenant { slug } => Need::Manage(slug),
            Target::Executor { .. } | Target::PlatformPolicy { .. } => Need::Platform,
            Target::Entity { tenant, .. } => Need::PlatformOver(tenant),
            Target::Policy { tenant, .. } | Target::PolicyMode { tenant } | Target::Definition { tenant, .. } => {
                Need::Inspect(tenant)
            }
            Target::User { tenant, .. }
            | Target::Flock { tenant, .. }
            | Target::Assignment { tenant, .. }
            | Target::Binding { tenant, .. }
            | Target::Grant { tenant, .. }
            | Target::RootAllowance { tenant, .. }
            | Target::Credential { tenant, .. }
            | Target::Provisioning { tenant } => Need::Manage(tenant),
            Target::Issuer { tenant, .. } => Need::Inspect(tenant),
            Target::Approval { tenant, .. } => Need::Approvals(tenant),
        }
    }

    /// The tenant it belongs to (none for an executor).
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Target::Tenant { slug } => Some(slug),
            Target::Executor { .. } | Target::PlatformPolicy { .. } => None,
            Target::Policy { tenant, .. } | Target::PolicyMode { tenant } | Target::Definition { tenant, .. } => {
                Some(tenant)
            }
            Target::User { tenant, .. }
            | Target::Flock { tenant, .. }
            | Target::Assignment { tenant, .. }
            | Target::Entity { tenant, .. }
            | Target::Binding { tenant, .. }
            | Target::Grant { tenant, .. }
            | Target::RootAllowance { tenant, .. }
            | Target::Credential { tenant, .. }
            | Target::Provisioning { tenant }
            | Target::Approval { tenant, .. }
            | Target::Issuer { tenant, .. } => Some(tenant),
        }
    }

    /// Its path below `/admin/v1/`, each segment percent-encoded.
    pub fn path(&self) -> String {
        let t = |tenant: &str, rest: String| format!("tenants/{}/{rest}", seg(tenant));
        match self {
            Target::Tenant { slug } => format!("tenants/{}", seg(slug)),
            Target::User { tenant, subject } => t(tenant, format!("users/{}", seg(subject))),
            Target::Flock { tenant, name } => t(tenant, format!("flocks/{}", seg(name))),
            Target::Assignment { tenant, subject, flock } => {
                t(tenant, format!("assignments/{}/{}", seg(subject), seg(flock)))
            }
            Target::Executor { name } => format!("executors/{}", seg(name)),
            Target::Entity { tenant, name } => t(tenant, format!("entities/{}", seg(name))),
            Target::Binding { tenant, server } => t(tenant, format!("bindings/{}", seg(server))),
            Target::Grant { tenant, id } => t(tenant, format!("grants/{}", seg(id))),
            Target::RootAllowance { tenant, id } => t(tenant, format!("root-allowances/{}", seg(id))),
            Target::Credential { tenant, server, user } => match user {
                Some(user) => t(tenant, format!("oauth/credentials/{}?user={}", seg(server), seg(user))),
                None => t(tenant, format!("oauth/credentials/{}", seg(server))),
            },
            Target::Provisioning { tenant } => t(tenant, "provisioning".into()),
            // The issuer is a URL: one segment, its slashes and colon percent-encoded.
            Target::Issuer { tenant, issuer } => t(tenant, format!("issuers/{}", seg(issuer))),
            Target::Policy { tenant, id } => t(tenant, format!("policies/{}", seg(id))),
            Target::PlatformPolicy { id } => format!("platform/policies/{}", seg(id)),
            Target::PolicyMode { tenant } => t(tenant, "policy-mode".into()),
            Target::Definition { tenant, id } => t(tenant, format!("definitions/{}", seg(id))),
            Target::Approval { tenant, id } => t(tenant, format!("approvals/{}", seg(id))),
        }
    }

    /// What a NotFound says of it.
    pub fn missing(&self) -> String {
        match self {
            Target::Tenant { slug } => format!("tenant `{slug}` does not exist"),
            Target::User { subject, .. } => format!("user `{subject}` does not exist in this tenant"),
            Target::Flock { name, .. } => format!("flock `{name}` does not exist in this tenant"),
            Target::Assignment { subject, flock, .. } => format!("`{subject}` is not assigned to `{flock}`"),
            Target::Executor { name } => format!("executor `{name}` does not exist"),
            Target::Entity { name, .. } => format!("entity `{name}` does not exist in this tenant"),
            Target::Binding { server, .. } => format!("server `{server}` is not bound in this tenant"),
            Target::Grant { id, .. } => format!("grant `{id}` does not exist in this tenant"),
            Target::RootAllowance { id, .. } => format!("root allowance `{id}` does not exist in this tenant"),
            Target::Credential { server, .. } => format!("no credential stored for `{server}` of that owner"),
            Target::Provisioning { .. } => "this tenant does not provision users on first sight".into(),
            Target::Issuer { issuer, .. } => format!("this tenant does not trust issuer `{issuer}`"),
            Target::Policy { id, .. } => format!("policy `{id}` does not exist in this tenant"),
            Target::PlatformPolicy { id } => format!("platform policy `{id}` does not exist"),
            Target::PolicyMode { tenant } => format!("tenant `{tenant}` does not exist"),
            Target::Definition { id, .. } => format!("definition `{id}` does not exist in this tenant"),
            Target::Approval { id, .. } => format!("approval `{id}` does not exist in this tenant"),
        }
    }

    /// Its representation, or `None` when it does not exist.
    pub async fn view(
        &self,
        conn: &mut AnyConnection,
        vocabulary: &super::policies::PolicyVocabulary,
    ) -> Result<Option<Value>, AdminError> {
        if let Target::PlatformPolicy { id } = self {
            let views =
                super::policies::views(conn, crate::store::admin::platform_chain(), None, &vocabulary.claims).await?;
            return Ok(views.into_iter().find(|p| p.id == *id).map(to_value));
        }
        if let Target::Tenant { slug } = self {
            let row =
                sqlx::query("SELECT slug, name, status, created_at, retired_at, org_id, audit_write_ahead FROM tenants WHERE slug = $1")
                    .bind(slug)
                    .fetch_optional(&mut *conn)
                    .await?;
            return row.map(|r| tenant_row(&r).map(to_value)).transpose();
        }
        if let Target::Executor { name } = self {
            return Ok(executors(conn, Some(name)).await?.into_iter().next().map(to_value));
        }
        let Some(slug) = self.tenant() else { return Ok(None) };
        let Some(tenant) = tenant_of(&mut *conn, slug).await? else { return Ok(None) };
        let view = match self {
            Target::User { subject, .. } => users(conn, tenant, Some(subject), None, 1).await?.pop().map(to_value),
            Target::Flock { name, .. } => {
                flocks(conn, tenant).await?.into_iter().find(|f| f.name == *name).map(to_value)
            }
            Target::Assignment { subject, flock, .. } => {
                let found: Option<(String, String)> = sqlx::query_as(
                    "SELECT u.subject, f.name FROM flock_assignments a \
                       JOIN users u ON u.id = a.user_id JOIN flocks f ON f.id = a.flock_id \
                      WHERE a.tenant_id = $1 AND u.subject = $2 AND f.name = $3",
                )
                .bind(tenant)
                .bind(subject)
                .bind(flock)
                .fetch_optional(&mut *conn)
                .await?;
                found.map(|(subject, flock)| to_value(AssignmentView { subject, flock }))
            }
            Target::Entity { name, .. } => {
                entities(conn, slug).await?.into_iter().find(|e| e.name == *name).map(to_value)
            }
            Target::Binding { server, .. } => {
                bindings(conn, slug).await?.into_iter().find(|b| b.server == *server).map(to_value)
            }
            Target::Grant { id, .. } => grants(conn, slug).await?.into_iter().find(|g| g.id == *id).map(to_value),
            Target::RootAllowance { id, .. } => {
                root_allowances(conn, slug, None).await?.into_iter().find(|a| a.id == *id).map(to_value)
            }
            Target::Credential { server, user, .. } => credentials(conn, tenant)
                .await?
                .into_iter()
                .find(|c| c.server == *server && c.user == *user)
                .map(to_value),
            Target::Provisioning { .. } => crate::store::provisioning::get(conn, tenant).await?.map(|p| {
                to_value(ProvisioningView {
                    role_claim: p.role_claim,
                    roles: p
                        .roles
                        .into_iter()
                        .map(|(group, roles)| (group, roles.iter().map(|r| r.as_str().to_owned()).collect()))
                        .collect(),
                })
            }),
            Target::Issuer { issuer, .. } => {
                issuers(conn, slug).await?.into_iter().find(|i| i.issuer == *issuer).map(to_value)
            }
            Target::Policy { id, .. } => {
                let catalogue = super::policies::catalogue_of(&mut *conn, tenant, slug, vocabulary).await?;
                let views = super::policies::views(conn, tenant, Some(&catalogue), &vocabulary.claims).await?;
                views.into_iter().find(|p| p.id == *id).map(to_value)
            }
            Target::PolicyMode { .. } => {
                let mode = crate::store::policies::policy_mode(conn, tenant).await?;
                Some(serde_json::json!({ "mode": mode }))
            }
            Target::Definition { id, .. } => super::definitions::detail(conn, tenant, id).await?.map(to_value),
            Target::Approval { id, .. } => super::approvals::detail(conn, tenant, id).await?.map(to_value),
            Target::Tenant { .. } | Target::Executor { .. } | Target::PlatformPolicy { .. } => None,
        };
        Ok(view)
    }
}

impl Collection {
    pub fn need(&self) -> Need<'_> {
        match self {
            Collection::Tenants | Collection::Executors | Collection::PlatformPolicies => Need::Platform,
            Collection::Policies { tenant } | Collection::Definitions { tenant, .. } => Need::Inspect(tenant),
            Collection::Entities { tenant } => Need::PlatformOver(tenant),
            Collection::Users { tenant }
            | Collection::Flocks { tenant }
            | Collection::Assignments { tenant }
            | Collection::Bindings { tenant }
            | Collection::Grants { tenant }
            | Collection::RootAllowances { tenant, .. }
            | Collection::Credentials { tenant } => Need::Manage(tenant),
            Collection::Issuers { tenant } => Need::Inspect(tenant),
            Collection::Approvals { tenant, .. } => Need::Approvals(tenant),
        }
    }

    /// One page, in key order.
    pub async fn page(
        &self,
        conn: &mut AnyConnection,
        query: &PageQuery,
        vocabulary: &super::policies::PolicyVocabulary,
    ) -> Result<Page, AdminError> {
        let limit = query.limit()?;
        let tenant = match self {
            Collection::Tenants | Collection::Executors | Collection::PlatformPolicies => None,
            Collection::Users { tenant }
            | Collection::Flocks { tenant }
            | Collection::Assignments { tenant }
            | Collection::Entities { tenant }
            | Collection::Bindings { tenant }
            | Collection::Grants { tenant }
            | Collection::RootAllowances { tenant, .. }
            | Collection::Credentials { tenant }
            | Collection::Issuers { tenant }
            | Collection::Definitions { tenant, .. }
            | Collection::Approvals { tenant, .. }
            | Collection::Policies { tenant } => Some(
                tenant_of(&mut *conn, tenant)
                    .await?
                    .ok_or_else(|| AdminError::NotFound(format!("tenant `{tenant}` does not exist")))?,
            ),
        };
        // Collections that can grow large are paged by the database, on their key; the
        // others (a tenant's flocks, servers, grants, allowances; the executors) are read
        // whole and paged here.
        let keyed: Vec<(Vec<String>, Value)> = match (self, tenant) {
            (Collection::Tenants, _) => {
                let after = query.cursor(1)?.map(|k| k[0].clone()).unwrap_or_default();
                let rows = sqlx::query(
                    "SELECT slug, name, status, created_at, retired_at, org_id, audit_write_ahead FROM tenants \
                     WHERE slug > $1 AND slug <> $2 ORDER BY slug LIMIT $3",
                )
                .bind(after)
                .bind(crate::store::admin::PLATFORM_SLUG)
                .bind(i64::from(limit) + 1)
                .fetch_all(&mut *conn)
                .await?;
                let mut out = Vec::with_capacity(rows.len());
                for r in &rows {
                    let t = tenant_row(r)?;
                    out.push((vec![t.slug.clone()], to_value(t)));
                }
                return Ok(finish(out, limit));
            }
            (Collection::Users { .. }, Some(tenant)) => {
                let after = query.cursor(1)?.map(|k| k[0].clone());
                let users = users(conn, tenant, None, after.as_deref(), limit + 1).await?;
                let out = users.into_iter().map(|u| (vec![u.subject.clone()], to_value(u))).collect();
                return Ok(finish(out, limit));
            }
            (Collection::Assignments { .. }, Some(tenant)) => {
                let (subject, flock) = match query.cursor(2)? {
                    Some(k) => (k[0].clone(), k[1].clone()),
                    None => (String::new(), String::new()),
                };
                let rows: Vec<(String, String)> = sqlx::query_as(
                    "SELECT u.subject, f.name FROM flock_assignments a \
                       JOIN users u ON u.id = a.user_id JOIN flocks f ON f.id = a.flock_id \
                      WHERE a.tenant_id = $1 AND (u.subject > $2 OR (u.subject = $2 AND f.name > $3)) \
                      ORDER BY u.subject, f.name LIMIT $4",
                )
                .bind(tenant)
                .bind(subject)
                .bind(flock)
                .bind(i64::from(limit) + 1)
                .fetch_all(&mut *conn)
                .await?;
                let out = rows
                    .into_iter()
                    .map(|(subject, flock)| {
                        (vec![subject.clone(), flock.clone()], to_value(AssignmentView { subject, flock }))
                    })
                    .collect();
                return Ok(finish(out, limit));
            }
            (Collection::Executors, _) => {
                executors(conn, None).await?.into_iter().map(|x| (vec![x.name.clone()], to_value(x))).collect()
            }
            (Collection::Flocks { .. }, Some(tenant)) => {
                flocks(conn, tenant).await?.into_iter().map(|f| (vec![f.name.clone()], to_value(f))).collect()
            }
            (Collection::Entities { tenant: slug }, Some(_)) => {
                entities(conn, slug).await?.into_iter().map(|e| (vec![e.name.clone()], to_value(e))).collect()
            }
            (Collection::Bindings { tenant: slug }, Some(_)) => {
                bindings(conn, slug).await?.into_iter().map(|b| (vec![b.server.clone()], to_value(b))).collect()
            }
            (Collection::Grants { tenant: slug }, Some(_)) => grants(conn, slug)
                .await?
                .into_iter()
                .map(|g| (vec![g.server.clone(), g.role.clone(), g.kind.clone(), g.name.clone()], to_value(g)))
                .collect(),
            (Collection::RootAllowances { tenant: slug, executor }, Some(_)) => {
                root_allowances(conn, slug, executor.as_deref())
                    .await?
                    .into_iter()
                    .map(|a| (vec![a.executor.clone(), a.base.clone(), a.role.clone(), a.id.clone()], to_value(a)))
                    .collect()
            }
            (Collection::Credentials { .. }, Some(tenant)) => credentials(conn, tenant)
                .await?
                .into_iter()
                .map(|c| (vec![c.server.clone(), c.user.clone().unwrap_or_default()], to_value(c)))
                .collect(),
            (Collection::Issuers { tenant: slug }, Some(_)) => {
                issuers(conn, slug).await?.into_iter().map(|i| (vec![i.issuer.clone()], to_value(i))).collect()
            }
            (Collection::Policies { tenant: slug }, Some(tenant)) => {
                let catalogue = super::policies::catalogue_of(&mut *conn, tenant, slug, vocabulary).await?;
                let views = super::policies::views(conn, tenant, Some(&catalogue), &vocabulary.claims).await?;
                views.into_iter().map(|p| (vec![p.id.clone()], to_value(p))).collect()
            }
            (Collection::PlatformPolicies, _) => {
                let views =
                    super::policies::views(conn, crate::store::admin::platform_chain(), None, &vocabulary.claims)
                        .await?;
                views.into_iter().map(|p| (vec![p.id.clone()], to_value(p))).collect()
            }
            (Collection::Definitions { state, .. }, Some(tenant)) => super::definitions::views(conn, tenant, *state)
                .await?
                .into_iter()
                .map(|d| (vec![d.id.clone()], to_value(d)))
                .collect(),
            // Newest first: the key is (the reverse of) when it was made, then its id.
            (Collection::Approvals { state, .. }, Some(tenant)) => super::approvals::views(conn, tenant, *state)
                .await?
                .into_iter()
                .map(|a| (vec![format!("{:020}", i64::MAX - a.created_at), a.id.clone()], to_value(a)))
                .collect(),
            (_, None) => return Err(AdminError::NotFound("no such collection".into())),
        };
        let mut keyed = keyed;
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let parts = match self {
            Collection::Grants { .. } | Collection::RootAllowances { .. } => 4,
            Collection::Credentials { .. } | Collection::Approvals { .. } => 2,
            _ => 1,
        };
        if let Some(after) = query.cursor(parts)? {
            keyed.retain(|(k, _)| *k > after);
        }
        keyed.truncate(limit as usize + 1);
        Ok(finish(keyed, limit))
    }
}

/// `rows` holds up to `limit + 1` items: a page of `limit`, and a cursor when there is more.
fn finish(mut rows: Vec<(Vec<String>, Value)>, limit: u32) -> Page {
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = if more {
        rows.last().map(|(k, _)| cursor_after(&k.iter().map(String::as_str).collect::<Vec<_>>()))
    } else {
        None
    };
    Page { items: rows.into_iter().map(|(_, v)| v).collect(), next }
}

fn tenant_row(r: &sqlx::any::AnyRow) -> Result<TenantView, AdminError> {
    let retired_at: Option<i64> = r.try_get("retired_at")?;
    Ok(TenantView {
        slug: r.try_get("slug")?,
        name: r.try_get("name")?,
        status: if retired_at.is_some() { "retired".to_owned() } else { r.try_get("status")? },
        created_at: r.try_get("created_at")?,
        retired_at,
        org_id: r.try_get("org_id")?,
        audit_write_ahead: r.try_get::<i64, _>("audit_write_ahead")? != 0,
    })
}

/// Users of a tenant in subject order: the one named `subject`, or up to `limit` after `after`.
async fn users(
    conn: &mut AnyConnection,
    tenant: TenantId,
    subject: Option<&str>,
    after: Option<&str>,
    limit: u32,
) -> Result<Vec<UserView>, AdminError> {
    let rows = sqlx::query(
        "SELECT u.subject, u.display_name, u.status, u.created_at, \
                (SELECT string_agg(r.role, ',') FROM user_roles r \
                  WHERE r.tenant_id = u.tenant_id AND r.user_id = u.id) AS roles \
           FROM users u \
          WHERE u.tenant_id = $1 AND ($2 = '' OR u.subject = $2) AND u.subject > $3 ORDER BY u.subject LIMIT $4",
    )
    .bind(tenant)
    .bind(subject.unwrap_or_default())
    .bind(after.unwrap_or_default())
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let roles: Option<String> = r.try_get("roles")?;
        let mut roles: Vec<String> =
            roles.unwrap_or_default().split(',').filter(|r| !r.is_empty()).map(str::to_owned).collect();
        roles.sort_by_key(|r| r.parse::<crate::model::Role>().ok());
        out.push(UserView {
            subject: r.try_get("subject")?,
            display_name: r.try_get("display_name")?,
            status: r.try_get("status")?,
            roles,
            created_at: r.try_get("created_at")?,
        });
    }
    Ok(out)
}

async fn flocks(conn: &mut AnyConnection, tenant: TenantId) -> Result<Vec<FlockView>, AdminError> {
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT name, breed, hen_count FROM flocks WHERE tenant_id = $1 ORDER BY name")
            .bind(tenant)
            .fetch_all(conn)
            .await?;
    Ok(rows.into_iter().map(|(name, breed, hen_count)| FlockView { name, breed, hen_count }).collect())
}

/// Every executor, or the one named `name`.
async fn executors(conn: &mut AnyConnection, name: Option<&str>) -> Result<Vec<ExecutorView>, AdminError> {
    let rows = entities::list_executors(conn).await?;
    Ok(rows
        .into_iter()
        .filter(|x| name.is_none_or(|n| x.name == n))
        .map(|x| ExecutorView { name: x.name, machine: x.machine, run_as: x.run_as, kind: x.kind, owners: x.owners })
        .collect())
}

async fn entities(conn: &mut AnyConnection, tenant: &str) -> Result<Vec<EntityView>, AdminError> {
    let rows = entities::list_entities(conn, tenant).await?;
    rows.into_iter()
        .map(|e| {
            let declaration = serde_json::from_str(&e.declaration).map_err(|err| StoreError::Invalid {
                field: "declaration",
                message: format!("stored declaration of `{}` is not JSON: {err}", e.name),
            })?;
            Ok(EntityView { name: e.name, server: e.server, declaration })
        })
        .collect()
}

async fn bindings(conn: &mut AnyConnection, tenant: &str) -> Result<Vec<BindingView>, AdminError> {
    let rows = entities::list_bindings(conn, tenant).await?;
    Ok(rows
        .into_iter()
        .map(|b| BindingView { server: b.server, executor: b.executor, prefixed: b.prefixed, pin: b.pin })
        .collect())
}

async fn grants(conn: &mut AnyConnection, tenant: &str) -> Result<Vec<GrantView>, AdminError> {
    let rows = entities::list_grants(conn, tenant).await?;
    Ok(rows
        .into_iter()
        .map(|g| GrantView {
            id: grant_id(&g.server, g.role.as_str(), g.kind.as_str(), &g.name),
            cedar: crate::policy::grant_text(&g.server, g.role.as_str(), g.kind, &g.name, g.confirm),
            confirm: g.confirm.map(|c| c.as_str().to_owned()),
            server: g.server,
            role: g.role.as_str().to_owned(),
            kind: g.kind.as_str().to_owned(),
            name: g.name,
        })
        .collect())
}

async fn root_allowances(
    conn: &mut AnyConnection,
    tenant: &str,
    executor: Option<&str>,
) -> Result<Vec<RootAllowanceView>, AdminError> {
    let rows = roots::list_root_allowances(conn, tenant, executor).await?;
    Ok(rows
        .into_iter()
        .map(|a| RootAllowanceView {
            id: a.id.to_string(),
            executor: a.executor,
            base: a.base,
            role: a.role.as_str().to_owned(),
        })
        .collect())
}

async fn credentials(conn: &mut AnyConnection, tenant: TenantId) -> Result<Vec<CredentialView>, AdminError> {
    let rows = crate::store::vault::list_on(conn, tenant).await.map_err(super::vault_error)?;
    Ok(rows
        .into_iter()
        .map(|c| CredentialView {
            server: c.server,
            user: c.subject,
            status: c.status.as_str().to_owned(),
            updated_at: c.updated_at,
        })
        .collect())
}

async fn issuers(conn: &mut AnyConnection, tenant: &str) -> Result<Vec<IssuerView>, AdminError> {
    let rows = crate::store::issuers::of_tenant(conn, tenant).await?;
    Ok(rows
        .into_iter()
        .map(|i| IssuerView {
            issuer: i.issuer,
            jwks_url: i.jwks_url,
            audience: i.audience,
            subject_claim: i.subject_claim,
            tenant_claim: i.tenant_claim,
            console_signin: i.console_client_id.is_some().then(|| crate::admin::console_signin_path(&i.tenant_slug)),
            console_client_id: i.console_client_id,
            console_scopes: i.console_scopes,
            created_at: i.created_at,
        })
        .collect())
}
