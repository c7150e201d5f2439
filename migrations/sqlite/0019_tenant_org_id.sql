-- The organization id a tenant has at the identity provider (`org_AbC123`), recorded by a
-- platform administrator, so that a token whose tenant claim holds it (auth.tenant_match =
-- "org_id") resolves to this tenant. At most one tenant per organization id.
ALTER TABLE tenants ADD COLUMN org_id TEXT;
CREATE UNIQUE INDEX tenants_org_id ON tenants (org_id);
