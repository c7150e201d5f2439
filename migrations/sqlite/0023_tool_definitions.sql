-- Upstream definitions pinned per tenant and binding (issue 48).
--
-- `pin` says how a binding's tool, prompt and resource template definitions are served:
-- 'approve' (a definition first seen is held until an owner approves it), 'trust_first_use'
-- (approved on first sight, held when it changes; every binding made before this migration),
-- 'follow' (served as the upstream lists them now, nothing pinned).
ALTER TABLE mcp_server_bindings ADD COLUMN pin TEXT NOT NULL DEFAULT 'trust_first_use'
    CHECK (pin IN ('approve', 'trust_first_use', 'follow'));

-- Every definition the gateway saw of a pinned binding's items. `kind`: 'tool', 'prompt' or
-- 'template' (a resource template, named by its URI template). `digest`: `sha256:` and the hex
-- SHA-256 of `definition`, the item's canonical JSON (keys sorted, no spaces), which is what is
-- served when it is approved. `state`: 'approved' (served; at most one per item), 'held'
-- (waiting for an owner; while one is, the item is served nowhere), 'rejected' (never served),
-- 'replaced' (approved once, before the approved one). `decided_by`: the actor who approved or
-- rejected it (`trust_first_use` for a definition approved on first sight).
CREATE TABLE tool_definitions (
    id             TEXT    PRIMARY KEY,
    tenant_id      TEXT    NOT NULL,
    server         TEXT    NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN ('tool', 'prompt', 'template')),
    name           TEXT    NOT NULL,
    digest         TEXT    NOT NULL,
    definition     TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('approved', 'held', 'rejected', 'replaced')),
    first_seen_at  BIGINT  NOT NULL,
    decided_at     BIGINT,
    decided_by     TEXT,
    UNIQUE (tenant_id, server, kind, name, digest),
    FOREIGN KEY (tenant_id, server) REFERENCES mcp_server_bindings (tenant_id, server) ON DELETE CASCADE
);
CREATE UNIQUE INDEX tool_definitions_one_approved ON tool_definitions (tenant_id, server, kind, name)
    WHERE state = 'approved';
CREATE INDEX tool_definitions_state ON tool_definitions (tenant_id, state);

-- A definition seen, approved or rejected moves the change counter (0004): every replica
-- serves what the database holds within one read of it.
CREATE TRIGGER identity_epoch_tool_definitions_insert AFTER INSERT ON tool_definitions
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tool_definitions_update AFTER UPDATE ON tool_definitions
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tool_definitions_delete AFTER DELETE ON tool_definitions
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
