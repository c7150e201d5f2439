-- Users made on first sight (admin API: /tenants/{tenant}/provisioning): a tenant that opts in
-- names the claim of its users' tokens that carries their groups, and maps each group to the
-- roles it gives. A verified token of an unknown subject then becomes a user of the tenant
-- with the roles its groups map to, never any other; a token whose groups map to none is
-- refused as any unknown user is. Off (no row) by default.
CREATE TABLE tenant_provisioning (
    tenant_id   TEXT    NOT NULL PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    role_claim  TEXT    NOT NULL CHECK (length(role_claim) BETWEEN 1 AND 128),
    created_at  BIGINT  NOT NULL
);
CREATE TABLE tenant_role_map (
    tenant_id    TEXT  NOT NULL REFERENCES tenant_provisioning (tenant_id) ON DELETE CASCADE,
    claim_value  TEXT  NOT NULL CHECK (length(claim_value) BETWEEN 1 AND 256),
    role         TEXT  NOT NULL CHECK (role IN ('owner', 'manager', 'worker', 'auditor')),
    PRIMARY KEY (tenant_id, claim_value, role)
);
