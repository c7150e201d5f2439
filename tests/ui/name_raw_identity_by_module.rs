// Nor through the modules that define them.
use scopegate::identity::flock_scope::FlockScope;
use scopegate::identity::tenant::TenantContext;
use scopegate::identity::user::CurrentUserContext;

fn main() {}
