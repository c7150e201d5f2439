//! The demo data of the contract (acme and globex), seeded in one transaction into an empty database.

use sqlx::AnyConnection;
use time::{Duration, OffsetDateTime};

use super::admin::{self, count_tenants};
use super::{Db, StoreError, now_millis};
use crate::model::Role;

/// A demo user: tenant slug, subject, display name, roles, assigned flocks.
pub struct DemoUser(
    pub &'static str,
    pub &'static str,
    pub &'static str,
    pub &'static [Role],
    pub &'static [&'static str],
);

/// The demo's platform administrator (`serve --demo` lists it in `admin.platform_subjects`).
pub const DEMO_PLATFORM_ADMIN: &str = "ops@platform.test";

pub const DEMO_USERS: &[DemoUser] = &[
    DemoUser("acme", "olivia@acme.test", "Olivia Owner", &[Role::Owner], &[]),
    DemoUser("acme", "wanda@acme.test", "Wanda Worker", &[Role::Worker], &["north-barn"]),
    DemoUser("acme", "walt@acme.test", "Walt Worker", &[Role::Worker], &[]),
    DemoUser("acme", "audrey@acme.test", "Audrey Auditor", &[Role::Auditor], &[]),
    DemoUser("globex", "gary@globex.test", "Gary Owner", &[Role::Owner], &[]),
];

const DEMO_TENANTS: &[(&str, &str)] = &[("acme", "Acme Farms"), ("globex", "Globex Poultry")];

/// (tenant slug, flock name, breed, hens, eggs laid per day over the last days)
const DEMO_FLOCKS: &[(&str, &str, &str, i64, &[i64])] = &[
    ("acme", "north-barn", "Rhode Island Red", 120, &[98, 101, 95, 103, 99]),
    ("acme", "south-barn", "Leghorn", 80, &[71, 69, 74, 70, 72]),
    ("globex", "hilltop", "Plymouth Rock", 60, &[48, 51, 47, 50, 49]),
];

#[derive(Debug, PartialEq, Eq)]
pub enum SeedOutcome {
    /// The database was empty and now holds the demo data.
    Seeded,
    /// The demo tenants were already there; nothing was written.
    AlreadyPresent,
}

/// Seeds the demo data into an empty database. A database that holds the demo tenants
/// is left alone; one that holds anything else is refused.
pub async fn seed(db: &Db) -> Result<SeedOutcome, StoreError> {
    let mut tx = db.begin().await?;
    if count_tenants(&mut tx).await? > 0 {
        let demo: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tenants WHERE slug IN ('acme', 'globex')")
            .fetch_one(&mut *tx)
            .await?;
        return if demo == DEMO_TENANTS.len() as i64 {
            Ok(SeedOutcome::AlreadyPresent)
        } else {
            Err(StoreError::Conflict("--demo seeds only an empty database, and this one holds other tenants".into()))
        };
    }
    insert_all(&mut tx).await?;
    tx.commit().await?;
    Ok(SeedOutcome::Seeded)
}

async fn insert_all(conn: &mut AnyConnection) -> Result<(), StoreError> {
    for (slug, name) in DEMO_TENANTS {
        admin::create_tenant(conn, slug, name).await?;
    }
    let today = OffsetDateTime::now_utc().date();
    for (tenant, flock, breed, hens, eggs) in DEMO_FLOCKS {
        let flock_id = admin::create_flock(conn, tenant, flock, breed, *hens).await?;
        let tenant_id = admin::tenant_id_by_slug(conn, tenant).await?;
        for (back, count) in eggs.iter().enumerate() {
            let day = today - Duration::days(back as i64 + 1);
            sqlx::query(
                "INSERT INTO egg_counts (tenant_id, flock_id, day, eggs, recorded_by, recorded_at) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(tenant_id)
            .bind(flock_id)
            .bind(day.to_string())
            .bind(*count)
            .bind("demo-seed")
            .bind(now_millis())
            .execute(&mut *conn)
            .await?;
        }
    }
    for DemoUser(tenant, subject, name, roles, flocks) in DEMO_USERS {
        admin::create_user(conn, tenant, subject, name, roles).await?;
        for flock in *flocks {
            admin::assign_flock(conn, tenant, subject, flock).await?;
        }
    }
    Ok(())
}
