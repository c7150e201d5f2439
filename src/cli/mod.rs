//! The command line: `serve`, `migrate`, `token`, `health`, `guards`, `executor`. Each subcommand lives in its own file.

mod admin;
mod audit;
mod executor;
mod guards;
mod health;
mod migrate;
mod oauth;
mod serve;
mod token;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::config::{Config, ConfigError};

#[derive(Debug, Parser)]
#[command(name = "scopegate", version, about = "Identity-scoped MCP gateway for multi-tenant SaaS")]
pub struct Cli {
    /// A TOML file layered over the built-in defaults (config/default.toml). Without it:
    /// the file `SCOPEGATE_CONFIG` names, else /etc/scopegate/scopegate.toml if it exists.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve(serve::ServeArgs),
    /// Apply pending database migrations and exit (creating a missing SQLite database).
    Migrate,
    /// Mint a development token (HS256) and print it alone on stdout.
    Token(token::TokenArgs),
    /// Probe a running gateway's `/readyz`: exit 0 when it is ready (a container health check).
    Health(health::HealthArgs),
    /// Audit trail tools.
    Audit(audit::AuditArgs),
    /// Administer tenants, users, roles, flocks, assignments, executors, entities, bindings,
    /// grants, root allowances, and the key of upstream OAuth credentials.
    Admin(admin::AdminArgs),
    /// The build-time guard: `guards report` prints the report of this build's sources.
    Guards(guards::GuardsArgs),
    /// Run a remote executor agent: dial out to the gateway and run servers on this machine.
    Executor(executor::ExecutorArgs),
    #[command(name = "__child-guard", hide = true)]
    ChildGuard(executor::ChildGuardArgs),
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Start(#[from] crate::app::StartError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Mint(#[from] crate::auth::mint::MintError),
    #[error(transparent)]
    Checkpoint(#[from] crate::audit::checkpoint::CheckpointError),
    #[error(transparent)]
    GuardsReport(#[from] guards::ReportError),
    #[error("this program carries no guard report")]
    NoGuardReport,
    #[error(transparent)]
    Vault(#[from] crate::store::vault::VaultError),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TraceSetupError),
    #[error(transparent)]
    Export(#[from] crate::audit::export::ExportError),
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    #[error(transparent)]
    Health(#[from] health::HealthError),
}

pub async fn run(cli: Cli) -> Result<(), CliError> {
    let env = std::env::var_os(crate::config::CONFIG_ENV);
    let file = crate::config::config_file(cli.config.as_deref(), env.as_deref(), Path::is_file);
    let file = file.as_deref();
    match cli.command {
        Command::Serve(args) => serve::run(file, args).await,
        Command::Migrate => migrate::run(&Config::load(file)?).await,
        Command::Token(args) => token::run(&Config::load(file)?, args),
        Command::Health(args) => health::run(file, args).await,
        Command::Audit(args) => audit::run(&Config::load(file)?, args).await,
        Command::Admin(args) => admin::run(&Config::load(file)?, args).await,
        Command::Guards(args) => guards::run(args),
        Command::Executor(args) => executor::run(args).await,
        Command::ChildGuard(args) => executor::child_guard(args),
    }
}
