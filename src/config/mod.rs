//! Configuration: compiled-in defaults, then a file, then `SCOPEGATE_*` variables; never logs a secret.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

/// The shipped `config/default.toml`, compiled in so the binary runs anywhere.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// The HS256 secret that ships in `config/default.toml`. It is public, so the gateway
/// refuses to serve anything but loopback with it.
pub const SHIPPED_DEV_SECRET: &str = "scopegate-development-secret-do-not-use-in-production";

/// Environment variable prefix; `__` separates section and key.
pub const ENV_PREFIX: &str = "SCOPEGATE_";

/// The variable naming the configuration file when `--config` does not. It has the prefix but
/// no `__`, so the prefixed provider would take it for a top-level key: it is kept out.
pub const CONFIG_ENV: &str = "SCOPEGATE_CONFIG";

/// The file read when neither `--config` nor [`CONFIG_ENV`] names one, if it exists.
pub const SYSTEM_CONFIG_FILE: &str = "/etc/scopegate/scopegate.toml";

/// Which configuration file is read: `--config FILE` (`flag`), else the file [`CONFIG_ENV`]
/// names (`env`, when not empty), else [`SYSTEM_CONFIG_FILE`] when `exists` says it does, else
/// none. A file named by the flag or the variable is read even if missing, so it is refused.
pub fn config_file(
    flag: Option<&Path>,
    env: Option<&std::ffi::OsStr>,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    if let Some(flag) = flag {
        return Some(flag.to_owned());
    }
    if let Some(env) = env.filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(env));
    }
    let system = Path::new(SYSTEM_CONFIG_FILE);
    exists(system).then(|| system.to_owned())
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(Box<figment::Error>),
    /// The configuration file is missing, unreadable, not TOML, or holds a key or value that
    /// is refused; named as it was given (figment's own text names it relative to the
    /// working directory).
    #[error("configuration file {}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("configuration key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

impl ConfigError {
    fn invalid(key: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid { key, message: message.into() }
    }
}

/// A secret string: compared and used, never printed or serialized.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { "[redacted]" })
    }
}

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "[redacted]" })
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub database: DatabaseConfig,
    pub auth: AuthConfig,
    pub mcp: McpConfig,
    pub audit: AuditConfig,
    pub limits: LimitsConfig,
    pub metrics: MetricsConfig,
    pub upstream: UpstreamConfig,
    pub telemetry: TelemetryConfig,
    pub cluster: ClusterConfig,
    pub admin: AdminConfig,
    pub console: ConsoleConfig,
}

/// The console's sign-in through the identity provider (authorization code + PKCE).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// The console's client id at `auth.issuer`; empty: no sign-in through the provider (the
    /// bearer-token form only).
    pub oidc_client_id: String,
    /// Empty: a public client (PKCE only); else the client's secret, sent with
    /// `client_secret_basic` at the token endpoint.
    #[serde(default)]
    pub oidc_client_secret: Secret,
    /// Scopes asked for, besides those `auth.scopes_supported` and `auth.required_scopes` name.
    pub oidc_scopes: Vec<String>,
}

/// The admin API (`/admin/v1/`) and the console (`/console`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// The `sub` of every platform administrator's token (tokens of the configured issuer
    /// and audience, as on `/mcp`). They manage every tenant, the executors and the server
    /// declarations; their tokens need no tenant claim.
    pub platform_subjects: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The base URL other replicas reach this one at; empty: derived from `server.listen`
    /// (its own address, or, listening on every address, the first one this host's name
    /// resolves to).
    pub internal_url: String,
    /// How often a replica says it is alive; three missed heartbeats and it is taken for gone.
    pub heartbeat_ms: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// HTTP header that carries the identity assertion to Streamable HTTP upstreams.
    pub assertion_header: String,
    /// Lifetime of one identity assertion.
    pub assertion_ttl_secs: u64,
    /// How long an assertion is reused for further calls of the same caller to the same
    /// upstream (0: a fresh one per call; at most half the lifetime is used).
    pub assertion_reuse_ms: u64,
    /// How often the assertion signing key is replaced.
    pub key_rotation_secs: u64,
    /// The local executor's plugin root, a `file:` URI (empty: the gateway's working
    /// directory). A server's relative `cwd` resolves under it and can't leave it.
    pub local_root: String,
    /// The only variables of the gateway's own environment a local stdio server inherits;
    /// anything else only by an explicit `${env:NAME}` in its declaration.
    pub inherit_env: Vec<String>,
    /// Starting an upstream (launch or dial, handshake, tool list) fails after this long.
    pub connect_timeout_secs: u64,
    /// An upstream connection unused this long is closed; the next call starts it again.
    pub idle_secs: u64,
    /// A PEM file of CA certificates trusted for HTTPS upstreams besides the platform's own
    /// roots (empty: the platform's roots only), for upstreams behind a private CA.
    pub ca_file: String,
    /// A file holding the key that seals upstream OAuth credentials at rest: 32 random bytes
    /// as standard base64 (`scopegate admin oauth keygen`). Empty: none; start-up then refuses
    /// once any credential is stored.
    #[serde(default)]
    pub token_key_file: String,
    /// Or: the name of an environment variable holding that key (for a secret store that
    /// injects it). At most one of the two may be set.
    #[serde(default)]
    pub token_key_env: String,
    /// How often the gateway pings each connected executor agent; an agent silent for three
    /// of these is dropped.
    pub executor_heartbeat_secs: u64,
    /// The largest message on an executor tunnel, in bytes.
    pub executor_max_frame_bytes: usize,
    /// How often connected agents are checked against their executors' rows: an agent whose
    /// executor was deleted or whose secret was rotated is dropped within this long.
    pub executor_recheck_ms: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// Serve every protocol version statelessly (no `Mcp-Session-Id`). 2026-07-28 requests
    /// are always stateless.
    pub stateless: bool,
    /// A tool call that runs longer fails with a timeout error.
    pub call_timeout_secs: u64,
    /// Idle sessions are closed after this long.
    pub session_idle_secs: u64,
    /// The most sessions one user may hold open in this replica; 0: no limit.
    pub max_sessions_per_user: usize,
    /// SSE keep-alive interval.
    pub sse_keep_alive_secs: u64,
    /// Serve a session's calls of upstream tools on the lean relay (beside rmcp's server);
    /// off: every call goes through rmcp.
    pub lean_relay: bool,
    /// How long a task the gateway runs itself (a tool a declaration's `tasks` names, of a
    /// server without the tasks extension) may run, and its result is kept, from its start.
    pub task_ttl_secs: u64,
    /// The largest result of a task the gateway runs that it keeps, in bytes of JSON; a larger
    /// one fails the task.
    pub task_max_result_bytes: usize,
    /// How long a caller has to confirm a call that needs its confirmation.
    pub confirm_timeout_secs: u64,
    /// How long a call that waits (not a task) waits for an approver.
    pub approval_wait_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Store tool arguments verbatim beside their digest. Off: only the SHA-256 digest.
    pub record_raw_arguments: bool,
    /// Most events one group commit writes.
    pub max_batch: usize,
    /// How long a call's outcome (appended after its answer) waits for a commit to ride in
    /// before it is committed on its own, in milliseconds.
    pub outcome_linger_ms: u64,
    /// Where signed checkpoints of the chain heads go: "" (off), `file:PATH`, `stdout`, or an
    /// http(s) URL.
    pub checkpoint_sink: String,
    /// The Ed25519 private key (PKCS#8 PEM) that signs checkpoints.
    #[serde(default)]
    pub checkpoint_key: PathBuf,
    /// How often the gateway checkpoints the heads that moved.
    pub checkpoint_interval_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Requests per second a tenant may sustain (token bucket refill); 0 turns it off.
    pub tenant_per_sec: f64,
    /// Requests a tenant may burst.
    pub tenant_burst: f64,
    /// Requests per second one user may sustain; 0 turns it off.
    pub user_per_sec: f64,
    pub user_burst: f64,
    /// How many gateway replicas share these budgets. Each replica keeps its own buckets and
    /// enforces its share (rate and burst divided by this), so all of them together never
    /// admit more than the budget.
    pub replicas: u32,
}

impl LimitsConfig {
    /// This replica's share of a budget.
    pub fn share(&self, budget: f64) -> f64 {
        budget / f64::from(self.replicas.max(1))
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve Prometheus metrics at /metrics, on `listen` only.
    pub enabled: bool,
    /// The address of the metrics listener, apart from the gateway's port so that what
    /// reaches the gateway (clients, a public load balancer) never reads its metrics.
    pub listen: SocketAddr,
    /// Label tool-call metrics with the tenant slug (cardinality grows with tenants).
    pub label_tenant: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// `None`: `http://<bound address>`.
    #[serde(default)]
    pub public_url: Option<String>,
    pub allowed_hosts: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub body_limit_bytes: usize,
    pub request_timeout_secs: u64,
    pub shutdown_grace_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub url: Secret,
    pub max_connections: u32,
    pub min_connections: u32,
    pub acquire_timeout_secs: u64,
    pub sqlite_busy_timeout_ms: u64,
    /// SQLite's `PRAGMA synchronous`: `full` (the default) makes a commit durable before it
    /// is reported; `normal` may lose the last commits on a power loss or OS crash.
    pub sqlite_synchronous: SqliteSynchronous,
}

/// How far SQLite flushes a commit before reporting it (WAL mode). Only these two: `off`
/// would lose commits even on an application crash, `extra` buys nothing in WAL mode.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// Every commit is synced to disk before it is reported: committed means durable, so an
    /// answered call's audit event survives a power loss.
    Full,
    /// The WAL is synced only at checkpoints: faster commits, but the last ones can roll back
    /// after a power loss or an OS crash (never after a crash of the gateway alone).
    Normal,
}

impl SqliteSynchronous {
    /// The `PRAGMA synchronous` value.
    pub fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub issuer: String,
    #[serde(default)]
    pub audience: Option<String>,
    pub tenant_claim: String,
    pub leeway_secs: u64,
    #[serde(default)]
    pub hs256_secret: Secret,
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// Discover the key set from `issuer` (RFC 8414 / OpenID discovery) when neither
    /// `jwks_file` nor `jwks_url` is set and the issuer is an http(s) URL.
    pub discovery: bool,
    /// How long a fetched key set is used before it is fetched again, when its response
    /// carries no `Cache-Control: max-age`.
    pub jwks_cache_secs: u64,
    /// The floor between two fetches of the key set provoked by an unknown `kid`.
    pub jwks_refetch_min_interval_secs: u64,
    /// The most key set fetches provoked by unknown `kid`s in any minute.
    pub jwks_refetch_per_minute: u32,
    /// Published in the protected resource metadata; empty: the issuer, when tokens come from
    /// an identity provider (see [`Config::authorization_servers`]).
    pub authorization_servers: Vec<String>,
    /// The scopes published in the protected resource metadata (`scopes_supported`) and
    /// named in the 401 challenge when `required_scopes` is empty.
    pub scopes_supported: Vec<String>,
    /// Scopes every token on the MCP endpoint must carry (in `scope` or `scp`); a token
    /// without one of them is answered 403 `insufficient_scope`.
    pub required_scopes: Vec<String>,
    /// `resource_name` of the protected resource metadata.
    pub resource_name: String,
    /// Scopes a call of a tool needs beyond the required ones, by tool name (as callers see
    /// it) or name prefix (`delete_*`): a call without them is answered 403
    /// `insufficient_scope` naming them, so the client can ask the person for more (step-up).
    pub tool_scopes: std::collections::BTreeMap<String, Vec<String>>,
    /// Where the user's subject is: a claim name, or a JSON pointer (`/user/id`).
    pub subject_claim: String,
    /// What the tenant claim's value names: a tenant's slug, or the organization id a
    /// platform administrator recorded on a tenant.
    pub tenant_match: TenantMatch,
    /// Admit tenant issuers (and their key sets) at `http://` URLs and loopback or private
    /// hosts: for tests and development only. Off, a tenant's administrator cannot make the
    /// gateway fetch from its own network.
    pub tenant_issuers_insecure: bool,
    /// List the issuers tenants trust in the protected resource metadata, after the gateway's
    /// own. Off by default: a tenant's owner could otherwise add an authorization server to the
    /// gateway's public metadata, where every tenant's clients read it.
    pub advertise_tenant_issuers: bool,
    pub service_subjects: Vec<String>,
    /// Token claims policies read as `principal.claims.<name>`.
    #[serde(default)]
    pub policy_claims: Vec<String>,
    pub demo_token_ttl_secs: u64,
    /// How often the identity change counter is read, which bounds how stale reused identity
    /// rows can be (0: no reuse, read on every request).
    pub identity_cache_ms: u64,
}

/// Where the identity provider's key set comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum JwksSource {
    File(PathBuf),
    Url(String),
    /// The issuer's metadata names the key set (`jwks_uri`).
    Issuer(String),
}

/// What the value of `auth.tenant_claim` names.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TenantMatch {
    /// The tenant's slug (`acme`).
    Slug,
    /// The organization id recorded on the tenant (`org_AbC123` -> `acme`).
    OrgId,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    pub format: LogFormat,
    pub filter: String,
    /// The base URL of an OTLP/HTTP receiver (traces go to `<url>/v1/traces`); empty: no traces.
    pub otlp_endpoint: String,
    /// The `service.name` of exported spans.
    pub service_name: String,
    /// Share of new traces recorded, 0 to 1; a request with a trace context follows its sampling.
    pub sample_ratio: f64,
}

impl TelemetryConfig {
    /// The log alone, in `format` through `filter` (for the commands that serve nothing).
    pub fn log_only(format: LogFormat, filter: &str) -> Self {
        Self {
            format,
            filter: filter.to_owned(),
            otlp_endpoint: String::new(),
            service_name: "scopegate".to_owned(),
            sample_ratio: 1.0,
        }
    }
}

impl Config {
    /// Loads defaults, then `file` (when given), then the process environment. A file that
    /// can't be read or whose settings are refused is an error naming it.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(file, |figment| figment)
    }

    /// [`Config::load`] with the sources `adjust` adds over them (a command's own flags).
    pub fn load_with(file: Option<&Path>, adjust: impl FnOnce(Figment) -> Figment) -> Result<Self, ConfigError> {
        let named = |path: &Path, message: String| ConfigError::File { path: path.to_owned(), message };
        if let Some(file) = file
            && let Err(e) = std::fs::read_to_string(file)
        {
            return Err(named(file, format!("cannot be read: {e}")));
        }
        match (file, Self::from_figment(adjust(Self::figment(file)))) {
            (Some(file), Err(ConfigError::Load(error))) if from_a_file(&error) => {
                let refusals: Vec<String> = error
                    .into_iter()
                    .map(|e| match e.path.is_empty() {
                        true => e.kind.to_string(),
                        false => format!("{} (key `{}`)", e.kind, e.path.join(".")),
                    })
                    .collect();
                Err(named(file, refusals.join("; ")))
            }
            (_, loaded) => loaded,
        }
    }

    /// The layered sources, for callers that add their own (tests add `Serialized` values).
    pub fn figment(file: Option<&Path>) -> Figment {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(file) = file {
            figment = figment.merge(Toml::file_exact(file));
        }
        let name = CONFIG_ENV.strip_prefix(ENV_PREFIX).unwrap_or(CONFIG_ENV);
        figment.merge(Env::prefixed(ENV_PREFIX).ignore(&[name]).split("__"))
    }

    pub fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let mut config: Config = figment.extract().map_err(|e| ConfigError::Load(Box::new(e)))?;
        // An empty value means unset, so `SCOPEGATE_AUTH__JWKS_URL=` can switch a source off.
        let a = &mut config.auth;
        a.jwks_url = a.jwks_url.take().filter(|v| !v.is_empty());
        a.jwks_file = a.jwks_file.take().filter(|v| !v.as_os_str().is_empty());
        a.audience = a.audience.take().filter(|v| !v.is_empty());
        let s = &mut config.server;
        s.public_url = s.public_url.take().filter(|v| !v.is_empty());
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot: presence of a verification key, URL shapes, bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if !(c.internal_url.is_empty()
            || c.internal_url.starts_with("http://")
            || c.internal_url.starts_with("https://"))
        {
            return Err(ConfigError::invalid("cluster.internal_url", "must be an http(s) URL, or empty"));
        }
        if !(100..=60_000).contains(&c.heartbeat_ms) {
            return Err(ConfigError::invalid("cluster.heartbeat_ms", "must be between 100 and 60000"));
        }
        self.validate_auth()?;
        self.validate_console()?;
        let url = self.public_url();
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.ends_with('/') {
            return Err(ConfigError::invalid(
                "server.public_url",
                "must be an http(s) URL without a trailing slash, e.g. https://mcp.example.com",
            ));
        }
        if self.server.body_limit_bytes == 0 {
            return Err(ConfigError::invalid("server.body_limit_bytes", "must be greater than 0"));
        }
        if self.server.request_timeout_secs == 0 {
            return Err(ConfigError::invalid("server.request_timeout_secs", "must be greater than 0"));
        }
        let db = self.database.url.expose();
        if !(db.starts_with("sqlite:") || db.starts_with("postgres://") || db.starts_with("postgresql://")) {
            return Err(ConfigError::invalid("database.url", "must start with sqlite:, postgres:// or postgresql://"));
        }
        if self.mcp.call_timeout_secs == 0 {
            return Err(ConfigError::invalid("mcp.call_timeout_secs", "must be greater than 0"));
        }
        if self.mcp.task_ttl_secs == 0 || self.mcp.task_ttl_secs > 86_400 {
            return Err(ConfigError::invalid("mcp.task_ttl_secs", "must be 1 to 86400 seconds"));
        }
        if self.mcp.confirm_timeout_secs == 0 || self.mcp.confirm_timeout_secs > 86_400 {
            return Err(ConfigError::invalid("mcp.confirm_timeout_secs", "must be 1 to 86400 seconds"));
        }
        if self.mcp.approval_wait_secs == 0 || self.mcp.approval_wait_secs > 86_400 {
            return Err(ConfigError::invalid("mcp.approval_wait_secs", "must be 1 to 86400 seconds"));
        }
        if self.mcp.task_max_result_bytes == 0 {
            return Err(ConfigError::invalid("mcp.task_max_result_bytes", "must be greater than 0"));
        }
        if self.mcp.session_idle_secs == 0 {
            return Err(ConfigError::invalid("mcp.session_idle_secs", "must be greater than 0"));
        }
        if self.upstream.assertion_ttl_secs == 0 || self.upstream.assertion_ttl_secs > 300 {
            return Err(ConfigError::invalid("upstream.assertion_ttl_secs", "must be 1 to 300 seconds"));
        }
        if self.upstream.key_rotation_secs < self.upstream.assertion_ttl_secs {
            return Err(ConfigError::invalid(
                "upstream.key_rotation_secs",
                "must be at least upstream.assertion_ttl_secs",
            ));
        }
        if !self.upstream.local_root.is_empty()
            && let Err(e) = crate::decl::PathUri::parse(&self.upstream.local_root, crate::decl::PathStyle::Posix)
        {
            return Err(ConfigError::invalid("upstream.local_root", e.to_string()));
        }
        if self.upstream.connect_timeout_secs == 0 {
            return Err(ConfigError::invalid("upstream.connect_timeout_secs", "must be greater than 0"));
        }
        if self.upstream.executor_heartbeat_secs == 0 {
            return Err(ConfigError::invalid("upstream.executor_heartbeat_secs", "must be greater than 0"));
        }
        if self.upstream.executor_max_frame_bytes < 64 * 1024 {
            return Err(ConfigError::invalid("upstream.executor_max_frame_bytes", "must be at least 65536"));
        }
        if !(100..=60_000).contains(&self.upstream.executor_recheck_ms) {
            return Err(ConfigError::invalid("upstream.executor_recheck_ms", "must be 100 to 60000"));
        }
        if self.upstream.idle_secs == 0 {
            return Err(ConfigError::invalid("upstream.idle_secs", "must be greater than 0"));
        }
        if http::HeaderName::from_bytes(self.upstream.assertion_header.as_bytes()).is_err() {
            return Err(ConfigError::invalid("upstream.assertion_header", "must be a valid HTTP header name"));
        }
        if self.audit.max_batch == 0 || self.audit.max_batch > 1000 {
            return Err(ConfigError::invalid("audit.max_batch", "must be 1 to 1000"));
        }
        if !(1..=1000).contains(&self.audit.outcome_linger_ms) {
            return Err(ConfigError::invalid("audit.outcome_linger_ms", "must be 1 to 1000"));
        }
        match CheckpointSink::parse(&self.audit.checkpoint_sink) {
            Err(e) => return Err(ConfigError::invalid("audit.checkpoint_sink", e)),
            Ok(Some(_)) if self.audit.checkpoint_key.as_os_str().is_empty() => {
                return Err(ConfigError::invalid(
                    "audit.checkpoint_key",
                    "audit.checkpoint_sink is set, so checkpoints need a signing key: create one with \
                     `scopegate audit keygen --out FILE` and name it here",
                ));
            }
            Ok(_) => {}
        }
        if self.audit.checkpoint_interval_secs == 0 {
            return Err(ConfigError::invalid("audit.checkpoint_interval_secs", "must be greater than 0"));
        }
        let t = &self.telemetry;
        if !t.otlp_endpoint.is_empty() {
            let uri = t.otlp_endpoint.parse::<http::Uri>().ok();
            let shaped = uri.as_ref().is_some_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() && u.query().is_none()
            });
            if !shaped {
                return Err(ConfigError::invalid(
                    "telemetry.otlp_endpoint",
                    "must be empty (no traces) or the http(s) base URL of an OTLP/HTTP receiver, \
                     e.g. http://localhost:4318",
                ));
            }
        }
        if t.service_name.trim().is_empty() {
            return Err(ConfigError::invalid("telemetry.service_name", "must not be empty"));
        }
        if !(0.0..=1.0).contains(&t.sample_ratio) {
            return Err(ConfigError::invalid("telemetry.sample_ratio", "must be a number from 0.0 to 1.0"));
        }
        let l = &self.limits;
        for (key, value) in [
            ("limits.tenant_per_sec", l.tenant_per_sec),
            ("limits.tenant_burst", l.tenant_burst),
            ("limits.user_per_sec", l.user_per_sec),
            ("limits.user_burst", l.user_burst),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(ConfigError::invalid(key, "must be a finite number, 0 or more"));
            }
        }
        if l.replicas == 0 {
            return Err(ConfigError::invalid("limits.replicas", "must be 1 or more"));
        }
        for (key, rate, burst) in [
            ("limits.tenant_burst", l.tenant_per_sec, l.tenant_burst),
            ("limits.user_burst", l.user_per_sec, l.user_burst),
        ] {
            if rate > 0.0 && l.share(burst) < 1.0 {
                return Err(ConfigError::invalid(
                    key,
                    "a burst below 1 (per replica: the burst divided by limits.replicas) would refuse every request",
                ));
            }
        }
        if self.database.max_connections == 0 {
            return Err(ConfigError::invalid("database.max_connections", "must be greater than 0"));
        }
        if self.database.min_connections > self.database.max_connections {
            return Err(ConfigError::invalid("database.min_connections", "must not exceed database.max_connections"));
        }
        if self.uses_shipped_dev_secret()
            && let Some(reach) = self.reachable_beyond_loopback()
        {
            return Err(ConfigError::invalid(
                "auth.hs256_secret",
                format!(
                    "the shipped development secret is public, and {reach}: anyone could mint tokens \
                     for any tenant. Set auth.hs256_secret to your own secret (32+ random bytes), or \
                     to \"\" and verify tokens with your JWKS only"
                ),
            ));
        }
        Ok(())
    }

    fn validate_auth(&self) -> Result<(), ConfigError> {
        let a = &self.auth;
        if a.issuer.is_empty() {
            return Err(ConfigError::invalid("auth.issuer", "must not be empty"));
        }
        if a.hs256_secret.is_empty() && self.key_source().is_none() {
            return Err(ConfigError::invalid(
                "auth.hs256_secret",
                "no token verification key is configured: set auth.issuer to your identity provider's \
                 https URL (its keys are discovered), or auth.jwks_url or auth.jwks_file (production), \
                 or auth.hs256_secret (development)",
            ));
        }
        if !a.hs256_secret.is_empty() && a.hs256_secret.expose().len() < 32 {
            return Err(ConfigError::invalid("auth.hs256_secret", "must be at least 32 bytes long"));
        }
        if a.jwks_file.is_some() && a.jwks_url.is_some() {
            return Err(ConfigError::invalid("auth.jwks_url", "set either auth.jwks_file or auth.jwks_url, not both"));
        }
        if let Some(url) = &a.jwks_url
            && !is_http_url(url)
        {
            return Err(ConfigError::invalid("auth.jwks_url", "must be an http(s) URL"));
        }
        if !(1..=300).contains(&a.jwks_refetch_min_interval_secs) {
            return Err(ConfigError::invalid("auth.jwks_refetch_min_interval_secs", "must be 1 to 300 seconds"));
        }
        if !(1..=60).contains(&a.jwks_refetch_per_minute) {
            return Err(ConfigError::invalid("auth.jwks_refetch_per_minute", "must be 1 to 60"));
        }
        if a.jwks_cache_secs < 10 {
            return Err(ConfigError::invalid("auth.jwks_cache_secs", "must be at least 10 seconds"));
        }
        for (key, path) in [("auth.tenant_claim", &a.tenant_claim), ("auth.subject_claim", &a.subject_claim)] {
            if path.is_empty() || path == "/" {
                return Err(ConfigError::invalid(key, "must name a claim (`tid`) or be a JSON pointer (`/org/id`)"));
            }
        }
        for (key, scopes) in
            [("auth.scopes_supported", &a.scopes_supported), ("auth.required_scopes", &a.required_scopes)]
        {
            if let Some(bad) = scopes.iter().find(|s| !is_scope_token(s)) {
                return Err(ConfigError::invalid(
                    key,
                    format!("`{bad}` is not a scope (RFC 6749: printable ASCII, no space, quote or backslash)"),
                ));
            }
        }
        for (tool, scopes) in &a.tool_scopes {
            let pattern = tool.strip_suffix('*').unwrap_or(tool);
            if pattern.is_empty() || pattern.contains('*') || scopes.is_empty() {
                return Err(ConfigError::invalid(
                    "auth.tool_scopes",
                    format!("`{tool}`: a tool name or a name prefix ending in `*`, with at least one scope"),
                ));
            }
            if let Some(bad) = scopes.iter().find(|s| !is_scope_token(s)) {
                return Err(ConfigError::invalid("auth.tool_scopes", format!("`{tool}`: `{bad}` is not a scope")));
            }
            if !a.scopes_supported.is_empty()
                && let Some(missing) = scopes.iter().find(|s| !a.scopes_supported.contains(s))
            {
                return Err(ConfigError::invalid(
                    "auth.tool_scopes",
                    format!("`{tool}` needs `{missing}`, which is not in auth.scopes_supported"),
                ));
            }
        }
        if !a.scopes_supported.is_empty()
            && let Some(missing) = a.required_scopes.iter().find(|s| !a.scopes_supported.contains(s))
        {
            return Err(ConfigError::invalid(
                "auth.required_scopes",
                format!("`{missing}` is required but not in auth.scopes_supported, so no client would ask for it"),
            ));
        }
        if a.resource_name.trim().is_empty() || a.resource_name.chars().any(char::is_control) {
            return Err(ConfigError::invalid(
                "auth.resource_name",
                "must be a non-empty name without control characters",
            ));
        }
        if let Some(bad) = a.authorization_servers.iter().find(|s| !is_http_url(s)) {
            return Err(ConfigError::invalid("auth.authorization_servers", format!("`{bad}` is not an http(s) URL")));
        }
        if self.key_source().is_some() && self.authorization_servers().is_empty() {
            return Err(ConfigError::invalid(
                "auth.authorization_servers",
                "tokens come from an identity provider but clients are told of no authorization server: \
                 set auth.authorization_servers to your identity provider's issuer URL (it defaults to \
                 auth.issuer when that is an http(s) URL)",
            ));
        }
        Ok(())
    }

    fn validate_console(&self) -> Result<(), ConfigError> {
        let c = &self.console;
        if c.oidc_client_id.is_empty() {
            if !c.oidc_client_secret.is_empty() {
                return Err(ConfigError::invalid(
                    "console.oidc_client_secret",
                    "is set but console.oidc_client_id is empty: set the client id too, or clear the secret",
                ));
            }
        } else {
            if c.oidc_client_id.trim() != c.oidc_client_id || c.oidc_client_id.chars().any(char::is_control) {
                return Err(ConfigError::invalid(
                    "console.oidc_client_id",
                    "must be the client id as the identity provider issued it: no surrounding spaces or control characters",
                ));
            }
            if !is_http_url(&self.auth.issuer) {
                return Err(ConfigError::invalid(
                    "console.oidc_client_id",
                    format!(
                        "sign-in through the identity provider needs auth.issuer to be the provider's http(s) URL \
                         (its endpoints are discovered from it), and it is `{}`",
                        self.auth.issuer
                    ),
                ));
            }
        }
        if c.oidc_client_secret.expose().chars().any(char::is_control) {
            return Err(ConfigError::invalid("console.oidc_client_secret", "must not hold control characters"));
        }
        if let Some(bad) = c.oidc_scopes.iter().find(|s| !is_scope_token(s)) {
            return Err(ConfigError::invalid(
                "console.oidc_scopes",
                format!("`{bad}` is not a scope (RFC 6749: printable ASCII, no space, quote or backslash)"),
            ));
        }
        Ok(())
    }

    /// The scopes the console asks the identity provider for: `console.oidc_scopes`, then what
    /// the gateway's tokens need (`auth.scopes_supported`, `auth.required_scopes`), each once.
    pub fn console_scopes(&self) -> Vec<String> {
        let mut scopes: Vec<String> = Vec::new();
        let wanted = self.console.oidc_scopes.iter().chain(self.scopes_supported()).chain(&self.auth.required_scopes);
        for scope in wanted {
            if !scopes.contains(scope) {
                scopes.push(scope.clone());
            }
        }
        scopes
    }

    /// Where the keys of the identity provider's tokens come from, if tokens come from one: a
    /// file, a URL, or the issuer's discovery metadata.
    pub fn key_source(&self) -> Option<JwksSource> {
        let a = &self.auth;
        match (&a.jwks_file, &a.jwks_url) {
            (Some(path), _) => Some(JwksSource::File(path.clone())),
            (None, Some(url)) => Some(JwksSource::Url(url.clone())),
            (None, None) if a.discovery && is_http_url(&a.issuer) => Some(JwksSource::Issuer(a.issuer.clone())),
            (None, None) => None,
        }
    }

    /// The authorization servers clients are told of: `auth.authorization_servers`, or, when
    /// that is empty and tokens come from an identity provider whose issuer is an http(s) URL,
    /// that issuer.
    pub fn authorization_servers(&self) -> Vec<String> {
        let a = &self.auth;
        if !a.authorization_servers.is_empty() {
            return a.authorization_servers.clone();
        }
        if self.key_source().is_some() && is_http_url(&a.issuer) {
            return vec![a.issuer.clone()];
        }
        Vec::new()
    }

    /// The scopes published as `scopes_supported`: `auth.scopes_supported`, or the required
    /// ones when that is empty.
    pub fn scopes_supported(&self) -> &[String] {
        if self.auth.scopes_supported.is_empty() { &self.auth.required_scopes } else { &self.auth.scopes_supported }
    }

    /// The `scope` of the 401 challenge: what a client should ask for to be let in (the
    /// required scopes, else the supported ones; none when neither is set).
    pub fn challenge_scope(&self) -> Option<String> {
        let scopes =
            if self.auth.required_scopes.is_empty() { self.scopes_supported() } else { &self.auth.required_scopes };
        (!scopes.is_empty()).then(|| scopes.join(" "))
    }

    /// Why this gateway may be reached by others than its operator, if it may: a non-loopback
    /// listen address, a public URL or allowed host that is not loopback (a reverse proxy in
    /// front of a loopback listener), or a JWKS (an identity provider's deployment). The shipped
    /// development secret verifies tokens only when there is none.
    fn reachable_beyond_loopback(&self) -> Option<String> {
        let s = &self.server;
        if !s.listen.ip().is_loopback() {
            return Some(format!("server.listen ({}) is a non-loopback address", s.listen));
        }
        if let Some(url) = &s.public_url {
            let host = reqwest::Url::parse(url).ok().and_then(|u| u.host_str().map(str::to_owned));
            if !host.as_deref().is_some_and(is_loopback_host) {
                return Some(format!("server.public_url ({url}) is not a loopback address"));
            }
        }
        if s.allowed_hosts.is_empty() {
            return Some("server.allowed_hosts is empty (any Host is served)".to_owned());
        }
        if let Some(host) = s.allowed_hosts.iter().find(|h| !is_loopback_host(h)) {
            return Some(format!("server.allowed_hosts admits `{host}`, which is not a loopback name"));
        }
        if self.key_source().is_some() {
            return Some(
                "tokens come from an identity provider (auth.jwks_file, auth.jwks_url, or auth.issuer \
                 discovered): this is a deployment"
                    .to_owned(),
            );
        }
        None
    }

    /// The gateway's public base URL: `server.public_url`, else `http://<listen address>`.
    pub fn public_url(&self) -> String {
        self.server.public_url.clone().unwrap_or_else(|| format!("http://{}", self.server.listen))
    }

    /// The resource URI of the MCP endpoint, also the default required `aud`.
    pub fn resource_uri(&self) -> String {
        format!("{}/mcp", self.public_url())
    }

    pub fn audience(&self) -> String {
        self.auth.audience.clone().unwrap_or_else(|| self.resource_uri())
    }

    /// Where clients find the RFC 9728 protected resource metadata.
    pub fn resource_metadata_url(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource", self.public_url())
    }

    pub fn uses_shipped_dev_secret(&self) -> bool {
        self.auth.hs256_secret.expose() == SHIPPED_DEV_SECRET
    }
}

/// Whether figment's `error` is about a file's text (the configuration file is the only file).
fn from_a_file(error: &figment::Error) -> bool {
    error.metadata.as_ref().and_then(|m| m.source.as_ref()).is_some_and(|s| s.file_path().is_some())
}

/// The scopes of every `auth.tool_scopes` entry that names `tool` or a prefix of its name.
pub fn scopes_of_tool(map: &std::collections::BTreeMap<String, Vec<String>>, tool: &str) -> Vec<String> {
    let mut needed: Vec<String> = Vec::new();
    for (pattern, scopes) in map {
        let matches = match pattern.strip_suffix('*') {
            Some(prefix) => tool.starts_with(prefix),
            None => tool == pattern,
        };
        if matches {
            for scope in scopes {
                if !needed.contains(scope) {
                    needed.push(scope.clone());
                }
            }
        }
    }
    needed
}

/// An `http://` or `https://` URL with a host.
fn is_http_url(text: &str) -> bool {
    reqwest::Url::parse(text).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
}

/// A scope token of RFC 6749 section 3.3: one or more of %x21 / %x23-5B / %x5D-7E.
fn is_scope_token(scope: &str) -> bool {
    !scope.is_empty() && scope.bytes().all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

/// `localhost` (or a name under it), or a loopback IP address (IPv6 with or without brackets),
/// with or without a port.
fn is_loopback_host(host: &str) -> bool {
    // The name without its port: `[v6]:port`, `name:port`; a bare IPv6 address has colons of its own.
    let name = match (host.strip_prefix('['), host.rsplit_once(':')) {
        (Some(v6), _) => v6.split_once(']').map_or(v6, |(ip, _)| ip),
        (None, Some((name, port))) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
    }
}

/// Where audit checkpoints go (`audit.checkpoint_sink`).
#[derive(Debug, Clone)]
pub enum CheckpointSink {
    /// `file:PATH`: appended, one JSON line each.
    File(PathBuf),
    /// `stdout`: one JSON line each, for a log pipeline.
    Stdout,
    /// `http://` or `https://`: one POST per round, JSON lines (`application/x-ndjson`).
    Http(String),
}

impl CheckpointSink {
    /// Parses `audit.checkpoint_sink`; `None` for the empty string (checkpoints off).
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        if text.is_empty() {
            return Ok(None);
        }
        if text == "stdout" {
            return Ok(Some(CheckpointSink::Stdout));
        }
        if let Some(path) = text.strip_prefix("file:") {
            if path.is_empty() {
                return Err("`file:` needs a path, e.g. file:audit-checkpoints.jsonl".into());
            }
            return Ok(Some(CheckpointSink::File(PathBuf::from(path))));
        }
        if text.starts_with("http://") || text.starts_with("https://") {
            reqwest::Url::parse(text).map_err(|e| format!("`{text}`: {e}"))?;
            return Ok(Some(CheckpointSink::Http(text.to_owned())));
        }
        Err(format!("`{text}`: expected file:PATH, stdout, or an http(s):// URL"))
    }

    /// The sink as `audit.checkpoint_sink` writes it.
    pub fn name(&self) -> String {
        match self {
            CheckpointSink::File(path) => format!("file:{}", path.display()),
            CheckpointSink::Stdout => "stdout".to_owned(),
            CheckpointSink::Http(url) => url.clone(),
        }
    }
}

#[cfg(test)]
mod layering_tests;
