//! scopegate: an identity-scoped MCP gateway for multi-tenant SaaS.
//!
//! The request path, in the order a request meets it: `http` (layers, routes) ->
//! `auth` (bearer JWT) -> `identity` (tenant, user, flock scope; the `McpCallContext`
//! factory) -> tools. `store` owns every SQL statement; `config` and `telemetry` set up.

pub mod admin;
pub mod agent;
pub mod app;
pub mod audit;
pub mod auth;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod context;
pub mod decl;
pub(crate) mod error_body;
pub mod executor;
pub mod http;
pub mod identity;
pub mod jsonrpc;
pub mod mcp;
pub mod model;
pub mod oauth;
pub mod policy;
pub mod proxy;
pub mod relay;
pub mod selection;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod tools;
pub mod tunnel;
pub mod vocab;
pub mod wire;

pub use app::Gateway;
pub use config::Config;
pub use context::McpCallContext;
