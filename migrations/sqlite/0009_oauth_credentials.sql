-- OAuth credentials for upstream MCP servers, encrypted at rest (see src/store/vault.rs).
--
-- A row is the tenant's credential for `server` when `user_id` is NULL, or that user's own.
-- `nonce` and `ciphertext` are standard base64 (padded) of an AEAD nonce and sealed bytes;
-- `key_id` names the key that sealed them (the first 8 hex digits of its SHA-256), so start-up
-- and key rotation can tell keys apart. The table never holds a token in clear.
--
-- UNIQUE treats NULLs as distinct, so one tenant-level row per server is kept by an index
-- over COALESCE(user_id, ''), which both databases accept.
CREATE TABLE oauth_credentials (
    id          TEXT    NOT NULL PRIMARY KEY,
    tenant_id   TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    server      TEXT    NOT NULL CHECK (length(server) BETWEEN 1 AND 64),
    user_id     TEXT    REFERENCES users (id) ON DELETE CASCADE,
    key_id      TEXT    NOT NULL CHECK (length(key_id) = 8),
    nonce       TEXT    NOT NULL,
    ciphertext  TEXT    NOT NULL,
    status      TEXT    NOT NULL CHECK (status IN ('ok', 'login_needed')),
    updated_at  BIGINT  NOT NULL,
    FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX oauth_credentials_owner ON oauth_credentials (tenant_id, server, COALESCE(user_id, ''));
