//! One tenant's policies, compiled: parsing and validation (with line and column), and the
//! decisions for a call (its arguments known) and for a listing (its arguments unknown).
//! Never reads the database; never lets an error permit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex};

use cedar_policy::{
    ActionConstraint, Authorizer, Context, Decision as CedarDecision, Effect, Entities, Entity, EntityId,
    EntityTypeName, EntityUid, Policy, PolicyId, PolicySet, PrincipalConstraint, Request, ResourceConstraint,
    RestrictedExpression, Schema, ValidationMode, Validator,
};
use serde_json::{Map, Value};

use super::arguments::{ArgumentReads, Extension, Mismatch, arguments_value};
use super::model::{self, Catalogue, ToolFacts};
use crate::model::{Confirm, Role};

/// A problem with a policy's text, where it is (1-based; `None` when Cedar gives no place).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Problem {
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(f, "{line}:{column}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// The problem `diagnostic` names, placed in `text` by its first label.
fn problem(text: &str, diagnostic: &dyn miette::Diagnostic) -> Problem {
    let offset = diagnostic.labels().and_then(|mut labels| labels.next()).map(|label| label.offset());
    let (line, column) = match offset {
        Some(offset) => {
            let (line, column) = line_column(text, offset);
            (Some(line), Some(column))
        }
        None => (None, None),
    };
    let mut message = diagnostic.to_string();
    if let Some(help) = diagnostic.help() {
        message.push_str(&format!(" ({help})"));
    }
    Problem { line, column, message }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// Names under `/policies/` that are routes of their own, never a policy's id.
pub const RESERVED_IDS: [&str; 3] = ["check", "callable", "callers"];

/// Policy ids as written: letters, digits, `_`, `-` and `.`, at most 64 characters, not one of
/// [`RESERVED_IDS`]. The gateway's own ids (`platform/...`, `grant/...`) can't collide with them.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        && !RESERVED_IDS.contains(&id)
}

/// The one policy in `text`, with id `id`.
pub fn parse(id: &str, text: &str) -> Result<Policy, Vec<Problem>> {
    Policy::parse(Some(PolicyId::new(id)), text).map_err(|errors| errors.iter().map(|e| problem(text, e)).collect())
}

/// What is wrong with `text` as policy `id`: its parse errors, else what [`validate`] finds.
pub fn problems(schema: &Schema, catalogue: Option<&Catalogue>, id: &str, text: &str) -> Vec<Problem> {
    match parse(id, text) {
        Err(problems) => problems,
        Ok(policy) => validate(schema, catalogue, &policy, text),
    }
}

/// What `policy` (parsed from `text`) gets wrong against `schema` (strict validation), and
/// the tools it names that `catalogue` does not have.
pub fn validate(schema: &Schema, catalogue: Option<&Catalogue>, policy: &Policy, text: &str) -> Vec<Problem> {
    let mut set = PolicySet::new();
    if let Err(e) = set.add(policy.clone()) {
        return vec![Problem { line: None, column: None, message: e.to_string() }];
    }
    let result = Validator::new(schema.clone()).validate(&set, ValidationMode::Strict);
    let mut problems: Vec<Problem> = result.validation_errors().map(|e| problem(text, e)).collect();
    problems.extend(confirm_problem(policy, text));
    if let Some(catalogue) = catalogue {
        for literal in policy.entity_literals() {
            let (kind, id) = (literal.type_name().to_string(), literal.id().unescaped().to_owned());
            if kind == model::TOOL && !catalogue.tools.iter().any(|t| t.id == id) {
                let at = text.find(&format!("\"{id}\"")).map(|offset| line_column(text, offset));
                problems.push(Problem {
                    line: at.map(|(l, _)| l),
                    column: at.map(|(_, c)| c),
                    message: format!("`Tool::\"{id}\"` is not a tool of this tenant"),
                });
            }
        }
    }
    problems
}

/// How a tenant's policies take part in decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// They decide (with the grants and the platform's policies).
    #[default]
    Enforce,
    /// They are evaluated and audited; grants and platform policies alone decide.
    LogOnly,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::LogOnly => "log_only",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "enforce" => Some(Mode::Enforce),
            "log_only" => Some(Mode::LogOnly),
            _ => None,
        }
    }
}

/// A stored policy: its id, text and mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub id: String,
    pub text: String,
    pub mode: Mode,
}

/// The id under which a platform policy takes part in a tenant's decisions.
pub fn platform_id(id: &str) -> String {
    format!("platform/{id}")
}

/// Who is calling, as policies see it.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub tenant: &'a str,
    pub subject: &'a str,
    pub roles: &'a [Role],
    /// `None`: every flock of the tenant.
    pub flocks: Option<&'a [String]>,
    /// The token's claims policies read (`auth.policy_claims`), as text.
    pub claims: &'a [(String, String)],
}

/// The circumstances of a request.
#[derive(Debug, Clone, Copy)]
pub struct Circumstances<'a> {
    pub revision: &'a str,
    pub client: Option<&'a str>,
    pub stateless: bool,
    pub now: time::OffsetDateTime,
}

/// What allows a call without any policy: a grant (its id as policies name it, `grant/...`), or
/// a native tool's own role list (`None` when neither does; a native tool whose roles refuse the
/// caller is refused before policies are asked).
pub type Base<'a> = Option<&'a str>;

/// Why a decision went the way it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Permitted: `by` names the permits (policies and the grant) that allowed it.
    Permit,
    /// Refused by the forbids in `by`.
    Forbid,
    /// Nothing permits it.
    NoPermit,
    /// A policy could not be evaluated (named in `by`): refused.
    PolicyError(String),
    /// The arguments are not values of the types the tool declares: refused.
    ArgumentsInvalid(Mismatch),
}

impl Reason {
    /// The audit class of a call refused for this reason.
    pub fn refusal_class(&self) -> &'static str {
        match self {
            Reason::Forbid => "policy_forbid",
            Reason::NoPermit | Reason::Permit => "policy_no_permit",
            Reason::PolicyError(_) => "policy_error",
            Reason::ArgumentsInvalid(_) => "arguments_invalid",
        }
    }

    /// A stable label for the audit.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Permit => "permit",
            Reason::Forbid => "forbid",
            Reason::NoPermit => "no_permit",
            Reason::PolicyError(_) => "policy_error",
            Reason::ArgumentsInvalid(_) => "arguments_invalid",
        }
    }
}

/// A decision, with the ids of the policies that took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allow: bool,
    pub by: Vec<String>,
    pub reason: Reason,
    /// Who must confirm the call before it is forwarded: the strictest `@confirm` of the
    /// permit policies that allowed it (a grant's own setting is the caller's to add).
    pub confirm: Option<Confirm>,
}

impl Decision {
    fn deny(reason: Reason, by: Vec<String>) -> Self {
        Self { allow: false, by, reason, confirm: None }
    }
}

/// The annotation by which a permit policy requires a confirmation of the calls it allows:
/// `@confirm("caller")` or `@confirm("approver")`.
pub const CONFIRM_ANNOTATION: &str = "confirm";

/// What is wrong with `policy`'s `@confirm`, if anything: a value other than `caller` or
/// `approver`, or the annotation on a forbid (which allows nothing to confirm).
fn confirm_problem(policy: &Policy, text: &str) -> Option<Problem> {
    let value = policy.annotation(CONFIRM_ANNOTATION)?;
    let at = text.find("@confirm").map(|offset| line_column(text, offset));
    let message = if policy.effect() == Effect::Forbid {
        "`@confirm` belongs on a permit policy: a forbid allows no call to confirm".to_owned()
    } else if Confirm::parse(value).is_none() {
        format!("`@confirm(\"{}\")` must be `@confirm(\"caller\")` or `@confirm(\"approver\")`", value.escape_debug())
    } else {
        return None;
    };
    Some(Problem { line: at.map(|(l, _)| l), column: at.map(|(_, c)| c), message })
}

/// A decision that counts, and (log-only tenants) what the tenant's own policies would have
/// decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    pub log_only: Option<Decision>,
    /// Whether any policy took part (`false`: the grants or the tool's roles alone decided, and
    /// the audit records nothing of policies).
    pub consulted: bool,
}

/// One tenant's policies (with the platform's), ready to decide.
pub struct TenantPolicies {
    tenant: String,
    mode: Mode,
    /// What decides: the platform's policies, and the tenant's when enforced.
    enforced: Arc<PolicySet>,
    /// When some policy is log-only: every policy (the platform's, the tenant's whatever their
    /// mode), whose decision is audited beside the one that counts.
    shadow: Option<Arc<PolicySet>>,
    /// What listings are decided with: the enforced policies that do not read the arguments as
    /// they are, those that do turned into what they may be for some arguments (a permit: its
    /// scope alone; a forbid: nothing).
    listing: Arc<PolicySet>,
    /// Per action id, the part of each set whose action scope can name it.
    by_action: Mutex<HashMap<String, Narrowed>>,
    /// What each policy reads of a request's context (by id; a listing's policy has its
    /// original's id and reads no more than it).
    reads: HashMap<PolicyId, Reads>,
    /// Policies that no longer validate against the tenant's schema, with why.
    stale: BTreeMap<String, Vec<Problem>>,
    /// Whether any policy at all is loaded (none: grants alone decide, as before policies).
    empty: bool,
    /// Why the policies could not be loaded: every call is refused, nothing listed.
    failed: Option<String>,
}

/// Why a tenant's policies could not be loaded: every decision for the tenant refuses.
#[derive(Debug, Clone, thiserror::Error)]
#[error("policy `{id}` can't be loaded: {problems}")]
pub struct LoadError {
    pub id: String,
    pub problems: String,
}

impl TenantPolicies {
    /// Compiles `tenant`'s policies and the platform's, validated against `catalogue`. A policy
    /// that no longer validates (a tool it names changed) takes part as a forbid of everything
    /// its scope names: it fails closed. A policy that does not parse fails the load.
    pub fn load(
        catalogue: &Catalogue,
        mode: Mode,
        tenant_policies: &[Source],
        platform_policies: &[Source],
    ) -> Result<Self, LoadError> {
        let schema = Schema::from_json_value(model::schema_json(Some(catalogue), &catalogue.claims))
            .map_err(|e| LoadError { id: "(schema)".into(), problems: e.to_string() })?;
        let platform_schema = Schema::from_json_value(model::schema_json(None, &catalogue.claims))
            .map_err(|e| LoadError { id: "(schema)".into(), problems: e.to_string() })?;
        let mut stale = BTreeMap::new();
        let mut compile = |id: String, source: &Source, schema: &Schema, catalogue: Option<&Catalogue>| {
            let fail = |problems: Vec<Problem>| LoadError {
                id: id.clone(),
                problems: problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
            };
            let policy = parse(&id, &source.text).map_err(fail)?;
            let problems = validate(schema, catalogue, &policy, &source.text);
            if problems.is_empty() {
                return Ok(policy);
            }
            let closed = scope_forbid(&policy).map_err(|e| fail(vec![e]))?;
            stale.insert(id.clone(), problems);
            Ok(closed)
        };
        let mut platform = Vec::new();
        for source in platform_policies {
            platform.push(compile(platform_id(&source.id), source, &platform_schema, None)?);
        }
        // Enforced, and log-only (by their own mode, or all of them in a log-only tenant).
        let (mut own, mut logged) = (Vec::new(), Vec::new());
        for source in tenant_policies {
            let policy = compile(source.id.clone(), source, &schema, Some(catalogue))?;
            match (mode, source.mode) {
                (Mode::Enforce, Mode::Enforce) => own.push(policy),
                _ => logged.push(policy),
            }
        }
        let set = |policies: &[&Vec<Policy>]| -> Result<PolicySet, LoadError> {
            PolicySet::from_policies(policies.iter().flat_map(|p| p.iter().cloned()))
                .map_err(|e| LoadError { id: "(set)".into(), problems: e.to_string() })
        };
        let empty = platform.is_empty() && own.is_empty() && logged.is_empty();
        let listed: Vec<Policy> = platform.iter().chain(own.iter()).filter_map(for_listing).collect();
        let listing = set(&[&listed])?;
        let enforced = set(&[&platform, &own])?;
        let shadow = match logged.is_empty() {
            true => None,
            false => Some(Arc::new(set(&[&platform, &own, &logged])?)),
        };
        let mut reads = HashMap::new();
        for policy in shadow.as_deref().unwrap_or(&enforced).policies() {
            let mut read = Reads::none();
            read.add(policy);
            reads.insert(policy.id().clone(), read);
        }
        Ok(Self {
            tenant: catalogue.tenant.clone(),
            mode,
            enforced: Arc::new(enforced),
            shadow,
            listing: Arc::new(listing),
            by_action: Mutex::default(),
            reads,
            stale,
            empty,
            failed: None,
        })
    }

    /// The set of a tenant whose policies could not be read or loaded: it refuses every call
    /// (`policy_error`) and lists nothing.
    pub fn failed(tenant: &str, why: String) -> Self {
        Self { failed: Some(why), empty: false, ..Self::none(tenant) }
    }

    /// A tenant's policies from their stored rows (`mode`: the tenant's policy mode as stored).
    /// No rows: grants alone decide. `Err` (why): a mode that does not read, or a policy that
    /// does not load; the caller refuses with [`TenantPolicies::failed`]. A policy's own mode
    /// that does not read makes it log-only: it never decides unread.
    pub fn from_stored(
        catalogue: &Catalogue,
        mode: &str,
        tenant: Vec<crate::store::policies::PolicyRow>,
        platform: Vec<crate::store::policies::PolicyRow>,
    ) -> Result<Self, String> {
        if tenant.is_empty() && platform.is_empty() {
            return Ok(Self::none(&catalogue.tenant));
        }
        let mode = Mode::parse(mode).ok_or_else(|| format!("unknown policy mode `{mode}`"))?;
        let sources = |rows: Vec<crate::store::policies::PolicyRow>| -> Vec<Source> {
            rows.into_iter()
                .map(|r| Source { mode: Mode::parse(&r.mode).unwrap_or(Mode::LogOnly), id: r.name, text: r.body })
                .collect()
        };
        Self::load(catalogue, mode, &sources(tenant), &sources(platform)).map_err(|e| e.to_string())
    }

    /// A tenant with no policy: grants alone decide.
    pub fn none(tenant: &str) -> Self {
        Self {
            tenant: tenant.to_owned(),
            mode: Mode::Enforce,
            enforced: Arc::new(PolicySet::new()),
            shadow: None,
            listing: Arc::new(PolicySet::new()),
            by_action: Mutex::default(),
            reads: HashMap::new(),
            stale: BTreeMap::new(),
            empty: true,
            failed: None,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether no policy is loaded: decisions are the grants' alone.
    pub fn is_empty(&self) -> bool {
        self.empty
    }

    /// Policies that no longer validate, with why.
    pub fn stale(&self) -> &BTreeMap<String, Vec<Problem>> {
        &self.stale
    }

    /// The parts of the sets whose scope can name a request of `scope` by a caller holding
    /// `roles`: the action (the request's own, or the group it is a member of), the resource (the
    /// tool, prompt or resource, its server) and the principal's roles. Never leaves out a policy
    /// that could apply: a scope it does not read (a user, a tenant) keeps the policy.
    fn sets_for(&self, scope: &Scope<'_>, roles: &[Role]) -> Narrowed {
        let key = format!(
            "{}\u{0}{}\u{0}{}\u{0}{}\u{0}{roles:?}",
            scope.kind,
            scope.action,
            scope.server.unwrap_or_default(),
            scope.id.unwrap_or_default()
        );
        let mut cache = self.by_action.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sets) = cache.get(&key) {
            return sets.clone();
        }
        let names = |uid: &EntityUid| {
            let id = uid.id().unescaped();
            id == scope.action || scope.group == Some(id)
        };
        let kind = |uid: &EntityUid| uid.type_name().to_string();
        let holds_role =
            |uid: &EntityUid| kind(uid) != model::ROLE || roles.iter().any(|r| r.as_str() == uid.id().unescaped());
        // Whether `uid` can be the resource itself (`None`: any of its kind may be).
        let is_it = |uid: &EntityUid| kind(uid) == scope.kind && scope.id.is_none_or(|id| uid.id().unescaped() == id);
        // Whether the resource scope `in uid` can hold the resource.
        let within = |uid: &EntityUid| match kind(uid).as_str() {
            model::SERVER => scope.server == Some(uid.id().unescaped()),
            model::TOOL | model::PROMPT | model::RESOURCE => is_it(uid),
            _ => true,
        };
        let narrow = |set: &PolicySet| {
            let kept = set.policies().filter(|p| {
                let action_ok = match p.action_constraint() {
                    ActionConstraint::Any => true,
                    ActionConstraint::Eq(uid) => names(&uid),
                    ActionConstraint::In(uids) => uids.iter().any(names),
                };
                let resource_ok = match p.resource_constraint() {
                    ResourceConstraint::Any => true,
                    ResourceConstraint::Eq(uid) => is_it(&uid),
                    ResourceConstraint::In(uid) => within(&uid),
                    ResourceConstraint::Is(kind) => kind.to_string() == scope.kind,
                    ResourceConstraint::IsIn(kind, uid) => kind.to_string() == scope.kind && within(&uid),
                };
                let principal_ok = match p.principal_constraint() {
                    PrincipalConstraint::In(uid) | PrincipalConstraint::IsIn(_, uid) => holds_role(&uid),
                    PrincipalConstraint::Any | PrincipalConstraint::Eq(_) | PrincipalConstraint::Is(_) => true,
                };
                action_ok && resource_ok && principal_ok
            });
            // Ids are unique in `set`, so this can't fail; if it did, the whole set decides.
            Arc::new(PolicySet::from_policies(kept.cloned()).unwrap_or_else(|_| set.clone()))
        };
        let (enforced, shadow, listing) =
            (narrow(&self.enforced), self.shadow.as_deref().map(narrow), narrow(&self.listing));
        let mut reads = Reads::none();
        for policy in enforced.policies().chain(shadow.iter().flat_map(|s| s.policies())).chain(listing.policies()) {
            match self.reads.get(policy.id()) {
                Some(read) => reads.merge(read),
                None => reads.add(policy),
            }
        }
        let sets = Narrowed { enforced, shadow, listing, reads: Arc::new(reads) };
        if cache.len() < 10_000 {
            cache.insert(key, sets.clone());
        }
        sets
    }

    /// The decision for calling `tool` with `arguments`.
    pub fn decide_call(
        &self,
        caller: &Caller<'_>,
        tool: &ToolFacts,
        base: Base<'_>,
        arguments: Option<&Map<String, Value>>,
        circumstances: &Circumstances<'_>,
    ) -> Outcome {
        let typed = |reads: &ArgumentReads| arguments_value(&tool.arguments, arguments, reads);
        self.decide(caller, Target::Tool(tool), base, typed, circumstances)
    }

    /// The decision for `item` (a prompt, a resource, a completion), which takes no arguments
    /// policies read.
    pub fn decide_item(
        &self,
        caller: &Caller<'_>,
        item: &Item<'_>,
        base: Base<'_>,
        circumstances: &Circumstances<'_>,
    ) -> Outcome {
        self.decide(caller, Target::Item(item), base, |_: &ArgumentReads| Ok(no_arguments()), circumstances)
    }

    fn decide(
        &self,
        caller: &Caller<'_>,
        target: Target<'_>,
        base: Base<'_>,
        arguments: impl FnOnce(&ArgumentReads) -> Result<RestrictedExpression, Mismatch>,
        circumstances: &Circumstances<'_>,
    ) -> Outcome {
        let grants_only = || Outcome { decision: by_base(base), log_only: None, consulted: false };
        if self.empty {
            return grants_only();
        }
        if let Some(why) = &self.failed {
            let decision = Decision::deny(Reason::PolicyError(why.clone()), Vec::new());
            return Outcome { decision, log_only: None, consulted: true };
        }
        let Narrowed { enforced, shadow, reads, .. } = self.sets_for(&target.scope(), caller.roles);
        if enforced.is_empty() && shadow.as_ref().is_none_or(|s| s.is_empty()) {
            // No policy's scope names this request.
            return grants_only();
        }
        let arguments = match arguments(&reads.arguments) {
            Ok(value) => value,
            Err(mismatch) => {
                // The policies can't be asked: refused where they decide.
                let refused = Decision::deny(Reason::ArgumentsInvalid(mismatch), Vec::new());
                let log_only = shadow.is_some().then(|| refused.clone());
                return match enforced.is_empty() {
                    true => Outcome { log_only, consulted: true, ..grants_only() },
                    false => Outcome { decision: refused, log_only, consulted: true },
                };
            }
        };
        let (request, entities) = match self.request(caller, &target, arguments, circumstances, &reads) {
            Ok(request) => request,
            Err(e) => {
                let decision = Decision::deny(Reason::PolicyError(e), Vec::new());
                return Outcome { decision, log_only: None, consulted: true };
            }
        };
        let decide = |set: &PolicySet| evaluate(&request, set, &entities, base);
        Outcome { decision: decide(&enforced), log_only: shadow.as_deref().map(decide), consulted: true }
    }

    /// Whether `tool` is listed for `caller`: when some call of it could be permitted, whatever
    /// its arguments. Never narrower than the calls' decisions: a policy that does not read the
    /// arguments decides as it would for a call; one that does is taken as applying (a permit,
    /// when its scope names the call) or as not applying (a forbid), as some arguments may make it.
    pub fn decide_list(
        &self,
        caller: &Caller<'_>,
        tool: &ToolFacts,
        base: Base<'_>,
        circumstances: &Circumstances<'_>,
    ) -> bool {
        self.listed(caller, Target::Tool(tool), base, circumstances)
    }

    /// Whether `item` (a prompt, a resource or a template) is listed for `caller`: exactly when
    /// a request of it is allowed (it takes no arguments policies read).
    pub fn decide_item_list(
        &self,
        caller: &Caller<'_>,
        item: &Item<'_>,
        base: Base<'_>,
        circumstances: &Circumstances<'_>,
    ) -> bool {
        self.listed(caller, Target::Item(item), base, circumstances)
    }

    fn listed(
        &self,
        caller: &Caller<'_>,
        target: Target<'_>,
        base: Base<'_>,
        circumstances: &Circumstances<'_>,
    ) -> bool {
        if self.empty {
            return base.is_some();
        }
        if self.failed.is_some() {
            return false;
        }
        let Narrowed { listing, reads, .. } = self.sets_for(&target.scope(), caller.roles);
        if listing.is_empty() {
            return base.is_some();
        }
        let Ok((request, entities)) = self.request(caller, &target, no_arguments(), circumstances, &reads) else {
            return false;
        };
        evaluate(&request, &listing, &entities, base).allow
    }

    fn request(
        &self,
        caller: &Caller<'_>,
        target: &Target<'_>,
        arguments: RestrictedExpression,
        circumstances: &Circumstances<'_>,
        reads: &Reads,
    ) -> Result<(Request, Entities), String> {
        debug_assert_eq!(caller.tenant, self.tenant);
        let user = uid(&names().user, caller.subject);
        let mut parents: HashSet<EntityUid> = caller.roles.iter().map(|r| uid(&names().role, r.as_str())).collect();
        parents.insert(uid(&names().tenant, caller.tenant));
        let flocks = caller.flocks.unwrap_or_default();
        let user_attrs = HashMap::from([
            ("subject".to_owned(), RestrictedExpression::new_string(caller.subject.to_owned())),
            ("tenant".to_owned(), RestrictedExpression::new_string(caller.tenant.to_owned())),
            ("allFlocks".to_owned(), RestrictedExpression::new_bool(caller.flocks.is_none())),
            (
                "flocks".to_owned(),
                RestrictedExpression::new_set(flocks.iter().map(|f| RestrictedExpression::new_string(f.clone()))),
            ),
            (
                "claims".to_owned(),
                RestrictedExpression::new_record(
                    caller.claims.iter().map(|(k, v)| (k.clone(), RestrictedExpression::new_string(v.clone()))),
                )
                .map_err(|e| e.to_string())?,
            ),
        ]);
        let (resource, resource_entity, action, action_entity) = match target {
            Target::Tool(tool) => {
                let resource = uid(&names().tool, &tool.id);
                let action = uid(&names().action, &tool.id);
                let entity = Entity::new(resource.clone(), tool_attributes(tool), tool_parents(tool));
                let group = HashSet::from([uid(&names().action, model::CALL_TOOL)]);
                (resource, entity, action.clone(), Entity::new_no_attrs(action, group))
            }
            Target::Item(item) => {
                let resource = uid(item.kind_name(), &item.id());
                let action = uid(&names().action, item.action.action());
                let (key, value) = item.named();
                let attrs = HashMap::from([
                    (key.to_owned(), RestrictedExpression::new_string(value.to_owned())),
                    ("server".to_owned(), RestrictedExpression::new_string(item.server.to_owned())),
                ]);
                let parents = HashSet::from([uid(&names().server, item.server)]);
                let entity = Entity::new(resource.clone(), attrs, parents);
                (resource, entity, action.clone(), Entity::new_no_attrs(action, HashSet::new()))
            }
        };
        let entities = Entities::from_entities(
            [
                Entity::new(user.clone(), user_attrs, parents).map_err(|e| e.to_string())?,
                resource_entity.map_err(|e| e.to_string())?,
                action_entity,
            ],
            None,
        )
        .map_err(|e| e.to_string())?;
        let mut context = vec![
            ("arguments".to_owned(), arguments),
            ("revision".to_owned(), RestrictedExpression::new_string(circumstances.revision.to_owned())),
            ("stateless".to_owned(), RestrictedExpression::new_bool(circumstances.stateless)),
        ];
        if reads.time {
            let time = super::arguments::extension_value(Extension::Datetime, datetime_text(circumstances.now));
            context.push(("time".to_owned(), time));
        }
        if let Some(client) = circumstances.client {
            context.push(("client".to_owned(), RestrictedExpression::new_string(client.to_owned())));
        }
        let context = Context::from_pairs(context).map_err(|e| e.to_string())?;
        let request = Request::new(user, action, resource, context, None).map_err(|e| e.to_string())?;
        Ok((request, entities))
    }
}

/// What a grant (or a native tool's roles) alone decides.
fn by_base(base: Base<'_>) -> Decision {
    match base {
        Some(by) => Decision { allow: true, by: vec![by.to_owned()], reason: Reason::Permit, confirm: None },
        None => Decision::deny(Reason::NoPermit, Vec::new()),
    }
}

/// `set`'s decision of `request`: an evaluation error refuses (naming the policies that erred),
/// a satisfied forbid refuses, a permit or else `base` allows.
fn evaluate(request: &Request, set: &PolicySet, entities: &Entities, base: Base<'_>) -> Decision {
    let response = Authorizer::new().is_authorized(request, set, entities);
    let errored: Vec<String> = response
        .diagnostics()
        .errors()
        .map(|e| match e {
            cedar_policy::AuthorizationError::PolicyEvaluationError(e) => e.policy_id().to_string(),
        })
        .collect();
    if !errored.is_empty() {
        let message = response.diagnostics().errors().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        return Decision::deny(Reason::PolicyError(message), errored);
    }
    let mut by: Vec<String> = response.diagnostics().reason().map(ToString::to_string).collect();
    by.sort();
    match response.decision() {
        CedarDecision::Allow => {
            // Every permit that allowed it is satisfied: the strictest confirmation any of them
            // asks for applies (a value that does not read never loads: see `confirm_problem`).
            let confirm = response
                .diagnostics()
                .reason()
                .filter_map(|id| set.policy(id)?.annotation(CONFIRM_ANNOTATION))
                .filter_map(Confirm::parse)
                .max();
            by.extend(base.map(str::to_owned));
            Decision { allow: true, by, reason: Reason::Permit, confirm }
        }
        CedarDecision::Deny if !by.is_empty() => Decision::deny(Reason::Forbid, by),
        CedarDecision::Deny => by_base(base),
    }
}

/// The empty `arguments` record.
fn no_arguments() -> RestrictedExpression {
    RestrictedExpression::new_record(Vec::<(String, RestrictedExpression)>::new())
        .unwrap_or_else(|e| unreachable!("an empty record has no duplicate keys: {e}"))
}

fn tool_attributes(tool: &ToolFacts) -> HashMap<String, RestrictedExpression> {
    let mut attrs = HashMap::from([
        ("name".to_owned(), RestrictedExpression::new_string(tool.name.clone())),
        ("digest".to_owned(), RestrictedExpression::new_string(tool.digest.clone())),
        ("native".to_owned(), RestrictedExpression::new_bool(tool.server.is_none())),
        ("readOnlyHint".to_owned(), RestrictedExpression::new_bool(tool.hints.read_only)),
        ("destructiveHint".to_owned(), RestrictedExpression::new_bool(tool.hints.destructive)),
        ("idempotentHint".to_owned(), RestrictedExpression::new_bool(tool.hints.idempotent)),
        ("openWorldHint".to_owned(), RestrictedExpression::new_bool(tool.hints.open_world)),
    ]);
    if let Some(server) = &tool.server {
        attrs.insert("server".to_owned(), RestrictedExpression::new_string(server.clone()));
    }
    if let Some(title) = &tool.title {
        attrs.insert("title".to_owned(), RestrictedExpression::new_string(title.clone()));
    }
    attrs
}

fn tool_parents(tool: &ToolFacts) -> HashSet<EntityUid> {
    tool.server.iter().map(|s| uid(&names().server, s)).collect()
}

/// A request of a prompt or resource of an upstream server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemAction {
    /// `prompts/get`.
    GetPrompt,
    /// `resources/read` (and `resources/subscribe`: following a resource reads it).
    ReadResource,
    /// `completion/complete` of a prompt's argument.
    CompletePrompt,
    /// `completion/complete` of a resource template's variable.
    CompleteResource,
}

impl ItemAction {
    /// The Cedar action.
    pub fn action(self) -> &'static str {
        match self {
            ItemAction::GetPrompt => model::GET_PROMPT,
            ItemAction::ReadResource => model::READ_RESOURCE,
            ItemAction::CompletePrompt | ItemAction::CompleteResource => model::COMPLETE,
        }
    }

    /// Whether the item is a prompt (else a resource or a resource template).
    pub fn of_prompt(self) -> bool {
        matches!(self, ItemAction::GetPrompt | ItemAction::CompletePrompt)
    }
}

/// A prompt, a resource or a resource template of an upstream server, as a request names it:
/// `Prompt::"<server>__<name>"` (attributes `name`, `server`) or `Resource::"<server>__<uri>"`
/// (attributes `uri`, `server`), in `Server::"<server>"`.
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    pub action: ItemAction,
    pub server: &'a str,
    /// The prompt's name, or the resource's URI (a template's URI template), as its server names it.
    pub name: &'a str,
}

impl Item<'_> {
    /// The entity's id.
    pub fn id(&self) -> String {
        format!("{}{}{}", self.server, crate::vocab::names::NAME_SEPARATOR, self.name)
    }

    fn kind(&self) -> &'static str {
        if self.action.of_prompt() { model::PROMPT } else { model::RESOURCE }
    }

    fn kind_name(&self) -> &'static EntityTypeName {
        if self.action.of_prompt() { &names().prompt } else { &names().resource }
    }

    /// The attribute that names it, and its value.
    fn named(&self) -> (&'static str, &str) {
        if self.action.of_prompt() { ("name", self.name) } else { ("uri", self.name) }
    }
}

/// What a request is about.
enum Target<'a> {
    Tool(&'a ToolFacts),
    Item(&'a Item<'a>),
}

impl Target<'_> {
    fn scope(&self) -> Scope<'_> {
        match self {
            Target::Tool(tool) => Scope {
                action: &tool.id,
                group: Some(model::CALL_TOOL),
                kind: model::TOOL,
                id: Some(&tool.id),
                server: tool.server.as_deref(),
            },
            // Narrowed by server, not by name: the URIs of a server's resources are many, and a
            // policy about one of them is kept (its evaluation decides).
            Target::Item(item) => Scope {
                action: item.action.action(),
                group: None,
                kind: item.kind(),
                id: None,
                server: Some(item.server),
            },
        }
    }
}

/// What a request's policies are narrowed by.
struct Scope<'a> {
    /// The request's action id.
    action: &'a str,
    /// The group the action is a member of.
    group: Option<&'static str>,
    /// The resource's entity type.
    kind: &'static str,
    /// The resource's id (`None`: any of its kind may be the one).
    id: Option<&'a str>,
    server: Option<&'a str>,
}

/// `now` as Cedar's `datetime` reads it: UTC, to the millisecond.
fn datetime_text(now: time::OffsetDateTime) -> String {
    let t = now.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// The parts of a tenant's sets whose scope can name one request, and what of the request's
/// context they read.
#[derive(Clone)]
struct Narrowed {
    enforced: Arc<PolicySet>,
    shadow: Option<Arc<PolicySet>>,
    listing: Arc<PolicySet>,
    reads: Arc<Reads>,
}

/// What of a request's context some policy may read. The context holds only that: a value no
/// policy reads can't change a decision, and `datetime` and `decimal` values cost a parse of
/// their constructor's name each.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reads {
    time: bool,
    arguments: ArgumentReads,
}

impl Reads {
    fn none() -> Self {
        Self { time: false, arguments: ArgumentReads::Only(Default::default()) }
    }

    fn all() -> Self {
        Self { time: true, arguments: ArgumentReads::All }
    }

    fn merge(&mut self, other: &Reads) {
        self.time |= other.time;
        match (&mut self.arguments, &other.arguments) {
            (ArgumentReads::All, _) => {}
            (mine, ArgumentReads::All) => *mine = ArgumentReads::All,
            (ArgumentReads::Only(mine), ArgumentReads::Only(theirs)) => mine.extend(theirs.iter().cloned()),
        }
    }

    /// Adds what `policy`'s conditions read (everything, when its form can't be read).
    fn add(&mut self, policy: &Policy) {
        match policy.to_json() {
            Ok(json) => self.walk(&json["conditions"]),
            Err(_) => *self = Self::all(),
        }
    }

    /// Walks a condition in Cedar's JSON form: `context.time`, `context has time`, and
    /// `context.arguments.<name>` (or `has <name>`) read what they name; `context` or
    /// `context.arguments` used whole reads all of it.
    fn walk(&mut self, node: &Value) {
        fn context(v: &Value) -> bool {
            v.get("Var").and_then(Value::as_str) == Some("context")
        }
        // `left.attr` or `left has attr`.
        fn access(v: &Value) -> Option<(&Value, &str)> {
            let (_, inner) = v.as_object()?.iter().find(|(k, _)| *k == "." || *k == "has")?;
            Some((inner.get("left")?, inner.get("attr")?.as_str()?))
        }
        match node {
            Value::Array(items) => items.iter().for_each(|item| self.walk(item)),
            Value::Object(_) if context(node) => *self = Self::all(),
            Value::Object(map) => match access(node) {
                Some((left, attr)) if context(left) => match attr {
                    "time" => self.time = true,
                    // `context.arguments` used whole (its parent reads no member of it).
                    "arguments" => self.arguments = ArgumentReads::All,
                    _ => {}
                },
                Some((left, attr)) if access(left).is_some_and(|(inner, a)| a == "arguments" && context(inner)) => {
                    if let ArgumentReads::Only(names) = &mut self.arguments {
                        names.insert(attr.to_owned());
                    }
                }
                _ => map.values().for_each(|value| self.walk(value)),
            },
            _ => {}
        }
    }
}

/// `policy` as listings take it: as it is when its conditions do not read `arguments`; else a
/// permit's scope alone (some arguments may satisfy it), and no forbid (some may not).
fn for_listing(policy: &Policy) -> Option<Policy> {
    let Ok(mut json) = policy.to_json() else {
        // Not expressible as JSON: taken as reading the arguments.
        return (policy.effect() == Effect::Permit).then(|| policy.clone());
    };
    if !json["conditions"].to_string().contains("\"arguments\"") {
        return Some(policy.clone());
    }
    if policy.effect() == Effect::Forbid {
        return None;
    }
    json["conditions"] = Value::Array(Vec::new());
    Policy::from_json(Some(policy.id().clone()), json).ok()
}

/// `policy` turned into a forbid of everything its scope names (its conditions dropped): how
/// a policy that no longer validates takes part, so that it never permits and never fails open.
fn scope_forbid(policy: &Policy) -> Result<Policy, Problem> {
    let fail = |message: String| Problem { line: None, column: None, message };
    let mut json = policy.to_json().map_err(|e| fail(e.to_string()))?;
    json["effect"] = Value::String("forbid".into());
    json["conditions"] = Value::Array(Vec::new());
    Policy::from_json(Some(policy.id().clone()), json).map_err(|e| fail(e.to_string()))
}

struct Names {
    user: EntityTypeName,
    role: EntityTypeName,
    tenant: EntityTypeName,
    server: EntityTypeName,
    tool: EntityTypeName,
    prompt: EntityTypeName,
    resource: EntityTypeName,
    action: EntityTypeName,
}

fn names() -> &'static Names {
    static NAMES: LazyLock<Names> = LazyLock::new(|| {
        let name = |n: &str| EntityTypeName::from_str(n).unwrap_or_else(|e| unreachable!("`{n}` is a type name: {e}"));
        Names {
            user: name(model::USER),
            role: name(model::ROLE),
            tenant: name(model::TENANT),
            server: name(model::SERVER),
            tool: name(model::TOOL),
            prompt: name(model::PROMPT),
            resource: name(model::RESOURCE),
            action: name("Action"),
        }
    });
    &NAMES
}

fn uid(kind: &EntityTypeName, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(kind.clone(), EntityId::new(id))
}

#[cfg(test)]
mod reads {
    use super::*;

    fn reads(text: &str) -> Reads {
        let mut reads = Reads::none();
        reads.add(&parse("p", text).unwrap());
        reads
    }

    fn only(names: &[&str]) -> ArgumentReads {
        ArgumentReads::Only(names.iter().map(|n| (*n).to_owned()).collect())
    }

    #[test]
    fn a_policy_reads_what_it_names() {
        let scope = r#"permit (principal, action == Action::"billing__refund", resource)"#;
        let case = |condition: &str| reads(&format!("{scope} when {{ {condition} }};"));
        assert_eq!(case("context.arguments.amount < 100"), Reads { time: false, arguments: only(&["amount"]) });
        assert_eq!(
            case(r#"context.arguments has note && context.arguments["rate"] == 1"#).arguments,
            only(&["note", "rate"])
        );
        assert_eq!(case("context.arguments.address.city == \"Lyon\"").arguments, only(&["address"]));
        assert_eq!(case("context.time.toTime() < duration(\"1h\")"), Reads { time: true, arguments: only(&[]) });
        assert!(case("context has time").time, "`has time` reads whether it is there");
        assert_eq!(case("context.arguments == {\"amount\": 1}").arguments, ArgumentReads::All, "the record whole");
        assert_eq!(case("context == {}"), Reads::all(), "the context whole");
        assert_eq!(case("principal.subject == \"time\""), Reads::none(), "a string is not a read");
        assert_eq!(reads(&format!("{scope};")), Reads::none());
    }
}
