//! Pure declarations the upper layers share: executor paths as `file:` URIs ([`PathUri`]) and
//! what makes one canonical, the `.mcp.json` declarations of upstream servers and one server
//! resolved for one placement on one executor ([`declaration`]), and the ids and environment of
//! executors. Parsing only: nothing here reads a database, a file or the network.

pub mod canonical;
pub mod declaration;
pub mod path_uri;

use std::fmt;

pub use declaration::{
    Declarations, FileError, Placement, ResolvedServer, ResolvedTransport, ServerDeclaration, ServerError, ServerName,
    Transport, parse_declarations,
};
pub use path_uri::{PathError, PathStyle, PathUri};

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
