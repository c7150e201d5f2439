//! `greet`: says hello to the caller by name and tenant. Reads only `McpCallContext`.

use rmcp::{tool, tool_router};
use scopegate::McpCallContext;
use scopegate::mcp::{RegistryError, ToolSet};
use scopegate::model::Role;
use scopegate::tools::{NoArguments, ToolSpec, arguments};

/// The SaaS's tool set. Holds nothing: everything a call needs comes from its context.
#[derive(Debug, Clone, Default)]
pub struct Greeter;

/// This crate's entries in the gateway's authorization table.
pub const GREETER_TOOLS: &[ToolSpec] = &[ToolSpec {
    name: "greet",
    roles: &[Role::Owner, Role::Manager, Role::Worker, Role::Auditor],
    validate: arguments::<NoArguments>,
}];

/// The gateway's native tools plus this crate's: pass it to `Gateway::build_with_tools`.
pub fn tool_set() -> Result<ToolSet, RegistryError> {
    ToolSet::native().with(Greeter, Greeter::tool_router(), GREETER_TOOLS)
}

#[tool_router]
impl Greeter {
    #[tool(description = "Greets the caller by name, in their tenant.")]
    pub async fn greet(&self, ctx: McpCallContext) -> String {
        greeting(ctx.subject(), ctx.tenant_slug())
    }
}

fn greeting(subject: &str, tenant: &str) -> String {
    format!("Hello {subject}, from the {tenant} workspace.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_is_described_and_takes_no_arguments() {
        let tool = Greeter::greet_tool_attr();
        assert_eq!(tool.name, "greet");
        assert_eq!(tool.description.as_deref(), Some("Greets the caller by name, in their tenant."));
        assert!(
            tool.input_schema.get("properties").is_none_or(|p| p.as_object().is_some_and(|o| o.is_empty())),
            "{:?}",
            tool.input_schema
        );
    }

    #[test]
    fn registers_beside_the_native_tools() {
        let tools = tool_set().expect("no name clash, every tool has its entry");
        assert!(tools.has("greet") && tools.has("list_flocks"));
        assert!(tools.spec("greet").is_some());
        // A second registration of the same tools is refused, not merged.
        let again = tools.with(Greeter, Greeter::tool_router(), GREETER_TOOLS);
        assert!(matches!(again, Err(RegistryError::Duplicate(name)) if name == "greet"));
    }

    #[test]
    fn greeting_names_caller_and_tenant() {
        assert_eq!(greeting("olivia@acme.test", "acme"), "Hello olivia@acme.test, from the acme workspace.");
    }
}
