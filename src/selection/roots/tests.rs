use proptest::prelude::*;

use super::*;
use crate::decl::PathError as E;
use crate::decl::PathStyle;

fn allowance(n: u128, executor: &str, base: &str, role: Role) -> RootAllowance {
    let id = RootAllowanceId::from_uuid(uuid::Uuid::from_u128(n));
    RootAllowance { id, executor: executor.into(), base: base.into(), role, created_at: 0 }
}

/// The tenant of most cases: it owns `build-01` (POSIX) and `win-01` (Windows); `other-01`
/// is another tenant's (an allowance for it can't be stored, and must not count if it were).
fn tenant() -> (Vec<RootAllowance>, Vec<String>) {
    let allowances = vec![
        allowance(1, "build-01", "file:///srv/plugins", Role::Worker),
        allowance(2, "build-01", "file:///srv/shared", Role::Owner),
        allowance(3, "build-01", "file:///", Role::Auditor),
        // Never written by the store; a base that is not canonical allows nothing.
        allowance(4, "build-01", "file:///srv/odd/", Role::Worker),
        allowance(5, "win-01", "file:///C:/plugins", Role::Owner),
        allowance(6, "win-01", "file://fileserver/plugins/team", Role::Owner),
        allowance(7, "win-01", "file:///C:/", Role::Manager),
        allowance(8, "other-01", "file:///srv", Role::Owner),
    ];
    (allowances, vec!["build-01".into(), "win-01".into()])
}

fn check(roles: &[Role], executor: &str, path: &str) -> Result<AllowedRoot, RootRefusal> {
    let (allowances, owned) = tenant();
    check_root_selection(&allowances, &owned, roles, executor, path)
}

#[test]
fn canonical_uris_are_accepted_as_printed() {
    let rows = [
        ("POSIX", "file:///srv/plugins", PathStyle::Posix),
        ("POSIX root", "file:///", PathStyle::Posix),
        ("encoded space", "file:///srv/my%20dir", PathStyle::Posix),
        ("encoded non-ASCII", "file:///srv/caf%C3%A9", PathStyle::Posix),
        ("a POSIX name `C:`", "file:///C%3A/x", PathStyle::Posix),
        ("drive", "file:///C:/plugins/demo", PathStyle::Windows),
        ("drive root", "file:///C:/", PathStyle::Windows),
        ("UNC share", "file://server/share", PathStyle::Windows),
        ("UNC folder", "file://server.corp/share/x", PathStyle::Windows),
    ];
    for (why, uri, style) in rows {
        assert_eq!(style_of(uri), style, "{why}");
        let parsed = parse_canonical(uri).unwrap_or_else(|e| panic!("{why}: {uri}: {e}"));
        assert_eq!(parsed.to_string(), uri, "{why}");
        assert_eq!(parsed.style(), style, "{why}");
    }
}

#[test]
fn anything_but_the_printed_form_is_refused() {
    type Expect = fn(&E) -> bool;
    let syntax: [(&str, &str, Expect); 14] = [
        ("native POSIX path", "/srv/plugins", |e| matches!(e, E::NativePath { .. })),
        ("native Windows path", "C:\\plugins", |e| matches!(e, E::NativePath { .. })),
        ("native UNC path", "\\\\server\\share", |e| matches!(e, E::NativePath { .. })),
        ("home-relative path", "~/plugins", |e| matches!(e, E::NativePath { .. })),
        ("relative path", "plugins/demo", |e| matches!(e, E::NotFileUri(_))),
        ("other scheme", "https://example.com/srv/plugins", |e| matches!(e, E::NotFileUri(_))),
        ("empty", "", |e| matches!(e, E::NotFileUri(_))),
        ("relative file URI", "file:srv/plugins", |e| matches!(e, E::NotAbsolute)),
        ("encoded slash", "file:///srv/plugins/..%2F..%2Fetc", |e| matches!(e, E::EncodedSeparator(_))),
        ("encoded slash in a name", "file:///srv/a%2fb", |e| matches!(e, E::EncodedSeparator(_))),
        ("query", "file:///srv/plugins?x", |e| matches!(e, E::QueryOrFragment)),
        ("drive-relative", "file:///C:plugins", |e| matches!(e, E::DriveRelative(_))),
        ("Windows device", "file:///C:/plugins/NUL", |e| matches!(e, E::BadName { .. })),
        ("backslash", "file:///C:/plugins\\x", |e| matches!(e, E::Backslash)),
    ];
    for (why, input, expected) in syntax {
        match parse_canonical(input) {
            Err(CanonicalError::Syntax(e)) => assert!(expected(&e), "{why}: {input}: unexpected {e:?}"),
            other => panic!("{why}: {input}: {other:?}"),
        }
    }
    let not_canonical = [
        ("trailing slash", "file:///srv/plugins/", "file:///srv/plugins"),
        ("dot-dot", "file:///srv/plugins/../secret", "file:///srv/secret"),
        ("encoded dot-dot", "file:///srv/plugins/%2E%2E/secret", "file:///srv/secret"),
        ("lower-case encoded dot-dot", "file:///srv/plugins/%2e%2e", "file:///srv"),
        ("dot", "file:///srv/./plugins", "file:///srv/plugins"),
        ("double slash", "file:///srv//plugins", "file:///srv/plugins"),
        ("localhost", "file://localhost/srv/plugins", "file:///srv/plugins"),
        ("one-slash form", "file:/srv/plugins", "file:///srv/plugins"),
        ("upper-case scheme", "FILE:///srv/plugins", "file:///srv/plugins"),
        ("unencoded non-ASCII", "file:///srv/café", "file:///srv/caf%C3%A9"),
        ("lower-case hex", "file:///srv/caf%c3%a9", "file:///srv/caf%C3%A9"),
        ("needlessly encoded letter", "file:///srv/%41", "file:///srv/A"),
        ("unencoded space", "file:///srv/my dir", "file:///srv/my%20dir"),
        ("lower-case drive", "file:///c:/plugins", "file:///C:/plugins"),
        ("drive without slash", "file:///C:", "file:///C:/"),
        ("Windows trailing slash", "file:///C:/plugins/", "file:///C:/plugins"),
        ("upper-case UNC server", "file://SERVER/share/x", "file://server/share/x"),
        ("UNC share with slash", "file://server/share/", "file://server/share"),
        ("dot-dot clamped at the drive", "file:///C:/../Windows", "file:///C:/Windows"),
    ];
    for (why, input, want) in not_canonical {
        match parse_canonical(input) {
            Err(CanonicalError::NotCanonical { given, canonical }) => {
                assert_eq!((given.as_str(), canonical.as_str()), (input, want), "{why}");
                let message = CanonicalError::NotCanonical { given, canonical }.to_string();
                assert!(message.contains(want), "{why}: the refusal names the form to write: {message}");
            }
            other => panic!("{why}: {input}: {other:?}"),
        }
    }
}

#[test]
fn a_root_under_an_allowed_base_is_allowed() {
    let rows: [(&str, &[Role], &str, &str, &str); 10] = [
        ("below the base", &[Role::Worker], "build-01", "file:///srv/plugins/demo", "file:///srv/plugins"),
        ("deep below", &[Role::Worker], "build-01", "file:///srv/plugins/a/b/c", "file:///srv/plugins"),
        ("the base itself", &[Role::Worker], "build-01", "file:///srv/plugins", "file:///srv/plugins"),
        (
            "another of the roles",
            &[Role::Worker, Role::Owner],
            "build-01",
            "file:///srv/shared/x",
            "file:///srv/shared",
        ),
        ("under the POSIX root", &[Role::Auditor], "build-01", "file:///etc/x", "file:///"),
        ("the POSIX root itself", &[Role::Auditor], "build-01", "file:///", "file:///"),
        ("Windows drive", &[Role::Owner], "win-01", "file:///C:/plugins/demo", "file:///C:/plugins"),
        ("UNC", &[Role::Owner], "win-01", "file://fileserver/plugins/team/a", "file://fileserver/plugins/team"),
        ("under a drive root", &[Role::Manager], "win-01", "file:///C:/anything/x", "file:///C:/"),
        ("encoded name", &[Role::Worker], "build-01", "file:///srv/plugins/my%20plugin", "file:///srv/plugins"),
    ];
    for (why, roles, executor, path, base) in rows {
        let allowed = check(roles, executor, path).unwrap_or_else(|e| panic!("{why}: {e}"));
        assert_eq!(allowed.executor, executor, "{why}");
        assert_eq!(allowed.root.to_string(), path, "{why}");
        assert_eq!(allowed.base.to_string(), base, "{why}");
        let (allowances, _) = tenant();
        let used = allowances.iter().find(|a| a.id == allowed.allowance).expect("a known allowance");
        assert!(used.base == base && used.executor == executor && roles.contains(&used.role), "{why}: {used:?}");
    }
}

/// (why, roles, executor, path, field, reason)
type Refused = (&'static str, &'static [Role], &'static str, &'static str, &'static str, &'static str);

#[test]
fn every_refusal_names_its_field_and_reason() {
    let worker: &[Role] = &[Role::Worker];
    let owner: &[Role] = &[Role::Owner];
    let rows: [Refused; 30] = [
        // The path's form.
        ("native POSIX path", worker, "build-01", "/srv/plugins/demo", "path", "not_file_uri"),
        ("native Windows path", owner, "win-01", "C:\\plugins\\demo", "path", "not_file_uri"),
        ("relative path", worker, "build-01", "plugins/demo", "path", "not_file_uri"),
        ("other scheme", worker, "build-01", "http://build-01/srv/plugins/demo", "path", "not_file_uri"),
        ("encoded slash", worker, "build-01", "file:///srv/plugins/a%2F..%2F..%2Fetc", "path", "not_file_uri"),
        ("trailing slash", worker, "build-01", "file:///srv/plugins/demo/", "path", "not_canonical"),
        ("dot-dot out of the base", worker, "build-01", "file:///srv/plugins/../secret", "path", "not_canonical"),
        ("dot-dot inside the base", worker, "build-01", "file:///srv/plugins/a/../b", "path", "not_canonical"),
        ("encoded dot-dot", worker, "build-01", "file:///srv/plugins/%2E%2E/secret", "path", "not_canonical"),
        ("lower-case drive", owner, "win-01", "file:///c:/plugins/demo", "path", "not_canonical"),
        ("the form is checked first", worker, "nowhere", "/srv/plugins", "path", "not_file_uri"),
        // The executor.
        ("unknown executor", worker, "nowhere", "file:///srv/plugins/demo", "executor", "executor_not_owned"),
        ("another tenant's executor", owner, "other-01", "file:///srv/x", "executor", "executor_not_owned"),
        ("the gateway host", worker, "local", "file:///srv/plugins/demo", "executor", "executor_not_owned"),
        ("executor names are exact", worker, "Build-01", "file:///srv/plugins/demo", "executor", "executor_not_owned"),
        // The roles.
        ("no roles (a system actor)", &[], "build-01", "file:///srv/plugins/demo", "executor", "no_allowance"),
        (
            "a role with no allowance there",
            &[Role::Auditor],
            "win-01",
            "file:///C:/plugins/x",
            "executor",
            "no_allowance",
        ),
        (
            "allowances are per executor",
            &[Role::Manager],
            "build-01",
            "file:///srv/plugins/x",
            "executor",
            "no_allowance",
        ),
        // Containment.
        ("shared name prefix", worker, "build-01", "file:///srv/plugins2", "path", "outside_allowed_bases"),
        ("shared name prefix below", worker, "build-01", "file:///srv/plugins2/demo", "path", "outside_allowed_bases"),
        ("the base's parent", worker, "build-01", "file:///srv", "path", "outside_allowed_bases"),
        (
            "POSIX names are case-sensitive",
            worker,
            "build-01",
            "file:///srv/Plugins/demo",
            "path",
            "outside_allowed_bases",
        ),
        ("another role's base", worker, "build-01", "file:///srv/shared/x", "path", "outside_allowed_bases"),
        (
            "a stored base that is not canonical",
            worker,
            "build-01",
            "file:///srv/odd/x",
            "path",
            "outside_allowed_bases",
        ),
        ("Windows names compare exactly", owner, "win-01", "file:///C:/Plugins/demo", "path", "outside_allowed_bases"),
        ("another drive", owner, "win-01", "file:///D:/plugins/demo", "path", "outside_allowed_bases"),
        ("another UNC folder", owner, "win-01", "file://fileserver/plugins/teamx", "path", "outside_allowed_bases"),
        ("another UNC server", owner, "win-01", "file://other/plugins/team/a", "path", "outside_allowed_bases"),
        (
            "a UNC share is never under a drive",
            &[Role::Manager],
            "win-01",
            "file://server/share/x",
            "path",
            "outside_allowed_bases",
        ),
        (
            "Windows is never under the POSIX root",
            &[Role::Auditor],
            "build-01",
            "file:///C:/x",
            "path",
            "outside_allowed_bases",
        ),
    ];
    for (why, roles, executor, path, field, reason) in rows {
        let refusal = check(roles, executor, path).expect_err(why);
        assert_eq!((refusal.field(), refusal.reason()), (field, reason), "{why}: {refusal}");
        let message = refusal.to_string();
        // A malformed URI is named by the part at fault (a native path by itself).
        let named = if field == "executor" { executor } else { path };
        assert!(reason == "not_file_uri" || message.contains(named), "{why}: `{message}` names the {field}");
    }
}

#[test]
fn nothing_is_allowed_without_allowances_or_ownership() {
    let (allowances, owned) = tenant();
    let path = "file:///srv/plugins/demo";
    assert!(check_root_selection(&allowances, &owned, &[Role::Worker], "build-01", path).is_ok());
    let refused = check_root_selection(&[], &owned, &Role::ALL, "build-01", path).unwrap_err();
    assert_eq!(refused.reason(), "no_allowance");
    let refused = check_root_selection(&allowances, &[], &Role::ALL, "build-01", path).unwrap_err();
    assert_eq!(refused.reason(), "executor_not_owned");
}

/// Names that exercise traversal, encoding and prefixes.
fn atom() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "plugins", "plugins2", "Plugins", "demo", "..", ".", "", "%2E%2E", "%2e%2e", "%2E.", "%2F", "%2f..", "%5C",
        "a%20b", "a b", "C:", "c:", "%41", "x", "srv", "srv", "team",
    ])
}

fn requested() -> impl Strategy<Value = String> {
    let prefix = prop::sample::select(vec![
        "file://",
        "file:",
        "file://localhost",
        "file:///C:",
        "file://server",
        "file://fileserver",
    ]);
    (prefix, prop::collection::vec(atom(), 0..6), prop::bool::ANY).prop_map(|(prefix, atoms, slash)| {
        let mut s = format!("{prefix}/{}", atoms.join("/"));
        if slash {
            s.push('/');
        }
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever is asked for, an allowed root is the requested string exactly, and lies under
    /// its base as plain text: the base itself or the base followed by `/` and more.
    #[test]
    fn an_allowed_root_is_textually_under_its_base(path in requested()) {
        for roles in [&[Role::Worker][..], &[Role::Owner], &[Role::Auditor], &[Role::Manager]] {
            for executor in ["build-01", "win-01"] {
                if let Ok(allowed) = check(roles, executor, &path) {
                    let base = allowed.base.to_string();
                    prop_assert_eq!(allowed.root.to_string(), path.clone());
                    let under = if base.ends_with('/') { path.starts_with(&base) } else {
                        path == base || path.starts_with(&format!("{base}/"))
                    };
                    prop_assert!(under, "{} allowed under {}", path, base);
                    prop_assert!(!path.contains("..") && !path.to_ascii_lowercase().contains("%2e"), "{}", path);
                }
            }
        }
    }
}
