//! The integration test binary (one binary keeps link time down).

#[macro_use]
mod support;

mod admin_api;
mod agent;
mod auth;
mod checkpoints;
mod cli;
mod compose;
mod config;
mod console;
mod docs;
mod executors;
mod fixture;
mod fixture_everything;
mod grants;
mod guards;
mod hardening;
mod identity;
mod idp;
mod interop;
mod layers;
mod lean;
mod mcp;
mod mcp_http;
mod mcp_modern;
mod mcp_shutdown;
mod mcp_timeout;
mod negotiation;
mod oauth;
mod oauth_fixture;
mod otel;
mod proxy;
mod readme;
mod remote;
mod remote_fetch;
mod replicas;
mod roots;
mod selected;
mod store;
mod surface;
mod tasks;
mod tool_results;
mod type_privacy;
mod upstream;
mod vault;
