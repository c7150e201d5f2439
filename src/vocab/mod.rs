//! The floor: vocabulary every layer may use and that uses no other module of the crate:
//! digests of canonical JSON, the paths of the gateway's own routes that more than one layer
//! names, the `server__tool` naming of upstream tools, and the text rules for what callers and upstreams choose (error classes, audit
//! text). Nothing here does I/O or knows who is calling.

pub mod digest;
pub mod names;
pub mod routes;
pub mod text;
