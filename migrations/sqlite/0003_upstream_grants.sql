-- Per-tenant allow list of upstream tools. An upstream tool is listed and callable for a
-- caller only when a grant names its server, one of the caller's roles, and the tool (or `*`
-- for every tool of that server). No grant, no tool: the proxy fails closed.

-- Grants hang off the binding: unbinding a server (or deleting the tenant) drops its grants.
-- `tool` is `*` or one upstream tool name; its characters are checked by the store.
CREATE TABLE mcp_server_grants (
    tenant_id   TEXT    NOT NULL,
    server      TEXT    NOT NULL,
    role        TEXT    NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor')),
    tool        TEXT    NOT NULL CHECK (length(tool) BETWEEN 1 AND 128),
    created_at  BIGINT  NOT NULL,
    PRIMARY KEY (tenant_id, server, role, tool),
    FOREIGN KEY (tenant_id, server) REFERENCES mcp_server_bindings (tenant_id, server) ON DELETE CASCADE
);
