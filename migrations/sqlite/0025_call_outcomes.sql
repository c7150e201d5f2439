-- A proxied call leaves two events in its tenant's chain (issue 51): its record (outcome
-- `started`), committed while the upstream works, and its outcome, appended after the answer,
-- which names the record (`call_id`) and the digest of the result the caller was given
-- (`result_digest`). A record without an outcome is a call whose outcome is unknown (the
-- gateway stopped while it ran).
ALTER TABLE audit_events ADD COLUMN call_id TEXT;
ALTER TABLE audit_events ADD COLUMN result_digest TEXT;
CREATE INDEX audit_events_call ON audit_events (tenant_id, call_id) WHERE call_id IS NOT NULL;

-- A tenant whose call records must be durable BEFORE the upstream sees the call (no side
-- effect without a record), at the cost of waiting for the commit and then for the upstream.
-- BIGINT 0/1, as every flag: both databases read it alike through sqlx's Any driver.
ALTER TABLE tenants ADD COLUMN audit_write_ahead BIGINT NOT NULL DEFAULT 0 CHECK (audit_write_ahead IN (0, 1));
