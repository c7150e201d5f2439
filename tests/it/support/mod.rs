//! Test support, shared by the feature files (which hold tests only): fresh databases and
//! configuration ([`db`]), tokens ([`tokens`]), the one gateway builder ([`gateway`]) and the
//! probe gateway ([`probe`]), MCP clients ([`clients`]), fixture upstreams ([`fixtures`],
//! [`oauth`]), a real identity provider and third-party OAuth clients ([`idp`]), the pinned
//! third-party installs ([`installs`]), the `scopegate` binary as a process ([`process`]),
//! network namespaces ([`netns`]), remote executors ([`remote`]), the proxy's set-up
//! ([`proxy`]), the workspace's own files ([`files`]), and waiting for something to happen
//! ([`wait`]).

pub mod browser;
pub mod clients;
pub mod db;
pub mod files;
pub mod fixtures;
pub mod gateway;
pub mod idp;
pub mod installs;
pub mod netns;
pub mod oauth;
pub mod probe;
pub mod process;
pub mod proxy;
pub mod remote;
pub mod tokens;
pub mod wait;

pub use browser::*;
pub use clients::*;
pub use db::*;
pub use files::*;
pub use fixtures::*;
pub use gateway::*;
pub use idp::{ClientRun, Idp, IdpOptions, run_py_client, run_ts_client};
pub use netns::*;
pub use oauth::{OAuthFixtures, form};
pub use probe::*;
pub use process::*;
pub use proxy::*;
pub use remote::*;
pub use tokens::*;
pub use wait::*;

/// Runs an async test body once per database: `both_dbs!(name, body_fn)` defines
/// `name::sqlite` and `name::postgres`.
macro_rules! both_dbs {
    ($name:ident, $body:path) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $body(crate::support::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $body(crate::support::Backend::Postgres).await
            }
        }
    };
}

/// `all_modes!(name, body)`: `name::{sqlite,postgres}_{session,stateless}`.
macro_rules! all_modes {
    ($name:ident, $body:path) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_session() {
                $body(crate::support::Backend::Sqlite, crate::support::Mode::Session).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_stateless() {
                $body(crate::support::Backend::Sqlite, crate::support::Mode::Stateless).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_session() {
                $body(crate::support::Backend::Postgres, crate::support::Mode::Session).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_stateless() {
                $body(crate::support::Backend::Postgres, crate::support::Mode::Stateless).await
            }
        }
    };
}

/// Runs one administrative function in its own transaction.
macro_rules! admin_tx {
    ($db:expr, |$tx:ident| $body:expr) => {{
        let mut $tx = $db.begin().await.expect("begin");
        let out = $body.await;
        if out.is_ok() {
            $tx.commit().await.expect("commit");
        }
        out
    }};
}
