//! Rate limits: a token bucket per tenant and one per user, checked after identity
//! resolution. Over the limit: 429 with `Retry-After`, and nothing runs. A refused
//! `tools/call` is audited (denied, `rate_limited`), gathered per user and window so that a
//! flood does not turn into as many writes (see [`RateLimitAudit`]).
//!
//! Buckets are per process. With `limits.replicas` = N, each replica holds 1/N of every
//! budget, so N replicas together never admit more than the configured budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

use crate::audit::refusal::RateLimitAudit;
use crate::config::LimitsConfig;
use crate::error_body::json_error;
use crate::identity::request_principal;
use crate::mcp::Inspection;
use crate::store::{TenantId, UserId};
use crate::telemetry::metrics;

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A bucket's refill rate (per second; 0: no limit) and size: this replica's share.
#[derive(Clone, Copy)]
struct Budget {
    rate: f64,
    burst: f64,
}

/// Token buckets keyed by tenant and by (tenant, user).
pub(crate) struct RateLimiter {
    user: Budget,
    tenant: Budget,
    tenants: Mutex<HashMap<TenantId, Bucket>>,
    users: Mutex<HashMap<(TenantId, UserId), Bucket>>,
    audit: Arc<RateLimitAudit>,
}

/// Takes one token from `bucket` (refilled at `rate` per second up to `burst`), or says how
/// many seconds until one is there.
fn take(bucket: &mut Bucket, rate: f64, burst: f64, now: Instant) -> Result<(), f64> {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
    bucket.at = now;
    if bucket.tokens >= 1.0 {
        bucket.tokens -= 1.0;
        Ok(())
    } else {
        Err((1.0 - bucket.tokens) / rate)
    }
}

fn check<K: std::hash::Hash + Eq>(
    map: &Mutex<HashMap<K, Bucket>>,
    key: K,
    rate: f64,
    burst: f64,
    now: Instant,
) -> Result<(), f64> {
    if rate <= 0.0 {
        return Ok(());
    }
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() > 100_000 {
        // Forget buckets that have refilled completely: they hold no information.
        map.retain(|_, b| now.saturating_duration_since(b.at).as_secs_f64() * rate < burst);
    }
    let bucket = map.entry(key).or_insert(Bucket { tokens: burst, at: now });
    take(bucket, rate, burst, now)
}

impl RateLimiter {
    pub fn new(config: &LimitsConfig, audit: Arc<RateLimitAudit>) -> Self {
        // This replica's share of each budget (see `limits.replicas`).
        let share = |rate, burst| Budget { rate: config.share(rate), burst: config.share(burst) };
        Self {
            user: share(config.user_per_sec, config.user_burst),
            tenant: share(config.tenant_per_sec, config.tenant_burst),
            tenants: Mutex::default(),
            users: Mutex::default(),
            audit,
        }
    }

    pub(crate) fn admit(&self, tenant: TenantId, user: UserId) -> Result<(), (&'static str, f64)> {
        let (u, t) = (self.user, self.tenant);
        let now = Instant::now();
        check(&self.users, (tenant, user), u.rate, u.burst, now).map_err(|w| ("user", w))?;
        check(&self.tenants, tenant, t.rate, t.burst, now).map_err(|w| ("tenant", w))
    }
}

pub(crate) async fn limit(State(limiter): State<Arc<RateLimiter>>, request: Request, next: Next) -> Response {
    if let Some((principal, _)) = request_principal(request.extensions())
        && let Err((which, wait)) = limiter.admit(principal.tenant, principal.user)
    {
        metrics::denial(if which == "user" { "rate_limited_user" } else { "rate_limited_tenant" });
        if let Some(inspection) = request.extensions().get::<Inspection>()
            && inspection.method() == Some("tools/call")
        {
            let request_id = inspection.request_id().map(crate::mcp::id_text);
            limiter.audit.refused(principal, inspection.name(), request_id);
        }
        let mut response = json_error(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "too many requests; retry later");
        let secs = wait.ceil().max(1.0) as u64;
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return response;
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_allows_the_burst_then_refills_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket { tokens: 3.0, at: t0 };
        for _ in 0..3 {
            assert!(take(&mut b, 1.0, 3.0, t0).is_ok());
        }
        let wait = take(&mut b, 1.0, 3.0, t0).unwrap_err();
        assert!((wait - 1.0).abs() < 1e-9, "{wait}");
        assert!(take(&mut b, 1.0, 3.0, t0 + Duration::from_millis(1000)).is_ok());
        assert!(take(&mut b, 1.0, 3.0, t0 + Duration::from_millis(1000)).is_err());
    }
}
