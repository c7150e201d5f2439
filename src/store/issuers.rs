//! The identity providers a tenant trusts besides the gateway's own (`tenant_issuers`): an
//! issuer, where its keys are (a key set URL, or discovered from the issuer), the audience its
//! tokens carry, where the subject is, and, for an issuer several tenants trust, the claim that
//! names the tenant. Rows decide nothing: `auth::issuers` verifies tokens with them.

use sqlx::{AnyConnection, Row};

use super::admin::{PLATFORM_SLUG, tenant_id_by_slug, validate_text};
use super::{StoreError, TenantId, now_millis};

/// One issuer one tenant trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedIssuer {
    pub tenant_id: TenantId,
    pub tenant_slug: String,
    pub issuer: String,
    /// The key set; `None`: discovered from the issuer's metadata.
    pub jwks_url: Option<String>,
    /// The `aud` its tokens must carry; `None`: the gateway's audience.
    pub audience: Option<String>,
    /// Where the subject is: a claim name or a JSON pointer.
    pub subject_claim: String,
    /// For an issuer several tenants trust: the claim (name or JSON pointer) whose value must
    /// be this tenant's slug. `None`: every token of the issuer names this tenant.
    pub tenant_claim: Option<String>,
    /// The console's client at this provider: set, the tenant's people sign in to the console
    /// through it (a public client, authorization code + PKCE).
    pub console_client_id: Option<String>,
    /// The scopes the console asks for (space-separated); `None`: `openid`.
    pub console_scopes: Option<String>,
    pub created_at: i64,
}

/// What is given to trust an issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewIssuer {
    pub issuer: String,
    pub jwks_url: Option<String>,
    pub audience: Option<String>,
    pub subject_claim: String,
    pub tenant_claim: Option<String>,
    pub console_client_id: Option<String>,
    pub console_scopes: Option<String>,
}

fn invalid(field: &'static str, message: impl Into<String>) -> StoreError {
    StoreError::Invalid { field, message: message.into() }
}

/// An `https://` URL (or `http://` when `insecure`) without userinfo, query or fragment, whose
/// host is a name or, unless `insecure`, a public address: a tenant's administrator names this
/// address and the gateway fetches from it, so it must not reach the gateway's own network.
pub fn check_url(field: &'static str, text: &str, insecure: bool) -> Result<(), StoreError> {
    validate_text(field, text, 2000)?;
    let url = reqwest::Url::parse(text).map_err(|e| invalid(field, format!("not a URL: {e}")))?;
    match url.scheme() {
        "https" => {}
        "http" if insecure => {}
        _ => return Err(invalid(field, "must be an https:// URL")),
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
        return Err(invalid(field, "must have no user, query or fragment"));
    }
    let Some(host) = url.host_str() else { return Err(invalid(field, "must name a host")) };
    let public = match host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => {
            !(ip.is_loopback() || ip.is_private() || ip.is_link_local() || ip.is_unspecified() || ip.is_broadcast())
        }
        Ok(std::net::IpAddr::V6(ip)) => {
            !(ip.is_loopback() || ip.is_unspecified() || ip.is_unique_local() || ip.is_unicast_link_local())
        }
        Err(_) => {
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            !(name == "localhost" || name.ends_with(".localhost") || name.ends_with(".internal"))
        }
    };
    if !public && !insecure {
        return Err(invalid(field, "must name a public host, not a loopback, private or link-local one"));
    }
    Ok(())
}

fn check_claim(field: &'static str, path: &str) -> Result<(), StoreError> {
    validate_text(field, path, 200)?;
    if path == "/" {
        return Err(invalid(field, "must name a claim (`sub`) or be a JSON pointer (`/user/id`)"));
    }
    Ok(())
}

/// Space-separated scope tokens of RFC 6749 section 3.3 (printable ASCII but `"` and `\\`).
fn check_scopes(scopes: &str) -> Result<(), StoreError> {
    validate_text("console_scopes", scopes, 1000)?;
    let token = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
    if !scopes.split(' ').all(token) {
        return Err(invalid("console_scopes", "must be scope names separated by single spaces"));
    }
    Ok(())
}

impl NewIssuer {
    /// Checks the shapes; `insecure` admits `http://` and loopback or private hosts (tests and
    /// development only: `auth.tenant_issuers_insecure`).
    pub fn check(&self, insecure: bool) -> Result<(), StoreError> {
        check_url("issuer", &self.issuer, insecure)?;
        if let Some(url) = &self.jwks_url {
            check_url("jwks_url", url, insecure)?;
        }
        if let Some(audience) = &self.audience {
            validate_text("audience", audience, 2000)?;
        }
        check_claim("subject_claim", &self.subject_claim)?;
        if let Some(claim) = &self.tenant_claim {
            check_claim("tenant_claim", claim)?;
        }
        if let Some(client) = &self.console_client_id {
            validate_text("console_client_id", client, 200)?;
            if client.chars().any(|c| c.is_whitespace()) {
                return Err(invalid("console_client_id", "must have no spaces"));
            }
        }
        if let Some(scopes) = &self.console_scopes {
            if self.console_client_id.is_none() {
                return Err(invalid("console_scopes", "needs a console_client_id"));
            }
            check_scopes(scopes)?;
        }
        Ok(())
    }
}

const COLUMNS: &str = "t.id, t.slug, i.issuer, i.jwks_url, i.audience, i.subject_claim, i.tenant_claim, \
                       i.console_client_id, i.console_scopes, i.created_at";

fn row(r: &sqlx::any::AnyRow) -> Result<TrustedIssuer, StoreError> {
    let id: String = r.try_get(0)?;
    Ok(TrustedIssuer {
        tenant_id: id.parse().map_err(|e: uuid::Error| invalid("tenant_id", e.to_string()))?,
        tenant_slug: r.try_get(1)?,
        issuer: r.try_get(2)?,
        jwks_url: r.try_get(3)?,
        audience: r.try_get(4)?,
        subject_claim: r.try_get(5)?,
        tenant_claim: r.try_get(6)?,
        console_client_id: r.try_get(7)?,
        console_scopes: r.try_get(8)?,
        created_at: r.try_get(9)?,
    })
}

/// Every trust of every tenant that is not retired, by issuer then tenant slug.
pub async fn all(conn: &mut AnyConnection) -> Result<Vec<TrustedIssuer>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM tenant_issuers i JOIN tenants t ON t.id = i.tenant_id \
          WHERE t.retired_at IS NULL ORDER BY i.issuer, t.slug"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(conn).await?.iter().map(row).collect()
}

/// The issuers `tenant` trusts, by issuer.
pub async fn of_tenant(conn: &mut AnyConnection, tenant_slug: &str) -> Result<Vec<TrustedIssuer>, StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let sql = format!(
        "SELECT {COLUMNS} FROM tenant_issuers i JOIN tenants t ON t.id = i.tenant_id \
          WHERE i.tenant_id = $1 ORDER BY i.issuer"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql)).bind(tenant).fetch_all(conn).await?.iter().map(row).collect()
}

/// `tenant` trusts `new.issuer` from now on (checked with [`NewIssuer::check`] first by the
/// caller). A tenant trusts an issuer once.
pub async fn add(conn: &mut AnyConnection, tenant_slug: &str, new: &NewIssuer) -> Result<TrustedIssuer, StoreError> {
    if tenant_slug == PLATFORM_SLUG {
        return Err(StoreError::NotFound(format!("tenant `{tenant_slug}` does not exist")));
    }
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let created_at = now_millis();
    sqlx::query(
        "INSERT INTO tenant_issuers \
           (id, tenant_id, issuer, jwks_url, audience, subject_claim, tenant_claim, \
            console_client_id, console_scopes, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(uuid::Uuid::new_v4().to_string())
    .bind(tenant)
    .bind(&new.issuer)
    .bind(&new.jwks_url)
    .bind(&new.audience)
    .bind(&new.subject_claim)
    .bind(&new.tenant_claim)
    .bind(&new.console_client_id)
    .bind(&new.console_scopes)
    .bind(created_at)
    .execute(&mut *conn)
    .await
    .map_err(|e| {
        super::unique_conflict(e, || format!("tenant `{tenant_slug}` already trusts issuer `{}`", new.issuer))
    })?;
    Ok(TrustedIssuer {
        tenant_id: tenant,
        tenant_slug: tenant_slug.to_owned(),
        issuer: new.issuer.clone(),
        jwks_url: new.jwks_url.clone(),
        audience: new.audience.clone(),
        subject_claim: new.subject_claim.clone(),
        tenant_claim: new.tenant_claim.clone(),
        console_client_id: new.console_client_id.clone(),
        console_scopes: new.console_scopes.clone(),
        created_at,
    })
}

/// `tenant` no longer trusts `issuer`.
pub async fn remove(conn: &mut AnyConnection, tenant_slug: &str, issuer: &str) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let done = sqlx::query("DELETE FROM tenant_issuers WHERE tenant_id = $1 AND issuer = $2")
        .bind(tenant)
        .bind(issuer)
        .execute(conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("tenant `{tenant_slug}` does not trust issuer `{issuer}`")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn issuer_urls_must_be_public_https_unless_insecure() {
        assert!(check_url("issuer", "https://login.example.com/tenant-1/v2.0", false).is_ok());
        for bad in [
            "http://login.example.com",
            "https://127.0.0.1:8443",
            "https://10.1.2.3",
            "https://169.254.169.254/latest",
            "https://[::1]/",
            "https://[fd00::1]/",
            "https://localhost/",
            "https://metadata.google.internal/",
            "https://user:pw@login.example.com",
            "https://login.example.com/?x=1",
            "ftp://login.example.com",
        ] {
            assert!(check_url("issuer", bad, false).is_err(), "{bad}");
        }
        assert!(check_url("issuer", "http://127.0.0.1:8080", true).is_ok());
        assert!(check_url("issuer", "ftp://127.0.0.1", true).is_err());
    }
}
