//! What a policy decision costs: a tenant with 200 policies over 500 tools (5 servers, each
//! tool with a 10-field argument record), one call's decision (median and p99), listing all 500
//! tools, and loading (parsing, validating, compiling) the set. Prints figures; asserts nothing.
//!
//! `cargo bench --bench policy` (ITERATIONS overrides the number of decisions timed).

use std::time::{Duration, Instant};

use scopegate::model::Role;
use scopegate::policy::engine::{Caller, Circumstances, Mode, Source, TenantPolicies};
use scopegate::policy::{Catalogue, ToolFacts, arguments};
use serde_json::{Value, json};

const SERVERS: usize = 5;
const TOOLS_PER_SERVER: usize = 100;

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "amount": {"type": "integer"},
            "limit": {"type": "integer"},
            "rate": {"type": "number"},
            "customer": {"type": "string"},
            "region": {"type": "string", "enum": ["eu", "us", "apac"]},
            "url": {"type": "string", "format": "uri"},
            "dry_run": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "note": {"type": ["string", "null"]},
            "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}},
        },
        "required": ["amount", "customer"],
    })
}

fn call_arguments() -> serde_json::Map<String, Value> {
    json!({
        "amount": 42, "limit": 10, "rate": 1.25, "customer": "acme-corp", "region": "eu",
        "url": "https://acme.example/a", "dry_run": false, "tags": ["a", "b"], "note": "hello",
        "address": {"city": "Lyon", "zip": "69001"},
    })
    .as_object()
    .unwrap()
    .clone()
}

fn catalogue() -> Catalogue {
    let schema = input_schema();
    let typed = arguments::arguments_type(schema.as_object().unwrap());
    let mut tools = Vec::new();
    let mut servers = std::collections::BTreeSet::new();
    for s in 0..SERVERS {
        let server = format!("srv{s}");
        servers.insert(server.clone());
        for t in 0..TOOLS_PER_SERVER {
            let name = format!("tool{t}");
            tools.push(ToolFacts {
                id: format!("{server}__{name}"),
                name,
                server: Some(server.clone()),
                title: None,
                hints: scopegate::policy::Hints { read_only: t % 3 == 0, ..Default::default() },
                arguments: typed.clone(),
                roles: None,
                digest: format!("sha256:{t}"),
            });
        }
    }
    Catalogue { tenant: "acme".into(), servers, tools, claims: Vec::new() }
}

/// 200 policies: permits and forbids on single tools reading the arguments, role-wide permits on
/// annotations, time windows.
fn policies() -> Vec<Source> {
    let mut out = Vec::new();
    let source = |id: String, text: String| Source { id, text, mode: Mode::Enforce };
    for i in 0..100 {
        let tool = format!("srv{}__tool{}", i % SERVERS, i);
        out.push(source(
            format!("permit-{i}"),
            format!(
                "permit (principal in Role::\"worker\", action == Action::\"{tool}\", resource) \
                 when {{ context.arguments.amount < {} && context.arguments has region && context.arguments.region == \"eu\" }};",
                100 + i
            ),
        ));
    }
    for i in 0..50 {
        let tool = format!("srv{}__tool{}", i % SERVERS, i + 20);
        out.push(source(
            format!("forbid-{i}"),
            format!(
                "forbid (principal, action == Action::\"{tool}\", resource) \
                 when {{ context.arguments.customer like \"*blocked*\" || (context.arguments has rate && context.arguments.rate.greaterThan(decimal(\"9.5\"))) }};"
            ),
        ));
    }
    for i in 0..30 {
        out.push(source(
            format!("read-only-{i}"),
            format!(
                "permit (principal in Role::\"auditor\", action in Action::\"call_tool\", resource in Server::\"srv{}\") \
                 when {{ resource.readOnlyHint }};",
                i % SERVERS
            ),
        ));
    }
    for i in 0..20 {
        out.push(source(
            format!("hours-{i}"),
            format!(
                "forbid (principal, action in Action::\"call_tool\", resource) \
                 when {{ resource.name == \"tool{}\" && context.time.toTime() >= duration(\"22h\") }};",
                i * 5
            ),
        ));
    }
    out
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]
}

fn main() {
    let iterations: usize = std::env::var("ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let catalogue = catalogue();
    let sources = policies();

    let mut loads = Vec::new();
    let mut loaded = None;
    for _ in 0..5 {
        let started = Instant::now();
        loaded = Some(TenantPolicies::load(&catalogue, Mode::Enforce, &sources, &[]).expect("the policies load"));
        loads.push(started.elapsed());
    }
    let set = loaded.unwrap();
    assert!(set.stale().is_empty(), "every policy validates: {:?}", set.stale());

    let roles = [Role::Worker];
    let caller = Caller { tenant: "acme", subject: "wanda@acme.test", roles: &roles, flocks: None, claims: &[] };
    let circumstances = Circumstances {
        revision: "2025-11-25",
        client: Some("bench"),
        stateless: false,
        now: time::OffsetDateTime::now_utc().replace_hour(12).unwrap(),
    };
    let arguments = call_arguments();
    // A tool that a permit and a forbid name, on server srv0.
    let tool = catalogue.tools.iter().find(|t| t.id == "srv0__tool20").unwrap();
    let first = Instant::now();
    let outcome = set.decide_call(&caller, tool, None, Some(&arguments), &circumstances);
    let cold = first.elapsed();
    assert!(outcome.decision.allow, "{outcome:?}");
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let outcome = set.decide_call(&caller, tool, None, Some(&arguments), &circumstances);
        samples.push(started.elapsed());
        std::hint::black_box(outcome);
    }
    let p50 = quantile(&mut samples, 0.50);
    let p99 = quantile(&mut samples, 0.99);

    // Listing: every tool, as a tools/list asks (the first listing narrows each tool's set).
    let list = || {
        let started = Instant::now();
        let listed = catalogue.tools.iter().filter(|t| set.decide_list(&caller, t, None, &circumstances)).count();
        (started.elapsed(), listed)
    };
    let (list_cold, listed) = list();
    let mut lists: Vec<Duration> = (0..20).map(|_| list().0).collect();

    println!("policy decisions: {} policies over {} tools, 10-field arguments", sources.len(), catalogue.tools.len());
    println!("  load (parse, validate, compile):  median {:?}", quantile(&mut loads, 0.5));
    println!("  call decision, first for its tool: {cold:?}");
    println!("  call decision ({iterations} timed):  median {p50:?}  p99 {p99:?}");
    println!(
        "  listing {} tools: first {list_cold:?}, then median {:?} ({listed} listed)",
        catalogue.tools.len(),
        quantile(&mut lists, 0.5)
    );
}
