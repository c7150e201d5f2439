-- The identity change counter behind the identity cache: every insert, update or delete of
-- the rows identity resolution reads bumps it, whoever makes the change (the admin commands,
-- another gateway, or SQL by hand). A gateway reuses identity rows only while the counter has
-- not moved. Foreign-key cascades (a deleted flock's assignments, say) fire these triggers too.
CREATE TABLE identity_epoch (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    epoch  BIGINT  NOT NULL
);
INSERT INTO identity_epoch (id, epoch) VALUES (1, 0);

CREATE TRIGGER identity_epoch_tenants_insert AFTER INSERT ON tenants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tenants_update AFTER UPDATE ON tenants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tenants_delete AFTER DELETE ON tenants
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;

CREATE TRIGGER identity_epoch_users_insert AFTER INSERT ON users
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_users_update AFTER UPDATE ON users
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_users_delete AFTER DELETE ON users
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;

CREATE TRIGGER identity_epoch_user_roles_insert AFTER INSERT ON user_roles
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_user_roles_update AFTER UPDATE ON user_roles
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_user_roles_delete AFTER DELETE ON user_roles
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;

CREATE TRIGGER identity_epoch_flock_assignments_insert AFTER INSERT ON flock_assignments
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_flock_assignments_update AFTER UPDATE ON flock_assignments
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_flock_assignments_delete AFTER DELETE ON flock_assignments
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
