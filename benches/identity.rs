//! Per-request cost of JWT verification plus identity resolution (the database lookup: the
//! identity cache is off here), on SQLite and PostgreSQL, with 10 and with 100,000 users in
//! the tenant. Prints figures; asserts nothing.
//!
//! `cargo bench --bench identity` (PostgreSQL at postgres://postgres@127.0.0.1:5432 unless
//! SCOPEGATE_BENCH_PG_URL says otherwise; ITERATIONS overrides the request count).

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use http::StatusCode;
use scopegate::Gateway;
use scopegate::auth::Authenticator;
use scopegate::auth::mint::dev_token;
use scopegate::config::{Config, DEFAULT_TOML};
use scopegate::model::Role;
use scopegate::store::{Db, admin};
use sqlx::Connection;
use tower::ServiceExt;

const TOKENS: usize = 64;

struct Figures {
    verify: Stats,
    request: Stats,
}

struct Stats {
    mean: Duration,
    p50: Duration,
    p99: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Stats { mean, p50: at(0.50), p99: at(0.99) }
}

fn config(db_url: &str) -> Config {
    let figment = Figment::from(Toml::string(DEFAULT_TOML))
        .merge(Serialized::default("database.url", db_url))
        .merge(Serialized::default("server.listen", "127.0.0.1:0"))
        .merge(Serialized::default("server.public_url", "http://bench.test"))
        .merge(Serialized::default("limits.tenant_per_sec", 0.0))
        .merge(Serialized::default("limits.user_per_sec", 0.0))
        // The database lookup is what this bench measures: no identity cache.
        .merge(Serialized::default("auth.identity_cache_ms", 0))
        .merge(Serialized::default("telemetry.filter", "warn"));
    Config::from_figment(figment).expect("bench configuration")
}

async fn seed(db: &Db, users: usize) -> Vec<String> {
    let mut tx = db.begin().await.unwrap();
    admin::create_tenant(&mut tx, "bench", "Bench Farms").await.unwrap();
    admin::create_tenant(&mut tx, "other", "Other Farms").await.unwrap();
    admin::create_flock(&mut tx, "bench", "barn-a", "Leghorn", 10).await.unwrap();
    admin::create_flock(&mut tx, "bench", "barn-b", "Leghorn", 10).await.unwrap();
    admin::create_users_bulk(&mut tx, "bench", "user-", users, Role::Worker).await.unwrap();
    // Noise in another tenant, so the lookups also have someone else's rows to skip.
    admin::create_users_bulk(&mut tx, "other", "user-", users, Role::Owner).await.unwrap();
    // The callers: spread over the table, each with two flock assignments.
    let step = (users / TOKENS).max(1);
    let mut subjects = Vec::new();
    for i in (0..users).step_by(step).take(TOKENS) {
        let subject = format!("user-{i}@bench");
        admin::assign_flock(&mut tx, "bench", &subject, "barn-a").await.unwrap();
        admin::assign_flock(&mut tx, "bench", &subject, "barn-b").await.unwrap();
        subjects.push(subject);
    }
    tx.commit().await.unwrap();
    subjects
}

async fn measure(db_url: &str, users: usize, iterations: usize) -> Figures {
    let config = config(db_url);
    let gateway = Gateway::build_with(config.clone(), |_| {
        Router::new().route("/probe", post(|| async { StatusCode::NO_CONTENT }))
    })
    .await
    .expect("gateway");
    let subjects = seed(&gateway.state().db, users).await;
    if db_url.starts_with("sqlite:") {
        // Steady state: fold the bulk insert's write-ahead log back into the database file,
        // so every row is read from the file, not looked up in a large WAL.
        let mut conn = sqlx::AnyConnection::connect(db_url).await.unwrap();
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(&mut conn).await.unwrap();
    }
    let tokens: Vec<String> = subjects.iter().map(|s| dev_token(&config, "bench", s, 3600).unwrap()).collect();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#;
    let router = gateway.router();

    let authenticator = Authenticator::from_config(&config).await.unwrap();
    let mut verify = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let start = Instant::now();
        authenticator.verify(&tokens[i % tokens.len()]).await.unwrap();
        verify.push(start.elapsed());
    }

    let mut request = Vec::with_capacity(iterations);
    for i in 0..(iterations + iterations / 10) {
        let req = http::Request::post("/probe")
            .header("authorization", format!("Bearer {}", tokens[i % tokens.len()]))
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let start = Instant::now();
        let response = router.clone().oneshot(req).await.unwrap();
        let elapsed = start.elapsed();
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        if i >= iterations / 10 {
            request.push(elapsed); // the first tenth warms the pool and caches
        }
    }
    gateway.state().db.close().await;
    Figures { verify: stats(verify), request: stats(request) }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sqlx::any::install_default_drivers();
    let iterations: usize = std::env::var("ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let pg_server =
        std::env::var("SCOPEGATE_BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    println!("identity bench: {iterations} requests per row, one client, times in microseconds");
    println!(
        "{:<10} {:>8} | {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>11}",
        "database", "users", "jwt mean", "jwt p99", "req mean", "req p50", "req p99", "id+http mean"
    );
    for backend in ["sqlite", "postgres"] {
        let mut means = Vec::new();
        for users in [10usize, 100_000] {
            let dir = tempfile::tempdir().unwrap();
            let pg_name = format!("sg_bench_{}", uuid::Uuid::new_v4().simple());
            let url = if backend == "sqlite" {
                format!("sqlite://{}", dir.path().join("bench.db").display())
            } else {
                let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {pg_name}")))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                format!("{pg_server}/{pg_name}")
            };
            let f = measure(&url, users, iterations).await;
            if backend == "postgres" {
                let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {pg_name} WITH (FORCE)")))
                    .execute(&mut conn)
                    .await;
            }
            println!(
                "{:<10} {:>8} | {:>9.1} {:>9.1} | {:>9.1} {:>9.1} {:>9.1} | {:>11.1}",
                backend,
                users,
                micros(f.verify.mean),
                micros(f.verify.p99),
                micros(f.request.mean),
                micros(f.request.p50),
                micros(f.request.p99),
                micros(f.request.mean.saturating_sub(f.verify.mean)),
            );
            means.push(f.request.mean);
        }
        println!(
            "{backend}: mean per-request cost with 100,000 users / with 10 users = {:.2}",
            means[1].as_secs_f64() / means[0].as_secs_f64()
        );
    }
}
