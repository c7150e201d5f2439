//! The executor agent (`scopegate executor`): dials out to the gateway, keeps the tunnel up,
//! and runs what its tenant declared on this machine, inside its own root and never beyond it.
//!
//! `connect` keeps one tunnel per gateway URL up (backoff in `backoff`); each channel the
//! gateway opens is checked and prepared by `serve` (containment, `${NAME}` references on the
//! agent's environment) and then pumped by `stdio`, `http`, `file` or `fetch` (one HTTP
//! exchange over this machine's network, for the gateway's OAuth) over the message I/O of
//! `io`, which the tunnel's channel halves implement and tests replace with memory pairs.
//! `root` is the one place a URI becomes a host path (`--root-dir` maps the root URI onto
//! another directory). `guard` is the hidden re-exec that ties a child's life to the agent's
//! on Linux.

pub mod backoff;
pub mod connect;
pub mod env;
mod fetch;
mod file;
pub mod guard;
mod http;
pub mod io;
pub mod root;
pub mod serve;
mod stdio;

use std::path::PathBuf;

pub use backoff::Backoff;
pub use connect::{AgentClients, AgentConfig, http_client, run};
pub use env::AgentEnv;
pub use root::AgentRoot;
pub use serve::{Host, Prepared, prepare, serve_pending};

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("--root {root}: {message}")]
    Root { root: String, message: String },
    #[error("--root-dir {}: {message}", path.display())]
    RootDir { path: PathBuf, message: String },
    #[error("--ca-file {path}: {message}")]
    CaFile { path: PathBuf, message: String },
    #[error("--gateway: at least one gateway URL is required")]
    NoGateway,
    #[error("--gateway {url}: {message}")]
    Gateway { url: String, message: String },
    #[error("--name {name:?}: {message}")]
    Name { name: String, message: String },
    #[error("--secret-file {path}: {message}")]
    SecretFile { path: PathBuf, message: String },
    #[error("building the HTTP client: {0}")]
    Client(String),
    #[error("finding the agent's own executable (for the child guard): {0}")]
    CurrentExe(std::io::Error),
}
