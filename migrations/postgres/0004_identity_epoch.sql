-- The identity change counter behind the identity cache: every insert, update, delete or
-- truncate of the rows identity resolution reads bumps it, whoever makes the change (the
-- admin commands, another gateway, or SQL by hand). A gateway reuses identity rows only while
-- the counter has not moved. Foreign-key cascades (a deleted flock's assignments, say) fire
-- these triggers too.
CREATE TABLE identity_epoch (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    epoch  BIGINT  NOT NULL
);
INSERT INTO identity_epoch (id, epoch) VALUES (1, 0);

CREATE FUNCTION bump_identity_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1;
    RETURN NULL;
END;
$$;

CREATE TRIGGER identity_epoch_tenants AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
CREATE TRIGGER identity_epoch_users AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON users
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
CREATE TRIGGER identity_epoch_user_roles AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON user_roles
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
CREATE TRIGGER identity_epoch_flock_assignments AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flock_assignments
    FOR EACH STATEMENT EXECUTE FUNCTION bump_identity_epoch();
