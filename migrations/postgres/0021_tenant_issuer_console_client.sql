-- The console's client at a tenant's own identity provider: with it, the tenant's people sign
-- in to the console through that provider (authorization code + PKCE, a public client: no
-- secret is kept here). console_scopes: the scopes asked for (space-separated; NULL: openid).
ALTER TABLE tenant_issuers ADD COLUMN console_client_id TEXT;
ALTER TABLE tenant_issuers ADD COLUMN console_scopes TEXT;
