//! Pure declarations the upper layers share: executor paths as `file:` URIs ([`PathUri`]) and
//! what makes one canonical. Parsing only: nothing here reads a database, a file or the network.

pub mod canonical;
pub mod path_uri;

pub use path_uri::{PathError, PathStyle, PathUri};
