//! Signed checkpoints of the audit chains: a chain cut short after a checkpoint, a tampered
//! checkpoint, an unknown key are all reported by `audit verify --checkpoints`; an intact chain
//! verifies; the periodic writer writes only the heads that moved; bad key settings stop start-up.
//! And `audit export`: one tenant's chain streamed as JSON lines or CSV, every row checked by
//! `audit verify-export` against its own fields, its neighbours and the signed checkpoints.

use std::path::Path;

use figment::providers::Format as _;
use scopegate::audit::checkpoint::{self, CheckpointKey, Checkpointer, Sink};
use serde_json::{Value, json};

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

/// Runs `scopegate audit ARGS` on `live`'s database with the checkpoint settings; (success,
/// stdout and stderr).
fn audit(live: &Live, dir: &Path, args: &[&str]) -> (bool, String) {
    let (ok, stdout, stderr) = audit_apart(live, dir, args);
    (ok, format!("{stdout}{stderr}"))
}

/// [`audit`], with stdout and stderr apart.
fn audit_apart(live: &Live, dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = scopegate(dir)
        .arg("audit")
        .args(args)
        .env("SCOPEGATE_DATABASE__URL", live.config.database.url.expose())
        .env("SCOPEGATE_AUDIT__CHECKPOINT_SINK", "file:checkpoints.jsonl")
        .env("SCOPEGATE_AUDIT__CHECKPOINT_KEY", "checkpoint.pem")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// `n` calls of a native tool: two events each (the record, the outcome), all committed.
async fn some_calls(live: &Live, subject: &str, n: usize) {
    let client = live.client(subject).await;
    for _ in 0..n {
        ok(&client, "whoami", json!({})).await;
    }
    client.cancel().await.ok();
    live.settle_audit().await;
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
    assert_eq!(acme["seq"], 10, "{acme}");
    assert!(lines.iter().any(|l| l["tenant"] == "globex" && l["seq"] == 4), "{lines:?}");

    // Untouched, and grown past the checkpoint: ok, with the configured key or a given one.
    some_calls(&live, "olivia@acme.test", 2).await;
    let (ok_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl"]);
    assert!(ok_, "{out}");
    assert!(out.contains("acme: ok (14 events; 1 checkpoint(s) reached, the newest at seq 10)"), "{out}");
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
    exec(&live, &format!("DELETE FROM audit_events WHERE tenant_id = {acme_id} AND seq >= 10")).await;
    exec(
        &live,
        &format!(
            "UPDATE audit_heads SET seq = 9, hash = (SELECT hash FROM audit_events WHERE tenant_id = {acme_id} \
             AND seq = 9) WHERE tenant_id = {acme_id}"
        ),
    )
    .await;
    let (ok_, out) = audit(&live, dir.path(), &["verify"]);
    assert!(ok_, "without checkpoints the cut goes unnoticed: {out}");
    let (ok_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl"]);
    assert!(!ok_, "{out}");
    assert!(out.contains("acme: CHECKPOINT FAILED (9 events)"), "{out}");
    assert!(out.contains("no longer reaches the checkpointed head: it was at seq 10"), "{out}");
    assert!(out.contains("globex: ok (4 events; 1 checkpoint(s) reached"), "{out}");

    // A checkpoint line edited to claim an older head fails its signature.
    let text = std::fs::read_to_string(&file).unwrap();
    let edited: String = text
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if v["tenant"] == "acme" {
                v["seq"] = json!(9);
            }
            format!("{v}\n")
        })
        .collect();
    std::fs::write(dir.path().join("edited.jsonl"), edited).unwrap();
    let (ok_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "edited.jsonl"]);
    assert!(!ok_, "{out}");
    assert!(out.contains("acme: checkpoint line ") && out.contains(": signature does not verify"), "{out}");
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
    // `audit checkpoint`'s way: every chain, the platform chain's too. Each call is two
    // events (its record, its outcome): acme's four calls end at seq 8, globex's one at 2.
    assert_eq!(checkpointer.all().await.unwrap(), 3);
    let heads = checkpoint::heads(&live.db).await.unwrap();
    assert_eq!(
        heads.iter().map(|h| (h.slug.as_str(), h.seq)).collect::<Vec<_>>(),
        [("@platform", 0), ("acme", 8), ("globex", 2)]
    );
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
    eventually("no checkpoint written by the gateway", || async {
        std::fs::read_to_string(&file).unwrap_or_default().contains("\"acme\"")
    })
    .await;
    let (ok_, out) = audit(&live, dir.path(), &["verify", "--checkpoints", "checkpoints.jsonl"]);
    assert!(ok_, "{out}");
    // Two calls, each its record and its outcome.
    assert!(out.contains("acme: ok (4 events; 1 checkpoint(s) reached, the newest at seq 4)"), "{out}");
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

// ---- audit export ----

/// The chain of acme (six calls, so twelve events: each call's record and its outcome; the
/// eighth event, the end of the fourth call, checkpointed) exported both ways and from a time
/// on; each JSON line hashes to its `hash` by the documented recipe; `verify-export` accepts the
/// files and names the line of an edited row; a row changed in the database is exported as
/// stored and makes the export exit non-zero; an unknown tenant or a bad time writes nothing.
async fn export_and_verify(backend: Backend) {
    let live = Live::start(backend, Mode::Stateless, &[("audit.record_raw_arguments", json!(true))]).await;
    let dir = tempfile::tempdir().unwrap();
    keygen(dir.path(), "checkpoint.pem");
    some_calls(&live, "olivia@acme.test", 4).await;
    some_calls(&live, "gary@globex.test", 2).await;
    let (ok_, out) = audit(&live, dir.path(), &["checkpoint"]);
    assert!(ok_, "{out}");
    some_calls(&live, "olivia@acme.test", 2).await;

    let (ok_, jsonl, stderr) = audit_apart(&live, dir.path(), &["export", "--tenant", "acme"]);
    assert!(ok_, "{stderr}");
    assert!(stderr.contains("acme: 12 event(s) exported, seq 1 to 12"), "{stderr}");
    let rows: Vec<Value> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.iter().map(|r| r["seq"].as_i64().unwrap()).collect::<Vec<_>>(), (1..=12).collect::<Vec<_>>());
    let tenant = rows[0]["tenant_id"].clone();
    for row in &rows {
        assert_eq!(row["tenant_id"], tenant, "one tenant's chain only");
        let mut body = row.clone();
        let hash = body.as_object_mut().unwrap().remove("hash").unwrap();
        let canonical = scopegate::audit::digest::canonical_json(&body);
        assert_eq!(scopegate::audit::digest::sha256_hex(canonical.as_bytes()), hash.as_str().unwrap(), "{row}");
    }
    std::fs::write(dir.path().join("acme.jsonl"), &jsonl).unwrap();
    let (ok_, out) = audit(&live, dir.path(), &["verify-export", "acme.jsonl", "--checkpoints", "checkpoints.jsonl"]);
    assert!(ok_, "{out}");
    let head = rows[11]["hash"].as_str().unwrap();
    assert!(out.contains(&format!("ok: 12 event(s) of tenant {}, seq 1", tenant.as_str().unwrap())), "{out}");
    assert!(out.contains(&format!("to 12, head {head}")), "{out}");
    assert!(out.contains("1 row(s) hold the hash a signed checkpoint gives them"), "{out}");

    let (ok_, csv, stderr) = audit_apart(&live, dir.path(), &["export", "--tenant", "acme", "--format", "csv"]);
    assert!(ok_, "{stderr}");
    assert!(csv.starts_with("seq,id,tenant_id,"), "{csv}");
    std::fs::write(dir.path().join("acme.csv"), &csv).unwrap();
    let (ok_, out) = audit(&live, dir.path(), &["verify-export", "acme.csv"]);
    assert!(ok_, "{out}");
    assert!(out.contains(&format!("to 12, head {head}")), "{out}");

    // From a time on: from the first event at or after it, every later link.
    let third = rows[2]["occurred_at"].as_i64().unwrap();
    let (ok_, since, stderr) =
        audit_apart(&live, dir.path(), &["export", "--tenant", "acme", "--since", &third.to_string()]);
    assert!(ok_, "{stderr}");
    let seqs: Vec<i64> =
        since.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_i64().unwrap()).collect();
    assert!(seqs[0] <= 3 && seqs.last() == Some(&12) && seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // It starts at the second call's outcome or later: outcomes of calls recorded before it
    // are taken, every record in it has its outcome.
    std::fs::write(dir.path().join("since.jsonl"), &since).unwrap();
    let (ok_, out) = audit(&live, dir.path(), &["verify-export", "since.jsonl"]);
    assert!(ok_ && out.contains("to 12, head") && !out.contains("outcome unknown"), "{out}");
    // The last call's outcome cut off: its record is listed, the rest verifies.
    let cut: String = jsonl.lines().take(11).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.path().join("cut.jsonl"), cut).unwrap();
    let (ok_, out) = audit(&live, dir.path(), &["verify-export", "cut.jsonl"]);
    assert!(ok_ && out.contains("outcome unknown: the call of `whoami` recorded at seq 11"), "{out}");
    let (ok_, all, _) =
        audit_apart(&live, dir.path(), &["export", "--tenant", "acme", "--since", "2000-01-01T00:00:00Z"]);
    assert!(ok_);
    assert_eq!(all, jsonl);
    let (ok_, none, stderr) =
        audit_apart(&live, dir.path(), &["export", "--tenant", "acme", "--since", "2999-01-01T00:00:00Z"]);
    assert!(ok_ && none.is_empty() && stderr.contains("no event"), "{none}{stderr}");

    // An edited row of the file is named by its line: the first call's outcome, made a denial.
    assert_eq!((&rows[1]["outcome"], &rows[1]["call_id"]), (&json!("ok"), &rows[0]["id"]), "{}", rows[1]);
    let edited: String = rows
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if r["seq"] == 2 {
                r["outcome"] = json!("denied");
            }
            format!("{r}\n")
        })
        .collect();
    std::fs::write(dir.path().join("edited.jsonl"), edited).unwrap();
    let (ok_, out) = audit(&live, dir.path(), &["verify-export", "edited.jsonl"]);
    assert!(!ok_ && out.contains("edited.jsonl: line 2: seq 2: hash does not match"), "{out}");
    let dropped: String = jsonl.lines().filter(|l| !l.contains("\"seq\":4,")).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.path().join("dropped.jsonl"), dropped).unwrap();
    let (ok_, out) = audit(&live, dir.path(), &["verify-export", "dropped.jsonl"]);
    assert!(!ok_ && out.contains("line 4: seq 5: sequence gap"), "{out}");

    // A row changed in the database is exported as stored, and the export fails.
    exec(
        &live,
        "UPDATE audit_events SET duration_us = duration_us + 1 WHERE seq = 2 AND tenant_id = \
                 (SELECT id FROM tenants WHERE slug = 'acme')",
    )
    .await;
    let (ok_, tampered, stderr) = audit_apart(&live, dir.path(), &["export", "--tenant", "acme"]);
    assert!(!ok_, "{stderr}");
    assert_eq!(tampered.lines().count(), 12);
    assert!(stderr.contains("does not hold at seq 2: hash does not match"), "{stderr}");

    // Bad input: a clear error and no output.
    let (ok_, out, stderr) = audit_apart(&live, dir.path(), &["export", "--tenant", "nope"]);
    assert!(!ok_ && out.is_empty() && stderr.contains("tenant `nope` does not exist"), "{stderr}");
    let (ok_, out, stderr) = audit_apart(&live, dir.path(), &["export", "--tenant", "acme", "--since", "yesterday"]);
    assert!(!ok_ && out.is_empty() && stderr.contains("--since `yesterday`"), "{stderr}");
    let (ok_, out) = audit(&live, dir.path(), &["verify-export", "missing.jsonl"]);
    assert!(!ok_ && out.contains("missing.jsonl"), "{out}");
}
both_dbs!(audit_export_verifies_row_by_row, export_and_verify);

/// An export always runs to the head of its chain, so one that ends below a signed checkpoint
/// of its tenant was cut short: `verify-export --checkpoints` names both seqs and fails, in
/// either format. An export that reaches the checkpoint, one that starts later (`--since`) and
/// the same cut checked without checkpoints all pass.
async fn export_cut_below_a_checkpoint(backend: Backend) {
    let live = Live::start(backend, Mode::Stateless, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    keygen(dir.path(), "checkpoint.pem");
    some_calls(&live, "olivia@acme.test", 5).await;
    let (ok_, out) = audit(&live, dir.path(), &["checkpoint"]);
    assert!(ok_, "{out}");
    some_calls(&live, "olivia@acme.test", 2).await;
    let verify = |file: &str| audit(&live, dir.path(), &["verify-export", file, "--checkpoints", "checkpoints.jsonl"]);
    let first_lines = |text: &str, n: usize| text.lines().take(n).map(|l| format!("{l}\n")).collect::<String>();

    // Seven calls, each its record and its outcome: fourteen events, the tenth checkpointed.
    let (ok_, jsonl, stderr) = audit_apart(&live, dir.path(), &["export", "--tenant", "acme"]);
    assert!(ok_ && jsonl.lines().count() == 14, "{stderr}");
    std::fs::write(dir.path().join("whole.jsonl"), &jsonl).unwrap();
    let (ok_, out) = verify("whole.jsonl");
    assert!(ok_, "{out}");

    std::fs::write(dir.path().join("cut.jsonl"), first_lines(&jsonl, 3)).unwrap();
    let (ok_, out) = verify("cut.jsonl");
    assert!(!ok_, "an export cut below the checkpoint must fail: {out}");
    assert!(
        out.contains("cut.jsonl: line 4: the export ends at seq 3, below the signed checkpoint at seq 10"),
        "{out}"
    );
    let (ok_, out) = audit(&live, dir.path(), &["verify-export", "cut.jsonl"]);
    assert!(ok_, "without checkpoints nothing shows the cut: {out}");

    let (ok_, csv, _) = audit_apart(&live, dir.path(), &["export", "--tenant", "acme", "--format", "csv"]);
    assert!(ok_);
    // The header and nine rows: one short of the checkpoint.
    std::fs::write(dir.path().join("cut.csv"), first_lines(&csv, 10)).unwrap();
    let (ok_, out) = verify("cut.csv");
    assert!(!ok_ && out.contains("ends at seq 9, below the signed checkpoint at seq 10"), "{out}");

    // Cut at the checkpointed row itself: what was signed is all there.
    std::fs::write(dir.path().join("to-checkpoint.jsonl"), first_lines(&jsonl, 10)).unwrap();
    let (ok_, out) = verify("to-checkpoint.jsonl");
    assert!(ok_, "{out}");

    // From a time on: it starts past the checkpoint and runs to the head.
    let eleventh: Value = serde_json::from_str(jsonl.lines().nth(10).unwrap()).unwrap();
    let since = eleventh["occurred_at"].as_i64().unwrap().to_string();
    let (ok_, later, stderr) = audit_apart(&live, dir.path(), &["export", "--tenant", "acme", "--since", &since]);
    assert!(ok_ && later.lines().last() == jsonl.lines().last(), "{stderr}");
    let first: Value = serde_json::from_str(later.lines().next().unwrap()).unwrap();
    assert!(first["seq"].as_i64().unwrap() > 10, "{first}");
    std::fs::write(dir.path().join("later.jsonl"), &later).unwrap();
    let (ok_, out) = verify("later.jsonl");
    assert!(ok_, "{out}");
}
both_dbs!(audit_export_cut_below_a_checkpoint, export_cut_below_a_checkpoint);
