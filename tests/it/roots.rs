//! Root allowances, on SQLite and PostgreSQL: a tenant allows a role to select plugin roots
//! under a base on a remote executor it owns, and nothing else; refused writes leave nothing
//! behind; a tenant sees and deletes only its own allowances; the decision over the stored rows
//! allows what they allow and refuses the rest; `scopegate admin root ...` does the same
//! through the binary.

use scopegate::model::Role;
use scopegate::selection::roots::check_root_selection;
use scopegate::store::roots::{self, RootAllowance};
use scopegate::store::{Db, RootAllowanceId, StoreError, TenantId, entities};

use crate::support::*;

/// The demo tenants; `local`; `build-01` (acme's), `build-02` (globex's) and `shared-01` (both).
async fn setup(backend: Backend) -> (TestDb, Db) {
    let test_db = TestDb::new(backend).await;
    let db = db_for(&config_with(&test_db.url, &[])).await;
    seed_demo(&db).await;
    let mut tx = db.begin().await.unwrap();
    entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
    entities::create_executor(&mut tx, "build-01", "build-01", "ci", "remote", &["acme"]).await.unwrap();
    entities::create_executor(&mut tx, "build-02", "build-02", "ci", "remote", &["globex"]).await.unwrap();
    entities::create_executor(&mut tx, "shared-01", "shared-01", "ci", "remote", &["acme", "globex"]).await.unwrap();
    tx.commit().await.unwrap();
    (test_db, db)
}

async fn allow(db: &Db, tenant: &str, executor: &str, base: &str, role: Role) -> Result<RootAllowanceId, StoreError> {
    admin_tx!(db, |tx| roots::allow_root(&mut tx, tenant, executor, base, role))
}

async fn listed(db: &Db, tenant: &str, executor: Option<&str>) -> Vec<(String, String, Role)> {
    let rows = admin_tx!(db, |tx| roots::list_root_allowances(&mut tx, tenant, executor)).unwrap();
    rows.into_iter().map(|r| (r.executor, r.base, r.role)).collect()
}

fn row(executor: &str, base: &str, role: Role) -> (String, String, Role) {
    (executor.into(), base.into(), role)
}

async fn count(db: &Db) -> i64 {
    let mut tx = db.begin_read().await.unwrap();
    sqlx::query_scalar("SELECT COUNT(*) FROM executor_root_allowances").fetch_one(&mut *tx).await.unwrap()
}

async fn tenant(db: &Db, slug: &str) -> TenantId {
    let mut tx = db.begin_read().await.unwrap();
    let id: String =
        sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1").bind(slug).fetch_one(&mut *tx).await.unwrap();
    id.parse().unwrap()
}

async fn allow_list_delete(backend: Backend) {
    let (_t, db) = setup(backend).await;
    let plugins = allow(&db, "acme", "build-01", "file:///srv/plugins", Role::Worker).await.unwrap();
    allow(&db, "acme", "build-01", "file:///srv/plugins", Role::Owner).await.unwrap();
    allow(&db, "acme", "shared-01", "file:///C:/plugins", Role::Owner).await.unwrap();
    allow(&db, "acme", "shared-01", "file://fileserver/plugins", Role::Manager).await.unwrap();
    allow(&db, "acme", "build-01", "file:///", Role::Auditor).await.unwrap();

    let all = vec![
        row("build-01", "file:///", Role::Auditor),
        row("build-01", "file:///srv/plugins", Role::Owner),
        row("build-01", "file:///srv/plugins", Role::Worker),
        row("shared-01", "file:///C:/plugins", Role::Owner),
        row("shared-01", "file://fileserver/plugins", Role::Manager),
    ];
    assert_eq!(listed(&db, "acme", None).await, all, "ordered by executor, base, role");
    assert_eq!(listed(&db, "acme", Some("shared-01")).await, all[3..].to_vec(), "one executor's");
    assert!(listed(&db, "acme", Some("build-02")).await.is_empty(), "another tenant's executor: none of acme's");
    let err = admin_tx!(db, |tx| roots::list_root_allowances(&mut tx, "acme", Some("nowhere"))).unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)) && err.to_string().contains("nowhere"), "{err}");

    // The runtime's read gives the same rows, with their ids.
    let acme = tenant(&db, "acme").await;
    let rows: Vec<RootAllowance> = db.root_allowances(acme).await.unwrap();
    assert_eq!(rows.iter().map(|r| (r.executor.clone(), r.base.clone(), r.role)).collect::<Vec<_>>(), all);
    assert!(rows.iter().any(|r| r.id == plugins && r.role == Role::Worker && r.created_at > 0));
    assert_eq!(db.owned_executors(acme).await.unwrap(), ["build-01", "shared-01"], "remote executors only");

    admin_tx!(db, |tx| roots::delete_root_allowance(&mut tx, "acme", &plugins.to_string())).unwrap();
    assert!(!listed(&db, "acme", None).await.contains(&row("build-01", "file:///srv/plugins", Role::Worker)));
    assert_eq!(count(&db).await, 4);
    let err = admin_tx!(db, |tx| roots::delete_root_allowance(&mut tx, "acme", &plugins.to_string())).unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "deleted once: {err:?}");
}
both_dbs!(roots_allow_list_delete, allow_list_delete);

async fn refused_allowances_write_nothing(backend: Backend) {
    let (_t, db) = setup(backend).await;
    allow(&db, "acme", "build-01", "file:///srv/plugins", Role::Worker).await.unwrap();
    let too_long = format!("file:///{}", "p".repeat(1020));
    let under = Some("under");
    let executor = Some("executor");
    // (why, tenant, executor, base, what the error mentions, the field it names)
    type Case<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str, Option<&'a str>);
    let cases: &[Case] = &[
        ("unknown tenant", "initech", "build-01", "file:///srv/x", "initech", None),
        ("unknown executor", "acme", "nowhere", "file:///srv/x", "nowhere", None),
        ("another tenant's executor", "globex", "build-01", "file:///srv/x", "does not own", executor),
        ("an executor of another tenant only", "acme", "build-02", "file:///srv/x", "does not own", executor),
        ("the gateway host", "acme", "local", "file:///srv/x", "local executor", executor),
        ("native POSIX path", "acme", "build-01", "/srv/plugins", "native path", under),
        ("native Windows path", "acme", "build-01", "C:\\plugins", "native path", under),
        ("relative path", "acme", "build-01", "plugins", "not a file: URI", under),
        ("other scheme", "acme", "build-01", "https://example.com/plugins", "not a file: URI", under),
        ("trailing slash", "acme", "build-01", "file:///srv/other/", "file:///srv/other`", under),
        ("dot-dot", "acme", "build-01", "file:///srv/plugins/../etc", "file:///srv/etc`", under),
        ("encoded dot-dot", "acme", "build-01", "file:///srv/plugins/%2E%2E", "file:///srv`", under),
        ("encoded slash", "acme", "build-01", "file:///srv/a%2Fb", "separator", under),
        ("lower-case drive", "acme", "build-01", "file:///c:/plugins", "file:///C:/plugins`", under),
        ("localhost", "acme", "build-01", "file://localhost/srv/x", "file:///srv/x`", under),
        ("longer than 1024 bytes", "acme", "build-01", &too_long, "1024", under),
        ("already allowed", "acme", "build-01", "file:///srv/plugins", "already", None),
    ];
    for (why, tenant, executor, base, mentions, field) in cases {
        // Committed even after the refusal: the function itself writes nothing before it refuses.
        let mut tx = db.begin().await.unwrap();
        let result = roots::allow_root(&mut tx, tenant, executor, base, Role::Worker).await;
        tx.commit().await.unwrap();
        let err = result.expect_err(why);
        assert!(err.to_string().contains(mentions), "{why}: `{err}` should mention `{mentions}`");
        let named = match &err {
            StoreError::Invalid { field, .. } => Some(*field),
            _ => None,
        };
        assert_eq!(named, *field, "{why}: {err:?}");
        assert_eq!(count(&db).await, 1, "{why}: nothing written");
    }

    // The table refuses, by itself, what the store never writes.
    let acme = tenant(&db, "acme").await;
    let globex = tenant(&db, "globex").await;
    let raw: &[(&str, TenantId, &str, &str, &str)] = &[
        ("unknown role", acme, "build-01", "file:///srv/y", "admin"),
        ("an executor the tenant does not own", globex, "build-01", "file:///srv/y", "owner"),
        ("the local executor", acme, "local", "file:///srv/y", "owner"),
        ("not a file: URI", acme, "build-01", "/srv/y", "owner"),
        ("a duplicate", acme, "build-01", "file:///srv/plugins", "worker"),
    ];
    for (why, tenant, executor, base, role) in raw {
        let mut tx = db.begin().await.unwrap();
        let written = sqlx::query(
            "INSERT INTO executor_root_allowances (id, tenant_id, executor_id, base, role, created_at) \
             SELECT $1, $2, id, $3, $4, 0 FROM executors WHERE name = $5",
        )
        .bind(RootAllowanceId::generate())
        .bind(*tenant)
        .bind(*base)
        .bind(*role)
        .bind(*executor)
        .execute(&mut *tx)
        .await;
        assert!(written.is_err(), "{why}: the database must refuse it");
    }
    assert_eq!(count(&db).await, 1, "nothing was written");
}
both_dbs!(roots_refused_allowances_write_nothing, refused_allowances_write_nothing);

async fn other_tenants_never_appear(backend: Backend) {
    let (_t, db) = setup(backend).await;
    // Both tenants own `shared-01` and allow the same base, for different roles.
    let mine = allow(&db, "acme", "shared-01", "file:///srv/plugins", Role::Worker).await.unwrap();
    let theirs = allow(&db, "globex", "shared-01", "file:///srv/plugins", Role::Owner).await.unwrap();
    allow(&db, "globex", "build-02", "file:///opt", Role::Owner).await.unwrap();
    assert_eq!(listed(&db, "acme", None).await, [row("shared-01", "file:///srv/plugins", Role::Worker)]);
    assert_eq!(
        listed(&db, "globex", None).await,
        [row("build-02", "file:///opt", Role::Owner), row("shared-01", "file:///srv/plugins", Role::Owner)]
    );
    assert!(listed(&db, "acme", Some("build-02")).await.is_empty());
    assert!(db.root_allowances(TenantId::generate()).await.unwrap().is_empty(), "an unknown tenant has none");

    // Deleting another tenant's id answers like an unknown id, and deletes nothing.
    let err = admin_tx!(db, |tx| roots::delete_root_allowance(&mut tx, "acme", &theirs.to_string())).unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)) && err.to_string().contains("acme"), "{err:?}");
    let unknown = RootAllowanceId::generate().to_string();
    let err2 = admin_tx!(db, |tx| roots::delete_root_allowance(&mut tx, "acme", &unknown)).unwrap_err();
    assert_eq!(err.to_string().replace(&theirs.to_string(), &unknown), err2.to_string(), "the same answer");
    let err = admin_tx!(db, |tx| roots::delete_root_allowance(&mut tx, "acme", "not-a-uuid")).unwrap_err();
    assert!(matches!(err, StoreError::Invalid { field: "id", .. }), "{err:?}");
    let err = admin_tx!(db, |tx| roots::delete_root_allowance(&mut tx, "initech", &mine.to_string())).unwrap_err();
    assert!(err.to_string().contains("initech"), "{err}");
    assert_eq!(count(&db).await, 3, "nothing deleted");

    // Globex deletes its own; acme's allowance of the same base stays.
    admin_tx!(db, |tx| roots::delete_root_allowance(&mut tx, "globex", &theirs.to_string())).unwrap();
    assert_eq!(listed(&db, "acme", None).await, [row("shared-01", "file:///srv/plugins", Role::Worker)]);
}
both_dbs!(roots_of_another_tenant_never_appear, other_tenants_never_appear);

async fn ownership_carries_the_allowances(backend: Backend) {
    let (_t, db) = setup(backend).await;
    allow(&db, "acme", "shared-01", "file:///srv/plugins", Role::Worker).await.unwrap();
    allow(&db, "acme", "build-01", "file:///srv/plugins", Role::Worker).await.unwrap();
    allow(&db, "globex", "shared-01", "file:///srv/plugins", Role::Worker).await.unwrap();

    // Taking the executor from acme takes acme's allowances on it, and only those.
    admin_tx!(db, |tx| entities::remove_executor_owner(&mut tx, "shared-01", "acme")).unwrap();
    assert_eq!(listed(&db, "acme", None).await, [row("build-01", "file:///srv/plugins", Role::Worker)]);
    assert_eq!(listed(&db, "globex", None).await, [row("shared-01", "file:///srv/plugins", Role::Worker)]);
    // Giving it back does not bring them back.
    admin_tx!(db, |tx| entities::add_executor_owner(&mut tx, "shared-01", "acme")).unwrap();
    assert_eq!(listed(&db, "acme", Some("shared-01")).await, []);

    // Deleting an executor takes every tenant's allowances on it.
    admin_tx!(db, |tx| entities::delete_executor(&mut tx, "shared-01")).unwrap();
    assert!(listed(&db, "globex", None).await.is_empty());
    assert_eq!(count(&db).await, 1);
}
both_dbs!(roots_ownership_carries_the_allowances, ownership_carries_the_allowances);

/// The decision over the rows the store read for one tenant.
async fn decision_over_stored_rows(backend: Backend) {
    let (_t, db) = setup(backend).await;
    allow(&db, "acme", "build-01", "file:///srv/plugins", Role::Worker).await.unwrap();
    allow(&db, "globex", "shared-01", "file:///srv", Role::Worker).await.unwrap();
    allow(&db, "globex", "build-02", "file:///srv", Role::Worker).await.unwrap();
    let acme = tenant(&db, "acme").await;
    let (allowances, owned) = (db.root_allowances(acme).await.unwrap(), db.owned_executors(acme).await.unwrap());
    let check = |roles: &[Role], executor: &str, path: &str| {
        check_root_selection(&allowances, &owned, roles, executor, path).map_err(|e| (e.field(), e.reason()))
    };

    let allowed = check(&[Role::Worker], "build-01", "file:///srv/plugins/demo").unwrap();
    assert_eq!(
        (allowed.root.to_string(), allowed.base.to_string()),
        ("file:///srv/plugins/demo".into(), "file:///srv/plugins".into())
    );
    assert_eq!(allowed.allowance, allowances[0].id);
    assert_eq!(check(&[Role::Worker], "build-01", "file:///srv/plugins2"), Err(("path", "outside_allowed_bases")));
    assert_eq!(check(&[Role::Worker], "build-01", "/srv/plugins/demo"), Err(("path", "not_file_uri")));
    assert_eq!(check(&[Role::Owner], "build-01", "file:///srv/plugins/demo"), Err(("executor", "no_allowance")));
    // Globex's allowances (on an executor acme co-owns, and on one it does not) give acme nothing.
    assert_eq!(check(&[Role::Worker], "shared-01", "file:///srv/x"), Err(("executor", "no_allowance")));
    assert_eq!(check(&[Role::Worker], "build-02", "file:///srv/x"), Err(("executor", "executor_not_owned")));
    assert_eq!(check(&[Role::Worker], "local", "file:///srv/plugins/x"), Err(("executor", "executor_not_owned")));
}
both_dbs!(roots_decision_over_stored_rows, decision_over_stored_rows);

/// `scopegate admin root ...` through the real binary.
async fn cli(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    migrate(dir.path(), &test_db.url);
    let run = |args: &[&str]| admin(dir.path(), &test_db.url, args);
    let ok = |args: &[&str]| {
        let (success, stdout, stderr) = run(args);
        assert!(success, "{args:?}: {stderr}");
        stdout
    };
    ok(&["tenant", "create", "initech", "--name", "Initech"]);
    ok(&["tenant", "create", "hooli", "--name", "Hooli"]);
    let remote = |name: &'static str, tenant: &'static str| {
        ["executor", "create", name, "--kind", "remote", "--machine", name, "--user", "ci", "--tenant", tenant]
    };
    ok(&remote("build-01", "initech"));
    ok(&remote("build-02", "hooli"));
    ok(&["executor", "create", "local", "--machine", "gw-host", "--user", "gateway"]);

    let allow = |tenant: &'static str, executor: &'static str, under: &'static str, role: &'static str| {
        ["root", "allow", "--tenant", tenant, "--executor", executor, "--under", under, "--role", role]
    };
    let stdout = ok(&allow("initech", "build-01", "file:///srv/plugins", "worker"));
    let id = stdout.trim_end().to_owned();
    assert_eq!(stdout, format!("{id}\n"), "stdout holds the new id alone");
    assert!(id.parse::<RootAllowanceId>().is_ok(), "{id}");
    ok(&allow("initech", "build-01", "file:///C:/plugins", "owner"));
    let hooli_id = ok(&allow("hooli", "build-02", "file:///opt/plugins", "owner")).trim_end().to_owned();

    let list = ["--json", "root", "list", "--tenant", "initech"];
    let listed: serde_json::Value = serde_json::from_str(&ok(&list)).unwrap();
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 2, "initech's rows only: {listed}");
    assert_eq!(
        rows[1],
        serde_json::json!({"id": id, "executor": "build-01", "base": "file:///srv/plugins", "role": "worker"})
    );
    assert_eq!(rows[0]["base"], "file:///C:/plugins");
    let table = ok(&["root", "list", "--tenant", "initech", "--executor", "build-01"]);
    assert!(table.starts_with("id") && table.contains("file:///srv/plugins") && table.contains(&id), "{table}");
    assert!(!table.contains("/opt/plugins"), "{table}");

    let before = ok(&list);
    let hooli_list = ["--json", "root", "list", "--tenant", "hooli"];
    let hooli_before = ok(&hooli_list);
    let refusals: Vec<(Vec<&str>, &str)> = vec![
        (allow("initech", "build-02", "file:///srv/plugins", "worker").to_vec(), "does not own"),
        (allow("initech", "local", "file:///srv/plugins", "worker").to_vec(), "executor"),
        (allow("initech", "nowhere", "file:///srv/plugins", "worker").to_vec(), "nowhere"),
        (allow("initech", "build-01", "/srv/plugins", "worker").to_vec(), "under"),
        (allow("initech", "build-01", "file:///srv/plugins/", "owner").to_vec(), "file:///srv/plugins`"),
        (allow("initech", "build-01", "file:///srv/x/../y", "owner").to_vec(), "under"),
        (allow("initech", "build-01", "file:///srv/plugins", "boss").to_vec(), "role"),
        (allow("initech", "build-01", "file:///srv/plugins", "worker").to_vec(), "already"),
        (allow("umbrella", "build-01", "file:///srv/plugins", "worker").to_vec(), "umbrella"),
        (vec!["root", "delete", "--tenant", "initech", &hooli_id], "does not exist"),
        (vec!["root", "delete", "--tenant", "initech", "42"], "id"),
        (vec!["root", "list", "--tenant", "initech", "--executor", "nowhere"], "nowhere"),
    ];
    for (argv, mentions) in &refusals {
        let (success, stdout, stderr) = run(argv);
        assert!(!success, "{argv:?} must be refused");
        assert!(stderr.contains(mentions), "{argv:?}: `{stderr}` should mention `{mentions}`");
        assert!(stdout.is_empty(), "{argv:?}: {stdout}");
    }
    assert_eq!(ok(&list), before, "the refusals wrote nothing");
    assert_eq!(ok(&hooli_list), hooli_before, "nor deleted another tenant's row");

    ok(&["root", "delete", "--tenant", "initech", &id]);
    assert!(!ok(&list).contains(&id));
    ok(&["executor", "delete", "build-01"]);
    assert_eq!(ok(&["root", "list", "--tenant", "initech"]).trim(), "(none)", "the executor took its allowances");
}
both_dbs!(roots_cli, cli);
