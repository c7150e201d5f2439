//! One HTTP exchange over the agent's own network for the gateway (an OAuth request for a
//! server only this machine reaches): the request rebuilt from the Open, sent with the agent's
//! clients (its `--ca-file` trust, no cookies; `wire::exchange` has the rules), answered
//! once the response head is in, then the head and the body streamed under `max_bytes`. It
//! never sends the gateway more body than that, and its reasons name the URL without its query,
//! never a header or the body.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::file::CHUNK;
use super::io::MessageSink;
use crate::tunnel::{FetchHead, Refusal, header_from_wire, header_to_wire};
use crate::wire::exchange::{Exchange, ExchangeClients};

/// What an `Open::Fetch` asks for, as it came.
pub struct FetchRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub follow_redirects: bool,
    pub timeout_ms: u64,
    pub max_bytes: u64,
}

/// An exchange whose response head has arrived, ready to be streamed.
pub struct FetchServer {
    exchange: Exchange,
}

impl FetchServer {
    /// Sends the request and waits for the response head. The reason of an `Err` carries its
    /// [`Refusal`] class.
    pub(super) async fn start(clients: &ExchangeClients, asked: FetchRequest) -> Result<Self, String> {
        let request = http_request(&asked).map_err(|reason| Refusal::Invalid.tag(&reason))?;
        let timeout = Duration::from_millis(asked.timeout_ms);
        let exchange =
            clients.send(request, asked.follow_redirects, timeout, asked.max_bytes).await.map_err(|e| e.to_reason())?;
        Ok(Self { exchange })
    }

    pub(super) async fn run(self, sink: impl MessageSink, stop: CancellationToken) {
        super::io::stream_until_stopped(sink, stop, async |sink| self.stream(sink).await).await;
    }

    /// Sends the head, then the body; the close reason (empty when all of it was sent).
    async fn stream(self, sink: &impl MessageSink) -> String {
        let Self { mut exchange } = self;
        let head = FetchHead {
            status: exchange.status().as_u16(),
            headers: exchange
                .headers()
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), header_to_wire(value.as_bytes())))
                .collect(),
        };
        let head = match serde_json::to_vec(&head) {
            Ok(head) => head,
            Err(e) => return format!("encoding the response head: {e}"),
        };
        if let Err(e) = sink.send(Bytes::from(head)).await {
            return Refusal::TooLarge.tag(&format!("{}: sending the response head: {e}", exchange.url()));
        }
        loop {
            // The exchange returns no piece that would take the body past `max_bytes`.
            let mut chunk = match exchange.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return String::new(),
                Err(e) => return e.to_reason(),
            };
            while !chunk.is_empty() {
                let piece = chunk.split_to(chunk.len().min(CHUNK));
                if let Err(e) = sink.send(piece).await {
                    return format!("sending the response of {}: {e}", exchange.url());
                }
            }
        }
    }
}

/// The request an Open asks for; `Err` says what is wrong with it, naming no value (a header
/// or the URL's query may hold a token).
pub fn http_request(asked: &FetchRequest) -> Result<http::Request<Vec<u8>>, String> {
    let method = http::Method::from_bytes(asked.method.as_bytes()).map_err(|_| "not an HTTP method".to_owned())?;
    let uri = http::Uri::try_from(asked.url.as_str()).map_err(|_| "the url is not a URL".to_owned())?;
    let body = STANDARD.decode(&asked.body).map_err(|_| "the body is not base64".to_owned())?;
    let mut request = http::Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    for (name, value) in &asked.headers {
        let bad = || format!("header {name:?} is not a valid header");
        let name = http::HeaderName::try_from(name.as_str()).map_err(|_| bad())?;
        let value = header_from_wire(value).and_then(|b| http::HeaderValue::from_bytes(&b).ok()).ok_or_else(bad)?;
        request.headers_mut().append(name, value);
    }
    crate::wire::exchange::check(&request).map_err(|e| e.to_string())?;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(url: &str) -> FetchRequest {
        FetchRequest {
            method: "GET".into(),
            url: url.into(),
            headers: vec![("authorization".into(), "Bearer SECRET".into())],
            body: String::new(),
            follow_redirects: true,
            timeout_ms: 5000,
            max_bytes: 1024,
        }
    }

    /// Whatever the gateway asks, the agent speaks only HTTP: a file, another scheme or a
    /// relative URL is refused as invalid before anything is sent.
    #[tokio::test]
    async fn the_agent_refuses_a_url_that_is_not_http() {
        let clients = ExchangeClients::new(None).unwrap();
        for url in [
            "file:///etc/passwd",
            "file://localhost/etc/passwd",
            "ftp://a.example/x",
            "gopher://a.example/",
            "/etc/passwd",
            "not a url",
        ] {
            let Err(reason) = FetchServer::start(&clients, asked(url)).await else { panic!("{url} was fetched") };
            assert_eq!(Refusal::split(&reason).0, Some(Refusal::Invalid), "{url}: {reason}");
            assert!(!reason.contains("SECRET"), "{reason}");
        }
    }

    #[test]
    fn a_bad_request_is_refused_without_its_values() {
        let mut bad = asked("https://a.example/t?code=SECRET");
        bad.headers.push(("x-token".into(), "SECRET\u{100}".into()));
        let err = http_request(&bad).unwrap_err();
        assert!(err.contains("x-token") && !err.contains("SECRET"), "{err}");
        let mut bad = asked("https://a.example/t");
        bad.body = "SECRET!!".into();
        assert!(!http_request(&bad).unwrap_err().contains("SECRET"));
        let mut big = asked("https://a.example/t?code=SECRET");
        big.body = STANDARD.encode(vec![0u8; crate::tunnel::FETCH_MAX_BODY + 1]);
        let err = http_request(&big).unwrap_err();
        assert!(err.contains("over the limit") && !err.contains("SECRET"), "{err}");
        let good = http_request(&asked("https://a.example/t?code=1")).unwrap();
        assert_eq!(good.headers()["authorization"], "Bearer SECRET");
    }
}
