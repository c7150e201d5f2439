-- Cedar policies (issue 47). A tenant's owners write the tenant's; platform administrators
-- write the platform's (on the platform row, 0018), which take part in every tenant's
-- decisions. `name` is the policy's id as its author wrote it, unique per tenant and among the
-- platform's; `body` is its Cedar text, `digest` the SHA-256 of that text. `mode`: 'enforce'
-- (it decides) or 'log_only' (evaluated and audited beside the decision, deciding nothing).
CREATE TABLE policies (
    id          TEXT    PRIMARY KEY,
    tenant_id   TEXT    NOT NULL REFERENCES tenants (id),
    name        TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    digest      TEXT    NOT NULL,
    mode        TEXT    NOT NULL DEFAULT 'enforce',
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL,
    UNIQUE (tenant_id, name)
);

-- How a tenant's policies take part as a whole: 'enforce' (each as its own mode says) or
-- 'log_only' (all of them evaluated and audited; grants and the platform's policies decide).
ALTER TABLE tenants ADD COLUMN policy_mode TEXT NOT NULL DEFAULT 'enforce';

-- The tools each bound server of a tenant listed, as the gateway last saw them: what a tenant's
-- policy schema is generated from (by the gateway and by `scopegate admin` alike). `tools` is
-- the JSON array of their definitions; `digest` its SHA-256, compared before a write.
CREATE TABLE tool_catalogue (
    tenant_id  TEXT    NOT NULL REFERENCES tenants (id),
    server     TEXT    NOT NULL,
    tools      TEXT    NOT NULL,
    digest     TEXT    NOT NULL,
    seen_at    BIGINT  NOT NULL,
    PRIMARY KEY (tenant_id, server)
);

-- The deciding policies of a call whose tenant has policies (JSON: decision, reason, policy
-- ids, and a log-only tenant's own decision). NULL when grants alone decided; absent from the
-- chain hash then, so earlier events hash as they did.
ALTER TABLE audit_events ADD COLUMN policy TEXT;

-- A policy, a tenant's mode or a catalogue written moves the change counter (0004): every
-- replica loads the tenant's policies again within one read of it.
CREATE TRIGGER identity_epoch_policies_insert AFTER INSERT ON policies
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_policies_update AFTER UPDATE ON policies
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_policies_delete AFTER DELETE ON policies
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tool_catalogue_insert AFTER INSERT ON tool_catalogue
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tool_catalogue_update AFTER UPDATE ON tool_catalogue
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tool_catalogue_delete AFTER DELETE ON tool_catalogue
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
