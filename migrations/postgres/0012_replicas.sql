-- What the replicas on one database coordinate through it.
--
-- Keys every replica shares: the first replica to start creates each one (random, 32 bytes,
-- base64), the others read it. Today: the key that seals the aggregated lists' pagination
-- cursors, so that a cursor minted by one replica is good on every replica (a stateless
-- client's requests go to any of them).
CREATE TABLE shared_keys (
    name        TEXT    NOT NULL PRIMARY KEY,
    secret      TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL
);

-- A refresh of an upstream OAuth credential under way, held by one replica until it is done
-- or `expires_at` (epoch ms) passes: two replicas never spend one rotating refresh token at
-- once. `owner_key` names the credential (tenant id, server and user id, or '' for the tenant's).
CREATE TABLE oauth_refresh_leases (
    owner_key   TEXT    NOT NULL PRIMARY KEY,
    holder      TEXT    NOT NULL,
    expires_at  BIGINT  NOT NULL
);
