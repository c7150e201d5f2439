//! A real OAuth 2.1 / OpenID provider for the tests ([`Idp`]: tests/fixtures/npm/idp.mjs,
//! panva's oidc-provider) and real third-party MCP clients that run the whole OAuth flow
//! against the gateway ([`run_ts_client`], [`run_py_client`]: the official TypeScript and
//! Python SDKs). Every process is bound to 127.0.0.1 and killed when its handle is dropped.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use super::installs::{fixture_file, npm_tree, python};
use super::wait::patience;

/// How long the provider may take to report that it listens.
const START_WAIT: Duration = Duration::from_secs(30);
/// How long one client run (install excluded) may take, its whole OAuth flow included.
const CLIENT_WAIT: Duration = Duration::from_secs(60);

/// How the provider is started (`idp.mjs`'s flags); `None` keeps the script's default.
#[derive(Debug, Clone, Default)]
pub struct IdpOptions {
    /// Account id (`sub`) to the extra claims of its access and ID tokens.
    pub accounts: Value,
    /// Who logs in when the authorization request has no `login_hint` (else the first account).
    pub default_account: Option<String>,
    /// The scopes of every resource (default `mcp:read mcp:write`).
    pub scopes: Option<String>,
    /// Access token lifetime (default 600 s).
    pub ttl_secs: Option<u64>,
    /// `Cache-Control: max-age` of the JWKS (default 300 s).
    pub jwks_max_age_secs: Option<u64>,
    /// Clients registered up front (a JSON array of client metadata: `client_id`,
    /// `redirect_uris`, and `client_secret` for a confidential one), beside dynamic registration.
    pub clients: Option<Value>,
    /// A login page with a "Continue" button (`#continue`) instead of an immediate login.
    pub login_page: bool,
}

impl IdpOptions {
    /// The demo tenants' users, each with its tenant slug as `tid`, an `org` object and an
    /// `orgs` list, and its address as `email`; olivia logs in by default.
    pub fn demo() -> Self {
        let account = |sub: &str, tenant: &str| json!({"tid": tenant, "org": {"id": format!("org_{tenant}1")}, "orgs": [tenant], "email": sub});
        let accounts = json!({
            "olivia@acme.test": account("olivia@acme.test", "acme"),
            "wanda@acme.test": account("wanda@acme.test", "acme"),
            "gary@globex.test": account("gary@globex.test", "globex"),
        });
        Self { accounts, default_account: Some("olivia@acme.test".to_owned()), ..Self::default() }
    }
}

/// The provider as a child process (killed when dropped); its signing keys live in a state
/// file of its own, so [`Idp::start_again`] serves the same keys on the same port.
pub struct Idp {
    child: Option<Child>,
    port: u16,
    options: IdpOptions,
    state: tempfile::TempDir,
    jwks_uri: String,
    http: reqwest::Client,
    /// The provider's stderr so far, for failure messages.
    stderr: Arc<Mutex<String>>,
}

impl Idp {
    /// Installs the npm fixtures (once), starts the provider on a free port and reads its
    /// discovery document.
    pub async fn start(options: IdpOptions) -> Self {
        scopegate::http::install_tls_provider();
        let state = tempfile::tempdir().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (child, port) = spawn(&options, &state_file(&state), 0, &stderr).await;
        let mut idp = Self {
            child: Some(child),
            port,
            options,
            state,
            jwks_uri: String::new(),
            http: reqwest::Client::new(),
            stderr,
        };
        let discovery = idp.get("/.well-known/openid-configuration").await;
        assert_eq!(discovery["issuer"], json!(idp.issuer()), "the provider's issuer: {discovery}");
        idp.jwks_uri = discovery["jwks_uri"].as_str().expect("jwks_uri in the discovery document").to_owned();
        idp
    }

    /// `http://127.0.0.1:PORT`.
    pub fn issuer(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The JWKS URL its discovery document names.
    pub fn jwks_url(&self) -> String {
        self.jwks_uri.clone()
    }

    /// A new signing key (and kid) for every token from now on; the old keys stay published.
    pub async fn rotate(&self) -> String {
        kid_of(self.post("/test/rotate", json!({})).await)
    }

    /// Publishes only the current signing key from now on.
    pub async fn drop_old_keys(&self) {
        self.post("/test/drop-old", json!({})).await;
    }

    /// The kid that signs tokens now.
    pub async fn current_kid(&self) -> String {
        kid_of(self.get("/test/kid").await)
    }

    /// An access token minted directly (no client flow): `aud` = `resource`, the account's
    /// extra claims, `client_id` = `test-minter`; `scope` defaults to the resource's scopes.
    pub async fn mint(&self, sub: &str, resource: &str, scope: Option<&str>) -> String {
        let mut body = json!({"sub": sub, "resource": resource});
        if let Some(scope) = scope {
            body["scope"] = json!(scope);
        }
        let answer = self.post("/test/token", body).await;
        answer["access_token"].as_str().unwrap_or_else(|| panic!("no access_token in {answer}")).to_owned()
    }

    /// Kills the provider and waits until it is gone: its port refuses connections.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.expect("the provider is killed");
        }
    }

    /// Starts the provider again on its port, with its state file (the same keys).
    pub async fn start_again(&mut self) {
        self.stop().await;
        let (child, port) = spawn(&self.options, &state_file(&self.state), self.port, &self.stderr).await;
        assert_eq!(port, self.port, "restarted on its port");
        self.child = Some(child);
    }

    async fn get(&self, path: &str) -> Value {
        let response = self.http.get(format!("{}{path}", self.issuer())).send().await;
        self.json(path, response).await
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let response = self.http.post(format!("{}{path}", self.issuer())).json(&body).send().await;
        self.json(path, response).await
    }

    async fn json(&self, path: &str, response: reqwest::Result<reqwest::Response>) -> Value {
        let stderr = || self.stderr.lock().unwrap().clone();
        let response = response.unwrap_or_else(|e| panic!("provider {path}: {e}; stderr: {}", stderr()));
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "provider {path}: {status} {text}; stderr: {}", stderr());
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("provider {path}: {e}: {text}"))
    }
}

fn kid_of(answer: Value) -> String {
    answer["kid"].as_str().unwrap_or_else(|| panic!("no kid in {answer}")).to_owned()
}

fn state_file(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("idp-state.json")
}

/// Spawns `node idp.mjs` and waits for its `listening on 127.0.0.1:PORT` line.
async fn spawn(options: &IdpOptions, state: &std::path::Path, port: u16, stderr: &Arc<Mutex<String>>) -> (Child, u16) {
    let tree = npm_tree().await;
    let mut cmd = Command::new(&tree.node);
    cmd.arg(tree.script("idp.mjs")).arg("--state").arg(state).args(["--port", &port.to_string()]);
    cmd.args(["--accounts", &options.accounts.to_string()]);
    if let Some(account) = &options.default_account {
        cmd.args(["--default-account", account]);
    }
    if let Some(scopes) = &options.scopes {
        cmd.args(["--scopes", scopes]);
    }
    if let Some(ttl) = options.ttl_secs {
        cmd.args(["--ttl", &ttl.to_string()]);
    }
    if let Some(max_age) = options.jwks_max_age_secs {
        cmd.args(["--jwks-max-age", &max_age.to_string()]);
    }
    if options.login_page {
        cmd.args(["--login-page", "true"]);
    }
    if let Some(clients) = &options.clients {
        cmd.args(["--clients", &clients.to_string()]);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting the provider: {e}"));
    collect(child.stderr.take().unwrap(), Arc::clone(stderr));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(patience(START_WAIT), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(addr) = line.strip_prefix("listening on 127.0.0.1:") {
                return addr.trim().parse::<u16>().ok();
            }
        }
        None
    })
    .await;
    let Ok(Some(port)) = listening else {
        panic!("the provider did not report its port ({listening:?}); stderr: {}", stderr.lock().unwrap())
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, port)
}

/// Appends everything `pipe` says to `into`, until it closes.
fn collect(pipe: impl AsyncRead + Unpin + Send + 'static, into: Arc<Mutex<String>>) {
    tokio::spawn(async move {
        let mut pipe = pipe;
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut buf).await {
            into.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
}

/// What one client run printed (one JSON object a line) and how it ended.
#[derive(Debug)]
pub struct ClientRun {
    pub steps: Vec<Value>,
    pub status: ExitStatus,
    pub stderr: String,
}

impl ClientRun {
    /// The steps called `name`, in order.
    pub fn steps_named(&self, name: &str) -> Vec<&Value> {
        self.steps.iter().filter(|s| s["step"] == name).collect()
    }

    /// The first step called `name`.
    pub fn step(&self, name: &str) -> Option<&Value> {
        self.steps_named(name).into_iter().next()
    }

    /// The tool names of the first listing.
    pub fn tool_names(&self) -> Vec<String> {
        let listed = self.step("tools").map(|s| s["names"].clone()).unwrap_or_default();
        serde_json::from_value(listed).unwrap_or_default()
    }

    /// How many authorization URLs it opened.
    pub fn authorizations(&self) -> u64 {
        self.step("summary").and_then(|s| s["authorizations"].as_u64()).unwrap_or(0)
    }

    /// How many refresh grants it made.
    pub fn refreshes(&self) -> u64 {
        self.step("summary").and_then(|s| s["refreshes"].as_u64()).unwrap_or(0)
    }

    /// Panics with everything it said unless it exited 0.
    pub fn assert_success(&self, what: &str) {
        assert!(self.status.success(), "{what}: {}\nsteps: {:#?}\nstderr: {}", self.status, self.steps, self.stderr);
    }
}

/// The TypeScript SDK's client (`mcp_oauth_client.mjs`) against the MCP endpoint `url`.
pub async fn run_ts_client(url: &str, args: &[&str]) -> ClientRun {
    let tree = npm_tree().await;
    let mut cmd = Command::new(&tree.node);
    cmd.arg(tree.script("mcp_oauth_client.mjs")).arg(url).args(args);
    run_client(cmd).await
}

/// The Python SDK's client (`mcp_oauth_client.py`) against the MCP endpoint `url`.
pub async fn run_py_client(url: &str, args: &[&str]) -> ClientRun {
    let mut cmd = Command::new(python().await);
    cmd.arg(fixture_file("python/mcp_oauth_client.py")).arg(url).args(args);
    run_client(cmd).await
}

/// Runs a client to its end (killed past [`CLIENT_WAIT`]) and parses its steps.
async fn run_client(mut cmd: Command) -> ClientRun {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let out = tokio::time::timeout(patience(CLIENT_WAIT), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish in {CLIENT_WAIT:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let steps = stdout
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{what} printed {line:?}: {e}")))
        .collect();
    ClientRun { steps, status: out.status, stderr: String::from_utf8_lossy(&out.stderr).into_owned() }
}
