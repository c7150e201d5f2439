//! The tool registry: the native tools plus any tool set a SaaS registers, each with its
//! entry in the one authorization table. Never runs a tool without its entry.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolRequestParams, CallToolResponse, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use crate::tools::ToolSpec;

type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<CallToolResponse, ErrorData>> + Send + 'a>>;

/// A router of some receiver type, behind one interface.
trait Routes: Send + Sync {
    fn list(&self) -> Vec<Tool>;
    fn has(&self, name: &str) -> bool;
    fn get(&self, name: &str) -> Option<Tool>;
    fn call<'a>(&'a self, request: CallToolRequestParams, context: RequestContext<RoleServer>) -> CallFuture<'a>;
}

struct Typed<T: Send + Sync + 'static> {
    receiver: T,
    router: ToolRouter<T>,
}

impl<T: Send + Sync + 'static> Routes for Typed<T> {
    fn list(&self) -> Vec<Tool> {
        self.router.list_all()
    }
    fn has(&self, name: &str) -> bool {
        self.router.has_route(name)
    }
    fn get(&self, name: &str) -> Option<Tool> {
        self.router.get(name).cloned()
    }
    fn call<'a>(&'a self, request: CallToolRequestParams, context: RequestContext<RoleServer>) -> CallFuture<'a> {
        Box::pin(self.router.call(ToolCallContext::new(&self.receiver, request, context)))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("tool `{0}` is registered twice")]
    Duplicate(String),
    #[error("tool `{0}` has no entry in the authorization table (roles and argument check)")]
    NoSpec(String),
    #[error("tool `{0}` has an authorization entry but no implementation")]
    NoRoute(String),
    #[error("tool `{0}` contains `__`, which only upstream tools (`server__tool`) may use")]
    ReservedName(String),
}

/// Every tool the gateway serves, with who may use it.
#[derive(Clone)]
pub struct ToolSet {
    routes: Vec<Arc<dyn Routes>>,
    specs: Vec<ToolSpec>,
}

impl ToolSet {
    /// The native (farm) tools.
    pub fn native() -> Self {
        Self::empty()
            .with(crate::tools::FarmTools, crate::tools::router(), crate::tools::TOOLS)
            .expect("the native tools are consistent")
    }

    fn empty() -> Self {
        Self { routes: Vec::new(), specs: Vec::new() }
    }

    /// Adds a tool set: `router`'s tools, served with `receiver` (which, like `FarmTools`,
    /// should hold nothing: tools learn everything through `McpCallContext`), and `specs`,
    /// their entries in the authorization table. A name already taken, a tool without an
    /// entry, or an entry without a tool is refused.
    pub fn with<T: Send + Sync + 'static>(
        mut self,
        receiver: T,
        router: ToolRouter<T>,
        specs: &[ToolSpec],
    ) -> Result<Self, RegistryError> {
        let typed = Typed { receiver, router };
        for tool in typed.list() {
            let name = tool.name.to_string();
            // The name rule that makes collisions impossible: a native name never contains the
            // separator, and every upstream tool is `server__tool`.
            if name.contains(crate::vocab::names::NAME_SEPARATOR) {
                return Err(RegistryError::ReservedName(name));
            }
            if self.has(&name) {
                return Err(RegistryError::Duplicate(name));
            }
            if !specs.iter().any(|s| s.name == name) {
                return Err(RegistryError::NoSpec(name));
            }
        }
        for spec in specs {
            if !typed.has(spec.name) {
                return Err(RegistryError::NoRoute(spec.name.to_owned()));
            }
        }
        self.specs.extend(specs.iter().cloned());
        self.routes.push(Arc::new(typed));
        Ok(self)
    }

    /// Its tools as policies see them, each with its role list (the ceiling of its callers).
    pub fn policy_facts(&self) -> Vec<crate::policy::ToolFacts> {
        self.list()
            .iter()
            .map(|tool| {
                let roles = self.spec(&tool.name).map(|s| s.roles).unwrap_or_default();
                crate::policy::ToolFacts::native(tool, roles)
            })
            .collect()
    }

    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.specs.iter().find(|s| s.name == name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.routes.iter().any(|r| r.has(name))
    }

    pub fn list(&self) -> Vec<Tool> {
        self.routes.iter().flat_map(|r| r.list()).collect()
    }

    pub fn get(&self, name: &str) -> Option<Tool> {
        self.routes.iter().find_map(|r| r.get(name))
    }

    pub(crate) async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match self.routes.iter().find(|r| r.has(&request.name)) {
            Some(routes) => routes.call(request, context).await,
            None => Err(ErrorData::invalid_params("tool not found", None)),
        }
    }
}
