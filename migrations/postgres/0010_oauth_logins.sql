-- Logins to OAuth-protected upstream servers under way (see src/store/vault.rs, `logins`).
--
-- A row is made when a login is asked for (`scopegate admin oauth login`, or a tool call that
-- needs one) and names whose credential the login will produce: the tenant's for `server`
-- (`user_id` NULL) or that user's own. `id` is the SHA-256 (hex) of the start link's secret;
-- the link is good once, before `expires_at`. Starting it records the SHA-256 (hex) of the
-- OAuth `state` sent to the authorization server and the PKCE state sealed like a credential
-- (`key_id`, `nonce`, `ciphertext`); the callback that presents that `state` takes the row
-- (deletes it), so a `state` is good once, for that owner only. The table never holds a
-- secret in clear.
CREATE TABLE oauth_logins (
    id           TEXT    NOT NULL PRIMARY KEY CHECK (length(id) = 64),
    tenant_id    TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    server       TEXT    NOT NULL CHECK (length(server) BETWEEN 1 AND 64),
    user_id      TEXT    REFERENCES users (id) ON DELETE CASCADE,
    state_hash   TEXT    UNIQUE CHECK (state_hash IS NULL OR length(state_hash) = 64),
    client_id    TEXT,
    key_id       TEXT,
    nonce        TEXT,
    ciphertext   TEXT,
    expires_at   BIGINT  NOT NULL,
    created_at   BIGINT  NOT NULL,
    FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id) ON DELETE CASCADE
);
