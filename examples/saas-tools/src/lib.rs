//! A SaaS's own MCP tools, written against the `scopegate` library. Owns its tools and its
//! billing client; a tool never holds the billing key (guard row S1 in `guards.toml`). The
//! build walks what rustc compiled of this library and leaves the report in `OUT_DIR`
//! (`guards-compiled.md`, `.json`, `.sarif`); a binary of this package can embed it with
//! `scopegate::embedded_guard_report!()` and serve it (`scopegate::admin::report::install`).

pub mod billing;
pub mod tools;
