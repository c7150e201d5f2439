//! OAuth 2.1 to upstream MCP servers (the MCP authorization spec), through the executor that
//! owns the server. rmcp's `auth` does the protocol work (discovery, registration, PKCE, code
//! exchange, refresh); this module gives it the three things it can't know:
//!
//! - the network: every OAuth HTTP request goes through the server's executor
//!   ([`Executor::oauth_http`]), so an executor-only server is logged into over the same
//!   network boundary as its MCP connection;
//! - the storage: credentials live in the token vault, sealed per owner ([`VaultCredentials`]);
//!   a login under way lives in `oauth_logins` (its `state` good once, for its owner only);
//! - who may log in for whom: a login is for the tenant's credential or one user's own, as the
//!   declaration's `oauth.tokens` says, and is asked for by an administrator
//!   (`scopegate admin oauth login`) or by the user whose call needed it.
//!
//! A login has two links. The start link (`{public}/oauth/start/{secret}`) is what the CLI and
//! a "login needed" error hand out; opening it makes the gateway discover the authorization
//! server and register (through the executor) and redirects the browser to the authorization
//! URL. The authorization server sends the browser back to `{public}/oauth/callback`, where the
//! gateway takes the login by its `state`, exchanges the code (through the executor) and seals
//! the credential. Tokens never leave the gateway and the executor: not in logs, metrics,
//! audit rows, errors or anything sent to an MCP client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationRequest, AuthorizationSession, CredentialRefreshGuard,
    CredentialStore, OAuthClientConfig, StateStore, StoredAuthorizationState, StoredCredentials,
};

use crate::decl::ResolvedServer;
use crate::decl::ResolvedTransport;
use crate::decl::declaration::{OAuthSpec, TokenScope};
use crate::executor::oauth_http::ExecutorHttp;
use crate::executor::{Executor, UpstreamError};
use crate::store::vault::{PendingLogin, TokenVault, VaultError};
use crate::store::{TenantId, UserId};

pub use crate::vocab::routes::{CALLBACK_PATH, START_PATH};
pub use crate::wire::{AUTHORIZATION_META_KEY, UNAUTHORIZED_DATA_KEY};

/// How long the server's first (unauthenticated) answer may take at a login's start.
const CHALLENGE_TIMEOUT: Duration = Duration::from_secs(30);

pub use crate::store::vault::LOGIN_TTL;

/// Whose credential: the tenant's for a server, or one of its users' own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenOwner {
    pub tenant: TenantId,
    pub server: String,
    pub user: Option<UserId>,
}

impl TokenOwner {
    /// The owner of the credential a call by `user` to a server declared with `spec` carries.
    pub fn for_call(tenant: TenantId, server: &str, user: UserId, spec: &OAuthSpec) -> Self {
        let user = (spec.tokens == TokenScope::User).then_some(user);
        Self { tenant, server: server.to_owned(), user }
    }
}

/// Why a login could not be started or completed. Messages name the step and the server,
/// never a token, a code or a secret.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("the gateway has no token key (upstream.token_key_file): OAuth logins are off")]
    NoVault,
    #[error("this login link is unknown, used or expired: ask for a new one")]
    UnknownLink,
    #[error("this callback's state is unknown, used or expired: start the login again")]
    UnknownState,
    #[error("the authorization server answered with an error: {0}")]
    Denied(String),
    #[error("server `{0}` is not an OAuth-protected Streamable HTTP server of the tenant")]
    NotProtected(String),
    #[error("server `{server}`: {message}")]
    Server { server: String, message: String },
    #[error("{0}")]
    Vault(#[from] VaultError),
    #[error("{0}")]
    Upstream(#[from] UpstreamError),
}

/// OAuth for the gateway's upstream servers: the vault, and where its callback is.
pub struct UpstreamOAuth {
    vault: Arc<TokenVault>,
    public_url: String,
    /// One refresh at a time per owner in this process (a refresh token is good once).
    refreshing: Mutex<HashMap<TokenOwner, Arc<tokio::sync::Mutex<()>>>>,
}

impl UpstreamOAuth {
    pub fn new(vault: Arc<TokenVault>, public_url: &str) -> Arc<Self> {
        Arc::new(Self { vault, public_url: public_url.trim_end_matches('/').to_owned(), refreshing: Mutex::default() })
    }

    pub fn vault(&self) -> &Arc<TokenVault> {
        &self.vault
    }

    /// The redirect URI every login uses.
    pub fn callback_url(&self) -> String {
        format!("{}{CALLBACK_PATH}", self.public_url)
    }

    /// Asks for a login for `owner` and returns its start link.
    pub async fn login_link(&self, owner: &TokenOwner) -> Result<String, LoginError> {
        let secret = self.vault.create_login(owner.tenant, &owner.server, owner.user, LOGIN_TTL).await?;
        Ok(format!("{}{START_PATH}/{secret}", self.public_url))
    }

    /// The login a start link names, if it can still be started.
    pub async fn pending(&self, secret: &str) -> Result<PendingLogin, LoginError> {
        self.vault.pending_login(secret).await?.ok_or(LoginError::UnknownLink)
    }

    /// Starts `login` for `server` (resolved for the login's tenant, on `executor`): discovers
    /// the authorization server from the server's own 401, registers a client unless one is
    /// declared, and returns the authorization URL to send the browser to. A link starts once.
    pub async fn start(
        &self,
        login: &PendingLogin,
        server: &ResolvedServer,
        executor: &Executor,
    ) -> Result<String, LoginError> {
        let (url, spec) = protected(server)?;
        let manager = self.discovered(server, url, executor, true).await?;
        let mut request = AuthorizationRequest::new(self.callback_url()).with_client_name("scopegate");
        if !spec.scopes.is_empty() {
            request = request.with_scopes(spec.scopes.iter().cloned());
        }
        if let Some(client_id) = &spec.client_id {
            request = request.with_preregistered_client(client_id.clone());
        }
        let captured = CapturedState::default();
        let mut manager = manager;
        manager.set_state_store(captured.clone());
        let session =
            AuthorizationSession::new(manager, request).await.map_err(|(_, e)| failed(server, "authorization", &e))?;
        let auth_url = session.get_authorization_url().to_owned();
        let client_id = url_param(&auth_url, "client_id").ok_or_else(|| LoginError::Server {
            server: server.name.to_string(),
            message: "the authorization URL names no client".to_owned(),
        })?;
        let (csrf, state) = captured.take().ok_or_else(|| LoginError::Server {
            server: server.name.to_string(),
            message: "no authorization state was made".to_owned(),
        })?;
        let sealed = serde_json::to_vec(&state).map_err(|e| LoginError::Server {
            server: server.name.to_string(),
            message: format!("encoding the authorization state: {e}"),
        })?;
        if !self.vault.start_login(login, &csrf, &client_id, &sealed).await? {
            return Err(LoginError::UnknownLink);
        }
        Ok(auth_url)
    }

    /// Completes the login whose `state` the callback presents: takes it (once), exchanges
    /// `code` through the server's executor and seals the credential for the login's owner.
    /// `resolve` finds the owner's server and executor (it is only known once the state is).
    pub async fn complete<F, Fut>(
        &self,
        state: &str,
        code: &str,
        issuer: Option<&str>,
        resolve: F,
    ) -> Result<TokenOwner, LoginError>
    where
        F: FnOnce(TenantId, String) -> Fut,
        Fut: Future<Output = Result<(ResolvedServer, Executor), LoginError>>,
    {
        let taken = self.vault.take_login(state).await?.ok_or(LoginError::UnknownState)?;
        let owner = TokenOwner { tenant: taken.tenant, server: taken.server.clone(), user: taken.user };
        let (server, executor) = resolve(taken.tenant, taken.server.clone()).await?;
        let (url, spec) = protected(&server)?;
        let stored: StoredAuthorizationState =
            serde_json::from_slice(&taken.state).map_err(|e| LoginError::Server {
                server: server.name.to_string(),
                message: format!("the stored authorization state: {e}"),
            })?;
        let mut manager = self.discovered(&server, url, &executor, false).await?;
        let mut config = OAuthClientConfig::new(taken.client_id.clone(), self.callback_url());
        if !spec.scopes.is_empty() {
            config = config.with_scopes(spec.scopes.clone());
        }
        manager.configure_client(config).map_err(|e| failed(&server, "configuring the client", &e))?;
        manager.set_state_store(CapturedState::holding(state, stored));
        manager.set_credential_store(self.credentials(&owner));
        manager
            .exchange_code_for_token_with_issuer(code, state, issuer)
            .await
            .map_err(|e| failed(&server, "the code exchange", &e))?;
        tracing::info!(server = %owner.server, tenant = %owner.tenant, per_user = owner.user.is_some(), "upstream login completed");
        Ok(owner)
    }

    /// An authorization manager for `owner`'s stored credential on `server`, its HTTP through
    /// `executor`; refreshes (through the executor) when the token is about to expire.
    /// [`UpstreamError::LoginNeeded`] when there is no usable credential.
    pub async fn manager(
        &self,
        owner: &TokenOwner,
        server: &ResolvedServer,
        executor: &Executor,
    ) -> Result<AuthorizationManager, UpstreamError> {
        let need_login = || UpstreamError::LoginNeeded { server: server.name.to_string() };
        let (url, _) = protected(server).map_err(|e| UpstreamError::Connect(e.to_string()))?;
        if !self.vault.usable(owner.tenant, &owner.server, owner.user).await.map_err(vault_error)? {
            return Err(need_login());
        }
        let mut manager = AuthorizationManager::new_with_oauth_http_client(url, executor.oauth_http())
            .await
            .map_err(|e| UpstreamError::Connect(format!("OAuth: {}", auth_message(&e))))?;
        manager.set_credential_store(self.credentials(owner));
        match manager.initialize_from_store().await {
            Ok(true) => {}
            Ok(false) => return Err(need_login()),
            Err(e) => return Err(UpstreamError::Connect(format!("OAuth discovery: {}", auth_message(&e)))),
        }
        match manager.get_access_token().await {
            Ok(_) => Ok(manager),
            Err(AuthError::AuthorizationRequired | AuthError::TokenRefreshRejected(_)) => {
                self.mark_login_needed(owner).await;
                Err(need_login())
            }
            Err(e) => Err(UpstreamError::Connect(format!("OAuth refresh: {}", auth_message(&e)))),
        }
    }

    /// Like [`UpstreamOAuth::manager`], after a refresh whatever the token's expiry (the server
    /// refused the one it had).
    pub async fn refreshed(
        &self,
        owner: &TokenOwner,
        server: &ResolvedServer,
        executor: &Executor,
    ) -> Result<AuthorizationManager, UpstreamError> {
        let manager = self.manager(owner, server, executor).await?;
        match manager.refresh_token().await {
            Ok(_) => Ok(manager),
            Err(AuthError::AuthorizationRequired | AuthError::TokenRefreshRejected(_)) => {
                self.mark_login_needed(owner).await;
                Err(UpstreamError::LoginNeeded { server: server.name.to_string() })
            }
            Err(e) => Err(UpstreamError::Connect(format!("OAuth refresh: {}", auth_message(&e)))),
        }
    }

    /// Marks `owner`'s credential as needing a new login (a refresh failed for good).
    pub async fn mark_login_needed(&self, owner: &TokenOwner) {
        match self.vault.mark_login_needed(owner.tenant, &owner.server, owner.user).await {
            Ok(_) => {
                tracing::warn!(server = %owner.server, tenant = %owner.tenant, per_user = owner.user.is_some(), "upstream credential needs a new login")
            }
            Err(e) => {
                tracing::error!(server = %owner.server, error = %e, "marking a credential as needing a login failed")
            }
        }
    }

    fn credentials(&self, owner: &TokenOwner) -> VaultCredentials {
        let guard = Arc::clone(
            self.refreshing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(owner.clone())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(()))),
        );
        VaultCredentials { vault: Arc::clone(&self.vault), owner: owner.clone(), guard }
    }

    /// A manager with the authorization server's metadata discovered through `executor`:
    /// from the server's own 401 challenge when `from_challenge` (a login's start), else by
    /// the well-known documents.
    async fn discovered(
        &self,
        server: &ResolvedServer,
        url: &str,
        executor: &Executor,
        from_challenge: bool,
    ) -> Result<AuthorizationManager, LoginError> {
        let http = executor.oauth_http();
        let mut manager = AuthorizationManager::new_with_oauth_http_client(url, http.clone())
            .await
            .map_err(|e| failed(server, "OAuth set-up", &e))?;
        let challenge = if from_challenge { challenge(&http, url).await } else { None };
        let resolution = manager
            .resolve_metadata_from_challenge(challenge.as_deref())
            .await
            .map_err(|e| failed(server, "discovering the authorization server", &e))?;
        if !resolution.source.is_discovered() {
            return Err(LoginError::Server {
                server: server.name.to_string(),
                message: "the server publishes no OAuth metadata (RFC 9728 / RFC 8414)".to_owned(),
            });
        }
        manager.set_metadata(resolution.metadata);
        Ok(manager)
    }
}

/// The server's URL and `oauth` field, or why it has none.
fn protected(server: &ResolvedServer) -> Result<(&str, &OAuthSpec), LoginError> {
    match &server.transport {
        ResolvedTransport::Http { url, oauth: Some(spec), .. } => Ok((url, spec)),
        _ => Err(LoginError::NotProtected(server.name.to_string())),
    }
}

/// The `WWW-Authenticate` challenge of the server's answer to an unauthenticated MCP
/// `initialize`, fetched through the executor (`None` when it does not answer 401).
async fn challenge(http: &ExecutorHttp, url: &str) -> Option<String> {
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "scopegate", "version": env!("CARGO_PKG_VERSION")}},
    });
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, text/event-stream")
        .body(body.to_string().into_bytes())
        .ok()?;
    let response = http.exchange(request, false, CHALLENGE_TIMEOUT).await.ok()?;
    if response.status() != http::StatusCode::UNAUTHORIZED {
        return None;
    }
    response.headers().get(http::header::WWW_AUTHENTICATE)?.to_str().ok().map(str::to_owned)
}

/// A query parameter of a URL.
fn url_param(url: &str, name: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    url.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

/// An rmcp OAuth error as a message that can be logged and shown: its kind, not its text when
/// the text could hold what the server sent back.
fn auth_message(e: &AuthError) -> String {
    match e {
        AuthError::AuthorizationRequired => "a login is needed".to_owned(),
        AuthError::TokenRefreshRejected(_) => "the authorization server refused the refresh token".to_owned(),
        AuthError::TokenExchangeFailed(_) => "the authorization server refused the code exchange".to_owned(),
        AuthError::RegistrationFailed(_) => "client registration failed".to_owned(),
        AuthError::NoAuthorizationSupport => "the server publishes no OAuth metadata".to_owned(),
        AuthError::PkceUnsupported => "the authorization server does not support PKCE S256".to_owned(),
        AuthError::AuthorizationServerMismatch { expected_issuer, received_issuer } => {
            format!("the callback came from issuer {received_issuer:?}, not {expected_issuer:?}")
        }
        AuthError::CredentialStoreError(_) => "the token vault failed".to_owned(),
        AuthError::TokenRefreshFailed(_) => "the refresh did not complete".to_owned(),
        AuthError::MetadataError(_) => "the server's OAuth metadata is unusable".to_owned(),
        _ => "the OAuth exchange failed".to_owned(),
    }
}

fn failed(server: &ResolvedServer, step: &str, e: &AuthError) -> LoginError {
    tracing::warn!(server = %server.name, step, kind = %auth_message(e), "upstream OAuth step failed");
    LoginError::Server { server: server.name.to_string(), message: format!("{step}: {}", auth_message(e)) }
}

fn vault_error(e: VaultError) -> UpstreamError {
    UpstreamError::Connect(format!("the token vault: {e}"))
}

/// One owner's credential in the token vault, as rmcp's credential store. A credential marked
/// "login needed" loads as none: nothing uses it until someone logs in again.
struct VaultCredentials {
    vault: Arc<TokenVault>,
    owner: TokenOwner,
    guard: Arc<tokio::sync::Mutex<()>>,
}

fn store_error(e: impl std::fmt::Display) -> AuthError {
    AuthError::CredentialStoreError(e.to_string())
}

#[async_trait::async_trait]
impl CredentialStore for VaultCredentials {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let TokenOwner { tenant, server, user } = &self.owner;
        if !self.vault.usable(*tenant, server, *user).await.map_err(store_error)? {
            return Ok(None);
        }
        let Some(bytes) = self.vault.get(*tenant, server, *user).await.map_err(store_error)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|_| store_error("a stored credential is not readable"))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let TokenOwner { tenant, server, user } = &self.owner;
        let bytes = serde_json::to_vec(&credentials).map_err(|_| store_error("encoding a credential failed"))?;
        self.vault.put(*tenant, server, *user, &bytes).await.map_err(store_error)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        let TokenOwner { tenant, server, user } = &self.owner;
        self.vault.delete(*tenant, server, *user).await.map(drop).map_err(store_error)
    }

    async fn on_refresh_token_rejected(&self, _credentials: &StoredCredentials) -> Result<(), AuthError> {
        let TokenOwner { tenant, server, user } = &self.owner;
        tracing::warn!(%server, %tenant, per_user = user.is_some(), "the authorization server refused a refresh token");
        self.vault.mark_login_needed(*tenant, server, *user).await.map(drop).map_err(store_error)
    }

    /// One refresh of a credential at a time, across the replicas: this process's lock first
    /// (its own tasks queue there), then the credential's lease in the database, waited for
    /// while another replica holds it. rmcp loads the credential after this, so a refresh that
    /// waited uses the token the other replica's refresh stored.
    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        let local = Arc::clone(&self.guard).lock_owned().await;
        let TokenOwner { tenant, server, user } = &self.owner;
        let holder = uuid::Uuid::new_v4().to_string();
        let deadline = tokio::time::Instant::now() + REFRESH_LEASE_WAIT;
        while !self
            .vault
            .try_refresh_lease(*tenant, server, *user, &holder, REFRESH_LEASE_TTL)
            .await
            .map_err(store_error)?
        {
            if tokio::time::Instant::now() >= deadline {
                return Err(store_error("another replica's refresh of this credential did not end in time"));
            }
            tokio::time::sleep(REFRESH_LEASE_POLL).await;
        }
        Ok(Some(CredentialRefreshGuard::new(RefreshLease {
            _local: local,
            vault: Arc::clone(&self.vault),
            owner: self.owner.clone(),
            holder,
        })))
    }
}

/// How long a replica's refresh lease lasts if it is never given back (the replica died).
const REFRESH_LEASE_TTL: Duration = Duration::from_secs(60);
/// How long a refresh waits for another replica's to end.
const REFRESH_LEASE_WAIT: Duration = Duration::from_secs(30);
const REFRESH_LEASE_POLL: Duration = Duration::from_millis(25);

/// A credential's refresh lease held by this process; given back when dropped (the refresh is
/// over, or failed).
struct RefreshLease {
    _local: tokio::sync::OwnedMutexGuard<()>,
    vault: Arc<TokenVault>,
    owner: TokenOwner,
    holder: String,
}

impl Drop for RefreshLease {
    fn drop(&mut self) {
        let (vault, owner, holder) = (Arc::clone(&self.vault), self.owner.clone(), std::mem::take(&mut self.holder));
        // Without a runtime the lease runs out by itself (REFRESH_LEASE_TTL).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let TokenOwner { tenant, server, user } = &owner;
                if let Err(e) = vault.release_refresh_lease(*tenant, server, *user, &holder).await {
                    tracing::warn!(%server, error = %e, "giving back a refresh lease failed; it runs out by itself");
                }
            });
        }
    }
}

/// rmcp's state store for one login: at the start it captures the state rmcp makes (the
/// gateway then records it on the login's row); at the callback it holds the state taken
/// from that row, for that login's `state` only.
#[derive(Clone, Default)]
struct CapturedState(Arc<Mutex<Option<(String, StoredAuthorizationState)>>>);

impl CapturedState {
    fn holding(csrf: &str, state: StoredAuthorizationState) -> Self {
        Self(Arc::new(Mutex::new(Some((csrf.to_owned(), state)))))
    }

    fn take(&self) -> Option<(String, StoredAuthorizationState)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[async_trait::async_trait]
impl StateStore for CapturedState {
    async fn save(&self, csrf_token: &str, state: StoredAuthorizationState) -> Result<(), AuthError> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((csrf_token.to_owned(), state));
        Ok(())
    }

    async fn load(&self, csrf_token: &str) -> Result<Option<StoredAuthorizationState>, AuthError> {
        let held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Ok(held.as_ref().filter(|(csrf, _)| csrf == csrf_token).map(|(_, state)| state.clone()))
    }

    async fn delete(&self, csrf_token: &str) -> Result<(), AuthError> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if held.as_ref().is_some_and(|(csrf, _)| csrf == csrf_token) {
            *held = None;
        }
        Ok(())
    }
}
