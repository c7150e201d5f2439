//! `greet`: says hello to the caller by name and tenant. Reads only `McpCallContext`.

use rmcp::tool;
use scopegate::McpCallContext;

/// The SaaS's tool set. Holds nothing: everything a call needs comes from its context.
#[derive(Debug, Clone, Default)]
pub struct Greeter;

// SEAM: when the gateway exposes its tool registry (the MCP endpoint work), this impl gets
// `#[tool_router]` and the app registers it on the gateway builder, along the lines of
// `Gateway::builder(config).tools(Greeter::tool_router())`. Until `McpCallContext` is an
// rmcp extractor (`FromContextPart`), a router over this fn would not compile, so the impl
// carries `#[tool]` alone: the tool's metadata is built and the guard walks it all the same.
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
    fn greeting_names_caller_and_tenant() {
        assert_eq!(greeting("olivia@acme.test", "acme"), "Hello olivia@acme.test, from the acme workspace.");
    }
}
