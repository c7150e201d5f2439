//! The SaaS's billing client. Holds the payment provider's secret key; no tool may reach
//! either (the build fails if one does: `guards.toml`, row S1).

/// The payment provider's secret key: it can charge any customer, whatever the tenant.
pub struct BillingApiKey(String);

impl BillingApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
}

/// Talks to the payment provider with the key. Back-office code only.
pub struct BillingClient {
    key: BillingApiKey,
}

impl BillingClient {
    pub fn new(key: BillingApiKey) -> Self {
        Self { key }
    }

    /// The key's last four characters, for logs.
    pub fn key_hint(&self) -> &str {
        let n = self.key.0.len().saturating_sub(4);
        self.key.0.get(n..).unwrap_or_default()
    }
}
