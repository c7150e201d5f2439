-- Calls a person confirms (issue 49).
--
-- A new role, `approver`: a user holding it may approve or reject the calls of the other users
-- of its tenant that wait for a second person. SQLite can't change a CHECK in place: the four
-- tables that name roles are rebuilt and their rows copied (nothing references them), and
-- their change-counter triggers made again.
CREATE TABLE user_roles_0024 (
    tenant_id  TEXT  NOT NULL,
    user_id    TEXT  NOT NULL,
    role       TEXT  NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor', 'approver')),
    PRIMARY KEY (user_id, role),
    FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id) ON DELETE CASCADE
);
INSERT INTO user_roles_0024 (tenant_id, user_id, role) SELECT tenant_id, user_id, role FROM user_roles;
DROP TABLE user_roles;
ALTER TABLE user_roles_0024 RENAME TO user_roles;
CREATE TRIGGER identity_epoch_user_roles_insert AFTER INSERT ON user_roles
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_user_roles_update AFTER UPDATE ON user_roles
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_user_roles_delete AFTER DELETE ON user_roles
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;

-- A grant may also say who confirms each call it allows: `caller` (the calling person, asked
-- through the client) or `approver` (a second person with the approver role); NULL: nobody.
CREATE TABLE mcp_server_grants_0024 (
    tenant_id   TEXT    NOT NULL,
    server      TEXT    NOT NULL,
    role        TEXT    NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor', 'approver')),
    name        TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    kind        TEXT    NOT NULL DEFAULT 'tool' CHECK (kind IN ('tool', 'prompt', 'resource')),
    confirm     TEXT    CHECK (confirm IN ('caller', 'approver')),
    PRIMARY KEY (tenant_id, server, role, kind, name),
    FOREIGN KEY (tenant_id, server) REFERENCES mcp_server_bindings (tenant_id, server) ON DELETE CASCADE,
    CONSTRAINT mcp_server_grants_name_length
        CHECK (length(name) BETWEEN 1 AND (CASE WHEN kind = 'resource' THEN 2048 ELSE 128 END))
);
INSERT INTO mcp_server_grants_0024 (tenant_id, server, role, name, created_at, kind)
SELECT tenant_id, server, role, name, created_at, kind FROM mcp_server_grants;
DROP TABLE mcp_server_grants;
ALTER TABLE mcp_server_grants_0024 RENAME TO mcp_server_grants;
CREATE TRIGGER identity_epoch_mcp_server_grants_insert AFTER INSERT ON mcp_server_grants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_grants_update AFTER UPDATE ON mcp_server_grants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_grants_delete AFTER DELETE ON mcp_server_grants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;

CREATE TABLE executor_root_allowances_0024 (
    id           TEXT    NOT NULL PRIMARY KEY,
    tenant_id    TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    executor_id  TEXT    NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    base         TEXT    NOT NULL CHECK (base LIKE 'file:/%' AND length(base) <= 1024),
    role         TEXT    NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor', 'approver')),
    created_at   BIGINT  NOT NULL,
    UNIQUE (tenant_id, executor_id, base, role),
    FOREIGN KEY (executor_id, tenant_id) REFERENCES executor_owners (executor_id, tenant_id) ON DELETE CASCADE
);
INSERT INTO executor_root_allowances_0024 (id, tenant_id, executor_id, base, role, created_at)
SELECT id, tenant_id, executor_id, base, role, created_at FROM executor_root_allowances;
DROP TABLE executor_root_allowances;
ALTER TABLE executor_root_allowances_0024 RENAME TO executor_root_allowances;
CREATE TRIGGER identity_epoch_executor_root_allowances_insert AFTER INSERT ON executor_root_allowances
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executor_root_allowances_update AFTER UPDATE ON executor_root_allowances
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executor_root_allowances_delete AFTER DELETE ON executor_root_allowances
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;

CREATE TABLE tenant_role_map_0024 (
    tenant_id    TEXT  NOT NULL REFERENCES tenant_provisioning (tenant_id) ON DELETE CASCADE,
    claim_value  TEXT  NOT NULL CHECK (length(claim_value) BETWEEN 1 AND 256),
    role         TEXT  NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor', 'approver')),
    PRIMARY KEY (tenant_id, claim_value, role)
);
INSERT INTO tenant_role_map_0024 (tenant_id, claim_value, role)
SELECT tenant_id, claim_value, role FROM tenant_role_map;
DROP TABLE tenant_role_map;
ALTER TABLE tenant_role_map_0024 RENAME TO tenant_role_map;

-- Calls waiting for a second person. `arguments`: the call's arguments as canonical JSON (keys
-- sorted, no spaces), exactly what the approver is shown and what is forwarded; `args_digest`
-- its digest. `state`: 'pending' (waiting; refused once `expires_at` has passed), 'approved',
-- 'rejected' or 'lapsed' (nobody decided in time). `decided_by`: the approver's user id (never
-- the caller's: the store refuses it). `ran_at`: when the approved call was forwarded, once.
CREATE TABLE call_approvals (
    id               TEXT    PRIMARY KEY,
    tenant_id        TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    user_id          TEXT    NOT NULL,
    subject          TEXT    NOT NULL,
    server           TEXT    NOT NULL,
    tool             TEXT    NOT NULL,
    title            TEXT,
    arguments        TEXT    NOT NULL,
    args_digest      TEXT    NOT NULL,
    via              TEXT    NOT NULL CHECK (via IN ('wait', 'task')),
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'lapsed')),
    created_at       BIGINT  NOT NULL,
    expires_at       BIGINT  NOT NULL,
    decided_at       BIGINT,
    decided_by       TEXT,
    decided_subject  TEXT,
    reason           TEXT,
    ran_at           BIGINT
);
CREATE INDEX call_approvals_tenant_state ON call_approvals (tenant_id, state, created_at);

-- Consents a caller gave by answering an `input_required` confirmation (protocol 2026-07-28):
-- the retry that carries one is forwarded once. The consent's id is inserted when it is used; a
-- second use of the same id fails on the key, on any replica. A row outlives its consent's
-- expiry only until the next use prunes it.
CREATE TABLE call_consents (
    id          TEXT    PRIMARY KEY,
    tenant_id   TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    expires_at  BIGINT  NOT NULL,
    used_at     BIGINT  NOT NULL
);
CREATE INDEX call_consents_expiry ON call_consents (expires_at);
