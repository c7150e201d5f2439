//! Reconnection delays: capped exponential backoff with full jitter; it never sleeps, the
//! caller does.

use std::time::Duration;

/// Capped exponential backoff with full jitter: the n-th delay is uniform in
/// `[0, min(cap, base * 2^n)]`, so replicas of a fleet that lost the gateway together do not
/// come back together.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub const BASE: Duration = Duration::from_millis(200);

    pub fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap: cap.max(base), attempt: 0 }
    }

    /// The largest delay the next call may return.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The next delay, drawn with `random` (any `u64`; uniform gives uniform delays).
    pub fn next_with(&mut self, random: u64) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        // `random % (nanos + 1)`: uniform enough for jitter (the bias is below 2^-30 here).
        Duration::from_nanos(random % nanos.saturating_add(1))
    }

    /// The next delay, jittered with the system's random source.
    pub fn next_delay(&mut self) -> Duration {
        self.next_with(random_u64())
    }

    /// After a connection that stayed up: start again from the base.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

fn random_u64() -> u64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    // A failing system RNG only loses the jitter, never the cap.
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_doubling_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(3));
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            ceilings.push(b.ceiling().as_millis());
            b.next_with(0);
        }
        assert_eq!(ceilings, [200, 400, 800, 1600, 3000, 3000, 3000, 3000]);
    }

    #[test]
    fn every_delay_is_within_its_ceiling_and_jittered() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        for i in 0..100u64 {
            let ceiling = b.ceiling();
            let d = b.next_with(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            assert!(d <= ceiling, "{d:?} over {ceiling:?}");
            assert!(d <= Duration::from_secs(30));
        }
        // Full jitter: the same attempt gives different delays for different draws, down to 0.
        let at = |r| Backoff::new(Duration::from_millis(200), Duration::from_secs(30)).next_with(r);
        assert_eq!(at(0), Duration::ZERO);
        assert_ne!(at(1_000_000), at(150_000_000));
        assert_eq!(at(200_000_000), Duration::from_millis(200), "the ceiling itself is reachable");
        let real: Vec<_> =
            (0..20).map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay()).collect();
        assert!(real.iter().any(|d| *d != real[0]), "system jitter varies");
    }

    #[test]
    fn reset_starts_again_from_the_base() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        for _ in 0..6 {
            b.next_with(0);
        }
        assert_eq!(b.ceiling(), Duration::from_millis(12_800));
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_millis(200));
    }

    #[test]
    fn never_overflows() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::MAX);
        for _ in 0..100 {
            b.next_with(u64::MAX);
        }
        assert!(b.ceiling() >= Duration::from_secs(1 << 31));
    }
}
