//! `McpCallContext`: the only way a tool learns who is calling. It is defined in
//! `identity`, beside the raw identity types it reads and that nothing else may name.

pub use crate::identity::{CallSite, ContextError, FlockAccess, McpCallContext};
