//! Policies as the administrative service shows, validates and explains them: a tenant's (and
//! the platform's) Cedar policies with whether each validates against the schema generated now,
//! the validation of a text before it is written, and the decision a call would get, taken from
//! the database alone (the recorded tool catalogue; no upstream is called).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sqlx::AnyConnection;
use utoipa::ToSchema;

use super::AdminError;
use crate::policy::engine::{self, Problem, TenantPolicies};
use crate::policy::{Catalogue, ToolFacts, model};

/// What a tenant's policy schema is made of besides the database: the gateway's native tools
/// and the token claims policies read (`auth.policy_claims`).
#[derive(Debug, Clone, Default)]
pub struct PolicyVocabulary {
    pub native: Vec<ToolFacts>,
    pub claims: Vec<String>,
}
use crate::store::{TenantId, policies};

/// One Cedar policy of a tenant (or of the platform).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PolicyView {
    /// Names it in `/policies/{id}`, and in decisions and the audit.
    pub id: String,
    /// Its Cedar text, as written.
    pub text: String,
    /// `enforce` (it decides) or `log_only` (evaluated and audited, deciding nothing).
    pub mode: String,
    /// SHA-256 of the text.
    pub digest: String,
    /// Whether it validates against the tenant's schema as generated now. One that does not
    /// (a tool it reads changed) forbids everything its scope names until it is fixed.
    pub valid: bool,
    #[schema(value_type = Vec<Object>)]
    pub problems: Vec<Problem>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The schema a tenant's policies are validated against: its bound servers, the tools recorded
/// for them and the native tools (`None` for the platform's).
pub(crate) async fn catalogue_of(
    conn: &mut AnyConnection,
    tenant: TenantId,
    slug: &str,
    vocabulary: &PolicyVocabulary,
) -> Result<Catalogue, AdminError> {
    let servers = policies::bound_servers(&mut *conn, tenant).await?;
    let recorded = policies::catalogue(&mut *conn, tenant).await?;
    Ok(crate::policy::model::catalogue(slug, &vocabulary.native, servers, &recorded, &vocabulary.claims))
}

fn schema_of(catalogue: Option<&Catalogue>, claims: &[String]) -> Result<cedar_policy::Schema, AdminError> {
    cedar_policy::Schema::from_json_value(model::schema_json(catalogue, claims))
        .map_err(|e| AdminError::Invalid { field: "schema", message: e.to_string() })
}

/// What is wrong with `text` as policy `id` against `catalogue` (`None`: the platform's schema).
pub(crate) fn problems(
    catalogue: Option<&Catalogue>,
    claims: &[String],
    id: &str,
    text: &str,
) -> Result<Vec<Problem>, AdminError> {
    let schema = schema_of(catalogue, claims)?;
    Ok(engine::problems(&schema, catalogue, id, text))
}

/// Refuses a policy id the gateway can't take, and a text that does not validate (422 with
/// each problem's line and column).
pub(crate) fn check_text(
    catalogue: Option<&Catalogue>,
    claims: &[String],
    id: &str,
    text: &str,
) -> Result<(), AdminError> {
    if !engine::valid_id(id) {
        return Err(AdminError::Invalid {
            field: "id",
            message: format!(
                "`{id}`: a policy id is 1 to 64 letters, digits, `_`, `-` or `.`, and not `check`, `callable` or `callers`"
            ),
        });
    }
    let problems = problems(catalogue, claims, id, text)?;
    if problems.is_empty() { Ok(()) } else { Err(AdminError::InvalidPolicy(problems)) }
}

/// `owner`'s policies as views, each validated against `catalogue`.
pub(crate) async fn views(
    conn: &mut AnyConnection,
    owner: TenantId,
    catalogue: Option<&Catalogue>,
    claims: &[String],
) -> Result<Vec<PolicyView>, AdminError> {
    let rows = policies::list_policies(conn, owner).await?;
    let schema = schema_of(catalogue, claims)?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let problems = engine::problems(&schema, catalogue, &row.name, &row.body);
            PolicyView {
                id: row.name,
                text: row.body,
                mode: row.mode,
                digest: row.digest,
                valid: problems.is_empty(),
                problems,
                created_at: row.created_at,
                updated_at: row.updated_at,
            }
        })
        .collect())
}

/// A call to explain: who, which tool (named as that user lists it), with which arguments.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// The user's subject.
    pub user: String,
    /// The tool as the user lists it (`server__tool`, an unprefixed server's tool, or a native tool).
    pub tool: String,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub arguments: Map<String, Value>,
    /// The client's declared name, if the call is to be taken as coming from one.
    #[serde(default)]
    pub client: Option<String>,
}

/// The decision a call would get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CheckAnswer {
    /// `allow` or `deny`.
    pub decision: String,
    /// The ids of the policies that decided: the permits (policies and `grant/...`) that allow
    /// it, or the forbids that refuse it; none when nothing permits it.
    pub policies: Vec<String>,
    /// `permit`, `forbid`, `no_permit`, `policy_error` or `arguments_invalid`.
    pub reason: String,
    /// For `policy_error` and `arguments_invalid`: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// What the log-only policies (with the rest) would have decided, when there are some (a
    /// decision of this same shape).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub log_only: Option<Box<CheckAnswer>>,
}

impl CheckAnswer {
    fn of(decision: &crate::policy::Decision) -> Self {
        let detail = match &decision.reason {
            crate::policy::Reason::PolicyError(why) => Some(why.clone()),
            crate::policy::Reason::ArgumentsInvalid(m) => Some(m.to_string()),
            _ => None,
        };
        Self {
            decision: if decision.allow { "allow" } else { "deny" }.to_owned(),
            policies: decision.by.clone(),
            reason: decision.reason.label().to_owned(),
            detail,
            log_only: None,
        }
    }
}

/// A user as policies see them.
struct Person {
    subject: String,
    roles: Vec<crate::model::Role>,
    /// `None`: every flock of the tenant.
    flocks: Option<Vec<String>>,
    /// The token claims the check takes the call as carrying.
    claims: Vec<(String, String)>,
}

async fn person(conn: &mut AnyConnection, tenant: TenantId, subject: &str) -> Result<Person, AdminError> {
    let missing = || AdminError::NotFound(format!("user `{subject}` does not exist in this tenant"));
    let (role_names, flocks) =
        policies::user_roles_and_flocks(&mut *conn, tenant, subject).await?.ok_or_else(missing)?;
    let roles: Vec<crate::model::Role> = role_names.iter().filter_map(|r| r.parse().ok()).collect();
    let all_flocks = roles.iter().any(|r| r.sees_all_flocks());
    Ok(Person { subject: subject.to_owned(), roles, flocks: (!all_flocks).then_some(flocks), claims: Vec::new() })
}

/// What a tenant's decisions are taken from, read once: its policies and the platform's, its
/// catalogue, its grants and which server is bound without a prefix.
pub(crate) struct Explainer {
    slug: String,
    catalogue: Catalogue,
    policies: TenantPolicies,
    grants: Vec<crate::store::entities::GrantRow>,
    bare: Option<String>,
}

impl Explainer {
    pub(crate) async fn load(
        conn: &mut AnyConnection,
        tenant: TenantId,
        slug: &str,
        vocabulary: &PolicyVocabulary,
    ) -> Result<Self, AdminError> {
        let catalogue = catalogue_of(&mut *conn, tenant, slug, vocabulary).await?;
        let platform = policies::list_policies(&mut *conn, crate::store::admin::platform_chain()).await?;
        let own = policies::list_policies(&mut *conn, tenant).await?;
        let mode = policies::policy_mode(&mut *conn, tenant).await?;
        let grants = crate::store::entities::list_grants(&mut *conn, slug).await?;
        let bindings = crate::store::entities::list_bindings(&mut *conn, slug).await?;
        // Loaded as the gateway loads them, so the check explains what the gateway decides.
        let policies = TenantPolicies::from_stored(&catalogue, &mode, own, platform)
            .unwrap_or_else(|why| TenantPolicies::failed(slug, why));
        let bare = bindings.iter().find(|b| !b.prefixed).map(|b| b.server.clone());
        Ok(Self { slug: slug.to_owned(), catalogue, policies, grants, bare })
    }

    /// The name `tool` is listed under.
    fn exposed(&self, tool: &ToolFacts) -> String {
        match &tool.server {
            Some(server) if self.bare.as_deref() == Some(server.as_str()) => tool.name.clone(),
            _ => tool.id.clone(),
        }
    }

    /// What allows `person` to call `tool` before policies (a grant's id, or a native tool's
    /// roles); `Err(())`: a native tool whose roles do not name them (nothing can allow it).
    fn base(&self, person: &Person, tool: &ToolFacts) -> Result<Option<String>, ()> {
        match (&tool.server, &tool.roles) {
            (_, Some(allowed)) if !person.roles.iter().any(|r| allowed.contains(r)) => Err(()),
            (_, Some(_)) => Ok(Some(crate::policy::NATIVE_ROLES.to_owned())),
            (Some(server), None) => Ok(self
                .grants
                .iter()
                .find(|g| g.covers(server, crate::store::entities::GrantKind::Tool, &tool.name, &person.roles))
                .map(super::read::grant_policy_id)),
            (None, None) => Ok(None),
        }
    }

    fn caller<'a>(&'a self, person: &'a Person) -> engine::Caller<'a> {
        engine::Caller {
            tenant: &self.slug,
            subject: &person.subject,
            roles: &person.roles,
            flocks: person.flocks.as_deref(),
            claims: &person.claims,
        }
    }

    fn circumstances(client: Option<&str>) -> engine::Circumstances<'_> {
        engine::Circumstances { revision: "", client, stateless: true, now: time::OffsetDateTime::now_utc() }
    }

    fn check(&self, person: &Person, request: &CheckRequest) -> CheckAnswer {
        let unknown = || CheckAnswer {
            decision: "deny".into(),
            policies: Vec::new(),
            reason: "no_permit".into(),
            detail: None,
            log_only: None,
        };
        let Some(tool) = self.catalogue.tools.iter().find(|t| self.exposed(t) == request.tool) else {
            return unknown();
        };
        let Ok(base) = self.base(person, tool) else { return unknown() };
        let circumstances = Self::circumstances(request.client.as_deref());
        let outcome = self.policies.decide_call(
            &self.caller(person),
            tool,
            base.as_deref(),
            Some(&request.arguments),
            &circumstances,
        );
        let mut answer = CheckAnswer::of(&outcome.decision);
        answer.log_only = outcome.log_only.as_ref().map(|d| Box::new(CheckAnswer::of(d)));
        answer
    }

    /// Whether `tool` is listed for `person` (some call of it could be permitted).
    fn lists(&self, person: &Person, tool: &ToolFacts, client: Option<&str>) -> bool {
        let Ok(base) = self.base(person, tool) else { return false };
        self.policies.decide_list(&self.caller(person), tool, base.as_deref(), &Self::circumstances(client))
    }
}

/// The decision `request` would get in tenant `slug` now: the tenant's and the platform's
/// policies, the grants, the user's roles and flocks, the tool's recorded definition. Calls
/// nothing. A tool the user has no name for answers as a call of it would: denied, no policy.
pub(crate) async fn check(
    conn: &mut AnyConnection,
    tenant: TenantId,
    slug: &str,
    vocabulary: &PolicyVocabulary,
    request: &CheckRequest,
) -> Result<CheckAnswer, AdminError> {
    let person = person(&mut *conn, tenant, &request.user).await?;
    Ok(Explainer::load(conn, tenant, slug, vocabulary).await?.check(&person, request))
}

/// The tools `subject` may call now, by the names they are listed under (calls nothing).
pub(crate) async fn callable(
    conn: &mut AnyConnection,
    tenant: TenantId,
    slug: &str,
    vocabulary: &PolicyVocabulary,
    subject: &str,
) -> Result<Vec<String>, AdminError> {
    let person = person(&mut *conn, tenant, subject).await?;
    let explainer = Explainer::load(conn, tenant, slug, vocabulary).await?;
    let mut tools: Vec<String> = explainer
        .catalogue
        .tools
        .iter()
        .filter(|t| explainer.lists(&person, t, None))
        .map(|t| explainer.exposed(t))
        .collect();
    tools.sort();
    Ok(tools)
}

/// The tenant's active users who may call `tool` now (some call of it could be permitted).
pub(crate) async fn callers(
    conn: &mut AnyConnection,
    tenant: TenantId,
    slug: &str,
    vocabulary: &PolicyVocabulary,
    tool: &str,
) -> Result<Vec<String>, AdminError> {
    let subjects = policies::active_subjects(&mut *conn, tenant).await?;
    let explainer = Explainer::load(&mut *conn, tenant, slug, vocabulary).await?;
    let Some(facts) = explainer.catalogue.tools.iter().find(|t| explainer.exposed(t) == tool) else {
        return Err(AdminError::NotFound(format!("tool `{tool}` is not one of this tenant's")));
    };
    let mut out = Vec::new();
    for subject in subjects {
        let person = person(&mut *conn, tenant, &subject).await?;
        if explainer.lists(&person, facts, None) {
            out.push(subject);
        }
    }
    Ok(out)
}
