//! Upstream MCP servers: declarations, executors, their paths, and the identity-scoped proxy.
//!
//! `path_uri` keeps executor paths as `file:` URIs; `declaration` parses `.mcp.json` files and
//! resolves one server for one placement on one executor; `executor` launches or dials a
//! resolved server where it is bound; `roots` decides which plugin roots a session may select;
//! `runtime` shares, restarts and closes the connections, freezes each session's snapshot and
//! makes proxied calls; `client` carries the per-call identity assertion to Streamable HTTP
//! upstreams in a header. `exchange` is one bounded HTTP exchange over this host's network,
//! and `oauth_http` the OAuth HTTP client of an executor: this host's network for the local
//! one, the agent's (a Fetch channel) for a remote one. `surface` names upstream tools, prompts
//! and resources for clients and routes them back; `catalog` keeps a connection's lists, the
//! sessions that follow them and resource subscriptions.

pub mod catalog;
pub mod client;
pub mod connection;
pub mod declaration;
pub mod exchange;
pub mod executor;
pub mod oauth;
pub mod oauth_http;
pub mod remote;
pub mod roots;
pub mod routing;
pub mod runtime;
pub mod selected;
pub mod snapshot;
pub mod surface;

use std::fmt;

pub use crate::decl::path_uri;
pub use crate::decl::{PathError, PathStyle, PathUri};
pub use declaration::{
    Declarations, FileError, Placement, ResolvedServer, ResolvedTransport, ServerDeclaration, ServerError, ServerName,
    Transport, parse_declarations,
};

/// The id of an executor: the place where upstream servers run (`local` is the gateway host).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecutorId(String);

impl ExecutorId {
    /// The gateway host itself.
    pub const LOCAL: &str = "local";

    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    pub fn local() -> Self {
        Self(Self::LOCAL.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ExecutorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The environment of the executor a server is resolved for.
pub trait ExecutorEnv {
    /// A variable of the executor's own environment.
    fn var(&self, name: &str) -> Option<String>;
    /// Whether the executor is the gateway host, whose environment is the gateway's own.
    fn is_local(&self) -> bool;
    /// Whether `${NAME}` references are left for the executor to resolve on its own machine
    /// (a remote executor: the gateway never learns the executor's environment).
    fn deferred(&self) -> bool {
        false
    }
}
