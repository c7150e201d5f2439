-- Which plugin roots a tenant's sessions may select on a remote executor. A selected root's
-- `.mcp.json` is read and its servers run on that executor, so nothing is allowed by default:
-- a role may select a root only at or below a `base` allowed to it here (fail closed).
--
-- `base` is a canonical `file:` URI exactly as the gateway prints it (`file:///srv/plugins`,
-- `file:///C:/plugins`, `file://server/share/plugins`); the store checks the form, the table
-- only its shape. An allowance hangs off the tenant's ownership of the executor: taking the
-- executor from the tenant (or deleting the executor or the tenant) drops its allowances.
CREATE TABLE executor_root_allowances (
    id           TEXT    NOT NULL PRIMARY KEY,
    tenant_id    TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    executor_id  TEXT    NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    base         TEXT    NOT NULL CHECK (base LIKE 'file:/%' AND length(base) <= 1024),
    role         TEXT    NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor')),
    created_at   BIGINT  NOT NULL,
    UNIQUE (tenant_id, executor_id, base, role),
    FOREIGN KEY (executor_id, tenant_id) REFERENCES executor_owners (executor_id, tenant_id) ON DELETE CASCADE
);
