-- A tenant is retired, never deleted: its audit chain (and the tenant row it hangs on) stays,
-- verifiable and exportable. A retired tenant is suspended for good (no token of it is
-- accepted, no change names it but a purge of its data, which keeps the chain).
ALTER TABLE tenants ADD COLUMN retired_at BIGINT;

-- The platform chain: platform administrators' acts (and the operator's, through the CLI),
-- including those that touch no tenant (executors created and deleted, tenants retired and
-- purged). It hangs on this row, which no token and no tenant route can name: its slug is
-- no valid tenant slug, and it is never active.
INSERT INTO tenants (id, slug, name, status, created_at)
VALUES ('00000000-0000-0000-0000-000000000000', '@platform', 'Platform administration', 'suspended', 0);
