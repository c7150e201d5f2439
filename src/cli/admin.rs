//! `scopegate admin`: create, list and delete tenants, users, roles, flocks, assignments,
//! executors (and their owners and secrets), `mcp-server` entities, bindings, grants of
//! upstream tools, prompts and resources and allowances of plugin roots (`admin oauth`, the credential key, is in
//! `oauth.rs`). Each command is one transaction: an error names the field and leaves nothing
//! half-written. Never prints a secret before its transaction has committed.

use clap::{Args, Subcommand};

use super::CliError;
use crate::config::Config;
use crate::model::{Role, TenantStatus, UserStatus};
use crate::store::admin::{self, Listing};
use crate::store::entities::GrantKind;
use crate::store::{Db, IfMissing, StoreError, entities, roots};

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
    /// Refused for a tenant with audit events (suspend it instead).
    Delete {
        slug: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum UserCmd {
    Create {
        #[arg(long)]
        tenant: String,
        subject: String,
        #[arg(long)]
        name: String,
        /// owner, manager, worker or auditor (repeatable).
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
    Add(GrantSpec),
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
    /// owner, manager, worker or auditor.
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
        /// owner, manager, worker or auditor.
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

fn rows<T: serde::Serialize>(items: &[T], columns: &[&'static str]) -> Listing {
    items
        .iter()
        .map(|item| {
            let value = serde_json::to_value(item).unwrap_or_default();
            columns
                .iter()
                .map(|c| {
                    let v = &value[*c];
                    (*c, v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string()))
                })
                .collect()
        })
        .collect()
}

pub async fn run(config: &Config, args: AdminArgs) -> Result<(), CliError> {
    let args = match args {
        // Its own transaction (rotate-key) or no database at all (keygen).
        AdminArgs { command: AdminCommand::Oauth(cmd), .. } => return super::oauth::run(config, cmd).await,
        args => args,
    };
    let db = Db::connect(&config.database, IfMissing::Refuse).await?;
    db.migrate().await?;
    let result = execute(&db, args).await;
    db.close().await;
    let (output, json) = result?;
    match output {
        Output::Nothing => {}
        Output::Listing(listing) => print(&listing, json),
        // Printed only now, after the commit: a secret that was never stored is never shown.
        Output::Secret(secret) => {
            println!("{secret}");
            eprintln!("This executor secret is shown only once: store it now (rotate-secret makes a new one).");
        }
        Output::Id(id) => println!("{id}"),
    }
    Ok(())
}

/// What a command prints once its transaction has committed.
enum Output {
    Nothing,
    Listing(Listing),
    /// A remote executor's new secret: alone on stdout.
    Secret(String),
    /// The id of a new row: alone on stdout.
    Id(String),
}

/// Runs one command in one transaction; commits only when it succeeded.
async fn execute(db: &Db, args: AdminArgs) -> Result<(Output, bool), StoreError> {
    let mut tx = db.begin().await?;
    let c = &mut *tx;
    let mut secret = None;
    let mut new_id = None;
    let listing = match args.command {
        AdminCommand::Tenant(cmd) => match cmd {
            TenantCmd::Create { slug, name } => admin::create_tenant(c, &slug, &name).await.map(|_| None),
            TenantCmd::List => admin::list_tenants(c).await.map(Some),
            TenantCmd::Suspend { slug } => {
                admin::set_tenant_status(c, &slug, TenantStatus::Suspended).await.map(|_| None)
            }
            TenantCmd::Activate { slug } => {
                admin::set_tenant_status(c, &slug, TenantStatus::Active).await.map(|_| None)
            }
            TenantCmd::Delete { slug } => admin::delete_tenant(c, &slug).await.map(|_| None),
        },
        AdminCommand::User(cmd) => match cmd {
            UserCmd::Create { tenant, subject, name, roles } => {
                admin::create_user(c, &tenant, &subject, &name, &roles).await.map(|_| None)
            }
            UserCmd::List { tenant } => admin::list_users(c, &tenant).await.map(Some),
            UserCmd::Disable { tenant, subject } => {
                admin::set_user_status(c, &tenant, &subject, UserStatus::Disabled).await.map(|_| None)
            }
            UserCmd::Enable { tenant, subject } => {
                admin::set_user_status(c, &tenant, &subject, UserStatus::Active).await.map(|_| None)
            }
            UserCmd::Delete { tenant, subject } => admin::delete_user(c, &tenant, &subject).await.map(|_| None),
        },
        AdminCommand::Role(cmd) => match cmd {
            RoleCmd::Add { tenant, subject, role } => admin::add_role(c, &tenant, &subject, role).await.map(|_| None),
            RoleCmd::Remove { tenant, subject, role } => {
                admin::remove_role(c, &tenant, &subject, role).await.map(|_| None)
            }
        },
        AdminCommand::Flock(cmd) => match cmd {
            FlockCmd::Create { tenant, name, breed, hens } => {
                admin::create_flock(c, &tenant, &name, &breed, hens).await.map(|_| None)
            }
            FlockCmd::List { tenant } => admin::list_flocks(c, &tenant).await.map(Some),
            FlockCmd::Delete { tenant, name } => admin::delete_flock(c, &tenant, &name).await.map(|_| None),
        },
        AdminCommand::Assignment(cmd) => match cmd {
            AssignmentCmd::Add { tenant, subject, flock } => {
                admin::assign_flock(c, &tenant, &subject, &flock).await.map(|_| None)
            }
            AssignmentCmd::Remove { tenant, subject, flock } => {
                admin::unassign_flock(c, &tenant, &subject, &flock).await.map(|_| None)
            }
            AssignmentCmd::List { tenant } => admin::list_assignments(c, &tenant).await.map(Some),
        },
        AdminCommand::Executor(cmd) => match cmd {
            ExecutorCmd::Create { name, machine, user, kind, tenants } => {
                let owners: Vec<&str> = tenants.iter().map(String::as_str).collect();
                entities::create_executor(c, &name, &machine, &user, &kind, &owners).await.map(|s| {
                    secret = s;
                    None
                })
            }
            ExecutorCmd::List => entities::list_executors(c).await.map(|x| {
                Some(
                    x.into_iter()
                        .map(|e| {
                            vec![
                                ("name", e.name),
                                ("machine", e.machine),
                                ("run_as", e.run_as),
                                ("kind", e.kind),
                                ("owners", e.owners.join(",")),
                            ]
                        })
                        .collect(),
                )
            }),
            ExecutorCmd::Delete { name } => entities::delete_executor(c, &name).await.map(|_| None),
            ExecutorCmd::RotateSecret { name } => entities::rotate_executor_secret(c, &name).await.map(|s| {
                secret = Some(s);
                None
            }),
            ExecutorCmd::Owner(cmd) => match cmd {
                OwnerCmd::Add { tenant, executor } => {
                    entities::add_executor_owner(c, &executor, &tenant).await.map(|_| None)
                }
                OwnerCmd::Remove { tenant, executor } => {
                    entities::remove_executor_owner(c, &executor, &tenant).await.map(|_| None)
                }
            },
        },
        AdminCommand::Entity(cmd) => match cmd {
            EntityCmd::Add { tenant, name, declaration } => {
                let value: serde_json::Value = serde_json::from_str(&declaration).map_err(|e| StoreError::Invalid {
                    field: "declaration",
                    message: format!("not valid JSON: {e}"),
                })?;
                entities::create_entity(c, &tenant, &name, &value).await.map(|_| None)
            }
            EntityCmd::Import { tenant, under, file } => {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| StoreError::Invalid { field: "file", message: format!("{}: {e}", file.display()) })?;
                let parsed = crate::decl::parse_declarations(&text)
                    .map_err(|e| StoreError::Invalid { field: "file", message: e.to_string() })?;
                for error in &parsed.errors {
                    eprintln!("skipped: {error}");
                }
                let mut imported = Vec::new();
                for server in &parsed.servers {
                    let name = format!("{under}/mcp-servers/{}", server.name);
                    entities::create_entity(c, &tenant, &name, &server.to_json()).await?;
                    imported.push(vec![("entity", name)]);
                }
                Ok(Some(imported))
            }
            EntityCmd::List { tenant } => {
                entities::list_entities(c, &tenant).await.map(|x| Some(rows(&x, &["name", "server", "declaration"])))
            }
            EntityCmd::Delete { tenant, name } => entities::delete_entity(c, &tenant, &name).await.map(|_| None),
        },
        AdminCommand::Binding(cmd) => match cmd {
            BindingCmd::Set { tenant, server, executor, no_prefix } => {
                let native: Vec<&str> = crate::tools::TOOLS.iter().map(|t| t.name).collect();
                let unprefixed_beside = no_prefix.then_some(native.as_slice());
                entities::bind_server_with_prefix(c, &tenant, &server, &executor, unprefixed_beside).await.map(|_| None)
            }
            BindingCmd::List { tenant } => entities::list_bindings(c, &tenant).await.map(|x| {
                Some(
                    x.into_iter()
                        .map(|b| {
                            let prefix = if b.prefixed { "yes" } else { "no" };
                            vec![("server", b.server), ("executor", b.executor), ("prefix", prefix.to_owned())]
                        })
                        .collect(),
                )
            }),
            BindingCmd::Delete { tenant, server } => entities::unbind_server(c, &tenant, &server).await.map(|_| None),
        },
        AdminCommand::Grant(cmd) => match cmd {
            GrantCmd::Add(g) => entities::grant(c, &g.tenant, &g.server, g.role, g.kind, &g.name).await.map(|_| None),
            GrantCmd::List { tenant } => {
                entities::list_grants(c, &tenant).await.map(|x| Some(rows(&x, &["server", "role", "kind", "name"])))
            }
            GrantCmd::Delete(g) => {
                entities::revoke(c, &g.tenant, &g.server, g.role, g.kind, &g.name).await.map(|_| None)
            }
        },
        AdminCommand::Root(cmd) => match cmd {
            RootCmd::Allow { tenant, executor, under, role } => {
                roots::allow_root(c, &tenant, &executor, &under, role).await.map(|id| {
                    new_id = Some(id.to_string());
                    None
                })
            }
            RootCmd::List { tenant, executor } => roots::list_root_allowances(c, &tenant, executor.as_deref())
                .await
                .map(|x| Some(rows(&x, &["id", "executor", "base", "role"]))),
            RootCmd::Delete { tenant, id } => roots::delete_root_allowance(c, &tenant, &id).await.map(|_| None),
        },
        // Dispatched by `run` before any transaction is opened.
        AdminCommand::Oauth(_) => {
            Err(StoreError::Invalid { field: "command", message: "`admin oauth` runs outside this transaction".into() })
        }
    }?;
    tx.commit().await?;
    let output = match (listing, secret, new_id) {
        (Some(listing), _, _) => Output::Listing(listing),
        (None, Some(secret), _) => Output::Secret(secret),
        (None, None, Some(id)) => Output::Id(id),
        (None, None, None) => Output::Nothing,
    };
    Ok((output, args.json))
}
