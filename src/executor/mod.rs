//! Executors: where an upstream server is launched, whose filesystem its `cwd` names and whose
//! network its HTTP goes over: the gateway host itself (`local`), or a remote executor, which
//! is reached only through the remote host handler and never silently run locally.
//!
//! The local executor is here. `remote` is the remote host handler; `agents` the connected
//! agents, `channel` MCP over one of their tunnel channels, `file` and `fetch` a file read and
//! an HTTP exchange through one; `oauth_http` the OAuth HTTP client of an executor (this
//! host's network for the local one, the agent's for a remote one).

pub mod agents;
pub mod channel;
pub mod fetch;
pub mod file;
pub mod link;
pub mod oauth_http;
pub mod remote;

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::auth::{AuthClient, AuthorizationManager};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::decl::ExecutorEnv;
use crate::decl::ExecutorId;
use crate::decl::PathUri;
use crate::decl::Placement;
use crate::decl::ResolvedServer;
use crate::decl::ResolvedTransport;
use crate::executor::oauth_http::ExecutorHttp;
use crate::executor::remote::{RemoteEnv, RemoteHostHandler};
use crate::relay::Lifecycle;
use crate::relay::ProxyClient;
use crate::store::entities::Executor as ExecutorRow;
use crate::wire::client::AssertingClient;

/// Why an upstream could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("{key}: {message}")]
    Config { key: &'static str, message: String },
    #[error("executor `{0}` is not connected to this gateway")]
    Offline(String),
    #[error("server `{server}`: `{path}` is outside the executor's root")]
    OutsideRoot { server: String, path: String },
    #[error("the executor: {0}")]
    Remote(String),
    #[error("server `{server}` is declared for executor `{declared}` but bound to `{bound}`")]
    WrongExecutor { server: String, declared: String, bound: String },
    #[error("launching `{command}`: {source}")]
    Launch { command: String, source: std::io::Error },
    #[error("bad header `{0}` in the declaration")]
    Header(String),
    #[error("connecting: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    ConnectTimeout(Duration),
    /// An OAuth-protected server with no usable credential for the caller's owner.
    #[error("server `{server}` needs a login")]
    LoginNeeded { server: String },
    /// The server refused the credential the executor presented (HTTP 401).
    #[error("server `{server}` refused its credential")]
    Unauthorized { server: String },
}

/// Why a stored declaration can't be served on its executor: every problem, and whether one
/// of them is a path outside the root (the call of such a server's tool is audited as
/// `outside_root`, not as an unknown tool).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{problem}")]
pub struct Unusable {
    pub problem: String,
    pub outside_root: bool,
}

impl From<String> for Unusable {
    fn from(problem: String) -> Self {
        Self { problem, outside_root: false }
    }
}

impl UpstreamError {
    /// What an operator is shown of this failure (the admin API's and the console's server
    /// status): a class to filter on and a message in the gateway's words. The SDK's own
    /// messages name the Rust types of the transport stack; those names are taken out here,
    /// and the whole error stays in the log.
    pub fn for_operators(&self) -> (&'static str, String) {
        let class = match self {
            UpstreamError::Config { .. } | UpstreamError::Header(_) | UpstreamError::WrongExecutor { .. } => {
                "declaration"
            }
            UpstreamError::Offline(_) => "executor_offline",
            UpstreamError::OutsideRoot { .. } => "outside_root",
            UpstreamError::Remote(_) => "executor",
            UpstreamError::Launch { .. } => "launch_failed",
            UpstreamError::Connect(_) => "connect_failed",
            UpstreamError::ConnectTimeout(_) => "timeout",
            UpstreamError::LoginNeeded { .. } => "login_needed",
            UpstreamError::Unauthorized { .. } => "unauthorized",
        };
        (class, without_type_names(&self.to_string()))
    }
}

/// `text` without the Rust type names an SDK error message carries: a bracketed group that
/// holds a path (`Transport [a::b::C<d::E>] error`) goes, and any other word holding a path
/// becomes `(internal)`.
fn without_type_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']').map(|c| open + c) else { break };
        out.push_str(&rest[..open]);
        if !rest[open..close].contains("::") {
            out.push_str(&rest[open..=close]);
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    let words: Vec<&str> =
        out.split(' ').filter(|w| !w.is_empty()).map(|w| if w.contains("::") { "(internal)" } else { w }).collect();
    words.join(" ")
}

/// The gateway host's environment, as a declaration on the local executor sees it.
struct HostEnv;

impl ExecutorEnv for HostEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
    fn is_local(&self) -> bool {
        true
    }
}

/// The gateway host as an executor.
pub struct LocalExecutor {
    /// The plugin root: a relative `cwd` resolves under it and can't leave it.
    root: PathUri,
    /// The only variables of the gateway's own environment a child inherits (the rest, such
    /// as the gateway's secrets, only by explicit `${env:NAME}` in a declaration).
    inherit_env: Vec<String>,
    pub(super) http: reqwest::Client,
    pub(super) assertion_header: HeaderName,
    /// OAuth requests for its servers: from this host, with the same CA trust as `http`.
    oauth_http: Arc<ExecutorHttp>,
}

impl LocalExecutor {
    /// `ca_file`: a PEM file of CA certificates trusted for HTTPS upstreams besides the
    /// platform's roots (empty: none).
    pub fn new(
        root: PathUri,
        inherit_env: Vec<String>,
        assertion_header: HeaderName,
        ca_file: &str,
    ) -> Result<Self, UpstreamError> {
        crate::tls::install_provider();
        let mut builder = reqwest::Client::builder()
            // No total timeout: it would cut SSE streams. Calls time out in the proxy instead.
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .pool_max_idle_per_host(64);
        if !ca_file.is_empty() {
            builder = crate::tls::trust_ca_file(builder, std::path::Path::new(ca_file))
                .map_err(|message| UpstreamError::Config { key: "upstream.ca_file", message })?;
        }
        let http = builder.build().map_err(|e| UpstreamError::Connect(e.to_string()))?;
        let ca_file = (!ca_file.is_empty()).then(|| std::path::Path::new(ca_file));
        let oauth_http = ExecutorHttp::local(ca_file)
            .map_err(|message| UpstreamError::Config { key: "upstream.ca_file", message })?;
        Ok(Self { root, inherit_env, http, assertion_header, oauth_http: Arc::new(oauth_http) })
    }

    /// The OAuth HTTP client of this host's servers: the gateway host's network.
    pub fn oauth_http(&self) -> Arc<ExecutorHttp> {
        Arc::clone(&self.oauth_http)
    }

    /// The gateway's working directory as the plugin root (when none is configured).
    pub fn default_root() -> Option<PathUri> {
        let cwd = std::env::current_dir().ok()?;
        PathUri::from_host_path(cwd.to_str()?).ok()
    }
}

/// The executor a server is bound to, ready to launch or dial on.
pub enum Executor {
    Local {
        id: ExecutorId,
        host: Arc<LocalExecutor>,
    },
    /// An agent's machine: `root` is the root its agent reported; everything goes through
    /// the remote host handler.
    Remote {
        id: ExecutorId,
        root: PathUri,
        host: Arc<RemoteHostHandler>,
    },
}

impl Executor {
    /// The executor for a bound executor's row: `local` runs on this host, `remote` through
    /// the remote host handler.
    pub async fn for_row(
        row: &ExecutorRow,
        local: &Arc<LocalExecutor>,
        remote: &Arc<RemoteHostHandler>,
    ) -> Result<Self, UpstreamError> {
        match row.kind.as_str() {
            "local" => Ok(Self::Local { id: ExecutorId::new(&row.name), host: Arc::clone(local) }),
            "remote" => remote.executor(row).await,
            other => Err(UpstreamError::Config { key: "executor.kind", message: format!("unknown kind {other:?}") }),
        }
    }

    /// One stored server declaration (the JSON of one `.mcp.json` entry), resolved for this
    /// executor: placed under its root, references resolved on its environment (or left for
    /// a remote agent to resolve on its own).
    pub fn resolve(&self, server: &str, declaration: &str) -> Result<ResolvedServer, Unusable> {
        let value: serde_json::Value =
            serde_json::from_str(declaration).map_err(|e| Unusable::from(format!("stored declaration: {e}")))?;
        let file = serde_json::json!({ server: value }).to_string();
        let parsed = crate::decl::parse_declarations(&file).map_err(|e| Unusable::from(e.to_string()))?;
        if let Some(error) = parsed.errors.first() {
            return Err(error.to_string().into());
        }
        let declared = parsed
            .servers
            .into_iter()
            .next()
            .ok_or_else(|| Unusable::from("no server in the declaration".to_owned()))?;
        declared.resolve(&self.placement(), self.env()).map_err(|errors| Unusable {
            problem: errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
            outside_root: errors.iter().any(|e| e.outside_root),
        })
    }

    /// Where an entity's declaration is placed: installed on this executor, under its root.
    pub fn placement(&self) -> Placement {
        match self {
            Self::Local { id, host } => Placement::Environment { executor: id.clone(), root: host.root.clone() },
            Self::Remote { id, root, .. } => Placement::Environment { executor: id.clone(), root: root.clone() },
        }
    }

    /// The OAuth HTTP client of this executor's servers, an `rmcp` `OAuthHttpClient`: the
    /// gateway host's network for the local executor, the agent's for a remote one.
    pub fn oauth_http(&self) -> Arc<ExecutorHttp> {
        match self {
            Self::Local { host, .. } => host.oauth_http(),
            Self::Remote { id, host, .. } => {
                Arc::new(ExecutorHttp::Remote { agents: Arc::clone(host.agents()), executor: id.to_string() })
            }
        }
    }

    /// The executor's environment, on which `${NAME}` references resolve.
    pub fn env(&self) -> &dyn ExecutorEnv {
        match self {
            Self::Local { .. } => &HostEnv,
            Self::Remote { .. } => &RemoteEnv,
        }
    }

    /// Launches (stdio) or dials (Streamable HTTP) `server` and completes the MCP handshake
    /// within `timeout`. An OAuth-protected server's requests carry `auth`'s access token,
    /// refreshed before it expires and once more on a 401.
    pub async fn connect(
        &self,
        server: &ResolvedServer,
        handler: ProxyClient,
        lifecycle: Lifecycle,
        timeout: Duration,
        auth: Option<AuthorizationManager>,
    ) -> Result<RunningService<RoleClient, ProxyClient>, UpstreamError> {
        let (id, host) = match self {
            Self::Local { id, host } => (id, host),
            Self::Remote { id, host, .. } => {
                if &server.executor != id {
                    return Err(UpstreamError::WrongExecutor {
                        server: server.name.to_string(),
                        declared: server.executor.to_string(),
                        bound: id.to_string(),
                    });
                }
                return host.open(server, handler, lifecycle, timeout, auth).await;
            }
        };
        if &server.executor != id {
            return Err(UpstreamError::WrongExecutor {
                server: server.name.to_string(),
                declared: server.executor.to_string(),
                bound: id.to_string(),
            });
        }
        let started = match &server.transport {
            ResolvedTransport::Stdio { command, args, env, cwd } => {
                let transport = handler.counted(host.spawn(server.name.as_str(), command, args, env, cwd)?);
                tokio::time::timeout(timeout, handler.start(lifecycle, transport)).await
            }
            ResolvedTransport::Http { url, headers, .. } => {
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let name = HeaderName::try_from(name.as_str()).map_err(|_| UpstreamError::Header(name.clone()))?;
                    let value =
                        HeaderValue::try_from(value.as_str()).map_err(|_| UpstreamError::Header(name.to_string()))?;
                    custom.insert(name, value);
                }
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
                config.max_concurrent_requests = 256;
                let client = AssertingClient::new(host.http.clone(), host.assertion_header.clone());
                match auth {
                    Some(manager) => {
                        let client = AuthClient::new(client, manager);
                        let transport = handler.counted(StreamableHttpClientTransport::with_client(client, config));
                        tokio::time::timeout(timeout, handler.start(lifecycle, transport)).await
                    }
                    None => {
                        let client = client.recording(Arc::clone(&handler.wire));
                        let transport = handler.counted(StreamableHttpClientTransport::with_client(client, config));
                        tokio::time::timeout(timeout, handler.start(lifecycle, transport)).await
                    }
                }
            }
        };
        match started {
            Ok(Ok(service)) => Ok(service),
            Ok(Err(e)) => Err(UpstreamError::Connect(e.to_string())),
            Err(_) => Err(UpstreamError::ConnectTimeout(timeout)),
        }
    }
}

impl LocalExecutor {
    fn spawn(
        &self,
        server: &str,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: &PathUri,
    ) -> Result<TokioChildProcess, UpstreamError> {
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(args).current_dir(cwd.to_native()).env_clear().kill_on_drop(true);
        for name in &self.inherit_env {
            if let Ok(value) = std::env::var(name) {
                cmd.env(name, value);
            }
        }
        cmd.envs(env);
        let launch = |source| UpstreamError::Launch { command: command.to_owned(), source };
        let (child, stderr) = TokioChildProcess::builder(cmd).stderr(Stdio::piped()).spawn().map_err(launch)?;
        if let Some(stderr) = stderr {
            let server = server.to_owned();
            // The child's stderr is its log: into ours, line by line, so a full pipe never blocks it.
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(%server, "upstream stderr: {line}");
                }
            });
        }
        Ok(child)
    }
}

#[cfg(test)]
mod operator_tests {
    use super::*;

    #[test]
    fn operators_see_no_type_names() {
        let e = UpstreamError::Connect(
            "Transport [scopegate::relay::order::Counted<rmcp::transport::streamable_http_client::\
             StreamableHttpClientTransport<scopegate::wire::client::AssertingClient>>] error: \
             Client error: error sending request, when send initialize request"
                .into(),
        );
        let (class, message) = e.for_operators();
        assert_eq!(class, "connect_failed");
        assert_eq!(
            message,
            "connecting: Transport error: Client error: error sending request, when send initialize request"
        );
        let (_, message) = UpstreamError::Remote("failed at rmcp::service::serve_inner::<T>".into()).for_operators();
        assert_eq!(message, "the executor: failed at (internal)");
        let (class, message) = UpstreamError::ConnectTimeout(Duration::from_secs(5)).for_operators();
        assert_eq!((class, message.as_str()), ("timeout", "no answer within 5s"));
        // A bracket with no path in it stays.
        let (_, message) = UpstreamError::Connect("status [503] from upstream".into()).for_operators();
        assert_eq!(message, "connecting: status [503] from upstream");
    }
}
