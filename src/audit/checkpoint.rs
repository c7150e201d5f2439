//! Signed checkpoints of the audit chains: each tenant's head (tenant, seq, hash, time) signed
//! with the gateway's Ed25519 checkpoint key and written to a sink outside the database, so a
//! chain later cut short no longer reaches a checkpointed head. Never writes to the database.
//!
//! A line is JSON: `{"v":1,"tenant":SLUG,"tenant_id":ID,"seq":N,"hash":HEX,"at":MS,
//! "key_id":ID,"sig":B64URL}`; the signature covers the JSON array
//! `["scopegate-audit-checkpoint/v1",tenant_id,tenant,seq,hash,at,key_id]` (see
//! [`Checkpoint::signed_bytes`]), so no field can be changed or moved to another.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::GENESIS;
use crate::store::{Db, StoreError};

const DOMAIN: &str = "scopegate-audit-checkpoint/v1";
const PEM_LABEL: &str = "PRIVATE KEY";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("audit.checkpoint_key `{path}`: {message}")]
    Key { path: PathBuf, message: String },
    #[error("audit.checkpoint_sink: {0}")]
    Sink(String),
    #[error("writing checkpoints to {sink}: {message}")]
    Write { sink: String, message: String },
    #[error("public key `{0}`: expected the 32-byte Ed25519 key, base64url")]
    PublicKey(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The key checkpoints are signed with.
pub struct CheckpointKey {
    pair: Ed25519KeyPair,
    id: String,
}

/// A public key that verifies checkpoints, with its id.
#[derive(Debug, Clone)]
pub struct VerifyingKey {
    pub id: String,
    bytes: Vec<u8>,
}

impl VerifyingKey {
    /// From the base64url text `audit keygen` prints.
    pub fn parse(text: &str) -> Result<Self, CheckpointError> {
        let bytes = URL_SAFE_NO_PAD
            .decode(text.trim().trim_end_matches('='))
            .ok()
            .filter(|b| b.len() == 32)
            .ok_or_else(|| CheckpointError::PublicKey(text.to_owned()))?;
        Ok(Self { id: key_id(&bytes), bytes })
    }

    pub fn to_text(&self) -> String {
        URL_SAFE_NO_PAD.encode(&self.bytes)
    }
}

/// The key id is a digest of the public key: stable, unique per key, reveals nothing.
fn key_id(public: &[u8]) -> String {
    super::digest::sha256_hex(public)[..16].to_owned()
}

impl CheckpointKey {
    /// A new key and its PKCS#8 document in PEM, to be stored by the caller.
    pub fn generate() -> Result<(Self, String), CheckpointError> {
        let failed = |m: &str| CheckpointError::Key { path: PathBuf::new(), message: m.to_owned() };
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).map_err(|_| failed("generation failed"))?;
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| failed("generation failed"))?;
        let body = STANDARD.encode(pkcs8.as_ref());
        let mut pem = format!("-----BEGIN {PEM_LABEL}-----\n");
        for chunk in body.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(chunk).unwrap_or_default());
            pem.push('\n');
        }
        pem.push_str(&format!("-----END {PEM_LABEL}-----\n"));
        Ok((Self::from_pair(pair), pem))
    }

    /// Reads a PKCS#8 Ed25519 private key in PEM (as `audit keygen` writes it, or as
    /// `openssl genpkey -algorithm ed25519` does).
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let bad = |message: String| CheckpointError::Key { path: path.to_owned(), message };
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("can't be read: {e}")))?;
        let body: String = text
            .lines()
            .map(str::trim)
            .skip_while(|l| *l != format!("-----BEGIN {PEM_LABEL}-----"))
            .skip(1)
            .take_while(|l| !l.starts_with("-----END"))
            .collect();
        let der = STANDARD
            .decode(body)
            .ok()
            .filter(|d| !d.is_empty())
            .ok_or_else(|| bad(format!("not a PEM `{PEM_LABEL}` document")))?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
            .map_err(|e| bad(format!("not a PKCS#8 Ed25519 key: {e}")))?;
        Ok(Self::from_pair(pair))
    }

    fn from_pair(pair: Ed25519KeyPair) -> Self {
        let id = key_id(pair.public_key().as_ref());
        Self { pair, id }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn verifying_key(&self) -> VerifyingKey {
        VerifyingKey { id: self.id.clone(), bytes: self.pair.public_key().as_ref().to_vec() }
    }

    /// Signs `head` of `tenant` as of `at` (Unix ms).
    pub fn sign(&self, head: &TenantHead, at: i64) -> Checkpoint {
        let mut checkpoint = Checkpoint {
            v: 1,
            tenant: head.slug.clone(),
            tenant_id: head.tenant_id.clone(),
            seq: head.seq,
            hash: head.hash.clone(),
            at,
            key_id: self.id.clone(),
            sig: String::new(),
        };
        checkpoint.sig = URL_SAFE_NO_PAD.encode(self.pair.sign(&checkpoint.signed_bytes()).as_ref());
        checkpoint
    }
}

/// One signed checkpoint: a line of the sink.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub v: u32,
    pub tenant: String,
    pub tenant_id: String,
    pub seq: i64,
    pub hash: String,
    /// When it was signed, Unix epoch milliseconds.
    pub at: i64,
    pub key_id: String,
    pub sig: String,
}

/// Why a checkpoint can't be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureProblem {
    UnknownKey,
    BadSignature,
}

impl Checkpoint {
    /// The canonical form the signature covers: a JSON array, so every field is delimited.
    pub fn signed_bytes(&self) -> Vec<u8> {
        serde_json::json!([DOMAIN, self.tenant_id, self.tenant, self.seq, self.hash, self.at, self.key_id])
            .to_string()
            .into_bytes()
    }

    pub fn check_signature(&self, keys: &[VerifyingKey]) -> Result<(), SignatureProblem> {
        let key = keys.iter().find(|k| k.id == self.key_id).ok_or(SignatureProblem::UnknownKey)?;
        let sig = URL_SAFE_NO_PAD.decode(&self.sig).map_err(|_| SignatureProblem::BadSignature)?;
        if self.v != 1 {
            return Err(SignatureProblem::BadSignature);
        }
        UnparsedPublicKey::new(&ED25519, &key.bytes)
            .verify(&self.signed_bytes(), &sig)
            .map_err(|_| SignatureProblem::BadSignature)
    }

    pub fn to_line(&self) -> String {
        // A struct of strings and integers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

pub use crate::config::CheckpointSink as Sink;

/// The sink with what writing to it needs.
struct Writer {
    sink: Sink,
    http: Option<reqwest::Client>,
}

impl Writer {
    fn new(sink: Sink) -> Result<Self, CheckpointError> {
        let http = match sink {
            Sink::Http(_) => {
                crate::tls::install_provider();
                Some(
                    reqwest::Client::builder()
                        .timeout(Duration::from_secs(10))
                        .tcp_nodelay(true)
                        .build()
                        .map_err(|e| CheckpointError::Sink(e.to_string()))?,
                )
            }
            Sink::File(_) | Sink::Stdout => None,
        };
        Ok(Self { sink, http })
    }

    async fn write(&self, checkpoints: &[Checkpoint]) -> Result<(), CheckpointError> {
        if checkpoints.is_empty() {
            return Ok(());
        }
        let mut body = String::new();
        for c in checkpoints {
            body.push_str(&c.to_line());
            body.push('\n');
        }
        let failed = |message: String| CheckpointError::Write { sink: self.sink.name(), message };
        match (&self.sink, &self.http) {
            (Sink::File(path), _) => {
                let path = path.clone();
                // One append-mode write per round, synced: a reader never sees half a round,
                // and a crash right after a round keeps it.
                tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
                    file.write_all(body.as_bytes())?;
                    file.sync_data()
                })
                .await
                .map_err(|e| failed(e.to_string()))?
                .map_err(|e| failed(e.to_string()))
            }
            (Sink::Stdout, _) => {
                let mut out = tokio::io::stdout();
                out.write_all(body.as_bytes()).await.map_err(|e| failed(e.to_string()))?;
                out.flush().await.map_err(|e| failed(e.to_string()))
            }
            (Sink::Http(url), Some(client)) => {
                let response = client
                    .post(url)
                    .header(http::header::CONTENT_TYPE, "application/x-ndjson")
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                if response.status().is_success() {
                    Ok(())
                } else {
                    Err(failed(format!("answered {}", response.status())))
                }
            }
            (Sink::Http(_), None) => Err(failed("no HTTP client".into())),
        }
    }
}

/// A tenant's chain head as `audit_heads` holds it (seq 0: no events yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantHead {
    pub tenant_id: String,
    pub slug: String,
    pub seq: i64,
    pub hash: String,
}

/// Every tenant's head, by slug.
pub async fn heads(db: &Db) -> Result<Vec<TenantHead>, StoreError> {
    let rows: Vec<(String, String, Option<i64>, Option<String>)> = sqlx::query_as(
        "SELECT t.id, t.slug, h.seq, h.hash FROM tenants t LEFT JOIN audit_heads h ON h.tenant_id = t.id \
         ORDER BY t.slug",
    )
    .fetch_all(db.pool())
    .await?;
    Ok(rows
        .into_iter()
        .map(|(tenant_id, slug, seq, hash)| TenantHead {
            tenant_id,
            slug,
            seq: seq.unwrap_or(0),
            hash: hash.unwrap_or_else(|| GENESIS.to_owned()),
        })
        .collect())
}

/// The key and sink of `audit.checkpoint_key` and `audit.checkpoint_sink`; `None` when
/// checkpoints are off. Reads the key, so a missing or bad key stops start-up.
pub fn from_config(config: &crate::config::AuditConfig) -> Result<Option<(CheckpointKey, Sink)>, CheckpointError> {
    let Some(sink) = Sink::parse(&config.checkpoint_sink).map_err(CheckpointError::Sink)? else {
        return Ok(None);
    };
    if config.checkpoint_key.as_os_str().is_empty() {
        return Err(CheckpointError::Key {
            path: PathBuf::new(),
            message: "audit.checkpoint_sink is set but no key is configured (create one with \
                      `scopegate audit keygen --out FILE`)"
                .into(),
        });
    }
    Ok(Some((CheckpointKey::load(&config.checkpoint_key)?, sink)))
}

/// Signs and writes checkpoints; remembers what it wrote, so a periodic round writes only
/// the tenants whose head moved since.
pub struct Checkpointer {
    db: Db,
    key: CheckpointKey,
    writer: Writer,
    written: HashMap<String, i64>,
}

impl Checkpointer {
    pub fn new(db: Db, key: CheckpointKey, sink: Sink) -> Result<Self, CheckpointError> {
        Ok(Self { db, key, writer: Writer::new(sink)?, written: HashMap::new() })
    }

    /// Writes a checkpoint for every tenant whose head moved since this checkpointer's last
    /// write (a tenant with no events has nothing to protect); returns how many it wrote.
    pub async fn round(&mut self) -> Result<usize, CheckpointError> {
        let moved: Vec<TenantHead> = heads(&self.db)
            .await?
            .into_iter()
            .filter(|h| h.seq > 0 && self.written.get(&h.tenant_id) != Some(&h.seq))
            .collect();
        self.write(moved).await
    }

    /// Writes a checkpoint for every tenant now; returns how many it wrote.
    pub async fn all(&mut self) -> Result<usize, CheckpointError> {
        let all = heads(&self.db).await?;
        self.write(all).await
    }

    async fn write(&mut self, heads: Vec<TenantHead>) -> Result<usize, CheckpointError> {
        let at = crate::store::now_millis();
        let signed: Vec<Checkpoint> = heads.iter().map(|h| self.key.sign(h, at)).collect();
        self.writer.write(&signed).await?;
        for h in heads {
            self.written.insert(h.tenant_id, h.seq);
        }
        Ok(signed.len())
    }

    /// Runs a round every `every` until `stop` is cancelled. A failed round is logged and
    /// retried at the next tick (nothing is remembered as written).
    pub fn spawn(mut self, every: Duration, stop: tokio_util::sync::CancellationToken) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => match self.round().await {
                        Ok(0) => {}
                        Ok(n) => tracing::debug!(checkpoints = n, "audit checkpoints written"),
                        Err(e) => tracing::error!(error = %e, "audit checkpoints could not be written"),
                    },
                }
            }
        });
    }
}

/// One line of a checkpoint file: parsed, or why not.
pub fn parse_lines(text: &str) -> Vec<(usize, Result<Checkpoint, String>)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, serde_json::from_str::<Checkpoint>(l).map_err(|e| e.to_string())))
        .collect()
}
