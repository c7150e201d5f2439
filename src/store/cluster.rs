//! The replicas of one database, as the database knows them: which are alive and where they
//! are reached, which holds which executor agent, and the public keys of every replica's
//! assertion signer. What the rows mean (liveness, relaying, the published key set) is decided
//! in `cluster` and `auth::assertion`; this only stores them.

use sqlx::Row;

use super::{Db, StoreError};

/// A live replica that holds an executor's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHolder {
    pub replica_id: String,
    pub internal_url: String,
    /// The root the agent reported to that replica (a `file:` URI).
    pub root: String,
}

impl Db {
    /// Registers (or re-registers) replica `id`, reached at `url`, alive now.
    pub async fn register_replica(&self, id: &str, url: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, internal_url, started_at, seen_at) VALUES ($1, $2, $3, $3) \
             ON CONFLICT (id) DO UPDATE SET internal_url = excluded.internal_url, seen_at = excluded.seen_at",
        )
        .bind(id)
        .bind(url)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Replica `id` is alive at `now`. `false`: it has no row (another replica purged it after
    /// a long silence); the caller registers again.
    pub async fn replica_seen(&self, id: &str, now: i64) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE replicas SET seen_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Replica `id` stopped: its row and its agents' rows go.
    pub async fn replica_gone(&self, id: &str) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query("DELETE FROM replica_agents WHERE replica_id = $1").bind(id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM replicas WHERE id = $1").bind(id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The URL of replica `id` if it was seen at or after `since`.
    pub async fn live_replica_url(&self, id: &str, since: i64) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar("SELECT internal_url FROM replicas WHERE id = $1 AND seen_at >= $2")
            .bind(id)
            .bind(since)
            .fetch_optional(self.pool())
            .await?)
    }

    /// Deletes the replicas not seen since `before`, with their agents' rows.
    pub async fn purge_replicas(&self, before: i64) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query("DELETE FROM replica_agents WHERE replica_id IN (SELECT id FROM replicas WHERE seen_at < $1)")
            .bind(before)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("DELETE FROM replicas WHERE seen_at < $1").bind(before).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// Executor `executor`'s agent is connected to replica `replica`, with `root`.
    pub async fn agent_held(&self, executor: &str, replica: &str, root: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replica_agents (executor, replica_id, root, connected_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (executor, replica_id) DO UPDATE SET root = excluded.root, connected_at = excluded.connected_at",
        )
        .bind(executor)
        .bind(replica)
        .bind(root)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Executor `executor`'s agent left replica `replica` (the agent connected at or before
    /// `connected_at`: a newer connection's row stays).
    pub async fn agent_released(&self, executor: &str, replica: &str, connected_at: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM replica_agents WHERE executor = $1 AND replica_id = $2 AND connected_at <= $3")
            .bind(executor)
            .bind(replica)
            .bind(connected_at)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// The replicas seen at or after `since` that hold `executor`'s agent, the most recently
    /// connected first.
    pub async fn agent_holders(&self, executor: &str, since: i64) -> Result<Vec<AgentHolder>, StoreError> {
        let rows = sqlx::query(
            "SELECT a.replica_id, r.internal_url, a.root FROM replica_agents a \
             JOIN replicas r ON r.id = a.replica_id \
             WHERE a.executor = $1 AND r.seen_at >= $2 ORDER BY a.connected_at DESC, a.replica_id",
        )
        .bind(executor)
        .bind(since)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AgentHolder {
                    replica_id: row.try_get("replica_id")?,
                    internal_url: row.try_get("internal_url")?,
                    root: row.try_get("root")?,
                })
            })
            .collect()
    }

    /// Every (executor, replica) pair of an agent held by a replica seen at or after `since`,
    /// in order.
    pub async fn agents_held_since(&self, since: i64) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT a.executor, a.replica_id FROM replica_agents a JOIN replicas r ON r.id = a.replica_id \
             WHERE r.seen_at >= $1 ORDER BY a.executor, a.replica_id",
        )
        .bind(since)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(|row| Ok((row.try_get("executor")?, row.try_get("replica_id")?))).collect()
    }

    /// Publishes a signing key's public JWK (`jwk`, JSON) until `until`.
    pub async fn publish_signing_key(
        &self,
        kid: &str,
        jwk: &str,
        replica: &str,
        now: i64,
        until: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO signing_keys (kid, jwk, replica_id, created_at, publish_until) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (kid) DO UPDATE SET publish_until = excluded.publish_until",
        )
        .bind(kid)
        .bind(jwk)
        .bind(replica)
        .bind(now)
        .bind(until)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Keeps key `kid` published until at least `until` (never shortens it).
    pub async fn extend_signing_key(&self, kid: &str, until: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE signing_keys SET publish_until = $2 WHERE kid = $1 AND publish_until < $2")
            .bind(kid)
            .bind(until)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// The JWKs of every key published at `now`, oldest first.
    pub async fn published_signing_keys(&self, now: i64) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar("SELECT jwk FROM signing_keys WHERE publish_until > $1 ORDER BY created_at, kid")
            .bind(now)
            .fetch_all(self.pool())
            .await?)
    }

    /// Deletes keys unpublished since before `before`.
    pub async fn purge_signing_keys(&self, before: i64) -> Result<u64, StoreError> {
        let done =
            sqlx::query("DELETE FROM signing_keys WHERE publish_until < $1").bind(before).execute(self.pool()).await?;
        Ok(done.rows_affected())
    }
}
