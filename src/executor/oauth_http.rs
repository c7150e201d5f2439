//! The OAuth HTTP client of an executor: every request rmcp's OAuth makes for a server (its
//! discovery, registration, token and refresh requests) goes over the network of the executor
//! the server is bound to, as the server's own traffic does. The local executor's are sent
//! from the gateway host, with the same extra CA trust as its upstream client; a remote
//! executor's go through its agent ([`Agents::fetch`]), so an authorization server only that
//! machine reaches is reached, and the gateway's own network is never tried instead.
//!
//! Both honour the request's redirect policy (at most `tunnel::FETCH_MAX_REDIRECTS` when
//! following), its timeout ([`DEFAULT_TIMEOUT`] when it has none) and a body limit of
//! [`MAX_RESPONSE_BYTES`], as rmcp's own reqwest client does. Errors name the URL without its
//! query and the class of the failure, never a header or a body: those carry codes, secrets
//! and tokens.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::auth::{OAuthHttpClient, OAuthHttpClientFuture, OAuthHttpRedirectPolicy, OAuthHttpRequest};

use crate::executor::remote::{Agents, FetchError};
use crate::wire::exchange::ExchangeClients;

/// The most response body an OAuth exchange may return (rmcp's own limit).
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// The timeout of an OAuth request that names none (rmcp's own default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where an executor's OAuth HTTP requests go out.
pub enum ExecutorHttp {
    /// The gateway host's own network.
    Local { clients: ExchangeClients },
    /// The network of remote executor `executor`, through its connected agent.
    Remote { agents: Arc<Agents>, executor: String },
}

impl ExecutorHttp {
    /// The gateway host's own network; `ca_file`'s certificates trusted besides the platform's
    /// roots. The error says what is wrong with the file.
    pub fn local(ca_file: Option<&Path>) -> Result<Self, String> {
        Ok(Self::Local { clients: ExchangeClients::new(ca_file)? })
    }

    /// Performs one exchange: redirects followed (at most `tunnel::FETCH_MAX_REDIRECTS`) when
    /// `follow_redirects`, returned as they came otherwise; at most [`MAX_RESPONSE_BYTES`] of
    /// body; all of it within `timeout`.
    pub async fn exchange(
        &self,
        request: http::Request<Vec<u8>>,
        follow_redirects: bool,
        timeout: Duration,
    ) -> Result<http::Response<Vec<u8>>, FetchError> {
        match self {
            Self::Local { clients } => {
                clients.send(request, follow_redirects, timeout, MAX_RESPONSE_BYTES as u64).await?.collect().await
            }
            Self::Remote { agents, executor } => {
                agents.fetch(executor, request, follow_redirects, timeout, MAX_RESPONSE_BYTES).await
            }
        }
    }
}

/// Whether a redirect policy follows redirects: only `Follow` does (a policy rmcp adds later
/// stops, the safer reading).
pub fn follows(policy: OAuthHttpRedirectPolicy) -> bool {
    matches!(policy, OAuthHttpRedirectPolicy::Follow)
}

impl OAuthHttpClient for ExecutorHttp {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        let OAuthHttpRequest { request, redirect_policy, timeout, .. } = request;
        Box::pin(async move {
            self.exchange(request, follows(redirect_policy), timeout.unwrap_or(DEFAULT_TIMEOUT))
                .await
                .map_err(|e| Box::new(e) as rmcp::transport::auth::OAuthHttpClientError)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rmcp's `Stop` (discovery, token requests) must never be followed; only `Follow` is.
    #[test]
    fn only_follow_follows() {
        assert!(follows(OAuthHttpRedirectPolicy::Follow));
        assert!(!follows(OAuthHttpRedirectPolicy::Stop));
        assert!(follows(OAuthHttpRedirectPolicy::default()), "rmcp's default is to follow");
    }

    /// Both kinds plug into rmcp as its OAuth HTTP client.
    #[test]
    fn an_executor_http_is_an_oauth_http_client() {
        let local: Arc<dyn OAuthHttpClient> = Arc::new(ExecutorHttp::local(None).unwrap());
        let remote: Arc<dyn OAuthHttpClient> =
            Arc::new(ExecutorHttp::Remote { agents: Agents::new(), executor: "build-01".into() });
        drop((local, remote));
    }

    /// The local executor's client is the gateway host's, and it keeps the upstream CA file:
    /// a bad one fails the executor as it fails its upstream client.
    #[test]
    fn the_local_executor_hands_out_the_hosts_client() {
        use crate::decl::ExecutorId;
        use crate::decl::PathStyle;
        use crate::decl::PathUri;
        use crate::executor::{Executor, LocalExecutor, UpstreamError};
        let root = PathUri::parse("file:///srv/plugins", PathStyle::Posix).unwrap();
        let header = http::HeaderName::from_static("x-scopegate-identity");
        let host = Arc::new(LocalExecutor::new(root.clone(), Vec::new(), header.clone(), "").unwrap());
        let executor = Executor::Local { id: ExecutorId::new("local"), host: Arc::clone(&host) };
        assert!(matches!(*executor.oauth_http(), ExecutorHttp::Local { .. }));
        assert!(Arc::ptr_eq(&executor.oauth_http(), &host.oauth_http()), "one client per host");
        let missing = LocalExecutor::new(root, Vec::new(), header, "/nonexistent/ca.pem");
        assert!(matches!(missing, Err(UpstreamError::Config { key: "upstream.ca_file", .. })));
    }
}
