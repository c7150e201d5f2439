//! Calls a person confirms. A permit policy annotated `@confirm("caller")` or
//! `@confirm("approver")`, a platform policy so annotated, or a grant with `confirm` set, makes
//! every call it allows wait for a person before it is forwarded (the strictest of them
//! decides). What the person is shown is built here, once, from the call itself: the server,
//! the tool (its approved definition's title) and the arguments as canonical JSON with the
//! digest the consent is bound to.
//!
//! - `caller`: the calling person, asked through its client: an elicitation request on the
//!   call in a session whose client declared elicitation; an `input_required` answer with that
//!   elicitation for a 2026-07-28 caller that declared it (the `requestState` sealed and bound
//!   to tenant, user, tool, the arguments' digest and an expiry, its consent usable once on any
//!   replica); refused, saying why and how to get one, to a client that can't be asked.
//! - `approver`: a second person of the tenant with the approver role decides, in the console
//!   or the admin API (`store::approvals`); the call waits for it.
//!
//! Only an accepted confirmation (an approval) forwards the call, with the very arguments shown.
//! Each question, each answer and the call are events of the tenant's chain, linked by the
//! confirmation's id.

use std::collections::BTreeMap;
use std::time::Duration;

use rmcp::model::{ElicitRequestParams, ElicitationSchema};
use serde_json::{Map, Value, json};

use crate::model::Confirm;
pub(crate) use crate::relay::Refusal;
use crate::store::approvals::{ApprovalState, NewApproval};
use crate::store::{Db, TenantId, now_millis};

/// The key of the confirmation's question in an `input_required` answer.
pub(crate) const CONFIRM_KEY: &str = "confirm";

/// The longest string value shown whole; a longer one is shown as its digest, marked.
const SHOWN_VALUE_MAX: usize = 2_000;

/// How often a waiting call reads its approval (a decision may land on any replica).
const APPROVAL_POLL: Duration = Duration::from_millis(250);

/// The server name shown for the gateway's own tools.
pub(crate) const NATIVE_SERVER: &str = "scopegate";

/// What a call needs before it is forwarded, and what the person is shown of it.
#[derive(Debug, Clone)]
pub(crate) struct Needed {
    pub mode: Confirm,
    pub server: String,
    /// The tool as the caller named it.
    pub tool: String,
    /// Its approved definition's title, if it has one.
    pub title: Option<String>,
}

/// The strictest of the confirmations that apply to one call.
pub(crate) fn strictest(a: Option<Confirm>, b: Option<Confirm>) -> Option<Confirm> {
    a.max(b)
}

/// `arguments` as the person is shown them: canonical JSON (keys sorted, no spaces), any string
/// longer than [`SHOWN_VALUE_MAX`] characters replaced by a marked digest of it, and characters
/// that change how text is laid out without being seen (bidirectional controls, zero-width
/// characters) written as `\uXXXX` escapes, so what is shown is what is sent.
pub(crate) fn shown_arguments(arguments: Option<&Map<String, Value>>) -> String {
    let value = Value::Object(arguments.cloned().unwrap_or_default());
    let text = crate::vocab::digest::canonical_json(&shorten(value));
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if invisible(c) {
            for unit in c.encode_utf16(&mut [0; 2]) {
                shown.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            shown.push(c);
        }
    }
    shown
}

fn shorten(value: Value) -> Value {
    match value {
        Value::String(s) if s.chars().count() > SHOWN_VALUE_MAX => Value::String(format!(
            "[not shown: {} bytes, sha256:{}]",
            s.len(),
            crate::vocab::digest::sha256_hex(s.as_bytes())
        )),
        Value::Array(items) => Value::Array(items.into_iter().map(shorten).collect()),
        Value::Object(members) => Value::Object(members.into_iter().map(|(k, v)| (k, shorten(v))).collect()),
        other => other,
    }
}

/// Characters that are laid out invisibly or reorder the text around them: control
/// characters JSON leaves as they are (DEL, C1) and format characters (Unicode category Cf).
fn invisible(c: char) -> bool {
    use unicode_general_category::{GeneralCategory, get_general_category};
    c.is_control() || get_general_category(c) == GeneralCategory::Format
}

/// The message a person reads before confirming: the server, the tool, the exact arguments and
/// their digest.
pub(crate) fn message(needed: &Needed, arguments: Option<&Map<String, Value>>, digest: &str) -> String {
    let tool = match &needed.title {
        Some(title) => format!("{} ({})", crate::audit::refusal::safe_text(title), needed.tool),
        None => needed.tool.clone(),
    };
    format!(
        "Confirm this call before it is made.\n\nServer: {}\nTool: {tool}\nArguments (canonical JSON, sha256:{digest}):\n{}\n\n\
         Accept to make exactly this call; decline or cancel to refuse it.",
        needed.server,
        shown_arguments(arguments),
    )
}

/// The elicitation (form mode, nothing to fill in) that asks the caller to confirm.
pub(crate) fn elicitation(message: String) -> ElicitRequestParams {
    let mut schema = ElicitationSchema::new(BTreeMap::new());
    schema.title = Some("Confirm this call".into());
    ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema: schema }
}

/// What the call's own event records of its confirmation.
pub(crate) fn record(id: &str, mode: Confirm, via: &str, answered_by: Option<&str>) -> Value {
    let mut record = json!({ "id": id, "by": mode.as_str(), "via": via });
    if let Some(who) = answered_by {
        record["answered_by"] = json!(who);
    }
    record
}

/// How a wait for an approval ended.
#[derive(Debug)]
pub(crate) enum Approval {
    /// Approved by the approver named (subject); the call is forwarded (taken once).
    Approved(String),
    /// Rejected by the approver named, with the reason if one was given.
    Rejected(String, Option<String>),
    /// Nobody decided in time.
    Lapsed,
}

/// Writes approval `new` and waits for its decision until its expiry: reads its row every
/// [`APPROVAL_POLL`] (the decision may be made on any replica). A wait that ends unanswered, or
/// whose caller goes away, lapses the approval: a decision after that changes nothing.
pub(crate) async fn wait_for_approval(db: &Db, new: &NewApproval) -> Result<Approval, crate::store::StoreError> {
    let tenant = new.tenant;
    // The request's future may be dropped (the caller went away): the approval lapses then.
    let lapse_on_drop = LapseOnDrop { db: db.clone(), tenant, id: new.id.clone(), armed: true };
    let ended = loop {
        let row = db.approval(tenant, &new.id).await?;
        let Some(row) = row else { break Approval::Lapsed };
        match row.state_now(now_millis()) {
            ApprovalState::Pending => {}
            ApprovalState::Approved => {
                if db.take_approved(tenant, &new.id).await? {
                    break Approval::Approved(row.decided_subject.unwrap_or_default());
                }
                break Approval::Lapsed;
            }
            ApprovalState::Rejected => break Approval::Rejected(row.decided_subject.unwrap_or_default(), row.reason),
            ApprovalState::Lapsed => {
                // Lapse it in the row too, unless a decision lands first (then read it again).
                if db.lapse_approval(tenant, &new.id).await? || row.state != ApprovalState::Pending {
                    break Approval::Lapsed;
                }
                continue;
            }
        }
        tokio::time::sleep(APPROVAL_POLL).await;
    };
    lapse_on_drop.disarm();
    Ok(ended)
}

/// Lapses a pending approval when the wait for it is dropped before it ended.
struct LapseOnDrop {
    db: Db,
    tenant: TenantId,
    id: String,
    armed: bool,
}

impl LapseOnDrop {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for LapseOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (db, tenant, id) = (self.db.clone(), self.tenant, std::mem::take(&mut self.id));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = db.lapse_approval(tenant, &id).await {
                    tracing::warn!(error = %e, approval = %id, "an abandoned approval could not be lapsed");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_shown_canonically_with_long_values_digested_and_invisibles_escaped() {
        let long = "x".repeat(SHOWN_VALUE_MAX + 1);
        let args = json!({"b": 1, "a": "to\u{202e}gnp.exe", "z": [long.clone()], "c": "\u{200b}"});
        let shown = shown_arguments(args.as_object());
        assert!(shown.starts_with("{\"a\":\"to\\u202egnp.exe\",\"b\":1,\"c\":\"\\u200b\""), "{shown}");
        let digest = crate::vocab::digest::sha256_hex(long.as_bytes());
        assert!(shown.contains(&format!("[not shown: {} bytes, sha256:{digest}]", long.len())), "{shown}");
        assert!(!shown.contains(&long));
        let exact = "y".repeat(SHOWN_VALUE_MAX);
        assert!(shown_arguments(json!({"v": exact}).as_object()).contains(&exact), "at the bound: shown whole");
        assert_eq!(shown_arguments(None), "{}");
    }

    #[test]
    fn the_message_names_server_tool_title_arguments_and_digest() {
        let needed = Needed {
            mode: Confirm::Caller,
            server: "payments".into(),
            tool: "payments__refund".into(),
            title: Some("Refund a payment".into()),
        };
        let args = json!({"amount": 500});
        let text = message(&needed, args.as_object(), "abc");
        assert!(text.contains("Server: payments\n"), "{text}");
        assert!(text.contains("Tool: Refund a payment (payments__refund)\n"), "{text}");
        assert!(text.contains("Arguments (canonical JSON, sha256:abc):\n{\"amount\":500}\n"), "{text}");
    }

    #[test]
    fn the_strictest_confirmation_decides() {
        assert_eq!(strictest(None, None), None);
        assert_eq!(strictest(Some(Confirm::Caller), None), Some(Confirm::Caller));
        assert_eq!(strictest(Some(Confirm::Caller), Some(Confirm::Approver)), Some(Confirm::Approver));
        assert_eq!(strictest(None, Some(Confirm::Approver)), Some(Confirm::Approver));
    }
}
