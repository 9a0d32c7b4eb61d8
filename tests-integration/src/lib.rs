//! paceline's integration tests with real servers live in `tests/`; this library only
//! compiles and runs the examples of the README and of the pages under `docs/` as doc
//! tests, with every integration's dependencies at hand (axum, tonic, redis, tokio,
//! reqwest), as a user's project would have them. `tests/docs.rs` checks that each
//! example's `[dependencies]` block names the features and versions it needs.

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// docs/SERVERS.md's examples.
#[cfg(doctest)]
#[doc = include_str!("../../docs/SERVERS.md")]
pub struct ServersDoctests;

/// docs/UPSTREAM.md's examples.
#[cfg(doctest)]
#[doc = include_str!("../../docs/UPSTREAM.md")]
pub struct UpstreamDoctests;

/// docs/BUDGETS.md's examples.
#[cfg(doctest)]
#[doc = include_str!("../../docs/BUDGETS.md")]
pub struct BudgetsDoctests;

/// docs/PROCESSES.md's examples.
#[cfg(doctest)]
#[doc = include_str!("../../docs/PROCESSES.md")]
pub struct ProcessesDoctests;

/// docs/FLEET.md's examples.
#[cfg(doctest)]
#[doc = include_str!("../../docs/FLEET.md")]
pub struct FleetDoctests;

/// docs/EMBEDDING.md's examples.
#[cfg(doctest)]
#[doc = include_str!("../../docs/EMBEDDING.md")]
pub struct EmbeddingDoctests;
