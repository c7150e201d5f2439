//! `scopegate audit verify [--tenant SLUG] [--checkpoints FILE]`, `audit checkpoint`, `audit keygen
//! --out FILE`: checks the audit chains (exits non-zero and names what is broken), writes signed
//! checkpoints of the chain heads now, and creates the key that signs them.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::CliError;
use crate::audit::checkpoint::{self, CheckpointKey, Checkpointer, VerifyingKey};
use crate::audit::verify::{Checkpoints, verify_with_checkpoints};
use crate::config::Config;
use crate::store::Db;

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
            let keys: Vec<VerifyingKey> = if public_keys.is_empty() {
                if config.audit.checkpoint_key.as_os_str().is_empty() {
                    return Err(CliError::Usage(
                        "--checkpoints needs the key they were signed with: pass --public-key, or \
                         configure audit.checkpoint_key"
                            .into(),
                    ));
                }
                vec![CheckpointKey::load(&config.audit.checkpoint_key)?.verifying_key()]
            } else {
                public_keys.iter().map(|k| VerifyingKey::parse(k)).collect::<Result<_, _>>()?
            };
            (checkpoint::parse_lines(&text), keys)
        }
    };
    let db = Db::connect(&config.database).await?;
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
            Some(b) => println!("{}: BROKEN at seq {} (event {}): {}", r.tenant, b.seq, b.event_id, b.reason),
        }
        for problem in &r.checkpoint_problems {
            println!("{}: {problem}", r.tenant);
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

async fn checkpoint_now(config: &Config) -> Result<(), CliError> {
    let Some((key, sink)) = checkpoint::from_config(&config.audit)? else {
        return Err(CliError::Usage(
            "audit.checkpoint_sink is not set: name where checkpoints go (file:PATH, stdout, or an \
             http(s) URL) and the key that signs them (audit.checkpoint_key)"
                .into(),
        ));
    };
    let db = Db::connect(&config.database).await?;
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
