//! The engine against hand-written policies: each protection seen deciding both ways.

use std::str::FromStr;

use serde_json::{Value, json};

use super::engine::{self, Mode, Reason, Source, TenantPolicies};
use super::*;
use crate::model::Role;

fn refund() -> ToolFacts {
    let schema = json!({
        "type": "object",
        "properties": {"amount": {"type": "integer"}, "customer": {"type": "string"}, "rate": {"type": "number"}},
        "required": ["amount"],
    });
    ToolFacts {
        id: "billing__refund".into(),
        name: "refund".into(),
        server: Some("billing".into()),
        title: None,
        hints: Hints::default(),
        arguments: arguments::arguments_type(schema.as_object().unwrap()),
        roles: None,
        digest: "sha256:refund".into(),
    }
}

fn lookup() -> ToolFacts {
    ToolFacts {
        id: "billing__lookup".into(),
        name: "lookup".into(),
        server: Some("billing".into()),
        title: Some("Look up".into()),
        hints: Hints { read_only: true, destructive: false, ..Hints::default() },
        arguments: Default::default(),
        roles: None,
        digest: "sha256:lookup".into(),
    }
}

fn catalogue() -> Catalogue {
    Catalogue {
        tenant: "acme".into(),
        servers: ["billing".to_owned()].into(),
        tools: vec![refund(), lookup()],
        claims: vec!["region".into()],
    }
}

fn sources(policies: &[(&str, &str)]) -> Vec<Source> {
    policies.iter().map(|(id, text)| Source { id: (*id).into(), text: (*text).into(), mode: Mode::Enforce }).collect()
}

fn load(mode: Mode, tenant: &[(&str, &str)], platform: &[(&str, &str)]) -> TenantPolicies {
    TenantPolicies::load(&catalogue(), mode, &sources(tenant), &sources(platform)).expect("the policies load")
}

const WORKER: &[Role] = &[Role::Worker];

fn caller(roles: &'static [Role]) -> Caller<'static> {
    Caller { tenant: "acme", subject: "wanda@acme.test", roles, flocks: None, claims: &[] }
}

fn at(hour: u8) -> Circumstances<'static> {
    let now = time::macros::datetime!(2026-12-07 00:00 UTC).replace_hour(hour).unwrap();
    Circumstances { revision: "2025-11-25", client: Some("claude"), stateless: false, now }
}

fn call(policies: &TenantPolicies, tool: &ToolFacts, base: Option<&str>, arguments: Value) -> Decision {
    policies.decide_call(&caller(WORKER), tool, base, arguments.as_object(), &at(12)).decision
}

const SMALL_REFUNDS: &str = r#"permit (principal in Role::"worker", action == Action::"billing__refund", resource)
when { context.arguments.amount < 100 };"#;

#[test]
fn a_permit_reads_the_arguments() {
    let policies = load(Mode::Enforce, &[("small-refunds", SMALL_REFUNDS)], &[]);
    let allowed = call(&policies, &refund(), None, json!({"amount": 99}));
    assert_eq!(
        (allowed.allow, allowed.by.as_slice(), &allowed.reason),
        (true, &["small-refunds".to_owned()][..], &Reason::Permit)
    );
    let refused = call(&policies, &refund(), None, json!({"amount": 100}));
    assert_eq!((refused.allow, &refused.reason), (false, &Reason::NoPermit), "default deny");
    let other_role =
        policies.decide_call(&caller(&[Role::Auditor]), &refund(), None, json!({"amount": 1}).as_object(), &at(12));
    assert!(!other_role.decision.allow, "the permit names workers");
    let bad = call(&policies, &refund(), None, json!({"amount": "5"}));
    assert_eq!(bad.reason.label(), "arguments_invalid", "a string is not an integer: refused, never coerced");
    // Arguments no policy reads are checked all the same.
    for unread in [json!({"amount": 1, "rate": 1.23456}), json!({"amount": 1, "customer": 7})] {
        assert_eq!(call(&policies, &refund(), None, unread.clone()).reason.label(), "arguments_invalid", "{unread}");
    }
    // An optional argument a forbid asks about is there when it is given.
    let no_notes =
        r#"forbid (principal, action == Action::"billing__refund", resource) when { context.arguments has customer };"#;
    let policies = load(Mode::Enforce, &[("small-refunds", SMALL_REFUNDS), ("no-customers", no_notes)], &[]);
    let refused = call(&policies, &refund(), None, json!({"amount": 1, "customer": "c"}));
    assert_eq!((refused.allow, refused.by.as_slice()), (false, &["no-customers".to_owned()][..]));
    let policies = load(Mode::Enforce, &[("small-refunds", SMALL_REFUNDS)], &[]);
    let grant = call(&policies, &refund(), Some("grant/g1"), json!({"amount": 500}));
    assert_eq!((grant.allow, grant.by.as_slice()), (true, &["grant/g1".to_owned()][..]), "a grant is a permit");
}

#[test]
fn forbid_wins_over_grants_and_permits() {
    let policies = load(
        Mode::Enforce,
        &[
            ("small-refunds", SMALL_REFUNDS),
            (
                "no-acme-corp",
                r#"forbid (principal, action == Action::"billing__refund", resource) when { context.arguments has customer && context.arguments.customer == "acme-corp" };"#,
            ),
        ],
        &[],
    );
    let refused = call(&policies, &refund(), Some("grant/g1"), json!({"amount": 5, "customer": "acme-corp"}));
    assert_eq!(
        (refused.allow, refused.by.as_slice(), &refused.reason),
        (false, &["no-acme-corp".to_owned()][..], &Reason::Forbid)
    );
    let allowed = call(&policies, &refund(), Some("grant/g1"), json!({"amount": 5, "customer": "other"}));
    assert!(allowed.allow);
    assert_eq!(allowed.by, ["small-refunds", "grant/g1"], "both permits are named");
}

#[test]
fn a_platform_forbid_beats_a_tenant_permit() {
    let platform = [(
        "no-unknown-clients",
        r#"forbid (principal, action in Action::"call_tool", resource) when { resource.destructiveHint && !(context has client) };"#,
    )];
    let policies = load(Mode::Enforce, &[("small-refunds", SMALL_REFUNDS)], &platform);
    let mut anonymous = at(12);
    anonymous.client = None;
    let refused = policies.decide_call(
        &caller(WORKER),
        &refund(),
        Some("grant/g1"),
        json!({"amount": 1}).as_object(),
        &anonymous,
    );
    assert_eq!(
        (refused.decision.allow, refused.decision.by.as_slice()),
        (false, &["platform/no-unknown-clients".to_owned()][..])
    );
    assert!(call(&policies, &refund(), None, json!({"amount": 1})).allow, "a named client passes");
    let read_only = policies.decide_call(&caller(WORKER), &lookup(), Some("grant/g2"), None, &anonymous);
    assert!(read_only.decision.allow, "lookup is not destructive");
}

#[test]
fn annotations_and_time_windows_are_conditions() {
    let policies = load(
        Mode::Enforce,
        &[
            (
                "auditors-read",
                r#"permit (principal in Role::"auditor", action in Action::"call_tool", resource) when { resource.readOnlyHint };"#,
            ),
            (
                "office-hours",
                r#"forbid (principal, action in Action::"call_tool", resource) when { resource.name like "ref*" && (context.time.toTime() < duration("8h") || context.time.toTime() >= duration("18h")) };"#,
            ),
        ],
        &[],
    );
    let auditor = caller(&[Role::Auditor]);
    assert!(policies.decide_call(&auditor, &lookup(), None, None, &at(12)).decision.allow);
    assert!(!policies.decide_call(&auditor, &refund(), None, json!({"amount": 1}).as_object(), &at(12)).decision.allow);
    let day =
        policies.decide_call(&caller(WORKER), &refund(), Some("grant/g"), json!({"amount": 1}).as_object(), &at(9));
    let night =
        policies.decide_call(&caller(WORKER), &refund(), Some("grant/g"), json!({"amount": 1}).as_object(), &at(19));
    assert!(day.decision.allow);
    assert_eq!((night.decision.allow, night.decision.by.as_slice()), (false, &["office-hours".to_owned()][..]));
}

#[test]
fn log_only_policies_are_evaluated_but_do_not_decide() {
    let forbid = [("no-refunds", r#"forbid (principal, action == Action::"billing__refund", resource);"#)];
    let policies = load(Mode::LogOnly, &forbid, &[]);
    let outcome =
        policies.decide_call(&caller(WORKER), &refund(), Some("grant/g1"), json!({"amount": 1}).as_object(), &at(12));
    assert!(outcome.decision.allow, "the grant decides");
    let shadow = outcome.log_only.expect("the tenant's own decision is kept");
    assert_eq!((shadow.allow, shadow.by.as_slice()), (false, &["no-refunds".to_owned()][..]));
    let enforced = load(Mode::Enforce, &forbid, &[]);
    assert!(!call(&enforced, &refund(), Some("grant/g1"), json!({"amount": 1})).allow);
    // One policy log-only in an enforcing tenant: it alone decides nothing.
    let mut one = sources(&[("small-refunds", SMALL_REFUNDS)]);
    one.extend(sources(&forbid).into_iter().map(|s| Source { mode: Mode::LogOnly, ..s }));
    let mixed = TenantPolicies::load(&catalogue(), Mode::Enforce, &one, &[]).unwrap();
    let outcome = mixed.decide_call(&caller(WORKER), &refund(), None, json!({"amount": 1}).as_object(), &at(12));
    assert_eq!((outcome.decision.allow, outcome.decision.by.as_slice()), (true, &["small-refunds".to_owned()][..]));
    assert_eq!(outcome.log_only.map(|d| d.allow), Some(false), "the log-only forbid would have refused");
}

#[test]
fn an_evaluation_error_refuses() {
    let overflow = r#"permit (principal, action == Action::"billing__refund", resource) when { context.arguments.amount * 1000 > 0 };"#;
    let policies = load(Mode::Enforce, &[("overflow", overflow)], &[]);
    assert!(call(&policies, &refund(), None, json!({"amount": 1})).allow);
    let refused = call(&policies, &refund(), Some("grant/g1"), json!({"amount": i64::MAX}));
    assert_eq!(
        (refused.allow, refused.reason.label(), refused.by.as_slice()),
        (false, "policy_error", &["overflow".to_owned()][..])
    );
}

#[test]
fn a_policy_that_no_longer_validates_fails_closed() {
    // Written when `refund` had a string `reason`; the tool no longer has it.
    let policy = r#"permit (principal in Role::"worker", action == Action::"billing__refund", resource) when { context.arguments.reason == "damaged" };"#;
    let policies = load(Mode::Enforce, &[("damaged", policy)], &[]);
    assert_eq!(policies.stale().keys().collect::<Vec<_>>(), ["damaged"]);
    let refused = call(&policies, &refund(), Some("grant/g1"), json!({"amount": 1, "reason": "damaged"}));
    assert_eq!((refused.allow, refused.by.as_slice()), (false, &["damaged".to_owned()][..]), "its scope is forbidden");
    assert!(call(&policies, &lookup(), Some("grant/g2"), json!({})).allow, "outside its scope nothing changes");
    // A forbid written when `amount` was a string compares it with a string: evaluated as it
    // is it would never hold again (a Long is no String), and the grant would allow every call.
    let forbid = r#"forbid (principal, action == Action::"billing__refund", resource) when { context.arguments.amount == "5" };"#;
    let policies = load(Mode::Enforce, &[("five", forbid)], &[]);
    assert_eq!(policies.stale().keys().collect::<Vec<_>>(), ["five"]);
    let refused = call(&policies, &refund(), Some("grant/g1"), json!({"amount": 5}));
    assert_eq!((refused.allow, refused.by.as_slice()), (false, &["five".to_owned()][..]), "never fails open");
}

#[test]
fn policies_that_cannot_be_loaded_refuse_everything() {
    let failed = TenantPolicies::failed("acme", "the policies could not be read".into());
    let refused = call(&failed, &lookup(), Some("grant/g1"), json!({}));
    assert_eq!((refused.allow, refused.reason.label()), (false, "policy_error"));
    assert!(!failed.decide_list(&caller(WORKER), &lookup(), Some("grant/g1"), &at(12)), "nothing listed");
    let item = engine::Item { action: engine::ItemAction::GetPrompt, server: "billing", name: "p" };
    assert!(!failed.decide_item(&caller(WORKER), &item, Some("grant/g1"), &at(12)).decision.allow);
    // A stored mode that does not read, and a stored policy that does not parse, fail the load.
    let row = |body: &str| crate::store::policies::PolicyRow {
        name: "p".into(),
        body: body.into(),
        digest: String::new(),
        mode: "enforce".into(),
        created_at: 0,
        updated_at: 0,
    };
    assert!(TenantPolicies::from_stored(&catalogue(), "sometimes", vec![row(SMALL_REFUNDS)], Vec::new()).is_err());
    assert!(TenantPolicies::from_stored(&catalogue(), "enforce", vec![row("permit (")], Vec::new()).is_err());
    assert!(TenantPolicies::from_stored(&catalogue(), "enforce", vec![row(SMALL_REFUNDS)], Vec::new()).is_ok());
}

#[test]
fn a_tool_is_listed_when_some_call_could_be_permitted() {
    let policies = load(
        Mode::Enforce,
        &[
            ("small-refunds", SMALL_REFUNDS),
            (
                "no-lookup-at-night",
                r#"forbid (principal, action == Action::"billing__lookup", resource) when { context.time.toTime() >= duration("18h") };"#,
            ),
        ],
        &[],
    );
    let w = caller(WORKER);
    assert!(policies.decide_list(&w, &refund(), None, &at(12)), "a permit over the arguments lists it");
    assert!(!policies.decide_list(&caller(&[Role::Auditor]), &refund(), None, &at(12)), "no permit for auditors");
    assert!(policies.decide_list(&w, &lookup(), Some("grant/g"), &at(12)));
    assert!(
        !policies.decide_list(&w, &lookup(), Some("grant/g"), &at(19)),
        "a forbid that holds whatever the arguments hides it"
    );
    let by_arguments = load(
        Mode::Enforce,
        &[(
            "no-big",
            r#"forbid (principal, action == Action::"billing__refund", resource) when { context.arguments.amount > 1000 };"#,
        )],
        &[],
    );
    assert!(
        by_arguments.decide_list(&w, &refund(), Some("grant/g"), &at(12)),
        "a forbid over the arguments may not hold"
    );
    assert!(!by_arguments.decide_list(&w, &refund(), None, &at(12)), "nothing permits");
}

#[test]
fn bad_policies_are_refused_with_line_and_column() {
    let schema = cedar_policy::Schema::from_json_value(model::schema_json(Some(&catalogue()), &[])).unwrap();
    let problems = |text: &str| match engine::parse("p", text) {
        Err(problems) => problems,
        Ok(policy) => engine::validate(&schema, Some(&catalogue()), &policy, text),
    };
    let syntax = problems("permit (principal, action, resource)\nwhen { context.arguments.amount < };");
    assert_eq!((syntax[0].line, syntax[0].column.is_some()), (Some(2), true), "{syntax:?}");
    let unknown_attribute = problems(
        "permit (principal, action == Action::\"billing__refund\", resource)\n  when { context.arguments.ammount < 5 };",
    );
    assert_eq!(unknown_attribute[0].line, Some(2), "{unknown_attribute:?}");
    assert!(unknown_attribute[0].message.contains("ammount"), "{unknown_attribute:?}");
    let wrong_type = problems(
        "permit (principal, action == Action::\"billing__refund\", resource) when { context.arguments has customer && context.arguments.customer < 5 };",
    );
    assert_eq!(wrong_type.len(), 1, "{wrong_type:?}");
    assert!(wrong_type[0].message.contains("expected Long but saw String"), "{wrong_type:?}");
    let no_action = problems("permit (principal, action == Action::\"billing__delete\", resource);");
    assert!(!no_action.is_empty(), "an action that does not exist");
    let other_server = problems("permit (principal, action, resource in Server::\"payroll\");");
    assert!(!other_server.is_empty(), "another tenant's server");
    let other_tenant = problems("permit (principal in Tenant::\"globex\", action, resource);");
    assert!(!other_tenant.is_empty(), "another tenant");
    let unknown_tool = problems("permit (principal, action, resource == Tool::\"billing__delete\");");
    assert_eq!(unknown_tool.len(), 1, "{unknown_tool:?}");
    assert_eq!(unknown_tool[0].line, Some(1));
    assert!(problems(SMALL_REFUNDS).is_empty());
    let two = engine::parse("p", &format!("{SMALL_REFUNDS}\n{SMALL_REFUNDS}"));
    assert!(two.is_err(), "one policy per id");
}

#[test]
fn grants_shown_as_cedar_decide_as_grants_do() {
    use crate::store::entities::{GrantKind, grant_matches};
    let schema = cedar_policy::Schema::from_json_value(model::schema_json(Some(&catalogue()), &[])).unwrap();
    for name in ["*", "refund", "lookup"] {
        let text = grant_text("billing", "worker", GrantKind::Tool, name, None);
        let policy = engine::parse("g", &text).unwrap_or_else(|e| panic!("{text}: {e:?}"));
        assert!(engine::validate(&schema, Some(&catalogue()), &policy, &text).is_empty(), "{text}");
        let policies = load(Mode::Enforce, &[("g", &text)], &[]);
        for tool in [refund(), lookup()] {
            let decided = call(&policies, &tool, None, json!({"amount": 1})).allow;
            assert_eq!(decided, grant_matches(GrantKind::Tool, name, &tool.name), "{text} for {}", tool.name);
        }
    }
    for (name, expected) in [
        (
            "*",
            "permit (principal in Role::\"worker\", action in [Action::\"read_resource\", Action::\"complete\"], resource is Resource in Server::\"billing\");",
        ),
        (
            "notes://a*b/*",
            "permit (principal in Role::\"worker\", action in [Action::\"read_resource\", Action::\"complete\"], resource is Resource in Server::\"billing\") when { resource.uri like \"notes://a\\*b/*\" };",
        ),
    ] {
        let text = grant_text("billing", "worker", GrantKind::Resource, name, None);
        assert_eq!(text, expected);
        let problems = engine::problems(&schema, Some(&catalogue()), "g", &text);
        assert!(problems.is_empty(), "{text}: {problems:?}");
    }
    for (kind, name) in [(GrantKind::Prompt, "*"), (GrantKind::Prompt, "summary"), (GrantKind::Resource, "notes://a")] {
        let text = grant_text("billing", "worker", kind, name, None);
        let problems = engine::problems(&schema, Some(&catalogue()), "g", &text);
        assert!(problems.is_empty(), "{text}: {problems:?}");
    }
}

#[test]
fn prompts_resources_and_completions_are_decided_like_tools() {
    use crate::store::entities::GrantKind;
    use engine::{Item, ItemAction};
    let grant = grant_text("billing", "worker", GrantKind::Resource, "notes://*", None);
    let prompts = grant_text("billing", "worker", GrantKind::Prompt, "*", None);
    let no_secrets = r#"forbid (principal, action in [Action::"read_resource", Action::"complete"], resource is Resource in Server::"billing")
when { resource.uri like "notes://secret/*" };"#;
    let auditors = r#"permit (principal in Role::"auditor", action == Action::"get_prompt", resource)
when { resource.name == "summary" };"#;
    let elsewhere =
        r#"forbid (principal, action, resource in Server::"billing") when { principal.subject == "mallory" };"#;
    let platform =
        r#"forbid (principal, action == Action::"get_prompt", resource) when { resource.name == "banned" };"#;
    let policies = load(
        Mode::Enforce,
        &[
            ("notes", &grant),
            ("prompts", &prompts),
            ("no-secrets", no_secrets),
            ("auditors", auditors),
            ("elsewhere", elsewhere),
        ],
        &[("no-banned", platform)],
    );
    assert!(policies.stale().is_empty(), "{:?}", policies.stale());
    let item = |action, name| Item { action, server: "billing", name };
    let decide = |roles: &'static [Role], item: Item<'_>, base: Option<&str>| {
        policies.decide_item(&caller(roles), &item, base, &at(12)).decision
    };
    let read = decide(WORKER, item(ItemAction::ReadResource, "notes://a"), None);
    assert_eq!((read.allow, read.by), (true, vec!["notes".to_owned()]), "{:?}", read.reason);
    let secret = decide(WORKER, item(ItemAction::ReadResource, "notes://secret/1"), Some("grant/g"));
    assert_eq!((secret.allow, secret.by, secret.reason), (false, vec!["no-secrets".to_owned()], Reason::Forbid));
    let completion = decide(WORKER, item(ItemAction::CompleteResource, "notes://secret/{id}"), None);
    assert!(!completion.allow, "a completion of a forbidden template is refused too");
    assert!(!decide(WORKER, item(ItemAction::ReadResource, "files://a"), None).allow, "no permit");
    assert!(decide(&[Role::Auditor], item(ItemAction::GetPrompt, "summary"), None).allow);
    assert!(!decide(&[Role::Auditor], item(ItemAction::GetPrompt, "other"), None).allow);
    assert!(!decide(&[Role::Auditor], item(ItemAction::CompletePrompt, "summary"), None).allow, "get_prompt only");
    let banned = decide(WORKER, item(ItemAction::GetPrompt, "banned"), Some("grant/g"));
    assert_eq!((banned.allow, banned.by), (false, vec!["platform/no-banned".to_owned()]));
    // Listing: exactly the decision (items take no arguments policies read).
    let w = caller(WORKER);
    assert!(policies.decide_item_list(&w, &item(ItemAction::ReadResource, "notes://a"), None, &at(12)));
    assert!(!policies.decide_item_list(&w, &item(ItemAction::ReadResource, "notes://secret/1"), None, &at(12)));
    // A tool's decision is not a prompt's: the tools' grant-free refund is still no permit.
    assert!(!call(&policies, &refund(), None, json!({"amount": 1})).allow);
}

mod agreement {
    use proptest::prelude::*;

    use super::*;

    /// Policies that read the arguments, the caller, the tool and the time, both ways.
    fn mixed() -> TenantPolicies {
        load(
            Mode::Enforce,
            &[
                ("small-refunds", SMALL_REFUNDS),
                (
                    "eu-auditors",
                    r#"permit (principal in Role::"auditor", action == Action::"billing__refund", resource) when { context.arguments has customer && context.arguments.customer like "eu-*" && context.time.toTime() < duration("18h") };"#,
                ),
                (
                    "no-acme",
                    r#"forbid (principal, action == Action::"billing__refund", resource) when { context.arguments has customer && context.arguments.customer == "acme" };"#,
                ),
                (
                    "no-nights",
                    r#"forbid (principal in Role::"worker", action in Action::"call_tool", resource) when { context.time.toTime() >= duration("20h") };"#,
                ),
                (
                    "big",
                    r#"forbid (principal, action == Action::"billing__refund", resource) when { context.arguments.amount > 250 };"#,
                ),
                (
                    "rates",
                    r#"forbid (principal, action == Action::"billing__refund", resource) when { context.arguments has rate && context.arguments.rate.greaterThan(decimal("5.0")) };"#,
                ),
            ],
            &[],
        )
    }

    fn roles() -> impl Strategy<Value = &'static [Role]> {
        prop_oneof![
            Just(&[Role::Worker][..]),
            Just(&[Role::Auditor][..]),
            Just(&[Role::Owner][..]),
            Just(&[Role::Worker, Role::Auditor][..])
        ]
    }

    fn arguments() -> impl Strategy<Value = Value> {
        let customer = prop_oneof![Just(None), Just(Some("acme")), Just(Some("eu-north")), Just(Some("us-east"))];
        let rate = prop_oneof![Just(None), Just(Some(1.5)), Just(Some(7.25))];
        (-50i64..300, customer, rate).prop_map(|(amount, customer, rate)| {
            let mut args = json!({"amount": amount});
            if let Some(c) = customer {
                args["customer"] = json!(c);
            }
            if let Some(r) = rate {
                args["rate"] = json!(r);
            }
            args
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// A call that policies allow is of a listed tool: the listing is never narrower.
        #[test]
        fn list_and_call_agree(roles in roles(), hour in 0u8..24, args in arguments(), granted in any::<bool>()) {
            let policies = mixed();
            let caller = Caller { tenant: "acme", subject: "wanda@acme.test", roles, flocks: None, claims: &[] };
            let base = granted.then_some("grant/g");
            let call = policies.decide_call(&caller, &refund(), base, args.as_object(), &at(hour));
            let listed = policies.decide_list(&caller, &refund(), base, &at(hour));
            prop_assert!(!call.decision.allow || listed, "allowed {args} at {hour}h for {roles:?} but not listed");
            // And a tool hidden from the listing refuses every call.
            if !listed {
                prop_assert!(!call.decision.allow);
            }
        }
    }
}

/// Every worked policy of the policies chapter parses.
#[test]
fn the_chapters_policies_parse() {
    let chapter = include_str!("../../docs/guide/policies.md");
    let blocks: Vec<&str> = chapter.split("```cedar\n").skip(1).filter_map(|b| b.split("```").next()).collect();
    assert!(blocks.len() >= 6, "the chapter's cedar blocks: {}", blocks.len());
    for block in blocks {
        cedar_policy::PolicySet::from_str(block).unwrap_or_else(|e| panic!("{block}: {e:?}"));
    }
}

#[test]
fn a_permit_may_ask_for_a_confirmation_and_the_strictest_one_applies() {
    use crate::model::Confirm;
    let confirmed = |text: &str, annotation: &str| format!("@confirm(\"{annotation}\")\n{text}");
    let big = r#"permit (principal in Role::"worker", action == Action::"billing__refund", resource)
when { context.arguments.amount >= 100 };"#;
    let any = r#"permit (principal in Role::"worker", action == Action::"billing__refund", resource);"#;
    let policies = load(
        Mode::Enforce,
        &[("small", &confirmed(SMALL_REFUNDS, "caller")), ("big", &confirmed(big, "approver"))],
        &[],
    );
    let small = call(&policies, &refund(), None, json!({"amount": 5}));
    assert_eq!((small.allow, small.confirm), (true, Some(Confirm::Caller)));
    let large = call(&policies, &refund(), None, json!({"amount": 500}));
    assert_eq!((large.allow, large.confirm), (true, Some(Confirm::Approver)), "the permit that allowed it decides");
    // Two permits allow it: the strictest asks, a permit without `@confirm` cancels nothing.
    let policies = load(Mode::Enforce, &[("any", any), ("big", &confirmed(big, "approver"))], &[]);
    assert_eq!(call(&policies, &refund(), None, json!({"amount": 500})).confirm, Some(Confirm::Approver));
    assert_eq!(call(&policies, &refund(), None, json!({"amount": 5})).confirm, None, "only `any` allows it");
    // A grant alone asks nothing of the engine (its own setting is the caller's to add).
    let grants_only = load(Mode::Enforce, &[], &[]);
    assert_eq!(call(&grants_only, &refund(), Some("grant/g1"), json!({"amount": 5})).confirm, None);
    // A platform policy asks too; a log-only tenant's own policy does not.
    let platform_any = r#"permit (principal in Role::"worker", action in Action::"call_tool", resource);"#;
    let policies = load(Mode::Enforce, &[], &[("everyone", &confirmed(platform_any, "caller"))]);
    assert_eq!(call(&policies, &refund(), None, json!({"amount": 5})).confirm, Some(Confirm::Caller));
    let logged = load(Mode::LogOnly, &[("any", &confirmed(any, "approver"))], &[]);
    let decided = call(&logged, &refund(), Some("grant/g1"), json!({"amount": 5}));
    assert_eq!((decided.allow, decided.confirm), (true, None), "log-only: the grant decides, nothing asked");
    // A refusal asks nothing.
    let policies = load(Mode::Enforce, &[("small", &confirmed(SMALL_REFUNDS, "caller"))], &[]);
    assert_eq!(call(&policies, &refund(), None, json!({"amount": 500})).confirm, None);
}

#[test]
fn a_confirmation_that_does_not_read_is_refused_and_fails_closed() {
    let schema =
        cedar_policy::Schema::from_json_value(model::schema_json(Some(&catalogue()), &catalogue().claims)).unwrap();
    let problems = |text: &str| engine::problems(&schema, Some(&catalogue()), "p", text);
    let permit = r#"permit (principal in Role::"worker", action == Action::"billing__refund", resource);"#;
    assert!(problems(&format!("@confirm(\"caller\")\n{permit}")).is_empty());
    assert!(problems(&format!("@confirm(\"approver\")\n{permit}")).is_empty());
    let bad = problems(&format!("@confirm(\"sometimes\")\n{permit}"));
    assert_eq!((bad.len(), bad[0].line), (1, Some(1)), "{bad:?}");
    assert!(bad[0].message.contains("`@confirm(\"caller\")` or `@confirm(\"approver\")`"), "{bad:?}");
    let forbid = r#"@confirm("caller")
forbid (principal, action == Action::"billing__refund", resource);"#;
    assert!(problems(forbid)[0].message.contains("belongs on a permit"), "{:?}", problems(forbid));
    // Stored anyway (written before, or by hand), it allows nothing: a stale policy is a forbid.
    let policies = load(Mode::Enforce, &[("odd", &format!("@confirm(\"sometimes\")\n{permit}"))], &[]);
    let refused = call(&policies, &refund(), Some("grant/g1"), json!({"amount": 5}));
    assert!(!refused.allow, "{refused:?}");
    assert!(policies.stale().contains_key("odd"));
}
