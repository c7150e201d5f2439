// A SaaS's tool module can't name the raw identity types: they are visible inside
// `scopegate::identity` only (guard row G1, type privacy).
use scopegate::identity::CurrentUserContext;
use scopegate::identity::FlockScope;
use scopegate::identity::ResolvedIdentity;
use scopegate::identity::TenantContext;

fn main() {}
