//! The SaaS's own tools, one file each. Each learns the caller only through
//! `McpCallContext`; none may reach a pool, a raw identity type or the billing key.

pub mod greet;

pub use greet::Greeter;
