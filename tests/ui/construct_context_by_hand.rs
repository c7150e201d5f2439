// `McpCallContext` comes only from its fail-closed factory: no struct literal.
use rmcp::model::RequestId;
use scopegate::McpCallContext;

fn main() {
    let _forged = McpCallContext {
        request_id: RequestId::Number(1),
        session_id: None,
    };
}
