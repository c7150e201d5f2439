-- How many calls an event stands for: 1, except for an aggregated refusal (calls refused
-- by the rate limiter within one window, written as one event).
ALTER TABLE audit_events ADD COLUMN calls BIGINT NOT NULL DEFAULT 1;
