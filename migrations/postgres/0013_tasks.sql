-- Tasks (the `io.modelcontextprotocol/tasks` extension) the gateway handed out. A caller sees
-- only a sealed handle naming `id`; the row binds it to its owner (tenant and user), the
-- upstream server and tool the call went to (as the caller named them), the capabilities of
-- the connection it was created on (`caps`, so polls reach the same upstream process) and an
-- expiry (epoch ms) after which it is unknown.
--
-- An upstream with the extension runs its own tasks: `upstream_task_id` is its id, `status`
-- the last one a poll saw. For an upstream without it, the gateway runs the call itself
-- (`upstream_task_id` NULL): the replica running it keeps `lease_until` in the future while
-- it does (a task whose lease lapsed unfinished failed with its replica), writes the result
-- (`result`, a tool result as JSON, bounded) or the JSON-RPC error (`error`), and the
-- questions the upstream asks its client along the way (`task_inputs`).
--
-- `terminal_at` is set once, when the first terminal status is seen, so that end is audited
-- once. `cancel_requested_at` records a `tasks/cancel` (the replica running the task reads it).
CREATE TABLE tasks (
    id                   TEXT    NOT NULL PRIMARY KEY,
    tenant_id            TEXT    NOT NULL,
    user_id              TEXT    NOT NULL,
    server               TEXT    NOT NULL,
    tool                 TEXT    NOT NULL,
    caps                 TEXT    NOT NULL,
    upstream_task_id     TEXT,
    args_digest          TEXT    NOT NULL,
    status               TEXT    NOT NULL CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
    created_at           BIGINT  NOT NULL,
    updated_at           BIGINT  NOT NULL,
    expires_at           BIGINT  NOT NULL,
    terminal_at          BIGINT,
    cancel_requested_at  BIGINT,
    lease_until          BIGINT,
    result               TEXT,
    error                TEXT,
    FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX tasks_expiry ON tasks (expires_at);
CREATE INDEX tasks_owner ON tasks (tenant_id, user_id);

-- What a task the gateway runs asks its caller: the request (`request`, JSON) under a key the
-- gateway minted, unique in the task; `response` (JSON) once a `tasks/update` answered it,
-- `delivered_at` once the running replica passed the answer on.
CREATE TABLE task_inputs (
    task_id       TEXT    NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    input_key     TEXT    NOT NULL,
    request       TEXT    NOT NULL,
    response      TEXT,
    created_at    BIGINT  NOT NULL,
    delivered_at  BIGINT,
    PRIMARY KEY (task_id, input_key)
);
