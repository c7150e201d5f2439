//! One bounded HTTP exchange over this host's own network: the gateway's for the local
//! executor's OAuth requests, the agent's for a Fetch channel. Both use this code, so the
//! rules are the same wherever an exchange runs: an absolute `http:` or `https:` URL, a request
//! body of at most [`FETCH_MAX_BODY`] bytes, at most [`FETCH_MAX_REDIRECTS`] redirects when
//! following them and none otherwise, the whole exchange within its timeout, at most
//! `max_bytes` of response body ever held, no cookies kept between exchanges.
//!
//! Requests may carry tokens and authorization codes, in headers, bodies and query strings:
//! an error names the URL without its query (see [`redacted`]) and the class of the failure,
//! never a header or a body.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::tunnel::{FETCH_MAX_BODY, FETCH_MAX_REDIRECTS};

/// The longest a connection may take to set up, whatever the exchange's own timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A URL as errors and logs may name it: scheme, host, port and path; no user information, no
/// query, no fragment.
pub fn redacted(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("");
    let host = uri.host().unwrap_or("");
    let port = uri.port().map(|p| format!(":{p}")).unwrap_or_default();
    format!("{scheme}://{host}{port}{}", uri.path())
}

/// Checks what every exchange needs before it is sent anywhere: an absolute `http:` or
/// `https:` URL and a body of at most [`FETCH_MAX_BODY`] bytes.
pub fn check(request: &http::Request<Vec<u8>>) -> Result<(), FetchError> {
    let uri = request.uri();
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none_or(str::is_empty) {
        let scheme = uri.scheme_str().unwrap_or("no scheme");
        return Err(FetchError::Invalid(format!("not an absolute http: or https: URL ({scheme})")));
    }
    if request.body().len() > FETCH_MAX_BODY {
        return Err(FetchError::Invalid(format!(
            "{}: a request body of {} bytes is over the limit of {FETCH_MAX_BODY}",
            redacted(uri),
            request.body().len()
        )));
    }
    Ok(())
}

/// The two clients of a host: one that follows redirects (at most [`FETCH_MAX_REDIRECTS`]),
/// one that returns them as they come. Neither keeps cookies.
#[derive(Clone)]
pub struct ExchangeClients {
    follow: reqwest::Client,
    stop: reqwest::Client,
}

impl ExchangeClients {
    /// `ca_file`: a PEM file of CA certificates trusted besides the platform's roots.
    pub fn new(ca_file: Option<&Path>) -> Result<Self, String> {
        crate::tls::install_provider();
        let build = |policy: reqwest::redirect::Policy| {
            let mut builder =
                reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true).redirect(policy);
            if let Some(path) = ca_file {
                builder = crate::tls::trust_ca_file(builder, path)?;
            }
            builder.build().map_err(|e| format!("building the HTTP client: {e}"))
        };
        Ok(Self {
            follow: build(reqwest::redirect::Policy::limited(FETCH_MAX_REDIRECTS))?,
            stop: build(reqwest::redirect::Policy::none())?,
        })
    }

    /// Sends `request` and waits for the response head; the exchange, body included, must
    /// end within `timeout`. A response declaring more than `max_bytes` is refused here.
    pub async fn send(
        &self,
        request: http::Request<Vec<u8>>,
        follow_redirects: bool,
        timeout: Duration,
        max_bytes: u64,
    ) -> Result<Exchange, FetchError> {
        let deadline = Instant::now() + timeout;
        check(&request)?;
        let url = redacted(request.uri());
        let request = reqwest::Request::try_from(request)
            .map_err(|_| FetchError::Invalid(format!("{url}: not a request this host can send")))?;
        let client = if follow_redirects { &self.follow } else { &self.stop };
        let response = match tokio::time::timeout_at(deadline, client.execute(request)).await {
            Err(_) => return Err(FetchError::Timeout { url, timeout }),
            Ok(Err(e)) => return Err(failure(&e, url, timeout)),
            Ok(Ok(response)) => response,
        };
        if let Some(declared) = response.content_length()
            && declared > max_bytes
        {
            return Err(FetchError::TooLarge(format!(
                "{url}: the response declares {declared} bytes, over the limit of {max_bytes}"
            )));
        }
        Ok(Exchange { response, url, max_bytes, received: 0, deadline, timeout })
    }
}

/// An exchange whose head has arrived: its body is read piece by piece, under its bound.
pub struct Exchange {
    response: reqwest::Response,
    url: String,
    max_bytes: u64,
    received: u64,
    deadline: Instant,
    timeout: Duration,
}

impl Exchange {
    pub fn status(&self) -> http::StatusCode {
        self.response.status()
    }

    pub fn headers(&self) -> &http::HeaderMap {
        self.response.headers()
    }

    /// The URL as errors name it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The next piece of the body; `None` at its end. More than `max_bytes` in all is an
    /// error, and the piece that went over is not returned.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, FetchError> {
        let next = match tokio::time::timeout_at(self.deadline, self.response.chunk()).await {
            Err(_) => return Err(FetchError::Timeout { url: self.url.clone(), timeout: self.timeout }),
            Ok(Err(e)) => return Err(failure(&e, self.url.clone(), self.timeout)),
            Ok(Ok(next)) => next,
        };
        let Some(chunk) = next else { return Ok(None) };
        self.received = self.received.saturating_add(chunk.len() as u64);
        if self.received > self.max_bytes {
            return Err(FetchError::TooLarge(format!(
                "{}: the response body is over the limit of {} bytes",
                self.url, self.max_bytes
            )));
        }
        Ok(Some(chunk))
    }

    /// The whole response, its body read to the end under the bound.
    pub async fn collect(mut self) -> Result<http::Response<Vec<u8>>, FetchError> {
        let mut body = Vec::new();
        while let Some(chunk) = self.chunk().await? {
            body.extend_from_slice(&chunk);
        }
        let mut response = http::Response::new(body);
        *response.status_mut() = self.response.status();
        *response.version_mut() = self.response.version();
        *response.headers_mut() = self.response.headers().clone();
        Ok(response)
    }
}

/// The error for a failed exchange: its class and a cause of a few words. The reqwest error
/// itself is not shown: it names the whole URL, query included.
fn failure(e: &reqwest::Error, url: String, timeout: Duration) -> FetchError {
    if e.is_timeout() {
        return FetchError::Timeout { url, timeout };
    }
    if e.is_redirect() {
        return FetchError::Unreachable(format!("{url}: more than {FETCH_MAX_REDIRECTS} redirects"));
    }
    if e.is_builder() {
        return FetchError::Invalid(format!("{url}: not a request this host can send"));
    }
    let what = if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the response broke off"
    } else {
        "the exchange failed"
    };
    match cause(e) {
        Some(cause) => FetchError::Unreachable(format!("{url}: {what} ({cause})")),
        None => FetchError::Unreachable(format!("{url}: {what}")),
    }
}

/// The innermost cause worth naming: a TLS error, or the kind of an I/O error.
fn cause(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut found = None;
    let mut next = Some(e);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            match io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
                Some(tls) => return Some(format!("TLS: {tls}")),
                None => found = Some(io.kind().to_string()),
            }
        }
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(format!("TLS: {tls}"));
        }
        next = error.source();
    }
    found
}

/// Why an HTTP exchange through an executor failed (the local executor's exchanges fail the
/// same ways, less those of the tunnel). Reasons name the URL without its query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No agent of the executor is connected to this gateway replica now.
    #[error("executor `{0}` is not connected to this gateway")]
    NotConnected(String),
    /// The request can't be sent as it is: not an absolute `http:` or `https:` URL, a body
    /// over the limit, a method or header the executor can't send.
    #[error("{0}")]
    Invalid(String),
    /// The exchange could not be completed over the executor's network: no route, refused,
    /// a TLS failure, a connection that broke, too many redirects.
    #[error("{0}")]
    Unreachable(String),
    /// The response body is over `max_bytes` (as declared, or as it arrived).
    #[error("{0}")]
    TooLarge(String),
    /// The whole response did not arrive within the timeout.
    #[error("{url}: no complete response within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    /// Any other refusal: the request is not understood (an older agent), the agent is too
    /// busy; its reason as given.
    #[error("the executor refused the exchange: {0}")]
    Refused(String),
    /// The agent sent more than `max_bytes` of body, which it had promised not to: the gateway
    /// ended the exchange and dropped what had arrived.
    #[error("the executor sent more than the limit of {max_bytes} bytes")]
    OverLimit { max_bytes: usize },
    /// The agent accepted the exchange, then ended it with an error or sent what is not a
    /// response head.
    #[error("the executor failed during the exchange: {0}")]
    Failed(String),
    /// The executor's connection ended before the whole response arrived.
    #[error("the executor's connection ended during the exchange: {0}")]
    Disconnected(String),
}

impl FetchError {
    /// The metric label and log field of this outcome.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::NotConnected(_) => "not_connected",
            Self::Invalid(_) => "invalid",
            Self::Unreachable(_) => "unreachable",
            Self::TooLarge(_) => "too_large",
            Self::Timeout { .. } => "timeout",
            Self::Refused(_) => "refused",
            Self::OverLimit { .. } => "over_limit",
            Self::Failed(_) => "failed",
            Self::Disconnected(_) => "disconnected",
        }
    }

    /// The Refused or Close reason an agent sends for this error: its class in front.
    pub fn to_reason(&self) -> String {
        let class = match self {
            Self::Invalid(_) => crate::tunnel::Refusal::Invalid,
            Self::TooLarge(_) => crate::tunnel::Refusal::TooLarge,
            Self::Timeout { .. } => crate::tunnel::Refusal::TimedOut,
            _ => crate::tunnel::Refusal::Unreachable,
        };
        class.tag(&self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(url: &str, body: usize) -> http::Request<Vec<u8>> {
        http::Request::post(url).body(vec![b'x'; body]).unwrap()
    }

    #[test]
    fn a_url_is_named_without_credentials_query_or_fragment() {
        let uri: http::Uri = "https://user:pw@auth.example:8443/token?code=SECRET#frag".parse().unwrap();
        assert_eq!(redacted(&uri), "https://auth.example:8443/token");
        let uri: http::Uri = "http://10.0.0.1/a/b?state=s".parse().unwrap();
        assert_eq!(redacted(&uri), "http://10.0.0.1/a/b");
    }

    #[test]
    fn only_absolute_http_urls_and_bounded_bodies_are_sent() {
        assert!(check(&request("https://a.example/t", FETCH_MAX_BODY)).is_ok());
        assert!(check(&request("http://127.0.0.1:9/t", 0)).is_ok());
        for url in ["file://localhost/etc/passwd", "ftp://a.example/x", "/relative/path", "unix://sock/x"] {
            let err = check(&request(url, 0)).unwrap_err();
            assert!(matches!(err, FetchError::Invalid(_)), "{url}: {err:?}");
        }
        let err = check(&request("https://a.example/t?code=SECRET", FETCH_MAX_BODY + 1)).unwrap_err();
        assert!(matches!(&err, FetchError::Invalid(r) if r.contains("over the limit")), "{err:?}");
        assert!(!err.to_string().contains("SECRET"), "{err}");
    }
}
