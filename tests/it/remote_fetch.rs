//! HTTP exchanges over an executor's network (the path OAuth requests for its servers take):
//! through a real `scopegate executor` agent inside a network namespace, to a web server only
//! that namespace reaches, and from the gateway host itself for the local executor. Both keep
//! the same rules: the request's redirect policy (at most 10 followed), a 1 MiB response
//! limit, the timeout, typed failures that name no secret.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::response::IntoResponse;
use bytes::Bytes;
use scopegate::executor::oauth_http::{ExecutorHttp, MAX_RESPONSE_BYTES};
use scopegate::wire::exchange::FetchError;
use serde_json::{Value, json};

use crate::support::{Backend, Netns, Site};

/// Set (to the address to listen on) when this binary runs as the namespace's web server.
const SERVE: &str = "SCOPEGATE_TEST_FETCH_WEB_SERVER";
const WAIT: Duration = Duration::from_secs(10);
/// What the requests carry that must never show in an error.
const SECRET: &str = "S3CRET-c0de";

/// The web server of these tests: `/echo` answers with what it was sent, `/redirect/{n}`
/// redirects `n` times (relatively) before answering, `/big/{n}` sends `n` bytes with their
/// length, `/stream/{n}` without it, `/slow` never answers.
fn web() -> axum::Router {
    use axum::routing::{any, get};
    async fn echo(method: http::Method, uri: http::Uri, headers: http::HeaderMap, body: Bytes) -> axum::Json<Value> {
        let mut seen = serde_json::Map::new();
        for (name, value) in &headers {
            let values = seen.entry(name.as_str()).or_insert_with(|| json!([]));
            values.as_array_mut().unwrap().push(json!(String::from_utf8_lossy(value.as_bytes())));
        }
        axum::Json(json!({
            "method": method.as_str(),
            "uri": uri.to_string(),
            "headers": seen,
            "body": String::from_utf8_lossy(&body),
        }))
    }
    async fn redirect(Path(n): Path<u32>) -> axum::response::Response {
        if n == 0 {
            return "arrived".into_response();
        }
        (http::StatusCode::FOUND, [("location", format!("/redirect/{}?code={SECRET}", n - 1))]).into_response()
    }
    async fn big(Path(n): Path<usize>) -> Vec<u8> {
        vec![b'b'; n]
    }
    async fn stream(Path(n): Path<usize>) -> axum::body::Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            (0..n).step_by(4096).map(|start| Ok(Bytes::from(vec![b's'; 4096.min(n - start)]))).collect();
        axum::body::Body::from_stream(futures_util::stream::iter(chunks))
    }
    async fn slow() -> &'static str {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        "late"
    }
    axum::Router::new()
        .route("/echo", any(echo))
        .route("/redirect/{n}", get(redirect))
        .route("/big/{n}", get(big))
        .route("/stream/{n}", get(stream))
        .route("/slow", get(slow))
}

/// Not a test of its own: the web server of these tests when this binary is re-run inside a
/// network namespace with [`SERVE`] set (see [`web_in`]); without it, it does nothing.
#[test]
#[ignore = "the web server the fetch tests run inside a network namespace"]
fn web_server_for_a_namespace() {
    let Ok(addr) = std::env::var(SERVE) else { return };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
        println!("listening on {}", listener.local_addr().unwrap());
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        axum::serve(listener, web()).await.unwrap();
    });
}

/// [`web`] on the loopback of `netns` (only what runs in the namespace reaches it): the
/// process (killed when dropped) and its address.
async fn web_in(netns: &Netns) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut server = tokio::process::Command::new("ip")
        .args(["netns", "exec", &netns.name])
        .arg(std::env::current_exe().unwrap())
        .args(["remote_fetch::web_server_for_a_namespace", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(SERVE, "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // The test harness may have written `test NAME ... ` on the same line.
            if let Some((_, addr)) = line.split_once("listening on ") {
                return addr.trim().to_owned();
            }
        }
        panic!("the namespace's web server ended before listening");
    })
    .await
    .expect("the namespace's web server listens");
    (server, addr)
}

/// [`web`] on this host's loopback.
async fn web_here() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, web()).await });
    addr
}

fn get(url: &str) -> http::Request<Vec<u8>> {
    http::Request::get(url).body(Vec::new()).unwrap()
}

/// An error: of `outcome`, and without the secret the request carried.
#[track_caller]
fn failed(result: Result<http::Response<Vec<u8>>, FetchError>, outcome: &str) -> FetchError {
    let err = match result {
        Ok(response) => panic!("{outcome}: answered {} with {} bytes", response.status(), response.body().len()),
        Err(err) => err,
    };
    assert_eq!(err.outcome(), outcome, "{err}");
    assert!(!err.to_string().contains(SECRET), "the error shows the secret: {err}");
    err
}

/// What every executor's HTTP client must do, against [`web`] at `addr` on its network.
async fn behaves(http: &ExecutorHttp, addr: &str) {
    let base = format!("http://{addr}");

    // A GET: the query and the headers arrive as sent.
    let request = http::Request::get(format!("{base}/echo?state=s1&x=%20y"))
        .header("accept", "application/json")
        .header("x-multi", "one")
        .header("x-multi", "two")
        .header("authorization", format!("Bearer {SECRET}"))
        .body(Vec::new())
        .unwrap();
    let response = http.exchange(request, true, WAIT).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let seen: Value = serde_json::from_slice(response.body()).unwrap();
    assert_eq!(seen["method"], "GET");
    assert_eq!(seen["uri"], "/echo?state=s1&x=%20y");
    assert_eq!(seen["headers"]["x-multi"], json!(["one", "two"]));
    assert_eq!(seen["headers"]["authorization"], json!([format!("Bearer {SECRET}")]));
    assert_eq!(seen["headers"]["cookie"], Value::Null, "no cookies");

    // A form POST, as a token request is: the body arrives byte for byte.
    let form = format!("grant_type=authorization_code&code={SECRET}&redirect_uri=http%3A%2F%2Flocalhost%2Fcb");
    let request = http::Request::post(format!("{base}/echo"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form.clone().into_bytes())
        .unwrap();
    let seen: Value = serde_json::from_slice(http.exchange(request, false, WAIT).await.unwrap().body()).unwrap();
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["body"], form);
    assert_eq!(seen["headers"]["content-type"], json!(["application/x-www-form-urlencoded"]));

    // Redirects: returned as they came when stopping, followed (ten at most) when following.
    let stopped = http.exchange(get(&format!("{base}/redirect/1")), false, WAIT).await.unwrap();
    assert_eq!(stopped.status(), 302);
    assert_eq!(stopped.headers()["location"], format!("/redirect/0?code={SECRET}"));
    let followed = http.exchange(get(&format!("{base}/redirect/1")), true, WAIT).await.unwrap();
    assert_eq!((followed.status().as_u16(), followed.body().as_slice()), (200, &b"arrived"[..]));
    let ten = http.exchange(get(&format!("{base}/redirect/10")), true, WAIT).await.unwrap();
    assert_eq!(ten.body(), b"arrived");
    let err = failed(http.exchange(get(&format!("{base}/redirect/11?code={SECRET}")), true, WAIT).await, "unreachable");
    assert!(err.to_string().contains("more than 10 redirects"), "{err}");

    // 1 MiB of body is the limit, declared or not.
    let exact = http.exchange(get(&format!("{base}/big/{MAX_RESPONSE_BYTES}")), true, WAIT).await.unwrap();
    assert_eq!(exact.body().len(), MAX_RESPONSE_BYTES);
    let streamed = http.exchange(get(&format!("{base}/stream/{MAX_RESPONSE_BYTES}")), true, WAIT).await.unwrap();
    assert_eq!(streamed.body().len(), MAX_RESPONSE_BYTES);
    for what in ["big", "stream"] {
        let url = format!("{base}/{what}/{}?code={SECRET}", MAX_RESPONSE_BYTES + 1);
        let err = failed(http.exchange(get(&url), true, WAIT).await, "too_large");
        assert!(err.to_string().contains("over the limit"), "{what}: {err}");
    }

    // Nothing listening: unreachable, at once. No answer: the timeout, not later.
    let started = Instant::now();
    let err =
        failed(http.exchange(get(&format!("http://127.0.0.1:1/token?code={SECRET}")), true, WAIT).await, "unreachable");
    assert!(err.to_string().contains("http://127.0.0.1:1/token"), "names the URL: {err}");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    let short = Duration::from_millis(300);
    let started = Instant::now();
    let err = failed(http.exchange(get(&format!("{base}/slow?code={SECRET}")), true, short).await, "timeout");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    assert_eq!(err, FetchError::Timeout { url: format!("{base}/slow"), timeout: short });

    // Checked before anything is sent.
    failed(http.exchange(get("file://localhost/etc/passwd"), true, WAIT).await, "invalid");
}

/// Through an agent in a network namespace, to a web server only that namespace reaches: the
/// gateway host can't connect to it, yet the exchanges work and behave as the local ones do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_fetch_goes_over_the_executors_network() {
    let netns = Netns::create();
    let site = Site::start(
        Backend::Sqlite,
        &[
            ("server.listen", json!(format!("{}:0", netns.host_ip))),
            ("server.allowed_hosts", json!([netns.host_ip])),
            ("auth.hs256_secret", json!("executor-netns-test-secret-0123456789abcdef")),
        ],
    )
    .await;
    let secret_file = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let (_web, addr) = web_in(&netns).await;
    let _agent = site.agent_in(Some(&netns.name), "build-01", &secret_file, &[site.live.base_url()]);
    site.wait_connected("build-01", true).await;

    let direct = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(&addr)).await;
    assert!(!matches!(direct, Ok(Ok(_))), "the gateway host reaches {addr} itself");
    let local = ExecutorHttp::local(None).unwrap();
    failed(local.exchange(get(&format!("http://{addr}/echo")), true, WAIT).await, "unreachable");

    let remote = ExecutorHttp::Remote { agents: Arc::clone(site.live.agents()), executor: "build-01".into() };
    behaves(&remote, &addr).await;
    assert_eq!(site.live.agents().link("build-01").unwrap().channels_open(), 0, "every exchange's channel closed");
    let metrics = site.live.metrics().await;
    for outcome in ["ok", "unreachable", "too_large", "timeout"] {
        let line = format!("scopegate_executor_fetches_total{{outcome=\"{outcome}\"}}");
        assert!(metrics.contains(&line), "{line}");
    }
}

/// An executor without a connected agent: refused at once, nothing tried from the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_fetch_without_an_agent_fails_at_once() {
    let site = Site::start(Backend::Sqlite, &[]).await;
    site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let addr = web_here().await;
    for name in ["build-01", "no-such-executor"] {
        let remote = ExecutorHttp::Remote { agents: Arc::clone(site.live.agents()), executor: name.into() };
        let started = Instant::now();
        let err = remote.exchange(get(&format!("http://{addr}/echo")), true, WAIT).await.unwrap_err();
        assert_eq!(err, FetchError::NotConnected(name.to_owned()));
        assert!(started.elapsed() < Duration::from_secs(1), "{name}");
    }
}

/// The local executor's client: the gateway host's network, the same rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_executor_http_keeps_the_same_rules() {
    let addr = web_here().await;
    behaves(&ExecutorHttp::local(None).unwrap(), &addr).await;
}
