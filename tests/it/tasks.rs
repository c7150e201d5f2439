//! Tasks (`io.modelcontextprotocol/tasks`, SEP-2663) through the gateway, with rmcp's client on
//! 2026-07-28 in front and the fixture's `tasks` mode (an rmcp server on rmcp's task manager)
//! behind: a task-supporting tool answers a task under a handle the gateway minted, bound to
//! its caller; polls, answers and cancellation reach the upstream under its own id; a
//! foreign, forged, expired or no-longer-granted handle answers exactly as an unknown one; a
//! poll on another replica and on a new connection is answered; every step is audited.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig, CreateTaskResult,
    GetTaskParams, GetTaskResult, Implementation, ProtocolVersion, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::{ClientLifecycleMode, ClientServiceExt, ErrorData, ServiceExt};
use scopegate::model::Role;
use scopegate::store::entities;
use serde_json::{Value, json};

use crate::support::*;

/// The server name the fixture is bound under (prefixed: `tk__slow_compute`).
const SERVER: &str = "tk";

/// A gateway with acme's `tk`: the fixture's `tasks` mode over Streamable HTTP (so another
/// replica reaches the same upstream), every tool granted to owners and workers. Its cancelled
/// tasks are marked in `marks`.
struct Tasks {
    live: Live,
    _fixture: tokio::process::Child,
    marks: tempfile::NamedTempFile,
}

impl Tasks {
    async fn start(backend: Backend) -> Self {
        let marks = tempfile::NamedTempFile::new().unwrap();
        let mark_file = marks.path().display().to_string();
        let (fixture, addr) =
            fixture_http(&["tasks", "http", "127.0.0.1:0"], &[("FIXTURE_MARK_FILE", &mark_file)]).await;
        let live = Live::start(backend, Mode::Stateless, &[("upstream.connect_timeout_secs", json!(10))]).await;
        let mut tx = live.db.begin().await.unwrap();
        entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
        let declaration = json!({"type": "http", "url": format!("http://{addr}/mcp"), "protocolVersion": "2026-07-28"});
        entities::create_entity(&mut tx, "acme", &format!("defaults/mcp-servers/{SERVER}"), &declaration)
            .await
            .unwrap();
        entities::bind_server(&mut tx, "acme", SERVER, "local").await.unwrap();
        for role in [Role::Owner, Role::Worker] {
            entities::grant_tool(&mut tx, "acme", SERVER, role, "*").await.unwrap();
        }
        tx.commit().await.unwrap();
        Self { live, _fixture: fixture, marks }
    }

    fn marked(&self) -> String {
        std::fs::read_to_string(self.marks.path()).unwrap_or_default()
    }
}

/// rmcp's client on 2026-07-28 at `url`, declaring the tasks extension (or not).
async fn client_at(url: &str, token: &str, tasks: bool) -> RunningService<RoleClient, ClientConfig> {
    let mut caps = ClientCapabilities::builder().enable_elicitation().build();
    if tasks {
        caps.extensions = ClientCapabilities::builder().enable_tasks().build().extensions;
    }
    let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    ClientConfig::new(caps, Implementation::new("tasks-test", "1.0"))
        .serve_with_lifecycle(transport(url, token), lifecycle)
        .await
        .unwrap_or_else(|e| panic!("connects on 2026-07-28: {e}"))
}

async fn client(live: &Live, subject: &str, tasks: bool) -> RunningService<RoleClient, ClientConfig> {
    client_at(&live.url(), &live.token_for(subject), tasks).await
}

async fn call_once(client: &RunningService<RoleClient, ClientConfig>, tool: &str, args: Value) -> CallToolResponse {
    let params =
        CallToolRequestParams::new(format!("{SERVER}__{tool}")).with_arguments(args.as_object().unwrap().clone());
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
        upstream_task_id: "up-1".into(),
        args_digest: "d".into(),
        status: "working".into(),
        created_at: 1_000,
        updated_at: 1_000,
        expires_at: 5_000,
        terminal_at: None,
        cancel_requested_at: None,
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
    conn.commit().await.unwrap();
    assert_eq!(live.count("SELECT COUNT(*) FROM tasks").await, 0);
}
both_dbs!(task_rows_are_found_only_for_their_owner_in_time, rows);
