//! paceline's integration tests with real servers live in `tests/`; this library only
//! compiles and runs the README's examples as doc tests, with every integration's
//! dependencies at hand (axum, tonic, redis, tokio), as a user's project would have them.

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
