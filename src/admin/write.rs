//! Administrative writes. [`Admin::write`] runs one in one transaction: authority first, then
//! the `If-Match` precondition against the resource as it is, the change (each input checked
//! by the store before its first statement), and an audit event in the chain of every tenant
//! the change touches, naming who made it, what it was, and the digests of the resource
//! before and after (its entity tags). A refusal at any step rolls everything back.

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::AnyConnection;

use super::idempotency::{self, Idempotency};
use super::read::{Target, grant_id};
use super::tenant_id;
use super::{Admin, AdminError, Authority, Need, digest};
use crate::audit::{self, AuditEvent, Outcome};
use crate::model::{Role, TenantStatus, UserStatus};
use crate::policy::Mode;
use crate::store::definitions::{self, Decision, PinMode};
use crate::store::entities::{self, GrantKind};
use crate::store::{AuditEventId, StoreError, TenantId, admin, now_millis, policies, roots};

/// One administrative change.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Write {
    CreateTenant {
        slug: String,
        name: String,
    },
    UpdateTenant {
        slug: String,
        name: Option<String>,
        status: Option<TenantStatus>,
        /// The organization id at the identity provider; `""` clears it.
        #[serde(skip_serializing_if = "Option::is_none")]
        org_id: Option<String>,
        /// Whether a call's record is committed before the call is forwarded.
        #[serde(skip_serializing_if = "Option::is_none")]
        audit_write_ahead: Option<bool>,
    },
    /// Retires the tenant (the admin API's DELETE): suspended for good, its data and its
    /// audit chain kept. Nothing erases a tenant's chain.
    RetireTenant {
        slug: String,
    },
    /// Removes what a retired tenant held but its chain (see [`admin::purge_tenant`]).
    PurgeTenant {
        slug: String,
    },
    CreateUser {
        tenant: String,
        subject: String,
        display_name: String,
        roles: Vec<Role>,
    },
    UpdateUser {
        tenant: String,
        subject: String,
        display_name: Option<String>,
        status: Option<UserStatus>,
        roles: Option<Vec<Role>>,
    },
    DeleteUser {
        tenant: String,
        subject: String,
    },
    AddRole {
        tenant: String,
        subject: String,
        role: Role,
    },
    RemoveRole {
        tenant: String,
        subject: String,
        role: Role,
    },
    CreateFlock {
        tenant: String,
        name: String,
        breed: String,
        hen_count: i64,
    },
    DeleteFlock {
        tenant: String,
        name: String,
    },
    Assign {
        tenant: String,
        subject: String,
        flock: String,
    },
    Unassign {
        tenant: String,
        subject: String,
        flock: String,
    },
    CreateExecutor {
        name: String,
        machine: String,
        run_as: String,
        kind: String,
        owners: Vec<String>,
    },
    DeleteExecutor {
        name: String,
    },
    RotateExecutorSecret {
        name: String,
    },
    AddExecutorOwner {
        executor: String,
        tenant: String,
    },
    RemoveExecutorOwner {
        executor: String,
        tenant: String,
    },
    CreateEntity {
        tenant: String,
        name: String,
        declaration: Value,
    },
    /// Every valid server of a `.mcp.json` text under `under`; the invalid ones are reported.
    ImportEntities {
        tenant: String,
        under: String,
        text: String,
    },
    DeleteEntity {
        tenant: String,
        name: String,
    },
    SetBinding {
        tenant: String,
        server: String,
        executor: String,
        prefixed: bool,
        /// `None`: a new binding's is `trust_first_use`, a rebinding keeps its own.
        #[serde(skip_serializing_if = "Option::is_none")]
        pin: Option<PinMode>,
    },
    DeleteBinding {
        tenant: String,
        server: String,
    },
    CreateGrant {
        tenant: String,
        server: String,
        role: Role,
        kind: GrantKind,
        name: String,
        /// Who confirms each call the grant allows (tool grants only).
        #[serde(skip_serializing_if = "Option::is_none")]
        confirm: Option<crate::model::Confirm>,
    },
    DeleteGrant {
        tenant: String,
        server: String,
        role: Role,
        kind: GrantKind,
        name: String,
    },
    AllowRoot {
        tenant: String,
        executor: String,
        base: String,
        role: Role,
    },
    DeleteRoot {
        tenant: String,
        id: String,
    },
    /// Creates or replaces one of the tenant's Cedar policies (validated first).
    PutPolicy {
        tenant: String,
        id: String,
        text: String,
        mode: Mode,
    },
    DeletePolicy {
        tenant: String,
        id: String,
    },
    /// Creates or replaces one of the platform's policies, which take part in every tenant's.
    PutPlatformPolicy {
        id: String,
        text: String,
    },
    DeletePlatformPolicy {
        id: String,
    },
    /// An owner's decision on an upstream definition: approve it (it is served; the one
    /// approved before is replaced) or reject it (never served).
    DecideDefinition {
        tenant: String,
        id: String,
        decision: Decision,
    },
    /// An approver's decision on a call waiting for a second person: approve it (it is
    /// forwarded, once, with the arguments shown) or reject it (with an optional reason the
    /// caller is told). Never the caller's own call.
    DecideApproval {
        tenant: String,
        id: String,
        decision: crate::store::approvals::Decision,
        reason: Option<String>,
    },
    /// Whether the tenant's policies decide (`enforce`) or are only audited (`log_only`).
    SetPolicyMode {
        tenant: String,
        mode: Mode,
    },
    /// A login to an OAuth-protected server: the tenant's, or `user`'s own (a server declared
    /// with `"oauth": {"tokens": "user"}`). Answers the start link, good once for 10 minutes.
    OauthLogin {
        tenant: String,
        server: String,
        user: Option<String>,
    },
    /// Deletes a stored credential: the next call needs a new login.
    OauthLogout {
        tenant: String,
        server: String,
        user: Option<String>,
    },
    /// Provisions users on first sight: `role_claim` names the claim of their groups, `roles`
    /// maps each group to the roles it gives (replaces what was set).
    SetProvisioning {
        tenant: String,
        role_claim: String,
        roles: std::collections::BTreeMap<String, Vec<Role>>,
    },
    /// Stops provisioning users on first sight.
    DeleteProvisioning {
        tenant: String,
    },
    /// The tenant trusts an identity provider of its own: tokens of `issuer` sign its users in.
    /// `subject_claim` is `sub` when not given.
    TrustIssuer {
        tenant: String,
        #[serde(flatten)]
        trust: super::views::IssuerTrust,
    },
    /// The tenant no longer trusts `issuer`.
    DistrustIssuer {
        tenant: String,
        issuer: String,
    },
}

/// Who asks for a write, and how.
#[derive(Debug, Clone)]
pub struct Caller<'a> {
    pub who: &'a Authority,
    /// `api` or `cli`: audited as the client.
    pub via: &'static str,
    pub request_id: Option<String>,
    pub idempotency: Option<Idempotency>,
    /// The `If-Match` header: the write applies only to that version of the resource.
    pub if_match: Option<String>,
}

impl<'a> Caller<'a> {
    pub fn cli(who: &'a Authority) -> Self {
        Self { who, via: "cli", request_id: None, idempotency: None, if_match: None }
    }
}

/// What a write answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// 201 created, 200 changed, 204 deleted.
    pub status: u16,
    /// The resource as it is now (none once deleted).
    pub body: Option<Value>,
    pub etag: Option<String>,
    /// Where a created resource lives, below `/admin/v1/`.
    pub location: Option<String>,
    /// A remote executor's new secret, or a login's start link: shown this once, never
    /// stored in an answer kept for a retry.
    pub secret: Option<String>,
    /// The member of the answer the secret goes in (`secret`, `link`).
    pub secret_name: &'static str,
    /// Servers of an import that were not stored, and why.
    pub skipped: Vec<String>,
    /// The answer of an earlier request with the same idempotency key.
    pub replayed: bool,
}

/// What applying a write left to report.
#[derive(Default)]
struct Applied {
    /// The resource it created, when its key was not known before (a root allowance's id).
    created: Option<Target>,
    secret: Option<String>,
    skipped: Vec<String>,
    imported: Vec<String>,
    /// What the audit event records besides the resource's tags (a definition's decision:
    /// both digests).
    detail: Option<Value>,
}

impl Write {
    pub fn need(&self) -> Need<'_> {
        use Write::*;
        match self {
            CreateTenant { .. }
            | CreateExecutor { .. }
            | DeleteExecutor { .. }
            | RotateExecutorSecret { .. }
            | AddExecutorOwner { .. }
            | RemoveExecutorOwner { .. }
            | PutPlatformPolicy { .. }
            | DeletePlatformPolicy { .. } => Need::Platform,
            UpdateTenant { slug: tenant, .. }
            | RetireTenant { slug: tenant }
            | PurgeTenant { slug: tenant }
            | CreateEntity { tenant, .. }
            | ImportEntities { tenant, .. }
            | DeleteEntity { tenant, .. } => Need::PlatformOver(tenant),
            // Who may sign in to the tenant: its owners decide, not its auditors or workers.
            TrustIssuer { tenant, .. } | DistrustIssuer { tenant, .. } => Need::Manage(tenant),
            // A waiting call: a second person of the tenant, with the approver role.
            DecideApproval { tenant, .. } => Need::Approve(tenant),
            // Every other write is of one tenant's own things: its owners'. One that named no
            // tenant would be the platform's (fail closed).
            _ => self.tenant().map_or(Need::Platform, Need::Manage),
        }
    }

    /// The audit event's action.
    pub fn action(&self) -> &'static str {
        use Write::*;
        match self {
            CreateTenant { .. } => "admin.tenant.create",
            UpdateTenant { .. } => "admin.tenant.update",
            RetireTenant { .. } => "admin.tenant.retire",
            PurgeTenant { .. } => "admin.tenant.purge",
            CreateUser { .. } => "admin.user.create",
            UpdateUser { .. } => "admin.user.update",
            DeleteUser { .. } => "admin.user.delete",
            AddRole { .. } => "admin.role.add",
            RemoveRole { .. } => "admin.role.remove",
            CreateFlock { .. } => "admin.flock.create",
            DeleteFlock { .. } => "admin.flock.delete",
            Assign { .. } => "admin.assignment.create",
            Unassign { .. } => "admin.assignment.delete",
            CreateExecutor { .. } => "admin.executor.create",
            DeleteExecutor { .. } => "admin.executor.delete",
            RotateExecutorSecret { .. } => "admin.executor.rotate_secret",
            AddExecutorOwner { .. } => "admin.executor.owner_add",
            RemoveExecutorOwner { .. } => "admin.executor.owner_remove",
            CreateEntity { .. } => "admin.entity.create",
            ImportEntities { .. } => "admin.entity.import",
            DeleteEntity { .. } => "admin.entity.delete",
            SetBinding { .. } => "admin.binding.set",
            DeleteBinding { .. } => "admin.binding.delete",
            CreateGrant { .. } => "admin.grant.create",
            DeleteGrant { .. } => "admin.grant.delete",
            AllowRoot { .. } => "admin.root_allowance.create",
            DeleteRoot { .. } => "admin.root_allowance.delete",
            OauthLogin { .. } => "admin.oauth.login",
            OauthLogout { .. } => "admin.oauth.logout",
            SetProvisioning { .. } => "admin.provisioning.set",
            DeleteProvisioning { .. } => "admin.provisioning.delete",
            TrustIssuer { .. } => "admin.issuer.trust",
            DistrustIssuer { .. } => "admin.issuer.distrust",
            PutPolicy { .. } => "admin.policy.put",
            DeletePolicy { .. } => "admin.policy.delete",
            PutPlatformPolicy { .. } => "admin.platform_policy.put",
            DeletePlatformPolicy { .. } => "admin.platform_policy.delete",
            SetPolicyMode { .. } => "admin.policy.mode",
            DecideDefinition { decision: Decision::Approve, .. } => "admin.definition.approve",
            DecideDefinition { decision: Decision::Reject, .. } => "admin.definition.reject",
            DecideApproval { decision: crate::store::approvals::Decision::Approve, .. } => "admin.approval.approve",
            DecideApproval { decision: crate::store::approvals::Decision::Reject, .. } => "admin.approval.reject",
        }
    }

    /// The resource it acts on, when its key is known before it runs.
    fn target(&self) -> Option<Target> {
        use Write::*;
        let t = |tenant: &String| tenant.clone();
        Some(match self {
            CreateTenant { slug, .. } | UpdateTenant { slug, .. } | RetireTenant { slug } | PurgeTenant { slug } => {
                Target::Tenant { slug: slug.clone() }
            }
            CreateUser { tenant, subject, .. }
            | UpdateUser { tenant, subject, .. }
            | DeleteUser { tenant, subject }
            | AddRole { tenant, subject, .. }
            | RemoveRole { tenant, subject, .. } => Target::User { tenant: t(tenant), subject: subject.clone() },
            CreateFlock { tenant, name, .. } | DeleteFlock { tenant, name } => {
                Target::Flock { tenant: t(tenant), name: name.clone() }
            }
            Assign { tenant, subject, flock } | Unassign { tenant, subject, flock } => {
                Target::Assignment { tenant: t(tenant), subject: subject.clone(), flock: flock.clone() }
            }
            CreateExecutor { name, .. } | DeleteExecutor { name } | RotateExecutorSecret { name } => {
                Target::Executor { name: name.clone() }
            }
            AddExecutorOwner { executor, .. } | RemoveExecutorOwner { executor, .. } => {
                Target::Executor { name: executor.clone() }
            }
            CreateEntity { tenant, name, .. } | DeleteEntity { tenant, name } => {
                Target::Entity { tenant: t(tenant), name: name.clone() }
            }
            SetBinding { tenant, server, .. } | DeleteBinding { tenant, server } => {
                Target::Binding { tenant: t(tenant), server: server.clone() }
            }
            CreateGrant { tenant, server, role, kind, name, .. } | DeleteGrant { tenant, server, role, kind, name } => {
                Target::Grant { tenant: t(tenant), id: grant_id(server, role.as_str(), kind.as_str(), name) }
            }
            DeleteRoot { tenant, id } => Target::RootAllowance { tenant: t(tenant), id: id.clone() },
            OauthLogin { tenant, server, user } | OauthLogout { tenant, server, user } => {
                Target::Credential { tenant: t(tenant), server: server.clone(), user: user.clone() }
            }
            SetProvisioning { tenant, .. } | DeleteProvisioning { tenant } => {
                Target::Provisioning { tenant: t(tenant) }
            }
            TrustIssuer { tenant, trust } => Target::Issuer { tenant: t(tenant), issuer: trust.issuer.clone() },
            DistrustIssuer { tenant, issuer } => Target::Issuer { tenant: t(tenant), issuer: issuer.clone() },
            PutPolicy { tenant, id, .. } | DeletePolicy { tenant, id } => {
                Target::Policy { tenant: t(tenant), id: id.clone() }
            }
            PutPlatformPolicy { id, .. } | DeletePlatformPolicy { id } => Target::PlatformPolicy { id: id.clone() },
            SetPolicyMode { tenant, .. } => Target::PolicyMode { tenant: t(tenant) },
            DecideDefinition { tenant, id, .. } => Target::Definition { tenant: t(tenant), id: id.clone() },
            DecideApproval { tenant, id, .. } => Target::Approval { tenant: t(tenant), id: id.clone() },
            ImportEntities { .. } | AllowRoot { .. } => return None,
        })
    }

    /// The status of a success: created, changed or deleted.
    fn status(&self, existed: bool) -> u16 {
        use Write::*;
        match self {
            CreateTenant { .. } | CreateUser { .. } | CreateFlock { .. } | Assign { .. } | CreateExecutor { .. } => 201,
            CreateEntity { .. } | CreateGrant { .. } | AllowRoot { .. } | OauthLogin { .. } | TrustIssuer { .. } => 201,
            SetBinding { .. } | PutPolicy { .. } | PutPlatformPolicy { .. } if !existed => 201,
            DeleteUser { .. }
            | DeleteFlock { .. }
            | Unassign { .. }
            | DeleteExecutor { .. }
            | DeleteEntity { .. }
            | DeleteBinding { .. }
            | DeleteGrant { .. }
            | DeleteRoot { .. }
            | OauthLogout { .. }
            | DeleteProvisioning { .. }
            | DistrustIssuer { .. }
            | DeletePolicy { .. }
            | DeletePlatformPolicy { .. } => 204,
            _ => 200,
        }
    }

    /// The tenant named in it, if any.
    pub fn tenant(&self) -> Option<&str> {
        use Write::*;
        match self {
            CreateTenant { slug, .. } | UpdateTenant { slug, .. } | RetireTenant { slug } | PurgeTenant { slug } => {
                Some(slug)
            }
            CreateExecutor { .. } | DeleteExecutor { .. } | RotateExecutorSecret { .. } => None,
            PutPlatformPolicy { .. } | DeletePlatformPolicy { .. } => None,
            AddExecutorOwner { tenant, .. } | RemoveExecutorOwner { tenant, .. } => Some(tenant),
            CreateUser { tenant, .. }
            | UpdateUser { tenant, .. }
            | DeleteUser { tenant, .. }
            | AddRole { tenant, .. }
            | RemoveRole { tenant, .. }
            | CreateFlock { tenant, .. }
            | DeleteFlock { tenant, .. }
            | Assign { tenant, .. }
            | Unassign { tenant, .. }
            | CreateEntity { tenant, .. }
            | ImportEntities { tenant, .. }
            | DeleteEntity { tenant, .. }
            | SetBinding { tenant, .. }
            | DeleteBinding { tenant, .. }
            | CreateGrant { tenant, .. }
            | DeleteGrant { tenant, .. }
            | AllowRoot { tenant, .. }
            | DeleteRoot { tenant, .. }
            | OauthLogin { tenant, .. }
            | OauthLogout { tenant, .. }
            | SetProvisioning { tenant, .. }
            | DeleteProvisioning { tenant }
            | TrustIssuer { tenant, .. }
            | DistrustIssuer { tenant, .. }
            | PutPolicy { tenant, .. }
            | DeletePolicy { tenant, .. }
            | SetPolicyMode { tenant, .. }
            | DecideDefinition { tenant, .. }
            | DecideApproval { tenant, .. } => Some(tenant),
        }
    }
}

/// Whether `if_match` (an `If-Match` value: `*` or a list of strong entity tags) admits the
/// resource whose current tag is `current` (`None`: it does not exist).
fn admits(if_match: &str, current: Option<&str>) -> bool {
    let Some(current) = current else { return false };
    if_match.split(',').map(str::trim).any(|tag| tag == "*" || tag.trim_matches('"') == current && tag.starts_with('"'))
}

/// The slugs of the tenants an executor's view names as owners.
fn owners(view: Option<&Value>) -> Vec<String> {
    view.and_then(|v| v.get("owners"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|o| o.as_str().map(str::to_owned))
        .collect()
}

impl Admin {
    /// Runs `write` for `caller` in one transaction (see the module's documentation). A refused
    /// decision on a waiting call is audited too, in its tenant's chain: who tried, and why it
    /// was refused (not an approver, the caller's own call, decided already).
    pub async fn write(&self, caller: &Caller<'_>, write: Write) -> Result<Done, AdminError> {
        let decision = matches!(write, Write::DecideApproval { .. }).then(|| write.clone());
        let result = self.write_once(caller, write).await;
        if let (Err(refused), Some(decision)) = (&result, decision) {
            self.audit_refused_decision(caller, &decision, refused).await?;
        }
        result
    }

    /// Records a refused decision on a waiting call (its tenant's chain), unless the refusal
    /// says the tenant or the call does not exist for this caller. Fails closed: an unrecorded
    /// refusal answers an error of its own.
    async fn audit_refused_decision(
        &self,
        caller: &Caller<'_>,
        write: &Write,
        refused: &AdminError,
    ) -> Result<(), AdminError> {
        let Write::DecideApproval { tenant: slug, id, .. } = write else { return Ok(()) };
        let class = match refused {
            AdminError::Forbidden => "not_approver",
            AdminError::Denied(_) if caller.who.member().is_none() => "not_a_member",
            AdminError::Denied(_) => "own_call",
            AdminError::Conflict(_) => "settled",
            AdminError::Invalid { .. } => "invalid",
            _ => return Ok(()),
        };
        let mut tx = self.db.begin().await?;
        let tenant: Option<TenantId> =
            sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1").bind(slug).fetch_optional(&mut *tx).await?;
        let Some(tenant) = tenant else { return Ok(()) };
        let record = crate::vocab::digest::canonical_json(&json!({ "actor": caller.who.actor(), "approval": id }));
        let event = AuditEvent {
            id: AuditEventId::generate(),
            tenant,
            occurred_at: now_millis(),
            user: caller.who.user_in(tenant),
            session_id: None,
            request_id: caller.request_id.clone(),
            client_name: Some(format!("scopegate-{}", caller.via)),
            client_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            action: write.action().to_owned(),
            tool: Some(Target::Approval { tenant: slug.clone(), id: id.clone() }.path()),
            args_digest: Some(digest(&serde_json::to_value(write).unwrap_or(Value::Null))),
            args_raw: Some(record),
            outcome: Outcome::Denied,
            error_class: Some(class.to_owned()),
            duration_us: 0,
            calls: 1,
            policy: None,
            call_id: None,
            result_digest: None,
        };
        audit::append(&mut tx, &None, &event).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn write_once(&self, caller: &Caller<'_>, write: Write) -> Result<Done, AdminError> {
        let started = std::time::Instant::now();
        caller.who.authorize(write.need())?;
        let principal = caller.who.actor();
        let mut tx = self.db.begin().await?;
        if let Some(idem) = &caller.idempotency
            && let Some(done) = idempotency::claim(&mut tx, &principal, idem).await?
        {
            tx.rollback().await?;
            return Ok(done);
        }
        // A retired tenant changes no more, but for the purge of its data (and an executor
        // it owned losing it, or being deleted); nor is it made a new executor's owner.
        let named: Vec<&str> = match &write {
            Write::CreateTenant { .. } | Write::PurgeTenant { .. } | Write::RemoveExecutorOwner { .. } => Vec::new(),
            Write::CreateExecutor { owners, .. } => owners.iter().map(String::as_str).collect(),
            other => other.tenant().into_iter().collect(),
        };
        for slug in named {
            match admin::retired_at(&mut tx, slug).await {
                Ok(Some(_)) => {
                    return Err(AdminError::Conflict(format!("tenant `{slug}` is retired: it changes no more")));
                }
                // No such tenant: the change itself says so.
                Ok(None) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let target = write.target();
        let before = match &target {
            Some(t) => t.view(&mut tx, &self.vocabulary).await?,
            None => None,
        };
        let before_tag = before.as_ref().map(digest);
        if let Some(if_match) = &caller.if_match
            && !admits(if_match, before_tag.as_deref())
        {
            return Err(AdminError::PreconditionFailed);
        }
        let applied = self.apply(&mut tx, &write, &principal, caller.who).await?;
        let target = applied.created.clone().or(target);
        let after = match (&write, &target) {
            (Write::ImportEntities { .. }, _) => {
                Some(json!({ "imported": applied.imported, "skipped": applied.skipped }))
            }
            (_, Some(t)) => t.view(&mut tx, &self.vocabulary).await?,
            (_, None) => None,
        };
        let after_tag = after.as_ref().map(digest);

        // Every tenant the change touches: the one it names, and an executor's owners before
        // and after; and, for a platform administrator's act (or the operator's, through the
        // CLI), the platform chain, which so records even the acts that touch no tenant.
        let mut slugs: Vec<String> = write.tenant().map(str::to_owned).into_iter().collect();
        if matches!(target, Some(Target::Executor { .. })) {
            slugs.extend(owners(before.as_ref()));
            slugs.extend(owners(after.as_ref()));
        }
        let mut chains: Vec<TenantId> = Vec::new();
        for slug in &slugs {
            let id: Option<TenantId> = sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1")
                .bind(slug)
                .fetch_optional(&mut *tx)
                .await?;
            chains.extend(id);
        }
        if matches!(caller.who, Authority::Cli | Authority::Platform { .. }) {
            chains.push(admin::platform_chain());
        }
        chains.sort();
        chains.dedup();
        let what = target.as_ref().map_or_else(|| format!("tenants/{}", slugs.join(",")), Target::path);
        let input = digest(&serde_json::to_value(&write).unwrap_or(Value::Null));
        let mut record = json!({
            "actor": principal,
            "before": before_tag,
            "after": after_tag,
        });
        if let Some(detail) = &applied.detail {
            record["detail"] = detail.clone();
        }
        let record = crate::vocab::digest::canonical_json(&record);
        for tenant in &chains {
            let event = AuditEvent {
                id: AuditEventId::generate(),
                tenant: *tenant,
                occurred_at: now_millis(),
                user: caller.who.user_in(*tenant),
                session_id: None,
                request_id: caller.request_id.clone(),
                client_name: Some(format!("scopegate-{}", caller.via)),
                client_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
                action: write.action().to_owned(),
                tool: Some(what.clone()),
                args_digest: Some(input.clone()),
                args_raw: Some(record.clone()),
                outcome: Outcome::Ok,
                error_class: None,
                duration_us: started.elapsed().as_micros() as i64,
                calls: 1,
                policy: None,
                call_id: None,
                result_digest: None,
            };
            // No cached head: the tenant's head row is locked and read in this transaction.
            audit::append(&mut tx, &None, &event).await?;
        }

        let status = write.status(before.is_some());
        let login = matches!(write, Write::OauthLogin { .. });
        let body = match (&write, status) {
            (_, 204) => None,
            // A login has no resource of its own yet: the answer says what the link is for.
            (Write::OauthLogin { server, user, .. }, _) => Some(json!({
                "server": server,
                "user": user,
                "expires_in_secs": crate::store::vault::LOGIN_TTL.as_secs(),
            })),
            _ => after,
        };
        let done = Done {
            status,
            location: (status == 201 && !login).then(|| target.as_ref().map(Target::path)).flatten(),
            etag: if status == 204 || login { None } else { after_tag },
            body,
            secret: applied.secret,
            secret_name: if login { "link" } else { "secret" },
            skipped: applied.skipped,
            replayed: false,
        };
        if let Some(idem) = &caller.idempotency {
            idempotency::store(&mut tx, &principal, idem, &done).await?;
        }
        tx.commit().await?;
        Ok(done)
    }

    async fn apply(
        &self,
        c: &mut AnyConnection,
        write: &Write,
        actor: &str,
        who: &Authority,
    ) -> Result<Applied, AdminError> {
        let mut applied = Applied::default();
        match write {
            Write::CreateTenant { slug, name } => {
                admin::create_tenant(c, slug, name).await?;
            }
            Write::UpdateTenant { slug, name, status, org_id, audit_write_ahead } => {
                if let Some(name) = name {
                    admin::rename_tenant(&mut *c, slug, name).await?;
                }
                if let Some(status) = status {
                    admin::set_tenant_status(&mut *c, slug, *status).await?;
                }
                if let Some(org_id) = org_id {
                    admin::set_tenant_org_id(&mut *c, slug, Some(org_id.as_str()).filter(|o| !o.is_empty())).await?;
                }
                if let Some(on) = audit_write_ahead {
                    admin::set_tenant_write_ahead(&mut *c, slug, *on).await?;
                }
                if name.is_none() && status.is_none() && org_id.is_none() && audit_write_ahead.is_none() {
                    super::tenant_id(c, slug).await?;
                }
            }
            Write::RetireTenant { slug } => admin::retire_tenant(c, slug).await?,
            Write::PurgeTenant { slug } => admin::purge_tenant(c, slug).await?,
            Write::CreateUser { tenant, subject, display_name, roles } => {
                if roles.is_empty() {
                    return Err(AdminError::Invalid { field: "roles", message: "must name at least one role".into() });
                }
                admin::create_user(c, tenant, subject, display_name, roles).await?;
            }
            Write::UpdateUser { tenant, subject, display_name, status, roles } => {
                admin::update_user(c, tenant, subject, display_name.as_deref(), *status, roles.as_deref()).await?;
            }
            Write::DeleteUser { tenant, subject } => admin::delete_user(c, tenant, subject).await?,
            Write::AddRole { tenant, subject, role } => admin::add_role(c, tenant, subject, *role).await?,
            Write::RemoveRole { tenant, subject, role } => admin::remove_role(c, tenant, subject, *role).await?,
            Write::CreateFlock { tenant, name, breed, hen_count } => {
                admin::create_flock(c, tenant, name, breed, *hen_count).await?;
            }
            Write::DeleteFlock { tenant, name } => admin::delete_flock(c, tenant, name).await?,
            Write::Assign { tenant, subject, flock } => admin::assign_flock(c, tenant, subject, flock).await?,
            Write::Unassign { tenant, subject, flock } => admin::unassign_flock(c, tenant, subject, flock).await?,
            Write::CreateExecutor { name, machine, run_as, kind, owners } => {
                let owners: Vec<&str> = owners.iter().map(String::as_str).collect();
                applied.secret = entities::create_executor(c, name, machine, run_as, kind, &owners).await?;
            }
            Write::DeleteExecutor { name } => entities::delete_executor(c, name).await?,
            Write::RotateExecutorSecret { name } => {
                applied.secret = Some(entities::rotate_executor_secret(c, name).await?);
            }
            Write::AddExecutorOwner { executor, tenant } => entities::add_executor_owner(c, executor, tenant).await?,
            Write::RemoveExecutorOwner { executor, tenant } => {
                entities::remove_executor_owner(c, executor, tenant).await?
            }
            Write::CreateEntity { tenant, name, declaration } => {
                let server = entities::parse_entity_name(name)?;
                check_declaration(server, declaration)?;
                entities::create_entity(c, tenant, name, declaration).await?;
            }
            Write::ImportEntities { tenant, under, text } => {
                let parsed = crate::decl::parse_declarations(text)
                    .map_err(|e| StoreError::Invalid { field: "file", message: e.to_string() })?;
                applied.skipped = parsed.errors.iter().map(ToString::to_string).collect();
                for server in &parsed.servers {
                    let name = format!("{under}/mcp-servers/{}", server.name);
                    entities::create_entity(&mut *c, tenant, &name, &server.to_json()).await?;
                    applied.imported.push(name);
                }
            }
            Write::DeleteEntity { tenant, name } => entities::delete_entity(c, tenant, name).await?,
            Write::SetBinding { tenant, server, executor, prefixed, pin } => {
                let native: Vec<&str> = self.native_tools.iter().map(String::as_str).collect();
                let unprefixed_beside = (!prefixed).then_some(native.as_slice());
                entities::bind_server_with_prefix(&mut *c, tenant, server, executor, unprefixed_beside).await?;
                if let Some(pin) = pin {
                    let tenant = tenant_id(&mut *c, tenant).await?;
                    definitions::set_pin_mode(c, tenant, server, *pin).await?;
                }
            }
            Write::DeleteBinding { tenant, server } => entities::unbind_server(c, tenant, server).await?,
            Write::CreateGrant { tenant, server, role, kind, name, confirm } => {
                entities::grant_confirmed(c, tenant, server, *role, *kind, name, *confirm).await?;
            }
            Write::DeleteGrant { tenant, server, role, kind, name } => {
                entities::revoke(c, tenant, server, *role, *kind, name).await?;
            }
            Write::AllowRoot { tenant, executor, base, role } => {
                let id = roots::allow_root(c, tenant, executor, base, *role).await?;
                applied.created = Some(Target::RootAllowance { tenant: tenant.clone(), id: id.to_string() });
            }
            Write::DeleteRoot { tenant, id } => roots::delete_root_allowance(c, tenant, id).await?,
            Write::PutPolicy { tenant, id, text, mode } => {
                let tenant_id = tenant_id(&mut *c, tenant).await?;
                let catalogue = super::policies::catalogue_of(&mut *c, tenant_id, tenant, &self.vocabulary).await?;
                super::policies::check_text(Some(&catalogue), &self.vocabulary.claims, id, text)?;
                policies::put_policy(c, tenant_id, id, text, mode.as_str()).await?;
            }
            Write::DeletePolicy { tenant, id } => {
                let tenant_id = tenant_id(&mut *c, tenant).await?;
                if !policies::delete_policy(c, tenant_id, id).await? {
                    return Err(AdminError::NotFound(format!("policy `{id}` does not exist in this tenant")));
                }
            }
            Write::PutPlatformPolicy { id, text } => {
                super::policies::check_text(None, &self.vocabulary.claims, id, text)?;
                policies::put_policy(c, admin::platform_chain(), id, text, Mode::Enforce.as_str()).await?;
            }
            Write::DeletePlatformPolicy { id } => {
                if !policies::delete_policy(c, admin::platform_chain(), id).await? {
                    return Err(AdminError::NotFound(format!("platform policy `{id}` does not exist")));
                }
            }
            Write::DecideDefinition { tenant, id, decision } => {
                let tenant = tenant_id(&mut *c, tenant).await?;
                let (decided, before) = definitions::decide(c, tenant, id, *decision, actor).await?;
                applied.detail = Some(json!({
                    "server": decided.server,
                    "kind": decided.kind.as_str(),
                    "name": decided.name,
                    "digest": decided.digest,
                    "approved_before": before,
                }));
            }
            Write::DecideApproval { tenant, id, decision, reason } => {
                use crate::store::approvals::{self, DecideError};
                // Only a member reaches here (see `Need::Approve`): its own user decides.
                let Some(member) = who.member() else { return Err(AdminError::Forbidden) };
                let tenant = tenant_id(&mut *c, tenant).await?;
                let reason = super::approvals::check_reason(reason.as_deref())?;
                let decided =
                    approvals::decide(c, tenant, id, *decision, member.user, &member.subject, reason.as_deref())
                        .await
                        .map_err(|e| match e {
                            DecideError::NotFound(_) => AdminError::NotFound(e.to_string()),
                            DecideError::OwnCall => AdminError::Denied(e.to_string()),
                            DecideError::Settled { .. } => AdminError::Conflict(e.to_string()),
                            DecideError::Store(e) => e.into(),
                        })?;
                applied.detail = Some(json!({
                    "id": decided.id,
                    "decision": decision.as_str(),
                    "caller": decided.subject,
                    "server": decided.server,
                    "tool": decided.tool,
                    "args_digest": decided.args_digest,
                    "reason": decided.reason,
                }));
            }
            Write::SetPolicyMode { tenant, mode } => {
                let tenant_id = tenant_id(&mut *c, tenant).await?;
                policies::set_policy_mode(c, tenant_id, mode.as_str()).await?;
            }
            Write::OauthLogin { tenant, server, user } => {
                let Some(public_url) = &self.oauth else {
                    return Err(AdminError::Conflict(
                        "upstream OAuth is not configured on this gateway (upstream.token_key_file)".into(),
                    ));
                };
                let (tenant, user) = owner_ids(&mut *c, tenant, user.as_deref()).await?;
                check_protected(&self.db, tenant, server, user.is_some()).await?;
                let secret =
                    crate::store::vault::create_login_on(c, tenant, server, user, crate::store::vault::LOGIN_TTL)
                        .await
                        .map_err(super::vault_error)?;
                applied.secret = Some(format!("{public_url}{}/{secret}", crate::vocab::routes::START_PATH));
            }
            Write::SetProvisioning { tenant, role_claim, roles } => {
                let tenant = super::tenant_id(&mut *c, tenant).await?;
                let config =
                    crate::store::provisioning::Provisioning { role_claim: role_claim.clone(), roles: roles.clone() };
                crate::store::provisioning::set(c, tenant, &config).await?;
            }
            Write::DeleteProvisioning { tenant: slug } => {
                let tenant = super::tenant_id(&mut *c, slug).await?;
                if !crate::store::provisioning::delete(c, tenant).await? {
                    return Err(AdminError::NotFound(format!("`{slug}` does not provision users on first sight")));
                }
            }
            Write::TrustIssuer { tenant, trust } => {
                let new = crate::store::issuers::NewIssuer {
                    issuer: trust.issuer.clone(),
                    jwks_url: trust.jwks_url.clone(),
                    audience: trust.audience.clone(),
                    subject_claim: trust.subject_claim.clone().unwrap_or_else(|| "sub".to_owned()),
                    tenant_claim: trust.tenant_claim.clone(),
                    console_client_id: trust.console_client_id.clone(),
                    console_scopes: trust.console_scopes.clone(),
                };
                self.check_issuer(&new)?;
                crate::store::issuers::add(c, tenant, &new).await?;
            }
            Write::DistrustIssuer { tenant, issuer } => crate::store::issuers::remove(c, tenant, issuer).await?,
            Write::OauthLogout { tenant, server, user } => {
                let (tenant, user) = owner_ids(&mut *c, tenant, user.as_deref()).await?;
                if !crate::store::vault::delete_on(c, tenant, server, user).await.map_err(super::vault_error)? {
                    return Err(AdminError::NotFound(format!("no credential stored for `{server}` of that owner")));
                }
            }
        }
        Ok(applied)
    }
}

impl Admin {
    /// An issuer a tenant may trust: of the shapes [`crate::store::issuers::NewIssuer::check`]
    /// admits under `auth.tenant_issuers_insecure`, and not the gateway's own issuer, whose
    /// tokens are the gateway's (a tenant trusting it could claim the tokens of every tenant's users).
    fn check_issuer(&self, new: &crate::store::issuers::NewIssuer) -> Result<(), AdminError> {
        // Fail closed: a service built without the gateway's auth settings trusts nothing.
        let Some(rules) = &self.issuers else {
            return Err(AdminError::Conflict("this service does not know the gateway's own issuer".into()));
        };
        let bare = |url: &str| url.trim_end_matches('/').to_owned();
        if bare(&new.issuer) == bare(&rules.own) {
            return Err(AdminError::Invalid {
                field: "issuer",
                message: "is the gateway's own issuer (auth.issuer): its tokens are trusted already".into(),
            });
        }
        new.check(rules.insecure)?;
        Ok(())
    }
}

/// The tenant's id and, when a subject is given, that user's.
async fn owner_ids(
    c: &mut AnyConnection,
    tenant: &str,
    subject: Option<&str>,
) -> Result<(TenantId, Option<crate::store::UserId>), AdminError> {
    let tenant = admin::tenant_id_by_slug(&mut *c, tenant).await?;
    let user = match subject {
        Some(subject) => Some(admin::user_id_by_subject(c, tenant, subject).await?),
        None => None,
    };
    Ok((tenant, user))
}

/// A login is for a bound server declared with `oauth`, held per user exactly when a user is
/// named.
async fn check_protected(
    db: &crate::store::Db,
    tenant: TenantId,
    server: &str,
    for_user: bool,
) -> Result<(), AdminError> {
    use crate::decl::Transport;
    use crate::decl::declaration::TokenScope;
    let entity = db
        .resolve_server(tenant, server)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("server `{server}` is not bound for the tenant")))?;
    let value: Value = serde_json::from_str(&entity.declaration)
        .map_err(|e| AdminError::Invalid { field: "server", message: format!("its stored declaration: {e}") })?;
    let parsed = crate::decl::parse_declarations(&json!({ server: value }).to_string())
        .map_err(|e| AdminError::Invalid { field: "server", message: e.to_string() })?;
    let spec = parsed.servers.first().and_then(|s| match &s.transport {
        Transport::Http { oauth: Some(spec), .. } => Some(spec.clone()),
        _ => None,
    });
    let refused = |message: String| AdminError::Invalid { field: "user", message };
    match spec {
        None => Err(AdminError::Invalid {
            field: "server",
            message: format!("server `{server}` is not declared with \"oauth\""),
        }),
        Some(spec) if (spec.tokens == TokenScope::User) != for_user => Err(refused(if for_user {
            format!("server `{server}` keeps one login for the tenant: name no user")
        } else {
            format!("server `{server}` keeps a login per user: name the user")
        })),
        Some(_) => Ok(()),
    }
}

/// A declaration must be one valid `.mcp.json` server entry.
fn check_declaration(server: &str, declaration: &Value) -> Result<(), AdminError> {
    if !declaration.is_object() {
        return Err(AdminError::Invalid { field: "declaration", message: "must be a JSON object".into() });
    }
    let text = json!({ server: declaration }).to_string();
    let parsed = crate::decl::parse_declarations(&text)
        .map_err(|e| AdminError::Invalid { field: "declaration", message: e.to_string() })?;
    if let Some(error) = parsed.errors.first() {
        let message = match &error.field {
            Some(field) => format!("field `{field}`: {}", error.problem),
            None => error.problem.clone(),
        };
        return Err(AdminError::Invalid { field: "declaration", message });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::admits;

    #[test]
    fn if_match_compares_strong_tags_and_star() {
        assert!(admits("\"abc\"", Some("abc")));
        assert!(admits("\"x\", \"abc\"", Some("abc")));
        assert!(admits("*", Some("abc")));
        assert!(!admits("*", None));
        assert!(!admits("\"abc\"", None));
        assert!(!admits("W/\"abc\"", Some("abc")));
        assert!(!admits("abc", Some("abc")));
        assert!(!admits("\"abd\"", Some("abc")));
    }
}
