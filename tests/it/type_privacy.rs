//! Type privacy (guard rows G1 and G2): code outside the gateway, such as a SaaS's tools
//! module, can't name the raw identity types, forge an `McpCallContext`, or take the pool out
//! of the store. Each case in tests/ui must fail to compile with its checked-in error.
//!
//! The errors point into the gateway's sources: after moving the lines they name, refresh
//! them with `TRYBUILD=overwrite cargo test --test it type_privacy` and review the diff.

#[test]
fn outside_code_cannot_reach_raw_identity_or_the_pool() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
