//! `scopegate audit verify [--tenant SLUG]`: checks the audit chains; exits non-zero and
//! names the first broken event when one is broken.

use clap::{Args, Subcommand};

use super::CliError;
use crate::audit::verify::verify;
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
    },
}

pub async fn run(config: &Config, args: AuditArgs) -> Result<(), CliError> {
    let AuditCommand::Verify { tenant } = args.command;
    let db = Db::connect(&config.database).await?;
    db.migrate().await?;
    let reports = verify(&db, tenant.as_deref()).await?;
    db.close().await;
    let mut broken = 0;
    for r in &reports {
        match &r.broken {
            None => println!("{}: ok ({} events)", r.tenant, r.events),
            Some(b) => {
                broken += 1;
                println!("{}: BROKEN at seq {} (event {}): {}", r.tenant, b.seq, b.event_id, b.reason);
            }
        }
    }
    if broken > 0 {
        return Err(CliError::Usage(format!("{broken} audit chain(s) broken")));
    }
    Ok(())
}
