//! `scopegate token`: mint a development token; the token alone goes to stdout.

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
}

pub fn run(config: &Config, args: TokenArgs) -> Result<(), CliError> {
    let token = dev_token(config, &args.tenant, &args.user, args.ttl)?;
    println!("{token}");
    Ok(())
}
