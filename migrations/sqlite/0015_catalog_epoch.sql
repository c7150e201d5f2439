-- The change counter behind the identity cache (0004) counts changes of what a caller's
-- upstream servers are resolved from too: the executors, their owners and root allowances, the
-- server declarations, bindings and grants. A request without a session (2026-07-28) reuses
-- its caller's resolved servers only while the counter has not moved, so a revoked grant or a
-- removed binding applies to it within one read of the counter, as an identity change does.
-- (A session keeps the servers it was resolved with for its life.)
CREATE TRIGGER identity_epoch_executors_insert AFTER INSERT ON executors
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executors_update AFTER UPDATE ON executors
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executors_delete AFTER DELETE ON executors
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executor_owners_insert AFTER INSERT ON executor_owners
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executor_owners_update AFTER UPDATE ON executor_owners
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executor_owners_delete AFTER DELETE ON executor_owners
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executor_root_allowances_insert AFTER INSERT ON executor_root_allowances
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executor_root_allowances_update AFTER UPDATE ON executor_root_allowances
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_executor_root_allowances_delete AFTER DELETE ON executor_root_allowances
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_entities_insert AFTER INSERT ON mcp_server_entities
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_entities_update AFTER UPDATE ON mcp_server_entities
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_entities_delete AFTER DELETE ON mcp_server_entities
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_bindings_insert AFTER INSERT ON mcp_server_bindings
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_bindings_update AFTER UPDATE ON mcp_server_bindings
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_bindings_delete AFTER DELETE ON mcp_server_bindings
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_grants_insert AFTER INSERT ON mcp_server_grants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_grants_update AFTER UPDATE ON mcp_server_grants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_mcp_server_grants_delete AFTER DELETE ON mcp_server_grants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
