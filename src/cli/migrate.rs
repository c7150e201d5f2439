//! `scopegate migrate`: apply pending migrations and exit; with `serve`, the only command that
//! creates a missing SQLite database.

use super::CliError;
use crate::config::Config;
use crate::store::{Db, IfMissing};

pub async fn run(config: &Config) -> Result<(), CliError> {
    crate::telemetry::init(&config.telemetry);
    let db = Db::connect(&config.database, IfMissing::Create).await?;
    db.migrate().await?;
    db.close().await;
    tracing::info!("migrations applied");
    Ok(())
}
