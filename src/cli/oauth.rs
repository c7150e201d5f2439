//! `scopegate admin oauth`: `keygen` and `rotate-key` make the key that seals upstream OAuth
//! credentials and re-seal every credential under a new key in one transaction; `login` asks
//! for a login and prints its start link; `status` lists the tenant's credentials (never their
//! content); `logout` deletes one. Never prints a credential; `keygen` prints only the new key,
//! alone on stdout.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};

use super::CliError;
use crate::config::Config;
use crate::decl::Transport;
use crate::decl::declaration::TokenScope;
use crate::decl::parse_declarations;
use crate::oauth::{TokenOwner, UpstreamOAuth};
use crate::store::vault::{self, TokenVault, VaultKey};
use crate::store::{Db, IfMissing, TenantId, UserId, admin};

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
            with_vault(config, |vault, db| async move {
                let (tenant, user) = owner_ids(&db, &tenant, user.as_deref()).await?;
                check_protected(&db, tenant, &server, user.is_some()).await?;
                let oauth = UpstreamOAuth::new(Arc::clone(&vault), &config.public_url());
                let owner = TokenOwner { tenant, server, user };
                let link = oauth.login_link(&owner).await.map_err(|e| CliError::Usage(e.to_string()))?;
                println!("{link}");
                eprintln!("Open this link in a browser within 10 minutes to log in; it works once.");
                Ok(())
            })
            .await
        }
        OauthCmd::Status { tenant } => {
            with_vault(config, |vault, db| async move {
                let (tenant, _) = owner_ids(&db, &tenant, None).await?;
                for info in vault.list(tenant).await? {
                    let whose = info.subject.map_or_else(|| "tenant".to_owned(), |s| format!("user {s}"));
                    println!("{}\t{whose}\t{}\t{}", info.server, info.status.as_str(), info.updated_at);
                }
                Ok(())
            })
            .await
        }
        OauthCmd::Logout(OwnerArgs { tenant, server, user }) => {
            with_vault(config, |vault, db| async move {
                let (tenant, user) = owner_ids(&db, &tenant, user.as_deref()).await?;
                if !vault.delete(tenant, &server, user).await? {
                    return Err(CliError::Usage(format!("no credential stored for `{server}` of that owner")));
                }
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

/// The tenant's id and, when a subject is given, that user's.
async fn owner_ids(db: &Db, tenant: &str, subject: Option<&str>) -> Result<(TenantId, Option<UserId>), CliError> {
    let mut conn = db.pool().acquire().await.map_err(crate::store::StoreError::from)?;
    let tenant = admin::tenant_id_by_slug(&mut conn, tenant).await?;
    let user = match subject {
        Some(subject) => Some(admin::user_id_by_subject(&mut conn, tenant, subject).await?),
        None => None,
    };
    Ok((tenant, user))
}

/// The tenant's server must be bound, declared with `oauth`, and held per user exactly when a
/// user is named.
async fn check_protected(db: &Db, tenant: TenantId, server: &str, for_user: bool) -> Result<(), CliError> {
    let entity = db
        .resolve_server(tenant, server)
        .await?
        .ok_or_else(|| CliError::Usage(format!("server `{server}` is not bound for the tenant")))?;
    let value: serde_json::Value =
        serde_json::from_str(&entity.declaration).map_err(|e| CliError::Usage(format!("stored declaration: {e}")))?;
    let parsed = parse_declarations(&serde_json::json!({ server: value }).to_string())
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let spec = parsed.servers.first().and_then(|s| match &s.transport {
        Transport::Http { oauth: Some(spec), .. } => Some(spec.clone()),
        _ => None,
    });
    match spec {
        None => Err(CliError::Usage(format!("server `{server}` is not declared with \"oauth\""))),
        Some(spec) if (spec.tokens == TokenScope::User) != for_user => Err(CliError::Usage(if for_user {
            format!("server `{server}` keeps one login for the tenant: leave out --user")
        } else {
            format!("server `{server}` keeps a login per user: name the user with --user")
        })),
        Some(_) => Ok(()),
    }
}
