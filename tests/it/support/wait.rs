//! Waiting for something to happen: [`eventually`] polls a check until it holds, for at most
//! the tests' patience, which is set here and nowhere else.

use std::fmt::Display;
use std::future::Future;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// How long a wait lasts before it fails, unless a test names its own bound: what a loaded
/// 2-core CI machine may need for a gateway, an agent or a child process to do its part. A
/// passing test never waits it out.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Multiplies every bound of [`eventually`] and [`eventually_within`] (a number, e.g. `2.5`),
/// for machines slower than CI's. Not `SCOPEGATE_`-prefixed: the gateway reads every variable
/// with that prefix as configuration, and refuses one it does not know.
pub const PATIENCE_VAR: &str = "SG_TEST_PATIENCE";

/// The first pause between two checks, doubled after each until [`MAX_PAUSE`]: quick answers
/// are seen at once, and a slow one is not polled harder than it needs.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// The factor [`PATIENCE_VAR`] sets (1 when unset).
fn factor() -> f64 {
    static FACTOR: LazyLock<f64> = LazyLock::new(|| match std::env::var(PATIENCE_VAR) {
        Ok(text) => match text.trim().parse::<f64>() {
            Ok(factor) if factor.is_finite() && factor > 0.0 => factor,
            _ => panic!("{PATIENCE_VAR}={text:?}: a positive number is expected"),
        },
        Err(_) => 1.0,
    });
    *FACTOR
}

/// `bound`, stretched by [`PATIENCE_VAR`].
pub fn patience(bound: Duration) -> Duration {
    bound.mul_f64(factor())
}

/// What one check found: done (`Some`/`Ok`, with its value) or not yet (`None`, or `Err`
/// saying what was seen, which a failure reports).
pub trait Attempt<T> {
    fn done(self) -> Result<T, Option<String>>;
}

impl<T> Attempt<T> for Option<T> {
    fn done(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl Attempt<()> for bool {
    fn done(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T, E: Display> Attempt<T> for Result<T, E> {
    fn done(self) -> Result<T, Option<String>> {
        self.map_err(|seen| Some(seen.to_string()))
    }
}

/// Runs `check` until it is done and returns its value; panics with `what` (and what the last
/// check saw) once [`PATIENCE`] has passed.
pub async fn eventually<T, A, F, Fut>(what: impl Display, check: F) -> T
where
    A: Attempt<T>,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    eventually_within(PATIENCE, what, check).await
}

/// [`eventually`] with a bound of its own (stretched by [`PATIENCE_VAR`] all the same).
pub async fn eventually_within<T, A, F, Fut>(bound: Duration, what: impl Display, mut check: F) -> T
where
    A: Attempt<T>,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    let bound = patience(bound);
    let deadline = Instant::now() + bound;
    let mut pause = FIRST_PAUSE;
    loop {
        let seen = match check().await.done() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            match seen {
                Some(seen) => panic!("{what} (waited {bound:?}; last seen: {seen})"),
                None => panic!("{what} (waited {bound:?})"),
            }
        }
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
