//! `scopegate migrate`: apply pending migrations and exit.

use super::CliError;
use crate::config::Config;
use crate::store::Db;

pub async fn run(config: &Config) -> Result<(), CliError> {
    crate::telemetry::init(&config.telemetry);
    let db = Db::connect(&config.database).await?;
    db.migrate().await?;
    db.close().await;
    tracing::info!("migrations applied");
    Ok(())
}
