-- Identity providers a tenant trusts besides the gateway's own (auth.issuer): tenant A signs
-- in with its Entra, tenant B with its Okta. A token of such an issuer is verified with that
-- issuer's keys (jwks_url, or discovered from the issuer) and audience (NULL: the gateway's),
-- and resolves only to a tenant that trusts it: the one row's tenant, or, for an issuer that
-- several tenants trust, the row whose tenant the token's tenant_claim names.
CREATE TABLE tenant_issuers (
    id            TEXT    PRIMARY KEY,
    tenant_id     TEXT    NOT NULL REFERENCES tenants (id),
    issuer        TEXT    NOT NULL,
    jwks_url      TEXT,
    audience      TEXT,
    subject_claim TEXT    NOT NULL,
    tenant_claim  TEXT,
    created_at    BIGINT  NOT NULL,
    UNIQUE (tenant_id, issuer)
);
CREATE INDEX tenant_issuers_issuer ON tenant_issuers (issuer);

-- A trust added or removed moves the identity change counter: a removed issuer stops working
-- within one read of it.
CREATE TRIGGER identity_epoch_tenant_issuers_insert AFTER INSERT ON tenant_issuers
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tenant_issuers_update AFTER UPDATE ON tenant_issuers
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
CREATE TRIGGER identity_epoch_tenant_issuers_delete AFTER DELETE ON tenant_issuers
BEGIN UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1; END;
