//! Task handles (`io.modelcontextprotocol/tasks`, SEP-2663): the `taskId` a caller sees for a
//! task of an upstream. The gateway mints it when it records the task (`store::tasks`): it
//! seals the gateway's own id of the task, the tenant and user it belongs to and its expiry
//! with a key every replica of the database shares, so a poll is answered on any replica. The
//! upstream's own task id is never in it (it stays in the task's row). A handle that was
//! altered, forged, minted for another caller or that expired opens to nothing, and is then
//! answered exactly as an unknown task (-32602), as is a handle whose row is gone (expired,
//! purged, its user deleted).
//!
//! A task that lives in one replica's process (a relayed task of a stdio upstream: only the
//! process that created it knows it) is pinned: its handle names that replica too, and a
//! `tasks/*` request for it that lands elsewhere is forwarded there ([`pinned_to`]).

use serde::{Deserialize, Serialize};

use super::cursor::CursorKey;
use crate::store::{TenantId, UserId};

/// The longest a gateway keeps a task of an upstream that names no TTL (or a longer one): a
/// day.
pub const MAX_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// How often a caller is told to poll when the upstream names no interval.
pub const DEFAULT_POLL_MS: u64 = 1_000;

/// What a handle seals.
#[derive(Serialize, Deserialize)]
struct Sealed {
    /// The gateway's id of the task.
    i: String,
    t: String,
    u: String,
    /// Expiry, epoch milliseconds.
    x: i64,
    /// The replica a pinned task lives in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    r: Option<String>,
}

/// The handle of task `id` of this owner, good until `expires_at`; `pinned`: the replica the
/// task lives in, when only that one can reach it.
pub fn mint(
    key: &CursorKey,
    id: &str,
    tenant: TenantId,
    user: UserId,
    expires_at: i64,
    pinned: Option<&str>,
) -> String {
    let r = pinned.map(str::to_owned);
    key.seal(&Sealed { i: id.to_owned(), t: tenant.to_string(), u: user.to_string(), x: expires_at, r })
}

/// The replica an intact, unexpired handle's task is pinned to (`None`: any replica serves
/// it). Says nothing of whose it is: the replica it names checks that.
pub fn pinned_to(key: &CursorKey, handle: &str, now: i64) -> Option<String> {
    let sealed: Sealed = key.unseal(handle)?;
    if sealed.x <= now {
        return None;
    }
    sealed.r
}

/// The gateway's id of the task `handle` names, when it is intact, was minted for this owner
/// and has not expired at `now`.
pub fn open(key: &CursorKey, handle: &str, tenant: TenantId, user: UserId, now: i64) -> Option<String> {
    let sealed: Sealed = key.unseal(handle)?;
    (sealed.t == tenant.to_string() && sealed.u == user.to_string() && sealed.x > now).then_some(sealed.i)
}

/// When a task created at `now` with the upstream's `ttl_ms` expires for the gateway: at the
/// upstream's TTL, at most [`MAX_TTL_MS`].
pub fn expiry(now: i64, ttl_ms: Option<u64>) -> i64 {
    let ttl = ttl_ms.map_or(MAX_TTL_MS, |t| i64::try_from(t).unwrap_or(i64::MAX).min(MAX_TTL_MS));
    now.saturating_add(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_opens_only_for_its_owner_intact_and_in_time() {
        let key = CursorKey::from_secret(&[1; 32]);
        let (tenant, user) = (TenantId::generate(), UserId::generate());
        let handle = mint(&key, "task-1", tenant, user, 2_000, None);
        assert_eq!(open(&key, &handle, tenant, user, 1_000).as_deref(), Some("task-1"));
        // Expired, another user, another tenant, another key, altered: nothing.
        assert_eq!(open(&key, &handle, tenant, user, 2_000), None);
        assert_eq!(open(&key, &handle, tenant, UserId::generate(), 1_000), None);
        assert_eq!(open(&key, &handle, TenantId::generate(), user, 1_000), None);
        assert_eq!(open(&CursorKey::from_secret(&[2; 32]), &handle, tenant, user, 1_000), None);
        let (body, tag) = handle.split_once('.').unwrap();
        let forged = mint(&CursorKey::from_secret(&[2; 32]), "task-1", tenant, user, i64::MAX, None);
        let forged_body = forged.split_once('.').unwrap().0;
        assert_eq!(open(&key, &format!("{forged_body}.{tag}"), tenant, user, 1_000), None);
        assert_eq!(open(&key, &format!("{body}x.{tag}"), tenant, user, 1_000), None);
        assert_eq!(open(&key, "task-1", tenant, user, 1_000), None);
        assert_eq!(pinned_to(&key, &handle, 1_000), None, "not pinned");
    }

    #[test]
    fn a_pinned_handle_names_its_replica_while_it_is_good() {
        let key = CursorKey::from_secret(&[1; 32]);
        let (tenant, user) = (TenantId::generate(), UserId::generate());
        let handle = mint(&key, "task-1", tenant, user, 2_000, Some("replica-a"));
        assert_eq!(pinned_to(&key, &handle, 1_000).as_deref(), Some("replica-a"));
        assert_eq!(open(&key, &handle, tenant, user, 1_000).as_deref(), Some("task-1"));
        assert_eq!(pinned_to(&key, &handle, 2_000), None, "expired");
        assert_eq!(pinned_to(&CursorKey::from_secret(&[2; 32]), &handle, 1_000), None, "another key");
    }

    #[test]
    fn expiry_is_the_upstream_ttl_capped_at_a_day() {
        assert_eq!(expiry(1_000, Some(60_000)), 61_000);
        assert_eq!(expiry(1_000, None), 1_000 + MAX_TTL_MS);
        assert_eq!(expiry(1_000, Some(u64::MAX)), 1_000 + MAX_TTL_MS);
    }
}
