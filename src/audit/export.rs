//! `scopegate audit export`: one tenant's chain, from a point in time on, streamed row by row
//! as JSON lines or CSV. Every row carries its `seq`, its `prev_hash` and its chain `hash`, so
//! each one can be checked on its own (the hash is recomputed from the row's fields) and
//! against its neighbours and the chain's signed checkpoints (`audit verify-export`).
//!
//! A JSON line is `{"hash":H,` followed by the members of the canonical body whose SHA-256
//! is `H` (see [`chain_line`]): any JSON library checks it. A CSV row holds the same fields in
//! [`COLUMNS`] order; text is always quoted and an absent value is an empty unquoted field, so
//! an empty text and an absent one stay apart and the row hashes exactly as stored.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use futures_util::TryStreamExt as _;
use serde::Deserialize;
use sqlx::Row as _;

use super::digest::chain_line;
use super::verify::{EVENT_COLUMNS, event_from_row, link_problem};
use super::{AuditEvent, Outcome};
use crate::store::{AuditEventId, Db, StoreError, TenantId, UserId};

/// How an export is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Jsonl,
    Csv,
}

/// The CSV header, and the order of a CSV row's fields. `policy` came later, and `call_id` and
/// `result_digest` later still, each at the end: an export written before them (the first 19 or
/// 20 columns) is read too.
pub const COLUMNS: [&str; 22] = [
    "seq",
    "id",
    "tenant_id",
    "occurred_at",
    "user_id",
    "session_id",
    "request_id",
    "client_name",
    "client_version",
    "action",
    "tool",
    "args_digest",
    "args_raw",
    "outcome",
    "error_class",
    "duration_us",
    "calls",
    "prev_hash",
    "hash",
    "policy",
    "call_id",
    "result_digest",
];

/// The columns of an export written before `policy` existed.
const COLUMNS_BEFORE_POLICY: usize = 19;

/// The columns of an export written before `call_id` and `result_digest` existed.
const COLUMNS_BEFORE_OUTCOMES: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the export: {0}")]
    Io(#[from] std::io::Error),
}

impl From<sqlx::Error> for ExportError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// What an export wrote, and whether the rows it read hold together as a chain.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Exported {
    pub events: u64,
    /// The first exported row's seq and prev_hash: where the export joins the chain.
    pub first: Option<(i64, String)>,
    /// The last exported row's seq and hash.
    pub head: Option<(i64, String)>,
    /// The first row whose hash or link does not hold, and why (it is exported as stored).
    pub broken: Option<(i64, String)>,
}

/// Writes the chain of the tenant `slug`, from its first event at or after `since_ms` (epoch
/// milliseconds) on, to `out`, a row at a time as the database returns them. The rows are
/// read in one snapshot, in seq order, and every row after the first is exported: seq is the
/// commit order, so a few of them may have occurred a little before `since_ms`, and none is
/// left out of the exported stretch of the chain.
pub async fn export(
    db: &Db,
    slug: &str,
    since_ms: Option<i64>,
    format: Format,
    out: &mut (dyn tokio::io::AsyncWrite + Send + Unpin),
) -> Result<Exported, ExportError> {
    use tokio::io::AsyncWriteExt as _;
    let mut tx = db.begin_read().await?;
    let tenant: Option<String> =
        sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1").bind(slug).fetch_optional(&mut *tx).await?;
    let Some(tenant) = tenant else {
        return Err(StoreError::NotFound(format!("tenant `{slug}` does not exist")).into());
    };
    let from: Option<i64> = match since_ms {
        None => Some(1),
        Some(since) => {
            sqlx::query_scalar("SELECT MIN(seq) FROM audit_events WHERE tenant_id = $1 AND occurred_at >= $2")
                .bind(&tenant)
                .bind(since)
                .fetch_one(&mut *tx)
                .await?
        }
    };
    if format == Format::Csv {
        out.write_all(format!("{}\n", COLUMNS.join(",")).as_bytes()).await?;
    }
    let mut done = Exported::default();
    let Some(from) = from else {
        return Ok(done);
    };
    let sql = format!("SELECT {EVENT_COLUMNS} FROM audit_events WHERE tenant_id = $1 AND seq >= $2 ORDER BY seq");
    let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&tenant).bind(from).fetch(&mut *tx);
    while let Some(row) = rows.try_next().await? {
        let event = event_from_row(&row)?;
        let seq: i64 = row.try_get("seq")?;
        let prev_hash: String = row.try_get("prev_hash")?;
        let hash: String = row.try_get("hash")?;
        if done.broken.is_none()
            && let Some(reason) = link_problem(done.head.as_ref(), seq, &prev_hash, &hash, &event)
        {
            done.broken = Some((seq, reason));
        }
        let mut line = Vec::with_capacity(512);
        match format {
            Format::Jsonl => writeln!(line, "{}", chain_line(&prev_hash, seq, &event, &hash))?,
            Format::Csv => write_csv_row(&mut line, seq, &prev_hash, &hash, &event)?,
        }
        out.write_all(&line).await?;
        done.events += 1;
        if done.first.is_none() {
            done.first = Some((seq, prev_hash));
        }
        done.head = Some((seq, hash));
    }
    out.flush().await?;
    Ok(done)
}

/// One CSV field: text is always quoted (a quote doubled inside), a number is bare, an absent
/// value is empty.
enum Cell<'a> {
    Number(i64),
    Text(Option<&'a str>),
}

fn write_csv_row(out: &mut dyn Write, seq: i64, prev_hash: &str, hash: &str, e: &AuditEvent) -> std::io::Result<()> {
    use Cell::{Number, Text};
    let (id, tenant, user) = (e.id.to_string(), e.tenant.to_string(), e.user.to_string());
    let call_id = e.call_id.map(|c| c.to_string());
    // In `COLUMNS` order.
    let cells = [
        Number(seq),
        Text(Some(&id)),
        Text(Some(&tenant)),
        Number(e.occurred_at),
        Text(Some(&user)),
        Text(e.session_id.as_deref()),
        Text(e.request_id.as_deref()),
        Text(e.client_name.as_deref()),
        Text(e.client_version.as_deref()),
        Text(Some(&e.action)),
        Text(e.tool.as_deref()),
        Text(e.args_digest.as_deref()),
        Text(e.args_raw.as_deref()),
        Text(Some(e.outcome.as_str())),
        Text(e.error_class.as_deref()),
        Number(e.duration_us),
        Number(e.calls),
        Text(Some(prev_hash)),
        Text(Some(hash)),
        Text(e.policy.as_deref()),
        Text(call_id.as_deref()),
        Text(e.result_digest.as_deref()),
    ];
    for (i, cell) in cells.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        match cell {
            Number(n) => write!(out, "{n}")?,
            Text(None) => {}
            Text(Some(text)) => write!(out, "\"{}\"", text.replace('"', "\"\""))?,
        }
    }
    out.write_all(b"\n")
}

/// Signed chain heads to hold an export against: a checkpointed (tenant id, seq) and its hash.
/// Only checkpoints whose signature holds belong here.
#[derive(Debug, Default)]
pub struct Anchors(HashMap<(TenantId, i64), String>);

impl Anchors {
    pub fn insert(&mut self, tenant: TenantId, seq: i64, hash: String) {
        self.0.insert((tenant, seq), hash);
    }

    /// The highest seq checkpointed for `tenant`.
    fn newest(&self, tenant: TenantId) -> Option<i64> {
        self.0.keys().filter(|(t, _)| *t == tenant).map(|(_, seq)| *seq).max()
    }
}

/// What `audit verify-export` found in an export that holds: every row's hash is that of its
/// fields, every row follows the one before it, all of one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub events: u64,
    pub tenant: Option<TenantId>,
    /// The first row's seq and prev_hash.
    pub first: Option<(i64, String)>,
    /// The last row's seq and hash: compare it with a signed checkpoint or the live chain.
    pub head: Option<(i64, String)>,
    /// Rows that a signed checkpoint names, all with the checkpointed hash.
    pub anchored: usize,
    /// Calls whose record no outcome in the export follows (the gateway stopped while they
    /// ran, or the export was taken while they ran).
    pub outcome_unknown: Vec<super::verify::UnknownOutcome>,
}

/// The first thing wrong with an export: the line (1-based; a CSV row spanning lines is named
/// by its first) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ExportProblem {
    pub line: usize,
    pub reason: String,
}

/// A JSON line of an export: the chain body's members and `hash`, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRow {
    hash: String,
    action: String,
    args_digest: Option<String>,
    args_raw: Option<String>,
    // The body leaves `calls` out when it is 1.
    #[serde(default = "one")]
    calls: i64,
    client_name: Option<String>,
    client_version: Option<String>,
    duration_us: i64,
    error_class: Option<String>,
    id: AuditEventId,
    occurred_at: i64,
    outcome: String,
    prev_hash: String,
    request_id: Option<String>,
    seq: i64,
    session_id: Option<String>,
    tenant_id: TenantId,
    tool: Option<String>,
    user_id: UserId,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    call_id: Option<AuditEventId>,
    #[serde(default)]
    result_digest: Option<String>,
}

fn one() -> i64 {
    1
}

/// One row of an export, read back.
struct ReadRow {
    seq: i64,
    prev_hash: String,
    hash: String,
    event: AuditEvent,
}

fn outcome(text: &str) -> Result<Outcome, String> {
    Outcome::parse(text).ok_or_else(|| format!("unknown outcome `{text}`"))
}

fn json_row(text: &str) -> Result<ReadRow, String> {
    let r: JsonRow = serde_json::from_str(text).map_err(|e| format!("not an exported event: {e}"))?;
    Ok(ReadRow {
        seq: r.seq,
        prev_hash: r.prev_hash,
        hash: r.hash,
        event: AuditEvent {
            id: r.id,
            tenant: r.tenant_id,
            occurred_at: r.occurred_at,
            user: r.user_id,
            session_id: r.session_id,
            request_id: r.request_id,
            client_name: r.client_name,
            client_version: r.client_version,
            action: r.action,
            tool: r.tool,
            args_digest: r.args_digest,
            args_raw: r.args_raw,
            outcome: outcome(&r.outcome)?,
            error_class: r.error_class,
            duration_us: r.duration_us,
            calls: r.calls,
            policy: r.policy,
            call_id: r.call_id,
            result_digest: r.result_digest,
        },
    })
}

/// Reads one CSV record (RFC 4180; a quoted field may hold line breaks), or `None` at the end.
/// A field is `None` when it is empty and unquoted. `line` counts the physical lines read.
fn csv_record(input: &mut dyn BufRead, line: &mut usize) -> Result<Option<Vec<Option<String>>>, String> {
    let mut fields = Vec::with_capacity(COLUMNS.len());
    let mut field = String::new();
    let (mut quoted, mut in_quotes, mut closed) = (false, false, false);
    let mut text = String::new();
    loop {
        text.clear();
        if input.read_line(&mut text).map_err(|e| format!("reading: {e}"))? == 0 {
            return if fields.is_empty() && field.is_empty() && !quoted {
                Ok(None)
            } else if in_quotes {
                Err("a quoted field is not closed".into())
            } else {
                fields.push(if quoted || !field.is_empty() { Some(field) } else { None });
                Ok(Some(fields))
            };
        }
        *line += 1;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if in_quotes {
                if c != '"' {
                    field.push(c);
                } else if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    in_quotes = false;
                    closed = true;
                }
                continue;
            }
            match c {
                ',' => {
                    fields.push(if quoted || !field.is_empty() { Some(std::mem::take(&mut field)) } else { None });
                    (quoted, closed) = (false, false);
                }
                '\n' => {
                    fields.push(if quoted || !field.is_empty() { Some(field) } else { None });
                    return Ok(Some(fields));
                }
                '\r' if chars.peek() == Some(&'\n') => {}
                '"' if field.is_empty() && !quoted => (quoted, in_quotes) = (true, true),
                _ if closed => return Err("text after a quoted field's closing quote".into()),
                '"' => return Err("a quote inside an unquoted field".into()),
                _ => field.push(c),
            }
        }
    }
}

fn csv_row(cells: Vec<Option<String>>, width: usize) -> Result<ReadRow, String> {
    if cells.len() != width {
        return Err(format!("{} fields, not {width}", cells.len()));
    }
    let mut cells = cells.into_iter().zip(COLUMNS);
    let mut text = move || cells.next().expect("counted above");
    fn required((cell, name): (Option<String>, &str)) -> Result<String, String> {
        cell.ok_or_else(|| format!("`{name}` is empty"))
    }
    fn parsed<T: std::str::FromStr>(cell: (Option<String>, &str), what: &str) -> Result<T, String> {
        let name = cell.1;
        required(cell)?.parse().map_err(|_| format!("`{name}` is not {what}"))
    }
    let number = |cell| parsed::<i64>(cell, "a number");
    let seq = number(text())?;
    let id: AuditEventId = parsed(text(), "an id")?;
    let tenant: TenantId = parsed(text(), "an id")?;
    let occurred_at = number(text())?;
    let user: UserId = parsed(text(), "an id")?;
    let (session_id, request_id, client_name, client_version) = (text().0, text().0, text().0, text().0);
    let action = required(text())?;
    let (tool, args_digest, args_raw) = (text().0, text().0, text().0);
    let outcome = outcome(&required(text())?)?;
    let error_class = text().0;
    let duration_us = number(text())?;
    let calls = number(text())?;
    let prev_hash = required(text())?;
    let hash = required(text())?;
    let policy = if width > COLUMNS_BEFORE_POLICY { text().0 } else { None };
    let (call_id, result_digest) = match width > COLUMNS_BEFORE_OUTCOMES {
        true => {
            (text().0.map(|c| c.parse::<AuditEventId>().map_err(|_| "`call_id` is not an id")).transpose()?, text().0)
        }
        false => (None, None),
    };
    Ok(ReadRow {
        seq,
        prev_hash,
        hash,
        event: AuditEvent {
            id,
            tenant,
            occurred_at,
            user,
            session_id,
            request_id,
            client_name,
            client_version,
            action,
            tool,
            args_digest,
            args_raw,
            outcome,
            error_class,
            duration_us,
            calls,
            policy,
            call_id,
            result_digest,
        },
    })
}

/// Checks an export (JSON lines or CSV, told apart by its first byte) as it is read: each row's
/// hash against its own fields, its link to the row before, one tenant throughout.
/// A row that a checkpoint in `anchors` names must have the checkpointed hash, and the export
/// must reach its tenant's newest checkpoint: an export always runs to the head of the chain
/// (`--since` moves only its start), so one that ends below a signed head was cut short.
pub fn verify_export(input: &mut dyn BufRead, anchors: &Anchors) -> Result<Checked, ExportProblem> {
    let problem = |line: usize, reason: String| ExportProblem { line, reason };
    let first_byte = input.fill_buf().map_err(|e| problem(1, format!("reading: {e}")))?.first().copied();
    let mut checked =
        Checked { events: 0, tenant: None, first: None, head: None, anchored: 0, outcome_unknown: Vec::new() };
    // Each outcome follows its own record once; an export `--since` may hold outcomes of calls
    // recorded before its first row.
    let mut calls = None;
    let mut line = 0;
    let csv = first_byte.is_some_and(|b| b != b'{');
    let mut width = COLUMNS.len();
    if csv {
        let header = csv_record(input, &mut line).map_err(|r| problem(1, r))?.unwrap_or_default();
        let names = || header.iter().map(|h| h.as_deref().unwrap_or(""));
        if let Some(older) = [COLUMNS_BEFORE_POLICY, COLUMNS_BEFORE_OUTCOMES]
            .into_iter()
            .find(|n| names().eq(COLUMNS[..*n].iter().copied()))
        {
            width = older;
        } else if names().ne(COLUMNS) {
            return Err(problem(1, format!("not an export: the CSV header is not `{}`", COLUMNS.join(","))));
        }
    }
    loop {
        let at = line + 1;
        let row = if csv {
            match csv_record(input, &mut line).map_err(|r| problem(at, r))? {
                None => break,
                Some(cells) => csv_row(cells, width).map_err(|r| problem(at, r))?,
            }
        } else {
            let mut text = String::new();
            if input.read_line(&mut text).map_err(|e| problem(at, format!("reading: {e}")))? == 0 {
                break;
            }
            line += 1;
            json_row(text.trim_end_matches(['\n', '\r'])).map_err(|r| problem(at, r))?
        };
        if checked.tenant.is_some_and(|t| t != row.event.tenant) {
            return Err(problem(at, "an event of another tenant".into()));
        }
        if let Some(reason) = link_problem(checked.head.as_ref(), row.seq, &row.prev_hash, &row.hash, &row.event) {
            return Err(problem(at, format!("seq {}: {reason}", row.seq)));
        }
        let calls = calls.get_or_insert_with(|| match row.seq {
            1 => super::verify::Calls::default(),
            _ => super::verify::Calls::from_the_middle(),
        });
        if let Some(reason) = calls.follow(row.seq, &row.event) {
            return Err(problem(at, format!("seq {}: {reason}", row.seq)));
        }
        if let Some(signed) = anchors.0.get(&(row.event.tenant, row.seq)) {
            if *signed != row.hash {
                return Err(problem(at, format!("seq {}: the signed checkpoint has another hash", row.seq)));
            }
            checked.anchored += 1;
        }
        checked.events += 1;
        checked.tenant = Some(row.event.tenant);
        if checked.first.is_none() {
            checked.first = Some((row.seq, row.prev_hash));
        }
        checked.head = Some((row.seq, row.hash));
    }
    if let (Some(tenant), Some((last, _))) = (checked.tenant, &checked.head)
        && let Some(signed) = anchors.newest(tenant).filter(|signed| signed > last)
    {
        return Err(problem(
            line + 1,
            format!(
                "the export ends at seq {last}, below the signed checkpoint at seq {signed}: the rows after \
                 seq {last} were cut off (an export made before that checkpoint was signed can only be \
                 checked against the checkpoints signed before it)"
            ),
        ));
    }
    checked.outcome_unknown = calls.map(super::verify::Calls::unknown).unwrap_or_default();
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::GENESIS;
    use crate::audit::digest::chain_hash;

    fn event(n: i64, raw: Option<&str>) -> AuditEvent {
        AuditEvent {
            id: AuditEventId::generate(),
            tenant: TenantId::nil(),
            occurred_at: 1_700_000_000_000 + n,
            user: UserId::nil(),
            session_id: Some(String::new()),
            request_id: None,
            client_name: Some("say \"hi\", then\nleave".into()),
            client_version: None,
            action: "tools/call".into(),
            tool: Some("record_egg_count".into()),
            args_digest: Some("d".into()),
            args_raw: raw.map(str::to_owned),
            // Row 1 is a call's record, row 4 its outcome (`exports` names the call).
            outcome: if n == 1 { Outcome::Started } else { Outcome::Ok },
            error_class: None,
            duration_us: 7,
            calls: if n == 2 { 3 } else { 1 },
            policy: (n == 3).then(|| r#"{"decision":"allow"}"#.to_owned()),
            call_id: None,
            result_digest: (n == 4).then(|| "r".repeat(64)),
        }
    }

    /// A chain of four events written both ways: a call's record, two events, its outcome.
    fn exports() -> (String, String) {
        chain(&[None, None, None, Some(0)])
    }

    /// A chain of an event per item of `calls`, written both ways; an item names the event
    /// (by its index) whose call the event is the outcome of.
    fn chain(calls: &[Option<usize>]) -> (String, String) {
        let mut prev = GENESIS.to_owned();
        let (mut jsonl, mut csv) = (String::new(), format!("{}\n", COLUMNS.join(",")));
        let mut ids = Vec::new();
        for (n, call) in (1..).zip(calls) {
            let mut e = event(n, (n == 3).then_some("{\"a\":\"x\r\ny\"}"));
            // An index not yet written names a call no event of the chain is.
            e.call_id = call.map(|i: usize| ids.get(i).copied().unwrap_or_else(AuditEventId::generate));
            ids.push(e.id);
            let hash = chain_hash(&prev, n, &e);
            jsonl.push_str(&chain_line(&prev, n, &e, &hash));
            jsonl.push('\n');
            let mut row = Vec::new();
            write_csv_row(&mut row, n, &prev, &hash, &e).unwrap();
            csv.push_str(std::str::from_utf8(&row).unwrap());
            prev = hash;
        }
        (jsonl, csv)
    }

    fn check(text: &str) -> Result<Checked, ExportProblem> {
        verify_export(&mut text.as_bytes(), &Anchors::default())
    }

    #[test]
    fn a_checkpointed_row_must_have_the_signed_hash() {
        let (jsonl, _) = exports();
        let second: serde_json::Value = serde_json::from_str(jsonl.lines().nth(1).unwrap()).unwrap();
        let hash = second["hash"].as_str().unwrap().to_owned();
        let mut anchors = Anchors::default();
        anchors.insert(TenantId::nil(), 2, hash.clone());
        assert_eq!(verify_export(&mut jsonl.as_bytes(), &anchors).unwrap().anchored, 1);
        let mut other = Anchors::default();
        other.insert(TenantId::nil(), 2, hash.replace('a', "b").replace('0', "1"));
        let err = verify_export(&mut jsonl.as_bytes(), &other).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.reason.contains("signed checkpoint"), "{err}");
    }

    #[test]
    fn both_formats_read_back_and_verify() {
        let (jsonl, csv) = exports();
        let a = check(&jsonl).unwrap();
        let b = check(&csv).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.events, 4);
        assert_eq!(a.first, Some((1, GENESIS.to_owned())));
    }

    #[test]
    fn a_json_line_checks_itself_without_scopegate() {
        let (jsonl, _) = exports();
        for line in jsonl.lines() {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            let hash = value.as_object_mut().unwrap().remove("hash").unwrap();
            let canonical = crate::audit::digest::canonical_json(&value);
            assert_eq!(crate::audit::digest::sha256_hex(canonical.as_bytes()), hash.as_str().unwrap());
        }
    }

    #[test]
    fn an_empty_text_and_an_absent_one_stay_apart_in_csv() {
        let (_, csv) = exports();
        // session_id is an empty text, request_id absent: swapping them breaks the hash.
        let row = csv.lines().nth(1).unwrap();
        assert!(row.contains(",\"\",,"), "{row}");
        let swapped = csv.replacen(",\"\",,", ",,\"\",", 1);
        let err = check(&swapped).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.reason.contains("hash does not match"), "{err}");
    }

    #[test]
    fn a_changed_field_or_a_missing_row_is_named_by_its_line() {
        let (jsonl, csv) = exports();
        let err = check(&jsonl.replacen("\"duration_us\":7", "\"duration_us\":8", 1)).unwrap_err();
        assert_eq!((err.line, err.reason.contains("hash does not match")), (1, true), "{err}");
        let without_second: String =
            jsonl.lines().enumerate().filter(|(i, _)| *i != 1).map(|(_, l)| l.to_owned() + "\n").collect();
        let err = check(&without_second).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.reason.contains("sequence gap"), "{err}");
        let err = check(&csv.replacen("\"tools/call\"", "\"tools/list\"", 1)).unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        let err = check(&jsonl.replacen("\"seq\":1", "\"seq\":1,\"extra\":1", 1)).unwrap_err();
        assert!(err.reason.contains("unknown field"), "{err}");
        // An outcome's call is part of what its hash covers.
        let fourth: serde_json::Value = serde_json::from_str(jsonl.lines().nth(3).unwrap()).unwrap();
        let call = fourth["call_id"].as_str().unwrap();
        let other = jsonl.lines().nth(3).unwrap().replace(call, &AuditEventId::generate().to_string());
        let lines: Vec<&str> = jsonl.lines().take(3).chain([other.as_str()]).collect();
        let err = check(&(lines.join("\n") + "\n")).unwrap_err();
        assert_eq!((err.line, err.reason.contains("hash does not match")), (4, true), "{err}");
        let err = check("seq,id\n").unwrap_err();
        assert!(err.reason.contains("header"), "{err}");
    }

    #[test]
    fn an_export_from_the_middle_of_a_chain_verifies_from_its_first_row() {
        let (jsonl, _) = exports();
        let tail: String = jsonl.lines().skip(1).map(|l| l.to_owned() + "\n").collect();
        let c = check(&tail).unwrap();
        assert_eq!(c.events, 3);
        assert_eq!(c.first.unwrap().0, 2);
        assert_eq!(check("").unwrap().events, 0);
    }

    #[test]
    fn each_outcome_in_an_export_follows_its_own_record_once() {
        let (jsonl, csv) = exports();
        for text in [&jsonl, &csv] {
            assert_eq!(check(text).unwrap().outcome_unknown, []);
        }
        // A record without its outcome: listed, not a failure.
        let (jsonl, _) = chain(&[None, None, None]);
        let c = check(&jsonl).unwrap();
        assert_eq!(c.outcome_unknown.iter().map(|u| u.seq).collect::<Vec<_>>(), [1]);
        // A second outcome of one call, from the whole chain and from its middle.
        let (jsonl, _) = chain(&[None, None, Some(0), Some(0)]);
        let err = check(&jsonl).unwrap_err();
        assert_eq!(err.line, 4);
        assert!(err.reason.contains("second outcome of the call recorded at seq 1"), "{err}");
        let tail: String = jsonl.lines().skip(1).map(|l| l.to_owned() + "\n").collect();
        let err = check(&tail).unwrap_err();
        assert!(err.reason.contains("seq 4: a second outcome of call"), "{err}");
        // An outcome of a call recorded before: only an export from the middle may hold one.
        let (jsonl, _) = chain(&[None, Some(0)]);
        let tail: String = jsonl.lines().skip(1).map(|l| l.to_owned() + "\n").collect();
        assert_eq!(check(&tail).unwrap().events, 1);
        let (jsonl, _) = chain(&[None, Some(9)]);
        let err = check(&jsonl).unwrap_err();
        assert!(err.reason.contains("which no record before it"), "{err}");
    }
}
