-- Upstream MCP servers: executors (where servers run), per-tenant `mcp-server` entities
-- under hierarchical names, and per-tenant bindings of a server id to an executor.

-- An executor is global to the gateway: the gateway host itself (`local`) or a remote agent.
CREATE TABLE executors (
    id          TEXT    NOT NULL PRIMARY KEY,
    name        TEXT    NOT NULL UNIQUE,
    machine     TEXT    NOT NULL,
    run_as      TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('local', 'remote')),
    created_at  BIGINT  NOT NULL
);

-- One server declaration (the JSON of one `.mcp.json` entry) under a hierarchical name:
--   machines/{machine}/profile/mcp-servers/{server}
--   users/{user}/mcp-servers/{server}
--   defaults/mcp-servers/{server}
CREATE TABLE mcp_server_entities (
    id           TEXT    NOT NULL PRIMARY KEY,
    tenant_id    TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name         TEXT    NOT NULL,
    server       TEXT    NOT NULL,
    declaration  TEXT    NOT NULL,
    created_at   BIGINT  NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX mcp_server_entities_server ON mcp_server_entities (tenant_id, server);

CREATE TABLE mcp_server_bindings (
    tenant_id    TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    server       TEXT    NOT NULL,
    executor_id  TEXT    NOT NULL REFERENCES executors (id),
    created_at   BIGINT  NOT NULL,
    PRIMARY KEY (tenant_id, server)
);
