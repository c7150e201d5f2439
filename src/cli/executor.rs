//! `scopegate executor`: the remote executor agent's command line, and the hidden child guard
//! it launches its servers through. It needs no config file and no database.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::agent::{self, AgentConfig};
use crate::config::{LogFormat, TelemetryConfig};

#[derive(Debug, Args)]
pub struct ExecutorArgs {
    /// The gateway's base URL (http: or https:); repeat it for each replica to stay connected to.
    #[arg(long = "gateway", value_name = "URL", env = "SCOPEGATE_EXECUTOR_GATEWAY", value_delimiter = ',')]
    pub gateways: Vec<String>,
    /// The executor's name, as registered on the gateway.
    #[arg(long, env = "SCOPEGATE_EXECUTOR_NAME")]
    pub name: String,
    /// A file holding the executor's secret; read again on every connection attempt.
    #[arg(long, value_name = "FILE", env = "SCOPEGATE_EXECUTOR_SECRET_FILE")]
    pub secret_file: PathBuf,
    /// The folder everything runs and is read in, as a file: URI: an existing directory of
    /// this machine, or with --root-dir a URI in either convention (file:///srv/mcp,
    /// file:///C:/plugins) standing for that directory.
    #[arg(long, value_name = "URI", env = "SCOPEGATE_EXECUTOR_ROOT")]
    pub root: String,
    /// The existing directory on this machine that --root stands for: a URI below the root is
    /// served from the same names below DIR. The gateway still sees only --root.
    #[arg(long, value_name = "DIR", env = "SCOPEGATE_EXECUTOR_ROOT_DIR")]
    pub root_dir: Option<PathBuf>,
    /// PEM CA certificates trusted besides the platform's (for the gateway and HTTP servers).
    #[arg(long, value_name = "PEM", env = "SCOPEGATE_EXECUTOR_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// The only variables of the agent's environment a stdio server inherits.
    #[arg(long = "inherit-env", value_name = "NAME", default_values = ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"])]
    pub inherit_env: Vec<String>,
    /// The longest wait between reconnection attempts.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub backoff_max_secs: u64,
    /// The tunnel's ping interval.
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub heartbeat_secs: u64,
}

/// `__child-guard PID -- COMMAND ARGS...` (hidden; see `agent::guard`).
#[derive(Debug, Args)]
pub struct ChildGuardArgs {
    /// The agent's pid.
    pub agent: u32,
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

impl ExecutorArgs {
    fn config(self) -> Result<AgentConfig, CliError> {
        let root = agent::root::parse_root_uri(&self.root)
            .map_err(|e| CliError::Usage(format!("--root {:?}: {e}", self.root)))?;
        Ok(AgentConfig {
            gateways: self.gateways,
            name: self.name,
            secret_file: self.secret_file,
            root,
            root_dir: self.root_dir,
            ca_file: self.ca_file,
            inherit_env: self.inherit_env,
            backoff_max: Duration::from_secs(self.backoff_max_secs),
            heartbeat: Duration::from_secs(self.heartbeat_secs),
        })
    }
}

pub async fn run(args: ExecutorArgs) -> Result<(), CliError> {
    let config = args.config()?;
    crate::telemetry::init(&TelemetryConfig::log_only(LogFormat::Pretty, "info"));
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        crate::app::shutdown_signal().await;
        tracing::info!("stopping: ending every channel and child");
        on_signal.cancel();
    });
    agent::run(config, stop).await?;
    Ok(())
}

/// Becomes the command, or exits with [`agent::guard::FAILED`] saying why on stderr (which
/// the agent logs and puts in the channel's close reason).
pub fn child_guard(args: ChildGuardArgs) -> Result<(), CliError> {
    let error = agent::guard::exec(args.agent, &args.command);
    eprintln!("error: {error}");
    std::process::exit(agent::guard::FAILED)
}
