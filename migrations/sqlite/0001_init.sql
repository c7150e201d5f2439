-- scopegate schema, SQLite. Ids are UUID text; times are Unix epoch milliseconds;
-- days are ISO dates (YYYY-MM-DD) so they sort and compare as text.
-- Composite foreign keys (tenant_id, id) make cross-tenant links impossible in the
-- database itself, not only in the code.

CREATE TABLE tenants (
    id          TEXT    NOT NULL PRIMARY KEY,
    slug        TEXT    NOT NULL UNIQUE,
    name        TEXT    NOT NULL,
    status      TEXT    NOT NULL CHECK (status IN ('active', 'suspended')),
    created_at  BIGINT  NOT NULL
);

CREATE TABLE users (
    id            TEXT    NOT NULL PRIMARY KEY,
    tenant_id     TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    subject       TEXT    NOT NULL,
    display_name  TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('active', 'disabled')),
    created_at    BIGINT  NOT NULL,
    UNIQUE (tenant_id, subject),
    UNIQUE (tenant_id, id)
);

CREATE TABLE user_roles (
    tenant_id  TEXT  NOT NULL,
    user_id    TEXT  NOT NULL,
    role       TEXT  NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor')),
    PRIMARY KEY (user_id, role),
    FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id) ON DELETE CASCADE
);

CREATE TABLE flocks (
    id          TEXT    NOT NULL PRIMARY KEY,
    tenant_id   TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        TEXT    NOT NULL,
    breed       TEXT    NOT NULL,
    hen_count   BIGINT  NOT NULL CHECK (hen_count >= 0),
    created_at  BIGINT  NOT NULL,
    UNIQUE (tenant_id, name),
    UNIQUE (tenant_id, id)
);

CREATE TABLE flock_assignments (
    tenant_id  TEXT  NOT NULL,
    user_id    TEXT  NOT NULL,
    flock_id   TEXT  NOT NULL,
    PRIMARY KEY (user_id, flock_id),
    FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id) ON DELETE CASCADE,
    FOREIGN KEY (tenant_id, flock_id) REFERENCES flocks (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX flock_assignments_flock ON flock_assignments (flock_id);

CREATE TABLE egg_counts (
    tenant_id    TEXT    NOT NULL,
    flock_id     TEXT    NOT NULL,
    day          TEXT    NOT NULL CHECK (length(day) = 10),
    eggs         BIGINT  NOT NULL CHECK (eggs >= 0),
    recorded_by  TEXT    NOT NULL,
    recorded_at  BIGINT  NOT NULL,
    PRIMARY KEY (flock_id, day),
    FOREIGN KEY (tenant_id, flock_id) REFERENCES flocks (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX egg_counts_tenant_day ON egg_counts (tenant_id, day);

-- One row per audited action. Events are chained per tenant: `seq` counts up from 1
-- and `prev_hash` holds the `hash` of the tenant's previous event.
CREATE TABLE audit_events (
    id              TEXT    NOT NULL PRIMARY KEY,
    tenant_id       TEXT    NOT NULL REFERENCES tenants (id),
    seq             BIGINT  NOT NULL,
    occurred_at     BIGINT  NOT NULL,
    user_id         TEXT    NOT NULL,
    session_id      TEXT,
    request_id      TEXT,
    client_name     TEXT,
    client_version  TEXT,
    action          TEXT    NOT NULL,
    tool            TEXT,
    args_digest     TEXT,
    args_raw        TEXT,
    outcome         TEXT    NOT NULL,
    error_class     TEXT,
    duration_us     BIGINT  NOT NULL,
    prev_hash       TEXT    NOT NULL,
    hash            TEXT    NOT NULL,
    UNIQUE (tenant_id, seq)
);
CREATE INDEX audit_events_tenant_time ON audit_events (tenant_id, occurred_at);
