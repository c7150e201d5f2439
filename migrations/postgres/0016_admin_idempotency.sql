-- Idempotent creation for the admin API (`Idempotency-Key`): the first request with a key
-- inserts its row at the start of its own transaction and stores its answer there before it
-- commits, so a retry with the same key (by the same principal) gets that answer again and
-- changes nothing. A concurrent retry waits on the key's row until the first one commits (or
-- rolls back, and then runs itself). `fingerprint` is the digest of the request's method, path
-- and body: the same key sent with another request is refused. Rows older than a day are
-- dropped by the writes that come after them.
CREATE TABLE admin_idempotency (
    principal    TEXT    NOT NULL,
    key          TEXT    NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint  TEXT    NOT NULL,
    status       BIGINT  NOT NULL,
    body         TEXT    NOT NULL,
    etag         TEXT,
    location     TEXT,
    created_at   BIGINT  NOT NULL,
    PRIMARY KEY (principal, key)
);
CREATE INDEX admin_idempotency_created ON admin_idempotency (created_at);
