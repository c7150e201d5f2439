//! One channel the gateway opens: checked on the agent's own terms (containment in the root,
//! references on the agent's environment), then served. It must never run or read anything
//! outside the root, whatever the gateway asks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::io::{MessageSink, MessageSource};
use super::{AgentEnv, AgentError};
use crate::tunnel::{Open, PendingOpen, Refusal};
use crate::upstream::{ExecutorId, PathStyle, PathUri, declaration};

/// What every channel of the agent needs: who it is, its root, its environment.
pub struct Host {
    pub(super) name: ExecutorId,
    pub(super) root: PathUri,
    /// The root with its symlinks resolved, at start: real paths are compared against it.
    real_root: PathBuf,
    pub(super) env: AgentEnv,
    pub(super) inherit_env: Vec<String>,
    pub(super) http: reqwest::Client,
    /// The tunnel's frame limit: a larger message can't be sent.
    pub(super) max_frame: usize,
    /// The program re-executed as `__child-guard` in front of every stdio child (Linux);
    /// `None` launches children directly.
    pub(super) guard: Option<PathBuf>,
}

impl Host {
    /// `root` must be an existing directory on this machine.
    pub fn new(
        name: &str,
        root: PathUri,
        env: AgentEnv,
        inherit_env: Vec<String>,
        http: reqwest::Client,
        max_frame: usize,
        guard: Option<PathBuf>,
    ) -> Result<Self, AgentError> {
        let bad = |message: String| AgentError::Root { root: root.to_string(), message };
        let real_root = std::fs::canonicalize(root.to_native()).map_err(|e| bad(e.to_string()))?;
        if !real_root.is_dir() {
            return Err(bad("not a directory".to_owned()));
        }
        Ok(Self { name: ExecutorId::new(name), root, real_root, env, inherit_env, http, max_frame, guard })
    }

    /// Replaces the program stdio children are launched through (`None`: launched directly).
    pub fn set_guard(&mut self, guard: Option<PathBuf>) {
        self.guard = guard;
    }

    pub fn root(&self) -> &PathUri {
        &self.root
    }

    /// `uri` as a real path inside the root: it must parse as a `file:` URI, lie inside the
    /// root as written, and still lie inside it once its symlinks are resolved (a link inside
    /// the root that points out of it is refused). `what` names the field for the reason,
    /// which carries its [`Refusal`] class.
    pub fn contained(&self, what: &str, uri: &str) -> Result<PathBuf, String> {
        let path = parse_file_uri(uri).map_err(|e| Refusal::Invalid.tag(&format!("{what} {uri:?}: {e}")))?;
        let outside =
            || Refusal::OutsideRoot.tag(&format!("{what} {uri:?} is outside the executor's root {}", self.root));
        if !self.root.contains(&path) {
            return Err(outside());
        }
        let real =
            std::fs::canonicalize(path.to_native()).map_err(|e| io_refusal(&e).tag(&format!("{what} {uri:?}: {e}")))?;
        if !real.starts_with(&self.real_root) {
            return Err(outside());
        }
        Ok(real)
    }

    /// Resolves a declaration value's `${NAME}` references on the agent's environment.
    fn expand(&self, what: &str, text: &str) -> Result<String, String> {
        declaration::expand(text, &self.env, &self.name).map_err(|e| format!("{what}: {e}"))
    }

    fn expand_map(&self, what: &str, map: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
        map.iter().map(|(k, v)| Ok((k.clone(), self.expand(&format!("{what} {k}"), v)?))).collect()
    }
}

/// The class of a failed filesystem call: missing, or there but not readable.
pub(super) fn io_refusal(e: &std::io::Error) -> Refusal {
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => Refusal::NotFound,
        _ => Refusal::Unreadable,
    }
}

/// A `file:` URI in this machine's convention.
pub fn parse_file_uri(uri: &str) -> Result<PathUri, crate::upstream::PathError> {
    PathUri::parse(uri, host_style())
}

fn host_style() -> PathStyle {
    if cfg!(windows) { PathStyle::Windows } else { PathStyle::Posix }
}

/// A channel checked and ready to serve: its child launched, its file open, its transport
/// built.
pub enum Prepared {
    Stdio(super::stdio::StdioServer),
    Http(super::http::HttpServer),
    ReadFile(super::file::FileServer),
}

/// Checks `open` on the agent's terms and prepares it; `Err` is the reason to refuse it with.
pub async fn prepare(host: &Host, open: Open) -> Result<Prepared, String> {
    match open {
        Open::Stdio { server, command, args, env, cwd } => {
            let cwd = host.contained("cwd", &cwd)?;
            let args = args
                .iter()
                .enumerate()
                .map(|(i, a)| host.expand(&format!("args[{i}]"), a))
                .collect::<Result<Vec<_>, _>>()?;
            let env = host.expand_map("env", &env)?;
            super::stdio::StdioServer::launch(host, &server, &command, &args, &env, &cwd).map(Prepared::Stdio)
        }
        Open::Http { server, url, headers, assertion_header } => {
            let headers = host.expand_map("headers", &headers)?;
            super::http::HttpServer::new(host, &server, &url, &headers, &assertion_header).map(Prepared::Http)
        }
        Open::ReadFile { uri, max_bytes } => {
            let path = host.contained("uri", &uri)?;
            super::file::FileServer::open(&path, &uri, max_bytes).await.map(Prepared::ReadFile)
        }
    }
}

impl Prepared {
    /// Serves the channel until it ends, `stop` is cancelled, or the server is done; whatever
    /// it launched is gone when this returns.
    pub async fn run(self, sink: impl MessageSink, source: impl MessageSource, stop: CancellationToken) {
        match self {
            Self::Stdio(server) => server.run(sink, source, stop).await,
            Self::Http(server) => server.run(sink, source, stop).await,
            Self::ReadFile(server) => server.run(sink, stop).await,
        }
    }
}

/// Answers one open request from the tunnel: refused with the reason, or accepted and served.
pub async fn serve_pending(host: Arc<Host>, pending: PendingOpen, stop: CancellationToken) {
    let open = pending.open.clone();
    match prepare(&host, open).await {
        Err(reason) => {
            tracing::warn!(executor = %host.name, "refused a channel: {reason}");
            pending.refuse(&reason);
        }
        Ok(prepared) => {
            let (sender, receiver) = pending.accept().split();
            prepared.run(sender, receiver, stop).await;
        }
    }
}
