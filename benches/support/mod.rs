//! What the bench binaries share.

use figment::Figment;
use figment::providers::{Format, Toml};
use rmcp::ServiceExt;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

/// An rmcp client of the Streamable HTTP endpoint at `url` (TCP_NODELAY), with `token` as its
/// bearer token when given.
pub async fn connect(url: &str, token: Option<&str>) -> RunningService<RoleClient, ()> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(token) = token {
        config = config.auth_header(token.to_owned());
    }
    let client = reqwest::Client::builder().tcp_nodelay(true).build().unwrap();
    ().serve(StreamableHttpClientTransport::with_client(client, config)).await.expect("client connects")
}

/// Serves `app` on a port of its own on loopback (TCP_NODELAY, like the gateway); returns the
/// URL of its `/mcp` endpoint.
pub async fn serve_on_loopback(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// `auth.identity_cache_ms` for a bench's gateway: IDENTITY_CACHE_MS, or the shipped default.
pub fn identity_cache_ms() -> u64 {
    std::env::var("IDENTITY_CACHE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        Figment::from(Toml::string(scopegate::config::DEFAULT_TOML))
            .extract_inner("auth.identity_cache_ms")
            .expect("the shipped default")
    })
}
