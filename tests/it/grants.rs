//! The per-tenant allow list of upstream tools, on SQLite and PostgreSQL: grants need a bound
//! server, refusals name the field and write nothing, unbinding drops the grants, and one
//! tenant's grants never reach another's.

use scopegate::model::Role;
use scopegate::store::entities::{self, GrantRow};
use scopegate::store::{Db, StoreError, TenantId};

use crate::support::*;

/// The demo tenants, an executor, and `files` and `wiki` bound in acme, `files` in globex.
async fn setup(backend: Backend) -> (TestDb, Db) {
    let test_db = TestDb::new(backend).await;
    let db = db_for(&config_with(&test_db.url, &[])).await;
    assert!(db.is_ready().await, "ready with the grants migration applied");
    seed_demo(&db).await;
    let mut tx = db.begin().await.unwrap();
    entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
    entities::create_executor(&mut tx, "build-01", "build-01", "ci", "remote", &["acme"]).await.unwrap();
    entities::bind_server(&mut tx, "acme", "files", "local").await.unwrap();
    entities::bind_server(&mut tx, "acme", "wiki", "local").await.unwrap();
    entities::bind_server(&mut tx, "globex", "files", "local").await.unwrap();
    tx.commit().await.unwrap();
    (test_db, db)
}

async fn tenant(db: &Db, slug: &str) -> TenantId {
    let mut tx = db.begin().await.unwrap();
    let id: String =
        sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1").bind(slug).fetch_one(&mut *tx).await.unwrap();
    id.parse().unwrap()
}

async fn grant(db: &Db, tenant: &str, server: &str, role: Role, tool: &str) -> Result<(), StoreError> {
    admin_tx!(db, |tx| entities::grant_tool(&mut tx, tenant, server, role, tool))
}

async fn revoke(db: &Db, tenant: &str, server: &str, role: Role, tool: &str) -> Result<(), StoreError> {
    admin_tx!(db, |tx| entities::revoke_tool(&mut tx, tenant, server, role, tool))
}

async fn listed(db: &Db, tenant: &str) -> Vec<GrantRow> {
    admin_tx!(db, |tx| entities::list_grants(&mut tx, tenant)).unwrap()
}

async fn grant_count(db: &Db) -> i64 {
    let mut tx = db.begin().await.unwrap();
    sqlx::query_scalar("SELECT COUNT(*) FROM mcp_server_grants").fetch_one(&mut *tx).await.unwrap()
}

fn row(server: &str, role: Role, tool: &str) -> GrantRow {
    GrantRow { server: server.into(), role, tool: tool.into() }
}

async fn grant_list_revoke(backend: Backend) {
    let (_t, db) = setup(backend).await;
    grant(&db, "acme", "wiki", Role::Worker, "search").await.unwrap();
    grant(&db, "acme", "files", Role::Worker, "read_file").await.unwrap();
    grant(&db, "acme", "files", Role::Manager, "*").await.unwrap();
    grant(&db, "acme", "files", Role::Worker, "list.dir-v2").await.unwrap();

    let expected = vec![
        row("files", Role::Manager, "*"),
        row("files", Role::Worker, "list.dir-v2"),
        row("files", Role::Worker, "read_file"),
        row("wiki", Role::Worker, "search"),
    ];
    assert_eq!(listed(&db, "acme").await, expected, "sorted by server, role, tool");
    let acme = tenant(&db, "acme").await;
    assert_eq!(db.upstream_grants(acme).await.unwrap(), expected);

    let err = grant(&db, "acme", "files", Role::Worker, "read_file").await.expect_err("a duplicate grant");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    assert!(err.to_string().contains("read_file"), "{err}");
    assert_eq!(listed(&db, "acme").await, expected, "the refused duplicate changed nothing");

    revoke(&db, "acme", "files", Role::Worker, "read_file").await.unwrap();
    assert_eq!(
        db.upstream_grants(acme).await.unwrap(),
        vec![
            row("files", Role::Manager, "*"),
            row("files", Role::Worker, "list.dir-v2"),
            row("wiki", Role::Worker, "search")
        ]
    );
    let err = revoke(&db, "acme", "files", Role::Worker, "read_file").await.expect_err("already revoked");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    // `*` is a grant of its own, not a pattern: revoking it leaves the named tools alone.
    let err = revoke(&db, "acme", "files", Role::Worker, "*").await.expect_err("worker holds no `*`");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    revoke(&db, "acme", "files", Role::Manager, "*").await.unwrap();
    assert_eq!(
        listed(&db, "acme").await,
        vec![row("files", Role::Worker, "list.dir-v2"), row("wiki", Role::Worker, "search")]
    );
}
both_dbs!(grants_grant_list_revoke, grant_list_revoke);

async fn unbound_server_refused(backend: Backend) {
    let (_t, db) = setup(backend).await;
    // `cache` is bound nowhere; `wiki` is bound in acme only.
    for (tenant, server) in [("acme", "cache"), ("globex", "wiki")] {
        let err = grant(&db, tenant, server, Role::Owner, "*").await.expect_err("an unbound server");
        assert!(matches!(err, StoreError::NotFound(_)), "{tenant}/{server}: {err:?}");
        assert!(err.to_string().contains(&format!("server `{server}`")), "{tenant}/{server}: {err}");
    }
    let err = grant(&db, "initech", "files", Role::Owner, "*").await.expect_err("an unknown tenant");
    assert!(err.to_string().contains("initech"), "{err}");
    assert_eq!(grant_count(&db).await, 0, "nothing was written");
}
both_dbs!(grants_unbound_server_refused, unbound_server_refused);

async fn bad_fields_refused(backend: Backend) {
    let (_t, db) = setup(backend).await;
    grant(&db, "acme", "files", Role::Owner, "*").await.unwrap();
    let too_long = "t".repeat(129);
    let cases: &[(&str, &str, &str)] = &[
        ("empty tool", "files", ""),
        ("space in tool", "files", "read file"),
        ("slash in tool", "files", "a/b"),
        ("a pattern is not a tool", "files", "read_*"),
        ("two stars", "files", "**"),
        ("control character", "files", "read\u{7}"),
        ("non-ASCII tool", "files", "l\u{e9}ser"),
        ("129 characters", "files", &too_long),
        ("server with __", "a__b", "read_file"),
        ("empty server", "", "read_file"),
    ];
    for (name, server, tool) in cases {
        let err = grant(&db, "acme", server, Role::Worker, tool).await.expect_err(name);
        let field = if server.contains("__") || server.is_empty() { "server" } else { "tool" };
        assert!(
            matches!(err, StoreError::Invalid { field: f, .. } if f == field),
            "{name}: `{err:?}` should name `{field}`"
        );
    }
    assert_eq!(grant_count(&db).await, 1, "nothing was written");

    // Roles are typed in the store; the table refuses any other role by itself, and refuses a
    // grant whose (tenant, server) has no binding even when written around the store.
    let acme = tenant(&db, "acme").await;
    for (name, server, role) in [("unknown role", "files", "admin"), ("unbound server", "cache", "owner")] {
        let mut tx = db.begin().await.unwrap();
        let written = sqlx::query(
            "INSERT INTO mcp_server_grants (tenant_id, server, role, tool, created_at) VALUES ($1, $2, $3, 'x', 0)",
        )
        .bind(acme)
        .bind(server)
        .bind(role)
        .execute(&mut *tx)
        .await;
        assert!(written.is_err(), "{name}: the database must refuse it");
    }
    assert_eq!(grant_count(&db).await, 1, "nothing was written");
}
both_dbs!(grants_bad_role_and_tool_refused, bad_fields_refused);

async fn unbinding_cascades(backend: Backend) {
    let (_t, db) = setup(backend).await;
    grant(&db, "acme", "files", Role::Worker, "read_file").await.unwrap();
    grant(&db, "acme", "files", Role::Owner, "*").await.unwrap();
    grant(&db, "acme", "wiki", Role::Auditor, "search").await.unwrap();
    grant(&db, "globex", "files", Role::Owner, "*").await.unwrap();

    // Rebinding a server to another executor keeps its grants: they name tools, not places.
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "files", "build-01")).unwrap();
    assert_eq!(listed(&db, "acme").await.len(), 3);

    admin_tx!(db, |tx| entities::unbind_server(&mut tx, "acme", "files")).unwrap();
    let acme = tenant(&db, "acme").await;
    assert_eq!(db.upstream_grants(acme).await.unwrap(), vec![row("wiki", Role::Auditor, "search")]);
    assert_eq!(listed(&db, "globex").await, vec![row("files", Role::Owner, "*")], "globex's `files` is its own");

    // Binding the server again does not bring the old grants back.
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "files", "local")).unwrap();
    assert_eq!(db.upstream_grants(acme).await.unwrap(), vec![row("wiki", Role::Auditor, "search")]);
}
both_dbs!(grants_unbinding_cascades, unbinding_cascades);

async fn other_tenants_never_appear(backend: Backend) {
    let (_t, db) = setup(backend).await;
    // Both tenants bound a server called `files`, with different grants.
    grant(&db, "acme", "files", Role::Worker, "read_file").await.unwrap();
    grant(&db, "globex", "files", Role::Owner, "*").await.unwrap();
    grant(&db, "globex", "files", Role::Worker, "delete_everything").await.unwrap();

    let acme = tenant(&db, "acme").await;
    let globex = tenant(&db, "globex").await;
    assert_eq!(db.upstream_grants(acme).await.unwrap(), vec![row("files", Role::Worker, "read_file")]);
    assert_eq!(
        db.upstream_grants(globex).await.unwrap(),
        vec![row("files", Role::Owner, "*"), row("files", Role::Worker, "delete_everything")]
    );
    assert!(db.upstream_grants(TenantId::generate()).await.unwrap().is_empty(), "an unknown tenant has none");

    // Revoking in one tenant never touches the other's grant of the same name.
    let err = revoke(&db, "acme", "files", Role::Owner, "*").await.expect_err("acme never granted it");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    assert_eq!(db.upstream_grants(globex).await.unwrap().len(), 2);
}
both_dbs!(grants_of_another_tenant_never_appear, other_tenants_never_appear);

/// `scopegate migrate` and `scopegate admin grant ...` through the real binary.
async fn cli(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_scopegate"));
        for (key, _) in std::env::vars() {
            if key.starts_with("SCOPEGATE_") {
                cmd.env_remove(key);
            }
        }
        let out = cmd
            .current_dir(dir.path())
            .env("RUST_LOG", "warn")
            .env("SCOPEGATE_DATABASE__URL", &test_db.url)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let ok = |args: &[&str]| {
        let (success, stdout, stderr) = run(args);
        assert!(success, "{args:?}: {stderr}");
        stdout
    };
    ok(&["migrate"]);
    let db = db_for(&config_with(&test_db.url, &[])).await;
    assert!(db.is_ready().await, "`scopegate migrate` applied the newest migration");
    db.close().await;

    ok(&["admin", "tenant", "create", "initech", "--name", "Initech"]);
    ok(&["admin", "executor", "create", "local", "--machine", "gw-host", "--user", "gateway"]);
    ok(&["admin", "binding", "set", "--tenant", "initech", "notes", "local"]);
    let grant = |verb: &'static str, server: &'static str, role: &'static str, tool: &'static str| {
        ["admin", "grant", verb, "--tenant", "initech", "--server", server, "--role", role, "--tool", tool]
    };
    ok(&grant("add", "notes", "worker", "read_note"));
    ok(&grant("add", "notes", "owner", "*"));

    let list = ["admin", "--json", "grant", "list", "--tenant", "initech"];
    let listed: serde_json::Value = serde_json::from_str(&ok(&list)).unwrap();
    assert_eq!(
        listed,
        serde_json::json!([
            {"server": "notes", "role": "owner", "tool": "*"},
            {"server": "notes", "role": "worker", "tool": "read_note"},
        ])
    );
    let table = ok(&["admin", "grant", "list", "--tenant", "initech"]);
    assert!(table.starts_with("server") && table.contains("read_note"), "{table}");

    let before = ok(&list);
    let refusals = [
        (grant("add", "notes", "boss", "read_note"), "role"),
        (grant("add", "notes", "worker", "read note"), "tool"),
        (grant("add", "notes", "worker", "read_note"), "already"),
        (grant("add", "cache", "owner", "*"), "server"),
        (grant("delete", "notes", "auditor", "*"), "auditor"),
    ];
    for (argv, field) in &refusals {
        let (success, stdout, stderr) = run(argv);
        assert!(!success, "{argv:?} must be refused");
        assert!(stderr.contains(field), "{argv:?}: `{stderr}` should name `{field}`");
        assert!(stdout.is_empty(), "{argv:?}");
    }
    assert_eq!(ok(&list), before, "the refusals wrote nothing");

    ok(&grant("delete", "notes", "worker", "read_note"));
    assert!(!ok(&list).contains("read_note"));
    ok(&["admin", "binding", "delete", "--tenant", "initech", "notes"]);
    assert_eq!(ok(&["admin", "grant", "list", "--tenant", "initech"]).trim(), "(none)", "unbinding dropped the grants");
}
both_dbs!(grants_cli, cli);
