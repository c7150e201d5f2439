//! Id newtypes: a tenant id can't be passed where a flock id is expected; stored as UUID text.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sqlx::any::{Any, AnyTypeInfo};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::{Database, Decode, Encode, Type};
use uuid::Uuid;

/// A tenant (a customer of the SaaS).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantId(Uuid);

/// A user of one tenant. The nil id stands for a system actor (no user).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserId(Uuid);

/// A flock of one tenant.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FlockId(Uuid);

/// An audit event.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AuditEventId(Uuid);

/// An allowance of plugin roots on a remote executor, for one role of one tenant.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RootAllowanceId(Uuid);

// The types are written out above, not by the macro, so the build-time guard sees what they
// hold (a UUID); the macro writes only their impls.
macro_rules! id_impls {
    ($name:ident) => {
        impl $name {
            /// A new time-ordered id (UUID v7).
            pub fn generate() -> Self {
                Self(Uuid::now_v7())
            }
            pub const fn nil() -> Self {
                Self(Uuid::nil())
            }
            pub fn is_nil(&self) -> bool {
                self.0.is_nil()
            }
            pub const fn from_uuid(id: Uuid) -> Self {
                Self(id)
            }
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.hyphenated())
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }

        impl Type<Any> for $name {
            fn type_info() -> AnyTypeInfo {
                <String as Type<Any>>::type_info()
            }
            fn compatible(ty: &AnyTypeInfo) -> bool {
                <String as Type<Any>>::compatible(ty)
            }
        }

        impl Encode<'_, Any> for $name {
            fn encode_by_ref(&self, buf: &mut <Any as Database>::ArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <String as Encode<'_, Any>>::encode(self.to_string(), buf)
            }
        }

        impl<'r> Decode<'r, Any> for $name {
            fn decode(value: <Any as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
                let text = <&str as Decode<'r, Any>>::decode(value)?;
                Ok(Self(Uuid::parse_str(text)?))
            }
        }
    };
}

id_impls!(TenantId);
id_impls!(UserId);
id_impls!(FlockId);
id_impls!(AuditEventId);
id_impls!(RootAllowanceId);

/// A caller as the sessions see it: tenant and user ids, nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Principal {
    pub tenant: TenantId,
    pub user: UserId,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text() {
        let id = FlockId::generate();
        assert_eq!(id.to_string().parse::<FlockId>().unwrap(), id);
        assert!(UserId::nil().is_nil());
        assert!(!UserId::generate().is_nil());
    }
}
