//! `.mcp.json` declarations, parsed and resolved for a placement; never reads a file or the process environment.
//!
//! One invalid server never discards its valid siblings: [`parse_declarations`] returns the
//! valid servers and one [`ServerError`] per problem, naming the server and the field. Only
//! malformed JSON, or a top level that is not an object, fails the whole file.
//!
//! Accepted shapes: a top-level object of servers, or an object with `"mcpServers"` (its
//! other keys, such as `"$schema"`, are ignored). A server is stdio (`command`, `args`, `env`,
//! `cwd`) or Streamable HTTP (`url`, `headers`, `oauth`), with an optional `"type"` (`"stdio"`, `"http"`,
//! `"streamable-http"`) that must agree. Any other key is an error: a misspelt `cwd` or an
//! ignored `disabled` would otherwise change what runs without a word.
//!
//! References, in `args`, `env` values and `headers` values only:
//! - `${NAME}` is a variable of the executor's environment, looked up on the executor.
//! - `${env:NAME}` forwards the gateway's own environment. It is refused for a non-local
//!   executor: the gateway's secrets must not travel to another machine by a declaration.
//!   On the local executor the two forms read the same environment.
//! - `$${` writes a literal `${`.
//!
//! `headers` that reference a variable (`${NAME}`, `${env:NAME}`) are refused for a server on a
//! remote executor: its credentials come from a login through that executor (`oauth`), not
//! from a value the declaration pulls out of some machine's environment.
//!
//! `oauth` (Streamable HTTP only) says the server is protected by OAuth 2.1 (the MCP
//! authorization spec): `{"tokens": "tenant" | "user", "scopes": [...], "client_id": "..."}`,
//! every field optional. `tokens` says whose login the calls carry: the tenant's one login for
//! the server (the default) or each user's own (the upstream then sees the real user).
//! `scopes` are asked for at login (default: what the server's metadata suggests);
//! `client_id` names a client registered with the authorization server beforehand (default:
//! dynamic client registration). A declaration with `oauth` can't also set `Authorization`.
//!
//! `command`, `cwd` and `url` take no references, so what runs and where is visible in the file.
//! The executor always comes from the placement; a declaration can't name one.
//!
//! Working directory (`cwd`), always a [`PathUri`] in the executor's convention:
//! - missing: the declaring file's folder (`Declared`) or the plugin root (`Environment`);
//! - relative, in the executor's separators: joined under that folder, never climbing out;
//! - a `file:` URI: accepted only inside the plugin root (`Environment`), anywhere for a
//!   `Declared` file, which the gateway host's operator wrote;
//! - a native absolute path (`/srv/x`, `C:\x`, `~/x`) or a drive-relative one: refused.
//!   A relative name that looks like a scheme or a drive (`ab:c`) is refused too; write `./ab:c`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::decl::ExecutorEnv;
use crate::decl::ExecutorId;
use crate::decl::path_uri::{PathError, PathUri};

/// A validated server name: 1 to 64 letters, digits, `-` or `_`, without `__` and not ending
/// in `_`, so that the tool name `server__tool` splits back unambiguously.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerName(String);

impl ServerName {
    pub fn new(name: &str) -> Result<Self, &'static str> {
        if name.is_empty() || name.len() > 64 {
            return Err("a server name has 1 to 64 characters");
        }
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err("a server name has only letters, digits, `-` and `_`");
        }
        if name.contains("__") || name.ends_with('_') {
            return Err("a server name can't contain `__` or end in `_` (tools are named `server__tool`)");
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ServerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a declared server is reached, as written (references not yet resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio { command: String, args: Vec<String>, env: BTreeMap<String, String>, cwd: Option<String> },
    Http { url: String, headers: BTreeMap<String, String>, oauth: Option<OAuthSpec> },
}

/// Whose login an OAuth-protected server's calls carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// One login for the tenant, used for every user's calls.
    Tenant,
    /// Each user's own login: a user's token is never used for another user.
    User,
}

/// The `oauth` field of a Streamable HTTP declaration.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct OAuthSpec {
    pub tokens: TokenScope,
    /// Scopes asked for at login; empty: what the server's metadata suggests.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// A client registered beforehand; `None`: dynamic client registration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

/// One valid server of a declaration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerDeclaration {
    pub name: ServerName,
    pub transport: Transport,
    /// The protocol revision the gateway speaks with it: negotiated, or pinned by the
    /// declaration's `protocolVersion`.
    pub revision: Revision,
    /// The tools the gateway runs as tasks for callers that declare the tasks extension, when
    /// the server itself does not offer the extension (the declaration's `tasks`).
    pub tasks: TaskTools,
}

/// How the gateway runs the tools of a server without the tasks extension, by their upstream
/// names. Tools not named are plain calls.
pub type TaskTools = BTreeMap<String, TaskTool>;

/// How the gateway runs one tool as a task: `"optional"` or `"required"`, or
/// `{"support": "optional" | "required", "inputBeforeTask": true}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskTool {
    pub support: TaskSupport,
    /// A question the upstream asks at once is asked through the call's own multi round-trip,
    /// before the task exists (the upstream gathers its input first, then works); otherwise
    /// every question becomes one of the task's input requests.
    pub input_before_task: bool,
}

/// `optional`: a task for a caller that declared the tasks extension, else a plain call;
/// `required`: a task, refused -32021 to a caller that did not declare it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskSupport {
    Optional,
    Required,
}

impl TaskSupport {
    fn as_str(self) -> &'static str {
        match self {
            Self::Optional => "optional",
            Self::Required => "required",
        }
    }
}

impl serde::Serialize for TaskTool {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.input_before_task {
            json!({ "support": self.support.as_str(), "inputBeforeTask": true }).serialize(serializer)
        } else {
            serializer.serialize_str(self.support.as_str())
        }
    }
}

/// The protocol revision of an upstream, as its declaration sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Revision {
    /// No `protocolVersion`: negotiated at connection, modern first (`server/discover` on
    /// 2026-07-28, retried on a version the server names in `UnsupportedProtocolVersionError`),
    /// falling back to `initialize` on the newest legacy revision when the answer is no
    /// recognised modern error (the 2026-07-28 "Backward Compatibility" rules).
    #[default]
    Negotiated,
    /// `"protocolVersion": "2026-07-28"` (or a later modern revision): `server/discover` and
    /// self-contained requests only, never an `initialize`.
    Modern(&'static str),
    /// `"protocolVersion"` naming a revision with the `initialize` handshake: only that
    /// handshake, offering that revision.
    Legacy(&'static str),
}

impl Revision {
    /// The declaration's value for `protocolVersion` (`None`: negotiated).
    pub fn pinned(self) -> Option<&'static str> {
        match self {
            Self::Negotiated => None,
            Self::Modern(v) | Self::Legacy(v) => Some(v),
        }
    }

    fn parse(value: &str) -> Option<Self> {
        let known = |list: &'static [&'static str]| list.iter().copied().find(|v| *v == value);
        known(&MODERN_PROTOCOLS).map(Self::Modern).or_else(|| known(&LEGACY_PROTOCOLS).map(Self::Legacy))
    }
}

/// What a declaration file holds: its valid servers in file order, and one error per problem
/// of the others.
#[derive(Debug, Clone, Default)]
pub struct Declarations {
    pub servers: Vec<ServerDeclaration>,
    pub errors: Vec<ServerError>,
}

/// A problem with one server, naming the server and, when there is one, the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub server: String,
    pub field: Option<String>,
    pub problem: String,
    /// The problem is a path that leaves the root it must stay under (audited as `outside_root`).
    pub outside_root: bool,
}

impl ServerError {
    fn new(server: &str, field: Option<&str>, problem: impl Into<String>) -> Self {
        Self {
            server: server.to_owned(),
            field: field.map(str::to_owned),
            problem: problem.into(),
            outside_root: false,
        }
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server {:?}: ", self.server)?;
        if let Some(field) = &self.field {
            write!(f, "field {field:?}: ")?;
        }
        f.write_str(&self.problem)
    }
}

impl std::error::Error for ServerError {}

/// Why a whole declaration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("malformed JSON: {0}")]
    Malformed(serde_json::Error),
    #[error("not a JSON object of MCP servers: {0}")]
    NotAnObject(serde_json::Error),
}

/// Where a server's files live and which executor runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A file on the gateway host: runs on the local executor; a relative `cwd` resolves
    /// against the file's folder.
    Declared { file: PathUri },
    /// Installed on an executor under a plugin root: `cwd` stays inside `root`.
    Environment { executor: ExecutorId, root: PathUri },
}

/// A server ready to launch or dial on its executor: references resolved, `cwd` absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedServer {
    pub name: ServerName,
    pub executor: ExecutorId,
    pub transport: ResolvedTransport,
    /// The revision spoken with it (see [`ServerDeclaration::revision`]).
    pub revision: Revision,
    /// See [`ServerDeclaration::tasks`].
    pub tasks: TaskTools,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedTransport {
    Stdio { command: String, args: Vec<String>, env: BTreeMap<String, String>, cwd: PathUri },
    Http { url: String, headers: BTreeMap<String, String>, oauth: Option<OAuthSpec> },
}

impl ResolvedServer {
    /// SHA-256 (hex) of a canonical JSON form: equal for servers that would run identically,
    /// so connections can be shared. It hashes credential values: keep it internal.
    pub fn fingerprint(&self) -> String {
        let transport = match &self.transport {
            ResolvedTransport::Stdio { command, args, env, cwd } => json!({
                "type": "stdio", "command": command, "args": args, "env": env, "cwd": cwd.to_string(),
            }),
            ResolvedTransport::Http { url, headers, oauth } => {
                json!({ "type": "http", "url": url, "headers": headers, "oauth": oauth })
            }
        };
        let mut canonical = json!({
            "version": 1, "name": self.name.as_str(), "executor": self.executor.as_str(), "transport": transport,
        });
        if let Some(version) = self.revision.pinned() {
            canonical["protocolVersion"] = json!(version);
        }
        if !self.tasks.is_empty() {
            canonical["tasks"] = json!(self.tasks);
        }
        // serde_json writes BTreeMap and `json!` keys in a fixed order, so the text is canonical.
        let digest = Sha256::digest(canonical.to_string().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Parses a `.mcp.json` file. Fails only when the file is not JSON or not an object; a bad
/// server lands in [`Declarations::errors`] and its siblings are kept.
pub fn parse_declarations(json: &str) -> Result<Declarations, FileError> {
    let file: File = serde_json::from_str(json).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => FileError::NotAnObject(e),
        _ => FileError::Malformed(e),
    })?;
    let mut out = Declarations::default();
    for (index, (name, value)) in file.0.iter().enumerate() {
        let seen = |other: &(String, Value)| other.0 == *name;
        if file.0[..index].iter().any(seen) {
            continue;
        }
        if file.0[index + 1..].iter().any(seen) {
            out.errors.push(ServerError::new(name, None, "declared more than once"));
            continue;
        }
        match parse_server(name, value) {
            Ok(server) => out.servers.push(server),
            Err(errors) => out.errors.extend(errors),
        }
    }
    Ok(out)
}

impl ServerDeclaration {
    /// The declaration as `.mcp.json` writes it (without the name), for storing as an
    /// `mcp-server` entity. `parse_declarations` reads it back unchanged.
    pub fn to_json(&self) -> Value {
        let mut out = self.transport_json();
        if let Some(version) = self.revision.pinned() {
            out["protocolVersion"] = Value::String(version.to_owned());
        }
        if !self.tasks.is_empty() {
            out["tasks"] = serde_json::json!(self.tasks);
        }
        out
    }

    fn transport_json(&self) -> Value {
        match &self.transport {
            Transport::Stdio { command, args, env, cwd } => {
                let mut v = serde_json::json!({ "command": command, "args": args, "env": env });
                if let Some(cwd) = cwd {
                    v["cwd"] = Value::String(cwd.clone());
                }
                v
            }
            Transport::Http { url, headers, oauth } => {
                let mut out = serde_json::json!({ "type": "http", "url": url, "headers": headers });
                if let Some(oauth) = oauth {
                    out["oauth"] = serde_json::json!(oauth);
                }
                out
            }
        }
    }

    /// Resolves references on `env` (the executor the placement names) and the `cwd` for the
    /// placement. Every problem is reported, each naming this server and its field.
    pub fn resolve(&self, placement: &Placement, env: &dyn ExecutorEnv) -> Result<ResolvedServer, Vec<ServerError>> {
        let name = self.name.as_str();
        let executor = match placement {
            Placement::Declared { .. } if !env.is_local() => {
                let problem = "a declared file runs on the local executor, not on a remote one";
                return Err(vec![ServerError::new(name, None, problem)]);
            }
            Placement::Declared { .. } => ExecutorId::local(),
            Placement::Environment { executor, .. } => executor.clone(),
        };
        let mut errors = Vec::new();
        let transport = match &self.transport {
            Transport::Stdio { command, args, env: vars, cwd } => {
                let args: Vec<_> =
                    args.iter().map(|a| keep(&mut errors, name, "args", expand(a, env, &executor))).collect();
                let vars: Vec<_> = vars
                    .iter()
                    .map(|(k, v)| (k.clone(), keep(&mut errors, name, "env", expand(v, env, &executor))))
                    .collect();
                let cwd = resolve_cwd(cwd.as_deref(), placement)
                    .map_err(|problem| {
                        let outside_root = problem.outside_root;
                        errors.push(ServerError { outside_root, ..ServerError::new(name, Some("cwd"), problem.text) });
                    })
                    .ok();
                match cwd {
                    Some(cwd) if errors.is_empty() => Some(ResolvedTransport::Stdio {
                        command: command.clone(),
                        args: args.into_iter().flatten().collect(),
                        env: vars.into_iter().filter_map(|(k, v)| Some((k, v?))).collect(),
                        cwd,
                    }),
                    _ => None,
                }
            }
            Transport::Http { url, headers, oauth } => {
                let mut values = BTreeMap::new();
                for (key, value) in headers {
                    if !env.is_local() && has_reference(value) {
                        let problem = format!(
                            "the value of {key:?} references a variable: refused for a server on a remote \
                             executor (declare \"oauth\" to log in through the executor instead)"
                        );
                        keep::<(), _>(&mut errors, name, "headers", Err(problem));
                        continue;
                    }
                    let value = expand(value, env, &executor).and_then(|v| match http::HeaderValue::from_str(&v) {
                        Ok(_) => Ok(v),
                        Err(_) => Err(format!("the value of {key:?} is not a valid header value once resolved")),
                    });
                    if let Some(value) = keep(&mut errors, name, "headers", value) {
                        values.insert(key.clone(), value);
                    }
                }
                errors.is_empty().then(|| ResolvedTransport::Http {
                    url: url.clone(),
                    headers: values,
                    oauth: oauth.clone(),
                })
            }
        };
        match transport {
            Some(transport) => Ok(ResolvedServer {
                name: self.name.clone(),
                executor,
                transport,
                revision: self.revision,
                tasks: self.tasks.clone(),
            }),
            None => Err(errors),
        }
    }
}

const FIELDS: [&str; 10] =
    ["type", "command", "args", "env", "cwd", "url", "headers", "oauth", "protocolVersion", "tasks"];

/// The longest tool name `tasks` may name (the gateway's names of tools are bounded alike).
const MAX_TASK_TOOL_LEN: usize = 128;

/// The declaration's `tasks`: an object of tool names to a [`TaskTool`].
fn task_tools(value: &Value) -> Result<TaskTools, String> {
    let Value::Object(tools) = value else {
        return Err(r#"expected an object of tool names to "optional" or "required""#.to_owned());
    };
    let support = |tool: &str, value: Option<&Value>| match value.and_then(Value::as_str) {
        Some("optional") => Ok(TaskSupport::Optional),
        Some("required") => Ok(TaskSupport::Required),
        _ => Err(format!(r#"tool {tool:?}: expected "optional" or "required""#)),
    };
    tools
        .iter()
        .map(|(tool, value)| {
            if tool.is_empty() || tool.len() > MAX_TASK_TOOL_LEN || tool.chars().any(char::is_control) {
                return Err(format!("{tool:?} is not a tool name (1 to {MAX_TASK_TOOL_LEN} characters, no controls)"));
            }
            let task = match value {
                Value::Object(fields) => {
                    if let Some(key) = fields.keys().find(|k| !["support", "inputBeforeTask"].contains(&k.as_str())) {
                        return Err(format!(
                            r#"tool {tool:?}: unknown field {key:?} (expected "support", "inputBeforeTask")"#
                        ));
                    }
                    let input_before_task = match fields.get("inputBeforeTask") {
                        None => false,
                        Some(Value::Bool(b)) => *b,
                        Some(_) => return Err(format!(r#"tool {tool:?}: "inputBeforeTask" must be true or false"#)),
                    };
                    TaskTool { support: support(tool, fields.get("support"))?, input_before_task }
                }
                value => TaskTool { support: support(tool, Some(value))?, input_before_task: false },
            };
            Ok((tool.clone(), task))
        })
        .collect()
}

/// The revisions without an `initialize` handshake that `protocolVersion` may pin.
pub const MODERN_PROTOCOLS: [&str; 1] = ["2026-07-28"];
/// The revisions with an `initialize` handshake that `protocolVersion` may pin.
pub const LEGACY_PROTOCOLS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
const STDIO_ONLY: [&str; 4] = ["command", "args", "env", "cwd"];
const HTTP_ONLY: [&str; 3] = ["url", "headers", "oauth"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stdio,
    Http,
}

fn parse_server(name: &str, value: &Value) -> Result<ServerDeclaration, Vec<ServerError>> {
    let error = |field: Option<&str>, problem: &str| vec![ServerError::new(name, field, problem)];
    let server_name = ServerName::new(name).map_err(|problem| error(None, problem))?;
    let Value::Object(fields) = value else {
        return Err(error(None, "expected an object"));
    };
    let mut errors = Vec::new();
    for key in fields.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
        let problem = format!("unknown field (expected one of {})", FIELDS.join(", "));
        errors.push(ServerError::new(name, Some(key), problem));
    }
    let declared = match fields.get("type") {
        None => None,
        Some(Value::String(t)) => match t.as_str() {
            "stdio" => Some(Kind::Stdio),
            "http" | "streamable-http" => Some(Kind::Http),
            "sse" => keep(&mut errors, name, "type", Err("the SSE transport is not supported; use Streamable HTTP")),
            other => {
                let problem = format!("unknown type {other:?} (expected \"stdio\", \"http\" or \"streamable-http\")");
                keep(&mut errors, name, "type", Err(problem))
            }
        },
        Some(_) => keep(&mut errors, name, "type", Err("expected a string")),
    };
    let has = |key: &str| fields.contains_key(key);
    let kind = match (declared, has("command"), has("url")) {
        (Some(kind), _, _) => kind,
        (None, true, false) => Kind::Stdio,
        (None, false, true) => Kind::Http,
        // A bad "type" was reported already; guessing the kind would only add noise.
        (None, _, _) if has("type") => return Err(errors),
        (None, true, true) => {
            errors.push(ServerError::new(name, None, "has both \"command\" (stdio) and \"url\" (Streamable HTTP)"));
            return Err(errors);
        }
        (None, false, false) => {
            errors.push(ServerError::new(name, None, "needs \"command\" (stdio) or \"url\" (Streamable HTTP)"));
            return Err(errors);
        }
    };
    let (foreign, label) = match kind {
        Kind::Stdio => (&HTTP_ONLY[..], "a stdio server"),
        Kind::Http => (&STDIO_ONLY[..], "a Streamable HTTP server"),
    };
    for key in foreign.iter().filter(|k| has(k)) {
        errors.push(ServerError::new(name, Some(key), format!("not allowed for {label}")));
    }
    let transport = match kind {
        Kind::Stdio => {
            let command = required_string(fields.get("command")).and_then(|c| no_references(c).map(|()| c));
            let command = keep(&mut errors, name, "command", command);
            let args = keep(&mut errors, name, "args", fields.get("args").map(string_array).transpose());
            let env = keep(&mut errors, name, "env", fields.get("env").map(|v| string_map(v, env_name)).transpose());
            let cwd = keep(&mut errors, name, "cwd", fields.get("cwd").map(cwd_string).transpose());
            match (command, args, env, cwd) {
                (Some(command), Some(args), Some(env), Some(cwd)) => Transport::Stdio {
                    command: command.to_owned(),
                    args: args.unwrap_or_default(),
                    env: env.unwrap_or_default(),
                    cwd: cwd.map(str::to_owned),
                },
                _ => return Err(errors),
            }
        }
        Kind::Http => {
            let url = keep(&mut errors, name, "url", required_string(fields.get("url")).and_then(http_url));
            let headers = fields.get("headers").map(|v| string_map(v, header_name)).transpose();
            let oauth = keep(&mut errors, name, "oauth", fields.get("oauth").map(oauth_spec).transpose());
            match (url, keep(&mut errors, name, "headers", headers), oauth) {
                (Some(url), Some(headers), Some(oauth)) => {
                    let headers = headers.unwrap_or_default();
                    if oauth.is_some() && headers.keys().any(|k| k.eq_ignore_ascii_case("authorization")) {
                        let problem = "an OAuth-protected server's Authorization comes from its login; remove it";
                        errors.push(ServerError::new(name, Some("headers"), problem));
                        return Err(errors);
                    }
                    Transport::Http { url, headers, oauth }
                }
                _ => return Err(errors),
            }
        }
    };
    let revision = match fields.get("protocolVersion") {
        None => Some(Revision::Negotiated),
        Some(Value::String(v)) if Revision::parse(v).is_some() => Revision::parse(v),
        Some(_) => keep(
            &mut errors,
            name,
            "protocolVersion",
            Err(format!(
                "one of {} (absent: negotiated)",
                MODERN_PROTOCOLS
                    .iter()
                    .chain(&LEGACY_PROTOCOLS)
                    .map(|v| format!("\"{v}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        ),
    };
    let tasks = keep(&mut errors, name, "tasks", fields.get("tasks").map(task_tools).transpose());
    match (revision, tasks) {
        (Some(revision), Some(tasks)) if errors.is_empty() => {
            Ok(ServerDeclaration { name: server_name, transport, revision, tasks: tasks.unwrap_or_default() })
        }
        _ => Err(errors),
    }
}

/// The value, or `None` after recording the problem against `server`'s `field`.
fn keep<T, P: Into<String>>(
    errors: &mut Vec<ServerError>,
    server: &str,
    field: &str,
    result: Result<T, P>,
) -> Option<T> {
    result.map_err(|problem| errors.push(ServerError::new(server, Some(field), problem))).ok()
}

fn required_string(value: Option<&Value>) -> Result<&str, String> {
    match value {
        None => Err("required".to_owned()),
        Some(Value::String(s)) if s.is_empty() => Err("must not be empty".to_owned()),
        Some(Value::String(s)) if s.contains('\0') => Err("must not contain NUL".to_owned()),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err("expected a string".to_owned()),
    }
}

fn no_references(s: &str) -> Result<(), String> {
    if s.contains("${") {
        Err("references (`${...}`) are only resolved in args, env and headers".to_owned())
    } else {
        Ok(())
    }
}

fn string_array(value: &Value) -> Result<Vec<String>, String> {
    let items = value.as_array().ok_or("expected an array of strings")?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let s = item.as_str().ok_or_else(|| format!("expected an array of strings (item {i} is not a string)"))?;
            checked_template(s).map_err(|p| format!("item {i}: {p}"))?;
            Ok(s.to_owned())
        })
        .collect()
}

fn string_map(value: &Value, check_key: fn(&str) -> Result<(), String>) -> Result<BTreeMap<String, String>, String> {
    let object = value.as_object().ok_or("expected an object of strings")?;
    object
        .iter()
        .map(|(key, value)| {
            check_key(key)?;
            let value = value.as_str().ok_or_else(|| format!("the value of {key:?} is not a string"))?;
            checked_template(value).map_err(|p| format!("the value of {key:?}: {p}"))?;
            Ok((key.clone(), value.to_owned()))
        })
        .collect()
}

/// The `oauth` field: an object of `tokens`, `scopes` and `client_id`, each optional.
fn oauth_spec(value: &Value) -> Result<OAuthSpec, String> {
    let fields = value.as_object().ok_or("expected an object (`{}` for the defaults)")?;
    if let Some(key) = fields.keys().find(|k| !["tokens", "scopes", "client_id"].contains(&k.as_str())) {
        return Err(format!("unknown key {key:?} (expected tokens, scopes, client_id)"));
    }
    let tokens = match fields.get("tokens") {
        None => TokenScope::Tenant,
        Some(Value::String(t)) if t == "tenant" => TokenScope::Tenant,
        Some(Value::String(t)) if t == "user" => TokenScope::User,
        Some(_) => return Err("`tokens` is \"tenant\" or \"user\"".to_owned()),
    };
    let scopes = match fields.get("scopes") {
        None => Vec::new(),
        Some(value) => {
            let items = value.as_array().ok_or("`scopes` is an array of strings")?;
            let scopes: Option<Vec<String>> = items
                .iter()
                .map(|s| {
                    s.as_str()
                        .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic() && c != '"' && c != '\\'))
                        .map(str::to_owned)
                })
                .collect();
            scopes.ok_or("`scopes` holds scope tokens (printable ASCII, no spaces or quotes)")?
        }
    };
    let client_id = match fields.get("client_id") {
        None => None,
        Some(Value::String(id)) if !id.is_empty() && id.len() <= 256 && !id.contains(['\0', '$']) => Some(id.clone()),
        Some(_) => {
            return Err("`client_id` is a non-empty string of at most 256 characters, without references".to_owned());
        }
    };
    Ok(OAuthSpec { tokens, scopes, client_id })
}

/// Whether a `headers` value reads a variable (`${NAME}` or `${env:NAME}`, not `$${`).
fn has_reference(value: &str) -> bool {
    template(value).is_ok_and(|parts| parts.iter().any(|p| matches!(p, Part::Executor(_) | Part::Gateway(_))))
}

fn env_name(key: &str) -> Result<(), String> {
    if key.is_empty() || key.contains(['=', '\0']) {
        return Err(format!("{key:?} is not a valid environment variable name"));
    }
    Ok(())
}

fn header_name(key: &str) -> Result<(), String> {
    http::HeaderName::from_bytes(key.as_bytes()).map(drop).map_err(|_| format!("{key:?} is not a valid header name"))
}

fn cwd_string(value: &Value) -> Result<&str, String> {
    let cwd = required_string(Some(value))?;
    no_references(cwd)?;
    Ok(cwd)
}

fn http_url(url: &str) -> Result<String, String> {
    no_references(url)?;
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("expected an http or https URL, not {:?}", parsed.scheme()));
    }
    if parsed.host().is_none() {
        return Err("the URL has no host".to_owned());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("credentials belong in headers, not in the URL".to_owned());
    }
    Ok(url.to_owned())
}

enum Part<'a> {
    Text(&'a str),
    /// `${NAME}`: the executor's environment.
    Executor(&'a str),
    /// `${env:NAME}`: the gateway's own environment.
    Gateway(&'a str),
}

fn template(mut rest: &str) -> Result<Vec<Part<'_>>, String> {
    let mut parts = Vec::new();
    while let Some(start) = rest.find("${") {
        if rest[..start].ends_with('$') {
            parts.push(Part::Text(&rest[..start - 1]));
            parts.push(Part::Text("${"));
            rest = &rest[start + 2..];
            continue;
        }
        parts.push(Part::Text(&rest[..start]));
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or("unclosed `${` (write `$${` for a literal `${`)")?;
        let inner = &after[..end];
        let (gateway, var) = match inner.strip_prefix("env:") {
            Some(var) => (true, var),
            None => (false, inner),
        };
        let mut chars = var.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("`${{{inner}}}` is not a reference (expected `${{NAME}}` or `${{env:NAME}}`)"));
        }
        parts.push(if gateway { Part::Gateway(var) } else { Part::Executor(var) });
        rest = &after[end + 1..];
    }
    parts.push(Part::Text(rest));
    Ok(parts)
}

fn checked_template(s: &str) -> Result<(), String> {
    template(s).map(drop)
}

/// Resolves the references of one `args`, `env` or `headers` value on `executor`'s environment.
/// For an executor whose environment is elsewhere ([`ExecutorEnv::deferred`]), the value is
/// checked (syntax, and no `${env:NAME}`) and kept as written: the remote agent resolves it on
/// its own machine with this same function.
pub fn expand(text: &str, env: &dyn ExecutorEnv, executor: &ExecutorId) -> Result<String, String> {
    let parts = template(text)?;
    if env.deferred() {
        if let Some(Part::Gateway(var)) = parts.iter().find(|p| matches!(p, Part::Gateway(_))) {
            return Err(format!(
                "`${{env:{var}}}` forwards the gateway's own environment, refused for the remote executor {:?}",
                executor.as_str()
            ));
        }
        if text.contains('\0') {
            return Err("a value contains NUL".to_owned());
        }
        return Ok(text.to_owned());
    }
    let mut out = String::new();
    for part in parts {
        match part {
            Part::Text(t) => out.push_str(t),
            Part::Executor(var) => {
                let value = env.var(var).ok_or_else(|| format!("variable {var:?} is not set on executor {executor:?}"));
                out.push_str(&value?);
            }
            Part::Gateway(var) if !env.is_local() => {
                return Err(format!(
                    "`${{env:{var}}}` forwards the gateway's own environment, refused for the remote executor {:?}",
                    executor.as_str()
                ));
            }
            Part::Gateway(var) => {
                let value = env.var(var).ok_or_else(|| format!("gateway variable {var:?} is not set"));
                out.push_str(&value?);
            }
        }
    }
    if out.contains('\0') {
        return Err("a resolved value contains NUL".to_owned());
    }
    Ok(out)
}

/// Why a `cwd` can't be used, and whether that is because it leaves the root (the plugin root,
/// or for a declared file its folder).
struct CwdProblem {
    text: String,
    outside_root: bool,
}

impl From<String> for CwdProblem {
    fn from(text: String) -> Self {
        Self { text, outside_root: false }
    }
}

impl From<&str> for CwdProblem {
    fn from(text: &str) -> Self {
        text.to_owned().into()
    }
}

impl From<PathError> for CwdProblem {
    fn from(e: PathError) -> Self {
        Self { outside_root: matches!(e, PathError::Escapes(_)), text: e.to_string() }
    }
}

fn resolve_cwd(cwd: Option<&str>, placement: &Placement) -> Result<PathUri, CwdProblem> {
    let (base, root) = match placement {
        Placement::Declared { file } => (file.parent().ok_or("the declaring file has no folder")?, None),
        Placement::Environment { root, .. } => (root.clone(), Some(root)),
    };
    let Some(cwd) = cwd else { return Ok(base) };
    let style = base.style();
    let has_scheme = |s: &str| {
        let scheme = s.split(':').next().unwrap_or_default();
        s.contains(':')
            && scheme.len() > 1
            && scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    };
    if cwd.get(..5).is_some_and(|s| s.eq_ignore_ascii_case("file:")) {
        let path = PathUri::parse(cwd, style)?;
        return match root {
            Some(root) if !root.contains(&path) => {
                Err(CwdProblem { text: format!("{path} is outside the plugin root {root}"), outside_root: true })
            }
            _ => Ok(path),
        };
    }
    let drive = cwd.as_bytes().get(1) == Some(&b':') && cwd.as_bytes()[0].is_ascii_alphabetic();
    if cwd.starts_with(['/', '\\', '~']) || drive {
        return Err(format!("{cwd:?} is a native path; write a file: URI or a path relative to {base}").into());
    }
    if has_scheme(cwd) {
        return Err(format!("{cwd:?} is not a file: URI").into());
    }
    Ok(base.join(cwd)?)
}

/// The servers of a file in document order, duplicates kept so they can be reported.
struct File(Vec<(String, Value)>);

/// A JSON object with its keys in document order, duplicates kept.
struct Object(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Object;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of MCP servers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Object(entries))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

impl<'de> Deserialize<'de> for File {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FileVisitor;
        impl<'de> Visitor<'de> for FileVisitor {
            type Value = File;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of MCP servers, or an object with \"mcpServers\"")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<File, A::Error> {
                let mut top = Vec::new();
                let mut wrapped: Option<Object> = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "mcpServers" {
                        if wrapped.is_some() {
                            return Err(de::Error::duplicate_field("mcpServers"));
                        }
                        wrapped = Some(map.next_value()?);
                    } else {
                        top.push((key, map.next_value()?));
                    }
                }
                Ok(File(wrapped.map_or(top, |o| o.0)))
            }
        }
        deserializer.deserialize_map(FileVisitor)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::decl::PathStyle::{self, Posix, Windows};

    struct Env {
        local: bool,
        vars: HashMap<&'static str, &'static str>,
    }

    impl ExecutorEnv for Env {
        fn var(&self, name: &str) -> Option<String> {
            self.vars.get(name).map(|v| (*v).to_owned())
        }
        fn is_local(&self) -> bool {
            self.local
        }
    }

    /// Which error a refused file must produce.
    type Expect = fn(&FileError) -> bool;
    /// The resolved cwd, or a piece of the error's text.
    type Outcome = Result<&'static str, &'static str>;

    fn env(local: bool) -> Env {
        Env { local, vars: HashMap::from([("TOKEN", "t0k"), ("HOME", "/home/u"), ("EMPTY", "")]) }
    }

    fn uri(s: &str, style: PathStyle) -> PathUri {
        PathUri::parse(s, style).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn parse(json: &str) -> Declarations {
        parse_declarations(json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    fn one(json: &str) -> ServerDeclaration {
        let parsed = parse(json);
        assert!(parsed.errors.is_empty(), "{json}: {:?}", parsed.errors);
        assert_eq!(parsed.servers.len(), 1, "{json}");
        parsed.servers.into_iter().next().expect("one server")
    }

    fn names(d: &Declarations) -> Vec<&str> {
        d.servers.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn both_shapes_parse() {
        let rows = [
            ("top-level map", r#"{"a": {"command": "x"}, "b": {"url": "https://h/mcp"}}"#, vec!["a", "b"]),
            ("mcpServers", r#"{"mcpServers": {"b": {"command": "x"}, "a": {"url": "http://h"}}}"#, vec!["b", "a"]),
            ("mcpServers beside other keys", r#"{"$schema": 1, "mcpServers": {"a": {"command": "x"}}}"#, vec!["a"]),
            ("empty file", "{}", vec![]),
            ("empty mcpServers", r#"{"mcpServers": {}}"#, vec![]),
        ];
        for (why, json, want) in rows {
            let parsed = parse(json);
            assert!(parsed.errors.is_empty(), "{why}: {:?}", parsed.errors);
            assert_eq!(names(&parsed), want, "{why}");
        }
    }

    #[test]
    fn servers_parse_into_transports() {
        let stdio = one(
            r#"{"db": {"type": "stdio", "command": "node", "args": ["s.js", "${TOKEN}"], "env": {"A": "1"}, "cwd": "srv"}}"#,
        );
        let want = Transport::Stdio {
            command: "node".into(),
            args: vec!["s.js".into(), "${TOKEN}".into()],
            env: BTreeMap::from([("A".into(), "1".into())]),
            cwd: Some("srv".into()),
        };
        assert_eq!(stdio.transport, want, "stdio keeps references unresolved");
        for t in ["http", "streamable-http"] {
            let http =
                one(&format!(r#"{{"api": {{"type": "{t}", "url": "https://h/mcp", "headers": {{"X-K": "v"}}}}}}"#));
            let want = Transport::Http {
                url: "https://h/mcp".into(),
                headers: BTreeMap::from([("X-K".into(), "v".into())]),
                oauth: None,
            };
            assert_eq!(http.transport, want, "type {t}");
        }
    }

    #[test]
    fn one_bad_server_keeps_its_two_good_siblings() {
        let parsed = parse(
            r#"{"good1": {"command": "a"}, "db": {"command": "b", "args": "oops"}, "good2": {"url": "https://h"}}"#,
        );
        assert_eq!(names(&parsed), ["good1", "good2"]);
        let errors: Vec<String> = parsed.errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors, [r#"server "db": field "args": expected an array of strings"#]);
    }

    #[test]
    fn whole_file_failures() {
        let rows: [(&str, &str, Expect); 7] = [
            ("malformed", r#"{"a": {"command": "x"}"#, |e| matches!(e, FileError::Malformed(_))),
            ("trailing garbage", r#"{} x"#, |e| matches!(e, FileError::Malformed(_))),
            ("empty input", "", |e| matches!(e, FileError::Malformed(_))),
            ("top-level array", "[]", |e| matches!(e, FileError::NotAnObject(_))),
            ("top-level string", r#""servers""#, |e| matches!(e, FileError::NotAnObject(_))),
            ("mcpServers not an object", r#"{"mcpServers": []}"#, |e| matches!(e, FileError::NotAnObject(_))),
            ("mcpServers twice", r#"{"mcpServers": {}, "mcpServers": {}}"#, |e| matches!(e, FileError::NotAnObject(_))),
        ];
        for (why, json, expected) in rows {
            match parse_declarations(json) {
                Ok(d) => panic!("{why}: parsed {d:?}"),
                Err(e) => assert!(expected(&e), "{why}: unexpected {e:?}"),
            }
        }
    }

    /// Each row: a server body and the one error it must produce.
    #[test]
    fn field_errors_name_server_and_field() {
        let rows = [
            ("command missing", r#"{"type": "stdio"}"#, Some("command"), "required"),
            ("command not a string", r#"{"command": 1}"#, Some("command"), "expected a string"),
            ("command empty", r#"{"command": ""}"#, Some("command"), "must not be empty"),
            ("command reference", r#"{"command": "${X}"}"#, Some("command"), "references"),
            ("args not an array", r#"{"command": "x", "args": "a b"}"#, Some("args"), "expected an array of strings"),
            ("args item not a string", r#"{"command": "x", "args": ["a", 2]}"#, Some("args"), "item 1 is not a string"),
            ("args bad reference", r#"{"command": "x", "args": ["${1X}"]}"#, Some("args"), "not a reference"),
            ("args unclosed reference", r#"{"command": "x", "args": ["${X"]}"#, Some("args"), "unclosed"),
            ("env not an object", r#"{"command": "x", "env": ["A=1"]}"#, Some("env"), "expected an object of strings"),
            ("env value not a string", r#"{"command": "x", "env": {"A": 1}}"#, Some("env"), r#""A" is not a string"#),
            ("env bad name", r#"{"command": "x", "env": {"A=B": "1"}}"#, Some("env"), "not a valid environment"),
            ("env bad reference", r#"{"command": "x", "env": {"A": "${}"}}"#, Some("env"), "not a reference"),
            ("cwd not a string", r#"{"command": "x", "cwd": ["a"]}"#, Some("cwd"), "expected a string"),
            ("cwd empty", r#"{"command": "x", "cwd": ""}"#, Some("cwd"), "must not be empty"),
            ("cwd reference", r#"{"command": "x", "cwd": "${HOME}/p"}"#, Some("cwd"), "references"),
            ("url missing", r#"{"type": "http"}"#, Some("url"), "required"),
            ("url not a string", r#"{"url": 8080}"#, Some("url"), "expected a string"),
            ("url not a URL", r#"{"url": "not a url"}"#, Some("url"), "not a URL"),
            ("url not http", r#"{"url": "ftp://h/x"}"#, Some("url"), "expected an http or https URL"),
            ("url with credentials", r#"{"url": "https://u:p@h/x"}"#, Some("url"), "credentials belong in headers"),
            ("url reference", r#"{"url": "https://${HOST}/x"}"#, Some("url"), "references"),
            (
                "headers not an object",
                r#"{"url": "https://h", "headers": "A: b"}"#,
                Some("headers"),
                "expected an object",
            ),
            (
                "header value not a string",
                r#"{"url": "https://h", "headers": {"A": true}}"#,
                Some("headers"),
                "not a string",
            ),
            (
                "header bad name",
                r#"{"url": "https://h", "headers": {"A B": "x"}}"#,
                Some("headers"),
                "not a valid header name",
            ),
            ("type not a string", r#"{"type": 1, "command": "x"}"#, Some("type"), "expected a string"),
            ("type unknown", r#"{"type": "grpc", "command": "x"}"#, Some("type"), "unknown type"),
            ("type sse", r#"{"type": "sse", "url": "https://h"}"#, Some("type"), "SSE transport is not supported"),
            (
                "stdio type with url",
                r#"{"type": "stdio", "command": "x", "url": "https://h"}"#,
                Some("url"),
                "not allowed for a stdio",
            ),
            (
                "http type with command",
                r#"{"type": "http", "url": "https://h", "command": "x"}"#,
                Some("command"),
                "not allowed",
            ),
            ("http with cwd", r#"{"url": "https://h", "cwd": "x"}"#, Some("cwd"), "not allowed for a Streamable HTTP"),
            ("stdio with headers", r#"{"command": "x", "headers": {}}"#, Some("headers"), "not allowed for a stdio"),
            ("unknown field", r#"{"command": "x", "disabled": true}"#, Some("disabled"), "unknown field"),
            ("misspelt field", r#"{"command": "x", "cdw": "sub"}"#, Some("cdw"), "unknown field"),
            ("both command and url", r#"{"command": "x", "url": "https://h"}"#, None, "has both"),
            ("neither", r#"{"args": []}"#, None, "needs \"command\""),
            ("not an object", r#""npx server""#, None, "expected an object"),
        ];
        for (why, body, field, problem) in rows {
            let parsed = parse(&format!(r#"{{"s": {body}, "ok": {{"command": "x"}}}}"#));
            assert_eq!(names(&parsed), ["ok"], "{why}: the sibling survives");
            let [error] = parsed.errors.as_slice() else {
                panic!("{why}: expected one error, got {:?}", parsed.errors)
            };
            assert_eq!(error.server, "s", "{why}");
            assert_eq!(error.field.as_deref(), field, "{why}: {error}");
            assert!(error.problem.contains(problem), "{why}: {error}");
        }
    }

    #[test]
    fn every_bad_field_of_a_server_is_reported() {
        let parsed = parse(r#"{"s": {"command": 1, "args": {}, "env": [], "cwd": 2, "extra": 0}}"#);
        let mut fields: Vec<_> = parsed.errors.iter().filter_map(|e| e.field.as_deref()).collect();
        fields.sort_unstable();
        assert_eq!(fields, ["args", "command", "cwd", "env", "extra"]);
    }

    #[test]
    fn server_names() {
        let long = "a".repeat(64);
        let too_long = "a".repeat(65);
        let rows = [
            ("letters digits dash underscore", "my-db_2", true),
            ("64 characters", long.as_str(), true),
            ("single underscore inside", "a_b", true),
            ("leading underscore", "_a", true),
            ("empty", "", false),
            ("65 characters", too_long.as_str(), false),
            ("double underscore", "a__b", false),
            ("trailing underscore makes server__tool ambiguous", "a_", false),
            ("dot", "a.b", false),
            ("space", "a b", false),
            ("slash", "a/b", false),
            ("non-ASCII", "café", false),
        ];
        for (why, name, ok) in rows {
            let file = Value::Object(serde_json::Map::from_iter([(name.to_owned(), json!({"command": "x"}))]));
            let parsed = parse(&file.to_string());
            assert_eq!(parsed.servers.len() == 1, ok, "{why}: {:?}", parsed.errors);
            if !ok {
                assert_eq!(parsed.errors[0].server, name, "{why}");
                assert_eq!(parsed.errors[0].field, None, "{why}");
            }
        }
    }

    #[test]
    fn duplicate_server_names_are_refused_together() {
        let parsed = parse(r#"{"a": {"command": "x"}, "b": {"command": "y"}, "a": {"command": "z"}}"#);
        assert_eq!(names(&parsed), ["b"]);
        assert_eq!(parsed.errors.len(), 1);
        assert_eq!(parsed.errors[0].to_string(), r#"server "a": declared more than once"#);
    }

    fn resolve_cwd_for(cwd: Option<&str>, placement: &Placement) -> Result<String, Vec<ServerError>> {
        let cwd = cwd.map_or(String::new(), |c| format!(r#", "cwd": {}"#, json!(c)));
        let server = one(&format!(r#"{{"s": {{"command": "x"{cwd}}}}}"#));
        let resolved = server.resolve(placement, &env(true))?;
        match resolved.transport {
            ResolvedTransport::Stdio { cwd, .. } => Ok(cwd.to_string()),
            ResolvedTransport::Http { .. } => panic!("stdio expected"),
        }
    }

    #[test]
    fn cwd_placement_rules() {
        let declared = Placement::Declared { file: uri("file:///etc/scopegate/.mcp.json", Posix) };
        let env_posix =
            Placement::Environment { executor: ExecutorId::new("build-01"), root: uri("file:///srv/p", Posix) };
        let env_windows = Placement::Environment {
            executor: ExecutorId::new("win-01"),
            root: uri("file:///C:/plugins/demo", Windows),
        };
        let env_unc = Placement::Environment {
            executor: ExecutorId::new("win-02"),
            root: uri("file://fs/plugins/demo", Windows),
        };
        let rows: [(&str, &Placement, Option<&str>, Outcome); 33] = [
            ("declared: missing cwd is the file's folder", &declared, None, Ok("file:///etc/scopegate")),
            (
                "declared: relative against the folder",
                &declared,
                Some("tools/db"),
                Ok("file:///etc/scopegate/tools/db"),
            ),
            ("declared: can't climb out", &declared, Some("../x"), Err("climbs out")),
            ("declared: absolute file: anywhere", &declared, Some("file:///opt/x"), Ok("file:///opt/x")),
            ("declared: native absolute refused", &declared, Some("/opt/x"), Err("native path")),
            ("env: missing cwd is the root", &env_posix, None, Ok("file:///srv/p")),
            ("env: relative under the root", &env_posix, Some("bin/db"), Ok("file:///srv/p/bin/db")),
            ("env: dot is the root", &env_posix, Some("."), Ok("file:///srv/p")),
            ("env: dot-dot inside", &env_posix, Some("a/../b"), Ok("file:///srv/p/b")),
            ("env: climb out", &env_posix, Some("../../etc"), Err("climbs out")),
            ("env: climb after descending", &env_posix, Some("a/../../p2"), Err("climbs out")),
            ("env: encoded dots are literal names", &env_posix, Some("%2e%2e/x"), Ok("file:///srv/p/%252e%252e/x")),
            ("env: backslash climb on POSIX", &env_posix, Some("..\\..\\etc"), Err("separator")),
            ("env: file: inside the root", &env_posix, Some("file:///srv/p/sub"), Ok("file:///srv/p/sub")),
            ("env: file: is the root", &env_posix, Some("file:///srv/p"), Ok("file:///srv/p")),
            ("env: file: outside the root", &env_posix, Some("file:///etc"), Err("outside the plugin root")),
            ("env: file: sibling prefix", &env_posix, Some("file:///srv/px"), Err("outside the plugin root")),
            ("env: file: climbs out", &env_posix, Some("file:///srv/p/../../etc"), Err("outside the plugin root")),
            ("env: file: encoded climb", &env_posix, Some("file:///srv/p/%2e%2e/q"), Err("outside the plugin root")),
            (
                "env: file: encoded slash",
                &env_posix,
                Some("file:///srv/p/..%2f..%2fetc"),
                Err("encodes a path separator"),
            ),
            ("env: native absolute", &env_posix, Some("/srv/p/sub"), Err("native path")),
            ("env: home-relative", &env_posix, Some("~/p"), Err("native path")),
            ("env: other scheme", &env_posix, Some("https://h/x"), Err("not a file: URI")),
            ("win: relative backslashes", &env_windows, Some("bin\\db"), Ok("file:///C:/plugins/demo/bin/db")),
            ("win: mixed separators", &env_windows, Some("bin/x\\..\\db"), Ok("file:///C:/plugins/demo/bin/db")),
            ("win: climb out", &env_windows, Some("..\\..\\Windows"), Err("climbs out")),
            (
                "win: file: lower-case drive inside",
                &env_windows,
                Some("file:///c:/plugins/demo/x"),
                Ok("file:///C:/plugins/demo/x"),
            ),
            ("win: file: other drive", &env_windows, Some("file:///D:/plugins/demo"), Err("outside the plugin root")),
            ("win: native drive path", &env_windows, Some("C:\\plugins\\demo\\x"), Err("native path")),
            ("win: drive-relative", &env_windows, Some("C:x"), Err("native path")),
            ("win: drive-relative URI", &env_windows, Some("file:///C:x"), Err("drive-relative")),
            ("unc: relative", &env_unc, Some("bin"), Ok("file://fs/plugins/demo/bin")),
            ("unc: climb out of the share", &env_unc, Some("..\\..\\..\\other"), Err("climbs out")),
        ];
        for (why, placement, cwd, want) in rows {
            match (resolve_cwd_for(cwd, placement), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{why}"),
                (Err(errors), Err(want)) => {
                    let [error] = errors.as_slice() else { panic!("{why}: {errors:?}") };
                    assert_eq!(error.field.as_deref(), Some("cwd"), "{why}");
                    assert!(error.problem.contains(want), "{why}: {error}");
                }
                (got, want) => panic!("{why}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn references_resolve_on_the_executor() {
        let server = one(
            r#"{"s": {"command": "x", "args": ["--t=${TOKEN}", "$${LITERAL}", "${EMPTY}"], "env": {"H": "${HOME}/.cache", "G": "${env:TOKEN}"}}}"#,
        );
        let placement = Placement::Environment { executor: ExecutorId::local(), root: uri("file:///srv/p", Posix) };
        let resolved = server.resolve(&placement, &env(true)).expect("resolves");
        let ResolvedTransport::Stdio { args, env: vars, .. } = resolved.transport else { panic!("stdio") };
        assert_eq!(args, ["--t=t0k", "${LITERAL}", ""]);
        assert_eq!(vars, BTreeMap::from([("H".into(), "/home/u/.cache".into()), ("G".into(), "t0k".into())]));

        let http = one(r#"{"api": {"url": "https://h/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}}"#);
        let resolved = http.resolve(&placement, &env(true)).expect("resolves");
        let ResolvedTransport::Http { headers, .. } = resolved.transport else { panic!("http") };
        assert_eq!(headers["Authorization"], "Bearer t0k");
    }

    #[test]
    fn reference_errors_name_server_and_field() {
        let remote =
            Placement::Environment { executor: ExecutorId::new("build-01"), root: uri("file:///srv/p", Posix) };
        let rows = [
            (
                "unset in args",
                r#"{"command": "x", "args": ["${NOPE}"]}"#,
                true,
                "args",
                r#"variable "NOPE" is not set on executor"#,
            ),
            ("unset in env", r#"{"command": "x", "env": {"A": "${NOPE}"}}"#, true, "env", r#""NOPE" is not set"#),
            ("unset in headers", r#"{"url": "https://h", "headers": {"A": "${NOPE}"}}"#, true, "headers", "not set"),
            (
                "gateway env in args, remote",
                r#"{"command": "x", "args": ["${env:TOKEN}"]}"#,
                false,
                "args",
                "refused for the remote executor \"build-01\"",
            ),
            (
                "gateway env in env, remote",
                r#"{"command": "x", "env": {"T": "${env:TOKEN}"}}"#,
                false,
                "env",
                "forwards the gateway's own environment",
            ),
            (
                "gateway env in headers, remote",
                r#"{"url": "https://h", "headers": {"A": "${env:TOKEN}"}}"#,
                false,
                "headers",
                "refused",
            ),
            (
                "gateway env unset, local",
                r#"{"command": "x", "args": ["${env:NOPE}"]}"#,
                true,
                "args",
                "gateway variable \"NOPE\" is not set",
            ),
        ];
        for (why, body, local, field, problem) in rows {
            let server = one(&format!(r#"{{"db": {body}}}"#));
            let errors = server.resolve(&remote, &env(local)).expect_err(why);
            let [error] = errors.as_slice() else { panic!("{why}: {errors:?}") };
            assert_eq!((error.server.as_str(), error.field.as_deref()), ("db", Some(field)), "{why}");
            assert!(error.problem.contains(problem), "{why}: {error}");
        }
        let server = one(r#"{"db": {"command": "x", "args": ["${TOKEN}"]}}"#);
        assert!(server.resolve(&remote, &env(false)).is_ok(), "executor variables are fine on a remote executor");
    }

    /// A remote executor's server gets no header out of an environment: not the gateway's,
    /// not the executor's (its login replaces them); literal headers still go.
    #[test]
    fn header_references_are_refused_for_a_remote_executor() {
        let remote =
            Placement::Environment { executor: ExecutorId::new("build-01"), root: uri("file:///srv/p", Posix) };
        for value in ["Bearer ${TOKEN}", "${env:TOKEN}"] {
            let server =
                one(&format!(r#"{{"api": {{"url": "https://h", "headers": {{"Authorization": "{value}"}}}}}}"#));
            let errors = server.resolve(&remote, &env(false)).expect_err(value);
            assert_eq!(errors[0].field.as_deref(), Some("headers"), "{value}");
            assert!(errors[0].problem.contains("remote executor"), "{}", errors[0]);
            assert!(server.resolve(&remote, &env(true)).is_ok(), "allowed on the local executor: {value}");
        }
        let literal = one(r#"{"api": {"url": "https://h", "headers": {"X-Team": "blue", "X-L": "$${x}"}}}"#);
        assert!(literal.resolve(&remote, &env(false)).is_ok(), "no reference, nothing refused");
    }

    #[test]
    fn protocol_version_pins_a_known_revision_or_is_negotiated_and_round_trips() {
        let modern = one(r#"{"m": {"command": "x", "protocolVersion": "2026-07-28"}}"#);
        assert_eq!(modern.revision, Revision::Modern("2026-07-28"));
        assert_eq!(modern.to_json()["protocolVersion"], "2026-07-28");
        let legacy = one(r#"{"m": {"command": "x", "protocolVersion": "2025-06-18"}}"#);
        assert_eq!(legacy.revision, Revision::Legacy("2025-06-18"));
        assert_eq!(one(r#"{"m": {"command": "x"}}"#).revision, Revision::Negotiated);
        assert!(one(r#"{"m": {"command": "x"}}"#).to_json().get("protocolVersion").is_none());
        for pinned in [&modern, &legacy] {
            let stored = serde_json::json!({ "m": pinned.to_json() });
            let back = parse_declarations(&stored.to_string()).unwrap();
            assert_eq!(back.servers[0].revision, pinned.revision, "parses back");
        }
        for value in [r#""2026-07-29""#, r#""1900-01-01""#, "20260728", r#""""#, "null"] {
            let file = format!(r#"{{"m": {{"command": "x", "protocolVersion": {value}}}}}"#);
            let bad = parse_declarations(&file).unwrap();
            assert!(bad.servers.is_empty(), "{value}");
            assert_eq!(bad.errors[0].field.as_deref(), Some("protocolVersion"), "{value}: {:?}", bad.errors);
        }
    }

    #[test]
    fn tasks_names_tools_the_gateway_runs_as_tasks_and_round_trips() {
        let declared = one(r#"{"m": {"command": "x", "tasks": {"a": "optional", "b": "required",
                "c": {"support": "required", "inputBeforeTask": true}, "d": {"support": "optional"}}}}"#);
        let tool = |support, input_before_task| TaskTool { support, input_before_task };
        let want: TaskTools = [
            ("a".to_owned(), tool(TaskSupport::Optional, false)),
            ("b".to_owned(), tool(TaskSupport::Required, false)),
            ("c".to_owned(), tool(TaskSupport::Required, true)),
            ("d".to_owned(), tool(TaskSupport::Optional, false)),
        ]
        .into();
        assert_eq!(declared.tasks, want);
        let stored = serde_json::json!({ "m": declared.to_json() });
        assert_eq!(stored["m"]["tasks"]["c"], serde_json::json!({"support": "required", "inputBeforeTask": true}));
        assert_eq!(parse_declarations(&stored.to_string()).unwrap().servers[0].tasks, want, "parses back");
        assert!(one(r#"{"m": {"command": "x"}}"#).to_json().get("tasks").is_none());
        for value in [
            r#"["a"]"#,
            r#"{"a": "sometimes"}"#,
            r#"{"a": true}"#,
            r#"{"": "optional"}"#,
            r#"{"a": {"support": "required", "inputBeforeTask": "yes"}}"#,
            r#"{"a": {"support": "required", "retries": 3}}"#,
            r#"{"a": {}}"#,
        ] {
            let file = format!(r#"{{"m": {{"command": "x", "tasks": {value}}}}}"#);
            let bad = parse_declarations(&file).unwrap();
            assert!(bad.servers.is_empty(), "{value}");
            assert_eq!(bad.errors[0].field.as_deref(), Some("tasks"), "{value}: {:?}", bad.errors);
        }
    }

    #[test]
    fn oauth_field_is_parsed_and_checked() {
        let api = one(r#"{"api": {"url": "https://h/mcp", "oauth": {}}}"#);
        let want = OAuthSpec { tokens: TokenScope::Tenant, scopes: vec![], client_id: None };
        assert!(matches!(&api.transport, Transport::Http { oauth: Some(o), .. } if *o == want));
        let api = one(
            r#"{"api": {"url": "https://h/mcp", "oauth": {"tokens": "user", "scopes": ["mcp", "read:x"], "client_id": "c1"}}}"#,
        );
        let want = OAuthSpec {
            tokens: TokenScope::User,
            scopes: vec!["mcp".into(), "read:x".into()],
            client_id: Some("c1".into()),
        };
        assert!(matches!(&api.transport, Transport::Http { oauth: Some(o), .. } if *o == want));
        let resolved = api
            .resolve(
                &Placement::Environment { executor: ExecutorId::local(), root: uri("file:///srv/p", Posix) },
                &env(true),
            )
            .unwrap();
        assert!(
            matches!(resolved.transport, ResolvedTransport::Http { oauth: Some(o), .. } if o == want),
            "kept once resolved"
        );
        let bad = [
            (r#"{"url": "https://h", "oauth": true}"#, "oauth", "expected an object"),
            (r#"{"url": "https://h", "oauth": {"tokens": "group"}}"#, "oauth", "\"tenant\" or \"user\""),
            (r#"{"url": "https://h", "oauth": {"scope": []}}"#, "oauth", "unknown key"),
            (r#"{"url": "https://h", "oauth": {"scopes": ["a b"]}}"#, "oauth", "scope tokens"),
            (r#"{"url": "https://h", "oauth": {"client_id": "${ID}"}}"#, "oauth", "without references"),
            (r#"{"command": "x", "oauth": {}}"#, "oauth", "not allowed for a stdio"),
            (
                r#"{"url": "https://h", "oauth": {}, "headers": {"authorization": "Bearer x"}}"#,
                "headers",
                "comes from its login",
            ),
        ];
        for (body, field, problem) in bad {
            let errors = parse_declarations(&format!(r#"{{"db": {body}}}"#)).unwrap().errors;
            assert!(
                errors.iter().any(|e| e.field.as_deref() == Some(field) && e.problem.contains(problem)),
                "{body}: {errors:?}"
            );
        }
        // What an import stores (`to_json`) parses back to the same declaration.
        for text in [
            r#"{"api": {"url": "https://h/mcp", "oauth": {}}}"#,
            r#"{"api": {"url": "https://h/mcp", "oauth": {"tokens": "user", "client_id": "c1", "scopes": ["mcp"]}}}"#,
        ] {
            let declared = one(text);
            let stored = one(&json!({ "api": declared.to_json() }).to_string());
            assert_eq!(stored, declared, "{text}");
        }
        let plain = one(r#"{"api": {"url": "https://h"}}"#);
        let with = one(r#"{"api": {"url": "https://h", "oauth": {}}}"#);
        let at = Placement::Environment { executor: ExecutorId::local(), root: uri("file:///srv/p", Posix) };
        assert_ne!(
            plain.resolve(&at, &env(true)).unwrap().fingerprint(),
            with.resolve(&at, &env(true)).unwrap().fingerprint(),
            "a protected server never shares a connection with an unprotected one"
        );
    }

    #[test]
    fn header_values_must_stay_valid_once_resolved() {
        let server = one(r#"{"api": {"url": "https://h", "headers": {"A": "${BAD}"}}}"#);
        let mut e = env(true);
        e.vars.insert("BAD", "x\r\nInjected: 1");
        let placement = Placement::Environment { executor: ExecutorId::local(), root: uri("file:///srv/p", Posix) };
        let errors = server.resolve(&placement, &e).expect_err("CRLF refused");
        assert_eq!(errors[0].field.as_deref(), Some("headers"));
    }

    #[test]
    fn executor_comes_from_the_placement() {
        let server = one(r#"{"s": {"command": "x"}}"#);
        let declared = Placement::Declared { file: uri("file:///etc/sg/.mcp.json", Posix) };
        assert_eq!(server.resolve(&declared, &env(true)).expect("local").executor, ExecutorId::local());
        let errors = server.resolve(&declared, &env(false)).expect_err("declared needs the local executor");
        assert!(errors[0].problem.contains("local executor"), "{}", errors[0]);
        let placed =
            Placement::Environment { executor: ExecutorId::new("build-01"), root: uri("file:///srv/p", Posix) };
        assert_eq!(server.resolve(&placed, &env(false)).expect("remote").executor, ExecutorId::new("build-01"));
        let named = parse(r#"{"s": {"command": "x", "executor": "gw-host"}}"#);
        assert_eq!(named.errors[0].field.as_deref(), Some("executor"), "a declaration can't pick its executor");
    }

    #[test]
    fn fingerprint_is_stable_and_tracks_what_runs() {
        let placement = Placement::Environment { executor: ExecutorId::new("e1"), root: uri("file:///srv/p", Posix) };
        let fp = |json: &str, placement: &Placement, env: &Env| {
            one(json).resolve(placement, env).expect("resolves").fingerprint()
        };
        let base = fp(r#"{"s": {"command": "x", "env": {"A": "1", "B": "${TOKEN}"}}}"#, &placement, &env(false));
        assert_eq!(base.len(), 64, "SHA-256 hex");
        assert!(base.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let rows = [
            ("same text", r#"{"s": {"command": "x", "env": {"A": "1", "B": "${TOKEN}"}}}"#, true),
            ("key order does not matter", r#"{"s": {"env": {"B": "${TOKEN}", "A": "1"}, "command": "x"}}"#, true),
            ("same resolved value", r#"{"s": {"command": "x", "env": {"A": "1", "B": "t0k"}}}"#, true),
            (
                "explicit cwd equal to the default",
                r#"{"s": {"command": "x", "cwd": ".", "env": {"A": "1", "B": "t0k"}}}"#,
                true,
            ),
            ("env value changed", r#"{"s": {"command": "x", "env": {"A": "2", "B": "t0k"}}}"#, false),
            ("cwd changed", r#"{"s": {"command": "x", "cwd": "sub", "env": {"A": "1", "B": "t0k"}}}"#, false),
            ("name changed", r#"{"t": {"command": "x", "env": {"A": "1", "B": "t0k"}}}"#, false),
            ("args added", r#"{"s": {"command": "x", "args": [], "env": {"A": "1", "B": "t0k"}}}"#, true),
        ];
        for (why, json, same) in rows {
            assert_eq!(fp(json, &placement, &env(false)) == base, same, "{why}");
        }
        let other = Placement::Environment { executor: ExecutorId::new("e2"), root: uri("file:///srv/p", Posix) };
        let json = r#"{"s": {"command": "x", "env": {"A": "1", "B": "t0k"}}}"#;
        assert_ne!(fp(json, &other, &env(false)), base, "another executor is another connection");
        let mut changed = env(false);
        changed.vars.insert("TOKEN", "rotated");
        let with_ref = r#"{"s": {"command": "x", "env": {"A": "1", "B": "${TOKEN}"}}}"#;
        assert_ne!(fp(with_ref, &placement, &changed), base, "a changed executor value changes the fingerprint");
    }
}
