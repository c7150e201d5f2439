-- The change counter behind the identity cache (0004) counts changes of what a caller's
-- upstream servers are resolved from too: the executors, their owners and root allowances, the
-- server declarations, bindings and grants. A request without a session (2026-07-28) reuses
-- its caller's resolved servers only while the counter has not moved, so a revoked grant or a
-- removed binding applies to it within one read of the counter, as an identity change does.
-- (A session keeps the servers it was resolved with for its life.)
CREATE TRIGGER identity_epoch_executors AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON executors
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
CREATE TRIGGER identity_epoch_executor_owners AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON executor_owners
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
CREATE TRIGGER identity_epoch_executor_root_allowances AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON executor_root_allowances
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
CREATE TRIGGER identity_epoch_mcp_server_entities AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON mcp_server_entities
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
CREATE TRIGGER identity_epoch_mcp_server_bindings AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON mcp_server_bindings
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
CREATE TRIGGER identity_epoch_mcp_server_grants AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON mcp_server_grants
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
