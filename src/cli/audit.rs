//! `scopegate audit verify [--tenant SLUG] [--checkpoints FILE]`, `audit export --tenant SLUG`,
//! `audit verify-export FILE`, `audit checkpoint`, `audit keygen --out FILE`: checks the audit
//! chains (exits non-zero and names what is broken), streams one tenant's chain for auditors
//! and checks such an export, writes signed checkpoints of the chain heads now, and creates the
//! key that signs them.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::CliError;
use crate::audit::checkpoint::{self, CheckpointKey, Checkpointer, VerifyingKey};
use crate::audit::export::{self, Anchors, Format};
use crate::audit::verify::{Checkpoints, verify_with_checkpoints};
use crate::config::Config;
use crate::store::{Db, IfMissing};

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: AuditCommand,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute every event's hash and link; name the first broken event per tenant.
    Verify {
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Signed checkpoints (JSON lines, as the checkpoint sink wrote them): report a chain
        /// that no longer reaches a checkpointed head, and a checkpoint whose signature fails.
        #[arg(long, value_name = "FILE")]
        checkpoints: Option<PathBuf>,
        /// A public key checkpoints may be signed with (base64url, as `audit keygen` prints
        /// it); repeatable. Default: the public half of audit.checkpoint_key.
        // base64url keys may begin with `-`: a key, never an option.
        #[arg(long, value_name = "KEY", requires = "checkpoints", allow_hyphen_values = true)]
        public_key: Vec<String>,
    },
    /// Stream one tenant's chain to stdout, a row per event with its seq, prev_hash and chain
    /// hash, for auditors and SIEMs. Exits non-zero if a row read does not hold (it is still
    /// written, as stored).
    Export {
        #[arg(long)]
        tenant: String,
        /// From the first event at or after this time on: RFC 3339 (`2026-12-01T00:00:00Z`)
        /// or epoch milliseconds. Every later link of the chain follows it.
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        #[arg(long, value_enum, default_value = "jsonl")]
        format: Format,
    },
    /// Check an export (JSON lines or CSV) without the database: every row's hash against its
    /// fields and its link to the row before. Prints where it joins the chain and its head.
    VerifyExport {
        /// The export's file, or `-` for standard input.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Signed checkpoints (JSON lines, as the checkpoint sink wrote them): every exported
        /// row they name must have the signed hash, and the export must reach the newest one of
        /// its tenant (an export ending below it was cut short). Each must carry a good signature.
        #[arg(long, value_name = "FILE")]
        checkpoints: Option<PathBuf>,
        /// A public key checkpoints may be signed with (base64url); repeatable. Default: the
        /// public half of audit.checkpoint_key.
        #[arg(long, value_name = "KEY", requires = "checkpoints", allow_hyphen_values = true)]
        public_key: Vec<String>,
    },
    /// Sign every tenant's chain head now and write it to audit.checkpoint_sink.
    Checkpoint,
    /// Create a checkpoint signing key (Ed25519, PKCS#8 PEM, mode 0600) and print its public key.
    Keygen {
        /// Where to write the private key; an existing file is never overwritten.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

pub async fn run(config: &Config, args: AuditArgs) -> Result<(), CliError> {
    match args.command {
        AuditCommand::Verify { tenant, checkpoints, public_key } => {
            verify(config, tenant.as_deref(), checkpoints.as_deref(), &public_key).await
        }
        AuditCommand::Export { tenant, since, format } => export(config, &tenant, since.as_deref(), format).await,
        AuditCommand::VerifyExport { file, checkpoints, public_key } => {
            verify_export(config, &file, checkpoints.as_deref(), &public_key)
        }
        AuditCommand::Checkpoint => checkpoint_now(config).await,
        AuditCommand::Keygen { out } => keygen(&out),
    }
}

async fn verify(
    config: &Config,
    tenant: Option<&str>,
    checkpoints: Option<&Path>,
    public_keys: &[String],
) -> Result<(), CliError> {
    // Everything the command line names is read before the database is touched.
    let (lines, keys) = match checkpoints {
        None => (Vec::new(), Vec::new()),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("--checkpoints {}: {e}", path.display())))?;
            (checkpoint::parse_lines(&text), checkpoint_keys(config, public_keys)?)
        }
    };
    let db = Db::connect(&config.database, IfMissing::Refuse).await?;
    db.migrate().await?;
    let given = checkpoints.map(|_| Checkpoints { lines: &lines, keys: &keys });
    let verdict = verify_with_checkpoints(&db, tenant, given).await;
    db.close().await;
    let verdict = verdict?;
    for r in &verdict.chains {
        match &r.broken {
            None if checkpoints.is_none() => println!("{}: ok ({} events)", r.tenant, r.events),
            None if r.checkpoint_problems.is_empty() => match r.newest_checkpoint {
                Some(seq) => println!(
                    "{}: ok ({} events; {} checkpoint(s) reached, the newest at seq {seq})",
                    r.tenant, r.events, r.checkpoints_reached
                ),
                None => println!("{}: ok ({} events; no checkpoint)", r.tenant, r.events),
            },
            None => println!("{}: CHECKPOINT FAILED ({} events)", r.tenant, r.events),
            Some(b) if b.event_id.is_empty() => println!("{}: BROKEN at seq {}: {}", r.tenant, b.seq, b.reason),
            Some(b) => println!("{}: BROKEN at seq {} (event {}): {}", r.tenant, b.seq, b.event_id, b.reason),
        }
        for problem in &r.checkpoint_problems {
            println!("{}: {problem}", r.tenant);
        }
        for u in &r.outcome_unknown {
            println!("{}: outcome unknown: {u}", r.tenant);
        }
    }
    for problem in &verdict.problems {
        println!("{problem}");
    }
    if !verdict.is_ok() {
        let broken = verdict.chains.iter().filter(|c| c.broken.is_some()).count();
        let failed = verdict.chains.iter().map(|c| c.checkpoint_problems.len()).sum::<usize>() + verdict.problems.len();
        return Err(CliError::Usage(format!("{broken} audit chain(s) broken, {failed} checkpoint problem(s)")));
    }
    Ok(())
}

/// `--since`: RFC 3339, or epoch milliseconds.
fn since_millis(text: &str) -> Result<i64, CliError> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).map_err(|e| {
        CliError::Usage(format!("--since `{text}`: neither epoch milliseconds nor an RFC 3339 time ({e})"))
    })?;
    Ok(i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MIN))
}

async fn export(config: &Config, tenant: &str, since: Option<&str>, format: Format) -> Result<(), CliError> {
    let since = since.map(since_millis).transpose()?;
    let db = Db::connect(&config.database, IfMissing::Refuse).await?;
    db.migrate().await?;
    let mut out = tokio::io::BufWriter::new(tokio::io::stdout());
    let done = export::export(&db, tenant, since, format, &mut out).await;
    db.close().await;
    let done = done?;
    match (&done.first, &done.head) {
        (Some((first, _)), Some((seq, hash))) => {
            eprintln!("{tenant}: {} event(s) exported, seq {first} to {seq}, head {hash}", done.events)
        }
        _ => eprintln!("{tenant}: no event to export"),
    }
    if let Some((seq, reason)) = done.broken {
        return Err(CliError::Usage(format!(
            "the exported chain does not hold at seq {seq}: {reason} (see `scopegate audit verify`)"
        )));
    }
    Ok(())
}

/// The keys checkpoints may be signed with: those given, else the configured key's public half.
fn checkpoint_keys(config: &Config, public_keys: &[String]) -> Result<Vec<VerifyingKey>, CliError> {
    if !public_keys.is_empty() {
        return Ok(public_keys.iter().map(|k| VerifyingKey::parse(k)).collect::<Result<_, _>>()?);
    }
    if config.audit.checkpoint_key.as_os_str().is_empty() {
        return Err(CliError::Usage(
            "--checkpoints needs the key they were signed with: pass --public-key, or configure \
             audit.checkpoint_key"
                .into(),
        ));
    }
    Ok(vec![CheckpointKey::load(&config.audit.checkpoint_key)?.verifying_key()])
}

/// Every checkpoint of the file, each of which must parse and carry a good signature.
fn anchors(config: &Config, path: &Path, public_keys: &[String]) -> Result<Anchors, CliError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("--checkpoints {}: {e}", path.display())))?;
    let keys = checkpoint_keys(config, public_keys)?;
    let mut anchors = Anchors::default();
    for (line, parsed) in checkpoint::parse_lines(&text) {
        let bad = |why: String| CliError::Usage(format!("--checkpoints {} line {line}: {why}", path.display()));
        let cp = parsed.map_err(|e| bad(format!("not a checkpoint: {e}")))?;
        cp.check_signature(&keys).map_err(|e| bad(format!("its signature does not hold ({e:?})")))?;
        let tenant = cp.tenant_id.parse().map_err(|_| bad(format!("tenant id `{}` is not an id", cp.tenant_id)))?;
        anchors.insert(tenant, cp.seq, cp.hash);
    }
    Ok(anchors)
}

fn verify_export(
    config: &Config,
    file: &Path,
    checkpoints: Option<&Path>,
    public_keys: &[String],
) -> Result<(), CliError> {
    let anchors = match checkpoints {
        Some(path) => anchors(config, path, public_keys)?,
        None => Anchors::default(),
    };
    let checked = if file.as_os_str() == "-" {
        export::verify_export(&mut std::io::stdin().lock(), &anchors)
    } else {
        let f = std::fs::File::open(file).map_err(|e| CliError::Usage(format!("{}: {e}", file.display())))?;
        export::verify_export(&mut std::io::BufReader::new(f), &anchors)
    }
    .map_err(|p| CliError::Usage(format!("{}: {p}", file.display())))?;
    match (checked.tenant, checked.first, checked.head) {
        (Some(tenant), Some((first, prev)), Some((seq, hash))) => println!(
            "ok: {} event(s) of tenant {tenant}, seq {first} (after {prev}) to {seq}, head {hash}",
            checked.events
        ),
        _ => println!("ok: no event"),
    }
    if checkpoints.is_some() {
        println!("{} row(s) hold the hash a signed checkpoint gives them", checked.anchored);
    }
    for u in &checked.outcome_unknown {
        println!("outcome unknown: {u} in the export");
    }
    Ok(())
}

async fn checkpoint_now(config: &Config) -> Result<(), CliError> {
    let Some((key, sink)) = checkpoint::from_config(&config.audit)? else {
        return Err(CliError::Usage(
            "audit.checkpoint_sink is not set: name where checkpoints go (file:PATH, stdout, or an \
             http(s) URL) and the key that signs them (audit.checkpoint_key)"
                .into(),
        ));
    };
    let db = Db::connect(&config.database, IfMissing::Refuse).await?;
    db.migrate().await?;
    let written = Checkpointer::new(db.clone(), key, sink)?.all().await;
    db.close().await;
    eprintln!("{} checkpoint(s) written", written?);
    Ok(())
}

fn keygen(out: &Path) -> Result<(), CliError> {
    let (key, pem) = CheckpointKey::generate()?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(out).map_err(|e| CliError::Usage(format!("--out {}: {e}", out.display())))?;
    std::io::Write::write_all(&mut file, pem.as_bytes())?;
    file.sync_all()?;
    eprintln!("checkpoint key {} written to {}; its public key:", key.id(), out.display());
    println!("{}", key.verifying_key().to_text());
    Ok(())
}
