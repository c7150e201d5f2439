//! Tasks (`io.modelcontextprotocol/tasks`, SEP-2663) through the gateway, with rmcp's client on
//! 2026-07-28 in front and the fixture's `tasks` mode (an rmcp server on rmcp's task manager)
//! behind: a task-supporting tool answers a task under a handle the gateway minted, bound to
//! its caller; polls, answers and cancellation reach the upstream under its own id; a
//! foreign, forged, expired or no-longer-granted handle answers exactly as an unknown one; a
//! poll on another replica and on a new connection is answered; every step is audited.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig, CreateTaskResult,
    GetTaskParams, GetTaskResult, Implementation, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::{ErrorData, ServiceExt};
use scopegate::model::Role;
use scopegate::store::entities;
use serde_json::{Value, json};

use crate::support::*;

/// The server name the fixture is bound under (prefixed: `tk__slow_compute`).
const SERVER: &str = "tk";

/// The server name the fixture without the extension is bound under (`nx__slow_compute`):
/// the gateway runs the tools its declaration names as tasks itself.
const NX: &str = "nx";

/// A gateway with acme's `tk`: the fixture's `tasks` mode over Streamable HTTP (so another
/// replica reaches the same upstream), and `nx`: the same without the extension; every tool
/// granted to owners and workers. Their cancelled tasks are marked in `marks`.
struct Tasks {
    live: Live,
    _fixtures: [tokio::process::Child; 2],
    marks: tempfile::NamedTempFile,
}

impl Tasks {
    async fn start(backend: Backend) -> Self {
        Self::start_with(backend, &[]).await
    }

    async fn start_with(backend: Backend, overrides: &[(&str, Value)]) -> Self {
        let marks = tempfile::NamedTempFile::new().unwrap();
        let mark_file = marks.path().display().to_string();
        let env = [("FIXTURE_MARK_FILE", mark_file.as_str())];
        let (tk, tk_addr) = fixture_http(&["tasks", "http", "127.0.0.1:0"], &env).await;
        let (nx, nx_addr) = fixture_http(&["tasks", "http", "127.0.0.1:0", "--no-extension"], &env).await;
        let mut all = vec![("upstream.connect_timeout_secs", json!(10))];
        all.extend(overrides.iter().cloned());
        let live = Live::start(backend, Mode::Stateless, &all).await;
        let mut tx = live.db.begin().await.unwrap();
        entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
        let tasks = json!({
            "slow_compute": "optional",
            "failing_job": "required",
            "confirm_delete": "optional",
            "test_tool_with_task": {"support": "required", "inputBeforeTask": true},
        });
        let servers = [
            (SERVER, json!({"type": "http", "url": format!("http://{tk_addr}/mcp"), "protocolVersion": "2026-07-28"})),
            (NX, json!({"type": "http", "url": format!("http://{nx_addr}/mcp"), "tasks": tasks})),
        ];
        for (server, declaration) in servers {
            entities::create_entity(&mut tx, "acme", &format!("defaults/mcp-servers/{server}"), &declaration)
                .await
                .unwrap();
            entities::bind_server(&mut tx, "acme", server, "local").await.unwrap();
            for role in [Role::Owner, Role::Worker] {
                entities::grant_tool(&mut tx, "acme", server, role, "*").await.unwrap();
            }
        }
        tx.commit().await.unwrap();
        Self { live, _fixtures: [tk, nx], marks }
    }

    fn marked(&self) -> String {
        std::fs::read_to_string(self.marks.path()).unwrap_or_default()
    }
}

/// rmcp's client on 2026-07-28 at `url`, declaring the tasks extension (or not).
async fn client_at(url: &str, token: &str, tasks: bool) -> RunningService<RoleClient, ClientConfig> {
    modern_client(url, token, tasks).await
}

async fn client(live: &Live, subject: &str, tasks: bool) -> RunningService<RoleClient, ClientConfig> {
    client_at(&live.url(), &live.token_for(subject), tasks).await
}

async fn call_once(client: &RunningService<RoleClient, ClientConfig>, tool: &str, args: Value) -> CallToolResponse {
    let name = if tool.contains("__") { tool.to_owned() } else { format!("{SERVER}__{tool}") };
    let params = CallToolRequestParams::new(name).with_arguments(args.as_object().unwrap().clone());
    client.call_tool_once(params).await.unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The task a call answered with.
async fn task_of(client: &RunningService<RoleClient, ClientConfig>, tool: &str, args: Value) -> CreateTaskResult {
    match call_once(client, tool, args).await {
        CallToolResponse::Task(task) => task,
        other => panic!("{tool} answered no task: {other:?}"),
    }
}

async fn get(client: &RunningService<RoleClient, ClientConfig>, id: &str) -> Result<GetTaskResult, ErrorData> {
    client.get_task(GetTaskParams::new(id)).await.map_err(|e| match e {
        ServiceError::McpError(e) => e,
        other => panic!("tasks/get: {other}"),
    })
}

/// Polls until the task is in `status` (or ended).
async fn until(client: &RunningService<RoleClient, ClientConfig>, id: &str, status: TaskStatus) -> GetTaskResult {
    let deadline = tokio::time::Instant::now() + patience(PATIENCE);
    loop {
        let got = get(client, id).await.unwrap_or_else(|e| panic!("tasks/get {id}: {e:?}"));
        if got.task.task.status == status || got.task.task.status.is_terminal() {
            return got;
        }
        assert!(tokio::time::Instant::now() < deadline, "task {id} still {:?}", got.task.task.status);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn text_of(result: &GetTaskResult) -> String {
    match &result.task.payload {
        TaskPayload::Completed { result } => result["content"][0]["text"].as_str().unwrap_or_default().to_owned(),
        other => panic!("not completed: {other:?}"),
    }
}

/// One audited task action: action, tool, outcome, class, whether it has an argument digest.
type Audited = (String, Option<String>, String, Option<String>, bool);

/// The task actions audited for `subject`, oldest first.
async fn task_audit(live: &Live, subject: &str) -> Vec<Audited> {
    let mut tx = live.db.begin().await.unwrap();
    type Row = (String, Option<String>, String, Option<String>, Option<String>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT a.action, a.tool, a.outcome, a.error_class, a.args_digest FROM audit_events a \
         JOIN users u ON u.id = a.user_id WHERE u.subject = $1 AND a.action LIKE 'tasks/%' ORDER BY a.seq",
    )
    .bind(subject)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    rows.into_iter().map(|(a, t, o, c, d)| (a, t, o, c, d.is_some())).collect()
}

fn audited(
    action: &str,
    outcome: &str,
    class: Option<&str>,
    digest: bool,
) -> (String, Option<String>, String, Option<String>, bool) {
    (action.to_owned(), Some(format!("{SERVER}__slow_compute")), outcome.to_owned(), class.map(str::to_owned), digest)
}

/// A task is created, polled to its end and its result inlined; its handle is the gateway's,
/// not the upstream's; creation and end are audited with the call's argument digest.
async fn lifecycle(backend: Backend) {
    let tasks = Tasks::start(backend).await;
    let live = &tasks.live;
    let olivia = client(live, "olivia@acme.test", true).await;

    // The extension is advertised on server/discover.
    let discovered = olivia.peer_info().unwrap();
    assert!(
        discovered.capabilities.extensions.as_ref().is_some_and(|e| e.contains_key("io.modelcontextprotocol/tasks"))
    );

    // A sync tool stays sync.
    match call_once(&olivia, "greet", json!({"name": "World"})).await {
        CallToolResponse::Complete(result) => assert_eq!(result.content[0].as_text().unwrap().text, "Hello, World!"),
        other => panic!("greet: {other:?}"),
    }

    let created = task_of(&olivia, "slow_compute", json!({"seconds": 1, "label": "lc"})).await;
    let handle = created.task.task_id.clone();
    assert!(created.task.ttl_ms.is_some_and(|t| t > 0), "{created:?}");
    let upstream_id: String = {
        let mut tx = live.db.begin().await.unwrap();
        sqlx::query_scalar("SELECT upstream_task_id FROM tasks").fetch_one(&mut *tx).await.unwrap()
    };
    assert_ne!(handle, upstream_id);
    let (body, _) = handle.split_once('.').expect("a sealed handle");
    let decoded = String::from_utf8(base64_decode(body)).unwrap();
    assert!(!decoded.contains(&upstream_id) && !handle.contains(&upstream_id), "the upstream's id leaks: {decoded}");

    // Polled right away (the row is written before the answer), then to its end.
    assert_eq!(get(&olivia, &handle).await.unwrap().task.task.task_id, handle);
    let done = until(&olivia, &handle, TaskStatus::Completed).await;
    assert_eq!(done.task.task.status, TaskStatus::Completed);
    assert_eq!(done.task.task.task_id, handle);
    assert_eq!(text_of(&done), "computed lc after 1s");

    // Cancelling an ended task is acknowledged (idempotent).
    olivia.cancel_task(CancelTaskParams::new(&handle)).await.unwrap();

    assert_eq!(
        task_audit(live, "olivia@acme.test").await,
        [
            audited("tasks/create", "ok", None, true),
            audited("tasks/completed", "ok", None, true),
            audited("tasks/cancel", "ok", None, false),
        ]
    );
}
both_dbs!(tasks_are_relayed_under_the_gateways_handle, lifecycle);

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).unwrap()
}

/// Another user's, another tenant's, a forged, an expired and a no-longer-granted handle all
/// answer exactly as an unknown task, on every method, and each refusal is audited.
async fn foreign_handles(backend: Backend) {
    let tasks = Tasks::start(backend).await;
    let live = &tasks.live;
    let wanda = client(live, "wanda@acme.test", true).await;
    let created = task_of(&wanda, "slow_compute", json!({"seconds": 60, "label": "mine"})).await;
    let handle = created.task.task_id.clone();
    assert!(get(&wanda, &handle).await.is_ok());

    let unknown = get(&wanda, "tasks-conformance-nonexistent-12345").await.unwrap_err();
    assert_eq!(unknown.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    let same = |e: ErrorData| (e.code, e.message.to_string(), e.data);
    let expected = same(unknown.clone());

    // Another worker of the tenant, and the owner of another tenant.
    let walt = client(live, "walt@acme.test", true).await;
    let gary = client(live, "gary@globex.test", true).await;
    for other in [&walt, &gary] {
        assert_eq!(same(get(other, &handle).await.unwrap_err()), expected);
        let update = other.update_task(UpdateTaskParams::new(&handle, Default::default())).await.unwrap_err();
        let cancel = other.cancel_task(CancelTaskParams::new(&handle)).await.unwrap_err();
        for e in [update, cancel] {
            let ServiceError::McpError(e) = e else { panic!("{e}") };
            assert_eq!(same(e), expected);
        }
    }
    // Forged: the handle altered.
    let (body, tag) = handle.split_once('.').unwrap();
    let mut forged_body = body.to_owned();
    forged_body.replace_range(..1, if body.starts_with('A') { "B" } else { "A" });
    assert_eq!(same(get(&wanda, &format!("{forged_body}.{tag}")).await.unwrap_err()), expected);
    // Still hers and running: the upstream never heard of the others.
    assert_eq!(get(&wanda, &handle).await.unwrap().task.task.status, TaskStatus::Working);
    assert!(!tasks.marked().contains("cancelled"), "{}", tasks.marked());

    // No longer granted the tool: unknown at once.
    let mut tx = live.db.begin().await.unwrap();
    entities::revoke_tool(&mut tx, "acme", SERVER, Role::Worker, "*").await.unwrap();
    tx.commit().await.unwrap();
    eventually("the revoked grant hides the task", || async { get(&wanda, &handle).await.is_err() }).await;
    assert_eq!(same(get(&wanda, &handle).await.unwrap_err()), expected);
    let mut tx = live.db.begin().await.unwrap();
    entities::grant_tool(&mut tx, "acme", SERVER, Role::Worker, "*").await.unwrap();
    tx.commit().await.unwrap();
    eventually("the grant back shows it again", || async { get(&wanda, &handle).await.is_ok() }).await;

    // Her role revoked: her task is unknown to her at once (and to everyone else, as before).
    let mut tx = live.db.begin().await.unwrap();
    sqlx::query("DELETE FROM user_roles WHERE user_id = (SELECT id FROM users WHERE subject = 'wanda@acme.test')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    eventually("the revoked role hides the task", || async { get(&wanda, &handle).await.is_err() }).await;
    assert_eq!(same(get(&wanda, &handle).await.unwrap_err()), expected);
    let mut tx = live.db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO user_roles (tenant_id, user_id, role) SELECT tenant_id, id, 'worker' FROM users \
         WHERE subject = 'wanda@acme.test'",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    eventually("the role back shows it again", || async { get(&wanda, &handle).await.is_ok() }).await;

    // Expired (its row's expiry passed; the handle's own is a day away): unknown.
    let mut tx = live.db.begin().await.unwrap();
    sqlx::query("UPDATE tasks SET expires_at = 1").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(same(get(&wanda, &handle).await.unwrap_err()), expected);

    // Each refusal audited for the one who asked.
    let refused = |audit: Vec<Audited>| {
        audit
            .into_iter()
            .filter(|(_, _, outcome, _, _)| outcome == "denied")
            .map(|(a, _, _, c, _)| (a, c))
            .collect::<Vec<_>>()
    };
    let unknown_task = Some("unknown_task".to_owned());
    assert_eq!(
        refused(task_audit(live, "walt@acme.test").await),
        [
            ("tasks/get".to_owned(), unknown_task.clone()),
            ("tasks/update".to_owned(), unknown_task.clone()),
            ("tasks/cancel".to_owned(), unknown_task.clone())
        ]
    );
    assert_eq!(refused(task_audit(live, "gary@globex.test").await).len(), 3);
    let wandas = refused(task_audit(live, "wanda@acme.test").await);
    assert!(wandas.contains(&("tasks/get".to_owned(), Some("not_granted".to_owned()))), "{wandas:?}");
    assert!(wandas.iter().filter(|(_, c)| c == &unknown_task).count() >= 3, "{wandas:?}");
}
both_dbs!(foreign_forged_expired_and_revoked_handles_are_unknown, foreign_handles);

/// A poll on another replica sharing the database, and on a new connection after the first
/// one is gone, is answered; a cancel reaches the upstream, which settles the task cancelled.
async fn replicas_reconnects_and_cancel(backend: Backend) {
    let tasks = Tasks::start(backend).await;
    let live = &tasks.live;
    let token = live.token_for("olivia@acme.test");
    let first = client(live, "olivia@acme.test", true).await;
    let quick = task_of(&first, "slow_compute", json!({"seconds": 1, "label": "gone"})).await.task.task_id;
    let long = task_of(&first, "slow_compute", json!({"seconds": 60, "label": "long"})).await.task.task_id;
    first.cancel().await.unwrap();

    let mut replica = live.replica().await;
    let other = client_at(&replica.url(), &token, true).await;
    assert_eq!(text_of(&until(&other, &quick, TaskStatus::Completed).await), "computed gone after 1s");
    assert_eq!(get(&other, &long).await.unwrap().task.task.status, TaskStatus::Working);

    let again = client(live, "olivia@acme.test", true).await;
    other.cancel_task(CancelTaskParams::new(&long)).await.unwrap();
    let ended = until(&again, &long, TaskStatus::Cancelled).await;
    assert_eq!(ended.task.task.status, TaskStatus::Cancelled);
    eventually("the upstream saw the cancel", || async { tasks.marked().contains("cancelled slow_compute") }).await;
    let mut tx = live.db.begin().await.unwrap();
    let cancelled: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM tasks WHERE cancel_requested_at IS NOT NULL AND status = 'cancelled'")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert_eq!(cancelled, 1);
    drop(tx);
    let audit = task_audit(live, "olivia@acme.test").await;
    let actions: Vec<&str> = audit.iter().map(|(a, ..)| a.as_str()).collect();
    assert_eq!(actions, ["tasks/create", "tasks/create", "tasks/completed", "tasks/cancel", "tasks/cancelled"]);
    replica.stop().await;
}
both_dbs!(polls_on_a_replica_and_a_new_connection_and_cancel_reach_the_task, replicas_reconnects_and_cancel);

/// A task that needs input: `input_required` with the upstream's requests, answered through
/// `tasks/update`, then completed.
async fn input(backend: Backend) {
    let tasks = Tasks::start(backend).await;
    let olivia = client(&tasks.live, "olivia@acme.test", true).await;
    let handle = task_of(&olivia, "confirm_delete", json!({"filename": "a.txt"})).await.task.task_id;
    let asked = until(&olivia, &handle, TaskStatus::InputRequired).await;
    let TaskPayload::InputRequired { input_requests } = &asked.task.payload else { panic!("{asked:?}") };
    let responses =
        input_requests.keys().map(|k| (k.clone(), json!({"action": "accept", "content": {"confirm": true}}))).collect();
    olivia.update_task(UpdateTaskParams::new(&handle, responses)).await.unwrap();
    assert_eq!(text_of(&until(&olivia, &handle, TaskStatus::Completed).await), "deleted a.txt");
}
both_dbs!(a_task_asks_for_input_through_tasks_get_and_update, input);

/// A caller that does not declare the extension gets no task (the call runs synchronously,
/// or is refused -32021 where the upstream requires a task) and no `tasks/*`; a session on
/// 2025-11-25 is not offered the extension.
async fn undeclared(backend: Backend) {
    let tasks = Tasks::start(backend).await;
    let live = &tasks.live;
    let plain = client(live, "olivia@acme.test", false).await;
    match call_once(&plain, "slow_compute", json!({"seconds": 0, "label": "sync"})).await {
        CallToolResponse::Complete(result) => {
            assert_eq!(result.content[0].as_text().unwrap().text, "computed sync after 0s")
        }
        other => panic!("{other:?}"),
    }
    let params = CallToolRequestParams::new(format!("{SERVER}__failing_job"));
    let ServiceError::McpError(required) = plain.call_tool_once(params).await.unwrap_err() else { panic!() };
    assert_eq!(required.code.0, -32021, "{required:?}");
    let ServiceError::McpError(gated) = plain.get_task(GetTaskParams::new("anything")).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(gated.code.0, -32021, "{gated:?}");

    // A 2025-11-25 session that declares the extension at `initialize` anyway: not offered it,
    // no task, and `tasks/*` answered as to a caller that did not declare it.
    let caps = ClientCapabilities::builder().enable_tasks().build();
    let legacy = ClientConfig::new(caps, Implementation::new("legacy-tasks", "1.0"))
        .serve(live.transport("olivia@acme.test"))
        .await
        .unwrap();
    let info = legacy.peer_info().unwrap();
    assert!(info.capabilities.extensions.as_ref().is_none_or(|e| !e.contains_key("io.modelcontextprotocol/tasks")));
    match call_once(&legacy, "slow_compute", json!({"seconds": 0, "label": "legacy"})).await {
        CallToolResponse::Complete(result) => {
            assert_eq!(result.content[0].as_text().unwrap().text, "computed legacy after 0s")
        }
        other => panic!("{other:?}"),
    }
    let ServiceError::McpError(gone) = legacy.get_task(GetTaskParams::new("anything")).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(gone.code.0, -32021, "{gone:?}");
    // Nor when its request's own `_meta` declares it (rmcp takes that as declared).
    let mut params = GetTaskParams::new("anything");
    let mut meta = rmcp::model::RequestMetaObject::new();
    meta.set_client_capabilities(ClientCapabilities::builder().enable_tasks().build());
    params.meta = Some(meta);
    let ServiceError::McpError(gone) = legacy.get_task(params).await.unwrap_err() else { panic!() };
    assert_eq!(gone.code.0, -32021, "{gone:?}");
    // No task was recorded.
    assert_eq!(live.count("SELECT COUNT(*) FROM tasks").await, 0);
}
both_dbs!(callers_that_do_not_declare_the_extension_get_no_task, undeclared);

/// The store finds a task only for its owner and before its expiry, refuses a status the
/// extension does not name (writing nothing), and records the first terminal status once.
async fn rows(backend: Backend) {
    use scopegate::store::tasks::{self, TaskRow};
    let live = Live::start(backend, Mode::Stateless, &[]).await;
    let ids = |subject: &'static str| {
        let db = live.db.clone();
        async move {
            let mut tx = db.begin().await.unwrap();
            let (tenant, user): (String, String) = sqlx::query_as("SELECT tenant_id, id FROM users WHERE subject = $1")
                .bind(subject)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            (tenant.parse().unwrap(), user.parse().unwrap())
        }
    };
    let (acme, wanda) = ids("wanda@acme.test").await;
    let (_, walt) = ids("walt@acme.test").await;
    let (globex, gary) = ids("gary@globex.test").await;
    let row = TaskRow {
        id: "t-1".into(),
        tenant: acme,
        user: wanda,
        server: "tk".into(),
        tool: "tk__slow_compute".into(),
        caps: "caps:0000/modern".into(),
        upstream_task_id: Some("up-1".into()),
        args_digest: "d".into(),
        status: "working".into(),
        created_at: 1_000,
        updated_at: 1_000,
        expires_at: 5_000,
        terminal_at: None,
        cancel_requested_at: None,
        lease_until: None,
        result: None,
        error: None,
    };
    let mut conn = live.db.begin().await.unwrap();
    let bad = TaskRow { id: "t-2".into(), status: "paused".into(), ..row.clone() };
    assert!(tasks::insert(&mut conn, &bad).await.is_err());
    tasks::insert(&mut conn, &row).await.unwrap();
    assert_eq!(tasks::find_owned(&mut conn, "t-1", acme, wanda, 2_000).await.unwrap(), Some(row.clone()));
    assert_eq!(tasks::find_owned(&mut conn, "t-1", acme, walt, 2_000).await.unwrap(), None);
    assert_eq!(tasks::find_owned(&mut conn, "t-1", globex, gary, 2_000).await.unwrap(), None);
    assert_eq!(tasks::find_owned(&mut conn, "t-1", globex, wanda, 2_000).await.unwrap(), None);
    assert_eq!(tasks::find_owned(&mut conn, "t-1", acme, wanda, 5_000).await.unwrap(), None);
    assert_eq!(tasks::find_owned(&mut conn, "t-2", acme, wanda, 2_000).await.unwrap(), None);

    assert!(!tasks::observe_status(&mut conn, "t-1", "input_required", 2_000).await.unwrap());
    assert!(tasks::observe_status(&mut conn, "t-1", "completed", 3_000).await.unwrap());
    assert!(!tasks::observe_status(&mut conn, "t-1", "failed", 3_500).await.unwrap());
    let found = tasks::find_owned(&mut conn, "t-1", acme, wanda, 4_000).await.unwrap().unwrap();
    assert_eq!((found.status.as_str(), found.terminal_at, found.updated_at), ("completed", Some(3_000), 3_000));
    assert_eq!(tasks::purge_expired(&mut conn, 5_000).await.unwrap(), 1);

    // A task the gateway runs: questions, answers taken once, its end written once.
    let run = TaskRow { id: "t-3".into(), upstream_task_id: None, lease_until: Some(9_000), ..row.clone() };
    let run = TaskRow { expires_at: 50_000, ..run };
    tasks::insert(&mut conn, &run).await.unwrap();
    tasks::add_input(&mut conn, "t-3", "input-1", r#"{"method":"roots/list"}"#, 1_100).await.unwrap();
    tasks::add_input(&mut conn, "t-3", "input-2", r#"{"method":"roots/list"}"#, 1_200).await.unwrap();
    assert!(tasks::answer_input(&mut conn, "t-3", "input-2", "{\"a\":1}").await.unwrap());
    assert!(!tasks::answer_input(&mut conn, "t-3", "input-2", "{\"a\":2}").await.unwrap(), "answered once");
    assert!(!tasks::answer_input(&mut conn, "t-3", "input-9", "{}").await.unwrap());
    let open: Vec<String> = tasks::open_inputs(&mut conn, "t-3").await.unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(open, ["input-1"]);
    assert_eq!(
        tasks::take_answers(&mut conn, "t-3", 2_000).await.unwrap(),
        [("input-2".to_owned(), "{\"a\":1}".to_owned())]
    );
    assert!(tasks::take_answers(&mut conn, "t-3", 2_100).await.unwrap().is_empty());
    tasks::renew_lease(&mut conn, "t-3", 12_000).await.unwrap();
    assert!(tasks::finish(&mut conn, "t-3", "working", None, None, 2_200).await.is_err());
    assert!(tasks::finish(&mut conn, "t-3", "completed", Some("{}"), None, 2_300).await.unwrap());
    assert!(!tasks::finish(&mut conn, "t-3", "failed", None, Some("{}"), 2_400).await.unwrap());
    let ended = tasks::find(&mut conn, "t-3").await.unwrap().unwrap();
    assert_eq!(
        (ended.status.as_str(), ended.result.as_deref(), ended.error, ended.lease_until, ended.terminal_at),
        ("completed", Some("{}"), None, None, Some(2_300))
    );
    conn.commit().await.unwrap();
    assert_eq!(live.count("SELECT COUNT(*) FROM tasks").await, 1);
    let mut conn = live.db.begin().await.unwrap();
    assert!(tasks::add_input(&mut conn, "t-3", "input-1", "{}", 1_300).await.is_err(), "a key is asked once");
}
both_dbs!(task_rows_are_found_only_for_their_owner_in_time, rows);

/// A server without the extension: the gateway runs the tools its declaration names as tasks
/// of its own. The row holds no upstream id; the result is kept and inlined; a `required`
/// tool is refused -32021 to a caller that did not declare the extension and a plain call
/// stays a plain call; a question the upstream asks becomes the task's input request; a tool
/// that gathers its input first asks through the call's multi round-trip, then is a task.
async fn gateway_run(backend: Backend) {
    let tasks = Tasks::start(backend).await;
    let live = &tasks.live;
    let olivia = client(live, "olivia@acme.test", true).await;

    let handle = task_of(&olivia, "nx__slow_compute", json!({"seconds": 1, "label": "gw"})).await.task.task_id;
    assert_eq!(get(&olivia, &handle).await.unwrap().task.task.task_id, handle);
    assert_eq!(text_of(&until(&olivia, &handle, TaskStatus::Completed).await), "computed gw after 1s");
    let upstream_ids: i64 = live.count("SELECT COUNT(*) FROM tasks WHERE upstream_task_id IS NOT NULL").await;
    assert_eq!(upstream_ids, 0, "the gateway ran it");

    // A tool error completes the task (isError); greet, named nowhere, stays a plain call.
    let failing = task_of(&olivia, "nx__failing_job", json!({})).await.task.task_id;
    let ended = until(&olivia, &failing, TaskStatus::Completed).await;
    let TaskPayload::Completed { result } = &ended.task.payload else { panic!("{ended:?}") };
    assert_eq!(result["isError"], json!(true), "{result:?}");
    assert!(matches!(call_once(&olivia, "nx__greet", json!({"name": "x"})).await, CallToolResponse::Complete(_)));

    // Without the extension declared: required refused, optional a plain call, no task.
    let plain = client(live, "olivia@acme.test", false).await;
    let params = CallToolRequestParams::new("nx__failing_job");
    let ServiceError::McpError(required) = plain.call_tool_once(params).await.unwrap_err() else { panic!() };
    assert_eq!(required.code.0, -32021, "{required:?}");
    assert_eq!(
        required.data.unwrap()["requiredCapabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({})
    );
    match call_once(&plain, "nx__slow_compute", json!({"seconds": 0, "label": "p"})).await {
        CallToolResponse::Complete(r) => assert_eq!(r.content[0].as_text().unwrap().text, "computed p after 0s"),
        other => panic!("{other:?}"),
    }

    // The upstream's question, as the task's input request; answered through tasks/update.
    let asking = task_of(&olivia, "nx__confirm_delete", json!({"filename": "b.txt"})).await.task.task_id;
    let asked = until(&olivia, &asking, TaskStatus::InputRequired).await;
    let TaskPayload::InputRequired { input_requests } = &asked.task.payload else { panic!("{asked:?}") };
    assert_eq!(input_requests.len(), 1, "{input_requests:?}");
    let key = input_requests.keys().next().unwrap().clone();
    let mut responses = rmcp::model::InputResponses::new();
    responses.insert("no-such-key".to_owned(), json!({"action": "accept", "content": {"confirm": false}}));
    responses.insert(key, json!({"action": "accept", "content": {"confirm": true}}));
    olivia.update_task(UpdateTaskParams::new(&asking, responses)).await.unwrap();
    assert_eq!(text_of(&until(&olivia, &asking, TaskStatus::Completed).await), "deleted b.txt");

    // Input first (inputBeforeTask): the question through the call's round-trip, then a task.
    let name = format!("{NX}__test_tool_with_task");
    let first = olivia.call_tool_once(CallToolRequestParams::new(name.clone())).await.unwrap();
    let CallToolResponse::InputRequired(input) = first else { panic!("{first:?}") };
    let key = input.input_requests.as_ref().unwrap().keys().next().unwrap().clone();
    let mut retry = CallToolRequestParams::new(name);
    retry.input_responses = Some([(key, json!({"action": "accept", "content": {"name": "Alice"}}))].into());
    retry.request_state = input.request_state;
    let CallToolResponse::Task(task) = olivia.call_tool_once(retry).await.unwrap() else { panic!("no task") };
    assert_eq!(text_of(&until(&olivia, &task.task.task_id, TaskStatus::Completed).await), "Hello, Alice!");

    let audit = task_audit(live, "olivia@acme.test").await;
    let actions: Vec<(&str, Option<&str>)> = audit.iter().map(|(a, t, ..)| (a.as_str(), t.as_deref())).collect();
    assert_eq!(
        actions,
        [
            ("tasks/create", Some("nx__slow_compute")),
            ("tasks/completed", Some("nx__slow_compute")),
            ("tasks/create", Some("nx__failing_job")),
            ("tasks/completed", Some("nx__failing_job")),
            ("tasks/create", Some("nx__confirm_delete")),
            ("tasks/completed", Some("nx__confirm_delete")),
            ("tasks/create", Some("nx__test_tool_with_task")),
            ("tasks/completed", Some("nx__test_tool_with_task")),
        ]
    );
    // The call a task of the gateway's starts is recorded as any forwarded call: its record
    // (committed while the task's first leg runs), then its outcome (the task handed over).
    // Two calls of slow_compute: the task, and the plain call of a caller without the extension.
    let paired = live
        .count(
            "SELECT COUNT(*) FROM audit_events r JOIN audit_events o ON o.tenant_id = r.tenant_id AND o.call_id = r.id \
             WHERE r.action = 'tools/call' AND r.tool = 'nx__slow_compute' AND r.outcome = 'started' \
             AND o.outcome = 'ok' AND o.seq > r.seq",
        )
        .await;
    assert_eq!(paired, 2, "each call of slow_compute a record, then its outcome");
    let whole = live
        .count(
            "SELECT COUNT(*) FROM audit_events WHERE action = 'tools/call' AND tool = 'nx__slow_compute' \
             AND outcome <> 'started' AND call_id IS NULL",
        )
        .await;
    assert_eq!(whole, 0, "no call of slow_compute recorded only once it was answered");
}
both_dbs!(the_gateway_runs_tasks_for_a_server_without_the_extension, gateway_run);

/// A task the gateway runs, seen from another replica: polled there, answered there, and
/// cancelled there (the running replica cancels the call, which tells the upstream); a task
/// whose replica stopped answers failed once its lease lapsed.
async fn gateway_run_replicas(backend: Backend) {
    let tasks = Tasks::start(backend).await;
    let live = &tasks.live;
    let token = live.token_for("olivia@acme.test");
    let here = client(live, "olivia@acme.test", true).await;
    let mut replica = live.replica().await;
    let there = client_at(&replica.url(), &token, true).await;

    let asking = task_of(&here, "nx__confirm_delete", json!({"filename": "c.txt"})).await.task.task_id;
    let asked = until(&there, &asking, TaskStatus::InputRequired).await;
    let TaskPayload::InputRequired { input_requests } = &asked.task.payload else { panic!("{asked:?}") };
    let responses = input_requests.keys().map(|k| (k.clone(), json!({"action": "decline"}))).collect();
    there.update_task(UpdateTaskParams::new(&asking, responses)).await.unwrap();
    assert_eq!(text_of(&until(&there, &asking, TaskStatus::Completed).await), "kept c.txt");

    let long = task_of(&here, "nx__slow_compute", json!({"seconds": 60, "label": "long"})).await.task.task_id;
    assert_eq!(get(&there, &long).await.unwrap().task.task.status, TaskStatus::Working);
    there.cancel_task(CancelTaskParams::new(&long)).await.unwrap();
    assert_eq!(until(&there, &long, TaskStatus::Cancelled).await.task.task.status, TaskStatus::Cancelled);
    eventually("the upstream saw the cancel", || async { tasks.marked().contains("cancelled slow_compute") }).await;

    // Started on the replica, which then dies (it loses its database first, so it can write
    // nothing more, as a killed process could not): once its lease lapsed, the task failed.
    let orphan = task_of(&there, "nx__slow_compute", json!({"seconds": 60, "label": "orphan"})).await.task.task_id;
    replica.state().db.close().await;
    replica.stop().await;
    assert_eq!(get(&here, &orphan).await.unwrap().task.task.status, TaskStatus::Working, "its lease still runs");
    let mut tx = live.db.begin().await.unwrap();
    sqlx::query("UPDATE tasks SET lease_until = 1 WHERE terminal_at IS NULL").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let failed = get(&here, &orphan).await.unwrap();
    let TaskPayload::Failed { error } = &failed.task.payload else { panic!("{failed:?}") };
    assert_eq!(error["code"], json!(-32603), "{error:?}");
}
both_dbs!(a_task_the_gateway_runs_is_served_by_every_replica, gateway_run_replicas);

/// A result larger than `mcp.task_max_result_bytes` is not kept: the task fails, saying so.
async fn bounded_result(backend: Backend) {
    let tasks = Tasks::start_with(backend, &[("mcp.task_max_result_bytes", json!(40))]).await;
    let olivia = client(&tasks.live, "olivia@acme.test", true).await;
    let handle = task_of(&olivia, "nx__slow_compute", json!({"seconds": 0, "label": "too long to keep"})).await;
    let ended = until(&olivia, &handle.task.task_id, TaskStatus::Failed).await;
    let TaskPayload::Failed { error } = &ended.task.payload else { panic!("{ended:?}") };
    assert!(error["message"].as_str().unwrap().contains("larger than the gateway keeps"), "{error:?}");
    assert_eq!(tasks.live.count("SELECT COUNT(*) FROM tasks WHERE result IS NOT NULL").await, 0);
}
both_dbs!(a_result_beyond_the_bound_fails_the_task, bounded_result);

/// On a remote executor (the fixture over stdio on the agent's machine): a task of the
/// upstream's own is relayed through the executor tunnel, and one the gateway runs calls
/// through it too.
async fn on_a_remote_executor(backend: Backend) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let declaration = |extra: &[&str], tasks: Value| {
        let mut args = vec!["tasks", "stdio"];
        args.extend_from_slice(extra);
        json!({"command": FIXTURE, "args": args, "cwd": "work", "protocolVersion": "2026-07-28", "tasks": tasks})
    };
    site.serve("acme", "far", &declaration(&[], json!({})), "build-01").await;
    let gateway_run = json!({"slow_compute": "optional"});
    site.serve("acme", "farnx", &declaration(&["--no-extension"], gateway_run), "build-01").await;
    let _agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__slow_compute").await;

    let olivia = client(&site.live, "olivia@acme.test", true).await;
    for tool in ["far__slow_compute", "farnx__slow_compute"] {
        let handle = task_of(&olivia, tool, json!({"seconds": 1, "label": tool})).await.task.task_id;
        let done = until(&olivia, &handle, TaskStatus::Completed).await;
        assert_eq!(text_of(&done), format!("computed {tool} after 1s"));
    }
    let relayed = site.live.count("SELECT COUNT(*) FROM tasks WHERE upstream_task_id IS NOT NULL").await;
    let run = site.live.count("SELECT COUNT(*) FROM tasks WHERE upstream_task_id IS NULL").await;
    assert_eq!((relayed, run), (1, 1));
}
both_dbs!(tasks_on_a_remote_executor, on_a_remote_executor);

/// Another gateway process on the same database (`scopegate serve`, not in this process)
/// answers polls of tasks made here, of both kinds, and its cancel reaches the replica
/// running a task the gateway runs.
async fn another_process(backend: Backend) {
    let tasks = Tasks::start(backend).await;
    let live = &tasks.live;
    let dir = tempfile::tempdir().unwrap();
    let secret = live.config.auth.hs256_secret.expose().to_owned();
    let env = [("SCOPEGATE_AUTH__HS256_SECRET", secret.as_str()), ("SCOPEGATE_MCP__STATELESS", "true")];
    let other = Replica::start_with(dir.path(), live.config.database.url.expose(), &live.config.public_url(), &env);
    let token = live.token_for("olivia@acme.test");
    let here = client(live, "olivia@acme.test", true).await;
    let there = client_at(&format!("http://{}/mcp", other.addr), &token, true).await;

    let relayed = task_of(&here, "slow_compute", json!({"seconds": 1, "label": "here"})).await.task.task_id;
    assert_eq!(text_of(&until(&there, &relayed, TaskStatus::Completed).await), "computed here after 1s");
    let run = task_of(&here, "nx__slow_compute", json!({"seconds": 60, "label": "run"})).await.task.task_id;
    assert_eq!(get(&there, &run).await.unwrap().task.task.status, TaskStatus::Working);
    there.cancel_task(CancelTaskParams::new(&run)).await.unwrap();
    assert_eq!(until(&here, &run, TaskStatus::Cancelled).await.task.task.status, TaskStatus::Cancelled);
    eventually("the upstream saw the cancel", || async { tasks.marked().contains("cancelled slow_compute") }).await;
}
both_dbs!(another_gateway_process_answers_polls_and_cancels, another_process);
