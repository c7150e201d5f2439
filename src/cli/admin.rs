//! `scopegate admin`: create, list and delete tenants, users, roles, flocks, assignments,
//! executors (and their owners and secrets), `mcp-server` entities, bindings, grants of
//! upstream tools, prompts and resources, allowances of plugin roots and the identity providers
//! a tenant trusts (`admin oauth`, the credential key, is in `oauth.rs`). Each command is one
//! transaction: an error names the field and leaves nothing half-written. Never prints a
//! secret before its transaction has committed.

use clap::{Args, Subcommand};

use super::CliError;
use crate::admin::{Admin, AdminError, Authority, Caller, Collection, Done, Target, Write};
use crate::config::Config;
use crate::model::{Role, TenantStatus, UserStatus};
use crate::store::definitions::Decision;
use crate::store::entities::GrantKind;
use crate::store::{Db, IfMissing, StoreError};

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Print listings as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Users of a tenant.
    #[command(subcommand)]
    User(UserCmd),
    /// Roles of a user.
    #[command(subcommand)]
    Role(RoleCmd),
    /// Flocks of a tenant.
    #[command(subcommand)]
    Flock(FlockCmd),
    /// Flock assignments of workers.
    #[command(subcommand)]
    Assignment(AssignmentCmd),
    /// Executors: where upstream MCP servers run.
    #[command(subcommand)]
    Executor(ExecutorCmd),
    /// `mcp-server` entities: server declarations under hierarchical names.
    #[command(subcommand)]
    Entity(EntityCmd),
    /// Bindings of a tenant's server ids to executors.
    #[command(subcommand)]
    Binding(BindingCmd),
    /// Grants of upstream tools, prompts and resources to roles: no grant, no access.
    #[command(subcommand)]
    Grant(GrantCmd),
    /// Plugin roots a role may select on a remote executor: no allowance, no root.
    #[command(subcommand)]
    Root(RootCmd),
    /// Identity providers a tenant trusts besides the gateway's own (`auth.issuer`).
    #[command(subcommand)]
    Issuer(IssuerCmd),
    /// A tenant's Cedar policies over the caller, the tool and its arguments.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// The platform's Cedar policies, which take part in every tenant's decisions.
    #[command(subcommand)]
    PlatformPolicy(PlatformPolicyCmd),
    /// Upstream tool, prompt and resource template definitions pinned per binding: list the
    /// held ones, show one's diff against the approved one, approve or reject it.
    #[command(subcommand)]
    Definition(DefinitionCmd),
    /// Calls waiting for a second person: list them, show one. Approvers decide them in the
    /// console or the admin API, as themselves; the operator's CLI never does.
    #[command(subcommand)]
    Approval(ApprovalCmd),
    /// The key that seals upstream OAuth credentials: create one, rotate to a new one.
    #[command(subcommand)]
    Oauth(super::oauth::OauthCmd),
}

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    Create {
        slug: String,
        #[arg(long)]
        name: String,
    },
    List,
    Suspend {
        slug: String,
    },
    Activate {
        slug: String,
    },
    /// Suspends the tenant for good; its data and its audit chain stay (`delete` is the same).
    #[command(visible_alias = "delete")]
    Retire {
        slug: String,
    },
    /// Removes a retired tenant's data (users, flocks, servers, grants, credentials); its audit
    /// chain stays.
    Purge {
        slug: String,
    },
    /// Records the tenant's organization id at the identity provider (`org_AbC123`), so that
    /// a token whose tenant claim holds it names this tenant (`auth.tenant_match = "org_id"`);
    /// `--clear` removes it.
    OrgId {
        slug: String,
        #[arg(required_unless_present = "clear")]
        org_id: Option<String>,
        #[arg(long, conflicts_with = "org_id")]
        clear: bool,
    },
    /// Turns the tenant's write-ahead audit on or off: on, each call's record is committed
    /// before the call is forwarded (no upstream sees a call that is not recorded), and the call
    /// waits for the commit, then for the upstream; off (the default), the record commits while
    /// the upstream works, and the answer still waits for it.
    WriteAhead {
        slug: String,
        #[arg(value_enum)]
        on: OnOff,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Subcommand)]
pub enum UserCmd {
    Create {
        #[arg(long)]
        tenant: String,
        subject: String,
        #[arg(long)]
        name: String,
        /// owner, manager, worker, auditor or approver (repeatable).
        #[arg(long = "role", required = true)]
        roles: Vec<Role>,
    },
    List {
        #[arg(long)]
        tenant: String,
    },
    Disable {
        #[arg(long)]
        tenant: String,
        subject: String,
    },
    Enable {
        #[arg(long)]
        tenant: String,
        subject: String,
    },
    Delete {
        #[arg(long)]
        tenant: String,
        subject: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum RoleCmd {
    Add {
        #[arg(long)]
        tenant: String,
        subject: String,
        role: Role,
    },
    Remove {
        #[arg(long)]
        tenant: String,
        subject: String,
        role: Role,
    },
}

#[derive(Debug, Subcommand)]
pub enum FlockCmd {
    Create {
        #[arg(long)]
        tenant: String,
        name: String,
        #[arg(long)]
        breed: String,
        #[arg(long)]
        hens: i64,
    },
    List {
        #[arg(long)]
        tenant: String,
    },
    Delete {
        #[arg(long)]
        tenant: String,
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum AssignmentCmd {
    Add {
        #[arg(long)]
        tenant: String,
        subject: String,
        flock: String,
    },
    Remove {
        #[arg(long)]
        tenant: String,
        subject: String,
        flock: String,
    },
    List {
        #[arg(long)]
        tenant: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ExecutorCmd {
    /// A remote executor's secret is printed alone on stdout, this once.
    Create {
        name: String,
        #[arg(long)]
        machine: String,
        /// The user the executor runs servers as.
        #[arg(long)]
        user: String,
        /// local or remote.
        #[arg(long, default_value = "local")]
        kind: String,
        /// A tenant that owns the remote executor (repeatable; at least one for remote, none
        /// for local).
        #[arg(long = "tenant")]
        tenants: Vec<String>,
    },
    List,
    /// Refused while any tenant binds servers to it.
    Delete {
        name: String,
    },
    /// A new secret for a remote executor, printed alone on stdout; the old one stops working.
    RotateSecret {
        name: String,
    },
    /// Owners of a remote executor: only they may bind servers to it.
    #[command(subcommand)]
    Owner(OwnerCmd),
}

#[derive(Debug, Subcommand)]
pub enum OwnerCmd {
    Add {
        #[arg(long)]
        tenant: String,
        executor: String,
    },
    /// Refused while the tenant binds servers to the executor, and for its last owner.
    Remove {
        #[arg(long)]
        tenant: String,
        executor: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum EntityCmd {
    /// Store one server declaration (a JSON object) under a hierarchical name.
    Add {
        #[arg(long)]
        tenant: String,
        /// machines/M/profile/mcp-servers/S, users/U/mcp-servers/S or defaults/mcp-servers/S.
        name: String,
        /// The declaration, as JSON.
        #[arg(long)]
        declaration: String,
    },
    /// Store every valid server of a `.mcp.json` file under one place. Invalid servers are
    /// reported (server and field) and skipped; their valid siblings are stored.
    Import {
        #[arg(long)]
        tenant: String,
        /// defaults, users/USER or machines/MACHINE/profile.
        #[arg(long)]
        under: String,
        /// The `.mcp.json` file.
        #[arg(long)]
        file: std::path::PathBuf,
    },
    List {
        #[arg(long)]
        tenant: String,
    },
    Delete {
        #[arg(long)]
        tenant: String,
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum BindingCmd {
    /// Bind (or rebind) a server id to an executor. Its tools and prompts are exposed as
    /// `SERVER__name` unless `--no-prefix` is given; rebinding without it restores the prefix.
    Set {
        #[arg(long)]
        tenant: String,
        server: String,
        executor: String,
        /// Expose the server's tools and prompts under their own names. Refused when another
        /// server of the tenant is already bound without a prefix.
        #[arg(long)]
        no_prefix: bool,
        /// How its tool, prompt and resource template definitions are pinned: `approve` (each
        /// held until an owner approves it), `trust_first_use` (approved on first sight, held
        /// when it changes) or `follow` (not pinned: unsafe). Not given: a new binding's is
        /// `trust_first_use`, a rebinding keeps its own.
        #[arg(long, value_parser = pin_mode)]
        pin: Option<crate::store::definitions::PinMode>,
    },
    List {
        #[arg(long)]
        tenant: String,
    },
    Delete {
        #[arg(long)]
        tenant: String,
        server: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum GrantCmd {
    /// Let a role use a tool, prompt or resource of a bound server.
    Add(GrantAdd),
    List {
        #[arg(long)]
        tenant: String,
    },
    Delete(GrantSpec),
}

#[derive(Debug, Args)]
pub struct GrantSpec {
    #[arg(long)]
    tenant: String,
    /// A server id the tenant has bound.
    #[arg(long)]
    server: String,
    /// owner, manager, worker, auditor or approver.
    #[arg(long)]
    role: Role,
    /// What the grant covers.
    #[arg(long, value_enum, default_value_t = GrantKind::Tool)]
    kind: GrantKind,
    /// The tool's or prompt's own name (without the `server__` prefix), a resource URI or URI
    /// prefix ending in `*`, or `*` for everything of the kind. `--tool` is accepted too.
    #[arg(long, visible_alias = "tool")]
    name: String,
}

#[derive(Debug, Args)]
pub struct GrantAdd {
    #[command(flatten)]
    spec: GrantSpec,
    /// Who confirms each call the grant allows, before it is forwarded (tool grants only):
    /// `caller` (the calling person, asked through the client) or `approver` (a second person
    /// of the tenant with the approver role). Not given: nobody.
    #[arg(long, value_enum)]
    confirm: Option<crate::model::Confirm>,
}

#[derive(Debug, Subcommand)]
pub enum DefinitionCmd {
    /// A tenant's definitions: the held ones unless `--state` says otherwise.
    List {
        #[arg(long)]
        tenant: String,
        /// `held`, `approved`, `rejected`, `replaced` or `all`.
        #[arg(long, default_value = "held")]
        state: String,
    },
    /// One definition, the approved one of its item, and what differs.
    Show {
        #[arg(long)]
        tenant: String,
        id: String,
    },
    /// Serve it: the one approved before is replaced.
    Approve {
        #[arg(long)]
        tenant: String,
        id: String,
    },
    /// Never serve it (a held one stays held; an approved one is withdrawn).
    Reject {
        #[arg(long)]
        tenant: String,
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ApprovalCmd {
    /// A tenant's calls waiting for an approver, newest first: the pending ones unless
    /// `--state` says otherwise.
    List {
        #[arg(long)]
        tenant: String,
        /// `pending`, `approved`, `rejected`, `lapsed` or `all`.
        #[arg(long, default_value = "pending")]
        state: String,
    },
    /// One of them, with the exact arguments it is forwarded with when approved.
    Show {
        #[arg(long)]
        tenant: String,
        id: String,
    },
}

fn pin_mode(text: &str) -> Result<crate::store::definitions::PinMode, String> {
    crate::store::definitions::PinMode::parse(text)
        .ok_or_else(|| format!("`{text}`: approve, trust_first_use or follow"))
}

#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Create or replace one of a tenant's policies; refused, naming line and column, when it
    /// does not validate against the tenant's schema.
    Put {
        #[arg(long)]
        tenant: String,
        /// The policy's id: letters, digits, `_`, `-`, `.`.
        id: String,
        /// The file holding its Cedar text (`-`: standard input).
        #[arg(long)]
        file: std::path::PathBuf,
        /// `enforce` (it decides) or `log_only` (evaluated and audited only).
        #[arg(long, default_value = "enforce", value_parser = mode)]
        mode: crate::policy::Mode,
    },
    List {
        #[arg(long)]
        tenant: String,
    },
    Delete {
        #[arg(long)]
        tenant: String,
        id: String,
    },
    /// The decision a call would get and the policies that would take it (calls nothing).
    Check {
        #[arg(long)]
        tenant: String,
        /// The caller's subject.
        #[arg(long)]
        user: String,
        /// The tool as that user lists it.
        #[arg(long)]
        tool: String,
        /// The call's arguments, a JSON object.
        #[arg(long, default_value = "{}")]
        arguments: String,
        /// The client's declared name.
        #[arg(long)]
        client: Option<String>,
    },
    /// The tools a user may call now, by the names they are listed under.
    Callable {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        user: String,
    },
    /// The users who may call a tool now.
    Callers {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        tool: String,
    },
    /// Whether the tenant's policies decide (`enforce`) or are only audited (`log_only`).
    Mode {
        #[arg(long)]
        tenant: String,
        #[arg(value_parser = mode)]
        mode: crate::policy::Mode,
    },
}

#[derive(Debug, Subcommand)]
pub enum PlatformPolicyCmd {
    /// Create or replace one of the platform's policies.
    Put {
        id: String,
        /// The file holding its Cedar text (`-`: standard input).
        #[arg(long)]
        file: std::path::PathBuf,
    },
    List,
    Delete {
        id: String,
    },
}

fn mode(text: &str) -> Result<crate::policy::Mode, String> {
    crate::policy::Mode::parse(text).ok_or_else(|| format!("`{text}`: enforce or log_only"))
}

/// A policy's text from `file` (`-`: standard input).
fn policy_text(file: &std::path::Path) -> Result<String, CliError> {
    let read =
        if file.as_os_str() == "-" { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(file) };
    Ok(read.map_err(|e| StoreError::Invalid { field: "file", message: format!("{}: {e}", file.display()) })?)
}

#[derive(Debug, Subcommand)]
pub enum RootCmd {
    /// Let a role select plugin roots at or below a base folder of a remote executor the
    /// tenant owns. Prints the allowance's id alone on stdout.
    Allow {
        #[arg(long)]
        tenant: String,
        /// A remote executor the tenant owns.
        #[arg(long)]
        executor: String,
        /// The base folder: a canonical `file:` URI (`file:///srv/plugins`, `file:///C:/plugins`).
        #[arg(long)]
        under: String,
        /// owner, manager, worker, auditor or approver.
        #[arg(long)]
        role: Role,
    },
    List {
        #[arg(long)]
        tenant: String,
        /// Only this executor's allowances.
        #[arg(long)]
        executor: Option<String>,
    },
    Delete {
        #[arg(long)]
        tenant: String,
        /// The allowance's id (from `allow` or `list`).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum IssuerCmd {
    /// Trust an identity provider: its tokens sign the tenant's users in. Its issuer and key
    /// set URLs must be https:// on public hosts (unless `auth.tenant_issuers_insecure`).
    Trust {
        #[arg(long)]
        tenant: String,
        #[command(flatten)]
        trust: crate::admin::IssuerTrust,
    },
    Distrust {
        #[arg(long)]
        tenant: String,
        issuer: String,
    },
    List {
        #[arg(long)]
        tenant: String,
    },
}

/// A row of a listing: named columns, printable as a table or JSON.
pub(super) type Listing = Vec<Vec<(&'static str, String)>>;

fn print(listing: &Listing, json: bool) {
    if json {
        let rows: Vec<serde_json::Map<String, serde_json::Value>> = listing
            .iter()
            .map(|row| row.iter().map(|(k, v)| ((*k).to_owned(), serde_json::Value::String(v.clone()))).collect())
            .collect();
        println!("{}", serde_json::Value::from(rows.into_iter().map(serde_json::Value::Object).collect::<Vec<_>>()));
        return;
    }
    let Some(first) = listing.first() else {
        println!("(none)");
        return;
    };
    let widths: Vec<usize> = (0..first.len())
        .map(|i| listing.iter().map(|r| r[i].1.len()).chain([first[i].0.len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<&str>| {
        cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_owned()
    };
    println!("{}", line(first.iter().map(|(k, _)| *k).collect()));
    for row in listing {
        println!("{}", line(row.iter().map(|(_, v)| v.as_str()).collect()));
    }
}

/// The columns a listing of `collection` prints: (heading, member of the item).
fn columns(collection: &Collection) -> &'static [(&'static str, &'static str)] {
    match collection {
        Collection::Tenants => &[("slug", "slug"), ("name", "name"), ("status", "status")],
        Collection::Users { .. } => {
            &[("subject", "subject"), ("display_name", "display_name"), ("status", "status"), ("roles", "roles")]
        }
        Collection::Flocks { .. } => &[("name", "name"), ("breed", "breed"), ("hen_count", "hen_count")],
        Collection::Assignments { .. } => &[("subject", "subject"), ("flock", "flock")],
        Collection::Executors => {
            &[("name", "name"), ("machine", "machine"), ("run_as", "run_as"), ("kind", "kind"), ("owners", "owners")]
        }
        Collection::Entities { .. } => &[("name", "name"), ("server", "server"), ("declaration", "declaration")],
        Collection::Bindings { .. } => {
            &[("server", "server"), ("executor", "executor"), ("prefix", "prefixed"), ("pin", "pin")]
        }
        Collection::Definitions { .. } => &[
            ("id", "id"),
            ("server", "server"),
            ("kind", "kind"),
            ("name", "name"),
            ("state", "state"),
            ("change", "change"),
            ("digest", "digest"),
        ],
        Collection::Grants { .. } => {
            &[("server", "server"), ("role", "role"), ("kind", "kind"), ("name", "name"), ("confirm", "confirm")]
        }
        Collection::Approvals { .. } => &[
            ("id", "id"),
            ("state", "state"),
            ("caller", "caller"),
            ("tool", "tool"),
            ("args_digest", "args_digest"),
            ("decided_by", "decided_by"),
        ],
        Collection::RootAllowances { .. } => {
            &[("id", "id"), ("executor", "executor"), ("base", "base"), ("role", "role")]
        }
        Collection::Credentials { .. } => {
            &[("server", "server"), ("user", "user"), ("status", "status"), ("updated_at", "updated_at")]
        }
        Collection::Policies { .. } | Collection::PlatformPolicies => {
            &[("id", "id"), ("mode", "mode"), ("valid", "valid"), ("digest", "digest")]
        }
        Collection::Issuers { .. } => &[
            ("issuer", "issuer"),
            ("jwks_url", "jwks_url"),
            ("audience", "audience"),
            ("subject_claim", "subject_claim"),
            ("tenant_claim", "tenant_claim"),
            ("console_client_id", "console_client_id"),
            ("console_scopes", "console_scopes"),
            ("console_signin", "console_signin"),
        ],
    }
}

/// One cell: text as it is, a list joined by commas, a flag as yes or no, anything else as JSON.
fn cell(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(cell).collect::<Vec<_>>().join(","),
        Value::Bool(true) => "yes".into(),
        Value::Bool(false) => "no".into(),
        // Absent (a grant that asks for no confirmation): an empty cell.
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Every item of `collection`, page after page, as a listing.
pub(super) async fn listing(service: &Admin, collection: Collection) -> Result<Listing, AdminError> {
    let items = service.list_all(&Authority::Cli, &collection).await?;
    Ok(items
        .iter()
        .map(|item| columns(&collection).iter().map(|(heading, member)| (*heading, cell(&item[*member]))).collect())
        .collect())
}

pub async fn run(config: &Config, args: AdminArgs) -> Result<(), CliError> {
    let args = match args {
        // Its own transaction (rotate-key) or no database at all (keygen).
        AdminArgs { command: AdminCommand::Oauth(cmd), .. } => return super::oauth::run(config, cmd).await,
        args => args,
    };
    let db = Db::connect(&config.database, IfMissing::Refuse).await?;
    db.migrate().await?;
    let native = crate::tools::TOOLS.iter().map(|t| t.name.to_owned()).collect();
    let native_facts = crate::mcp::ToolSet::native().policy_facts();
    let service = Admin::new(db.clone(), native).with_auth(&config.auth).with_native_facts(native_facts);
    let json = args.json;
    let result = execute(&service, args.command).await;
    db.close().await;
    match result? {
        Output::Listing(listing) => print(&listing, json),
        Output::Answer(answer) => println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default()),
        Output::Done(done) => {
            for skipped in &done.skipped {
                eprintln!("skipped: {skipped}");
            }
            if let Some(imported) = done.body.as_ref().and_then(|b| b.get("imported")).and_then(|i| i.as_array()) {
                let rows: Listing = imported.iter().map(|name| vec![("entity", cell(name))]).collect();
                print(&rows, json);
            } else if let Some(secret) = done.secret {
                // Printed only now, after the commit: a secret that was never stored is never shown.
                println!("{secret}");
                eprintln!("This executor secret is shown only once: store it now (rotate-secret makes a new one).");
            } else if let Some(id) = done.body.as_ref().filter(|_| done.status == 201).and_then(|b| b.get("id")) {
                // The id of a new row (a root allowance): alone on stdout.
                println!("{}", cell(id));
            }
        }
    }
    Ok(())
}

/// What a command prints once its transaction has committed.
enum Output {
    Listing(Listing),
    Done(Done),
    /// An answer that changes nothing (a policy check), printed as JSON.
    Answer(serde_json::Value),
}

/// Runs one command through the administrative service: a listing, or one write in one
/// transaction (audited as made by `cli`).
async fn execute(service: &Admin, command: AdminCommand) -> Result<Output, CliError> {
    use Write as W;
    let list = |collection: Collection| async move { listing(service, collection).await.map(Output::Listing) };
    let write = match command {
        AdminCommand::Tenant(cmd) => match cmd {
            TenantCmd::Create { slug, name } => W::CreateTenant { slug, name },
            TenantCmd::List => return Ok(list(Collection::Tenants).await?),
            TenantCmd::Suspend { slug } => W::UpdateTenant {
                slug,
                name: None,
                status: Some(TenantStatus::Suspended),
                org_id: None,
                audit_write_ahead: None,
            },
            TenantCmd::Activate { slug } => W::UpdateTenant {
                slug,
                name: None,
                status: Some(TenantStatus::Active),
                org_id: None,
                audit_write_ahead: None,
            },
            TenantCmd::OrgId { slug, org_id, clear: _ } => W::UpdateTenant {
                slug,
                name: None,
                status: None,
                org_id: Some(org_id.unwrap_or_default()),
                audit_write_ahead: None,
            },
            TenantCmd::WriteAhead { slug, on } => {
                let audit_write_ahead = Some(on == OnOff::On);
                W::UpdateTenant { slug, name: None, status: None, org_id: None, audit_write_ahead }
            }
            TenantCmd::Retire { slug } => W::RetireTenant { slug },
            TenantCmd::Purge { slug } => W::PurgeTenant { slug },
        },
        AdminCommand::User(cmd) => match cmd {
            UserCmd::Create { tenant, subject, name, roles } => {
                W::CreateUser { tenant, subject, display_name: name, roles }
            }
            UserCmd::List { tenant } => return Ok(list(Collection::Users { tenant }).await?),
            UserCmd::Disable { tenant, subject } => {
                W::UpdateUser { tenant, subject, display_name: None, status: Some(UserStatus::Disabled), roles: None }
            }
            UserCmd::Enable { tenant, subject } => {
                W::UpdateUser { tenant, subject, display_name: None, status: Some(UserStatus::Active), roles: None }
            }
            UserCmd::Delete { tenant, subject } => W::DeleteUser { tenant, subject },
        },
        AdminCommand::Role(cmd) => match cmd {
            RoleCmd::Add { tenant, subject, role } => W::AddRole { tenant, subject, role },
            RoleCmd::Remove { tenant, subject, role } => W::RemoveRole { tenant, subject, role },
        },
        AdminCommand::Flock(cmd) => match cmd {
            FlockCmd::Create { tenant, name, breed, hens } => W::CreateFlock { tenant, name, breed, hen_count: hens },
            FlockCmd::List { tenant } => return Ok(list(Collection::Flocks { tenant }).await?),
            FlockCmd::Delete { tenant, name } => W::DeleteFlock { tenant, name },
        },
        AdminCommand::Assignment(cmd) => match cmd {
            AssignmentCmd::Add { tenant, subject, flock } => W::Assign { tenant, subject, flock },
            AssignmentCmd::Remove { tenant, subject, flock } => W::Unassign { tenant, subject, flock },
            AssignmentCmd::List { tenant } => return Ok(list(Collection::Assignments { tenant }).await?),
        },
        AdminCommand::Executor(cmd) => match cmd {
            ExecutorCmd::Create { name, machine, user, kind, tenants } => {
                W::CreateExecutor { name, machine, run_as: user, kind, owners: tenants }
            }
            ExecutorCmd::List => return Ok(list(Collection::Executors).await?),
            ExecutorCmd::Delete { name } => W::DeleteExecutor { name },
            ExecutorCmd::RotateSecret { name } => W::RotateExecutorSecret { name },
            ExecutorCmd::Owner(OwnerCmd::Add { tenant, executor }) => W::AddExecutorOwner { executor, tenant },
            ExecutorCmd::Owner(OwnerCmd::Remove { tenant, executor }) => W::RemoveExecutorOwner { executor, tenant },
        },
        AdminCommand::Entity(cmd) => match cmd {
            EntityCmd::Add { tenant, name, declaration } => {
                let declaration = serde_json::from_str(&declaration).map_err(|e| StoreError::Invalid {
                    field: "declaration",
                    message: format!("not valid JSON: {e}"),
                })?;
                W::CreateEntity { tenant, name, declaration }
            }
            EntityCmd::Import { tenant, under, file } => {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| StoreError::Invalid { field: "file", message: format!("{}: {e}", file.display()) })?;
                W::ImportEntities { tenant, under, text }
            }
            EntityCmd::List { tenant } => return Ok(list(Collection::Entities { tenant }).await?),
            EntityCmd::Delete { tenant, name } => W::DeleteEntity { tenant, name },
        },
        AdminCommand::Binding(cmd) => match cmd {
            BindingCmd::Set { tenant, server, executor, no_prefix, pin } => {
                W::SetBinding { tenant, server, executor, prefixed: !no_prefix, pin }
            }
            BindingCmd::List { tenant } => return Ok(list(Collection::Bindings { tenant }).await?),
            BindingCmd::Delete { tenant, server } => W::DeleteBinding { tenant, server },
        },
        AdminCommand::Grant(cmd) => match cmd {
            GrantCmd::Add(GrantAdd { spec: g, confirm }) => {
                W::CreateGrant { tenant: g.tenant, server: g.server, role: g.role, kind: g.kind, name: g.name, confirm }
            }
            GrantCmd::List { tenant } => return Ok(list(Collection::Grants { tenant }).await?),
            GrantCmd::Delete(g) => {
                W::DeleteGrant { tenant: g.tenant, server: g.server, role: g.role, kind: g.kind, name: g.name }
            }
        },
        AdminCommand::Root(cmd) => match cmd {
            RootCmd::Allow { tenant, executor, under, role } => W::AllowRoot { tenant, executor, base: under, role },
            RootCmd::List { tenant, executor } => {
                return Ok(list(Collection::RootAllowances { tenant, executor }).await?);
            }
            RootCmd::Delete { tenant, id } => W::DeleteRoot { tenant, id },
        },
        AdminCommand::Issuer(cmd) => match cmd {
            IssuerCmd::Trust { tenant, trust } => W::TrustIssuer { tenant, trust },
            IssuerCmd::Distrust { tenant, issuer } => W::DistrustIssuer { tenant, issuer },
            IssuerCmd::List { tenant } => return Ok(list(Collection::Issuers { tenant }).await?),
        },
        AdminCommand::Policy(cmd) => match cmd {
            PolicyCmd::Put { tenant, id, file, mode } => W::PutPolicy { tenant, id, text: policy_text(&file)?, mode },
            PolicyCmd::List { tenant } => return Ok(list(Collection::Policies { tenant }).await?),
            PolicyCmd::Delete { tenant, id } => W::DeletePolicy { tenant, id },
            PolicyCmd::Mode { tenant, mode } => W::SetPolicyMode { tenant, mode },
            PolicyCmd::Callable { tenant, user } => {
                let tools = service.policy_callable(&Authority::Cli, &tenant, &user).await?;
                return Ok(Output::Answer(serde_json::json!({ "user": user, "tools": tools })));
            }
            PolicyCmd::Callers { tenant, tool } => {
                let users = service.policy_callers(&Authority::Cli, &tenant, &tool).await?;
                return Ok(Output::Answer(serde_json::json!({ "tool": tool, "users": users })));
            }
            PolicyCmd::Check { tenant, user, tool, arguments, client } => {
                let arguments = serde_json::from_str(&arguments).map_err(|e| StoreError::Invalid {
                    field: "arguments",
                    message: format!("not a JSON object: {e}"),
                })?;
                let request = crate::admin::policies::CheckRequest { user, tool, arguments, client };
                let answer = service.check_policy(&Authority::Cli, &tenant, &request).await?;
                return Ok(Output::Answer(serde_json::to_value(answer).unwrap_or_default()));
            }
        },
        AdminCommand::Definition(cmd) => match cmd {
            DefinitionCmd::List { tenant, state } => {
                let state = crate::store::definitions::DefinitionState::filter(&state)?;
                return Ok(list(Collection::Definitions { tenant, state }).await?);
            }
            DefinitionCmd::Show { tenant, id } => {
                let shown = service.get(&Authority::Cli, &Target::Definition { tenant, id }).await?;
                return Ok(Output::Answer(shown.view));
            }
            DefinitionCmd::Approve { tenant, id } => W::DecideDefinition { tenant, id, decision: Decision::Approve },
            DefinitionCmd::Reject { tenant, id } => W::DecideDefinition { tenant, id, decision: Decision::Reject },
        },
        AdminCommand::Approval(cmd) => match cmd {
            ApprovalCmd::List { tenant, state } => {
                let state = crate::store::approvals::ApprovalState::filter(&state)?;
                return Ok(list(Collection::Approvals { tenant, state }).await?);
            }
            ApprovalCmd::Show { tenant, id } => {
                let shown = service.get(&Authority::Cli, &Target::Approval { tenant, id }).await?;
                return Ok(Output::Answer(shown.view));
            }
        },
        AdminCommand::PlatformPolicy(cmd) => match cmd {
            PlatformPolicyCmd::Put { id, file } => W::PutPlatformPolicy { id, text: policy_text(&file)? },
            PlatformPolicyCmd::List => return Ok(list(Collection::PlatformPolicies).await?),
            PlatformPolicyCmd::Delete { id } => W::DeletePlatformPolicy { id },
        },
        // Dispatched by `run` before the service is built.
        AdminCommand::Oauth(_) => {
            return Err(CliError::Usage("`admin oauth` runs outside the administrative service".into()));
        }
    };
    Ok(Output::Done(service.write(&Caller::cli(&Authority::Cli), write).await?))
}
