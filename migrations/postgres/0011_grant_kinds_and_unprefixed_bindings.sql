-- Grants of prompts and resources beside tools, and bindings whose names go unprefixed.
--
-- A grant gets a `kind` (`tool`, `prompt` or `resource`); every grant made before this
-- migration is a tool grant. Its `tool` column becomes `name`: a tool or prompt name (1-128
-- characters, checked by the store), `*`, or for a resource a URI or URI prefix ending in `*`
-- (at most 2048 bytes). The same name may be granted once per kind, so the key includes `kind`.
-- (SQLite rebuilds the table for this; PostgreSQL alters it in place. The columns are the same.)
ALTER TABLE mcp_server_grants RENAME COLUMN tool TO name;
ALTER TABLE mcp_server_grants
    ADD COLUMN kind TEXT NOT NULL DEFAULT 'tool' CHECK (kind IN ('tool', 'prompt', 'resource')),
    DROP CONSTRAINT mcp_server_grants_tool_check,
    ADD CONSTRAINT mcp_server_grants_name_length
        CHECK (length(name) BETWEEN 1 AND (CASE WHEN kind = 'resource' THEN 2048 ELSE 128 END)),
    DROP CONSTRAINT mcp_server_grants_pkey,
    ADD PRIMARY KEY (tenant_id, server, role, kind, name);

-- `prefixed` is 1 when the server's tools and prompts are exposed as `server__name` (every
-- binding made before this migration, and the default), 0 for `binding set --no-prefix`. A
-- BIGINT 0/1, not a BOOLEAN: both databases read it alike through sqlx's Any driver. At most
-- one unprefixed server per tenant, so two servers' names can never meet unprefixed.
ALTER TABLE mcp_server_bindings ADD COLUMN prefixed BIGINT NOT NULL DEFAULT 1 CHECK (prefixed IN (0, 1));
CREATE UNIQUE INDEX mcp_server_bindings_one_unprefixed ON mcp_server_bindings (tenant_id) WHERE prefixed = 0;
