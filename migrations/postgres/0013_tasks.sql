-- Tasks (the `io.modelcontextprotocol/tasks` extension) the gateway handed out. A caller sees
-- only a sealed handle naming `id`; the row binds it to its owner (tenant and user), the
-- upstream server and tool the call went to (as the caller named them), the capabilities of
-- the connection it was created on (`caps`, so polls reach the same upstream process), the
-- upstream's own task id, and an expiry (epoch ms) after which it is unknown. `status` is the
-- last one the gateway saw; `terminal_at` is set once, when it first saw a terminal one, so
-- the terminal state is audited once. `cancel_requested_at` records a `tasks/cancel`.
CREATE TABLE tasks (
    id                   TEXT    NOT NULL PRIMARY KEY,
    tenant_id            TEXT    NOT NULL,
    user_id              TEXT    NOT NULL,
    server               TEXT    NOT NULL,
    tool                 TEXT    NOT NULL,
    caps                 TEXT    NOT NULL,
    upstream_task_id     TEXT    NOT NULL,
    args_digest          TEXT    NOT NULL,
    status               TEXT    NOT NULL CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
    created_at           BIGINT  NOT NULL,
    updated_at           BIGINT  NOT NULL,
    expires_at           BIGINT  NOT NULL,
    terminal_at          BIGINT,
    cancel_requested_at  BIGINT,
    FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX tasks_expiry ON tasks (expires_at);
CREATE INDEX tasks_owner ON tasks (tenant_id, user_id);
