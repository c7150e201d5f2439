//! Who may select which plugin root: the pure decision over a tenant's root allowances; never reads a database, a filesystem or an executor.
//!
//! A session may select plugin roots (`{ "executor": NAME, "path": "file:///..." }`) whose
//! `.mcp.json` is read, and whose servers run, on that executor. That runs code on a machine,
//! so it is allowed explicitly, per tenant, executor, base folder and role
//! (`scopegate admin root allow`), and everything else is refused.
//!
//! It lives here, beside [`PathUri`], because it is path logic: the store calls
//! [`parse_canonical`] to check a base before writing it, and the session code calls
//! [`check_root_selection`] with the rows the store read, so both sides share one definition of
//! a canonical root and of containment.
//!
//! Rules:
//! - **Canonical means as printed.** A root or base must be a `file:` URI equal, byte for byte, to
//!   [`PathUri`]'s own printing of it. So `file:///srv/a/`, `file:///srv/a/../b`,
//!   `file:///srv/%2E%2E/b`, `file://localhost/srv`, `file:///c:/x` (lower-case drive),
//!   `file://SERVER/share`, `file:///srv/caf%c3%a9` (lower-case hex) and `file:///srv/café`
//!   (unencoded) are refused, each naming the form to write instead. Nothing is normalized on
//!   the caller's behalf: what is checked is exactly what was asked for.
//! - **The convention comes from the URI.** A drive letter (`file:///C:/...`) or a server
//!   (`file://server/share/...`) makes it Windows, anything else POSIX (as for the root an
//!   agent reports). On canonical URIs this is unambiguous: a POSIX name `C:` prints as `C%3A`,
//!   and a POSIX URI never names a host. Whether the executor really uses that convention is
//!   the caller's to check against the root its agent reported.
//! - **Containment is lexical, name by name** ([`PathUri::contains`]): `file:///srv/plugins2`
//!   is not under `file:///srv/plugins`; `..` can't appear (it is not canonical) and `%2F`
//!   inside a name is refused; drive letters are upper-case, UNC servers lower-case, folder
//!   names compare exactly; a UNC share is never under a drive, nor POSIX under Windows.
//! - **Order of the checks:** the path's form, then the executor (one the tenant owns; an
//!   unknown executor and another tenant's answer alike, so nothing is learnt about other
//!   tenants), then an allowance on that executor for one of the caller's roles, then
//!   containment in one of those allowances' bases. No roles (a system actor) allow nothing.

use crate::decl::PathUri;
pub use crate::decl::canonical::{CanonicalError, parse_canonical, style_of};
use crate::model::Role;
use crate::store::RootAllowanceId;
use crate::store::roots::RootAllowance;

/// A root a session may select, and the allowance that lets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedRoot {
    /// The executor's name.
    pub executor: String,
    /// The selected root (its printing is the requested string).
    pub root: PathUri,
    /// The first allowance (in the order given) whose base contains the root.
    pub allowance: RootAllowanceId,
    /// That allowance's base.
    pub base: PathUri,
}

/// Why a root selection is refused. [`RootRefusal::field`] names the request field at fault;
/// [`RootRefusal::reason`] is a stable word for audit and metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootRefusal {
    #[error("{0}")]
    Path(CanonicalError),
    /// Unknown, local, or owned by other tenants only: answered alike.
    #[error("`{0}` is not an executor of this tenant")]
    Executor(String),
    #[error("none of the caller's roles may select roots on executor `{0}`")]
    NoAllowance(String),
    #[error("`{path}` is not under any base the caller's roles may select on executor `{executor}`")]
    Outside { executor: String, path: String },
}

impl RootRefusal {
    /// `executor` or `path`.
    pub fn field(&self) -> &'static str {
        match self {
            RootRefusal::Path(_) | RootRefusal::Outside { .. } => "path",
            RootRefusal::Executor(_) | RootRefusal::NoAllowance(_) => "executor",
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            RootRefusal::Path(CanonicalError::Syntax(_)) => "not_file_uri",
            RootRefusal::Path(CanonicalError::NotCanonical { .. }) => "not_canonical",
            RootRefusal::Executor(_) => "executor_not_owned",
            RootRefusal::NoAllowance(_) => "no_allowance",
            RootRefusal::Outside { .. } => "outside_allowed_bases",
        }
    }
}

/// Decides whether a caller with `roles` may select `path` on `executor`.
///
/// `allowances` are the tenant's (any executor; only `executor`'s are used), `owned` the names
/// of the executors the tenant owns. Both come from the store for the caller's tenant only. A
/// stored base that is not canonical (the store never writes one) allows nothing.
pub fn check_root_selection(
    allowances: &[RootAllowance],
    owned: &[String],
    roles: &[Role],
    executor: &str,
    path: &str,
) -> Result<AllowedRoot, RootRefusal> {
    let root = parse_canonical(path).map_err(RootRefusal::Path)?;
    if !owned.iter().any(|name| name == executor) {
        return Err(RootRefusal::Executor(executor.to_owned()));
    }
    let mut mine = allowances.iter().filter(|a| a.executor == executor && roles.contains(&a.role)).peekable();
    if mine.peek().is_none() {
        return Err(RootRefusal::NoAllowance(executor.to_owned()));
    }
    for allowance in mine {
        let Ok(base) = parse_canonical(&allowance.base) else {
            tracing::warn!(allowance = %allowance.id, "a stored root allowance is not canonical: it allows nothing");
            continue;
        };
        if base.contains(&root) {
            return Ok(AllowedRoot { executor: executor.to_owned(), root, allowance: allowance.id, base });
        }
    }
    Err(RootRefusal::Outside { executor: executor.to_owned(), path: path.to_owned() })
}

#[cfg(test)]
mod tests;
