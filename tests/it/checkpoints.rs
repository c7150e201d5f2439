//! Signed checkpoints of the audit chains: a chain cut short after a checkpoint, a tampered
//! checkpoint, an unknown key are all reported by `audit verify --checkpoints`; an intact chain
//! verifies; the periodic writer writes only the heads that moved; bad key settings stop start-up.

use std::path::Path;

use figment::providers::Format as _;
use scopegate::audit::checkpoint::{self, CheckpointKey, Checkpointer, Sink};
use serde_json::{Value, json};

use crate::cli::scopegate;
use crate::mcp::{Live, Mode, ok};
use crate::support::*;

fn keygen(dir: &Path, name: &str) -> String {
    let out = scopegate(dir).args(["audit", "keygen", "--out", name]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.join(name)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the private key is readable by its owner only");
    }
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Runs `scopegate audit ARGS` on `live`'s database with the checkpoint settings; (success, stdout).
fn audit(live: &Live, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = scopegate(dir)
        .arg("audit")
        .args(args)
        .env("SCOPEGATE_DATABASE__URL", live.config.database.url.expose())
        .env("SCOPEGATE_AUDIT__CHECKPOINT_SINK", "file:checkpoints.jsonl")
        .env("SCOPEGATE_AUDIT__CHECKPOINT_KEY", "checkpoint.pem")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
}

async fn some_calls(live: &Live, subject: &str, n: usize) {
    let client = live.client(subject).await;
    for _ in 0..n {
        ok(&client, "whoami", json!({})).await;
    }
    client.cancel().await.ok();
}

async fn exec(live: &Live, sql: &str) {
    let mut tx = live.db.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
}

async fn truncation_after_a_checkpoint(backend: Backend) {
    let live = Live::start(backend, Mode::Stateless, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let public = keygen(dir.path(), "checkpoint.pem");
    some_calls(&live, "olivia@acme.test", 5).await;
    some_calls(&live, "gary@globex.test", 2).await;

    let (ok_, out) = audit(&live, dir.path(), &["checkpoint"]);
    assert!(ok_, "{out}");
    let file = dir.path().join("checkpoints.jsonl");
    let lines: Vec<Value> =
        std::fs::read_to_string(&file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let acme = lines.iter().find(|l| l["tenant"] == "acme").expect("a checkpoint for acme");
    assert_eq!(acme["seq"], 5, "{acme}");
    assert!(lines.iter().any(|l| l["tenant"] == "globex" && l["seq"] == 2), "{lines:?}");

    // Untouched, and grown past the checkpoint: ok, with the configured key or a given one.
    some_calls(&live, "olivia@acme.test", 2).await;
    let (ok_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl"]);
    assert!(ok_, "{out}");
    assert!(out.contains("acme: ok (7 events; 1 checkpoint(s) reached, the newest at seq 5)"), "{out}");
    let (ok_, out) =
        audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl", "--public-key", &public]);
    assert!(ok_, "{out}");

    // A base64url key can begin with `-`: it is taken as the key, not as an option.
    let (_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl", "--public-key", "-AAAA"]);
    assert!(!out.contains("unexpected argument"), "{out}");

    // Another key: the checkpoints are not trusted.
    let other = keygen(dir.path(), "other.pem");
    let (ok_, out) =
        audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl", "--public-key", &other]);
    assert!(!ok_, "{out}");
    assert!(out.contains("acme: checkpoint line") && out.contains("signed by an unknown key"), "{out}");

    // Someone deletes acme's newest events, from the checkpointed one on, and fixes the head
    // row to match: the chain itself still verifies, the checkpoint does not.
    let acme_id = "(SELECT id FROM tenants WHERE slug = 'acme')";
    exec(&live, &format!("DELETE FROM audit_events WHERE tenant_id = {acme_id} AND seq >= 5")).await;
    exec(
        &live,
        &format!(
            "UPDATE audit_heads SET seq = 4, hash = (SELECT hash FROM audit_events WHERE tenant_id = {acme_id} \
             AND seq = 4) WHERE tenant_id = {acme_id}"
        ),
    )
    .await;
    let (ok_, out) = audit(&live, dir.path(), &["verify"]);
    assert!(ok_, "without checkpoints the cut goes unnoticed: {out}");
    let (ok_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl"]);
    assert!(!ok_, "{out}");
    assert!(out.contains("acme: CHECKPOINT FAILED (4 events)"), "{out}");
    assert!(out.contains("no longer reaches the checkpointed head: it was at seq 5"), "{out}");
    assert!(out.contains("globex: ok (2 events; 1 checkpoint(s) reached"), "{out}");

    // A checkpoint line edited to claim an older head fails its signature.
    let text = std::fs::read_to_string(&file).unwrap();
    let edited: String = text
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if v["tenant"] == "acme" {
                v["seq"] = json!(4);
            }
            format!("{v}\n")
        })
        .collect();
    std::fs::write(dir.path().join("edited.jsonl"), edited).unwrap();
    let (ok_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "edited.jsonl"]);
    assert!(!ok_, "{out}");
    assert!(out.contains("acme: checkpoint line 1: signature does not verify"), "{out}");
}
both_dbs!(checkpoints_catch_truncation, truncation_after_a_checkpoint);

async fn periodic_writer_writes_moved_heads(backend: Backend) {
    let live = Live::start(backend, Mode::Stateless, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = CheckpointKey::generate().unwrap();
    let file = dir.path().join("heads.jsonl");
    let mut checkpointer = Checkpointer::new(live.db.clone(), key, Sink::File(file.clone())).unwrap();
    let tenants_in = || -> Vec<String> {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["tenant"].as_str().unwrap().to_owned())
            .collect()
    };

    assert_eq!(checkpointer.round().await.unwrap(), 0, "no events yet, nothing to protect");
    some_calls(&live, "olivia@acme.test", 3).await;
    assert_eq!(checkpointer.round().await.unwrap(), 1);
    assert_eq!(tenants_in(), ["acme"]);
    assert_eq!(checkpointer.round().await.unwrap(), 0, "no head moved");
    some_calls(&live, "gary@globex.test", 1).await;
    assert_eq!(checkpointer.round().await.unwrap(), 1);
    assert_eq!(tenants_in(), ["acme", "globex"]);
    some_calls(&live, "olivia@acme.test", 1).await;
    assert_eq!(checkpointer.round().await.unwrap(), 1);
    assert_eq!(tenants_in(), ["acme", "globex", "acme"]);
    // `audit checkpoint`'s way: every tenant.
    assert_eq!(checkpointer.all().await.unwrap(), 2);
    let heads = checkpoint::heads(&live.db).await.unwrap();
    assert_eq!(heads.iter().map(|h| (h.slug.as_str(), h.seq)).collect::<Vec<_>>(), [("acme", 4), ("globex", 1)]);
}
both_dbs!(checkpoints_periodic_writer_writes_moved_heads, periodic_writer_writes_moved_heads);

/// The gateway's own background writer, configured: its checkpoints appear and verify.
async fn gateway_writes_checkpoints(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    keygen(dir.path(), "checkpoint.pem");
    let sink = format!("file:{}", dir.path().join("checkpoints.jsonl").display());
    let key = dir.path().join("checkpoint.pem").display().to_string();
    let live = Live::start(
        backend,
        Mode::Stateless,
        &[
            ("audit.checkpoint_sink", json!(sink)),
            ("audit.checkpoint_key", json!(key)),
            ("audit.checkpoint_interval_secs", json!(1)),
        ],
    )
    .await;
    some_calls(&live, "olivia@acme.test", 2).await;
    let file = dir.path().join("checkpoints.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::fs::read_to_string(&file).unwrap_or_default().contains("\"acme\"") {
        assert!(std::time::Instant::now() < deadline, "no checkpoint written by the gateway");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (ok_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl"]);
    assert!(ok_, "{out}");
    assert!(out.contains("acme: ok (2 events; 1 checkpoint(s) reached, the newest at seq 2)"), "{out}");
}
both_dbs!(checkpoints_written_by_the_gateway, gateway_writes_checkpoints);

#[tokio::test]
async fn checkpoint_key_settings_are_checked_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("never.db").display());
    let figment = |overrides: &[(&str, &str)]| {
        let mut f = figment::Figment::from(figment::providers::Toml::string(scopegate::config::DEFAULT_TOML))
            .merge(figment::providers::Serialized::default("database.url", &db))
            .merge(figment::providers::Serialized::default("server.listen", "127.0.0.1:0"));
        for (k, v) in overrides {
            f = f.merge(figment::providers::Serialized::default(k, v));
        }
        scopegate::config::Config::from_figment(f)
    };
    let no_key = figment(&[("audit.checkpoint_sink", "stdout")]).unwrap_err().to_string();
    assert!(no_key.contains("audit.checkpoint_key"), "{no_key}");
    let bad_sink = figment(&[("audit.checkpoint_sink", "ftp://x")]).unwrap_err().to_string();
    assert!(bad_sink.contains("audit.checkpoint_sink"), "{bad_sink}");

    let missing = dir.path().join("missing.pem").display().to_string();
    std::fs::write(dir.path().join("junk.pem"), "not a key").unwrap();
    let junk = dir.path().join("junk.pem").display().to_string();
    for key in [missing, junk] {
        let config = figment(&[("audit.checkpoint_sink", "stdout"), ("audit.checkpoint_key", &key)]).unwrap();
        let Err(e) = scopegate::Gateway::build(config).await else {
            panic!("a gateway with checkpoint key {key} must not start");
        };
        let e = e.to_string();
        assert!(e.contains("audit.checkpoint_key") && e.contains(&key), "{e}");
    }
    assert!(!dir.path().join("never.db").exists(), "a refused start-up created no database");
}
