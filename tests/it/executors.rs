//! Remote executors belong to tenants and authenticate with a secret, on SQLite and PostgreSQL:
//! the secret is shown once and stored hashed, rotation and deletion end the old secret, only
//! owners bind to a remote executor, the resolver ignores a binding its tenant no longer owns,
//! and refused writes leave nothing behind.

use scopegate::store::entities::{self, AgentAuthError, executor_secret_hash};
use scopegate::store::{Db, StoreError, TenantId};
use serde_json::json;

use crate::support::*;

/// The demo tenants, `local`, and `build-01` (remote, owned by acme); returns its secret.
async fn setup(backend: Backend) -> (TestDb, Db, String) {
    let test_db = TestDb::new(backend).await;
    let db = db_for(&config_with(&test_db.url, &[])).await;
    seed_demo(&db).await;
    let mut tx = db.begin().await.unwrap();
    let none = entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
    assert_eq!(none, None, "a local executor has no secret");
    let secret = entities::create_executor(&mut tx, "build-01", "build-01", "ci", "remote", &["acme"]).await.unwrap();
    tx.commit().await.unwrap();
    (test_db, db, secret.expect("a remote executor gets a secret"))
}

async fn count(db: &Db, sql: &str) -> i64 {
    let mut tx = db.begin_read().await.unwrap();
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned())).fetch_one(&mut *tx).await.unwrap()
}

async fn stored_hash(db: &Db, name: &str) -> Option<String> {
    let mut tx = db.begin_read().await.unwrap();
    sqlx::query_scalar("SELECT secret_hash FROM executors WHERE name = $1")
        .bind(name)
        .fetch_one(&mut *tx)
        .await
        .unwrap()
}

async fn tenant(db: &Db, slug: &str) -> TenantId {
    let mut tx = db.begin_read().await.unwrap();
    let id: String =
        sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1").bind(slug).fetch_one(&mut *tx).await.unwrap();
    id.parse().unwrap()
}

async fn auth(db: &Db, name: &str, secret: &str) -> Result<String, AgentAuthError> {
    db.authenticate_executor(name, secret).await.unwrap().map(|x| x.name)
}

async fn secret_is_stored_hashed_and_authenticates(backend: Backend) {
    let (_t, db, secret) = setup(backend).await;
    let random = secret.strip_prefix("sgx_").expect("the secret starts with sgx_");
    assert_eq!(random.len(), 43, "32 bytes, base64url without padding: {secret}");
    assert!(random.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{secret}");

    let hash = stored_hash(&db, "build-01").await.expect("a remote executor has a hash");
    assert_eq!(hash, executor_secret_hash(&secret));
    assert_eq!(hash.len(), 64);
    assert!(!hash.contains(&secret) && hash != secret, "the secret itself is not stored");
    assert_eq!(stored_hash(&db, "local").await, None, "local has no secret");

    assert_eq!(auth(&db, "build-01", &secret).await, Ok("build-01".into()));
    let mut wrong = secret.clone();
    wrong.pop();
    wrong.push(if secret.ends_with('A') { 'B' } else { 'A' });
    assert_eq!(auth(&db, "build-01", &wrong).await, Err(AgentAuthError::WrongSecret));
    assert_eq!(auth(&db, "build-01", &hash).await, Err(AgentAuthError::WrongSecret), "the hash is no secret");
    assert_eq!(auth(&db, "build-01", "").await, Err(AgentAuthError::WrongSecret));
    assert_eq!(auth(&db, "build-02", &secret).await, Err(AgentAuthError::Unknown));
    assert_eq!(auth(&db, "local", &secret).await, Err(AgentAuthError::NotRemote));
    assert_eq!(auth(&db, "local", "").await, Err(AgentAuthError::NotRemote));

    let secrets = db.remote_executor_secrets().await.unwrap();
    assert_eq!(secrets.len(), 1, "only remote executors: {secrets:?}");
    assert_eq!(secrets["build-01"], hash);

    // A second remote executor gets a secret of its own.
    let other = admin_tx!(db, |tx| entities::create_executor(&mut tx, "build-02", "b2", "ci", "remote", &["globex"]))
        .unwrap()
        .unwrap();
    assert_ne!(other, secret);
    assert_eq!(auth(&db, "build-02", &secret).await, Err(AgentAuthError::WrongSecret));
    assert_eq!(auth(&db, "build-02", &other).await, Ok("build-02".into()));
}
both_dbs!(executors_secret_is_stored_hashed_and_authenticates, secret_is_stored_hashed_and_authenticates);

async fn rotation_and_deletion_end_the_old_secret(backend: Backend) {
    let (_t, db, old) = setup(backend).await;
    let new = admin_tx!(db, |tx| entities::rotate_executor_secret(&mut tx, "build-01")).unwrap();
    assert_ne!(new, old);
    assert_eq!(auth(&db, "build-01", &old).await, Err(AgentAuthError::WrongSecret), "the old secret stops working");
    assert_eq!(auth(&db, "build-01", &new).await, Ok("build-01".into()));
    assert_eq!(db.remote_executor_secrets().await.unwrap()["build-01"], executor_secret_hash(&new));

    let err = admin_tx!(db, |tx| entities::rotate_executor_secret(&mut tx, "local")).unwrap_err();
    assert!(matches!(err, StoreError::Invalid { field: "executor", .. }), "{err}");
    assert_eq!(stored_hash(&db, "local").await, None);
    let err = admin_tx!(db, |tx| entities::rotate_executor_secret(&mut tx, "nowhere")).unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)) && err.to_string().contains("nowhere"), "{err}");

    // Deleting it (existing behaviour: refused while bound) takes its owners and its secret.
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "db", "build-01")).unwrap();
    let err = admin_tx!(db, |tx| entities::delete_executor(&mut tx, "build-01")).unwrap_err();
    assert!(err.to_string().contains("bound"), "{err}");
    assert!(db.remote_executor_secrets().await.unwrap().contains_key("build-01"));
    admin_tx!(db, |tx| entities::unbind_server(&mut tx, "acme", "db")).unwrap();
    admin_tx!(db, |tx| entities::delete_executor(&mut tx, "build-01")).unwrap();
    assert!(db.remote_executor_secrets().await.unwrap().is_empty());
    assert_eq!(count(&db, "SELECT COUNT(*) FROM executor_owners").await, 0, "the owners went with it");
    assert_eq!(auth(&db, "build-01", &new).await, Err(AgentAuthError::Unknown));
}
both_dbs!(executors_rotation_and_deletion_end_the_old_secret, rotation_and_deletion_end_the_old_secret);

async fn only_owners_bind_a_remote_executor(backend: Backend) {
    let (_t, db, _) = setup(backend).await;
    let bindings = "SELECT COUNT(*) FROM mcp_server_bindings";
    let err = admin_tx!(db, |tx| entities::bind_server(&mut tx, "globex", "db", "build-01")).unwrap_err();
    assert!(matches!(err, StoreError::Invalid { field: "executor", .. }), "{err}");
    assert!(err.to_string().contains("does not own"), "{err}");
    assert_eq!(count(&db, bindings).await, 0, "a refused bind writes nothing");

    // Rebinding an existing binding to a remote executor it does not own is refused too.
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "globex", "db", "local")).unwrap();
    let err = admin_tx!(db, |tx| entities::bind_server(&mut tx, "globex", "db", "build-01")).unwrap_err();
    assert!(matches!(err, StoreError::Invalid { field: "executor", .. }), "{err}");
    let listed = admin_tx!(db, |tx| entities::list_bindings(&mut tx, "globex")).unwrap();
    assert_eq!(listed[0].executor, "local", "the binding is unchanged");

    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "db", "build-01")).unwrap();
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "wiki", "local")).unwrap();
    assert_eq!(count(&db, bindings).await, 3);

    // A new owner may bind; its last binding keeps it an owner until unbound.
    admin_tx!(db, |tx| entities::add_executor_owner(&mut tx, "build-01", "globex")).unwrap();
    let err = admin_tx!(db, |tx| entities::add_executor_owner(&mut tx, "build-01", "globex")).unwrap_err();
    assert!(err.to_string().contains("already owns"), "{err}");
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "globex", "db", "build-01")).unwrap();
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "globex", "cache", "build-01")).unwrap();
    let err = admin_tx!(db, |tx| entities::remove_executor_owner(&mut tx, "build-01", "globex")).unwrap_err();
    assert!(err.to_string().contains("cache, db"), "the refusal names the bound servers: {err}");
    admin_tx!(db, |tx| entities::unbind_server(&mut tx, "globex", "db")).unwrap();
    admin_tx!(db, |tx| entities::unbind_server(&mut tx, "globex", "cache")).unwrap();
    admin_tx!(db, |tx| entities::remove_executor_owner(&mut tx, "build-01", "globex")).unwrap();
    let err = admin_tx!(db, |tx| entities::bind_server(&mut tx, "globex", "db", "build-01")).unwrap_err();
    assert!(matches!(err, StoreError::Invalid { field: "executor", .. }), "{err}");

    // Refusals of the owner commands.
    let owners = "SELECT COUNT(*) FROM executor_owners";
    let cases: Vec<(&str, Result<(), StoreError>, &str)> = vec![
        (
            "not an owner",
            admin_tx!(db, |tx| entities::remove_executor_owner(&mut tx, "build-01", "globex")),
            "does not own",
        ),
        (
            "last owner",
            admin_tx!(db, |tx| {
                async {
                    entities::unbind_server(&mut tx, "acme", "db").await?;
                    entities::remove_executor_owner(&mut tx, "build-01", "acme").await
                }
            }),
            "last owner",
        ),
        ("local has no owners", admin_tx!(db, |tx| entities::add_executor_owner(&mut tx, "local", "acme")), "executor"),
        ("unknown tenant", admin_tx!(db, |tx| entities::add_executor_owner(&mut tx, "build-01", "initech")), "initech"),
        ("unknown executor", admin_tx!(db, |tx| entities::add_executor_owner(&mut tx, "nowhere", "acme")), "nowhere"),
    ];
    for (name, result, mentions) in cases {
        let err = result.expect_err(name);
        assert!(err.to_string().contains(mentions), "{name}: `{err}` should mention `{mentions}`");
    }
    assert_eq!(count(&db, owners).await, 1, "acme still owns build-01");
    assert_eq!(count(&db, bindings).await, 2, "acme's db (the refused removal unbound nothing) and wiki");

    let listed = admin_tx!(db, |tx| entities::list_executors(&mut tx)).unwrap();
    let owners_of = |name: &str| listed.iter().find(|x| x.name == name).unwrap().owners.clone();
    assert_eq!(owners_of("build-01"), vec!["acme".to_owned()]);
    assert!(owners_of("local").is_empty());
}
both_dbs!(executors_only_owners_bind_a_remote_executor, only_owners_bind_a_remote_executor);

async fn resolver_ignores_bindings_the_tenant_does_not_own(backend: Backend) {
    let (_t, db, _) = setup(backend).await;
    for (name, server) in [("defaults/mcp-servers/db", "db"), ("defaults/mcp-servers/wiki", "wiki")] {
        admin_tx!(db, |tx| entities::create_entity(&mut tx, "acme", name, &json!({"command": server}))).unwrap();
    }
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "db", "build-01")).unwrap();
    admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "wiki", "local")).unwrap();
    let acme = tenant(&db, "acme").await;
    let servers = |all: Vec<(String, entities::ResolvedEntity)>| all.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
    assert!(db.resolve_server(acme, "db").await.unwrap().is_some());
    assert_eq!(servers(db.resolve_servers(acme).await.unwrap()), ["db", "wiki"]);

    // The owner row goes behind the store's back: the binding stays, and resolves no more.
    let mut tx = db.begin().await.unwrap();
    sqlx::query("DELETE FROM executor_owners").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&db, "SELECT COUNT(*) FROM mcp_server_bindings").await, 2);
    assert_eq!(db.resolve_server(acme, "db").await.unwrap(), None, "a remote binding without ownership");
    assert_eq!(servers(db.resolve_servers(acme).await.unwrap()), ["wiki"], "local needs no owner");
    assert!(db.resolve_server(acme, "wiki").await.unwrap().is_some());

    // A binding written by hand for another tenant does not resolve either.
    let globex = tenant(&db, "globex").await;
    admin_tx!(db, |tx| entities::create_entity(&mut tx, "globex", "defaults/mcp-servers/db", &json!({"command": "x"})))
        .unwrap();
    let mut tx = db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO mcp_server_bindings (tenant_id, server, executor_id, created_at) \
         SELECT $1, 'db', id, 0 FROM executors WHERE name = 'build-01'",
    )
    .bind(globex)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.resolve_server(globex, "db").await.unwrap(), None);
    assert!(db.resolve_servers(globex).await.unwrap().is_empty());
}
both_dbs!(
    executors_resolver_ignores_bindings_the_tenant_does_not_own,
    resolver_ignores_bindings_the_tenant_does_not_own
);

async fn refused_creates_write_nothing(backend: Backend) {
    let (_t, db, _) = setup(backend).await;
    let executors = "SELECT COUNT(*) FROM executors";
    let owners = "SELECT COUNT(*) FROM executor_owners";
    let cases: &[(&str, &str, &[&str], &str)] = &[
        ("remote without owners", "remote", &[], "--tenant"),
        ("local with an owner", "local", &["acme"], "--tenant"),
        ("an unknown owner after a known one", "remote", &["acme", "initech"], "initech"),
        ("an unknown kind", "cloud", &["acme"], "kind"),
    ];
    for (name, kind, tenants, mentions) in cases {
        // Committed even after the refusal: the function itself writes nothing before it refuses.
        let mut tx = db.begin().await.unwrap();
        let result = entities::create_executor(&mut tx, "e2", "m2", "u2", kind, tenants).await;
        tx.commit().await.unwrap();
        let err = result.expect_err(name);
        assert!(err.to_string().contains(mentions), "{name}: `{err}` should mention `{mentions}`");
        assert_eq!(count(&db, executors).await, 2, "{name}: no executor row");
        assert_eq!(count(&db, owners).await, 1, "{name}: no owner rows");
    }
    let err = admin_tx!(db, |tx| entities::create_executor(&mut tx, "build-01", "x", "y", "remote", &["globex"]))
        .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(count(&db, owners).await, 1);
    assert!(db.remote_executor_secrets().await.unwrap().len() == 1);
}
both_dbs!(executors_refused_creates_write_nothing, refused_creates_write_nothing);

/// `scopegate admin executor ...`: the secret alone on stdout, once; never in a listing.
async fn cli_prints_the_secret_once(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    migrate(dir.path(), &test_db.url);
    let run = |args: &[&str]| admin(dir.path(), &test_db.url, args);
    let ok = |args: &[&str]| {
        let (success, stdout, stderr) = run(args);
        assert!(success, "{args:?}: {stderr}");
        (stdout, stderr)
    };
    ok(&["tenant", "create", "initech", "--name", "Initech"]);
    ok(&["tenant", "create", "hooli", "--name", "Hooli"]);
    let (stdout, _) = ok(&["executor", "create", "local", "--machine", "gw-host", "--user", "gateway"]);
    assert_eq!(stdout, "", "a local executor has no secret");
    let create =
        ["executor", "create", "build-01", "--kind", "remote", "--machine", "build-01", "--user", "ci", "--tenant"];
    let (stdout, stderr) = ok(&[&create[..], &["initech", "--tenant", "hooli"]].concat());
    let secret = stdout.trim_end().to_owned();
    assert_eq!(stdout, format!("{secret}\n"), "stdout holds the secret alone");
    assert!(secret.starts_with("sgx_"), "{secret}");
    assert!(stderr.contains("only once") && !stderr.contains(&secret), "{stderr}");

    let db = db_for(&config_with(&test_db.url, &[])).await;
    let hash = stored_hash(&db, "build-01").await.unwrap();
    assert_eq!(hash, executor_secret_hash(&secret));
    assert_eq!(auth(&db, "build-01", &secret).await, Ok("build-01".into()));

    for listing in [ok(&["executor", "list"]).0, ok(&["--json", "executor", "list"]).0] {
        assert!(listing.contains("hooli,initech"), "owners are listed: {listing}");
        assert!(!listing.contains(&secret) && !listing.contains(&hash), "no secret, no hash: {listing}");
    }

    let (stdout, stderr) = ok(&["executor", "rotate-secret", "build-01"]);
    let rotated = stdout.trim_end().to_owned();
    assert_eq!(stdout, format!("{rotated}\n"));
    assert!(rotated.starts_with("sgx_") && rotated != secret && stderr.contains("only once"));
    assert_eq!(auth(&db, "build-01", &secret).await, Err(AgentAuthError::WrongSecret));
    assert_eq!(auth(&db, "build-01", &rotated).await, Ok("build-01".into()));

    ok(&["binding", "set", "--tenant", "hooli", "notes", "build-01"]);
    ok(&["executor", "owner", "remove", "--tenant", "initech", "build-01"]);
    ok(&["executor", "owner", "add", "--tenant", "initech", "build-01"]);

    let refusals: &[(&[&str], &str)] = &[
        (&["executor", "create", "e2", "--kind", "remote", "--machine", "m", "--user", "u"], "--tenant"),
        (&["executor", "create", "e2", "--machine", "m", "--user", "u", "--tenant", "initech"], "--tenant"),
        (
            &["executor", "create", "e3", "--kind", "remote", "--machine", "m", "--user", "u", "--tenant", "nowhere"],
            "nowhere",
        ),
        (&["executor", "rotate-secret", "local"], "executor"),
        (&["executor", "owner", "remove", "--tenant", "hooli", "build-01"], "notes"),
        (&["executor", "delete", "build-01"], "bound"),
    ];
    let before = ok(&["--json", "executor", "list"]).0;
    for (args, field) in refusals {
        let (success, stdout, stderr) = run(args);
        assert!(!success, "{args:?} must be refused");
        assert!(stderr.contains(field), "{args:?}: `{stderr}` should name `{field}`");
        assert!(stdout.is_empty(), "{args:?}: nothing on stdout, no secret: {stdout}");
    }
    assert_eq!(ok(&["--json", "executor", "list"]).0, before, "refusals change nothing");
    assert_eq!(auth(&db, "build-01", &rotated).await, Ok("build-01".into()));
    db.close().await;
}
both_dbs!(executors_cli_prints_the_secret_once, cli_prints_the_secret_once);
