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

use super::exchange::ExchangeClients;
use super::remote::{Agents, FetchError};

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
