//! A real headless Chromium (Debian's `chromium` and `chromium-driver`), driven over the W3C
//! WebDriver protocol: JSON over HTTP to a `chromedriver` this process starts on a free
//! loopback port and stops when dropped. The few commands the console tests use are sent with
//! the reqwest client the tests already have.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    base: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session with a fresh profile.
    pub async fn start() -> Self {
        assert!(
            std::path::Path::new(CHROMEDRIVER).exists() && std::path::Path::new(CHROMIUM).exists(),
            "the console's browser tests need Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run installs them)"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
        tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("started successfully") {
                    return;
                }
            }
            panic!("chromedriver ended before it started");
        })
        .await
        .expect("chromedriver starts within 20 s");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let profile = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let driver_url = format!("http://127.0.0.1:{port}");
        // The flags a sandboxed machine with a closed network needs (no background traffic).
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,1000",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let created: Value = http
            .post(format!("{driver_url}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("a WebDriver session")
            .json()
            .await
            .unwrap();
        let id = created["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {created}"));
        Self { base: format!("{driver_url}/session/{id}"), driver, http, _profile: profile }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.expect("WebDriver answers").json().await.unwrap();
        if answer["value"].get("error").is_some() {
            panic!("WebDriver {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    pub async fn url(&self) -> String {
        self.command(reqwest::Method::GET, "/url", None).await.as_str().unwrap().to_owned()
    }

    /// Waits (up to 10 s) until the page's URL ends with `suffix`, and returns it: a form's post
    /// and the redirect after it may still be under way when a click returns.
    pub async fn wait_for_url(&self, suffix: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let url = self.url().await;
            if url.ends_with(suffix) || tokio::time::Instant::now() > deadline {
                return url;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's HTML as the browser holds it now.
    pub async fn source(&self) -> String {
        self.command(reqwest::Method::GET, "/source", None).await.as_str().unwrap().to_owned()
    }

    async fn element(&self, css: &str) -> String {
        let found =
            self.command(reqwest::Method::POST, "/element", Some(json!({"using": "css selector", "value": css}))).await;
        found[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}: {found}")).to_owned()
    }

    /// The visible text of the first element `css` selects.
    pub async fn text(&self, css: &str) -> String {
        let id = self.element(css).await;
        self.command(reqwest::Method::GET, &format!("/element/{id}/text"), None).await.as_str().unwrap().to_owned()
    }

    /// The visible text of the first element `css` selects, or empty when there is none yet.
    pub async fn text_or_empty(&self, css: &str) -> String {
        let found = self
            .command(reqwest::Method::POST, "/elements", Some(json!({"using": "css selector", "value": css})))
            .await;
        let Some(id) = found.as_array().and_then(|all| all.first()).and_then(|e| e[ELEMENT].as_str()) else {
            return String::new();
        };
        let text = self.command(reqwest::Method::GET, &format!("/element/{id}/text"), None).await;
        text.as_str().unwrap_or_default().to_owned()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.command(reqwest::Method::POST, &format!("/element/{id}/clear"), Some(json!({}))).await;
        self.command(reqwest::Method::POST, &format!("/element/{id}/value"), Some(json!({"text": text}))).await;
    }

    /// Picks the option whose value is `value` in the select `css`.
    pub async fn select(&self, css: &str, value: &str) {
        self.click(&format!("{css} option[value=\"{value}\"]")).await;
    }

    pub async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.command(reqwest::Method::POST, &format!("/element/{id}/click"), Some(json!({}))).await;
    }

    /// Runs `script` (a function body: `return …` answers) in the page, as WebDriver does,
    /// outside the page's Content Security Policy; returns what it answers.
    pub async fn execute(&self, script: &str) -> Value {
        self.command(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": []}))).await
    }

    /// The cookies the browser holds for the page's URL, as (name, value).
    pub async fn cookies(&self) -> Vec<(String, String)> {
        let all = self.command(reqwest::Method::GET, "/cookie", None).await;
        let text = |c: &Value, key: &str| c[key].as_str().unwrap_or_default().to_owned();
        all.as_array().unwrap().iter().map(|c| (text(c, "name"), text(c, "value"))).collect()
    }

    /// Saves a screenshot of the page as `target/screenshots/NAME.png`; returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.command(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap()).unwrap();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Ends the session (the driver is killed when dropped).
    pub async fn quit(mut self) {
        let _ = self.http.delete(&self.base).send().await;
        let _ = self.driver.kill().await;
    }
}

impl Drop for Browser {
    /// A test that fails leaves no browser behind: the driver is killed with its handle, and
    /// every process of this session's own profile (Chromium and its helpers, which outlive a
    /// killed driver) is killed here. The pattern starts with dashes: after `--`, or pkill takes
    /// it for an option and kills nothing.
    fn drop(&mut self) {
        let _ = self.driver.start_kill();
        let profile = self._profile.path().display().to_string();
        let _ = std::process::Command::new("pkill")
            // `--`: the pattern starts with dashes, and pkill would take it for an option.
            .args(["-KILL", "-f", "--", &format!("--user-data-dir={profile}")])
            .status();
    }
}
