//! The agent's connections: one task per gateway URL that dials, serves the tunnel's open
//! requests and reconnects with backoff. It never keeps a child once its connection is gone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{AgentEnv, AgentError, AgentRoot, Backoff, Host};
use crate::decl::PathUri;
use crate::tunnel::{self, DialError, Settings, Side};
use crate::wire::exchange::ExchangeClients;

/// Everything the agent runs with (the command line, checked).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The gateways' base URLs (`http:` or `https:`); one connection to each.
    pub gateways: Vec<String>,
    pub name: String,
    pub secret_file: PathBuf,
    /// The root as the gateway knows it.
    pub root: PathUri,
    /// The directory `root` stands for on this machine (`None`: the root's own native path).
    pub root_dir: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub inherit_env: Vec<String>,
    pub backoff_max: Duration,
    pub heartbeat: Duration,
}

/// A connection that stayed up this long resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(30);

impl AgentConfig {
    /// Checks what can be checked before connecting; the `Host` every channel shares.
    pub fn host(&self, settings: &Settings) -> Result<Host, AgentError> {
        if self.gateways.is_empty() {
            return Err(AgentError::NoGateway);
        }
        for url in &self.gateways {
            let parsed = reqwest::Url::parse(url)
                .map_err(|e| AgentError::Gateway { url: url.clone(), message: e.to_string() })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                let message = "not an http: or https: URL".to_owned();
                return Err(AgentError::Gateway { url: url.clone(), message });
            }
        }
        if self.name.is_empty() || HeaderValue::from_str(&self.name).is_err() {
            let message = "must be a non-empty header-safe name".to_owned();
            return Err(AgentError::Name { name: self.name.clone(), message });
        }
        read_secret(&self.secret_file)?;
        let clients = AgentClients::new(self.ca_file.as_deref())?;
        // Children are launched through this binary's guard on Linux, so they die with it.
        let guard = if cfg!(target_os = "linux") {
            Some(std::env::current_exe().map_err(AgentError::CurrentExe)?)
        } else {
            None
        };
        let root = AgentRoot::new(self.root.clone(), self.root_dir.clone())?;
        Ok(Host::new(
            &self.name,
            root,
            AgentEnv::from_process(),
            self.inherit_env.clone(),
            clients,
            settings.max_frame,
            guard,
        ))
    }
}

/// The client the agent dials the gateway and reaches HTTP servers with: platform roots plus
/// `ca_file`'s certificates, HTTP/1.1 only (the WebSocket upgrade needs it).
pub fn http_client(ca_file: Option<&Path>) -> Result<reqwest::Client, AgentError> {
    crate::tls::install_provider();
    let mut builder = reqwest::Client::builder()
        // No total timeout: it would cut the tunnel and SSE streams.
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .http1_only();
    if let Some(path) = ca_file {
        builder = crate::tls::trust_ca_file(builder, path)
            .map_err(|message| AgentError::CaFile { path: path.to_owned(), message })?;
    }
    builder.build().map_err(|e| AgentError::Client(e.to_string()))
}

/// The agent's HTTP clients, all trusting `ca_file`'s certificates besides the platform's
/// roots: [`http_client`] for the gateway and HTTP servers, and those of Fetch channels.
pub struct AgentClients {
    pub http: reqwest::Client,
    pub fetch: ExchangeClients,
}

impl AgentClients {
    pub fn new(ca_file: Option<&Path>) -> Result<Self, AgentError> {
        let http = http_client(ca_file)?;
        let fetch = ExchangeClients::new(ca_file).map_err(|message| match ca_file {
            Some(path) => AgentError::CaFile { path: path.to_owned(), message },
            None => AgentError::Client(message),
        })?;
        Ok(Self { http, fetch })
    }
}

/// The secret, read afresh (a rotated secret is picked up by replacing the file).
fn read_secret(path: &Path) -> Result<String, AgentError> {
    let bad = |message: String| AgentError::SecretFile { path: path.to_owned(), message };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(bad("the file is empty".to_owned()));
    }
    if HeaderValue::from_str(&format!("Bearer {secret}")).is_err() {
        return Err(bad("the secret is not header-safe text".to_owned()));
    }
    Ok(secret.to_owned())
}

/// Runs the agent until `stop` is cancelled: one connection loop per gateway. Returns once
/// every channel has ended and every child is gone.
pub async fn run(config: AgentConfig, stop: CancellationToken) -> Result<(), AgentError> {
    let settings = Settings { heartbeat: config.heartbeat, ..Settings::default() };
    let host = Arc::new(config.host(&settings)?);
    let config = Arc::new(config);
    tracing::info!(
        executor = %config.name,
        root = %config.root,
        root_dir = ?config.root_dir,
        gateways = ?config.gateways,
        "executor agent starting"
    );
    let mut loops = JoinSet::new();
    for gateway in config.gateways.clone() {
        loops.spawn(connection_loop(Arc::clone(&config), Arc::clone(&host), settings.clone(), gateway, stop.clone()));
    }
    while loops.join_next().await.is_some() {}
    tracing::info!(executor = %config.name, "executor agent stopped");
    Ok(())
}

async fn connection_loop(
    config: Arc<AgentConfig>,
    host: Arc<Host>,
    settings: Settings,
    gateway: String,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(Backoff::BASE, config.backoff_max);
    while !stop.is_cancelled() {
        match connect_once(&config, &host, &settings, &gateway, &stop).await {
            Ok(up) if up >= STABLE_AFTER.min(config.backoff_max) => backoff.reset(),
            Ok(_) => {}
            Err(e) => tracing::warn!(%gateway, "could not connect: {e}"),
        }
        let delay = backoff.next_delay();
        tracing::debug!(%gateway, ?delay, "reconnecting after a delay");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => {}
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error(transparent)]
    Config(#[from] AgentError),
    #[error("the gateway refused the connection ({status}): {body}")]
    Refused { status: u16, body: String },
    #[error("{0}")]
    Network(String),
}

/// One connection: dial, serve until the tunnel ends; how long it stayed up.
async fn connect_once(
    config: &AgentConfig,
    host: &Arc<Host>,
    settings: &Settings,
    gateway: &str,
    stop: &CancellationToken,
) -> Result<Duration, ConnectError> {
    let secret = read_secret(&config.secret_file)?;
    let mut headers = HeaderMap::new();
    let header = |v: &str| HeaderValue::from_str(v).map_err(|e| ConnectError::Network(e.to_string()));
    headers.insert(http::header::AUTHORIZATION, header(&format!("Bearer {secret}"))?);
    headers.insert(tunnel::EXECUTOR_HEADER, header(&config.name)?);
    headers.insert(tunnel::ROOT_HEADER, header(&config.root.to_string())?);
    let ws = tokio::select! {
        dialed = tunnel::dial(&host.http, gateway, headers, settings) => match dialed {
            Ok(ws) => ws,
            Err(DialError::Refused { status, body }) => return Err(ConnectError::Refused { status, body }),
            Err(DialError::Network(e)) => return Err(ConnectError::Network(e)),
        },
        () = stop.cancelled() => return Ok(Duration::ZERO),
    };
    let started = Instant::now();
    tracing::info!(gateway, executor = %config.name, "connected to the gateway");
    let (handle, mut incoming) = tunnel::start(ws, Side::Agent, settings.clone());
    // The channels of this connection: cancelled and awaited when it ends, so their children die.
    let channels_stop = stop.child_token();
    let mut channels = JoinSet::new();
    loop {
        tokio::select! {
            pending = incoming.next() => match pending {
                Some(pending) => {
                    channels.spawn(super::serve_pending(Arc::clone(host), pending, channels_stop.clone()));
                }
                None => break,
            },
            Some(_) = channels.join_next(), if !channels.is_empty() => {}
            () = stop.cancelled() => {
                handle.close("the executor is shutting down");
                break;
            }
        }
    }
    channels_stop.cancel();
    while channels.join_next().await.is_some() {}
    let reason = handle.closed().await;
    tracing::info!(gateway, executor = %config.name, "disconnected from the gateway: {reason}");
    Ok(started.elapsed())
}
