-- Keys every replica on this database shares: the first replica to start creates each one
-- (random, 32 bytes, base64), the others read it. Today: the key that seals the aggregated
-- lists' pagination cursors, so that a cursor minted by one replica is good on every replica
-- (a stateless client's requests go to any of them).
CREATE TABLE shared_keys (
    name        TEXT    NOT NULL PRIMARY KEY,
    secret      TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL
);
