//! `scopegate admin oauth keygen` and `admin oauth rotate-key`: make the key that seals upstream
//! OAuth credentials, and re-seal every credential under a new key in one transaction. Never
//! prints a credential; `keygen` prints only the new key, alone on stdout.

use std::path::PathBuf;

use clap::Subcommand;

use super::CliError;
use crate::config::Config;
use crate::store::Db;
use crate::store::vault::{self, VaultKey};

#[derive(Debug, Subcommand)]
pub enum OauthCmd {
    /// Print a new key for upstream.token_key_file (32 random bytes, standard base64).
    Keygen,
    /// Re-seal every stored credential from the old key to the new one (all or nothing), then
    /// point upstream.token_key_file at the new key.
    RotateKey {
        /// The key file the credentials are sealed with now.
        #[arg(long, value_name = "FILE")]
        old_key_file: PathBuf,
        /// The key file to seal them with.
        #[arg(long, value_name = "FILE")]
        new_key_file: PathBuf,
    },
}

pub async fn run(config: &Config, cmd: OauthCmd) -> Result<(), CliError> {
    match cmd {
        OauthCmd::Keygen => {
            println!("{}", VaultKey::generate()?);
            eprintln!("Write this to a file readable only by the gateway and name it in upstream.token_key_file.");
            Ok(())
        }
        OauthCmd::RotateKey { old_key_file, new_key_file } => {
            // Both keys are read before the database is touched.
            let old = VaultKey::load(&old_key_file, "--old-key-file")?;
            let new = VaultKey::load(&new_key_file, "--new-key-file")?;
            let db = Db::connect(&config.database).await?;
            db.migrate().await?;
            let result = vault::rotate_key(&db, &old, &new).await;
            db.close().await;
            let count = result?;
            println!("{count}");
            eprintln!(
                "{count} credential(s) re-sealed from key {} to key {}: set upstream.token_key_file to {}",
                old.id(),
                new.id(),
                new_key_file.display()
            );
            Ok(())
        }
    }
}
