//! The administrative service: every act of `scopegate admin` and of the admin API
//! (`/admin/v1/`), in one place, so the two can't drift. Each act names what it needs
//! ([`Need`]) and is refused before anything is read unless the caller's [`Authority`] has it.
//! A write runs in one transaction: the change, its audit event in each affected tenant's
//! chain (who, what, the digests of the resource before and after) and, with an idempotency
//! key, the answer a retry gets, all commit together or not at all.

pub mod approvals;
mod audit;
mod authority;
pub mod definitions;
mod idempotency;
pub mod policies;
pub mod read;
pub mod report;
pub mod views;
mod write;

use sqlx::AnyConnection;

pub use audit::{BrokenView, ChainStatus, CheckpointView, EventFilter, EventView, UnknownView};
pub use authority::{Authority, Member, Need};
pub use idempotency::Idempotency;
pub use read::{Collection, Target};
pub use views::*;
pub use write::{Caller, Done, Write};

use crate::store::{Db, StoreError};

/// Why an administrative act was refused. Each maps to one HTTP status and names, where it
/// can, the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The caller's authority does not cover the act (its own tenant, the wrong role).
    #[error("this act needs another role")]
    Forbidden,
    /// Refused for the reason given (the caller may hold the role, but not for this act).
    #[error("{0}")]
    Denied(String),
    /// No such resource, or one of another tenant (answered alike).
    #[error("{0}")]
    NotFound(String),
    #[error("invalid {field}: {message}")]
    Invalid { field: &'static str, message: String },
    #[error("{0}")]
    Conflict(String),
    /// `If-Match` names another version than the current one (or the resource is gone).
    #[error("the resource is not the version If-Match names")]
    PreconditionFailed,
    /// An `Idempotency-Key` sent again with another request.
    #[error("this Idempotency-Key was used with another request")]
    KeyReused,
    /// A policy that does not parse or validate: each problem with its line and column.
    #[error("the policy does not validate: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidPolicy(Vec<crate::policy::Problem>),
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(m) => AdminError::NotFound(m),
            StoreError::Conflict(m) => AdminError::Conflict(m),
            StoreError::Invalid { field, message } => AdminError::Invalid { field, message },
            other => AdminError::Store(other),
        }
    }
}

impl From<sqlx::Error> for AdminError {
    fn from(e: sqlx::Error) -> Self {
        AdminError::Store(StoreError::Sql(e))
    }
}

/// The administrative service over one database.
#[derive(Clone)]
pub struct Admin {
    db: Db,
    /// The gateway's native tool names: an unprefixed binding must not shadow one.
    native_tools: std::sync::Arc<[String]>,
    /// Where checkpoints are written and the key that signs them (the audit page holds the
    /// chain against them).
    audit: Option<std::sync::Arc<crate::config::AuditConfig>>,
    /// The gateway's public URL, when upstream OAuth logins are served (the vault has a key):
    /// a login's start link is under it.
    oauth: Option<std::sync::Arc<str>>,
    /// What an issuer a tenant trusts is checked against; none: no issuer is trusted.
    issuers: Option<std::sync::Arc<IssuerRules>>,
    /// The gateway's native tools as policies see them (a tenant's schema names them).
    vocabulary: std::sync::Arc<policies::PolicyVocabulary>,
}

/// The gateway's settings a tenant's trusted issuer is checked against.
#[derive(Debug, Clone)]
struct IssuerRules {
    /// `auth.issuer`: never a tenant's.
    own: String,
    /// `auth.tenant_issuers_insecure`: admits `http://` and loopback or private hosts.
    insecure: bool,
}

impl Admin {
    pub fn new(db: Db, native_tools: Vec<String>) -> Self {
        Self {
            db,
            native_tools: native_tools.into(),
            audit: None,
            oauth: None,
            issuers: None,
            vocabulary: std::sync::Arc::default(),
        }
    }

    /// The service of a gateway whose native tools are `tools` (the policy schema names them).
    pub fn with_native_facts(mut self, tools: Vec<crate::policy::ToolFacts>) -> Self {
        std::sync::Arc::make_mut(&mut self.vocabulary).native = tools;
        self
    }

    /// The decision a call would get (see [`policies::check`]), for an owner or auditor.
    pub async fn check_policy(
        &self,
        who: &Authority,
        tenant: &str,
        request: &policies::CheckRequest,
    ) -> Result<policies::CheckAnswer, AdminError> {
        who.authorize(Need::Inspect(tenant))?;
        let mut conn = self.db.begin_read().await?;
        let id = tenant_id(&mut conn, tenant).await?;
        policies::check(&mut conn, id, tenant, &self.vocabulary, request).await
    }

    /// The tools `user` may call now (see [`policies::callable`]), for an owner or auditor.
    pub async fn policy_callable(&self, who: &Authority, tenant: &str, user: &str) -> Result<Vec<String>, AdminError> {
        who.authorize(Need::Inspect(tenant))?;
        let mut conn = self.db.begin_read().await?;
        let id = tenant_id(&mut conn, tenant).await?;
        policies::callable(&mut conn, id, tenant, &self.vocabulary, user).await
    }

    /// The users who may call `tool` now (see [`policies::callers`]), for an owner or auditor.
    pub async fn policy_callers(&self, who: &Authority, tenant: &str, tool: &str) -> Result<Vec<String>, AdminError> {
        who.authorize(Need::Inspect(tenant))?;
        let mut conn = self.db.begin_read().await?;
        let id = tenant_id(&mut conn, tenant).await?;
        policies::callers(&mut conn, id, tenant, &self.vocabulary, tool).await
    }

    /// The service with the audit configuration (checkpoints) of a running gateway.
    pub fn with_audit(mut self, audit: crate::config::AuditConfig) -> Self {
        self.audit = Some(std::sync::Arc::new(audit));
        self
    }

    /// The service of a gateway with these auth settings: tenants may trust identity providers
    /// of their own (checked against `auth.issuer` and `auth.tenant_issuers_insecure`).
    pub fn with_auth(mut self, auth: &crate::config::AuthConfig) -> Self {
        let rules = IssuerRules { own: auth.issuer.clone(), insecure: auth.tenant_issuers_insecure };
        self.issuers = Some(std::sync::Arc::new(rules));
        std::sync::Arc::make_mut(&mut self.vocabulary).claims = auth.policy_claims.clone();
        self
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The service of a gateway that serves upstream OAuth logins at `public_url`.
    pub fn with_oauth(mut self, public_url: &str) -> Self {
        self.oauth = Some(public_url.into());
        self
    }

    /// Ok when the tenant exists (NotFound otherwise).
    pub async fn tenant_exists(&self, slug: &str) -> Result<(), AdminError> {
        let mut conn = self.db.begin_read().await?;
        tenant_id(&mut conn, slug).await.map(|_| ())
    }

    /// One resource with its entity tag, if `who` may read it.
    pub async fn get(&self, who: &Authority, target: &Target) -> Result<Tagged, AdminError> {
        who.authorize(target.need())?;
        let mut conn = self.db.begin_read().await?;
        let view =
            target.view(&mut conn, &self.vocabulary).await?.ok_or_else(|| AdminError::NotFound(target.missing()))?;
        Ok(Tagged::new(view))
    }

    /// Every item of a collection, page after page (the console's lists, the CLI's listings, the
    /// status pages).
    pub async fn list_all(
        &self,
        who: &Authority,
        collection: &Collection,
    ) -> Result<Vec<serde_json::Value>, AdminError> {
        let mut items = Vec::new();
        let mut query = PageQuery { limit: Some(views::MAX_LIMIT), after: None };
        loop {
            let page = self.list(who, collection, &query).await?;
            items.extend(page.items);
            match page.next {
                Some(next) => query.after = Some(next),
                None => return Ok(items),
            }
        }
    }

    /// One page of a collection, if `who` may read it.
    pub async fn list(&self, who: &Authority, collection: &Collection, page: &PageQuery) -> Result<Page, AdminError> {
        who.authorize(collection.need())?;
        let mut conn = self.db.begin_read().await?;
        collection.page(&mut conn, page, &self.vocabulary).await
    }
}

/// A resource's representation and its entity tag: the SHA-256 of its canonical JSON, so the
/// tag changes exactly when the representation does, and the audit trail's before and after
/// digests are the tags a client saw.
#[derive(Debug, Clone)]
pub struct Tagged {
    pub view: serde_json::Value,
    pub etag: String,
}

impl Tagged {
    pub fn new(view: serde_json::Value) -> Self {
        let etag = digest(&view);
        Self { view, etag }
    }
}

/// The digest of a representation (hex SHA-256 of its canonical JSON).
pub fn digest(view: &serde_json::Value) -> String {
    crate::vocab::digest::sha256_hex(crate::vocab::digest::canonical_json(view).as_bytes())
}

/// A vault's refusal as an administrative one.
fn vault_error(e: crate::store::vault::VaultError) -> AdminError {
    match e {
        crate::store::vault::VaultError::Store(e) => AdminError::from(e),
        other => AdminError::Store(StoreError::Invalid { field: "vault", message: other.to_string() }),
    }
}

/// The tenant's id, or NotFound.
async fn tenant_id(conn: &mut AnyConnection, slug: &str) -> Result<crate::store::TenantId, AdminError> {
    Ok(crate::store::admin::tenant_id_by_slug(conn, slug).await?)
}

/// Where the console's sign-ins through tenants' providers start: `{this}/{tenant}`.
pub const CONSOLE_SIGNIN_TENANTS: &str = "/console/signin/tenants";

/// Where a tenant's people start the console's sign-in through the providers their tenant
/// trusts (a path of the gateway; the console serves it).
pub fn console_signin_path(tenant_slug: &str) -> String {
    let slug = percent_encoding::utf8_percent_encode(tenant_slug, percent_encoding::NON_ALPHANUMERIC);
    format!("{CONSOLE_SIGNIN_TENANTS}/{slug}")
}
