-- Grants of prompts and resources beside tools, and bindings whose names go unprefixed.
--
-- A grant gets a `kind` (`tool`, `prompt` or `resource`); every grant made before this
-- migration is a tool grant. Its `tool` column becomes `name`: a tool or prompt name (1-128
-- characters, checked by the store), `*`, or for a resource a URI or URI prefix ending in `*`
-- (at most 2048 bytes). The same name may be granted once per kind, so the key includes `kind`.
-- SQLite can't change a primary key in place: the table is rebuilt and its rows copied.
-- Nothing references mcp_server_grants, so dropping the old table cascades nowhere.
CREATE TABLE mcp_server_grants_0011 (
    tenant_id   TEXT    NOT NULL,
    server      TEXT    NOT NULL,
    role        TEXT    NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor')),
    name        TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    kind        TEXT    NOT NULL DEFAULT 'tool' CHECK (kind IN ('tool', 'prompt', 'resource')),
    PRIMARY KEY (tenant_id, server, role, kind, name),
    FOREIGN KEY (tenant_id, server) REFERENCES mcp_server_bindings (tenant_id, server) ON DELETE CASCADE,
    CONSTRAINT mcp_server_grants_name_length
        CHECK (length(name) BETWEEN 1 AND (CASE WHEN kind = 'resource' THEN 2048 ELSE 128 END))
);
INSERT INTO mcp_server_grants_0011 (tenant_id, server, role, name, created_at, kind)
SELECT tenant_id, server, role, tool, created_at, 'tool' FROM mcp_server_grants;
DROP TABLE mcp_server_grants;
ALTER TABLE mcp_server_grants_0011 RENAME TO mcp_server_grants;

-- `prefixed` is 1 when the server's tools and prompts are exposed as `server__name` (every
-- binding made before this migration, and the default), 0 for `binding set --no-prefix`. A
-- BIGINT 0/1, not a BOOLEAN: both databases read it alike through sqlx's Any driver. At most
-- one unprefixed server per tenant, so two servers' names can never meet unprefixed.
ALTER TABLE mcp_server_bindings ADD COLUMN prefixed BIGINT NOT NULL DEFAULT 1 CHECK (prefixed IN (0, 1));
CREATE UNIQUE INDEX mcp_server_bindings_one_unprefixed ON mcp_server_bindings (tenant_id) WHERE prefixed = 0;
