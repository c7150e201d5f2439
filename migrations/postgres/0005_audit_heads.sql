-- Each tenant's audit chain head (its newest event's seq and hash; seq 0 and the genesis hash
-- for a chain with no events yet). Every append, whichever gateway replica makes it, updates
-- this row in the append's own transaction: the row lock serialises the appends of a tenant in
-- the database, so two replicas never claim the same seq.
CREATE TABLE audit_heads (
    tenant_id  TEXT    NOT NULL PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    seq        BIGINT  NOT NULL,
    hash       TEXT    NOT NULL
);
INSERT INTO audit_heads (tenant_id, seq, hash)
SELECT e.tenant_id, e.seq, e.hash FROM audit_events e
WHERE e.seq = (SELECT MAX(m.seq) FROM audit_events m WHERE m.tenant_id = e.tenant_id);
