//! Ordering and routing on one connection: which in-flight call a progress notification or log
//! message belongs to (never a guess), and that a call's answer never overtakes the
//! notifications the upstream sent before it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    GetExtensions, GetMeta, JsonRpcMessage, JsonRpcNotification, ProgressNotificationParam, ProgressToken, RequestId,
    ServerNotification,
};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::Value;

use crate::store::{TenantId, UserId};
use crate::wire::client::RELATED_META_KEY;

use super::*;

/// How long a finished call still counts as a log message's possible source: an upstream
/// writes its last log line just before its answer, and the two are handled concurrently.
const LOG_LINGER: Duration = Duration::from_millis(500);

/// Progress held for a call still being sent, at most this many notifications per connection.
const MAX_EARLY: usize = 256;

/// In-flight calls of one connection, by the progress token the upstream was given, and the
/// calls that finished within [`LOG_LINGER`].
///
/// A call is announced before its request is sent and routed once rmcp has given it its
/// progress token, so an upstream that answers with progress or a log line at once (before
/// the sending task has run again) still finds its caller: progress for an unknown token is
/// held while any call is announced and handed over when that call is routed, and an
/// announced call counts as a possible source of log lines.
#[derive(Default)]
pub(crate) struct Routes {
    state: Mutex<RouteTable>,
    pub(crate) dispatch: Dispatch,
    /// The gateway's own requests in flight (the handshake, its lists, `logging/setLevel`,
    /// subscriptions): read for every message the upstream sends, so not behind the lock.
    own: std::sync::atomic::AtomicUsize,
}

/// Progress and log notifications from the upstream, counted in the order the transport
/// delivered them, until their handler is done with them.
///
/// rmcp hands each notification to its handler in a task of its own but a call's answer
/// straight to the caller, so the answer can overtake the notifications sent before it, and
/// the downstream request would be answered (its stream closed) before its last progress.
/// A call therefore waits, once answered, until every notification that came before its
/// answer has been handled (at most [`SETTLE_BOUND`]).
#[derive(Default)]
pub(crate) struct Dispatch {
    state: Mutex<DispatchState>,
    settled: tokio::sync::Notify,
}

#[derive(Default)]
struct DispatchState {
    next: u64,
    /// Notifications not yet handled, with when they came. One whose handler never runs (rmcp
    /// routed it elsewhere, or the connection died) stops counting after [`SETTLE_BOUND`].
    open: BTreeMap<u64, Instant>,
}

/// A counted notification's place in the order; travels in the notification's extensions.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seq(pub(super) u64);

/// The longest a call's answer waits for the notifications before it.
const SETTLE_BOUND: Duration = Duration::from_secs(1);

impl Dispatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, DispatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn received(&self) -> Seq {
        let mut state = self.lock();
        let now = Instant::now();
        if state.open.len() >= 1024 {
            state.open.retain(|_, at| now.duration_since(*at) < SETTLE_BOUND);
        }
        let seq = state.next;
        state.next += 1;
        state.open.insert(seq, now);
        Seq(seq)
    }

    fn done(&self, seq: Seq) {
        self.lock().open.remove(&seq.0);
        self.settled.notify_waiters();
    }

    /// Every notification received so far is below this.
    pub(crate) fn horizon(&self) -> u64 {
        self.lock().next
    }

    /// Waits until every notification below `horizon` has been handled, or [`SETTLE_BOUND`].
    pub(crate) async fn settle(&self, horizon: u64) {
        let settled = async {
            loop {
                let notified = self.settled.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let pending = self.lock().open.range(..horizon).any(|(_, at)| at.elapsed() < SETTLE_BOUND);
                if !pending {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(SETTLE_BOUND, settled).await.is_err() {
            tracing::debug!("upstream notifications still being handled after the answer; answering anyway");
        }
    }
}

/// Marks a counted notification handled when its handler ends, however it ends.
pub(super) struct Handled<'a>(pub(super) &'a Dispatch, pub(super) Option<Seq>);

impl Drop for Handled<'_> {
    fn drop(&mut self) {
        if let Some(seq) = self.1 {
            self.0.done(seq);
        }
    }
}

/// An upstream transport whose progress and log notifications are counted as they arrive.
pub struct Counted<T> {
    pub(super) inner: T,
    pub(super) routes: Arc<Routes>,
    /// Whether a related-request mark on a received message was set by the gateway's own HTTP
    /// client (true for Streamable HTTP); otherwise any mark is the upstream's and removed.
    pub(super) trust_related: bool,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Counted<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let mut message = self.inner.receive().await?;
        if !self.trust_related {
            match &mut message {
                JsonRpcMessage::Notification(n) => {
                    n.notification.get_meta_mut().0.0.remove(RELATED_META_KEY);
                }
                JsonRpcMessage::Request(r) => {
                    r.request.get_meta_mut().0.0.remove(RELATED_META_KEY);
                }
                _ => {}
            }
        }
        if let JsonRpcMessage::Notification(JsonRpcNotification { notification, .. }) = &mut message
            && matches!(
                notification,
                ServerNotification::ProgressNotification(_) | ServerNotification::LoggingMessageNotification(_)
            )
        {
            let seq = self.routes.dispatch.received();
            let log = matches!(notification, ServerNotification::LoggingMessageNotification(_));
            let extensions = notification.extensions_mut();
            extensions.insert(seq);
            if log && self.routes.own.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                extensions.insert(DuringOwn);
            }
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[derive(Default)]
struct RouteTable {
    calls: HashMap<ProgressToken, Downstream>,
    /// The same calls by the id of the gateway's request to the upstream.
    ids: HashMap<RequestId, Downstream>,
    /// Calls being sent: their progress token is not known yet.
    announced: Vec<(u64, Downstream)>,
    next_announcement: u64,
    early: EarlyProgress,
    finished: std::collections::VecDeque<(Instant, Downstream)>,
    /// Whose calls the upstream has been sent since it started.
    callers: Callers,
}

/// Whose calls an upstream process has been sent since it started: a notification that names
/// no call may come from any of them, however long ago (a line written after a delay), so it
/// can go to a caller only while they were all one principal's.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Callers {
    #[default]
    Nobody,
    One(TenantId, UserId),
    Several,
}

impl Callers {
    fn with(self, downstream: &Downstream) -> Self {
        let Some(origin) = &downstream.origin else { return Callers::Several };
        match self {
            Callers::Nobody => Callers::One(origin.tenant, origin.user),
            Callers::One(tenant, user) if tenant == origin.tenant && user == origin.user => self,
            _ => Callers::Several,
        }
    }
}

/// Progress notifications that came before their call was routed, for [`LOG_LINGER`] at most.
#[derive(Default)]
struct EarlyProgress(std::collections::VecDeque<(Instant, ProgressNotificationParam)>);

impl EarlyProgress {
    fn prune(&mut self, now: Instant) {
        while self.0.front().is_some_and(|(at, _)| now.duration_since(*at) > LOG_LINGER) {
            self.0.pop_front();
        }
    }

    fn hold(&mut self, now: Instant, params: ProgressNotificationParam) {
        self.prune(now);
        if self.0.len() < MAX_EARLY {
            self.0.push_back((now, params));
        }
    }

    /// The held notifications for `token`, in the order they came.
    fn take(&mut self, now: Instant, token: &ProgressToken) -> Vec<ProgressNotificationParam> {
        self.prune(now);
        let (mine, others): (Vec<_>, Vec<_>) = self.0.drain(..).partition(|(_, p)| &p.progress_token == token);
        self.0.extend(others);
        mine.into_iter().map(|(_, p)| p).collect()
    }
}

impl Routes {
    fn lock(&self) -> std::sync::MutexGuard<'_, RouteTable> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where progress for `token` goes; `None` (and held, if a call is being sent) when no
    /// routed call has it.
    pub(super) fn progress_target(&self, params: &ProgressNotificationParam) -> Option<Downstream> {
        let mut table = self.lock();
        if let Some(target) = table.calls.get(&params.progress_token) {
            return Some(target.clone());
        }
        if !table.announced.is_empty() {
            table.early.hold(Instant::now(), params.clone());
        }
        None
    }

    /// Announces a call about to be sent; the guard retires it however the call ends.
    pub(crate) fn announce(&self, downstream: Downstream) -> RouteGuard<'_> {
        let mut table = self.lock();
        let id = table.next_announcement;
        table.next_announcement += 1;
        table.callers = table.callers.with(&downstream);
        table.announced.push((id, downstream));
        RouteGuard { routes: self, slot: Slot::Announced(id) }
    }

    /// The call a message marked with `meta`'s related request belongs to.
    pub(super) fn marked(&self, meta: &serde_json::Map<String, Value>) -> Marked {
        let Some(mark) = meta.get(RELATED_META_KEY) else { return Marked::No };
        let Ok(id) = serde_json::from_value::<RequestId>(mark.clone()) else { return Marked::Unknown };
        match self.lock().ids.get(&id) {
            Some(downstream) => Marked::Call(downstream.clone()),
            None => Marked::Unknown,
        }
    }

    /// The one session every in-flight call belongs to, if it is certainly the one a request
    /// the upstream makes of its client (naming no call) is for: where that request goes (a
    /// finished call asks nothing). Only while [`Routes::attributable`].
    pub(super) fn single_caller(&self) -> Option<Downstream> {
        let table = self.lock();
        if !Self::attributable(&table) {
            return None;
        }
        let mut callers = table.calls.values().chain(table.announced.iter().map(|(_, d)| d));
        let first = callers.next()?;
        callers.all(|d| d.owner == first.owner).then(|| first.clone())
    }

    /// The one session every in-flight (or just finished) call belongs to, if a notification
    /// that names no call is certainly its: only while [`Routes::attributable`]. The connection
    /// is shared by the tenant's users: a line about one user's call, written late, must never
    /// reach another.
    pub(super) fn single_owner(&self) -> Option<Downstream> {
        let mut table = self.lock();
        let now = Instant::now();
        while table.finished.front().is_some_and(|(at, _)| now.duration_since(*at) > LOG_LINGER) {
            table.finished.pop_front();
        }
        if !Self::attributable(&table) {
            return None;
        }
        let mut owners = table
            .calls
            .values()
            .chain(table.announced.iter().map(|(_, d)| d))
            .chain(table.finished.iter().map(|(_, d)| d));
        let first = owners.next()?;
        owners.all(|d| d.owner == first.owner).then(|| first.clone())
    }

    /// Whether what names no call may be attributed at all: every call the upstream was sent
    /// since it started is one principal's ([`Callers`]).
    fn attributable(table: &RouteTable) -> bool {
        matches!(table.callers, Callers::One(..))
    }

    /// A request the gateway makes of the upstream on its own behalf (a list,
    /// `logging/setLevel`, a subscription, the handshake): until it is answered, a log line
    /// the upstream sends naming no call may be about it, and goes to no caller ([`DuringOwn`]).
    pub(crate) fn own_request(&self) -> OwnRequest<'_> {
        self.own.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        OwnRequest(self)
    }

    /// The upstream process started (again): nothing the gone one was sent can cause what the
    /// new one writes, so only the calls in flight now count as its callers.
    pub(crate) fn started(&self) {
        let mut table = self.lock();
        let callers =
            table.calls.values().chain(table.announced.iter().map(|(_, d)| d)).fold(Callers::Nobody, Callers::with);
        table.callers = callers;
    }
}

/// The guard of [`Routes::own_request`].
pub(crate) struct OwnRequest<'a>(&'a Routes);

impl Drop for OwnRequest<'_> {
    fn drop(&mut self) {
        self.0.own.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Marks a log line the upstream sent while a request of the gateway's own was unanswered (seen
/// in the order the transport delivers, so a line written before that answer carries it): if
/// it names no call, it may be about that request, and goes to no caller.
#[derive(Clone, Copy, Debug)]
pub(super) struct DuringOwn;

enum Slot {
    Announced(u64),
    Routed(ProgressToken, RequestId),
}

/// What a message's related-request mark says.
pub(super) enum Marked {
    /// It names an in-flight call: exactly where it goes.
    Call(Downstream),
    /// It names no call in flight (one that ended, or none): it goes nowhere.
    Unknown,
    /// It has none (stdio, or the session's own event stream): only the conservative rule.
    No,
}

/// A call's place in the route table: announced, then routed; retired when the call ends,
/// however it ends.
pub(crate) struct RouteGuard<'a> {
    routes: &'a Routes,
    slot: Slot,
}

impl RouteGuard<'_> {
    /// Routes the announced call by its progress token; returns its caller and the progress
    /// that came for it before.
    pub(crate) fn route(
        &mut self,
        token: &ProgressToken,
        request: &RequestId,
    ) -> Option<(Downstream, Vec<ProgressNotificationParam>)> {
        let Slot::Announced(id) = self.slot else {
            return None;
        };
        let mut table = self.routes.lock();
        let at = table.announced.iter().position(|(i, _)| *i == id)?;
        let (_, downstream) = table.announced.swap_remove(at);
        table.calls.insert(token.clone(), downstream.clone());
        table.ids.insert(request.clone(), downstream.clone());
        self.slot = Slot::Routed(token.clone(), request.clone());
        let early = table.early.take(Instant::now(), token);
        Some((downstream, early))
    }
}

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        let mut table = self.routes.lock();
        let done = match &self.slot {
            Slot::Announced(id) => {
                table.announced.iter().position(|(i, _)| i == id).map(|at| table.announced.swap_remove(at).1)
            }
            Slot::Routed(token, request) => {
                table.ids.remove(request);
                table.calls.remove(token)
            }
        };
        if let Some(done) = done {
            table.finished.push_back((Instant::now(), done));
        }
    }
}

/// Sends `params` to the calling session under its own progress token, if it asked for progress.
pub(crate) async fn forward_progress(server: &str, target: Downstream, mut params: ProgressNotificationParam) {
    let Downstream { sink, progress: Some(token), .. } = target else {
        return;
    };
    params.progress_token = token;
    let notification = ServerNotification::ProgressNotification(rmcp::model::ProgressNotification::new(params));
    if let Err(e) = sink.notify(notification).await {
        tracing::debug!(%server, error = %e, "progress not delivered");
    }
}

/// Sends a log line to the calling session, if it is at or above the session's level.
#[allow(deprecated)]
pub(crate) async fn forward_log(server: &str, target: &Downstream, params: LoggingMessageNotificationParam) {
    if !target.log_level.allows(params.level) {
        return;
    }
    let notification =
        ServerNotification::LoggingMessageNotification(rmcp::model::LoggingMessageNotification::new(params));
    if let Err(e) = target.sink.notify(notification).await {
        tracing::debug!(%server, error = %e, "log message not delivered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_waits_for_the_notifications_before_it_and_only_those() {
        let dispatch = Arc::new(Dispatch::default());
        let (first, second) = (dispatch.received(), dispatch.received());
        let horizon = dispatch.horizon();
        let later = dispatch.received();
        let waiting = {
            let dispatch = Arc::clone(&dispatch);
            tokio::spawn(async move { dispatch.settle(horizon).await })
        };
        dispatch.done(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one notification before the answer is still being handled");
        dispatch.done(second);
        let started = Instant::now();
        waiting.await.unwrap();
        assert!(started.elapsed() < SETTLE_BOUND / 2, "settled once both were handled, not at the bound");
        let _ = later; // after the answer: not waited for

        // One whose handler never runs holds an answer back for SETTLE_BOUND at most.
        let _lost = dispatch.received();
        let started = Instant::now();
        dispatch.settle(dispatch.horizon()).await;
        assert!(started.elapsed() >= SETTLE_BOUND && started.elapsed() < SETTLE_BOUND * 3);
        // Once it is that old it no longer counts: the next answer does not wait for it.
        let started = Instant::now();
        dispatch.settle(dispatch.horizon()).await;
        assert!(started.elapsed() < SETTLE_BOUND / 2, "a lost notification delays one answer, not every one");
    }

    /// A log line the upstream writes while a request of the gateway's own is unanswered is
    /// marked as possibly that request's (and so goes to no caller); one written after is not.
    #[tokio::test]
    async fn a_log_line_during_the_gateways_own_request_is_marked() {
        use tokio::io::AsyncWriteExt as _;
        let (ours, mut upstream) = tokio::io::duplex(4096);
        let (read, write) = tokio::io::split(ours);
        let routes = Arc::new(Routes::default());
        let mut counted = Counted {
            inner: rmcp::transport::async_rw::AsyncRwTransport::<RoleClient, _, _>::new_client(read, write),
            routes: Arc::clone(&routes),
            trust_related: false,
        };
        let line = |text: &str| {
            format!(
                "{}\n",
                serde_json::json!({"jsonrpc": "2.0", "method": "notifications/message",
                    "params": {"level": "info", "data": text}})
            )
        };
        let marked = |message: Option<RxJsonRpcMessage<RoleClient>>| match message {
            Some(JsonRpcMessage::Notification(n)) => n.notification.extensions().get::<DuringOwn>().is_some(),
            other => panic!("a notification expected: {other:?}"),
        };
        let own = routes.own_request();
        upstream.write_all(line("level set to debug").as_bytes()).await.unwrap();
        assert!(marked(counted.receive().await), "written while the gateway's own request was unanswered");
        drop(own);
        upstream.write_all(line("a call's line").as_bytes()).await.unwrap();
        assert!(!marked(counted.receive().await), "written with none of the gateway's own requests unanswered");
    }

    fn progress(token: u32, step: f64) -> ProgressNotificationParam {
        ProgressNotificationParam::new(ProgressToken(rmcp::model::NumberOrString::Number(token.into())), step)
    }

    #[test]
    fn held_progress_is_handed_to_its_own_call_in_order_and_expires() {
        let mut early = EarlyProgress::default();
        let now = Instant::now();
        early.hold(now, progress(1, 1.0));
        early.hold(now, progress(2, 1.0));
        early.hold(now, progress(1, 2.0));
        let mine = early.take(now, &progress(1, 0.0).progress_token);
        assert_eq!(mine.iter().map(|p| p.progress).collect::<Vec<_>>(), [1.0, 2.0], "its own, in order");
        assert!(early.take(now, &progress(1, 0.0).progress_token).is_empty(), "handed over once");
        let later = now + LOG_LINGER + Duration::from_millis(1);
        assert!(early.take(later, &progress(2, 0.0).progress_token).is_empty(), "unclaimed progress expires");
        for i in 0..(MAX_EARLY as u32 + 10) {
            early.hold(later, progress(i, 1.0));
        }
        assert_eq!(early.0.len(), MAX_EARLY, "bounded");
    }
}
