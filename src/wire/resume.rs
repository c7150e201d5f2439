//! When and from where a request's event stream is resumed after the upstream ended it before
//! its answer (SEP-1699 polling: an event with an id, perhaps a `retry`, then the stream closed
//! mid-call; or a connection that broke): the one policy of both legs that read an upstream's
//! Streamable HTTP answers (rmcp's client through `client`, and the lean relay's own reader in
//! `proxy::lean`). It only counts and waits; each leg sends its own `GET` with `Last-Event-ID`
//! on the session the request went on, so what comes back stays that request's.
//!
//! Only a session's streams are resumed: on protocol 2026-07-28 an ended stream is the
//! request's end (no `GET`, no `Last-Event-ID`), and the legs never ask there.

use std::time::Duration;

/// How often one request's event stream is resumed at most.
const MAX_RESUMES: u8 = 8;
/// The longest wait before a resumption, whatever `retry` the server announced.
const MAX_RETRY: Duration = Duration::from_secs(30);
/// The wait before a later resumption when the server announced no `retry`.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);

/// What one request's event stream has shown so far that resuming it needs.
#[derive(Debug)]
pub struct Resumption {
    last_event: Option<String>,
    /// The server's own `retry` (bounded), if it announced one.
    announced: Option<Duration>,
    answered: bool,
    resumes_left: u8,
}

impl Default for Resumption {
    fn default() -> Self {
        Self { last_event: None, announced: None, answered: false, resumes_left: MAX_RESUMES }
    }
}

impl Resumption {
    /// A stream that is never resumed (protocol 2026-07-28, which has no resumption).
    pub fn none() -> Self {
        Self { resumes_left: 0, ..Self::default() }
    }

    /// Notes an event's `id` and `retry` fields (an event without them changes nothing).
    pub fn saw(&mut self, id: Option<&str>, retry: Option<u64>) {
        if let Some(id) = id {
            self.last_event = Some(id.to_owned());
        }
        if let Some(ms) = retry {
            self.announced = Some(Duration::from_millis(ms).min(MAX_RETRY));
        }
    }

    /// The request's answer came: nothing more is resumed.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// The wait before a later reconnection: the server's `retry` (bounded by [`MAX_RETRY`]),
    /// or a second when it announced none.
    fn retry(&self) -> Duration {
        self.announced.unwrap_or(DEFAULT_RETRY)
    }

    /// The `retry` the server announced (bounded by [`MAX_RETRY`]), if any: what a leg that
    /// passes the server's polling on to its own client asks that client to wait.
    pub fn announced(&self) -> Option<Duration> {
        self.announced
    }

    /// Whether the stream was resumed at least once.
    fn resumed(&self) -> bool {
        self.resumes_left < MAX_RESUMES
    }

    /// After the stream ended unanswered: the `Last-Event-ID` to resume it from, once the wait
    /// is over, or `None` when it can't be resumed (no event had an id, the answer came, or the
    /// attempts are spent). The first resumption goes at once: a caller is waiting on the call,
    /// and a server that closes a stream to be polled may have its answer ready right after;
    /// the later ones wait the server's `retry`. The caller bounds the whole by its timeout.
    pub async fn next(&mut self) -> Option<String> {
        let last = self.last_event.clone().filter(|_| !self.answered && self.resumes_left > 0)?;
        if self.resumed() {
            tokio::time::sleep(self.retry()).await;
        }
        self.resumes_left -= 1;
        Some(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resumes_from_the_last_id_at_once_then_after_retry_and_a_bounded_number_of_times() {
        let mut nothing = Resumption::default();
        assert_eq!(nothing.announced(), None);
        nothing.saw(None, Some(50));
        assert_eq!(nothing.announced(), Some(Duration::from_millis(50)));
        assert_eq!(nothing.next().await, None, "no event had an id: nothing to resume from");

        let mut polled = Resumption::default();
        polled.saw(Some("a"), None);
        polled.saw(Some("b"), Some(u64::MAX));
        polled.saw(None, None);
        assert_eq!(polled.retry(), MAX_RETRY, "a server's retry is bounded");
        let first = tokio::time::timeout(Duration::from_secs(5), polled.next()).await;
        assert_eq!(first.expect("the first resumption goes at once").as_deref(), Some("b"));
        let second = tokio::time::timeout(Duration::from_millis(50), polled.next()).await;
        assert!(second.is_err(), "a later one waits the server's retry");
        polled.saw(None, Some(0));
        for _ in 1..MAX_RESUMES {
            assert_eq!(polled.next().await.as_deref(), Some("b"));
        }
        assert_eq!(polled.next().await, None, "at most {MAX_RESUMES} resumptions");

        let mut answered = Resumption::default();
        answered.saw(Some("c"), None);
        answered.answered();
        assert_eq!(answered.next().await, None, "an answered stream is not resumed");

        let mut modern = Resumption::none();
        modern.saw(Some("d"), None);
        assert_eq!(modern.next().await, None, "2026-07-28 streams are never resumed");
    }
}
