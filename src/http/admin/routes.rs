//! The admin API's routes. Each handler turns its request into one act of the administrative
//! service (which checks the caller's authority first) and its answer into a response; the
//! `#[utoipa::path]` on each is the OpenAPI description of that route, registered with it.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Uri};
use serde::Deserialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{AdminApi, JsonBody, Params, Problem, Refusal, caller, done, paged, tagged};
use crate::admin::policies::{CheckAnswer, CheckRequest, PolicyView};
use crate::admin::report::ReportFormat;
use crate::admin::{
    AssignmentView, Authority, BindingView, ChainStatus, Collection, EntityView, EventFilter, EventView, ExecutorView,
    FlockView, GrantView, IssuerTrust, IssuerView, Page, PageQuery, RootAllowanceView, Target, TenantView, UserView,
    Write, read::grant_key,
};
use crate::model::{Role, TenantStatus, UserStatus};
use crate::policy::Mode;
use crate::store::definitions::PinMode;
use crate::store::entities::GrantKind;

type Who = Extension<Arc<Authority>>;
type Answer = Result<Response, Refusal>;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "scopegate admin API",
        description = "Tenants, users, roles, flocks, assignments, executors, server declarations, bindings, \
                       grants, root allowances and trusted identity providers of an identity-scoped MCP gateway. Every change is audited \
                       in the tenant's hash-chained audit trail."
    ),
    components(schemas(Problem, EventView, crate::admin::CredentialView, IssuerView)),
    modifiers(&Bearer),
    security(("bearer" = []))
)]
struct Doc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build()),
        );
    }
}

/// Every route of the admin API with its description.
pub(super) fn api() -> OpenApiRouter<AdminApi> {
    OpenApiRouter::with_openapi(Doc::openapi())
        .routes(routes!(list_tenants, create_tenant))
        .routes(routes!(get_tenant, update_tenant, delete_tenant))
        .routes(routes!(purge_tenant))
        .routes(routes!(list_users, create_user))
        .routes(routes!(get_user, update_user, delete_user))
        .routes(routes!(add_role, remove_role))
        .routes(routes!(list_flocks, create_flock))
        .routes(routes!(get_flock, delete_flock))
        .routes(routes!(list_assignments, create_assignment))
        .routes(routes!(get_assignment, delete_assignment))
        .routes(routes!(list_executors, create_executor))
        .routes(routes!(get_executor, delete_executor))
        .routes(routes!(rotate_executor_secret))
        .routes(routes!(add_executor_owner, remove_executor_owner))
        .routes(routes!(list_entities, create_entity))
        .routes(routes!(import_entities))
        .routes(routes!(get_entity, delete_entity))
        .routes(routes!(list_bindings))
        .routes(routes!(get_binding, set_binding, delete_binding))
        .routes(routes!(list_grants, create_grant))
        .routes(routes!(get_grant, delete_grant))
        .routes(routes!(list_root_allowances, create_root_allowance))
        .routes(routes!(get_root_allowance, delete_root_allowance))
        .routes(routes!(audit_events))
        .routes(routes!(audit_verification))
        .routes(routes!(audit_export))
        .routes(routes!(guard_report))
        .routes(routes!(get_provisioning, set_provisioning, delete_provisioning))
        .routes(routes!(list_issuers, trust_issuer))
        .routes(routes!(get_issuer, distrust_issuer))
        .routes(routes!(oauth_login))
        .routes(routes!(list_credentials))
        .routes(routes!(oauth_logout))
        .routes(routes!(executor_status))
        .routes(routes!(server_status))
        .routes(routes!(session_status))
        .routes(routes!(list_policies))
        .routes(routes!(check_policies))
        .routes(routes!(callable_tools))
        .routes(routes!(tool_callers))
        .routes(routes!(get_policy, put_policy, delete_policy))
        .routes(routes!(get_policy_mode, set_policy_mode))
        .routes(routes!(list_platform_policies))
        .routes(routes!(get_platform_policy, put_platform_policy, delete_platform_policy))
        .routes(routes!(list_definitions))
        .routes(routes!(get_definition))
        .routes(routes!(approve_definition))
        .routes(routes!(reject_definition))
        .routes(routes!(list_approvals))
        .routes(routes!(get_approval))
        .routes(routes!(approve_call))
        .routes(routes!(reject_call))
}

async fn one(api: &AdminApi, who: &Authority, target: Target) -> Answer {
    Ok(tagged(api.admin.get(who, &target).await?))
}

async fn page(api: &AdminApi, who: &Authority, collection: Collection, query: &PageQuery, uri: &Uri) -> Answer {
    Ok(paged(api.admin.list(who, &collection, query).await?, uri))
}

async fn change(
    api: &AdminApi,
    who: &Authority,
    headers: &HeaderMap,
    fingerprint: Option<&str>,
    write: Write,
) -> Answer {
    let caller = caller(who, headers, fingerprint)?;
    Ok(done(api.admin.write(&caller, write).await?))
}

// ---- tenants ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    slug: String,
    name: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct TenantPatch {
    name: Option<String>,
    /// `active` or `suspended`.
    #[schema(value_type = Option<String>)]
    status: Option<TenantStatus>,
    /// The tenant's organization id at the identity provider (`org_AbC123`); `""` clears it.
    org_id: Option<String>,
    /// Commit each call's audit record before the call is forwarded (no upstream sees a call
    /// that is not recorded), at the cost of waiting for the commit and then the upstream.
    audit_write_ahead: Option<bool>,
}

/// Every tenant (platform administrators).
#[utoipa::path(get, path = "/admin/v1/tenants", tag = "tenants", params(PageQuery),
    responses((status = 200, body = Page), (status = 403, body = Problem)))]
async fn list_tenants(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Tenants, &q, &uri).await
}

/// Create a tenant (platform administrators). Send an `Idempotency-Key` so that a retried
/// sign-up never makes two.
#[utoipa::path(post, path = "/admin/v1/tenants", tag = "tenants", request_body = NewTenant,
    params(("Idempotency-Key" = Option<String>, Header, description = "A key of the client's choosing: a retry answers what the first request did")),
    responses((status = 201, body = TenantView), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_tenant(
    State(api): State<AdminApi>,
    Extension(who): Who,
    headers: HeaderMap,
    body: JsonBody<NewTenant>,
) -> Answer {
    let NewTenant { slug, name } = body.value;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::CreateTenant { slug, name }).await
}

/// A tenant (its owners, platform administrators).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}", tag = "tenants", params(("tenant" = String, Path)),
    responses((status = 200, body = TenantView), (status = 404, body = Problem)))]
async fn get_tenant(State(api): State<AdminApi>, Extension(who): Who, Path(tenant): Path<String>) -> Answer {
    one(&api, &who, Target::Tenant { slug: tenant }).await
}

/// Rename, suspend or activate a tenant, record its organization id at the identity
/// provider, or turn its write-ahead audit on or off (platform administrators).
#[utoipa::path(patch, path = "/admin/v1/tenants/{tenant}", tag = "tenants", request_body = TenantPatch,
    params(("tenant" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 200, body = TenantView), (status = 412, body = Problem), (status = 422, body = Problem)))]
async fn update_tenant(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<TenantPatch>,
) -> Answer {
    let TenantPatch { name, status, org_id, audit_write_ahead } = body.value;
    let write = Write::UpdateTenant { slug: tenant, name, status, org_id, audit_write_ahead };
    change(&api, &who, &headers, None, write).await
}

/// Retire a tenant (platform administrators): it is suspended for good (no token of it is
/// accepted, nothing of it changes but a purge of its data), and its audit chain stays,
/// verifiable and exportable. Nothing erases a tenant's chain. Answers the retired tenant.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}", tag = "tenants",
    params(("tenant" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 200, body = TenantView), (status = 409, body = Problem)))]
async fn delete_tenant(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::RetireTenant { slug: tenant }).await
}

/// Purge a retired tenant's data (platform administrators): its users, flocks, server
/// declarations, bindings, grants, executor ownerships, root allowances, stored credentials and
/// provisioning. Its audit chain stays, and the purge is recorded in it and in the platform
/// chain. Refused (409) for a tenant that is not retired.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/purge", tag = "tenants",
    params(("tenant" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 200, body = TenantView), (status = 409, body = Problem)))]
async fn purge_tenant(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::PurgeTenant { slug: tenant }).await
}

// ---- users and roles ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewUser {
    subject: String,
    display_name: String,
    /// At least one of `owner`, `manager`, `worker`, `auditor`.
    #[schema(value_type = Vec<String>)]
    roles: Vec<Role>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UserPatch {
    display_name: Option<String>,
    /// `active` or `disabled`.
    #[schema(value_type = Option<String>)]
    status: Option<UserStatus>,
    /// The whole set of roles (at least one).
    #[schema(value_type = Option<Vec<String>>)]
    roles: Option<Vec<Role>>,
}

/// A tenant's users (its owners).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/users", tag = "users", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page), (status = 404, body = Problem)))]
async fn list_users(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Users { tenant }, &q, &uri).await
}

/// Add a user with its roles (the tenant's owners).
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/users", tag = "users", request_body = NewUser,
    params(("tenant" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = UserView), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_user(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<NewUser>,
) -> Answer {
    let NewUser { subject, display_name, roles } = body.value;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::CreateUser { tenant, subject, display_name, roles })
        .await
}

/// A user.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/users/{subject}", tag = "users",
    params(("tenant" = String, Path), ("subject" = String, Path)),
    responses((status = 200, body = UserView), (status = 404, body = Problem)))]
async fn get_user(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, subject)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::User { tenant, subject }).await
}

/// Change a user's display name, status (disable, enable) or roles.
#[utoipa::path(patch, path = "/admin/v1/tenants/{tenant}/users/{subject}", tag = "users", request_body = UserPatch,
    params(("tenant" = String, Path), ("subject" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 200, body = UserView), (status = 412, body = Problem), (status = 422, body = Problem)))]
async fn update_user(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, subject)): Path<(String, String)>,
    headers: HeaderMap,
    body: JsonBody<UserPatch>,
) -> Answer {
    let UserPatch { display_name, status, roles } = body.value;
    change(&api, &who, &headers, None, Write::UpdateUser { tenant, subject, display_name, status, roles }).await
}

/// Delete a user.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/users/{subject}", tag = "users",
    params(("tenant" = String, Path), ("subject" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_user(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, subject)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeleteUser { tenant, subject }).await
}

/// Give a user a role.
#[utoipa::path(put, path = "/admin/v1/tenants/{tenant}/users/{subject}/roles/{role}", tag = "users",
    params(("tenant" = String, Path), ("subject" = String, Path), ("role" = String, Path)),
    responses((status = 200, body = UserView), (status = 409, body = Problem)))]
async fn add_role(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, subject, role)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Answer {
    let role = parse_role(&role)?;
    change(&api, &who, &headers, None, Write::AddRole { tenant, subject, role }).await
}

/// Take a role from a user.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/users/{subject}/roles/{role}", tag = "users",
    params(("tenant" = String, Path), ("subject" = String, Path), ("role" = String, Path)),
    responses((status = 200, body = UserView), (status = 404, body = Problem)))]
async fn remove_role(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, subject, role)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Answer {
    let role = parse_role(&role)?;
    change(&api, &who, &headers, None, Write::RemoveRole { tenant, subject, role }).await
}

fn parse_role(role: &str) -> Result<Role, Refusal> {
    role.parse().map_err(|e: crate::model::UnknownRole| {
        Refusal(crate::admin::AdminError::Invalid { field: "role", message: e.to_string() })
    })
}

// ---- flocks and assignments ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewFlock {
    name: String,
    breed: String,
    hen_count: i64,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewAssignment {
    subject: String,
    flock: String,
}

/// A tenant's flocks.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/flocks", tag = "flocks", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page)))]
async fn list_flocks(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Flocks { tenant }, &q, &uri).await
}

/// Add a flock.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/flocks", tag = "flocks", request_body = NewFlock,
    params(("tenant" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = FlockView), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_flock(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<NewFlock>,
) -> Answer {
    let NewFlock { name, breed, hen_count } = body.value;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::CreateFlock { tenant, name, breed, hen_count }).await
}

/// A flock.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/flocks/{flock}", tag = "flocks",
    params(("tenant" = String, Path), ("flock" = String, Path)),
    responses((status = 200, body = FlockView), (status = 404, body = Problem)))]
async fn get_flock(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, name)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::Flock { tenant, name }).await
}

/// Delete a flock (and its assignments).
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/flocks/{flock}", tag = "flocks",
    params(("tenant" = String, Path), ("flock" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_flock(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeleteFlock { tenant, name }).await
}

/// Workers' flock assignments.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/assignments", tag = "flocks", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page)))]
async fn list_assignments(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Assignments { tenant }, &q, &uri).await
}

/// Assign a user to a flock.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/assignments", tag = "flocks", request_body = NewAssignment,
    params(("tenant" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = AssignmentView), (status = 409, body = Problem)))]
async fn create_assignment(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<NewAssignment>,
) -> Answer {
    let NewAssignment { subject, flock } = body.value;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::Assign { tenant, subject, flock }).await
}

/// An assignment.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/assignments/{subject}/{flock}", tag = "flocks",
    params(("tenant" = String, Path), ("subject" = String, Path), ("flock" = String, Path)),
    responses((status = 200, body = AssignmentView), (status = 404, body = Problem)))]
async fn get_assignment(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, subject, flock)): Path<(String, String, String)>,
) -> Answer {
    one(&api, &who, Target::Assignment { tenant, subject, flock }).await
}

/// Remove an assignment.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/assignments/{subject}/{flock}", tag = "flocks",
    params(("tenant" = String, Path), ("subject" = String, Path), ("flock" = String, Path)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_assignment(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, subject, flock)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::Unassign { tenant, subject, flock }).await
}

// ---- executors ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewExecutor {
    name: String,
    machine: String,
    /// The user the executor runs servers as.
    run_as: String,
    /// `local` (the default) or `remote`.
    #[serde(default = "local")]
    kind: String,
    /// The tenants that own a remote executor (at least one); none for a local one.
    #[serde(default)]
    owners: Vec<String>,
}

fn local() -> String {
    "local".into()
}

/// Every executor (platform administrators).
#[utoipa::path(get, path = "/admin/v1/executors", tag = "executors", params(PageQuery), responses((status = 200, body = Page)))]
async fn list_executors(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Executors, &q, &uri).await
}

/// Create an executor. A remote one's secret is in the answer's `secret`, this once.
#[utoipa::path(post, path = "/admin/v1/executors", tag = "executors", request_body = NewExecutor,
    params(("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = ExecutorView), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_executor(
    State(api): State<AdminApi>,
    Extension(who): Who,
    headers: HeaderMap,
    body: JsonBody<NewExecutor>,
) -> Answer {
    let NewExecutor { name, machine, run_as, kind, owners } = body.value;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::CreateExecutor { name, machine, run_as, kind, owners })
        .await
}

/// An executor.
#[utoipa::path(get, path = "/admin/v1/executors/{executor}", tag = "executors", params(("executor" = String, Path)),
    responses((status = 200, body = ExecutorView), (status = 404, body = Problem)))]
async fn get_executor(State(api): State<AdminApi>, Extension(who): Who, Path(name): Path<String>) -> Answer {
    one(&api, &who, Target::Executor { name }).await
}

/// Delete an executor no tenant binds servers to.
#[utoipa::path(delete, path = "/admin/v1/executors/{executor}", tag = "executors",
    params(("executor" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 409, body = Problem)))]
async fn delete_executor(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeleteExecutor { name }).await
}

/// Give a remote executor a new secret (in the answer's `secret`, this once); the old one
/// stops working at once.
#[utoipa::path(post, path = "/admin/v1/executors/{executor}/secret", tag = "executors", params(("executor" = String, Path)),
    responses((status = 200, body = ExecutorView), (status = 422, body = Problem)))]
async fn rotate_executor_secret(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::RotateExecutorSecret { name }).await
}

/// Let a tenant bind servers to a remote executor.
#[utoipa::path(put, path = "/admin/v1/executors/{executor}/owners/{tenant}", tag = "executors",
    params(("executor" = String, Path), ("tenant" = String, Path)),
    responses((status = 200, body = ExecutorView), (status = 409, body = Problem)))]
async fn add_executor_owner(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((executor, tenant)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::AddExecutorOwner { executor, tenant }).await
}

/// Take a remote executor from a tenant (refused while it binds servers to it, and for the
/// last owner).
#[utoipa::path(delete, path = "/admin/v1/executors/{executor}/owners/{tenant}", tag = "executors",
    params(("executor" = String, Path), ("tenant" = String, Path)),
    responses((status = 200, body = ExecutorView), (status = 409, body = Problem)))]
async fn remove_executor_owner(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((executor, tenant)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::RemoveExecutorOwner { executor, tenant }).await
}

// ---- server declarations ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewEntity {
    /// `machines/M/profile/mcp-servers/S`, `users/U/mcp-servers/S` or `defaults/mcp-servers/S`.
    name: String,
    /// One `.mcp.json` server entry.
    #[schema(value_type = Object)]
    declaration: serde_json::Value,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct EntityImport {
    /// `defaults`, `users/USER` or `machines/MACHINE/profile`.
    under: String,
    /// A `.mcp.json` document (with or without `mcpServers`).
    #[schema(value_type = Object)]
    file: serde_json::Value,
}

/// A tenant's server declarations (platform administrators).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/entities", tag = "servers", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page)))]
async fn list_entities(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Entities { tenant }, &q, &uri).await
}

/// Store one server declaration (platform administrators).
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/entities", tag = "servers", request_body = NewEntity,
    params(("tenant" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = EntityView), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_entity(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<NewEntity>,
) -> Answer {
    let NewEntity { name, declaration } = body.value;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::CreateEntity { tenant, name, declaration }).await
}

/// Store every valid server of a `.mcp.json` document under one place; the invalid ones are
/// named in `skipped` (platform administrators).
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/entities/import", tag = "servers", request_body = EntityImport,
    params(("tenant" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, description = "`imported`: the names stored; `skipped`: each invalid server and why"), (status = 422, body = Problem)))]
async fn import_entities(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<EntityImport>,
) -> Answer {
    let EntityImport { under, file } = body.value;
    change(
        &api,
        &who,
        &headers,
        Some(&body.fingerprint),
        Write::ImportEntities { tenant, under, text: file.to_string() },
    )
    .await
}

/// A server declaration (its name percent-encoded as one segment: `users%2Fu%2Fmcp-servers%2Fs`).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/entities/{name}", tag = "servers",
    params(("tenant" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = EntityView), (status = 404, body = Problem)))]
async fn get_entity(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, name)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::Entity { tenant, name }).await
}

/// Delete a server declaration.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/entities/{name}", tag = "servers",
    params(("tenant" = String, Path), ("name" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_entity(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeleteEntity { tenant, name }).await
}

// ---- bindings ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BindingPut {
    executor: String,
    /// Name the server's tools and prompts `server__name` (the default); false for one server
    /// per tenant whose names stay its own.
    #[serde(default = "yes")]
    prefixed: bool,
    /// How the server's tool, prompt and resource template definitions are pinned:
    /// `approve` (held until an owner approves each), `trust_first_use` (approved on first
    /// sight, held when changed) or `follow` (not pinned: unsafe). Unset: a new binding's is
    /// `trust_first_use`, a rebinding keeps its own.
    #[serde(default)]
    pin: Option<PinMode>,
}

fn yes() -> bool {
    true
}

/// A tenant's bound servers.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/bindings", tag = "servers", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page)))]
async fn list_bindings(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Bindings { tenant }, &q, &uri).await
}

/// A binding.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/bindings/{server}", tag = "servers",
    params(("tenant" = String, Path), ("server" = String, Path)),
    responses((status = 200, body = BindingView), (status = 404, body = Problem)))]
async fn get_binding(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, server)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::Binding { tenant, server }).await
}

/// Bind (or rebind) a server id to an executor: `local`, or a remote one the tenant owns.
#[utoipa::path(put, path = "/admin/v1/tenants/{tenant}/bindings/{server}", tag = "servers", request_body = BindingPut,
    params(("tenant" = String, Path), ("server" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 201, body = BindingView), (status = 200, body = BindingView), (status = 422, body = Problem)))]
async fn set_binding(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, server)): Path<(String, String)>,
    headers: HeaderMap,
    body: JsonBody<BindingPut>,
) -> Answer {
    let BindingPut { executor, prefixed, pin } = body.value;
    change(&api, &who, &headers, None, Write::SetBinding { tenant, server, executor, prefixed, pin }).await
}

/// Unbind a server (its grants go with it).
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/bindings/{server}", tag = "servers",
    params(("tenant" = String, Path), ("server" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_binding(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, server)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeleteBinding { tenant, server }).await
}

// ---- grants ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewGrant {
    server: String,
    #[schema(value_type = String)]
    role: Role,
    /// `tool` (the default), `prompt` or `resource`.
    #[serde(default = "tool")]
    #[schema(value_type = String)]
    kind: GrantKind,
    /// A tool's or prompt's own name, a resource URI (or a prefix ending in `*`), or `*`.
    name: String,
    /// Who confirms each call the grant allows before it is forwarded (tool grants only):
    /// `caller` (the calling person, through the client) or `approver` (a second person with
    /// the approver role). Absent: nobody.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    confirm: Option<crate::model::Confirm>,
}

fn tool() -> GrantKind {
    GrantKind::Tool
}

/// A tenant's grants: no grant, no access.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/grants", tag = "grants", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page)))]
async fn list_grants(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Grants { tenant }, &q, &uri).await
}

/// Let a role use a tool, prompt or resource of a bound server.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/grants", tag = "grants", request_body = NewGrant,
    params(("tenant" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = GrantView), (status = 404, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_grant(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<NewGrant>,
) -> Answer {
    let NewGrant { server, role, kind, name, confirm } = body.value;
    let write = Write::CreateGrant { tenant, server, role, kind, name, confirm };
    change(&api, &who, &headers, Some(&body.fingerprint), write).await
}

/// A grant, by the `id` its listing gives.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/grants/{grant}", tag = "grants",
    params(("tenant" = String, Path), ("grant" = String, Path)),
    responses((status = 200, body = GrantView), (status = 404, body = Problem)))]
async fn get_grant(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::Grant { tenant, id }).await
}

/// Revoke a grant.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/grants/{grant}", tag = "grants",
    params(("tenant" = String, Path), ("grant" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_grant(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    let missing = || Refusal(crate::admin::AdminError::NotFound(format!("grant `{id}` does not exist in this tenant")));
    let [server, role, kind, name] = grant_key(&id).ok_or_else(missing)?;
    let (Ok(role), Ok(kind)) = (role.parse(), kind.parse()) else { return Err(missing()) };
    change(&api, &who, &headers, None, Write::DeleteGrant { tenant, server, role, kind, name }).await
}

// ---- root allowances ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewRootAllowance {
    /// A remote executor the tenant owns.
    executor: String,
    /// A canonical `file:` URI.
    base: String,
    #[schema(value_type = String)]
    role: Role,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct AllowanceQuery {
    /// Only this executor's allowances.
    executor: Option<String>,
    limit: Option<u32>,
    after: Option<String>,
}

/// A tenant's root allowances: no allowance, no root.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/root-allowances", tag = "roots",
    params(("tenant" = String, Path), AllowanceQuery), responses((status = 200, body = Page)))]
async fn list_root_allowances(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<AllowanceQuery>,
    uri: Uri,
) -> Answer {
    let query = PageQuery { limit: q.limit, after: q.after };
    page(&api, &who, Collection::RootAllowances { tenant, executor: q.executor }, &query, &uri).await
}

/// Let a role select plugin roots at or below a folder of a remote executor the tenant owns.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/root-allowances", tag = "roots", request_body = NewRootAllowance,
    params(("tenant" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = RootAllowanceView), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn create_root_allowance(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<NewRootAllowance>,
) -> Answer {
    let NewRootAllowance { executor, base, role } = body.value;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::AllowRoot { tenant, executor, base, role }).await
}

/// A root allowance.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/root-allowances/{id}", tag = "roots",
    params(("tenant" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = RootAllowanceView), (status = 404, body = Problem)))]
async fn get_root_allowance(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::RootAllowance { tenant, id }).await
}

/// Delete a root allowance.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/root-allowances/{id}", tag = "roots",
    params(("tenant" = String, Path), ("id" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_root_allowance(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeleteRoot { tenant, id }).await
}

// ---- the audit trail and the guard report ----

/// A tenant's audit events, newest first (its auditors, platform administrators). Each item is
/// an `EventView`.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/audit/events", tag = "audit",
    params(("tenant" = String, Path), EventFilter),
    responses((status = 200, body = Page, description = "items: EventView"), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn audit_events(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(filter): Params<EventFilter>,
    uri: Uri,
) -> Answer {
    Ok(paged(api.admin.audit_events(&who, &tenant, &filter).await?, &uri))
}

/// Whether a tenant's chain verifies, with the newest checkpoint that vouches for it.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/audit/verification", tag = "audit",
    params(("tenant" = String, Path)),
    responses((status = 200, body = ChainStatus), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn audit_verification(State(api): State<AdminApi>, Extension(who): Who, Path(tenant): Path<String>) -> Answer {
    Ok(axum::Json(api.admin.audit_status(&who, &tenant).await?).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ExportQuery {
    /// `jsonl` (the default) or `csv`.
    format: Option<String>,
    /// From the first event at or after this time on (Unix milliseconds).
    since: Option<i64>,
}

/// A tenant's chain as `scopegate audit export` writes it (each row checks itself and its
/// link; `scopegate audit verify-export` checks a whole export), streamed.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/audit/export", tag = "audit",
    params(("tenant" = String, Path), ExportQuery),
    responses((status = 200, description = "JSON lines (application/x-ndjson) or CSV (text/csv)"), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn audit_export(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<ExportQuery>,
) -> Answer {
    use crate::audit::export::Format;
    let (format, content_type) = match q.format.as_deref() {
        None | Some("jsonl") => (Format::Jsonl, "application/x-ndjson"),
        Some("csv") => (Format::Csv, "text/csv; charset=utf-8"),
        Some(_) => {
            return Err(Refusal(crate::admin::AdminError::Invalid {
                field: "format",
                message: "must be jsonl or csv".into(),
            }));
        }
    };
    let reader = api.admin.audit_export_stream((*who).clone(), tenant, q.since, format).await?;
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    Ok(([(http::header::CONTENT_TYPE, content_type)], body).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ReportQuery {
    /// `md` (the default), `json` or `sarif`.
    format: Option<String>,
}

/// The guard report of this build (owners and auditors of any tenant): the guard table, each
/// tool's dependency tree, the findings and the residue the walk can't see.
#[utoipa::path(get, path = "/admin/v1/guards/report", tag = "audit", params(ReportQuery),
    responses((status = 200, description = "Markdown, JSON or SARIF"), (status = 403, body = Problem)))]
async fn guard_report(Extension(who): Who, Params(q): Params<ReportQuery>) -> Answer {
    let (format, content_type) = match q.format.as_deref() {
        None | Some("md") => (ReportFormat::Md, "text/markdown; charset=utf-8"),
        Some("json") => (ReportFormat::Json, "application/json"),
        Some("sarif") => (ReportFormat::Sarif, "application/sarif+json"),
        Some(_) => {
            return Err(Refusal(crate::admin::AdminError::Invalid {
                field: "format",
                message: "must be md, json or sarif".into(),
            }));
        }
    };
    let text = crate::admin::report::guard_report(&who, format)?;
    Ok(([(http::header::CONTENT_TYPE, content_type)], text).into_response())
}

// ---- what the gateway is doing now ----

/// Every executor and its agent: connected, to which replica, when last heard, reconnects
/// (platform administrators).
#[utoipa::path(get, path = "/admin/v1/status/executors", tag = "status",
    responses((status = 200, body = Vec<super::status::ExecutorStatus>), (status = 403, body = Problem)))]
async fn executor_status(State(api): State<AdminApi>, Extension(who): Who) -> Answer {
    Ok(axum::Json(super::status::executors(&api, &who).await?).into_response())
}

/// A tenant's bound servers and the connections the answering replica holds to each:
/// negotiated revision, last failure, tools listed (its owners, platform administrators).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/servers", tag = "status", params(("tenant" = String, Path)),
    responses((status = 200, body = Vec<super::status::ServerStatus>), (status = 404, body = Problem)))]
async fn server_status(State(api): State<AdminApi>, Extension(who): Who, Path(tenant): Path<String>) -> Answer {
    Ok(axum::Json(super::status::servers(&api, &who, &tenant).await?).into_response())
}

/// Live MCP sessions per tenant on the answering replica (platform administrators).
#[utoipa::path(get, path = "/admin/v1/status/sessions", tag = "status",
    responses((status = 200, body = Vec<super::status::SessionCount>), (status = 403, body = Problem)))]
async fn session_status(State(api): State<AdminApi>, Extension(who): Who) -> Answer {
    Ok(axum::Json(super::status::sessions(&api, &who).await?).into_response())
}

// ---- upstream OAuth ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewLogin {
    /// A bound server declared with `oauth`.
    server: String,
    /// The subject of the user whose own login this is (a server declared with
    /// `"oauth": {"tokens": "user"}`); absent for the tenant's.
    user: Option<String>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct Whose {
    /// The subject of the user whose own credential it is; absent for the tenant's.
    user: Option<String>,
}

/// Ask for a login to an OAuth-protected server: the answer's `link` (good once, for
/// `expires_in_secs`) is opened in a browser by whoever logs in (the tenant's owners).
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/oauth/logins", tag = "oauth", request_body = NewLogin,
    params(("tenant" = String, Path)),
    responses((status = 201, description = "`link`, `server`, `user`, `expires_in_secs`"), (status = 404, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn oauth_login(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<NewLogin>,
) -> Answer {
    let NewLogin { server, user } = body.value;
    change(&api, &who, &headers, None, Write::OauthLogin { tenant, server, user }).await
}

/// The tenant's stored upstream OAuth credentials (never their content).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/oauth/credentials", tag = "oauth", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page, description = "items: CredentialView")))]
async fn list_credentials(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Credentials { tenant }, &q, &uri).await
}

/// Delete a stored credential (log out): the next call needs a new login.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/oauth/credentials/{server}", tag = "oauth",
    params(("tenant" = String, Path), ("server" = String, Path), Whose),
    responses((status = 204), (status = 404, body = Problem)))]
async fn oauth_logout(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, server)): Path<(String, String)>,
    Params(whose): Params<Whose>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::OauthLogout { tenant, server, user: whose.user }).await
}

// ---- users provisioned on first sight ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ProvisioningPut {
    /// The claim of the users' tokens that holds their groups (a string or an array of them).
    role_claim: String,
    /// Each group and the roles it gives; a group not listed gives none, and a token none of
    /// whose groups is listed makes no user.
    #[schema(value_type = std::collections::BTreeMap<String, Vec<String>>)]
    roles: std::collections::BTreeMap<String, Vec<Role>>,
}

/// The tenant's provisioning of users on first sight (404: off).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/provisioning", tag = "users", params(("tenant" = String, Path)),
    responses((status = 200, body = crate::admin::ProvisioningView), (status = 404, body = Problem)))]
async fn get_provisioning(State(api): State<AdminApi>, Extension(who): Who, Path(tenant): Path<String>) -> Answer {
    one(&api, &who, Target::Provisioning { tenant }).await
}

/// Make users on first sight: a verified token of a subject the tenant does not have becomes
/// a user with exactly the roles its groups map to here (the tenant's owners).
#[utoipa::path(put, path = "/admin/v1/tenants/{tenant}/provisioning", tag = "users", request_body = ProvisioningPut,
    params(("tenant" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 200, body = crate::admin::ProvisioningView), (status = 422, body = Problem)))]
async fn set_provisioning(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<ProvisioningPut>,
) -> Answer {
    let ProvisioningPut { role_claim, roles } = body.value;
    change(&api, &who, &headers, None, Write::SetProvisioning { tenant, role_claim, roles }).await
}

/// Stop making users on first sight.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/provisioning", tag = "users",
    params(("tenant" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_provisioning(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeleteProvisioning { tenant }).await
}

// ---- identity providers a tenant trusts ----

/// The identity providers the tenant trusts besides the gateway's own (its owners and auditors).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/issuers", tag = "issuers", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page, description = "items: IssuerView")))]
async fn list_issuers(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Issuers { tenant }, &q, &uri).await
}

/// Trust an identity provider: its tokens sign the tenant's users in (the tenant's owners).
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/issuers", tag = "issuers", request_body = IssuerTrust,
    params(("tenant" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = IssuerView), (status = 409, body = Problem), (status = 422, body = Problem)))]
async fn trust_issuer(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<IssuerTrust>,
) -> Answer {
    let write = Write::TrustIssuer { tenant, trust: body.value };
    change(&api, &who, &headers, Some(&body.fingerprint), write).await
}

/// A trusted identity provider (the issuer percent-encoded as one segment:
/// `https%3A%2F%2Flogin.example.com%2Facme`).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/issuers/{issuer}", tag = "issuers",
    params(("tenant" = String, Path), ("issuer" = String, Path)),
    responses((status = 200, body = IssuerView), (status = 404, body = Problem)))]
async fn get_issuer(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, issuer)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::Issuer { tenant, issuer }).await
}

/// Stop trusting an identity provider: its tokens no longer sign anyone in to the tenant.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/issuers/{issuer}", tag = "issuers",
    params(("tenant" = String, Path), ("issuer" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn distrust_issuer(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, issuer)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DistrustIssuer { tenant, issuer }).await
}

// ---- policies ----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PolicyPut {
    /// One Cedar policy (permit or forbid).
    text: String,
    /// `enforce` (the default: it decides) or `log_only` (evaluated and audited only).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    mode: Mode,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PlatformPolicyPut {
    /// One Cedar policy, taking part in every tenant's decisions.
    text: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ModePut {
    /// `enforce` or `log_only`.
    #[schema(value_type = String)]
    mode: Mode,
}

/// A tenant's Cedar policies, each with whether it validates against the schema now.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/policies", tag = "policies", params(("tenant" = String, Path), PageQuery),
    responses((status = 200, body = Page)))]
async fn list_policies(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::Policies { tenant }, &q, &uri).await
}

/// One of a tenant's policies.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/policies/{id}", tag = "policies",
    params(("tenant" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = PolicyView), (status = 404, body = Problem)))]
async fn get_policy(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::Policy { tenant, id }).await
}

/// Create or replace one of a tenant's policies (its owners). A policy that does not parse or
/// validate against the tenant's schema is refused with 422, each error with its line and column.
#[utoipa::path(put, path = "/admin/v1/tenants/{tenant}/policies/{id}", tag = "policies", request_body = PolicyPut,
    params(("tenant" = String, Path), ("id" = String, Path), ("If-Match" = Option<String>, Header), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = PolicyView), (status = 200, body = PolicyView), (status = 422, body = Problem)))]
async fn put_policy(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: JsonBody<PolicyPut>,
) -> Answer {
    let PolicyPut { text, mode } = body.value;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::PutPolicy { tenant, id, text, mode }).await
}

/// Delete one of a tenant's policies.
#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}/policies/{id}", tag = "policies",
    params(("tenant" = String, Path), ("id" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_policy(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeletePolicy { tenant, id }).await
}

/// The decision a call would get, and the policies that would take it; calls nothing (owners,
/// auditors).
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/policies/check", tag = "policies", request_body = CheckRequest,
    params(("tenant" = String, Path)),
    responses((status = 200, body = CheckAnswer), (status = 404, body = Problem)))]
async fn check_policies(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    body: JsonBody<CheckRequest>,
) -> Answer {
    Ok(axum::Json(api.admin.check_policy(&who, &tenant, &body.value).await?).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct OfUser {
    /// The user's subject.
    user: String,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct OfTool {
    /// The tool as users list it.
    tool: String,
}

/// The tools a user may call now (those listed for them), by the names they are listed under
/// (owners, auditors); calls nothing.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/policies/callable", tag = "policies",
    params(("tenant" = String, Path), OfUser),
    responses((status = 200, body = Object), (status = 404, body = Problem)))]
async fn callable_tools(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<OfUser>,
) -> Answer {
    let tools = api.admin.policy_callable(&who, &tenant, &q.user).await?;
    Ok(axum::Json(serde_json::json!({ "user": q.user, "tools": tools })).into_response())
}

/// The tenant's users who may call a tool now (owners, auditors); calls nothing.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/policies/callers", tag = "policies",
    params(("tenant" = String, Path), OfTool),
    responses((status = 200, body = Object), (status = 404, body = Problem)))]
async fn tool_callers(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<OfTool>,
) -> Answer {
    let users = api.admin.policy_callers(&who, &tenant, &q.tool).await?;
    Ok(axum::Json(serde_json::json!({ "tool": q.tool, "users": users })).into_response())
}

/// How a tenant's policies take part: `enforce` or `log_only`.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/policy-mode", tag = "policies", params(("tenant" = String, Path)),
    responses((status = 200, body = Object), (status = 404, body = Problem)))]
async fn get_policy_mode(State(api): State<AdminApi>, Extension(who): Who, Path(tenant): Path<String>) -> Answer {
    one(&api, &who, Target::PolicyMode { tenant }).await
}

/// Set how a tenant's policies take part (its owners).
#[utoipa::path(put, path = "/admin/v1/tenants/{tenant}/policy-mode", tag = "policies", request_body = ModePut,
    params(("tenant" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 200, body = Object), (status = 404, body = Problem)))]
async fn set_policy_mode(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: JsonBody<ModePut>,
) -> Answer {
    change(&api, &who, &headers, None, Write::SetPolicyMode { tenant, mode: body.value.mode }).await
}

// ---- pinned upstream definitions ----

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct DefinitionQuery {
    /// `held` (waiting for an owner), `approved`, `rejected`, `replaced` or `all` (the default).
    state: Option<String>,
    limit: Option<u32>,
    after: Option<String>,
}

/// The definitions of a tenant's pinned bindings' tools, prompts and resource templates (owners
/// and auditors). A held one is served nowhere until an owner approves or rejects it.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/definitions", tag = "definitions",
    params(("tenant" = String, Path), DefinitionQuery), responses((status = 200, body = Page), (status = 422, body = Problem)))]
async fn list_definitions(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<DefinitionQuery>,
    uri: Uri,
) -> Answer {
    let state = crate::store::definitions::DefinitionState::filter(q.state.as_deref().unwrap_or("all"))
        .map_err(crate::admin::AdminError::from)?;
    let query = PageQuery { limit: q.limit, after: q.after };
    page(&api, &who, Collection::Definitions { tenant, state }, &query, &uri).await
}

/// One definition, the approved one of its item, and what differs (the description line by
/// line, every other member by JSON path).
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/definitions/{id}", tag = "definitions",
    params(("tenant" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = crate::admin::definitions::DefinitionDetail), (status = 404, body = Problem)))]
async fn get_definition(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::Definition { tenant, id }).await
}

/// Approve a definition (its tenant's owners): it is served from now on, on every replica
/// within one read of the change counter; the one approved before is replaced. Audited with
/// both digests.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/definitions/{id}/approve", tag = "definitions",
    params(("tenant" = String, Path), ("id" = String, Path), ("If-Match" = Option<String>, Header), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = crate::admin::definitions::DefinitionDetail), (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn approve_definition(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    let decision = crate::store::definitions::Decision::Approve;
    change(&api, &who, &headers, None, Write::DecideDefinition { tenant, id, decision }).await
}

/// Reject a definition (its tenant's owners): it is never served. A held one stays held; an
/// approved one is withdrawn. An upstream that goes back to the approved definition is served
/// again without a new approval.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/definitions/{id}/reject", tag = "definitions",
    params(("tenant" = String, Path), ("id" = String, Path), ("If-Match" = Option<String>, Header), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = crate::admin::definitions::DefinitionDetail), (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn reject_definition(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    let decision = crate::store::definitions::Decision::Reject;
    change(&api, &who, &headers, None, Write::DecideDefinition { tenant, id, decision }).await
}

// ---- calls waiting for a second person ----

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ApprovalQuery {
    /// `pending` (waiting for an approver), `approved`, `rejected`, `lapsed` or `all` (the
    /// default).
    state: Option<String>,
    limit: Option<u32>,
    after: Option<String>,
}

/// An approver's decision's optional body.
#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    /// Why (at most 500 characters); a rejection's reason is told to the caller.
    reason: Option<String>,
}

/// The optional body of a decision: empty, or `{"reason": "..."}`.
fn decision_body(body: &[u8]) -> Result<Option<String>, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let body: DecisionBody = serde_json::from_slice(body).map_err(|e| {
        Refusal(crate::admin::AdminError::Invalid {
            field: "body",
            message: format!("{{\"reason\": \"...\"}} or nothing: {e}"),
        })
    })?;
    Ok(body.reason)
}

/// The tenant's calls waiting for a second person, newest first (its approvers, owners and
/// auditors). Each names the caller, the server, the tool and the exact arguments.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/approvals", tag = "approvals",
    params(("tenant" = String, Path), ApprovalQuery), responses((status = 200, body = Page), (status = 422, body = Problem)))]
async fn list_approvals(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(tenant): Path<String>,
    Params(q): Params<ApprovalQuery>,
    uri: Uri,
) -> Answer {
    let state = crate::store::approvals::ApprovalState::filter(q.state.as_deref().unwrap_or("all"))
        .map_err(crate::admin::AdminError::from)?;
    let query = PageQuery { limit: q.limit, after: q.after };
    page(&api, &who, Collection::Approvals { tenant, state }, &query, &uri).await
}

/// One call waiting for (or decided by) an approver.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/approvals/{id}", tag = "approvals",
    params(("tenant" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = crate::admin::approvals::ApprovalView), (status = 404, body = Problem)))]
async fn get_approval(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
) -> Answer {
    one(&api, &who, Target::Approval { tenant, id }).await
}

/// Approve a waiting call (the tenant's approvers; never the caller's own): it is forwarded
/// once, with the arguments shown. 409 when it was decided already or lapsed. Audited.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/approvals/{id}/approve", tag = "approvals",
    request_body(content = Option<DecisionBody>, description = "optional: `{\"reason\": \"...\"}`"),
    params(("tenant" = String, Path), ("id" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = crate::admin::approvals::ApprovalView), (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn approve_call(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Answer {
    let reason = decision_body(&body)?;
    let decision = crate::store::approvals::Decision::Approve;
    change(&api, &who, &headers, None, Write::DecideApproval { tenant, id, decision, reason }).await
}

/// Reject a waiting call (the tenant's approvers; never the caller's own): it is refused, and
/// the caller told the reason given. 409 when it was decided already or lapsed. Audited.
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/approvals/{id}/reject", tag = "approvals",
    request_body(content = Option<DecisionBody>, description = "optional: `{\"reason\": \"...\"}`"),
    params(("tenant" = String, Path), ("id" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = crate::admin::approvals::ApprovalView), (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn reject_call(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Answer {
    let reason = decision_body(&body)?;
    let decision = crate::store::approvals::Decision::Reject;
    change(&api, &who, &headers, None, Write::DecideApproval { tenant, id, decision, reason }).await
}

/// The platform's policies, which take part in every tenant's decisions (platform administrators).
#[utoipa::path(get, path = "/admin/v1/platform/policies", tag = "policies", params(PageQuery),
    responses((status = 200, body = Page), (status = 403, body = Problem)))]
async fn list_platform_policies(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Params(q): Params<PageQuery>,
    uri: Uri,
) -> Answer {
    page(&api, &who, Collection::PlatformPolicies, &q, &uri).await
}

/// One of the platform's policies.
#[utoipa::path(get, path = "/admin/v1/platform/policies/{id}", tag = "policies", params(("id" = String, Path)),
    responses((status = 200, body = PolicyView), (status = 404, body = Problem)))]
async fn get_platform_policy(State(api): State<AdminApi>, Extension(who): Who, Path(id): Path<String>) -> Answer {
    one(&api, &who, Target::PlatformPolicy { id }).await
}

/// Create or replace one of the platform's policies (validated against the schema every tenant
/// shares: principals, tools and their annotations, the circumstances; no tool's arguments).
#[utoipa::path(put, path = "/admin/v1/platform/policies/{id}", tag = "policies", request_body = PlatformPolicyPut,
    params(("id" = String, Path), ("If-Match" = Option<String>, Header), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = PolicyView), (status = 200, body = PolicyView), (status = 422, body = Problem)))]
async fn put_platform_policy(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: JsonBody<PlatformPolicyPut>,
) -> Answer {
    let text = body.value.text;
    change(&api, &who, &headers, Some(&body.fingerprint), Write::PutPlatformPolicy { id, text }).await
}

/// Delete one of the platform's policies.
#[utoipa::path(delete, path = "/admin/v1/platform/policies/{id}", tag = "policies",
    params(("id" = String, Path), ("If-Match" = Option<String>, Header)),
    responses((status = 204), (status = 404, body = Problem)))]
async fn delete_platform_policy(
    State(api): State<AdminApi>,
    Extension(who): Who,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Answer {
    change(&api, &who, &headers, None, Write::DeletePlatformPolicy { id }).await
}
