//! The fixture's `everything` mode over stdio, as the conformance runs through the gateway rely
//! on it: the suite's tools, resources and prompts are listed, a prompt renders its arguments,
//! and a subscription to the watched resource brings `notifications/resources/updated`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, ClientConfig, GetPromptRequestParams, ReadResourceRequestParams,
    ResourceUpdatedNotificationParam, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::json;

use crate::support::{FIXTURE, eventually, fixture_http};

/// How long to listen for a notification that must not come. Had the fixture sent one, it
/// would have come down the same stdio pipe before the answer to the call that caused it (and
/// before the read after it), leaving only the client's handler task to run: a few
/// milliseconds, where this allows a hundred.
const UNSENT_NOTIFICATION: Duration = Duration::from_millis(100);

/// The tools the suite's server scenarios call (0.1.16).
const SUITE_TOOLS: &[&str] = &[
    "test_simple_text",
    "test_image_content",
    "test_audio_content",
    "test_embedded_resource",
    "test_multiple_content_types",
    "test_tool_with_logging",
    "test_tool_with_progress",
    "test_error_handling",
    "test_sampling",
    "test_elicitation",
    "test_elicitation_sep1034_defaults",
    "test_elicitation_sep1330_enums",
    "json_schema_2020_12_tool",
    "test_reconnection",
];

/// Records the URIs of `notifications/resources/updated`.
#[derive(Clone, Default)]
struct Updates(Arc<Mutex<Vec<String>>>);

impl ClientHandler for Updates {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(params.uri);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

async fn everything_stdio(updates: Updates) -> RunningService<RoleClient, Updates> {
    let mut cmd = tokio::process::Command::new(FIXTURE);
    cmd.args(["everything", "stdio"]);
    updates.serve(TokioChildProcess::new(cmd).unwrap()).await.expect("fixture starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_lists_the_suites_tools_resources_and_prompts() {
    let client = everything_stdio(Updates::default()).await;

    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for tool in SUITE_TOOLS {
        assert!(names.contains(tool), "{tool} missing from {names:?}");
    }
    let schema = &tools.iter().find(|t| t.name == "json_schema_2020_12_tool").unwrap().input_schema;
    assert_eq!(schema["$schema"], json!("https://json-schema.org/draft/2020-12/schema"));
    assert_eq!(schema["additionalProperties"], json!(false));
    assert!(schema["$defs"]["address"].is_object());

    let resources = client.list_all_resources().await.unwrap();
    assert!(resources.iter().any(|r| r.uri == "test://static-text"), "{resources:?}");
    let templates = client.list_all_resource_templates().await.unwrap();
    assert!(templates.iter().any(|t| t.uri_template == "test://template/{id}/data"), "{templates:?}");
    let read = client.read_resource(ReadResourceRequestParams::new("test://template/42/data")).await.unwrap();
    let body = serde_json::to_value(&read.contents[0]).unwrap();
    assert!(body["text"].as_str().unwrap().contains("\"id\":\"42\""), "{body}");

    let prompts = client.list_all_prompts().await.unwrap();
    assert!(prompts.iter().any(|p| p.name == "test_simple_prompt"), "{prompts:?}");
    let arguments = json!({"arg1": "first-value", "arg2": "second-value"});
    let prompt = client
        .get_prompt(
            GetPromptRequestParams::new("test_prompt_with_arguments")
                .with_arguments(arguments.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let rendered = serde_json::to_string(&prompt.messages).unwrap();
    assert!(rendered.contains("arg1='first-value'") && rendered.contains("arg2='second-value'"), "{rendered}");

    client.cancel().await.unwrap();
}

#[allow(deprecated)] // resources/subscribe is legacy in rmcp, and what the suite and gateway speak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_notifies_a_subscriber_of_the_watched_resource() {
    let updates = Updates::default();
    let client = everything_stdio(updates.clone()).await;
    let update = || client.call_tool(CallToolRequestParams::new("update_watched_resource"));

    // Not subscribed: the change is silent.
    update().await.unwrap();
    client.subscribe(SubscribeRequestParams::new("test://watched-resource")).await.unwrap();
    update().await.unwrap();
    eventually("no notifications/resources/updated", || async { !updates.0.lock().unwrap().is_empty() }).await;
    client.unsubscribe(UnsubscribeRequestParams::new("test://watched-resource")).await.unwrap();
    update().await.unwrap();
    let read = client.read_resource(ReadResourceRequestParams::new("test://watched-resource")).await.unwrap();
    let body = serde_json::to_value(&read.contents[0]).unwrap();
    assert!(body["text"].as_str().unwrap().contains("version 3"), "{body}");
    // Time for a notification after the unsubscription to arrive, had one been sent.
    tokio::time::sleep(UNSENT_NOTIFICATION).await;
    assert_eq!(*updates.0.lock().unwrap(), ["test://watched-resource"]);
    client.cancel().await.unwrap();
}

/// `test_reconnection` over HTTP with rmcp's client, as the gateway calls it: the fixture
/// closes the call's SSE stream, the client resumes it with `Last-Event-ID` after the
/// announced retry, and the answer arrives on the resumed stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_http_answers_test_reconnection_on_the_resumed_stream() {
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    scopegate::http::install_tls_provider();
    let (_child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &[]).await;

    let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"));
    let client = ().serve(StreamableHttpClientTransport::with_client(reqwest::Client::new(), config)).await.unwrap();
    let started = Instant::now();
    let result =
        tokio::time::timeout(Duration::from_secs(8), client.call_tool(CallToolRequestParams::new("test_reconnection")))
            .await
            .expect("answered before the fixture's own resume deadline")
            .unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let text: String = result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect();
    assert!(text.contains("the client resumed it"), "{text} after {:?}", started.elapsed());
    client.cancel().await.ok();
}
