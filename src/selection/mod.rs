//! Selected plugin roots: a session brings its own plugins, folders on an executor the tenant
//! owns, named at `initialize` (or in a stateless request's `_meta`) under
//! [`SELECTED_ROOTS_KEY`]. Each root's `.mcp.json` is read through that executor's agent
//! (never the gateway's filesystem), parsed with the declaration parser and placed under the
//! root; its servers run on the executor and their tools are that session's alone.
//!
//! A selection is resolved once and frozen: what a root declares is read the first time its
//! executor is connected and kept for the session, whatever changes afterwards. Readiness
//! follows the executors: a root whose executor is not connected adds nothing (the session is
//! not refused); when it connects, the frozen metadata is used and one runtime holding the
//! ready roots' servers is published, and the session is told `tools/list_changed`; while the
//! set of ready roots is unchanged the same runtime (the same processes) is kept; when the
//! executor drops, its tools leave, and come back on reconnect. When the session ends, its
//! runtime is closed and its servers stop.
//!
//! Naming: the tools of the `N`th selected root (1-based, in the order the client listed the
//! roots) are `rN.SERVER__TOOL`. Server names of bindings can't contain `.`, so these never
//! collide with bound servers, native tools or another root's tools.
//!
//! Authorization: selecting a root runs code on an executor, so it is allowed explicitly per
//! tenant, executor, base folder and role (`admin root allow`), fail closed; the allowance is
//! also the grant: a session that may select a root may use every tool its servers offer.

pub mod roots;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rmcp::model::Tool;
use rmcp::service::Peer;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::decl::ExecutorId;
use crate::decl::declaration::{Placement, ResolvedServer, parse_declarations};
use crate::executor::Executor;
use crate::executor::file::ReadFileError;
use crate::executor::remote::{RemoteEnv, RemoteHostHandler};
use crate::model::Role;
use crate::proxy::RelayCaps;
use crate::proxy::connection::Connection;
use crate::proxy::snapshot::Snapshot;
use crate::selection::roots::{AllowedRoot, check_root_selection};
use crate::store::entities::{GRANT_ALL, GrantKind, GrantRow};
use crate::store::{Db, StoreError, TenantId, UserId};
use crate::vocab::names::NAME_SEPARATOR;

/// The `_meta` key (of `initialize`, or of a stateless request) naming the selected roots.
pub const SELECTED_ROOTS_KEY: &str = "io.scopegate/selectedRoots";

/// At most this many roots per session.
pub const MAX_ROOTS: usize = 16;

/// A plugin's `.mcp.json` larger than this is not read.
const MCP_JSON_MAX_BYTES: u64 = 1024 * 1024;

/// How long reading a plugin's `.mcp.json` through its executor may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What is wrong with a selection, naming the field: answered -32602.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionError {
    /// `io.scopegate/selectedRoots[1].path`, ...
    pub field: String,
    pub message: String,
    /// For refusals of the allowance check: its stable reason (audited); `None` for a
    /// malformed request.
    pub refusal: Option<&'static str>,
}

impl SelectionError {
    fn shape(field: String, message: impl Into<String>) -> Self {
        Self { field, message: message.into(), refusal: None }
    }

    pub fn into_error_data(self) -> ErrorData {
        ErrorData::invalid_params(format!("{}: {}", self.field, self.message), Some(json!({ "field": self.field })))
    }
}

/// One root as the client wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub executor: String,
    pub path: String,
}

/// The roots named under [`SELECTED_ROOTS_KEY`] in `meta`, if any: an array of
/// `{ "executor": NAME, "path": "file:///..." }`, nothing else. Shape only: whether the paths
/// are canonical `file:` URIs, and whether the caller may select them, is [`authorize`]'s.
pub fn requested(meta: &Map<String, Value>) -> Result<Option<Vec<Requested>>, SelectionError> {
    let Some(value) = meta.get(SELECTED_ROOTS_KEY) else { return Ok(None) };
    let Some(items) = value.as_array() else {
        return Err(SelectionError::shape(SELECTED_ROOTS_KEY.to_owned(), "must be an array of {executor, path}"));
    };
    if items.len() > MAX_ROOTS {
        return Err(SelectionError::shape(
            SELECTED_ROOTS_KEY.to_owned(),
            format!("at most {MAX_ROOTS} roots may be selected"),
        ));
    }
    let mut out: Vec<Requested> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = |field: &str| format!("{SELECTED_ROOTS_KEY}[{i}]{field}");
        let Some(object) = item.as_object() else {
            return Err(SelectionError::shape(at(""), "must be an object {executor, path}"));
        };
        if let Some(unknown) = object.keys().find(|k| *k != "executor" && *k != "path") {
            return Err(SelectionError::shape(at(&format!(".{unknown}")), "unknown field"));
        }
        let text = |field: &str| match object.get(field) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(_) => Err(SelectionError::shape(at(&format!(".{field}")), "must be a non-empty string")),
            None => Err(SelectionError::shape(at(&format!(".{field}")), "is required")),
        };
        let requested = Requested { executor: text("executor")?, path: text("path")? };
        if out.contains(&requested) {
            return Err(SelectionError::shape(at(""), "selects the same root twice"));
        }
        out.push(requested);
    }
    Ok(Some(out))
}

/// Whether a caller of `tenant` with `roles` may select every one of `requested`: each path a
/// canonical `file:` URI, on an executor the tenant owns, under a base allowed for one of the
/// roles. The first refusal answers, naming its field.
pub async fn authorize(
    db: &Db,
    tenant: TenantId,
    roles: &[Role],
    requested: &[Requested],
) -> Result<Result<Vec<AllowedRoot>, SelectionError>, StoreError> {
    let (allowances, owned) = tokio::try_join!(db.root_allowances(tenant), db.owned_executors(tenant))?;
    let mut out = Vec::with_capacity(requested.len());
    for (i, r) in requested.iter().enumerate() {
        match check_root_selection(&allowances, &owned, roles, &r.executor, &r.path) {
            Ok(allowed) => out.push(allowed),
            Err(refusal) => {
                let field = format!("{SELECTED_ROOTS_KEY}[{i}].{}", refusal.field());
                return Ok(Err(SelectionError {
                    field,
                    message: refusal.to_string(),
                    refusal: Some(refusal.reason()),
                }));
            }
        }
    }
    Ok(Ok(out))
}

/// What one root declares, read once for a session: its servers placed under the root.
struct Frozen {
    servers: Vec<ResolvedServer>,
}

/// The servers of the roots that are ready now. Kept (the same object, the same processes)
/// while the set of ready roots does not change.
pub struct SelectedRuntime {
    ready: Vec<bool>,
    servers: BTreeMap<String, Arc<Connection>>,
}

impl SelectedRuntime {
    fn empty(roots: usize) -> Self {
        Self { ready: vec![false; roots], servers: BTreeMap::new() }
    }

    /// The connection serving `server` (`rN.NAME`), if that root is ready.
    pub fn connection(&self, server: &str) -> Option<&Arc<Connection>> {
        self.servers.get(server)
    }

    /// Every server, by its session name (`rN.NAME`).
    pub fn servers(&self) -> impl Iterator<Item = (&String, &Arc<Connection>)> {
        self.servers.iter()
    }

    /// The ready roots' servers as a snapshot for the session's caller, for prompts and
    /// resources: everything a selected server offers is the session's (selecting the root,
    /// allowed per tenant, executor, folder and role, was the grant).
    pub fn snapshot(&self, tenant: TenantId, user: UserId, roles: &[Role]) -> Snapshot {
        let mut grants = Vec::new();
        for server in self.servers.keys() {
            for role in roles {
                for kind in [GrantKind::Tool, GrantKind::Prompt, GrantKind::Resource] {
                    grants.push(GrantRow {
                        server: server.clone(),
                        role: *role,
                        kind,
                        name: GRANT_ALL.to_owned(),
                        confirm: None,
                    });
                }
            }
        }
        Snapshot::with(tenant, user, self.servers.clone(), grants)
    }
}

/// One session's selected roots.
pub struct Selection {
    tenant: TenantId,
    roots: Vec<AllowedRoot>,
    remote: Arc<RemoteHostHandler>,
    frozen: tokio::sync::Mutex<Vec<Option<Arc<Frozen>>>>,
    current: Mutex<Arc<SelectedRuntime>>,
    /// The session's client, told when the tool list changes (none for a stateless request).
    peer: Option<Peer<RoleServer>>,
    stop: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A root's session name for server `server`: `rN.server`.
pub fn session_server_name(index: usize, server: &str) -> String {
    format!("r{}.{server}", index + 1)
}

/// Whether a `server` part of a tool name belongs to a selected root (`rN.NAME`).
pub fn is_selected_server(server: &str) -> bool {
    server.contains('.')
}

impl Selection {
    /// A selection for `roots` (already authorized), resolved as far as the executors allow
    /// now. With a `peer` (a session), it then follows the executors until the session ends.
    pub async fn start(
        tenant: TenantId,
        roots: Vec<AllowedRoot>,
        remote: Arc<RemoteHostHandler>,
        peer: Option<Peer<RoleServer>>,
    ) -> Arc<Self> {
        let n = roots.len();
        let selection = Arc::new(Self {
            tenant,
            roots,
            remote,
            frozen: tokio::sync::Mutex::new(vec![None; n]),
            current: Mutex::new(Arc::new(SelectedRuntime::empty(n))),
            stop: CancellationToken::new(),
            peer,
        });
        let mut changes = selection.remote.agents().changes();
        // Not told: the client has not listed anything yet (and, inside `initialize`, a
        // notification could not be sent before the answer).
        selection.refresh(false).await;
        if selection.peer.is_some() {
            let weak: Weak<Self> = Arc::downgrade(&selection);
            let stop = selection.stop.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        changed = changes.changed() => {
                            if changed.is_err() {
                                return;
                            }
                        }
                    }
                    let Some(selection) = weak.upgrade() else { return };
                    selection.refresh(true).await;
                }
            });
        }
        selection
    }

    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// The runtime of the roots ready now.
    pub fn runtime(&self) -> Arc<SelectedRuntime> {
        Arc::clone(&lock(&self.current))
    }

    /// Brings the published runtime in line with the executors connected now: reads what a
    /// newly ready root declares (once), publishes a new runtime only when the set of ready
    /// roots changed, and then tells the session when `tell`.
    async fn refresh(&self, tell: bool) {
        let agents = self.remote.agents();
        let mut frozen = self.frozen.lock().await;
        let mut ready = Vec::with_capacity(self.roots.len());
        for (i, root) in self.roots.iter().enumerate() {
            let mut is_ready = agents.reach(&root.executor).await.is_some();
            if is_ready && frozen[i].is_none() {
                match self.read(root).await {
                    Ok(read) => frozen[i] = Some(Arc::new(read)),
                    Err(e) => {
                        // Not frozen: read again when the executor is next (re)connected.
                        tracing::warn!(executor = %root.executor, root = %root.root, error = %e, "selected root not read");
                        is_ready = false;
                    }
                }
            }
            ready.push(is_ready);
        }
        let old = self.runtime();
        if old.ready == ready {
            return;
        }
        let mut servers = BTreeMap::new();
        for (i, root) in self.roots.iter().enumerate() {
            let Some(read) = frozen[i].as_ref().filter(|_| ready[i]) else { continue };
            let Some(link) = agents.reach(&root.executor).await else { continue };
            for server in &read.servers {
                let name = session_server_name(i, server.name.as_str());
                let connection = match old.servers.get(&name).filter(|_| old.ready[i]) {
                    Some(kept) => Arc::clone(kept),
                    None => {
                        let executor = Executor::Remote {
                            id: ExecutorId::new(&root.executor),
                            root: link.root.clone(),
                            host: Arc::clone(&self.remote),
                        };
                        Arc::new(Connection::new(server.clone(), executor, None, RelayCaps::default(), None))
                    }
                };
                servers.insert(name, connection);
            }
        }
        let gone: Vec<Arc<Connection>> =
            old.servers.iter().filter(|(name, _)| !servers.contains_key(*name)).map(|(_, c)| Arc::clone(c)).collect();
        *lock(&self.current) = Arc::new(SelectedRuntime { ready, servers });
        drop(frozen);
        for connection in gone {
            connection.close().await;
        }
        if let Some(peer) = self.peer.as_ref().filter(|_| tell)
            && let Err(e) = peer.notify_tool_list_changed().await
        {
            tracing::debug!(error = %e, "could not tell a session its tool list changed");
        }
    }

    /// Reads and places what `root` declares, through its executor.
    async fn read(&self, root: &AllowedRoot) -> Result<Frozen, String> {
        let executor = ExecutorId::new(&root.executor);
        let file = root.root.join(".mcp.json").map_err(|e| e.to_string())?;
        let bytes = match self.remote.agents().read_file(&executor, &file, MCP_JSON_MAX_BYTES, READ_TIMEOUT).await {
            Ok(bytes) => bytes,
            // A root without `.mcp.json` declares nothing: ready, with no servers.
            Err(ReadFileError::NotFound(_)) => return Ok(Frozen { servers: Vec::new() }),
            Err(e) => return Err(e.to_string()),
        };
        let text = String::from_utf8(bytes).map_err(|_| format!("{file} is not UTF-8"))?;
        let declarations = parse_declarations(&text).map_err(|e| format!("{file}: {e}"))?;
        for problem in &declarations.errors {
            tracing::warn!(root = %root.root, %problem, "a selected root's server is not served");
        }
        let placement = Placement::Environment { executor: executor.clone(), root: root.root.clone() };
        let mut servers = Vec::new();
        for declared in &declarations.servers {
            match declared.resolve(&placement, &RemoteEnv) {
                Ok(resolved) => servers.push(resolved),
                Err(problems) => {
                    for problem in problems {
                        tracing::warn!(root = %root.root, %problem, "a selected root's server is not served");
                    }
                }
            }
        }
        Ok(Frozen { servers })
    }

    /// The tools of the ready roots, named `rN.SERVER__TOOL`. A server that fails to start is
    /// left out of the list.
    pub async fn list(&self, timeout: Duration) -> Vec<Tool> {
        let runtime = self.runtime();
        let mut out = Vec::new();
        for (name, connection) in runtime.servers() {
            match connection.ready(timeout).await {
                Ok((_, tools)) => out.extend(tools.iter().map(|t| {
                    let mut tool = t.clone();
                    tool.name = format!("{name}{NAME_SEPARATOR}{}", t.name).into();
                    tool
                })),
                Err(e) => tracing::warn!(server = %name, error = %e, "selected root's server unavailable"),
            }
        }
        out
    }
}

impl Drop for Selection {
    /// The session ended: its servers stop.
    fn drop(&mut self) {
        self.stop.cancel();
        let servers: Vec<Arc<Connection>> = lock(&self.current).servers.values().cloned().collect();
        if servers.is_empty() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                for connection in servers {
                    connection.close().await;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(value: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(SELECTED_ROOTS_KEY.to_owned(), value);
        m
    }

    #[test]
    fn the_selection_shape_is_checked_field_by_field() {
        assert_eq!(requested(&Map::new()).unwrap(), None);
        let ok = requested(&meta(json!([{ "executor": "build-01", "path": "file:///srv/p" }]))).unwrap().unwrap();
        assert_eq!(ok, [Requested { executor: "build-01".into(), path: "file:///srv/p".into() }]);
        let cases = [
            (json!({}), "io.scopegate/selectedRoots"),
            (json!(["x"]), "io.scopegate/selectedRoots[0]"),
            (json!([{ "path": "file:///a" }]), "io.scopegate/selectedRoots[0].executor"),
            (json!([{ "executor": "e" }]), "io.scopegate/selectedRoots[0].path"),
            (json!([{ "executor": "e", "path": 3 }]), "io.scopegate/selectedRoots[0].path"),
            (json!([{ "executor": "", "path": "file:///a" }]), "io.scopegate/selectedRoots[0].executor"),
            (json!([{ "executor": "e", "path": "file:///a", "mode": "rw" }]), "io.scopegate/selectedRoots[0].mode"),
            (
                json!([{ "executor": "e", "path": "file:///a" }, { "executor": "e", "path": "file:///a" }]),
                "io.scopegate/selectedRoots[1]",
            ),
        ];
        for (value, field) in cases {
            let err = requested(&meta(value.clone())).unwrap_err();
            assert_eq!(err.field, field, "{value}");
            assert!(err.refusal.is_none());
        }
        let many: Vec<Value> =
            (0..=MAX_ROOTS).map(|i| json!({ "executor": "e", "path": format!("file:///p{i}") })).collect();
        assert_eq!(requested(&meta(Value::Array(many))).unwrap_err().field, SELECTED_ROOTS_KEY);
    }

    #[test]
    fn selected_servers_are_named_so_they_cannot_collide() {
        assert_eq!(session_server_name(0, "demo"), "r1.demo");
        assert!(is_selected_server("r1.demo"));
        // A bound server's name can't contain `.`.
        assert!(crate::decl::ServerName::new("r1.demo").is_err());
        assert!(!is_selected_server("demo"));
    }
}
