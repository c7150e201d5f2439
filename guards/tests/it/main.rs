//! Integration tests for the guard, compiled into one binary: the compiled walk on small
//! crates rustc compiles (`compiled`, and `ported`, the cases of the retired source walk), the
//! rules file, and the report's JSON schema.

mod compiled;
mod ported;
mod rules;
mod schema;
