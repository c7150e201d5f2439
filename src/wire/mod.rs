//! What the gateway and its agent both speak to an upstream, below either: the rmcp HTTP
//! client for Streamable HTTP upstreams (`client`: the per-call identity assertion moved into a
//! header, an executor's access token into `Authorization`), one bounded HTTP exchange over this
//! host's network (`exchange`), when a request's event stream is resumed (`resume`), and the
//! `_meta` keys by which the gateway and an agent mark what travels between them. Holds no
//! caller's identity and decides nothing about one.

pub mod client;
pub mod exchange;
pub mod resume;

/// Where a proxied message to an executor-hosted protected server carries its access token;
/// the agent moves it into the `Authorization` header and never forwards it in a body.
pub const AUTHORIZATION_META_KEY: &str = "io.scopegate/authorization";

/// Where the agent marks the error of a request the server refused with a 401 (`true` in the
/// JSON-RPC error's `data`), so the gateway refreshes the token and sends it again, once.
pub const UNAUTHORIZED_DATA_KEY: &str = "io.scopegate/upstreamUnauthorized";
