//! The per-tenant allow list of upstream tools, prompts and resources, on SQLite and
//! PostgreSQL: grants need a bound server, refusals name the field and write nothing, a name
//! may be granted once per kind, unbinding drops the grants, one tenant's grants never reach
//! another's, and the grants kinds came after keep their meaning as tool grants. Also
//! unprefixed bindings (`binding set --no-prefix`): recorded, resolved, one per tenant.

use scopegate::model::Role;
use scopegate::store::entities::{self, GrantKind, GrantRow};
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
    row_of(server, role, GrantKind::Tool, tool)
}

fn row_of(server: &str, role: Role, kind: GrantKind, name: &str) -> GrantRow {
    GrantRow { server: server.into(), role, kind, name: name.into(), confirm: None }
}

async fn grant_of(
    db: &Db,
    tenant: &str,
    server: &str,
    role: Role,
    kind: GrantKind,
    name: &str,
) -> Result<(), StoreError> {
    admin_tx!(db, |tx| entities::grant(&mut tx, tenant, server, role, kind, name))
}

async fn revoke_of(
    db: &Db,
    tenant: &str,
    server: &str,
    role: Role,
    kind: GrantKind,
    name: &str,
) -> Result<(), StoreError> {
    admin_tx!(db, |tx| entities::revoke(&mut tx, tenant, server, role, kind, name))
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
        let field = if server.contains("__") || server.is_empty() { "server" } else { "name" };
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
            {"server": "notes", "role": "owner", "kind": "tool", "name": "*", "confirm": ""},
            {"server": "notes", "role": "worker", "kind": "tool", "name": "read_note", "confirm": ""},
        ])
    );

    // Kinds: `--name` (or its alias `--tool`) with `--kind`; the same name once per kind.
    let kinded = |verb: &'static str, kind: &'static str, name: &'static str| {
        [
            "admin", "grant", verb, "--tenant", "initech", "--server", "notes", "--role", "worker", "--kind", kind,
            "--name", name,
        ]
    };
    ok(&kinded("add", "prompt", "read_note"));
    ok(&kinded("add", "resource", "notes://shelf/*"));
    ok(&kinded("add", "resource", "notes://index"));
    let listed: serde_json::Value = serde_json::from_str(&ok(&list)).unwrap();
    assert_eq!(
        listed,
        serde_json::json!([
            {"server": "notes", "role": "owner", "kind": "tool", "name": "*", "confirm": ""},
            {"server": "notes", "role": "worker", "kind": "prompt", "name": "read_note", "confirm": ""},
            {"server": "notes", "role": "worker", "kind": "resource", "name": "notes://index", "confirm": ""},
            {"server": "notes", "role": "worker", "kind": "resource", "name": "notes://shelf/*", "confirm": ""},
            {"server": "notes", "role": "worker", "kind": "tool", "name": "read_note", "confirm": ""},
        ])
    );
    let table = ok(&["admin", "grant", "list", "--tenant", "initech"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["server", "role", "kind", "name", "confirm"], "{table}");
    assert!(table.lines().any(|l| l.split_whitespace().eq(["notes", "worker", "prompt", "read_note"])), "{table}");

    let before = ok(&list);
    let refusals: Vec<(Vec<&str>, &str)> = vec![
        (grant("add", "notes", "boss", "read_note").to_vec(), "role"),
        (grant("add", "notes", "worker", "read note").to_vec(), "name"),
        (grant("add", "notes", "worker", "read_note").to_vec(), "already"),
        (grant("add", "cache", "owner", "*").to_vec(), "server"),
        (grant("delete", "notes", "auditor", "*").to_vec(), "auditor"),
        (kinded("add", "widget", "read_note").to_vec(), "--kind"),
        (kinded("add", "tools", "x").to_vec(), "--kind"),
        (kinded("add", "prompt", "notes://shelf/*").to_vec(), "name"),
        (kinded("add", "resource", "shelf/a").to_vec(), "name"),
        (kinded("add", "resource", "notes://a b").to_vec(), "name"),
        (kinded("add", "resource", "notes://*/a").to_vec(), "name"),
        (kinded("add", "prompt", "read_note").to_vec(), "already"),
        (kinded("delete", "prompt", "notes://shelf/*").to_vec(), "name"),
        (kinded("delete", "resource", "notes://shelf/a").to_vec(), "no grant"),
        (kinded("delete", "prompt", "*").to_vec(), "no grant"),
        (kinded("add", "prompt", "other").into_iter().chain(["--confirm", "caller"]).collect(), "confirm"),
        (grant("add", "notes", "worker", "other").into_iter().chain(["--confirm", "always"]).collect(), "--confirm"),
    ];
    for (argv, field) in &refusals {
        let (success, stdout, stderr) = run(argv);
        assert!(!success, "{argv:?} must be refused");
        assert!(stderr.contains(field), "{argv:?}: `{stderr}` should name `{field}`");
        assert!(stdout.is_empty(), "{argv:?}");
    }
    assert_eq!(ok(&list), before, "the refusals wrote nothing");

    // A grant may ask a person to confirm each call it allows.
    ok(&grant("add", "notes", "manager", "write_note")
        .into_iter()
        .chain(["--confirm", "approver"])
        .collect::<Vec<_>>());
    let listed: serde_json::Value = serde_json::from_str(&ok(&list)).unwrap();
    let confirmed = listed.as_array().unwrap().iter().find(|g| g["role"] == "manager").unwrap();
    assert_eq!(confirmed["confirm"], "approver", "{listed}");
    ok(&[
        "admin",
        "grant",
        "delete",
        "--tenant",
        "initech",
        "--server",
        "notes",
        "--role",
        "manager",
        "--name",
        "write_note",
    ]);

    // Deleting takes the kind: the prompt of the same name stays until its own delete.
    ok(&grant("delete", "notes", "worker", "read_note"));
    let after: serde_json::Value = serde_json::from_str(&ok(&list)).unwrap();
    let names = |v: &serde_json::Value| -> Vec<(String, String)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|g| (g["kind"].as_str().unwrap().to_owned(), g["name"].as_str().unwrap().to_owned()))
            .collect()
    };
    assert!(names(&after).contains(&("prompt".into(), "read_note".into())), "{after}");
    assert!(!names(&after).contains(&("tool".into(), "read_note".into())), "{after}");
    ok(&kinded("delete", "prompt", "read_note"));
    ok(&kinded("delete", "resource", "notes://shelf/*"));
    let pair = |k: &str, n: &str| (k.to_owned(), n.to_owned());
    assert_eq!(
        names(&serde_json::from_str(&ok(&list)).unwrap()),
        [pair("tool", "*"), pair("resource", "notes://index")],
        "sorted by server, role, kind, name"
    );
    assert!(!ok(&list).contains("read_note"));
    ok(&["admin", "binding", "delete", "--tenant", "initech", "notes"]);
    assert_eq!(ok(&["admin", "grant", "list", "--tenant", "initech"]).trim(), "(none)", "unbinding dropped the grants");
}
both_dbs!(grants_cli, cli);

async fn kinds_add_list_delete(backend: Backend) {
    let (_t, db) = setup(backend).await;
    use GrantKind::{Prompt, Resource, Tool};
    // One name under two kinds: two grants (and `*` under all three).
    for kind in [Tool, Prompt] {
        grant_of(&db, "acme", "files", Role::Worker, kind, "summary").await.unwrap();
    }
    grant_of(&db, "acme", "files", Role::Worker, Resource, "summary:").await.unwrap();
    for kind in GrantKind::ALL {
        grant_of(&db, "acme", "files", Role::Auditor, kind, "*").await.unwrap();
    }
    grant_of(&db, "acme", "files", Role::Worker, Resource, "test://docs/*").await.unwrap();
    grant_of(&db, "acme", "files", Role::Worker, Resource, "test://docs/index.md").await.unwrap();
    grant_of(&db, "acme", "files", Role::Manager, Prompt, "*").await.unwrap();
    grant_of(&db, "acme", "files", Role::Manager, Resource, "*").await.unwrap();
    let long_uri = format!("test://{}", "d".repeat(2041));
    grant_of(&db, "acme", "wiki", Role::Owner, Resource, &long_uri).await.unwrap();
    // The tool functions are kind tool.
    grant(&db, "acme", "wiki", Role::Owner, "search").await.unwrap();

    let expected = vec![
        row_of("files", Role::Auditor, Prompt, "*"),
        row_of("files", Role::Auditor, Resource, "*"),
        row_of("files", Role::Auditor, Tool, "*"),
        row_of("files", Role::Manager, Prompt, "*"),
        row_of("files", Role::Manager, Resource, "*"),
        row_of("files", Role::Worker, Prompt, "summary"),
        row_of("files", Role::Worker, Resource, "summary:"),
        row_of("files", Role::Worker, Resource, "test://docs/*"),
        row_of("files", Role::Worker, Resource, "test://docs/index.md"),
        row_of("files", Role::Worker, Tool, "summary"),
        row_of("wiki", Role::Owner, Resource, &long_uri),
        row_of("wiki", Role::Owner, Tool, "search"),
    ];
    assert_eq!(listed(&db, "acme").await, expected, "sorted by server, role, kind, name");
    let acme = tenant(&db, "acme").await;
    assert_eq!(db.upstream_grants(acme).await.unwrap(), expected);

    // A duplicate is a duplicate within its kind only.
    for (kind, name) in [(Tool, "summary"), (Prompt, "summary"), (Resource, "summary:"), (Resource, "*")] {
        let role = if name == "*" { Role::Auditor } else { Role::Worker };
        let err = grant_of(&db, "acme", "files", role, kind, name).await.expect_err("a duplicate");
        assert!(matches!(err, StoreError::Conflict(_)), "{kind}: {err:?}");
        assert!(err.to_string().contains(kind.as_str()), "{kind}: {err}");
    }
    assert_eq!(listed(&db, "acme").await, expected, "the refused duplicates changed nothing");

    // Revoking takes the kind: the other kinds of the same name stay.
    revoke_of(&db, "acme", "files", Role::Worker, Prompt, "summary").await.unwrap();
    let err = revoke_of(&db, "acme", "files", Role::Worker, Prompt, "summary").await.expect_err("already revoked");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    revoke(&db, "acme", "files", Role::Worker, "summary").await.unwrap();
    // A prefix is a grant of its own, not a pattern, when revoking.
    let err =
        revoke_of(&db, "acme", "files", Role::Worker, Resource, "test://*").await.expect_err("no such prefix grant");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    revoke_of(&db, "acme", "files", Role::Worker, Resource, "test://docs/*").await.unwrap();
    assert_eq!(
        listed(&db, "acme").await,
        vec![
            row_of("files", Role::Auditor, Prompt, "*"),
            row_of("files", Role::Auditor, Resource, "*"),
            row_of("files", Role::Auditor, Tool, "*"),
            row_of("files", Role::Manager, Prompt, "*"),
            row_of("files", Role::Manager, Resource, "*"),
            row_of("files", Role::Worker, Resource, "summary:"),
            row_of("files", Role::Worker, Resource, "test://docs/index.md"),
            row_of("wiki", Role::Owner, Resource, &long_uri),
            row_of("wiki", Role::Owner, Tool, "search"),
        ]
    );
    // Unbinding drops the grants of every kind.
    admin_tx!(db, |tx| entities::unbind_server(&mut tx, "acme", "files")).unwrap();
    assert_eq!(listed(&db, "acme").await.len(), 2);
}
both_dbs!(grants_kinds_add_list_delete, kinds_add_list_delete);

async fn bad_kind_names_refused(backend: Backend) {
    let (_t, db) = setup(backend).await;
    use GrantKind::{Prompt, Resource, Tool};
    grant(&db, "acme", "files", Role::Owner, "*").await.unwrap();
    let (long_tool, long_uri) = ("t".repeat(129), format!("test://{}", "d".repeat(2042)));
    let cases: &[(&str, GrantKind, &str)] = &[
        ("a URI is no tool name", Tool, "test://docs/a"),
        ("a URI is no prompt name", Prompt, "test://docs/a"),
        ("a pattern is no prompt name", Prompt, "summ*"),
        ("empty prompt", Prompt, ""),
        ("129-character prompt", Prompt, &long_tool),
        ("no scheme", Resource, "docs/a.md"),
        ("empty resource", Resource, ""),
        ("scheme starts with a digit", Resource, "9p://x"),
        ("underscore in scheme", Resource, "my_scheme://x"),
        ("space", Resource, "test://docs/a b"),
        ("tab", Resource, "test://docs/\ta"),
        ("newline", Resource, "test://docs/a\n"),
        ("control character", Resource, "test://docs/\u{1b}[31m"),
        ("star inside", Resource, "test://*/a"),
        ("two final stars", Resource, "test://docs/**"),
        ("leading star", Resource, "*test://docs"),
        ("2049 bytes", Resource, &long_uri),
    ];
    for (what, kind, name) in cases {
        let err = grant_of(&db, "acme", "files", Role::Worker, *kind, name).await.expect_err(what);
        assert!(matches!(err, StoreError::Invalid { field: "name", .. }), "{what}: `{err:?}` should name `name`");
        let err = revoke_of(&db, "acme", "files", Role::Worker, *kind, name).await.expect_err(what);
        assert!(matches!(err, StoreError::Invalid { field: "name", .. }), "{what}: revoke `{err:?}`");
    }
    assert_eq!(grant_count(&db).await, 1, "nothing was written");

    // Written around the store, the table still refuses an unknown kind and names too long
    // for their kind (128 characters for tools and prompts, 2048 for resources).
    let acme = tenant(&db, "acme").await;
    let long_prompt = "p".repeat(129);
    let too_long_uri = format!("test://{}", "d".repeat(2042));
    for (what, kind, name) in [
        ("unknown kind", "widget", "x"),
        ("plural kind", "tools", "x"),
        ("129-character prompt", "prompt", long_prompt.as_str()),
        ("2049-character resource", "resource", too_long_uri.as_str()),
        ("empty resource", "resource", ""),
    ] {
        let mut tx = db.begin().await.unwrap();
        let written = sqlx::query(
            "INSERT INTO mcp_server_grants (tenant_id, server, role, kind, name, created_at) \
             VALUES ($1, 'files', 'worker', $2, $3, 0)",
        )
        .bind(acme)
        .bind(kind)
        .bind(name)
        .execute(&mut *tx)
        .await;
        assert!(written.is_err(), "{what}: the database must refuse it");
    }
    assert_eq!(grant_count(&db).await, 1, "nothing was written");
}
both_dbs!(grants_bad_kind_names_refused, bad_kind_names_refused);

/// A database at migration 0010 (before kinds and unprefixed bindings) with grants and a
/// binding in it, migrated to the newest: every grant is a tool grant, every binding prefixed.
async fn migration_keeps_old_grants(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let folder = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let url = match backend {
        Backend::Sqlite => format!("{}?mode=rwc", test_db.url),
        Backend::Postgres => test_db.url.clone(),
    };
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("migrations").join(folder);
    sqlx::any::install_default_drivers();
    {
        use sqlx::Connection;
        let mut conn = sqlx::AnyConnection::connect(&url).await.unwrap();
        let migrator = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
        migrator.run_to(10, &mut conn).await.unwrap();
        for statement in [
            "INSERT INTO tenants (id, slug, name, status, created_at) \
             VALUES ('00000000-0000-7000-8000-000000000001', 'acme', 'Acme', 'active', 0)",
            "INSERT INTO executors (id, name, machine, run_as, kind, created_at) \
             VALUES ('x1', 'local', 'gw-host', 'gateway', 'local', 0)",
            "INSERT INTO mcp_server_bindings (tenant_id, server, executor_id, created_at) \
             VALUES ('00000000-0000-7000-8000-000000000001', 'files', 'x1', 0)",
            "INSERT INTO mcp_server_grants (tenant_id, server, role, tool, created_at) \
             VALUES ('00000000-0000-7000-8000-000000000001', 'files', 'worker', 'read_file', 5)",
            "INSERT INTO mcp_server_grants (tenant_id, server, role, tool, created_at) \
             VALUES ('00000000-0000-7000-8000-000000000001', 'files', 'owner', '*', 6)",
        ] {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
        conn.close().await.unwrap();
    }
    let db = db_for(&config_with(&test_db.url, &[])).await;
    assert!(db.is_ready().await, "migrated to the newest");
    let expected = vec![row("files", Role::Owner, "*"), row("files", Role::Worker, "read_file")];
    assert_eq!(listed(&db, "acme").await, expected, "the old grants are tool grants");
    let bindings = admin_tx!(db, |tx| entities::list_bindings(&mut tx, "acme")).unwrap();
    assert_eq!(bindings.len(), 1);
    assert!(bindings[0].prefixed, "the old binding keeps its prefix");

    // The key kept its meaning for tools and now includes the kind; the foreign key to the
    // binding survived the rebuild (unbinding drops them).
    let err = grant(&db, "acme", "files", Role::Worker, "read_file").await.expect_err("still a duplicate");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    grant_of(&db, "acme", "files", Role::Worker, GrantKind::Prompt, "read_file").await.unwrap();
    assert_eq!(listed(&db, "acme").await.len(), 3);
    let err = grant(&db, "acme", "cache", Role::Worker, "x").await.expect_err("unbound");
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    admin_tx!(db, |tx| entities::unbind_server(&mut tx, "acme", "files")).unwrap();
    assert_eq!(grant_count(&db).await, 0, "unbinding still drops the grants");

    // A fresh grant without a kind is a tool grant (the column's default).
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "files", "local")).unwrap();
    let acme = tenant(&db, "acme").await;
    let mut tx = db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO mcp_server_grants (tenant_id, server, role, name, created_at) VALUES ($1, 'files', 'worker', 'x', 0)",
    )
    .bind(acme)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(listed(&db, "acme").await, vec![row("files", Role::Worker, "x")]);
}
both_dbs!(grants_migration_keeps_old_grants, migration_keeps_old_grants);

async fn resolved(db: &Db, tenant_slug: &str) -> Vec<(String, bool)> {
    let t = tenant(db, tenant_slug).await;
    db.resolve_servers(t).await.unwrap().into_iter().map(|(s, r)| (s, r.prefixed)).collect()
}

async fn bindings(db: &Db, tenant_slug: &str) -> Vec<(String, String, bool)> {
    admin_tx!(db, |tx| entities::list_bindings(&mut tx, tenant_slug))
        .unwrap()
        .into_iter()
        .map(|b| (b.server, b.executor, b.prefixed))
        .collect()
}

async fn bind(db: &Db, tenant: &str, server: &str, executor: &str, prefixed: bool) -> Result<(), StoreError> {
    admin_tx!(db, |tx| entities::bind_server_with_prefix(
        &mut tx,
        tenant,
        server,
        executor,
        crate::support::unprefixed_beside(prefixed)
    ))
}

async fn unprefixed_bindings(backend: Backend) {
    let (_t, db) = setup(backend).await;
    let mut tx = db.begin().await.unwrap();
    for (tenant, server) in [("acme", "files"), ("acme", "wiki"), ("acme", "cache"), ("globex", "files")] {
        let entity = format!("defaults/mcp-servers/{server}");
        entities::create_entity(&mut tx, tenant, &entity, &serde_json::json!({"command": server})).await.unwrap();
    }
    tx.commit().await.unwrap();
    let s = |v: &str| v.to_owned();
    assert_eq!(resolved(&db, "acme").await, [(s("files"), true), (s("wiki"), true)], "prefixed by default");

    // Recorded and resolved.
    bind(&db, "acme", "files", "local", false).await.unwrap();
    assert_eq!(
        bindings(&db, "acme").await,
        [(s("files"), s("local"), false), (s("wiki"), s("local"), true)],
        "recorded"
    );
    assert_eq!(resolved(&db, "acme").await, [(s("files"), false), (s("wiki"), true)]);
    let acme = tenant(&db, "acme").await;
    assert!(!db.resolve_server(acme, "files").await.unwrap().unwrap().prefixed);
    assert!(db.resolve_server(acme, "wiki").await.unwrap().unwrap().prefixed);
    // Rebinding the unprefixed server unprefixed again (to another executor) is fine.
    bind(&db, "acme", "files", "build-01", false).await.unwrap();
    assert_eq!(resolved(&db, "acme").await, [(s("files"), false), (s("wiki"), true)]);
    // Another tenant has its own one.
    bind(&db, "globex", "files", "local", false).await.unwrap();
    assert_eq!(resolved(&db, "globex").await, [(s("files"), false)]);

    // A second unprefixed server of the tenant is refused, whether already bound or new, and
    // nothing is written.
    let before = bindings(&db, "acme").await;
    for server in ["wiki", "cache"] {
        let err = bind(&db, "acme", server, "local", false).await.expect_err("a second unprefixed server");
        assert!(matches!(err, StoreError::Invalid { field: "prefix", .. }), "{server}: {err:?}");
        assert!(err.to_string().contains("`files`"), "names the unprefixed one: {err}");
    }
    assert_eq!(bindings(&db, "acme").await, before, "nothing was written");

    // Rebinding without --no-prefix restores the prefix; then another server may drop it.
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "files", "local")).unwrap();
    assert_eq!(resolved(&db, "acme").await, [(s("files"), true), (s("wiki"), true)]);
    bind(&db, "acme", "wiki", "local", false).await.unwrap();
    assert_eq!(resolved(&db, "acme").await, [(s("files"), true), (s("wiki"), false)]);
    // Unbinding the unprefixed server frees the place too.
    admin_tx!(db, |tx| entities::unbind_server(&mut tx, "acme", "wiki")).unwrap();
    bind(&db, "acme", "cache", "local", false).await.unwrap();
    assert_eq!(resolved(&db, "acme").await, [(s("cache"), false), (s("files"), true)]);

    // Written around the store, the database keeps one unprefixed server per tenant and
    // `prefixed` to 0 or 1.
    for (what, statement) in [
        (
            "a second unprefixed server",
            "UPDATE mcp_server_bindings SET prefixed = 0 WHERE tenant_id = $1 AND server = 'files'",
        ),
        ("not 0 or 1", "UPDATE mcp_server_bindings SET prefixed = 2 WHERE tenant_id = $1 AND server = 'files'"),
    ] {
        let mut tx = db.begin().await.unwrap();
        let written = sqlx::query(statement).bind(acme).execute(&mut *tx).await;
        assert!(written.is_err(), "{what}: the database must refuse it");
    }
    assert_eq!(resolved(&db, "acme").await, [(s("cache"), false), (s("files"), true)]);
}
both_dbs!(bindings_unprefixed, unprefixed_bindings);
