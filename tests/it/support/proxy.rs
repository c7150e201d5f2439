//! The proxy's test set-up: a gateway with the demo data, a plugin root holding `work/`, the
//! local executor and a remote one, and the fixture upstream `fx` served over stdio or
//! Streamable HTTP.

use std::path::PathBuf;

use scopegate::model::Role;
use scopegate::store::entities;
use serde_json::{Value, json};

use super::db::Backend;
use super::fixtures::{HttpFixture, stdio_declaration};
use super::gateway::{Live, Mode};

/// A gateway with the demo data, a plugin root holding `work/`, and the local executor.
pub struct Proxy {
    pub live: Live,
    pub root: tempfile::TempDir,
    /// `fx` over Streamable HTTP, when it is served that way.
    http: Option<HttpFixture>,
}

/// How the fixture `fx` is reached: launched over stdio, or dialed over Streamable HTTP (where
/// calls in a session take the lean relay).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Over {
    Stdio,
    Http,
}

impl Proxy {
    pub async fn start(backend: Backend, mode: Mode, overrides: &[(&str, Value)]) -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("work")).unwrap();
        let root_uri = format!("file://{}", root.path().canonicalize().unwrap().display());
        let mut all = vec![("upstream.local_root", json!(root_uri)), ("upstream.connect_timeout_secs", json!(3))];
        all.extend(overrides.iter().cloned());
        let live = Live::start(backend, mode, &all).await;
        let mut tx = live.db.begin().await.unwrap();
        entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
        entities::create_executor(&mut tx, "build-01", "build-01", "ci", "remote", &["acme"]).await.unwrap();
        tx.commit().await.unwrap();
        Self { live, root, http: None }
    }

    /// A stdio declaration of the fixture as server `server`, with `value` as the variable
    /// only its declaration supplies.
    pub fn stdio(&self, server: &str, value: &str) -> Value {
        let mut declaration = stdio_declaration(&self.live, server, value);
        declaration["env"]["FIXTURE_MARK_FILE"] = json!(self.marks().display().to_string());
        declaration
    }

    pub async fn declare(&self, tenant: &str, server: &str, declaration: &Value, executor: &str) {
        let mut tx = self.live.db.begin().await.unwrap();
        entities::create_entity(&mut tx, tenant, &format!("defaults/mcp-servers/{server}"), declaration).await.unwrap();
        entities::bind_server(&mut tx, tenant, server, executor).await.unwrap();
        tx.commit().await.unwrap();
    }

    pub async fn grant(&self, tenant: &str, server: &str, role: Role, tool: &str) {
        let mut tx = self.live.db.begin().await.unwrap();
        entities::grant_tool(&mut tx, tenant, server, role, tool).await.unwrap();
        tx.commit().await.unwrap();
    }

    /// Replaces the declaration of `server`.
    pub async fn redeclare(&self, tenant: &str, server: &str, declaration: &Value) {
        let mut tx = self.live.db.begin().await.unwrap();
        let name = format!("defaults/mcp-servers/{server}");
        entities::delete_entity(&mut tx, tenant, &name).await.unwrap();
        entities::create_entity(&mut tx, tenant, &name, declaration).await.unwrap();
        tx.commit().await.unwrap();
    }

    /// The standard set-up: acme's `fx` (owner: every tool; worker: whoami only).
    pub async fn with_fx(backend: Backend, mode: Mode, overrides: &[(&str, Value)]) -> Self {
        Self::with_fx_over(backend, mode, overrides, Over::Stdio).await
    }

    /// [`Proxy::with_fx`], with `fx` reached `over` stdio or Streamable HTTP.
    pub async fn with_fx_over(backend: Backend, mode: Mode, overrides: &[(&str, Value)], over: Over) -> Self {
        let mut proxy = Self::start(backend, mode, overrides).await;
        let declaration = match over {
            Over::Stdio => proxy.stdio("fx", "from-the-declaration"),
            Over::Http => {
                let marks = proxy.marks();
                let fixture = HttpFixture::start_marked(&proxy.live, "fx", false, Some(&marks)).await;
                let url = fixture.url.clone();
                proxy.http = Some(fixture);
                json!({"type": "http", "url": url, "headers": {"x-declared": "from-the-declaration"}})
            }
        };
        proxy.declare("acme", "fx", &declaration, "local").await;
        proxy.grant("acme", "fx", Role::Owner, "*").await;
        proxy.grant("acme", "fx", Role::Worker, "whoami_upstream").await;
        proxy
    }

    /// The URL of `fx` when it is served over Streamable HTTP.
    pub fn fx_url(&self) -> Option<String> {
        self.http.as_ref().map(|f| f.url.clone())
    }

    /// Where the fixture marks what it saw (`cancelled`, one line each).
    pub fn marks(&self) -> PathBuf {
        self.root.path().join("marks")
    }
}
