//! `scopegate health`: ask a running gateway's `/readyz` whether it is ready, so a container's
//! health check needs no curl. Reads the configuration only for the address; never touches the
//! database and writes no log.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use clap::Args;

use super::CliError;
use crate::config::Config;

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The URL probed; one without a path probes `/readyz` there. Default: `/readyz` on
    /// server.listen (on loopback when that is 0.0.0.0 or ::).
    #[arg(long, value_name = "URL")]
    pub url: Option<reqwest::Url>,
    /// The whole probe (connect, request, answer) fails after this long.
    #[arg(long, value_name = "SECS", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub timeout_secs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("not ready: {url} answered {status}: {reason}")]
    NotReady { url: reqwest::Url, status: reqwest::StatusCode, reason: String },
    #[error("not ready: {url} could not be reached: {cause}")]
    Unreachable { url: reqwest::Url, cause: String },
    #[error("health: {0}")]
    Client(String),
}

pub async fn run(config_file: Option<&Path>, args: HealthArgs) -> Result<(), CliError> {
    let url = match args.url {
        Some(url) if url.path() == "/" => url.join("/readyz").map_err(|e| HealthError::Client(e.to_string()))?,
        Some(url) => url,
        None => readyz_url(Config::load(config_file)?.server.listen),
    };
    probe(url, Duration::from_secs(args.timeout_secs)).await?;
    Ok(())
}

/// `/readyz` on the address a gateway listening on `listen` answers on this host: an
/// unspecified address (every interface) is reached on loopback.
pub fn readyz_url(listen: SocketAddr) -> reqwest::Url {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let text = format!("http://{}/readyz", SocketAddr::new(ip, listen.port()));
    reqwest::Url::parse(&text).expect("a socket address makes a URL")
}

/// Ok when `url` answers 200 within `timeout`.
async fn probe(url: reqwest::Url, timeout: Duration) -> Result<(), HealthError> {
    crate::tls::install_provider();
    // No proxy from the environment: the gateway is probed where it is, not through a proxy
    // that would answer for it. No redirects: a redirect is not a ready gateway.
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| HealthError::Client(crate::telemetry::error_chain(&e)))?;
    let response = match client.get(url.clone()).send().await {
        Ok(response) => response,
        Err(e) => return Err(HealthError::Unreachable { url, cause: crate::telemetry::error_chain(&e) }),
    };
    let status = response.status();
    if status == reqwest::StatusCode::OK {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    Err(HealthError::NotReady { url, status, reason: reason(&body) })
}

/// What the gateway said: the `message` of its error body, else the body's first line.
fn reason(body: &str) -> String {
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned));
    let text = message.unwrap_or_else(|| body.lines().next().unwrap_or("").trim().to_owned());
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None if text.is_empty() => "(no reason given)".to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probed_address_follows_server_listen() {
        for (listen, url, why) in [
            ("0.0.0.0:8080", "http://127.0.0.1:8080/readyz", "every IPv4 interface: loopback"),
            ("[::]:9000", "http://[::1]:9000/readyz", "every IPv6 interface: IPv6 loopback"),
            ("127.0.0.1:8080", "http://127.0.0.1:8080/readyz", "loopback as it is"),
            ("10.1.2.3:80", "http://10.1.2.3:80/readyz", "a named address as it is"),
            ("[fd00::1]:8443", "http://[fd00::1]:8443/readyz", "an IPv6 address, bracketed"),
        ] {
            let listen: SocketAddr = listen.parse().unwrap();
            let want = reqwest::Url::parse(url).unwrap();
            assert_eq!(readyz_url(listen), want, "{why}");
        }
    }

    #[test]
    fn the_reason_is_the_gateways_message_or_its_first_line() {
        let json = r#"{"error":"not_ready","message":"database unreachable or not migrated"}"#;
        assert_eq!(reason(json), "database unreachable or not migrated");
        assert_eq!(reason("bad gateway\nmore"), "bad gateway");
        assert_eq!(reason(""), "(no reason given)");
        assert_eq!(reason(&"x".repeat(500)).len(), 203, "a long body is cut");
    }
}
