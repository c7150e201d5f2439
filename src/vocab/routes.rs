//! Paths of the gateway's own routes, named by the router, the tracing filter and the clients
//! that dial them.

/// Where an executor dials in (WebSocket upgrade) to open its tunnel.
pub const CONNECT_PATH: &str = "/executors/connect";

/// The OAuth redirect target of upstream authorization, under the public URL.
pub const CALLBACK_PATH: &str = "/oauth/callback";

/// Start links, under the public URL: `{START_PATH}/{secret}`.
pub const START_PATH: &str = "/oauth/start";

/// Where another replica dials in (WebSocket upgrade) to reach an executor agent connected to
/// this one: the link carries channels the asking replica opens on that agent.
pub const AGENT_LINK_PATH: &str = "/internal/agent-link";
