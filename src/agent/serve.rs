//! One channel the gateway opens: checked on the agent's own terms (containment in the root,
//! references on the agent's environment), then served. It must never run or read anything
//! outside the root, whatever the gateway asks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::io::{MessageSink, MessageSource};
use super::{AgentClients, AgentEnv, AgentRoot};
use crate::decl::ExecutorId;
use crate::decl::PathUri;
use crate::decl::declaration;
use crate::tunnel::{Open, PendingOpen, Refusal};
use crate::wire::exchange::ExchangeClients;

/// What every channel of the agent needs: who it is, its root, its environment.
pub struct Host {
    pub(super) name: ExecutorId,
    root: AgentRoot,
    pub(super) env: AgentEnv,
    pub(super) inherit_env: Vec<String>,
    pub(super) http: reqwest::Client,
    /// The clients of Fetch channels (one following redirects, one not), with the same trust.
    pub(super) fetch: ExchangeClients,
    /// The tunnel's frame limit: a larger message can't be sent.
    pub(super) max_frame: usize,
    /// The program re-executed as `__child-guard` in front of every stdio child (Linux);
    /// `None` launches children directly.
    pub(super) guard: Option<PathBuf>,
}

impl Host {
    pub fn new(
        name: &str,
        root: AgentRoot,
        env: AgentEnv,
        inherit_env: Vec<String>,
        clients: AgentClients,
        max_frame: usize,
        guard: Option<PathBuf>,
    ) -> Self {
        let AgentClients { http, fetch } = clients;
        Self { name: ExecutorId::new(name), root, env, inherit_env, http, fetch, max_frame, guard }
    }

    /// Replaces the program stdio children are launched through (`None`: launched directly).
    pub fn set_guard(&mut self, guard: Option<PathBuf>) {
        self.guard = guard;
    }

    /// The root as the gateway knows it (a URI, never the directory it stands for here).
    pub fn root(&self) -> &PathUri {
        self.root.uri()
    }

    /// `uri` as a real path inside the root (see [`AgentRoot::contained`]): every path the
    /// agent is asked about goes through here. `what` names the field for the reason.
    pub fn contained(&self, what: &str, uri: &str) -> Result<PathBuf, String> {
        self.root.contained(what, uri)
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

/// A channel checked and ready to serve: its child launched, its file open, its transport
/// built.
pub enum Prepared {
    Stdio(super::stdio::StdioServer),
    Http(super::http::HttpServer),
    ReadFile(super::file::FileServer),
    Fetch(super::fetch::FetchServer),
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
        Open::Fetch { method, url, headers, body, follow_redirects, timeout_ms, max_bytes } => {
            let asked =
                super::fetch::FetchRequest { method, url, headers, body, follow_redirects, timeout_ms, max_bytes };
            super::fetch::FetchServer::start(&host.fetch, asked).await.map(Prepared::Fetch)
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
            Self::Fetch(server) => server.run(sink, stop).await,
        }
    }
}

/// Answers one open request from the tunnel: refused with the reason, or accepted and served.
pub async fn serve_pending(host: Arc<Host>, pending: PendingOpen, stop: CancellationToken) {
    let open = pending.open.clone();
    // Preparing may wait on the network (a fetch waits for its response head): stopping ends it.
    let prepared = tokio::select! {
        prepared = prepare(&host, open) => prepared,
        () = stop.cancelled() => Err("the executor is stopping".to_owned()),
    };
    match prepared {
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
