//! `scopegate token`: mint a development token; the token alone goes to stdout, the
//! audience it was minted for to stderr.

use std::net::SocketAddr;

use clap::Args;

use super::CliError;
use crate::auth::mint::{dev_token, parse_ttl};
use crate::config::Config;

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// Tenant slug (the token's tenant claim).
    #[arg(long)]
    pub tenant: String,
    /// Subject (`sub`), e.g. olivia@acme.test.
    #[arg(long)]
    pub user: String,
    /// Lifetime: 90s, 15m, 1h, 2d.
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    pub ttl: u64,
    /// The `--listen` address of the gateway the token is for: without a public URL or
    /// audience configured, a gateway requires `aud` = `http://<its listen address>/mcp`.
    #[arg(long, value_name = "ADDR", conflicts_with = "audience")]
    pub listen: Option<SocketAddr>,
    /// The `aud` claim, as the gateway requires it (default: the configured audience).
    #[arg(long, value_name = "AUD")]
    pub audience: Option<String>,
}

pub fn run(config: &Config, args: TokenArgs) -> Result<(), CliError> {
    // The audience is what the target gateway will require, which depends on how it was
    // started: mint for that gateway's configuration, not this command's defaults.
    let mut config = config.clone();
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(audience) = args.audience {
        if audience.is_empty() {
            return Err(CliError::Usage("--audience must not be empty".to_owned()));
        }
        config.auth.audience = Some(audience);
    }
    let token = dev_token(&config, &args.tenant, &args.user, args.ttl)?;
    eprintln!("token for audience {}", config.audience());
    println!("{token}");
    Ok(())
}
