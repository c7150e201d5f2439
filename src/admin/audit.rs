//! A tenant's audit trail for its auditors: the events (filtered, newest first, paged), the
//! chain's verification with the newest checkpoint that holds it, and the export.

use serde::{Deserialize, Serialize};
use sqlx::Row as _;
use utoipa::{IntoParams, ToSchema};

use super::views::{Page, PageQuery, cursor_after};
use super::{Admin, AdminError, Authority, Need};
use crate::audit::checkpoint::{self, CheckpointKey, Sink};
use crate::audit::export::{self, Exported, Format};
use crate::audit::verify::{Checkpoints, verify_with_checkpoints};
use crate::store::StoreError;

/// Which events.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventFilter {
    /// The subject of the user who called (or made the change).
    pub user: Option<String>,
    /// The tool called (or, for an administrative change, the resource changed).
    pub tool: Option<String>,
    /// `ok`, `denied`, `failed` or `unknown` (a call that was recorded and ran, forwarded or
    /// native, whose outcome was never recorded).
    pub outcome: Option<String>,
    /// From this time on (Unix milliseconds).
    pub since: Option<i64>,
    /// Before this time (Unix milliseconds).
    pub until: Option<i64>,
    /// Items per page, 1 to 500 (default 50).
    pub limit: Option<u32>,
    /// The `next` of the page before.
    pub after: Option<String>,
}

/// One event of the chain.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventView {
    pub seq: i64,
    pub occurred_at: i64,
    /// The subject of the user it names (none for a system actor or a platform administrator).
    pub user: Option<String>,
    /// Who made an administrative change (`platform:SUB`, `tenant:SLUG:SUB`, `cli`).
    pub actor: Option<String>,
    pub action: String,
    pub tool: Option<String>,
    /// `ok`, `denied`, `failed`, or `unknown`: a call that ran (forwarded, or a native tool's)
    /// whose record no outcome follows (it runs, or the gateway stopped while it ran).
    pub outcome: String,
    pub error_class: Option<String>,
    pub duration_us: i64,
    pub calls: i64,
    pub request_id: Option<String>,
    pub session_id: Option<String>,
    pub client_name: Option<String>,
    /// The hash of the event (of a call that ran: of its record).
    pub hash: String,
    /// The outcome of a call that ran: its place in the chain (the row's `seq` is the record's).
    pub outcome_seq: Option<i64>,
    /// The outcome of a call that ran: the SHA-256 of the canonical JSON of the result the
    /// caller was given.
    pub result_digest: Option<String>,
}

/// Whether a tenant's chain holds, and the newest checkpoint that vouches for it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChainStatus {
    pub tenant: String,
    pub events: i64,
    /// True when every event's hash and link hold (and every checkpoint read holds too).
    pub verified: bool,
    /// The first event that does not hold: its seq and why.
    pub broken: Option<BrokenView>,
    /// The newest checkpoint of the tenant whose signature and head hold, if checkpoints are
    /// written to a file this gateway can read.
    pub checkpoint: Option<CheckpointView>,
    /// Checkpoints of the tenant that do not hold.
    pub checkpoint_problems: Vec<String>,
    /// Calls that ran (forwarded, or native) whose record no outcome follows: the gateway stopped
    /// while they ran, or they run now (an outcome may follow its answer by
    /// `audit.outcome_linger_ms`). The chain holds; what became of them is not known.
    pub outcome_unknown: Vec<UnknownView>,
}

/// A call that ran and whose outcome is unknown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UnknownView {
    pub seq: i64,
    pub tool: Option<String>,
    pub occurred_at: i64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BrokenView {
    pub seq: i64,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CheckpointView {
    pub seq: i64,
    pub hash: String,
    /// When it was signed (Unix milliseconds).
    pub at: i64,
    pub key_id: String,
}

/// The lines of a checkpoint file, each a checkpoint or why it is not one.
type CheckpointLines = Vec<(usize, Result<checkpoint::Checkpoint, String>)>;

/// One row per event, a call's record and its outcome (if any) as one: the record's place,
/// the outcome's `outcome`, class and duration (`unknown` when none follows the record).
const EVENTS: &str = "\
SELECT e.seq, e.occurred_at, u.subject, e.action, e.tool, \
       CASE WHEN e.outcome = 'started' THEN COALESCE(o.outcome, 'unknown') ELSE e.outcome END AS outcome, \
       CASE WHEN e.outcome = 'started' THEN o.error_class ELSE e.error_class END AS error_class, \
       COALESCE(o.duration_us, e.duration_us) AS duration_us, e.calls, \
       e.request_id, e.session_id, e.client_name, e.args_raw, e.hash, o.seq AS outcome_seq, o.result_digest \
  FROM audit_events e LEFT JOIN users u ON u.tenant_id = e.tenant_id AND u.id = e.user_id \
  LEFT JOIN audit_events o ON o.tenant_id = e.tenant_id AND o.call_id = e.id \
 WHERE e.tenant_id = $1 AND e.call_id IS NULL AND e.seq < $2 \
   AND ($3 = '' OR u.subject = $3) AND ($4 = '' OR e.tool = $4) \
   AND ($5 = '' OR (CASE WHEN e.outcome = 'started' THEN COALESCE(o.outcome, 'unknown') ELSE e.outcome END) = $5) \
   AND e.occurred_at >= $6 AND e.occurred_at < $7 \
 ORDER BY e.seq DESC LIMIT $8";

impl Admin {
    /// The tenant's events, newest first.
    pub async fn audit_events(&self, who: &Authority, slug: &str, filter: &EventFilter) -> Result<Page, AdminError> {
        who.authorize(Need::Audit(slug))?;
        let page = PageQuery { limit: filter.limit, after: filter.after.clone() };
        let limit = page.limit()?;
        let before = match page.cursor(1)? {
            Some(key) => key[0].parse::<i64>().map_err(|_| AdminError::Invalid {
                field: "after",
                message: "not a cursor this collection gave".into(),
            })?,
            None => i64::MAX,
        };
        if let Some(outcome) = &filter.outcome
            && !["ok", "denied", "failed", "unknown"].contains(&outcome.as_str())
        {
            return Err(AdminError::Invalid {
                field: "outcome",
                message: "must be ok, denied, failed or unknown".into(),
            });
        }
        let mut conn = self.db.begin_read().await?;
        let tenant = super::tenant_id(&mut conn, slug).await?;
        let rows = sqlx::query(EVENTS)
            .bind(tenant)
            .bind(before)
            .bind(filter.user.clone().unwrap_or_default())
            .bind(filter.tool.clone().unwrap_or_default())
            .bind(filter.outcome.clone().unwrap_or_default())
            .bind(filter.since.unwrap_or(i64::MIN))
            .bind(filter.until.unwrap_or(i64::MAX))
            .bind(i64::from(limit) + 1)
            .fetch_all(&mut *conn)
            .await?;
        let mut items = Vec::with_capacity(rows.len());
        for r in &rows {
            let action: String = r.try_get("action")?;
            let raw: Option<String> = r.try_get("args_raw")?;
            // An administrative event records its actor beside its digests.
            let actor = raw
                .filter(|_| action.starts_with("admin."))
                .and_then(|raw| serde_json::from_str::<serde_json::Value>(&raw).ok())
                .and_then(|v| v["actor"].as_str().map(str::to_owned));
            items.push(EventView {
                seq: r.try_get("seq")?,
                occurred_at: r.try_get("occurred_at")?,
                user: r.try_get("subject")?,
                actor,
                action,
                tool: r.try_get("tool")?,
                outcome: r.try_get("outcome")?,
                error_class: r.try_get("error_class")?,
                duration_us: r.try_get("duration_us")?,
                calls: r.try_get("calls")?,
                request_id: r.try_get("request_id")?,
                session_id: r.try_get("session_id")?,
                client_name: r.try_get("client_name")?,
                hash: r.try_get("hash")?,
                outcome_seq: r.try_get("outcome_seq")?,
                result_digest: r.try_get("result_digest")?,
            });
        }
        let more = items.len() > limit as usize;
        items.truncate(limit as usize);
        let next = if more { items.last().map(|e| cursor_after(&[&e.seq.to_string()])) } else { None };
        let items = items.into_iter().map(|e| serde_json::to_value(e).unwrap_or_default()).collect();
        Ok(Page { items, next })
    }

    /// Verifies the tenant's chain, and holds it against the checkpoints of the configured
    /// file sink (signed with the configured key).
    pub async fn audit_status(&self, who: &Authority, slug: &str) -> Result<ChainStatus, AdminError> {
        who.authorize(Need::Audit(slug))?;
        let (lines, keys) = self.checkpoints();
        let given = (!lines.is_empty()).then_some(Checkpoints { lines: &lines, keys: &keys });
        let verdict = verify_with_checkpoints(&self.db, Some(slug), given).await?;
        let Some(report) = verdict.chains.into_iter().next() else {
            return Err(AdminError::NotFound(format!("tenant `{slug}` does not exist")));
        };
        let checkpoint = report.newest_checkpoint.and_then(|seq| {
            lines
                .iter()
                .filter_map(|(_, c)| c.as_ref().ok())
                .find(|c| c.tenant == slug && c.seq == seq)
                .map(|c| CheckpointView { seq: c.seq, hash: c.hash.clone(), at: c.at, key_id: c.key_id.clone() })
        });
        Ok(ChainStatus {
            tenant: report.tenant,
            events: report.events,
            verified: report.broken.is_none() && report.checkpoint_problems.is_empty(),
            broken: report.broken.map(|b| BrokenView { seq: b.seq, reason: b.reason }),
            checkpoint,
            checkpoint_problems: report.checkpoint_problems,
            outcome_unknown: report
                .outcome_unknown
                .into_iter()
                .map(|u| UnknownView { seq: u.seq, tool: u.tool, occurred_at: u.occurred_at })
                .collect(),
        })
    }

    /// The checkpoint lines of the configured file sink and the configured key's public half
    /// (none when checkpoints are off, go elsewhere, or can't be read: then the page says so
    /// by showing no checkpoint).
    fn checkpoints(&self) -> (CheckpointLines, Vec<checkpoint::VerifyingKey>) {
        let Some(audit) = &self.audit else { return (Vec::new(), Vec::new()) };
        let Ok(Some(Sink::File(path))) = Sink::parse(&audit.checkpoint_sink) else { return (Vec::new(), Vec::new()) };
        let Ok(key) = CheckpointKey::load(&audit.checkpoint_key) else { return (Vec::new(), Vec::new()) };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        (checkpoint::parse_lines(&text), vec![key.verifying_key()])
    }

    /// The tenant's chain from `since` on, streamed: refused before anything is written when
    /// `who` may not read it or the tenant does not exist; written by a task of its own.
    pub async fn audit_export_stream(
        &self,
        who: Authority,
        slug: String,
        since: Option<i64>,
        format: Format,
    ) -> Result<tokio::io::DuplexStream, AdminError> {
        who.authorize(Need::Audit(&slug))?;
        self.tenant_exists(&slug).await?;
        let (mut writer, reader) = tokio::io::duplex(64 * 1024);
        let admin = self.clone();
        tokio::spawn(async move {
            if let Err(e) = admin.audit_export(&who, &slug, since, format, &mut writer).await {
                tracing::warn!(error = %e, tenant = %slug, "audit export stopped");
            }
        });
        Ok(reader)
    }

    /// Writes the tenant's chain from `since` on to `out`, as `audit export` does.
    pub async fn audit_export(
        &self,
        who: &Authority,
        slug: &str,
        since: Option<i64>,
        format: Format,
        out: &mut (dyn tokio::io::AsyncWrite + Send + Unpin),
    ) -> Result<Exported, AdminError> {
        who.authorize(Need::Audit(slug))?;
        export::export(&self.db, slug, since, format, out).await.map_err(|e| match e {
            export::ExportError::Store(e) => AdminError::from(e),
            export::ExportError::Io(e) => {
                AdminError::Store(StoreError::Invalid { field: "export", message: e.to_string() })
            }
        })
    }
}
