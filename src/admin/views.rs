//! What the admin API shows of each resource, and how a collection is paged. The same
//! representations are what an audit event's before and after digests are taken of, and what
//! an entity tag is the digest of.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AdminError;

/// A tenant (a customer of the SaaS).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    /// Lowercase letters, digits and dashes; the `tid` claim of its users' tokens.
    pub slug: String,
    pub name: String,
    /// `active`, `suspended`, or `retired` (for good: no token of it is accepted, nothing of
    /// it changes but a purge of its data; its audit chain stays).
    pub status: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// When it was retired (milliseconds since the Unix epoch), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retired_at: Option<i64>,
    /// Its organization id at the identity provider, when one is recorded: a token whose
    /// tenant claim holds it names this tenant (`auth.tenant_match = "org_id"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub org_id: Option<String>,
    /// Each call's audit record is committed before the call is forwarded (else while the
    /// upstream works; either way before its answer).
    #[serde(default)]
    pub audit_write_ahead: bool,
}

/// A user of a tenant, with its roles there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UserView {
    /// The `sub` claim of the user's tokens.
    pub subject: String,
    pub display_name: String,
    /// `active` or `disabled`.
    pub status: String,
    /// Sorted: `owner`, `manager`, `worker`, `auditor`.
    pub roles: Vec<String>,
    pub created_at: i64,
}

/// A flock of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FlockView {
    pub name: String,
    pub breed: String,
    pub hen_count: i64,
}

/// A worker's assignment to a flock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AssignmentView {
    pub subject: String,
    pub flock: String,
}

/// Where upstream servers run. Never shows a secret or its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecutorView {
    pub name: String,
    pub machine: String,
    pub run_as: String,
    /// `local` or `remote`.
    pub kind: String,
    /// The owning tenants' slugs, sorted (empty for `local`).
    pub owners: Vec<String>,
}

/// A server declaration stored under a hierarchical name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EntityView {
    /// `machines/M/profile/mcp-servers/S`, `users/U/mcp-servers/S` or `defaults/mcp-servers/S`.
    pub name: String,
    pub server: String,
    /// The declaration, as a `.mcp.json` server entry.
    #[schema(value_type = Object)]
    pub declaration: serde_json::Value,
}

/// A tenant's server id bound to an executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BindingView {
    pub server: String,
    pub executor: String,
    /// Whether the server's tools and prompts are named `server__name`.
    pub prefixed: bool,
    /// How its upstream definitions are pinned: `approve`, `trust_first_use` or `follow`.
    pub pin: crate::store::definitions::PinMode,
}

/// A role's grant of a tool, prompt or resource of a bound server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrantView {
    /// Names this grant in `/grants/{id}`.
    pub id: String,
    pub server: String,
    pub role: String,
    /// `tool`, `prompt` or `resource`.
    pub kind: String,
    /// A tool's or prompt's own name, a resource URI (or prefix ending in `*`), or `*`.
    pub name: String,
    /// Who confirms each call it allows: `caller` or `approver`; absent: nobody.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm: Option<String>,
    /// The grant as the Cedar permit policy it is (named `grant/<id>` in decisions).
    pub cedar: String,
}

/// A role's allowance of plugin roots at or below a folder of a remote executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RootAllowanceView {
    pub id: String,
    pub executor: String,
    /// A canonical `file:` URI.
    pub base: String,
    pub role: String,
}

/// A stored upstream OAuth credential, described (never its content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CredentialView {
    pub server: String,
    /// The subject of the user whose own credential it is; absent for the tenant's.
    pub user: Option<String>,
    /// `ok`, or `login_needed` after a refresh failed.
    pub status: String,
    pub updated_at: i64,
}

/// A tenant's provisioning of users on first sight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProvisioningView {
    /// The claim of the users' tokens that holds their groups (a string or an array of them).
    pub role_claim: String,
    /// Each group and the roles it gives; a group not listed gives none.
    pub roles: std::collections::BTreeMap<String, Vec<String>>,
}

/// What trusting an identity provider names: the admin API's body, the command line's
/// arguments, the console's form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct IssuerTrust {
    /// The `iss` of its tokens: an https URL on a public host (unless
    /// `auth.tenant_issuers_insecure`), never the gateway's own `auth.issuer`.
    pub issuer: String,
    /// Where its keys are (https, no query); absent: found through the issuer's metadata.
    #[arg(long)]
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// The `aud` its tokens must carry; absent: the gateway's own audience.
    #[arg(long)]
    #[serde(default)]
    pub audience: Option<String>,
    /// Where the user's subject is: a claim name or a JSON pointer (default `sub`).
    #[arg(long)]
    #[serde(default)]
    pub subject_claim: Option<String>,
    /// For an issuer several tenants trust: the claim whose value must be the tenant's slug.
    #[arg(long)]
    #[serde(default)]
    pub tenant_claim: Option<String>,
    /// The console's public client at this provider (registered there with the redirect URI
    /// `{public_url}/console/signin/callback`): the tenant's people sign in to the console
    /// through it. Absent: the console does not.
    #[arg(long)]
    #[serde(default)]
    pub console_client_id: Option<String>,
    /// The scopes the console asks for, space-separated (default `openid`).
    #[arg(long, requires = "console_client_id")]
    #[serde(default)]
    pub console_scopes: Option<String>,
}

/// An identity provider a tenant trusts besides the gateway's own: its tokens sign the
/// tenant's users in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct IssuerView {
    /// The `iss` of its tokens (an https URL).
    pub issuer: String,
    /// Where its keys are; null: found through the issuer's metadata.
    pub jwks_url: Option<String>,
    /// The `aud` its tokens must carry; null: the gateway's own audience.
    pub audience: Option<String>,
    /// Where the user's subject is: a claim name or a JSON pointer.
    pub subject_claim: String,
    /// For an issuer several tenants trust: the claim whose value must be this tenant's slug;
    /// null: every token of the issuer names this tenant.
    pub tenant_claim: Option<String>,
    /// The console's public client at this provider; null: the console does not sign in
    /// through it.
    pub console_client_id: Option<String>,
    /// The scopes the console asks this provider for; null: `openid`.
    pub console_scopes: Option<String>,
    /// Where the tenant's people start the console's sign-in through their provider (a path of
    /// the gateway); null without a console client.
    pub console_signin: Option<String>,
    pub created_at: i64,
}

/// One page of a collection, in the order of its key.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Page {
    #[schema(value_type = Vec<Object>)]
    pub items: Vec<serde_json::Value>,
    /// Pass as `after` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Which page of a collection.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Items per page, 1 to 500 (default 50).
    pub limit: Option<u32>,
    /// The `next` of the page before.
    pub after: Option<String>,
}

pub(super) const DEFAULT_LIMIT: u32 = 50;
pub(crate) const MAX_LIMIT: u32 = 500;

impl PageQuery {
    pub(super) fn limit(&self) -> Result<u32, AdminError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            Some(_) => Err(AdminError::Invalid { field: "limit", message: format!("must be 1 to {MAX_LIMIT}") }),
        }
    }

    /// The key parts the page starts after (as many as `parts`), or none for the first page.
    pub(super) fn cursor(&self, parts: usize) -> Result<Option<Vec<String>>, AdminError> {
        let Some(after) = &self.after else { return Ok(None) };
        let bad = || AdminError::Invalid { field: "after", message: "not a cursor this collection gave".into() };
        let bytes = URL_SAFE_NO_PAD.decode(after).map_err(|_| bad())?;
        let key: Vec<String> = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        if key.len() != parts {
            return Err(bad());
        }
        Ok(Some(key))
    }
}

/// The cursor that resumes after the item with these key parts.
pub(super) fn cursor_after(key: &[&str]) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(key).unwrap_or_default())
}
