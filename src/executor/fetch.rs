//! One HTTP exchange over a remote executor's network, through its agent (an OAuth request
//! for a server only the executor reaches): a Fetch channel on the agent's tunnel, the
//! response collected under the caller's limit and deadline, every outcome a [`FetchError`].
//! Never dials anything from the gateway's own network.
//!
//! The agent performs the exchange on its own terms (see `wire::exchange`: the same rules
//! the local executor follows); the gateway checks too, without trusting it: the request is
//! checked before it is sent, and more than `max_bytes` of body received ends the exchange
//! with an error rather than a longer buffer. Requests may carry tokens and codes: errors and
//! logs name the URL without its query, never a header or a body.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::executor::agents::Agents;
use crate::telemetry::metrics;
use crate::tunnel::{FetchHead, Open, Refusal, TunnelError, TunnelHandle, header_from_wire, header_to_wire};
use crate::wire::exchange::{FetchError, check, redacted};

impl Agents {
    /// Performs `request` (an absolute `http:` or `https:` URL, a body of at most
    /// `tunnel::FETCH_MAX_BODY` bytes) over `executor`'s network, through its connected agent:
    /// redirects followed by the agent (at most `tunnel::FETCH_MAX_REDIRECTS`) when
    /// `follow_redirects`, returned as they came otherwise; at most `max_bytes` of response
    /// body; all of it within `timeout` (the open included).
    pub async fn fetch(
        &self,
        executor: &str,
        request: http::Request<Vec<u8>>,
        follow_redirects: bool,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<http::Response<Vec<u8>>, FetchError> {
        let started = tokio::time::Instant::now();
        let url = redacted(request.uri());
        let method = request.method().clone();
        let result = match self.reach(executor).await {
            None => Err(FetchError::NotConnected(executor.to_owned())),
            Some(link) => {
                let answer = exchange(link.tunnel(), request, follow_redirects, timeout, max_bytes).await;
                link.counted();
                answer
            }
        };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(response) => {
                metrics::executor_fetch("ok");
                let status = response.status().as_u16();
                let bytes = response.body().len();
                tracing::debug!(executor, %method, url, status, bytes, elapsed_ms, "an HTTP exchange through the executor");
            }
            Err(e) => {
                let outcome = e.outcome();
                metrics::executor_fetch(outcome);
                match e {
                    FetchError::OverLimit { .. } | FetchError::Failed(_) | FetchError::Disconnected(_) => {
                        tracing::warn!(executor, %method, url, outcome, elapsed_ms, error = %e, "an HTTP exchange through the executor failed")
                    }
                    _ => {
                        tracing::info!(executor, %method, url, outcome, elapsed_ms, error = %e, "an HTTP exchange through the executor did not complete")
                    }
                }
            }
        }
        result
    }
}

/// The Open of `request`, once it passes the checks every exchange must.
fn open_for(
    request: &http::Request<Vec<u8>>,
    follow_redirects: bool,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Open, FetchError> {
    check(request)?;
    Ok(Open::Fetch {
        method: request.method().as_str().to_owned(),
        url: request.uri().to_string(),
        headers: request
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), header_to_wire(value.as_bytes())))
            .collect(),
        body: STANDARD.encode(request.body()),
        follow_redirects,
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        max_bytes: max_bytes as u64,
    })
}

/// One exchange over `tunnel`: opens the channel (the agent answers once the response head
/// has arrived), reads the head, collects the body (reading is what grants the agent more
/// credit) until the agent closes the channel, and maps how it ended.
async fn exchange(
    tunnel: &TunnelHandle,
    request: http::Request<Vec<u8>>,
    follow_redirects: bool,
    timeout: Duration,
    max_bytes: usize,
) -> Result<http::Response<Vec<u8>>, FetchError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let url = redacted(request.uri());
    let open = open_for(&request, follow_redirects, timeout, max_bytes)?;
    drop(request);
    let timed_out = || FetchError::Timeout { url: url.clone(), timeout };
    let channel = tunnel.open(&open, timeout).await.map_err(|e| match e {
        TunnelError::Refused(reason) => classified(&reason, &url, timeout, FetchError::Refused),
        TunnelError::Closed(reason) => FetchError::Disconnected(reason),
        TunnelError::Timeout(_) => timed_out(),
        TunnelError::TooLarge { .. } => FetchError::Invalid(format!("{url}: the request is too large for the tunnel")),
    })?;
    let (tx, mut rx) = channel.split();
    let mut head: Option<http::response::Builder> = None;
    let mut body = Vec::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) => {
                tx.close("the gateway stopped waiting for the response");
                return Err(timed_out());
            }
        };
        if head.is_none() {
            match response_head(&frame) {
                Ok(builder) => head = Some(builder),
                Err(problem) => {
                    tx.close("the response head is not understood");
                    return Err(FetchError::Failed(format!("{url}: {problem}")));
                }
            }
            continue;
        }
        // Checked before the chunk is kept: the buffer never holds more than `max_bytes`.
        if body.len().saturating_add(frame.len()) > max_bytes {
            tx.close(&format!("the response is over the gateway's limit of {max_bytes} bytes"));
            return Err(FetchError::OverLimit { max_bytes });
        }
        body.extend_from_slice(&frame);
    }
    // The reason is set before the end is seen; its absence would be a broken tunnel, and an
    // exchange is complete only when the agent says so.
    let Some(reason) = rx.close_reason() else {
        return Err(FetchError::Disconnected("the channel ended without a reason".to_owned()));
    };
    if !reason.is_empty() {
        // A tunnel's own end never carries a class: a classified reason is the agent's.
        if Refusal::split(&reason).0.is_none() && tunnel.is_closed() {
            return Err(FetchError::Disconnected(reason));
        }
        return Err(classified(&reason, &url, timeout, FetchError::Failed));
    }
    let head = head.ok_or_else(|| FetchError::Failed(format!("{url}: the channel ended before the response head")))?;
    head.body(body).map_err(|e| FetchError::Failed(format!("{url}: {e}")))
}

/// The response builder for a head frame, or what is wrong with it.
fn response_head(frame: &[u8]) -> Result<http::response::Builder, String> {
    let head: FetchHead =
        serde_json::from_slice(frame).map_err(|e| format!("the executor's response head is not one: {e}"))?;
    let status = http::StatusCode::from_u16(head.status)
        .map_err(|_| format!("the executor's response head has status {}", head.status))?;
    let mut builder = http::Response::builder().status(status);
    for (name, value) in &head.headers {
        let name = http::HeaderName::try_from(name.as_str())
            .map_err(|_| format!("the executor's response head has a bad header name {name:?}"))?;
        let value = header_from_wire(value)
            .and_then(|bytes| http::HeaderValue::from_bytes(&bytes).ok())
            .ok_or_else(|| format!("the executor's response head has a bad value for {name}"))?;
        builder = builder.header(name, value);
    }
    Ok(builder)
}

/// The error for an agent's reason, by its class; `otherwise` takes the reasons of no class
/// this API names.
fn classified(reason: &str, url: &str, timeout: Duration, otherwise: fn(String) -> FetchError) -> FetchError {
    let (class, text) = Refusal::split(reason);
    let text = text.to_owned();
    match class {
        Some(Refusal::Invalid) => FetchError::Invalid(text),
        Some(Refusal::Unreachable) => FetchError::Unreachable(text),
        Some(Refusal::TooLarge) => FetchError::TooLarge(text),
        Some(Refusal::TimedOut) => FetchError::Timeout { url: url.to_owned(), timeout },
        Some(Refusal::OutsideRoot | Refusal::NotFound | Refusal::NotAFile | Refusal::Unreadable) | None => {
            otherwise(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::executor::file::tests::{WAIT, pair, within};
    use crate::tunnel::FETCH_MAX_BODY;

    fn get(url: &str) -> http::Request<Vec<u8>> {
        http::Request::get(url).body(Vec::new()).unwrap()
    }

    fn head_frame(status: u16, headers: &[(&str, &str)]) -> Bytes {
        let head =
            FetchHead { status, headers: headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect() };
        Bytes::from(serde_json::to_vec(&head).unwrap())
    }

    #[tokio::test]
    async fn the_request_travels_whole_and_the_response_comes_back() {
        let mut pair = pair().await;
        let gateway = pair.gateway.clone();
        let request = http::Request::post("https://auth.example/token?x=1")
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-raw", http::HeaderValue::from_bytes(b"caf\xe9").unwrap())
            .header("accept", "a")
            .header("accept", "b")
            .body(b"grant_type=authorization_code&code=c0de".to_vec())
            .unwrap();
        let fetching = tokio::spawn(async move { exchange(&gateway, request, false, WAIT, 100).await });
        let pending = within("the request", pair.incoming.next()).await.unwrap();
        let Open::Fetch { method, url, headers, body, follow_redirects, timeout_ms, max_bytes } = pending.open.clone()
        else {
            panic!("not a Fetch: {:?}", pending.open)
        };
        assert_eq!((method.as_str(), url.as_str()), ("POST", "https://auth.example/token?x=1"));
        assert_eq!(headers[0], ("content-type".to_owned(), "application/x-www-form-urlencoded".to_owned()));
        assert_eq!(header_from_wire(&headers[1].1).unwrap(), b"caf\xe9");
        assert_eq!(&headers[2..], [("accept".to_owned(), "a".to_owned()), ("accept".to_owned(), "b".to_owned())]);
        assert_eq!(STANDARD.decode(body).unwrap(), b"grant_type=authorization_code&code=c0de");
        assert_eq!((follow_redirects, timeout_ms, max_bytes), (false, WAIT.as_millis() as u64, 100));
        let (tx, _rx) = pending.accept().split();
        tx.send(head_frame(
            302,
            &[("location", "https://x.example/cb?code=1"), ("set-cookie", "a=1"), ("set-cookie", "b=2")],
        ))
        .await
        .unwrap();
        tx.send(Bytes::from_static(b"moved")).await.unwrap();
        tx.close("");
        let response = within("the response", fetching).await.unwrap().unwrap();
        assert_eq!(response.status(), 302);
        assert_eq!(response.headers()["location"], "https://x.example/cb?code=1");
        assert_eq!(response.headers().get_all("set-cookie").iter().count(), 2);
        assert_eq!(response.body(), b"moved");
    }

    #[tokio::test]
    async fn every_refusal_class_becomes_its_own_error() {
        let mut pair = pair().await;
        let url = "http://10.1.2.3/x";
        let timeout = || FetchError::Timeout { url: url.to_owned(), timeout: WAIT };
        let rows: [(&str, FetchError); 6] = [
            ("[invalid] bad header", FetchError::Invalid("bad header".into())),
            (
                "[unreachable] http://10.1.2.3/x: could not connect",
                FetchError::Unreachable("http://10.1.2.3/x: could not connect".into()),
            ),
            ("[too_large] declares 9", FetchError::TooLarge("declares 9".into())),
            ("[timed_out] slow", timeout()),
            ("the open request is not understood", FetchError::Refused("the open request is not understood".into())),
            ("[not_found] x", FetchError::Refused("x".into())),
        ];
        for (reason, expected) in rows {
            let gateway = pair.gateway.clone();
            let fetching = tokio::spawn(async move { exchange(&gateway, get(url), true, WAIT, 10).await });
            within("the request", pair.incoming.next()).await.unwrap().refuse(reason);
            assert_eq!(within("the refusal", fetching).await.unwrap().unwrap_err(), expected, "{reason}");
        }
        // After the head: the class of the close.
        for (reason, expected) in [
            ("[too_large] grew", FetchError::TooLarge("grew".into())),
            ("[unreachable] broke off", FetchError::Unreachable("broke off".into())),
            ("the executor is stopping", FetchError::Failed("the executor is stopping".into())),
        ] {
            let gateway = pair.gateway.clone();
            let fetching = tokio::spawn(async move { exchange(&gateway, get(url), true, WAIT, 10).await });
            let (tx, _rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
            tx.send(head_frame(200, &[])).await.unwrap();
            tx.send(Bytes::from_static(b"part")).await.unwrap();
            tx.close(reason);
            assert_eq!(within("the end", fetching).await.unwrap().unwrap_err(), expected, "{reason}");
        }
        assert_eq!(pair.gateway.channels_open(), 0);
    }

    /// The gateway does not trust the agent's bound: more body than `max_bytes` ends the
    /// exchange, and the agent's channel is closed (it can't keep sending).
    #[tokio::test]
    async fn an_agent_sending_past_the_limit_is_stopped() {
        let mut pair = pair().await;
        let gateway = pair.gateway.clone();
        let fetching = tokio::spawn(async move { exchange(&gateway, get("http://a.example/"), true, WAIT, 10).await });
        let (tx, mut rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
        tx.send(head_frame(200, &[])).await.unwrap();
        let flood = tokio::spawn(async move {
            let mut sent = 0u64;
            while tx.send(Bytes::from_static(b"12345678")).await.is_ok() {
                sent += 8;
            }
            sent
        });
        assert_eq!(
            within("the exchange", fetching).await.unwrap().unwrap_err(),
            FetchError::OverLimit { max_bytes: 10 }
        );
        let sent = within("the agent is stopped", flood).await.unwrap();
        assert!(sent <= 8 * 8, "the agent could send {sent} bytes after the limit");
        assert_eq!(within("the close", rx.recv()).await, None);
        assert!(rx.close_reason().unwrap().contains("limit of 10 bytes"));
    }

    #[tokio::test]
    async fn a_bad_head_a_silent_agent_and_a_bad_request_fail_typed() {
        let mut pair = pair().await;
        for head in [
            &b"not json"[..],
            br#"{"status": 99, "headers": []}"#,
            br#"{"status": 200, "headers": [["bad name", "x"]]}"#,
        ] {
            let gateway = pair.gateway.clone();
            let fetching =
                tokio::spawn(async move { exchange(&gateway, get("http://a.example/"), true, WAIT, 10).await });
            let (tx, _rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
            tx.send(Bytes::copy_from_slice(head)).await.unwrap();
            let err = within("the exchange", fetching).await.unwrap().unwrap_err();
            assert_eq!(err.outcome(), "failed", "{err:?}");
        }
        let short = Duration::from_millis(200);
        let gateway = pair.gateway.clone();
        let fetching =
            tokio::spawn(
                async move { exchange(&gateway, get("http://a.example/p?code=SECRET"), true, short, 10).await },
            );
        let (tx, mut rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
        tx.send(head_frame(200, &[])).await.unwrap();
        let err = within("the exchange", fetching).await.unwrap().unwrap_err();
        assert_eq!(err, FetchError::Timeout { url: "http://a.example/p".into(), timeout: short });
        assert!(!err.to_string().contains("SECRET"), "{err}");
        assert_eq!(within("the close", rx.recv()).await, None);

        // Checked before asking: nothing reaches the agent.
        let big = http::Request::post("http://a.example/").body(vec![0; FETCH_MAX_BODY + 1]).unwrap();
        for request in [get("file://localhost/etc/passwd"), get("/relative"), big] {
            let err = exchange(&pair.gateway, request, true, WAIT, 10).await.unwrap_err();
            assert_eq!(err.outcome(), "invalid", "{err:?}");
        }
        let nothing = tokio::time::timeout(Duration::from_millis(100), pair.incoming.next()).await;
        assert!(nothing.is_err(), "an invalid request reached the agent");
    }

    #[tokio::test]
    async fn an_executor_without_an_agent_is_refused_at_once() {
        let agents = Agents::new();
        let started = tokio::time::Instant::now();
        let err = agents.fetch("build-01", get("http://a.example/"), true, WAIT, 10).await.unwrap_err();
        assert_eq!(err, FetchError::NotConnected("build-01".into()));
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
