//! `scopegate serve`: run the gateway; `--demo` seeds the demo data and prints a token per user.

use std::net::SocketAddr;
use std::path::Path;

use clap::Args;
use figment::providers::Serialized;

use super::CliError;
use crate::app::{Gateway, shutdown_signal};
use crate::auth::mint::dev_token;
use crate::config::Config;
use crate::store::demo::{self, DEMO_USERS, DemoUser, SeedOutcome};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Listen address (overrides server.listen).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Seed the demo tenants into an empty database and print a token per demo user.
    #[arg(long)]
    pub demo: bool,
}

pub async fn run(config_file: Option<&Path>, args: ServeArgs) -> Result<(), CliError> {
    let config = Config::load_with(config_file, |mut figment| {
        if let Some(listen) = args.listen {
            figment = figment.merge(Serialized::default("server.listen", listen));
        }
        if args.demo {
            // The demo's platform administrator (its token is printed with the others).
            figment = figment.adjoin(Serialized::default("admin.platform_subjects", [demo::DEMO_PLATFORM_ADMIN]));
        }
        figment
    })?;
    if args.demo && config.auth.hs256_secret.is_empty() {
        return Err(CliError::Usage(
            "--demo needs a development secret (auth.hs256_secret) to mint the demo tokens".into(),
        ));
    }
    let telemetry = crate::telemetry::start(&config.telemetry)?;
    match config_file {
        Some(file) => tracing::info!(file = %file.display(), "configuration file read"),
        None => tracing::info!("no configuration file: the built-in defaults and the environment"),
    }
    let served = serve(config, args.demo).await;
    // After the last request: the spans still buffered are sent before the process ends.
    telemetry.shutdown().await;
    served
}

async fn serve(config: Config, demo: bool) -> Result<(), CliError> {
    let gateway = Gateway::build(config).await?;
    if demo {
        print_demo(&gateway).await?;
    }
    // Before the line that says the gateway listens, which tests and scripts wait for.
    if let Some(addr) = gateway.metrics_addr() {
        tracing::info!(%addr, "metrics listening");
        eprintln!("scopegate metrics on http://{addr}/metrics");
    }
    let addr = gateway.local_addr();
    tracing::info!(%addr, "scopegate listening");
    eprintln!("scopegate listening on http://{addr}");
    gateway.run(shutdown_signal()).await?;
    Ok(())
}

async fn print_demo(gateway: &Gateway) -> Result<(), CliError> {
    let state = gateway.state();
    match demo::seed(&state.db).await? {
        SeedOutcome::Seeded => eprintln!("demo data seeded"),
        SeedOutcome::AlreadyPresent => eprintln!("demo data already present"),
    }
    let ttl = state.config.auth.demo_token_ttl_secs;
    println!("Demo bearer tokens (valid {}h):", ttl / 3600);
    for DemoUser(tenant, subject, _, roles, _) in DEMO_USERS {
        let token = dev_token(&state.config, tenant, subject, ttl)?;
        let roles: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
        println!("  {tenant:<7} {subject:<20} {:<8} {token}", roles.join(","));
    }
    let platform = dev_token(&state.config, "", demo::DEMO_PLATFORM_ADMIN, ttl)?;
    println!("  {:<7} {:<20} {:<8} {platform}", "-", demo::DEMO_PLATFORM_ADMIN, "platform");
    Ok(())
}
