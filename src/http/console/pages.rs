//! The console's pages. maud escapes every value it interpolates; no page carries a script
//! or an inline style.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use maud::{DOCTYPE, Markup, html};
use serde_json::Value;

use super::super::admin::status::{ExecutorStatus, ServerStatus, SessionCount};
use super::Notice;
use crate::admin::definitions::{DefinitionDetail, DefinitionView, FieldChange};
use crate::admin::{Authority, ChainStatus, Page};
use crate::model::Role;

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
fn when(ms: &Value) -> String {
    let Some(ms) = ms.as_i64() else { return String::new() };
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .map(|t| format!("{t} UTC"))
        .unwrap_or_default()
}

fn who_text(who: &Authority) -> String {
    match who {
        Authority::Cli => "cli".into(),
        Authority::Platform { subject } => format!("{subject} · platform administrator"),
        Authority::Member(m) => {
            let roles: Vec<&str> = m.roles.iter().map(|r| r.as_str()).collect();
            format!("{} · {} of {}", m.subject, roles.join(", "), m.slug)
        }
    }
}

fn nav(who: &Authority, csrf: &str) -> Markup {
    let (platform, member) = match who {
        Authority::Member(m) => (false, Some(m)),
        _ => (true, None),
    };
    html! {
        header {
            strong { a href="/console" { "scopegate console" } }
            @if platform {
                a href="/console/tenants" { "Tenants" }
                a href="/console/executors" { "Executors" }
            }
            @if let Some(m) = member {
                @if m.roles.contains(&Role::Owner) {
                    a href={ "/console/tenants/" (m.slug) } { "Tenant " (m.slug) }
                }
                @if m.roles.contains(&Role::Owner) || m.roles.contains(&Role::Auditor) {
                    a href={ "/console/tenants/" (m.slug) "/policies" } { "Policies" }
                    a href={ "/console/tenants/" (m.slug) "/definitions" } { "Definitions" }
                }
                @if m.roles.iter().any(|r| matches!(r, Role::Approver | Role::Owner | Role::Auditor)) {
                    a href={ "/console/tenants/" (m.slug) "/approvals" } { "Approvals" }
                }
                @if m.roles.contains(&Role::Auditor) {
                    a href={ "/console/tenants/" (m.slug) "/audit" } { "Audit trail" }
                }
            }
            a href="/console/guards" { "Guard report" }
            span.who { (who_text(who)) }
            form method="post" action="/console/signout" {
                input type="hidden" name="csrf" value=(csrf);
                button.quiet type="submit" { "Sign out" }
            }
        }
    }
}

fn page(title: &str, header: Markup, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · scopegate" }
                link rel="stylesheet" href="/console/assets/console.css";
            }
            body {
                (header)
                main { (body) }
            }
        }
    }
}

fn respond(status: StatusCode, markup: Markup) -> Response {
    (status, [(http::header::CONTENT_TYPE, "text/html; charset=utf-8")], markup.into_string()).into_response()
}

fn notices(notice: &Notice) -> Markup {
    html! {
        @if let Some(error) = &notice.error { p.notice.error role="alert" { (error) } }
        @if notice.done.is_some() { p.notice { "Done." } }
    }
}

pub(super) fn refusal(who: &Authority, csrf: &str, status: StatusCode, message: &str) -> Response {
    respond(status, page("Refused", nav(who, csrf), html! { h1 { (status.as_u16()) } p { (message) } }))
}

/// The sign-in page; `provider`: where sign-in through the identity provider starts, if on.
pub(super) fn sign_in(csrf: &str, error: Option<&str>, signed_out: bool, provider: Option<&str>) -> Response {
    let body = html! {
        h1 { "Sign in" }
        @if let Some(error) = error { p.notice.error role="alert" id="sign-in-error" { (error) } }
        @if signed_out { p.notice { "You are signed out." } }
        // A link, not a form: `form-action 'self'` would stop a form whose answer leads to
        // the provider's site.
        @if let Some(start) = provider {
            p { a.button href=(start) id="sign-in-provider" { "Sign in with your identity provider" } }
            h2 { "Or paste a token (development)" }
        }
        p.muted {
            "Paste a bearer token of this gateway's issuer: one that " code { "scopegate serve --demo" } " printed, or one your identity provider issued to an owner, an auditor or a platform administrator."
        }
        form.inline method="post" action="/console/session" {
            input type="hidden" name="csrf" value=(csrf);
            label { "Bearer token" textarea name="token" id="token" required rows="4" cols="80" {} }
            button type="submit" id="sign-in" { "Sign in" }
        }
    };
    respond(StatusCode::OK, page("Sign in", html! { header { strong { "scopegate console" } } }, body))
}

/// After a sign-in through the provider: on to `to` from a page of the gateway's own, so the
/// browser sends the session's `SameSite=Strict` cookie (on a redirect in a navigation that a
/// page of the provider started, it would not).
pub(super) fn signed_in(to: &str) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="refresh" content={ "0; url=" (to) };
                title { "Signed in · scopegate" }
                link rel="stylesheet" href="/console/assets/console.css";
            }
            body { main { p { "Signed in. " a href=(to) id="continue" { "Continue to the console" } } } }
        }
    };
    respond(StatusCode::OK, markup)
}

/// A tenant's sign-in page when it trusts several providers with a console client: one link
/// each.
pub(super) fn choose_provider(tenant: &str, links: &[(String, String)]) -> Response {
    let body = html! {
        h1 { "Sign in to " (tenant) }
        p { "Choose your identity provider:" }
        ul id="providers" {
            @for (issuer, href) in links { li { a href=(href) { (issuer) } } }
        }
    };
    respond(StatusCode::OK, page("Sign in", html! { header { strong { "scopegate console" } } }, body))
}

fn hidden(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf); }
}

fn role_options() -> Markup {
    html! { @for role in Role::ALL { option value=(role.as_str()) { (role.as_str()) } } }
}

pub(super) fn tenants(who: &Authority, csrf: &str, list: &[Value], notice: &Notice) -> Response {
    let body = html! {
        h1 { "Tenants" }
        (notices(notice))
        table {
            thead { tr { th { "Slug" } th { "Name" } th { "Status" } th { "Created" } th {} } }
            tbody {
                @for t in list {
                    tr {
                        td { a href={ "/console/tenants/" (text(&t["slug"])) } { (text(&t["slug"])) } }
                        td { (text(&t["name"])) }
                        td { (text(&t["status"])) }
                        td { (when(&t["created_at"])) }
                        td { a href={ "/console/tenants/" (text(&t["slug"])) "/audit" } { "audit trail" } }
                    }
                }
            }
        }
        h2 { "New tenant" }
        form.inline method="post" action="/console/tenants" {
            (hidden(csrf))
            label { "Slug" input name="slug" required pattern="[a-z0-9][a-z0-9-]*"; }
            label { "Name" input name="name" required; }
            button type="submit" { "Create tenant" }
        }
    };
    respond(StatusCode::OK, page("Tenants", nav(who, csrf), body))
}

/// What the tenant page lists.
pub(super) struct TenantLists<'a> {
    pub users: &'a [Value],
    pub servers: &'a [ServerStatus],
    pub grants: &'a [Value],
    pub issuers: &'a [Value],
}

/// A value that may be absent, or what its absence means.
fn or_else(v: &Value, absent: &str) -> Markup {
    html! {
        @if v.is_null() { span.muted { (absent) } } @else { (text(v)) }
    }
}

/// The identity providers a tenant trusts; with a distrust button each when `base` (the
/// tenant page's path) is given.
fn issuers_table(issuers: &[Value], csrf: &str, base: Option<&str>) -> Markup {
    html! {
        table id="issuers" {
            thead { tr { th { "Issuer" } th { "Key set" } th { "Audience" } th { "Subject claim" } th { "Tenant claim" } th { "Console sign-in" } th { "Trusted since" } @if base.is_some() { th {} } } }
            tbody {
                @for i in issuers {
                    tr {
                        td.mono { (text(&i["issuer"])) }
                        td.mono { (or_else(&i["jwks_url"], "discovered")) }
                        td.mono { (or_else(&i["audience"], "the gateway's")) }
                        td.mono { (text(&i["subject_claim"])) }
                        td.mono { (or_else(&i["tenant_claim"], "none")) }
                        td.console-signin {
                            @if let Some(path) = i["console_signin"].as_str() {
                                a href=(path) { (path) }
                                " " span.muted { "client " (text(&i["console_client_id"])) }
                            } @else { span.muted { "off" } }
                        }
                        td { (when(&i["created_at"])) }
                        @if let Some(base) = base {
                            td {
                                form method="post" action={ (base) "/issuers/distrust" } {
                                    (hidden(csrf))
                                    input type="hidden" name="issuer" value=(text(&i["issuer"]));
                                    button.quiet type="submit" { "Distrust" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub(super) fn tenant(
    who: &Authority,
    csrf: &str,
    tenant: &Value,
    lists: &TenantLists<'_>,
    notice: &Notice,
) -> Response {
    let TenantLists { users, servers, grants, issuers } = *lists;
    let slug = text(&tenant["slug"]);
    let base = format!("/console/tenants/{slug}");
    // A retired tenant changes no more: no forms but the purge.
    let retired = tenant["status"] == "retired";
    let body = html! {
        h1 { (text(&tenant["name"])) " " span.muted { "(" (slug) ", " (text(&tenant["status"])) ")" } }
        (notices(notice))
        h2 { "Users" }
        table id="users" {
            thead { tr { th { "Subject" } th { "Name" } th { "Roles" } th { "Status" } th {} } }
            tbody {
                @for u in users {
                    @let subject = text(&u["subject"]);
                    @let active = u["status"] == "active";
                    tr {
                        td.mono { (subject) }
                        td { (text(&u["display_name"])) }
                        td { (text(&u["roles"])) }
                        td { (text(&u["status"])) }
                        td {
                            form method="post" action={ (base) "/users/" (percent(&subject)) "/status" } {
                                (hidden(csrf))
                                input type="hidden" name="status" value=(if active { "disabled" } else { "active" });
                                button.quiet type="submit" { (if active { "Disable" } else { "Enable" }) }
                            }
                        }
                    }
                }
            }
        }
        @if !retired {
            form.inline id="new-user" method="post" action={ (base) "/users" } {
                (hidden(csrf))
                label { "Subject" input name="subject" id="user-subject" required; }
                label { "Name" input name="display_name" id="user-name" required; }
                label { "Role" select name="role" id="user-role" { (role_options()) } }
                button type="submit" id="add-user" { "Add user" }
            }
        }
        h2 { "Upstream servers" }
        p.muted { "What each pinned server lists is held until approved: " a href={ (base) "/definitions" } id="definitions-link" { "upstream definitions" } "." }
        table id="bindings" {
            thead { tr { th { "Server" } th { "Executor" } th { "Definitions" } th { "Revision" } th { "Tools" } th { "Last error" } th { "Last used" } } }
            tbody {
                @for b in servers {
                    @if b.connections.is_empty() {
                        tr { td.mono { (b.server) } td { (b.executor) } td.pin { (b.pin) } td.muted colspan="4" { "not connected on this replica" } }
                    }
                    @for c in &b.connections {
                        tr {
                            td.mono { (b.server) }
                            td { (b.executor) }
                            td.pin { (b.pin) }
                            td { (c.revision.clone().unwrap_or_default()) }
                            td { (c.tools.map(|t| t.to_string()).unwrap_or_default()) }
                            td { @if let Some(e) = &c.last_error { strong { (c.last_error_class.as_deref().unwrap_or("")) } ": " (e) " " span.muted { (when(&Value::from(c.last_error_at.unwrap_or(0)))) } } }
                            td { (when(&Value::from(c.last_used))) }
                        }
                    }
                }
            }
        }
        @if !retired {
            form.inline method="post" action={ (base) "/bindings" } {
                (hidden(csrf))
                label { "Server id" input name="server" id="binding-server" required; }
                label { "Executor" input name="executor" id="binding-executor" required value="local"; }
                label { "Definitions" select name="pin" id="binding-pin" {
                    option value="" { "keep (new: trust first use)" }
                    option value="approve" { "approve each" }
                    option value="trust_first_use" { "trust first use" }
                    option value="follow" { "follow (unsafe: not pinned)" }
                } }
                button type="submit" id="bind-server" { "Bind server" }
            }
        }
        h2 { "Grants" }
        table id="grants" {
            thead { tr { th { "Server" } th { "Role" } th { "Kind" } th { "Name" } th { "Confirmed by" } th {} } }
            tbody {
                @for g in grants {
                    tr {
                        td.mono { (text(&g["server"])) }
                        td { (text(&g["role"])) }
                        td { (text(&g["kind"])) }
                        td.mono { (text(&g["name"])) }
                        td.confirm { (text(&g["confirm"])) }
                        td {
                            form method="post" action={ (base) "/grants/" (text(&g["id"])) "/revoke" } {
                                (hidden(csrf))
                                button.quiet type="submit" { "Revoke" }
                            }
                        }
                    }
                }
            }
        }
        @if !retired {
            form.inline id="new-grant" method="post" action={ (base) "/grants" } {
                (hidden(csrf))
                label { "Server" select name="server" id="grant-server" { @for b in servers { option value=(b.server) { (b.server) } } } }
                label { "Role" select name="role" id="grant-role" { (role_options()) } }
                label { "Kind" select name="kind" { @for k in ["tool", "prompt", "resource"] { option value=(k) { (k) } } } }
                label { "Name" input name="name" id="grant-name" required placeholder="tool name, URI or *"; }
                label { "Each call confirmed by" select name="confirm" id="grant-confirm" {
                    option value="" { "nobody" }
                    option value="caller" { "the caller" }
                    option value="approver" { "an approver" }
                } }
                button type="submit" id="add-grant" { "Grant" }
            }
        }
        h2 { "Identity providers" }
        p.muted { "Besides the gateway's own issuer, tokens of these providers sign this tenant's users in." }
        (issuers_table(issuers, csrf, (!retired).then_some(base.as_str())))
        @if !retired {
            form.inline id="new-issuer" method="post" action={ (base) "/issuers" } {
                (hidden(csrf))
                label { "Issuer" input name="issuer" id="issuer-url" required type="url" placeholder="https://login.example.com/…"; }
                label { "Key set URL" input name="jwks_url" id="issuer-jwks" type="url" placeholder="discovered"; }
                label { "Audience" input name="audience" id="issuer-audience" placeholder="the gateway's"; }
                label { "Subject claim" input name="subject_claim" id="issuer-subject" placeholder="sub"; }
                label { "Tenant claim" input name="tenant_claim" id="issuer-tenant-claim" placeholder="none"; }
                label { "Console client id" input name="console_client_id" id="issuer-console-client" placeholder="no console sign-in"; }
                label { "Console scopes" input name="console_scopes" id="issuer-console-scopes" placeholder="openid"; }
                button type="submit" id="trust-issuer" { "Trust issuer" }
            }
        }
        @if matches!(who, Authority::Platform { .. }) {
            h2 { "Organization at the identity provider" }
            p { "A token whose tenant claim holds this id names this tenant (with " code { "auth.tenant_match = \"org_id\"" } "). An id belongs to one tenant at most; empty clears it." }
            @if retired {
                p id="org-id" { (text(&tenant["org_id"])) }
            } @else {
                form.inline id="org-id" method="post" action={ (base) "/org-id" } {
                    (hidden(csrf))
                    label { "Organization id" input name="org_id" id="tenant-org-id" value=(tenant["org_id"].as_str().unwrap_or_default()) placeholder="none"; }
                    button type="submit" id="set-org-id" { "Save" }
                }
            }
            h2 { "Audit order" }
            p { "Off (the default), each forwarded call's record is committed while the upstream works, and the answer waits for both. On, the record is committed before the upstream sees the call: no side effect without a record, and each call waits for the commit, then for the upstream." }
            @if retired {
                p id="write-ahead" { (if tenant["audit_write_ahead"] == true { "Write-ahead" } else { "While the upstream works" }) }
            } @else {
                form.inline id="write-ahead" method="post" action={ (base) "/write-ahead" } {
                    (hidden(csrf))
                    label { "Record before forwarding"
                        select name="audit_write_ahead" id="tenant-write-ahead" {
                            option value="false" selected[tenant["audit_write_ahead"] != true] { "off: while the upstream works" }
                            option value="true" selected[tenant["audit_write_ahead"] == true] { "on: write-ahead" }
                        }
                    }
                    button type="submit" id="set-write-ahead" { "Save" }
                }
            }
            h2 { "Retirement" }
            @if retired {
                p { "Retired " (when(&tenant["retired_at"])) ". Its audit trail stays; purging removes its users, flocks, servers, grants and credentials, and keeps the trail." }
                form.inline method="post" action={ (base) "/purge" } {
                    (hidden(csrf))
                    button type="submit" id="purge-tenant" { "Purge its data" }
                }
            } @else {
                p { "A retired tenant is suspended for good: no token of it is accepted, nothing of it changes but a purge of its data. Its audit trail stays." }
                form.inline method="post" action={ (base) "/retire" } {
                    (hidden(csrf))
                    button type="submit" id="retire-tenant" { "Retire tenant" }
                }
            }
        }
    };
    respond(StatusCode::OK, page(&slug, nav(who, csrf), body))
}

fn percent(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// What the audit page's filter form holds.
pub(super) struct Filter {
    pub user: String,
    pub tool: String,
    pub outcome: String,
    pub since: String,
    pub until: String,
}

pub(super) fn audit(
    who: &Authority,
    csrf: &str,
    slug: &str,
    status: &ChainStatus,
    events: &Page,
    issuers: &[Value],
    filter: &Filter,
) -> Response {
    let base = format!("/console/tenants/{slug}/audit");
    let next = events.next.as_ref().map(|next| {
        format!(
            "{base}?user={}&tool={}&outcome={}&since={}&until={}&after={next}",
            percent(&filter.user),
            percent(&filter.tool),
            percent(&filter.outcome),
            percent(&filter.since),
            percent(&filter.until)
        )
    });
    let body = html! {
        h1 { "Audit trail of " (slug) }
        p id="chain" {
            @if status.verified {
                span.badge.verified id="chain-status" { "Chain verified" }
                " " (status.events) " events, every hash and link recomputed."
            } @else {
                span.badge.broken id="chain-status" { "Chain BROKEN" }
                @if let Some(b) = &status.broken { " at seq " (b.seq) ": " (b.reason) }
                @for p in &status.checkpoint_problems { br; (p) }
            }
        }
        @if !status.outcome_unknown.is_empty() {
            div id="outcome-unknown" {
                span.badge.broken { "Outcome unknown" }
                " " (status.outcome_unknown.len()) " call(s) have a record and no outcome: the gateway stopped while they ran (or they run now). What they did is not recorded. The newest:"
                ul {
                    @for u in status.outcome_unknown.iter().rev().take(20) {
                        li { "seq " (u.seq) ", " code { (u.tool.clone().unwrap_or_default()) } ", " (when(&Value::from(u.occurred_at))) }
                    }
                }
            }
        }
        p id="checkpoint" {
            @match &status.checkpoint {
                Some(c) => {
                    "Latest checkpoint: seq " (c.seq) ", signed " (when(&Value::from(c.at))) " with key " code { (c.key_id) } ", hash " code { (c.hash) }
                }
                None => { span.muted { "No signed checkpoint of this tenant is readable here (audit.checkpoint_sink must be a file this gateway reads)." } }
            }
        }
        p {
            "Export: " a href={ (base) "/export?format=jsonl" } { "JSON lines" } " · " a href={ (base) "/export?format=csv" } { "CSV" }
            span.muted { " (each row carries its hash and link; check an export with " code { "scopegate audit verify-export" } ")" }
        }
        form.inline method="get" action=(base) {
            label { "User" input name="user" value=(filter.user); }
            label { "Tool" input name="tool" value=(filter.tool); }
            label { "Outcome" select name="outcome" {
                option value="" selected[filter.outcome.is_empty()] { "any" }
                @for o in ["ok", "denied", "failed", "unknown"] { option value=(o) selected[filter.outcome == o] { (o) } }
            } }
            label { "Since (UTC)" input type="datetime-local" name="since" value=(filter.since); }
            label { "Until (UTC)" input type="datetime-local" name="until" value=(filter.until); }
            button type="submit" { "Filter" }
        }
        table id="events" {
            thead { tr { th { "Seq" } th { "When" } th { "User" } th { "Action" } th { "Tool / resource" } th { "Outcome" } th { "Hash" } } }
            tbody {
                @for e in &events.items {
                    tr {
                        td { (text(&e["seq"])) }
                        td { (when(&e["occurred_at"])) }
                        td.mono { (text(&e["user"])) @if let Some(actor) = e["actor"].as_str() { br; span.muted { (actor) } } }
                        td { (text(&e["action"])) }
                        td.mono { (text(&e["tool"])) }
                        td {
                            @if e["outcome"] == "unknown" { strong.unknown { "outcome unknown" } } @else { (text(&e["outcome"])) }
                            @if let Some(c) = e["error_class"].as_str() { " (" (c) ")" }
                        }
                        td.mono { (text(&e["hash"]).get(..16).unwrap_or_default()) "…" }
                    }
                }
            }
        }
        @if let Some(next) = next { nav.pages { a href=(next) { "Older events →" } } }
        @if slug != crate::store::admin::PLATFORM_SLUG {
            h2 { "Identity providers" }
            p.muted { "Besides the gateway's own issuer, tokens of these providers sign this tenant's users in." }
            (issuers_table(issuers, csrf, None))
        }
    };
    respond(StatusCode::OK, page("Audit trail", nav(who, csrf), body))
}

pub(super) fn executors(who: &Authority, csrf: &str, list: &[ExecutorStatus], sessions: &[SessionCount]) -> Response {
    let body = html! {
        h1 { "Executors" }
        table id="executors" {
            thead { tr { th { "Name" } th { "Kind" } th { "Connected" } th { "Replica" } th { "Last heartbeat" } th { "Reconnects" } } }
            tbody {
                @for x in list {
                    tr {
                        td.mono { (x.name) }
                        td { (x.kind) }
                        td { (if x.connected { "yes" } else { "no" }) @if x.here { span.muted { " (here)" } } }
                        td.mono { (x.replica.clone().unwrap_or_default()) }
                        td { @if let Some(at) = x.last_heartbeat { (when(&Value::from(at))) } }
                        td { (x.reconnects) }
                    }
                }
            }
        }
        h2 { "Sessions" }
        p.muted { "Live MCP sessions on the replica that served this page." }
        table id="sessions" {
            thead { tr { th { "Tenant" } th { "Sessions" } } }
            tbody { @for c in sessions { tr { td { (c.tenant) } td { (c.sessions) } } } }
        }
    };
    respond(StatusCode::OK, page("Executors", nav(who, csrf), body))
}

/// One function on a finding's path, with where it calls the next.
fn step(step: &Value) -> Markup {
    html! {
        li {
            code { (text(&step["function"])) }
            @if let Some(at) = step["at"].as_array() { " " span.muted { (text(&at[0])) ":" (text(&at[1])) } }
        }
    }
}

/// The compiled walk's report (`guards/report.schema.json`), for the auditor.
pub(super) fn guards(who: &Authority, csrf: &str, report: &Value) -> Response {
    let empty = Vec::new();
    let list = |key: &str| report[key].as_array().unwrap_or(&empty).clone();
    let findings = list("findings");
    let walked = report["walk"] == "compiled";
    let body = html! {
        h1 { "Guard report" }
        p.muted {
            "What the compiled walk found when rustc compiled this binary's library: every path from a \
             tool it serves to a forbidden type or call (" code { "scopegate guards report" } " prints the same)."
        }
        @if !walked {
            p.error id="not-run" { "Not run: " (text(&report["residue"][0]["detail"])) }
        } @else {
            p id="walked" {
                "Walked " (text(&report["ir"]["functions"])) " functions of " code { (text(&report["crate_name"])) }
                " from " (list("roots").len()) " roots."
            }
        }
        h2 { "Guards" }
        table id="guard-rows" {
            thead { tr { th { "Id" } th { "Guard" } th { "Forbids" } th { "Enforced by" } th { "Status" } th { "Residue" } } }
            tbody {
                @for row in list("guard_rows") {
                    tr {
                        td { (text(&row["id"])) }
                        td { (text(&row["title"])) }
                        td { (text(&row["forbids"])) }
                        td { (text(&row["enforced_by"])) }
                        td { (text(&row["status"])) }
                        td { ul { @for r in row["residue"].as_array().unwrap_or(&empty) { li { (text(r)) } } } }
                    }
                }
            }
        }
        h2 { "Findings" }
        @if findings.is_empty() {
            p id="findings" { @if walked { "None: the build would have failed on any." } @else { "None seen: the walk did not run." } }
        } @else {
            ul id="findings" {
                @for f in &findings {
                    li {
                        strong { (text(&f["guard_row"])) } " " code { (text(&f["root"])) } " reaches " code { (text(&f["item"])) }
                        ": " (text(&f["reason"]))
                        ol.path { @for s in f["path"].as_array().unwrap_or(&empty) { (step(s)) } }
                    }
                }
            }
        }
        h2 { "Roots: what the walk starts from" }
        table id="roots" {
            thead { tr { th { "Function" } th { "Why" } th { "Functions reached" } } }
            tbody {
                @for r in list("roots") {
                    tr { td { code { (text(&r["function"])) } } td { (text(&r["why"])) } td { (text(&r["reached"])) } }
                }
            }
        }
        h2 { "Residue: what the walk can't see" }
        dl id="residue" {
            @for r in list("residue") {
                dt { (text(&r["class"])) }
                dd {
                    (text(&r["detail"]))
                    @if let Some(items) = r["items"].as_array().filter(|i| !i.is_empty()) {
                        details { summary { (items.len()) " on this walk" } ul { @for i in items { li { code { (text(i)) } } } } }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page("Guard report", nav(who, csrf), body))
}

/// What the policies page shows besides the stored policies: a draft the validator refused
/// (with its problems) or one to edit, and the answer of a try-it check.
pub(super) struct PolicyDraft {
    pub id: String,
    pub text: String,
    pub mode: String,
    pub problems: Vec<crate::policy::Problem>,
}

pub(super) struct Tried {
    pub user: String,
    pub tool: String,
    pub arguments: String,
    pub client: String,
    /// The answer, or why there is none.
    pub answer: Option<Result<Value, String>>,
}

/// A policy's text with its lines numbered, each problem under the line it is on.
fn numbered(text: &str, problems: &[crate::policy::Problem]) -> Markup {
    html! {
        ol.policy-lines id="policy-lines" {
            @for (n, line) in text.lines().enumerate() {
                @let here: Vec<&crate::policy::Problem> = problems.iter().filter(|p| p.line == Some(n + 1)).collect();
                li.error-line[!here.is_empty()] {
                    code { (line) }
                    @for p in &here {
                        span.problem { " ← column " (p.column.unwrap_or(0)) ": " (p.message) }
                    }
                }
            }
        }
    }
}

/// What the policies page shows of one tenant.
pub(super) struct PoliciesView<'a> {
    pub slug: &'a str,
    pub list: &'a [Value],
    pub mode: &'a str,
    pub draft: Option<&'a PolicyDraft>,
    pub tried: &'a Tried,
}

pub(super) fn policies(who: &Authority, csrf: &str, view: &PoliciesView<'_>, notice: &Notice) -> Response {
    let PoliciesView { slug, list, mode, draft, tried } = *view;
    let base = format!("/console/tenants/{slug}/policies");
    let refused = draft.is_some_and(|d| !d.problems.is_empty());
    let mode_option = |value: &str, chosen: &str| html! { option value=(value) selected[value == chosen] { (value) } };
    let body = html! {
        h1 { "Policies " span.muted { "(" (slug) ")" } }
        (notices(notice))
        p.muted { "Cedar policies over the caller, the tool and its arguments. Grants are permits; a forbid wins; a refused call answers as an unknown tool." }
        form.inline id="policy-mode" method="post" action={ "/console/tenants/" (slug) "/policy-mode" } {
            (hidden(csrf))
            label { "Mode of the tenant's policies" select name="mode" id="tenant-policy-mode" { (mode_option("enforce", mode)) (mode_option("log_only", mode)) } }
            button type="submit" id="set-policy-mode" { "Save" }
        }
        table id="policies" {
            thead { tr { th { "Id" } th { "Mode" } th { "Valid" } th { "Text" } th {} } }
            tbody {
                @for p in list {
                    @let id = text(&p["id"]);
                    @let valid = p["valid"] == true;
                    tr {
                        td.mono { (id) }
                        td { (text(&p["mode"])) }
                        td {
                            @if valid { "yes" } @else {
                                "no: "
                                @for problem in p["problems"].as_array().into_iter().flatten() {
                                    span.problem { (text(&problem["message"])) " " }
                                }
                            }
                        }
                        td { pre.mono { (text(&p["text"])) } }
                        td {
                            a href={ (base) "?edit=" (percent(&id)) } { "Edit" }
                            form method="post" action={ (base) "/" (percent(&id)) "/delete" } {
                                (hidden(csrf))
                                button.quiet type="submit" { "Delete" }
                            }
                        }
                    }
                }
            }
        }
        h2 { @if draft.is_some() && !refused { "Edit policy" } @else { "Write a policy" } }
        @if let Some(d) = draft.filter(|d| !d.problems.is_empty()) {
            div.notice.error role="alert" id="policy-errors" {
                p { "The policy does not validate; nothing was saved." }
                ul {
                    @for p in &d.problems {
                        li { "line " (p.line.map_or("?".to_owned(), |l| l.to_string())) ", column " (p.column.map_or("?".to_owned(), |c| c.to_string())) ": " (p.message) }
                    }
                }
                (numbered(&d.text, &d.problems))
            }
        }
        form id="policy-form" method="post" action=(base) {
            (hidden(csrf))
            label { "Id" input name="id" id="policy-id" required value=(draft.map(|d| d.id.as_str()).unwrap_or_default()); }
            label { "Mode" select name="mode" id="policy-mode-choice" { (mode_option("enforce", draft.map_or("enforce", |d| d.mode.as_str()))) (mode_option("log_only", draft.map_or("enforce", |d| d.mode.as_str()))) } }
            label { "Cedar" textarea name="text" id="policy-text" rows="8" cols="90" required { (draft.map(|d| d.text.as_str()).unwrap_or_default()) } }
            button type="submit" id="save-policy" { "Save policy" }
        }
        h2 { "Try it" }
        p.muted { "The decision a call would get, and the policies that would take it. Nothing is called." }
        form.inline id="try-it" method="get" action=(base) {
            label { "User" input name="user" id="try-user" required value=(tried.user); }
            label { "Tool" input name="tool" id="try-tool" required value=(tried.tool); }
            label { "Arguments (JSON)" input name="arguments" id="try-arguments" value=(tried.arguments) placeholder="{}"; }
            label { "Client" input name="client" id="try-client" value=(tried.client) placeholder="none"; }
            button type="submit" id="try-policies" { "Check" }
        }
        @match &tried.answer {
            Some(Ok(answer)) => p id="check-result" {
                strong { (text(&answer["decision"])) } " (" (text(&answer["reason"])) ")"
                @if answer["policies"].as_array().is_some_and(|p| !p.is_empty()) { " by " span.mono { (text(&answer["policies"])) } }
                @if let Some(detail) = answer["detail"].as_str() { ": " (detail) }
                @if answer["log_only"].is_object() { " · log-only: " (text(&answer["log_only"]["decision"])) " by " (text(&answer["log_only"]["policies"])) }
            },
            Some(Err(why)) => p.notice.error id="check-result" role="alert" { (why) },
            None => {},
        }
    };
    let status = if refused { StatusCode::UNPROCESSABLE_ENTITY } else { StatusCode::OK };
    respond(status, page(&format!("{slug} policies"), nav(who, csrf), body))
}

/// What shows in place of a character of an upstream's text that would hide or reorder what
/// is read: C0 and C1 controls (tab and line feed excepted) as their control pictures (`␇`,
/// `␛`) or code points, bidirectional controls and invisible characters as their code points.
fn mark_of(c: char) -> Option<String> {
    match c {
        '\t' | '\n' => None,
        '\u{0}'..='\u{1f}' => char::from_u32(0x2400 + u32::from(c)).map(String::from),
        '\u{7f}' => Some("\u{2421}".to_owned()),
        '\u{80}'..='\u{9f}'
        | '\u{61c}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{2069}'
        | '\u{feff}' => Some(format!("U+{:04X}", u32::from(c))),
        _ => None,
    }
}

enum Piece<'a> {
    Text(&'a str),
    Mark(String, u32),
}

/// Text an upstream wrote, escaped like any value, each character [`mark_of`] names shown as
/// its mark in a `span.ctl` (titled with its code point) instead.
fn visible(text: &str) -> Markup {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if let Some(mark) = mark_of(c) {
            if start < i {
                pieces.push(Piece::Text(&text[start..i]));
            }
            pieces.push(Piece::Mark(mark, u32::from(c)));
            start = i + c.len_utf8();
        }
    }
    if start < text.len() {
        pieces.push(Piece::Text(&text[start..]));
    }
    html! {
        @for piece in &pieces {
            @match piece {
                Piece::Text(text) => (text),
                Piece::Mark(mark, code) => span.ctl title=(format!("U+{code:04X}")) { (mark) },
            }
        }
    }
}

/// A JSON value of an upstream's, pretty-printed, in a box of its own.
fn json_box(value: &Value, class: &str) -> Markup {
    let pretty = serde_json::to_string_pretty(value).unwrap_or_default();
    html! { pre class={ "upstream json " (class) } { (visible(&pretty)) } }
}

/// A held definition the definitions page shows whole: its detail (with the approved one and
/// the diff), or why its stored text does not read.
pub(super) struct HeldDefinition {
    pub view: DefinitionView,
    pub detail: Result<DefinitionDetail, String>,
}

/// What the definitions page shows of one tenant.
pub(super) struct DefinitionsView<'a> {
    pub slug: &'a str,
    /// Held definitions shown whole.
    pub held: &'a [HeldDefinition],
    /// Held definitions beyond those, only named.
    pub more: &'a [DefinitionView],
    /// The latest decided definitions.
    pub decided: &'a [DefinitionView],
    /// Whether the signed-in authority may approve and reject (an owner's, a platform
    /// administrator's); an auditor's reads only.
    pub can_decide: bool,
}

fn change_label(change: &str) -> &'static str {
    if change == "changed" { "changed" } else { "first sight" }
}

fn field_changes(fields: &[FieldChange]) -> Markup {
    let side = |v: &Option<Value>| match v {
        Some(v) => json_box(v, "field-value"),
        None => html! { span.muted { "absent" } },
    };
    html! {
        table.fields {
            thead { tr { th.path { "Path" } th { "Approved" } th { "Held" } } }
            tbody {
                @for f in fields {
                    tr.field {
                        td.mono.path { (visible(&f.path)) }
                        td.before { (side(&f.before)) }
                        td.after { (side(&f.after)) }
                    }
                }
            }
        }
    }
}

fn held_definition(h: &HeldDefinition, base: &str, csrf: &str, can_decide: bool) -> Markup {
    let v = &h.view;
    let action = |verb: &str| format!("{base}/{}/{verb}", percent(&v.id));
    html! {
        article.definition data-id=(v.id) data-state=(v.state.as_str()) {
            h3 {
                span.kind { (v.kind.as_str()) }
                code.server { (visible(&v.server)) } " · " code.name { (visible(&v.name)) } " "
                span.badge.change.changed[v.change == "changed"] { (change_label(&v.change)) }
            }
            dl.digests {
                dt { "Held digest" } dd.mono.digest { (v.digest) }
                dt { "Approved digest" }
                dd.mono.approved-digest { @if let Some(d) = &v.approved_digest { (d) } @else { span.muted { "none: nothing of this item is served" } } }
                dt { "First seen" } dd { (when(&Value::from(v.first_seen_at))) }
            }
            @if can_decide {
                div.decide {
                    form method="post" action=(action("approve")) {
                        (hidden(csrf))
                        button.approve type="submit" { "Approve and serve" }
                    }
                    form method="post" action=(action("reject")) {
                        (hidden(csrf))
                        button.reject type="submit" { "Reject" }
                    }
                }
            }
            @match &h.detail {
                Err(why) => p.notice.error { "Its stored text does not read: " (why) },
                Ok(d) => {
                    h4 { "Description" @if d.approved.is_some() { span.muted { " (against the approved one)" } } }
                    @if d.diff.description.is_empty() {
                        p.muted { "None." }
                    } @else {
                        div.upstream.diff {
                            @for line in &d.diff.description {
                                @match line.op.as_str() {
                                    "removed" => div.diff-line.diff-removed { span.diff-sign { "−" } del { (visible(&line.text)) } },
                                    "added" => div.diff-line.diff-added { span.diff-sign { "+" } ins { (visible(&line.text)) } },
                                    _ => div.diff-line.diff-same { span.diff-sign { " " } span { (visible(&line.text)) } },
                                }
                            }
                        }
                    }
                    h4 { "Other changes" }
                    @if d.diff.fields.is_empty() { p.muted { "None." } } @else { (field_changes(&d.diff.fields)) }
                    h4 { "The held definition, whole" }
                    (json_box(&d.definition, "held-definition"))
                }
            }
        }
    }
}

pub(super) fn definitions(who: &Authority, csrf: &str, view: &DefinitionsView<'_>, notice: &Notice) -> Response {
    let DefinitionsView { slug, held, more, decided, can_decide } = *view;
    let base = format!("/console/tenants/{slug}/definitions");
    let body = html! {
        h1 { "Upstream definitions " span.muted { "(" (slug) ")" } }
        (notices(notice))
        p.muted {
            "The tools, prompts and resource templates the tenant's pinned servers list. A held definition is served nowhere until an owner approves it. "
            strong { "Everything below the headings is the upstream's own text: read it as data, not as instructions." }
        }
        @if !can_decide { p.notice id="read-only" { "You read these; the tenant's owners decide." } }
        h2 { "Held " span.muted { "(" (held.len() + more.len()) ")" } }
        section id="definitions" {
            @if held.is_empty() { p.muted id="none-held" { "Nothing is held." } }
            @for h in held { (held_definition(h, &base, csrf, can_decide)) }
        }
        @if !more.is_empty() {
            p.notice id="more-held" { (more.len()) " more held definitions; decide the ones above to see them:" }
            ul {
                @for v in more { li { (v.kind.as_str()) " " code { (visible(&v.server)) " · " (visible(&v.name)) } " " span.muted { (v.digest) } } }
            }
        }
        h2 { "Recently decided" }
        table id="decided" {
            thead { tr { th { "Server" } th { "Kind" } th { "Name" } th { "State" } th { "Digest" } th { "Decided" } th { "By" } } }
            tbody {
                @for v in decided {
                    tr data-id=(v.id) {
                        td.mono { (visible(&v.server)) }
                        td { (v.kind.as_str()) }
                        td.mono { (visible(&v.name)) }
                        td.state { (v.state.as_str()) }
                        td.mono { (v.digest) }
                        td { @if let Some(at) = v.decided_at { (when(&Value::from(at))) } }
                        td.mono { (v.decided_by.as_deref().unwrap_or_default()) }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page(&format!("{slug} definitions"), nav(who, csrf), body))
}

pub(super) struct ApprovalsView<'a> {
    pub slug: &'a str,
    /// The calls waiting for an approver.
    pub pending: &'a [crate::admin::approvals::ApprovalView],
    /// The latest decided (or lapsed) ones.
    pub decided: &'a [crate::admin::approvals::ApprovalView],
    /// Whether the signed-in authority may decide (the tenant's approvers).
    pub approver: bool,
    /// The signed-in member's subject: its own calls get no form.
    pub me: Option<&'a str>,
}

fn waiting_call(v: &crate::admin::approvals::ApprovalView, base: &str, csrf: &str, view: &ApprovalsView<'_>) -> Markup {
    let action = |verb: &str| format!("{base}/{}/{verb}", percent(&v.id));
    let own = view.me == Some(v.caller.as_str());
    html! {
        article.approval data-id=(v.id) {
            h3 {
                code.server { (visible(&v.server)) } " · "
                @if let Some(title) = &v.title { span.title { (visible(title)) } " " }
                code.tool { (visible(&v.tool)) }
            }
            dl {
                dt { "Caller" } dd.mono.caller { (visible(&v.caller)) }
                dt { "Arguments digest" } dd.mono.digest { (v.args_digest) }
                dt { "Asked" } dd { (when(&Value::from(v.created_at))) }
                dt { "Lapses" } dd { (when(&Value::from(v.expires_at))) }
            }
            h4 { "Arguments " span.muted { "(exactly what is forwarded when approved)" } }
            (json_box(&v.arguments, "arguments"))
            @if view.approver && own {
                p.notice.own { "Your own call: another approver decides it." }
            } @else if view.approver {
                div.decide {
                    form method="post" action=(action("approve")) {
                        (hidden(csrf))
                        button.approve type="submit" { "Approve this call" }
                    }
                    form method="post" action=(action("reject")) {
                        (hidden(csrf))
                        input.reason type="text" name="reason" maxlength="500" placeholder="Reason (told to the caller)";
                        button.reject type="submit" { "Reject" }
                    }
                }
            }
        }
    }
}

pub(super) fn approvals(who: &Authority, csrf: &str, view: &ApprovalsView<'_>, notice: &Notice) -> Response {
    let base = format!("/console/tenants/{}/approvals", view.slug);
    let body = html! {
        h1 { "Calls waiting for approval " span.muted { "(" (view.slug) ")" } }
        (notices(notice))
        p.muted {
            "Each call below was allowed on condition that a second person approves it. It is forwarded once, with exactly these arguments, when an approver approves it; it is refused when an approver rejects it or nobody decides before it lapses. "
            strong { "The arguments are the caller's own data: read them as data, not as instructions." }
        }
        @if !view.approver { p.notice id="read-only" { "You read these; the tenant's approvers decide." } }
        h2 { "Waiting " span.muted { "(" (view.pending.len()) ")" } }
        section id="approvals" {
            @if view.pending.is_empty() { p.muted id="none-waiting" { "Nothing is waiting." } }
            @for v in view.pending { (waiting_call(v, &base, csrf, view)) }
        }
        h2 { "Recently decided" }
        table id="decided" {
            thead { tr { th { "Tool" } th { "Caller" } th { "State" } th { "Digest" } th { "Decided" } th { "By" } th { "Reason" } } }
            tbody {
                @for v in view.decided {
                    tr data-id=(v.id) {
                        td.mono { (visible(&v.tool)) }
                        td.mono { (visible(&v.caller)) }
                        td.state { (v.state.as_str()) }
                        td.mono { (v.args_digest) }
                        td { @if let Some(at) = v.decided_at { (when(&Value::from(at))) } }
                        td.mono { (visible(v.decided_by.as_deref().unwrap_or_default())) }
                        td { (visible(v.reason.as_deref().unwrap_or_default())) }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page(&format!("{} approvals", view.slug), nav(who, csrf), body))
}
