//! The integration test binary (one binary keeps link time down).

#[macro_use]
mod support;

mod auth;
mod cli;
mod compose;
mod config;
mod guards;
mod identity;
mod store;
mod type_privacy;
