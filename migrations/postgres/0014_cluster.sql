-- What lets any replica serve anything (`cluster` in the code).
--
-- Every running replica has a row: a random id chosen at start, the URL other replicas reach
-- it at (`cluster.internal_url`, or one derived from its listen address), when it started and
-- when it last said it was alive (`seen_at`, epoch ms, renewed every heartbeat). A replica
-- whose `seen_at` is older than three heartbeats is taken for gone; it deletes its own row
-- when it stops cleanly, and any replica deletes rows gone for a day.
CREATE TABLE replicas (
    id            TEXT    NOT NULL PRIMARY KEY,
    internal_url  TEXT    NOT NULL,
    started_at    BIGINT  NOT NULL,
    seen_at       BIGINT  NOT NULL
);

-- Which replica holds which executor agent's tunnel, and the root the agent reported there: a
-- call for a server on that executor that arrives on another replica goes through this one.
CREATE TABLE replica_agents (
    executor      TEXT    NOT NULL,
    replica_id    TEXT    NOT NULL REFERENCES replicas (id) ON DELETE CASCADE,
    root          TEXT    NOT NULL,
    connected_at  BIGINT  NOT NULL,
    PRIMARY KEY (executor, replica_id)
);

-- The public keys identity assertions are signed with, one or more per replica (the private
-- keys never leave their process): `/.well-known/jwks.json` on every replica lists every key
-- whose `publish_until` (epoch ms) is still ahead. A replica keeps its signing key's
-- `publish_until` one assertion lifetime and three heartbeats ahead while it signs with it; a
-- key retired by a rotation, or whose replica stopped, stays published until the last
-- assertion it may have signed has expired.
CREATE TABLE signing_keys (
    kid            TEXT    NOT NULL PRIMARY KEY,
    jwk            TEXT    NOT NULL,
    replica_id     TEXT    NOT NULL,
    created_at     BIGINT  NOT NULL,
    publish_until  BIGINT  NOT NULL
);
CREATE INDEX signing_keys_published ON signing_keys (publish_until);
