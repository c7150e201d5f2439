//! Fixture upstreams: the `scopegate-fixture-upstream` binary started as a child process
//! (Streamable HTTP on a free port, on this host or inside a network namespace), the test
//! certificates, and a slow tool set registered the way a SaaS registers its own.

use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncBufReadExt;

use super::gateway::Live;
use super::wait::{PATIENCE, patience};

/// The fixture upstream binary.
pub const FIXTURE: &str = env!("CARGO_BIN_EXE_scopegate-fixture-upstream");

/// A stdio declaration of the fixture as server `server` of `live`'s gateway (it verifies the
/// gateway's assertions), in `cwd` `work`, with `value` as the variable only its declaration
/// supplies (it may be a `${NAME}` reference).
pub fn stdio_declaration(live: &Live, server: &str, value: &str) -> serde_json::Value {
    serde_json::json!({
        "command": FIXTURE,
        "args": ["stdio"],
        "cwd": "work",
        "env": {
            "FIXTURE_JWKS_URL": format!("{}/.well-known/jwks.json", live.base_url()),
            "FIXTURE_SERVER_ID": server,
            "FIXTURE_ISSUER": live.config.public_url(),
            "FIXTURE_DECLARED_VALUE": value,
        }
    })
}

/// Starts the fixture with `args` (an HTTP mode listening on an address of its own, inside
/// network namespace `netns` when given) and `env`; returns the child (killed when dropped)
/// and the address its first line announces.
pub async fn spawn_fixture(
    netns: Option<&str>,
    args: &[&str],
    env: &[(&str, &str)],
) -> (tokio::process::Child, String) {
    let mut command = match netns {
        Some(name) => {
            let mut command = tokio::process::Command::new("ip");
            command.args(["netns", "exec", name, FIXTURE]);
            command
        }
        None => tokio::process::Command::new(FIXTURE),
    };
    let mut child = command
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the fixture starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(patience(PATIENCE), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("the fixture {args:?} announces its address"))
        .unwrap()
        .unwrap_or_else(|| panic!("the fixture {args:?} exited before listening"));
    let addr = first.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line: {first:?}"));
    (child, addr.to_owned())
}

/// Starts the fixture upstream with `args` (an HTTP mode listening on `127.0.0.1:0`) and
/// `env`; returns the child (killed when dropped) and the address it printed.
pub async fn fixture_http(args: &[&str], env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    spawn_fixture(None, args, env).await
}

/// A file of the test keys (tests/fixtures/keys): the test CA, and the server certificate it
/// signed for 127.0.0.1.
pub fn tls_file(name: &str) -> String {
    format!("{}/tests/fixtures/keys/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The Streamable HTTP fixture as server `server` of `live`'s tenants (it verifies the
/// assertions `live` signs), a child process on a free port.
pub struct HttpFixture {
    pub child: tokio::process::Child,
    pub url: String,
}

impl HttpFixture {
    pub async fn start(live: &Live, server: &str) -> Self {
        Self::start_with(live, server, false).await
    }

    /// `tls`: serve HTTPS with the test certificate.
    pub async fn start_with(live: &Live, server: &str, tls: bool) -> Self {
        Self::start_marked(live, server, tls, None).await
    }

    /// [`HttpFixture::start_with`], marking what it saw in `marks`.
    pub async fn start_marked(live: &Live, server: &str, tls: bool, marks: Option<&Path>) -> Self {
        let (cert, key) = (tls_file("upstream-tls.pem"), tls_file("upstream-tls.key"));
        let args: Vec<&str> = if tls { vec!["https", "127.0.0.1:0", &cert, &key] } else { vec!["http", "127.0.0.1:0"] };
        let jwks = format!("{}/.well-known/jwks.json", live.base_url());
        let issuer = live.config.public_url();
        let marks = marks.map(|m| m.display().to_string());
        let mut env = vec![
            ("FIXTURE_ASSERTION_HEADER", live.config.upstream.assertion_header.as_str()),
            ("FIXTURE_JWKS_URL", &jwks),
            ("FIXTURE_SERVER_ID", server),
            ("FIXTURE_ISSUER", &issuer),
        ];
        env.extend(marks.as_deref().map(|m| ("FIXTURE_MARK_FILE", m)));
        let (child, addr) = spawn_fixture(None, &args, &env).await;
        let scheme = if tls { "https" } else { "http" };
        Self { child, url: format!("{scheme}://{addr}/mcp") }
    }
}

/// A test-only tool set registered through the public API, as a SaaS registers its own.
pub mod slow_tools {
    use std::time::Duration;

    use rmcp::{tool, tool_router};
    use scopegate::McpCallContext;
    use scopegate::model::Role;
    use scopegate::tools::{NoArguments, ToolSpec, arguments};

    /// How long the slow tool takes: well past the 1 s timeout, well inside the test's patience.
    pub const SLEEP: Duration = Duration::from_secs(5);

    #[derive(Clone, Copy, Default)]
    pub struct Slow;

    pub const SPECS: &[ToolSpec] = &[ToolSpec {
        name: "slow_report",
        roles: &[Role::Owner, Role::Manager, Role::Worker, Role::Auditor],
        validate: arguments::<NoArguments>,
    }];

    #[tool_router(vis = "pub")]
    impl Slow {
        #[tool(description = "A report that takes longer than the call timeout allows.")]
        async fn slow_report(&self, ctx: McpCallContext) -> String {
            tokio::time::sleep(SLEEP).await;
            format!("report for {}", ctx.tenant_slug())
        }
    }
}
