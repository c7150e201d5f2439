-- Calls a person confirms (issue 49).
--
-- A new role, `approver`: a user holding it may approve or reject the calls of the other users
-- of its tenant that wait for a second person. The four tables that name roles accept it.
-- (SQLite rebuilds them for this; PostgreSQL alters their checks in place.)
ALTER TABLE user_roles DROP CONSTRAINT user_roles_role_check,
    ADD CONSTRAINT user_roles_role_check CHECK (role IN ('owner', 'manager', 'worker', 'auditor', 'approver'));
ALTER TABLE executor_root_allowances DROP CONSTRAINT executor_root_allowances_role_check,
    ADD CONSTRAINT executor_root_allowances_role_check
        CHECK (role IN ('owner', 'manager', 'worker', 'auditor', 'approver'));
ALTER TABLE tenant_role_map DROP CONSTRAINT tenant_role_map_role_check,
    ADD CONSTRAINT tenant_role_map_role_check CHECK (role IN ('owner', 'manager', 'worker', 'auditor', 'approver'));

-- A grant may also say who confirms each call it allows: `caller` (the calling person, asked
-- through the client) or `approver` (a second person with the approver role); NULL: nobody.
ALTER TABLE mcp_server_grants DROP CONSTRAINT mcp_server_grants_role_check,
    ADD CONSTRAINT mcp_server_grants_role_check CHECK (role IN ('owner', 'manager', 'worker', 'auditor', 'approver')),
    ADD COLUMN confirm TEXT CHECK (confirm IN ('caller', 'approver'));

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
