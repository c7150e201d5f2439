-- Remote executors belong to tenants and authenticate with a secret.
--
-- `secret_hash` is the hex SHA-256 of the remote executor's secret (the secret itself is shown
-- once and never stored); NULL for `local`, which never authenticates. A remote executor from
-- before this migration has none: it can't authenticate until its secret is rotated.
ALTER TABLE executors ADD COLUMN secret_hash TEXT CHECK (secret_hash IS NULL OR kind = 'remote');

-- The tenants that own a remote executor: only they may bind servers to it, and the resolver
-- ignores a binding of a tenant that does not (or no longer) own it. `local` has no owners:
-- every tenant may bind it.
CREATE TABLE executor_owners (
    executor_id  TEXT  NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    tenant_id    TEXT  NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    PRIMARY KEY (executor_id, tenant_id)
);
CREATE INDEX executor_owners_tenant ON executor_owners (tenant_id);

-- The tenants already bound to a remote executor keep it: they become its owners.
INSERT INTO executor_owners (executor_id, tenant_id)
SELECT DISTINCT b.executor_id, b.tenant_id
  FROM mcp_server_bindings b JOIN executors x ON x.id = b.executor_id
 WHERE x.kind = 'remote';
