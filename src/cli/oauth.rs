//! `scopegate admin oauth`: `keygen` and `rotate-key` make the key that seals upstream OAuth
//! credentials and re-seal every credential under a new key in one transaction; `login` asks
//! for a login and prints its start link; `status` lists the tenant's credentials (never their
//! content); `logout` deletes one (those three through the administrative service, audited).
//! Never prints a credential; `keygen` prints only the new key, alone on stdout.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};

use super::CliError;
use crate::admin::{Admin, Authority, Caller, Collection, Write};
use crate::config::Config;
use crate::store::vault::{self, TokenVault, VaultKey};
use crate::store::{Db, IfMissing};

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
    /// Ask for a login to an OAuth-protected server; prints the link to open in a browser
    /// (good once, for 10 minutes). With --user, that user's own login (a server declared with
    /// `"oauth": {"tokens": "user"}`); without, the tenant's.
    Login(OwnerArgs),
    /// The tenant's stored credentials: server, whose, status (ok or login_needed), updated.
    Status {
        #[arg(long)]
        tenant: String,
    },
    /// Delete a stored credential (the next call needs a new login).
    Logout(OwnerArgs),
}

/// Whose credential: the tenant's for a server, or (with --user) one user's own.
#[derive(Debug, Args)]
pub struct OwnerArgs {
    #[arg(long)]
    tenant: String,
    #[arg(long)]
    server: String,
    /// The subject of the user whose own credential this is.
    #[arg(long, value_name = "SUBJECT")]
    user: Option<String>,
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
            let db = Db::connect(&config.database, IfMissing::Refuse).await?;
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
        OauthCmd::Login(OwnerArgs { tenant, server, user }) => {
            with_vault(config, |_, db| async move {
                let service = Admin::new(db, Vec::new()).with_oauth(&config.public_url());
                let write = Write::OauthLogin { tenant, server, user };
                let done = service.write(&Caller::cli(&Authority::Cli), write).await?;
                println!("{}", done.secret.unwrap_or_default());
                eprintln!("Open this link in a browser within 10 minutes to log in; it works once.");
                Ok(())
            })
            .await
        }
        OauthCmd::Status { tenant } => {
            with_vault(config, |_, db| async move {
                let service = Admin::new(db, Vec::new());
                for row in super::admin::listing(&service, Collection::Credentials { tenant }).await? {
                    let cell =
                        |name: &str| row.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone()).unwrap_or_default();
                    let whose = match cell("user").as_str() {
                        "" | "null" => "tenant".to_owned(),
                        user => format!("user {user}"),
                    };
                    println!("{}\t{whose}\t{}\t{}", cell("server"), cell("status"), cell("updated_at"));
                }
                Ok(())
            })
            .await
        }
        OauthCmd::Logout(OwnerArgs { tenant, server, user }) => {
            with_vault(config, |_, db| async move {
                let service = Admin::new(db, Vec::new());
                let write = Write::OauthLogout { tenant, server: server.clone(), user };
                service.write(&Caller::cli(&Authority::Cli), write).await?;
                eprintln!("Logged out of `{server}`.");
                Ok(())
            })
            .await
        }
    }
}

/// Runs `f` with the configured vault and the database (closed afterwards).
async fn with_vault<F, Fut>(config: &Config, f: F) -> Result<(), CliError>
where
    F: FnOnce(Arc<TokenVault>, Db) -> Fut,
    Fut: Future<Output = Result<(), CliError>>,
{
    let key = VaultKey::from_config(&config.upstream)?.ok_or_else(|| {
        CliError::Usage(
            "neither upstream.token_key_file nor upstream.token_key_env is set: upstream OAuth needs a key \
             (`scopegate admin oauth keygen`)"
                .to_owned(),
        )
    })?;
    let db = Db::connect(&config.database, IfMissing::Refuse).await?;
    db.migrate().await?;
    let result = async {
        vault::check_at_start(&db, Some(&key)).await?;
        f(Arc::new(TokenVault::new(db.clone(), key)), db.clone()).await
    }
    .await;
    db.close().await;
    result
}
