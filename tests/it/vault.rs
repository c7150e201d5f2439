//! The token vault on both databases: credentials round-trip per owner, the table holds no
//! plaintext, a ciphertext moved to another owner's row does not open, start-up refuses a
//! missing or wrong key, rotation re-seals all or nothing, and the CLI refuses bad key files.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use scopegate::Gateway;
use scopegate::store::vault::{self, CredentialStatus, TokenVault, VaultError, VaultKey};
use scopegate::store::{Db, TenantId, UserId};
use serde_json::json;

use crate::support::*;

const KEY_NAME: &str = "upstream.token_key_file";
const TOKEN: &[u8] = b"{\"access_token\":\"gho_s3cr3t-access\",\"refresh_token\":\"ghr_s3cr3t-refresh\"}";

fn new_key() -> (String, VaultKey) {
    let text = VaultKey::generate().unwrap();
    let key = VaultKey::parse(&text, KEY_NAME).unwrap();
    (text, key)
}

fn new_key_text() -> String {
    VaultKey::generate().unwrap()
}

fn write_key(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{text}\n")).unwrap();
    path.display().to_string()
}

async fn tenant(db: &Db, slug: &str) -> TenantId {
    let mut tx = db.begin_read().await.unwrap();
    sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1").bind(slug).fetch_one(&mut *tx).await.unwrap()
}

async fn user(db: &Db, subject: &str) -> UserId {
    let mut tx = db.begin_read().await.unwrap();
    sqlx::query_scalar("SELECT id FROM users WHERE subject = $1").bind(subject).fetch_one(&mut *tx).await.unwrap()
}

/// Every row as stored: (server, user_id or '', key_id, nonce, ciphertext, status).
async fn raw_rows(db: &Db) -> Vec<(String, String, String, String, String, String)> {
    let mut tx = db.begin_read().await.unwrap();
    sqlx::query_as(
        "SELECT server, COALESCE(user_id, ''), key_id, nonce, ciphertext, status FROM oauth_credentials \
         ORDER BY server, COALESCE(user_id, '')",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap()
}

async fn seeded(backend: Backend) -> (TestDb, Db) {
    let test_db = TestDb::new(backend).await;
    let db = db_for(&config_with(&test_db.url, &[])).await;
    seed_demo(&db).await;
    (test_db, db)
}

/// Tenant and per-user credentials are separate rows: each owner gets back only its own.
async fn round_trip_per_owner(backend: Backend) {
    let (_t, db) = seeded(backend).await;
    let (_, key) = new_key();
    let vault = TokenVault::new(db.clone(), key);
    let acme = tenant(&db, "acme").await;
    let globex = tenant(&db, "globex").await;
    let olivia = user(&db, "olivia@acme.test").await;
    let wanda = user(&db, "wanda@acme.test").await;

    assert_eq!(vault.get(acme, "github", None).await.unwrap(), None);
    vault.put(acme, "github", None, b"tenant-token").await.unwrap();
    vault.put(acme, "github", Some(olivia), b"olivia-token").await.unwrap();
    assert_eq!(vault.get(acme, "github", None).await.unwrap().as_deref(), Some(&b"tenant-token"[..]));
    assert_eq!(vault.get(acme, "github", Some(olivia)).await.unwrap().as_deref(), Some(&b"olivia-token"[..]));
    assert_eq!(vault.get(acme, "github", Some(wanda)).await.unwrap(), None, "never another user's token");
    assert_eq!(vault.get(globex, "github", None).await.unwrap(), None, "never another tenant's token");
    assert_eq!(vault.get(acme, "gitlab", None).await.unwrap(), None, "never another server's token");

    // Upsert: one row per owner, replaced in place; a put makes the status ok again.
    assert!(vault.mark_login_needed(acme, "github", Some(olivia)).await.unwrap());
    assert_eq!(vault.status(acme, "github", Some(olivia)).await.unwrap(), Some(CredentialStatus::LoginNeeded));
    assert_eq!(vault.status(acme, "github", None).await.unwrap(), Some(CredentialStatus::Ok), "only that owner");
    vault.put(acme, "github", Some(olivia), b"olivia-token-2").await.unwrap();
    vault.put(acme, "github", None, b"tenant-token-2").await.unwrap();
    assert_eq!(vault.status(acme, "github", Some(olivia)).await.unwrap(), Some(CredentialStatus::Ok));
    assert_eq!(vault.get(acme, "github", Some(olivia)).await.unwrap().as_deref(), Some(&b"olivia-token-2"[..]));
    assert_eq!(vault.get(acme, "github", None).await.unwrap().as_deref(), Some(&b"tenant-token-2"[..]));
    assert_eq!(raw_rows(&db).await.len(), 2, "a put replaces the owner's row");

    let listed = vault.list(acme).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!((listed[0].user, listed[1].user), (None, Some(olivia)), "the tenant's row first");
    let shown = serde_json::to_string(&listed).unwrap();
    assert!(!shown.contains("token"), "a listing never holds a credential: {shown}");
    assert!(vault.list(globex).await.unwrap().is_empty());

    // Bad input changes nothing: a bad server name, a user of another tenant, an unknown user.
    let before = raw_rows(&db).await;
    assert!(matches!(vault.put(acme, "bad__name", None, b"x").await, Err(VaultError::Store(_))));
    let globex_user = user(&db, "gary@globex.test").await;
    assert!(vault.put(acme, "github", Some(globex_user), b"x").await.is_err(), "a user of another tenant");
    assert!(vault.put(acme, "jira", Some(UserId::generate()), b"x").await.is_err(), "an unknown user");
    assert_eq!(raw_rows(&db).await, before, "refused writes change nothing");

    // Logout; deleting the user drops their credential.
    assert!(vault.delete(acme, "github", None).await.unwrap());
    assert!(!vault.delete(acme, "github", None).await.unwrap());
    assert_eq!(vault.get(acme, "github", None).await.unwrap(), None);
    assert!(!vault.mark_login_needed(acme, "github", None).await.unwrap());
    admin_tx!(db, |tx| scopegate::store::admin::delete_user(&mut tx, "acme", "olivia@acme.test")).unwrap();
    assert!(raw_rows(&db).await.is_empty(), "a deleted user's credential goes with them");
}
both_dbs!(round_trip_per_owner, round_trip_per_owner);

/// Two tenant-level rows for one server can't exist, even though UNIQUE treats NULLs as distinct.
async fn one_tenant_row_per_server(backend: Backend) {
    let (_t, db) = seeded(backend).await;
    let (_, key) = new_key();
    let vault = TokenVault::new(db.clone(), key);
    let acme = tenant(&db, "acme").await;
    vault.put(acme, "github", None, TOKEN).await.unwrap();
    let mut tx = db.begin().await.unwrap();
    let dup = sqlx::query(
        "INSERT INTO oauth_credentials (id, tenant_id, server, user_id, key_id, nonce, ciphertext, status, updated_at) \
         SELECT 'dup', tenant_id, server, NULL, key_id, nonce, ciphertext, status, updated_at FROM oauth_credentials",
    )
    .execute(&mut *tx)
    .await;
    assert!(dup.is_err(), "a second tenant-level row for the same server is refused");
}
both_dbs!(one_tenant_row_per_server, one_tenant_row_per_server);

/// The table holds neither the plaintext nor its base64 or hex forms.
async fn table_holds_no_plaintext(backend: Backend) {
    let (_t, db) = seeded(backend).await;
    let (key_text, key) = new_key();
    let vault = TokenVault::new(db.clone(), key);
    let acme = tenant(&db, "acme").await;
    vault.put(acme, "github", None, TOKEN).await.unwrap();
    vault.put(acme, "github", Some(user(&db, "olivia@acme.test").await), TOKEN).await.unwrap();
    let shown = format!("{vault:?}");
    assert!(shown.contains(vault.key_id()) && !shown.contains(&key_text), "Debug shows the key id only: {shown}");
    let rows = raw_rows(&db).await;
    assert_eq!(rows.len(), 2);
    assert_ne!(rows[0].4, rows[1].4, "a fresh nonce per seal: the same plaintext seals differently");
    let hex: String = TOKEN.iter().map(|b| format!("{b:02x}")).collect();
    let forbidden = [
        "s3cr3t".to_owned(),
        String::from_utf8(TOKEN.to_vec()).unwrap(),
        STANDARD.encode(TOKEN),
        URL_SAFE_NO_PAD.encode(TOKEN),
        hex.clone(),
        hex.to_uppercase(),
        STANDARD.encode(b"s3cr3t"),
        key_text.clone(),
    ];
    for row in &rows {
        let all = format!("{row:?}");
        for needle in &forbidden {
            assert!(!all.contains(needle.as_str()), "the stored row holds `{needle}`: {all}");
        }
        // The base64 of the plaintext at any alignment would share a long run with the column.
        let ciphertext = STANDARD.decode(&row.4).unwrap();
        assert!(!ciphertext.windows(6).any(|w| w == b"s3cr3t"), "the sealed bytes hold the plaintext");
    }
}
both_dbs!(table_holds_no_plaintext, table_holds_no_plaintext);

/// A ciphertext copied into another tenant's, user's or server's row does not open there, and
/// the error names the owner but never the plaintext.
async fn swapped_ciphertext_fails(backend: Backend) {
    let (_t, db) = seeded(backend).await;
    let (_, key) = new_key();
    let vault = TokenVault::new(db.clone(), key);
    let acme = tenant(&db, "acme").await;
    let globex = tenant(&db, "globex").await;
    let olivia = user(&db, "olivia@acme.test").await;
    let wanda = user(&db, "wanda@acme.test").await;
    vault.put(acme, "github", Some(olivia), TOKEN).await.unwrap();
    for (t, server, u, why) in [
        (acme, "github", Some(wanda), "another user's row"),
        (acme, "github", None, "the tenant's row"),
        (acme, "gitlab", Some(olivia), "another server's row"),
        (globex, "github", None, "another tenant's row"),
    ] {
        vault.put(t, server, u, b"placeholder").await.unwrap();
        let mut tx = db.begin().await.unwrap();
        sqlx::query(
            "UPDATE oauth_credentials SET (nonce, ciphertext) = (SELECT nonce, ciphertext FROM oauth_credentials \
              WHERE user_id = $1 AND server = 'github') WHERE tenant_id = $2 AND server = $3 AND COALESCE(user_id, '') = $4",
        )
        .bind(olivia)
        .bind(t)
        .bind(server)
        .bind(u.map(|u| u.to_string()).unwrap_or_default())
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let err = vault.get(t, server, u).await.expect_err(why);
        assert!(matches!(err, VaultError::Undecryptable { .. }), "{why}: {err}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cr3t") && !shown.contains("placeholder"), "{why}: {shown}");
    }
    assert_eq!(vault.get(acme, "github", Some(olivia)).await.unwrap().as_deref(), Some(TOKEN), "the original opens");

    // A flipped bit in the ciphertext is an error too, never garbage.
    let mut tx = db.begin().await.unwrap();
    let sealed: String =
        sqlx::query_scalar("SELECT ciphertext FROM oauth_credentials WHERE user_id = $1 AND server = 'github'")
            .bind(olivia)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    let mut bytes = STANDARD.decode(sealed).unwrap();
    bytes[0] ^= 1;
    sqlx::query("UPDATE oauth_credentials SET ciphertext = $1 WHERE user_id = $2 AND server = 'github'")
        .bind(STANDARD.encode(bytes))
        .bind(olivia)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let err = vault.get(acme, "github", Some(olivia)).await.unwrap_err();
    assert!(matches!(err, VaultError::Undecryptable { .. }), "{err}");
    assert!(!format!("{err} {err:?} {vault:?}").contains("s3cr3t"));
}
both_dbs!(swapped_ciphertext_fails, swapped_ciphertext_fails);

fn start_error(result: Result<Gateway, scopegate::app::StartError>) -> String {
    match result {
        Ok(_) => panic!("the gateway started"),
        Err(e) => e.to_string(),
    }
}

/// Start-up: no rows needs no key; rows need their own key; a malformed key file is refused.
async fn start_up_needs_the_sealing_key(backend: Backend) {
    let (test_db, db) = seeded(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let (key_text, key) = new_key();
    let (other_text, _) = new_key();
    let key_file = write_key(dir.path(), "key", &key_text);
    let other_file = write_key(dir.path(), "other", &other_text);
    let bad_file = write_key(dir.path(), "bad", &"00".repeat(32));
    let config = |file: &str| config_with(&test_db.url, &[("upstream.token_key_file", json!(file))]);

    // Nothing stored: starts with or without a key.
    drop(Gateway::build(config("")).await.expect("no credentials, no key needed"));
    drop(Gateway::build(config(&key_file)).await.expect("the key, no credentials"));
    let err = start_error(Gateway::build(config(&bad_file)).await);
    assert!(err.contains(KEY_NAME) && err.contains("base64"), "{err}");

    let key_id = key.id().to_owned();
    TokenVault::new(db.clone(), key).put(tenant(&db, "acme").await, "github", None, TOKEN).await.unwrap();
    let err = start_error(Gateway::build(config("")).await);
    assert!(err.contains(KEY_NAME) && err.contains(&key_id), "no key with credentials stored: {err}");
    let err = start_error(Gateway::build(config(&other_file)).await);
    assert!(err.contains(KEY_NAME) && err.contains(&key_id), "another key: {err}");
    assert!(!err.contains("s3cr3t") && !err.contains(&key_text) && !err.contains(&other_text), "{err}");
    let gateway = Gateway::build(config(&key_file)).await.expect("the sealing key");
    let vault = gateway.state().vault.as_ref().expect("the gateway holds the vault");
    assert_eq!(vault.get(tenant(&db, "acme").await, "github", None).await.unwrap().as_deref(), Some(TOKEN));
}
both_dbs!(start_up_needs_the_sealing_key, start_up_needs_the_sealing_key);

/// The key may come from an environment variable the configuration names instead of a file;
/// a variable that is not set, or both settings at once, are refused by name (here through
/// `admin oauth status`, which opens the vault like start-up does).
async fn key_from_the_environment(backend: Backend) {
    let (test_db, db) = seeded(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let (key_text, key) = new_key();
    let key_file = write_key(dir.path(), "key", &key_text);
    TokenVault::new(db.clone(), key).put(tenant(&db, "acme").await, "github", None, TOKEN).await.unwrap();
    let status = |envs: &[(&str, &str)]| {
        let mut command = scopegate(dir.path());
        command.env("SCOPEGATE_DATABASE__URL", &test_db.url).args(["admin", "oauth", "status", "--tenant", "acme"]);
        for (k, v) in envs {
            command.env(k, v);
        }
        outcome(&command.output().unwrap())
    };
    let (done, out, err) =
        status(&[("SCOPEGATE_UPSTREAM__TOKEN_KEY_ENV", "SG_TEST_TOKEN_KEY"), ("SG_TEST_TOKEN_KEY", &key_text)]);
    assert!(done && out.starts_with("github\ttenant\tok\t"), "{out}{err}");
    let (done, _, err) = status(&[("SCOPEGATE_UPSTREAM__TOKEN_KEY_ENV", "SG_TEST_TOKEN_KEY")]);
    assert!(!done && err.contains("upstream.token_key_env") && err.contains("SG_TEST_TOKEN_KEY"), "{err}");
    let both = [
        ("SCOPEGATE_UPSTREAM__TOKEN_KEY_ENV", "SG_TEST_TOKEN_KEY"),
        ("SG_TEST_TOKEN_KEY", key_text.as_str()),
        ("SCOPEGATE_UPSTREAM__TOKEN_KEY_FILE", key_file.as_str()),
    ];
    let (done, _, err) = status(&both);
    assert!(!done && err.contains("not both"), "{err}");
    let (done, _, err) = status(&[("SCOPEGATE_UPSTREAM__TOKEN_KEY_FILE", key_file.as_str())]);
    assert!(done, "{err}");
    assert!(!err.contains(&key_text), "the key is never printed");
}
both_dbs!(key_from_the_environment, key_from_the_environment);

/// Rotation re-seals every row under the new key in one transaction; a wrong old key, a row
/// under neither key or a row the old key can't open changes nothing.
async fn rotation_is_all_or_nothing(backend: Backend) {
    let (_t, db) = seeded(backend).await;
    let (old_text, _) = new_key();
    let (new_text, _) = new_key();
    let (_, stranger) = new_key();
    let key = |text: &str| VaultKey::parse(text, KEY_NAME).unwrap();
    let acme = tenant(&db, "acme").await;
    let olivia = user(&db, "olivia@acme.test").await;
    let globex = tenant(&db, "globex").await;
    let old_vault = TokenVault::new(db.clone(), key(&old_text));
    old_vault.put(acme, "github", None, b"acme-token").await.unwrap();
    old_vault.put(acme, "github", Some(olivia), b"olivia-token").await.unwrap();
    old_vault.put(globex, "jira", None, b"globex-token").await.unwrap();
    let before = raw_rows(&db).await;

    // A wrong old key: the rows are under neither key, nothing changes.
    let err = vault::rotate_key(&db, &stranger, &key(&new_text)).await.unwrap_err().to_string();
    assert!(err.contains(old_vault.key_id()) && err.contains("nothing was changed"), "{err}");
    assert_eq!(raw_rows(&db).await, before);
    assert!(vault::rotate_key(&db, &key(&old_text), &key(&old_text)).await.is_err(), "the same key twice");

    // One row the old key can't open (its nonce altered): the others are not re-sealed either.
    let set_nonce = |nonce: String| {
        let db = db.clone();
        async move {
            let mut tx = db.begin().await.unwrap();
            sqlx::query("UPDATE oauth_credentials SET nonce = $1 WHERE tenant_id = $2")
                .bind(nonce)
                .bind(globex)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    };
    let globex_nonce = before.iter().find(|r| r.0 == "jira").unwrap().3.clone();
    set_nonce(STANDARD.encode([9u8; 12])).await;
    let altered = raw_rows(&db).await;
    let err = vault::rotate_key(&db, &key(&old_text), &key(&new_text)).await.unwrap_err();
    assert!(matches!(err, VaultError::Undecryptable { .. }), "{err}");
    assert_eq!(raw_rows(&db).await, altered, "a failed rotation re-seals nothing");
    set_nonce(globex_nonce).await;

    // The rotation.
    let new_id = key(&new_text).id().to_owned();
    assert_eq!(vault::rotate_key(&db, &key(&old_text), &key(&new_text)).await.unwrap(), 3);
    let after = raw_rows(&db).await;
    assert_eq!(after.len(), 3);
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(b.2, new_id, "every row is under the new key");
        assert_ne!((&a.3, &a.4), (&b.3, &b.4), "re-sealed with a fresh nonce");
    }
    let err = old_vault.get(acme, "github", None).await.unwrap_err();
    assert!(matches!(err, VaultError::KeyMismatch(_)), "the old key no longer opens: {err}");
    assert!(vault::check_at_start(&db, Some(&key(&old_text))).await.is_err(), "start-up wants the new key");
    vault::check_at_start(&db, Some(&key(&new_text))).await.unwrap();
    let new_vault = TokenVault::new(db.clone(), key(&new_text));
    assert_eq!(new_vault.get(acme, "github", None).await.unwrap().as_deref(), Some(&b"acme-token"[..]));
    assert_eq!(new_vault.get(acme, "github", Some(olivia)).await.unwrap().as_deref(), Some(&b"olivia-token"[..]));
    assert_eq!(new_vault.get(globex, "jira", None).await.unwrap().as_deref(), Some(&b"globex-token"[..]));
    // Rotating again from the same old key finds nothing left to do.
    assert_eq!(vault::rotate_key(&db, &key(&old_text), &key(&new_text)).await.unwrap(), 0);
}
both_dbs!(rotation_is_all_or_nothing, rotation_is_all_or_nothing);

/// `admin oauth keygen` prints a key the vault accepts; `admin oauth rotate-key` rotates, and
/// refuses a bad key file with an error naming the flag, a non-zero exit and nothing changed.
async fn cli_keygen_and_rotate(backend: Backend) {
    let (test_db, db) = seeded(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| admin(dir.path(), &test_db.url, args);
    let (ok, out, err) = run(&["oauth", "keygen"]);
    assert!(ok, "{err}");
    let old_text = out.trim().to_owned();
    assert_eq!(out, format!("{old_text}\n"), "the key alone on stdout");
    let old_file = write_key(dir.path(), "old", &old_text);
    let (ok, out, _) = run(&["oauth", "keygen"]);
    assert!(ok);
    let new_file = write_key(dir.path(), "new", out.trim());
    let new_key = VaultKey::parse(&out, KEY_NAME).unwrap();
    TokenVault::new(db.clone(), VaultKey::parse(&old_text, KEY_NAME).unwrap())
        .put(tenant(&db, "acme").await, "github", None, TOKEN)
        .await
        .unwrap();
    let before = raw_rows(&db).await;

    let hex_file = write_key(dir.path(), "hex", &"ab".repeat(32));
    let stranger_file = write_key(dir.path(), "stranger", &new_key_text());
    let missing = dir.path().join("missing").display().to_string();
    for (args, flag) in [
        (["--old-key-file", hex_file.as_str(), "--new-key-file", new_file.as_str()], "--old-key-file"),
        (["--old-key-file", old_file.as_str(), "--new-key-file", hex_file.as_str()], "--new-key-file"),
        (["--old-key-file", missing.as_str(), "--new-key-file", new_file.as_str()], "--old-key-file"),
        (["--old-key-file", stranger_file.as_str(), "--new-key-file", new_file.as_str()], "--old-key-file"),
        (["--old-key-file", old_file.as_str(), "--new-key-file", old_file.as_str()], "--new-key-file"),
    ] {
        let (ok, out, err) = run(&[&["oauth", "rotate-key"][..], &args[..]].concat());
        assert!(!ok, "{args:?} is refused");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains(flag), "{args:?}: the error names {flag}: {err}");
        assert!(!err.contains("s3cr3t") && !err.contains(&old_text), "{err}");
        assert_eq!(raw_rows(&db).await, before, "{args:?} changes nothing");
    }

    let (ok, out, err) = run(&["oauth", "rotate-key", "--old-key-file", &old_file, "--new-key-file", &new_file]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1");
    assert!(err.contains(KEY_NAME), "tells where to point the configuration: {err}");
    let after = raw_rows(&db).await;
    assert_eq!(after[0].2, new_key.id());
    let vault = TokenVault::new(db.clone(), new_key);
    assert_eq!(vault.get(tenant(&db, "acme").await, "github", None).await.unwrap().as_deref(), Some(TOKEN));
}
both_dbs!(cli_keygen_and_rotate, cli_keygen_and_rotate);
