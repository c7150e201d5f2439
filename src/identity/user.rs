//! CurrentUserContext: the calling user of the resolved tenant with its roles, a system
//! actor (nil id, no roles), or explicitly unresolved.

use crate::model::Role;
use crate::store::UserId;

#[derive(Debug, Clone)]
pub(in crate::identity) struct User {
    pub id: UserId,
    pub subject: String,
    pub display_name: String,
    pub roles: Vec<Role>,
}

#[derive(Debug, Clone, Default)]
pub(in crate::identity) struct CurrentUserContext {
    user: Option<User>,
}

impl CurrentUserContext {
    pub fn resolved(user: User) -> Self {
        Self { user: Some(user) }
    }

    /// A service token without a user: resolved, with the nil id and no roles.
    pub fn system_actor(subject: &str) -> Self {
        Self::resolved(User {
            id: UserId::nil(),
            subject: subject.to_owned(),
            display_name: String::new(),
            roles: Vec::new(),
        })
    }

    pub fn is_resolved(&self) -> bool {
        self.user.is_some()
    }

    pub fn get(&self) -> Option<&User> {
        self.user.as_ref()
    }
}
