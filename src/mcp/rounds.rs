//! Multi round-trip requests (SEP-2322) for callers on protocol 2026-07-28, who take no
//! requests from the server. The gateway's upstream connections speak the older versions, so
//! an upstream asks its client (sampling, elicitation, roots) with an ordinary request in the
//! middle of a call. The rule that translates between the two:
//!
//! - The request (`tools/call`, `prompts/get`, `resources/read`) runs in a task of its own.
//!   When the upstream asks, the caller's request is answered `input_required` with that one
//!   request (key `input`) and a `requestState`; the upstream's request stays open, waiting.
//! - The caller retries the same request (same name or URI, same arguments) with its answer
//!   under `inputResponses.input` and the `requestState` echoed. The answer goes to the upstream as
//!   the answer of its request, and the retry gets what happens next: the call's result, or
//!   the next question (with a new `requestState`).
//!
//! The `requestState` is sealed (HMAC-SHA256, a key the replicas share) and names the waiting
//! exchange, the replica it waits in, the tenant, the user, the tool, the digest of the
//! arguments and an expiry. A forged, altered or expired one, one presented by another caller
//! or for another tool or arguments, or one already used, is refused (-32602) and changes
//! nothing; a waiting exchange nobody resumes ends at its expiry (the upstream's request fails,
//! and so its call). An exchange lives in the replica that started it (its upstream request is
//! open there): a retry that reaches another replica is forwarded to that one ([`waits_in`]);
//! when that replica is gone, so is the exchange, and the retry is refused.
//!
//! When the upstream speaks 2026-07-28 too, nothing waits: the upstream's `input_required`
//! passes through as it is (every request, under the upstream's own keys, in one round), its
//! `requestState` wrapped in the gateway's, sealed with the replicas' shared key and bound to
//! the same caller, tool and arguments and an expiry ([`seal_passed`], [`open_passed`]). The
//! retry carries the caller's `inputResponses` and the upstream's own state back upstream, from
//! whichever replica it reaches.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{InputRequiredResult, InputResponses, ServerResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::DropGuard;

use super::cursor::CursorKey;
use crate::proxy::{ProxyError, Round};
use crate::store::now_millis;

/// The key of the one request an `input_required` answer carries.
const INPUT_KEY: &str = "input";

/// Who and what a `requestState` was issued for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub tenant: String,
    pub user: String,
    pub tool: String,
    pub arguments: String,
}

#[derive(Serialize, Deserialize)]
struct State {
    id: String,
    /// The replica the exchange waits in.
    replica: String,
    #[serde(flatten)]
    binding: Binding,
    exp: i64,
}

/// The replica a `requestState` of a waiting exchange names, when it is intact and unexpired
/// (a state passed through from a 2026-07-28 upstream waits nowhere: `None`). Says nothing of
/// whom it was issued to: the replica it names checks that.
pub fn waits_in(key: &CursorKey, state: &str) -> Option<String> {
    let state: State = key.unseal(state)?;
    (state.exp > now_millis()).then_some(state.replica)
}

/// The gateway's `requestState` around an upstream's own (multi round-trip passed through).
#[derive(Serialize, Deserialize)]
struct Passed {
    /// Tells this state apart from anything else sealed with the same key.
    passed: bool,
    #[serde(flatten)]
    binding: Binding,
    /// The upstream's own `requestState`, if it sent one.
    upstream: Option<String>,
    exp: i64,
    /// Names this state once: a call a person confirmed goes on with it only once (see
    /// [`passed_once`]). Absent from a state sealed before it existed.
    #[serde(default)]
    nonce: Option<String>,
}

/// The gateway's `requestState` for an upstream's `input_required` passed through to the
/// caller: bound to `binding`, good for `ttl`.
pub fn seal_passed(key: &CursorKey, binding: &Binding, upstream: Option<String>, ttl: Duration) -> String {
    let exp = now_millis() + i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2);
    let nonce = Some(uuid::Uuid::new_v4().to_string());
    key.seal(&Passed { passed: true, binding: binding.clone(), upstream, exp, nonce })
}

/// The once-only name and expiry of a passed-through `requestState`, when `state` is one the
/// gateway sealed for `binding` and still good (`None`: it is not one, or it no longer holds;
/// [`open_passed`] refuses it where it is used). A call that needed a person's confirmation
/// goes on with each such state once (see `confirm`).
pub fn passed_once(key: &CursorKey, binding: &Binding, state: &str) -> Option<(Option<String>, i64)> {
    let passed: Passed = key.unseal(state).filter(|p: &Passed| p.passed)?;
    (passed.exp > now_millis() && &passed.binding == binding).then_some((passed.nonce, passed.exp))
}

/// The upstream's own `requestState` inside the gateway's `state`, if that is intact,
/// unexpired and issued to this caller for this tool and these arguments; refused (-32602)
/// otherwise.
pub fn open_passed(key: &CursorKey, binding: &Binding, state: &str) -> Result<Option<String>, ProxyError> {
    let passed: Passed =
        key.unseal(state).filter(|p: &Passed| p.passed).ok_or_else(|| refused("not one the gateway issued"))?;
    if passed.exp <= now_millis() {
        return Err(refused("expired"));
    }
    if &passed.binding != binding {
        return Err(refused("issued for another caller, tool or arguments"));
    }
    Ok(passed.upstream)
}

/// The gateway's `requestState` of a confirmation it asked for (`input_required` with an
/// elicitation, see `confirm`): names the consent (single use, by its id), bound to the caller,
/// the tool and the digest of the arguments shown, and an expiry. Nothing waits for it: the
/// retry carrying the caller's answer is served by whichever replica it reaches.
#[derive(Serialize, Deserialize)]
struct Consent {
    consent: String,
    #[serde(flatten)]
    binding: Binding,
    exp: i64,
}

/// The `requestState` of consent `id` for `binding`, good until `exp` (epoch milliseconds).
pub fn seal_consent(key: &CursorKey, binding: &Binding, id: &str, exp: i64) -> String {
    key.seal(&Consent { consent: id.to_owned(), binding: binding.clone(), exp })
}

/// The consent a `requestState` names, with its expiry, when it is one the gateway issued for a
/// confirmation (`None`: it is not; it may be a state of another kind). `Err`: it is one, but
/// expired or issued to another caller or for another tool or other arguments.
pub fn open_consent(key: &CursorKey, binding: &Binding, state: &str) -> Option<Result<(String, i64), &'static str>> {
    let consent: Consent = key.unseal(state)?;
    Some(if consent.exp <= now_millis() {
        Err("expired")
    } else if &consent.binding != binding {
        Err("issued for another caller, tool or arguments")
    } else {
        Ok((consent.consent, consent.exp))
    })
}

/// A call waiting for its caller's answer.
struct Waiting {
    expires_ms: i64,
    rounds: mpsc::Receiver<Round>,
    answer: oneshot::Sender<Value>,
    /// Cancels the call when the exchange is dropped unanswered.
    _call: DropGuard,
}

/// The exchanges waiting for an answer, in this process.
#[derive(Default)]
pub struct Exchanges {
    waiting: Mutex<HashMap<String, Waiting>>,
}

/// The answer to one round: the request's result, or a question for the caller.
pub enum Next {
    Done(Box<ServerResult>),
    Input(InputRequiredResult),
}

/// A running call's side of the exchange: its rounds and what cancels it.
pub struct Running {
    pub rounds: mpsc::Receiver<Round>,
    pub call: DropGuard,
}

fn refused(why: &str) -> ProxyError {
    ProxyError::Upstream(ErrorData::invalid_params(format!("invalid requestState: {why}"), None))
}

impl Exchanges {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the request does next, as the answer to this round: its result, or its next
    /// question (the exchange then waits for the retry, at most `timeout`).
    pub async fn next(
        &self,
        key: &CursorKey,
        replica: &str,
        binding: Binding,
        mut running: Running,
        timeout: Duration,
    ) -> Result<Next, ProxyError> {
        let round = match tokio::time::timeout(timeout, running.rounds.recv()).await {
            Ok(Some(round)) => round,
            Ok(None) => return Err(ProxyError::Unavailable("the call ended without an answer".to_owned())),
            Err(_) => return Err(ProxyError::Timeout),
        };
        self.settle(key, replica, binding, round, running, timeout)
    }

    /// The answer to a round that came: the request's result, or its question (the exchange
    /// then waits for the retry, at most `timeout`, with what is left of `running`).
    pub fn settle(
        &self,
        key: &CursorKey,
        replica: &str,
        binding: Binding,
        round: Round,
        running: Running,
        timeout: Duration,
    ) -> Result<Next, ProxyError> {
        match round {
            Round::Done(result) => result.map(|r| Next::Done(Box::new(r))),
            Round::Ask { request, answer } => {
                let id = uuid::Uuid::new_v4().to_string();
                let expires_ms = now_millis() + i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 2);
                let state = key.seal(&State {
                    id: id.clone(),
                    replica: replica.to_owned(),
                    binding: binding.clone(),
                    exp: expires_ms,
                });
                let waiting = Waiting { expires_ms, rounds: running.rounds, answer, _call: running.call };
                let mut all = self.lock();
                let now = now_millis();
                all.retain(|_, w| w.expires_ms > now);
                all.insert(id, waiting);
                let requests = [(INPUT_KEY.to_owned(), request)].into_iter().collect();
                Ok(Next::Input(InputRequiredResult::new(Some(requests), Some(state))))
            }
        }
    }

    /// A retry: the exchange its `requestState` names, if the state is intact, unexpired,
    /// unused and the caller's own for this tool and these arguments; the answer goes to the
    /// upstream and the call goes on.
    pub fn resume(
        &self,
        key: &CursorKey,
        binding: &Binding,
        state: &str,
        responses: Option<&InputResponses>,
    ) -> Result<Running, ProxyError> {
        let state: State = key.unseal(state).ok_or_else(|| refused("not one the gateway issued"))?;
        if state.exp <= now_millis() {
            self.lock().remove(&state.id);
            return Err(refused("expired"));
        }
        if &state.binding != binding {
            return Err(refused("issued for another caller, tool or arguments"));
        }
        let answer = responses
            .and_then(|r| r.get(INPUT_KEY))
            .cloned()
            .ok_or_else(|| ProxyError::Upstream(ErrorData::invalid_params("inputResponses.input is missing", None)))?;
        let waiting = self.lock().remove(&state.id).ok_or_else(|| refused("already used, or unknown here"))?;
        if waiting.answer.send(answer).is_err() {
            return Err(ProxyError::Unavailable("the call ended".to_owned()));
        }
        Ok(Running { rounds: waiting.rounds, call: waiting._call })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(arguments: &str) -> Binding {
        Binding { tenant: "t".into(), user: "u".into(), tool: "pay__refund".into(), arguments: arguments.into() }
    }

    #[test]
    fn a_consent_holds_only_for_its_caller_tool_and_arguments_until_it_expires() {
        let key = CursorKey::from_secret(&[7; 32]);
        let later = now_millis() + 60_000;
        let state = seal_consent(&key, &binding("a"), "c1", later);
        assert_eq!(open_consent(&key, &binding("a"), &state), Some(Ok(("c1".to_owned(), later))));
        assert_eq!(
            open_consent(&key, &binding("b"), &state),
            Some(Err("issued for another caller, tool or arguments"))
        );
        let other_user = Binding { user: "v".into(), ..binding("a") };
        assert!(matches!(open_consent(&key, &other_user, &state), Some(Err(_))));
        let expired = seal_consent(&key, &binding("a"), "c2", now_millis() - 1);
        assert_eq!(open_consent(&key, &binding("a"), &expired), Some(Err("expired")));
        // Sealed with another key, or altered: not a consent at all (refused where it is used).
        let foreign = seal_consent(&CursorKey::from_secret(&[8; 32]), &binding("a"), "c3", later);
        assert_eq!(open_consent(&key, &binding("a"), &foreign), None);
        // The states of other kinds are never taken for a consent, nor a consent for them.
        let passed = seal_passed(&key, &binding("a"), None, Duration::from_secs(60));
        assert_eq!(open_consent(&key, &binding("a"), &passed), None);
        assert!(open_passed(&key, &binding("a"), &state).is_err(), "a consent is no passed state");
        assert!(passed_once(&key, &binding("a"), &state).is_none());
        let (nonce, _) = passed_once(&key, &binding("a"), &passed).expect("a passed state");
        assert!(nonce.is_some(), "every passed state is sealed with its nonce");
        assert!(passed_once(&key, &binding("b"), &passed).is_none(), "bound to its arguments");
        assert!(waits_in(&key, &state).is_none(), "nothing waits for a consent");
    }
}
