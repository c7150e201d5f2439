//! The token vault: upstream OAuth credentials of a tenant (or of one of its users) per server,
//! sealed with AES-256-GCM; never logs, prints or returns a credential except to its caller.
//!
//! Each row is sealed under a fresh random nonce with associated data naming its owner (tenant,
//! user or none, server), so a ciphertext copied into another tenant's, user's or server's row
//! fails to open instead of handing one owner's token to another. A row sealed under another
//! key, or one that fails authentication, is an error, never garbage. Errors and `Debug` output
//! name the owner and key ids only: no plaintext, no key bytes.
//!
//! The key is 32 random bytes, written in its file as standard base64 (44 characters, as
//! `scopegate admin oauth keygen` prints it). Its id is the first 8 hex digits of its SHA-256.
//! The vault lives beside the other SQL in `store`, since it is the only code that reads or
//! writes `oauth_credentials`.

use std::fmt;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::Serialize;
use sqlx::{AnyConnection, Row};
use uuid::Uuid;

use super::entities::validate_server_id;
use super::{Db, StoreError, TenantId, UserId, now_millis};
use crate::vocab::digest::sha256_hex;

/// Length of a key in bytes.
pub const KEY_LEN: usize = 32;

/// Associated data starts with this, so a sealed credential is never valid as anything else.
const AAD_CONTEXT: &str = "scopegate oauth credential v1";

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A key file that can't be read or does not hold a key; `name` is the configuration key or
    /// flag that named it.
    #[error("`{name}`: {message}")]
    Key { name: &'static str, message: String },
    /// Start-up or an operation found rows the configured key can't open.
    #[error("{0}")]
    KeyMismatch(String),
    /// A row under the right key id that fails authentication (tampered with, or moved from
    /// another owner's row).
    #[error("the credential of {owner} does not decrypt (altered, or not sealed for this owner)")]
    Undecryptable { owner: String },
    #[error("sealing a credential failed")]
    Seal,
}

impl From<sqlx::Error> for VaultError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Sql(e))
    }
}

/// An AEAD key with its id. `Debug` shows the id only.
pub struct VaultKey {
    key: LessSafeKey,
    id: String,
}

impl fmt::Debug for VaultKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VaultKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl VaultKey {
    /// A key from the text of a key file: 32 bytes in standard base64, surrounding whitespace
    /// ignored. `name` (a configuration key or a flag) is named in the error.
    pub fn parse(text: &str, name: &'static str) -> Result<Self, VaultError> {
        let refuse = || VaultError::Key {
            name,
            message: format!(
                "the key file must hold {KEY_LEN} random bytes as standard base64 (44 characters), \
                 as `scopegate admin oauth keygen` prints them"
            ),
        };
        // The standard engine requires the padding, and exactly 32 bytes must come out.
        let bytes = STANDARD.decode(text.trim()).map_err(|_| refuse())?;
        let bytes: [u8; KEY_LEN] = bytes.try_into().map_err(|_| refuse())?;
        Self::from_bytes(&bytes)
    }

    /// Reads and parses the key file at `path`; `name` is named in any error.
    pub fn load(path: &Path, name: &'static str) -> Result<Self, VaultError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| VaultError::Key { name, message: format!("{}: {e}", path.display()) })?;
        Self::parse(&text, name)
    }

    /// The key the configuration names: `upstream.token_key_file`, or the environment variable
    /// named by `upstream.token_key_env`; `None` when neither is set. Both set, a variable
    /// that is not set, or a malformed key: refused, naming the setting.
    pub fn from_config(config: &crate::config::UpstreamConfig) -> Result<Option<Self>, VaultError> {
        match (config.token_key_file.as_str(), config.token_key_env.as_str()) {
            ("", "") => Ok(None),
            (path, "") => Self::load(Path::new(path), "upstream.token_key_file").map(Some),
            ("", var) => {
                let name = "upstream.token_key_env";
                let text = std::env::var(var)
                    .map_err(|_| VaultError::Key { name, message: format!("the variable {var:?} is not set") })?;
                Self::parse(&text, name).map(Some)
            }
            _ => Err(VaultError::Key {
                name: "upstream.token_key_env",
                message: "set upstream.token_key_file or upstream.token_key_env, not both".to_owned(),
            }),
        }
    }

    fn from_bytes(bytes: &[u8; KEY_LEN]) -> Result<Self, VaultError> {
        let key = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| VaultError::Seal)?;
        let id = crate::vocab::digest::sha256_hex(bytes)[..8].to_owned();
        Ok(Self { key: LessSafeKey::new(key), id })
    }

    /// A new random key, encoded as a key file holds it.
    pub fn generate() -> Result<String, VaultError> {
        let mut bytes = [0u8; KEY_LEN];
        SystemRandom::new().fill(&mut bytes).map_err(|_| VaultError::Seal)?;
        Ok(STANDARD.encode(bytes))
    }

    /// The first 8 hex digits of the key's SHA-256.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn seal(&self, owner: &Owner<'_>, plaintext: &[u8]) -> Result<(String, String), VaultError> {
        self.seal_with(owner.aad(), plaintext)
    }

    fn seal_with(&self, aad: Vec<u8>, plaintext: &[u8]) -> Result<(String, String), VaultError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).map_err(|_| VaultError::Seal)?;
        let mut sealed = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut sealed)
            .map_err(|_| VaultError::Seal)?;
        Ok((STANDARD.encode(nonce), STANDARD.encode(sealed)))
    }

    fn open(&self, owner: &Owner<'_>, nonce: &str, sealed: &str) -> Result<Vec<u8>, VaultError> {
        self.open_with(owner.aad(), nonce, sealed).map_err(|()| VaultError::Undecryptable { owner: owner.to_string() })
    }

    fn open_with(&self, aad: Vec<u8>, nonce: &str, sealed: &str) -> Result<Vec<u8>, ()> {
        let nonce: [u8; NONCE_LEN] = STANDARD.decode(nonce).map_err(drop)?.try_into().map_err(drop)?;
        let mut sealed = STANDARD.decode(sealed).map_err(drop)?;
        let plain =
            self.key.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut sealed).map_err(drop)?;
        Ok(plain.to_vec())
    }
}

/// An insert's error, a missing tenant or user (a foreign key) named as such.
fn no_owner(e: sqlx::Error, owner: &Owner<'_>) -> VaultError {
    match &e {
        sqlx::Error::Database(db) if db.is_foreign_key_violation() => {
            VaultError::Store(StoreError::NotFound(format!("no such owner: {owner}")))
        }
        _ => e.into(),
    }
}

/// Whose credential a row is.
struct Owner<'a> {
    tenant: TenantId,
    server: &'a str,
    user: Option<UserId>,
}

impl Owner<'_> {
    /// Tenant and user are fixed-width UUIDs (or `-`), and the server comes last, so no two
    /// owners share associated data.
    fn aad(&self) -> Vec<u8> {
        let user = self.user.map_or_else(|| "-".to_owned(), |u| u.to_string());
        format!("{AAD_CONTEXT}\n{}\n{user}\n{}", self.tenant, self.server).into_bytes()
    }
}

impl fmt::Display for Owner<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.user {
            Some(user) => write!(f, "user {user} of tenant {} for server `{}`", self.tenant, self.server),
            None => write!(f, "tenant {} for server `{}`", self.tenant, self.server),
        }
    }
}

/// Whether a stored credential is usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialStatus {
    Ok,
    /// A refresh failed: someone must log in again.
    LoginNeeded,
}

impl CredentialStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::LoginNeeded => "login_needed",
        }
    }

    fn parse(value: &str) -> Result<Self, VaultError> {
        match value {
            "ok" => Ok(Self::Ok),
            "login_needed" => Ok(Self::LoginNeeded),
            other => Err(StoreError::Invalid { field: "status", message: format!("`{other}` in the database") }.into()),
        }
    }
}

/// One stored credential, described without its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CredentialInfo {
    pub server: String,
    /// `None`: the tenant's credential for the server.
    pub user: Option<UserId>,
    /// The user's subject, for a user's own credential.
    pub subject: Option<String>,
    pub status: CredentialStatus,
    /// Milliseconds since the Unix epoch.
    pub updated_at: i64,
}

/// Reads and writes credentials under one key. `Debug` shows the key id only.
#[derive(Debug)]
pub struct TokenVault {
    db: Db,
    key: VaultKey,
}

/// Matches the owner's row: `$1` tenant, `$2` server, `$3` user id or ''.
macro_rules! owner_row {
    () => {
        "tenant_id = $1 AND server = $2 AND COALESCE(user_id, '') = $3"
    };
}

/// The refresh lease's name for a credential: tenant id, server and user id ('' for the
/// tenant's), apart by `/`, which neither ids nor server names hold.
fn lease_key(tenant: TenantId, server: &str, user: Option<UserId>) -> String {
    format!("{tenant}/{server}/{}", user_text(user))
}

fn user_text(user: Option<UserId>) -> String {
    user.map(|u| u.to_string()).unwrap_or_default()
}

/// The owner of a credential, its server name checked as a binding's is.
fn checked_owner<'a>(tenant: TenantId, server: &'a str, user: Option<UserId>) -> Result<Owner<'a>, VaultError> {
    validate_server_id(server)?;
    Ok(Owner { tenant, server, user })
}

impl TokenVault {
    pub fn new(db: Db, key: VaultKey) -> Self {
        Self { db, key }
    }

    pub fn key_id(&self) -> &str {
        self.key.id()
    }

    /// Stores (or replaces) the credential of the owner and marks it usable. The tenant, and
    /// the user when given, must exist (the user in that tenant).
    pub async fn put(
        &self,
        tenant: TenantId,
        server: &str,
        user: Option<UserId>,
        plaintext: &[u8],
    ) -> Result<(), VaultError> {
        let owner = checked_owner(tenant, server, user)?;
        let (nonce, sealed) = self.key.seal(&owner, plaintext)?;
        let mut tx = self.db.begin().await?;
        let now = now_millis();
        let updated = sqlx::query(concat!(
            "UPDATE oauth_credentials SET key_id = $4, nonce = $5, ciphertext = $6, status = 'ok', \
             updated_at = $7 WHERE ",
            owner_row!()
        ))
        .bind(tenant)
        .bind(server)
        .bind(user_text(user))
        .bind(self.key.id())
        .bind(&nonce)
        .bind(&sealed)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() == 0 {
            sqlx::query(
                "INSERT INTO oauth_credentials \
                 (id, tenant_id, server, user_id, key_id, nonce, ciphertext, status, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'ok', $8)",
            )
            .bind(Uuid::now_v7().to_string())
            .bind(tenant)
            .bind(server)
            .bind(user)
            .bind(self.key.id())
            .bind(&nonce)
            .bind(&sealed)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(|e| no_owner(e, &owner))?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The owner's credential, opened; `None` when there is none. It is returned whatever its
    /// status (see [`TokenVault::status`]). Only the owner's own row is read: a user's
    /// credential is never returned for the tenant or another user, nor the tenant's for a user.
    pub async fn get(
        &self,
        tenant: TenantId,
        server: &str,
        user: Option<UserId>,
    ) -> Result<Option<Vec<u8>>, VaultError> {
        let owner = checked_owner(tenant, server, user)?;
        let mut conn = self.db.pool().acquire().await?;
        let row = sqlx::query(concat!("SELECT key_id, nonce, ciphertext FROM oauth_credentials WHERE ", owner_row!()))
            .bind(tenant)
            .bind(server)
            .bind(user_text(user))
            .fetch_optional(&mut *conn)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let key_id: String = row.try_get("key_id")?;
        if key_id != self.key.id() {
            return Err(VaultError::KeyMismatch(format!(
                "the credential of {owner} is sealed under key {key_id}, not the configured key {} \
                 (upstream.token_key_file)",
                self.key.id()
            )));
        }
        let nonce: String = row.try_get("nonce")?;
        let sealed: String = row.try_get("ciphertext")?;
        self.key.open(&owner, &nonce, &sealed).map(Some)
    }

    /// Marks the owner's credential as needing a new login. False when there is none.
    pub async fn mark_login_needed(
        &self,
        tenant: TenantId,
        server: &str,
        user: Option<UserId>,
    ) -> Result<bool, VaultError> {
        checked_owner(tenant, server, user)?;
        let mut tx = self.db.begin().await?;
        let done = sqlx::query(concat!(
            "UPDATE oauth_credentials SET status = 'login_needed', updated_at = $4 WHERE ",
            owner_row!()
        ))
        .bind(tenant)
        .bind(server)
        .bind(user_text(user))
        .bind(now_millis())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    /// The status of the owner's credential; `None` when there is none.
    pub async fn status(
        &self,
        tenant: TenantId,
        server: &str,
        user: Option<UserId>,
    ) -> Result<Option<CredentialStatus>, VaultError> {
        checked_owner(tenant, server, user)?;
        let status: Option<String> =
            sqlx::query_scalar(concat!("SELECT status FROM oauth_credentials WHERE ", owner_row!()))
                .bind(tenant)
                .bind(server)
                .bind(user_text(user))
                .fetch_optional(self.db.pool())
                .await?;
        status.as_deref().map(CredentialStatus::parse).transpose()
    }

    /// Deletes the owner's credential (logout). False when there was none.
    pub async fn delete(&self, tenant: TenantId, server: &str, user: Option<UserId>) -> Result<bool, VaultError> {
        let mut tx = self.db.begin().await?;
        let deleted = delete_on(&mut tx, tenant, server, user).await?;
        tx.commit().await?;
        Ok(deleted)
    }

    /// The tenant's credentials, described (never their content), by server, tenant's first.
    pub async fn list(&self, tenant: TenantId) -> Result<Vec<CredentialInfo>, VaultError> {
        let mut conn = self.db.pool().acquire().await?;
        list_on(&mut conn, tenant).await
    }
}

/// How long a login's start link is good.
pub const LOGIN_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// [`TokenVault::create_login`] inside the caller's transaction (no key is needed to ask for a
/// login: the start link's secret is random, and only its digest is stored).
pub async fn create_login_on(
    conn: &mut sqlx::AnyConnection,
    tenant: TenantId,
    server: &str,
    user: Option<UserId>,
    ttl: std::time::Duration,
) -> Result<String, VaultError> {
    let owner = checked_owner(tenant, server, user)?;
    let mut secret = [0u8; 32];
    SystemRandom::new().fill(&mut secret).map_err(|_| VaultError::Seal)?;
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    let now = now_millis();
    let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    // Logins nobody finished are forgotten as new ones are made.
    sqlx::query("DELETE FROM oauth_logins WHERE expires_at < $1").bind(now).execute(&mut *conn).await?;
    sqlx::query(
        "INSERT INTO oauth_logins (id, tenant_id, server, user_id, expires_at, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(sha256_hex(secret.as_bytes()))
    .bind(tenant)
    .bind(server)
    .bind(user)
    .bind(now.saturating_add(ttl))
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(|e| no_owner(e, &owner))?;
    Ok(secret)
}

/// [`TokenVault::delete`] inside the caller's transaction.
pub async fn delete_on(
    conn: &mut sqlx::AnyConnection,
    tenant: TenantId,
    server: &str,
    user: Option<UserId>,
) -> Result<bool, VaultError> {
    checked_owner(tenant, server, user)?;
    let done = sqlx::query(concat!("DELETE FROM oauth_credentials WHERE ", owner_row!()))
        .bind(tenant)
        .bind(server)
        .bind(user_text(user))
        .execute(conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// [`TokenVault::list`] on the caller's connection.
pub async fn list_on(conn: &mut sqlx::AnyConnection, tenant: TenantId) -> Result<Vec<CredentialInfo>, VaultError> {
    let rows = sqlx::query(
        "SELECT c.server, c.user_id, u.subject, c.status, c.updated_at FROM oauth_credentials c \
         LEFT JOIN users u ON u.id = c.user_id AND u.tenant_id = c.tenant_id \
         WHERE c.tenant_id = $1 ORDER BY c.server, COALESCE(u.subject, '')",
    )
    .bind(tenant)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            let status: String = row.try_get("status")?;
            Ok(CredentialInfo {
                server: row.try_get("server")?,
                user: row.try_get("user_id")?,
                subject: row.try_get("subject")?,
                status: CredentialStatus::parse(&status)?,
                updated_at: row.try_get("updated_at")?,
            })
        })
        .collect()
}

/// A login asked for and not yet started, as its start link finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingLogin {
    /// The SHA-256 (hex) of the link's secret.
    pub id: String,
    pub tenant: TenantId,
    pub server: String,
    /// `None`: the login is for the tenant's credential.
    pub user: Option<UserId>,
}

/// A started login, taken (deleted) by the callback that presented its `state`.
pub struct TakenLogin {
    pub tenant: TenantId,
    pub server: String,
    pub user: Option<UserId>,
    /// The OAuth client the login was started with.
    pub client_id: String,
    /// What the start sealed (the PKCE state), opened.
    pub state: Vec<u8>,
}

impl fmt::Debug for TakenLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TakenLogin").field("tenant", &self.tenant).field("server", &self.server).finish_non_exhaustive()
    }
}

/// Associated data of a login's sealed state: its row and owner, so it opens only there.
fn login_aad(id: &str, owner: &Owner<'_>) -> Vec<u8> {
    let mut aad = b"scopegate oauth login v1\n".to_vec();
    aad.extend_from_slice(id.as_bytes());
    aad.push(b'\n');
    aad.extend_from_slice(&owner.aad());
    aad
}

impl TokenVault {
    /// Records a login for the owner and returns the secret of its start link, good once until
    /// `ttl` has passed. The tenant, and the user when given, must exist.
    pub async fn create_login(
        &self,
        tenant: TenantId,
        server: &str,
        user: Option<UserId>,
        ttl: std::time::Duration,
    ) -> Result<String, VaultError> {
        let mut tx = self.db.begin().await?;
        let secret = create_login_on(&mut tx, tenant, server, user, ttl).await?;
        tx.commit().await?;
        Ok(secret)
    }

    /// The login whose start link holds `secret`, if it is not expired and not yet started.
    pub async fn pending_login(&self, secret: &str) -> Result<Option<PendingLogin>, VaultError> {
        let row = sqlx::query(
            "SELECT id, tenant_id, server, user_id FROM oauth_logins \
             WHERE id = $1 AND state_hash IS NULL AND expires_at >= $2",
        )
        .bind(sha256_hex(secret.as_bytes()))
        .bind(now_millis())
        .fetch_optional(self.db.pool())
        .await?;
        row.map(|row| {
            Ok(PendingLogin {
                id: row.try_get("id")?,
                tenant: row.try_get("tenant_id")?,
                server: row.try_get("server")?,
                user: row.try_get("user_id")?,
            })
        })
        .transpose()
    }

    /// Starts `login`: records the OAuth `state` sent to the authorization server (hashed), the
    /// client, and `sealed` (sealed for this login's row and owner). False when the login was
    /// started already or has expired: a start link is good once.
    pub async fn start_login(
        &self,
        login: &PendingLogin,
        state: &str,
        client_id: &str,
        sealed: &[u8],
    ) -> Result<bool, VaultError> {
        let owner = checked_owner(login.tenant, &login.server, login.user)?;
        let (nonce, ciphertext) = self.key.seal_with(login_aad(&login.id, &owner), sealed)?;
        let mut tx = self.db.begin().await?;
        let done = sqlx::query(
            "UPDATE oauth_logins SET state_hash = $2, client_id = $3, key_id = $4, nonce = $5, ciphertext = $6 \
             WHERE id = $1 AND state_hash IS NULL AND expires_at >= $7",
        )
        .bind(&login.id)
        .bind(sha256_hex(state.as_bytes()))
        .bind(client_id)
        .bind(self.key.id())
        .bind(nonce)
        .bind(ciphertext)
        .bind(now_millis())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Takes the started login whose OAuth `state` this is: deletes it and returns it when it
    /// has not expired. `None` for a `state` never issued, already used or expired: a `state`
    /// completes one login, once.
    pub async fn take_login(&self, state: &str) -> Result<Option<TakenLogin>, VaultError> {
        let mut tx = self.db.begin().await?;
        let row = sqlx::query(
            "DELETE FROM oauth_logins WHERE state_hash = $1 \
             RETURNING id, tenant_id, server, user_id, client_id, key_id, nonce, ciphertext, expires_at",
        )
        .bind(sha256_hex(state.as_bytes()))
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        let Some(row) = row else { return Ok(None) };
        let expires_at: i64 = row.try_get("expires_at")?;
        if expires_at < now_millis() {
            return Ok(None);
        }
        let (id, server): (String, String) = (row.try_get("id")?, row.try_get("server")?);
        let owner = Owner { tenant: row.try_get("tenant_id")?, server: &server, user: row.try_get("user_id")? };
        let key_id: Option<String> = row.try_get("key_id")?;
        if key_id.as_deref() != Some(self.key.id()) {
            return Err(VaultError::KeyMismatch(format!("a login of {owner} was started under another key")));
        }
        let nonce: String = row.try_get("nonce")?;
        let ciphertext: String = row.try_get("ciphertext")?;
        let state = self
            .key
            .open_with(login_aad(&id, &owner), &nonce, &ciphertext)
            .map_err(|()| VaultError::Undecryptable { owner: owner.to_string() })?;
        let (tenant, user) = (owner.tenant, owner.user);
        Ok(Some(TakenLogin { tenant, server: server.clone(), user, client_id: row.try_get("client_id")?, state }))
    }

    /// Takes the refresh lease of the owner's credential for `holder` until `ttl` from now, if
    /// no other holder has an unexpired one. `true`: held.
    pub async fn try_refresh_lease(
        &self,
        tenant: TenantId,
        server: &str,
        user: Option<UserId>,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, VaultError> {
        checked_owner(tenant, server, user)?;
        let now = now_millis();
        let until = now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        let mut tx = self.db.begin().await?;
        let done = sqlx::query(
            "INSERT INTO oauth_refresh_leases (owner_key, holder, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (owner_key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE oauth_refresh_leases.expires_at < $4",
        )
        .bind(lease_key(tenant, server, user))
        .bind(holder)
        .bind(until)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives back `holder`'s refresh lease of the owner's credential (another holder's stays).
    pub async fn release_refresh_lease(
        &self,
        tenant: TenantId,
        server: &str,
        user: Option<UserId>,
        holder: &str,
    ) -> Result<(), VaultError> {
        let mut tx = self.db.begin().await?;
        sqlx::query("DELETE FROM oauth_refresh_leases WHERE owner_key = $1 AND holder = $2")
            .bind(lease_key(tenant, server, user))
            .bind(holder)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Whether the owner's credential can be used now: stored and not waiting for a login.
    pub async fn usable(&self, tenant: TenantId, server: &str, user: Option<UserId>) -> Result<bool, VaultError> {
        Ok(self.status(tenant, server, user).await? == Some(CredentialStatus::Ok))
    }
}

/// The ids of the keys rows are sealed under, sorted.
async fn key_ids(conn: &mut AnyConnection) -> Result<Vec<String>, VaultError> {
    Ok(sqlx::query_scalar("SELECT DISTINCT key_id FROM oauth_credentials ORDER BY key_id").fetch_all(conn).await?)
}

/// The start-up rule: once any credential is stored, the gateway needs the key it is sealed
/// under. Refuses when rows exist and no key is configured, or when any row is sealed under
/// another key (a rotation commits all rows at once, so after `rotate-key` every row is under
/// the new key and the configuration must name it).
pub async fn check_at_start(db: &Db, key: Option<&VaultKey>) -> Result<(), VaultError> {
    let mut conn = db.pool().acquire().await?;
    let ids = key_ids(&mut conn).await?;
    match key {
        None if !ids.is_empty() => Err(VaultError::KeyMismatch(format!(
            "upstream OAuth credentials are stored (sealed under key {}), but upstream.token_key_file \
             is not set: name the key file they were sealed with",
            ids.join(", ")
        ))),
        Some(key) if ids.iter().any(|id| id != key.id()) => Err(VaultError::KeyMismatch(format!(
            "upstream OAuth credentials are sealed under key {}, but upstream.token_key_file holds key {}: \
             name the key they were sealed with (after `admin oauth rotate-key`, the new key)",
            ids.join(", "),
            key.id()
        ))),
        _ => Ok(()),
    }
}

/// Re-seals every credential sealed under `old` with `new`, in one transaction: all or
/// nothing. Rows already under `new` are left alone; any row under neither key, or one that
/// `old` can't open, refuses the whole rotation. Returns how many rows were re-sealed.
pub async fn rotate_key(db: &Db, old: &VaultKey, new: &VaultKey) -> Result<usize, VaultError> {
    if old.id() == new.id() {
        return Err(VaultError::Key { name: "--new-key-file", message: "is the same key as --old-key-file".into() });
    }
    let mut tx = db.begin().await?;
    let strays: Vec<String> =
        key_ids(&mut tx).await?.into_iter().filter(|id| id != old.id() && id != new.id()).collect();
    if !strays.is_empty() {
        return Err(VaultError::KeyMismatch(format!(
            "credentials are sealed under key {}, which is neither --old-key-file (key {}) nor \
             --new-key-file (key {}): nothing was changed",
            strays.join(", "),
            old.id(),
            new.id()
        )));
    }
    let rows = sqlx::query(
        "SELECT id, tenant_id, server, user_id, nonce, ciphertext FROM oauth_credentials WHERE key_id = $1 ORDER BY id",
    )
    .bind(old.id())
    .fetch_all(&mut *tx)
    .await?;
    for row in &rows {
        let id: String = row.try_get("id")?;
        let server: String = row.try_get("server")?;
        let owner = Owner { tenant: row.try_get("tenant_id")?, server: &server, user: row.try_get("user_id")? };
        let nonce: String = row.try_get("nonce")?;
        let sealed: String = row.try_get("ciphertext")?;
        let plain = old.open(&owner, &nonce, &sealed)?;
        let (nonce, sealed) = new.seal(&owner, &plain)?;
        sqlx::query("UPDATE oauth_credentials SET key_id = $1, nonce = $2, ciphertext = $3 WHERE id = $4")
            .bind(new.id())
            .bind(nonce)
            .bind(sealed)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    // Logins under way were started under the old key: they are dropped (ask for a new one).
    sqlx::query("DELETE FROM oauth_logins").execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "upstream.token_key_file";

    #[test]
    fn a_generated_key_parses_and_has_a_stable_id() {
        let text = VaultKey::generate().unwrap();
        assert_eq!(text.len(), 44);
        let a = VaultKey::parse(&text, NAME).unwrap();
        let b = VaultKey::parse(&format!("  {text}\n"), NAME).unwrap();
        assert_eq!(a.id(), b.id(), "surrounding whitespace is ignored");
        assert_eq!(a.id().len(), 8);
        assert!(a.id().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.id(), VaultKey::parse(&VaultKey::generate().unwrap(), NAME).unwrap().id());
        let zero = VaultKey::parse(&STANDARD.encode([0u8; KEY_LEN]), NAME).unwrap();
        assert_eq!(zero.id(), &crate::vocab::digest::sha256_hex(&[0u8; KEY_LEN])[..8]);
    }

    #[test]
    fn anything_but_32_bytes_of_standard_base64_is_refused() {
        let hex64 = "00".repeat(KEY_LEN);
        let url_safe = base64::engine::general_purpose::URL_SAFE.encode([0xfbu8; KEY_LEN]);
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            (&hex64, "hex"),
            (&url_safe, "URL-safe base64"),
            ("AAAA", "too short"),
            (&STANDARD.encode([1u8; 31]), "31 bytes"),
            (&STANDARD.encode([1u8; 33]), "33 bytes"),
            (&STANDARD.encode([1u8; 32]).replace('=', ""), "no padding"),
            ("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!=", "not base64"),
        ];
        for (text, why) in cases {
            let err = VaultKey::parse(text, NAME).expect_err(why).to_string();
            assert!(err.contains(NAME), "{why}: the error names the key: {err}");
            assert!(err.contains("base64"), "{why}: the error says the encoding: {err}");
        }
    }

    #[test]
    fn debug_never_shows_key_bytes() {
        let text = STANDARD.encode([7u8; KEY_LEN]);
        let key = VaultKey::parse(&text, NAME).unwrap();
        let shown = format!("{key:?}");
        assert!(shown.contains(key.id()));
        assert!(!shown.contains(&text) && !shown.contains("7, 7"), "{shown}");
    }

    #[test]
    fn a_sealed_credential_opens_only_for_its_owner() {
        let key = VaultKey::parse(&VaultKey::generate().unwrap(), NAME).unwrap();
        let tenant = TenantId::generate();
        let user = UserId::generate();
        let owner = Owner { tenant, server: "github", user: Some(user) };
        let (nonce, sealed) = key.seal(&owner, b"secret-token").unwrap();
        assert_eq!(key.open(&owner, &nonce, &sealed).unwrap(), b"secret-token");
        for other in [
            Owner { tenant: TenantId::generate(), server: "github", user: Some(user) },
            Owner { tenant, server: "gitlab", user: Some(user) },
            Owner { tenant, server: "github", user: None },
            Owner { tenant, server: "github", user: Some(UserId::generate()) },
        ] {
            let err = key.open(&other, &nonce, &sealed).unwrap_err().to_string();
            assert!(!err.contains("secret-token"), "{err}");
        }
    }
}
